//! A failing rank ends the job quickly and completely; a bad `TMPI_*` value stops `init`; so
//! does a segment larger than `/dev/shm` (with the sizes in the message).

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
    ("TMPI_MR_CACHE_MONITOR", "kernel"),
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
    Some(st.f_blocks.saturating_mul(st.f_frsize))
}
