//! rayon and tmpi together, at `Threading::Multiple`: MPI+threads in safe Rust.
//!
//! Every rank owns `CHUNKS` chunks of a vector. Step 1, a pipeline: the main thread posts one
//! receive per chunk (from the left neighbour, tag = chunk) in a scope, while rayon tasks
//! transform the chunks in parallel and each task sends its chunk to the right neighbour as
//! soon as it is done, from whatever pool thread it runs on. Step 2, many-to-one: every rank
//! sends rank 0 one partial sum per chunk from rayon tasks, and rank 0 receives them in rayon
//! tasks too (once the sends are out), each task naming the (source, tag) it wants. Step 3: `allreduce` on the main
//! thread checks the grand total.
//!
//! One rule keeps such a program from deadlocking: a pool task must not block on something
//! that only another pool task can provide (of this rank or of another), because a blocked
//! task holds its pool thread and the pools may be busy with other tasks. Here the tasks that
//! block in `recv` wait only for messages whose sends already started, and a send waits only
//! for the receiving rank's progress, which any of its threads waiting in tmpi drives.

use std::error::Error;

use rayon::prelude::*;
use tmpi::Threading;
use tmpi_examples::check;

const CHUNKS: usize = 16;
const LEN: usize = 1000;

/// Element `i` of chunk `c` of rank `r`.
fn value(r: usize, c: usize, i: usize) -> u64 {
    (r * 1_000_003 + c * 1009 + i) as u64
}

/// What step 1 does to every element.
fn transform(x: u64) -> u64 {
    x.wrapping_mul(x) ^ 0x5555
}

fn main() -> Result<(), Box<dyn Error>> {
    let (world, provided) = tmpi::init_thread(Threading::Multiple)?;
    check(provided == Threading::Multiple, || format!("provided {provided:?}"))?;
    let (rank, n) = (world.rank(), world.size());
    let w = &*world;
    exchange_chunks(w)?;
    let at_root = partial_sums(w)?;

    // Step 3: the grand total, on the main thread.
    let local: u64 = (0..CHUNKS).into_par_iter().map(|c| partial(rank, c)).sum();
    let mut total = [0u64];
    world.allreduce(&[local], &mut total, tmpi::Op::Sum)?;
    let want: u64 = (0..n).flat_map(|r| (0..CHUNKS).map(move |c| (r, c))).map(|(r, c)| partial(r, c)).sum();
    check(total[0] == want, || format!("rank {rank}: total {} != {want}", total[0]))?;
    check(rank != 0 || at_root == want, || format!("rank 0 received partial sums adding to {at_root}, want {want}"))?;

    if rank == 0 {
        println!(
            "rayon_hybrid: {CHUNKS} chunks per rank on {n} ranks sent from rayon tasks at Threading::Multiple, {} partial sums received by rayon tasks, total {want}: OK",
            n * CHUNKS
        );
    }
    world.finalize()?;
    Ok(())
}

/// Step 1: receives from the left posted by the main thread, sends to the right from rayon
/// tasks; every chunk checked.
fn exchange_chunks(w: &tmpi::Comm) -> Result<(), Box<dyn Error>> {
    let (rank, n) = (w.rank(), w.size());
    let (right, left) = ((rank + 1) % n, (rank + n - 1) % n);
    let mine: Vec<Vec<u64>> = (0..CHUNKS).map(|c| (0..LEN).map(|i| value(rank, c, i)).collect()).collect();
    let mut got = vec![vec![0u64; LEN]; CHUNKS];
    tmpi::scope(|s| -> tmpi::Result<()> {
        let mut reqs = Vec::with_capacity(CHUNKS);
        for (c, buf) in got.iter_mut().enumerate() {
            reqs.push(w.irecv(s, buf, left, c as u32)?);
        }
        mine.par_iter().enumerate().try_for_each(|(c, chunk)| {
            let out: Vec<u64> = chunk.iter().map(|&x| transform(x)).collect();
            w.send(&out, right, c as u32)
        })?;
        tmpi::wait_all(reqs).map(drop)
    })?;
    let step1 = got.par_iter().enumerate().all(|(c, buf)| buf.iter().enumerate().all(|(i, &x)| x == transform(value(left, c, i))));
    check(step1, || format!("rank {rank}: chunks from rank {left} are wrong"))?;
    Ok(())
}

/// The sum of chunk `c` of rank `r`.
fn partial(r: usize, c: usize) -> u64 {
    (0..LEN).map(|i| value(r, c, i)).sum::<u64>()
}

/// Step 2: partial sums to rank 0, sent and received by rayon tasks; rank 0 returns their
/// total (the others 0).
fn partial_sums(w: &tmpi::Comm) -> tmpi::Result<u64> {
    let (rank, n) = (w.rank(), w.size());
    let tag = |c: usize| 100 + c as u32;
    (0..CHUNKS).into_par_iter().try_for_each(|c| w.send(&[partial(rank, c)], 0, tag(c)))?;
    if rank != 0 {
        return Ok(0);
    }
    (0..n * CHUNKS)
        .into_par_iter()
        .map(|k| {
            let (src, c) = (k / CHUNKS, k % CHUNKS);
            let mut x = [0u64];
            w.recv(&mut x, src, tag(c))?;
            if x[0] != partial(src, c) {
                return Err(tmpi::Error::InvalidBuffer(format!("partial sum of chunk {c} of rank {src}: {}", x[0])));
            }
            Ok(x[0])
        })
        .sum::<tmpi::Result<u64>>()
}
