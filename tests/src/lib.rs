//! # tmpi-tests
//!
//! End-to-end tests: real programs started through the real `tmpirun`, as a user would.
//!
//! The tests in `tests/*.rs` use the **release** binaries of the workspace, so build them first:
//!
//! ```text
//! cargo build --release --workspace --bins && cargo test --release --workspace
//! ```
//!
//! This library has two halves:
//! - for the tests: [`release_bin`] finds a binary (and panics, saying to build first, when it is
//!   missing), [`Job`] runs it through `tmpirun` or alone with a time limit and returns an
//!   [`Outcome`] with the exit status, everything printed, the elapsed time and the
//!   `/dev/shm/tmpi-*` files that appeared;
//! - for the test programs in `src/bin/`: [`Verdict`], which collects failed checks on each rank
//!   and turns them into one `OK` line on rank 0 (or a non-zero exit naming what failed).
//!
//! Jobs started through [`Job::run`] in one test process run one at a time: the machine may
//! have two cores, and a leaked shared-memory file can only be attributed to a job when no
//! other job of the same process is running.

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::fmt::Write as _;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The directory of the workspace (the parent of this crate's directory).
pub fn workspace_root() -> PathBuf {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    here.parent().unwrap_or(here).to_path_buf()
}

/// The names of the example programs (`examples/src/bin/*.rs`), sorted.
///
/// # Panics
/// When the directory cannot be read.
pub fn example_names() -> Vec<String> {
    let dir = workspace_root().join("examples/src/bin");
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .flatten()
        .filter_map(|e| e.file_name().to_string_lossy().strip_suffix(".rs").map(str::to_string))
        .collect();
    names.sort();
    names
}

/// The workspace's target directory: `CARGO_TARGET_DIR` if set (relative to the workspace when
/// relative), else `<workspace>/target`.
pub fn target_dir() -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(d) if !d.is_empty() => {
            let p = PathBuf::from(d);
            if p.is_relative() {
                workspace_root().join(p)
            } else {
                p
            }
        }
        _ => workspace_root().join("target"),
    }
}

/// The path of the release binary `name` (`target/release/<name>`).
///
/// # Panics
/// If the binary does not exist: the message says to run the release build first.
pub fn release_bin(name: &str) -> PathBuf {
    let p = target_dir().join("release").join(name);
    if !p.is_file() {
        panic!(
            "{} does not exist: build the release binaries first with \
             `cargo build --release --workspace --bins` (then `cargo test --release --workspace`)",
            p.display()
        );
    }
    p
}

/// The launcher, `target/release/tmpirun`.
///
/// # Panics
/// As [`release_bin`].
pub fn tmpirun() -> PathBuf {
    release_bin("tmpirun")
}

/// Names of the files in `/dev/shm` whose name starts with `tmpi-` (empty if `/dev/shm` cannot
/// be read).
pub fn shm_files() -> BTreeSet<String> {
    let Ok(dir) = std::fs::read_dir("/dev/shm") else {
        return BTreeSet::new();
    };
    dir.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).filter(|n| n.starts_with("tmpi-")).collect()
}

/// Whether a process with this pid exists (zombies included: a zombie is a process nobody
/// reaped, which counts as left over).
pub fn pid_exists(pid: i32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// The `State:` line of `/proc/<pid>/status`, for messages.
pub fn pid_state(pid: i32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("State:")).map(|l| l.to_string()))
        .unwrap_or_else(|| "gone".into())
}

/// Serialises the jobs of one test process (see the crate docs).
static JOB_LOCK: Mutex<()> = Mutex::new(());

/// Extra time the harness gives `tmpirun` beyond its own `--timeout` before killing it.
const LAUNCHER_GRACE: Duration = Duration::from_secs(15);

/// A program to run: through `tmpirun -n N` ([`Job::tmpirun`]) or alone ([`Job::alone`]).
///
/// The child gets the test process's environment minus every `TMPI_*` variable (so a user's
/// settings cannot change a test), plus what [`Job::env`] adds; stdin is `/dev/null`.
#[derive(Debug, Clone)]
pub struct Job {
    np: Option<usize>,
    launcher_flags: Vec<OsString>,
    program: PathBuf,
    args: Vec<OsString>,
    env: Vec<(OsString, OsString)>,
    timeout: Duration,
    /// Ranks per simulated node ([`Job::nodes_of`]).
    per_node: Option<usize>,
    /// The working directory ([`Job::in_dir`]); `None`: the test's.
    dir: Option<PathBuf>,
}

impl Job {
    /// `tmpirun -n np <release binary program>`, with a 60 s time limit.
    ///
    /// # Panics
    /// If `tmpirun` or the program is not built ([`release_bin`]).
    pub fn tmpirun(np: usize, program: &str) -> Job {
        let _ = tmpirun();
        Job {
            np: Some(np),
            launcher_flags: Vec::new(),
            program: release_bin(program),
            args: Vec::new(),
            env: Vec::new(),
            timeout: Duration::from_secs(60),
            per_node: None,
            dir: None,
        }
    }

    /// The release binary `program` started directly (a singleton), with a 60 s time limit.
    ///
    /// # Panics
    /// If the program is not built ([`release_bin`]).
    pub fn alone(program: &str) -> Job {
        Job {
            np: None,
            launcher_flags: Vec::new(),
            program: release_bin(program),
            args: Vec::new(),
            env: Vec::new(),
            timeout: Duration::from_secs(60),
            per_node: None,
            dir: None,
        }
    }

    /// Adds a `tmpirun` flag (before the program). Ignored for [`Job::alone`].
    pub fn flag(mut self, f: impl Into<OsString>) -> Job {
        self.launcher_flags.push(f.into());
        self
    }

    /// Adds an argument of the program.
    pub fn arg(mut self, a: impl Into<OsString>) -> Job {
        self.args.push(a.into());
        self
    }

    /// Sets an environment variable for the launcher (and so every rank) or the program.
    pub fn env(mut self, k: impl Into<OsString>, v: impl Into<OsString>) -> Job {
        self.env.push((k.into(), v.into()));
        self
    }

    /// Splits the ranks into simulated nodes of `per` ranks (`TMPI_NODE_ID=node<rank / per>`,
    /// set by a `sh -c` wrapper around the program): shared memory within a node, TCP between
    /// nodes, all on this host. Ignored for [`Job::alone`].
    pub fn nodes_of(mut self, per: usize) -> Job {
        self.per_node = Some(per.max(1));
        self
    }

    /// Runs the launcher (or the program) in directory `d`.
    pub fn in_dir(mut self, d: impl Into<PathBuf>) -> Job {
        self.dir = Some(d.into());
        self
    }

    /// Sets the time limit. Through `tmpirun` it becomes `--timeout`; the harness kills the
    /// launcher itself only if it overruns that by 15 s.
    pub fn timeout(mut self, t: Duration) -> Job {
        self.timeout = t;
        self
    }

    fn command(&self) -> Command {
        let mut cmd = match self.np {
            Some(np) => {
                let mut c = Command::new(tmpirun());
                c.arg("-n").arg(np.to_string()).arg("--timeout").arg(format!("{}", self.timeout.as_secs_f64())).args(&self.launcher_flags);
                if let Some(per) = self.per_node {
                    c.args(["sh", "-c", &format!("TMPI_NODE_ID=node$((TMPI_RANK / {per})) exec \"$0\" \"$@\"")]);
                }
                c.arg(&self.program);
                c
            }
            None => Command::new(&self.program),
        };
        cmd.args(&self.args);
        for (k, _) in std::env::vars_os() {
            if k.to_string_lossy().starts_with("TMPI_") {
                cmd.env_remove(&k);
            }
        }
        cmd.envs(self.env.iter().map(|(k, v)| (k, v)));
        cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
        if let Some(d) = &self.dir {
            cmd.current_dir(d);
        }
        cmd
    }

    /// The command line, for messages.
    pub fn describe(&self) -> String {
        let c = self.command();
        let mut s = String::new();
        for (k, v) in c.get_envs() {
            if let Some(v) = v {
                let _ = write!(s, "{}={} ", k.to_string_lossy(), v.to_string_lossy());
            }
        }
        let _ = write!(s, "{}", c.get_program().to_string_lossy());
        for a in c.get_args() {
            let _ = write!(s, " {}", a.to_string_lossy());
        }
        s
    }

    /// Runs the job to completion (or until the time limit) and returns what happened.
    ///
    /// # Panics
    /// If the program cannot be started at all.
    pub fn run(&self) -> Outcome {
        let _serial = JOB_LOCK.lock().unwrap_or_else(|e| e.into_inner());
        let shm_before = shm_files();
        let mut cmd = self.command();
        let start = Instant::now();
        let mut child = cmd.spawn().unwrap_or_else(|e| panic!("cannot start {}: {e}", self.describe()));
        let pid = child.id();
        let out_rx = drain(child.stdout.take());
        let err_rx = drain(child.stderr.take());
        let limit = match self.np {
            Some(_) => self.timeout + LAUNCHER_GRACE,
            None => self.timeout,
        };
        let mut killed_by_harness = false;
        let mut nap = Duration::from_millis(1);
        let status = loop {
            match child.try_wait() {
                Ok(Some(st)) => break st,
                Ok(None) => {}
                Err(e) => panic!("waiting for {}: {e}", self.describe()),
            }
            if start.elapsed() > limit {
                killed_by_harness = true;
                break stop(&mut child);
            }
            std::thread::sleep(nap);
            nap = (nap * 2).min(Duration::from_millis(10));
        };
        let elapsed = start.elapsed();
        let unfinished = || b"<output not closed within 10 s of exit>".to_vec();
        let stdout = out_rx.recv_timeout(Duration::from_secs(10)).unwrap_or_else(|_| unfinished());
        let stderr = err_rx.recv_timeout(Duration::from_secs(10)).unwrap_or_else(|_| unfinished());
        let shm_after = shm_files();
        Outcome {
            command: self.describe(),
            status,
            elapsed,
            killed_by_harness,
            stdout: String::from_utf8_lossy(&stdout).into_owned(),
            stderr: String::from_utf8_lossy(&stderr).into_owned(),
            shm_new: shm_after.difference(&shm_before).cloned().collect(),
            pid,
        }
    }
}

/// Reads a pipe to its end on a thread; the bytes arrive on the channel.
fn drain<R: Read + Send + 'static>(pipe: Option<R>) -> mpsc::Receiver<Vec<u8>> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut buf = Vec::new();
        if let Some(mut p) = pipe {
            let _ = p.read_to_end(&mut buf);
        }
        let _ = tx.send(buf);
    });
    rx
}

/// Ends a child that overran its limit: SIGTERM first (tmpirun then cleans up), SIGKILL after
/// 5 s.
fn stop(child: &mut std::process::Child) -> ExitStatus {
    if let Ok(pid) = i32::try_from(child.id()) {
        // SAFETY: kill(2) on the pid of our own child, which has not been reaped yet (we hold
        // the `Child` and only `try_wait` reaps it), so the pid cannot have been reused.
        unsafe {
            libc::kill(pid, libc::SIGTERM);
        }
    }
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(5) {
        if let Ok(Some(st)) = child.try_wait() {
            return st;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    child.wait().expect("wait for a killed child")
}

/// What a [`Job`] did.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// The command line that ran.
    pub command: String,
    /// Its exit status.
    pub status: ExitStatus,
    /// Wall time from start to exit.
    pub elapsed: Duration,
    /// True when the harness had to kill the job (it overran its limit).
    pub killed_by_harness: bool,
    /// Everything written to stdout.
    pub stdout: String,
    /// Everything written to stderr.
    pub stderr: String,
    /// `/dev/shm/tmpi-*` files present after the job that were not there before it.
    pub shm_new: Vec<String>,
    /// Pid of the process the harness started (`tmpirun`, or the program itself).
    pub pid: u32,
}

/// The job id in a job file's name (`tmpi-<16 hex>...`).
fn job_of(file: &str) -> Option<&str> {
    let id = file.strip_prefix("tmpi-")?.get(..16)?;
    id.bytes().all(|b| b.is_ascii_hexdigit()).then_some(id)
}

/// Whether the files of job `jobid` belong to another `tmpirun` that is still running: its
/// `/dev/shm/tmpi-<jobid>.launcher` file names a live process other than `ours`. Tests run
/// jobs in parallel, and such files appearing during a job are not that job's leak.
fn another_live_job(jobid: &str, ours: u32) -> bool {
    let Ok(s) = std::fs::read_to_string(format!("/dev/shm/tmpi-{jobid}.launcher")) else { return false };
    match s.split_whitespace().next().and_then(|p| p.parse::<i32>().ok()) {
        Some(pid) => pid as u32 != ours && pid_exists(pid),
        None => false,
    }
}

impl Outcome {
    /// The exit code, `None` if the process was killed by a signal.
    pub fn code(&self) -> Option<i32> {
        self.status.code()
    }

    /// Whether the job exited with status 0 in time.
    pub fn success(&self) -> bool {
        self.status.success() && !self.killed_by_harness
    }

    /// The lines of stdout.
    pub fn stdout_lines(&self) -> Vec<&str> {
        self.stdout.lines().collect()
    }

    /// A multi-line account of the run for failure messages (long output is shortened).
    pub fn report(&self) -> String {
        fn tail(s: &str) -> &str {
            const MAX: usize = 6000;
            if s.len() <= MAX {
                return s;
            }
            let mut cut = s.len() - MAX;
            while !s.is_char_boundary(cut) {
                cut += 1;
            }
            &s[cut..]
        }
        format!(
            "command: {}\nstatus: {}{} after {:.2?}\nnew /dev/shm files: {:?}\n--- stdout ---\n{}\n--- stderr ---\n{}\n---",
            self.command,
            self.status,
            if self.killed_by_harness { " (killed by the test harness: time limit)" } else { "" },
            self.elapsed,
            self.shm_new,
            tail(&self.stdout),
            tail(&self.stderr)
        )
    }

    /// Panics with [`Outcome::report`] unless the job exited 0.
    pub fn assert_success(&self) -> &Self {
        assert!(self.success(), "job failed\n{}", self.report());
        self
    }

    /// The new `/dev/shm/tmpi-*` files that are still there after waiting up to 2 s for them
    /// to go (files of unrelated jobs that end meanwhile are not counted).
    pub fn leaked_shm(&self) -> Vec<String> {
        let t = Instant::now();
        loop {
            let now = shm_files();
            let left: Vec<String> = self
                .shm_new
                .iter()
                .filter(|n| now.contains(*n) && !job_of(n).is_some_and(|j| another_live_job(j, self.pid)))
                .cloned()
                .collect();
            if left.is_empty() || t.elapsed() > Duration::from_secs(2) {
                return left;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Panics unless no `/dev/shm/tmpi-*` file is left by the job.
    pub fn assert_no_leak(&self) -> &Self {
        let left = self.leaked_shm();
        assert!(left.is_empty(), "/dev/shm files left after the job: {left:?}\n{}", self.report());
        self
    }

    /// Panics unless the job succeeded, left no `/dev/shm` file, and printed exactly one stdout
    /// line that starts with `prefix` and ends with `OK`; returns that line.
    pub fn assert_ok_line(&self, prefix: &str) -> String {
        self.assert_success();
        self.assert_no_leak();
        let hits: Vec<&str> = self.stdout.lines().filter(|l| l.starts_with(prefix) && l.trim_end().ends_with("OK")).collect();
        assert!(hits.len() == 1, "expected one line `{prefix}...OK`, found {}\n{}", hits.len(), self.report());
        hits[0].to_string()
    }

    /// `(rank, pid)` from the `tmpirun: rank R pid P` lines of `--report-pids`.
    pub fn reported_pids(&self) -> Vec<(usize, i32)> {
        self.stderr
            .lines()
            .filter_map(|l| {
                let rest = l.trim().strip_prefix("tmpirun: rank ")?;
                let (r, p) = rest.split_once(" pid ")?;
                Some((r.trim().parse().ok()?, p.trim().parse().ok()?))
            })
            .collect()
    }
}

/// Failed checks of one rank of a test program, reported together at the end.
///
/// ```no_run
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let world = tmpi::init()?;
/// let mut v = tmpi_tests::Verdict::new("demo", world.rank());
/// v.check(world.size() >= 1, || "size is zero".into());
/// v.finish(&world, "sizes")?; // rank 0 prints "demo: sizes: OK" if every rank passed
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Verdict {
    name: &'static str,
    rank: usize,
    checks: u64,
    failures: Vec<String>,
}

/// At most this many failures per rank are printed.
const MAX_PRINTED: usize = 25;

impl Verdict {
    /// An empty verdict for program `name` on `rank`.
    pub fn new(name: &'static str, rank: usize) -> Verdict {
        Verdict { name, rank, checks: 0, failures: Vec::new() }
    }

    /// Records a check; `what` describes the failure and is only built when `ok` is false.
    pub fn check(&mut self, ok: bool, what: impl FnOnce() -> String) {
        self.checks += 1;
        if !ok {
            let msg = what();
            if self.failures.len() < MAX_PRINTED {
                eprintln!("{}: rank {}: FAILED: {msg}", self.name, self.rank);
            }
            self.failures.push(msg);
        }
    }

    /// Records that `r` is an error accepted by `expected` (described by `want`).
    pub fn check_err<T: std::fmt::Debug>(&mut self, r: tmpi::Result<T>, expected: impl FnOnce(&tmpi::Error) -> bool, want: &str) {
        match r {
            Err(e) => {
                let ok = expected(&e);
                self.check(ok, || format!("expected {want}, got error {e:?} ({e})"));
            }
            Ok(v) => self.check(false, || format!("expected {want}, got Ok({v:?})")),
        }
    }

    /// Number of checks made so far.
    pub fn checks(&self) -> u64 {
        self.checks
    }

    /// Number of failed checks so far.
    pub fn failures(&self) -> usize {
        self.failures.len()
    }

    /// Combines the verdicts of every rank of `comm` (collective). Rank 0 prints
    /// `<name>: <summary>: OK` when no rank failed a check.
    ///
    /// # Errors
    /// A communication error, or a message counting the failed checks of all ranks.
    pub fn finish(self, comm: &tmpi::Comm, summary: &str) -> Result<(), Box<dyn std::error::Error>> {
        let mut totals = [0u64; 2];
        comm.allreduce(&[self.failures.len() as u64, self.checks], &mut totals, tmpi::Op::Sum)?;
        if totals[0] != 0 {
            return Err(format!(
                "{}: {} of {} checks failed across {} ranks (this rank: {})",
                self.name,
                totals[0],
                totals[1],
                comm.size(),
                self.failures.len()
            )
            .into());
        }
        if comm.rank() == 0 {
            println!("{}: {summary}: {} checks: OK", self.name, totals[1]);
        }
        Ok(())
    }
}

/// Makes `process_vm_readv` and `process_vm_writev` fail with `EPERM` in this process and
/// everything it starts afterwards (a seccomp filter, as container runtimes install), so a
/// test program can check the fallback from single copy to the rings. Call it before
/// `tmpi::init`, while the process has one thread.
///
/// # Errors
/// The kernel refused the filter.
pub fn deny_cma() -> std::io::Result<()> {
    const LD_NR: u16 = 0x20; // BPF_LD | BPF_W | BPF_ABS
    const JEQ: u16 = 0x15; // BPF_JMP | BPF_JEQ | BPF_K
    const RET: u16 = 0x06; // BPF_RET | BPF_K
    const RET_ERRNO: u32 = 0x0005_0000;
    const RET_ALLOW: u32 = 0x7fff_0000;
    let f = |code, jt, jf, k| libc::sock_filter { code, jt, jf, k };
    let mut prog = [
        f(LD_NR, 0, 0, 0), // seccomp_data.nr
        f(JEQ, 2, 0, libc::SYS_process_vm_readv as u32),
        f(JEQ, 1, 0, libc::SYS_process_vm_writev as u32),
        f(RET, 0, 0, RET_ALLOW),
        f(RET, 0, 0, RET_ERRNO | libc::EPERM as u32),
    ];
    let fprog = libc::sock_fprog { len: prog.len() as u16, filter: prog.as_mut_ptr() };
    // SAFETY: prctl with integer arguments only.
    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fprog` points at `prog`, a valid filter program that lives across the call (the
    // kernel copies it).
    if unsafe { libc::prctl(libc::PR_SET_SECCOMP, libc::SECCOMP_MODE_FILTER, &fprog as *const libc::sock_fprog) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// A small deterministic generator (xorshift64*) for the seeded test programs (`randmix`,
/// `randcoll`): every rank seeded alike draws the same plan.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator for `seed` mixed with `salt` (distinct salts give independent streams).
    pub fn new(seed: u64, salt: u64) -> Rng {
        Rng(seed.wrapping_mul(salt) | 1)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A number in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n.max(1) as u64) as usize
    }

    /// True `percent` times in 100.
    pub fn chance(&mut self, percent: usize) -> bool {
        self.below(100) < percent
    }
}

/// The number after flag `name` in `args` (`default` without the flag); `program` names the
/// caller in the error.
pub fn number_flag(program: &str, args: &[String], name: &str, default: u64) -> Result<u64, String> {
    match args.iter().position(|a| a == name) {
        None => Ok(default),
        Some(i) => args.get(i + 1).and_then(|v| v.parse().ok()).ok_or_else(|| format!("{program}: {name} takes a number")),
    }
}
