//! The eager protocol: a message goes out as `TMH(EAGER) | payload`, copied once into the ring
//! and once out; what cannot go out at once waits in a per-destination queue. Flow control is
//! credit: each eager message costs the sender its length plus [`UX_OVERHEAD`] of the
//! receiver's credit, which comes back (`Control::Credit`) as the receiver consumes the messages;
//! without credit a message goes as a rendezvous. Control packets (`NO_TAG`) ride along.

use super::*;

/// The bytes of a queued data message: the user's buffer, or a copy once the user's request
/// was abandoned.
pub(super) enum OutData {
    User(RawBuf),
    Owned(Vec<u8>),
}

impl OutData {
    pub(super) fn len(&self) -> usize {
        match self {
            OutData::User(b) => b.len(),
            OutData::Owned(v) => v.len(),
        }
    }
    pub(super) fn slice(&self, from: usize, to: usize) -> &[u8] {
        match self {
            OutData::User(b) => b.slice(from, to),
            OutData::Owned(v) => &v[from..to],
        }
    }
}

/// A data message waiting for ring space.
pub(super) struct OutMsg {
    pub(super) req: ReqId,
    pub(super) hdr: [u8; RNDV_HDR_MAX],
    pub(super) hdr_len: usize,
    pub(super) data: OutData,
    /// Payload bytes already pushed.
    pub(super) off: usize,
    pub(super) started: bool,
}

/// Pipelining of a multi-packet stream on shared memory (eager data longer than one packet,
/// a streamed rendezvous read) that is alone in its queue, i.e. a receiver waiting for this one
/// message: the sender cuts `total` bytes into chunks of about `sqrt(total * CHUNK_SCALE)`
/// bytes (at least [`CHUNK_MIN`]), so that the receiver starts copying out after the first
/// chunk while the sender copies in the next (both cores busy), and the fixed cost of a packet
/// stays small against its copy (32 KiB chunks for 256 KiB, 64 KiB for 1 MiB, 128 KiB for 4
/// MiB, the ring's largest packet from 256 MiB). Streams queued behind each other (a window of
/// messages) go in the largest packets: the receiver is kept busy by the queue, and there
/// smaller packets measured slower. Measurements: bench/results/large-pipeline.md; the scale
/// was 16 KiB (chunks twice as long) until the ring stopped claiming and prefetching the
/// lines of stream packets (`tmpi_transport::shm::ring`), after which `osu_latency`
/// measured (5 interleaved runs, medians) 32 KiB 0.93 against 1.00 us, 64 KiB 1.44 against
/// 1.60, 4 MiB 85.9 against 94.4 (bench/results/p2p-2026-11-28.md, session 30).
pub(super) const CHUNK_SCALE: usize = 4 << 10;

/// The shortest chunk of a pipelined stream (see [`CHUNK_SCALE`]).
pub(super) const CHUNK_MIN: usize = 8 << 10;

/// Eager messages from this size on are sent as a pipelined stream on shared memory, even
/// when they would fit one packet, if the receiver has taken everything sent before (it is
/// keeping up, or waiting for this message): cut into pieces ([`stream_piece`]), they let
/// it copy out the first piece while the sender copies in the next, where one packet would
/// make it wait for the whole copy-in (`osu_latency` 64-128 KiB: 0.87-0.93x the time). A
/// receiver with packets still to take is busy anyway (`osu_bibw` 32-64 KiB measured 0.93x
/// with every message cut), bench/results/p2p-2026-11-25.md. This was 32 KiB while copies of
/// 4-8 KiB went through `rep movsb`; with the vector copies of
/// `tmpi_transport::shm::copy_bytes` a 16 KiB message in pieces of 4, 8 and 4 KiB measured
/// `osu_latency` 0.66-0.69 against 0.76-0.89 us whole (4 interleaved runs), and `osu_bw` and
/// `osu_bibw` 16 KiB no slower (bench/results/p2p-2026-11-28.md, session 30). Below 16 KiB
/// the fixed cost of each packet is larger than what the overlap saves.
pub(super) const PIPELINE_MIN: usize = 16 << 10;

/// Payload bytes per packet of a pipelined stream of `total` bytes (see [`CHUNK_SCALE`]): a
/// multiple of 4 KiB from [`CHUNK_MIN`], at most `max` (and at least 1).
pub(super) fn stream_chunk(total: usize, max: usize) -> usize {
    let c = total.saturating_mul(CHUNK_SCALE).isqrt().next_multiple_of(4096);
    c.max(CHUNK_MIN).min(max).max(1)
}

/// Payload bytes of the packet at `off` of a pipelined stream of `total` bytes cut into
/// `chunk`-byte packets ([`stream_chunk`]): the first packet and the last are a quarter of
/// `chunk` (at least 4 KiB), so that the receiver starts copying out sooner and has less
/// left to copy once the sender's last packet is in. A ping-pong's time is about the copy of
/// the whole message plus the copy of the larger of those two packets.
pub(super) fn stream_piece(total: usize, off: usize, chunk: usize) -> usize {
    let rem = total.saturating_sub(off);
    let edge = (chunk / 4).max(4096).min(chunk);
    if off == 0 {
        rem.min(edge)
    } else if rem > chunk + edge {
        chunk
    } else if rem > 2 * edge {
        rem - edge
    } else {
        rem.min(chunk)
    }
}

/// How a multi-packet stream is cut into packets: a stream alone in its queue on shared
/// memory (`lone`) goes in pipelined, tapered pieces ([`stream_chunk`], [`stream_piece`]),
/// any other in packets of `max` bytes.
#[derive(Clone, Copy)]
pub(super) struct Cut {
    chunk: usize,
    taper: bool,
}

impl Cut {
    /// The cut of a stream of `total` bytes in packets of at most `max` payload bytes.
    pub(super) fn new(lone: bool, total: usize, max: usize) -> Self {
        if lone {
            Cut { chunk: stream_chunk(total, max), taper: true }
        } else {
            Cut { chunk: max, taper: false }
        }
    }

    /// Payload bytes of the packet at `off` of the stream of `total` bytes.
    pub(super) fn piece(self, total: usize, off: usize) -> usize {
        if self.taper {
            stream_piece(total, off, self.chunk)
        } else {
            total.saturating_sub(off).min(self.chunk)
        }
    }
}

impl Engine {
    /// Starts a data message to `dest` (a world rank). Returns `None` when it is already
    /// complete (locally, for a standard send), or the request to wait on.
    ///
    /// An eager message costs its length plus [`UX_OVERHEAD`] of the destination's credit;
    /// without enough credit it goes as a rendezvous instead (flow control: the receiver never
    /// has to refuse what is in its ring, see [`State::give_credit`]).
    ///
    /// The common case (a standard send of one eager packet to another rank, with credit,
    /// nothing queued before it and room in the ring) is inlined into the caller; everything
    /// else, including that case when the ring is full, is [`Engine::start_send_general`].
    #[inline(always)]
    pub(crate) fn start_send(&mut self, dest: usize, tag64: u64, data: RawBuf, sync: bool) -> Result<Option<ReqId>> {
        #[cfg(feature = "ofi")]
        if self.st.offload.by_provider() && ofi::by_provider(tag64) {
            return self.pm_send(dest, tag64, data, sync);
        }
        let len = data.len();
        if !sync && (len < PIPELINE_MIN || !self.peers[dest].pipelined) && self.may_send_whole(dest, len) {
            let tmh = Tmh { op: TmOp::Eager, app_ctx: 0, tag: tag64 }.to_bytes();
            if self.fabric.try_send(dest, PKT_WHOLE, (TMH_LEN + len) as u64, &[&tmh, data.slice(0, len)])? {
                self.sent_whole(dest, tag64, len);
                return Ok(None);
            }
        }
        self.start_send_general(dest, tag64, data, sync)
    }

    /// Whether a standard eager message of `len` bytes to `dest` may go out whole, as one ring
    /// record, right now: to another rank, nothing queued before it, one packet, eager size,
    /// enough credit (the ring's room is the fabric's to say).
    #[inline(always)]
    fn may_send_whole(&self, dest: usize, len: usize) -> bool {
        dest != self.st.rank && self.goes_eager(dest, len) && TMH_LEN + len <= self.max_packet && self.out[dest].is_empty()
    }

    /// Whether a message of `len` bytes to another rank `dest` goes eager: below its
    /// rendezvous start, within `TMPI_EAGER_LIMIT`, and with credit for it (else rendezvous).
    #[inline(always)]
    fn goes_eager(&self, dest: usize, len: usize) -> bool {
        // `len < rndv_from` (at most 2^32) keeps `len + UX_OVERHEAD` from overflowing.
        self.st.threshold.eager_below(dest, len) && len <= self.cfg.eager_limit && self.st.credit.covers(dest, len + UX_OVERHEAD)
    }

    /// Accounts for a message that [`Engine::may_send_whole`] allowed and the fabric took.
    #[inline(always)]
    fn sent_whole(&mut self, dest: usize, tag64: u64, len: usize) {
        crate::seen::msg(true, dest, tag64, len, Proto::EAGER);
        self.st.credit.spend(dest, len + UX_OVERHEAD);
        self.st.stats.msgs_sent += 1;
        self.st.stats.bytes_sent += len as u64;
        self.st.stats.eager += 1;
    }

    /// [`Engine::start_send`] in every case: rendezvous, synchronous, to itself, behind queued
    /// messages, or when the ring has no room.
    #[inline(never)]
    fn start_send_general(&mut self, dest: usize, tag64: u64, data: RawBuf, sync: bool) -> Result<Option<ReqId>> {
        let len = data.len();
        self.st.stats.msgs_sent += 1;
        self.st.stats.bytes_sent += len as u64;
        if dest != self.st.rank {
            if !self.goes_eager(dest, len) {
                if len <= self.cfg.eager_limit && self.st.threshold.eager_below(dest, len) {
                    // Eager but for the credit.
                    self.st.stats.credit_rndv += 1;
                }
                crate::seen::msg(true, dest, tag64, len, Proto::RNDV);
                return self.start_rndv(dest, tag64, data).map(Some);
            }
            self.st.credit.spend(dest, len + UX_OVERHEAD);
            if len >= EAGER_NT_MIN {
                self.st.ways.big_eager_sent(dest);
            }
        }
        self.st.stats.eager += 1;
        crate::seen::msg(true, dest, tag64, len, if dest == self.st.rank { Proto::SELF } else { Proto::EAGER });
        let req = if sync { Some(self.st.new_send(dest, tag64, true, None)?) } else { None };
        let app_ctx = req.map_or(0, |r| SYNC_FLAG | wire_name(r));
        let tmh = Tmh { op: TmOp::Eager, app_ctx, tag: tag64 }.to_bytes();
        if dest == self.st.rank {
            self.st.deliver_self(&tmh, data.slice(0, len))?;
            self.flush_ctl()?;
            return Ok(self.mark_pushed(req));
        }
        let to = self.peers[dest];
        if self.out[dest].is_empty()
            && TMH_LEN + len <= to.max_packet
            && !(to.pipelined && len >= PIPELINE_MIN && self.fabric.drained(dest))
        {
            let total = (TMH_LEN + len) as u64;
            if self.fabric.try_send(dest, PKT_WHOLE, total, &[&tmh, data.slice(0, len)])? {
                return Ok(self.mark_pushed(req));
            }
        }
        let req = match req {
            Some(r) => r,
            None => self.st.reqs.insert(Req {
                kind: ReqKind::Send(SendState { dest, key: tag64, phase: SendPhase::Pushing, rndv: None }),
                result: None,
                detached: false,
            }),
        };
        let mut hdr = [0u8; RNDV_HDR_MAX];
        hdr[..TMH_LEN].copy_from_slice(&tmh);
        self.queue_out(dest, OutMsg { req, hdr, hdr_len: TMH_LEN, data: OutData::User(data), off: 0, started: false })?;
        Ok(Some(req))
    }

    /// A standard eager send of the concatenation of `parts`, gathered straight into one ring
    /// record (no packing copy), if it can go out whole right now: to another rank, nothing
    /// queued before it, one packet of at most the fabric's parts to `dest` (the header is
    /// one), eager size, enough credit, ring space. Returns false (nothing changed, nothing
    /// counted) otherwise, and the caller packs and sends.
    pub(crate) fn try_send_gather(&mut self, dest: usize, tag64: u64, parts: &[&[u8]]) -> Result<bool> {
        const MAX_PARTS: usize = 16;
        let len: usize = parts.iter().map(|p| p.len()).sum();
        let fits = parts.len() < MAX_PARTS && self.peers.get(dest).is_some_and(|c| parts.len() < c.max_parts);
        #[cfg(feature = "ofi")]
        if self.st.offload.by_provider() && ofi::by_provider(tag64) {
            // The caller packs and sends through the provider (`Engine::start_send`).
            return Ok(false);
        }
        if !fits || !self.may_send_whole(dest, len) {
            return Ok(false);
        }
        let tmh = Tmh { op: TmOp::Eager, app_ctx: 0, tag: tag64 }.to_bytes();
        let mut all: [&[u8]; MAX_PARTS] = [&[]; MAX_PARTS];
        all[0] = &tmh;
        all[1..=parts.len()].copy_from_slice(parts);
        if !self.fabric.try_send(dest, PKT_WHOLE, (TMH_LEN + len) as u64, &all[..=parts.len()])? {
            return Ok(false);
        }
        self.sent_whole(dest, tag64, len);
        Ok(true)
    }

    pub(super) fn queue_out(&mut self, dest: usize, m: OutMsg) -> Result<()> {
        self.out[dest].push_back(m);
        self.out_pending += 1;
        self.push_out_to(dest)?;
        Ok(())
    }

    /// Marks a send request as pushed; returns it if it still needs waiting on.
    pub(super) fn mark_pushed(&mut self, req: Option<ReqId>) -> Option<ReqId> {
        let r = req?;
        self.st.send_progress(r, true, false);
        Some(r)
    }

    /// Pushes as much as fits of the messages queued for `dest`.
    pub(super) fn push_out_to(&mut self, dest: usize) -> Result<usize> {
        let mut pushed = 0;
        let PeerCaps { max_packet: maxp, pipelined, .. } = self.peers[dest];
        loop {
            let alone = self.out[dest].len() == 1;
            let Some(m) = self.out[dest].front_mut() else { break };
            let len = m.data.len();
            let total = (m.hdr_len + len) as u64;
            let cut = Cut::new(pipelined && alone, len, maxp);
            loop {
                let ok = if !m.started {
                    let n = cut.piece(len, 0).min(maxp - m.hdr_len);
                    let flags = if n == len { PKT_WHOLE } else { PKT_FIRST };
                    let ok = self.fabric.try_send(dest, flags, total, &[&m.hdr[..m.hdr_len], m.data.slice(0, n)])?;
                    if ok {
                        m.started = true;
                        m.off = n;
                    }
                    ok
                } else {
                    let n = cut.piece(len, m.off);
                    let flags = if m.off + n == len { PKT_LAST } else { 0 };
                    let ok = self.fabric.try_send(dest, flags, total, &[m.data.slice(m.off, m.off + n)])?;
                    if ok {
                        m.off += n;
                    }
                    ok
                };
                if !ok {
                    return Ok(pushed);
                }
                pushed += 1;
                if m.off == len {
                    break;
                }
            }
            let req = m.req;
            self.out[dest].pop_front();
            self.out_pending -= 1;
            self.st.send_progress(req, true, false);
        }
        Ok(pushed)
    }

    pub(super) fn push_out(&mut self) -> Result<usize> {
        let mut n = 0;
        for dest in 0..self.size {
            if !self.out[dest].is_empty() {
                n += self.push_out_to(dest)?;
            }
        }
        Ok(n)
    }
}

impl State {
    /// Self-delivery: the message passes through the TM-SRQ as two packets (header, payload).
    pub(super) fn deliver_self(&mut self, hdr: &[u8; TMH_LEN], payload: &[u8]) -> Result<()> {
        if let Some(e) = self.outbox.take_failure() {
            return Err(e);
        }
        let src = self.rank;
        let total = (TMH_LEN + payload.len()) as u64;
        let flags = if payload.is_empty() { PKT_WHOLE } else { PKT_FIRST };
        self.on_packet(Packet { src, flags, total_len: total, data: hdr });
        if !payload.is_empty() {
            self.on_packet(Packet { src, flags: PKT_LAST, total_len: total, data: payload });
        }
        self.outbox.take_failure().map_or(Ok(()), Err)
    }

    /// The first packet of an eager message from `src`: its TMH, the payload it carries, and
    /// the length of the whole message, TMH included (`total_len` of the packet).
    #[inline]
    pub(super) fn on_data_first(&mut self, src: usize, tmh: Tmh, payload: &[u8], total_len: u64, last: bool) -> Result<()> {
        let total = usize::try_from(total_len).ok().and_then(|t| t.checked_sub(TMH_LEN)).filter(|&t| t >= payload.len());
        let total = total.ok_or_else(|| malformed_from(src, "a data packet longer than its message"))?;
        self.on_first(src, tmh, payload, total, last)
    }

    /// The common case of a matched eager message, in one look at the receive: a whole
    /// message from a peer the receive admits, for a receive in software only with a buffer
    /// of its own. It leaves its queue, takes the data and completes (what `leave_queues`,
    /// the copy and `complete_recv` do in general). Returns false, having changed nothing,
    /// for any other case.
    #[inline]
    fn take_whole(&mut self, rid: ReqId, src: usize, tag64: u64, data: &[u8]) -> bool {
        let Some(req) = self.reqs.get_mut(rid) else { return false };
        let ReqKind::Recv(r) = &mut req.kind else { return false };
        if !matches!(r.phase, RecvPhase::Posted { hw: None, .. }) || r.owned.is_some() || !r.from.admits(src_of(tag64), src) {
            return false;
        }
        r.phase = RecvPhase::Idle;
        self.offload.left_sw_only();
        r.src_world = src;
        r.source = src_of(tag64);
        r.tag = tag_of(tag64);
        r.total = data.len();
        if let Some(b) = &r.buf {
            b.write_at(0, data);
        }
        r.received = data.len();
        // The receive has no result yet (it was posted), so the value `replace` hands back
        // is `None`: forgotten, not dropped, since the compiler does not see that and would
        // call the drop glue (12 instructions per message, callgrind). A message too long for
        // the buffer is the rare case.
        let outcome = if data.len() <= r.cap { Ok(Status::received(r.source, r.tag, data.len())) } else { r.outcome().map_err(Box::new) };
        let none = req.result.replace(outcome);
        debug_assert!(none.is_none());
        std::mem::forget(none);
        if req.detached {
            self.reqs.remove(rid);
        }
        true
    }

    /// The first packet of a data message: `hdr` is its TMH, `data` the payload it carries,
    /// `total` the payload length of the whole message.
    pub(super) fn on_first(&mut self, src: usize, tmh: Tmh, data: &[u8], total: usize, last: bool) -> Result<()> {
        if tmh.op != TmOp::Eager {
            return Err(Error::Transport(tmpi_transport::Error::Malformed { what: "unsupported TMH opcode in a data packet" }));
        }
        if data.len() > total || (last && data.len() != total) {
            return Err(Error::Transport(tmpi_transport::Error::Malformed { what: "packet length disagrees with message length" }));
        }
        if total > MAX_EAGER_LEN {
            return Err(malformed_from(src, "eager message longer than any credit allows"));
        }
        self.stats.msgs_recv += 1;
        self.stats.bytes_recv += total as u64;
        let ack = (tmh.app_ctx & SYNC_FLAG != 0).then_some((src, tmh.app_ctx & !SYNC_FLAG));
        let key = self.ux.vacant_key();
        match self.matcher.arrive(tmh.tag, key) {
            Arrived::Matched(_, rid, _) => {
                self.stats.sw_matched += 1;
                crate::seen::msg(false, src, tmh.tag, total, Proto::EAGER | Proto::SOFTWARE);
                if last && ack.is_none() && self.take_whole(rid, src, tmh.tag, data) {
                    self.give_credit(src, total);
                    return Ok(());
                }
                self.first_into_posted(rid, src, tmh, (data, total, last), ack);
                Ok(())
            }
            Arrived::Unexpected => self.first_unexpected(key, src, tmh, (data, total, last), ack),
        }
    }

    /// The first packet of a message (`data` of `total` bytes, the whole message if `last`)
    /// matched posted receive `rid` (the general way, see [`State::take_whole`]): it is
    /// written there, and the rest of the message follows it; `ack` answers a synchronous
    /// send.
    #[inline(always)]
    fn first_into_posted(
        &mut self,
        rid: ReqId,
        src: usize,
        tmh: Tmh,
        (data, total, last): (&[u8], usize, bool),
        ack: Option<(usize, u32)>,
    ) {
        self.leave_queues(rid);
        self.size_owned(rid, total);
        self.give_credit(src, total);
        if !self.admits(rid, tmh.tag, src) {
            self.fail_recv(rid, malformed_from(src, "a message under another rank's name"));
            if !last {
                self.ux.set_incoming(src, Incoming::Discard);
            }
            return;
        }
        if let Some((dest, idx)) = ack {
            self.outbox.control(dest, Control::SsendAck { name: idx });
        }
        if let Some(Req { kind: ReqKind::Recv(r), .. }) = self.reqs.get_mut(rid) {
            if !last {
                r.phase = RecvPhase::Filling;
            }
            r.src_world = src;
            r.source = src_of(tmh.tag);
            r.tag = tag_of(tmh.tag);
            r.total = total;
            if let Some(b) = &r.buf {
                b.write_at(0, data);
            }
            r.received = data.len();
        }
        if last {
            self.complete_recv(rid);
        } else {
            self.ux.set_incoming(src, Incoming::Expected { req: rid });
        }
    }

    /// The first packet of a message (`data` of `total` bytes, the whole message if `last`)
    /// matched no receive: it is kept as unexpected message `key` (with `ack`, to answer a
    /// synchronous send when it matches), and the rest follows it there.
    #[inline(always)]
    fn first_unexpected(
        &mut self,
        key: Key,
        src: usize,
        tmh: Tmh,
        (data, total, last): (&[u8], usize, bool),
        ack: Option<(usize, u32)>,
    ) -> Result<()> {
        self.stats.unexpected += 1;
        let Some(mut v) = self.ux.buffer(total) else {
            if !last {
                self.ux.set_incoming(src, Incoming::Discard);
            }
            return Err(Error::NoMemory { bytes: total, rank: src });
        };
        v.extend_from_slice(data);
        let k = self.ux.insert(UxMsg { src_world: src, tag64: tmh.tag, total, data: v, complete: last, ack, rndv: None });
        self.stats.ux_peak_bytes = self.stats.ux_peak_bytes.max(self.ux.bytes() as u64);
        debug_assert_eq!(k, key);
        if !last {
            self.ux.set_incoming(src, Incoming::Unexpected { ux: k });
        }
        Ok(())
    }

    pub(super) fn on_cont(&mut self, src: usize, data: &[u8], last: bool) -> Result<()> {
        let malformed = || Error::Transport(tmpi_transport::Error::Malformed { what: "continuation packet without a message" });
        match self.ux.incoming(src).ok_or_else(malformed)? {
            Incoming::Idle => return Err(malformed()),
            Incoming::Discard => {
                if last {
                    self.ux.set_incoming(src, Incoming::Idle);
                }
            }
            Incoming::Expected { req } => {
                if let Some(Req { kind: ReqKind::Recv(r), .. }) = self.reqs.get_mut(req) {
                    if let Some(b) = &r.buf {
                        b.write_at(r.received, data);
                    }
                    r.received += data.len();
                    if r.received > r.total || (last && r.received != r.total) {
                        return Err(Error::Transport(tmpi_transport::Error::Malformed { what: "message longer than announced" }));
                    }
                }
                if last {
                    self.ux.set_incoming(src, Incoming::Idle);
                    self.complete_recv(req);
                }
            }
            Incoming::Unexpected { ux } => {
                if let Some(u) = self.ux.get_mut(ux) {
                    if u.data.len() + data.len() > u.total {
                        return Err(Error::Transport(tmpi_transport::Error::Malformed { what: "message longer than announced" }));
                    }
                    u.data.extend_from_slice(data);
                    if last {
                        u.complete = true;
                    }
                }
                if last {
                    self.ux.set_incoming(src, Incoming::Idle);
                }
            }
        }
        Ok(())
    }

    /// A just-posted receive matched unexpected message `ux`.
    pub(super) fn take_unexpected(&mut self, rid: ReqId, ux: Key) {
        let Some(u) = self.ux.remove(ux) else { return };
        self.size_owned(rid, u.total);
        self.stats.sw_matched += 1;
        // A message a probe took from the OFI provider cost its sender no credit.
        #[cfg(feature = "ofi")]
        let provided = self.offload.by_provider() && ofi::by_provider(u.tag64);
        #[cfg(not(feature = "ofi"))]
        let provided = false;
        if u.rndv.is_none() && !provided {
            self.give_credit(u.src_world, u.total);
        }
        if !self.admits(rid, u.tag64, u.src_world) {
            self.fail_recv(rid, malformed_from(u.src_world, "a message under another rank's name"));
            if !u.complete {
                self.ux.set_incoming(u.src_world, Incoming::Discard);
            }
            return;
        }
        let how = if u.rndv.is_some() { Proto::RNDV } else { Proto::EAGER };
        crate::seen::msg(false, u.src_world, u.tag64, u.total, how | Proto::SOFTWARE | Proto::UNEXPECTED);
        if let Some(info) = u.rndv {
            #[cfg(feature = "ofi")]
            if provided {
                if let Err(e) = self.pm_take_rndv(rid, u.src_world, info) {
                    self.outbox.fail(e);
                }
                return;
            }
            if let Err(e) = self.start_read(rid, u.src_world, info, None) {
                self.outbox.fail(e);
            }
            return;
        }
        if let Some((dest, idx)) = u.ack {
            self.outbox.control(dest, Control::SsendAck { name: idx });
        }
        if let Some(Req { kind: ReqKind::Recv(r), .. }) = self.reqs.get_mut(rid) {
            if !u.complete {
                r.phase = RecvPhase::Filling;
            }
            r.src_world = u.src_world;
            r.source = src_of(u.tag64);
            r.tag = tag_of(u.tag64);
            r.total = u.total;
            if let Some(b) = &r.buf {
                b.write_at(0, &u.data);
            }
            r.received = u.data.len();
        }
        self.ux.recycle(u.data);
        if u.complete {
            self.complete_recv(rid);
        } else {
            self.ux.set_incoming(u.src_world, Incoming::Expected { req: rid });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::testkit::{job, pair, recv, send, settle};
    use super::*;

    #[test]
    fn expected_eager_lands_in_the_posted_buffer() {
        let (mut a, mut b) = pair();
        let mut buf = [0u8; 8];
        let r = recv(&mut b, Some(0), Some(5), &mut buf);
        assert!(send(&mut a, 1, 5, b"abc", false).is_none(), "an eager send that went out is complete");
        settle(&mut [&mut a, &mut b]);
        let st = b.take_if_done(r).expect("done").expect("ok");
        assert_eq!((st.source(), st.tag(), st.len()), (0, 5, 3));
        assert_eq!(&buf[..3], b"abc");
        // Below TMPI_TM_THRESH the receive stays in software: the TM-SRQ delivers the message
        // to an SRQ buffer (unexpected for the hardware), software matches it.
        assert_eq!((b.st.stats.sw_matched, b.st.stats.unexpected), (1, 0));
        assert_eq!(b.st.offload.tm().counters().unexpected, 1);
        assert_eq!(b.st.offload.tm().counters().hw_matched, 0);
    }

    #[test]
    fn unexpected_eager_waits_then_matches_and_recycles_its_buffer() {
        let (mut a, mut b) = pair();
        send(&mut a, 1, 9, b"hello", false);
        settle(&mut [&mut a, &mut b]);
        assert_eq!(b.st.stats.unexpected, 1);
        assert!(b.probe_now(0, Some(0), Some(9)).is_some_and(|s| s.len() == 5));
        let mut buf = [0u8; 5];
        let r = recv(&mut b, Some(0), Some(9), &mut buf);
        let st = b.take_if_done(r).expect("matched at post").expect("ok");
        assert_eq!(st.len(), 5);
        assert_eq!(&buf, b"hello");
        assert_eq!(b.st.ux.pool_len(), 1, "the small buffer is kept for the next unexpected message");
        assert_eq!(b.st.ux.bytes(), 0);
    }

    #[test]
    fn a_longer_message_truncates_the_receive() {
        let (mut a, mut b) = pair();
        let mut buf = [0u8; 2];
        let r = recv(&mut b, Some(0), Some(1), &mut buf);
        send(&mut a, 1, 1, b"abcd", false);
        settle(&mut [&mut a, &mut b]);
        match b.take_if_done(r).expect("done") {
            Err(Error::Truncated { len: 4, capacity: 2, source_rank: 0, tag: 1 }) => {}
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_synchronous_send_completes_only_once_matched() {
        let (mut a, mut b) = pair();
        let s = send(&mut a, 1, 2, b"x", true).expect("a synchronous send waits for its ACK");
        settle(&mut [&mut a, &mut b]);
        assert!(!a.is_done(s), "no receive matched yet");
        let mut buf = [0u8; 1];
        let r = recv(&mut b, Some(0), Some(2), &mut buf);
        settle(&mut [&mut a, &mut b]);
        assert!(b.take_if_done(r).expect("done").is_ok());
        assert!(a.take_if_done(s).expect("acknowledged").is_ok());
    }

    #[test]
    fn small_sends_that_find_the_ring_full_queue_behind_in_order_and_count_once() {
        // A 4 KiB ring holds a few dozen of these: the first sends take the inlined path
        // straight into the ring, then one finds it full and queues, and every later one
        // queues behind it (never overtaking it into the ring).
        let name = format!("tmpi-ring-full-{}", std::process::id());
        let fa = tmpi_transport::shm::ShmFabric::create(&name, 0, 2, 4096).expect("segment");
        let fb = tmpi_transport::shm::ShmFabric::open(&name, 1, 2).expect("segment");
        fa.unlink().expect("unlink");
        let mut a = Engine::new(AnyFabric::Shm(fa), 0, 2, Config::default()).expect("engine");
        let mut b = Engine::new(AnyFabric::Shm(fb), 1, 2, Config::default()).expect("engine");
        const N: usize = 300;
        let data: Vec<[u8; 40]> = (0..N).map(|i| [i as u8; 40]).collect();
        let sends: Vec<ReqId> = data.iter().filter_map(|d| send(&mut a, 1, 5, d, false)).collect();
        assert!(!sends.is_empty() && sends.len() < N, "some went straight out, the rest queued");
        assert_eq!((a.st.stats.msgs_sent, a.st.stats.eager), (N as u64, N as u64), "each counted once");
        let mut bufs = vec![[0u8; 40]; N];
        let rs: Vec<_> = bufs.iter_mut().map(|buf| recv(&mut b, Some(0), Some(5), buf)).collect();
        settle(&mut [&mut a, &mut b]);
        for r in rs {
            assert!(b.take_if_done(r).expect("done").is_ok());
        }
        for s in sends {
            assert!(a.take_if_done(s).expect("done").is_ok());
        }
        assert!(bufs.iter().zip(&data).all(|(got, sent)| got == sent), "MPI order kept");
        assert_eq!(b.st.stats.msgs_recv, N as u64);
    }

    #[test]
    fn credit_runs_out_then_comes_back() {
        let cfg = Config { unexpected_max: 4 * (100 + UX_OVERHEAD), ..Config::default() };
        let mut v = job(2, cfg);
        let (b, a) = (&mut v.pop().expect("b"), &mut v.pop().expect("a"));
        let full = a.st.credit.left(1);
        let data = [7u8; 100];
        let mut sends = Vec::new();
        for _ in 0..6 {
            sends.extend(send(a, 1, 3, &data, false));
        }
        settle(&mut [&mut *a, &mut *b]);
        assert_eq!(a.st.stats.eager, 4);
        assert_eq!(a.st.stats.credit_rndv, 2, "without credit a message goes as a rendezvous");
        let mut bufs = vec![[0u8; 100]; 6];
        let rs: Vec<_> = bufs.iter_mut().map(|buf| recv(b, Some(0), Some(3), buf)).collect();
        settle(&mut [&mut *a, &mut *b]);
        for r in rs {
            assert!(b.take_if_done(r).expect("done").is_ok());
        }
        for s in sends {
            assert!(a.take_if_done(s).expect("done").is_ok());
        }
        assert!(bufs.iter().all(|b| b == &data));
        assert_eq!(a.st.credit.left(1) + b.st.credit.owed(0), full, "consumed credit is returned (or owed in the next batch)");
    }

    #[test]
    fn pipelined_chunks_grow_with_the_message_and_respect_the_packet_limit() {
        let max = 262_128;
        assert_eq!(stream_chunk(0, max), CHUNK_MIN);
        assert_eq!(stream_chunk(64 << 10, max), 16 << 10);
        assert_eq!(stream_chunk(256 << 10, max), 32 << 10);
        assert_eq!(stream_chunk(1 << 20, max), 64 << 10);
        assert_eq!(stream_chunk(4 << 20, max), 128 << 10);
        assert_eq!(stream_chunk(64 << 20, max), max, "capped by the ring's packet limit");
        assert_eq!(stream_chunk(usize::MAX, max), max);
        assert_eq!(stream_chunk(1 << 20, 100), 100, "a small packet limit wins over the minimum");
        assert_eq!(stream_chunk(1 << 20, 0), 1);
        let mut last = 0;
        for total in (0..40).map(|i| 1usize << i) {
            let c = stream_chunk(total, usize::MAX);
            assert!(c >= last && c % 4096 == 0 && c >= CHUNK_MIN, "{total}: {c}");
            last = c;
        }
    }

    #[test]
    fn a_pipelined_stream_starts_and_ends_with_small_packets() {
        let pieces = |total: usize, chunk: usize| {
            let mut v = Vec::new();
            let mut off = 0;
            while off < total {
                let n = stream_piece(total, off, chunk);
                assert!(n > 0 && n <= chunk, "{total}/{chunk}: piece {n} at {off}");
                v.push(n);
                off += n;
            }
            assert_eq!(off, total);
            v
        };
        let k = 1 << 10;
        assert_eq!(pieces(1 << 20, 128 * k), [32 * k, 128 * k, 128 * k, 128 * k, 128 * k, 128 * k, 128 * k, 128 * k, 64 * k, 32 * k]);
        assert_eq!(pieces(256 * k, 64 * k), [16 * k, 64 * k, 64 * k, 64 * k, 32 * k, 16 * k]);
        assert_eq!(pieces(20 * k, 16 * k), [4 * k, 12 * k, 4 * k]);
        assert_eq!(pieces(100, 1), vec![1; 100], "a one-byte limit is kept");
        assert_eq!(pieces(5000, 100), vec![100; 50]);
        for total in [1, 4095, 4096, 70_000, 1_000_003, 64 << 20] {
            for chunk in [1, 4096, 16 * k, 100_000, 262_128] {
                let v = pieces(total, chunk);
                let edge = (chunk / 4).max(4096).min(chunk);
                assert!(v[0] <= edge && v[v.len() - 1] <= 2 * edge, "{total}/{chunk}: {v:?}");
            }
        }
    }

    #[test]
    fn a_malformed_control_message_names_its_sender() {
        let (mut a, mut b) = pair();
        a.inject(1, PKT_WHOLE, 5, &[TmOp::NoTag as u8, 2, 0, 0, 1]).expect("inject");
        match b.progress() {
            Err(Error::Protocol { rank: 0, .. }) => {}
            other => panic!("{other:?}"),
        }
    }
}
