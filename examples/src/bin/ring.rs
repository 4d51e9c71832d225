//! A token travels around all ranks a few times; every rank adds its own rank to it.
//!
//! Rank 0 posts its receive from the last rank before it sends, so the program is correct
//! for any number of ranks, one included (rank 0 then sends to itself). After `LAPS` laps the
//! token must hold `LAPS * n * (n - 1) / 2`; rank 0 checks that and prints it.

use std::error::Error;

use tmpi_examples::check;

const LAPS: u64 = 3;
const TAG: tmpi::Tag = 1;

fn main() -> Result<(), Box<dyn Error>> {
    let world = tmpi::init()?;
    let (rank, n) = (world.rank(), world.size());
    let next = (rank + 1) % n;
    let prev = (rank + n - 1) % n;
    if rank == 0 {
        let mut token = [0u64];
        for lap in 0..LAPS {
            let send = token;
            let mut back = [0u64];
            let st = tmpi::scope(|s| -> tmpi::Result<tmpi::Status> {
                let r = world.irecv(s, &mut back, prev, TAG)?;
                world.send(&send, next, TAG)?;
                r.wait()
            })?;
            check(st.source() == prev && st.tag() == TAG && st.count::<u64>() == 1, || {
                format!("lap {lap}: status {st:?}, expected one u64 from rank {prev} tag {TAG}")
            })?;
            token = back;
        }
        let n64 = n as u64;
        let expected = LAPS * n64 * (n64 - 1) / 2;
        check(token[0] == expected, || format!("token {} after {LAPS} laps, expected {expected}", token[0]))?;
        println!("ring: {n} ranks, {LAPS} laps, token = {}: OK", token[0]);
    } else {
        for lap in 0..LAPS {
            let mut token = [0u64];
            let st = world.recv(&mut token, prev, TAG)?;
            check(st.source() == prev && st.count::<u64>() == 1, || {
                format!("rank {rank} lap {lap}: status {st:?}, expected one u64 from {prev}")
            })?;
            token[0] += rank as u64;
            world.send(&token, next, TAG)?;
        }
    }
    world.finalize()?;
    Ok(())
}
