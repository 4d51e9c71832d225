//! Thin safe wrappers over the few system calls the launcher needs (the only `unsafe` here).

use std::io;
use std::mem::MaybeUninit;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};

use crate::error::{Error, Result};

/// How a process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitKind {
    /// `exit(code)`.
    Code(i32),
    /// Killed by a signal.
    Signal(i32),
}

/// The name of a signal, e.g. `SIGSEGV`, or `signal N` for one without a common name.
pub fn signal_name(sig: i32) -> String {
    let name = match sig {
        libc::SIGHUP => "SIGHUP",
        libc::SIGINT => "SIGINT",
        libc::SIGQUIT => "SIGQUIT",
        libc::SIGILL => "SIGILL",
        libc::SIGTRAP => "SIGTRAP",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        libc::SIGFPE => "SIGFPE",
        libc::SIGKILL => "SIGKILL",
        libc::SIGUSR1 => "SIGUSR1",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGUSR2 => "SIGUSR2",
        libc::SIGPIPE => "SIGPIPE",
        libc::SIGALRM => "SIGALRM",
        libc::SIGTERM => "SIGTERM",
        libc::SIGCHLD => "SIGCHLD",
        libc::SIGCONT => "SIGCONT",
        libc::SIGSTOP => "SIGSTOP",
        libc::SIGTSTP => "SIGTSTP",
        libc::SIGXCPU => "SIGXCPU",
        libc::SIGXFSZ => "SIGXFSZ",
        libc::SIGSYS => "SIGSYS",
        _ => return format!("signal {sig}"),
    };
    name.to_string()
}

/// Signals `tmpirun` handles: child exits, and the signals that end the job.
pub const HANDLED_SIGNALS: [i32; 4] = [libc::SIGCHLD, libc::SIGINT, libc::SIGTERM, libc::SIGHUP];

/// Write end of the self-pipe, for the signal handler (-1 before it exists).
static WAKE_FD: AtomicI32 = AtomicI32::new(-1);
/// One flag per signal number below 65: set by the handler, cleared by [`SignalPipe::read`].
static PENDING: [AtomicBool; 65] = [const { AtomicBool::new(false) }; 65];

extern "C" fn on_signal(sig: libc::c_int) {
    // Only async-signal-safe work here: an atomic store and a write(2). errno is saved and
    // restored so that the interrupted code does not see ours.
    if let Some(flag) = PENDING.get(sig as usize) {
        flag.store(true, Ordering::SeqCst);
    }
    let fd = WAKE_FD.load(Ordering::SeqCst);
    if fd >= 0 {
        // SAFETY: __errno_location returns this thread's errno slot; reading and writing
        // it is async-signal-safe.
        let saved = unsafe { *libc::__errno_location() };
        let b = 0u8;
        // SAFETY: write(2) of one byte from a live local to a descriptor we own; a full
        // pipe (EAGAIN) is fine, a wakeup is already pending then.
        unsafe { libc::write(fd, std::ptr::addr_of!(b).cast(), 1) };
        // SAFETY: as above.
        unsafe { *libc::__errno_location() = saved };
    }
}

/// The classic self-pipe: handlers for [`HANDLED_SIGNALS`] mark the signal and make a pipe
/// readable, so the event loop's `poll` wakes up.
///
/// Handlers rather than a signalfd: a signalfd needs the signals blocked, and a blocked
/// mask is inherited by the ranks through `posix_spawn`/exec; handlers are reset to the
/// default by exec, so the ranks start with a clean signal state.
pub struct SignalPipe {
    read: OwnedFd,
    _write: OwnedFd,
}

impl SignalPipe {
    /// Creates the pipe and installs the handlers (once per process).
    ///
    /// # Errors
    /// `pipe2` or `sigaction` fails.
    pub fn new() -> Result<Self> {
        let mut fds = [0; 2];
        // SAFETY: `fds` is a writable array of two ints.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) } != 0 {
            return Err(Error::last_os("pipe2"));
        }
        // SAFETY: both descriptors are new and owned by nothing else.
        let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        WAKE_FD.store(write.as_raw_fd(), Ordering::SeqCst);
        for sig in HANDLED_SIGNALS {
            // SAFETY: an all-zero sigaction is a valid starting value (empty mask, no flags).
            let mut sa: libc::sigaction = unsafe { std::mem::zeroed() };
            sa.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
            sa.sa_flags = libc::SA_RESTART | if sig == libc::SIGCHLD { libc::SA_NOCLDSTOP } else { 0 };
            // SAFETY: `sa` is initialized; the handler only does async-signal-safe work.
            if unsafe { libc::sigaction(sig, &sa, std::ptr::null_mut()) } != 0 {
                return Err(Error::last_os("sigaction"));
            }
        }
        Ok(SignalPipe { read, _write: write })
    }

    /// The signals that arrived since the last call, in signal-number order (several
    /// arrivals of one signal count once).
    pub fn read(&self) -> Vec<i32> {
        let mut buf = [0u8; 256];
        loop {
            // SAFETY: reads into a live buffer of its own length.
            let n = unsafe { libc::read(self.read.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
            if n < buf.len() as isize {
                break;
            }
        }
        HANDLED_SIGNALS.iter().copied().filter(|&s| PENDING[s as usize].swap(false, Ordering::SeqCst)).collect()
    }
}

impl AsRawFd for SignalPipe {
    fn as_raw_fd(&self) -> RawFd {
        self.read.as_raw_fd()
    }
}

/// Whether child `pid` has ended, without reaping it (it stays a zombie, so its pid and
/// process group id cannot be reused until [`reap`]).
pub fn peek_exit(pid: i32) -> Option<ExitKind> {
    let mut info = MaybeUninit::<libc::siginfo_t>::zeroed();
    // SAFETY: `info` is writable storage for one siginfo_t; WNOHANG makes it non-blocking.
    let rc = unsafe { libc::waitid(libc::P_PID, pid as libc::id_t, info.as_mut_ptr(), libc::WEXITED | libc::WNOHANG | libc::WNOWAIT) };
    if rc != 0 {
        return None;
    }
    // SAFETY: zero-initialized and possibly filled by waitid; every bit pattern is valid.
    let info = unsafe { info.assume_init() };
    // SAFETY: for WEXITED results si_pid/si_status are the valid union members; when no
    // child changed state they read the zeroes we stored.
    let (si_pid, status) = unsafe { (info.si_pid(), info.si_status()) };
    if si_pid == 0 {
        return None;
    }
    match info.si_code {
        libc::CLD_EXITED => Some(ExitKind::Code(status)),
        libc::CLD_KILLED | libc::CLD_DUMPED => Some(ExitKind::Signal(status)),
        _ => None,
    }
}

/// Reaps child `pid` (blocking until it has ended).
pub fn reap(pid: i32) {
    let mut status = 0;
    loop {
        // SAFETY: `status` is a valid out-pointer.
        let rc = unsafe { libc::waitpid(pid, &mut status, 0) };
        if rc >= 0 || io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
            return;
        }
    }
}

/// Runs in a freshly forked rank, before `exec`: asks the kernel to SIGKILL the rank when the
/// thread that forked it exits (so the ranks die with `tmpirun` even when it is SIGKILLed),
/// and fails if `parent` is already gone (it died between `fork` and the `prctl`).
///
/// Only async-signal-safe work: two system calls, no allocation, no lock. The death signal
/// follows the *thread* that forked, so ranks must be spawned from `tmpirun`'s main thread,
/// which lives until the process exits. It survives `exec` (not of set-uid programs).
///
/// # Errors
/// `prctl` fails, or the parent has already exited (`ESRCH`).
pub fn die_with_parent(parent: libc::pid_t) -> io::Result<()> {
    // SAFETY: prctl(PR_SET_PDEATHSIG) takes integer arguments only.
    let rc = unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong, 0, 0, 0) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: getppid takes no arguments and cannot fail.
    if unsafe { libc::getppid() } != parent {
        return Err(io::Error::from_raw_os_error(libc::ESRCH));
    }
    Ok(())
}

/// Sends `sig` to the process group `pgid` (a rank's group, created when it was spawned).
pub fn kill_group(pgid: i32, sig: i32) {
    if pgid > 1 {
        // SAFETY: plain syscall; a negative pid addresses the process group. ESRCH (the group
        // is empty) is fine to ignore.
        unsafe { libc::kill(-pgid, sig) };
    }
}

/// Sets `O_NONBLOCK` on `fd`.
///
/// # Errors
/// `fcntl` fails.
pub fn set_nonblocking(fd: RawFd) -> Result<()> {
    // SAFETY: fcntl on a descriptor the caller owns; no pointers.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    // SAFETY: as above.
    if flags < 0 || unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
        return Err(Error::last_os("fcntl O_NONBLOCK"));
    }
    Ok(())
}

/// Whether `fd` is a terminal.
pub fn isatty(fd: RawFd) -> bool {
    // SAFETY: isatty takes a descriptor number and no pointers.
    unsafe { libc::isatty(fd) == 1 }
}

/// Raises the soft limit of open files to the hard limit (each rank needs two pipes and a
/// bootstrap connection); returns the limit in force then (`None` if it cannot be read).
pub fn raise_nofile_limit() -> Option<u64> {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: `lim` is a valid out-pointer.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return None;
    }
    if lim.rlim_cur < lim.rlim_max {
        let raised = libc::rlimit { rlim_cur: lim.rlim_max, rlim_max: lim.rlim_max };
        // SAFETY: `raised` is a valid, initialized rlimit. Failure only keeps the old limit.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            return Some(raised.rlim_cur);
        }
    }
    Some(lim.rlim_cur)
}

/// Descriptors tmpirun holds per local rank: its stdout and stderr pipes and its bootstrap
/// connection.
pub const FDS_PER_RANK: u64 = 3;
/// Descriptors tmpirun needs besides its ranks' (its standard streams, the bootstrap
/// listeners, signals, the job's files, a launch agent's pipes); about 15 are open in a
/// running job, the rest is margin.
pub const FDS_RESERVE: u64 = 32;

/// Descriptors a job of `nlocal` ranks on this host and `nremote` on others needs in
/// tmpirun: [`FDS_PER_RANK`] per local rank, one bootstrap connection per remote rank, and
/// [`FDS_RESERVE`].
pub fn fds_needed(nlocal: usize, nremote: usize) -> u64 {
    (nlocal as u64).saturating_mul(FDS_PER_RANK).saturating_add(nremote as u64).saturating_add(FDS_RESERVE)
}

/// The CPUs the calling thread may run on, ascending.
///
/// # Errors
/// `sched_getaffinity` fails.
pub fn allowed_cpus() -> Result<Vec<usize>> {
    let set = get_affinity()?;
    let mut cpus = Vec::new();
    for c in 0..libc::CPU_SETSIZE as usize {
        // SAFETY: `set` is an initialized cpu_set_t and `c` is below its capacity.
        if unsafe { libc::CPU_ISSET(c, &set) } {
            cpus.push(c);
        }
    }
    Ok(cpus)
}

/// The calling thread's affinity mask.
///
/// # Errors
/// `sched_getaffinity` fails.
pub fn get_affinity() -> Result<libc::cpu_set_t> {
    let mut set = MaybeUninit::<libc::cpu_set_t>::zeroed();
    let size = std::mem::size_of::<libc::cpu_set_t>();
    // SAFETY: `set` is writable storage of `size` bytes; pid 0 = the calling thread.
    if unsafe { libc::sched_getaffinity(0, size, set.as_mut_ptr()) } != 0 {
        return Err(Error::last_os("sched_getaffinity"));
    }
    // SAFETY: zero-initialized, then filled by the kernel.
    Ok(unsafe { set.assume_init() })
}

/// Sets the calling thread's affinity mask.
///
/// # Errors
/// `sched_setaffinity` fails (e.g. a CPU outside the allowed set).
pub fn set_affinity(set: &libc::cpu_set_t) -> Result<()> {
    let size = std::mem::size_of::<libc::cpu_set_t>();
    // SAFETY: `set` points to a valid cpu_set_t of `size` bytes; pid 0 = the calling thread.
    if unsafe { libc::sched_setaffinity(0, size, set) } != 0 {
        return Err(Error::last_os("sched_setaffinity"));
    }
    Ok(())
}

/// A mask with exactly `cpus` set (out-of-range numbers are skipped).
pub fn cpu_set(cpus: &[usize]) -> libc::cpu_set_t {
    // SAFETY: cpu_set_t is a plain bit array; all zeroes is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for &c in cpus {
        if c < libc::CPU_SETSIZE as usize {
            // SAFETY: `c` is within the set's capacity (checked above).
            unsafe { libc::CPU_SET(c, &mut set) };
        }
    }
    set
}

/// Waits for readiness of `fds` up to `timeout_ms` (-1: forever). EINTR counts as a wakeup.
///
/// # Errors
/// `poll` fails for another reason.
pub fn poll(fds: &mut [libc::pollfd], timeout_ms: i32) -> Result<()> {
    // SAFETY: `fds` is a valid mutable slice of pollfd of the given length.
    let rc = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout_ms) };
    if rc < 0 && io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
        return Err(Error::last_os("poll"));
    }
    Ok(())
}

/// Checks `path` for execute permission for this user.
pub fn executable(path: &std::path::Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let Ok(c) = std::ffi::CString::new(path.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: `c` is a valid NUL-terminated string for the call's duration.
    unsafe { libc::access(c.as_ptr(), libc::X_OK) == 0 }
}
