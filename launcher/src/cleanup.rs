//! What must be undone however `tmpirun` ends: the ranks' process groups, the job's
//! shared-memory files and the private directory of the bootstrap socket.
//!
//! The state lives in process-wide statics so that the panic hook ([`install_panic_hook`])
//! can reach it from any thread; [`Guard`] runs the same [`cleanup`] on normal returns, error
//! returns and unwinding. Cleanup is idempotent.
//!
//! A `tmpirun` that is SIGKILLed runs no cleanup: its ranks die with it (`PR_SET_PDEATHSIG`)
//! but its files stay. So before it creates any file of its own, a job writes a *launcher
//! file*, `/dev/shm/tmpi-<jobid>.launcher`, holding its pid and that process's start time
//! (field 22 of `/proc/<pid>/stat`, so that a recycled pid is not mistaken for it), and
//! removes it last. Every `tmpirun` starts with [`sweep_stale`]: for each launcher file whose
//! launcher is gone (no such pid, another start time, or a zombie), it removes that job's
//! `/dev/shm/tmpi-<jobid>-*` files, its `tmpirun-<jobid>` socket directory (in `$TMPDIR` and
//! `/tmp`) and then the launcher file. Nothing else is touched: no file without a launcher
//! file, none of a live launcher, no name outside these patterns.

use std::path::PathBuf;
use std::sync::{Mutex, OnceLock};

use crate::sys;

/// The job id, set once the job exists (files `/dev/shm/tmpi-<jobid>*` belong to it).
static JOBID: OnceLock<String> = OnceLock::new();
/// The private directory holding the bootstrap socket.
static SOCKDIR: OnceLock<PathBuf> = OnceLock::new();
/// Pids (= process group ids) of spawned ranks not reaped yet.
static CHILDREN: Mutex<Vec<i32>> = Mutex::new(Vec::new());

/// Directory of the shared-memory files.
const SHM_DIR: &str = "/dev/shm";

/// The launcher file of a job (see the module docs).
fn launcher_file(jobid: &str) -> PathBuf {
    PathBuf::from(format!("{SHM_DIR}/tmpi-{jobid}.launcher"))
}

/// Records the job id (its files `/dev/shm/tmpi-<jobid>*` are removed at the end) and
/// writes its launcher file: call it before creating any other file of the job.
///
/// # Errors
/// The launcher file cannot be written (`/dev/shm` missing or full): the job could not
/// create its segment either.
pub fn register_job(jobid: &str) -> std::io::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt;
    let _ = JOBID.set(jobid.to_string());
    let me = std::process::id() as i32;
    let start = start_time(me).unwrap_or(0);
    let path = launcher_file(jobid);
    let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&path)?;
    f.write_all(format!("{me} {start}\n").as_bytes())
}

/// Records the socket directory to remove at the end.
pub fn register_sockdir(sockdir: PathBuf) {
    let _ = SOCKDIR.set(sockdir);
}

/// Start time of process `pid` (clock ticks since boot, field 22 of its `stat`), and
/// whether it is a zombie; `None` when it does not exist (or `/proc` says nothing).
fn proc_stat(pid: i32) -> Option<(u64, bool)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_ascii_whitespace().collect();
    // rest starts at field 3 (state); field 22 is at index 19.
    let state = *fields.first()?;
    let start = fields.get(19)?.parse().ok()?;
    Some((start, state == "Z" || state == "X"))
}

fn start_time(pid: i32) -> Option<u64> {
    proc_stat(pid).map(|(s, _)| s)
}

/// Whether the launcher recorded as `pid` started at `start` is gone for sure. When in
/// doubt (no `/proc`, a process of another user) it is taken to be alive.
fn launcher_gone(pid: i32, start: u64) -> bool {
    if pid <= 1 {
        return false;
    }
    // SAFETY: kill with signal 0 only checks existence and permission.
    let rc = unsafe { libc::kill(pid, 0) };
    if rc != 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH) {
        return true;
    }
    match proc_stat(pid) {
        Some((s, zombie)) => zombie || (start != 0 && s != start),
        None => !std::path::Path::new(&format!("/proc/{pid}")).exists() && std::path::Path::new("/proc/self").exists(),
    }
}

/// Whether `s` is a job id: 16 lowercase hex digits.
fn is_jobid(s: &str) -> bool {
    s.len() == 16 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// Removes what jobs whose `tmpirun` died without cleaning up left behind (see the module
/// docs); returns the job ids swept. Errors (a file of another user, a race with another
/// sweeper) are skipped.
pub fn sweep_stale() -> Vec<String> {
    let Ok(dir) = std::fs::read_dir(SHM_DIR) else {
        return Vec::new();
    };
    let names: Vec<String> = dir.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect();
    let mut swept = Vec::new();
    for n in &names {
        let Some(jobid) = n.strip_prefix("tmpi-").and_then(|r| r.strip_suffix(".launcher")).filter(|j| is_jobid(j)) else {
            continue;
        };
        let Ok(text) = std::fs::read_to_string(format!("{SHM_DIR}/{n}")) else {
            continue;
        };
        let mut it = text.split_ascii_whitespace();
        let (Some(Ok(pid)), Some(Ok(start))) = (it.next().map(str::parse::<i32>), it.next().map(str::parse::<u64>)) else {
            continue;
        };
        if !launcher_gone(pid, start) {
            continue;
        }
        let seg_prefix = format!("tmpi-{jobid}-");
        for m in &names {
            if m.starts_with(&seg_prefix) {
                let _ = std::fs::remove_file(format!("{SHM_DIR}/{m}"));
            }
        }
        for base in [std::env::temp_dir(), PathBuf::from("/tmp")] {
            remove_sockdir_at(&base.join(format!("tmpirun-{jobid}")));
        }
        let _ = std::fs::remove_file(format!("{SHM_DIR}/{n}"));
        swept.push(jobid.to_string());
    }
    swept
}

/// Removes a socket directory that `tmpirun` made: its socket, then the directory (which
/// must then be empty: nothing but what tmpirun put there is removed).
fn remove_sockdir_at(d: &std::path::Path) {
    let _ = std::fs::remove_file(d.join("kv.sock"));
    let _ = std::fs::remove_dir(d);
}

/// Records a spawned rank (its pid is also its process group id).
pub fn register_child(pid: i32) {
    CHILDREN.lock().unwrap_or_else(|e| e.into_inner()).push(pid);
}

/// Reaps a rank that has ended and forgets it.
pub fn reap_child(pid: i32) {
    sys::reap(pid);
    CHILDREN.lock().unwrap_or_else(|e| e.into_inner()).retain(|&p| p != pid);
}

/// Removes `/dev/shm/tmpi-<jobid>*` (the segment rank 0 created, and any later ones), the
/// launcher file last.
pub fn remove_shm_files(jobid: &str) {
    let prefix = format!("tmpi-{jobid}");
    let own = launcher_file(jobid);
    if let Ok(dir) = std::fs::read_dir(SHM_DIR) {
        for e in dir.flatten() {
            if e.file_name().to_string_lossy().starts_with(&prefix) && e.path() != own {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
    let _ = std::fs::remove_file(own);
}

/// Removes the socket directory now: once every rank has connected nobody else may, and a
/// `tmpirun` that is SIGKILLed later then leaves nothing in the temporary directory.
pub fn remove_sockdir() {
    if let Some(d) = SOCKDIR.get() {
        remove_sockdir_at(d);
    }
}

/// Kills (SIGKILL) and reaps every rank not yet reaped, removes the job's shm files and the
/// socket directory.
pub fn cleanup() {
    // try_lock: the panic hook may run on a thread that holds the lock.
    let children = match CHILDREN.try_lock() {
        Ok(mut g) => std::mem::take(&mut *g),
        Err(std::sync::TryLockError::Poisoned(e)) => std::mem::take(&mut *e.into_inner()),
        Err(std::sync::TryLockError::WouldBlock) => Vec::new(),
    };
    for &pid in &children {
        sys::kill_group(pid, libc::SIGKILL);
    }
    for &pid in &children {
        sys::reap(pid);
    }
    // The launcher file goes last (in remove_shm_files): until then a later sweep can still
    // find whatever a crash in the middle of this left.
    remove_sockdir();
    if let Some(j) = JOBID.get() {
        remove_shm_files(j);
    }
}

/// Runs [`cleanup`] when dropped.
pub struct Guard;

impl Drop for Guard {
    fn drop(&mut self) {
        cleanup();
    }
}

/// On a panic in any thread: print it as usual, clean up, and exit with status 1.
pub fn install_panic_hook() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        default(info);
        crate::output::write_own("tmpirun: internal error; killing the job\n");
        cleanup();
        std::process::exit(1);
    }));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_process_is_alive_and_recycled_pids_are_not() {
        let me = std::process::id() as i32;
        let start = start_time(me).expect("own start time");
        assert!(!launcher_gone(me, start));
        assert!(launcher_gone(me, start + 1), "a pid with another start time is another process");
        assert!(!launcher_gone(1, 0), "pid 1 is never swept");
        assert!(is_jobid("0123456789abcdef") && !is_jobid("0123456789ABCDEF") && !is_jobid("threads-0123"));
    }

    #[test]
    fn sweep_removes_only_dead_launchers_files() {
        // A dead launcher: a child that has exited and been reaped.
        let mut child = std::process::Command::new("true").spawn().expect("start true");
        let dead = child.id() as i32;
        let dead_start = start_time(dead).unwrap_or(1);
        child.wait().expect("wait");
        let me = std::process::id() as i32;
        let rnd = || tmpi_transport::bootstrap::new_jobid().expect("random job id");
        let (gone_job, live_job) = (rnd(), rnd());
        let w = |name: &str, text: &str| std::fs::write(format!("{SHM_DIR}/{name}"), text).expect("write");
        w(&format!("tmpi-{gone_job}.launcher"), &format!("{dead} {dead_start}\n"));
        w(&format!("tmpi-{gone_job}-0123456789abcdef"), "segment");
        w(&format!("tmpi-{live_job}.launcher"), &format!("{me} {}\n", start_time(me).unwrap_or(0)));
        w(&format!("tmpi-{live_job}-0123456789abcdef"), "segment");
        let sockdir = std::env::temp_dir().join(format!("tmpirun-{gone_job}"));
        std::fs::create_dir_all(&sockdir).expect("mkdir");
        std::fs::write(sockdir.join("kv.sock"), "").expect("sock");
        let swept = sweep_stale();
        let exists = |name: &str| std::path::Path::new(&format!("{SHM_DIR}/{name}")).exists();
        let live_left = exists(&format!("tmpi-{live_job}.launcher")) && exists(&format!("tmpi-{live_job}-0123456789abcdef"));
        let gone_left = exists(&format!("tmpi-{gone_job}.launcher")) || exists(&format!("tmpi-{gone_job}-0123456789abcdef"));
        let dir_left = sockdir.exists();
        remove_shm_files(&live_job);
        remove_shm_files(&gone_job);
        let _ = std::fs::remove_dir_all(&sockdir);
        assert!(swept.contains(&gone_job), "{swept:?}");
        assert!(!swept.contains(&live_job), "{swept:?}");
        assert!(live_left, "files of a live launcher were removed");
        assert!(!gone_left && !dir_left, "files of a dead launcher were left");
    }
}
