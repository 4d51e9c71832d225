//! Rendezvous reads over the OFI fabric ([`super::rma`]): a range registered through the
//! fabric's cache is `fi_read` by the peer, whole and at odd offsets, up to a few MiB; the
//! cache serves a second registration of the same buffer.

use std::time::{Duration, Instant};

use super::*;
use crate::mr::cache::{CacheConfig, Monitor};

fn pair() -> (OfiFabric, OfiFabric) {
    let cfg = OfiConfig { provider: Some("tcp".into()), node: Some("127.0.0.1".into()) };
    let (mut a, mut b) = pair_in_process(&cfg).expect("a pair of OFI fabrics on tcp");
    let cache = CacheConfig { max_count: 64, max_size: usize::MAX, monitor: Monitor::Userfaultfd };
    a.enable_reads(cache).expect("reads on a");
    b.enable_reads(cache).expect("reads on b");
    (a, b)
}

/// Reads `len` bytes at offset `off` of `src` (registered by `a`) into a fresh buffer of `b`.
fn read(a: &mut OfiFabric, b: &mut OfiFabric, src: &[u8], off: usize, len: usize) -> (Option<i32>, Vec<u8>) {
    let region = a.register_read(src.as_ptr() as usize, src.len()).expect("register");
    let (key, addr) = (region.key().expect("a key"), region.remote_addr(src.as_ptr() as usize + off).expect("inside"));
    let mut dst = vec![0xeeu8; len];
    // SAFETY: `dst` lives until the read's end is taken below.
    unsafe { b.post_read(0, dst.as_mut_ptr(), len, addr, key, 7) }.expect("post");
    let end = Instant::now() + Duration::from_secs(30);
    loop {
        a.poll(|_| true).expect("poll a");
        b.poll(|_| true).expect("poll b");
        if let Some(d) = b.take_reads_done().pop() {
            assert_eq!(d.user, 7);
            drop(region);
            return (d.error, dst);
        }
        assert!(Instant::now() < end, "the read of {len} bytes at {off} never completed");
    }
}

#[test]
fn reads_move_the_bytes_at_many_sizes_and_offsets() {
    let (mut a, mut b) = pair();
    let src: Vec<u8> = (0..(4 << 20) + 8).map(|i| (i * 7 + i / 251) as u8).collect();
    for (off, len) in [(0, 1), (3, 4095), (1, 65537), (0, 128 << 10), (5, 256 << 10), (0, 1 << 20), (7, 4 << 20)] {
        let (err, got) = read(&mut a, &mut b, &src, off, len);
        assert_eq!(err, None, "{len} at {off}");
        assert!(got == src[off..off + len], "{len} bytes at {off}: wrong data");
    }
    let s = a.read_cache_stats().expect("a cache");
    assert!(s.hits >= 6 && s.misses >= 1, "one buffer registered again hits the cache: {s:?}");
}
