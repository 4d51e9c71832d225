//! Aggregate bandwidth and message rate of several pairs at once, after OSU's `osu_mbw_mr`.
//!
//! With `n` ranks there are `n / 2` pairs: rank `i < n / 2` streams windows of `isend`s to
//! rank `i + n / 2`, which answers each window with a 1-byte acknowledgement (an odd last
//! rank only joins the barriers). Every iteration starts with a barrier of all ranks. The
//! senders' times are averaged; MB/s counts all pairs, messages/s is MB/s over the size.
//! `osu_mbw_mr -m 8:8` is the 8-byte message rate the C peer `msgrate` measures.

use std::process::ExitCode;

use tmpi_bench::{header, options_or_exit, report, require, rows, slot_stride, window_slots, AlignedBuf, BoxError, Family, Options};

const NAME: &str = "osu_mbw_mr";
const DATA: tmpi::Tag = 100;
const ACK: tmpi::Tag = 101;

fn main() -> ExitCode {
    match options_or_exit(NAME, Family::Bandwidth, "") {
        Ok(o) => report(NAME, run(&o)),
        Err(code) => code,
    }
}

fn run(o: &Options) -> Result<(), BoxError> {
    let world = tmpi::init()?;
    let (rank, n) = (world.rank(), world.size());
    require(rank, n >= 2, "This test requires at least two processes")?;
    let pairs = n / 2;
    let w = o.window;
    let senders = world.split(Some(u32::from(rank < pairs)), 0)?.ok_or("split with a color returned no communicator")?;
    let sbuf = AlignedBuf::alloc(&world, o.buffers, o.max_size, b'a')?;
    let mut rbuf = AlignedBuf::alloc(&world, o.buffers, slot_stride(o.max_size) * w, b'b')?;
    let mut ack = [0u8; 1];
    if rank == 0 {
        println!("# tmpi OSU-style Multiple Bandwidth / Message Rate Test");
        println!("# [ pairs: {pairs} ] [ window size: {w} ]");
        println!("{}", header(&["MB/s", "Messages/s"]));
    }
    for size in o.sizes().filter(|&s| s > 0) {
        let (iters, skip) = o.loops(size);
        let s = &sbuf.as_slice()[..size];
        let mut slots = window_slots(rbuf.as_mut_slice(), size, w)?;
        for slot in slots.iter_mut() {
            slot.fill(b'b');
        }
        world.barrier()?;
        let mut t = 0.0;
        for i in 0..iters + skip {
            world.barrier()?;
            if rank < pairs {
                let dt = send_window(&world, s, rank + pairs, w, &mut ack)?;
                if i >= skip {
                    t += dt;
                }
            } else if rank < 2 * pairs {
                recv_window(&world, &mut slots, rank - pairs, &s[..1])?;
            }
        }
        let mut t_sum = [0.0f64];
        let root = senders.rank() == 0;
        senders.reduce(&[t], root.then_some(&mut t_sum[..]), tmpi::Op::Sum, 0)?;
        if rank == 0 {
            let t_avg = t_sum[0] / pairs as f64;
            let bw = size as f64 / 1e6 * pairs as f64 * iters as f64 * w as f64 / t_avg;
            println!("{}", rows(size, &[bw, bw * 1e6 / size as f64]));
        }
    }
    world.finalize()?;
    Ok(())
}

/// A sender's iteration: a window of `w` `isend`s of `s` to `target`, then its
/// acknowledgement; returns the seconds it took.
fn send_window(world: &tmpi::World, s: &[u8], target: usize, w: usize, ack: &mut [u8; 1]) -> tmpi::Result<f64> {
    let t0 = tmpi::wtime();
    tmpi::scope(|sc| -> tmpi::Result<()> {
        let mut reqs = Vec::with_capacity(w);
        for _ in 0..w {
            reqs.push(world.isend(sc, s, target, DATA)?);
        }
        tmpi::wait_all(reqs)?;
        Ok(())
    })?;
    world.recv(ack, target, ACK)?;
    Ok(tmpi::wtime() - t0)
}

/// A receiver's iteration: a window of `irecv`s from `source`, one per slot, then the
/// acknowledgement `ack`.
fn recv_window(world: &tmpi::World, slots: &mut [&mut [u8]], source: usize, ack: &[u8]) -> tmpi::Result<()> {
    tmpi::scope(|sc| -> tmpi::Result<()> {
        let mut reqs = Vec::with_capacity(slots.len());
        for slot in slots.iter_mut() {
            reqs.push(world.irecv(sc, slot, source, DATA)?);
        }
        tmpi::wait_all(reqs)?;
        Ok(())
    })?;
    world.send(ack, source, ACK)
}
