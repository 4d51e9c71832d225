//! Bidirectional bandwidth between ranks 0 and 1, after OSU's `osu_bibw`.
//!
//! Each iteration both ranks post a window of `irecv`s (one buffer slot each) and a window of
//! `isend`s, then wait for the sends and the receives. The figure counts the bytes moved in
//! both directions, in MB/s.

use std::process::ExitCode;

use tmpi_bench::{
    header, options_or_exit, preamble, report, require, row, slot_stride, window_slots, AlignedBuf, BoxError, Family, Options,
};

const NAME: &str = "osu_bibw";
const BASE_TAG: tmpi::Tag = 10;

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
    let peer = 1 - rank;
    let (my_tag, peer_tag) = (BASE_TAG + rank as tmpi::Tag, BASE_TAG + peer as tmpi::Tag);
    let w = o.window;
    let sbuf = AlignedBuf::alloc(&world, o.buffers, o.max_size, b'a')?;
    let mut rbuf = AlignedBuf::alloc(&world, o.buffers, slot_stride(o.max_size) * w, b'b')?;
    if rank == 0 {
        println!("{}", preamble("tmpi OSU-style Bi-Directional Bandwidth Test"));
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
            let t0 = tmpi::wtime();
            tmpi::scope(|sc| -> tmpi::Result<()> {
                let mut recvs = Vec::with_capacity(w);
                for slot in slots.iter_mut() {
                    recvs.push(world.irecv(sc, slot, peer, peer_tag)?);
                }
                let mut sends = Vec::with_capacity(w);
                for _ in 0..w {
                    sends.push(world.isend(sc, s, peer, my_tag)?);
                }
                tmpi::wait_all(sends)?;
                tmpi::wait_all(recvs)?;
                Ok(())
            })?;
            if i >= skip {
                total += tmpi::wtime() - t0;
            }
        }
        if rank == 0 {
            println!("{}", row(size, size as f64 / 1e6 * iters as f64 * w as f64 * 2.0 / total));
        }
    }
    world.finalize()?;
    Ok(())
}
