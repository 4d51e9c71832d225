//! The markdown report and the raw CSV.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use crate::machine::Machine;
use crate::spec::{Bench, Lib, Rows, Segment};
use crate::stats::{median, ratio, Samples};

/// The cache-line ping-pong figures, in ns per one-way transfer: (median, best).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Cacheline {
    /// Measured just before the benchmarks.
    pub before: Option<(f64, f64)>,
    /// Measured just after them.
    pub after: Option<(f64, f64)>,
    /// Above this median the machine is called noisy.
    pub warn_ns: f64,
    /// The copy-bandwidth probe's (median, best) GB/s just before the benchmarks.
    pub pipe_before: Option<(f64, f64)>,
    /// The same just after them.
    pub pipe_after: Option<(f64, f64)>,
    /// The best copy-bandwidth median of all the probes of the session.
    pub pipe_best: Option<f64>,
    /// Below this fraction of [`Cacheline::pipe_best`] the host is called slow (0: no copy
    /// probe).
    pub copy_warn: f64,
}

impl Cacheline {
    /// The warning to print when the figure before or after the runs is far above a quiet
    /// machine's: either way some of the runs shared the cores with other work.
    pub fn warning(&self) -> Option<String> {
        let noisy: Vec<String> = [("before", self.before), ("after", self.after)]
            .into_iter()
            .filter_map(|(when, f)| f.filter(|&(m, _)| m > self.warn_ns).map(|(m, _)| format!("{m:.1} ns {when} the runs")))
            .collect();
        (!noisy.is_empty()).then(|| {
            format!(
                "cache-line ping-pong is {}, far above the ~30 ns of a quiet machine (threshold {:.0} ns): \
                 machine is noisy; comparison not valid",
                noisy.join(" and "),
                self.warn_ns
            )
        })
    }
}

/// What the cache-line probes around each invocation found (`--retries`).
#[derive(Debug, Clone, Default)]
pub struct HostChecks {
    /// Whether the probes ran (their threshold is [`Cacheline::warn_ns`]).
    pub on: bool,
    /// Invocations thrown away and run again because the host was slow around them.
    pub redone: usize,
    /// Invocations kept although the host was still slow after the last retry, one line each.
    pub kept_slow: Vec<String>,
}

/// Launch times: milliseconds per (configuration, ranks), one value per repetition.
#[derive(Debug, Clone, Default)]
pub struct Launch {
    /// Rank counts, in order.
    pub ranks: Vec<usize>,
    /// Repetitions per (configuration, ranks).
    pub reps: usize,
    /// Wall times in milliseconds.
    pub times: BTreeMap<(Lib, usize), Vec<f64>>,
}

/// Everything the report says.
#[derive(Debug, Clone)]
pub struct Report<'a> {
    /// The machine.
    pub machine: &'a Machine,
    /// The cache-line figures.
    pub cacheline: Cacheline,
    /// The checks around each invocation.
    pub host: HostChecks,
    /// Configurations that ran, tmpi first.
    pub libs: Vec<Lib>,
    /// Why some configurations did not run.
    pub skipped: Vec<String>,
    /// Repetitions asked for.
    pub reps: usize,
    /// Whether this was a `--quick` smoke run.
    pub quick: bool,
    /// The benchmark invocations of one repetition, per benchmark.
    pub segments: Vec<(Bench, Vec<Segment>)>,
    /// The measurements.
    pub samples: &'a Samples,
    /// The measurements of the invocations the probes read quiet around (all of them when
    /// none was kept slow; `None`: not told apart).
    pub quiet: Option<&'a Samples>,
    /// Runs that failed, one line each.
    pub failures: Vec<String>,
    /// Launch times, when measured.
    pub launch: Option<&'a Launch>,
    /// Plot files (relative to the report) to show, as (caption, file).
    pub plots: Vec<(String, String)>,
}

/// A value as the tables show it: message rates in millions, others with three or more
/// significant digits.
pub fn value_label(bench: Bench, v: f64) -> String {
    if bench == Bench::MsgRate {
        return format!("{:.2} M", v / 1e6);
    }
    if v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

/// The unit shown in table headings.
fn unit_label(bench: Bench) -> &'static str {
    match bench {
        Bench::MsgRate => "million messages/s",
        Bench::Bw | Bench::Bibw => "MB/s, 10^6 bytes per second",
        _ => "µs",
    }
}

/// How to read the ratio columns of `bench`.
pub fn ratio_note(bench: Bench) -> &'static str {
    if bench.higher_is_better() {
        "ratio = tmpi / peer; higher is better for tmpi (> 1: tmpi moves more)"
    } else {
        "ratio = tmpi / peer; lower is better for tmpi (< 1: tmpi is faster)"
    }
}

impl Report<'_> {
    fn peers(&self) -> Vec<Lib> {
        self.libs.iter().copied().filter(|&l| !l.is_tmpi()).collect()
    }

    /// The tmpi configurations whose ratios to each peer are shown.
    fn mine(&self) -> Vec<Lib> {
        self.libs.iter().copied().filter(|&l| l.is_tmpi()).collect()
    }

    fn cell(&self, bench: Bench, lib: Lib, size: usize) -> String {
        let v = self.samples.get(bench, lib, size);
        match median(v) {
            None => "–".into(),
            Some(m) if v.len() < self.reps => {
                format!("{} (n={})", value_label(bench, m), v.len())
            }
            Some(m) => value_label(bench, m),
        }
    }

    fn ratio_cell(&self, bench: Bench, mine: Lib, peer: Lib, size: usize) -> String {
        ratio(self.samples.median(bench, mine, size), self.samples.median(bench, peer, size))
            .map_or_else(|| "–".into(), |r| format!("{r:.2}"))
    }

    /// The (tmpi configuration, peer) pairs of the ratio columns, in column order.
    fn pairs(&self) -> Vec<(Lib, Lib)> {
        let peers = self.peers();
        self.mine().into_iter().flat_map(|m| peers.iter().map(move |&p| (m, p))).collect()
    }

    /// A table's heading: `first`, a column per configuration of `values`, then the ratio
    /// columns ([`Report::pairs`]).
    fn head_with(&self, first: &str, values: &[Lib]) -> String {
        let pairs = self.pairs();
        let mut s = format!("| {first} |");
        for l in values {
            let _ = write!(s, " {} |", l.label());
        }
        for (m, p) in &pairs {
            let _ = write!(s, " {}/{} |", m.key(), p.label());
        }
        s.push_str("\n|---|");
        for _ in 0..values.len() + pairs.len() {
            s.push_str("---:|");
        }
        s.push('\n');
        s
    }

    fn table_head(&self, first: &str) -> String {
        self.head_with(first, &self.libs)
    }

    fn row(&self, label: &str, bench: Bench, size: usize) -> String {
        let mut s = format!("| {label} |");
        for &l in &self.libs {
            let _ = write!(s, " {} |", self.cell(bench, l, size));
        }
        for (m, p) in self.pairs() {
            let _ = write!(s, " {} |", self.ratio_cell(bench, m, p, size));
        }
        s.push('\n');
        s
    }

    /// The key numbers: 8 B latency, bandwidth at 64 KiB, 1 MiB and 16 MiB, bidirectional
    /// bandwidth at 1 MiB, message rate, barrier, 8 B allreduce, 8 B latency at depth 0 and
    /// 4096 (rows without data are left out).
    fn key_numbers(&self) -> String {
        let picks = [
            (Bench::Latency, 8, "latency 8 B (µs)"),
            (Bench::Latency, 1 << 20, "latency 1 MiB (µs)"),
            (Bench::Bw, 64 << 10, "bw 64 KiB (MB/s)"),
            (Bench::Bw, 1 << 20, "bw 1 MiB (MB/s)"),
            (Bench::Bw, 16 << 20, "bw 16 MiB (MB/s)"),
            (Bench::Bibw, 1 << 20, "bibw 1 MiB (MB/s)"),
            (Bench::MsgRate, 8, "message rate 8 B (M msg/s)"),
            (Bench::Barrier, 2, "barrier, 2 ranks (µs)"),
            (Bench::Barrier, 4, "barrier, 4 ranks (µs)"),
            (Bench::Allreduce2, 8, "allreduce 8 B, 2 ranks (µs)"),
            (Bench::Allreduce4, 8, "allreduce 8 B, 4 ranks (µs)"),
            (Bench::Allreduce2, 1 << 20, "allreduce 1 MiB, 2 ranks (µs)"),
            (Bench::DepthAny, 0, "latency 8 B, posted-any D = 0 (µs)"),
            (Bench::DepthAny, 4096, "latency 8 B, posted-any D = 4096 (µs)"),
            (Bench::DepthSpecific, 4096, "latency 8 B, posted-specific D = 4096 (µs)"),
            (Bench::DepthUnexpected, 4096, "latency 8 B, unexpected D = 4096 (µs)"),
        ];
        let mut s = self.table_head("measure");
        let mut any = false;
        for (bench, size, label) in picks {
            if self.samples.sizes(bench).contains(&size) {
                s.push_str(&self.row(label, bench, size));
                any = true;
            }
        }
        if any {
            s
        } else {
            String::new()
        }
    }

    /// Where some invocations of `bench` were kept although the host read slow around them:
    /// its ratio columns again, from the medians of the other invocations only (a slow spell
    /// that caught one configuration's run moves a 5-run median).
    fn quiet_ratios(&self, bench: Bench) -> Option<String> {
        let q = self.quiet?;
        let sizes = self.samples.sizes(bench);
        let differs = |z: usize| self.libs.iter().any(|&l| q.get(bench, l, z).len() != self.samples.get(bench, l, z).len());
        if !sizes.iter().any(|&z| differs(z)) {
            return None;
        }
        let mut s = String::from(
            "Ratios over the invocations the probe read quiet only (those kept slow left out; `(n=a/b)`: a and b \
             values behind the two medians where fewer than the repetitions):\n\n",
        );
        s.push_str(&self.head_with("size", &[]));
        for z in sizes {
            let _ = write!(s, "| {} |", bench.row_label(z));
            for (m, p) in self.pairs() {
                let (a, b) = (q.get(bench, m, z), q.get(bench, p, z));
                let r = ratio(median(a), median(b)).map_or_else(|| "–".into(), |r| format!("{r:.2}"));
                if a.len().min(b.len()) < self.reps && !a.is_empty() && !b.is_empty() {
                    let _ = write!(s, " {r} (n={}/{}) |", a.len(), b.len());
                } else {
                    let _ = write!(s, " {r} |");
                }
            }
            s.push('\n');
        }
        Some(s)
    }

    /// For a depth benchmark: each configuration's median at the deepest depth over its median
    /// at depth 0 (how much a deep queue costs), one line.
    fn depth_growth(&self, bench: Bench) -> Option<String> {
        let sizes = self.samples.sizes(bench);
        let (&lo, &hi) = (sizes.first()?, sizes.last()?);
        if lo == hi {
            return None;
        }
        let parts: Vec<String> = self
            .libs
            .iter()
            .filter_map(|&l| {
                ratio(self.samples.median(bench, l, hi), self.samples.median(bench, l, lo)).map(|r| format!("{} {r:.2}x", l.label()))
            })
            .collect();
        (!parts.is_empty()).then(|| format!("Growth, D = {hi} over D = {lo}: {}.", parts.join(", ")))
    }

    /// The whole markdown text.
    pub fn markdown(&self) -> String {
        let mut s = String::new();
        self.md_title(&mut s);
        self.md_machine(&mut s);
        self.md_host_state(&mut s);
        self.md_runs(&mut s);
        self.md_benches(&mut s);
        self.md_launch(&mut s);
        self.md_plots_and_failures(&mut s);
        s
    }

    /// The title, and the quick-run warning.
    fn md_title(&self, s: &mut String) {
        s.push_str(if self.segments.is_empty() {
            "# tmpi vs MPI libraries: launch time\n\n"
        } else {
            "# tmpi vs MPI libraries: comparison\n\n"
        });
        if self.quick {
            let _ = writeln!(
                s,
                "**Quick smoke run (`--quick`): a tenth of the iterations, {} repetition(s); not a measurement.**\n",
                self.reps
            );
        }
    }

    /// The machine: date, kernel, CPU, load, and the cache-line and copy probes before and after.
    fn md_machine(&self, s: &mut String) {
        let m = self.machine;
        let _ = writeln!(s, "- date: {}", m.date);
        let _ = writeln!(s, "- kernel: {} (`uname -r`)", m.kernel);
        let _ = writeln!(s, "- CPU: {}, {} cores available", m.cpu, m.cores);
        let _ = writeln!(
            s,
            "- load average (1/5/15 min): {} before, {} after",
            m.load_before,
            if m.load_after.is_empty() { "–" } else { &m.load_after }
        );
        let cl = |v: Option<(f64, f64)>| {
            v.map_or_else(|| "not measured".to_string(), |(med, best)| format!("{med:.1} ns median, {best:.1} ns best"))
        };
        let _ = writeln!(
            s,
            "- cache-line ping-pong, core 0 <-> core 1, one way: {} before the runs, {} after",
            cl(self.cacheline.before),
            cl(self.cacheline.after)
        );
        if self.cacheline.pipe_before.is_some() || self.cacheline.pipe_after.is_some() {
            let gb = |v: Option<(f64, f64)>| {
                v.map_or_else(|| "not measured".to_string(), |(med, best)| format!("{med:.1} GB/s median, {best:.1} GB/s best"))
            };
            let _ = writeln!(
                s,
                "- copy bandwidth, 128 KiB messages through a 4 MiB ring, core 0 -> core 1: {} before the runs, {} after{}",
                gb(self.cacheline.pipe_before),
                gb(self.cacheline.pipe_after),
                self.cacheline.pipe_best.map_or_else(String::new, |b| format!("; best probe median of the session {b:.1} GB/s"))
            );
        }
    }

    /// The host's state around every invocation, and the warning when slow samples were kept.
    fn md_host_state(&self, s: &mut String) {
        if self.host.on {
            let copy = if self.cacheline.copy_warn > 0.0 {
                format!(", or copy bandwidth below {:.2}x the session's best probe", self.cacheline.copy_warn)
            } else {
                String::new()
            };
            let _ = writeln!(
                s,
                "- host state around every invocation (a short probe before and after; cache line above {:.0} ns{copy}: \
                 the host is slow): {} invocation(s) thrown away and run again; {}",
                self.cacheline.warn_ns,
                self.host.redone,
                if self.host.kept_slow.is_empty() {
                    "none kept from a slow host".to_string()
                } else {
                    format!("kept although the host stayed slow: {}", self.host.kept_slow.join("; "))
                }
            );
        }
        // With the probes around every invocation, what counts is whether any samples were
        // kept from a slow host; the figures before and after only bracket the whole run.
        let warning = if self.host.on {
            (!self.host.kept_slow.is_empty()).then(|| {
                format!(
                    "{} invocation(s) kept although the probe around them read the host slow: \
                     their figures are not valid",
                    self.host.kept_slow.len()
                )
            })
        } else {
            self.cacheline.warning()
        };
        if let Some(w) = warning {
            let _ = writeln!(s, "\n> **Warning:** {w}.\n");
        }
    }

    /// Versions, priority, configurations, skips, and the invocations of one repetition.
    fn md_runs(&self, s: &mut String) {
        let m = self.machine;
        for v in &m.versions {
            let _ = writeln!(s, "- {v}");
        }
        let _ = writeln!(s, "- priority: {}", m.priority.as_deref().unwrap_or("normal (not raised)"));
        let _ = writeln!(
            s,
            "- configurations: {}",
            self.libs.iter().map(|l| format!("{} (`{}`)", l.label(), l.key())).collect::<Vec<_>>().join(", ")
        );
        for sk in &self.skipped {
            let _ = writeln!(s, "- skipped: {sk}");
        }
        if !self.segments.is_empty() {
            let _ = writeln!(
                s,
                "- {} repetition(s), configurations interleaved (every repetition runs each \
                 benchmark under every configuration, in a rotated order); each cell is the median \
                 over the repetitions, `(n=k)` when only k of them gave a value",
                self.reps
            );
            s.push_str("- invocations per repetition (same options for every configuration; the C peer `coll` gets the collective's name first):\n");
            for (bench, segs) in &self.segments {
                let args: Vec<String> = segs
                    .iter()
                    .map(|g| {
                        let mut a = g.args();
                        a.extend(bench.extra_args());
                        format!("-n {} {}", g.np, a.join(" "))
                    })
                    .collect();
                let _ = writeln!(s, "  - {} (`{}` / `{}`): `{}`", bench.key(), bench.tmpi_bin(), bench.peer_bin(), args.join("`, `"));
            }
        }
        s.push('\n');
    }

    /// The key numbers, then one table per benchmark.
    fn md_benches(&self, s: &mut String) {
        let keys = self.key_numbers();
        if !keys.is_empty() {
            s.push_str("## Key numbers\n\n");
            s.push_str("Latency ratios: lower is better for tmpi; bandwidth and rate ratios: higher is better.\n\n");
            s.push_str(&keys);
            s.push('\n');
        }

        for bench in Bench::ALL {
            let sizes = self.samples.sizes(bench);
            if sizes.is_empty() {
                continue;
            }
            let _ = writeln!(s, "## {}: {}\n", bench.title(), unit_label(bench));
            let _ = writeln!(s, "{}.\n", ratio_note(bench));
            let first = match bench.rows() {
                Rows::Sizes => "size",
                Rows::Single => "ranks",
                Rows::Depths => "depth",
            };
            s.push_str(&self.table_head(first));
            for size in sizes {
                s.push_str(&self.row(&bench.row_label(size), bench, size));
            }
            s.push('\n');
            if let Some(t) = self.quiet_ratios(bench) {
                s.push_str(&t);
                s.push('\n');
            }
            if bench.rows() == Rows::Depths {
                if let Some(g) = self.depth_growth(bench) {
                    let _ = writeln!(s, "{g}\n");
                }
            }
        }
    }

    /// The launch-time table (with `--launch`).
    fn md_launch(&self, s: &mut String) {
        let Some(l) = self.launch else { return };
        let _ = writeln!(s, "## Launch time (ms, median of {}; `hello` on N ranks)\n", l.reps);
        s.push_str("ratio = tmpirun / peer launcher; lower is better for tmpi.\n\n");
        let libs: Vec<Lib> = self.libs.iter().copied().filter(|&x| x != Lib::OmpiNoCma && x != Lib::TmpiShared).collect();
        let peers: Vec<Lib> = libs.iter().copied().filter(|&x| !x.is_tmpi()).collect();
        s.push_str("| ranks |");
        for x in &libs {
            let _ = write!(s, " {} |", x.label());
        }
        for p in &peers {
            let _ = write!(s, " tmpi/{} |", p.label());
        }
        s.push_str("\n|---|");
        for _ in 0..libs.len() + peers.len() {
            s.push_str("---:|");
        }
        s.push('\n');
        for &n in &l.ranks {
            let med = |x: Lib| l.times.get(&(x, n)).and_then(|v| median(v));
            let _ = write!(s, "| {n} |");
            for &x in &libs {
                let v = l.times.get(&(x, n)).map_or(&[][..], Vec::as_slice);
                match median(v) {
                    Some(m) if v.len() < l.reps => {
                        let _ = write!(s, " {m:.1} (n={}) |", v.len());
                    }
                    Some(m) => {
                        let _ = write!(s, " {m:.1} |");
                    }
                    None => s.push_str(" – |"),
                }
            }
            for &p in &peers {
                match ratio(med(Lib::Tmpi), med(p)) {
                    Some(r) => {
                        let _ = write!(s, " {r:.2} |");
                    }
                    None => s.push_str(" – |"),
                }
            }
            s.push('\n');
        }
        s.push('\n');
    }

    /// The plots and the failed runs.
    fn md_plots_and_failures(&self, s: &mut String) {
        if !self.plots.is_empty() {
            s.push_str("## Plots\n\n");
            for (caption, file) in &self.plots {
                let _ = writeln!(s, "![{caption}]({file})\n");
            }
        }

        if !self.failures.is_empty() {
            s.push_str("## Failed runs\n\n");
            for f in &self.failures {
                let _ = writeln!(s, "- {}", f.replace('\n', " / "));
            }
            s.push('\n');
        }
    }
}

/// Every sample as CSV: `bench,lib,size,rep,value` (rep counts from 1 in measuring order).
pub fn csv(samples: &Samples) -> String {
    let mut s = String::from("bench,lib,size,rep,value\n");
    for (bench, lib, size, values) in samples.iter() {
        for (i, v) in values.iter().enumerate() {
            let _ = writeln!(s, "{bench},{lib},{size},{},{v}", i + 1);
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn machine() -> Machine {
        Machine {
            kernel: "6.1.0".into(),
            cpu: "Test CPU".into(),
            cores: 2,
            date: "2026-01-01 00:00:00 UTC".into(),
            load_before: "0.1 0.2 0.3".into(),
            load_after: "0.4 0.5 0.6".into(),
            versions: vec!["Open MPI 4.1.4".into()],
            priority: None,
        }
    }

    fn samples() -> Samples {
        let mut s = Samples::default();
        for (t, p) in [(1.0, 2.0), (1.2, 2.2), (0.8, 1.8)] {
            s.add(Bench::Latency, Lib::Tmpi, 8, t);
            s.add(Bench::Latency, Lib::Ompi, 8, p);
        }
        for (t, p) in [(3000.0, 1500.0), (3100.0, 1600.0), (2900.0, 1400.0)] {
            s.add(Bench::Bw, Lib::Tmpi, 1 << 20, t);
            s.add(Bench::Bw, Lib::Ompi, 1 << 20, p);
        }
        s.add(Bench::MsgRate, Lib::Tmpi, 8, 5_000_000.0);
        s
    }

    fn report<'a>(m: &'a Machine, s: &'a Samples) -> Report<'a> {
        Report {
            machine: m,
            cacheline: Cacheline { before: Some((31.0, 29.0)), warn_ns: 90.0, ..Cacheline::default() },
            host: HostChecks::default(),
            libs: vec![Lib::Tmpi, Lib::Ompi],
            skipped: vec!["MPICH: mpicc.mpich not found".into()],
            reps: 3,
            quick: false,
            segments: vec![],
            samples: s,
            quiet: None,
            failures: vec![],
            launch: None,
            plots: vec![],
        }
    }

    #[test]
    fn tables_hold_medians_and_tmpi_over_peer_ratios() {
        let (m, s) = (machine(), samples());
        let md = report(&m, &s).markdown();
        // Latency: medians 1.00 and 2.00, ratio 0.50 (tmpi faster, lower is better).
        assert!(md.contains("| 8 B | 1.00 | 2.00 | 0.50 |"), "{md}");
        // Bandwidth: medians 3000 and 1500, ratio 2.00 (tmpi faster, higher is better).
        assert!(md.contains("| 1 MiB | 3000 | 1500 | 2.00 |"), "{md}");
        // A single sample out of three is marked, and a missing peer value has no ratio.
        assert!(md.contains("| 8 B | 5.00 M (n=1) | – | – |"), "{md}");
        assert!(md.contains("lower is better for tmpi"));
        assert!(md.contains("higher is better for tmpi"));
        assert!(md.contains("6.1.0") && md.contains("Test CPU") && md.contains("31.0 ns"));
        assert!(md.contains("| measure | tmpi | Open MPI | tmpi/Open MPI |"));
        assert!(md.contains("skipped: MPICH"));
        assert!(!md.contains("Warning"));
    }

    /// Where invocations were kept slow, a benchmark's ratios come again from the quiet ones
    /// only; a benchmark all of whose invocations were quiet gets no such table.
    #[test]
    fn ratios_over_quiet_invocations_where_some_were_kept_slow() {
        let (m, s) = (machine(), samples());
        let mut r = report(&m, &s);
        assert!(!r.markdown().contains("read quiet only"), "none without the quiet samples");
        let same = s.clone();
        r.quiet = Some(&same);
        assert!(!r.markdown().contains("read quiet only"), "none where nothing was left out");
        // Open MPI's bandwidth run of 1600 was kept slow: quiet medians 3000 against 1450.
        let mut q = Samples::default();
        for (bench, lib, size, values) in s.iter() {
            for &v in values {
                if !(bench == Bench::Bw && lib == Lib::Ompi && v == 1600.0) {
                    q.add(bench, lib, size, v);
                }
            }
        }
        r.quiet = Some(&q);
        let md = r.markdown();
        let bw = md.find("## Unidirectional bandwidth").expect("bw section");
        let table = &md[bw..];
        assert!(table.contains("read quiet only"), "{md}");
        assert!(table.contains("| size | tmpi/Open MPI |\n|---|---:|\n| 1 MiB | 2.07 (n=3/2) |\n"), "{md}");
        let lat = &md[md.find("## Ping-pong latency").expect("latency section")..bw];
        assert!(!lat.contains("read quiet only"), "{md}");
    }

    #[test]
    fn the_checks_around_invocations_are_reported() {
        let (m, s) = (machine(), samples());
        let mut r = report(&m, &s);
        assert!(!r.markdown().contains("host state around every invocation"), "no line when the checks were off");
        r.host = HostChecks { on: true, redone: 2, kept_slow: vec![] };
        let md = r.markdown();
        assert!(md.contains("cache line above 90 ns: the host is slow): 2 invocation(s) thrown away and run again; none kept"), "{md}");
        assert!(!md.contains("copy bandwidth"), "{md}");
        r.cacheline.copy_warn = 0.75;
        r.cacheline.pipe_before = Some((50.0, 53.0));
        r.cacheline.pipe_best = Some(52.5);
        let md = r.markdown();
        assert!(md.contains("cache line above 90 ns, or copy bandwidth below 0.75x the session's best probe: the host is slow)"), "{md}");
        assert!(md.contains("core 0 -> core 1: 50.0 GB/s median, 53.0 GB/s best before the runs, not measured after; best probe median of the session 52.5 GB/s"), "{md}");
        // A slow figure before the whole run does not warn when every invocation was checked.
        r.cacheline.before = Some((200.0, 190.0));
        assert!(!r.markdown().contains("Warning"));
        r.host.kept_slow.push("rep 1 bw tmpi (cache-line 40 ns before, 200 ns after)".into());
        let md = r.markdown();
        assert!(md.contains("kept although the host stayed slow: rep 1 bw tmpi (cache-line 40 ns before, 200 ns after)"));
        assert!(md.contains("**Warning:** 1 invocation(s) kept although"), "{md}");
    }

    #[test]
    fn a_slow_cache_line_warns() {
        let (m, s) = (machine(), samples());
        let mut r = report(&m, &s);
        r.cacheline.before = Some((250.0, 200.0));
        assert!(r.markdown().contains("machine is noisy; comparison not valid"));
        r.cacheline.before = None;
        assert_eq!(r.cacheline.warning(), None);
        // Quiet before, noisy after: the later runs shared the cores, so it warns too.
        r.cacheline.before = Some((40.0, 38.0));
        r.cacheline.after = Some((220.0, 212.0));
        let w = r.cacheline.warning().expect("a noisy end warns");
        assert!(w.contains("220.0 ns after the runs") && !w.contains("before"), "{w}");
        r.cacheline.after = Some((45.0, 44.0));
        assert_eq!(r.cacheline.warning(), None);
    }

    #[test]
    fn launch_table_and_csv() {
        let (m, s) = (machine(), samples());
        let mut l = Launch { ranks: vec![2], reps: 2, ..Launch::default() };
        l.times.insert((Lib::Tmpi, 2), vec![10.0, 30.0]);
        l.times.insert((Lib::Ompi, 2), vec![80.0]);
        let mut r = report(&m, &s);
        r.launch = Some(&l);
        let md = r.markdown();
        assert!(md.contains("| 2 | 20.0 | 80.0 (n=1) | 0.25 |"), "{md}");
        let c = csv(&s);
        assert!(c.starts_with("bench,lib,size,rep,value\nlatency,tmpi,8,1,1\n"), "{c}");
        assert_eq!(c.lines().count(), 1 + 6 + 6 + 1);
    }

    #[test]
    fn collective_and_depth_tables() {
        let m = machine();
        let mut s = Samples::default();
        for (n, t, p) in [(2, 0.8, 0.2), (4, 9.0, 5.0)] {
            s.add(Bench::Barrier, Lib::Tmpi, n, t);
            s.add(Bench::Barrier, Lib::Ompi, n, p);
        }
        for (d, t, p) in [(0, 0.2, 0.1), (4096, 0.22, 300.0)] {
            s.add(Bench::DepthAny, Lib::Tmpi, d, t);
            s.add(Bench::DepthAny, Lib::Ompi, d, p);
        }
        let mut r = report(&m, &s);
        r.reps = 1;
        let md = r.markdown();
        assert!(md.contains("| ranks | tmpi | Open MPI | tmpi/Open MPI |"), "{md}");
        assert!(md.contains("| 4 ranks | 9.00 | 5.00 | 1.80 |"), "{md}");
        assert!(md.contains("| D = 4096 | 0.22 | 300 | 0.00 |"), "{md}");
        assert!(md.contains("| barrier, 2 ranks (µs) | 0.80 | 0.20 | 4.00 |"), "{md}");
        assert!(md.contains("Growth, D = 4096 over D = 0: tmpi 1.10x, Open MPI 3000.00x."), "{md}");
    }

    #[test]
    fn labels() {
        assert_eq!(value_label(Bench::Latency, 0.456), "0.46");
        assert_eq!(value_label(Bench::Bw, 12.34), "12.3");
        assert_eq!(value_label(Bench::Bw, 12345.6), "12346");
    }
}
