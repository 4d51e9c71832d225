//! The fault matrix (issue 12): through the real `tmpirun`, at 2, 3 and 5 ranks, the last rank
//! fails in each of eight ways while the others wait on it in each of six ways
//! (`src/bin/faultmatrix.rs`). Every job is checked for
//! - `tmpirun`'s exit status: non-zero, and the one defined for the fault (`exit(3)` gives 3,
//!   a signal N gives 128 + N, an `Err` from `main` 1, a panic 101, an exit 0 without finalize
//!   1);
//! - the time from the fault (a timestamp the faulty rank prints just before it) to
//!   `tmpirun`'s exit: at most [`MAX_TEARDOWN`];
//! - the report naming the faulty rank and how it ended: `tmpirun: rank R (pid P) HOW`;
//! - no rank process left (the pids `--report-pids` printed), no `/dev/shm/tmpi-<jobid>*`
//!   file left.
//!
//! Plus the clean case: the last of 3 (and 5) ranks finalizes early while the others go on
//! among themselves; the job must succeed. And strangers knocking at a starting job's
//! bootstrap socket neither get in nor disturb it.
//!
//! Several jobs run at once ([`PARALLEL`] threads) so that the 144 jobs fit in CI's time; every
//! job has a `--timeout`, so a hang fails the job instead of CI. Uses the release binaries:
//! `cargo build --release --workspace --bins && cargo test --release -p tmpi-tests --test
//! fault_matrix`. Run with `--nocapture` to see the teardown times.

use std::io::{BufRead, BufReader};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Condvar, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Longest allowed time from the fault to `tmpirun`'s exit.
const MAX_TEARDOWN: Duration = Duration::from_secs(2);
/// `--timeout` of every job: far above what a job needs, so only a hang reaches it.
const JOB_TIMEOUT_SECS: u64 = 20;
/// Jobs running at once.
const PARALLEL: usize = 3;
/// Job sizes of the matrix.
const SIZES: [usize; 3] = [2, 3, 5];
/// Peer states (see the program's docs).
const STATES: [&str; 6] = ["recv", "any", "allreduce", "rndv", "requests", "barrier"];

/// A fault, the status `tmpirun` must end with, and how the report says the rank ended.
struct Fault {
    name: &'static str,
    status: i32,
    how: &'static str,
    /// Text the quoted last error line must contain, if any.
    quote: Option<&'static str>,
}

const FAULTS: [Fault; 8] = [
    Fault { name: "err", status: 1, how: "exited with code 1", quote: Some("Error: ") },
    Fault { name: "panic", status: 101, how: "exited with code 101", quote: Some("a deliberate panic") },
    Fault { name: "exit0", status: 1, how: "exited with code 0 without finalizing", quote: None },
    Fault { name: "exit3", status: 3, how: "exited with code 3", quote: None },
    Fault { name: "forget", status: 1, how: "exited with code 0 without finalizing", quote: None },
    Fault { name: "sigkill", status: 128 + libc::SIGKILL, how: "killed by signal SIGKILL (9)", quote: None },
    Fault { name: "sigsegv", status: 128 + libc::SIGSEGV, how: "killed by signal SIGSEGV (11)", quote: None },
    Fault { name: "abort", status: 128 + libc::SIGABRT, how: "killed by signal SIGABRT (6)", quote: None },
];

/// Jobs running now in this test process (all tests together stay within [`PARALLEL`]).
static RUNNING: Mutex<usize> = Mutex::new(0);
static SLOT_FREED: Condvar = Condvar::new();

/// A place among the [`PARALLEL`] jobs that may run at once; given back on drop.
struct Slot;

impl Slot {
    fn take() -> Slot {
        let mut n = RUNNING.lock().unwrap_or_else(|e| e.into_inner());
        while *n >= PARALLEL {
            n = SLOT_FREED.wait(n).unwrap_or_else(|e| e.into_inner());
        }
        *n += 1;
        Slot
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        *RUNNING.lock().unwrap_or_else(|e| e.into_inner()) -= 1;
        SLOT_FREED.notify_one();
    }
}

/// What a job did.
struct Ended {
    status: ExitStatus,
    /// When `tmpirun` was seen to exit.
    at: SystemTime,
    elapsed: Duration,
    out: Vec<String>,
    err: Vec<String>,
}

impl Ended {
    fn context(&self, what: &str) -> String {
        format!("{what}: status {:?} after {:.2?}\nstdout: {:#?}\nstderr: {:#?}", self.status, self.elapsed, self.out, self.err)
    }

    /// `(rank, pid)` of the `--report-pids` lines.
    fn pids(&self) -> Vec<(usize, i32)> {
        self.err
            .iter()
            .filter_map(|l| {
                let (r, p) = l.strip_prefix("tmpirun: rank ")?.split_once(" pid ")?;
                Some((r.parse().ok()?, p.trim().parse().ok()?))
            })
            .collect()
    }

    fn fault_at(&self) -> Option<SystemTime> {
        let ns: u64 = self.err.iter().find_map(|l| l.strip_prefix("FAULT_AT ")?.trim().parse().ok())?;
        Some(UNIX_EPOCH + Duration::from_nanos(ns))
    }

    fn jobid(&self) -> Option<&str> {
        self.out.iter().find_map(|l| l.strip_prefix("JOBID ")).map(str::trim)
    }
}

/// Runs `tmpirun -n np --report-pids --timeout T faultmatrix args...` to its end.
fn run(np: usize, args: &[&str]) -> Ended {
    run_with(np, &[], args)
}

/// [`run`] with `env` (`KEY=VALUE` strings) passed to every rank (`tmpirun -x`).
fn run_with(np: usize, env: &[&str], args: &[&str]) -> Ended {
    let _slot = Slot::take();
    let start = Instant::now();
    let mut child = Command::new(tmpi_tests::tmpirun())
        .args(env.iter().flat_map(|e| ["-x", e]))
        .args(["-n", &np.to_string(), "--report-pids", "--timeout", &JOB_TIMEOUT_SECS.to_string()])
        .arg(env!("CARGO_BIN_EXE_faultmatrix"))
        .args(args)
        .env_remove("RUST_BACKTRACE")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start tmpirun");
    let (tx, rx) = mpsc::channel();
    let out = child.stdout.take().expect("stdout pipe");
    let err = child.stderr.take().expect("stderr pipe");
    for (is_err, pipe) in [(false, Box::new(out) as Box<dyn std::io::Read + Send>), (true, Box::new(err))] {
        let tx = tx.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(pipe).lines() {
                let Ok(line) = line else { return };
                if tx.send((is_err, line)).is_err() {
                    return;
                }
            }
        });
    }
    drop(tx);
    let limit = Duration::from_secs(JOB_TIMEOUT_SECS + 15);
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait for tmpirun") {
            break s;
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            break child.wait().expect("wait for killed tmpirun");
        }
        // Short naps: the exit time is what is measured.
        std::thread::sleep(Duration::from_millis(1));
    };
    let at = SystemTime::now();
    let elapsed = start.elapsed();
    let (mut o, mut e) = (Vec::new(), Vec::new());
    while let Ok((is_err, l)) = rx.recv_timeout(Duration::from_secs(5)) {
        if is_err {
            e.push(l)
        } else {
            o.push(l)
        }
    }
    Ended { status, at, elapsed, out: o, err: e }
}

/// Whether `pid` is still a process of `prog` (alive or an unreaped zombie).
fn still_there(pid: i32, prog: &str) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    let comm = stat.split_once('(').and_then(|(_, r)| r.rsplit_once(')')).map(|(c, _)| c).unwrap_or("");
    comm == prog.chars().take(15).collect::<String>()
}

/// The checks every ended job must pass: all ranks reported and gone, no file of the job.
fn check_cleanup(e: &Ended, np: usize, ctx: &str) -> Result<(), String> {
    let pids = e.pids();
    if pids.len() != np {
        return Err(format!("{} --report-pids lines for {np} ranks\n{ctx}", pids.len()));
    }
    // tmpirun reaps every rank before it exits; allow a moment for /proc to catch up.
    let t = Instant::now();
    while pids.iter().any(|&(_, p)| still_there(p, "faultmatrix")) && t.elapsed() < Duration::from_secs(1) {
        std::thread::sleep(Duration::from_millis(10));
    }
    for &(r, p) in &pids {
        if still_there(p, "faultmatrix") {
            return Err(format!("rank {r} (pid {p}) is still there after tmpirun exited\n{ctx}"));
        }
    }
    let jobid = e.jobid().ok_or_else(|| format!("no JOBID line\n{ctx}"))?;
    let prefix = format!("tmpi-{jobid}");
    // libfabric's `shm` provider names its regions `<pid>:<domain>:<endpoint>`: a rank killed
    // over it leaves one, which tmpirun removes before it reaps the rank.
    let provider: Vec<String> = pids.iter().map(|&(_, p)| format!("{p}:")).collect();
    let ours = |n: &str| n.starts_with(&prefix) || provider.iter().any(|p| n.starts_with(p.as_str()));
    let left: Vec<String> = std::fs::read_dir("/dev/shm")
        .map(|d| d.flatten().map(|f| f.file_name().to_string_lossy().into_owned()).filter(|n| ours(n)).collect())
        .unwrap_or_default();
    if !left.is_empty() {
        return Err(format!("left in /dev/shm: {left:?}\n{ctx}"));
    }
    Ok(())
}

/// One case of the matrix (its ranks get `env`); `Ok(teardown time)` or what was wrong.
fn fault_case(np: usize, fault: &Fault, state: &str, env: &[&str]) -> Result<Duration, String> {
    let e = run_with(np, env, &[fault.name, state]);
    let ctx = e.context(&format!("np {np}, fault {}, peers in {state}", fault.name));
    let code = e.status.code();
    if code == Some(124) {
        return Err(format!("the job hung until its --timeout\n{ctx}"));
    }
    if code != Some(fault.status) {
        return Err(format!("exit status {code:?}, want {}\n{ctx}", fault.status));
    }
    let victim = np - 1;
    let pid = e.pids().iter().find(|&&(r, _)| r == victim).map(|&(_, p)| p).ok_or_else(|| format!("no pid for rank {victim}\n{ctx}"))?;
    let want = format!("tmpirun: rank {victim} (pid {pid}) {}", fault.how);
    let Some(line) = e.err.iter().find(|l| l.starts_with(&want)) else {
        return Err(format!("no line starting with {want:?}\n{ctx}"));
    };
    if let Some(q) = fault.quote {
        if !line.contains("its last error line: \"") || !line.contains(q) {
            return Err(format!("the report does not quote the rank's error ({q:?}): {line:?}\n{ctx}"));
        }
    }
    let fault_at = e.fault_at().ok_or_else(|| format!("no FAULT_AT line\n{ctx}"))?;
    let teardown = e.at.duration_since(fault_at).unwrap_or_default();
    if teardown > MAX_TEARDOWN {
        return Err(format!("tmpirun exited {teardown:.2?} after the fault (limit {MAX_TEARDOWN:?})\n{ctx}"));
    }
    check_cleanup(&e, np, &ctx)?;
    Ok(teardown)
}

/// Runs `cases` on [`PARALLEL`] threads; returns the failures (and prints the times).
fn run_all<C: Sync>(cases: &[C], label: impl Fn(&C) -> String + Sync, one: impl Fn(&C) -> Result<Duration, String> + Sync) -> Vec<String> {
    let next = AtomicUsize::new(0);
    let failures = Mutex::new(Vec::new());
    let times = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..PARALLEL {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(c) = cases.get(i) else { return };
                match one(c) {
                    Ok(t) => times.lock().unwrap_or_else(|e| e.into_inner()).push(t),
                    Err(why) => failures.lock().unwrap_or_else(|e| e.into_inner()).push(format!("[{}] {why}", label(c))),
                }
            });
        }
    });
    let mut times = times.into_inner().unwrap_or_else(|e| e.into_inner());
    times.sort();
    if let (Some(first), Some(last)) = (times.first(), times.last()) {
        println!(
            "fault matrix: {} of {} cases passed; fault -> tmpirun exit: min {:.0?}, median {:.0?}, max {:.0?}",
            times.len(),
            cases.len(),
            first,
            times[times.len() / 2],
            last
        );
    }
    failures.into_inner().unwrap_or_else(|e| e.into_inner())
}

/// Every fault at every size while the peers are in `states`.
fn matrix(states: &[&'static str]) {
    matrix_on(&SIZES, states, &[]);
}

/// Every fault at each of `sizes` while the peers are in `states`, the ranks getting `env`.
fn matrix_on(sizes: &[usize], states: &[&'static str], env: &[&str]) {
    let mut cases = Vec::new();
    for &np in sizes {
        for f in &FAULTS {
            for &st in states {
                cases.push((np, f, st));
            }
        }
    }
    let t = Instant::now();
    let failures = run_all(&cases, |(np, f, st)| format!("np {np} {} {st}", f.name), |&(np, f, st)| fault_case(np, f, st, env));
    println!("fault matrix {states:?}: {} jobs in {:.1?}", cases.len(), t.elapsed());
    if !failures.is_empty() {
        let names: Vec<&str> = failures.iter().map(|f| f.lines().next().unwrap_or("")).collect();
        panic!("{} of {} cases failed:\n{}\n\n{}", failures.len(), cases.len(), names.join("\n"), failures.join("\n\n"));
    }
}

// The matrix is split by peer state into tests of 24 jobs, so that a failure says where and
// cargo's own parallelism can interleave them with the other tests.

#[test]
fn faults_while_peers_receive_from_the_faulty_rank() {
    matrix(&[STATES[0]]);
}

#[test]
fn faults_while_peers_receive_from_any_source() {
    matrix(&[STATES[1]]);
}

#[test]
fn faults_while_peers_are_in_an_allreduce() {
    matrix(&[STATES[2]]);
}

#[test]
fn faults_while_peers_send_8_mib_to_the_faulty_rank() {
    matrix(&[STATES[3]]);
}

#[test]
fn faults_while_peers_wait_on_requests() {
    matrix(&[STATES[4]]);
}

#[test]
fn faults_while_peers_are_in_a_barrier() {
    matrix(&[STATES[5]]);
}

/// The matrix over libfabric's OFI fabric (issue 57 item 5: every promise of the failure
/// section holds over OFI): every fault while the peers wait in every state, at 3 ranks, over
/// the `tcp` provider on loopback. `cargo test --release -p tmpi-tests --features ofi --test
/// fault_matrix ofi_` (`.ci/run`'s OFI step).
#[cfg(feature = "ofi")]
#[test]
fn ofi_faults_while_peers_wait_in_every_state() {
    matrix_on(&[3], &STATES, &["TMPI_FABRIC=ofi", "TMPI_OFI_PROVIDER=tcp", "FI_TCP_IFACE=lo"]);
}

/// The same over libfabric's `shm` provider (issue 57 item 6), which tells no sender that
/// its peer died: the runtime learns it from the peers' process ids.
#[cfg(feature = "ofi")]
#[test]
fn ofi_shm_faults_while_peers_wait_in_every_state() {
    matrix_on(&[3], &STATES, &["TMPI_FABRIC=ofi", "TMPI_OFI_PROVIDER=shm"]);
}

/// The last rank finalizes and leaves early; the others go on among themselves.
#[test]
fn an_early_clean_finalize_is_not_a_failure() {
    let cases = [3usize, 5];
    let failures = run_all(
        &cases,
        |np| format!("early finalize at {np} ranks"),
        |&np| {
            let t = Instant::now();
            let e = run(np, &["early"]);
            let ctx = e.context(&format!("early finalize, np {np}"));
            if e.status.code() != Some(0) {
                return Err(format!("the job failed\n{ctx}"));
            }
            if !e.out.iter().any(|l| l.starts_with("faultmatrix: early finalize: ") && l.ends_with("OK")) {
                return Err(format!("no OK line\n{ctx}"));
            }
            if !e.out.iter().any(|l| l == &format!("LEFT {}", np - 1)) {
                return Err(format!("the last rank did not report leaving\n{ctx}"));
            }
            check_cleanup(&e, np, &ctx)?;
            Ok(t.elapsed())
        },
    );
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// Says hello as `rank` of `size` with `secret` through the real client (it answers the
/// server's challenge with an HMAC under `secret`); whether the server refused.
fn hello_refused(sock: &str, rank: usize, size: usize, secret: [u8; 16]) -> bool {
    let secret = tmpi_transport::bootstrap::JobSecret::from_bytes(secret);
    tmpi_transport::bootstrap::BootstrapClient::connect(std::path::Path::new(sock), rank, size, &secret).is_err()
}

/// Connects to the bootstrap socket, sends `bytes`, and returns whether the server closed
/// the connection (after at most an error reply) instead of admitting it.
fn knock(sock: &str, bytes: &[u8]) -> bool {
    use std::io::{Read, Write};
    let Ok(mut s) = std::os::unix::net::UnixStream::connect(sock) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(10)));
    let _ = s.write_all(bytes);
    let mut back = Vec::new();
    match s.read_to_end(&mut back) {
        // An admitted hello gets the 5-byte ok frame [1, 0, 0, 0, 0x80] and the connection
        // stays open (the read times out).
        Ok(_) => back != [1, 0, 0, 0, 0x80],
        // The server closed with our bytes unread: the kernel reports a reset.
        Err(e) => e.kind() == std::io::ErrorKind::ConnectionReset,
    }
}

/// `TMPI_JOB_SECRET` of a running process (a same-user process can read another's
/// environment: which is why the launcher also checks who connects).
fn secret_of(pid: i32) -> Option<[u8; 16]> {
    let env = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
    let hex = env.split(|&b| b == 0).find_map(|v| v.strip_prefix(b"TMPI_JOB_SECRET="))?;
    let hex = std::str::from_utf8(hex).ok()?;
    let mut out = [0u8; 16];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

/// Strangers of the same user try to join a starting job: a hello with a wrong secret, a
/// hello with the right secret (read from a rank's environment) from a process that is not
/// a rank, garbage, and (from inside the job) a rank's child with a wrong secret. Each is
/// refused; the job is not disturbed and succeeds; `tmpirun` reports the first refusal once
/// and counts them all.
#[test]
fn strangers_cannot_join_or_disturb_a_job() {
    let _slot = Slot::take();
    let np = 3;
    let gofile = std::env::temp_dir().join(format!("tmpi-strangers-go-{}", std::process::id()));
    let _ = std::fs::remove_file(&gofile);
    let mut child = std::process::Command::new(tmpi_tests::tmpirun())
        .args(["-n", &np.to_string(), "--report-pids", "--timeout", "30"])
        .arg(env!("CARGO_BIN_EXE_faultmatrix"))
        .arg("strangers")
        .arg(&gofile)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start tmpirun");
    let mut lines = Lines::of(&mut child);
    lines.wait_for("SOCK and the pids", |o, e| {
        o.iter().any(|l| l.starts_with("SOCK "))
            && e.iter().filter(|l| l.starts_with("tmpirun: rank ") && l.contains(" pid ")).count() == np
    });
    let sock = lines.out.iter().find_map(|l| l.strip_prefix("SOCK ")).expect("SOCK").to_string();
    let pids: Vec<i32> =
        lines.err.iter().filter_map(|l| l.strip_prefix("tmpirun: rank ")?.split_once(" pid ")?.1.trim().parse().ok()).collect();
    let right = secret_of(pids[1]).expect("rank 1's TMPI_JOB_SECRET");
    assert!(hello_refused(&sock, 2, np, *b"0123456789abcdef"), "a wrong secret was admitted");
    assert!(hello_refused(&sock, 2, np, right), "a process that is no rank was admitted with the right secret");
    assert!(knock(&sock, &[0x42; 100]), "garbage was admitted");
    lines.wait_for("the intruder's report", |_, e| e.iter().any(|l| l.starts_with("INTRUDER ")));
    std::fs::write(&gofile, b"go").expect("create the go file");
    let status = child.wait().expect("wait for tmpirun");
    lines.drain();
    let _ = std::fs::remove_file(&gofile);
    let (out, err) = (&lines.out, &lines.err);
    let ctx = format!("status {status:?}\nstdout: {out:#?}\nstderr: {err:#?}");
    assert!(status.success(), "the job was disturbed\n{ctx}");
    assert!(out.iter().any(|l| l == "faultmatrix: strangers: OK"), "{ctx}");
    let intruder = err.iter().find(|l| l.starts_with("INTRUDER ")).expect("INTRUDER line");
    assert!(intruder.contains("secret"), "a rank's child with a wrong secret must be refused for it: {intruder}\n{ctx}");
    let first: Vec<&String> = err.iter().filter(|l| l.starts_with("tmpirun: bootstrap: refused a connection from")).collect();
    assert_eq!(first.len(), 1, "the first refusal is reported once\n{ctx}");
    assert!(err.iter().any(|l| l.starts_with("tmpirun: bootstrap: refused 4 connection(s)")), "4 refusals counted\n{ctx}");
}

/// A child's stdout and stderr lines as they come (read by a thread each), and those seen.
struct Lines {
    rx: std::sync::mpsc::Receiver<(bool, String)>,
    out: Vec<String>,
    err: Vec<String>,
}

impl Lines {
    fn of(child: &mut std::process::Child) -> Lines {
        let (tx, rx) = std::sync::mpsc::channel();
        for (is_err, pipe) in [
            (false, Box::new(child.stdout.take().expect("stdout")) as Box<dyn std::io::Read + Send>),
            (true, Box::new(child.stderr.take().expect("stderr"))),
        ] {
            let tx = tx.clone();
            std::thread::spawn(move || {
                for l in BufReader::new(pipe).lines().map_while(Result::ok) {
                    let _ = tx.send((is_err, l));
                }
            });
        }
        Lines { rx, out: Vec::new(), err: Vec::new() }
    }

    fn push(&mut self, (is_err, l): (bool, String)) {
        if is_err {
            self.err.push(l)
        } else {
            self.out.push(l)
        }
    }

    /// Reads lines until `done(stdout, stderr)`; panics naming `what` if none comes for 20 s.
    fn wait_for(&mut self, what: &str, done: impl Fn(&[String], &[String]) -> bool) {
        while !done(&self.out, &self.err) {
            match self.rx.recv_timeout(Duration::from_secs(20)) {
                Ok(line) => self.push(line),
                Err(_) => panic!("the job ended or hung before {what}\nstdout: {:#?}\nstderr: {:#?}", self.out, self.err),
            }
        }
    }

    /// Reads what is left (until 5 s pass without a line).
    fn drain(&mut self) {
        while let Ok(line) = self.rx.recv_timeout(Duration::from_secs(5)) {
            self.push(line);
        }
    }
}
