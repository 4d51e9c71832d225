//! Ping-pong between ranks 0 and 1 at sizes 1 B .. 1 MiB; prints the one-way latency.
//!
//! Every message carries a pattern that depends on the size and the iteration; rank 1
//! checks what it receives and sends it back, rank 0 checks the echo. With one rank the
//! program says it needs two and exits successfully; ranks above 1 take no part.
//! The latency column depends on the machine, so this is the one example whose output is
//! not meant to be compared across runs (the sizes and the verdict are).

use std::error::Error;

use tmpi_examples::check;

const MAX: usize = 1 << 20;
const TAG: tmpi::Tag = 7;

fn iterations(size: usize) -> usize {
    if size <= 8192 {
        1000
    } else {
        100
    }
}

fn fill(buf: &mut [u8], size: usize, iter: usize) {
    for (i, b) in buf.iter_mut().enumerate() {
        *b = (i.wrapping_mul(31) ^ size ^ iter.wrapping_mul(7)) as u8;
    }
}

fn matches(buf: &[u8], size: usize, iter: usize) -> bool {
    buf.iter().enumerate().all(|(i, &b)| b == (i.wrapping_mul(31) ^ size ^ iter.wrapping_mul(7)) as u8)
}

fn main() -> Result<(), Box<dyn Error>> {
    let world = tmpi::init()?;
    let rank = world.rank();
    if world.size() < 2 {
        println!("pingpong: needs at least 2 ranks (run with tmpirun -n 2); nothing to do");
        world.finalize()?;
        return Ok(());
    }
    let mut sbuf = vec![0u8; MAX];
    let mut rbuf = vec![0u8; MAX];
    if rank == 0 {
        println!("# pingpong: ranks 0 <-> 1, one-way latency (half the round trip)");
        println!("{:<10}{:>20}", "# Size", "Latency (us)");
    }
    let sizes = std::iter::successors(Some(1usize), |s| Some(s * 2)).take_while(|&s| s <= MAX);
    for size in sizes {
        let iters = iterations(size);
        world.barrier()?;
        match rank {
            0 => {
                // Verified iteration (not timed), then the timed loop with a fixed pattern.
                fill(&mut sbuf[..size], size, 0);
                world.send(&sbuf[..size], 1, TAG)?;
                let st = world.recv(&mut rbuf[..size], 1, TAG)?;
                check(st.len() == size && matches(&rbuf[..size], size, 0), || {
                    format!("echo of {size} bytes differs from what was sent (status {st:?})")
                })?;
                let t0 = tmpi::wtime();
                for _ in 0..iters {
                    world.send(&sbuf[..size], 1, TAG)?;
                    world.recv(&mut rbuf[..size], 1, TAG)?;
                }
                let us = (tmpi::wtime() - t0) * 1e6 / (2.0 * iters as f64);
                check(matches(&rbuf[..size], size, 0), || format!("last echo of {size} bytes is corrupt"))?;
                println!("{size:<10}{us:>20.2}");
            }
            1 => {
                let st = world.recv(&mut rbuf[..size], 0, TAG)?;
                check(st.len() == size && st.source() == 0 && matches(&rbuf[..size], size, 0), || {
                    format!("rank 1 received a wrong {size}-byte ping (status {st:?})")
                })?;
                world.send(&rbuf[..size], 0, TAG)?;
                for _ in 0..iters {
                    world.recv(&mut rbuf[..size], 0, TAG)?;
                    world.send(&rbuf[..size], 0, TAG)?;
                }
            }
            _ => {}
        }
    }
    if rank == 0 {
        println!("pingpong: all echoes verified: OK");
    }
    world.finalize()?;
    Ok(())
}
