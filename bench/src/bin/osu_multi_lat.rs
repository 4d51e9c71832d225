//! Latency of several ping-pong pairs at once, after OSU's `osu_multi_lat`.
//!
//! With `n` ranks, rank `i < n / 2` ping-pongs with rank `i + n / 2` (an odd last rank only
//! joins the barriers); the figure is the one-way latency averaged over the pairs.

use std::process::ExitCode;

use tmpi_bench::{header, options_or_exit, preamble, report, require, row, AlignedBuf, BoxError, Family, Options};

const NAME: &str = "osu_multi_lat";
const TAG: tmpi::Tag = 1;

fn main() -> ExitCode {
    match options_or_exit(NAME, Family::Latency, "") {
        Ok(o) => report(NAME, run(&o)),
        Err(code) => code,
    }
}

fn run(o: &Options) -> Result<(), BoxError> {
    let world = tmpi::init()?;
    let (rank, n) = (world.rank(), world.size());
    require(rank, n >= 2, "This test requires at least two processes")?;
    let pairs = n / 2;
    let senders = world.split(Some(u32::from(rank < pairs)), 0)?.ok_or("split with a color returned no communicator")?;
    let mut sbuf = AlignedBuf::alloc(&world, o.buffers, o.max_size, b'a')?;
    let mut rbuf = AlignedBuf::alloc(&world, o.buffers, o.max_size, b'b')?;
    if rank == 0 {
        println!("{}", preamble("tmpi OSU-style Multi Latency Test"));
        println!("{}", header(&["Avg Latency(us)"]));
    }
    for size in o.sizes() {
        let (iters, skip) = o.loops(size);
        sbuf.fill_prefix(size, b'a');
        rbuf.fill_prefix(size, b'b');
        let (s, r) = (&sbuf.as_slice()[..size], &mut rbuf.as_mut_slice()[..size]);
        world.barrier()?;
        let mut total = 0.0;
        if rank < pairs {
            let partner = rank + pairs;
            for i in 0..iters + skip {
                let t0 = tmpi::wtime();
                world.send(s, partner, TAG)?;
                world.recv(r, partner, TAG)?;
                if i >= skip {
                    total += tmpi::wtime() - t0;
                }
            }
        } else if rank < 2 * pairs {
            let partner = rank - pairs;
            for _ in 0..iters + skip {
                world.recv(r, partner, TAG)?;
                world.send(s, partner, TAG)?;
            }
        }
        let mut sum = [0.0f64];
        let root = senders.rank() == 0;
        senders.reduce(&[total], root.then_some(&mut sum[..]), tmpi::Op::Sum, 0)?;
        if rank == 0 {
            println!("{}", row(size, sum[0] / pairs as f64 * 1e6 / (2.0 * iters as f64)));
        }
    }
    world.finalize()?;
    Ok(())
}
