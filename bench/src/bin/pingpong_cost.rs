//! CPU cost of one hop of a blocking ping-pong of 8 bytes (post a receive, send, the peer's
//! wait completes it), both ranks in this one thread over a real shared-memory segment
//! (`tmpi::shm_pair_one_thread`); the best of many rounds of 64 hops.
//!
//! `pingpong_cost [--rounds N] [--ofi] [--blocking]` (default 20000, the first 100 not
//! counted). With `--blocking` a hop is `osu_latency`'s: a blocking `send`, then a blocking
//! `recv` (posted before it polls, so it takes the expected path as in the benchmark). With
//! `--ofi` (builds with the cargo feature `ofi`) the two ranks are joined by the OFI fabric
//! on `TMPI_OFI_PROVIDER`, matched as `TMPI_OFI_MATCHING` says, instead of shared memory. It was the ignored
//! engine test `engine::testkit::pingpong_cost`, which drove two engines directly; this one
//! goes through the public API (a scope and a request per receive), so its figure includes
//! that layer. It asserts nothing about time.

use std::process::ExitCode;
use std::time::Instant;

const HOPS: usize = 64;
const WARM: usize = 100;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let ofi = args.iter().any(|a| a == "--ofi");
    let blocking = args.iter().any(|a| a == "--blocking");
    if ofi && !cfg!(feature = "ofi") {
        eprintln!("pingpong_cost: --ofi needs a build with the cargo feature ofi");
        return ExitCode::from(2);
    }
    let rounds = match tmpi_bench::cost_args(args.into_iter().filter(|a| a != "--ofi" && a != "--blocking"), 20_000, WARM) {
        Ok((r, rest)) if rest.is_empty() => r,
        Ok((_, rest)) => {
            eprintln!(
                "pingpong_cost: unexpected arguments {rest:?}\nusage: pingpong_cost [--rounds N] [--ofi] [--blocking]   (default 20000)"
            );
            return ExitCode::from(2);
        }
        Err(e) => {
            eprintln!("pingpong_cost: {e}\nusage: pingpong_cost [--rounds N] [--ofi] [--blocking]   (default 20000)");
            return ExitCode::from(2);
        }
    };
    let cfg = match tmpi::config::Config::from_env() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("pingpong_cost: {e}");
            return ExitCode::from(2);
        }
    };
    match pair(cfg, ofi).and_then(|(w0, w1)| pingpong_cost(&w0, &w1, rounds, blocking)) {
        Ok(best) => {
            println!("pingpong_cost: {best:.1} ns per hop (post + send + wait; best of {} rounds of {HOPS} hops)", rounds - WARM);
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("pingpong_cost: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The two ranks: over shared memory, or with `--ofi` over the OFI fabric on
/// `TMPI_OFI_PROVIDER` with `TMPI_OFI_MATCHING`'s matching.
fn pair(cfg: tmpi::config::Config, ofi: bool) -> tmpi::Result<(tmpi::World, tmpi::World)> {
    #[cfg(feature = "ofi")]
    if ofi {
        return tmpi::ofi_pair_one_thread(cfg);
    }
    let _ = ofi;
    Ok(tmpi::shm_pair_one_thread(cfg))
}

/// One message each way while both ranks make progress: over OFI a connection is set up by
/// the first message, which needs the sender's progress too (later sends go out at once).
fn connect(worlds: [&tmpi::World; 2]) -> tmpi::Result<()> {
    for from in 0..2 {
        let (tx, rx) = (worlds[from], worlds[1 - from]);
        let mut b = [0u8; 8];
        tmpi::scope(|s| -> tmpi::Result<()> {
            let mut r = rx.irecv(s, &mut b, from, 1)?;
            let _out = tx.isend(s, &[1u8; 8], 1 - from, 1)?;
            loop {
                if let Some(st) = r.test()? {
                    let _ = st;
                    return Ok(());
                }
                // Progress on the sender (a probe for a tag nothing uses).
                tx.iprobe(1 - from, 1_000_000)?;
            }
        })?;
    }
    Ok(())
}

fn pingpong_cost(w0: &tmpi::World, w1: &tmpi::World, rounds: usize, blocking: bool) -> tmpi::Result<f64> {
    let worlds = [w0, w1];
    connect(worlds)?;
    let payload = [7u8; 8];
    let mut bufs = [[0u8; 8]; 2];
    let mut best = f64::MAX;
    for round in 0..rounds {
        let t0 = Instant::now();
        for hop in 0..HOPS {
            let (to, from) = (1 - hop % 2, hop % 2);
            let (tx, rx) = (worlds[from], worlds[to]);
            if blocking {
                // `osu_latency`'s calls: the receive is posted, then finds the message.
                tx.send(&payload, to, 1)?;
                rx.recv(&mut bufs[to], from, 1)?;
            } else {
                tmpi::scope(|s| -> tmpi::Result<()> {
                    let r = rx.irecv(s, &mut bufs[to], from, 1)?;
                    tx.send(&payload, to, 1)?;
                    r.wait().map(|_| ())
                })?;
            }
        }
        if round >= WARM {
            best = best.min(t0.elapsed().as_nanos() as f64 / HOPS as f64);
        }
    }
    if bufs.iter().any(|b| *b != payload) {
        return Err(tmpi::Error::State("a received message differs from what was sent".into()));
    }
    Ok(best)
}
