//! The progress engine of one rank: fabric, matching, protocols, requests.
//!
//! Everything that moves happens in [`Engine::progress`]: queued sends are pushed into the
//! fabric as ring space frees up, arriving packets are matched against posted receives (or
//! stored as unexpected), and control messages (synchronous-send acknowledgements) go out.
//! Blocking calls are a post followed by [`Engine::wait`], which polls with a back-off that
//! spins briefly, then yields, then sleeps, so that ranks outnumbering cores make progress.
//!
//! Every packet, self-sends included, first passes through this rank's soft TM-SRQ
//! (`tmpi_transport::tm`) exactly as it would pass through a NIC with hardware tag matching:
//! receives that the offload policy allows sit in its tag list and are matched there
//! (`hw_matched`); everything else lands in an SRQ buffer and completes unexpected, and then
//! the software matcher takes over (`sw_matched`). The offload policy is UCX's: a receive is
//! added to the tag list only if it names its source, is at least `TMPI_TM_THRESH` bytes, no
//! earlier software-only receive could match the same messages, and the list has room. Every
//! posted receive is also queued in the software matcher, so that a message the hardware
//! delivered unexpected (a stale entry during phase synchronisation) still finds the earliest
//! receive; if that receive is in the tag list it is deleted there first. Software's count of
//! unexpected messages travels with every ADD and DEL, and a SYNC follows every 2^14
//! unexpected messages or a completion flagged `TM_SYNC_REQ`.
//!
//! Wire protocol on top of the fabric's packets (see `tmpi_transport::fabric`):
//! - a data message is `TMH(EAGER) | payload` split over consecutive packets of one source;
//!   `app_ctx` carries `SYNC_FLAG | sender request index` for synchronous sends;
//! - a control message is one packet `NO_TAG | kind | 0 0 | value be32`; control packets may
//!   appear between the packets of a data message, which they never disturb.
//! - a message of at least `TMPI_RNDV_THRESHOLD` bytes is a rendezvous: the sender registers
//!   its buffer (REMOTE_READ) through the MR cache and sends `TMH(RNDV) | RVH | key be64 |
//!   len be64`; the receiver, once the request matched (in the TM-SRQ, which asks for the
//!   read itself, or in software), sends an RDMA read request (`PKT_RMA`); the sender's side
//!   checks key, range and access in its fi_mr domain before a byte moves. Then the bytes
//!   move one of two ways:
//!   - streamed back through the ring (`PKT_RMA` responses, a pipelined copy-in/copy-out;
//!     reads below `TMPI_SINGLE_COPY_MIN`, or `TMPI_SINGLE_COPY=none`);
//!   - single copy (CMA): the sender answers with a grant, and the reader copies the range
//!     with `process_vm_readv`; from 128 KiB on the grant splits it, and the sender writes
//!     the second half into the reader's buffer with `process_vm_writev` at the same time and
//!     says so (`WRITE_DONE`), so both cores copy. A kernel refusal (EPERM/ENOSYS) turns single
//!     copy off for good and the affected part is streamed instead. Abandoning (scope unwind)
//!     a send whose buffer a reader was granted, or a receive a sender may be writing into,
//!     waits for that copy to end, so no process ever touches freed memory.
//!
//!   When all bytes are in, the receiver (or its TM-SRQ) sends `FIN` (the request's TMH and
//!   RVH), which completes the send and releases the registration.

use std::collections::VecDeque;

use tmpi_transport::fabric::{Packet, PKT_FIRST, PKT_LAST, PKT_RMA, PKT_WHOLE};
use tmpi_transport::local::LocalFabric;
use tmpi_transport::mr::{Access, CacheConfig, CachedMr, Domain, DomainAttr, Monitor, MrCache, MrMode, RemoteOp};
use tmpi_transport::shm::{cma, ShmFabric};
use tmpi_transport::tm::{
    Arrival, Buffer, OpsWr, ReadId, RndvRequest, TmCap, TmCaps, TmSrq, Wc, WcFlags, WcOpcode, WcStatus, RNDV_REQ_LEN, RVH_LEN_IN_META,
};
use tmpi_transport::wire::{Rvh, TmOp, Tmh, RVH_LEN, TMH_LEN};

use crate::buffer::{RawBuf, RawBufMut};
use crate::config::Config;
use crate::error::{Error, Result};
use crate::matching::{self, Arrived, Matcher, Posted, RecvId, SwMatcher};
use crate::slab::{Key, Slab};
use crate::{Rank, Status, Tag};

/// `app_ctx` bit of a synchronous send: the receiver acknowledges the match.
const SYNC_FLAG: u32 = 1 << 31;
/// Control message kind: acknowledgement of a synchronous send (value = sender request index).
const CTL_SSEND_ACK: u8 = 1;
/// Largest packet of a fabric without its own limit (self-delivery, single rank).
const SELF_MAX_PACKET: usize = usize::MAX / 2;
/// SRQ buffers kept posted; each unexpected message takes one and software reposts it.
const SRQ_DEPTH: usize = 64;
/// Capacity of each SRQ buffer: unexpected messages are copied into memory software
/// allocates per message, so the modelled buffer never truncates.
const SRQ_BUF_LEN: usize = usize::MAX / 4;
/// RMA packet kinds (first byte of a `PKT_RMA` packet).
const RMA_READ_REQ: u8 = 1;
const RMA_READ_RESP: u8 = 2;
const RMA_READ_ERR: u8 = 3;
/// The target checked the key: the reader may copy the range itself (CMA single copy).
const RMA_READ_GRANT: u8 = 4;
/// Read request modes (second byte of `RMA_READ_REQ`).
const READ_MODE_STREAM: u8 = 0;
const READ_MODE_CMA: u8 = 1;
/// The target wrote its share of a split single-copy read into the reader's buffer.
const RMA_WRITE_DONE: u8 = 5;
/// Single-copy reads of at least this many bytes are split: the reader copies the first half,
/// the target (otherwise idle until FIN) writes the second half, so both cores copy.
const CMA_SPLIT_MIN: usize = 128 * 1024;
/// Bytes of header in front of the data of an RMA read response.
const RMA_RESP_HDR: usize = 24;
/// Software syncs the TM-SRQ at least once every this many unexpected messages.
const FORCED_SYNC_EVERY: u32 = 1 << 14;

pub(crate) type ReqId = Key;

/// The fabric under one engine.
pub(crate) enum Fabric {
    /// Processes on one node.
    Shm(ShmFabric),
    /// Threads of one process.
    Local(LocalFabric),
    /// A job of one rank: only self-delivery.
    Single,
}

impl Fabric {
    fn max_packet(&self) -> usize {
        match self {
            Fabric::Shm(f) => f.max_packet(),
            Fabric::Local(f) => f.max_packet(),
            Fabric::Single => SELF_MAX_PACKET,
        }
    }

    #[inline]
    fn try_send(&mut self, dest: usize, flags: u8, total: u64, parts: &[&[u8]]) -> Result<bool> {
        Ok(match self {
            Fabric::Shm(f) => f.try_send(dest, flags, total, parts)?,
            Fabric::Local(f) => f.try_send(dest, flags, total, parts)?,
            Fabric::Single => return Err(Error::State("no fabric in a single-rank job".into())),
        })
    }

    #[inline]
    fn poll<F: FnMut(Packet<'_>) -> bool>(&mut self, f: F) -> Result<usize> {
        Ok(match self {
            Fabric::Shm(s) => s.poll(f)?,
            Fabric::Local(l) => l.poll(f)?,
            Fabric::Single => 0,
        })
    }

    /// Whether `rank` failed: it left without finalizing (its process died, or its thread
    /// unwound). A rank that finalized cleanly and exited is not a failure.
    fn peer_failed(&self, rank: usize) -> bool {
        match self {
            Fabric::Shm(f) => !f.peer_finalized(rank) && (f.peer_departed(rank) || !crate::sys::pid_alive(f.peer_pid(rank))),
            Fabric::Local(f) => f.peer_failed(rank),
            Fabric::Single => false,
        }
    }

    /// Process id of `rank` (this process for threads and self-delivery).
    fn peer_pid(&self, rank: usize) -> u32 {
        match self {
            Fabric::Shm(f) if rank != f.rank() => f.peer_pid(rank),
            _ => std::process::id(),
        }
    }

    fn mark_finalized(&self) {
        match self {
            Fabric::Shm(f) => f.mark_finalized(),
            Fabric::Local(f) => f.mark_finalized(),
            Fabric::Single => {}
        }
    }
}

/// Counters printed by `TMPI_STATS=1`.
#[derive(Debug, Default, Clone)]
pub(crate) struct Stats {
    pub msgs_sent: u64,
    pub msgs_recv: u64,
    pub bytes_sent: u64,
    pub bytes_recv: u64,
    pub eager: u64,
    pub rndv: u64,
    pub sw_matched: u64,
    /// Times a message was left in its ring by flow control.
    pub flow_stalls: u64,
    /// Most bytes held by unexpected messages at once.
    pub ux_peak_bytes: u64,
    pub unexpected: u64,
    pub tm_syncs: u64,
    /// Rendezvous reads done with one kernel copy (CMA), and their bytes.
    pub cma_reads: u64,
    pub cma_bytes: u64,
    /// Times the kernel refused CMA and reads fell back to the pipelined copy.
    pub cma_fallbacks: u64,
}

struct RecvState {
    /// `None`: the receive was abandoned mid-message; data is discarded.
    buf: Option<RawBufMut>,
    cap: usize,
    matched: bool,
    match_id: Option<RecvId>,
    /// Handle of the receive's entry in the TM-SRQ tag list, while it is there.
    hw_handle: Option<u32>,
    /// Queued in software only (counted in `State::sw_only_posted`).
    sw_only: bool,
    /// A rendezvous request the TM-SRQ placed in this (too small) tagged buffer.
    rndv_req: Option<([u8; 64], usize)>,
    /// The rendezvous read filling this receive, once started.
    read: Option<Key>,
    received: usize,
    total: usize,
    source: Rank,
    tag: Tag,
}

struct SendState {
    pushed: bool,
    need_ack: bool,
    acked: bool,
    /// A rendezvous send: its buffer (until abandoned) and its registration, held until FIN.
    rndv: Option<RndvSend>,
}

struct RndvSend {
    buf: Option<RawBuf>,
    _mr: CachedMr,
    /// A reader that was granted a single-copy read of `buf` (it copies the memory itself
    /// until its FIN): abandoning the send must wait for that FIN.
    granted: Option<usize>,
}

/// What a rendezvous request announces.
#[derive(Debug, Clone, Copy)]
struct RndvInfo {
    tmh: Tmh,
    rvh: Rvh,
    key: u64,
    len: usize,
}

impl RndvInfo {
    fn parse(req: &[u8]) -> Result<Self> {
        let tmh = Tmh::decode(req)?;
        let rvh = Rvh::decode(req.get(TMH_LEN..).unwrap_or(&[]))?;
        // The RVH is what the hardware path reads; software reads the same, except the length
        // of a payload the RVH cannot hold (`RVH_LEN_IN_META`), which is in the meta-data.
        let len = RndvRequest::payload_len(req).ok_or_else(|| malformed("rendezvous request of 4 GiB or more without its length"))?;
        let len = usize::try_from(len).map_err(|_| malformed("rendezvous length overflows"))?;
        Ok(RndvInfo { tmh, rvh, key: u64::from(rvh.rkey), len })
    }
}

/// An RDMA read this rank issued for a rendezvous receive.
struct ReadOp {
    rid: ReqId,
    src: usize,
    /// Bytes to read (the message, or the receive buffer if that is shorter).
    n: usize,
    got: usize,
    /// Set when the TM-SRQ asked for the read (expected rendezvous).
    hw: Option<ReadId>,
    info: RndvInfo,
    /// Bytes `[0, split)` this rank copies itself after a single-copy grant; the target
    /// writes `[split, n)`.
    split: usize,
    /// The target may write into the receive buffer (a single-copy request named it): the
    /// buffer must outlive the read even if the receive is abandoned.
    remote_write: bool,
    /// This rank's share failed; the read completes with an error once the target's share is
    /// done (it may still be writing into the buffer).
    failed: bool,
}

/// A range of a rendezvous send buffer being streamed to a reader.
struct RmaOut {
    dest: usize,
    read: [u8; 8],
    buf: RawBuf,
    off: usize,
    /// Offset of `buf` within the read.
    base: usize,
}

/// A decoded RDMA read request.
#[derive(Clone, Copy)]
struct ReadReq {
    mode: u8,
    /// Index of the send request whose buffer is read.
    sreq: u32,
    va: u64,
    key: u64,
    len: u64,
    /// Reader's buffer for the target's share of a single-copy read (0: none).
    dst: u64,
}

/// The target's share of a split single-copy read: `buf` goes to `dst` in the reader.
struct CmaWrite {
    dest: usize,
    read: [u8; 8],
    buf: RawBuf,
    /// Reader's address of the read's first byte, and the offset of `buf` within the read.
    dst: u64,
    base: usize,
}

/// A small packet queued for sending (control, FIN, RMA requests).
#[derive(Clone, Copy)]
struct Ctl {
    flags: u8,
    len: u8,
    bytes: [u8; 48],
}

impl Ctl {
    fn new(flags: u8, b: &[u8]) -> Self {
        let mut bytes = [0u8; 48];
        bytes[..b.len()].copy_from_slice(b);
        Ctl { flags, len: b.len() as u8, bytes }
    }
}

enum ReqKind {
    Recv(RecvState),
    Send(SendState),
}

struct Req {
    kind: ReqKind,
    result: Option<Result<Status>>,
    /// Nobody will collect the result: free the slot on completion.
    detached: bool,
}

/// A message that arrived before its receive was posted.
struct UxMsg {
    src_world: usize,
    tag64: u64,
    total: usize,
    data: Vec<u8>,
    complete: bool,
    /// (sender world rank, sender request index) to acknowledge on match.
    ack: Option<(usize, u32)>,
    /// A rendezvous request: the data is still at the sender.
    rndv: Option<RndvInfo>,
}

/// Where the continuation packets of a source's current message go.
#[derive(Clone, Copy)]
enum Incoming {
    Idle,
    Expected { req: ReqId },
    Unexpected { ux: Key },
}

enum OutData {
    User(RawBuf),
    Owned(Vec<u8>),
}

impl OutData {
    fn len(&self) -> usize {
        match self {
            OutData::User(b) => b.len(),
            OutData::Owned(v) => v.len(),
        }
    }
    fn slice(&self, from: usize, to: usize) -> &[u8] {
        match self {
            OutData::User(b) => b.slice(from, to),
            OutData::Owned(v) => &v[from..to],
        }
    }
}

/// A data message waiting for ring space.
struct OutMsg {
    req: ReqId,
    hdr: [u8; RNDV_REQ_LEN],
    hdr_len: usize,
    data: OutData,
    /// Payload bytes already pushed.
    off: usize,
    started: bool,
}

/// Engine state other than the fabric (split so the poll callback can borrow it).
struct State {
    rank: usize,
    matcher: SwMatcher<ReqId, Key>,
    reqs: Slab<Req>,
    ux: Slab<UxMsg>,
    incoming: Vec<Incoming>,
    ctlq: VecDeque<(usize, Ctl)>,
    stats: Stats,
    error: Option<Error>,
    /// This rank's soft TM-SRQ: every arriving packet passes through it.
    tm: TmSrq,
    /// Offload is on (`TMPI_TM_MAX_TAGS > 0`).
    offload: bool,
    /// `TMPI_TM_MAX_TAGS`.
    max_tags: usize,
    /// `TMPI_TM_THRESH`.
    tm_thresh: usize,
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
    /// Rendezvous reads in progress.
    reads: Slab<ReadOp>,
    /// Registration cache (sender side of rendezvous) and its domain (target key checks).
    mr: MrCache,
    domain: Domain,
    /// Read responses to stream.
    rma_out: VecDeque<RmaOut>,
    /// Single-copy reads may be tried (`TMPI_SINGLE_COPY=cma` and the kernel has not refused).
    cma: bool,
    /// `TMPI_SINGLE_COPY_MIN`: smaller reads stream through the ring.
    cma_min: usize,
    /// Reads granted by their target, waiting for this rank to copy the data (CMA).
    cma_q: VecDeque<Key>,
    /// This rank's shares of split single-copy reads, to write into the readers.
    cma_w: VecDeque<CmaWrite>,
    /// Bytes held by unexpected messages (payload plus bookkeeping), and the budget
    /// (`TMPI_UNEXPECTED_MAX`) above which messages that no posted receive matches are left
    /// in the sender's ring.
    ux_bytes: usize,
    ux_budget: usize,
}

/// Bookkeeping bytes counted per unexpected message on top of its payload.
const UX_OVERHEAD: usize = 128;

/// One rank's engine.
pub(crate) struct Engine {
    fabric: Fabric,
    st: State,
    out: Vec<VecDeque<OutMsg>>,
    out_pending: usize,
    max_packet: usize,
    size: usize,
    spin: u32,
    pub(crate) cfg: Config,
    /// Next free communicator id (see `Comm::dup`).
    pub(crate) next_comm_id: u32,
}

#[inline]
fn src_of(tag64: u64) -> Rank {
    matching::decode_src(tag64) as Rank
}

#[inline]
fn tag_of(tag64: u64) -> Tag {
    matching::decode_tag(tag64)
}

impl Engine {
    pub(crate) fn new(fabric: Fabric, rank: usize, size: usize, cfg: Config) -> Result<Self> {
        let max_packet = fabric.max_packet();
        let oversubscribed = size > crate::sys::usable_cpus();
        let spin = cfg.poll_spin.unwrap_or(if oversubscribed { 64 } else { 20_000 });
        let tags = cfg.tm_max_tags.max(1);
        let caps = TmCaps { max_num_tags: tags.max(TmCaps::default().max_num_tags), ..TmCaps::default() };
        let mut tm = TmSrq::with_caps(caps, TmCap { max_num_tags: tags, max_ops: 1024, max_wr: SRQ_DEPTH as u32 })
            .map_err(tmpi_transport::Error::from)?;
        for wr in 0..SRQ_DEPTH as u64 {
            tm.post_srq_recv(wr, SRQ_BUF_LEN).map_err(tmpi_transport::Error::from)?;
        }
        // 4-byte keys: the RVH's rkey is the whole fi_mr key, checked by the target's domain.
        let domain = Domain::open(DomainAttr { mr_mode: MrMode::VIRT_ADDR | MrMode::PROV_KEY, mr_key_size: 4, mr_iov_limit: 1 })
            .map_err(tmpi_transport::Error::from)?;
        let cache_cfg = CacheConfig {
            max_count: cfg.mr_cache_max_count,
            max_size: cfg.mr_cache_max_size.unwrap_or(usize::MAX),
            monitor: if cfg.mr_cache_monitor_uffd { Monitor::Userfaultfd } else { Monitor::Disabled },
        };
        let mr = MrCache::new(domain.clone(), cache_cfg).map_err(tmpi_transport::Error::from)?;
        Ok(Engine {
            fabric,
            st: State {
                rank,
                matcher: SwMatcher::new(),
                reqs: Slab::new(),
                ux: Slab::new(),
                incoming: vec![Incoming::Idle; size],
                ctlq: VecDeque::new(),
                stats: Stats::default(),
                error: None,
                tm,
                offload: cfg.tm_max_tags > 0,
                max_tags: cfg.tm_max_tags as usize,
                tm_thresh: cfg.tm_thresh,
                sw_unexp: 0,
                need_sync: false,
                srq_wr: SRQ_DEPTH as u64,
                op_wr: 0,
                sw_only_posted: 0,
                reads: Slab::new(),
                mr,
                domain,
                rma_out: VecDeque::new(),
                cma: cfg.single_copy,
                cma_min: cfg.single_copy_min,
                cma_q: VecDeque::new(),
                cma_w: VecDeque::new(),
                ux_bytes: 0,
                ux_budget: cfg.unexpected_max,
            },
            out: (0..size).map(|_| VecDeque::new()).collect(),
            out_pending: 0,
            max_packet,
            size,
            spin,
            cfg,
            next_comm_id: 1,
        })
    }

    pub(crate) fn rank(&self) -> usize {
        self.st.rank
    }

    pub(crate) fn size(&self) -> usize {
        self.size
    }

    /// The `tmpi-stats` line printed at finalize under `TMPI_STATS=1`.
    pub(crate) fn stats_line(&self) -> String {
        let s = &self.st.stats;
        let tm = self.st.tm.counters();
        let mc = self.st.mr.stats();
        format!(
            "tmpi-stats rank={} msgs_sent={} msgs_recv={} bytes_sent={} bytes_recv={} eager={} rndv={} hw_matched={} sw_matched={} unexpected={} tm_syncs={} rndv_incomplete={}",
            self.st.rank, s.msgs_sent, s.msgs_recv, s.bytes_sent, s.bytes_recv, s.eager, s.rndv, tm.hw_matched, s.sw_matched, s.unexpected, s.tm_syncs, tm.rndv_incomplete
        ) + &format!(
            " mr_cache_hits={} mr_cache_misses={} mr_cache_evictions={} mr_cache_invalidations={} hw_unexpected={} tm_adds={} tm_dels={} tm_list_hwm={} flow_stalls={} ux_peak_bytes={}",
            mc.hits, mc.misses, mc.evictions, mc.invalidations, tm.unexpected, tm.adds, tm.dels, tm.list_hwm, s.flow_stalls, s.ux_peak_bytes
        ) + &format!(" cma_reads={} cma_bytes={} cma_fallbacks={}", s.cma_reads, s.cma_bytes, s.cma_fallbacks)
    }

    /// Starts a data message to `dest` (a world rank). Returns `None` when it is already
    /// complete (locally, for a standard send), or the request to wait on.
    pub(crate) fn start_send(&mut self, dest: usize, tag64: u64, data: RawBuf, sync: bool) -> Result<Option<ReqId>> {
        let len = data.len();
        self.st.stats.msgs_sent += 1;
        self.st.stats.bytes_sent += len as u64;
        if dest != self.st.rank && (len >= self.cfg.rndv_threshold || len > self.cfg.eager_limit) {
            return self.start_rndv(dest, tag64, data).map(Some);
        }
        self.st.stats.eager += 1;
        let req = if sync {
            Some(self.st.reqs.insert(Req {
                kind: ReqKind::Send(SendState { pushed: false, need_ack: true, acked: false, rndv: None }),
                result: None,
                detached: false,
            }))
        } else {
            None
        };
        let app_ctx = req.map_or(0, |r| SYNC_FLAG | r.idx);
        let tmh = Tmh { op: TmOp::Eager, app_ctx, tag: tag64 }.to_bytes();
        if dest == self.st.rank {
            self.st.deliver_self(&tmh, data.slice(0, len))?;
            self.flush_ctl()?;
            return Ok(self.mark_pushed(req));
        }
        if self.out[dest].is_empty() && TMH_LEN + len <= self.max_packet {
            let total = (TMH_LEN + len) as u64;
            if self.fabric.try_send(dest, PKT_WHOLE, total, &[&tmh, data.slice(0, len)])? {
                return Ok(self.mark_pushed(req));
            }
        }
        let req = match req {
            Some(r) => r,
            None => self.st.reqs.insert(Req {
                kind: ReqKind::Send(SendState { pushed: false, need_ack: false, acked: false, rndv: None }),
                result: None,
                detached: false,
            }),
        };
        let mut hdr = [0u8; RNDV_REQ_LEN];
        hdr[..TMH_LEN].copy_from_slice(&tmh);
        self.queue_out(dest, OutMsg { req, hdr, hdr_len: TMH_LEN, data: OutData::User(data), off: 0, started: false })?;
        Ok(Some(req))
    }

    fn queue_out(&mut self, dest: usize, m: OutMsg) -> Result<()> {
        self.out[dest].push_back(m);
        self.out_pending += 1;
        self.push_out_to(dest)?;
        Ok(())
    }

    /// Starts a rendezvous send: register, then send the request; FIN completes it.
    #[cold]
    fn start_rndv(&mut self, dest: usize, tag64: u64, data: RawBuf) -> Result<ReqId> {
        self.st.stats.rndv += 1;
        let (addr, len) = (data.addr(), data.len());
        let mr = self.st.mr.get(addr, len, Access::REMOTE_READ).map_err(tmpi_transport::Error::from)?;
        let key = mr.key().map_err(tmpi_transport::Error::from)?;
        let rkey = u32::try_from(key).map_err(|_| Error::State("memory key wider than the RVH's 32-bit rkey".into()))?;
        let va = mr.remote_addr(addr).ok_or_else(|| Error::State("registration does not cover the send buffer".into()))?;
        let req = self.st.reqs.insert(Req {
            kind: ReqKind::Send(SendState {
                pushed: false,
                need_ack: true,
                acked: false,
                rndv: Some(RndvSend { buf: Some(data), _mr: mr, granted: None }),
            }),
            result: None,
            detached: false,
        });
        let hdr = RndvRequest { app_ctx: req.idx, tag: tag64, va, rkey, len: len as u64 }.encode();
        self.queue_out(dest, OutMsg { req, hdr, hdr_len: RNDV_REQ_LEN, data: OutData::Owned(Vec::new()), off: 0, started: false })?;
        Ok(req)
    }

    /// Marks a send request as pushed; returns it if it still needs waiting on.
    fn mark_pushed(&mut self, req: Option<ReqId>) -> Option<ReqId> {
        let r = req?;
        self.st.send_progress(r, true, false);
        Some(r)
    }

    /// Pushes as much as fits of the messages queued for `dest`.
    fn push_out_to(&mut self, dest: usize) -> Result<usize> {
        let mut pushed = 0;
        let maxp = self.max_packet;
        while let Some(m) = self.out[dest].front_mut() {
            let len = m.data.len();
            let total = (m.hdr_len + len) as u64;
            loop {
                let ok = if !m.started {
                    let n = len.min(maxp - m.hdr_len);
                    let flags = if n == len { PKT_WHOLE } else { PKT_FIRST };
                    let ok = self.fabric.try_send(dest, flags, total, &[&m.hdr[..m.hdr_len], m.data.slice(0, n)])?;
                    if ok {
                        m.started = true;
                        m.off = n;
                    }
                    ok
                } else {
                    let n = (len - m.off).min(maxp);
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

    fn push_out(&mut self) -> Result<usize> {
        let mut n = 0;
        for dest in 0..self.size {
            if !self.out[dest].is_empty() {
                n += self.push_out_to(dest)?;
            }
        }
        Ok(n)
    }

    /// Sends queued control packets. A packet that goes through the peer's TM-SRQ (ACK, FIN)
    /// waits while a multi-packet message to that peer is half sent: a connection delivers
    /// messages whole and in order. RMA packets bypass the TM-SRQ and go at once.
    fn flush_ctl(&mut self) -> Result<usize> {
        let mut n = 0;
        let mut i = 0;
        while i < self.st.ctlq.len() {
            let (dest, c) = self.st.ctlq[i];
            let msg = &c.bytes[..c.len as usize];
            if dest == self.st.rank {
                self.st.ctlq.remove(i);
                let p = Packet { src: dest, flags: c.flags, total_len: msg.len() as u64, data: msg };
                if !self.st.on_packet(p) {
                    return Err(Error::State("loopback control packet refused".into()));
                }
                if let Some(e) = self.st.error.take() {
                    return Err(e);
                }
            } else if c.flags & PKT_RMA == 0 && self.out[dest].front().is_some_and(|m| m.started) {
                i += 1;
                continue;
            } else if self.fabric.try_send(dest, c.flags, msg.len() as u64, &[msg])? {
                self.st.ctlq.remove(i);
            } else {
                i += 1;
                continue;
            }
            n += 1;
        }
        Ok(n)
    }

    /// Streams queued read responses into the fabric.
    fn push_rma(&mut self) -> Result<usize> {
        let mut n = 0;
        let room = self.max_packet.min(1 << 20) - RMA_RESP_HDR;
        while let Some(r) = self.st.rma_out.front_mut() {
            while r.off < r.buf.len() {
                let k = (r.buf.len() - r.off).min(room);
                let mut h = [0u8; RMA_RESP_HDR];
                h[0] = RMA_READ_RESP;
                h[4..12].copy_from_slice(&r.read);
                h[16..24].copy_from_slice(&((r.base + r.off) as u64).to_be_bytes());
                let total = (RMA_RESP_HDR + k) as u64;
                if !self.fabric.try_send(r.dest, PKT_RMA, total, &[&h, r.buf.slice(r.off, r.off + k)])? {
                    return Ok(n);
                }
                r.off += k;
                n += 1;
            }
            self.st.rma_out.pop_front();
        }
        Ok(n)
    }

    /// Copies the data of granted reads straight from the target's memory (one kernel copy).
    /// If the kernel refuses (permissions, seccomp), single copy is off for good and the read
    /// is asked again in streaming mode.
    #[cold]
    fn run_cma(&mut self) -> Result<usize> {
        let mut n = 0;
        while let Some(key) = self.st.cma_q.pop_front() {
            let Some(op) = self.st.reads.get(key) else { continue };
            let (src, rid, len, va) = (op.src, op.rid, op.split, op.info.rvh.va);
            let pid = self.fabric.peer_pid(src);
            let buf = match self.st.reqs.get(rid) {
                Some(Req { kind: ReqKind::Recv(r), .. }) => r.buf,
                _ => None,
            };
            // An abandoned receive has no buffer: nothing to copy, the send still gets its FIN.
            let r = buf.map_or(Ok(()), |b| b.fill_with(0, len, |dst| cma::read(pid, va, dst)));
            match r {
                Ok(()) => {
                    self.st.stats.cma_reads += 1;
                    self.st.stats.cma_bytes += len as u64;
                    self.st.read_progress(key, len)?;
                }
                Err(e) if e.is_unsupported() => {
                    // Ask for our share through the ring (the target's share comes its own way).
                    self.st.cma = false;
                    self.st.stats.cma_fallbacks += 1;
                    self.st.request_read(key, READ_MODE_STREAM, len);
                }
                Err(_) => {
                    if let Some(op) = self.st.reads.get_mut(key) {
                        op.failed = true;
                    }
                    self.st.read_progress(key, len)?;
                }
            }
            // A read the TM-SRQ issued completes there: collect its completion and FIN.
            self.st.drain_cq()?;
            n += 1;
        }
        Ok(n)
    }

    /// Writes this rank's shares of split single-copy reads into the readers' buffers, then
    /// tells each reader. If the kernel refuses, the share is streamed through the ring.
    #[cold]
    fn run_cma_writes(&mut self) -> Result<usize> {
        let mut n = 0;
        while let Some(w) = self.st.cma_w.pop_front() {
            let pid = self.fabric.peer_pid(w.dest);
            let whole = w.buf.slice(0, w.buf.len());
            match cma::write(pid, w.dst.wrapping_add(w.base as u64), whole) {
                Ok(()) => {
                    self.st.stats.cma_bytes += whole.len() as u64;
                    self.st.rma_notice(w.dest, RMA_WRITE_DONE, w.read);
                }
                Err(e) if e.is_unsupported() => {
                    self.st.cma = false;
                    self.st.stats.cma_fallbacks += 1;
                    self.st.rma_out.push_back(RmaOut { dest: w.dest, read: w.read, buf: w.buf, off: 0, base: w.base });
                }
                Err(_) => {
                    self.st.rma_notice(w.dest, RMA_READ_ERR, w.read);
                }
            }
            n += 1;
        }
        Ok(n)
    }

    /// One round of progress; returns how many events happened.
    #[inline]
    pub(crate) fn progress(&mut self) -> Result<usize> {
        let mut n = 0;
        if self.out_pending > 0 {
            n += self.push_out()?;
        }
        if !self.st.rma_out.is_empty() {
            n += self.push_rma()?;
        }
        if !self.st.cma_w.is_empty() {
            n += self.run_cma_writes()?;
        }
        if !self.st.cma_q.is_empty() {
            n += self.run_cma()?;
        }
        let st = &mut self.st;
        n += self.fabric.poll(|p| st.on_packet(p))?;
        if let Some(e) = self.st.error.take() {
            return Err(e);
        }
        if !self.st.ctlq.is_empty() {
            n += self.flush_ctl()?;
        }
        Ok(n)
    }

    /// Posts a receive into `buf` on context `ctx`.
    pub(crate) fn post_recv(&mut self, ctx: u32, src: Option<u32>, tag: Option<u32>, buf: RawBufMut) -> Result<ReqId> {
        let cap = buf.cap();
        let rid = self.st.reqs.insert(Req {
            kind: ReqKind::Recv(RecvState {
                buf: Some(buf),
                cap,
                matched: false,
                match_id: None,
                hw_handle: None,
                sw_only: false,
                rndv_req: None,
                read: None,
                received: 0,
                total: 0,
                source: 0,
                tag: 0,
            }),
            result: None,
            detached: false,
        });
        let (t, m) = matching::recv_key(ctx, src, tag);
        let st = &mut self.st;
        // A receive of `RVH_LEN_IN_META` bytes or more stays in software: the RVH cannot say
        // how long a message that size is, so the hardware must never serve one.
        let eligible =
            st.offload && src.is_some() && cap >= st.tm_thresh && cap < RVH_LEN_IN_META as usize && st.tm.tags_listed() < st.max_tags;
        let overlaps = eligible && st.sw_only_posted > 0 && st.matcher.earlier_posted_overlaps(t, m);
        match st.matcher.post(t, m, rid) {
            Posted::Matched(rid, ux) => {
                st.take_unexpected(rid, ux);
                self.flush_ctl()?;
            }
            Posted::Queued(id) => {
                let mut handle = None;
                if eligible && !overlaps {
                    st.op_wr += 1;
                    let wr = OpsWr::add(st.op_wr, t, m, rid_to_wr(rid), cap, st.sw_unexp, true);
                    // A full list or op queue (ENOMEM) leaves the receive to software.
                    handle = st.tm.post_srq_op(&wr).ok().flatten();
                }
                if let Some(Req { kind: ReqKind::Recv(r), .. }) = st.reqs.get_mut(rid) {
                    r.match_id = Some(id);
                    r.hw_handle = handle;
                    r.sw_only = handle.is_none();
                }
                if handle.is_none() {
                    st.sw_only_posted += 1;
                }
                st.drain_cq()?;
            }
        }
        Ok(rid)
    }

    /// The result of `rid` if it has completed (the slot is freed).
    #[inline]
    pub(crate) fn take_if_done(&mut self, rid: ReqId) -> Option<Result<Status>> {
        let done = self.st.reqs.get(rid).is_none_or(|r| r.result.is_some());
        if !done {
            return None;
        }
        match self.st.reqs.remove(rid) {
            Some(Req { result: Some(r), .. }) => Some(r),
            _ => Some(Err(Error::State("request already completed and collected".into()))),
        }
    }

    /// Whether `rid` has completed (without collecting it).
    pub(crate) fn is_done(&self, rid: ReqId) -> bool {
        self.st.reqs.get(rid).is_none_or(|r| r.result.is_some())
    }

    /// Progresses until `rid` completes.
    pub(crate) fn wait(&mut self, rid: ReqId) -> Result<Status> {
        let mut b = self.backoff();
        loop {
            if let Some(r) = self.take_if_done(rid) {
                return r;
            }
            if self.progress()? == 0 {
                self.snooze(&mut b)?;
            } else {
                b.reset();
            }
        }
    }

    /// Progresses until `done(self)` holds.
    pub(crate) fn wait_until(&mut self, mut done: impl FnMut(&mut Engine) -> bool) -> Result<()> {
        let mut b = self.backoff();
        while !done(self) {
            if self.progress()? == 0 {
                self.snooze(&mut b)?;
            } else {
                b.reset();
            }
        }
        Ok(())
    }

    /// A fresh back-off with this engine's spin budget.
    pub(crate) fn backoff(&self) -> Backoff {
        Backoff::new(self.spin)
    }

    /// Idles one step; in the slow phase also checks that peers are alive.
    pub(crate) fn snooze(&mut self, b: &mut Backoff) -> Result<()> {
        if b.snooze() {
            for peer in 0..self.size {
                if peer != self.st.rank && self.fabric.peer_failed(peer) {
                    // What the peer sent before it failed is still delivered first.
                    if self.progress()? > 0 {
                        b.reset();
                        return Ok(());
                    }
                    return Err(Error::PeerGone { rank: peer });
                }
            }
        }
        Ok(())
    }

    /// Records that this rank finalized cleanly: its departure is no failure for the others.
    pub(crate) fn mark_finalized(&self) {
        self.fabric.mark_finalized();
    }

    /// Cancels a receive that has not matched; no effect otherwise.
    pub(crate) fn cancel(&mut self, rid: ReqId) {
        let Some(req) = self.st.reqs.get_mut(rid) else {
            return;
        };
        if req.result.is_some() {
            return;
        }
        let ReqKind::Recv(r) = &mut req.kind else {
            return;
        };
        if r.matched {
            return;
        }
        let Some(id) = r.match_id.take() else { return };
        if self.st.matcher.cancel(id).is_some() {
            req.result = Some(Ok(Status { source: 0, tag: 0, len: 0, cancelled: true }));
            self.st.leave_queues(rid);
        }
        if let Err(e) = self.st.drain_cq() {
            self.st.error.get_or_insert(e);
        }
    }

    /// Forgets the user buffer of a pending operation so it may be freed (scope unwinding):
    /// a queued receive is cancelled, a receive in progress discards the rest, a queued send
    /// copies what it has not pushed yet. The slot is freed when the operation completes.
    pub(crate) fn abandon(&mut self, rid: ReqId) {
        self.cancel(rid);
        let Some(req) = self.st.reqs.get_mut(rid) else {
            return;
        };
        if req.result.is_some() {
            self.st.reqs.remove(rid);
            return;
        }
        req.detached = true;
        match &mut req.kind {
            ReqKind::Recv(r) => {
                r.buf = None;
                // The target of a single-copy read may be writing into the buffer: it must
                // stay until that write is done (or the target is gone).
                if let Some(k) = r.read {
                    if let Some(src) = self.st.reads.get(k).filter(|op| op.remote_write).map(|op| op.src) {
                        self.progress_while(src, |e| e.st.reads.get(k).is_some_and(|op| op.remote_write));
                    }
                }
            }
            ReqKind::Send(s) => {
                let granted = s.rndv.as_ref().and_then(|r| r.granted);
                // A rendezvous buffer: refuse every read of it from now on, and turn reads
                // being streamed into refusals.
                if let Some(b) = s.rndv.as_mut().and_then(|r| r.buf.take()) {
                    let (lo, hi) = (b.addr(), b.addr() + b.len());
                    let st = &mut self.st;
                    let mut i = 0;
                    while i < st.rma_out.len() {
                        let a = st.rma_out[i].buf.addr();
                        if a >= lo && a < hi.max(lo + 1) {
                            let r = st.rma_out.remove(i).expect("index in range");
                            st.rma_notice(r.dest, RMA_READ_ERR, r.read);
                        } else {
                            i += 1;
                        }
                    }
                }
                for q in &mut self.out {
                    for m in q.iter_mut().filter(|m| m.req == rid) {
                        if let OutData::User(b) = &m.data {
                            m.data = OutData::Owned(b.slice(0, b.len()).to_vec());
                        }
                    }
                }
                // A reader granted a single copy is copying the buffer now: the memory must
                // stay until its FIN (or until the reader is gone).
                if let Some(reader) = granted {
                    self.progress_while(reader, |e| e.st.reqs.get(rid).is_some_and(|r| r.result.is_none()));
                }
            }
        }
    }

    /// Makes progress while `busy` holds, `peer` lives and progress succeeds (abandon waits
    /// here for a single copy in flight to end).
    fn progress_while(&mut self, peer: usize, busy: impl Fn(&Engine) -> bool) {
        while busy(self) && !self.fabric.peer_failed(peer) && self.progress().is_ok() {
            std::thread::yield_now();
        }
    }

    /// Status of the oldest unexpected message matching, if any (no progress).
    pub(crate) fn probe_now(&self, ctx: u32, src: Option<u32>, tag: Option<u32>) -> Option<Status> {
        let (t, m) = matching::recv_key(ctx, src, tag);
        self.st.matcher.probe(t, m).map(|(tag64, &k)| {
            let len = self.st.ux.get(k).map_or(0, |u| u.total);
            Status { source: src_of(tag64), tag: tag_of(tag64), len, cancelled: false }
        })
    }

    /// Waits until every queued send has been pushed, every read served and every control
    /// message sent.
    pub(crate) fn flush(&mut self) -> Result<()> {
        self.wait_until(|e| e.out_pending == 0 && e.st.ctlq.is_empty() && e.st.rma_out.is_empty())
    }
}

/// A request handle as a verbs `recv_wr_id`.
#[inline]
fn rid_to_wr(k: ReqId) -> u64 {
    u64::from(k.gen) << 32 | u64::from(k.idx)
}

#[inline]
fn wr_to_rid(wr: u64) -> ReqId {
    Key { idx: wr as u32, gen: (wr >> 32) as u32 }
}

fn malformed(what: &'static str) -> Error {
    Error::Transport(tmpi_transport::Error::Malformed { what })
}

fn ctl_msg(kind: u8, value: u32) -> Ctl {
    let v = value.to_be_bytes();
    Ctl::new(PKT_WHOLE, &[TmOp::NoTag as u8, kind, 0, 0, v[0], v[1], v[2], v[3]])
}

fn read_id_bytes(k: Key) -> [u8; 8] {
    let mut b = [0u8; 8];
    b[..4].copy_from_slice(&k.idx.to_be_bytes());
    b[4..].copy_from_slice(&k.gen.to_be_bytes());
    b
}

fn be32(b: &[u8], at: usize) -> u32 {
    b.get(at..at + 4).map_or(0, |x| u32::from_be_bytes([x[0], x[1], x[2], x[3]]))
}

fn be64(b: &[u8], at: usize) -> u64 {
    b.get(at..at + 8).map_or(0, |x| u64::from_be_bytes([x[0], x[1], x[2], x[3], x[4], x[5], x[6], x[7]]))
}

impl State {
    /// Handles one packet from the fabric; returns whether it was consumed.
    #[inline]
    fn on_packet(&mut self, p: Packet<'_>) -> bool {
        if self.error.is_some() {
            return false;
        }
        if p.flags & PKT_RMA != 0 {
            if let Err(e) = self.on_rma(p).and_then(|()| self.drain_cq()) {
                self.error = Some(e);
            }
            return true;
        }
        if self.ux_bytes > self.ux_budget && p.flags & PKT_FIRST != 0 && self.would_be_unexpected(p.data) {
            // Flow control: over the unexpected budget, a message no posted receive wants
            // stays in the sender's ring until the program posts one.
            self.stats.flow_stalls += 1;
            return false;
        }
        let arrival = if p.flags & PKT_FIRST != 0 {
            self.tm.arrive_first(p.src as u32, p.data, p.total_len as usize)
        } else {
            self.tm.arrive_continuation(p.src as u32, p.data)
        };
        let r = match arrival {
            // No SRQ buffer posted: leave the packet in the fabric (an RNR NAK).
            Ok(Arrival::Rnr) => return false,
            Ok(Arrival::Place(pl)) => match pl.buffer {
                Buffer::Tagged { recv_wr_id, .. } => {
                    let rid = wr_to_rid(recv_wr_id);
                    if p.flags & PKT_FIRST != 0 && p.data.first() == Some(&(TmOp::Rndv as u8)) {
                        self.stash_rndv(rid, p.data);
                    }
                    self.place_tagged(rid, pl.dst_off, pl.bytes(p.data));
                    Ok(())
                }
                Buffer::Srq { .. } => self.on_software(p),
            },
            Ok(Arrival::Read(rr)) => {
                // An expected rendezvous: the TM-SRQ asks for the RDMA read it would issue,
                // described by the RVH alone.
                RndvInfo::parse(p.data).and_then(|mut info| {
                    info.key = u64::from(rr.rkey);
                    info.len = rr.len as usize;
                    self.start_read(wr_to_rid(rr.recv_wr_id), p.src, info, Some(rr.id))
                })
            }
            Err(e) => Err(Error::Transport(e.into())),
        };
        if let Err(e) = r.and_then(|()| self.drain_cq()) {
            self.error = Some(e);
        }
        true
    }

    /// Whether a data message (its first packet) would be stored as unexpected now.
    fn would_be_unexpected(&self, first: &[u8]) -> bool {
        match (first.first().copied(), first.get(8..16)) {
            (Some(op), Some(t)) if op == TmOp::Eager as u8 || op == TmOp::Rndv as u8 => {
                let tag = u64::from_be_bytes([t[0], t[1], t[2], t[3], t[4], t[5], t[6], t[7]]);
                !self.matcher.has_posted_match(tag)
            }
            _ => false,
        }
    }

    /// Self-delivery: the message passes through the TM-SRQ as two packets (header, payload).
    fn deliver_self(&mut self, hdr: &[u8; TMH_LEN], payload: &[u8]) -> Result<()> {
        let src = self.rank;
        let total = (TMH_LEN + payload.len()) as u64;
        let flags = if payload.is_empty() { PKT_WHOLE } else { PKT_FIRST };
        self.on_packet(Packet { src, flags, total_len: total, data: hdr });
        if !payload.is_empty() {
            self.on_packet(Packet { src, flags: PKT_LAST, total_len: total, data: payload });
        }
        self.error.take().map_or(Ok(()), Err)
    }

    /// Keeps a rendezvous request that the TM-SRQ placed in a tagged buffer, in case the
    /// buffer is too small (RNDV_INCOMPLETE) and software has to finish.
    fn stash_rndv(&mut self, rid: ReqId, req: &[u8]) {
        if let Some(Req { kind: ReqKind::Recv(r), .. }) = self.reqs.get_mut(rid) {
            let mut b = [0u8; 64];
            let n = req.len().min(64);
            b[..n].copy_from_slice(&req[..n]);
            r.rndv_req = Some((b, n));
        }
    }

    /// The TM-SRQ placed a packet in an SRQ buffer: software handles the message.
    fn on_software(&mut self, p: Packet<'_>) -> Result<()> {
        if p.flags & PKT_FIRST != 0 {
            match p.data.first().copied() {
                Some(op) if op == TmOp::NoTag as u8 => self.on_control(&p.data[1..]),
                Some(op) if op == TmOp::Fin as u8 => self.on_fin(p.data),
                Some(op) if op == TmOp::Rndv as u8 => self.on_rndv(p.src, p.data),
                _ => self.on_data_first(p),
            }
        } else {
            self.on_cont(p.src, p.data, p.flags & PKT_LAST != 0)
        }
    }

    /// The TM-SRQ matched a packet to a tagged buffer: the NIC's copy into the user buffer.
    fn place_tagged(&mut self, rid: ReqId, off: usize, bytes: &[u8]) {
        if let Some(Req { kind: ReqKind::Recv(r), .. }) = self.reqs.get_mut(rid) {
            if let Some(b) = &r.buf {
                b.write_at(off, bytes);
            }
        }
    }

    /// Takes a receive out of the software-only count and the tag list.
    fn leave_queues(&mut self, rid: ReqId) {
        let Some(Req { kind: ReqKind::Recv(r), .. }) = self.reqs.get_mut(rid) else {
            return;
        };
        if std::mem::take(&mut r.sw_only) {
            self.sw_only_posted -= 1;
        }
        if let Some(h) = r.hw_handle.take() {
            self.op_wr += 1;
            // The entry is still listed (a consumed entry would have completed already), so
            // the DEL succeeds; a TM_ERR completion is tolerated in `drain_cq` regardless.
            let _ = self.tm.post_srq_op(&OpsWr::del(self.op_wr, h, self.sw_unexp, true));
        }
    }

    fn repost_srq(&mut self) -> Result<()> {
        self.srq_wr += 1;
        self.tm.post_srq_recv(self.srq_wr, SRQ_BUF_LEN).map_err(|e| Error::Transport(e.into()))
    }

    /// Consumes the TM-SRQ's completions.
    fn drain_cq(&mut self) -> Result<()> {
        loop {
            while let Some(wc) = self.tm.poll_cq() {
                match wc.opcode {
                    WcOpcode::TmRecv if wc.is_unexpected() => {
                        self.sw_unexp = self.sw_unexp.wrapping_add(1);
                        if self.sw_unexp % FORCED_SYNC_EVERY == 0 || wc.flags.contains(WcFlags::TM_SYNC_REQ) {
                            self.need_sync = true;
                        }
                        self.repost_srq()?;
                    }
                    WcOpcode::TmNoTag => self.repost_srq()?,
                    WcOpcode::TmRecv => self.on_hw_completion(&wc),
                    WcOpcode::TmAdd | WcOpcode::TmDel | WcOpcode::TmSync => {
                        if wc.flags.contains(WcFlags::TM_SYNC_REQ) {
                            self.need_sync = true;
                        }
                        match wc.status {
                            WcStatus::Success => {}
                            // A DEL that raced a consumption: the receive completes on its own.
                            WcStatus::TmErr if wc.opcode == WcOpcode::TmDel => {}
                            st => return Err(Error::State(format!("TM-SRQ op failed: {st:?}"))),
                        }
                    }
                }
            }
            // Sync once software has caught up with every unexpected message the TM-SRQ
            // delivered, so that the SYNC brings the counts level.
            while let Some(t) = self.tm.poll_transmit() {
                self.ctlq.push_back((t.dst as usize, Ctl::new(PKT_WHOLE, &t.msg)));
            }
            if self.need_sync && self.tm.hw_unexpected_cnt() == self.sw_unexp as u16 {
                self.need_sync = false;
                self.stats.tm_syncs += 1;
                self.op_wr += 1;
                self.tm.post_srq_op(&OpsWr::sync(self.op_wr, self.sw_unexp, true)).map_err(|e| Error::Transport(e.into()))?;
                continue;
            }
            return Ok(());
        }
    }

    /// A tagged-buffer completion: MATCH (the receive is taken) and/or DATA_VALID (done).
    fn on_hw_completion(&mut self, wc: &Wc) {
        let rid = wr_to_rid(wc.wr_id);
        if wc.flags.contains(WcFlags::TM_MATCH) {
            let (tag64, app_ctx) = wc.read_tm_info().unwrap_or((0, 0));
            let mut cancel = None;
            if let Some(Req { kind: ReqKind::Recv(r), .. }) = self.reqs.get_mut(rid) {
                r.matched = true;
                r.hw_handle = None;
                r.source = src_of(tag64);
                r.tag = tag_of(tag64);
                cancel = r.match_id.take();
            }
            if let Some(id) = cancel {
                self.matcher.cancel(id);
            }
            self.stats.msgs_recv += 1;
            if app_ctx & SYNC_FLAG != 0 {
                self.ctlq.push_back((wc.src as usize, ctl_msg(CTL_SSEND_ACK, app_ctx & !SYNC_FLAG)));
            }
        }
        if wc.flags.contains(WcFlags::TM_DATA_VALID) && wc.status == WcStatus::TmRndvIncomplete {
            // The tagged buffer was smaller than the rendezvous: software finishes.
            let stash = match self.reqs.get_mut(rid) {
                Some(Req { kind: ReqKind::Recv(r), .. }) => r.rndv_req.take(),
                _ => None,
            };
            let r = match stash {
                Some((b, n)) => RndvInfo::parse(&b[..n]).and_then(|info| self.start_read(rid, wc.src as usize, info, None)),
                None => Err(malformed("RNDV_INCOMPLETE without the request")),
            };
            if let Err(e) = r {
                self.error.get_or_insert(e);
            }
            return;
        }
        if wc.flags.contains(WcFlags::TM_DATA_VALID) {
            let len = wc.byte_len as usize;
            self.stats.bytes_recv += len as u64;
            let Some(req) = self.reqs.get_mut(rid) else {
                return;
            };
            if let ReqKind::Recv(r) = &mut req.kind {
                r.total = len;
                r.received = len;
                req.result = Some(match wc.status {
                    WcStatus::Success => Ok(Status { source: r.source, tag: r.tag, len, cancelled: false }),
                    WcStatus::LocLenErr => Err(Error::Truncated { source_rank: r.source, tag: r.tag, len, capacity: r.cap }),
                    WcStatus::RemAccessErr => {
                        Err(Error::RemoteAccess { rank: r.source, reason: "the sender refused the rendezvous read".into() })
                    }
                    st => Err(Error::State(format!("receive from rank {} failed in the TM-SRQ: {st:?}", r.source))),
                });
            }
            if req.detached {
                self.reqs.remove(rid);
            }
        }
    }

    fn on_data_first(&mut self, p: Packet<'_>) -> Result<()> {
        if p.data.len() < TMH_LEN || (p.total_len as usize) < p.data.len() {
            return Err(malformed("data packet shorter than a TMH"));
        }
        let total = p.total_len as usize - TMH_LEN;
        self.on_first(p.src, &p.data[..TMH_LEN], &p.data[TMH_LEN..], total, p.flags & PKT_LAST != 0)
    }

    fn on_control(&mut self, body: &[u8]) -> Result<()> {
        match body {
            [CTL_SSEND_ACK, _, _, a, b, c, d] => {
                let idx = u32::from_be_bytes([*a, *b, *c, *d]);
                if let Some(k) = self.reqs.key_of(idx) {
                    self.send_progress(k, false, true);
                }
                Ok(())
            }
            _ => Err(Error::Transport(tmpi_transport::Error::Malformed { what: "unknown control message" })),
        }
    }

    /// Records push/ack progress of a send request and completes it when both are done.
    fn send_progress(&mut self, rid: ReqId, pushed: bool, acked: bool) {
        let Some(req) = self.reqs.get_mut(rid) else {
            return;
        };
        if let ReqKind::Send(s) = &mut req.kind {
            s.pushed |= pushed;
            s.acked |= acked;
            if s.pushed && (s.acked || !s.need_ack) && req.result.is_none() {
                s.rndv = None;
                req.result = Some(Ok(Status { source: 0, tag: 0, len: 0, cancelled: false }));
                if req.detached {
                    self.reqs.remove(rid);
                }
            }
        }
    }

    /// The first packet of a data message: `hdr` is its TMH, `data` the payload it carries,
    /// `total` the payload length of the whole message.
    fn on_first(&mut self, src: usize, hdr: &[u8], data: &[u8], total: usize, last: bool) -> Result<()> {
        let tmh = Tmh::decode(hdr)?;
        if tmh.op != TmOp::Eager {
            return Err(Error::Transport(tmpi_transport::Error::Malformed { what: "unsupported TMH opcode in a data packet" }));
        }
        if data.len() > total || (last && data.len() != total) {
            return Err(Error::Transport(tmpi_transport::Error::Malformed { what: "packet length disagrees with message length" }));
        }
        self.stats.msgs_recv += 1;
        self.stats.bytes_recv += total as u64;
        let ack = (tmh.app_ctx & SYNC_FLAG != 0).then_some((src, tmh.app_ctx & !SYNC_FLAG));
        let key = self.ux.vacant_key();
        match self.matcher.arrive(tmh.tag, key) {
            Arrived::Matched(_, rid, _) => {
                self.stats.sw_matched += 1;
                self.leave_queues(rid);
                if let Some((dest, idx)) = ack {
                    self.ctlq.push_back((dest, ctl_msg(CTL_SSEND_ACK, idx)));
                }
                if let Some(Req { kind: ReqKind::Recv(r), .. }) = self.reqs.get_mut(rid) {
                    r.matched = true;
                    r.match_id = None;
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
                    self.incoming[src] = Incoming::Expected { req: rid };
                }
            }
            Arrived::Unexpected => {
                self.stats.unexpected += 1;
                let mut v = Vec::with_capacity(total);
                v.extend_from_slice(data);
                self.ux_bytes += total + UX_OVERHEAD;
                self.stats.ux_peak_bytes = self.stats.ux_peak_bytes.max(self.ux_bytes as u64);
                let k = self.ux.insert(UxMsg { src_world: src, tag64: tmh.tag, total, data: v, complete: last, ack, rndv: None });
                debug_assert_eq!(k, key);
                if !last {
                    self.incoming[src] = Incoming::Unexpected { ux: k };
                }
            }
        }
        Ok(())
    }

    fn on_cont(&mut self, src: usize, data: &[u8], last: bool) -> Result<()> {
        let malformed = || Error::Transport(tmpi_transport::Error::Malformed { what: "continuation packet without a message" });
        match self.incoming.get(src).copied().ok_or_else(malformed)? {
            Incoming::Idle => return Err(malformed()),
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
                    self.incoming[src] = Incoming::Idle;
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
                    self.incoming[src] = Incoming::Idle;
                }
            }
        }
        Ok(())
    }

    /// A just-posted receive matched unexpected message `ux`.
    fn take_unexpected(&mut self, rid: ReqId, ux: Key) {
        let Some(u) = self.ux.remove(ux) else { return };
        self.ux_bytes -= if u.rndv.is_some() { UX_OVERHEAD } else { u.total + UX_OVERHEAD };
        self.stats.sw_matched += 1;
        if let Some(info) = u.rndv {
            if let Err(e) = self.start_read(rid, u.src_world, info, None) {
                self.error.get_or_insert(e);
            }
            return;
        }
        if let Some((dest, idx)) = u.ack {
            self.ctlq.push_back((dest, ctl_msg(CTL_SSEND_ACK, idx)));
        }
        if let Some(Req { kind: ReqKind::Recv(r), .. }) = self.reqs.get_mut(rid) {
            r.matched = true;
            r.match_id = None;
            r.source = src_of(u.tag64);
            r.tag = tag_of(u.tag64);
            r.total = u.total;
            if let Some(b) = &r.buf {
                b.write_at(0, &u.data);
            }
            r.received = u.data.len();
        }
        if u.complete {
            self.complete_recv(rid);
        } else {
            self.incoming[u.src_world] = Incoming::Expected { req: rid };
        }
    }

    /// A rendezvous request handled by software (unexpected in the TM-SRQ).
    fn on_rndv(&mut self, src: usize, req: &[u8]) -> Result<()> {
        let info = RndvInfo::parse(req)?;
        self.stats.msgs_recv += 1;
        self.stats.bytes_recv += info.len as u64;
        let key = self.ux.vacant_key();
        match self.matcher.arrive(info.tmh.tag, key) {
            Arrived::Matched(_, rid, _) => {
                self.stats.sw_matched += 1;
                self.leave_queues(rid);
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
    fn start_read(&mut self, rid: ReqId, src: usize, info: RndvInfo, hw: Option<ReadId>) -> Result<()> {
        let Some(Req { kind: ReqKind::Recv(r), .. }) = self.reqs.get_mut(rid) else {
            return Err(Error::State("rendezvous matched a receive that is gone".into()));
        };
        r.matched = true;
        // A receive the TM-SRQ matched is still queued in software (its MATCH completion is
        // handled after this): take it out there too, or a later message would match it.
        let queued = r.match_id.take();
        r.source = src_of(info.tmh.tag);
        r.tag = tag_of(info.tmh.tag);
        r.total = info.len;
        let cap = r.cap;
        if let Some(id) = queued {
            self.matcher.cancel(id);
        }
        let n = if hw.is_some() { info.len } else { info.len.min(cap) };
        // Single copy needs the buffer (an abandoned receive streams and discards).
        let cma = self.cma && r.buf.is_some() && n >= self.cma_min;
        let key = self.reads.insert(ReadOp { rid, src, n, got: 0, hw, info, split: n, remote_write: cma, failed: false });
        if let Some(Req { kind: ReqKind::Recv(r), .. }) = self.reqs.get_mut(rid) {
            r.read = Some(key);
        }
        if n == 0 {
            return self.finish_read(key, true);
        }
        self.request_read(key, if cma { READ_MODE_CMA } else { READ_MODE_STREAM }, n);
        Ok(())
    }

    /// Queues a 16-byte RMA notice (`kind`, read id) for `dest`: a refusal or a write done.
    fn rma_notice(&mut self, dest: usize, kind: u8, read: [u8; 8]) {
        let mut m = [0u8; 16];
        m[0] = kind;
        m[4..12].copy_from_slice(&read);
        self.ctlq.push_back((dest, Ctl::new(PKT_RMA | PKT_WHOLE, &m)));
    }

    /// `k` more bytes of read `key` are in place; completes it when all are.
    fn read_progress(&mut self, key: Key, k: usize) -> Result<()> {
        let Some(op) = self.reads.get_mut(key) else { return Ok(()) };
        op.got += k;
        if op.got >= op.n {
            let ok = !op.failed;
            self.finish_read(key, ok)?;
        }
        Ok(())
    }

    /// Sends the RDMA read request of `key` to its target: `READ_MODE_CMA` asks for a grant
    /// to copy the range ourselves, `READ_MODE_STREAM` for the data through the ring.
    /// `len` is how many bytes from the start of the range to ask for. A single-copy request
    /// also names the receive buffer, into which the target may write its share.
    fn request_read(&mut self, key: Key, mode: u8, len: usize) {
        let Some(op) = self.reads.get(key) else { return };
        let dst = match self.reqs.get(op.rid) {
            Some(Req { kind: ReqKind::Recv(RecvState { buf: Some(b), .. }), .. }) if mode == READ_MODE_CMA => b.addr() as u64,
            _ => 0,
        };
        let mut m = [0u8; 48];
        m[0] = RMA_READ_REQ;
        m[1] = mode;
        m[4..8].copy_from_slice(&op.info.tmh.app_ctx.to_be_bytes());
        m[8..16].copy_from_slice(&read_id_bytes(key));
        m[16..24].copy_from_slice(&op.info.rvh.va.to_be_bytes());
        m[24..32].copy_from_slice(&op.info.key.to_be_bytes());
        m[32..40].copy_from_slice(&(len as u64).to_be_bytes());
        m[40..48].copy_from_slice(&dst.to_be_bytes());
        self.ctlq.push_back((op.src, Ctl::new(PKT_RMA | PKT_WHOLE, &m)));
    }

    /// An RMA packet: a read request to serve, or data / a refusal for a read we issued.
    fn on_rma(&mut self, p: Packet<'_>) -> Result<()> {
        let d = p.data;
        let read = Key { idx: be32(d, 8), gen: be32(d, 12) };
        match d.first().copied() {
            Some(RMA_READ_REQ) if d.len() >= 48 => {
                let req = ReadReq { mode: d[1], sreq: be32(d, 4), va: be64(d, 16), key: be64(d, 24), len: be64(d, 32), dst: be64(d, 40) };
                self.serve_read(p.src, &d[8..16], req);
                Ok(())
            }
            Some(RMA_READ_RESP) if d.len() >= RMA_RESP_HDR => {
                let read = Key { idx: be32(d, 4), gen: be32(d, 8) };
                let off = usize::try_from(be64(d, 16)).unwrap_or(usize::MAX);
                let data = &d[RMA_RESP_HDR..];
                let op = self.reads.get_mut(read).ok_or_else(|| malformed("read response for no read"))?;
                if off.checked_add(data.len()).is_none_or(|end| end > op.n) {
                    return Err(malformed("read response outside the read"));
                }
                if let Some(Req { kind: ReqKind::Recv(r), .. }) = self.reqs.get(op.rid) {
                    if let Some(b) = &r.buf {
                        b.write_at(off, data);
                    }
                }
                self.read_progress(read, data.len())
            }
            Some(RMA_WRITE_DONE) if d.len() >= 16 => {
                let read = Key { idx: be32(d, 4), gen: be32(d, 8) };
                let op = self.reads.get(read).ok_or_else(|| malformed("write completion for no read"))?;
                let share = op.n - op.split;
                self.read_progress(read, share)
            }
            Some(RMA_READ_GRANT) if d.len() >= 24 => {
                let read = Key { idx: be32(d, 4), gen: be32(d, 8) };
                let split = usize::try_from(be64(d, 16)).unwrap_or(usize::MAX);
                let op = self.reads.get_mut(read).ok_or_else(|| malformed("read grant for no read"))?;
                if split > op.n {
                    return Err(malformed("read grant splits outside the read"));
                }
                op.split = split;
                op.remote_write = split < op.n;
                self.cma_q.push_back(read);
                Ok(())
            }
            Some(RMA_READ_ERR) if d.len() >= 16 => {
                let read = Key { idx: be32(d, 4), gen: be32(d, 8) };
                self.finish_read(read, false)
            }
            _ => {
                let _ = read;
                Err(malformed("unknown RMA packet"))
            }
        }
    }

    /// The target side of an RDMA read: key, enablement, range and access are checked in
    /// this rank's fi_mr domain before a byte moves; a refusal goes back as an error.
    ///
    /// In `READ_MODE_CMA` a passed check grants the reader a single copy of the range (it is
    /// recorded on the send, whose buffer then stays put until FIN even if abandoned); in
    /// `READ_MODE_STREAM` the range is streamed back through the ring.
    fn serve_read(&mut self, src: usize, read: &[u8], q: ReadReq) {
        let ReadReq { mode, sreq, va, key, len, dst } = q;
        let check = self.domain.check_remote(key, va, len, RemoteOp::Read);
        let buf = check.ok().and_then(|_| {
            let k = self.reqs.key_of(sreq)?;
            let Some(Req { kind: ReqKind::Send(s), result: None, .. }) = self.reqs.get(k) else { return None };
            let b = s.rndv.as_ref()?.buf?;
            let start = usize::try_from(va.checked_sub(b.addr() as u64)?).ok()?;
            let end = start.checked_add(usize::try_from(len).ok()?)?;
            (end <= b.len()).then(|| b.sub(start, end))
        });
        let mut id = [0u8; 8];
        id.copy_from_slice(read);
        match buf {
            Some(b) if mode == READ_MODE_CMA => {
                if let Some(k) = self.reqs.key_of(sreq) {
                    if let Some(Req { kind: ReqKind::Send(SendState { rndv: Some(r), .. }), .. }) = self.reqs.get_mut(k) {
                        r.granted = Some(src);
                    }
                }
                let n = b.len();
                // Split a large read: our half goes out once the grant is on its way.
                let split = if dst != 0 && n >= CMA_SPLIT_MIN { (n / 2) & !4095 } else { n };
                let mut m = [0u8; 24];
                m[0] = RMA_READ_GRANT;
                m[4..12].copy_from_slice(&id);
                m[16..24].copy_from_slice(&(split as u64).to_be_bytes());
                self.ctlq.push_back((src, Ctl::new(PKT_RMA | PKT_WHOLE, &m)));
                if split < n {
                    self.cma_w.push_back(CmaWrite { dest: src, read: id, buf: b.sub(split, n), dst, base: split });
                }
            }
            Some(b) => self.rma_out.push_back(RmaOut { dest: src, read: id, buf: b, off: 0, base: 0 }),
            None => {
                // Refused: the reader gets an error, and so does the send it was reading for
                // (no FIN will come for it).
                if let Some(k) = self.reqs.key_of(sreq) {
                    if let Some(Req { kind: ReqKind::Send(st), result: r @ None, .. }) = self.reqs.get_mut(k) {
                        if st.rndv.is_some() {
                            st.rndv = None;
                            *r = Some(Err(Error::RemoteAccess {
                                rank: src,
                                reason: format!("rank {src} asked to read a range the registration does not allow"),
                            }));
                        }
                    }
                }
                self.rma_notice(src, RMA_READ_ERR, id);
            }
        }
    }

    /// All bytes of a read are in (or it was refused): complete the receive and send FIN.
    fn finish_read(&mut self, read: Key, ok: bool) -> Result<()> {
        let Some(op) = self.reads.remove(read) else { return Ok(()) };
        if let Some(id) = op.hw {
            // The TM-SRQ completes DATA_VALID and queues the FIN itself.
            let r = if ok { self.tm.read_complete(id) } else { self.tm.read_failed(id, WcStatus::RemAccessErr) };
            return r.map_err(|e| Error::Transport(e.into()));
        }
        if ok {
            let mut fin = [0u8; TMH_LEN + RVH_LEN];
            fin[..TMH_LEN].copy_from_slice(&Tmh { op: TmOp::Fin, ..op.info.tmh }.to_bytes());
            fin[TMH_LEN..].copy_from_slice(&op.info.rvh.to_bytes());
            self.ctlq.push_back((op.src, Ctl::new(PKT_WHOLE, &fin)));
        }
        let Some(req) = self.reqs.get_mut(op.rid) else { return Ok(()) };
        if let ReqKind::Recv(r) = &req.kind {
            req.result = Some(if !ok {
                Err(Error::RemoteAccess { rank: r.source, reason: "the sender refused the rendezvous read".into() })
            } else if r.total > r.cap {
                Err(Error::Truncated { source_rank: r.source, tag: r.tag, len: r.total, capacity: r.cap })
            } else {
                Ok(Status { source: r.source, tag: r.tag, len: r.total, cancelled: false })
            });
        }
        if req.detached {
            self.reqs.remove(op.rid);
        }
        Ok(())
    }

    /// A FIN: the receiver has the data of our rendezvous send.
    fn on_fin(&mut self, msg: &[u8]) -> Result<()> {
        let tmh = Tmh::decode(msg)?;
        if let Some(k) = self.reqs.key_of(tmh.app_ctx) {
            self.send_progress(k, false, true);
        }
        Ok(())
    }

    fn complete_recv(&mut self, rid: ReqId) {
        let Some(req) = self.reqs.get_mut(rid) else {
            return;
        };
        if let ReqKind::Recv(r) = &req.kind {
            req.result = Some(if r.total > r.cap {
                Err(Error::Truncated { source_rank: r.source, tag: r.tag, len: r.total, capacity: r.cap })
            } else {
                Ok(Status { source: r.source, tag: r.tag, len: r.total, cancelled: false })
            });
        }
        if req.detached {
            self.reqs.remove(rid);
        }
    }
}

/// Idle strategy of a waiting rank: spin, then yield, then sleep in growing steps.
pub(crate) struct Backoff {
    idle: u32,
    spin: u32,
}

impl Backoff {
    pub(crate) fn new(spin: u32) -> Self {
        Backoff { idle: 0, spin }
    }

    pub(crate) fn reset(&mut self) {
        self.idle = 0;
    }

    /// Waits a little; returns true once in a while in the slow phase (time for liveness checks).
    pub(crate) fn snooze(&mut self) -> bool {
        self.idle = self.idle.saturating_add(1);
        let i = self.idle;
        if i <= self.spin {
            std::hint::spin_loop();
            false
        } else if i <= self.spin + 2000 {
            std::thread::yield_now();
            i % 256 == 0
        } else {
            let extra = (i - self.spin - 2000).min(20);
            std::thread::sleep(std::time::Duration::from_micros(20 * u64::from(extra)));
            true
        }
    }
}
