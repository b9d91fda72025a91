//! A process's mappings and their page sizes, as the kernel accounts
//! them (`/proc/PID/smaps`): `KernelPageSize` is 2048 kB only for a
//! hugetlb mapping (transparent huge pages keep 4 kB there). And the
//! host's reserve of 2 MiB pages, set for a test and put back after it.

use std::ops::Range;

use xvs_dataplane::host::huge_pages_free;

/// Each mapping of process `pid` (`"self"` for this one): its address
/// range and its `KernelPageSize` in KiB.
pub fn mappings(pid: &str) -> Vec<(Range<usize>, u64)> {
    let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps")).unwrap_or_default();
    let mut out = Vec::new();
    let mut range = None;
    for line in smaps.lines() {
        let first = line.split_whitespace().next().unwrap_or("");
        if let Some((lo, hi)) = first.split_once('-') {
            if let (Ok(lo), Ok(hi)) = (usize::from_str_radix(lo, 16), usize::from_str_radix(hi, 16))
            {
                range = Some(lo..hi);
                continue;
            }
        }
        if let (Some(r), Some(kib)) = (&range, line.strip_prefix("KernelPageSize:")) {
            if let Ok(kib) = kib.trim().trim_end_matches("kB").trim().parse() {
                out.push((r.clone(), kib));
            }
        }
    }
    out
}

/// The page size, in KiB, of this process's mapping that holds `addr`.
pub fn page_kib(addr: usize) -> Option<u64> {
    mappings("self")
        .into_iter()
        .find(|(r, _)| r.contains(&addr))
        .map(|(_, kib)| kib)
}

/// Whether process `pid` has a mapping on 2 MiB hugetlb pages.
pub fn has_huge_mapping(pid: u32) -> bool {
    mappings(&pid.to_string())
        .iter()
        .any(|(_, kib)| *kib == 2048)
}

/// `vm.nr_hugepages`, set by [`Reserved::exactly_free`] and put back as
/// it was when dropped (also on a panic).
#[derive(Debug)]
pub struct Reserved(u64);

const NR_HUGEPAGES: &str = "/proc/sys/vm/nr_hugepages";

impl Reserved {
    /// Reserves 2 MiB pages so that exactly `free` of them are free (the
    /// ones in use stay); panics if the kernel cannot.
    pub fn exactly_free(free: u64) -> Reserved {
        let was = std::fs::read_to_string(NR_HUGEPAGES)
            .ok()
            .and_then(|t| t.trim().parse().ok())
            .unwrap_or_else(|| panic!("{NR_HUGEPAGES} unreadable"));
        let total = xvs_dataplane::host::huge_pages_reserved().unwrap_or(0);
        let in_use = total - huge_pages_free();
        let r = Reserved(was);
        std::fs::write(NR_HUGEPAGES, (in_use + free).to_string())
            .unwrap_or_else(|e| panic!("{NR_HUGEPAGES}: {e}"));
        assert_eq!(huge_pages_free(), free, "the kernel's huge pages");
        r
    }
}

impl Drop for Reserved {
    fn drop(&mut self) {
        let _ = std::fs::write(NR_HUGEPAGES, self.0.to_string());
    }
}
