//! Fault injection: rank 1 panics.
//!
//! `fault_panic [run|init]` under `tmpirun -n N` (N >= 2). Rank 0 first prints
//! `JOBID <TMPI_JOBID>` and `SOCK <TMPI_BOOTSTRAP>` so a test can look for the job's files
//! afterwards.
//! - `run` (default): every rank starts the runtime and prints `READY <rank>`; rank 1 then
//!   panics while the others wait in a receive from it.
//! - `init`: rank 1 waits until rank 0 has created the job's shared-memory segment (so there
//!   is a file to clean up), prints `SEGMENT <name>` and panics before starting the runtime,
//!   while the others are stuck in `tmpi::init`.
//!
//! Rank 1 prints `FAULT_AT <ns since the Unix epoch>` on stderr just before the panic. A
//! rank whose receive succeeds exits with 43. A rank whose receive fails (`PeerGone`: the
//! panicking rank leaves the shared memory while it unwinds) says so on stderr and waits to
//! be ended by `tmpirun`: were it to exit, it could end before the panicking rank has, and
//! would be reported as the job's first failure. The job's status must be the panic's, 101.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

fn fault_at() {
    let ns = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().as_nanos();
    eprintln!("FAULT_AT {ns}");
}

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

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let phase = std::env::args().nth(1).unwrap_or_else(|| "run".into());
    if phase != "run" && phase != "init" {
        return Err(format!("fault_panic: phase {phase:?} is not run or init").into());
    }
    let rank = std::env::var("TMPI_RANK").unwrap_or_else(|_| "0".into());
    if rank == "0" {
        println!("JOBID {}", std::env::var("TMPI_JOBID").unwrap_or_default());
        println!("SOCK {}", std::env::var("TMPI_BOOTSTRAP").unwrap_or_default());
    }
    if phase == "init" && rank == "1" {
        wait_for_segment()?;
        fault_at();
        panic!("fault_panic: deliberate panic on rank 1 before init");
    }
    let world = tmpi::init()?;
    println!("READY {}", world.rank());
    if world.rank() == 1 {
        fault_at();
        panic!("fault_panic: deliberate panic on rank 1");
    }
    let mut b = [0u8; 1];
    match world.recv(&mut b, 1, 0) {
        Ok(_) => std::process::exit(43),
        Err(e) => {
            eprintln!("fault_panic: rank {}: receive from rank 1: {e}", world.rank());
            loop {
                std::thread::sleep(Duration::from_secs(3600));
            }
        }
    }
}
