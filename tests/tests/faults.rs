//! Fault injection through the real `tmpirun`: for each way a job can fail, fifty jobs in a
//! row, each checked for
//! - `tmpirun`'s exit status and its message naming the failed rank and how it failed;
//! - the time from the fault to `tmpirun`'s exit (under 2 s);
//! - no rank process left (the pids `tmpirun --report-pids` printed);
//! - no file of the job left: `/dev/shm/tmpi-<jobid>*` and the bootstrap socket's directory.
//!
//! The faults: a rank panics, calls `World::abort(code)`, exits with code 3, is SIGKILLed;
//! `tmpirun` gets SIGTERM or SIGINT (Ctrl-C). Half of the jobs fail while the ranks are
//! running (the others wait in a receive from the failing rank), half while they are still
//! in `tmpi::init`, after rank 0 created the shared-memory segment (so there is a segment
//! for `tmpirun` to remove). The programs are `src/bin/fault_*.rs`.
//!
//! And a `tmpirun` SIGKILLed during start-up (no cleanup runs) leaves the job's files, which
//! the next `tmpirun` removes (it sweeps the files of jobs whose launcher is dead).
//!
//! Uses the release `tmpirun`; build it first:
//! `cargo build --release --workspace --bins && cargo test --release --workspace`.
//! Run with `--nocapture` to see the teardown times (median and max per kind).

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Jobs per kind of fault.
const REPS: usize = 50;
/// Ranks per job: rank 1 is the one that fails (or sleeps), 0 and 2 wait for it.
const NP: usize = 3;
/// Longest allowed time from a fault to `tmpirun`'s exit.
const MAX_TEARDOWN: Duration = Duration::from_secs(2);
/// Longest allowed time for the fifty jobs of one test.
const MAX_TEST: Duration = Duration::from_secs(60);
/// Longest a job may take before the test gives up on it.
const JOB_LIMIT: Duration = Duration::from_secs(20);

/// One job at a time: the timings mean something only on an otherwise idle machine, and the
/// machine may have two cores.
static SERIAL: Mutex<()> = Mutex::new(());

// ---- running one job ----

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Src {
    Out,
    Err,
}

/// A job running under `tmpirun --report-pids`, its output read line by line.
struct Job {
    child: Child,
    lines: mpsc::Receiver<(Src, String)>,
    out: Vec<String>,
    err: Vec<String>,
    started: Instant,
}

/// A job that has ended.
struct Ended {
    status: ExitStatus,
    /// When `tmpirun` was seen to exit.
    at: SystemTime,
    out: Vec<String>,
    err: Vec<String>,
}

impl Job {
    fn start(prog: &str, args: &[String]) -> Job {
        let mut child = Command::new(tmpi_tests::tmpirun())
            .args(["-n", &NP.to_string(), "--report-pids", "--timeout"])
            .arg(JOB_LIMIT.as_secs().to_string())
            .arg(prog)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start tmpirun");
        let (tx, rx) = mpsc::channel();
        let out = child.stdout.take().expect("stdout pipe");
        let err = child.stderr.take().expect("stderr pipe");
        for (src, pipe) in [(Src::Out, Box::new(out) as Box<dyn std::io::Read + Send>), (Src::Err, Box::new(err))] {
            let tx = tx.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(pipe).lines() {
                    let Ok(line) = line else { return };
                    if tx.send((src, line)).is_err() {
                        return;
                    }
                }
            });
        }
        Job { child, lines: rx, out: Vec::new(), err: Vec::new(), started: Instant::now() }
    }

    fn record(&mut self, (src, line): (Src, String)) {
        match src {
            Src::Out => self.out.push(line),
            Src::Err => self.err.push(line),
        }
    }

    /// Reads output until `done` holds; panics (after killing the job) if the job ends or
    /// takes too long first.
    fn wait_until(&mut self, what: &str, done: impl Fn(&Job) -> bool) {
        while !done(self) {
            let left = JOB_LIMIT.saturating_sub(self.started.elapsed());
            match self.lines.recv_timeout(left) {
                Ok(l) => self.record(l),
                Err(_) => {
                    let _ = self.child.kill();
                    let _ = self.child.wait();
                    panic!("job ended or hung before {what}\nstdout: {:?}\nstderr: {:?}", self.out, self.err);
                }
            }
        }
    }

    /// The pid of `rank` from `--report-pids`, waiting for it if needed.
    fn rank_pid(&mut self, rank: usize) -> i32 {
        let want = format!("tmpirun: rank {rank} pid ");
        self.wait_until("its pids were reported", |j| j.err.iter().any(|l| l.starts_with(&want)));
        reported_pids(&self.err)[rank]
    }

    /// Waits for `tmpirun` to exit and for the end of its output.
    fn finish(mut self) -> Ended {
        let status = loop {
            if let Some(s) = self.child.try_wait().expect("wait for tmpirun") {
                break s;
            }
            if self.started.elapsed() > JOB_LIMIT + Duration::from_secs(5) {
                let _ = self.child.kill();
                panic!("tmpirun did not exit; stderr: {:?}", self.err);
            }
            // Short sleeps: the exit time is part of what is measured.
            std::thread::sleep(Duration::from_micros(500));
        };
        let at = SystemTime::now();
        // The readers end when every holder of the pipes has gone.
        while let Ok(l) = self.lines.recv_timeout(Duration::from_secs(5)) {
            self.record(l);
        }
        Ended { status, at, out: self.out, err: self.err }
    }
}

/// The pids of `tmpirun: rank R pid P` lines, indexed by rank.
fn reported_pids(err: &[String]) -> Vec<i32> {
    let mut pids = vec![0; NP];
    for l in err {
        let Some(rest) = l.strip_prefix("tmpirun: rank ") else {
            continue;
        };
        let Some((r, p)) = rest.split_once(" pid ") else {
            continue;
        };
        if let (Ok(r), Ok(p)) = (r.parse::<usize>(), p.trim().parse::<i32>()) {
            if r < NP {
                pids[r] = p;
            }
        }
    }
    pids
}

/// `KEY value` from the job's stdout.
fn value<'a>(out: &'a [String], key: &str) -> Option<&'a str> {
    out.iter().find_map(|l| l.strip_prefix(key)?.strip_prefix(' '))
}

fn since_epoch(t: SystemTime) -> Duration {
    t.duration_since(UNIX_EPOCH).unwrap_or_default()
}

/// Whether `pid` is still one of our rank processes: alive (or a zombie nobody reaped) with
/// the program's name. A pid that is gone, or now belongs to another program, is not.
fn ours_still_there(pid: i32, prog: &str) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    let comm = stat.split_once('(').and_then(|(_, r)| r.rsplit_once(')')).map(|(c, _)| c).unwrap_or("");
    // comm is cut to 15 bytes.
    let name: String = prog.chars().take(15).collect();
    comm == name
}

/// How `tmpirun` must report the failure.
enum Report {
    /// `tmpirun: rank R (pid P) HOW`, P the pid it reported for rank R.
    Rank(usize, String),
    /// A line containing this.
    Line(String),
}

/// What a job must end with.
struct Expect<'a> {
    prog: &'a str,
    status: i32,
    report: Report,
    /// Whether the fault came before `tmpi::init` finished (a segment must have existed).
    in_init: bool,
}

/// Checks one ended job; returns the time from `fault_at` to `tmpirun`'s exit.
fn check(rep: usize, e: &Ended, fault_at: SystemTime, want: &Expect<'_>) -> Duration {
    let ctx = format!("rep {rep} of {}: status {:?}\nstdout: {:#?}\nstderr: {:#?}", want.prog, e.status, e.out, e.err);
    assert_eq!(e.status.code(), Some(want.status), "{ctx}");
    let pids = reported_pids(&e.err);
    assert!(pids.iter().all(|&p| p > 0), "pids not reported; {ctx}");
    let line = match &want.report {
        Report::Rank(r, how) => format!("tmpirun: rank {r} (pid {}) {how}", pids[*r]),
        Report::Line(l) => l.clone(),
    };
    assert!(e.err.iter().any(|l| l.contains(&line)), "no {line:?} in stderr; {ctx}");
    assert!(!e.err.iter().any(|l| l.contains("internal error")), "{ctx}");

    let teardown = since_epoch(e.at).saturating_sub(since_epoch(fault_at));
    assert!(teardown < MAX_TEARDOWN, "tmpirun exited {teardown:?} after the fault; {ctx}");

    for (r, &p) in pids.iter().enumerate() {
        assert!(!ours_still_there(p, want.prog), "rank {r} (pid {p}) is still there; {ctx}");
    }

    let jobid = value(&e.out, "JOBID").unwrap_or_else(|| panic!("no JOBID; {ctx}"));
    assert_eq!(jobid.len(), 16, "{ctx}");
    let prefix = format!("tmpi-{jobid}");
    let left: Vec<String> = std::fs::read_dir("/dev/shm")
        .map(|d| d.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).filter(|n| n.starts_with(&prefix)).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "left in /dev/shm: {left:?}; {ctx}");
    if want.in_init {
        let seg = value(&e.out, "SEGMENT").unwrap_or_else(|| panic!("no SEGMENT; {ctx}"));
        assert!(seg.starts_with(&prefix), "{seg}; {ctx}");
    }
    let sock = value(&e.out, "SOCK").unwrap_or_else(|| panic!("no SOCK; {ctx}"));
    let dir = Path::new(sock).parent().expect("socket directory");
    assert!(!dir.exists(), "{} left behind; {ctx}", dir.display());
    teardown
}

/// Prints the teardown times of one kind of fault.
fn summary(kind: &str, mut times: Vec<Duration>, total: Duration) {
    times.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let median = (times[(times.len() - 1) / 2] + times[times.len() / 2]) / 2;
    println!(
        "faults: {kind}: {} jobs in {:.1} s; fault -> tmpirun exit: median {:.1} ms, max {:.1} ms",
        times.len(),
        total.as_secs_f64(),
        ms(median),
        ms(*times.last().unwrap_or(&Duration::ZERO))
    );
    assert!(total < MAX_TEST, "{kind}: {REPS} jobs took {total:?}");
}

/// The fault time a rank printed (`FAULT_AT <ns>` on stderr).
fn fault_stamp(e: &Ended) -> SystemTime {
    let ns: u64 = e
        .err
        .iter()
        .find_map(|l| l.strip_prefix("FAULT_AT ")?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no FAULT_AT line: {:?}", e.err));
    UNIX_EPOCH + Duration::from_nanos(ns)
}

/// `run` or `init`, alternating.
fn phase(rep: usize) -> &'static str {
    if rep % 2 == 0 {
        "run"
    } else {
        "init"
    }
}

/// Runs REPS jobs of a program whose rank 1 fails by itself.
fn self_failing(kind: &str, prog: &str, args: impl Fn(usize) -> Vec<String>, want: impl Fn(usize) -> Expect<'static>) {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let t = Instant::now();
    let mut times = Vec::with_capacity(REPS);
    for rep in 0..REPS {
        let e = Job::start(prog, &args(rep)).finish();
        times.push(check(rep, &e, fault_stamp(&e), &want(rep)));
    }
    summary(kind, times, t.elapsed());
}

#[test]
fn a_panicking_rank_ends_the_job() {
    self_failing(
        "panic",
        env!("CARGO_BIN_EXE_fault_panic"),
        |rep| vec![phase(rep).into()],
        |rep| Expect {
            prog: "fault_panic",
            status: 101,
            report: Report::Rank(1, "exited with code 101".into()),
            in_init: phase(rep) == "init",
        },
    );
}

#[test]
fn an_aborting_rank_ends_the_job_with_its_code() {
    // A different code each time: the status must be the one given to abort.
    let code = |rep: usize| 10 + rep as i32;
    self_failing(
        "abort",
        env!("CARGO_BIN_EXE_fault_abort"),
        |rep| vec![code(rep).to_string()],
        |rep| Expect {
            prog: "fault_abort",
            status: code(rep),
            report: Report::Line(format!("tmpirun: rank 1 called abort with code {}", code(rep))),
            in_init: false,
        },
    );
}

#[test]
fn a_rank_exiting_with_3_ends_the_job() {
    self_failing(
        "exit(3)",
        env!("CARGO_BIN_EXE_fault_exit"),
        |rep| vec!["3".into(), phase(rep).into()],
        |rep| Expect { prog: "fault_exit", status: 3, report: Report::Rank(1, "exited with code 3".into()), in_init: phase(rep) == "init" },
    );
}

/// Starts `fault_hang` and waits until it is where the fault should hit: every rank
/// `READY` (run phase), or rank 1 `READY` next to an existing segment (init phase).
fn hung_job(rep: usize) -> Job {
    let mut job = Job::start(env!("CARGO_BIN_EXE_fault_hang"), &[phase(rep).to_string()]);
    let want = if phase(rep) == "run" { NP } else { 1 };
    job.wait_until("the ranks were ready", |j| {
        j.out.iter().filter(|l| l.starts_with("READY ")).count() == want && j.out.iter().any(|l| l.starts_with("JOBID "))
    });
    job
}

fn kill(pid: i32, sig: i32) {
    // SAFETY: kill(2) has no memory effects; `pid` is a process this test started (tmpirun)
    // or one of its ranks, which tmpirun has not reaped (it reaps only after every rank ended).
    let rc = unsafe { libc::kill(pid, sig) };
    assert_eq!(rc, 0, "kill({pid}, {sig}): {}", std::io::Error::last_os_error());
}

#[test]
fn a_sigkilled_rank_ends_the_job() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let t = Instant::now();
    let mut times = Vec::with_capacity(REPS);
    for rep in 0..REPS {
        let mut job = hung_job(rep);
        // The sleeping rank 1, or a rank waiting for it (in a receive, or in init).
        let victim = [1, 0, 1, 2][rep % 4];
        let pid = job.rank_pid(victim);
        let at = SystemTime::now();
        kill(pid, libc::SIGKILL);
        let e = job.finish();
        let want = Expect {
            prog: "fault_hang",
            status: 128 + libc::SIGKILL,
            report: Report::Rank(victim, "killed by signal SIGKILL (9)".into()),
            in_init: phase(rep) == "init",
        };
        assert_eq!(reported_pids(&e.err)[victim], pid);
        times.push(check(rep, &e, at, &want));
    }
    summary("SIGKILL of a rank", times, t.elapsed());
}

#[test]
fn sigterm_or_sigint_to_tmpirun_ends_the_job() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let t = Instant::now();
    let mut times = Vec::with_capacity(REPS);
    for rep in 0..REPS {
        let mut job = hung_job(rep);
        // SIGTERM mostly; every fourth job a Ctrl-C (SIGINT).
        let (sig, name) = if rep % 4 == 3 { (libc::SIGINT, "SIGINT") } else { (libc::SIGTERM, "SIGTERM") };
        let _ = job.rank_pid(NP - 1); // every pid reported before the signal
        let at = SystemTime::now();
        kill(job.child.id() as i32, sig);
        let e = job.finish();
        let want = Expect {
            prog: "fault_hang",
            status: 128 + sig,
            report: Report::Line(format!("tmpirun: got {name}; forwarding it to the ranks")),
            in_init: phase(rep) == "init",
        };
        times.push(check(rep, &e, at, &want));
    }
    summary("SIGTERM/SIGINT to tmpirun", times, t.elapsed());
}

#[test]
fn files_of_a_sigkilled_tmpirun_are_swept_by_the_next_one() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    // Rank 1 waits beside the segment rank 0 created, rank 0 waits in init: start-up.
    let mut job = Job::start(env!("CARGO_BIN_EXE_fault_hang"), &["init".to_string()]);
    job.wait_until("the segment existed", |j| ["JOBID ", "SOCK ", "SEGMENT "].iter().all(|k| j.out.iter().any(|l| l.starts_with(k))));
    let _ = job.rank_pid(NP - 1);
    let launcher = job.child.id() as i32;
    kill(launcher, libc::SIGKILL);
    let e = job.finish();
    assert_eq!(e.status.code(), None, "tmpirun was SIGKILLed");
    let jobid = value(&e.out, "JOBID").expect("JOBID").to_string();
    let seg = format!("/dev/shm/{}", value(&e.out, "SEGMENT").expect("SEGMENT"));
    let dir = Path::new(value(&e.out, "SOCK").expect("SOCK")).parent().expect("socket directory").to_path_buf();
    let launcher_file = format!("/dev/shm/tmpi-{jobid}.launcher");
    // What a SIGKILLed launcher leaves: nothing ran its cleanup.
    for p in [Path::new(&seg), Path::new(&launcher_file), dir.as_path()] {
        assert!(p.exists(), "{} should have been left by the killed tmpirun (stderr {:?})", p.display(), e.err);
    }
    // Its ranks die with it (PR_SET_PDEATHSIG).
    let t = Instant::now();
    let pids = reported_pids(&e.err);
    while pids.iter().any(|&p| ours_still_there(p, "fault_hang")) && t.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(10));
    }
    // The next tmpirun, whatever it runs, removes them.
    let out = Command::new(tmpi_tests::tmpirun()).args(["-n", "1", "true"]).output().expect("run tmpirun -n 1 true");
    assert!(out.status.success(), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&jobid), "the sweep names the job it cleaned: {err}");
    for p in [Path::new(&seg), Path::new(&launcher_file), dir.as_path()] {
        assert!(!p.exists(), "{} is still there after the next tmpirun", p.display());
    }
}
