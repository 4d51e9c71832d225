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
