//! The TCP fabric through real jobs on one machine (`TMPI_FABRIC=tcp`, over loopback): every
//! example and the point-to-point, collective and large-message test programs at 2 and 3
//! ranks; a hybrid job (shared memory within a "node", TCP between nodes, nodes named by
//! `TMPI_NODE_ID`); a rank killed mid-job. Each job's ranks say which fabric they got
//! (`tmpi-fabric` lines with `TMPI_STATS=1`), so a silent fall-back to shared memory fails.
//!
//! The handshake's refusal of strangers (no proof of the job secret) and malformed frames are
//! tested in `transport/src/tcp/tests.rs`, where a test can play the stranger.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tmpi_tests::{pid_exists, release_bin, Job, Outcome};

/// One job at a time in this file: a job's files are told apart from another's only then.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn tcp_job(n: usize, program: &str) -> Job {
    Job::tmpirun(n, program).env("TMPI_FABRIC", "tcp").env("TMPI_STATS", "1").timeout(Duration::from_secs(180))
}

/// Every rank reported `kind` as its fabric.
fn assert_fabric(out: &Outcome, n: usize, kind: &str) {
    let mut ranks: Vec<usize> = out
        .stderr
        .lines()
        .filter_map(|l| l.strip_prefix("tmpi-fabric rank="))
        .filter(|l| l.contains(&format!(" kind={kind} ")) && l.ends_with(" bad_connections=0"))
        .filter_map(|l| l.split_whitespace().next()?.parse().ok())
        .collect();
    ranks.sort_unstable();
    assert_eq!(ranks, (0..n).collect::<Vec<_>>(), "every rank should report kind={kind}\n{}", out.report());
}

fn run_ok(program: &str, n: usize, args: &[&str], ok: &str) {
    let mut j = tcp_job(n, program);
    for a in args {
        j = j.arg(*a);
    }
    let out = j.run();
    out.assert_ok_line(ok);
    out.assert_no_leak();
    assert_fabric(&out, n, "tcp");
}

#[test]
fn examples_over_tcp_at_2_and_3_ranks() {
    let _serial = serial();
    for n in [2, 3] {
        for ex in ["ring", "pi", "heat1d", "split", "wildcard", "offload", "halo"] {
            run_ok(ex, n, &[], &format!("{ex}: "));
        }
        let out = tcp_job(n, "hello").run();
        out.assert_success();
        assert_eq!(out.stdout_lines().len(), n, "{}", out.report());
        assert_fabric(&out, n, "tcp");
        let out = tcp_job(n, "pingpong").run();
        out.assert_ok_line("pingpong: ");
        assert_fabric(&out, n, "tcp");
    }
}

#[test]
fn p2p_programs_over_tcp_at_2_and_3_ranks() {
    let _serial = serial();
    for n in [2, 3] {
        for p in ["badcalls", "apisnippet", "inflight", "isolation"] {
            run_ok(p, n, &[], &format!("{p}: {n} ranks"));
        }
    }
}

#[test]
fn collectives_over_tcp_at_2_and_3_ranks() {
    let _serial = serial();
    for n in [2, 3] {
        run_ok("collcheck", n, &[], "collcheck: ");
        run_ok("vcoll", n, &[], "vcoll: ");
    }
}

#[test]
fn big_messages_over_tcp_stream_without_single_copy() {
    let _serial = serial();
    for n in [2, 3] {
        let out = tcp_job(n, "bigmsg").run();
        out.assert_ok_line("bigmsg: ");
        assert_fabric(&out, n, "tcp");
        // Rendezvous reads cross the connection: never a CMA read, even though the ranks
        // share this machine.
        let stats: Vec<&str> = out.stderr.lines().filter(|l| l.starts_with("tmpi-stats ")).collect();
        assert_eq!(stats.len(), n, "{}", out.report());
        for l in stats {
            assert!(l.contains(" cma_reads=0"), "a CMA read over TCP: {l}");
            assert!(!l.contains(" rndv=0"), "no rendezvous: {l}");
        }
    }
}

/// `tmpirun -n <n> sh -c 'TMPI_NODE_ID=node$((TMPI_RANK / per)) exec <program>'`: ranks on
/// "nodes" of `per` ranks each, on this one machine.
fn hybrid(n: usize, per: usize, program: &str) -> (std::process::ExitStatus, String, String) {
    hybrid_env(n, per, program, &[])
}

/// [`hybrid`] with `env` set for tmpirun and the ranks.
fn hybrid_env(n: usize, per: usize, program: &str, env: &[(&str, &str)]) -> (std::process::ExitStatus, String, String) {
    let prog = release_bin(program);
    let script = format!("TMPI_NODE_ID=node$((TMPI_RANK / {per})) exec \"$0\"");
    let out = Command::new(tmpi_tests::tmpirun())
        .args(["-n", &n.to_string(), "--timeout", "180", "sh", "-c", &script])
        .arg(&prog)
        .env("TMPI_STATS", "1")
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .output()
        .expect("run tmpirun");
    (out.status, String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn hybrid_jobs_use_shm_within_a_node_and_tcp_between_nodes() {
    let _serial = serial();
    for program in ["collcheck", "bigmsg", "inflight"] {
        let (status, out, err) = hybrid(4, 2, program);
        assert!(status.success(), "{program} on 2 nodes x 2 ranks\nstdout:\n{out}\nstderr:\n{err}");
        assert!(out.lines().any(|l| l.starts_with(&format!("{program}: ")) && l.contains("OK")), "{program}\n{out}\n{err}");
        let kinds: Vec<&str> = err.lines().filter(|l| l.starts_with("tmpi-fabric ")).collect();
        assert_eq!(kinds.len(), 4, "{err}");
        assert!(kinds.iter().all(|l| l.contains(" kind=hybrid ")), "{kinds:?}");
    }
    // Three nodes of one rank: TCP only; one node of three: shared memory only.
    let (status, _, err) = hybrid(3, 1, "collcheck");
    assert!(status.success(), "{err}");
    assert_eq!(err.lines().filter(|l| l.starts_with("tmpi-fabric ") && l.contains(" kind=tcp ")).count(), 3, "{err}");
    let (status, _, err) = hybrid(3, 3, "collcheck");
    assert!(status.success(), "{err}");
    assert_eq!(err.lines().filter(|l| l.starts_with("tmpi-fabric ") && l.contains(" kind=shm ")).count(), 3, "{err}");
}

/// With rendezvous from 1 MiB, eager messages of up to 1 MiB cross the connections in four
/// or five packets: the ones between the first and the last carry no flag (the fabric
/// contract's continuations), which the TCP fabric once refused as malformed, and a rank
/// then hung in the clean-up of the failed call.
#[test]
fn eager_messages_of_many_packets_over_tcp() {
    let _serial = serial();
    let env = [("TMPI_RNDV_THRESHOLD", "1048576")];
    for program in ["bigmsg", "collcheck"] {
        let mut j = tcp_job(2, program);
        for (k, v) in env {
            j = j.env(k, v);
        }
        let out = j.run();
        out.assert_ok_line(&format!("{program}: "));
        assert_fabric(&out, 2, "tcp");
        let (status, out, err) = hybrid_env(4, 2, program, &env);
        assert!(status.success(), "{program} on 2 nodes x 2 ranks, TMPI_RNDV_THRESHOLD=1048576\nstdout:\n{out}\nstderr:\n{err}");
        assert!(out.lines().any(|l| l.starts_with(&format!("{program}: ")) && l.contains("OK")), "{program}\n{out}\n{err}");
    }
}

#[test]
fn a_killed_rank_over_tcp_ends_the_job_naming_it() {
    let _serial = serial();
    let mut child = Command::new(tmpi_tests::tmpirun())
        .args(["-n", "3", "--report-pids", "--timeout", "60"])
        .arg(release_bin("fault_hang"))
        .env("TMPI_FABRIC", "tcp")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start tmpirun");
    let stdout = BufReader::new(child.stdout.take().expect("stdout"));
    let stderr = child.stderr.take().expect("stderr");
    let err_reader = std::thread::spawn(move || BufReader::new(stderr).lines().map_while(Result::ok).collect::<Vec<String>>());
    // Every rank through init (so over its TCP connections), then kill rank 1.
    let mut ready = 0;
    let mut lines = stdout.lines();
    while ready < 3 {
        match lines.next() {
            Some(Ok(l)) if l.starts_with("READY ") => ready += 1,
            Some(Ok(_)) => {}
            _ => {
                let _ = child.kill();
                panic!("the job ended before every rank was ready: {:?}", err_reader.join());
            }
        }
    }
    // The pid of rank 1 is on stderr: read it from /proc instead of racing the reader thread,
    // as the child of tmpirun whose environment says TMPI_RANK=1.
    let pid = rank_pid(child.id(), 1).expect("rank 1's pid");
    let t = Instant::now();
    // SAFETY: kill(2) has no memory effects; `pid` is rank 1, a child tmpirun has not reaped.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
    let status = child.wait().expect("wait for tmpirun");
    let took = t.elapsed();
    let err = err_reader.join().expect("stderr reader");
    let report = err.join("\n");
    assert!(!status.success(), "{report}");
    assert!(took < Duration::from_secs(5), "the job took {took:?} to end after the kill\n{report}");
    assert!(
        err.iter().any(|l| l.starts_with("tmpirun: rank 1 (pid ") && l.contains("killed by signal SIGKILL")),
        "tmpirun should name rank 1\n{report}"
    );
    for l in &err {
        if let Some(rest) = l.strip_prefix("tmpirun: rank ") {
            if let Some((_, p)) = rest.split_once(" pid ") {
                if let Ok(p) = p.trim().parse::<i32>() {
                    assert!(!pid_exists(p), "pid {p} outlived the job\n{report}");
                }
            }
        }
    }
}

/// The pid of the child of `parent` whose environment has `TMPI_RANK=<rank>`.
fn rank_pid(parent: u32, rank: usize) -> Option<i32> {
    let want = format!("TMPI_RANK={rank}");
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(10) {
        for e in std::fs::read_dir("/proc").ok()?.flatten() {
            let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else { continue };
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { continue };
            // Field 4, after the parenthesised command name, is the parent pid.
            let ppid = stat.rsplit_once(')').and_then(|(_, r)| r.split_whitespace().nth(1)?.parse::<u32>().ok());
            if ppid != Some(parent) {
                continue;
            }
            let env = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
            if env.split(|&b| b == 0).any(|v| v == want.as_bytes()) {
                return Some(pid);
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}
