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

fn check_comm(comm: &Comm, name: &str, scale: usize, v: &mut Verdict) -> tmpi::Result<()> {
    let (r, p) = (comm.rank(), comm.size());
    let tag = format!("{name} scale {scale}");
    let k = scale;
    let mine: Vec<u32> = (0..k).map(|i| val(r, i)).collect();
    let root = p / 2;
    // Expected values, from the blocking collectives.
    let mut w_bcast: Vec<u32> = if r == root { mine.clone() } else { vec![0; k] };
    comm.bcast(&mut w_bcast, root)?;
    let mut w_red = vec![0u32; k];
    comm.reduce(&mine, (r == root).then_some(&mut w_red[..]), Op::Sum, root)?;
    let mut w_allred = vec![0u32; k];
    comm.allreduce(&mine, &mut w_allred, Op::Max)?;
    let mut w_gat = vec![0u32; k * p];
    comm.gather(&mine, (r == 0).then_some(&mut w_gat[..]), 0)?;
    let src: Vec<u32> = (0..k * p).map(|i| val(99, i)).collect();
    let mut w_sca = vec![0u32; k];
    comm.scatter((r == root).then_some(&src[..]), &mut w_sca, root)?;
    let mut w_allg = vec![0u32; k * p];
    comm.allgather(&mine, &mut w_allg)?;
    let a2a: Vec<u32> = (0..k * p).map(|i| val(r, i)).collect();
    let mut w_a2a = vec![0u32; k * p];
    comm.alltoall(&a2a, &mut w_a2a)?;
    let mut w_rs = vec![0u32; k];
    comm.reduce_scatter_block(&a2a, &mut w_rs, Op::Sum)?;
    let mut w_scan = vec![0u32; k];
    comm.scan(&mine, &mut w_scan, Op::BitXor)?;
    let mut w_ex = vec![7u32; k];
    comm.exscan(&mine, &mut w_ex, Op::Sum)?;

    let mut bc: Vec<u32> = if r == root { mine.clone() } else { vec![0; k] };
    let mut red = vec![0u32; k];
    let mut allred = vec![0u32; k];
    let mut gat = vec![0u32; k * p];
    let mut sca = vec![0u32; k];
    let mut allg = vec![0u32; k * p];
    let mut a2ar = vec![0u32; k * p];
    let mut rs = vec![0u32; k];
    let mut sc = vec![0u32; k];
    let mut ex = vec![7u32; k];
    let ring_out = [r as u64; 3];
    let mut ring_in = [0u64; 3];
    let mut mid = [0u64];
    let order = scope(|s| -> tmpi::Result<Vec<usize>> {
        let mut reqs = vec![
            comm.ibarrier(s)?,
            comm.ibcast(s, &mut bc, root)?,
            comm.ireduce(s, &mine, (r == root).then_some(&mut red[..]), Op::Sum, root)?,
            comm.iallreduce(s, &mine, &mut allred, Op::Max)?,
            comm.igather(s, &mine, (r == 0).then_some(&mut gat[..]), 0)?,
            comm.iscatter(s, (r == root).then_some(&src[..]), &mut sca, root)?,
            comm.iallgather(s, &mine, &mut allg)?,
            comm.ialltoall(s, &a2a, &mut a2ar)?,
            comm.ireduce_scatter_block(s, &a2a, &mut rs, Op::Sum)?,
            comm.iscan(s, &mine, &mut sc, Op::BitXor)?,
            comm.iexscan(s, &mine, &mut ex, Op::Sum)?,
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
    v.check(bc == w_bcast, || format!("{tag}: ibcast"));
    if r == root {
        v.check(red == w_red, || format!("{tag}: ireduce"));
    }
    v.check(allred == w_allred, || format!("{tag}: iallreduce"));
    if r == 0 {
        v.check(gat == w_gat, || format!("{tag}: igather"));
    }
    v.check(sca == w_sca, || format!("{tag}: iscatter"));
    v.check(allg == w_allg, || format!("{tag}: iallgather"));
    v.check(a2ar == w_a2a, || format!("{tag}: ialltoall"));
    v.check(rs == w_rs, || format!("{tag}: ireduce_scatter_block"));
    v.check(sc == w_scan, || format!("{tag}: iscan"));
    v.check(ex == w_ex, || format!("{tag}: iexscan"));
    v.check(ring_in == [((r + p - 1) % p) as u64; 3], || format!("{tag}: ring beside the collectives"));
    v.check(mid[0] == p as u64, || format!("{tag}: blocking allreduce beside the collectives"));

    // v-variants: rank q has q % 3 + 1 elements, blocks in reverse order.
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
