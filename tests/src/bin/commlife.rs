//! A communicator's id outlives the communicator while anything on it is still pending
//! (issue 55, item 1): a dropped communicator's id must not go to the next `dup` while a
//! non-blocking collective, a receive (`ANY_SOURCE` too) or a matched-probe `Message` on it
//! still runs, or that `dup`'s messages cross with the old ones.
//!
//! Each round, on every rank:
//! - **collective**: `d = dup`, `iallreduce(d)` of 2 MiB, `drop(d)`, `d2 = dup`, `bcast(d2)`
//!   of 2 MiB, then the iallreduce is waited for: both must carry their own values (whether
//!   the old schedule still has a receive posted when the bcast's data comes is a race, so
//!   this case runs `--rounds` times);
//! - **receive**: rank 0 posts `irecv(ANY_SOURCE, 5)` on `d` and drops `d`; `d2 = dup`; rank 1
//!   sends two messages with tag 5 on `d2`, which rank 0 must receive in order on `d2`; the old
//!   receive must still be pending (then it is cancelled);
//! - **probe**: rank 1 sends on `d`, rank 0 takes the message with `mprobe` and drops `d`;
//!   `d2 = dup`, rank 1 sends on `d2` with the same tag; rank 0 receives both where they
//!   belong.
//!
//! `commlife [--rounds N]` (default 20); prints `commlife: N ranks, R rounds: C checks: OK`.

use std::error::Error as StdError;

use tmpi::{scope, Comm, Op, ANY_SOURCE};
use tmpi_tests::{number_flag, Verdict};

/// Elements of the large buffers (2 MiB of `u64`): a rendezvous, several rounds of progress.
const BIG: usize = 1 << 18;

fn collective_case(world: &Comm, round: usize, v: &mut Verdict) -> tmpi::Result<()> {
    let (r, p) = (world.rank(), world.size());
    let mut d = Some(world.dup()?);
    let send = vec![r as u64 + 1; BIG];
    let mut sum = vec![0u64; BIG];
    let want_sum = (p * (p + 1) / 2) as u64;
    scope(|s| -> tmpi::Result<()> {
        let req = d.as_ref().map(|d| d.iallreduce(s, &send, &mut sum, Op::Sum)).transpose()?;
        drop(d.take());
        let d2 = world.dup()?;
        // The same length as the iallreduce, whose bcast half has the same tags: a message of
        // one that reached the other's receive would pass unnoticed but for its values.
        let mut big: Vec<u64> = (0..BIG).map(|i| if r == 0 { 1000 + i as u64 } else { 0 }).collect();
        d2.bcast(&mut big, 0)?;
        let bad = big.iter().enumerate().filter(|&(i, &x)| x != 1000 + i as u64).count();
        v.check(bad == 0, || format!("round {round}: 2 MiB bcast on the new dup: {bad} wrong elements"));
        if let Some(req) = req {
            req.wait()?;
        }
        Ok(())
    })?;
    let bad = sum.iter().filter(|&&x| x != want_sum).count();
    v.check(bad == 0, || format!("round {round}: iallreduce on the dropped dup: {bad} wrong elements (want {want_sum})"));
    Ok(())
}

fn recv_case(world: &Comm, round: usize, v: &mut Verdict) -> tmpi::Result<()> {
    let r = world.rank();
    let mut d = Some(world.dup()?);
    let mut old = [0u64];
    scope(|s| -> tmpi::Result<()> {
        let mut pending = match (r, d.as_ref()) {
            (0, Some(d)) => Some(d.irecv(s, &mut old, ANY_SOURCE, 5)?),
            _ => None,
        };
        drop(d.take());
        let d2 = world.dup()?;
        match r {
            0 => {
                let mut got = [0u64];
                d2.recv(&mut got, 1, 5)?;
                v.check(got[0] == 11, || format!("round {round}: first message on the new dup: got {} (want 11)", got[0]));
                if got[0] == 11 {
                    d2.recv(&mut got, 1, 5)?;
                    v.check(got[0] == 12, || format!("round {round}: second message on the new dup: got {} (want 12)", got[0]));
                }
                if let Some(mut req) = pending.take() {
                    let early = req.test()?;
                    v.check(early.is_none(), || format!("round {round}: the dropped dup's ANY_SOURCE receive completed with {early:?}"));
                    if early.is_none() {
                        req.cancel()?;
                        let st = req.wait()?;
                        v.check(st.cancelled(), || format!("round {round}: the dropped dup's receive ended {st:?}, not cancelled"));
                    }
                }
            }
            1 => {
                d2.send(&[11u64], 0, 5)?;
                d2.send(&[12u64], 0, 5)?;
            }
            _ => {}
        }
        Ok(())
    })?;
    Ok(())
}

fn probe_case(world: &Comm, round: usize, v: &mut Verdict) -> tmpi::Result<()> {
    let r = world.rank();
    let d = world.dup()?;
    let msg = match r {
        0 => Some(d.mprobe(1, 9)?),
        1 => {
            d.send(&[21u64], 0, 9)?;
            None
        }
        _ => None,
    };
    drop(d);
    let d2 = world.dup()?;
    match r {
        0 => {
            let mut got = [0u64];
            d2.recv(&mut got, 1, 9)?;
            v.check(got[0] == 22, || format!("round {round}: message on the new dup: got {} (want 22)", got[0]));
            if let Some(m) = msg {
                let mut old = [0u64];
                m.recv(&mut old)?;
                v.check(old[0] == 21, || format!("round {round}: probed message of the dropped dup: got {} (want 21)", old[0]));
            }
        }
        1 => d2.send(&[22u64], 0, 9)?,
        _ => {}
    }
    Ok(())
}

fn main() -> Result<(), Box<dyn StdError>> {
    let args: Vec<String> = std::env::args().collect();
    let rounds = number_flag("commlife", &args, "--rounds", 20)? as usize;
    let world = tmpi::init()?;
    let mut v = Verdict::new("commlife", world.rank());
    if world.size() >= 2 {
        for round in 0..rounds {
            collective_case(&world, round, &mut v)?;
            recv_case(&world, round, &mut v)?;
            probe_case(&world, round, &mut v)?;
        }
    }
    let summary = format!("{} ranks, {rounds} rounds", world.size());
    v.finish(&world, &summary)?;
    world.finalize()?;
    Ok(())
}
