//! The target's side of a rendezvous: a read request is checked in this rank's fi_mr domain
//! (key, range, access, and that it names a live send) before a byte moves, then served the way
//! [`way::plan_grant`] says: streamed back, granted for single copy or through a shared heap,
//! with this rank's share written into the reader; the FIN completes the send.

use super::*;

/// The target stage: the registration cache that registers rendezvous send buffers, and the
/// fi_mr domain that checks the keys of the reads served from them.
pub(in crate::engine) struct Target {
    pub(super) mr: MrCache,
    pub(super) domain: Domain,
}

impl Target {
    /// The domain (4-byte provider keys: the RVH's rkey is the whole key) and the cache of
    /// `cfg`.
    pub(in crate::engine) fn new(cfg: &Config) -> Result<Self> {
        let domain = Domain::open(DomainAttr { mr_mode: MrMode::VIRT_ADDR | MrMode::PROV_KEY, mr_key_size: 4, mr_iov_limit: 1 })
            .map_err(tmpi_transport::Error::from)?;
        let cache_cfg = CacheConfig {
            max_count: cfg.mr_cache_max_count,
            max_size: cfg.mr_cache_max_size.unwrap_or(usize::MAX),
            monitor: if cfg.mr_cache_monitor_uffd { Monitor::Userfaultfd } else { Monitor::Disabled },
        };
        let mr = MrCache::new(domain.clone(), cache_cfg).map_err(tmpi_transport::Error::from)?;
        Ok(Target { mr, domain })
    }

    /// The registration cache's counters.
    pub(in crate::engine) fn mr_stats(&self) -> tmpi_transport::mr::CacheStats {
        self.mr.stats()
    }
}

impl State {
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
    pub(in crate::engine) fn serve_read(&mut self, src: usize, q: ReadRequest) {
        let ReadRequest { read: id, mode, send, va, key, len, reader_maps_heap, dst_heap } = q;
        let sk = self.named_send(send, src);
        // Exactly the range the key check granted, and only while it lies inside the buffer of
        // the live rendezvous send the reader names (a cached registration can outlive it).
        let buf = self.target.domain.check_remote(key, va, len, RemoteOp::Read).ok().and_then(|range| {
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
            self.ways.copy.peer_read(arm, b.len(), src, src < self.rank);
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
                        if let Some(h) = dst_heap.map(HeapSrc::from).filter(|_| self.ways.heaps.may_map(src)) {
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
        if n == 0 || !self.ways.heaps.enabled() {
            return false;
        }
        let from = if reader_maps { self.ways.heaps.locate(b.addr(), n) } else { None };
        let into = dst_heap.filter(|_| self.ways.heaps.may_map(src));
        let busy = !self.reads.is_empty() && n < HEAP_SPLIT_BUSY_MAX;
        let split = match (from, into) {
            (Some(_), Some(_)) if n >= HEAP_SPLIT_MIN && !busy => (n / 2) & !4095,
            (Some(_), _) => n,
            (None, Some(_)) if matches!(mode, ReadMode::SingleCopy { .. }) && self.ways.cma && n >= CMA_SPLIT_MIN => (n / 2) & !4095,
            (None, Some(_)) => 0,
            (None, None) => return false,
        };
        if let Some(r) = self.rndv_send(Some(sk)) {
            r.granted = Some(src);
        }
        if from.is_some() {
            if let Some(named) = self.ways.heaps.named_to.get_mut(src) {
                *named = true;
            }
        }
        self.outbox.rma(src, Rma::Grant { read: id, split: split as u64, heap: from.map(HeapPlace::from) });
        if let (Some(h), true) = (into, split < n) {
            self.owe_heap_write(src, id, h);
            self.outbox.copy_write(CmaWrite { dest: src, read: id, buf: b.sub(split, n), dst: 0, base: split });
        }
        self.ways.heaps.grants_served += 1;
        true
    }
    /// The share of read `id` owed to `src` goes with a memcpy into its heap at `h` (its
    /// `CmaWrite` is queued next).
    fn owe_heap_write(&mut self, src: usize, id: u64, h: HeapSrc) {
        if self.ways.heaps.writes.len() > self.outbox.writes_queued().count() + 64 {
            // Shares dropped because their reader left (see `leave`): forget them.
            let live: std::collections::HashSet<(usize, u64)> = self.outbox.writes_queued().map(|w| (w.dest, w.read)).collect();
            self.ways.heaps.writes.retain(|k, _| live.contains(k));
        }
        self.ways.heaps.writes.insert((src, id), h);
    }
    /// A FIN: the receiver has the data of our rendezvous send. It must name a rendezvous
    /// send to that peer and repeat its match key and RVH address.
    pub(in crate::engine) fn on_fin(&mut self, src: usize, tmh: Tmh, rvh: Rvh) -> Result<()> {
        let k = self.named_send(tmh.app_ctx, src).filter(|&k| self.rndv_send_ref(k).is_some_and(|r| r.tag64 == tmh.tag && r.va == rvh.va));
        let k = k.ok_or_else(|| malformed_from(src, "FIN for no rendezvous send"))?;
        if let Some((streamed, n)) = self.rndv_send(Some(k)).map(|r| (r.streamed, r.buf.map_or(0, |b| b.len()))) {
            // A read this rank did not stream was copied by the reader's core (single copy, a
            // shared heap).
            self.ways.copy.peer_read(if streamed { adapt::Arm::Stream } else { adapt::Arm::Cma }, n, src, src < self.rank);
        }
        self.reads.fin_from(src);
        self.send_progress(k, false, true);
        Ok(())
    }

    /// The reader will not touch the buffer of pre-granted send `name`: the abandoned send
    /// waits no more (a stale answer, after the FIN completed the send, names nothing).
    pub(in crate::engine) fn on_revoke_ack(&mut self, src: usize, name: u32) {
        let k = self.named_send(name, src);
        if let Some(r) = self.rndv_send(k) {
            if r.pregranted && r.granted == Some(src) {
                r.granted = None;
            }
        }
    }
}
