//! The hybrid fabric: shared memory among the ranks of this host, a network fabric (TCP, or
//! libfabric's OFI fabric with the feature `ofi`) to the others. Each call goes to the fabric
//! that reaches the peer; world ranks are translated to the segment's indices and back.

use super::{Fabric, Packet, PeerCaps, PeerState, Wakeup};
use crate::error::{Error, Result};
use crate::shm::segment::Segment;
use crate::shm::ShmFabric;
use crate::tcp::TcpFabric;

/// Shared memory among the ranks of this host, the network fabric `N` (TCP by default) to the
/// others.
pub struct HybridFabric<N = TcpFabric> {
    shm: ShmFabric,
    net: N,
    /// World rank -> index in the shared-memory segment (`u32::MAX`: not on this host).
    shm_index: Vec<u32>,
    /// Segment index -> world rank.
    shm_world: Vec<usize>,
    /// Poll the network first on odd rounds, so neither side starves the other.
    round: bool,
}

impl HybridFabric<TcpFabric> {
    /// Joins the two fabrics; `shm_world[i]` is the world rank of the segment's rank `i`.
    ///
    /// # Errors
    /// A world rank out of range or reached both ways.
    pub fn new(shm: ShmFabric, tcp: TcpFabric, size: usize, shm_world: Vec<usize>) -> Result<Self> {
        if let Some(&w) = shm_world.iter().find(|&&w| tcp.has_peer(w)) {
            return Err(Error::InvalidArgument(format!("rank {w} cannot be a shared-memory peer here")));
        }
        Self::join(shm, tcp, size, shm_world)
    }
}

impl<N: Fabric> HybridFabric<N> {
    /// Joins shared memory and the network fabric `net`, which reaches (at least) every rank
    /// not in `shm_world`; `shm_world[i]` is the world rank of the segment's rank `i`.
    ///
    /// # Errors
    /// A world rank out of range or listed twice.
    pub fn join(shm: ShmFabric, net: N, size: usize, shm_world: Vec<usize>) -> Result<Self> {
        let mut shm_index = vec![u32::MAX; size];
        for (i, &w) in shm_world.iter().enumerate() {
            if w >= size || shm_index[w] != u32::MAX {
                return Err(Error::InvalidArgument(format!("rank {w} cannot be a shared-memory peer here")));
            }
            shm_index[w] = i as u32;
        }
        Ok(HybridFabric { shm, net, shm_index, shm_world, round: false })
    }

    /// The segment index of world rank `rank`, if it is on this host.
    #[inline]
    fn local(&self, rank: usize) -> Option<usize> {
        match self.shm_index.get(rank) {
            Some(&i) if i != u32::MAX => Some(i as usize),
            _ => None,
        }
    }
}

impl<N: Fabric> Fabric for HybridFabric<N> {
    #[inline]
    fn try_send(&mut self, dest: usize, flags: u8, total_len: u64, parts: &[&[u8]]) -> Result<bool> {
        match self.local(dest) {
            Some(i) => self.shm.try_send(i, flags, total_len, parts),
            None => self.net.try_send(dest, flags, total_len, parts),
        }
    }

    #[inline]
    fn poll<F: FnMut(Packet<'_>) -> bool>(&mut self, mut f: F) -> Result<usize> {
        self.round = !self.round;
        let world = &self.shm_world;
        let mut n = 0;
        if self.round {
            n += self.net.poll(&mut f)?;
        }
        n += self.shm.poll(|p| f(Packet { src: world[p.src], ..p }))?;
        if !self.round {
            n += self.net.poll(&mut f)?;
        }
        Ok(n)
    }

    fn pending_from(&mut self, src: usize) -> bool {
        match self.local(src) {
            Some(i) => self.shm.pending_from(i),
            None => self.net.pending_from(src),
        }
    }

    fn drained(&mut self, dest: usize) -> bool {
        self.local(dest).is_some_and(|i| self.shm.drained(i))
    }

    fn max_packet(&self) -> usize {
        self.shm.max_packet().min(self.net.max_packet())
    }

    fn peer_caps(&self, rank: usize) -> PeerCaps {
        match self.local(rank) {
            Some(i) => Fabric::peer_caps(&self.shm, i),
            None => self.net.peer_caps(rank),
        }
    }

    fn peer_state(&self, rank: usize) -> PeerState {
        match self.local(rank) {
            Some(i) => Fabric::peer_state(&self.shm, i),
            None => self.net.peer_state(rank),
        }
    }

    fn peer_pid(&self, rank: usize) -> u32 {
        match self.local(rank) {
            Some(i) => Fabric::peer_pid(&self.shm, i),
            None => std::process::id(),
        }
    }

    fn mark_finalized(&mut self) {
        self.net.mark_finalized();
        self.shm.mark_finalized();
    }

    /// The sockets; the shared-memory peers' doorbell (a futex) cannot wake a `ppoll`.
    fn wakeup(&self) -> Wakeup {
        Wakeup::Sockets { all: false }
    }

    /// The network fabric's sleep ([`TcpFabric::wait`]), unless a packet already waits in a
    /// shared-memory ring. Shared memory does not wake this sleep, so the caller keeps
    /// `timeout` short.
    fn sleep(&mut self, timeout: std::time::Duration, _busy: impl FnOnce(&Segment) -> bool) -> bool {
        let me = self.shm.rank();
        if (0..self.shm_world.len()).any(|i| i != me && self.shm.pending_from(i)) {
            return true;
        }
        self.net.sleep(timeout, |_| false)
    }

    fn wake(&self, rank: usize) {
        if let Some(i) = self.local(rank) {
            self.shm.wake(i);
        }
    }

    fn polled_connections(&self) -> usize {
        self.net.polled_connections()
    }

    fn bad_connections(&self) -> u64 {
        self.net.bad_connections()
    }

    fn name(&self) -> &'static str {
        match self.net.name() {
            "tcp" => "hybrid",
            _ => "hybrid-ofi",
        }
    }

    fn provider(&self) -> Option<&str> {
        self.net.provider()
    }
}
