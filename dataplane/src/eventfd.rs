//! An eventfd, owned: the control plane's doorbell to a sleeping worker.
//! `wake` adds 1 to the counter (the worker's poll sees POLLIN), `drain`
//! reads it back to 0. The descriptor is closed when the last owner drops
//! it (it is shared through an `Arc` by the worker and its handle).
//!
//! Invariants: the fd is nonblocking and close-on-exec; a wake that finds
//! the counter at its maximum, or a drain that finds it at 0, is not an
//! error (the doorbell is rung, or was already answered).

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// A nonblocking eventfd.
#[derive(Debug)]
pub struct EventFd {
    fd: OwnedFd,
}

impl EventFd {
    /// A new eventfd at 0.
    pub fn new() -> io::Result<EventFd> {
        // SAFETY: eventfd has no memory preconditions; its result is
        // checked before it is owned.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` is a fresh descriptor nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(EventFd { fd })
    }

    /// Rings: adds 1 to the counter.
    pub fn wake(&self) -> io::Result<()> {
        let one = 1u64;
        // SAFETY: writes the 8 bytes of `one`, which outlives the call, to
        // an eventfd we own.
        let n = unsafe { libc::write(self.fd.as_raw_fd(), (&one as *const u64).cast(), 8) };
        match n {
            8 => Ok(()),
            _ => match io::Error::last_os_error() {
                e if e.kind() == io::ErrorKind::WouldBlock => Ok(()),
                e => Err(e),
            },
        }
    }

    /// Answers: reads the counter back to 0; returns how many rings.
    pub fn drain(&self) -> io::Result<u64> {
        let mut v = 0u64;
        // SAFETY: reads 8 bytes into `v`, which outlives the call, from an
        // eventfd we own (an eventfd read is exactly 8 bytes).
        let n = unsafe { libc::read(self.fd.as_raw_fd(), (&mut v as *mut u64).cast(), 8) };
        match n {
            8 => Ok(v),
            _ => match io::Error::last_os_error() {
                e if e.kind() == io::ErrorKind::WouldBlock => Ok(0),
                e => Err(e),
            },
        }
    }
}

impl AsRawFd for EventFd {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rings_add_up_and_drain_to_zero() {
        let e = EventFd::new().unwrap();
        assert_eq!(e.drain().unwrap(), 0, "nothing rang: not an error");
        e.wake().unwrap();
        e.wake().unwrap();
        assert_eq!(e.drain().unwrap(), 2);
        assert_eq!(e.drain().unwrap(), 0);
    }

    #[test]
    fn poll_sees_a_ring() {
        let e = EventFd::new().unwrap();
        let mut p = libc::pollfd {
            fd: e.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd; zero timeout.
        assert_eq!(unsafe { libc::poll(&mut p, 1, 0) }, 0);
        e.wake().unwrap();
        // SAFETY: as above.
        assert_eq!(unsafe { libc::poll(&mut p, 1, 0) }, 1);
    }
}
