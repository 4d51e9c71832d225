//! Leaving, flow control and hostile peers through real jobs (issue: never hang, never
//! corrupt). See `tests/src/bin/reliability.rs` for what each mode does.

use std::time::Duration;

use tmpi_tests::Job;

/// A rank that finalizes early: what it sent is delivered after it left, and whatever only
/// it could satisfy fails with `PeerGone` within a second, while the others carry on.
#[test]
fn early_finalize_delivers_then_peer_gone() {
    for n in [3, 4] {
        for tags in ["1023", "0"] {
            // TMPI_TM_THRESH=1024: the 4 KiB receives go to the TM-SRQ when offload is on.
            let out = Job::tmpirun(n, "reliability")
                .arg("leave")
                .env("TMPI_TM_MAX_TAGS", tags)
                .env("TMPI_TM_THRESH", "1024")
                .timeout(Duration::from_secs(60))
                .run();
            out.assert_success();
            out.assert_ok_line("reliability: leave: ");
            out.assert_no_leak();
        }
    }
}

/// MPI's progress rule under the default unexpected budget: 400 x 200 KiB unexpected, then a
/// 2 MiB message that the receiver asks for first.
#[test]
fn flow_control_keeps_the_progress_rule() {
    let out = Job::tmpirun(2, "reliability").arg("flow").timeout(Duration::from_secs(120)).run();
    out.assert_success();
    out.assert_ok_line("reliability: flow: ");
}

/// The same with a tiny budget and the rendezvous first (its read must pass the messages
/// that no receive wants yet), with and without single copy.
#[test]
fn flow_control_with_a_tiny_budget() {
    for copy in ["cma", "none"] {
        let out = Job::tmpirun(2, "reliability")
            .arg("flow-rndv-first")
            .env("TMPI_UNEXPECTED_MAX", "4096")
            .env("TMPI_SINGLE_COPY", copy)
            .timeout(Duration::from_secs(120))
            .run();
        out.assert_success();
        out.assert_ok_line("reliability: flow-rndv-first: ");
    }
}

/// A peer that forges its source, acknowledges nothing, or announces impossible lengths
/// gets errors naming it; nothing panics or aborts, and real traffic still arrives intact.
#[test]
fn hostile_peer_is_an_error() {
    for tags in ["1023", "0"] {
        // TMPI_TM_THRESH=1024: the forged 4 KiB message meets a receive in the TM-SRQ when
        // offload is on.
        let out = Job::tmpirun(3, "reliability")
            .arg("hostile")
            .env("TMPI_TM_MAX_TAGS", tags)
            .env("TMPI_TM_THRESH", "1024")
            .timeout(Duration::from_secs(60))
            .run();
        out.assert_success();
        out.assert_ok_line("reliability: hostile: ");
    }
}

/// A rendezvous send abandoned before its receive is posted neither waits for that receive
/// nor lets it copy freed memory: pre-granted for single copy (the copy chosen by measurement,
/// or fixed), and through the rings. 64 KiB is a rendezvous in all three.
#[test]
fn abandoned_send_before_its_receive() {
    for env in [vec![], vec![("TMPI_SINGLE_COPY_MIN", "0")], vec![("TMPI_SINGLE_COPY", "none")]] {
        let mut job = Job::tmpirun(2, "reliability").arg("revoke").env("TMPI_RNDV_THRESHOLD", "32768").timeout(Duration::from_secs(60));
        for (k, val) in &env {
            job = job.env(k, val);
        }
        let out = job.run();
        out.assert_success();
        out.assert_ok_line("reliability: revoke: ");
    }
}

/// A rendezvous send abandoned after its receive was posted, while the reader may be reading
/// it (single copy chosen by measurement, fixed, or none): the receive gets every byte or a
/// clean `RemoteAccess`, never memory reused after the send was given up.
#[test]
fn abandoned_send_while_its_receive_reads() {
    for env in [("TMPI_SINGLE_COPY_MIN", "auto"), ("TMPI_SINGLE_COPY_MIN", "0"), ("TMPI_SINGLE_COPY", "none")] {
        let out = Job::tmpirun(2, "reliability").arg("revoke-reading").env(env.0, env.1).timeout(Duration::from_secs(60)).run();
        out.assert_success();
        out.assert_ok_line("reliability: revoke-reading: ");
    }
}

/// A single-copy receive abandoned while a third rank sends garbage: no byte lands in memory
/// allocated after the buffer was freed.
#[test]
fn abandoned_single_copy_receive_outlasts_garbage() {
    // Single copy from 1 MiB (the default starts above the 32 MiB sent here).
    let out = Job::tmpirun(3, "reliability").arg("abandon").env("TMPI_SINGLE_COPY_MIN", "1048576").timeout(Duration::from_secs(120)).run();
    out.assert_success();
    out.assert_ok_line("reliability: abandon: ");
}
