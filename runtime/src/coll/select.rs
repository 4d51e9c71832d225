//! Which algorithm each collective uses: by message size, rank count and host count, with a
//! `TMPI_COLL_<NAME>` override per collective.
//!
//! The choice functions ([`barrier`], [`bcast`], [`reduce`], [`allreduce`], [`allgather`],
//! [`alltoall`], `alltoallv`, [`reduce_scatter`]) are public so that the cost model in
//! `bench/` (`collmodel`) calls the very functions the runtime calls: the model cannot drift
//! from what the runtime does.
//!
//! The cut-overs are the constants here (re-exported by [`super`]), each with the measurement
//! behind it. The plans that carry out a choice are built in `run.rs`, above this file.

use super::plan::{pof2_floor, Grp};
use super::topo::Topo;
use crate::error::{Error, Result};

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
/// Alltoalls across hosts with blocks of at most this many bytes run node-aware (each head
/// packs its host's blocks into one message per other host, so the network carries `h - 1`
/// messages per host instead of `p - 1` per rank, at the price of two local copies of every
/// block); larger blocks go pairwise, where the copies would cost more than the messages
/// saved. Not measured across real hosts here: `TMPI_COLL_NODE_AWARE=on` forces it.
pub const ALLTOALL_NODE_AWARE_BYTES: usize = 1024;

/// Defines a public algorithm enum with its `TMPI_COLL_*` names.
macro_rules! algos {
    ($(#[$m:meta])* $name:ident { $($(#[$vm:meta])* $v:ident = $s:literal),* $(,)? }) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[non_exhaustive]
        pub enum $name {
            $($(#[$vm])* $v),*
        }

        impl $name {
            /// Every algorithm, in the order of its `TMPI_COLL_*` values.
            pub const ALL: &'static [$name] = &[$($name::$v),*];

            /// The name a `TMPI_COLL_*` knob gives this algorithm.
            pub const fn name(self) -> &'static str {
                match self {
                    $($name::$v => $s),*
                }
            }

            /// The algorithm a `TMPI_COLL_*` value names (`None`: not one of them).
            pub fn from_name(s: &str) -> Option<Self> {
                Self::ALL.iter().copied().find(|a| a.name() == s)
            }
        }
    };
}

algos! {
    /// Barrier algorithms (`TMPI_COLL_BARRIER`).
    Barrier {
        /// Dissemination among all ranks.
        Dissemination = "dissemination",
    }
}

algos! {
    /// Broadcast algorithms (`TMPI_COLL_BCAST`).
    Bcast {
        /// Binomial tree.
        Binomial = "binomial",
        /// Binomial scatter and ring allgather (van de Geijn).
        ScatterAllgather = "scatter_allgather",
    }
}

algos! {
    /// Reduce algorithms (`TMPI_COLL_REDUCE`).
    Reduce {
        /// Binomial tree.
        Binomial = "binomial",
        /// Reduce-scatter by recursive halving, then the blocks to the root.
        Rabenseifner = "rabenseifner",
    }
}

algos! {
    /// Allreduce algorithms (`TMPI_COLL_ALLREDUCE`).
    Allreduce {
        /// Recursive doubling (whole vector each step).
        RecursiveDoubling = "recursive_doubling",
        /// Reduce-scatter by recursive halving and allgather by recursive doubling.
        Rabenseifner = "rabenseifner",
        /// Reduce-scatter and allgather around a ring (commutative operators only).
        Ring = "ring",
        /// Reduce to one rank and broadcast (only that rank applies the operator).
        ReduceBcast = "reduce_bcast",
    }
}

algos! {
    /// Allgather and allgatherv algorithms (`TMPI_COLL_ALLGATHER`, `TMPI_COLL_ALLGATHERV`).
    Allgather {
        /// Recursive doubling (power-of-two rank counts).
        RecursiveDoubling = "recursive_doubling",
        /// Bruck (`ceil(log2 p)` steps for any rank count).
        Bruck = "bruck",
        /// Ring (bandwidth-optimal).
        Ring = "ring",
    }
}

algos! {
    /// Alltoall algorithms (`TMPI_COLL_ALLTOALL`).
    Alltoall {
        /// Pairwise exchange, `p - 1` rounds.
        Pairwise = "pairwise",
        /// Bruck, `ceil(log2 p)` rounds of packed blocks.
        Bruck = "bruck",
        /// Every block at once.
        Linear = "linear",
    }
}

algos! {
    /// Alltoallv algorithms (`TMPI_COLL_ALLTOALLV`).
    Alltoallv {
        /// Pairwise exchange, `p - 1` rounds.
        Pairwise = "pairwise",
        /// Every block at once.
        Linear = "linear",
    }
}

algos! {
    /// Reduce-scatter algorithms (`TMPI_COLL_REDUCE_SCATTER`).
    ReduceScatter {
        /// Reduce to rank 0 and scatter the blocks.
        ReduceScatterv = "reduce_scatterv",
    }
}

/// The `TMPI_COLL_*` overrides: an algorithm forced per collective (`None`: chosen by size,
/// rank count and host count). A forced algorithm that cannot serve a call (recursive
/// doubling on a rank count that is not a power of two, the ring with an operator that is not
/// commutative) leaves that call to the automatic choice. Any value but `auto` also keeps the
/// collective off the shared-memory slots, so that it runs the algorithm named.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Force {
    /// `TMPI_COLL_BARRIER`.
    pub barrier: Option<Barrier>,
    /// `TMPI_COLL_BCAST`.
    pub bcast: Option<Bcast>,
    /// `TMPI_COLL_REDUCE`.
    pub reduce: Option<Reduce>,
    /// `TMPI_COLL_ALLREDUCE`.
    pub allreduce: Option<Allreduce>,
    /// `TMPI_COLL_ALLGATHER`.
    pub allgather: Option<Allgather>,
    /// `TMPI_COLL_ALLGATHERV`.
    pub allgatherv: Option<Allgather>,
    /// `TMPI_COLL_ALLTOALL`.
    pub alltoall: Option<Alltoall>,
    /// `TMPI_COLL_ALLTOALLV`.
    pub alltoallv: Option<Alltoallv>,
    /// `TMPI_COLL_REDUCE_SCATTER`.
    pub reduce_scatter: Option<ReduceScatter>,
    /// `TMPI_COLL_NODE_AWARE`: `Some(true)` runs every collective that has a node-aware form
    /// node-aware whenever the communicator spans hosts, `Some(false)` never.
    pub node_aware: Option<bool>,
}

/// Reads one override: `auto` (or empty, or unset) is `None`.
fn knob<A: Copy>(get: &impl Fn(&str) -> Option<String>, var: &str, all: &[A], name: fn(A) -> &'static str) -> Result<Option<A>> {
    let Some(v) = get(var) else { return Ok(None) };
    let v = v.trim();
    if v.is_empty() || v == "auto" {
        return Ok(None);
    }
    match all.iter().copied().find(|&a| name(a) == v) {
        Some(a) => Ok(Some(a)),
        None => {
            let names: Vec<&str> = std::iter::once("auto").chain(all.iter().map(|&a| name(a))).collect();
            Err(Error::Config { var: var.into(), value: v.into(), expected: names.join(", ") })
        }
    }
}

impl Force {
    /// No override: every collective chooses for itself.
    pub const AUTO: Force = Force {
        barrier: None,
        bcast: None,
        reduce: None,
        allreduce: None,
        allgather: None,
        allgatherv: None,
        alltoall: None,
        alltoallv: None,
        reduce_scatter: None,
        node_aware: None,
    };

    /// Reads the `TMPI_COLL_*` knobs through `get`.
    ///
    /// # Errors
    /// [`Error::Config`] naming the variable and the values it takes.
    pub fn parse(get: &impl Fn(&str) -> Option<String>) -> Result<Force> {
        Ok(Force {
            barrier: knob(get, "TMPI_COLL_BARRIER", Barrier::ALL, Barrier::name)?,
            bcast: knob(get, "TMPI_COLL_BCAST", Bcast::ALL, Bcast::name)?,
            reduce: knob(get, "TMPI_COLL_REDUCE", Reduce::ALL, Reduce::name)?,
            allreduce: knob(get, "TMPI_COLL_ALLREDUCE", Allreduce::ALL, Allreduce::name)?,
            allgather: knob(get, "TMPI_COLL_ALLGATHER", Allgather::ALL, Allgather::name)?,
            allgatherv: knob(get, "TMPI_COLL_ALLGATHERV", Allgather::ALL, Allgather::name)?,
            alltoall: knob(get, "TMPI_COLL_ALLTOALL", Alltoall::ALL, Alltoall::name)?,
            alltoallv: knob(get, "TMPI_COLL_ALLTOALLV", Alltoallv::ALL, Alltoallv::name)?,
            reduce_scatter: knob(get, "TMPI_COLL_REDUCE_SCATTER", ReduceScatter::ALL, ReduceScatter::name)?,
            node_aware: knob(get, "TMPI_COLL_NODE_AWARE", &[true, false], |b| if b { "on" } else { "off" })?,
        })
    }
}

/// What the choice of an algorithm depends on, the same on every rank of a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    /// Ranks of the communicator.
    pub ranks: usize,
    /// Hosts they run on.
    pub hosts: usize,
    /// Bytes of the call: a rank's vector (bcast, reduce, allreduce, reduce-scatter), all
    /// ranks' blocks together (allgather), or one block (alltoall).
    pub bytes: usize,
    /// Elements of a reduction's vector (else 0).
    pub count: usize,
    /// Whether the reduction's operator is commutative (every predefined one is).
    pub commutative: bool,
}

impl Shape {
    /// A call of `bytes` on the ranks and hosts of `t`.
    pub(crate) fn on(t: &Topo, bytes: usize) -> Shape {
        Shape { ranks: t.order().len(), hosts: t.hosts(), bytes, count: bytes, commutative: true }
    }

    /// A call of `bytes` on `ranks` ranks of one host, with a commutative operator.
    pub fn flat(ranks: usize, bytes: usize) -> Shape {
        Shape { ranks, hosts: 1, bytes, count: bytes, commutative: true }
    }
}

/// Whether a call of shape `s` runs node-aware (`coll::hier`): `force` (`TMPI_COLL_NODE_AWARE`)
/// `Some(true)` whenever the ranks span hosts, `Some(false)` never, `None` when they span
/// hosts and some host has more than one of them (with one rank per host the tiers inside the
/// hosts are empty and the plan is the flat one with extra copies).
pub fn node_aware(s: &Shape, force: Option<bool>) -> bool {
    match force {
        Some(on) => on && s.hosts > 1,
        None => s.hosts > 1 && s.hosts < s.ranks,
    }
}

/// Whether an alltoall of blocks of `s.bytes` runs node-aware: as [`node_aware`], and under
/// `auto` only for blocks of at most [`ALLTOALL_NODE_AWARE_BYTES`].
pub fn alltoall_node_aware(s: &Shape, force: Option<bool>) -> bool {
    node_aware(s, force) && (force == Some(true) || s.bytes <= ALLTOALL_NODE_AWARE_BYTES)
}

/// The barrier's algorithm.
pub fn barrier(_s: &Shape, _force: Option<Barrier>) -> Barrier {
    Barrier::Dissemination
}

/// The broadcast's algorithm: the binomial tree below [`BCAST_LONG_BYTES`] or with fewer than
/// [`BCAST_MIN_PROCS_LONG`] ranks, else scatter + ring allgather.
pub fn bcast(s: &Shape, force: Option<Bcast>) -> Bcast {
    if let Some(f) = force {
        return f;
    }
    if s.bytes < BCAST_LONG_BYTES || s.ranks < BCAST_MIN_PROCS_LONG {
        Bcast::Binomial
    } else {
        Bcast::ScatterAllgather
    }
}

/// The reduce's algorithm: Rabenseifner above [`REDUCE_LONG_BYTES`] with at least one element
/// per power-of-two rank, else the binomial tree.
pub fn reduce(s: &Shape, force: Option<Reduce>) -> Reduce {
    let rab_ok = s.count >= pof2_floor(s.ranks);
    match force {
        Some(Reduce::Rabenseifner) if rab_ok => Reduce::Rabenseifner,
        Some(Reduce::Binomial) => Reduce::Binomial,
        _ if s.bytes > REDUCE_LONG_BYTES && rab_ok => Reduce::Rabenseifner,
        _ => Reduce::Binomial,
    }
}

/// The allreduce's algorithm: recursive doubling up to [`ALLREDUCE_LONG_BYTES`], Rabenseifner
/// above (with at least one element per power-of-two rank), the ring from
/// [`ALLREDUCE_RING_BYTES`] on rank counts that are not a power of two; for operators that are
/// not commutative, reduce + broadcast in place of recursive doubling and never the ring.
pub fn allreduce(s: &Shape, force: Option<Allreduce>) -> Allreduce {
    let rab_ok = s.count >= pof2_floor(s.ranks);
    let ring_ok = s.commutative && s.count >= s.ranks;
    match force {
        Some(Allreduce::Ring) if ring_ok => return Allreduce::Ring,
        Some(Allreduce::Rabenseifner) if rab_ok => return Allreduce::Rabenseifner,
        Some(a @ (Allreduce::RecursiveDoubling | Allreduce::ReduceBcast)) => return a,
        _ => {}
    }
    let ring = ring_ok && s.bytes >= ALLREDUCE_RING_BYTES && !s.ranks.is_power_of_two();
    if ring {
        Allreduce::Ring
    } else if s.bytes > ALLREDUCE_LONG_BYTES && rab_ok {
        Allreduce::Rabenseifner
    } else if s.commutative {
        Allreduce::RecursiveDoubling
    } else {
        Allreduce::ReduceBcast
    }
}

/// The allgather's algorithm (`s.bytes`: all blocks together): recursive doubling on
/// power-of-two rank counts below [`ALLGATHER_LONG_BYTES`], Bruck on others below
/// [`ALLGATHER_BRUCK_BYTES`], else the ring.
pub fn allgather(s: &Shape, force: Option<Allgather>) -> Allgather {
    match force {
        Some(Allgather::RecursiveDoubling) if s.ranks.is_power_of_two() => return Allgather::RecursiveDoubling,
        Some(a @ (Allgather::Bruck | Allgather::Ring)) => return a,
        _ => {}
    }
    if s.ranks.is_power_of_two() && s.bytes < ALLGATHER_LONG_BYTES {
        Allgather::RecursiveDoubling
    } else if s.bytes < ALLGATHER_BRUCK_BYTES {
        Allgather::Bruck
    } else {
        Allgather::Ring
    }
}

/// The alltoall's algorithm (`s.bytes`: one block): pairwise exchange.
pub fn alltoall(_s: &Shape, force: Option<Alltoall>) -> Alltoall {
    force.unwrap_or(Alltoall::Pairwise)
}

/// The reduce-scatter's algorithm.
pub fn reduce_scatter(_s: &Shape, _force: Option<ReduceScatter>) -> ReduceScatter {
    ReduceScatter::ReduceScatterv
}

// ---- plans -----------------------------------------------------------------------------------

/// What a planner needs to know of the communicator and the job beyond rank and size.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Setting<'a> {
    pub(crate) rank: usize,
    pub(crate) size: usize,
    /// The `TMPI_COLL_*` overrides.
    pub(crate) force: &'a Force,
    /// The communicator's hosts (`None`: one host, or not known).
    pub(crate) topo: Option<&'a Topo>,
}

impl Setting<'_> {
    /// A communicator on one host, without overrides.
    pub(crate) fn flat(rank: usize, size: usize) -> Setting<'static> {
        Setting { rank, size, force: &Force::AUTO, topo: None }
    }

    pub(crate) fn shape(&self, bytes: usize, count: usize, commutative: bool) -> Shape {
        Shape { ranks: self.size, hosts: self.topo.map_or(1, Topo::hosts), bytes, count, commutative }
    }

    pub(crate) fn all(&self) -> Grp<'static> {
        Grp::all(self.rank, self.size)
    }
}

/// The allgatherv's algorithm for `total` bytes (all blocks; `None` when the counts are not
/// usable, which every rank sees alike).
pub(crate) fn allgatherv(set: &Setting<'_>, total: Option<usize>) -> Allgather {
    match total {
        Some(t) => match set.force.allgatherv {
            Some(Allgather::RecursiveDoubling) if set.size.is_power_of_two() => Allgather::RecursiveDoubling,
            Some(f @ (Allgather::Bruck | Allgather::Ring)) => f,
            _ => {
                let _ = t;
                Allgather::Ring
            }
        },
        None => Allgather::Ring,
    }
}

/// The alltoallv's algorithm.
pub(crate) fn alltoallv(set: &Setting<'_>) -> Alltoallv {
    set.force.alltoallv.unwrap_or(Alltoallv::Pairwise)
}
