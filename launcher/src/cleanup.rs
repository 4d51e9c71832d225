//! What must be undone however `tmpirun` ends: the ranks' process groups, the job's
//! shared-memory files and the private directory of the bootstrap socket.
//!
//! The state lives in process-wide statics so that the panic hook ([`install_panic_hook`])
//! can reach it from any thread; [`Guard`] runs the same [`cleanup`] on normal returns, error
//! returns and unwinding. Cleanup is idempotent.

use std::path::PathBuf;
use std::sync::{Mutex, OnceLock};

use crate::sys;

/// The job id, set once the job exists (files `/dev/shm/tmpi-<jobid>*` belong to it).
static JOBID: OnceLock<String> = OnceLock::new();
/// The private directory holding the bootstrap socket.
static SOCKDIR: OnceLock<PathBuf> = OnceLock::new();
/// Pids (= process group ids) of spawned ranks not reaped yet.
static CHILDREN: Mutex<Vec<i32>> = Mutex::new(Vec::new());

/// Records the job id and socket directory to remove at the end.
pub fn register_job(jobid: &str, sockdir: PathBuf) {
    let _ = JOBID.set(jobid.to_string());
    let _ = SOCKDIR.set(sockdir);
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

/// Removes `/dev/shm/tmpi-<jobid>*` (the segment rank 0 created, and any later ones).
pub fn remove_shm_files(jobid: &str) {
    let prefix = format!("tmpi-{jobid}");
    let Ok(dir) = std::fs::read_dir("/dev/shm") else {
        return;
    };
    for e in dir.flatten() {
        if e.file_name().to_string_lossy().starts_with(&prefix) {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

/// Removes the socket directory now: once every rank has connected nobody else may, and a
/// `tmpirun` that is SIGKILLed later then leaves nothing in the temporary directory.
pub fn remove_sockdir() {
    if let Some(d) = SOCKDIR.get() {
        let _ = std::fs::remove_dir_all(d);
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
    if let Some(j) = JOBID.get() {
        remove_shm_files(j);
    }
    remove_sockdir();
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
        eprintln!("tmpirun: internal error; killing the job");
        cleanup();
        std::process::exit(1);
    }));
}
