//! One cache line's worth of a value, aligned to it: for arrays whose
//! every element one worker writes (a backend's counter cell in that
//! worker's row), where a line per element is the point and crossbeam's
//! `CachePadded` (128 bytes on x86_64, against the adjacent-line
//! prefetcher's false sharing between writers) would double the array
//! and the lines a pass over it fetches.
//!
//! Invariant: `Line64<T>` starts on a 64-byte boundary and is a multiple
//! of 64 bytes long, so elements of an array of them never share a line.

use std::ops::Deref;

/// `T` alone on its 64-byte line(s).
#[derive(Debug, Default)]
#[repr(C, align(64))]
pub struct Line64<T>(pub T);

impl<T> Deref for Line64<T> {
    type Target = T;

    #[inline(always)]
    fn deref(&self) -> &T {
        &self.0
    }
}
