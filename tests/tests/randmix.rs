//! Random mixes of point-to-point traffic (`randmix`): every size class, expected and
//! unexpected, wildcards, probe, truncation, `Vec` and shared-heap buffers, on every fabric
//! and with the settings that change the protocols. Each job prints its seed; a failure names
//! the round and the message, and `randmix --seed N --show` prints the plan again. And random
//! sequences of collectives on the world, a dup and a split (`randcoll`), likewise.

use std::time::Duration;

use tmpi_tests::Job;

fn mix(n: usize, seed: u64) -> Job {
    Job::tmpirun(n, "randmix").arg("--seed").arg(seed.to_string()).timeout(Duration::from_secs(120))
}

fn run(j: Job, what: &str) {
    run_program(j, "randmix", what);
}

fn run_program(j: Job, program: &str, what: &str) {
    let out = j.run();
    let line = out.assert_ok_line(&format!("{program}: "));
    assert!(line.contains("seed "), "{what}: {line:?}");
    out.assert_no_leak();
}

#[test]
fn random_mixes_on_shared_memory_at_2_3_and_5_ranks() {
    for (n, seed) in [(2, 1), (2, 2), (3, 3), (3, 4), (5, 5)] {
        run(mix(n, seed), &format!("{n} ranks, seed {seed}"));
    }
}

#[test]
fn random_mixes_over_tcp_and_across_simulated_nodes() {
    for (n, seed) in [(2, 11), (3, 12)] {
        run(mix(n, seed).env("TMPI_FABRIC", "tcp"), &format!("tcp, {n} ranks, seed {seed}"));
    }
    // Seed 228 with messages up to 9 MiB once failed one run in two: a receive buffer in the
    // shared heap made the sender of another node grant a heap write it could not do, and
    // the data it streamed instead overtook the grant ("read grant for no read").
    for seed in [228, 229, 230] {
        let j = mix(4, seed).nodes_of(2).arg("--rounds").arg("12").arg("--max").arg("9437184");
        run(j, &format!("2 nodes of 2 ranks, seed {seed}"));
    }
}

#[test]
fn random_mixes_with_the_protocol_settings() {
    let settings: [(&str, &str); 6] = [
        ("TMPI_SINGLE_COPY", "none"),
        ("TMPI_RNDV_THRESHOLD", "4096"),
        ("TMPI_RNDV_THRESHOLD", "1048576"),
        ("TMPI_SHM_RING_SIZE", "65536"),
        ("TMPI_SHARED_HEAP", "0"),
        ("TMPI_TM_MAX_TAGS", "2"),
    ];
    for (i, (k, v)) in settings.into_iter().enumerate() {
        let seed = 20 + i as u64;
        run(mix(3, seed).env(k, v), &format!("{k}={v}, seed {seed}"));
    }
}

fn coll(n: usize, seed: u64) -> Job {
    Job::tmpirun(n, "randcoll").arg("--seed").arg(seed.to_string()).timeout(Duration::from_secs(120))
}

#[test]
fn random_collective_sequences_on_every_fabric() {
    for (n, seed) in [(1, 1), (2, 2), (3, 3), (5, 4), (7, 5)] {
        run_program(coll(n, seed), "randcoll", &format!("{n} ranks, seed {seed}"));
    }
    run_program(coll(3, 6).env("TMPI_FABRIC", "tcp"), "randcoll", "tcp, 3 ranks");
    run_program(coll(5, 7).nodes_of(2), "randcoll", "3 nodes of 2, 2 and 1 ranks");
    run_program(coll(4, 8).env("TMPI_SHM_COLL", "off"), "randcoll", "TMPI_SHM_COLL=off, 4 ranks");
}

/// The node-aware collectives (issue 58 item 2), blocking and not, against the same values:
/// 8 ranks over 2 and 4 simulated hosts, 6 over hosts of 4 and 2, 3 over hosts of 2 and 1,
/// 4 over 4 hosts of one rank each with `TMPI_COLL_NODE_AWARE=on` (which the automatic
/// choice leaves flat), and, with fewer steps, 33 ranks over hosts of 17 and 16 and 64 ranks
/// over 4 hosts (3-6 s each on 2 loaded cores).
#[test]
fn random_collective_sequences_across_simulated_hosts() {
    let short = |n: usize, seed: u64| coll(n, seed).arg("--steps").arg("30");
    run_program(short(8, 31).nodes_of(4), "randcoll", "8 ranks on 2 hosts");
    run_program(short(8, 32).nodes_of(2), "randcoll", "8 ranks on 4 hosts");
    run_program(short(6, 33).nodes_of(4), "randcoll", "6 ranks on hosts of 4 and 2");
    run_program(short(3, 34).nodes_of(2).env("TMPI_COLL_ALLREDUCE", "ring"), "randcoll", "3 ranks on hosts of 2 and 1, ring");
    run_program(short(4, 35).nodes_of(1).env("TMPI_COLL_NODE_AWARE", "on"), "randcoll", "4 hosts of one rank, forced");
    let few = |n: usize, seed: u64| coll(n, seed).arg("--steps").arg("10");
    run_program(few(33, 36).nodes_of(17), "randcoll", "33 ranks on hosts of 17 and 16");
    run_program(few(64, 37).nodes_of(16), "randcoll", "64 ranks on 4 hosts");
}
