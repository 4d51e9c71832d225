//! Oversubscription: 32 ranks on this 2-core machine run `ring` and an allreduce loop to
//! completion (the progress engine yields instead of spinning when ranks outnumber cores);
//! 256 ranks run a ring, a long shift, an `alltoall` and an `allreduce` in shared memory that
//! grows with the ranks (the queued layout), and `hello` starts and ends cleanly; the queued
//! layout also carries random point-to-point mixes when forced on small jobs.

use std::time::{Duration, Instant};

use tmpi_tests::Job;

/// The `scalecheck` figures: (bytes of the segment allocated in the tmpfs, bytes mapped).
fn shm_figures(out: &tmpi_tests::Outcome) -> (u64, u64) {
    let line = out.stdout_lines().into_iter().find(|l| l.starts_with("scalecheck: shm ")).map(str::to_string);
    let line = line.unwrap_or_else(|| panic!("no shm line\n{}", out.report()));
    let field = |k: &str| -> u64 {
        let v = line.split_whitespace().find_map(|w| w.strip_prefix(k)).unwrap_or_else(|| panic!("no {k} in {line:?}"));
        v.parse().unwrap_or_else(|_| panic!("bad {k} in {line:?}"))
    };
    (field("allocated="), field("mapped="))
}

/// 256 ranks on 2 cores: every pair talks (alltoall), a 256 KiB message streams between each
/// neighbour pair, and the job's shared memory stays far below a ring per pair's (4.3 GB at
/// 64 KiB rings): at most 2.3 MiB a rank could ever take, and less is actually allocated.
#[test]
fn two_hundred_fifty_six_ranks_in_shared_memory_that_grows_with_the_ranks() {
    let t = Instant::now();
    let out = Job::tmpirun(256, "scalecheck").timeout(Duration::from_secs(600)).run();
    out.assert_ok_line("scalecheck: 256 ranks");
    let (alloc, mapped) = shm_figures(&out);
    let whole = tmpi_transport::shm::segment::segment_bytes(256, tmpi_transport::shm::segment::QUEUED).expect("size");
    assert_eq!(mapped, whole, "the queued layout's whole size is mapped\n{}", out.report());
    assert!(whole < 1 << 30, "{whole} bytes at 256 ranks");
    assert!(alloc > 0 && alloc <= whole, "allocated {alloc} of {whole}");
    eprintln!("scalecheck at 256 ranks: {:?}, shm allocated {alloc} of {mapped} mapped", t.elapsed());
}

/// Small jobs keep a ring per ordered pair, every page allocated at start, as before.
#[test]
fn eight_ranks_keep_a_ring_per_pair() {
    let out = Job::tmpirun(8, "scalecheck").run();
    out.assert_ok_line("scalecheck: 8 ranks");
    let (alloc, mapped) = shm_figures(&out);
    assert!(mapped >= 64 << 20 && alloc >= mapped, "8 x 8 rings of 1 MiB, all allocated: {alloc} of {mapped}\n{}", out.report());
}

/// The queued layout forced on small jobs carries random mixes of point-to-point traffic
/// (every size class, wildcards, probes, truncation) and the scale check.
#[test]
fn queued_layout_carries_random_mixes_at_2_3_and_5_ranks() {
    for (n, seed) in [(2, 11), (3, 12), (5, 13)] {
        let out = Job::tmpirun(n, "randmix")
            .arg("--seed")
            .arg(seed.to_string())
            .env("TMPI_SHM_PAIRS_MAX", "1")
            .timeout(Duration::from_secs(180))
            .run();
        out.assert_ok_line("randmix: ");
    }
    let out = Job::tmpirun(4, "scalecheck").arg("3000000").env("TMPI_SHM_PAIRS_MAX", "1").run();
    out.assert_ok_line("scalecheck: 4 ranks");
    let (alloc, mapped) = shm_figures(&out);
    assert!(alloc < mapped, "fragments are allocated as used: {alloc} of {mapped}");
}

/// `tmpirun -n 256 hello` on 2 cores starts every rank and ends cleanly.
#[test]
fn two_hundred_fifty_six_ranks_say_hello() {
    let t = Instant::now();
    let out = Job::tmpirun(256, "hello").timeout(Duration::from_secs(300)).run();
    out.assert_success();
    out.assert_no_leak();
    let hellos = out.stdout_lines().iter().filter(|l| l.starts_with("Hello from rank ")).count();
    assert_eq!(hellos, 256, "{}", out.report());
    eprintln!("hello at 256 ranks: {:?}", t.elapsed());
}

#[test]
fn thirty_two_ranks_ring() {
    let t = Instant::now();
    let out = Job::tmpirun(32, "ring").timeout(Duration::from_secs(120)).run();
    out.assert_ok_line("ring: ");
    eprintln!("ring at 32 ranks: {:?}", t.elapsed());
}

#[test]
fn thirty_two_ranks_allreduce_loop() {
    let t = Instant::now();
    let out = Job::tmpirun(32, "osu_allreduce")
        .arg("-m")
        .arg("8:1024")
        .arg("-i")
        .arg("100")
        .arg("-x")
        .arg("10")
        .timeout(Duration::from_secs(180))
        .run();
    out.assert_success();
    out.assert_no_leak();
    let rows =
        out.stdout_lines().iter().filter(|l| l.split_whitespace().count() == 2 && l.starts_with(|c: char| c.is_ascii_digit())).count();
    assert_eq!(rows, 8, "one row per size 8..=1024\n{}", out.report());
    eprintln!("allreduce loop at 32 ranks: {:?}", t.elapsed());
}

/// A job whose ranks need more open files in tmpirun than its hard limit allows is refused
/// before any rank starts, with the figures (it used to start hundreds of ranks and fail in
/// the middle with "start rank 505: Too many open files" at `-n 600` under a limit of 1024).
#[test]
fn a_job_beyond_the_open_file_limit_is_refused_before_it_starts() {
    let script = format!(
        "ulimit -n 200 && ulimit -Hn 200 && exec {} -n 100 {}",
        tmpi_tests::tmpirun().display(),
        tmpi_tests::release_bin("hello").display()
    );
    let out = std::process::Command::new("sh").arg("-c").arg(&script).output().expect("sh");
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.status.code(), Some(2), "{stdout}{stderr}");
    assert!(
        stderr.contains("100 ranks on this host and 0 on others need about 332 open files") && stderr.contains("its limit is 200"),
        "{stderr}"
    );
    assert!(!stdout.contains("Hello"), "no rank started: {stdout}");
}
