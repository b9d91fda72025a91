//! lblc and lblcr, as `ip_vs_lblc.c` and `ip_vs_lblcr.c`: locality-based
//! least connection, without and with replication.
//!
//! IPVS keys both tables by the packet's destination address. Every packet
//! of an xvs service is addressed to the service's VIP (there are no
//! firewall-mark services), so each table has exactly one entry; it is
//! kept here as an `Option`, with IPVS's rules for using, replacing and
//! expiring it:
//!
//! - lblc: the entry's backend is used while it is listed, has a weight
//!   and is not overloaded (active connections above its weight while
//!   some backend has fewer than half its weight active); otherwise wlc
//!   chooses and the entry is replaced.
//! - lblcr: the entry is a set of backends, newest first; the set's
//!   weighted least-connection member is used unless overloaded, in which
//!   case wlc chooses among all backends and the choice joins the set.
//!   A set of more than one member unchanged for [`EXPIRATION`] loses its
//!   weighted most-connection member.
//! - An entry unused for [`EXPIRATION`] is gone (IPVS's periodic check
//!   removes it within half an hour after that; here it is ignored from
//!   the first lookup after it).
//!
//! Invariants: entries hold indexes into the backend list the scheduler
//! was built for; [`Locality::carry`] moves them to a new list by stable
//! id and endpoint, dropping members that left (IPVS keeps a removed
//! backend in a set until it is erased, but never uses it). The set's
//! capacity is the number of backends, so inserting never allocates.

use super::least::{wlc_overhead, Least};
use super::{ConnCounts, SchedBackend};
use xvs_config::Address;
use xvs_config::Scheduler as Kind;

/// IPVS's `lblc_expiration` and `lblcr_expiration` default: one day.
pub const EXPIRATION: u32 = 24 * 60 * 60;

/// The one entry of the table.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    /// lblc: one backend; lblcr: the set, newest first.
    members: Vec<usize>,
    /// When a flow last looked the entry up.
    lastuse: u32,
    /// lblcr: when the set last gained or lost a member.
    lastmod: u32,
}

/// lblc or lblcr state.
#[derive(Debug, Clone)]
pub struct Locality {
    replicate: bool,
    entry: Option<Entry>,
    capacity: usize,
}

/// `now` is strictly after `then + span` (the kernel's `time_after`,
/// wrapping like jiffies).
fn after(now: u32, then: u32, span: u32) -> bool {
    (now.wrapping_sub(then.wrapping_add(span)) as i32) > 0
}

/// IPVS's `is_overloaded`: more active connections than its weight, while
/// some backend has fewer than half of its own.
fn overloaded<A: Address>(i: usize, backends: &[SchedBackend<A>], counts: &ConnCounts) -> bool {
    let b = &backends[i];
    u64::from(counts.active(b.id)) > u64::from(b.weight)
        && backends
            .iter()
            .any(|d| u64::from(counts.active(d.id)) * 2 < u64::from(d.weight))
}

/// `ip_vs_dest_set_min`: the set's weighted least-connection member with
/// a weight.
fn set_min<A: Address>(
    set: &[usize],
    backends: &[SchedBackend<A>],
    counts: &ConnCounts,
) -> Option<usize> {
    let mut it = set.iter().copied();
    let mut least = it.find(|&i| backends[i].weight > 0)?;
    let mut loh = wlc_overhead(&backends[least], counts);
    for i in it {
        let doh = wlc_overhead(&backends[i], counts);
        if loh * u64::from(backends[i].weight) > doh * u64::from(backends[least].weight) {
            least = i;
            loh = doh;
        }
    }
    Some(least)
}

/// `ip_vs_dest_set_max`: the set's weighted most-connection member with
/// a weight.
fn set_max<A: Address>(
    set: &[usize],
    backends: &[SchedBackend<A>],
    counts: &ConnCounts,
) -> Option<usize> {
    let mut it = set.iter().copied();
    let mut most = it.find(|&i| backends[i].weight > 0)?;
    let mut moh = wlc_overhead(&backends[most], counts);
    for i in it {
        let doh = wlc_overhead(&backends[i], counts);
        if moh * u64::from(backends[i].weight) < doh * u64::from(backends[most].weight)
            && backends[i].weight > 0
        {
            most = i;
            moh = doh;
        }
    }
    Some(most)
}

impl Locality {
    pub(crate) fn new<A: Address>(kind: Kind, backends: &[SchedBackend<A>]) -> Self {
        Locality {
            replicate: kind == Kind::Lblcr,
            entry: None,
            capacity: backends.len(),
        }
    }

    /// Heap bytes: the entry's member list.
    pub(crate) fn memory_bytes(&self) -> usize {
        self.capacity * std::mem::size_of::<usize>()
    }

    /// Takes over `prev`'s entry (built for `before`) for the list
    /// `backends`: members are matched by stable id and endpoint.
    pub(crate) fn carry<A: Address>(
        &mut self,
        prev: &Locality,
        before: &[SchedBackend<A>],
        backends: &[SchedBackend<A>],
    ) {
        let Some(e) = &prev.entry else {
            return;
        };
        let mut members = Vec::with_capacity(self.capacity);
        members.extend(e.members.iter().filter_map(|&i| {
            let old = before.get(i)?;
            backends
                .iter()
                .position(|b| b.id == old.id && b.endpoint == old.endpoint)
        }));
        if !members.is_empty() {
            self.entry = Some(Entry {
                members,
                lastuse: e.lastuse,
                lastmod: e.lastmod,
            });
        }
    }

    pub(crate) fn pick<A: Address>(
        &mut self,
        backends: &[SchedBackend<A>],
        counts: &ConnCounts,
        now: u32,
    ) -> Option<usize> {
        let wlc = |b: &[SchedBackend<A>]| Least::new(Kind::Wlc).pick(b, counts);
        let live = self
            .entry
            .as_ref()
            .is_some_and(|e| now.wrapping_sub(e.lastuse) < EXPIRATION);
        if !live {
            let i = wlc(backends)?;
            let mut members = Vec::with_capacity(self.capacity);
            members.push(i);
            self.entry = Some(Entry {
                members,
                lastuse: now,
                lastmod: now,
            });
            return Some(i);
        }
        let e = self.entry.as_mut()?;
        e.lastuse = now;
        if !self.replicate {
            let i = e.members[0];
            if backends[i].weight > 0 && !overloaded(i, backends, counts) {
                return Some(i);
            }
            let i = wlc(backends)?;
            if e.members[0] != i {
                e.members[0] = i;
                e.lastmod = now;
            }
            return Some(i);
        }
        let least = set_min(&e.members, backends, counts);
        if e.members.len() > 1 && after(now, e.lastmod, EXPIRATION) {
            if let Some(m) = set_max(&e.members, backends, counts) {
                e.members.retain(|&x| x != m);
                e.lastmod = now;
            }
        }
        if let Some(i) = least {
            if !overloaded(i, backends, counts) {
                return Some(i);
            }
        }
        let i = wlc(backends)?;
        if !e.members.contains(&i) {
            e.members.insert(0, i);
            e.lastmod = now;
        }
        Some(i)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sched::test_backends;

    /// The kernel's lblc, transcribed for one destination address: an
    /// entry (dest, lastuse); wlc over the list; `is_overloaded`.
    struct KernelLblc {
        en: Option<(usize, u32)>,
    }

    /// Active, inactive and weight of each backend, as the kernel reads
    /// them through `dest`.
    struct Dests<'a> {
        b: &'a [SchedBackend],
        c: &'a ConnCounts,
    }

    impl Dests<'_> {
        fn overhead(&self, i: usize) -> i64 {
            ((self.c.active(self.b[i].id) as i64) << 8) + self.c.inactive(self.b[i].id) as i64
        }
        fn weight(&self, i: usize) -> i64 {
            i64::from(self.b[i].weight)
        }
        fn active(&self, i: usize) -> i64 {
            i64::from(self.c.active(self.b[i].id))
        }
        /// `__ip_vs_lblc_schedule` (also lblcr's).
        fn schedule(&self) -> Option<usize> {
            let n = self.b.len();
            let mut least = None;
            let mut loh = 0;
            let mut start = n;
            for i in 0..n {
                if self.weight(i) > 0 {
                    least = Some(i);
                    loh = self.overhead(i);
                    start = i + 1;
                    break;
                }
            }
            let mut least = least?;
            for i in start..n {
                let doh = self.overhead(i);
                if loh * self.weight(i) > doh * self.weight(least) {
                    least = i;
                    loh = doh;
                }
            }
            Some(least)
        }
        fn is_overloaded(&self, i: usize) -> bool {
            if self.active(i) > self.weight(i) {
                for d in 0..self.b.len() {
                    if self.active(d) * 2 < self.weight(d) {
                        return true;
                    }
                }
            }
            false
        }
    }

    impl KernelLblc {
        fn schedule(&mut self, d: &Dests, now: u32) -> Option<usize> {
            if let Some((dest, lastuse)) = &mut self.en {
                // The periodic check's expiry, at lookup.
                if now.wrapping_sub(*lastuse) >= EXPIRATION {
                    self.en = None;
                } else {
                    *lastuse = now;
                    if d.weight(*dest) > 0 && !d.is_overloaded(*dest) {
                        return Some(*dest);
                    }
                }
            }
            let dest = d.schedule()?;
            match &mut self.en {
                Some((en, _)) if *en == dest => {}
                _ => self.en = Some((dest, now)),
            }
            Some(dest)
        }
    }

    /// The kernel's lblcr for one destination address.
    struct KernelLblcr {
        /// (set newest first, lastmod, lastuse).
        en: Option<(Vec<usize>, u32, u32)>,
    }

    impl KernelLblcr {
        fn set_min(set: &[usize], d: &Dests) -> Option<usize> {
            let mut k = 0;
            let mut least = None;
            while k < set.len() {
                let l = set[k];
                k += 1;
                if d.weight(l) > 0 {
                    least = Some(l);
                    break;
                }
            }
            let mut least = least?;
            let mut loh = d.overhead(least);
            for &x in &set[k..] {
                let doh = d.overhead(x);
                if loh * d.weight(x) > doh * d.weight(least) {
                    least = x;
                    loh = doh;
                }
            }
            Some(least)
        }
        fn set_max(set: &[usize], d: &Dests) -> Option<usize> {
            let mut k = 0;
            let mut most = None;
            while k < set.len() {
                let m = set[k];
                k += 1;
                if d.weight(m) > 0 {
                    most = Some(m);
                    break;
                }
            }
            let mut most = most?;
            let mut moh = d.overhead(most);
            for &x in &set[k..] {
                let doh = d.overhead(x);
                if moh * d.weight(x) < doh * d.weight(most) && d.weight(x) > 0 {
                    most = x;
                    moh = doh;
                }
            }
            Some(most)
        }
        fn schedule(&mut self, d: &Dests, now: u32) -> Option<usize> {
            if let Some((_, _, lastuse)) = &self.en {
                if now.wrapping_sub(*lastuse) >= EXPIRATION {
                    self.en = None;
                }
            }
            if let Some((set, lastmod, lastuse)) = &mut self.en {
                *lastuse = now;
                let dest = Self::set_min(set, d);
                if set.len() > 1 && (now.wrapping_sub(*lastmod + EXPIRATION) as i32) > 0 {
                    if let Some(m) = Self::set_max(set, d) {
                        set.retain(|&x| x != m);
                        *lastmod = now;
                    }
                }
                if let Some(dest) = dest {
                    if !d.is_overloaded(dest) {
                        return Some(dest);
                    }
                }
                let dest = d.schedule()?;
                if !set.contains(&dest) {
                    set.insert(0, dest);
                    *lastmod = now;
                }
                return Some(dest);
            }
            let dest = d.schedule()?;
            self.en = Some((vec![dest], now, now));
            Some(dest)
        }
    }

    /// A deterministic load pattern: each step opens a flow on the
    /// chosen backend, and every few steps closes or idles flows
    /// elsewhere, so overload comes and goes.
    fn drive(kind: Kind, weights: &[u32], steps: u32, clock: impl Fn(u32) -> u32) {
        let b = test_backends(weights);
        let counts = ConnCounts::new(1, b.len());
        let mut ours = Locality::new(kind, &b);
        let mut lblc = KernelLblc { en: None };
        let mut lblcr = KernelLblcr { en: None };
        let mut seed = 0x9e37_79b9_u32;
        for step in 0..steps {
            let now = clock(step);
            let d = Dests { b: &b, c: &counts };
            let want = if kind == Kind::Lblc {
                lblc.schedule(&d, now)
            } else {
                lblcr.schedule(&d, now)
            };
            let got = ours.pick(&b, &counts, now);
            assert_eq!(got, want, "{kind} step {step} at {now}s");
            if let Some(i) = got {
                counts.add(0, b[i].id, 1, 0);
            }
            // xorshift: close one active flow somewhere, or make it idle.
            seed ^= seed << 13;
            seed ^= seed >> 17;
            seed ^= seed << 5;
            let j = (seed as usize) % b.len();
            if counts.active(b[j].id) > 0 && !seed.is_multiple_of(3) {
                counts.add(0, b[j].id, -1, i32::from(seed.is_multiple_of(2)));
            }
        }
    }

    #[test]
    fn both_follow_the_kernel() {
        for kind in [Kind::Lblc, Kind::Lblcr] {
            for weights in [
                &[1, 1, 1][..],
                &[5, 1, 2, 0],
                &[3, 7],
                &[1],
                &[0, 4, 4, 1, 9],
            ] {
                drive(kind, weights, 3_000, |s| s);
                // Half a day and a day apart: lblcr's sets shrink after a
                // day unchanged; entries expire after a day unused.
                drive(kind, weights, 600, |s| s * 1_800);
                drive(kind, weights, 300, |s| s * 3_600);
            }
        }
    }

    #[test]
    fn lblc_keeps_its_backend_until_overloaded() {
        let b = test_backends(&[2, 2]);
        let counts = ConnCounts::new(1, 2);
        let mut s = Locality::new(Kind::Lblc, &b);
        assert_eq!(s.pick(&b, &counts, 0), Some(0));
        counts.add(0, 0, 2, 0);
        // 2 active, weight 2: not above it; B is idle. Stays.
        assert_eq!(s.pick(&b, &counts, 1), Some(0));
        counts.add(0, 0, 1, 0);
        // 3 > 2 and B has 0 * 2 < 2: overloaded, wlc moves to B.
        assert_eq!(s.pick(&b, &counts, 2), Some(1));
        // And the entry now says B.
        assert_eq!(s.pick(&b, &counts, 3), Some(1));
    }

    #[test]
    fn lblcr_grows_its_set_and_trims_it_after_a_day() {
        let b = test_backends(&[1, 1, 1]);
        let counts = ConnCounts::new(1, 3);
        let mut s = Locality::new(Kind::Lblcr, &b);
        assert_eq!(s.pick(&b, &counts, 0), Some(0));
        counts.add(0, 0, 2, 0);
        // A overloaded (2 > 1, C idle): wlc takes B, which joins the set.
        assert_eq!(s.pick(&b, &counts, 10), Some(1));
        let set = |s: &Locality| s.entry.as_ref().unwrap().members.clone();
        assert_eq!(set(&s), [1, 0]);
        // A day after the last change: the most loaded member (A) leaves.
        assert_eq!(s.pick(&b, &counts, 10 + EXPIRATION + 1), Some(1));
        assert_eq!(set(&s), [1]);
    }

    #[test]
    fn an_edit_keeps_the_entry_by_id() {
        let b = test_backends(&[1, 1, 1]);
        let counts = ConnCounts::new(1, 3);
        let mut s = Locality::new(Kind::Lblc, &b);
        counts.add(0, 0, 1, 0);
        assert_eq!(s.pick(&b, &counts, 0), Some(1));
        // The first backend leaves: B (id 1) is now at index 0.
        let after: Vec<_> = b[1..].to_vec();
        let mut next = Locality::new(Kind::Lblc, &after);
        next.carry(&s, &b, &after);
        assert_eq!(next.pick(&after, &counts, 1), Some(0));
        // B leaves too: the entry is dropped, wlc picks C.
        let only_c: Vec<_> = b[2..].to_vec();
        let mut last = Locality::new(Kind::Lblc, &only_c);
        last.carry(&next, &after, &only_c);
        assert!(last.entry.is_none());
        assert_eq!(last.pick(&only_c, &counts, 2), Some(0));
    }
}
