//! Every collective through `tmpirun` at 1..=9 ranks against locally computed values
//! (`collcheck`), and collectives with bad arguments (`badcoll`).

use std::time::Duration;

use tmpi_tests::Job;

fn collcheck(n: usize) {
    let out = Job::tmpirun(n, "collcheck").timeout(Duration::from_secs(90)).run();
    let line = out.assert_ok_line("collcheck: ");
    assert!(line.contains(&format!("{n} ranks")), "{line:?}");
}

#[test]
fn collectives_at_1_2_3_ranks() {
    for n in 1..=3 {
        collcheck(n);
    }
}

#[test]
fn collectives_at_4_5_6_ranks() {
    for n in 4..=6 {
        collcheck(n);
    }
}

#[test]
fn collectives_at_7_8_9_ranks() {
    for n in 7..=9 {
        collcheck(n);
    }
}

#[test]
fn collectives_with_tm_offload_off() {
    let out = Job::tmpirun(4, "collcheck").arg("65536").env("TMPI_TM_MAX_TAGS", "0").timeout(Duration::from_secs(90)).run();
    out.assert_ok_line("collcheck: 4 ranks");
}

#[test]
fn bad_collective_arguments_return_errors() {
    for n in [1, 2, 3, 5] {
        let out = Job::tmpirun(n, "badcoll").timeout(Duration::from_secs(60)).run();
        let line = out.assert_ok_line("badcoll: ");
        assert!(line.contains(&format!("{n} ranks")), "{line:?}");
        assert!(out.elapsed < Duration::from_secs(20), "badcoll at {n} ranks took {:.2?}: something waited", out.elapsed);
    }
}

/// The same through the point-to-point collectives alone (no shared-memory slots, which
/// compare the ranks' arguments themselves): a rank that alone passes bad arguments tells the
/// others, which fail with `CollectiveFailed` instead of waiting.
#[test]
fn bad_collective_arguments_without_shared_memory_collectives() {
    for n in [2, 3] {
        let out = Job::tmpirun(n, "badcoll").env("TMPI_SHM_COLL", "off").timeout(Duration::from_secs(60)).run();
        let line = out.assert_ok_line("badcoll: ");
        assert!(line.contains("one rank's mistakes"), "{line:?}");
        assert!(out.elapsed < Duration::from_secs(20), "badcoll at {n} ranks took {:.2?}: something waited", out.elapsed);
    }
}

/// A communicator that outlived the finalized world answers every collective with
/// `Error::State`, also where a shortcut needs no communication (one rank, empty buffers).
#[test]
fn collectives_after_finalize_are_state_errors() {
    for n in [1, 2, 3] {
        let out = Job::tmpirun(n, "badcoll").arg("--after-finalize").timeout(Duration::from_secs(60)).run();
        let line = out.assert_ok_line("badcoll: ");
        assert!(line.contains(&format!("{n} ranks")), "{line:?}");
    }
}

/// A traced job draws the rounds of its blocking collectives (run as schedules) as phase
/// events, `coll send`, `coll recv` and `coll sendrecv` with their peer, as it drew the
/// point-to-point steps before the collectives became schedules.
#[test]
fn a_traced_job_draws_the_rounds_of_its_collectives() {
    let dir = std::env::temp_dir().join(format!("tmpi-coll-trace-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create a scratch directory");
    let path = dir.join("collcheck.json");
    let out = Job::tmpirun(3, "collcheck").flag("--trace").flag(&path).timeout(Duration::from_secs(90)).run();
    out.assert_ok_line("collcheck: ");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}\n{}", path.display(), out.report()));
    for step in ["coll send 1", "coll recv 0", "coll sendrecv 2"] {
        assert!(text.contains(&format!("\"name\":\"{step}\"")), "no {step:?} phase in the trace");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
