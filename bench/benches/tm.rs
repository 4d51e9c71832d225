//! Soft TM-SRQ micro-benchmarks ([`TmSrq`]).
//!
//! - `tm/unexpected_eager8`: an 8-byte eager message arrives with an empty matching list: it
//!   lands in an SRQ buffer; the benchmark polls its completion and reposts the buffer.
//! - `tm/add_match/D`: ADD of an exact entry (signaled), its completion polled, then the
//!   matching 8-byte eager arrival and its completion polled, with `D` non-matching exact
//!   entries already in the list.

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use tmpi_transport::tm::{Arrival, OpsWr, TmCap, TmCaps, TmSrq, WcOpcode};
use tmpi_transport::wire::{TmOp, Tmh};

const DEPTHS: [usize; 3] = [1, 64, 1024];
/// Tag of the measured message; fill entries use `FILL_TAG0 + i`.
const TAG: u64 = 0x42;
const FILL_TAG0: u64 = 0x1_0000;
const SRQ_BUF: usize = 4096;

/// An eager message: TMH then 8 payload bytes.
fn eager8(tag: u64) -> Vec<u8> {
    let mut msg = Tmh { op: TmOp::Eager, app_ctx: 5, tag }.to_bytes().to_vec();
    msg.extend_from_slice(&0x0123_4567_89ab_cdef_u64.to_le_bytes());
    msg
}

fn unexpected(c: &mut Criterion) {
    let mut srq = TmSrq::new(TmCap { max_num_tags: 1, max_ops: 16, max_wr: 64 }).expect("create TM-SRQ");
    for i in 0..64 {
        srq.post_srq_recv(i, SRQ_BUF).expect("post SRQ buffer");
    }
    let msg = eager8(TAG);
    c.bench_function("tm/unexpected_eager8", |b| {
        b.iter(|| {
            let Ok(Arrival::Place(p)) = srq.arrive(3, black_box(&msg)) else { panic!("unexpected eager message not placed") };
            black_box(p);
            let wc = srq.poll_cq().expect("unexpected completion");
            assert!(wc.is_unexpected());
            srq.post_srq_recv(wc.wr_id, SRQ_BUF).expect("repost SRQ buffer");
        })
    });
}

fn add_match(c: &mut Criterion) {
    let mut g = c.benchmark_group("tm/add_match");
    let msg = eager8(TAG);
    for d in DEPTHS {
        let tags = u32::try_from(d + 1).expect("depth fits u32");
        // The default device lists 1023 entries; model a larger one for the deepest case.
        let caps = TmCaps { max_num_tags: tags.max(TmCaps::default().max_num_tags), ..TmCaps::default() };
        let mut srq = TmSrq::with_caps(caps, TmCap { max_num_tags: tags, max_ops: 64, max_wr: 16 }).expect("create TM-SRQ");
        for i in 0..d {
            let wr = OpsWr::add(i as u64, FILL_TAG0 + i as u64, u64::MAX, 1_000_000 + i as u64, 64, 0, true);
            srq.post_srq_op(&wr).expect("fill ADD");
            assert_eq!(srq.poll_cq().expect("fill ADD completion").opcode, WcOpcode::TmAdd);
        }
        assert_eq!(srq.tags_listed(), d);
        g.bench_with_input(BenchmarkId::from_parameter(d), &d, |b, _| {
            b.iter(|| {
                let wr = OpsWr::add(7, black_box(TAG), u64::MAX, 99, 64, 0, true);
                srq.post_srq_op(&wr).expect("ADD");
                let add = srq.poll_cq().expect("ADD completion");
                debug_assert_eq!(add.opcode, WcOpcode::TmAdd);
                let Ok(Arrival::Place(p)) = srq.arrive(3, black_box(&msg)) else { panic!("matched message not placed") };
                black_box(p);
                let wc = srq.poll_cq().expect("receive completion");
                assert_eq!(wc.wr_id, 99, "message went to the wrong buffer");
                black_box(wc);
            })
        });
        assert_eq!(srq.tags_listed(), d, "list depth drifted");
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(20).measurement_time(Duration::from_secs(1)).warm_up_time(Duration::from_millis(300));
    targets = unexpected, add_match
}
criterion_main!(benches);
