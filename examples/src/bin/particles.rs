//! Element types beyond `Pod`, and layouts in every call: a `Particle` with padding, a `bool`,
//! a nested struct, an array and a tuple derives `tmpi::Element`, and goes through the typed
//! calls as it is (packed on the way out, checked and unpacked on the way in; a type without
//! padding, like `Cell`, is sent in place).
//!
//! Each rank passes its particles round a ring (`sendrecv_typed`), sends the live ones to the
//! next rank through a layout that selects every other particle, without packing them itself
//! (`isend_typed`/`irecv_typed` in a scope), gathers one particle per rank at rank 0
//! (`gather_typed`) and shares a grid's column through a layout (`bcast_typed` into a
//! column of every rank's grid). Prints one line from rank 0.

use std::error::Error;

use tmpi::datatype::Layout;
use tmpi::{Buf, BufMut, Element};
use tmpi_examples::check;

/// A cell of a grid: no padding, so it is sent in place.
#[derive(Clone, Copy, Debug, PartialEq, Element)]
struct Cell {
    density: f32,
    owner: u32,
}

/// A particle: padding after `alive` and after `(u8, u16)`, bools inside and out.
#[derive(Clone, Copy, Debug, PartialEq, Element)]
struct Particle {
    alive: bool,
    pos: [f64; 3],
    kind: (u8, u16),
    cell: Cell,
    flags: [bool; 2],
}

const PER_RANK: usize = 8;
const GRID: usize = 4;

fn particle(rank: usize, i: usize) -> Particle {
    let x = (rank * 100 + i) as f64;
    Particle {
        alive: i % 2 == 0,
        pos: [x, -x, x / 2.0],
        kind: (i as u8, (rank * 7) as u16),
        cell: Cell { density: i as f32 * 0.5, owner: rank as u32 },
        flags: [rank % 2 == 0, i % 3 == 0],
    }
}

fn main() -> Result<(), Box<dyn Error>> {
    let world = tmpi::init()?;
    let (me, n) = (world.rank(), world.size());
    let (next, prev) = ((me + 1) % n, (me + n - 1) % n);
    let mine: Vec<Particle> = (0..PER_RANK).map(|i| particle(me, i)).collect();

    // The whole set round the ring.
    let mut from_prev = vec![particle(99, 0); PER_RANK];
    world.sendrecv_typed(&mine, next, 1, &mut from_prev, prev, 1)?;
    let want: Vec<Particle> = (0..PER_RANK).map(|i| particle(prev, i)).collect();
    check(from_prev == want, || format!("rank {me}: ring from {prev} delivered other particles"))?;

    // The live ones (every other) to the next rank, into the front of a fresh array.
    let live = Layout::vector(PER_RANK / 2, 1, 2);
    let mut got = vec![particle(99, 0); PER_RANK];
    let front = Layout::vector(1, PER_RANK / 2, 0);
    let st = tmpi::scope(|s| -> tmpi::Result<tmpi::Status> {
        let r = world.irecv_typed(s, (&mut got, &front), prev, 2)?;
        world.isend_typed(s, (&mine, &live), next, 2)?.wait()?;
        r.wait()
    })?;
    check(st.count_typed::<Particle>() == PER_RANK / 2, || format!("rank {me}: {} live particles", st.count_typed::<Particle>()))?;
    check(got[..PER_RANK / 2].iter().zip(want.iter().step_by(2)).all(|(a, b)| a == b), || format!("rank {me}: live particles"))?;
    check(got[PER_RANK / 2..].iter().all(|p| *p == particle(99, 0)), || format!("rank {me}: past the layout"))?;

    // One particle per rank at rank 0.
    let mut firsts = vec![particle(99, 0); if me == 0 { n } else { 0 }];
    let recv = (me == 0).then(|| BufMut::from(&mut firsts));
    world.gather_typed(Buf::from(&mine[..1]), recv, 0)?;
    if me == 0 {
        check(firsts.iter().enumerate().all(|(r, p)| *p == particle(r, 0)), || "gathered particles".to_string())?;
    }

    // Column 1 of rank 0's grid into column 2 of every rank's grid.
    let mut grid = vec![Cell { density: 0.0, owner: me as u32 }; GRID * GRID];
    if me == 0 {
        for (r, c) in grid.iter_mut().enumerate() {
            c.density = r as f32;
        }
    }
    let col = |c: usize| Layout::vector(GRID, 1, GRID).offset(c);
    let column = if me == 0 { col(1) } else { col(2) };
    world.bcast_typed((&mut grid, &column), 0)?;
    if me != 0 {
        check((0..GRID).all(|r| grid[r * GRID + 2] == Cell { density: (r * GRID + 1) as f32, owner: 0 }), || format!("rank {me}: column"))?;
    }

    let mut all = [0u64];
    world.allreduce(&[1u64], &mut all, tmpi::Op::Sum)?;
    if me == 0 {
        println!("particles: {n} ranks, derived element types with padding and bools through the ring, layouts, gather and bcast: OK");
    }
    check(all[0] == n as u64, || "a rank failed".to_string())?;
    Ok(())
}
