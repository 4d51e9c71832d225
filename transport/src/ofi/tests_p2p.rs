//! The differential test of [`super::p2p`]: random interleavings of sends from several
//! ranks, exact and wildcard receives, probes, matched probes, truncating receives and
//! cancels go through software matching ([`SoftP2p`]) and provider matching
//! ([`ProviderP2p`]) on libfabric's `tcp` provider, and every MPI-visible result (each
//! receive's outcome, each probe's answer) must be the same.
//!
//! Messages from different ranks arrive in whatever order the sockets give; to make the
//! results a function of the script alone, each send is followed by a marker from the same
//! rank on a context no script uses, and the receiver waits for the marker: by MPI's order
//! (and `FI_ORDER_SAS`) the message before it has then been matched or stored unexpected.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use super::p2p::{Done, Matching, Outcome, ProviderP2p, SoftP2p, Status, TaggedP2p};
use super::tests::{domain, posted};
use super::*;

/// Rank 0 receives; the others send.
const RANKS: usize = 5;
/// The markers' context.
const MARK: u32 = (1 << tag::CTX_BITS) - 1;
const WAIT: Duration = Duration::from_secs(60);

/// `RANKS` endpoints of one domain, each with every other's address.
fn world(provider: &str) -> Vec<(Endpoint, Vec<u64>)> {
    let d = domain(provider);
    let eps: Vec<Endpoint> = (0..RANKS).map(|_| Endpoint::open(&d, RANKS).unwrap()).collect();
    let names: Vec<Vec<u8>> = eps.iter().map(|e| e.name().unwrap()).collect();
    eps.into_iter()
        .enumerate()
        .map(|(r, mut e)| {
            let addrs = names.iter().enumerate().map(|(i, n)| if i == r { FI_ADDR_UNSPEC } else { e.insert(n).unwrap() }).collect();
            (e, addrs)
        })
        .collect()
}

#[derive(Debug, Clone, Copy)]
enum Op {
    Send { src: u32, ctx: u32, tag: u32, len: usize },
    Recv { ctx: u32, src: Option<u32>, tag: Option<u32>, cap: usize },
    Probe { ctx: u32, src: Option<u32>, tag: Option<u32> },
    MProbe { ctx: u32, src: Option<u32>, tag: Option<u32>, cap: usize },
    Cancel(usize),
}

/// What the script saw, in order: probes' answers (`None`: nothing there).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Seen {
    Probe(usize, Option<Status>),
    MProbe(usize, Option<Status>),
    Drain(Option<Status>),
}

struct Rng(u64);

impl Rng {
    fn next(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }

    fn maybe(&mut self, n: u64) -> Option<u32> {
        (self.next(3) != 0).then(|| self.next(n) as u32)
    }
}

fn script(seed: u64, len: usize) -> Vec<Op> {
    let mut r = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    let caps = [0, 8, 16, 32, 48, 64];
    (0..len)
        .map(|_| {
            let (ctx, src, tag) = (r.next(2) as u32, r.maybe(RANKS as u64 - 1).map(|s| s + 1), r.maybe(3));
            let cap = caps[r.next(caps.len() as u64) as usize];
            match r.next(10) {
                0..=3 => Op::Send { src: 1 + r.next(RANKS as u64 - 1) as u32, ctx, tag: r.next(3) as u32, len: r.next(49) as usize },
                4..=6 => Op::Recv { ctx, src, tag, cap },
                7 => Op::Probe { ctx, src, tag },
                8 => Op::MProbe { ctx, src, tag, cap },
                _ => Op::Cancel(r.next(1 << 16) as usize),
            }
        })
        .collect()
}

fn payload(i: usize, len: usize) -> Vec<u8> {
    (0..len).map(|j| (i * 31 + j * 7) as u8).collect()
}

struct Run<P: TaggedP2p> {
    ps: Vec<P>,
    done: BTreeMap<u64, Outcome>,
}

impl<P: TaggedP2p> Run<P> {
    fn pump(&mut self) {
        let mut v: Vec<Done> = Vec::new();
        for (r, p) in self.ps.iter_mut().enumerate().rev() {
            p.progress(&mut v).unwrap();
            assert!(r == 0 || v.is_empty(), "rank {r} completed a receive it never posted: {v:?}");
        }
        for d in v {
            assert!(self.done.insert(d.handle, d.outcome).is_none(), "receive {} completed twice", d.handle);
        }
    }

    fn wait(&mut self, h: u64) {
        let end = Instant::now() + WAIT;
        while !self.done.contains_key(&h) {
            assert!(Instant::now() < end, "receive {h} not done in {WAIT:?}");
            self.pump();
            std::thread::yield_now();
        }
    }

    fn step(&mut self, i: usize, op: Op, pending: &mut Vec<u64>, seen: &mut Vec<Seen>) {
        match op {
            Op::Send { src, ctx, tag, len } => {
                self.ps[src as usize].send(0, ctx, tag, &payload(i, len)).unwrap();
                self.ps[src as usize].send(0, MARK, 0, &[]).unwrap();
                let h = self.ps[0].post_recv(MARK, Some(src), Some(0), 0).unwrap();
                self.wait(h);
                self.done.remove(&h);
            }
            Op::Recv { ctx, src, tag, cap } => pending.push(self.ps[0].post_recv(ctx, src, tag, cap).unwrap()),
            Op::Probe { ctx, src, tag } => seen.push(Seen::Probe(i, self.ps[0].iprobe(ctx, src, tag).unwrap())),
            Op::MProbe { ctx, src, tag, cap } => {
                let m = self.ps[0].improbe(ctx, src, tag).unwrap();
                seen.push(Seen::MProbe(i, m.as_ref().map(|m| m.status)));
                if let Some(m) = m {
                    pending.push(self.ps[0].mrecv(m, cap).unwrap());
                }
            }
            Op::Cancel(k) => {
                if let Some(&h) = pending.get(k % pending.len().max(1)) {
                    self.ps[0].cancel(h).unwrap();
                }
            }
        }
        self.pump();
    }

    /// Runs `ops`, then cancels what is still posted and receives what is still unexpected.
    fn run(mut self, ops: &[Op]) -> (Vec<Seen>, BTreeMap<u64, Outcome>) {
        let (mut pending, mut seen) = (Vec::new(), Vec::new());
        for (i, &op) in ops.iter().enumerate() {
            self.step(i, op, &mut pending, &mut seen);
        }
        for &h in &pending {
            self.ps[0].cancel(h).unwrap();
        }
        for &h in &pending {
            self.wait(h);
        }
        for ctx in 0..2 {
            while let Some(m) = self.ps[0].improbe(ctx, None, None).unwrap() {
                seen.push(Seen::Drain(Some(m.status)));
                let h = self.ps[0].mrecv(m, 64).unwrap();
                self.wait(h);
            }
        }
        (seen, self.done)
    }
}

/// Both matchers give the same MPI-visible results for random scripts, and the scripts
/// exercise what they are meant to (wildcards, truncation, cancels, probes that find).
#[test]
fn soft_and_provider_matching_agree() {
    let p = "tcp";
    let (mut truncated, mut cancelled, mut wild, mut found) = (0, 0, 0, 0);
    for seed in 1..=4 {
        let ops = script(seed, 160);
        let soft = world(p).into_iter().enumerate().map(|(r, (e, a))| SoftP2p::new(e, r as u32, a).unwrap()).collect();
        let prov = world(p).into_iter().enumerate().map(|(r, (e, a))| ProviderP2p::new(e, r as u32, a)).collect();
        let (seen_s, done_s) = Run { ps: soft, done: BTreeMap::new() }.run(&ops);
        let (seen_p, done_p) = Run { ps: prov, done: BTreeMap::new() }.run(&ops);
        assert_eq!(seen_s, seen_p, "seed {seed}: probes differ");
        assert_eq!(done_s, done_p, "seed {seed}: receives differ");
        for o in done_s.values() {
            match o {
                Outcome::Received { truncated: t, .. } => truncated += usize::from(*t),
                Outcome::Cancelled => cancelled += 1,
            }
        }
        found += seen_s.iter().filter(|s| matches!(s, Seen::Probe(_, Some(_)) | Seen::MProbe(_, Some(_)))).count();
        wild += ops.iter().filter(|o| matches!(o, Op::Recv { src: None, .. } | Op::Recv { tag: None, .. })).count();
    }
    assert!(truncated > 0 && cancelled > 0 && wild > 0 && found > 0, "{truncated} {cancelled} {wild} {found}");
}

/// Errors the interface gives instead of panicking: fields out of the tag layout, a payload
/// over the eager limit, a rank with no address.
#[test]
fn p2p_refuses_bad_arguments() {
    let mut w = world("tcp");
    let (e1, a1) = w.pop().unwrap();
    let (e0, a0) = w.pop().unwrap();
    let mut prov = ProviderP2p::new(e0, 0, a0);
    let mut soft = SoftP2p::new(e1, 1, a1).unwrap();
    let ps: [&mut dyn TaggedP2p; 2] = [&mut prov, &mut soft];
    for p in ps {
        assert!(p.send(1, 1 << 16, 0, b"x").is_err());
        assert!(p.send(1, 0, 1 << 24, b"x").is_err());
        assert!(p.send(99, 0, 0, b"x").is_err());
        assert!(p.send(1, 0, 0, &vec![0; 1 << 20]).is_err());
        assert!(p.post_recv(0, Some(1 << 20), None, 8).is_err());
        assert!(p.iprobe(1 << 16, None, None).is_err());
    }
}

/// Why [`ProviderP2p`] never lets the provider truncate: on libfabric 1.17's `tcp`
/// (`ofi_rxm`), after a receive completes with `FI_ETRUNC`, the next message from the same
/// peer never completes (ofiwg/libfabric#8274). This test tells when a libfabric fixes it.
#[test]
fn tcp_truncation_stalls_the_connection() {
    let mut w = world("tcp");
    let (mut e0, a0) = w.remove(0);
    let (mut e1, a1) = w.remove(0);
    let t = |tg| tag::send(tag::PROTO_MPI, 0, 1, tg).unwrap();
    let small = e0.trecv(vec![0; 32], Desc::NONE, a0[1], t(1), 0, 1).unwrap();
    let next = e0.trecv(vec![0; 64], Desc::NONE, a0[1], t(2), 0, 2).unwrap();
    assert!(matches!((small, next), (Post::Posted(_), Post::Posted(_))));
    let mut sends = vec![(t(1), vec![1u8; 48]), (t(2), vec![2u8; 8])];
    let mut got = Vec::new();
    let end = Instant::now() + WAIT;
    while got.len() < 2 {
        assert!(Instant::now() < end, "{got:?}");
        if let Some((bits, buf)) = sends.first().cloned() {
            if let Post::Posted(_) = e1.tsend(buf, Desc::NONE, a1[0], bits, 0).unwrap() {
                sends.remove(0);
            }
        }
        e1.progress(|_| {}).unwrap();
        e0.progress(|c| got.push((c.user, c.error))).unwrap();
        if got.len() == 1 && sends.is_empty() {
            // The truncated receive completed; give the second message many chances.
            for _ in 0..20_000 {
                e1.progress(|_| {}).unwrap();
                e0.progress(|c| got.push((c.user, c.error))).unwrap();
            }
            break;
        }
    }
    assert_eq!(got, vec![(1, Some(errno::TRUNC))], "libfabric's tcp now delivers after a truncation: ProviderP2p::room can go");
}

#[test]
fn default_matching_table() {
    let table = [
        ("tcp;ofi_rxm", Matching::Provider),
        ("tcp", Matching::Provider),
        ("tcpx", Matching::Software),
        ("shm", Matching::Software),
        ("udp;ofi_rxd", Matching::Software),
        ("sockets", Matching::Software),
        ("verbs;ofi_rxm", Matching::Provider),
        ("cxi", Matching::Provider),
        ("psm3", Matching::Provider),
        ("", Matching::Software),
    ];
    for (p, want) in table {
        assert_eq!(Matching::default_for(p), want, "{p}");
    }
}

/// An [`OfiFabric`] with matching by the provider on, whose every progress also sends one
/// packet to rank 0 (from the other ranks) and takes the packets that wait (at rank 0),
/// checking that each source's arrive in order: packets and matched messages share the
/// endpoint and its completion queue.
struct Beside {
    f: OfiFabric,
    sent: u32,
    got: Vec<u32>,
}

impl Beside {
    fn packets(&mut self) {
        if self.f.rank() != 0 && self.f.try_send(0, crate::packet::PKT_WHOLE, 4, &[&self.sent.to_le_bytes()]).unwrap() {
            self.sent += 1;
        }
        let got = &mut self.got;
        self.f
            .poll(|p| {
                let n = u32::from_le_bytes(p.data.try_into().unwrap());
                assert_eq!(n, got[p.src], "packet from {} out of order", p.src);
                got[p.src] += 1;
                true
            })
            .unwrap();
    }
}

impl TaggedP2p for Beside {
    fn send(&mut self, dest: u32, ctx: u32, tag: u32, data: &[u8]) -> crate::Result<()> {
        self.f.send(dest, ctx, tag, data)
    }
    fn post_recv(&mut self, ctx: u32, src: Option<u32>, tag: Option<u32>, cap: usize) -> crate::Result<u64> {
        self.f.post_recv(ctx, src, tag, cap)
    }
    fn iprobe(&mut self, ctx: u32, src: Option<u32>, tag: Option<u32>) -> crate::Result<Option<Status>> {
        self.f.iprobe(ctx, src, tag)
    }
    fn improbe(&mut self, ctx: u32, src: Option<u32>, tag: Option<u32>) -> crate::Result<Option<p2p::Matched>> {
        self.f.improbe(ctx, src, tag)
    }
    fn mrecv(&mut self, m: p2p::Matched, cap: usize) -> crate::Result<u64> {
        self.f.mrecv(m, cap)
    }
    fn cancel(&mut self, handle: u64) -> crate::Result<()> {
        self.f.cancel(handle)
    }
    fn progress(&mut self, done: &mut Vec<Done>) -> crate::Result<()> {
        self.packets();
        self.f.progress(done)
    }
}

/// Matching by the provider on the packet fabric's own endpoint
/// ([`OfiFabric::enable_matching`]) gives software's MPI-visible results while packets flow
/// beside the matched messages, and every packet arrives in order.
#[test]
fn fabric_matching_beside_packets_agrees_with_software() {
    use crate::fabric::Fabric;
    let p = "tcp";
    let ops = script(7, 160);
    let soft = world(p).into_iter().enumerate().map(|(r, (e, a))| SoftP2p::new(e, r as u32, a).unwrap()).collect();
    let fabs: Vec<Beside> = world(p)
        .into_iter()
        .enumerate()
        .map(|(r, (e, a))| {
            let mut f = OfiFabric::new(r, e, a).unwrap();
            assert!(!f.caps().tag_matching && f.post_recv(0, None, None, 8).is_err(), "matching before it is on");
            f.enable_matching();
            assert!(f.caps().tag_matching);
            Beside { f, sent: 0, got: vec![0; RANKS] }
        })
        .collect();
    let (seen_s, done_s) = Run { ps: soft, done: BTreeMap::new() }.run(&ops);
    let mut run = Run { ps: fabs, done: BTreeMap::new() };
    // Packets flow from every rank before the script starts, and on during it.
    let end = Instant::now() + WAIT;
    while run.ps[0].got[1..].iter().any(|&n| n < 8) {
        assert!(Instant::now() < end, "packets: got {:?}", run.ps[0].got);
        run.pump();
    }
    let (seen_f, done_f) = run.run(&ops);
    assert_eq!(seen_s, seen_f, "probes differ");
    assert_eq!(done_s, done_f, "receives differ");
}

/// Drives `tx` and `rx` until `rx` completes an operation with user word `user`.
fn until(tx: &mut Endpoint, rx: &mut Endpoint, user: u64, spins: usize) -> Option<Completion> {
    let mut found = None;
    for _ in 0..spins {
        tx.progress(|_| {}).unwrap();
        rx.progress(|c| {
            if c.user == user {
                found = Some(c)
            }
        })
        .unwrap();
        if found.is_some() {
            break;
        }
        std::thread::yield_now();
    }
    found
}

/// What the provider's own large-message path (a message far above the eager size, which
/// `ofi_rxm` sends by its rendezvous) tells a probe and does on truncation, on libfabric
/// 1.17's `tcp`: `FI_PEEK` reports the message's full length, and a receive too small for it
/// completes `FI_ETRUNC` and, unlike an eager message's truncation
/// (`tcp_truncation_stalls_the_connection`), the connection goes on: the next message from
/// that peer arrives. So a receive buffer of at least the eager size never stalls a
/// connection, whatever the message (see the module doc of `p2p`).
#[test]
fn tcp_large_message_peek_and_truncation() {
    const BIG: usize = 1 << 20;
    let mut w = world("tcp");
    let (mut e0, a0) = w.remove(0);
    let (mut e1, a1) = w.remove(0);
    let t = |tg| tag::send(tag::PROTO_MPI, 0, 1, tg).unwrap();
    let mut sends = vec![(t(3), vec![3u8; BIG]), (t(4), vec![4u8; 8])];
    let end = Instant::now() + WAIT;
    while !sends.is_empty() {
        assert!(Instant::now() < end, "sends busy");
        let (bits, buf) = sends[0].clone();
        if let Post::Posted(_) = e1.tsend(buf, Desc::NONE, a1[0], bits, 0).unwrap() {
            sends.remove(0);
        }
        e1.progress(|_| {}).unwrap();
        e0.progress(|_| {}).unwrap();
    }
    let mut peeked = None;
    while peeked.is_none() {
        assert!(Instant::now() < end, "the large message was never seen by a peek");
        let id = posted(e0.peek(a0[1], t(3), 0, false, 9).unwrap());
        let c = until(&mut e1, &mut e0, 9, 1_000_000).expect("a peek completes");
        assert_eq!(c.id, id);
        if c.error.is_none() {
            peeked = Some(c.len);
        }
    }
    let small = posted(e0.trecv(vec![0; 1000], Desc::NONE, a0[1], t(3), 0, 10).unwrap());
    let big = until(&mut e1, &mut e0, 10, 2_000_000).expect("the truncating receive completes");
    assert_eq!(big.id, small);
    let _ = posted(e0.trecv(vec![0; 64], Desc::NONE, a0[1], t(4), 0, 11).unwrap());
    let next = until(&mut e1, &mut e0, 11, 200_000);
    assert_eq!(peeked, Some(BIG), "FI_PEEK reports a large message's full length");
    assert_eq!(big.error, Some(errno::TRUNC));
    assert_eq!(next.map(|c| (c.error, c.len)), Some((None, 8)), "the next message arrives after a large message's truncation");
}
