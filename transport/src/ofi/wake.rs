//! Sleeping on a completion queue's descriptor, and waking such a sleep from another thread.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::Arc;
use std::time::Duration;

/// Ends an [`super::OfiFabric::wait`] from any thread (an `eventfd`).
#[derive(Clone, Debug)]
pub struct Waker {
    fd: Arc<OwnedFd>,
}

impl Waker {
    /// A new waker.
    ///
    /// # Errors
    /// `eventfd(2)` failed.
    pub fn new() -> std::io::Result<Waker> {
        // SAFETY: plain system call; a non-negative result is a descriptor we now own.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: `fd` is open and owned by nothing else.
        Ok(Waker { fd: Arc::new(unsafe { OwnedFd::from_raw_fd(fd) }) })
    }

    /// Wakes the sleeper (or the next sleep, at once).
    pub fn wake(&self) {
        let one = 1u64.to_ne_bytes();
        // SAFETY: writes 8 bytes from a live array to our eventfd; a full counter (EAGAIN)
        // already wakes.
        let _ = unsafe { libc::write(self.fd.as_raw_fd(), one.as_ptr().cast(), 8) };
    }

    fn drain(&self) {
        let mut b = [0u8; 8];
        // SAFETY: reads at most 8 bytes into a live array from our non-blocking eventfd.
        let _ = unsafe { libc::read(self.fd.as_raw_fd(), b.as_mut_ptr().cast(), 8) };
    }
}

/// Sleeps in `ppoll(2)` until `fd` (if not negative) is readable, `waker` is woken, or
/// `timeout` passes. Returns whether something woke it.
pub(crate) fn sleep_on(fd: i32, waker: Option<&Waker>, timeout: Duration) -> bool {
    let mut fds = [libc::pollfd { fd, events: libc::POLLIN, revents: 0 }, libc::pollfd { fd: -1, events: libc::POLLIN, revents: 0 }];
    if let Some(w) = waker {
        fds[1].fd = w.fd.as_raw_fd();
    }
    let ts = libc::timespec {
        tv_sec: timeout.as_secs().min(i64::MAX as u64) as libc::time_t,
        tv_nsec: libc::c_long::from(timeout.subsec_nanos() as i32),
    };
    // SAFETY: two initialised entries (negative descriptors are ignored by the kernel); the
    // descriptors stay open for the call (the caller's endpoint and the waker we borrow).
    let r = unsafe { libc::ppoll(fds.as_mut_ptr(), 2, &ts, std::ptr::null()) };
    if fds[1].revents != 0 {
        if let Some(w) = waker {
            w.drain();
        }
    }
    r > 0
}
