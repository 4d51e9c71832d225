//! The reader's side of a rendezvous: a matched request starts a read ([`State::start_read`],
//! its way chosen by [`way::plan_read`]), which asks the target (for a stream, a grant or a
//! share), or copies at once what the sender pre-granted; the answers complete it, and its end
//! sends the FIN.

use super::*;

/// An RDMA read this rank issued for a rendezvous receive.
pub(in crate::engine) struct ReadOp {
    pub(in crate::engine) rid: ReqId,
    pub(in crate::engine) src: usize,
    /// Bytes to read (the message, or the receive buffer if that is shorter).
    pub(in crate::engine) n: usize,
    pub(in crate::engine) got: usize,
    /// Set when the TM-SRQ asked for the read (expected rendezvous).
    pub(in crate::engine) hw: Option<ReadId>,
    pub(in crate::engine) info: RndvInfo,
    /// Bytes `[0, split)` this rank copies itself after a single-copy grant; the target
    /// writes `[split, n)`.
    pub(in crate::engine) split: usize,
    /// The target may write into the receive buffer (a single-copy request named it): the
    /// buffer must outlive the read even if the receive is abandoned.
    pub(in crate::engine) remote_write: bool,
    /// This rank's share failed; the read completes with an error once the target's share is
    /// done (it may still be writing into the buffer).
    pub(in crate::engine) failed: bool,
    /// A pre-granted single copy started without a request: nothing was asked of the target,
    /// which may revoke the grant ([`Control::Revoke`]) until the copy is done (except its
    /// share, when `split < n`: asked with [`ReadMode::Share`], and the target's to refuse).
    pub(in crate::engine) at_once: bool,
    /// The target revoked its pre-grant while its share was asked for: the answer goes back
    /// when the read ends, after its FIN.
    pub(in crate::engine) revoke_ack: bool,
    /// How [`adapt::Epochs`] placed the read (`TMPI_SINGLE_COPY_MIN=auto`); it must hear of
    /// its end.
    pub(in crate::engine) placed: Option<adapt::Placed>,
}

/// The reads stage: the rendezvous reads in progress, and who lately read from us.
pub(in crate::engine) struct Reads {
    /// Rendezvous reads in progress.
    ops: Slab<ReadOp>,
    /// Rendezvous reads this rank has started, and per world rank their count when that rank
    /// last sent a FIN for a send of ours (0: never): whether it is reading from us (see
    /// `State::peer_reading`).
    begun: u64,
    fin_seen: Vec<u64>,
}

impl Reads {
    /// No reads, in a job of `size` ranks.
    pub(in crate::engine) fn new(size: usize) -> Self {
        Reads { ops: Slab::new(), begun: 0, fin_seen: vec![0; size] }
    }

    pub(in crate::engine) fn get(&self, k: Key) -> Option<&ReadOp> {
        self.ops.get(k)
    }

    pub(in crate::engine) fn get_mut(&mut self, k: Key) -> Option<&mut ReadOp> {
        self.ops.get_mut(k)
    }

    pub(super) fn insert(&mut self, op: ReadOp) -> Key {
        self.ops.insert(op)
    }

    pub(super) fn remove(&mut self, k: Key) -> Option<ReadOp> {
        self.ops.remove(k)
    }

    pub(super) fn vacant_key(&self) -> Key {
        self.ops.vacant_key()
    }

    pub(in crate::engine) fn keys(&self) -> impl Iterator<Item = Key> + '_ {
        self.ops.keys()
    }

    pub(in crate::engine) fn len(&self) -> usize {
        self.ops.len()
    }

    pub(in crate::engine) fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// The peer that may be writing into the buffer of read `k` (its target, asked for a
    /// share), if any.
    pub(in crate::engine) fn remote_writer(&self, k: Key) -> Option<usize> {
        self.ops.get(k).filter(|op| op.remote_write).map(|op| op.src)
    }

    /// `src` sent a FIN for a send of ours: it is reading from us.
    pub(in crate::engine) fn fin_from(&mut self, src: usize) {
        if let Some(at) = self.fin_seen.get_mut(src) {
            *at = self.begun.max(1);
        }
    }
}

impl State {
    /// `src` abandoned its pre-granted send `name`: this rank must no longer copy its buffer.
    /// A request still unexpected loses its grant (a later match asks, and is refused); a copy
    /// started without asking that has not run yet fails (one that asked is the target's to
    /// refuse, as for any abandoned send). Then the answer goes back, after any FIN already
    /// queued (a read that copied first completed the send with it).
    pub(in crate::engine) fn on_revoke(&mut self, src: usize, name: u32) {
        let names = |i: &RndvInfo| i.pregranted && i.tmh.app_ctx == name;
        let ux: Vec<Key> =
            self.ux.keys().filter(|&k| self.ux.get(k).is_some_and(|u| u.src_world == src && u.rndv.as_ref().is_some_and(names))).collect();
        for k in ux {
            if let Some(info) = self.ux.get_mut(k).and_then(|u| u.rndv.as_mut()) {
                info.pregranted = false;
            }
        }
        let reads: Vec<Key> =
            self.reads.keys().filter(|&k| self.reads.get(k).is_some_and(|op| op.at_once && op.src == src && names(&op.info))).collect();
        let mut shared = false;
        for k in reads {
            match self.reads.get_mut(k) {
                // Its share is asked for: the target refuses it or writes it, and our copy of
                // the rest runs now, so the answer waits for the read to end (after its FIN).
                Some(op) if op.split < op.n => {
                    op.revoke_ack = true;
                    shared = true;
                }
                _ => {
                    if let Err(e) = self.finish_read(k, false) {
                        self.outbox.fail(e);
                    }
                }
            }
        }
        if !shared {
            self.outbox.control(src, Control::RevokeAck { name });
        }
    }
    /// A rendezvous request handled by software (unexpected in the TM-SRQ).
    pub(in crate::engine) fn on_rndv(&mut self, src: usize, req: &[u8]) -> Result<()> {
        let info = RndvInfo::parse(req)?;
        self.stats.msgs_recv += 1;
        self.stats.bytes_recv += info.len as u64;
        let key = self.ux.vacant_key();
        match self.matcher.arrive(info.tmh.tag, key) {
            Arrived::Matched(_, rid, _) => {
                self.stats.sw_matched += 1;
                self.leave_queues(rid);
                self.size_owned(rid, info.len);
                if !self.admits(rid, info.tmh.tag, src) {
                    self.fail_recv(rid, malformed_from(src, "a message under another rank's name"));
                    return Ok(());
                }
                self.start_read(rid, src, info, None)
            }
            Arrived::Unexpected => {
                self.stats.unexpected += 1;
                let k = self.ux.insert(UxMsg {
                    src_world: src,
                    tag64: info.tmh.tag,
                    total: info.len,
                    data: Vec::new(),
                    complete: false,
                    ack: None,
                    rndv: Some(info),
                });
                debug_assert_eq!(k, key);
                Ok(())
            }
        }
    }
    /// Starts reading a matched rendezvous message from `src` into receive `rid`, the way
    /// [`plan_read`] says.
    pub(in crate::engine) fn start_read(&mut self, rid: ReqId, src: usize, info: RndvInfo, hw: Option<ReadId>) -> Result<()> {
        let key = self.reads.vacant_key();
        let (n, buf) = self.recv_reads(rid, src, &info, hw.is_some(), key)?;
        // A receive buffer in this rank's shared heap is written by the target with a memcpy
        // whichever way is asked: nothing to learn from it, and the target must be asked.
        let own_place = buf.and_then(|b| self.ways.heaps.locate(b.addr(), n));
        let (cma, placed) = self.choose_way(src, n, buf.is_some(), own_place.is_some());
        // Pre-granted by the sender from its shared heap, which this rank maps already: the
        // range is found by its address in the sender's heap.
        let sender_heap = if info.pregranted { self.ways.heaps.mapped_place(src, info.rvh.va, n) } else { None };
        self.reads.begun += 1;
        let facts = ReadFacts {
            n,
            len: info.len,
            has_buf: buf.is_some(),
            cma,
            pregranted: info.pregranted,
            sender_heap: sender_heap.is_some(),
            own_heap: own_place.is_some(),
            others: !self.reads.is_empty(),
            peer_reading: self.peer_reading(src),
        };
        let plan = plan_read(&facts);
        let at_once = matches!(plan.start, ReadStart::AtOnce { .. });
        let split = plan.split(n);
        if let (ReadStart::AtOnce { heap: true, .. }, Some(p)) = (plan.start, placed) {
            // Nothing to learn from a heap copy (its period is not timed).
            self.ways.copy.spoil(p);
        }
        crate::seen::msg(false, src, info.tmh.tag, info.len, read_proto(&plan, cma, hw.is_some()));
        let op = ReadOp {
            rid,
            src,
            n,
            got: 0,
            hw,
            info,
            split,
            remote_write: plan.remote_write,
            failed: false,
            at_once,
            revoke_ack: false,
            placed,
        };
        let k = self.reads.insert(op);
        debug_assert_eq!(k, key);
        if n == 0 {
            return self.finish_read(key, true);
        }
        match plan.start {
            ReadStart::AtOnce { heap, split } => self.copy_at_once(key, heap.then_some(sender_heap).flatten(), split, own_place),
            ReadStart::Ask { cma } => self.request_read(key, cma, n, true),
        }
        Ok(())
    }
    /// Read `key`, pre-granted, is copied at once (from the sender's heap at `heap`, else by
    /// single copy) up to `split`; from `split < n` the target is asked for the rest, into
    /// the receive buffer (at `own_place` in this rank's heap, if it lies there).
    fn copy_at_once(&mut self, key: Key, heap: Option<HeapSrc>, split: usize, own_place: Option<HeapSrc>) {
        let Some(op) = self.reads.get(key) else { return };
        let (n, placed) = (op.n, op.placed);
        if let Some(place) = heap {
            self.ways.heaps.grants.insert((key.idx(), key.gen()), place);
        } else if let Some(p) = placed {
            // Granted with the request itself: no round trip.
            self.ways.copy.pregranted(p);
        }
        self.stats.pregranted += 1;
        let buf = match self.reqs.get(op.rid) {
            Some(Req { kind: ReqKind::Recv(r), .. }) => r.buf,
            _ => None,
        };
        if let (true, Some(b)) = (split < n, buf) {
            self.stats.pregranted_splits += 1;
            self.request_share(key, b.addr(), own_place);
        }
        self.outbox.copy_read(key);
    }
    /// Receive `rid` is read into as read `key` from `src`, which `info` announced (`hw`:
    /// the TM-SRQ matched it and asked for the read): it leaves the software queue and takes
    /// the message's envelope. Returns the bytes to read and the receive buffer.
    fn recv_reads(&mut self, rid: ReqId, src: usize, info: &RndvInfo, hw: bool, key: Key) -> Result<(usize, Option<RawBufMut>)> {
        let Some(Req { kind: ReqKind::Recv(r), .. }) = self.reqs.get_mut(rid) else {
            return Err(Error::State("rendezvous matched a receive that is gone".into()));
        };
        // A receive the TM-SRQ matched (and asked to read for) is still queued in software
        // (its MATCH completion is handled after this): take it out there too, or a later
        // message would match it. Its tag-list entry is consumed.
        if let RecvPhase::Posted { match_id, .. } = std::mem::replace(&mut r.phase, RecvPhase::Reading(key)) {
            self.matcher.cancel(match_id, r.key);
        }
        r.src_world = src;
        r.source = src_of(info.tmh.tag);
        r.tag = tag_of(info.tmh.tag);
        r.total = info.len;
        let n = if hw { info.len } else { info.len.min(r.cap) };
        Ok((n, r.buf))
    }
    /// Whether a read of `n` bytes from `src` goes by single copy (`TMPI_SINGLE_COPY_MIN`, or
    /// the adapt stage's measurement, which places it: `Some`). Single copy needs the buffer
    /// (`has_buf`; an abandoned receive streams and discards); a buffer in this rank's heap
    /// (`own_heap`) teaches nothing.
    fn choose_way(&mut self, src: usize, n: usize, has_buf: bool, own_heap: bool) -> (bool, Option<adapt::Placed>) {
        let cma_ok = self.ways.cma_to(src) && has_buf;
        match self.ways.cma_min {
            Some(min) => (cma_ok && n >= min, None),
            None if cma_ok && n > 0 => {
                let p = self.ways.copy.start(n, src, adapt::Stamp::now);
                if own_heap {
                    self.ways.copy.spoil(p);
                }
                (p.arm == adapt::Arm::Cma, Some(p))
            }
            None => (false, None),
        }
    }
    /// Asks again, through the ring, for the first `len` bytes of read `key` (its single copy
    /// failed or its heap could not be mapped): it is no longer a measurement.
    pub(in crate::engine) fn request_streamed(&mut self, key: Key, len: usize) {
        if let Some(op) = self.reads.get_mut(key) {
            // Asked now: the target refuses it if it abandons the send.
            op.at_once = false;
            if let Some(p) = op.placed {
                self.ways.copy.spoil(p);
            }
        }
        self.request_read(key, false, len, false);
    }
    /// Asks the target of pre-granted read `key` to write its share, `[split, n)`, into the
    /// receive buffer at `dst` ([`ReadMode::Share`]) while this rank copies `[0, split)`;
    /// with a buffer in this rank's shared heap, the request names its place there (`heap`).
    fn request_share(&mut self, key: Key, dst: usize, heap: Option<HeapSrc>) {
        let Some(op) = self.reads.get(key) else { return };
        let q = ReadRequest {
            read: read_name(key),
            mode: ReadMode::Share { dst: dst as u64 },
            send: op.info.tmh.app_ctx,
            va: op.info.rvh.va.wrapping_add(op.split as u64),
            key: op.info.key,
            len: (op.n - op.split) as u64,
            reader_maps_heap: false,
            dst_heap: heap.map(HeapPlace::from),
        };
        let src = op.src;
        self.outbox.rma(src, Rma::ReadReq(q));
    }
    /// `k` more bytes of read `key` are in place; completes it when all are.
    pub(in crate::engine) fn read_progress(&mut self, key: Key, k: usize) -> Result<()> {
        let Some(op) = self.reads.get_mut(key) else { return Ok(()) };
        op.got += k;
        if op.got >= op.n {
            let ok = !op.failed;
            self.finish_read(key, ok)?;
        }
        Ok(())
    }
    /// Sends the RDMA read request of `key` to its target: `cma` asks for a grant to copy the
    /// range ourselves ([`ReadMode::SingleCopy`]), else for the data through the ring.
    /// `len` is how many bytes from the start of the range to ask for. A single-copy request
    /// also names the receive buffer, into which the target may write its share.
    ///
    /// With `heap`, the request also says whether this rank maps the target's shared heap
    /// and names the receive buffer's place in this rank's own heap: the target may then
    /// grant a memcpy from its heap, or memcpy its share into ours, in either mode.
    pub(in crate::engine) fn request_read(&mut self, key: Key, cma: bool, len: usize, heap: bool) {
        let Some(op) = self.reads.get(key) else { return };
        let rbuf = match self.reqs.get(op.rid) {
            Some(Req { kind: ReqKind::Recv(RecvState { buf: Some(b), .. }), .. }) => Some(*b),
            _ => None,
        };
        let mode = match rbuf {
            _ if !cma => ReadMode::Stream,
            Some(b) => ReadMode::SingleCopy { dst: b.addr() as u64 },
            None => ReadMode::SingleCopy { dst: 0 },
        };
        let q = ReadRequest {
            read: read_name(key),
            mode,
            send: op.info.tmh.app_ctx,
            va: op.info.rvh.va,
            key: op.info.key,
            len: len as u64,
            reader_maps_heap: heap && rbuf.is_some() && self.ways.heaps.may_map(op.src),
            dst_heap: rbuf.filter(|_| heap).and_then(|b| self.ways.heaps.locate(b.addr(), len)).map(HeapPlace::from),
        };
        let src = op.src;
        self.outbox.rma(src, Rma::ReadReq(q));
    }
    /// All bytes of a read are in (or it was refused): complete the receive and send FIN.
    pub(in crate::engine) fn finish_read(&mut self, read: Key, ok: bool) -> Result<()> {
        let Some(op) = self.reads.remove(read) else { return Ok(()) };
        if let Some(p) = op.placed {
            // The way of this rank's next period of the class, for the peer that follows it
            // (ahead of the FIN below, so before the peer's next window starts).
            if let Some((class, arm)) = self.ways.copy.finish(op.n, p, ok, adapt::Stamp::now) {
                if op.src > self.rank {
                    self.outbox.control(op.src, Control::ReadWay { class: class as u32, way: arm as u32 });
                }
            }
        }
        self.advise(op.src, op.n);
        if let Some(id) = op.hw {
            // The TM-SRQ completes DATA_VALID and queues the FIN itself.
            let r =
                if ok { self.offload.tm_mut().read_complete(id) } else { self.offload.tm_mut().read_failed(id, WcStatus::RemAccessErr) };
            self.ack_revoke(&op);
            return r.map_err(|e| Error::Transport(e.into()));
        }
        if ok {
            self.outbox.fin(op.src, &Fin { tmh: op.info.tmh, rvh: op.info.rvh }.to_bytes());
        }
        self.ack_revoke(&op);
        let failure = match self.reqs.get(op.rid) {
            Some(Req { kind: ReqKind::Recv(r), .. }) if !ok => {
                Some(Error::RemoteAccess { rank: r.source, reason: "the sender refused the rendezvous read".into() })
            }
            _ => None,
        };
        self.end_recv(op.rid, failure);
        Ok(())
    }
    /// The answer to a revoke that waited for read `op` to end ([`ReadOp::revoke_ack`]).
    fn ack_revoke(&mut self, op: &ReadOp) {
        if op.revoke_ack {
            // A FIN the TM-SRQ queued goes first.
            self.take_transmits();
            self.outbox.control(op.src, Control::RevokeAck { name: op.info.tmh.app_ctx });
        }
    }
    /// Whether this rank should copy (part of) a read of `n` bytes from a peer's shared heap
    /// into its receive buffer around the cache, with non-temporal stores
    /// ([`copy_streaming`]): when the read alone is at least [`streaming_copy_min`] (half
    /// the L3), or when it is at least
    /// [`AROUND_CACHE_MIN`] and the reads in flight together are (a window, as in `osu_bw`:
    /// its receive buffers are distinct, so they cannot all stay in the cache, whereas a
    /// ping-pong reuses one buffer that does). `osu_bw -d shared` 256/512 KiB 1.75/1.66x the
    /// bytes, and a ping-pong of the same sizes 1.5x the time if it went around the cache too
    /// (`bench/results/p2p-2026-11-27b.md`).
    ///
    /// [`copy_streaming`]: tmpi_transport::shm::copy_streaming
    /// [`streaming_copy_min`]: tmpi_transport::shm::streaming_copy_min
    pub(in crate::engine) fn around_cache(&self, n: usize) -> bool {
        let min = tmpi_transport::shm::streaming_copy_min();
        n >= min || (n >= AROUND_CACHE_MIN && self.reads.keys().filter_map(|k| self.reads.get(k)).map(|op| op.n).sum::<usize>() >= min)
    }
    /// Whether `src` has lately been reading from this rank: it sent a FIN within our last
    /// [`PEER_READING_WITHIN`] reads. Then both cores have copies of their own (`osu_bibw`).
    pub(super) fn peer_reading(&self, src: usize) -> bool {
        self.reads.fin_seen.get(src).is_some_and(|&at| at != 0 && self.reads.begun - at < PEER_READING_WITHIN)
    }

    /// Read response: `data` of read `read` at `offset`, streamed by the target.
    pub(in crate::engine) fn on_read_resp(&mut self, src: usize, read: Key, offset: u64, data: &[u8]) -> Result<()> {
        let off = usize::try_from(offset).unwrap_or(usize::MAX);
        let windowed = self.reads.len() > 1;
        let both_ways = self.peer_reading(src);
        let op = self.reads.get_mut(read).ok_or_else(|| malformed("read response for no read"))?;
        if off.checked_add(data.len()).is_none_or(|end| end > op.n) {
            return Err(malformed("read response outside the read"));
        }
        // A read far larger than the cache goes around it (see `copy_streaming`), and so does
        // one of `stream_nt_min` or more among others in flight (a window, whose destinations
        // together outgrow the cache), from `STREAM_NT_ONE_WAY_MIN` where the peer does not
        // read from this rank at the same time (`osu_bw`: its one receive buffer stays in the
        // cache); a lone one below half the L3 does not (a ping-pong's buffers stay in the
        // cache: `osu_latency` 1/2 MiB took 1.20/1.27x the time with those stores). Not for a
        // window of smaller reads, as a heap read does (`around_cache`): from 1 MiB rings, that
        // took `osu_bw` 0.83-0.95x the bytes at 512 KiB-4 MiB.
        let nt_min = self.ways.stream_nt_min.get(src).copied().unwrap_or(usize::MAX);
        let stream = copies_out_around_cache(op.n, windowed, both_ways, nt_min);
        if let Some(Req { kind: ReqKind::Recv(r), .. }) = self.reqs.get(op.rid) {
            if let Some(b) = &r.buf {
                if stream {
                    b.fill_with(off, data.len(), |dst| tmpi_transport::shm::copy_streaming(dst, data));
                } else {
                    b.write_at(off, data);
                }
            }
        }
        self.read_progress(read, data.len())
    }

    /// The target wrote its share of read `read` into our buffer.
    pub(in crate::engine) fn on_write_done(&mut self, read: Key) -> Result<()> {
        let op = self.reads.get(read).ok_or_else(|| malformed("write completion for no read"))?;
        let share = op.n - op.split;
        self.read_progress(read, share)
    }

    /// The target granted read `read`: this rank copies `[0, split)` itself (from the
    /// target's heap at `heap`, else by single copy).
    pub(in crate::engine) fn on_grant(&mut self, read: Key, split: u64, heap: Option<HeapPlace>) -> Result<()> {
        let split = usize::try_from(split).unwrap_or(usize::MAX);
        let op = self.reads.get_mut(read).ok_or_else(|| malformed("read grant for no read"))?;
        if split > op.n {
            return Err(malformed("read grant splits outside the read"));
        }
        op.split = split;
        op.remote_write = split < op.n;
        if let Some(p) = op.placed {
            if heap.is_some() {
                // Served from the target's shared heap: neither way was measured.
                self.ways.copy.spoil(p);
            } else {
                self.ways.copy.granted(p, adapt::Stamp::now);
            }
        }
        if let Some(h) = heap {
            if self.ways.heaps.grants.len() > self.outbox.reads_queued().count() + 64 {
                // Grants of reads dropped because their target left: forget them.
                let live: std::collections::HashSet<(u32, u32)> = self.outbox.reads_queued().map(|k| (k.idx(), k.gen())).collect();
                self.ways.heaps.grants.retain(|k, _| live.contains(k));
            }
            self.ways.heaps.grants.insert((read.idx(), read.gen()), h.into());
        }
        self.outbox.copy_read(read);
        Ok(())
    }

    /// Drops the reads from `peer`, which departed (finalize waits for nothing from it).
    pub(in crate::engine) fn drop_reads_from(&mut self, peer: usize) {
        let gone: Vec<Key> = self.reads.keys().filter(|&k| self.reads.get(k).is_some_and(|op| op.src == peer)).collect();
        for k in gone {
            if let Some(op) = self.reads.remove(k) {
                if let Some(p) = op.placed {
                    // A way chosen for the departed peer's next window is told to no one.
                    let _ = self.ways.copy.finish(op.n, p, false, adapt::Stamp::now);
                }
            }
        }
        let reads = &self.reads;
        self.outbox.retain_reads(|k| reads.get(*k).is_some());
    }
}

impl Engine {
    /// The receive of read `k` is abandoned: the target of a single-copy read may be writing
    /// into its buffer, which must stay until that write is done (or the target is gone).
    pub(in crate::engine) fn abandon_read(&mut self, k: Key) {
        let Some(src) = self.st.reads.remote_writer(k) else { return };
        if !self.progress_while(src, |e| e.st.reads.remote_writer(k).is_some()) {
            // The buffer goes back to the caller, who may free it, while `src` may still
            // write into it: only ending this process is sound.
            let why = self.st.outbox.failure().map_or_else(String::new, |e| format!(" ({e})"));
            eprintln!(
                "tmpi: rank {}: progress keeps failing{why} while rank {src} may still write into a receive buffer; ending this rank so that nothing writes into freed memory",
                self.st.rank
            );
            std::process::exit(1);
        }
    }
}

/// How a rendezvous read moves its bytes and how it matched, for the trace.
fn read_proto(plan: &ReadPlan, cma: bool, offloaded: bool) -> u32 {
    let way = match (plan.start, cma) {
        (ReadStart::AtOnce { heap: true, .. }, _) => Proto::WAY_HEAP,
        (_, true) => Proto::WAY_CMA,
        (_, false) => Proto::WAY_STREAM,
    };
    Proto::RNDV | way | if offloaded { Proto::OFFLOADED } else { Proto::SOFTWARE }
}
