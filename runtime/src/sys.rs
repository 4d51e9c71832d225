//! The few system calls the runtime makes itself (liveness of peers, CPU count).

/// Whether process `pid` is still running. A process whose threads have all exited counts as
/// gone even while it is a zombie (`tmpirun` reaps its ranks only at the very end), and so
/// does a process that no longer exists. `0` (a rank that has not attached yet) counts as
/// running.
///
/// The check is a pidfd (Linux 5.3): it turns readable when the whole thread group has ended,
/// the moment the parent hears of it. Not the leader thread's zombie state in `/proc`: that
/// shows while other threads (the MR cache's monitor) still run and hold the process's
/// descriptors, and `tmpirun`, which judges a failure by the rank's bootstrap connection,
/// must be able to see it closed before a peer reacts to the death.
pub(crate) fn pid_alive(pid: u32) -> bool {
    if pid == 0 || pid > i32::MAX as u32 {
        return true;
    }
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    if fd < 0 {
        return match std::io::Error::last_os_error().raw_os_error() {
            Some(libc::ESRCH) => false,
            // No pidfd here: whether the pid exists at all.
            _ => {
                // SAFETY: kill with signal 0 sends nothing; it only checks that the process exists.
                let r = unsafe { libc::kill(pid as libc::pid_t, 0) };
                r == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
            }
        };
    }
    let fd = fd as libc::c_int;
    let mut p = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
    // SAFETY: `p` is one valid pollfd for the descriptor just opened; timeout 0.
    let r = unsafe { libc::poll(&mut p, 1, 0) };
    // SAFETY: `fd` was opened above and is closed once.
    unsafe { libc::close(fd) };
    !(r > 0 && p.revents & libc::POLLIN != 0)
}

/// Bytes of physical memory (`usize::MAX` if unknown).
pub(crate) fn physical_memory() -> usize {
    // SAFETY: sysconf only reads system values.
    let (pages, size) = unsafe { (libc::sysconf(libc::_SC_PHYS_PAGES), libc::sysconf(libc::_SC_PAGESIZE)) };
    if pages > 0 && size > 0 {
        (pages as usize).saturating_mul(size as usize)
    } else {
        usize::MAX
    }
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

/// A reading of a cheap clock that is only ever compared with itself: the time-stamp counter
/// where the kernel keeps time by it (`clocksource0` is `tsc`: constant rate, in step across
/// CPUs), in ticks; else `None`. One `rdtsc` costs about a third of `Instant::now` on the KVM
/// host (about 10 against 30 ns).
#[inline]
pub(crate) fn tsc() -> Option<u64> {
    #[cfg(target_arch = "x86_64")]
    {
        static TSC: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        let ok = *TSC.get_or_init(|| {
            std::fs::read_to_string("/sys/devices/system/clocksource/clocksource0/current_clocksource").is_ok_and(|s| s.trim() == "tsc")
        });
        if ok {
            // SAFETY: `rdtsc` exists on every x86-64 CPU and only reads the counter.
            return Some(unsafe { std::arch::x86_64::_rdtsc() });
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_is_alive() {
        assert!(pid_alive(std::process::id()));
        assert!(pid_alive(0));
    }

    #[test]
    fn a_zombie_child_is_gone() {
        let mut child = std::process::Command::new("true").spawn().expect("spawn true");
        let pid = child.id();
        // Not reaped yet: a zombie once it has exited.
        let start = std::time::Instant::now();
        while pid_alive(pid) {
            assert!(start.elapsed() < std::time::Duration::from_secs(20), "child {pid} still alive");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        child.wait().expect("reap");
        assert!(!pid_alive(pid));
    }
}
