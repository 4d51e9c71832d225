//! `Threading::Multiple` through real jobs: several threads per rank, each exchanging
//! thousands of tagged messages with the same thread of every other rank, blocking,
//! non-blocking, by `sendrecv` with rendezvous messages and by matched probe; every message is
//! checked for content and order (see `tests/src/bin/threadstress.rs`).

use std::time::Duration;

use tmpi_tests::Job;

fn stress(n: usize, threads: u32, msgs: u32, large_every: u32) -> Job {
    Job::tmpirun(n, "threadstress")
        .arg(threads.to_string())
        .arg(msgs.to_string())
        .arg(large_every.to_string())
        .timeout(Duration::from_secs(300))
}

fn expect_ok(job: &Job, n: usize, threads: u32, msgs: u32) {
    let out = job.run();
    out.assert_success();
    out.assert_no_leak();
    let line = out.assert_ok_line("threadstress: ");
    let want = format!("{threads} threads x {msgs} messages per peer on {n} ranks");
    assert!(line.contains(&want), "{line:?} does not say {want:?}\n{}", out.report());
    let received = u64::from(threads) * u64::from(msgs) * (n as u64 - 1);
    assert!(line.contains(&format!(", {received} received in order on rank 0")), "{line:?}\n{}", out.report());
}

/// 4 threads per rank, 4000 messages each way per thread and peer, on 2 and 3 ranks.
#[test]
fn four_threads_per_rank_on_2_and_3_ranks() {
    for n in [2, 3] {
        expect_ok(&stress(n, 4, 4000, 500), n, 4, 4000);
    }
}

/// More threads than cores and more ranks than cores: the back-off and the hand-off of the
/// engine between threads keep everyone moving.
#[test]
fn oversubscribed_threads_and_ranks() {
    expect_ok(&stress(5, 8, 1000, 100), 5, 8, 1000);
}

/// The same exchanges over the TCP fabric.
#[test]
fn over_tcp() {
    expect_ok(&stress(3, 4, 1000, 200).env("TMPI_FABRIC", "tcp"), 3, 4, 1000);
}

/// One rank: no peers, every thread starts and ends cleanly.
#[test]
fn a_single_rank() {
    let out = stress(1, 4, 100, 10).run();
    out.assert_success();
    out.assert_ok_line("threadstress: ");
}
