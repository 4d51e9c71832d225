//! Ping-pong latency between ranks 0 and 1, after OSU's `osu_latency`.
//!
//! For each size, rank 0 sends and waits for the same size back; the reported latency is
//! half the mean round trip over the timed iterations (warm-up iterations excluded).

use std::process::ExitCode;

use tmpi_bench::{header, options_or_exit, preamble, report, require, row, AlignedBuf, BoxError, Family, Options};

const NAME: &str = "osu_latency";
const TAG: tmpi::Tag = 1;

fn main() -> ExitCode {
    match options_or_exit(NAME, Family::Latency, "") {
        Ok(o) => report(NAME, run(&o)),
        Err(code) => code,
    }
}

fn run(o: &Options) -> Result<(), BoxError> {
    let world = tmpi::init()?;
    let rank = world.rank();
    require(rank, world.size() == 2, "This test requires exactly two processes")?;
    let mut sbuf = AlignedBuf::alloc(&world, o.buffers, o.max_size, b'a')?;
    let mut rbuf = AlignedBuf::alloc(&world, o.buffers, o.max_size, b'b')?;
    if rank == 0 {
        println!("{}", preamble("tmpi OSU-style Latency Test"));
        println!("{}", header(&["Avg Latency(us)"]));
    }
    for size in o.sizes() {
        let (iters, skip) = o.loops(size);
        sbuf.fill_prefix(size, b'a');
        rbuf.fill_prefix(size, b'b');
        let (s, r) = (&sbuf.as_slice()[..size], &mut rbuf.as_mut_slice()[..size]);
        world.barrier()?;
        let mut total = 0.0;
        if rank == 0 {
            for i in 0..iters + skip {
                let t0 = tmpi::wtime();
                world.send(s, 1, TAG)?;
                world.recv(r, 1, TAG)?;
                if i >= skip {
                    total += tmpi::wtime() - t0;
                }
            }
            println!("{}", row(size, total * 1e6 / (2.0 * iters as f64)));
        } else {
            for _ in 0..iters + skip {
                world.recv(r, 0, TAG)?;
                world.send(s, 0, TAG)?;
            }
        }
    }
    world.finalize()?;
    Ok(())
}
