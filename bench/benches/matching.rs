//! Tag matching micro-benchmarks: one exact receive posted and then matched by its message,
//! with `D` non-matching entries already in the matcher, for the runtime's [`SwMatcher`] and
//! the linear [`RefMatcher`].
//!
//! Scenarios (`D` = 1, 64, 1024):
//! - `posted_exact`: `D` exact receives from another source, each on its own tag;
//! - `posted_wild`: `D` `ANY_SOURCE` receives on another tag (older than the measured receive,
//!   so an arrival must look past them);
//! - `unexpected`: `D` unexpected messages from another source, each on its own tag.
//!
//! - `exact_vs_any_source` (`D` = 0, 64, 1024, 4096): `D` `ANY_SOURCE` receives, each on its own
//!   tag that is never sent, posted before the measured exact receive. An arrival must not pay
//!   for wildcard receives that cannot match it (issue 13, item 4).
//!
//! Each iteration is the steady state: post the matching receive (it queues), deliver the
//! message (it matches that receive), so the matcher holds exactly the `D` entries again.

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use tmpi::matching::{encode_tag, recv_key, Arrived, Matcher, Posted, RefMatcher, SwMatcher};

/// Context id of every key.
const CTX: u32 = 3;
/// Source and tag of the measured pair.
const SRC: u32 = 0;
const TAG: u32 = 7;
/// Source of the non-matching exact entries (their tags are `FILL_TAG0 + i`).
const OTHER_SRC: u32 = 1;
const FILL_TAG0: u32 = 1000;
/// Tag of the non-matching wildcard receives.
const WILD_TAG: u32 = 9;

const DEPTHS: [usize; 3] = [1, 64, 1024];

#[derive(Clone, Copy)]
enum Fill {
    PostedExact,
    PostedWild,
    Unexpected,
    AnySourceOtherTags,
}

impl Fill {
    fn name(self) -> &'static str {
        match self {
            Fill::PostedExact => "posted_exact",
            Fill::PostedWild => "posted_wild",
            Fill::Unexpected => "unexpected",
            Fill::AnySourceOtherTags => "exact_vs_any_source",
        }
    }

    fn depths(self) -> &'static [usize] {
        match self {
            Fill::AnySourceOtherTags => &[0, 64, 1024, 4096],
            _ => &DEPTHS,
        }
    }
}

/// Puts `d` entries of kind `fill` into `m`, none of which matches the measured pair.
fn fill<T: Matcher<u64, u64>>(m: &mut T, fill: Fill, d: usize) {
    for i in 0..d {
        let i32_ = u32::try_from(i).expect("depth fits u32");
        match fill {
            Fill::PostedExact => {
                let (t, mask) = recv_key(CTX, Some(OTHER_SRC), Some(FILL_TAG0 + i32_));
                assert!(matches!(m.post(t, mask, i as u64), Posted::Queued(_)), "fill receive matched");
            }
            Fill::PostedWild => {
                let (t, mask) = recv_key(CTX, None, Some(WILD_TAG));
                assert!(matches!(m.post(t, mask, i as u64), Posted::Queued(_)), "fill receive matched");
            }
            Fill::AnySourceOtherTags => {
                let (t, mask) = recv_key(CTX, None, Some(FILL_TAG0 + i32_));
                assert!(matches!(m.post(t, mask, i as u64), Posted::Queued(_)), "fill receive matched");
            }
            Fill::Unexpected => {
                let k = encode_tag(CTX, OTHER_SRC, FILL_TAG0 + i32_);
                assert!(matches!(m.arrive(k, i as u64), Arrived::Unexpected), "fill message matched");
            }
        }
    }
    let (p, u) = match fill {
        Fill::Unexpected => (0, d),
        _ => (d, 0),
    };
    assert_eq!((m.posted_len(), m.unexpected_len()), (p, u));
}

/// One post + arrive pair that must match each other.
#[inline]
fn pair<T: Matcher<u64, u64>>(m: &mut T, rtag: u64, rmask: u64, key: u64) {
    match m.post(black_box(rtag), black_box(rmask), 1) {
        Posted::Queued(_) => {}
        Posted::Matched(..) => panic!("measured receive matched a fill message"),
    }
    match m.arrive(black_box(key), 2) {
        Arrived::Matched(_, r, msg) => {
            black_box((r, msg));
        }
        Arrived::Unexpected => panic!("measured message did not match its receive"),
    }
}

fn bench_one<T: Matcher<u64, u64>>(c: &mut Criterion, matcher: &str, new: fn() -> T) {
    let (rtag, rmask) = recv_key(CTX, Some(SRC), Some(TAG));
    let key = encode_tag(CTX, SRC, TAG);
    for kind in [Fill::PostedExact, Fill::PostedWild, Fill::Unexpected, Fill::AnySourceOtherTags] {
        let mut g = c.benchmark_group(format!("matching/{matcher}/{}", kind.name()));
        for &d in kind.depths() {
            let mut m = new();
            fill(&mut m, kind, d);
            g.bench_with_input(BenchmarkId::from_parameter(d), &d, |b, _| b.iter(|| pair(&mut m, rtag, rmask, key)));
            // The pair left the matcher as it found it.
            let (p, u) = (m.posted_len(), m.unexpected_len());
            assert_eq!(p + u, d, "matcher depth drifted");
        }
        g.finish();
    }
}

fn matching(c: &mut Criterion) {
    bench_one(c, "sw", SwMatcher::<u64, u64>::new);
    bench_one(c, "ref", RefMatcher::<u64, u64>::new);
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(20).measurement_time(Duration::from_secs(1)).warm_up_time(Duration::from_millis(300));
    targets = matching
}
criterion_main!(benches);
