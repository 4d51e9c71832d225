//! [`Fabric`] for the shared-memory, TCP and in-process fabrics: each forwards to the
//! fabric's own methods and says what it offers.

use std::sync::atomic::Ordering;

use super::{Fabric, Packet, PeerCaps, PeerState, Wakeup};
use crate::error::Result;
use crate::local::LocalFabric;
use crate::shm::segment::Segment;
use crate::shm::ShmFabric;
use crate::tcp::{self, TcpFabric};

impl Fabric for ShmFabric {
    #[inline(always)]
    fn try_send(&mut self, dest: usize, flags: u8, total_len: u64, parts: &[&[u8]]) -> Result<bool> {
        ShmFabric::try_send(self, dest, flags, total_len, parts)
    }

    #[inline(always)]
    fn poll<F: FnMut(Packet<'_>) -> bool>(&mut self, f: F) -> Result<usize> {
        ShmFabric::poll(self, f)
    }

    fn pending_from(&mut self, src: usize) -> bool {
        ShmFabric::pending_from(self, src)
    }

    fn drained(&mut self, dest: usize) -> bool {
        ShmFabric::drained(self, dest)
    }

    fn max_packet(&self) -> usize {
        ShmFabric::max_packet(self)
    }

    /// Any number of parts (the ring copies them in one after another), single copy, and the
    /// peer's core copies each record out as soon as it is in.
    fn peer_caps(&self, _rank: usize) -> PeerCaps {
        PeerCaps { max_packet: ShmFabric::max_packet(self), max_parts: usize::MAX, single_copy: true, pipelined: true }
    }

    fn peer_state(&self, rank: usize) -> PeerState {
        if self.peer_finalized(rank) {
            PeerState::Finalized
        } else if self.peer_departed(rank) {
            PeerState::Failed
        } else {
            PeerState::Alive
        }
    }

    fn peer_pid(&self, rank: usize) -> u32 {
        if rank == self.rank() {
            std::process::id()
        } else {
            ShmFabric::peer_pid(self, rank)
        }
    }

    fn mark_finalized(&mut self) {
        ShmFabric::mark_finalized(self);
    }

    fn wakeup(&self) -> Wakeup {
        Wakeup::Doorbell
    }

    fn sleep(&mut self, timeout: std::time::Duration, busy: impl FnOnce(&Segment) -> bool) -> bool {
        self.doze(timeout, busy);
        true
    }

    fn wake(&self, rank: usize) {
        ShmFabric::wake(self, rank);
    }

    /// One fence (the stores are visible before any `sleeping` word is read, so no wake-up
    /// is lost), then a load of each rank's `sleeping` word, which stays in this core's cache
    /// while that rank does not sleep.
    fn wake_all(&self, ranks: impl Iterator<Item = usize>) {
        std::sync::atomic::fence(Ordering::SeqCst);
        let seg = self.segment();
        for r in ranks.filter(|&r| r < self.size()) {
            if seg.doorbell(r).0.load(Ordering::Relaxed) != 0 {
                ShmFabric::wake(self, r);
            }
        }
    }

    fn segment(&self) -> Option<&Segment> {
        Some(ShmFabric::segment(self))
    }

    fn name(&self) -> &'static str {
        "shm"
    }
}

impl Fabric for TcpFabric {
    #[inline]
    fn try_send(&mut self, dest: usize, flags: u8, total_len: u64, parts: &[&[u8]]) -> Result<bool> {
        TcpFabric::try_send(self, dest, flags, total_len, parts)
    }

    #[inline]
    fn poll<F: FnMut(Packet<'_>) -> bool>(&mut self, f: F) -> Result<usize> {
        TcpFabric::poll(self, f)
    }

    fn pending_from(&mut self, src: usize) -> bool {
        TcpFabric::pending_from(self, src)
    }

    fn max_packet(&self) -> usize {
        TcpFabric::max_packet(self)
    }

    /// Three parts (one `sendmsg` with the frame header), no single copy across hosts, and
    /// no pipelining (the kernel's socket buffers already overlap the two sides).
    fn peer_caps(&self, _rank: usize) -> PeerCaps {
        PeerCaps { max_packet: TcpFabric::max_packet(self), max_parts: tcp::MAX_PARTS, single_copy: false, pipelined: false }
    }

    fn peer_state(&self, rank: usize) -> PeerState {
        TcpFabric::peer_state(self, rank)
    }

    fn mark_finalized(&mut self) {
        TcpFabric::mark_finalized(self);
    }

    fn wakeup(&self) -> Wakeup {
        Wakeup::Sockets { all: true }
    }

    fn sleep(&mut self, timeout: std::time::Duration, _busy: impl FnOnce(&Segment) -> bool) -> bool {
        self.wait(timeout)
    }

    fn polled_connections(&self) -> usize {
        self.peer_count()
    }

    fn bad_connections(&self) -> u64 {
        TcpFabric::bad_connections(self)
    }

    fn name(&self) -> &'static str {
        "tcp"
    }
}

impl Fabric for LocalFabric {
    #[inline]
    fn try_send(&mut self, dest: usize, flags: u8, total_len: u64, parts: &[&[u8]]) -> Result<bool> {
        LocalFabric::try_send(self, dest, flags, total_len, parts)
    }

    #[inline]
    fn poll<F: FnMut(Packet<'_>) -> bool>(&mut self, f: F) -> Result<usize> {
        LocalFabric::poll(self, f)
    }

    fn pending_from(&mut self, src: usize) -> bool {
        LocalFabric::pending_from(self, src)
    }

    fn max_packet(&self) -> usize {
        LocalFabric::max_packet(self)
    }

    /// Any number of parts, single copy (the ranks are threads of one process); a channel
    /// hands over whole packets, so nothing is pipelined.
    fn peer_caps(&self, _rank: usize) -> PeerCaps {
        PeerCaps { max_packet: LocalFabric::max_packet(self), max_parts: usize::MAX, single_copy: true, pipelined: false }
    }

    fn peer_state(&self, rank: usize) -> PeerState {
        LocalFabric::peer_state(self, rank)
    }

    fn mark_finalized(&mut self) {
        LocalFabric::mark_finalized(self);
    }

    fn name(&self) -> &'static str {
        "local"
    }
}

/// A boxed fabric is that fabric (the hybrid one is boxed inside [`super::AnyFabric`]).
impl<T: Fabric> Fabric for Box<T> {
    #[inline(always)]
    fn try_send(&mut self, dest: usize, flags: u8, total_len: u64, parts: &[&[u8]]) -> Result<bool> {
        (**self).try_send(dest, flags, total_len, parts)
    }
    #[inline(always)]
    fn poll<F: FnMut(Packet<'_>) -> bool>(&mut self, f: F) -> Result<usize> {
        (**self).poll(f)
    }
    fn pending_from(&mut self, src: usize) -> bool {
        (**self).pending_from(src)
    }
    fn drained(&mut self, dest: usize) -> bool {
        (**self).drained(dest)
    }
    fn max_packet(&self) -> usize {
        (**self).max_packet()
    }
    fn peer_caps(&self, rank: usize) -> PeerCaps {
        (**self).peer_caps(rank)
    }
    fn peer_state(&self, rank: usize) -> PeerState {
        (**self).peer_state(rank)
    }
    fn peer_pid(&self, rank: usize) -> u32 {
        (**self).peer_pid(rank)
    }
    fn mark_finalized(&mut self) {
        (**self).mark_finalized();
    }
    fn wakeup(&self) -> Wakeup {
        (**self).wakeup()
    }
    fn sleep(&mut self, timeout: std::time::Duration, busy: impl FnOnce(&Segment) -> bool) -> bool {
        (**self).sleep(timeout, busy)
    }
    fn wake(&self, rank: usize) {
        (**self).wake(rank);
    }
    fn wake_all(&self, ranks: impl Iterator<Item = usize>) {
        (**self).wake_all(ranks);
    }
    fn segment(&self) -> Option<&Segment> {
        (**self).segment()
    }
    fn polled_connections(&self) -> usize {
        (**self).polled_connections()
    }
    fn bad_connections(&self) -> u64 {
        (**self).bad_connections()
    }
    fn caps(&self) -> super::Caps {
        (**self).caps()
    }
    fn name(&self) -> &'static str {
        (**self).name()
    }
    fn provider(&self) -> Option<&str> {
        (**self).provider()
    }
}
