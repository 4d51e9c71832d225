//! Hooks of the shared-memory collectives ([`crate::coll::shm`]) and of the doorbell into the
//! engine: the job's segment, waking and sleeping on doorbells, and what the collectives need
//! to know about failures (departed peers, collective aborts); and a communicator's hold on a
//! collective context of the segment ([`Slot`]), which the communicator gives back when it is
//! dropped.

use super::*;
use tmpi_transport::shm::segment::Segment;

impl Engine {
    /// The job's shared-memory segment, if every rank of the job is in it under its world rank
    /// (the fabric says so: shared memory alone).
    pub(crate) fn shm_segment(&self) -> Option<&Segment> {
        self.fabric.segment()
    }

    /// Wakes world rank `rank` if it sleeps on its doorbell (after a store it may wait for).
    pub(crate) fn shm_wake(&self, rank: usize) {
        self.fabric.wake(rank);
    }

    /// Wakes those of world ranks `ranks` that sleep on their doorbells, after stores they
    /// may wait for (one fence for all of them).
    #[inline]
    pub(crate) fn shm_wake_all(&self, ranks: impl Iterator<Item = usize>) {
        self.fabric.wake_all(ranks);
    }

    /// Whether a sleep now is one that what the rank waits for ends ([`Wakeup`]): on the
    /// doorbell when nothing waits to go out (a rank with queued work waits for ring space,
    /// which no bell announces); in `ppoll` on the sockets whenever the rank has them (data,
    /// room for a send that found the kernel's buffer full, or a peer's end of stream wake
    /// it; a hybrid rank's shared-memory peers do not, but its sleeps are as short as the
    /// plain sleeps it would take instead); never where nothing wakes a sleeper.
    pub(super) fn can_doze(&self) -> bool {
        match self.fabric.wakeup() {
            Wakeup::Doorbell => self.out_pending == 0 && self.st.outbox.is_empty(),
            Wakeup::Sockets { .. } => true,
            Wakeup::Nothing => false,
        }
    }

    /// Sleeps for at most `d`: in the fabric's sleep when [`Engine::can_doze`], otherwise a
    /// plain sleep. `busy` is asked after the sleep is announced (doorbell only). Out of line
    /// (a sleep): the waits it is called from stay small.
    #[inline(never)]
    pub(super) fn doze(&mut self, d: std::time::Duration, busy: impl FnOnce(&Segment) -> bool) {
        if self.can_doze() {
            self.fabric.sleep(d, busy);
        } else {
            std::thread::sleep(d);
        }
    }

    /// Whether collective call `seq` (low 16 bits) on collective context `ctx` was aborted by
    /// another member because a rank departed; that rank if so.
    pub(crate) fn coll_aborted(&self, ctx: u32, seq: u32) -> Option<usize> {
        self.st.aborts.iter().find(|a| !a.failed && a.ctx == ctx && a.seq == seq & 0xffff).map(|a| a.rank)
    }

    /// Gives back this rank's hold on `slot` (a communicator is dropped).
    pub(crate) fn shm_release(&self, slot: Slot) {
        if let (Slot::Ctx { ctx, .. }, Some(seg)) = (slot, self.shm_segment()) {
            seg.coll_free(usize::from(ctx));
        }
    }

    /// Whether world rank `peer` has departed (finalized, failed, or its process is gone).
    pub(crate) fn departed(&self, peer: usize) -> bool {
        peer != self.st.rank && peer < self.size && self.state_of(peer) != PeerState::Alive
    }
}

/// A communicator's collective context in the segment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) enum Slot {
    /// Not decided yet (the world communicator takes context 0 at its first collective).
    #[default]
    Unset,
    /// Point-to-point only.
    None,
    /// Context `ctx` of generation `gen`.
    Ctx { ctx: u16, gen: u32 },
}
