//! Fault injection: rank 1 calls `World::abort(CODE)`.
//!
//! `fault_abort CODE` under `tmpirun -n N` (N >= 2). Rank 0 first prints `JOBID <TMPI_JOBID>`
//! and `SOCK <TMPI_BOOTSTRAP>`; every rank starts the runtime and prints `READY <rank>`; rank 1
//! then aborts the job while the others wait in a receive from it. Rank 1 prints
//! `FAULT_AT <ns since the Unix epoch>` on stderr just before the abort. A rank whose receive
//! fails exits with 42, one whose receive succeeds with 43: the job's status must be CODE.

use std::time::{SystemTime, UNIX_EPOCH};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let code: i32 = match std::env::args().nth(1) {
        Some(a) => a.parse().map_err(|_| format!("fault_abort: bad code {a:?}"))?,
        None => return Err("usage: fault_abort CODE".into()),
    };
    if std::env::var("TMPI_RANK").as_deref() == Ok("0") {
        println!("JOBID {}", std::env::var("TMPI_JOBID").unwrap_or_default());
        println!("SOCK {}", std::env::var("TMPI_BOOTSTRAP").unwrap_or_default());
    }
    let world = tmpi::init()?;
    println!("READY {}", world.rank());
    if world.rank() == 1 {
        let ns = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().as_nanos();
        eprintln!("FAULT_AT {ns}");
        world.abort(code);
    }
    let mut b = [0u8; 1];
    match world.recv(&mut b, 1, 0) {
        Ok(_) => std::process::exit(43),
        Err(e) => {
            eprintln!("fault_abort: rank {}: receive from rank 1: {e}", world.rank());
            std::process::exit(42)
        }
    }
}
