//! `tmpi-compare`: runs tmpi's OSU-style benchmarks and the same C programs built against
//! Open MPI and MPICH, interleaved, on this machine, and writes a markdown table of medians
//! with tmpi/peer ratios, a CSV of every sample, and log-log plots (SVG and PNG). Point to
//! point (latency, bandwidth, bidirectional bandwidth, message rate), collectives (barrier at 2
//! and 4 ranks, allreduce 8 B-1 MiB at 2 and 4 ranks) and matching depth (8-byte latency with
//! D posted or queued entries), each beside the cache-line figure of the machine.
//!
//! ```text
//! cargo build --release --workspace --bins && target/release/tmpi-compare
//! target/release/tmpi-compare --quick                 # smoke test, into target/compare-quick
//! target/release/tmpi-compare --benches barrier,allreduce,depth --reps 3
//! target/release/tmpi-compare --launch --no-bench     # launch times only
//! ```
//!
//! See bench/README.md for what it measures and how to install the peers.

mod error;
mod machine;
mod parse;
mod peers;
mod plot;
mod report;
mod run;
mod spec;
mod stats;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Parser;

use crate::error::Error;
use crate::machine::{first_line, load_average, Machine};
use crate::peers::{build_cacheline, build_peer, Paths};
use crate::plot::{plot, Legend, Series};
use crate::report::{csv, Cacheline, HostChecks, Launch, Report};
use crate::run::run;
use crate::spec::{command_line, segments, Bench, Lib, Peer, Rows, Segment, DEPTHS, GROUPS, OFI_LIBS};
use crate::stats::Samples;

/// Compare tmpi with Open MPI and MPICH on this machine: latency, bandwidth, bidirectional
/// bandwidth and message rate (2 ranks), barrier (2 and 4 ranks), allreduce 8 B-1 MiB (2 and 4
/// ranks), 8-byte latency with deep matching queues (osu_latency_depth / bench/c/depth.c, D =
/// 0..4096 posted-specific, posted-any, unexpected); optionally launch time. The cache-line
/// ping-pong figure is measured before and after and recorded in the report.
#[derive(Debug, Parser)]
#[command(name = "tmpi-compare", version)]
struct Cli {
    /// Repetitions of every (benchmark, configuration) [default: 5, 1 with --quick].
    #[arg(long)]
    reps: Option<usize>,
    /// Largest message size of latency, bandwidth and bidirectional bandwidth, in bytes
    /// (allreduce always runs 8 B-1 MiB);
    /// K, M, G (binary) suffixes allowed [default: 64M, 1M with --quick].
    #[arg(long, value_parser = parse_size)]
    max_size: Option<usize>,
    /// Output directory (default: `<root>/bench/results`, `<root>/target/compare-quick` with
    /// --quick).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Smoke test: one repetition, sizes up to 1 MiB, a tenth of the iterations (collectives
    /// and depth too), 3 launch repetitions.
    #[arg(long)]
    quick: bool,
    /// Also compare launch times: `tmpirun -n N hello` against mpirun.openmpi and
    /// mpirun.mpich of bench/compare/hello.c.
    #[arg(long)]
    launch: bool,
    /// Skip the benchmarks (with --launch: launch times only).
    #[arg(long)]
    no_bench: bool,
    /// Benchmarks to run: latency, bw, bibw, msgrate (2 ranks; sizes up to --max-size),
    /// barrier (osu_barrier / `coll barrier`, 2 and 4 ranks), allreduce (osu_allreduce /
    /// `coll allreduce`, 8 B-1 MiB, 2 and 4 ranks), depth (osu_latency_depth / depth: 8 B
    /// ping-pong with D = 0, 16, 256, 1024, 4096 never-matching receives posted from the peer,
    /// never-matching ANY_SOURCE receives posted, or unreceived messages queued).
    #[arg(long, value_delimiter = ',', default_value = "latency,bw,bibw,msgrate,barrier,allreduce,depth")]
    benches: Vec<String>,
    /// Rank counts of the launch comparison.
    #[arg(long, value_delimiter = ',', default_value = "2,8,16")]
    launch_ranks: Vec<usize>,
    /// Repetitions of each launch (after one untimed warm-up) [default: 10, 3 with --quick].
    #[arg(long)]
    launch_reps: Option<usize>,
    /// Configurations to run: tmpi, tmpi-shared (tmpi with point-to-point buffers in its
    /// shared heap, `-d shared`), ompi (Open MPI), ompi-nosc (Open MPI without CMA), mpich;
    /// and the OFI ones (see --ofi): tmpi-ofi, tmpi-tcp, ompi-ofi.
    #[arg(long, value_delimiter = ',', default_value = "tmpi,tmpi-shared,ompi,ompi-nosc,mpich")]
    libs: Vec<String>,
    /// The OFI comparison (issue 57): tmpi over libfabric's `tcp` provider (tmpi-ofi), tmpi
    /// over its own TCP fabric (tmpi-tcp) and Open MPI's `mtl ofi` over the same provider
    /// (ompi-ofi), all on loopback; replaces --libs. tmpi's benchmarks must be built with
    /// the feature `ofi` (`cargo build --release -p tmpi-bench -p tmpi-launcher --features
    /// ofi --bins`).
    #[arg(long)]
    ofi: bool,
    /// Directory of tmpi's release binaries (default: this program's directory when it is a
    /// `release` directory, else `<root>/target/release`).
    #[arg(long)]
    bin_dir: Option<PathBuf>,
    /// The tmpi checkout [default: the one this program was built from, else the current
    /// directory].
    #[arg(long)]
    root: Option<PathBuf>,
    /// Time limit of one benchmark invocation, in seconds.
    #[arg(long, default_value_t = 900)]
    timeout: u64,
    /// Time limit, in seconds, of an invocation with more ranks than the machine has cores
    /// (the collectives at 4 ranks on 2 cores). MPICH's ch4 busy-polls without yielding
    /// there, so its collectives can run for many minutes; such a run is stopped at this
    /// limit and listed under failed runs, as the peer's figure rather than a missing one.
    #[arg(long, default_value_t = 60)]
    oversubscribed_timeout: u64,
    /// Cache-line one-way time (ns) above which the machine is called noisy.
    #[arg(long, default_value_t = 90.0)]
    cacheline_warn: f64,
    /// Copy bandwidth, as a fraction of the session's best, below which the host is called
    /// slow. The probe also streams 128 KiB messages through a two-copy ring between the two
    /// cores (`bench/c/cacheline.c`, 1 GiB per run); on a shared host that figure can halve
    /// for seconds while the cache-line time stays level, and every transfer from 32 KiB up
    /// halves with it. 0 turns this probe off.
    #[arg(long, default_value_t = 0.75)]
    copy_warn: f64,
    /// How many times an invocation that ran while the host was slow is run again. Around
    /// every invocation (all the segments of one benchmark for one configuration) a short
    /// probe reads the host's state; when the cache-line time is above `--cacheline-warn` or
    /// the copy bandwidth below `--copy-warn` before or after it, its samples are thrown away
    /// and it runs again, after waiting up to `--settle` seconds for the host to turn quiet.
    /// After the last retry the samples are kept and the report lists them. 0 turns the
    /// probes around invocations off.
    #[arg(long, default_value_t = 2)]
    retries: usize,
    /// Longest wait, in seconds, for the host to turn quiet before an invocation (probing
    /// every 2 s); the invocation then runs anyway.
    #[arg(long, default_value_t = 60)]
    settle: u64,
    /// Run every benchmark process at normal priority. By default each runs in a session of
    /// its own at autogroup nice -20 and nice -20 where permitted (root), so other work on a
    /// shared host stays off the cores during a run (it still shares the caches); every
    /// configuration is treated the same, and the report says which priority took effect.
    #[arg(long)]
    normal_priority: bool,
}

/// Parses `1048576`, `64K`, `64M`, `1G` (also `KiB`/`MiB`/`GiB`, binary units).
fn parse_size(s: &str) -> Result<usize, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, suffix) = t.split_at(split);
    let mult: usize = match suffix.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" => 1 << 10,
        "m" | "mib" => 1 << 20,
        "g" | "gib" => 1 << 30,
        _ => return Err(format!("{s:?}: unknown size suffix (use K, M or G)")),
    };
    let n: usize = num.parse().map_err(|_| format!("{s:?} is not a size in bytes"))?;
    let v =
        n.checked_mul(mult).filter(|&v| (1..=1 << 30).contains(&v)).ok_or_else(|| format!("{s:?}: size must be between 1 B and 1 GiB"))?;
    Ok(v)
}

/// Rotates `libs` left by `k` (so no configuration always runs first or last).
fn rotated(libs: &[Lib], k: usize) -> Vec<Lib> {
    let mut v = libs.to_vec();
    if !v.is_empty() {
        let k = k % v.len();
        v.rotate_left(k);
    }
    v
}

/// Finds the checkout: `--root`, else the one this program was built from, else `.`.
fn find_root(cli_root: Option<&Path>) -> Result<PathBuf, Error> {
    let ok = |p: &Path| p.join("bench/c/lat.c").is_file();
    if let Some(r) = cli_root {
        return if ok(r) {
            Ok(r.to_path_buf())
        } else {
            Err(Error::Usage(format!("{} is not a tmpi checkout (no bench/c/lat.c)", r.display())))
        };
    }
    let built = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    for cand in [built, PathBuf::from(".")] {
        if ok(&cand) {
            return cand.canonicalize().map_err(|e| Error::io(format!("resolving {}", cand.display()), e));
        }
    }
    Err(Error::Usage("cannot find the tmpi checkout; run from its root or pass --root".into()))
}

/// tmpi's release directory: `--bin-dir`, else this program's own when it is `release`,
/// else `<root>/target/release`.
fn find_bin_dir(cli: Option<&Path>, root: &Path) -> PathBuf {
    if let Some(d) = cli {
        return d.to_path_buf();
    }
    if let Some(dir) = std::env::current_exe().ok().and_then(|e| e.parent().map(Path::to_path_buf)) {
        if dir.file_name().is_some_and(|n| n == "release") {
            return dir;
        }
    }
    root.join("target/release")
}

/// Checks that tmpi's binaries `names` exist in `bin_dir`.
fn require_tmpi(bin_dir: &Path, names: &[&str]) -> Result<(), Error> {
    for n in names {
        let p = bin_dir.join(n);
        if !p.is_file() {
            return Err(Error::Missing { path: p, hint: "build tmpi first: cargo build --release --workspace --bins".into() });
        }
    }
    Ok(())
}

/// MiB per run of the copy-bandwidth probe (5 runs; about 0.1 s on a quiet host).
const PIPE_MIB: u64 = 1024;

/// One reading of the host probe: the cache line's (median, best) ns per one-way transfer,
/// and, when asked for, the copy pipeline's (median, best) GB/s.
#[derive(Debug, Clone, Copy)]
struct HostFigure {
    line: (f64, f64),
    pipe: Option<(f64, f64)>,
}

/// Runs the host probe once, with the copy-bandwidth part when `pipe` is set.
fn probe_host(probe: &Path, rounds: u64, pipe: bool) -> Result<HostFigure, Error> {
    let mut argv = vec![probe.display().to_string(), rounds.to_string()];
    if pipe {
        argv.push(PIPE_MIB.to_string());
    }
    let out = run(&argv, Duration::from_secs(300)).and_then(|o| o.check("cacheline"))?;
    Ok(HostFigure { line: parse::parse_cacheline(&out.stdout)?, pipe: if pipe { Some(parse::parse_pipe(&out.stdout)?) } else { None } })
}

/// Runs the host probe once; prints and returns its figures.
fn host_figure(probe: Option<&Path>, rounds: u64, pipe: bool, when: &str) -> Option<HostFigure> {
    match probe_host(probe?, rounds, pipe) {
        Ok(f) => {
            let (m, b) = f.line;
            println!("cache-line ping-pong {when}: {m:.1} ns one way (median), best {b:.1} ns");
            if let Some((m, b)) = f.pipe {
                println!("pipe copy {when}: {m:.1} GB/s (median), best {b:.1} GB/s");
            }
            Some(f)
        }
        Err(e) => {
            eprintln!("tmpi-compare: host probe failed: {e}");
            None
        }
    }
}

/// The program `lib` runs for `bench`.
fn bench_prog(paths: &Paths, lib: Lib, bench: Bench) -> PathBuf {
    match lib.peer() {
        None => paths.bin_dir.join(bench.tmpi_bin()),
        Some(p) => paths.peer_bench(p, bench),
    }
}

/// The arguments `lib`'s program gets for one segment of `bench`.
fn bench_args(lib: Lib, bench: Bench, seg: &Segment) -> Vec<String> {
    let mut a: Vec<String> = if lib.peer().is_some() { bench.peer_prefix().iter().map(|s| s.to_string()).collect() } else { Vec::new() };
    a.extend(seg.args());
    a.extend(bench.extra_args());
    if lib == Lib::TmpiShared {
        a.extend(["-d".to_string(), "shared".to_string()]);
    }
    a
}

/// Runs one segment of one benchmark under one configuration; returns (key, value) rows (the
/// key is the size, the rank count or the depth: see [`Bench`]).
fn run_segment(paths: &Paths, lib: Lib, bench: Bench, seg: &Segment, timeout: Duration) -> Result<Vec<(usize, f64)>, Error> {
    let argv = command_line(lib, seg.np, &paths.bin_dir, &bench_prog(paths, lib, bench), &bench_args(lib, bench, seg));
    let out = run(&argv, timeout)?.check(&argv.join(" "))?;
    match bench.rows() {
        Rows::Sizes => parse::pick(&parse::parse_osu(&out.stdout)?, &seg.sizes(), bench.column()),
        Rows::Single => Ok(vec![(seg.np, parse::parse_single(&out.stdout)?)]),
        Rows::Depths => parse::pick(&parse::parse_osu(&out.stdout)?, &DEPTHS, bench.column()),
    }
}

/// The benchmarks named by `--benches`, in [`Bench::ALL`] order.
fn selected_benches(names: &[String]) -> Result<Vec<Bench>, Error> {
    let mut v = Vec::new();
    for n in names {
        let n = n.trim();
        let (_, group) = GROUPS.iter().find(|g| g.0 == n).ok_or_else(|| {
            let known: Vec<&str> = GROUPS.iter().map(|g| g.0).collect();
            Error::Usage(format!("unknown benchmark {n:?} (use {})", known.join(", ")))
        })?;
        v.extend_from_slice(group);
    }
    Ok(Bench::ALL.into_iter().filter(|b| v.contains(b)).collect())
}

/// Time limits of one benchmark invocation.
struct Limits {
    normal: Duration,
    /// When ranks outnumber `cores` (0: unknown, never applies).
    oversubscribed: Duration,
    cores: usize,
}

impl Limits {
    /// The limit of an invocation with `np` ranks.
    fn for_ranks(&self, np: usize) -> Duration {
        if self.cores > 0 && np > self.cores {
            self.oversubscribed
        } else {
            self.normal
        }
    }
}

/// One reading of the guard's probe: the medians of the cache-line time (ns) and of the copy
/// bandwidth (GB/s, when that probe is on).
#[derive(Debug, Clone, Copy, PartialEq)]
struct Reading {
    ns: f64,
    gbs: Option<f64>,
}

/// When the host counts as slow: the cache-line time above `warn_ns`, or the copy bandwidth
/// below `copy_warn` times the best seen this session (the session's quiet figure).
#[derive(Debug, Clone, Copy)]
struct SlowRule {
    warn_ns: f64,
    copy_warn: f64,
}

impl SlowRule {
    fn slow(&self, r: &Reading, best_gbs: f64) -> bool {
        r.ns > self.warn_ns || r.gbs.is_some_and(|g| g < self.copy_warn * best_gbs)
    }

    /// Whether an invocation kept as quiet (`listed`: kept as slow, and listed so, after its
    /// retries) reads slow against the session's final best, and so runs again at the end.
    fn slow_in_hindsight(&self, listed: bool, readings: &[Option<Reading>], best_gbs: f64) -> bool {
        !listed && readings.iter().flatten().any(|r| self.slow(r, best_gbs))
    }
}

/// The host-state checks around each invocation (see `--retries`).
struct Guard<'a> {
    probe: &'a Path,
    /// Round trips of one probe run (the probe makes 5 runs).
    rounds: u64,
    rule: SlowRule,
    retries: usize,
    settle: Duration,
    /// The best copy-bandwidth median so far (0 until one is read; with the copy probe off it
    /// stays 0 and never calls anything slow).
    best_gbs: std::cell::Cell<f64>,
}

impl Guard<'_> {
    /// One reading, `None` when the probe failed (then nothing is called slow).
    fn read(&self) -> Option<Reading> {
        let f = probe_host(self.probe, self.rounds, self.rule.copy_warn > 0.0).ok()?;
        let r = Reading { ns: f.line.0, gbs: f.pipe.map(|p| p.0) };
        if let Some(g) = r.gbs {
            self.best_gbs.set(self.best_gbs.get().max(g));
        }
        Some(r)
    }

    /// Whether `r` reads slow against the session's best so far.
    fn slow(&self, r: &Reading) -> bool {
        self.rule.slow(r, self.best_gbs.get())
    }

    /// Waits up to `settle` for a quiet reading; returns the last one.
    fn settle(&self) -> Option<Reading> {
        let t0 = Instant::now();
        loop {
            let r = self.read();
            if r.is_none_or(|r| !self.slow(&r)) || t0.elapsed() >= self.settle {
                return r;
            }
            std::thread::sleep(Duration::from_secs(2).min(self.settle.saturating_sub(t0.elapsed())));
        }
    }
}

/// The two probe readings around an invocation, for the log and the report.
fn slow_label(before: Option<Reading>, after: Option<Reading>) -> String {
    let f = |v: Option<Reading>| match v {
        None => "–".to_string(),
        Some(Reading { ns, gbs: None }) => format!("{ns:.0} ns"),
        Some(Reading { ns, gbs: Some(g) }) => format!("{ns:.0} ns / {g:.1} GB/s"),
    };
    format!("probe {} before, {} after", f(before), f(after))
}

/// What one invocation (every segment of `bench` under `lib`) measured: its rows, its
/// failures (one line each) and the headline figure for the log.
struct Invocation {
    rows: Vec<(usize, f64)>,
    failed: Vec<String>,
    headline: String,
}

fn run_invocation(paths: &Paths, lib: Lib, bench: Bench, segs: &[Segment], limits: &Limits, rep: usize) -> Invocation {
    let mut inv = Invocation { rows: Vec::new(), failed: Vec::new(), headline: String::new() };
    for seg in segs {
        match run_segment(paths, lib, bench, seg, limits.for_ranks(seg.np)) {
            Ok(rows) => {
                let first = if bench.rows() == Rows::Sizes { rows.iter().find(|r| r.0 >= 8) } else { rows.first() };
                if let Some(&(key, v)) = first.filter(|_| inv.headline.is_empty()) {
                    inv.headline = format!("{} {}", bench.row_label(key), report::value_label(bench, v));
                }
                inv.rows.extend(rows);
            }
            Err(e) => inv.failed.push(format!("rep {} {} {} sizes {}..{}: {e}", rep + 1, bench, lib, seg.min, seg.max)),
        }
    }
    inv
}

/// One invocation as kept: its rows and the probe readings around it.
struct Kept {
    rep: usize,
    bench: Bench,
    lib: Lib,
    readings: [Option<Reading>; 2],
    /// Whether the readings were slow when it was kept (then it is listed already).
    slow: bool,
    rows: Vec<(usize, f64)>,
}

/// Runs one invocation until the probe around it reads the host quiet, at most `retries`
/// times again; returns what it kept.
#[allow(clippy::too_many_arguments)]
fn run_guarded(
    paths: &Paths,
    lib: Lib,
    bench: Bench,
    segs: &[Segment],
    limits: &Limits,
    (rep, reps): (usize, usize),
    guard: Option<&Guard<'_>>,
    host: &mut HostChecks,
    failures: &mut Vec<String>,
) -> Kept {
    let retries = guard.map_or(0, |g| g.retries);
    let mut attempt = 0;
    loop {
        let t0 = Instant::now();
        let before = guard.and_then(Guard::settle);
        let inv = run_invocation(paths, lib, bench, segs, limits, rep);
        let after = guard.and_then(Guard::read);
        let slow = guard.is_some_and(|g| [before, after].iter().flatten().any(|r| g.slow(r)));
        println!(
            "[rep {}/{reps}] {:<8} {:<10} {:>6.1} s   {} {}{}",
            rep + 1,
            bench.key(),
            lib.key(),
            t0.elapsed().as_secs_f64(),
            inv.headline,
            bench.unit(),
            if slow { format!("   (host slow: {})", slow_label(before, after)) } else { String::new() }
        );
        // A failed invocation (most often one stopped at its time limit) is not run again:
        // its failure is the result, and running it again only repeats the wait.
        if slow && inv.failed.is_empty() && attempt < retries {
            host.redone += 1;
            attempt += 1;
            continue;
        }
        if slow {
            host.kept_slow.push(format!("rep {} {} {} ({})", rep + 1, bench, lib, slow_label(before, after)));
        }
        for msg in inv.failed {
            eprintln!("tmpi-compare: FAILED {msg}");
            failures.push(msg);
        }
        return Kept { rep, bench, lib, readings: [before, after], slow, rows: inv.rows };
    }
}

/// The point-to-point comparison: `reps` rounds, each running every benchmark under every
/// configuration (rotated order), each invocation checked by `guard` and run again while the
/// host was slow around it. The copy-bandwidth rule compares with the best reading so far,
/// which the first invocations may not have seen yet (a run that starts in a slow spell): at
/// the end, invocations whose readings fall below the rule against the session's best run
/// again too. Failures are collected, not fatal. Returns every sample, the samples of the
/// invocations kept as quiet only, and the checks.
fn run_benches(
    paths: &Paths,
    libs: &[Lib],
    plan: &[(Bench, Vec<Segment>)],
    reps: usize,
    limits: &Limits,
    guard: Option<&Guard<'_>>,
    failures: &mut Vec<String>,
) -> (Samples, Samples, HostChecks) {
    let mut host = HostChecks { on: guard.is_some(), ..HostChecks::default() };
    let mut kept = Vec::new();
    for rep in 0..reps {
        for (bench, segs) in plan {
            for lib in rotated(libs, rep).into_iter().filter(|l| l.runs(*bench)) {
                kept.push(run_guarded(paths, lib, *bench, segs, limits, (rep, reps), guard, &mut host, failures));
            }
        }
    }
    if let Some(g) = guard {
        let best = g.best_gbs.get();
        for k in kept.iter_mut().filter(|k| g.rule.slow_in_hindsight(k.slow, &k.readings, best)) {
            println!(
                "again: rep {} {} {} ({}, the session's best is {:.1} GB/s)",
                k.rep + 1,
                k.bench,
                k.lib,
                slow_label(k.readings[0], k.readings[1]),
                best
            );
            host.redone += 1;
            let segs = plan.iter().find(|p| p.0 == k.bench).map_or(&[][..], |p| &p.1[..]);
            *k = run_guarded(paths, k.lib, k.bench, segs, limits, (k.rep, reps), guard, &mut host, failures);
        }
    }
    let (mut samples, mut quiet) = (Samples::default(), Samples::default());
    for k in kept {
        for (size, v) in k.rows {
            samples.add(k.bench, k.lib, size, v);
            if !k.slow {
                quiet.add(k.bench, k.lib, size, v);
            }
        }
    }
    (samples, quiet, host)
}

/// The launch comparison: wall time of `hello` on each rank count under tmpirun and each
/// available peer launcher, interleaved, after one untimed warm-up each.
fn run_launch(paths: &Paths, libs: &[Lib], ranks: &[usize], reps: usize, failures: &mut Vec<String>) -> Launch {
    let libs: Vec<Lib> = libs.iter().copied().filter(|&l| l != Lib::OmpiNoCma && l != Lib::TmpiShared).collect();
    let mut launch = Launch { ranks: ranks.to_vec(), reps, times: BTreeMap::new() };
    for &n in ranks {
        for rep in 0..=reps {
            for lib in rotated(&libs, rep) {
                let prog = match lib.peer() {
                    None => paths.bin_dir.join("hello"),
                    Some(p) => paths.peer_bin(p, "hello"),
                };
                let argv = command_line(lib, n, &paths.bin_dir, &prog, &[]);
                let r = run(&argv, Duration::from_secs(120)).and_then(|o| o.check(&argv.join(" "))).and_then(|o| {
                    let hellos = o.stdout.lines().filter(|l| l.starts_with("Hello from rank")).count();
                    if hellos == n {
                        Ok(o.elapsed)
                    } else {
                        Err(Error::Run(format!("{}: {hellos} hello lines, expected {n}", argv.join(" "))))
                    }
                });
                match r {
                    Ok(t) if rep > 0 => launch.times.entry((lib, n)).or_default().push(t.as_secs_f64() * 1e3),
                    Ok(_) => {}
                    Err(e) => {
                        let msg = format!("launch {lib} -n {n}: {e}");
                        eprintln!("tmpi-compare: FAILED {msg}");
                        failures.push(msg);
                    }
                }
            }
        }
        let meds: Vec<String> = libs
            .iter()
            .map(|&l| {
                let m = launch.times.get(&(l, n)).and_then(|v| stats::median(v));
                format!("{} {}", l.key(), m.map_or("–".into(), |m| format!("{m:.1} ms")))
            })
            .collect();
        println!("[launch] -n {n:<3} {}", meds.join(", "));
    }
    launch
}

fn write(path: &Path, text: &str) -> Result<(), Error> {
    std::fs::write(path, text).map_err(|e| Error::io(format!("writing {}", path.display()), e))
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match real_main(&cli) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("tmpi-compare: {e}");
            ExitCode::from(2)
        }
    }
}

/// What the command line asks for, checked.
struct Wanted {
    reps: usize,
    launch_reps: usize,
    max_size: usize,
    benches: Vec<Bench>,
    /// The configurations, in order, each once.
    libs: Vec<Lib>,
}

/// Checks the command line's options and turns them into [`Wanted`].
fn wanted(cli: &Cli) -> Result<Wanted, Error> {
    let reps = cli.reps.unwrap_or(if cli.quick { 1 } else { 5 });
    let launch_reps = cli.launch_reps.unwrap_or(if cli.quick { 3 } else { 10 });
    if !(0.0..=1.0).contains(&cli.copy_warn) {
        return Err(Error::Usage("--copy-warn must be between 0 and 1".into()));
    }
    if reps == 0 || launch_reps == 0 {
        return Err(Error::Usage("--reps and --launch-reps must be at least 1".into()));
    }
    if cli.no_bench && !cli.launch {
        return Err(Error::Usage("--no-bench without --launch leaves nothing to do".into()));
    }
    if cli.launch_ranks.iter().any(|&n| n == 0 || n > 256) {
        return Err(Error::Usage("--launch-ranks must be between 1 and 256".into()));
    }
    let max_size = cli.max_size.unwrap_or(if cli.quick { 1 << 20 } else { 64 << 20 });
    let benches = if cli.no_bench { Vec::new() } else { selected_benches(&cli.benches)? };
    Ok(Wanted { reps, launch_reps, max_size, benches, libs: wanted_libs(cli)? })
}

/// The configurations `--libs` (or `--ofi`) names, in order, each once.
fn wanted_libs(cli: &Cli) -> Result<Vec<Lib>, Error> {
    let mut wanted = Vec::new();
    let keys: Vec<String> = if cli.ofi { OFI_LIBS.iter().map(|l| l.key().to_string()).collect() } else { cli.libs.clone() };
    for k in &keys {
        let lib = Lib::from_key(k.trim()).ok_or_else(|| {
            let known: Vec<&str> = Lib::ALL.iter().map(|l| l.key()).collect();
            Error::Usage(format!("unknown configuration {k:?} (use {})", known.join(", ")))
        })?;
        if !wanted.contains(&lib) {
            wanted.push(lib);
        }
    }
    wanted.sort();
    Ok(wanted)
}

/// The checkout, tmpi's binaries (checked to be built when a tmpi configuration runs), the
/// peers' build directory, and the output directory.
fn locate(cli: &Cli, w: &Wanted) -> Result<(Paths, PathBuf), Error> {
    let root = find_root(cli.root.as_deref())?;
    let bin_dir = find_bin_dir(cli.bin_dir.as_deref(), &root);
    if bin_dir.file_name().is_some_and(|n| n != "release") {
        eprintln!("tmpi-compare: warning: {} is not a release directory; debug builds are slow", bin_dir.display());
    }
    let target = bin_dir.parent().map_or_else(|| root.join("target"), Path::to_path_buf);
    let out_dir = cli.out.clone().unwrap_or_else(|| if cli.quick { root.join("target/compare-quick") } else { root.join("bench/results") });
    if w.libs.iter().any(|l| l.is_tmpi()) {
        let mut need = vec!["tmpirun"];
        need.extend(w.benches.iter().map(|b| b.tmpi_bin()));
        if cli.launch {
            need.push("hello");
        }
        require_tmpi(&bin_dir, &need)?;
    }
    Ok((Paths { root, bin_dir, peers_dir: target.join("peers") }, out_dir))
}

/// Builds the peers the wanted configurations need: the configurations that can run (sorted)
/// and the skipped ones, each with why; the peers' versions go into `machine`.
fn build_peers(paths: &Paths, wanted: &[Lib], machine: &mut Machine) -> (Vec<Lib>, Vec<String>) {
    let mut libs = Vec::new();
    let mut skipped = Vec::new();
    for lib in wanted {
        if lib.peer().is_none() {
            libs.push(*lib);
        }
    }
    for peer in Peer::ALL {
        let users: Vec<Lib> = wanted.iter().copied().filter(|l| l.peer() == Some(peer)).collect();
        if users.is_empty() {
            continue;
        }
        match build_peer(paths, peer) {
            Ok(()) => {
                println!("{}: built into {}", peer.label(), paths.peers_dir.join(peer.suffix()).display());
                libs.extend(users);
                let v = match peer {
                    Peer::OpenMpi => first_line(&["mpirun.openmpi", "--version"]),
                    Peer::Mpich => first_line(&["mpichversion"]).or_else(|| first_line(&["mpirun.mpich", "--version"])),
                };
                if let Some(v) = v {
                    let v = v.split_whitespace().collect::<Vec<_>>().join(" ");
                    machine.versions.push(format!("{}: {v}", peer.label()));
                }
            }
            Err(e) => {
                let msg = format!("{}: {e}", peer.label());
                eprintln!("tmpi-compare: skipping {msg}");
                skipped.push(msg);
            }
        }
    }
    libs.sort();
    (libs, skipped)
}

/// The cache-line probe's program (if it builds), its figure before the runs, and the
/// host's figures for the report.
fn first_probe(cli: &Cli, paths: &Paths) -> (Option<PathBuf>, Option<HostFigure>, Cacheline) {
    let probe = match build_cacheline(paths) {
        Ok(p) => Some(p),
        Err(e) => {
            eprintln!("tmpi-compare: no cache-line figure: {e}");
            None
        }
    };
    let first = host_figure(probe.as_deref(), probe_rounds(cli), cli.copy_warn > 0.0, "before");
    let cl = Cacheline {
        before: first.map(|f| f.line),
        pipe_before: first.and_then(|f| f.pipe),
        warn_ns: cli.cacheline_warn,
        copy_warn: cli.copy_warn,
        ..Cacheline::default()
    };
    (probe, first, cl)
}

/// Round trips of the probe before and after the runs.
fn probe_rounds(cli: &Cli) -> u64 {
    if cli.quick {
        100_000
    } else {
        300_000
    }
}

/// Writes `raw.csv` and the latency and bandwidth plots; returns the plots (caption, file)
/// and adds a failed plot to `failures`.
fn write_data(
    out_dir: &Path,
    libs: &[Lib],
    samples: &Samples,
    reps: usize,
    failures: &mut Vec<String>,
) -> Result<Vec<(String, String)>, Error> {
    let mut plots = Vec::new();
    if samples.is_empty() {
        return Ok(plots);
    }
    write(&out_dir.join("raw.csv"), &csv(samples))?;
    for (bench, stem, y, legend) in [
        (Bench::Latency, "latency", "latency (µs)", Legend::LowerRight),
        (Bench::Bw, "bw", "bandwidth (MB/s)", Legend::UpperLeft),
        (Bench::Bibw, "bibw", "bidirectional bandwidth (MB/s)", Legend::UpperLeft),
    ] {
        let series: Vec<Series> = libs
            .iter()
            .map(|&l| Series { label: l.label().to_string(), points: samples.curve(bench, l) })
            .filter(|s| !s.points.is_empty())
            .collect();
        if series.is_empty() {
            continue;
        }
        let title = format!("{}, 2 ranks, median of {reps}", bench.title());
        match plot(&out_dir.join(stem), &title, y, &series, legend) {
            Ok(()) => plots.push((bench.title().to_string(), format!("{stem}.svg"))),
            Err(e) => {
                eprintln!("tmpi-compare: {e}");
                failures.push(format!("plot {stem}: {e}"));
            }
        }
    }
    Ok(plots)
}

/// The time limits of one invocation.
fn limits(cli: &Cli, cores: usize) -> Limits {
    Limits {
        normal: Duration::from_secs(cli.timeout.max(1)),
        oversubscribed: Duration::from_secs(cli.oversubscribed_timeout.clamp(1, cli.timeout.max(1))),
        cores,
    }
}

/// The probes around every invocation, with `probe`'s program; `first` is the figure before
/// the runs (the session's best copy bandwidth so far).
fn guard<'a>(cli: &Cli, probe: &'a Path, first: Option<HostFigure>) -> Guard<'a> {
    Guard {
        probe,
        rounds: if cli.quick { 20_000 } else { 50_000 },
        rule: SlowRule { warn_ns: cli.cacheline_warn, copy_warn: cli.copy_warn },
        retries: cli.retries,
        settle: Duration::from_secs(cli.settle),
        best_gbs: std::cell::Cell::new(first.and_then(|f| f.pipe).map_or(0.0, |p| p.0)),
    }
}

/// The host's figures after the runs, into `cl` (with `best`, the session's best copy
/// bandwidth); warns when the host turned slow and nothing guarded the runs.
fn last_probe(cli: &Cli, probe: Option<&Path>, cl: &mut Cacheline, best: Option<f64>, guarded: bool) {
    let warned = cl.warning().is_some();
    let last = host_figure(probe, probe_rounds(cli), cli.copy_warn > 0.0, "after");
    cl.after = last.map(|f| f.line);
    cl.pipe_after = last.and_then(|f| f.pipe);
    cl.pipe_best = best;
    if let Some(w) = cl.warning().filter(|_| !warned && !guarded) {
        eprintln!("tmpi-compare: WARNING: {w}");
    }
}

/// Writes the report to `path` and prints it.
fn write_report(path: &Path, md: &str) -> Result<(), Error> {
    write(path, md)?;
    println!("\n{md}");
    println!("tmpi-compare: wrote {}", path.display());
    Ok(())
}

/// The machine's description (this run's priority, the peers' versions, tmpi's commit), the
/// configurations that can run and those skipped with the reason; an error when none can.
fn prepare(cli: &Cli, paths: &Paths, w: &Wanted) -> Result<(Machine, Vec<Lib>, Vec<String>), Error> {
    let mut machine = Machine::probe();
    if !cli.normal_priority {
        machine.priority = run::set_priority();
    }
    let (libs, skipped) = build_peers(paths, &w.libs, &mut machine);
    if let Some(rev) = first_line(&["git", "-C", &paths.root.display().to_string(), "rev-parse", "--short", "HEAD"]) {
        if rev.chars().all(|c| c.is_ascii_hexdigit()) {
            machine.versions.push(format!("tmpi: commit {rev}"));
        }
    }
    if libs.is_empty() {
        return Err(Error::Usage("no configuration can run".into()));
    }
    Ok((machine, libs, skipped))
}

/// Runs the comparison; `Ok(false)` when some run failed (the report is written anyway).
fn real_main(cli: &Cli) -> Result<bool, Error> {
    let w = wanted(cli)?;
    let (paths, out_dir) = locate(cli, &w)?;

    // 1. Peers: build what can be built, skip the rest with instructions.
    let (mut machine, libs, skipped) = prepare(cli, &paths, &w)?;

    // 2. The host figures, just before the runs.
    let (probe, first, mut cl) = first_probe(cli, &paths);
    // With probes around every invocation (below), a slow host only delays the runs.
    let guarded = probe.is_some() && cli.retries > 0;
    if let Some(w) = cl.warning().filter(|_| !guarded) {
        eprintln!("tmpi-compare: WARNING: {w}");
    }

    // 3. The runs, interleaved.
    let limits = limits(cli, machine.cores);
    let mut failures = Vec::new();
    let plan: Vec<(Bench, Vec<Segment>)> = w.benches.iter().map(|&b| (b, segments(b, w.max_size, cli.quick))).collect();
    let guard = probe.as_deref().filter(|_| guarded).map(|p| guard(cli, p, first));
    let (samples, quiet, host) = run_benches(&paths, &libs, &plan, w.reps, &limits, guard.as_ref(), &mut failures);
    let launch = cli.launch.then(|| run_launch(&paths, &libs, &cli.launch_ranks, w.launch_reps, &mut failures));
    let best = guard.as_ref().map(|g| g.best_gbs.get()).filter(|&b| b > 0.0);
    last_probe(cli, probe.as_deref(), &mut cl, best, guarded);
    if !host.kept_slow.is_empty() {
        eprintln!("tmpi-compare: WARNING: {} invocation(s) kept from a slow host (see the report)", host.kept_slow.len());
    }
    machine.load_after = load_average();

    // 4. Report, data and plots.
    std::fs::create_dir_all(&out_dir).map_err(|e| Error::io(format!("creating {}", out_dir.display()), e))?;
    let plots = write_data(&out_dir, &libs, &samples, w.reps, &mut failures)?;
    let rep = Report {
        machine: &machine,
        cacheline: cl,
        host,
        libs: libs.clone(),
        skipped,
        reps: w.reps,
        quick: cli.quick,
        segments: plan,
        samples: &samples,
        quiet: Some(&quiet),
        failures: failures.clone(),
        launch: launch.as_ref(),
        plots,
    };
    write_report(&out_dir.join(if cli.no_bench { "launch.md" } else { "compare.md" }), &rep.markdown())?;
    if !failures.is_empty() {
        eprintln!("tmpi-compare: {} run(s) failed; see the report", failures.len());
    }
    Ok(failures.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn oversubscribed_runs_get_their_own_limit() {
        let l = Limits { normal: Duration::from_secs(900), oversubscribed: Duration::from_secs(60), cores: 2 };
        assert_eq!(l.for_ranks(2), Duration::from_secs(900));
        assert_eq!(l.for_ranks(4), Duration::from_secs(60));
        // An unknown core count never shortens a run.
        let l = Limits { cores: 0, ..l };
        assert_eq!(l.for_ranks(64), Duration::from_secs(900));
    }

    #[test]
    fn the_host_is_slow_by_cache_line_or_by_copy_bandwidth() {
        let rule = SlowRule { warn_ns: 90.0, copy_warn: 0.75 };
        let quiet = Reading { ns: 40.0, gbs: Some(50.0) };
        assert!(!rule.slow(&quiet, 52.0));
        // A bandwidth spell: the cache line is level, the copies run at half speed.
        assert!(rule.slow(&Reading { ns: 40.0, gbs: Some(25.0) }, 52.0));
        assert!(rule.slow(&Reading { ns: 200.0, gbs: Some(50.0) }, 52.0));
        // No copy figure (probe off) or no best yet: only the cache line counts.
        assert!(!rule.slow(&Reading { ns: 40.0, gbs: None }, 52.0));
        assert!(!rule.slow(&Reading { ns: 40.0, gbs: Some(1.0) }, 0.0));
        let off = SlowRule { copy_warn: 0.0, ..rule };
        assert!(!off.slow(&Reading { ns: 40.0, gbs: Some(1.0) }, 52.0));
        // Judged again at the end: a run kept in a spell before the first quiet reading
        // (best 30 then) reads slow against the final best; a listed one is not run again.
        let early = [Some(Reading { ns: 40.0, gbs: Some(18.0) }), Some(quiet)];
        assert!(!rule.slow_in_hindsight(false, &early, 20.0));
        assert!(rule.slow_in_hindsight(false, &early, 52.0));
        assert!(!rule.slow_in_hindsight(true, &early, 52.0));
        assert!(!rule.slow_in_hindsight(false, &[Some(quiet), None], 52.0));
        assert_eq!(slow_label(Some(quiet), None), "probe 40 ns / 50.0 GB/s before, – after");
        assert_eq!(slow_label(None, Some(Reading { ns: 210.0, gbs: None })), "probe – before, 210 ns after");
    }

    #[test]
    fn sizes_parse_with_binary_suffixes() {
        assert_eq!(parse_size("1048576"), Ok(1 << 20));
        assert_eq!(parse_size("64M"), Ok(64 << 20));
        assert_eq!(parse_size("64MiB"), Ok(64 << 20));
        assert_eq!(parse_size("4k"), Ok(4096));
        assert_eq!(parse_size("1G"), Ok(1 << 30));
        for bad in ["", "0", "2G", "x", "12Q", "-1"] {
            assert!(parse_size(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn rotation_changes_who_runs_first() {
        let l = [Lib::Tmpi, Lib::Ompi, Lib::Mpich];
        assert_eq!(rotated(&l, 0), l.to_vec());
        assert_eq!(rotated(&l, 1), vec![Lib::Ompi, Lib::Mpich, Lib::Tmpi]);
        assert_eq!(rotated(&l, 3), l.to_vec());
        assert_eq!(rotated(&[], 2), vec![]);
    }

    #[test]
    fn cli_parses() {
        let c = Cli::try_parse_from(["tmpi-compare", "--reps", "3", "--max-size", "4M", "--libs", "tmpi,mpich"]);
        let c = c.map_err(|e| e.to_string());
        assert!(matches!(&c, Ok(c) if c.reps == Some(3) && c.max_size == Some(4 << 20) && c.libs.len() == 2), "{c:?}");
        assert!(Cli::try_parse_from(["tmpi-compare", "--max-size", "0"]).is_err());
        let c = Cli::try_parse_from(["tmpi-compare", "--benches", "barrier,depth"]).map_err(|e| e.to_string());
        let b = c.map(|c| selected_benches(&c.benches).map_err(|e| e.to_string()));
        assert_eq!(b, Ok(Ok(vec![Bench::Barrier, Bench::DepthSpecific, Bench::DepthAny, Bench::DepthUnexpected])));
        assert!(selected_benches(&["bogus".to_string()]).is_err());
        let all = Cli::try_parse_from(["tmpi-compare"]).map(|c| selected_benches(&c.benches).map_err(|e| e.to_string()));
        assert_eq!(all.map_err(|e| e.to_string()), Ok(Ok(Bench::ALL.to_vec())));
    }

    #[test]
    fn peers_get_the_collective_name_first() {
        let seg = &segments(Bench::Allreduce4, 1 << 20, true)[0];
        assert_eq!(bench_args(Lib::Mpich, Bench::Allreduce4, seg).join(" "), "allreduce -m 8:8192 -i 100 -x 10");
        assert_eq!(bench_args(Lib::Tmpi, Bench::Allreduce4, seg).join(" "), "-m 8:8192 -i 100 -x 10");
    }
}
