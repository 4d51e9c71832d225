//! The fault matrix's program: one rank fails in one way while its peers wait on it in one
//! way (`tests/tests/fault_matrix.rs` runs every pair through `tmpirun`).
//!
//! `faultmatrix FAULT STATE` under `tmpirun -n N` (N >= 2). The faulty rank is the last one
//! (N - 1). Rank 0 prints `JOBID <TMPI_JOBID>` first; every rank starts the runtime and the
//! job synchronises once (barrier). Then the peers enter STATE and the faulty rank, after
//! 200 ms (time for them to be waiting), prints `FAULT_AT <ns since the Unix epoch>` on
//! stderr and commits FAULT.
//!
//! FAULT (what the faulty rank does):
//! - `err`: `main` returns an `Err` (Rust prints `Error: ...` and exits with 1);
//! - `panic`: panics (exit status 101);
//! - `exit0`: `std::process::exit(0)` without finalizing;
//! - `exit3`: `std::process::exit(3)`;
//! - `forget`: `std::mem::forget(world)`, then `main` returns `Ok` (exit 0, not finalized);
//! - `sigkill`, `sigsegv`: raises that signal (default action);
//! - `abort`: `std::process::abort()` (SIGABRT).
//!
//! STATE (what the other ranks are doing when the fault comes):
//! - `recv`: a receive from the faulty rank;
//! - `any`: an `ANY_SOURCE` receive;
//! - `allreduce`: an allreduce the faulty rank never joins;
//! - `rndv`: a send of 8 MiB (rendezvous) to the faulty rank, which never receives it;
//! - `requests`: `irecv` from the faulty rank plus an `isend` of 8 MiB to it, then `wait_all`;
//! - `barrier`: a barrier the faulty rank never joins.
//!
//! A peer whose wait returns prints what it got and exits: 42 for an error (as a peer that
//! learnt of the fault should), 43 if the wait succeeded (which it must not).
//!
//! `faultmatrix strangers GOFILE` (N >= 2) is a job that strangers try to join: rank 0 prints
//! `SOCK <TMPI_BOOTSTRAP>`; rank 1 starts a child (a descendant of a rank, so it passes the
//! launcher's process check) that says hello as rank 0 with a wrong secret and prints
//! `INTRUDER <what the server answered>`; then every rank waits for GOFILE to exist (the test
//! creates it after its own attempts to get in), starts the runtime, checks an allreduce, and
//! rank 0 prints `faultmatrix: strangers: OK`.
//!
//! `faultmatrix early` (N >= 3) is the clean case instead: the last rank finalizes and exits
//! right after a split that leaves it out, while the others go on exchanging messages and
//! collectives on the split communicator; they must see it come back from `finalize`
//! (a marker file it writes then) while they are still at work, go on for 50 more rounds, and
//! end with status 0; rank 0 prints `faultmatrix: early finalize: ... OK`.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

type Res = Result<(), Box<dyn std::error::Error>>;

const TAG: u32 = 5;
/// Bytes of the rendezvous sends.
const BIG: usize = 8 << 20;

fn fault_at() {
    let ns = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().as_nanos();
    eprintln!("FAULT_AT {ns}");
}

/// Restores the default action of `sig` (Rust's runtime handles SIGSEGV to report stack
/// overflows) and raises it.
fn raise(sig: i32) -> ! {
    // SAFETY: signal() and raise() take integers; restoring the default action is always valid.
    unsafe {
        libc::signal(sig, libc::SIG_DFL);
        libc::raise(sig);
    }
    // SIGKILL and SIGSEGV with their default action cannot be survived.
    std::process::exit(99)
}

fn peer(world: &tmpi::World, state: &str, victim: usize) -> tmpi::Result<String> {
    match state {
        "recv" => {
            let mut b = [0u8; 8];
            world.recv(&mut b, victim, TAG).map(|st| format!("received {} bytes", st.len()))
        }
        "any" => {
            let mut b = [0u8; 8];
            world.recv(&mut b, tmpi::ANY_SOURCE, TAG).map(|st| format!("received {} bytes from {}", st.len(), st.source()))
        }
        "allreduce" => {
            let mut s = [0u64];
            world.allreduce(&[1u64], &mut s, tmpi::Op::Sum).map(|()| format!("allreduce gave {}", s[0]))
        }
        "rndv" => {
            let big = vec![7u8; BIG];
            world.send(&big, victim, TAG).map(|()| "sent 8 MiB".to_string())
        }
        "requests" => {
            let big = vec![7u8; BIG];
            let mut b = [0u8; 8];
            tmpi::scope(|s| -> tmpi::Result<String> {
                let r = world.irecv(s, &mut b, victim, TAG)?;
                let w = world.isend(s, &big, victim, TAG + 1)?;
                tmpi::wait_all(vec![r, w]).map(|st| format!("{} requests completed", st.len()))
            })
        }
        "barrier" => world.barrier().map(|()| "barrier completed".to_string()),
        other => Ok(format!("unknown state {other:?}")),
    }
}

fn early(world: tmpi::World) -> Res {
    let (rank, size) = (world.rank(), world.size());
    if size < 3 {
        return Err("faultmatrix early: needs at least 3 ranks".into());
    }
    let leaver = size - 1;
    // Created by the leaver once its finalize has returned: the others must see it while
    // they are still at work, which proves that finalize did not wait for them.
    let marker = std::env::temp_dir().join(format!("tmpi-early-{}", std::env::var("TMPI_JOBID").unwrap_or_default()));
    let sub = world.split(if rank == leaver { None } else { Some(0) }, rank as i32)?;
    if rank == leaver {
        world.finalize()?;
        std::fs::write(&marker, b"left")?;
        println!("LEFT {rank}");
        return Ok(());
    }
    let sub = sub.ok_or("faultmatrix early: not in the split communicator")?;
    let (r, n) = (sub.rank(), sub.size());
    let started = std::time::Instant::now();
    let mut rounds = 0u64;
    let mut after = 0u64; // rounds since the leaver was seen gone
    while after < 50 {
        let next = (r + 1) % n;
        let prev = (r + n - 1) % n;
        let mut got = [0u64; 4];
        sub.sendrecv(&[rounds; 4], next, TAG, &mut got, prev, TAG)?;
        if got != [rounds; 4] {
            return Err(format!("rank {rank}: round {rounds}: got {got:?}").into());
        }
        let mut sum = [0u64];
        sub.allreduce(&[1u64], &mut sum, tmpi::Op::Sum)?;
        if sum[0] != n as u64 {
            return Err(format!("rank {rank}: allreduce gave {} for {n} ranks", sum[0]).into());
        }
        // Every rank of `sub` decides together whether the leaver is gone (so that they all
        // stop after the same round).
        let mut seen = [0u64];
        sub.allreduce(&[u64::from(marker.exists())], &mut seen, tmpi::Op::Max)?;
        if seen[0] == 1 {
            after += 1;
        } else if started.elapsed() > Duration::from_secs(10) {
            return Err(format!(
                "rank {rank}: rank {leaver} has not come back from finalize after 10 s of work by the others \
                 (finalize waits for them)"
            )
            .into());
        }
        rounds += 1;
    }
    let mut total = [0u64];
    sub.allreduce(&[rounds], &mut total, tmpi::Op::Sum)?;
    if rank == 0 {
        let _ = std::fs::remove_file(&marker);
        println!("faultmatrix: early finalize: {} rounds on {n} ranks: OK", total[0]);
    }
    drop(sub);
    world.finalize()?;
    Ok(())
}

/// The child of rank 1: says hello as rank 0 with a wrong secret, through the real client
/// (it answers the server's challenge with an HMAC under that secret), and prints what the
/// server said.
fn intruder(sock: &str, size: u32) -> Res {
    use tmpi_transport::bootstrap::{BootstrapClient, JobSecret};
    let wrong = JobSecret::from_bytes(*b"wrong-secret-!!!");
    match BootstrapClient::connect(std::path::Path::new(sock), 0, size as usize, &wrong) {
        Ok(_) => eprintln!("INTRUDER admitted"),
        Err(e) => eprintln!("INTRUDER refused: {e}"),
    }
    Ok(())
}

fn strangers(gofile: &str) -> Res {
    let rank = std::env::var("TMPI_RANK")?;
    let size: u32 = std::env::var("TMPI_SIZE")?.parse()?;
    let sock = std::env::var("TMPI_BOOTSTRAP")?;
    if rank == "0" {
        println!("SOCK {sock}");
    }
    if rank == "1" {
        let st = std::process::Command::new(std::env::current_exe()?)
            .args(["intruder", &sock, &size.to_string()])
            .env_remove("TMPI_JOB_SECRET")
            .status()?;
        if !st.success() {
            return Err(format!("the intruder failed: {st}").into());
        }
    }
    let t = std::time::Instant::now();
    while !std::path::Path::new(gofile).exists() {
        if t.elapsed() > Duration::from_secs(15) {
            return Err(format!("{gofile} did not appear within 15 s").into());
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let world = tmpi::init()?;
    let mut sum = [0u64];
    world.allreduce(&[1u64], &mut sum, tmpi::Op::Sum)?;
    if sum[0] != world.size() as u64 {
        return Err(format!("allreduce gave {} at {} ranks", sum[0], world.size()).into());
    }
    if world.rank() == 0 {
        println!("faultmatrix: strangers: OK");
    }
    world.finalize()?;
    Ok(())
}

fn main() -> Res {
    let mut args = std::env::args().skip(1);
    let fault = args.next().ok_or("usage: faultmatrix FAULT STATE | faultmatrix early | faultmatrix strangers GOFILE")?;
    let state = args.next().unwrap_or_default();
    if fault == "intruder" {
        return intruder(&state, args.next().unwrap_or_default().parse().unwrap_or(2));
    }
    if std::env::var("TMPI_RANK").as_deref() == Ok("0") {
        println!("JOBID {}", std::env::var("TMPI_JOBID").unwrap_or_default());
    }
    if fault == "strangers" {
        return strangers(&state);
    }
    let world = tmpi::init()?;
    if fault == "early" {
        return early(world);
    }
    let (rank, size) = (world.rank(), world.size());
    let victim = size - 1;
    world.barrier()?;
    if rank != victim {
        let what = peer(&world, &state, victim);
        match what {
            Ok(w) => {
                eprintln!("faultmatrix: rank {rank}: {state}: {w} although rank {victim} failed");
                std::process::exit(43)
            }
            Err(e) => {
                eprintln!("faultmatrix: rank {rank}: {state}: {e}");
                std::process::exit(42)
            }
        }
    }
    std::thread::sleep(Duration::from_millis(200));
    fault_at();
    match fault.as_str() {
        "err" => Err(format!("rank {rank}: a deliberate error (fault matrix, peers in {state})").into()),
        "panic" => panic!("rank {rank}: a deliberate panic (fault matrix, peers in {state})"),
        "exit0" => std::process::exit(0),
        "exit3" => std::process::exit(3),
        "forget" => {
            std::mem::forget(world);
            Ok(())
        }
        "sigkill" => raise(libc::SIGKILL),
        "sigsegv" => raise(libc::SIGSEGV),
        "abort" => std::process::abort(),
        other => Err(format!("unknown fault {other:?}").into()),
    }
}
