//! `collmodel`: the predicted time of each collective algorithm under a LogGP-style model, at
//! 2-65536 ranks on 1-4096 hosts, beside the algorithm the runtime picks
//! (`tmpi::coll::select`, the very functions the collectives call).
//!
//! The model: an algorithm is a list of rounds; a round costs the latency of its link, plus a
//! per-message overhead for each message beyond the first a rank handles in it, plus its bytes
//! times the link's time per byte, times the number of messages that leave one host at once
//! over the network in that round (they share the host's link), plus the reduction's time per
//! byte where it combines. Ranks sit on hosts in blocks of `ranks / hosts`; a partner at
//! distance `d` (ring, dissemination, Bruck, pairwise) is on another host for `min(d, q)` of a
//! host's `q` ranks, an XOR partner (recursive doubling and halving, binomial trees) for all of
//! them once `d >= q`. Node-aware plans are the flat ones on the ranks of a host (shared
//! memory) and on one rank per host (the network), as `runtime/src/coll/hier.rs` builds them.
//!
//! `collmodel [--sizes 8,65536,16777216] [--ranks 2,8,64,512,4096,65536]
//! [--hosts 1,4,64,4096] [--shm-lat US] [--shm-gbs GB/s] [--net-lat US] [--net-gbs GB/s]
//! [--reduce-gbs GB/s] [--check]`. `--check` compares the model with the measurements it
//! was fitted to and states the error.
//!
//! `tmpirun -n P collmodel --measure [--iters N]` measures `barrier`, `bcast`, `allreduce`,
//! `allgather` and `alltoall` on this machine at the sizes given by `--sizes` (alltoall: one
//! block of `size / P`) and prints each beside the model's time for the algorithm the runtime
//! picks, with the error. The hosts are the distinct values of `TMPI_NODE_ID` (the simulated
//! hosts of the test harness; unset: one host); they must hold equal blocks of ranks.

use std::error::Error;

use tmpi::coll::select::{self, Allgather, Allreduce, Alltoall, Bcast, Reduce, Shape};

/// One link: latency of a round (seconds, sender and receiver overheads included), extra
/// overhead per message beyond the first, time per byte.
#[derive(Debug, Clone, Copy)]
struct Link {
    lat: f64,
    o: f64,
    g: f64,
}

#[derive(Debug, Clone, Copy)]
struct Model {
    shm: Link,
    net: Link,
    /// Time per byte combined by a reduction.
    gamma: f64,
    /// Time per byte of a local copy.
    copy: f64,
}

/// The ranks an algorithm runs on: `p` ranks, `q` per host (`q == p`: one host).
#[derive(Debug, Clone, Copy)]
struct On {
    p: usize,
    q: usize,
}

/// One round: messages of `bytes`; `cross`: messages leaving one host at once; `fan`:
/// messages one rank handles; `reduce`: the received bytes are combined.
#[derive(Debug, Clone, Copy)]
struct Round {
    bytes: f64,
    cross: usize,
    fan: usize,
    reduce: bool,
}

impl On {
    fn shift(&self, d: usize) -> usize {
        if self.q >= self.p {
            0
        } else {
            d.min(self.q)
        }
    }
    fn xor(&self, d: usize) -> usize {
        if self.q >= self.p || d < self.q {
            0
        } else {
            self.q
        }
    }
    fn log2(&self) -> usize {
        self.p.next_power_of_two().trailing_zeros() as usize
    }
}

fn r(bytes: f64, cross: usize) -> Round {
    Round { bytes, cross, fan: 1, reduce: false }
}

impl Model {
    fn time(&self, rounds: &[Round]) -> f64 {
        rounds
            .iter()
            .map(|x| {
                let l = if x.cross > 0 { self.net } else { self.shm };
                let share = x.cross.max(1) as f64;
                let fan = x.fan.max(1) as f64;
                l.lat + (fan - 1.0) * l.o + fan * x.bytes * l.g * share + if x.reduce { fan * x.bytes * self.gamma } else { 0.0 }
            })
            .sum()
    }
}

// ---- flat algorithms ---------------------------------------------------------------------

fn dissemination(on: On) -> Vec<Round> {
    (0..on.log2()).map(|k| r(0.0, on.shift(1 << k))).collect()
}

fn binomial(on: On, m: f64, reduce: bool) -> Vec<Round> {
    (0..on.log2()).map(|k| Round { reduce, ..r(m, on.xor(1 << k)) }).collect()
}

/// The fold of a rank count that is not a power of two (one round each way).
fn fold(on: On, m: f64, reduce: bool) -> Vec<Round> {
    if on.p.is_power_of_two() {
        vec![]
    } else {
        vec![Round { reduce, ..r(m, on.shift(1)) }]
    }
}

fn halving(on: On, m: f64) -> Vec<Round> {
    let k = on.log2();
    (0..k).map(|i| Round { reduce: true, ..r(m / (2 << i) as f64, on.xor(on.p >> (i + 1))) }).collect()
}

fn doubling(on: On, m: f64) -> Vec<Round> {
    let k = on.log2();
    (0..k).rev().map(|i| r(m / (2 << i) as f64, on.xor(on.p >> (i + 1)))).collect()
}

fn ring(on: On, piece: f64, reduce: bool) -> Vec<Round> {
    (1..on.p).map(|_| Round { reduce, ..r(piece, on.shift(1)) }).collect()
}

fn bcast(on: On, m: f64, a: Bcast) -> Vec<Round> {
    match a {
        Bcast::ScatterAllgather => {
            let mut v: Vec<Round> = (0..on.log2()).map(|k| r(m / (2 << k) as f64, on.xor(on.p >> (k + 1)))).collect();
            v.extend(ring(on, m / on.p as f64, false));
            v
        }
        _ => binomial(on, m, false),
    }
}

fn reduce(on: On, m: f64, a: Reduce) -> Vec<Round> {
    match a {
        Reduce::Rabenseifner => {
            let mut v = fold(on, m, true);
            v.extend(halving(on, m));
            v.push(Round { fan: on.p - 1, ..r(m / on.p as f64, on.shift(on.p)) });
            v
        }
        _ => binomial(on, m, true),
    }
}

fn allreduce(on: On, m: f64, a: Allreduce) -> Vec<Round> {
    let mut v = Vec::new();
    match a {
        Allreduce::Ring => {
            v.extend(ring(on, m / on.p as f64, true));
            v.extend(ring(on, m / on.p as f64, false));
        }
        Allreduce::Rabenseifner => {
            v.extend(fold(on, m, true));
            v.extend(halving(on, m));
            v.extend(doubling(on, m));
            v.extend(fold(on, m, false));
        }
        Allreduce::ReduceBcast => {
            v.extend(binomial(on, m, true));
            v.extend(binomial(on, m, false));
        }
        _ => {
            v.extend(fold(on, m, true));
            v.extend(binomial(on, m, true));
            v.extend(fold(on, m, false));
        }
    }
    v
}

/// `m`: all ranks' blocks together.
fn allgather(on: On, m: f64, a: Allgather) -> Vec<Round> {
    let blk = m / on.p as f64;
    match a {
        Allgather::RecursiveDoubling => (0..on.log2()).map(|k| r(blk * (1 << k) as f64, on.xor(1 << k))).collect(),
        Allgather::Bruck => (0..on.log2()).map(|k| r(blk * (1usize << k).min(on.p - (1 << k)) as f64, on.shift(1 << k))).collect(),
        _ => ring(on, blk, false),
    }
}

/// `b`: one block.
fn alltoall(on: On, b: f64, a: Alltoall) -> Vec<Round> {
    match a {
        Alltoall::Bruck => (0..on.log2()).map(|k| r(b * (on.p / 2) as f64, on.shift(1 << k))).collect(),
        Alltoall::Linear => vec![Round { fan: on.p - 1, ..r(b, on.shift(on.p)) }],
        _ => (1..on.p).map(|k| r(b, on.shift(k))).collect(),
    }
}

// ---- what the runtime picks, and the node-aware plans ----------------------------------------

fn shape(p: usize, hosts: usize, bytes: usize) -> Shape {
    Shape { ranks: p, hosts, bytes, count: bytes / 8, commutative: true }
}

/// One collective call's placement and size, as the plans below need it.
struct Case {
    /// All ranks; the ranks of one host; one leader per host.
    on: On,
    local: On,
    heads: On,
    s: Shape,
    p: usize,
    h: usize,
    m: usize,
    mf: f64,
    /// Whether the runtime goes node-aware for this case.
    hier: bool,
}

impl Case {
    fn new(p: usize, h: usize, m: usize) -> Case {
        let s = shape(p, h, m);
        let hier = select::node_aware(&s, None);
        Case { on: On { p, q: p / h }, local: On { p: p / h, q: p / h }, heads: On { p: h, q: 1 }, s, p, h, m, mf: m as f64, hier }
    }

    /// Ranks per host.
    fn q(&self) -> usize {
        self.p / self.h
    }

    /// The shape of the call among the ranks of one host.
    fn local_shape(&self) -> Shape {
        shape(self.q(), 1, self.m)
    }

    /// The shape of the call among the hosts' leaders.
    fn heads_shape(&self) -> Shape {
        shape(self.h, self.h, self.m)
    }
}

/// Every algorithm of `coll` at `p` ranks on `h` hosts for `m` bytes (alltoall: one block),
/// named; the first entry is the runtime's own choice.
fn algorithms(coll: &str, p: usize, h: usize, m: usize, model: &Model) -> Vec<(String, f64)> {
    let c = Case::new(p, h, m);
    let v = match coll {
        "barrier" => barrier_plans(&c),
        "bcast" => bcast_plans(&c),
        "reduce" => reduce_plans(&c),
        "allreduce" => allreduce_plans(&c),
        "allgather" => allgather_plans(&c),
        "alltoall" => alltoall_plans(&c),
        _ => reduce_scatter_plans(&c),
    };
    // The node-aware alltoall also copies the whole exchange twice through its leaders.
    let copies = if coll == "alltoall" { 2.0 * c.q() as f64 * (p * m) as f64 * model.copy } else { 0.0 };
    v.into_iter()
        .map(|(n, x)| {
            let extra = if n.ends_with("node_aware") { copies } else { 0.0 };
            (n, model.time(&x) + extra)
        })
        .collect()
}

/// Barrier: dissemination among all, or gather to the host's leader, dissemination among
/// leaders, release.
fn barrier_plans(c: &Case) -> Vec<(String, Vec<Round>)> {
    let mut na = vec![Round { fan: c.local.p - 1, ..r(0.0, 0) }];
    na.extend(dissemination(c.heads));
    na.push(Round { fan: c.local.p - 1, ..r(0.0, 0) });
    let mut v = vec![("dissemination".to_string(), dissemination(c.on)), ("node_aware".to_string(), na)];
    mark(&mut v, if c.hier { "node_aware" } else { "dissemination" });
    v
}

fn bcast_plans(c: &Case) -> Vec<(String, Vec<Round>)> {
    let chosen = select::bcast(&c.s, None);
    let mut na = bcast(c.heads, c.mf, select::bcast(&c.heads_shape(), None));
    na.extend(bcast(c.local, c.mf, select::bcast(&c.local_shape(), None)));
    let mut v: Vec<_> = Bcast::ALL.iter().map(|a| (a.name().to_string(), bcast(c.on, c.mf, *a))).collect();
    v.push(("node_aware".into(), na));
    mark(&mut v, if c.hier { "node_aware" } else { chosen.name() });
    v
}

fn reduce_plans(c: &Case) -> Vec<(String, Vec<Round>)> {
    let chosen = select::reduce(&c.s, None);
    let mut na = reduce(c.local, c.mf, select::reduce(&c.local_shape(), None));
    na.extend(reduce(c.heads, c.mf, select::reduce(&c.heads_shape(), None)));
    let mut v: Vec<_> = Reduce::ALL.iter().map(|a| (a.name().to_string(), reduce(c.on, c.mf, *a))).collect();
    v.push(("node_aware".into(), na));
    mark(&mut v, if c.hier { "node_aware" } else { chosen.name() });
    v
}

fn allreduce_plans(c: &Case) -> Vec<(String, Vec<Round>)> {
    let chosen = select::allreduce(&c.s, None);
    let mut na = reduce(c.local, c.mf, select::reduce(&c.local_shape(), None));
    na.extend(allreduce(c.heads, c.mf, select::allreduce(&c.heads_shape(), None)));
    na.extend(bcast(c.local, c.mf, select::bcast(&c.local_shape(), None)));
    let mut v: Vec<_> = Allreduce::ALL.iter().map(|a| (a.name().to_string(), allreduce(c.on, c.mf, *a))).collect();
    v.push(("node_aware".into(), na));
    mark(&mut v, if c.hier { "node_aware" } else { chosen.name() });
    v
}

fn allgather_plans(c: &Case) -> Vec<(String, Vec<Round>)> {
    let chosen = select::allgather(&c.s, None);
    let mut na = vec![Round { fan: c.q().saturating_sub(1), ..r(c.mf / c.p as f64, 0) }];
    na.extend(allgather(c.heads, c.mf, select::allgather(&c.heads_shape(), None)));
    na.extend(bcast(c.local, c.mf, select::bcast(&c.local_shape(), None)));
    let mut v: Vec<_> = Allgather::ALL
        .iter()
        .filter(|a| **a != Allgather::RecursiveDoubling || c.p.is_power_of_two())
        .map(|a| (a.name().to_string(), allgather(c.on, c.mf, *a)))
        .collect();
    v.push(("node_aware".into(), na));
    mark(&mut v, if c.hier { "node_aware" } else { chosen.name() });
    v
}

/// Alltoall (`m`: one block); the node-aware plan's copies are added by [`algorithms`].
fn alltoall_plans(c: &Case) -> Vec<(String, Vec<Round>)> {
    let chosen = select::alltoall(&c.s, None);
    let q = c.q();
    let whole = (c.p * c.m) as f64;
    let mut na = vec![Round { fan: q.saturating_sub(1), ..r(whole, 0) }];
    na.extend((1..c.h).map(|_| r((q * q * c.m) as f64, 1)));
    na.push(Round { fan: q.saturating_sub(1), ..r(whole, 0) });
    let mut v: Vec<_> = Alltoall::ALL.iter().map(|a| (a.name().to_string(), alltoall(c.on, c.mf, *a))).collect();
    v.push(("node_aware".into(), na));
    let hier_a = select::alltoall_node_aware(&c.s, None);
    mark(&mut v, if hier_a { "node_aware" } else { chosen.name() });
    v
}

/// Reduce_scatter: reduce to rank 0 and scatter, or node-aware.
fn reduce_scatter_plans(c: &Case) -> Vec<(String, Vec<Round>)> {
    let (p, q) = (c.p, c.q());
    let mut flat = reduce(c.on, c.mf, select::reduce(&c.s, None));
    flat.push(Round { fan: p - 1, ..r(c.mf / p as f64, c.on.shift(p)) });
    let mut na = reduce(c.local, c.mf, select::reduce(&c.local_shape(), None));
    na.extend(ring(c.heads, c.mf / c.h as f64, true));
    na.push(Round { fan: q.saturating_sub(1), ..r(c.mf / p as f64, 0) });
    let mut v = vec![("reduce_scatterv".to_string(), flat), ("node_aware".to_string(), na)];
    mark(&mut v, if c.hier { "node_aware" } else { "reduce_scatterv" });
    v
}

/// Marks the runtime's choice with a `*` and puts it first.
fn mark(v: &mut Vec<(String, Vec<Round>)>, chosen: &str) {
    if let Some(i) = v.iter().position(|(n, _)| n == chosen) {
        let (n, x) = v.remove(i);
        v.insert(0, (format!("*{n}"), x));
    }
}

fn list(args: &[String], flag: &str, default: &[usize]) -> Result<Vec<usize>, Box<dyn Error>> {
    match args.iter().position(|a| a == flag) {
        None => Ok(default.to_vec()),
        Some(i) => {
            let v = args.get(i + 1).ok_or_else(|| format!("collmodel: {flag} needs a value"))?;
            v.split(',').map(|x| x.trim().parse::<usize>().map_err(|e| format!("collmodel: {flag} {x:?}: {e}").into())).collect()
        }
    }
}

fn num(args: &[String], flag: &str, default: f64) -> Result<f64, Box<dyn Error>> {
    match args.iter().position(|a| a == flag) {
        None => Ok(default),
        Some(i) => {
            let v = args.get(i + 1).ok_or_else(|| format!("collmodel: {flag} needs a value"))?;
            let x: f64 = v.parse().map_err(|e| format!("collmodel: {flag} {v:?}: {e}"))?;
            if !(x > 0.0 && x.is_finite()) {
                return Err(format!("collmodel: {flag} must be a positive number, not {v}").into());
            }
            Ok(x)
        }
    }
}

/// `osu_allreduce` at 2 ranks on this host (tmpi, `bench/results/coll-2026-11-26d.md`, the
/// "after" column, median of 7 interleaved runs in a quiet hour): bytes, microseconds.
const MEASURED_ALLREDUCE_2: [(usize, f64); 8] =
    [(4096, 1.13), (16384, 3.55), (32768, 8.32), (65536, 12.91), (131072, 19.66), (262144, 33.43), (524288, 69.26), (1048576, 187.24)];

fn check(model: &Model) {
    println!("check: osu_allreduce (float sum) at 2 ranks on one host, measured (bench/results/coll-2026-11-26d.md) against predicted");
    println!("{:>10} {:>12} {:>12} {:>8}", "bytes", "measured us", "model us", "error");
    let mut worst: f64 = 0.0;
    for (m, us) in MEASURED_ALLREDUCE_2 {
        let got = algorithms("allreduce", 2, 1, m, model)[0].1 * 1e6;
        let err = got / us - 1.0;
        worst = worst.max(err.abs());
        println!("{m:>10} {us:>12.2} {got:>12.2} {:>+7.0}%", err * 100.0);
    }
    println!("largest error {:.0}% (the shared-memory parameters are fitted to these same points: an in-sample error; the network parameters are not checked here, this host has no network)", worst * 100.0);
}

/// Mean seconds per call of `f` over `iters` calls after `iters / 10 + 1` warm-up calls, the
/// largest over the ranks.
fn time_it(w: &tmpi::Comm, iters: usize, mut f: impl FnMut() -> tmpi::Result<()>) -> Result<f64, Box<dyn Error>> {
    for _ in 0..iters / 10 + 1 {
        f()?;
    }
    w.barrier()?;
    let t0 = tmpi::wtime();
    for _ in 0..iters {
        f()?;
    }
    let mine = [(tmpi::wtime() - t0) / iters as f64];
    let mut most = [0.0];
    w.allreduce(&mine, &mut most, tmpi::Op::Max)?;
    Ok(most[0])
}

/// The number of hosts: distinct `TMPI_NODE_ID`s (a hash of each, gathered), checked to hold
/// equal blocks of consecutive ranks, as the model places them.
fn hosts_of(w: &tmpi::Comm) -> Result<usize, Box<dyn Error>> {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    std::env::var("TMPI_NODE_ID").unwrap_or_default().hash(&mut h);
    let mut all = vec![0u64; w.size()];
    w.allgather(&[h.finish()], &mut all)?;
    let mut starts = 1;
    for i in 1..all.len() {
        if all[i] != all[i - 1] {
            starts += 1;
        }
    }
    let mut distinct = all.clone();
    distinct.sort_unstable();
    distinct.dedup();
    if distinct.len() != starts || all.len() % starts != 0 || all.chunks(all.len() / starts).any(|c| c.iter().any(|&x| x != c[0])) {
        return Err("collmodel --measure: the hosts (TMPI_NODE_ID) must hold equal blocks of consecutive ranks".into());
    }
    Ok(starts)
}

/// One measured call: `coll` of `m` bytes (alltoall: `m / p` per block) timed on `w`.
fn measure_one(w: &tmpi::Comm, coll: &str, m: usize, iters: usize) -> Result<f64, Box<dyn Error>> {
    let p = w.size();
    let n = (m / 8).max(1);
    let send = vec![1.0f64; n];
    let mut recv = vec![0.0f64; n];
    match coll {
        "barrier" => time_it(w, iters, || w.barrier()),
        "bcast" => time_it(w, iters, || w.bcast(&mut recv, 0)),
        "allreduce" => time_it(w, iters, || w.allreduce(&send, &mut recv, tmpi::Op::Sum)),
        "allgather" => {
            let mine = vec![1u8; (m / p).max(1)];
            let mut all = vec![0u8; mine.len() * p];
            time_it(w, iters, || w.allgather(&mine, &mut all))
        }
        _ => {
            let blk = (m / p).max(1);
            let (out, mut inn) = (vec![1u8; blk * p], vec![0u8; blk * p]);
            time_it(w, iters, || w.alltoall(&out, &mut inn))
        }
    }
}

/// `--measure`: every collective at every size on this job, beside the model's prediction
/// for the algorithm the runtime picks; prints measured / predicted for each, and their
/// median and range.
fn measure(args: &[String], sizes: &[usize], model: &Model) -> Result<(), Box<dyn Error>> {
    let world = tmpi::init()?;
    let (p, me) = (world.size(), world.rank());
    let h = hosts_of(&world)?;
    let iters = list(args, "--iters", &[0])?[0];
    if me == 0 {
        println!("collmodel: {model:?}");
        println!("measure: {p} ranks on {h} hosts; times in microseconds, the largest over the ranks of each one's mean");
        if std::env::vars().any(|(k, _)| k.starts_with("TMPI_COLL_")) {
            println!("note: TMPI_COLL_* overrides are set; the pick and the model column are the automatic choice");
        }
        println!("{:>10} {:>10} {:>18} {:>10} {:>10} {:>14}", "collective", "bytes", "pick", "measured", "model", "measured/model");
    }
    let mut errs = Vec::new();
    for coll in ["barrier", "bcast", "allreduce", "allgather", "alltoall"] {
        for &m in sizes {
            let m = if coll == "barrier" { 0 } else { m };
            let n = if iters > 0 { iters } else { (2_000_000 / (m + 4096)).clamp(5, 500) };
            let got = measure_one(&world, coll, m, n)? * 1e6;
            let block = if coll == "alltoall" { (m / p).max(1) } else { m.max(8) };
            let v = algorithms(coll, p, h, block, model);
            let (name, t) = v.iter().find(|x| x.0.starts_with('*')).unwrap_or(&v[0]);
            let ratio = got / (t * 1e6);
            errs.push(ratio);
            if me == 0 {
                println!("{coll:>10} {m:>10} {:>18} {got:>10.2} {:>10.2} {ratio:>13.2}x", name.trim_start_matches('*'), t * 1e6);
            }
            if coll == "barrier" {
                break;
            }
        }
    }
    errs.sort_by(f64::total_cmp);
    if me == 0 {
        let (lo, mid, hi) = (errs[0], errs[errs.len() / 2], errs[errs.len() - 1]);
        println!("measured/model over {} calls: median {mid:.2}x, from {lo:.2}x to {hi:.2}x", errs.len());
    }
    world.finalize()?;
    Ok(())
}

fn main() -> Result<(), Box<dyn Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let sizes = list(&args, "--sizes", &[8, 65536, 16 << 20])?;
    let ranks = list(&args, "--ranks", &[2, 8, 64, 512, 4096, 65536])?;
    let hosts = list(&args, "--hosts", &[1, 4, 64, 4096])?;
    let us = |x: f64| x * 1e-6;
    let per_byte = |gbs: f64| 1.0 / (gbs * 1e9);
    let model = Model {
        shm: Link { lat: us(num(&args, "--shm-lat", 0.4)?), o: us(0.05), g: per_byte(num(&args, "--shm-gbs", 10.0)?) },
        net: Link { lat: us(num(&args, "--net-lat", 5.0)?), o: us(0.5), g: per_byte(num(&args, "--net-gbs", 6.0)?) },
        gamma: per_byte(num(&args, "--reduce-gbs", 10.0)?),
        copy: per_byte(20.0),
    };
    if args.iter().any(|a| a == "--measure") {
        return measure(&args, &sizes, &model);
    }
    println!("collmodel: {model:?}");
    println!("times in microseconds; * = what the runtime picks (auto); ! = the model's fastest when the pick is not");
    if args.iter().any(|a| a == "--check") {
        check(&model);
        return Ok(());
    }

    for coll in ["barrier", "bcast", "reduce", "allreduce", "allgather", "alltoall", "reduce_scatter"] {
        for &m in &sizes {
            let m = if coll == "barrier" { 0 } else { m };
            println!(
                "\n{coll} {m} bytes{}",
                if coll == "alltoall" {
                    " per block"
                } else if coll == "allgather" {
                    " in all"
                } else {
                    ""
                }
            );
            for &p in &ranks {
                for &h in hosts.iter().filter(|&&h| h <= p && p % h == 0) {
                    let v = algorithms(coll, p, h, m, &model);
                    let best = v.iter().map(|x| x.1).fold(f64::INFINITY, f64::min);
                    // `!` only where the pick is slower (a tie with the pick is no win).
                    let beaten = v[0].1 > best * (1.0 + 1e-9);
                    let cells: Vec<String> =
                        v.iter().map(|(n, t)| format!("{n}{} {:.1}", if beaten && *t == best { "!" } else { "" }, t * 1e6)).collect();
                    println!("  {p:>6} ranks {h:>5} hosts: {}", cells.join("  "));
                }
            }
            if coll == "barrier" {
                break;
            }
        }
    }
    Ok(())
}
