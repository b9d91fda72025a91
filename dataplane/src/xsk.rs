//! One AF_XDP port: a UMEM and a socket bound to (interface, queue), with
//! frame accounting that cannot leak.
//!
//! Invariant (checked by [`XskPort::frames_accounted`]): every one of the
//! UMEM's frames is in exactly one place — the free list (userspace), the
//! fill ring or RX ring (kernel, counted by `in_fill`), or the TX ring
//! awaiting completion (counted by `in_tx`). Frames move between them only
//! in [`XskPort::reclaim`], [`XskPort::refill`], [`XskPort::receive`] and
//! [`XskPort::transmit`], which update the counts with each move.

use std::num::NonZeroU32;
use std::os::fd::AsRawFd;

use xsk_rs::config::{BindFlags, LibxdpFlags, QueueSize, SocketConfig, UmemConfig};
use xsk_rs::{CompQueue, FillQueue, FrameDesc, RxQueue, Socket, TxQueue, Umem};

/// Frames per RX/TX batch.
pub const BATCH: usize = 64;
/// Frames of a port's UMEM.
pub const FRAMES: u32 = 4096;
const RING: u32 = 2048;

/// Why a port could not be opened.
#[derive(Debug, thiserror::Error)]
#[error("AF_XDP on {ifname} queue {queue}: {what}")]
pub struct XskError {
    /// Interface.
    pub ifname: String,
    /// Queue.
    pub queue: u32,
    /// What failed.
    pub what: String,
}

/// An AF_XDP socket with its own UMEM.
pub struct XskPort {
    umem: Umem,
    rx: RxQueue,
    tx: TxQueue,
    fq: FillQueue,
    cq: CompQueue,
    free: Vec<FrameDesc>,
    in_fill: u32,
    in_tx: u32,
    scratch: Vec<FrameDesc>,
    zero_copy: bool,
}

impl std::fmt::Debug for XskPort {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("XskPort")
            .field("free", &self.free.len())
            .field("in_fill", &self.in_fill)
            .field("in_tx", &self.in_tx)
            .finish()
    }
}

impl XskPort {
    /// Opens a socket on (`ifname`, `queue`): zero-copy if `zero_copy`
    /// is `Some(true)`, copy if `Some(false)`, zero-copy else copy if
    /// `None`. No XDP program is loaded (the steering program is ours).
    pub fn open(ifname: &str, queue: u32, zero_copy: Option<bool>) -> Result<XskPort, XskError> {
        let err = |what: String| XskError {
            ifname: ifname.to_owned(),
            queue,
            what,
        };
        let attempts: &[bool] = match zero_copy {
            Some(z) => {
                if z {
                    &[true]
                } else {
                    &[false]
                }
            }
            None => &[true, false],
        };
        let mut last = String::new();
        for &zc in attempts {
            match Self::open_mode(ifname, queue, zc) {
                Ok(p) => return Ok(p),
                Err(e) => last = e,
            }
        }
        Err(err(last))
    }

    fn open_mode(ifname: &str, queue: u32, zero_copy: bool) -> Result<XskPort, String> {
        let ring = QueueSize::new(RING).map_err(|e| e.to_string())?;
        let umem_cfg = UmemConfig::builder()
            .fill_queue_size(ring)
            .comp_queue_size(ring)
            .build()
            .map_err(|e| e.to_string())?;
        let frames = NonZeroU32::new(FRAMES).ok_or("no frames")?;
        let (umem, descs) = Umem::new(umem_cfg, frames, false).map_err(|e| e.to_string())?;
        let mode = if zero_copy {
            BindFlags::XDP_ZEROCOPY
        } else {
            BindFlags::XDP_COPY
        };
        let cfg = SocketConfig::builder()
            .rx_queue_size(ring)
            .tx_queue_size(ring)
            .libxdp_flags(LibxdpFlags::XSK_LIBXDP_FLAGS_INHIBIT_PROG_LOAD)
            .bind_flags(mode | BindFlags::XDP_USE_NEED_WAKEUP)
            .build();
        let iface = ifname
            .parse()
            .map_err(|_| "bad interface name".to_owned())?;
        // SAFETY: this UMEM is not shared, and the program-load inhibit
        // flag is set.
        let (tx, rx, fq_cq) =
            unsafe { Socket::new(cfg, &umem, &iface, queue) }.map_err(|e| e.to_string())?;
        let (fq, cq) = fq_cq.ok_or("no fill/completion queues")?;
        let mut port = XskPort {
            umem,
            rx,
            tx,
            fq,
            cq,
            free: descs,
            in_fill: 0,
            in_tx: 0,
            scratch: Vec::with_capacity(RING as usize),
            zero_copy,
        };
        port.refill();
        Ok(port)
    }

    /// Whether the socket runs in zero-copy mode.
    pub fn is_zero_copy(&self) -> bool {
        self.zero_copy
    }

    /// The socket's file descriptor (for the XSKMAP and poll).
    pub fn fd(&self) -> i32 {
        self.rx.fd().as_raw_fd()
    }

    /// Whether every frame is accounted for.
    pub fn frames_accounted(&self) -> bool {
        self.free.len() as u32 + self.in_fill + self.in_tx == FRAMES
    }

    /// Frames in userspace, in the fill/RX rings, and in TX.
    pub fn frame_counts(&self) -> (u32, u32, u32) {
        (self.free.len() as u32, self.in_fill, self.in_tx)
    }

    /// Takes back the frames the kernel finished transmitting.
    pub fn reclaim(&mut self) {
        if self.in_tx == 0 {
            return;
        }
        self.scratch.clear();
        self.scratch
            .resize(self.in_tx.min(RING) as usize, FrameDesc::default());
        // SAFETY: descriptors written here are completed TX frames of this
        // UMEM, which the kernel no longer reads.
        let n = unsafe { self.cq.consume(&mut self.scratch) };
        self.in_tx -= n as u32;
        self.free.extend_from_slice(&self.scratch[..n]);
    }

    /// Keeps the fill ring stocked, keeping `reserve` frames in userspace
    /// for answers and ARP requests.
    pub fn refill(&mut self) {
        let reserve = BATCH * 2;
        if self.free.len() <= reserve {
            return;
        }
        let want = (self.free.len() - reserve).min((RING - self.in_fill) as usize);
        if want == 0 {
            return;
        }
        let start = self.free.len() - want;
        // SAFETY: these frames belong to this UMEM and are owned by
        // userspace (on the free list); they are handed to the kernel once.
        let n = unsafe { self.fq.produce(&self.free[start..]) };
        self.in_fill += n as u32;
        self.free.truncate(self.free.len() - n);
        if n > 0 && self.fq.needs_wakeup() {
            let _ = self.fq.wakeup(self.rx.fd_mut(), 0);
        }
    }

    /// Receives up to `out.len()` frames into `out`; returns how many.
    /// The frames are userspace's until passed to [`XskPort::transmit`]
    /// or [`XskPort::release`].
    pub fn receive(&mut self, out: &mut [FrameDesc]) -> usize {
        // SAFETY: frames read from the RX ring belong to this UMEM; the
        // kernel is done with them.
        let n = unsafe { self.rx.consume(out) };
        self.in_fill -= n as u32;
        n
    }

    /// Runs `f` on the bytes of a received frame, grown to the whole
    /// frame so answers can be built in place, and its current length.
    ///
    /// # Safety
    /// `desc` must be a frame of this port that userspace owns (received
    /// or allocated, and not yet transmitted or released), with no other
    /// reference to its data alive.
    pub unsafe fn with_frame<R>(
        &self,
        desc: &mut FrameDesc,
        f: impl FnOnce(&mut [u8], usize) -> R,
    ) -> R {
        let len = desc.lengths().data();
        let r = {
            // SAFETY: guaranteed by the caller.
            let mut data = unsafe { self.umem.data_mut(desc) };
            let mut cur = data.cursor();
            let cap = cur.buf_len();
            cur.set_pos(cap);
            f(data.contents_mut(), len)
        };
        // The frame keeps its length until the caller sets another.
        // SAFETY: guaranteed by the caller.
        unsafe { self.umem.data_mut(desc) }.cursor().set_pos(len);
        r
    }

    /// Sets the length of a frame about to be transmitted.
    ///
    /// # Safety
    /// As [`XskPort::frame_mut`].
    pub unsafe fn set_len(&self, desc: &mut FrameDesc, len: usize) {
        // SAFETY: guaranteed by the caller.
        let mut data = unsafe { self.umem.data_mut(desc) };
        data.cursor().set_pos(len);
    }

    /// A free frame to build a packet in (e.g. an ARP request).
    pub fn alloc(&mut self) -> Option<FrameDesc> {
        self.free.pop()
    }

    /// Returns frames to the free list without sending them.
    pub fn release(&mut self, descs: &[FrameDesc]) {
        self.free.extend_from_slice(descs);
    }

    /// Queues frames for transmission; frames the TX ring cannot take are
    /// released (returns how many were queued).
    pub fn transmit(&mut self, descs: &[FrameDesc]) -> usize {
        if descs.is_empty() {
            return 0;
        }
        // SAFETY: the frames belong to this UMEM, are owned by userspace,
        // and are handed to the kernel once.
        let n = unsafe { self.tx.produce_and_wakeup(descs) }.unwrap_or(0);
        self.in_tx += n as u32;
        self.free.extend_from_slice(&descs[n..]);
        n
    }
}
