//! Cross-memory attach (CMA): single-copy transfers between processes of one node with
//! `process_vm_readv` / `process_vm_writev`.
//!
//! The kernel copies directly between the two address spaces, so a rendezvous payload crosses
//! memory once instead of twice (no staging through the segment). The caller must be allowed
//! to ptrace the peer (same user, and Yama's `ptrace_scope` at 0, or `CAP_SYS_PTRACE`);
//! containers often forbid the system calls outright. [`CmaError::is_unsupported`] tells such a
//! refusal from a real failure, so the runtime can fall back to the pipelined copy.
//!
//! Neither call touches the caller's memory outside the slice it is given, and a bad remote
//! range is reported by the kernel (`EFAULT`). [`read`] is safe: it only reads the other
//! process. [`write`](fn@write) is `unsafe`: it changes another process's memory, which is sound only
//! where that process lent the range for it; it refuses this process's own pid.

use std::io;

/// Bytes moved per system call: the kernel pins the pages of one call at a time, and smaller
/// calls let the caller make progress between them.
pub const CHUNK: usize = 4 << 20;

/// Why a single-copy transfer failed.
#[derive(Debug)]
pub struct CmaError(pub io::Error);

impl CmaError {
    /// The kernel refuses CMA between these processes (permissions, seccomp, no support):
    /// use another mechanism; no byte has moved.
    pub fn is_unsupported(&self) -> bool {
        matches!(self.0.raw_os_error(), Some(libc::EPERM | libc::EACCES | libc::ENOSYS))
    }

    /// The peer process no longer exists.
    pub fn peer_gone(&self) -> bool {
        self.0.raw_os_error() == Some(libc::ESRCH)
    }
}

impl std::fmt::Display for CmaError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "cross-memory attach failed: {}", self.0)
    }
}

fn moved(r: isize) -> Result<usize, CmaError> {
    match r {
        r if r > 0 => Ok(r as usize),
        0 => Err(CmaError(io::Error::new(io::ErrorKind::UnexpectedEof, "no byte moved"))),
        _ => Err(CmaError(io::Error::last_os_error())),
    }
}

/// Copies `dst.len()` bytes at address `remote` of process `pid` into `dst`.
pub fn read(pid: u32, remote: u64, dst: &mut [u8]) -> Result<(), CmaError> {
    let mut done = 0;
    while done < dst.len() {
        let rest = &mut dst[done..];
        let n = rest.len().min(CHUNK);
        let local = libc::iovec { iov_base: rest.as_mut_ptr().cast(), iov_len: n };
        let far = libc::iovec { iov_base: (remote as usize).wrapping_add(done) as *mut libc::c_void, iov_len: n };
        // SAFETY: the kernel writes at most `n` bytes into `local`, which is a live, exclusively
        // borrowed part of `dst`; `far` names memory of another process and is only read by
        // the kernel, which checks it (EFAULT) — it is never dereferenced here.
        let r = unsafe { libc::process_vm_readv(pid as libc::pid_t, &local, 1, &far, 1, 0) };
        done += moved(r)?;
    }
    Ok(())
}

/// Copies `src` to address `remote` of process `pid`, which must be another process: a write
/// into this process is refused (`EINVAL`), as it could change memory behind a live borrow.
///
/// # Safety
/// `[remote, remote + src.len())` must be memory of process `pid` that nothing in that
/// process reads or writes meanwhile and that it has lent for this write (for tmpi: the
/// receive buffer of a rendezvous read that the target was granted). The kernel checks that
/// the range is mapped (`EFAULT` otherwise), not what it holds.
///
/// # Errors
/// The kernel's refusal (see [`CmaError::is_unsupported`]), a vanished process
/// ([`CmaError::peer_gone`]), a bad range, or `pid` being this process.
pub unsafe fn write(pid: u32, remote: u64, src: &[u8]) -> Result<(), CmaError> {
    if pid == std::process::id() {
        return Err(CmaError(io::Error::from_raw_os_error(libc::EINVAL)));
    }
    let mut done = 0;
    while done < src.len() {
        let rest = &src[done..];
        let n = rest.len().min(CHUNK);
        let local = libc::iovec { iov_base: rest.as_ptr() as *mut libc::c_void, iov_len: n };
        let far = libc::iovec { iov_base: (remote as usize).wrapping_add(done) as *mut libc::c_void, iov_len: n };
        // SAFETY: the kernel only reads `n` bytes of `local` (a live part of `src`). `far` is
        // memory of another process (this one is refused above) that the caller guarantees
        // is lent for this write; the kernel checks that it is mapped.
        let r = unsafe { libc::process_vm_writev(pid as libc::pid_t, &local, 1, &far, 1, 0) };
        done += moved(r)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_and_writes_own_memory() {
        let pid = std::process::id();
        let src: Vec<u8> = (0..(CHUNK + 4097)).map(|i| (i % 251) as u8).collect();
        let mut dst = vec![0u8; src.len()];
        if let Err(e) = read(pid, src.as_ptr() as u64, &mut dst) {
            assert!(e.is_unsupported(), "{e}");
            return;
        }
        assert_eq!(src, dst);
        let mut back = vec![0u8; 1000];
        // SAFETY: refused before anything is written (own pid).
        let e = unsafe { write(pid, back.as_mut_ptr() as u64, &src[..1000]) }.unwrap_err();
        assert_eq!(e.0.raw_os_error(), Some(libc::EINVAL));
        assert!(back.iter().all(|&b| b == 0));
    }

    #[test]
    fn bad_remote_address_is_an_error_not_a_crash() {
        let pid = std::process::id();
        let mut dst = [0u8; 16];
        let e = read(pid, 8, &mut dst).unwrap_err();
        assert!(!e.peer_gone());
        assert_eq!(dst, [0u8; 16]);
    }

    #[test]
    fn missing_process_is_peer_gone() {
        let mut dst = [0u8; 16];
        // pid_max on Linux is at most 2^22.
        let e = read(1 << 23, 4096, &mut dst).unwrap_err();
        assert!(e.peer_gone() || e.is_unsupported(), "{e}");
    }
}
