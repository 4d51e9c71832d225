//! Non-blocking collectives over `run_local`, at 1 to 7 ranks, on the world and on dup/split
//! communicators, several in flight at once and mixed with point-to-point and blocking
//! collectives.

use crate::{run_local, scope, wait_all, wait_any, Comm, Error, Op};

/// Every non-blocking collective once, all in flight together, checked against the blocking
/// ones (or closed forms).
fn all_at_once(c: &Comm) {
    let (r, n) = (c.rank(), c.size());
    let mine: Vec<i64> = (0..5).map(|i| (r * 10 + i) as i64 - 7).collect();
    let mut bc = if r == n - 1 { vec![42u16; 9] } else { vec![0u16; 9] };
    let mut red = vec![0i64; 5];
    let mut allred = vec![0i64; 5];
    let mut gat = vec![0i64; 5 * n];
    let mut sca = vec![0i64; 5];
    let scatter_src: Vec<i64> = (0..5 * n as i64).collect();
    let mut allg = vec![0i64; 5 * n];
    let a2a_send: Vec<u32> = (0..2 * n).map(|i| (r * 1000 + i) as u32).collect();
    let mut a2a = vec![0u32; 2 * n];
    let rs_send: Vec<u64> = (0..3 * n).map(|i| (i + r) as u64).collect();
    let mut rs = vec![0u64; 3];
    let mut sc = vec![0i64; 5];
    let mut ex = vec![-1i64; 5];
    let root = n / 2;
    scope(|s| {
        let mut reqs = vec![
            c.ibarrier(s).unwrap(),
            c.ibcast(s, &mut bc, n - 1).unwrap(),
            c.ireduce(s, &mine, (r == root).then_some(&mut red[..]), Op::Sum, root).unwrap(),
            c.iallreduce(s, &mine, &mut allred, Op::Max).unwrap(),
            c.igather(s, &mine, (r == 0).then_some(&mut gat[..]), 0).unwrap(),
            c.iscatter(s, (r == root).then_some(&scatter_src[..]), &mut sca, root).unwrap(),
            c.iallgather(s, &mine, &mut allg).unwrap(),
            c.ialltoall(s, &a2a_send, &mut a2a).unwrap(),
            c.ireduce_scatter_block(s, &rs_send, &mut rs, Op::Sum).unwrap(),
            c.iscan(s, &mine, &mut sc, Op::Sum).unwrap(),
            c.iexscan(s, &mine, &mut ex, Op::Sum).unwrap(),
        ];
        // Complete them in whatever order they finish.
        while !reqs.is_empty() {
            wait_any(&mut reqs).unwrap();
        }
    });
    let val = |q: usize, i: usize| (q * 10 + i) as i64 - 7;
    assert_eq!(bc, vec![42; 9]);
    if r == root {
        assert_eq!(red, (0..5).map(|i| (0..n).map(|q| val(q, i)).sum()).collect::<Vec<i64>>());
    }
    assert_eq!(allred, (0..5).map(|i| val(n - 1, i)).collect::<Vec<i64>>());
    if r == 0 {
        assert_eq!(gat, (0..n).flat_map(|q| (0..5).map(move |i| val(q, i))).collect::<Vec<i64>>());
    }
    assert_eq!(sca, (5 * r as i64..5 * r as i64 + 5).collect::<Vec<i64>>());
    assert_eq!(allg, (0..n).flat_map(|q| (0..5).map(move |i| val(q, i))).collect::<Vec<i64>>());
    assert_eq!(a2a, (0..n).flat_map(|q| [(q * 1000 + 2 * r) as u32, (q * 1000 + 2 * r + 1) as u32]).collect::<Vec<u32>>());
    assert_eq!(rs, (0..3).map(|i| (0..n).map(|q| (3 * r + i + q) as u64).sum()).collect::<Vec<u64>>());
    assert_eq!(sc, (0..5).map(|i| (0..=r).map(|q| val(q, i)).sum()).collect::<Vec<i64>>());
    if r == 0 {
        assert_eq!(ex, vec![-1; 5], "exscan leaves rank 0's buffer alone");
    } else {
        assert_eq!(ex, (0..5).map(|i| (0..r).map(|q| val(q, i)).sum()).collect::<Vec<i64>>());
    }
}

#[test]
fn every_collective_at_1_to_7_ranks() {
    for n in 1..=7 {
        run_local(n, |w| all_at_once(&w));
    }
}

#[test]
fn on_dup_and_split_communicators() {
    for n in [3, 5, 6] {
        run_local(n, |w| {
            let d = w.dup().unwrap();
            all_at_once(&d);
            // Odd and even ranks, the odd ones in reverse order.
            let color = (w.rank() % 2) as u32;
            let key = if color == 1 { -(w.rank() as i32) } else { w.rank() as i32 };
            let sub = w.split(Some(color), key).unwrap().unwrap();
            all_at_once(&sub);
            // The world keeps working after the sub-communicators.
            all_at_once(&w);
        });
    }
}

/// Several collectives in flight on one communicator, started in the same order everywhere but
/// completed in different orders, interleaved with point-to-point and blocking collectives.
#[test]
fn mixed_with_p2p_and_blocking_collectives() {
    run_local(4, |w| {
        let (r, n) = (w.rank(), w.size());
        let mut rounds = Vec::new();
        for it in 0..20u64 {
            let mut a = [0u64; 3];
            let mut b = vec![0u64; n];
            let mut p2p = [0u64];
            let mut blocking = [0u64];
            let (sa, sb) = ([it, r as u64, 1], [it * 100 + r as u64]);
            scope(|s| {
                let ra = w.iallreduce(s, &sa, &mut a, Op::Sum).unwrap();
                let rb = w.iallgather(s, &sb, &mut b).unwrap();
                let rr = w.irecv(s, &mut p2p, (r + n - 1) % n, 5).unwrap();
                w.send(&[it + r as u64], (r + 1) % n, 5).unwrap();
                // A blocking collective while the non-blocking ones are in flight.
                w.allreduce(&[1u64], &mut blocking, Op::Sum).unwrap();
                if r % 2 == 0 {
                    rb.wait().unwrap();
                    ra.wait().unwrap();
                } else {
                    ra.wait().unwrap();
                    rb.wait().unwrap();
                }
                rr.wait().unwrap();
            });
            assert_eq!(a, [it * n as u64, (n * (n - 1) / 2) as u64, n as u64]);
            assert_eq!(b, (0..n as u64).map(|q| it * 100 + q).collect::<Vec<_>>());
            assert_eq!(p2p[0], it + ((r + n - 1) % n) as u64);
            assert_eq!(blocking[0], n as u64);
            rounds.push(a[0]);
        }
        rounds.len()
    });
}

/// A request that is dropped without a wait is completed by its scope; a test loop drives it.
#[test]
fn dropped_requests_complete_at_scope_end_and_test_drives_progress() {
    let got = run_local(5, |w| {
        let mut x = [0u32];
        let mut y = [0u32];
        let me = [w.rank() as u32];
        scope(|s| {
            let _ = w.iallreduce(s, &me, &mut x, Op::Sum).unwrap();
            let mut q = w.iscan(s, &[1u32], &mut y, Op::Sum).unwrap();
            while q.test().unwrap().is_none() {}
        });
        (x[0], y[0])
    });
    for (r, (x, y)) in got.into_iter().enumerate() {
        assert_eq!(x, 10);
        assert_eq!(y, r as u32 + 1);
    }
}

/// Many collectives in flight at once (more than one round of tags' worth is not needed, but
/// enough to exercise the schedule slab).
#[test]
fn many_in_flight() {
    run_local(3, |w| {
        let sends: Vec<[u32; 2]> = (0..64).map(|i| [i, w.rank() as u32]).collect();
        let mut outs = vec![[0u32; 2]; 64];
        scope(|s| {
            let reqs: Vec<_> = sends.iter().zip(outs.iter_mut()).map(|(a, o)| w.iallreduce(s, a, o, Op::Max).unwrap()).collect();
            wait_all(reqs).unwrap();
        });
        for (i, o) in outs.iter().enumerate() {
            assert_eq!(*o, [i as u32, 2]);
        }
    });
}

#[test]
fn v_variants() {
    for n in 1..=7 {
        run_local(n, |w| {
            let (r, n) = (w.rank(), w.size());
            // Rank q contributes q + 1 elements; blocks in reverse order in the receive buffer.
            let counts: Vec<usize> = (0..n).map(|q| q + 1).collect();
            let total: usize = counts.iter().sum();
            let mut displs = vec![0; n];
            let mut at = total;
            for q in 0..n {
                at -= counts[q];
                displs[q] = at;
            }
            let send = vec![r as u8 + 1; r + 1];
            let mut g = vec![0u8; total];
            let mut ag = vec![0u8; total];
            let src: Vec<u8> = (0..total as u8).collect();
            let mut sv = vec![0u8; r + 1];
            // alltoallv: rank r sends j + 1 copies of r to rank j.
            let scounts: Vec<usize> = (0..n).map(|j| j + 1).collect();
            let sdispls: Vec<usize> = (0..n).map(|j| j * (j + 1) / 2).collect();
            let a_send: Vec<u8> = (0..n).flat_map(|j| vec![r as u8; j + 1]).collect();
            let rcounts = vec![r + 1; n];
            let rdispls: Vec<usize> = (0..n).map(|i| i * (r + 1)).collect();
            let mut a_recv = vec![0xffu8; n * (r + 1)];
            let mut rsc = vec![0u32; r + 1];
            let rs_send: Vec<u32> = (0..total as u32).collect();
            scope(|s| {
                let root = n - 1;
                let reqs = vec![
                    w.igatherv(s, &send, (r == root).then_some(&mut g[..]), &counts, &displs, root).unwrap(),
                    w.iallgatherv(s, &send, &mut ag, &counts, &displs).unwrap(),
                    w.iscatterv(s, (r == 0).then_some(&src[..]), &counts, &displs, &mut sv, 0).unwrap(),
                    w.ialltoallv(s, &a_send, &scounts, &sdispls, &mut a_recv, &rcounts, &rdispls).unwrap(),
                    w.ireduce_scatter(s, &rs_send, &mut rsc, &counts, Op::Sum).unwrap(),
                ];
                wait_all(reqs).unwrap();
            });
            let mut want = vec![0u8; total];
            for q in 0..n {
                want[displs[q]..displs[q] + counts[q]].fill(q as u8 + 1);
            }
            if r == n - 1 {
                assert_eq!(g, want);
            }
            assert_eq!(ag, want);
            assert_eq!(sv, src[displs[r]..displs[r] + r + 1].to_vec());
            assert_eq!(a_recv, (0..n).flat_map(|i| vec![i as u8; r + 1]).collect::<Vec<u8>>());
            let start: usize = counts[..r].iter().sum();
            assert_eq!(rsc, (start..start + r + 1).map(|i| (i * n) as u32).collect::<Vec<u32>>());
        });
    }
}

/// Non-commutative use of the order: scan over 2x2 matrix products would need a user op; with
/// the predefined ones, check that an allreduce gives bitwise identical floats on every rank.
#[test]
fn allreduce_floats_are_identical_everywhere() {
    let got = run_local(7, |w| {
        let x: Vec<f64> = (0..33).map(|i| ((i * 7 + w.rank() * 13) as f64).sin() * 1e-3 + 1.0 / (w.rank() + 1) as f64).collect();
        let mut y = vec![0.0f64; 33];
        scope(|s| w.iallreduce(s, &x, &mut y, Op::Sum).unwrap().wait().unwrap());
        y.iter().map(|v| v.to_bits()).collect::<Vec<u64>>()
    });
    assert!(got.windows(2).all(|p| p[0] == p[1]));
}

#[test]
fn bad_arguments_are_errors_not_panics() {
    run_local(3, |w| {
        let r = w.rank();
        let (one, two, three, onef) = ([1u32], [1u32, 2], [1u32, 2, 3], [1.0f32]);
        macro_rules! err {
            ($pat:pat, |$s:ident, $b:ident| $call:expr) => {{
                let mut $b = [0u32; 2];
                scope(|$s| assert!(matches!($call, Err($pat))));
            }};
        }
        err!(Error::InvalidRoot { root: 3, size: 3 }, |s, b| w.ibcast(s, &mut b, 3));
        err!(Error::InvalidOp { .. }, |s, b| w.ireduce(s, &onef, None, Op::BitAnd, 0).map(|q| (q, &mut b)));
        err!(Error::InvalidBuffer(_), |s, b| w.iallreduce(s, &three, &mut b, Op::Sum));
        err!(Error::InvalidBuffer(_), |s, b| w.iallgather(s, &one, &mut b));
        err!(Error::InvalidBuffer(_), |s, b| w.ialltoall(s, &two, &mut b));
        err!(Error::InvalidBuffer(_), |s, b| w.igatherv(s, &one, Some(&mut b), &[1, 1], &[0, 1], r));
        err!(Error::InvalidBuffer(_), |s, b| w.iallgatherv(s, &one, &mut b, &[1, 1, 1], &[0, 1, usize::MAX]));
        err!(Error::InvalidBuffer(_), |s, b| w.ireduce_scatter(s, &two, &mut b, &[1, 1, usize::MAX], Op::Sum));
        err!(Error::InvalidBuffer(_), |s, b| w.iscan(s, &one, &mut b, Op::Sum));
        // The failed calls consumed their sequence numbers on every rank alike: what follows
        // still matches up.
        let mut x = [0u32];
        scope(|s| w.iallreduce(s, &one, &mut x, Op::Sum).unwrap().wait().unwrap());
        assert_eq!(x[0], 3);
    });
}

/// Ranks that pass different lengths get an error from the request, not a hang or garbage.
#[test]
fn mismatched_lengths_fail_the_request() {
    let got = run_local(2, |w| {
        let mut buf = vec![1u8; if w.rank() == 0 { 8 } else { 4 }];
        scope(|s| w.ibcast(s, &mut buf, 0).unwrap().wait())
    });
    assert!(got[0].is_ok());
    assert!(got[1].is_err(), "{:?}", got[1]);
}

/// 2x2 integer matrix product: associative, not commutative.
fn matmul(a: &[i64; 4], b: &[i64; 4]) -> [i64; 4] {
    [a[0] * b[0] + a[1] * b[2], a[0] * b[1] + a[1] * b[3], a[2] * b[0] + a[3] * b[2], a[2] * b[1] + a[3] * b[3]]
}

fn mat_of(r: usize) -> [i64; 4] {
    [1 + (r % 3) as i64, 1, (r % 2) as i64, 1]
}

/// User operators, blocking and not, at 1 to 7 ranks and on a split: a non-commutative one
/// combines in rank order everywhere.
#[test]
fn user_ops_keep_rank_order() {
    for n in 1..=7 {
        run_local(n, |w| {
            let comms = [w.dup().unwrap(), w.split(Some((w.rank() % 2) as u32), -(w.rank() as i32)).unwrap().unwrap()];
            for c in &comms {
                let blocking = blocking_user_ops(c);
                nonblocking_user_ops(c, &blocking);
            }
        });
    }
}

/// The matrix product of every rank's `mat_of(q + 7 * j)` for q up to `k`, in rank order.
fn mat_prefix(k: usize, j: usize) -> [i64; 4] {
    (0..=k).map(|q| mat_of(q + 7 * j)).reduce(|a, b| matmul(&a, &b)).unwrap()
}

/// What the blocking forms of [`user_ops_keep_rank_order`] gave: allreduce, scan, exscan.
type Blocking = [[[i64; 4]; 2]; 3];

/// The blocking `allreduce`, `reduce`, `scan` and `exscan` of a non-commutative operator,
/// each checked against the product in rank order.
fn blocking_user_ops(c: &crate::Comm) -> Blocking {
    let (r, n) = (c.rank(), c.size());
    let op = crate::UserOp::new(false, matmul);
    let me = [mat_of(r), mat_of(r + 7)];
    let mut all = [[0i64; 4]; 2];
    c.allreduce_with(&me, &mut all, &op).unwrap();
    assert_eq!(all, [mat_prefix(n - 1, 0), mat_prefix(n - 1, 1)]);
    let mut red = [[0i64; 4]; 2];
    c.reduce_with(&me, (r == n - 1).then_some(&mut red[..]), &op, n - 1).unwrap();
    if r == n - 1 {
        assert_eq!(red, all);
    }
    let mut sc = [[0i64; 4]; 2];
    c.scan_with(&me, &mut sc, &op).unwrap();
    assert_eq!(sc, [mat_prefix(r, 0), mat_prefix(r, 1)]);
    let mut ex = [[9i64; 4]; 2];
    c.exscan_with(&me, &mut ex, &op).unwrap();
    if r > 0 {
        assert_eq!(ex, [mat_prefix(r - 1, 0), mat_prefix(r - 1, 1)]);
    } else {
        assert_eq!(ex, [[9; 4]; 2]);
    }
    [all, sc, ex]
}

/// The non-blocking forms, all in flight together (with `reduce_scatter`, `min_loc` and
/// `max_loc`), against the blocking results.
fn nonblocking_user_ops(c: &crate::Comm, &[all, sc, ex]: &Blocking) {
    use crate::{Loc, UserOp};
    let (r, n) = (c.rank(), c.size());
    let op = UserOp::new(false, matmul);
    let me = [mat_of(r), mat_of(r + 7)];
    let big: Vec<[i64; 4]> = (0..n).map(|q| mat_of(r + q)).collect();
    let (mut a2, mut s2, mut x2, mut rs) = ([[0i64; 4]; 2], [[0i64; 4]; 2], [[0i64; 4]; 2], [[0i64; 4]; 1]);
    let mut r2 = [[0i64; 4]; 2];
    let ones = vec![1usize; n];
    let loc = [Loc { value: ((r * 5) % 7) as f64, index: r as u64 }];
    let mut ml = [Loc { value: 0.0, index: 0 }];
    let mut mx = [Loc { value: 0.0, index: 0 }];
    scope(|s| {
        let q = vec![
            c.iallreduce_with(s, &me, &mut a2, &op).unwrap(),
            c.iscan_with(s, &me, &mut s2, &op).unwrap(),
            c.iexscan_with(s, &me, &mut x2, &op).unwrap(),
            c.ireduce_with(s, &me, (r == 0).then_some(&mut r2[..]), &op, 0).unwrap(),
            c.ireduce_scatter_with(s, &big, &mut rs, &ones, &op).unwrap(),
            c.iallreduce_with(s, &loc, &mut ml, &UserOp::min_loc()).unwrap(),
            c.iallreduce_with(s, &loc, &mut mx, &UserOp::max_loc()).unwrap(),
        ];
        wait_all(q).unwrap();
    });
    assert_eq!(a2, all);
    assert_eq!(s2, sc);
    if r > 0 {
        assert_eq!(x2, ex);
    }
    if r == 0 {
        assert_eq!(r2, all);
    }
    let want_rs = (0..n).map(|q| mat_of(q + r)).reduce(|a, b| matmul(&a, &b)).unwrap();
    assert_eq!(rs[0], want_rs);
    let vals: Vec<f64> = (0..n).map(|q| ((q * 5) % 7) as f64).collect();
    let lo = vals.iter().cloned().fold(f64::INFINITY, f64::min);
    let hi = vals.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    assert_eq!(ml[0], Loc { value: lo, index: vals.iter().position(|&v| v == lo).unwrap() as u64 });
    assert_eq!(mx[0], Loc { value: hi, index: vals.iter().position(|&v| v == hi).unwrap() as u64 });
}

/// A user operator that panics on one rank: the panic unwinds out of the wait (the scope
/// abandons the collective's transfers first), and the other rank's wait fails with
/// `PeerGone` once the panicking rank has left, instead of hanging.
#[test]
fn a_panicking_user_operator_unwinds_cleanly() {
    use crate::UserOp;
    let got = run_local(2, |w| {
        let op = UserOp::new(false, |a: &u32, b: &u32| if *b == 99 { panic!("operator refuses 99") } else { a + b });
        let mine = [if w.rank() == 1 { 99u32 } else { 1 }];
        let mut out = [0u32];
        if w.rank() == 0 {
            let r =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| scope(|s| w.iallreduce_with(s, &mine, &mut out, &op)?.wait())));
            // The engine is usable afterwards.
            let mut x = [0u8];
            let st = w.sendrecv(&[5u8], 0, 9, &mut x, 0, 9).map(|_| x[0]);
            (r.is_err(), st.ok())
        } else {
            let r = scope(|s| w.iallreduce_with(s, &mine, &mut out, &op)?.wait());
            (matches!(r, Err(Error::PeerGone { rank: 0 })), None)
        }
    });
    assert_eq!(got, vec![(true, Some(5)), (true, None)]);
}
