//! The fabric under one engine: shared memory between processes, channels between threads, or
//! nothing (a job of one rank); and how its peers stand (attached, finalized, failed).

use super::*;

/// The fabric under one engine.
pub(crate) enum Fabric {
    /// Processes on one node.
    Shm(ShmFabric),
    /// Threads of one process.
    Local(LocalFabric),
    /// A job of one rank: only self-delivery.
    Single,
}

impl Fabric {
    pub(super) fn max_packet(&self) -> usize {
        match self {
            Fabric::Shm(f) => f.max_packet(),
            Fabric::Local(f) => f.max_packet(),
            Fabric::Single => SELF_MAX_PACKET,
        }
    }

    #[inline]
    pub(super) fn try_send(&mut self, dest: usize, flags: u8, total: u64, parts: &[&[u8]]) -> Result<bool> {
        Ok(match self {
            Fabric::Shm(f) => f.try_send(dest, flags, total, parts)?,
            Fabric::Local(f) => f.try_send(dest, flags, total, parts)?,
            Fabric::Single => return Err(Error::State("no fabric in a single-rank job".into())),
        })
    }

    #[inline]
    pub(super) fn poll<F: FnMut(Packet<'_>) -> bool>(&mut self, f: F) -> Result<usize> {
        Ok(match self {
            Fabric::Shm(s) => s.poll(f)?,
            Fabric::Local(l) => l.poll(f)?,
            Fabric::Single => 0,
        })
    }

    /// How `rank` stands by what it recorded in the fabric: attached, finalized (it sends
    /// nothing more, and that is fine), or failed (it left without finalizing: it unwound).
    /// A process that died without a word is found by [`Fabric::process_alive`].
    pub(super) fn peer_state(&self, rank: usize) -> PeerState {
        match self {
            Fabric::Shm(f) => {
                if f.peer_finalized(rank) {
                    PeerState::Finalized
                } else if f.peer_departed(rank) {
                    PeerState::Failed
                } else {
                    PeerState::Alive
                }
            }
            Fabric::Local(f) => f.peer_state(rank),
            Fabric::Single => PeerState::Alive,
        }
    }

    /// Whether `rank`'s process still runs (a system call or two: used sparingly).
    pub(super) fn process_alive(&self, rank: usize) -> bool {
        match self {
            Fabric::Shm(f) => crate::sys::pid_alive(f.peer_pid(rank)),
            Fabric::Local(_) | Fabric::Single => true,
        }
    }

    /// Whether a packet from `src` waits to be read.
    pub(super) fn pending_from(&mut self, src: usize) -> bool {
        match self {
            Fabric::Shm(f) => f.pending_from(src),
            Fabric::Local(f) => f.pending_from(src),
            Fabric::Single => false,
        }
    }

    /// Process id of `rank` (this process for threads and self-delivery).
    pub(super) fn peer_pid(&self, rank: usize) -> u32 {
        match self {
            Fabric::Shm(f) if rank != f.rank() => f.peer_pid(rank),
            _ => std::process::id(),
        }
    }

    pub(super) fn mark_finalized(&self) {
        match self {
            Fabric::Shm(f) => f.mark_finalized(),
            Fabric::Local(f) => f.mark_finalized(),
            Fabric::Single => {}
        }
    }
}
