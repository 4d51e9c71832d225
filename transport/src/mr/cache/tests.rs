//! Registration-cache tests on real memory (anonymous mappings made and unmapped here).

use std::sync::Arc;

use super::uffd::testmem::Mapping;
use super::*;
use crate::mr::pages::page_size;
use crate::mr::{DomainAttr, RemoteAccessError, RemoteOp};

const RR: Access = Access::REMOTE_READ;
const RW: Access = Access::REMOTE_WRITE;

fn domain() -> Domain {
    Domain::open(DomainAttr { mr_mode: MrMode::PROV_KEY | MrMode::VIRT_ADDR, ..DomainAttr::default() }).unwrap()
}

fn cache_with(cfg: CacheConfig) -> MrCache {
    let c = MrCache::new(domain(), cfg).unwrap();
    if cfg.max_count > 0 && cfg.monitor == Monitor::Userfaultfd {
        // This machine runs the tests as root on Linux 6.18: the monitor must start.
        assert_eq!(c.monitor_status(), &MonitorStatus::Userfaultfd { write_protect: true });
        assert!(c.is_caching());
    }
    c
}

fn cache() -> MrCache {
    cache_with(CacheConfig::default())
}

fn pages(n: usize) -> Mapping {
    let mut m = Mapping::new(n * page_size()).unwrap();
    m.fill(0x5a);
    m
}

fn readable(c: &MrCache, key: u64, addr: usize, len: usize) -> bool {
    c.domain().check_remote(key, addr as u64, len as u64, RemoteOp::Read).is_ok()
}

/// CONFORMANCE.md: M70.
#[test]
fn hit_reuses_the_registration() {
    let c = cache();
    let m = pages(4);
    let p = page_size();
    let a = c.get(m.addr(), 2 * p, RR).unwrap();
    assert!(a.is_cached());
    let key = a.key().unwrap();
    drop(a);
    let b = c.get(m.addr() + 100, 100, RR).unwrap();
    assert_eq!(b.key().unwrap(), key);
    assert_eq!((b.addr(), b.len()), (m.addr(), 2 * p));
    assert_eq!(b.remote_addr(m.addr() + 100), Some(m.addr() as u64 + 100));
    assert_eq!(b.remote_addr(m.addr() + 3 * p), None);
    // Held twice at once: still one registration.
    let b2 = c.get(m.addr(), p, RR).unwrap();
    assert_eq!(b2.key().unwrap(), key);
    assert_eq!(c.domain().region_count(), 1);
    let s = c.stats();
    assert_eq!((s.hits, s.misses, s.evictions), (2, 1, 0));
    assert!(readable(&c, key, m.addr(), 2 * p));
}

#[test]
fn miss_for_uncovered_range() {
    let c = cache();
    let m = pages(4);
    let p = page_size();
    let a = c.get(m.addr(), p, RR).unwrap();
    // Extends past the entry: not covered.
    let b = c.get(m.addr() + p / 2, p, RR).unwrap();
    assert_ne!(a.key().unwrap(), b.key().unwrap());
    assert_eq!(c.stats().misses, 2);
    assert_eq!(c.get(0x1000, 0, RR).unwrap_err(), MrErrno::Inval);
    assert_eq!(c.get(usize::MAX, 2, RR).unwrap_err(), MrErrno::Inval);
}

/// CONFORMANCE.md: M70.
#[test]
fn overlapping_entries_are_evicted_not_merged() {
    let c = cache();
    let m = pages(4);
    let p = page_size();
    let old = c.get(m.addr(), 2 * p, RR).unwrap();
    let old_key = old.key().unwrap();
    drop(old);
    let new = c.get(m.addr() + p, 2 * p, RR).unwrap();
    assert_eq!((new.addr(), new.len()), (m.addr() + p, 2 * p), "exactly the range asked");
    let s = c.stats();
    assert_eq!((s.misses, s.evictions), (2, 1));
    assert!(!readable(&c, old_key, m.addr(), 1), "evicted entry deregistered");
    assert_eq!(c.domain().region_count(), 1);
    assert_eq!(c.usage().0, 1);
}

#[test]
fn overlapped_entry_in_use_survives_until_released() {
    let c = cache();
    let m = pages(4);
    let p = page_size();
    let old = c.get(m.addr(), 2 * p, RR).unwrap();
    let new = c.get(m.addr() + p, 2 * p, RR).unwrap();
    assert_eq!(c.stats().evictions, 1);
    assert!(readable(&c, old.key().unwrap(), m.addr(), 2 * p), "still usable by its holder");
    assert_eq!(c.domain().region_count(), 2);
    let old_key = old.key().unwrap();
    drop(old);
    assert!(!readable(&c, old_key, m.addr(), 1));
    assert_eq!(c.domain().region_count(), 1);
    // The detached entry is not findable any more; the new one is.
    let again = c.get(m.addr() + p, p, RR).unwrap();
    assert_eq!(again.key().unwrap(), new.key().unwrap());
}

/// CONFORMANCE.md: M73.
#[test]
fn eviction_by_count() {
    let c = cache_with(CacheConfig { max_count: 2, ..CacheConfig::default() });
    let m = pages(3);
    let p = page_size();
    let mut keys = Vec::new();
    for i in 0..3 {
        keys.push(c.get(m.addr() + i * p, p, RR).unwrap().key().unwrap());
    }
    assert_eq!(c.stats().evictions, 1);
    assert_eq!(c.usage(), (2, 2, 2 * p));
    assert!(!readable(&c, keys[0], m.addr(), 1), "least recently used went first");
    assert!(readable(&c, keys[1], m.addr() + p, 1));
    // The most recently used stays cached; the first one misses again.
    assert_eq!(c.get(m.addr() + 2 * p, p, RR).unwrap().key().unwrap(), keys[2]);
    assert_ne!(c.get(m.addr(), p, RR).unwrap().key().unwrap(), keys[0]);
    assert_eq!(c.stats().misses, 4);
}

/// CONFORMANCE.md: M72.
#[test]
fn eviction_by_size() {
    let p = page_size();
    let c = cache_with(CacheConfig { max_size: 2 * p, ..CacheConfig::default() });
    let m = pages(4);
    let a = c.get(m.addr(), p, RR).unwrap().key().unwrap();
    let b = c.get(m.addr() + p, 2 * p, RR).unwrap().key().unwrap();
    assert_eq!(c.stats().evictions, 1);
    assert!(!readable(&c, a, m.addr(), 1));
    assert!(readable(&c, b, m.addr() + p, 2 * p));
    assert_eq!(c.usage(), (1, 1, 2 * p));
    // A registration larger than the bound alone is served uncached.
    let big = c.get(m.addr(), 3 * p, RR).unwrap();
    assert_eq!(c.stats().evictions, 2, "overlap");
    assert!(!big.is_cached());
    assert_eq!(c.stats().uncached, 1);
    assert_eq!(c.usage(), (0, 0, 0));
    drop(big);
    assert_eq!(c.domain().region_count(), 0);
}

#[test]
fn access_upgrade() {
    let c = cache();
    let m = pages(2);
    let p = page_size();
    let r = c.get(m.addr(), p, RR).unwrap();
    let rkey = r.key().unwrap();
    drop(r);
    let w = c.get(m.addr(), p, RW).unwrap();
    assert_ne!(w.key().unwrap(), rkey);
    assert!(w.access().contains(RR | RW), "upgrade keeps the old rights");
    drop(w);
    let s = c.stats();
    assert_eq!((s.hits, s.misses, s.evictions), (0, 2, 1));
    let again = c.get(m.addr() + 8, 8, RR).unwrap();
    assert!(again.access().contains(RW));
    assert_eq!(c.stats().hits, 1);
}

/// CONFORMANCE.md: M75.
#[test]
fn unmap_invalidates_unused_entry() {
    let c = cache();
    let p = page_size();
    let mut m = pages(2);
    let key = c.get(m.addr(), 2 * p, RR).unwrap().key().unwrap();
    assert_eq!(c.usage().0, 1);
    m.unmap();
    // munmap returned: the monitor has already handled the event.
    assert_eq!(c.stats().invalidations, 1);
    assert_eq!(c.usage().0, 0);
    assert_eq!(
        c.domain().check_remote(key, m.addr() as u64, 1, RemoteOp::Read),
        Err(MrErrno::Access(RemoteAccessError::Disabled)),
        "revoked before the registration is even dropped"
    );
    c.flush();
    assert_eq!(c.domain().region_count(), 0);
}

#[test]
fn unmap_while_in_use_revokes_then_deregisters_on_release() {
    let c = cache();
    let p = page_size();
    let mut m = pages(1);
    let h = c.get(m.addr(), p, RR | RW).unwrap();
    let key = h.key().unwrap();
    m.unmap();
    assert!(!h.is_valid());
    assert_eq!(c.stats().invalidations, 1);
    assert!(c.domain().check_remote(key, m.addr() as u64, 1, RemoteOp::Write).is_err());
    assert_eq!(c.domain().region_count(), 1, "still held");
    drop(h);
    assert_eq!(c.domain().region_count(), 0);
}

/// CONFORMANCE.md: M75.
#[test]
fn madvise_dontneed_invalidates() {
    let c = cache();
    let p = page_size();
    let mut m = pages(4);
    let k = c.get(m.addr() + p, p, RR).unwrap().key().unwrap();
    let other = c.get(m.addr() + 3 * p, p, RR).unwrap().key().unwrap();
    m.discard(p, p);
    assert_eq!(c.stats().invalidations, 1);
    assert!(!readable(&c, k, m.addr() + p, 1));
    assert!(readable(&c, other, m.addr() + 3 * p, 1), "only the dropped pages");
    assert_ne!(c.get(m.addr() + p, p, RR).unwrap().key().unwrap(), k);
}

/// CONFORMANCE.md: M75.
#[test]
fn mremap_invalidates_the_old_range() {
    let c = cache();
    let p = page_size();
    let mut m = pages(2);
    // Occupy the page after the mapping (or find it occupied) so mremap has to move it.
    let _blocker = Mapping::at(m.addr() + 2 * p, p);
    let k = c.get(m.addr(), 2 * p, RR).unwrap().key().unwrap();
    let old = m.remap_grow();
    assert_ne!(m.addr(), old, "moved");
    assert_eq!(c.stats().invalidations, 1);
    assert!(!readable(&c, k, old, 1));
    assert_eq!(m.get(0), 0x5a, "contents moved along");
}

/// CONFORMANCE.md: M75.
#[test]
fn no_stale_hit_after_munmap_then_mmap_at_same_address() {
    let c = cache();
    let p = page_size();
    let mut m = pages(2);
    let addr = m.addr();
    let key = c.get(addr, 2 * p, RR).unwrap().key().unwrap();
    m.unmap();
    // Map again at the same address. Another test thread could take the hole first; retry
    // with a fresh address then (the property is the same at any address reused).
    let mut again = Mapping::at(addr, 2 * p).map(|n| (n, addr));
    for _ in 0..16 {
        if again.is_ok() {
            break;
        }
        let mut m2 = pages(2);
        let a2 = m2.addr();
        c.get(a2, 2 * p, RR).unwrap();
        m2.unmap();
        again = Mapping::at(a2, 2 * p).map(|n| (n, a2));
    }
    let (mut n, addr) = again.expect("some hole stays free long enough to be mapped again");
    n.fill(1);
    assert_eq!(n.get(0), 1);
    let h = c.get(addr, 2 * p, RR).unwrap();
    assert_ne!(h.key().unwrap(), key);
    assert!(h.is_valid());
    assert_eq!(c.stats().hits, 0, "never a hit on the old mapping's entry");
    assert!(c.stats().invalidations >= 1);
}

/// CONFORMANCE.md: M73.
#[test]
fn max_count_zero_disables_caching() {
    let c = cache_with(CacheConfig { max_count: 0, ..CacheConfig::default() });
    assert!(!c.is_caching());
    assert_eq!(c.monitor_status(), &MonitorStatus::Disabled);
    let m = pages(1);
    let p = page_size();
    let a = c.get(m.addr(), p, RR).unwrap();
    assert!(!a.is_cached());
    let b = c.get(m.addr(), p, RR).unwrap();
    assert_ne!(a.key().unwrap(), b.key().unwrap(), "every get registers");
    assert_eq!(c.domain().region_count(), 2);
    drop((a, b));
    assert_eq!(c.domain().region_count(), 0, "every release deregisters");
    let s = c.stats();
    assert_eq!((s.hits, s.misses), (0, 2));
}

/// CONFORMANCE.md: M74.
#[test]
fn disabled_monitor_disables_caching() {
    let c = cache_with(CacheConfig { monitor: Monitor::Disabled, ..CacheConfig::default() });
    assert!(!c.is_caching());
    let m = pages(1);
    let k = c.get(m.addr(), 64, RR).unwrap().key().unwrap();
    assert!(!readable(&c, k, m.addr(), 1));
    assert_eq!(c.stats().hits, 0);
}

#[test]
fn unwatchable_range_is_served_uncached() {
    // Nothing is mapped at the top of the lower half of the address space, so the monitor
    // cannot register it; the registration itself (addresses only) still works.
    let c = cache();
    let addr = (1usize << 46) - (1 << 20);
    let h = c.get(addr, 4096, RR).unwrap();
    assert!(!h.is_cached());
    assert_eq!(c.stats().uncached, 1);
    drop(h);
    assert_eq!(c.domain().region_count(), 0);
}

#[test]
fn store_grows_past_initial_capacity() {
    let c = cache();
    let p = page_size();
    let m = pages(200);
    let held: Vec<CachedMr> = (0..200).map(|i| c.get(m.addr() + i * p, p, RR).unwrap()).collect();
    assert_eq!(c.usage().0, 200, "{:?}", c.stats());
    for (i, h) in held.iter().enumerate() {
        assert!(readable(&c, h.key().unwrap(), m.addr() + i * p, p));
    }
    drop(held);
    let again = c.get(m.addr() + 150 * p, p, RR).unwrap();
    assert!(again.is_cached());
    assert_eq!(c.stats().hits, 1);
}

#[test]
fn dropping_the_cache_deregisters_everything() {
    let c = cache();
    let dom = c.domain().clone();
    let m = pages(2);
    let p = page_size();
    let kept = c.get(m.addr(), p, RR).unwrap();
    drop(c.get(m.addr() + p, p, RR).unwrap());
    assert_eq!(dom.region_count(), 2);
    drop(c);
    assert_eq!(dom.region_count(), 1, "the entry in use stays until released");
    assert!(kept.is_valid());
    drop(kept);
    assert_eq!(dom.region_count(), 0);
    // Unmapping after the cache is gone does not block (the userfaultfd is closed).
    drop(m);
}

#[test]
fn concurrent_use_from_two_threads() {
    let c = Arc::new(cache_with(CacheConfig { max_count: 8, ..CacheConfig::default() }));
    let p = page_size();
    let shared_mem = Arc::new(pages(16));
    let mut threads = Vec::new();
    for t in 0..2u64 {
        let (c, mem) = (Arc::clone(&c), Arc::clone(&shared_mem));
        threads.push(std::thread::spawn(move || {
            let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ t;
            let mut held = Vec::new();
            for i in 0..3000 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let first = (x % 16) as usize;
                let n = 1 + ((x >> 8) % (16 - first as u64)) as usize;
                let off = ((x >> 20) % 64) as usize;
                let (addr, len) = (mem.addr() + first * p + off, n * p - off);
                let access = if x & (1 << 40) != 0 { RR } else { RR | RW };
                let h = c.get(addr, len, access).unwrap();
                assert!(h.addr() <= addr && addr + len <= h.addr() + h.len());
                assert!(h.access().contains(access));
                assert!(readable(&c, h.key().unwrap(), addr, len), "iteration {i}");
                held.push(h);
                if held.len() > 3 {
                    held.remove((x >> 30) as usize % held.len());
                }
            }
            // Memory of this thread's own, unmapped piece by piece while the other thread
            // works. (Each thread unmaps only its own area: see `get` on the window where
            // another thread can map a just-unmapped range before its event is queued.)
            let mut own = pages(100);
            for i in 0..50 {
                let a = own.addr() + 2 * i * p;
                let h = c.get(a, 2 * p, RR).unwrap();
                assert!(h.is_cached());
                let key = h.key().unwrap();
                drop(h);
                own.unmap_part(2 * i * p, 2 * p);
                assert!(!readable(&c, key, a, 1));
            }
        }));
    }
    for t in threads {
        t.join().unwrap();
    }
    let s = c.stats();
    assert!(s.hits > 0 && s.misses > 0 && s.evictions > 0, "{s:?}");
    assert!(s.invalidations >= 100, "{s:?}");
    let (entries, unused, _) = c.usage();
    assert_eq!(entries, unused, "nothing held any more");
    assert!(unused <= 8);
    c.flush();
    assert_eq!(c.domain().region_count(), 0);
}

#[test]
fn config_from_lookup() {
    let env =
        |pairs: &'static [(&'static str, &'static str)]| move |k: &str| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string());
    assert_eq!(CacheConfig::from_lookup(env(&[])).unwrap(), CacheConfig::default());
    let c = CacheConfig::from_lookup(env(&[
        ("TMPI_MR_CACHE_MAX_COUNT", "0"),
        ("TMPI_MR_CACHE_MAX_SIZE", "64k"),
        ("TMPI_MR_CACHE_MONITOR", "disabled"),
    ]))
    .unwrap();
    assert_eq!(c, CacheConfig { max_count: 0, max_size: 65536, monitor: Monitor::Disabled });
    let c = CacheConfig::from_lookup(env(&[("TMPI_MR_CACHE_MAX_SIZE", "unlimited")])).unwrap();
    assert_eq!(c.max_size, usize::MAX);
    for (var, val) in [
        ("TMPI_MR_CACHE_MAX_COUNT", "-1"),
        ("TMPI_MR_CACHE_MAX_SIZE", "12q"),
        ("TMPI_MR_CACHE_MAX_SIZE", "99999999999999999999t"),
        ("TMPI_MR_CACHE_MONITOR", "kernel"),
        ("TMPI_MR_CACHE_MAX_COUNT", "1073741825"),
        ("FI_MR_CACHE_MAX_COUNT", "many"),
        ("FI_MR_CACHE_MAX_SIZE", "-5"),
        ("FI_MR_CACHE_MONITOR", "cuda"),
    ] {
        let e = CacheConfig::from_lookup(|k| (k == var).then(|| val.to_string())).unwrap_err();
        assert!(e.to_string().contains(var), "{e}");
    }
}

/// Issue 17 item 5: libfabric's `FI_MR_CACHE_*` settings carry over when the `TMPI_` ones are
/// unset, with the same rule; the `TMPI_` ones win.
///
/// CONFORMANCE.md: M72, M74.
#[test]
fn libfabric_aliases_apply_when_tmpi_variables_are_unset() {
    let env =
        |pairs: &'static [(&'static str, &'static str)]| move |k: &str| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string());
    let c = CacheConfig::parse(env(&[("FI_MR_CACHE_MAX_COUNT", "7"), ("FI_MR_CACHE_MAX_SIZE", "2m"), ("FI_MR_CACHE_MONITOR", "disabled")]))
        .unwrap();
    assert_eq!(c, CacheConfig { max_count: 7, max_size: 2 << 20, monitor: Monitor::Disabled });
    let c = CacheConfig::parse(env(&[
        ("TMPI_MR_CACHE_MAX_COUNT", "9"),
        ("FI_MR_CACHE_MAX_COUNT", "bogus"),
        ("TMPI_MR_CACHE_MONITOR", "userfaultfd"),
        ("FI_MR_CACHE_MONITOR", "disabled"),
    ]))
    .unwrap();
    assert_eq!((c.max_count, c.monitor), (9, Monitor::Userfaultfd), "TMPI_ wins, the alias is not even read");
    // libfabric's monitor names select the one monitor tmpi has.
    for m in ["memhooks", "kdreg2", "uffd", "userfaultfd"] {
        let c = CacheConfig::parse(|k| (k == "FI_MR_CACHE_MONITOR").then(|| m.to_string())).unwrap();
        assert_eq!(c.monitor, Monitor::Userfaultfd, "{m}");
    }
    let e = CacheConfig::parse(|k| (k == "FI_MR_CACHE_MAX_SIZE").then(|| "lots".to_string())).unwrap_err();
    assert_eq!((e.var, e.value.as_str(), e.expected), ("FI_MR_CACHE_MAX_SIZE", "lots", EXPECT_SIZE));
}

/// Issue 17 item 5, probed: `max_count` 1 used to cache 4 regions in use at once (the bound
/// counted unused entries only). Every cached entry counts now; past the bound unused ones
/// are flushed and what still does not fit is registered uncached.
///
/// CONFORMANCE.md: M72, M73.
#[test]
fn bounds_count_entries_in_use() {
    let c = cache_with(CacheConfig { max_count: 1, ..CacheConfig::default() });
    let m = pages(4);
    let p = page_size();
    let held: Vec<_> = (0..4).map(|i| c.get(m.addr() + i * p, p, RR).unwrap()).collect();
    assert_eq!(held.iter().filter(|h| h.is_cached()).count(), 1);
    assert_eq!(c.usage().0, 1);
    assert_eq!(c.stats().uncached, 3);
    assert!(held.iter().all(|h| readable(&c, h.key().unwrap(), h.addr(), p)), "uncached ones work as well");
    drop(held);
    assert_eq!(c.domain().region_count(), 1, "the cached one stays, unused");
    // A new range flushes the unused entry to make room, and is cached.
    let h = c.get(m.addr() + 3 * p, p, RR).unwrap();
    assert!(h.is_cached());
    assert_eq!(c.usage(), (1, 0, 0));
    // By size: 2 pages allowed in all; in-use entries count.
    // (Fresh pages: a page is watched by one cache's userfaultfd only.)
    let m = pages(3);
    let c = cache_with(CacheConfig { max_size: 2 * p, ..CacheConfig::default() });
    let a = c.get(m.addr(), p, RR).unwrap();
    let b = c.get(m.addr() + p, p, RR).unwrap();
    let x = c.get(m.addr() + 2 * p, p, RR).unwrap();
    assert!(a.is_cached() && b.is_cached() && !x.is_cached());
    drop((a, x));
    let y = c.get(m.addr() + 2 * p, p, RR).unwrap();
    assert!(y.is_cached(), "the unused entry was flushed to make room");
    assert_eq!(c.usage().0, 2);
    drop(b);
}

#[test]
fn endpoint_domains_are_refused() {
    let d = Domain::open(DomainAttr { mr_mode: MrMode::ENDPOINT, ..DomainAttr::default() }).unwrap();
    assert_eq!(MrCache::new(d, CacheConfig::default()).unwrap_err(), MrErrno::Inval);
}

/// `n` pages far below where the kernel places mappings made without an address (it fills
/// the highest free gaps first), so that the hole they leave when unmapped is not filled by
/// other test threads' mappings: a test that unmaps them can map the same address again.
fn isolated_pages(n: usize) -> Mapping {
    use std::sync::atomic::AtomicUsize;
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    for _ in 0..64 {
        let k = NEXT.fetch_add(1, Ordering::Relaxed);
        // 32 TiB up, 1 GiB apart: far from the mmap base, the heap and the binary.
        if let Ok(mut m) = Mapping::at((1usize << 45) + (k << 30), n * page_size()) {
            m.fill(0x5a);
            return m;
        }
    }
    pages(n)
}

/// Maps `len` bytes at `addr` again, retrying a few times (another test thread may hold the
/// hole for a moment); `None` if it stays taken.
fn map_again(addr: usize, len: usize) -> Option<Mapping> {
    for _ in 0..100 {
        if let Ok(m) = Mapping::at(addr, len) {
            return Some(m);
        }
        std::thread::yield_now();
    }
    None
}

/// The fast path (issue 14 item 4): a range hit many times, unmapped and mapped anew at the
/// same address, misses on the next `get`, every round. Even rounds `munmap` then `mmap` the
/// same address (when another test thread takes the hole first, the round goes on at a fresh
/// address); odd rounds map over the range with `MAP_FIXED`, which unmaps and maps in one
/// call, so the address is always the same.
///
/// CONFORMANCE.md: M75.
#[test]
fn fast_path_misses_after_munmap_and_mmap_of_the_same_range() {
    let c = cache();
    let p = page_size();
    let mut m = isolated_pages(4);
    let mut replaced = 0;
    for round in 0..64 {
        let addr = m.addr();
        let first = c.get(addr, 4 * p, RR).unwrap();
        assert!(first.is_cached() && first.is_valid(), "round {round}");
        let key = first.key().unwrap();
        let hits = c.stats().hits;
        for _ in 0..8 {
            assert_eq!(c.get(addr + p, p, RR).unwrap().key().unwrap(), key);
        }
        assert_eq!(c.stats().hits, hits + 8);
        let held = c.get(addr, p, RR).unwrap();
        if round % 2 == 1 {
            m.replace();
            replaced += 1;
        } else {
            m.unmap();
            m = map_again(addr, 4 * p).unwrap_or_else(|| isolated_pages(4));
        }
        assert!(!first.is_valid() && !held.is_valid(), "revoked once the old pages were unmapped");
        assert!(!readable(&c, key, addr, 1));
        let addr = m.addr();
        m.fill(0x33);
        let hits = c.stats().hits;
        let h = c.get(addr, 4 * p, RR).unwrap();
        assert_eq!(c.stats().hits, hits, "round {round}: a miss, never the old mapping's entry");
        assert_ne!(h.key().unwrap(), key);
        assert!(h.is_cached() && h.is_valid());
        assert!(readable(&c, h.key().unwrap(), addr, 4 * p));
    }
    assert_eq!(replaced, 32);
}

/// The fast path with the unmap in another thread: one thread hits a range without pause
/// while the other unmaps it, then maps it anew (at the same address unless another test
/// thread took it). Once the `munmap` has returned, every cached handle of the old mapping
/// is revoked, and the next `get` is not a hit on it; once memory is mapped again, a fresh
/// entry.
///
/// CONFORMANCE.md: M75.
#[test]
fn fast_path_with_munmap_from_another_thread() {
    let c = Arc::new(cache());
    let len = 8 * page_size();
    let u = Unmapper::spawn(len);
    let mut m = isolated_pages(8);
    let mut reused = 0;
    for round in 0..40 {
        let (addr, key) = (m.addr(), cached_key(&c, m.addr(), len, round));
        // Unmapped after a varying number of this thread's gets.
        let held = u.hits_until_unmapped(&c, m, addr, key, 50 + (round * 37) % 400);
        // munmap has returned (the flag was set after it).
        check_unmapped(&c, held, addr, key, round);
        // Now let the other thread map the range again.
        m = u.map_again();
        m.fill(0x77);
        if m.addr() == addr {
            reused += 1;
            let hits = c.stats().hits;
            let h = c.get(addr + page_size(), page_size(), RR).unwrap();
            assert_eq!(c.stats().hits, hits, "round {round}: a miss after the new mapping");
            assert_ne!(h.key().unwrap(), key);
            assert!(h.is_cached() && h.is_valid(), "round {round}");
        }
    }
    u.join();
    assert!(reused > 0, "the address was never free to map again");
}

/// Registers `[addr, addr + len)` through the cache and returns its key (the handle is
/// dropped; the entry stays cached).
fn cached_key(c: &MrCache, addr: usize, len: usize, round: usize) -> u64 {
    let first = c.get(addr, len, RR).unwrap();
    assert!(first.is_cached(), "round {round}");
    first.key().unwrap()
}

/// After the unmap: every handle held is revoked, the key reads nothing, and the next `get`
/// there is a miss with a key of its own, not cached (nothing is mapped to watch).
fn check_unmapped(c: &MrCache, held: std::collections::VecDeque<CachedMr>, addr: usize, key: u64, round: usize) {
    let p = page_size();
    assert!(!held.is_empty(), "round {round}: hits while the range was mapped");
    assert!(held.iter().all(|h| !h.is_valid()), "round {round}: a handle of unmapped memory still valid");
    assert!(!readable(c, key, addr, 1));
    let hits = c.stats().hits;
    let h = c.get(addr + p, p, RR).unwrap();
    assert_eq!(c.stats().hits, hits, "round {round}: no hit on unmapped memory");
    assert!(!h.is_cached(), "round {round}: nothing is mapped there, nothing to watch");
    assert_ne!(h.key().unwrap(), key);
}

/// What the other thread of [`fast_path_with_munmap_from_another_thread`] is asked to do.
enum Work {
    /// Unmap this after the main thread's hits reach the count asked.
    Unmap(Mapping, usize),
    /// Map the last range unmapped again (elsewhere if it is taken).
    MapAgain,
}

/// The thread that unmaps and maps again, and how the main thread talks to it.
struct Unmapper {
    to: std::sync::mpsc::Sender<Work>,
    done: std::sync::mpsc::Receiver<Mapping>,
    /// Set once the `munmap` has returned.
    unmapped: Arc<std::sync::atomic::AtomicBool>,
    /// The main thread's gets so far this round.
    spins: Arc<std::sync::atomic::AtomicUsize>,
    thread: std::thread::JoinHandle<()>,
}

impl Unmapper {
    /// Starts the thread, for mappings of `len` bytes.
    fn spawn(len: usize) -> Unmapper {
        let (to, work) = std::sync::mpsc::channel::<Work>();
        let (to_main, done) = std::sync::mpsc::channel::<Mapping>();
        let unmapped = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let spins = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let (u, sp) = (Arc::clone(&unmapped), Arc::clone(&spins));
        let thread = std::thread::spawn(move || {
            let mut addr = 0;
            while let Ok(w) = work.recv() {
                match w {
                    Work::Unmap(mut m, wait) => {
                        while sp.load(Ordering::Acquire) < wait {
                            std::thread::yield_now();
                        }
                        addr = m.addr();
                        m.unmap();
                        u.store(true, Ordering::Release);
                    }
                    Work::MapAgain => {
                        let again = map_again(addr, len).unwrap_or_else(|| isolated_pages(8));
                        if to_main.send(again).is_err() {
                            return;
                        }
                    }
                }
            }
        });
        Unmapper { to, done, unmapped, spins, thread }
    }

    /// Hands `m` over to be unmapped after `wait` gets, and gets the page after `addr` until
    /// the unmap has returned; returns the last 64 handles that hit the entry of `key`.
    fn hits_until_unmapped(&self, c: &MrCache, m: Mapping, addr: usize, key: u64, wait: usize) -> std::collections::VecDeque<CachedMr> {
        let p = page_size();
        self.spins.store(0, Ordering::Release);
        self.unmapped.store(false, Ordering::Release);
        self.to.send(Work::Unmap(m, wait)).unwrap();
        let mut held = std::collections::VecDeque::new();
        while !self.unmapped.load(Ordering::Acquire) {
            let h = c.get(addr + p, p, RR).unwrap();
            if h.is_cached() && h.key().unwrap() == key {
                held.push_back(h);
                if held.len() > 64 {
                    held.pop_front();
                }
            }
            self.spins.fetch_add(1, Ordering::Release);
        }
        held
    }

    /// The range unmapped last, mapped again (at the same address unless it was taken).
    fn map_again(&self) -> Mapping {
        self.to.send(Work::MapAgain).unwrap();
        self.done.recv().unwrap()
    }

    fn join(self) {
        drop(self.to);
        self.thread.join().unwrap();
    }
}

/// A lookup that finds the monitor's signal count ahead of the last drain reads the
/// userfaultfd itself before looking up (and records the drain); the hit is still a hit.
///
/// CONFORMANCE.md: M70.
#[test]
fn signalled_lookup_drains_before_hitting() {
    let c = cache();
    let m = pages(2);
    let p = page_size();
    let key = c.get(m.addr(), 2 * p, RR).unwrap().key().unwrap();
    let sh = &c.shared;
    sh.signals.fetch_add(1, Ordering::SeqCst);
    assert_ne!(sh.signals.load(Ordering::SeqCst), lock(&sh.state).drained);
    let h = c.get(m.addr(), p, RR).unwrap();
    assert_eq!(h.key().unwrap(), key);
    assert_eq!(c.stats().hits, 1);
    assert_eq!(sh.signals.load(Ordering::SeqCst), lock(&sh.state).drained, "the slow path drained");
}

/// The LRU orders entries by last use and flushing walks past entries in use.
///
/// CONFORMANCE.md: M70.
#[test]
fn lru_flushes_least_recently_used_and_skips_entries_in_use() {
    let c = cache_with(CacheConfig { max_count: 3, ..CacheConfig::default() });
    let m = pages(5);
    let p = page_size();
    let at = |i: usize| m.addr() + i * p;
    let a = c.get(at(0), p, RR).unwrap(); // oldest, held throughout
    let kb = c.get(at(1), p, RR).unwrap().key().unwrap();
    let kc = c.get(at(2), p, RR).unwrap().key().unwrap();
    // Use b again: c is now the least recently used unused entry.
    assert_eq!(c.get(at(1), p, RR).unwrap().key().unwrap(), kb);
    let d = c.get(at(3), p, RR).unwrap();
    assert!(d.is_cached());
    assert!(!readable(&c, kc, at(2), 1), "c flushed");
    assert!(readable(&c, kb, at(1), 1) && readable(&c, a.key().unwrap(), at(0), 1));
    // b is flushed next; a, the oldest, is in use and stays.
    let e = c.get(at(4), p, RR).unwrap();
    assert!(e.is_cached());
    assert!(!readable(&c, kb, at(1), 1));
    assert!(readable(&c, a.key().unwrap(), at(0), 1));
    assert_eq!(c.usage(), (3, 0, 0));
    drop(d);
    assert_eq!(c.usage(), (3, 1, p));
}
