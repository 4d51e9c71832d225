//! Communicator lifetimes (`commlife`, issue 55 item 1): a dropped communicator's id is not
//! agreed on again while a non-blocking collective, a pending receive (`ANY_SOURCE`) or a
//! matched-probe message on it still runs, so the next `dup`'s messages never cross with the
//! old ones. Over shared memory (with and without the shared-memory collectives), over TCP and
//! across simulated nodes.

use std::time::Duration;

use tmpi_tests::Job;

fn commlife(job: Job, n: usize) {
    let out = job.timeout(Duration::from_secs(120)).run();
    let line = out.assert_ok_line("commlife: ");
    assert!(line.contains(&format!("{n} ranks, 20 rounds")), "{line:?}\n{}", out.report());
    out.assert_no_leak();
}

#[test]
fn ids_outlive_their_users_over_shm() {
    for n in [2, 3] {
        commlife(Job::tmpirun(n, "commlife"), n);
    }
    commlife(Job::tmpirun(2, "commlife").env("TMPI_SHM_COLL", "off"), 2);
}

#[test]
fn ids_outlive_their_users_over_tcp() {
    for n in [2, 3] {
        commlife(Job::tmpirun(n, "commlife").env("TMPI_FABRIC", "tcp"), n);
    }
}

#[test]
fn ids_outlive_their_users_across_nodes() {
    commlife(Job::tmpirun(4, "commlife").nodes_of(2), 4);
}
