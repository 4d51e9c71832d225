//! A rank that panics in the middle of a job.
//!
//! `panicker [RANK]` (default 1): rank 0 prints `panicker: jobid=<TMPI_JOBID>` (so a test can
//! look for the job's files), every rank passes a barrier, then RANK panics while the others
//! wait in a receive from it. A correct launcher ends the job at once with a non-zero status
//! naming RANK and its status (101, a panic). A rank whose receive fails first (`PeerGone`)
//! says so and waits to be ended by `tmpirun`: exiting could make it the job's first failure.

use std::io::Write;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let world = tmpi::init()?;
    let victim: usize = match std::env::args().nth(1) {
        Some(a) => a.parse().map_err(|_| format!("panicker: bad rank argument {a:?}"))?,
        None => 1,
    };
    let (rank, n) = (world.rank(), world.size());
    if victim >= n {
        return Err(format!("panicker: rank {victim} does not exist in a job of {n}").into());
    }
    if rank == 0 {
        let jobid = std::env::var("TMPI_JOBID").unwrap_or_else(|_| "none".into());
        println!("panicker: jobid={jobid}");
        std::io::stdout().flush()?;
    }
    world.barrier()?;
    if rank == victim {
        panic!("panicker: deliberate panic on rank {rank}");
    }
    let mut b = [0u8; 1];
    match world.recv(&mut b, victim, 1) {
        Ok(st) => {
            eprintln!("panicker: rank {rank}: unexpected message {st:?}");
            std::process::exit(4)
        }
        Err(e) => {
            eprintln!("panicker: rank {rank}: receive from rank {victim} failed: {e}");
            loop {
                std::thread::sleep(std::time::Duration::from_secs(3600));
            }
        }
    }
}
