//! Packet I/O over memory: a [`Loopback`] is what a worker owns (frames,
//! a free list, a receive side, frames in transmission), a [`Wire`] is the
//! test's end of it (frames to deliver, frames sent). No descriptors, no
//! root: workers built on it run in ordinary unit tests, stepped by the
//! test with the time it chooses.
//!
//! It behaves as the AF_XDP port does where a worker can tell: frames
//! are handed to the receive side ahead (keeping a reserve for answers and
//! ARP requests); a frame arriving with no free receive frame is dropped
//! and counted as the kernel counts it (`rx_dropped`); a socket's
//! transmit takes only as many frames as its ring has room for
//! ([`Wire::set_tx_room`], unbounded by default); sent frames come back
//! to the free list at the next `reclaim`.

use std::cell::UnsafeCell;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};

use super::PacketIo;
use crate::xsk::{RingStats, BATCH};

/// Bytes of one frame.
pub const FRAME: usize = 2048;

/// A loopback frame handle.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Frame {
    index: u32,
    len: u32,
}

#[derive(Debug, Default)]
struct Queues {
    /// Frames to deliver, by socket.
    incoming: [VecDeque<Vec<u8>>; 2],
    /// Frames sent, by socket.
    sent: [Vec<Vec<u8>>; 2],
    /// How many more frames each socket's ring takes (`None`: no bound).
    tx_room: [Option<usize>; 2],
    /// Frames dropped for want of a receive frame.
    rx_dropped: u64,
}

/// The test's end: deliver frames, read what was sent, narrow a ring.
#[derive(Debug, Clone, Default)]
pub struct Wire(Arc<Mutex<Queues>>);

impl Wire {
    fn lock(&self) -> MutexGuard<'_, Queues> {
        match self.0.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        }
    }

    /// Delivers `bytes` on socket `sock` (0: client side; 1: backend side
    /// in two-arm mode).
    pub fn deliver(&self, sock: usize, bytes: &[u8]) {
        self.lock().incoming[sock].push_back(bytes.to_vec());
    }

    /// The frames sent on `sock` since the last call, oldest first.
    pub fn take_sent(&self, sock: usize) -> Vec<Vec<u8>> {
        std::mem::take(&mut self.lock().sent[sock])
    }

    /// Lets socket `sock`'s ring take `room` more frames (`None`: no
    /// bound), as a TX ring the kernel does not drain.
    pub fn set_tx_room(&self, sock: usize, room: Option<usize>) {
        self.lock().tx_room[sock] = room;
    }

    /// Frames delivered but not yet received.
    pub fn pending(&self, sock: usize) -> usize {
        self.lock().incoming[sock].len()
    }
}

/// Frames in memory and the queues of a [`Wire`].
pub struct Loopback {
    bufs: Box<[UnsafeCell<[u8; FRAME]>]>,
    free: Vec<Frame>,
    /// Frames on the receive side (the fill ring's).
    fill: Vec<Frame>,
    /// Frames sent, back to the free list at the next reclaim.
    in_tx: Vec<Frame>,
    sockets: usize,
    wire: Wire,
}

impl Loopback {
    /// `frames` frames and `sockets` sockets (1 or 2), and the wire.
    pub fn new(frames: u32, sockets: usize) -> (Loopback, Wire) {
        let wire = Wire::default();
        let bufs = (0..frames).map(|_| UnsafeCell::new([0; FRAME])).collect();
        let free = (0..frames).map(|index| Frame { index, len: 0 }).collect();
        let lo = Loopback {
            bufs,
            free,
            fill: Vec::new(),
            in_tx: Vec::new(),
            sockets: sockets.clamp(1, 2),
            wire: wire.clone(),
        };
        (lo, wire)
    }
}

impl PacketIo for Loopback {
    type Frame = Frame;

    fn sockets(&self) -> usize {
        self.sockets
    }

    fn poll_fd(&self, _: usize) -> Option<std::os::fd::RawFd> {
        None
    }

    fn reclaim(&mut self) {
        self.free.append(&mut self.in_tx);
    }

    fn refill(&mut self) {
        // As the AF_XDP port: a reserve stays for answers and ARP.
        let reserve = BATCH * 2;
        while self.free.len() > reserve {
            let Some(f) = self.free.pop() else { break };
            self.fill.push(f);
        }
    }

    fn receive(&mut self, i: usize, out: &mut [Frame]) -> usize {
        let mut q = self.wire.lock();
        let mut n = 0;
        while n < out.len() {
            let Some(bytes) = q.incoming[i].pop_front() else {
                break;
            };
            let Some(mut f) = self.fill.pop() else {
                // No receive frame: the kernel drops it.
                q.rx_dropped += 1;
                continue;
            };
            let len = bytes.len().min(FRAME);
            // SAFETY: `f` came from the receive side, which nothing else
            // references; the lock is held, no other reference is alive.
            let buf = unsafe { &mut *self.bufs[f.index as usize].get() };
            buf[..len].copy_from_slice(&bytes[..len]);
            f.len = len as u32;
            out[n] = f;
            n += 1;
        }
        n
    }

    fn transmit(&mut self, i: usize, frames: &[Frame]) -> usize {
        let mut q = self.wire.lock();
        let room = q.tx_room[i].unwrap_or(usize::MAX);
        let n = frames.len().min(room);
        for f in &frames[..n] {
            // SAFETY: the caller hands these frames over; nothing else
            // references them.
            let buf = unsafe { &*self.bufs[f.index as usize].get() };
            q.sent[i].push(buf[..f.len as usize].to_vec());
        }
        if let Some(r) = &mut q.tx_room[i] {
            *r -= n;
        }
        self.in_tx.extend_from_slice(&frames[..n]);
        n
    }

    fn alloc(&mut self) -> Option<Frame> {
        let mut f = self.free.pop()?;
        f.len = 0;
        Some(f)
    }

    fn release(&mut self, frames: &[Frame]) {
        self.free.extend_from_slice(frames);
    }

    unsafe fn with_frame<R>(&self, frame: &mut Frame, f: impl FnOnce(&mut [u8], usize) -> R) -> R {
        // SAFETY: the caller owns the frame and holds no other reference
        // to its bytes.
        let buf = unsafe { &mut *self.bufs[frame.index as usize].get() };
        f(&mut buf[..], frame.len as usize)
    }

    unsafe fn set_len(&self, frame: &mut Frame, len: usize) {
        frame.len = len.min(FRAME) as u32;
    }

    fn prefetch(&self, frame: &Frame) {
        if let Some(buf) = self.bufs.get(frame.index as usize) {
            xvs_conntrack::prefetch(buf.get().cast::<u8>());
        }
    }

    fn frame_counts(&self) -> (u32, u32, u32) {
        (
            self.free.len() as u32,
            self.fill.len() as u32,
            self.in_tx.len() as u32,
        )
    }

    fn frames_accounted(&self) -> bool {
        let (a, b, c) = self.frame_counts();
        (a + b + c) as usize == self.bufs.len()
    }

    fn ring_stats(&self) -> RingStats {
        RingStats {
            rx_dropped: self.wire.lock().rx_dropped,
            ..RingStats::default()
        }
    }
}
