//! CPU cost per message of `osu_mbw_mr`'s inner loop through the public API (scope,
//! `isend`/`irecv`, `wait_all`), both ranks in this one thread over a real shared-memory
//! segment (`tmpi::shm_pair_one_thread`): no cross-core traffic, so the best window of many is
//! stable on a loaded machine, and callgrind counts the same instructions whatever else runs.
//!
//! `comm_window_cost [--rounds N] [SIZE...]` (default sizes 8, 1024 and 4096 bytes; 6000
//! rounds, the first 500 not counted). Two orders per size: receives posted before the sends
//! arrive (expected), and after (unexpected). The `TMPI_*` knobs of the environment apply:
//! with `TMPI_TM_THRESH=1024` the soft TM-SRQ takes the receives of 1 KiB and up (2697
//! instructions per message at 1 KiB, against 2050 in software alone on 2026-11-25, why the
//! default threshold is 16 KiB), and `TMPI_TM_MAX_TAGS=0` turns offload off. It was the
//! ignored test `world::tests::comm_window_cost` (`_8b`, `_1k`: sizes 8 and 1024 alone).
//!
//! Count instructions per message with
//! `valgrind --tool=callgrind target/release/comm_window_cost 8`.

use std::process::ExitCode;
use std::time::Instant;

const W: usize = 64;
const WARM: usize = 500;

struct Args {
    sizes: Vec<usize>,
    rounds: usize,
}

fn parse(args: impl Iterator<Item = String>) -> Result<Args, String> {
    let (rounds, rest) = tmpi_bench::cost_args(args, 6000, WARM)?;
    let mut sizes = rest.iter().map(|s| s.parse().map_err(|_| format!("{s:?}: not a size in bytes"))).collect::<Result<Vec<usize>, _>>()?;
    if sizes.is_empty() {
        sizes = vec![8, 1024, 4096];
    }
    Ok(Args { sizes, rounds })
}

fn main() -> ExitCode {
    let args = match parse(std::env::args().skip(1)) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("comm_window_cost: {e}");
            eprintln!("usage: comm_window_cost [--rounds N] [SIZE...]   (default sizes 8 1024 4096, 6000 rounds)");
            return ExitCode::from(2);
        }
    };
    let cfg = match tmpi::config::Config::from_env() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("comm_window_cost: {e}");
            return ExitCode::from(2);
        }
    };
    for &size in &args.sizes {
        match window_cost(&cfg, size, args.rounds) {
            Ok((expected, unexpected, post)) => println!(
                "comm_window_cost {size} B: expected {expected:.1} ns/msg (of which posting the receive {post:.1}), unexpected {unexpected:.1} ns/msg (send + receive, best of {} windows of {W})",
                args.rounds - WARM
            ),
            Err(e) => {
                eprintln!("comm_window_cost: {size} B: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    ExitCode::SUCCESS
}

/// The best (expected, unexpected, posting an expected receive) nanoseconds per message.
fn window_cost(cfg: &tmpi::config::Config, size: usize, rounds: usize) -> tmpi::Result<(f64, f64, f64)> {
    let (w0, w1) = tmpi::shm_pair_one_thread(cfg.clone());
    let sbuf = vec![7u8; size];
    let mut rbuf = vec![vec![0u8; size]; W];
    let send_window = || {
        tmpi::scope(|s| -> tmpi::Result<()> {
            let mut reqs = Vec::with_capacity(W);
            for _ in 0..W {
                reqs.push(w0.isend(s, &sbuf, 1, 3)?);
            }
            tmpi::wait_all(reqs)?;
            Ok(())
        })
    };
    // The acknowledgement, as in the benchmark (it also lets each side's progress return the
    // other's flow-control credit).
    let ack = || -> tmpi::Result<()> {
        w1.send(&sbuf[..1.min(size)], 0, 4)?;
        let mut a = [0u8];
        w0.recv(&mut a[..1.min(size)], 1, 4).map(|_| ())
    };
    let mut best = [f64::MAX; 3];
    for round in 0..rounds {
        let t = Instant::now();
        let mut posted = t;
        tmpi::scope(|s| -> tmpi::Result<()> {
            let mut reqs = Vec::with_capacity(W);
            for slot in rbuf.iter_mut() {
                reqs.push(w1.irecv(s, slot, 0, 3)?);
            }
            posted = Instant::now();
            send_window()?;
            tmpi::wait_all(reqs)?;
            Ok(())
        })?;
        let t1 = Instant::now();
        ack()?;
        let t2 = Instant::now();
        send_window()?;
        tmpi::scope(|s| -> tmpi::Result<()> {
            let mut reqs = Vec::with_capacity(W);
            for slot in rbuf.iter_mut() {
                reqs.push(w1.irecv(s, slot, 0, 3)?);
            }
            tmpi::wait_all(reqs)?;
            Ok(())
        })?;
        let t3 = Instant::now();
        ack()?;
        if round >= WARM {
            best[0] = best[0].min((t1 - t).as_nanos() as f64 / W as f64);
            best[1] = best[1].min((t3 - t2).as_nanos() as f64 / W as f64);
            best[2] = best[2].min((posted - t).as_nanos() as f64 / W as f64);
        }
    }
    if rbuf.iter().any(|r| *r != sbuf) {
        return Err(tmpi::Error::State("a received window differs from what was sent".into()));
    }
    Ok((best[0], best[1], best[2]))
}
