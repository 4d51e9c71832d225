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
//!
//! One suite, several domains: the `mr_test.c` cases are generic over [`FabtestDomain`],
//! which the model implements here and, with the `ofi` feature, libfabric's real domains
//! of the `tcp` and `shm` providers implement in `ofi_domains` (the same cases, the same
//! assertions). Where the model and a provider differ, `transport/CONFORMANCE.md` says which
//! is wrong and why.

use super::cache::testmem::Mapping;
use super::pages::page_size;
use super::*;

/// `FT_MR_KEY`.
const FT_MR_KEY: u64 = 0xC0DE;

/// The access `ft_info_to_mr_access` gives for `FI_MSG | FI_RMA`.
pub(crate) fn mr_access() -> Access {
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
pub(crate) fn test_sizes() -> Vec<usize> {
    (0..=20).map(|i| 1usize << i).collect()
}

/// Every combination of the bits of `access` (`ft_alloc_bit_combo(0, access)`).
pub(crate) fn bit_combos(access: Access) -> Vec<Access> {
    let bits: Vec<u64> = (0..64).map(|i| 1u64 << i).filter(|b| access.bits() & b != 0).collect();
    (0..1u64 << bits.len())
        .map(|m| Access::from_bits_retain(bits.iter().enumerate().filter(|(i, _)| m >> i & 1 == 1).map(|(_, b)| b).sum()))
        .collect()
}

/// A domain the `mr_test.c` cases run in: the fi_mr model or libfabric's real one.
pub(crate) trait FabtestDomain {
    /// A registration.
    type Region;
    /// Names the domain in failure messages.
    fn label(&self) -> String;
    /// `mr_iov_limit`.
    fn iov_limit(&self) -> usize;
    /// `fi_mr_regattr` of `iov` with `access`, the requested key and `context`.
    fn regattr(&self, iov: &[Segment], access: Access, key: u64, context: u64) -> Result<Self::Region, MrErrno>;
    /// The region's context, as registered.
    fn context(&self, r: &Self::Region) -> u64;
    /// The region's segments.
    fn segments(&self, r: &Self::Region) -> Vec<Segment>;
    /// `fi_close`.
    fn close(&self, r: Self::Region) -> Result<(), MrErrno>;
    /// Regions still registered, where the domain can tell.
    fn open_regions(&self) -> Option<usize>;
}

impl FabtestDomain for Domain {
    type Region = MemoryRegion;
    fn label(&self) -> String {
        format!("model {:?}", self.attr().mr_mode)
    }
    fn iov_limit(&self) -> usize {
        self.attr().mr_iov_limit
    }
    fn regattr(&self, iov: &[Segment], access: Access, key: u64, context: u64) -> Result<MemoryRegion, MrErrno> {
        let attr = MrAttr { context, ..MrAttr::new(iov, access, 0, key) };
        assert_eq!(attr.iface, HmemIface::System);
        Domain::regattr(self, &attr, RegFlags::empty())
    }
    fn context(&self, r: &MemoryRegion) -> u64 {
        r.context()
    }
    fn segments(&self, r: &MemoryRegion) -> Vec<Segment> {
        r.segments().to_vec()
    }
    fn close(&self, r: MemoryRegion) -> Result<(), MrErrno> {
        r.close().map_err(|_| MrErrno::Busy)
    }
    fn open_regions(&self) -> Option<usize> {
        Some(self.region_count())
    }
}

/// fabtests `unit/mr_test.c::mr_reg`: `fi_mr_reg` then `fi_close`, for every size and every
/// access combination.
///
/// CONFORMANCE.md: M1, M36.
pub(crate) fn mr_reg<D: FabtestDomain>(d: &D) {
    let sizes = test_sizes();
    let buf = Mapping::new(*sizes.last().unwrap()).unwrap();
    let combos = bit_combos(mr_access());
    assert_eq!(combos.len(), 64);
    for &size in &sizes {
        for &access in &combos {
            let iov = [Segment { addr: buf.addr(), len: size }];
            let mr = d.regattr(&iov, access, FT_MR_KEY, 0).unwrap_or_else(|e| panic!("{}: size {size} {access:?}: {e}", d.label()));
            d.close(mr).unwrap();
        }
    }
    assert!(d.open_regions().is_none_or(|n| n == 0), "{}", d.label());
}

/// fabtests `unit/mr_test.c::mr_regv`: `n` contiguous pieces of the buffer (for each test size
/// `n` up to `mr_iov_limit`), registered as one region, then closed.
///
/// CONFORMANCE.md: M2, M44.
pub(crate) fn mr_regv<D: FabtestDomain>(d: &D) {
    let sizes = test_sizes();
    let largest = *sizes.last().unwrap();
    let buf = Mapping::new(largest).unwrap();
    for &n in sizes.iter().filter(|&&n| n <= d.iov_limit()) {
        let iov: Vec<Segment> = (0..n).map(|j| Segment { addr: buf.addr() + j * (largest / n), len: largest / n }).collect();
        let mr = d.regattr(&iov, mr_access(), FT_MR_KEY, 0).unwrap_or_else(|e| panic!("{}: {n} segments: {e}", d.label()));
        assert_eq!(d.segments(&mr), iov, "{}", d.label());
        d.close(mr).unwrap();
    }
}

/// fabtests `unit/mr_test.c::mr_regattr`: as `mr_regv`, through `fi_mr_regattr` with the
/// system `iface` (`ft_fill_mr_attr`), and a context that comes back.
///
/// CONFORMANCE.md: M3, M54.
pub(crate) fn mr_regattr<D: FabtestDomain>(d: &D) {
    let sizes = test_sizes();
    let largest = *sizes.last().unwrap();
    let buf = Mapping::new(largest).unwrap();
    for &n in sizes.iter().filter(|&&n| n <= d.iov_limit()) {
        let iov: Vec<Segment> = (0..n).map(|j| Segment { addr: buf.addr() + j * (largest / n), len: largest / n }).collect();
        let mr = d.regattr(&iov, mr_access(), FT_MR_KEY, n as u64).unwrap_or_else(|e| panic!("{}: {n} segments: {e}", d.label()));
        assert_eq!(d.context(&mr), n as u64, "{}", d.label());
        d.close(mr).unwrap();
    }
}

/// fabtests `unit/mr_test.c::mr_reg_free_then_alloc`: five times, register the buffer, close
/// the registration, allocate a new buffer, free the old one, and carry on with the new one.
///
/// CONFORMANCE.md: M5.
pub(crate) fn mr_reg_free_then_alloc<D: FabtestDomain>(d: &D) {
    let size = *test_sizes().last().unwrap();
    let mut buf = Mapping::new(size).unwrap();
    for _ in 0..5 {
        let iov = [Segment { addr: buf.addr(), len: size }];
        let mr = d.regattr(&iov, mr_access(), FT_MR_KEY, 0).unwrap_or_else(|e| panic!("{}: {e}", d.label()));
        d.close(mr).unwrap();
        let buf2 = Mapping::new(size).unwrap();
        drop(std::mem::replace(&mut buf, buf2));
    }
    assert!(d.open_regions().is_none_or(|n| n == 0), "{}", d.label());
}

/// CONFORMANCE.md: M1, M36.
#[test]
fn fabtests_mr_test_mr_reg() {
    domains().iter().for_each(mr_reg);
}

/// CONFORMANCE.md: M2, M44.
#[test]
fn fabtests_mr_test_mr_regv() {
    domains().iter().for_each(mr_regv);
}

/// CONFORMANCE.md: M3, M54.
#[test]
fn fabtests_mr_test_mr_regattr() {
    domains().iter().for_each(mr_regattr);
}

/// CONFORMANCE.md: M5.
#[test]
fn fabtests_mr_test_mr_reg_free_then_alloc() {
    domains().iter().for_each(mr_reg_free_then_alloc);
}

/// fabtests `unit/mr_cache_evict.c`, `MMAP` allocator: a second registration of a buffer hits
/// the cache; after the buffer is unmapped (registrations still open) and mapped again at the
/// same address, a third registration is a miss with a new key, and the stale ones are dead.
/// Generic over the cache's domain (`key` reads a handle's key).
///
/// CONFORMANCE.md: M70.
pub(crate) fn mr_cache_evict<D: CacheDomain>(d: D, key: impl Fn(&CachedMr<D>) -> u64) {
    let size = 16384usize.max(page_size());
    let cache = MrCache::new(d, CacheConfig::default()).unwrap();
    if !cache.is_caching() {
        // mr_cache_evict.c skips (-FI_ENOSYS) when the provider does not cache.
        eprintln!("skipped: registrations are not cached here ({:?})", cache.monitor_status());
        return;
    }
    let access = Access::SEND | Access::READ | Access::REMOTE_READ;
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
        assert_eq!(key(&mr), key(&cached_mr));
        buf.unmap();
        let Ok(mut again) = Mapping::at(addr, size) else { continue };
        again.fill(1);
        let realloc_mr = cache.get(addr, size, access).unwrap();
        let last = cache.stats();
        assert_eq!((last.misses - after.misses, last.hits - after.hits), (1, 0), "the reallocated buffer is not a hit");
        assert_ne!(key(&realloc_mr), key(&mr));
        assert!(realloc_mr.is_valid() && !mr.is_valid() && !cached_mr.is_valid());
        assert!(last.invalidations > before.invalidations);
        return;
    }
    panic!("could not map the same address again in 16 tries");
}

/// CONFORMANCE.md: M70.
#[test]
fn fabtests_mr_cache_evict_mmap() {
    let d = Domain::open(DomainAttr { mr_mode: MrMode::PROV_KEY | MrMode::VIRT_ADDR, ..DomainAttr::default() }).unwrap();
    mr_cache_evict(d, |m| m.key().unwrap());
}

/// The registration errors of `fi_mr(3)`, case by case: `(case, outcome)`. Used to compare the
/// model with libfabric's providers (`ofi/tests_mr.rs`).
pub(crate) fn error_cases<D: FabtestDomain>(d: &D) -> Vec<(&'static str, Result<(), MrErrno>)> {
    let buf = Mapping::new(1 << 16).unwrap();
    let one = |len| [Segment { addr: buf.addr(), len }];
    let reg = |iov: &[Segment], access, key| d.regattr(iov, access, key, 0).and_then(|r| d.close(r));
    let rr = Access::REMOTE_READ;
    let mut out = vec![
        ("segment of length 0", reg(&one(0), rr, 1)),
        ("no segment", reg(&[], rr, 2)),
        ("more segments than mr_iov_limit", reg(&vec![Segment { addr: buf.addr(), len: 8 }; d.iov_limit() + 1], rr, 3)),
        ("access bit libfabric does not define", reg(&one(64), Access::from_bits_retain(1), 4)),
        ("range that wraps the address space", reg(&[Segment { addr: usize::MAX - 3, len: 8 }], rr, 5)),
        ("requested key FI_KEY_NOTAVAIL", reg(&one(64), rr, u64::MAX)),
        ("no access bit", reg(&one(64), Access::empty(), 6)),
    ];
    let held = d.regattr(&one(64), rr, 0xC0DE, 0);
    out.push(("requested key in use", reg(&one(64), rr, 0xC0DE)));
    if let Ok(h) = held {
        d.close(h).unwrap();
    }
    out.push(("requested key of a closed region", reg(&one(64), rr, 0xC0DE)));
    out
}

#[test]
fn model_registration_errors() {
    let d = Domain::open(DomainAttr::default()).unwrap();
    let got = error_cases(&d);
    let want: Vec<Result<(), MrErrno>> = vec![
        Err(MrErrno::Inval),
        Err(MrErrno::Inval),
        Err(MrErrno::Inval),
        Err(MrErrno::Inval),
        Err(MrErrno::Inval),
        Err(MrErrno::KeyRejected),
        Ok(()),
        Err(MrErrno::NoKey),
        Ok(()),
    ];
    assert_eq!(got.iter().map(|g| g.1).collect::<Vec<_>>(), want, "{got:?}");
}
