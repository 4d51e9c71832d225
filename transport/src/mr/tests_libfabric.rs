//! libfabric's fabtests MR unit tests replayed against the fi_mr model, reproduced from reading
//! them (no code taken): `fabtests/unit/mr_test.c` (`mr_reg`, `mr_regv`, `mr_regattr`,
//! `mr_reg_free_then_alloc`) and the cache eviction test `fabtests/unit/mr_cache_evict.c`
//! (its `mmap` allocator).
//!
//! What the fabtests do, and how it maps here:
//! - `mr_test.c` asks `fi_getinfo` for every `mr_mode` bit except `FI_MR_BASIC`,
//!   `FI_MR_SCALABLE` and `FI_MR_LOCAL`, and for `FI_MSG | FI_RMA`, so the access it registers
//!   with is `SEND | RECV | READ | WRITE | REMOTE_READ | REMOTE_WRITE`
//!   (`ft_info_to_mr_access`). Each test passes when every registration returns 0 and every
//!   `fi_close` returns 0. Here the domain is opened with those bits (the model clears
//!   `FI_MR_HMEM` and `FI_MR_COLLECTIVE`, which it does not need), and once more with no bit,
//!   where the requested key `FT_MR_KEY` is used as is, so a close that did not release the
//!   key would fail the next registration with `-FI_ENOKEY`.
//! - `mr_cache_evict.c` registers a buffer twice (the second should hit the provider's cache,
//!   which it detects by timing), frees it without closing the registrations, allocates
//!   again at the same address, and registers a third time: that one must not be served by
//!   the stale entry (timing again). The model counts hits and misses, so the test checks them
//!   directly instead of timing. Its `brk`/`sbrk` allocators are not replayed (moving the
//!   program break under Rust's allocator would corrupt the heap), nor CUDA/ROCr (no device
//!   memory in the model: `-FI_ENOSYS`).

use super::cache::page_size;
use super::cache::testmem::Mapping;
use super::*;

/// `FT_MR_KEY`.
const FT_MR_KEY: u64 = 0xC0DE;

/// The access `ft_info_to_mr_access` gives for `FI_MSG | FI_RMA`.
fn mr_access() -> Access {
    Access::SEND | Access::RECV | Access::READ | Access::WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE
}

/// The two domains each test runs in: the mode bits `mr_test.c` offers (all but BASIC,
/// SCALABLE and LOCAL, after the model cleared what it does not need), and none.
fn domains() -> Vec<Domain> {
    let offered = MrMode::RAW
        | MrMode::VIRT_ADDR
        | MrMode::ALLOCATED
        | MrMode::PROV_KEY
        | MrMode::MMU_NOTIFY
        | MrMode::RMA_EVENT
        | MrMode::ENDPOINT
        | MrMode::HMEM
        | MrMode::COLLECTIVE;
    let all = Domain::open(DomainAttr { mr_mode: offered, ..DomainAttr::default() }).unwrap();
    assert_eq!(all.cleared_mode(), MrMode::HMEM | MrMode::COLLECTIVE);
    vec![all, Domain::open(DomainAttr::default()).unwrap()]
}

/// fabtests' `test_size` list, up to what the tests register here.
fn test_sizes() -> Vec<usize> {
    (0..=20).map(|i| 1usize << i).collect()
}

/// Every combination of the bits of `access` (`ft_alloc_bit_combo(0, access)`).
fn bit_combos(access: Access) -> Vec<Access> {
    let bits: Vec<u64> = (0..64).map(|i| 1u64 << i).filter(|b| access.bits() & b != 0).collect();
    (0..1u64 << bits.len())
        .map(|m| Access::from_bits_retain(bits.iter().enumerate().filter(|(i, _)| m >> i & 1 == 1).map(|(_, b)| b).sum()))
        .collect()
}

/// fabtests `unit/mr_test.c::mr_reg`: `fi_mr_reg` then `fi_close`, for every size and every
/// access combination.
///
/// CONFORMANCE.md: M1, M36.
#[test]
fn fabtests_mr_test_mr_reg() {
    let sizes = test_sizes();
    let buf = Mapping::new(*sizes.last().unwrap()).unwrap();
    let combos = bit_combos(mr_access());
    assert_eq!(combos.len(), 64);
    for d in domains() {
        for &size in &sizes {
            for &access in &combos {
                let mr = d.reg(buf.addr(), size, access, 0, FT_MR_KEY, RegFlags::empty()).unwrap();
                mr.close().unwrap();
            }
        }
        assert_eq!(d.region_count(), 0);
    }
}

/// fabtests `unit/mr_test.c::mr_regv`: `n` contiguous pieces of the buffer (for each test size
/// `n` up to `mr_iov_limit`), registered as one region, then closed.
///
/// CONFORMANCE.md: M2, M44.
#[test]
fn fabtests_mr_test_mr_regv() {
    let sizes = test_sizes();
    let largest = *sizes.last().unwrap();
    let buf = Mapping::new(largest).unwrap();
    for d in domains() {
        let limit = d.attr().mr_iov_limit;
        for &n in sizes.iter().filter(|&&n| n <= limit) {
            let iov: Vec<Segment> = (0..n).map(|j| Segment { addr: buf.addr() + j * (largest / n), len: largest / n }).collect();
            let mr = d.regv(&iov, mr_access(), 0, FT_MR_KEY, RegFlags::empty()).unwrap();
            assert_eq!(mr.segments(), &iov[..]);
            mr.close().unwrap();
        }
    }
}

/// fabtests `unit/mr_test.c::mr_regattr`: as `mr_regv`, through `fi_mr_regattr` with the
/// system `iface` (`ft_fill_mr_attr`).
///
/// CONFORMANCE.md: M3, M54.
#[test]
fn fabtests_mr_test_mr_regattr() {
    let sizes = test_sizes();
    let largest = *sizes.last().unwrap();
    let buf = Mapping::new(largest).unwrap();
    for d in domains() {
        let limit = d.attr().mr_iov_limit;
        for &n in sizes.iter().filter(|&&n| n <= limit) {
            let iov: Vec<Segment> = (0..n).map(|j| Segment { addr: buf.addr() + j * (largest / n), len: largest / n }).collect();
            let attr = MrAttr { context: n as u64, ..MrAttr::new(&iov, mr_access(), 0, FT_MR_KEY) };
            assert_eq!(attr.iface, HmemIface::System);
            let mr = d.regattr(&attr, RegFlags::empty()).unwrap();
            assert_eq!(mr.context(), n as u64);
            mr.close().unwrap();
        }
    }
}

/// fabtests `unit/mr_test.c::mr_reg_free_then_alloc`: five times, register the buffer, close
/// the registration, allocate a new buffer, free the old one, and carry on with the new one.
///
/// CONFORMANCE.md: M5.
#[test]
fn fabtests_mr_test_mr_reg_free_then_alloc() {
    let size = *test_sizes().last().unwrap();
    for d in domains() {
        let mut buf = Mapping::new(size).unwrap();
        for _ in 0..5 {
            let iov = [Segment { addr: buf.addr(), len: size }];
            let mr = d.regattr(&MrAttr::new(&iov, mr_access(), 0, FT_MR_KEY), RegFlags::empty()).unwrap();
            mr.close().unwrap();
            let buf2 = Mapping::new(size).unwrap();
            drop(std::mem::replace(&mut buf, buf2));
        }
        assert_eq!(d.region_count(), 0);
    }
}

/// fabtests `unit/mr_cache_evict.c`, `MMAP` allocator: a second registration of a buffer hits
/// the cache; after the buffer is unmapped (registrations still open) and mapped again at the
/// same address, a third registration is a miss with a new key, and the stale ones are dead.
///
/// CONFORMANCE.md: M70.
#[test]
fn fabtests_mr_cache_evict_mmap() {
    let size = 16384usize.max(page_size());
    let d = Domain::open(DomainAttr { mr_mode: MrMode::PROV_KEY | MrMode::VIRT_ADDR, ..DomainAttr::default() }).unwrap();
    let cache = MrCache::new(d, CacheConfig::default()).unwrap();
    if !cache.is_caching() {
        // mr_cache_evict.c skips (-FI_ENOSYS) when the provider does not cache.
        eprintln!("skipped: registrations are not cached here ({:?})", cache.monitor_status());
        return;
    }
    let access = mr_access();
    // The priming registration (of heap memory, not timed) the test starts with.
    let prime = vec![0u8; size];
    let _prime_mr = cache.get(prime.as_ptr() as usize, size, access).unwrap();
    // Another test thread may map the hole first: then the scenario is redone elsewhere (the
    // fabtest needs the same address back, and fails with -EFAULT without it).
    for _ in 0..16 {
        let mut buf = Mapping::new(size).unwrap();
        let addr = buf.addr();
        let before = cache.stats();
        let mr = cache.get(addr, size, access).unwrap();
        let cached_mr = cache.get(addr, size, access).unwrap();
        let after = cache.stats();
        assert_eq!((after.misses - before.misses, after.hits - before.hits), (1, 1), "the second registration is a cache hit");
        assert_eq!(mr.key().unwrap(), cached_mr.key().unwrap());
        buf.unmap();
        let Ok(mut again) = Mapping::at(addr, size) else { continue };
        again.fill(1);
        let realloc_mr = cache.get(addr, size, access).unwrap();
        let last = cache.stats();
        assert_eq!((last.misses - after.misses, last.hits - after.hits), (1, 0), "the reallocated buffer is not a hit");
        assert_ne!(realloc_mr.key().unwrap(), mr.key().unwrap());
        assert!(realloc_mr.is_valid() && !mr.is_valid() && !cached_mr.is_valid());
        assert!(last.invalidations > before.invalidations);
        return;
    }
    panic!("could not map the same address again in 16 tries");
}
