//! The reader's side of a rendezvous: a matched request starts a read ([`State::start_read`],
//! its way chosen by [`way::plan_read`]), which asks the target (for a stream, a grant or a
//! share), or copies at once what the sender pre-granted; the answers complete it, and its end
//! sends the FIN.

use super::*;

/// The most fabric keys revoked before their requests arrived that a rank remembers (about
/// 24 MiB of set): past it, the peer that sends one more is failed as broken.
const REVOKED_MAX: usize = 1 << 20;

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
    /// What was asked of the target, who copies which bytes, and what is owed at the end.
    pub(in crate::engine) phase: ReadPhase,
    /// How [`adapt::Epochs`] placed the read (`TMPI_SINGLE_COPY_MIN=auto`); it must hear of
    /// its end.
    pub(in crate::engine) placed: Option<adapt::Placed>,
}

impl ReadOp {
    /// Bytes `[0, split)` this rank copies itself; the target writes `[split, n)`.
    pub(in crate::engine) fn split(&self) -> usize {
        self.phase.split(self.n)
    }

    /// Whether the target may write into the receive buffer: the buffer must outlive the
    /// read even if the receive is abandoned.
    pub(in crate::engine) fn remote_write(&self) -> bool {
        self.phase.remote_write(self.n)
    }
}

/// A pre-granted read the target may revoke ([`Control::Revoke`]): nothing was asked of it
/// for this rank's part.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::engine) enum Revoke {
    /// Not revoked (yet).
    Open,
    /// Revoked while the target's share was asked for (it refuses or writes it): the answer
    /// goes back when the read ends, after its FIN.
    Owed,
}

/// The phase of a rendezvous read of `n` bytes. Past [`Asked`](ReadPhase::Asked), `split`
/// says who copies what: this rank `[0, split)`, the target `[split, n)` (into the receive
/// buffer, which it may write while `split < n`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::engine) enum ReadPhase {
    /// Asked of the target and not yet answered: for a grant to copy it by single copy
    /// (`single`: the request names the receive buffer, into which the target may write its
    /// share), else for a stream.
    Asked { single: bool },
    /// Granted by the target: this rank copies `[0, split)`.
    Granted { split: usize },
    /// Pre-granted, and copied at once without asking for `[0, split)` (the rest, if any,
    /// asked as a share with [`ReadMode::Share`], the target's to refuse): the target may
    /// revoke the grant until the copy is done.
    AtOnce { split: usize, revoke: Revoke },
    /// This rank's part `[0, split)` could not be copied and was asked again through the ring
    /// (the target refuses it if it abandons the send); `ack_owed`: a revoke waits for the end.
    Restreamed { split: usize, ack_owed: bool },
    /// This rank's copy failed: the read completes with an error once the target's share is
    /// done (it may still be writing into the buffer). `revoke`: it was pre-granted.
    Failed { split: usize, revoke: Option<Revoke> },
    /// Read by the fabric's RDMA read (`fi_read`): the provider writes the whole range into
    /// the receive buffer until the read completes; a failed one is asked again through the
    /// ring ([`ReadPhase::Asked`] for a stream). `ack_owed`: the sender revoked its key while
    /// the read was out (it abandoned the send, and waits): the answer goes back when the
    /// read ends, after its FIN; a read that fails then fails the receive.
    Fabric { ack_owed: bool },
}

impl ReadPhase {
    /// The phase a read starts in, by its plan.
    pub(in crate::engine) fn start(plan: &ReadPlan) -> Self {
        match plan.start {
            ReadStart::Ask { cma } => ReadPhase::Asked { single: cma },
            ReadStart::AtOnce { split, .. } => ReadPhase::AtOnce { split, revoke: Revoke::Open },
            ReadStart::Fabric => ReadPhase::Fabric { ack_owed: false },
        }
    }

    /// The target granted this rank `[0, split)`. A grant answers an asked read; any other
    /// phase keeps its kind and takes the split.
    pub(in crate::engine) fn granted(self, split: usize) -> Self {
        match self {
            ReadPhase::Asked { .. } | ReadPhase::Granted { .. } => ReadPhase::Granted { split },
            ReadPhase::AtOnce { revoke, .. } => ReadPhase::AtOnce { split, revoke },
            ReadPhase::Restreamed { ack_owed, .. } => ReadPhase::Restreamed { split, ack_owed },
            ReadPhase::Failed { revoke, .. } => ReadPhase::Failed { split, revoke },
            // Nothing was asked of the target: a grant cannot be for this read.
            ReadPhase::Fabric { .. } => self,
        }
    }

    /// This rank's copy could not run (no single copy, a heap not mapped): its part is asked
    /// for through the ring, and is no longer the target's to revoke.
    pub(in crate::engine) fn restreamed(self) -> Self {
        match self {
            ReadPhase::Granted { split } => ReadPhase::Restreamed { split, ack_owed: false },
            ReadPhase::AtOnce { split, revoke } => ReadPhase::Restreamed { split, ack_owed: revoke == Revoke::Owed },
            ReadPhase::Failed { split, revoke: Some(Revoke::Open) } => ReadPhase::Failed { split, revoke: None },
            other => other,
        }
    }

    /// This rank's copy of a read of `n` bytes failed.
    pub(in crate::engine) fn failed(self, n: usize) -> Self {
        match self {
            ReadPhase::Asked { .. } => ReadPhase::Failed { split: n, revoke: None },
            ReadPhase::Granted { split } => ReadPhase::Failed { split, revoke: None },
            ReadPhase::AtOnce { split, revoke } => ReadPhase::Failed { split, revoke: Some(revoke) },
            ReadPhase::Restreamed { split, ack_owed } => ReadPhase::Failed { split, revoke: ack_owed.then_some(Revoke::Owed) },
            ReadPhase::Failed { .. } => self,
            ReadPhase::Fabric { ack_owed } => ReadPhase::Failed { split: n, revoke: ack_owed.then_some(Revoke::Owed) },
        }
    }

    /// Whether the target may revoke the pre-grant this read copies from.
    pub(in crate::engine) fn revocable(self) -> bool {
        matches!(self, ReadPhase::AtOnce { .. } | ReadPhase::Failed { revoke: Some(_), .. })
    }

    /// The target revoked the pre-grant of a revocable read of `n` bytes: with its share asked
    /// for, the answer is owed at the end (`Some`); without, the read fails now (`None`).
    pub(in crate::engine) fn revoked(self, n: usize) -> Option<Self> {
        match self {
            ReadPhase::AtOnce { split, .. } if split < n => Some(ReadPhase::AtOnce { split, revoke: Revoke::Owed }),
            ReadPhase::Failed { split, revoke: Some(_) } if split < n => Some(ReadPhase::Failed { split, revoke: Some(Revoke::Owed) }),
            _ => None,
        }
    }

    /// Bytes this rank copies itself, of a read of `n` (all of them until it is granted).
    pub(in crate::engine) fn split(self, n: usize) -> usize {
        match self {
            ReadPhase::Asked { .. } | ReadPhase::Fabric { .. } => n,
            ReadPhase::Granted { split }
            | ReadPhase::AtOnce { split, .. }
            | ReadPhase::Restreamed { split, .. }
            | ReadPhase::Failed { split, .. } => split,
        }
    }

    /// Whether the target may write into the receive buffer of a read of `n` bytes.
    pub(in crate::engine) fn remote_write(self, n: usize) -> bool {
        match self {
            ReadPhase::Asked { single } => single,
            ReadPhase::Fabric { .. } => true,
            _ => self.split(n) < n,
        }
    }

    /// Whether the read completes well once all its bytes are in.
    pub(in crate::engine) fn ends_ok(self) -> bool {
        !matches!(self, ReadPhase::Failed { .. })
    }

    /// Whether the answer to a revoke goes back when the read ends.
    pub(in crate::engine) fn owes_revoke_ack(self) -> bool {
        matches!(
            self,
            ReadPhase::AtOnce { revoke: Revoke::Owed, .. }
                | ReadPhase::Restreamed { ack_owed: true, .. }
                | ReadPhase::Failed { revoke: Some(Revoke::Owed), .. }
                | ReadPhase::Fabric { ack_owed: true }
        )
    }
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
    /// Fabric keys revoked before their request reached this rank's software (it waits in
    /// the provider's queue, or its FIN is on the way), by sender and send name: a read
    /// that matches one streams instead (see [`State::on_revoke`]).
    revoked: std::collections::HashSet<(usize, u32)>,
}

impl Reads {
    /// No reads, in a job of `size` ranks.
    pub(in crate::engine) fn new(size: usize) -> Self {
        Reads { ops: Slab::new(), begun: 0, fin_seen: vec![0; size], revoked: Default::default() }
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
        self.ops.get(k).filter(|op| op.remote_write()).map(|op| op.src)
    }

    /// Whether `src` revoked the fabric key of its send `name` before its request reached
    /// this rank's software; the revocation is used up.
    pub(in crate::engine) fn take_revoked(&mut self, src: usize, name: u32) -> bool {
        !self.revoked.is_empty() && self.revoked.remove(&(src, name))
    }

    /// `src` sent a FIN for a send of ours: it is reading from us.
    pub(in crate::engine) fn fin_from(&mut self, src: usize) {
        if let Some(at) = self.fin_seen.get_mut(src) {
            *at = self.begun.max(1);
        }
    }
}

impl State {
    /// `src` abandoned its send `name`, pre-granted or announced with a fabric key: this rank
    /// must no longer copy or `fi_read` its buffer. A request still unexpected loses its grant
    /// and its key (a later match asks, and is refused); a copy started without asking that
    /// has not run yet fails (one that asked is the target's to refuse, as for any abandoned
    /// send); an `fi_read` out owes the answer at its end. A fabric key this rank has not
    /// seen yet (its request waits in the provider) is remembered, and a later match streams.
    /// Then the answer goes back, after any FIN already queued (a read that copied first
    /// completed the send with it).
    pub(in crate::engine) fn on_revoke(&mut self, src: usize, name: u32) {
        let in_ux = self.revoke_unexpected(src, name);
        let (in_reads, owed) = self.revoke_reads(src, name);
        if !in_ux && !in_reads && self.ways.fabric_reads() {
            if self.reads.revoked.len() >= REVOKED_MAX {
                // Each is a send abandoned while its request was in flight: a peer naming this
                // many is broken, and the set would grow without end.
                self.outbox.fail(malformed_from(src, "more revokes of unseen rendezvous sends than any run makes"));
                return;
            }
            self.reads.revoked.insert((src, name));
        }
        if !owed {
            self.outbox.control(src, Control::RevokeAck { name });
        }
    }
    /// [`State::on_revoke`] in the unexpected queue: `src`'s request `name` there loses its
    /// pre-grant and its fabric key. Returns whether it was there.
    fn revoke_unexpected(&mut self, src: usize, name: u32) -> bool {
        let ux: Vec<Key> = self
            .ux
            .keys()
            .filter(|&k| self.ux.get(k).is_some_and(|u| u.src_world == src && u.rndv.as_ref().is_some_and(|i| i.tmh.app_ctx == name)))
            .collect();
        for &k in &ux {
            if let Some(info) = self.ux.get_mut(k).and_then(|u| u.rndv.as_mut()) {
                info.pregranted = false;
                info.fabric = None;
            }
        }
        !ux.is_empty()
    }
    /// [`State::on_revoke`] among the reads: a revocable copy of `src`'s send `name` fails now
    /// or, with the target's share asked for, owes the answer at its end; an `fi_read` of it
    /// owes the answer at its end. Returns whether a read of it was there, and whether the
    /// answer is owed.
    fn revoke_reads(&mut self, src: usize, name: u32) -> (bool, bool) {
        let reads: Vec<Key> =
            self.reads.keys().filter(|&k| self.reads.get(k).is_some_and(|op| op.src == src && op.info.tmh.app_ctx == name)).collect();
        let mut owed = false;
        for &k in &reads {
            let Some(op) = self.reads.get_mut(k) else { continue };
            if let ReadPhase::Fabric { .. } = op.phase {
                // The provider may be reading now: the sender's buffer stays until the end.
                op.phase = ReadPhase::Fabric { ack_owed: true };
                owed = true;
                continue;
            }
            if !(op.phase.revocable() && op.info.pregranted) {
                continue;
            }
            match op.phase.revoked(op.n) {
                // Its share is asked for: the target refuses it or writes it, and our copy of
                // the rest runs now, so the answer waits for the read to end (after its FIN).
                Some(phase) => {
                    op.phase = phase;
                    owed = true;
                }
                None => {
                    if let Err(e) = self.finish_read(k, false) {
                        self.outbox.fail(e);
                    }
                }
            }
        }
        (!reads.is_empty(), owed)
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
    pub(in crate::engine) fn start_read(&mut self, rid: ReqId, src: usize, mut info: RndvInfo, hw: Option<ReadId>) -> Result<()> {
        if info.fabric.is_some() && self.reads.take_revoked(src, info.tmh.app_ctx) {
            // Revoked while it waited in the provider: asked for, and refused.
            info.fabric = None;
        }
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
            fabric_key: info.fabric.is_some() && src != self.rank && self.ways.fabric_reads(),
        };
        let plan = plan_read(&facts);
        if let (ReadStart::AtOnce { heap: true, .. }, Some(p)) = (plan.start, placed) {
            // Nothing to learn from a heap copy (its period is not timed).
            self.ways.copy.spoil(p);
        }
        crate::seen::msg(false, src, info.tmh.tag, info.len, read_proto(&plan, cma, hw.is_some()));
        let op = ReadOp { rid, src, n, got: 0, hw, info, phase: ReadPhase::start(&plan), placed };
        let k = self.reads.insert(op);
        debug_assert_eq!(k, key);
        if n == 0 {
            return self.finish_read(key, true);
        }
        match plan.start {
            ReadStart::AtOnce { heap, split } => self.copy_at_once(key, heap.then_some(sender_heap).flatten(), split, own_place),
            ReadStart::Ask { cma } => self.request_read(key, cma, n, true),
            // Posted by the engine, which holds the fabric (`Engine::post_fabric_read`).
            ReadStart::Fabric => self.outbox.copy_read(key),
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
            op.phase = op.phase.restreamed();
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
            va: op.info.rvh.va.wrapping_add(op.split() as u64),
            key: op.info.key,
            len: (op.n - op.split()) as u64,
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
            let ok = op.phase.ends_ok();
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
    /// The answer to a revoke that waited for read `op` to end ([`Revoke::Owed`]).
    fn ack_revoke(&mut self, op: &ReadOp) {
        if op.phase.owes_revoke_ack() {
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
        let share = op.n - op.split();
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
        op.phase = op.phase.granted(split);
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
        (ReadStart::Fabric, _) => Proto::WAY_FABRIC_READ,
        (_, true) => Proto::WAY_CMA,
        (_, false) => Proto::WAY_STREAM,
    };
    Proto::RNDV | way | if offloaded { Proto::OFFLOADED } else { Proto::SOFTWARE }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The transitions of a read's phase ([`ReadPhase`]), one row each: a grant answers an
    /// asked read; a copy that cannot run is asked again through the ring and is no longer
    /// revocable; a copy that fails keeps its split (the target's share still comes); a revoke
    /// of a pre-grant whose share was asked is answered at the end, and fails the read now
    /// otherwise.
    #[test]
    fn read_phase_transitions_table() {
        const N: usize = 64 << 10;
        const S: usize = 32 << 10;
        use ReadPhase::*;
        use Revoke::*;
        let asked = Asked { single: true };
        let at_once = AtOnce { split: S, revoke: Open };
        let whole = AtOnce { split: N, revoke: Open };
        let owed = AtOnce { split: S, revoke: Owed };
        let fabric = Fabric { ack_owed: false };
        // (what, from, transition, to)
        type Step = fn(ReadPhase) -> Option<ReadPhase>;
        let rows: Vec<(&str, ReadPhase, Step, Option<ReadPhase>)> = vec![
            ("asked, granted", asked, |p| Some(p.granted(S)), Some(Granted { split: S })),
            ("asked stream, granted whole", Asked { single: false }, |p| Some(p.granted(N)), Some(Granted { split: N })),
            ("at once, a stray grant", owed, |p| Some(p.granted(N)), Some(AtOnce { split: N, revoke: Owed })),
            ("granted, restreamed", Granted { split: S }, |p| Some(p.restreamed()), Some(Restreamed { split: S, ack_owed: false })),
            ("at once, restreamed", at_once, |p| Some(p.restreamed()), Some(Restreamed { split: S, ack_owed: false })),
            ("revoked, restreamed", owed, |p| Some(p.restreamed()), Some(Restreamed { split: S, ack_owed: true })),
            ("asked, restreamed", asked, |p| Some(p.restreamed()), Some(asked)),
            (
                "failed pre-grant, restreamed",
                Failed { split: S, revoke: Some(Open) },
                |p| Some(p.restreamed()),
                Some(Failed { split: S, revoke: None }),
            ),
            ("granted, failed", Granted { split: S }, |p| Some(p.failed(N)), Some(Failed { split: S, revoke: None })),
            ("at once, failed", at_once, |p| Some(p.failed(N)), Some(Failed { split: S, revoke: Some(Open) })),
            ("revoked, failed", owed, |p| Some(p.failed(N)), Some(Failed { split: S, revoke: Some(Owed) })),
            ("asked, failed", asked, |p| Some(p.failed(N)), Some(Failed { split: N, revoke: None })),
            ("at once with a share, revoked", at_once, |p| p.revoked(N), Some(owed)),
            ("revoked again", owed, |p| p.revoked(N), Some(owed)),
            ("at once, whole, revoked: fails now", whole, |p| p.revoked(N), None),
            (
                "failed with a share, revoked",
                Failed { split: S, revoke: Some(Open) },
                |p| p.revoked(N),
                Some(Failed { split: S, revoke: Some(Owed) }),
            ),
            ("granted: not revocable", Granted { split: S }, |p| p.revoked(N), None),
            ("fabric: a stray grant changes nothing", fabric, |p| Some(p.granted(S)), Some(fabric)),
            ("fabric, failed", fabric, |p| Some(p.failed(N)), Some(Failed { split: N, revoke: None })),
            (
                "fabric, revoked, failed: the answer is owed",
                Fabric { ack_owed: true },
                |p| Some(p.failed(N)),
                Some(Failed { split: N, revoke: Some(Owed) }),
            ),
            ("fabric: not revocable", fabric, |p| p.revoked(N), None),
        ];
        for (what, from, step, want) in rows {
            assert_eq!(step(from), want, "{what}: from {from:?}");
        }
    }

    /// What each phase says ([`ReadPhase`]): who copies what, whether the target may write
    /// into the buffer, whether it may revoke, whether the read ends well, and whether a
    /// revoke's answer waits for its end.
    #[test]
    fn read_phase_queries_table() {
        const N: usize = 64 << 10;
        const S: usize = 32 << 10;
        use ReadPhase::*;
        use Revoke::*;
        // (phase, split, remote write, revocable, ends ok, owes the revoke's answer)
        let rows = [
            (Asked { single: true }, N, true, false, true, false),
            (Asked { single: false }, N, false, false, true, false),
            (Granted { split: S }, S, true, false, true, false),
            (Granted { split: N }, N, false, false, true, false),
            (AtOnce { split: S, revoke: Open }, S, true, true, true, false),
            (AtOnce { split: N, revoke: Open }, N, false, true, true, false),
            (AtOnce { split: S, revoke: Owed }, S, true, true, true, true),
            (Restreamed { split: S, ack_owed: false }, S, true, false, true, false),
            (Restreamed { split: N, ack_owed: true }, N, false, false, true, true),
            (Failed { split: S, revoke: None }, S, true, false, false, false),
            (Failed { split: S, revoke: Some(Open) }, S, true, true, false, false),
            (Failed { split: N, revoke: Some(Owed) }, N, false, true, false, true),
            (Fabric { ack_owed: false }, N, true, false, true, false),
            (Fabric { ack_owed: true }, N, true, false, true, true),
        ];
        for (p, split, remote, revocable, ok, owes) in rows {
            let got = (p.split(N), p.remote_write(N), p.revocable(), p.ends_ok(), p.owes_revoke_ack());
            assert_eq!(got, (split, remote, revocable, ok, owes), "{p:?}");
        }
    }

    /// A read starts as its plan says: asked (for single copy or a stream), or copied at once
    /// from a pre-grant, revocable.
    #[test]
    fn read_phase_starts_by_the_plan() {
        let ask = |cma| ReadPlan { start: ReadStart::Ask { cma }, remote_write: cma };
        assert_eq!(ReadPhase::start(&ask(true)), ReadPhase::Asked { single: true });
        assert_eq!(ReadPhase::start(&ask(false)), ReadPhase::Asked { single: false });
        let pre = ReadPlan { start: ReadStart::AtOnce { heap: false, split: 9 }, remote_write: true };
        assert_eq!(ReadPhase::start(&pre), ReadPhase::AtOnce { split: 9, revoke: Revoke::Open });
        let fabric = ReadPlan { start: ReadStart::Fabric, remote_write: true };
        assert_eq!(ReadPhase::start(&fabric), ReadPhase::Fabric { ack_owed: false });
        for plan in [ask(true), ask(false), pre, fabric] {
            let p = ReadPhase::start(&plan);
            assert_eq!((p.split(16), p.remote_write(16)), (plan.split(16), plan.remote_write), "{plan:?}");
        }
    }
}
