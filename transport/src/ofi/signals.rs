//! Undoing what libfabric's dependencies do to a process's signals when they load.
//!
//! Debian's libfabric links the PSM libraries of Intel's True Scale and Omni-Path adapters;
//! `libinfinipath` (under `libpsm_infinipath`), like `libpsm2`, has a library constructor
//! that installs a handler for SIGSEGV, SIGBUS, SIGILL, SIGABRT, SIGINT and SIGTERM in every
//! program that links libfabric, unless `IPATH_NO_BACKTRACE` (`HFI_NO_BACKTRACE` for
//! `libpsm2`) is set: it prints a backtrace, writes a `<program>.80s-<pid>,<host>.btr` file
//! into the current directory and calls `exit(1)`.
//! For tmpi that breaks the failure contract: a rank killed by SIGSEGV or `abort()` would
//! read as "exited with code 1", `tmpirun`'s SIGTERM would run `atexit` handlers instead of
//! ending the rank, and every crash would leave a file in the user's directory (found by the
//! fault matrix over `TMPI_FABRIC=ofi`: `abort` gave status 1, not 134).
//!
//! [`restore_default_signals`] gives those signals back their default action when (and only
//! when) the handler in place lives in a library that is not the program's own: a handler the
//! program installed itself, or Rust's stack-overflow handler, is kept.

/// The signals the constructors of libfabric's dependencies take.
const TAKEN: [libc::c_int; 6] = [libc::SIGSEGV, libc::SIGBUS, libc::SIGILL, libc::SIGABRT, libc::SIGINT, libc::SIGTERM];

/// Libraries whose signal handlers are undone (file-name prefixes).
const FOREIGN: [&str; 3] = ["libpsm2.so", "libpsm_infinipath.so", "libinfinipath.so"];

/// Whether the shared object named `path` is one whose handlers are undone.
fn is_foreign(path: &str) -> bool {
    let file = path.rsplit('/').next().unwrap_or(path);
    FOREIGN.iter().any(|f| file.starts_with(f))
}

/// The file name of the shared object that holds code address `addr`, if the dynamic linker
/// knows it.
fn object_of(addr: usize) -> Option<String> {
    // SAFETY: Dl_info is plain data (pointers and integers); all-zero is a valid value.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: dladdr only reads the loader's tables for `addr` (any value is allowed) and
    // writes `info`, which lives for the call.
    let found = unsafe { libc::dladdr(addr as *const libc::c_void, &mut info) };
    if found == 0 || info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: on success dli_fname points to the loader's NUL-terminated copy of the object's
    // path, valid while the object stays loaded (libfabric's dependencies never unload).
    let name = unsafe { std::ffi::CStr::from_ptr(info.dli_fname) };
    Some(name.to_string_lossy().into_owned())
}

/// Resets to the default action each of [`TAKEN`] whose handler lives in one of the
/// [`FOREIGN`] libraries; returns the signals reset. Call it early (before other threads
/// start), as the process starts the runtime.
pub fn restore_default_signals() -> Vec<libc::c_int> {
    let mut reset = Vec::new();
    for sig in TAKEN {
        // SAFETY: sigaction is plain data; all-zero is a valid value.
        let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
        // SAFETY: with a null new action sigaction only reads the current one into `old`.
        if unsafe { libc::sigaction(sig, std::ptr::null(), &mut old) } != 0 {
            continue;
        }
        let handler = old.sa_sigaction;
        if handler == libc::SIG_DFL || handler == libc::SIG_IGN {
            continue;
        }
        if !object_of(handler).is_some_and(|o| is_foreign(&o)) {
            continue;
        }
        // SAFETY: as above; the new action is the default one with an empty mask.
        let mut dfl: libc::sigaction = unsafe { std::mem::zeroed() };
        dfl.sa_sigaction = libc::SIG_DFL;
        // SAFETY: `dfl` is a valid action for `sig`; the old one is not asked for.
        if unsafe { libc::sigaction(sig, &dfl, std::ptr::null_mut()) } == 0 {
            reset.push(sig);
        }
    }
    reset
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_named_libraries_are_foreign() {
        let rows = [
            ("/usr/lib/x86_64-linux-gnu/libpsm2.so.2", true),
            ("/lib/x86_64-linux-gnu/libpsm_infinipath.so.1", true),
            ("/lib/x86_64-linux-gnu/libinfinipath.so.4", true),
            ("libpsm2.so.2.2", true),
            ("/usr/lib/x86_64-linux-gnu/libfabric.so.1", false),
            ("/work/target/release/deps/tmpi_transport-abc", false),
            ("/usr/lib/libpsm3.so", false),
            ("", false),
        ];
        for (path, want) in rows {
            assert_eq!(is_foreign(path), want, "{path}");
        }
    }

    /// The test binary links libfabric (feature `ofi`), hence libpsm2 where Debian's build
    /// has it: after the reset no taken signal has a handler in a foreign library, and a
    /// handler of the program's own is kept.
    #[test]
    fn after_the_reset_no_taken_signal_is_handled_by_psm() {
        extern "C" fn mine(_: libc::c_int) {}
        let psm_loaded = std::fs::read_to_string("/proc/self/maps").is_ok_and(|m| m.contains("libinfinipath.so"));
        // SAFETY: sigaction is plain data; all-zero is a valid value.
        let (mut act, mut old): (libc::sigaction, libc::sigaction) = unsafe { (std::mem::zeroed(), std::mem::zeroed()) };
        act.sa_sigaction = mine as extern "C" fn(libc::c_int) as usize;
        // SAFETY: installs a no-op handler for SIGBUS, which this test process never raises,
        // saving the old action in `old` (put back below).
        assert_eq!(unsafe { libc::sigaction(libc::SIGBUS, &act, &mut old) }, 0);
        let reset = restore_default_signals();
        assert!(!reset.contains(&libc::SIGBUS), "our own handler was reset: {reset:?}");
        if psm_loaded && std::env::var_os("IPATH_NO_BACKTRACE").is_none() {
            assert!(
                reset.contains(&libc::SIGSEGV) && reset.contains(&libc::SIGTERM),
                "libinfinipath is loaded but nothing was reset: {reset:?}"
            );
        }
        for sig in TAKEN {
            // SAFETY: sigaction is plain data; all-zero is a valid value.
            let mut now: libc::sigaction = unsafe { std::mem::zeroed() };
            // SAFETY: with a null new action sigaction only reads the current one.
            assert_eq!(unsafe { libc::sigaction(sig, std::ptr::null(), &mut now) }, 0);
            if ![libc::SIG_DFL, libc::SIG_IGN].contains(&now.sa_sigaction) {
                let owner = object_of(now.sa_sigaction);
                assert!(!owner.as_deref().is_some_and(is_foreign), "signal {sig} still handled in {owner:?}");
            }
        }
        // SAFETY: puts back the action saved above.
        assert_eq!(unsafe { libc::sigaction(libc::SIGBUS, &old, std::ptr::null_mut()) }, 0);
    }
}
