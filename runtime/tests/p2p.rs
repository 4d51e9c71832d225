//! Point-to-point semantics, run over both the in-process and the shared-memory fabric.
use tmpi::config::Config;
use tmpi::*;

/// Runs `f` on `n` ranks over the fabric named by the test module.
/// Where a test runs: fabric, and `TMPI_TM_MAX_TAGS` (None = default).
#[derive(Clone, Copy)]
struct Setup {
    shm: bool,
    tm_tags: Option<u32>,
    /// Rendezvous data by single copy (CMA) at every size (`Some(true)`), never
    /// (`Some(false)`), or per the defaults (`None`: chosen by measurement).
    cma: Option<bool>,
}

fn run<R: Send>(setup: Setup, n: usize, f: impl Fn(World) -> R + Sync) -> Vec<R> {
    // Sizes in these tests were chosen around a 64 KiB eager/rendezvous switch.
    let mut cfg = Config { poll_spin: Some(50), tm_thresh: 64, rndv_threshold: Some(65_536), eager_limit: 65_536, ..Config::default() };
    if let Some(t) = setup.tm_tags {
        cfg.tm_max_tags = t;
    }
    match setup.cma {
        Some(true) => cfg.single_copy_min = Some(0),
        Some(false) => cfg.single_copy = false,
        None => {}
    }
    if setup.shm {
        cfg.shm_ring_size = 16384;
        tmpi::run_shm_threads(n, cfg, f)
    } else {
        tmpi::run_local_with(n, cfg, f)
    }
}

/// Every test runs over both fabrics, with the soft TM-SRQ's tag list off, tiny and full, and
/// with rendezvous data by single copy always, never and by default.
macro_rules! every_setup {
    ($($name:ident),* $(,)?) => {
        mod local { $(#[test] fn $name() { super::$name(super::Setup { shm: false, tm_tags: None, cma: None }) })* }
        mod shm { $(#[test] fn $name() { super::$name(super::Setup { shm: true, tm_tags: None, cma: Some(true) }) })* }
        mod local_no_offload { $(#[test] fn $name() { super::$name(super::Setup { shm: false, tm_tags: Some(0), cma: Some(true) }) })* }
        mod local_tags1 { $(#[test] fn $name() { super::$name(super::Setup { shm: false, tm_tags: Some(1), cma: Some(false) }) })* }
        mod shm_tags4 { $(#[test] fn $name() { super::$name(super::Setup { shm: true, tm_tags: Some(4), cma: Some(false) }) })* }
    };
}

every_setup!(
    rendezvous_paths,
    abandoned_rendezvous,
    offload_is_used_for_source_specific_receives,
    pingpong_sizes,
    wildcard_order_and_errors,
    ssend_probe_recv_vec_sendrecv,
    nonblocking_scope,
    self_send_and_singleton,
    dup_split_isolation
);

/// CONFORMANCE.md: T6.
fn pingpong_sizes(shm: Setup) {
    run(shm, 2, |w| {
        for &n in &[0usize, 1, 8, 1000, 65536, 200_000, 1 << 20] {
            let peer = 1 - w.rank();
            let data: Vec<u8> = (0..n).map(|i| (i * 7 + n) as u8).collect();
            if w.rank() == 0 {
                w.send(&data, peer, 3).unwrap();
                let mut b = vec![0u8; n];
                let st = w.recv(&mut b, peer, 4).unwrap();
                assert_eq!(st.len(), n);
                assert_eq!(b, data);
            } else {
                let mut b = vec![0u8; n];
                let st = w.recv(&mut b, peer, 3).unwrap();
                assert_eq!((st.source(), st.tag(), st.len()), (0, 3, n));
                assert_eq!(b, data);
                w.send(&b, peer, 4).unwrap();
            }
        }
    });
}

fn wildcard_order_and_errors(shm: Setup) {
    run(shm, 4, |w| {
        if w.rank() == 0 {
            let mut next = [0u32; 4];
            for _ in 0..3 * 50 {
                let mut b = [0u32; 2];
                let st = w.recv(&mut b, ANY_SOURCE, ANY_TAG).unwrap();
                assert_eq!(b[0] as usize, st.source());
                assert_eq!(b[1], next[st.source()]);
                assert_eq!(st.tag(), b[1] % 5);
                next[st.source()] += 1;
            }
            w.barrier().unwrap();
            assert!(matches!(w.send(&[1u8], 9, 0), Err(Error::InvalidRank { rank: 9, .. })));
            assert!(matches!(w.send(&[1u8], 1, TAG_UB + 1), Err(Error::InvalidTag { .. })));
            let mut small = [0u8; 2];
            assert!(matches!(w.recv(&mut small, 1, 99), Err(Error::Truncated { len: 10, capacity: 2, .. })));
            let mut b = [0u8; 10];
            w.recv(&mut b, 1, 100).unwrap();
            assert_eq!(b, [5; 10]);
        } else {
            for i in 0..50u32 {
                w.send(&[w.rank() as u32, i], 0, i % 5).unwrap();
            }
            w.barrier().unwrap();
            if w.rank() == 1 {
                w.send(&[4u8; 10], 0, 99).unwrap();
                w.send(&[5u8; 10], 0, 100).unwrap();
            }
        }
    });
}

fn ssend_probe_recv_vec_sendrecv(shm: Setup) {
    run(shm, 3, |w| {
        let r = w.rank();
        if r == 0 {
            w.ssend(&[1u64, 2, 3], 1, 5).unwrap();
            w.ssend(&vec![9u16; 100_000], 2, 6).unwrap();
        } else if r == 1 {
            let st = w.probe(0, 5).unwrap();
            assert_eq!(st.len(), 24);
            let (v, st) = w.recv_vec::<u64>(0, ANY_TAG).unwrap();
            assert_eq!(v, vec![1, 2, 3]);
            assert_eq!(st.tag(), 5);
        } else {
            let (v, _) = w.recv_vec::<u16>(ANY_SOURCE, 6).unwrap();
            assert_eq!(v.len(), 100_000);
            assert!(w.iprobe(ANY_SOURCE, 6).unwrap().is_none());
        }
        let n = w.size();
        let mut got = [0usize];
        let st = w.sendrecv(&[r], (r + 1) % n, 1, &mut got, (r + n - 1) % n, 1).unwrap();
        assert_eq!(got[0], (r + n - 1) % n);
        assert_eq!(st.source(), got[0]);
    });
}

fn nonblocking_scope(shm: Setup) {
    run(shm, 2, |world| {
        let peer = (world.rank() + 1) % world.size();
        let (sbuf, mut rbuf) = (vec![world.rank() as u64; 1024], vec![0u64; 1024]);
        tmpi::scope(|s| -> tmpi::Result<()> {
            let r = world.irecv(s, &mut rbuf, tmpi::ANY_SOURCE, 7)?;
            let w = world.isend(s, &sbuf, peer, 7)?;
            w.wait()?;
            let st = r.wait()?;
            assert_eq!(st.count::<u64>(), 1024);
            Ok(())
        })
        .unwrap();
        assert_eq!(rbuf[0], peer as u64);
        // 64 in flight, big and small, some leaked
        let bufs: Vec<Vec<u8>> = (0..64).map(|i| vec![i as u8; i * 3000]).collect();
        let mut rb: Vec<Vec<u8>> = (0..64).map(|i| vec![0u8; i * 3000]).collect();
        tmpi::scope(|s| {
            let mut reqs = Vec::new();
            for (i, b) in rb.iter_mut().enumerate() {
                reqs.push(world.irecv(s, b, peer, i as u32).unwrap());
            }
            for (i, b) in bufs.iter().enumerate() {
                let r = world.isend(s, b, peer, i as u32).unwrap();
                if i % 2 == 0 {
                    // A leak is the same as a drop to the scope (the point of the test), and
                    // clippy knows a request owns nothing.
                    #[allow(clippy::forget_non_drop)]
                    std::mem::forget(r);
                } else {
                    drop(r)
                }
            }
            let mut n = 0;
            while !reqs.is_empty() {
                let (_, st) = tmpi::wait_any(&mut reqs).unwrap();
                assert_eq!(st.len(), st.tag() as usize * 3000);
                n += 1;
            }
            assert_eq!(n, 64);
        });
        for (i, b) in rb.iter().enumerate() {
            assert!(b.iter().all(|&x| x == i as u8));
        }
        // cancel
        let mut c = [0u8; 4];
        tmpi::scope(|s| {
            let mut r = world.irecv(s, &mut c, peer, 999).unwrap();
            assert!(r.test().unwrap().is_none());
            r.cancel().unwrap();
            assert!(r.wait().unwrap().cancelled());
        });
        world.barrier().unwrap();
    });
}

fn self_send_and_singleton(shm: Setup) {
    run(shm, 1, |w| {
        w.send(&[42u32], 0, 1).unwrap();
        let mut b = [0u32];
        w.recv(&mut b, 0, 1).unwrap();
        assert_eq!(b[0], 42);
        let mut s = [0u64];
        w.allreduce(&[5u64], &mut s, Op::Sum).unwrap();
        assert_eq!(s[0], 5);
    });
}

fn dup_split_isolation(shm: Setup) {
    run(shm, 4, |w| {
        let d = w.dup().unwrap();
        let r = w.rank();
        if r == 0 {
            d.send(&[1u8], 1, 0).unwrap();
            w.send(&[2u8], 1, 0).unwrap();
        } else if r == 1 {
            let mut b = [0u8];
            w.recv(&mut b, 0, 0).unwrap();
            assert_eq!(b[0], 2);
            d.recv(&mut b, 0, 0).unwrap();
            assert_eq!(b[0], 1);
        }
        let sp = w.split(Some((r % 2) as u32), -(r as i32)).unwrap().unwrap();
        assert_eq!(sp.size(), 2);
        let mut s = [0u64];
        sp.allreduce(&[r as u64], &mut s, Op::Sum).unwrap();
        assert_eq!(s[0], if r % 2 == 0 { 2 } else { 4 });
        assert_eq!(sp.rank(), if r >= 2 { 0 } else { 1 });
        assert!(w.split(None, 0).unwrap().is_none());
    });
}

fn offload_is_used_for_source_specific_receives(setup: Setup) {
    let lines = run(setup, 2, |w| {
        let peer = 1 - w.rank();
        let mut bufs = vec![vec![0u8; 4096]; 8];
        let mut any = vec![vec![0u8; 4096]; 2];
        tmpi::scope(|s| {
            let mut reqs = Vec::new();
            if w.rank() == 1 {
                for (i, b) in bufs.iter_mut().enumerate() {
                    reqs.push(w.irecv(s, b, peer, i as u32).unwrap());
                }
                for b in any.iter_mut() {
                    reqs.push(w.irecv(s, b, ANY_SOURCE, 100).unwrap());
                }
            }
            w.barrier().unwrap();
            if w.rank() == 0 {
                for i in 0..8u32 {
                    w.send(&vec![i as u8; 4096], peer, i).unwrap();
                }
                w.send(&[7u8; 4096], peer, 100).unwrap();
                w.send(&[8u8; 4096], peer, 100).unwrap();
            }
            for st in tmpi::wait_all(reqs).unwrap() {
                assert_eq!(st.len(), 4096);
            }
        });
        if w.rank() == 1 {
            for (i, b) in bufs.iter().enumerate() {
                assert!(b.iter().all(|&x| x == i as u8));
            }
            assert_eq!(any[0][0], 7);
            assert_eq!(any[1][0], 8);
        }
        w.stats_line()
    });
    let hw: u64 = lines[1].split_whitespace().find_map(|kv| kv.strip_prefix("hw_matched=")).unwrap().parse().unwrap();
    match setup.tm_tags {
        Some(0) => assert_eq!(hw, 0, "{}", lines[1]),
        // ANY_SOURCE receives are never offloaded: at most the 8 source-specific ones.
        Some(t) => assert_eq!(hw, u64::from(t.min(8)), "{}", lines[1]),
        None => assert_eq!(hw, 8, "{}", lines[1]),
    }
}

fn stat(line: &str, key: &str) -> u64 {
    line.split_whitespace()
        .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{key} missing in {line}"))
}

/// Rendezvous (64 KiB and up by default): expected (pre-posted, offloaded when allowed),
/// unexpected, truncated, through a too-small tagged buffer (RNDV_INCOMPLETE), synchronous,
/// and sent repeatedly from one buffer (registration cache hits).
/// A scope that unwinds while a rendezvous is in flight abandons it: the receive's buffer is
/// given back only once no peer can still write into it, the send's only once no reader can
/// still copy from it; both ranks go on, and later messages are intact.
fn abandoned_rendezvous(setup: Setup) {
    let n = 4 << 20;
    run(setup, 2, |w| {
        let peer = 1 - w.rank();
        let big: Vec<u8> = (0..n).map(|i| (i % 253) as u8).collect();
        for round in 0..2 {
            // Round 0: rank 0 abandons a receive; round 1: rank 1 abandons a send.
            let abandoner = round;
            if w.rank() == abandoner {
                let mut buf = if round == 0 { vec![0u8; n] } else { Vec::new() };
                let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    tmpi::scope(|s| {
                        let mut q = if round == 0 { w.irecv(s, &mut buf, peer, 7).unwrap() } else { w.isend(s, &big, peer, 7).unwrap() };
                        w.barrier().unwrap();
                        for _ in 0..50 {
                            if q.test().unwrap().is_some() {
                                break;
                            }
                        }
                        panic!("abandon round {round}");
                    })
                }));
                assert!(r.is_err());
                drop(buf);
            } else {
                let mut got = vec![0u8; n];
                let r = tmpi::scope(|s| {
                    let q = if round == 0 { w.isend(s, &big, peer, 7).unwrap() } else { w.irecv(s, &mut got, peer, 7).unwrap() };
                    w.barrier().unwrap();
                    q.wait()
                });
                match r {
                    // The reader either got every byte or was refused; never other memory.
                    Ok(_) if round == 1 => assert!(got == big, "round {round}: abandoned send delivered wrong bytes"),
                    Ok(_) => {}
                    Err(e) => assert!(round == 1 && matches!(e, Error::RemoteAccess { .. }), "round {round}: {e}"),
                }
            }
            // Both ranks go on: a later message of the same size arrives intact.
            let mut after = vec![0u8; n];
            tmpi::scope(|s| {
                let r = w.irecv(s, &mut after, peer, 8).unwrap();
                w.send(&big, peer, 8).unwrap();
                r.wait().unwrap();
            });
            assert!(after == big, "round {round}: message after the abandoned one");
        }
    });
}

/// CONFORMANCE.md: T52, T62.
fn rendezvous_paths(setup: Setup) {
    let lines = run(setup, 2, |w| {
        let big: Vec<u8> = (0..(1usize << 20) + 3).map(|i| (i % 251) as u8).collect();
        if w.rank() == 0 {
            rendezvous_sends(&w, &big);
        } else {
            rendezvous_receives(&w, &big);
        }
        w.stats_line()
    });
    assert!(stat(&lines[0], "rndv") >= 9, "{}", lines[0]);
    // mr_cache_hits is checked through tmpirun (one cache per process): engines sharing a
    // process share pages, which a userfaultfd monitor can watch for only one of them.
    assert!(stat(&lines[0], "mr_cache_hits") + stat(&lines[0], "mr_cache_misses") >= 5, "{}", lines[0]);
    if setup.tm_tags != Some(0) {
        assert!(stat(&lines[1], "hw_matched") >= 1, "{}", lines[1]);
        assert!(stat(&lines[1], "rndv_incomplete") >= 1, "{}", lines[1]);
    }
}

/// Rank 0 of [`rendezvous_paths`]: expected, unexpected, truncated (twice), synchronous and
/// repeated rendezvous sends of `big` or a part of it.
fn rendezvous_sends(w: &tmpi::Comm, big: &[u8]) {
    let peer = 1;
    w.barrier().unwrap(); // receiver has pre-posted
    w.send(big, peer, 1).unwrap();
    // Unexpected at the receiver, which posts only after the barrier; a blocking rendezvous
    // send would wait for that receive, so this one is non-blocking.
    tmpi::scope(|s| {
        let r = w.isend(s, big, peer, 2).unwrap();
        w.barrier().unwrap();
        r.wait().unwrap();
    });
    w.send(&big[..200_000], peer, 3).unwrap(); // truncated into 100 000 bytes
    w.send(&big[..300_000], peer, 4).unwrap(); // into a 4 KiB pre-posted buffer
    w.ssend(&big[..70_000], peer, 5).unwrap();
    for _ in 0..5 {
        w.send(big, peer, 6).unwrap();
    }
}

/// Rank 1 of [`rendezvous_paths`]: each message received and checked.
fn rendezvous_receives(w: &tmpi::Comm, big: &[u8]) {
    let peer = 0;
    let mut a = vec![0u8; big.len()];
    let mut small = vec![0u8; 4096];
    tmpi::scope(|s| {
        let r1 = w.irecv(s, &mut a, peer, 1).unwrap();
        let r4 = w.irecv(s, &mut small, peer, 4).unwrap();
        w.barrier().unwrap();
        assert_eq!(r1.wait().unwrap().len(), big.len());
        w.barrier().unwrap();
        let mut b = vec![0u8; big.len()];
        assert_eq!(w.recv(&mut b, peer, 2).unwrap().len(), big.len());
        assert_eq!(b, big);
        let mut c = vec![0u8; 100_000];
        match w.recv(&mut c, peer, 3) {
            Err(Error::Truncated { len: 200_000, capacity: 100_000, .. }) => {}
            other => panic!("expected truncation, got {other:?}"),
        }
        assert_eq!(&c[..], &big[..100_000]);
        match r4.wait() {
            Err(Error::Truncated { len: 300_000, capacity: 4096, .. }) => {}
            other => panic!("expected truncation, got {other:?}"),
        }
        let (v, st) = w.recv_vec::<u8>(peer, 5).unwrap();
        assert_eq!((v.len(), st.tag()), (70_000, 5));
        assert_eq!(&v[..], &big[..70_000]);
        for _ in 0..5 {
            let st = w.recv(&mut b, peer, 6).unwrap();
            assert_eq!(st.len(), big.len());
        }
    });
    assert_eq!(a, big);
    assert_eq!(&small[..], &big[..4096]);
}

/// Seven senders flood one receiver that takes messages with ANY_SOURCE: everything arrives,
/// in order per sender, and the receiver's unexpected buffering stays within its budget
/// (flow control: once a sender's eager credit is used up, it sends rendezvous requests,
/// which the receiver holds without their data).
#[test]
fn flood_is_flow_controlled() {
    let budget = 64 * 1024;
    let per_sender = 20_000u32;
    let cfg = Config { unexpected_max: budget, shm_ring_size: 1 << 16, poll_spin: Some(50), ..Config::default() };
    let lines = tmpi::run_shm_threads(8, cfg, |w| {
        if w.rank() == 0 {
            let mut next = [0u32; 8];
            // Rank 7 first: the others' messages pile up unexpected until the budget stops them.
            for i in 0..per_sender {
                let mut b = [0u32; 2];
                w.recv(&mut b, 7, 1).unwrap();
                assert_eq!(b, [7, i]);
            }
            next[7] = per_sender;
            for _ in 0..6 * per_sender {
                let mut b = [0u32; 2];
                let st = w.recv(&mut b, ANY_SOURCE, ANY_TAG).unwrap();
                assert_eq!(b[0] as usize, st.source());
                assert_eq!(b[1], next[st.source()], "per-sender order");
                next[st.source()] += 1;
            }
            assert!(next[1..].iter().all(|&n| n == per_sender));
        } else {
            for i in 0..per_sender {
                w.send(&[w.rank() as u32, i], 0, 1).unwrap();
            }
        }
        w.stats_line()
    });
    let peak = stat(&lines[0], "ux_peak_bytes");
    assert!(lines[1..7].iter().all(|l| stat(l, "credit_rndv") > 0), "{lines:?}");
    // The eager credit of all senders together is the budget; rendezvous requests held
    // unexpected add their bookkeeping (one per blocked sender).
    assert!(peak <= (budget + 2 * 1024) as u64, "{}", lines[0]);
}
