//! Variable-count collectives, reduce-scatter and prefix reductions through `tmpirun`
//! (`vcoll`): at 2, 3 and 5 ranks, and alone.

use std::time::Duration;

use tmpi_tests::Job;

fn vcoll(n: usize) {
    let out = Job::tmpirun(n, "vcoll").timeout(Duration::from_secs(120)).run();
    let line = out.assert_ok_line("vcoll: ");
    assert!(line.contains(&format!("{n} ranks")), "{line:?}");
    out.assert_no_leak();
}

#[test]
fn vcoll_at_1_rank() {
    vcoll(1);
}

#[test]
fn vcoll_at_2_3_5_ranks() {
    for n in [2, 3, 5] {
        vcoll(n);
    }
}

#[test]
fn vcoll_at_7_ranks() {
    vcoll(7);
}
