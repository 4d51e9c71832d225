//! End-to-end tests of the `tmpirun` binary on small shell scripts (and on this test binary
//! itself acting as a rank that talks to the bootstrap service).

use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::ExitStatusExt;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_tmpirun");

fn tmpirun(args: &[&str]) -> Command {
    let mut c = Command::new(BIN);
    c.args(args);
    c
}

fn run(args: &[&str]) -> Output {
    tmpirun(args).output().expect("run tmpirun")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn sorted_lines(b: &[u8]) -> Vec<String> {
    let mut v: Vec<String> = text(b).lines().map(str::to_string).collect();
    v.sort();
    v
}

/// Whether `pid` is still a live process (absent or zombie counts as gone).
fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => false,
        Ok(s) => {
            let state = s.rsplit(')').next().and_then(|r| r.split_whitespace().next());
            state != Some("Z") && state != Some("X")
        }
    }
}

/// Waits (briefly) for processes killed by tmpirun to disappear; grandchildren are
/// reparented and may take a moment to be reaped by init.
fn assert_gone(pids: &[i32]) {
    let t = Instant::now();
    while pids.iter().any(|&p| alive(p)) {
        assert!(t.elapsed() < Duration::from_secs(3), "still running: {pids:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn pids_reported(stderr: &str) -> Vec<i32> {
    stderr
        .lines()
        .filter_map(|l| l.strip_prefix("tmpirun: rank "))
        .filter_map(|l| l.split_once(" pid ").map(|(_, p)| p.trim().parse().unwrap()))
        .collect()
}

/// CPUs this process may run on (what tmpirun counts: its affinity mask, not cgroup quotas).
fn ncpus() -> usize {
    // SAFETY: cpu_set_t is a plain bit array; all zeroes is a valid (empty) set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is writable storage of the size passed; pid 0 = this thread.
    let rc = unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    assert_eq!(rc, 0);
    // SAFETY: `set` was filled by the kernel.
    unsafe { libc::CPU_COUNT(&set) as usize }
}

#[test]
fn all_ranks_succeed_and_see_their_environment() {
    let n = ncpus().min(4);
    let ns = n.to_string();
    let out = run(&[
        "-n",
        &ns,
        "sh",
        "-c",
        "echo $TMPI_RANK $TMPI_SIZE $TMPI_LOCAL_RANK $TMPI_LOCAL_SIZE $TMPI_JOBID $TMPI_SHM_NAME \
         $TMPI_LAUNCHER_PID $TMPI_BOOTSTRAP $TMPI_JOB_SECRET",
    ]);
    assert!(out.status.success(), "{out:?}");
    let lines = sorted_lines(&out.stdout);
    assert_eq!(lines.len(), n);
    let mut jobids = std::collections::HashSet::new();
    let mut secrets = std::collections::HashSet::new();
    for (r, l) in lines.iter().enumerate() {
        let f: Vec<&str> = l.split(' ').collect();
        assert_eq!(f.len(), 9, "{l}");
        assert!(f[8].len() == 32 && f[8].bytes().all(|b| b.is_ascii_hexdigit()), "secret {}", f[8]);
        secrets.insert(f[8].to_string());
        assert_eq!(f[..4], [r.to_string(), ns.clone(), r.to_string(), ns.clone()]);
        let jobid = f[4];
        assert!(jobid.len() == 16 && jobid.bytes().all(|b| b.is_ascii_hexdigit()), "{jobid}");
        let suffix = f[5].strip_prefix(&format!("tmpi-{jobid}-")).expect("shm name prefix");
        assert_eq!(suffix.len(), 16);
        assert!(f[6].parse::<u32>().is_ok());
        assert!(f[7].ends_with(".sock"));
        jobids.insert(jobid.to_string());
    }
    assert_eq!(jobids.len(), 1, "one job id per job");
    assert_eq!(secrets.len(), 1, "one secret per job");
    // Another job gets another id and another secret.
    let out2 = run(&["-n", "1", "sh", "-c", "echo $TMPI_JOBID; echo $TMPI_JOB_SECRET"]);
    let t2 = text(&out2.stdout);
    let mut l2 = t2.lines();
    assert!(!jobids.contains(l2.next().unwrap_or("").trim()));
    assert!(!secrets.contains(l2.next().unwrap_or("").trim()));
}

#[test]
fn failing_rank_sets_the_exit_code() {
    let out = run(&["-n", "2", "sh", "-c", "exit 3"]);
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    let err = text(&out.stderr);
    assert!(err.contains(") exited with code 3"), "{err}");
    assert!(err.starts_with("tmpirun: rank "), "{err}");

    let out = run(&["-n", "1", "sh", "-c", "exit 0"]);
    assert_eq!(out.status.code(), Some(0));
}

#[test]
fn one_failure_kills_the_others_quickly() {
    let t = Instant::now();
    let out = run(&["-n", "2", "--report-pids", "sh", "-c", "if [ $TMPI_RANK = 1 ]; then sleep 0.2; exit 4; fi; sleep 100"]);
    assert!(t.elapsed() < Duration::from_secs(3), "took {:?}", t.elapsed());
    assert_eq!(out.status.code(), Some(4));
    let err = text(&out.stderr);
    assert!(err.contains("tmpirun: rank 1 (pid "), "{err}");
    // Only the failure is reported, not the ranks tmpirun killed.
    assert!(!err.contains("rank 0 (pid"), "{err}");
    let pids = pids_reported(&err);
    assert_eq!(pids.len(), 2);
    assert_gone(&pids);
}

#[test]
fn a_rank_killed_by_a_signal_is_reported_by_name() {
    let out = run(&["-n", "2", "sh", "-c", "if [ $TMPI_RANK = 1 ]; then kill -9 $$; fi; sleep 100"]);
    assert_eq!(out.status.code(), Some(128 + 9));
    let err = text(&out.stderr);
    assert!(err.contains("rank 1 (pid") && err.contains("killed by signal SIGKILL (9)"), "{err}");

    let out = run(&["-n", "1", "sh", "-c", "kill -SEGV $$"]);
    assert_eq!(out.status.code(), Some(128 + 11));
    assert!(text(&out.stderr).contains("killed by signal SIGSEGV (11)"));
}

#[test]
fn timeout_ends_a_hung_job() {
    let t = Instant::now();
    let out = run(&["-n", "2", "--timeout", "1", "--report-pids", "sleep", "100"]);
    let took = t.elapsed();
    assert_eq!(out.status.code(), Some(124), "{out:?}");
    assert!(took >= Duration::from_secs(1) && took < Duration::from_secs(3), "{took:?}");
    let err = text(&out.stderr);
    assert!(err.contains("timed out after 1 s") && err.contains("--timeout"), "{err}");
    assert_gone(&pids_reported(&err));
}

#[test]
fn ranks_that_ignore_sigterm_are_killed_after_the_grace() {
    let t = Instant::now();
    let out = run(&["-n", "1", "--timeout", "0.3", "sh", "-c", "trap '' TERM; while :; do sleep 0.05; done"]);
    let took = t.elapsed();
    assert_eq!(out.status.code(), Some(124));
    // 0.3 s of timeout, then SIGTERM, and SIGKILL after the 0.3 s grace.
    assert!(took >= Duration::from_millis(600) && took < Duration::from_millis(1500), "SIGTERM, then SIGKILL 0.3 s later: {took:?}");
}

#[test]
fn shm_files_are_removed_on_failure_and_on_success() {
    for (script, code) in [
        ("touch /dev/shm/$TMPI_SHM_NAME /dev/shm/tmpi-${TMPI_JOBID}-later; echo $TMPI_SHM_NAME; exit 1", 1),
        ("touch /dev/shm/$TMPI_SHM_NAME /dev/shm/tmpi-${TMPI_JOBID}-later; echo $TMPI_SHM_NAME", 0),
    ] {
        let s = format!("if [ $TMPI_RANK = 0 ]; then {script}; fi");
        let out = run(&["-n", "2", "sh", "-c", &s]);
        assert_eq!(out.status.code(), Some(code), "{out:?}");
        let name = text(&out.stdout).trim().to_string();
        assert!(name.starts_with("tmpi-"), "{name}");
        let jobid = &name[5..21];
        assert!(!std::path::Path::new(&format!("/dev/shm/{name}")).exists(), "{name} left behind");
        assert!(!std::path::Path::new(&format!("/dev/shm/tmpi-{jobid}-later")).exists());
    }
}

#[test]
fn sigterm_to_tmpirun_ends_the_job_and_cleans_up() {
    let mut child = tmpirun(&[
        "-n",
        "2",
        "--report-pids",
        "sh",
        "-c",
        "[ $TMPI_RANK = 0 ] && touch /dev/shm/$TMPI_SHM_NAME && echo $TMPI_SHM_NAME; exec sleep 100",
    ])
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    let mut name = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut name).unwrap();
    let t = Instant::now();
    let rc = unsafe_kill(child.id() as i32, libc::SIGTERM);
    assert_eq!(rc, 0);
    let out = child.wait_with_output().unwrap();
    assert!(t.elapsed() < Duration::from_secs(3));
    assert_eq!(out.status.code(), Some(128 + libc::SIGTERM));
    let err = text(&out.stderr);
    assert!(err.contains("got SIGTERM"), "{err}");
    assert_gone(&pids_reported(&err));
    let name = name.trim();
    assert!(name.starts_with("tmpi-"));
    assert!(!std::path::Path::new(&format!("/dev/shm/{name}")).exists());
}

fn unsafe_kill(pid: i32, sig: i32) -> i32 {
    // SAFETY: kill(2) on the pid of a child this test spawned and has not reaped.
    unsafe { libc::kill(pid, sig) }
}

#[test]
fn ranks_die_with_a_sigkilled_tmpirun() {
    // tmpirun gets no chance to clean up: the kernel's parent-death signal ends the ranks.
    let mut child = tmpirun(&["-n", "3", "--report-pids", "sleep", "100"]).stderr(Stdio::piped()).spawn().unwrap();
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let mut pids = Vec::new();
    while pids.len() < 3 {
        let mut line = String::new();
        assert!(err.read_line(&mut line).unwrap() > 0, "tmpirun ended early");
        pids.extend(pids_reported(&line));
    }
    assert_eq!(unsafe_kill(child.id() as i32, libc::SIGKILL), 0);
    let t = Instant::now();
    assert_eq!(child.wait().unwrap().signal(), Some(libc::SIGKILL));
    assert_gone(&pids);
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
}

#[test]
fn no_processes_are_left_behind() {
    // Each rank starts a background child and reports its pid; rank 1 fails.
    let out = run(&[
        "-n",
        "2",
        "--report-pids",
        "sh",
        "-c",
        "sleep 100 & echo child $!; if [ $TMPI_RANK = 1 ]; then sleep 0.2; exit 2; fi; wait",
    ]);
    assert_eq!(out.status.code(), Some(2));
    let mut pids = pids_reported(&text(&out.stderr));
    for l in text(&out.stdout).lines() {
        pids.push(l.strip_prefix("child ").unwrap().parse().unwrap());
    }
    assert_eq!(pids.len(), 4);
    assert_gone(&pids);
}

#[test]
fn tagged_output_prefixes_stdout_and_stderr() {
    let out = run(&["-n", "2", "--tag-output", "sh", "-c", "echo out $TMPI_RANK; echo err $TMPI_RANK >&2; printf tail"]);
    assert!(out.status.success());
    assert_eq!(sorted_lines(&out.stdout), ["[0] out 0", "[0] tail", "[1] out 1", "[1] tail"]);
    assert_eq!(sorted_lines(&out.stderr), ["[0] err 0", "[1] err 1"]);
}

#[test]
fn untagged_output_is_exact_and_the_last_partial_line_is_kept() {
    let out = run(&["-n", "1", "sh", "-c", "printf 'a\\nb'"]);
    assert_eq!(out.stdout, b"a\nb");
}

/// A rank stopped while it prints (here: rank 1 has written half a line when rank 0 fails):
/// tmpirun's own message starts on a line of its own, and the half line gets its newline
/// before tmpirun exits, on stderr only.
#[test]
fn half_a_stderr_line_never_swallows_tmpiruns_message() {
    let script = "if [ $TMPI_RANK = 1 ]; then printf 'Error: ' >&2; printf 'out' ; sleep 30; else sleep 0.5; exit 3; fi";
    let out = run(&["-n", "2", "sh", "-c", script]);
    assert_eq!(out.status.code(), Some(3));
    assert_eq!(out.stdout, b"out", "stdout byte for byte");
    let err = text(&out.stderr);
    assert!(err.ends_with('\n'), "{err:?}");
    assert!(err.lines().any(|l| l == "Error: "), "the half line on its own: {err:?}");
    assert!(err.lines().any(|l| l.starts_with("tmpirun: rank 0")), "tmpirun's message on its own line: {err:?}");
}

#[test]
fn lines_of_different_ranks_never_mix() {
    let line = "x".repeat(300);
    let script = format!("i=0; while [ $i -lt 400 ]; do echo \"$TMPI_RANK:{line}:$i\"; i=$((i+1)); done");
    let out = run(&["-n", "4", "--oversubscribe", "sh", "-c", &script]);
    assert!(out.status.success());
    let s = text(&out.stdout);
    let mut count = [0usize; 4];
    for l in s.lines() {
        let mut f = l.split(':');
        let r: usize = f.next().unwrap().parse().unwrap_or_else(|_| panic!("mixed line {l:?}"));
        assert_eq!(f.next(), Some(line.as_str()), "mixed line {l:?}");
        let i: usize = f.next().unwrap().parse().unwrap();
        assert_eq!(i, count[r], "rank {r} lines out of order");
        count[r] += 1;
    }
    assert_eq!(count, [400; 4]);
}

#[test]
fn long_tagged_lines_of_both_streams_stay_whole() {
    // Lines longer than a pipe's buffer arrive in several reads; with four ranks writing at
    // once, each line must still come out whole, on the stream it was written to, tagged.
    let body = "y".repeat(100_000);
    let script = "b=$(head -c 100000 /dev/zero | tr '\\0' y); i=0; while [ $i -lt 20 ]; do \
                  echo \"$TMPI_RANK:$b:$i\"; echo \"$TMPI_RANK:$b:$i\" >&2; i=$((i+1)); done";
    let out = run(&["-n", "4", "--tag-output", "sh", "-c", script]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    for stream in [&out.stdout, &out.stderr] {
        let mut count = [0usize; 4];
        for l in text(stream).lines() {
            let (tag, rest) = l.split_once(' ').expect("tagged line");
            let r: usize = tag
                .strip_prefix('[')
                .and_then(|t| t.strip_suffix(']'))
                .and_then(|t| t.parse().ok())
                .unwrap_or_else(|| panic!("bad tag in {:?}", &l[..l.len().min(40)]));
            let mut f = rest.split(':');
            assert_eq!(f.next(), Some(r.to_string().as_str()), "tag of another rank");
            assert!(f.next() == Some(body.as_str()), "line of rank {r} cut or mixed");
            assert_eq!(f.next(), Some(count[r].to_string().as_str()));
            count[r] += 1;
        }
        assert_eq!(count, [20; 4]);
    }
}

#[test]
fn stdin_is_streamed_to_rank_0_until_its_end() {
    // More than any pipe buffer; rank 0 must see every byte and then end of input, the
    // others nothing.
    let data: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
    let mut child =
        tmpirun(&["-n", "3", "--tag-output", "sh", "-c", "cksum"]).stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().unwrap();
    let mut w = child.stdin.take().unwrap();
    let feeder = {
        let data = data.clone();
        std::thread::spawn(move || w.write_all(&data))
    };
    let out = child.wait_with_output().unwrap();
    feeder.join().unwrap().unwrap();
    assert!(out.status.success());
    // The same checksum computed locally.
    let mut local = Command::new("cksum").stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().unwrap();
    local.stdin.take().unwrap().write_all(&data).unwrap();
    let want = text(&local.wait_with_output().unwrap().stdout).trim().to_string();
    let empty = text(&Command::new("cksum").stdin(Stdio::null()).output().unwrap().stdout).trim().to_string();
    assert_eq!(sorted_lines(&out.stdout), [format!("[0] {want}"), format!("[1] {empty}"), format!("[2] {empty}")]);
}

#[test]
fn exports_with_and_without_value() {
    let out = tmpirun(&["-n", "1", "-x", "TMPIRUN_TEST_A=1=2", "-x", "TMPIRUN_TEST_B", "sh", "-c", "echo $TMPIRUN_TEST_A/$TMPIRUN_TEST_B"])
        .env("TMPIRUN_TEST_B", "from-env")
        .output()
        .unwrap();
    assert_eq!(text(&out.stdout).trim(), "1=2/from-env");
    let out = run(&["-n", "1", "-x", "TMPI_RANK=5", "true"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("set by tmpirun"));
}

#[test]
fn stdin_goes_to_rank_0_only() {
    let mut child = tmpirun(&["-n", "2", "--tag-output", "sh", "-c", "read x; echo \"got[$x]\""])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(b"hello\n").unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(sorted_lines(&out.stdout), ["[0] got[hello]", "[1] got[]"]);
}

#[test]
fn np_spelling_and_trailing_arguments() {
    let out = run(&["-np", "1", "sh", "-c", "printf '%s|' \"$@\"", "sh", "-n", "--tag-output", "-x"]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(text(&out.stdout), "-n|--tag-output|-x|");
}

#[test]
fn bad_command_lines_are_clear_errors() {
    let out = run(&["-n", "1", "surely-no-such-program-tmpi"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("not found in PATH"));
    let out = run(&["-n", "0", "true"]);
    assert_eq!(out.status.code(), Some(2));
    let out = run(&["true"]);
    assert_eq!(out.status.code(), Some(2));
    let too_many = (ncpus() + 1).to_string();
    let out = run(&["-n", &too_many, "--no-oversubscribe", "true"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("--no-oversubscribe"), "{}", text(&out.stderr));
    let out = run(&["-n", &too_many, "--oversubscribe", "true"]);
    assert!(out.status.success());
    let out = run(&["-n", &too_many, "true"]);
    assert!(out.status.success(), "oversubscription is the default");
}

#[test]
fn bindings_are_applied_and_reported() {
    let n = ncpus().min(2);
    let out = run(&["-n", &n.to_string(), "--report-bindings", "--tag-output", "grep", "Cpus_allowed_list", "/proc/self/status"]);
    assert!(out.status.success());
    let err = text(&out.stderr);
    // One line per rank, naming its core and that core's CPUs.
    for r in 0..n {
        let prefix = format!("tmpirun: rank {r} bound to core ");
        assert_eq!(err.lines().filter(|l| l.starts_with(&prefix)).count(), 1, "{err}");
    }
    // Each rank runs on exactly one CPU, and they differ.
    let cpus: std::collections::HashSet<String> = text(&out.stdout).lines().map(|l| l.rsplit('\t').next().unwrap().to_string()).collect();
    assert_eq!(cpus.len(), n, "{}", text(&out.stdout));
    let out = run(&["-n", "1", "--bind-to", "none", "--report-bindings", "true"]);
    assert!(text(&out.stderr).contains("rank 0 not bound"));
}

#[test]
fn info_and_version() {
    let out = run(&["--info"]);
    assert!(out.status.success());
    let s = text(&out.stdout);
    for k in ["TMPI_EAGER_LIMIT", "TMPI_MR_CACHE_MONITOR", "TMPI_POLL_SPIN", "TMPI_RANK"] {
        assert!(s.contains(k), "{k} missing from --info");
    }
    let out = run(&["--version"]);
    assert!(text(&out.stdout).starts_with("tmpirun "));
}

// ---- ranks that speak to the bootstrap service: this test binary run as each rank ----

/// Not a test on its own: the body of a rank, run by the tests below through tmpirun.
#[test]
#[ignore = "helper: runs as a rank under tmpirun"]
fn rank_helper() {
    use tmpi_transport::bootstrap::BootstrapClient;
    let Some((mut kv, env)) = BootstrapClient::from_env().unwrap() else {
        return;
    };
    match std::env::var("TMPIRUN_TEST_SCENARIO").as_deref() {
        Ok("kv") => {
            kv.put(&format!("k{}", env.rank), format!("v{}", env.rank).as_bytes()).unwrap();
            kv.fence().unwrap();
            let all: Vec<String> = (0..env.size).map(|r| text(&kv.get(&format!("k{r}")).unwrap())).collect();
            println!("RANK {} SEES {}", env.rank, all.join(","));
            kv.finalize().unwrap();
        }
        Ok("abort") => {
            if env.rank == 1 {
                let code = std::env::var("TMPIRUN_TEST_CODE").map_or(7, |c| c.parse().unwrap());
                kv.abort(code, "boom").unwrap();
            }
            std::thread::sleep(Duration::from_secs(100));
        }
        Ok("lost") => {
            // Rank 1 drops its connection, and dies only a little later; rank 0's fence
            // fails at once because rank 1 is gone, and it exits first.
            if env.rank == 1 {
                drop(kv);
                std::thread::sleep(Duration::from_millis(100));
                std::process::exit(9);
            }
            let e = kv.fence().unwrap_err();
            eprintln!("rank {}: fence failed: {e}", env.rank);
            std::process::exit(1);
        }
        Ok("hang") => {
            // Every rank has connected once the fence returns.
            kv.fence().unwrap();
            println!("READY {}", std::env::var("TMPI_BOOTSTRAP").unwrap_or_default());
            std::thread::sleep(Duration::from_secs(100));
        }
        other => panic!("unknown scenario {other:?}"),
    }
}

fn helper_cmd(scenario: &str, n: &str) -> Command {
    let me = std::env::current_exe().unwrap();
    let mut c = tmpirun(&["-n", n, "--oversubscribe", "--timeout", "20", "--report-pids"]);
    c.arg(me).args(["--exact", "rank_helper", "--ignored", "--nocapture", "--test-threads=1", "-q"]).env("TMPIRUN_TEST_SCENARIO", scenario);
    c
}

fn run_helper(scenario: &str, n: &str) -> Output {
    helper_cmd(scenario, n).output().unwrap()
}

#[test]
fn a_sigkilled_tmpirun_leaves_nothing_behind_once_ranks_connected() {
    let mut child = helper_cmd("hang", "2").stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut socks = Vec::new();
    while socks.len() < 2 {
        let mut line = String::new();
        assert!(out.read_line(&mut line).unwrap() > 0, "tmpirun ended early");
        if let Some(p) = line.trim().strip_prefix("READY ") {
            socks.push(std::path::PathBuf::from(p));
        }
    }
    // The socket's directory goes as soon as every rank has connected.
    let dir = socks[0].parent().unwrap().to_path_buf();
    let t = Instant::now();
    while dir.exists() {
        assert!(t.elapsed() < Duration::from_secs(2), "{} still there", dir.display());
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(unsafe_kill(child.id() as i32, libc::SIGKILL), 0);
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    child.wait().unwrap();
    let pids = pids_reported(&err);
    assert_eq!(pids.len(), 2, "{err}");
    assert_gone(&pids);
}

#[test]
fn ranks_exchange_keys_through_the_bootstrap_service() {
    let out = run_helper("kv", "3");
    assert!(out.status.success(), "{}", text(&out.stderr));
    let lines: Vec<String> = sorted_lines(&out.stdout).into_iter().filter(|l| l.starts_with("RANK ")).collect();
    assert_eq!(lines, ["RANK 0 SEES v0,v1,v2", "RANK 1 SEES v0,v1,v2", "RANK 2 SEES v0,v1,v2"]);
}

#[test]
fn the_rank_that_went_first_is_reported_not_the_one_that_noticed() {
    let out = run_helper("lost", "2");
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(9), "{err}");
    assert!(err.contains("tmpirun: rank 1 (pid "), "{err}");
    assert!(!err.contains("tmpirun: rank 0 (pid "), "{err}");
}

#[test]
fn abort_ends_the_job_with_its_code() {
    let t = Instant::now();
    let out = run_helper("abort", "2");
    assert!(t.elapsed() < Duration::from_secs(5));
    assert_eq!(out.status.code(), Some(7), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("rank 1 called abort with code 7: boom"));
    // An aborted job never reports success, and a code that is no exit status becomes 1.
    for (code, status) in [(0, 1), (255, 255), (256, 1), (-3, 1)] {
        let out = helper_cmd("abort", "2").env("TMPIRUN_TEST_CODE", code.to_string()).output().unwrap();
        assert_eq!(out.status.code(), Some(status), "abort({code})");
        let want = format!("rank 1 called abort with code {code}: boom");
        assert!(text(&out.stderr).contains(&want), "abort({code})");
    }
}

#[test]
fn a_panicking_tmpirun_still_cleans_up() {
    let out = tmpirun(&[
        "-n",
        "2",
        "--report-pids",
        "sh",
        "-c",
        "if [ $TMPI_RANK = 0 ]; then touch /dev/shm/$TMPI_SHM_NAME; echo $TMPI_SHM_NAME; fi; \
         exec sleep 100",
    ])
    .env("TMPIRUN_TEST_PANIC", "1")
    .output()
    .unwrap();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let err = text(&out.stderr);
    assert!(err.contains("panicking after the first line"), "{err}");
    let name = text(&out.stdout).trim().to_string();
    assert!(name.starts_with("tmpi-"), "{name}");
    assert!(!std::path::Path::new(&format!("/dev/shm/{name}")).exists());
    assert_gone(&pids_reported(&err));
}
