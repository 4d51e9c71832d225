//! Non-blocking collectives through `tmpirun` (`nbc`): at 1 to 7 ranks.

use std::time::Duration;

use tmpi_tests::Job;

fn nbc(n: usize) {
    let out = Job::tmpirun(n, "nbc").timeout(Duration::from_secs(180)).run();
    let line = out.assert_ok_line("nbc: ");
    assert!(line.contains(&format!("{n} ranks")), "{line:?}");
    out.assert_no_leak();
}

#[test]
fn nbc_at_1_rank() {
    nbc(1);
}

#[test]
fn nbc_at_2_3_4_ranks() {
    for n in [2, 3, 4] {
        nbc(n);
    }
}

#[test]
fn nbc_at_5_6_7_ranks() {
    for n in [5, 6, 7] {
        nbc(n);
    }
}
