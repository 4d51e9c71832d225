//! A failing rank ends the job quickly and completely; a bad `TMPI_*` value stops `init`; so
//! does a segment larger than `/dev/shm` (with the sizes in the message); strangers cannot
//! join or disturb a job through its bootstrap socket.

use std::time::Duration;

use tmpi_tests::{pid_exists, pid_state, shm_files, Job, Outcome};

/// Runs `panicker <victim>` at `n` ranks and checks that the job failed fast, named the rank,
/// and left no process and no shared-memory file behind.
fn panicking_rank(n: usize, victim: usize) {
    let out = Job::tmpirun(n, "panicker").flag("--report-pids").arg(victim.to_string()).timeout(Duration::from_secs(30)).run();
    let report = out.report();
    assert!(!out.success(), "a panicking rank must fail the job\n{report}");
    assert!(!out.killed_by_harness, "tmpirun did not end by itself\n{report}");
    assert_ne!(out.code(), Some(124), "the job ran into its --timeout\n{report}");
    assert!(out.elapsed < Duration::from_secs(5), "the job took {:.2?} to end after a rank panicked (limit 5 s)\n{report}", out.elapsed);
    // Not the `--report-pids` line: the failure report, `tmpirun: rank R (pid P) exited ...`.
    let named = format!("tmpirun: rank {victim} (pid ");
    assert!(
        out.stderr.lines().any(|l| l.starts_with(&named) && l.contains("exited with code 101")),
        "stderr does not report rank {victim} exiting with the panic status 101\n{report}"
    );
    assert_eq!(out.code(), Some(101), "tmpirun's status should be the panicking rank's\n{report}");
    assert!(out.stderr.contains("deliberate panic"), "the rank's panic message was not forwarded\n{report}");
    let pids = out.reported_pids();
    let mut ranks: Vec<usize> = pids.iter().map(|&(r, _)| r).collect();
    ranks.sort_unstable();
    assert_eq!(ranks, (0..n).collect::<Vec<_>>(), "--report-pids lines\n{report}");
    for (rank, pid) in pids {
        assert!(!pid_exists(pid), "rank {rank} (pid {pid}) still exists after tmpirun exited: {}\n{report}", pid_state(pid));
    }
    check_job_files(&out);
}

/// No `/dev/shm/tmpi-<jobid>*` of the job printed by rank 0, and no other new `tmpi-` file.
fn check_job_files(out: &Outcome) {
    let jobid = out
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("panicker: jobid="))
        .unwrap_or_else(|| panic!("no jobid line\n{}", out.report()))
        .trim()
        .to_string();
    assert_eq!(jobid.len(), 16, "jobid {jobid:?}");
    let prefix = format!("tmpi-{jobid}");
    let left: Vec<String> = shm_files().into_iter().filter(|f| f.starts_with(&prefix)).collect();
    assert!(left.is_empty(), "files of the job left in /dev/shm: {left:?}\n{}", out.report());
    out.assert_no_leak();
}

#[test]
fn panic_on_rank_1_of_2() {
    panicking_rank(2, 1);
}

#[test]
fn panic_on_rank_1_of_4() {
    panicking_rank(4, 1);
}

#[test]
fn panic_on_rank_0_of_3() {
    panicking_rank(3, 0);
}

#[test]
fn panic_on_rank_5_of_8_oversubscribed() {
    panicking_rank(8, 5);
}

/// Values that `tmpi::config` refuses, one per kind of check.
const BAD_VALUES: [(&str, &str); 5] = [
    ("TMPI_SHM_RING_SIZE", "5000"),
    ("TMPI_TM_MAX_TAGS", "-1"),
    ("TMPI_EAGER_LIMIT", "1"),
    ("TMPI_STATS", "maybe"),
    ("TMPI_MR_CACHE_MONITOR", "memhooks"),
];

fn assert_init_refused(out: &Outcome, var: &str) {
    let report = out.report();
    assert!(!out.success(), "{var}: a bad value must fail the job\n{report}");
    assert!(!out.killed_by_harness, "{var}: the job hung\n{report}");
    assert!(out.elapsed < Duration::from_secs(10), "{var}: took {:.2?} to fail\n{report}", out.elapsed);
    assert!(out.stderr.contains(var), "{var}: stderr does not name the variable\n{report}");
    assert!(!out.stdout.contains("Hello from"), "{var}: init succeeded somewhere despite the bad value\n{report}");
    out.assert_no_leak();
}

#[test]
fn bad_knob_value_fails_init_naming_the_variable() {
    for (var, value) in BAD_VALUES {
        let out = Job::tmpirun(2, "hello").env(var, value).timeout(Duration::from_secs(30)).run();
        assert_init_refused(&out, var);
    }
}

#[test]
fn bad_knob_value_through_dash_x() {
    let out = Job::tmpirun(3, "hello").flag("-x").flag("TMPI_SHM_RING_SIZE=5000").timeout(Duration::from_secs(30)).run();
    assert_init_refused(&out, "TMPI_SHM_RING_SIZE");
}

#[test]
fn bad_knob_value_in_a_singleton() {
    for (var, value) in BAD_VALUES {
        let out = Job::alone("hello").env(var, value).run();
        assert_init_refused(&out, var);
    }
}

#[test]
fn good_knob_values_are_accepted() {
    let out = Job::tmpirun(3, "ring")
        .env("TMPI_SHM_RING_SIZE", "8192")
        .env("TMPI_STATS", "0")
        .env("TMPI_POLL_SPIN", "10")
        .env("TMPI_EAGER_LIMIT", "4096")
        .env("TMPI_RNDV_THRESHOLD", "4096")
        .run();
    out.assert_ok_line("ring: 3 ranks");
}

/// The job's shared-memory segment cannot be had: `init` fails at once with a message that
/// says how much was needed and how much `/dev/shm` has, instead of a SIGBUS in the middle
/// of the run. Rings of 1 GiB at N ranks need N * N GiB: N is chosen above the size of
/// `/dev/shm` (tmpfs refuses that before allocating anything, so the test takes no memory).
#[test]
fn a_segment_larger_than_dev_shm_fails_init_with_the_sizes() {
    let Some(total) = dev_shm_size() else {
        eprintln!("skipped: statvfs(/dev/shm) failed");
        return;
    };
    let Some(np) = (2..=8usize).find(|&n| (n * n) as u64 * (1 << 30) > total + (1 << 30)) else {
        eprintln!("skipped: /dev/shm ({total} bytes) is larger than 8 ranks with 1 GiB rings can ask");
        return;
    };
    let out = Job::tmpirun(np, "hello").env("TMPI_SHM_RING_SIZE", "1073741824").timeout(Duration::from_secs(30)).run();
    let report = out.report();
    assert!(!out.success() && !out.killed_by_harness, "{report}");
    assert_ne!(out.code(), Some(124), "the job hung\n{report}");
    assert!(out.elapsed < Duration::from_secs(10), "took {:.2?}\n{report}", out.elapsed);
    assert!(
        out.stderr.contains("needs") && out.stderr.contains("free") && out.stderr.contains("/dev/shm"),
        "the error does not say what was needed and what is free where\n{report}"
    );
    assert!(!out.stderr.contains("SIGBUS"), "{report}");
    out.assert_no_leak();
}

/// Size of the file system of `/dev/shm`.
fn dev_shm_size() -> Option<u64> {
    let mut st = std::mem::MaybeUninit::<libc::statvfs>::zeroed();
    // SAFETY: a NUL-terminated literal path and writable storage for one statvfs.
    if unsafe { libc::statvfs(c"/dev/shm".as_ptr(), st.as_mut_ptr()) } != 0 {
        return None;
    }
    // SAFETY: filled by statvfs (zeroed before in any case).
    let st = unsafe { st.assume_init() };
    Some((st.f_blocks as u64).saturating_mul(st.f_frsize as u64))
}

/// A hello frame of the bootstrap protocol (version 2) for `rank` of `size` with `secret`.
fn hello_frame(rank: u32, size: u32, secret: &[u8; 16]) -> Vec<u8> {
    let mut f = 29u32.to_le_bytes().to_vec();
    f.push(1);
    for v in [2u32, rank, size] {
        f.extend_from_slice(&v.to_le_bytes());
    }
    f.extend_from_slice(secret);
    f
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
        Err(_) => false,
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
    use std::io::{BufRead, BufReader};
    let np = 3;
    let gofile = std::env::temp_dir().join(format!("tmpi-strangers-go-{}", std::process::id()));
    let _ = std::fs::remove_file(&gofile);
    let mut child = std::process::Command::new(tmpi_tests::tmpirun())
        .args(["-n", &np.to_string(), "--report-pids", "--timeout", "30"])
        .arg(tmpi_tests::release_bin("faultmatrix"))
        .arg("strangers")
        .arg(&gofile)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start tmpirun");
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
    drop(tx);
    let (mut out, mut err) = (Vec::<String>::new(), Vec::<String>::new());
    let mut wait_for = |out: &mut Vec<String>, err: &mut Vec<String>, what: &str, done: &dyn Fn(&[String], &[String]) -> bool| {
        while !done(out, err) {
            match rx.recv_timeout(Duration::from_secs(20)) {
                Ok((true, l)) => err.push(l),
                Ok((false, l)) => out.push(l),
                Err(_) => panic!("the job ended or hung before {what}\nstdout: {out:#?}\nstderr: {err:#?}"),
            }
        }
    };
    wait_for(&mut out, &mut err, "SOCK and the pids", &|o, e| {
        o.iter().any(|l| l.starts_with("SOCK "))
            && e.iter().filter(|l| l.starts_with("tmpirun: rank ") && l.contains(" pid ")).count() == np
    });
    let sock = out.iter().find_map(|l| l.strip_prefix("SOCK ")).expect("SOCK").to_string();
    let pids: Vec<i32> = err.iter().filter_map(|l| l.strip_prefix("tmpirun: rank ")?.split_once(" pid ")?.1.trim().parse().ok()).collect();
    let right = secret_of(pids[1]).expect("rank 1's TMPI_JOB_SECRET");
    assert!(knock(&sock, &hello_frame(2, np as u32, b"0123456789abcdef")), "a wrong secret was admitted");
    assert!(knock(&sock, &hello_frame(2, np as u32, &right)), "a process that is no rank was admitted with the right secret");
    assert!(knock(&sock, &[0x42; 100]), "garbage was admitted");
    wait_for(&mut out, &mut err, "the intruder's report", &|_, e| e.iter().any(|l| l.starts_with("INTRUDER ")));
    std::fs::write(&gofile, b"go").expect("create the go file");
    let status = child.wait().expect("wait for tmpirun");
    while let Ok((is_err, l)) = rx.recv_timeout(Duration::from_secs(5)) {
        if is_err {
            err.push(l)
        } else {
            out.push(l)
        }
    }
    let _ = std::fs::remove_file(&gofile);
    let ctx = format!("status {status:?}\nstdout: {out:#?}\nstderr: {err:#?}");
    assert!(status.success(), "the job was disturbed\n{ctx}");
    assert!(out.iter().any(|l| l == "faultmatrix: strangers: OK"), "{ctx}");
    let intruder = err.iter().find(|l| l.starts_with("INTRUDER ")).expect("INTRUDER line");
    assert!(intruder.contains("secret"), "a rank's child with a wrong secret must be refused for it: {intruder}\n{ctx}");
    let first: Vec<&String> = err.iter().filter(|l| l.starts_with("tmpirun: bootstrap: refused a connection from")).collect();
    assert_eq!(first.len(), 1, "the first refusal is reported once\n{ctx}");
    assert!(err.iter().any(|l| l.starts_with("tmpirun: bootstrap: refused 4 connection(s)")), "4 refusals counted\n{ctx}");
}
