//! The collectives of [`super`] at 1..=7 ranks: over the thread harness in both send modes
//! (so an algorithm that relies on buffering fails), and over `run_local` on the world, a dup
//! and split communicators, against locally computed values; and bad arguments, which must be
//! errors on the rank that passed them without stranding the others.

use super::super::harness::{run, Mode};
use super::super::run::{allgatherv, reduce_scatter, reduce_scatter_block};
use super::*;
use crate::run_local;

const RANKS: std::ops::RangeInclusive<usize> = 1..=7;
const MODES: [Mode; 2] = [Mode::Eager, Mode::Rendezvous];

/// Element `i` of rank `r`'s data (distinct per rank and position).
fn val(r: usize, i: usize) -> u32 {
    (r * 1000 + i * 7 + 1) as u32
}

/// A varied layout: rank `r` has `count(r)` elements (some zero), blocks placed in reverse rank
/// order with gaps.
fn count(r: usize, salt: usize) -> usize {
    (r * 3 + salt) % 5
}

fn layout(p: usize, salt: usize) -> (Vec<usize>, Vec<usize>, usize) {
    let counts: Vec<usize> = (0..p).map(|r| count(r, salt)).collect();
    let mut displs = vec![0; p];
    let mut at = 1;
    for r in (0..p).rev() {
        displs[r] = at;
        at += counts[r] + 1;
    }
    (counts, displs, at)
}

fn ok<R: std::fmt::Debug>(res: Vec<Result<R>>) -> Vec<R> {
    res.into_iter().enumerate().map(|(r, x)| x.unwrap_or_else(|e| panic!("rank {r}: {e}"))).collect()
}

#[test]
fn gatherv_and_scatterv_every_root() {
    for p in RANKS {
        for mode in MODES {
            for root in 0..p {
                let salt = p + root;
                let (counts, displs, len) = layout(p, salt);
                let got = ok(run(p, mode, |c| {
                    let r = c.rank();
                    let send: Vec<u32> = (0..count(r, salt)).map(|i| val(r, i)).collect();
                    let mut all = vec![u32::MAX; len];
                    let recv = (r == root).then_some(&mut all[..]);
                    let (cs, ds): (&[usize], &[usize]) = if r == root { (&counts, &displs) } else { (&[], &[]) };
                    gatherv(c, &send, recv, cs, ds, root)?;
                    // Scatter the gathered buffer back: every rank gets its own block again.
                    let mut back = vec![0u32; count(r, salt)];
                    let src = (r == root).then_some(&all[..]);
                    scatterv(c, src, cs, ds, &mut back, root)?;
                    Ok((all, back, send))
                }));
                let mut want = vec![u32::MAX; len];
                for r in 0..p {
                    for i in 0..counts[r] {
                        want[displs[r] + i] = val(r, i);
                    }
                }
                assert_eq!(got[root].0, want, "gatherv p={p} root={root} {mode:?}");
                for (r, (_, back, send)) in got.iter().enumerate() {
                    assert_eq!(back, send, "scatterv p={p} root={root} rank={r} {mode:?}");
                }
            }
        }
    }
}

#[test]
fn allgatherv_and_alltoallv() {
    for p in RANKS {
        for mode in MODES {
            for salt in 0..3 {
                let (counts, displs, len) = layout(p, salt);
                let got = ok(run(p, mode, |c| {
                    let r = c.rank();
                    let send: Vec<u32> = (0..count(r, salt)).map(|i| val(r, i)).collect();
                    let mut all = vec![u32::MAX; len];
                    allgatherv(c, &send, &mut all, &counts, &displs)?;
                    // alltoallv: rank r sends (r + j + salt) % 4 elements to j, blocks reversed.
                    let n = |from: usize, to: usize| (from + to + salt) % 4;
                    let sc: Vec<usize> = (0..p).map(|j| n(r, j)).collect();
                    let mut sd = vec![0; p];
                    let mut at = 0;
                    for j in (0..p).rev() {
                        sd[j] = at;
                        at += sc[j];
                    }
                    let sbuf: Vec<u32> = (0..p).rev().flat_map(|j| (0..n(r, j)).map(move |i| val(r, j * 10 + i))).collect();
                    let rc: Vec<usize> = (0..p).map(|i| n(i, r)).collect();
                    let rd: Vec<usize> = (0..p).map(|i| rc[..i].iter().sum::<usize>() + 2 * i).collect();
                    let mut rbuf = vec![u32::MAX; rd[p - 1] + rc[p - 1] + 1];
                    alltoallv(c, &sbuf, &sc, &sd, &mut rbuf, &rc, &rd)?;
                    let mut want = vec![u32::MAX; rbuf.len()];
                    for i in 0..p {
                        for k in 0..rc[i] {
                            want[rd[i] + k] = val(i, r * 10 + k);
                        }
                    }
                    Ok((all, rbuf == want))
                }));
                let mut want = vec![u32::MAX; len];
                for r in 0..p {
                    for i in 0..counts[r] {
                        want[displs[r] + i] = val(r, i);
                    }
                }
                for (r, (all, a2a)) in got.iter().enumerate() {
                    assert_eq!(all, &want, "allgatherv p={p} rank={r} {mode:?}");
                    assert!(a2a, "alltoallv p={p} rank={r} {mode:?}");
                }
            }
        }
    }
}

/// Reference reduction of ranks `ranks` for element `i` (values are small: float sums exact).
fn fold_ref(op: Op, ranks: std::ops::Range<usize>, i: usize, v: impl Fn(usize, usize) -> i64) -> i64 {
    ranks
        .map(|r| v(r, i))
        .reduce(|a, b| match op {
            Op::Sum => a + b,
            Op::Max => a.max(b),
            Op::Min => a.min(b),
            Op::BitXor => a ^ b,
            _ => unreachable!(),
        })
        .unwrap_or(0)
}

#[test]
fn reduce_scatter_scan_exscan() {
    let v = |r: usize, i: usize| ((r * 7 + i * 3) % 11) as i64 - 3;
    for p in RANKS {
        for mode in MODES {
            for op in [Op::Sum, Op::Max, Op::Min, Op::BitXor] {
                let counts: Vec<usize> = (0..p).map(|r| (r * 2 + 1) % 4).collect();
                let n: usize = counts.iter().sum();
                let got = ok(run(p, mode, |c| {
                    let r = c.rank();
                    let send: Vec<i64> = (0..n).map(|i| v(r, i)).collect();
                    let mut mine = vec![0i64; counts[r]];
                    reduce_scatter(c, &send, &mut mine, &counts, op)?;
                    let mut blk = vec![0i64; 3];
                    let sb: Vec<i64> = (0..3 * p).map(|i| v(r, i)).collect();
                    reduce_scatter_block(c, &sb, &mut blk, op)?;
                    let mut inc = vec![0i64; n];
                    scan(c, &send, &mut inc, op)?;
                    let mut exc = vec![42i64; n];
                    exscan(c, &send, &mut exc, op)?;
                    Ok((mine, blk, inc, exc))
                }));
                let start = |r: usize| counts[..r].iter().sum::<usize>();
                for (r, (mine, blk, inc, exc)) in got.iter().enumerate() {
                    let want: Vec<i64> = (start(r)..start(r) + counts[r]).map(|i| fold_ref(op, 0..p, i, v)).collect();
                    assert_eq!(mine, &want, "reduce_scatter p={p} r={r} {op} {mode:?}");
                    let want: Vec<i64> = (3 * r..3 * r + 3).map(|i| fold_ref(op, 0..p, i, v)).collect();
                    assert_eq!(blk, &want, "reduce_scatter_block p={p} r={r} {op}");
                    let want: Vec<i64> = (0..n).map(|i| fold_ref(op, 0..r + 1, i, v)).collect();
                    assert_eq!(inc, &want, "scan p={p} r={r} {op}");
                    let want: Vec<i64> = if r == 0 { vec![42; n] } else { (0..n).map(|i| fold_ref(op, 0..r, i, v)).collect() };
                    assert_eq!(exc, &want, "exscan p={p} r={r} {op}");
                }
            }
        }
    }
}

/// Floats in rank order: a scan of values that are not associative in floating point gives
/// the left fold's bits at every rank up to 3 (where recursive doubling is a left fold).
#[test]
fn float_scan_is_in_rank_order() {
    let xs = [1e16f64, 1.0, -1e16, 1.0];
    let got = ok(run(4, Mode::Rendezvous, |c| {
        let mut out = [0.0f64];
        scan(c, &[xs[c.rank()]], &mut out, Op::Sum)?;
        Ok(out[0])
    }));
    let mut acc = 0.0;
    for (r, x) in xs.iter().enumerate().take(3) {
        acc = if r == 0 { *x } else { acc + x };
        assert_eq!(got[r].to_bits(), acc.to_bits(), "rank {r}");
    }
}

fn is_invalid_buffer<R>(r: &Result<R>) -> bool {
    matches!(r, Err(Error::InvalidBuffer(_)))
}

/// A root with a bad layout fails, and every other rank finishes (in rendezvous mode a stranded
/// sender would time out in the harness).
#[test]
fn bad_root_layout_does_not_strand_the_others() {
    for p in 2..=5 {
        let res = run(p, Mode::Rendezvous, |c| {
            let r = c.rank();
            let send = vec![r as u32; 2];
            let mut all = vec![0u32; 2 * p];
            let counts = vec![2; p];
            // Rank p-1's block runs off the end.
            let mut displs: Vec<usize> = (0..p).map(|i| 2 * i).collect();
            displs[p - 1] += 1;
            let g = gatherv(c, &send, (r == 0).then_some(&mut all[..]), &counts, &displs, 0);
            let mut back = vec![0u32; 2];
            let s = scatterv(c, (r == 0).then_some(&all[..]), &counts, &displs, &mut back, 0);
            (g, s)
        });
        for (r, (g, s)) in res.iter().enumerate() {
            if r == 0 {
                assert!(is_invalid_buffer(g) && is_invalid_buffer(s), "root: {g:?} {s:?}");
            } else {
                assert!(g.is_ok(), "rank {r} gatherv: {g:?}");
                assert!(is_invalid_buffer(s), "rank {r} scatterv gets an empty block: {s:?}");
            }
        }
    }
}

/// One rank passing bad arguments to allgatherv/alltoallv fails, its neighbours see short
/// blocks, and nobody hangs.
#[test]
fn bad_local_arguments_complete_the_rounds() {
    for p in 2..=6 {
        for mode in MODES {
            let res = run(p, mode, |c| {
                let r = c.rank();
                let counts = vec![1; p];
                let displs: Vec<usize> = (0..p).collect();
                let mut all = vec![0u8; if r == 1 { p - 1 } else { p }];
                let a = allgatherv(c, &[r as u8], &mut all, &counts, &displs);
                let mut rb = vec![0u8; p];
                let rd = if r == 1 { vec![0; p] } else { displs.clone() }; // overlapping blocks
                let b = alltoallv(c, &vec![r as u8; p], &counts, &displs, &mut rb, &counts, &rd);
                // The communicator still works afterwards.
                let mut all2 = vec![0u8; p];
                let d = allgatherv(c, &[r as u8], &mut all2, &counts, &displs);
                (a, b, d, all2)
            });
            for (r, (a, b, d, all2)) in res.iter().enumerate() {
                if r == 1 {
                    assert!(is_invalid_buffer(a) && is_invalid_buffer(b), "{a:?} {b:?}");
                }
                assert!(a.is_ok() || is_invalid_buffer(a), "rank {r}: {a:?}");
                assert!(b.is_ok() || is_invalid_buffer(b), "rank {r}: {b:?}");
                d.as_ref().unwrap_or_else(|e| panic!("rank {r} p={p}: {e}"));
                assert_eq!(all2, &(0..p as u8).collect::<Vec<_>>());
            }
        }
    }
}

#[test]
fn counts_and_displacements_are_checked() {
    let res = run(3, Mode::Eager, |c| {
        let r = c.rank();
        let mut out = [0u32; 4];
        // Too few counts, an overflowing displacement, an own count that differs from send.
        let errs = vec![
            allgatherv(c, &[1u32], &mut out, &[1, 1], &[0, 1]),
            allgatherv(c, &[1u32], &mut out, &[1, 1, 1], &[0, usize::MAX, 2]),
            allgatherv(c, &[1u32, 2], &mut out, &[1, 1, 1], &[0, 1, 2]),
            reduce_scatter(c, &[1u32, 2], &mut out[..1], &[1, 1, usize::MAX], Op::Sum),
            reduce_scatter_block(c, &[1u32, 2], &mut out[..1], Op::Sum),
            scan(c, &[1u32, 2], &mut out[..1], Op::Sum),
            exscan(c, &[1u32], &mut out[..2], Op::Sum),
        ];
        let mut f = [0f32];
        let e = scan(c, &[1f32], &mut f, Op::BitAnd);
        (r, errs, e)
    });
    for (r, errs, e) in res {
        for (i, x) in errs.iter().enumerate() {
            assert!(is_invalid_buffer(x), "rank {r} case {i}: {x:?}");
        }
        assert!(matches!(e, Err(Error::InvalidOp { .. })), "{e:?}");
    }
}

// ---- through the runtime ---------------------------------------------------------------------

/// Every collective of this module on `comm` against local computations; returns the number of
/// elements checked.
fn check_all(comm: &crate::Comm, salt: usize) -> usize {
    let (r, p) = (comm.rank(), comm.size());
    let (counts, displs, len) = layout(p, salt);
    let send: Vec<u32> = (0..count(r, salt)).map(|i| val(r, i)).collect();
    let mut want = vec![u32::MAX; len];
    for q in 0..p {
        for i in 0..counts[q] {
            want[displs[q] + i] = val(q, i);
        }
    }
    let root = salt % p;
    let mut all = vec![u32::MAX; len];
    comm.gatherv(&send, (r == root).then_some(&mut all[..]), &counts, &displs, root).unwrap();
    if r == root {
        assert_eq!(all, want, "gatherv");
    }
    let mut back = vec![0u32; send.len()];
    comm.scatterv((r == root).then_some(&want[..]), &counts, &displs, &mut back, root).unwrap();
    assert_eq!(back, send, "scatterv");
    let mut all = vec![u32::MAX; len];
    comm.allgatherv(&send, &mut all, &counts, &displs).unwrap();
    assert_eq!(all, want, "allgatherv");
    // alltoallv with counts (i + j) % 3, blocks packed.
    let n = |a: usize, b: usize| (a + b + salt) % 3;
    let sc: Vec<usize> = (0..p).map(|j| n(r, j)).collect();
    let sd: Vec<usize> = (0..p).map(|j| sc[..j].iter().sum()).collect();
    let sbuf: Vec<u32> = (0..p).flat_map(|j| (0..n(r, j)).map(move |k| val(r, 100 * j + k))).collect();
    let rc: Vec<usize> = (0..p).map(|i| n(i, r)).collect();
    let rd: Vec<usize> = (0..p).map(|i| rc[..i].iter().sum()).collect();
    let mut rbuf = vec![0u32; rc.iter().sum()];
    comm.alltoallv(&sbuf, &sc, &sd, &mut rbuf, &rc, &rd).unwrap();
    let want_a2a: Vec<u32> = (0..p).flat_map(|i| (0..n(i, r)).map(move |k| val(i, 100 * r + k))).collect();
    assert_eq!(rbuf, want_a2a, "alltoallv");
    // Reductions on f64 with small integer values (exact).
    let v = |q: usize, i: usize| ((q * 5 + i) % 9) as f64;
    let rcounts: Vec<usize> = (0..p).map(|q| (q + salt) % 3).collect();
    let total: usize = rcounts.iter().sum();
    let fsend: Vec<f64> = (0..total).map(|i| v(r, i)).collect();
    let mut mine = vec![0.0; rcounts[r]];
    comm.reduce_scatter(&fsend, &mut mine, &rcounts, Op::Sum).unwrap();
    let start: usize = rcounts[..r].iter().sum();
    let want_rs: Vec<f64> = (start..start + rcounts[r]).map(|i| (0..p).map(|q| v(q, i)).sum()).collect();
    assert_eq!(mine, want_rs, "reduce_scatter");
    let bsend: Vec<f64> = (0..2 * p).map(|i| v(r, i)).collect();
    let mut blk = [0.0; 2];
    comm.reduce_scatter_block(&bsend, &mut blk, Op::Max).unwrap();
    let want_blk: Vec<f64> = (2 * r..2 * r + 2).map(|i| (0..p).map(|q| v(q, i)).fold(f64::MIN, f64::max)).collect();
    assert_eq!(blk.to_vec(), want_blk, "reduce_scatter_block");
    let mut inc = vec![0.0; total];
    comm.scan(&fsend, &mut inc, Op::Sum).unwrap();
    let want_inc: Vec<f64> = (0..total).map(|i| (0..=r).map(|q| v(q, i)).sum()).collect();
    assert_eq!(inc, want_inc, "scan");
    let mut exc = vec![-1.0; total];
    comm.exscan(&fsend, &mut exc, Op::Sum).unwrap();
    let want_exc: Vec<f64> = (0..total).map(|i| if r == 0 { -1.0 } else { (0..r).map(|q| v(q, i)).sum() }).collect();
    assert_eq!(exc, want_exc, "exscan");
    len + rbuf.len() + total * 3
}

#[test]
fn run_local_world_dup_and_splits() {
    for p in RANKS {
        run_local(p, |w| {
            check_all(&w, 0);
            let d = w.dup().unwrap();
            check_all(&d, 1);
            // Halves with reversed order.
            let h = w.split(Some((w.rank() % 2) as u32), -(w.rank() as i32)).unwrap().unwrap();
            check_all(&h, 2);
            // Every third rank left out.
            if let Some(s) = w.split((w.rank() % 3 != 2).then_some(0), 0).unwrap() {
                check_all(&s, 3);
            }
            check_all(&w, 4);
        });
    }
}

/// Blocks above the eager limit (rendezvous in the engine).
#[test]
fn run_local_large_blocks() {
    run_local(3, |w| {
        let r = w.rank();
        let big = 100_000usize;
        let counts = [big, 1, big / 2];
        let displs = [0, big, big + 1];
        let send: Vec<u8> = (0..counts[r]).map(|i| (i * 7 + r) as u8).collect();
        let mut all = vec![0u8; big + 1 + big / 2];
        w.allgatherv(&send, &mut all, &counts, &displs).unwrap();
        for q in 0..3 {
            assert!((0..counts[q]).all(|i| all[displs[q] + i] == (i * 7 + q) as u8), "block {q}");
        }
        let mut s = vec![0u64; 3 * big];
        let mut out = vec![0u64; big];
        s.iter_mut().enumerate().for_each(|(i, x)| *x = (i + r) as u64);
        w.reduce_scatter_block(&s, &mut out, Op::Sum).unwrap();
        assert!(out.iter().enumerate().all(|(i, &x)| x == (3 * (r * big + i) + 3) as u64));
    });
}

/// A root with a bad layout takes (and drops) blocks above the eager limit too, and scatters
/// empty blocks: no rank waits for it, and the communicator works afterwards.
#[test]
fn run_local_bad_root_with_large_blocks() {
    for n in [2, 3, 5] {
        let res = run_local(n, |w| {
            let r = w.rank();
            let big = 200_000usize;
            let send = vec![r as u8; big];
            let counts = vec![big; n];
            let displs: Vec<usize> = (0..n).map(|i| i * big + 1).collect(); // last block runs off
            let mut all = vec![0u8; n * big];
            let g = w.gatherv(&send, (r == 0).then_some(&mut all[..]), &counts, &displs, 0);
            let mut back = vec![0u8; big];
            let s = w.scatterv((r == 0).then_some(&all[..]), &counts, &displs, &mut back, 0);
            let mut sum = [0u64];
            w.allreduce(&[1u64], &mut sum, Op::Sum).unwrap();
            (g, s, sum[0])
        });
        for (r, (g, s, sum)) in res.iter().enumerate() {
            assert_eq!(*sum, n as u64);
            if r == 0 {
                assert!(is_invalid_buffer(g) && is_invalid_buffer(s), "root: {g:?} {s:?}");
            } else {
                assert!(g.is_ok(), "rank {r}: {g:?}");
                assert!(is_invalid_buffer(s), "rank {r}: {s:?}");
            }
        }
    }
}
