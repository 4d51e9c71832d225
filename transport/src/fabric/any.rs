//! [`AnyFabric`]: the fabric under one engine, one of the fabrics chosen at start-up. Each
//! call is a `match` that the compiler inlines, so the engine's calls stay monomorphic: the
//! shared-memory path, the common case, is its own variant and costs no `dyn` call per
//! packet.

use super::{Caps, Fabric, HybridFabric, Packet, PeerCaps, PeerState, Wakeup};
use crate::error::{Error, Result};
use crate::local::LocalFabric;
#[cfg(feature = "ofi")]
use crate::ofi::OfiFabric;
use crate::shm::segment::Segment;
use crate::shm::ShmFabric;
use crate::tcp::TcpFabric;

/// Largest packet of self-delivery (a job of one rank has no fabric limit).
const SELF_MAX_PACKET: usize = usize::MAX / 2;

/// The fabric under one engine.
pub enum AnyFabric {
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
    /// Every peer over libfabric (`TMPI_FABRIC=ofi`).
    #[cfg(feature = "ofi")]
    Ofi(Box<OfiFabric>),
    /// Shared memory on this host, libfabric to other hosts (`auto` with a hardware provider).
    #[cfg(feature = "ofi")]
    HybridOfi(Box<HybridFabric<OfiFabric>>),
}

/// Calls `$call` on the fabric inside `$f` (an [`AnyFabric`]); `$single` for a job of one.
macro_rules! each {
    ($f:expr, $x:ident => $call:expr, $single:expr) => {
        match $f {
            AnyFabric::Shm($x) => $call,
            AnyFabric::Local($x) => $call,
            AnyFabric::Tcp($x) => $call,
            AnyFabric::Hybrid($x) => $call,
            #[cfg(feature = "ofi")]
            AnyFabric::Ofi($x) => $call,
            #[cfg(feature = "ofi")]
            AnyFabric::HybridOfi($x) => $call,
            AnyFabric::Single => $single,
        }
    };
}

#[cfg(feature = "ofi")]
impl AnyFabric {
    /// The OFI endpoint's own operations, where every peer is reached through it (a job on
    /// `TMPI_FABRIC=ofi`): the provider's tag matching and the RDMA read of rendezvous data.
    /// `None` on every other fabric, and on a hybrid one (its shared-memory peers have no such
    /// operations).
    pub fn ofi_ops(&self) -> Option<&OfiFabric> {
        match self {
            AnyFabric::Ofi(f) => Some(f),
            _ => None,
        }
    }

    /// [`AnyFabric::ofi_ops`], to act.
    pub fn ofi_ops_mut(&mut self) -> Option<&mut OfiFabric> {
        match self {
            AnyFabric::Ofi(f) => Some(f),
            _ => None,
        }
    }
}

impl Fabric for AnyFabric {
    #[inline(always)]
    fn try_send(&mut self, dest: usize, flags: u8, total_len: u64, parts: &[&[u8]]) -> Result<bool> {
        each!(self, f => Fabric::try_send(f, dest, flags, total_len, parts), Err(Error::InvalidArgument("no fabric in a single-rank job".into())))
    }

    #[inline]
    fn poll<F: FnMut(Packet<'_>) -> bool>(&mut self, f: F) -> Result<usize> {
        each!(self, x => Fabric::poll(x, f), Ok(0))
    }

    fn pending_from(&mut self, src: usize) -> bool {
        each!(self, f => Fabric::pending_from(f, src), false)
    }

    fn drained(&mut self, dest: usize) -> bool {
        each!(self, f => Fabric::drained(f, dest), false)
    }

    fn max_packet(&self) -> usize {
        each!(self, f => Fabric::max_packet(f), SELF_MAX_PACKET)
    }

    fn peer_caps(&self, rank: usize) -> PeerCaps {
        let single = PeerCaps { max_packet: SELF_MAX_PACKET, max_parts: usize::MAX, single_copy: true, pipelined: false };
        each!(self, f => Fabric::peer_caps(f, rank), single)
    }

    fn peer_state(&self, rank: usize) -> PeerState {
        each!(self, f => Fabric::peer_state(f, rank), PeerState::Alive)
    }

    fn peer_pid(&self, rank: usize) -> u32 {
        each!(self, f => Fabric::peer_pid(f, rank), std::process::id())
    }

    fn mark_finalized(&mut self) {
        each!(self, f => Fabric::mark_finalized(f), ())
    }

    fn wakeup(&self) -> Wakeup {
        each!(self, f => Fabric::wakeup(f), Wakeup::Nothing)
    }

    /// Out of line: it is a sleep, and keeps the shared-memory waits small.
    #[cold]
    #[inline(never)]
    fn sleep(&mut self, timeout: std::time::Duration, busy: impl FnOnce(&Segment) -> bool) -> bool {
        each!(self, f => Fabric::sleep(f, timeout, busy), {
            std::thread::sleep(timeout);
            false
        })
    }

    fn wake(&self, rank: usize) {
        each!(self, f => Fabric::wake(f, rank), ())
    }

    #[inline]
    fn wake_all(&self, ranks: impl Iterator<Item = usize>) {
        each!(self, f => Fabric::wake_all(f, ranks), ())
    }

    fn segment(&self) -> Option<&Segment> {
        each!(self, f => Fabric::segment(f), None)
    }

    fn polled_connections(&self) -> usize {
        each!(self, f => Fabric::polled_connections(f), 0)
    }

    fn bad_connections(&self) -> u64 {
        each!(self, f => Fabric::bad_connections(f), 0)
    }

    fn caps(&self) -> Caps {
        each!(self, f => Fabric::caps(f), Caps::default())
    }

    fn name(&self) -> &'static str {
        each!(self, f => Fabric::name(f), "single")
    }

    fn provider(&self) -> Option<&str> {
        each!(self, f => Fabric::provider(f), None)
    }
}
