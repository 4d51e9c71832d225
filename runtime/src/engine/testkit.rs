//! A fake fabric for the engine's unit tests: engines of one job in one thread, joined by the
//! in-process fabric, driven by hand so that every protocol stage can be watched step by step
//! (each packet still passes through the receiver's soft TM-SRQ, as in a real job).

use super::*;
use tmpi_transport::local::LocalFabric;

/// `n` engines of one job over the in-process fabric, with `cfg` (64 KiB packets).
pub(super) fn job(n: usize, cfg: Config) -> Vec<Engine> {
    LocalFabric::create(n, 64 << 10)
        .into_iter()
        .enumerate()
        .map(|(r, f)| Engine::new(AnyFabric::Local(f), r, n, cfg.clone()).expect("engine"))
        .collect()
}

/// Receives of at least this many bytes go to the TM-SRQ in [`pair`] (UCX's default; the
/// runtime's is larger, see `TMPI_TM_THRESH`): the tests watch offloaded receives of 4 KiB.
pub(super) const TEST_TM_THRESH: usize = 1024;

/// Two engines with the default configuration, but for a TM-SRQ threshold of
/// [`TEST_TM_THRESH`].
pub(super) fn pair() -> (Engine, Engine) {
    let mut v = job(2, Config { tm_thresh: TEST_TM_THRESH, ..Config::default() });
    let b = v.pop().expect("rank 1");
    let a = v.pop().expect("rank 0");
    (a, b)
}

/// Match key of a user message from `src` with `tag` on the world's user context.
pub(super) fn key(src: u32, tag: u32) -> u64 {
    matching::encode_tag(0, src, tag)
}

/// Starts a send of `data` from `e` to `dest`.
pub(super) fn send(e: &mut Engine, dest: usize, tag: u32, data: &[u8], sync: bool) -> Option<ReqId> {
    let src = e.rank() as u32;
    // SAFETY: every test keeps `data` alive until the send has completed (it waits on the
    // request, or the message went out eagerly and nothing refers to `data` any more).
    let raw = unsafe { RawBuf::new(data) };
    e.start_send(dest, key(src, tag), raw, sync).expect("send")
}

/// Posts a receive into `buf` on `e` from `src` (`None`: any source) with `tag`.
pub(super) fn recv(e: &mut Engine, src: Option<usize>, tag: Option<u32>, buf: &mut [u8]) -> ReqId {
    // SAFETY: every test keeps `buf` alive (and untouched) until the receive has completed.
    let raw = unsafe { RawBufMut::new(buf) };
    let from = match src {
        Some(s) => Peers::rank(s),
        None => Peers::any(None),
    };
    e.post_recv(0, src.map(|s| s as u32), tag, raw, from).expect("post")
}

/// Drives every engine until none makes progress (at most `rounds` rounds).
pub(super) fn settle(es: &mut [&mut Engine]) {
    for _ in 0..10_000 {
        let mut n = 0;
        for e in es.iter_mut() {
            n += e.progress().expect("progress");
        }
        if n == 0 {
            return;
        }
    }
    panic!("the engines did not settle");
}

/// Not a test: the CPU cost of the eager path in one thread, free of cross-core effects and
/// of the scheduler (the minimum over many windows), with offload on (the default) and off
/// (`TMPI_TM_MAX_TAGS=0`). Run it with
/// `cargo test --release -p tmpi --lib window_cost -- --ignored --nocapture` to compare two
/// versions of the engine; it asserts nothing about time.
#[test]
#[ignore = "a measurement, run by hand"]
fn window_cost() {
    for (what, tags) in [("offload on", Config::default().tm_max_tags), ("offload off", 0)] {
        let cfg = Config { tm_max_tags: tags, ..Config::default() };
        let [post, arrive] = window_cost_with(cfg);
        println!("window_cost ({what}): post+send {post:.1} ns/msg, arrive+complete {arrive:.1} ns/msg (best of 3900 windows of 64)");
    }
}

fn window_cost_with(cfg: Config) -> [f64; 2] {
    const W: usize = 64;
    let name = format!("tmpi-window-cost-{}", std::process::id());
    let fa = tmpi_transport::shm::ShmFabric::create(&name, 0, 2, cfg.ring_size_for(2)).expect("segment");
    let fb = tmpi_transport::shm::ShmFabric::open(&name, 1, 2).expect("segment");
    fa.unlink().expect("unlink");
    let mut a = Engine::new(AnyFabric::Shm(fa), 0, 2, cfg.clone()).expect("engine");
    let mut b = Engine::new(AnyFabric::Shm(fb), 1, 2, cfg).expect("engine");
    let payload = [7u8; 8];
    let mut bufs = vec![[0u8; 8]; W];
    let mut best = [f64::MAX; 2];
    for round in 0..4000 {
        let t0 = std::time::Instant::now();
        let rids: Vec<ReqId> = bufs.iter_mut().map(|bf| recv(&mut b, Some(0), Some(1), bf)).collect();
        for _ in 0..W {
            assert!(send(&mut a, 1, 1, &payload, false).is_none());
        }
        let t1 = std::time::Instant::now();
        for r in rids {
            b.wait(r).expect("received");
        }
        a.progress().expect("credit back");
        let t2 = std::time::Instant::now();
        if round >= 100 {
            best[0] = best[0].min((t1 - t0).as_nanos() as f64 / W as f64);
            best[1] = best[1].min((t2 - t1).as_nanos() as f64 / W as f64);
        }
    }
    best
}

/// Not a test: the CPU cost of one hop of a blocking ping-pong (post a receive, send, the
/// peer's wait completes it), both engines in one thread over a real shm segment; the minimum
/// over many rounds. Run by hand as `window_cost`.
#[test]
#[ignore = "a measurement, run by hand"]
fn pingpong_cost() {
    let cfg = Config::default();
    let name = format!("tmpi-pingpong-cost-{}", std::process::id());
    let fa = tmpi_transport::shm::ShmFabric::create(&name, 0, 2, cfg.ring_size_for(2)).expect("segment");
    let fb = tmpi_transport::shm::ShmFabric::open(&name, 1, 2).expect("segment");
    fa.unlink().expect("unlink");
    let mut e =
        [Engine::new(AnyFabric::Shm(fa), 0, 2, cfg.clone()).expect("engine"), Engine::new(AnyFabric::Shm(fb), 1, 2, cfg).expect("engine")];
    let payload = [7u8; 8];
    let mut bufs = [[0u8; 8]; 2];
    let mut best = f64::MAX;
    for round in 0..20_000 {
        let t0 = std::time::Instant::now();
        for hop in 0..64 {
            let (to, from) = (1 - hop % 2, hop % 2);
            let [a, b] = &mut e;
            let (tx, rx) = if from == 0 { (a, b) } else { (b, a) };
            let r = recv(rx, Some(from), Some(1), &mut bufs[to]);
            assert!(send(tx, to, 1, &payload, false).is_none());
            rx.wait(r).expect("received");
        }
        if round >= 100 {
            best = best.min(t0.elapsed().as_nanos() as f64 / 64.0);
        }
    }
    println!("pingpong_cost: {best:.1} ns per hop (post + send + wait; best of 19900 rounds of 64 hops)");
}
