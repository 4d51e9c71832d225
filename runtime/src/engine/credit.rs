//! Eager credit: flow control of eager messages. Each eager message costs its sender its
//! length plus [`UX_OVERHEAD`] of the receiver's credit (`TMPI_UNEXPECTED_MAX` shared out over
//! the peers); the receiver returns it in batches ([`Control::Credit`]) as it consumes the
//! messages, and a sender without credit sends a rendezvous instead. So the receiver never
//! has to refuse what is in its ring.

use super::*;

/// The credit stage: what this rank may still send each peer eagerly, and what it owes them.
pub(super) struct Credit {
    /// Eager credit (bytes) this rank may still send to each peer before it must switch to
    /// rendezvous; refilled by the peer's `Control::Credit` as it consumes what was sent.
    left: Vec<usize>,
    /// Credit this rank owes each peer for eager messages it consumed, returned in batches.
    owed: Vec<usize>,
    /// Batch size of credit returns.
    batch: usize,
}

/// Eager credit of each peer: `TMPI_UNEXPECTED_MAX` shared out over the peers (at most
/// 2^31, so a return fits its 32-bit field).
pub(super) fn credit_per_peer(budget: usize, size: usize) -> usize {
    (budget / size.saturating_sub(1).max(1)).min(1 << 31)
}

impl Credit {
    /// Full credit towards each of `size` ranks, from a budget of `budget` bytes.
    pub(super) fn new(budget: usize, size: usize) -> Self {
        let per = credit_per_peer(budget, size);
        Credit { left: vec![per; size], owed: vec![0; size], batch: (per / 4).max(1) }
    }

    /// Whether `cost` bytes of credit towards `dest` are left.
    #[inline(always)]
    pub(super) fn covers(&self, dest: usize, cost: usize) -> bool {
        self.left.get(dest).is_some_and(|&c| c >= cost)
    }

    /// Spends `cost` bytes of credit towards `dest` ([`Credit::covers`] said there were).
    #[inline(always)]
    pub(super) fn spend(&mut self, dest: usize, cost: usize) {
        self.left[dest] -= cost;
    }

    /// `src` returned `bytes` of credit.
    pub(super) fn refill(&mut self, src: usize, bytes: u32) {
        if let Some(c) = self.left.get_mut(src) {
            *c = c.saturating_add(bytes as usize);
        }
    }

    /// This rank consumed an eager message of `len` payload bytes from `src`: what it cost
    /// goes on `src`'s account, and comes back as the bytes to return now once a batch is full.
    #[inline]
    fn consumed(&mut self, src: usize, len: usize) -> Option<u32> {
        let o = self.owed.get_mut(src)?;
        *o = o.saturating_add(len.saturating_add(UX_OVERHEAD));
        if *o < self.batch {
            return None;
        }
        let v = u32::try_from(*o).unwrap_or(u32::MAX);
        *o -= v as usize;
        Some(v)
    }

    /// Credit left towards `dest`.
    #[cfg(test)]
    pub(super) fn left(&self, dest: usize) -> usize {
        self.left[dest]
    }

    /// Credit owed to `src`.
    #[cfg(test)]
    pub(super) fn owed(&self, src: usize) -> usize {
        self.owed[src]
    }
}

impl State {
    /// This rank consumed an eager message of `len` payload bytes from `src`: the credit it
    /// cost the sender goes back, in batches.
    #[inline]
    pub(super) fn give_credit(&mut self, src: usize, len: usize) {
        if src == self.rank {
            return;
        }
        if let Some(bytes) = self.credit.consumed(src, len) {
            self.outbox.control(src, Control::Credit { bytes });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credit_is_shared_out() {
        assert_eq!(credit_per_peer(64 << 20, 2), 64 << 20);
        assert_eq!(credit_per_peer(64 << 20, 5), 16 << 20);
        assert_eq!(credit_per_peer(1 << 40, 2), 1 << 31);
        assert_eq!(credit_per_peer(4096, 1), 4096);
    }

    #[test]
    fn credit_is_returned_in_batches() {
        let mut c = Credit::new(4 * 4096, 2);
        assert_eq!(c.left(1), 4 * 4096);
        assert!(c.covers(1, 4 * 4096) && !c.covers(1, 4 * 4096 + 1) && !c.covers(2, 1));
        c.spend(1, 4096);
        assert_eq!(c.left(1), 3 * 4096);
        assert_eq!(c.consumed(1, 100), None, "below a batch: owed");
        assert_eq!(c.owed(1), 100 + UX_OVERHEAD);
        let back = c.consumed(1, 4096).expect("a batch");
        assert_eq!(back as usize, 4196 + 2 * UX_OVERHEAD);
        assert_eq!(c.owed(1), 0);
        c.refill(1, back);
        c.refill(9, 1);
        assert_eq!(c.left(1), 3 * 4096 + back as usize);
    }
}
