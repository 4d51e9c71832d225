//! Computes pi as the integral of 4/(1+x^2) over [0, 1] with the midpoint rule.
//!
//! The `INTERVALS` intervals are split into contiguous blocks, one per rank; each rank sums
//! its block with rayon in fixed-size chunks (so its partial sum does not depend on how
//! rayon schedules the work), then `allreduce` adds the partial sums. Rank 0 checks the
//! error against `f64::consts::PI` and prints pi to 10 decimals.

use std::error::Error;

use rayon::prelude::*;
use tmpi_examples::check;

const INTERVALS: u64 = 20_000_000;
const CHUNK: u64 = 1 << 16;
const TOLERANCE: f64 = 1e-10;

fn block_sum(lo: u64, hi: u64) -> f64 {
    let h = 1.0 / INTERVALS as f64;
    let chunks = (hi - lo).div_ceil(CHUNK);
    let partial: Vec<f64> = (0..chunks)
        .into_par_iter()
        .map(|c| {
            let (a, b) = (lo + c * CHUNK, (lo + (c + 1) * CHUNK).min(hi));
            (a..b)
                .map(|i| {
                    let x = (i as f64 + 0.5) * h;
                    4.0 / (1.0 + x * x)
                })
                .sum::<f64>()
        })
        .collect();
    partial.iter().sum::<f64>() * h
}

fn main() -> Result<(), Box<dyn Error>> {
    let world = tmpi::init()?;
    let (rank, n) = (world.rank() as u64, world.size() as u64);
    let lo = INTERVALS * rank / n;
    let hi = INTERVALS * (rank + 1) / n;
    let mine = block_sum(lo, hi);
    let mut pi = [0.0f64];
    world.allreduce(&[mine], &mut pi, tmpi::Op::Sum)?;
    // Every rank checks the reduced value: allreduce must give all ranks the same sum.
    let err = (pi[0] - std::f64::consts::PI).abs();
    check(err < TOLERANCE, || format!("rank {rank}: pi = {:.15}, error {err:e}", pi[0]))?;
    if rank == 0 {
        println!("pi: {INTERVALS} intervals over {n} ranks: pi = {:.10}, |error| < {TOLERANCE:e}: OK", pi[0]);
    }
    world.finalize()?;
    Ok(())
}
