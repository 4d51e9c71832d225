//! The communication profile: what each rank counts while it runs ([`Profiler`]), the text it
//! hands to `tmpirun` at finalize ([`RankProfile`]), and the job's report ([`Report`]): time in
//! communication per rank and per call, messages and bytes per pair of ranks, the longest
//! waits.
//!
//! A rank's text form, one item per line:
//!
//! ```text
//! tmpi-profile 1 rank=0 size=4 wall_ns=5000000 host=node1
//! call recv calls=10 ns=120000 max_ns=40000 bytes=800
//! peer 1 msgs=10 bytes=800
//! wait recv ns=40000 at_ns=1200000 peer=1 tag=5
//! ```

use std::collections::BTreeMap;
use std::fmt::Write as _;

use crate::event::{Class, Kind, NONE};
use crate::{Error, Result};

/// Longest waits a rank keeps.
pub const WAITS_KEPT: usize = 8;
/// First line's word and version.
const HEADER: &str = "tmpi-profile 1";

/// Counts of one kind of call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CallStat {
    /// Calls.
    pub calls: u64,
    /// Time inside them (ns).
    pub ns: u64,
    /// The longest one (ns).
    pub max_ns: u64,
    /// Payload bytes they carried.
    pub bytes: u64,
}

/// Messages this rank sent to one rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PeerStat {
    /// Messages.
    pub msgs: u64,
    /// Payload bytes.
    pub bytes: u64,
}

/// One long blocking call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Wait {
    /// The call.
    pub kind: Kind,
    /// How long it took (ns).
    pub ns: u64,
    /// When it started, ns after the rank's init.
    pub at_ns: u64,
    /// Whom it waited for (world rank), or [`NONE`].
    pub peer: u32,
    /// The tag, or [`NONE`].
    pub tag: u32,
}

/// A rank's profile.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RankProfile {
    /// World rank.
    pub rank: u32,
    /// Ranks in the job.
    pub size: u32,
    /// Host name.
    pub host: String,
    /// Time from init to finalize (ns).
    pub wall_ns: u64,
    /// Per kind of call.
    pub calls: BTreeMap<Kind, CallStat>,
    /// Per destination (world rank).
    pub peers: BTreeMap<u32, PeerStat>,
    /// The longest blocking calls, longest first.
    pub waits: Vec<Wait>,
}

/// Whether calls of `kind` can wait for other ranks (they count as waits).
pub fn blocks(kind: Kind) -> bool {
    matches!(kind.class(), Class::P2p | Class::Complete | Class::Coll | Class::Comm)
        && !matches!(kind, Kind::Iprobe | Kind::Improbe | Kind::Cancel)
}

/// What a rank counts while it runs: fixed arrays indexed by the kind's code, so counting a
/// call costs a few adds.
#[derive(Debug, Clone)]
pub struct Profiler {
    calls: Vec<CallStat>,
    peers: Vec<PeerStat>,
    waits: Vec<Wait>,
}

impl Profiler {
    /// A profiler for a job of `size` ranks.
    pub fn new(size: usize) -> Self {
        Profiler { calls: vec![CallStat::default(); 256], peers: vec![PeerStat::default(); size], waits: Vec::new() }
    }

    /// Counts one call of `kind` that took `ns` and carried `bytes`; `at_ns` is its start
    /// after init, `peer` and `tag` whom it was for (for the list of waits).
    pub fn call(&mut self, kind: Kind, ns: u64, bytes: u64, at_ns: u64, peer: u32, tag: u32) {
        if let Some(c) = self.calls.get_mut(usize::from(kind.code())) {
            c.calls += 1;
            c.ns += ns;
            c.max_ns = c.max_ns.max(ns);
            c.bytes += bytes;
        }
        if blocks(kind) && (self.waits.len() < WAITS_KEPT || self.waits.last().is_some_and(|w| w.ns < ns)) {
            let at = self.waits.partition_point(|w| w.ns >= ns);
            self.waits.insert(at, Wait { kind, ns, at_ns, peer, tag });
            self.waits.truncate(WAITS_KEPT);
        }
    }

    /// Counts one message of `bytes` sent to world rank `peer`.
    #[inline]
    pub fn sent(&mut self, peer: usize, bytes: u64) {
        if let Some(p) = self.peers.get_mut(peer) {
            p.msgs += 1;
            p.bytes += bytes;
        }
    }

    /// The profile so far.
    pub fn snapshot(&self, rank: u32, host: &str, wall_ns: u64) -> RankProfile {
        let calls =
            Kind::ALL.iter().filter_map(|&k| self.calls.get(usize::from(k.code())).filter(|c| c.calls > 0).map(|c| (k, *c))).collect();
        let peers = self.peers.iter().enumerate().filter(|(_, p)| p.msgs > 0).map(|(i, p)| (i as u32, *p)).collect();
        RankProfile { rank, size: self.peers.len() as u32, host: host.to_string(), wall_ns, calls, peers, waits: self.waits.clone() }
    }
}

fn opt(v: u32) -> String {
    if v == NONE {
        "any".into()
    } else {
        v.to_string()
    }
}

fn parse_opt(v: &str) -> Option<u32> {
    if v == "any" {
        Some(NONE)
    } else {
        v.parse().ok()
    }
}

/// `key=value` pairs of a line.
fn pairs(words: &[&str]) -> BTreeMap<String, String> {
    words.iter().filter_map(|w| w.split_once('=')).map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

fn get<T: std::str::FromStr>(m: &BTreeMap<String, String>, key: &str, line: &str) -> Result<T> {
    m.get(key).and_then(|v| v.parse().ok()).ok_or_else(|| Error::Format(format!("profile line {line:?}: no valid {key}")))
}

impl RankProfile {
    /// The text form (see the module docs).
    pub fn to_text(&self) -> String {
        let mut s = format!(
            "{HEADER} rank={} size={} wall_ns={} host={}\n",
            self.rank,
            self.size,
            self.wall_ns,
            self.host.replace(char::is_whitespace, "_")
        );
        for (k, c) in &self.calls {
            let _ = writeln!(s, "call {} calls={} ns={} max_ns={} bytes={}", k.name().replace(' ', "_"), c.calls, c.ns, c.max_ns, c.bytes);
        }
        for (p, st) in &self.peers {
            let _ = writeln!(s, "peer {p} msgs={} bytes={}", st.msgs, st.bytes);
        }
        for w in &self.waits {
            let _ = writeln!(
                s,
                "wait {} ns={} at_ns={} peer={} tag={}",
                w.kind.name().replace(' ', "_"),
                w.ns,
                w.at_ns,
                opt(w.peer),
                opt(w.tag)
            );
        }
        s
    }

    /// Reads the text form back.
    ///
    /// # Errors
    /// [`Error::Format`] naming the first line that is not one of the forms above.
    pub fn parse(text: &str) -> Result<Self> {
        let mut lines = text.lines();
        let first = lines.next().unwrap_or("");
        let rest = first.strip_prefix(HEADER).ok_or_else(|| Error::Format(format!("not a tmpi profile (first line {first:?})")))?;
        let words: Vec<&str> = rest.split_whitespace().collect();
        let m = pairs(&words);
        let mut p = RankProfile {
            rank: get(&m, "rank", first)?,
            size: get(&m, "size", first)?,
            wall_ns: get(&m, "wall_ns", first)?,
            host: m.get("host").cloned().unwrap_or_default(),
            ..Default::default()
        };
        for line in lines.filter(|l| !l.trim().is_empty()) {
            p.parse_line(line)?;
        }
        Ok(p)
    }

    fn parse_line(&mut self, line: &str) -> Result<()> {
        let words: Vec<&str> = line.split_whitespace().collect();
        let bad = || Error::Format(format!("profile line {line:?} is not understood"));
        let kind = |w: Option<&&str>| w.and_then(|w| Kind::from_name(&w.replace('_', " ")).or_else(|| Kind::from_name(w))).ok_or_else(bad);
        let m = pairs(&words);
        match words.first().copied() {
            Some("call") => {
                let c = CallStat {
                    calls: get(&m, "calls", line)?,
                    ns: get(&m, "ns", line)?,
                    max_ns: get(&m, "max_ns", line)?,
                    bytes: get(&m, "bytes", line)?,
                };
                self.calls.insert(kind(words.get(1))?, c);
            }
            Some("peer") => {
                let peer: u32 = words.get(1).and_then(|w| w.parse().ok()).ok_or_else(bad)?;
                self.peers.insert(peer, PeerStat { msgs: get(&m, "msgs", line)?, bytes: get(&m, "bytes", line)? });
            }
            Some("wait") => {
                let peer = m.get("peer").and_then(|v| parse_opt(v)).ok_or_else(bad)?;
                let tag = m.get("tag").and_then(|v| parse_opt(v)).ok_or_else(bad)?;
                self.waits.push(Wait { kind: kind(words.get(1))?, ns: get(&m, "ns", line)?, at_ns: get(&m, "at_ns", line)?, peer, tag });
            }
            _ => return Err(bad()),
        }
        Ok(())
    }

    /// Time in communication calls (every call but init and finalize), ns.
    pub fn comm_ns(&self) -> u64 {
        self.calls.iter().filter(|(k, _)| k.class() != Class::Life).map(|(_, c)| c.ns).sum()
    }
}

/// A duration for people: `850 ns`, `12.3 us`, `4.56 ms`, `1.23 s`.
pub fn human_ns(ns: u64) -> String {
    let f = ns as f64;
    if ns < 1_000 {
        format!("{ns} ns")
    } else if ns < 1_000_000 {
        format!("{:.1} us", f / 1e3)
    } else if ns < 1_000_000_000 {
        format!("{:.2} ms", f / 1e6)
    } else {
        format!("{:.2} s", f / 1e9)
    }
}

/// Bytes for people: `800 B`, `12.5 KiB`, `3.0 MiB`.
pub fn human_bytes(b: u64) -> String {
    let f = b as f64;
    if b < 1024 {
        format!("{b} B")
    } else if b < 1 << 20 {
        format!("{:.1} KiB", f / 1024.0)
    } else if b < 1 << 30 {
        format!("{:.1} MiB", f / 1048576.0)
    } else {
        format!("{:.2} GiB", f / 1073741824.0)
    }
}

/// The job's profile: every rank's, and the traffic matrix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    /// Ranks in the job.
    pub size: usize,
    /// The ranks' profiles, by rank.
    pub ranks: Vec<RankProfile>,
    /// Ranks that left no profile.
    pub missing: Vec<u32>,
}

/// Largest job whose traffic matrix is printed whole (larger ones list the busiest pairs).
const MATRIX_PRINTED: usize = 16;

impl Report {
    /// The report of a job of `size` ranks from the profiles that came back.
    pub fn new(size: usize, mut ranks: Vec<RankProfile>) -> Self {
        ranks.sort_by_key(|p| p.rank);
        ranks.dedup_by_key(|p| p.rank);
        let missing = (0..size as u32).filter(|r| !ranks.iter().any(|p| p.rank == *r)).collect();
        Report { size, ranks, missing }
    }

    /// (messages, bytes) from rank `from` to rank `to`.
    pub fn pair(&self, from: u32, to: u32) -> PeerStat {
        self.ranks.iter().find(|p| p.rank == from).and_then(|p| p.peers.get(&to)).copied().unwrap_or_default()
    }

    /// The text report.
    pub fn text(&self) -> String {
        let mut s = format!("tmpi profile of {} ranks", self.size);
        if !self.missing.is_empty() {
            let _ = write!(s, " (no profile from rank {})", self.missing.iter().map(u32::to_string).collect::<Vec<_>>().join(", "));
        }
        s.push_str("\n\ntime in communication per rank (every tmpi call but init and finalize):\n");
        let _ = writeln!(s, "  {:>5}  {:>10}  {:>10}  {:>6}  {:>8}", "rank", "wall", "in calls", "share", "calls");
        for p in &self.ranks {
            let calls: u64 = p.calls.iter().filter(|(k, _)| k.class() != Class::Life).map(|(_, c)| c.calls).sum();
            let share = if p.wall_ns > 0 { 100.0 * p.comm_ns() as f64 / p.wall_ns as f64 } else { 0.0 };
            let _ =
                writeln!(s, "  {:>5}  {:>10}  {:>10}  {:>5.1}%  {:>8}", p.rank, human_ns(p.wall_ns), human_ns(p.comm_ns()), share, calls);
        }
        s.push_str("\nper rank and call:\n");
        let _ = writeln!(s, "  {:>5}  {:<22} {:>8}  {:>10}  {:>10}  {:>10}", "rank", "call", "calls", "time", "longest", "bytes");
        for p in &self.ranks {
            let mut calls: Vec<(&Kind, &CallStat)> = p.calls.iter().collect();
            calls.sort_by(|a, b| b.1.ns.cmp(&a.1.ns).then(a.0.cmp(b.0)));
            for (k, c) in calls {
                let _ = writeln!(
                    s,
                    "  {:>5}  {:<22} {:>8}  {:>10}  {:>10}  {:>10}",
                    p.rank,
                    k.name(),
                    c.calls,
                    human_ns(c.ns),
                    human_ns(c.max_ns),
                    human_bytes(c.bytes)
                );
            }
        }
        self.pairs_text(&mut s);
        self.waits_text(&mut s);
        s
    }

    fn pairs_text(&self, s: &mut String) {
        s.push_str("\nmessages (bytes) per pair, sender by row, receiver by column:\n");
        let n = self.size as u32;
        if self.size <= MATRIX_PRINTED {
            let _ = write!(s, "  {:>5}", "");
            for to in 0..n {
                let _ = write!(s, " {:>16}", format!("-> {to}"));
            }
            s.push('\n');
            for from in 0..n {
                let _ = write!(s, "  {from:>5}");
                for to in 0..n {
                    let p = self.pair(from, to);
                    let cell = if p.msgs == 0 { "-".to_string() } else { format!("{} ({})", p.msgs, human_bytes(p.bytes)) };
                    let _ = write!(s, " {cell:>16}");
                }
                s.push('\n');
            }
            return;
        }
        let mut all: Vec<(u32, u32, PeerStat)> =
            self.ranks.iter().flat_map(|p| p.peers.iter().map(move |(to, st)| (p.rank, *to, *st))).collect();
        all.sort_by(|a, b| b.2.bytes.cmp(&a.2.bytes).then(b.2.msgs.cmp(&a.2.msgs)));
        let _ = writeln!(s, "  (the {} busiest of {} pairs; the SVG has them all)", all.len().min(20), all.len());
        for (from, to, st) in all.iter().take(20) {
            let _ = writeln!(s, "  {from:>5} -> {to:<5} {:>10} messages {:>12}", st.msgs, human_bytes(st.bytes));
        }
    }

    fn waits_text(&self, s: &mut String) {
        let mut all: Vec<(u32, Wait)> = self.ranks.iter().flat_map(|p| p.waits.iter().map(move |w| (p.rank, *w))).collect();
        all.sort_by(|a, b| b.1.ns.cmp(&a.1.ns).then(a.0.cmp(&b.0)));
        s.push_str("\nlongest waits:\n");
        if all.is_empty() {
            s.push_str("  (none)\n");
        }
        for (i, (r, w)) in all.iter().take(10).enumerate() {
            let whom = match (w.peer, w.tag) {
                (NONE, NONE) => String::new(),
                (NONE, t) => format!(" (tag {t})"),
                (p, NONE) => format!(" (rank {p})"),
                (p, t) => format!(" (rank {p}, tag {t})"),
            };
            let _ = writeln!(s, "  {:>2}. rank {r} {}{whom}: {} at {} after init", i + 1, w.kind.name(), human_ns(w.ns), human_ns(w.at_ns));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> RankProfile {
        let mut pr = Profiler::new(3);
        pr.call(Kind::Send, 1_000, 80, 10, 1, 5);
        pr.call(Kind::Send, 3_000, 80, 20, 2, 5);
        pr.call(Kind::Recv, 50_000, 8, 30, NONE, NONE);
        pr.call(Kind::Init, 9_000, 0, 0, NONE, NONE);
        pr.sent(1, 80);
        pr.sent(2, 80);
        pr.sent(2, 80);
        pr.sent(7, 1);
        pr.snapshot(0, "node one", 100_000)
    }

    #[test]
    fn a_profile_round_trips_through_its_text() {
        let p = sample();
        assert_eq!(p.calls[&Kind::Send], CallStat { calls: 2, ns: 4_000, max_ns: 3_000, bytes: 160 });
        assert_eq!(p.peers[&2], PeerStat { msgs: 2, bytes: 160 });
        assert!(!p.peers.contains_key(&7), "a rank outside the job is not counted");
        assert_eq!(p.waits.iter().map(|w| w.kind).collect::<Vec<_>>(), [Kind::Recv, Kind::Send, Kind::Send]);
        assert_eq!(p.comm_ns(), 54_000);
        let text = p.to_text();
        let back = RankProfile::parse(&text).unwrap();
        assert_eq!(back.host, "node_one");
        assert_eq!(RankProfile { host: "node one".into(), ..back }, p);
    }

    #[test]
    fn only_the_longest_waits_are_kept() {
        let mut pr = Profiler::new(1);
        for ns in [5u64, 1, 9, 3, 7, 2, 8, 6, 4, 10, 0] {
            pr.call(Kind::Wait, ns, 0, 0, NONE, NONE);
        }
        pr.call(Kind::Isend, 100, 0, 0, NONE, NONE);
        let p = pr.snapshot(0, "h", 1);
        assert_eq!(p.waits.iter().map(|w| w.ns).collect::<Vec<_>>(), [10, 9, 8, 7, 6, 5, 4, 3], "an isend is no wait");
    }

    #[test]
    fn bad_profiles_are_errors() {
        for bad in [
            "",
            "tmpi-profile 2 rank=0",
            "tmpi-profile 1 rank=x size=1 wall_ns=1",
            "tmpi-profile 1 rank=0 size=1 wall_ns=1\ncall nosuch calls=1 ns=1 max_ns=1 bytes=1",
            "tmpi-profile 1 rank=0 size=1 wall_ns=1\npeer x msgs=1 bytes=1",
            "tmpi-profile 1 rank=0 size=1 wall_ns=1\nwhat",
        ] {
            assert!(RankProfile::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn the_report_names_ranks_calls_pairs_and_waits() {
        let r = Report::new(3, vec![sample()]);
        assert_eq!(r.missing, [1, 2]);
        assert_eq!(r.pair(0, 2), PeerStat { msgs: 2, bytes: 160 });
        let t = r.text();
        for want in
            ["tmpi profile of 3 ranks (no profile from rank 1, 2)", "54.0 us", "54.0%", "recv", "2 (160 B)", "1. rank 0 recv: 50.0 us"]
        {
            assert!(t.contains(want), "{want:?} missing from:\n{t}");
        }
    }

    #[test]
    fn human_units() {
        let table = [(999, "999 ns"), (1_500, "1.5 us"), (2_345_678, "2.35 ms"), (3_000_000_000, "3.00 s")];
        for (ns, want) in table {
            assert_eq!(human_ns(ns), want);
        }
        assert_eq!(human_bytes(2048), "2.0 KiB");
    }
}
