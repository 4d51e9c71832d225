//! The TCP fabric through real jobs on one machine (`TMPI_FABRIC=tcp`, over loopback): every
//! example and the point-to-point, collective and large-message test programs at 2 and 3
//! ranks; a hybrid job (shared memory within a "node", TCP between nodes, nodes named by
//! `TMPI_NODE_ID`); a rank killed mid-job; a slow stranger on a starting job's TCP listener
//! (issue 55 item 3: the job starts all the same). Each job's ranks say which fabric they got
//! (`tmpi-fabric` lines with `TMPI_STATS=1`), so a silent fall-back to shared memory fails.
//!
//! The handshake's refusal of strangers (no proof of the job secret) and malformed frames are
//! tested in `transport/src/tcp/tests.rs`, where a test can play the stranger.

use std::io::{BufRead, BufReader, Read};
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
    killed_rank_ends_the_job(&[("TMPI_FABRIC", "tcp")]);
}

/// Starts `fault_hang` at 3 ranks with `env`, kills rank 1 once every rank is ready (the
/// others wait in a receive from it), and checks that tmpirun ends the job naming rank 1.
fn killed_rank_ends_the_job(env: &[(&str, &str)]) {
    let mut child = Command::new(tmpi_tests::tmpirun())
        .args(["-n", "3", "--report-pids", "--timeout", "60"])
        .arg(release_bin("fault_hang"))
        .envs(env.iter().copied())
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

/// The port of a TCP socket that process `pid` listens on (its fabric listener), once it has
/// one (at most 30 s).
fn listening_port(pid: i32) -> Option<u16> {
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(30) {
        let inodes: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
            .ok()?
            .flatten()
            .filter_map(|e| std::fs::read_link(e.path()).ok())
            .filter_map(|l| l.to_str().and_then(|s| s.strip_prefix("socket:[")).map(|s| s.trim_end_matches(']').to_string()))
            .collect();
        let table = std::fs::read_to_string(format!("/proc/{pid}/net/tcp")).unwrap_or_default();
        for line in table.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            // local_address is field 1 (ADDR:PORT in hex), st field 3 (0A: listening), inode
            // field 9.
            if f.len() > 9 && f[3] == "0A" && inodes.iter().any(|i| i == f[9]) {
                return f[1].rsplit_once(':').and_then(|(_, p)| u16::from_str_radix(p, 16).ok());
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

/// Issue 55 item 3: a stranger connects to rank 0's TCP fabric listener while the job starts
/// and trickles a byte a second, never proving anything (before, rank 0 read it for 56 s and
/// `init` failed after 60 s). The job starts and runs at once; the stranger is refused.
#[test]
fn a_slow_stranger_does_not_delay_a_starting_job() {
    let _serial = serial();
    let go = std::env::temp_dir().join(format!("tmpi-slow-stranger-go-{}", std::process::id()));
    let _ = std::fs::remove_file(&go);
    let prog = format!(
        "if [ \"$TMPI_RANK\" = 2 ]; then while [ ! -e {} ]; do sleep 0.05; done; fi; exec {}",
        go.display(),
        release_bin("collcheck").display()
    );
    let mut child = Command::new(tmpi_tests::tmpirun())
        .args(["-n", "3", "--timeout", "90", "sh", "-c", &prog])
        .env("TMPI_FABRIC", "tcp")
        .env("TMPI_STATS", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start tmpirun");
    let read_all = |r: Box<dyn std::io::Read + Send>| {
        std::thread::spawn(move || {
            let mut v = String::new();
            let _ = BufReader::new(r).read_to_string(&mut v);
            v
        })
    };
    let out = read_all(Box::new(child.stdout.take().expect("stdout")));
    let err = read_all(Box::new(child.stderr.take().expect("stderr")));
    let fail = |child: &mut std::process::Child, why: &str| -> ! {
        let _ = child.kill();
        panic!("{why}");
    };
    let Some(pid0) = rank_pid(child.id(), 0) else { fail(&mut child, "rank 0's pid") };
    let Some(port) = listening_port(pid0) else { fail(&mut child, "rank 0's TCP listener") };
    let mut stranger = Command::new(release_bin("tcpstranger"))
        .args([&format!("127.0.0.1:{port}"), "1", "1000", "80"])
        .stdout(Stdio::piped())
        .spawn()
        .expect("start tcpstranger");
    let mut lines = BufReader::new(stranger.stdout.take().expect("stdout")).lines();
    assert_eq!(lines.next().and_then(Result::ok).as_deref(), Some("OPEN 1"));
    let t = Instant::now();
    std::fs::write(&go, "").expect("let rank 2 start");
    let status = child.wait().expect("wait for tmpirun");
    let took = t.elapsed();
    let _ = std::fs::remove_file(&go);
    let (out, err) = (out.join().unwrap_or_default(), err.join().unwrap_or_default());
    let _ = stranger.kill();
    let _ = stranger.wait();
    let closed: Vec<String> = lines.map_while(Result::ok).filter(|l| l.starts_with("CLOSED ")).collect();
    eprintln!("tcp: a job of 3 ran {took:?} after its last rank started, beside a slow stranger ({closed:?})");
    let ctx = format!("status {status:?}\nstdout:\n{out}\nstderr:\n{err}");
    assert!(status.success(), "{ctx}");
    assert!(out.lines().any(|l| l.starts_with("collcheck: ") && l.contains("OK")), "{ctx}");
    assert!(err.contains("tmpi: rank 0: refused 1 TCP connection(s) that did not prove the job secret"), "{ctx}");
    assert!(took < Duration::from_secs(30), "the job was held up {took:?}\n{ctx}");
    assert_eq!(closed.len(), 1, "the stranger was closed: {closed:?}\n{ctx}");
}

/// `TMPI_FABRIC=ofi` in a build without the cargo feature `ofi`: `init` fails on every rank,
/// naming the variable and the feature.
#[cfg(not(feature = "ofi"))]
#[test]
fn ofi_without_the_feature_is_an_init_error_naming_it() {
    let _serial = serial();
    let out = Job::tmpirun(2, "randmix").env("TMPI_FABRIC", "ofi").timeout(Duration::from_secs(60)).run();
    assert!(!out.success(), "{}", out.report());
    assert!(out.stderr.contains("TMPI_FABRIC") && out.stderr.contains("cargo feature `ofi`"), "{}", out.report());
    out.assert_no_leak();
}

/// libfabric's OFI fabric (`TMPI_FABRIC=ofi`, built with `--features ofi`) on its `tcp`
/// provider (through `ofi_rxm`), bound to loopback: the endpoints' source address is the one
/// TCP would listen on (127.0.0.1 for a job on one host), and `FI_TCP_IFACE=lo` keeps the
/// provider on `lo` as well. Run by `.ci/run` as
/// `cargo test --release -p tmpi-tests --features ofi --test tcp ofi_`, after building the
/// examples with the feature.
#[cfg(feature = "ofi")]
mod ofi {
    use super::*;

    fn ofi_job(n: usize, program: &str) -> Job {
        ofi_job_on(n, program, "tcp")
    }

    /// A job over OFI's `provider` (`tcp` on `lo`, or `shm`).
    fn ofi_job_on(n: usize, program: &str, provider: &str) -> Job {
        Job::tmpirun(n, program)
            .env("TMPI_FABRIC", "ofi")
            .env("TMPI_OFI_PROVIDER", provider)
            .env("FI_TCP_IFACE", "lo")
            .env("TMPI_STATS", "1")
            .timeout(Duration::from_secs(120))
    }

    /// Every rank reported the OFI fabric on the `tcp` provider.
    fn assert_ofi(out: &Outcome, n: usize) {
        assert_ofi_on(out, n, "tcp;ofi_rxm");
    }

    /// Every rank reported the OFI fabric on `provider` (as libfabric names it).
    fn assert_ofi_on(out: &Outcome, n: usize, provider: &str) {
        assert_fabric(out, n, "ofi");
        let named = format!(" provider={provider} ");
        let on = out.stderr.lines().filter(|l| l.starts_with("tmpi-fabric ") && l.contains(&named)).count();
        assert_eq!(on, n, "every rank should name the provider {provider}\n{}", out.report());
    }

    /// randmix's small plan: 8 rounds, messages up to 600 000 bytes (eager, and rendezvous
    /// streamed in packets).
    fn small_mix(j: Job, seed: u64) -> Job {
        j.arg("--seed").arg(seed.to_string()).arg("--rounds").arg("8").arg("--max").arg("600000")
    }

    #[test]
    fn ofi_examples_and_a_random_mix_at_2_and_3_ranks() {
        let _serial = serial();
        for n in [2, 3] {
            let out = ofi_job(n, "hello").run();
            out.assert_success();
            assert_eq!(out.stdout_lines().len(), n, "{}", out.report());
            assert_ofi(&out, n);
            let out = ofi_job(n, "ring").run();
            out.assert_ok_line("ring: ");
            assert_ofi(&out, n);
            let out = small_mix(ofi_job(n, "randmix"), 40 + n as u64).run();
            out.assert_ok_line("randmix: ");
            assert_ofi(&out, n);
            // Rendezvous crossed the endpoint, streamed: never a CMA read.
            let stats: Vec<&str> = out.stderr.lines().filter(|l| l.starts_with("tmpi-stats ")).collect();
            assert_eq!(stats.len(), n, "{}", out.report());
            assert!(stats.iter().all(|l| l.contains(" cma_reads=0")), "{stats:?}");
            assert!(stats.iter().any(|l| !l.contains(" rndv=0")), "no rendezvous: {stats:?}");
        }
    }

    /// `tmpirun --info` (built with the feature) lists the providers libfabric offers: here
    /// the software ones (`tcp;ofi_rxm`, `shm`), none marked as hardware, each with its default
    /// matching.
    #[test]
    fn ofi_tmpirun_info_lists_the_providers() {
        let out = Command::new(tmpi_tests::tmpirun()).arg("--info").output().expect("run tmpirun --info");
        let text = String::from_utf8_lossy(&out.stdout);
        let line = text.lines().find(|l| l.starts_with("OFI (libfabric) providers: ")).unwrap_or_default();
        assert!(line.contains("tcp;ofi_rxm") && line.contains("shm") && !line.contains("(hardware)"), "{text}");
        // Who matches on each by default (TMPI_OFI_MATCHING=auto).
        assert!(line.contains("tcp;ofi_rxm (matching: provider)") && line.contains("shm (matching: software)"), "{text}");
    }

    /// Issue 57 item 2 and 4: the same seeded random point-to-point mix (`randmix --extra`:
    /// exact and wildcard receives, probes, matched probes, truncation, cancel, synchronous
    /// sends, self messages, eager and rendezvous sizes, on a split communicator) over OFI's
    /// `tcp` provider with the provider matching and with software matching (the soft
    /// TM-SRQ), at 2 and 3 ranks: every check passes and every rank's digest of what MPI
    /// showed it is the same both ways. The provider did match: its counters say so.
    #[test]
    fn ofi_provider_matching_gives_what_software_matching_gives() {
        let _serial = serial();
        for (n, seed) in [(2, 91), (3, 92)] {
            let run = |m: &str| {
                let j = ofi_job(n, "randmix").env("TMPI_OFI_MATCHING", m).arg("--extra").arg("--digest");
                small_mix(j, seed).run()
            };
            let (soft, prov) = (run("software"), run("provider"));
            for (out, m) in [(&soft, "software"), (&prov, "provider")] {
                assert_ofi(out, n);
                let said = out.stderr.lines().filter(|l| l.starts_with("tmpi-fabric ") && l.contains(&format!(" matching={m} "))).count();
                assert_eq!(said, n, "every rank should say matching={m}\n{}", out.report());
            }
            assert_eq!(soft.assert_ok_line("randmix: "), prov.assert_ok_line("randmix: "));
            let digests = |o: &Outcome| {
                let mut d: Vec<String> = o.stdout.lines().filter(|l| l.starts_with("randmix-digest ")).map(String::from).collect();
                d.sort();
                d
            };
            assert_eq!(digests(&soft).len(), n, "{}", soft.report());
            assert_eq!(digests(&soft), digests(&prov), "software:\n{}\nprovider:\n{}", soft.report(), prov.report());
            let matched: u64 = prov
                .stderr
                .lines()
                .filter_map(|l| l.strip_prefix("tmpi-ofi rank=")?.split(" matched=").nth(1)?.split_whitespace().next()?.parse::<u64>().ok())
                .sum();
            assert!(matched > 0, "the provider matched no message\n{}", prov.report());
            assert!(!soft.stderr.contains("tmpi-ofi "), "software matching reported provider counters\n{}", soft.report());
        }
    }

    /// Issue 57 item 3: `bigmsg` (sizes 0 B-4 MiB around the rendezvous threshold; expected,
    /// unexpected and synchronous receives; a receive buffer half the message: `Truncated`,
    /// nothing written past it, the next message intact; a 2 MiB buffer sent 12 times; a
    /// window of 8) over OFI's `tcp` provider with the rendezvous read by `fi_read` and
    /// streamed through the packets, send and receive buffers at odd addresses: every payload
    /// is checked both ways, the same verdict. The read way did read with `fi_read` and never
    /// fell back, the sender's `fi_mr_reg` cache hit on the repeated buffer (bigmsg checks
    /// `mr_cache_hits` too), and the streamed way made no `fi_read`.
    #[test]
    fn ofi_rendezvous_by_fi_read_delivers_what_streaming_delivers() {
        let _serial = serial();
        let run = |w: &str| ofi_job(2, "bigmsg").env("TMPI_OFI_RNDV", w).arg("--offset").arg("3").arg((4 << 20).to_string()).run();
        let (read, stream) = (run("read"), run("stream"));
        for (out, w) in [(&read, "read"), (&stream, "stream")] {
            assert_ofi(out, 2);
            let said = out.stderr.lines().filter(|l| l.starts_with("tmpi-fabric ") && l.contains(&format!(" rndv={w} "))).count();
            assert_eq!(said, 2, "every rank should say rndv={w}\n{}", out.report());
        }
        assert_eq!(read.assert_ok_line("bigmsg: "), stream.assert_ok_line("bigmsg: "));
        let field = |line: &str, key: &str| -> u64 {
            let v = line.split_whitespace().find_map(|f| f.strip_prefix(key)?.strip_prefix('='));
            v.and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("no {key} in {line}"))
        };
        let lines: Vec<&str> = read.stderr.lines().filter(|l| l.starts_with("tmpi-ofi-rndv ")).collect();
        assert_eq!(lines.len(), 2, "{}", read.report());
        let sum = |key: &str| lines.iter().map(|l| field(l, key)).sum::<u64>();
        assert!(sum("done") > 0 && sum("done") == sum("reads"), "no fi_read, or one unfinished\n{}", read.report());
        assert_eq!((sum("failed"), sum("fallbacks"), sum("reg_failed")), (0, 0, 0), "{}", read.report());
        assert!(sum("mr_hits") >= 11 && sum("mr_misses") > 0, "the repeated buffer missed the fi_mr_reg cache\n{}", read.report());
        assert!(!stream.stderr.contains("tmpi-ofi-rndv "), "the streamed way reported fi_reads\n{}", stream.report());
    }

    /// A rendezvous send abandoned (a scope unwinding) while its request carries a fabric key
    /// for the reader's `fi_read`: before its receive is posted (the request waits in the
    /// provider's queue, or in software's), the key is revoked and the later receive fails
    /// with `RemoteAccess` instead of reading memory the sender reused; while the reader's
    /// `fi_read` may be out, giving the send up waits for it, and the receive gets every byte
    /// or a clean error. Without the revoke the first read reused memory and the second hung.
    #[test]
    fn ofi_abandoned_sends_revoke_their_fabric_keys() {
        let _serial = serial();
        for matching in ["provider", "software"] {
            for mode in ["revoke", "revoke-reading"] {
                let job = ofi_job(2, "reliability").arg(mode).env("TMPI_OFI_RNDV", "read").env("TMPI_OFI_MATCHING", matching);
                let out = job.env("TMPI_RNDV_THRESHOLD", "32768").run();
                assert_ofi(&out, 2);
                out.assert_ok_line(&format!("reliability: {mode}: "));
            }
        }
    }

    /// Every example at 2 and 3 ranks over OFI's `tcp` and `shm` providers (each checks its
    /// own result and exits non-zero on a wrong one; `spawn`'s children join over shared
    /// memory through the bridge), and seeded random sequences of collectives on the world, a
    /// dup and a split (`randcoll`, which checks every result against its reference) at 2 and
    /// 3 ranks; over `shm` also the random point-to-point mix (over `tcp`,
    /// `ofi_examples_and_a_random_mix_at_2_and_3_ranks` runs it).
    #[test]
    fn ofi_every_example_and_random_collectives() {
        let _serial = serial();
        let examples = tmpi_tests::example_names();
        assert!(examples.len() >= 16, "examples found: {examples:?}");
        for (provider, named) in [("tcp", "tcp;ofi_rxm"), ("shm", "shm")] {
            for n in [2, 3] {
                for ex in &examples {
                    let out = ofi_job_on(n, ex, provider).run();
                    assert!(
                        out.status.success() && !out.stdout.trim().is_empty(),
                        "{ex} at {n} ranks over OFI {provider}\n{}",
                        out.report()
                    );
                    if ex == "spawn" {
                        // Its children are a job of their own, on OFI too (they inherit TMPI_FABRIC).
                        let lines: Vec<&str> = out.stderr.lines().filter(|l| l.starts_with("tmpi-fabric ")).collect();
                        assert!(lines.len() > n && lines.iter().all(|l| l.contains(" kind=ofi ")), "spawn at {n}\n{}", out.report());
                    } else {
                        assert_ofi_on(&out, n, named);
                    }
                }
                let out = ofi_job_on(n, "randcoll", provider).arg("--seed").arg((70 + n).to_string()).run();
                out.assert_ok_line("randcoll: ");
                assert_ofi_on(&out, n, named);
                if provider == "shm" {
                    let out = small_mix(ofi_job_on(n, "randmix", provider), 40 + n as u64).run();
                    out.assert_ok_line("randmix: ");
                    assert_ofi_on(&out, n, named);
                }
            }
        }
    }

    /// `TMPI_OFI_RNDV` takes auto, read or stream: anything else fails `init` naming it.
    #[test]
    fn ofi_rndv_knob_is_checked() {
        let out = ofi_job(2, "hello").env("TMPI_OFI_RNDV", "rdma").run();
        assert!(!out.status.success(), "{}", out.report());
        assert!(out.stderr.contains("TMPI_OFI_RNDV") && out.stderr.contains("auto, read or stream"), "{}", out.report());
    }

    /// A rank killed (SIGKILL) while its peers wait in a receive the provider matches: tmpirun
    /// names it and the job ends.
    #[test]
    fn ofi_a_killed_rank_ends_the_job_under_provider_matching() {
        let _serial = serial();
        killed_rank_ends_the_job(&[
            ("TMPI_FABRIC", "ofi"),
            ("TMPI_OFI_PROVIDER", "tcp"),
            ("FI_TCP_IFACE", "lo"),
            ("TMPI_OFI_MATCHING", "provider"),
        ]);
    }

    /// The same seeded random mix over shared memory and over OFI: both pass every check of
    /// every message (payload, source, tag, length, truncation, wildcards, probes, cancels),
    /// and report the same summary (seed, rounds, messages, checks) on rank 0.
    #[test]
    fn ofi_random_mix_gives_what_shared_memory_gives() {
        let _serial = serial();
        let shm = small_mix(Job::tmpirun(3, "randmix").timeout(Duration::from_secs(120)), 77).run();
        let ofi = small_mix(ofi_job(3, "randmix"), 77).run();
        assert_ofi(&ofi, 3);
        let (a, b) = (shm.assert_ok_line("randmix: "), ofi.assert_ok_line("randmix: "));
        assert_eq!(a, b, "shm:\n{}\nofi:\n{}", shm.report(), ofi.report());
    }
}
