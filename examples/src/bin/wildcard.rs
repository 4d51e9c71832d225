//! Rank 0 receives everything with `ANY_SOURCE`/`ANY_TAG` and checks MPI's ordering rule.
//!
//! Every other rank sends `K` messages numbered 0..K with tags cycling through `TAGS`; every
//! fifth message is 64 KiB (so large and small messages interleave), the rest are 32 bytes.
//! Rank 0 takes them in whatever order they arrive from different senders, but from any one
//! sender they must arrive in send order (non-overtaking), and each `Status` must name the
//! real sender and tag. With one rank there is nothing to receive and the check is trivial.

use std::error::Error;

use tmpi_examples::check;

const K: u64 = 50;
const TAGS: u64 = 5;
const BASE_TAG: tmpi::Tag = 10;
const LARGE: usize = 8192; // u64 elements = 64 KiB
const SMALL: usize = 4;

fn len_of(seq: u64) -> usize {
    if seq % 5 == 4 {
        LARGE
    } else {
        SMALL
    }
}

fn tag_of(seq: u64) -> tmpi::Tag {
    BASE_TAG + (seq % TAGS) as tmpi::Tag
}

fn word(sender: u64, seq: u64, i: usize) -> u64 {
    (sender << 40) ^ (seq << 20) ^ i as u64
}

fn main() -> Result<(), Box<dyn Error>> {
    let world = tmpi::init()?;
    let (rank, n) = (world.rank(), world.size());
    if rank == 0 {
        let mut next = vec![0u64; n];
        let total = (n as u64 - 1) * K;
        for _ in 0..total {
            let (msg, st) = world.recv_vec::<u64>(tmpi::ANY_SOURCE, tmpi::ANY_TAG)?;
            check(msg.len() >= 2, || format!("message of {} words from {}", msg.len(), st.source()))?;
            let (sender, seq) = (msg[0], msg[1]);
            let src = st.source();
            check(src as u64 == sender && src != 0 && src < n, || format!("status says source {src}, payload says {sender}"))?;
            check(seq == next[src], || format!("from rank {src}: got message {seq}, expected {} (overtaken)", next[src]))?;
            check(st.tag() == tag_of(seq), || format!("message {seq} from {src}: tag {} expected {}", st.tag(), tag_of(seq)))?;
            check(msg.len() == len_of(seq) && st.count::<u64>() == msg.len(), || {
                format!("message {seq} from {src}: {} words, expected {}", msg.len(), len_of(seq))
            })?;
            check(msg.iter().enumerate().skip(2).all(|(i, &w)| w == word(sender, seq, i)), || {
                format!("message {seq} from {src}: payload corrupt")
            })?;
            next[src] += 1;
        }
        check(next.iter().skip(1).all(|&c| c == K), || format!("per-sender counts {next:?}"))?;
        println!("wildcard: {total} messages from {} senders via ANY_SOURCE/ANY_TAG, per-sender order and statuses: OK", n - 1);
    } else {
        let me = rank as u64;
        for seq in 0..K {
            let mut msg: Vec<u64> = (0..len_of(seq)).map(|i| word(me, seq, i)).collect();
            msg[0] = me;
            msg[1] = seq;
            world.send(&msg, 0, tag_of(seq))?;
        }
    }
    world.finalize()?;
    Ok(())
}
