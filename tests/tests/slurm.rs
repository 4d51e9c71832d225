//! Jobs started by Slurm (`srun --mpi=pmi2`, no `tmpirun`) on a one-node cluster that
//! `tests/harness/slurm.sh` brings up on this machine (munge, slurmctld, slurmd). Skipped,
//! with a message, where the machine cannot run it (not root, Slurm not installed); CI
//! installs Slurm so it runs there.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use tmpi_tests::release_bin;

fn harness() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("harness/slurm.sh")
}

/// Where the harness keeps its cluster (one per test binary run).
fn dir() -> PathBuf {
    std::env::temp_dir().join(format!("tmpi-slurm-test-{}", std::process::id()))
}

fn conf() -> PathBuf {
    dir().join("slurm.conf")
}

fn script(cmd: &str) -> Output {
    Command::new("bash").arg(harness()).arg(cmd).env("TMPI_SLURM_DIR", dir()).output().expect("run the Slurm harness")
}

/// Stops the cluster when the test ends, however it ends.
struct Cluster;

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = script("down");
        let _ = std::fs::remove_dir_all(dir());
    }
}

/// `srun --mpi=pmi2 -n N program args`, with a time limit; returns (status ok, stdout, stderr).
fn srun(n: usize, program: &str, args: &[&str], env: &[(&str, &str)]) -> (bool, String, String) {
    let mut c = Command::new("timeout");
    c.args(["--kill-after=5", "120", "srun", "--overcommit", "--mpi=pmi2", "--kill-on-bad-exit=1", "-n", &n.to_string()])
        .arg(release_bin(program))
        .args(args)
        .env("SLURM_CONF", conf())
        .stdin(Stdio::null());
    for (k, v) in env {
        c.env(k, v);
    }
    let out = c.output().expect("run srun");
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn srun_pmi2_jobs() {
    let check = script("check");
    if !check.status.success() {
        eprintln!("skipped: {}", String::from_utf8_lossy(&check.stderr).trim());
        return;
    }
    let _cluster = Cluster;
    let up = script("up");
    assert!(up.status.success(), "the Slurm harness did not come up: {}", String::from_utf8_lossy(&up.stderr));

    // Every rank finds the others through PMI-2, at 1 to 4 ranks (4 ranks on 2 cores).
    for n in 1..=4 {
        let (ok, out, err) = srun(n, "hello", &[], &[]);
        assert!(ok, "srun -n {n} hello failed:\n{out}\n{err}");
        let mut lines: Vec<&str> = out.lines().filter(|l| l.starts_with("Hello from rank")).collect();
        lines.sort_unstable();
        let want: Vec<String> = (0..n).map(|r| format!("Hello from rank {r} of {n}")).collect();
        assert_eq!(lines, want, "srun -n {n} hello:\n{out}\n{err}");
    }

    // Point-to-point and collectives, over shared memory and over TCP on one host.
    for env in [&[][..], &[("TMPI_FABRIC", "tcp")][..]] {
        let (ok, out, err) = srun(3, "collcheck", &[], env);
        assert!(ok, "srun -n 3 collcheck {env:?} failed:\n{out}\n{err}");
        let (ok, out, err) = srun(4, "ring", &[], env);
        assert!(ok, "srun -n 4 ring {env:?} failed:\n{out}\n{err}");
    }

    // A spawn cannot grow a Slurm step: every rank gets the error, and the job goes on.
    let (ok, out, err) = srun(2, "spawner", &["srun"], &[]);
    assert!(ok && out.contains("spawner: srun: 2 ranks: OK"), "srun -n 2 spawner srun:\n{out}\n{err}");

    // A rank that panics ends the job with an error that names it.
    let (ok, out, err) = srun(3, "fault_panic", &[], &[]);
    assert!(!ok, "a panicking rank must fail the job:\n{out}\n{err}");
    assert!(err.contains("rank 1") || err.contains("task 1"), "the failing rank is named:\n{err}");
}
