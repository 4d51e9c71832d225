//! Wire header and shared-memory ring micro-benchmarks.
//!
//! - `wire/tmh_encode`, `wire/tmh_decode`: one Tag Matching Header.
//! - `shm_ring/send_poll/N`: one `N`-byte packet through a shared-memory ring: rank 0 sends
//!   it ([`ShmFabric::try_send`]), rank 1 polls it out; both ends live in this process.

use std::hint::black_box;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use tmpi_transport::fabric::PKT_WHOLE;
use tmpi_transport::shm::ShmFabric;
use tmpi_transport::wire::{TmOp, Tmh, TMH_LEN};

fn tmh(c: &mut Criterion) {
    let h = Tmh { op: TmOp::Eager, app_ctx: 0xdead_beef, tag: 0x0123_4567_89ab_cdef };
    c.bench_function("wire/tmh_encode", |b| {
        let mut out = [0u8; TMH_LEN];
        b.iter(|| {
            black_box(&h).encode(&mut out);
            black_box(&out);
        })
    });
    let bytes = h.to_bytes();
    c.bench_function("wire/tmh_decode", |b| b.iter(|| black_box(Tmh::decode(black_box(&bytes)).expect("decode"))));
}

/// A segment name unlikely to collide: pid and the clock's nanoseconds.
fn segment_name() -> String {
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
    format!("tmpi-bench-{:x}-{:x}", std::process::id(), nanos as u64)
}

fn ring(c: &mut Criterion) {
    let name = segment_name();
    let mut tx = ShmFabric::create(&name, 0, 2, 65536).expect("create shm segment");
    let rx = ShmFabric::open(&name, 1, 2);
    // Unlink before anything can fail, so no name is left behind in /dev/shm.
    tx.unlink().expect("unlink shm segment");
    let mut rx = rx.expect("open shm segment");
    let mut g = c.benchmark_group("shm_ring/send_poll");
    for len in [8usize, 1024] {
        let bytes = vec![0x5au8; len];
        g.throughput(Throughput::Bytes(len as u64));
        g.bench_with_input(BenchmarkId::from_parameter(len), &len, |b, _| {
            b.iter(|| {
                let sent = tx.try_send(1, PKT_WHOLE, len as u64, &[black_box(&bytes)]).expect("send");
                assert!(sent, "ring full with nothing outstanding");
                let mut got = 0;
                let n = rx
                    .poll(|p| {
                        got = black_box(p.data).len();
                        true
                    })
                    .expect("poll");
                assert_eq!((n, got), (1, len), "packet not delivered whole");
            })
        });
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(20).measurement_time(Duration::from_secs(1)).warm_up_time(Duration::from_millis(300));
    targets = tmh, ring
}
criterion_main!(benches);
