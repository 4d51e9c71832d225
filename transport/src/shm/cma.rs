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

/// Most ranges [`read_many`] takes (the kernel's limit, `UIO_MAXIOV`, is 1024).
pub const MANY_MAX: usize = 64;

/// Copies several ranges of process `pid` with one system call: each `(remote, dst)` part
/// fills `dst` from address `remote`. Each call has a fixed cost (finding and checking the
/// process, pinning), about 0.3 us on a 2-core Xeon under KVM: a quarter of the copy of
/// 16 KiB, which batching saves (`bench/c/cma_batch.c`).
///
/// Returns the bytes moved, in order: fewer than the parts hold when the kernel stopped at a
/// bad range (the parts before it, and possibly a prefix of it, are filled).
///
/// # Errors
/// No byte moved: the kernel's refusal (see [`CmaError::is_unsupported`]), a vanished process
/// ([`CmaError::peer_gone`]), a bad first range, or more than [`MANY_MAX`] parts or
/// [`CHUNK`] bytes (`EINVAL`, nothing tried).
pub fn read_many(pid: u32, parts: &mut [(u64, &mut [u8])]) -> Result<usize, CmaError> {
    let (local, far, n) = iovecs(parts.iter_mut().map(|(remote, dst)| (*remote, dst.as_mut_ptr(), dst.len())))?;
    // SAFETY: the kernel writes at most `local[i].iov_len` bytes at each `local[i]`, each a
    // live slice of `parts`, exclusively borrowed for this call (distinct `&mut` borrows, so
    // they do not overlap); `far` names memory of another process, only read by the kernel,
    // which checks it (EFAULT) and never dereferenced here.
    let r = unsafe { libc::process_vm_readv(pid as libc::pid_t, local.as_ptr(), n, far.as_ptr(), n, 0) };
    moved(r)
}

/// The local and remote `iovec`s of [`read_many`] / [`write_many`], from `(remote address,
/// local pointer, length)` parts, and their count; `EINVAL` for more than [`MANY_MAX`] parts
/// or [`CHUNK`] bytes. Builds descriptors only: nothing is dereferenced.
fn iovecs(
    parts: impl Iterator<Item = (u64, *mut u8, usize)>,
) -> Result<([libc::iovec; MANY_MAX], [libc::iovec; MANY_MAX], libc::c_ulong), CmaError> {
    let empty = libc::iovec { iov_base: std::ptr::null_mut(), iov_len: 0 };
    let (mut local, mut far) = ([empty; MANY_MAX], [empty; MANY_MAX]);
    let (mut n, mut total) = (0, 0usize);
    for (remote, ptr, len) in parts {
        total = total.saturating_add(len);
        if n == MANY_MAX || total > CHUNK {
            return Err(CmaError(io::Error::from_raw_os_error(libc::EINVAL)));
        }
        local[n] = libc::iovec { iov_base: ptr.cast(), iov_len: len };
        far[n] = libc::iovec { iov_base: remote as usize as *mut libc::c_void, iov_len: len };
        n += 1;
    }
    Ok((local, far, n as libc::c_ulong))
}

/// Copies several slices into process `pid`, which must be another process, with one system
/// call: each `(remote, src)` part writes `src` at address `remote`. Returns the bytes moved,
/// in order: fewer than the parts hold when the kernel stopped at a bad range.
///
/// # Safety
/// As for [`write`](fn@write), for every part: each remote range is memory of process `pid`
/// that nothing there reads or writes meanwhile and that it has lent for this write.
///
/// # Errors
/// No byte moved (see [`write`](fn@write)), or more than [`MANY_MAX`] parts or [`CHUNK`]
/// bytes (`EINVAL`, nothing tried).
pub unsafe fn write_many(pid: u32, parts: &[(u64, &[u8])]) -> Result<usize, CmaError> {
    if pid == std::process::id() {
        return Err(CmaError(io::Error::from_raw_os_error(libc::EINVAL)));
    }
    let (local, far, n) = iovecs(parts.iter().map(|(remote, src)| (*remote, src.as_ptr().cast_mut(), src.len())))?;
    // SAFETY: the kernel only reads the `local` ranges (live slices of `parts`). The `far`
    // ranges are memory of another process (this one is refused above) that the caller
    // guarantees is lent for this write; the kernel checks that they are mapped.
    let r = unsafe { libc::process_vm_writev(pid as libc::pid_t, local.as_ptr(), n, far.as_ptr(), n, 0) };
    moved(r)
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
    fn many_ranges_in_one_call_and_a_bad_one_stops_it() {
        let pid = std::process::id();
        let src: Vec<u8> = (0..40_000).map(|i| (i % 253) as u8).collect();
        let (mut a, mut b, mut c) = (vec![0u8; 16_384], vec![0u8; 100], vec![0u8; 20_000]);
        let at = |off: usize| src.as_ptr() as u64 + off as u64;
        let r = read_many(pid, &mut [(at(0), &mut a), (at(30_000), &mut b), (at(20_000), &mut c)]);
        match r {
            Err(e) => {
                assert!(e.is_unsupported(), "{e}");
                return;
            }
            Ok(n) => assert_eq!(n, 16_384 + 100 + 20_000),
        }
        assert!(a == src[..16_384] && b == src[30_000..30_100] && c == src[20_000..]);
        // A bad second range: the first is filled, the count says where it stopped.
        let (mut a, mut b) = (vec![0u8; 5000], vec![0u8; 5000]);
        assert_eq!(read_many(pid, &mut [(at(0), &mut a), (8, &mut b)]).expect("partial"), 5000);
        assert!(a == src[..5000] && b.iter().all(|&x| x == 0));
        // A bad first range moves nothing.
        assert!(read_many(pid, &mut [(8, &mut a)]).is_err());
        // Too many parts, or too many bytes: refused before the kernel is asked.
        let mut small: Vec<Vec<u8>> = (0..=MANY_MAX).map(|_| vec![0u8; 1]).collect();
        let mut parts: Vec<(u64, &mut [u8])> = small.iter_mut().map(|d| (at(0), d.as_mut_slice())).collect();
        assert_eq!(read_many(pid, &mut parts).unwrap_err().0.raw_os_error(), Some(libc::EINVAL));
        let mut big = vec![0u8; CHUNK + 1];
        assert_eq!(read_many(pid, &mut [(at(0), &mut big)]).unwrap_err().0.raw_os_error(), Some(libc::EINVAL));
        // Writes into this process are refused before anything moves.
        let mut back = vec![0u8; 100];
        // SAFETY: refused before anything is written (own pid).
        let e = unsafe { write_many(pid, &[(back.as_mut_ptr() as u64, &src[..100])]) }.unwrap_err();
        assert_eq!(e.0.raw_os_error(), Some(libc::EINVAL));
        assert!(back.iter().all(|&b| b == 0));
    }

    /// `write_many` into another process: a forked child whose pages the parent fills, and
    /// which sends back what it holds through a pipe once told to.
    #[test]
    fn many_writes_into_another_process() {
        let dst = vec![0u8; 3 * 4096];
        let (mut go, mut back) = ([0; 2], [0; 2]);
        // SAFETY: each array has room for the two descriptors.
        assert!(unsafe { libc::pipe(go.as_mut_ptr()) } == 0 && unsafe { libc::pipe(back.as_mut_ptr()) } == 0);
        let (a, b) = (vec![7u8; 5000], vec![9u8; 3000]);
        let at = dst.as_ptr() as u64;
        // SAFETY: the child only makes system calls (no allocation, no lock) and leaves with
        // `_exit`.
        let child = unsafe { libc::fork() };
        assert!(child >= 0);
        if child == 0 {
            let mut byte = 0u8;
            // SAFETY: the descriptors are open; the buffers outlive the calls.
            unsafe {
                libc::read(go[0], (&mut byte as *mut u8).cast(), 1);
                libc::write(back[1], dst.as_ptr().cast(), dst.len());
                libc::_exit(0);
            }
        }
        // SAFETY: the child's `dst` (at the same address after the fork) is written by no one
        // else, and the child reads it only after the byte below.
        let r = unsafe { write_many(child as u32, &[(at, &a), (at + 8192, &b)]) };
        let mut got = vec![0u8; dst.len()];
        let mut filled = 0;
        // SAFETY: the descriptors are open; at most the rest of `got` is written.
        unsafe {
            libc::write(go[1], [1u8].as_ptr().cast(), 1);
            while filled < got.len() {
                let k = libc::read(back[0], got[filled..].as_mut_ptr().cast(), got.len() - filled);
                if k <= 0 {
                    break;
                }
                filled += k as usize;
            }
            libc::waitpid(child, std::ptr::null_mut(), 0);
            for fd in go.into_iter().chain(back) {
                libc::close(fd);
            }
        }
        match r {
            Err(e) => assert!(e.is_unsupported(), "{e}"),
            Ok(n) => {
                assert_eq!((n, filled), (8000, got.len()));
                assert!(got[..5000].iter().all(|&x| x == 7) && got[5000..8192].iter().all(|&x| x == 0));
                assert!(got[8192..11_192].iter().all(|&x| x == 9) && got[11_192..].iter().all(|&x| x == 0));
            }
        }
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
