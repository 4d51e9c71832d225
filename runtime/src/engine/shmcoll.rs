//! Hooks of the shared-memory collectives ([`crate::coll::shm`]) and of the doorbell into the
//! engine: the job's segment, waking and sleeping on doorbells, and what the collectives need
//! to know about failures (departed peers, collective aborts).

use super::*;
use tmpi_transport::shm::segment::Segment;

impl Engine {
    /// The job's shared-memory segment, if the fabric is shared memory.
    pub(crate) fn shm_segment(&self) -> Option<&Segment> {
        match &self.fabric {
            Fabric::Shm(f) => Some(f.segment()),
            _ => None,
        }
    }

    /// Wakes world rank `rank` if it sleeps on its doorbell (after a store it may wait for).
    pub(crate) fn shm_wake(&self, rank: usize) {
        if let Fabric::Shm(f) = &self.fabric {
            f.wake(rank);
        }
    }

    /// Wakes those of world ranks `ranks` that sleep on their doorbells, after stores they
    /// may wait for: one fence (the stores are visible before any `sleeping` word is read,
    /// so no wake-up is lost), then a load of each rank's `sleeping` word, which stays in
    /// this core's cache while that rank does not sleep.
    pub(crate) fn shm_wake_all(&self, ranks: impl Iterator<Item = usize>) {
        if let Fabric::Shm(f) = &self.fabric {
            std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
            let seg = f.segment();
            for r in ranks.filter(|&r| r < self.size) {
                if seg.doorbell(r).0.load(std::sync::atomic::Ordering::Relaxed) != 0 {
                    f.wake(r);
                }
            }
        }
    }

    /// Whether a sleep now is one that what the rank waits for ends: on the doorbell when the
    /// fabric is shared memory and nothing waits to go out (a rank with queued work waits for
    /// ring space, which no bell announces); in `ppoll` on the sockets whenever the rank has
    /// TCP peers (data, room for a send that found the kernel's buffer full, or a peer's end
    /// of stream wake it; a hybrid rank's shared-memory peers do not, but its sleeps are as
    /// short as the plain sleeps it would take instead).
    pub(super) fn can_doze(&self) -> bool {
        match self.fabric {
            Fabric::Shm(_) => {
                self.out_pending == 0
                    && self.st.ctlq.is_empty()
                    && self.st.rma_out.is_empty()
                    && self.st.cma_w.is_empty()
                    && self.st.cma_q.is_empty()
            }
            Fabric::Tcp(_) | Fabric::Hybrid(_) => true,
            Fabric::Single | Fabric::Local(_) => false,
        }
    }

    /// Sleeps for at most `d`: on the doorbell or the sockets when [`Engine::can_doze`],
    /// otherwise a plain sleep. `busy` is asked after the sleep is announced (doorbell only).
    /// Out of line (a sleep): the waits it is called from stay small.
    #[inline(never)]
    pub(super) fn doze(&mut self, d: std::time::Duration, busy: impl FnOnce(&Segment) -> bool) {
        let quiet = self.can_doze();
        match &mut self.fabric {
            Fabric::Shm(f) if quiet => f.doze(d, busy),
            f @ (Fabric::Tcp(_) | Fabric::Hybrid(_)) => {
                f.wait_network(d);
            }
            _ => std::thread::sleep(d),
        }
    }

    /// Whether collective call `seq` (low 16 bits) on collective context `ctx` was aborted by
    /// another member because a rank departed; that rank if so.
    pub(crate) fn coll_aborted(&self, ctx: u32, seq: u32) -> Option<usize> {
        self.st.aborts.iter().find(|a| a.0 == ctx && a.1 == seq & 0xffff).map(|a| a.2)
    }

    /// Whether world rank `peer` has departed (finalized, failed, or its process is gone).
    pub(crate) fn departed(&self, peer: usize) -> bool {
        peer != self.st.rank && peer < self.size && self.state_of(peer) != PeerState::Alive
    }
}
