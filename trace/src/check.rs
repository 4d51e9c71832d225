//! A checker of trace-event files against the rules of Perfetto's JSON importer that the
//! merger relies on (learnt from its tokenizer, parser and flow tracker), used by the tests
//! and by `tmpi-trace check`.
//!
//! Rules:
//!
//! 1. The file is JSON: an object whose first key is `traceEvents` (an array), with no other
//!    keys than `otherData`, `metadata` and `displayTimeUnit` (the importer stops reading at
//!    any other key) and no `displayTimeUnit` (Perfetto reads it as the unit of `ts`).
//! 2. No string holds a `\u` escape or a raw control character (the tokenizer refuses both).
//! 3. Every event is an object with a one-letter `ph`, integer `pid` and `tid`, and no array
//!    as a field (the tokenizer refuses it); every event but metadata (`M`) has a numeric
//!    `ts` of at least 0.
//! 4. Every `X` has a numeric `dur` of at least 0 and a `name`; the `X` events of one thread
//!    nest (none starts inside another and ends after it).
//! 5. Every `i` has a scope `s` of `g`, `p` or `t`.
//! 6. Every flow id has exactly one `s` and one `f`, with the same `cat` and `name`; the `f`
//!    has `"bp":"e"`; each lies strictly inside an `X` of its thread (the slice it binds to),
//!    and the `s` is not later than the `f`.
//! 7. Every process with events is named (`process_name`), and so is every thread
//!    (`thread_name`).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use serde_json::Value;

/// What a trace that passed holds.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Checked {
    /// Process names by pid.
    pub processes: BTreeMap<u64, String>,
    /// Complete events by name.
    pub spans: BTreeMap<String, usize>,
    /// Flows, each as ((pid, tid, ts) of its start, (pid, tid, ts) of its end) and the names
    /// of the slices they bind to.
    pub flows: Vec<Flow>,
    /// Instants by name.
    pub instants: BTreeMap<String, usize>,
    /// `otherData`, if any.
    pub other: Option<Value>,
    /// Every complete event, as (pid, tid, name, ts in µs, dur in µs, args).
    pub slices: Vec<Slice>,
}

/// One complete (`X`) event.
#[derive(Debug, Clone, PartialEq)]
pub struct Slice {
    /// Process.
    pub pid: u64,
    /// Thread.
    pub tid: u64,
    /// Name.
    pub name: String,
    /// Category.
    pub cat: String,
    /// Start (µs).
    pub ts: f64,
    /// Duration (µs).
    pub dur: f64,
    /// Arguments.
    pub args: Value,
}

/// A flow and the slices its ends bind to.
#[derive(Debug, Clone, PartialEq)]
pub struct Flow {
    /// The slice of its start (`s`).
    pub from: Slice,
    /// The slice of its end (`f`).
    pub to: Slice,
}

fn num(v: &Value, key: &str) -> Option<f64> {
    v.get(key).and_then(Value::as_f64)
}

fn int(v: &Value, key: &str) -> Option<u64> {
    v.get(key).and_then(Value::as_u64)
}

/// Rules 1 and 2, on the text.
fn check_text(text: &str, errs: &mut Vec<String>) {
    let t = text.trim_start();
    let after_brace = t.strip_prefix('{').map(str::trim_start);
    if !after_brace.is_some_and(|r| r.starts_with("\"traceEvents\"")) {
        errs.push("the file does not start with {\"traceEvents\"".into());
    }
    if text.contains("\\u") {
        errs.push("a string holds a \\u escape".into());
    }
    if text.chars().any(|c| c.is_control() && !matches!(c, '\n' | '\r' | '\t')) {
        errs.push("the file holds a raw control character".into());
    }
}

/// The slice of thread `track` that strictly contains `ts` (the innermost one).
fn enclosing(slices: &[Slice], ts: f64) -> Option<&Slice> {
    slices.iter().filter(|s| s.ts < ts && ts < s.ts + s.dur).min_by(|a, b| a.dur.total_cmp(&b.dur))
}

/// Rule 4's nesting, per thread.
fn check_nesting(by_track: &HashMap<(u64, u64), Vec<Slice>>, errs: &mut Vec<String>) {
    // Timestamps carry three decimals: compare in whole nanoseconds.
    let ns = |us: f64| (us * 1000.0).round() as i64;
    for ((pid, tid), slices) in by_track {
        let mut s: Vec<&Slice> = slices.iter().collect();
        s.sort_by(|a, b| a.ts.total_cmp(&b.ts).then(b.dur.total_cmp(&a.dur)));
        let mut stack: Vec<(i64, &str)> = Vec::new();
        for x in s {
            let (start, end) = (ns(x.ts), ns(x.ts + x.dur));
            while stack.last().is_some_and(|&(e, _)| e <= start) {
                stack.pop();
            }
            if let Some(&(e, outer)) = stack.last() {
                if end > e {
                    errs.push(format!("pid {pid} tid {tid}: {} at {} ends after the {outer} it starts in", x.name, x.ts));
                }
            }
            stack.push((end, &x.name));
        }
    }
}

/// One event (rules 3-5); returns it as a slice if it is one.
fn check_event(i: usize, e: &Value, errs: &mut Vec<String>) -> Option<Slice> {
    let Some(obj) = e.as_object() else {
        errs.push(format!("event {i} is not an object"));
        return None;
    };
    if let Some((k, _)) = obj.iter().find(|(_, v)| v.is_array()) {
        errs.push(format!("event {i}: field {k} is an array"));
    }
    let ph = e.get("ph").and_then(Value::as_str).unwrap_or("");
    if ph.chars().count() != 1 {
        errs.push(format!("event {i}: ph {ph:?} is not one letter"));
    }
    let (pid, tid) = (int(e, "pid"), int(e, "tid"));
    if pid.is_none() || tid.is_none() {
        errs.push(format!("event {i} ({ph}): pid and tid must be integers"));
    }
    let ts = num(e, "ts");
    if ph != "M" && !ts.is_some_and(|t| t >= 0.0) {
        errs.push(format!("event {i} ({ph}): no ts of at least 0"));
    }
    let name = e.get("name").and_then(Value::as_str).unwrap_or("").to_string();
    match ph {
        "X" => {
            let dur = num(e, "dur");
            if !dur.is_some_and(|d| d >= 0.0) || name.is_empty() {
                errs.push(format!("event {i}: an X needs a name and a dur of at least 0"));
                return None;
            }
            let cat = e.get("cat").and_then(Value::as_str).unwrap_or("").to_string();
            let args = e.get("args").cloned().unwrap_or(Value::Null);
            Some(Slice { pid: pid?, tid: tid?, name, cat, ts: ts?, dur: dur?, args })
        }
        "i" | "I" => {
            if !matches!(e.get("s").and_then(Value::as_str), Some("g" | "p" | "t")) {
                errs.push(format!("event {i}: an instant needs a scope s of g, p or t"));
            }
            None
        }
        _ => None,
    }
}

/// Checks `text` against the rules of the module docs.
///
/// # Errors
/// Every rule broken, one line each.
pub fn check(text: &str) -> Result<Checked, Vec<String>> {
    let mut errs = Vec::new();
    check_text(text, &mut errs);
    let doc: Value = match serde_json::from_str(text) {
        Ok(v) => v,
        Err(e) => return Err(vec![format!("not JSON: {e}")]),
    };
    let mut out = Checked::default();
    let Some(top) = doc.as_object() else { return Err(vec!["the top level is not an object".into()]) };
    for k in top.keys() {
        if !matches!(k.as_str(), "traceEvents" | "otherData" | "metadata") {
            errs.push(format!("top-level key {k:?} stops Perfetto's importer"));
        }
    }
    out.other = top.get("otherData").cloned();
    let Some(events) = top.get("traceEvents").and_then(Value::as_array) else {
        errs.push("no traceEvents array".into());
        return Err(errs);
    };
    let seen = Seen::scan(events, &mut out, &mut errs);
    check_nesting(&seen.by_track, &mut errs);
    check_flows(&seen.flow_ends, &seen.by_track, &mut out, &mut errs);
    for (pid, tid) in &seen.used_threads {
        if !out.processes.contains_key(pid) {
            errs.push(format!("pid {pid} has events but no process_name"));
        }
        if !seen.named_threads.contains(&(*pid, *tid)) {
            errs.push(format!("pid {pid} tid {tid} has events but no thread_name"));
        }
    }
    errs.sort();
    errs.dedup();
    if errs.is_empty() {
        Ok(out)
    } else {
        Err(errs)
    }
}

/// What one pass over the events gathers for the rules that span events.
#[derive(Default)]
struct Seen<'a> {
    /// The slices of each (pid, tid) track.
    by_track: HashMap<(u64, u64), Vec<Slice>>,
    named_threads: BTreeSet<(u64, u64)>,
    used_threads: BTreeSet<(u64, u64)>,
    /// The flow events of each id.
    flow_ends: BTreeMap<String, Vec<&'a Value>>,
}

impl<'a> Seen<'a> {
    /// Checks each event on its own (into `errs`), counts slices, instants and processes into
    /// `out`, and gathers the rest.
    fn scan(events: &'a [Value], out: &mut Checked, errs: &mut Vec<String>) -> Seen<'a> {
        let mut seen = Seen::default();
        for (i, e) in events.iter().enumerate() {
            if let Some(s) = check_event(i, e, errs) {
                *out.spans.entry(s.name.clone()).or_default() += 1;
                seen.used_threads.insert((s.pid, s.tid));
                out.slices.push(s.clone());
                seen.by_track.entry((s.pid, s.tid)).or_default().push(s);
            }
            seen.meta(e, out);
        }
        seen
    }

    /// Takes in a metadata, instant or flow event.
    fn meta(&mut self, e: &'a Value, out: &mut Checked) {
        let ph = e.get("ph").and_then(Value::as_str).unwrap_or("");
        let name = e.get("name").and_then(Value::as_str).unwrap_or("");
        let (pid, tid) = (int(e, "pid").unwrap_or(0), int(e, "tid").unwrap_or(0));
        match ph {
            "M" if name == "process_name" => {
                let n = e.pointer("/args/name").and_then(Value::as_str).unwrap_or("").to_string();
                out.processes.insert(pid, n);
            }
            "M" if name == "thread_name" => {
                self.named_threads.insert((pid, tid));
            }
            "i" | "I" => {
                self.used_threads.insert((pid, tid));
                *out.instants.entry(name.to_string()).or_default() += 1;
            }
            "s" | "f" => {
                let id = e.get("id").map(|v| v.to_string()).unwrap_or_default();
                self.flow_ends.entry(id).or_default().push(e);
            }
            _ => {}
        }
    }
}

/// Rule 6.
fn check_flows(
    ends: &BTreeMap<String, Vec<&Value>>,
    by_track: &HashMap<(u64, u64), Vec<Slice>>,
    out: &mut Checked,
    errs: &mut Vec<String>,
) {
    for (id, evs) in ends {
        let ph = |p: &str| evs.iter().filter(|e| e.get("ph").and_then(Value::as_str) == Some(p)).copied().collect::<Vec<_>>();
        let (s, f) = (ph("s"), ph("f"));
        if s.len() != 1 || f.len() != 1 {
            errs.push(format!("flow {id}: {} starts and {} ends (one each expected)", s.len(), f.len()));
            continue;
        }
        let (s, f) = (s[0], f[0]);
        if s.get("cat") != f.get("cat") || s.get("name") != f.get("name") {
            errs.push(format!("flow {id}: its start and end differ in cat or name"));
        }
        if f.get("bp").and_then(Value::as_str) != Some("e") {
            errs.push(format!("flow {id}: its end lacks \"bp\":\"e\""));
        }
        let bind = |e: &Value| {
            let track = (int(e, "pid").unwrap_or(0), int(e, "tid").unwrap_or(0));
            let ts = num(e, "ts").unwrap_or(-1.0);
            by_track.get(&track).and_then(|sl| enclosing(sl, ts)).cloned()
        };
        let (from, to) = (bind(s), bind(f));
        match (from, to) {
            (Some(from), Some(to)) => {
                if num(s, "ts") > num(f, "ts") {
                    errs.push(format!("flow {id}: it ends before it starts"));
                }
                out.flows.push(Flow { from, to });
            }
            _ => errs.push(format!("flow {id}: an end lies inside no slice of its thread")),
        }
    }
}
