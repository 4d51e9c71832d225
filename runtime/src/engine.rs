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
use std::rc::Rc;

use tmpi_transport::fabric::{Packet, PeerState, PKT_FIRST, PKT_LAST, PKT_RMA, PKT_WHOLE};
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
/// Control message kind: acknowledgement of a synchronous send (value = the send's wire name).
const CTL_SSEND_ACK: u8 = 1;
/// Control message kind: the receiver consumed eager messages worth `value` bytes of credit.
const CTL_CREDIT: u8 = 2;
/// Control message kind: a collective failed because a rank departed (context, sequence
/// number, departed rank follow): its other members give up on it too.
const CTL_COLL_ABORT: u8 = 3;
/// Collectives whose abort notices are remembered.
const ABORTS_KEPT: usize = 64;
/// Bits of a request's slot index in its wire name; the 11 bits above carry the low bits of
/// its generation, so a stale notice never completes the request that reuses the slot.
const WIRE_IDX_BITS: u32 = 20;
const WIRE_IDX_MASK: u32 = (1 << WIRE_IDX_BITS) - 1;
const WIRE_GEN_MASK: u32 = (1 << 11) - 1;
/// Requests that can be named on the wire (synchronous and rendezvous sends) at once.
pub(crate) const MAX_NAMED_REQUESTS: usize = 1 << WIRE_IDX_BITS;
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

    /// How `rank` stands by what it recorded in the fabric: attached, finalized (it sends
    /// nothing more, and that is fine), or failed (it left without finalizing: it unwound).
    /// A process that died without a word is found by [`Fabric::process_alive`].
    fn peer_state(&self, rank: usize) -> PeerState {
        match self {
            Fabric::Shm(f) => {
                if f.peer_finalized(rank) {
                    PeerState::Finalized
                } else if f.peer_departed(rank) {
                    PeerState::Failed
                } else {
                    PeerState::Alive
                }
            }
            Fabric::Local(f) => f.peer_state(rank),
            Fabric::Single => PeerState::Alive,
        }
    }

    /// Whether `rank`'s process still runs (a system call or two: used sparingly).
    fn process_alive(&self, rank: usize) -> bool {
        match self {
            Fabric::Shm(f) => crate::sys::pid_alive(f.peer_pid(rank)),
            Fabric::Local(_) | Fabric::Single => true,
        }
    }

    /// Whether a packet from `src` waits to be read.
    fn pending_from(&mut self, src: usize) -> bool {
        match self {
            Fabric::Shm(f) => f.pending_from(src),
            Fabric::Local(f) => f.pending_from(src),
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
    /// Messages of eager size sent as rendezvous because the receiver's credit was used up
    /// (flow control).
    pub credit_rndv: u64,
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

/// Whom a receive or probe waits for, in world ranks: one rank, or any member of a
/// communicator (`None`: of the world).
#[derive(Clone, Debug)]
pub(crate) enum Peers {
    /// One world rank.
    Rank(usize),
    /// Any member of the communicator with these world ranks (`None`: the world).
    Any(Option<Rc<[usize]>>),
}

impl Peers {
    /// Whether a message whose match key names comm-local rank `local` may come from world
    /// rank `world` (the fabric's sender): a peer cannot speak for another.
    fn admits(&self, local: usize, world: usize) -> bool {
        match self {
            Peers::Rank(w) => *w == world,
            Peers::Any(None) => local == world,
            Peers::Any(Some(m)) => m.get(local) == Some(&world),
        }
    }
}

struct RecvState {
    /// `None`: the receive was abandoned mid-message; data is discarded.
    buf: Option<RawBufMut>,
    /// Whom it waits for (for `PeerGone`, and to check who sent what it matched).
    from: Peers,
    /// World rank of the sender once matched.
    src_world: usize,
    /// The posted match key (its context and collective sequence number say which collective
    /// call a receive belongs to).
    key: u64,
    /// The TM-SRQ matched it with a message whose match key names another rank than the one
    /// that sent it (a forged source): it completes with [`Error::Protocol`].
    refused: Option<usize>,
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
    /// World rank of the destination.
    dest: usize,
    /// The message's match key.
    key: u64,
    pushed: bool,
    need_ack: bool,
    acked: bool,
    /// A rendezvous send: its buffer (until abandoned) and its registration, held until FIN.
    rndv: Option<RndvSend>,
}

struct RndvSend {
    buf: Option<RawBuf>,
    /// The registration (`None` for an empty message, which has nothing to read).
    _mr: Option<CachedMr>,
    /// The match key and the RVH's address, which a FIN must repeat.
    tag64: u64,
    va: u64,
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
    /// The rest of a message that was refused (forged source, no memory): read and dropped.
    Discard,
    Expected {
        req: ReqId,
    },
    Unexpected {
        ux: Key,
    },
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
    /// Eager credit (bytes) this rank may still send to each peer before it must switch to
    /// rendezvous; refilled by the peer's `CTL_CREDIT` as it consumes what was sent.
    credits: Vec<usize>,
    /// Credit this rank owes each peer for eager messages it consumed, returned in batches.
    owed: Vec<usize>,
    /// Batch size of credit returns.
    credit_batch: usize,
    /// An error met while the engine could not report it (abandon waits): reported by the
    /// next progress.
    deferred: Option<Error>,
    /// Collective calls that failed elsewhere because a rank departed: (collective context,
    /// sequence number, departed rank), the most recent [`ABORTS_KEPT`].
    aborts: VecDeque<(u32, u32, usize)>,
}

/// Longest eager message a peer may announce: its credit never exceeds 2^31 bytes.
const MAX_EAGER_LEN: usize = 1 << 31;
/// Bookkeeping bytes counted per unexpected message on top of its payload (and charged to
/// the sender's credit with every eager message).
const UX_OVERHEAD: usize = 128;

/// Eager credit of each peer: `TMPI_UNEXPECTED_MAX` shared out over the peers (at most
/// 2^31, so a return fits its 32-bit field).
fn credit_per_peer(budget: usize, size: usize) -> usize {
    (budget / size.saturating_sub(1).max(1)).min(1 << 31)
}

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
    /// Communicator ids this rank uses (see `Comm::dup`).
    pub(crate) comm_ids: crate::comm::CommIds,
    /// Non-blocking polls since the last liveness check (see [`Engine::idle_check`]).
    idle_calls: u32,
    /// Peers whose process was found dead (sticky), and the next peer to look at.
    dead: Vec<bool>,
    next_probe: usize,
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
                credits: vec![credit_per_peer(cfg.unexpected_max, size); size],
                owed: vec![0; size],
                credit_batch: (credit_per_peer(cfg.unexpected_max, size) / 4).max(1),
                deferred: None,
                aborts: VecDeque::new(),
            },
            out: (0..size).map(|_| VecDeque::new()).collect(),
            out_pending: 0,
            max_packet,
            size,
            spin,
            cfg,
            comm_ids: crate::comm::CommIds::new(),
            idle_calls: 0,
            dead: vec![false; size],
            next_probe: 0,
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
            " mr_cache_hits={} mr_cache_misses={} mr_cache_evictions={} mr_cache_invalidations={} hw_unexpected={} tm_adds={} tm_dels={} tm_list_hwm={} credit_rndv={} ux_peak_bytes={}",
            mc.hits, mc.misses, mc.evictions, mc.invalidations, tm.unexpected, tm.adds, tm.dels, tm.list_hwm, s.credit_rndv, s.ux_peak_bytes
        ) + &format!(" cma_reads={} cma_bytes={} cma_fallbacks={}", s.cma_reads, s.cma_bytes, s.cma_fallbacks)
    }

    /// Starts a data message to `dest` (a world rank). Returns `None` when it is already
    /// complete (locally, for a standard send), or the request to wait on.
    ///
    /// An eager message costs its length plus [`UX_OVERHEAD`] of the destination's credit;
    /// without enough credit it goes as a rendezvous instead (flow control: the receiver never
    /// has to refuse what is in its ring, see [`State::give_credit`]).
    pub(crate) fn start_send(&mut self, dest: usize, tag64: u64, data: RawBuf, sync: bool) -> Result<Option<ReqId>> {
        let len = data.len();
        self.st.stats.msgs_sent += 1;
        self.st.stats.bytes_sent += len as u64;
        if dest != self.st.rank {
            let cost = len.saturating_add(UX_OVERHEAD);
            if len >= self.cfg.rndv_threshold || len > self.cfg.eager_limit || self.st.credits[dest] < cost {
                if len <= self.cfg.eager_limit && len < self.cfg.rndv_threshold {
                    self.st.stats.credit_rndv += 1;
                }
                return self.start_rndv(dest, tag64, data).map(Some);
            }
            self.st.credits[dest] -= cost;
        }
        self.st.stats.eager += 1;
        let req = if sync { Some(self.st.new_send(dest, tag64, true, None)?) } else { None };
        let app_ctx = req.map_or(0, |r| SYNC_FLAG | wire_name(r));
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
                kind: ReqKind::Send(SendState { dest, key: tag64, pushed: false, need_ack: false, acked: false, rndv: None }),
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

    /// Starts a rendezvous send: register, then send the request; FIN completes it. An empty
    /// message has nothing to register (fi_mr refuses a zero length) and nothing to read.
    #[cold]
    fn start_rndv(&mut self, dest: usize, tag64: u64, data: RawBuf) -> Result<ReqId> {
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
        let req = self.st.new_send(dest, tag64, true, Some(RndvSend { buf: Some(data), _mr: mr, tag64, va, granted: None }))?;
        let hdr = RndvRequest { app_ctx: wire_name(req), tag: tag64, va, rkey, len: len as u64 }.encode();
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
            if pid == std::process::id() {
                // Ranks that are threads of this process: no cross-process write; stream it.
                self.st.rma_out.push_back(RmaOut { dest: w.dest, read: w.read, buf: w.buf, off: 0, base: w.base });
                n += 1;
                continue;
            }
            // SAFETY: `dst` is the receive buffer the reader named in its single-copy read
            // request, and `[base, base + len)` is the share its grant left to us (checked
            // against the read's length when the grant was made). The reader keeps that
            // buffer alive and untouched until our WRITE_DONE or READ_ERR arrives, even if
            // its receive is abandoned (it waits for the share while we are alive).
            match unsafe { cma::write(pid, w.dst.wrapping_add(w.base as u64), whole) } {
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
        if let Some(e) = self.st.deferred.take() {
            return Err(e);
        }
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

    /// Posts a receive into `buf` on context `ctx`; `from` says whom it waits for in world
    /// ranks (`src` is the same source in the communicator's numbering).
    pub(crate) fn post_recv(&mut self, ctx: u32, src: Option<u32>, tag: Option<u32>, buf: RawBufMut, from: Peers) -> Result<ReqId> {
        let cap = buf.cap();
        let rid = self.st.reqs.insert(Req {
            kind: ReqKind::Recv(RecvState {
                buf: Some(buf),
                key: matching::recv_key(ctx, src, tag).0,
                from,
                src_world: 0,
                refused: None,
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

    /// Progresses until `rid` completes, or until it cannot: then [`Error::PeerGone`].
    pub(crate) fn wait(&mut self, rid: ReqId) -> Result<Status> {
        let mut b = self.backoff();
        loop {
            if let Some(r) = self.take_if_done(rid) {
                return r;
            }
            if self.progress()? == 0 {
                if b.snooze() {
                    self.check_gone(&Need::Req(rid))?;
                }
            } else {
                b.reset();
            }
        }
    }

    /// Progresses until `done(self)` holds, or until `need` cannot be met: then
    /// [`Error::PeerGone`].
    pub(crate) fn wait_until(&mut self, need: &Need, mut done: impl FnMut(&mut Engine) -> bool) -> Result<()> {
        let mut b = self.backoff();
        while !done(self) {
            if self.progress()? == 0 {
                if b.snooze() {
                    self.check_gone(need)?;
                }
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

    /// For loops that poll without blocking (`test`, `iprobe`): every so many idle calls,
    /// whether `need` can still be met.
    ///
    /// # Errors
    /// [`Error::PeerGone`] as [`Engine::check_gone`].
    pub(crate) fn idle_check(&mut self, need: &Need) -> Result<()> {
        self.idle_calls = self.idle_calls.wrapping_add(1);
        if self.idle_calls % IDLE_CHECK_EVERY == 0 {
            self.check_gone(need)?;
        }
        Ok(())
    }

    /// Whether what a waiter needs can still come: [`Error::PeerGone`] if a peer failed (the
    /// job is ending), or if every rank `need` depends on has departed (finalized or failed)
    /// and everything it sent before has been read.
    ///
    /// A departed rank's state is read before its ring: what it sent before it finalized is
    /// then visible, so it is received first.
    pub(crate) fn check_gone(&mut self, need: &Need) -> Result<()> {
        // One process per call is checked with system calls; every peer's own record in the
        // fabric is a memory read.
        let p = self.next_probe;
        self.next_probe = if p + 1 >= self.size { 0 } else { p + 1 };
        if p != self.st.rank && !self.dead[p] && !self.fabric.process_alive(p) {
            self.dead[p] = true;
        }
        let mut failed = None;
        for peer in 0..self.size {
            if peer != self.st.rank && self.state_of(peer) == PeerState::Failed {
                if self.fabric.pending_from(peer) {
                    return Ok(());
                }
                // Whatever it had half sent will never be finished.
                self.cut_off(peer)?;
                failed.get_or_insert(peer);
            }
        }
        if let Some(peer) = failed {
            return Err(Error::PeerGone { rank: peer });
        }
        let mut deps = Vec::new();
        match need {
            Need::Peers(p) => p.world_ranks(self.size, &mut deps),
            Need::Req(rid) => match self.st.reqs.get(*rid) {
                None | Some(Req { result: Some(_), .. }) => return Ok(()),
                Some(Req { kind: ReqKind::Recv(r), .. }) => {
                    if let Some(gone) = self.st.aborted(r.key) {
                        return Err(Error::PeerGone { rank: gone });
                    }
                    if r.matched {
                        deps.push(r.src_world);
                    } else {
                        r.from.world_ranks(self.size, &mut deps);
                    }
                }
                Some(Req { kind: ReqKind::Send(s), .. }) => {
                    if let Some(gone) = self.st.aborted(s.key) {
                        return Err(Error::PeerGone { rank: gone });
                    }
                    deps.push(s.dest)
                }
            },
        }
        deps.retain(|&d| d != self.st.rank);
        if deps.is_empty() {
            return Ok(());
        }
        for &d in &deps {
            if self.state_of(d) == PeerState::Alive || !self.drained(d) {
                return Ok(());
            }
        }
        Err(Error::PeerGone { rank: deps[0] })
    }

    /// How `peer` stands: its record in the fabric, or failed once its process was seen dead
    /// (a finalized rank's exit is no failure).
    fn state_of(&self, peer: usize) -> PeerState {
        match self.fabric.peer_state(peer) {
            PeerState::Alive if self.dead[peer] => PeerState::Failed,
            s => s,
        }
    }

    /// A failed `peer` was in the middle of a message: the TM-SRQ completes it as flushed, and
    /// a receive it was filling fails with [`Error::PeerGone`].
    fn cut_off(&mut self, peer: usize) -> Result<()> {
        let Some(inc) = self.st.incoming.get(peer).copied() else { return Ok(()) };
        if matches!(inc, Incoming::Idle) && !self.st.tm.abort_message(peer as u32) {
            return Ok(());
        }
        if !matches!(inc, Incoming::Idle) {
            self.st.tm.abort_message(peer as u32);
        }
        self.st.incoming[peer] = Incoming::Idle;
        match inc {
            Incoming::Expected { req } => self.st.fail_recv(req, Error::PeerGone { rank: peer }),
            // A partial unexpected message stays queued: a receive that takes it waits for
            // the rest, and fails here in turn.
            Incoming::Unexpected { .. } | Incoming::Idle | Incoming::Discard => {}
        }
        self.st.drain_cq()
    }

    /// Nothing from `peer` waits to be read, nor is a message from it half read.
    fn drained(&mut self, peer: usize) -> bool {
        !self.fabric.pending_from(peer) && matches!(self.st.incoming.get(peer), Some(Incoming::Idle) | None)
    }

    /// Hands over this rank's own outgoing data, then records that it finalized: queued
    /// messages and control packets are pushed, reads it serves are streamed, and rendezvous
    /// reads it is making finish (so their senders get their FIN). It never waits for what
    /// other ranks do: work for a peer that has departed is dropped.
    ///
    /// # Errors
    /// A failure of progress (a peer that broke the protocol); the rank is then not marked
    /// finalized, so its exit reads as a failure.
    pub(crate) fn finalize(&mut self) -> Result<()> {
        let mut b = self.backoff();
        loop {
            let busy = self.out_pending > 0
                || !self.st.ctlq.is_empty()
                || !self.st.rma_out.is_empty()
                || !self.st.cma_w.is_empty()
                || !self.st.cma_q.is_empty()
                || !self.st.reads.is_empty();
            if !busy {
                break;
            }
            if self.progress()? == 0 {
                if b.snooze() {
                    self.drop_work_for_departed();
                }
            } else {
                b.reset();
            }
        }
        self.fabric.mark_finalized();
        Ok(())
    }

    /// Drops queued work whose peer has departed (finalize waits for nothing from them).
    fn drop_work_for_departed(&mut self) {
        for peer in 0..self.size {
            if peer == self.st.rank {
                continue;
            }
            if !self.dead[peer] && self.fabric.peer_state(peer) == PeerState::Alive && !self.fabric.process_alive(peer) {
                self.dead[peer] = true;
            }
            if self.state_of(peer) == PeerState::Alive {
                continue;
            }
            let dropped = self.out[peer].len();
            self.out[peer].clear();
            self.out_pending -= dropped;
            self.st.ctlq.retain(|(d, _)| *d != peer);
            self.st.rma_out.retain(|r| r.dest != peer);
            self.st.cma_w.retain(|w| w.dest != peer);
            let gone: Vec<Key> = self.st.reads.keys().filter(|&k| self.st.reads.get(k).is_some_and(|op| op.src == peer)).collect();
            for k in gone {
                self.st.reads.remove(k);
            }
        }
        self.st.cma_q.retain(|k| self.st.reads.get(*k).is_some());
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

    /// Forgets the user buffer of a pending operation so it may be freed (scope unwinding, or
    /// a wait that failed): a queued receive is cancelled, a receive in progress discards the
    /// rest, a queued send copies what it has not pushed yet. The slot is freed when the
    /// operation completes.
    ///
    /// Memory a peer may still touch is waited for before this returns: a receive buffer the
    /// target of a single-copy read may be writing into, and a send buffer a reader was
    /// granted a single copy of. The wait ends only when the copy is done or the peer has
    /// departed (then it can touch nothing more); errors met meanwhile are kept for the next
    /// progress, never cut the wait short.
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
                let range = s.rndv.as_ref().and_then(|r| r.buf).map(|b| (b.addr(), b.addr() + b.len()));
                // Queued data is copied: the message still goes out whole.
                for q in &mut self.out {
                    for m in q.iter_mut().filter(|m| m.req == rid) {
                        if let OutData::User(b) = &m.data {
                            m.data = OutData::Owned(b.slice(0, b.len()).to_vec());
                        }
                    }
                }
                // A reader granted a single copy is copying the buffer now, and this rank may
                // owe it a share (`cma_w`, written during the wait): the memory must stay
                // until its FIN (or until the reader is gone).
                if let Some(reader) = granted {
                    self.progress_while(reader, |e| e.st.reqs.get(rid).is_some_and(|r| r.result.is_none()));
                }
                // From now on every read of the buffer is refused, and reads being served
                // from it stop.
                if let Some((lo, hi)) = range {
                    if let Some(Req { kind: ReqKind::Send(SendState { rndv: Some(r), .. }), .. }) = self.st.reqs.get_mut(rid) {
                        r.buf = None;
                    }
                    let inside = |a: usize| a >= lo && a < hi.max(lo + 1);
                    let st = &mut self.st;
                    let mut refused = Vec::new();
                    st.rma_out.retain(|r| {
                        let keep = !inside(r.buf.addr());
                        if !keep {
                            refused.push((r.dest, r.read));
                        }
                        keep
                    });
                    st.cma_w.retain(|w| {
                        let keep = !inside(w.buf.addr());
                        if !keep {
                            refused.push((w.dest, w.read));
                        }
                        keep
                    });
                    for (dest, read) in refused {
                        st.rma_notice(dest, RMA_READ_ERR, read);
                    }
                }
            }
        }
    }

    /// Makes progress while `busy` holds and `peer` has not departed (abandon waits here for a
    /// single copy in flight to end). Errors are kept for the next progress.
    fn progress_while(&mut self, peer: usize, busy: impl Fn(&Engine) -> bool) {
        let mut b = self.backoff();
        while busy(self) {
            match self.progress() {
                Ok(0) => {
                    if b.snooze() {
                        if !self.dead[peer] && !self.fabric.process_alive(peer) {
                            self.dead[peer] = true;
                        }
                        if self.state_of(peer) != PeerState::Alive {
                            return;
                        }
                    }
                }
                Ok(_) => b.reset(),
                Err(e) => {
                    self.st.deferred.get_or_insert(e);
                }
            }
        }
    }

    /// A collective call (context `ctx`, sequence number `seq`) failed here because world rank
    /// `gone` departed: tells the call's other members (world ranks `members`), so that those
    /// waiting on this rank rather than on the departed one give up too, instead of waiting
    /// for messages this rank will not send.
    pub(crate) fn abort_collective(&mut self, ctx: u32, seq: u32, gone: usize, members: impl Iterator<Item = usize>) {
        let mut m = [0u8; 16];
        m[0] = TmOp::NoTag as u8;
        m[1] = CTL_COLL_ABORT;
        m[4..8].copy_from_slice(&ctx.to_be_bytes());
        m[8..12].copy_from_slice(&seq.to_be_bytes());
        m[12..16].copy_from_slice(&(gone as u32).to_be_bytes());
        for w in members {
            if w != self.st.rank && w != gone && self.state_of(w) == PeerState::Alive {
                self.st.ctlq.push_back((w, Ctl::new(PKT_WHOLE, &m)));
            }
        }
        // Best effort: the notices go out with this and later progress.
        if let Err(e) = self.flush_ctl() {
            self.st.deferred.get_or_insert(e);
        }
    }

    /// Test hook: puts `bytes` on the wire to world rank `dest` as one raw packet (waiting for
    /// ring space), so tests can play a peer that breaks the protocol.
    pub(crate) fn inject(&mut self, dest: usize, flags: u8, total_len: u64, bytes: &[u8]) -> Result<()> {
        if dest == self.st.rank || dest >= self.size {
            return Err(Error::InvalidRank { rank: dest, size: self.size });
        }
        let mut b = self.backoff();
        while !self.fabric.try_send(dest, flags, total_len, &[bytes])? {
            self.progress()?;
            if b.snooze() {
                self.check_gone(&Need::Peers(Peers::Rank(dest)))?;
            }
        }
        Ok(())
    }

    /// Status of the oldest unexpected message matching, if any (no progress).
    pub(crate) fn probe_now(&self, ctx: u32, src: Option<u32>, tag: Option<u32>) -> Option<Status> {
        let (t, m) = matching::recv_key(ctx, src, tag);
        self.st.matcher.probe(t, m).map(|(tag64, &k)| {
            let len = self.st.ux.get(k).map_or(0, |u| u.total);
            Status { source: src_of(tag64), tag: tag_of(tag64), len, cancelled: false }
        })
    }
}

/// What a waiting call depends on, for deciding when to give up with [`Error::PeerGone`].
pub(crate) enum Need {
    /// A message from these peers (a probe).
    Peers(Peers),
    /// The completion of a request.
    Req(ReqId),
}

impl Peers {
    /// Appends the world ranks a message may come from.
    fn world_ranks(&self, size: usize, out: &mut Vec<usize>) {
        match self {
            Peers::Rank(w) => out.push(*w),
            Peers::Any(None) => out.extend(0..size),
            Peers::Any(Some(m)) => out.extend(m.iter().copied()),
        }
    }
}

/// `test`/`iprobe` calls between two liveness checks.
const IDLE_CHECK_EVERY: u32 = 4096;

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

/// A packet from `src` that breaks the protocol.
#[cold]
fn malformed_from(src: usize, what: &'static str) -> Error {
    Error::Protocol { rank: src, what }
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

/// How a request is named on the wire (in `app_ctx`, ACKs and read requests): its slot index
/// and the low bits of its generation.
#[inline]
fn wire_name(k: ReqId) -> u32 {
    (k.gen & WIRE_GEN_MASK) << WIRE_IDX_BITS | (k.idx & WIRE_IDX_MASK)
}

impl State {
    /// Inserts a send request to world rank `dest`. A request that needs an answer (ACK or
    /// FIN) is named on the wire, which bounds how many can be outstanding.
    fn new_send(&mut self, dest: usize, key: u64, need_ack: bool, rndv: Option<RndvSend>) -> Result<ReqId> {
        if need_ack && self.reqs.vacant_key().idx as usize >= MAX_NAMED_REQUESTS {
            return Err(Error::State(format!(
                "more than {MAX_NAMED_REQUESTS} synchronous or rendezvous sends outstanding: complete some before starting more"
            )));
        }
        Ok(self.reqs.insert(Req {
            kind: ReqKind::Send(SendState { dest, key, pushed: false, need_ack, acked: false, rndv }),
            result: None,
            detached: false,
        }))
    }

    /// The send request a peer names on the wire, if it is still the one named (index and
    /// generation) and is a send to that peer.
    fn named_send(&self, name: u32, peer: usize) -> Option<ReqId> {
        let k = self.reqs.key_of(name & WIRE_IDX_MASK)?;
        if k.gen & WIRE_GEN_MASK != (name >> WIRE_IDX_BITS) & WIRE_GEN_MASK {
            return None;
        }
        match self.reqs.get(k) {
            Some(Req { kind: ReqKind::Send(s), .. }) if s.dest == peer => Some(k),
            _ => None,
        }
    }

    /// Whether the collective call that match key `key` belongs to was aborted elsewhere
    /// (see [`Engine::abort_collective`]); the departed rank if so.
    fn aborted(&self, key: u64) -> Option<usize> {
        if self.aborts.is_empty() {
            return None;
        }
        let ctx = (key >> matching::CTX_SHIFT) as u32;
        let seq = (key as u32 & matching::MAX_TAG) >> 8;
        self.aborts.iter().find(|a| a.0 == ctx && a.1 == seq).map(|a| a.2)
    }

    /// This rank consumed an eager message of `len` payload bytes from `src`: the credit it
    /// cost the sender goes back, in batches of `credit_batch` bytes.
    #[inline]
    fn give_credit(&mut self, src: usize, len: usize) {
        if src == self.rank {
            return;
        }
        let Some(o) = self.owed.get_mut(src) else { return };
        *o = o.saturating_add(len.saturating_add(UX_OVERHEAD));
        if *o >= self.credit_batch {
            let v = u32::try_from(*o).unwrap_or(u32::MAX);
            *o -= v as usize;
            self.ctlq.push_back((src, ctl_msg(CTL_CREDIT, v)));
        }
    }

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
        if p.flags & PKT_FIRST != 0 && p.src != self.rank {
            // The announced length must fit the packet: a whole message is exactly its packet,
            // a first packet announces more (never more than an eager message may carry). A
            // packet that breaks this is refused before the TM-SRQ sees it, so the stream
            // from that peer stays in step.
            let (len, total) = (p.data.len() as u64, p.total_len);
            let whole = p.flags & PKT_LAST != 0;
            if (whole && total != len) || (!whole && (total <= len || total > (MAX_EAGER_LEN + TMH_LEN) as u64)) {
                self.error = Some(malformed_from(p.src, "a packet whose length disagrees with its message"));
                return true;
            }
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
                    if p.flags & PKT_FIRST != 0 {
                        match p.data.first() {
                            Some(&op) if op == TmOp::Rndv as u8 => self.stash_rndv(rid, p.data),
                            // An expected eager message: consumed, its credit goes back.
                            _ => self.give_credit(p.src, (p.total_len as usize).saturating_sub(TMH_LEN)),
                        }
                        // A message under another rank's name writes nothing (it completes
                        // with an error, see `on_hw_completion`).
                        let tag64 = Tmh::decode(p.data).map_or(0, |t| t.tag);
                        if !self.admits(rid, tag64, p.src) {
                            if let Some(Req { kind: ReqKind::Recv(r), .. }) = self.reqs.get_mut(rid) {
                                r.refused = Some(p.src);
                            }
                        }
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
                    let rid = wr_to_rid(rr.recv_wr_id);
                    if !self.admits(rid, info.tmh.tag, p.src) {
                        // A forged source: no byte is read; the receive fails at DATA_VALID.
                        if let Some(Req { kind: ReqKind::Recv(r), .. }) = self.reqs.get_mut(rid) {
                            r.refused = Some(p.src);
                        }
                        return self.tm.read_failed(rr.id, WcStatus::RemAccessErr).map_err(|e| Error::Transport(e.into()));
                    }
                    self.start_read(rid, p.src, info, Some(rr.id))
                })
            }
            Err(e) => Err(Error::Transport(e.into())),
        };
        if let Err(e) = r.and_then(|()| self.drain_cq()) {
            self.error = Some(e);
        }
        true
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
                Some(op) if op == TmOp::NoTag as u8 => self.on_control(p.src, &p.data[1..]),
                Some(op) if op == TmOp::Fin as u8 => self.on_fin(p.src, p.data),
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
            if let Some(b) = r.buf.as_ref().filter(|_| r.refused.is_none()) {
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
            let src = wc.src as usize;
            let admitted = self.admits(rid, tag64, src);
            if let Some(Req { kind: ReqKind::Recv(r), .. }) = self.reqs.get_mut(rid) {
                r.matched = true;
                r.hw_handle = None;
                r.src_world = src;
                if !admitted {
                    r.refused = Some(src);
                }
                r.source = src_of(tag64);
                r.tag = tag_of(tag64);
                cancel = r.match_id.take();
            }
            if let Some(id) = cancel {
                self.matcher.cancel(id);
            }
            self.stats.msgs_recv += 1;
            if app_ctx & SYNC_FLAG != 0 && admitted {
                self.ctlq.push_back((wc.src as usize, ctl_msg(CTL_SSEND_ACK, app_ctx & !SYNC_FLAG)));
            }
        }
        if wc.flags.contains(WcFlags::TM_DATA_VALID) && wc.status == WcStatus::TmRndvIncomplete {
            // The tagged buffer was smaller than the rendezvous: software finishes.
            let (stash, refused) = match self.reqs.get_mut(rid) {
                Some(Req { kind: ReqKind::Recv(r), .. }) => (r.rndv_req.take(), r.refused),
                _ => (None, None),
            };
            if let Some(src) = refused {
                self.fail_recv(rid, malformed_from(src, "a message under another rank's name"));
                return;
            }
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
                    _ if r.refused.is_some() => Err(malformed_from(r.src_world, "a message under another rank's name")),
                    WcStatus::Success => Ok(Status { source: r.source, tag: r.tag, len, cancelled: false }),
                    WcStatus::LocLenErr => Err(Error::Truncated { source_rank: r.source, tag: r.tag, len, capacity: r.cap }),
                    WcStatus::WrFlushErr => Err(Error::PeerGone { rank: r.src_world }),
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

    fn on_control(&mut self, src: usize, body: &[u8]) -> Result<()> {
        match body {
            [CTL_SSEND_ACK, _, _, a, b, c, d] => {
                let name = u32::from_be_bytes([*a, *b, *c, *d]);
                let k = self.named_send(name, src).ok_or_else(|| malformed_from(src, "acknowledgement of no synchronous send"))?;
                self.send_progress(k, false, true);
                Ok(())
            }
            [CTL_COLL_ABORT, _, _, c0, c1, c2, c3, s0, s1, s2, s3, g0, g1, g2, g3] => {
                let ctx = u32::from_be_bytes([*c0, *c1, *c2, *c3]);
                let seq = u32::from_be_bytes([*s0, *s1, *s2, *s3]);
                let gone = u32::from_be_bytes([*g0, *g1, *g2, *g3]) as usize;
                if self.aborts.len() >= ABORTS_KEPT {
                    self.aborts.pop_front();
                }
                self.aborts.push_back((ctx, seq, gone));
                Ok(())
            }
            [CTL_CREDIT, _, _, a, b, c, d] => {
                let v = u32::from_be_bytes([*a, *b, *c, *d]) as usize;
                if let Some(c) = self.credits.get_mut(src) {
                    *c = c.saturating_add(v);
                }
                Ok(())
            }
            _ => Err(malformed_from(src, "unknown control message")),
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
                self.leave_queues(rid);
                self.give_credit(src, total);
                if !self.admits(rid, tmh.tag, src) {
                    self.fail_recv(rid, malformed_from(src, "a message under another rank's name"));
                    if !last {
                        self.incoming[src] = Incoming::Discard;
                    }
                    return Ok(());
                }
                if let Some((dest, idx)) = ack {
                    self.ctlq.push_back((dest, ctl_msg(CTL_SSEND_ACK, idx)));
                }
                if let Some(Req { kind: ReqKind::Recv(r), .. }) = self.reqs.get_mut(rid) {
                    r.matched = true;
                    r.match_id = None;
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
                    self.incoming[src] = Incoming::Expected { req: rid };
                }
            }
            Arrived::Unexpected => {
                self.stats.unexpected += 1;
                let mut v = Vec::new();
                if v.try_reserve_exact(total).is_err() {
                    if !last {
                        self.incoming[src] = Incoming::Discard;
                    }
                    return Err(Error::NoMemory { bytes: total, rank: src });
                }
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
            Incoming::Discard => {
                if last {
                    self.incoming[src] = Incoming::Idle;
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
        if u.rndv.is_none() {
            self.give_credit(u.src_world, u.total);
        }
        if !self.admits(rid, u.tag64, u.src_world) {
            self.fail_recv(rid, malformed_from(u.src_world, "a message under another rank's name"));
            if !u.complete {
                self.incoming[u.src_world] = Incoming::Discard;
            }
            return;
        }
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
            r.src_world = u.src_world;
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
    fn start_read(&mut self, rid: ReqId, src: usize, info: RndvInfo, hw: Option<ReadId>) -> Result<()> {
        let Some(Req { kind: ReqKind::Recv(r), .. }) = self.reqs.get_mut(rid) else {
            return Err(Error::State("rendezvous matched a receive that is gone".into()));
        };
        r.matched = true;
        r.src_world = src;
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
        let sk = self.named_send(sreq, src);
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
        let mut id = [0u8; 8];
        id.copy_from_slice(read);
        match buf {
            Some(b) if mode == READ_MODE_CMA => {
                if let Some(Req { kind: ReqKind::Send(SendState { rndv: Some(r), .. }), .. }) = sk.and_then(|k| self.reqs.get_mut(k)) {
                    r.granted = Some(src);
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
                if let Some(k) = sk {
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

    /// A FIN: the receiver has the data of our rendezvous send. It must name a rendezvous
    /// send to that peer and repeat its match key and RVH address.
    fn on_fin(&mut self, src: usize, msg: &[u8]) -> Result<()> {
        let tmh = Tmh::decode(msg)?;
        let rvh = Rvh::decode(msg.get(TMH_LEN..).unwrap_or(&[]))?;
        let k = self.named_send(tmh.app_ctx, src).filter(|&k| {
            matches!(self.reqs.get(k), Some(Req { kind: ReqKind::Send(SendState { rndv: Some(r), .. }), .. })
                if r.tag64 == tmh.tag && r.va == rvh.va)
        });
        let k = k.ok_or_else(|| malformed_from(src, "FIN for no rendezvous send"))?;
        self.send_progress(k, false, true);
        Ok(())
    }

    /// Whether receive `rid` may take a message with match key `tag64` from world rank `src`.
    fn admits(&self, rid: ReqId, tag64: u64, src: usize) -> bool {
        match self.reqs.get(rid) {
            Some(Req { kind: ReqKind::Recv(r), .. }) => r.from.admits(src_of(tag64), src),
            _ => true,
        }
    }

    /// Completes receive `rid` with `err` (it matched, so it leaves every queue).
    fn fail_recv(&mut self, rid: ReqId, err: Error) {
        let Some(req) = self.reqs.get_mut(rid) else { return };
        if let ReqKind::Recv(r) = &mut req.kind {
            r.matched = true;
            r.match_id = None;
        }
        if req.result.is_none() {
            req.result = Some(Err(err));
        }
        if req.detached {
            self.reqs.remove(rid);
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The README promises a pending request costs at most 320 bytes of engine memory.
    #[test]
    fn request_slot_size() {
        assert!(std::mem::size_of::<Req>() <= 320, "{}", std::mem::size_of::<Req>());
    }

    #[test]
    fn wire_names_carry_the_generation() {
        let k = Key { idx: 5, gen: 3 };
        let n = wire_name(k);
        assert_eq!(n & WIRE_IDX_MASK, 5);
        assert_eq!(n >> WIRE_IDX_BITS, 3);
        assert_eq!(n & SYNC_FLAG, 0);
        let k2 = Key { idx: WIRE_IDX_MASK, gen: u32::MAX };
        assert_eq!(wire_name(k2) & SYNC_FLAG, 0);
    }

    #[test]
    fn credit_is_shared_out() {
        assert_eq!(credit_per_peer(64 << 20, 2), 64 << 20);
        assert_eq!(credit_per_peer(64 << 20, 5), 16 << 20);
        assert_eq!(credit_per_peer(1 << 40, 2), 1 << 31);
        assert_eq!(credit_per_peer(4096, 1), 4096);
    }

    #[test]
    fn peers_admit_only_their_own_rank() {
        assert!(Peers::Rank(3).admits(0, 3));
        assert!(!Peers::Rank(3).admits(3, 2));
        assert!(Peers::Any(None).admits(2, 2));
        assert!(!Peers::Any(None).admits(1, 2));
        let m: Rc<[usize]> = vec![4, 7].into();
        assert!(Peers::Any(Some(m.clone())).admits(1, 7));
        assert!(!Peers::Any(Some(m.clone())).admits(1, 4));
        assert!(!Peers::Any(Some(m)).admits(2, 4));
    }
}
