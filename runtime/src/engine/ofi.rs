//! Point-to-point matched by the OFI provider (`TMPI_OFI_MATCHING=provider`, or `auto` on a
//! provider whose default it is): on a job whose fabric is OFI alone, messages of user
//! communicators go to the provider's tag matching (`fi_tsend`/`fi_trecv`, through
//! `tmpi_transport::ofi::OfiFabric`'s point-to-point), never through the soft TM-SRQ and the
//! software matcher.
//!
//! - **Which messages.** A match key's context says it: user contexts (even, `2 id`) below
//!   2^16, the provider tag's context field ([`by_provider`]). Collectives (odd contexts),
//!   group contexts and user contexts beyond 2^16 keep tmpi's own path over the fabric's
//!   packets. Both ends decide by the context alone, so every message of one context meets
//!   one matcher, which is what MPI's ordering and wildcards need.
//! - **What goes to the provider.** One tagged message per MPI message, tagged
//!   `(context, sender's world rank, MPI tag)`: `TMH(EAGER) | payload` up to the floor
//!   (`OfiFabric::p2p_floor`, what `ofi_rxm` sends eagerly, 16 KiB), else tmpi's rendezvous
//!   request (`TMH(RNDV) | RVH | ...`), whose data then moves by tmpi's read over the packets
//!   as it does today. Every receive posted to the provider has room for the floor, so the
//!   provider never truncates (libfabric 1.17's `ofi_rxm` stalls a connection after a
//!   truncated eager receive); MPI's truncation is found here from the TMH's length.
//! - **Receives.** A receive from one rank is a directed receive with the source in the tag;
//!   `ANY_SOURCE` ignores the source bits and `ANY_TAG` the tag bits. Its completion hands
//!   the message to the receive as software hands an unexpected message (status, copy,
//!   truncation, synchronous-send acknowledgement over the packets, the rendezvous read).
//! - **Probes.** A probe claims the oldest matching message in the provider (`FI_PEEK |
//!   FI_CLAIM`) and receives it at once (it is eager-sized, so the claimed receive needs
//!   nothing from the sender); the message is then held in the software matcher's unexpected
//!   queue, where the probe (and a matched probe, and the next receive that matches it, which
//!   looks there first) finds it: it is older than anything the provider still holds from its
//!   sender, so MPI's order is kept.
//! - **Messages to itself** go through the provider too (the rank's own address is in the
//!   address vector); a rendezvous to itself is copied from the send's buffer at match.
//! - **Cancel** is `fi_cancel` and waits for the receive's completion (cancelled, or
//!   received if a message matched first). A wait on a receive whose peers departed ends with
//!   `PeerGone` as before (`leave.rs`); abandoning the request then cancels the provider's
//!   receive. Finalize cancels every receive still posted and waits for their completions.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use super::*;

use tmpi_transport::ofi::p2p::{Delivered, Matching, TaggedP2p};
use tmpi_transport::ofi::{tag as otag, OfiFabric};
use tmpi_transport::wire::Message;

use crate::config::OfiMatching;

/// How long a cancel, a probe's claimed receive, or finalize's cancels wait for the
/// provider's completion before giving up (each is local: the provider completes them
/// without any peer).
const LOCAL_WAIT: Duration = Duration::from_secs(10);

/// Whether messages with match key `tag64` are matched by the provider (when it matches at
/// all): user contexts that fit the provider tag's context field.
#[inline(always)]
pub(super) fn by_provider(tag64: u64) -> bool {
    let ctx = matching::decode_ctx(tag64);
    ctx % 2 == 0 && ctx < 1 << otag::CTX_BITS
}

/// What a receive posted to the provider is for.
#[derive(Clone, Copy, Debug)]
enum Waiter {
    /// A receive request.
    Recv(ReqId),
    /// A probe's claimed message, to hold in software.
    Probe,
}

/// The state of matching by the provider (see the [module documentation](self)).
pub(super) struct ProvMatch {
    /// Receives posted to the provider: its handle to what waits.
    live: HashMap<u64, Waiter>,
    /// The longest message that goes to the provider whole; every receive's room.
    floor: usize,
    /// Counters of the `tmpi-ofi` line: messages sent to the provider, receives posted to
    /// it, messages it matched to a receive, messages probes claimed, receives cancelled.
    sent: u64,
    posted: u64,
    matched: u64,
    claimed: u64,
    cancelled: u64,
}

fn ofi_of(fabric: &mut AnyFabric) -> Result<&mut OfiFabric> {
    fabric.ofi_ops_mut().ok_or_else(|| Error::State("matching by the provider needs the OFI fabric alone".into()))
}

fn stuck(what: &str) -> Error {
    Error::State(format!("the OFI provider did not complete {what} within {} s", LOCAL_WAIT.as_secs()))
}

impl Engine {
    /// Chooses who matches point-to-point on a job whose fabric is OFI alone, as
    /// `TMPI_OFI_MATCHING` says (`auto`: [`Matching::default_for`] the provider), and turns
    /// matching by the provider on if chosen. Returns the matching in use, `None` on other
    /// fabrics (a hybrid job keeps software matching: shared memory and OFI carry its
    /// messages, and one matcher must see them all).
    ///
    /// # Errors
    /// [`Error::Config`] for `provider` on a provider that cannot peek (probes need
    /// `FI_PEEK`).
    pub(crate) fn choose_matching(&mut self) -> Result<Option<&'static str>> {
        let choice = self.cfg.ofi_matching;
        let Some(f) = self.fabric.ofi_ops_mut() else { return Ok(None) };
        let offer = f.endpoint().offer();
        let provider = offer.provider.clone();
        let wanted = match choice {
            Some(OfiMatching::Provider) => Matching::Provider,
            Some(OfiMatching::Software) => Matching::Software,
            None => Matching::default_for(&provider),
        };
        if wanted != Matching::Provider {
            return Ok(Some("software"));
        }
        if !offer.peek_works() {
            if choice.is_none() {
                return Ok(Some("software"));
            }
            return Err(Error::Config {
                var: "TMPI_OFI_MATCHING".into(),
                value: "provider".into(),
                expected: format!("auto or software: provider {provider} cannot peek (FI_PEEK), which probes need"),
            });
        }
        f.enable_matching();
        let floor = f.p2p_floor().unwrap_or(0);
        self.pm = Some(ProvMatch { live: HashMap::new(), floor, sent: 0, posted: 0, matched: 0, claimed: 0, cancelled: 0 });
        self.st.offload.hand_to_provider();
        Ok(Some("provider"))
    }

    /// [`Engine::start_send`] of a message the provider matches: eager up to the floor, else
    /// a rendezvous whose request goes to the provider.
    #[inline(never)]
    pub(super) fn pm_send(&mut self, dest: usize, tag64: u64, data: RawBuf, sync: bool) -> Result<Option<ReqId>> {
        let len = data.len();
        let floor = self.pm.as_ref().map_or(0, |p| p.floor);
        self.st.stats.msgs_sent += 1;
        self.st.stats.bytes_sent += len as u64;
        if TMH_LEN + len > floor || len > self.cfg.eager_limit {
            crate::seen::msg(true, dest, tag64, len, Proto::RNDV);
            let (req, (hdr, n)) = self.rndv_request(dest, tag64, data)?;
            self.pm_push(dest, tag64, hdr[..n].to_vec())?;
            return Ok(self.mark_pushed(Some(req)));
        }
        self.st.stats.eager += 1;
        crate::seen::msg(true, dest, tag64, len, if dest == self.st.rank { Proto::SELF } else { Proto::EAGER });
        let req = if sync { Some(self.st.new_send(dest, tag64, true, None)?) } else { None };
        let app_ctx = req.map_or(0, |r| SYNC_FLAG | wire_name(r));
        let mut msg = Vec::with_capacity(TMH_LEN + len);
        msg.extend_from_slice(&Tmh { op: TmOp::Eager, app_ctx, tag: tag64 }.to_bytes());
        msg.extend_from_slice(data.slice(0, len));
        self.pm_push(dest, tag64, msg)?;
        Ok(self.mark_pushed(req))
    }

    /// Hands `msg` to the provider for world rank `dest`, tagged with `tag64`'s context and
    /// MPI tag.
    fn pm_push(&mut self, dest: usize, tag64: u64, msg: Vec<u8>) -> Result<()> {
        let (ctx, tag) = (matching::decode_ctx(tag64), matching::decode_tag(tag64));
        ofi_of(&mut self.fabric)?.p2p_send(dest as u32, ctx, tag, msg)?;
        if let Some(pm) = self.pm.as_mut() {
            pm.sent += 1;
        }
        Ok(())
    }

    /// The `tmpi-ofi` line of `TMPI_STATS=1` while the provider matches: what went through
    /// its matching.
    pub(crate) fn ofi_stats_line(&self) -> Option<String> {
        let p = self.pm.as_ref()?;
        Some(format!(
            "tmpi-ofi rank={} matching=provider sent={} posted={} matched={} claimed={} cancelled={}",
            self.st.rank, p.sent, p.posted, p.matched, p.claimed, p.cancelled
        ))
    }

    /// [`Engine::post_recv`] of a receive the provider matches (`key` its match key, `tag`
    /// its MPI tag or any): takes a message a probe holds in software if one matches, else
    /// posts it to the provider.
    #[inline(never)]
    pub(super) fn pm_post(&mut self, key: (u64, u64), tag: Option<u32>, r: RecvState) -> Result<ReqId> {
        let from = r.from.one();
        let rid = self.st.reqs.insert(Req { kind: ReqKind::Recv(r), result: None, detached: false });
        if let Some((_, ux)) = self.st.matcher.take_probed(key.0, key.1) {
            self.st.take_unexpected(rid, ux);
            self.flush_ctl()?;
            return Ok(rid);
        }
        let floor = self.pm.as_ref().map_or(0, |p| p.floor);
        let ctx = matching::decode_ctx(key.0);
        let posted = ofi_of(&mut self.fabric).and_then(|f| Ok(f.post_recv(ctx, from.map(|w| w as u32), tag, floor)?));
        let h = match posted {
            Ok(h) => h,
            Err(e) => {
                self.st.reqs.remove(rid);
                return Err(e);
            }
        };
        if let Some(Req { kind: ReqKind::Recv(r), .. }) = self.st.reqs.get_mut(rid) {
            r.phase = RecvPhase::Provider(h);
        }
        if let Some(pm) = self.pm.as_mut() {
            pm.live.insert(h, Waiter::Recv(rid));
            pm.posted += 1;
        }
        Ok(rid)
    }

    /// Hands what the provider completed to its receives; returns how many operations
    /// completed. With `read` false, only what the packets' poll just read (the round of
    /// progress polled them first).
    pub(super) fn pm_progress(&mut self, read: bool) -> Result<usize> {
        let (Some(pm), Some(f)) = (self.pm.as_mut(), self.fabric.ofi_ops_mut()) else { return Ok(0) };
        let st = &mut self.st;
        let mut failure = None;
        let n = f.p2p_progress(read, |h, d| {
            if let Err(e) = pm.deliver(st, h, d) {
                failure.get_or_insert(e);
            }
        })?;
        match failure {
            Some(e) => Err(e),
            None => Ok(n),
        }
    }

    /// Progresses until the provider's receive `h` completed, for at most [`LOCAL_WAIT`].
    fn pm_settle(&mut self, h: u64, what: &str) -> Result<()> {
        let deadline = Instant::now() + LOCAL_WAIT;
        while self.pm.as_ref().is_some_and(|p| p.live.contains_key(&h)) {
            if self.pm_progress(true)? == 0 {
                if Instant::now() > deadline {
                    return Err(stuck(what));
                }
                std::thread::yield_now();
            }
        }
        Ok(())
    }

    /// Cancels receive `rid`, posted to the provider as `h`, and waits for its completion.
    pub(super) fn pm_cancel(&mut self, h: u64) {
        let r = ofi_of(&mut self.fabric).and_then(|f| Ok(f.cancel(h)?)).and_then(|()| self.pm_settle(h, "a cancel"));
        if let Err(e) = r {
            self.st.outbox.fail(e);
        }
    }

    /// Before a probe on context `ctx` in the provider's hands: if no message a probe holds
    /// matches, claims the oldest the provider has for `(from, tag)` and holds it in
    /// software (see the [module documentation](self)). Failures are kept for the next
    /// progress.
    pub(super) fn pm_fetch(&mut self, ctx: u32, src: Option<u32>, tag: Option<u32>, from: &Peers) {
        let (t, m) = matching::recv_key(ctx, src, tag);
        if self.st.matcher.probe(t, m).is_some() {
            return;
        }
        if let Err(e) = self.pm_claim(ctx, tag, from) {
            self.st.outbox.fail(e);
        }
    }

    fn pm_claim(&mut self, ctx: u32, tag: Option<u32>, from: &Peers) -> Result<()> {
        let floor = self.pm.as_ref().map_or(0, |p| p.floor);
        let f = ofi_of(&mut self.fabric)?;
        let Some(m) = f.improbe(ctx, from.one().map(|w| w as u32), tag)? else { return Ok(()) };
        let h = f.mrecv(m, floor)?;
        if let Some(pm) = self.pm.as_mut() {
            pm.live.insert(h, Waiter::Probe);
            pm.claimed += 1;
        }
        self.pm_settle(h, "a probe's claimed receive")
    }

    /// Finalize: cancels every receive still posted to the provider and waits (at most
    /// [`LOCAL_WAIT`]) for their completions, so no buffer stays with it, and for this
    /// rank's sends to leave: a send still queued, or in the provider while its connection
    /// is set up (`ofi_rxm` connects on the first send to a peer), would be lost when the
    /// process exits. A send that does not complete in that time (its peer gone) is given up.
    pub(super) fn pm_drain(&mut self) -> Result<()> {
        let Ok(f) = ofi_of(&mut self.fabric) else { return Ok(()) };
        for h in f.p2p_live() {
            f.cancel(h)?;
        }
        let deadline = Instant::now() + LOCAL_WAIT;
        loop {
            let (recvs, sends) = ofi_of(&mut self.fabric).map(|f| (f.p2p_live().len(), f.p2p_sends_pending())).unwrap_or((0, 0));
            if recvs + sends == 0 {
                return Ok(());
            }
            if self.pm_progress(true)? == 0 {
                if Instant::now() > deadline {
                    return if recvs > 0 { Err(stuck("finalize's cancels")) } else { Ok(()) };
                }
                std::thread::yield_now();
            }
        }
    }
}

impl ProvMatch {
    /// The provider finished receive `h` with `d`.
    fn deliver(&mut self, st: &mut State, h: u64, d: Delivered<'_>) -> Result<()> {
        let Some(w) = self.live.remove(&h) else { return Ok(()) };
        match (w, d) {
            (Waiter::Recv(rid), Delivered::Cancelled) => {
                self.cancelled += 1;
                st.pm_cancelled(rid);
                Ok(())
            }
            (Waiter::Probe, Delivered::Cancelled) => Ok(()),
            (w, Delivered::Msg { tag, data, truncated, .. }) => {
                let src = otag::fields(tag).2 as usize;
                if truncated {
                    return Err(malformed_from(src, "a message longer than the OFI floor"));
                }
                match w {
                    Waiter::Recv(rid) => {
                        self.matched += 1;
                        st.pm_take(rid, src, data)
                    }
                    Waiter::Probe => st.pm_hold(src, data),
                }
            }
        }
    }
}

impl State {
    /// Receive `rid` was cancelled in the provider before a message matched it.
    fn pm_cancelled(&mut self, rid: ReqId) {
        let Some(req) = self.reqs.get_mut(rid) else { return };
        if let ReqKind::Recv(r) = &mut req.kind {
            r.phase = RecvPhase::Idle;
        }
        req.result.get_or_insert(Ok(Status::cancelled_recv()));
        if req.detached {
            self.reqs.remove(rid);
        }
    }

    /// The provider matched message `data` from world rank `src` to receive `rid`.
    fn pm_take(&mut self, rid: ReqId, src: usize, data: &[u8]) -> Result<()> {
        if let Some(Req { kind: ReqKind::Recv(r), .. }) = self.reqs.get_mut(rid) {
            r.phase = RecvPhase::Idle;
        }
        match Message::parse(data).map_err(|_| malformed_from(src, "a message with a malformed header"))? {
            Message::Eager(tmh, payload) => {
                self.pm_take_eager(rid, src, tmh, payload);
                Ok(())
            }
            Message::Rndv(..) => {
                let info = RndvInfo::parse(data)?;
                self.stats.msgs_recv += 1;
                self.stats.bytes_recv += info.len as u64;
                self.pm_take_rndv(rid, src, info)
            }
            _ => Err(malformed_from(src, "a control message among provider-matched messages")),
        }
    }

    /// [`State::pm_take`] of an eager message: what software does with a whole message
    /// that matched a posted receive, without the credit (the provider has its own flow
    /// control).
    fn pm_take_eager(&mut self, rid: ReqId, src: usize, tmh: Tmh, payload: &[u8]) {
        self.stats.msgs_recv += 1;
        self.stats.bytes_recv += payload.len() as u64;
        crate::seen::msg(false, src, tmh.tag, payload.len(), Proto::EAGER | Proto::OFFLOADED);
        self.size_owned(rid, payload.len());
        if !self.admits(rid, tmh.tag, src) {
            self.fail_recv(rid, malformed_from(src, "a message under another rank's name"));
            return;
        }
        if tmh.app_ctx & SYNC_FLAG != 0 {
            self.outbox.control(src, Control::SsendAck { name: tmh.app_ctx & !SYNC_FLAG });
        }
        if let Some(Req { kind: ReqKind::Recv(r), .. }) = self.reqs.get_mut(rid) {
            r.src_world = src;
            r.source = src_of(tmh.tag);
            r.tag = tag_of(tmh.tag);
            r.total = payload.len();
            r.received = r.buf.as_ref().map_or(0, |b| b.write_at(0, payload));
        }
        self.complete_recv(rid);
    }

    /// A rendezvous request from `src` matched receive `rid`: read it (or copy it, from this
    /// rank itself).
    pub(super) fn pm_take_rndv(&mut self, rid: ReqId, src: usize, info: RndvInfo) -> Result<()> {
        self.size_owned(rid, info.len);
        if !self.admits(rid, info.tmh.tag, src) {
            self.fail_recv(rid, malformed_from(src, "a message under another rank's name"));
            return Ok(());
        }
        crate::seen::msg(false, src, info.tmh.tag, info.len, Proto::RNDV | Proto::OFFLOADED);
        if src == self.rank {
            return self.self_rndv(rid, info);
        }
        self.start_read(rid, src, info, None)
    }

    /// A rendezvous this rank sent itself: copied from the send's buffer, which completes
    /// the send as its FIN would.
    fn self_rndv(&mut self, rid: ReqId, info: RndvInfo) -> Result<()> {
        let k = self.named_send(info.tmh.app_ctx, self.rank).ok_or_else(|| malformed_from(self.rank, "a rendezvous of no send"))?;
        let data = self.rndv_send_ref(k).and_then(|s| s.buf).map(|b| b.slice(0, b.len()).to_vec());
        let Some(data) = data else {
            self.fail_recv(rid, Error::State("a rendezvous to itself whose send was abandoned".into()));
            self.send_progress(k, false, true);
            return Ok(());
        };
        if let Some(Req { kind: ReqKind::Recv(r), .. }) = self.reqs.get_mut(rid) {
            r.src_world = self.rank;
            r.source = src_of(info.tmh.tag);
            r.tag = tag_of(info.tmh.tag);
            r.total = info.len;
            r.received = r.buf.as_ref().map_or(0, |b| b.write_at(0, &data));
        }
        self.complete_recv(rid);
        self.send_progress(k, false, true);
        Ok(())
    }

    /// A probe claimed message `data` from world rank `src`: it waits in the software
    /// matcher's unexpected queue (no receive is queued there on a provider context).
    fn pm_hold(&mut self, src: usize, data: &[u8]) -> Result<()> {
        let u = match Message::parse(data).map_err(|_| malformed_from(src, "a message with a malformed header"))? {
            Message::Eager(tmh, payload) => {
                let ack = (tmh.app_ctx & SYNC_FLAG != 0).then_some((src, tmh.app_ctx & !SYNC_FLAG));
                let total = payload.len();
                UxMsg { src_world: src, tag64: tmh.tag, total, data: payload.to_vec(), complete: true, ack, rndv: None }
            }
            Message::Rndv(..) => {
                let info = RndvInfo::parse(data)?;
                UxMsg {
                    src_world: src,
                    tag64: info.tmh.tag,
                    total: info.len,
                    data: Vec::new(),
                    complete: false,
                    ack: None,
                    rndv: Some(info),
                }
            }
            _ => return Err(malformed_from(src, "a control message among provider-matched messages")),
        };
        self.stats.msgs_recv += 1;
        self.stats.bytes_recv += u.total as u64;
        self.stats.unexpected += 1;
        let key = self.ux.vacant_key();
        match self.matcher.arrive(u.tag64, key) {
            Arrived::Unexpected => {
                self.ux.insert(u);
                Ok(())
            }
            Arrived::Matched(..) => Err(Error::State("a receive queued in software on a context the provider matches".into())),
        }
    }
}
