//! The two futex operations the doorbell needs (Linux `futex(2)`), on a 32-bit word in shared
//! memory.
//!
//! The word lives in the job's `MAP_SHARED` segment, which ranks of other processes map too,
//! so the operations are the shared (not `FUTEX_PRIVATE_FLAG`) ones: the kernel keys a waiter
//! by the mapped file page and offset, and a wake from any process mapping the page finds it.
//!
//! Neither call can make a waiter miss a wake-up by itself: [`wait`] sleeps only if the word
//! still holds `expected` when the kernel looks at it (atomically with queueing the waiter),
//! and a waker changes the word before it calls [`wake`].

use std::sync::atomic::AtomicU32;
use std::time::Duration;

/// How a [`wait`] ended, as the kernel reported it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitEnd {
    /// Woken by a [`wake`] (or spuriously: the kernel may return 0 without one).
    Woken,
    /// The word did not hold `expected` when the kernel looked: no sleep at all.
    Changed,
    /// `timeout` passed.
    TimedOut,
    /// A signal arrived.
    Interrupted,
    /// Any other error of `futex(2)` (its errno).
    Failed(i32),
}

/// Sleeps until the word changes from `expected` and someone calls [`wake`] on it, or until
/// `timeout` passes, or a signal arrives. Returns at once if the word no longer holds
/// `expected`. Every outcome is fine for a caller that re-checks its condition afterwards
/// (spurious returns included); which one it was is returned for tests and diagnostics.
pub fn wait(word: &AtomicU32, expected: u32, timeout: Duration) -> WaitEnd {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs().min(i64::MAX as u64) as libc::time_t,
        tv_nsec: libc::c_long::from(timeout.subsec_nanos() as i32),
    };
    // SAFETY: FUTEX_WAIT reads the 32-bit word at `word` (a live, aligned AtomicU32 borrowed
    // for the whole call) and the timespec on this stack frame; it writes neither. The
    // remaining arguments (uaddr2, val3) are ignored by FUTEX_WAIT. Errors (EAGAIN: the word
    // changed, ETIMEDOUT, EINTR) leave no state behind.
    let r = unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            expected,
            &ts as *const libc::timespec,
            std::ptr::null::<u32>(),
            0u32,
        )
    };
    if r == 0 {
        return WaitEnd::Woken;
    }
    match std::io::Error::last_os_error().raw_os_error() {
        Some(libc::EAGAIN) => WaitEnd::Changed,
        Some(libc::ETIMEDOUT) => WaitEnd::TimedOut,
        Some(libc::EINTR) => WaitEnd::Interrupted,
        e => WaitEnd::Failed(e.unwrap_or(0)),
    }
}

/// Wakes every waiter sleeping on `word` (each rank has its own word, so there is at most one
/// in practice). Call it after changing the word.
pub fn wake(word: &AtomicU32) {
    // SAFETY: FUTEX_WAKE only uses `word`'s address as a key (it neither reads nor writes
    // memory through it beyond the kernel's own lookup); `word` is a live AtomicU32. The
    // timeout, uaddr2 and val3 arguments are ignored by FUTEX_WAKE.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE,
            i32::MAX,
            std::ptr::null::<libc::timespec>(),
            std::ptr::null::<u32>(),
            0u32,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering;
    use std::sync::Arc;
    use std::time::Instant;

    #[test]
    fn wait_returns_at_once_when_the_word_changed() {
        let w = AtomicU32::new(5);
        let t = Instant::now();
        wait(&w, 4, Duration::from_secs(10));
        assert!(t.elapsed() < Duration::from_secs(5));
    }

    /// Nobody wakes the word: the kernel ends the sleep by its timeout (a signal may cut it
    /// short; then it sleeps again), and the wait says so; a word that no longer holds the
    /// value is no sleep at all. This test used to assert nothing.
    #[test]
    fn wait_times_out() {
        let w = AtomicU32::new(0);
        let end = std::iter::repeat_with(|| wait(&w, 0, Duration::from_millis(2))).find(|e| *e != WaitEnd::Interrupted);
        assert_eq!(end, Some(WaitEnd::TimedOut));
        assert_eq!(wait(&w, 1, Duration::from_secs(10)), WaitEnd::Changed);
    }

    #[test]
    fn wake_ends_a_wait() {
        let w = Arc::new(AtomicU32::new(0));
        let w2 = w.clone();
        let t = std::thread::spawn(move || {
            let start = Instant::now();
            while w2.load(Ordering::Acquire) == 0 {
                wait(&w2, 0, Duration::from_secs(30));
            }
            start.elapsed()
        });
        std::thread::sleep(Duration::from_millis(20));
        w.store(1, Ordering::Release);
        wake(&w);
        let took = t.join().unwrap();
        assert!(took < Duration::from_secs(20), "{took:?}");
    }
}
