//! Leaving: finalize hands over this rank's own data and never waits for other ranks; a wait
//! that only departed ranks could satisfy ends with `PeerGone`; a collective that fails that
//! way tells its other members.

use super::*;

/// What a waiting call depends on, for deciding when to give up with [`Error::PeerGone`].
pub(crate) enum Need {
    /// A message from these peers (a probe).
    Peers(Peers),
    /// The completion of a request.
    Req(ReqId),
}

impl Peers {
    /// Appends the world ranks a message may come from.
    pub(super) fn world_ranks(&self, size: usize, out: &mut Vec<usize>) {
        match (self.one(), &self.members) {
            (Some(w), _) => out.push(w),
            (None, None) => out.extend(0..size),
            (None, Some(m)) => out.extend(m.iter().copied()),
        }
    }
}

/// Most rounds of progress [`Engine::settle`] makes.
const SETTLE_ROUNDS: usize = 64;

impl Engine {
    /// Whether what a waiter needs can still come: [`Error::PeerGone`] if a peer failed (the
    /// job is ending), or if every rank `need` depends on has departed (finalized or failed)
    /// and everything it sent before has been read.
    ///
    /// A departed rank's state is read before its ring: what it sent before it finalized is
    /// then visible, so it is received first. When the process probe made progress (it
    /// settles before it marks a process dead), nothing is concluded: what the waiter needs
    /// may have arrived (taken from a ring into the unexpected queue, where the ring no longer
    /// shows it), so the waiter looks again first.
    pub(crate) fn check_gone(&mut self, need: &Need) -> Result<()> {
        if self.probe_next_process()? {
            return Ok(());
        }
        let mut failed = None;
        for peer in 0..self.size {
            if peer != self.st.rank && self.state_of(peer) == PeerState::Failed {
                if self.fabric.pending_from(peer) {
                    return Ok(());
                }
                // Whatever it had half sent will never be finished.
                self.cut_off(peer)?;
                failed.get_or_insert(peer);
            }
        }
        if let Some(peer) = failed {
            return Err(Error::PeerGone { rank: peer });
        }
        let mut deps = Vec::new();
        match need {
            Need::Peers(p) => p.world_ranks(self.size, &mut deps),
            Need::Req(rid) => match self.st.reqs.get(*rid) {
                None | Some(Req { result: Some(_), .. }) => return Ok(()),
                Some(Req { kind: ReqKind::Recv(r), .. }) => {
                    if let Some(gone) = self.st.aborted(r.key) {
                        return Err(Error::PeerGone { rank: gone });
                    }
                    if r.phase.matched() {
                        deps.push(r.src_world);
                    } else {
                        r.from.world_ranks(self.size, &mut deps);
                    }
                }
                Some(Req { kind: ReqKind::Coll(k), .. }) => {
                    let k = *k;
                    return self.check_gone_nbc(k);
                }
                Some(Req { kind: ReqKind::Send(s), .. }) => {
                    if let Some(gone) = self.st.aborted(s.key) {
                        return Err(Error::PeerGone { rank: gone });
                    }
                    deps.push(s.dest)
                }
            },
        }
        deps.retain(|&d| d != self.st.rank);
        if deps.is_empty() {
            return Ok(());
        }
        for &d in &deps {
            if self.state_of(d) == PeerState::Alive || !self.drained(d) {
                return Ok(());
            }
        }
        Err(Error::PeerGone { rank: deps[0] })
    }

    /// Checks one peer's process per call (system calls; every peer's own record in the
    /// fabric is a memory read), in turn: one seen exited is settled, then marked dead.
    /// Returns whether settling made progress.
    fn probe_next_process(&mut self) -> Result<bool> {
        let p = self.next_probe;
        self.next_probe = if p + 1 >= self.size { 0 } else { p + 1 };
        if p != self.st.rank && !self.dead[p] && !self.fabric.process_alive(p) {
            let moved = self.settle()?;
            self.dead[p] = true;
            return Ok(moved > 0);
        }
        Ok(false)
    }

    /// Progresses until a round finds nothing (at most [`SETTLE_ROUNDS`]): a peer seen
    /// exited may have finalized first, and its mark (after all it sent) may still be on
    /// its way in through a fabric that is read by progress (OFI); a rank that finalized and
    /// exited has not failed.
    /// Returns the events of those rounds.
    fn settle(&mut self) -> Result<usize> {
        let mut moved = 0;
        for _ in 0..SETTLE_ROUNDS {
            match self.progress()? {
                0 => break,
                n => moved += n,
            }
        }
        Ok(moved)
    }

    /// How `peer` stands: its record in the fabric, or failed once its process was seen dead
    /// (a finalized rank's exit is no failure).
    pub(super) fn state_of(&self, peer: usize) -> PeerState {
        match self.fabric.peer_state(peer) {
            PeerState::Alive if self.dead[peer] => PeerState::Failed,
            s => s,
        }
    }

    /// A failed `peer` was in the middle of a message: the TM-SRQ completes it as flushed, and
    /// a receive it was filling fails with [`Error::PeerGone`].
    pub(super) fn cut_off(&mut self, peer: usize) -> Result<()> {
        let Some(inc) = self.st.ux.incoming(peer) else { return Ok(()) };
        let aborted = self.st.offload.tm_mut().abort_message(peer as u32);
        if !aborted && matches!(inc, Incoming::Idle) {
            return Ok(());
        }
        self.st.ux.set_incoming(peer, Incoming::Idle);
        match inc {
            Incoming::Expected { req } => self.st.fail_recv(req, Error::PeerGone { rank: peer }),
            // A partial unexpected message stays queued: a receive that takes it waits for
            // the rest, and fails here in turn.
            Incoming::Unexpected { .. } | Incoming::Idle | Incoming::Discard => {}
        }
        self.st.drain_cq()
    }

    /// Nothing from `peer` waits to be read, nor is a message from it half read.
    pub(super) fn drained(&mut self, peer: usize) -> bool {
        !self.fabric.pending_from(peer) && matches!(self.st.ux.incoming(peer), Some(Incoming::Idle) | None)
    }

    /// Hands over this rank's own outgoing data, then records that it finalized (see
    /// [`Engine::hand_over`] and [`Engine::mark_finalized`]).
    ///
    /// # Errors
    /// As [`Engine::hand_over`]; the rank is then not marked finalized.
    #[cfg(test)]
    pub(crate) fn finalize(&mut self) -> Result<()> {
        self.hand_over()?;
        self.mark_finalized();
        Ok(())
    }

    /// Hands over this rank's own outgoing data: queued messages and control packets are
    /// pushed, reads it serves are streamed, and rendezvous reads it is making finish (so
    /// their senders get their FIN). It never waits for what other ranks do: work for a peer
    /// that has departed is dropped.
    ///
    /// # Errors
    /// A failure of progress (a peer that broke the protocol); the caller should then not
    /// mark the rank finalized, so that its exit reads as a failure.
    pub(crate) fn hand_over(&mut self) -> Result<()> {
        #[cfg(feature = "ofi")]
        if self.pm.is_some() {
            self.pm_drain()?;
        }
        let mut b = self.backoff();
        loop {
            let busy = self.out_pending > 0 || !self.st.outbox.is_empty() || !self.st.reads.is_empty();
            if !busy {
                return Ok(());
            }
            if self.progress()? == 0 {
                if b.snooze() {
                    self.drop_work_for_departed();
                }
            } else {
                b.reset();
            }
        }
    }

    /// Records in the fabric that this rank finalized: from now on its peers see it departed
    /// (a receive only it could match fails with [`Error::PeerGone`]).
    pub(crate) fn mark_finalized(&mut self) {
        self.fabric.mark_finalized();
    }

    /// Drops queued work whose peer has departed (finalize waits for nothing from them).
    pub(super) fn drop_work_for_departed(&mut self) {
        for peer in 0..self.size {
            if peer == self.st.rank {
                continue;
            }
            if !self.dead[peer] && self.fabric.peer_state(peer) == PeerState::Alive && !self.fabric.process_alive(peer) {
                self.dead[peer] = true;
            }
            if self.state_of(peer) == PeerState::Alive {
                continue;
            }
            let dropped = self.out[peer].len();
            self.out[peer].clear();
            self.out_pending -= dropped;
            self.st.outbox.drop_for(peer);
            self.st.drop_reads_from(peer);
        }
    }

    /// A collective call (context `ctx`, sequence number `seq`) failed here because world rank
    /// `gone` departed: tells the call's other members (world ranks `members`), so that those
    /// waiting on this rank rather than on the departed one give up too, instead of waiting
    /// for messages this rank will not send.
    pub(crate) fn abort_collective(&mut self, ctx: u32, seq: u32, gone: usize, members: impl Iterator<Item = usize>) {
        for w in members {
            if w != self.st.rank && w != gone && self.state_of(w) == PeerState::Alive {
                self.st.outbox.control(w, Control::CollAbort { ctx, seq, gone: gone as u32 });
            }
        }
        // Best effort: the notices go out with this and later progress.
        if let Err(e) = self.flush_ctl() {
            self.st.outbox.fail(e);
        }
    }

    /// Collective call `seq` (all 32 bits) on context `ctx` failed here with an error of this
    /// rank's own (an argument, or lengths that disagreed): tells the call's other members
    /// (world ranks `members`), so that none waits for this rank's part. The notice names
    /// this rank itself, which is how its receivers tell it from a departure.
    pub(crate) fn fail_collective(&mut self, ctx: u32, seq: u32, members: impl Iterator<Item = usize>) {
        self.abort_collective(ctx, seq, self.st.rank, members);
    }
}

impl State {
    /// Whether the collective call that match key `key` belongs to was aborted elsewhere
    /// (see [`Engine::abort_collective`]); the departed rank if so.
    pub(super) fn aborted(&self, key: u64) -> Option<usize> {
        if self.aborts.is_empty() {
            return None;
        }
        let ctx = (key >> matching::CTX_SHIFT) as u32;
        let seq = (key as u32 & matching::MAX_TAG) >> 8;
        self.aborts.iter().find(|a| !a.failed && a.ctx == ctx && a.seq == seq).map(|a| a.rank)
    }

    /// The member that failed collective call `seq` (all 32 bits) on context `ctx` with an
    /// error of its own, if one told this rank (see [`Engine::fail_collective`]).
    pub(super) fn failed_call(&self, ctx: u32, seq: u32) -> Option<usize> {
        self.aborts.iter().find(|a| a.failed && a.ctx == ctx && a.seq == seq).map(|a| a.rank)
    }

    /// Forgets the notices of collective calls given up on communicator `id` (its collective
    /// context is `2 id + 1`).
    pub(super) fn forget_aborts(&mut self, id: u32) {
        self.aborts.retain(|a| a.ctx >> 1 != id);
    }

    /// Member `src` gave up collective call `seq` on context `ctx`: because world rank `rank`
    /// departed, or (`rank == src`) because the call failed there (see
    /// [`Engine::abort_collective`] and [`Engine::fail_collective`]).
    pub(super) fn on_coll_abort(&mut self, src: usize, ctx: u32, seq: u32, rank: usize) {
        let a = Abort { ctx, seq, rank, failed: rank == src };
        if self.aborts.contains(&a) {
            return;
        }
        if self.aborts.len() >= ABORTS_KEPT {
            self.aborts.pop_front();
        }
        self.aborts.push_back(a);
    }
}
