//! Unidirectional bandwidth from rank 0 to rank 1, after OSU's `osu_bw`.
//!
//! Each iteration rank 0 starts a window of `isend`s and waits for them; rank 1 posts a window
//! of `irecv`s (one buffer slot each, since a buffer lent to a request cannot be shared) and
//! answers with a 1-byte acknowledgement once all have arrived. Bandwidth is in MB/s
//! (10^6 bytes per second), as OSU reports it.

use std::process::ExitCode;

use tmpi_bench::{
    header, options_or_exit, preamble, report, require, row, slot_stride, window_slots, AlignedBuf, BoxError, Family, Options,
};

thread_local!(static PH: std::cell::RefCell<[f64;4]> = const { std::cell::RefCell::new([0.0;4]) });
const NAME: &str = "osu_bw";
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
    let rank = world.rank();
    require(rank, world.size() == 2, "This test requires exactly two processes")?;
    let w = o.window;
    let sbuf = AlignedBuf::alloc(&world, o.buffers, o.max_size, b'a')?;
    let mut rbuf = AlignedBuf::alloc(&world, o.buffers, slot_stride(o.max_size) * w, b'b')?;
    let mut ack = [0u8; 1];
    if rank == 0 {
        println!("{}", preamble("tmpi OSU-style Bandwidth Test"));
        println!("{}", header(&["Bandwidth (MB/s)"]));
    }
    for size in o.sizes().filter(|&s| s > 0) {
        let (iters, skip) = o.loops(size);
        let s = &sbuf.as_slice()[..size];
        let mut slots = window_slots(rbuf.as_mut_slice(), size, w)?;
        for slot in slots.iter_mut() {
            slot.fill(b'b');
        }
        world.barrier()?;
        let mut total = 0.0;
        for i in 0..iters + skip {
            if rank == 0 {
                let t0 = tmpi::wtime();
                tmpi::scope(|sc| -> tmpi::Result<()> {
                    let mut reqs = Vec::with_capacity(w);
                    for _ in 0..w {
                        reqs.push(world.isend(sc, s, 1, DATA)?);
                    }
                    tmpi::wait_all(reqs)?;
                    Ok(())
                })?;
                world.recv(&mut ack, 1, ACK)?;
                if i >= skip {
                    total += tmpi::wtime() - t0;
                }
            } else {
                let t0 = tmpi::wtime();
                let mut t1 = 0.0;
                tmpi::scope(|sc| -> tmpi::Result<()> {
                    let mut reqs = Vec::with_capacity(w);
                    for slot in slots.iter_mut() {
                        reqs.push(world.irecv(sc, slot, 0, DATA)?);
                    }
                    t1 = tmpi::wtime();
                    tmpi::wait_all(reqs)?;
                    Ok(())
                })?;
                let t2 = tmpi::wtime();
                world.send(&s[..1], 0, ACK)?;
                let t3 = tmpi::wtime();
                if i >= skip {
                    PH.with(|p| {
                        let mut p = p.borrow_mut();
                        p[0] += t1 - t0;
                        p[1] += t2 - t1;
                        p[2] += t3 - t2;
                        p[3] += 1.0;
                    });
                }
            }
        }
        if rank == 0 {
            println!("{}", row(size, size as f64 / 1e6 * iters as f64 * w as f64 / total));
        }
    }
    if rank == 1 {
        PH.with(|p| {
            let p = p.borrow();
            eprintln!(
                "post {:.1} ns/msg, wait {:.1} ns/msg, ack {:.1} ns/window",
                p[0] / p[3] / w as f64 * 1e9,
                p[1] / p[3] / w as f64 * 1e9,
                p[2] / p[3] * 1e9
            );
        });
    }
    world.finalize()?;
    Ok(())
}
