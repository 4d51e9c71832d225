//! Collective algorithms, generic over a small point-to-point trait (`CollP2p`).
//!
//! Every collective is written against `CollP2p`: blocking send, receive and a deadlock-free
//! send-receive on the communicator's private collective context. The runtime implements it on
//! top of its engine; the tests implement it with threads and channels, including a mode where a
//! send blocks until the receiver has matched it (rendezvous), so an algorithm that could
//! deadlock on a real transport fails the tests.
//!
//! Layers, each using only those below it: the algorithms' schedule builders (`allgather.rs`,
//! `reduce.rs`, ..., on `plan.rs`); [`select`], the choice rules and their cut-overs; `hier.rs`,
//! node-aware schedules from those two; `run.rs`, each collective from its arguments to its end
//! (checked, chosen, built, run on a `CollP2p`).
//!
//! # Algorithms (chosen by message size and rank count, after MPICH and Open MPI coll/tuned)
//!
//! - `barrier`: dissemination (Hensgen/Finkel/Manber), `ceil(log2 p)` rounds of empty messages.
//! - `bcast`: binomial tree below [`BCAST_LONG_BYTES`] or with fewer than
//!   [`BCAST_MIN_PROCS_LONG`] ranks; otherwise binomial scatter + ring allgather (van de Geijn).
//! - `reduce`: binomial tree below [`REDUCE_LONG_BYTES`]; otherwise Rabenseifner:
//!   reduce-scatter by recursive halving, then each block straight to the root.
//! - `allreduce`: recursive doubling below [`ALLREDUCE_LONG_BYTES`]; otherwise Rabenseifner
//!   (reduce-scatter by recursive halving + allgather by recursive doubling). Rank counts that
//!   are not a power of two fold the first `2 * (p - 2^k)` ranks pairwise first and unfold at
//!   the end (MPICH's scheme), or, from [`ALLREDUCE_RING_BYTES`], use the ring
//!   (reduce-scatter + allgather around the ring, no fold).
//! - `gather` / `scatter`: binomial tree for blocks below [`GATHER_LINEAR_BYTES`], linear
//!   (root talks to every rank, no intermediate copies) above.
//! - `allgather`: recursive doubling for power-of-two rank counts and totals below
//!   [`ALLGATHER_LONG_BYTES`]; Bruck for other counts below [`ALLGATHER_BRUCK_BYTES`]; ring above.
//! - `alltoall`: pairwise exchange, `p - 1` rounds (XOR partners for powers of two).
//!
//! # Reproducible reductions
//!
//! Float operators are not associative, so every reduction here combines partial results in a
//! fixed order that depends only on `(p, root, count)`: the partial result of a lower (relative)
//! group of ranks is always the left operand. `allreduce` gives bitwise identical results on
//! every rank: in recursive doubling both partners compute `lower op upper` on identical
//! operands, and in Rabenseifner and the ring each block is reduced on exactly one rank (or
//! along one chain) and then copied.
//! `reduce` results are reproducible from run to run but may differ in the last bits between
//! roots or between `reduce` and `allreduce`.
//!
//! # Tags
//!
//! Each algorithm uses constant tags from `tags`. That is enough because the collective
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
//! wrong size arrives ([`Error::Truncated`] or [`Error::InvalidBuffer`] on that rank). A rank
//! whose call fails so, or on its own arguments, tells the call's other members
//! (`Engine::fail_collective`), and those still waiting fail with
//! [`Error::CollectiveFailed`] instead of waiting for its part.

use crate::error::{Error, Result};

pub(crate) mod allgather;
pub(crate) mod alltoall;
mod barrier;
mod bcast;
pub(crate) mod gather;
pub(crate) mod hier;
pub(crate) mod plan;
pub(crate) mod reduce;
pub(crate) mod run;
pub(crate) mod scratch;
pub mod select;
pub(crate) mod shm;
pub(crate) mod topo;
pub(crate) mod vcoll;

#[cfg(test)]
mod harness;
#[cfg(test)]
mod tests;

pub(crate) use reduce::{builtin, typed, Vector};
pub(crate) use vcoll::{alltoallv, exscan, gatherv, scan, scatterv};

use plan::Plan;
use select::Setting;

/// Point-to-point on a communicator's private collective context (never matches user
/// traffic), and the executor of collective schedules there.
///
/// Ranks are ranks of the communicator. Implementations must be non-overtaking per
/// (source, tag), and [`CollP2p::sendrecv`] must not deadlock when two ranks exchange with each
/// other (or around a ring) at the same time, whatever the message sizes.
pub(crate) trait CollP2p {
    /// This process's rank in the communicator.
    fn rank(&self) -> usize;
    /// Number of ranks in the communicator.
    fn size(&self) -> usize;
    /// What the planners need to know of the communicator (its hosts, the overrides).
    fn setting(&self) -> Setting<'_> {
        Setting::flat(self.rank(), self.size())
    }
    /// Runs `plan` to its end on `input` (the user's send buffer) and `output` (the receive
    /// buffer): every round's transfers in flight together, the next round once they all
    /// completed (see [`plan`]).
    ///
    /// # Errors
    /// The plan's first error (see [`plan`]); transport errors, [`Error::PeerGone`].
    fn run(&self, plan: Plan, input: Option<&[u8]>, output: Option<&mut [u8]>) -> Result<()>;
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

/// The tags of the collective context: each algorithm has a base and uses up to four tags
/// from it, one per phase, so that the phases of a node-aware collective never share one.
pub(crate) mod tags {
    /// Dissemination barrier.
    pub(crate) const BARRIER: u32 = 1;
    /// Binomial broadcast.
    pub(crate) const BCAST: u32 = 4;
    /// Scatter (and ring allgather, + 1) of the long broadcast.
    pub(crate) const BCAST_SCATTER: u32 = 8;
    /// Binomial reduce (+ 1: the result on to the root).
    pub(crate) const REDUCE: u32 = 12;
    /// Rabenseifner reduce: fold, halving (+ 1), gather to the root (+ 2).
    pub(crate) const REDUCE_FOLD: u32 = 16;
    /// Recursive-doubling allreduce: fold, steps (+ 1).
    pub(crate) const ALLREDUCE: u32 = 20;
    /// Rabenseifner allreduce: fold, halving (+ 1), allgather (+ 2).
    pub(crate) const ALLREDUCE_RAB: u32 = 24;
    /// Ring allreduce: reduce-scatter, allgather (+ 1).
    pub(crate) const ALLREDUCE_RING: u32 = 28;
    /// Reduce + broadcast allreduce: reduce (+ 1), broadcast (+ 2).
    pub(crate) const REDUCE_BCAST: u32 = 32;
    /// Gather.
    pub(crate) const GATHER: u32 = 36;
    /// Scatter.
    pub(crate) const SCATTER: u32 = 40;
    /// Recursive-doubling allgather.
    pub(crate) const ALLGATHER: u32 = 44;
    /// Bruck allgather.
    pub(crate) const ALLGATHER_BRUCK: u32 = 48;
    /// Ring allgather.
    pub(crate) const ALLGATHER_RING: u32 = 52;
    /// Pairwise alltoall.
    pub(crate) const ALLTOALL: u32 = 56;
    /// Bruck alltoall.
    pub(crate) const ALLTOALL_BRUCK: u32 = 60;
    /// Linear alltoall.
    pub(crate) const ALLTOALL_LINEAR: u32 = 64;
}

pub use select::{
    ALLGATHER_BRUCK_BYTES, ALLGATHER_LONG_BYTES, ALLREDUCE_LONG_BYTES, ALLREDUCE_RING_BYTES, ALLTOALL_NODE_AWARE_BYTES, BCAST_LONG_BYTES,
    BCAST_MIN_PROCS_LONG, GATHER_LINEAR_BYTES, REDUCE_LONG_BYTES,
};

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

/// A message of `got` bytes from `src` where `want` were expected.
#[cold]
pub(crate) fn short_message(got: usize, want: usize, src: usize) -> Error {
    Error::InvalidBuffer(format!(
        "collective: {got} bytes from rank {src} where {want} were expected \
         (ranks passed different buffer lengths?)"
    ))
}

/// What the collectives of a communicator know of the machine and the job: the `TMPI_COLL_*`
/// overrides. Set when the communicator is made (a new one takes its parent's).
#[derive(Debug, Clone, Default)]
pub(crate) struct Machine {
    pub(crate) force: select::Force,
    /// The hosts of the communicator's ranks, set once: for the world in `init`, for a new
    /// communicator when it is made, from the world's map.
    pub(crate) hosts: std::sync::OnceLock<topo::Hosts>,
}

impl Machine {
    /// What a communicator of `size` ranks made from this one's knows: the same overrides,
    /// and its hosts from the world's map (`members`: world rank of each rank, `None`: the
    /// world's ranks themselves).
    pub(crate) fn derive(&self, members: Option<&[usize]>, size: usize) -> Machine {
        let hosts = std::sync::OnceLock::new();
        if let Some(h) = self.hosts.get() {
            let d = match members {
                Some(m) => h.derive(m.iter().copied()),
                None => h.derive(0..size),
            };
            let _ = hosts.set(d);
        }
        Machine { force: self.force, hosts }
    }
}

#[cold]
#[cfg(test)]
pub(crate) fn internal(msg: String) -> Error {
    Error::State(format!("collective internal error: {msg}"))
}
