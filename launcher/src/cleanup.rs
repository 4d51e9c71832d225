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
//!
//! `/dev/shm` and `/tmp` are shared by every user, so the sweep touches only what this user
//! owns and never goes through a link ([`Dir`]): a launcher file counts only when it is a
//! regular file of this user (opened with `O_NOFOLLOW`, checked with `fstat`), a segment only
//! when it is one too, and a socket directory only when it is a real directory of this user,
//! opened without following a link; its socket is then removed relative to that directory,
//! never through a path another user could redirect. Files planted by another user, or links
//! to another job's files, are left alone.

use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use crate::sys;

/// The job ids: the job's, then those of the jobs its spawns made (files
/// `/dev/shm/tmpi-<jobid>*` belong to them).
static JOBS: Mutex<Vec<String>> = Mutex::new(Vec::new());
/// The private directories holding bootstrap sockets, not removed yet.
static SOCKDIRS: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());
/// Pids (= process group ids) of spawned ranks not reaped yet.
static CHILDREN: Mutex<Vec<i32>> = Mutex::new(Vec::new());

/// Directory of the shared-memory files.
const SHM_DIR: &str = "/dev/shm";

/// The launcher file of a job (see the module docs).
fn launcher_file(jobid: &str) -> PathBuf {
    PathBuf::from(format!("{SHM_DIR}/tmpi-{jobid}.launcher"))
}

/// Records a job id (its files `/dev/shm/tmpi-<jobid>*` are removed at the end) and
/// writes its launcher file: call it before creating any other file of the job. The jobs
/// that spawns make (children, bridges) are registered the same way.
///
/// # Errors
/// The launcher file cannot be written (`/dev/shm` missing or full): the job could not
/// create its segment either.
pub fn register_job(jobid: &str) -> std::io::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt;
    lock(&JOBS).push(jobid.to_string());
    let me = std::process::id() as i32;
    let start = start_time(me).unwrap_or(0);
    let path = launcher_file(jobid);
    let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&path)?;
    f.write_all(format!("{me} {start}\n").as_bytes())
}

/// Records a socket directory to remove at the end.
pub fn register_sockdir(sockdir: PathBuf) {
    lock(&SOCKDIRS).push(sockdir);
}

/// Locks a list of this module, poisoned or not.
fn lock<T>(m: &Mutex<Vec<T>>) -> std::sync::MutexGuard<'_, Vec<T>> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Takes a list without waiting: the panic hook may run on a thread that holds its lock
/// (then the list is left alone).
fn take_now<T>(m: &Mutex<Vec<T>>) -> Vec<T> {
    match m.try_lock() {
        Ok(mut g) => std::mem::take(&mut *g),
        Err(std::sync::TryLockError::Poisoned(e)) => std::mem::take(&mut *e.into_inner()),
        Err(std::sync::TryLockError::WouldBlock) => Vec::new(),
    }
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
/// docs); returns the job ids swept. Only this user's files are touched, never through a link.
/// Errors (a race with another sweeper) are skipped.
pub fn sweep_stale() -> Vec<String> {
    let (Some(shm), Ok(dir)) = (Dir::open(Path::new(SHM_DIR)), std::fs::read_dir(SHM_DIR)) else {
        return Vec::new();
    };
    let names: Vec<String> = dir.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect();
    let mut swept = Vec::new();
    for n in &names {
        let Some(jobid) = n.strip_prefix("tmpi-").and_then(|r| r.strip_suffix(".launcher")).filter(|j| is_jobid(j)) else {
            continue;
        };
        // Another user's launcher file, or a link, is not this user's job.
        let Some(text) = shm.read_own_file(n, 256) else {
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
        for m in names.iter().filter(|m| m.starts_with(&seg_prefix)) {
            shm.remove_own(m, &[libc::S_IFREG]);
        }
        for base in [std::env::temp_dir(), PathBuf::from("/tmp")] {
            if let Some(b) = Dir::open(&base) {
                remove_sockdir_in(&b, &format!("tmpirun-{jobid}"));
            }
        }
        shm.remove_own(n, &[libc::S_IFREG]);
        swept.push(jobid.to_string());
    }
    swept
}

/// Removes a socket directory that `tmpirun` made, `name` in `base`: only a real directory of
/// this user, its socket (a socket or regular file of this user) removed relative to it, then
/// the directory, which must then be empty (nothing but what tmpirun put there is removed).
fn remove_sockdir_in(base: &Dir, name: &str) {
    let Some(d) = base.open_own_dir(name) else { return };
    d.remove_own("kv.sock", &[libc::S_IFSOCK, libc::S_IFREG]);
    base.remove_own_dir(name);
}

/// An open directory: names are looked up relative to it (`openat`, `fstatat`, `unlinkat`),
/// never through a path that a link could redirect.
struct Dir(OwnedFd);

/// This process's effective user.
fn me() -> libc::uid_t {
    // SAFETY: geteuid takes no arguments and cannot fail.
    unsafe { libc::geteuid() }
}

impl Dir {
    /// Opens the directory at `path` (a system directory: `/dev/shm`, `/tmp`, `$TMPDIR`).
    fn open(path: &Path) -> Option<Dir> {
        let c = CString::new(path.as_os_str().as_bytes()).ok()?;
        // SAFETY: `c` is a NUL-terminated path that outlives the call; the result is checked.
        let fd = unsafe { libc::open(c.as_ptr(), libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC) };
        // SAFETY: a non-negative result is a new descriptor that nothing else owns.
        (fd >= 0).then(|| Dir(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// `openat` of `name` with `flags | O_NOFOLLOW | O_CLOEXEC`, kept only when `fstat` says it
    /// is of a type in `kinds` and owned by this user.
    fn open_own(&self, name: &str, flags: libc::c_int, kinds: &[libc::mode_t]) -> Option<(OwnedFd, libc::stat)> {
        let c = CString::new(name).ok()?;
        // SAFETY: the directory descriptor is open (owned by `self`) and `c` is a NUL-terminated
        // name that outlives the call; the result is checked.
        let fd = unsafe { libc::openat(self.0.as_raw_fd(), c.as_ptr(), flags | libc::O_NOFOLLOW | libc::O_CLOEXEC) };
        if fd < 0 {
            return None;
        }
        // SAFETY: a non-negative result is a new descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: an all-zero stat is a valid value for fstat to overwrite.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: `fd` is open and `st` is writable storage for one stat.
        let ok = unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } == 0;
        (ok && st.st_uid == me() && kinds.contains(&(st.st_mode & libc::S_IFMT))).then_some((fd, st))
    }

    /// The text of `name` when it is a regular file of this user of at most `max` bytes.
    fn read_own_file(&self, name: &str, max: u64) -> Option<String> {
        use std::io::Read as _;
        // Non-blocking: a FIFO planted under the name must not stall the sweep (it is no
        // regular file and is refused by the check anyway).
        let (fd, st) = self.open_own(name, libc::O_RDONLY | libc::O_NONBLOCK, &[libc::S_IFREG])?;
        if st.st_size < 0 || st.st_size as u64 > max {
            return None;
        }
        let mut text = String::new();
        std::fs::File::from(fd).take(max).read_to_string(&mut text).ok()?;
        Some(text)
    }

    /// The directory `name` in this one, when it is a real directory (not a link) of this user.
    fn open_own_dir(&self, name: &str) -> Option<Dir> {
        self.open_own(name, libc::O_RDONLY | libc::O_DIRECTORY, &[libc::S_IFDIR]).map(|(fd, _)| Dir(fd))
    }

    /// The type bits and owner of `name` itself (a link is not followed).
    fn lstat(&self, name: &str) -> Option<(libc::mode_t, libc::uid_t)> {
        let c = CString::new(name).ok()?;
        // SAFETY: an all-zero stat is a valid value for fstatat to overwrite.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: the directory descriptor is open, `c` is NUL-terminated and `st` writable;
        // all outlive the call.
        let rc = unsafe { libc::fstatat(self.0.as_raw_fd(), c.as_ptr(), &mut st, libc::AT_SYMLINK_NOFOLLOW) };
        (rc == 0).then_some((st.st_mode & libc::S_IFMT, st.st_uid))
    }

    /// Unlinks `name` when it is of a type in `kinds` and owned by this user. (In a sticky
    /// directory such as `/dev/shm` or `/tmp`, no other user can replace this user's entry
    /// between the check and the unlink.)
    fn remove_own(&self, name: &str, kinds: &[libc::mode_t]) {
        if !self.lstat(name).is_some_and(|(kind, uid)| uid == me() && kinds.contains(&kind)) {
            return;
        }
        let Ok(c) = CString::new(name) else { return };
        // SAFETY: the directory descriptor is open and `c` is a NUL-terminated name; a failure
        // (a race with another sweeper) changes nothing.
        unsafe { libc::unlinkat(self.0.as_raw_fd(), c.as_ptr(), 0) };
    }

    /// Removes the empty directory `name` when it is a real directory of this user.
    fn remove_own_dir(&self, name: &str) {
        if !self.lstat(name).is_some_and(|(kind, uid)| uid == me() && kind == libc::S_IFDIR) {
            return;
        }
        let Ok(c) = CString::new(name) else { return };
        // SAFETY: as in `remove_own`; only an empty directory is removed.
        unsafe { libc::unlinkat(self.0.as_raw_fd(), c.as_ptr(), libc::AT_REMOVEDIR) };
    }
}

/// Records a spawned rank (its pid is also its process group id).
pub fn register_child(pid: i32) {
    lock(&CHILDREN).push(pid);
}

/// Reaps a rank that has ended and forgets it.
pub fn reap_child(pid: i32) {
    sys::reap(pid);
    lock(&CHILDREN).retain(|&p| p != pid);
}

/// Removes `/dev/shm/tmpi-<jobid>*` (the segment rank 0 created, and any later ones), the
/// launcher file last: regular files of this user only.
pub fn remove_shm_files(jobid: &str) {
    let prefix = format!("tmpi-{jobid}");
    let own = format!("tmpi-{jobid}.launcher");
    let (Some(shm), Ok(dir)) = (Dir::open(Path::new(SHM_DIR)), std::fs::read_dir(SHM_DIR)) else {
        return;
    };
    for e in dir.flatten() {
        let n = e.file_name().to_string_lossy().into_owned();
        if n.starts_with(&prefix) && n != own {
            shm.remove_own(&n, &[libc::S_IFREG]);
        }
    }
    shm.remove_own(&own, &[libc::S_IFREG]);
}

/// Removes the regions libfabric's `shm` provider left in `/dev/shm` for local ranks that
/// have ended (`pids`, not reaped yet: a zombie keeps its pid, so no other process can own
/// regions under it now), in one pass over the directory. A rank over
/// `TMPI_OFI_PROVIDER=shm` that is killed before it closes its endpoint leaves one (16 MiB;
/// [`tmpi_transport::fi_shm`]); regular files of this user only.
pub fn remove_provider_regions(pids: &[i32]) {
    if pids.is_empty() {
        return;
    }
    let (Some(shm), Ok(dir)) = (Dir::open(Path::new(SHM_DIR)), std::fs::read_dir(SHM_DIR)) else {
        return;
    };
    let pids: std::collections::HashSet<u32> = pids.iter().filter_map(|&p| u32::try_from(p).ok()).collect();
    for e in dir.flatten() {
        let n = e.file_name().to_string_lossy().into_owned();
        if tmpi_transport::fi_shm::region_owner(&n).is_some_and(|p| pids.contains(&p)) {
            shm.remove_own(&n, &[libc::S_IFREG]);
        }
    }
}

/// Removes the socket directory `dir` (one [`register_sockdir`] recorded) now: once every
/// rank of its job has connected nobody else may, and a `tmpirun` that is SIGKILLed later
/// then leaves nothing in the temporary directory.
pub fn remove_sockdir(dir: &Path) {
    lock(&SOCKDIRS).retain(|d| d != dir);
    remove_dir(dir);
}

fn remove_dir(d: &Path) {
    let (Some(parent), Some(name)) = (d.parent().and_then(Dir::open), d.file_name().and_then(|n| n.to_str())) else { return };
    remove_sockdir_in(&parent, name);
}

/// Kills (SIGKILL) and reaps every rank not yet reaped, removes the job's shm files and the
/// socket directory.
pub fn cleanup() {
    let children = take_now(&CHILDREN);
    for &pid in &children {
        sys::kill_group(pid, libc::SIGKILL);
    }
    for &pid in &children {
        sys::reap(pid);
    }
    // The launcher file goes last (in remove_shm_files): until then a later sweep can still
    // find whatever a crash in the middle of this left.
    for d in take_now(&SOCKDIRS) {
        remove_dir(&d);
    }
    for j in take_now(&JOBS) {
        remove_shm_files(&j);
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

    /// The tests that sweep run one at a time: a sweep removes every dead job it finds, the
    /// other test's planted one too.
    static SWEEPING: Mutex<()> = Mutex::new(());

    #[test]
    fn provider_regions_of_an_ended_rank_are_removed() {
        // A pid no process has here (beyond pid_max) keeps the test off real regions.
        let pid = 4_194_305;
        let mine = format!("{SHM_DIR}/{pid}:0:1");
        let other = format!("{SHM_DIR}/{}:0:1", pid + 1);
        std::fs::write(&mine, b"x").unwrap();
        std::fs::write(&other, b"x").unwrap();
        remove_provider_regions(&[pid]);
        let (gone, kept) = (!Path::new(&mine).exists(), Path::new(&other).exists());
        let _ = std::fs::remove_file(&other);
        assert!(gone, "{mine} was not removed");
        assert!(kept, "{other} (another pid) was removed");
    }

    #[test]
    fn sweep_removes_only_dead_launchers_files() {
        let _one_at_a_time = SWEEPING.lock().unwrap_or_else(|e| e.into_inner());
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

    /// Issue 55 item 5: files another user planted (a launcher file naming a dead pid, a
    /// segment, a socket directory) and links (a launcher file, a segment, a socket directory
    /// that point at another job's files) are never swept, read through or removed.
    #[test]
    fn sweep_touches_only_own_files_and_follows_no_link() {
        if me() != 0 {
            eprintln!("sweep_touches_only_own_files_and_follows_no_link: SKIPPED: not root (cannot plant files as nobody)");
            return;
        }
        let _one_at_a_time = SWEEPING.lock().unwrap_or_else(|e| e.into_inner());
        let mut child = std::process::Command::new("true").spawn().expect("start true");
        let dead = child.id() as i32;
        child.wait().expect("wait");
        let p = Planted::new();
        p.plant(dead);
        let swept = sweep_stale();
        let seen = p.observe();
        // Clean up what the test planted, whatever the sweep did.
        p.remove();
        assert_eq!(seen.theirs_left, [true; 3], "another user's files were swept");
        assert!(!swept.contains(&p.theirs) && !swept.contains(&p.link_launcher), "{swept:?}");
        assert!(seen.victim_left, "the sweep went through a link and removed another job's file");
        assert!(seen.their_seg_left, "another user's segment under a dead job's name was removed");
        // (Gone, by this sweep or another tmpirun's running beside the test.)
        assert!(seen.ours_swept, "our own dead jobs are still swept: {swept:?}");
    }

    /// The files [`sweep_touches_only_own_files_and_follows_no_link`] plants: a job "of
    /// nobody" (`theirs`), a dead job of ours whose socket directory is a link into a victim
    /// job's (`linked`), a dead job of ours whose segments are nobody's or a link
    /// (`their_seg`), and a launcher file that is a link (`link_launcher`).
    struct Planted {
        theirs: String,
        linked: String,
        their_seg: String,
        link_launcher: String,
        their_dir: PathBuf,
        victim: PathBuf,
        link_dir: PathBuf,
        /// The file the linked launcher file points at (in the victim's directory).
        target: PathBuf,
    }

    /// What the sweep left of [`Planted`].
    struct Seen {
        theirs_left: [bool; 3],
        victim_left: bool,
        their_seg_left: bool,
        ours_swept: bool,
    }

    const NOBODY: u32 = 65534;

    fn shm(n: &str) -> PathBuf {
        PathBuf::from(format!("{SHM_DIR}/{n}"))
    }

    fn own(p: &Path, uid: u32) {
        std::os::unix::fs::lchown(p, Some(uid), Some(uid)).expect("chown");
    }

    fn planted(p: &Path, text: &str, uid: u32) {
        std::fs::write(p, text).expect("plant");
        own(p, uid);
    }

    fn exists(p: &Path) -> bool {
        std::fs::symlink_metadata(p).is_ok()
    }

    impl Planted {
        fn new() -> Planted {
            let rnd = || tmpi_transport::bootstrap::new_jobid().expect("random job id");
            let (theirs, linked) = (rnd(), rnd());
            let tmp = std::env::temp_dir();
            let victim = tmp.join(format!("tmpi-victim-{}", rnd()));
            Planted {
                their_dir: tmp.join(format!("tmpirun-{theirs}")),
                link_dir: tmp.join(format!("tmpirun-{linked}")),
                target: victim.join("launcher"),
                victim,
                theirs,
                linked,
                their_seg: rnd(),
                link_launcher: rnd(),
            }
        }

        /// Plants every file; the dead jobs name pid `dead`.
        fn plant(&self, dead: i32) {
            let (theirs, linked, their_seg) = (&self.theirs, &self.linked, &self.their_seg);
            // A job "of nobody": launcher file, segment and socket directory all nobody's.
            planted(&shm(&format!("tmpi-{theirs}.launcher")), &format!("{dead} 1\n"), NOBODY);
            planted(&shm(&format!("tmpi-{theirs}-0123456789abcdef")), "segment", NOBODY);
            std::fs::create_dir_all(&self.their_dir).expect("mkdir");
            planted(&self.their_dir.join("kv.sock"), "", NOBODY);
            own(&self.their_dir, NOBODY);
            // A victim job whose socket directory a link of a dead job of ours points at.
            std::fs::create_dir_all(&self.victim).expect("mkdir");
            std::fs::write(self.victim.join("kv.sock"), "").expect("sock");
            planted(&shm(&format!("tmpi-{linked}.launcher")), &format!("{dead} 1\n"), 0);
            std::os::unix::fs::symlink(&self.victim, &self.link_dir).expect("symlink");
            // A dead job of ours whose "segment" is nobody's, and one whose "segment" is a link.
            planted(&shm(&format!("tmpi-{their_seg}.launcher")), &format!("{dead} 1\n"), 0);
            planted(&shm(&format!("tmpi-{their_seg}-0123456789abcdef")), "segment", NOBODY);
            std::os::unix::fs::symlink(self.victim.join("kv.sock"), shm(&format!("tmpi-{their_seg}-fedcba9876543210"))).expect("symlink");
            // A launcher "file" that is a link to a file naming a dead pid.
            std::fs::write(&self.target, format!("{dead} 1\n")).expect("write");
            std::os::unix::fs::symlink(&self.target, shm(&format!("tmpi-{}.launcher", self.link_launcher))).expect("symlink");
        }

        fn observe(&self) -> Seen {
            let (theirs, linked, their_seg) = (&self.theirs, &self.linked, &self.their_seg);
            Seen {
                theirs_left: [
                    exists(&shm(&format!("tmpi-{theirs}.launcher"))),
                    exists(&shm(&format!("tmpi-{theirs}-0123456789abcdef"))),
                    exists(&self.their_dir.join("kv.sock")),
                ],
                victim_left: exists(&self.victim.join("kv.sock")) && exists(&self.target),
                their_seg_left: exists(&shm(&format!("tmpi-{their_seg}-0123456789abcdef"))),
                ours_swept: !exists(&shm(&format!("tmpi-{linked}.launcher"))) && !exists(&shm(&format!("tmpi-{their_seg}.launcher"))),
            }
        }

        fn remove(&self) {
            let (theirs, linked, their_seg) = (&self.theirs, &self.linked, &self.their_seg);
            for n in [
                format!("tmpi-{theirs}.launcher"),
                format!("tmpi-{theirs}-0123456789abcdef"),
                format!("tmpi-{linked}.launcher"),
                format!("tmpi-{their_seg}.launcher"),
                format!("tmpi-{their_seg}-0123456789abcdef"),
                format!("tmpi-{their_seg}-fedcba9876543210"),
                format!("tmpi-{}.launcher", self.link_launcher),
            ] {
                let _ = std::fs::remove_file(shm(&n));
            }
            let _ = std::fs::remove_file(&self.link_dir);
            let _ = std::fs::remove_dir_all(&self.their_dir);
            let _ = std::fs::remove_dir_all(&self.victim);
        }
    }
}
