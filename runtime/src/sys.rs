//! The few system calls the runtime makes itself (liveness of peers, CPU count).

/// Whether process `pid` still exists (a zombie counts as existing until reaped).
pub(crate) fn pid_alive(pid: u32) -> bool {
    if pid == 0 || pid > i32::MAX as u32 {
        return true;
    }
    // SAFETY: kill with signal 0 sends nothing; it only checks that the process exists.
    let r = unsafe { libc::kill(pid as libc::pid_t, 0) };
    r == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}

/// CPUs of the machine, for deciding whether ranks outnumber cores. Not this process's
/// affinity: `tmpirun` binds each rank to one core, which must not read as oversubscription.
pub(crate) fn usable_cpus() -> usize {
    // SAFETY: sysconf only reads a system value.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    if n > 0 {
        n as usize
    } else {
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
    }
}
