//! `allreduce` latency, after OSU's `osu_allreduce`: `f32` sums of `size / 4` elements.
//!
//! Each iteration times one `allreduce` and then passes a barrier (outside the timing); every
//! rank averages its own times and rank 0 prints the mean over ranks (with `-f` also the
//! minimum, maximum and iteration count).

use std::process::ExitCode;

use tmpi_bench::{coll_header, coll_row, options_or_exit, preamble, reduce_stats, report, require, AlignedBuf, BoxError, Family, Options};

const NAME: &str = "osu_allreduce";
const ELEM: usize = std::mem::size_of::<f32>();

fn main() -> ExitCode {
    match options_or_exit(NAME, Family::Collective, "") {
        Ok(o) => report(NAME, run(&o)),
        Err(code) => code,
    }
}

fn run(o: &Options) -> Result<(), BoxError> {
    let world = tmpi::init()?;
    let rank = world.rank();
    require(rank, world.size() >= 2, "This test requires at least two processes")?;
    let max_elems = o.max_size / ELEM;
    let mut sbuf = AlignedBuf::alloc(&world, o.buffers, max_elems * ELEM, 0)?;
    let mut rbuf = AlignedBuf::alloc(&world, o.buffers, max_elems * ELEM, 0)?;
    if rank == 0 {
        println!("{}", preamble("tmpi OSU-style Allreduce Latency Test"));
        println!("{}", coll_header(true, o.full));
    }
    for size in o.sizes() {
        let count = size / ELEM;
        if count == 0 {
            continue;
        }
        let (iters, skip) = o.loops(size);
        let send: &mut [f32] = bytemuck::cast_slice_mut(&mut sbuf.as_mut_slice()[..count * ELEM]);
        send.fill(1.0);
        let send: &[f32] = send;
        let recv: &mut [f32] = bytemuck::cast_slice_mut(&mut rbuf.as_mut_slice()[..count * ELEM]);
        world.barrier()?;
        let mut timer = 0.0;
        for i in 0..iters + skip {
            let t0 = tmpi::wtime();
            world.allreduce(send, recv, tmpi::Op::Sum)?;
            let t1 = tmpi::wtime();
            world.barrier()?;
            if i >= skip {
                timer += t1 - t0;
            }
        }
        let (avg, min, max) = reduce_stats(&world, timer * 1e6 / iters as f64)?;
        if rank == 0 {
            println!("{}", coll_row(Some(size), avg, min, max, o.full.then_some(iters)));
        }
        world.barrier()?;
    }
    world.finalize()?;
    Ok(())
}
