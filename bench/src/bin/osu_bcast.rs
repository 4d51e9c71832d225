//! `bcast` latency from rank 0, after OSU's `osu_bcast`: `size` bytes.
//!
//! Each iteration times one `bcast` and then passes a barrier (outside the timing); rank 0
//! prints the mean over ranks of each rank's average (with `-f` also min, max, iterations).

use std::process::ExitCode;

use tmpi_bench::{coll_header, coll_row, options_or_exit, preamble, reduce_stats, report, require, AlignedBuf, BoxError, Family, Options};

const NAME: &str = "osu_bcast";

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
    let mut buf = AlignedBuf::alloc(&world, o.buffers, o.max_size, 1)?;
    if rank == 0 {
        println!("{}", preamble("tmpi OSU-style Broadcast Latency Test"));
        println!("{}", coll_header(true, o.full));
    }
    for size in o.sizes().filter(|&s| s > 0) {
        let (iters, skip) = o.loops(size);
        let b = &mut buf.as_mut_slice()[..size];
        world.barrier()?;
        let mut timer = 0.0;
        for i in 0..iters + skip {
            let t0 = tmpi::wtime();
            world.bcast(b, 0)?;
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
    }
    world.finalize()?;
    Ok(())
}
