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
        let mr = MrCache::new(domain.clone(), cache_config(cfg)).map_err(tmpi_transport::Error::from)?;
        Ok(Target { mr, domain })
    }

    /// The configuration of this stage's registration cache (also the OFI fabric's).
    #[cfg(feature = "ofi")]
    pub(in crate::engine) fn cache_config(&self) -> CacheConfig {
        *self.mr.config()
    }

    /// The registration cache's counters.
    pub(in crate::engine) fn mr_stats(&self) -> tmpi_transport::mr::CacheStats {
        self.mr.stats()
    }
}

/// The registration cache's configuration (`TMPI_MR_CACHE_*`).
fn cache_config(cfg: &Config) -> CacheConfig {
    CacheConfig {
        max_count: cfg.mr_cache_max_count,
        max_size: cfg.mr_cache_max_size.unwrap_or(usize::MAX),
        monitor: if cfg.mr_cache_monitor_uffd { Monitor::Userfaultfd } else { Monitor::Disabled },
    }
}

/// A read request that passed the key check: who asked, its name, the live send it reads
/// and the range granted.
#[derive(Clone, Copy)]
struct Checked {
    src: usize,
    id: u64,
    sk: Key,
    b: RawBuf,
}

impl State {
    /// The target side of an RDMA read: key, enablement, range and access are checked in
    /// this rank's fi_mr domain before a byte moves; a refusal goes back as an error. A
    /// passed check is served the way [`plan_grant`] says.
    ///
    /// In [`ReadMode::SingleCopy`] a passed check grants the reader a single copy of the range
    /// (it is recorded on the send, whose buffer then stays put until FIN even if abandoned);
    /// in [`ReadMode::Stream`] the range is streamed back through the ring.
    ///
    /// Shared heaps come first, in either mode: a range in this rank's heap is granted for a
    /// memcpy by a reader that maps it, and a reader whose buffer lies in its own heap gets
    /// this rank's share written there with a memcpy (see [`State::grant_heap`]).
    pub(in crate::engine) fn serve_read(&mut self, src: usize, q: ReadRequest) {
        let sk = self.named_send(q.send, src);
        let (Some(b), Some(sk)) = (self.checked_range(sk, &q), sk) else {
            return self.refuse_read(src, sk, q.read);
        };
        let n = b.len();
        let heaps = self.ways.heaps.enabled();
        let from = if q.reader_maps_heap && heaps && n > 0 { self.ways.heaps.locate(b.addr(), n) } else { None };
        let into = q.dst_heap.map(HeapSrc::from).filter(|_| self.ways.heaps.may_map(src));
        let facts = GrantFacts {
            n,
            mode: q.mode,
            heaps,
            from_heap: from.is_some(),
            into_heap: into.is_some(),
            cma: self.ways.cma,
            reads: self.reads.len(),
        };
        let plan = plan_grant(&facts);
        // Through a heap the reader's core (or a memcpy of ours in its stead) copies.
        let arm = if plan == GrantPlan::Stream { adapt::Arm::Stream } else { adapt::Arm::Cma };
        self.ways.copy.peer_read(arm, n, src, src < self.rank);
        let id = q.read;
        let c = Checked { src, id, sk, b };
        match (plan, q.mode) {
            (GrantPlan::Heap { split }, _) => self.grant_heap(c, split, from, into),
            (GrantPlan::Share, ReadMode::Share { dst }) => self.write_share(c, dst, into),
            (GrantPlan::SingleCopy { split }, ReadMode::SingleCopy { dst }) => {
                if let Some(r) = self.rndv_send(Some(sk)) {
                    r.granted = Some(src);
                }
                self.outbox.rma(src, Rma::Grant { read: id, split: split as u64, heap: None });
                if split < n {
                    self.outbox.copy_write(CmaWrite { dest: src, read: id, buf: b.sub(split, n), dst, base: split });
                }
            }
            // `GrantPlan::Stream` (a plan other than the heap's follows the mode).
            _ => {
                if let Some(r) = self.rndv_send(Some(sk)) {
                    r.streamed = true;
                }
                self.outbox.stream(RmaOut { dest: src, read: id, buf: b, off: 0, base: 0 })
            }
        }
    }
    /// Exactly the range the key check of `q` granted, and only while it lies inside the
    /// buffer of the live rendezvous send `sk` the reader names (a cached registration can
    /// outlive it).
    fn checked_range(&self, sk: Option<Key>, q: &ReadRequest) -> Option<RawBuf> {
        let range = self.target.domain.check_remote(q.key, q.va, q.len, RemoteOp::Read).ok()?;
        let [seg] = range.segments() else { return None };
        let Some(Req { kind: ReqKind::Send(s), result: None, .. }) = self.reqs.get(sk?) else { return None };
        let b = s.rndv.as_ref()?.buf?;
        let start = seg.addr.checked_sub(b.addr())?;
        let end = start.checked_add(seg.len)?;
        (end <= b.len() && seg.len as u64 == q.len).then(|| b.sub(start, end))
    }
    /// Refuses read `id` from `src`: the reader gets an error, and so does the send `sk` it
    /// was reading for (no FIN will come for it).
    fn refuse_read(&mut self, src: usize, sk: Option<Key>, id: u64) {
        if let Some(Req { kind: ReqKind::Send(st), result: r @ None, .. }) = sk.and_then(|k| self.reqs.get_mut(k)) {
            if st.rndv.is_some() {
                st.rndv = None;
                *r = Some(Err(Box::new(Error::RemoteAccess {
                    rank: src,
                    reason: format!("rank {src} asked to read a range the registration does not allow"),
                })));
            }
        }
        self.outbox.rma(src, Rma::ReadErr { read: id });
    }
    /// Writes the share `c.b` of read `c.id` that `c.src` asked for ([`ReadMode::Share`])
    /// into its buffer at `dst` (into its heap at `into`, if it names one this rank maps).
    /// Only a send pre-granted to this reader (which holds its buffer until FIN or the
    /// revoke's answer) has its share written unasked; `b` is the rest of the read, from its
    /// offset in the send.
    fn write_share(&mut self, c: Checked, dst: u64, into: Option<HeapSrc>) {
        let Checked { src, id, sk, b } = c;
        let base = match self.rndv_send_ref(sk) {
            Some(r) if r.pregranted && r.granted == Some(src) => r.buf.map(|sb| b.addr() - sb.addr()),
            _ => None,
        };
        match base {
            Some(base) => {
                if let Some(h) = into {
                    self.owe_heap_write(src, id, h);
                }
                self.outbox.copy_write(CmaWrite { dest: src, read: id, buf: b, dst, base })
            }
            None => self.outbox.rma(src, Rma::ReadErr { read: id }),
        }
    }
    /// Grants checked read `c` through the shared heaps, as [`GrantPlan::Heap`] says: a grant
    /// naming this rank's heap at `from` (the reader memcpys `[0, split)`; without `from`, by
    /// single copy, or nothing when `split` is 0), and this rank's memcpy of `[split, n)` into
    /// the reader's heap at `into`.
    ///
    /// The send records the grant: its buffer stays put until FIN even if abandoned.
    fn grant_heap(&mut self, c: Checked, split: usize, from: Option<HeapSrc>, into: Option<HeapSrc>) {
        let Checked { src, id, sk, b } = c;
        let n = b.len();
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

    /// The reader will not touch the buffer of revoked send `name` (pre-granted, or with a
    /// fabric key): the abandoned send waits no more (a stale answer, after the FIN completed
    /// the send, names nothing).
    pub(in crate::engine) fn on_revoke_ack(&mut self, src: usize, name: u32) {
        let k = self.named_send(name, src);
        if let Some(r) = self.rndv_send(k) {
            if r.revocable() && r.granted == Some(src) {
                r.granted = None;
            }
        }
    }
}

impl Engine {
    /// Rendezvous send `rid` is abandoned. A reader granted a single copy is copying the
    /// buffer now, and this rank may owe it a share (`cma_w`, written during the wait): the
    /// memory must stay until its FIN (or until the reader is gone). A grant that went with
    /// the request may not be used yet (the receive may never be posted), nor a fabric key
    /// (the reader `fi_read`s without asking): either is revoked, and the reader's answer (or
    /// its FIN, if it read first) ends the wait. Then every read of the buffer is refused,
    /// and reads being served from it stop.
    pub(in crate::engine) fn abandon_rndv_send(&mut self, rid: ReqId) {
        let Some(r) = self.st.rndv_send_ref(rid) else { return };
        let (granted, revocable) = (r.granted, r.revocable());
        let range = r.buf.map(|b| (b.addr(), b.addr() + b.len()));
        if let Some(reader) = granted {
            if revocable {
                self.st.outbox.control(reader, Control::Revoke { name: wire_name(rid) });
            }
            let still_granted = |e: &Engine| match e.st.reqs.get(rid) {
                Some(Req { kind: ReqKind::Send(SendState { rndv: Some(r), .. }), result: None, .. }) => r.granted.is_some(),
                _ => false,
            };
            // Given up on a stream that stays broken, the wait may end early: a reader's late
            // single copy reads this process's memory (never writes it), and what this rank
            // would still serve from the buffer is refused below.
            let _ = self.progress_while(reader, still_granted);
        }
        if let Some((lo, hi)) = range {
            if let Some(r) = self.st.rndv_send(Some(rid)) {
                r.buf = None;
            }
            self.st.outbox.refuse_range(lo, hi);
        }
    }
}
