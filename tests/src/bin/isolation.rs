//! Messages on one communicator are never seen on another.
//!
//! 1. `dup`: rank 1 sends on the dup first, then on the world with the same tag; rank 0's
//!    `ANY_SOURCE`/`ANY_TAG` receive on the world must get the world message, and an `iprobe`
//!    on a second dup sees nothing.
//! 2. `split` (halves by parity): every rank sends to rank 0 of its half on the half; after a
//!    world barrier, world rank 0 finds nothing with `iprobe(ANY_SOURCE, ANY_TAG)` on the
//!    world; the half's rank 0 receives them with sources numbered in the half.
//! 3. Collectives use a context of their own: a pending wildcard `irecv` on the world is not
//!    matched by an `allreduce`, `bcast` or `barrier` on the world or the dup.

use std::error::Error as StdError;

use tmpi::{ANY_SOURCE, ANY_TAG};
use tmpi_tests::Verdict;

fn dup_isolation(world: &tmpi::Comm, v: &mut Verdict) -> tmpi::Result<()> {
    let dup = world.dup()?;
    let other = world.dup()?;
    match world.rank() {
        1 => {
            dup.send(&[111u64], 0, 5)?;
            world.send(&[222u64], 0, 5)?;
        }
        0 => {
            // Wait until the dup's message (sent first) has certainly arrived on the dup.
            let st = dup.probe(1, 5)?;
            v.check(st.len() == 8, || format!("dup probe {st:?}"));
            match other.iprobe(ANY_SOURCE, ANY_TAG) {
                Ok(None) => v.check(true, String::new),
                r => v.check(false, || format!("a second dup sees a message: {r:?}")),
            }
            let mut b = [0u64];
            let st = world.recv(&mut b, ANY_SOURCE, ANY_TAG)?;
            v.check(b[0] == 222 && st.source() == 1 && st.tag() == 5, || {
                format!("world receive got {b:?} {st:?}: the dup's message leaked")
            });
            let st = dup.recv(&mut b, ANY_SOURCE, ANY_TAG)?;
            v.check(b[0] == 111 && st.source() == 1, || format!("dup receive got {b:?} {st:?}"));
        }
        _ => {}
    }
    world.barrier()
}

fn split_isolation(world: &tmpi::Comm, v: &mut Verdict) -> tmpi::Result<()> {
    let (rank, n) = (world.rank(), world.size());
    let Some(half) = world.split(Some((rank % 2) as u32), rank as i32)? else {
        v.check(false, || "split with a color returned None".into());
        return Ok(());
    };
    v.check(half.rank() == rank / 2, || format!("half rank {} for world rank {rank}", half.rank()));
    if half.rank() != 0 {
        half.send(&[rank as u64], 0, 9)?;
    }
    world.barrier()?;
    if rank == 0 {
        // Give messages of the halves time to arrive, then look on the world.
        std::thread::sleep(std::time::Duration::from_millis(50));
        match world.iprobe(ANY_SOURCE, ANY_TAG) {
            Ok(None) => v.check(true, String::new),
            r => v.check(false, || format!("world sees a message sent on a half: {r:?}")),
        }
    }
    if half.rank() == 0 {
        let members = (n + 1 - rank % 2) / 2;
        for _ in 1..members {
            let mut b = [0u64];
            let st = half.recv(&mut b, ANY_SOURCE, 9)?;
            let world_rank = b[0] as usize;
            v.check(st.source() == world_rank / 2 && world_rank % 2 == rank % 2, || {
                format!("half message from world rank {world_rank} has source {}", st.source())
            });
        }
    }
    world.barrier()
}

fn collective_context(world: &tmpi::Comm, v: &mut Verdict) -> tmpi::Result<()> {
    let dup = world.dup()?;
    let (rank, n) = (world.rank(), world.size());
    let mut got = [0u64; 1];
    tmpi::scope(|s| -> tmpi::Result<()> {
        let mut r = if rank == 0 { Some(world.irecv(s, &mut got, ANY_SOURCE, ANY_TAG)?) } else { None };
        let mut sum = [0u64];
        world.allreduce(&[1u64], &mut sum, tmpi::Op::Sum)?;
        dup.allreduce(&[1u64], &mut sum, tmpi::Op::Sum)?;
        let mut b = [rank as u64; 3];
        world.bcast(&mut b, n - 1)?;
        world.barrier()?;
        dup.barrier()?;
        v.check(sum[0] == n as u64 && b == [n as u64 - 1; 3], || format!("collectives gave {sum:?} {b:?}"));
        if let Some(r) = r.as_mut() {
            match r.test() {
                Ok(None) => v.check(true, String::new),
                other => v.check(false, || format!("a wildcard irecv matched collective traffic: {other:?}")),
            }
        }
        world.barrier()?;
        if rank == n - 1 {
            world.send(&[77u64], 0, 3)?;
        }
        if let Some(r) = r {
            let st = r.wait()?;
            v.check(st.source() == n - 1 && st.tag() == 3, || format!("wildcard irecv status {st:?}"));
        }
        Ok(())
    })?;
    if rank == 0 {
        v.check(got[0] == 77, || format!("wildcard irecv got {got:?}"));
    }
    Ok(())
}

fn main() -> Result<(), Box<dyn StdError>> {
    let world = tmpi::init()?;
    let mut v = Verdict::new("isolation", world.rank());
    if world.size() >= 2 {
        dup_isolation(&world, &mut v)?;
    }
    split_isolation(&world, &mut v)?;
    collective_context(&world, &mut v)?;
    let summary = format!("{} ranks: dup, split and collective contexts", world.size());
    v.finish(&world, &summary)?;
    world.finalize()?;
    Ok(())
}
