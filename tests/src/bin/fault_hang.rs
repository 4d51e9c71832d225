//! Fault injection target: a job that hangs until something outside ends it.
//!
//! `fault_hang [run|init]` under `tmpirun -n N` (N >= 2). Rank 0 first prints
//! `JOBID <TMPI_JOBID>` and `SOCK <TMPI_BOOTSTRAP>`.
//! - `run` (default): every rank starts the runtime and prints `READY <rank>`; rank 1 then
//!   sleeps forever while the others wait in a receive from it.
//! - `init`: rank 1 waits until rank 0 has created the job's shared-memory segment, prints
//!   `SEGMENT <name>` and `READY 1`, and sleeps forever without starting the runtime (the
//!   others stay in `tmpi::init`).
//!
//! A test then kills a rank (SIGKILL) or `tmpirun` (SIGTERM). A rank whose receive fails
//! because its peer is gone (`Error::PeerGone`) exits with 42, one whose receive succeeds
//! with 43.

use std::time::{Duration, Instant};

/// Waits (at most 10 s) for `/dev/shm/<TMPI_SHM_NAME>` and prints `SEGMENT <name>`.
fn wait_for_segment() -> Result<(), String> {
    let name = std::env::var("TMPI_SHM_NAME").map_err(|_| "TMPI_SHM_NAME is not set")?;
    let path = format!("/dev/shm/{name}");
    let t = Instant::now();
    while !std::path::Path::new(&path).exists() {
        if t.elapsed() > Duration::from_secs(10) {
            return Err(format!("{path} did not appear within 10 s"));
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    println!("SEGMENT {name}");
    Ok(())
}

fn sleep_forever() -> ! {
    loop {
        std::thread::sleep(Duration::from_secs(3600));
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let phase = std::env::args().nth(1).unwrap_or_else(|| "run".into());
    if phase != "run" && phase != "init" {
        return Err(format!("fault_hang: phase {phase:?} is not run or init").into());
    }
    let rank = std::env::var("TMPI_RANK").unwrap_or_else(|_| "0".into());
    if rank == "0" {
        println!("JOBID {}", std::env::var("TMPI_JOBID").unwrap_or_default());
        println!("SOCK {}", std::env::var("TMPI_BOOTSTRAP").unwrap_or_default());
    }
    if phase == "init" && rank == "1" {
        wait_for_segment()?;
        println!("READY 1");
        sleep_forever();
    }
    let world = tmpi::init()?;
    println!("READY {}", world.rank());
    if world.rank() == 1 {
        sleep_forever();
    }
    let mut b = [0u8; 1];
    match world.recv(&mut b, 1, 0) {
        Ok(_) => std::process::exit(43),
        Err(e) => {
            eprintln!("fault_hang: rank {}: receive from rank 1: {e}", world.rank());
            std::process::exit(42)
        }
    }
}
