//! Fuzzes the sync datagram parser: any bytes, with and without the
//! cluster's key, are accepted whole or refused with a reason, never a
//! panic. What is accepted re-encodes to the same datagram (nothing is
//! read that was not checked), and a valid signed datagram with any one
//! byte changed is refused.
#![no_main]

use libfuzzer_sys::fuzz_target;
use xvs_dataplane::sync::wire::{key, parse, Body, Builder};

fuzz_target!(|data: &[u8]| {
    let k = key(b"fuzzing-key-0123456789");
    for key in [None, Some(&k)] {
        let Ok((h, body)) = parse(data, data.get(5).copied().unwrap_or(0), key) else {
            continue;
        };
        let mut b = Builder::new(h.kind);
        match &body {
            Body::Flows(records) => {
                for r in records {
                    assert!(b.push(r), "an accepted record fits again");
                }
            }
            Body::Hello(addrs) => {
                for &(a, role) in addrs {
                    assert!(b.push_address(a, role));
                }
            }
        }
        let again = b.finish(h.sync_id, h.node, h.epoch, h.seq, key).to_vec();
        let (h2, body2) = parse(&again, h.sync_id, key).expect("re-encoded parses");
        assert_eq!((h2, body2), (h, body));
        if let Some(k) = key {
            // Any one byte changed: refused.
            let mut bad = again.clone();
            let at = usize::from(data.first().copied().unwrap_or(0)) % bad.len();
            bad[at] ^= 1;
            assert!(parse(&bad, h.sync_id, Some(k)).is_err());
        }
    }
});
