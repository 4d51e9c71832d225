//! Requests: their slots, how they are named on the wire (index and generation), their one
//! completion point, cancel, and abandon (a scope that unwinds).

use super::*;

/// A receive while it is pending: posted, matched and filling, or reading a rendezvous.
pub(super) struct RecvState {
    /// `None`: the receive was abandoned mid-message; data is discarded.
    pub(super) buf: Option<RawBufMut>,
    /// Whom it waits for (for `PeerGone`, and to check who sent what it matched).
    pub(super) from: Peers,
    /// World rank of the sender once matched.
    pub(super) src_world: usize,
    /// The posted match key (its context and collective sequence number say which collective
    /// call a receive belongs to).
    pub(super) key: u64,
    /// The TM-SRQ matched it with a message whose match key names another rank than the one
    /// that sent it (a forged source): it completes with [`Error::Protocol`].
    pub(super) refused: Option<usize>,
    pub(super) cap: usize,
    pub(super) matched: bool,
    pub(super) match_id: Option<RecvId>,
    /// Handle of the receive's entry in the TM-SRQ tag list, while it is there.
    pub(super) hw_handle: Option<u32>,
    /// Queued in software only (counted in `State::sw_only_posted`).
    pub(super) sw_only: bool,
    /// A rendezvous request the TM-SRQ placed in this (too small) tagged buffer.
    pub(super) rndv_req: Option<Box<([u8; 64], usize)>>,
    /// The rendezvous read filling this receive, once started.
    pub(super) read: Option<Key>,
    pub(super) received: usize,
    pub(super) total: usize,
    pub(super) source: Rank,
    pub(super) tag: Tag,
    /// A receive of unknown size (`irecv_vec`): the buffer the runtime allocates on match.
    pub(super) owned: Option<Box<OwnedRecv>>,
}

/// The runtime-owned buffer of a receive of unknown size, for elements of `elem` bytes
/// aligned to `align`: allocated (`buf`) once the matched message's length is known.
#[derive(Debug)]
pub(super) struct OwnedRecv {
    pub(super) elem: usize,
    pub(super) align: usize,
    pub(super) buf: Option<OwnedBuf>,
    /// The allocation failed: the message is discarded and the receive fails with
    /// [`Error::NoMemory`].
    pub(super) failed: bool,
}

/// A send while it is pending: queued for ring space, waiting for its ACK, or (rendezvous)
/// for the reader's FIN.
pub(super) struct SendState {
    /// World rank of the destination.
    pub(super) dest: usize,
    /// The message's match key.
    pub(super) key: u64,
    pub(super) pushed: bool,
    pub(super) need_ack: bool,
    pub(super) acked: bool,
    /// A rendezvous send: its buffer (until abandoned) and its registration, held until FIN.
    pub(super) rndv: Option<RndvSend>,
}

/// What a request is.
pub(super) enum ReqKind {
    Recv(RecvState),
    Send(SendState),
    /// A non-blocking collective: its schedule in `Engine::nbc` (see `crate::nbc`).
    Coll(Key),
}

/// One request's slot in the engine's slab (at most 320 bytes, see the README).
pub(super) struct Req {
    pub(super) kind: ReqKind,
    /// The outcome once complete; an error is boxed so a pending slot stays small.
    pub(super) result: Option<std::result::Result<Status, Box<Error>>>,
    /// Nobody will collect the result: free the slot on completion.
    pub(super) detached: bool,
}

/// How a request is named on the wire (in `app_ctx`, ACKs and read requests): its slot index
/// and the low bits of its generation.
#[inline]
pub(super) fn wire_name(k: ReqId) -> u32 {
    (k.gen() & WIRE_GEN_MASK) << WIRE_IDX_BITS | (k.idx() & WIRE_IDX_MASK)
}

impl Engine {
    /// The result of `rid` if it has completed (the slot is freed).
    #[inline]
    pub(crate) fn take_if_done(&mut self, rid: ReqId) -> Option<Result<Status>> {
        let Some(req) = self.st.reqs.get_mut(rid) else {
            return Some(Err(Error::State("request already completed and collected".into())));
        };
        let r = req.result.take()?;
        self.st.reqs.free(rid);
        Some(r.map_err(|e| *e))
    }

    /// As [`Engine::take_if_done`] for a receive of unknown size: also hands over the buffer
    /// the runtime allocated for it (`None` for an empty or failed message).
    pub(crate) fn take_vec_if_done(&mut self, rid: ReqId) -> Option<Result<(Status, Option<OwnedBuf>)>> {
        let Some(req) = self.st.reqs.get_mut(rid) else {
            return Some(Err(Error::State("request already completed and collected".into())));
        };
        let r = req.result.take()?;
        let buf = match &mut req.kind {
            ReqKind::Recv(RecvState { owned: Some(o), buf, .. }) => {
                // The view goes first: nothing may write through it once the memory is gone.
                *buf = None;
                o.buf.take()
            }
            _ => None,
        };
        self.st.reqs.free(rid);
        Some(r.map(|st| (st, buf)).map_err(|e| *e))
    }

    /// Frees the slot of a completed request nobody collected (the end of its scope); no
    /// effect on a request already collected.
    #[inline]
    pub(crate) fn discard(&mut self, rid: ReqId) {
        if self.is_done(rid) {
            self.st.reqs.free(rid);
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
            req.result = Some(Ok(Status::cancelled_recv()));
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
                        st.send_rma(dest, Rma::ReadErr { read });
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
        if need_ack && self.reqs.vacant_key().idx() as usize >= MAX_NAMED_REQUESTS {
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
        if k.gen() & WIRE_GEN_MASK != (name >> WIRE_IDX_BITS) & WIRE_GEN_MASK {
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
                req.result = Some(Ok(Status::sent()));
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

    /// Receive `rid` matched a message of `total` bytes: if it is a receive of unknown size,
    /// its buffer is allocated now, before any byte is written (on failure the message is
    /// discarded and the receive fails with [`Error::NoMemory`]).
    pub(super) fn size_owned(&mut self, rid: ReqId, total: usize) {
        let Some(Req { kind: ReqKind::Recv(r), .. }) = self.reqs.get_mut(rid) else { return };
        let Some(o) = r.owned.as_mut() else { return };
        if o.buf.is_some() || o.failed {
            return;
        }
        // Rounded up to whole elements (a partial one is refused when the receive completes);
        // a length beyond this machine's memory is refused before any allocation.
        let len = if o.elem == 0 { 0 } else { total.div_ceil(o.elem).saturating_mul(o.elem) };
        match Some(len).filter(|&l| l <= crate::sys::physical_memory()).and_then(|l| OwnedBuf::alloc(l, o.align)) {
            Some(mut b) => {
                // SAFETY: the view and the buffer live in the same receive; the buffer leaves
                // it only in `take_vec_if_done`, which drops the view first, once complete.
                r.buf = Some(unsafe { b.view() });
                r.cap = len;
                o.buf = Some(b);
            }
            None => {
                o.failed = true;
                r.buf = None;
                r.cap = total;
            }
        }
    }

    /// Completes receive `rid` with `err` (it matched, so it leaves every queue).
    pub(super) fn fail_recv(&mut self, rid: ReqId, err: Error) {
        if let Some(Req { kind: ReqKind::Recv(r), .. }) = self.reqs.get_mut(rid) {
            r.matched = true;
            r.match_id = None;
        }
        self.end_recv(rid, Some(err));
    }

    /// Receive `rid` has all of its message: it completes with its status, or
    /// [`Error::Truncated`] (see [`State::end_recv`]).
    #[inline]
    pub(super) fn complete_recv(&mut self, rid: ReqId) {
        self.end_recv(rid, None);
    }

    /// The one completion point of a matched receive: it ends with `failure`, or else with
    /// what its message says ([`RecvState::outcome`]); a receive that already has its result
    /// keeps it. A detached receive's slot is freed.
    pub(super) fn end_recv(&mut self, rid: ReqId, failure: Option<Error>) {
        let Some(req) = self.reqs.get_mut(rid) else {
            return;
        };
        if let ReqKind::Recv(r) = &req.kind {
            if req.result.is_none() {
                req.result = Some(match failure {
                    Some(e) => Err(Box::new(e)),
                    None => r.outcome().map_err(Box::new),
                });
            }
        }
        if req.detached {
            self.reqs.remove(rid);
        }
    }
}

impl RecvState {
    /// A receive into `buf` posted with match key `key`, waiting for `from`; `matched` when it
    /// is handed its message directly (a matched probe) rather than queued.
    pub(super) fn new(buf: RawBufMut, key: u64, from: Peers, matched: bool) -> Self {
        RecvState {
            cap: buf.cap(),
            buf: Some(buf),
            key,
            from,
            src_world: 0,
            refused: None,
            matched,
            match_id: None,
            hw_handle: None,
            sw_only: false,
            rndv_req: None,
            read: None,
            received: 0,
            total: 0,
            source: 0,
            tag: 0,
            owned: None,
        }
    }

    /// The error of a message of `len` bytes that does not fit this receive.
    pub(super) fn truncated(&self, len: usize) -> Error {
        Error::Truncated { source_rank: self.source, tag: self.tag, len, capacity: self.cap }
    }

    /// What this receive reports once its message (`total` bytes) is in.
    fn outcome(&self) -> Result<Status> {
        if let Some(o) = &self.owned {
            if o.failed {
                return Err(Error::NoMemory { bytes: self.total, rank: self.source });
            }
            if o.elem == 0 || self.total % o.elem != 0 {
                return Err(Error::TypeMismatch { source_rank: self.source, len: self.total, elem: o.elem });
            }
        }
        if self.total > self.cap {
            Err(self.truncated(self.total))
        } else {
            Ok(Status::received(self.source, self.tag, self.total))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::testkit::{pair, recv, send, settle};
    use super::*;

    #[test]
    fn a_collected_request_is_gone_and_its_slot_reused_under_a_new_name() {
        let (mut a, mut b) = pair();
        let mut buf = [0u8; 4];
        let r = recv(&mut b, Some(0), Some(1), &mut buf);
        send(&mut a, 1, 1, b"ab", false);
        settle(&mut [&mut a, &mut b]);
        assert!(b.take_if_done(r).expect("done").is_ok());
        assert!(b.take_if_done(r).expect("stale").is_err(), "collected twice is an error, not a panic");
        b.discard(r);
        let r2 = recv(&mut b, Some(0), Some(1), &mut buf);
        assert_eq!(r2.idx(), r.idx());
        assert_ne!(wire_name(r2), wire_name(r));
        assert!(!b.is_done(r2));
    }

    #[test]
    fn an_abandoned_receive_takes_its_message_but_writes_nothing() {
        let (mut a, mut b) = pair();
        let mut buf = vec![0u8; 64];
        let r = recv(&mut b, Some(0), Some(2), &mut buf);
        // A receive that has not matched can be cancelled...
        b.cancel(r);
        assert!(b.take_if_done(r).expect("cancelled").is_ok_and(|s| s.cancelled()));
        // ...and one abandoned (its scope unwound) is cancelled the same way.
        let r = recv(&mut b, Some(0), Some(2), &mut buf);
        b.abandon(r);
        send(&mut a, 1, 2, b"zz", false);
        settle(&mut [&mut a, &mut b]);
        assert!(b.st.reqs.is_empty(), "the abandoned slot is freed once its message is in");
        assert_eq!(b.st.stats.unexpected, 1, "an abandoned receive that had not matched is cancelled");
        assert_eq!(buf[0], 0);
    }

    #[test]
    fn a_forged_source_fails_the_receive_without_writing() {
        let mut v = super::super::testkit::job(3, Config::default());
        let c = &mut v.pop().expect("2");
        let b = &mut v.pop().expect("1");
        let mut buf = [0u8; 4];
        let r = recv(b, Some(0), Some(3), &mut buf);
        // Rank 2 sends under rank 0's name.
        let tmh = Tmh { op: TmOp::Eager, app_ctx: 0, tag: super::super::testkit::key(0, 3) }.to_bytes();
        let mut m = tmh.to_vec();
        m.extend_from_slice(b"evil");
        c.inject(1, PKT_WHOLE, m.len() as u64, &m).expect("inject");
        settle(&mut [&mut *b, &mut *c]);
        match b.take_if_done(r).expect("done") {
            Err(Error::Protocol { rank: 2, .. }) => {}
            other => panic!("{other:?}"),
        }
        assert_eq!(buf, [0; 4]);
    }
}
