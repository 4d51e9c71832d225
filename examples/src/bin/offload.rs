//! Pre-posted receives, the pattern tag-matching offload accelerates.
//!
//! Rank 0 posts, before anything is sent, `SPECIFIC` source-specific receives of 16 KiB per
//! peer (distinct tags) and `ANY` wildcard-source receives of 1 KiB per peer (one shared
//! tag); a barrier then releases the peers, which send. Rank 0 checks every payload, that
//! the source-specific receives got their own sender's messages, and that the wildcard
//! receives matched each sender's messages in send order. With `TMPI_STATS=1` the runtime
//! prints its statistics line (how many receives matched in the offloaded matcher) at the end.

use std::error::Error;

use tmpi_examples::check;

const SPECIFIC: usize = 4;
const ANY: usize = 2;
const BIG: usize = 2048; // u64 words = 16 KiB: offloaded at the default TMPI_TM_THRESH
const SMALL: usize = 128; // u64 words = 1 KiB
const SPECIFIC_TAG: tmpi::Tag = 100;
const ANY_TAG_VALUE: tmpi::Tag = 200;

fn word(sender: usize, kind: usize, k: usize, i: usize) -> u64 {
    ((sender as u64) << 48) ^ ((kind as u64) << 40) ^ ((k as u64) << 24) ^ i as u64
}

fn payload(sender: usize, kind: usize, k: usize, len: usize) -> Vec<u64> {
    (0..len).map(|i| word(sender, kind, k, i)).collect()
}

fn main() -> Result<(), Box<dyn Error>> {
    let world = tmpi::init()?;
    let (rank, n) = (world.rank(), world.size());
    if n < 2 {
        println!("offload: needs at least 2 ranks (run with tmpirun -n 2 or more); nothing to do");
        world.finalize()?;
        return Ok(());
    }
    if rank == 0 {
        receive_all(&world)?;
    } else {
        world.barrier()?;
        // Wildcard-targeted messages first, then the specific ones in reverse tag order, so
        // rank 0's matcher sees arrivals in an order different from its posting order.
        for k in 0..ANY {
            world.send(&payload(rank, 1, k, SMALL), 0, ANY_TAG_VALUE)?;
        }
        for k in (0..SPECIFIC).rev() {
            world.send(&payload(rank, 0, k, BIG), 0, SPECIFIC_TAG + k as tmpi::Tag)?;
        }
    }
    world.finalize()?;
    Ok(())
}

/// Rank 0: every receive posted before the barrier releases the senders, then each checked.
fn receive_all(world: &tmpi::World) -> Result<(), Box<dyn Error>> {
    let peers = world.size() - 1;
    let mut specific = vec![vec![0u64; BIG]; peers * SPECIFIC];
    let mut any = vec![vec![0u64; SMALL]; peers * ANY];
    let (spec_st, any_st) = tmpi::scope(|s| -> tmpi::Result<(Vec<tmpi::Status>, Vec<tmpi::Status>)> {
        let mut spec_reqs = Vec::with_capacity(specific.len());
        for (idx, buf) in specific.iter_mut().enumerate() {
            let (p, k) = (1 + idx / SPECIFIC, idx % SPECIFIC);
            spec_reqs.push(world.irecv(s, buf, p, SPECIFIC_TAG + k as tmpi::Tag)?);
        }
        let mut any_reqs = Vec::with_capacity(any.len());
        for buf in any.iter_mut() {
            any_reqs.push(world.irecv(s, buf, tmpi::ANY_SOURCE, ANY_TAG_VALUE)?);
        }
        world.barrier()?; // every receive is posted before any peer sends
        Ok((tmpi::wait_all(spec_reqs)?, tmpi::wait_all(any_reqs)?))
    })?;
    check_specific(&specific, &spec_st)?;
    check_wildcard(&any, &any_st, world.size())?;
    println!(
        "offload: {} pre-posted source-specific 16 KiB receives and {} ANY_SOURCE 1 KiB receives from {peers} peers matched and verified: OK",
        peers * SPECIFIC,
        peers * ANY
    );
    Ok(())
}

/// The source-specific receives got their own sender's messages.
fn check_specific(bufs: &[Vec<u64>], sts: &[tmpi::Status]) -> Result<(), Box<dyn Error>> {
    for (idx, (buf, st)) in bufs.iter().zip(sts).enumerate() {
        let (p, k) = (1 + idx / SPECIFIC, idx % SPECIFIC);
        check(st.source() == p && st.tag() == SPECIFIC_TAG + k as tmpi::Tag && st.len() == BIG * 8, || {
            format!("specific receive {k} from {p}: status {st:?}")
        })?;
        check(*buf == payload(p, 0, k, BIG), || format!("specific message {k} from {p}: payload corrupt"))?;
    }
    Ok(())
}

/// The wildcard receives matched each sender's messages in send order, `ANY` of each.
fn check_wildcard(bufs: &[Vec<u64>], sts: &[tmpi::Status], n: usize) -> Result<(), Box<dyn Error>> {
    let mut seen = vec![0usize; n];
    for (buf, st) in bufs.iter().zip(sts) {
        let p = st.source();
        check(p >= 1 && p < n && st.tag() == ANY_TAG_VALUE && st.len() == SMALL * 8, || format!("wildcard receive: status {st:?}"))?;
        let k = seen[p];
        check(k < ANY && *buf == payload(p, 1, k, SMALL), || format!("wildcard receive: message {k} of rank {p} out of order or corrupt"))?;
        seen[p] += 1;
    }
    check(seen.iter().skip(1).all(|&c| c == ANY), || format!("wildcard matches per sender: {seen:?}"))?;
    Ok(())
}
