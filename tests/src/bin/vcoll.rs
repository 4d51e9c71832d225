//! Variable-count collectives, reduce-scatter and prefix reductions against values computed
//! locally, on the world, a dup, two halves with reversed keys and a split that leaves ranks
//! out; small blocks and blocks above the eager limit; then bad counts and displacements, which
//! must be errors on the rank that passed them while every rank finishes the call.

use std::error::Error as StdError;

use tmpi::{Comm, Error, Op};
use tmpi_tests::Verdict;

fn val(r: usize, i: usize) -> u32 {
    (r * 100_003 + i * 7 + 1) as u32
}

/// Rank `r`'s block length: varied, some zero, `scale` times larger for big runs.
fn count(r: usize, salt: usize, scale: usize) -> usize {
    ((r * 3 + salt) % 5) * scale
}

fn check_comm(comm: &Comm, name: &str, scale: usize, v: &mut Verdict) -> tmpi::Result<()> {
    for salt in 0..3 {
        let tag = format!("{name} scale {scale} salt {salt}");
        check_v(comm, &tag, salt, scale, v)?;
        check_alltoallv(comm, &tag, salt, scale, v)?;
        check_reductions(comm, &tag, salt, scale, v)?;
    }
    Ok(())
}

/// `gatherv`, `scatterv` and `allgatherv`: blocks in reverse rank order, one element apart.
fn check_v(comm: &Comm, tag: &str, salt: usize, scale: usize, v: &mut Verdict) -> tmpi::Result<()> {
    let (r, p) = (comm.rank(), comm.size());
    let counts: Vec<usize> = (0..p).map(|q| count(q, salt, scale)).collect();
    let mut displs = vec![0; p];
    let mut at = 0;
    for q in (0..p).rev() {
        displs[q] = at;
        at += counts[q] + 1;
    }
    let mut want = vec![0u32; at];
    for q in 0..p {
        for i in 0..counts[q] {
            want[displs[q] + i] = val(q, i);
        }
    }
    let send: Vec<u32> = (0..counts[r]).map(|i| val(r, i)).collect();
    let root = (salt * 2 + 1) % p;
    let mut all = vec![0u32; at];
    comm.gatherv(&send, (r == root).then_some(&mut all[..]), &counts, &displs, root)?;
    if r == root {
        v.check(all == want, || format!("{tag}: gatherv to {root}"));
    }
    let mut back = vec![0u32; counts[r]];
    comm.scatterv((r == root).then_some(&want[..]), &counts, &displs, &mut back, root)?;
    v.check(back == send, || format!("{tag}: scatterv from {root}"));
    let mut all = vec![0u32; at];
    comm.allgatherv(&send, &mut all, &counts, &displs)?;
    v.check(all == want, || format!("{tag}: allgatherv"));
    Ok(())
}

/// `alltoallv` with a count per pair.
fn check_alltoallv(comm: &Comm, tag: &str, salt: usize, scale: usize, v: &mut Verdict) -> tmpi::Result<()> {
    let (r, p) = (comm.rank(), comm.size());
    let n = |a: usize, b: usize| ((a + 2 * b + salt) % 3) * scale;
    let sc: Vec<usize> = (0..p).map(|j| n(r, j)).collect();
    let sd: Vec<usize> = (0..p).map(|j| sc[..j].iter().sum()).collect();
    let sbuf: Vec<u32> = (0..p).flat_map(|j| (0..n(r, j)).map(move |k| val(r, 1000 * j + k))).collect();
    let rc: Vec<usize> = (0..p).map(|i| n(i, r)).collect();
    let rd: Vec<usize> = (0..p).map(|i| rc[..i].iter().sum()).collect();
    let mut rbuf = vec![0u32; rc.iter().sum()];
    comm.alltoallv(&sbuf, &sc, &sd, &mut rbuf, &rc, &rd)?;
    let want_a2a: Vec<u32> = (0..p).flat_map(|i| (0..n(i, r)).map(move |k| val(i, 1000 * r + k))).collect();
    v.check(rbuf == want_a2a, || format!("{tag}: alltoallv"));
    Ok(())
}

/// Reductions: small integer values, so float sums are exact in any order.
fn fv(q: usize, i: usize) -> f64 {
    ((q * 5 + i) % 9) as f64
}

fn iv(q: usize, i: usize) -> i64 {
    ((q * 13 + i * 3) % 17) as i64 - 8
}

/// `reduce_scatter` (sum, min), `reduce_scatter_block` (xor), `scan` (sum), `exscan` (max).
fn check_reductions(comm: &Comm, tag: &str, salt: usize, scale: usize, v: &mut Verdict) -> tmpi::Result<()> {
    let (r, p) = (comm.rank(), comm.size());
    let rcounts: Vec<usize> = (0..p).map(|q| ((q + salt) % 3) * scale).collect();
    let total: usize = rcounts.iter().sum();
    let start: usize = rcounts[..r].iter().sum();
    let fs: Vec<f64> = (0..total).map(|i| fv(r, i)).collect();
    let mut mine = vec![0.0; rcounts[r]];
    comm.reduce_scatter(&fs, &mut mine, &rcounts, Op::Sum)?;
    let w: Vec<f64> = (start..start + rcounts[r]).map(|i| (0..p).map(|q| fv(q, i)).sum()).collect();
    v.check(mine == w, || format!("{tag}: reduce_scatter sum"));
    let is: Vec<i64> = (0..total).map(|i| iv(r, i)).collect();
    let mut mine = vec![0i64; rcounts[r]];
    comm.reduce_scatter(&is, &mut mine, &rcounts, Op::Min)?;
    let w: Vec<i64> = (start..start + rcounts[r]).map(|i| (0..p).map(|q| iv(q, i)).min().unwrap_or(0)).collect();
    v.check(mine == w, || format!("{tag}: reduce_scatter min"));
    let blk = scale + salt;
    let bs: Vec<i64> = (0..blk * p).map(|i| iv(r, i)).collect();
    let mut mine = vec![0i64; blk];
    comm.reduce_scatter_block(&bs, &mut mine, Op::BitXor)?;
    let w: Vec<i64> = (blk * r..blk * (r + 1)).map(|i| (0..p).fold(0, |a, q| a ^ iv(q, i))).collect();
    v.check(mine == w, || format!("{tag}: reduce_scatter_block xor"));
    let mut inc = vec![0.0; total];
    comm.scan(&fs, &mut inc, Op::Sum)?;
    let w: Vec<f64> = (0..total).map(|i| (0..=r).map(|q| fv(q, i)).sum()).collect();
    v.check(inc == w, || format!("{tag}: scan sum"));
    let mut exc = vec![-1i64; total];
    comm.exscan(&is, &mut exc, Op::Max)?;
    let w: Vec<i64> = (0..total).map(|i| if r == 0 { -1 } else { (0..r).map(|q| iv(q, i)).max().unwrap_or(0) }).collect();
    v.check(exc == w, || format!("{tag}: exscan max"));
    Ok(())
}

/// Bad counts on one rank: an error there, every other rank finishes, the communicator works.
fn check_bad(comm: &Comm, v: &mut Verdict) -> tmpi::Result<()> {
    let (r, p) = (comm.rank(), comm.size());
    let ones = vec![1usize; p];
    let displs: Vec<usize> = (0..p).collect();
    let bad_rank = p - 1;
    let is_buf = |e: &Error| matches!(e, Error::InvalidBuffer(_));
    // Root with a displacement past the end.
    let mut all = vec![0u8; p];
    let mut bad_d = displs.clone();
    bad_d[0] = p;
    let res = comm.gatherv(&[r as u8], (r == 0).then_some(&mut all[..]), &ones, &bad_d, 0);
    if r == 0 {
        v.check_err(res, is_buf, "gatherv: InvalidBuffer at the root");
    } else {
        v.check(res.is_ok(), || "gatherv: a rank other than the bad root failed".into());
    }
    // One rank with a receive buffer too small for its layout.
    let mut all = vec![0u8; if r == bad_rank { p - 1 } else { p }];
    let res = comm.allgatherv(&[r as u8], &mut all, &ones, &displs);
    if r == bad_rank {
        v.check_err(res, is_buf, "allgatherv: InvalidBuffer on the bad rank");
    } else {
        v.check(res.is_ok() || matches!(res, Err(Error::InvalidBuffer(_))), || format!("allgatherv: {res:?}"));
    }
    // Overflowing displacement in alltoallv.
    let mut rb = vec![0u8; p];
    let mut sd = displs.clone();
    if r == bad_rank {
        sd[0] = usize::MAX;
    }
    let res = comm.alltoallv(&vec![r as u8; p], &ones, &sd, &mut rb, &ones, &displs);
    if r == bad_rank {
        v.check_err(res, is_buf, "alltoallv: InvalidBuffer on the bad rank");
    }
    // Scan with a short receive buffer on one rank.
    let mut out = vec![0u32; if r == bad_rank { 1 } else { 2 }];
    let res = comm.scan(&[1u32, 2], &mut out, Op::Sum);
    if r == bad_rank {
        v.check_err(res, is_buf, "scan: InvalidBuffer on the bad rank");
    } else {
        v.check(res.is_ok() && out == [r as u32 + 1, 2 * (r as u32 + 1)], || format!("scan beside a bad rank: {res:?} {out:?}"));
    }
    let mut all = vec![0u8; p];
    comm.allgatherv(&[r as u8], &mut all, &ones, &displs)?;
    v.check(all == (0..p as u8).collect::<Vec<_>>(), || "allgatherv after the errors".into());
    Ok(())
}

fn main() -> Result<(), Box<dyn StdError>> {
    let world = tmpi::init()?;
    let (rank, p) = (world.rank(), world.size());
    let mut v = Verdict::new("vcoll", rank);
    v.check(tmpi::is_initialized(), || "is_initialized() is false after init".into());
    v.check(!tmpi::processor_name().is_empty() && tmpi::wtick() > 0.0, || "processor_name or wtick".into());
    for scale in [1, 9000] {
        check_comm(&world, "world", scale, &mut v)?;
    }
    let dup = world.dup()?;
    check_comm(&dup, "dup", 1, &mut v)?;
    let half = world.split(Some((rank % 2) as u32), -(rank as i32))?.ok_or("split with a color returned None")?;
    check_comm(&half, "half", 1, &mut v)?;
    check_comm(&half, "half", 9000, &mut v)?;
    if let Some(s) = world.split((rank % 3 != 2).then_some(1), 0)? {
        check_comm(&s, "partial", 1, &mut v)?;
    }
    check_bad(&world, &mut v)?;
    check_bad(&dup, &mut v)?;
    v.finish(&world, &format!("{p} ranks, world/dup/halves/partial, 8 v-collectives"))?;
    world.finalize()?;
    Ok(())
}
