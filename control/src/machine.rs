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
}

impl Machine {
    /// Reads the machine (the calling thread's network namespace).
    pub fn read() -> Machine {
        let (addresses, connected) = xvs_dataplane::host::addresses_and_links().unwrap_or_default();
        Machine {
            addresses,
            connected,
            available: xvs_dataplane::host::available_memory(),
        }
    }

    /// The config crate's view of it.
    pub fn host(&self) -> xvs_config::Host<'_> {
        xvs_config::Host {
            addresses: &self.addresses,
            connected: &self.connected,
            memory: self.available.map(|available| xvs_config::Memory {
                available,
                needed: &xvs_dataplane::host::needed_memory,
            }),
        }
    }
}
