//! The fabtests ports of `mr/tests_libfabric.rs` run against libfabric's real domains of
//! the `tcp` and `shm` providers: the same cases and assertions as against the fi_mr model.

use super::tests::{domain, PROVIDERS};
use super::*;
use crate::mr::tests_libfabric::{mr_cache_evict, mr_reg, mr_reg_free_then_alloc, mr_regattr, mr_regv, FabtestDomain};
use crate::mr::{Access, MrErrno, RegFlags, Segment};

impl FabtestDomain for OfiDomain {
    type Region = OfiMr;
    fn label(&self) -> String {
        format!("{} {:?}", self.offer().provider, self.mr_mode())
    }
    fn iov_limit(&self) -> usize {
        self.offer().mr_iov_limit
    }
    fn regattr(&self, iov: &[Segment], access: Access, key: u64, context: u64) -> Result<OfiMr, MrErrno> {
        // SAFETY: the fabtests' buffers (test mappings) outlive their registrations, which
        // no peer ever accesses (no endpoint is open).
        unsafe { self.reg_unchecked(iov, access, key, RegFlags::empty(), context) }.map_err(|e| mr_errno(&e))
    }
    fn context(&self, r: &OfiMr) -> u64 {
        r.context()
    }
    fn segments(&self, r: &OfiMr) -> Vec<Segment> {
        r.segments().to_vec()
    }
    fn close(&self, r: OfiMr) -> Result<(), MrErrno> {
        r.close().map_err(|e| mr_errno(&e))
    }
    fn open_regions(&self) -> Option<usize> {
        None
    }
}

#[test]
fn fabtests_mr_test_on_libfabric_domains() {
    for p in PROVIDERS {
        let d = domain(p);
        mr_reg(&d);
        mr_regv(&d);
        mr_regattr(&d);
        mr_reg_free_then_alloc(&d);
    }
}

/// The registration errors of `fi_mr(3)` on libfabric 1.17's `tcp` and `shm` (both register
/// through libfabric's utility MR map): they refuse only an empty segment list and a requested
/// key in use; the model also refuses what the man page rules out (see
/// `transport/CONFORMANCE.md`, "The model against libfabric's providers"). Held here so a
/// libfabric that starts checking is noticed.
#[test]
fn registration_errors_against_the_model() {
    let model: Vec<(&str, Result<(), MrErrno>)> =
        crate::mr::tests_libfabric::error_cases(&crate::mr::Domain::open(crate::mr::DomainAttr::default()).unwrap());
    let provider = [Ok(()), Err(MrErrno::Inval), Ok(()), Ok(()), Ok(()), Ok(()), Ok(()), Err(MrErrno::NoKey), Ok(())];
    for p in PROVIDERS {
        let got = crate::mr::tests_libfabric::error_cases(&domain(p));
        for ((case, r), (want, m)) in got.iter().zip(provider.iter().zip(&model)) {
            assert_eq!(r, want, "{p}: {case}");
            if r != &m.1 {
                eprintln!("{p} differs from the model: {case}: provider {r:?}, model {:?}", m.1);
            }
        }
    }
}

/// `mr_cache_evict.c` through tmpi's registration cache over libfabric's domains: the same
/// cache, statistics and userfaultfd monitor as over the model.
#[test]
fn fabtests_mr_cache_evict_on_libfabric_domains() {
    for p in PROVIDERS {
        mr_cache_evict(domain(p), |m| m.region().mr().key().unwrap());
    }
}

/// The cache over a real domain refuses what a safe handle must not grant, and a cached
/// region's key serves a peer's `fi_read` until its memory is unmapped.
#[test]
fn cache_over_libfabric_serves_reads() {
    use crate::mr::{CacheConfig, MrCache};
    for p in ["tcp"] {
        let d = domain(p);
        let cache = MrCache::new(d.clone(), CacheConfig::default()).unwrap();
        let buf: Vec<u8> = (0..4096u32).map(|i| i as u8).collect();
        assert_eq!(cache.get(buf.as_ptr() as usize, 4096, Access::REMOTE_WRITE).unwrap_err(), MrErrno::Inval);
        let mr = cache.get(buf.as_ptr() as usize, 4096, Access::REMOTE_READ).unwrap();
        let again = cache.get(buf.as_ptr() as usize + 100, 50, Access::REMOTE_READ).unwrap();
        assert_eq!(again.region().mr().key(), mr.region().mr().key(), "{p}: a hit");
        let mut a = Endpoint::open(&d, 2).unwrap();
        let mut b = Endpoint::open(&d, 2).unwrap();
        let a_at_b = b.insert(&a.name().unwrap()).unwrap();
        let addr = mr.remote_addr(buf.as_ptr() as usize + 10).unwrap();
        let key = mr.region().mr().key().unwrap();
        let mut dst = vec![0u8; 100];
        let end = std::time::Instant::now() + std::time::Duration::from_secs(30);
        let mut done = None;
        loop {
            match b.read(dst, Desc::NONE, a_at_b, addr, key, 1).unwrap() {
                Post::Posted(_) => break,
                Post::Busy(v) => dst = v,
            }
            a.progress(|_| {}).unwrap();
            assert!(std::time::Instant::now() < end);
        }
        while done.is_none() {
            assert!(std::time::Instant::now() < end, "{p}: read never completed");
            a.progress(|_| {}).unwrap();
            b.progress(|c| done = Some(c)).unwrap();
        }
        let c = done.unwrap();
        assert_eq!((c.error, &c.buf[..]), (None, &buf[10..110]), "{p}");
        assert_eq!(cache.stats().hits, 1);
    }
}
