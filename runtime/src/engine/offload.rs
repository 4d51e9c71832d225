//! The glue to the soft TM-SRQ: tagged buffers it fills, its completions, SRQ buffers and
//! the phase synchronisation of the unexpected count.

use super::*;

/// SRQ buffers kept posted; each unexpected message takes one and software reposts it.
const SRQ_DEPTH: usize = 64;
/// Capacity of each SRQ buffer: unexpected messages are copied into memory software
/// allocates per message, so the modelled buffer never truncates.
const SRQ_BUF_LEN: usize = usize::MAX / 4;
/// Software syncs the TM-SRQ at least once every this many unexpected messages.
const FORCED_SYNC_EVERY: u32 = 1 << 14;

/// The offload stage: this rank's soft TM-SRQ, and what software keeps to drive it (UCX's
/// policy: which receives it lists, the unexpected count it reports with every operation, the
/// syncs it owes).
pub(super) struct Offload {
    /// This rank's soft TM-SRQ: every arriving packet passes through it.
    tm: TmSrq,
    /// Offload is on (`TMPI_TM_MAX_TAGS > 0`).
    on: bool,
    /// `TMPI_TM_MAX_TAGS`.
    max_tags: usize,
    /// `TMPI_TM_THRESH`.
    thresh: usize,
    /// Unexpected messages software has handled (reported to the TM-SRQ, low 16 bits used).
    sw_unexp: u32,
    /// A SYNC is owed to the TM-SRQ.
    need_sync: bool,
    /// Next SRQ buffer `wr_id`.
    srq_wr: u64,
    /// Next op `wr_id`.
    op_wr: u64,
    /// Receives queued in software but not in the tag list.
    sw_only_posted: usize,
    /// The OFI provider, not this TM-SRQ, matches user contexts' point-to-point (see `ofi`).
    #[cfg(feature = "ofi")]
    by_provider: bool,
}

impl Offload {
    /// The TM-SRQ of `cfg` (its tag list as long as `TMPI_TM_MAX_TAGS`, at least one entry),
    /// with [`SRQ_DEPTH`] SRQ buffers posted.
    pub(super) fn new(cfg: &Config) -> Result<Self> {
        let tags = cfg.tm_max_tags.max(1);
        let caps = TmCaps { max_num_tags: tags.max(TmCaps::default().max_num_tags), ..TmCaps::default() };
        let mut tm = TmSrq::with_caps(caps, TmCap { max_num_tags: tags, max_ops: 1024, max_wr: SRQ_DEPTH as u32 })
            .map_err(tmpi_transport::Error::from)?;
        for wr in 0..SRQ_DEPTH as u64 {
            tm.post_srq_recv(wr, SRQ_BUF_LEN).map_err(tmpi_transport::Error::from)?;
        }
        Ok(Offload {
            tm,
            on: cfg.tm_max_tags > 0,
            max_tags: cfg.tm_max_tags as usize,
            thresh: cfg.tm_thresh,
            sw_unexp: 0,
            need_sync: false,
            srq_wr: SRQ_DEPTH as u64,
            op_wr: 0,
            sw_only_posted: 0,
            #[cfg(feature = "ofi")]
            by_provider: false,
        })
    }

    /// Whether the OFI provider matches user contexts' point-to-point (the engine's `ofi`
    /// stage decides which messages that covers).
    #[cfg(feature = "ofi")]
    #[inline(always)]
    pub(super) fn by_provider(&self) -> bool {
        self.by_provider
    }

    /// From now on the OFI provider matches user contexts' point-to-point.
    #[cfg(feature = "ofi")]
    pub(super) fn hand_to_provider(&mut self) {
        self.by_provider = true;
    }

    /// The TM-SRQ.
    #[inline(always)]
    pub(super) fn tm(&self) -> &TmSrq {
        &self.tm
    }

    /// The TM-SRQ, to drive (arrivals, reads it asked for).
    #[inline(always)]
    pub(super) fn tm_mut(&mut self) -> &mut TmSrq {
        &mut self.tm
    }

    /// Whether the policy lets a receive go to the tag list: offload is on, it names its
    /// source, it is at least `TMPI_TM_THRESH` bytes and its buffer is its own, the RVH can
    /// say how long a message that fits it is, and the list has room.
    #[inline(always)]
    pub(super) fn eligible(&self, from_one: bool, cap: usize, owned: bool) -> bool {
        self.on && !owned && from_one && cap >= self.thresh && cap < RVH_LEN_IN_META as usize && self.tm.tags_listed() < self.max_tags
    }

    /// Receives queued in software but not in the tag list.
    #[inline(always)]
    pub(super) fn sw_only(&self) -> usize {
        self.sw_only_posted
    }

    /// A receive was queued in software alone.
    #[inline(always)]
    pub(super) fn posted_sw_only(&mut self) {
        self.sw_only_posted += 1;
    }

    /// A receive queued in software alone left its queue.
    #[inline(always)]
    pub(super) fn left_sw_only(&mut self) {
        self.sw_only_posted -= 1;
    }

    /// Unexpected messages software has handled.
    #[cfg(test)]
    pub(super) fn sw_unexp(&self) -> u32 {
        self.sw_unexp
    }
}

/// The error of an SRQ receive that could not be posted.
#[cold]
#[inline(never)]
fn srq_error(e: tmpi_transport::tm::TmErrno) -> Error {
    Error::Transport(e.into())
}

/// A request handle as a verbs `recv_wr_id`.
#[inline]
pub(super) fn rid_to_wr(k: ReqId) -> u64 {
    u64::from(k.gen()) << 32 | u64::from(k.idx())
}

#[inline]
pub(super) fn wr_to_rid(wr: u64) -> ReqId {
    Key::new(wr as u32, (wr >> 32) as u32)
}

impl State {
    /// The TM-SRQ matched receive `rid` to the message from `src` whose first packet it just
    /// placed in the receive's tagged buffer: the receive is [`RecvPhase::Tagged`] and leaves
    /// the software queue (its MATCH completion, handled next, finds it there). A rendezvous
    /// request (`rndv`) is kept, in case the buffer is too small (RNDV_INCOMPLETE) and
    /// software has to read.
    pub(super) fn tm_took(&mut self, rid: ReqId, src: usize, rndv: Option<&[u8]>) {
        let Some(Req { kind: ReqKind::Recv(r), .. }) = self.reqs.get_mut(rid) else { return };
        let rndv = rndv.map(|req| {
            let mut bytes = [0u8; 64];
            let len = req.len().min(64);
            bytes[..len].copy_from_slice(&req[..len]);
            Box::new(PlacedRndv { bytes, len })
        });
        r.src_world = src;
        if let RecvPhase::Posted { match_id, .. } = std::mem::replace(&mut r.phase, RecvPhase::Tagged { rndv }) {
            self.matcher.cancel(match_id, r.key);
        }
    }

    /// Lists receive `rid` (tag `t`, mask `m`, a buffer of `cap` bytes) in the TM-SRQ: an ADD,
    /// whose completion, when it is the next to poll, is handled here at once. Returns the
    /// entry's handle, or `None` when the list or the op queue is full (ENOMEM): the receive
    /// then stays with software alone. Out of line, so that the posting of a receive too small
    /// to offload stays short enough to inline into `irecv`.
    #[inline(never)]
    pub(super) fn offload_recv(&mut self, t: u64, m: u64, rid: ReqId, cap: usize) -> Result<Option<u32>> {
        self.offload.op_wr += 1;
        let wr = OpsWr::add(self.offload.op_wr, t, m, rid_to_wr(rid), cap, self.offload.sw_unexp, true);
        match self.offload.tm.post_srq_op_polled(&wr) {
            Ok((h, wc)) => {
                if let Some(wc) = wc {
                    self.on_op_wc(&wc)?;
                }
                Ok(h)
            }
            Err(_) => Ok(None),
        }
    }

    /// The TM-SRQ matched a packet to a tagged buffer: the NIC's copy into the user buffer,
    /// with non-temporal stores when `around_cache` (see [`EAGER_NT_MIN`]).
    pub(super) fn place_tagged(&mut self, rid: ReqId, off: usize, bytes: &[u8], around_cache: bool) {
        if let Some(Req { kind: ReqKind::Recv(r), .. }) = self.reqs.get_mut(rid) {
            if let Some(b) = r.buf.as_ref().filter(|_| r.refused.is_none()) {
                if around_cache {
                    b.fill_with(off, bytes.len(), |dst| tmpi_transport::shm::copy_streaming(dst, bytes));
                } else {
                    b.write_at(off, bytes);
                }
            }
        }
    }

    /// A receive the software matcher no longer holds (it matched there, or was cancelled):
    /// takes it out of the software-only count or the tag list; it is [`RecvPhase::Idle`].
    pub(super) fn leave_queues(&mut self, rid: ReqId) {
        let Some(Req { kind: ReqKind::Recv(r), .. }) = self.reqs.get_mut(rid) else {
            return;
        };
        let RecvPhase::Posted { hw, .. } = std::mem::replace(&mut r.phase, RecvPhase::Idle) else {
            return;
        };
        if let Some(h) = hw {
            self.offload.op_wr += 1;
            // The entry is still listed (a consumed entry would have completed already), so
            // the DEL succeeds; a TM_ERR completion is tolerated regardless (`on_op_wc`).
            if let Ok((_, Some(wc))) = self.offload.tm.post_srq_op_polled(&OpsWr::del(self.offload.op_wr, h, self.offload.sw_unexp, true)) {
                if let Err(e) = self.on_op_wc(&wc) {
                    self.outbox.fail(e);
                }
            }
        } else {
            self.offload.sw_only_posted -= 1;
        }
    }

    /// Gives the SRQ a fresh buffer for the one a message took (inline: once per message
    /// the TM-SRQ delivers unexpected; the error, which needs the whole `Error`, out of line).
    #[inline(always)]
    pub(super) fn repost_srq(&mut self) -> Result<()> {
        self.offload.srq_wr += 1;
        match self.offload.tm.post_srq_recv(self.offload.srq_wr, SRQ_BUF_LEN) {
            Ok(()) => Ok(()),
            Err(e) => Err(srq_error(e)),
        }
    }

    /// The completion of a message the TM-SRQ delivered unexpected: software counts it
    /// (asking for a sync when the hardware wants one, or every [`FORCED_SYNC_EVERY`]) and
    /// gives the SRQ a fresh buffer.
    #[inline(always)]
    pub(super) fn on_unexpected_wc(&mut self, wc: &Wc) -> Result<()> {
        self.offload.sw_unexp = self.offload.sw_unexp.wrapping_add(1);
        if self.offload.sw_unexp % FORCED_SYNC_EVERY == 0 || wc.flags.contains(WcFlags::TM_SYNC_REQ) {
            self.offload.need_sync = true;
        }
        self.repost_srq()
    }

    /// [`State::drain_cq`] when there may be something to drain (a completion, a transmit,
    /// or a pending sync); nothing otherwise.
    #[inline]
    pub(super) fn settle_cq(&mut self) -> Result<()> {
        if self.offload.need_sync || !self.offload.tm.quiet() {
            self.drain_cq()
        } else {
            Ok(())
        }
    }

    /// Consumes the TM-SRQ's completions.
    pub(super) fn drain_cq(&mut self) -> Result<()> {
        loop {
            while let Some(wc) = self.offload.tm.poll_cq() {
                match wc.opcode {
                    WcOpcode::TmRecv if wc.is_unexpected() => self.on_unexpected_wc(&wc)?,
                    WcOpcode::TmNoTag => self.repost_srq()?,
                    WcOpcode::TmRecv => self.on_hw_completion(&wc),
                    WcOpcode::TmAdd | WcOpcode::TmDel | WcOpcode::TmSync => self.on_op_wc(&wc)?,
                }
            }
            // Sync once software has caught up with every unexpected message the TM-SRQ
            // delivered, so that the SYNC brings the counts level.
            self.take_transmits();
            if self.offload.need_sync && self.offload.tm.hw_unexpected_cnt() == self.offload.sw_unexp as u16 {
                self.offload.need_sync = false;
                self.stats.tm_syncs += 1;
                self.offload.op_wr += 1;
                self.offload
                    .tm
                    .post_srq_op(&OpsWr::sync(self.offload.op_wr, self.offload.sw_unexp, true))
                    .map_err(|e| Error::Transport(e.into()))?;
                continue;
            }
            return Ok(());
        }
    }

    /// Queues what the TM-SRQ has to transmit (the FINs of the reads it completed).
    pub(super) fn take_transmits(&mut self) {
        while let Some(t) = self.offload.tm.poll_transmit() {
            self.outbox.fin(t.dst as usize, &t.msg);
        }
    }

    /// The completion of a list operation (ADD, DEL, SYNC).
    #[inline]
    pub(super) fn on_op_wc(&mut self, wc: &Wc) -> Result<()> {
        if wc.flags.contains(WcFlags::TM_SYNC_REQ) {
            self.offload.need_sync = true;
        }
        match wc.status {
            WcStatus::Success => Ok(()),
            // A DEL that raced a consumption: the receive completes on its own.
            WcStatus::TmErr if wc.opcode == WcOpcode::TmDel => Ok(()),
            st => Err(Error::State(format!("TM-SRQ op failed: {st:?}"))),
        }
    }

    /// A tagged-buffer completion: MATCH (the receive is taken) and/or DATA_VALID (done).
    pub(super) fn on_hw_completion(&mut self, wc: &Wc) {
        let rid = wr_to_rid(wc.wr_id);
        if wc.flags.contains(WcFlags::TM_MATCH) {
            self.on_tm_match(rid, wc);
        }
        if wc.flags.contains(WcFlags::TM_DATA_VALID) && wc.status == WcStatus::TmRndvIncomplete {
            self.on_rndv_incomplete(rid, wc);
            return;
        }
        if wc.flags.contains(WcFlags::TM_DATA_VALID) {
            self.on_data_valid(rid, wc);
        }
    }

    /// MATCH: receive `rid` took a message in the TM-SRQ; it leaves the software queue, and a
    /// synchronous send is acknowledged.
    #[inline(always)]
    fn on_tm_match(&mut self, rid: ReqId, wc: &Wc) {
        let (tag64, app_ctx) = wc.read_tm_info().unwrap_or((0, 0));
        let mut cancel = None;
        let src = wc.src as usize;
        let admitted = self.admits(rid, tag64, src);
        if let Some(Req { kind: ReqKind::Recv(r), .. }) = self.reqs.get_mut(rid) {
            r.src_world = src;
            if !admitted {
                r.refused = Some(src);
            }
            r.source = src_of(tag64);
            r.tag = tag_of(tag64);
            // Normally the first packet's placement made it `Tagged` already (see
            // `tm_took`); a rendezvous the TM-SRQ reads is `Reading`.
            if let RecvPhase::Posted { match_id, .. } = r.phase {
                r.phase = RecvPhase::Tagged { rndv: None };
                cancel = Some((match_id, r.key));
            }
        }
        if let Some((id, key)) = cancel {
            self.matcher.cancel(id, key);
        }
        self.stats.msgs_recv += 1;
        if app_ctx & SYNC_FLAG != 0 && admitted {
            self.outbox.control(src, Control::SsendAck { name: app_ctx & !SYNC_FLAG });
        }
    }

    /// RNDV_INCOMPLETE: the tagged buffer of `rid` was smaller than the rendezvous, and
    /// software finishes (reads what the receive holds).
    #[cold]
    fn on_rndv_incomplete(&mut self, rid: ReqId, wc: &Wc) {
        let (stash, refused) = match self.reqs.get_mut(rid) {
            Some(Req { kind: ReqKind::Recv(r), .. }) => match &mut r.phase {
                RecvPhase::Tagged { rndv } => (rndv.take(), r.refused),
                _ => (None, r.refused),
            },
            _ => (None, None),
        };
        if let Some(src) = refused {
            self.fail_recv(rid, malformed_from(src, "a message under another rank's name"));
            return;
        }
        let r = match stash {
            Some(s) => RndvInfo::parse(&s.bytes[..s.len]).and_then(|info| self.start_read(rid, wc.src as usize, info, None)),
            None => Err(malformed("RNDV_INCOMPLETE without the request")),
        };
        if let Err(e) = r {
            self.outbox.fail(e);
        }
    }

    /// DATA_VALID: receive `rid` is complete in its tagged buffer (or failed there).
    #[inline(always)]
    fn on_data_valid(&mut self, rid: ReqId, wc: &Wc) {
        let len = wc.byte_len as usize;
        self.stats.bytes_recv += len as u64;
        let Some(Req { kind: ReqKind::Recv(r), .. }) = self.reqs.get_mut(rid) else {
            return;
        };
        r.total = len;
        r.received = len;
        let failure = match wc.status {
            _ if r.refused.is_some() => Some(malformed_from(r.src_world, "a message under another rank's name")),
            WcStatus::Success => None,
            WcStatus::LocLenErr => Some(r.truncated(len)),
            WcStatus::WrFlushErr => Some(Error::PeerGone { rank: r.src_world }),
            WcStatus::RemAccessErr => Some(Error::RemoteAccess { rank: r.source, reason: "the sender refused the rendezvous read".into() }),
            st => Some(Error::State(format!("receive from rank {} failed in the TM-SRQ: {st:?}", r.source))),
        };
        self.end_recv(rid, failure);
    }
}

#[cfg(test)]
mod tests {
    use super::super::rndv::way::EAGER_BOTH_WAYS_WITHIN;
    use super::super::testkit::{job, pair, recv, send, settle};
    use super::*;

    /// Large eager messages go around the cache only where both ranks send each other such
    /// messages lately; the data arrives whole either way (here in 64 KiB packets, each
    /// placed by itself).
    #[test]
    fn large_eager_messages_both_ways_are_told_apart() {
        let cfg = Config { rndv_threshold: Some(1 << 20), ..Config::default() };
        let mut v = job(2, cfg);
        let (mut b, mut a) = (v.pop().expect("b"), v.pop().expect("a"));
        let n = EAGER_NT_MIN;
        let data: Vec<u8> = (0..n).map(|i| (i * 7 + i / 4096) as u8).collect();
        let mut bufs = vec![vec![0u8; n]; 3];
        let mut back = vec![0u8; n];
        let [b0, b1, b2] = &mut bufs[..] else { unreachable!() };
        let r: Vec<ReqId> = [b0, b1, b2].into_iter().enumerate().map(|(t, buf)| recv(&mut b, Some(0), Some(t as u32), buf)).collect();
        let s0 = send(&mut a, 1, 0, &data, false);
        settle(&mut [&mut a, &mut b]);
        assert!(!b.st.ways.eager_both_ways(0), "b has sent a nothing");
        // b sends a one: from now on the two send each other large messages.
        let rb = recv(&mut a, Some(1), Some(9), &mut back);
        let sb = send(&mut b, 0, 9, &data, false);
        assert!(b.st.ways.eager_both_ways(0));
        let s1 = send(&mut a, 1, 1, &data, false);
        let s2 = send(&mut a, 1, 2, &data, false);
        settle(&mut [&mut a, &mut b]);
        assert!(a.st.ways.eager_both_ways(1));
        for (rid, s) in r.into_iter().zip([s0, s1, s2]) {
            assert!(b.take_if_done(rid).expect("received").is_ok());
            if let Some(s) = s {
                assert!(a.take_if_done(s).expect("sent").is_ok());
            }
        }
        assert!(a.take_if_done(rb).expect("received").is_ok());
        if let Some(s) = sb {
            assert!(b.take_if_done(s).expect("sent").is_ok());
        }
        assert_eq!(b.st.stats.eager, 1);
        assert!(bufs.iter().chain([&back]).all(|x| *x == data), "every copy whole");
        // Long after b's last one, it no longer counts.
        for _ in 0..EAGER_BOTH_WAYS_WITHIN {
            b.st.ways.big_eager_arrived();
        }
        assert!(!b.st.ways.eager_both_ways(0));
    }

    #[test]
    fn a_large_enough_named_receive_is_matched_by_the_tm_srq() {
        let (mut a, mut b) = pair();
        let mut buf = vec![0u8; 4096];
        let r = recv(&mut b, Some(0), Some(4), &mut buf);
        assert_eq!(b.st.offload.tm().tags_listed(), 1, "at least TMPI_TM_THRESH bytes from a named source: offloaded");
        let data: Vec<u8> = (0..3000u32).map(|i| i as u8).collect();
        send(&mut a, 1, 4, &data, false);
        settle(&mut [&mut a, &mut b]);
        let st = b.take_if_done(r).expect("done").expect("ok");
        assert_eq!(st.len(), 3000);
        assert_eq!(&buf[..3000], &data[..]);
        let c = b.st.offload.tm().counters();
        assert_eq!((c.hw_matched, c.unexpected), (1, 0));
        assert_eq!(b.st.stats.sw_matched, 0);
        assert_eq!(b.st.offload.tm().tags_listed(), 0);
    }

    #[test]
    fn without_offload_the_same_receive_is_matched_in_software() {
        let mut v = job(2, Config { tm_max_tags: 0, ..Config::default() });
        let (b, a) = (&mut v.pop().expect("b"), &mut v.pop().expect("a"));
        let mut buf = vec![0u8; 4096];
        let r = recv(b, Some(0), Some(4), &mut buf);
        assert_eq!(b.st.offload.tm().tags_listed(), 0);
        send(a, 1, 4, &[1u8; 3000], false);
        settle(&mut [&mut *a, &mut *b]);
        assert_eq!(b.take_if_done(r).expect("done").expect("ok").len(), 3000);
        assert_eq!((b.st.offload.tm().counters().hw_matched, b.st.stats.sw_matched), (0, 1));
    }

    #[test]
    fn a_wildcard_receive_stays_in_software_and_keeps_mpi_order() {
        let (mut a, mut b) = pair();
        let (mut any, mut named) = (vec![0u8; 2048], vec![0u8; 2048]);
        let r_any = recv(&mut b, None, Some(6), &mut any);
        let r_named = recv(&mut b, Some(0), Some(6), &mut named);
        // The named receive may not enter the tag list: the earlier wildcard could match the
        // same messages, and the NIC must never overtake it.
        assert_eq!(b.st.offload.tm().tags_listed(), 0);
        send(&mut a, 1, 6, &[1u8; 1500], false);
        send(&mut a, 1, 6, &[2u8; 1500], false);
        settle(&mut [&mut a, &mut b]);
        assert!(b.take_if_done(r_any).expect("done").is_ok());
        assert!(b.take_if_done(r_named).expect("done").is_ok());
        assert_eq!((any[0], named[0]), (1, 2), "the earlier (wildcard) receive takes the first message");
    }

    #[test]
    fn software_reports_every_unexpected_message_to_the_tm_srq() {
        let (mut a, mut b) = pair();
        for t in 0..40 {
            send(&mut a, 1, t, b"u", false);
        }
        settle(&mut [&mut a, &mut b]);
        assert_eq!(b.st.offload.sw_unexp(), 40);
        assert_eq!(b.st.offload.tm().hw_unexpected_cnt(), 40);
        // A receive offloaded now carries software's count, so the TM-SRQ accepts it.
        let mut buf = vec![0u8; 2048];
        let r = recv(&mut b, Some(0), Some(99), &mut buf);
        assert_eq!(b.st.offload.tm().tags_listed(), 1);
        b.cancel(r);
        assert!(b.take_if_done(r).expect("cancelled").is_ok_and(|s| s.cancelled()));
        assert_eq!(b.st.offload.tm().tags_listed(), 0);
    }
}
