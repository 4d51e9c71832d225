//! Large messages through real jobs (`bigmsg`): every size class from 0 B to 64 MiB,
//! expected and unexpected, ssend, truncated rendezvous (the RNDV_INCOMPLETE path when the
//! TM-SRQ matched it), with receive offload on and off and with single copy (CMA) on and off.
//! The `tmpi-stats` lines (`TMPI_STATS=1`, one per process, each with its own registration
//! cache) must show the MR cache hitting on repeated sends from one buffer, and the data
//! mechanism that was asked for.

use std::collections::BTreeMap;
use std::time::Duration;

use tmpi_tests::{Job, Outcome};

/// `key=value` pairs of each rank's `tmpi-stats` line.
fn stats(out: &Outcome) -> BTreeMap<usize, BTreeMap<String, u64>> {
    let mut all = BTreeMap::new();
    for line in out.stderr.lines().filter_map(|l| l.find("tmpi-stats ").map(|i| &l[i..])) {
        let kv: BTreeMap<String, u64> = line
            .split_whitespace()
            .skip(1)
            .filter_map(|p| p.split_once('='))
            .filter_map(|(k, v)| Some((k.to_string(), v.parse().ok()?)))
            .collect();
        let rank = kv["rank"] as usize;
        all.insert(rank, kv);
    }
    all
}

fn bigmsg(n: usize, max: Option<usize>, env: &[(&str, &str)]) -> BTreeMap<usize, BTreeMap<String, u64>> {
    let mut job = Job::tmpirun(n, "bigmsg").env("TMPI_STATS", "1").timeout(Duration::from_secs(240));
    if let Some(m) = max {
        job = job.arg(m.to_string());
    }
    for (k, v) in env {
        job = job.env(*k, *v);
    }
    let out = job.run();
    out.assert_ok_line("bigmsg: ");
    let st = stats(&out);
    assert_eq!(st.len(), n, "one stats line per rank\n{}", out.report());
    for (rank, s) in &st {
        // 12 sends of one 2 MiB buffer: at least 11 of them hit the sender's cache.
        assert!(s["mr_cache_hits"] >= 11, "rank {rank} {env:?}: {s:?}");
        assert!(s["rndv"] > 0, "rank {rank}: {s:?}");
    }
    st
}

#[test]
fn zero_to_64_mib_with_single_copy_and_offload_on_and_off() {
    for n in [2, 3] {
        for copy in ["cma", "none"] {
            for tags in ["1023", "0"] {
                let env = [("TMPI_SINGLE_COPY", copy), ("TMPI_TM_MAX_TAGS", tags)];
                let st = bigmsg(n, None, &env);
                for (rank, s) in &st {
                    if copy == "none" {
                        assert_eq!(s["cma_reads"], 0, "rank {rank} {env:?}: {s:?}");
                    } else {
                        // Either the kernel allowed CMA or every rank fell back (and said so).
                        assert!(s["cma_reads"] > 0 || s["cma_fallbacks"] > 0, "rank {rank} {env:?}: {s:?}");
                    }
                    if tags == "0" {
                        assert_eq!(s["hw_matched"], 0, "rank {rank} {env:?}: {s:?}");
                    }
                }
                if tags != "0" {
                    // Truncated expected rendezvous receives were matched in the TM-SRQ,
                    // which hands them to software as RNDV_INCOMPLETE.
                    let inc: u64 = st.values().map(|s| s["rndv_incomplete"]).sum();
                    assert!(inc > 0, "{env:?}: {st:?}");
                }
            }
        }
    }
}

#[test]
fn more_ranks_than_cores_and_small_rings() {
    bigmsg(5, Some(4 << 20), &[("TMPI_SHM_RING_SIZE", "4096")]);
}

#[test]
fn thresholds_move_the_protocol_switch() {
    // Everything from 1 KiB is a rendezvous by single copy (split from 128 KiB), and the cache
    // is off: no hit may be claimed.
    let out = Job::tmpirun(2, "bigmsg")
        .arg("1048576")
        .env("TMPI_STATS", "1")
        .env("TMPI_RNDV_THRESHOLD", "1024")
        .env("TMPI_MR_CACHE_MAX_COUNT", "0")
        .env("TMPI_SINGLE_COPY_MIN", "0")
        .timeout(Duration::from_secs(120))
        .run();
    out.assert_ok_line("bigmsg: ");
    for (rank, s) in stats(&out) {
        assert_eq!(s["mr_cache_hits"], 0, "rank {rank}: {s:?}");
        assert!(s["rndv"] >= 4 * 8, "rank {rank}: {s:?}");
        assert!(s["cma_reads"] >= 4 * 8 || s["cma_fallbacks"] > 0, "rank {rank}: {s:?}");
    }
}

#[test]
fn single_copy_refused_by_the_kernel_falls_back_to_the_rings() {
    // A seccomp filter (as in containers) makes process_vm_readv/writev fail with EPERM in both
    // ranks: reads fall back to the rings, both the reader's share and the sender's share.
    let out = Job::tmpirun(2, "bigmsg")
        .arg("--deny-cma")
        .arg("4194304")
        .env("TMPI_STATS", "1")
        .env("TMPI_SINGLE_COPY_MIN", "0")
        .timeout(Duration::from_secs(120))
        .run();
    out.assert_ok_line("bigmsg: ");
    for (rank, s) in stats(&out) {
        assert_eq!(s["cma_reads"], 0, "rank {rank}: {s:?}");
        assert!(s["cma_fallbacks"] > 0, "rank {rank}: {s:?}");
    }
}
