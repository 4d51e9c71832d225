//! `tmpirun` at the edges (issue 55): ranks started through a launch agent that runs them on
//! this machine (`tests/harness/local-agent.sh`, as `ip netns exec`, `nsenter` or a container's
//! entry would) never outlive their job, whether it ends by `--timeout` or by SIGTERM (item 6);
//! a flood of strangers against the bootstrap service's TCP port, with tmpirun out of
//! descriptors, keeps no rank out (item 3); files another user planted, and links, never make
//! the sweep of stale jobs remove a live job's socket (item 5); tmpirun's own lines stay short
//! with hundreds of failing ranks, and a hostfile that is no hostfile is an error at once
//! (item 8).

use std::io::{BufRead, BufReader, Read};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tmpi_tests::{release_bin, tmpirun, workspace_root};

/// One job at a time in this file (they are large, and the machine has two cores).
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// `tmpirun ARGS` with no `TMPI_*` variable of the test's environment.
fn tmpirun_cmd(args: &[&str]) -> Command {
    let mut c = Command::new(tmpirun());
    c.args(args).stdin(Stdio::null());
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("TMPI_") {
            c.env_remove(&k);
        }
    }
    c
}

/// A running tmpirun, killed if the test fails while it runs.
struct Launcher(Child);

impl Drop for Launcher {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Reads all of `r` in a thread.
fn read_all(r: impl Read + Send + 'static) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = BufReader::new(r).read_to_end(&mut v);
        String::from_utf8_lossy(&v).into_owned()
    })
}

/// Pids of the processes whose environment holds `VAR=mark` and `TMPI_RANK=<rank>` for some
/// rank: the ranks themselves (their wrappers have the variables on their command line only).
fn marked_ranks(var: &str, mark: &str) -> Vec<i32> {
    let want = format!("{var}={mark}");
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else { continue };
        let env = std::fs::read(e.path().join("environ")).unwrap_or_default();
        let vars: Vec<&[u8]> = env.split(|&b| b == 0).collect();
        if vars.contains(&want.as_bytes()) && vars.iter().any(|v| v.starts_with(b"TMPI_RANK=")) {
            out.push(pid);
        }
    }
    out
}

/// Whether `pid` still runs (a zombie waiting for its reaper does not).
fn running(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .is_ok_and(|s| !s.rsplit_once(')').is_some_and(|(_, r)| r.trim_start().starts_with('Z')))
}

/// How a test ends a job.
#[derive(Debug, Clone, Copy)]
enum End {
    Timeout,
    Sigterm,
}

/// Starts `fault_hang` as 2 "remote" ranks through the local agent, ends the job as `end`
/// says, and checks by pid that no rank is left.
fn agent_job_leaves_no_rank(end: End) {
    let mark = format!("{}-{end:?}", std::process::id());
    let agent = workspace_root().join("tests/harness/local-agent.sh");
    let timeout = match end {
        End::Timeout => "8",
        End::Sigterm => "120",
    };
    let x = format!("LAUNCH_MARK={mark}");
    let prog = release_bin("fault_hang");
    let mut c = tmpirun_cmd(&["--host", "agent-host.invalid:2", "--launch-agent", agent.to_str().expect("utf-8"), "--timeout", timeout]);
    c.args(["-x", &x]).arg(&prog).env("TMPI_TCP_IF", "127.0.0.1").stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut job = Launcher(c.spawn().expect("start tmpirun"));
    let err = read_all(job.0.stderr.take().expect("stderr"));
    let mut lines = BufReader::new(job.0.stdout.take().expect("stdout")).lines();
    let mut ready = 0;
    while ready < 2 {
        match lines.next() {
            Some(Ok(l)) if l.starts_with("READY ") => ready += 1,
            Some(Ok(_)) => {}
            _ => {
                drop(job);
                panic!("the job ended before its ranks were ready: {}", err.join().unwrap_or_default());
            }
        }
    }
    std::thread::spawn(move || for _ in lines {});
    let t = Instant::now();
    let mut ranks = marked_ranks("LAUNCH_MARK", &mark);
    while ranks.len() < 2 && t.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(20));
        ranks = marked_ranks("LAUNCH_MARK", &mark);
    }
    assert_eq!(ranks.len(), 2, "the two ranks' pids");
    if let End::Sigterm = end {
        // SAFETY: kill(2) has no memory effects; the pid is the tmpirun this test started.
        unsafe { libc::kill(job.0.id() as i32, libc::SIGTERM) };
    }
    let status = job.0.wait().expect("wait for tmpirun");
    let err = err.join().unwrap_or_default();
    let want = match end {
        End::Timeout => 124,
        End::Sigterm => 128 + libc::SIGTERM,
    };
    assert_eq!(status.code(), Some(want), "{err}");
    let t = Instant::now();
    while ranks.iter().any(|&p| running(p)) && t.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let left: Vec<i32> = ranks.iter().copied().filter(|&p| running(p)).collect();
    for &p in &left {
        // SAFETY: as above; a rank of this test's job.
        unsafe { libc::kill(p, libc::SIGKILL) };
    }
    assert!(left.is_empty(), "{end:?}: ranks {left:?} of {ranks:?} outlived their job\n{err}");
}

/// Issue 55 item 6, the job ended by `--timeout`.
#[test]
fn ranks_of_a_local_launch_agent_end_with_a_timed_out_job() {
    let _serial = serial();
    agent_job_leaves_no_rank(End::Timeout);
}

/// Issue 55 item 6, the job ended by SIGTERM to tmpirun.
#[test]
fn ranks_of_a_local_launch_agent_end_with_a_terminated_job() {
    let _serial = serial();
    agent_job_leaves_no_rank(End::Sigterm);
}

/// Issue 55 item 3, over loopback: the "remote" ranks (the local agent) wait until 300
/// strangers hold connections to the bootstrap service's TCP port of a tmpirun that has 48
/// descriptors; then they start, get in and the job ends at once.
#[test]
fn a_flood_of_strangers_on_the_bootstrap_port_keeps_no_rank_out() {
    let _serial = serial();
    let agent = workspace_root().join("tests/harness/local-agent.sh");
    let go = std::env::temp_dir().join(format!("tmpi-flood-go-{}", std::process::id()));
    let _ = std::fs::remove_file(&go);
    let prog = format!("while [ ! -e {} ]; do sleep 0.05; done; exec {}", go.display(), release_bin("hello").display());
    let mut c = Command::new("sh");
    c.args(["-c", "ulimit -n 48 && exec \"$0\" \"$@\""]).arg(tmpirun());
    c.args(["--host", "agent-host.invalid:2", "--launch-agent", agent.to_str().expect("utf-8"), "--report-pids", "--timeout", "100"]);
    c.args(["sh", "-c", &prog]).env("TMPI_TCP_IF", "127.0.0.1").stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("TMPI_") && k != "TMPI_TCP_IF" {
            c.env_remove(&k);
        }
    }
    let mut job = Launcher(c.spawn().expect("start tmpirun"));
    let out = read_all(job.0.stdout.take().expect("stdout"));
    let err = read_all(job.0.stderr.take().expect("stderr"));
    // The agent's command line carries the bootstrap address.
    let t = Instant::now();
    let addr = loop {
        let found = std::fs::read_dir("/proc").into_iter().flatten().flatten().find_map(|e| {
            let cmd = String::from_utf8_lossy(&std::fs::read(e.path().join("cmdline")).unwrap_or_default()).replace('\0', " ");
            (cmd.contains(&go.display().to_string()) && cmd.contains("TMPI_BOOTSTRAP=tcp:"))
                .then(|| cmd.split_once("TMPI_BOOTSTRAP=tcp:").and_then(|(_, r)| r.split(['\'', ' ']).next().map(str::to_string)))
                .flatten()
        });
        if let Some(a) = found {
            break a;
        }
        assert!(t.elapsed() < Duration::from_secs(20), "no agent with a bootstrap address");
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut flood = Command::new(release_bin("tcpstranger"))
        .args([addr.as_str(), "300", "0", "45"])
        .stdout(Stdio::piped())
        .spawn()
        .expect("tcpstranger");
    let mut lines = BufReader::new(flood.stdout.take().expect("stdout")).lines();
    let opened = lines.next().and_then(Result::ok).unwrap_or_default();
    assert!(opened.starts_with("OPEN "), "{opened}");
    let closed = std::thread::spawn(move || lines.map_while(Result::ok).filter(|l| l.starts_with("CLOSED ")).count());
    let t = Instant::now();
    std::fs::write(&go, "").expect("start the ranks");
    let status = job.0.wait().expect("wait for tmpirun");
    let took = t.elapsed();
    let _ = std::fs::remove_file(&go);
    let _ = flood.kill();
    let _ = flood.wait();
    let (out, err, closed) = (out.join().unwrap_or_default(), err.join().unwrap_or_default(), closed.join().unwrap_or(0));
    eprintln!("launch: {opened} strangers, tmpirun with 48 descriptors -> the job ran {took:?} after its ranks started; {closed} strangers closed");
    let ctx = format!("status {status:?}\nstdout:\n{out}\nstderr:\n{err}");
    assert!(status.success(), "{ctx}");
    assert_eq!(out.lines().filter(|l| l.starts_with("Hello from rank")).count(), 2, "{ctx}");
    assert!(took < Duration::from_secs(30), "the ranks were kept out for {took:?}\n{ctx}");
    assert!(err.contains("tmpirun: bootstrap: refused a connection from a process"), "the strangers are reported\n{ctx}");
}

/// Issue 55 item 5: a job waits in `init`; files planted as `nobody` (a launcher file naming a
/// dead pid, with a link from its socket directory's name to the job's) and links planted by
/// this user do not make another tmpirun's sweep remove the job's socket.
#[test]
fn planted_files_do_not_make_the_sweep_remove_a_live_jobs_socket() {
    // SAFETY: geteuid has no arguments and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("planted_files_do_not_make_the_sweep_remove_a_live_jobs_socket: SKIPPED: not root");
        return;
    }
    let _serial = serial();
    let mut c = tmpirun_cmd(&["-n", "2", "--timeout", "60"]);
    c.arg(release_bin("fault_hang")).arg("init").stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut job = Launcher(c.spawn().expect("start tmpirun"));
    let err = read_all(job.0.stderr.take().expect("stderr"));
    let mut lines = BufReader::new(job.0.stdout.take().expect("stdout")).lines();
    let mut sock = None;
    let mut ready = false;
    while sock.is_none() || !ready {
        match lines.next() {
            Some(Ok(l)) if l.starts_with("SOCK ") => sock = Some(PathBuf::from(&l[5..])),
            Some(Ok(l)) if l == "READY 1" => ready = true,
            Some(Ok(_)) => {}
            _ => panic!("the job ended early: {}", err.join().unwrap_or_default()),
        }
    }
    std::thread::spawn(move || for _ in lines {});
    let sock = sock.unwrap_or_default();
    let sockdir = sock.parent().expect("socket directory").to_path_buf();
    let mut child = Command::new("true").spawn().expect("true");
    let dead = child.id();
    child.wait().expect("wait");
    let ids: Vec<String> = (0..2).map(|_| tmpi_transport::bootstrap::new_jobid().expect("job id")).collect();
    let mut planted: Vec<PathBuf> = Vec::new();
    for (id, uid) in ids.iter().zip([65534u32, 0]) {
        let launcher = PathBuf::from(format!("/dev/shm/tmpi-{id}.launcher"));
        std::fs::write(&launcher, format!("{dead} 1\n")).expect("plant a launcher file");
        std::os::unix::fs::lchown(&launcher, Some(uid), Some(uid)).expect("chown");
        planted.push(launcher);
        for base in [std::env::temp_dir(), PathBuf::from("/tmp")] {
            let link = base.join(format!("tmpirun-{id}"));
            if std::os::unix::fs::symlink(&sockdir, &link).is_ok() {
                std::os::unix::fs::lchown(&link, Some(uid), Some(uid)).expect("chown");
                planted.push(link);
            }
        }
    }
    let o = tmpirun_cmd(&["-n", "1", "true"]).output().expect("run tmpirun -n 1 true");
    let sock_left = sock.exists();
    for p in &planted {
        let _ = std::fs::remove_file(p);
    }
    // SAFETY: kill(2) has no memory effects; the pid is the tmpirun this test started.
    unsafe { libc::kill(job.0.id() as i32, libc::SIGTERM) };
    let _ = job.0.wait();
    let err = err.join().unwrap_or_default();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(sock_left, "the sweep removed a live job's socket {}\n{}\n{err}", sock.display(), String::from_utf8_lossy(&o.stderr));
}

/// Issue 55 item 8: 300 ranks fail at once; tmpirun's summary of them is one short line.
#[test]
fn tmpiruns_lines_stay_short_when_hundreds_of_ranks_fail() {
    let _serial = serial();
    let n = 300;
    let lock = std::env::temp_dir().join(format!("tmpi-many-fail-{}", std::process::id()));
    let f = std::fs::File::create(&lock).expect("lock file");
    // SAFETY: flock on a descriptor this test owns; no memory effects.
    assert_eq!(unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) }, 0);
    // Every rank waits for a shared lock (held by the test), then exits 3: all at once.
    let prog = format!("flock -s {} true; exit 3", lock.display());
    let mut c = tmpirun_cmd(&["-n", &n.to_string(), "--timeout", "120", "sh", "-c", &prog]);
    let mut job = Launcher(c.stdout(Stdio::null()).stderr(Stdio::piped()).spawn().expect("start tmpirun"));
    let err = read_all(job.0.stderr.take().expect("stderr"));
    let t = Instant::now();
    let waiting = || {
        std::fs::read_dir("/proc")
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| {
                let cmd = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
                cmd.starts_with(b"flock\0") && cmd.windows(lock.as_os_str().len()).any(|w| w == lock.as_os_str().as_encoded_bytes())
            })
            .count()
    };
    while waiting() < n && t.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(100));
    }
    drop(f);
    let status = job.0.wait().expect("wait for tmpirun");
    let err = err.join().unwrap_or_default();
    let _ = std::fs::remove_file(&lock);
    assert_eq!(status.code(), Some(3), "{err}");
    let longest = err.lines().map(str::len).max().unwrap_or(0);
    let summary = err.lines().find(|l| l.contains("ranks failed before the job was ended"));
    eprintln!("launch: {n} failing ranks -> longest tmpirun line {longest} bytes; {summary:?}");
    assert!(longest <= 2100, "a line of {longest} bytes:\n{}", &err[..err.len().min(5000)]);
    if let Some(s) = summary {
        assert!(s.contains("(exited with code 3)"), "{s}");
    }
}

/// Issue 55 item 8: a hostfile that is no hostfile (8 MiB of NUL bytes, a sparse file) is an
/// error of one short line, at once.
#[test]
fn a_huge_hostfile_is_refused_in_one_line() {
    let p = std::env::temp_dir().join(format!("tmpi-huge-hostfile-{}", std::process::id()));
    std::fs::File::create(&p).and_then(|f| f.set_len(8 << 20)).expect("sparse file");
    let o = tmpirun_cmd(&["--hostfile", p.to_str().expect("utf-8"), "true"]).output().expect("run tmpirun");
    let _ = std::fs::remove_file(&p);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{}", &err[..err.len().min(2000)]);
    assert!(err.len() < 500 && err.contains("larger than 4 MiB"), "{}", &err[..err.len().min(2000)]);
    assert!(Path::new("/dev/zero").exists());
}

/// A spawn through `tmpirun` (`spawnproto`, the bootstrap protocol alone): `spawnproto MODE` at
/// `np` ranks with `flags`, within `secs` seconds (`--timeout`).
fn spawn_job(np: usize, mode: &str, flags: &[&str], secs: u64) -> tmpi_tests::Outcome {
    let mut job = tmpi_tests::Job::tmpirun(np, "spawnproto").arg(mode).timeout(Duration::from_secs(secs));
    for f in flags {
        job = job.flag(*f);
    }
    job.run()
}

/// Runs `spawnproto MODE` at `np` ranks under `--tag-output`, checks it ends well and leaves
/// nothing, and that it printed each line of `want` (`{cwd}` stands for the test's directory).
fn spawn_prints(np: usize, mode: &str, want: &[&str]) {
    let out = spawn_job(np, mode, &["--tag-output"], 60);
    out.assert_success().assert_no_leak();
    let lines = out.stdout_lines();
    let cwd = std::env::current_dir().expect("cwd");
    for w in want.iter().map(|w| w.replace("{cwd}", &cwd.to_string_lossy())) {
        assert!(lines.contains(&w.as_str()), "no line {w:?}\n{}", out.report());
    }
}

/// Issue 59 item 7: two commands (2 children, then 1) start with their arguments, variables,
/// directory and command index, wire up with the parents through the bridge, and their
/// output is labelled as spawned under `--tag-output`; the job ends well and leaves nothing.
#[test]
fn spawn_starts_two_commands_that_wire_up_with_the_parents() {
    let _s = serial();
    let want = [
        "[0] CHILD 0: rank 0 of 3 appnum 0 args [\"a b\"] SPAWN_K=v1 cwd={cwd}",
        "[0] CHILD 1: rank 1 of 3 appnum 0 args [\"a b\"] SPAWN_K=v1 cwd={cwd}",
        "[0] CHILD 2: rank 2 of 3 appnum 1 args [\"x\"] SPAWN_K=v2 cwd=/tmp",
        "[spawn1.0] hello from child 0",
        "[spawn1.2] hello from child 2",
    ];
    spawn_prints(2, "two", &want);
}

/// A spawned process spawns in turn: the grandchild is the second spawn, wired up with its
/// parent.
#[test]
fn a_spawned_process_can_spawn() {
    let _s = serial();
    spawn_prints(
        1,
        "nested",
        &["[spawn1.0] CHILD 0: rank 0 of 1 appnum 0 args [\"leaf\"] SPAWN_K=g cwd={cwd}", "[spawn2.0] hello from child 0"],
    );
}

/// A spawn of a program that does not exist is refused to the spawning rank with a reason
/// naming it; nothing starts and the job goes on to its end.
#[test]
fn spawn_of_a_missing_program_is_refused_and_the_job_goes_on() {
    let _s = serial();
    let out = spawn_job(2, "missing", &[], 60);
    out.assert_success().assert_no_leak();
    let refused = out.stdout_lines().into_iter().find(|l| l.starts_with("REFUSED ")).map(str::to_string);
    let refused = refused.unwrap_or_else(|| panic!("no REFUSED line\n{}", out.report()));
    assert!(refused.contains("no program \"no-such-program-for-spawn\""), "{refused}\n{}", out.report());
}

/// A spawn in a job across hosts (through the local launch agent) is refused, saying why, and
/// the job goes on.
#[test]
fn spawn_in_a_job_across_hosts_is_refused() {
    let _s = serial();
    let agent = workspace_root().join("tests/harness/local-agent.sh");
    let agent = agent.to_str().expect("utf-8");
    let job = tmpi_tests::Job::tmpirun(2, "spawnproto").arg("across").flag("--host").flag("agent-host.invalid:2").flag("--launch-agent");
    let out = job.flag(agent).env("TMPI_TCP_IF", "127.0.0.1").timeout(Duration::from_secs(60)).run();
    out.assert_success();
    let refused =
        out.stdout_lines().into_iter().any(|l| l.starts_with("REFUSED ") && l.contains("spawn is not supported in a job across hosts"));
    assert!(refused, "no refusal\n{}", out.report());
}

/// A spawned process that fails ends the job with its status, and the report names it as a
/// spawned process: exit 3, SIGKILL, and an abort of the children's job.
#[test]
fn a_failing_spawned_process_ends_the_job_and_is_named() {
    let _s = serial();
    let cases = [
        ("exit3", 3, "exited with code 3"),
        ("kill", 137, "killed by signal SIGKILL (9)"),
        ("abort", 5, "called abort with code 5: child gave up"),
    ];
    for (mode, status, how) in cases {
        let out = spawn_job(2, mode, &[], 60);
        assert_eq!(out.code(), Some(status), "{mode}\n{}", out.report());
        let named = out.stderr.lines().any(|l| l.starts_with("tmpirun: spawned rank 0 (spawn 1: ") && l.contains(how));
        assert!(named, "{mode}: no report naming the spawned rank\n{}", out.report());
        out.assert_no_leak();
    }
}

/// `--timeout` ends the spawned processes too.
#[test]
fn the_timeout_ends_spawned_processes() {
    let _s = serial();
    let out = spawn_job(2, "sleep", &[], 3);
    assert_eq!(out.code(), Some(124), "{}", out.report());
    let pid = out.stdout_lines().iter().find_map(|l| l.strip_prefix("CHILD_PID ")?.trim().parse::<i32>().ok());
    let pid = pid.unwrap_or_else(|| panic!("no CHILD_PID line\n{}", out.report()));
    assert!(!tmpi_tests::pid_exists(pid), "the spawned process {pid} outlived its job\n{}", out.report());
    out.assert_no_leak();
}
