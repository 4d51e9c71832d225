//! The usage snippet of the API contract (`/work/shared/API.md`), as a program.
//!
//! Each rank posts an `irecv` from `ANY_SOURCE` and an `isend` to the next rank inside a
//! `tmpi::scope`, waits for both, then `allreduce`s a 1. Beyond the snippet's own assertion it
//! checks the payload came from the previous rank and the sum is the number of ranks.
//!
//! Then the one-value forms (issue 59 item 4): `send_one`/`recv_one`, `isend_one`/
//! `irecv_one` in a scope, `bcast_one`, `allreduce_one`, `reduce_one`, each checked.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let world = tmpi::init()?;
    // --- the snippet, as written in API.md ---
    let peer = (world.rank() + 1) % world.size();
    let (sbuf, mut rbuf) = (vec![world.rank() as u64; 1024], vec![0u64; 1024]);
    tmpi::scope(|s| -> tmpi::Result<()> {
        let r = world.irecv(s, &mut rbuf, tmpi::ANY_SOURCE, 7)?;
        let w = world.isend(s, &sbuf, peer, 7)?;
        w.wait()?;
        let st = r.wait()?;
        assert_eq!(st.count::<u64>(), 1024);
        Ok(())
    })?;
    let mut sum = [0u64];
    world.allreduce(&[1u64], &mut sum, tmpi::Op::Sum)?;
    // --- end of the snippet ---
    let (rank, n) = (world.rank(), world.size());
    let prev = ((rank + n - 1) % n) as u64;
    if rbuf.iter().any(|&x| x != prev) {
        return Err(format!("rank {rank}: received data is not rank {prev}'s").into());
    }
    if sum[0] != n as u64 {
        return Err(format!("rank {rank}: allreduce gave {} for {n} ranks", sum[0]).into());
    }
    one_value_calls(&world)?;
    if rank == 0 {
        println!("apisnippet: {n} ranks: isend/irecv in a scope, wait, allreduce = {}, one-value calls: OK", sum[0]);
    }
    world.finalize()?;
    Ok(())
}

/// Each one-value call, with the value it must give.
fn one_value_calls(world: &tmpi::Comm) -> Result<(), Box<dyn std::error::Error>> {
    let (rank, n) = (world.rank(), world.size());
    let (next, prev) = ((rank + 1) % n, (rank + n - 1) % n);
    let mut got = 0u64;
    tmpi::scope(|s| -> tmpi::Result<()> {
        let r = world.irecv_one(s, &mut got, prev, 8)?;
        world.send_one(&(rank as u64 * 3), next, 8)?;
        r.wait().map(|_| ())
    })?;
    let mut back = 0i32;
    let mine = -(rank as i32);
    tmpi::scope(|s| -> tmpi::Result<()> {
        let w = world.isend_one(s, &mine, prev, 9)?;
        world.recv_one(&mut back, next, 9)?;
        w.wait().map(|_| ())
    })?;
    let mut root_says = if rank == 0 { 2.5f64 } else { 0.0 };
    world.bcast_one(&mut root_says, 0)?;
    let max = world.allreduce_one(rank as u32, tmpi::Op::Max)?;
    let sum = world.reduce_one(1u64, tmpi::Op::Sum, n - 1)?;
    let want_sum = (rank == n - 1).then_some(n as u64);
    let checks = [
        (got == prev as u64 * 3, format!("recv_one got {got}, expected {}", prev * 3)),
        (back == -(next as i32), format!("recv_one (from isend_one) got {back}, expected -{next}")),
        (root_says == 2.5, format!("bcast_one gave {root_says}, expected 2.5")),
        (max == n as u32 - 1, format!("allreduce_one Max gave {max}, expected {}", n - 1)),
        (sum == want_sum, format!("reduce_one gave {sum:?}, expected {want_sum:?}")),
    ];
    match checks.iter().find(|(ok, _)| !ok) {
        Some((_, what)) => Err(format!("rank {rank}: {what}").into()),
        None => Ok(()),
    }
}
