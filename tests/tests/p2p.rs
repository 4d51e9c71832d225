//! Point-to-point through real jobs: semantics and bad arguments (`badcalls`), the API
//! contract's usage snippet (`apisnippet`), many messages in flight (`inflight`) and
//! communicator isolation (`isolation`).

use std::time::Duration;

use tmpi_tests::Job;

fn run_ok(program: &str, n: usize) {
    let out = Job::tmpirun(n, program).timeout(Duration::from_secs(120)).run();
    let line = out.assert_ok_line(&format!("{program}: "));
    assert!(line.contains(&format!("{n} ranks")), "{program} at {n}: {line:?}");
}

#[test]
fn badcalls_at_1_2_3_ranks() {
    for n in [1, 2, 3] {
        run_ok("badcalls", n);
    }
}

#[test]
fn api_snippet_at_2_3_4_ranks() {
    for n in [2, 3, 4] {
        run_ok("apisnippet", n);
    }
}

#[test]
fn sixty_four_in_flight_at_1_2_3_ranks() {
    for n in [1, 2, 3] {
        run_ok("inflight", n);
    }
}

#[test]
fn split_and_dup_isolation_at_2_3_4_ranks() {
    for n in [2, 3, 4] {
        run_ok("isolation", n);
    }
}

#[test]
fn p2p_programs_with_tm_offload_off_and_tiny() {
    for tags in ["0", "1"] {
        for program in ["badcalls", "inflight"] {
            let out = Job::tmpirun(2, program).env("TMPI_TM_MAX_TAGS", tags).timeout(Duration::from_secs(120)).run();
            out.assert_ok_line(&format!("{program}: 2 ranks"));
        }
    }
}

#[test]
fn the_test_programs_run_alone() {
    for program in ["badcalls", "apisnippet", "inflight", "isolation"] {
        let out = Job::alone(program).run();
        out.assert_ok_line(&format!("{program}: 1 ranks"));
    }
}
