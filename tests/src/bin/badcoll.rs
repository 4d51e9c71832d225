//! Collectives with bad arguments return errors at once, and the communicator still works.
//!
//! On the world communicator every rank makes the same mistake (so no rank is left waiting):
//! a root outside the communicator (`InvalidRoot`), reduction buffers of different lengths,
//! an `allgather` / `alltoall` receive buffer of the wrong length (`InvalidBuffer`), a bitwise
//! operator on floats (`InvalidOp`). After each, a correct `allreduce` must still give the
//! right answer. Mistakes only a root can make (no receive buffer at the root of `reduce` /
//! `gather`, no send buffer at the root of `scatter`, a root buffer of the wrong length) are
//! made on a communicator of one rank (each rank's own, from `split`), where they cannot leave
//! other ranks waiting.
//!
//! Then on the world, with more than one rank: mistakes rank 0 alone makes (`scatter` and
//! `iscatterv` without a send buffer at the root, receive buffers of the wrong length in
//! `allgather`, `alltoall`, `allreduce` and `iallgather`) give rank 0 `InvalidBuffer` and
//! every other rank `CollectiveFailed` (or `InvalidBuffer` where the shared-memory slot
//! compares arguments) instead of leaving it waiting; blocks whose lengths disagree between
//! the ranks give every rank an error; a communicator that reuses the id of one whose call
//! failed everywhere does not take that failure for its own call of the same number.
//!
//! `badcoll --after-finalize`: every collective, blocking and non-blocking, and every
//! communicator constructor, called through a clone of the world and a dup that outlived the
//! finalized world, with empty and non-empty buffers (at one rank and with empty buffers the
//! collectives have shortcuts that need no communication): each must be `Error::State`. Each
//! rank checks its own calls (nothing can be combined after the finalize); a rank with a
//! failure exits non-zero, and rank 0 prints the `OK` line.

use std::error::Error as StdError;

use tmpi::{scope, Comm, Error, Op, UserOp};
use tmpi_tests::Verdict;

fn invalid_root(root: usize, size: usize) -> impl FnOnce(&Error) -> bool {
    move |e| matches!(e, Error::InvalidRoot { root: r, size: s } if *r == root && *s == size)
}

fn invalid_buffer(e: &Error) -> bool {
    matches!(e, Error::InvalidBuffer(_))
}

/// A correct collective after a refused one: the communicator is not left in a bad state.
fn still_works(c: &Comm, v: &mut Verdict, after: &str) -> tmpi::Result<()> {
    let mut s = [0u64; 2];
    c.allreduce(&[1u64, c.rank() as u64], &mut s, Op::Sum)?;
    let p = c.size() as u64;
    v.check(s == [p, p * (p - 1) / 2], || format!("allreduce after {after}: {s:?}"));
    Ok(())
}

fn symmetric(c: &Comm, v: &mut Verdict) -> tmpi::Result<()> {
    let p = c.size();
    for root in [p, p + 3, usize::MAX] {
        let mut b = [1u32; 4];
        v.check_err(c.bcast(&mut b, root), invalid_root(root, p), "bcast: InvalidRoot");
        let mut out = [0u32; 4];
        v.check_err(c.reduce(&[1u32; 4], Some(&mut out), Op::Sum, root), invalid_root(root, p), "reduce: InvalidRoot");
        let mut all = vec![0u32; 4 * p];
        v.check_err(c.gather(&[1u32; 4], Some(&mut all), root), invalid_root(root, p), "gather: InvalidRoot");
        v.check_err(c.scatter(Some(&all), &mut out, root), invalid_root(root, p), "scatter: InvalidRoot");
        still_works(c, v, &format!("root {root}"))?;
    }

    let mut three = [0u64; 3];
    v.check_err(c.allreduce(&[1u64; 4], &mut three, Op::Sum), invalid_buffer, "allreduce 4 -> 3: InvalidBuffer");
    let mut five = [0u64; 5];
    v.check_err(c.allreduce(&[1u64; 4], &mut five, Op::Max), invalid_buffer, "allreduce 4 -> 5: InvalidBuffer");
    still_works(c, v, "allreduce with bad lengths")?;

    let mut short = vec![0u16; 2 * p - 1];
    v.check_err(c.allgather(&[1u16; 2], &mut short), invalid_buffer, "allgather short: InvalidBuffer");
    let mut long = vec![0u16; 2 * p + 1];
    v.check_err(c.allgather(&[1u16; 2], &mut long), invalid_buffer, "allgather long: InvalidBuffer");
    still_works(c, v, "allgather with bad lengths")?;

    let send = vec![1u8; 2 * p];
    let mut out = vec![0u8; 2 * p + 1];
    v.check_err(c.alltoall(&send, &mut out), invalid_buffer, "alltoall recv != send: InvalidBuffer");
    if p > 1 {
        let send = vec![1u8; 2 * p + 1];
        let mut out = vec![0u8; 2 * p + 1];
        v.check_err(c.alltoall(&send, &mut out), invalid_buffer, "alltoall not divisible: InvalidBuffer");
        // A byte count that divides by the ranks, an element count that does not: no rank's
        // block may end inside an element.
        let send = vec![1u32; 2 * p + 1];
        let mut out = vec![0u32; 2 * p + 1];
        v.check_err(c.alltoall(&send, &mut out), invalid_buffer, "alltoall of u32 not divisible: InvalidBuffer");
    }
    still_works(c, v, "alltoall with bad lengths")?;

    let mut f = [0f64; 2];
    v.check_err(
        c.allreduce(&[1.0f64, 2.0], &mut f, Op::BitAnd),
        |e| matches!(e, Error::InvalidOp { .. }),
        "allreduce BitAnd on f64: InvalidOp",
    );
    let mut g = [0f32; 2];
    v.check_err(
        c.reduce(&[1.0f32, 2.0], Some(&mut g), Op::BitXor, 0),
        |e| matches!(e, Error::InvalidOp { .. }),
        "reduce BitXor on f32: InvalidOp",
    );
    still_works(c, v, "float bitwise operators")
}

/// What a rank whose own arguments were right gets when rank 0's were not: the call failed on
/// rank 0 (`CollectiveFailed`), or (where the shared-memory slot compares the ranks'
/// arguments) that the ranks disagree (`InvalidBuffer`).
fn failed_elsewhere(e: &Error) -> bool {
    matches!(e, Error::CollectiveFailed { rank: 0 } | Error::InvalidBuffer(_))
}

/// Mistakes rank 0 alone makes (on the world, so rank 0 of `c` is world rank 0): it gets
/// `InvalidBuffer`, every other rank an error instead of waiting, and the communicator works.
fn one_rank_wrong(c: &Comm, v: &mut Verdict) -> tmpi::Result<()> {
    let (p, me) = (c.size(), c.rank());
    let mut expect = |r: tmpi::Result<()>, what: &str| match me {
        0 => v.check_err(r, invalid_buffer, &format!("{what}, rank 0: InvalidBuffer")),
        _ => v.check_err(r, failed_elsewhere, &format!("{what}, other ranks: CollectiveFailed")),
    };
    let mut one = [0u32; 1];
    expect(c.scatter(if me == 0 { None } else { Some(&[1u32][..]) }, &mut one, 0), "scatter, root without send");
    let mut all = vec![0u32; if me == 0 { p + 1 } else { p }];
    expect(c.allgather(&[1u32], &mut all), "allgather, rank 0's receive too long");
    expect(c.alltoall(&vec![1u32; p], &mut all), "alltoall, rank 0's receive too long");
    let mut sum = vec![0u32; if me == 0 { 1 } else { 2 }];
    expect(c.allreduce(&[1u32, 1], &mut sum, Op::Sum), "allreduce, rank 0's receive too short");
    let r = scope(|s| c.iallgather(s, &[1u32], &mut all).and_then(|q| q.wait()).map(drop));
    expect(r, "iallgather, rank 0's receive too long");
    let (counts, displs): (Vec<usize>, Vec<usize>) = (vec![1; p], (0..p).collect());
    let r = scope(|s| c.iscatterv(s, None, &counts, &displs, &mut one, 0).and_then(|q| q.wait()).map(drop));
    expect(r, "iscatterv, root without a send buffer");
    still_works(c, v, "one rank's mistakes")
}

/// Rank 0 passes blocks twice as long as the others': every rank gets an error (which one
/// depends on what arrived where), none waits, and the communicator works.
fn lengths_disagree(c: &Comm, v: &mut Verdict) -> tmpi::Result<()> {
    let (p, k) = (c.size(), if c.rank() == 0 { 2 } else { 1 });
    let mut all = vec![0u32; p * k];
    let r = c.allgather(&vec![1u32; k], &mut all);
    v.check(r.is_err(), || format!("allgather with blocks of {k}: {r:?}, not an error"));
    let r = c.alltoall(&vec![1u32; p * k], &mut all);
    v.check(r.is_err(), || format!("alltoall with blocks of {k}: {r:?}, not an error"));
    still_works(c, v, "lengths that disagree")
}

/// A call that failed on every rank leaves notices on the others; a later communicator that
/// gets the same id numbers its calls from the start again and must not take them for its
/// own: its call of the same number, which rank 0 enters late (so that the others wait and
/// look for failures), succeeds.
fn reused_id(world: &Comm, v: &mut Verdict) -> tmpi::Result<()> {
    let c = world.dup()?;
    let mut f = [0f64];
    v.check_err(c.allreduce(&[1.0f64], &mut f, Op::BitAnd), |e| matches!(e, Error::InvalidOp { .. }), "allreduce BitAnd on f64 (dup)");
    drop(c);
    world.barrier()?;
    let c = world.dup()?;
    if c.rank() == 0 {
        std::thread::sleep(std::time::Duration::from_millis(300));
    }
    let mut s = [0u64];
    let r = c.allreduce(&[1u64], &mut s, Op::Sum);
    v.check(matches!(r, Ok(())) && s[0] == c.size() as u64, || format!("allreduce on a dup with a reused id: {r:?} {s:?}"));
    Ok(())
}

fn root_only(me: &Comm, v: &mut Verdict) -> tmpi::Result<()> {
    v.check(me.size() == 1 && me.rank() == 0, || format!("self comm: size {} rank {}", me.size(), me.rank()));
    v.check_err(me.reduce(&[1u32; 3], None, Op::Sum, 0), invalid_buffer, "reduce root without recv");
    let mut two = [0u32; 2];
    v.check_err(me.reduce(&[1u32; 3], Some(&mut two), Op::Sum, 0), invalid_buffer, "reduce root recv too short");
    v.check_err(me.gather(&[1u32; 3], None, 0), invalid_buffer, "gather root without recv");
    v.check_err(me.gather(&[1u32; 3], Some(&mut two), 0), invalid_buffer, "gather root recv too short");
    let mut three = [0u32; 3];
    v.check_err(me.scatter(None, &mut three, 0), invalid_buffer, "scatter root without send");
    v.check_err(me.scatter(Some(&[1u32; 4]), &mut three, 0), invalid_buffer, "scatter root send too long");
    still_works(me, v, "root-only mistakes")?;
    // And the good versions on the same communicator.
    let mut out = [0u32; 3];
    me.gather(&[4u32, 5, 6], Some(&mut out), 0)?;
    v.check(out == [4, 5, 6], || format!("gather on self: {out:?}"));
    me.scatter(Some(&[7u32, 8, 9]), &mut out, 0)?;
    v.check(out == [7, 8, 9], || format!("scatter on self: {out:?}"));
    Ok(())
}

/// Every collective and constructor on `c` (whose world is finalized), with buffers of
/// `k` elements per rank: each call's name and whether it gave `Error::State`.
fn after_finalize(c: &Comm, k: usize) -> Vec<(String, bool)> {
    let (p, me) = (c.size(), c.rank());
    let mut got: Vec<(String, bool)> = Vec::new();
    let mut note = |name: &str, r: tmpi::Result<()>| got.push((format!("{name} ({k} elements)"), matches!(r, Err(Error::State(_)))));
    let send = vec![1u32; k];
    let all = vec![1u32; k * p];
    let (mut one, mut many) = (vec![0u32; k], vec![0u32; k * p]);
    let counts = vec![k; p];
    let displs: Vec<usize> = (0..p).map(|i| i * k).collect();
    let sum = UserOp::new(true, |a: &u32, b: &u32| a.wrapping_add(*b));
    note("barrier", c.barrier());
    note("bcast", c.bcast(&mut one, 0));
    note("reduce", c.reduce(&send, Some(&mut one), Op::Sum, 0));
    note("allreduce", c.allreduce(&send, &mut one, Op::Sum));
    note("gather", c.gather(&send, Some(&mut many), 0));
    note("scatter", c.scatter(Some(&all), &mut one, 0));
    note("allgather", c.allgather(&send, &mut many));
    note("alltoall", c.alltoall(&all, &mut many));
    note("gatherv", c.gatherv(&send, Some(&mut many), &counts, &displs, 0));
    note("scatterv", c.scatterv(Some(&all), &counts, &displs, &mut one, 0));
    note("allgatherv", c.allgatherv(&send, &mut many, &counts, &displs));
    note("alltoallv", c.alltoallv(&all, &counts, &displs, &mut many, &counts, &displs));
    note("reduce_scatter", c.reduce_scatter(&all, &mut one, &counts, Op::Sum));
    note("reduce_scatter_block", c.reduce_scatter_block(&all, &mut one, Op::Sum));
    note("scan", c.scan(&send, &mut one, Op::Sum));
    note("exscan", c.exscan(&send, &mut one, Op::Sum));
    note("reduce_with", c.reduce_with(&send, Some(&mut one), &sum, 0));
    note("allreduce_with", c.allreduce_with(&send, &mut one, &sum));
    note("reduce_scatter_with", c.reduce_scatter_with(&all, &mut one, &counts, &sum));
    note("scan_with", c.scan_with(&send, &mut one, &sum));
    note("exscan_with", c.exscan_with(&send, &mut one, &sum));
    note("dup", c.dup().map(drop));
    note("split", c.split(Some(0), me as i32).map(drop));
    note("split_type", c.split_type(tmpi::SplitType::Shared, 0).map(drop));
    note("create", c.create(&c.group()).map(drop));
    scope(|s| {
        note("ibarrier", c.ibarrier(s).map(drop));
        note("ibcast", c.ibcast(s, &mut one, 0).map(drop));
    });
    scope(|s| note("iallreduce", c.iallreduce(s, &send, &mut one, Op::Sum).map(drop)));
    scope(|s| note("iallgather", c.iallgather(s, &send, &mut many).map(drop)));
    scope(|s| note("ialltoall", c.ialltoall(s, &all, &mut many).map(drop)));
    scope(|s| note("iscan", c.iscan(s, &send, &mut one, Op::Sum).map(drop)));
    got
}

/// `--after-finalize` (see the module docs).
fn after_finalize_mode(world: tmpi::World) -> Result<(), Box<dyn StdError>> {
    let (rank, size) = (world.rank(), world.size());
    let kept: Comm = (*world).clone();
    let dup = world.dup()?;
    world.finalize()?;
    let mut calls = 0;
    let mut failed = Vec::new();
    for (name, c) in [("world clone", &kept), ("dup", &dup)] {
        for k in [0, 3] {
            for (call, ok) in after_finalize(c, k) {
                calls += 1;
                if !ok {
                    failed.push(format!("{name}: {call}"));
                }
            }
        }
    }
    if !failed.is_empty() {
        return Err(format!(
            "badcoll: rank {rank}: {} of {calls} calls after finalize were not Error::State: {}",
            failed.len(),
            failed.join(", ")
        )
        .into());
    }
    if rank == 0 {
        println!("badcoll: {size} ranks: {calls} calls after finalize, each Error::State: OK");
    }
    Ok(())
}

fn main() -> Result<(), Box<dyn StdError>> {
    let world = tmpi::init()?;
    if std::env::args().skip(1).any(|a| a == "--after-finalize") {
        return after_finalize_mode(world);
    }
    let mut v = Verdict::new("badcoll", world.rank());
    symmetric(&world, &mut v)?;
    let me = world.split(Some(world.rank() as u32), 0)?;
    match me {
        Some(me) => root_only(&me, &mut v)?,
        None => v.check(false, || "split with a color returned None".into()),
    }
    let dup = world.dup()?;
    symmetric(&dup, &mut v)?;
    if world.size() > 1 {
        one_rank_wrong(&world, &mut v)?;
        lengths_disagree(&world, &mut v)?;
        reused_id(&world, &mut v)?;
    }
    let one_rank = if world.size() > 1 { "one rank's mistakes fail every rank's call, " } else { "" };
    let summary = format!("{} ranks: InvalidRoot, InvalidBuffer, InvalidOp, {one_rank}communicators still work", world.size());
    v.finish(&world, &summary)?;
    world.finalize()?;
    Ok(())
}
