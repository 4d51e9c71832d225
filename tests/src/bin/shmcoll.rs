//! The shared-memory collectives (barrier, bcast, reduce, allreduce) through `tmpirun`.
//!
//! `shmcoll check [ROUNDS]` (default 20): on the world communicator, a `dup`, a split into two
//! halves (reversed keys) and a split that leaves rank 0 out, each rank checks every one of
//! the four collectives at sizes from 8 bytes to beyond a collective slot (where the
//! point-to-point algorithms take over after a handshake), with varying roots, interleaved
//! with point-to-point traffic on the same communicators (a message sent before the
//! collectives and received after them); then 100 dup/drop cycles (the pool of collective
//! contexts is recycled) and 20 live dups at once (more than the pool: the rest fall back to
//! point-to-point). Rank 0 prints `shmcoll: N ranks: ... OK`.
//!
//! `shmcoll mixed [ROUNDS]` (default 200): on the world communicator and a `dup`, the
//! shared-memory collectives interleaved with the collectives that never use the slots and
//! let ranks leave at different times (gather, scatter, allgather and alltoall, some of zero
//! elements), each result checked. Regression: a rank that left a gather early used to enter
//! the next shared-memory call and overwrite a slot a slower rank was still reading (a false
//! `PeerGone`). Rank 0 prints `shmcoll: mixed: N ranks: ... OK`.
//!
//! `shmcoll leave VICTIM`: after a first barrier, rank VICTIM finalizes and exits while the
//! others enter a barrier and an allreduce it never joins; each must end with `PeerGone`
//! (not hang). Every survivor prints `shmcoll: leave: rank R: PeerGone OK` and exits 0; one
//! whose call succeeded or failed otherwise exits 1.

use std::error::Error as StdError;

use tmpi::{Comm, Error, Op};
use tmpi_tests::Verdict;

/// Element counts (u64): 8 B to 1 KiB, a full slot (4 KiB), just above, and 64 KiB.
const COUNTS: [usize; 7] = [1, 2, 16, 128, 512, 513, 8192];
const TAG: u32 = 9;

fn round(c: &Comm, name: &str, r: u64, v: &mut Verdict) -> tmpi::Result<()> {
    let (me, p) = (c.rank(), c.size());
    let (me64, p64) = (me as u64, p as u64);
    // A message that stays in flight across the collectives.
    let right = (me + 1) % p;
    let left = (me + p - 1) % p;
    c.send(&[r * 1000 + me64], right, TAG)?;
    for (i, &k) in COUNTS.iter().enumerate() {
        let root = (i + r as usize) % p;
        let send: Vec<u64> = (0..k as u64).map(|j| j + me64 * 3 + r).collect();
        let mut out = vec![0u64; k];
        c.allreduce(&send, &mut out, Op::Sum)?;
        let ok = out.iter().enumerate().all(|(j, &x)| x == p64 * (j as u64 + r) + 3 * p64 * (p64 - 1) / 2);
        v.check(ok, || format!("{name}: allreduce of {k} u64 in round {r}"));
        let mut mine = vec![0u64; k];
        c.reduce(&send, (me == root).then_some(&mut mine[..]), Op::Min, root)?;
        if me == root {
            let ok = mine.iter().enumerate().all(|(j, &x)| x == j as u64 + r);
            v.check(ok, || format!("{name}: reduce of {k} u64 to {root} in round {r}"));
        }
        let mut b: Vec<u64> = if me == root { (0..k as u64).map(|j| j * r + 1).collect() } else { vec![0; k] };
        c.bcast(&mut b, root)?;
        let ok = b.iter().enumerate().all(|(j, &x)| x == j as u64 * r + 1);
        v.check(ok, || format!("{name}: bcast of {k} u64 from {root} in round {r}"));
        c.barrier()?;
    }
    let mut got = [0u64];
    c.recv(&mut got, left, TAG)?;
    v.check(got[0] == r * 1000 + left as u64, || format!("{name}: p2p across collectives in round {r}: {}", got[0]));
    Ok(())
}

fn check(rounds: u64) -> Result<(), Box<dyn StdError>> {
    let world = tmpi::init()?;
    let (me, p) = (world.rank(), world.size());
    let mut v = Verdict::new("shmcoll", me);
    let dup = world.dup()?;
    let half = world.split(Some((me % 2) as u32), -(me as i32))?.ok_or("split gave no communicator")?;
    let without0 = world.split((me != 0).then_some(1), me as i32)?;
    for r in 0..rounds {
        round(&world, "world", r, &mut v)?;
        round(&dup, "dup", r, &mut v)?;
        round(&half, "half", r, &mut v)?;
        if let Some(c) = &without0 {
            round(c, "without 0", r, &mut v)?;
        }
    }
    drop((dup, half, without0));
    for i in 0..100u32 {
        let d = world.dup()?;
        let mut s = [0u32];
        d.allreduce(&[i + me as u32], &mut s, Op::Sum)?;
        v.check(s[0] == p as u32 * i + (p * (p - 1) / 2) as u32, || format!("dup cycle {i}: {}", s[0]));
    }
    let many: Vec<Comm> = (0..20).map(|_| world.dup()).collect::<tmpi::Result<_>>()?;
    for (i, d) in many.iter().enumerate().rev() {
        let mut s = [0u64];
        d.allreduce(&[1u64], &mut s, Op::Sum)?;
        v.check(s[0] == p as u64, || format!("live dup {i}: {}", s[0]));
        d.barrier()?;
    }
    drop(many);
    v.finish(&world, &format!("{p} ranks: {rounds} rounds on world, dup and splits, 100 dup cycles, 20 live dups"))?;
    world.finalize()?;
    Ok(())
}

fn mixed(rounds: u64) -> Result<(), Box<dyn StdError>> {
    let world = tmpi::init()?;
    let (me, p) = (world.rank(), world.size());
    let mut v = Verdict::new("shmcoll: mixed", me);
    let dup = world.dup()?;
    for r in 0..rounds {
        for (name, c) in [("world", &*world), ("dup", &dup)] {
            let root = (r as usize) % p;
            let mut s = [0u64];
            c.allreduce(&[r + me as u64], &mut s, Op::Sum)?;
            v.check(s[0] == r * p as u64 + (p * (p - 1) / 2) as u64, || format!("{name}: allreduce in round {r}: {}", s[0]));
            let mut g = vec![0u64; p];
            c.gather(&[me as u64 + r], (me == root).then_some(&mut g[..]), root)?;
            if me == root {
                v.check(g.iter().enumerate().all(|(j, &x)| x == j as u64 + r), || format!("{name}: gather in round {r}"));
            }
            let mut b = [if me == root { r } else { 0 }];
            c.bcast(&mut b, root)?;
            v.check(b[0] == r, || format!("{name}: bcast in round {r}"));
            let all: Vec<u64> = (0..p as u64).map(|j| j * 10 + r).collect();
            let mut one = [0u64];
            c.scatter((me == root).then_some(&all[..]), &mut one, root)?;
            v.check(one[0] == me as u64 * 10 + r, || format!("{name}: scatter in round {r}"));
            c.barrier()?;
            c.allgather::<u64>(&[], &mut [])?;
            let mut m = [0u64];
            c.reduce(&[me as u64], (me == root).then_some(&mut m[..]), Op::Max, root)?;
            if me == root {
                v.check(m[0] == p as u64 - 1, || format!("{name}: reduce in round {r}"));
            }
            let send: Vec<u64> = (0..p as u64).map(|j| me as u64 * 100 + j).collect();
            let mut recv = vec![0u64; p];
            c.alltoall(&send, &mut recv)?;
            v.check(recv.iter().enumerate().all(|(j, &x)| x == j as u64 * 100 + me as u64), || format!("{name}: alltoall in round {r}"));
        }
    }
    v.finish(&world, &format!("{p} ranks: {rounds} rounds on world and a dup"))?;
    drop(dup);
    world.finalize()?;
    Ok(())
}

fn leave(victim: usize) -> Result<(), Box<dyn StdError>> {
    let world = tmpi::init()?;
    let me = world.rank();
    if victim >= world.size() {
        return Err(format!("victim {victim} is not a rank of {}", world.size()).into());
    }
    world.barrier()?;
    if me == victim {
        world.finalize()?;
        return Ok(());
    }
    let b = world.barrier();
    let mut s = [0u64];
    let a = world.allreduce(&[1u64], &mut s, Op::Sum);
    match (&b, &a) {
        (Err(Error::PeerGone { .. }), Err(Error::PeerGone { .. })) => {
            println!("shmcoll: leave: rank {me}: PeerGone OK");
            Ok(())
        }
        _ => Err(format!("shmcoll: leave: rank {me}: barrier gave {b:?}, allreduce {a:?}").into()),
    }
}

fn main() -> Result<(), Box<dyn StdError>> {
    let mut args = std::env::args().skip(1);
    match args.next().as_deref() {
        Some("check") => {
            let rounds = args.next().map(|a| a.parse()).transpose().map_err(|_| "shmcoll check: bad ROUNDS")?.unwrap_or(20);
            check(rounds)
        }
        Some("mixed") => {
            let rounds = args.next().map(|a| a.parse()).transpose().map_err(|_| "shmcoll mixed: bad ROUNDS")?.unwrap_or(200);
            mixed(rounds)
        }
        Some("leave") => {
            let victim = args.next().ok_or("shmcoll leave VICTIM")?.parse().map_err(|_| "shmcoll leave: bad VICTIM")?;
            leave(victim)
        }
        _ => Err("usage: shmcoll check [ROUNDS] | shmcoll mixed [ROUNDS] | shmcoll leave VICTIM".into()),
    }
}
