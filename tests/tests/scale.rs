//! Oversubscription: 32 ranks on this 2-core machine run `ring` and an allreduce loop to
//! completion (the progress engine yields instead of spinning when ranks outnumber cores).

use std::time::{Duration, Instant};

use tmpi_tests::Job;

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
