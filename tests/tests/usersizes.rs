//! Sizes from the caller are errors in a real job (`usersizes`, issue 55 item 7): at 1, 2 and
//! 3 ranks, over shared memory and TCP.

use tmpi_tests::Job;

#[test]
fn sizes_beyond_memory_are_refused_and_the_job_goes_on() {
    for (n, fabric) in [(1, "auto"), (2, "auto"), (3, "auto"), (2, "tcp")] {
        let out = Job::tmpirun(n, "usersizes").env("TMPI_FABRIC", fabric).run();
        let line = out.assert_ok_line("usersizes: ");
        assert!(line.contains(&format!("{n} ranks")), "{line:?}");
    }
}
