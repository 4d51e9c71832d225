//! A racy program for record and replay (`tests/tests/seen.rs`): rank 0 collects messages from
//! every other rank with `ANY_SOURCE` and folds what it sees, in the order it sees it, into one
//! number. The order depends on timing, so the number does too; `--seed N` makes the senders
//! sleep a seeded while (0 to 30 ms x ranks) before each send, which changes the order from
//! seed to seed without changing what the program does.
//!
//! Each round uses every kind of nondeterministic decision: a blocking receive from any source
//! (tag 1), receives from any source completed by `wait_any` (tag 2), `iprobe` polled until it
//! finds a message (tag 3; the number of empty polls counts too), a receive completed by polling
//! `test` (tag 4), and receives completed by `wait_some` (tag 5).
//!
//! Prints `racy: result <hex> order <sources...>` on rank 0. `--rounds R` (default 2).
//! `--variant` makes rank 0 complete tag 5 with `wait_any` instead of `wait_some` (a program
//! that departs from a record made without it).

use std::time::Duration;

use tmpi::{Comm, ANY_SOURCE};
use tmpi_tests::Rng;

/// What rank 0 saw, folded in order.
struct Fold {
    hash: u64,
    order: Vec<usize>,
}

impl Fold {
    fn add(&mut self, v: u64) {
        self.hash = self.hash.wrapping_mul(1_000_003).wrapping_add(v);
    }

    fn source(&mut self, s: usize) {
        self.order.push(s);
        self.add(s as u64 + 1);
    }
}

fn flag(args: &[String], name: &str) -> Option<u64> {
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).and_then(|v| v.parse().ok())
}

/// Sender `rank` of round `round`, before its message of `tag`: sleeps a seeded while.
fn delay(seed: u64, round: u64, tag: u32, rank: usize, senders: usize) {
    let mut rng = Rng::new(seed.wrapping_add(1), round * 31 + u64::from(tag) + 7);
    // A seeded permutation of the senders: the position of this one sets its delay.
    let mut order: Vec<usize> = (1..=senders).collect();
    for i in (1..order.len()).rev() {
        order.swap(i, rng.below(i + 1));
    }
    let pos = order.iter().position(|&r| r == rank).unwrap_or(0);
    std::thread::sleep(Duration::from_millis(30 * pos as u64));
}

fn sender(w: &Comm, seed: u64, rounds: u64) -> tmpi::Result<()> {
    let me = w.rank();
    for round in 0..rounds {
        for tag in 1..=5u32 {
            delay(seed, round, tag, me, w.size() - 1);
            w.send(&[me as u64 * 1000 + round], 0, tag)?;
        }
    }
    Ok(())
}

fn collect(w: &Comm, rounds: u64, variant: bool) -> tmpi::Result<Fold> {
    let n = w.size() - 1;
    let mut f = Fold { hash: 17, order: Vec::new() };
    for _ in 0..rounds {
        f.by_recv(w, n)?;
        f.by_wait_any(w, n)?;
        f.by_iprobe(w, n)?;
        f.by_test(w, n)?;
        f.by_wait_some(w, n, variant)?;
    }
    Ok(f)
}

/// Rank 0's five ways of taking the `n` messages of a round, each folding in what it saw.
impl Fold {
    /// Tag 1: blocking `recv` from `ANY_SOURCE`.
    fn by_recv(&mut self, w: &Comm, n: usize) -> tmpi::Result<()> {
        for _ in 0..n {
            let mut b = [0u64];
            let st = w.recv(&mut b, ANY_SOURCE, 1)?;
            self.source(st.source());
        }
        Ok(())
    }

    /// Tag 2: `irecv`s from `ANY_SOURCE` completed by `wait_any` (which request, and whose).
    fn by_wait_any(&mut self, w: &Comm, n: usize) -> tmpi::Result<()> {
        let mut bufs = vec![[0u64]; n];
        tmpi::scope(|s| -> tmpi::Result<()> {
            let mut reqs = bufs.iter_mut().map(|b| w.irecv(s, b, ANY_SOURCE, 2)).collect::<tmpi::Result<Vec<_>>>()?;
            while !reqs.is_empty() {
                let (i, st) = tmpi::wait_any(&mut reqs)?;
                self.add(i as u64);
                self.source(st.source());
            }
            Ok(())
        })
    }

    /// Tag 3: `iprobe` polled (how many polls), then `recv` from the source it named.
    fn by_iprobe(&mut self, w: &Comm, n: usize) -> tmpi::Result<()> {
        for _ in 0..n {
            let mut polls = 0u64;
            let st = loop {
                if let Some(st) = w.iprobe(ANY_SOURCE, 3)? {
                    break st;
                }
                polls += 1;
            };
            self.add(polls);
            let mut b = [0u64];
            w.recv(&mut b, st.source(), 3)?;
            self.source(st.source());
        }
        Ok(())
    }

    /// Tag 4: an `irecv` polled by `test` (how many tests).
    fn by_test(&mut self, w: &Comm, n: usize) -> tmpi::Result<()> {
        for _ in 0..n {
            let mut b = [0u64];
            let mut tests = 0u64;
            let st = tmpi::scope(|s| -> tmpi::Result<tmpi::Status> {
                let mut r = w.irecv(s, &mut b, ANY_SOURCE, 4)?;
                loop {
                    if let Some(st) = r.test()? {
                        return Ok(st);
                    }
                    tests += 1;
                }
            })?;
            self.add(tests);
            self.source(st.source());
        }
        Ok(())
    }

    /// Tag 5: `irecv`s completed by `wait_some` (how many at a time), or with `variant` by
    /// `wait_any`.
    fn by_wait_some(&mut self, w: &Comm, n: usize, variant: bool) -> tmpi::Result<()> {
        let mut bufs = vec![[0u64]; n];
        tmpi::scope(|s| -> tmpi::Result<()> {
            let mut reqs = bufs.iter_mut().map(|b| w.irecv(s, b, ANY_SOURCE, 5)).collect::<tmpi::Result<Vec<_>>>()?;
            while !reqs.is_empty() {
                if variant {
                    let (_, st) = tmpi::wait_any(&mut reqs)?;
                    self.source(st.source());
                    continue;
                }
                let done = tmpi::wait_some(&mut reqs)?;
                self.add(done.len() as u64);
                for (_, r) in done {
                    self.source(r?.source());
                }
            }
            Ok(())
        })
    }
}

fn main() -> tmpi::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let seed = flag(&args, "--seed").unwrap_or(1);
    let rounds = flag(&args, "--rounds").unwrap_or(2);
    let variant = args.iter().any(|a| a == "--variant");
    let world = tmpi::init()?;
    if world.size() < 2 {
        println!("racy: needs 2 ranks or more");
        return world.finalize();
    }
    if world.rank() == 0 {
        let f = collect(&world, rounds, variant)?;
        let order: Vec<String> = f.order.iter().map(usize::to_string).collect();
        println!("racy: result {:016x} order {}", f.hash, order.join(","));
    } else {
        sender(&world, seed, rounds)?;
    }
    world.barrier()?;
    world.finalize()
}
