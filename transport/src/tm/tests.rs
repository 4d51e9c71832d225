//! Scenario suite for the soft TM-SRQ: every opcode, flag, status and error, the ordering
//! race of the tag-matching seed, the phase counter's wrap, and a property test against a
//! plain linear-scan reference model.

use super::*;
use crate::wire::{Message, Rvh, TmOp, Tmh, RVH_LEN, TMH_LEN};

const ALL: u64 = u64::MAX;

fn eager(tag: u64, app_ctx: u32, payload: &[u8]) -> Vec<u8> {
    let mut m = Tmh { op: TmOp::Eager, app_ctx, tag }.to_bytes().to_vec();
    m.extend_from_slice(payload);
    m
}

fn rndv(tag: u64, app_ctx: u32, va: u64, rkey: u32, len: u32) -> Vec<u8> {
    let mut m = Tmh { op: TmOp::Rndv, app_ctx, tag }.to_bytes().to_vec();
    m.extend_from_slice(&Rvh { va, rkey, len }.to_bytes());
    m
}

fn srq(tags: u32, ops: u32, wr: u32) -> TmSrq {
    TmSrq::new(TmCap { max_num_tags: tags, max_ops: ops, max_wr: wr }).unwrap()
}

fn drain(s: &mut TmSrq) -> Vec<Wc> {
    std::iter::from_fn(|| s.poll_cq()).collect()
}

/// Signaled ADD with count `cnt` on an SRQ whose CQ has been drained; polls and checks its
/// completion; returns the handle.
fn add(s: &mut TmSrq, tag: u64, mask: u64, recv_wr_id: u64, len: usize, cnt: u32) -> u32 {
    assert_eq!(s.cq_len(), 0, "drain the CQ before add()");
    let h = s.post_srq_op(&OpsWr::add(900, tag, mask, recv_wr_id, len, cnt, true)).unwrap();
    let h = h.unwrap();
    let wc = s.poll_cq().unwrap();
    assert_eq!((wc.opcode, wc.status, wc.wr_id, wc.handle), (WcOpcode::TmAdd, WcStatus::Success, 900, h));
    h
}

fn place(a: Arrival) -> Placement {
    match a {
        Arrival::Place(p) => p,
        other => panic!("expected a placement, got {other:?}"),
    }
}

fn tagged_wr(a: Arrival) -> u64 {
    match place(a).buffer {
        Buffer::Tagged { recv_wr_id, .. } => recv_wr_id,
        b => panic!("expected a tagged buffer, got {b:?}"),
    }
}

fn srq_wr(a: Arrival) -> u64 {
    match place(a).buffer {
        Buffer::Srq { wr_id } => wr_id,
        b => panic!("expected an SRQ buffer, got {b:?}"),
    }
}

// ---------------------------------------------------------------- capabilities, creation

/// CONFORMANCE.md: T13, T33, T34, T35, T36, T37, T38.
#[test]
fn default_caps_and_creation_validation() {
    let c = TmCaps::default();
    assert_eq!((c.max_rndv_hdr_size, c.max_num_tags, c.max_sge), (64, 1023, 1));
    assert!(c.flags.contains(TmCapFlags::RC));
    assert!(TmSrq::new(TmCap::default()).is_ok());
    let ok = TmCap { max_num_tags: 1023, max_ops: c.max_ops, max_wr: 1 };
    assert!(TmSrq::new(ok).is_ok());
    for bad in [
        TmCap { max_num_tags: 1024, ..ok },
        TmCap { max_num_tags: 0, ..ok },
        TmCap { max_ops: c.max_ops + 1, ..ok },
        TmCap { max_ops: 0, ..ok },
        TmCap { max_wr: 0, ..ok },
        TmCap { max_wr: c.max_srq_wr + 1, ..ok },
    ] {
        assert_eq!(TmSrq::new(bad).unwrap_err(), TmErrno::Inval, "{bad:?}");
    }
    let no_rc = TmCaps { flags: TmCapFlags(0), ..c };
    assert_eq!(TmSrq::with_caps(no_rc, ok).unwrap_err(), TmErrno::Inval);
    let no_sge = TmCaps { max_sge: 0, ..c };
    assert_eq!(TmSrq::with_caps(no_sge, ok).unwrap_err(), TmErrno::Inval);
    let small = TmCaps { max_num_tags: 4, ..c };
    assert_eq!(TmSrq::with_caps(small, ok).unwrap_err(), TmErrno::Inval);
    assert!(TmSrq::with_caps(small, TmCap { max_num_tags: 4, ..ok }).is_ok());
}

/// CONFORMANCE.md: T27, T39.
#[test]
fn post_srq_recv_is_bounded_by_max_wr() {
    let mut s = srq(4, 4, 2);
    s.post_srq_recv(1, 8).unwrap();
    s.post_srq_recv(2, 8).unwrap();
    assert_eq!(s.post_srq_recv(3, 8), Err(TmErrno::NoMem));
    assert_eq!(s.srq_posted(), 2);
}

// ---------------------------------------------------------------- ops and their completions

/// CONFORMANCE.md: T24, T41, T42, T46, T48, T54.
#[test]
fn add_signaled_and_unsignaled() {
    let mut s = srq(8, 8, 1);
    let h0 = add(&mut s, 1, ALL, 10, 8, 0);
    let h1 = s.post_srq_op(&OpsWr::add(2, 2, ALL, 11, 8, 0, false)).unwrap().unwrap();
    assert_ne!(h0, h1);
    assert!(s.poll_cq().is_none(), "unsignaled ADD must not complete");
    assert_eq!(s.tags_listed(), 2);
    assert_eq!(s.counters().adds, 2);
    // The batch form writes the handle back into the work request.
    let mut wrs = [OpsWr::add(3, 3, ALL, 12, 8, 0, false), OpsWr::sync(4, 0, true)];
    s.post_srq_ops(&mut wrs).unwrap();
    assert!(wrs[0].handle != h0 && wrs[0].handle != h1);
    let wc = s.poll_cq().unwrap();
    assert_eq!((wc.opcode, wc.wr_id, wc.flags), (WcOpcode::TmSync, 4, WcFlags::NONE));
    assert_eq!(s.counters().syncs, 1);
}

/// CONFORMANCE.md: T40.
#[test]
fn unknown_op_flags_are_einval() {
    let mut s = srq(8, 8, 1);
    let mut wr = OpsWr::sync(1, 0, true);
    wr.flags = OpsFlags(1 << 7);
    assert_eq!(s.post_srq_op(&wr), Err(TmErrno::Inval));
    assert_eq!(s.ops_outstanding(), 0);
}

/// CONFORMANCE.md: T43, T46, T54.
#[test]
fn del_signaled_success_and_unsignaled_success() {
    let mut s = srq(2, 8, 1);
    let h = add(&mut s, 5, ALL, 50, 8, 0);
    s.post_srq_op(&OpsWr::del(77, h, 0, true)).unwrap();
    let wc = s.poll_cq().unwrap();
    assert_eq!((wc.opcode, wc.status, wc.wr_id, wc.handle), (WcOpcode::TmDel, WcStatus::Success, 77, h));
    assert_eq!(s.tags_listed(), 0);
    let h2 = add(&mut s, 6, ALL, 60, 8, 0);
    s.post_srq_op(&OpsWr::del(78, h2, 0, false)).unwrap();
    assert!(s.poll_cq().is_none(), "an unsignaled DEL that succeeds is silent");
    assert_eq!(s.counters().dels, 2);
    // The deleted entry does not match any more.
    s.post_srq_recv(1, 64).unwrap();
    assert_eq!(srq_wr(s.arrive(0, &eager(6, 0, b"x")).unwrap()), 1);
}

/// CONFORMANCE.md: T43, T63.
#[test]
fn del_after_consume_is_tm_err_even_unsignaled() {
    let mut s = srq(2, 8, 1);
    let h = add(&mut s, 5, ALL, 50, 8, 0);
    assert_eq!(tagged_wr(s.arrive(1, &eager(5, 0, b"abc")).unwrap()), 50);
    // Software races: deletes before seeing the consumption.
    s.post_srq_op(&OpsWr::del(70, h, 0, false)).unwrap();
    let wcs = drain(&mut s);
    assert_eq!(wcs.len(), 2);
    assert_eq!((wcs[0].opcode, wcs[0].wr_id), (WcOpcode::TmRecv, 50));
    assert_eq!((wcs[1].opcode, wcs[1].status, wcs[1].wr_id, wcs[1].handle), (WcOpcode::TmDel, WcStatus::TmErr, 70, h));
    assert_eq!(s.counters().del_failed, 1);
    // After everything is polled the handle is free: a DEL of it still fails cleanly.
    s.post_srq_op(&OpsWr::del(71, h, 0, true)).unwrap();
    assert_eq!(s.poll_cq().unwrap().status, WcStatus::TmErr);
    // Out of range handles are refused synchronously.
    assert_eq!(s.post_srq_op(&OpsWr::del(72, 2, 0, true)), Err(TmErrno::Inval));
}

/// CONFORMANCE.md: T43.
#[test]
fn consumed_handle_is_not_reused_until_its_completion_is_polled() {
    let mut s = srq(1, 8, 1);
    let h = add(&mut s, 5, ALL, 50, 8, 0);
    s.arrive(1, &eager(5, 0, b"abc")).unwrap();
    assert_eq!(s.post_srq_op(&OpsWr::add(1, 6, ALL, 60, 8, 0, true)), Err(TmErrno::NoMem));
    assert_eq!(s.poll_cq().unwrap().wr_id, 50);
    assert_eq!(add(&mut s, 6, ALL, 60, 8, 0), h);
}

/// CONFORMANCE.md: T9, T40.
#[test]
fn list_full_is_synchronous_enomem_at_the_failing_op() {
    let mut s = srq(2, 16, 1);
    let mut wrs = [
        OpsWr::add(1, 1, ALL, 11, 8, 0, false),
        OpsWr::add(2, 2, ALL, 12, 8, 0, false),
        OpsWr::add(3, 3, ALL, 13, 8, 0, true),
        OpsWr::add(4, 4, ALL, 14, 8, 0, true),
    ];
    assert_eq!(s.post_srq_ops(&mut wrs), Err((2, TmErrno::NoMem)));
    assert_eq!(s.tags_listed(), 2, "ops before the bad one took effect");
    assert!(s.poll_cq().is_none(), "ops from the bad one on did not");
    assert_eq!(s.counters().list_hwm, 2);
}

/// CONFORMANCE.md: T47.
#[test]
fn max_ops_bounds_outstanding_ops_until_a_completion_is_polled() {
    let mut s = srq(8, 4, 1);
    for i in 0..3 {
        s.post_srq_op(&OpsWr::sync(i, 0, false)).unwrap();
    }
    s.post_srq_op(&OpsWr::sync(3, 0, true)).unwrap();
    assert_eq!(s.ops_outstanding(), 4);
    let mut wrs = [OpsWr::sync(4, 0, true)];
    assert_eq!(s.post_srq_ops(&mut wrs), Err((0, TmErrno::NoMem)));
    assert_eq!(s.post_srq_op(&OpsWr::add(5, 1, ALL, 1, 1, 0, true)), Err(TmErrno::NoMem));
    // Polling the signaled op reclaims it and the unsignaled ones before it.
    assert_eq!(s.poll_cq().unwrap().wr_id, 3);
    assert_eq!(s.ops_outstanding(), 0);
    s.post_srq_ops(&mut wrs).unwrap();
    // A failed DEL's completion reclaims slots too.
    let mut s = srq(8, 2, 1);
    s.post_srq_op(&OpsWr::sync(0, 0, false)).unwrap();
    s.post_srq_op(&OpsWr::del(1, 3, 0, false)).unwrap();
    assert_eq!(s.post_srq_op(&OpsWr::sync(2, 0, false)), Err(TmErrno::NoMem));
    assert_eq!(s.poll_cq().unwrap().status, WcStatus::TmErr);
    s.post_srq_op(&OpsWr::sync(2, 0, false)).unwrap();
}

// ---------------------------------------------------------------- matching

/// CONFORMANCE.md: T4, T10, T17, T26, T28, T57, T61, T64.
#[test]
fn eager_expected_single_packet() {
    let mut s = srq(4, 8, 1);
    let h = add(&mut s, 0xabc, ALL, 7, 16, 0);
    let msg = eager(0xabc, 99, b"payload");
    let p = place(s.arrive(4, &msg).unwrap());
    assert_eq!(p, Placement { buffer: Buffer::Tagged { recv_wr_id: 7, handle: h }, src_off: TMH_LEN, dst_off: 0, len: 7 });
    assert_eq!(p.bytes(&msg), b"payload");
    let wc = s.poll_cq().unwrap();
    assert_eq!((wc.opcode, wc.status, wc.wr_id, wc.byte_len, wc.src, wc.handle), (WcOpcode::TmRecv, WcStatus::Success, 7, 7, 4, h));
    assert_eq!(wc.flags, WcFlags::TM_MATCH | WcFlags::TM_DATA_VALID);
    assert!(!wc.is_unexpected());
    assert_eq!(wc.read_tm_info(), Some((0xabc, 99)));
    assert!(s.poll_cq().is_none());
    assert_eq!(s.counters().hw_matched, 1);
    assert_eq!(s.hw_unexpected_cnt(), 0);
}

/// CONFORMANCE.md: T65.
#[test]
fn eager_longer_than_tagged_buffer_is_cut_with_loc_len_err() {
    let mut s = srq(4, 8, 1);
    add(&mut s, 1, ALL, 7, 3, 0);
    let msg = eager(1, 0, b"abcdef");
    let p = place(s.arrive(0, &msg).unwrap());
    assert_eq!(p.bytes(&msg), b"abc");
    let wc = s.poll_cq().unwrap();
    assert_eq!((wc.status, wc.byte_len), (WcStatus::LocLenErr, 6));
    assert!(wc.flags.contains(WcFlags::TM_MATCH | WcFlags::TM_DATA_VALID));
}

/// CONFORMANCE.md: T26.
#[test]
fn zero_length_buffer_and_payload() {
    let mut s = srq(4, 8, 1);
    add(&mut s, 1, ALL, 7, 0, 0);
    let p = place(s.arrive(0, &eager(1, 0, b"")).unwrap());
    assert_eq!(p.len, 0);
    let wc = s.poll_cq().unwrap();
    assert_eq!((wc.status, wc.byte_len), (WcStatus::Success, 0));
}

/// CONFORMANCE.md: T4, T29, T55.
#[test]
fn unexpected_lands_whole_in_an_srq_buffer() {
    let mut s = srq(4, 8, 4);
    add(&mut s, 1, ALL, 7, 64, 0);
    s.post_srq_recv(100, 256).unwrap();
    s.post_srq_recv(101, 256).unwrap();
    let msg = eager(2, 5, b"zz");
    let p = place(s.arrive(9, &msg).unwrap());
    assert_eq!(p, Placement { buffer: Buffer::Srq { wr_id: 100 }, src_off: 0, dst_off: 0, len: msg.len() });
    assert_eq!(p.bytes(&msg), &msg[..], "TMH included");
    let wc = s.poll_cq().unwrap();
    assert_eq!((wc.opcode, wc.status, wc.wr_id, wc.byte_len, wc.src), (WcOpcode::TmRecv, WcStatus::Success, 100, 18, 9));
    assert_eq!(wc.flags, WcFlags::NONE, "mlx5: neither MATCH nor DATA_VALID");
    assert!(wc.is_unexpected());
    assert_eq!(wc.read_tm_info(), None);
    assert_eq!(s.hw_unexpected_cnt(), 1);
    assert!(!s.in_sync());
    assert_eq!(s.counters().unexpected, 1);
    // Unexpected rendezvous requests land whole too, RVH and meta-data included.
    let req = RndvRequest { app_ctx: 3, tag: 4, va: 0x1000, rkey: 0xab, len: 9, pregranted: false }.encode();
    let p = place(s.arrive(9, &req).unwrap());
    assert_eq!((p.buffer, p.len), (Buffer::Srq { wr_id: 101 }, RNDV_REQ_LEN));
    assert!(s.poll_cq().unwrap().is_unexpected());
    assert_eq!(s.hw_unexpected_cnt(), 2);
}

#[test]
fn unexpected_longer_than_srq_buffer_is_cut() {
    let mut s = srq(4, 8, 4);
    s.post_srq_recv(100, 10).unwrap();
    let msg = eager(2, 5, b"0123456789");
    assert_eq!(place(s.arrive(0, &msg).unwrap()).len, 10);
    let wc = s.poll_cq().unwrap();
    assert_eq!((wc.status, wc.byte_len), (WcStatus::LocLenErr, 26));
    assert!(wc.is_unexpected(), "still counted: software must count it");
    assert_eq!(s.hw_unexpected_cnt(), 1);
}

/// CONFORMANCE.md: T27.
#[test]
fn no_srq_buffer_is_rnr_and_changes_nothing() {
    let mut s = srq(4, 8, 4);
    let msg = eager(2, 5, b"zz");
    assert_eq!(s.arrive(0, &msg).unwrap(), Arrival::Rnr);
    assert_eq!(s.arrive(0, &[0, 1, 2]).unwrap(), Arrival::Rnr);
    assert_eq!(s.hw_unexpected_cnt(), 0);
    assert!(s.poll_cq().is_none());
    assert_eq!(s.counters().rnr, 2);
    // A matching entry posted meanwhile takes the retried message.
    add(&mut s, 2, ALL, 7, 8, 0);
    assert_eq!(tagged_wr(s.arrive(0, &msg).unwrap()), 7);
    s.post_srq_recv(1, 64).unwrap();
    assert_eq!(srq_wr(s.arrive(0, &msg).unwrap()), 1);
}

/// CONFORMANCE.md: T49.
#[test]
fn no_tag_is_always_unexpected_but_never_counted() {
    let mut s = srq(4, 8, 4);
    add(&mut s, 0, 0, 7, 64, 0); // mask 0 would match any tagged message
    s.post_srq_recv(100, 64).unwrap();
    let msg = [0u8, 0xde, 0xad];
    let p = place(s.arrive(2, &msg).unwrap());
    assert_eq!((p.buffer, p.bytes(&msg)), (Buffer::Srq { wr_id: 100 }, &msg[..]));
    let wc = s.poll_cq().unwrap();
    assert_eq!((wc.opcode, wc.status, wc.byte_len, wc.src, wc.flags), (WcOpcode::TmNoTag, WcStatus::Success, 3, 2, WcFlags::NONE));
    assert!(!wc.is_unexpected());
    assert_eq!(wc.read_tm_info(), None);
    assert_eq!(s.hw_unexpected_cnt(), 0);
    assert!(s.in_sync());
    assert_eq!((s.counters().no_tag, s.counters().unexpected), (1, 0));
    assert_eq!(s.tags_listed(), 1);
}

/// CONFORMANCE.md: T53.
#[test]
fn fin_arriving_at_the_sender_is_a_no_tag_receive() {
    let mut s = srq(4, 8, 4);
    add(&mut s, 0x77, ALL, 7, 64, 0);
    s.post_srq_recv(100, 64).unwrap();
    let mut fin = Tmh { op: TmOp::Fin, app_ctx: 1, tag: 0x77 }.to_bytes().to_vec();
    fin.extend_from_slice(&Rvh { va: 1, rkey: 2, len: 3 }.to_bytes());
    let p = place(s.arrive(1, &fin).unwrap());
    assert_eq!(p.bytes(&fin), &fin[..]);
    let wc = s.poll_cq().unwrap();
    assert_eq!(wc.opcode, WcOpcode::TmNoTag);
    assert_eq!(s.tags_listed(), 1, "FIN never matches");
    assert!(s.in_sync());
}

/// CONFORMANCE.md: T2, T3, T42.
#[test]
fn match_rule_masks_and_list_order() {
    let mut s = srq(16, 32, 4);
    let any_tag: u64 = !0xff_ffff;
    // Wildcard posted first wins over a later exact entry.
    add(&mut s, 0x1_000005, any_tag, 1, 8, 0);
    add(&mut s, 0x1_000005, ALL, 2, 8, 0);
    assert_eq!(tagged_wr(s.arrive(0, &eager(0x1_000005, 0, b"")).unwrap()), 1);
    assert_eq!(tagged_wr(s.arrive(0, &eager(0x1_000005, 0, b"")).unwrap()), 2);
    drain(&mut s);
    // Exact posted first wins over a later wildcard.
    add(&mut s, 0x1_000006, ALL, 3, 8, 0);
    add(&mut s, 0x1_000000, any_tag, 4, 8, 0);
    assert_eq!(tagged_wr(s.arrive(0, &eager(0x1_000006, 0, b"")).unwrap()), 3);
    drain(&mut s);
    // The wildcard takes any tag of its context, and the entry's own bits outside the mask
    // do not matter (the tag is masked on ADD).
    add(&mut s, 0x1_abcdef, any_tag, 5, 8, 0);
    assert_eq!(tagged_wr(s.arrive(0, &eager(0x1_123456, 0, b"")).unwrap()), 4);
    assert_eq!(tagged_wr(s.arrive(0, &eager(0x1_000001, 0, b"")).unwrap()), 5);
    // Other contexts do not match.
    s.post_srq_recv(100, 64).unwrap();
    assert_eq!(srq_wr(s.arrive(0, &eager(0x2_000001, 0, b"")).unwrap()), 100);
    assert_eq!(drain(&mut s).len(), 3);
    // Same exact tag: FIFO; a deleted head is skipped.
    let h = add(&mut s, 9, ALL, 6, 8, 1);
    add(&mut s, 9, ALL, 7, 8, 1);
    add(&mut s, 9, ALL, 8, 8, 1);
    s.post_srq_op(&OpsWr::del(0, h, 1, false)).unwrap();
    assert_eq!(tagged_wr(s.arrive(0, &eager(9, 0, b"")).unwrap()), 7);
    assert_eq!(tagged_wr(s.arrive(0, &eager(9, 0, b"")).unwrap()), 8);
    drain(&mut s);
    // Mask 0 matches everything.
    add(&mut s, 0, 0, 10, 8, 1);
    assert_eq!(tagged_wr(s.arrive(0, &eager(u64::MAX, 0, b"")).unwrap()), 10);
}

/// CONFORMANCE.md: T9.
#[test]
fn long_exact_list_finds_each_tag() {
    let mut s = srq(1023, 1024, 1);
    for i in 0..1000u64 {
        s.post_srq_op(&OpsWr::add(i, i * 0x1_0000_0001, ALL, i, 8, 0, false)).unwrap();
        if i % 512 == 511 {
            s.post_srq_op(&OpsWr::sync(0, 0, true)).unwrap();
            drain(&mut s);
        }
    }
    // Arrive in a scrambled order; each finds its own entry.
    for k in 0..1000u64 {
        let i = (k * 617) % 1000;
        assert_eq!(tagged_wr(s.arrive(0, &eager(i * 0x1_0000_0001, 0, b"")).unwrap()), i);
    }
    assert_eq!(s.tags_listed(), 0);
    assert_eq!(s.counters().list_hwm, 1000);
}

// ---------------------------------------------------------------- phase synchronisation

/// The seed's race: m1 arrives before b1 is posted, m2 after. Without phase sync m2 would
/// match b1 although m1 (earlier, same tag) went unexpected, breaking MPI order.
///
/// CONFORMANCE.md: T23, T30.
#[test]
fn seed_race_m1_m2_b1_b2_stale_add_is_not_matched_until_sync() {
    let mut s = srq(8, 16, 8);
    for i in 0..4 {
        s.post_srq_recv(100 + i, 256).unwrap();
    }
    // m1 arrives: nothing posted, unexpected. Software has not polled it yet.
    assert_eq!(srq_wr(s.arrive(1, &eager(0x10, 0, b"m1")).unwrap()), 100);
    // Software posts b1 with the count it knows (0): out of phase.
    s.post_srq_op(&OpsWr::add(1, 0x10, ALL, 201, 64, 0, true)).unwrap();
    // m2 arrives: b1 must NOT match it.
    assert_eq!(srq_wr(s.arrive(1, &eager(0x10, 0, b"m2")).unwrap()), 101);
    assert_eq!(s.hw_unexpected_cnt(), 2);
    let wcs = drain(&mut s);
    assert!(wcs[0].is_unexpected());
    assert_eq!((wcs[1].opcode, wcs[1].flags), (WcOpcode::TmAdd, WcFlags::TM_SYNC_REQ));
    assert!(wcs[2].is_unexpected());
    let b1 = wcs[1].handle;
    // Software matches m1 to its receive r1 (= b1) and m2 to r2 (= b2, never posted to HW):
    // b1 must come out of HW first; then it reports both unexpected messages.
    s.post_srq_op(&OpsWr::del(2, b1, 2, true)).unwrap();
    let wc = s.poll_cq().unwrap();
    assert_eq!((wc.status, wc.flags), (WcStatus::Success, WcFlags::NONE), "level now: no SYNC_REQ");
    assert!(s.in_sync());
    // A receive posted now is in phase and matches the next message at once.
    add(&mut s, 0x10, ALL, 203, 64, 2);
    assert_eq!(tagged_wr(s.arrive(1, &eager(0x10, 0, b"m3")).unwrap()), 203);
}

/// CONFORMANCE.md: T31, T44.
#[test]
fn stale_entry_becomes_eligible_after_sync() {
    let mut s = srq(8, 16, 8);
    s.post_srq_recv(100, 256).unwrap();
    s.post_srq_recv(101, 256).unwrap();
    s.arrive(1, &eager(0x99, 0, b"")).unwrap(); // unexpected, count 1
    let b = add_with_flags(&mut s, 0x10, 0); // stale
    assert_eq!(srq_wr(s.arrive(1, &eager(0x10, 0, b"")).unwrap()), 101);
    // Software reports 1: still behind (HW delivered 2): b stays disabled.
    s.post_srq_op(&OpsWr::sync(5, 1, true)).unwrap();
    s.post_srq_recv(102, 256).unwrap();
    assert_eq!(srq_wr(s.arrive(1, &eager(0x10, 0, b"")).unwrap()), 102);
    // Reports 3: level: b matches.
    s.post_srq_op(&OpsWr::sync(6, 3, true)).unwrap();
    assert_eq!(s.counters().resyncs, 1);
    let p = place(s.arrive(1, &eager(0x10, 0, b"")).unwrap());
    assert_eq!(p.buffer, Buffer::Tagged { recv_wr_id: 7, handle: b });
    let wcs = drain(&mut s);
    let syncs: Vec<_> = wcs.iter().filter(|w| w.opcode == WcOpcode::TmSync).collect();
    // mlx5: a SYNC's completion never carries TM_SYNC_REQ, level or not.
    assert_eq!(syncs[0].flags, WcFlags::NONE);
    assert_eq!(syncs[1].flags, WcFlags::NONE);
}

fn add_with_flags(s: &mut TmSrq, tag: u64, cnt: u32) -> u32 {
    s.post_srq_op(&OpsWr::add(1, tag, ALL, 7, 64, cnt, false)).unwrap().unwrap()
}

/// CONFORMANCE.md: T31.
#[test]
fn entries_added_in_phase_keep_matching_after_unexpected_arrivals() {
    let mut s = srq(8, 16, 8);
    s.post_srq_recv(100, 256).unwrap();
    add(&mut s, 0x10, ALL, 1, 64, 0);
    assert_eq!(srq_wr(s.arrive(1, &eager(0x20, 0, b"")).unwrap()), 100);
    assert!(!s.in_sync());
    assert_eq!(tagged_wr(s.arrive(1, &eager(0x10, 0, b"")).unwrap()), 1);
    assert_eq!(drain(&mut s).len(), 2);
    // ...but entries added now with the old count (0, stale) do not.
    add(&mut s, 0x30, ALL, 2, 64, 0);
    add(&mut s, 0x30, ALL, 3, 64, 0);
    s.post_srq_recv(101, 256).unwrap();
    assert_eq!(srq_wr(s.arrive(1, &eager(0x30, 0, b"")).unwrap()), 101);
}

/// CONFORMANCE.md: T32.
#[test]
fn ops_without_tm_sync_keep_the_last_count() {
    let mut s = srq(8, 16, 8);
    s.post_srq_recv(100, 256).unwrap();
    s.arrive(1, &eager(0x20, 0, b"")).unwrap();
    s.post_srq_op(&OpsWr::sync(1, 1, false)).unwrap();
    assert!(s.in_sync());
    // unexpected_cnt 0 is ignored without TM_SYNC: the entry is in phase.
    let wr = OpsWr { flags: OpsFlags::SIGNALED, ..OpsWr::add(2, 0x10, ALL, 5, 8, 0, true) };
    s.post_srq_op(&wr).unwrap();
    assert_eq!(s.sw_unexpected_cnt(), 1);
    assert_eq!(tagged_wr(s.arrive(1, &eager(0x10, 0, b"")).unwrap()), 5);
    let wcs = drain(&mut s);
    assert_eq!(wcs.iter().find(|w| w.opcode == WcOpcode::TmAdd).unwrap().flags, WcFlags::NONE);
}

/// Deviation 3 of issue 17, following rdma-core's mlx5 provider (`providers/mlx5/cq.c`,
/// `handle_tag_matching`): ADD and DEL completions carry `TM_SYNC_REQ` when the counts differ,
/// a SYNC's completion never does.
///
/// CONFORMANCE.md: T45.
#[test]
fn sync_req_on_add_and_del_completions_whenever_counts_differ() {
    let mut s = srq(8, 16, 8);
    s.post_srq_recv(100, 256).unwrap();
    s.arrive(1, &eager(0x20, 0, b"")).unwrap();
    assert!(s.poll_cq().unwrap().is_unexpected());
    let h = s.post_srq_op(&OpsWr::add(1, 0x10, ALL, 5, 8, 0, true)).unwrap().unwrap();
    s.post_srq_op(&OpsWr::del(1, h, 0, true)).unwrap();
    s.post_srq_op(&OpsWr::sync(2, 0, true)).unwrap();
    let ops = drain(&mut s);
    assert_eq!(ops.len(), 3);
    assert!(ops[..2].iter().all(|w| w.flags == WcFlags::TM_SYNC_REQ), "{ops:?}");
    assert_eq!((ops[2].opcode, ops[2].flags), (WcOpcode::TmSync, WcFlags::NONE), "mlx5: NOOP has no tag to compare");
    assert!(!s.in_sync());
    s.post_srq_op(&OpsWr::sync(3, 1, true)).unwrap();
    assert_eq!(s.poll_cq().unwrap().flags, WcFlags::NONE);
}

/// The exact `TM_SYNC_REQ` rule of the model for list operations (issue 55 item 11, T45):
/// a failing DEL's `TM_ERR` completion carries the flag too while the counts differ, and a
/// DEL is judged by the count current when it is processed (its own `TM_SYNC` count
/// included), not by the count its tag was added with (which mlx5 compares).
///
/// CONFORMANCE.md: T45.
#[test]
fn sync_req_on_a_failing_del_and_with_the_current_count() {
    let mut s = srq(8, 16, 8);
    s.post_srq_recv(100, 256).unwrap();
    let h = add(&mut s, 0x10, ALL, 5, 8, 0);
    assert_eq!(tagged_wr(s.arrive(1, &eager(0x10, 0, b"m")).unwrap()), 5);
    s.arrive(1, &eager(0x20, 0, b"")).unwrap();
    let wcs = drain(&mut s);
    assert!(wcs[1].is_unexpected());
    // The tag was consumed: the DEL fails, and the counts differ (1 unexpected, 0 reported).
    s.post_srq_op(&OpsWr::del(1, h, 0, false)).unwrap();
    let wc = s.poll_cq().unwrap();
    assert_eq!((wc.opcode, wc.status, wc.flags), (WcOpcode::TmDel, WcStatus::TmErr, WcFlags::TM_SYNC_REQ));
    // A tag added out of phase, deleted by an op that reports the count: no flag.
    let h = s.post_srq_op(&OpsWr::add(2, 0x30, ALL, 6, 8, 0, true)).unwrap().unwrap();
    assert_eq!(s.poll_cq().unwrap().flags, WcFlags::TM_SYNC_REQ);
    s.post_srq_op(&OpsWr::del(3, h, 1, true)).unwrap();
    let wc = s.poll_cq().unwrap();
    assert_eq!((wc.opcode, wc.status, wc.flags), (WcOpcode::TmDel, WcStatus::Success, WcFlags::NONE));
    assert!(s.in_sync());
}

/// Deviation 3 of issue 17, probed: while the counts differ, matched `TM_RECV` and `TM_NO_TAG`
/// completions carry no `TM_SYNC_REQ` (mlx5 sets the flag on neither), nor does an unexpected
/// receive below the 0x3fff gap.
///
/// CONFORMANCE.md: T45.
#[test]
fn sync_req_never_on_matched_or_no_tag_receives() {
    let mut s = srq(8, 16, 8);
    add(&mut s, 0x10, ALL, 5, 64, 0);
    s.post_srq_recv(100, 256).unwrap();
    s.post_srq_recv(101, 256).unwrap();
    assert!(s.poll_cq().is_none());
    s.arrive(1, &eager(0x20, 0, b"u")).unwrap();
    assert!(!s.in_sync());
    assert_eq!(tagged_wr(s.arrive(1, &eager(0x10, 0, b"m")).unwrap()), 5);
    s.arrive(1, &[0u8, 1, 2]).unwrap();
    let wcs = drain(&mut s);
    assert_eq!(wcs.len(), 3);
    assert!(wcs[0].is_unexpected());
    assert_eq!((wcs[1].opcode, wcs[1].flags), (WcOpcode::TmRecv, WcFlags::TM_MATCH | WcFlags::TM_DATA_VALID));
    assert_eq!((wcs[2].opcode, wcs[2].flags), (WcOpcode::TmNoTag, WcFlags::NONE));
    assert!(wcs.iter().all(|w| !w.flags.contains(WcFlags::TM_SYNC_REQ)), "{wcs:?}");
    assert!(!s.in_sync(), "the counts still differ");
}

/// Deviation 2 of issue 17, probed: a multi-packet unexpected message from one source is
/// counted at its first packet; a match of another source's message that arrives after that
/// packet used to be polled first. The seed serializes matching completions with the
/// completions of unexpected messages: the match now waits behind it, while op and NO_TAG
/// completions may pass.
///
/// CONFORMANCE.md: T23, T59.
#[test]
fn multi_packet_unexpected_completion_is_serialized_with_later_matches() {
    let mut s = srq(4, 8, 4);
    add(&mut s, 0x10, ALL, 5, 64, 0);
    s.post_srq_recv(100, 256).unwrap();
    s.post_srq_recv(101, 256).unwrap();
    let long = eager(0x20, 0, &[7; 40]);
    assert_eq!(srq_wr(s.arrive_first(1, &long[..20], long.len()).unwrap()), 100);
    assert_eq!(tagged_wr(s.arrive(2, &eager(0x10, 0, b"m")).unwrap()), 5);
    s.arrive(3, &[0u8, 9]).unwrap();
    s.post_srq_op(&OpsWr::sync(44, 0, true)).unwrap();
    // The match and the unexpected completion wait; NO_TAG and the op pass.
    let early = drain(&mut s);
    assert_eq!(early.iter().map(|w| w.opcode).collect::<Vec<_>>(), vec![WcOpcode::TmNoTag, WcOpcode::TmSync], "{early:?}");
    s.arrive_continuation(1, &long[20..]).unwrap();
    let wcs = drain(&mut s);
    assert_eq!(wcs.len(), 2);
    assert!(wcs[0].is_unexpected() && wcs[0].wr_id == 100 && wcs[0].byte_len == long.len() as u64);
    assert_eq!((wcs[1].wr_id, wcs[1].flags), (5, WcFlags::TM_MATCH | WcFlags::TM_DATA_VALID));
    // A matched multi-packet message's DATA_VALID never passes its own MATCH either.
    add(&mut s, 0x30, ALL, 6, 64, 1);
    s.post_srq_recv(102, 256).unwrap();
    assert_eq!(srq_wr(s.arrive_first(1, &long[..20], long.len()).unwrap()), 102);
    let m = eager(0x30, 0, &[1; 30]);
    s.arrive_first(2, &m[..20], m.len()).unwrap();
    s.arrive_continuation(2, &m[20..]).unwrap();
    assert!(s.poll_cq().is_none());
    s.arrive_continuation(1, &long[20..]).unwrap();
    let wcs = drain(&mut s);
    assert!(wcs[0].is_unexpected());
    assert_eq!((wcs[1].wr_id, wcs[1].flags), (6, WcFlags::TM_MATCH));
    assert_eq!((wcs[2].wr_id, wcs[2].flags), (6, WcFlags::TM_DATA_VALID));
}

/// CONFORMANCE.md: T32.
#[test]
fn unexpected_cnt_wraps_at_16_bits() {
    let mut s = srq(8, 16, 8);
    let n: u32 = 65536 + 3;
    for i in 0..n {
        s.post_srq_recv(u64::from(i), 64).unwrap();
        assert!(matches!(s.arrive(0, &eager(1, 0, b"")).unwrap(), Arrival::Place(_)));
        let wc = s.poll_cq().unwrap();
        assert!(wc.is_unexpected());
        // Software keeps up, reporting its 32-bit count every 1000 messages.
        if i % 1000 == 999 {
            s.post_srq_op(&OpsWr::sync(0, i + 1, false)).unwrap();
        }
        if i % 3000 == 2999 {
            s.post_srq_op(&OpsWr::sync(0, i + 1, true)).unwrap();
            assert_eq!(s.poll_cq().unwrap().opcode, WcOpcode::TmSync);
        }
    }
    assert_eq!(s.hw_unexpected_cnt(), 3);
    // An ADD with the 32-bit count 65539 is in phase (65539 mod 2^16 == 3)...
    add(&mut s, 1, ALL, 42, 8, n);
    assert!(s.in_sync());
    assert_eq!(tagged_wr(s.arrive(0, &eager(1, 0, b"")).unwrap()), 42);
    drain(&mut s);
    // ...and so is one with the wrapped 16-bit count.
    add(&mut s, 1, ALL, 43, 8, 3);
    assert_eq!(tagged_wr(s.arrive(0, &eager(1, 0, b"")).unwrap()), 43);
    // One behind is stale.
    s.post_srq_recv(1, 64).unwrap();
    s.arrive(0, &eager(7, 0, b"")).unwrap();
    drain(&mut s);
    add(&mut s, 1, ALL, 44, 8, n);
    s.post_srq_recv(2, 64).unwrap();
    assert_eq!(srq_wr(s.arrive(0, &eager(1, 0, b"")).unwrap()), 2);
}

/// CONFORMANCE.md: T45.
#[test]
fn sync_req_on_unexpected_receive_once_gap_exceeds_0x3fff() {
    let mut s = srq(8, 16, 8);
    for i in 1..=0x4002u32 {
        s.post_srq_recv(u64::from(i), 64).unwrap();
        s.arrive(0, &eager(1, 0, b"")).unwrap();
        let wc = s.poll_cq().unwrap();
        assert!(wc.is_unexpected());
        let expect = i > u32::from(MAX_SYNC_DIFF);
        assert_eq!(wc.flags.contains(WcFlags::TM_SYNC_REQ), expect, "unexpected #{i}");
    }
    // Software syncs: the gap closes, the flag goes away.
    s.post_srq_op(&OpsWr::sync(0, 0x4002, true)).unwrap();
    assert_eq!(s.poll_cq().unwrap().flags, WcFlags::NONE);
    s.post_srq_recv(0, 64).unwrap();
    s.arrive(0, &eager(1, 0, b"")).unwrap();
    assert_eq!(s.poll_cq().unwrap().flags, WcFlags::NONE);
}

// ---------------------------------------------------------------- rendezvous

/// CONFORMANCE.md: T7, T11, T20, T25, T51, T52, T60.
#[test]
fn rendezvous_expected_reads_then_data_valid_and_fin() {
    let mut s = srq(4, 8, 1);
    let h = add(&mut s, 0x55, ALL, 7, 4096, 0);
    let req = rndv(0x55, 11, 0xdead_0000, 0x1234, 4000);
    let Arrival::Read(r) = s.arrive(3, &req).unwrap() else { panic!("expected a read") };
    assert_eq!((r.src, r.va, r.rkey, r.len, r.recv_wr_id, r.handle), (3, 0xdead_0000, 0x1234, 4000, 7, h));
    let wc = s.poll_cq().unwrap();
    assert_eq!((wc.opcode, wc.status, wc.flags, wc.wr_id, wc.byte_len), (WcOpcode::TmRecv, WcStatus::Success, WcFlags::TM_MATCH, 7, 0));
    assert_eq!(wc.read_tm_info(), Some((0x55, 11)));
    assert!(s.poll_cq().is_none() && s.poll_transmit().is_none());
    // The entry is still held: a DEL now fails.
    s.post_srq_op(&OpsWr::del(1, h, 0, true)).unwrap();
    assert_eq!(s.poll_cq().unwrap().status, WcStatus::TmErr);
    s.read_complete(r.id).unwrap();
    let wc = s.poll_cq().unwrap();
    assert_eq!((wc.status, wc.flags, wc.wr_id, wc.byte_len, wc.src), (WcStatus::Success, WcFlags::TM_DATA_VALID, 7, 4000, 3));
    assert_eq!(wc.read_tm_info(), Some((0x55, 11)));
    let t = s.poll_transmit().unwrap();
    assert_eq!(t.dst, 3);
    let Message::Fin(tmh, rvh) = Message::parse(&t.msg).unwrap() else { panic!("not a FIN") };
    assert_eq!(tmh, Tmh { op: TmOp::Fin, app_ctx: 11, tag: 0x55 });
    assert_eq!(rvh, Rvh { va: 0xdead_0000, rkey: 0x1234, len: 4000 });
    assert_eq!(&t.msg[TMH_LEN..], &req[TMH_LEN..TMH_LEN + RVH_LEN]);
    assert_eq!(s.read_complete(r.id), Err(TmErrno::Inval), "reported twice");
    assert_eq!(s.counters().rndv_reads, 1);
}

/// Deviation 1 of issue 17, probed: 16 bytes after the RVH (zeros, or 0xff) used to be read as
/// tmpi's (key, len) even on the expected path (a read of key 0 and length 0, or a spurious
/// `RNDV_INCOMPLETE`). The hardware path reads the RVH alone.
///
/// CONFORMANCE.md: T18, T20.
#[test]
fn hardware_path_reads_the_rvh_alone_whatever_follows_it() {
    for filler in [[0u8; 16], [0xff; 16], [0x63; 16]] {
        let mut s = srq(4, 8, 1);
        let h = add(&mut s, 0x66, ALL, 7, 8192, 0);
        let mut req = rndv(0x66, 1, 0x4000, 0xcafe_f00d, 4096);
        req.extend_from_slice(&filler);
        let Arrival::Read(r) = s.arrive(0, &req).unwrap() else { panic!("expected a read for filler {filler:?}") };
        assert_eq!((r.va, r.rkey, r.len, r.handle), (0x4000, 0xcafe_f00d, 4096, h), "filler {filler:?}");
        let wc = s.poll_cq().unwrap();
        assert_eq!((wc.status, wc.flags), (WcStatus::Success, WcFlags::TM_MATCH), "no spurious RNDV_INCOMPLETE");
        assert_eq!(s.counters().rndv_incomplete, 0);
        // Software reads the same request the same way.
        assert_eq!(RndvRequest::payload_len(&req), Some(4096));
        s.read_complete(r.id).unwrap();
        let t = s.poll_transmit().unwrap();
        assert_eq!(&t.msg[TMH_LEN..], &req[TMH_LEN..TMH_LEN + RVH_LEN], "the FIN copies the RVH");
    }
}

/// CONFORMANCE.md: T19, T22.
#[test]
fn rendezvous_request_encoding_and_the_long_message_software_path() {
    let r = RndvRequest { app_ctx: 1, tag: 0x66, va: 0x4000, rkey: 0xcccc_dddd, len: 5000, pregranted: false };
    let req = r.encode();
    assert_eq!(req.len(), RNDV_REQ_LEN);
    assert!(RNDV_REQ_LEN <= TmCaps::default().max_rndv_hdr_size as usize);
    let Message::Rndv(tmh, rvh, rest) = Message::parse(&req).unwrap() else { panic!() };
    assert_eq!((tmh.tag, tmh.app_ctx, rvh.va, rvh.rkey, rvh.len), (0x66, 1, 0x4000, 0xcccc_dddd, 5000));
    assert_eq!(rest, &[5000u64.to_be_bytes(), 0u64.to_be_bytes()].concat()[..]);
    assert_eq!(RndvRequest::parse(&req), Some(r));
    // The pre-grant flag is the meta-data's second word.
    let pre = RndvRequest { pregranted: true, ..r };
    let req2 = pre.encode();
    assert_eq!(&req2[TMH_LEN + RVH_LEN + 8..], &1u64.to_be_bytes());
    assert_eq!(RndvRequest::parse(&req2), Some(pre));
    assert!(RndvRequest::pregranted(&req2) && !RndvRequest::pregranted(&req) && !RndvRequest::pregranted(&req2[..RNDV_REQ_LEN - 1]));
    // 2^32 + 5 bytes: the RVH says "in the meta-data", software reads it there.
    let long = RndvRequest { len: (1 << 32) + 5, ..r };
    let req = long.encode();
    assert_eq!(Rvh::decode(&req[TMH_LEN..]).unwrap().len, RVH_LEN_IN_META);
    assert_eq!(RndvRequest::payload_len(&req), Some((1 << 32) + 5));
    assert_eq!(RndvRequest::parse(&req), Some(long));
    // Exactly u32::MAX takes the same path.
    let edge = RndvRequest { len: u64::from(u32::MAX), ..r };
    assert_eq!(RndvRequest::payload_len(&edge.encode()), Some(u64::from(u32::MAX)));
    // The marker without its meta-data, or with a length the RVH could have held, is refused.
    assert_eq!(RndvRequest::payload_len(&req[..TMH_LEN + RVH_LEN]), None);
    let mut bad = req;
    bad[TMH_LEN + RVH_LEN..TMH_LEN + RVH_LEN + 8].copy_from_slice(&7u64.to_be_bytes());
    assert_eq!(RndvRequest::payload_len(&bad), None);
    assert_eq!(RndvRequest::parse(&eager(1, 0, b"0123456789abcdef0123456789abcdef")), None);

    // The hardware never serves a long message: no tagged buffer is as long as the marker, so
    // it completes RNDV_INCOMPLETE with the request in the buffer and software finishes.
    let mut s = srq(4, 8, 1);
    assert_eq!(s.post_srq_op(&OpsWr::add(1, 0x66, ALL, 7, MAX_TAGGED_LEN + 1, 0, true)), Err(TmErrno::Inval), "an sge is 32-bit");
    add(&mut s, 0x66, ALL, 7, MAX_TAGGED_LEN - 1, 0);
    let p = place(s.arrive(0, &req).unwrap());
    assert_eq!(p.bytes(&req), &req[..]);
    let wc = s.poll_cq().unwrap();
    assert_eq!(wc.status, WcStatus::TmRndvIncomplete);
    assert_eq!(RndvRequest::payload_len(p.bytes(&req)), Some((1 << 32) + 5));
}

/// Issue 55 item 11: the model accepted a tagged buffer of exactly `u32::MAX` bytes, the RVH
/// length that means "in the meta-data". An expected request for a payload of 4 GiB or more
/// then became a read of `u32::MAX` bytes, and the payload was cut short with a success. ADDs
/// stop one byte below it, and such a request always ends in software.
///
/// CONFORMANCE.md: T18, T26.
#[test]
fn a_tagged_buffer_never_reaches_the_rvh_length_marker() {
    let mut s = srq(4, 8, 1);
    assert_eq!(MAX_TAGGED_LEN as u64, u64::from(RVH_LEN_IN_META) - 1);
    for len in [RVH_LEN_IN_META as usize, usize::MAX] {
        assert_eq!(s.post_srq_op(&OpsWr::add(1, 0x77, ALL, 7, len, 0, true)), Err(TmErrno::Inval), "ADD of {len} bytes");
    }
    assert_eq!(s.tags_listed(), 0, "a refused ADD changes nothing");
    // The longest buffer the model takes completes a 5 GiB request in software.
    let h = add(&mut s, 0x77, ALL, 7, MAX_TAGGED_LEN, 0);
    let req = RndvRequest { app_ctx: 0, tag: 0x77, va: 0x4000, rkey: 3, len: 5 << 30, pregranted: false }.encode();
    let p = place(s.arrive(0, &req).unwrap());
    assert_eq!(p.buffer, Buffer::Tagged { recv_wr_id: 7, handle: h });
    assert_eq!(s.poll_cq().unwrap().status, WcStatus::TmRndvIncomplete);
    assert_eq!(RndvRequest::payload_len(p.bytes(&req)), Some(5 << 30));
    // A request of exactly u32::MAX bytes takes the same path: it never becomes a read.
    add(&mut s, 0x78, ALL, 8, MAX_TAGGED_LEN, 0);
    let edge = rndv(0x78, 0, 0x4000, 3, RVH_LEN_IN_META);
    assert!(matches!(s.arrive(0, &edge).unwrap(), Arrival::Place(_)), "no read of u32::MAX bytes");
    assert_eq!(s.poll_cq().unwrap().status, WcStatus::TmRndvIncomplete);
}

/// CONFORMANCE.md: T62.
#[test]
fn rendezvous_into_a_smaller_buffer_is_rndv_incomplete() {
    let mut s = srq(4, 8, 1);
    let h = add(&mut s, 0x55, ALL, 7, 100, 0);
    let req = RndvRequest { app_ctx: 2, tag: 0x55, va: 0x10, rkey: 9, len: 101, pregranted: false }.encode();
    let p = place(s.arrive(1, &req).unwrap());
    assert_eq!(p.buffer, Buffer::Tagged { recv_wr_id: 7, handle: h });
    assert_eq!(p.bytes(&req), &req[..], "TMH, RVH and meta-data land in the tagged buffer");
    let wc = s.poll_cq().unwrap();
    assert_eq!(
        (wc.status, wc.flags, wc.byte_len),
        (WcStatus::TmRndvIncomplete, WcFlags::TM_MATCH | WcFlags::TM_DATA_VALID, RNDV_REQ_LEN as u64)
    );
    assert_eq!(wc.read_tm_info(), Some((0x55, 2)));
    assert!(s.poll_cq().is_none() && s.poll_transmit().is_none(), "software finishes");
    assert_eq!(s.counters().rndv_incomplete, 1);
    assert_eq!(s.counters().hw_matched, 1);
    // Without meta-data, the RVH length decides; a buffer smaller than the headers gets
    // what fits.
    add(&mut s, 0x56, ALL, 8, 20, 0);
    let req = rndv(0x56, 0, 0, 0, 21);
    assert_eq!(place(s.arrive(1, &req).unwrap()).len, 20);
    assert_eq!(s.poll_cq().unwrap().status, WcStatus::TmRndvIncomplete);
}

/// CONFORMANCE.md: T65.
#[test]
fn rendezvous_read_failure_completes_with_the_error_and_no_fin() {
    let mut s = srq(1, 8, 1);
    add(&mut s, 0x55, ALL, 7, 4096, 0);
    let Arrival::Read(r) = s.arrive(3, &rndv(0x55, 0, 1, 2, 3)).unwrap() else { panic!() };
    assert_eq!(s.read_failed(r.id, WcStatus::Success), Err(TmErrno::Inval));
    s.read_failed(r.id, WcStatus::RemAccessErr).unwrap();
    let wcs = drain(&mut s);
    assert_eq!(wcs.len(), 2);
    assert_eq!((wcs[1].status, wcs[1].flags, wcs[1].wr_id), (WcStatus::RemAccessErr, WcFlags::TM_DATA_VALID, 7));
    assert!(!wcs[1].is_unexpected());
    assert!(s.poll_transmit().is_none());
    assert_eq!(s.counters().read_failures, 1);
    assert_eq!(s.read_complete(r.id), Err(TmErrno::Inval));
    // The handle is reused (one-entry list); the old id stays dead.
    add(&mut s, 0x55, ALL, 8, 4096, 0);
    let Arrival::Read(r2) = s.arrive(3, &rndv(0x55, 0, 1, 2, 3)).unwrap() else { panic!() };
    assert_eq!(r2.handle, r.handle);
    assert_eq!(s.read_complete(r.id), Err(TmErrno::Inval), "stale id");
    s.read_complete(r2.id).unwrap();
}

// ---------------------------------------------------------------- multi-packet messages

/// CONFORMANCE.md: T58.
#[test]
fn multi_packet_eager_matches_first_then_data_valid() {
    let mut s = srq(1, 8, 1);
    let h = add(&mut s, 0x42, ALL, 7, 10, 0);
    let msg = eager(0x42, 3, b"0123456789AB"); // 12-byte payload into a 10-byte buffer
    let (a, b, c) = (&msg[..20], &msg[20..24], &msg[24..]);
    let p = place(s.arrive_first(5, a, msg.len()).unwrap());
    assert_eq!((p.src_off, p.dst_off, p.bytes(a)), (TMH_LEN, 0, &b"0123"[..]));
    let wc = s.poll_cq().unwrap();
    assert_eq!((wc.flags, wc.wr_id, wc.handle, wc.status), (WcFlags::TM_MATCH, 7, h, WcStatus::Success));
    assert_eq!(wc.read_tm_info(), Some((0x42, 3)));
    // The entry is not free yet: the list (one entry) is still full.
    assert_eq!(s.post_srq_op(&OpsWr::add(1, 1, ALL, 1, 1, 0, true)), Err(TmErrno::NoMem));
    // Another source's message interleaves; a second message from 5 may not.
    s.post_srq_recv(100, 64).unwrap();
    assert_eq!(srq_wr(s.arrive(6, &eager(0x42, 0, b"")).unwrap()), 100);
    assert_eq!(s.arrive(5, &eager(0x42, 0, b"")), Err(TmErrno::Inval));
    assert_eq!(s.arrive_continuation(6, b"x"), Err(TmErrno::Inval));
    assert_eq!(s.arrive_continuation(5, &[0; 9]), Err(TmErrno::BadMsg));
    let p = place(s.arrive_continuation(5, b).unwrap());
    assert_eq!((p.dst_off, p.bytes(b)), (4, &b"4567"[..]));
    assert!(s.poll_cq().unwrap().is_unexpected());
    assert!(s.poll_cq().is_none());
    let p = place(s.arrive_continuation(5, c).unwrap());
    assert_eq!((p.dst_off, p.bytes(c)), (8, &b"89"[..]), "cut at the buffer's end");
    let wc = s.poll_cq().unwrap();
    assert_eq!((wc.flags, wc.wr_id, wc.byte_len, wc.status), (WcFlags::TM_DATA_VALID, 7, 12, WcStatus::LocLenErr));
    assert_eq!(add(&mut s, 1, ALL, 1, 1, 1), h);
    assert_eq!(s.arrive_continuation(5, b""), Err(TmErrno::Inval), "message over");
}

#[test]
fn multi_packet_unexpected_and_no_tag_complete_with_their_last_packet() {
    let mut s = srq(1, 8, 4);
    s.post_srq_recv(100, 64).unwrap();
    s.post_srq_recv(101, 64).unwrap();
    let msg = eager(0x42, 3, b"0123456789");
    let p = place(s.arrive_first(5, &msg[..20], msg.len()).unwrap());
    assert_eq!((p.buffer, p.len), (Buffer::Srq { wr_id: 100 }, 20));
    assert_eq!(s.hw_unexpected_cnt(), 1, "counted when the hardware decided");
    assert!(s.poll_cq().is_none());
    let p = place(s.arrive_continuation(5, &msg[20..]).unwrap());
    assert_eq!((p.dst_off, p.len), (20, msg.len() - 20));
    let wc = s.poll_cq().unwrap();
    assert!(wc.is_unexpected());
    assert_eq!(wc.byte_len, msg.len() as u64);
    let nt = [0u8; 100];
    let p = place(s.arrive_first(5, &nt[..50], 100).unwrap());
    assert_eq!(p.buffer, Buffer::Srq { wr_id: 101 });
    assert_eq!(place(s.arrive_continuation(5, &nt[50..]).unwrap()).len, 14);
    let wc = s.poll_cq().unwrap();
    assert_eq!((wc.opcode, wc.status, wc.byte_len), (WcOpcode::TmNoTag, WcStatus::LocLenErr, 100));
}

/// CONFORMANCE.md: T65.
#[test]
fn abort_message_flushes_a_half_received_message() {
    let mut s = srq(1, 8, 4);
    let h = add(&mut s, 0x42, ALL, 7, 64, 0);
    s.post_srq_recv(100, 64).unwrap();
    let msg = eager(0x42, 3, &[1; 30]);
    s.arrive_first(5, &msg[..20], msg.len()).unwrap();
    s.arrive_first(6, &msg[..20], msg.len()).unwrap();
    assert!(!s.abort_message(7));
    assert!(s.abort_message(5));
    assert!(s.abort_message(6));
    assert_eq!(s.arrive_continuation(5, &msg[20..]), Err(TmErrno::Inval));
    let wcs = drain(&mut s);
    assert_eq!(wcs.len(), 3);
    assert_eq!((wcs[0].flags, wcs[0].wr_id), (WcFlags::TM_MATCH, 7));
    // The unexpected message from 6 took its place in the queue with its first packet.
    assert_eq!((wcs[1].status, wcs[1].wr_id), (WcStatus::WrFlushErr, 100));
    assert!(wcs[1].is_unexpected(), "counted by HW: software must count it too");
    assert_eq!((wcs[2].flags, wcs[2].status, wcs[2].wr_id), (WcFlags::TM_DATA_VALID, WcStatus::WrFlushErr, 7));
    // The entry was freed; the source can send again.
    assert_eq!(add(&mut s, 0x42, ALL, 8, 64, 1), h);
    assert_eq!(tagged_wr(s.arrive(5, &msg).unwrap()), 8);
}

// ---------------------------------------------------------------- malformed input

/// CONFORMANCE.md: T15, T33, T66.
#[test]
fn malformed_arrivals_are_ebadmsg_and_change_nothing() {
    let mut s = srq(4, 8, 4);
    add(&mut s, 1, ALL, 7, 64, 0);
    s.post_srq_recv(100, 64).unwrap();
    let long_rndv = {
        let mut m = rndv(1, 0, 0, 0, 1);
        m.extend_from_slice(&[0; 33]);
        m
    };
    let cases: Vec<(Vec<u8>, usize)> = vec![
        (vec![], 0),
        (vec![9, 0, 0], 3),
        (eager(1, 0, b"")[..10].to_vec(), 10),
        (eager(1, 0, b"")[..10].to_vec(), 100),
        (rndv(1, 0, 0, 0, 1)[..20].to_vec(), 20),
        (long_rndv.clone(), long_rndv.len()),
        (rndv(1, 0, 0, 0, 1), 40),
        (eager(1, 0, b"ab"), 3),
    ];
    for (m, total) in cases {
        assert_eq!(s.arrive_first(0, &m, total), Err(TmErrno::BadMsg), "{m:?} / {total}");
    }
    assert_eq!(s.tags_listed(), 1);
    assert_eq!(s.srq_posted(), 1);
    assert!(s.poll_cq().is_none());
    assert_eq!(s.hw_unexpected_cnt(), 0);
    assert_eq!(s.arrive_continuation(0, b"x"), Err(TmErrno::Inval));
    // Reserved TMH bytes are not the hardware's business (rdma-core's suite sends them
    // non-zero): the message matches.
    let mut reserved = eager(1, 0, b"r");
    reserved[1..4].copy_from_slice(b"ccc");
    assert_eq!(tagged_wr(s.arrive(0, &reserved).unwrap()), 7);
}

// ---------------------------------------------------------------- property test

mod prop {
    use super::*;
    use proptest::prelude::*;
    use std::collections::{HashMap, HashSet};

    #[derive(Debug, Clone)]
    enum Step {
        Add { tag: u64, mask: u64, len: usize, signaled: bool, cnt: CntChoice },
        Del { pick: usize, signaled: bool, cnt: CntChoice },
        Sync { signaled: bool, cnt: CntChoice },
        Eager { src: u32, tag: u64, multi: bool },
        Rndv { src: u32, tag: u64, len: u32 },
        NoTag { src: u32 },
        Continue { src: u32 },
        Abort { src: u32 },
        Poll(u8),
        PostSrq,
        ReadDone { pick: usize, ok: bool },
        Garbage(Vec<u8>),
    }

    #[derive(Debug, Clone, Copy)]
    enum CntChoice {
        /// What software has polled (the honest count).
        Honest,
        /// No TM_SYNC flag.
        Absent,
        /// Anything.
        Random(u32),
    }

    fn cnt() -> impl Strategy<Value = CntChoice> {
        prop_oneof![
            4 => Just(CntChoice::Honest),
            2 => Just(CntChoice::Absent),
            1 => any::<u32>().prop_map(CntChoice::Random),
        ]
    }

    const MASKS: [u64; 3] = [u64::MAX, !0xff, 0];

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            5 => (0u64..6, 0usize..3, 0usize..40, any::<bool>(), cnt())
                .prop_map(|(tag, m, len, signaled, cnt)| Step::Add { tag, mask: MASKS[m], len, signaled, cnt }),
            2 => (any::<usize>(), any::<bool>(), cnt()).prop_map(|(pick, signaled, cnt)| Step::Del { pick, signaled, cnt }),
            1 => (any::<bool>(), cnt()).prop_map(|(signaled, cnt)| Step::Sync { signaled, cnt }),
            5 => (0u32..3, 0u64..6, any::<bool>()).prop_map(|(src, tag, multi)| Step::Eager { src, tag, multi }),
            2 => (0u32..3, 0u64..6, 0u32..60).prop_map(|(src, tag, len)| Step::Rndv { src, tag, len }),
            1 => (0u32..3).prop_map(|src| Step::NoTag { src }),
            2 => (0u32..3).prop_map(|src| Step::Continue { src }),
            1 => (0u32..3).prop_map(|src| Step::Abort { src }),
            4 => (1u8..6).prop_map(Step::Poll),
            3 => Just(Step::PostSrq),
            2 => (any::<usize>(), any::<bool>()).prop_map(|(pick, ok)| Step::ReadDone { pick, ok }),
            1 => proptest::collection::vec(any::<u8>(), 0..40).prop_map(Step::Garbage),
        ]
    }

    /// The reference: a plain list scanned in order, with the phase rule stated as
    /// generations (an entry added out of phase is eligible once a later op is level).
    #[derive(Default)]
    struct Reference {
        list: Vec<RefEntry>,
        gen: u64,
        hw: u16,
        sw: u16,
    }

    struct RefEntry {
        handle: u32,
        recv_wr_id: u64,
        tag: u64,
        mask: u64,
        eligible_from: u64,
    }

    impl Reference {
        fn op(&mut self, cnt: Option<u16>) -> bool {
            if let Some(c) = cnt {
                self.sw = c;
            }
            let level = self.sw == self.hw;
            if level {
                self.gen += 1;
            }
            level
        }

        fn find(&self, tag: u64) -> Option<usize> {
            self.list.iter().position(|e| tag & e.mask == e.tag & e.mask && self.gen >= e.eligible_from)
        }
    }

    fn is_srq(p: &Placement) -> bool {
        matches!(p.buffer, Buffer::Srq { .. })
    }

    fn msg_eager(tag: u64, len: usize) -> Vec<u8> {
        eager(tag, tag as u32, &vec![0xab; len])
    }

    type Checked = Result<(), TestCaseError>;

    /// The model under test beside the reference, and what the steps have seen so far.
    struct Run {
        s: TmSrq,
        r: Reference,
        next_wr: u64,
        polled_unexp: u32,
        /// recv_wr_id -> handle, while the entry may still complete.
        live: HashMap<u64, u32>,
        handles_in_use: HashSet<u32>,
        matched: HashSet<u64>,
        finished: HashSet<u64>,
        reads: Vec<ReadRequest>,
        /// Multi-packet eager messages under way, by source: the message and its bytes sent.
        inflight: HashMap<u32, (Vec<u8>, usize)>,
        fins_expected: usize,
        fins_seen: usize,
        srq_free: usize,
    }

    impl Run {
        fn new() -> Run {
            Run {
                s: srq(6, 8, 4),
                r: Reference::default(),
                next_wr: 1,
                polled_unexp: 0,
                live: HashMap::new(),
                handles_in_use: HashSet::new(),
                matched: HashSet::new(),
                finished: HashSet::new(),
                reads: Vec::new(),
                inflight: HashMap::new(),
                fins_expected: 0,
                fins_seen: 0,
                srq_free: 0,
            }
        }

        /// An operation's flags, its unexpected count and the count the reference sees.
        fn resolve(&self, c: CntChoice, signaled: bool) -> (OpsFlags, u32, Option<u16>) {
            let honest = self.polled_unexp;
            let (f, v, c) = match c {
                CntChoice::Honest => (OpsFlags::TM_SYNC, honest, Some(honest as u16)),
                CntChoice::Absent => (OpsFlags::NONE, 0, None),
                CntChoice::Random(v) => (OpsFlags::TM_SYNC, v, Some(v as u16)),
            };
            (if signaled { f | OpsFlags::SIGNALED } else { f }, v, c)
        }

        fn step(&mut self, st: Step) -> Checked {
            match st {
                Step::Add { tag, mask, len, signaled, cnt } => self.add(tag, mask, len, self.resolve(cnt, signaled))?,
                Step::Del { pick, signaled, cnt } => self.del(pick, signaled, self.resolve(cnt, signaled))?,
                Step::Sync { signaled, cnt } => {
                    let (flags, v, c) = self.resolve(cnt, signaled);
                    let wr = OpsWr { wr_id: 0, opcode: OpsOp::Sync, flags, unexpected_cnt: v, handle: 0 };
                    if self.s.post_srq_op(&wr).is_ok() {
                        self.r.op(c);
                    }
                }
                Step::Eager { src, tag, multi } if !self.inflight.contains_key(&src) => self.eager(src, tag, multi)?,
                Step::Rndv { src, tag, len } if !self.inflight.contains_key(&src) => self.rndv(src, tag, len)?,
                Step::NoTag { src } if !self.inflight.contains_key(&src) => match self.s.arrive(src, &[0, 1, 2, 3]).unwrap() {
                    Arrival::Place(_) => self.srq_free -= 1,
                    Arrival::Rnr => prop_assert_eq!(self.srq_free, 0),
                    Arrival::Read(_) => prop_assert!(false, "NO_TAG read"),
                },
                Step::Eager { src, .. } | Step::Rndv { src, .. } | Step::NoTag { src } => {
                    prop_assert_eq!(self.s.arrive(src, &msg_eager(0, 0)), Err(TmErrno::Inval));
                }
                Step::Continue { src } => match self.inflight.remove(&src) {
                    Some((m, at)) => prop_assert!(matches!(self.s.arrive_continuation(src, &m[at..]).unwrap(), Arrival::Place(_))),
                    None => prop_assert_eq!(self.s.arrive_continuation(src, b"x"), Err(TmErrno::Inval)),
                },
                Step::Abort { src } => prop_assert_eq!(self.s.abort_message(src), self.inflight.remove(&src).is_some()),
                Step::Poll(n) => self.poll(n)?,
                Step::PostSrq => {
                    if self.s.post_srq_recv(0, 64).is_ok() {
                        self.srq_free += 1;
                    }
                }
                Step::ReadDone { pick, ok } => self.read_done(pick, ok)?,
                Step::Garbage(bytes) => {
                    // Whatever it is, it must not panic; valid-looking input is fine too.
                    if bytes.first().is_some_and(|&b| b > 3) || bytes.is_empty() {
                        prop_assert_eq!(self.s.arrive(99, &bytes), Err(TmErrno::BadMsg));
                    }
                }
            }
            self.after_step()
        }

        fn add(&mut self, tag: u64, mask: u64, len: usize, (flags, v, c): (OpsFlags, u32, Option<u16>)) -> Checked {
            let wr =
                OpsWr { wr_id: 0, opcode: OpsOp::Add { tag, mask, recv_wr_id: self.next_wr, len }, flags, unexpected_cnt: v, handle: 0 };
            if let Ok(h) = self.s.post_srq_op(&wr) {
                let h = h.unwrap();
                prop_assert!(self.handles_in_use.insert(h), "handle {} reused while live", h);
                let level = self.r.op(c);
                let eligible_from = if level { 0 } else { self.r.gen + 1 };
                self.r.list.push(RefEntry { handle: h, recv_wr_id: self.next_wr, tag, mask, eligible_from });
                self.live.insert(self.next_wr, h);
                self.next_wr += 1;
            }
            Ok(())
        }

        fn del(&mut self, pick: usize, signaled: bool, (flags, v, c): (OpsFlags, u32, Option<u16>)) -> Checked {
            let handle = if self.live.is_empty() {
                (pick % 6) as u32
            } else {
                let mut hs: Vec<u32> = self.live.values().copied().collect();
                hs.sort_unstable();
                hs[pick % hs.len()]
            };
            let failed_before = self.s.counters().del_failed;
            let wr = OpsWr { wr_id: 0, opcode: OpsOp::Del { handle }, flags, unexpected_cnt: v, handle: 0 };
            if self.s.post_srq_op(&wr).is_err() {
                return Ok(());
            }
            self.r.op(c);
            let in_ref = self.r.list.iter().position(|e| e.handle == handle);
            let failed = self.s.counters().del_failed > failed_before;
            prop_assert_eq!(failed, in_ref.is_none());
            if let Some(i) = in_ref {
                let e = self.r.list.remove(i);
                self.live.remove(&e.recv_wr_id);
                prop_assert!(self.finished.insert(e.recv_wr_id));
                if !signaled {
                    // No completion will tell: the handle may come back once its ADD
                    // completion (if any) is polled.
                    self.handles_in_use.remove(&handle);
                }
            }
            Ok(())
        }

        /// The entry at `i` of the reference matched: the model placed the message in its
        /// tagged buffer.
        fn tagged(&mut self, i: usize, p: &Placement) -> Checked {
            let e = self.r.list.remove(i);
            prop_assert_eq!(p.buffer, Buffer::Tagged { recv_wr_id: e.recv_wr_id, handle: e.handle });
            self.live.remove(&e.recv_wr_id);
            Ok(())
        }

        /// Nothing matched: the message took an SRQ buffer, or none was there (RNR).
        fn unexpected(&mut self, a: Arrival) -> Checked {
            match a {
                Arrival::Place(p) => {
                    prop_assert!(is_srq(&p));
                    prop_assert!(self.srq_free > 0);
                    self.srq_free -= 1;
                    self.r.hw = self.r.hw.wrapping_add(1);
                }
                Arrival::Rnr => prop_assert_eq!(self.srq_free, 0),
                a => prop_assert!(false, "reference: no match, model {:?}", a),
            }
            Ok(())
        }

        fn eager(&mut self, src: u32, tag: u64, multi: bool) -> Checked {
            let m = msg_eager(tag, 30);
            let first = if multi { 20 } else { m.len() };
            let a = self.s.arrive_first(src, &m[..first], m.len()).unwrap();
            match (self.r.find(tag), a) {
                (Some(i), Arrival::Place(p)) => self.tagged(i, &p)?,
                (None, a) => self.unexpected(a)?,
                (f, a) => prop_assert!(false, "reference {:?}, model {:?}", f, a),
            }
            if multi && matches!(a, Arrival::Place(_)) {
                self.inflight.insert(src, (m, first));
            }
            Ok(())
        }

        fn rndv(&mut self, src: u32, tag: u64, len: u32) -> Checked {
            let m = rndv(tag, 0, 0x1000, 5, len);
            match (self.r.find(tag), self.s.arrive(src, &m).unwrap()) {
                (Some(i), Arrival::Read(rd)) => {
                    let e = self.r.list.remove(i);
                    prop_assert_eq!((rd.recv_wr_id, rd.handle, rd.len), (e.recv_wr_id, e.handle, len));
                    self.live.remove(&e.recv_wr_id);
                    self.reads.push(rd);
                }
                (Some(i), Arrival::Place(p)) => self.tagged(i, &p)?,
                (None, a) => self.unexpected(a)?,
                (f, a) => prop_assert!(false, "reference {:?}, model {:?}", f, a),
            }
            Ok(())
        }

        /// Polls up to `n` completions: each receive matched and finished at most once.
        fn poll(&mut self, n: u8) -> Checked {
            for _ in 0..n {
                let Some(wc) = self.s.poll_cq() else { break };
                if wc.is_unexpected() {
                    self.polled_unexp = self.polled_unexp.wrapping_add(1);
                }
                if wc.opcode == WcOpcode::TmRecv && wc.flags.contains(WcFlags::TM_MATCH) {
                    prop_assert!(self.matched.insert(wc.wr_id), "matched twice: {}", wc.wr_id);
                }
                if wc.opcode == WcOpcode::TmRecv && wc.flags.contains(WcFlags::TM_DATA_VALID) {
                    prop_assert!(self.matched.contains(&wc.wr_id));
                    prop_assert!(self.finished.insert(wc.wr_id), "finished twice: {}", wc.wr_id);
                    self.handles_in_use.remove(&wc.handle);
                }
                if wc.opcode == WcOpcode::TmDel && wc.status == WcStatus::Success {
                    self.handles_in_use.remove(&wc.handle);
                }
            }
            Ok(())
        }

        fn read_done(&mut self, pick: usize, ok: bool) -> Checked {
            if self.reads.is_empty() {
                return Ok(());
            }
            let rd = self.reads.remove(pick % self.reads.len());
            if ok {
                self.s.read_complete(rd.id).unwrap();
                self.fins_expected += 1;
            } else {
                self.s.read_failed(rd.id, WcStatus::RemAccessErr).unwrap();
            }
            prop_assert_eq!(self.s.read_complete(rd.id), Err(TmErrno::Inval));
            Ok(())
        }

        /// After every step: the FINs sent are FINs, and the model's list and unexpected count
        /// are the reference's.
        fn after_step(&mut self) -> Checked {
            while let Some(t) = self.s.poll_transmit() {
                prop_assert!(matches!(Message::parse(&t.msg), Ok(Message::Fin(..))));
                self.fins_seen += 1;
            }
            prop_assert_eq!(self.s.tags_listed(), self.r.list.len());
            prop_assert_eq!(self.s.hw_unexpected_cnt(), self.r.hw);
            Ok(())
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

        /// CONFORMANCE.md: T67.
        #[test]
        fn random_sequences_match_the_reference_and_consume_at_most_once(
            steps in proptest::collection::vec(step(), 1..200)
        ) {
            let mut run = Run::new();
            for st in steps {
                run.step(st)?;
            }
            prop_assert_eq!(run.fins_seen, run.fins_expected);
        }
    }
}

/// Two SRQs in the same state, for comparing a fused call with the calls it fuses: `bufs`
/// SRQ buffers posted to each, buffer `wr` of `len(wr)` bytes.
fn twins(tags: u32, ops: u32, wr: u32, bufs: u64, len: impl Fn(u64) -> usize) -> (TmSrq, TmSrq) {
    let (mut a, mut b) = (srq(tags, ops, wr), srq(tags, ops, wr));
    for s in [&mut a, &mut b] {
        for wr in 0..bufs {
            s.post_srq_recv(wr, len(wr)).unwrap();
        }
    }
    (a, b)
}

/// The completion of the fused call if it landed unexpected.
fn fused_unexpected(s: &mut TmSrq, src: u32, m: &[u8]) -> Option<Wc> {
    match s.arrive_whole_polled(src, m)? {
        Polled::Unexpected(wc) => Some(wc),
        other => panic!("expected an unexpected arrival, got {other:?}"),
    }
}

#[test]
fn fused_unexpected_arrival_equals_arrive_then_poll() {
    // Two SRQs in the same state; one takes every message through `arrive` + `poll_cq`, the
    // other through the fused call. Past MAX_SYNC_DIFF arrivals both must ask for a sync.
    let (mut a, mut b) = twins(4, 4, 64, 8, |wr| if wr % 2 == 0 { 64 } else { 8 });
    for i in 0..u64::from(MAX_SYNC_DIFF) + 20 {
        let m = eager(i, 7, &i.to_le_bytes()[..(i % 9) as usize]);
        let src = (i % 3) as u32;
        let got = fused_unexpected(&mut b, src, &m).expect("the fused path applies");
        assert_eq!(srq_wr(a.arrive(src, &m).unwrap()), got.wr_id);
        let want = a.poll_cq().expect("a completion");
        assert_eq!(want, got, "message {i}");
        assert!(a.quiet() && b.quiet());
        assert_eq!((a.counters(), a.hw_unexpected_cnt()), (b.counters(), b.hw_unexpected_cnt()));
        a.post_srq_recv(100 + i, 64).unwrap();
        b.post_srq_recv(100 + i, 64).unwrap();
    }
    assert!(fused_unexpected(&mut b, 0, &eager(1, 0, b"x")).unwrap().flags.contains(WcFlags::TM_SYNC_REQ));
}

#[test]
fn fused_matched_arrival_equals_arrive_then_poll() {
    // Tagged buffers of two sizes (one too small for some messages), a wildcard entry, and
    // messages that match nothing while entries are listed: the fused call must place,
    // complete, count and free handles exactly as `arrive` + `poll_cq`.
    let (mut a, mut b) = twins(8, 8, 64, 4, |_| 64);
    for i in 0..200u64 {
        let tag = i % 5;
        for s in [&mut a, &mut b] {
            if s.tags_listed() < 6 {
                let (t, mask) = if i % 7 == 0 { (0, 0) } else { (tag, ALL) };
                // Software has handled every unexpected message: the entry is in phase.
                let cnt = u32::from(s.hw_unexpected_cnt());
                add(s, t, mask, 1000 + i, if i % 3 == 0 { 4 } else { 32 }, cnt);
            }
        }
        let m = eager(tag + (i % 11 == 0) as u64 * 100, 9, &i.to_le_bytes()[..(i % 9) as usize]);
        let src = (i % 3) as u32;
        let got = b.arrive_whole_polled(src, &m).expect("the fused path applies");
        let want_arrival = a.arrive(src, &m).unwrap();
        let want = a.poll_cq().expect("a completion");
        match got {
            Polled::Matched(pl, wc) => {
                assert_eq!(place(want_arrival), pl, "message {i}");
                assert_eq!(want, wc, "message {i}");
            }
            Polled::Unexpected(wc) => {
                assert_eq!(srq_wr(want_arrival), wc.wr_id, "message {i}");
                assert_eq!(want, wc, "message {i}");
                a.post_srq_recv(100 + i, 64).unwrap();
                b.post_srq_recv(100 + i, 64).unwrap();
            }
        }
        assert!(a.quiet() && b.quiet());
        assert_eq!(a.counters(), b.counters(), "message {i}");
        assert_eq!((a.tags_listed(), a.hw_unexpected_cnt()), (b.tags_listed(), b.hw_unexpected_cnt()));
    }
    assert!(b.counters().hw_matched > 50 && b.counters().unexpected > 5, "{:?}", b.counters());
}

#[test]
fn fused_unexpected_arrival_declines_what_it_cannot_decide() {
    let mut s = srq(4, 4, 8);
    // No SRQ buffer: declined, nothing counted (the general path reports RNR).
    assert!(s.arrive_whole_polled(0, &eager(1, 0, b"x")).is_none());
    s.post_srq_recv(1, 64).unwrap();
    s.post_srq_recv(2, 64).unwrap();
    // Not eager, or shorter than a TMH.
    assert!(s.arrive_whole_polled(0, &rndv(1, 0, 0, 0, 8)).is_none());
    assert!(s.arrive_whole_polled(0, &[TmOp::Eager as u8; 4]).is_none());
    // A completion is queued: this one would not be the next polled.
    assert!(matches!(s.arrive(0, &eager(1, 0, b"x")).unwrap(), Arrival::Place(_)));
    assert!(s.arrive_whole_polled(0, &eager(2, 0, b"y")).is_none());
    drain(&mut s);
    // A listed tagged buffer that matches takes it; one that does not lets it land
    // unexpected.
    s.post_srq_recv(3, 64).unwrap();
    add(&mut s, 5, ALL, 50, 64, 1);
    assert!(matches!(s.arrive_whole_polled(0, &eager(9, 0, b"z")), Some(Polled::Unexpected(_))));
    assert!(matches!(s.arrive_whole_polled(0, &eager(5, 0, b"z")), Some(Polled::Matched(..))));
    assert_eq!(s.counters().unexpected, 2);
    assert_eq!(s.tags_listed(), 0);
}

#[test]
fn fused_op_equals_post_then_poll() {
    // ADDs, DELs (of listed, consumed and already deleted entries) and SYNCs, signaled or
    // not, with and without completions queued ahead: the fused call must leave the SRQ as
    // `post_srq_op` + `poll_cq` of its completion does, and return that completion.
    let (mut a, mut b) = twins(8, 16, 16, 16, |_| 64);
    let mut handles = Vec::new();
    for i in 0..300u64 {
        let signaled = i % 5 != 3;
        let cnt = u32::from(a.hw_unexpected_cnt());
        let wr = match i % 6 {
            0..=2 if a.tags_listed() < 6 => OpsWr::add(i, i % 4, ALL, 500 + i, 32, cnt, signaled),
            3 | 4 if !handles.is_empty() => OpsWr::del(i, handles.remove((i as usize * 7) % handles.len()), cnt, signaled),
            _ => OpsWr::sync(i, cnt, signaled),
        };
        // Now and then a completion is queued ahead (an arrival), so the fused call queues.
        if i % 9 == 0 {
            let m = eager(i % 4, 0, b"m");
            for s in [&mut a, &mut b] {
                s.arrive(0, &m).unwrap();
            }
        }
        let queued_ahead = a.cq_len() > 0;
        let want_h = a.post_srq_op(&wr);
        let got = b.post_srq_op_polled(&wr);
        match (want_h, got) {
            (Ok(h), Ok((gh, gwc))) => {
                assert_eq!(h, gh, "op {i}");
                if let Some(h) = h {
                    handles.push(h);
                }
                if queued_ahead {
                    assert!(gwc.is_none(), "op {i}: a completion is queued ahead, the new one must queue");
                } else if let Some(wc) = gwc {
                    assert_eq!(a.poll_cq(), Some(wc), "op {i}");
                }
            }
            (Err(e), Err(g)) => assert_eq!(e, g, "op {i}"),
            (w, g) => panic!("op {i}: {w:?} vs {g:?}"),
        }
        assert_eq!((a.cq_len(), a.tags_listed(), a.ops_outstanding()), (b.cq_len(), b.tags_listed(), b.ops_outstanding()), "op {i}");
        assert_eq!(a.counters(), b.counters(), "op {i}");
        if i % 13 == 0 {
            assert_eq!(drain(&mut a), drain(&mut b), "op {i}");
            for s in [&mut a, &mut b] {
                while s.srq_posted() < 16 {
                    s.post_srq_recv(1000 + i, 64).unwrap();
                }
            }
        }
    }
    assert!(b.counters().adds > 50 && b.counters().dels > 20, "{:?}", b.counters());
}
