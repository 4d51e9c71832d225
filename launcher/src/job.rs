//! Running one job: spawn the ranks, serve the bootstrap, forward output, watch for the end.
//!
//! Everything happens in one thread around one `poll`: a self-pipe for signals (SIGCHLD and
//! the signals that end the job), the bootstrap server's epoll descriptor, and the ranks'
//! stdout/stderr pipes. There is no sleep anywhere; timeouts are `poll` timeouts.
//!
//! Each rank is the leader of its own process group (`process_group(0)`), so `kill(-pid)`
//! reaches the rank and whatever it started. Each rank also gets SIGKILL from the kernel
//! when `tmpirun` dies, however it dies (`PR_SET_PDEATHSIG`, set between fork and exec by
//! [`sys::die_with_parent`]). That `pre_exec` hook costs std's `posix_spawn` (vfork) fast
//! path: ranks are started with `fork` + `exec`, about 0.2 ms more per rank (measured:
//! `tmpirun -n 16 true` 15.0 -> 17.7 ms, median). Ranks are observed with
//! `waitid(WNOWAIT)` and reaped only at the very end: a zombie keeps its pid, so a group id
//! is never reused while `tmpirun` may still signal it. (An exited rank is seen at once all
//! the same: SIGCHLD wakes the loop and `waitid` reports zombies.) Once every rank has
//! connected to the bootstrap service its socket's directory is removed, and after
//! `tmpi::init` rank 0 has unlinked the shared-memory segment; what a SIGKILLed `tmpirun`
//! leaves before that (and its `.launcher` file) the next `tmpirun` sweeps (see [`cleanup`]).
//!
//! Admission: each job has a random secret (`TMPI_JOB_SECRET` in the ranks' environment) and
//! the bootstrap service admits only connections that carry it from a rank or a rank's
//! descendant; others are refused (reported once, counted) without touching the job.
//!
//! Remote ranks ([`MultiHost`]): the process tmpirun starts is the launch agent (`ssh`), in
//! its own group with the death signal like a local rank; its exit status is the rank's. Its
//! stdin carries the job secret (and for rank 0 tmpirun's stdin, in frames) and then stays
//! open until the job ends ([`crate::hosts`]):
//! ending the job closes it (and signals the agent), which makes the remote wrapper kill the
//! rank. Remote ranks reach the bootstrap service over TCP and prove the secret there.
//!
//! Ending: the first failure (a rank exiting non-zero or killed by a signal, a rank that
//! connected to the bootstrap service exiting 0 without finalizing, an abort through
//! the bootstrap service, the timeout, a remote host that stopped answering (its rank's
//! bootstrap connection timed out: `TMPI_PEER_TIMEOUT`), or SIGINT/SIGTERM/SIGHUP to `tmpirun`) sends SIGTERM
//! (or the received signal) to every rank's group, and SIGKILL [`GRACE`] later to whatever is
//! left. Which rank failed first is decided with the bootstrap service's help (see
//! `Running::scan_ranks`): a rank that fails because a peer died is not blamed for it, nor one
//! that fails while a remote host owes tmpirun an answer (that host is then waited for). When
//! every rank has ended, the groups get SIGKILL (stray children) and the pipes are drained
//! for at most [`DRAIN`]. The report of a failed rank quotes the last meaningful line it wrote
//! on stderr (its pipe is drained first).
//!
//! Spawns ([`spawn`]): a rank may ask for more processes; they join [`Running::ranks`] (after
//! the job's ranks) with a bootstrap service of their own, and from then on are treated as
//! ranks in all of the above (their reports name them as spawned). [`Running::servers`] holds
//! every bootstrap service: the job's, each spawn's children's and each spawn's bridge.

use std::ffi::OsString;
use std::fs::File;
use std::io::{Read, Write};
use std::net::IpAddr;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::DirBuilderExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use tmpi_transport::bootstrap::{self, BootstrapAddr, BootstrapServer, JobSecret, ServerEvent, KNOBS};
use tmpi_transport::host::ENV_NODE_ID;

use crate::binding::{Binder, Placement};
use crate::cleanup;
use crate::cli::Export;
use crate::error::{Error, Result};
use crate::hosts;
use crate::output::{self, LineBuf, Sink};
use crate::sys::{self, ExitKind, SignalPipe};

mod spawn;

/// What the ranks that departed before a failed rank did, as `Running::scan_ranks` judges it.
enum Before {
    /// This one ended and failed: it is the job's first failure.
    Failed(usize),
    /// One has not been seen to end yet: wait for it.
    Running,
    /// Every one ended cleanly.
    Clear,
}

/// Time between SIGTERM and SIGKILL when the job is ended: long enough for a rank that
/// handles SIGTERM to flush its output, short enough that a failed job is gone well within
/// 2 s of the failure.
pub const GRACE: Duration = Duration::from_millis(300);
/// How long a rank that left the bootstrap service (connection lost, or finalized) may take
/// to end, when another rank failed in the meantime, before the other one is reported as the
/// job's first failure.
pub const SUSPECT_WAIT: Duration = Duration::from_millis(250);
/// How long output is still read after every rank has ended (children that escaped the
/// process group may hold the pipes open).
pub const DRAIN: Duration = Duration::from_millis(200);
/// Exit status when `--timeout` expires.
pub const TIMEOUT_STATUS: i32 = 124;
/// Exit status when the first failure is a rank that exited 0 without finalizing (it had
/// connected to the bootstrap service, so it is a tmpi program that left the job early).
pub const UNFINALIZED_STATUS: i32 = 1;
/// Longest last-error line quoted in a failure report (bytes; longer ones are cut).
pub const MAX_QUOTED: usize = 300;
/// Exit status when a host stopped answering (as `ssh`'s when it loses its connection).
pub const HOST_LOST_STATUS: i32 = 255;
/// Groups of ranks a summary line lists before it counts the rest.
const SHOWN_GROUPS: usize = 8;
/// Job ids the sweep's message lists before it counts the rest.
const SHOWN_JOBS: usize = 64;

/// Test hook: when this variable is set in `tmpirun`'s environment, `tmpirun` panics right
/// after forwarding the first line of output, so tests can check that a panicking launcher
/// still kills the ranks and removes the job's files.
pub const TEST_PANIC_VAR: &str = "TMPIRUN_TEST_PANIC";

/// Everything needed to start a job.
#[derive(Debug)]
pub struct JobSpec {
    /// The resolved program path.
    pub program: PathBuf,
    /// `argv[0]` as the user wrote it.
    pub argv0: OsString,
    /// Arguments after the program.
    pub args: Vec<OsString>,
    /// Number of ranks.
    pub np: usize,
    /// `--tag-output`.
    pub tag_output: bool,
    /// `-x` requests.
    pub exports: Vec<Export>,
    /// `--timeout`.
    pub timeout: Option<Duration>,
    /// Placement of each rank.
    pub placements: Vec<Placement>,
    /// `--report-bindings`.
    pub report_bindings: bool,
    /// `--report-pids`.
    pub report_pids: bool,
    /// The hosts, when some rank runs on another one.
    pub multi: Option<MultiHost>,
    /// `TMPI_PEER_TIMEOUT`: how long a remote rank's host may leave its bootstrap connection
    /// unanswered before the job ends naming it.
    pub peer_timeout: Option<Duration>,
}

/// A job over several hosts.
#[derive(Debug)]
pub struct MultiHost {
    /// Each node's name (what `TMPI_NODE_ID` says and the agent is given).
    pub names: Vec<String>,
    /// Whether each node is another host (else it is this machine).
    pub remote: Vec<bool>,
    /// The node of each rank.
    pub node_of: Vec<usize>,
    /// The command that starts a remote rank (`ssh` and its options).
    pub agent: Vec<String>,
    /// Where the bootstrap service listens for remote ranks.
    pub bootstrap_ip: IpAddr,
    /// The directory remote ranks start in (when it exists there).
    pub cwd: PathBuf,
}

impl MultiHost {
    /// A rank's node-local rank and the number of ranks of its node.
    fn local(&self, r: usize) -> (usize, usize) {
        let n = self.node_of[r];
        (self.node_of[..r].iter().filter(|&&m| m == n).count(), self.node_of.iter().filter(|&&m| m == n).count())
    }
}

/// Why the job is ending.
#[derive(Debug, Clone, PartialEq, Eq)]
enum End {
    RankFailed { status: i32 },
    Abort { code: i32 },
    Timeout,
    Signal(i32),
    HostLost,
}

impl End {
    fn status(&self) -> i32 {
        match *self {
            End::RankFailed { status } => status,
            // An aborted job never reports success: abort(0) and codes that are no exit
            // status give 1.
            End::Abort { code } => {
                if (1..=255).contains(&code) {
                    code
                } else {
                    1
                }
            }
            End::Timeout => TIMEOUT_STATUS,
            End::Signal(s) => 128 + s,
            End::HostLost => HOST_LOST_STATUS,
        }
    }
}

/// Where a rank stands with the bootstrap service.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Boot {
    /// Never said hello: not a tmpi program (or not there yet).
    Never,
    /// Connected and not finalized.
    Connected,
    /// Finalized: it may end whenever it likes.
    Finalized,
    /// Its connection closed without a finalize.
    Lost,
}

struct Rank {
    pid: i32,
    /// The host of a remote rank (`pid` is then its agent's).
    host: Option<String>,
    exit: Option<ExitKind>,
    boot: Boot,
    /// The last meaningful line the rank wrote on stderr (see [`LastLine`]).
    last_err: LastLine,
    /// For a process a spawn started: which.
    spawned: Option<spawn::Spawned>,
}

/// How a rank that ended failed, if it did.
struct Failure {
    status: i32,
    how: String,
}

impl Rank {
    /// How reports name the process at index `g` of [`Running::ranks`]: `rank 3`, or
    /// `spawned rank 0 (spawn 1: ./prog)`.
    fn name(&self, g: usize) -> String {
        match &self.spawned {
            None => format!("rank {g}"),
            Some(s) => s.to_string(),
        }
    }

    /// Whether (and how) this rank's end is a failure of the job: a non-zero exit or a
    /// signal, or an exit 0 of a rank that connected to the bootstrap service and did not
    /// finalize (a tmpi program that left its peers without a word).
    fn failure(&self) -> Option<Failure> {
        match self.exit? {
            ExitKind::Code(0) => match self.boot {
                Boot::Connected | Boot::Lost => {
                    Some(Failure { status: UNFINALIZED_STATUS, how: "exited with code 0 without finalizing".into() })
                }
                Boot::Never | Boot::Finalized => None,
            },
            ExitKind::Code(255) if self.host.is_some() => Some(Failure {
                status: 255,
                how: "exited with code 255 (or its launch agent failed: ssh says 255 when it cannot connect)".into(),
            }),
            ExitKind::Code(c) => Some(Failure { status: c, how: format!("exited with code {c}") }),
            ExitKind::Signal(sig) => {
                Some(Failure { status: 128 + sig, how: format!("killed by signal {} ({sig})", sys::signal_name(sig)) })
            }
        }
    }
}

/// Remembers the last meaningful line of a rank's stderr, to quote it when the rank fails.
///
/// "Meaningful": a Rust panic report is the line after `thread '...' panicked at ...:` (the
/// message), not the `note: run with RUST_BACKTRACE` hint or the backtrace that follow it.
#[derive(Debug, Default)]
struct LastLine {
    line: Option<String>,
    /// The previous line announced a panic: this one is its message.
    panic_next: bool,
    /// Inside a backtrace: skip until an unindented line that is not a frame.
    in_backtrace: bool,
}

impl LastLine {
    /// Takes the complete lines of a chunk that was just forwarded.
    fn feed(&mut self, out: &[u8], tagged: bool) {
        for raw in out.split(|&b| b == b'\n') {
            let mut l = String::from_utf8_lossy(raw).into_owned();
            if tagged {
                // Drop the "[R] " prefix that --tag-output added.
                if let Some(rest) = l.strip_prefix('[').and_then(|r| r.split_once("] ")).map(|(_, r)| r.to_string()) {
                    l = rest;
                }
            }
            let t = l.trim_end();
            if t.trim().is_empty() {
                continue;
            }
            if self.panic_next {
                self.panic_next = false;
                self.set(format!("panicked: {}", t.trim()));
                continue;
            }
            if t == "stack backtrace:" {
                self.in_backtrace = true;
                continue;
            }
            if self.in_backtrace {
                if t.starts_with(' ') || t.starts_with("note: ") {
                    continue;
                }
                self.in_backtrace = false;
            }
            if t.starts_with("note: run with `RUST_BACKTRACE") || t.starts_with("note: Some details are omitted") {
                continue;
            }
            if t.starts_with("thread '") && t.contains(" panicked at ") {
                // Since Rust 1.73 the message follows on the next line (this one ends with
                // the location and a colon); before, it was on this line.
                self.panic_next = t.ends_with(':');
                self.set(t.to_string());
                continue;
            }
            self.set(t.to_string());
        }
    }

    /// Stores `l` (cut to [`MAX_QUOTED`] bytes) as the last line.
    fn set(&mut self, mut l: String) {
        if l.len() > MAX_QUOTED {
            let mut cut = MAX_QUOTED;
            while !l.is_char_boundary(cut) {
                cut -= 1;
            }
            l.truncate(cut);
            l.push_str("...");
        }
        self.line = Some(l);
    }
}

struct Stream {
    /// The process whose stream this is (its index in [`Running::ranks`]).
    rank: usize,
    sink: Sink,
    file: Option<File>,
    buf: LineBuf,
}

/// Creates a private (0700) directory for the bootstrap socket and returns it with the
/// socket path. Falls back to `/tmp` when `TMPDIR` would make the path too long for a
/// Unix socket.
fn socket_dir(jobid: &str) -> Result<(PathBuf, PathBuf)> {
    let name = format!("tmpirun-{jobid}");
    let mut base = std::env::temp_dir();
    if base.join(&name).join("kv.sock").as_os_str().len() >= 100 {
        base = PathBuf::from("/tmp");
    }
    let dir = base.join(name);
    std::fs::DirBuilder::new().mode(0o700).create(&dir).map_err(|e| Error::io(format!("create {}", dir.display()), e))?;
    let sock = dir.join("kv.sock");
    Ok((dir, sock))
}

/// Restores the calling thread's CPU binding when dropped.
struct BindingRestore<'a> {
    binder: &'a Binder,
    cpus: Option<Vec<usize>>,
}

impl Drop for BindingRestore<'_> {
    fn drop(&mut self) {
        if let Some(cpus) = &self.cpus {
            let _ = self.binder.bind_thread(cpus);
        }
    }
}

/// Runs the job to its end and returns `tmpirun`'s exit status.
///
/// # Errors
/// The job could not be set up or started (the ranks already started are killed).
pub fn run(spec: &JobSpec, sigs: &SignalPipe, binder: &Binder) -> Result<i32> {
    let _guard = cleanup::Guard;
    let swept = cleanup::sweep_stale();
    if !swept.is_empty() {
        say(&format!("removed the files of {} earlier job(s) whose tmpirun died: {}", swept.len(), output::summarize(&swept, SHOWN_JOBS)));
    }
    let secret = JobSecret::new()?;
    let JobFiles { jobid, shm_name, sockdir, mut server } = JobFiles::new(spec.np, &secret)?;
    server.set_peer_timeout(spec.peer_timeout);
    let tcp_addr = match &spec.multi {
        Some(m) => Some(BootstrapAddr::Tcp(server.listen_tcp(m.bootstrap_ip)?)),
        None => None,
    };

    if spec.report_bindings {
        report_bindings(&spec.placements);
    }

    let sock = server.path().to_path_buf();
    let env = JobEnv { jobid: &jobid, shm_name: &shm_name, sock: &sock, launcher_pid: &launcher_pid(), secret: &secret.to_hex() };
    let (ranks, streams, links) = spawn_all(spec, binder, &env, tcp_addr.as_ref())?;
    // Connections are accepted only from the event loop below, so no stranger gets in before
    // this: from now on only the ranks and their descendants may connect.
    server.admit_pids(ranks.iter().map(|r| r.pid).collect());
    let served = Served::new(server, Some(0), sockdir, String::new());
    let mut job = Running::new(spec, secret, (ranks, links, streams), served);
    let status = job.event_loop(sigs)?;
    job.finish();
    Ok(status)
}

/// `--report-bindings`: each rank's placement, a line each.
fn report_bindings(placements: &[Placement]) {
    let mut lines = String::new();
    for (r, p) in placements.iter().enumerate() {
        lines.push_str(&p.describe(r));
        lines.push('\n');
    }
    output::write_own(&lines);
}

/// A job's names and bootstrap service, made afresh: the job's and each spawn's children's
/// and bridge.
struct JobFiles {
    jobid: String,
    shm_name: String,
    /// The private directory of the socket (registered for cleanup).
    sockdir: PathBuf,
    server: BootstrapServer,
}

impl JobFiles {
    /// A new job id and segment name, the job's launcher file (registered for cleanup, see
    /// [`cleanup`]), its socket directory and a bootstrap server of `size` ranks proving
    /// `secret`.
    fn new(size: usize, secret: &JobSecret) -> Result<JobFiles> {
        let jobid = bootstrap::new_jobid()?;
        let shm_name = bootstrap::new_shm_name(&jobid)?;
        if let Err(e) = cleanup::register_job(&jobid) {
            // Not fatal (a program that is no tmpi program needs no /dev/shm); only a crash of
            // tmpirun would then leave files nobody sweeps.
            say(&format!("cannot write /dev/shm/tmpi-{jobid}.launcher ({e}): if tmpirun is killed, the job's files stay"));
        }
        let (sockdir, sock) = socket_dir(&jobid)?;
        cleanup::register_sockdir(sockdir.clone());
        let server = BootstrapServer::bind(&sock, size, secret.clone())?;
        Ok(JobFiles { jobid, shm_name, sockdir, server })
    }
}

/// `TMPI_LAUNCHER_PID`'s value: this process.
fn launcher_pid() -> String {
    std::process::id().to_string()
}

/// What a rank of a job on this host finds in its environment, but its rank.
struct JobEnv<'a> {
    jobid: &'a str,
    shm_name: &'a str,
    sock: &'a Path,
    launcher_pid: &'a str,
    /// The job secret, in hex.
    secret: &'a str,
}

impl JobEnv<'_> {
    /// Sets the job's variables for rank `rank` of `size`, `local` = (node-local rank, ranks
    /// of its node).
    fn apply(&self, cmd: &mut Command, rank: usize, size: usize, local: (usize, usize)) {
        cmd.env(bootstrap::ENV_RANK, rank.to_string())
            .env(bootstrap::ENV_SIZE, size.to_string())
            .env(bootstrap::ENV_LOCAL_RANK, local.0.to_string())
            .env(bootstrap::ENV_LOCAL_SIZE, local.1.to_string())
            .env(bootstrap::ENV_JOBID, self.jobid)
            .env(bootstrap::ENV_BOOTSTRAP, self.sock)
            .env(bootstrap::ENV_SHM_NAME, self.shm_name)
            .env(bootstrap::ENV_LAUNCHER_PID, self.launcher_pid)
            .env(bootstrap::ENV_JOB_SECRET, self.secret);
    }
}

/// Starts `cmd` as a process of the job: the leader of its own process group, so that
/// signals to the group reach it and its children, and a Ctrl-C on the terminal reaches
/// only tmpirun (which forwards it); killed by the kernel when tmpirun dies; stdout and
/// stderr piped. It is recorded for cleanup. `what` names it in an error.
fn start_process(mut cmd: Command, stdin: Stdio, what: impl FnOnce() -> String) -> Result<std::process::Child> {
    cmd.process_group(0);
    let parent = std::process::id() as libc::pid_t;
    // SAFETY: the closure runs in the forked child before exec, where only
    // async-signal-safe work is allowed: `die_with_parent` makes two system calls
    // (prctl, getppid) and neither allocates nor takes a lock. This is the main thread
    // (the death signal follows the forking thread), alive until tmpirun exits.
    unsafe {
        cmd.pre_exec(move || sys::die_with_parent(parent));
    }
    cmd.stdin(stdin).stdout(Stdio::piped()).stderr(Stdio::piped());
    let child = cmd.spawn().map_err(|e| Error::io(what(), e))?;
    cleanup::register_child(child.id() as i32);
    Ok(child)
}

/// The stdout and stderr of `child`, process `g` of [`Running::ranks`], made non-blocking,
/// their lines labelled `label` under `--tag-output` (`tag`).
fn streams_of(child: &mut std::process::Child, g: usize, label: &str, tag: bool) -> Result<Vec<Stream>> {
    let mut streams = Vec::with_capacity(2);
    for (fd, sink) in [(child.stdout.take().map(OwnedFd::from), Sink::Stdout), (child.stderr.take().map(OwnedFd::from), Sink::Stderr)] {
        let Some(fd) = fd else { continue };
        sys::set_nonblocking(fd.as_raw_fd())?;
        streams.push(Stream { rank: g, sink, file: Some(File::from(fd)), buf: LineBuf::labelled(label, tag) });
    }
    Ok(streams)
}

/// Prints a launcher message on stderr (one line, at most [`output::MAX_OWN_LINE`] bytes).
fn say(msg: &str) {
    output::write_own(&format!("tmpirun: {}\n", output::bounded(msg, output::MAX_OWN_LINE)));
}

/// Failed ranks grouped by how they failed, in the order first seen, each group as ranges:
/// `ranks 1-998 (exited with code 42), rank 999 (killed by signal SIGKILL (9))`, at most
/// [`SHOWN_GROUPS`] groups and [`SHOWN_GROUPS`] ranges a group.
fn failure_groups(failed: &[(usize, String)]) -> String {
    let mut groups: Vec<(&str, Vec<usize>)> = Vec::new();
    for (r, how) in failed {
        match groups.iter_mut().find(|(h, _)| h == how) {
            Some((_, rs)) => rs.push(*r),
            None => groups.push((how, vec![*r])),
        }
    }
    let text: Vec<String> = groups
        .iter()
        .map(|(how, rs)| format!("rank{} {} ({how})", if rs.len() > 1 { "s" } else { "" }, output::rank_ranges(rs, SHOWN_GROUPS)))
        .collect();
    output::summarize(&text, SHOWN_GROUPS)
}

/// Spawns every rank; returns them, their output streams and the stdin pipes of the remote
/// ranks' agents (kept open for the job's life: closing one ends that rank).
fn spawn_all(
    spec: &JobSpec,
    binder: &Binder,
    env: &JobEnv<'_>,
    tcp: Option<&BootstrapAddr>,
) -> Result<(Vec<Rank>, Vec<Stream>, Vec<hosts::Link>)> {
    let stdin_is_tty = sys::isatty(0);
    let original = if spec.placements.iter().any(|p| p.cpus.is_some()) { Some(binder.thread_cpus()?) } else { None };
    let _restore = BindingRestore { binder, cpus: original };
    let mut ranks = Vec::with_capacity(spec.np);
    let mut streams = Vec::with_capacity(2 * spec.np);
    let mut links = Vec::new();
    for r in 0..spec.np {
        let remote_host = spec.multi.as_ref().filter(|m| m.remote[m.node_of[r]]).map(|m| m.names[m.node_of[r]].clone());
        let cmd = match (&spec.multi, &remote_host, tcp) {
            (Some(m), Some(host), Some(tcp)) => remote_cmd(spec, m, r, host, env, tcp)?,
            _ => local_cmd(spec, r, env),
        };
        let stdin = match (r, stdin_is_tty) {
            // The secret, then the link whose end ends the remote rank.
            _ if remote_host.is_some() => Stdio::piped(),
            // A rank in a background process group reading the terminal would be stopped
            // (SIGTTIN): give it a pipe that tmpirun feeds from the terminal.
            (0, true) => Stdio::piped(),
            (0, false) => Stdio::inherit(),
            _ => Stdio::null(),
        };
        if let Some(cpus) = &spec.placements.get(r).and_then(|p| p.cpus.clone()) {
            binder.bind_thread(cpus)?;
        }
        let what = || match &remote_host {
            Some(h) => format!("start rank {r} on host {h} ({})", spec.multi.as_ref().map_or("", |m| m.agent[0].as_str())),
            None => format!("start rank {r} ({})", spec.program.display()),
        };
        let mut child = start_process(cmd, stdin, what)?;
        let pid = child.id() as i32;
        if spec.report_pids {
            match &remote_host {
                Some(h) => say(&format!("rank {r} on host {h}, agent pid {pid}")),
                None => say(&format!("rank {r} pid {pid}")),
            }
        }
        if let Some(w) = child.stdin.take() {
            match &remote_host {
                Some(_) => links.push(remote_link(w, env.secret, r)?),
                None => forward_stdin(w)?,
            }
        }
        streams.extend(streams_of(&mut child, r, &r.to_string(), spec.tag_output)?);
        ranks.push(Rank { pid, host: remote_host, exit: None, boot: Boot::Never, last_err: LastLine::default(), spawned: None });
    }
    Ok((ranks, streams, links))
}

/// The link to remote rank `r`'s wrapper, on its agent's stdin `w`: the wrapper reads the
/// secret first, then whether the rank gets stdin: rank 0 gets tmpirun's, wherever it runs
/// (frames on the same link).
fn remote_link(w: std::process::ChildStdin, secret: &str, r: usize) -> Result<hosts::Link> {
    let link = hosts::Link::new(w, secret, r == 0).map_err(|e| Error::io(format!("send the job secret to rank {r}"), e))?;
    if r == 0 {
        link.forward_stdin(std::io::stdin()).map_err(|e| Error::io("start the stdin thread", e))?;
    }
    Ok(link)
}

/// Terminal -> local rank 0, on a thread. The thread ends at end of input or when rank 0 is
/// gone; if it is still blocked reading the terminal at exit, the process exit ends it.
fn forward_stdin(mut w: std::process::ChildStdin) -> Result<()> {
    std::thread::Builder::new()
        .name("tmpirun-stdin".into())
        .spawn(move || {
            let mut buf = [0u8; 8192];
            let mut input = std::io::stdin();
            loop {
                match input.read(&mut buf) {
                    Ok(0) | Err(_) => return,
                    Ok(n) => {
                        if w.write_all(&buf[..n]).is_err() {
                            return;
                        }
                    }
                }
            }
        })
        .map_err(|e| Error::io("start the stdin thread", e))?;
    Ok(())
}

/// The exports for one rank, as name and value (`-x VAR` takes tmpirun's value, if set).
fn export_pairs(spec: &JobSpec, warn: bool) -> Vec<(String, OsString)> {
    let mut out = Vec::new();
    for x in &spec.exports {
        match x {
            Export::Set(k, v) => out.push((k.clone(), v.clone())),
            Export::Pass(k) => match std::env::var_os(k) {
                Some(v) => out.push((k.clone(), v)),
                None if warn => say(&format!("-x {k}: not set in tmpirun's environment; not exported")),
                None => {}
            },
        }
    }
    out
}

/// The command of a rank on this machine.
fn local_cmd(spec: &JobSpec, r: usize, env: &JobEnv<'_>) -> Command {
    let mut cmd = Command::new(&spec.program);
    cmd.arg0(&spec.argv0).args(&spec.args);
    for (k, v) in export_pairs(spec, r == 0) {
        cmd.env(k, v);
    }
    let local = match &spec.multi {
        Some(m) => {
            cmd.env(ENV_NODE_ID, &m.names[m.node_of[r]]);
            m.local(r)
        }
        None => (r, spec.np),
    };
    env.apply(&mut cmd, r, spec.np, local);
    cmd
}

/// The command that starts rank `r` on `host` through the launch agent: the environment is
/// on the remote command line, except the secret, which the wrapper reads from its stdin.
fn remote_cmd(spec: &JobSpec, m: &MultiHost, r: usize, host: &str, job: &JobEnv<'_>, tcp: &BootstrapAddr) -> Result<Command> {
    let (lr, ls) = m.local(r);
    let mut env: Vec<(String, OsString)> = Vec::new();
    // The runtime's knobs travel with the job (not TMPI_TCP_IF: interfaces differ by host;
    // not tmpirun's own, TMPI_RSH).
    for k in KNOBS.iter().filter(|k| k.name != "TMPI_TCP_IF" && !bootstrap::LAUNCHER_KNOBS.contains(&k.name)) {
        if let Some(v) = std::env::var_os(k.name) {
            env.push((k.name.to_string(), v));
        }
    }
    env.extend(export_pairs(spec, false));
    for (k, v) in [
        (bootstrap::ENV_RANK, r.to_string()),
        (bootstrap::ENV_SIZE, spec.np.to_string()),
        (bootstrap::ENV_LOCAL_RANK, lr.to_string()),
        (bootstrap::ENV_LOCAL_SIZE, ls.to_string()),
        (bootstrap::ENV_JOBID, job.jobid.to_string()),
        (bootstrap::ENV_SHM_NAME, job.shm_name.to_string()),
        (bootstrap::ENV_LAUNCHER_PID, job.launcher_pid.to_string()),
        (ENV_NODE_ID, host.to_string()),
    ] {
        env.push((k.to_string(), v.into()));
    }
    env.push((bootstrap::ENV_BOOTSTRAP.to_string(), tcp.to_env()));
    let program = if spec.program.is_absolute() { spec.program.clone() } else { m.cwd.join(&spec.program) };
    let line = hosts::remote_command(&m.cwd, &env, &program, &spec.args);
    let mut cmd = Command::new(&m.agent[0]);
    cmd.args(&m.agent[1..]).arg(host).arg(line);
    Ok(cmd)
}

/// A failure not reported yet (see [`Running::scan_ranks`]).
#[derive(Debug, Clone, Copy)]
struct Deferred {
    /// The rank that failed.
    rank: usize,
    /// When its failure was seen.
    since: Instant,
    /// When to look again.
    wake: Instant,
}

/// A bootstrap service `tmpirun` runs: the job's (first), the children's of a spawn, or the
/// bridge of a spawn (see [`spawn`]).
struct Served {
    server: BootstrapServer,
    /// Where a job's ranks are in [`Running::ranks`] (its rank `k` is `ranks[offset + k]`);
    /// `None` for a bridge, whose ranks are members of the other jobs, only counted here.
    offset: Option<usize>,
    /// Its socket's private directory (removed once every rank has connected).
    sockdir: PathBuf,
    /// Which spawn made it (`spawn 1`); empty for the job's.
    label: String,
    /// Ranks that have connected.
    connected: usize,
    /// Ranks that finalized or whose connection was lost (a bridge is dropped when all have).
    left: usize,
}

impl Served {
    fn new(server: BootstrapServer, offset: Option<usize>, sockdir: PathBuf, label: String) -> Served {
        Served { server, offset, sockdir, label, connected: 0, left: 0 }
    }

    /// A bridge whose every rank finalized or left: nothing more to serve.
    fn spent(&self) -> bool {
        self.offset.is_none() && self.left >= self.server.size()
    }
}

/// A job whose ranks are running.
struct Running {
    /// The job's ranks, then the processes spawns started, in the order started.
    ranks: Vec<Rank>,
    /// Stdin of each remote rank's agent: open while the job runs (see [`crate::hosts`]).
    links: Vec<hosts::Link>,
    streams: Vec<Stream>,
    /// The bootstrap services: the job's first, then each spawn's children's and bridge.
    servers: Vec<Served>,
    /// Starts what spawn requests ask for.
    spawner: spawn::Spawner,
    /// `--tag-output` (stderr lines carry a prefix to strip before quoting them).
    tag_output: bool,
    /// Connections the bootstrap service refused (strangers).
    refused: usize,
    /// Ranks seen failing before the job was being ended (not killed by tmpirun).
    failed_by_themselves: Vec<usize>,
    /// Ranks that left the bootstrap service while the job ran (connection closed without a
    /// finalize, or finalized), in the order seen (see [`Running::scan_ranks`]).
    departed: Vec<usize>,
    /// A failure whose report waits for news of a rank that may have failed first.
    deferred: Option<Deferred>,
    end: Option<End>,
    /// When the ranks still alive get SIGKILL (set once the job is ending).
    kill_at: Option<Instant>,
    /// Set once every rank has ended: stop reading output then.
    drain_until: Option<Instant>,
    deadline: Option<Instant>,
    timeout: Option<Duration>,
    /// `TMPI_PEER_TIMEOUT` ([`JobSpec::peer_timeout`]).
    peer_timeout: Option<Duration>,
    /// Test hook ([`TEST_PANIC_VAR`]).
    panic_on_output: bool,
}

impl Running {
    /// The job just started: its ranks (with the remote agents' links and the output
    /// streams) and its bootstrap service.
    fn new(
        spec: &JobSpec,
        secret: JobSecret,
        (ranks, links, streams): (Vec<Rank>, Vec<hosts::Link>, Vec<Stream>),
        served: Served,
    ) -> Running {
        Running {
            ranks,
            links,
            streams,
            servers: vec![served],
            spawner: spawn::Spawner::new(spec, secret),
            tag_output: spec.tag_output,
            refused: 0,
            failed_by_themselves: Vec::new(),
            departed: Vec::new(),
            deferred: None,
            end: None,
            kill_at: None,
            drain_until: None,
            deadline: spec.timeout.map(|t| Instant::now() + t),
            timeout: spec.timeout,
            peer_timeout: spec.peer_timeout,
            panic_on_output: std::env::var_os(TEST_PANIC_VAR).is_some(),
        }
    }

    /// After the event loop: the summaries, then every rank reaped.
    fn finish(&self) {
        // Like Open MPI's "N processes exited with non-zero status": when more than the
        // reported rank failed on its own, list them all (a rank failing because its peer
        // went away shows up here too).
        if self.failed_by_themselves.len() > 1 {
            say(&self.failed_summary());
        }
        if self.refused > 1 {
            say(&format!("bootstrap: refused {} connection(s) from processes that are not ranks of this job in all", self.refused));
        }
        // Every rank has ended (observed, not reaped): reap them now, after removing what
        // libfabric's `shm` provider left under a local rank's pid (a killed rank's region).
        let local: Vec<i32> = self.ranks.iter().filter(|r| r.host.is_none()).map(|r| r.pid).collect();
        cleanup::remove_provider_regions(&local);
        for r in &self.ranks {
            cleanup::reap_child(r.pid);
        }
    }

    fn event_loop(&mut self, sigs: &SignalPipe) -> Result<i32> {
        let mut pfds: Vec<libc::pollfd> = Vec::new();
        let mut which: Vec<usize> = Vec::new();
        let mut chunk = vec![0u8; 64 * 1024];
        let mut scan = true; // a rank may have ended before the first SIGCHLD is read
        loop {
            if scan {
                scan = false;
                self.scan_ranks()?;
            }
            let now = Instant::now();
            self.check_clocks(now);
            if self.ended_and_drained(now) {
                break;
            }

            // Wait for something.
            if self.deferred.is_some_and(|d| now >= d.wake) {
                scan = true;
                continue;
            }
            let timeout_ms = self.poll_timeout_ms(now);
            let first_stream = self.fill_pollfds(sigs, &mut pfds, &mut which);
            sys::poll(&mut pfds, timeout_ms)?;

            if pfds[0].revents != 0 {
                scan |= self.handle_signals(sigs);
            }
            if pfds[1..first_stream].iter().any(|p| p.revents != 0) {
                self.pump_server()?;
            }
            self.read_ready_streams(&pfds[first_stream..], &which, &mut chunk);
        }
        self.flush_streams();
        Ok(self.end.as_ref().map_or(0, End::status))
    }

    /// Ends the job when `--timeout` has expired, and sends SIGKILL when the grace is over.
    fn check_clocks(&mut self, now: Instant) {
        if self.deadline.is_some_and(|d| now >= d) && self.end.is_none() {
            let t = self.timeout.unwrap_or_default().as_secs_f64();
            let alive = self.ranks.iter().filter(|r| r.exit.is_none()).count();
            say(&format!("job timed out after {t} s (--timeout {t}); killing {alive} running rank(s)"));
            self.begin_end(End::Timeout, libc::SIGTERM);
        }
        if self.kill_at.is_some_and(|k| now >= k) {
            self.kill_at = None;
            self.signal_all(libc::SIGKILL);
        }
    }

    /// Once every rank has ended, starts the drain (killing stray children); true when the
    /// output is all read or the drain time is over.
    fn ended_and_drained(&mut self, now: Instant) -> bool {
        if !self.ranks.iter().all(|r| r.exit.is_some()) {
            return false;
        }
        if self.drain_until.is_none() {
            // Stray children of the ranks would hold the pipes open.
            self.signal_all(libc::SIGKILL);
            self.kill_at = None;
            self.drain_until = Some(now + DRAIN);
        }
        let open = self.streams.iter().any(|s| s.file.is_some());
        !open || self.drain_until.is_some_and(|d| now >= d)
    }

    /// The `poll` timeout until the next thing due (`-1`: nothing is due), in milliseconds.
    fn poll_timeout_ms(&self, now: Instant) -> i32 {
        let wake = [
            if self.end.is_none() { self.deadline } else { None },
            self.deferred.map(|d| d.wake),
            self.kill_at,
            self.drain_until,
            self.servers.iter().filter_map(|s| s.server.next_wake()).min(),
        ]
        .into_iter()
        .flatten()
        .min();
        match wake {
            None => -1,
            Some(w) => {
                let d = w.saturating_duration_since(now);
                // Round up so that the deadline has passed when poll returns.
                (d.as_micros().div_ceil(1000)).min(i32::MAX as u128) as i32
            }
        }
    }

    /// Fills `pfds` with the signal pipe, the bootstrap services and the open output streams
    /// (`which` gets each stream's index); returns where the streams start in `pfds`.
    fn fill_pollfds(&self, sigs: &SignalPipe, pfds: &mut Vec<libc::pollfd>, which: &mut Vec<usize>) -> usize {
        pfds.clear();
        which.clear();
        pfds.push(libc::pollfd { fd: sigs.as_raw_fd(), events: libc::POLLIN, revents: 0 });
        for s in &self.servers {
            pfds.push(libc::pollfd { fd: s.server.as_raw_fd(), events: libc::POLLIN, revents: 0 });
        }
        let first_stream = pfds.len();
        for (i, s) in self.streams.iter().enumerate() {
            if let Some(f) = &s.file {
                pfds.push(libc::pollfd { fd: f.as_raw_fd(), events: libc::POLLIN, revents: 0 });
                which.push(i);
            }
        }
        first_stream
    }

    /// Acts on the signals received: a job-ending one ends the job (a second one kills at
    /// once); returns whether SIGCHLD came, so the ranks are to be scanned.
    fn handle_signals(&mut self, sigs: &SignalPipe) -> bool {
        let mut scan = false;
        for sig in sigs.read() {
            if sig == libc::SIGCHLD {
                scan = true;
            } else if self.end.is_none() {
                say(&format!("got {}; forwarding it to the ranks and ending the job", sys::signal_name(sig)));
                self.begin_end(End::Signal(sig), sig);
            } else {
                // A second signal: no more grace.
                self.kill_at = None;
                self.signal_all(libc::SIGKILL);
            }
        }
        scan
    }

    /// Reads the output streams `poll` found ready (`ready[k]` is stream `which[k]`).
    fn read_ready_streams(&mut self, ready: &[libc::pollfd], which: &[usize], chunk: &mut [u8]) {
        for (k, &i) in which.iter().enumerate() {
            if ready[k].revents != 0 {
                let _ = self.read_stream(i, chunk);
            }
        }
    }

    /// Flushes what is left of partial lines (streams still open after the drain time) and
    /// closes every stream.
    fn flush_streams(&mut self) {
        for s in &mut self.streams {
            let rest = s.buf.finish();
            output::write_to(s.sink, &rest);
            s.file = None;
        }
    }

    /// Records ranks that ended; the first failure ends the job.
    ///
    /// "First" is decided with the bootstrap service's help: a rank whose connection closed
    /// without a finalize is dying (the kernel closes a dying process's descriptors before
    /// its parent hears of its exit), and a rank that finalized is about to exit, perhaps
    /// with an error (a `main` that returns `Err` finalizes while `World` is dropped). Both
    /// are [`Running::departed`]. So when a rank fails while a rank that departed before it
    /// has not been seen to end yet (typically a rank whose fence or receive failed
    /// *because* the other one went away), the departed rank is waited for, at most
    /// [`SUSPECT_WAIT`], and reported if it failed. (A rank that leaves the fabric before it
    /// tells the bootstrap service can still be seen going by a peer that ends first: then
    /// the peer is reported, as nothing here says it was not first.)
    fn scan_ranks(&mut self) -> Result<()> {
        // Bootstrap news first: a process's descriptors are closed before its parent hears of
        // its exit, so a rank's finalize or lost connection is always there to be read by
        // now, and its exit can be judged on it (an exit 0 without finalize is a failure).
        self.pump_server()?;
        let failed = self.reap_exits();
        if self.end.is_some() {
            self.deferred = None;
            return Ok(());
        }
        let now = Instant::now();
        let (candidate, since) = match (self.deferred, failed) {
            (Some(d), _) => (d.rank, d.since),
            (None, Some(r)) => (r, now),
            (None, None) => return Ok(()),
        };
        let wait_until = match self.departed_before(candidate) {
            Before::Failed(s) => {
                self.rank_failed(s);
                return Ok(());
            }
            Before::Running => Some(since + SUSPECT_WAIT),
            Before::Clear => self.suspect_host_wait(since, now),
        };
        // Nothing more can happen once every rank has ended.
        let all_ended = self.ranks.iter().all(|r| r.exit.is_some());
        if let Some(wake) = wait_until.filter(|&t| now < t && !all_ended) {
            self.deferred = Some(Deferred { rank: candidate, since, wake });
            return Ok(());
        }
        if self.ranks[candidate].exit.is_some() {
            self.rank_failed(candidate);
        }
        Ok(())
    }

    /// Takes in the exits of ranks that ended since the last scan; returns the first of them
    /// that failed. Ranks that fail before the job's end count as failing by themselves.
    fn reap_exits(&mut self) -> Option<usize> {
        let mut failed = None;
        for r in 0..self.ranks.len() {
            let rank = &mut self.ranks[r];
            if rank.exit.is_some() {
                continue;
            }
            let Some(kind) = sys::peek_exit(rank.pid) else {
                continue;
            };
            rank.exit = Some(kind);
            self.bridge_lost(r);
            if self.ranks[r].failure().is_some() {
                if self.end.is_none() {
                    self.failed_by_themselves.push(r);
                }
                failed.get_or_insert(r);
            }
        }
        failed
    }

    /// What the ranks that departed before `candidate` did (see [`Running::scan_ranks`]).
    fn departed_before(&self, candidate: usize) -> Before {
        for &s in &self.departed {
            if s == candidate {
                break;
            }
            match self.ranks[s].exit {
                Some(_) if self.ranks[s].failure().is_some() => return Before::Failed(s),
                Some(_) => continue,
                None => return Before::Running,
            }
        }
        Before::Clear
    }

    /// Process `r` ended: if a spawn started it and its bridge still waits for it (it ended
    /// before it joined its parents: not a tmpi program, or it failed first), the parents'
    /// wire-up can never complete, so the bridge's service fails their fences, naming it.
    fn bridge_lost(&mut self, r: usize) {
        let Some(sp) = &self.ranks[r].spawned else { return };
        let (label, rank, why) = (sp.label(), sp.bridge_rank(), format!("{sp} ended before it joined its parents"));
        if let Some(b) = self.servers.iter_mut().find(|s| s.offset.is_none() && s.label == label) {
            b.server.mark_gone(rank, &why);
        }
    }

    /// A rank failed (at `since`) while the host of a remote rank still running owes tmpirun an
    /// answer on its bootstrap connection (keepalive probes unanswered): that host may have
    /// vanished, and the failure be a peer's `PeerGone` because of it. Then the report waits,
    /// looking again every 100 ms, until that connection answers or ends
    /// ([`ServerEvent::Unreachable`] names the host), at most the peer timeout and a second.
    fn suspect_host_wait(&self, since: Instant, now: Instant) -> Option<Instant> {
        let limit = since + self.peer_timeout? + Duration::from_secs(1);
        if now >= limit {
            return None;
        }
        let suspect = self.servers[0]
            .server
            .unanswered_ranks()
            .into_iter()
            .any(|r| self.ranks.get(r).is_some_and(|k| k.host.is_some() && k.exit.is_none()));
        suspect.then(|| (now + Duration::from_millis(100)).min(limit))
    }

    /// Handles whatever the bootstrap services have to say, without blocking (a spawn adds
    /// services, served in the same pass); then drops the bridges that are done.
    fn pump_server(&mut self) -> Result<()> {
        let seen_before = self.departed.len();
        let mut si = 0;
        while si < self.servers.len() {
            for ev in self.servers[si].server.process()? {
                self.on_server_event(si, ev);
            }
            si += 1;
        }
        self.lost_before_finalized(seen_before);
        if self.servers.iter().any(Served::spent) {
            let (spent, keep) = std::mem::take(&mut self.servers).into_iter().partition(Served::spent);
            self.servers = keep;
            for s in spent as Vec<Served> {
                cleanup::remove_sockdir(&s.sockdir);
            }
        }
        Ok(())
    }

    /// Orders the departures read in one pump (from `from` on) so that ranks whose connection
    /// was lost come before ranks that finalized: the services are read one after another, so
    /// between two of them (the job's and a spawn's children's) the order read is not the
    /// order of the events, and a rank that finalized with an error (a `main` returning
    /// `Err` on `PeerGone`) most likely did so because the other one died.
    fn lost_before_finalized(&mut self, from: usize) {
        let ranks = &self.ranks;
        self.departed[from..].sort_by_key(|&g| !matches!(ranks.get(g).map(|r| r.boot), Some(Boot::Lost)));
    }

    /// Reports the failure of rank `r` (which has ended) and ends the job.
    ///
    /// The report quotes the last meaningful line the rank wrote on stderr: its pipe is read
    /// to the end first (the rank has exited, so everything it wrote is in the pipe).
    fn rank_failed(&mut self, r: usize) {
        self.deferred = None;
        self.drain_stderr_of(r);
        let rank = &self.ranks[r];
        let Some(f) = rank.failure() else {
            return;
        };
        let quote = match &rank.last_err.line {
            Some(l) => format!("; its last error line: {l:?}"),
            None => String::new(),
        };
        match (&rank.host, &rank.spawned) {
            (Some(h), _) => say(&format!("rank {r} (on host {h}) {}{quote}", f.how)),
            (None, None) => say(&format!("rank {r} (pid {}) {}{quote}", rank.pid, f.how)),
            (None, Some(s)) => say(&format!("{s} (pid {}) {}{quote}", rank.pid, f.how)),
        }
        self.begin_end(End::RankFailed { status: f.status }, libc::SIGTERM);
    }

    /// Reads what is waiting in rank `r`'s stderr pipe (bounded: a descendant of the rank
    /// may still be writing to it).
    fn drain_stderr_of(&mut self, r: usize) {
        let mut chunk = vec![0u8; 64 * 1024];
        for i in 0..self.streams.len() {
            if self.streams[i].rank != r || self.streams[i].sink != Sink::Stderr {
                continue;
            }
            for _ in 0..64 {
                if !self.read_stream(i, &mut chunk) {
                    break;
                }
            }
        }
    }

    /// An event of bootstrap service `si`.
    fn on_server_event(&mut self, si: usize, ev: ServerEvent) {
        let Some(offset) = self.servers[si].offset else {
            return self.on_bridge_event(si, ev);
        };
        match ev {
            ServerEvent::Abort { rank, code, message } => self.aborted(&self.name(offset + rank), code, &message),
            ServerEvent::Rejected { rank, reason } => {
                let who = rank.map_or("a client".to_string(), |r| self.name(offset + r));
                say(&format!("bootstrap: refused {who}: {reason}"));
            }
            ServerEvent::Refused { pid, reason } => self.refused(pid, &reason),
            ServerEvent::Connected { rank } => {
                if let Some(r) = self.ranks.get_mut(offset + rank) {
                    r.boot = Boot::Connected;
                }
                self.connected(si);
            }
            ServerEvent::Lost { rank } => self.departed(si, offset + rank, Boot::Lost),
            ServerEvent::Finalized { rank } => self.departed(si, offset + rank, Boot::Finalized),
            ServerEvent::Unreachable { rank, error } => {
                if let Some(r) = self.ranks.get_mut(offset + rank) {
                    r.boot = Boot::Lost;
                }
                if self.end.is_none() {
                    self.host_lost(offset + rank, &error);
                }
            }
            ServerEvent::Spawn { rank, request } => {
                let answer = self.spawn(si, &request);
                self.servers[si].server.answer_spawn(rank, answer);
            }
        }
    }

    /// An event of bridge `si`: its ranks are the parents and children of a spawn, members
    /// of the jobs served apart, so only an abort matters (and refusals are counted).
    fn on_bridge_event(&mut self, si: usize, ev: ServerEvent) {
        let label = &self.servers[si].label;
        match ev {
            ServerEvent::Abort { rank, code, message } => self.aborted(&format!("rank {rank} of the bridge of {label}"), code, &message),
            ServerEvent::Rejected { rank, reason } => {
                let who = rank.map_or("a client".to_string(), |r| format!("rank {r}"));
                say(&format!("bootstrap of the bridge of {label}: refused {who}: {reason}"));
            }
            ServerEvent::Refused { pid, reason } => self.refused(pid, &reason),
            ServerEvent::Connected { .. } => self.connected(si),
            ServerEvent::Lost { .. } | ServerEvent::Finalized { .. } | ServerEvent::Unreachable { .. } => self.servers[si].left += 1,
            ServerEvent::Spawn { rank, .. } => {
                let no = "spawn through a bridge's bootstrap service: ask on your own job's".to_string();
                self.servers[si].server.answer_spawn(rank, Err(no));
            }
        }
    }

    /// How reports name process `g` of [`Running::ranks`] (see [`Rank::name`]).
    fn name(&self, g: usize) -> String {
        self.ranks.get(g).map_or_else(|| format!("rank {g}"), |r| r.name(g))
    }

    /// `who` asked to end the job (abort).
    fn aborted(&mut self, who: &str, code: i32, message: &str) {
        if self.end.is_none() {
            let msg = if message.is_empty() { String::new() } else { format!(": {message}") };
            say(&format!("{who} called abort with code {code}{msg}"));
            self.begin_end(End::Abort { code }, libc::SIGTERM);
        }
    }

    /// A stranger was refused: reported once, counted always, and the job goes on.
    fn refused(&mut self, pid: Option<i32>, reason: &str) {
        self.refused += 1;
        if self.refused == 1 {
            let who = pid.map_or("a process".to_string(), |p| format!("pid {p}"));
            say(&format!("bootstrap: refused a connection from {who} ({reason}); the job goes on (further refusals are only counted)"));
        }
    }

    /// A rank of service `si` connected. A rank connects once: when all have, the socket's
    /// name is not needed.
    fn connected(&mut self, si: usize) {
        let s = &mut self.servers[si];
        s.connected += 1;
        if s.connected == s.server.size() {
            cleanup::remove_sockdir(&s.sockdir);
        }
    }

    /// Process `g`, a rank of service `si`, left it (`boot`: finalized, or lost).
    fn departed(&mut self, si: usize, g: usize, boot: Boot) {
        self.servers[si].left += 1;
        if let Some(r) = self.ranks.get_mut(g) {
            r.boot = boot;
        }
        if self.end.is_none() && !self.departed.contains(&g) {
            self.departed.push(g);
        }
    }

    /// Starts what a rank of service `si` asked for, unless the job is ending; returns the
    /// answer to the rank: the bridge, or why not.
    fn spawn(&mut self, si: usize, req: &bootstrap::spawn::SpawnRequest) -> std::result::Result<String, String> {
        if self.end.is_some() {
            return Err("the job is ending".into());
        }
        let s = &self.servers[si];
        let offset = s.offset.unwrap_or(0);
        let parents: Vec<i32> = self.ranks[offset..offset + s.server.size()].iter().map(|r| r.pid).collect();
        let started = self.spawner.start(req, parents, self.ranks.len())?;
        self.ranks.extend(started.ranks);
        self.streams.extend(started.streams);
        self.servers.extend([started.children, started.bridge]);
        Ok(started.answer)
    }

    /// The line that lists every process that failed by itself before the job was ended.
    fn failed_summary(&self) -> String {
        let failed = |spawned: bool| self.failed_by_themselves.iter().filter(move |&&g| self.ranks[g].spawned.is_some() == spawned);
        let of_job: Vec<(usize, String)> = failed(false).filter_map(|&r| self.ranks[r].failure().map(|f| (r, f.how))).collect();
        let mut parts = Vec::new();
        if !of_job.is_empty() {
            parts.push(failure_groups(&of_job));
        }
        let spawned: Vec<String> =
            failed(true).filter_map(|&g| self.ranks[g].failure().map(|f| format!("{} ({})", self.name(g), f.how))).collect();
        if !spawned.is_empty() {
            parts.push(output::summarize(&spawned, SHOWN_GROUPS));
        }
        format!("{} ranks failed before the job was ended: {}", of_job.len() + spawned.len(), parts.join(", "))
    }

    /// The host of rank `r` stopped answering (its bootstrap connection timed out): ends the
    /// job naming the host and the ranks it ran.
    fn host_lost(&mut self, r: usize, error: &str) {
        let host = self.ranks.get(r).and_then(|k| k.host.clone()).unwrap_or_else(|| "?".into());
        let on: Vec<usize> = (0..self.ranks.len()).filter(|&k| self.ranks[k].host.as_deref() == Some(host.as_str())).collect();
        let quiet = self.peer_timeout.map_or(String::new(), |t| format!("; nothing heard for {} s, TMPI_PEER_TIMEOUT", t.as_secs()));
        say(&format!(
            "host {host} (rank{} {}) stopped answering: rank {r}'s connection to tmpirun failed ({error}{quiet}); ending the job",
            if on.len() > 1 { "s" } else { "" },
            output::rank_ranges(&on, SHOWN_GROUPS)
        ));
        self.begin_end(End::HostLost, libc::SIGTERM);
    }

    /// Starts ending the job: `sig` to every rank now, SIGKILL after [`GRACE`].
    fn begin_end(&mut self, why: End, sig: i32) {
        self.end = Some(why);
        // End of stdin tells each remote rank's wrapper to kill it (the agents get `sig` too).
        self.links.clear();
        self.deferred = None;
        self.signal_all(sig);
        if self.ranks.iter().any(|r| r.exit.is_none()) {
            self.kill_at = Some(Instant::now() + GRACE);
        }
    }

    /// Sends `sig` to the process group of every rank (ended ranks are zombies that keep
    /// their group id reserved, so this reaches only their own leftover children).
    fn signal_all(&self, sig: i32) {
        for r in &self.ranks {
            sys::kill_group(r.pid, sig);
        }
    }

    /// Reads once from stream `i` and forwards the complete lines; returns whether there may
    /// be more to read now (false at end of stream and when the pipe is empty).
    fn read_stream(&mut self, i: usize, chunk: &mut [u8]) -> bool {
        let tag = self.tag_output;
        let s = &mut self.streams[i];
        let Some(f) = &mut s.file else { return false };
        let (out, more) = match f.read(chunk) {
            Ok(0) => {
                s.file = None;
                (s.buf.finish(), false)
            }
            Ok(n) => (s.buf.feed(&chunk[..n]), true),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => (Vec::new(), true),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => (Vec::new(), false),
            Err(_) => {
                s.file = None;
                (s.buf.finish(), false)
            }
        };
        output::write_to(s.sink, &out);
        if s.sink == Sink::Stderr {
            if let Some(rank) = self.ranks.get_mut(s.rank) {
                rank.last_err.feed(&out, tag);
            }
        }
        if self.panic_on_output && !out.is_empty() {
            panic!("{TEST_PANIC_VAR} is set: panicking after the first line of output");
        }
        more
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn last(text: &str, tagged: bool) -> Option<String> {
        let mut l = LastLine::default();
        // Fed in two pieces, as reads would.
        let bytes = text.as_bytes();
        let cut = bytes[..bytes.len() / 2].iter().rposition(|&c| c == b'\n').map_or(0, |i| i + 1);
        l.feed(&bytes[..cut], tagged);
        l.feed(&bytes[cut..], tagged);
        l.line
    }

    #[test]
    fn last_line_of_an_error_return() {
        assert_eq!(last("starting\nError: PeerGone { rank: 0 }\n", false).as_deref(), Some("Error: PeerGone { rank: 0 }"));
        assert_eq!(last("[1] a\n[1] Error: boom\n", true).as_deref(), Some("Error: boom"));
        assert_eq!(last("\n  \n", false), None);
    }

    #[test]
    fn a_panic_is_quoted_by_its_message() {
        let new = "thread 'main' (4242) panicked at src/main.rs:3:5:\nit broke\nnote: run with `RUST_BACKTRACE=1` environment variable to display a backtrace\n";
        assert_eq!(last(new, false).as_deref(), Some("panicked: it broke"));
        let bt = "thread 'main' panicked at src/main.rs:3:5:\nit broke\nstack backtrace:\n   0: std::panicking\n             at /rustc/x\n   1: main\nnote: Some details are omitted, run with `RUST_BACKTRACE=full` for a verbose backtrace.\n";
        assert_eq!(last(bt, false).as_deref(), Some("panicked: it broke"));
        let old = "thread 'main' panicked at 'it broke', src/main.rs:3:5\n";
        assert_eq!(last(old, false).as_deref(), Some("thread 'main' panicked at 'it broke', src/main.rs:3:5"));
    }

    #[test]
    fn long_lines_are_cut() {
        let l = last(&format!("{}\n", "é".repeat(400)), false).unwrap_or_default();
        assert!(l.len() <= MAX_QUOTED + 3 && l.ends_with("..."), "{}", l.len());
    }

    #[test]
    fn exit_zero_is_a_failure_only_for_an_unfinalized_tmpi_rank() {
        let rank = |exit, boot| Rank { pid: 1, host: None, exit: Some(exit), boot, last_err: LastLine::default(), spawned: None };
        assert!(rank(ExitKind::Code(0), Boot::Never).failure().is_none());
        assert!(rank(ExitKind::Code(0), Boot::Finalized).failure().is_none());
        for b in [Boot::Connected, Boot::Lost] {
            let f = rank(ExitKind::Code(0), b).failure().expect("a failure");
            assert_eq!((f.status, f.how.as_str()), (UNFINALIZED_STATUS, "exited with code 0 without finalizing"));
        }
        let f = rank(ExitKind::Code(3), Boot::Finalized).failure().expect("a failure");
        assert_eq!(f.status, 3);
        let f = rank(ExitKind::Signal(libc::SIGSEGV), Boot::Never).failure().expect("a failure");
        assert_eq!((f.status, f.how.as_str()), (139, "killed by signal SIGSEGV (11)"));
    }
}
