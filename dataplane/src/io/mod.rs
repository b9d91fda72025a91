//! The packet I/O boundary a worker runs on (smoltcp's `phy::Device` is
//! the model): frames come in on one or two sockets (one-arm, two-arm),
//! are processed in place, and go out on a socket or back to the free
//! list. [`crate::xsk::XskPort`] implements it over AF_XDP;
//! [`loopback::Loopback`] over memory, so workers run in unit tests
//! without root, with time given by the test.
//!
//! Invariants of every implementation: a frame handle is owned by exactly
//! one of the free list, a fill/RX ring, the worker, or a TX ring; a frame
//! the worker holds goes back by `transmit` (the part a ring took) or
//! `release`, never both; `frames_accounted` says whether every frame is
//! in one of those places.

pub mod loopback;

use std::os::fd::RawFd;

use crate::xsk::{RingStats, FRAME_AHEAD};

/// Frames, their bytes, and the sockets they come and go by.
pub trait PacketIo {
    /// A frame handle (a descriptor: copying it does not copy the bytes).
    type Frame: Copy + Default;

    /// Sockets: 1 (one-arm) or 2 (two-arm: client side first).
    fn sockets(&self) -> usize;
    /// A descriptor to wait on for socket `i` (poll), if it has one.
    fn poll_fd(&self, i: usize) -> Option<RawFd>;
    /// Takes back the frames whose transmission completed.
    fn reclaim(&mut self);
    /// Hands free frames to the receive side.
    fn refill(&mut self);
    /// Receives up to `out.len()` frames from socket `i`; how many.
    fn receive(&mut self, i: usize, out: &mut [Self::Frame]) -> usize;
    /// Queues the first frames of `frames` on socket `i`; how many were
    /// taken (the rest stay the caller's).
    fn transmit(&mut self, i: usize, frames: &[Self::Frame]) -> usize;
    /// A free frame to build a packet in.
    fn alloc(&mut self) -> Option<Self::Frame>;
    /// Returns frames to the free list without sending them.
    fn release(&mut self, frames: &[Self::Frame]);
    /// Runs `f` on the whole buffer of a frame and its current length.
    ///
    /// # Safety
    /// `frame` must be owned by the caller (received or allocated, not yet
    /// transmitted or released), with no other reference to its bytes
    /// alive.
    unsafe fn with_frame<R>(
        &self,
        frame: &mut Self::Frame,
        f: impl FnOnce(&mut [u8], usize) -> R,
    ) -> R;
    /// Sets the length of a frame about to be transmitted.
    ///
    /// # Safety
    /// As [`PacketIo::with_frame`].
    unsafe fn set_len(&self, frame: &mut Self::Frame, len: usize);
    /// Starts bringing the start of a frame's packet (its headers) into
    /// the cache: a hint that reads nothing and never faults, so a batch
    /// fetches its frames a few ahead of the one it classifies and their
    /// misses overlap (DPDK's `rte_prefetch0` of the next packets).
    fn prefetch(&self, frame: &Self::Frame);
    /// The prefetches due before working on frame `k` of a batch, in
    /// order (frame `k` + [`FRAME_AHEAD`]; at `k` = 0 also the ones
    /// before it): a batch loop calls it at each frame, so every frame's
    /// headers are asked for [`FRAME_AHEAD`] frames before its turn.
    #[inline]
    fn prefetch_ahead(&self, frames: &[Self::Frame], k: usize) {
        for f in &frames[due_before(k, frames.len())] {
            self.prefetch(f);
        }
    }
    /// Frames in userspace, in the receive side, and in transmission.
    fn frame_counts(&self) -> (u32, u32, u32);
    /// Whether every frame is in one of those places.
    fn frames_accounted(&self) -> bool;
    /// What the sockets' kernel counted (drops before xvs saw a frame).
    fn ring_stats(&self) -> RingStats;
}

/// The frames of an `n`-frame batch whose headers are fetched before
/// frame `k` is worked on ([`PacketIo::prefetch_ahead`]).
#[inline]
fn due_before(k: usize, n: usize) -> std::ops::Range<usize> {
    let from = if k == 0 { 0 } else { k + FRAME_AHEAD };
    from.min(n)..(k + FRAME_AHEAD + 1).min(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_frame_is_fetched_once_frame_ahead_frames_before_its_turn() {
        for n in [0, 1, FRAME_AHEAD, FRAME_AHEAD + 1, 64] {
            let mut asked = Vec::new();
            for k in 0..n {
                for j in due_before(k, n) {
                    // Frame j is asked for at turn j - FRAME_AHEAD (or at
                    // the first turn).
                    assert_eq!(k, j.saturating_sub(FRAME_AHEAD), "n {n}, frame {j}");
                    asked.push(j);
                }
            }
            assert_eq!(asked, (0..n).collect::<Vec<_>>(), "n {n}");
        }
    }
}
