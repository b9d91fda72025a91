//! The machine xvs runs on, as the configuration's machine-dependent rules
//! need it: its own addresses (no VIP or backend may be one), its links'
//! prefixes (a direct-routing backend must be on one) and the
//! memory it can give (the conntrack capacity must fit). Read once per
//! check; the rules themselves are the config crate's.

use std::net::IpAddr;

/// What was read of the machine.
#[derive(Debug, Clone, Default)]
pub struct Machine {
    /// Its addresses, of both families.
    pub addresses: Vec<IpAddr>,
    /// The prefixes of its links.
    pub connected: Vec<ipnet::IpNet>,
    /// Bytes of memory available, if the kernel said.
    pub available: Option<u64>,
    /// Free 2 MiB pages of the reserved pool (packet buffers go there
    /// first, outside `available`).
    pub huge_free: u64,
}

impl Machine {
    /// Reads the machine (the calling thread's network namespace).
    pub fn read() -> Machine {
        let (addresses, connected) = xvs_dataplane::host::addresses_and_links().unwrap_or_default();
        Machine {
            addresses,
            connected,
            available: xvs_dataplane::host::available_memory(),
            huge_free: xvs_dataplane::host::huge_pages_free(),
        }
    }

    /// The config crate's view of it.
    pub fn host(&self) -> xvs_config::Host<'_> {
        xvs_config::Host {
            addresses: &self.addresses,
            connected: &self.connected,
            memory: self.available.map(|available| xvs_config::Memory {
                available,
                needed: Box::new(|capacity, workers, ipv6| {
                    xvs_dataplane::host::needed_memory(capacity, workers, ipv6, self.huge_free)
                }),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

    use super::Machine;
    use xvs_dataplane::host::{needed_memory, UMEM_BYTES, UMEM_HUGE_PAGES};

    /// One worker (the default), a capacity given.
    fn config(capacity: u32) -> String {
        format!(
            "[interfaces]\nclient = \"eth0\"\n[snat]\naddresses = [\"198.18.2.1\"]\n\
             [conntrack]\ncapacity = {capacity}\n"
        )
    }

    #[test]
    fn packet_buffers_on_reserved_huge_pages_leave_available_memory_to_the_flows() {
        let capacity = 100_000;
        let text = config(capacity);
        // Room for the flow table, 1 MiB short of its packet buffers too.
        let all = needed_memory(capacity, 1, false, 0);
        let machine = |huge_free| Machine {
            available: Some(all - (1 << 20)),
            huge_free,
            ..Machine::default()
        };
        let short = machine(UMEM_HUGE_PAGES - 1);
        let e = xvs_config::parse_str_on("xvs.toml", &text, &short.host()).unwrap_err();
        assert!(
            e.to_string()
                .contains("conntrack.capacity: 100000 flows need "),
            "{e}"
        );
        // The buffers' pages are free in the pool: the same host fits it.
        let pooled = machine(UMEM_HUGE_PAGES);
        xvs_config::parse_str_on("xvs.toml", &text, &pooled.host()).unwrap();
        // (The premise: 1 MiB short is less than the buffers.)
        const { assert!(UMEM_BYTES > 1 << 20) };
    }
}
