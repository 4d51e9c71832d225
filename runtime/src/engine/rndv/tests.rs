//! The rendezvous stages step by step, over the in-process fabric or a real segment.

use super::super::testkit::{pair, recv, send, settle};
use super::reader::{ReadOp, ReadPhase};
use super::*;
use tmpi_transport::shm::heap::HeapDesc;

/// The last control packet queued, which must be an RMA packet, decoded.
fn last_rma(e: &Engine) -> Rma<'_> {
    let (_, c) = e.st.outbox.ctl().back().expect("a control packet");
    assert_ne!(c.flags & PKT_RMA, 0, "an RMA packet");
    Rma::parse(&c.bytes[..c.len as usize]).expect("a well-formed RMA packet")
}

/// Rank 0 of a two-rank job of threads, and the peer's fabric end (kept, never polled).
fn engine() -> (Engine, tmpi_transport::local::LocalFabric) {
    let mut f = tmpi_transport::local::LocalFabric::create(2, 64 * 1024);
    let peer = f.swap_remove(1);
    (Engine::new(AnyFabric::Local(f.swap_remove(0)), 0, 2, Config::default()).unwrap(), peer)
}

/// A streamed read request of `len` bytes, named `read`, of send `send`.
fn read_req(read: u64, send: u32, va: u64, key: u64, len: usize, maps: bool, dst_heap: Option<HeapSrc>) -> ReadRequest {
    ReadRequest {
        read,
        mode: ReadMode::Stream,
        send,
        va,
        key,
        len: len as u64,
        reader_maps_heap: maps,
        dst_heap: dst_heap.map(HeapPlace::from),
    }
}

/// A shared buffer is granted (for a memcpy) only while the send that lends it is live: once
/// the send completed and the buffer was freed and its memory handed out again, a reader
/// repeating the old request (send name, key, address) is refused by the target, and no
/// grant names the new block.
#[test]
fn a_freed_shared_buffer_is_never_granted_again() {
    let (mut e, _peer) = engine();
    let Some(heap) = e.shared_heap() else {
        eprintln!("no shared heap on this system");
        return;
    };
    let len = 1 << 20;
    let mut a = heap.alloc(len, 8).unwrap();
    a.as_bytes_mut().fill(1);
    // SAFETY: `a` outlives the send, which completes below before `a` is dropped.
    let raw = unsafe { RawBuf::new(a.as_bytes()) };
    let rid = e.start_rndv(1, 77, raw).unwrap();
    let (key, va) = match e.st.rndv_send_ref(rid) {
        Some(r) => (r._mr.as_ref().unwrap().key().unwrap(), r.va),
        _ => panic!("no rendezvous send"),
    };
    let name = wire_name(rid);
    let id = 0x0909_0909_0909_0909;
    e.st.serve_read(1, read_req(id, name, va, key, len, true, None));
    let Rma::Grant { read, split, heap: Some(h) } = last_rma(&e) else { panic!("a grant naming our heap") };
    assert_eq!(read, id);
    assert_eq!(h.off, a.offset() as u64);
    assert_eq!(split, len as u64, "the reader copies it all");
    // A reader that does not map our heap gets the data streamed.
    e.st.serve_read(1, read_req(id, name, va, key, len, false, None));
    assert_eq!(e.st.outbox.streams_mut().pop_back().map(|r| r.buf.len()), Some(len));
    // The FIN completes the send; the user collects it and frees the buffer.
    e.st.send_progress(rid, true, true);
    assert!(e.take_if_done(rid).unwrap().is_ok());
    let off = a.offset();
    drop(a);
    let mut b = heap.alloc(len, 8).unwrap();
    assert_eq!(b.offset(), off, "the freed memory is handed out again");
    b.as_bytes_mut().fill(2);
    // SAFETY: `b` outlives the engine's use of it (the engine is dropped first).
    let raw = unsafe { RawBuf::new(b.as_bytes()) };
    let rid2 = e.start_rndv(1, 78, raw).unwrap();
    assert_ne!(wire_name(rid2), name);
    let before = e.st.outbox.ctl().len();
    e.st.serve_read(1, read_req(id, name, va, key, len, true, None));
    assert_eq!(e.st.outbox.ctl().len(), before + 1);
    assert_eq!(last_rma(&e), Rma::ReadErr { read: id }, "a stale read request is refused");
    assert!(e.st.outbox.streams().is_empty());
    drop(e);
    drop(b);
}

/// A single-copy read of 32 KiB to 1 MiB is split between reader and target unless the
/// target is busy reading too (then each copies its own); from 1 MiB it is split anyway,
/// unless the target's own reads in flight are many and the read is below 8 MiB.
#[test]
fn a_busy_target_splits_only_the_largest_reads() {
    let (mut e, _peer) = engine();
    let src = vec![3u8; 8 << 20];
    let split_of = |e: &mut Engine, len: usize| {
        // SAFETY: `src` outlives the engine.
        let raw = unsafe { RawBuf::new(&src[..len]) };
        let rid = e.start_rndv(1, 5, raw).unwrap();
        let (key, va) = match e.st.rndv_send_ref(rid) {
            Some(r) => (r._mr.as_ref().unwrap().key().unwrap(), r.va),
            _ => panic!("no rendezvous send"),
        };
        let q = ReadRequest { mode: ReadMode::SingleCopy { dst: 0x10_0000 }, ..read_req(7, wire_name(rid), va, key, len, false, None) };
        e.st.serve_read(1, q);
        let Rma::Grant { split, .. } = last_rma(e) else { panic!("a grant") };
        e.st.outbox.writes_mut().clear();
        split as usize
    };
    assert_eq!(split_of(&mut e, 256 << 10), 128 << 10, "idle: split");
    // Below CMA_SPLIT_MIN a reader asks only with other reads in flight (a window).
    assert_eq!(split_of(&mut e, 64 << 10), 32 << 10, "a window's 64 KiB read: split");
    assert_eq!(split_of(&mut e, 16 << 10), 16 << 10, "below CMA_SPLIT_WINDOW_MIN: the reader copies it all");
    // This rank reads something itself.
    let info = RndvInfo {
        tmh: Tmh { op: TmOp::Rndv, app_ctx: 0, tag: 0 },
        rvh: Rvh { va: 0, rkey: 0, len: 1 },
        key: 0,
        len: 1,
        pregranted: false,
        fabric: None,
    };
    let rid = Key::new(0, 0);
    let read = || ReadOp { rid, src: 1, n: 1, got: 0, hw: None, info, phase: ReadPhase::Granted { split: 1 }, placed: None };
    e.st.reads.insert(read());
    assert_eq!(split_of(&mut e, 256 << 10), 256 << 10, "busy: the reader copies it all");
    assert_eq!(split_of(&mut e, 2 << 20), 1 << 20, "busy, but large: split");
    // A deep queue of its own reads (`osu_bibw`'s window): no split below 8 MiB.
    while e.st.reads.len() < CMA_SPLIT_DEEP - 1 {
        e.st.reads.insert(read());
    }
    assert_eq!(split_of(&mut e, 2 << 20), 1 << 20, "one read short of deep: split");
    e.st.reads.insert(read());
    assert_eq!(split_of(&mut e, 2 << 20), 2 << 20, "deep: the reader copies it all");
    assert_eq!(split_of(&mut e, 4 << 20), 4 << 20, "deep, 4 MiB: the reader copies it all");
    assert_eq!(split_of(&mut e, 8 << 20), 4 << 20, "deep, but from CMA_SPLIT_DEEP_MAX: split");
    drop(e);
}

/// A heap read goes around the cache when it alone is at least half the L3, or when it
/// is not small and the reads in flight together are (a window): never for a ping-pong's
/// lone read below that.
#[test]
fn heap_reads_go_around_the_cache_for_large_reads_and_large_windows() {
    let (mut e, _peer) = engine();
    let min = tmpi_transport::shm::streaming_copy_min();
    let each = (min / 16).max(AROUND_CACHE_MIN);
    assert!(e.st.around_cache(min), "alone at the threshold");
    assert!(!e.st.around_cache(each), "a lone read below it");
    let info = RndvInfo {
        tmh: Tmh { op: TmOp::Rndv, app_ctx: 0, tag: 0 },
        rvh: Rvh { va: 0, rkey: 0, len: 1 },
        key: 0,
        len: 1,
        pregranted: false,
        fabric: None,
    };
    let read =
        |n: usize| ReadOp { rid: Key::new(0, 0), src: 1, n, got: 0, hw: None, info, phase: ReadPhase::Granted { split: n }, placed: None };
    // A window of small reads never makes any read go around.
    for _ in 0..(min / (AROUND_CACHE_MIN / 2)) {
        e.st.reads.insert(read(AROUND_CACHE_MIN / 2));
    }
    assert!(!e.st.around_cache(AROUND_CACHE_MIN / 2), "small reads stay in the cache");
    e.st.reads = Reads::new(2);
    let mut keys = Vec::new();
    for i in 0..16 {
        assert!(!e.st.around_cache(each) || i * each >= min, "{i} reads in flight");
        keys.push(e.st.reads.insert(read(each)));
    }
    assert!(e.st.around_cache(each), "a window of {} bytes", 16 * each);
    for k in keys {
        e.st.reads.remove(k);
    }
    assert!(!e.st.around_cache(each), "the window drained");
    drop(e);
}

/// A reader whose buffer is in its own heap gets the target's share written there; a
/// request without any heap goes the old way.
#[test]
fn a_reader_heap_receives_the_targets_share() {
    let (mut e, _peer) = engine();
    let len = 4 << 20;
    let src = vec![3u8; len];
    // SAFETY: `src` outlives the engine.
    let raw = unsafe { RawBuf::new(&src) };
    let rid = e.start_rndv(1, 5, raw).unwrap();
    let (key, va) = match e.st.rndv_send_ref(rid) {
        Some(r) => (r._mr.as_ref().unwrap().key().unwrap(), r.va),
        _ => panic!("no rendezvous send"),
    };
    let dst = HeapSrc { off: 8192, desc: HeapDesc { fd: 3, nonce: 11 } };
    let id = 0x0404_0404_0404_0404;
    e.st.serve_read(1, read_req(id, wire_name(rid), va, key, len, true, Some(dst)));
    let Rma::Grant { split, heap: None, .. } = last_rma(&e) else { panic!("a grant of no heap range") };
    assert_eq!(split, 0, "the target writes it all");
    assert_eq!(e.st.ways.heaps.writes.get(&(1, id)).map(|h| h.off), Some(8192));
    assert_eq!(e.st.outbox.writes().back().map(|w| (w.base, w.buf.len())), Some((0, len)));
    let before = e.st.outbox.writes().len();
    e.st.serve_read(1, read_req(0x0505_0505_0505_0505, wire_name(rid), va, key, len, true, None));
    assert_eq!(e.st.outbox.writes().len(), before);
    assert_eq!(e.st.outbox.streams().len(), 1);
    drop(e);
}

/// A rendezvous of `len` bytes from rank 0 to rank 1 under `cfg`: the data arrives, both
/// requests complete; returns the receiver's statistics.
fn rendezvous(cfg: Config, len: usize) -> Stats {
    let mut v = super::super::testkit::job(2, cfg);
    let (b, a) = (&mut v.pop().expect("b"), &mut v.pop().expect("a"));
    let data: Vec<u8> = (0..len).map(|i| (i * 7 + i / 4093) as u8).collect();
    let mut buf = vec![0u8; len];
    let r = recv(b, Some(0), Some(8), &mut buf);
    let s = send(a, 1, 8, &data, false).expect("a rendezvous waits for its FIN");
    settle(&mut [&mut *a, &mut *b]);
    assert_eq!(b.take_if_done(r).expect("received").expect("ok").len(), len);
    assert!(a.take_if_done(s).expect("FIN").is_ok());
    assert!(buf == data, "the data arrived intact");
    assert!(b.st.reads.is_empty() && a.st.outbox.streams().is_empty() && a.st.outbox.writes().is_empty());
    std::mem::take(&mut b.st.stats)
}

/// Teaches `e`'s chooser that reads of `n` bytes are `stream_us` microseconds through the
/// rings and `cma_us` by single copy (six timed periods, as a real run would give).
fn teach(e: &mut Engine, n: usize, stream_us: u64, cma_us: u64) {
    let mut t = adapt::Stamp::now();
    for _ in 0..6 {
        let p = e.st.ways.copy.start(n, 0, || t);
        t += std::time::Duration::from_micros(if p.arm == adapt::Arm::Cma { cma_us } else { stream_us });
        e.st.ways.copy.finish(n, p, true, || t);
    }
}

/// Two engines of a two-rank job, `(a, b)`, the receiver `b` taught that single copy is
/// the faster way for `n` bytes; `None` on one CPU (rendezvous does not start low there).
fn taught_pair(n: usize) -> Option<(Engine, Engine)> {
    if crate::sys::usable_cpus() < 2 {
        return None;
    }
    let mut v = super::super::testkit::job(2, Config::default());
    let mut b = v.pop().expect("b");
    teach(&mut b, n, 30, 10);
    Some((v.pop().expect("a"), b))
}

/// `TMPI_RNDV_THRESHOLD=auto`: between ranks of one host a 64 KiB message starts as a
/// rendezvous; a receiver that found the rings faster for that size tells the sender
/// (`EAGER_BELOW`), and the next one goes eagerly. One that found single copy faster
/// says nothing, and rendezvous goes on.
#[test]
fn a_receiver_advises_its_sender_where_eager_pays() {
    if crate::sys::usable_cpus() < 2 {
        eprintln!("one CPU: two ranks outnumber it, and rendezvous does not start low");
        return;
    }
    for (stream_us, cma_us, advised) in [(10, 30, true), (30, 10, false)] {
        let mut v = super::super::testkit::job(2, Config::default());
        let (b, a) = (&mut v.pop().expect("b"), &mut v.pop().expect("a"));
        assert_eq!(a.st.threshold.rndv_from(1), adapt::RNDV_LOW, "rendezvous starts low between ranks of one host");
        let n = 64 << 10;
        teach(b, n, stream_us, cma_us);
        let data = vec![5u8; n];
        let mut buf = vec![0u8; n];
        for round in 0..2 {
            let r = recv(b, Some(0), Some(round), &mut buf);
            let s = send(a, 1, round, &data, false);
            settle(&mut [&mut *a, &mut *b]);
            assert!(b.take_if_done(r).expect("received").is_ok());
            if let Some(s) = s {
                assert!(a.take_if_done(s).expect("sent").is_ok());
            }
            assert!(buf == data);
        }
        let (sa, sb) = (std::mem::take(&mut a.st.stats), std::mem::take(&mut b.st.stats));
        if advised {
            assert_eq!((sa.rndv, sa.eager, sa.eager_advice), (1, 1, 1), "{sa:?}");
            assert_eq!(a.st.threshold.rndv_from(1), 128 << 10);
            assert_eq!(b.st.threshold.advised(0), 128 << 10);
        } else {
            assert_eq!((sa.rndv, sa.eager, sa.eager_advice), (2, 0, 0), "{sa:?}");
            assert_eq!(sb.cma_reads, 2, "single copy chosen: {sb:?}");
            assert_eq!(sb.pregranted, 2, "copied at once, the sender's key check done with its request: {sb:?}");
        }
        // Advice never lowers a threshold, nor raises it past the ceiling (auto: one size
        // class above the fixed start).
        a.st.on_control(1, &ctl_body(Control::EagerBelow { bytes: 1024 })).expect("advice");
        a.st.on_control(1, &ctl_body(Control::EagerBelow { bytes: u32::MAX })).expect("advice");
        assert_eq!(a.st.threshold.rndv_from(1), crate::config::RNDV_ADVISED_MAX);
    }
}

/// `READ_WAY` from the lower rank sets the way this rank reads that class; from a higher
/// rank, naming no way, or no size class, it is a malformed message that names the peer.
#[test]
fn read_way_is_followed_from_the_lower_rank_only() {
    let mut v = super::super::testkit::job(2, Config::default());
    let (mut b, mut a) = (v.pop().expect("b"), v.pop().expect("a"));
    let big = 32 << 20;
    let way = |class: u32, way: u32| ctl_body(Control::ReadWay { class, way });
    b.st.on_control(0, &way(25, 0)).expect("from the lower rank");
    assert_eq!(b.st.ways.copy.start(big, 0, adapt::Stamp::now).arm, adapt::Arm::Stream, "learning alone would try single copy first");
    let errs = [a.st.on_control(1, &way(25, 1)), b.st.on_control(0, &way(25, 2)), b.st.on_control(0, &way(64, 0))];
    for (src, r) in [1, 0, 0].into_iter().zip(errs) {
        let err = r.expect_err("malformed").to_string();
        assert!(err.contains("READ_WAY") && err.contains(&format!("rank {src}")), "{err}");
    }
}

/// A follower times none of its reads of the class it follows: when its leader advises
/// eager for that class, it advises the leader the same; not for a class it does not
/// follow, nor to a higher rank, and only once.
#[test]
fn a_follower_advises_its_leader_as_it_was_advised() {
    let mut v = super::super::testkit::job(2, Config::default());
    let (mut b, mut a) = (v.pop().expect("b"), v.pop().expect("a"));
    if !b.st.threshold.adaptive() {
        return;
    }
    let eager_below = |bytes: u32| ctl_body(Control::EagerBelow { bytes });
    let queued = |e: &Engine| e.st.outbox.ctl().len();
    b.st.on_control(0, &eager_below(128 << 10)).expect("advice");
    assert_eq!((b.st.threshold.rndv_from(0), b.st.threshold.advised(0), queued(&b)), (128 << 10, 0, 0), "the 64 KiB class is not followed");
    b.st.on_control(0, &ctl_body(Control::ReadWay { class: 18, way: 0 })).expect("from the lower rank");
    b.st.on_control(0, &eager_below(512 << 10)).expect("advice");
    assert_eq!((b.st.threshold.rndv_from(0), b.st.threshold.advised(0), queued(&b)), (512 << 10, 512 << 10, 1), "advised back");
    b.st.on_control(0, &eager_below(512 << 10)).expect("advice");
    assert_eq!(queued(&b), 1, "once");
    a.st.on_control(1, &eager_below(512 << 10)).expect("advice");
    assert_eq!((a.st.threshold.rndv_from(1), a.st.threshold.advised(1), queued(&a)), (512 << 10, 0, 0), "a leader does not follow");
}

/// A pre-granted rendezvous whose sender abandons it (its scope unwinds) before the
/// receive is posted: the sender revokes the grant and waits for the answer (the receive
/// might never come: it must not wait for a FIN), and a receive posted afterwards asks
/// for the data and is refused, never copying memory the sender may have reused.
#[test]
fn an_abandoned_pregranted_send_is_revoked_before_its_buffer_goes() {
    if crate::sys::usable_cpus() < 2 {
        return;
    }
    let mut v = super::super::testkit::job(2, Config::default());
    let (mut b, mut a) = (v.pop().expect("b"), v.pop().expect("a"));
    let n = 64 << 10;
    let data = vec![9u8; n];
    let s = send(&mut a, 1, 3, &data, false).expect("a rendezvous is pending");
    assert!(a.st.rndv_send_ref(s).is_some_and(|r| r.pregranted));
    // The receiver takes the request in, unexpected, then keeps making progress (as a rank
    // blocked in some other call does) while the sender abandons.
    b.progress().expect("progress");
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stop2 = stop.clone();
    let peer = std::thread::spawn(move || {
        while !stop2.load(std::sync::atomic::Ordering::Relaxed) {
            b.progress().expect("progress");
            std::thread::yield_now();
        }
        b
    });
    a.abandon(s);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut b = peer.join().expect("peer thread");
    drop(data);
    assert!(b.st.ux.keys().all(|k| b.st.ux.get(k).and_then(|u| u.rndv.as_ref()).is_none_or(|i| !i.pregranted)));
    // Posted now: it asks, the sender refuses.
    let mut buf = vec![0u8; n];
    let r = recv(&mut b, Some(0), Some(3), &mut buf);
    settle(&mut [&mut a, &mut b]);
    assert!(matches!(b.take_if_done(r), Some(Err(Error::RemoteAccess { .. }))));
    assert!(buf.iter().all(|&x| x == 0), "nothing copied");
    assert_eq!(b.st.stats.pregranted, 0);
}

/// A revoke that finds a pre-granted copy queued but not run yet fails it, and answers.
#[test]
fn a_revoke_stops_a_copy_not_yet_run() {
    // Below CMA_SHARE_MIN: the reader copies it all, nothing asked of the sender.
    let n = 24 << 10;
    let Some((mut a, mut b)) = taught_pair(n) else { return };
    let (a, b) = (&mut a, &mut b);
    let data = vec![9u8; n];
    let mut buf = vec![0u8; n];
    let r = recv(b, Some(0), Some(3), &mut buf);
    let s = send(a, 1, 3, &data, false).expect("a rendezvous is pending");
    b.progress().expect("progress");
    assert_eq!(b.st.outbox.reads().len(), 1, "queued to copy at once");
    // (As `on_packet` does after a control message: the TM-SRQ's completions are taken.)
    b.st.on_revoke(0, wire_name(s));
    b.st.settle_cq().expect("completions");
    assert!(b.st.reads.is_empty());
    let (_, c) = b.st.outbox.ctl().back().expect("an answer");
    assert_eq!(Control::decode(&c.bytes[1..c.len as usize]).expect("control"), Control::RevokeAck { name: wire_name(s) });
    // The answer releases the sender's wait; the receive (offloaded: its failure is a
    // TM-SRQ completion) fails.
    settle(&mut [&mut *a, &mut *b]);
    assert!(matches!(b.take_if_done(r), Some(Err(_))));
    assert!(buf.iter().all(|&x| x == 0), "nothing copied");
    assert!(a.st.rndv_send_ref(s).is_some_and(|r| r.granted.is_none()));
}

/// A rendezvous from the sender's shared heap below 256 KiB goes out pre-granted: the first
/// is asked for (its grant names the heap, which the reader maps), later ones are copied
/// at once by address; a revoke stops such a copy not yet run, and nothing is copied.
#[test]
fn heap_sends_are_pregranted_once_the_reader_maps_the_heap() {
    // Below HEAP_PREGRANT_MAX, and a rendezvous on any number of CPUs.
    let n = 250_000;
    let mut v = super::super::testkit::job(2, Config { rndv_threshold: Some(16 << 10), ..Config::default() });
    let (mut b, mut a) = (v.pop().expect("b"), v.pop().expect("a"));
    let (a, b) = (&mut a, &mut b);
    let Some(heap) = a.shared_heap() else {
        eprintln!("no shared heap here");
        return;
    };
    let mut block = heap.alloc(n, 64).expect("a block");
    block.as_bytes_mut().iter_mut().enumerate().for_each(|(i, x)| *x = (i % 253) as u8);
    for round in 0..2 {
        let mut buf = vec![0u8; n];
        let r = recv(b, Some(0), Some(3), &mut buf);
        let s = send(a, 1, 3, block.as_bytes(), false).expect("a rendezvous is pending");
        settle(&mut [&mut *a, &mut *b]);
        assert_eq!(b.take_if_done(r).expect("received").expect("ok").len(), n);
        assert!(a.take_if_done(s).expect("FIN").is_ok());
        assert!(buf == block.as_bytes(), "round {round}: the data arrived intact");
        if b.st.ways.heaps.fallbacks > 0 {
            eprintln!("this process cannot map its own heap through /proc: nothing more to test");
            return;
        }
        assert_eq!((b.st.stats.pregranted, a.st.ways.heaps.grants_served), (round, 1), "round {round}");
    }
    let mut buf = vec![0u8; n];
    let r = recv(b, Some(0), Some(4), &mut buf);
    let s = send(a, 1, 4, block.as_bytes(), false).expect("a rendezvous is pending");
    b.progress().expect("progress");
    assert_eq!((b.st.outbox.reads().len(), b.st.ways.heaps.grants.len()), (1, 1), "queued to copy at once");
    b.st.on_revoke(0, wire_name(s));
    b.st.settle_cq().expect("completions");
    assert!(b.st.reads.is_empty());
    settle(&mut [&mut *a, &mut *b]);
    assert!(matches!(b.take_if_done(r), Some(Err(_))));
    assert!(buf.iter().all(|&x| x == 0), "nothing copied");
    assert!(b.st.ways.heaps.grants.is_empty(), "the place was dropped with its read");
    drop(block);
}

/// A read pre-granted from the sender's heap into a buffer in the reader's heap asks the
/// sender for its share from `HEAP_SHARE_MIN`, naming the buffer's place in the reader's
/// heap, and copies its own part at once; the sender memcpys the rest into that heap.
#[test]
fn a_pregranted_heap_read_into_a_heap_is_shared_without_a_round_trip() {
    let n = 128 << 10;
    assert!((HEAP_SHARE_MIN..HEAP_PREGRANT_MAX).contains(&n));
    let mut v = super::super::testkit::job(2, Config { rndv_threshold: Some(16 << 10), ..Config::default() });
    let (mut b, mut a) = (v.pop().expect("b"), v.pop().expect("a"));
    let (a, b) = (&mut a, &mut b);
    let (Some(ha), Some(hb)) = (a.shared_heap(), b.shared_heap()) else {
        eprintln!("no shared heap here");
        return;
    };
    let mut block = ha.alloc(n, 64).expect("a block");
    block.as_bytes_mut().iter_mut().enumerate().for_each(|(i, x)| *x = (i % 251) as u8);
    let mut dst = hb.alloc(n, 64).expect("a block");
    let at = dst.as_bytes().as_ptr() as u64;
    for round in 0..2 {
        dst.as_bytes_mut().fill(0);
        let r = recv(b, Some(0), Some(3), dst.as_bytes_mut());
        let s = send(a, 1, 3, block.as_bytes(), false).expect("a rendezvous is pending");
        if round == 1 {
            // Take the request in, but keep what the receiver sends.
            let st = &mut b.st;
            b.fabric.poll(|p| st.on_packet(p)).expect("poll");
            let k = b.st.outbox.reads().front().copied().expect("queued to copy at once");
            assert_eq!(b.st.reads.get(k).map(|op| (op.split(), op.remote_write())), Some((share_split(n), true)));
            let Rma::ReadReq(q) = last_rma(b) else { panic!("a share request") };
            assert_eq!(q.mode, ReadMode::Share { dst: at });
            assert!(q.dst_heap.is_some(), "the request names the buffer's place in the reader's heap");
        }
        settle(&mut [&mut *a, &mut *b]);
        assert_eq!(b.take_if_done(r).expect("received").expect("ok").len(), n);
        assert!(a.take_if_done(s).expect("FIN").is_ok());
        assert!(dst.as_bytes() == block.as_bytes(), "round {round}: the data arrived intact");
        if a.st.ways.heaps.fallbacks + b.st.ways.heaps.fallbacks > 0 {
            eprintln!("this process cannot map its own heap through /proc: nothing more to test");
            return;
        }
    }
    assert_eq!((b.st.stats.pregranted, b.st.stats.pregranted_splits), (1, 1));
    assert_eq!(a.st.ways.heaps.bytes as usize, n - share_split(n), "the sender wrote its share into the heap");
    assert_eq!(b.st.ways.heaps.bytes as usize, n + share_split(n), "the reader copied the first read whole, then its part");
}

/// The control messages `e` has queued, decoded (RMA packets skipped).
fn queued_controls(e: &Engine) -> Vec<Control> {
    e.st.outbox
        .ctl()
        .iter()
        .filter(|(_, c)| c.flags & PKT_RMA == 0)
        .filter_map(|(_, c)| Control::decode(&c.bytes[1..c.len as usize]).ok())
        .collect()
}

/// A revoke of a send announced with a fabric key: an unexpected request of it loses the key
/// (a later match asks for the data, which the sender refuses) and the answer goes at once;
/// an `fi_read` of it that is out owes the answer until the read ends, after its FIN.
#[test]
fn a_revoke_drops_an_unexpected_fabric_key_and_waits_for_a_read_out() {
    let (mut e, _peer) = engine();
    let n = 4096;
    let info = |name: u32| RndvInfo {
        tmh: Tmh { op: TmOp::Rndv, app_ctx: name, tag: super::super::testkit::key(1, 5) },
        rvh: Rvh { va: 0x1000, rkey: 1, len: n as u32 },
        key: 1,
        len: n,
        pregranted: false,
        fabric: Some(FabricKey { key: 5, addr: 0x1000 }),
    };
    let ux = UxMsg { src_world: 1, tag64: 9, total: n, data: Vec::new(), complete: false, ack: None, rndv: Some(info(11)) };
    let ux = e.st.ux.insert(ux);
    e.st.on_revoke(1, 11);
    assert!(e.st.ux.get(ux).and_then(|u| u.rndv).is_some_and(|i| i.fabric.is_none()), "the key is dropped");
    assert_eq!(queued_controls(&e).last(), Some(&Control::RevokeAck { name: 11 }));
    // A read of send 12 by `fi_read`, out.
    let mut buf = vec![0u8; n];
    let r = recv(&mut e, Some(1), Some(5), &mut buf);
    let k = e.st.reads.vacant_key();
    e.st.start_read(r, 1, info(12), None).expect("read");
    e.st.reads.get_mut(k).expect("the read").phase = ReadPhase::Fabric { ack_owed: false };
    e.st.on_revoke(1, 12);
    assert_eq!(e.st.reads.get(k).map(|op| op.phase), Some(ReadPhase::Fabric { ack_owed: true }));
    assert!(!queued_controls(&e).contains(&Control::RevokeAck { name: 12 }), "no answer while the read is out");
    e.st.read_progress(k, n).expect("the read ends");
    let ctl = e.st.outbox.ctl();
    let at = |want: &dyn Fn(&[u8]) -> bool| ctl.iter().position(|(_, c)| c.flags & PKT_RMA == 0 && want(&c.bytes[..c.len as usize]));
    let fin = at(&|b| Tmh::decode(b).is_ok_and(|t| t.op == TmOp::Fin && t.app_ctx == 12));
    let ack = at(&|b| Control::decode(&b[1..]).is_ok_and(|c| c == Control::RevokeAck { name: 12 }));
    assert!(fin.is_some() && ack.is_some() && fin < ack, "the FIN, then the answer: {fin:?} {ack:?}");
    assert!(e.take_if_done(r).expect("received").is_ok());
}

/// A pre-granted read alone in flight from `CMA_SHARE_MIN` asks the sender for its share
/// (the end of the read) and copies the start at once; the sender writes its share only
/// for a send pre-granted to that reader. Smaller reads, and reads behind others, ask
/// nothing.
#[test]
fn a_lone_pregranted_read_asks_the_sender_for_its_share() {
    for (n, shared) in [(24 << 10, false), (32 << 10, true), (64 << 10, true), (100_000, true), (256 << 10, true)] {
        let Some((mut a, mut b)) = taught_pair(n) else { return };
        let (a, b) = (&mut a, &mut b);
        let data: Vec<u8> = (0..n).map(|i| (i * 7 % 251) as u8).collect();
        let mut buf = vec![0u8; n];
        let r = recv(b, Some(0), Some(3), &mut buf);
        let s = send(a, 1, 3, &data, false).expect("a rendezvous is pending");
        let va = match a.st.rndv_send_ref(s) {
            Some(r) => r.va,
            _ => panic!("no rendezvous send"),
        };
        // Take the request in, but keep what the receiver sends (as `flush_ctl` would).
        let st = &mut b.st;
        b.fabric.poll(|p| st.on_packet(p)).expect("poll");
        let k = b.st.outbox.reads().front().copied().expect("queued to copy at once");
        let split = b.st.reads.get(k).map(|op| op.split()).expect("the read");
        if !shared {
            assert_eq!(split, n);
            assert!(b.st.outbox.ctl().iter().all(|(_, c)| c.flags & PKT_RMA == 0), "nothing asked");
        } else {
            assert_eq!(split, share_split(n));
            assert!(split > n / 2 && split < n && split % 4096 == 0, "{split} of {n}");
            let Rma::ReadReq(q) = last_rma(b) else { panic!("a share request") };
            assert_eq!(q.mode, ReadMode::Share { dst: buf.as_ptr() as u64 });
            assert_eq!((q.va, q.len), (va + split as u64, (n - split) as u64));
            assert_eq!(q.send, wire_name(s));
            // Served: the share is queued to write at its offset in the read.
            let before = a.st.outbox.ctl().len();
            a.st.serve_read(1, q);
            assert_eq!(a.st.outbox.ctl().len(), before, "no grant, no refusal");
            let w = a.st.outbox.writes().back().expect("the share queued");
            assert_eq!((w.base, w.buf.len(), w.dst), (split, n - split, buf.as_ptr() as u64));
            a.st.outbox.writes_mut().pop_back();
            // The same request for a send not pre-granted to this reader is refused.
            if let Some(r) = a.st.rndv_send(Some(s)) {
                r.granted = None;
            }
            a.st.serve_read(1, q);
            assert_eq!(last_rma(a), Rma::ReadErr { read: q.read });
            assert!(a.st.outbox.writes().is_empty());
            a.st.outbox.ctl_mut().pop_back();
            if let Some(r) = a.st.rndv_send(Some(s)) {
                r.granted = Some(1);
            }
        }
        // Driven to the end: the message arrives whole (the share is streamed here, as
        // ranks that are threads of one process cannot write into each other).
        settle(&mut [&mut *a, &mut *b]);
        assert!(b.take_if_done(r).expect("received").is_ok());
        assert!(a.take_if_done(s).expect("sent").is_ok());
        assert!(buf == data, "{n} bytes arrive whole");
        assert_eq!(b.st.stats.cma_bytes as usize, split, "the receiver copied its part only");
    }
}

/// A revoke that finds a pre-granted copy whose share was asked for waits for the read
/// (the sender writes its share or refuses it, and holds its buffer until the answer):
/// the answer goes after the FIN, and the message arrives whole.
#[test]
fn a_revoke_of_a_shared_copy_is_answered_after_its_fin() {
    let n = 64 << 10;
    let Some((mut a, mut b)) = taught_pair(n) else { return };
    let (a, b) = (&mut a, &mut b);
    let data: Vec<u8> = (0..n).map(|i| (i % 253) as u8).collect();
    let mut buf = vec![0u8; n];
    let r = recv(b, Some(0), Some(3), &mut buf);
    let s = send(a, 1, 3, &data, false).expect("a rendezvous is pending");
    b.progress().expect("progress");
    assert_eq!(b.st.outbox.reads().len(), 1, "queued to copy at once");
    b.st.on_revoke(0, wire_name(s));
    b.st.settle_cq().expect("completions");
    assert_eq!(b.st.reads.len(), 1, "the read goes on");
    assert!(!queued_controls(b).contains(&Control::RevokeAck { name: wire_name(s) }), "no answer yet");
    // The receiver copies its part and the sender's share completes the read; what the
    // receiver sends meanwhile stays queued, to be looked at.
    for _ in 0..10_000 {
        if b.st.reads.is_empty() {
            break;
        }
        a.progress().expect("progress");
        b.run_cma().expect("copy");
        let st = &mut b.st;
        b.fabric.poll(|p| st.on_packet(p)).expect("poll");
        b.st.settle_cq().expect("completions");
    }
    assert!(b.st.reads.is_empty(), "the read ended");
    let queued: Vec<(bool, Option<Control>)> =
        b.st.outbox.ctl().iter().map(|(_, c)| (c.flags & PKT_RMA == 0, Control::decode(&c.bytes[1..c.len as usize]).ok())).collect();
    let ack = queued.iter().position(|(_, c)| *c == Some(Control::RevokeAck { name: wire_name(s) })).expect("answered");
    assert_eq!(ack, queued.len() - 1, "the answer goes last: {queued:?}");
    let fin =
        b.st.outbox
            .ctl()
            .iter()
            .position(|(_, c)| c.flags & PKT_RMA == 0 && Tmh::decode(&c.bytes[..c.len as usize]).is_ok_and(|t| t.op == TmOp::Fin));
    assert!(fin.is_some_and(|f| f < ack), "after the FIN: {queued:?}");
    settle(&mut [&mut *a, &mut *b]);
    assert!(b.take_if_done(r).expect("received").is_ok());
    assert!(a.take_if_done(s).expect("sent").is_ok());
    assert!(buf == data);
}

/// A sender that departs after a receiver asked for its share, without writing it: the
/// receiver's wait ends with `PeerGone`, it does not wait for the share for ever.
/// A pre-granted read behind others (a window) asks its target for a share too, unless
/// that target has lately been reading from this rank (a FIN came): then both cores have
/// their own copies to make, and the reader copies it all.
#[test]
fn a_window_shares_with_a_target_that_is_not_reading_from_us() {
    let n = 32 << 10;
    let Some((mut a, mut b)) = taught_pair(n) else { return };
    let (a, b) = (&mut a, &mut b);
    let data = [vec![3u8; n], vec![4u8; n]];
    for round in 0..2u32 {
        if round == 1 {
            // `b` sends `a` a rendezvous; `a` reads it and its FIN comes back.
            let (back, mut into) = (vec![5u8; n], vec![0u8; n]);
            let r = recv(a, Some(1), Some(99), &mut into);
            let s = send(b, 0, 99, &back, false).expect("a rendezvous");
            settle(&mut [&mut *a, &mut *b]);
            assert!(a.take_if_done(r).expect("received").is_ok() && b.take_if_done(s).expect("sent").is_ok());
            assert!(b.st.peer_reading(0));
        }
        let mut bufs = vec![vec![0u8; n]; 2];
        let rs: Vec<ReqId> = bufs.iter_mut().enumerate().map(|(m, buf)| recv(b, Some(0), Some(10 * round + m as u32), buf)).collect();
        let ss: Vec<ReqId> = data.iter().enumerate().map(|(m, d)| send(a, 1, 10 * round + m as u32, d, false).expect("rndv")).collect();
        for _ in 0..1000 {
            if b.st.outbox.reads().len() == 2 {
                break;
            }
            a.progress().expect("progress");
            let st = &mut b.st;
            b.fabric.poll(|p| st.on_packet(p)).expect("poll");
            b.st.settle_cq().expect("completions");
        }
        let splits: Vec<usize> = b.st.outbox.reads().iter().map(|&k| b.st.reads.get(k).expect("read").split()).collect();
        let want = if round == 0 { [share_split(n); 2] } else { [share_split(n), n] };
        assert_eq!(splits, want, "round {round}: the lone read shares; the second only while `a` is not reading");
        settle(&mut [&mut *a, &mut *b]);
        for (m, (r, s)) in rs.into_iter().zip(ss).enumerate() {
            assert!(b.take_if_done(r).expect("received").is_ok() && a.take_if_done(s).expect("sent").is_ok());
            assert!(bufs[m] == data[m], "round {round}: message {m} arrives whole");
        }
    }
}

/// Pre-granted reads queued together from one rank are copied with one system call; when
/// that call stops at a bad range, each read is copied alone, and only the bad one fails.
#[test]
fn reads_queued_together_share_one_system_call() {
    let k = 6;
    for (n, bad) in [(16 << 10, None), (16 << 10, Some(2)), (128 << 10, None), (128 << 10, Some(4))] {
        let Some((mut a, mut b)) = taught_pair(n) else { return };
        let (a, b) = (&mut a, &mut b);
        let data: Vec<Vec<u8>> = (0..k).map(|m| (0..n).map(|i| ((i + 31 * m) % 249) as u8).collect()).collect();
        let mut bufs = vec![vec![0u8; n]; k];
        let rs: Vec<ReqId> = bufs.iter_mut().enumerate().map(|(m, buf)| recv(b, Some(0), Some(m as u32), buf)).collect();
        let ss: Vec<ReqId> = data.iter().enumerate().map(|(m, d)| send(a, 1, m as u32, d, false).expect("a rendezvous")).collect();
        for _ in 0..1000 {
            if b.st.outbox.reads().len() == k {
                break;
            }
            a.progress().expect("progress");
            let st = &mut b.st;
            b.fabric.poll(|p| st.on_packet(p)).expect("poll");
            b.st.settle_cq().expect("completions");
        }
        assert_eq!(b.st.outbox.reads().len(), k, "all queued to copy at once");
        if let Some(m) = bad {
            let key = b.st.outbox.reads()[m];
            b.st.reads.get_mut(key).expect("the read").info.rvh.va = 8;
        }
        b.run_cma().expect("copy");
        assert!(b.st.outbox.reads().is_empty());
        let batched = if bad.is_some() { 0 } else { k as u64 };
        assert_eq!((b.st.stats.cma_batched, b.st.stats.cma_reads), (batched, k as u64 - u64::from(bad.is_some())));
        for _ in 0..100 {
            a.progress().expect("progress");
            b.progress().expect("progress");
        }
        for (m, r) in rs.into_iter().enumerate() {
            let got = b.take_if_done(r).expect("done");
            if bad == Some(m) {
                assert!(got.is_err(), "the bad read fails");
            } else {
                assert!(got.is_ok() && bufs[m] == data[m], "message {m} arrives whole");
                assert!(a.take_if_done(ss[m]).expect("sent").is_ok());
            }
        }
    }
}

#[test]
fn a_share_whose_sender_departs_ends_the_wait() {
    let n = 64 << 10;
    let Some((mut a, mut b)) = taught_pair(n) else { return };
    let data = vec![3u8; n];
    let mut buf = vec![0u8; n];
    let r = recv(&mut b, Some(0), Some(3), &mut buf);
    let _s = send(&mut a, 1, 3, &data, false).expect("a rendezvous is pending");
    b.progress().expect("progress");
    assert_eq!(b.st.stats.pregranted_splits, 1, "the share was asked for");
    // The sender leaves without ever looking at the request.
    a.fabric.mark_finalized();
    match b.wait(r) {
        Err(Error::PeerGone { rank: 0 }) => {}
        other => panic!("{other:?}"),
    }
    drop(a);
}

/// The body of control message `c`, as `on_control` takes it.
fn ctl_body(c: Control) -> Vec<u8> {
    let mut b = [0u8; CONTROL_MAX_LEN];
    let n = c.encode(&mut b);
    b[1..n].to_vec()
}

/// A fixed `TMPI_RNDV_THRESHOLD`, or single copy off, keeps rendezvous where configured,
/// and a rank that cannot single-copy advises eager at once.
#[test]
fn fixed_thresholds_are_kept() {
    if crate::sys::usable_cpus() < 2 {
        eprintln!("one CPU: two ranks outnumber it, and rendezvous does not start low");
        return;
    }
    let v = super::super::testkit::job(2, Config { rndv_threshold: Some(100_000), ..Config::default() });
    assert!(v[0].st.threshold.starts().iter().all(|&t| t == 100_000));
    let v = super::super::testkit::job(2, Config { single_copy: false, ..Config::default() });
    assert!(v[0].st.threshold.starts().iter().all(|&t| t == crate::config::RNDV_AUTO));
    // A receiver whose kernel refused single copy, sent to by a sender that starts low.
    let mut v = super::super::testkit::job(2, Config::default());
    let (b, a) = (&mut v.pop().expect("b"), &mut v.pop().expect("a"));
    b.st.ways.cma = false;
    let n = 40_000;
    let data = vec![1u8; n];
    let mut buf = vec![0u8; n];
    let r = recv(b, Some(0), Some(1), &mut buf);
    let s = send(a, 1, 1, &data, false);
    settle(&mut [&mut *a, &mut *b]);
    assert!(b.take_if_done(r).expect("received").is_ok());
    assert!(s.is_none_or(|s| a.take_if_done(s).expect("sent").is_ok()));
    assert_eq!(a.st.threshold.rndv_from(1), 64 << 10, "advised at the first rendezvous");
}

/// Queued streamed reads of half the L3 or more go out one packet of each in turn, smaller
/// ones whole as they come to the front; every packet at its own offset, and a read
/// leaves the queue with its last packet.
#[test]
fn queued_streamed_reads_take_turns_packet_by_packet() {
    let (mut e, mut peer) = engine();
    let big = tmpi_transport::shm::streaming_copy_min();
    let src = vec![9u8; big + 3];
    // Two large reads and a small one queued behind them, then a small one that goes
    // out whole before the large one behind it.
    let lens = [big + 3, big, 10, 100 << 10, big];
    for (read, &len) in (1u64..).zip(&lens) {
        // SAFETY: `src` outlives the engine's use of it: the queue is drained below.
        let buf = unsafe { RawBuf::new(&src[..len]) };
        e.st.outbox.streams_mut().push_back(RmaOut { dest: 1, read, buf, off: 0, base: 0 });
    }
    let sent = e.push_streams().expect("push");
    assert!(e.st.outbox.streams().is_empty(), "all sent");
    let mut seen = Vec::new();
    while peer
        .poll(|p| {
            let Ok(Rma::ReadResp { read, offset, data }) = Rma::parse(p.data) else { panic!("a read response") };
            seen.push((read, offset, data.len()));
            true
        })
        .expect("poll")
        > 0
    {}
    assert_eq!(seen.len(), sent);
    let reads: Vec<u64> = seen.iter().map(|&(r, ..)| r).collect();
    let small = [4u64; 2];
    assert_eq!(&reads[..3], [1, 2, 3], "the large ones take turns");
    assert_eq!(&reads[3..3 + small.len()], small, "a small one goes out whole");
    assert_eq!(&reads[5..8], [5, 1, 2], "and the next large one joins the turns");
    for (read, &len) in (1u64..).zip(&lens) {
        let mut next = 0;
        for &(_, off, n) in seen.iter().filter(|&&(r, ..)| r == read) {
            assert_eq!(off, next, "read {read}'s packets in order, none lost");
            next += n as u64;
        }
        assert_eq!(next, len as u64);
    }
}

#[test]
fn a_rendezvous_is_read_through_typed_rma_packets() {
    // Streamed: read request, responses through the ring, FIN.
    let st = rendezvous(Config { single_copy: false, ..Config::default() }, 300_000);
    assert_eq!(st.cma_reads, 0);
    // Below `CMA_PREGRANT_MAX` the sender's request carries the grant: no read request
    // at all, but a share asked of the sender (streamed back, as ranks that are threads
    // of one process cannot write into each other with CMA).
    let st = rendezvous(Config { single_copy_min: Some(0), ..Config::default() }, 300_000);
    assert_eq!((st.cma_reads, st.pregranted, st.pregranted_splits), (1, 1, 1));
    assert_eq!(st.cma_bytes as usize, share_split(300_000), "the reader copied only its part");
    let at_64k = Config { rndv_threshold: Some(65536), ..Config::default() };
    let st = rendezvous(Config { single_copy_min: Some(0), ..at_64k.clone() }, 100_000);
    assert_eq!((st.cma_reads, st.pregranted), (1, 1));
    let st = rendezvous(Config { single_copy_min: Some(200_000), ..at_64k }, 100_000);
    assert_eq!((st.cma_reads, st.pregranted), (0, 0), "below TMPI_SINGLE_COPY_MIN: streamed, not pre-granted");
    // From it: read request, grant that splits the copy; the target's share (streamed
    // back) completes the read with it.
    let st = rendezvous(Config { single_copy_min: Some(0), ..Config::default() }, 2 << 20);
    assert_eq!((st.cma_reads, st.pregranted), (1, 0));
    assert!(st.cma_bytes < 2 << 20, "the reader copied only its share");
}

#[test]
fn a_malformed_or_stray_rma_packet_is_an_error_not_a_panic() {
    let (mut a, mut b) = pair();
    a.inject(1, PKT_RMA | PKT_WHOLE, 3, &[2, 0, 0]).expect("inject");
    match b.progress() {
        Err(Error::Protocol { rank: 0, .. }) => {}
        other => panic!("{other:?}"),
    }
    // Well formed, but for a read this rank never issued.
    let (mut a, mut b) = pair();
    let mut m = [0u8; RMA_MAX_LEN];
    let n = Rma::ReadResp { read: read_name(Key::new(3, 1)), offset: 0, data: &[] }.encode(&mut m).expect("encode");
    a.inject(1, PKT_RMA | PKT_WHOLE, n as u64, &m[..n]).expect("inject");
    assert!(b.progress().is_err());
}

#[test]
fn read_names_round_trip() {
    for k in [Key::new(0, 0), Key::new(5, 3), Key::new(u32::MAX, u32::MAX)] {
        assert_eq!(read_key(read_name(k)), k);
    }
}
