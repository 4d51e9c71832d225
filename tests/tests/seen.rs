//! Seeing a job through `tmpirun`: `--record`/`--replay` of a racy program (`racy`), the merged
//! trace of `--trace` (checked against Perfetto's JSON importer rules by
//! `tmpi_trace::check`), and the profile of `--profile` against `TMPI_STATS`.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tmpi::Stats;
use tmpi_tests::{Job, Outcome};
use tmpi_trace::check::{check, Checked};
use tmpi_trace::profile::RankProfile;

/// A fresh directory for one test.
fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("tmpi-seen-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("create a scratch directory");
    d
}

fn racy(n: usize, seed: u64) -> Job {
    Job::tmpirun(n, "racy").arg("--seed").arg(seed.to_string()).timeout(Duration::from_secs(120))
}

/// The `racy: result ...` line of a job that succeeded.
fn result_of(out: &Outcome) -> String {
    out.assert_success();
    let lines: Vec<&str> = out.stdout.lines().filter(|l| l.starts_with("racy: result ")).collect();
    assert_eq!(lines.len(), 1, "{}", out.report());
    lines[0].to_string()
}

/// Each of several recorded runs of the racy program (different seeds, so different orders
/// where the scheduler allows) comes back on every replay, whatever the senders' delays then.
/// The recorded results are printed, not compared with each other: two runs may well agree.
#[test]
fn every_replay_gives_the_result_of_its_record() {
    let mut seen = BTreeSet::new();
    for rec_seed in [1u64, 2, 3] {
        let dir = scratch(&format!("replay{rec_seed}"));
        let rec = racy(4, rec_seed).flag("--record").flag(&dir).run();
        let recorded = result_of(&rec);
        assert!(rec.stderr.contains("tmpirun: recorded "), "{}", rec.report());
        for r in 0..4 {
            assert!(dir.join(format!("rank{r}.tmpirec")).is_file(), "no record of rank {r}");
        }
        for seed in [rec_seed + 3, rec_seed + 7] {
            let out = racy(4, seed).flag("--replay").flag(&dir).run();
            assert_eq!(result_of(&out), recorded, "replay with seed {seed} of the record of seed {rec_seed}\n{}", out.report());
        }
        seen.insert(recorded);
        let _ = std::fs::remove_dir_all(&dir);
    }
    println!("{} distinct results in 3 recorded runs: {seen:?}", seen.len());
}

/// A replay of a program that makes another decision than its record, or more decisions,
/// stops with an error naming the rank and the calls; a record of another job size is refused
/// before the job starts.
#[test]
fn a_replay_that_departs_from_its_record_fails_naming_the_rank_and_the_call() {
    let dir = scratch("diverge");
    result_of(&racy(3, 5).arg("--rounds").arg("1").flag("--record").flag(&dir).run());
    let other = racy(3, 5).arg("--rounds").arg("1").arg("--variant").flag("--replay").flag(&dir).run();
    assert!(!other.success(), "{}", other.report());
    assert!(
        other.stderr.contains("replay diverged at rank 0")
            && other.stderr.contains("the program made wait_any")
            && other.stderr.contains("wait_some reported"),
        "{}",
        other.report()
    );
    let longer = racy(3, 5).arg("--rounds").arg("2").flag("--replay").flag(&dir).run();
    assert!(!longer.success(), "{}", longer.report());
    assert!(longer.stderr.contains("replay diverged at rank 0") && longer.stderr.contains("the end of the record"), "{}", longer.report());
    // A replay that stops short of its record: the recorded run went further.
    let dir2 = scratch("diverge-short");
    result_of(&racy(3, 5).arg("--rounds").arg("2").flag("--record").flag(&dir2).run());
    let shorter = racy(3, 5).arg("--rounds").arg("1").flag("--replay").flag(&dir2).run();
    assert!(!shorter.success(), "{}", shorter.report());
    assert!(shorter.stderr.contains("replay diverged at rank 0: the program finished after"), "{}", shorter.report());
    let _ = std::fs::remove_dir_all(&dir2);
    let size = racy(2, 5).arg("--rounds").arg("1").flag("--replay").flag(&dir).run();
    assert_eq!(size.code(), Some(2), "{}", size.report());
    assert!(size.stderr.contains("a job of 3 ranks"), "{}", size.report());
    let _ = std::fs::remove_dir_all(&dir);
}

fn read_trace(path: &Path) -> Checked {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    check(&text).unwrap_or_else(|errs| panic!("{} breaks the trace rules:\n{}", path.display(), errs.join("\n")))
}

/// `--trace`: one file that checks, a named process per rank, every call of the program as a
/// span; the rings are gone.
#[test]
fn the_merged_trace_checks_and_has_every_rank_and_call() {
    let dir = scratch("trace");
    let path = dir.join("racy.json");
    // racy's wildcard polls are an event each, as many as the host's speed allows: about 1M
    // on rank 0 in a run on a loaded host, which filled the default ring (1M events) and
    // dropped the first calls' spans. A ring of 4M (192 MB of sparse file, written only as
    // far as used) keeps them all.
    let out = racy(4, 3).env("TMPI_TRACE_EVENTS", "4194304").flag("--trace").flag(&path).run();
    result_of(&out);
    assert!(out.stderr.contains("tmpirun: trace of 4 ranks in"), "{}", out.report());
    let t = read_trace(&path);
    let names: Vec<&str> = t.processes.values().map(String::as_str).collect();
    for r in 0..4 {
        assert!(names.iter().any(|n| n.starts_with(&format!("rank {r} ("))), "no process for rank {r}: {names:?}");
    }
    for call in ["init", "finalize", "send", "recv", "irecv", "wait_any", "iprobe", "test", "wait_some", "barrier"] {
        assert!(t.spans.get(call).is_some_and(|&n| n > 0), "no {call} span: {:?}", t.spans);
    }
    for r in 0..4 {
        assert!(!dir.join(format!("racy.json.rank{r}")).exists(), "ring file of rank {r} left");
    }
    // Every message racy sends is received: one flow per message received, each from a message
    // leaving its source to the receive that matched it.
    // Should the ring still fill, it keeps the newest events (and says so); only a trace that
    // lost none has every message.
    let ins = t.slices.iter().filter(|s| s.name == "msg in").count();
    let dropped = t.other.as_ref().and_then(|o| o["dropped_events"].as_u64()).expect("otherData.dropped_events");
    assert!(ins >= 3 * 5 * 2 || (dropped > 0 && ins > 0), "{ins} messages received in the trace, {dropped} events dropped");
    assert_eq!(t.flows.len(), ins, "flows against messages received");
    for f in &t.flows {
        assert_joins(f);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Flow `f` goes from a message leaving rank `from` for rank `to` to that message matched at
/// rank `to`: the two ends agree on the ranks, the tag, the number and the bytes.
fn assert_joins(f: &tmpi_trace::check::Flow) {
    let (a, b) = (&f.from, &f.to);
    assert_eq!((a.name.as_str(), b.name.as_str()), ("msg out", "msg in"), "{f:?}");
    assert_eq!(a.args["to"].as_u64(), Some(b.pid - 1), "{f:?}");
    assert_eq!(b.args["from"].as_u64(), Some(a.pid - 1), "{f:?}");
    for k in ["tag", "seq", "context", "bytes"] {
        assert_eq!(a.args[k], b.args[k], "{k}: {f:?}");
    }
}

/// Each message's protocol is on its ends: at 2 ranks, `bigmsg` up to 256 KiB sends eager and
/// rendezvous messages; each received one says how it matched, each rendezvous how its bytes
/// moved, and a flow joins each to its send.
#[test]
fn the_trace_shows_each_messages_protocol() {
    let dir = scratch("proto");
    let path = dir.join("bigmsg.json");
    let out = Job::tmpirun(2, "bigmsg").arg("262144").flag("--trace").flag(&path).timeout(Duration::from_secs(120)).run();
    out.assert_success();
    let t = read_trace(&path);
    let ins: Vec<&str> = t.slices.iter().filter(|s| s.name == "msg in").map(|s| s.args["protocol"].as_str().unwrap_or("?")).collect();
    assert!(ins.iter().any(|p| p.starts_with("eager")) && ins.iter().any(|p| p.starts_with("rendezvous")), "{ins:?}");
    for p in &ins {
        // How it matched, exactly one way; a rendezvous also says how its bytes moved.
        assert!(p.contains("offloaded (TM-SRQ)") != p.contains("software matched"), "{p}");
        let ways = ["single copy (cma)", "streamed", "shared heap"];
        assert_eq!(p.starts_with("rendezvous"), ways.iter().any(|w| p.contains(w)), "{p}");
    }
    assert_eq!(t.flows.len(), ins.len(), "flows against messages received");
    assert!(!t.flows.is_empty());
    for f in &t.flows {
        assert_joins(f);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A program started alone with `TMPI_TRACE` writes the merged trace itself.
#[test]
fn a_rank_started_alone_writes_its_trace() {
    let dir = scratch("alone");
    let path = dir.join("hello.json");
    let out = Job::alone("hello").env("TMPI_TRACE", &path).run();
    out.assert_success();
    let t = read_trace(&path);
    assert_eq!(t.processes.len(), 1);
    assert!(t.spans.contains_key("init") && t.spans.contains_key("finalize"), "{:?}", t.spans);
    assert!(!dir.join("hello.json.rank0").exists());
    let _ = std::fs::remove_dir_all(&dir);
}

/// A rank that panics leaves its ring unsealed; the merged trace still has it, up to its end.
#[test]
fn a_failed_job_still_leaves_a_trace_of_every_rank() {
    let dir = scratch("failed");
    let path = dir.join("panic.json");
    let out = Job::tmpirun(3, "panicker").flag("--trace").flag(&path).run();
    assert!(!out.success(), "{}", out.report());
    let t = read_trace(&path);
    assert_eq!(t.processes.len(), 3, "{:?}\n{}", t.processes, out.report());
    let _ = std::fs::remove_dir_all(&dir);
}

/// The `tmpi-stats` lines of a job, by rank.
fn stats_of(out: &Outcome) -> Vec<Stats> {
    let mut v: Vec<Stats> =
        out.stderr.lines().filter(|l| l.starts_with("tmpi-stats ")).map(|l| l.parse().expect("a tmpi-stats line")).collect();
    v.sort_by_key(|s| s.rank);
    v
}

/// The messages and bytes the profile counts per rank are the engine's `msgs_sent` and
/// `bytes_sent`; the report and the traffic matrix are written beside the ranks' profiles.
#[test]
fn the_profile_counts_what_tmpi_stats_counts() {
    for (program, n) in [("racy", 4), ("collcheck", 3)] {
        let dir = scratch(&format!("profile-{program}"));
        let out = Job::tmpirun(n, program).env("TMPI_STATS", "1").env("TMPI_PROFILE", &dir).timeout(Duration::from_secs(120)).run();
        out.assert_success();
        let stats = stats_of(&out);
        assert_eq!(stats.len(), n, "{}", out.report());
        for st in &stats {
            let f = dir.join(format!("tmpi-profile.rank{}", st.rank));
            let p = RankProfile::parse(&std::fs::read_to_string(&f).expect("a rank's profile")).expect("a valid profile");
            let msgs: u64 = p.peers.values().map(|s| s.msgs).sum();
            let bytes: u64 = p.peers.values().map(|s| s.bytes).sum();
            assert_eq!((msgs, bytes), (st.msgs_sent, st.bytes_sent), "{program} rank {}: profile against TMPI_STATS", st.rank);
            assert!(p.calls.values().map(|c| c.calls).sum::<u64>() > 2, "{program} rank {}: {p:?}", st.rank);
        }
        assert!(out.stderr.contains(&format!("tmpi profile of {n} ranks")), "{}", out.report());
        let svg = std::fs::read_to_string(dir.join("tmpi-profile.svg")).expect("the traffic matrix");
        assert!(svg.starts_with("<svg") && svg.contains("bytes sent"), "{svg}");
        assert!(dir.join("tmpi-profile.txt").is_file());
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// `--profile` writes its report and matrix in the current directory and leaves nothing else.
#[test]
fn profile_flag_writes_the_report_here() {
    let dir = scratch("profile-flag");
    let out = racy(3, 2).in_dir(&dir).flag("--profile").run();
    result_of(&out);
    let mut files: Vec<String> =
        std::fs::read_dir(&dir).expect("read dir").flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect();
    files.sort();
    assert_eq!(files, ["tmpi-profile.svg", "tmpi-profile.txt"], "{}", out.report());
    let txt = std::fs::read_to_string(dir.join("tmpi-profile.txt")).expect("the report");
    for want in
        ["tmpi profile of 3 ranks", "time in communication per rank", "per rank and call", "messages (bytes) per pair", "longest waits"]
    {
        assert!(txt.contains(want), "{want:?} missing:\n{txt}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A trace path where a rank cannot write: the job fails at init with the knob named, and
/// ends (no rank waits for the one that failed).
#[test]
fn an_unwritable_trace_path_fails_clearly() {
    let out = racy(2, 1).flag("--trace").flag("/proc/self/trace.json").timeout(Duration::from_secs(60)).run();
    assert!(!out.success(), "{}", out.report());
    assert!(out.stderr.contains("TMPI_TRACE") && out.stderr.contains("a path where this rank can write its trace"), "{}", out.report());
}

/// A ring too small for the job keeps its newest events, counts the others, and says so: in
/// tmpirun's line and in the trace, which still checks.
#[test]
fn a_full_ring_drops_the_oldest_events_and_counts_them() {
    let dir = scratch("full");
    let path = dir.join("racy.json");
    let out = racy(3, 1).env("TMPI_TRACE_EVENTS", "1024").flag("--trace").flag(&path).run();
    result_of(&out);
    assert!(out.stderr.contains("events dropped: the oldest, see TMPI_TRACE_EVENTS"), "{}", out.report());
    let t = read_trace(&path);
    let dropped = t.other.as_ref().and_then(|o| o["dropped_events"].as_u64());
    assert!(dropped.is_some_and(|d| d > 0), "{:?}", t.other);
    assert!(t.instants.get("events dropped").is_some_and(|&n| n > 0), "{:?}", t.instants);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A rank that exits in the middle of the job, before finalize: tmpirun still merges the
/// ranks' traces, each up to where it ended, and says whose is cut short.
#[test]
fn a_rank_gone_mid_job_leaves_the_traces_merged() {
    let dir = scratch("gone");
    let path = dir.join("gone.json");
    let out = Job::tmpirun(3, "fault_exit").arg("3").arg("run").flag("--trace").flag(&path).timeout(Duration::from_secs(60)).run();
    assert!(!out.success(), "{}", out.report());
    assert!(out.stderr.contains("tmpirun: trace of ") && out.stderr.contains("stopped before finalize"), "{}", out.report());
    // Rank 1 left after its init (it said READY): its trace is there, cut. The others may be
    // ended by tmpirun at any point, even while they make their trace file.
    let t = read_trace(&path);
    assert!(t.processes.values().any(|n| n.starts_with("rank 1 (")), "{:?}", t.processes);
    let _ = std::fs::remove_dir_all(&dir);
}
