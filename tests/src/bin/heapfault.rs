//! A peer dies in the middle of a large transfer through the shared heap
//! (`tests/tests/heap_faults.rs` runs it through `tmpirun -n 2`).
//!
//! A first 1 MiB message through the heap makes the peer map it; then:
//!
//! `heapfault sender-dies`: rank 0 sends 16 MiB from a `World::alloc_shared` buffer and exits
//! without finalizing the moment it has granted the read (its `heap_grants` counter moves),
//! while rank 1 is copying out of rank 0's heap. Rank 1 must receive the whole message intact
//! (its mapping keeps the pages of the dead process's heap) and prints
//! `heapfault: sender-dies: survivor got Ok: OK` before tmpirun ends it (the survivor ignores
//! tmpirun's SIGTERM, which leaves it 300 ms before the SIGKILL); an error instead would also
//! be acceptable, a crash or wrong data never.
//!
//! `heapfault receiver-dies`: rank 1 receives 16 MiB into a shared buffer from rank 0's
//! ordinary buffer (rank 0 memcpys into rank 1's heap) and exits without finalizing right
//! after posting; rank 0 must not crash (tmpirun blames rank 1).

use std::process::ExitCode;
use std::time::{Duration, Instant};

const BIG: usize = 16 << 20;
const WARM: usize = 1 << 20;
const TAG: u32 = 9;

fn pattern(i: usize) -> u8 {
    (i.wrapping_mul(31) >> 3) as u8
}

/// This rank's `heap_grants` counter, typed: a counter the runtime stopped reporting is a
/// compile error, not a zero that moves the kill point (and the call cannot fail on this
/// rank's one thread).
fn heap_grants(w: &tmpi::World) -> u64 {
    w.stats().expect("the counters of this rank").heap_grants
}

/// Polls `req` until `until` holds (or 2 s passed), then exits without finalizing.
fn poll_then_die(req: &mut tmpi::Request<'_>, until: impl Fn() -> bool) -> ! {
    let t0 = Instant::now();
    while !until() && t0.elapsed() < Duration::from_secs(2) {
        if let Ok(Some(_)) = req.test() {
            break;
        }
    }
    eprintln!("heapfault: leaving after {:?}", t0.elapsed());
    std::process::exit(3)
}

/// The warm-up: 1 MiB from rank 0's `src` into rank 1's `dst` (shared or not).
fn warm(world: &tmpi::World, src: &[u8], dst: &mut [u8]) -> tmpi::Result<()> {
    if world.rank() == 0 {
        world.send(&src[..WARM], 1, TAG + 1)
    } else {
        world.recv(&mut dst[..WARM], 0, TAG + 1).map(|_| ())
    }
}

fn main() -> ExitCode {
    let mode = std::env::args().nth(1).unwrap_or_default();
    match run(&mode) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("heapfault: {e}");
            ExitCode::from(2)
        }
    }
}

type BoxResult = Result<(), Box<dyn std::error::Error>>;

fn run(mode: &str) -> BoxResult {
    let world = tmpi::init()?;
    if world.size() != 2 {
        return Err("run me on 2 ranks".into());
    }
    let rank = world.rank();
    let survivor = (mode == "sender-dies") == (rank == 1);
    if survivor {
        // tmpirun sends SIGTERM to the other ranks as soon as the faulty one exits, and SIGKILL
        // 300 ms later: the survivor uses that time to finish and report.
        // SAFETY: signal() with integer arguments; ignoring SIGTERM is always valid.
        unsafe { libc::signal(libc::SIGTERM, libc::SIG_IGN) };
    }
    match (mode, rank) {
        ("sender-dies", 0) => dying_sender(&world),
        ("sender-dies", _) => surviving_receiver(&world, mode),
        ("receiver-dies", 0) => surviving_sender(&world, mode),
        ("receiver-dies", _) => dying_receiver(&world),
        _ => Err(format!("unknown mode {mode:?}: sender-dies or receiver-dies").into()),
    }
}

/// Sends from the shared heap and dies once the receiver was granted the buffer.
fn dying_sender(world: &tmpi::World) -> BoxResult {
    let mut buf = world.alloc_shared::<u8>(BIG)?;
    if !buf.is_shared() {
        println!("heapfault: no shared heap here: OK");
        return Ok(());
    }
    for (i, b) in buf.iter_mut().enumerate() {
        *b = pattern(i);
    }
    warm(world, &buf, &mut [])?;
    world.barrier()?;
    let g0 = world.stats()?.heap_grants;
    tmpi::scope(|s| -> tmpi::Result<()> {
        let mut r = world.isend(s, &buf, 1, TAG)?;
        poll_then_die(&mut r, || heap_grants(world) > g0)
    })?;
    Ok(())
}

/// Receives from the dying sender: the whole message intact, or an error; never wrong bytes.
fn surviving_receiver(world: &tmpi::World, mode: &str) -> BoxResult {
    let mut buf = vec![0u8; BIG];
    let want: Vec<u8> = (0..BIG).map(pattern).collect();
    warm(world, &[], &mut buf)?;
    world.barrier()?;
    let r = world.recv(&mut buf, 0, TAG);
    let got = match &r {
        Ok(st) => {
            if st.len() != BIG || buf != want {
                let bad = buf.iter().zip(&want).position(|(a, b)| a != b);
                return Err(format!("received {} B, first wrong byte at {bad:?}", st.len()).into());
            }
            "Ok".to_string()
        }
        Err(e) => format!("error ({e})"),
    };
    println!("heapfault: {mode}: survivor got {got}: OK");
    Ok(())
}

/// Sends to the dying receiver: the send ends, done or with an error.
fn surviving_sender(world: &tmpi::World, mode: &str) -> BoxResult {
    let buf: Vec<u8> = (0..BIG).map(pattern).collect();
    warm(world, &buf, &mut [])?;
    world.barrier()?;
    let got = match world.send(&buf, 1, TAG) {
        Ok(()) => "Ok".to_string(),
        Err(e) => format!("error ({e})"),
    };
    println!("heapfault: {mode}: survivor got {got}: OK");
    Ok(())
}

/// Receives into the shared heap and dies a millisecond into the receive.
fn dying_receiver(world: &tmpi::World) -> BoxResult {
    let mut buf = world.alloc_shared::<u8>(BIG)?;
    warm(world, &[], &mut buf)?;
    world.barrier()?;
    tmpi::scope(|s| -> tmpi::Result<()> {
        let mut r = world.irecv(s, &mut buf, 0, TAG)?;
        let t0 = Instant::now();
        poll_then_die(&mut r, || t0.elapsed() > Duration::from_millis(1))
    })?;
    Ok(())
}
