//! The shared-memory segment's need is checked against the memory that can really be had,
//! and a job that needs more fails at `init` with the figures instead of meeting the OOM
//! killer (issue 55, item 8).

use std::time::Duration;

use tmpi_tests::Job;

/// `TMPI_SHM_LIMIT` below the segment's size: `init` fails naming the need and the cap, and
/// the job ends with status 1, leaving no file behind.
#[test]
fn a_segment_over_the_limit_fails_at_init_with_the_figures() {
    let out = Job::tmpirun(4, "hello").env("TMPI_SHM_LIMIT", "1m").run();
    assert_eq!(out.code(), Some(1), "{}", out.report());
    out.assert_no_leak();
    let r = out.report();
    assert!(r.contains("needs ") && r.contains("bytes but only 1048576 can be had"), "{r}");
    assert!(r.contains("TMPI_SHM_LIMIT is 1048576") && r.contains("MemAvailable") && r.contains("/dev/shm has"), "{r}");
    // A cap the segment fits runs.
    Job::tmpirun(4, "hello").env("TMPI_SHM_LIMIT", "1g").run().assert_success();
}

/// A memory cgroup that leaves less than the segment needs (the case of a container or a
/// batch job's limit, where `/dev/shm` itself is large): `init` names the cgroup's room. Before
/// the check, rank 0 allocated the segment in the cgroup and the OOM killer ended it
/// (`fallocate -l 256M` on /dev/shm in a 96 MiB cgroup here: killed, status 137).
#[test]
fn a_memory_cgroup_too_small_for_the_segment_fails_at_init_naming_it() {
    let Some(cg) = Cgroup::new(96 << 20) else {
        eprintln!("skipped: no memory cgroup can be made here (needs root and a memory controller)");
        return;
    };
    // 4 x 4 rings of 16 MiB: 256 MiB, in a cgroup of 96 MiB.
    let tmpirun = tmpi_tests::tmpirun();
    let hello = tmpi_tests::release_bin("hello");
    let script = format!("echo $$ > {} && exec {} -n 4 --timeout 60 {}", cg.procs(), tmpirun.display(), hello.display());
    let out = std::process::Command::new("sh").arg("-c").arg(&script).env("TMPI_SHM_RING_SIZE", "16777216").output().expect("sh");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("needs ") && err.contains("can be had") && err.contains("the memory cgroup /tmpi-test-"), "{err}");
    drop(cg);
    std::thread::sleep(Duration::from_millis(10));
}

/// A memory cgroup made for one test and removed after it.
struct Cgroup {
    dir: std::path::PathBuf,
    v2: bool,
}

impl Cgroup {
    /// A new cgroup with a memory limit of `limit` bytes (v2 if this host has it with a
    /// memory controller, else v1); `None` if none can be made.
    fn new(limit: u64) -> Option<Cgroup> {
        let name = format!("tmpi-test-{}", std::process::id());
        for (root, v2, file) in [
            ("/sys/fs/cgroup", true, "memory.max"),
            ("/sys/fs/cgroup/unified", true, "memory.max"),
            ("/sys/fs/cgroup/memory", false, "memory.limit_in_bytes"),
        ] {
            let ctl = std::fs::read_to_string(format!("{root}/cgroup.controllers")).unwrap_or_default();
            if v2 && !ctl.split_whitespace().any(|c| c == "memory") {
                continue;
            }
            let dir = std::path::Path::new(root).join(&name);
            if std::fs::create_dir(&dir).is_err() {
                continue;
            }
            let cg = Cgroup { dir, v2 };
            if std::fs::write(cg.dir.join(file), limit.to_string()).is_ok() {
                return Some(cg);
            }
        }
        None
    }

    fn procs(&self) -> String {
        self.dir.join("cgroup.procs").display().to_string()
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        // The processes that were in it have exited; a cgroup without them can be removed
        // (v1 may need a moment to let go of their charges).
        for _ in 0..50 {
            if std::fs::remove_dir(&self.dir).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        eprintln!("could not remove the test cgroup {} (v2: {})", self.dir.display(), self.v2);
    }
}
