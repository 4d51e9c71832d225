//! Requests: their slots, how they are named on the wire (index and generation), their one
//! completion point, cancel, and abandon (a scope that unwinds).

use super::*;

/// Failed progress calls in a row after which [`Engine::progress_while`] stops waiting.
const STUCK_ERRORS: u32 = 64;

/// Where a pending receive stands. Completion is not a phase: it is [`Req::result`], set at
/// the one completion point ([`State::end_recv`]); the phase then says how far it got.
///
/// - `Idle` → `Posted` when it is queued; back to `Idle` when software matches it (or it is
///   cancelled). From `Idle` a matched receive completes at once (a whole eager message), or
///   goes `Filling` (the rest of an eager message is to come) or `Reading` (a rendezvous). A
///   receive matched at post (an unexpected message, a matched probe) goes the same way.
/// - `Posted` → `Tagged` when the TM-SRQ places the first packet of its message in the tagged
///   buffer, or → `Reading` when the TM-SRQ asks for the read of an expected rendezvous.
/// - `Tagged` → done at DATA_VALID, or → `Reading` at RNDV_INCOMPLETE.
/// - `Filling` → done with the last packet; `Reading` → done when the read ends (FIN sent).
///
/// Only a `Posted` receive can be cancelled.
pub(super) enum RecvPhase {
    /// In no queue and nothing under way: a receive being posted (until it is queued or handed
    /// an unexpected message, within the call that creates it), or one that has just matched
    /// and whose data has not started.
    Idle,
    /// Waiting for a message: queued in the software matcher, and possibly listed in the
    /// TM-SRQ's tag list.
    Posted {
        /// The receive's entry in the software matcher (cancelled with `RecvState::key`).
        match_id: RecvId,
        /// Handle of its entry in the TM-SRQ tag list; `None`: software only (counted in
        /// `State::sw_only_posted`).
        hw: Option<u32>,
    },
    /// Matched by the TM-SRQ to its tagged buffer, which the TM-SRQ fills; its DATA_VALID
    /// completion completes it.
    Tagged {
        /// The rendezvous request the TM-SRQ placed in the buffer, kept in case the buffer is
        /// too small for the message (RNDV_INCOMPLETE): software then reads it.
        rndv: Option<Box<PlacedRndv>>,
    },
    /// Matched in software to an eager message of several packets, being copied in as they
    /// come (`RecvState::received` of `RecvState::total` bytes).
    Filling,
    /// A rendezvous read fills it: its key in `State::reads`.
    Reading(Key),
    /// Posted to the OFI provider's matching: its handle there (see `engine::ofi`).
    #[cfg(feature = "ofi")]
    Provider(u64),
}

/// A rendezvous request as the TM-SRQ placed it in a tagged buffer (up to 64 bytes of it).
pub(super) struct PlacedRndv {
    pub(super) bytes: [u8; 64],
    pub(super) len: usize,
}

impl RecvPhase {
    /// Whether the receive has matched a message (and waits for that message's sender only).
    #[inline]
    pub(super) fn matched(&self) -> bool {
        #[cfg(feature = "ofi")]
        if matches!(self, RecvPhase::Provider(_)) {
            return false;
        }
        !matches!(self, RecvPhase::Idle | RecvPhase::Posted { .. })
    }
}

/// A receive while it is pending (see [`RecvPhase`] for where it stands).
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
    /// Where it stands.
    pub(super) phase: RecvPhase,
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

/// Where a pending send stands: it completes once all of it is pushed into the fabric and,
/// for a synchronous or rendezvous send, the receiver has answered (SSEND_ACK or FIN). The
/// answer may come before the last packet is pushed (a synchronous send of several packets
/// is acknowledged on its first).
///
/// ```text
///   Pushing ───────── pushed ─────────────────────────────────► done
///   PushingAwaiting ─ pushed ─► Awaiting ─── answer ──────────► done
///         └────────── answer ─► PushingAnswered ─── pushed ───► done
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum SendPhase {
    /// Being pushed (waiting for ring space); nothing else is owed.
    Pushing,
    /// Being pushed, and the receiver must answer too.
    PushingAwaiting,
    /// Being pushed; the receiver already answered.
    PushingAnswered,
    /// All pushed; waits for the receiver's answer.
    Awaiting,
}

impl SendPhase {
    /// The phase of a new send: one the receiver must answer (synchronous, rendezvous) or not.
    #[inline]
    pub(super) fn new(answered: bool) -> Self {
        if answered {
            SendPhase::PushingAwaiting
        } else {
            SendPhase::Pushing
        }
    }

    /// The last packet went into the fabric: the next phase, `None` once complete.
    #[inline]
    pub(super) fn pushed(self) -> Option<Self> {
        match self {
            SendPhase::Pushing | SendPhase::PushingAnswered => None,
            SendPhase::PushingAwaiting | SendPhase::Awaiting => Some(SendPhase::Awaiting),
        }
    }

    /// The receiver answered: the next phase, `None` once complete. An answer nothing waits
    /// for changes nothing.
    #[inline]
    pub(super) fn answered(self) -> Option<Self> {
        match self {
            SendPhase::PushingAwaiting | SendPhase::PushingAnswered => Some(SendPhase::PushingAnswered),
            SendPhase::Awaiting => None,
            SendPhase::Pushing => Some(SendPhase::Pushing),
        }
    }
}

/// A send while it is pending (see [`SendPhase`] for where it stands).
pub(super) struct SendState {
    /// World rank of the destination.
    pub(super) dest: usize,
    /// The message's match key.
    pub(super) key: u64,
    /// Where it stands.
    pub(super) phase: SendPhase,
    /// A rendezvous send: its buffer (until abandoned) and its registration, held until FIN.
    pub(super) rndv: Option<RndvSend>,
}

/// What a request is.
///
/// Its tag is a byte of its own (`repr(u8)`), not a niche in [`RecvPhase`]'s tag: otherwise
/// every phase change of a receive rewrites the word that says it is a receive, which every
/// lookup of a request reads; that cost the request layer about 2% per message
/// (`comm_window_cost`).
#[repr(u8)]
pub(super) enum ReqKind {
    Recv(RecvState),
    Send(SendState),
    /// A non-blocking collective: its schedule in `Engine::nbc` (see [`Schedule`]).
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

impl Req {
    /// Whether the request owns no memory (nothing its drop would free), so that a freed slot
    /// may forget it instead of running its drop glue (see `Slab::take_if`). Every field is
    /// named, so a new one must be considered here; those not checked own nothing.
    #[inline(always)]
    pub(super) fn owns_nothing(&self) -> bool {
        const _: () = assert!(!std::mem::needs_drop::<RawBufMut>() && !std::mem::needs_drop::<Status>());
        let Req { kind, result, detached: _ } = self;
        result.is_none()
            && match kind {
                ReqKind::Recv(RecvState {
                    buf: _,
                    from,
                    src_world: _,
                    key: _,
                    refused: _,
                    cap: _,
                    phase,
                    received: _,
                    total: _,
                    source: _,
                    tag: _,
                    owned,
                }) => from.members.is_none() && !matches!(phase, RecvPhase::Tagged { rndv: Some(_) }) && owned.is_none(),
                ReqKind::Send(SendState { dest: _, key: _, phase: _, rndv }) => rndv.is_none(),
                ReqKind::Coll(_) => true,
            }
    }
}

/// The error of a request collected twice (or never started: its key names no request).
fn collected_twice() -> Error {
    Error::State("request already completed and collected".into())
}

/// How a request is named on the wire (in `app_ctx`, ACKs and read requests): its slot index
/// and the low bits of its generation.
#[inline]
pub(super) fn wire_name(k: ReqId) -> u32 {
    (k.gen() & WIRE_GEN_MASK) << WIRE_IDX_BITS | (k.idx() & WIRE_IDX_MASK)
}

impl Engine {
    /// The result of `rid` if it has completed (the slot is freed).
    #[inline(always)]
    pub(crate) fn take_if_done(&mut self, rid: ReqId) -> Option<Result<Status>> {
        self.take_if_done_boxed(rid).map(|r| r.map_err(|e| *e))
    }

    /// [`Engine::take_if_done`] with the error still boxed: two words, not a whole `Error`,
    /// for the completion of every request (`comm::finish`).
    #[inline(always)]
    pub(crate) fn take_if_done_boxed(&mut self, rid: ReqId) -> Option<std::result::Result<Status, Box<Error>>> {
        match self.st.reqs.take_if(rid, |req| req.result.take(), Req::owns_nothing) {
            Some(r) => r,
            None => Some(Err(Box::new(collected_twice()))),
        }
    }

    /// As [`Engine::take_if_done`] for a receive of unknown size: also hands over the buffer
    /// the runtime allocated for it (`None` for an empty or failed message).
    pub(crate) fn take_vec_if_done(&mut self, rid: ReqId) -> Option<Result<(Status, Option<OwnedBuf>)>> {
        let taken = self.st.reqs.take_if(
            rid,
            |req| {
                let r = req.result.take()?;
                let buf = match &mut req.kind {
                    ReqKind::Recv(RecvState { owned: Some(o), buf, .. }) => {
                        // The view goes first: nothing may write through it once the memory is gone.
                        *buf = None;
                        o.buf.take()
                    }
                    _ => None,
                };
                Some((r, buf))
            },
            Req::owns_nothing,
        );
        match taken {
            Some(t) => t.map(|(r, buf)| r.map(|st| (st, buf)).map_err(|e| *e)),
            None => Some(Err(collected_twice())),
        }
    }

    /// Frees the slot of a completed request nobody collected (the end of its scope); no
    /// effect on a request already collected. Returns whether `rid` is done (collected
    /// before, or freed now): false for a pending request, which keeps its slot.
    #[inline(always)]
    pub(crate) fn discard(&mut self, rid: ReqId) -> bool {
        !matches!(self.st.reqs.take_if(rid, |req| req.result.take(), Req::owns_nothing), Some(None))
    }

    /// Whether no request has a slot: every request ever started was collected or freed, so
    /// every handle is stale (the end of a scope then has nothing to settle).
    #[inline]
    pub(crate) fn no_requests(&self) -> bool {
        self.st.reqs.is_empty()
    }

    /// How request `rid` completed, leaving it in place: `Ok` with its status, `Err(())` when
    /// it failed or is not there (what [`Engine::take_if_done`] then hands over); `None` while
    /// it is under way.
    pub(crate) fn done_status(&self, rid: ReqId) -> Option<std::result::Result<Status, ()>> {
        match self.st.reqs.get(rid) {
            None => Some(Err(())),
            Some(r) => r.result.as_ref().map(|res| res.as_ref().map(|st| *st).map_err(|_| ())),
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
        #[cfg(feature = "ofi")]
        if let ReqKind::Recv(RecvState { phase: RecvPhase::Provider(h), .. }) = req.kind {
            self.pm_cancel(h);
            return;
        }
        let ReqKind::Recv(RecvState { phase: RecvPhase::Posted { match_id, .. }, key, .. }) = req.kind else {
            return;
        };
        if self.st.matcher.cancel(match_id, key).is_some() {
            req.result = Some(Ok(Status::cancelled_recv()));
            self.st.leave_queues(rid);
        }
        if let Err(e) = self.st.drain_cq() {
            self.st.outbox.fail(e);
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
                if let RecvPhase::Reading(k) = r.phase {
                    self.abandon_read(k);
                }
            }
            ReqKind::Send(_) => {
                // Queued data is copied: the message still goes out whole.
                for q in &mut self.out {
                    for m in q.iter_mut().filter(|m| m.req == rid) {
                        if let OutData::User(b) = &m.data {
                            m.data = OutData::Owned(b.slice(0, b.len()).to_vec());
                        }
                    }
                }
                self.abandon_rndv_send(rid);
            }
        }
    }

    /// Makes progress while `busy` holds and `peer` has not departed (abandon waits here for a
    /// single copy in flight to end). The first error met is kept for the next progress (which
    /// reports it); later ones are dropped. Returns `false`, with `busy` still holding, when
    /// progress failed [`STUCK_ERRORS`] times in a row: a stream that stays broken (a
    /// malformed record a fabric cannot step over) would otherwise keep this wait forever.
    pub(super) fn progress_while(&mut self, peer: usize, busy: impl Fn(&Engine) -> bool) -> bool {
        let mut b = self.backoff();
        let mut kept = None;
        let mut errors = 0;
        let mut ended = true;
        while busy(self) {
            match self.progress() {
                Ok(n) => {
                    errors = 0;
                    if n > 0 {
                        b.reset();
                    } else if b.snooze() {
                        if !self.dead[peer] && !self.fabric.process_alive(peer) {
                            self.dead[peer] = true;
                        }
                        if self.state_of(peer) != PeerState::Alive {
                            break;
                        }
                    }
                }
                Err(e) => {
                    // Not put back as `deferred` here: progress would return it at once, doing
                    // no work, and the wait would never end.
                    kept.get_or_insert(e);
                    errors += 1;
                    if errors >= STUCK_ERRORS {
                        ended = false;
                        break;
                    }
                }
            }
        }
        if let Some(e) = kept {
            self.st.outbox.fail(e);
        }
        ended
    }
}

impl State {
    /// Inserts a send request to world rank `dest`. A request that needs an answer (ACK or
    /// FIN) is named on the wire, which bounds how many can be outstanding.
    pub(super) fn new_send(&mut self, dest: usize, key: u64, answered: bool, rndv: Option<RndvSend>) -> Result<ReqId> {
        if answered && self.reqs.vacant_key().idx() as usize >= MAX_NAMED_REQUESTS {
            return Err(Error::State(format!(
                "more than {MAX_NAMED_REQUESTS} synchronous or rendezvous sends outstanding: complete some before starting more"
            )));
        }
        Ok(self.reqs.insert(Req {
            kind: ReqKind::Send(SendState { dest, key, phase: SendPhase::new(answered), rndv }),
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

    /// Records that send `rid` was `pushed` in full and/or `answered` (see [`SendPhase`]), and
    /// completes it when nothing more is owed.
    pub(super) fn send_progress(&mut self, rid: ReqId, pushed: bool, answered: bool) {
        let Some(req) = self.reqs.get_mut(rid) else {
            return;
        };
        if let ReqKind::Send(s) = &mut req.kind {
            if req.result.is_some() {
                return;
            }
            let mut next = Some(s.phase);
            if pushed {
                next = next.and_then(SendPhase::pushed);
            }
            if answered {
                next = next.and_then(SendPhase::answered);
            }
            match next {
                Some(p) => s.phase = p,
                None => {
                    s.rndv = None;
                    req.result = Some(Ok(Status::sent()));
                    if req.detached {
                        self.reqs.remove(rid);
                    }
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

    /// Completes matched receive `rid` with `err` (it is in no queue any more).
    pub(super) fn fail_recv(&mut self, rid: ReqId, err: Error) {
        debug_assert!(
            !matches!(self.reqs.get(rid), Some(Req { kind: ReqKind::Recv(RecvState { phase: RecvPhase::Posted { .. }, .. }), .. })),
            "a receive fails only once it left its queues"
        );
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
            req.result.get_or_insert_with(|| match failure {
                Some(e) => Err(Box::new(e)),
                None => r.outcome().map_err(Box::new),
            });
        }
        if req.detached {
            self.reqs.remove(rid);
        }
    }
}

impl RecvState {
    /// A receive into `buf` with match key `key`, waiting for `from`, in phase
    /// [`RecvPhase::Idle`] (about to be queued, or handed its message).
    pub(super) fn new(buf: RawBufMut, key: u64, from: Peers) -> Self {
        RecvState {
            cap: buf.cap(),
            buf: Some(buf),
            key,
            from,
            src_world: 0,
            refused: None,
            phase: RecvPhase::Idle,
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
    #[inline]
    pub(super) fn outcome(&self) -> Result<Status> {
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
    use std::time::{Duration, Instant};

    /// An error kept during a wait does not stop the wait's progress (it once went back as
    /// `deferred`, which the next progress returned at once without polling: the wait spun
    /// forever), and it is reported once afterwards.
    #[test]
    fn a_wait_keeps_progressing_past_an_error_and_reports_it_after() {
        let (mut a, mut b) = pair();
        let mut buf = [0u8; 4];
        let r = recv(&mut b, Some(0), Some(1), &mut buf);
        send(&mut a, 1, 1, b"ab", false);
        b.st.outbox.fail(Error::State("kept".into()));
        let t = Instant::now();
        let ended = b.progress_while(0, |e| e.st.reqs.get(r).is_some_and(|q| q.result.is_none()) && t.elapsed() < Duration::from_secs(20));
        assert!(ended);
        assert!(t.elapsed() < Duration::from_secs(20), "the wait never polled");
        assert!(b.take_if_done(r).expect("done").is_ok());
        assert!(matches!(b.progress(), Err(Error::State(m)) if m == "kept"));
        assert!(b.progress().is_ok(), "reported once");
    }

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

    /// The phase of receive `rid` of `e`.
    fn phase(e: &Engine, rid: ReqId) -> &RecvPhase {
        match e.st.reqs.get(rid) {
            Some(Req { kind: ReqKind::Recv(r), .. }) => &r.phase,
            _ => panic!("no pending receive"),
        }
    }

    /// The first `first` payload bytes of an eager message of `data` from rank 0 with `tag`,
    /// injected into rank 1 as one packet; then the rest as another.
    fn eager_in_two(a: &mut Engine, tag: u32, data: &[u8], first: usize) -> impl FnOnce(&mut Engine) {
        let tmh = Tmh { op: TmOp::Eager, app_ctx: 0, tag: super::super::testkit::key(0, tag) }.to_bytes();
        let total = (TMH_LEN + data.len()) as u64;
        let mut m = tmh.to_vec();
        m.extend_from_slice(&data[..first]);
        a.inject(1, PKT_FIRST, total, &m).expect("inject");
        let rest = data[first..].to_vec();
        move |a: &mut Engine| a.inject(1, PKT_LAST, total, &rest).expect("inject")
    }

    #[test]
    fn send_phases_complete_once_pushed_and_answered() {
        use SendPhase::*;
        // A standard send completes once pushed; an answer nothing waits for changes nothing.
        assert_eq!(SendPhase::new(false), Pushing);
        assert_eq!(Pushing.pushed(), None);
        assert_eq!(Pushing.answered(), Some(Pushing));
        // One that needs an answer: pushed then answered, or answered while still pushing.
        assert_eq!(SendPhase::new(true), PushingAwaiting);
        assert_eq!(PushingAwaiting.pushed(), Some(Awaiting));
        assert_eq!(Awaiting.answered(), None);
        assert_eq!(PushingAwaiting.answered(), Some(PushingAnswered));
        assert_eq!(PushingAnswered.pushed(), None);
        // Repeats change nothing more.
        assert_eq!(PushingAnswered.answered(), Some(PushingAnswered));
        assert_eq!(Awaiting.pushed(), Some(Awaiting));
    }

    #[test]
    fn a_synchronous_send_acknowledged_while_pushing_completes_when_pushed() {
        let (mut a, mut b) = pair();
        let data = vec![5u8; 200_000];
        let s = a.st.new_send(1, 0, true, None).expect("send");
        a.st.send_progress(s, false, true);
        assert!(matches!(a.st.reqs.get(s), Some(Req { kind: ReqKind::Send(SendState { phase: SendPhase::PushingAnswered, .. }), .. })));
        assert!(!a.is_done(s));
        a.st.send_progress(s, true, false);
        assert!(a.take_if_done(s).expect("done").is_ok());
        // The same through the engine: a synchronous send of several packets.
        let mut buf = vec![0u8; data.len()];
        let r = recv(&mut b, Some(0), Some(3), &mut buf);
        let s = send(&mut a, 1, 3, &data, true).expect("a synchronous send waits");
        settle(&mut [&mut a, &mut b]);
        assert!(b.take_if_done(r).expect("done").is_ok());
        assert!(a.take_if_done(s).expect("acknowledged").is_ok());
    }

    #[test]
    fn a_software_receive_goes_posted_filling_done() {
        let (mut a, mut b) = pair();
        let mut buf = [0u8; 16];
        let r = recv(&mut b, Some(0), Some(4), &mut buf);
        assert!(matches!(phase(&b, r), RecvPhase::Posted { hw: None, .. }), "below TMPI_TM_THRESH: software only");
        assert_eq!(b.st.offload.sw_only(), 1);
        let rest = eager_in_two(&mut a, 4, b"0123456789", 4);
        b.progress().expect("progress");
        assert!(matches!(phase(&b, r), RecvPhase::Filling));
        assert_eq!(b.st.offload.sw_only(), 0, "it left the software-only count when it matched");
        // A matched receive cannot be cancelled.
        b.cancel(r);
        assert!(!b.is_done(r));
        rest(&mut a);
        settle(&mut [&mut a, &mut b]);
        assert_eq!(b.take_if_done(r).expect("done").expect("ok").len(), 10);
        assert_eq!(&buf[..10], b"0123456789");
    }

    #[test]
    fn an_offloaded_receive_goes_posted_tagged_done() {
        let (mut a, mut b) = pair();
        let mut buf = vec![0u8; 4096];
        let r = recv(&mut b, Some(0), Some(6), &mut buf);
        assert!(matches!(phase(&b, r), RecvPhase::Posted { hw: Some(_), .. }));
        assert_eq!((b.st.offload.sw_only(), b.st.offload.tm().tags_listed()), (0, 1));
        let data: Vec<u8> = (0..3000u32).map(|i| i as u8).collect();
        let rest = eager_in_two(&mut a, 6, &data, 1000);
        b.progress().expect("progress");
        assert!(matches!(phase(&b, r), RecvPhase::Tagged { rndv: None }));
        assert_eq!(b.st.offload.tm().tags_listed(), 0, "the TM-SRQ consumed its entry");
        // It left the software queue too: another message with the same tag is unexpected.
        b.cancel(r);
        assert!(!b.is_done(r));
        rest(&mut a);
        send(&mut a, 1, 6, b"next", false);
        settle(&mut [&mut a, &mut b]);
        assert_eq!(b.take_if_done(r).expect("done").expect("ok").len(), 3000);
        assert_eq!(&buf[..3000], &data[..]);
        assert_eq!(b.st.stats.unexpected, 1);
    }

    #[test]
    fn a_rendezvous_receive_goes_posted_reading_done() {
        for tags in [Config::default().tm_max_tags, 0] {
            let mut v = super::super::testkit::job(2, Config { tm_max_tags: tags, ..Config::default() });
            let (b, a) = (&mut v.pop().expect("b"), &mut v.pop().expect("a"));
            let data = vec![9u8; 300_000];
            let mut buf = vec![0u8; data.len()];
            let r = recv(b, Some(0), Some(7), &mut buf);
            assert!(matches!(phase(b, r), RecvPhase::Posted { hw, .. } if hw.is_some() == (tags > 0)));
            let s = send(a, 1, 7, &data, false).expect("a rendezvous waits for its FIN");
            b.progress().expect("the request arrives");
            let RecvPhase::Reading(k) = *phase(b, r) else { panic!("reading") };
            assert!(b.st.reads.get(k).is_some_and(|op| op.rid == r));
            assert_eq!((b.st.offload.sw_only(), b.st.offload.tm().tags_listed()), (0, 0));
            settle(&mut [&mut *a, &mut *b]);
            assert!(b.take_if_done(r).expect("done").is_ok());
            assert!(a.take_if_done(s).expect("FIN").is_ok());
            assert!(buf == data);
        }
    }

    #[test]
    fn a_cancelled_receive_leaves_every_queue() {
        let (_a, mut b) = pair();
        let mut small = [0u8; 8];
        let mut big = vec![0u8; 4096];
        let r1 = recv(&mut b, Some(0), Some(1), &mut small);
        let r2 = recv(&mut b, Some(0), Some(2), &mut big);
        assert_eq!((b.st.offload.sw_only(), b.st.offload.tm().tags_listed()), (1, 1));
        b.cancel(r1);
        b.cancel(r2);
        assert_eq!((b.st.offload.sw_only(), b.st.offload.tm().tags_listed()), (0, 0));
        for r in [r1, r2] {
            assert!(matches!(phase(&b, r), RecvPhase::Idle));
            assert!(b.take_if_done(r).expect("cancelled").is_ok_and(|s| s.cancelled()));
        }
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
