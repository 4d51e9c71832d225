//! The usage snippet of the API contract (`/work/shared/API.md`), as a program.
//!
//! Each rank posts an `irecv` from `ANY_SOURCE` and an `isend` to the next rank inside a
//! `tmpi::scope`, waits for both, then `allreduce`s a 1. Beyond the snippet's own assertion it
//! checks the payload came from the previous rank and the sum is the number of ranks.

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
    if rank == 0 {
        println!("apisnippet: {n} ranks: isend/irecv in a scope, wait, allreduce = {}: OK", sum[0]);
    }
    world.finalize()?;
    Ok(())
}
