//! Arranges the ranks in a `rows x cols` grid, splits the world into row and column
//! communicators, and checks sizes, ranks and an `allreduce` on each.
//!
//! `cols` is the smallest divisor of the world size that is at least its square root, so any
//! size works (a prime size gives one row). A third split keeps only the even ranks, with
//! keys that reverse their order, and checks that odd ranks get `None`. Every rank checks its
//! own results; a final `allreduce` of the verdicts lets rank 0 speak for all.

use std::error::Error;

use tmpi::Op;
use tmpi_examples::check;

fn grid(n: usize) -> (usize, usize) {
    let cols = (1..=n).find(|&c| n % c == 0 && c * c >= n).unwrap_or(n);
    (n / cols, cols)
}

fn local_checks(world: &tmpi::Comm) -> Result<Vec<String>, tmpi::Error> {
    let mut bad = Vec::new();
    grid_checks(world, &mut bad)?;
    evens_check(world, &mut bad)?;
    Ok(bad)
}

/// A row and a column communicator of the rank grid: sizes, ranks, sums, max and min.
fn grid_checks(world: &tmpi::Comm, bad: &mut Vec<String>) -> Result<(), tmpi::Error> {
    let (rank, n) = (world.rank(), world.size());
    let (rows, cols) = grid(n);
    let (r, c) = (rank / cols, rank % cols);
    let row = world.split(Some(r as u32), c as i32)?;
    let col = world.split(Some(c as u32), r as i32)?;
    let (Some(row), Some(col)) = (row, col) else {
        bad.push("split with a color returned None".to_string());
        return Ok(());
    };
    if row.size() != cols || row.rank() != c {
        bad.push(format!("row comm: size {} rank {}, expected {cols} {c}", row.size(), row.rank()));
    }
    if col.size() != rows || col.rank() != r {
        bad.push(format!("col comm: size {} rank {}, expected {rows} {r}", col.size(), col.rank()));
    }
    let me = [rank as u64];
    let mut got = [0u64];
    row.allreduce(&me, &mut got, Op::Sum)?;
    let (r64, c64, cols64, rows64) = (r as u64, c as u64, cols as u64, rows as u64);
    let want = r64 * cols64 * cols64 + cols64 * (cols64 - 1) / 2;
    if got[0] != want {
        bad.push(format!("row {r} sum {} expected {want}", got[0]));
    }
    col.allreduce(&me, &mut got, Op::Sum)?;
    let want = cols64 * rows64 * (rows64 - 1) / 2 + rows64 * c64;
    if got[0] != want {
        bad.push(format!("column {c} sum {} expected {want}", got[0]));
    }
    row.allreduce(&me, &mut got, Op::Max)?;
    if got[0] != r64 * cols64 + cols64 - 1 {
        bad.push(format!("row {r} max {}", got[0]));
    }
    col.allreduce(&me, &mut got, Op::Min)?;
    if got[0] != c64 {
        bad.push(format!("column {c} min {}", got[0]));
    }
    Ok(())
}

/// Even ranks only, in reverse order; the odd ones get no communicator.
fn evens_check(world: &tmpi::Comm, bad: &mut Vec<String>) -> Result<(), tmpi::Error> {
    let (rank, n) = (world.rank(), world.size());
    let color = (rank % 2 == 0).then_some(0);
    let evens = world.split(color, -(rank as i32))?;
    let n_even = n.div_ceil(2);
    match (rank % 2 == 0, evens) {
        (true, Some(e)) => {
            let want_rank = n_even - 1 - rank / 2;
            if e.size() != n_even || e.rank() != want_rank {
                bad.push(format!("evens comm: size {} rank {}, expected {n_even} {want_rank}", e.size(), e.rank()));
            }
            let mut top = [0u64];
            // The new rank 0 is the highest even world rank; bcast its world rank.
            if e.rank() == 0 {
                top[0] = rank as u64;
            }
            e.bcast(&mut top, 0)?;
            let want_top = (2 * (n_even - 1)) as u64;
            if top[0] != want_top {
                bad.push(format!("evens bcast gave {} expected {want_top}", top[0]));
            }
        }
        (false, None) => {}
        (even, got) => bad.push(format!("even={even} but split returned {}", if got.is_some() { "a comm" } else { "None" })),
    }
    Ok(())
}

fn main() -> Result<(), Box<dyn Error>> {
    let world = tmpi::init()?;
    let (rank, n) = (world.rank(), world.size());
    let bad = local_checks(&world)?;
    for b in &bad {
        eprintln!("split: rank {rank}: {b}");
    }
    let mut failures = [0u32];
    world.allreduce(&[bad.len() as u32], &mut failures, Op::Sum)?;
    check(failures[0] == 0, || format!("{} failed checks across ranks", failures[0]))?;
    if rank == 0 {
        let (rows, cols) = grid(n);
        println!("split: {n} ranks as {rows} x {cols} grid; row, column and even-rank communicators: OK");
    }
    world.finalize()?;
    Ok(())
}
