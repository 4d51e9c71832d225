//! Overlaps communication with computation: each rank starts a non-blocking allreduce of its
//! previous step's partial result, computes the next step meanwhile (polling the request now
//! and then so the collective progresses), then waits. At the end a user-defined MAXLOC
//! reduction finds which rank held the largest value, and a non-commutative user operator
//! (composition of affine maps) checks that reductions combine in rank order.

use std::error::Error;

use tmpi::{Loc, Op, UserOp};
use tmpi_examples::check;

const STEPS: u64 = 20;
const WORK: u64 = 200_000;

/// Some deterministic work: a partial harmonic sum over this rank's slice of step `step`.
fn compute(rank: u64, n: u64, step: u64) -> f64 {
    let (lo, hi) = (WORK * rank / n, WORK * (rank + 1) / n);
    (lo..hi).map(|i| 1.0 / ((i + step * WORK + 1) as f64)).sum()
}

fn main() -> Result<(), Box<dyn Error>> {
    let world = tmpi::init()?;
    let (rank, n) = (world.rank() as u64, world.size() as u64);
    let mut total = 0.0f64;
    let mut pending = [compute(rank, n, 0)];
    for step in 1..=STEPS {
        let mut sum = [0.0f64];
        let next = tmpi::scope(|s| -> tmpi::Result<f64> {
            let mut req = world.iallreduce(s, &pending, &mut sum, Op::Sum)?;
            // Compute the next step in slices, letting the collective progress in between.
            let mut acc = 0.0;
            let (lo, hi) = (WORK * rank / n, WORK * (rank + 1) / n);
            for chunk in (lo..hi).collect::<Vec<_>>().chunks(4096) {
                acc += chunk.iter().map(|&i| 1.0 / ((i + step * WORK + 1) as f64)).sum::<f64>();
                let _ = req.test()?;
            }
            req.wait()?;
            Ok(acc)
        })?;
        total += sum[0];
        pending = [next];
    }
    // The same sum computed without overlap, step by step.
    let mut want = 0.0;
    for step in 0..STEPS {
        let mut s = [0.0f64];
        world.allreduce(&[compute(rank, n, step)], &mut s, Op::Sum)?;
        want += s[0];
    }
    // Both add the same numbers, in orders that may differ in the last bits.
    check((total - want).abs() <= 1e-12 * want.abs(), || format!("rank {rank}: overlapped sum {total} != plain sum {want}"))?;
    // A non-blocking allreduce gives every rank bitwise the same value.
    let mut lo_hi = [0.0f64; 2];
    world.allreduce(&[total, -total], &mut lo_hi, Op::Min)?;
    check(lo_hi[0] == total && -lo_hi[1] == total, || format!("rank {rank}: ranks disagree on the sum"))?;

    // MAXLOC: which rank has the largest value ((rank * 7) mod n)?
    let mine = [Loc { value: ((rank * 7) % n) as f64, index: rank }];
    let mut best = [Loc { value: 0.0, index: 0 }];
    world.allreduce_with(&mine, &mut best, &UserOp::max_loc())?;
    let want_best = (0..n).max_by_key(|&r| ((r * 7) % n, std::cmp::Reverse(r))).unwrap_or(0);
    check(best[0].index == want_best, || format!("rank {rank}: maxloc says rank {}, expected {want_best}", best[0].index))?;

    // Compose x -> 2x + rank in rank order: the result is x -> 2^n x + sum(rank * 2^(n-1-rank)).
    let compose = UserOp::new(false, |f: &[i64; 2], g: &[i64; 2]| [g[0] * f[0], g[0] * f[1] + g[1]]);
    let mut map = [[0i64; 2]];
    world.allreduce_with(&[[2, rank as i64]], &mut map, &compose)?;
    let want_b: i64 = (0..n as i64).map(|r| r << (n as i64 - 1 - r)).sum();
    check(map[0] == [1 << n, want_b], || format!("rank {rank}: composed map {:?}", map[0]))?;

    if rank == 0 {
        println!("overlap: {STEPS} overlapped allreduces over {n} ranks: sum = {total:.9}, maxloc at rank {}: OK", best[0].index);
    }
    world.finalize()?;
    Ok(())
}
