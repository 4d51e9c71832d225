//! CPU cost of the eager path, with the soft TM-SRQ's offload on (the configured
//! `TMPI_TM_MAX_TAGS`) and off (0): both ranks in this one thread over a real shared-memory
//! segment (`tmpi::shm_pair_one_thread`), the best of many windows of 64 messages of 8 bytes,
//! free of cross-core effects and of the scheduler. It splits a window into posting the
//! receives plus sending (blocking `send`, which an eager message completes at once) and the
//! arrivals plus completions (the waits).
//!
//! `window_cost [--rounds N]` (default 4000, the first 100 not counted). It was the ignored
//! engine test `engine::testkit::window_cost`, which drove two engines directly; this one goes
//! through the public API (a scope and a request per receive), so its figures include that
//! layer. Use it to compare two versions of the runtime; it asserts nothing about time.

use std::process::ExitCode;
use std::time::Instant;

const W: usize = 64;
const WARM: usize = 100;

fn main() -> ExitCode {
    let rounds = match tmpi_bench::cost_args(std::env::args().skip(1), 4000, WARM) {
        Ok((r, rest)) if rest.is_empty() => r,
        Ok((_, rest)) => {
            eprintln!("window_cost: unexpected arguments {rest:?}\nusage: window_cost [--rounds N]   (default 4000)");
            return ExitCode::from(2);
        }
        Err(e) => {
            eprintln!("window_cost: {e}\nusage: window_cost [--rounds N]   (default 4000)");
            return ExitCode::from(2);
        }
    };
    let base = match tmpi::config::Config::from_env() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("window_cost: {e}");
            return ExitCode::from(2);
        }
    };
    for (what, tags) in [("offload on", base.tm_max_tags), ("offload off", 0)] {
        let cfg = tmpi::config::Config { tm_max_tags: tags, ..base.clone() };
        match window_cost(cfg, rounds) {
            Ok([post, arrive]) => println!(
                "window_cost ({what}): post+send {post:.1} ns/msg, arrive+complete {arrive:.1} ns/msg (best of {} windows of {W})",
                rounds - WARM
            ),
            Err(e) => {
                eprintln!("window_cost ({what}): {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    ExitCode::SUCCESS
}

fn window_cost(cfg: tmpi::config::Config, rounds: usize) -> tmpi::Result<[f64; 2]> {
    let (a, b) = tmpi::shm_pair_one_thread(cfg);
    let payload = [7u8; 8];
    let mut bufs = vec![[0u8; 8]; W];
    let mut best = [f64::MAX; 2];
    for round in 0..rounds {
        let (mut t1, mut t2) = (Instant::now(), Instant::now());
        let t0 = Instant::now();
        tmpi::scope(|s| -> tmpi::Result<()> {
            let mut reqs = Vec::with_capacity(W);
            for bf in bufs.iter_mut() {
                reqs.push(b.irecv(s, bf, 0, 1)?);
            }
            for _ in 0..W {
                a.send(&payload, 1, 1)?;
            }
            t1 = Instant::now();
            for r in reqs {
                r.wait()?;
            }
            // The sender takes back its flow-control credit.
            a.iprobe(1, 2)?;
            t2 = Instant::now();
            Ok(())
        })?;
        if round >= WARM {
            best[0] = best[0].min((t1 - t0).as_nanos() as f64 / W as f64);
            best[1] = best[1].min((t2 - t1).as_nanos() as f64 / W as f64);
        }
    }
    if bufs.iter().any(|b| *b != payload) {
        return Err(tmpi::Error::State("a received message differs from what was sent".into()));
    }
    Ok(best)
}
