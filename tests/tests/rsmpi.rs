//! tmpi-rsmpi (the rsmpi-compatible `mpi` crate) through tmpirun: the `rsmpi_check` program's
//! checks at 1 to 5 ranks (more ranks than cores included).

use tmpi_tests::Job;

fn run(np: usize) {
    let out = Job::tmpirun(np, "rsmpi_check").run();
    out.assert_success();
    let oks = out.stdout_lines().iter().filter(|l| l.starts_with("rsmpi_check ok ")).count();
    assert_eq!(oks, np, "every rank reports its checks:\n{}", out.report());
}

#[test]
fn one_rank() {
    run(1);
}

#[test]
fn two_ranks() {
    run(2);
}

#[test]
fn three_ranks() {
    run(3);
}

#[test]
fn five_ranks() {
    run(5);
}
