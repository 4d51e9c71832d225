//! [`OfiFabric`]: the packets of `crate::fabric` over one RDM endpoint, as the shared-memory
//! and TCP fabrics carry them.
//!
//! Each packet is one tagged message ([`super::tag::PROTO_PACKET`], the sender's rank in the
//! source field) of a 16-byte header and the packet's bytes:
//!
//! ```text
//! flags u8 (PKT_*) | kind u8 (0 data, 1 finalized) | pad u16le | seq u32le | total length u64le
//! ```
//!
//! `pad` is 0, or the packet's length + 1 when zeros follow it: over a provider that loses
//! small messages no receive waits for ([`super::Offer::unexpected_floor`], libfabric 1.17's
//! `shm`), every packet is sent by `fi_tsend` padded past that size.
//!
//! Receives of [`MAX_PACKET`] + 16 bytes from any source are kept posted ([`RX_DEPTH`]).
//! Providers keep each source's messages in order (`FI_ORDER_SAS`) but may report
//! completions out of order (`comp_order` `FI_ORDER_NONE` for `tcp`), so each source's
//! packets carry a sequence number and are delivered in it. A `finalized` packet is the last
//! a rank sends when it finalizes; a send that completes with an error marks its peer
//! failed. Packets up to the provider's `inject_size` go by `fi_tinject` (no completion, and
//! not over a provider that needs padding),
//! larger ones by `fi_tsend` from a pooled buffer, at most [`TX_DEPTH`] outstanding:
//! beyond that, or on `-FI_EAGAIN`, `try_send` answers "full" as a full ring does.

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

use super::core::{Completion, Desc, Endpoint, OpKind, Post};
use super::p2p::{Delivered, Done, Matched, ProviderCore, Status, TaggedP2p};
use super::tag;
use crate::error::{Error, Result};
use crate::packet::{Packet, PeerState, PKT_FIRST, PKT_LAST, PKT_RMA};

/// Largest packet payload.
pub const MAX_PACKET: usize = 64 * 1024;
/// Bytes of the packet header.
pub const HDR: usize = 16;
/// Receives kept posted.
pub const RX_DEPTH: usize = 64;
/// Receives kept posted once the provider matches point-to-point
/// ([`OfiFabric::enable_matching`]): a provider matches an arriving message against its
/// posted receives in post order, so every packet receive ahead of an MPI receive costs each
/// MPI message a comparison (64 of them were about 1 000 instructions a message in `ofi_rxm`,
/// `pingpong_cost --ofi` under callgrind); packets are then few (control, collectives,
/// rendezvous data), and the provider holds those that find no receive.
pub const RX_DEPTH_MATCHING: usize = 8;
/// Most sends outstanding (not counting injected ones).
pub const TX_DEPTH: usize = 64;
/// Most received packets held (delivered later, in order) before receives stop being
/// reposted: the provider then buffers, or pushes back on the sender.
const RX_HELD_MAX: usize = 1024;
const KIND_DATA: u8 = 0;
const KIND_FINALIZED: u8 = 1;
/// How long finalize waits for this rank's last sends to complete.
const FLUSH_TIMEOUT: Duration = Duration::from_secs(60);
/// How long [`OfiFabric::mark_finalized`] offers its packet to a peer that finalized first.
const FINALIZED_GRACE: Duration = Duration::from_millis(200);

struct Rx {
    flags: u8,
    kind: u8,
    total: u64,
    len: usize,
    buf: Vec<u8>,
}

struct Peer {
    addr: u64,
    state: PeerState,
    next_in: u32,
    next_out: u32,
    /// Sends to this peer not completed yet.
    inflight: usize,
    early: BTreeMap<u32, Rx>,
    ready: VecDeque<Rx>,
}

/// The packet fabric over OFI. See the [module documentation](self).
pub struct OfiFabric {
    rank: usize,
    pub(super) ep: Endpoint,
    peers: Vec<Peer>,
    next: usize,
    rx_posted: usize,
    rx_held: usize,
    tx_inflight: usize,
    pool: Vec<Vec<u8>>,
    inject: usize,
    /// Packets are padded to at least this length (0: not padded). See the module doc.
    pad_to: usize,
    finalized: bool,
    /// A malformed packet seen in a completion, reported by the next poll.
    fault: Option<Error>,
    waker: Option<super::wake::Waker>,
    /// Completions of one progress call (kept to reuse its allocation).
    done: Vec<Completion>,
    /// Process ids of the peers on this host (0: on another host, or not known).
    pids: Vec<u32>,
    /// Point-to-point matched by the provider on the same endpoint, once
    /// [`OfiFabric::enable_matching`] turned it on.
    mpi: Option<ProviderCore>,
    /// Completions of `mpi`'s operations read by the packets' progress, for the next
    /// [`TaggedP2p::progress`] or [`OfiFabric::p2p_progress`].
    mpi_raw: Vec<Completion>,
    /// The address vector, by rank (kept for `mpi` and the reads).
    pub(super) addrs: Vec<u64>,
    /// Rendezvous reads (`fi_read` of peers' `fi_mr_reg` regions), once
    /// [`OfiFabric::enable_reads`] turned them on.
    pub(super) reads: Option<super::rma::Reads>,
}

fn hdr(flags: u8, kind: u8, seq: u32, total: u64) -> [u8; HDR] {
    let mut h = [0u8; HDR];
    h[0] = flags;
    h[1] = kind;
    h[4..8].copy_from_slice(&seq.to_le_bytes());
    h[8..].copy_from_slice(&total.to_le_bytes());
    h
}

impl OfiFabric {
    /// The fabric of `rank` over `ep`, whose address vector maps rank `r` to `addrs[r]`
    /// (this rank's own entry is not used). Posts the receives.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a rank out of range or beyond the tag's source field;
    /// [`Error::Fabric`] for a provider that requires `FI_MR_LOCAL`; [`Error::Ofi`] from
    /// posting.
    pub fn new(rank: usize, ep: Endpoint, addrs: Vec<u64>) -> Result<Self> {
        if rank >= addrs.len() || addrs.len() > 1 << tag::SRC_BITS {
            return Err(Error::InvalidArgument(format!("OFI fabric: rank {rank} of {}", addrs.len())));
        }
        if ep.offer().mr_mode.contains(crate::mr::MrMode::LOCAL) {
            // Its pooled buffers would each need a registration (phase 2).
            return Err(Error::Fabric(format!(
                "OFI provider {} requires FI_MR_LOCAL, which the packet fabric does not register for yet",
                ep.offer().provider
            )));
        }
        let peers = addrs
            .iter()
            .map(|&addr| Peer {
                addr,
                state: PeerState::Alive,
                next_in: 0,
                next_out: 0,
                inflight: 0,
                early: BTreeMap::new(),
                ready: VecDeque::new(),
            })
            .collect();
        let pad_to = ep.offer().unexpected_floor().min(usize::from(u16::MAX));
        let inject = if pad_to > 0 { 0 } else { ep.offer().inject_size.min(MAX_PACKET + HDR) };
        let waker = super::wake::Waker::new().ok();
        let pids = vec![0; addrs.len()];
        let mut f = OfiFabric {
            mpi: None,
            mpi_raw: Vec::new(),
            reads: None,
            addrs: addrs.clone(),
            rank,
            ep,
            peers,
            next: 0,
            rx_posted: 0,
            rx_held: 0,
            tx_inflight: 0,
            pool: Vec::new(),
            inject,
            pad_to,
            finalized: false,
            fault: None,
            waker,
            done: Vec::new(),
            pids,
        };
        f.post_receives()?;
        Ok(f)
    }

    /// Sends as if the provider kept small unexpected messages (to show that it does not).
    #[cfg(test)]
    pub(crate) fn without_padding(&mut self) {
        self.pad_to = 0;
        self.inject = self.ep.offer().inject_size.min(MAX_PACKET + HDR);
    }

    /// A line describing the receive side, for test failures.
    #[cfg(test)]
    pub(crate) fn debug_state(&self) -> String {
        let peers: Vec<String> = self
            .peers
            .iter()
            .map(|p| {
                format!(
                    "next_in={} next_out={} early={:?} ready={}",
                    p.next_in,
                    p.next_out,
                    p.early.keys().take(5).collect::<Vec<_>>(),
                    p.ready.len()
                )
            })
            .collect();
        format!(
            "rx_posted={} rx_held={} tx_inflight={} stats={:?} peers={peers:?}",
            self.rx_posted,
            self.rx_held,
            self.tx_inflight,
            self.ep.stats()
        )
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The endpoint (for the provider's name and counters).
    pub fn endpoint(&self) -> &Endpoint {
        &self.ep
    }

    /// The largest packet payload `try_send` takes.
    pub fn max_packet(&self) -> usize {
        MAX_PACKET
    }

    /// Records the process ids of the peers on this host (0 for the others), by which the
    /// runtime learns that a peer's process died: libfabric tells only a sender.
    pub fn set_peer_pids(&mut self, pids: Vec<u32>) {
        if pids.len() == self.pids.len() {
            self.pids = pids;
        }
    }

    /// The process id of `rank` if it runs on this host and said so, else 0.
    pub fn peer_pid(&self, rank: usize) -> u32 {
        self.pids.get(rank).copied().unwrap_or(0)
    }

    /// A handle that ends a [`OfiFabric::wait`] from another thread.
    pub fn waker(&self) -> Option<super::wake::Waker> {
        self.waker.clone()
    }

    fn post_receives(&mut self) -> Result<()> {
        let (bits, ignore) = (tag::PROTO_PACKET << tag::PROTO_SHIFT, !tag::PROTO_FIELD);
        let depth = if self.mpi.is_some() { RX_DEPTH_MATCHING } else { RX_DEPTH };
        while self.rx_posted < depth && self.rx_held < RX_HELD_MAX {
            let buf = self.pool.pop().unwrap_or_default();
            let mut buf = buf;
            buf.resize(HDR + MAX_PACKET, 0);
            match self.ep.trecv(buf, Desc::NONE, super::FI_ADDR_UNSPEC, bits, ignore, u64::MAX)? {
                Post::Posted(_) => self.rx_posted += 1,
                Post::Busy(b) => {
                    self.pool.push(b);
                    break;
                }
            }
        }
        Ok(())
    }

    /// Reads completions: sends free their buffers (an error marks the peer failed),
    /// receives are sorted into their source's order.
    fn progress(&mut self) -> Result<()> {
        let mut done = std::mem::take(&mut self.done);
        if let Some(m) = self.mpi.as_mut() {
            done.append(&mut m.take_foreign());
        }
        let read = self.ep.progress(|c| done.push(c));
        for c in done.drain(..) {
            self.handle(c)?;
        }
        self.done = done;
        read?;
        if self.reads.as_ref().is_some_and(|r| !r.queue_is_empty()) {
            self.retry_reads()?;
        }
        self.post_receives()
    }

    /// Hands completion `c` to its owner: matching by the provider, or the packets.
    fn handle(&mut self, c: Completion) -> Result<()> {
        if self.mpi.is_some() && ProviderCore::owns(&c) {
            self.mpi_raw.push(c);
            return Ok(());
        }
        match c.kind {
            OpKind::Send => self.sent(c),
            OpKind::Recv => self.received(c)?,
            OpKind::Read => self.read_completed(c.user, c.error),
            _ => {}
        }
        Ok(())
    }

    fn sent(&mut self, c: Completion) {
        self.tx_inflight -= 1;
        if let Some(p) = self.peers.get_mut(c.user as usize) {
            p.inflight = p.inflight.saturating_sub(1);
        }
        if c.error.is_some() {
            if let Some(p) = self.peers.get_mut(c.user as usize) {
                if p.state == PeerState::Alive {
                    p.state = PeerState::Failed;
                }
            }
        }
        self.recycle(c.buf);
    }

    fn recycle(&mut self, buf: Vec<u8>) {
        if self.pool.len() < RX_DEPTH + TX_DEPTH {
            self.pool.push(buf);
        }
    }

    fn received(&mut self, c: Completion) -> Result<()> {
        self.rx_posted -= 1;
        if c.error == Some(super::ffi::FI_ECANCELED) {
            self.recycle(c.buf);
            return Ok(());
        }
        let (_, _, src, _) = tag::fields(c.tag);
        let src = src as usize;
        if let Some(e) = c.error {
            self.recycle(c.buf);
            if e == super::ffi::FI_ETRUNC && src < self.peers.len() {
                self.fault = Some(Error::PeerProtocol { rank: src, what: "OFI packet longer than the fabric's packet limit" });
                self.peers[src].state = PeerState::Failed;
                return Ok(());
            }
            return Err(super::core::ofi_error("fi_trecv completion", -i64::from(e)));
        }
        if src >= self.peers.len() || src == self.rank || c.len < HDR {
            self.recycle(c.buf);
            return Ok(());
        }
        let b = &c.buf;
        let (flags, kind) = (b[0], b[1]);
        let seq = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
        let total = u64::from_le_bytes([b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]]);
        let pad = usize::from(u16::from_le_bytes([b[2], b[3]]));
        let len = if pad == 0 { c.len - HDR } else { pad - 1 };
        let bad = kind > KIND_FINALIZED || len > c.len - HDR || flags & !(PKT_FIRST | PKT_LAST | PKT_RMA) != 0;
        if bad {
            self.recycle(c.buf);
            self.fault = Some(Error::PeerProtocol { rank: src, what: "malformed OFI packet header" });
            self.peers[src].state = PeerState::Failed;
            return Ok(());
        }
        let rx = Rx { flags, kind, total, len, buf: c.buf };
        self.rx_held += 1;
        let p = &mut self.peers[src];
        if seq == p.next_in {
            p.ready.push_back(rx);
            p.next_in = p.next_in.wrapping_add(1);
            while let Some(r) = p.early.remove(&p.next_in) {
                p.ready.push_back(r);
                p.next_in = p.next_in.wrapping_add(1);
            }
        } else {
            p.early.insert(seq, rx);
        }
        Ok(())
    }

    /// Sends one packet (the concatenation of `parts`) to `dest`; `Ok(false)`: no room now
    /// (make progress and retry). A packet to a failed peer is dropped.
    ///
    /// # Errors
    /// A bad destination or an oversized packet; [`Error::Ofi`] from the provider.
    pub fn try_send(&mut self, dest: usize, flags: u8, total: u64, parts: &[&[u8]]) -> Result<bool> {
        self.send_kind(dest, flags, KIND_DATA, total, parts)
    }

    fn send_kind(&mut self, dest: usize, flags: u8, kind: u8, total: u64, parts: &[&[u8]]) -> Result<bool> {
        let len: usize = parts.iter().map(|p| p.len()).sum();
        if dest >= self.peers.len() || dest == self.rank || len > MAX_PACKET {
            return Err(Error::InvalidArgument(format!("OFI packet of {len} bytes from rank {} to {dest}", self.rank)));
        }
        if self.peers[dest].state == PeerState::Failed {
            return Ok(true);
        }
        let (seq, addr) = (self.peers[dest].next_out, self.peers[dest].addr);
        let h = hdr(flags, kind, seq, total);
        let bits = tag::send(tag::PROTO_PACKET, 0, self.rank as u32, 0).unwrap_or(0);
        // The finalized packet is sent with a completion: finalize waits for it, and with it
        // (in order on the connection) for all sent before, injected ones too.
        if HDR + len <= self.inject && kind == KIND_DATA {
            let mut small = [0u8; 256];
            let n = gather(&mut small, &h, parts);
            if n > 0 {
                if !self.ep.tinject(&small[..n], addr, bits)? {
                    self.progress()?;
                    return Ok(false);
                }
                self.peers[dest].next_out = seq.wrapping_add(1);
                return Ok(true);
            }
        }
        if self.tx_inflight >= TX_DEPTH {
            self.progress()?;
            if self.tx_inflight >= TX_DEPTH {
                return Ok(false);
            }
        }
        let mut buf = self.pool.pop().unwrap_or_default();
        buf.clear();
        buf.extend_from_slice(&h);
        for p in parts {
            buf.extend_from_slice(p);
        }
        if buf.len() < self.pad_to {
            // Fits u16: the floor is a provider's inject size (4 KiB for shm).
            buf[2..4].copy_from_slice(&((len + 1) as u16).to_le_bytes());
            buf.resize(self.pad_to, 0);
        }
        match self.ep.tsend(buf, Desc::NONE, addr, bits, dest as u64)? {
            Post::Posted(_) => {
                self.tx_inflight += 1;
                self.peers[dest].inflight += 1;
                self.peers[dest].next_out = seq.wrapping_add(1);
                Ok(true)
            }
            Post::Busy(b) => {
                self.recycle(b);
                self.progress()?;
                Ok(false)
            }
        }
    }

    /// Delivers at most one packet from each source that has one, round-robin, to `f`;
    /// `f` returns `false` to leave the packet for the next poll. Returns how many were
    /// taken, a peer's `finalized` packet included (it is not delivered).
    ///
    /// # Errors
    /// [`Error::PeerProtocol`] naming a peer that sent a malformed packet (once; the peer
    /// then counts as failed); [`Error::Ofi`] when the completion queue fails.
    pub fn poll<F: FnMut(Packet<'_>) -> bool>(&mut self, mut f: F) -> Result<usize> {
        self.progress()?;
        if let Some(e) = self.fault.take() {
            return Err(e);
        }
        let n = self.peers.len();
        let mut taken = 0;
        for i in 0..n {
            let src = (self.next + i) % n;
            let p = &mut self.peers[src];
            if p.ready.front().is_some_and(|r| r.kind == KIND_FINALIZED) {
                p.state = PeerState::Finalized;
                if let Some(r) = p.ready.pop_front() {
                    self.rx_held -= 1;
                    // Counted as taken: the caller looks again before it concludes that the
                    // peer left nothing. A message it sent before, which the provider matches
                    // and holds unexpected, is visible to a peek made after this packet was
                    // read (the connection keeps order), not necessarily to one made before.
                    taken += 1;
                    self.recycle(r.buf);
                }
            }
            let p = &mut self.peers[src];
            let Some(r) = p.ready.front() else { continue };
            let pkt = Packet { src, flags: r.flags, total_len: r.total, data: &r.buf[HDR..HDR + r.len] };
            if !f(pkt) {
                continue;
            }
            if let Some(r) = p.ready.pop_front() {
                self.rx_held -= 1;
                taken += 1;
                self.recycle(r.buf);
            }
        }
        self.next = (self.next + 1) % n.max(1);
        Ok(taken)
    }

    /// Whether a packet from `src` waits to be delivered.
    pub fn pending_from(&mut self, src: usize) -> bool {
        if self.fault.is_none() {
            // A failing queue shows at the next poll, which reports it.
            let _ = self.progress();
        }
        self.peers.get(src).is_some_and(|p| p.ready.front().is_some_and(|r| r.kind == KIND_DATA))
    }

    /// How `rank` stands: finalized once its `finalized` packet was reached (after every
    /// packet it sent before), failed once a send to it failed or it broke the framing, or
    /// [`OfiFabric::mark_failed`] said so.
    pub fn peer_state(&self, rank: usize) -> PeerState {
        self.peers.get(rank).map_or(PeerState::Alive, |p| p.state)
    }

    /// Records that `rank` failed, as the runtime learned it elsewhere (its process is gone):
    /// libfabric's RDM endpoints report a dead peer only to a sender.
    pub fn mark_failed(&mut self, rank: usize) {
        if let Some(p) = self.peers.get_mut(rank) {
            if p.state == PeerState::Alive {
                p.state = PeerState::Failed;
            }
        }
    }

    /// Whether peer `dest` finalized: its `finalized` packet was taken, or waits after the
    /// last of what it sent.
    fn has_finalized(&self, dest: usize) -> bool {
        let p = &self.peers[dest];
        p.state == PeerState::Finalized || p.ready.back().is_some_and(|r| r.kind == KIND_FINALIZED)
    }

    /// Records that this rank finalized: sends each live peer a `finalized` packet after
    /// everything sent before, and waits (up to a minute) until every send to a peer that
    /// has not finalized completed (a peer that finalized waited for what it needed). What
    /// arrives meanwhile is held, not delivered. A peer that finalized first is given the
    /// packet for at most 200 ms (`FINALIZED_GRACE`): once its process is gone the provider refuses
    /// it (`-FI_EAGAIN`) for as long as one tries.
    pub fn mark_finalized(&mut self) {
        if std::mem::replace(&mut self.finalized, true) {
            return;
        }
        let deadline = Instant::now() + FLUSH_TIMEOUT;
        for dest in 0..self.peers.len() {
            if dest == self.rank {
                continue;
            }
            let start = Instant::now();
            loop {
                let now = Instant::now();
                if now >= deadline || (now >= start + FINALIZED_GRACE && self.has_finalized(dest)) {
                    break;
                }
                match self.send_kind(dest, 0, KIND_FINALIZED, 0, &[]) {
                    Ok(true) | Err(_) => break,
                    Ok(false) => std::thread::yield_now(),
                }
            }
        }
        while self.flush_owed() && Instant::now() < deadline {
            if self.progress().is_err() {
                break;
            }
            std::thread::yield_now();
        }
    }

    /// Whether a send to a live peer that has not finalized is still out. A peer that
    /// finalized waited for whatever it needed from this rank before it did: sends to it
    /// are not waited for (over `shm` they complete only as the peer takes them, and it
    /// may have exited).
    fn flush_owed(&self) -> bool {
        (0..self.peers.len()).any(|d| {
            let p = &self.peers[d];
            p.inflight > 0 && p.state == PeerState::Alive && !self.has_finalized(d)
        })
    }

    /// Sleeps until a completion may be ready (the completion queue's descriptor, where the
    /// provider gives one), [`OfiFabric::waker`] is woken, or `timeout` passes; returns at
    /// once when a packet, or the end of a read, already waits. Without a descriptor it only sleeps. Returns whether
    /// something may be ready; the caller polls either way.
    pub fn wait(&mut self, timeout: Duration) -> bool {
        // Completions already read (packets, or the reads' ends) wait for no descriptor.
        if self.peers.iter().any(|p| !p.ready.is_empty()) || self.reads.as_ref().is_some_and(|r| !r.done.is_empty()) {
            return true;
        }
        match self.ep.wait_fd() {
            Some(fd) if self.ep.try_wait() => super::wake::sleep_on(fd, self.waker.as_ref(), timeout),
            Some(_) => true,
            None => super::wake::sleep_on(-1, self.waker.as_ref(), timeout),
        }
    }
}

impl OfiFabric {
    /// Turns on point-to-point matched by the provider beside the packets, on the same
    /// endpoint ([`TaggedP2p`]): MPI-tagged messages ([`super::tag::PROTO_MPI`]) never match
    /// the packet receives (which take only [`super::tag::PROTO_PACKET`]), and completions go
    /// to their owner by the operation's `user` word ([`ProviderCore::owns`]).
    pub fn enable_matching(&mut self) {
        if self.mpi.is_none() {
            self.mpi = Some(ProviderCore::new(&self.ep, self.rank as u32, self.addrs.clone()));
            // Fewer packet receives ahead of the MPI ones (see `RX_DEPTH_MATCHING`): the
            // cancelled ones come back cancelled and are not reposted. A failed cancel
            // leaves them posted, which costs time only.
            let _ = self.ep.cancel_recvs(u64::MAX, RX_DEPTH_MATCHING);
        }
    }

    /// Whether [`OfiFabric::enable_matching`] turned matching by the provider on.
    pub fn matching(&self) -> bool {
        self.mpi.is_some()
    }

    /// The eager limit of matching by the provider (`None` while it is off).
    pub fn eager_max(&self) -> Option<usize> {
        self.mpi.as_ref().map(ProviderCore::eager_max)
    }

    /// The longest message [`OfiFabric::p2p_send`] takes (`None` while matching by the
    /// provider is off): see [`ProviderCore::floor`].
    pub fn p2p_floor(&self) -> Option<usize> {
        self.mpi.as_ref().map(ProviderCore::floor)
    }

    /// Sends `msg` (at most [`OfiFabric::p2p_floor`] bytes) to rank `dest` with context
    /// `ctx` and MPI tag `tag`, matched by the provider ([`ProviderCore::send_owned`]).
    ///
    /// # Errors
    /// As [`ProviderCore::send_owned`]; matching by the provider off.
    pub fn p2p_send(&mut self, dest: u32, ctx: u32, tag: u32, msg: Vec<u8>) -> Result<()> {
        self.with_mpi(|m, ep| m.send_owned(ep, dest, ctx, tag, msg))
    }

    /// Handles of the receives matching by the provider still has posted.
    pub fn p2p_live(&self) -> Vec<u64> {
        self.mpi.as_ref().map(ProviderCore::live_handles).unwrap_or_default()
    }

    /// Point-to-point sends queued or not yet completed ([`ProviderCore::sends_pending`]).
    pub fn p2p_sends_pending(&self) -> usize {
        self.mpi.as_ref().map_or(0, ProviderCore::sends_pending)
    }

    /// Flushes point-to-point's sends, progresses the endpoint (packets included) when
    /// `read`, and returns point-to-point's completions read meanwhile (and by the packets'
    /// last poll).
    fn p2p_read(&mut self, read: bool) -> Result<Vec<Completion>> {
        let mut owned = Vec::new();
        self.with_mpi(|m, ep| m.flush(ep, &mut owned))?;
        if read {
            OfiFabric::progress(self)?;
        }
        owned.append(&mut self.mpi_raw);
        Ok(owned)
    }

    /// [`TaggedP2p::progress`] that lends each finished receive's bytes to `f` with its
    /// handle instead of copying them (see [`ProviderCore::finish_with`]); returns how many
    /// point-to-point operations completed. With `read` false the completion queue is not
    /// read again: only what the packets' last poll read is handed over (the engine polls
    /// the packets first in each round of progress).
    ///
    /// # Errors
    /// As [`TaggedP2p::progress`].
    pub fn p2p_progress(&mut self, read: bool, mut f: impl FnMut(u64, Delivered<'_>)) -> Result<usize> {
        let owned = self.p2p_read(read)?;
        let n = owned.len();
        let Some(m) = self.mpi.as_mut() else { return Ok(0) };
        for c in owned {
            m.finish_with(c, &mut f)?;
        }
        Ok(n)
    }

    /// The endpoint and the matching core, for one call; afterwards, the completions of
    /// packets the core read go where they belong.
    fn with_mpi<T>(&mut self, f: impl FnOnce(&mut ProviderCore, &mut Endpoint) -> Result<T>) -> Result<T> {
        let Some(m) = self.mpi.as_mut() else {
            return Err(Error::InvalidArgument("OFI fabric: matching by the provider is off".into()));
        };
        let out = f(m, &mut self.ep);
        for c in m.take_foreign() {
            self.handle(c)?;
        }
        out
    }
}

/// MPI point-to-point matched by the provider on the fabric's endpoint, once
/// [`OfiFabric::enable_matching`] turned it on (every call fails with
/// [`Error::InvalidArgument`] before).
impl TaggedP2p for OfiFabric {
    fn send(&mut self, dest: u32, ctx: u32, tag: u32, data: &[u8]) -> Result<()> {
        self.with_mpi(|m, ep| m.send(ep, dest, ctx, tag, data))
    }

    fn post_recv(&mut self, ctx: u32, src: Option<u32>, tag: Option<u32>, cap: usize) -> Result<u64> {
        self.with_mpi(|m, ep| m.post_recv(ep, ctx, src, tag, cap))
    }

    fn iprobe(&mut self, ctx: u32, src: Option<u32>, tag: Option<u32>) -> Result<Option<Status>> {
        self.with_mpi(|m, ep| m.iprobe(ep, ctx, src, tag))
    }

    fn improbe(&mut self, ctx: u32, src: Option<u32>, tag: Option<u32>) -> Result<Option<Matched>> {
        self.with_mpi(|m, ep| m.improbe(ep, ctx, src, tag))
    }

    fn mrecv(&mut self, msg: Matched, cap: usize) -> Result<u64> {
        self.with_mpi(|m, ep| m.mrecv(ep, msg, cap))
    }

    fn cancel(&mut self, handle: u64) -> Result<()> {
        self.with_mpi(|m, ep| m.cancel(ep, handle))
    }

    /// Progresses the packets too: one completion queue serves both.
    fn progress(&mut self, done: &mut Vec<Done>) -> Result<()> {
        let owned = self.p2p_read(true)?;
        let Some(m) = self.mpi.as_mut() else { return Ok(()) };
        for c in owned {
            m.finish(c, done)?;
        }
        Ok(())
    }
}

/// Copies `h` and `parts` into `out`; 0 when they do not fit.
fn gather(out: &mut [u8], h: &[u8], parts: &[&[u8]]) -> usize {
    let total = h.len() + parts.iter().map(|p| p.len()).sum::<usize>();
    if total > out.len() {
        return 0;
    }
    out[..h.len()].copy_from_slice(h);
    let mut at = h.len();
    for p in parts {
        out[at..at + p.len()].copy_from_slice(p);
        at += p.len();
    }
    at
}
