//! Variable-count collectives ([`gatherv`], [`scatterv`], [`allgatherv`](super::run::allgatherv), [`alltoallv`]),
//! reduce-scatter ([`reduce_scatter`](super::run::reduce_scatter), [`reduce_scatter_block`](super::run::reduce_scatter_block)) and prefix reductions
//! ([`scan`], [`exscan`]).
//!
//! Counts and displacements are in elements of `T`, one per rank. Every one is checked against
//! the buffer it describes before any communication; a block that does not fit is
//! [`Error::InvalidBuffer`], never a panic or an access out of bounds. Receive blocks must not
//! overlap (MPI calls that erroneous; here it is an error too); send blocks may.
//!
//! # A failing rank does not strand the others
//!
//! Where the communication schedule of a call does not depend on the bad argument, a rank whose
//! arguments are wrong still runs the schedule, with empty messages or a scratch buffer, and
//! returns its error at the end:
//!
//! - [`gatherv`] / [`scatterv`]: a root with a bad layout receives (and drops) every rank's block,
//!   or sends every rank an empty block (which that rank reports as a short message unless it
//!   expected nothing);
//! - [`allgatherv`](super::run::allgatherv) / [`alltoallv`]: a rank with bad arguments, or one that received a block of
//!   the wrong length, goes on with empty messages for the remaining rounds, so every rank
//!   finishes its rounds (those fed an empty block report it);
//! - [`reduce_scatter`](super::run::reduce_scatter), [`scan`], [`exscan`]: a receive buffer of the wrong length is replaced by
//!   scratch space for the call.
//!
//! Arguments that change the schedule itself (a root or `counts` that differ between ranks)
//! are erroneous in MPI as well; they surface as an error on the ranks that see a message of the
//! wrong size, and ranks still waiting are released when the failing rank exits
//! ([`Error::PeerGone`]).
//!
//! # Algorithms
//!
//! - [`gatherv`] / [`scatterv`]: linear; the root receives (sends) each block in place, in rank
//!   order, with no intermediate copy.
//! - [`allgatherv`](super::run::allgatherv): ring in place (each block forwarded once by every rank), or recursive
//!   doubling / Bruck on the blocks packed in rank order, as [`super::select`] chooses.
//! - [`alltoallv`]: pairwise exchange as [`super::alltoall`], or every block at once.
//! - [`reduce_scatter`](super::run::reduce_scatter) / [`reduce_scatter_block`](super::run::reduce_scatter_block): see [`super::select::ReduceScatter`].
//! - [`scan`] / [`exscan`]: recursive doubling (`ceil(log2 p)` exchanges of the whole vector); a
//!   rank's result is combined strictly in rank order, lower ranks on the left.

use bytemuck::Pod;

use super::plan::{inp, out, Grp, Plan, ReduceFn, Span};
use super::reduce::{builtin, Vector};
use super::CollP2p;
use crate::error::{Error, Result};
use crate::op::{check_op, Op, Reducible};

/// Tags of the collectives of this module (kept apart from [`super::tags`]).
pub(crate) mod vtags {
    /// Gatherv.
    pub(crate) const GATHERV: u32 = 96;
    /// Scatterv.
    pub(crate) const SCATTERV: u32 = 97;
    /// Allgatherv (every algorithm).
    pub(crate) const ALLGATHERV: u32 = 98;
    /// Alltoallv.
    pub(crate) const ALLTOALLV: u32 = 99;
    /// Scan and exscan.
    pub(crate) const SCAN: u32 = 100;
    /// Reduce-scatter (every algorithm; up to 4 phases).
    pub(crate) const REDUCE_SCATTER: u32 = 104;
}

fn bytes<T: Pod>(s: &[T]) -> &[u8] {
    bytemuck::cast_slice(s)
}

fn bytes_mut<T: Pod>(s: &mut [T]) -> &mut [u8] {
    bytemuck::cast_slice_mut(s)
}

/// Element ranges of a checked layout: block `r` is `displs[r]..displs[r] + counts[r]`.
pub(crate) struct Layout<'a> {
    pub(crate) counts: &'a [usize],
    displs: &'a [usize],
}

impl Layout<'_> {
    /// Bytes of block `r` within `s`, for elements of `es` bytes.
    pub(crate) fn span(&self, s: Span, r: usize, es: usize) -> Span {
        s.sub(self.displs[r] * es..(self.displs[r] + self.counts[r]) * es)
    }
}

/// Checks `counts`/`displs` (elements) against a buffer of `len` elements on `size` ranks: one
/// of each per rank, every block inside the buffer and, if `disjoint`, no two non-empty blocks
/// overlapping.
///
/// # Errors
/// [`Error::InvalidBuffer`] naming the call (`what`), the side and the offending rank.
pub(crate) fn check_layout<'a>(
    what: &str,
    side: &str,
    counts: &'a [usize],
    displs: &'a [usize],
    size: usize,
    len: usize,
    disjoint: bool,
) -> Result<Layout<'a>> {
    if counts.len() != size || displs.len() != size {
        return Err(Error::InvalidBuffer(format!(
            "{what}: {} {side} counts and {} displacements given, the communicator has {size} ranks",
            counts.len(),
            displs.len()
        )));
    }
    for (r, (&n, &d)) in counts.iter().zip(displs).enumerate() {
        match d.checked_add(n) {
            Some(end) if end <= len => {}
            _ => {
                return Err(Error::InvalidBuffer(format!(
                    "{what}: {side} block of rank {r} ({n} elements at displacement {d}) does not fit a \
                     {len}-element buffer"
                )))
            }
        }
    }
    if disjoint {
        let mut blocks: Vec<(usize, usize, usize)> =
            (0..size).filter(|&r| counts[r] > 0).map(|r| (displs[r], displs[r] + counts[r], r)).collect();
        blocks.sort_unstable();
        for w in blocks.windows(2) {
            if w[0].1 > w[1].0 {
                return Err(Error::InvalidBuffer(format!(
                    "{what}: {side} blocks of ranks {} and {} overlap",
                    w[0].2.min(w[1].2),
                    w[0].2.max(w[1].2)
                )));
            }
        }
    }
    Ok(Layout { counts, displs })
}

/// Checks that this rank's own block has the length of its buffer.
pub(crate) fn check_own(what: &str, rank: usize, count: usize, len: usize, buf: &str) -> Result<()> {
    if count == len {
        Ok(())
    } else {
        Err(Error::InvalidBuffer(format!("{what}: the count for this rank ({rank}) is {count} elements but its {buf} buffer has {len}")))
    }
}

/// Keeps the first of two errors, except that a departed peer wins (so the call's abort reaches
/// the other members).
pub(crate) fn first_err(first: Option<Error>, r: Result<()>) -> Result<()> {
    match (first, r) {
        (_, Err(e @ Error::PeerGone { .. })) => Err(e),
        (Some(e), _) => Err(e),
        (None, r) => r,
    }
}

/// The plan of [`gatherv`] (`recv_len`: the root's receive buffer, in elements, if it passed
/// one). A root whose layout is bad takes (and drops) every rank's block and fails.
///
/// # Errors
/// [`Error::InvalidRoot`].
pub(crate) fn gatherv_plan<T: Pod>(
    rank: usize,
    size: usize,
    send: &[T],
    recv_len: Option<usize>,
    counts: &[usize],
    displs: &[usize],
    root: usize,
) -> Result<Plan> {
    super::check_root(root, size)?;
    let es = std::mem::size_of::<T>();
    let mut p = Plan::new();
    if rank != root {
        p.send(inp(0, std::mem::size_of_val(send)), root, vtags::GATHERV);
        p.finish();
        return Ok(p);
    }
    // A block of the wrong length is reported after the other blocks are taken.
    p.tolerant = true;
    let checked = match recv_len {
        None => Err(Error::InvalidBuffer("gatherv: the root must pass a receive buffer".into())),
        Some(len) => check_layout("gatherv", "receive", counts, displs, size, len, true)
            .and_then(|l| check_own("gatherv", rank, l.counts[rank], send.len(), "send").map(|()| l)),
    };
    let whole = out(0, recv_len.unwrap_or(0) * es);
    match checked {
        Ok(l) => {
            p.copy(inp(0, std::mem::size_of_val(send)), l.span(whole, rank, es));
            for r in (0..size).filter(|&r| r != rank) {
                p.recv(l.span(whole, r, es), r, vtags::GATHERV);
            }
        }
        Err(e) => {
            // Take (and drop) every block so that no sender waits for this root.
            for r in (0..size).filter(|&r| r != rank) {
                p.recv(Span::empty(), r, vtags::GATHERV);
            }
            p.fail_locally(e);
        }
    }
    p.finish();
    Ok(p)
}

/// Collects `send` of every rank into `recv` at `root`: rank `r`'s elements land at
/// `recv[displs[r]..displs[r] + counts[r]]`, and `counts[r]` must be rank `r`'s `send.len()`.
///
/// `recv`, `counts` and `displs` are read at the root only (other ranks may pass `None` and
/// empty slices).
///
/// # Errors
/// [`Error::InvalidRoot`] before any communication. At the root: [`Error::InvalidBuffer`] when
/// `recv` is missing, a block does not fit, receive blocks overlap or the root's own count is
/// not `send.len()` (the root still takes every rank's block, so nobody waits); when a rank's
/// block has another length than its count. Transport errors, [`Error::PeerGone`].
pub(crate) fn gatherv<T: Pod, C: CollP2p + ?Sized>(
    c: &C,
    send: &[T],
    recv: Option<&mut [T]>,
    counts: &[usize],
    displs: &[usize],
    root: usize,
) -> Result<()> {
    let recv = if c.rank() == root { recv } else { None };
    let plan = gatherv_plan(c.rank(), c.size(), send, recv.as_ref().map(|r| r.len()), counts, displs, root)?;
    c.run(plan, Some(bytes(send)), recv.map(bytes_mut))
}

/// The plan of [`scatterv`] (`send_len`: the root's send buffer, in elements, if it passed
/// one). A root whose layout is bad sends every rank an empty block and fails.
///
/// # Errors
/// [`Error::InvalidRoot`].
pub(crate) fn scatterv_plan<T: Pod>(
    rank: usize,
    size: usize,
    send_len: Option<usize>,
    counts: &[usize],
    displs: &[usize],
    recv: &[T],
    root: usize,
) -> Result<Plan> {
    super::check_root(root, size)?;
    let es = std::mem::size_of::<T>();
    let mut p = Plan::new();
    let mine = out(0, std::mem::size_of_val(recv));
    if rank != root {
        p.recv(mine, root, vtags::SCATTERV);
        p.finish();
        return Ok(p);
    }
    let checked = match send_len {
        None => Err(Error::InvalidBuffer("scatterv: the root must pass a send buffer".into())),
        Some(len) => check_layout("scatterv", "send", counts, displs, size, len, false)
            .and_then(|l| check_own("scatterv", rank, l.counts[rank], recv.len(), "receive").map(|()| l)),
    };
    let whole = inp(0, send_len.unwrap_or(0) * es);
    match checked {
        Ok(l) => {
            for r in (0..size).filter(|&r| r != rank) {
                p.send(l.span(whole, r, es), r, vtags::SCATTERV);
            }
            p.copy(l.span(whole, rank, es), mine);
        }
        Err(e) => {
            for r in (0..size).filter(|&r| r != rank) {
                p.send(Span::empty(), r, vtags::SCATTERV);
            }
            p.fail_locally(e);
        }
    }
    p.finish();
    Ok(p)
}

/// Distributes blocks of `send` at `root`: rank `r` receives
/// `send[displs[r]..displs[r] + counts[r]]` into its `recv`, whose length must be `counts[r]`.
///
/// `send`, `counts` and `displs` are read at the root only. Send blocks may overlap.
///
/// # Errors
/// [`Error::InvalidRoot`] before any communication. At the root: [`Error::InvalidBuffer`] when
/// `send` is missing, a block does not fit or the root's own count is not `recv.len()` (the root
/// then sends every rank an empty block, which it reports unless it expected none). Elsewhere:
/// [`Error::InvalidBuffer`] when the block has another length than `recv`. Transport errors,
/// [`Error::PeerGone`].
pub(crate) fn scatterv<T: Pod, C: CollP2p + ?Sized>(
    c: &C,
    send: Option<&[T]>,
    counts: &[usize],
    displs: &[usize],
    recv: &mut [T],
    root: usize,
) -> Result<()> {
    let send = if c.rank() == root { send } else { None };
    let plan = scatterv_plan(c.rank(), c.size(), send.map(<[T]>::len), counts, displs, recv, root)?;
    c.run(plan, send.map(bytes), Some(bytes_mut(recv)))
}

/// Allgatherv on `g` by `algo`: `blocks[i]` (of `sizes[i]` bytes) receives member `i`'s data;
/// `blocks[me]` already holds this member's.
pub(crate) fn plan_allgatherv(p: &mut Plan, g: Grp<'_>, algo: super::select::Allgather, sizes: &[usize], blocks: &[Span], tag: u32) {
    use super::select::Allgather;
    match algo {
        Allgather::RecursiveDoubling if g.n.is_power_of_two() => allgatherv_doubling(p, g, sizes, blocks, tag),
        Allgather::Bruck => allgatherv_bruck(p, g, sizes, blocks, tag),
        _ => {
            // Ring, in place.
            let (me, n) = (g.me, g.n);
            let (right, left) = (g.rank((me + 1) % n), g.rank((me + n - 1) % n));
            p.next();
            for k in 0..n.saturating_sub(1) {
                p.send(blocks[(me + n - k) % n], right, tag);
                p.recv(blocks[(me + 2 * n - k - 1) % n], left, tag);
                p.next();
            }
        }
    }
}

/// Offsets of `sizes` packed one after the other: `n + 1` of them, the last the total.
fn packed(sizes: impl Iterator<Item = usize>) -> Vec<usize> {
    std::iter::once(0)
        .chain(sizes.scan(0, |a, s| {
            *a += s;
            Some(*a)
        }))
        .collect()
}

/// Recursive-doubling allgatherv (power-of-two member counts): on the blocks packed in member
/// order, then out to their places.
fn allgatherv_doubling(p: &mut Plan, g: Grp<'_>, sizes: &[usize], blocks: &[Span], tag: u32) {
    let (me, n) = (g.me, g.n);
    let pre = packed(sizes.iter().copied());
    let t = p.temp(pre[n]);
    let range = |lo: usize, hi: usize| t.sub(pre[lo]..pre[hi]);
    p.next();
    p.copy(blocks[me], range(me, me + 1));
    let mut m = 1;
    while m < n {
        let partner = me ^ m;
        let (mine, theirs) = (me & !(m - 1), partner & !(m - 1));
        p.send(range(mine, mine + m), g.rank(partner), tag);
        p.recv(range(theirs, theirs + m), g.rank(partner), tag);
        p.next();
        m <<= 1;
    }
    for i in (0..n).filter(|&i| i != me) {
        p.copy(range(i, i + 1), blocks[i]);
    }
    p.next();
}

/// Bruck allgatherv: on the blocks packed in relative order (this member first).
fn allgatherv_bruck(p: &mut Plan, g: Grp<'_>, sizes: &[usize], blocks: &[Span], tag: u32) {
    let (me, n) = (g.me, g.n);
    let rel = |j: usize| (me + j) % n;
    let pre = packed((0..n).map(|j| sizes[rel(j)]));
    let t = p.temp(pre[n]);
    let range = |lo: usize, hi: usize| t.sub(pre[lo]..pre[hi]);
    p.next();
    p.copy(blocks[me], range(0, 1));
    let mut d = 1;
    while d < n {
        let cnt = d.min(n - d);
        p.send(range(0, cnt), g.rank((me + n - d) % n), tag);
        p.recv(range(d, d + cnt), g.rank((me + d) % n), tag);
        p.next();
        d <<= 1;
    }
    for j in 1..n {
        p.copy(range(j, j + 1), blocks[rel(j)]);
    }
    p.next();
}

/// The plan of [`alltoallv`] (a rank whose arguments are bad takes its part with empty
/// messages).
pub(crate) fn alltoallv_plan<T: Pod>(
    set: &super::select::Setting<'_>,
    send: &[T],
    scounts: &[usize],
    sdispls: &[usize],
    recv_len: usize,
    rcounts: &[usize],
    rdispls: &[usize],
) -> Plan {
    let (rank, size) = (set.rank, set.size);
    let es = std::mem::size_of::<T>();
    let checked = check_layout("alltoallv", "send", scounts, sdispls, size, send.len(), false).and_then(|s| {
        let r = check_layout("alltoallv", "receive", rcounts, rdispls, size, recv_len, true)?;
        if s.counts[rank] != r.counts[rank] {
            return Err(Error::InvalidBuffer(format!(
                "alltoallv: this rank ({rank}) sends itself {} elements but expects {}",
                s.counts[rank], r.counts[rank]
            )));
        }
        Ok((s, r))
    });
    let mut p = Plan::new();
    p.tolerant = true;
    let (si, ro) = (inp(0, std::mem::size_of_val(send)), out(0, recv_len * es));
    let (sends, recvs): (Vec<Span>, Vec<Span>) = match &checked {
        Ok((s, r)) => ((0..size).map(|j| s.span(si, j, es)).collect(), (0..size).map(|j| r.span(ro, j, es)).collect()),
        Err(_) => (vec![Span::empty(); size], vec![Span::empty(); size]),
    };
    plan_alltoallv(&mut p, Grp::all(rank, size), super::select::alltoallv(set), &sends, &recvs, vtags::ALLTOALLV);
    if let Err(e) = checked {
        p.fail_locally(e);
    }
    p.finish();
    p
}

/// Alltoallv on `g` by `algo`: `sends[j]` goes to member `j`, member `i`'s block lands in
/// `recvs[i]`.
pub(crate) fn plan_alltoallv(p: &mut Plan, g: Grp<'_>, algo: super::select::Alltoallv, sends: &[Span], recvs: &[Span], tag: u32) {
    let (me, n) = (g.me, g.n);
    p.next();
    p.copy(sends[me], recvs[me]);
    match algo {
        super::select::Alltoallv::Linear => {
            for i in 1..n {
                let from = (me + n - i) % n;
                p.recv(recvs[from], g.rank(from), tag);
            }
            for i in 1..n {
                let to = (me + i) % n;
                p.send(sends[to], g.rank(to), tag);
            }
            p.next();
        }
        _ => {
            let pof2 = n.is_power_of_two();
            for i in 1..n {
                let (to, from) = if pof2 { (me ^ i, me ^ i) } else { ((me + i) % n, (me + n - i) % n) };
                p.send(sends[to], g.rank(to), tag);
                p.recv(recvs[from], g.rank(from), tag);
                p.next();
            }
        }
    }
    p.next();
}

/// Sends `send[sdispls[j]..][..scounts[j]]` to rank `j` and receives from rank `i` into
/// `recv[rdispls[i]..][..rcounts[i]]`; `scounts[j]` on rank `i` must equal `rcounts[i]` on rank
/// `j`.
///
/// # Errors
/// [`Error::InvalidBuffer`] when a block does not fit its buffer, receive blocks overlap, this
/// rank's send and receive counts for itself differ, or a block arrives with another length than
/// its count (the rank still completes every round with empty messages). Transport errors,
/// [`Error::PeerGone`].
#[allow(clippy::too_many_arguments)]
pub(crate) fn alltoallv<T: Pod, C: CollP2p + ?Sized>(
    c: &C,
    send: &[T],
    scounts: &[usize],
    sdispls: &[usize],
    recv: &mut [T],
    rcounts: &[usize],
    rdispls: &[usize],
) -> Result<()> {
    let plan = alltoallv_plan(&c.setting(), send, scounts, sdispls, recv.len(), rcounts, rdispls);
    c.run(plan, Some(bytes(send)), Some(bytes_mut(recv)))
}

/// The checks of a reduce-scatter made before any communication: `counts` has one entry per
/// rank and sums to `send_len`; returns each block's first element.
///
/// # Errors
/// [`Error::InvalidBuffer`].
pub(crate) fn check_counts(what: &str, counts: &[usize], size: usize, send_len: usize) -> Result<Vec<usize>> {
    if counts.len() != size {
        return Err(Error::InvalidBuffer(format!("{what}: {} counts given, the communicator has {size} ranks", counts.len())));
    }
    let mut displs = Vec::with_capacity(size);
    let mut total = 0usize;
    for &n in counts {
        displs.push(total);
        total = total.checked_add(n).ok_or_else(|| Error::InvalidBuffer(format!("{what}: the counts overflow usize")))?;
    }
    if total != send_len {
        return Err(Error::InvalidBuffer(format!("{what}: the counts sum to {total} elements, the send buffer has {send_len}")));
    }
    Ok(displs)
}

/// Reduce-scatter as a reduce of the send buffer to member 0 (in group order, so for any
/// operator; Rabenseifner's with `rab`, else the binomial tree) and a linear scatter of the
/// blocks (`blocks[i]`: member `i`'s share, as bytes of the send buffer; `mine`: where this
/// member's lands).
pub(crate) fn plan_reduce_then_scatter(p: &mut Plan, g: Grp<'_>, rab: bool, v: Vector, blocks: &[Span], mine: Span, tag: u32) {
    let full = (g.me == 0).then(|| p.temp(v.bytes()));
    let send = inp(0, v.bytes());
    if rab {
        super::reduce::plan_reduce_rabenseifner(p, g, send, full, v, 0, tag + 4);
    } else {
        super::reduce::plan_reduce_binomial(p, g, send, full, 0, true, tag);
    }
    p.next();
    match full {
        Some(f) => {
            for (i, b) in blocks.iter().enumerate().take(g.n).skip(1) {
                p.send(Span::new(f.buf, b.off, b.len), g.rank(i), tag + 2);
            }
            let b = blocks[0];
            p.copy(Span::new(f.buf, b.off, b.len), mine);
        }
        None => p.recv(mine, g.rank(0), tag + 2),
    }
    p.next();
}

/// Inclusive prefix reduction: rank `r` gets `send_0 op send_1 op ... op send_r` (element-wise,
/// lower ranks on the left).
///
/// # Errors
/// [`Error::InvalidOp`] before any communication; [`Error::InvalidBuffer`] when
/// `recv.len() != send.len()` (the rank takes part with scratch space first), or when ranks
/// pass different lengths. Transport errors, [`Error::PeerGone`].
pub(crate) fn scan<T: Reducible, C: CollP2p + ?Sized>(c: &C, send: &[T], recv: &mut [T], op: Op) -> Result<()> {
    prefix(c, send, recv, op, true)
}

/// Exclusive prefix reduction: rank `r > 0` gets `send_0 op ... op send_{r-1}`; rank 0's `recv`
/// is left unchanged (MPI leaves it undefined).
///
/// # Errors
/// As [`scan`].
pub(crate) fn exscan<T: Reducible, C: CollP2p + ?Sized>(c: &C, send: &[T], recv: &mut [T], op: Op) -> Result<()> {
    prefix(c, send, recv, op, false)
}

fn prefix<T: Reducible, C: CollP2p + ?Sized>(c: &C, send: &[T], recv: &mut [T], op: Op, inclusive: bool) -> Result<()> {
    check_op::<T>(op)?;
    let what = if inclusive { "scan" } else { "exscan" };
    let bad = (recv.len() != send.len())
        .then(|| Error::InvalidBuffer(format!("{what}: receive buffer has {} elements, send buffer {}", recv.len(), send.len())));
    let mut scratch = Vec::new();
    let out: &mut [T] = if bad.is_some() {
        scratch.resize(send.len(), T::zeroed());
        &mut scratch
    } else {
        recv
    };
    let plan = prefix_plan(c.rank(), c.size(), builtin::<T>(op), std::mem::size_of_val(send), inclusive);
    let r = c.run(plan, Some(bytes(send)), Some(bytes_mut(out)));
    first_err(bad, r)
}

/// The plan of a prefix reduction of `len` bytes.
pub(crate) fn prefix_plan(rank: usize, size: usize, f: ReduceFn, len: usize, inclusive: bool) -> Plan {
    let mut p = Plan::reducing(f);
    if size > 1 && len > 0 {
        plan_prefix_doubling(&mut p, Grp::all(rank, size), inp(0, len), out(0, len), inclusive, vtags::SCAN);
    } else if inclusive {
        p.copy(inp(0, len), out(0, len));
    }
    p.finish();
    p
}

/// Recursive-doubling prefix reduction (MPICH's scan). At step `m`, `partial` holds the
/// reduction over this member's aligned group of `m` members; partners `me ^ m` swap partials,
/// the upper one folds the lower group into its result (on the left), both fold it into
/// `partial` in member order.
pub(crate) fn plan_prefix_doubling(p: &mut Plan, g: Grp<'_>, send: Span, o: Span, inclusive: bool, tag: u32) {
    let (me, n) = (g.me, g.n);
    let partial = p.temp(send.len);
    let tmp = p.temp(send.len);
    p.next();
    p.copy(send, partial);
    if inclusive {
        p.copy(send, o);
    }
    let mut have = inclusive;
    let mut mask = 1;
    while mask < n {
        let dst = me ^ mask;
        if dst < n {
            p.send(partial, g.rank(dst), tag);
            p.recv(tmp, g.rank(dst), tag);
            p.next();
            if dst < me {
                p.combine(tmp, partial, true);
                if have {
                    p.combine(tmp, o, true);
                } else {
                    p.copy(tmp, o);
                    have = true;
                }
            } else {
                p.combine(tmp, partial, false);
            }
        }
        mask <<= 1;
    }
    p.next();
}

#[cfg(test)]
mod tests;
