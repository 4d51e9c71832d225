//! Communicators from groups through `tmpirun` (`groupcomm`, issue 55 item 9): `create` with
//! disjoint groups and `create_group` among the members alone, their refusals, and the
//! communicators they give carrying messages and collectives; at 4, 5 and 6 ranks over shared
//! memory, and at 4 ranks over TCP and across two simulated nodes.

use tmpi_tests::Job;

#[test]
fn groupcomm_at_4_5_6_ranks() {
    for n in [4, 5, 6] {
        let out = Job::tmpirun(n, "groupcomm").run();
        let line = out.assert_ok_line("groupcomm: ");
        assert!(line.contains(&format!("{n} ranks")), "{line:?}");
    }
}

#[test]
fn groupcomm_over_tcp_and_across_nodes() {
    let line = Job::tmpirun(4, "groupcomm").env("TMPI_FABRIC", "tcp").run().assert_ok_line("groupcomm: ");
    assert!(line.contains("4 ranks"), "{line:?}");
    let line = Job::tmpirun(5, "groupcomm").nodes_of(2).run().assert_ok_line("groupcomm: ");
    assert!(line.contains("5 ranks"), "{line:?}");
}

/// Intercommunicators (issue 59 item 7) through `tmpirun`: every cut of the world in two,
/// point-to-point by remote rank, collectives across, dup, merge, refusals.
#[test]
fn intercomm_at_2_3_4_ranks() {
    for n in [2, 3, 4] {
        let line = Job::tmpirun(n, "groupcomm").arg("inter").run().assert_ok_line("groupcomm: ");
        assert!(line.contains(&format!("{n} ranks: intercommunicators over {n} cuts")), "{line:?}");
    }
}

#[test]
fn intercomm_over_tcp_and_across_nodes() {
    let line = Job::tmpirun(3, "groupcomm").arg("inter").env("TMPI_FABRIC", "tcp").run().assert_ok_line("groupcomm: ");
    assert!(line.contains("3 ranks"), "{line:?}");
    let line = Job::tmpirun(4, "groupcomm").arg("inter").nodes_of(2).run().assert_ok_line("groupcomm: ");
    assert!(line.contains("4 ranks"), "{line:?}");
}

/// Dynamic processes (issue 59 item 7): `spawn_multiple` with arguments, variables, a
/// directory and `appnum` checked in every child, a second spawn at once, at 1-3 parents.
#[test]
fn spawn_multiple_and_a_second_bridge() {
    for n in [1, 2, 3] {
        let line = Job::tmpirun(n, "spawner").arg("multi").run().assert_ok_line("spawner: ");
        assert!(line.contains(&format!("multi: {n} ranks")), "{line:?}");
    }
}

/// A spawn that cannot start (a missing program, arguments the root refuses, a program that
/// ends without joining) fails on every rank of the communicator, naming why, and the job goes
/// on.
#[test]
fn spawn_refusals_reach_every_rank() {
    for case in ["missing", "mismatch", "notmpi"] {
        let line = Job::tmpirun(3, "spawner").arg(case).run().assert_ok_line("spawner: ");
        assert!(line.contains(&format!("{case}: 3 ranks")), "{line:?}");
    }
}

/// A spawned process that fails ends the job with its exit code, and tmpirun names it.
#[test]
fn a_failing_child_ends_the_job() {
    let out = Job::tmpirun(2, "spawner").arg("childfail").run();
    assert_eq!(out.code(), Some(3), "{}", out.report());
    assert!(out.stderr.contains("spawn"), "the report names the spawned process\n{}", out.report());
}
