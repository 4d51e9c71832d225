//! Posting receives (and the offload decision) and probing the unexpected queue.

use super::*;

impl Engine {
    /// Posts a receive into `buf` on context `ctx`; `from` says whom it waits for in world
    /// ranks (`src` is the same source in the communicator's numbering).
    #[inline]
    pub(crate) fn post_recv(&mut self, ctx: u32, src: Option<u32>, tag: Option<u32>, buf: RawBufMut, from: Peers) -> Result<ReqId> {
        let cap = buf.cap();
        let key = matching::recv_key(ctx, src, tag);
        #[cfg(feature = "ofi")]
        if self.st.offload.by_provider() && ofi::by_provider(key.0) {
            return self.pm_post(key, tag, RecvState::new(buf, key.0, from));
        }
        // The receive is built inside the slot's closure, here, and not handed to a shared
        // helper (as `RecvState` by value: posting took 35 ns; as a closure: 16.4 ns, against
        // 13.8 so, `comm_window_cost_8b`): either way the compiler copies it through the stack
        // with 16-byte loads over its 8-byte stores, which stall. `post_recv_vec` repeats
        // these lines for that reason.
        let st = &mut self.st;
        let offload = st.may_offload(src.is_some(), key, cap, false);
        let (rid, req) =
            st.reqs.insert_mut(|| Req { kind: ReqKind::Recv(RecvState::new(buf, key.0, from)), result: None, detached: false });
        let posted = st.matcher.post(key.0, key.1, rid);
        if let (Posted::Queued(id), ReqKind::Recv(r)) = (&posted, &mut req.kind) {
            r.phase = RecvPhase::Posted { match_id: *id, hw: None };
        }
        self.posted(posted, key, rid, cap, offload)
    }

    /// Posts a receive of unknown size for elements of `elem` bytes aligned to `align`: its
    /// buffer is allocated when it matches (see `State::size_owned`), and it never goes to the
    /// TM-SRQ (a tagged buffer needs its memory up front).
    pub(crate) fn post_recv_vec(
        &mut self,
        ctx: u32,
        src: Option<u32>,
        tag: Option<u32>,
        elem: usize,
        align: usize,
        from: Peers,
    ) -> Result<ReqId> {
        let key = matching::recv_key(ctx, src, tag);
        let mut r = RecvState::new(RawBufMut::empty(), key.0, from);
        r.owned = Some(Box::new(OwnedRecv { elem, align, buf: None, failed: false }));
        #[cfg(feature = "ofi")]
        if self.st.offload.by_provider() && ofi::by_provider(key.0) {
            return self.pm_post(key, tag, r);
        }
        let st = &mut self.st;
        let offload = st.may_offload(src.is_some(), key, 0, true);
        let (rid, req) = st.reqs.insert_mut(|| Req { kind: ReqKind::Recv(r), result: None, detached: false });
        let posted = st.matcher.post(key.0, key.1, rid);
        if let (Posted::Queued(id), ReqKind::Recv(r)) = (&posted, &mut req.kind) {
            r.phase = RecvPhase::Posted { match_id: *id, hw: None };
        }
        self.posted(posted, key, rid, 0, offload)
    }

    /// Finishes posting the receive in slot `rid` that the software matcher just took
    /// (`posted`; when queued, the caller has set its phase to `Posted` through the reference
    /// the insertion lent, rather than by a second lookup): hands it the unexpected message it
    /// matched, or lists it in the TM-SRQ too when `offload` (see [`State::may_offload`]).
    #[inline(always)]
    fn posted(&mut self, posted: Posted<ReqId, Key>, (t, m): (u64, u64), rid: ReqId, cap: usize, offload: bool) -> Result<ReqId> {
        let st = &mut self.st;
        match posted {
            Posted::Matched(rid, ux) => {
                st.take_unexpected(rid, ux);
                self.flush_ctl()?;
            }
            Posted::Queued(id) => {
                let handle = if offload { st.offload_recv(t, m, rid, cap)? } else { None };
                match handle {
                    Some(h) => {
                        if let Some(Req { kind: ReqKind::Recv(r), .. }) = st.reqs.get_mut(rid) {
                            r.phase = RecvPhase::Posted { match_id: id, hw: Some(h) };
                        }
                    }
                    None => st.offload.posted_sw_only(),
                }
                st.settle_cq()?;
            }
        }
        Ok(rid)
    }

    /// [`Engine::mprobe_now`] of a communicator whose members `from` names (world ranks):
    /// over the OFI provider's matching, the message is first claimed from the provider.
    pub(crate) fn mprobe_at(&mut self, ctx: u32, src: Option<u32>, tag: Option<u32>, _from: &Peers) -> Option<(Status, Key)> {
        #[cfg(feature = "ofi")]
        if self.st.offload.by_provider() && ofi::by_provider(matching::encode_tag(ctx, 0, 0)) {
            self.pm_fetch(ctx, src, tag, _from);
        }
        self.mprobe_now(ctx, src, tag)
    }

    /// [`Engine::probe_now`] of a communicator whose members `from` names (world ranks):
    /// over the OFI provider's matching, the message is first claimed from the provider.
    pub(crate) fn probe_at(&mut self, ctx: u32, src: Option<u32>, tag: Option<u32>, _from: &Peers) -> Option<Status> {
        #[cfg(feature = "ofi")]
        if self.st.offload.by_provider() && ofi::by_provider(matching::encode_tag(ctx, 0, 0)) {
            self.pm_fetch(ctx, src, tag, _from);
        }
        self.probe_now(ctx, src, tag)
    }

    /// Matched probe: removes the oldest unexpected message matching from the matcher (no
    /// receive can take it any more) and returns its status and handle for [`Engine::mrecv`].
    pub(crate) fn mprobe_now(&mut self, ctx: u32, src: Option<u32>, tag: Option<u32>) -> Option<(Status, Key)> {
        let (t, m) = matching::recv_key(ctx, src, tag);
        let (tag64, k) = self.st.matcher.take_probed(t, m)?;
        let len = self.st.ux.get(k).map_or(0, |u| u.total);
        Some((Status::received(src_of(tag64), tag_of(tag64), len), k))
    }

    /// Receives the message `ux` that [`Engine::mprobe_now`] took into `buf`.
    pub(crate) fn mrecv(&mut self, ux: Key, buf: RawBufMut, from: Peers) -> Result<ReqId> {
        let Some(key) = self.st.ux.get(ux).map(|u| u.tag64) else {
            return Err(Error::State("the probed message was already received".into()));
        };
        let rid = self.post_recv_detached(key, buf, from);
        self.st.take_unexpected(rid, ux);
        self.flush_ctl()?;
        Ok(rid)
    }

    /// A receive request that is in no queue (it is given its message directly).
    fn post_recv_detached(&mut self, key: u64, buf: RawBufMut, from: Peers) -> ReqId {
        self.st.reqs.insert(Req { kind: ReqKind::Recv(RecvState::new(buf, key, from)), result: None, detached: false })
    }

    /// Status of the oldest unexpected message matching, if any (no progress).
    pub(crate) fn probe_now(&self, ctx: u32, src: Option<u32>, tag: Option<u32>) -> Option<Status> {
        let (t, m) = matching::recv_key(ctx, src, tag);
        self.st.matcher.probe(t, m).map(|(tag64, &k)| {
            let len = self.st.ux.get(k).map_or(0, |u| u.total);
            Status::received(src_of(tag64), tag_of(tag64), len)
        })
    }
}

impl State {
    /// Whether a receive about to be posted (not yet in the matcher) goes to the TM-SRQ too:
    /// the policy allows it, and no earlier software-only receive overlaps it (the hardware
    /// would serve it first). A receive of `RVH_LEN_IN_META` bytes or more stays in software:
    /// the RVH cannot say how long a message that size is, so the hardware must never serve
    /// one.
    #[inline(always)]
    fn may_offload(&self, from_one: bool, (t, m): (u64, u64), cap: usize, owned: bool) -> bool {
        self.offload.eligible(from_one, cap, owned) && !(self.offload.sw_only() > 0 && self.matcher.earlier_posted_overlaps(t, m))
    }
}
