//! Variable-count collectives ([`gatherv`], [`scatterv`], [`allgatherv`], [`alltoallv`]),
//! reduce-scatter ([`reduce_scatter`], [`reduce_scatter_block`]) and prefix reductions
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
//! - [`allgatherv`] / [`alltoallv`]: a rank with bad arguments, or one that received a block of
//!   the wrong length, goes on with empty messages for the remaining rounds, so every rank
//!   finishes its rounds (those fed an empty block report it);
//! - [`reduce_scatter`], [`scan`], [`exscan`]: a receive buffer of the wrong length is replaced by
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
//! - [`allgatherv`]: ring, `p - 1` steps, each block forwarded once by every rank.
//! - [`alltoallv`]: pairwise exchange as [`super::alltoall`].
//! - [`reduce_scatter`] / [`reduce_scatter_block`]: [`super::reduce`] to rank 0 (so the operand
//!   order is the one `reduce` fixes, lower ranks on the left), then a scatter of the blocks.
//! - [`scan`] / [`exscan`]: recursive doubling (`ceil(log2 p)` exchanges of the whole vector); a
//!   rank's result is combined strictly in rank order, lower ranks on the left.

use bytemuck::Pod;

use super::{check_root, recv_exact, sendrecv_exact, split_pair, CollP2p};
use crate::error::{Error, Result};
use crate::op::{check_op, Op, Reducible};

/// Tags of the collectives of this module (kept apart from [`super::tags`]).
pub mod vtags {
    /// Gatherv.
    pub const GATHERV: u32 = 32;
    /// Scatterv.
    pub const SCATTERV: u32 = 33;
    /// Allgatherv ring.
    pub const ALLGATHERV: u32 = 34;
    /// Alltoallv.
    pub const ALLTOALLV: u32 = 35;
    /// Scan and exscan.
    pub const SCAN: u32 = 36;
}

fn bytes<T: Pod>(s: &[T]) -> &[u8] {
    bytemuck::cast_slice(s)
}

fn bytes_mut<T: Pod>(s: &mut [T]) -> &mut [u8] {
    bytemuck::cast_slice_mut(s)
}

/// Element ranges of a checked layout: block `r` is `displs[r]..displs[r] + counts[r]`.
pub(crate) struct Layout<'a> {
    counts: &'a [usize],
    displs: &'a [usize],
}

impl Layout<'_> {
    fn block(&self, r: usize) -> std::ops::Range<usize> {
        self.displs[r]..self.displs[r] + self.counts[r]
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
fn check_own(what: &str, rank: usize, count: usize, len: usize, buf: &str) -> Result<()> {
    if count == len {
        Ok(())
    } else {
        Err(Error::InvalidBuffer(format!("{what}: the count for this rank ({rank}) is {count} elements but its {buf} buffer has {len}")))
    }
}

/// Keeps the first of two errors, except that a departed peer wins (so the call's abort reaches
/// the other members).
fn first_err(first: Option<Error>, r: Result<()>) -> Result<()> {
    match (first, r) {
        (_, Err(e @ Error::PeerGone { .. })) => Err(e),
        (Some(e), _) => Err(e),
        (None, r) => r,
    }
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
pub fn gatherv<T: Pod, C: CollP2p + ?Sized>(
    c: &C,
    send: &[T],
    recv: Option<&mut [T]>,
    counts: &[usize],
    displs: &[usize],
    root: usize,
) -> Result<()> {
    let (rank, size) = (c.rank(), c.size());
    check_root(root, size)?;
    if rank != root {
        return c.send(bytes(send), root, vtags::GATHERV);
    }
    let checked = match recv {
        None => Err(Error::InvalidBuffer("gatherv: the root must pass a receive buffer".into())),
        Some(out) => check_layout("gatherv", "receive", counts, displs, size, out.len(), true)
            .and_then(|l| check_own("gatherv", rank, l.counts[rank], send.len(), "send").map(|()| (l, out))),
    };
    match checked {
        Ok((l, out)) => {
            // A block of the wrong length is reported after the other blocks are taken.
            let mut err = None;
            for r in 0..size {
                if r == rank {
                    out[l.block(r)].copy_from_slice(send);
                } else {
                    match recv_exact(c, bytes_mut(&mut out[l.block(r)]), r, vtags::GATHERV) {
                        Ok(()) => {}
                        Err(e @ Error::PeerGone { .. }) => return Err(e),
                        Err(e) => {
                            err.get_or_insert(e);
                        }
                    }
                }
            }
            first_err(err, Ok(()))
        }
        Err(e) => {
            // Take (and drop) every block so that no sender waits for this root.
            for r in (0..size).filter(|&r| r != rank) {
                if let Err(g @ Error::PeerGone { .. }) = c.recv(&mut [], r, vtags::GATHERV) {
                    return Err(g);
                }
            }
            Err(e)
        }
    }
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
pub fn scatterv<T: Pod, C: CollP2p + ?Sized>(
    c: &C,
    send: Option<&[T]>,
    counts: &[usize],
    displs: &[usize],
    recv: &mut [T],
    root: usize,
) -> Result<()> {
    let (rank, size) = (c.rank(), c.size());
    check_root(root, size)?;
    if rank != root {
        return recv_exact(c, bytes_mut(recv), root, vtags::SCATTERV);
    }
    let checked = match send {
        None => Err(Error::InvalidBuffer("scatterv: the root must pass a send buffer".into())),
        Some(all) => check_layout("scatterv", "send", counts, displs, size, all.len(), false)
            .and_then(|l| check_own("scatterv", rank, l.counts[rank], recv.len(), "receive").map(|()| (l, all))),
    };
    match checked {
        Ok((l, all)) => {
            for r in 0..size {
                if r == rank {
                    recv.copy_from_slice(&all[l.block(r)]);
                } else {
                    c.send(bytes(&all[l.block(r)]), r, vtags::SCATTERV)?;
                }
            }
            Ok(())
        }
        Err(e) => {
            for r in (0..size).filter(|&r| r != rank) {
                if let Err(g @ Error::PeerGone { .. }) = c.send(&[], r, vtags::SCATTERV) {
                    return Err(g);
                }
            }
            Err(e)
        }
    }
}

/// Collects `send` of every rank into `recv` on every rank: rank `r`'s elements land at
/// `recv[displs[r]..displs[r] + counts[r]]`; `counts[r]` must be rank `r`'s `send.len()`. Every
/// rank passes the same `counts` (the displacements may differ).
///
/// # Errors
/// [`Error::InvalidBuffer`] when a block does not fit `recv`, receive blocks overlap, this rank's
/// count is not `send.len()`, or a block arrives with another length than its count (the rank
/// still completes the ring with empty messages). Transport errors, [`Error::PeerGone`].
pub fn allgatherv<T: Pod, C: CollP2p + ?Sized>(c: &C, send: &[T], recv: &mut [T], counts: &[usize], displs: &[usize]) -> Result<()> {
    let (rank, size) = (c.rank(), c.size());
    let mut err = None;
    let layout = match check_layout("allgatherv", "receive", counts, displs, size, recv.len(), true)
        .and_then(|l| check_own("allgatherv", rank, l.counts[rank], send.len(), "send").map(|()| l))
    {
        Ok(l) => {
            recv[l.block(rank)].copy_from_slice(send);
            Some(l)
        }
        Err(e) => {
            err = Some(e);
            None
        }
    };
    let right = (rank + 1) % size;
    let left = (rank + size - 1) % size;
    for k in 0..size.saturating_sub(1) {
        let step = match (&layout, &err) {
            (Some(l), None) => {
                let s = l.block((rank + size - k) % size);
                let r = l.block((rank + 2 * size - k - 1) % size);
                split_pair(recv, s, r).and_then(|(sb, rb)| sendrecv_exact(c, bytes(sb), right, bytes_mut(rb), left, vtags::ALLGATHERV))
            }
            _ => c.sendrecv(&[], right, vtags::ALLGATHERV, &mut [], left, vtags::ALLGATHERV).map(|_| ()),
        };
        match step {
            Ok(()) => {}
            Err(e @ Error::PeerGone { .. }) => return Err(e),
            Err(e) => {
                err.get_or_insert(e);
            }
        }
    }
    first_err(err, Ok(()))
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
pub fn alltoallv<T: Pod, C: CollP2p + ?Sized>(
    c: &C,
    send: &[T],
    scounts: &[usize],
    sdispls: &[usize],
    recv: &mut [T],
    rcounts: &[usize],
    rdispls: &[usize],
) -> Result<()> {
    let (rank, size) = (c.rank(), c.size());
    let mut err = None;
    let checked = check_layout("alltoallv", "send", scounts, sdispls, size, send.len(), false).and_then(|s| {
        let r = check_layout("alltoallv", "receive", rcounts, rdispls, size, recv.len(), true)?;
        if s.counts[rank] != r.counts[rank] {
            return Err(Error::InvalidBuffer(format!(
                "alltoallv: this rank ({rank}) sends itself {} elements but expects {}",
                s.counts[rank], r.counts[rank]
            )));
        }
        Ok((s, r))
    });
    let layouts = match checked {
        Ok((s, r)) => {
            recv[r.block(rank)].copy_from_slice(&send[s.block(rank)]);
            Some((s, r))
        }
        Err(e) => {
            err = Some(e);
            None
        }
    };
    let pof2 = size.is_power_of_two();
    for i in 1..size {
        let (to, from) = if pof2 { (rank ^ i, rank ^ i) } else { ((rank + i) % size, (rank + size - i) % size) };
        let step = match (&layouts, &err) {
            (Some((s, r)), None) => {
                sendrecv_exact(c, bytes(&send[s.block(to)]), to, bytes_mut(&mut recv[r.block(from)]), from, vtags::ALLTOALLV)
            }
            _ => c.sendrecv(&[], to, vtags::ALLTOALLV, &mut [], from, vtags::ALLTOALLV).map(|_| ()),
        };
        match step {
            Ok(()) => {}
            Err(e @ Error::PeerGone { .. }) => return Err(e),
            Err(e) => {
                err.get_or_insert(e);
            }
        }
    }
    first_err(err, Ok(()))
}

/// Combines `send` of every rank element-wise with `op` and leaves block `r` of the result
/// (`counts[r]` elements, blocks in rank order) in rank `r`'s `recv`. `send.len()` is the sum of
/// `counts` on every rank.
///
/// # Errors
/// Before any communication: [`Error::InvalidOp`]; [`Error::InvalidBuffer`] when `counts` has
/// not one entry per rank or does not sum to `send.len()`. [`Error::InvalidBuffer`] when
/// `recv.len() != counts[rank]` (the rank takes part with scratch space first). Transport
/// errors, mismatched lengths between ranks, [`Error::PeerGone`].
pub fn reduce_scatter<T: Reducible, C: CollP2p + ?Sized>(c: &C, send: &[T], recv: &mut [T], counts: &[usize], op: Op) -> Result<()> {
    let (rank, size) = (c.rank(), c.size());
    check_op::<T>(op)?;
    if counts.len() != size {
        return Err(Error::InvalidBuffer(format!("reduce_scatter: {} counts given, the communicator has {size} ranks", counts.len())));
    }
    let mut displs = Vec::with_capacity(size);
    let mut total = 0usize;
    for &n in counts {
        displs.push(total);
        total = total.checked_add(n).ok_or_else(|| Error::InvalidBuffer("reduce_scatter: the counts overflow usize".into()))?;
    }
    if total != send.len() {
        return Err(Error::InvalidBuffer(format!(
            "reduce_scatter: the counts sum to {total} elements, the send buffer has {}",
            send.len()
        )));
    }
    let bad = check_own("reduce_scatter", rank, counts[rank], recv.len(), "receive").err();
    let mut scratch = Vec::new();
    let out: &mut [T] = if bad.is_some() {
        scratch.resize(counts[rank], T::zeroed());
        &mut scratch
    } else {
        recv
    };
    let r = reduce_then_scatter(c, send, out, counts, &displs, op);
    first_err(bad, r)
}

fn reduce_then_scatter<T: Reducible, C: CollP2p + ?Sized>(
    c: &C,
    send: &[T],
    out: &mut [T],
    counts: &[usize],
    displs: &[usize],
    op: Op,
) -> Result<()> {
    if c.rank() == 0 {
        let mut full = vec![T::zeroed(); send.len()];
        super::reduce(c, send, Some(&mut full), op, 0)?;
        scatterv(c, Some(&full), counts, displs, out, 0)
    } else {
        super::reduce(c, send, None, op, 0)?;
        scatterv(c, None, counts, displs, out, 0)
    }
}

/// [`reduce_scatter`] with equal blocks: `send.len() == size * recv.len()` on every rank, and
/// rank `r` gets elements `r * recv.len()..(r + 1) * recv.len()` of the reduction.
///
/// # Errors
/// Before any communication: [`Error::InvalidOp`], [`Error::InvalidBuffer`] when the lengths do
/// not fit. Transport errors, mismatched lengths between ranks, [`Error::PeerGone`].
pub fn reduce_scatter_block<T: Reducible, C: CollP2p + ?Sized>(c: &C, send: &[T], recv: &mut [T], op: Op) -> Result<()> {
    let size = c.size();
    check_op::<T>(op)?;
    if Some(send.len()) != recv.len().checked_mul(size) {
        return Err(Error::InvalidBuffer(format!(
            "reduce_scatter_block: send buffer has {} elements, {size} ranks * {} = receive blocks needed",
            send.len(),
            recv.len()
        )));
    }
    let counts = vec![recv.len(); size];
    let displs: Vec<usize> = (0..size).map(|r| r * recv.len()).collect();
    reduce_then_scatter(c, send, recv, &counts, &displs, op)
}

/// Inclusive prefix reduction: rank `r` gets `send_0 op send_1 op ... op send_r` (element-wise,
/// lower ranks on the left).
///
/// # Errors
/// [`Error::InvalidOp`] before any communication; [`Error::InvalidBuffer`] when
/// `recv.len() != send.len()` (the rank takes part with scratch space first), or when ranks
/// pass different lengths. Transport errors, [`Error::PeerGone`].
pub fn scan<T: Reducible, C: CollP2p + ?Sized>(c: &C, send: &[T], recv: &mut [T], op: Op) -> Result<()> {
    prefix(c, send, recv, op, true)
}

/// Exclusive prefix reduction: rank `r > 0` gets `send_0 op ... op send_{r-1}`; rank 0's `recv`
/// is left unchanged (MPI leaves it undefined).
///
/// # Errors
/// As [`scan`].
pub fn exscan<T: Reducible, C: CollP2p + ?Sized>(c: &C, send: &[T], recv: &mut [T], op: Op) -> Result<()> {
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
    let r = prefix_doubling(c, send, out, op, inclusive);
    first_err(bad, r)
}

/// Recursive-doubling prefix reduction (MPICH's scan). At step `m`, `partial` holds the
/// reduction over this rank's aligned group of `m` ranks; partners `rank ^ m` swap partials, the
/// upper one folds the lower group into its result (on the left), both fold it into `partial`
/// in rank order. `out.len() == send.len()`.
fn prefix_doubling<T: Reducible, C: CollP2p + ?Sized>(c: &C, send: &[T], out: &mut [T], op: Op, inclusive: bool) -> Result<()> {
    let (rank, size) = (c.rank(), c.size());
    if inclusive {
        out.copy_from_slice(send);
    }
    if size == 1 || send.is_empty() {
        return Ok(());
    }
    let mut have = inclusive;
    let mut partial = send.to_vec();
    let mut tmp = vec![T::zeroed(); send.len()];
    let mut mask = 1;
    while mask < size {
        let dst = rank ^ mask;
        if dst < size {
            sendrecv_exact(c, bytes(&partial), dst, bytes_mut(&mut tmp), dst, vtags::SCAN)?;
            if dst < rank {
                T::reduce_into_from_left(op, &tmp, &mut partial)?;
                if have {
                    T::reduce_into_from_left(op, &tmp, out)?;
                } else {
                    out.copy_from_slice(&tmp);
                    have = true;
                }
            } else {
                T::reduce_into(op, &mut partial, &tmp)?;
            }
        }
        mask <<= 1;
    }
    Ok(())
}

#[cfg(test)]
mod tests;
