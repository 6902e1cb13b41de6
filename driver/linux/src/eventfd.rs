//! An eventfd: the file the umad port's thread waits on beside the umad file and the
//! device's async events, raised to wake it (a timer due earlier than its sleep, passive
//! work, stopping). A raise stays readable until cleared, so one made between the
//! thread's last look and its wait is not lost (eventfd(2)).

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// A non-blocking eventfd.
#[derive(Debug)]
pub(crate) struct EventFd(OwnedFd);

impl EventFd {
    pub(crate) fn new() -> io::Result<Self> {
        // SAFETY: eventfd takes no pointers; a non-negative result is a new descriptor.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` was just opened and is owned by nothing else.
        Ok(Self(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// Makes the file readable. A counter already at its maximum (EAGAIN) is raised.
    pub(crate) fn raise(&self) {
        let one = 1u64.to_ne_bytes();
        // SAFETY: writes 8 bytes from a live buffer to the open descriptor.
        let _ = unsafe { libc::write(self.0.as_raw_fd(), one.as_ptr().cast(), one.len()) };
    }

    /// Reads the counter back to zero; nothing raised (EAGAIN) is fine.
    pub(crate) fn clear(&self) {
        let mut count = [0u8; 8];
        // SAFETY: reads at most 8 bytes into a live buffer from the open descriptor.
        let _ = unsafe { libc::read(self.0.as_raw_fd(), count.as_mut_ptr().cast(), count.len()) };
    }

    pub(crate) fn fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::EventFd;

    fn readable(e: &EventFd) -> bool {
        let mut p = libc::pollfd {
            fd: e.fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd for the call.
        unsafe { libc::poll(&mut p, 1, 0) == 1 }
    }

    /// Raised twice, it is readable until cleared once; cleared, it is not.
    #[test]
    fn raised_until_cleared() {
        let e = EventFd::new().expect("eventfd");
        assert!(!readable(&e));
        e.raise();
        e.raise();
        assert!(readable(&e));
        e.clear();
        assert!(!readable(&e));
        e.clear();
        assert!(!readable(&e));
    }
}
