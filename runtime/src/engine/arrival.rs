//! Every packet from the fabric: RMA packets are served at once; the rest pass through the
//! soft TM-SRQ exactly as a NIC would see them, and what it does not match goes to software.

use super::*;

use tmpi_transport::tm::{Placement, Polled};
use tmpi_transport::wire::Message;

impl State {
    /// Handles one packet from the fabric; returns whether it was consumed.
    #[inline]
    pub(super) fn on_packet(&mut self, p: Packet<'_>) -> bool {
        if self.outbox.failed() {
            return false;
        }
        if p.flags & PKT_RMA != 0 {
            if let Err(e) = self.on_rma(p).and_then(|()| self.drain_cq()) {
                self.outbox.fail(e);
            }
            return true;
        }
        if p.flags & PKT_FIRST != 0 && p.src != self.rank && !length_agrees(&p) {
            // Refused before the TM-SRQ sees it, so the stream from that peer stays in step.
            self.outbox.fail(malformed_from(p.src, "a packet whose length disagrees with its message"));
            return true;
        }
        if p.flags & PKT_WHOLE == PKT_WHOLE && self.on_whole_polled(p) {
            return true;
        }
        let arrival = if p.flags & PKT_FIRST != 0 {
            self.offload.tm_mut().arrive_first(p.src as u32, p.data, p.total_len as usize)
        } else {
            self.offload.tm_mut().arrive_continuation(p.src as u32, p.data)
        };
        let r = match arrival {
            // No SRQ buffer posted: leave the packet in the fabric (an RNR NAK).
            Ok(Arrival::Rnr) => return false,
            Ok(Arrival::Place(pl)) => match pl.buffer {
                Buffer::Tagged { recv_wr_id, .. } => {
                    self.on_tagged(p, &pl, recv_wr_id);
                    Ok(())
                }
                Buffer::Srq { .. } => self.on_software(p),
            },
            Ok(Arrival::Read(rr)) => self.on_tm_read(p, rr),
            Err(e) => Err(Error::Transport(e.into())),
        };
        if let Err(e) = r.and_then(|()| self.settle_cq()) {
            self.outbox.fail(e);
        }
        true
    }

    /// The common cases cost no queued completion: a whole eager message while no completion
    /// is queued matches a tagged buffer or lands unexpected in an SRQ buffer, and its
    /// completion is handled at once (what `drain_cq` would do with it next). Returns whether
    /// `p` was handled so (else it takes the general way).
    #[inline(always)]
    fn on_whole_polled(&mut self, p: Packet<'_>) -> bool {
        let r = match self.offload.tm_mut().arrive_whole_polled(p.src as u32, p.data) {
            Some(Polled::Unexpected(wc)) => self.whole_unexpected(p, &wc),
            Some(Polled::Matched(pl, wc)) => {
                self.on_tagged(p, &pl, wc.wr_id);
                self.on_hw_completion(&wc);
                self.settle_cq()
            }
            None => return false,
        };
        if let Err(e) = r {
            self.outbox.fail(e);
        }
        true
    }

    /// A whole eager message that completed unexpected in the TM-SRQ (`wc`): software
    /// matches it.
    #[inline(always)]
    fn whole_unexpected(&mut self, p: Packet<'_>, wc: &Wc) -> Result<()> {
        self.on_unexpected_wc(wc)?;
        self.on_whole_eager(p)?;
        self.settle_cq()
    }

    /// An expected rendezvous: the TM-SRQ asks for the RDMA read it would issue, described by
    /// the RVH alone.
    fn on_tm_read(&mut self, p: Packet<'_>, rr: tmpi_transport::tm::ReadRequest) -> Result<()> {
        let mut info = RndvInfo::parse(p.data)?;
        info.key = u64::from(rr.rkey);
        info.len = rr.len as usize;
        let rid = wr_to_rid(rr.recv_wr_id);
        if !self.admits(rid, info.tmh.tag, p.src) {
            // A forged source: no byte is read; the receive fails at DATA_VALID.
            if let Some(Req { kind: ReqKind::Recv(r), .. }) = self.reqs.get_mut(rid) {
                r.refused = Some(p.src);
            }
            return self.offload.tm_mut().read_failed(rr.id, WcStatus::RemAccessErr).map_err(|e| Error::Transport(e.into()));
        }
        self.start_read(rid, p.src, info, Some(rr.id))
    }

    /// The TM-SRQ placed packet `p` as `pl` says in the tagged buffer of receive `recv_wr_id`
    /// (the NIC's copy); a first packet also takes the receive out of the software queue and,
    /// for an eager message, gives the sender its credit back.
    #[inline]
    fn on_tagged(&mut self, p: Packet<'_>, pl: &Placement, recv_wr_id: u64) {
        let rid = wr_to_rid(recv_wr_id);
        if p.flags & PKT_FIRST != 0 {
            match p.data.first() {
                Some(&op) if op == TmOp::Rndv as u8 => self.tm_took(rid, p.src, Some(p.data)),
                // An expected eager message: consumed, its credit goes back.
                _ => {
                    self.tm_took(rid, p.src, None);
                    self.give_credit(p.src, (p.total_len as usize).saturating_sub(TMH_LEN));
                }
            }
            // A message under another rank's name writes nothing (it completes with an
            // error, see `on_hw_completion`).
            let tag64 = Tmh::decode(p.data).map_or(0, |t| t.tag);
            if p.data.first() != Some(&(TmOp::Rndv as u8)) {
                crate::seen::msg(false, p.src, tag64, (p.total_len as usize).saturating_sub(TMH_LEN), Proto::EAGER | Proto::OFFLOADED);
            }
            if !self.admits(rid, tag64, p.src) {
                if let Some(Req { kind: ReqKind::Recv(r), .. }) = self.reqs.get_mut(rid) {
                    r.refused = Some(p.src);
                }
            }
        }
        // A large eager message in a window, while this rank sends its peer such messages
        // too, goes around the cache (see `EAGER_NT_MIN`).
        let big = p.total_len >= (TMH_LEN + EAGER_NT_MIN) as u64;
        if big && p.flags & PKT_FIRST != 0 {
            self.ways.big_eager_arrived();
        }
        let around = big && self.offload.tm().tags_listed() > 0 && self.ways.eager_both_ways(p.src);
        self.place_tagged(rid, pl.dst_off, pl.bytes(p.data), around);
    }

    /// [`State::on_software`] for a whole eager message (what `arrive_whole_polled` returns
    /// as unexpected: its opcode is EAGER, its length checked against the packet's): straight
    /// to [`State::on_first`], without the general parse and its dispatch.
    #[inline(always)]
    fn on_whole_eager(&mut self, p: Packet<'_>) -> Result<()> {
        let tmh = Tmh::decode(p.data).map_err(|_| malformed_from(p.src, "a message with a malformed header"))?;
        let payload = &p.data[TMH_LEN..];
        self.on_first(p.src, tmh, payload, payload.len(), true)
    }

    /// The TM-SRQ placed a packet in an SRQ buffer: software handles the message.
    pub(super) fn on_software(&mut self, p: Packet<'_>) -> Result<()> {
        if p.flags & PKT_FIRST == 0 {
            return self.on_cont(p.src, p.data, p.flags & PKT_LAST != 0);
        }
        match Message::parse(p.data).map_err(|_| malformed_from(p.src, "a message with a malformed header"))? {
            Message::NoTag(body) => self.on_control(p.src, body),
            Message::Fin(tmh, rvh) => self.on_fin(p.src, tmh, rvh),
            Message::Rndv(..) => self.on_rndv(p.src, p.data),
            Message::Eager(tmh, payload) => self.on_data_first(p.src, tmh, payload, p.total_len, p.flags & PKT_LAST != 0),
        }
    }

    /// A control message: each kind goes to the stage that owns it.
    pub(super) fn on_control(&mut self, src: usize, body: &[u8]) -> Result<()> {
        let c = Control::decode(body).map_err(|_| malformed_from(src, "a malformed control message"))?;
        match c {
            Control::SsendAck { name } => {
                let k = self.named_send(name, src).ok_or_else(|| malformed_from(src, "acknowledgement of no synchronous send"))?;
                self.send_progress(k, false, true);
            }
            Control::CollAbort { ctx, seq, gone } => self.on_coll_abort(src, ctx, seq, gone as usize),
            Control::Credit { bytes } => self.credit.refill(src, bytes),
            Control::Revoke { name } => self.on_revoke(src, name),
            Control::RevokeAck { name } => self.on_revoke_ack(src, name),
            Control::ReadWay { class, way } => self.ways.led(src, self.rank, class, way)?,
            Control::EagerBelow { bytes } => {
                self.threshold.raise(src, bytes as usize);
                self.stats.eager_advice += 1;
                self.advise_as_led(src, bytes as usize);
            }
        }
        Ok(())
    }

    /// An RMA packet: a read request to serve (the target's), or data, a grant, a refusal or
    /// a write done for a read this rank issued (the reader's).
    pub(super) fn on_rma(&mut self, p: Packet<'_>) -> Result<()> {
        let m = Rma::parse(p.data).map_err(|_| malformed_from(p.src, "a malformed RMA packet"))?;
        let read = read_key(m.read());
        match m {
            Rma::ReadReq(q) => {
                self.serve_read(p.src, q);
                Ok(())
            }
            Rma::ReadResp { offset, data, .. } => self.on_read_resp(p.src, read, offset, data),
            Rma::WriteDone { .. } => self.on_write_done(read),
            Rma::Grant { split, heap, .. } => self.on_grant(read, split, heap),
            Rma::ReadErr { .. } => self.finish_read(read, false),
        }
    }
}

/// Whether the length a first packet `p` announces fits it: a whole message is exactly its
/// packet, a first packet announces more (never more than an eager message may carry).
#[inline(always)]
fn length_agrees(p: &Packet<'_>) -> bool {
    let (len, total) = (p.data.len() as u64, p.total_len);
    if p.flags & PKT_LAST != 0 {
        total == len
    } else {
        total > len && total <= (MAX_EAGER_LEN + TMH_LEN) as u64
    }
}
