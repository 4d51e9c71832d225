//! A request set that hands back what completed: each rank receives a block from every rank
//! (self included) into its own slot, and a message of unknown length by `irecv_vec`, all in
//! one `tmpi::RequestSet`. Each completion names the request's index in the set, its status
//! and its buffer, so a block is summed the moment it arrives, inside the scope, without
//! waiting for the rest. The sends go in ready mode (`rsend`'s non-blocking form, `irsend`):
//! a barrier after posting the receives makes every receive posted before any send starts.

use std::error::Error;

use tmpi_examples::check;

const BLOCK: usize = 1024;

fn main() -> Result<(), Box<dyn Error>> {
    let world = tmpi::init()?;
    let (me, n) = (world.rank(), world.size());
    let mut slots = vec![vec![0u64; BLOCK]; n];
    let mine: Vec<u64> = (0..BLOCK as u64).map(|i| me as u64 * 1_000_000 + i).collect();
    let note = vec![me as u64; me + 1];
    let (mut sum, mut handed_back, mut vec_len) = (0u64, 0usize, 0usize);
    tmpi::scope(|s| -> Result<(), Box<dyn Error>> {
        let mut set = tmpi::RequestSet::new();
        for (src, slot) in slots.iter_mut().enumerate() {
            set.irecv(&world, s, slot, src, 1)?;
        }
        let vec_at = set.irecv_vec(&world, (me + n - 1) % n, 2)?;
        world.barrier()?;
        for dst in 0..n {
            let r = world.irsend(s, &mine, dst, 1)?;
            set.add(r);
        }
        set.isend(&world, s, &note, (me + 1) % n, 2)?;
        while let Some(done) = set.wait_any()? {
            let st = done.result?;
            match done.data {
                tmpi::Done::Received(block) => {
                    // Index i < n is the receive from rank i.
                    check(st.source() == done.index && block[7] == done.index as u64 * 1_000_000 + 7, || {
                        format!("slot {} holds rank {}'s block", done.index, st.source())
                    })?;
                    sum += block.iter().sum::<u64>();
                    handed_back += 1;
                }
                tmpi::Done::Vec(v) => {
                    check(done.index == vec_at && v.len() == (me + n - 1) % n + 1, || format!("irecv_vec got {} words", v.len()))?;
                    vec_len = v.len();
                }
                tmpi::Done::Sent(_) | tmpi::Done::Other => handed_back += 1,
            }
        }
        Ok(())
    })?;
    let n64 = n as u64;
    let b = BLOCK as u64;
    let want = n64 * (n64 - 1) / 2 * 1_000_000 * b + n64 * b * (b - 1) / 2;
    check(sum == want, || format!("sum {sum}, expected {want}"))?;
    check(handed_back == 2 * n + 1, || format!("{handed_back} completions handed back"))?;
    check(vec_len > 0, || "the irecv_vec never completed".to_string())?;
    let mut all = [0u64];
    world.allreduce(&[u64::from(sum == want)], &mut all, tmpi::Op::Sum)?;
    if me == 0 {
        println!(
            "reqset: {n} ranks, each summed {n} blocks as they completed (index, status, buffer) beside an irecv_vec, ready-mode sends: OK"
        );
    }
    check(all[0] == n64, || "a rank's sum was wrong".to_string())?;
    Ok(())
}
