//! The few system calls the runtime makes itself (liveness of peers, CPU count).

/// Whether process `pid` is still running. A zombie (exited, not yet reaped by its parent:
/// `tmpirun` reaps its ranks only at the very end) counts as gone, as does a process that no
/// longer exists. `0` (a rank that has not attached yet) counts as running.
pub(crate) fn pid_alive(pid: u32) -> bool {
    if pid == 0 || pid > i32::MAX as u32 {
        return true;
    }
    // SAFETY: kill with signal 0 sends nothing; it only checks that the process exists.
    let r = unsafe { libc::kill(pid as libc::pid_t, 0) };
    if r != 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH) {
        return false;
    }
    !is_zombie(pid)
}

/// Whether `/proc/<pid>/stat` says the process is a zombie (`Z`) or dead (`X`). Unreadable
/// (no procfs, or the process vanished meanwhile): judged by `kill` alone.
fn is_zombie(pid: u32) -> bool {
    let Ok(stat) = std::fs::read(format!("/proc/{pid}/stat")) else {
        return false;
    };
    // The state follows the command name, which is in parentheses and may contain any byte.
    let Some(close) = stat.iter().rposition(|&b| b == b')') else {
        return false;
    };
    matches!(stat.get(close + 2), Some(b'Z' | b'X' | b'x'))
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
