//! Cost of recording one event in a rank's trace ring: the encode and copy into the mapped
//! file (`push`), and what a traced call adds around it (two clock reads and the lock the
//! runtime takes: `span`).
//!
//! `cargo bench -p tmpi-trace --bench ring`

use std::sync::Mutex;

use criterion::{criterion_group, criterion_main, Criterion};
use tmpi_trace::clock::now_ns;
use tmpi_trace::event::{Event, Kind};
use tmpi_trace::ring::{RankFile, RankInfo};

fn bench(c: &mut Criterion) {
    let path = std::env::temp_dir().join(format!("tmpi-trace-bench-{}", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let info = RankInfo { rank: 0, size: 1, ..Default::default() };
    // 2^16 events (3 MiB): the ring wraps many times, as a long run's does.
    let file = RankFile::create(&path, &info, 1 << 16).expect("create the ring");
    let ring = Mutex::new(file);
    let mut g = c.benchmark_group("trace_ring");
    g.bench_function("push", |b| {
        let mut e = Event { kind: Kind::Send.code(), peer: 1, tag: 5, bytes: 8, ..Default::default() };
        b.iter(|| {
            e.t0 += 1;
            ring.lock().expect("lock").push(std::hint::black_box(&e));
        })
    });
    g.bench_function("span", |b| {
        b.iter(|| {
            let t0 = now_ns();
            let t1 = now_ns();
            let e = Event { t0, dur: t1 - t0, kind: Kind::Send.code(), peer: 1, tag: 5, bytes: 8, ..Default::default() };
            ring.lock().expect("lock").push(std::hint::black_box(&e));
        })
    });
    g.bench_function("clock", |b| b.iter(now_ns));
    g.finish();
    drop(ring);
    let _ = std::fs::remove_file(&path);
}

criterion_group!(benches, bench);
criterion_main!(benches);
