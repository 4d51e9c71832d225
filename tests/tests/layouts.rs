//! `send_layout`/`recv_layout` on every fabric (`layouts`, issue 55 item 4): layouts of 1 to
//! 20 blocks, 64 blocks and a rendezvous, between every ordered pair of ranks, over shared
//! memory, TCP and across simulated nodes (shared memory within a node, TCP between them). A
//! layout is gathered straight into one packet only where the fabric takes that many parts.

use std::time::Duration;

use tmpi_tests::Job;

fn layouts(job: Job, n: usize) {
    let out = job.timeout(Duration::from_secs(120)).run();
    let line = out.assert_ok_line("layouts: ");
    assert!(line.contains(&format!("{n} ranks")), "{line:?}\n{}", out.report());
    out.assert_no_leak();
}

#[test]
fn layouts_over_shm() {
    for n in [2, 3] {
        layouts(Job::tmpirun(n, "layouts"), n);
    }
}

#[test]
fn layouts_over_tcp() {
    for n in [2, 3] {
        layouts(Job::tmpirun(n, "layouts").env("TMPI_FABRIC", "tcp"), n);
    }
}

#[test]
fn layouts_across_nodes() {
    layouts(Job::tmpirun(4, "layouts").nodes_of(2), 4);
}
