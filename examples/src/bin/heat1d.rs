//! The 1-D heat equation with insulated ends, explicit finite differences, the rod split
//! into contiguous blocks across ranks.
//!
//! Each step every rank exchanges its edge cells with its neighbours (`isend`/`irecv` inside
//! a `tmpi::scope`), then updates `u[i] += R * (u[i-1] - 2 u[i] + u[i+1])`. Insulated ends
//! mean a ghost cell equal to the edge cell, so the total heat is conserved; `allreduce`
//! checks that. Finally every rank sends its block to rank 0, which reruns the whole rod
//! serially and checks the distributed result is bit-for-bit the same (the arithmetic per
//! cell is identical, whatever the number of ranks).

use std::error::Error;

use tmpi_examples::check;

const NX: usize = 1000;
const STEPS: usize = 500;
const R: f64 = 0.25;
const TO_LEFT: tmpi::Tag = 1;
const TO_RIGHT: tmpi::Tag = 2;
const GATHER: tmpi::Tag = 3;

fn initial(i: usize) -> f64 {
    if (NX / 4..NX / 2).contains(&i) {
        100.0
    } else if i >= 3 * NX / 4 {
        10.0 * ((i - 3 * NX / 4) as f64 / (NX / 4) as f64)
    } else {
        0.0
    }
}

/// One explicit step on `u` (ghosts at both ends) into `next` (interior only).
fn step(u: &[f64], next: &mut [f64]) {
    for (i, v) in next.iter_mut().enumerate() {
        *v = u[i + 1] + R * (u[i] - 2.0 * u[i + 1] + u[i + 2]);
    }
}

fn block(rank: usize, n: usize) -> (usize, usize) {
    (NX * rank / n, NX * (rank + 1) / n)
}

fn serial() -> Vec<f64> {
    let mut u: Vec<f64> = std::iter::once(0.0).chain((0..NX).map(initial)).chain(std::iter::once(0.0)).collect();
    let mut next = vec![0.0; NX];
    for _ in 0..STEPS {
        u[0] = u[1];
        u[NX + 1] = u[NX];
        step(&u, &mut next);
        u[1..=NX].copy_from_slice(&next);
    }
    u[1..=NX].to_vec()
}

fn main() -> Result<(), Box<dyn Error>> {
    let world = tmpi::init()?;
    let (rank, n) = (world.rank(), world.size());
    check(n <= NX, || format!("{n} ranks for {NX} cells"))?;
    let (lo, hi) = block(rank, n);
    let len = hi - lo;
    let left = (rank > 0).then(|| rank - 1);
    let right = (rank + 1 < n).then_some(rank + 1);

    // u[0] and u[len + 1] are ghost cells.
    let mut u: Vec<f64> = std::iter::once(0.0).chain((lo..hi).map(initial)).chain(std::iter::once(0.0)).collect();
    let mut next = vec![0.0; len];
    let local: f64 = u[1..=len].iter().sum();
    let mut total0 = [0.0];
    world.allreduce(&[local], &mut total0, tmpi::Op::Sum)?;

    for _ in 0..STEPS {
        let (ghost_l, ghost_r) = exchange_edges(&world, &u, left, right)?;
        u[0] = ghost_l;
        u[len + 1] = ghost_r;
        step(&u, &mut next);
        u[1..=len].copy_from_slice(&next);
    }

    let local: f64 = u[1..=len].iter().sum();
    let mut total = [0.0];
    world.allreduce(&[local], &mut total, tmpi::Op::Sum)?;
    let drift = ((total[0] - total0[0]) / total0[0]).abs();
    check(drift < 1e-12, || format!("total heat {} -> {} (relative drift {drift:e})", total0[0], total[0]))?;

    if rank == 0 {
        check_on_root(&world, &u[1..=len], total[0])?;
    } else {
        world.send(&u[1..=len], 0, GATHER)?;
    }
    world.finalize()?;
    Ok(())
}

/// Swaps edge cells with the neighbours; returns the ghost cells (an absent neighbour's is
/// this rank's own edge cell: an insulated end).
fn exchange_edges(world: &tmpi::Comm, u: &[f64], left: Option<usize>, right: Option<usize>) -> tmpi::Result<(f64, f64)> {
    let len = u.len() - 2;
    let (send_l, send_r) = ([u[1]], [u[len]]);
    let (mut ghost_l, mut ghost_r) = ([u[1]], [u[len]]);
    tmpi::scope(|s| -> tmpi::Result<()> {
        let mut reqs = Vec::with_capacity(4);
        if let Some(l) = left {
            reqs.push(world.irecv(s, &mut ghost_l, l, TO_RIGHT)?);
            reqs.push(world.isend(s, &send_l, l, TO_LEFT)?);
        }
        if let Some(r) = right {
            reqs.push(world.irecv(s, &mut ghost_r, r, TO_LEFT)?);
            reqs.push(world.isend(s, &send_r, r, TO_RIGHT)?);
        }
        tmpi::wait_all(reqs)?;
        Ok(())
    })?;
    Ok((ghost_l[0], ghost_r[0]))
}

/// On rank 0: gathers every block (`mine`: rank 0's), checks the rod against the serial run
/// and prints the summary.
fn check_on_root(world: &tmpi::Comm, mine: &[f64], total: f64) -> Result<(), Box<dyn Error>> {
    let n = world.size();
    let mut rod = vec![0.0; NX];
    let (lo, hi) = block(0, n);
    rod[lo..hi].copy_from_slice(mine);
    for p in 1..n {
        let (plo, phi) = block(p, n);
        let st = world.recv(&mut rod[plo..phi], p, GATHER)?;
        check(st.count::<f64>() == phi - plo, || format!("rank {p} sent {} cells, expected {}", st.count::<f64>(), phi - plo))?;
    }
    let reference = serial();
    let same = rod.iter().zip(&reference).all(|(a, b)| a.to_bits() == b.to_bits());
    check(same, || "distributed rod differs from the serial run".into())?;
    let peak = rod.iter().copied().fold(f64::MIN, f64::max);
    println!(
        "heat1d: {NX} cells, {STEPS} steps, {n} ranks: total heat {total:.6} conserved, peak {peak:.6}, u[{}] = {:.6}, equal to serial run: OK",
        NX / 2,
        rod[NX / 2]
    );
    Ok(())
}
