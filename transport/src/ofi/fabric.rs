//! [`Fabric`] for [`OfiFabric`]: what the engine learns of the OFI fabric. Packets of up to
//! [`MAX_PACKET`] bytes gathered from any number of parts (they are copied into one buffer,
//! or injected), no single copy (rendezvous data is streamed in packets, as over TCP), no
//! pipelining; a rank sleeps on the completion queue's descriptor where the provider gives
//! one.

use std::time::Duration;

use super::packet::{OfiFabric, MAX_PACKET};
use crate::error::Result;
use crate::fabric::{Fabric, Packet, PeerCaps, PeerState, Wakeup};
use crate::shm::segment::Segment;

impl Fabric for OfiFabric {
    #[inline]
    fn try_send(&mut self, dest: usize, flags: u8, total_len: u64, parts: &[&[u8]]) -> Result<bool> {
        OfiFabric::try_send(self, dest, flags, total_len, parts)
    }

    #[inline]
    fn poll<F: FnMut(Packet<'_>) -> bool>(&mut self, f: F) -> Result<usize> {
        OfiFabric::poll(self, f)
    }

    fn pending_from(&mut self, src: usize) -> bool {
        OfiFabric::pending_from(self, src)
    }

    fn max_packet(&self) -> usize {
        MAX_PACKET
    }

    fn peer_caps(&self, _rank: usize) -> PeerCaps {
        PeerCaps { max_packet: MAX_PACKET, max_parts: usize::MAX, single_copy: false, pipelined: false }
    }

    fn peer_state(&self, rank: usize) -> PeerState {
        OfiFabric::peer_state(self, rank)
    }

    /// The pid a peer on this host published at wire-up; this process's id for the others
    /// (their end is what the fabric reports).
    fn peer_pid(&self, rank: usize) -> u32 {
        match OfiFabric::peer_pid(self, rank) {
            0 => std::process::id(),
            pid => pid,
        }
    }

    fn mark_finalized(&mut self) {
        OfiFabric::mark_finalized(self);
    }

    /// With a completion queue descriptor, as on sockets: every peer can end the sleep.
    fn wakeup(&self) -> Wakeup {
        if self.endpoint().wait_fd().is_some() {
            Wakeup::Sockets { all: true }
        } else {
            Wakeup::Nothing
        }
    }

    fn sleep(&mut self, timeout: Duration, _busy: impl FnOnce(&Segment) -> bool) -> bool {
        self.wait(timeout)
    }

    /// A provider over IP (`tcp`, `udp`, `sockets`) asks the kernel on each progress call; one
    /// such call serves every peer.
    fn polled_connections(&self) -> usize {
        usize::from(self.endpoint().offer().ip_addressed())
    }

    fn name(&self) -> &'static str {
        "ofi"
    }

    fn provider(&self) -> Option<&str> {
        Some(&self.endpoint().offer().provider)
    }
}
