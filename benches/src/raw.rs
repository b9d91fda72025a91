//! The raw AF_XDP forwarder: the ceiling of the namespace path. Frames for
//! one owned address arrive on the client-side socket, get the next hop's
//! MAC and the gateway's, and leave on the backend-side socket of the
//! same UMEM — the same sockets and frame handling as xvs, minus
//! everything xvs does per packet.

use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicBool, Ordering};

use xsk_rs::FrameDesc;
use xvs_config::XdpAttachMode;
use xvs_dataplane::io::PacketIo;
use xvs_dataplane::steer::Steering;
use xvs_dataplane::xsk::{XskPort, BATCH};

/// Where the raw forwarder runs.
#[derive(Debug, Clone)]
pub struct RawSpec {
    /// Client-side interface.
    pub client_if: String,
    /// Backend-side interface.
    pub backend_if: String,
    /// The address whose frames it forwards.
    pub addr: Ipv4Addr,
    /// The next hop's MAC.
    pub dst_mac: [u8; 6],
    /// The backend-side interface's MAC.
    pub src_mac: [u8; 6],
    /// CPU to pin to.
    pub core: Option<usize>,
}

/// Forwards until `stop`, in the calling thread's namespace; returns the
/// frames forwarded. `opened` gets the sockets' descriptors once they
/// are open (their kernel statistics can be read from another thread
/// while this one forwards).
pub fn forward(
    spec: &RawSpec,
    stop: &AtomicBool,
    opened: impl FnOnce(Vec<i32>),
) -> Result<u64, String> {
    if let Some(id) = spec.core {
        core_affinity::set_for_current(core_affinity::CoreId { id });
    }
    let steering =
        Steering::attach(&spec.client_if, XdpAttachMode::Native).map_err(|e| e.to_string())?;
    steering.add_address(spec.addr).map_err(|e| e.to_string())?;
    let mut port = XskPort::open(
        &[spec.client_if.as_str(), spec.backend_if.as_str()],
        0,
        None,
    )
    .map_err(|e| e.to_string())?;
    steering
        .register_socket(0, port.fd(0))
        .map_err(|e| e.to_string())?;
    opened(port.fds());
    let mut rx = vec![FrameDesc::default(); BATCH];
    let mut forwarded = 0u64;
    while !stop.load(Ordering::Relaxed) {
        port.reclaim();
        port.refill();
        let n = port.receive(0, &mut rx);
        for k in 0..n {
            // Headers fetched ahead as xvs's worker fetches them (the
            // same frame handling: only the per-packet work differs).
            port.prefetch_ahead(&rx[..n], k);
            let d = &mut rx[k];
            // SAFETY: a frame just received on this port, referenced
            // nowhere else.
            unsafe {
                port.with_frame(d, |buf, len| {
                    if len >= 12 {
                        buf[0..6].copy_from_slice(&spec.dst_mac);
                        buf[6..12].copy_from_slice(&spec.src_mac);
                    }
                });
            }
        }
        forwarded += port.transmit(1, &rx[..n]) as u64;
    }
    Ok(forwarded)
}
