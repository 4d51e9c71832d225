//! Non-blocking ping-pong with 64 messages in flight each way.
//!
//! Ranks pair up (0-1, 2-3, ...; a rank without a partner talks to itself). Each round, each
//! rank posts 64 `irecv`s, then starts 64 `isend`s to its partner, with sizes from 0 bytes to
//! 72 KB (eager and rendezvous mixed), and waits for all. Part A gives every message its own
//! tag and sends in reverse tag order; part B uses one tag for all 64, so the k-th receive
//! must get the k-th message (non-overtaking) whatever its size; part C completes the
//! receives with `wait_any`; part D posts 64 `irecv_vec`s (receives of unknown size, one tag)
//! before the sends, so the k-th gets the k-th message. Every payload and status is checked.

use std::error::Error as StdError;

use tmpi::Status;
use tmpi_tests::Verdict;

const K: usize = 64;
const ROUNDS: usize = 6;
const SAME_TAG: tmpi::Tag = 1000;

fn len(k: usize) -> usize {
    [0, 1, 3, 64, 600, 2000, 9000, 16][k % 8]
}

fn payload(sender: usize, round: usize, k: usize) -> Vec<u64> {
    (0..len(k)).map(|i| ((sender as u64) << 48) ^ ((round as u64) << 40) ^ ((k as u64) << 24) ^ i as u64).collect()
}

fn check_all(v: &mut Verdict, part: &str, peer: usize, round: usize, bufs: &[Vec<u64>], sts: &[Status], tag_of: impl Fn(usize) -> u32) {
    for (k, (b, st)) in bufs.iter().zip(sts).enumerate() {
        v.check(st.source() == peer && st.tag() == tag_of(k) && st.count::<u64>() == len(k) && *b == payload(peer, round, k), || {
            format!("part {part} round {round} message {k}: status {st:?} or payload wrong")
        });
    }
}

/// One round's setting: the world, the partner, the round, and this rank's payloads.
struct Round<'a> {
    world: &'a tmpi::World,
    peer: usize,
    round: usize,
    out: Vec<Vec<u64>>,
}

impl Round<'_> {
    fn empty_bufs() -> Vec<Vec<u64>> {
        (0..K).map(|k| vec![0; len(k)]).collect()
    }

    /// A: distinct tags, sends in reverse order.
    fn distinct_tags(&self, v: &mut Verdict) -> tmpi::Result<()> {
        let (world, peer) = (self.world, self.peer);
        let mut bufs = Self::empty_bufs();
        let sts = tmpi::scope(|s| -> tmpi::Result<Vec<Status>> {
            let mut recvs = Vec::with_capacity(K);
            for (k, b) in bufs.iter_mut().enumerate() {
                recvs.push(world.irecv(s, b, peer, k as u32)?);
            }
            let mut sends = Vec::with_capacity(K);
            for k in (0..K).rev() {
                sends.push(world.isend(s, &self.out[k], peer, k as u32)?);
            }
            tmpi::wait_all(sends)?;
            tmpi::wait_all(recvs)
        })?;
        check_all(v, "A", peer, self.round, &bufs, &sts, |k| k as u32);
        Ok(())
    }

    /// B: one tag; the k-th receive gets the k-th message.
    fn one_tag(&self, v: &mut Verdict) -> tmpi::Result<()> {
        let (world, peer) = (self.world, self.peer);
        let mut bufs = Self::empty_bufs();
        let sts = tmpi::scope(|s| -> tmpi::Result<Vec<Status>> {
            let mut recvs = Vec::with_capacity(K);
            for b in bufs.iter_mut() {
                recvs.push(world.irecv(s, b, peer, SAME_TAG)?);
            }
            let mut sends = Vec::with_capacity(K);
            for m in &self.out {
                sends.push(world.isend(s, m, peer, SAME_TAG)?);
            }
            let r = tmpi::wait_all(recvs);
            tmpi::wait_all(sends)?;
            r
        })?;
        check_all(v, "B", peer, self.round, &bufs, &sts, |_| SAME_TAG);
        Ok(())
    }

    /// C: completion in any order through `wait_any`.
    fn any_order(&self, v: &mut Verdict) -> tmpi::Result<()> {
        let (world, peer) = (self.world, self.peer);
        let mut bufs = Self::empty_bufs();
        let mut sts: Vec<Option<Status>> = vec![None; K];
        tmpi::scope(|s| -> tmpi::Result<()> {
            let mut recvs = Vec::with_capacity(K);
            for (k, b) in bufs.iter_mut().enumerate() {
                recvs.push(world.irecv(s, b, tmpi::ANY_SOURCE, 2000 + k as u32)?);
            }
            let mut sends = Vec::with_capacity(K);
            for (k, m) in self.out.iter().enumerate() {
                sends.push(world.isend(s, m, peer, 2000 + k as u32)?);
            }
            while !recvs.is_empty() {
                let (_, st) = tmpi::wait_any(&mut recvs)?;
                let k = (st.tag() - 2000) as usize;
                if k < K {
                    v.check(sts[k].is_none(), || format!("part C: tag {} completed twice", st.tag()));
                    sts[k] = Some(st);
                }
            }
            tmpi::wait_all(sends)?;
            Ok(())
        })?;
        let sts: Vec<Status> = sts.into_iter().flatten().collect();
        v.check(sts.len() == K, || format!("part C: {} of {K} receives completed", sts.len()));
        if sts.len() == K {
            check_all(v, "C", peer, self.round, &bufs, &sts, |k| 2000 + k as u32);
        }
        Ok(())
    }

    /// D: receives of unknown size, in MPI order.
    fn unknown_size(&self, v: &mut Verdict) -> tmpi::Result<()> {
        let (world, peer) = (self.world, self.peer);
        let recvs = (0..K).map(|_| world.irecv_vec::<u64>(peer, SAME_TAG + 1)).collect::<tmpi::Result<Vec<_>>>()?;
        tmpi::scope(|s| -> tmpi::Result<()> {
            let sends = self.out.iter().map(|m| world.isend(s, m, peer, SAME_TAG + 1)).collect::<tmpi::Result<Vec<_>>>()?;
            let mut bufs = Vec::with_capacity(K);
            let mut sts = Vec::with_capacity(K);
            for r in recvs {
                let (b, st) = r.wait()?;
                bufs.push(b);
                sts.push(st);
            }
            tmpi::wait_all(sends)?;
            check_all(v, "D", peer, self.round, &bufs, &sts, |_| SAME_TAG + 1);
            Ok(())
        })
    }
}

fn main() -> Result<(), Box<dyn StdError>> {
    let world = tmpi::init()?;
    let (rank, n) = (world.rank(), world.size());
    let peer = if (rank ^ 1) < n { rank ^ 1 } else { rank };
    let mut v = Verdict::new("inflight", rank);
    for round in 0..ROUNDS {
        let r = Round { world: &world, peer, round, out: (0..K).map(|k| payload(rank, round, k)).collect() };
        r.distinct_tags(&mut v)?;
        r.one_tag(&mut v)?;
        r.any_order(&mut v)?;
        r.unknown_size(&mut v)?;
    }
    let summary = format!("{n} ranks, {ROUNDS} rounds of 4 x {K} messages in flight");
    v.finish(&world, &summary)?;
    world.finalize()?;
    Ok(())
}
