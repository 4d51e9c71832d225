//! What every fabric hands the runtime: packets, with a few flags; and [`Fabric`], the one
//! interface over the shared-memory, in-process and TCP fabrics that the engine drives.
//!
//! A message larger than one packet is sent as consecutive packets to one destination
//! (`FIRST`, then continuations, the last one `LAST`); packets of one source arrive in order,
//! and a sender never interleaves the packets of two messages to the same destination.

/// The packet starts a message (it carries the TMH).
pub const PKT_FIRST: u8 = 1;
/// The packet ends a message.
pub const PKT_LAST: u8 = 2;
/// A message in one packet.
pub const PKT_WHOLE: u8 = PKT_FIRST | PKT_LAST;
/// An RDMA read request, response or refusal: served by the endpoint itself, never seen by
/// the receiver's TM-SRQ (as an RDMA read bypasses the SRQ of a real NIC). Independent of the
/// message packet sequence: it may appear between the packets of a message.
pub const PKT_RMA: u8 = 4;

/// One packet as delivered by a fabric's poll.
#[derive(Debug, Clone, Copy)]
pub struct Packet<'a> {
    /// The sending rank.
    pub src: usize,
    /// `PKT_*` flags.
    pub flags: u8,
    /// Length of the whole message this packet belongs to (headers included).
    pub total_len: u64,
    /// The packet's bytes; valid only during the poll callback.
    pub data: &'a [u8],
}

/// How a peer stands, as its fabric sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeerState {
    /// Attached and running.
    Alive,
    /// It finalized cleanly: everything it sent is in the fabric, and it sends nothing more.
    Finalized,
    /// It left without finalizing (its process died or its end was dropped while unwinding).
    Failed,
}

use crate::error::{Error, Result};
use crate::local::LocalFabric;
use crate::shm::ShmFabric;
use crate::tcp::TcpFabric;

/// Largest packet of self-delivery (a job of one rank has no fabric limit).
const SELF_MAX_PACKET: usize = usize::MAX / 2;

/// `TMPI_FABRIC`: which fabric links ranks.
pub const ENV_FABRIC: &str = "TMPI_FABRIC";

/// What `TMPI_FABRIC` asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FabricChoice {
    /// Shared memory between ranks of one host, TCP between hosts.
    #[default]
    Auto,
    /// Shared memory only (every rank must be on one host).
    Shm,
    /// TCP between every pair of ranks, even on one host (for testing).
    Tcp,
}

impl FabricChoice {
    /// Parses `auto`, `shm` or `tcp`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] naming `TMPI_FABRIC` for anything else.
    pub fn parse(s: &str) -> Result<Self> {
        match s.trim() {
            "auto" | "" => Ok(FabricChoice::Auto),
            "shm" => Ok(FabricChoice::Shm),
            "tcp" => Ok(FabricChoice::Tcp),
            v => Err(Error::InvalidArgument(format!("{ENV_FABRIC}={v:?}: expected auto, shm or tcp"))),
        }
    }
}

/// Shared memory among the ranks of this host, TCP to the others.
pub struct HybridFabric {
    shm: ShmFabric,
    tcp: TcpFabric,
    /// World rank -> index in the shared-memory segment (`u32::MAX`: not on this host).
    shm_index: Vec<u32>,
    /// Segment index -> world rank.
    shm_world: Vec<usize>,
    /// Poll TCP first on odd rounds, so neither side starves the other.
    round: bool,
}

impl HybridFabric {
    /// Joins the two fabrics; `shm_world[i]` is the world rank of the segment's rank `i`.
    ///
    /// # Errors
    /// A world rank out of range or reached both ways.
    pub fn new(shm: ShmFabric, tcp: TcpFabric, size: usize, shm_world: Vec<usize>) -> Result<Self> {
        let mut shm_index = vec![u32::MAX; size];
        for (i, &w) in shm_world.iter().enumerate() {
            if w >= size || tcp.has_peer(w) || shm_index[w] != u32::MAX {
                return Err(Error::InvalidArgument(format!("rank {w} cannot be a shared-memory peer here")));
            }
            shm_index[w] = i as u32;
        }
        Ok(HybridFabric { shm, tcp, shm_index, shm_world, round: false })
    }

    #[inline]
    fn local(&self, rank: usize) -> Option<usize> {
        match self.shm_index.get(rank) {
            Some(&i) if i != u32::MAX => Some(i as usize),
            _ => None,
        }
    }

    #[inline]
    fn poll<F: FnMut(Packet<'_>) -> bool>(&mut self, mut f: F) -> Result<usize> {
        self.round = !self.round;
        let world = &self.shm_world;
        let mut n = 0;
        if self.round {
            n += self.tcp.poll(&mut f)?;
        }
        n += self.shm.poll(|p| f(Packet { src: world[p.src], ..p }))?;
        if !self.round {
            n += self.tcp.poll(&mut f)?;
        }
        Ok(n)
    }

    /// [`TcpFabric::wait`], unless a packet already waits in a shared-memory ring. Shared
    /// memory does not wake this sleep (its doorbell is a futex, which `ppoll` cannot watch),
    /// so the caller keeps `timeout` short.
    fn wait(&mut self, timeout: std::time::Duration) -> bool {
        let me = self.shm.rank();
        if (0..self.shm_world.len()).any(|i| i != me && self.shm.pending_from(i)) {
            return true;
        }
        self.tcp.wait(timeout)
    }
}

/// The fabric under one engine: the one interface the runtime's progress loop drives. A
/// `match` per call keeps each fabric's path monomorphic and inlined (no `dyn` call per
/// packet); shared memory alone, the common case, is its own variant.
pub enum Fabric {
    /// A job of one rank: only self-delivery.
    Single,
    /// Threads of one process.
    Local(LocalFabric),
    /// Processes on one host.
    Shm(ShmFabric),
    /// Every peer over TCP.
    Tcp(TcpFabric),
    /// Shared memory on this host, TCP to other hosts.
    Hybrid(Box<HybridFabric>),
}

impl Fabric {
    /// The largest packet payload `try_send` takes.
    pub fn max_packet(&self) -> usize {
        match self {
            Fabric::Single => SELF_MAX_PACKET,
            Fabric::Local(f) => f.max_packet(),
            Fabric::Shm(f) => f.max_packet(),
            Fabric::Tcp(f) => f.max_packet(),
            Fabric::Hybrid(h) => h.shm.max_packet().min(h.tcp.max_packet()),
        }
    }

    /// Most parts one packet to world rank `dest` may be gathered from in
    /// [`Fabric::try_send`]: three to a TCP peer ([`crate::tcp::MAX_PARTS`]), any number to
    /// a shared-memory or in-process one (their copy into the ring or the channel takes part
    /// after part).
    #[inline]
    pub fn max_parts(&self, dest: usize) -> usize {
        match self {
            Fabric::Tcp(_) => crate::tcp::MAX_PARTS,
            Fabric::Hybrid(h) if h.local(dest).is_none() => crate::tcp::MAX_PARTS,
            _ => usize::MAX,
        }
    }

    /// Tries to send one packet (the concatenation of `parts`, at most
    /// [`Fabric::max_parts`]) to world rank `dest`. `Ok(false)`: no room now (make progress
    /// and retry).
    ///
    /// # Errors
    /// Bad destination, oversized packet; [`Error::PeerGone`] from the in-process fabric.
    #[inline(always)]
    pub fn try_send(&mut self, dest: usize, flags: u8, total: u64, parts: &[&[u8]]) -> Result<bool> {
        match self {
            Fabric::Shm(f) => f.try_send(dest, flags, total, parts),
            Fabric::Local(f) => f.try_send(dest, flags, total, parts),
            Fabric::Tcp(f) => f.try_send(dest, flags, total, parts),
            Fabric::Hybrid(h) => match h.local(dest) {
                Some(i) => h.shm.try_send(i, flags, total, parts),
                None => h.tcp.try_send(dest, flags, total, parts),
            },
            Fabric::Single => Err(Error::InvalidArgument("no fabric in a single-rank job".into())),
        }
    }

    /// Delivers waiting packets to `f` (at most one per source), returns how many were taken.
    ///
    /// # Errors
    /// A corrupt record or malformed frame (naming the peer for TCP).
    #[inline]
    pub fn poll<F: FnMut(Packet<'_>) -> bool>(&mut self, f: F) -> Result<usize> {
        match self {
            Fabric::Shm(s) => s.poll(f),
            Fabric::Local(l) => l.poll(f),
            Fabric::Tcp(t) => t.poll(f),
            Fabric::Hybrid(h) => h.poll(f),
            Fabric::Single => Ok(0),
        }
    }

    /// How `rank` stands by what the fabric knows: attached, finalized (it sends nothing more,
    /// and that is fine), or failed (it left without finalizing). A local process that died
    /// without a word is found by its pid ([`Self::peer_pid`]).
    pub fn peer_state(&self, rank: usize) -> PeerState {
        let shm_state = |f: &ShmFabric, r: usize| {
            if f.peer_finalized(r) {
                PeerState::Finalized
            } else if f.peer_departed(r) {
                PeerState::Failed
            } else {
                PeerState::Alive
            }
        };
        match self {
            Fabric::Shm(f) => shm_state(f, rank),
            Fabric::Local(f) => f.peer_state(rank),
            Fabric::Tcp(f) => f.peer_state(rank),
            Fabric::Hybrid(h) => match h.local(rank) {
                Some(i) => shm_state(&h.shm, i),
                None => h.tcp.peer_state(rank),
            },
            Fabric::Single => PeerState::Alive,
        }
    }

    /// Whether a packet from `src` waits to be read.
    pub fn pending_from(&mut self, src: usize) -> bool {
        match self {
            Fabric::Shm(f) => f.pending_from(src),
            Fabric::Local(f) => f.pending_from(src),
            Fabric::Tcp(f) => f.pending_from(src),
            Fabric::Hybrid(h) => match h.local(src) {
                Some(i) => h.shm.pending_from(i),
                None => h.tcp.pending_from(src),
            },
            Fabric::Single => false,
        }
    }

    /// Process id of `rank` when it runs on this host in another process (0 if it has not
    /// attached yet); this process's id for threads, self-delivery and peers on other hosts,
    /// whose liveness the fabric itself reports.
    pub fn peer_pid(&self, rank: usize) -> u32 {
        match self {
            Fabric::Shm(f) if rank != f.rank() => f.peer_pid(rank),
            Fabric::Hybrid(h) => match h.local(rank) {
                Some(i) if i != h.shm.rank() => h.shm.peer_pid(i),
                _ => std::process::id(),
            },
            _ => std::process::id(),
        }
    }

    /// Whether `rank`'s memory can be reached by single copy (same host, or same process).
    pub fn single_copy_to(&self, rank: usize) -> bool {
        match self {
            Fabric::Single | Fabric::Local(_) | Fabric::Shm(_) => true,
            Fabric::Tcp(_) => false,
            Fabric::Hybrid(h) => h.local(rank).is_some(),
        }
    }

    /// Records that this rank finalized cleanly (over TCP: hands the last bytes to the
    /// peers' kernels first).
    pub fn mark_finalized(&mut self) {
        match self {
            Fabric::Shm(f) => f.mark_finalized(),
            Fabric::Local(f) => f.mark_finalized(),
            Fabric::Tcp(f) => f.mark_finalized(),
            Fabric::Hybrid(h) => {
                h.tcp.mark_finalized();
                h.shm.mark_finalized();
            }
            Fabric::Single => {}
        }
    }

    /// Whether `dest`, a shared-memory peer, has taken every packet sent to it so far
    /// ([`ShmFabric::drained`]); false for any other peer.
    pub fn drained(&mut self, dest: usize) -> bool {
        match self {
            Fabric::Shm(f) => f.drained(dest),
            Fabric::Hybrid(h) => h.local(dest).is_some_and(|i| h.shm.drained(i)),
            _ => false,
        }
    }

    /// Peers reached over TCP (none for the other fabrics).
    pub fn tcp_peers(&self) -> usize {
        match self {
            Fabric::Tcp(f) => f.peer_count(),
            Fabric::Hybrid(h) => h.tcp.peer_count(),
            _ => 0,
        }
    }

    /// Sleeps until a TCP connection is ready ([`TcpFabric::wait`]: data or end of stream to
    /// read, room for a send that found the kernel's buffer full) or `timeout` passes; returns
    /// at once when a packet already waits in a user-space buffer or, for the hybrid fabric, in
    /// a shared-memory ring (which does not end the sleep: keep `timeout` short there). The
    /// other fabrics only sleep. Returns whether something is ready; the caller polls either
    /// way. Out of line: it is a sleep, and keeps the shared-memory waits small.
    #[cold]
    #[inline(never)]
    pub fn wait_network(&mut self, timeout: std::time::Duration) -> bool {
        match self {
            Fabric::Tcp(f) => f.wait(timeout),
            Fabric::Hybrid(h) => h.wait(timeout),
            _ => {
                std::thread::sleep(timeout);
                false
            }
        }
    }

    /// Connections refused at start-up for not proving the job secret (TCP only).
    pub fn bad_connections(&self) -> u64 {
        match self {
            Fabric::Tcp(f) => f.bad_connections(),
            Fabric::Hybrid(h) => h.tcp.bad_connections(),
            _ => 0,
        }
    }

    /// A short name of the fabric: `single`, `local`, `shm`, `tcp` or `hybrid`.
    pub fn kind(&self) -> &'static str {
        match self {
            Fabric::Single => "single",
            Fabric::Local(_) => "local",
            Fabric::Shm(_) => "shm",
            Fabric::Tcp(_) => "tcp",
            Fabric::Hybrid(_) => "hybrid",
        }
    }
}
