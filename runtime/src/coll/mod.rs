//! Collective algorithms, generic over a small point-to-point trait ([`CollP2p`]).
//!
//! Every collective is written against [`CollP2p`]: blocking send, receive and a deadlock-free
//! send-receive on the communicator's private collective context. The runtime implements it on
//! top of its engine; the tests implement it with threads and channels, including a mode where a
//! send blocks until the receiver has matched it (rendezvous), so an algorithm that could
//! deadlock on a real transport fails the tests.
//!
//! # Algorithms (chosen by message size and rank count, after MPICH and Open MPI coll/tuned)
//!
//! - [`barrier`]: dissemination (Hensgen/Finkel/Manber), `ceil(log2 p)` rounds of empty messages.
//! - [`bcast`]: binomial tree below [`BCAST_LONG_BYTES`] or with fewer than
//!   [`BCAST_MIN_PROCS_LONG`] ranks; otherwise binomial scatter + ring allgather (van de Geijn).
//! - [`reduce`]: binomial tree below [`REDUCE_LONG_BYTES`]; otherwise Rabenseifner:
//!   reduce-scatter by recursive halving, then each block straight to the root.
//! - [`allreduce`]: recursive doubling below [`ALLREDUCE_LONG_BYTES`]; otherwise Rabenseifner
//!   (reduce-scatter by recursive halving + allgather by recursive doubling). Rank counts that
//!   are not a power of two fold the first `2 * (p - 2^k)` ranks pairwise first and unfold at
//!   the end (MPICH's scheme), or, from [`ALLREDUCE_RING_BYTES`], use the ring
//!   (reduce-scatter + allgather around the ring, no fold).
//! - [`gather`] / [`scatter`]: binomial tree for blocks below [`GATHER_LINEAR_BYTES`], linear
//!   (root talks to every rank, no intermediate copies) above.
//! - [`allgather`]: recursive doubling for power-of-two rank counts and totals below
//!   [`ALLGATHER_LONG_BYTES`]; Bruck for other counts below [`ALLGATHER_BRUCK_BYTES`]; ring above.
//! - [`alltoall`]: pairwise exchange, `p - 1` rounds (XOR partners for powers of two).
//!
//! # Reproducible reductions
//!
//! Float operators are not associative, so every reduction here combines partial results in a
//! fixed order that depends only on `(p, root, count)`: the partial result of a lower (relative)
//! group of ranks is always the left operand. [`allreduce`] gives bitwise identical results on
//! every rank: in recursive doubling both partners compute `lower op upper` on identical
//! operands, and in Rabenseifner and the ring each block is reduced on exactly one rank (or
//! along one chain) and then copied.
//! [`reduce`] results are reproducible from run to run but may differ in the last bits between
//! roots or between [`reduce`] and [`allreduce`].
//!
//! # Tags
//!
//! Each algorithm uses constant tags from [`tags`]. That is enough because the collective
//! context is private to one communicator (no user message can match), every rank issues the
//! collectives of a communicator in the same order, and point-to-point is non-overtaking per
//! (source, tag): the k-th receive a rank posts for a given (source, tag) matches the k-th send
//! that source made with that tag, and within one call every algorithm pairs its sends and
//! receives one to one. Distinct tags per algorithm and phase only make traces readable and turn
//! a mismatched call sequence into an error or a visible hang instead of silent data mixing.
//!
//! # Errors and bad input
//!
//! Arguments are checked before any communication: a root outside the communicator is
//! [`Error::InvalidRoot`], buffer lengths that do not fit the operation are
//! [`Error::InvalidBuffer`], an operator not defined for the type is [`Error::InvalidOp`].
//! Lengths that differ between ranks (erroneous in MPI too) are detected when a message of the
//! wrong size arrives ([`Error::Truncated`] or [`Error::InvalidBuffer`] on that rank); ranks
//! that still wait for it are released when the failing rank exits ([`Error::PeerGone`]).

use std::ops::Range;

use crate::error::{Error, Result};

mod allgather;
mod alltoall;
mod barrier;
mod bcast;
mod gather;
mod reduce;
mod scratch;
pub(crate) mod shm;
pub mod vcoll;

#[cfg(test)]
mod harness;
#[cfg(test)]
mod tests;

pub use allgather::allgather;
pub use alltoall::alltoall;
pub use barrier::barrier;
pub use bcast::bcast;
pub use gather::{gather, scatter};
pub use reduce::{allreduce, reduce};
pub use vcoll::{allgatherv, alltoallv, exscan, gatherv, reduce_scatter, reduce_scatter_block, scan, scatterv};

/// Point-to-point on a communicator's private collective context (never matches user traffic).
///
/// Ranks are ranks of the communicator. Implementations must be non-overtaking per
/// (source, tag), and [`CollP2p::sendrecv`] must not deadlock when two ranks exchange with each
/// other (or around a ring) at the same time, whatever the message sizes.
pub trait CollP2p {
    /// This process's rank in the communicator.
    fn rank(&self) -> usize;
    /// Number of ranks in the communicator.
    fn size(&self) -> usize;
    /// Blocking send of `buf` to `dest` (may wait until the receiver matches it).
    ///
    /// # Errors
    /// Transport errors, [`Error::PeerGone`].
    fn send(&self, buf: &[u8], dest: usize, tag: u32) -> Result<()>;
    /// Blocking receive from `src` with `tag`; returns the number of bytes received.
    ///
    /// # Errors
    /// [`Error::Truncated`] when the message is longer than `buf` (the message is consumed);
    /// transport errors, [`Error::PeerGone`].
    fn recv(&self, buf: &mut [u8], src: usize, tag: u32) -> Result<usize>;
    /// Sends `sbuf` to `dest` and receives from `src` into `rbuf` concurrently (deadlock-free);
    /// returns the number of bytes received.
    ///
    /// # Errors
    /// As [`CollP2p::send`] and [`CollP2p::recv`].
    fn sendrecv(&self, sbuf: &[u8], dest: usize, stag: u32, rbuf: &mut [u8], src: usize, rtag: u32) -> Result<usize>;
}

/// The tags of the collective context, one (or a few, by phase) per algorithm.
pub mod tags {
    /// Dissemination barrier.
    pub const BARRIER: u32 = 1;
    /// Binomial broadcast.
    pub const BCAST: u32 = 2;
    /// Scatter phase of the long broadcast.
    pub const BCAST_SCATTER: u32 = 3;
    /// Ring-allgather phase of the long broadcast.
    pub const BCAST_RING: u32 = 4;
    /// Binomial reduce.
    pub const REDUCE: u32 = 5;
    /// Non-power-of-two fold and unfold of reduce/allreduce.
    pub const REDUCE_FOLD: u32 = 6;
    /// Recursive halving (reduce-scatter) of Rabenseifner reduce/allreduce.
    pub const REDUCE_SCATTER: u32 = 7;
    /// Block gather to the root of Rabenseifner reduce.
    pub const REDUCE_GATHER: u32 = 8;
    /// Recursive-doubling allreduce.
    pub const ALLREDUCE: u32 = 9;
    /// Allgather phase of Rabenseifner allreduce.
    pub const ALLREDUCE_ALLGATHER: u32 = 10;
    /// Ring allreduce (both phases).
    pub const ALLREDUCE_RING: u32 = 15;
    /// Gather.
    pub const GATHER: u32 = 11;
    /// Scatter.
    pub const SCATTER: u32 = 12;
    /// Allgather.
    pub const ALLGATHER: u32 = 13;
    /// Alltoall.
    pub const ALLTOALL: u32 = 14;
}

/// Broadcasts of at least this many bytes use scatter + ring allgather (MPICH's
/// `BCAST_SHORT_MSG_SIZE`, 12 KiB), when the communicator has [`BCAST_MIN_PROCS_LONG`] ranks.
pub const BCAST_LONG_BYTES: usize = 12 * 1024;
/// Fewer ranks than this always broadcast with the binomial tree (MPICH: 8).
pub const BCAST_MIN_PROCS_LONG: usize = 8;
/// Reduces above this many bytes (and with at least one element per power-of-two rank) use
/// Rabenseifner's reduce-scatter + gather (MPICH: 2 KiB).
pub const REDUCE_LONG_BYTES: usize = 2048;
/// Allreduces above this many bytes (and with at least one element per power-of-two rank) use
/// Rabenseifner's reduce-scatter + allgather (MPICH: 2 KiB).
pub const ALLREDUCE_LONG_BYTES: usize = 2048;
/// Allreduces of at least this many bytes on a rank count that is not a power of two use the
/// ring (Open MPI coll/tuned uses its ring from ~10 KB; we keep Rabenseifner longer because its
/// latency grows with `log p`, not `p`).
pub const ALLREDUCE_RING_BYTES: usize = 64 * 1024;
/// Gather/scatter blocks of at least this many bytes go linearly to/from the root (Open MPI
/// coll/tuned switches from binomial to linear at a few KiB).
pub const GATHER_LINEAR_BYTES: usize = 4096;
/// Allgathers whose total (all blocks) reaches this many bytes use the ring (MPICH: 512 KiB).
pub const ALLGATHER_LONG_BYTES: usize = 512 * 1024;
/// Non-power-of-two allgathers below this total use Bruck's algorithm (MPICH: 80 KiB).
pub const ALLGATHER_BRUCK_BYTES: usize = 80 * 1024;

// ---- shared helpers ------------------------------------------------------------------------

/// Checks `root < size`.
pub(crate) fn check_root(root: usize, size: usize) -> Result<()> {
    if root < size {
        Ok(())
    } else {
        Err(Error::InvalidRoot { root, size })
    }
}

/// `a * b`, or [`Error::InvalidBuffer`] on overflow.
fn mul_len(a: usize, b: usize, what: &str) -> Result<usize> {
    a.checked_mul(b).ok_or_else(|| Error::InvalidBuffer(format!("{what}: {a} * {b} overflows")))
}

/// Receives exactly `buf.len()` bytes; a shorter message is [`Error::InvalidBuffer`].
fn recv_exact<C: CollP2p + ?Sized>(c: &C, buf: &mut [u8], src: usize, tag: u32) -> Result<()> {
    let n = c.recv(buf, src, tag)?;
    check_len(n, buf.len(), src)
}

/// [`CollP2p::sendrecv`] that requires exactly `rbuf.len()` bytes back.
fn sendrecv_exact<C: CollP2p + ?Sized>(c: &C, sbuf: &[u8], dest: usize, rbuf: &mut [u8], src: usize, tag: u32) -> Result<()> {
    let n = c.sendrecv(sbuf, dest, tag, rbuf, src, tag)?;
    check_len(n, rbuf.len(), src)
}

fn check_len(got: usize, want: usize, src: usize) -> Result<()> {
    if got == want {
        Ok(())
    } else {
        Err(short_message(got, want, src))
    }
}

#[cold]
fn short_message(got: usize, want: usize, src: usize) -> Error {
    Error::InvalidBuffer(format!(
        "collective: {got} bytes from rank {src} where {want} were expected \
         (ranks passed different buffer lengths?)"
    ))
}

/// Splits `buf` into a shared part `send` and a mutable part `recv` (disjoint ranges), for an
/// exchange that sends one block of a buffer and receives another block of the same buffer.
fn split_pair<T>(buf: &mut [T], send: Range<usize>, recv: Range<usize>) -> Result<(&[T], &mut [T])> {
    if send.end <= recv.start && recv.end <= buf.len() {
        let (lo, hi) = buf.split_at_mut(recv.start);
        Ok((&lo[send], &mut hi[..recv.end - recv.start]))
    } else if recv.end <= send.start && send.end <= buf.len() {
        let (lo, hi) = buf.split_at_mut(send.start);
        Ok((&hi[..send.end - send.start], &mut lo[recv]))
    } else if send.is_empty() && recv.end <= buf.len() {
        Ok((&[], &mut buf[recv]))
    } else if recv.is_empty() && send.end <= buf.len() {
        Ok((&buf[send], &mut []))
    } else {
        Err(internal(format!("overlapping exchange ranges {send:?} and {recv:?}")))
    }
}

#[cold]
fn internal(msg: String) -> Error {
    Error::State(format!("collective internal error: {msg}"))
}

/// Largest power of two `<= n` (`n >= 1`).
fn pof2_floor(n: usize) -> usize {
    if n == 0 {
        0
    } else {
        1 << (usize::BITS - 1 - n.leading_zeros())
    }
}

/// Relative rank of `rank` in a tree rooted at `root`.
fn rel(rank: usize, root: usize, size: usize) -> usize {
    (rank + size - root) % size
}

/// Absolute rank of relative rank `vr` in a tree rooted at `root`.
fn abs(vr: usize, root: usize, size: usize) -> usize {
    (vr + root) % size
}
