//! What the pipeline tests share: running one frame through a pipeline.

use xvs_dataplane::pipeline::{Pipeline, Verdict};

/// Runs `frame` through `p` (received on the client side) at `now`; the
/// verdict and the frame as it would be sent (empty when dropped or
/// consumed). Checks after every frame that the counters add up.
pub(crate) fn run(p: &mut Pipeline, frame: &[u8], now: u32) -> (Verdict, Vec<u8>) {
    let mut buf = vec![0u8; 2048];
    buf[..frame.len()].copy_from_slice(frame);
    let v = p.process(&mut buf, frame.len(), now);
    let len = match v {
        Verdict::Forward { len: n, .. } | Verdict::Answer(n) => n,
        _ => 0,
    };
    buf.truncate(len);
    let c = p.counters();
    assert_eq!(
        c.rx,
        c.forwarded + c.answered + c.consumed + c.dropped(),
        "{c:?}"
    );
    (v, buf)
}
