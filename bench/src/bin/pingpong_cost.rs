//! CPU cost of one hop of a blocking ping-pong of 8 bytes (post a receive, send, the peer's
//! wait completes it), both ranks in this one thread over a real shared-memory segment
//! (`tmpi::shm_pair_one_thread`); the best of many rounds of 64 hops.
//!
//! `pingpong_cost [--rounds N]` (default 20000, the first 100 not counted). It was the ignored
//! engine test `engine::testkit::pingpong_cost`, which drove two engines directly; this one
//! goes through the public API (a scope and a request per receive), so its figure includes
//! that layer. It asserts nothing about time.

use std::process::ExitCode;
use std::time::Instant;

const HOPS: usize = 64;
const WARM: usize = 100;

fn main() -> ExitCode {
    let rounds = match tmpi_bench::cost_args(std::env::args().skip(1), 20_000, WARM) {
        Ok((r, rest)) if rest.is_empty() => r,
        Ok((_, rest)) => {
            eprintln!("pingpong_cost: unexpected arguments {rest:?}\nusage: pingpong_cost [--rounds N]   (default 20000)");
            return ExitCode::from(2);
        }
        Err(e) => {
            eprintln!("pingpong_cost: {e}\nusage: pingpong_cost [--rounds N]   (default 20000)");
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
    match pingpong_cost(cfg, rounds) {
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

fn pingpong_cost(cfg: tmpi::config::Config, rounds: usize) -> tmpi::Result<f64> {
    let (w0, w1) = tmpi::shm_pair_one_thread(cfg);
    let worlds = [&w0, &w1];
    let payload = [7u8; 8];
    let mut bufs = [[0u8; 8]; 2];
    let mut best = f64::MAX;
    for round in 0..rounds {
        let t0 = Instant::now();
        for hop in 0..HOPS {
            let (to, from) = (1 - hop % 2, hop % 2);
            let (tx, rx) = (worlds[from], worlds[to]);
            tmpi::scope(|s| -> tmpi::Result<()> {
                let r = rx.irecv(s, &mut bufs[to], from, 1)?;
                tx.send(&payload, to, 1)?;
                r.wait().map(|_| ())
            })?;
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
