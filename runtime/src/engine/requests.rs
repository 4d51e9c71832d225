//! Requests: their slots, how they are named on the wire (index and generation), their one
//! completion point, cancel, and abandon (a scope that unwinds).

use super::*;

/// How a request is named on the wire (in `app_ctx`, ACKs and read requests): its slot index
/// and the low bits of its generation.
#[inline]
pub(super) fn wire_name(k: ReqId) -> u32 {
    (k.gen & WIRE_GEN_MASK) << WIRE_IDX_BITS | (k.idx & WIRE_IDX_MASK)
}

impl Engine {
    /// The result of `rid` if it has completed (the slot is freed).
    #[inline]
    pub(crate) fn take_if_done(&mut self, rid: ReqId) -> Option<Result<Status>> {
        let done = self.st.reqs.get(rid).is_none_or(|r| r.result.is_some());
        if !done {
            return None;
        }
        match self.st.reqs.remove(rid) {
            Some(Req { result: Some(r), .. }) => Some(r),
            _ => Some(Err(Error::State("request already completed and collected".into()))),
        }
    }

    /// Whether `rid` has completed (without collecting it).
    pub(crate) fn is_done(&self, rid: ReqId) -> bool {
        self.st.reqs.get(rid).is_none_or(|r| r.result.is_some())
    }

    /// Cancels a receive that has not matched; no effect otherwise.
    pub(crate) fn cancel(&mut self, rid: ReqId) {
        let Some(req) = self.st.reqs.get_mut(rid) else {
            return;
        };
        if req.result.is_some() {
            return;
        }
        let ReqKind::Recv(r) = &mut req.kind else {
            return;
        };
        if r.matched {
            return;
        }
        let Some(id) = r.match_id.take() else { return };
        if self.st.matcher.cancel(id).is_some() {
            req.result = Some(Ok(Status { source: 0, tag: 0, len: 0, cancelled: true }));
            self.st.leave_queues(rid);
        }
        if let Err(e) = self.st.drain_cq() {
            self.st.error.get_or_insert(e);
        }
    }

    /// Forgets the user buffer of a pending operation so it may be freed (scope unwinding, or
    /// a wait that failed): a queued receive is cancelled, a receive in progress discards the
    /// rest, a queued send copies what it has not pushed yet. The slot is freed when the
    /// operation completes.
    ///
    /// Memory a peer may still touch is waited for before this returns: a receive buffer the
    /// target of a single-copy read may be writing into, and a send buffer a reader was
    /// granted a single copy of. The wait ends only when the copy is done or the peer has
    /// departed (then it can touch nothing more); errors met meanwhile are kept for the next
    /// progress, never cut the wait short.
    pub(crate) fn abandon(&mut self, rid: ReqId) {
        self.cancel(rid);
        let Some(req) = self.st.reqs.get_mut(rid) else {
            return;
        };
        if req.result.is_some() {
            self.st.reqs.remove(rid);
            return;
        }
        req.detached = true;
        match &mut req.kind {
            ReqKind::Coll(k) => {
                let k = *k;
                self.abandon_nbc(rid, k);
            }
            ReqKind::Recv(r) => {
                r.buf = None;
                // The target of a single-copy read may be writing into the buffer: it must
                // stay until that write is done (or the target is gone).
                if let Some(k) = r.read {
                    if let Some(src) = self.st.reads.get(k).filter(|op| op.remote_write).map(|op| op.src) {
                        self.progress_while(src, |e| e.st.reads.get(k).is_some_and(|op| op.remote_write));
                    }
                }
            }
            ReqKind::Send(s) => {
                let granted = s.rndv.as_ref().and_then(|r| r.granted);
                let range = s.rndv.as_ref().and_then(|r| r.buf).map(|b| (b.addr(), b.addr() + b.len()));
                // Queued data is copied: the message still goes out whole.
                for q in &mut self.out {
                    for m in q.iter_mut().filter(|m| m.req == rid) {
                        if let OutData::User(b) = &m.data {
                            m.data = OutData::Owned(b.slice(0, b.len()).to_vec());
                        }
                    }
                }
                // A reader granted a single copy is copying the buffer now, and this rank may
                // owe it a share (`cma_w`, written during the wait): the memory must stay
                // until its FIN (or until the reader is gone).
                if let Some(reader) = granted {
                    self.progress_while(reader, |e| e.st.reqs.get(rid).is_some_and(|r| r.result.is_none()));
                }
                // From now on every read of the buffer is refused, and reads being served
                // from it stop.
                if let Some((lo, hi)) = range {
                    if let Some(Req { kind: ReqKind::Send(SendState { rndv: Some(r), .. }), .. }) = self.st.reqs.get_mut(rid) {
                        r.buf = None;
                    }
                    let inside = |a: usize| a >= lo && a < hi.max(lo + 1);
                    let st = &mut self.st;
                    let mut refused = Vec::new();
                    st.rma_out.retain(|r| {
                        let keep = !inside(r.buf.addr());
                        if !keep {
                            refused.push((r.dest, r.read));
                        }
                        keep
                    });
                    st.cma_w.retain(|w| {
                        let keep = !inside(w.buf.addr());
                        if !keep {
                            refused.push((w.dest, w.read));
                        }
                        keep
                    });
                    for (dest, read) in refused {
                        st.rma_notice(dest, RMA_READ_ERR, read);
                    }
                }
            }
        }
    }

    /// Makes progress while `busy` holds and `peer` has not departed (abandon waits here for a
    /// single copy in flight to end). Errors are kept for the next progress.
    pub(super) fn progress_while(&mut self, peer: usize, busy: impl Fn(&Engine) -> bool) {
        let mut b = self.backoff();
        while busy(self) {
            match self.progress() {
                Ok(0) => {
                    if b.snooze() {
                        if !self.dead[peer] && !self.fabric.process_alive(peer) {
                            self.dead[peer] = true;
                        }
                        if self.state_of(peer) != PeerState::Alive {
                            return;
                        }
                    }
                }
                Ok(_) => b.reset(),
                Err(e) => {
                    self.st.deferred.get_or_insert(e);
                }
            }
        }
    }
}

impl State {
    /// Inserts a send request to world rank `dest`. A request that needs an answer (ACK or
    /// FIN) is named on the wire, which bounds how many can be outstanding.
    pub(super) fn new_send(&mut self, dest: usize, key: u64, need_ack: bool, rndv: Option<RndvSend>) -> Result<ReqId> {
        if need_ack && self.reqs.vacant_key().idx as usize >= MAX_NAMED_REQUESTS {
            return Err(Error::State(format!(
                "more than {MAX_NAMED_REQUESTS} synchronous or rendezvous sends outstanding: complete some before starting more"
            )));
        }
        Ok(self.reqs.insert(Req {
            kind: ReqKind::Send(SendState { dest, key, pushed: false, need_ack, acked: false, rndv }),
            result: None,
            detached: false,
        }))
    }

    /// The send request a peer names on the wire, if it is still the one named (index and
    /// generation) and is a send to that peer.
    pub(super) fn named_send(&self, name: u32, peer: usize) -> Option<ReqId> {
        let k = self.reqs.key_of(name & WIRE_IDX_MASK)?;
        if k.gen & WIRE_GEN_MASK != (name >> WIRE_IDX_BITS) & WIRE_GEN_MASK {
            return None;
        }
        match self.reqs.get(k) {
            Some(Req { kind: ReqKind::Send(s), .. }) if s.dest == peer => Some(k),
            _ => None,
        }
    }

    /// Records push/ack progress of a send request and completes it when both are done.
    pub(super) fn send_progress(&mut self, rid: ReqId, pushed: bool, acked: bool) {
        let Some(req) = self.reqs.get_mut(rid) else {
            return;
        };
        if let ReqKind::Send(s) = &mut req.kind {
            s.pushed |= pushed;
            s.acked |= acked;
            if s.pushed && (s.acked || !s.need_ack) && req.result.is_none() {
                s.rndv = None;
                req.result = Some(Ok(Status { source: 0, tag: 0, len: 0, cancelled: false }));
                if req.detached {
                    self.reqs.remove(rid);
                }
            }
        }
    }

    /// Whether receive `rid` may take a message with match key `tag64` from world rank `src`.
    pub(super) fn admits(&self, rid: ReqId, tag64: u64, src: usize) -> bool {
        match self.reqs.get(rid) {
            Some(Req { kind: ReqKind::Recv(r), .. }) => r.from.admits(src_of(tag64), src),
            _ => true,
        }
    }

    /// Completes receive `rid` with `err` (it matched, so it leaves every queue).
    pub(super) fn fail_recv(&mut self, rid: ReqId, err: Error) {
        let Some(req) = self.reqs.get_mut(rid) else { return };
        if let ReqKind::Recv(r) = &mut req.kind {
            r.matched = true;
            r.match_id = None;
        }
        if req.result.is_none() {
            req.result = Some(Err(err));
        }
        if req.detached {
            self.reqs.remove(rid);
        }
    }

    pub(super) fn complete_recv(&mut self, rid: ReqId) {
        let Some(req) = self.reqs.get_mut(rid) else {
            return;
        };
        if let ReqKind::Recv(r) = &req.kind {
            req.result = Some(if r.total > r.cap {
                Err(Error::Truncated { source_rank: r.source, tag: r.tag, len: r.total, capacity: r.cap })
            } else {
                Ok(Status { source: r.source, tag: r.tag, len: r.total, cancelled: false })
            });
        }
        if req.detached {
            self.reqs.remove(rid);
        }
    }
}
