//! In-process fabric: ranks as threads of one process, over crossbeam channels.
//!
//! Same surface as [`crate::shm::ShmFabric`], so the runtime's matching and protocols run in
//! unit tests without processes. Packets are copied into owned buffers; the fabric never
//! applies back-pressure (channels are unbounded), but a packet may be left unconsumed by the
//! poll callback, exactly like a ring record.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;

use crossbeam_channel::{unbounded, Receiver, Sender};

use crate::error::{Error, Result};
use crate::packet::{Packet, PeerState};

struct Wire {
    src: usize,
    flags: u8,
    total_len: u64,
    data: Vec<u8>,
}

/// One rank's end of an in-process fabric.
pub struct LocalFabric {
    rank: usize,
    peers: Vec<Sender<Wire>>,
    inbox: Receiver<Wire>,
    /// Packets received from the channel but not yet consumed, per source.
    staged: Vec<VecDeque<Wire>>,
    next_src: usize,
    max_packet: usize,
    /// Per rank: 0 attached, 1 dropped without finalizing (its thread failed), 2 finalized.
    state: Arc<Vec<AtomicU8>>,
}

impl Drop for LocalFabric {
    fn drop(&mut self) {
        let _ = self.state[self.rank].compare_exchange(0, 1, Ordering::AcqRel, Ordering::Acquire);
    }
}

impl LocalFabric {
    /// Creates the fabric of a job of `size` ranks; element `r` is rank `r`'s end.
    pub fn create(size: usize, max_packet: usize) -> Vec<LocalFabric> {
        let (txs, rxs): (Vec<_>, Vec<_>) = (0..size).map(|_| unbounded()).unzip();
        let state: Arc<Vec<AtomicU8>> = Arc::new((0..size).map(|_| AtomicU8::new(0)).collect());
        rxs.into_iter()
            .enumerate()
            .map(|(rank, inbox)| LocalFabric {
                rank,
                peers: txs.clone(),
                inbox,
                staged: (0..size).map(|_| VecDeque::new()).collect(),
                next_src: 0,
                max_packet,
                state: state.clone(),
            })
            .collect()
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Ranks in the job.
    pub fn size(&self) -> usize {
        self.peers.len()
    }

    /// Whether rank `peer` failed: its end was dropped before it finalized.
    pub fn peer_failed(&self, peer: usize) -> bool {
        self.state.get(peer).is_some_and(|a| a.load(Ordering::Acquire) == 1)
    }

    /// How rank `peer` stands (see [`PeerState`]).
    pub fn peer_state(&self, peer: usize) -> PeerState {
        match self.state.get(peer).map(|a| a.load(Ordering::Acquire)) {
            Some(1) => PeerState::Failed,
            Some(2) => PeerState::Finalized,
            _ => PeerState::Alive,
        }
    }

    /// Whether a packet from `src` waits to be delivered. Read [`Self::peer_state`] first:
    /// whatever a peer sent before it finalized is then visible here.
    pub fn pending_from(&mut self, src: usize) -> bool {
        while let Ok(w) = self.inbox.try_recv() {
            let s = w.src;
            self.staged[s].push_back(w);
        }
        self.staged.get(src).is_some_and(|q| !q.is_empty())
    }

    /// Records that this rank finalized cleanly.
    pub fn mark_finalized(&self) {
        self.state[self.rank].store(2, Ordering::Release);
    }

    /// Largest packet payload.
    pub fn max_packet(&self) -> usize {
        self.max_packet
    }

    /// Sends one packet; never full.
    ///
    /// # Errors
    /// Bad destination, oversized packet, or [`Error::PeerGone`] if the peer's end was dropped
    /// without finalizing (a packet to a peer that finalized and left is dropped silently).
    pub fn try_send(&mut self, dest: usize, flags: u8, total_len: u64, parts: &[&[u8]]) -> Result<bool> {
        let len: usize = parts.iter().map(|p| p.len()).sum();
        if len > self.max_packet {
            return Err(Error::InvalidArgument(format!("packet of {len} bytes exceeds {}", self.max_packet)));
        }
        let tx = self
            .peers
            .get(dest)
            .filter(|_| dest != self.rank)
            .ok_or_else(|| Error::InvalidArgument(format!("no link from rank {} to {dest}", self.rank)))?;
        let mut data = Vec::with_capacity(len);
        for p in parts {
            data.extend_from_slice(p);
        }
        if tx.send(Wire { src: self.rank, flags, total_len, data }).is_err() {
            // The peer's end is gone. If it finalized, the packet goes to nobody, as a record
            // in the ring of a process that finalized and exited would: not an error.
            if self.peer_state(dest) != PeerState::Finalized {
                return Err(Error::PeerGone { rank: dest });
            }
        }
        Ok(true)
    }

    /// Delivers at most one packet per source, round-robin, as [`crate::shm::ShmFabric::poll`].
    ///
    /// # Errors
    /// None today; the signature matches the other fabrics.
    pub fn poll<F: FnMut(Packet<'_>) -> bool>(&mut self, mut f: F) -> Result<usize> {
        while let Ok(w) = self.inbox.try_recv() {
            let src = w.src;
            self.staged[src].push_back(w);
        }
        let n = self.staged.len();
        let mut delivered = 0;
        for i in 0..n {
            let src = (self.next_src + i) % n;
            if let Some(w) = self.staged[src].front() {
                if f(Packet { src, flags: w.flags, total_len: w.total_len, data: &w.data }) {
                    self.staged[src].pop_front();
                    delivered += 1;
                }
            }
        }
        self.next_src = (self.next_src + 1) % n.max(1);
        Ok(delivered)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn threads_exchange_in_order() {
        let mut fabs = LocalFabric::create(3, 1024);
        let mut f2 = fabs.pop().unwrap();
        let mut f1 = fabs.pop().unwrap();
        let mut f0 = fabs.pop().unwrap();
        std::thread::scope(|s| {
            s.spawn(move || {
                for i in 0..100u32 {
                    f1.try_send(0, 3, 4, &[&i.to_le_bytes()]).unwrap();
                }
            });
            s.spawn(move || {
                for i in 0..100u32 {
                    f2.try_send(0, 3, 4, &[&(1000 + i).to_le_bytes()]).unwrap();
                }
            });
            let mut next = [0u32, 0, 1000];
            let mut got = 0;
            while got < 200 {
                got += f0
                    .poll(|p| {
                        let v = u32::from_le_bytes(p.data.try_into().unwrap());
                        assert_eq!(v, next[p.src]);
                        next[p.src] += 1;
                        true
                    })
                    .unwrap();
            }
        });
    }

    #[test]
    fn unconsumed_packet_stays() {
        let mut fabs = LocalFabric::create(2, 64);
        fabs[1].try_send(0, 1, 1, &[b"a"]).unwrap();
        assert_eq!(fabs[0].poll(|_| false).unwrap(), 0);
        assert_eq!(fabs[0].poll(|p| p.data == b"a").unwrap(), 1);
        assert!(fabs[1].try_send(0, 1, 1, &[&[0u8; 65]]).is_err());
        assert!(fabs[1].try_send(1, 1, 1, &[b"x"]).is_err());
        let f1 = fabs.pop().unwrap();
        assert!(!fabs[0].peer_failed(1));
        drop(f1);
        assert!(fabs[0].peer_failed(1));
    }
}
