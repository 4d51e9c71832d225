//! Every collective and every algorithm variant at 1..=9 ranks over the thread harness, in
//! both send modes, against locally computed expectations.

use std::fmt::Debug;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use super::harness::{run, Mode, ThreadP2p};
use super::run::{allgather, allreduce, alltoall, barrier, bcast, gather, reduce, scatter};
use super::*;
use crate::op::{Op, Reducible};

const RANKS: std::ops::RangeInclusive<usize> = 1..=9;
const MODES: [Mode; 2] = [Mode::Eager, Mode::Rendezvous];

/// Byte pattern of rank `r`, distinct per rank and position.
fn pat(r: usize, i: usize) -> u8 {
    (r * 131 + i * 7 + 1) as u8
}

fn pattern(r: usize, len: usize) -> Vec<u8> {
    (0..len).map(|i| pat(r, i)).collect()
}

fn all_ok<R: Debug>(res: Vec<Result<R>>) -> Vec<R> {
    res.into_iter().enumerate().map(|(r, x)| x.unwrap_or_else(|e| panic!("rank {r}: {e}"))).collect()
}

// ---- barrier --------------------------------------------------------------------------------

#[test]
fn barrier_synchronizes() {
    for n in RANKS {
        for mode in MODES {
            let arrived = AtomicUsize::new(0);
            let res = run(n, mode, |c| -> Result<()> {
                for round in 0..3 {
                    if c.rank() == round % n {
                        // The latecomer: without a barrier the others would run ahead.
                        std::thread::sleep(Duration::from_millis(3));
                    }
                    arrived.fetch_add(1, Ordering::SeqCst);
                    barrier(c)?;
                    let seen = arrived.load(Ordering::SeqCst);
                    if seen < n * (round + 1) {
                        return Err(Error::State(format!("left round {round} after {seen}")));
                    }
                    barrier(c)?;
                }
                Ok(())
            });
            all_ok(res);
        }
    }
}

#[test]
fn barrier_message_count_is_logarithmic() {
    for n in RANKS {
        let sent = all_ok(run(n, Mode::Eager, |c| barrier(c).map(|()| *c.sent.borrow())));
        let rounds = n.next_power_of_two().trailing_zeros() as usize;
        assert!(sent.iter().all(|&s| s == rounds), "{n} ranks: {sent:?}");
    }
}

// ---- bcast ----------------------------------------------------------------------------------

type BcastFn = fn(&ThreadP2p, &mut [u8], usize) -> Result<()>;

#[test]
fn bcast_all_algorithms() {
    let algos: [(&str, BcastFn); 3] =
        [("dispatch", bcast), ("binomial", bcast::bcast_binomial), ("scatter_ring", bcast::bcast_scatter_ring)];
    for n in RANKS {
        for root in 0..n {
            for len in [0, 1, 7, 1000, BCAST_LONG_BYTES + 13, 100_003] {
                for (name, f) in algos {
                    if len == 100_003 && name == "binomial" {
                        continue;
                    }
                    let mode = MODES[(n + root + len) % 2];
                    let got = all_ok(run(n, mode, |c| {
                        let mut buf = if c.rank() == root { pattern(root, len) } else { vec![0; len] };
                        f(c, &mut buf, root).map(|()| buf)
                    }));
                    let want = pattern(root, len);
                    for (r, g) in got.iter().enumerate() {
                        assert!(g == &want, "{name} n={n} root={root} len={len} rank {r}");
                    }
                }
            }
        }
    }
}

// ---- reductions -----------------------------------------------------------------------------

/// Element types with a per-(rank, index) generator whose reductions are exact in any order
/// (integers wrap; float values are small integers, so sums and products do not round).
trait Elem: Reducible + PartialEq + Debug {
    fn gen(rank: usize, i: usize) -> Self;
}
impl Elem for i64 {
    fn gen(rank: usize, i: usize) -> Self {
        ((rank * 7919 + i * 104_729) % 251) as i64 - 125
    }
}
impl Elem for u8 {
    fn gen(rank: usize, i: usize) -> Self {
        (rank * 37 + i * 11 + (i % 3 == 0) as usize * 100) as u8
    }
}
impl Elem for f64 {
    fn gen(rank: usize, i: usize) -> Self {
        ((rank * 31 + i * 17) % 9) as f64 - 4.0
    }
}
impl Elem for f32 {
    fn gen(rank: usize, i: usize) -> Self {
        ((rank * 13 + i * 5) % 7) as f32 - 3.0
    }
}
impl Elem for u128 {
    fn gen(rank: usize, i: usize) -> Self {
        (u128::MAX / 3).wrapping_mul((rank * 5 + i + 1) as u128)
    }
}

fn contribution<T: Elem>(rank: usize, len: usize) -> Vec<T> {
    (0..len).map(|i| T::gen(rank, i)).collect()
}

/// The reduction of every rank's contribution, computed rank by rank.
fn expected<T: Elem>(n: usize, len: usize, op: Op) -> Vec<T> {
    let mut acc = contribution::<T>(0, len);
    for r in 1..n {
        T::reduce_into(op, &mut acc, &contribution::<T>(r, len)).unwrap();
    }
    acc
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum RAlgo {
    Dispatch,
    /// Binomial reduce / recursive-doubling allreduce.
    Binomial,
    Rabenseifner,
    /// Ring allreduce (reduce: not applicable, skipped).
    Ring,
}

/// Allreduce of `send` into `out` with algorithm `a`.
fn allreduce_with<T: Reducible>(c: &ThreadP2p, send: &[T], out: &mut [T], op: Op, a: RAlgo) -> Result<()> {
    if a == RAlgo::Dispatch {
        return allreduce(c, send, out, op);
    }
    // Rabenseifner reads the contribution from `send` (odd lengths; `out` stays as it was)
    // or from `out` (even lengths).
    if a == RAlgo::Rabenseifner && send.len() % 2 == 1 {
        return reduce::allreduce_rabenseifner(c, Some(send), out, op);
    }
    out.copy_from_slice(send);
    match a {
        RAlgo::Binomial => reduce::allreduce_recursive_doubling(c, out, op),
        RAlgo::Rabenseifner => reduce::allreduce_rabenseifner(c, None, out, op),
        _ => reduce::allreduce_ring(c, out, op),
    }
}

fn run_reduce<T: Elem>(n: usize, mode: Mode, len: usize, op: Op, root: usize, a: RAlgo) {
    if a == RAlgo::Ring {
        return;
    }
    let got = all_ok(run(n, mode, |c| {
        let send = contribution::<T>(c.rank(), len);
        let mut out = vec![T::zeroed(); len];
        let recv = (c.rank() == root).then_some(&mut out[..]);
        match a {
            RAlgo::Dispatch => reduce(c, &send, recv, op, root),
            RAlgo::Binomial => reduce::reduce_binomial(c, &send, recv, op, root),
            RAlgo::Rabenseifner => reduce::reduce_rabenseifner(c, &send, recv, op, root),
            RAlgo::Ring => Err(Error::State("no ring reduce".into())),
        }
        .map(|()| out)
    }));
    let want = expected::<T>(n, len, op);
    assert!(got[root] == want, "reduce {a:?} {} {op} n={n} root={root} len={len}", T::TYPE_NAME);
}

fn run_allreduce<T: Elem>(n: usize, mode: Mode, len: usize, op: Op, a: RAlgo) {
    let got = all_ok(run(n, mode, |c| {
        let send = contribution::<T>(c.rank(), len);
        let mut out = vec![T::zeroed(); len];
        allreduce_with(c, &send, &mut out, op, a).map(|()| out)
    }));
    let want = expected::<T>(n, len, op);
    for (r, g) in got.iter().enumerate() {
        assert!(g == &want, "allreduce {a:?} {} {op} n={n} len={len} rank {r}", T::TYPE_NAME);
    }
}

const ALGOS: [RAlgo; 4] = [RAlgo::Dispatch, RAlgo::Binomial, RAlgo::Rabenseifner, RAlgo::Ring];

fn reductions_for<T: Elem>(ops: &[Op]) {
    for n in RANKS {
        for (k, &op) in ops.iter().enumerate() {
            for len in [0, 1, 7, 300] {
                let mode = MODES[(n + k + len) % 2];
                for a in ALGOS {
                    run_allreduce::<T>(n, mode, len, op, a);
                    // Root 0 and one more that moves with the case.
                    for root in [0, (k + len) % n] {
                        run_reduce::<T>(n, mode, len, op, root, a);
                    }
                }
            }
        }
    }
}

const FLOAT_OPS: [Op; 6] = [Op::Sum, Op::Prod, Op::Min, Op::Max, Op::LogicalAnd, Op::LogicalOr];

#[test]
fn reductions_i64_every_op() {
    reductions_for::<i64>(&Op::ALL);
}

#[test]
fn reductions_u8_wrapping_and_bitwise() {
    reductions_for::<u8>(&[Op::Sum, Op::Prod, Op::BitAnd, Op::LogicalOr]);
}

#[test]
fn reductions_f64_every_op() {
    reductions_for::<f64>(&FLOAT_OPS);
}

#[test]
fn reductions_f32_and_u128() {
    reductions_for::<f32>(&[Op::Sum, Op::Max]);
    reductions_for::<u128>(&[Op::Prod, Op::BitXor]);
}

#[test]
fn reductions_large() {
    // 100k elements: every algorithm, at power-of-two and other rank counts.
    for n in [3, 8, 9] {
        let mode = MODES[n % 2];
        for a in ALGOS {
            run_allreduce::<f64>(n, mode, 100_000, Op::Sum, a);
            run_reduce::<f64>(n, mode, 100_000, Op::Sum, n - 1, a);
        }
    }
    run_allreduce::<i64>(6, Mode::Rendezvous, 100_003, Op::Max, RAlgo::Dispatch);
}

/// Inexact float data: every rank must still end with the same bits, close to the exact sum.
#[test]
fn allreduce_float_results_identical_on_all_ranks() {
    let gen = |r: usize, i: usize| ((r * 1000 + i) as f64 * 0.37).sin() * 10f64.powi((i % 7) as i32);
    for n in RANKS {
        for len in [1, 5, 300, 5000] {
            for a in ALGOS {
                let mode = MODES[(n + len) % 2];
                let got = all_ok(run(n, mode, |c| {
                    let send: Vec<f64> = (0..len).map(|i| gen(c.rank(), i)).collect();
                    let mut out = vec![0.0; len];
                    allreduce_with(c, &send, &mut out, Op::Sum, a).map(|()| out.iter().map(|x| x.to_bits()).collect::<Vec<u64>>())
                }));
                for (r, g) in got.iter().enumerate() {
                    assert!(g == &got[0], "{a:?} n={n} len={len}: rank {r} differs from rank 0");
                }
                for (i, bits) in got[0].iter().enumerate() {
                    let want: f64 = (0..n).map(|r| gen(r, i)).sum();
                    let scale: f64 = (0..n).map(|r| gen(r, i).abs()).sum();
                    let v = f64::from_bits(*bits);
                    assert!((v - want).abs() <= 1e-14 * scale, "{v} vs {want}");
                }
            }
        }
    }
}

/// NaNs and signed zeros: Min/Max/Sum/Prod must agree across ranks (bit for bit but for NaN payloads).
#[test]
fn allreduce_nan_and_signed_zero_identical_on_all_ranks() {
    let special = [f32::from_bits(0x7fc0_0001), f32::from_bits(0xffc0_0002), -0.0, 0.0, 1.0, f32::from_bits(0x7fc0_0003)];
    for n in RANKS {
        for op in [Op::Min, Op::Max, Op::Sum, Op::Prod] {
            for a in ALGOS {
                let len = 600;
                let got = all_ok(run(n, MODES[n % 2], |c| {
                    let send: Vec<f32> = (0..len).map(|i| special[(c.rank() * 7 + i * 3 + i / 6) % 6]).collect();
                    let mut out = vec![0.0f32; len];
                    // NaN payloads are not preserved by the compiler (it may commute a + b), so
                    // any NaN counts as one value; everything else must agree bit for bit.
                    allreduce_with(c, &send, &mut out, op, a)
                        .map(|()| out.iter().map(|x| if x.is_nan() { 0x7fc0_0000 } else { x.to_bits() }).collect::<Vec<u32>>())
                }));
                for g in &got {
                    assert!(g == &got[0], "{a:?} {op} n={n}: ranks differ");
                }
            }
        }
    }
}

// ---- gather / scatter -----------------------------------------------------------------------

type GatherFn = fn(&ThreadP2p, &[u8], Option<&mut [u8]>, usize) -> Result<()>;
type ScatterFn = fn(&ThreadP2p, Option<&[u8]>, &mut [u8], usize) -> Result<()>;

#[test]
fn gather_all_algorithms() {
    let algos: [(&str, GatherFn); 3] = [("dispatch", gather), ("binomial", gather::gather_binomial), ("linear", gather::gather_linear)];
    for n in RANKS {
        for root in 0..n {
            for blk in [0, 1, 5, GATHER_LINEAR_BYTES + 3] {
                for (name, f) in algos {
                    if blk == 0 && name != "dispatch" {
                        continue;
                    }
                    let mode = MODES[(n + root + blk) % 2];
                    let got = all_ok(run(n, mode, |c| {
                        let send = pattern(c.rank(), blk);
                        let mut out = vec![0; n * blk];
                        // Non-roots pass Some too: it must be ignored.
                        let recv = if c.rank() == root || c.rank() % 2 == 1 { Some(&mut out[..]) } else { None };
                        f(c, &send, recv, root).map(|()| out)
                    }));
                    let want: Vec<u8> = (0..n).flat_map(|r| pattern(r, blk)).collect();
                    assert!(got[root] == want, "{name} n={n} root={root} blk={blk}");
                }
            }
        }
    }
}

#[test]
fn scatter_all_algorithms() {
    let algos: [(&str, ScatterFn); 3] = [("dispatch", scatter), ("binomial", gather::scatter_binomial), ("linear", gather::scatter_linear)];
    for n in RANKS {
        for root in 0..n {
            for blk in [0, 1, 5, GATHER_LINEAR_BYTES + 3] {
                for (name, f) in algos {
                    if blk == 0 && name != "dispatch" {
                        continue;
                    }
                    let mode = MODES[(n + root + blk + 1) % 2];
                    let all: Vec<u8> = (0..n).flat_map(|r| pattern(r + 50, blk)).collect();
                    let got = all_ok(run(n, mode, |c| {
                        let mut out = vec![0; blk];
                        // Non-roots may pass garbage: ignored.
                        let junk = [9u8; 3];
                        let send = if c.rank() == root {
                            Some(&all[..])
                        } else if c.rank() % 2 == 1 {
                            Some(&junk[..])
                        } else {
                            None
                        };
                        f(c, send, &mut out, root).map(|()| out)
                    }));
                    for (r, g) in got.iter().enumerate() {
                        assert!(g == &pattern(r + 50, blk), "{name} n={n} root={root} rank {r}");
                    }
                }
            }
        }
    }
}

// ---- allgather / alltoall -------------------------------------------------------------------

#[test]
fn allgather_all_algorithms() {
    for n in RANKS {
        for blk in [0, 1, 5, 1000, 100_003] {
            for name in ["dispatch", "recursive_doubling", "bruck", "ring"] {
                if (name == "recursive_doubling" && !n.is_power_of_two())
                    || (blk == 0 && name != "dispatch")
                    || (blk == 100_003 && name != "dispatch" && name != "ring")
                {
                    continue;
                }
                let mode = MODES[(n + blk) % 2];
                let got = all_ok(run(n, mode, |c| {
                    let r = c.rank();
                    let send = pattern(r, blk);
                    let mut out = vec![0; n * blk];
                    match name {
                        "dispatch" => allgather(c, &send, &mut out),
                        "bruck" => allgather::allgather_bruck(c, &send, &mut out),
                        _ => {
                            out[r * blk..(r + 1) * blk].copy_from_slice(&send);
                            if name == "ring" {
                                allgather::allgather_ring(c, &mut out, blk)
                            } else {
                                allgather::allgather_recursive_doubling(c, &mut out, blk)
                            }
                        }
                    }
                    .map(|()| out)
                }));
                let want: Vec<u8> = (0..n).flat_map(|r| pattern(r, blk)).collect();
                for (r, g) in got.iter().enumerate() {
                    assert!(g == &want, "{name} n={n} blk={blk} rank {r}");
                }
            }
        }
    }
}

#[test]
fn alltoall_pairwise() {
    for n in RANKS {
        for blk in [0, 1, 5, 1000, 20_000] {
            for mode in MODES {
                let got = all_ok(run(n, mode, |c| {
                    // Block j of rank i's send: pattern of (i, j).
                    let send: Vec<u8> = (0..n).flat_map(|j| pattern(c.rank() * 16 + j, blk)).collect();
                    let mut out = vec![0; n * blk];
                    alltoall(c, &send, &mut out, 1).map(|()| out)
                }));
                for (r, g) in got.iter().enumerate() {
                    let want: Vec<u8> = (0..n).flat_map(|i| pattern(i * 16 + r, blk)).collect();
                    assert!(g == &want, "n={n} blk={blk} rank {r}");
                }
            }
        }
    }
}

// ---- sequences, bad input, mismatches -------------------------------------------------------

/// Many different collectives back to back with buffering sends: the per-algorithm tags and
/// non-overtaking order must keep every call's messages apart.
#[test]
fn mixed_sequence_keeps_calls_apart() {
    for n in RANKS {
        for mode in MODES {
            all_ok(run(n, mode, |c| -> Result<()> {
                let r = c.rank();
                for it in 0..4 {
                    let root = (it * 3) % n;
                    let mut b = if r == root { pattern(it, 100) } else { vec![0; 100] };
                    bcast(c, &mut b, root)?;
                    assert_eq!(b, pattern(it, 100));
                    let mut b2 = if r == (root + 1) % n { pattern(it + 9, 33) } else { vec![0; 33] };
                    bcast(c, &mut b2, (root + 1) % n)?;
                    assert_eq!(b2, pattern(it + 9, 33));
                    let mut s = [0i64; 3];
                    allreduce(c, &[r as i64, 1, it as i64], &mut s, Op::Sum)?;
                    assert_eq!(s, [(n * (n - 1) / 2) as i64, n as i64, (n * it) as i64]);
                    let mut out = [0i64; 1];
                    let recv = (r == root).then_some(&mut out[..]);
                    reduce(c, &[r as i64], recv, Op::Max, root)?;
                    if r == root {
                        assert_eq!(out[0], n as i64 - 1);
                    }
                    let mut g = vec![0u8; n * 2];
                    allgather(c, &[r as u8, it as u8], &mut g)?;
                    assert!(g.chunks(2).enumerate().all(|(j, x)| x == [j as u8, it as u8]));
                    barrier(c)?;
                }
                Ok(())
            }));
        }
    }
}

#[test]
fn bad_arguments_fail_before_any_communication() {
    for n in [1, 2, 5] {
        let res = run(n, Mode::Eager, |c| {
            let r = c.rank();
            let mut errs: Vec<Error> = Vec::new();
            let mut b = [0u8; 4];
            errs.extend(bcast(c, &mut b, n).err());
            let mut o = [0i32; 2];
            errs.extend(reduce(c, &[1i32, 2], Some(&mut o[..]), Op::Sum, n + 3).err());
            errs.extend(reduce(c, &[1.0f64], None, Op::BitAnd, 0).err());
            errs.extend(allreduce(c, &[1.0f32], &mut [0.0f32], Op::BitXor).err());
            errs.extend(allreduce(c, &[1u32, 2], &mut [0u32; 3], Op::Sum).err());
            let mut big = vec![0u8; n * 4 + 1];
            errs.extend(gather(c, &[1u8; 4], Some(&mut big[..]), n).err());
            errs.extend(scatter(c, Some(&big[..]), &mut b, usize::MAX).err());
            errs.extend(allgather(c, &[1u8; 4], &mut big).err());
            errs.extend(alltoall(c, &big, &mut big.clone(), 1).err());
            errs.extend(alltoall(c, &[0u8; 4], &mut [0u8; 8], 1).err());
            // Root-only arguments, checked at the root.
            if r == 0 {
                errs.extend(reduce(c, &[1i32, 2], None, Op::Sum, 0).err());
                errs.extend(reduce(c, &[1i32, 2], Some(&mut o[..1]), Op::Sum, 0).err());
                errs.extend(gather(c, &[1u8; 4], None, 0).err());
                errs.extend(gather(c, &[1u8; 4], Some(&mut big[..]), 0).err());
                errs.extend(scatter(c, None, &mut b, 0).err());
                errs.extend(scatter(c, Some(&big[..]), &mut b, 0).err());
            }
            (errs, *c.sent.borrow())
        });
        for (r, (errs, sent)) in res.into_iter().enumerate() {
            assert_eq!(sent, 0, "rank {r} communicated");
            let kinds: Vec<&str> = errs
                .iter()
                .map(|e| match e {
                    Error::InvalidRoot { .. } => "root",
                    Error::InvalidOp { .. } => "op",
                    Error::InvalidBuffer(_) => "buffer",
                    _ => "other",
                })
                .collect();
            let mut want = vec!["root", "root", "op", "op", "buffer", "root", "root", "buffer"];
            // alltoall of n*4+1 bytes is divisible by n only for n == 1.
            if n != 1 {
                want.push("buffer");
            }
            want.push("buffer");
            if r == 0 {
                want.extend(["buffer"; 6]);
            }
            assert_eq!(kinds, want, "n={n} rank {r}: {errs:?}");
        }
    }
}

/// Ranks passing different lengths (erroneous): errors, not hangs or silent corruption.
#[test]
fn mismatched_lengths_between_ranks_are_errors() {
    for n in [2, 3, 8] {
        for mode in MODES {
            // Root sends less than the others expect.
            let res = run(n, mode, |c| {
                let mut b = vec![1u8; if c.rank() == 0 { 10 } else { 20 }];
                bcast(c, &mut b, 0)
            });
            assert!(res[1..].iter().all(|x| x.is_err()), "short bcast: {res:?}");
            // Root sends more: truncation at the receivers.
            let res = run(n, mode, |c| {
                let mut b = vec![1u8; if c.rank() == 0 { 30 } else { 20 }];
                bcast(c, &mut b, 0)
            });
            assert!(res[1..].iter().all(|x| x.is_err()), "long bcast: {res:?}");
            let res = run(n, mode, |c| {
                let len = if c.rank() == n - 1 { 2 } else { 3 };
                allreduce(c, &vec![1u64; len], &mut vec![0u64; len], Op::Sum)
            });
            assert!(res.iter().any(|x| x.is_err()), "allreduce: {res:?}");
        }
    }
}

#[test]
fn size_one_is_a_local_copy() {
    let out = all_ok(run(1, Mode::Rendezvous, |c| -> Result<Vec<u8>> {
        let mut v = Vec::new();
        let mut r = [0u32; 2];
        allreduce(c, &[3u32, 4], &mut r, Op::Prod)?;
        v.extend(bytemuck::cast_slice::<u32, u8>(&r));
        let mut g = [0u8; 3];
        gather(c, &[1, 2, 3], Some(&mut g), 0)?;
        v.extend(g);
        scatter(c, Some(&[4, 5]), &mut g[..2], 0)?;
        v.extend(&g[..2]);
        allgather(c, &[6], &mut g[..1])?;
        alltoall(c, &[7, 8], &mut g[1..], 1)?;
        v.extend(g);
        Ok(v)
    }));
    let mut want = Vec::new();
    want.extend(bytemuck::cast_slice::<u32, u8>(&[3u32, 4]));
    want.extend([1, 2, 3, 4, 5, 6, 7, 8]);
    assert_eq!(out[0], want);
}

// ---- node-aware ---------------------------------------------------------------------------

/// Host layouts of `n` ranks over `hosts` hosts: blocks of consecutive ranks, and ranks dealt
/// round robin (hosts whose ranks are not consecutive).
fn layouts(n: usize) -> Vec<Vec<usize>> {
    let mut v = Vec::new();
    for hosts in [2, 4] {
        if hosts <= n {
            v.push((0..n).map(|r| r * hosts / n).collect());
            v.push((0..n).map(|r| r % hosts).collect());
        }
    }
    v
}

/// The overrides the node-aware tests run under: automatic, node-aware forced on (every
/// layout, even one rank per host), and forced algorithms on the heads' tier.
fn node_forces() -> Vec<select::Force> {
    let on = select::Force { node_aware: Some(true), ..select::Force::AUTO };
    let auto = select::Force::AUTO;
    let mut heads = on;
    heads.bcast = Some(select::Bcast::ScatterAllgather);
    heads.allreduce = Some(select::Allreduce::Ring);
    heads.reduce = Some(select::Reduce::Rabenseifner);
    heads.allgather = Some(select::Allgather::Ring);
    vec![on, auto, heads]
}

/// One rank's part in every node-aware collective, each checked against local values, the
/// rooted ones at every root up to 8 ranks and at three roots beyond; returns what failed.
fn node_aware_calls(c: &ThreadP2p, len: usize) -> Result<Vec<String>> {
    let (me, n) = (c.rank(), c.size());
    let mut bad = Vec::new();
    barrier(c)?;
    let roots: Vec<usize> = if n <= 8 { (0..n).collect() } else { vec![0, n / 2 + 1, n - 1] };
    for root in roots {
        let mut buf = if me == root { pattern(root, len) } else { vec![0; len] };
        bcast(c, &mut buf, root)?;
        if buf != pattern(root, len) {
            bad.push(format!("bcast root {root}"));
        }
        let send: Vec<i64> = contribution(me, len);
        let mut out = vec![0i64; len];
        reduce(c, &send, (me == root).then_some(&mut out[..]), Op::Sum, root)?;
        if me == root && out != expected::<i64>(n, len, Op::Sum) {
            bad.push(format!("reduce root {root}"));
        }
    }
    let send: Vec<f64> = contribution(me, len);
    let mut out = vec![0f64; len];
    allreduce(c, &send, &mut out, Op::Sum)?;
    if out != expected::<f64>(n, len, Op::Sum) {
        bad.push("allreduce".into());
    }
    let mut all = vec![0u8; n * len];
    allgather(c, &pattern(me, len), &mut all)?;
    if all != (0..n).flat_map(|r| pattern(r, len)).collect::<Vec<u8>>() {
        bad.push("allgather".into());
    }
    // Rank r contributes r + len % 3 bytes; blocks in reverse rank order with a gap.
    let counts: Vec<usize> = (0..n).map(|r| r + len % 3).collect();
    let total: usize = counts.iter().sum();
    let displs: Vec<usize> = (0..n).map(|r| 1 + counts[r + 1..].iter().sum::<usize>()).collect();
    let mut v = vec![0u8; total + 1];
    run::allgatherv(c, &pattern(me, counts[me]), &mut v, &counts, &displs)?;
    if (0..n).any(|r| v[displs[r]..displs[r] + counts[r]] != pattern(r, counts[r])[..]) {
        bad.push("allgatherv".into());
    }
    let blk = len % 50 + 1;
    let send: Vec<u8> = (0..n).flat_map(|j| pattern(me * 16 + j, blk)).collect();
    let mut got = vec![0; n * blk];
    alltoall(c, &send, &mut got, 1)?;
    if got != (0..n).flat_map(|i| pattern(i * 16 + me, blk)).collect::<Vec<u8>>() {
        bad.push("alltoall".into());
    }
    let counts: Vec<usize> = (0..n).map(|r| (r * 7 + len) % 11).collect();
    let total: usize = counts.iter().sum();
    let send: Vec<i64> = contribution(me, total);
    let mut mine = vec![0i64; counts[me]];
    run::reduce_scatter(c, &send, &mut mine, &counts, Op::Sum)?;
    let lo: usize = counts[..me].iter().sum();
    if mine[..] != expected::<i64>(n, total, Op::Sum)[lo..lo + counts[me]] {
        bad.push("reduce_scatter".into());
    }
    barrier(c)?;
    Ok(bad)
}

#[test]
fn node_aware_collectives_on_every_layout() {
    for n in 1..=8 {
        for hosts in layouts(n) {
            for (i, force) in node_forces().into_iter().enumerate() {
                for len in [1, 300, 5000] {
                    let mode = MODES[(n + i + len) % 2];
                    let got = super::harness::run_on(n, mode, Some(&hosts), force, |c| node_aware_calls(c, len));
                    let bad: Vec<String> = got
                        .iter()
                        .enumerate()
                        .filter(|(_, g)| !matches!(g, Ok(b) if b.is_empty()))
                        .map(|(r, g)| format!("rank {r}: {g:?}"))
                        .collect();
                    assert!(bad.is_empty(), "n={n} hosts {hosts:?} force {i} len {len}: {bad:?}");
                }
            }
        }
    }
}

/// The node-aware collectives at up to 64 ranks on 1, 2 and 4 hosts (blocks of consecutive
/// ranks, and 4 hosts dealt round robin), automatic and forced on, one length each.
#[test]
fn node_aware_collectives_at_up_to_64_ranks() {
    for (n, len) in [(16, 300), (33, 5000), (64, 40)] {
        let mut hosts: Vec<Vec<usize>> = [1, 2, 4].iter().map(|&h| (0..n).map(|r| r * h / n).collect()).collect();
        hosts.push((0..n).map(|r| r % 4).collect());
        for (i, h) in hosts.iter().enumerate() {
            let force = node_forces()[i % 2];
            let got = super::harness::run_on(n, MODES[i % 2], Some(h), force, |c| node_aware_calls(c, len));
            let bad: Vec<String> = got
                .iter()
                .enumerate()
                .filter(|(_, g)| !matches!(g, Ok(b) if b.is_empty()))
                .map(|(r, g)| format!("rank {r}: {g:?}"))
                .collect();
            assert!(bad.is_empty(), "n={n} hosts {h:?} force {i}: {bad:?}");
        }
    }
}

/// Across hosts, the node-aware plans send each host's data over the network once: an
/// allreduce of 2 hosts x 4 ranks makes 2 inter-host messages per head per phase, where the
/// flat one pairs ranks of different hosts in most of its steps.
#[test]
fn node_aware_allreduce_crosses_hosts_from_the_heads_only() {
    let hosts = [0, 0, 0, 0, 1, 1, 1, 1];
    let plan_of = |rank: usize, force: &select::Force| {
        let topo = topo::Topo::from_hosts(hosts.to_vec());
        let set = select::Setting { rank, size: 8, force, topo: Some(&topo) };
        let p = run::allreduce_plan(&set, builtin::<i64>(Op::Sum), true, Vector { n: 4, es: 8 }).unwrap();
        p.rounds().flatten().filter(|a| matches!(a, plan::Action::Send { dest, .. } if hosts[*dest] != hosts[rank])).count()
    };
    let on = select::Force::AUTO;
    let off = select::Force { node_aware: Some(false), ..select::Force::AUTO };
    let crossing = |f: &select::Force| (0..8).map(|r| plan_of(r, f)).collect::<Vec<_>>();
    assert_eq!(crossing(&on), [1, 0, 0, 0, 1, 0, 0, 0]);
    assert!(crossing(&off).iter().sum::<usize>() >= 8, "{:?}", crossing(&off));
}
