//! The shared-memory collectives through `tmpirun` (`shmcoll`): correct at 1 to 9 ranks on
//! the world, dup and split communicators, with point-to-point traffic in flight, when ranks
//! outnumber the cores, when communicators outnumber the pool of collective contexts, and
//! between collectives that never use the slots (gather, scatter...); and a rank that
//! finalizes while the others wait in a shared-memory barrier or allreduce ends their wait
//! with `PeerGone`.

use std::time::Duration;

use tmpi_tests::Job;

fn check(n: usize, rounds: u32) {
    let out = Job::tmpirun(n, "shmcoll").arg("check").arg(rounds.to_string()).timeout(Duration::from_secs(120)).run();
    let line = out.assert_ok_line("shmcoll: ");
    assert!(line.contains(&format!("{n} ranks")), "{line:?}");
}

#[test]
fn shm_collectives_at_1_to_5_ranks() {
    for n in 1..=5 {
        check(n, 10);
    }
}

#[test]
fn shm_collectives_at_6_to_9_ranks() {
    for n in 6..=9 {
        check(n, 4);
    }
}

/// 16 ranks on a machine of a few cores: every wait ends on a doorbell or a timeout.
#[test]
fn shm_collectives_oversubscribed() {
    check(16, 2);
}

/// Shared-memory collectives between collectives that do not synchronise the ranks (gather,
/// scatter, zero-length allgather): all-to-all (3 to 5 ranks) and through the leader (9).
#[test]
fn shm_collectives_between_gathers_and_scatters() {
    for (n, rounds) in [(3, 200), (4, 200), (5, 100), (9, 20)] {
        let out = Job::tmpirun(n, "shmcoll").arg("mixed").arg(rounds.to_string()).timeout(Duration::from_secs(120)).run();
        let line = out.assert_ok_line("shmcoll: mixed: ");
        assert!(line.contains(&format!("{n} ranks")), "{line:?}");
    }
}

/// The leader (rank 0), another rank, and the last rank finalize while the others wait.
#[test]
fn a_rank_that_leaves_ends_the_wait() {
    for (n, victim) in [(2, 1), (4, 0), (4, 2), (5, 4)] {
        let out = Job::tmpirun(n, "shmcoll").arg("leave").arg(victim.to_string()).timeout(Duration::from_secs(60)).run();
        out.assert_success();
        let oks = out.stdout_lines().iter().filter(|l| l.contains("PeerGone OK")).count();
        assert_eq!(oks, n - 1, "{}", out.report());
        assert!(out.elapsed < Duration::from_secs(30), "took {:.2?}", out.elapsed);
    }
}
