//! Issue 14 item 6: a peer that dies in the middle of a large transfer through the shared heap
//! (`heapfault`, see its docs). The dead rank is the one tmpirun blames; the survivor never
//! crashes (the mapping of a dead rank's heap keeps its pages), and what it received from the
//! dead sender is intact.

use std::time::Duration;

use tmpi_tests::Job;

fn heapfault(mode: &str) -> (String, String, Option<i32>) {
    let out = Job::tmpirun(2, "heapfault").arg(mode).timeout(Duration::from_secs(60)).run();
    (out.stdout.clone(), out.stderr.clone(), out.code())
}

#[test]
fn a_sender_dying_while_the_receiver_copies_from_its_heap() {
    for _ in 0..3 {
        let (stdout, stderr, code) = heapfault("sender-dies");
        if stdout.contains("no shared heap here") {
            return;
        }
        assert_eq!(code, Some(3), "{stdout}\n{stderr}");
        assert!(stderr.contains("tmpirun: rank 0 ") && stderr.contains("exited with code 3"), "{stderr}");
        assert!(!stderr.contains("signal"), "no rank may die of a signal: {stderr}");
        // The survivor reports (intact data, or an error) before tmpirun ends it.
        assert!(stdout.contains("heapfault: sender-dies: survivor got "), "{stdout}\n{stderr}");
    }
}

#[test]
fn a_receiver_dying_while_the_sender_writes_into_its_heap() {
    for _ in 0..3 {
        let (stdout, stderr, code) = heapfault("receiver-dies");
        assert_eq!(code, Some(3), "{stdout}\n{stderr}");
        assert!(stderr.contains("tmpirun: rank 1 ") && stderr.contains("exited with code 3"), "{stderr}");
        assert!(!stderr.contains("signal"), "no rank may die of a signal: {stderr}");
        assert!(!stdout.contains("wrong"), "{stdout}");
    }
}
