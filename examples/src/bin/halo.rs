//! A 2-D halo exchange on a Cartesian grid of ranks: a 5-point smoothing stencil on a field
//! split into `N x N` tiles, one per rank.
//!
//! `tmpi::dims_create` picks the grid of ranks, `cart_create` makes it (non-periodic along
//! the rows, so the top and bottom ranks have no neighbour there and keep a fixed zero
//! boundary; periodic along the columns). Each step every rank packs its four edges and swaps
//! them with its neighbours in one `neighbor_alltoall`, then updates its tile. A
//! `neighbor_allgather` of coordinates checks the neighbours first. At the end rank 0 gathers
//! the tiles, recomputes the whole field serially and checks the distributed result is
//! bit-for-bit the same (each cell is computed by the same expression in both).

use std::error::Error;

use tmpi_examples::check;

/// Tile edge (interior cells per rank along each dimension).
const N: usize = 16;
const STEPS: usize = 50;
/// Tile with a one-cell ghost border.
const W: usize = N + 2;

fn initial(gi: usize, gj: usize) -> f64 {
    ((gi * 31 + gj * 17) % 23) as f64
}

/// The stencil, one expression for the distributed and the serial run.
fn stencil(c: f64, up: f64, down: f64, left: f64, right: f64) -> f64 {
    0.5 * c + 0.125 * (up + down + left + right)
}

/// Runs the serial reference on the whole `rows x cols` field (rows bounded by zeros,
/// columns periodic).
fn serial(rows: usize, cols: usize) -> Vec<f64> {
    let mut u: Vec<f64> = (0..rows * cols).map(|k| initial(k / cols, k % cols)).collect();
    let mut next = u.clone();
    for _ in 0..STEPS {
        for i in 0..rows {
            for j in 0..cols {
                let at = |i: usize, j: usize| u[i * cols + j];
                let up = if i == 0 { 0.0 } else { at(i - 1, j) };
                let down = if i + 1 == rows { 0.0 } else { at(i + 1, j) };
                let left = at(i, (j + cols - 1) % cols);
                let right = at(i, (j + 1) % cols);
                next[i * cols + j] = stencil(at(i, j), up, down, left, right);
            }
        }
        std::mem::swap(&mut u, &mut next);
    }
    u
}

fn main() -> Result<(), Box<dyn Error>> {
    let world = tmpi::init()?;
    let n = world.size();
    let mut dims = [0, 0];
    tmpi::dims_create(n, &mut dims)?;
    let cart = world.cart_create(&dims, &[false, true], true)?.ok_or("every rank is in a full grid")?;
    check_neighbours(&cart, dims)?;
    let u = run(&cart)?;
    let tile: Vec<f64> = (0..N * N).map(|k| u[(k / N + 1) * W + k % N + 1]).collect();
    let mut all = vec![0.0f64; if cart.rank() == 0 { n * N * N } else { 0 }];
    cart.gather(&tile, (cart.rank() == 0).then_some(&mut all[..]), 0)?;
    if cart.rank() == 0 {
        verify(&cart, dims, &all)?;
        println!(
            "halo: {n} ranks as {} x {} grid of {N}x{N} tiles, {STEPS} steps of neighbor_alltoall halo exchange: OK",
            dims[0], dims[1]
        );
    }
    world.finalize()?;
    Ok(())
}

/// Checks that the neighbours agree with the coordinates: the one at -1 (+1) along `d` is one
/// less (more), and only the rows' ends lack one.
fn check_neighbours(cart: &tmpi::CartComm, dims: [usize; 2]) -> Result<(), Box<dyn Error>> {
    let me = cart.coords();
    let mut nb = [[usize::MAX; 2]; 4];
    cart.neighbor_allgather(&[[me[0], me[1]]], &mut nb)?;
    for (k, (who, got)) in cart.neighbors().into_iter().zip(nb).enumerate() {
        let (d, step) = (k / 2, if k % 2 == 0 { dims[k / 2] - 1 } else { 1 });
        match who {
            Some(_) => {
                let want = (me[d] + step) % dims[d];
                check(got[d] == want && got[1 - d] == me[1 - d], || format!("neighbour {k} of {me:?} has coordinates {got:?}"))?;
            }
            None => check(d == 0 && got == [usize::MAX; 2], || format!("missing neighbour {k} of {me:?}"))?,
        }
    }
    Ok(())
}

/// Runs the distributed steps on this rank's tile; returns the tile, row-major with ghosts
/// (interior cell (i, j) at (i + 1) * W + j + 1).
fn run(cart: &tmpi::CartComm) -> Result<Vec<f64>, Box<dyn Error>> {
    let me = cart.coords();
    let (gi0, gj0) = (me[0] * N, me[1] * N);
    let mut u = vec![0.0f64; W * W];
    for i in 0..N {
        for j in 0..N {
            u[(i + 1) * W + j + 1] = initial(gi0 + i, gj0 + j);
        }
    }
    let mut next = u.clone();
    let mut send = vec![0.0f64; 4 * N];
    let mut recv = vec![0.0f64; 4 * N];
    for _ in 0..STEPS {
        pack(&u, &mut send);
        // An absent neighbour's block stays as set here: the fixed zero boundary.
        recv.fill(0.0);
        cart.neighbor_alltoall(&send, &mut recv)?;
        unpack(&recv, &mut u);
        for i in 1..=N {
            for j in 1..=N {
                next[i * W + j] = stencil(u[i * W + j], u[(i - 1) * W + j], u[(i + 1) * W + j], u[i * W + j - 1], u[i * W + j + 1]);
            }
        }
        std::mem::swap(&mut u, &mut next);
    }
    Ok(u)
}

/// Packs the tile's four edges in neighbour order: up (-1 along rows), down, left (-1 along
/// columns), right.
fn pack(u: &[f64], send: &mut [f64]) {
    for k in 0..N {
        send[k] = u[W + k + 1];
        send[N + k] = u[N * W + k + 1];
        send[2 * N + k] = u[(k + 1) * W + 1];
        send[3 * N + k] = u[(k + 1) * W + N];
    }
}

/// Writes the neighbours' edges (in [`pack`]'s order) into the tile's ghost border.
fn unpack(recv: &[f64], u: &mut [f64]) {
    for k in 0..N {
        u[k + 1] = recv[k];
        u[(N + 1) * W + k + 1] = recv[N + k];
        u[(k + 1) * W] = recv[2 * N + k];
        u[(k + 1) * W + N + 1] = recv[3 * N + k];
    }
}

/// On rank 0: every gathered tile (`all`, in rank order) is bit-for-bit the serial run's.
fn verify(cart: &tmpi::CartComm, dims: [usize; 2], all: &[f64]) -> Result<(), Box<dyn Error>> {
    let (rows, cols) = (dims[0] * N, dims[1] * N);
    let want = serial(rows, cols);
    let mut bad = 0usize;
    for r in 0..cart.size() {
        let c = cart.coords_of(r)?;
        for k in 0..N * N {
            let (gi, gj) = (c[0] * N + k / N, c[1] * N + k % N);
            if all[r * N * N + k].to_bits() != want[gi * cols + gj].to_bits() {
                bad += 1;
            }
        }
    }
    check(bad == 0, || format!("{bad} cells differ from the serial run"))?;
    Ok(())
}
