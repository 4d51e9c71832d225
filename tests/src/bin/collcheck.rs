//! Every collective against values computed locally, on several communicators.
//!
//! `collcheck [BIG_BYTES]` (default 1 MiB). On the world communicator, a `dup` of it, a split
//! into two halves with reversed keys and a split that leaves some ranks out, each rank checks
//! `barrier` (nobody leaves before the last rank entered), `bcast`, `reduce`, `allreduce`,
//! `gather`, `scatter`, `allgather` and `alltoall` for u8, i32, u64, f32 and f64, counts 0, 1,
//! 7, 1000 and about 70 KB (above the eager limit), with several roots and every operator the
//! type supports; on the world and the dup also one buffer of BIG_BYTES (for u8 and f64). The
//! element values are small integers, so float sums and products are exact whatever order the
//! algorithm combines them in, and each rank computes the expected result by itself.

use std::error::Error as StdError;
use std::fmt::Debug;
use std::sync::OnceLock;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tmpi::{Comm, Op, Reducible};
use tmpi_tests::Verdict;

/// An element type, with a reference implementation of every operator.
trait Elem: Reducible + PartialEq + Debug + Copy {
    const FLOAT: bool;
    fn from_i64(v: i64) -> Self;
    fn combine(op: Op, a: Self, b: Self) -> Self;
}

macro_rules! int_elem {
    ($($t:ty),*) => {$(
        impl Elem for $t {
            const FLOAT: bool = false;
            fn from_i64(v: i64) -> Self {
                v as $t
            }
            fn combine(op: Op, a: Self, b: Self) -> Self {
                match op {
                    Op::Sum => a.wrapping_add(b),
                    Op::Prod => a.wrapping_mul(b),
                    Op::Min => a.min(b),
                    Op::Max => a.max(b),
                    Op::BitAnd => a & b,
                    Op::BitOr => a | b,
                    Op::BitXor => a ^ b,
                    Op::LogicalAnd => <$t>::from(a != 0 && b != 0),
                    Op::LogicalOr => <$t>::from(a != 0 || b != 0),
                }
            }
        }
    )*};
}
int_elem!(u8, i32, u64);

macro_rules! float_elem {
    ($($t:ty),*) => {$(
        impl Elem for $t {
            const FLOAT: bool = true;
            fn from_i64(v: i64) -> Self {
                v as $t
            }
            fn combine(op: Op, a: Self, b: Self) -> Self {
                let truth = |x: bool| if x { 1.0 } else { 0.0 };
                match op {
                    Op::Sum => a + b,
                    Op::Prod => a * b,
                    Op::Min => a.min(b),
                    Op::Max => a.max(b),
                    Op::LogicalAnd => truth(a != 0.0 && b != 0.0),
                    Op::LogicalOr => truth(a != 0.0 || b != 0.0),
                    // Not defined for floats: the suite never asks (the runtime says InvalidOp).
                    Op::BitAnd | Op::BitOr | Op::BitXor => <$t>::NAN,
                }
            }
        }
    )*};
}
float_elem!(f32, f64);

/// Element `i` of `rank`'s buffer for operator `op` (`None`: data movement only).
fn val<T: Elem>(op: Option<Op>, rank: usize, i: usize, salt: i64) -> T {
    let (r, i) = (rank as i64, i as i64);
    let v = match op {
        Some(Op::Prod) => 1 + (r + i + salt) % 2,
        Some(Op::LogicalAnd | Op::LogicalOr) => (r * 3 + i + salt) % 4,
        Some(_) => (r * 37 + i * 11 + salt) % 23 - 7,
        None => (r * 1_000_003 + i * 7 + salt) % 1_000_000,
    };
    T::from_i64(v)
}

fn data<T: Elem>(op: Option<Op>, rank: usize, n: usize, salt: i64) -> Vec<T> {
    (0..n).map(|i| val(op, rank, i, salt)).collect()
}

fn expected_reduction<T: Elem>(op: Op, p: usize, n: usize, salt: i64) -> Vec<T> {
    let mut acc = data::<T>(Some(op), 0, n, salt);
    for r in 1..p {
        for (i, a) in acc.iter_mut().enumerate() {
            *a = T::combine(op, *a, val(Some(op), r, i, salt));
        }
    }
    acc
}

fn ops<T: Elem>(count: usize) -> Vec<Op> {
    let all: Vec<Op> = Op::ALL.into_iter().filter(|op| !(T::FLOAT && op.is_bitwise())).collect();
    if count >= 4096 {
        // Large buffers: the algorithms do not depend on the operator; two are enough.
        vec![Op::Sum, Op::Max]
    } else {
        all
    }
}

fn roots(p: usize) -> Vec<usize> {
    let mut r = vec![0, p / 2, p - 1];
    r.dedup();
    r.sort_unstable();
    r.dedup();
    r
}

struct Ctx<'a> {
    c: &'a Comm,
    name: &'a str,
    ty: &'static str,
}

fn first_diff<T: PartialEq + Debug>(got: &[T], want: &[T]) -> String {
    if got.len() != want.len() {
        return format!("length {} expected {}", got.len(), want.len());
    }
    match got.iter().zip(want).position(|(a, b)| a != b) {
        Some(i) => format!("element {i} is {:?}, expected {:?}", got[i], want[i]),
        None => "equal".into(),
    }
}

fn check_eq<T: PartialEq + Debug>(v: &mut Verdict, x: &Ctx<'_>, what: &str, got: &[T], want: &[T]) {
    v.check(got == want, || format!("{} {} {what}: {}", x.name, x.ty, first_diff(got, want)));
}

/// With `COLLCHECK_TRACE=1` every rank says on stderr which collective it starts (to find a
/// hang).
fn trace(x: &Ctx<'_>, what: &str, count: usize) {
    static ON: OnceLock<bool> = OnceLock::new();
    if *ON.get_or_init(|| std::env::var_os("COLLCHECK_TRACE").is_some_and(|v| v == "1")) {
        eprintln!("collcheck: rank {}: {} {} {what} count={count}", x.c.rank(), x.name, x.ty);
    }
}

fn ok(v: &mut Verdict, x: &Ctx<'_>, what: &str, r: tmpi::Result<()>) -> bool {
    match r {
        Ok(()) => true,
        Err(e) => {
            v.check(false, || format!("{} {} {what}: {e}", x.name, x.ty));
            false
        }
    }
}

/// Every collective for one element type and count on one communicator.
fn suite<T: Elem>(x: &Ctx<'_>, v: &mut Verdict, count: usize, salt: i64) {
    let p = x.c.size();
    let big = count >= 4096;
    let roots = if big { vec![0, p - 1] } else { roots(p) };
    bcasts::<T>(x, v, count, salt, &roots);
    reductions::<T>(x, v, count, salt, &roots);
    // Blocks of the gather family: the whole buffer holds p blocks, so large ones shrink.
    let block = if big { count / p } else { count };
    gathers::<T>(x, v, (count, block), salt, &roots);
    alltoall::<T>(x, v, (count, block), salt);
}

fn bcasts<T: Elem>(x: &Ctx<'_>, v: &mut Verdict, count: usize, salt: i64, roots: &[usize]) {
    let (c, rank) = (x.c, x.c.rank());
    for &root in roots {
        let want = data::<T>(None, root, count, salt + root as i64);
        let mut buf = if rank == root { want.clone() } else { vec![T::from_i64(-1); count] };
        trace(x, "bcast", count);
        if ok(v, x, "bcast", c.bcast(&mut buf, root)) {
            check_eq(v, x, &format!("bcast n={count} root={root}"), &buf, &want);
        }
    }
}

/// `reduce` and `allreduce` by every operator the type has; floats refuse bitwise ones.
fn reductions<T: Elem>(x: &Ctx<'_>, v: &mut Verdict, count: usize, salt: i64, roots: &[usize]) {
    let (c, rank, p) = (x.c, x.c.rank(), x.c.size());
    for (k, op) in ops::<T>(count).into_iter().enumerate() {
        let send = data::<T>(Some(op), rank, count, salt);
        let want = expected_reduction::<T>(op, p, count, salt);
        let root = roots[k % roots.len()];
        let mut out = vec![T::from_i64(-2); count];
        trace(x, "reduce", count);
        let r = c.reduce(&send, (rank == root).then_some(&mut out[..]), op, root);
        if ok(v, x, "reduce", r) && rank == root {
            check_eq(v, x, &format!("reduce {op} n={count} root={root}"), &out, &want);
        }
        let mut all = vec![T::from_i64(-3); count];
        trace(x, "allreduce", count);
        if ok(v, x, "allreduce", c.allreduce(&send, &mut all, op)) {
            check_eq(v, x, &format!("allreduce {op} n={count}"), &all, &want);
        }
    }
    if T::FLOAT {
        let mut out = vec![T::from_i64(0); count];
        v.check_err(
            c.allreduce(&vec![T::from_i64(1); count], &mut out, Op::BitXor),
            |e| matches!(e, tmpi::Error::InvalidOp { .. }),
            "InvalidOp for a bitwise operator on floats",
        );
    }
}

/// `gather` and `scatter` at each root, then `allgather`, of blocks of `block` elements.
fn gathers<T: Elem>(x: &Ctx<'_>, v: &mut Verdict, (count, block): (usize, usize), salt: i64, roots: &[usize]) {
    let (c, rank, p) = (x.c, x.c.rank(), x.c.size());
    let everyone: Vec<T> = (0..p).flat_map(|r| data::<T>(None, r, block, salt)).collect();
    let send = data::<T>(None, rank, block, salt);
    for &root in roots {
        let mut out = vec![T::from_i64(-4); p * block];
        trace(x, "gather", count);
        let r = c.gather(&send, (rank == root).then_some(&mut out[..]), root);
        if ok(v, x, "gather", r) && rank == root {
            check_eq(v, x, &format!("gather block={block} root={root}"), &out, &everyone);
        }
        let mut mine = vec![T::from_i64(-5); block];
        let src = (rank == root).then_some(&everyone[..]);
        trace(x, "scatter", count);
        if ok(v, x, "scatter", c.scatter(src, &mut mine, root)) {
            check_eq(v, x, &format!("scatter block={block} root={root}"), &mine, &send);
        }
    }
    let mut out = vec![T::from_i64(-6); p * block];
    trace(x, "allgather", count);
    if ok(v, x, "allgather", c.allgather(&send, &mut out)) {
        check_eq(v, x, &format!("allgather block={block}"), &out, &everyone);
    }
}

/// `alltoall`: block j of rank r's send buffer is meant for rank j and carries (r, j).
fn alltoall<T: Elem>(x: &Ctx<'_>, v: &mut Verdict, (count, block): (usize, usize), salt: i64) {
    let (c, rank, p) = (x.c, x.c.rank(), x.c.size());
    let a2a = |from: usize, to: usize| data::<T>(None, from * p + to, block, salt);
    let send: Vec<T> = (0..p).flat_map(|j| a2a(rank, j)).collect();
    let want: Vec<T> = (0..p).flat_map(|i| a2a(i, rank)).collect();
    let mut out = vec![T::from_i64(-7); p * block];
    trace(x, "alltoall", count);
    if ok(v, x, "alltoall", c.alltoall(&send, &mut out)) {
        check_eq(v, x, &format!("alltoall block={block}"), &out, &want);
    }
}

fn micros_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_micros() as u64).unwrap_or(0)
}

/// Nobody leaves the barrier before the last rank (which enters late) has entered.
fn barrier_check(c: &Comm, name: &str, v: &mut Verdict) -> tmpi::Result<()> {
    let (rank, p) = (c.rank(), c.size());
    if rank == p - 1 {
        std::thread::sleep(Duration::from_millis(40));
    }
    let entered = micros_now();
    c.barrier()?;
    let left = micros_now();
    let mut all = vec![0u64; p];
    c.allgather(&[entered], &mut all)?;
    let last = all.iter().copied().max().unwrap_or(0);
    v.check(left >= last, || format!("{name}: rank {rank} left the barrier {} us before the last rank entered", last - left));
    Ok(())
}

fn run_all(c: &Comm, name: &str, big_bytes: usize, v: &mut Verdict) -> tmpi::Result<()> {
    barrier_check(c, name, v)?;
    let counts_bytes = [0usize, 1, 7, 1000];
    for (salt, &n) in counts_bytes.iter().enumerate() {
        let s = salt as i64;
        suite::<u8>(&Ctx { c, name, ty: "u8" }, v, n, s);
        suite::<i32>(&Ctx { c, name, ty: "i32" }, v, n, s);
        suite::<u64>(&Ctx { c, name, ty: "u64" }, v, n, s);
        suite::<f32>(&Ctx { c, name, ty: "f32" }, v, n, s);
        suite::<f64>(&Ctx { c, name, ty: "f64" }, v, n, s);
    }
    // About 70 KB: above the eager limit.
    suite::<i32>(&Ctx { c, name, ty: "i32" }, v, 70_000 / 4, 5);
    suite::<f64>(&Ctx { c, name, ty: "f64" }, v, 70_000 / 8, 6);
    if big_bytes > 0 && (name == "world" || name == "dup") {
        suite::<u8>(&Ctx { c, name, ty: "u8" }, v, big_bytes, 7);
        suite::<f64>(&Ctx { c, name, ty: "f64" }, v, big_bytes / 8, 8);
    }
    Ok(())
}

fn main() -> Result<(), Box<dyn StdError>> {
    let big_bytes: usize = match std::env::args().nth(1) {
        Some(a) => a.parse().map_err(|_| format!("collcheck: bad BIG_BYTES {a:?}"))?,
        None => 1 << 20,
    };
    let world = tmpi::init()?;
    let (rank, p) = (world.rank(), world.size());
    let mut v = Verdict::new("collcheck", rank);

    run_all(&world, "world", big_bytes, &mut v)?;
    let dup = world.dup()?;
    run_all(&dup, "dup", big_bytes, &mut v)?;
    // Two halves, keys reversing the order inside each.
    let half = world.split(Some((rank % 2) as u32), -(rank as i32))?;
    match half {
        Some(h) => {
            let want_size = (p + 1 - rank % 2) / 2;
            let want_rank = (want_size - 1) - rank / 2;
            v.check(h.size() == want_size && h.rank() == want_rank, || {
                format!("halves: size {} rank {}, expected {want_size} {want_rank}", h.size(), h.rank())
            });
            run_all(&h, "half", big_bytes, &mut v)?;
        }
        None => v.check(false, || "split with a color returned None".into()),
    }
    // Ranks 2, 5, 8, ... take part but are in no communicator.
    let some = world.split((rank % 3 != 2).then_some(7), 0)?;
    match (rank % 3 != 2, some) {
        (true, Some(s)) => {
            let want = (0..p).filter(|r| r % 3 != 2).count();
            v.check(s.size() == want, || format!("partial split: size {} expected {want}", s.size()));
            run_all(&s, "partial", big_bytes, &mut v)?;
        }
        (false, None) => {}
        (member, got) => {
            v.check(false, || format!("partial split: member={member} but got {}", if got.is_some() { "a comm" } else { "None" }))
        }
    }
    let summary = format!("{p} ranks, world/dup/halves/partial, 8 collectives x 5 types");
    v.finish(&world, &summary)?;
    world.finalize()?;
    Ok(())
}
