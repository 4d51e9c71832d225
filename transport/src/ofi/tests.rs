//! Tests of the OFI module on libfabric's `tcp` (through `ofi_rxm`, on loopback) and `shm`
//! providers: two endpoints of one process, and two processes (this test binary started
//! again as the second rank) wired up through a key-value store.

use std::time::{Duration, Instant};

use super::*;
use crate::mr::{Access, RegFlags, Segment};
use crate::packet::{PeerState, PKT_FIRST, PKT_LAST, PKT_WHOLE};

/// The providers every test runs on, with the node that keeps IP providers on loopback.
pub(crate) const PROVIDERS: &[&str] = &["tcp", "shm"];

pub(crate) fn hints(provider: &str) -> Hints {
    Hints { provider: Some(provider.into()), node: Some("127.0.0.1".into()) }
}

pub(crate) fn domain(provider: &str) -> OfiDomain {
    let offer = getinfo(&hints(provider)).unwrap_or_else(|e| panic!("{provider}: {e}")).into_iter().next().unwrap();
    OfiDomain::open(offer).unwrap()
}

/// Two endpoints of one domain that know each other: (a, b, b's address at a, a's at b).
fn pair(provider: &str) -> (Endpoint, Endpoint, u64, u64) {
    let d = domain(provider);
    let mut a = Endpoint::open(&d, 2).unwrap();
    let mut b = Endpoint::open(&d, 2).unwrap();
    let (na, nb) = (a.name().unwrap(), b.name().unwrap());
    let b_at_a = a.insert(&nb).unwrap();
    let a_at_b = b.insert(&na).unwrap();
    (a, b, b_at_a, a_at_b)
}

const WAIT: Duration = Duration::from_secs(30);

/// Drives both endpoints until `n` completions came from `rx` (those of `tx` are dropped
/// after their buffers are checked back).
fn completions(tx: &mut Endpoint, rx: &mut Endpoint, n: usize) -> Vec<Completion> {
    let mut out = Vec::new();
    let end = Instant::now() + WAIT;
    while out.len() < n {
        assert!(Instant::now() < end, "only {} of {n} completions in {WAIT:?}", out.len());
        tx.progress(|c| assert!(c.error.is_none(), "sender completion {c:?}")).unwrap();
        rx.progress(|c| out.push(c)).unwrap();
        std::thread::yield_now();
    }
    out
}

/// Sends from `ep` (progressing `peer` too: the first send over `ofi_rxm` answers
/// `-FI_EAGAIN` until its connection is up).
fn send(ep: &mut Endpoint, peer: &mut Endpoint, data: &[u8], dest: u64, bits: u64) {
    let mut buf = data.to_vec();
    let end = Instant::now() + WAIT;
    loop {
        match ep.tsend(buf, Desc::NONE, dest, bits, 0).unwrap() {
            Post::Posted(_) => return,
            Post::Busy(b) => buf = b,
        }
        assert!(Instant::now() < end, "tsend busy for {WAIT:?}");
        ep.progress(|c| assert!(c.error.is_none(), "{c:?}")).unwrap();
        peer.progress(|c| panic!("unexpected completion {c:?}")).unwrap();
    }
}

/// Posts with `op` on `ep` until it is not busy (the first operation to a peer over
/// `ofi_rxm` answers `-FI_EAGAIN` while its connection comes up), progressing `other` too.
fn retry(ep: &mut Endpoint, other: &mut Endpoint, mut op: impl FnMut(&mut Endpoint) -> crate::Result<Post>) -> OpId {
    let end = Instant::now() + WAIT;
    loop {
        if let Post::Posted(id) = op(ep).unwrap() {
            return id;
        }
        assert!(Instant::now() < end, "busy for {WAIT:?}");
        ep.progress(|c| panic!("unexpected completion {c:?}")).unwrap();
        other.progress(|_| {}).unwrap();
    }
}

pub(crate) fn posted(p: Post) -> OpId {
    match p {
        Post::Posted(id) => id,
        Post::Busy(_) => panic!("busy on an idle endpoint"),
    }
}

#[test]
fn constants_match_the_headers() {
    for (i, &v) in ffi::CONSTANTS.iter().enumerate() {
        // SAFETY: a pure function of its index.
        assert_eq!(unsafe { ffi::tofi_constant(i as u32) }, v, "constant #{i}");
    }
    assert!(version() >= (1, 17), "libfabric {:?}", version());
}

#[test]
fn getinfo_offers_tcp_on_loopback_and_shm() {
    let tcp = getinfo(&hints("tcp")).unwrap();
    assert!(tcp[0].provider.contains("tcp"), "{:?}", tcp[0]);
    assert_eq!(tcp[0].domain, "lo", "bound to loopback: {:?}", tcp[0]);
    assert!(!tcp[0].is_hardware());
    let shm = getinfo(&hints("shm")).unwrap();
    assert_eq!(shm[0].provider, "shm");
    for o in tcp.iter().chain(&shm) {
        assert_eq!(o.mr_mode.bits() & !OFFERED_MR_MODE.bits(), 0, "{o:?} requires a mode we did not offer");
        assert!(o.mr_key_size >= 1);
    }
    let none = OfiConfig { provider: Some("no-such-provider".into()), node: None }.offers().unwrap_err();
    assert!(none.to_string().contains("no-such-provider"), "{none}");
}

#[test]
fn provider_knob_is_checked() {
    let get = |v: &'static str| move |k: &str| (k == ENV_PROVIDER).then(|| v.to_string());
    assert_eq!(OfiConfig::from_lookup(get("tcp;ofi_rxm"), None).unwrap().provider.as_deref(), Some("tcp;ofi_rxm"));
    assert_eq!(OfiConfig::from_lookup(get("auto"), None).unwrap().provider, None);
    assert_eq!(OfiConfig::from_lookup(|_| None, None).unwrap().provider, None);
    assert_eq!(OfiConfig::from_lookup(get(""), None).unwrap().provider, None);
    for bad in ["tcp x", "Shm", "not-a-value", "tcp;", ";shm"] {
        let e = OfiConfig::from_lookup(get(bad), None).unwrap_err();
        assert!(e.to_string().contains(ENV_PROVIDER), "{e}");
    }
}

/// Exact, any-tag, any-source and fully wild receives, each matching the message meant for
/// it; two messages of one tag arrive in send order; a short receive is truncated.
#[test]
fn tagged_with_wildcards_and_truncation() {
    for p in PROVIDERS {
        let (mut a, mut b, b_at_a, a_at_b) = pair(p);
        let t = |src, tg| tag::send(tag::PROTO_MPI, 5, src, tg).unwrap();
        let r = |src, tg| tag::recv(tag::PROTO_MPI, 5, src, tg).unwrap();
        // Receives posted first (expected messages).
        let recvs = [
            (r(Some(0), Some(10)), a_at_b, 1u64),
            (r(Some(0), tag::ANY), a_at_b, 2),
            (r(tag::ANY, Some(30)), FI_ADDR_UNSPEC, 3),
            (r(tag::ANY, tag::ANY), FI_ADDR_UNSPEC, 4),
        ];
        for &((bits, ignore), src, user) in &recvs {
            posted(b.trecv(vec![0u8; 64], Desc::NONE, src, bits, ignore, user).unwrap());
        }
        send(&mut a, &mut b, b"ten", b_at_a, t(0, 10));
        send(&mut a, &mut b, b"twenty", b_at_a, t(0, 20));
        send(&mut a, &mut b, b"thirty", b_at_a, t(0, 30));
        send(&mut a, &mut b, b"forty", b_at_a, t(0, 40));
        let mut got: Vec<(u64, Vec<u8>, u64)> =
            completions(&mut a, &mut b, 4).into_iter().map(|c| (c.user, c.buf[..c.len].to_vec(), c.tag)).collect();
        got.sort();
        assert_eq!(
            got,
            vec![
                (1, b"ten".to_vec(), t(0, 10)),
                (2, b"twenty".to_vec(), t(0, 20)),
                (3, b"thirty".to_vec(), t(0, 30)),
                (4, b"forty".to_vec(), t(0, 40))
            ],
            "{p}"
        );
        // Unexpected messages of one tag are matched in order; another context never matches.
        send(&mut a, &mut b, b"first", b_at_a, t(0, 7));
        send(&mut a, &mut b, b"second", b_at_a, t(0, 7));
        let other = tag::recv(tag::PROTO_MPI, 6, tag::ANY, tag::ANY).unwrap();
        let stray = posted(b.trecv(vec![0u8; 64], Desc::NONE, FI_ADDR_UNSPEC, other.0, other.1, 9).unwrap());
        std::thread::sleep(Duration::from_millis(50));
        for u in [5, 6] {
            posted(b.trecv(vec![0u8; 64], Desc::NONE, a_at_b, r(Some(0), Some(7)).0, 0, u).unwrap());
        }
        let got: Vec<(u64, Vec<u8>)> = completions(&mut a, &mut b, 2).into_iter().map(|c| (c.user, c.buf[..c.len].to_vec())).collect();
        assert_eq!(got, vec![(5, b"first".to_vec()), (6, b"second".to_vec())], "{p}");
        b.cancel(stray).unwrap();
        let c = completions(&mut a, &mut b, 1).pop().unwrap();
        assert_eq!((c.user, c.error), (9, Some(errno::CANCELED)), "{p}");
        // Truncation: a 100-byte message into 10 bytes.
        posted(b.trecv(vec![0u8; 10], Desc::NONE, FI_ADDR_UNSPEC, t(0, 99), 0, 8).unwrap());
        send(&mut a, &mut b, &[7u8; 100], b_at_a, t(0, 99));
        let c = completions(&mut a, &mut b, 1).pop().unwrap();
        assert_eq!(c.error, Some(errno::TRUNC), "{p}: {c:?}");
        // Neither provider reports how much was cut (olen 0), which fi_cq(3) allows.
        assert_eq!(c.overflow, 0, "{p}: {c:?}");
        assert_eq!(c.buf.len(), 10);
    }
}

/// A peek finds nothing, then (after a send) the message without taking it; a claiming
/// peek takes it out of matching (a later receive does not get it); the claim receives it.
#[test]
fn peek_and_claim() {
    for p in PROVIDERS {
        let (mut a, mut b, b_at_a, _) = pair(p);
        if !a.offer().peek_works() {
            continue;
        }
        let bits = tag::send(tag::PROTO_MPI, 1, 0, 77).unwrap();
        let (any, ignore) = tag::recv(tag::PROTO_MPI, 1, tag::ANY, tag::ANY).unwrap();
        posted(b.peek(FI_ADDR_UNSPEC, any, ignore, false, 1).unwrap());
        let c = completions(&mut a, &mut b, 1).pop().unwrap();
        assert_eq!(c.error, Some(errno::NOMSG), "{p}: {c:?}");
        send(&mut a, &mut b, b"probe me", b_at_a, bits);
        // Peek until the message has arrived.
        let end = Instant::now() + WAIT;
        let found = loop {
            posted(b.peek(FI_ADDR_UNSPEC, any, ignore, false, 2).unwrap());
            let c = completions(&mut a, &mut b, 1).pop().unwrap();
            if c.error.is_none() {
                break c;
            }
            assert_eq!(c.error, Some(errno::NOMSG));
            assert!(Instant::now() < end, "{p}: message never seen by peek");
        };
        assert_eq!((found.len, found.tag), (8, bits), "{p}");
        posted(b.peek(FI_ADDR_UNSPEC, any, ignore, true, 3).unwrap());
        let c = completions(&mut a, &mut b, 1).pop().unwrap();
        assert!(c.claimed.is_some(), "{p}: claim {c:?}");
        let claim = c.claimed.unwrap();
        assert_eq!(claim.len, 8);
        // Claimed: an ordinary receive does not see it.
        let late = posted(b.trecv(vec![0u8; 64], Desc::NONE, FI_ADDR_UNSPEC, any, ignore, 4).unwrap());
        let id = b.recv_claimed(claim, vec![0u8; 64], Desc::NONE, 5).unwrap().unwrap_or_else(|_| panic!("busy"));
        let c = completions(&mut a, &mut b, 1).pop().unwrap();
        assert_eq!((c.id, c.user, &c.buf[..c.len]), (id, 5, &b"probe me"[..]), "{p}");
        b.cancel(late).unwrap();
        let c = completions(&mut a, &mut b, 1).pop().unwrap();
        assert_eq!((c.user, c.error), (4, Some(errno::CANCELED)), "{p}");
    }
}

/// The outcome of one `fi_read` of `len` bytes at offset `off` of a registered 8 KiB
/// region, with the key changed by `key_xor`, on a fresh pair of endpoints (a refused read
/// ends `ofi_rxm`'s connection: later operations on it fail with `FI_ENOTCONN`). The region
/// is the first half of a 16 KiB buffer, so that a provider which does not check ranges
/// (`shm`) reads mapped memory past it: the end of a heap block may be unmapped, and `shm`
/// never completes a read that faults.
fn one_read(p: &str, off: usize, len: usize, key_xor: u64, access: Access) -> ReadOutcome {
    read_within(p, off, len, key_xor, access, WAIT).unwrap_or_else(|| panic!("{p}: read never completed"))
}

/// What a read ended with: its error, the reader's buffer, the bytes it should hold.
type ReadOutcome = (Option<i32>, Vec<u8>, Vec<u8>);

/// [`one_read`] that gives up after `wait` (`None`: no completion by then).
fn read_within(p: &str, off: usize, len: usize, key_xor: u64, access: Access, wait: Duration) -> Option<ReadOutcome> {
    let d = domain(p);
    let mut a = Endpoint::open(&d, 2).unwrap();
    let mut b = Endpoint::open(&d, 2).unwrap();
    let a_at_b = b.insert(&a.name().unwrap()).unwrap();
    let src: Vec<u8> = (0..16384u32).map(|i| (i * 7) as u8).collect();
    let seg = [Segment { addr: src.as_ptr() as usize, len: 8192 }];
    let mut mr = d.reg(&seg, access, 0x51, RegFlags::empty()).unwrap();
    mr.bind_enable(&a).unwrap();
    let key = match mr.key() {
        Some(k) => k,
        None => {
            let (base, raw) = mr.raw_key().unwrap();
            d.map_raw(base, &raw).unwrap()
        }
    };
    let addr = mr.remote_addr(src.as_ptr() as usize).unwrap() + off as u64;
    retry(&mut b, &mut a, |b| b.read(vec![0xeeu8; len], Desc::NONE, a_at_b, addr, key ^ key_xor, 1));
    let end = Instant::now() + wait;
    let mut done = None;
    while done.is_none() {
        if Instant::now() >= end {
            // The read may still be out: the endpoints close before the memory goes.
            drop((a, b));
            return None;
        }
        a.progress(|_| {}).unwrap();
        b.progress(|c| done = Some(c)).unwrap();
    }
    let c = done.unwrap();
    let want = src.get(off..off + len).map(<[u8]>::to_vec).unwrap_or_default();
    Some((c.error, c.buf, want))
}

/// libfabric 1.17's `shm` never completes a read whose source faults (unmapped memory): no
/// data, no error, the initiator waits forever (CONFORMANCE.md, P11). tmpi reads over `shm`
/// only ranges a peer registered and announced; this test tells when a libfabric fixes it.
#[test]
fn shm_never_completes_a_read_that_faults() {
    let unmapped = 1 << 46;
    let out = read_within("shm", unmapped, 64, 0, Access::REMOTE_READ | Access::SEND, Duration::from_millis(500));
    assert!(out.is_none(), "shm now completes a read that faults ({out:?}): update CONFORMANCE.md P11");
}

/// libfabric 1.17's `shm` posts a peek as a receive of no bytes: it does not complete while
/// no message is there, then consumes the message and completes with `FI_ETRUNC`.
/// [`Offer::peek_works`] says so; this test tells when a libfabric fixes it.
#[test]
fn shm_peek_is_a_zero_byte_receive() {
    let (mut a, mut b, b_at_a, _) = pair("shm");
    assert!(!a.offer().peek_works());
    let bits = tag::send(tag::PROTO_MPI, 1, 0, 77).unwrap();
    let (any, ignore) = tag::recv(tag::PROTO_MPI, 1, tag::ANY, tag::ANY).unwrap();
    let peek = posted(b.peek(FI_ADDR_UNSPEC, any, ignore, false, 1).unwrap());
    for _ in 0..1000 {
        b.progress(|c| panic!("shm now completes an empty peek ({c:?}): update Offer::peek_works")).unwrap();
    }
    send(&mut a, &mut b, b"probe me", b_at_a, bits);
    let c = completions(&mut a, &mut b, 1).pop().unwrap();
    assert_eq!((c.id, c.error), (peek, Some(errno::TRUNC)));
    // The message is gone: a receive does not get it.
    let r = posted(b.trecv(vec![0u8; 64], Desc::NONE, FI_ADDR_UNSPEC, any, ignore, 2).unwrap());
    for _ in 0..1000 {
        b.progress(|c| panic!("the peeked message was still there: {c:?}")).unwrap();
    }
    b.cancel(r).unwrap();
    assert_eq!(completions(&mut a, &mut b, 1).pop().unwrap().error, Some(errno::CANCELED));
}

/// fi_read of a registered range with the right key moves the bytes. `tcp` refuses a wrong
/// key and a range past the region (the reader's buffer keeps its contents) but not a region
/// registered without `REMOTE_READ`; libfabric 1.17's `shm` checks none of them (it copies by
/// address with `process_vm_readv`). [`Offer::checks_remote_keys`] and
/// [`Offer::checks_remote_access`] say so, and this test holds them to it.
#[test]
fn rma_read_checks_the_key() {
    let rr = Access::REMOTE_READ | Access::SEND;
    for p in PROVIDERS {
        let o = domain(p);
        let (keys, rights) = (o.offer().checks_remote_keys(), o.offer().checks_remote_access());
        let (err, got, want) = one_read(p, 100, 4096, 0, rr);
        assert_eq!(err, None, "{p}");
        assert_eq!(got, want, "{p}");
        for (what, off, len, xor, access) in
            [("a wrong key", 0, 4096, 0x5a5a_0000, rr), ("past the region", 8000, 4096, 0, rr), ("no REMOTE_READ", 0, 64, 0, Access::SEND)]
        {
            let (err, got, _) = one_read(p, off, len, xor, access);
            let checks = if access.contains(Access::REMOTE_READ) { keys } else { rights };
            if checks {
                assert!(err.is_some(), "{p}: a read with {what} was not refused");
                assert!(got.iter().all(|&x| x == 0xee), "{p}: a refused read ({what}) wrote the buffer");
                eprintln!("{p}: a read with {what} completes with fi_errno {err:?}");
            } else {
                assert_eq!(err, None, "{p} now refuses a read with {what}: update Offer::checks_remote_keys/access");
            }
        }
    }
}

/// The packet fabric between two endpoints: multi-part packets in order, messages of
/// several packets, and the finalize mark.
#[test]
fn packet_fabric_in_order_and_finalize() {
    for p in PROVIDERS {
        let (a, b, b_at_a, a_at_b) = pair(p);
        let mut fa = OfiFabric::new(0, a, vec![FI_ADDR_UNSPEC, b_at_a]).unwrap();
        let mut fb = OfiFabric::new(1, b, vec![a_at_b, FI_ADDR_UNSPEC]).unwrap();
        let big = vec![3u8; fa.max_packet() - 8];
        let n = 600u32;
        let mut sent = 0u32;
        let mut got: Vec<(u8, u64, Vec<u8>)> = Vec::new();
        let end = Instant::now() + WAIT;
        while got.len() < n as usize {
            assert!(Instant::now() < end, "{p}: {} of {n} packets", got.len());
            while sent < n {
                let i = sent.to_le_bytes();
                let body: &[u8] = if sent % 10 == 0 { &big } else { b"x" };
                let flags = if sent % 3 == 0 { PKT_FIRST } else { PKT_LAST };
                if !fa.try_send(1, flags, u64::from(sent), &[&i, body, b"!"]).unwrap() {
                    break;
                }
                sent += 1;
            }
            fb.poll(|pk| {
                assert_eq!(pk.src, 0);
                got.push((pk.flags, pk.total_len, pk.data.to_vec()));
                true
            })
            .unwrap();
            fa.poll(|_| true).unwrap();
        }
        for (i, (flags, total, data)) in got.iter().enumerate() {
            assert_eq!(*total, i as u64, "{p}: packet order");
            assert_eq!(&data[..4], &(i as u32).to_le_bytes());
            assert_eq!(data.len(), 5 + if i % 10 == 0 { big.len() } else { 1 }, "{p}");
            assert_eq!(*flags, if i % 3 == 0 { PKT_FIRST } else { PKT_LAST });
        }
        assert!(fa.try_send(1, PKT_WHOLE, 0, &[&vec![0u8; fa.max_packet() + 1]]).is_err(), "oversized");
        assert!(fa.try_send(0, PKT_WHOLE, 0, &[b"me"]).is_err(), "to itself");
        assert_eq!(fb.peer_state(0), PeerState::Alive);
        assert!(fa.try_send(1, PKT_WHOLE, 1, &[b"last"]).unwrap());
        let end = Instant::now() + WAIT;
        let mut last = Vec::new();
        // Finalize flushes this rank's sends, which over `shm` (padded, not injected)
        // complete only as the receiver takes them: the receiver runs beside it.
        std::thread::scope(|s| {
            let flush = s.spawn(|| fa.mark_finalized());
            while fb.peer_state(0) != PeerState::Finalized {
                assert!(Instant::now() < end, "{p}: finalize not seen");
                fb.poll(|pk| {
                    last.push(pk.data.to_vec());
                    true
                })
                .unwrap();
                fb.wait(Duration::from_millis(1));
            }
            flush.join().unwrap();
        });
        assert_eq!(last, vec![b"last".to_vec()], "{p}: the last packet comes before the finalize mark");
    }
}

/// A waker ends a wait from another thread.
#[test]
fn waker_ends_a_wait() {
    let (a, _b, b_at_a, _) = pair("tcp");
    let mut fa = OfiFabric::new(0, a, vec![FI_ADDR_UNSPEC, b_at_a]).unwrap();
    let w = fa.waker().unwrap();
    let t = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(20));
        w.wake();
    });
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(20) && !fa.wait(Duration::from_secs(20)) {}
    t.join().unwrap();
    assert!(start.elapsed() < Duration::from_secs(20), "the wait was not ended");
}

/// A key-value store in a directory, for wire-up across processes in tests.
struct DirKv {
    dir: std::path::PathBuf,
    size: usize,
    rank: usize,
    fences: usize,
}

impl crate::bootstrap::KeyValue for DirKv {
    fn put(&mut self, key: &str, value: &[u8]) -> crate::Result<()> {
        let tmp = self.dir.join(format!(".{key}.{}", self.rank));
        std::fs::write(&tmp, value)
            .and_then(|()| std::fs::rename(&tmp, self.dir.join(key)))
            .map_err(|e| crate::Error::Bootstrap(e.to_string()))
    }
    fn get(&mut self, key: &str) -> crate::Result<Vec<u8>> {
        std::fs::read(self.dir.join(key)).map_err(|e| crate::Error::Bootstrap(format!("{key}: {e}")))
    }
    fn fence(&mut self) -> crate::Result<()> {
        self.fences += 1;
        self.put(&format!("fence-{}-{}", self.fences, self.rank), b"")?;
        let end = Instant::now() + WAIT;
        while (0..self.size).any(|r| !self.dir.join(format!("fence-{}-{r}", self.fences)).exists()) {
            if Instant::now() > end {
                return Err(crate::Error::Bootstrap("fence timed out".into()));
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        Ok(())
    }
}

const CHILD_ENV: &str = "TMPI_OFI_TEST_CHILD";
const MSGS: u32 = 300;

/// One rank of the two-process test: wire up, send `MSGS` packets to the other rank (some
/// of several packets), receive its `MSGS`, check them, finalize, and see it finalize.
fn two_process_rank(dir: &std::path::Path, rank: usize, provider: &str, pad: bool) {
    let mut kv = DirKv { dir: dir.to_path_buf(), size: 2, rank, fences: 0 };
    let cfg = OfiConfig { provider: Some(provider.into()), node: Some("127.0.0.1".into()) };
    let mut f = wire_up(&mut kv, rank, 2, &cfg).unwrap();
    if !pad {
        f.without_padding();
    }
    let peer = 1 - rank;
    let (mut sent, mut got) = (0u32, 0u32);
    let end = Instant::now() + Duration::from_secs(60);
    while got < MSGS || sent < MSGS {
        assert!(Instant::now() < end, "rank {rank}: sent {sent}, got {got}: {}", f.debug_state());
        if sent < MSGS {
            let body = vec![(sent % 251) as u8; (sent as usize * 97) % 3000];
            let ok = f.try_send(peer, PKT_WHOLE, u64::from(sent), &[&(rank as u32).to_le_bytes(), &sent.to_le_bytes(), &body]).unwrap();
            sent += u32::from(ok);
        }
        f.poll(|pk| {
            assert_eq!(pk.src, peer);
            assert_eq!(pk.total_len, u64::from(got), "rank {rank}: order");
            assert_eq!(&pk.data[..4], &(peer as u32).to_le_bytes());
            assert_eq!(&pk.data[4..8], &got.to_le_bytes());
            let body = &pk.data[8..];
            assert_eq!(body.len(), (got as usize * 97) % 3000);
            assert!(body.iter().all(|&x| x == (got % 251) as u8));
            got += 1;
            true
        })
        .unwrap();
    }
    f.mark_finalized();
    while f.peer_state(peer) != PeerState::Finalized {
        assert!(Instant::now() < end, "rank {rank}: peer never finalized");
        f.poll(|_| true).unwrap();
        f.wait(Duration::from_millis(2));
    }
    // Neither process exits before both saw the other finalize: over `shm` a packet is read
    // from its sender's memory, and a rank whose peer finalized first does not wait for its
    // own `finalized` packet to be taken (the engine's finalize needs no more: the peer
    // waits for nothing from it), so leaving at once could take that packet with it.
    kv.fence().unwrap();
}

/// Runs [`two_process_rank`] as rank 0 here and as rank 1 in a copy of this test binary
/// started to run only `test` (which calls this too, and finds itself the child).
fn two_processes(test: &str, p: &str, pad: bool) {
    if let Ok(spec) = std::env::var(CHILD_ENV) {
        let (dir, provider) = spec.split_once('|').unwrap();
        two_process_rank(std::path::Path::new(dir), 1, provider, pad);
        return;
    }
    {
        let dir = std::env::temp_dir().join(format!("tmpi-ofi-test-{}-{p}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let exe = std::env::current_exe().unwrap();
        let mut child = std::process::Command::new(exe)
            .args(["--exact", test, "--nocapture", "--test-threads=1", "--include-ignored"])
            .env(CHILD_ENV, format!("{}|{p}", dir.display()))
            .spawn()
            .unwrap();
        two_process_rank(&dir, 0, p, pad);
        let st = child.wait().unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        assert!(st.success(), "{p}: rank 1 {st}");
    }
}

/// Two processes on loopback over `tcp` (this binary runs again as rank 1): packets both
/// ways, in order, then both finalize.
#[test]
fn two_processes_exchange_packets_tcp() {
    two_processes("ofi::tests::two_processes_exchange_packets_tcp", "tcp", true);
}

/// The same over `shm`, whose packets are padded past its inject size
/// ([`Offer::unexpected_floor`]).
#[test]
fn two_processes_exchange_packets_shm() {
    two_processes("ofi::tests::two_processes_exchange_packets_shm", "shm", true);
}

/// Why `shm`'s packets are padded: without it, libfabric 1.17's `shm` loses a block of
/// messages between two processes. The receiver gets its first 2 x [`packet::RX_DEPTH`]
/// packets (those that found a posted receive, then as many held as unexpected), then none
/// of a block, then later ones, while every send succeeded; with 400 receives posted
/// nothing is lost, nor with packets past 4 KiB (its CMA protocol, whose sender waits for
/// the receiver), nor within one process. This test fails while that is so (run it with
/// `--ignored`); once it passes, `Offer::unexpected_floor` can say 0 for the fixed version.
#[test]
#[ignore = "fails with libfabric 1.17: shows the loss the padding avoids (see the doc comment)"]
fn shm_loses_small_unexpected_messages_between_processes() {
    two_processes("ofi::tests::shm_loses_small_unexpected_messages_between_processes", "shm", false);
}

/// The raw variants receive and read into caller-owned memory.
#[test]
fn raw_receive_and_read() {
    for p in PROVIDERS {
        let (mut a, mut b, b_at_a, a_at_b) = pair(p);
        let mut dst = vec![0u8; 32];
        // SAFETY: `dst` outlives the receive, whose completion is read below before it is used.
        let id = retry(&mut b, &mut a, |b| unsafe { b.trecv_raw(dst.as_mut_ptr(), dst.len(), Desc::NONE, FI_ADDR_UNSPEC, 3, 0, 1) });
        send(&mut a, &mut b, b"raw bytes", b_at_a, 3);
        let c = completions(&mut a, &mut b, 1).pop().unwrap();
        assert_eq!((c.id, c.len, c.buf.len(), c.error), (id, 9, 0, None), "{p}");
        assert_eq!(&dst[..9], b"raw bytes");
        let src: Vec<u8> = (0..256u32).map(|i| i as u8).collect();
        let d = &a.dom;
        let mr = OfiDomain { inner: std::sync::Arc::clone(d) }
            .reg(&[Segment { addr: src.as_ptr() as usize, len: 256 }], Access::REMOTE_READ, 0x77, RegFlags::empty())
            .unwrap();
        let key = mr.key().unwrap();
        let addr = mr.remote_addr(src.as_ptr() as usize + 16).unwrap();
        let mut out = vec![0u8; 64];
        // SAFETY: as above.
        retry(&mut b, &mut a, |b| unsafe { b.read_raw(out.as_mut_ptr(), 64, Desc::NONE, a_at_b, addr, key, 2) });
        let c = completions(&mut a, &mut b, 1).pop().unwrap();
        assert_eq!(c.error, None, "{p}");
        assert_eq!(&out[..], &src[16..80], "{p}");
    }
}

#[test]
fn auto_takes_only_providers_that_drive_hardware() {
    let table: [(&str, bool); 12] = [
        ("verbs", true),
        ("verbs;ofi_rxm", true),
        ("efa", true),
        ("cxi", true),
        ("psm2", true),
        ("psm3", true),
        ("opx", true),
        ("tcp", false),
        ("tcp;ofi_rxm", false),
        ("udp;ofi_rxd", false),
        ("sockets", false),
        ("shm", false),
    ];
    for (p, hw) in table {
        assert_eq!(is_hardware(p), hw, "{p}");
        let cfg = OfiConfig { provider: Some(p.into()), node: None };
        assert_eq!(auto_provider(&cfg).is_some(), hw, "{p}");
    }
    // This machine has only the software providers: auto keeps TCP.
    assert_eq!(auto_provider(&OfiConfig::default()), None);
}

#[test]
fn providers_lists_what_getinfo_offers_once_each() {
    let names = providers().unwrap();
    for p in PROVIDERS {
        assert!(names.iter().any(|n| n.split(';').next() == Some(p)), "{p} missing from {names:?}");
    }
    let mut seen = names.clone();
    seen.dedup();
    seen.sort();
    seen.dedup();
    assert_eq!(seen.len(), names.len(), "{names:?}");
}

#[test]
fn published_addresses_parse_or_are_refused() {
    let ok = b"tcp;ofi_rxm\x004242\x00host/boot\x00\x01\x02\x00\x03";
    let p = Published::parse(ok).unwrap();
    assert_eq!((p.provider.as_str(), p.pid, p.host.as_str(), p.addr), ("tcp;ofi_rxm", 4242, "host/boot", &[1u8, 2, 0, 3][..]));
    for bad in [&b"tcp"[..], b"tcp\x00x\x00h\x00a", b"tcp\x001\x00h\x00", b"tcp\x001\x00h", b"\xff\x001\x00h\x00a"] {
        assert!(Published::parse(bad).is_none(), "{bad:?}");
    }
}

/// A region `shm` left under a process id is removed for that id only.
#[test]
fn stale_shm_regions_of_one_process_id_are_removed() {
    // Ids above any pid_max, so that no live process owns them.
    let (dead, other) = (4_190_001u32, 4_190_002u32);
    let path = |pid: u32, ep: u32| std::path::PathBuf::from(format!("/dev/shm/{pid}:0:{ep}"));
    for p in [path(dead, 0), path(dead, 1), path(other, 0)] {
        std::fs::write(&p, b"stale").unwrap();
    }
    remove_stale_shm_regions(dead);
    assert!(!path(dead, 0).exists() && !path(dead, 1).exists());
    assert!(path(other, 0).exists());
    std::fs::remove_file(path(other, 0)).unwrap();
}
