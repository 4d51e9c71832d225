//! Non-blocking collectives through `tmpirun` (`nbc`): each one against its blocking twin, on
//! the world, a dup, two halves with reversed keys and a split that leaves ranks out; small
//! buffers and buffers above the eager limit; all of them in flight at once, completed in an
//! order that differs between ranks, with a point-to-point ring and a blocking collective
//! running in the middle.

use std::error::Error as StdError;

use tmpi::{scope, wait_any, Comm, Op};
use tmpi_tests::Verdict;

fn val(r: usize, i: usize) -> u32 {
    (r * 100_003 + i * 7 + 1) as u32
}

/// The inputs of the fixed-size collectives at one rank, `k` elements a block.
struct Inputs {
    r: usize,
    p: usize,
    k: usize,
    root: usize,
    mine: Vec<u32>,
    /// The root's scatter source.
    src: Vec<u32>,
    /// This rank's `alltoall` and `reduce_scatter_block` source.
    a2a: Vec<u32>,
}

impl Inputs {
    fn new(comm: &Comm, k: usize) -> Inputs {
        let (r, p) = (comm.rank(), comm.size());
        Inputs {
            r,
            p,
            k,
            root: p / 2,
            mine: (0..k).map(|i| val(r, i)).collect(),
            src: (0..k * p).map(|i| val(99, i)).collect(),
            a2a: (0..k * p).map(|i| val(r, i)).collect(),
        }
    }

    fn is_root(&self) -> bool {
        self.r == self.root
    }
}

/// What each collective left in its output buffer.
struct Outputs {
    bcast: Vec<u32>,
    red: Vec<u32>,
    allred: Vec<u32>,
    gat: Vec<u32>,
    sca: Vec<u32>,
    allg: Vec<u32>,
    a2a: Vec<u32>,
    rs: Vec<u32>,
    scan: Vec<u32>,
    ex: Vec<u32>,
}

impl Outputs {
    /// The buffers before the calls (the root's broadcast buffer holds its data; `exscan`'s
    /// holds 7s, which rank 0's must keep).
    fn new(inp: &Inputs) -> Outputs {
        let (k, p) = (inp.k, inp.p);
        Outputs {
            bcast: if inp.is_root() { inp.mine.clone() } else { vec![0; k] },
            red: vec![0; k],
            allred: vec![0; k],
            gat: vec![0; k * p],
            sca: vec![0; k],
            allg: vec![0; k * p],
            a2a: vec![0; k * p],
            rs: vec![0; k],
            scan: vec![0; k],
            ex: vec![7; k],
        }
    }
}

/// The expected values, from the blocking collectives.
fn blocking(comm: &Comm, inp: &Inputs) -> tmpi::Result<Outputs> {
    let mut o = Outputs::new(inp);
    let (root, mine) = (inp.root, &inp.mine[..]);
    comm.bcast(&mut o.bcast, root)?;
    comm.reduce(mine, inp.is_root().then_some(&mut o.red[..]), Op::Sum, root)?;
    comm.allreduce(mine, &mut o.allred, Op::Max)?;
    comm.gather(mine, (inp.r == 0).then_some(&mut o.gat[..]), 0)?;
    comm.scatter(inp.is_root().then_some(&inp.src[..]), &mut o.sca, root)?;
    comm.allgather(mine, &mut o.allg)?;
    comm.alltoall(&inp.a2a, &mut o.a2a)?;
    comm.reduce_scatter_block(&inp.a2a, &mut o.rs, Op::Sum)?;
    comm.scan(mine, &mut o.scan, Op::BitXor)?;
    comm.exscan(mine, &mut o.ex, Op::Sum)?;
    Ok(o)
}

/// All eleven non-blocking collectives in flight at once, a point-to-point ring and a
/// blocking `allreduce` beside them, completed in an order that differs between ranks.
fn nonblocking(comm: &Comm, inp: &Inputs, tag: &str, v: &mut Verdict) -> tmpi::Result<Outputs> {
    let mut o = Outputs::new(inp);
    let (r, p, root, mine) = (inp.r, inp.p, inp.root, &inp.mine[..]);
    let ring_out = [r as u64; 3];
    let mut ring_in = [0u64; 3];
    let mut mid = [0u64];
    let order = scope(|s| -> tmpi::Result<Vec<usize>> {
        let mut reqs = vec![
            comm.ibarrier(s)?,
            comm.ibcast(s, &mut o.bcast, root)?,
            comm.ireduce(s, mine, inp.is_root().then_some(&mut o.red[..]), Op::Sum, root)?,
            comm.iallreduce(s, mine, &mut o.allred, Op::Max)?,
            comm.igather(s, mine, (r == 0).then_some(&mut o.gat[..]), 0)?,
            comm.iscatter(s, inp.is_root().then_some(&inp.src[..]), &mut o.sca, root)?,
            comm.iallgather(s, mine, &mut o.allg)?,
            comm.ialltoall(s, &inp.a2a, &mut o.a2a)?,
            comm.ireduce_scatter_block(s, &inp.a2a, &mut o.rs, Op::Sum)?,
            comm.iscan(s, mine, &mut o.scan, Op::BitXor)?,
            comm.iexscan(s, mine, &mut o.ex, Op::Sum)?,
        ];
        let rr = comm.irecv(s, &mut ring_in, (r + p - 1) % p, 11)?;
        comm.send(&ring_out, (r + 1) % p, 11)?;
        comm.allreduce(&[1u64], &mut mid, Op::Sum)?;
        rr.wait()?;
        let mut order = Vec::new();
        if r % 2 == 1 {
            reqs.reverse();
        }
        while !reqs.is_empty() {
            order.push(wait_any(&mut reqs)?.0);
        }
        Ok(order)
    })?;
    v.check(order.len() == 11, || format!("{tag}: {} requests completed", order.len()));
    v.check(ring_in == [((r + p - 1) % p) as u64; 3], || format!("{tag}: ring beside the collectives"));
    v.check(mid[0] == p as u64, || format!("{tag}: blocking allreduce beside the collectives"));
    Ok(o)
}

/// Each non-blocking collective's output against its blocking twin's (where it has one).
fn compare(inp: &Inputs, got: &Outputs, want: &Outputs, tag: &str, v: &mut Verdict) {
    v.check(got.bcast == want.bcast, || format!("{tag}: ibcast"));
    if inp.is_root() {
        v.check(got.red == want.red, || format!("{tag}: ireduce"));
    }
    v.check(got.allred == want.allred, || format!("{tag}: iallreduce"));
    if inp.r == 0 {
        v.check(got.gat == want.gat, || format!("{tag}: igather"));
    }
    v.check(got.sca == want.sca, || format!("{tag}: iscatter"));
    v.check(got.allg == want.allg, || format!("{tag}: iallgather"));
    v.check(got.a2a == want.a2a, || format!("{tag}: ialltoall"));
    v.check(got.rs == want.rs, || format!("{tag}: ireduce_scatter_block"));
    v.check(got.scan == want.scan, || format!("{tag}: iscan"));
    v.check(got.ex == want.ex, || format!("{tag}: iexscan"));
}

/// The v-variants: rank q has q % 3 + 1 blocks of `k`, placed in reverse rank order.
fn check_v(comm: &Comm, inp: &Inputs, tag: &str, v: &mut Verdict) -> tmpi::Result<()> {
    let (r, p, k, root) = (inp.r, inp.p, inp.k, inp.root);
    let counts: Vec<usize> = (0..p).map(|q| (q % 3 + 1) * k).collect();
    let mut displs = vec![0; p];
    let mut at = 0;
    for q in (0..p).rev() {
        displs[q] = at;
        at += counts[q];
    }
    let vs: Vec<u32> = (0..counts[r]).map(|i| val(r, i)).collect();
    let mut w_gv = vec![0u32; at];
    comm.gatherv(&vs, (r == root).then_some(&mut w_gv[..]), &counts, &displs, root)?;
    let mut w_agv = vec![0u32; at];
    comm.allgatherv(&vs, &mut w_agv, &counts, &displs)?;
    let vsrc: Vec<u32> = (0..at).map(|i| val(5, i)).collect();
    let mut w_sv = vec![0u32; counts[r]];
    comm.scatterv((r == 0).then_some(&vsrc[..]), &counts, &displs, &mut w_sv, 0)?;
    let (mut gv, mut agv, mut sv) = (vec![0u32; at], vec![0u32; at], vec![0u32; counts[r]]);
    scope(|s| -> tmpi::Result<()> {
        let a = comm.igatherv(s, &vs, (r == root).then_some(&mut gv[..]), &counts, &displs, root)?;
        let b = comm.iallgatherv(s, &vs, &mut agv, &counts, &displs)?;
        let c = comm.iscatterv(s, (r == 0).then_some(&vsrc[..]), &counts, &displs, &mut sv, 0)?;
        tmpi::wait_all(vec![c, b, a])?;
        Ok(())
    })?;
    if r == root {
        v.check(gv == w_gv, || format!("{tag}: igatherv"));
    }
    v.check(agv == w_agv, || format!("{tag}: iallgatherv"));
    v.check(sv == w_sv, || format!("{tag}: iscatterv"));
    Ok(())
}

fn check_comm(comm: &Comm, name: &str, scale: usize, v: &mut Verdict) -> tmpi::Result<()> {
    let tag = format!("{name} scale {scale}");
    let inp = Inputs::new(comm, scale);
    let want = blocking(comm, &inp)?;
    let got = nonblocking(comm, &inp, &tag, v)?;
    compare(&inp, &got, &want, &tag, v);
    check_v(comm, &inp, &tag, v)
}

fn main() -> Result<(), Box<dyn StdError>> {
    let world = tmpi::init()?;
    let (rank, p) = (world.rank(), world.size());
    let mut v = Verdict::new("nbc", rank);
    for scale in [1, 3, 20_000] {
        check_comm(&world, "world", scale, &mut v)?;
    }
    let dup = world.dup()?;
    check_comm(&dup, "dup", 2, &mut v)?;
    let half = world.split(Some((rank % 2) as u32), -(rank as i32))?.ok_or("split with a color returned None")?;
    check_comm(&half, "half", 1, &mut v)?;
    check_comm(&half, "half", 20_000, &mut v)?;
    if let Some(s) = world.split((rank % 3 != 2).then_some(1), 0)? {
        check_comm(&s, "partial", 5, &mut v)?;
    }
    v.finish(&world, &format!("{p} ranks, world/dup/halves/partial, 14 non-blocking collectives"))?;
    world.finalize()?;
    Ok(())
}
