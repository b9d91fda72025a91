//! One AF_XDP port: a UMEM and one socket per interface bound to the same
//! queue (one interface in one-arm mode; client and backend interfaces in
//! two-arm mode, sharing the UMEM so forwarding from one to the other
//! never copies), with frame accounting that cannot leak.
//!
//! Invariant (checked by [`XskPort::frames_accounted`]): every one of the
//! UMEM's frames is in exactly one place — the free list (userspace), a
//! socket's fill ring or RX ring (kernel, counted by its `in_fill`), or a
//! socket's TX ring awaiting completion (counted by its `in_tx`). Frames move between them only
//! in [`XskPort::reclaim`], [`XskPort::refill`], [`XskPort::receive`] and
//! [`XskPort::transmit`], which update the counts with each move.
//!
//! A queue whose previous socket just closed (a daemon restarted after
//! `kill -9`, a port reopened) may still be held: the kernel drops a
//! closed socket's buffer pool, and with it the queue, in deferred work
//! (`xp_release_deferred`), and a bind before that runs fails with EBUSY.
//! [`XskPort::open`] waits for it, up to [`BUSY_WAIT`].

use std::num::NonZeroU32;
use std::os::fd::AsRawFd;
use std::time::Duration;

use xsk_rs::config::{BindFlags, LibxdpFlags, QueueSize, SocketConfig, UmemConfig, XdpFlags};
use xsk_rs::{CompQueue, FillQueue, FrameDesc, RxQueue, Socket, TxQueue, Umem};

/// Frames per RX/TX batch.
pub const BATCH: usize = 64;
/// Frames of a port's UMEM.
pub const FRAMES: u32 = 4096;
const RING: u32 = 2048;
/// The longest [`XskPort::open`] retries a queue still held by a closed
/// socket (EBUSY), and how often.
pub const BUSY_WAIT: Duration = Duration::from_secs(3);
const BUSY_RETRY: Duration = Duration::from_millis(10);
/// The UMEM every port registers: libxdp's default frame size and
/// headroom, rings of `RING` descriptors.
pub fn umem_config() -> Result<UmemConfig, String> {
    let ring = QueueSize::new(RING).map_err(|e| e.to_string())?;
    UmemConfig::builder()
        .fill_queue_size(ring)
        .comp_queue_size(ring)
        .build()
        .map_err(|e| e.to_string())
}

/// Where received packets sit in a port's UMEM: frames `stride` bytes
/// apart, a packet's first byte `offset` bytes into its frame (XDP's
/// headroom and the UMEM's own). Every packet's headers are at the same
/// offset of an aligned frame, so the headers of a batch share the same
/// few L1 sets; the pipeline bench lays its buffers out the same way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameLayout {
    /// Bytes from one frame's start to the next's.
    pub stride: usize,
    /// Bytes from a frame's start to its packet's first byte.
    pub offset: usize,
}

impl FrameLayout {
    /// The layout of every port's UMEM.
    pub fn of_ports() -> FrameLayout {
        let cfg = umem_config().expect("the UMEM configuration is valid");
        FrameLayout {
            stride: cfg.frame_size().get() as usize,
            offset: (cfg.xdp_headroom() + cfg.frame_headroom()) as usize,
        }
    }
}

/// How many frames ahead of the one it works on a batch loop fetches
/// headers ([`XskPort::prefetch`]). Every packet starts at the same
/// offset of a 4 KiB-aligned frame, so a batch's headers all fall in one
/// L1 set of 8 ways: the frames fetched ahead, the one worked on and the
/// one before it must fit.
pub const FRAME_AHEAD: usize = 4;

/// The longest [`XskPort::open`] waits for reserved 2 MiB pages that
/// are all taken: a port closed just before (a restarted daemon's
/// predecessor, killed or stopped) frees its UMEM's pages in the same
/// deferred work that frees its queue, tens of milliseconds later.
const HUGE_WAIT: Duration = Duration::from_millis(250);

/// Maps a UMEM of `frames` frames: on 2 MiB pages when the host has
/// some reserved (`vm.nr_hugepages`), as DPDK and VPP map their packet
/// memory (every frame is a page of its own on 4 KiB pages, so the 2,000
/// or so frames a busy port cycles through miss the TLB at nearly every
/// header read; in a VM, a two-level page walk each). While pages are
/// reserved but none is free, it tries again every [`BUSY_RETRY`] out of
/// `wait` (what it waited is taken from it); then, or with none reserved,
/// on 4 KiB pages. Whether it got 2 MiB pages is the third value
/// (`xvs status` shows it).
fn map_umem(
    cfg: UmemConfig,
    frames: NonZeroU32,
    wait: &mut Duration,
) -> Result<(Umem, Vec<FrameDesc>, bool), String> {
    let reserved = crate::host::huge_pages_reserved().unwrap_or(0) > 0;
    loop {
        if let Ok((umem, descs)) = Umem::new(cfg, frames, true) {
            return Ok((umem, descs, true));
        }
        if !reserved || wait.is_zero() {
            break;
        }
        let step = BUSY_RETRY.min(*wait);
        std::thread::sleep(step);
        *wait -= step;
    }
    let (umem, descs) = Umem::new(cfg, frames, false).map_err(|e| e.to_string())?;
    Ok((umem, descs, false))
}

/// Frames the kernel sends per `sendto` wakeup in copy mode
/// (`TX_BATCH_SIZE` in `net/xdp/xsk.c`).
const KERNEL_TX_BATCH: usize = 32;
/// Wakeups one [`XskPort::transmit`] makes at most.
const MAX_KICKS: usize = 8;

xvs_conntrack::counter_table! {
    /// What the kernel counted on a port's AF_XDP sockets
    /// (`XDP_STATISTICS`), summed over its sockets: the frames lost before
    /// xvs saw them, and the ring conditions behind them.
    #[derive(serde::Serialize, serde::Deserialize)]
    #[serde(default)]
    pub struct RingStats {
        /// Frames the kernel dropped at the AF_XDP socket (no fill-ring
        /// frame or no room), before xvs saw them.
        rx_dropped as "xsk_rx_dropped" => "xvs_xsk_rx_dropped_total",
        /// Frames the kernel dropped because the AF_XDP RX ring was full.
        rx_ring_full as "xsk_rx_ring_full" => "xvs_xsk_rx_ring_full_total",
        /// Invalid descriptors on the AF_XDP RX side.
        rx_invalid_descs as "xsk_rx_invalid" => "xvs_xsk_rx_invalid_descs_total",
        /// Times the kernel found the AF_XDP fill ring empty (overlaps
        /// `rx_dropped`).
        rx_fill_ring_empty as "xsk_fill_empty" => "xvs_xsk_rx_fill_ring_empty_total",
        /// Invalid descriptors on the AF_XDP TX ring.
        tx_invalid_descs as "xsk_tx_invalid" => "xvs_xsk_tx_invalid_descs_total",
        /// Times the kernel found the AF_XDP TX ring empty (not a loss).
        tx_ring_empty as "xsk_tx_ring_empty" => "",
    }
}

impl RingStats {
    /// Frames the sockets lost before xvs received them.
    pub fn lost(&self) -> u64 {
        self.rx_dropped + self.rx_ring_full + self.rx_invalid_descs
    }

    /// Asks the kernel for one socket's statistics (zeros if it cannot
    /// answer, e.g. the socket is closed).
    pub fn of_socket(fd: i32) -> RingStats {
        // SAFETY: xdp_statistics is plain old data; all-zero is valid.
        let mut st: libxdp_sys::xdp_statistics = unsafe { std::mem::zeroed() };
        let mut len = std::mem::size_of::<libxdp_sys::xdp_statistics>() as libc::socklen_t;
        // SAFETY: `st` is a writable xdp_statistics of `len` bytes; the
        // kernel writes at most `len` bytes and updates `len`.
        let ret = unsafe {
            libc::getsockopt(
                fd,
                libc::SOL_XDP,
                libxdp_sys::XDP_STATISTICS as i32,
                (&mut st as *mut libxdp_sys::xdp_statistics).cast(),
                &mut len,
            )
        };
        if ret != 0 {
            return RingStats::default();
        }
        RingStats {
            rx_dropped: st.rx_dropped,
            rx_ring_full: st.rx_ring_full,
            rx_invalid_descs: st.rx_invalid_descs,
            rx_fill_ring_empty: st.rx_fill_ring_empty_descs,
            tx_invalid_descs: st.tx_invalid_descs,
            tx_ring_empty: st.tx_ring_empty_descs,
        }
    }

    /// Several sockets' statistics, summed (one getsockopt each: not for
    /// the packet path).
    pub fn of_sockets(fds: impl IntoIterator<Item = i32>) -> RingStats {
        let mut t = RingStats::default();
        for fd in fds {
            t.add(&RingStats::of_socket(fd));
        }
        t
    }
}

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

/// One socket of a port and its rings.
struct Sock {
    rx: RxQueue,
    tx: TxQueue,
    fq: FillQueue,
    cq: CompQueue,
    in_fill: u32,
    in_tx: u32,
}

/// AF_XDP sockets sharing one UMEM.
pub struct XskPort {
    umem: Umem,
    /// The address of the UMEM's first byte: a frame's packet starts at
    /// it plus the descriptor's `addr` (as xsk-rs computes it), which
    /// [`XskPort::prefetch`] needs without a view of the bytes.
    base: usize,
    socks: Vec<Sock>,
    free: Vec<FrameDesc>,
    scratch: Vec<FrameDesc>,
    zero_copy: bool,
    huge_pages: bool,
}

impl std::fmt::Debug for XskPort {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("XskPort")
            .field("sockets", &self.socks.len())
            .field("frames", &self.frame_counts())
            .finish()
    }
}

impl XskPort {
    /// Opens one socket per interface of `ifnames` on `queue`, sharing
    /// one UMEM: zero-copy if `zero_copy` is `Some(true)`, copy if
    /// `Some(false)`, zero-copy else copy if `None`. No XDP program is
    /// loaded: the steering program is xvs's own. A queue still held by
    /// a socket that just closed is tried again every few milliseconds,
    /// up to [`BUSY_WAIT`] (see the module docs).
    pub fn open(
        ifnames: &[&str],
        queue: u32,
        zero_copy: Option<bool>,
    ) -> Result<XskPort, XskError> {
        let err = |what: String| XskError {
            ifname: ifnames.join(","),
            queue,
            what,
        };
        let attempts: &[bool] = match zero_copy {
            Some(true) => &[true],
            Some(false) => &[false],
            None => &[true, false],
        };
        let mut waited = Duration::ZERO;
        let mut huge_wait = HUGE_WAIT;
        loop {
            let mut last = String::new();
            let mut busy = false;
            for &zc in attempts {
                match Self::open_mode(ifnames, queue, zc, &mut huge_wait) {
                    Ok(p) => return Ok(p),
                    Err((e, errno)) => {
                        busy |= errno == Some(libc::EBUSY);
                        last = e;
                    }
                }
            }
            if !busy || waited >= BUSY_WAIT {
                return Err(err(last));
            }
            std::thread::sleep(BUSY_RETRY);
            waited += BUSY_RETRY;
        }
    }

    /// [`XskPort::open`] in one mode, once (waiting for huge pages out of
    /// `huge_wait`, see [`map_umem`]); an error with its errno, if the
    /// kernel gave one.
    fn open_mode(
        ifnames: &[&str],
        queue: u32,
        zero_copy: bool,
        huge_wait: &mut Duration,
    ) -> Result<XskPort, (String, Option<i32>)> {
        let plain = |e: String| (e, None);
        let ring = QueueSize::new(RING).map_err(|e| plain(e.to_string()))?;
        let umem_cfg = umem_config().map_err(plain)?;
        let frames = NonZeroU32::new(FRAMES).ok_or_else(|| plain("no frames".into()))?;
        let (umem, descs, huge_pages) = map_umem(umem_cfg, frames, huge_wait).map_err(plain)?;
        let first = descs.first().ok_or_else(|| plain("no frames".into()))?;
        // SAFETY: `first` is a frame of this UMEM, which nothing else
        // references yet; only the view's address is kept.
        let base = unsafe { umem.data(first) }.contents().as_ptr() as usize - first.addr();
        let mode = if zero_copy {
            BindFlags::XDP_ZEROCOPY
        } else {
            BindFlags::XDP_COPY
        };
        let (libxdp, xdp) = (
            LibxdpFlags::XSK_LIBXDP_FLAGS_INHIBIT_PROG_LOAD,
            XdpFlags::empty(),
        );
        let cfg = SocketConfig::builder()
            .rx_queue_size(ring)
            .tx_queue_size(ring)
            .libxdp_flags(libxdp)
            .xdp_flags(xdp)
            .bind_flags(mode | BindFlags::XDP_USE_NEED_WAKEUP)
            .build();
        let mut socks = Vec::new();
        for ifname in ifnames {
            let iface = ifname
                .parse()
                .map_err(|_| plain(format!("bad interface name {ifname}")))?;
            // SAFETY: each (interface, queue) pair is bound once, so the
            // program-load inhibit flag that a second binding of a pair on
            // a shared UMEM would require is not needed.
            // The kernel's errno, in the text too (xsk-rs keeps it as the
            // error's source).
            let (tx, rx, fq_cq) =
                unsafe { Socket::new(cfg, &umem, &iface, queue) }.map_err(|e| {
                    let os = std::error::Error::source(&e)
                        .and_then(|s| s.downcast_ref::<std::io::Error>())
                        .and_then(std::io::Error::raw_os_error);
                    let why = os.map(std::io::Error::from_raw_os_error);
                    let text = match why {
                        Some(w) => format!("{ifname}: {e}: {w}"),
                        None => format!("{ifname}: {e}"),
                    };
                    (text, os)
                })?;
            let (fq, cq) =
                fq_cq.ok_or_else(|| plain(format!("{ifname}: no fill/completion queues")))?;
            socks.push(Sock {
                rx,
                tx,
                fq,
                cq,
                in_fill: 0,
                in_tx: 0,
            });
        }
        let mut port = XskPort {
            umem,
            base,
            socks,
            free: descs,
            scratch: Vec::with_capacity(RING as usize),
            zero_copy,
            huge_pages,
        };
        port.refill();
        Ok(port)
    }

    /// Number of sockets (interfaces).
    pub fn sockets(&self) -> usize {
        self.socks.len()
    }

    /// Whether the socket runs in zero-copy mode.
    pub fn is_zero_copy(&self) -> bool {
        self.zero_copy
    }

    /// Whether the UMEM is on 2 MiB pages (else 4 KiB ones).
    pub fn has_huge_pages(&self) -> bool {
        self.huge_pages
    }

    /// The address of the UMEM's first byte (to find its mapping).
    pub fn umem_addr(&self) -> usize {
        self.base
    }

    /// Socket `i`'s file descriptor (for the XSKMAP and poll).
    pub fn fd(&self, i: usize) -> i32 {
        self.socks[i].rx.fd().as_raw_fd()
    }

    /// Every socket's file descriptor.
    pub fn fds(&self) -> Vec<i32> {
        (0..self.socks.len()).map(|i| self.fd(i)).collect()
    }

    /// The kernel's statistics of every socket of the port, summed (one
    /// getsockopt per socket: not for the packet path).
    pub fn ring_stats(&self) -> RingStats {
        RingStats::of_sockets((0..self.socks.len()).map(|i| self.fd(i)))
    }

    /// Whether every frame is accounted for.
    pub fn frames_accounted(&self) -> bool {
        let (free, fill, tx) = self.frame_counts();
        free + fill + tx == FRAMES
    }

    /// Frames in userspace, in fill/RX rings, and in TX.
    pub fn frame_counts(&self) -> (u32, u32, u32) {
        let fill = self.socks.iter().map(|s| s.in_fill).sum();
        let tx = self.socks.iter().map(|s| s.in_tx).sum();
        (self.free.len() as u32, fill, tx)
    }

    /// Takes back the frames the kernel finished transmitting.
    pub fn reclaim(&mut self) {
        for s in &mut self.socks {
            if s.in_tx == 0 {
                continue;
            }
            self.scratch.clear();
            self.scratch
                .resize(s.in_tx.min(RING) as usize, FrameDesc::default());
            // SAFETY: descriptors written here are completed TX frames of
            // this UMEM, which the kernel no longer reads.
            let n = unsafe { s.cq.consume(&mut self.scratch) };
            s.in_tx -= n as u32;
            self.free.extend_from_slice(&self.scratch[..n]);
        }
    }

    /// Keeps every fill ring stocked, sharing the free frames between the
    /// sockets and keeping some in userspace for answers and ARP requests.
    pub fn refill(&mut self) {
        let reserve = BATCH * 2;
        let socks = self.socks.len();
        for (k, s) in self.socks.iter_mut().enumerate() {
            if self.free.len() <= reserve {
                return;
            }
            let share = (self.free.len() - reserve) / (socks - k);
            let want = share.min((RING - s.in_fill) as usize);
            if want == 0 {
                continue;
            }
            let start = self.free.len() - want;
            // SAFETY: these frames belong to this UMEM and are owned by
            // userspace (on the free list); they are handed to the kernel
            // once.
            let n = unsafe { s.fq.produce(&self.free[start..]) };
            s.in_fill += n as u32;
            self.free.truncate(self.free.len() - n);
            if n > 0 && s.fq.needs_wakeup() {
                let _ = s.fq.wakeup(s.rx.fd_mut(), 0);
            }
        }
    }

    /// Receives up to `out.len()` frames from socket `i`; returns how many.
    /// The frames are userspace's until passed to [`XskPort::transmit`]
    /// or [`XskPort::release`].
    pub fn receive(&mut self, i: usize, out: &mut [FrameDesc]) -> usize {
        let s = &mut self.socks[i];
        // SAFETY: frames read from the RX ring belong to this UMEM; the
        // kernel is done with them.
        let n = unsafe { s.rx.consume(out) };
        s.in_fill -= n as u32;
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
        let start = self.packet_addr(desc);
        let r = {
            // SAFETY: guaranteed by the caller.
            let mut data = unsafe { self.umem.data_mut(desc) };
            let mut cur = data.cursor();
            let cap = cur.buf_len();
            cur.set_pos(cap);
            let buf = data.contents_mut();
            // What `prefetch` fetches is this frame's first byte (checked
            // by every test that runs a worker on a real socket).
            debug_assert_eq!(buf.as_ptr() as usize, start);
            f(buf, len)
        };
        // The frame keeps its length until the caller sets another.
        // SAFETY: guaranteed by the caller.
        unsafe { self.umem.data_mut(desc) }.cursor().set_pos(len);
        r
    }

    /// Starts bringing a frame's first packet bytes (its headers) into
    /// the cache: the address is computed, not dereferenced (a prefetch
    /// never faults), so any descriptor is harmless.
    #[inline]
    pub fn prefetch(&self, desc: &FrameDesc) {
        xvs_conntrack::prefetch(self.packet_addr(desc) as *const u8);
    }

    /// The address of a frame's first packet byte.
    #[inline]
    fn packet_addr(&self, desc: &FrameDesc) -> usize {
        self.base.wrapping_add(desc.addr())
    }

    /// Sets the length of a frame about to be transmitted.
    ///
    /// # Safety
    /// As [`XskPort::with_frame`].
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

    /// Queues the first frames of `descs` for transmission on socket `i`
    /// and returns how many: the TX ring may have no room for the rest,
    /// which stay the caller's (to retry, or to release). Wakes the kernel
    /// as often as it takes to send what was queued (in copy mode the
    /// kernel sends at most 32 frames per wakeup), up to a bound.
    pub fn transmit(&mut self, i: usize, descs: &[FrameDesc]) -> usize {
        if descs.is_empty() {
            return 0;
        }
        let s = &mut self.socks[i];
        // SAFETY: the frames belong to this UMEM (shared by every socket
        // of the port), are owned by userspace, and are handed to the
        // kernel once.
        let n = unsafe { s.tx.produce(descs) };
        s.in_tx += n as u32;
        let queued = (RING - s.tx.nb_free_exact()) as usize;
        let kicks = queued.div_ceil(KERNEL_TX_BATCH).clamp(1, MAX_KICKS);
        for _ in 0..kicks {
            if !s.tx.needs_wakeup() || s.tx.nb_free_exact() == RING {
                break;
            }
            let _ = s.tx.wakeup();
        }
        n
    }
}

impl crate::io::PacketIo for XskPort {
    type Frame = FrameDesc;

    fn sockets(&self) -> usize {
        XskPort::sockets(self)
    }
    fn poll_fd(&self, i: usize) -> Option<std::os::fd::RawFd> {
        Some(self.fd(i))
    }
    fn reclaim(&mut self) {
        XskPort::reclaim(self)
    }
    fn refill(&mut self) {
        XskPort::refill(self)
    }
    fn receive(&mut self, i: usize, out: &mut [FrameDesc]) -> usize {
        XskPort::receive(self, i, out)
    }
    fn transmit(&mut self, i: usize, frames: &[FrameDesc]) -> usize {
        XskPort::transmit(self, i, frames)
    }
    fn alloc(&mut self) -> Option<FrameDesc> {
        XskPort::alloc(self)
    }
    fn release(&mut self, frames: &[FrameDesc]) {
        XskPort::release(self, frames)
    }
    unsafe fn with_frame<R>(
        &self,
        frame: &mut FrameDesc,
        f: impl FnOnce(&mut [u8], usize) -> R,
    ) -> R {
        // SAFETY: the trait's contract is the inherent method's.
        unsafe { XskPort::with_frame(self, frame, f) }
    }
    unsafe fn set_len(&self, frame: &mut FrameDesc, len: usize) {
        // SAFETY: the trait's contract is the inherent method's.
        unsafe { XskPort::set_len(self, frame, len) }
    }
    fn prefetch(&self, frame: &FrameDesc) {
        XskPort::prefetch(self, frame)
    }
    fn frame_counts(&self) -> (u32, u32, u32) {
        XskPort::frame_counts(self)
    }
    fn frames_accounted(&self) -> bool {
        XskPort::frames_accounted(self)
    }
    fn ring_stats(&self) -> RingStats {
        XskPort::ring_stats(self)
    }
}
