//! The rendezvous protocol: `TMH(RNDV) | RVH` announces a registered buffer; the receiver
//! reads it (an RDMA read request, served by the target after its fi_mr key check, streamed
//! back through the ring or granted for single copy), then sends `FIN`.

use super::*;
use crate::heap::HeapSrc;

/// Shared-heap reads the target was asked for are split from this many bytes when both
/// buffers lie in shared heaps: the reader copies the first half, the target the second,
/// both with memcpy. Below [`HEAP_SPLIT_BUSY_MAX`], not while the target has reads of its
/// own in flight (each core has its own copies then, as in `osu_bibw`).
const HEAP_SPLIT_MIN: usize = 256 << 10;
/// See [`HEAP_SPLIT_MIN`]: from here a heap read is split even while the target reads too.
const HEAP_SPLIT_BUSY_MAX: usize = 1 << 20;
/// A read pre-granted from the target's shared heap into a buffer in this rank's heap is
/// split without a round trip from this many bytes, by [`CMA_SHARE_MIN`]'s rules: the reader
/// asks the target for its share ([`ReadMode::Share`], naming the buffer's place in its heap)
/// and copies its own part at once, while the target memcpys the rest into our heap.
const HEAP_SHARE_MIN: usize = 64 << 10;

/// Bytes a reader copies itself of a pre-granted read of `n` bytes split without a round trip
/// ([`CMA_SHARE_MIN`]): half and [`SHARE_LEAD`], in whole pages; the target writes the rest.
fn share_split(n: usize) -> usize {
    ((n / 2 + SHARE_LEAD) & !4095).min(n)
}

/// What the reader of a split without a round trip copies beyond half: the target starts its
/// share a message later (`osu_latency` 32/64 KiB, 5 runs: 0.93/0.86x the time of no split
/// with 8 KiB, 0.98/0.89x with 12 KiB, 1.04/0.93x with none).
const SHARE_LEAD: usize = 8 << 10;
/// A rendezvous from this rank's shared heap is pre-granted below this many bytes (see
/// `State::may_pregrant`): `osu_latency -d shared` 16-256 KiB 0.78-0.90x the time of asking.
/// Not from here: a window of reads copied at once as they arrive has fewer in flight, so
/// fewer may go around the cache (`State::around_cache`); `osu_bw -d shared` measured
/// 0.88/0.75x at 256/512 KiB pre-granted (5 runs, not in rotated order, on a noisy host:
/// `bench/results/p2p-2026-11-27b.md`), so those sizes still ask.
const HEAP_PREGRANT_MAX: usize = 256 << 10;
/// The smallest read that goes around the cache because of the reads in flight with it
/// (`State::around_cache`).
const AROUND_CACHE_MIN: usize = 64 << 10;

/// How a read is named on the wire ([`Rma::read`]): its slot in `State::reads`, index and
/// generation, so an answer to a read that is gone never reaches the one reusing the slot.
#[inline]
pub(super) fn read_name(k: Key) -> u64 {
    u64::from(k.idx()) << 32 | u64::from(k.gen())
}

/// The read a peer's answer names (see [`read_name`]).
#[inline]
pub(super) fn read_key(name: u64) -> Key {
    Key::new((name >> 32) as u32, name as u32)
}

impl From<HeapSrc> for HeapPlace {
    fn from(h: HeapSrc) -> Self {
        HeapPlace { off: h.off, heap: h.desc }
    }
}

impl From<HeapPlace> for HeapSrc {
    fn from(p: HeapPlace) -> Self {
        HeapSrc { off: p.off, desc: p.heap }
    }
}

impl Engine {
    /// Starts a rendezvous send: register, then send the request; FIN completes it. An empty
    /// message has nothing to register (fi_mr refuses a zero length) and nothing to read.
    #[cold]
    pub(super) fn start_rndv(&mut self, dest: usize, tag64: u64, data: RawBuf) -> Result<ReqId> {
        self.st.stats.rndv += 1;
        let (addr, len) = (data.addr(), data.len());
        let (mr, key, va) = if len == 0 {
            (None, 0, 0)
        } else {
            let mr = self.st.mr.get(addr, len, Access::REMOTE_READ).map_err(tmpi_transport::Error::from)?;
            let key = mr.key().map_err(tmpi_transport::Error::from)?;
            let va = mr.remote_addr(addr).ok_or_else(|| Error::State("registration does not cover the send buffer".into()))?;
            (Some(mr), key, va)
        };
        let rkey = u32::try_from(key).map_err(|_| Error::State("memory key wider than the RVH's 32-bit rkey".into()))?;
        let pregranted =
            self.st.may_pregrant(dest, addr, va, len) && self.st.domain.check_remote(key, va, len as u64, RemoteOp::Read).is_ok();
        let granted = pregranted.then_some(dest);
        let req = self.st.new_send(
            dest,
            tag64,
            true,
            Some(RndvSend { buf: Some(data), _mr: mr, tag64, va, granted, pregranted, streamed: false }),
        )?;
        let hdr = RndvRequest { app_ctx: wire_name(req), tag: tag64, va, rkey, len: len as u64, pregranted }.encode();
        self.queue_out(dest, OutMsg { req, hdr, hdr_len: RNDV_REQ_LEN, data: OutData::Owned(Vec::new()), off: 0, started: false })?;
        Ok(req)
    }
}

impl State {
    /// The rendezvous state of send `k`, if it is a live rendezvous send.
    pub(super) fn rndv_send(&mut self, k: Option<ReqId>) -> Option<&mut RndvSend> {
        match self.reqs.get_mut(k?) {
            Some(Req { kind: ReqKind::Send(SendState { rndv: Some(r), .. }), .. }) => Some(r),
            _ => None,
        }
    }

    /// [`State::rndv_send`], to read.
    pub(super) fn rndv_send_ref(&self, k: ReqId) -> Option<&RndvSend> {
        match self.reqs.get(k) {
            Some(Req { kind: ReqKind::Send(SendState { rndv: Some(r), .. }), .. }) => Some(r),
            _ => None,
        }
    }

    /// Whether single copy may move data between this rank and world rank `r` (on, not refused
    /// by the kernel, and `r` on this host).
    fn cma_to(&self, r: usize) -> bool {
        self.cma && self.cma_peers.get(r).copied().unwrap_or(false)
    }

    /// Whether a rendezvous of `len` bytes at `addr` (`va` in its registration) to `dest` goes
    /// out pre-granted: the target's key check done with the request, so that the reader may
    /// copy at once instead of asking (one round trip fewer; the send holds its buffer until
    /// FIN as for any grant). Only where the reader may copy it straight from this rank's
    /// memory, below [`CMA_PREGRANT_MAX`]: from this rank's shared heap (below
    /// [`HEAP_PREGRANT_MAX`]) to a rank a grant of ours has named the heap to already (so it
    /// maps it, and finds the range by its address; before, it asks, and the grant names the
    /// heap), else by single copy, on and possible to `dest` and allowed by
    /// `TMPI_SINGLE_COPY_MIN` (a split the reader wants is asked for without a round trip,
    /// [`ReadMode::Share`]).
    fn may_pregrant(&self, dest: usize, addr: usize, va: u64, len: usize) -> bool {
        if len == 0 || len >= CMA_PREGRANT_MAX {
            return false;
        }
        if self.heaps.locate(addr, len).is_some() {
            // The reader finds the range in our heap by its address.
            return len < HEAP_PREGRANT_MAX && va == addr as u64 && self.heaps.named_to.get(dest).copied().unwrap_or(false);
        }
        self.cma_to(dest) && self.cma_min.is_none_or(|m| len >= m)
    }

    /// `src` abandoned its pre-granted send `name`: this rank must no longer copy its buffer.
    /// A request still unexpected loses its grant (a later match asks, and is refused); a copy
    /// started without asking that has not run yet fails (one that asked is the target's to
    /// refuse, as for any abandoned send). Then the answer goes back, after any FIN already
    /// queued (a read that copied first completed the send with it).
    pub(super) fn on_revoke(&mut self, src: usize, name: u32) {
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
    pub(super) fn on_rndv(&mut self, src: usize, req: &[u8]) -> Result<()> {
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
                self.ux_bytes += UX_OVERHEAD;
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

    /// Starts reading a matched rendezvous message from `src` into receive `rid`.
    pub(super) fn start_read(&mut self, rid: ReqId, src: usize, info: RndvInfo, hw: Option<ReadId>) -> Result<()> {
        let Some(Req { kind: ReqKind::Recv(r), .. }) = self.reqs.get_mut(rid) else {
            return Err(Error::State("rendezvous matched a receive that is gone".into()));
        };
        let key = self.reads.vacant_key();
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
        let n = if hw.is_some() { info.len } else { info.len.min(r.cap) };
        let buf = r.buf;
        // Single copy needs the buffer (an abandoned receive streams and discards).
        let cma_ok = self.cma_to(src) && buf.is_some();
        // A receive buffer in this rank's shared heap is written by the target with a memcpy
        // whichever way is asked: nothing to learn from it, and the target must be asked.
        let own_place = buf.and_then(|b| self.heaps.locate(b.addr(), n));
        let in_heap = own_place.is_some();
        let (cma, placed) = match self.cma_min {
            Some(min) => (cma_ok && n >= min, None),
            None if cma_ok && n > 0 => {
                let p = self.copy.start(n, src, adapt::Stamp::now);
                if in_heap {
                    self.copy.spoil(p);
                }
                (p.arm == adapt::Arm::Cma, Some(p))
            }
            None => (false, None),
        };
        // Pre-granted by the sender from its shared heap, which this rank maps already: one
        // memcpy at once, no request (the range is found by its address in the sender's heap).
        let pregranted = info.pregranted && n <= info.len && n < CMA_PREGRANT_MAX;
        let heap_at_once = (pregranted && n > 0 && buf.is_some()).then(|| self.heaps.mapped_place(src, info.rvh.va, n)).flatten();
        if let (Some(_), Some(p)) = (heap_at_once, placed) {
            // Nothing to learn from a heap copy (its period is not timed).
            self.copy.spoil(p);
        }
        self.reads_begun += 1;
        let windowed = !self.reads.is_empty() && n >= CMA_SPLIT_WINDOW_MIN;
        // Pre-granted by the sender (from its heap, or for single copy): copy at once, no request.
        let at_once = heap_at_once.is_some() || (cma && pregranted && !in_heap);
        // From `CMA_SHARE_MIN` the target writes a share, asked now: alone in flight (it waits
        // for our FIN), or in a window while it is not reading from us itself (`osu_bw`: it
        // waits too; in `osu_bibw` each core has its own reads to copy, and a share only
        // adds its system call).
        // A heap copy shares likewise from `HEAP_SHARE_MIN`, into a buffer in our heap.
        let share_min = match heap_at_once {
            Some(_) if in_heap => HEAP_SHARE_MIN,
            Some(_) => usize::MAX,
            None => CMA_SHARE_MIN,
        };
        let share = at_once && buf.is_some() && n >= share_min && !(windowed && self.peer_reading(src));
        // A heap share in a window is an even half: the target's memcpy starts as soon as it
        // is asked, and the lead only helps a lone read (`osu_bw -d shared` 64/128 KiB
        // 1.07/1.07x the bytes of the lead, `osu_latency` 128 KiB 0.85x the time with it).
        let split = match share {
            true if heap_at_once.is_some() && windowed => (n / 2) & !4095,
            true => share_split(n),
            false => n,
        };
        // The target writes a share into the buffer (by CMA or into our heap), or may once asked.
        let remote_write = (cma && !at_once) || split < n;
        let k = self.reads.insert(ReadOp {
            rid,
            src,
            n,
            got: 0,
            hw,
            info,
            split,
            remote_write,
            failed: false,
            at_once,
            revoke_ack: false,
            placed,
        });
        debug_assert_eq!(k, key);
        if n == 0 {
            return self.finish_read(key, true);
        }
        if at_once {
            if let Some(place) = heap_at_once {
                self.heaps.grants.insert((key.idx(), key.gen()), place);
            } else if let Some(p) = placed {
                // Granted with the request itself: no round trip.
                self.copy.pregranted(p);
            }
            self.stats.pregranted += 1;
            if let (true, Some(b)) = (split < n, buf) {
                self.stats.pregranted_splits += 1;
                self.request_share(key, b.addr(), own_place);
            }
            self.outbox.copy_read(key);
        } else {
            self.request_read(key, cma, n, true);
        }
        Ok(())
    }

    /// `TMPI_RNDV_THRESHOLD=auto`: a rendezvous read of `n` bytes from `src` ended; if this rank
    /// has found that eager pays for messages of that size (or single copy is impossible,
    /// which leaves the rings either way), it tells `src` to send them eagerly
    /// ([`Control::EagerBelow`], once per size).
    fn advise(&mut self, src: usize, n: usize) {
        if !self.rndv_adaptive || n >= self.rndv_ceiling {
            return;
        }
        let below = adapt::class_end(n).min(self.rndv_ceiling);
        if self.advised_up_to(src, below) {
            return;
        }
        let eager = if self.cma_to(src) { self.copy.eager_pays(n) } else { Some(true) };
        if eager == Some(true) {
            self.tell_eager_below(src, below);
        }
    }

    /// Whether `src` was told to send eagerly below `below` or more already (or is no rank).
    fn advised_up_to(&self, src: usize, below: usize) -> bool {
        self.advised.get(src).is_none_or(|&a| a >= below)
    }

    /// Tells `src` to send messages below `below` eagerly ([`Control::EagerBelow`]).
    fn tell_eager_below(&mut self, src: usize, below: usize) {
        self.advised[src] = below;
        self.outbox.control(src, Control::EagerBelow { bytes: below as u32 });
    }

    /// `TMPI_RNDV_THRESHOLD=auto`: lower-ranked `src`, which leads this rank's reads of a
    /// size class (both read it from each other, see [`adapt::Epochs::lead`]), found that
    /// eager pays for messages below `below`. A follower times none of its reads, so it
    /// would never find that itself: it advises `src` the same, for the pair's two
    /// directions move alike (`osu_bibw` 256 KiB: 51-53 GB/s with one direction eager, 33-36
    /// with both by rendezvous).
    pub(super) fn advise_as_led(&mut self, src: usize, below: usize) {
        let below = below.min(self.rndv_ceiling);
        if !self.rndv_adaptive || src >= self.rank || below == 0 || !self.copy.follows(below - 1, src) || self.advised_up_to(src, below) {
            return;
        }
        self.tell_eager_below(src, below);
    }

    /// Asks again, through the ring, for the first `len` bytes of read `key` (its single copy
    /// failed or its heap could not be mapped): it is no longer a measurement.
    pub(super) fn request_streamed(&mut self, key: Key, len: usize) {
        if let Some(op) = self.reads.get_mut(key) {
            // Asked now: the target refuses it if it abandons the send.
            op.at_once = false;
            if let Some(p) = op.placed {
                self.copy.spoil(p);
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
    pub(super) fn read_progress(&mut self, key: Key, k: usize) -> Result<()> {
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
    pub(super) fn request_read(&mut self, key: Key, cma: bool, len: usize, heap: bool) {
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
            reader_maps_heap: heap && rbuf.is_some() && self.heaps.may_map(op.src),
            dst_heap: rbuf.filter(|_| heap).and_then(|b| self.heaps.locate(b.addr(), len)).map(HeapPlace::from),
        };
        let src = op.src;
        self.outbox.rma(src, Rma::ReadReq(q));
    }

    /// An RMA packet: a read request to serve, or data, a grant, a refusal or a write done
    /// for a read this rank issued.
    pub(super) fn on_rma(&mut self, p: Packet<'_>) -> Result<()> {
        let m = Rma::parse(p.data).map_err(|_| malformed_from(p.src, "a malformed RMA packet"))?;
        let read = read_key(m.read());
        match m {
            Rma::ReadReq(q) => {
                self.serve_read(p.src, q);
                Ok(())
            }
            Rma::ReadResp { offset, data, .. } => {
                let off = usize::try_from(offset).unwrap_or(usize::MAX);
                let windowed = self.reads.len() > 1;
                let both_ways = self.peer_reading(p.src);
                let op = self.reads.get_mut(read).ok_or_else(|| malformed("read response for no read"))?;
                if off.checked_add(data.len()).is_none_or(|end| end > op.n) {
                    return Err(malformed("read response outside the read"));
                }
                // A read far larger than the cache goes around it (see `copy_streaming`), and
                // so does one of `stream_nt_min` or more among others in flight (a window,
                // whose destinations together outgrow the cache), from
                // `STREAM_NT_ONE_WAY_MIN` where the peer does not read from this rank at the
                // same time (`osu_bw`: its one receive buffer stays in the cache); a lone one
                // below half the L3 does not (a ping-pong's buffers stay in the cache:
                // `osu_latency` 1/2 MiB took 1.20/1.27x the time with those stores). Not for a
                // window of smaller reads, as a heap read does (`around_cache`): from 1 MiB
                // rings, that took `osu_bw` 0.83-0.95x the bytes at 512 KiB-4 MiB.
                let stream =
                    copies_out_around_cache(op.n, windowed, both_ways, self.stream_nt_min.get(p.src).copied().unwrap_or(usize::MAX));
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
            Rma::WriteDone { .. } => {
                let op = self.reads.get(read).ok_or_else(|| malformed("write completion for no read"))?;
                let share = op.n - op.split;
                self.read_progress(read, share)
            }
            Rma::Grant { split, heap, .. } => {
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
                        self.copy.spoil(p);
                    } else {
                        self.copy.granted(p, adapt::Stamp::now);
                    }
                }
                if let Some(h) = heap {
                    if self.heaps.grants.len() > self.outbox.reads_queued().count() + 64 {
                        // Grants of reads dropped because their target left: forget them.
                        let live: std::collections::HashSet<(u32, u32)> = self.outbox.reads_queued().map(|k| (k.idx(), k.gen())).collect();
                        self.heaps.grants.retain(|k, _| live.contains(k));
                    }
                    self.heaps.grants.insert((read.idx(), read.gen()), h.into());
                }
                self.outbox.copy_read(read);
                Ok(())
            }
            Rma::ReadErr { .. } => self.finish_read(read, false),
        }
    }

    /// The target side of an RDMA read: key, enablement, range and access are checked in
    /// this rank's fi_mr domain before a byte moves; a refusal goes back as an error.
    ///
    /// In [`ReadMode::SingleCopy`] a passed check grants the reader a single copy of the range
    /// (it is recorded on the send, whose buffer then stays put until FIN even if abandoned);
    /// in [`ReadMode::Stream`] the range is streamed back through the ring.
    ///
    /// Shared heaps come first, in either mode: a range in this rank's heap is granted for a
    /// memcpy by a reader that maps it, and a reader whose buffer lies in its own heap gets
    /// this rank's share written there with a memcpy (see [`State::serve_heap`]).
    pub(super) fn serve_read(&mut self, src: usize, q: ReadRequest) {
        let ReadRequest { read: id, mode, send, va, key, len, reader_maps_heap, dst_heap } = q;
        let sk = self.named_send(send, src);
        // Exactly the range the key check granted, and only while it lies inside the buffer of
        // the live rendezvous send the reader names (a cached registration can outlive it).
        let buf = self.domain.check_remote(key, va, len, RemoteOp::Read).ok().and_then(|range| {
            let [seg] = range.segments() else { return None };
            let Some(Req { kind: ReqKind::Send(s), result: None, .. }) = self.reqs.get(sk?) else { return None };
            let b = s.rndv.as_ref()?.buf?;
            let start = seg.addr.checked_sub(b.addr())?;
            let end = start.checked_add(seg.len)?;
            (end <= b.len() && seg.len as u64 == len).then(|| b.sub(start, end))
        });
        // A share is no grant: it is written below, into the reader's heap if it names one.
        let share = matches!(mode, ReadMode::Share { .. });
        let by_heap = !share
            && matches!((buf, sk), (Some(b), Some(k))
            if self.serve_heap(src, id, k, b, mode, reader_maps_heap, dst_heap.map(HeapSrc::from)));
        if let Some(b) = buf {
            // Through a heap the reader's core (or a memcpy of ours in its stead) copies.
            let arm = if mode == ReadMode::Stream && !by_heap { adapt::Arm::Stream } else { adapt::Arm::Cma };
            self.copy.peer_read(arm, b.len(), src, src < self.rank);
        }
        if by_heap {
            return;
        }
        match (buf, mode) {
            (Some(b), ReadMode::Share { dst }) => {
                // Only a send pre-granted to this reader (which holds its buffer until FIN or
                // the revoke's answer) has its share written unasked; `b` is the rest of the
                // read, from its offset in the send.
                let base = match sk.and_then(|k| self.rndv_send_ref(k)) {
                    Some(r) if r.pregranted && r.granted == Some(src) => r.buf.map(|sb| b.addr() - sb.addr()),
                    _ => None,
                };
                match base {
                    Some(base) => {
                        if let Some(h) = dst_heap.map(HeapSrc::from).filter(|_| self.heaps.may_map(src)) {
                            self.owe_heap_write(src, id, h);
                        }
                        self.outbox.copy_write(CmaWrite { dest: src, read: id, buf: b, dst, base })
                    }
                    None => self.outbox.rma(src, Rma::ReadErr { read: id }),
                }
            }
            (Some(b), ReadMode::SingleCopy { dst }) => {
                if let Some(r) = self.rndv_send(sk) {
                    r.granted = Some(src);
                }
                let n = b.len();
                // Split a large read: our half goes out once the grant is on its way. Below
                // 1 MiB, not while this rank has reads of its own in flight (both directions
                // busy, as in `osu_bibw`: each core already copies what it receives, and the
                // split only adds its system calls: 1.12-1.18x at 128-256 KiB). From 1 MiB
                // the split evens out the tail of a short window (`osu_bibw -W 8`: 0.62-0.83x
                // without it), but below 8 MiB not while this rank has `CMA_SPLIT_DEEP` reads
                // of its own (`osu_bibw`'s default window of 64: 1.17/1.23/1.17x at 1/2/4 MiB
                // without it, and 0.60-0.77x at 8-64 MiB).
                let busy =
                    !self.reads.is_empty() && (n < CMA_SPLIT_BUSY_MAX || (n < CMA_SPLIT_DEEP_MAX && self.reads.len() >= CMA_SPLIT_DEEP));
                // From `CMA_SPLIT_WINDOW_MIN` a reader asks for a read below `CMA_SPLIT_MIN`
                // only when it has others in flight (or the sender could not pre-grant it).
                let split = if dst != 0 && n >= CMA_SPLIT_WINDOW_MIN && !busy { (n / 2) & !4095 } else { n };
                self.outbox.rma(src, Rma::Grant { read: id, split: split as u64, heap: None });
                if split < n {
                    self.outbox.copy_write(CmaWrite { dest: src, read: id, buf: b.sub(split, n), dst, base: split });
                }
            }
            (Some(b), ReadMode::Stream) => {
                if let Some(r) = self.rndv_send(sk) {
                    r.streamed = true;
                }
                self.outbox.stream(RmaOut { dest: src, read: id, buf: b, off: 0, base: 0 })
            }
            (None, _) => {
                // Refused: the reader gets an error, and so does the send it was reading for
                // (no FIN will come for it).
                if let Some(k) = sk {
                    if let Some(Req { kind: ReqKind::Send(st), result: r @ None, .. }) = self.reqs.get_mut(k) {
                        if st.rndv.is_some() {
                            st.rndv = None;
                            *r = Some(Err(Box::new(Error::RemoteAccess {
                                rank: src,
                                reason: format!("rank {src} asked to read a range the registration does not allow"),
                            })));
                        }
                    }
                }
                self.outbox.rma(src, Rma::ReadErr { read: id });
            }
        }
    }

    /// Grants a checked read `id` of `b` (the live send `sk`) through the shared heaps if one
    /// side's buffer lies in one: returns `false` (nothing done) otherwise.
    ///
    /// - `b` in this rank's heap and the reader maps it: the grant names the range, and the
    ///   reader memcpys `[0, split)`; from [`HEAP_SPLIT_MIN`] on, when the reader's buffer is
    ///   in its heap too, this rank memcpys `[split, n)` into it at the same time.
    /// - Only the reader's buffer in its heap: this rank memcpys `[split, n)` into it, and the
    ///   reader copies `[0, split)` with CMA (a single-copy request from [`CMA_SPLIT_MIN`] on)
    ///   or nothing (`split` = 0).
    ///
    /// The send records the grant: its buffer stays put until FIN even if abandoned.
    #[allow(clippy::too_many_arguments)]
    fn serve_heap(
        &mut self,
        src: usize,
        id: u64,
        sk: Key,
        b: RawBuf,
        mode: ReadMode,
        reader_maps: bool,
        dst_heap: Option<HeapSrc>,
    ) -> bool {
        let n = b.len();
        if n == 0 || !self.heaps.enabled() {
            return false;
        }
        let from = if reader_maps { self.heaps.locate(b.addr(), n) } else { None };
        let into = dst_heap.filter(|_| self.heaps.may_map(src));
        let busy = !self.reads.is_empty() && n < HEAP_SPLIT_BUSY_MAX;
        let split = match (from, into) {
            (Some(_), Some(_)) if n >= HEAP_SPLIT_MIN && !busy => (n / 2) & !4095,
            (Some(_), _) => n,
            (None, Some(_)) if matches!(mode, ReadMode::SingleCopy { .. }) && self.cma && n >= CMA_SPLIT_MIN => (n / 2) & !4095,
            (None, Some(_)) => 0,
            (None, None) => return false,
        };
        if let Some(r) = self.rndv_send(Some(sk)) {
            r.granted = Some(src);
        }
        if from.is_some() {
            if let Some(named) = self.heaps.named_to.get_mut(src) {
                *named = true;
            }
        }
        self.outbox.rma(src, Rma::Grant { read: id, split: split as u64, heap: from.map(HeapPlace::from) });
        if let (Some(h), true) = (into, split < n) {
            self.owe_heap_write(src, id, h);
            self.outbox.copy_write(CmaWrite { dest: src, read: id, buf: b.sub(split, n), dst: 0, base: split });
        }
        self.heaps.grants_served += 1;
        true
    }

    /// The share of read `id` owed to `src` goes with a memcpy into its heap at `h` (its
    /// `CmaWrite` is queued next).
    fn owe_heap_write(&mut self, src: usize, id: u64, h: HeapSrc) {
        if self.heaps.writes.len() > self.outbox.writes_queued().count() + 64 {
            // Shares dropped because their reader left (see `leave`): forget them.
            let live: std::collections::HashSet<(usize, u64)> = self.outbox.writes_queued().map(|w| (w.dest, w.read)).collect();
            self.heaps.writes.retain(|k, _| live.contains(k));
        }
        self.heaps.writes.insert((src, id), h);
    }

    /// All bytes of a read are in (or it was refused): complete the receive and send FIN.
    pub(super) fn finish_read(&mut self, read: Key, ok: bool) -> Result<()> {
        let Some(op) = self.reads.remove(read) else { return Ok(()) };
        if let Some(p) = op.placed {
            // The way of this rank's next period of the class, for the peer that follows it
            // (ahead of the FIN below, so before the peer's next window starts).
            if let Some((class, arm)) = self.copy.finish(op.n, p, ok, adapt::Stamp::now) {
                if op.src > self.rank {
                    self.outbox.control(op.src, Control::ReadWay { class: class as u32, way: arm as u32 });
                }
            }
        }
        self.advise(op.src, op.n);
        if let Some(id) = op.hw {
            // The TM-SRQ completes DATA_VALID and queues the FIN itself.
            let r = if ok { self.tm.read_complete(id) } else { self.tm.read_failed(id, WcStatus::RemAccessErr) };
            self.ack_revoke(&op);
            return r.map_err(|e| Error::Transport(e.into()));
        }
        if ok {
            let mut fin = [0u8; TMH_LEN + RVH_LEN];
            fin[..TMH_LEN].copy_from_slice(&Tmh { op: TmOp::Fin, ..op.info.tmh }.to_bytes());
            fin[TMH_LEN..].copy_from_slice(&op.info.rvh.to_bytes());
            self.outbox.fin(op.src, &fin);
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

    /// A FIN: the receiver has the data of our rendezvous send. It must name a rendezvous
    /// send to that peer and repeat its match key and RVH address.
    pub(super) fn on_fin(&mut self, src: usize, tmh: Tmh, rvh: Rvh) -> Result<()> {
        let k = self.named_send(tmh.app_ctx, src).filter(|&k| self.rndv_send_ref(k).is_some_and(|r| r.tag64 == tmh.tag && r.va == rvh.va));
        let k = k.ok_or_else(|| malformed_from(src, "FIN for no rendezvous send"))?;
        if let Some((streamed, n)) = self.rndv_send(Some(k)).map(|r| (r.streamed, r.buf.map_or(0, |b| b.len()))) {
            // A read this rank did not stream was copied by the reader's core (single copy, a
            // shared heap).
            self.copy.peer_read(if streamed { adapt::Arm::Stream } else { adapt::Arm::Cma }, n, src, src < self.rank);
        }
        if let Some(at) = self.fin_seen.get_mut(src) {
            *at = self.reads_begun.max(1);
        }
        self.send_progress(k, false, true);
        Ok(())
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
    pub(super) fn around_cache(&self, n: usize) -> bool {
        let min = tmpi_transport::shm::streaming_copy_min();
        n >= min || (n >= AROUND_CACHE_MIN && self.reads.keys().filter_map(|k| self.reads.get(k)).map(|op| op.n).sum::<usize>() >= min)
    }

    /// Whether `src` has lately been reading from this rank: it sent a FIN within our last
    /// [`PEER_READING_WITHIN`] reads. Then both cores have copies of their own (`osu_bibw`).
    fn peer_reading(&self, src: usize) -> bool {
        self.fin_seen.get(src).is_some_and(|&at| at != 0 && self.reads_begun - at < PEER_READING_WITHIN)
    }
}

impl Engine {
    /// This rank's shared heap, created on first use (`None`: off or unavailable).
    pub(crate) fn shared_heap(&mut self) -> Option<std::sync::Arc<tmpi_transport::shm::heap::Heap>> {
        self.st.heaps.own()
    }
}

#[cfg(test)]
mod tests {
    use super::super::testkit::{pair, recv, send, settle};
    use super::*;
    use tmpi_transport::shm::heap::HeapDesc;

    /// The last control packet queued, which must be an RMA packet, decoded.
    fn last_rma(e: &Engine) -> Rma<'_> {
        let (_, c) = e.st.outbox.ctl().back().expect("a control packet");
        assert_ne!(c.flags & PKT_RMA, 0, "an RMA packet");
        Rma::parse(&c.bytes[..c.len as usize]).expect("a well-formed RMA packet")
    }

    /// Rank 0 of a two-rank job of threads, and the peer's fabric end (kept, never polled).
    fn engine() -> (Engine, tmpi_transport::local::LocalFabric) {
        let mut f = tmpi_transport::local::LocalFabric::create(2, 64 * 1024);
        let peer = f.swap_remove(1);
        (Engine::new(AnyFabric::Local(f.swap_remove(0)), 0, 2, Config::default()).unwrap(), peer)
    }

    /// A streamed read request of `len` bytes, named `read`, of send `send`.
    fn read_req(read: u64, send: u32, va: u64, key: u64, len: usize, maps: bool, dst_heap: Option<HeapSrc>) -> ReadRequest {
        ReadRequest {
            read,
            mode: ReadMode::Stream,
            send,
            va,
            key,
            len: len as u64,
            reader_maps_heap: maps,
            dst_heap: dst_heap.map(HeapPlace::from),
        }
    }

    /// A shared buffer is granted (for a memcpy) only while the send that lends it is live: once
    /// the send completed and the buffer was freed and its memory handed out again, a reader
    /// repeating the old request (send name, key, address) is refused by the target, and no
    /// grant names the new block.
    #[test]
    fn a_freed_shared_buffer_is_never_granted_again() {
        let (mut e, _peer) = engine();
        let Some(heap) = e.shared_heap() else {
            eprintln!("no shared heap on this system");
            return;
        };
        let len = 1 << 20;
        let mut a = heap.alloc(len, 8).unwrap();
        a.as_bytes_mut().fill(1);
        // SAFETY: `a` outlives the send, which completes below before `a` is dropped.
        let raw = unsafe { RawBuf::new(a.as_bytes()) };
        let rid = e.start_rndv(1, 77, raw).unwrap();
        let (key, va) = match e.st.rndv_send_ref(rid) {
            Some(r) => (r._mr.as_ref().unwrap().key().unwrap(), r.va),
            _ => panic!("no rendezvous send"),
        };
        let name = wire_name(rid);
        let id = 0x0909_0909_0909_0909;
        e.st.serve_read(1, read_req(id, name, va, key, len, true, None));
        let Rma::Grant { read, split, heap: Some(h) } = last_rma(&e) else { panic!("a grant naming our heap") };
        assert_eq!(read, id);
        assert_eq!(h.off, a.offset() as u64);
        assert_eq!(split, len as u64, "the reader copies it all");
        // A reader that does not map our heap gets the data streamed.
        e.st.serve_read(1, read_req(id, name, va, key, len, false, None));
        assert_eq!(e.st.outbox.streams_mut().pop_back().map(|r| r.buf.len()), Some(len));
        // The FIN completes the send; the user collects it and frees the buffer.
        e.st.send_progress(rid, true, true);
        assert!(e.take_if_done(rid).unwrap().is_ok());
        let off = a.offset();
        drop(a);
        let mut b = heap.alloc(len, 8).unwrap();
        assert_eq!(b.offset(), off, "the freed memory is handed out again");
        b.as_bytes_mut().fill(2);
        // SAFETY: `b` outlives the engine's use of it (the engine is dropped first).
        let raw = unsafe { RawBuf::new(b.as_bytes()) };
        let rid2 = e.start_rndv(1, 78, raw).unwrap();
        assert_ne!(wire_name(rid2), name);
        let before = e.st.outbox.ctl().len();
        e.st.serve_read(1, read_req(id, name, va, key, len, true, None));
        assert_eq!(e.st.outbox.ctl().len(), before + 1);
        assert_eq!(last_rma(&e), Rma::ReadErr { read: id }, "a stale read request is refused");
        assert!(e.st.outbox.streams().is_empty());
        drop(e);
        drop(b);
    }

    /// A single-copy read of 32 KiB to 1 MiB is split between reader and target unless the
    /// target is busy reading too (then each copies its own); from 1 MiB it is split anyway,
    /// unless the target's own reads in flight are many and the read is below 8 MiB.
    #[test]
    fn a_busy_target_splits_only_the_largest_reads() {
        let (mut e, _peer) = engine();
        let src = vec![3u8; 8 << 20];
        let split_of = |e: &mut Engine, len: usize| {
            // SAFETY: `src` outlives the engine.
            let raw = unsafe { RawBuf::new(&src[..len]) };
            let rid = e.start_rndv(1, 5, raw).unwrap();
            let (key, va) = match e.st.rndv_send_ref(rid) {
                Some(r) => (r._mr.as_ref().unwrap().key().unwrap(), r.va),
                _ => panic!("no rendezvous send"),
            };
            let q = ReadRequest { mode: ReadMode::SingleCopy { dst: 0x10_0000 }, ..read_req(7, wire_name(rid), va, key, len, false, None) };
            e.st.serve_read(1, q);
            let Rma::Grant { split, .. } = last_rma(e) else { panic!("a grant") };
            e.st.outbox.writes_mut().clear();
            split as usize
        };
        assert_eq!(split_of(&mut e, 256 << 10), 128 << 10, "idle: split");
        // Below CMA_SPLIT_MIN a reader asks only with other reads in flight (a window).
        assert_eq!(split_of(&mut e, 64 << 10), 32 << 10, "a window's 64 KiB read: split");
        assert_eq!(split_of(&mut e, 16 << 10), 16 << 10, "below CMA_SPLIT_WINDOW_MIN: the reader copies it all");
        // This rank reads something itself.
        let info = RndvInfo {
            tmh: Tmh { op: TmOp::Rndv, app_ctx: 0, tag: 0 },
            rvh: Rvh { va: 0, rkey: 0, len: 1 },
            key: 0,
            len: 1,
            pregranted: false,
        };
        let rid = Key::new(0, 0);
        let read = || ReadOp {
            rid,
            src: 1,
            n: 1,
            got: 0,
            hw: None,
            info,
            split: 1,
            remote_write: false,
            failed: false,
            at_once: false,
            revoke_ack: false,
            placed: None,
        };
        e.st.reads.insert(read());
        assert_eq!(split_of(&mut e, 256 << 10), 256 << 10, "busy: the reader copies it all");
        assert_eq!(split_of(&mut e, 2 << 20), 1 << 20, "busy, but large: split");
        // A deep queue of its own reads (`osu_bibw`'s window): no split below 8 MiB.
        while e.st.reads.len() < CMA_SPLIT_DEEP - 1 {
            e.st.reads.insert(read());
        }
        assert_eq!(split_of(&mut e, 2 << 20), 1 << 20, "one read short of deep: split");
        e.st.reads.insert(read());
        assert_eq!(split_of(&mut e, 2 << 20), 2 << 20, "deep: the reader copies it all");
        assert_eq!(split_of(&mut e, 4 << 20), 4 << 20, "deep, 4 MiB: the reader copies it all");
        assert_eq!(split_of(&mut e, 8 << 20), 4 << 20, "deep, but from CMA_SPLIT_DEEP_MAX: split");
        drop(e);
    }

    /// A heap read goes around the cache when it alone is at least half the L3, or when it
    /// is not small and the reads in flight together are (a window): never for a ping-pong's
    /// lone read below that.
    #[test]
    fn heap_reads_go_around_the_cache_for_large_reads_and_large_windows() {
        let (mut e, _peer) = engine();
        let min = tmpi_transport::shm::streaming_copy_min();
        let each = (min / 16).max(AROUND_CACHE_MIN);
        assert!(e.st.around_cache(min), "alone at the threshold");
        assert!(!e.st.around_cache(each), "a lone read below it");
        let info = RndvInfo {
            tmh: Tmh { op: TmOp::Rndv, app_ctx: 0, tag: 0 },
            rvh: Rvh { va: 0, rkey: 0, len: 1 },
            key: 0,
            len: 1,
            pregranted: false,
        };
        let read = |n: usize| ReadOp {
            rid: Key::new(0, 0),
            src: 1,
            n,
            got: 0,
            hw: None,
            info,
            split: n,
            remote_write: false,
            failed: false,
            at_once: false,
            revoke_ack: false,
            placed: None,
        };
        // A window of small reads never makes any read go around.
        for _ in 0..(min / (AROUND_CACHE_MIN / 2)) {
            e.st.reads.insert(read(AROUND_CACHE_MIN / 2));
        }
        assert!(!e.st.around_cache(AROUND_CACHE_MIN / 2), "small reads stay in the cache");
        e.st.reads = Slab::new();
        let mut keys = Vec::new();
        for i in 0..16 {
            assert!(!e.st.around_cache(each) || i * each >= min, "{i} reads in flight");
            keys.push(e.st.reads.insert(read(each)));
        }
        assert!(e.st.around_cache(each), "a window of {} bytes", 16 * each);
        for k in keys {
            e.st.reads.remove(k);
        }
        assert!(!e.st.around_cache(each), "the window drained");
        drop(e);
    }

    /// A reader whose buffer is in its own heap gets the target's share written there; a
    /// request without any heap goes the old way.
    #[test]
    fn a_reader_heap_receives_the_targets_share() {
        let (mut e, _peer) = engine();
        let len = 4 << 20;
        let src = vec![3u8; len];
        // SAFETY: `src` outlives the engine.
        let raw = unsafe { RawBuf::new(&src) };
        let rid = e.start_rndv(1, 5, raw).unwrap();
        let (key, va) = match e.st.rndv_send_ref(rid) {
            Some(r) => (r._mr.as_ref().unwrap().key().unwrap(), r.va),
            _ => panic!("no rendezvous send"),
        };
        let dst = HeapSrc { off: 8192, desc: HeapDesc { fd: 3, nonce: 11 } };
        let id = 0x0404_0404_0404_0404;
        e.st.serve_read(1, read_req(id, wire_name(rid), va, key, len, true, Some(dst)));
        let Rma::Grant { split, heap: None, .. } = last_rma(&e) else { panic!("a grant of no heap range") };
        assert_eq!(split, 0, "the target writes it all");
        assert_eq!(e.st.heaps.writes.get(&(1, id)).map(|h| h.off), Some(8192));
        assert_eq!(e.st.outbox.writes().back().map(|w| (w.base, w.buf.len())), Some((0, len)));
        let before = e.st.outbox.writes().len();
        e.st.serve_read(1, read_req(0x0505_0505_0505_0505, wire_name(rid), va, key, len, true, None));
        assert_eq!(e.st.outbox.writes().len(), before);
        assert_eq!(e.st.outbox.streams().len(), 1);
        drop(e);
    }

    /// A rendezvous of `len` bytes from rank 0 to rank 1 under `cfg`: the data arrives, both
    /// requests complete; returns the receiver's statistics.
    fn rendezvous(cfg: Config, len: usize) -> Stats {
        let mut v = super::super::testkit::job(2, cfg);
        let (b, a) = (&mut v.pop().expect("b"), &mut v.pop().expect("a"));
        let data: Vec<u8> = (0..len).map(|i| (i * 7 + i / 4093) as u8).collect();
        let mut buf = vec![0u8; len];
        let r = recv(b, Some(0), Some(8), &mut buf);
        let s = send(a, 1, 8, &data, false).expect("a rendezvous waits for its FIN");
        settle(&mut [&mut *a, &mut *b]);
        assert_eq!(b.take_if_done(r).expect("received").expect("ok").len(), len);
        assert!(a.take_if_done(s).expect("FIN").is_ok());
        assert!(buf == data, "the data arrived intact");
        assert!(b.st.reads.is_empty() && a.st.outbox.streams().is_empty() && a.st.outbox.writes().is_empty());
        std::mem::take(&mut b.st.stats)
    }

    /// Teaches `e`'s chooser that reads of `n` bytes are `stream_us` microseconds through the
    /// rings and `cma_us` by single copy (six timed periods, as a real run would give).
    fn teach(e: &mut Engine, n: usize, stream_us: u64, cma_us: u64) {
        let mut t = adapt::Stamp::now();
        for _ in 0..6 {
            let p = e.st.copy.start(n, 0, || t);
            t += std::time::Duration::from_micros(if p.arm == adapt::Arm::Cma { cma_us } else { stream_us });
            e.st.copy.finish(n, p, true, || t);
        }
    }

    /// Two engines of a two-rank job, `(a, b)`, the receiver `b` taught that single copy is
    /// the faster way for `n` bytes; `None` on one CPU (rendezvous does not start low there).
    fn taught_pair(n: usize) -> Option<(Engine, Engine)> {
        if crate::sys::usable_cpus() < 2 {
            return None;
        }
        let mut v = super::super::testkit::job(2, Config::default());
        let mut b = v.pop().expect("b");
        teach(&mut b, n, 30, 10);
        Some((v.pop().expect("a"), b))
    }

    /// `TMPI_RNDV_THRESHOLD=auto`: between ranks of one host a 64 KiB message starts as a
    /// rendezvous; a receiver that found the rings faster for that size tells the sender
    /// (`EAGER_BELOW`), and the next one goes eagerly. One that found single copy faster
    /// says nothing, and rendezvous goes on.
    #[test]
    fn a_receiver_advises_its_sender_where_eager_pays() {
        if crate::sys::usable_cpus() < 2 {
            eprintln!("one CPU: two ranks outnumber it, and rendezvous does not start low");
            return;
        }
        for (stream_us, cma_us, advised) in [(10, 30, true), (30, 10, false)] {
            let mut v = super::super::testkit::job(2, Config::default());
            let (b, a) = (&mut v.pop().expect("b"), &mut v.pop().expect("a"));
            assert_eq!(a.st.rndv_from[1], adapt::RNDV_LOW, "rendezvous starts low between ranks of one host");
            let n = 64 << 10;
            teach(b, n, stream_us, cma_us);
            let data = vec![5u8; n];
            let mut buf = vec![0u8; n];
            for round in 0..2 {
                let r = recv(b, Some(0), Some(round), &mut buf);
                let s = send(a, 1, round, &data, false);
                settle(&mut [&mut *a, &mut *b]);
                assert!(b.take_if_done(r).expect("received").is_ok());
                if let Some(s) = s {
                    assert!(a.take_if_done(s).expect("sent").is_ok());
                }
                assert!(buf == data);
            }
            let (sa, sb) = (std::mem::take(&mut a.st.stats), std::mem::take(&mut b.st.stats));
            if advised {
                assert_eq!((sa.rndv, sa.eager, sa.eager_advice), (1, 1, 1), "{sa:?}");
                assert_eq!(a.st.rndv_from[1], 128 << 10);
                assert_eq!(b.st.advised[0], 128 << 10);
            } else {
                assert_eq!((sa.rndv, sa.eager, sa.eager_advice), (2, 0, 0), "{sa:?}");
                assert_eq!(sb.cma_reads, 2, "single copy chosen: {sb:?}");
                assert_eq!(sb.pregranted, 2, "copied at once, the sender's key check done with its request: {sb:?}");
            }
            // Advice never lowers a threshold, nor raises it past the ceiling (auto: one size
            // class above the fixed start).
            a.st.on_control(1, &ctl_body(Control::EagerBelow { bytes: 1024 })).expect("advice");
            a.st.on_control(1, &ctl_body(Control::EagerBelow { bytes: u32::MAX })).expect("advice");
            assert_eq!(a.st.rndv_from[1], crate::config::RNDV_ADVISED_MAX);
        }
    }

    /// `READ_WAY` from the lower rank sets the way this rank reads that class; from a higher
    /// rank, naming no way, or no size class, it is a malformed message that names the peer.
    #[test]
    fn read_way_is_followed_from_the_lower_rank_only() {
        let mut v = super::super::testkit::job(2, Config::default());
        let (mut b, mut a) = (v.pop().expect("b"), v.pop().expect("a"));
        let big = 32 << 20;
        let way = |class: u32, way: u32| ctl_body(Control::ReadWay { class, way });
        b.st.on_control(0, &way(25, 0)).expect("from the lower rank");
        assert_eq!(b.st.copy.start(big, 0, adapt::Stamp::now).arm, adapt::Arm::Stream, "learning alone would try single copy first");
        let errs = [a.st.on_control(1, &way(25, 1)), b.st.on_control(0, &way(25, 2)), b.st.on_control(0, &way(64, 0))];
        for (src, r) in [1, 0, 0].into_iter().zip(errs) {
            let err = r.expect_err("malformed").to_string();
            assert!(err.contains("READ_WAY") && err.contains(&format!("rank {src}")), "{err}");
        }
    }

    /// A follower times none of its reads of the class it follows: when its leader advises
    /// eager for that class, it advises the leader the same; not for a class it does not
    /// follow, nor to a higher rank, and only once.
    #[test]
    fn a_follower_advises_its_leader_as_it_was_advised() {
        let mut v = super::super::testkit::job(2, Config::default());
        let (mut b, mut a) = (v.pop().expect("b"), v.pop().expect("a"));
        if !b.st.rndv_adaptive {
            return;
        }
        let eager_below = |bytes: u32| ctl_body(Control::EagerBelow { bytes });
        let queued = |e: &Engine| e.st.outbox.ctl().len();
        b.st.on_control(0, &eager_below(128 << 10)).expect("advice");
        assert_eq!((b.st.rndv_from[0], b.st.advised[0], queued(&b)), (128 << 10, 0, 0), "the 64 KiB class is not followed");
        b.st.on_control(0, &ctl_body(Control::ReadWay { class: 18, way: 0 })).expect("from the lower rank");
        b.st.on_control(0, &eager_below(512 << 10)).expect("advice");
        assert_eq!((b.st.rndv_from[0], b.st.advised[0], queued(&b)), (512 << 10, 512 << 10, 1), "advised back");
        b.st.on_control(0, &eager_below(512 << 10)).expect("advice");
        assert_eq!(queued(&b), 1, "once");
        a.st.on_control(1, &eager_below(512 << 10)).expect("advice");
        assert_eq!((a.st.rndv_from[1], a.st.advised[1], queued(&a)), (512 << 10, 0, 0), "a leader does not follow");
    }

    /// A pre-granted rendezvous whose sender abandons it (its scope unwinds) before the
    /// receive is posted: the sender revokes the grant and waits for the answer (the receive
    /// might never come: it must not wait for a FIN), and a receive posted afterwards asks
    /// for the data and is refused, never copying memory the sender may have reused.
    #[test]
    fn an_abandoned_pregranted_send_is_revoked_before_its_buffer_goes() {
        if crate::sys::usable_cpus() < 2 {
            return;
        }
        let mut v = super::super::testkit::job(2, Config::default());
        let (mut b, mut a) = (v.pop().expect("b"), v.pop().expect("a"));
        let n = 64 << 10;
        let data = vec![9u8; n];
        let s = send(&mut a, 1, 3, &data, false).expect("a rendezvous is pending");
        assert!(a.st.rndv_send_ref(s).is_some_and(|r| r.pregranted));
        // The receiver takes the request in, unexpected, then keeps making progress (as a rank
        // blocked in some other call does) while the sender abandons.
        b.progress().expect("progress");
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stop2 = stop.clone();
        let peer = std::thread::spawn(move || {
            while !stop2.load(std::sync::atomic::Ordering::Relaxed) {
                b.progress().expect("progress");
                std::thread::yield_now();
            }
            b
        });
        a.abandon(s);
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let mut b = peer.join().expect("peer thread");
        drop(data);
        assert!(b.st.ux.keys().all(|k| b.st.ux.get(k).and_then(|u| u.rndv.as_ref()).is_none_or(|i| !i.pregranted)));
        // Posted now: it asks, the sender refuses.
        let mut buf = vec![0u8; n];
        let r = recv(&mut b, Some(0), Some(3), &mut buf);
        settle(&mut [&mut a, &mut b]);
        assert!(matches!(b.take_if_done(r), Some(Err(Error::RemoteAccess { .. }))));
        assert!(buf.iter().all(|&x| x == 0), "nothing copied");
        assert_eq!(b.st.stats.pregranted, 0);
    }

    /// A revoke that finds a pre-granted copy queued but not run yet fails it, and answers.
    #[test]
    fn a_revoke_stops_a_copy_not_yet_run() {
        // Below CMA_SHARE_MIN: the reader copies it all, nothing asked of the sender.
        let n = 24 << 10;
        let Some((mut a, mut b)) = taught_pair(n) else { return };
        let (a, b) = (&mut a, &mut b);
        let data = vec![9u8; n];
        let mut buf = vec![0u8; n];
        let r = recv(b, Some(0), Some(3), &mut buf);
        let s = send(a, 1, 3, &data, false).expect("a rendezvous is pending");
        b.progress().expect("progress");
        assert_eq!(b.st.outbox.reads().len(), 1, "queued to copy at once");
        // (As `on_packet` does after a control message: the TM-SRQ's completions are taken.)
        b.st.on_revoke(0, wire_name(s));
        b.st.settle_cq().expect("completions");
        assert!(b.st.reads.is_empty());
        let (_, c) = b.st.outbox.ctl().back().expect("an answer");
        assert_eq!(Control::decode(&c.bytes[1..c.len as usize]).expect("control"), Control::RevokeAck { name: wire_name(s) });
        // The answer releases the sender's wait; the receive (offloaded: its failure is a
        // TM-SRQ completion) fails.
        settle(&mut [&mut *a, &mut *b]);
        assert!(matches!(b.take_if_done(r), Some(Err(_))));
        assert!(buf.iter().all(|&x| x == 0), "nothing copied");
        assert!(a.st.rndv_send_ref(s).is_some_and(|r| r.granted.is_none()));
    }

    /// A rendezvous from the sender's shared heap below 256 KiB goes out pre-granted: the first
    /// is asked for (its grant names the heap, which the reader maps), later ones are copied
    /// at once by address; a revoke stops such a copy not yet run, and nothing is copied.
    #[test]
    fn heap_sends_are_pregranted_once_the_reader_maps_the_heap() {
        // Below HEAP_PREGRANT_MAX, and a rendezvous on any number of CPUs.
        let n = 250_000;
        let mut v = super::super::testkit::job(2, Config { rndv_threshold: Some(16 << 10), ..Config::default() });
        let (mut b, mut a) = (v.pop().expect("b"), v.pop().expect("a"));
        let (a, b) = (&mut a, &mut b);
        let Some(heap) = a.shared_heap() else {
            eprintln!("no shared heap here");
            return;
        };
        let mut block = heap.alloc(n, 64).expect("a block");
        block.as_bytes_mut().iter_mut().enumerate().for_each(|(i, x)| *x = (i % 253) as u8);
        for round in 0..2 {
            let mut buf = vec![0u8; n];
            let r = recv(b, Some(0), Some(3), &mut buf);
            let s = send(a, 1, 3, block.as_bytes(), false).expect("a rendezvous is pending");
            settle(&mut [&mut *a, &mut *b]);
            assert_eq!(b.take_if_done(r).expect("received").expect("ok").len(), n);
            assert!(a.take_if_done(s).expect("FIN").is_ok());
            assert!(buf == block.as_bytes(), "round {round}: the data arrived intact");
            if b.st.heaps.fallbacks > 0 {
                eprintln!("this process cannot map its own heap through /proc: nothing more to test");
                return;
            }
            assert_eq!((b.st.stats.pregranted, a.st.heaps.grants_served), (round, 1), "round {round}");
        }
        let mut buf = vec![0u8; n];
        let r = recv(b, Some(0), Some(4), &mut buf);
        let s = send(a, 1, 4, block.as_bytes(), false).expect("a rendezvous is pending");
        b.progress().expect("progress");
        assert_eq!((b.st.outbox.reads().len(), b.st.heaps.grants.len()), (1, 1), "queued to copy at once");
        b.st.on_revoke(0, wire_name(s));
        b.st.settle_cq().expect("completions");
        assert!(b.st.reads.is_empty());
        settle(&mut [&mut *a, &mut *b]);
        assert!(matches!(b.take_if_done(r), Some(Err(_))));
        assert!(buf.iter().all(|&x| x == 0), "nothing copied");
        assert!(b.st.heaps.grants.is_empty(), "the place was dropped with its read");
        drop(block);
    }

    /// A read pre-granted from the sender's heap into a buffer in the reader's heap asks the
    /// sender for its share from `HEAP_SHARE_MIN`, naming the buffer's place in the reader's
    /// heap, and copies its own part at once; the sender memcpys the rest into that heap.
    #[test]
    fn a_pregranted_heap_read_into_a_heap_is_shared_without_a_round_trip() {
        let n = 128 << 10;
        assert!((HEAP_SHARE_MIN..HEAP_PREGRANT_MAX).contains(&n));
        let mut v = super::super::testkit::job(2, Config { rndv_threshold: Some(16 << 10), ..Config::default() });
        let (mut b, mut a) = (v.pop().expect("b"), v.pop().expect("a"));
        let (a, b) = (&mut a, &mut b);
        let (Some(ha), Some(hb)) = (a.shared_heap(), b.shared_heap()) else {
            eprintln!("no shared heap here");
            return;
        };
        let mut block = ha.alloc(n, 64).expect("a block");
        block.as_bytes_mut().iter_mut().enumerate().for_each(|(i, x)| *x = (i % 251) as u8);
        let mut dst = hb.alloc(n, 64).expect("a block");
        let at = dst.as_bytes().as_ptr() as u64;
        for round in 0..2 {
            dst.as_bytes_mut().fill(0);
            let r = recv(b, Some(0), Some(3), dst.as_bytes_mut());
            let s = send(a, 1, 3, block.as_bytes(), false).expect("a rendezvous is pending");
            if round == 1 {
                // Take the request in, but keep what the receiver sends.
                let st = &mut b.st;
                b.fabric.poll(|p| st.on_packet(p)).expect("poll");
                let k = b.st.outbox.reads().front().copied().expect("queued to copy at once");
                assert_eq!(b.st.reads.get(k).map(|op| (op.split, op.remote_write)), Some((share_split(n), true)));
                let Rma::ReadReq(q) = last_rma(b) else { panic!("a share request") };
                assert_eq!(q.mode, ReadMode::Share { dst: at });
                assert!(q.dst_heap.is_some(), "the request names the buffer's place in the reader's heap");
            }
            settle(&mut [&mut *a, &mut *b]);
            assert_eq!(b.take_if_done(r).expect("received").expect("ok").len(), n);
            assert!(a.take_if_done(s).expect("FIN").is_ok());
            assert!(dst.as_bytes() == block.as_bytes(), "round {round}: the data arrived intact");
            if a.st.heaps.fallbacks + b.st.heaps.fallbacks > 0 {
                eprintln!("this process cannot map its own heap through /proc: nothing more to test");
                return;
            }
        }
        assert_eq!((b.st.stats.pregranted, b.st.stats.pregranted_splits), (1, 1));
        assert_eq!(a.st.heaps.bytes as usize, n - share_split(n), "the sender wrote its share into the heap");
        assert_eq!(b.st.heaps.bytes as usize, n + share_split(n), "the reader copied the first read whole, then its part");
    }

    /// The control messages `e` has queued, decoded (RMA packets skipped).
    fn queued_controls(e: &Engine) -> Vec<Control> {
        e.st.outbox
            .ctl()
            .iter()
            .filter(|(_, c)| c.flags & PKT_RMA == 0)
            .filter_map(|(_, c)| Control::decode(&c.bytes[1..c.len as usize]).ok())
            .collect()
    }

    /// A pre-granted read alone in flight from `CMA_SHARE_MIN` asks the sender for its share
    /// (the end of the read) and copies the start at once; the sender writes its share only
    /// for a send pre-granted to that reader. Smaller reads, and reads behind others, ask
    /// nothing.
    #[test]
    fn a_lone_pregranted_read_asks_the_sender_for_its_share() {
        for (n, shared) in [(24 << 10, false), (32 << 10, true), (64 << 10, true), (100_000, true), (256 << 10, true)] {
            let Some((mut a, mut b)) = taught_pair(n) else { return };
            let (a, b) = (&mut a, &mut b);
            let data: Vec<u8> = (0..n).map(|i| (i * 7 % 251) as u8).collect();
            let mut buf = vec![0u8; n];
            let r = recv(b, Some(0), Some(3), &mut buf);
            let s = send(a, 1, 3, &data, false).expect("a rendezvous is pending");
            let va = match a.st.rndv_send_ref(s) {
                Some(r) => r.va,
                _ => panic!("no rendezvous send"),
            };
            // Take the request in, but keep what the receiver sends (as `flush_ctl` would).
            let st = &mut b.st;
            b.fabric.poll(|p| st.on_packet(p)).expect("poll");
            let k = b.st.outbox.reads().front().copied().expect("queued to copy at once");
            let split = b.st.reads.get(k).map(|op| op.split).expect("the read");
            if !shared {
                assert_eq!(split, n);
                assert!(b.st.outbox.ctl().iter().all(|(_, c)| c.flags & PKT_RMA == 0), "nothing asked");
            } else {
                assert_eq!(split, share_split(n));
                assert!(split > n / 2 && split < n && split % 4096 == 0, "{split} of {n}");
                let Rma::ReadReq(q) = last_rma(b) else { panic!("a share request") };
                assert_eq!(q.mode, ReadMode::Share { dst: buf.as_ptr() as u64 });
                assert_eq!((q.va, q.len), (va + split as u64, (n - split) as u64));
                assert_eq!(q.send, wire_name(s));
                // Served: the share is queued to write at its offset in the read.
                let before = a.st.outbox.ctl().len();
                a.st.serve_read(1, q);
                assert_eq!(a.st.outbox.ctl().len(), before, "no grant, no refusal");
                let w = a.st.outbox.writes().back().expect("the share queued");
                assert_eq!((w.base, w.buf.len(), w.dst), (split, n - split, buf.as_ptr() as u64));
                a.st.outbox.writes_mut().pop_back();
                // The same request for a send not pre-granted to this reader is refused.
                if let Some(r) = a.st.rndv_send(Some(s)) {
                    r.granted = None;
                }
                a.st.serve_read(1, q);
                assert_eq!(last_rma(a), Rma::ReadErr { read: q.read });
                assert!(a.st.outbox.writes().is_empty());
                a.st.outbox.ctl_mut().pop_back();
                if let Some(r) = a.st.rndv_send(Some(s)) {
                    r.granted = Some(1);
                }
            }
            // Driven to the end: the message arrives whole (the share is streamed here, as
            // ranks that are threads of one process cannot write into each other).
            settle(&mut [&mut *a, &mut *b]);
            assert!(b.take_if_done(r).expect("received").is_ok());
            assert!(a.take_if_done(s).expect("sent").is_ok());
            assert!(buf == data, "{n} bytes arrive whole");
            assert_eq!(b.st.stats.cma_bytes as usize, split, "the receiver copied its part only");
        }
    }

    /// A revoke that finds a pre-granted copy whose share was asked for waits for the read
    /// (the sender writes its share or refuses it, and holds its buffer until the answer):
    /// the answer goes after the FIN, and the message arrives whole.
    #[test]
    fn a_revoke_of_a_shared_copy_is_answered_after_its_fin() {
        let n = 64 << 10;
        let Some((mut a, mut b)) = taught_pair(n) else { return };
        let (a, b) = (&mut a, &mut b);
        let data: Vec<u8> = (0..n).map(|i| (i % 253) as u8).collect();
        let mut buf = vec![0u8; n];
        let r = recv(b, Some(0), Some(3), &mut buf);
        let s = send(a, 1, 3, &data, false).expect("a rendezvous is pending");
        b.progress().expect("progress");
        assert_eq!(b.st.outbox.reads().len(), 1, "queued to copy at once");
        b.st.on_revoke(0, wire_name(s));
        b.st.settle_cq().expect("completions");
        assert_eq!(b.st.reads.len(), 1, "the read goes on");
        assert!(!queued_controls(b).contains(&Control::RevokeAck { name: wire_name(s) }), "no answer yet");
        // The receiver copies its part and the sender's share completes the read; what the
        // receiver sends meanwhile stays queued, to be looked at.
        for _ in 0..10_000 {
            if b.st.reads.is_empty() {
                break;
            }
            a.progress().expect("progress");
            b.run_cma().expect("copy");
            let st = &mut b.st;
            b.fabric.poll(|p| st.on_packet(p)).expect("poll");
            b.st.settle_cq().expect("completions");
        }
        assert!(b.st.reads.is_empty(), "the read ended");
        let queued: Vec<(bool, Option<Control>)> =
            b.st.outbox.ctl().iter().map(|(_, c)| (c.flags & PKT_RMA == 0, Control::decode(&c.bytes[1..c.len as usize]).ok())).collect();
        let ack = queued.iter().position(|(_, c)| *c == Some(Control::RevokeAck { name: wire_name(s) })).expect("answered");
        assert_eq!(ack, queued.len() - 1, "the answer goes last: {queued:?}");
        let fin =
            b.st.outbox
                .ctl()
                .iter()
                .position(|(_, c)| c.flags & PKT_RMA == 0 && Tmh::decode(&c.bytes[..c.len as usize]).is_ok_and(|t| t.op == TmOp::Fin));
        assert!(fin.is_some_and(|f| f < ack), "after the FIN: {queued:?}");
        settle(&mut [&mut *a, &mut *b]);
        assert!(b.take_if_done(r).expect("received").is_ok());
        assert!(a.take_if_done(s).expect("sent").is_ok());
        assert!(buf == data);
    }

    /// A sender that departs after a receiver asked for its share, without writing it: the
    /// receiver's wait ends with `PeerGone`, it does not wait for the share for ever.
    /// A pre-granted read behind others (a window) asks its target for a share too, unless
    /// that target has lately been reading from this rank (a FIN came): then both cores have
    /// their own copies to make, and the reader copies it all.
    #[test]
    fn a_window_shares_with_a_target_that_is_not_reading_from_us() {
        let n = 32 << 10;
        let Some((mut a, mut b)) = taught_pair(n) else { return };
        let (a, b) = (&mut a, &mut b);
        let data = [vec![3u8; n], vec![4u8; n]];
        for round in 0..2u32 {
            if round == 1 {
                // `b` sends `a` a rendezvous; `a` reads it and its FIN comes back.
                let (back, mut into) = (vec![5u8; n], vec![0u8; n]);
                let r = recv(a, Some(1), Some(99), &mut into);
                let s = send(b, 0, 99, &back, false).expect("a rendezvous");
                settle(&mut [&mut *a, &mut *b]);
                assert!(a.take_if_done(r).expect("received").is_ok() && b.take_if_done(s).expect("sent").is_ok());
                assert!(b.st.peer_reading(0));
            }
            let mut bufs = vec![vec![0u8; n]; 2];
            let rs: Vec<ReqId> = bufs.iter_mut().enumerate().map(|(m, buf)| recv(b, Some(0), Some(10 * round + m as u32), buf)).collect();
            let ss: Vec<ReqId> = data.iter().enumerate().map(|(m, d)| send(a, 1, 10 * round + m as u32, d, false).expect("rndv")).collect();
            for _ in 0..1000 {
                if b.st.outbox.reads().len() == 2 {
                    break;
                }
                a.progress().expect("progress");
                let st = &mut b.st;
                b.fabric.poll(|p| st.on_packet(p)).expect("poll");
                b.st.settle_cq().expect("completions");
            }
            let splits: Vec<usize> = b.st.outbox.reads().iter().map(|&k| b.st.reads.get(k).expect("read").split).collect();
            let want = if round == 0 { [share_split(n); 2] } else { [share_split(n), n] };
            assert_eq!(splits, want, "round {round}: the lone read shares; the second only while `a` is not reading");
            settle(&mut [&mut *a, &mut *b]);
            for (m, (r, s)) in rs.into_iter().zip(ss).enumerate() {
                assert!(b.take_if_done(r).expect("received").is_ok() && a.take_if_done(s).expect("sent").is_ok());
                assert!(bufs[m] == data[m], "round {round}: message {m} arrives whole");
            }
        }
    }

    /// Pre-granted reads queued together from one rank are copied with one system call; when
    /// that call stops at a bad range, each read is copied alone, and only the bad one fails.
    #[test]
    fn reads_queued_together_share_one_system_call() {
        let k = 6;
        for (n, bad) in [(16 << 10, None), (16 << 10, Some(2)), (128 << 10, None), (128 << 10, Some(4))] {
            let Some((mut a, mut b)) = taught_pair(n) else { return };
            let (a, b) = (&mut a, &mut b);
            let data: Vec<Vec<u8>> = (0..k).map(|m| (0..n).map(|i| ((i + 31 * m) % 249) as u8).collect()).collect();
            let mut bufs = vec![vec![0u8; n]; k];
            let rs: Vec<ReqId> = bufs.iter_mut().enumerate().map(|(m, buf)| recv(b, Some(0), Some(m as u32), buf)).collect();
            let ss: Vec<ReqId> = data.iter().enumerate().map(|(m, d)| send(a, 1, m as u32, d, false).expect("a rendezvous")).collect();
            for _ in 0..1000 {
                if b.st.outbox.reads().len() == k {
                    break;
                }
                a.progress().expect("progress");
                let st = &mut b.st;
                b.fabric.poll(|p| st.on_packet(p)).expect("poll");
                b.st.settle_cq().expect("completions");
            }
            assert_eq!(b.st.outbox.reads().len(), k, "all queued to copy at once");
            if let Some(m) = bad {
                let key = b.st.outbox.reads()[m];
                b.st.reads.get_mut(key).expect("the read").info.rvh.va = 8;
            }
            b.run_cma().expect("copy");
            assert!(b.st.outbox.reads().is_empty());
            let batched = if bad.is_some() { 0 } else { k as u64 };
            assert_eq!((b.st.stats.cma_batched, b.st.stats.cma_reads), (batched, k as u64 - u64::from(bad.is_some())));
            for _ in 0..100 {
                a.progress().expect("progress");
                b.progress().expect("progress");
            }
            for (m, r) in rs.into_iter().enumerate() {
                let got = b.take_if_done(r).expect("done");
                if bad == Some(m) {
                    assert!(got.is_err(), "the bad read fails");
                } else {
                    assert!(got.is_ok() && bufs[m] == data[m], "message {m} arrives whole");
                    assert!(a.take_if_done(ss[m]).expect("sent").is_ok());
                }
            }
        }
    }

    #[test]
    fn a_share_whose_sender_departs_ends_the_wait() {
        let n = 64 << 10;
        let Some((mut a, mut b)) = taught_pair(n) else { return };
        let data = vec![3u8; n];
        let mut buf = vec![0u8; n];
        let r = recv(&mut b, Some(0), Some(3), &mut buf);
        let _s = send(&mut a, 1, 3, &data, false).expect("a rendezvous is pending");
        b.progress().expect("progress");
        assert_eq!(b.st.stats.pregranted_splits, 1, "the share was asked for");
        // The sender leaves without ever looking at the request.
        a.fabric.mark_finalized();
        match b.wait(r) {
            Err(Error::PeerGone { rank: 0 }) => {}
            other => panic!("{other:?}"),
        }
        drop(a);
    }

    /// The body of control message `c`, as `on_control` takes it.
    fn ctl_body(c: Control) -> Vec<u8> {
        let mut b = [0u8; CONTROL_MAX_LEN];
        let n = c.encode(&mut b);
        b[1..n].to_vec()
    }

    /// A fixed `TMPI_RNDV_THRESHOLD`, or single copy off, keeps rendezvous where configured,
    /// and a rank that cannot single-copy advises eager at once.
    #[test]
    fn fixed_thresholds_are_kept() {
        if crate::sys::usable_cpus() < 2 {
            eprintln!("one CPU: two ranks outnumber it, and rendezvous does not start low");
            return;
        }
        let v = super::super::testkit::job(2, Config { rndv_threshold: Some(100_000), ..Config::default() });
        assert!(v[0].st.rndv_from.iter().all(|&t| t == 100_000));
        let v = super::super::testkit::job(2, Config { single_copy: false, ..Config::default() });
        assert!(v[0].st.rndv_from.iter().all(|&t| t == crate::config::RNDV_AUTO));
        // A receiver whose kernel refused single copy, sent to by a sender that starts low.
        let mut v = super::super::testkit::job(2, Config::default());
        let (b, a) = (&mut v.pop().expect("b"), &mut v.pop().expect("a"));
        b.st.cma = false;
        let n = 40_000;
        let data = vec![1u8; n];
        let mut buf = vec![0u8; n];
        let r = recv(b, Some(0), Some(1), &mut buf);
        let s = send(a, 1, 1, &data, false);
        settle(&mut [&mut *a, &mut *b]);
        assert!(b.take_if_done(r).expect("received").is_ok());
        assert!(s.is_none_or(|s| a.take_if_done(s).expect("sent").is_ok()));
        assert_eq!(a.st.rndv_from[1], 64 << 10, "advised at the first rendezvous");
    }

    /// Queued streamed reads of half the L3 or more go out one packet of each in turn, smaller
    /// ones whole as they come to the front; every packet at its own offset, and a read
    /// leaves the queue with its last packet.
    #[test]
    fn queued_streamed_reads_take_turns_packet_by_packet() {
        let (mut e, mut peer) = engine();
        let big = tmpi_transport::shm::streaming_copy_min();
        let src = vec![9u8; big + 3];
        // Two large reads and a small one queued behind them, then a small one that goes
        // out whole before the large one behind it.
        let lens = [big + 3, big, 10, 100 << 10, big];
        for (read, &len) in (1u64..).zip(&lens) {
            // SAFETY: `src` outlives the engine's use of it: the queue is drained below.
            let buf = unsafe { RawBuf::new(&src[..len]) };
            e.st.outbox.streams_mut().push_back(RmaOut { dest: 1, read, buf, off: 0, base: 0 });
        }
        let sent = e.push_streams().expect("push");
        assert!(e.st.outbox.streams().is_empty(), "all sent");
        let mut seen = Vec::new();
        while peer
            .poll(|p| {
                let Ok(Rma::ReadResp { read, offset, data }) = Rma::parse(p.data) else { panic!("a read response") };
                seen.push((read, offset, data.len()));
                true
            })
            .expect("poll")
            > 0
        {}
        assert_eq!(seen.len(), sent);
        let reads: Vec<u64> = seen.iter().map(|&(r, ..)| r).collect();
        let small = [4u64; 2];
        assert_eq!(&reads[..3], [1, 2, 3], "the large ones take turns");
        assert_eq!(&reads[3..3 + small.len()], small, "a small one goes out whole");
        assert_eq!(&reads[5..8], [5, 1, 2], "and the next large one joins the turns");
        for (read, &len) in (1u64..).zip(&lens) {
            let mut next = 0;
            for &(_, off, n) in seen.iter().filter(|&&(r, ..)| r == read) {
                assert_eq!(off, next, "read {read}'s packets in order, none lost");
                next += n as u64;
            }
            assert_eq!(next, len as u64);
        }
    }

    #[test]
    fn a_rendezvous_is_read_through_typed_rma_packets() {
        // Streamed: read request, responses through the ring, FIN.
        let st = rendezvous(Config { single_copy: false, ..Config::default() }, 300_000);
        assert_eq!(st.cma_reads, 0);
        // Below `CMA_PREGRANT_MAX` the sender's request carries the grant: no read request
        // at all, but a share asked of the sender (streamed back, as ranks that are threads
        // of one process cannot write into each other with CMA).
        let st = rendezvous(Config { single_copy_min: Some(0), ..Config::default() }, 300_000);
        assert_eq!((st.cma_reads, st.pregranted, st.pregranted_splits), (1, 1, 1));
        assert_eq!(st.cma_bytes as usize, share_split(300_000), "the reader copied only its part");
        let at_64k = Config { rndv_threshold: Some(65536), ..Config::default() };
        let st = rendezvous(Config { single_copy_min: Some(0), ..at_64k.clone() }, 100_000);
        assert_eq!((st.cma_reads, st.pregranted), (1, 1));
        let st = rendezvous(Config { single_copy_min: Some(200_000), ..at_64k }, 100_000);
        assert_eq!((st.cma_reads, st.pregranted), (0, 0), "below TMPI_SINGLE_COPY_MIN: streamed, not pre-granted");
        // From it: read request, grant that splits the copy; the target's share (streamed
        // back) completes the read with it.
        let st = rendezvous(Config { single_copy_min: Some(0), ..Config::default() }, 2 << 20);
        assert_eq!((st.cma_reads, st.pregranted), (1, 0));
        assert!(st.cma_bytes < 2 << 20, "the reader copied only its share");
    }

    #[test]
    fn a_malformed_or_stray_rma_packet_is_an_error_not_a_panic() {
        let (mut a, mut b) = pair();
        a.inject(1, PKT_RMA | PKT_WHOLE, 3, &[2, 0, 0]).expect("inject");
        match b.progress() {
            Err(Error::Protocol { rank: 0, .. }) => {}
            other => panic!("{other:?}"),
        }
        // Well formed, but for a read this rank never issued.
        let (mut a, mut b) = pair();
        let mut m = [0u8; RMA_MAX_LEN];
        let n = Rma::ReadResp { read: read_name(Key::new(3, 1)), offset: 0, data: &[] }.encode(&mut m).expect("encode");
        a.inject(1, PKT_RMA | PKT_WHOLE, n as u64, &m[..n]).expect("inject");
        assert!(b.progress().is_err());
    }

    #[test]
    fn read_names_round_trip() {
        for k in [Key::new(0, 0), Key::new(5, 3), Key::new(u32::MAX, u32::MAX)] {
            assert_eq!(read_key(read_name(k)), k);
        }
    }
}
