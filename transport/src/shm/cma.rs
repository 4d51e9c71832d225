//! Cross-memory attach (CMA): single-copy transfers between processes of one node with
//! `process_vm_readv` / `process_vm_writev`.
//!
//! The kernel copies directly between the two address spaces, so a rendezvous payload crosses
//! memory once instead of twice (no staging through the segment). The caller must be allowed
//! to ptrace the peer (same user, and Yama's `ptrace_scope` at 0, or `CAP_SYS_PTRACE`);
//! containers often forbid the system calls outright. [`Error::is_unsupported`] tells such a
//! refusal from a real failure, so the runtime can fall back to the pipelined copy.
//!
//! These calls never touch the caller's memory outside the slice they are given, and a bad
//! remote range is reported by the kernel (`EFAULT`), so both functions are safe.

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

/// Copies `src` to address `remote` of process `pid`.
pub fn write(pid: u32, remote: u64, src: &[u8]) -> Result<(), CmaError> {
    let mut done = 0;
    while done < src.len() {
        let rest = &src[done..];
        let n = rest.len().min(CHUNK);
        let local = libc::iovec { iov_base: rest.as_ptr() as *mut libc::c_void, iov_len: n };
        let far = libc::iovec { iov_base: (remote as usize).wrapping_add(done) as *mut libc::c_void, iov_len: n };
        // SAFETY: the kernel only reads `n` bytes of `local` (a live part of `src`); `far` is
        // memory of another process that the kernel checks and writes, never this process's.
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
        write(pid, back.as_mut_ptr() as u64, &src[..1000]).unwrap();
        assert_eq!(&back[..], &src[..1000]);
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
