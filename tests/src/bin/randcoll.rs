//! Random sequences of collectives, the same on every rank (from a seed), each checked against
//! values the rank computes itself.
//!
//! Each step draws a communicator (the world, a `dup`, or one of two halves of a split with
//! reversed keys), a collective (`bcast`, `reduce`, `allreduce`, `gather`, `scatter`,
//! `allgather`, `allgatherv`, `alltoall`, `alltoallv`, `reduce_scatter`, `barrier`), blocking
//! or non-blocking (the `i` form, waited for at once), an element type (`u8`, `i32`, `f64`),
//! an operator, a root and a count: small, at the sizes where algorithms change, or random up
//! to 600 000 elements, often not a multiple of the communicator's size. Element values are
//! small integers, so float sums are exact in any order. Run across simulated hosts
//! (`TMPI_NODE_ID`), it checks the node-aware collectives against the same values.
//!
//! `randcoll [--seed N] [--steps S] [--show]` (defaults: seed 1, 60 steps); `--show` prints
//! each step on rank 0.

use std::error::Error as StdError;

use tmpi::{Comm, Op, Reducible};
use tmpi_tests::{Rng, Verdict};

/// An element type with its reference operators.
trait Elem: Reducible + PartialEq + std::fmt::Debug + Copy + Default {
    fn of(v: i64) -> Self;
    fn combine(op: Op, a: Self, b: Self) -> Self;
}

macro_rules! int_elem {
    ($($t:ty),*) => {$(
        impl Elem for $t {
            fn of(v: i64) -> Self {
                v as $t
            }
            fn combine(op: Op, a: Self, b: Self) -> Self {
                match op {
                    Op::Sum => a.wrapping_add(b),
                    Op::Min => a.min(b),
                    Op::Max => a.max(b),
                    _ => a ^ b,
                }
            }
        }
    )*};
}
int_elem!(u8, i32);

impl Elem for f64 {
    fn of(v: i64) -> Self {
        v as f64
    }
    fn combine(op: Op, a: Self, b: Self) -> Self {
        match op {
            Op::Sum => a + b,
            Op::Min => a.min(b),
            Op::Max => a.max(b),
            _ => unreachable!("f64 takes no bitwise operator"),
        }
    }
}

/// The value rank `r` contributes at element `i` of step `step`.
fn val<T: Elem>(step: usize, r: usize, i: usize) -> T {
    T::of(((step * 7 + r * 13 + i * 3) % 50) as i64)
}

const COUNTS: [usize; 14] = [0, 1, 3, 7, 1000, 4095, 8192, 16_385, 32_768, 65_537, 131_072, 262_147, 524_288, 600_001];

#[derive(Debug, Clone, Copy)]
enum Coll {
    Barrier,
    Bcast,
    Reduce,
    Allreduce,
    Gather,
    Scatter,
    Allgather,
    Alltoall,
    Allgatherv,
    Alltoallv,
    ReduceScatter,
}

const COLLS: [Coll; 11] = [
    Coll::Barrier,
    Coll::Bcast,
    Coll::Reduce,
    Coll::Allreduce,
    Coll::Gather,
    Coll::Scatter,
    Coll::Allgather,
    Coll::Alltoall,
    Coll::Allgatherv,
    Coll::Alltoallv,
    Coll::ReduceScatter,
];

fn main() -> Result<(), Box<dyn StdError>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let opt = |name: &str, default: u64| tmpi_tests::number_flag("randcoll", &args, name, default);
    let seed = opt("--seed", 1)?.max(1);
    let steps = opt("--steps", 60)? as usize;
    let show = args.iter().any(|a| a == "--show");
    let world = tmpi::init()?;
    let w: &Comm = &world;
    let rank = w.rank();
    let mut v = Verdict::new("randcoll", rank);
    let dup = w.dup()?;
    let half = w.split(Some((rank % 2) as u32), -(rank as i32))?.ok_or("randcoll: a split with a color left this rank out")?;
    let mut rng = Rng::new(seed, 0x9e37_79b9_7f4a_7c15);
    for step in 0..steps {
        let which = rng.below(3);
        let c: &Comm = [w, &dup, &half][which];
        let coll = COLLS[rng.below(COLLS.len())];
        let ty = rng.below(3);
        let op = [Op::Sum, Op::Min, Op::Max, Op::BitXor][rng.below(if ty == 2 { 3 } else { 4 })];
        // The same draws on every rank: the root is taken modulo the size of this rank's
        // communicator (both halves are drawn alike).
        let root_draw = rng.below(1 << 16);
        let count = if rng.below(3) == 0 { rng.below(600_001) } else { COUNTS[rng.below(COUNTS.len())] };
        // Gather, scatter, allgather and alltoall move `count` per rank: keep their totals
        // near the others'.
        let count = match coll {
            Coll::Gather | Coll::Scatter | Coll::Allgather | Coll::Alltoall | Coll::Allgatherv | Coll::Alltoallv => count / c.size().max(1),
            _ => count,
        };
        let root = root_draw % c.size();
        let nb = rng.below(2) == 1;
        if show && rank == 0 {
            eprintln!(
                "randcoll: step {step}: {coll:?} nb {nb} on comm {which} ({} ranks) type {ty} {op:?} root {root} count {count}",
                c.size()
            );
        }
        let what = format!("seed {seed} step {step}: {coll:?} nb {nb} on comm {which} type {ty} {op:?} root {root} count {count}");
        let s = Step { step, coll, op, root, count, nb };
        match ty {
            0 => one::<u8>(c, &mut v, &s, &what),
            1 => one::<i32>(c, &mut v, &s, &what),
            _ => one::<f64>(c, &mut v, &s, &what),
        }
    }
    v.finish(w, &format!("seed {seed}, {steps} steps"))
}

/// One drawn step.
struct Step {
    step: usize,
    coll: Coll,
    op: Op,
    root: usize,
    count: usize,
    /// The non-blocking form.
    nb: bool,
}

/// Runs `f` blocking, or its non-blocking form `g` waited for at once.
macro_rules! either {
    ($nb:expr, $f:expr, |$s:ident| $g:expr) => {
        if $nb {
            tmpi::scope(|$s| $g.and_then(|r| r.wait()).map(drop))
        } else {
            $f
        }
    };
}

/// Block sizes of the variable-count collectives at `count`: rank `r`'s block for rank `d`.
fn vcount(count: usize, r: usize, d: usize) -> usize {
    (count + r * 5 + d * 3) % (count + 1)
}

/// A collective's outcome and whether its result was right.
type Outcome = (tmpi::Result<()>, bool);

fn one<T: Elem>(c: &Comm, v: &mut Verdict, s: &Step, what: &str) {
    let (r, ok) = match s.coll {
        Coll::Barrier => (either!(s.nb, c.barrier(), |sc| c.ibarrier(sc)), true),
        Coll::Bcast | Coll::Reduce | Coll::Gather | Coll::Scatter => rooted::<T>(c, s),
        Coll::Allreduce | Coll::Allgather | Coll::Alltoall => symmetric::<T>(c, s),
        Coll::Allgatherv | Coll::Alltoallv | Coll::ReduceScatter => varying::<T>(c, s),
    };
    match r {
        Ok(()) => v.check(ok, || format!("{what}: wrong result")),
        Err(e) => v.check(false, || format!("{what}: {e}")),
    }
}

/// The reduction of every rank's element `i` at `step` by `op`.
fn reduced_at<T: Elem>(step: usize, op: Op, n: usize, i: usize) -> T {
    (1..n).fold(val::<T>(step, 0, i), |a, r| T::combine(op, a, val(step, r, i)))
}

/// `bcast`, `reduce`, `gather` and `scatter` at `s.root`.
fn rooted<T: Elem>(c: &Comm, s: &Step) -> Outcome {
    let Step { step, op, root, count, nb, .. } = *s;
    let (me, n) = (c.rank(), c.size());
    let mine: Vec<T> = (0..count).map(|i| val(step, me, i)).collect();
    match s.coll {
        Coll::Bcast => {
            let mut buf: Vec<T> = if me == root { mine } else { vec![T::default(); count] };
            let r = either!(nb, c.bcast(&mut buf, root), |sc| c.ibcast(sc, &mut buf, root));
            (r, buf.iter().enumerate().all(|(i, &x)| x == val(step, root, i)))
        }
        Coll::Reduce => {
            let mut out = vec![T::default(); count];
            let r = either!(nb, c.reduce(&mine, (me == root).then_some(&mut out[..]), op, root), |sc| c.ireduce(
                sc,
                &mine,
                (me == root).then_some(&mut out[..]),
                op,
                root
            ));
            (r, me != root || (0..count).all(|i| out[i] == reduced_at(step, op, n, i)))
        }
        Coll::Gather => {
            let mut out = vec![T::default(); count * n];
            let r = either!(nb, c.gather(&mine, (me == root).then_some(&mut out[..]), root), |sc| c.igather(
                sc,
                &mine,
                (me == root).then_some(&mut out[..]),
                root
            ));
            (r, me != root || (0..n).all(|p| (0..count).all(|i| out[p * count + i] == val(step, p, i))))
        }
        _ => {
            let all: Vec<T> = (0..n * count).map(|k| val(step, k / count.max(1), k % count.max(1) + 1000)).collect();
            let mut out = vec![T::default(); count];
            let from = (me == root).then_some(&all[..]);
            let r = either!(nb, c.scatter(from, &mut out, root), |sc| c.iscatter(sc, from, &mut out, root));
            (r, (0..count).all(|i| out[i] == val(step, me, i + 1000)))
        }
    }
}

/// `allreduce`, `allgather` and `alltoall`: the same count everywhere.
fn symmetric<T: Elem>(c: &Comm, s: &Step) -> Outcome {
    let Step { step, op, count, nb, .. } = *s;
    let (me, n) = (c.rank(), c.size());
    let mine: Vec<T> = (0..count).map(|i| val(step, me, i)).collect();
    match s.coll {
        Coll::Allreduce => {
            let mut out = vec![T::default(); count];
            let r = either!(nb, c.allreduce(&mine, &mut out, op), |sc| c.iallreduce(sc, &mine, &mut out, op));
            (r, (0..count).all(|i| out[i] == reduced_at(step, op, n, i)))
        }
        Coll::Allgather => {
            let mut out = vec![T::default(); count * n];
            let r = either!(nb, c.allgather(&mine, &mut out), |sc| c.iallgather(sc, &mine, &mut out));
            (r, (0..n).all(|p| (0..count).all(|i| out[p * count + i] == val(step, p, i))))
        }
        _ => {
            // Block `d` of rank `s`'s send buffer goes to rank `d`: values of (s, d, i).
            let send: Vec<T> = (0..n * count).map(|k| val(step, me * 64 + k / count.max(1), k % count.max(1))).collect();
            let mut out = vec![T::default(); count * n];
            let r = either!(nb, c.alltoall(&send, &mut out), |sc| c.ialltoall(sc, &send, &mut out));
            (r, (0..n).all(|s| (0..count).all(|i| out[s * count + i] == val(step, s * 64 + me, i))))
        }
    }
}

/// `allgatherv`, `alltoallv` and `reduce_scatter`: counts that differ by rank.
fn varying<T: Elem>(c: &Comm, s: &Step) -> Outcome {
    let Step { step, op, count, nb, .. } = *s;
    let (me, n) = (c.rank(), c.size());
    match s.coll {
        Coll::Allgatherv => {
            // Rank r gives vcount(count, r, 0) elements; blocks land in reverse rank order.
            let counts: Vec<usize> = (0..n).map(|r| vcount(count, r, 0)).collect();
            let displs: Vec<usize> = (0..n).map(|r| counts[r + 1..].iter().sum()).collect();
            let mine: Vec<T> = (0..counts[me]).map(|i| val(step, me, i)).collect();
            let mut out = vec![T::default(); counts.iter().sum()];
            let r = either!(nb, c.allgatherv(&mine, &mut out, &counts, &displs), |sc| c.iallgatherv(sc, &mine, &mut out, &counts, &displs));
            (r, (0..n).all(|p| (0..counts[p]).all(|i| out[displs[p] + i] == val(step, p, i))))
        }
        Coll::Alltoallv => {
            // Rank s sends rank d vcount(count, s, d) elements of values (s, d, i).
            let sc: Vec<usize> = (0..n).map(|d| vcount(count, me, d)).collect();
            let rc: Vec<usize> = (0..n).map(|s| vcount(count, s, me)).collect();
            let sd: Vec<usize> = (0..n).map(|d| sc[..d].iter().sum()).collect();
            let rd: Vec<usize> = (0..n).map(|s| rc[..s].iter().sum()).collect();
            let send: Vec<T> = (0..n).flat_map(|d| (0..sc[d]).map(move |i| val(step, me * 64 + d, i))).collect();
            let mut out = vec![T::default(); rc.iter().sum()];
            let r = either!(nb, c.alltoallv(&send, &sc, &sd, &mut out, &rc, &rd), |s| c.ialltoallv(s, &send, &sc, &sd, &mut out, &rc, &rd));
            (r, (0..n).all(|s| (0..rc[s]).all(|i| out[rd[s] + i] == val(step, s * 64 + me, i))))
        }
        _ => {
            let counts: Vec<usize> = (0..n).map(|r| vcount(count / n.max(1), r, 1)).collect();
            let total: usize = counts.iter().sum();
            let mine: Vec<T> = (0..total).map(|i| val(step, me, i)).collect();
            let mut out = vec![T::default(); counts[me]];
            let r = either!(nb, c.reduce_scatter(&mine, &mut out, &counts, op), |sc| c.ireduce_scatter(sc, &mine, &mut out, &counts, op));
            let lo: usize = counts[..me].iter().sum();
            (r, (0..counts[me]).all(|i| out[i] == reduced_at(step, op, n, lo + i)))
        }
    }
}
