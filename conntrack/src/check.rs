//! A full check of a table's structural invariants (see [`crate::table`]),
//! for tests and debugging: O(capacity), never called on the packet path.

use crate::slab::{AGE, FLAG_AGED, NIL, WHEEL};
use crate::state::{Direction, FlowState};
use crate::table::{dir_of, slot_of, FlowTable, WHEEL_SLOTS};

impl<A: xvs_config::Address> FlowTable<A> {
    /// Checks every structural invariant; returns the first violation.
    pub fn check_invariants(&self) -> Result<(), String> {
        let entries = &self.slab.entries;
        let cold = &self.slab.cold;
        let live: Vec<u32> = (0..entries.len() as u32)
            .filter(|&i| entries[i as usize].is_live())
            .collect();
        if live.len() as u32 != self.slab.live() {
            return Err(format!(
                "{} live slots, slab says {}",
                live.len(),
                self.slab.live()
            ));
        }
        if self.slab.free_len() + self.slab.live() != self.slab.capacity() {
            return Err(format!(
                "slot leak: {} free + {} live != capacity {}",
                self.slab.free_len(),
                self.slab.live(),
                self.slab.capacity()
            ));
        }
        let s = &self.stats;
        let accounted = s.insert + s.adopt
            - s.delete
            - s.expire
            - s.early_drop
            - s.reschedule
            - s.nodest
            - s.reclaim;
        if accounted != u64::from(self.slab.live()) {
            return Err(format!(
                "counters say {accounted} entries, table has {}",
                self.slab.live()
            ));
        }

        // Index: both keys of every two-way flow, the original key of a
        // one-way flow or a template, nothing else.
        let mut want_index = 0usize;
        for &i in &live {
            let e = &entries[i as usize];
            let dirs: &[Direction] = if e.has_one_key() {
                &[Direction::Original]
            } else {
                &[Direction::Original, Direction::Reply]
            };
            for &dir in dirs {
                want_index += 1;
                let value = i | if dir == Direction::Reply { 1 << 31 } else { 0 };
                if self
                    .index
                    .find(self.hash(&e.key(dir)), |v| v == value)
                    .is_none()
                {
                    return Err(format!("slot {i} {dir:?} key not indexed"));
                }
            }
        }
        if self.index.len() != want_index {
            return Err(format!(
                "index has {} keys, want {want_index}",
                self.index.len()
            ));
        }
        for v in self.index.iter() {
            let e = &entries[slot_of(v) as usize];
            if !e.is_live() || (e.has_one_key() && dir_of(v) == Direction::Reply) {
                return Err(format!("index value {v:#x} points at a free or wrong slot"));
            }
        }

        // Wheel: every live entry on exactly the list its wheel_slot names.
        let mut filed = vec![false; entries.len()];
        for (w, head) in self.wheel.iter().enumerate() {
            let (mut at, mut prev) = (head.first, NIL);
            while at != NIL {
                let e = &entries[at as usize];
                if !e.is_live()
                    || e.wheel_slot as usize != w
                    || cold[at as usize].links[WHEEL][1] != prev
                {
                    return Err(format!("wheel list {w} broken at slot {at}"));
                }
                if std::mem::replace(&mut filed[at as usize], true) {
                    return Err(format!("slot {at} filed twice"));
                }
                prev = at;
                at = cold[at as usize].links[WHEEL][0];
            }
            if head.last != prev {
                return Err(format!("wheel list {w} tail is wrong"));
            }
        }
        if let Some(&i) = live.iter().find(|&&i| !filed[i as usize]) {
            return Err(format!("live slot {i} is on no wheel list"));
        }
        if self.wheel.len() != WHEEL_SLOTS {
            return Err("wheel size changed".into());
        }

        // Age list: exactly the non-ESTABLISHED flows, each once.
        let mut aged = 0usize;
        let (mut at, mut prev) = (self.age.first, NIL);
        while at != NIL {
            let e = &entries[at as usize];
            if !e.is_live()
                || e.is_template()
                || e.state().is_active()
                || e.flags & FLAG_AGED == 0
                || cold[at as usize].links[AGE][1] != prev
            {
                return Err(format!("age list broken at slot {at}"));
            }
            aged += 1;
            prev = at;
            at = cold[at as usize].links[AGE][0];
        }
        let want_aged = live
            .iter()
            .filter(|&&i| {
                let e = &entries[i as usize];
                !e.is_template() && !e.state().is_active()
            })
            .count();
        if aged != want_aged {
            return Err(format!("age list has {aged} entries, want {want_aged}"));
        }

        // State gauges.
        let mut states = [0u32; FlowState::COUNT];
        for &i in &live {
            states[entries[i as usize].state().index()] += 1;
        }
        if states != self.states {
            return Err(format!(
                "state gauges {:?}, counted {states:?}",
                self.states
            ));
        }

        // SNAT tallies.
        let mut snat = crate::table::SnatTally {
            addrs: self.snat.addrs.clone(),
            live: vec![0; self.snat.addrs.len()],
        };
        for &i in &live {
            snat.add(&entries[i as usize], 1);
        }
        if snat.live != self.snat.live {
            return Err(format!(
                "SNAT tallies {:?}, counted {:?}",
                self.snat.live, snat.live
            ));
        }
        Ok(())
    }
}
