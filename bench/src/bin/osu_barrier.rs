//! `barrier` latency, after OSU's `osu_barrier`: one line, no size column.

use std::process::ExitCode;

use tmpi_bench::{coll_header, coll_row, options_or_exit, preamble, reduce_stats, report, require, BoxError, Family, Options};

const NAME: &str = "osu_barrier";

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
    // OSU times barriers with the small-message counts.
    let (iters, skip) = o.loops(0);
    if rank == 0 {
        println!("{}", preamble("tmpi OSU-style Barrier Latency Test"));
        println!("{}", coll_header(false, o.full));
    }
    let mut timer = 0.0;
    for i in 0..iters + skip {
        let t0 = tmpi::wtime();
        world.barrier()?;
        let t1 = tmpi::wtime();
        if i >= skip {
            timer += t1 - t0;
        }
    }
    world.barrier()?;
    let (avg, min, max) = reduce_stats(&world, timer * 1e6 / iters as f64)?;
    if rank == 0 {
        println!("{}", coll_row(None, avg, min, max, o.full.then_some(iters)));
    }
    world.finalize()?;
    Ok(())
}
