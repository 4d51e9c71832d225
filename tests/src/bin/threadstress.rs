//! Several threads per rank at `Threading::Multiple`, each exchanging thousands of tagged
//! messages with the same thread of every other rank, four ways (by thread index):
//!
//! - 0: non-blocking: batches of `irecv` (named source) and `isend` in a scope, `wait_all`;
//! - 1: blocking `send` to every peer, then `recv` from `ANY_SOURCE` (per-source order);
//! - 2: `sendrecv` in shifted rounds, every `LARGE_EVERY`-th message a rendezvous (300 KB);
//! - 3: `send` of a variable length, then `mprobe` from `ANY_SOURCE` and `Message::recv_vec`.
//!
//! Thread `t` uses tag `t`, so MPI's non-overtaking rule holds per (source, tag): every
//! message carries (source rank, thread, sequence number) and a payload derived from them,
//! and the receiver checks content and order.
//!
//! `threadstress [THREADS] [MSGS] [LARGE_EVERY]` (defaults 4, 4000, 500; 0: no large ones).

use tmpi::{Comm, Threading, ANY_SOURCE};
use tmpi_tests::Verdict;

/// Bytes of a large (rendezvous) message.
const LARGE: usize = 300 * 1024;
/// Messages per batch of the non-blocking mode.
const BATCH: u32 = 16;

/// Words of message `i` from `src`'s thread `t` in modes 2 and 3 (at least the 3 header
/// words).
fn words(i: u32, t: u32, large_every: u32) -> usize {
    if t % 4 == 2 && large_every != 0 && i % large_every == large_every - 1 {
        LARGE / 4
    } else {
        3 + ((i as usize * 7 + t as usize) % 61)
    }
}

fn message(src: usize, t: u32, i: u32, len: usize) -> Vec<u32> {
    let mut m = vec![src as u32, t, i];
    m.extend((3..len).map(|k| (src as u32).wrapping_mul(31) ^ t.wrapping_mul(7) ^ i.wrapping_add(k as u32)));
    m.truncate(len.max(3));
    m
}

/// Checks one received message: from `src`, thread `t`, sequence `i`, `len` words.
fn check_msg(got: &[u32], src: usize, t: u32, i: u32, len: usize) -> Result<(), String> {
    if got.len() != len || got != message(src, t, i, len).as_slice() {
        let head: Vec<u32> = got.iter().take(3).copied().collect();
        return Err(format!("thread {t}: from rank {src} expected message {i} ({len} words), got {head:?}... ({} words)", got.len()));
    }
    Ok(())
}

/// One thread's setting: its communicator, number, message count and large-message period.
struct Thread<'a> {
    w: &'a Comm,
    t: u32,
    msgs: u32,
    large_every: u32,
    /// Every rank but this one.
    peers: Vec<usize>,
}

/// Runs thread `t`; returns the number of messages checked.
fn run_thread(w: &Comm, t: u32, msgs: u32, large_every: u32) -> Result<u64, String> {
    let peers: Vec<usize> = (0..w.size()).filter(|&p| p != w.rank()).collect();
    let th = Thread { w, t, msgs, large_every, peers };
    match t % 4 {
        0 => th.batches(),
        1 => th.any_source(),
        2 => th.sendrecv_ring(),
        _ => th.matched_probes(),
    }
}

impl Thread<'_> {
    fn err(&self, what: &str, err: tmpi::Error) -> String {
        format!("thread {}: {what}: {err}", self.t)
    }

    /// Batches of `isend`s to and `irecv`s from every peer, completed by `wait_all`.
    fn batches(&self) -> Result<u64, String> {
        let (w, t, rank, peers) = (self.w, self.t, self.w.rank(), &self.peers);
        let (mut i, mut checked) = (0, 0);
        while i < self.msgs {
            let b = BATCH.min(self.msgs - i);
            let out: Vec<Vec<u32>> = (0..b).map(|k| message(rank, t, i + k, 8)).collect();
            let mut inb: Vec<Vec<u32>> = vec![vec![0u32; 8]; (b as usize) * peers.len()];
            tmpi::scope(|s| -> Result<(), String> {
                let mut reqs = Vec::new();
                for (j, buf) in inb.iter_mut().enumerate() {
                    let p = peers[j / b as usize];
                    reqs.push(w.irecv(s, buf, p, t).map_err(|x| self.err("irecv", x))?);
                }
                for &p in peers {
                    for m in &out {
                        reqs.push(w.isend(s, m, p, t).map_err(|x| self.err("isend", x))?);
                    }
                }
                tmpi::wait_all(reqs).map_err(|x| self.err("wait_all", x)).map(drop)
            })?;
            for (j, got) in inb.iter().enumerate() {
                check_msg(got, peers[j / b as usize], t, i + (j as u32 % b), 8)?;
                checked += 1;
            }
            i += b;
        }
        Ok(checked)
    }

    /// Blocking sends of 5 words to every peer, received by `recv` from `ANY_SOURCE`.
    fn any_source(&self) -> Result<u64, String> {
        self.to_all_from_any(
            |_| 5,
            |th| {
                let mut got = [0u32; 5];
                let st = th.w.recv(&mut got, ANY_SOURCE, th.t).map_err(|x| th.err("recv", x))?;
                Ok((got.to_vec(), st.source()))
            },
        )
    }

    /// Blocking sends to every peer (some large), taken by matched probes from `ANY_SOURCE`.
    fn matched_probes(&self) -> Result<u64, String> {
        self.to_all_from_any(
            |i| words(i, self.t, self.large_every),
            |th| {
                let msg = th.w.mprobe(ANY_SOURCE, th.t).map_err(|x| th.err("mprobe", x))?;
                let src = msg.status().source();
                let (got, _) = msg.recv_vec::<u32>().map_err(|x| th.err("mrecv", x))?;
                Ok((got, src))
            },
        )
    }

    /// Each round, message `i` of `len(i)` words to every peer by blocking `send`, then one
    /// from each peer taken by `take` (its words and source), checked to come in each
    /// sender's order.
    fn to_all_from_any(
        &self,
        len: impl Fn(u32) -> usize,
        take: impl Fn(&Self) -> Result<(Vec<u32>, usize), String>,
    ) -> Result<u64, String> {
        let (w, t, rank) = (self.w, self.t, self.w.rank());
        let mut next = vec![0u32; w.size()];
        let mut checked = 0;
        for i in 0..self.msgs {
            for &p in &self.peers {
                w.send(&message(rank, t, i, len(i)), p, t).map_err(|x| self.err("send", x))?;
            }
            for _ in &self.peers {
                let (got, src) = take(self)?;
                check_msg(&got, src, t, next[src], len(next[src]))?;
                next[src] += 1;
                checked += 1;
            }
        }
        Ok(checked)
    }

    /// `sendrecv` at every distance around the ring, some messages large.
    fn sendrecv_ring(&self) -> Result<u64, String> {
        let (w, t, rank, n) = (self.w, self.t, self.w.rank(), self.w.size());
        let mut checked = 0;
        for i in 0..self.msgs {
            let len = words(i, t, self.large_every);
            let m = message(rank, t, i, len);
            let mut got = vec![0u32; len];
            for k in 1..n {
                let (dest, src) = ((rank + k) % n, (rank + n - k) % n);
                let st = w.sendrecv(&m, dest, t, &mut got, src, t).map_err(|x| self.err("sendrecv", x))?;
                if st.source() != src {
                    return Err(format!("thread {t}: sendrecv got a message from {} instead of {src}", st.source()));
                }
                check_msg(&got, src, t, i, len)?;
                checked += 1;
            }
        }
        Ok(checked)
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let threads: u32 = args.next().map(|a| a.parse()).transpose()?.unwrap_or(4);
    let msgs: u32 = args.next().map(|a| a.parse()).transpose()?.unwrap_or(4000);
    let large_every: u32 = args.next().map(|a| a.parse()).transpose()?.unwrap_or(500);
    let (world, provided) = tmpi::init_thread(Threading::Multiple)?;
    let mut v = Verdict::new("threadstress", world.rank());
    v.check(provided == Threading::Multiple, || format!("provided {provided:?}"));
    let w: &Comm = &world;
    let results: Vec<Result<u64, String>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|t| {
                s.spawn(move || {
                    let r = run_thread(w, t, msgs, large_every);
                    if let Err(msg) = &r {
                        // At once: the peers' threads may now wait for this one forever.
                        eprintln!("threadstress: rank {}: {msg}", w.rank());
                    }
                    r
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap_or_else(|_| Err("thread panicked".into()))).collect()
    });
    let mut total = 0;
    for r in results {
        match r {
            Ok(c) => total += c,
            Err(msg) => v.check(false, || msg),
        }
    }
    let want = if world.size() == 1 { 0 } else { u64::from(threads) * u64::from(msgs) * (world.size() as u64 - 1) };
    v.check(total == want, || format!("checked {total} messages, expected {want}"));
    v.finish(
        &world,
        &format!(
            "{threads} threads x {msgs} messages per peer on {} ranks (non-blocking, blocking any-source, sendrecv with rendezvous, mprobe), {total} received in order on rank {}",
            world.size(),
            world.rank()
        ),
    )?;
    world.finalize()?;
    Ok(())
}
