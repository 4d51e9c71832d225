//! Registration cache micro-benchmarks ([`MrCache::get`] of a 1 MiB buffer, handle dropped
//! each iteration).
//!
//! - `mr_cache/hit`: the same buffer again (caching on, userfaultfd monitor): the lookup
//!   fast path;
//! - `mr_cache/miss`: `max_count` 0 (cache disabled): every get registers, every drop
//!   deregisters (the figure issue 14 compares hits with);
//! - `mr_cache/miss_cached`: a real cache miss: two buffers in turn with `max_count` 1, so
//!   every get registers, watches the range with the monitor and evicts (then deregisters)
//!   the other buffer's entry;
//! - `mr_cache/disabled`: [`Monitor::Disabled`] (also uncached).
//!
//! When userfaultfd is unavailable the `hit` and `miss_cached` cases are uncached as well;
//! the monitor status is printed so the figures can be read accordingly.

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use tmpi_transport::mr::{Access, CacheConfig, Domain, DomainAttr, Monitor, MrCache, MrMode};

const LEN: usize = 1 << 20;

fn domain() -> Domain {
    Domain::open(DomainAttr { mr_mode: MrMode::VIRT_ADDR | MrMode::PROV_KEY, mr_key_size: 8, mr_iov_limit: 1 }).expect("open domain")
}

fn run(c: &mut Criterion, name: &str, cfg: CacheConfig, bufs: &[&[u8]]) {
    let cache = MrCache::new(domain(), cfg).expect("create cache");
    eprintln!("mr_cache/{name}: caching {}, monitor {:?}", cache.is_caching(), cache.monitor_status());
    let addrs: Vec<usize> = bufs.iter().map(|b| b.as_ptr() as usize).collect();
    let access = Access::SEND | Access::RECV | Access::REMOTE_READ;
    let mut i = 0;
    c.bench_function(&format!("mr_cache/{name}"), |b| {
        b.iter(|| {
            let addr = addrs[i];
            // (No `%`: a division would cost as much as a fast-path hit's atomics.)
            i += 1;
            if i == addrs.len() {
                i = 0;
            }
            let mr = cache.get(black_box(addr), LEN, access).expect("register");
            black_box(mr.key().expect("key"));
        })
    });
    let s = cache.stats();
    eprintln!("mr_cache/{name}: hits {} misses {} evictions {} uncached {}", s.hits, s.misses, s.evictions, s.uncached);
}

fn mr_cache(c: &mut Criterion) {
    let buf = vec![1u8; LEN];
    let other = vec![2u8; LEN];
    run(c, "hit", CacheConfig::default(), &[&buf]);
    run(c, "miss", CacheConfig { max_count: 0, ..CacheConfig::default() }, &[&buf]);
    run(c, "miss_cached", CacheConfig { max_count: 1, ..CacheConfig::default() }, &[&buf, &other]);
    run(c, "disabled", CacheConfig { monitor: Monitor::Disabled, ..CacheConfig::default() }, &[&buf]);
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(20).measurement_time(Duration::from_secs(1)).warm_up_time(Duration::from_millis(300));
    targets = mr_cache
}
criterion_main!(benches);
