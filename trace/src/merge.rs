//! The merger: the ranks' trace files, their clocks aligned, as one file of the Chrome
//! trace-event format (JSON), which the Perfetto UI, `trace_processor` and `chrome://tracing`
//! open as it is.
//!
//! What it writes (the rules [`crate::check`] verifies):
//!
//! - one process per rank (`pid` = rank + 1, named `rank R` by a `process_name` metadata event
//!   and sorted by rank), one thread track per thread of the rank (`tid` = (rank + 1) x 1000 +
//!   the thread's index, named by `thread_name`);
//! - every call, phase and message as a complete event (`"ph":"X"` with `ts` and `dur` in
//!   microseconds, to the nanosecond), nested properly on its thread;
//! - a flow (`"ph":"s"` inside the sender's message event, `"ph":"f"` with `"bp":"e"` inside
//!   the receiver's) from each message that left a rank to the receive that matched it, paired
//!   by (source, destination, tag, the message's number: its context and its sequence number
//!   among the messages of that envelope);
//! - a process-scoped instant (`"ph":"i"`, `"s":"p"`) where a rank's ring dropped events;
//! - `otherData`: the job's size, ranks whose file was missing, dropped events and the clock
//!   correction's error bound.
//!
//! Only what Perfetto's JSON importer reads is used: `traceEvents` first and `otherData` after
//! it (any other key makes it stop reading), no array as an event's field, no `\u` escape or
//! control character in a string, and no `displayTimeUnit` (which Perfetto reads as the unit of
//! `ts` itself).

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;

use crate::clock::Domain;
use crate::event::{aux, Class, Event, Kind, Proto, NONE};
use crate::ring::RankTrace;

/// `tid` of thread `t` of rank `r` (see the module docs).
pub fn tid_of(rank: u32, thread: u16) -> u64 {
    (u64::from(rank) + 1) * 1000 + u64::from(thread.min(999))
}

/// Bits of a message event's `id` that number it on its envelope; the context id is above.
pub const MSG_SEQ_BITS: u32 = 40;
const MSG_SEQ_MASK: u64 = (1 << MSG_SEQ_BITS) - 1;

/// Shortest message event written, so that a flow's end fits strictly inside it (ns).
const MIN_MSG_DUR: u64 = 2;

/// What a merge did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Summary {
    /// Ranks whose trace was merged.
    pub ranks: usize,
    /// Ranks of the job with no trace.
    pub missing: Vec<u32>,
    /// Events written (spans, messages, notes; not metadata or flows).
    pub events: usize,
    /// Flows drawn from a send to its receive.
    pub flows: usize,
    /// Messages whose other end is not in the trace (never received, or its event dropped).
    pub unpaired: usize,
    /// Events the ranks' rings dropped.
    pub dropped: u64,
    /// The largest error of the clock correction (ns), 0 when every rank shares the
    /// reference clock.
    pub clock_error_ns: u64,
    /// Hosts (clock domains) other than the reference's without a clock sample: their events
    /// are shown uncorrected.
    pub unaligned_hosts: Vec<String>,
}

/// How to merge.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Ranks in the job (a rank below it without a file is reported missing).
    pub size: usize,
    /// Boot id of the reference clock's host (`tmpirun`'s); `None`: rank 0's host, or the
    /// first rank's.
    pub reference_boot_id: Option<String>,
    /// The reference clock when the job ended (`tmpirun` merges right after it): where the
    /// calls ranks were still in ([`RankTrace::open`]) end. `None`: at the last event's end.
    pub end_ns: Option<u64>,
}

/// One event placed on the common time line.
#[derive(Debug, Clone, Copy)]
struct Placed {
    rank: u32,
    ev: Event,
    /// Start, ns from the trace's zero.
    start: u64,
    dur: u64,
}

/// Writes `s` as a JSON string that Perfetto's tokenizer reads: quotes and backslashes
/// escaped, control characters replaced by spaces, never a `\u` escape.
pub fn push_json_str(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => out.push(' '),
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Starts the next element of the `traceEvents` array.
fn sep(out: &mut String) {
    out.push_str(if out.ends_with('[') { "\n" } else { ",\n" });
}

/// Nanoseconds as microseconds with three decimals.
fn us(ns: u64) -> String {
    format!("{}.{:03}", ns / 1000, ns % 1000)
}

/// The clock domain of each rank: its offset function.
fn domains(traces: &[RankTrace], opts: &Options, summary: &mut Summary) -> Vec<Domain> {
    let reference = opts
        .reference_boot_id
        .clone()
        .or_else(|| traces.iter().find(|t| t.info.rank == 0).or(traces.first()).map(|t| t.info.boot_id.clone()))
        .unwrap_or_default();
    let mut by_boot: HashMap<String, Domain> = HashMap::new();
    for t in traces {
        if t.info.boot_id != reference || t.info.boot_id.is_empty() {
            by_boot.entry(t.info.boot_id.clone()).or_default().absorb(t.start, t.end);
        }
    }
    for (boot, d) in &by_boot {
        summary.clock_error_ns = summary.clock_error_ns.max(d.error_bound());
        if d.start.is_none() && d.end.is_none() {
            let hosts: Vec<&str> = traces.iter().filter(|t| &t.info.boot_id == boot).map(|t| t.info.host.as_str()).collect();
            summary.unaligned_hosts.push(hosts.first().copied().unwrap_or("?").to_string());
        }
    }
    summary.unaligned_hosts.sort();
    summary.unaligned_hosts.dedup();
    traces
        .iter()
        .map(|t| if t.info.boot_id == reference && !t.info.boot_id.is_empty() { Domain::reference() } else { by_boot[&t.info.boot_id] })
        .collect()
}

/// Every kept event on the common time line, starting at 0.
/// The calls ranks were still in run to `end_ns` (the reference clock), or to the last
/// event's end.
fn place(traces: &[RankTrace], doms: &[Domain], end_ns: Option<u64>) -> Vec<Placed> {
    let mut raw: Vec<(u32, Event, i128)> = Vec::new();
    for (t, d) in traces.iter().zip(doms) {
        for e in t.events.iter().chain(&t.open) {
            raw.push((t.info.rank, *e, i128::from(e.t0) + i128::from(d.offset_at(e.t0))));
        }
    }
    let zero = raw.iter().map(|r| r.2).min().unwrap_or(0);
    let mut placed: Vec<Placed> = raw
        .into_iter()
        .map(|(rank, ev, at)| {
            let min = if ev.kind().map(Kind::class) == Some(Class::Message) { MIN_MSG_DUR } else { 0 };
            Placed { rank, ev, start: (at - zero) as u64, dur: ev.dur.max(min) }
        })
        .collect();
    let last = placed.iter().map(|p| p.start + p.dur).max().unwrap_or(0);
    let end = end_ns.map_or(last, |e| u64::try_from(i128::from(e) - zero).unwrap_or(0).max(last));
    for p in placed.iter_mut().filter(|p| p.ev.aux & aux::OPEN != 0) {
        p.dur = end.saturating_sub(p.start).max(1);
    }
    placed
}

/// For each `msg out`, how far back it may move on its thread: to the start of the innermost
/// span that holds it (a message cannot have left before the call that sent it) or the end of
/// the last slice before it, whichever is later; by one sweep of each thread's slices.
fn send_floors(events: &[Placed]) -> HashMap<usize, u64> {
    let mut order: Vec<usize> = (0..events.len()).collect();
    order.sort_by_key(|&i| (events[i].rank, events[i].ev.thread, events[i].start, std::cmp::Reverse(events[i].dur)));
    let (mut floors, mut stack, mut track, mut done) = (HashMap::new(), Vec::<(u64, u64)>::new(), None, 0);
    for i in order {
        let p = &events[i];
        if track != Some((p.rank, p.ev.thread)) {
            (track, done) = (Some((p.rank, p.ev.thread)), 0);
            stack.clear();
        }
        while let Some(&(end, _)) = stack.last().filter(|&&(end, _)| end <= p.start) {
            done = done.max(end);
            stack.pop();
        }
        match p.ev.kind() {
            Some(Kind::MsgOut) => {
                floors.insert(i, stack.last().map_or(0, |&(_, start)| start).max(done));
            }
            Some(k) if k.class() == Class::Note => continue,
            None => continue,
            Some(_) => {}
        }
        stack.push((p.start + p.dur.max(1), p.start));
    }
    floors
}

/// Puts each message's leaving no later than its arrival. A sender stamps its end of a
/// message just after the message became visible, so the receiver, on another core, may
/// match it and stamp its own end first. The message really left between the start of the
/// call that sent it and the receiver's stamp: the `msg out` slice is moved back to just
/// before the `msg in` (keeping its end), never before the span it lies in.
fn order_message_ends(events: &mut [Placed]) {
    let floors = send_floors(events);
    for (o, i) in pair_messages(events).0 {
        let (arrived, out) = (events[i].start, events[o]);
        if out.start < arrived {
            continue;
        }
        let floor = floors.get(&o).copied().unwrap_or(0);
        let start = arrived.saturating_sub(1).max(floor);
        let end = out.start + out.dur;
        events[o].start = start;
        events[o].dur = (end - start).max(MIN_MSG_DUR);
    }
}

/// Each message's two ends, as (index of its `msg out`, index of its `msg in`), joined by
/// (source, destination, tag, id), the receives in the order they matched; and the number of
/// message ends without their other end.
fn pair_messages(events: &[Placed]) -> (Vec<(usize, usize)>, usize) {
    let mut outs: HashMap<MsgKey, usize> = HashMap::new();
    let mut ins: Vec<(usize, MsgKey)> = Vec::new();
    for (i, p) in events.iter().enumerate().filter(|(_, p)| p.ev.id != 0 && p.ev.peer != NONE) {
        match p.ev.kind() {
            Some(Kind::MsgOut) => {
                outs.insert((p.rank, p.ev.peer, p.ev.tag, p.ev.id), i);
            }
            Some(Kind::MsgIn) => ins.push((i, (p.ev.peer, p.rank, p.ev.tag, p.ev.id))),
            _ => {}
        }
    }
    let ends = outs.len() + ins.len();
    ins.sort_by_key(|&(i, _)| (events[i].start, events[i].rank));
    let pairs: Vec<(usize, usize)> = ins.into_iter().filter_map(|(i, key)| outs.remove(&key).map(|o| (o, i))).collect();
    (pairs, ends)
}

/// Makes the spans of each thread nest: a span that would end after the span it starts in is
/// cut at that span's end (clock corrections of a few nanoseconds can cause this).
fn nest(events: &mut [Placed]) {
    events.sort_by_key(|p| (p.rank, p.ev.thread, p.start, std::cmp::Reverse(p.dur)));
    let mut stack: Vec<u64> = Vec::new();
    let mut track = None;
    for p in events.iter_mut() {
        if track != Some((p.rank, p.ev.thread)) {
            track = Some((p.rank, p.ev.thread));
            stack.clear();
        }
        while stack.last().is_some_and(|&end| end <= p.start) {
            stack.pop();
        }
        if p.dur == 0 {
            continue;
        }
        if let Some(&end) = stack.last() {
            p.dur = p.dur.min(end - p.start);
        }
        if p.dur > 0 {
            stack.push(p.start + p.dur);
        }
    }
}

fn peer_arg(out: &mut String, key: &str, v: u32) {
    if v == NONE {
        let _ = write!(out, ",\"{key}\":\"any\"");
    } else {
        let _ = write!(out, ",\"{key}\":{v}");
    }
}

/// The name an event shows: the call's, or for a collective's step what it did.
fn event_name(ev: &Event, kind: Kind) -> String {
    if kind != Kind::CollPhase {
        return kind.name().to_string();
    }
    let what = match ev.aux & 0xff {
        1 => "send",
        2 => "recv",
        3 => "sendrecv",
        _ => "step",
    };
    if ev.peer == NONE {
        format!("coll {what}")
    } else {
        format!("coll {what} {}", ev.peer)
    }
}

/// The `args` of an event.
fn args(ev: &Event, kind: Kind) -> String {
    let mut a = String::from("{");
    let _ = write!(a, "\"bytes\":{}", ev.bytes);
    match kind.class() {
        Class::Message => {
            peer_arg(&mut a, if kind == Kind::MsgOut { "to" } else { "from" }, ev.peer);
            peer_arg(&mut a, "tag", ev.tag);
            let _ = write!(a, ",\"seq\":{},\"context\":{},\"protocol\":", ev.id & MSG_SEQ_MASK, ev.id >> MSG_SEQ_BITS);
            push_json_str(&mut a, &Proto(ev.aux).describe().join(", "));
        }
        Class::Note => {}
        Class::Phase => {
            peer_arg(&mut a, "peer", ev.peer);
            if ev.aux & aux::FAILED != 0 {
                a.push_str(",\"failed\":true");
            }
        }
        Class::Life => {}
        class => {
            match class {
                Class::Coll | Class::Nbc if ev.peer != NONE => peer_arg(&mut a, "root", ev.peer),
                Class::Coll | Class::Nbc | Class::Comm => {}
                Class::Complete => {
                    if ev.tag != NONE {
                        peer_arg(&mut a, "tag", ev.tag);
                    }
                }
                _ => {
                    peer_arg(&mut a, "peer", ev.peer);
                    peer_arg(&mut a, "tag", ev.tag);
                }
            }
            let _ = write!(a, ",\"comm\":{}", ev.aux & aux::COMM_MASK);
            if ev.aux & aux::FAILED != 0 {
                a.push_str(",\"failed\":true");
            }
            if ev.aux & aux::EMPTY != 0 {
                a.push_str(",\"found\":false");
            }
            if ev.aux & aux::OPEN != 0 {
                a.push_str(",\"unfinished\":true");
            }
            if kind.class() == Class::Complete && ev.id != 0 {
                let _ = write!(a, ",\"requests\":{}", ev.id);
            }
        }
    }
    a.push('}');
    a
}

fn event_json(out: &mut String, p: &Placed) {
    let Some(kind) = p.ev.kind() else { return };
    let (pid, tid) = (u64::from(p.rank) + 1, tid_of(p.rank, p.ev.thread));
    sep(out);
    out.push_str("{\"name\":");
    push_json_str(out, &event_name(&p.ev, kind));
    let _ = write!(out, ",\"cat\":\"{}\"", kind.class().name());
    if kind.class() == Class::Note {
        let _ = write!(out, ",\"ph\":\"i\",\"s\":\"p\",\"ts\":{},\"pid\":{pid},\"tid\":{tid}", us(p.start));
    } else {
        let _ = write!(out, ",\"ph\":\"X\",\"ts\":{},\"dur\":{},\"pid\":{pid},\"tid\":{tid}", us(p.start), us(p.dur));
    }
    out.push_str(",\"args\":");
    out.push_str(&args(&p.ev, kind));
    out.push('}');
}

/// Metadata: process and thread names, process order.
fn metadata(out: &mut String, traces: &[RankTrace], placed: &[Placed]) {
    let mut threads: BTreeMap<(u32, u16), ()> = BTreeMap::new();
    for p in placed {
        threads.insert((p.rank, p.ev.thread), ());
    }
    for t in traces {
        let r = t.info.rank;
        let pid = u64::from(r) + 1;
        let mut name = format!("rank {r}");
        if !t.info.host.is_empty() {
            let _ = write!(name, " ({}, pid {})", t.info.host, t.info.pid);
        }
        sep(out);
        let _ = write!(out, "{{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":{pid},\"tid\":{},\"args\":{{\"name\":", tid_of(r, 0));
        push_json_str(out, &name);
        out.push_str("}}");
        sep(out);
        let _ = write!(
            out,
            "{{\"name\":\"process_sort_index\",\"ph\":\"M\",\"pid\":{pid},\"tid\":{},\"args\":{{\"sort_index\":{r}}}}}",
            tid_of(r, 0)
        );
        for (&(_, th), ()) in threads.range((r, 0)..=(r, u16::MAX)) {
            let given = t.threads.iter().find(|(i, _)| *i == th).map(|(_, n)| n.clone());
            let tname = given.unwrap_or_else(|| if th == 0 { "main".to_string() } else { format!("thread {th}") });
            sep(out);
            let _ = write!(out, "{{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":{pid},\"tid\":{},\"args\":{{\"name\":", tid_of(r, th));
            push_json_str(out, &tname);
            out.push_str("}}");
        }
    }
}

/// A message's (source, destination, tag, id), which its two ends share.
type MsgKey = (u32, u32, u32, u64);

/// Flow events from each message out to the message in with the same (source, destination,
/// tag, id).
fn flows(out: &mut String, placed: &[Placed], summary: &mut Summary) {
    let (pairs, ends) = pair_messages(placed);
    let mut id = 0u64;
    for (o, i) in pairs {
        let (pout, pin) = (&placed[o], &placed[i]);
        if pout.dur < MIN_MSG_DUR || pin.dur < MIN_MSG_DUR || pout.start > pin.start {
            continue;
        }
        id += 1;
        let ends = [("s", pout, ""), ("f", pin, ",\"bp\":\"e\"")];
        for (ph, p, bp) in ends {
            sep(out);
            let _ = write!(
                out,
                "{{\"name\":\"message\",\"cat\":\"msg\",\"ph\":\"{ph}\",\"id\":{id},\"ts\":{},\"pid\":{},\"tid\":{}{bp}}}",
                us(p.start + 1),
                u64::from(p.rank) + 1,
                tid_of(p.rank, p.ev.thread)
            );
        }
    }
    summary.flows = id as usize;
    summary.unpaired = ends - 2 * summary.flows;
}

/// Merges the ranks' traces into one trace-event JSON document.
pub fn merge(traces: &[RankTrace], opts: &Options) -> (String, Summary) {
    let mut summary = Summary { ranks: traces.len(), ..Default::default() };
    let have: Vec<u32> = traces.iter().map(|t| t.info.rank).collect();
    summary.missing = (0..opts.size as u32).filter(|r| !have.contains(r)).collect();
    let doms = domains(traces, opts, &mut summary);
    let mut placed = place(traces, &doms, opts.end_ns);
    order_message_ends(&mut placed);
    nest(&mut placed);
    let mut out = String::from("{\"traceEvents\":[");
    metadata(&mut out, traces, &placed);
    for p in &placed {
        event_json(&mut out, p);
    }
    summary.events = placed.iter().filter(|p| p.ev.kind().is_some()).count();
    for t in traces {
        summary.dropped += t.dropped;
        if t.dropped > 0 {
            // At the rank's first kept event: what is missing came before it.
            let first = placed.iter().filter(|p| p.rank == t.info.rank).map(|p| p.start).min().unwrap_or(0);
            let p = Placed { rank: t.info.rank, ev: crate::ring::dropped_note(t.dropped, 0), start: first, dur: 0 };
            event_json(&mut out, &p);
        }
    }
    flows(&mut out, &placed, &mut summary);
    out.push_str("\n],\n\"otherData\":{\"tool\":\"tmpi-trace\"");
    let _ = write!(
        out,
        ",\"ranks\":{},\"missing_ranks\":\"{}\",\"dropped_events\":{},\"flows\":{},\"unpaired_messages\":{},\"clock_error_ns\":{}",
        opts.size.max(traces.len()),
        summary.missing.iter().map(u32::to_string).collect::<Vec<_>>().join(","),
        summary.dropped,
        summary.flows,
        summary.unpaired,
        summary.clock_error_ns
    );
    out.push_str("}}\n");
    (out, summary)
}

#[cfg(all(test, feature = "tools"))]
mod tests;
