//! Random mixes of point-to-point traffic, the same plan on every rank (from a seed), checked
//! message by message.
//!
//! Each round draws messages between random pairs of ranks (a rank to itself too), of sizes
//! around every protocol boundary (eager, pipelined eager, rendezvous, single copy, the 1 MiB
//! packet) and random ones, each with a unique tag, a send buffer and a receive buffer each
//! from a `Vec` or the shared heap, and one way of receiving it:
//! - posted before the round's barrier (expected), or after this rank's sends (unexpected);
//! - by its source, or by `ANY_SOURCE` (and `ANY_TAG` too where it is the only message to its
//!   receiver in the round);
//! - `probe` then `recv_vec`;
//! - into a buffer half its size: `Truncated`, and the message consumed.
//!
//! Some sends wait a little first, so that arrivals interleave differently from run to run.
//! Each round a rank completes its receives by `wait` on each, by `wait_some` or by polling
//! with `test_some`, and may post a receive that nothing matches and cancel it.
//! Every payload, source, tag and length is checked; a failure names the seed and round.
//!
//! With `--extra`, the rounds run on a communicator that numbers the ranks backwards (a
//! split: its ranks are not the world's), about a third of the sends are synchronous
//! (`issend`), and half the probed messages are taken by a matched probe (`mprobe`, or
//! `improbe` polled) and `Message::recv_vec`; these choices come from a stream of their own,
//! so a seed's messages are the same with and without it.
//!
//! With `--digest`, each rank prints `randmix-digest rank=R HEX`: a hash of everything MPI
//! showed it (each receive's status or error with its lengths, each payload, each probe's
//! status, each cancel), to compare two runs of one seed (over two matchers) for identical
//! results.
//!
//! `randmix [--seed N] [--rounds R] [--max BYTES] [--show] [--extra] [--digest]` (defaults:
//! seed 1, 40 rounds, 2 MiB + 5); `--show` prints the plan of each round on rank 0.

use std::error::Error as StdError;
use std::time::Duration;

use tmpi::{Comm, Error, Source, Status, TagMatch};
use tmpi_tests::{Rng, Verdict};

const KIB: usize = 1024;
const MIB: usize = 1024 * KIB;
/// Sizes at the protocol boundaries (and one past each); those above `--max` are cut to it.
const EDGES: [usize; 28] = [
    0,
    1,
    8,
    100,
    4095,
    4096,
    8192,
    16 * KIB - 1,
    16 * KIB,
    16 * KIB + 1,
    32 * KIB,
    64 * KIB,
    128 * KIB + 3,
    256 * KIB - 1,
    256 * KIB,
    256 * KIB + 1,
    512 * KIB,
    MIB - 1,
    MIB,
    MIB + 1,
    MIB + 4 * KIB,
    2 * MIB,
    2 * MIB + 5,
    4 * MIB + 1,
    9 * MIB,
    24,
    40,
    2 * KIB,
];

#[derive(Debug, Clone, Copy, PartialEq)]
enum Way {
    /// `irecv` from the source, posted before the barrier.
    Early,
    /// `irecv` from the source, posted after this rank's sends.
    Late,
    /// `irecv` from `ANY_SOURCE` (and `ANY_TAG` when `wild`), early or late.
    Any { early: bool, wild: bool },
    /// `probe`, then `recv_vec`.
    Probe,
    /// `irecv` into half the message's bytes: `Truncated`.
    Truncate { early: bool },
}

#[derive(Debug, Clone, Copy)]
struct Msg {
    src: usize,
    dst: usize,
    tag: u32,
    size: usize,
    way: Way,
    send_shared: bool,
    recv_shared: bool,
    delay_us: u64,
}

/// How a rank completes its receives in a round.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Completion {
    /// `wait` on each, in posting order.
    Each,
    /// `wait_some` until none is left.
    Some,
    /// `test_some` (and a yield) until none is left.
    Poll,
}

/// One round's plan: the messages, how receives complete, and per rank a receive that no
/// message matches (from this source, with an unused tag), posted and then cancelled.
struct Round {
    msgs: Vec<Msg>,
    completion: Completion,
    cancelled: Vec<Option<usize>>,
}

/// The messages come from `rng`, how they complete from `how` (a stream of its own, so a
/// seed's messages stay what they were before completions and cancels were drawn).
fn round_plan(rng: &mut Rng, how: &mut Rng, n: usize, max: usize) -> Round {
    let msgs = plan(rng, n, max);
    let completion = match how.below(3) {
        0 => Completion::Each,
        1 => Completion::Some,
        _ => Completion::Poll,
    };
    let cancelled = (0..n).map(|_| how.chance(20).then(|| how.below(n))).collect();
    Round { msgs, completion, cancelled }
}

/// The tag of the receive that is cancelled (no message uses it).
const UNUSED_TAG: u32 = 1 << 20;

fn plan(rng: &mut Rng, n: usize, max: usize) -> Vec<Msg> {
    let count = 1 + rng.below(3 * n);
    let mut msgs: Vec<Msg> = (0..count)
        .map(|k| {
            let size = if rng.chance(70) { EDGES[rng.below(EDGES.len())] } else { rng.below(300 * KIB) };
            let size = size.min(max);
            let early = rng.chance(50);
            let way = match rng.below(6) {
                0 => Way::Early,
                1 => Way::Late,
                2 | 3 => Way::Any { early, wild: false },
                4 => Way::Probe,
                _ if size >= 2 => Way::Truncate { early },
                _ => Way::Late,
            };
            Msg {
                src: rng.below(n),
                dst: rng.below(n),
                tag: k as u32 + 1,
                size,
                way,
                send_shared: rng.chance(20),
                recv_shared: rng.chance(20),
                delay_us: if rng.chance(15) { rng.below(300) as u64 } else { 0 },
            }
        })
        .collect();
    // ANY_TAG as well where the message is the only one to its receiver.
    for i in 0..msgs.len() {
        let alone = msgs.iter().filter(|m| m.dst == msgs[i].dst).count() == 1;
        if let Way::Any { early, .. } = msgs[i].way {
            msgs[i].way = Way::Any { early, wild: alone && rng.chance(50) };
        }
    }
    msgs
}

/// The payload of message `tag` of round `round` (of `size` bytes).
fn payload(seed: u64, round: usize, tag: u32, size: usize) -> Vec<u8> {
    let mut r = Rng::new((seed << 20) ^ ((round as u64) << 12) ^ u64::from(tag) ^ 0x9e37_79b9_7f4a_7c15, 1);
    let mut v = Vec::with_capacity(size + 8);
    while v.len() < size {
        v.extend_from_slice(&r.next_u64().to_le_bytes());
    }
    v.truncate(size);
    v
}

/// What `recv_vec` gave a probed message.
type Probed = tmpi::Result<(Vec<u8>, Status)>;

/// Bytes from a `Vec` or from the shared heap.
enum Buf {
    Own(Vec<u8>),
    Shared(tmpi::SharedBuf<u8>),
}

impl Buf {
    fn new(world: &tmpi::World, shared: bool, len: usize) -> tmpi::Result<Buf> {
        Ok(if shared { Buf::Shared(world.alloc_shared::<u8>(len)?) } else { Buf::Own(vec![0xa5; len]) })
    }

    fn bytes(&mut self) -> &mut [u8] {
        match self {
            Buf::Own(v) => v,
            Buf::Shared(b) => b,
        }
    }
}

fn main() -> Result<(), Box<dyn StdError>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let opt = |name: &str, default: u64| tmpi_tests::number_flag("randmix", &args, name, default);
    let seed = opt("--seed", 1)?.max(1);
    let rounds = opt("--rounds", 40)? as usize;
    let max = opt("--max", 2 * MIB as u64 + 5)? as usize;
    let show = args.iter().any(|a| a == "--show");
    let digest = args.iter().any(|a| a == "--digest");
    let world = tmpi::init()?;
    let n = world.size();
    let mut extra = args.iter().any(|a| a == "--extra").then(|| Rng::new(seed, 0x2545_f491_4f6c_dd1d));
    let backwards = match extra {
        Some(_) => Some(world.split(Some(0), (n - 1 - world.rank()) as i32)?.ok_or("split left a rank out")?),
        None => None,
    };
    let w: &Comm = backwards.as_ref().unwrap_or(&world);
    let rank = w.rank();
    let mut dig = Digest(0xcbf2_9ce4_8422_2325);
    let mut v = Verdict::new("randmix", rank);
    let mut rng = Rng::new(seed, 0x9e37_79b9_7f4a_7c15);
    let mut how = Rng::new(seed, 0xd1b5_4a32_d192_ed03);
    let mut messages = 0usize;
    for round in 0..rounds {
        let plan = round_plan(&mut rng, &mut how, n, max);
        messages += plan.msgs.len();
        if show && rank == 0 {
            eprintln!("randmix: round {round}: {:?}, cancelled receives (by rank, from) {:?}", plan.completion, plan.cancelled);
            for m in &plan.msgs {
                eprintln!("randmix: round {round}: {m:?}");
            }
        }
        round_of(&world, w, (&mut v, &mut dig, extra.as_mut()), seed, round, &plan)?;
        w.barrier()?;
    }
    if digest {
        println!("randmix-digest rank={rank} {:016x}", dig.0);
    }
    v.finish(w, &format!("seed {seed}, {rounds} rounds, {messages} messages on {n} ranks"))
}

/// FNV-1a over what MPI showed this rank (see `--digest`).
struct Digest(u64);

impl Digest {
    fn word(&mut self, x: u64) {
        for b in x.to_le_bytes() {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x100_0000_01b3);
        }
    }

    fn bytes(&mut self, data: &[u8]) {
        self.word(data.len() as u64);
        for &b in data {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x100_0000_01b3);
        }
    }

    fn status(&mut self, st: &Status) {
        for x in [st.source() as u64, u64::from(st.tag()), st.len() as u64, u64::from(st.cancelled())] {
            self.word(x);
        }
    }

    fn outcome(&mut self, r: &tmpi::Result<Status>) {
        match r {
            Ok(st) => {
                self.word(0);
                self.status(st);
            }
            Err(Error::Truncated { source_rank, tag, len, capacity }) => {
                for x in [1, *source_rank as u64, u64::from(*tag), *len as u64, *capacity as u64] {
                    self.word(x);
                }
            }
            Err(e) => {
                self.word(2);
                self.bytes(e.to_string().as_bytes());
            }
        }
    }
}

/// Receives probed message `m` with a matched probe (blocking, or `improbe` polled).
fn matched_probe(w: &Comm, m: &Msg, poll: bool) -> tmpi::Result<(Vec<u8>, Status)> {
    let msg = if poll {
        loop {
            if let Some(msg) = w.improbe(m.src, m.tag)? {
                break msg;
            }
            std::thread::yield_now();
        }
    } else {
        w.mprobe(m.src, m.tag)?
    };
    msg.recv_vec::<u8>()
}

/// Posts the receive of `m` into `buf`, by its way.
fn post<'s, 'e>(w: &Comm, s: &'s tmpi::Scope<'s, 'e>, m: &Msg, buf: &'s mut [u8]) -> tmpi::Result<tmpi::Request<'s>> {
    let (src, tag): (Source, TagMatch) = match m.way {
        Way::Any { wild: true, .. } => (tmpi::ANY_SOURCE, tmpi::ANY_TAG),
        Way::Any { .. } => (tmpi::ANY_SOURCE, m.tag.into()),
        _ => (m.src.into(), m.tag.into()),
    };
    w.irecv(s, buf, src, tag)
}

/// What a round reports to: the verdict, the digest, and the `--extra` stream.
type Sinks<'a> = (&'a mut Verdict, &'a mut Digest, Option<&'a mut Rng>);

/// A posted receive: the index of its message in [`Part::inc`], and its request.
type Posted<'s> = Vec<(usize, tmpi::Request<'s>)>;

/// One rank's part of a round of `plan`.
struct Part<'a> {
    w: &'a Comm,
    seed: u64,
    round: usize,
    plan: &'a Round,
    /// The messages this rank sends, and those it receives.
    out: Vec<&'a Msg>,
    inc: Vec<&'a Msg>,
}

/// Whether the receive of `m` is posted before the round's barrier.
fn early(m: &Msg) -> bool {
    matches!(m.way, Way::Early | Way::Any { early: true, .. } | Way::Truncate { early: true })
}

/// One round on `w`: this rank's part of `msgs`.
fn round_of(world: &tmpi::World, w: &Comm, sinks: Sinks<'_>, seed: u64, round: usize, plan: &Round) -> Result<(), Box<dyn StdError>> {
    let (v, dig, mut extra) = sinks;
    let rank = w.rank();
    let out = plan.msgs.iter().filter(|m| m.src == rank).collect();
    let inc = plan.msgs.iter().filter(|m| m.dst == rank).collect();
    let p = Part { w, seed, round, plan, out, inc };
    let (mut outb, mut inb) = p.buffers(world)?;
    let mut never = [0u8; 16];
    let mut results: Vec<(usize, tmpi::Result<Status>)> = Vec::new();
    let mut probed: Vec<(usize, Probed)> = Vec::new();
    tmpi::scope(|s| -> tmpi::Result<()> {
        let mut slots: Vec<Option<&mut [u8]>> = inb.iter_mut().map(|b| Some(b.bytes())).collect();
        let mut reqs = p.post(s, &mut slots, early)?;
        let cancel = match plan.cancelled[rank] {
            Some(from) => Some((from, w.irecv(s, &mut never, from, UNUSED_TAG)?)),
            None => None,
        };
        w.barrier()?;
        let sends = p.send_all(s, &mut outb, extra.as_deref_mut())?;
        reqs.extend(p.post(s, &mut slots, |m| !early(m) && m.way != Way::Probe)?);
        probed = p.probe_all(v, dig, extra);
        if let Some(c) = cancel {
            p.check_cancel(c, v, dig)?;
        }
        results = p.complete(reqs)?;
        for (m, r) in sends {
            if let Err(e) = r.wait() {
                v.check(false, || format!("{}: send: {e}", p.what(m)));
            }
        }
        Ok(())
    })?;
    p.check_results(results, &mut inb, v, dig);
    p.check_probed(probed, v, dig);
    Ok(())
}

impl<'a> Part<'a> {
    /// Names message `m` in a failure.
    fn what(&self, m: &Msg) -> String {
        format!("seed {} round {}: {} B {}->{} tag {} {:?}", self.seed, self.round, m.size, m.src, m.dst, m.tag, m.way)
    }

    /// The send buffers, filled, and the receive buffers (half the size for a truncation).
    fn buffers(&self, world: &tmpi::World) -> tmpi::Result<(Vec<Buf>, Vec<Buf>)> {
        let mut out = Vec::new();
        for m in &self.out {
            let mut b = Buf::new(world, m.send_shared, m.size)?;
            b.bytes().copy_from_slice(&payload(self.seed, self.round, m.tag, m.size));
            out.push(b);
        }
        let mut inb = Vec::new();
        for m in &self.inc {
            let len = if matches!(m.way, Way::Truncate { .. }) { m.size / 2 } else { m.size };
            inb.push(Buf::new(world, m.recv_shared, len)?);
        }
        Ok((out, inb))
    }

    /// Posts the receives that `pick` chooses, each into its slot.
    fn post<'s, 'e>(
        &self,
        s: &'s tmpi::Scope<'s, 'e>,
        slots: &mut [Option<&'s mut [u8]>],
        pick: impl Fn(&Msg) -> bool,
    ) -> tmpi::Result<Posted<'s>> {
        let mut reqs = Vec::new();
        for i in (0..self.inc.len()).filter(|&i| pick(self.inc[i])) {
            let buf = slots[i].take().expect("each receive is posted once");
            reqs.push((i, post(self.w, s, self.inc[i], buf)?));
        }
        Ok(reqs)
    }

    /// Sends this rank's messages from `outb` (some after a delay; with `--extra` a third
    /// synchronous).
    fn send_all<'s, 'e>(
        &self,
        s: &'s tmpi::Scope<'s, 'e>,
        outb: &'s mut [Buf],
        mut extra: Option<&mut Rng>,
    ) -> tmpi::Result<Vec<(&'a Msg, tmpi::Request<'s>)>> {
        let mut sends = Vec::new();
        for (m, b) in self.out.iter().zip(outb.iter_mut()) {
            if m.delay_us > 0 {
                std::thread::sleep(Duration::from_micros(m.delay_us));
            }
            let sync = extra.as_mut().is_some_and(|x| x.chance(33));
            let b = &*b.bytes();
            sends.push((*m, if sync { self.w.issend(s, b, m.dst, m.tag)? } else { self.w.isend(s, b, m.dst, m.tag)? }));
        }
        Ok(sends)
    }

    /// Takes the probed messages: `probe` then `recv_vec`, or (with `--extra`, half of them)
    /// a matched probe.
    fn probe_all(&self, v: &mut Verdict, dig: &mut Digest, mut extra: Option<&mut Rng>) -> Vec<(usize, Probed)> {
        let mut probed = Vec::new();
        for (i, m) in self.inc.iter().enumerate().filter(|(_, m)| m.way == Way::Probe) {
            let matched = extra.as_mut().and_then(|x| x.chance(50).then(|| x.chance(50)));
            if let Some(poll) = matched {
                probed.push((i, matched_probe(self.w, m, poll)));
                continue;
            }
            match self.w.probe(m.src, m.tag) {
                Ok(st) => {
                    dig.status(&st);
                    v.check(st.len() == m.size && st.source() == m.src && st.tag() == m.tag, || {
                        format!("{}: probe said {st:?}", self.what(m))
                    })
                }
                Err(e) => v.check(false, || format!("{}: probe: {e}", self.what(m))),
            }
            probed.push((i, self.w.recv_vec::<u8>(m.src, m.tag)));
        }
        probed
    }

    /// Cancels the receive from `from` that nothing matches; it must complete cancelled.
    fn check_cancel(&self, (from, mut r): (usize, tmpi::Request<'_>), v: &mut Verdict, dig: &mut Digest) -> tmpi::Result<()> {
        r.cancel()?;
        let got = r.wait();
        dig.outcome(&got);
        let (seed, round) = (self.seed, self.round);
        match got {
            Ok(st) => v.check(st.cancelled(), || format!("seed {seed} round {round}: receive from {from} not cancelled: {st:?}")),
            Err(e) => v.check(false, || format!("seed {seed} round {round}: cancelled receive from {from}: {e}")),
        }
        Ok(())
    }

    /// Completes the posted receives the round's way: each waited for, `wait_some`, or
    /// `test_some` polled.
    fn complete(&self, reqs: Posted<'_>) -> tmpi::Result<Vec<(usize, tmpi::Result<Status>)>> {
        let mut results = Vec::new();
        if self.plan.completion == Completion::Each {
            for (i, r) in reqs {
                results.push((i, r.wait()));
            }
            return Ok(results);
        }
        let (mut idx, mut rs): (Vec<usize>, Vec<tmpi::Request<'_>>) = reqs.into_iter().unzip();
        while !rs.is_empty() {
            let done = if self.plan.completion == Completion::Some {
                tmpi::wait_some(&mut rs)?
            } else {
                std::thread::yield_now();
                tmpi::test_some(&mut rs)?
            };
            // Indices before removal, in order: remove from the back.
            for (k, r) in done.into_iter().rev() {
                results.push((idx.remove(k), r));
            }
        }
        Ok(results)
    }

    /// Checks each completed receive's status and payload (in message order).
    fn check_results(&self, mut results: Vec<(usize, tmpi::Result<Status>)>, inb: &mut [Buf], v: &mut Verdict, dig: &mut Digest) {
        results.sort_by_key(|r| r.0);
        for (i, r) in results {
            let m = self.inc[i];
            let want = payload(self.seed, self.round, m.tag, m.size);
            dig.word(u64::from(m.tag));
            dig.outcome(&r);
            if let Ok(st) = &r {
                dig.bytes(&inb[i].bytes()[..st.len().min(m.size)]);
            }
            match (m.way, r) {
                (Way::Truncate { .. }, r) => {
                    v.check_err(r, |e| matches!(e, Error::Truncated { .. }), &self.what(m));
                }
                (_, Ok(st)) => {
                    let got = &inb[i].bytes()[..];
                    v.check(st.source() == m.src && st.tag() == m.tag && st.len() == m.size && got == &want[..], || {
                        let bad = got.iter().zip(&want).position(|(a, b)| a != b);
                        format!("{}: status {st:?}, first wrong byte {bad:?}", self.what(m))
                    });
                }
                (_, Err(e)) => v.check(false, || format!("{}: {e}", self.what(m))),
            }
        }
    }

    /// Checks each probed message's status and payload.
    fn check_probed(&self, probed: Vec<(usize, Probed)>, v: &mut Verdict, dig: &mut Digest) {
        for (i, r) in probed {
            let m = self.inc[i];
            let want = payload(self.seed, self.round, m.tag, m.size);
            dig.word(u64::from(m.tag));
            if let Ok((got, st)) = &r {
                dig.status(st);
                dig.bytes(got);
            }
            match r {
                Ok((got, st)) => v.check(st.source() == m.src && st.tag() == m.tag && got == want, || {
                    format!("{}: status {st:?} or payload wrong", self.what(m))
                }),
                Err(e) => v.check(false, || format!("{}: {e}", self.what(m))),
            }
        }
    }
}
