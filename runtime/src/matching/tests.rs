//! Tests of the match key and of both matchers: one suite of MPI-rule cases run against each
//! matcher, a differential proptest (reference vs fast, every outcome compared), and checks of
//! the fast matcher's cost claims (steps scanned, no growth in steady state).

use super::sw::Tuning;
use super::*;
use proptest::prelude::*;

/// Tiny knobs: every lazy structure compacts and every empty bucket is swept almost at once.
const TINY: Tuning = Tuning { empty_floor: 1, list_slack: 0, spare_max: 2, spare_capacity: 1 };

fn sw() -> SwMatcher<u32, u32> {
    SwMatcher::new()
}

fn sw_tiny() -> SwMatcher<u32, u32> {
    SwMatcher::with_tuning(TINY)
}

fn reference() -> RefMatcher<u32, u32> {
    RefMatcher::new()
}

fn queued(p: Posted<u32, u32>) -> RecvId {
    match p {
        Posted::Queued(id) => id,
        other => panic!("expected Queued, got {other:?}"),
    }
}

// ---------------------------------------------------------------------------------------------
// The match key.

#[test]
#[allow(clippy::unusual_byte_groupings)] // grouped by field: ctx (20 bits), src (20), tag (24)
fn key_layout_round_trips() {
    let k = encode_tag(0xabcde, 0x12345, 0xfedcba);
    assert_eq!(k, 0xabcde_12345_fedcba);
    assert_eq!((decode_ctx(k), decode_src(k), decode_tag(k)), (0xabcde, 0x12345, 0xfedcba));
    let k = encode_tag(MAX_CTX, MAX_SRC, MAX_TAG);
    assert_eq!(k, u64::MAX);
    assert_eq!(encode_tag(0, 0, 0), 0);
    assert_eq!(encode_tag(1, 0, 0), 1 << 44);
    assert_eq!(encode_tag(0, 1, 0), 1 << 24);
    assert_eq!(encode_tag(0, 0, 1), 1);
    assert_eq!(MAX_TAG, crate::TAG_UB);
}

#[test]
fn key_fields_truncate_and_checked_form_refuses() {
    // Out-of-range values never spill into a neighbouring field.
    assert_eq!(encode_tag(0, 0, MAX_TAG + 1), 0);
    assert_eq!(encode_tag(0, MAX_SRC + 2, 0), encode_tag(0, 1, 0));
    assert_eq!(decode_ctx(encode_tag(0, u32::MAX, u32::MAX)), 0);
    assert_eq!(try_encode_tag(1, 2, 3), Some(encode_tag(1, 2, 3)));
    assert_eq!(try_encode_tag(MAX_CTX + 1, 0, 0), None);
    assert_eq!(try_encode_tag(0, MAX_SRC + 1, 0), None);
    assert_eq!(try_encode_tag(0, 0, MAX_TAG + 1), None);
    assert_eq!(try_encode_tag(MAX_CTX, MAX_SRC, MAX_TAG), Some(u64::MAX));
}

#[test]
fn recv_id_packs_seq_and_form_in_one_word() {
    // `RecvPhase::Posted` in every engine request slot holds one: it must stay a `u64`.
    assert_eq!(std::mem::size_of::<RecvId>(), 8);
    let id = RecvId::new(123_456, FORM_RAW);
    assert_eq!((id.seq(), id.form()), (123_456, FORM_RAW));
    assert!(RecvId::new(5, FORM_RAW) < RecvId::new(6, 0), "post order first");
    assert_eq!(RecvId::of_mask(9, FULL_MASK).form(), FORM_EXACT);
    for (c, mask) in CLASS_MASKS.into_iter().enumerate() {
        assert_eq!(RecvId::of_mask(9, mask).form(), c as u64);
    }
    assert_eq!(RecvId::of_mask(9, !1).form(), FORM_RAW);
}

/// CONFORMANCE.md: T1.
#[test]
fn recv_key_masks() {
    assert_eq!(recv_key(3, Some(4), Some(5)), (encode_tag(3, 4, 5), FULL_MASK));
    assert_eq!(recv_key(3, None, Some(5)), (encode_tag(3, 0, 5), CTX_FIELD | TAG_FIELD));
    assert_eq!(recv_key(3, Some(4), None), (encode_tag(3, 4, 0), CTX_FIELD | SRC_FIELD));
    assert_eq!(recv_key(3, None, None), (encode_tag(3, 0, 0), CTX_FIELD));
    assert_eq!(CTX_FIELD | SRC_FIELD | TAG_FIELD, FULL_MASK);
    assert_eq!(CTX_FIELD & SRC_FIELD | SRC_FIELD & TAG_FIELD | CTX_FIELD & TAG_FIELD, 0);
    // What a wildcard key matches.
    let (t, m) = recv_key(3, None, Some(5));
    assert_eq!(encode_tag(3, 99, 5) & m, t & m);
    assert_ne!(encode_tag(3, 99, 6) & m, t & m);
    assert_ne!(encode_tag(4, 99, 5) & m, t & m);
}

#[test]
fn overlap_rule() {
    let a = recv_key(1, None, Some(5));
    let b = recv_key(1, Some(2), None);
    let c = recv_key(1, Some(2), Some(6));
    let d = recv_key(2, None, None);
    assert!(keys_overlap(a.0, a.1, b.0, b.1));
    assert!(!keys_overlap(a.0, a.1, c.0, c.1));
    assert!(keys_overlap(b.0, b.1, c.0, c.1));
    assert!(!keys_overlap(a.0, a.1, d.0, d.1));
    // Bits outside the masks are ignored.
    assert!(keys_overlap(a.0 | SRC_FIELD, a.1, a.0, a.1));
}

// ---------------------------------------------------------------------------------------------
// One suite of MPI rules, run against every matcher.

fn exact_posted_then_arrival<T: Matcher<u32, u32>>(mut m: T) {
    let (t, k) = recv_key(1, Some(2), Some(3));
    let id = queued(m.post(t, k, 10));
    assert_eq!(m.posted_len(), 1);
    assert_eq!(m.arrive(encode_tag(1, 3, 3), 100), Arrived::Unexpected);
    assert_eq!(m.arrive(encode_tag(1, 2, 4), 101), Arrived::Unexpected);
    assert_eq!(m.arrive(encode_tag(1, 2, 3), 102), Arrived::Matched(id, 10, 102));
    assert_eq!((m.posted_len(), m.unexpected_len()), (0, 2));
}

/// CONFORMANCE.md: T5.
fn unexpected_then_post<T: Matcher<u32, u32>>(mut m: T) {
    assert_eq!(m.arrive(encode_tag(1, 2, 3), 100), Arrived::Unexpected);
    let (t, k) = recv_key(1, Some(2), Some(4));
    queued(m.post(t, k, 10));
    let (t, k) = recv_key(1, Some(2), Some(3));
    assert_eq!(m.post(t, k, 11), Posted::Matched(11, 100));
    assert_eq!((m.posted_len(), m.unexpected_len()), (1, 0));
}

/// CONFORMANCE.md: T2.
fn non_overtaking<T: Matcher<u32, u32>>(mut m: T) {
    // Unexpected side: same source, same tag, received in arrival order.
    for i in 0..3 {
        assert_eq!(m.arrive(encode_tag(1, 3, 5), 100 + i), Arrived::Unexpected);
    }
    let (t, k) = recv_key(1, Some(3), Some(5));
    for i in 0..3 {
        assert_eq!(m.post(t, k, i), Posted::Matched(i, 100 + i));
    }
    // Same source, different tags, received with ANY_TAG: arrival order again.
    assert_eq!(m.arrive(encode_tag(1, 3, 6), 200), Arrived::Unexpected);
    assert_eq!(m.arrive(encode_tag(1, 3, 5), 201), Arrived::Unexpected);
    let (t, k) = recv_key(1, Some(3), None);
    assert_eq!(m.post(t, k, 7), Posted::Matched(7, 200));
    assert_eq!(m.post(t, k, 8), Posted::Matched(8, 201));
    // Posted side: receives for the same key are satisfied in post order.
    let (t, k) = recv_key(1, Some(3), Some(5));
    let a = queued(m.post(t, k, 20));
    let b = queued(m.post(t, k, 21));
    assert!(a < b);
    assert_eq!(m.arrive(encode_tag(1, 3, 5), 300), Arrived::Matched(a, 20, 300));
    assert_eq!(m.arrive(encode_tag(1, 3, 5), 301), Arrived::Matched(b, 21, 301));
}

/// CONFORMANCE.md: T3.
fn oldest_unexpected_wins<T: Matcher<u32, u32>>(mut m: T) {
    assert_eq!(m.arrive(encode_tag(1, 2, 1), 100), Arrived::Unexpected);
    assert_eq!(m.arrive(encode_tag(1, 1, 1), 101), Arrived::Unexpected);
    assert_eq!(m.arrive(encode_tag(1, 2, 9), 102), Arrived::Unexpected);
    assert_eq!(m.arrive(encode_tag(1, 1, 2), 103), Arrived::Unexpected);
    let (t, k) = recv_key(1, None, Some(1));
    assert_eq!(m.post(t, k, 0), Posted::Matched(0, 100));
    let (t, k) = recv_key(1, Some(1), None);
    assert_eq!(m.post(t, k, 1), Posted::Matched(1, 101));
    let (t, k) = recv_key(1, None, None);
    assert_eq!(m.post(t, k, 2), Posted::Matched(2, 102));
    let (t, k) = recv_key(1, Some(1), Some(2));
    assert_eq!(m.post(t, k, 3), Posted::Matched(3, 103));
    assert_eq!(m.unexpected_len(), 0);
}

/// CONFORMANCE.md: T3.
fn earliest_posted_wins<T: Matcher<u32, u32>>(mut m: T) {
    // Wildcard posted before exact: the wildcard gets the first message.
    let (t, k) = recv_key(1, None, Some(4));
    let w = queued(m.post(t, k, 0));
    let (t, k) = recv_key(1, Some(2), Some(4));
    let e = queued(m.post(t, k, 1));
    assert_eq!(m.arrive(encode_tag(1, 2, 4), 100), Arrived::Matched(w, 0, 100));
    assert_eq!(m.arrive(encode_tag(1, 2, 4), 101), Arrived::Matched(e, 1, 101));
    // Exact posted before wildcard: the exact one wins.
    let (t, k) = recv_key(1, Some(2), Some(4));
    let e = queued(m.post(t, k, 2));
    let (t, k) = recv_key(1, None, None);
    let w = queued(m.post(t, k, 3));
    assert_eq!(m.arrive(encode_tag(1, 2, 4), 102), Arrived::Matched(e, 2, 102));
    assert_eq!(m.arrive(encode_tag(1, 2, 4), 103), Arrived::Matched(w, 3, 103));
    // Among wildcards, the first matching one in post order; non-matching ones are skipped.
    let (t, k) = recv_key(1, None, Some(8));
    let w8 = queued(m.post(t, k, 4));
    let (t, k) = recv_key(1, Some(5), None);
    let w5 = queued(m.post(t, k, 5));
    let (t, k) = recv_key(1, None, None);
    let wa = queued(m.post(t, k, 6));
    assert_eq!(m.arrive(encode_tag(1, 5, 1), 104), Arrived::Matched(w5, 5, 104));
    assert_eq!(m.arrive(encode_tag(1, 5, 1), 105), Arrived::Matched(wa, 6, 105));
    assert_eq!(m.arrive(encode_tag(1, 5, 8), 106), Arrived::Matched(w8, 4, 106));
    assert_eq!(m.posted_len(), 0);
}

/// CONFORMANCE.md: T1.
fn contexts_are_isolated<T: Matcher<u32, u32>>(mut m: T) {
    let (t, k) = recv_key(1, None, None);
    let id = queued(m.post(t, k, 0));
    assert_eq!(m.arrive(encode_tag(2, 0, 0), 100), Arrived::Unexpected);
    assert_eq!(m.arrive(encode_tag(0, 0, 0), 101), Arrived::Unexpected);
    assert!(m.probe(t, k).is_none());
    let (t2, k2) = recv_key(2, None, None);
    assert_eq!(m.probe(t2, k2), Some((encode_tag(2, 0, 0), &100)));
    assert_eq!(m.arrive(encode_tag(1, 7, 7), 102), Arrived::Matched(id, 0, 102));
}

fn cancel_rules<T: Matcher<u32, u32>>(mut m: T) {
    let (t, k) = recv_key(1, Some(2), Some(3));
    let (tw, kw) = recv_key(1, None, Some(3));
    let a = queued(m.post(t, k, 0));
    let w = queued(m.post(tw, kw, 1));
    let b = queued(m.post(t, k, 2));
    let w2 = queued(m.post(tw, kw, 3));
    // The tag must be the receive's (bits outside its mask do not matter).
    assert_eq!(m.cancel(a, tw), None, "wrong tag");
    assert_eq!(m.cancel(a, t ^ 1), None, "wrong tag");
    assert_eq!(m.cancel(w, encode_tag(1, 0, 4)), None, "wrong tag");
    assert_eq!(m.cancel(w, encode_tag(2, 0, 3)), None, "wrong context");
    assert_eq!(m.posted_len(), 4);
    assert_eq!(m.cancel(a, t), Some(0));
    assert_eq!(m.cancel(a, t), None);
    assert_eq!(m.cancel(w, tw | SRC_FIELD), Some(1));
    assert_eq!(m.cancel(w, tw), None);
    assert_eq!(m.cancel(RecvId::new(w2.seq() + 1, FORM_EXACT), t), None, "never issued");
    assert_eq!(m.cancel(RecvId::new(b.seq(), 0), t), None, "not its form");
    assert_eq!(m.cancel(RecvId(u64::MAX), t), None);
    assert_eq!(m.cancel(RecvId(u64::MAX), tw), None);
    assert_eq!(m.posted_len(), 2);
    // The cancelled receives no longer match; the rest keep their order.
    assert_eq!(m.arrive(encode_tag(1, 2, 3), 100), Arrived::Matched(b, 2, 100));
    assert_eq!(m.cancel(b, t), None, "already matched");
    assert_eq!(m.arrive(encode_tag(1, 2, 3), 101), Arrived::Matched(w2, 3, 101));
    assert_eq!(m.arrive(encode_tag(1, 2, 3), 102), Arrived::Unexpected);
    assert_eq!(m.posted_len(), 0);
    // A receive that matched at once has an id too, but it is not queued.
    assert_eq!(m.post(t, k, 4), Posted::Matched(4, 102));
    assert_eq!(m.cancel(RecvId::new(w2.seq() + 1, FORM_EXACT), t), None);
    // A raw receive is cancelled by its tag too.
    let r = queued(m.post(encode_tag(1, 2, 0b100), !1, 5));
    assert_eq!(m.cancel(r, encode_tag(1, 2, 0b110)), None, "wrong tag");
    assert_eq!(m.cancel(r, encode_tag(1, 2, 0b101)), Some(5));
    assert_eq!(m.cancel(r, encode_tag(1, 2, 0b100)), None);
    assert_eq!(m.posted_len(), 0);
}

/// Receives cancelled from the middle of their queues, of every form, in an order that is
/// neither the post order nor its reverse; the others still match in post order.
fn cancel_from_the_middle<T: Matcher<u32, u32>>(mut m: T) {
    let forms = [recv_key(1, Some(2), Some(3)), recv_key(1, None, Some(3)), recv_key(1, Some(2), None), recv_key(1, None, None)];
    let raw = (encode_tag(1, 2, 2), !1);
    let mut ids = Vec::new();
    for i in 0..40u32 {
        let (t, k) = if i % 5 == 4 { raw } else { forms[(i % 5) as usize] };
        ids.push((queued(m.post(t, k, i)), t, i));
    }
    // Every third one, from the middle outwards.
    let mut gone: Vec<_> = ids.iter().copied().filter(|&(_, _, i)| i % 3 == 1).collect();
    gone.sort_by_key(|&(_, _, i)| (i as i32 - 20).abs());
    for &(id, t, i) in &gone {
        assert_eq!(m.cancel(id, t), Some(i));
        assert_eq!(m.cancel(id, t), None);
    }
    assert_eq!(m.posted_len(), 40 - gone.len());
    for &(_, _, i) in ids.iter().filter(|&&(_, _, i)| i % 3 != 1) {
        let got = m.arrive(encode_tag(1, 2, 3), 100 + i);
        assert!(matches!(got, Arrived::Matched(_, r, _) if r == i), "receive {i}: {got:?}");
    }
    assert_eq!(m.posted_len(), 0);
}

fn probe_family<T: Matcher<u32, u32>>(mut m: T) {
    let ka = encode_tag(1, 1, 1);
    let kb = encode_tag(1, 2, 1);
    assert_eq!(m.arrive(ka, 100), Arrived::Unexpected);
    assert_eq!(m.arrive(kb, 101), Arrived::Unexpected);
    let (t, k) = recv_key(1, None, Some(1));
    assert_eq!(m.probe(t, k), Some((ka, &100)));
    assert_eq!(m.probe(t, k), Some((ka, &100)), "probe does not remove");
    assert_eq!(m.unexpected_len(), 2);
    let (te, ke) = recv_key(1, Some(2), Some(1));
    assert_eq!(m.probe(te, ke), Some((kb, &101)));
    let (tn, kn) = recv_key(1, Some(3), None);
    assert!(m.probe(tn, kn).is_none());
    assert!(m.probe_mut(tn, kn).is_none());
    assert!(m.take_probed(tn, kn).is_none());
    if let Some((key, v)) = m.probe_mut(t, k) {
        assert_eq!(key, ka);
        *v += 1000;
    }
    if let Some((key, v)) = m.probe_mut(te, ke) {
        assert_eq!(key, kb);
        *v += 2000;
    }
    assert_eq!(m.take_probed(t, k), Some((ka, 1100)));
    assert_eq!(m.take_probed(t, k), Some((kb, 2101)));
    assert_eq!(m.take_probed(t, k), None);
    assert_eq!(m.unexpected_len(), 0);
}

fn posted_queries<T: Matcher<u32, u32>>(mut m: T) {
    assert!(!m.has_posted_match(encode_tag(1, 2, 3)));
    let (t, k) = recv_key(1, None, None);
    assert!(!m.earlier_posted_overlaps(t, k));
    let (te, ke) = recv_key(1, Some(2), Some(3));
    let e = queued(m.post(te, ke, 0));
    assert!(m.has_posted_match(encode_tag(1, 2, 3)));
    assert!(!m.has_posted_match(encode_tag(1, 2, 4)));
    assert!(m.earlier_posted_overlaps(te, ke));
    assert!(m.earlier_posted_overlaps(t, k));
    let (tt, kt) = recv_key(1, None, Some(3));
    assert!(m.earlier_posted_overlaps(tt, kt));
    let (tx, kx) = recv_key(1, None, Some(4));
    assert!(!m.earlier_posted_overlaps(tx, kx));
    let (to, ko) = recv_key(2, Some(2), Some(3));
    assert!(!m.earlier_posted_overlaps(to, ko));
    assert_eq!(m.cancel(e, te), Some(0));
    let (tw, kw) = recv_key(1, Some(5), None);
    queued(m.post(tw, kw, 1));
    assert!(m.has_posted_match(encode_tag(1, 5, 77)));
    assert!(!m.has_posted_match(encode_tag(1, 6, 77)));
    assert!(m.earlier_posted_overlaps(encode_tag(1, 5, 9), FULL_MASK));
    assert!(!m.earlier_posted_overlaps(encode_tag(1, 6, 9), FULL_MASK));
    assert!(m.earlier_posted_overlaps(tt, kt));
    assert!(!m.earlier_posted_overlaps(to, ko));
}

fn ids_are_post_sequence_numbers<T: Matcher<u32, u32>>(mut m: T) {
    let (t, k) = recv_key(1, Some(1), Some(1));
    let a = queued(m.post(t, k, 0));
    assert_eq!((a.seq(), a.form()), (0, FORM_EXACT));
    assert_eq!(m.arrive(encode_tag(1, 2, 2), 100), Arrived::Unexpected);
    let (t2, k2) = recv_key(1, None, Some(2));
    assert_eq!(m.post(t2, k2, 1), Posted::Matched(1, 100));
    let b = queued(m.post(t2, k2, 2));
    assert_eq!((b.seq(), b.form()), (2, 0));
    let c = queued(m.post(t, k, 3));
    assert_eq!((c.seq(), c.form()), (3, FORM_EXACT));
    let (t3, k3) = recv_key(1, Some(1), None);
    let d = queued(m.post(t3, k3, 4));
    assert_eq!((d.seq(), d.form()), (4, 1));
    let (t4, k4) = recv_key(1, None, None);
    let e = queued(m.post(t4, k4, 5));
    assert_eq!((e.seq(), e.form()), (5, 2));
    let f = queued(m.post(t4, 1, 6));
    assert_eq!((f.seq(), f.form()), (6, FORM_RAW));
    assert!(a < b && b < c && c < d && d < e && e < f, "ids compare in post order");
}

fn raw_masks<T: Matcher<u32, u32>>(mut m: T) {
    // Any mask works, including one that ignores the context (internal use only).
    assert_eq!(m.arrive(encode_tag(3, 1, 1), 100), Arrived::Unexpected);
    assert_eq!(m.arrive(encode_tag(1, 1, 2), 101), Arrived::Unexpected);
    assert_eq!(m.post(0, 0, 0), Posted::Matched(0, 100));
    // Bits of the receive tag outside its mask are ignored.
    assert_eq!(m.post(encode_tag(1, 9, 2), CTX_FIELD | TAG_FIELD, 1), Posted::Matched(1, 101));
    let id = queued(m.post(encode_tag(5, 9, 0b1010), !1, 2));
    assert_eq!(m.arrive(encode_tag(5, 9, 0b1011), 102), Arrived::Matched(id, 2, 102));
}

/// A long queue of receives and messages that match nothing changes no outcome, and (checked
/// for the fast matcher in `exact_path_is_o1`) costs the exact path nothing.
fn deep_unrelated_queues<T: Matcher<u32, u32>>(mut fresh: T, mut loaded: T) {
    const N: u32 = 10_000;
    for i in 0..N {
        queued(loaded.post(encode_tag(9, i % 1000, i / 1000), FULL_MASK, 1_000_000 + i));
        assert_eq!(loaded.arrive(encode_tag(8, i % 1000, i / 1000), 1_000_000 + i), Arrived::Unexpected);
    }
    let offset = u64::from(N);
    let script = |m: &mut T, off: u64| {
        let mut out = Vec::new();
        let (t, k) = recv_key(1, Some(2), Some(3));
        out.push(format!("{:?}", m.post(t, k, 1).map_id(off)));
        out.push(format!("{:?}", m.arrive(encode_tag(1, 2, 3), 10).map_id(off)));
        out.push(format!("{:?}", m.arrive(encode_tag(1, 2, 3), 11).map_id(off)));
        out.push(format!("{:?}", m.post(t, k, 2).map_id(off)));
        out.push(format!("{:?}", m.probe(encode_tag(1, 2, 3), FULL_MASK)));
        out.push(format!("{:?}", m.has_posted_match(encode_tag(1, 2, 3))));
        out.push(format!("{:?}", m.earlier_posted_overlaps(t, k)));
        let (tw, kw) = recv_key(1, None, None);
        out.push(format!("{:?}", m.arrive(encode_tag(1, 4, 4), 12).map_id(off)));
        out.push(format!("{:?}", m.post(tw, kw, 3).map_id(off)));
        out.push(format!("{:?}", m.post(tw, kw, 4).map_id(off)));
        out.push(format!("{:?}", m.arrive(encode_tag(1, 5, 5), 13).map_id(off)));
        out
    };
    let a = script(&mut fresh, 0);
    let b = script(&mut loaded, offset);
    assert_eq!(a, b);
    assert_eq!(fresh.posted_len() + N as usize, loaded.posted_len());
    assert_eq!(fresh.unexpected_len() + N as usize, loaded.unexpected_len());
}

/// Ids relative to a base (`off` earlier posts), so runs with different numbers of earlier
/// posts compare equal.
trait MapId {
    fn map_id(self, off: u64) -> Self;
}

fn id_minus(id: RecvId, off: u64) -> RecvId {
    RecvId::new(id.seq() - off, id.form())
}

impl MapId for Posted<u32, u32> {
    fn map_id(self, off: u64) -> Self {
        match self {
            Posted::Queued(id) => Posted::Queued(id_minus(id, off)),
            p => p,
        }
    }
}

impl MapId for Arrived<u32, u32> {
    fn map_id(self, off: u64) -> Self {
        match self {
            Arrived::Matched(id, r, m) => Arrived::Matched(id_minus(id, off), r, m),
            a => a,
        }
    }
}

macro_rules! suite {
    ($($name:ident),* $(,)?) => {
        mod suite_ref {
            use super::*;
            $( #[test] fn $name() { super::$name(reference()); } )*
            #[test] fn deep_unrelated_queues() { super::deep_unrelated_queues(reference(), reference()); }
        }
        mod suite_sw {
            use super::*;
            $( #[test] fn $name() { super::$name(sw()); } )*
            #[test] fn deep_unrelated_queues() { super::deep_unrelated_queues(sw(), sw()); }
        }
        mod suite_sw_tiny {
            use super::*;
            $( #[test] fn $name() { super::$name(sw_tiny()); } )*
            #[test] fn deep_unrelated_queues() { super::deep_unrelated_queues(sw_tiny(), sw_tiny()); }
        }
    };
}

suite!(
    exact_posted_then_arrival,
    unexpected_then_post,
    non_overtaking,
    oldest_unexpected_wins,
    earliest_posted_wins,
    contexts_are_isolated,
    cancel_rules,
    cancel_from_the_middle,
    probe_family,
    posted_queries,
    ids_are_post_sequence_numbers,
    raw_masks,
);

// ---------------------------------------------------------------------------------------------
// Cost claims of the fast matcher.

/// Exact posts and arrivals scan nothing, however many receives and messages are queued; a
/// wildcard queue newer than the exact receive costs nothing.
#[test]
fn exact_path_is_o1() {
    let mut m = sw();
    let mut ids = Vec::new();
    for i in 0..10_000u32 {
        let t = encode_tag(9, i % 1000, i / 1000);
        ids.push((queued(m.post(t, FULL_MASK, i)), t));
        assert_eq!(m.arrive(encode_tag(8, i % 1000, i / 1000), i), Arrived::Unexpected);
    }
    m.take_steps();
    let k = encode_tag(1, 2, 3);
    let id = queued(m.post(k, FULL_MASK, 1));
    assert_eq!(m.arrive(k, 2), Arrived::Matched(id, 1, 2));
    assert_eq!(m.arrive(k, 3), Arrived::Unexpected);
    assert_eq!(m.post(k, FULL_MASK, 4), Posted::Matched(4, 3));
    assert!(m.probe(encode_tag(8, 5, 5), FULL_MASK).is_some());
    assert_eq!(m.take_probed(encode_tag(8, 5, 5), FULL_MASK), Some((encode_tag(8, 5, 5), 5005)));
    assert_eq!(m.cancel(ids[7].0, ids[7].1), Some(7));
    assert_eq!(m.take_steps(), 0);

    m.check_invariants();

    // 10_000 wildcard receives posted after an exact one: the exact arrival looks at none.
    let mut m = sw();
    let id = queued(m.post(k, FULL_MASK, 5));
    for i in 0..10_000u32 {
        let (t, mask) = recv_key(7, None, Some(i));
        queued(m.post(t, mask, i));
    }
    m.take_steps();
    assert_eq!(m.arrive(k, 6), Arrived::Matched(id, 5, 6));
    assert_eq!(m.take_steps(), 0);
    m.check_invariants();
}

/// Posted wildcard receives of every MPI form that cannot match a message cost its arrival
/// nothing (no scan, whatever their number), and an earlier wildcard receive that can match
/// still beats a later exact one.
#[test]
fn wildcard_posts_are_indexed() {
    const N: u32 = 4096;
    let mut m = sw();
    let mut ids = Vec::new();
    for i in 0..N {
        // ANY_SOURCE with tags never sent, a source never sending with ANY_TAG, ANY_SOURCE with
        // ANY_TAG on another communicator.
        let (t, k) = recv_key(1, None, Some(1000 + i));
        ids.push((queued(m.post(t, k, i)), t));
        let (t, k) = recv_key(1, Some(500 + i), None);
        ids.push((queued(m.post(t, k, i)), t));
        let (t, k) = recv_key(2 + i, None, None);
        ids.push((queued(m.post(t, k, i)), t));
    }
    m.take_steps();
    let key = encode_tag(1, 2, 3);
    let id = queued(m.post(key, FULL_MASK, 7));
    assert!(m.has_posted_match(key));
    assert!(!m.has_posted_match(encode_tag(1, 2, 4)));
    assert!(m.earlier_posted_overlaps(key, FULL_MASK));
    assert!(!m.earlier_posted_overlaps(encode_tag(1, 3, 4), FULL_MASK));
    assert_eq!(m.arrive(key, 8), Arrived::Matched(id, 7, 8));
    assert_eq!(m.arrive(key, 9), Arrived::Unexpected);
    assert_eq!(m.take_steps(), 0, "an exact arrival scanned wildcard receives");
    // Earlier wildcards of each form win over a later exact receive, in post order.
    assert_eq!(m.post(key, FULL_MASK, 10), Posted::Matched(10, 9));
    let (t, k) = recv_key(1, None, Some(3));
    let w_tag = queued(m.post(t, k, 11));
    let (t, k) = recv_key(1, Some(2), None);
    let w_src = queued(m.post(t, k, 12));
    let (t, k) = recv_key(1, None, None);
    let w_any = queued(m.post(t, k, 13));
    let e = queued(m.post(key, FULL_MASK, 14));
    m.take_steps();
    assert_eq!(m.arrive(key, 20), Arrived::Matched(w_tag, 11, 20));
    assert_eq!(m.arrive(key, 21), Arrived::Matched(w_src, 12, 21));
    assert_eq!(m.arrive(key, 22), Arrived::Matched(w_any, 13, 22));
    assert_eq!(m.arrive(key, 23), Arrived::Matched(e, 14, 23));
    assert_eq!(m.take_steps(), 0);
    // Cancelling from the middle of a class queue keeps the others in order.
    let t = encode_tag(1, 9, 1000 + N / 2);
    let mid = 3 * (N / 2) as usize;
    assert_eq!(m.arrive(t, 24), Arrived::Matched(ids[mid].0, N / 2, 24));
    assert_eq!(m.cancel(ids[mid + 1].0, ids[mid + 1].1), Some(N / 2));
    assert_eq!(m.cancel(ids[mid + 1].0, ids[mid + 1].1), None);
    assert_eq!(m.cancel(ids[mid + 2].0, ids[mid + 2].1), Some(N / 2));
    assert_eq!(m.posted_len(), 3 * N as usize - 3);
    m.check_invariants();
}

/// Wildcard posts and probes find the oldest matching unexpected message without passing
/// unrelated ones, once their form's index exists; a probe asks for the index, the next
/// arrival builds it.
#[test]
fn wildcard_unexpected_is_indexed() {
    const N: u32 = 4096;
    let mut m = sw();
    for i in 0..N {
        assert_eq!(m.arrive(encode_tag(1, i % 64, 100 + i), i), Arrived::Unexpected);
    }
    assert_eq!(m.arrive(encode_tag(1, 70, 5), 1), Arrived::Unexpected);
    assert_eq!(m.arrive(encode_tag(1, 71, 5), 2), Arrived::Unexpected);
    assert_eq!(m.ux_indexed(), [false; 3]);
    m.take_steps();
    // Not indexed yet: the probe scans, and asks for the index.
    let (t, k) = recv_key(1, None, Some(5));
    assert_eq!(m.probe(t, k), Some((encode_tag(1, 70, 5), &1)));
    assert!(m.take_steps() >= u64::from(N));
    assert_eq!(m.arrive(encode_tag(1, 72, 5), 3), Arrived::Unexpected);
    assert_eq!(m.ux_indexed(), [true, false, false]);
    m.take_steps();
    assert_eq!(m.probe(t, k), Some((encode_tag(1, 70, 5), &1)));
    assert_eq!(m.post(t, k, 0), Posted::Matched(0, 1));
    assert_eq!(m.post(t, k, 1), Posted::Matched(1, 2));
    assert_eq!(m.take_probed(t, k), Some((encode_tag(1, 72, 5), 3)));
    assert_eq!(m.probe(t, k), None);
    assert_eq!(m.take_steps(), 0);
    // A receive of another form builds its index at once (one pass), then costs nothing.
    let (ts, ks) = recv_key(1, Some(63), None);
    assert_eq!(m.post(ts, ks, 2), Posted::Matched(2, 63));
    m.take_steps();
    assert_eq!(m.post(ts, ks, 3), Posted::Matched(3, 127));
    let (ta, ka) = recv_key(1, None, None);
    assert_eq!(m.post(ta, ka, 4), Posted::Matched(4, 0));
    m.take_steps();
    assert_eq!(m.post(ta, ka, 5), Posted::Matched(5, 1));
    let (tn, kn) = recv_key(2, None, None);
    assert_eq!(m.probe(tn, kn), None);
    assert_eq!(m.take_steps(), 0);
    assert_eq!(m.ux_indexed(), [true; 3]);
    // Exact receives taken out of order leave stale index entries in the middle; they are
    // skipped, counted, and compacted away.
    for i in (2..N).rev().filter(|i| i % 2 == 0) {
        let key = encode_tag(1, i % 64, 100 + i);
        assert_eq!(m.post(key, FULL_MASK, i), Posted::Matched(i, i));
    }
    m.check_invariants();
    assert_eq!(m.unexpected_len(), N as usize / 2 - 3);
    let (t3, k3) = recv_key(1, Some(3), None);
    assert_eq!(m.probe(t3, k3), Some((encode_tag(1, 3, 103), &3)));
    let (t2, k2) = recv_key(1, Some(2), None);
    assert_eq!(m.probe(t2, k2), None);
    assert_eq!(m.take_probed(t2, k2), None);
    m.check_invariants();
}

/// Ping-pong with `ANY_SOURCE` receives (messages both expected and unexpected): after warm-up
/// no structure grows.
#[test]
fn wildcard_steady_state_does_not_grow() {
    let mut m = sw();
    let round = |m: &mut SwMatcher<u32, u32>, r: u32| {
        for tag in 0..8 {
            let (t, k) = recv_key(1, None, Some(tag));
            let (ts, ks) = recv_key(1, Some(tag), None);
            let key = encode_tag(1, r % 4, tag);
            if (r + tag) % 2 == 0 {
                let _ = m.post(t, k, r);
                let _ = m.arrive(key, r);
                let _ = m.post(ts, ks, r);
                let _ = m.arrive(encode_tag(1, tag, r % 3), r);
            } else {
                let _ = m.arrive(key, r);
                let _ = m.post(t, k, r);
                let _ = m.arrive(encode_tag(1, tag, r % 3), r);
                let _ = m.post(ts, ks, r);
            }
        }
    };
    for r in 0..200 {
        round(&mut m, r);
    }
    let before = m.footprint();
    for r in 200..2200 {
        round(&mut m, r);
    }
    assert_eq!(before, m.footprint());
    assert_eq!((m.posted_len(), m.unexpected_len()), (0, 0));
    m.check_invariants();
}

/// Wildcard receives and messages on many keys used once each: empty class queues are swept.
#[test]
fn empty_class_queues_are_bounded() {
    let mut m = sw();
    let (t0, k0) = recv_key(1, None, None);
    assert_eq!(m.arrive(encode_tag(1, 0, 0), 0), Arrived::Unexpected);
    assert_eq!(m.post(t0, k0, 0), Posted::Matched(0, 0));
    for i in 0..50_000u32 {
        let (t, k) = recv_key(1, None, Some(i));
        queued(m.post(t, k, i));
        assert!(matches!(m.arrive(encode_tag(1, 3, i), i), Arrived::Matched(_, r, _) if r == i));
        assert_eq!(m.arrive(encode_tag(1, 4, i), i), Arrived::Unexpected);
        assert_eq!(m.post(t, k, i), Posted::Matched(i, i));
    }
    let f = m.footprint();
    assert!(f.len() < 20_000, "{} footprint entries kept for nothing queued", f.len());
    m.check_invariants();
}

/// Ping-pong on a working set of keys, exact receives both ways round: after warm-up no
/// structure grows (no allocation in steady state) and buckets are reused, not re-created.
#[test]
fn exact_steady_state_does_not_grow() {
    let mut m = sw();
    let keys: Vec<u64> = (0..40).map(|i| encode_tag(1, i % 8, i / 8)).collect();
    let round = |m: &mut SwMatcher<u32, u32>, r: u32| {
        for (i, &k) in keys.iter().enumerate() {
            // Keep some receives and some messages outstanding across rounds.
            if (i + r as usize) % 3 == 0 {
                let _ = m.post(k, FULL_MASK, r);
                let _ = m.arrive(k, r);
            } else if (i + r as usize) % 3 == 1 {
                let _ = m.arrive(k, r);
                let _ = m.post(k, FULL_MASK, r);
            } else if r % 2 == 0 {
                let _ = m.post(k, FULL_MASK, r);
            } else {
                let _ = m.arrive(k, r);
            }
        }
    };
    for r in 0..200 {
        round(&mut m, r);
    }
    let before = m.footprint();
    for r in 200..2200 {
        round(&mut m, r);
    }
    assert_eq!(before, m.footprint());
    m.check_invariants();
}

/// Many distinct keys used once each: empty buckets are swept, memory follows what is queued.
#[test]
fn empty_buckets_are_bounded() {
    let mut m = sw();
    for i in 0..50_000u32 {
        let k = encode_tag(1, i % 1000, i / 1000);
        let id = queued(m.post(k, FULL_MASK, i));
        assert_eq!(m.arrive(k, i), Arrived::Matched(id, i, i));
    }
    let f = m.footprint();
    assert!(f[0] <= 1025, "{} buckets kept for nothing queued", f[0]);
    m.check_invariants();
}

// ---------------------------------------------------------------------------------------------
// Differential testing: reference vs fast, every outcome compared.

#[derive(Debug, Clone, Copy)]
struct Sel {
    ctx: u32,
    src: Option<u32>,
    tag: Option<u32>,
}

impl Sel {
    fn key(self) -> (u64, u64) {
        recv_key(self.ctx, self.src, self.tag)
    }
    fn msg(self) -> u64 {
        encode_tag(self.ctx, self.src.unwrap_or(0), self.tag.unwrap_or(0))
    }
}

#[derive(Debug, Clone, Copy)]
enum Op {
    Post(Sel),
    PostRaw {
        tag: u64,
        mask: u64,
    },
    Arrive(Sel),
    /// Cancel the n-th id issued so far (modulo), with its receive's tag XOR `skew` (a wrong
    /// tag unless the skew is outside the receive's mask), or a never-issued id when none was.
    Cancel {
        n: usize,
        skew: u64,
    },
    /// Cancel the n-th (modulo) of the receives still queued, with its tag: mostly from the
    /// middle of its queue.
    CancelLive(usize),
    Probe(Sel),
    ProbeMut(Sel),
    TakeProbed(Sel),
    Query(Sel),
}

const RAW_MASKS: [u64; 7] = [FULL_MASK, !SRC_FIELD, !TAG_FIELD, CTX_FIELD, !1, 0, CTX_FIELD | (1 << SRC_SHIFT)];

/// Tag skews of a cancel: mostly none (the right tag), else one bit of each field.
fn skew() -> impl Strategy<Value = u64> {
    prop_oneof![8 => Just(0u64), 1 => Just(1u64), 1 => Just(1 << SRC_SHIFT), 1 => Just(1 << CTX_SHIFT)]
}

fn cancel() -> impl Strategy<Value = Op> {
    (any::<usize>(), skew()).prop_map(|(n, skew)| Op::Cancel { n, skew })
}

fn sel(wild: bool) -> impl Strategy<Value = Sel> {
    let opt = move |s: std::ops::Range<u32>| {
        if wild {
            proptest::option::weighted(0.7, s).boxed()
        } else {
            s.prop_map(Some).boxed()
        }
    };
    (0..2u32, opt(0..3), opt(0..3)).prop_map(|(ctx, src, tag)| Sel { ctx, src, tag })
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => sel(true).prop_map(Op::Post),
        1 => ((0..2u32, 0..3u32, 0..4u32), 0..RAW_MASKS.len())
            .prop_map(|((c, s, t), i)| Op::PostRaw { tag: encode_tag(c, s, t), mask: RAW_MASKS[i] }),
        7 => sel(false).prop_map(Op::Arrive),
        2 => cancel(),
        1 => any::<usize>().prop_map(Op::CancelLive),
        1 => sel(true).prop_map(Op::Probe),
        1 => sel(true).prop_map(Op::ProbeMut),
        1 => sel(true).prop_map(Op::TakeProbed),
        1 => sel(true).prop_map(Op::Query),
    ]
}

/// Operations weighted towards wildcard receives and probes of every form over more keys, so
/// the class queues and unexpected indexes hold several keys and several entries per key.
fn wild_op() -> impl Strategy<Value = Op> {
    let sel = |p: f64| {
        (0..2u32, proptest::option::weighted(p, 0..5u32), proptest::option::weighted(p, 0..5u32)).prop_map(|(ctx, src, tag)| Sel {
            ctx,
            src,
            tag,
        })
    };
    let full = (0..2u32, 0..5u32, 0..5u32).prop_map(|(ctx, s, t)| Sel { ctx, src: Some(s), tag: Some(t) });
    prop_oneof![
        6 => sel(0.5).prop_map(Op::Post),
        1 => ((0..2u32, 0..5u32, 0..5u32), 0..RAW_MASKS.len())
            .prop_map(|((c, s, t), i)| Op::PostRaw { tag: encode_tag(c, s, t), mask: RAW_MASKS[i] }),
        6 => full.prop_map(Op::Arrive),
        3 => cancel(),
        1 => any::<usize>().prop_map(Op::CancelLive),
        2 => sel(0.5).prop_map(Op::Probe),
        1 => sel(0.5).prop_map(Op::ProbeMut),
        2 => sel(0.5).prop_map(Op::TakeProbed),
        1 => sel(0.5).prop_map(Op::Query),
    ]
}

/// Operations heavy in cancels of queued receives, of every form, on few keys, so queues are
/// deep and most cancels take a receive from the middle of one.
fn cancel_op() -> impl Strategy<Value = Op> {
    // One context and two sources and tags: each form's queues hold few keys.
    let sel = (proptest::option::weighted(0.5, 0..2u32), proptest::option::weighted(0.5, 0..2u32)).prop_map(|(src, tag)| Sel {
        ctx: 0,
        src,
        tag,
    });
    let full = (0..2u32, 0..2u32).prop_map(|(s, t)| Sel { ctx: 0, src: Some(s), tag: Some(t) });
    prop_oneof![
        8 => sel.clone().prop_map(Op::Post),
        1 => ((0..2u32, 0..2u32), 0..RAW_MASKS.len())
            .prop_map(|((s, t), i)| Op::PostRaw { tag: encode_tag(0, s, t), mask: RAW_MASKS[i] }),
        2 => full.prop_map(Op::Arrive),
        5 => any::<usize>().prop_map(Op::CancelLive),
        2 => cancel(),
        1 => sel.clone().prop_map(Op::TakeProbed),
        1 => sel.prop_map(Op::Query),
    ]
}

/// Runs `ops` on the reference and on `fast`, comparing every outcome and the queue lengths
/// after every step, and checking the fast matcher's invariants.
fn differential(ops: &[Op], fast: SwMatcher<u32, u32>, check_every: usize) -> Result<(), TestCaseError> {
    let mut d = Diff { model: reference(), fast, issued: Vec::new(), live: Vec::new() };
    for (i, &op) in ops.iter().enumerate() {
        if !d.change(i, op)? {
            d.query(i, op)?;
        }
        prop_assert_eq!(d.model.posted_len(), d.fast.posted_len(), "step {}", i);
        prop_assert_eq!(d.model.unexpected_len(), d.fast.unexpected_len(), "step {}", i);
        if i % check_every == 0 {
            d.fast.check_invariants();
        }
    }
    d.fast.check_invariants();
    Ok(())
}

/// The two matchers of [`differential`], and the receive ids the reference issued.
struct Diff {
    model: RefMatcher<u32, u32>,
    fast: SwMatcher<u32, u32>,
    /// Every id issued with its receive's tag, and those still queued (per the model).
    issued: Vec<(RecvId, u64)>,
    live: Vec<(RecvId, u64)>,
}

impl Diff {
    /// Step `i`, if `op` changes the queues (a post, an arrival, a cancel): the two matchers'
    /// outcomes compared. Returns whether it was one.
    fn change(&mut self, i: usize, op: Op) -> Result<bool, TestCaseError> {
        let label = i as u32;
        match op {
            Op::Post(s) => {
                let (t, k) = s.key();
                self.post(i, op, (t, k, label))?;
            }
            Op::PostRaw { tag, mask } => self.post(i, op, (tag, mask, label))?,
            Op::Arrive(s) => {
                let m = 1_000_000 + label;
                let a = self.model.arrive(s.msg(), m);
                prop_assert_eq!(&a, &self.fast.arrive(s.msg(), m), "step {} {:?}", i, op);
                if let Arrived::Matched(id, ..) = a {
                    self.live.retain(|e| e.0 != id);
                }
            }
            Op::Cancel { n, skew } => {
                let (id, t) = if self.issued.is_empty() { (RecvId(n as u64), n as u64) } else { self.issued[n % self.issued.len()] };
                let a = self.model.cancel(id, t ^ skew);
                prop_assert_eq!(a, self.fast.cancel(id, t ^ skew), "step {} {:?}", i, op);
                if a.is_some() {
                    self.live.retain(|e| e.0 != id);
                }
            }
            Op::CancelLive(n) => {
                if !self.live.is_empty() {
                    let (id, t) = self.live.remove(n % self.live.len());
                    let a = self.model.cancel(id, t);
                    prop_assert!(a.is_some(), "step {}: the model lost {:?}", i, id);
                    prop_assert_eq!(a, self.fast.cancel(id, t), "step {} {:?}", i, op);
                }
            }
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// A receive `(tag, mask, label)` posted to both.
    fn post(&mut self, i: usize, op: Op, (t, k, label): (u64, u64, u32)) -> Result<(), TestCaseError> {
        let a = self.model.post(t, k, label);
        prop_assert_eq!(&a, &self.fast.post(t, k, label), "step {} {:?}", i, op);
        if let Posted::Queued(id) = a {
            self.issued.push((id, t));
            self.live.push((id, t));
        }
        Ok(())
    }

    /// Step `i` when `op` looks at the queues (probes, matched probes, queries): the two
    /// matchers' answers compared.
    fn query(&mut self, i: usize, op: Op) -> Result<(), TestCaseError> {
        let (model, fast) = (&mut self.model, &mut self.fast);
        match op {
            Op::Probe(s) => {
                let (t, k) = s.key();
                prop_assert_eq!(model.probe(t, k), fast.probe(t, k), "step {} {:?}", i, op);
            }
            Op::ProbeMut(s) => {
                let (t, k) = s.key();
                let a = model.probe_mut(t, k).map(|(key, v)| {
                    *v += 10_000_000;
                    (key, *v)
                });
                let b = fast.probe_mut(t, k).map(|(key, v)| {
                    *v += 10_000_000;
                    (key, *v)
                });
                prop_assert_eq!(a, b, "step {} {:?}", i, op);
            }
            Op::TakeProbed(s) => {
                let (t, k) = s.key();
                prop_assert_eq!(model.take_probed(t, k), fast.take_probed(t, k), "step {} {:?}", i, op);
            }
            Op::Query(s) => {
                let (t, k) = s.key();
                prop_assert_eq!(model.has_posted_match(s.msg()), fast.has_posted_match(s.msg()), "step {}", i);
                prop_assert_eq!(model.earlier_posted_overlaps(t, k), fast.earlier_posted_overlaps(t, k), "step {} {:?}", i, op);
            }
            _ => prop_assert!(false, "step {}: {:?} is not a query", i, op),
        }
        Ok(())
    }
}

/// Cases per differential proptest: 128 (a few seconds in debug), or `PROPTEST_CASES` for a
/// longer soak.
fn cases() -> u32 {
    std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(128)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    #[test]
    fn differential_default(ops in proptest::collection::vec(op(), 0..300)) {
        differential(&ops, sw(), 1)?;
    }

    #[test]
    fn differential_tiny_tuning(ops in proptest::collection::vec(op(), 0..300)) {
        differential(&ops, sw_tiny(), 1)?;
    }

    #[test]
    fn differential_wildcard_mix(ops in proptest::collection::vec(wild_op(), 0..400)) {
        differential(&ops, sw(), 1)?;
    }

    #[test]
    fn differential_wildcard_mix_tiny_tuning(ops in proptest::collection::vec(wild_op(), 0..400)) {
        differential(&ops, sw_tiny(), 1)?;
    }

    #[test]
    fn differential_cancel_mix(ops in proptest::collection::vec(cancel_op(), 0..400)) {
        differential(&ops, sw(), 1)?;
    }

    #[test]
    fn differential_cancel_mix_tiny_tuning(ops in proptest::collection::vec(cancel_op(), 0..400)) {
        differential(&ops, sw_tiny(), 1)?;
    }
}

/// A long deterministic run with bursts that build deep queues, to reach the compaction and
/// sweeping paths at scale (the proptest sequences stay short).
#[test]
fn differential_long_run() {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for fast in [sw(), sw_tiny()] {
        let mut ops = Vec::new();
        for _ in 0..6_000 {
            let r = next();
            let s = Sel {
                ctx: (r % 3) as u32,
                src: ((r >> 8) % 4 != 0).then_some(((r >> 16) % 8) as u32),
                tag: ((r >> 24) % 5 != 0).then_some(((r >> 32) % 8) as u32),
            };
            let full = Sel { src: Some(s.src.unwrap_or(1)), tag: Some(s.tag.unwrap_or(2)), ..s };
            // Phases of mostly-posts and mostly-arrivals so both queues get deep.
            let (posts, arrivals) = if (ops.len() / 500) % 2 == 0 { (9, 3) } else { (3, 9) };
            let pick = (r >> 40) % 16;
            ops.push(if pick < posts {
                Op::Post(s)
            } else if pick < posts + arrivals {
                Op::Arrive(full)
            } else if pick == 13 {
                if (r >> 43) & 1 == 0 {
                    Op::Cancel { n: (r >> 44) as usize, skew: 0 }
                } else {
                    Op::CancelLive((r >> 44) as usize)
                }
            } else if pick == 14 {
                Op::TakeProbed(s)
            } else {
                Op::Query(s)
            });
        }
        differential(&ops, fast, 97).unwrap();
    }
}
