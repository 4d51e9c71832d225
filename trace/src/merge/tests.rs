use super::*;
use crate::check::check;
use crate::clock::Sample;
use crate::event::Proto;
use crate::ring::RankInfo;

fn span(kind: Kind, t0: u64, dur: u64, peer: u32) -> Event {
    Event { t0, dur, kind: kind.code(), peer, tag: 5, bytes: 8, ..Default::default() }
}

fn msg(kind: Kind, t0: u64, peer: u32, seq: u64) -> Event {
    Event { t0, dur: 10, kind: kind.code(), peer, tag: 5, bytes: 8, id: seq, aux: Proto::EAGER, ..Default::default() }
}

fn trace(rank: u32, boot: &str, events: Vec<Event>) -> RankTrace {
    RankTrace {
        info: RankInfo { rank, size: 2, pid: 100 + rank, boot_id: boot.into(), host: format!("h{rank}"), jobid: "j".into(), init_ns: 0 },
        sealed: true,
        start: None,
        end: None,
        fini_ns: 0,
        capacity: 1024,
        dropped: 0,
        events,
        threads: vec![(0, "main".into())],
        open: Vec::new(),
    }
}

fn pair() -> Vec<RankTrace> {
    vec![
        trace(0, "b", vec![span(Kind::Send, 1_000, 100, 1), msg(Kind::MsgOut, 1_020, 1, 1), span(Kind::Barrier, 2_000, 50, NONE)]),
        trace(1, "b", vec![span(Kind::Recv, 1_010, 500, 0), msg(Kind::MsgIn, 1_400, 0, 1), span(Kind::Barrier, 2_010, 40, NONE)]),
    ]
}

#[test]
fn a_send_and_its_receive_are_joined_by_a_flow() {
    let (json, s) = merge(&pair(), &Options { size: 2, ..Default::default() });
    let c = check(&json).unwrap_or_else(|e| panic!("{e:#?}\n{json}"));
    assert_eq!((s.ranks, s.events, s.flows, s.unpaired, s.dropped), (2, 6, 1, 0, 0));
    assert_eq!(c.processes.keys().copied().collect::<Vec<_>>(), [1, 2]);
    assert!(c.processes[&1].starts_with("rank 0 (h0, pid 100)"), "{:?}", c.processes);
    assert_eq!(c.flows.len(), 1);
    let f = &c.flows[0];
    assert_eq!((f.from.name.as_str(), f.from.pid, f.to.name.as_str(), f.to.pid), ("msg out", 1, "msg in", 2));
    assert_eq!(f.from.args["seq"], 1);
    assert_eq!(f.to.args["protocol"], "eager");
    // The trace starts at its first event: rank 0's send at 0 us.
    let send = c.slices.iter().find(|x| x.name == "send").unwrap();
    assert_eq!((send.ts, send.dur), (0.0, 0.1));
    assert!(json.starts_with("{\"traceEvents\":["));
}

#[test]
fn messages_without_their_other_end_draw_no_flow() {
    let mut t = pair();
    t[1].events.retain(|e| e.kind() != Some(Kind::MsgIn));
    t[0].events.push(msg(Kind::MsgOut, 1_050, 1, 2));
    let (json, s) = merge(&t, &Options { size: 2, ..Default::default() });
    assert_eq!((s.flows, s.unpaired), (0, 2));
    assert!(check(&json).is_ok());
}

/// A rank of another host whose clock is 1 ms ahead, measured at init and finalize: its
/// events move by the offset, and the flow goes forward.
#[test]
fn another_hosts_clock_is_moved_by_its_samples() {
    let mut t = pair();
    for e in &mut t[1].events {
        e.t0 += 1_000_000;
    }
    t[1].info.boot_id = "other".into();
    t[1].start = Some(Sample { t0: 1_000_010, reference: 20, t3: 1_000_030 });
    t[1].end = Some(Sample { t0: 1_005_000, reference: 5_010, t3: 1_005_020 });
    let (json, s) = merge(&t, &Options { size: 2, reference_boot_id: Some("b".into()), ..Default::default() });
    let c = check(&json).unwrap();
    assert_eq!(s.clock_error_ns, 10);
    let recv = c.slices.iter().find(|x| x.name == "recv").unwrap();
    assert_eq!(recv.ts, 0.01, "1010 ns after the send's 1000");
    assert_eq!(c.flows.len(), 1);
    assert!(s.unaligned_hosts.is_empty());
}

#[test]
fn a_host_without_samples_is_named_and_missing_ranks_are_listed() {
    let mut t = pair();
    t[1].info.boot_id = "other".into();
    t.push(trace(3, "b", vec![span(Kind::Barrier, 2_000, 50, NONE)]));
    let (json, s) = merge(&t, &Options { size: 5, reference_boot_id: Some("b".into()), ..Default::default() });
    assert_eq!(s.unaligned_hosts, ["h1"]);
    assert_eq!(s.missing, [2, 4]);
    let c = check(&json).unwrap();
    assert_eq!(c.other.as_ref().unwrap()["missing_ranks"], "2,4");
}

#[test]
fn dropped_events_leave_a_note() {
    let mut t = pair();
    t[0].dropped = 77;
    let (json, s) = merge(&t, &Options { size: 2, ..Default::default() });
    let c = check(&json).unwrap();
    assert_eq!(s.dropped, 77);
    assert_eq!(c.instants["events dropped"], 1);
    assert!(json.contains("\"name\":\"events dropped\",\"cat\":\"note\",\"ph\":\"i\",\"s\":\"p\",\"ts\":0.000"));
    assert!(json.contains("\"dropped_events\":77"));
}

/// A span that ends a few ns after the span it starts in is cut at its parent's end, so the
/// thread's spans nest (the checker would refuse the file otherwise).
#[test]
fn spans_are_made_to_nest() {
    let t = vec![trace(0, "b", vec![span(Kind::Wait, 1_000, 100, NONE), msg(Kind::MsgIn, 1_095, 1, 1), span(Kind::Test, 1_200, 5, NONE)])];
    let (json, _) = merge(&t, &Options { size: 1, ..Default::default() });
    let c = check(&json).unwrap_or_else(|e| panic!("{e:#?}"));
    let m = c.slices.iter().find(|x| x.name == "msg in").unwrap();
    assert_eq!((m.ts, m.dur), (0.095, 0.005));
}

/// The checker refuses what Perfetto's importer would refuse or misread.
#[test]
fn the_checker_finds_broken_rules() {
    let bad = [
        (r#"{"otherData":{},"traceEvents":[]}"#, "does not start"),
        (r#"{"traceEvents":[{"ph":"X","name":"a","pid":1,"tid":1,"ts":0}]}"#, "dur"),
        (r#"{"traceEvents":[{"ph":"X","name":"a","pid":1,"tid":1,"ts":0,"dur":1,"x":[1]}]}"#, "array"),
        (r#"{"traceEvents":[{"ph":"i","name":"a","pid":1,"tid":1,"ts":0}]}"#, "scope"),
        (r#"{"traceEvents":[],"foo":1}"#, "stops"),
        (r#"{"traceEvents":[{"ph":"X","name":"\u00e9","pid":1,"tid":1,"ts":0,"dur":1}]}"#, "\\u"),
        (r#"{"traceEvents":[{"ph":"X","name":"a","pid":1,"tid":1,"ts":0,"dur":1}]}"#, "process_name"),
        (
            r#"{"traceEvents":[{"ph":"X","name":"a","pid":1,"tid":1,"ts":0,"dur":2},{"ph":"X","name":"b","pid":1,"tid":1,"ts":1,"dur":2}]}"#,
            "ends after",
        ),
        (r#"{"traceEvents":[{"ph":"s","name":"m","cat":"c","id":1,"pid":1,"tid":1,"ts":0}]}"#, "1 starts and 0 ends"),
        ("{\"traceEvents\":[", "not JSON"),
    ];
    for (text, want) in bad {
        let errs = check(text).expect_err(text);
        assert!(errs.iter().any(|e| e.contains(want)), "{text}: {errs:?} lacks {want:?}");
    }
}

#[test]
fn json_strings_never_need_a_unicode_escape() {
    let mut s = String::new();
    push_json_str(&mut s, "a\"b\\c\nd\u{1}é");
    assert_eq!(s, "\"a\\\"b\\\\c d é\"");
}

/// A receive stamped before its send (two cores read the clock in the other order): the
/// send's slice moves back to just before it, within the call that sent it and after the
/// slice before it, and the flow goes forward.
#[test]
fn a_receive_stamped_before_its_send_still_gets_a_forward_flow() {
    let t = vec![
        trace(0, "b", vec![span(Kind::Send, 1_000, 500, 1), msg(Kind::MsgOut, 1_100, 1, 2), msg(Kind::MsgOut, 1_300, 1, 1)]),
        trace(1, "b", vec![span(Kind::Recv, 1_010, 500, 0), msg(Kind::MsgIn, 1_200, 0, 1), msg(Kind::MsgIn, 1_050, 0, 2)]),
    ];
    let (json, s) = merge(&t, &Options { size: 2, ..Default::default() });
    let c = check(&json).unwrap_or_else(|e| panic!("{e:#?}\n{json}"));
    assert_eq!((s.flows, s.unpaired), (2, 0));
    let outs: Vec<(f64, f64)> = c.slices.iter().filter(|x| x.name == "msg out").map(|x| (x.ts, x.dur)).collect();
    // Message 1 left at 1 300 and arrived at 1 200: it moves to 1 199 but not before the end of
    // message 2's slice (1 110); message 2 left at 1 100, arrived at 1 050: back to the send's
    // start is 1 000, the slice before it none, so 1 049.
    assert_eq!(outs, [(0.049, 0.061), (0.199, 0.111)], "{json}");
    for f in &c.flows {
        assert!(f.from.ts <= f.to.ts, "{f:?}");
    }
}

/// A call a rank was still in when the job ended (killed in a hang) is drawn from its start to
/// the job's end, marked unfinished; without an end time, to the last event's end.
#[test]
fn an_open_call_runs_to_the_end_of_the_job() {
    let mut t = vec![trace(0, "b", vec![Event { t0: 1_000, dur: 10, kind: Kind::Send.code(), ..Default::default() }])];
    t[0].open.push(Event { t0: 2_000, kind: Kind::Recv.code(), aux: crate::event::aux::OPEN, ..Default::default() });
    let (json, _) = merge(&t, &Options { size: 1, reference_boot_id: Some("b".into()), end_ns: Some(9_000) });
    let recv = json.lines().find(|l| l.contains("\"name\":\"recv\"")).expect("the open recv is drawn");
    assert!(recv.contains("\"ts\":1.000,\"dur\":7.000") && recv.contains("\"unfinished\":true"), "{recv}");
    let (json, _) = merge(&t, &Options { size: 1, ..Default::default() });
    let recv = json.lines().find(|l| l.contains("\"name\":\"recv\"")).expect("the open recv is drawn");
    assert!(recv.contains("\"dur\":0.001"), "{recv}");
}
