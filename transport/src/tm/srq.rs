//! The TM-SRQ state machine: verbs in, completions / placements / reads / FINs out.

use std::collections::VecDeque;

use super::caps::{TmCap, TmCaps};
use super::cq::{Wc, WcFlags, WcOpcode, WcStatus};
use super::list::{SlotState, TagList, NIL};
use super::ops::{OpsFlags, OpsOp, OpsWr};
use super::TmErrno;
use crate::wire::{Fin, Rvh, TmOp, Tmh, RVH_LEN, TMH_LEN};

pub use crate::wire::{RndvRequest, FIN_LEN, RNDV_FLAG_PREGRANTED, RNDV_META_LEN, RNDV_REQ_LEN, RVH_LEN_IN_META};

/// Largest tagged-buffer length an ADD accepts: `u32::MAX - 1`. A tagged buffer is one
/// `ibv_sge`, whose `length` is 32 bits, and the RVH's `len` is 32 bits too: a buffer of
/// [`RVH_LEN_IN_META`] (`u32::MAX`) bytes would take an expected request that says "the length
/// is in the meta-data" as a read of exactly `u32::MAX` bytes, cutting a payload of 4 GiB or
/// more short. So no tagged buffer reaches that length, and such a request always ends in
/// software (`TM_RNDV_INCOMPLETE`).
pub const MAX_TAGGED_LEN: usize = RVH_LEN_IN_META as usize - 1;

/// Unexpected receives polled beyond software's last reported count after which every further
/// unexpected completion carries `TM_SYNC_REQ` (mlx5's `MLX5_TM_MAX_SYNC_DIFF`).
pub const MAX_SYNC_DIFF: u16 = 0x3fff;

/// Which buffer a [`Placement`] writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Buffer {
    /// A tagged buffer of the matching list.
    Tagged {
        /// Its `recv_wr_id`.
        recv_wr_id: u64,
        /// Its handle.
        handle: u32,
    },
    /// An untagged SRQ buffer.
    Srq {
        /// Its `wr_id`.
        wr_id: u64,
    },
}

/// "Copy `packet[src_off..src_off + len]` to `buffer` at `dst_off`": the data movement the
/// NIC would do, left to the caller. `len` is already clipped to the buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placement {
    /// Destination buffer.
    pub buffer: Buffer,
    /// Offset in the packet handed to `arrive*`.
    pub src_off: usize,
    /// Offset in the destination buffer.
    pub dst_off: usize,
    /// Bytes to copy (may be 0).
    pub len: usize,
}

impl Placement {
    /// The bytes to copy, taken from the packet this placement was computed for (empty if
    /// given another, shorter packet).
    #[inline]
    pub fn bytes<'a>(&self, packet: &'a [u8]) -> &'a [u8] {
        packet.get(self.src_off..self.src_off.saturating_add(self.len)).unwrap_or(&[])
    }
}

/// What [`TmSrq::arrive_whole_polled`] did with a whole eager message: each variant carries
/// the completion that [`TmSrq::poll_cq`] would have returned next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Polled {
    /// It matched a tagged buffer: copy as the placement says; the completion is its MATCH
    /// and DATA_VALID.
    Matched(Placement, Wc),
    /// It matched nothing and landed, whole, in the oldest SRQ buffer (the completion's
    /// `wr_id`), counted unexpected.
    Unexpected(Wc),
}

/// Identifies a requested rendezvous read when reporting its outcome. Stale ids (of an entry
/// since freed and re-added) are rejected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ReadId {
    handle: u32,
    gen: u32,
}

/// "RDMA-read `len` bytes at `va` with `rkey` from `src` into tagged buffer `recv_wr_id`":
/// an expected rendezvous request the hardware would serve itself, described by the RVH
/// alone (nothing after the RVH changes it). Report the outcome with
/// [`TmSrq::read_complete`] or [`TmSrq::read_failed`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadRequest {
    /// Pass back to `read_complete` / `read_failed`.
    pub id: ReadId,
    /// The sender (target of the read).
    pub src: u32,
    /// Remote address, from the RVH.
    pub va: u64,
    /// Remote key, from the RVH (the target checks it before any byte moves).
    pub rkey: u32,
    /// Bytes to read, from the RVH.
    pub len: u32,
    /// The tagged buffer to read into (at offset 0).
    pub recv_wr_id: u64,
    /// Its handle.
    pub handle: u32,
}

/// What the caller must do with an arriving packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arrival {
    /// Receiver not ready: the message needed an SRQ buffer and none is posted. Nothing
    /// changed (not even the unexpected count); this is back-pressure, as an RC NAK would
    /// be: post SRQ buffers and offer the same message again.
    Rnr,
    /// Copy bytes of the packet into a buffer. Any completion is already queued.
    Place(Placement),
    /// Start an RDMA read (expected rendezvous); the MATCH completion is already queued.
    Read(ReadRequest),
}

/// A message the SRQ sends: the FIN of a rendezvous it completed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transmit {
    /// Where to send it (the `src` the request came from).
    pub dst: u32,
    /// TMH (opcode FIN, tag and app_ctx of the request) and the request's RVH.
    pub msg: [u8; FIN_LEN],
}

/// What the model counted (all monotonic).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TmCounters {
    /// Tagged messages matched by the hardware list.
    pub hw_matched: u64,
    /// Tagged messages delivered unexpected (to SRQ buffers).
    pub unexpected: u64,
    /// NO_TAG and FIN messages delivered to SRQ buffers.
    pub no_tag: u64,
    /// Arrivals refused for lack of an SRQ buffer.
    pub rnr: u64,
    /// TAG_ADD ops executed.
    pub adds: u64,
    /// TAG_DEL ops that removed an entry.
    pub dels: u64,
    /// TAG_DEL ops that failed (`TM_ERR`).
    pub del_failed: u64,
    /// TAG_SYNC ops executed.
    pub syncs: u64,
    /// Level ops that re-enabled matching of entries added out of phase.
    pub resyncs: u64,
    /// Rendezvous reads requested.
    pub rndv_reads: u64,
    /// Rendezvous reads reported failed.
    pub read_failures: u64,
    /// Rendezvous requests completed `TM_RNDV_INCOMPLETE`.
    pub rndv_incomplete: u64,
    /// Largest number of entries in the list at once.
    pub list_hwm: u64,
}

/// [`CqEntry::op_seq`] of a completion that is not an op's.
const NO_OP: u64 = u64::MAX;

/// An empty queue of `cap` entries whose memory is written now. A queue cycles through its
/// whole capacity before it wraps, so untouched memory would page-fault a page at a time
/// over its first lap: about 75 faults in the first few thousand messages at the default
/// caps, 2-3% of the time of an `osu_latency` 16 KiB run of OSU's default 1000 iterations.
fn touched<T>(cap: usize) -> VecDeque<T> {
    let mut v = Vec::with_capacity(cap);
    // Opaque, so that the compiler cannot fold allocation and zeroing into `calloc` (whose
    // large blocks are fresh pages, left untouched).
    std::hint::black_box(v.spare_capacity_mut()).fill_with(std::mem::MaybeUninit::zeroed);
    // O(1), the buffer kept (std's guarantee for this conversion).
    VecDeque::from(v)
}

/// A queued completion plus what polling it releases (64 bytes).
#[derive(Debug, Clone, Copy)]
struct CqEntry {
    wc: Wc,
    /// Handle whose holder this completion is, or [`NIL`].
    release: u32,
    /// Sequence number of the op this completes (reclaims its and earlier op slots), or
    /// [`NO_OP`].
    op_seq: u64,
    /// An unexpected tagged receive (counts toward the `TM_SYNC_REQ` threshold).
    unexpected: bool,
    /// The completion of a multi-packet unexpected message whose last packet has not arrived:
    /// its place in the queue is taken (the hardware decided when the first packet came), but
    /// it cannot be polled yet, and no match or unexpected completion queued after it may be
    /// polled before it.
    pending: bool,
}

impl CqEntry {
    /// Whether this completion keeps its place behind a pending unexpected completion: every
    /// `TmRecv` (matches, unexpected receives, and the DATA_VALID completions, which must not
    /// pass their own MATCH). Op and NO_TAG completions may pass it.
    #[inline]
    fn ordered(&self) -> bool {
        self.wc.opcode == WcOpcode::TmRecv
    }
}

/// What every op of one [`TmSrq::post_op`] call carries to the helper of its kind.
#[derive(Clone, Copy)]
struct OpPost {
    /// The op's completion as far as it is common to every kind (`TmSync`, success, the
    /// phase's `TM_SYNC_REQ`).
    wc: Wc,
    /// The op's sequence number (see [`CqEntry::op_seq`]).
    seq: u64,
    /// The op asked for a completion (`SIGNALED`).
    signaled: bool,
    /// Reap the completion and return it instead of queueing it.
    polled: bool,
    /// Software's reported count equals the hardware's: an ADD is listed in phase.
    level: bool,
}

#[derive(Debug, Clone, Copy)]
enum InTarget {
    Tagged(u32),
    Srq { wr_id: u64, len: usize, opcode: WcOpcode, unexpected: bool },
}

/// A multi-packet message whose first packet has arrived.
#[derive(Debug, Clone, Copy)]
struct Inflight {
    src: u32,
    target: InTarget,
    /// Message bytes received so far (headers included).
    received: usize,
    total: usize,
}

/// The SRQ's receive work requests `(wr_id, len)`, oldest first: a ring of `max_wr` entries
/// allocated at creation, so posting one is a store and a compare (a `VecDeque` push was an
/// out-of-line call for every message the TM-SRQ delivers unexpected, since its buffer must
/// be reposted).
struct WrRing {
    wrs: Box<[(u64, usize)]>,
    head: usize,
    len: usize,
}

impl WrRing {
    fn new(cap: usize) -> Self {
        WrRing { wrs: vec![(0, 0); cap].into_boxed_slice(), head: 0, len: 0 }
    }

    #[inline]
    fn len(&self) -> usize {
        self.len
    }

    #[inline]
    fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Appends `wr`; false (nothing changed) when the ring is full. Always inlined: as a
    /// call it cost 23 instructions per unexpected message (callgrind).
    #[inline(always)]
    fn push(&mut self, wr: (u64, usize)) -> bool {
        let cap = self.wrs.len();
        if self.len == cap {
            return false;
        }
        let mut at = self.head + self.len;
        if at >= cap {
            at -= cap;
        }
        self.wrs[at] = wr;
        self.len += 1;
        true
    }

    /// Takes the oldest entry.
    #[inline]
    fn pop(&mut self) -> Option<(u64, usize)> {
        if self.len == 0 {
            return None;
        }
        let wr = self.wrs[self.head];
        self.head += 1;
        if self.head == self.wrs.len() {
            self.head = 0;
        }
        self.len -= 1;
        Some(wr)
    }
}

/// The soft TM-SRQ. See the [module documentation](super) for the model and its choices.
pub struct TmSrq {
    caps: TmCaps,
    cap: TmCap,
    list: TagList,
    srq: WrRing,
    cq: VecDeque<CqEntry>,
    tx: VecDeque<Transmit>,
    inflight: Vec<Inflight>,
    /// Unexpected messages the hardware delivered (wrapping, 16 bits).
    hw_cnt: u16,
    /// Last count software reported with `TM_SYNC`.
    sw_cnt: u16,
    /// Unexpected completions polled (driver side, for `TM_SYNC_REQ`).
    unexp_polled: u16,
    ops_posted: u64,
    ops_reaped: u64,
    /// Pending entries in `cq` (see [`CqEntry::pending`]).
    cq_pending: usize,
    counters: TmCounters,
}

impl std::fmt::Debug for TmSrq {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TmSrq")
            .field("cap", &self.cap)
            .field("listed", &self.list.listed())
            .field("srq_posted", &self.srq.len())
            .field("cq_len", &self.cq.len())
            .field("hw_cnt", &self.hw_cnt)
            .field("sw_cnt", &self.sw_cnt)
            .field("counters", &self.counters)
            .finish_non_exhaustive()
    }
}

/// The RVH at the start of `buf`, if it is long enough.
#[inline]
fn rvh_of(buf: &[u8]) -> Option<Rvh> {
    Rvh::decode(buf).ok()
}

#[inline]
fn clip(dst_off: usize, n: usize, cap: usize) -> usize {
    n.min(cap.saturating_sub(dst_off))
}

#[inline]
fn len_status(len: u64, cap: usize) -> WcStatus {
    if len > cap as u64 {
        WcStatus::LocLenErr
    } else {
        WcStatus::Success
    }
}

impl TmSrq {
    /// Creates a TM-SRQ on the default device ([`TmCaps::default`]).
    ///
    /// # Errors
    /// [`TmErrno::Inval`] if `cap` exceeds the device's capabilities or has a zero field.
    pub fn new(cap: TmCap) -> Result<Self, TmErrno> {
        Self::with_caps(TmCaps::default(), cap)
    }

    /// Creates a TM-SRQ on a device with capabilities `caps`. Everything the SRQ will need is
    /// allocated here: the list, the SRQ ring, the completion and transmit queues.
    ///
    /// # Errors
    /// [`TmErrno::Inval`] as [`TmCaps::validate`] says.
    pub fn with_caps(caps: TmCaps, cap: TmCap) -> Result<Self, TmErrno> {
        caps.validate(&cap)?;
        let tags = cap.max_num_tags as usize;
        // Every queued completion holds a resource until polled: an SRQ buffer, an entry (at
        // most ADD, MATCH and DATA_VALID at once) or an op slot.
        let cq_cap = cap.max_wr as usize + 3 * tags + cap.max_ops as usize;
        Ok(TmSrq {
            caps,
            cap,
            list: TagList::new(cap.max_num_tags),
            srq: WrRing::new(cap.max_wr as usize),
            cq: touched(cq_cap),
            tx: touched(tags),
            inflight: Vec::with_capacity(8),
            hw_cnt: 0,
            sw_cnt: 0,
            unexp_polled: 0,
            ops_posted: 0,
            ops_reaped: 0,
            cq_pending: 0,
            counters: TmCounters::default(),
        })
    }

    /// The device capabilities this SRQ was created against.
    #[inline]
    pub fn caps(&self) -> &TmCaps {
        &self.caps
    }

    /// The creation request.
    #[inline]
    pub fn cap(&self) -> &TmCap {
        &self.cap
    }

    /// What the model has counted so far.
    #[inline]
    pub fn counters(&self) -> &TmCounters {
        &self.counters
    }

    /// Unexpected tagged messages the hardware has delivered, modulo 2^16.
    #[inline]
    pub fn hw_unexpected_cnt(&self) -> u16 {
        self.hw_cnt
    }

    /// The last unexpected count software reported (low 16 bits).
    #[inline]
    pub fn sw_unexpected_cnt(&self) -> u16 {
        self.sw_cnt
    }

    /// True when software's last reported count equals the hardware's.
    #[inline]
    pub fn in_sync(&self) -> bool {
        self.sw_cnt == self.hw_cnt
    }

    /// Entries in the matching list.
    #[inline]
    pub fn tags_listed(&self) -> usize {
        self.list.listed()
    }

    /// Untagged buffers posted and not yet used.
    #[inline]
    pub fn srq_posted(&self) -> usize {
        self.srq.len()
    }

    /// Ops posted whose slot has not been reclaimed (see [`TmSrq::post_srq_ops`]).
    #[inline]
    pub fn ops_outstanding(&self) -> u64 {
        self.ops_posted - self.ops_reaped
    }

    /// Completions waiting to be polled.
    #[inline]
    pub fn cq_len(&self) -> usize {
        self.cq.len()
    }

    /// `ibv_post_srq_recv`: posts an untagged buffer of `len` bytes. Unexpected, NO_TAG and
    /// FIN messages land in these, whole, in posting order.
    ///
    /// # Errors
    /// [`TmErrno::NoMem`] if `max_wr` buffers are already posted.
    #[inline]
    pub fn post_srq_recv(&mut self, wr_id: u64, len: usize) -> Result<(), TmErrno> {
        if self.srq.push((wr_id, len)) {
            Ok(())
        } else {
            Err(TmErrno::NoMem)
        }
    }

    /// `ibv_post_srq_ops`: executes the ops in order. Each ADD writes its handle to the
    /// element's [`OpsWr::handle`].
    ///
    /// Ops take effect at once (the hardware processes them before the next arrival).
    /// Every op holds one of `max_ops` slots from posting until a completion of it or of a
    /// later op is polled, as on mlx5's command queue; an op that succeeds unsignaled has no
    /// completion of its own, so post a `SIGNALED` op at least once every `max_ops` ops.
    /// A DEL that fails always completes (`TM_ERR`), signaled or not.
    ///
    /// # Errors
    /// `(i, errno)` for the first op that could not be posted; ops before `i` took effect,
    /// ops from `i` on did not (the verbs `bad_wr`):
    /// - [`TmErrno::NoMem`]: `max_ops` ops outstanding, or an ADD while no entry is free (the
    ///   list is full, or consumed entries await the polling of their completions);
    /// - [`TmErrno::Inval`]: unknown flag bits, an ADD longer than [`MAX_TAGGED_LEN`] (a
    ///   tagged buffer is one `ibv_sge`, shorter than [`RVH_LEN_IN_META`]), or a DEL handle
    ///   `>= max_num_tags`.
    pub fn post_srq_ops(&mut self, wrs: &mut [OpsWr]) -> Result<(), (usize, TmErrno)> {
        for (i, wr) in wrs.iter_mut().enumerate() {
            match self.post_srq_op(wr) {
                Ok(Some(h)) => wr.handle = h,
                Ok(None) => {}
                Err(e) => return Err((i, e)),
            }
        }
        Ok(())
    }

    /// Posts one op, as [`TmSrq::post_srq_ops`] with a list of one; returns the handle of an
    /// ADD.
    ///
    /// # Errors
    /// As [`TmSrq::post_srq_ops`]; nothing changed.
    #[inline]
    pub fn post_srq_op(&mut self, wr: &OpsWr) -> Result<Option<u32>, TmErrno> {
        self.post_op(wr, false).map(|(h, _)| h)
    }

    /// [`TmSrq::post_srq_op`] followed by [`TmSrq::poll_cq`] of its completion, fused, when
    /// that completion would be the next polled (no completion is queued): the completion
    /// is returned instead of queued, and what polling it releases is released. With
    /// completions queued, or for an op without a completion, it is `post_srq_op` and the
    /// completion (if any) is queued as usual: `(handle of an ADD, completion polled here)`.
    ///
    /// # Errors
    /// As [`TmSrq::post_srq_op`]; nothing changed.
    #[inline]
    pub fn post_srq_op_polled(&mut self, wr: &OpsWr) -> Result<(Option<u32>, Option<Wc>), TmErrno> {
        let polled = self.cq.is_empty();
        self.post_op(wr, polled)
    }

    /// [`TmSrq::post_srq_op`]; with `polled` (only when the CQ is empty), its completion is
    /// reaped and returned instead of queued.
    #[inline(always)]
    fn post_op(&mut self, wr: &OpsWr, polled: bool) -> Result<(Option<u32>, Option<Wc>), TmErrno> {
        self.check_op(wr)?;
        let seq = self.ops_posted;
        self.ops_posted += 1;
        let level = self.sync_phase(wr);
        let sync_req = if level { WcFlags::NONE } else { WcFlags::TM_SYNC_REQ };
        let wc = Wc {
            wr_id: wr.wr_id,
            opcode: WcOpcode::TmSync,
            status: WcStatus::Success,
            flags: sync_req,
            byte_len: 0,
            handle: 0,
            src: 0,
            tag: 0,
            app_ctx: 0,
        };
        let post = OpPost { wc, seq, signaled: wr.flags.contains(OpsFlags::SIGNALED), polled, level };
        match wr.opcode {
            OpsOp::Add { tag, mask, recv_wr_id, len } => self.op_add(tag, mask, recv_wr_id, len, post),
            OpsOp::Del { handle } => Ok((None, self.op_del(handle, post))),
            OpsOp::Sync => Ok((None, self.op_sync(post))),
        }
    }

    /// The checks [`TmSrq::post_op`] makes before an op changes anything, in the order their
    /// errors win.
    #[inline(always)]
    fn check_op(&self, wr: &OpsWr) -> Result<(), TmErrno> {
        if !OpsFlags::ALL.contains(wr.flags) {
            return Err(TmErrno::Inval);
        }
        if self.ops_outstanding() >= u64::from(self.cap.max_ops) {
            return Err(TmErrno::NoMem);
        }
        match wr.opcode {
            OpsOp::Add { len, .. } if len > MAX_TAGGED_LEN => Err(TmErrno::Inval),
            OpsOp::Add { .. } if self.list.is_full() => Err(TmErrno::NoMem),
            OpsOp::Del { handle } if handle >= self.cap.max_num_tags => Err(TmErrno::Inval),
            _ => Ok(()),
        }
    }

    /// Takes a `TM_SYNC` op's reported count and re-enables out-of-phase entries when the
    /// counts are level; returns whether they are (the op is "in phase").
    #[inline(always)]
    fn sync_phase(&mut self, wr: &OpsWr) -> bool {
        if wr.flags.contains(OpsFlags::TM_SYNC) {
            // Only 16 bits reach the hardware (mlx5 `sw_cnt` is be16).
            self.sw_cnt = wr.unexpected_cnt as u16;
        }
        let level = self.sw_cnt == self.hw_cnt;
        if level && self.list.resync() {
            self.counters.resyncs += 1;
        }
        level
    }

    /// TAG_ADD: takes a free entry, lists it (out of phase unless level), and completes it if
    /// signaled; returns its handle.
    #[inline(always)]
    fn op_add(&mut self, tag: u64, mask: u64, recv_wr_id: u64, len: usize, post: OpPost) -> Result<(Option<u32>, Option<Wc>), TmErrno> {
        let Some(h) = self.list.alloc() else {
            // Checked in `check_op`; unreachable, but never panic on it.
            return Err(TmErrno::NoMem);
        };
        let s = &mut self.list.slots[h as usize];
        s.gen = s.gen.wrapping_add(1);
        s.recv_wr_id = recv_wr_id;
        s.len = len;
        s.read_pending = false;
        s.refs = 1 + u8::from(post.signaled);
        self.list.insert(h, tag, mask, !post.level);
        self.counters.adds += 1;
        self.counters.list_hwm = self.counters.list_hwm.max(self.list.listed() as u64);
        let mut done = None;
        if post.signaled {
            let mut wc = post.wc;
            wc.opcode = WcOpcode::TmAdd;
            wc.handle = h;
            done = self.complete_op(wc, h, post.seq, post.polled);
        }
        Ok((Some(h), done))
    }

    /// TAG_DEL: unlists entry `handle`, completing if signaled; a DEL of an entry not listed
    /// fails and always completes (`TM_ERR`).
    #[inline(always)]
    fn op_del(&mut self, handle: u32, post: OpPost) -> Option<Wc> {
        let mut wc = post.wc;
        wc.opcode = WcOpcode::TmDel;
        wc.handle = handle;
        if self.list.slots[handle as usize].state == SlotState::Listed {
            self.list.unlink(handle);
            self.counters.dels += 1;
            let s = &mut self.list.slots[handle as usize];
            s.state = SlotState::Done;
            if post.signaled {
                // The completion takes over the hardware's hold on the handle.
                self.complete_op(wc, handle, post.seq, post.polled)
            } else {
                self.list.unref(handle);
                None
            }
        } else {
            self.counters.del_failed += 1;
            wc.status = WcStatus::TmErr;
            self.complete_op(wc, NIL, post.seq, post.polled)
        }
    }

    /// TAG_SYNC: counted, and completed (never asking for another SYNC) if signaled.
    #[inline(always)]
    fn op_sync(&mut self, post: OpPost) -> Option<Wc> {
        self.counters.syncs += 1;
        let mut wc = post.wc;
        // mlx5 (`handle_tag_matching`, case `MLX5_CQE_APP_OP_TM_NOOP`) compares the
        // phase counts only for ops that carry a tag (APPEND, REMOVE): a SYNC's own
        // completion never asks for another SYNC.
        wc.flags = WcFlags::NONE;
        let mut done = None;
        if post.signaled {
            done = self.complete_op(wc, NIL, post.seq, post.polled);
        }
        done
    }

    /// An op's completion `wc`, releasing `release` when polled: queued, or reaped and
    /// returned with `polled` (see [`TmSrq::complete`]).
    #[inline(always)]
    fn complete_op(&mut self, wc: Wc, release: u32, seq: u64, polled: bool) -> Option<Wc> {
        self.complete(CqEntry { wc, release, op_seq: seq, unexpected: false, pending: false }, polled)
    }

    /// `ibv_poll_cq` on the SRQ's completion queue: the oldest completion, if any.
    ///
    /// Polling releases what the completion held: the handle of a consumed or deleted entry
    /// becomes reusable, the op slots up to a completed op are reclaimed. An unexpected
    /// receive gets `TM_SYNC_REQ` here once more than [`MAX_SYNC_DIFF`] of them have been
    /// polled since software's last reported count (as the mlx5 driver computes it).
    #[inline]
    pub fn poll_cq(&mut self) -> Option<Wc> {
        let e = if self.cq_pending == 0 { self.cq.pop_front()? } else { self.pop_past_pending()? };
        Some(self.reap(e))
    }

    /// A new completion: queued, or with `polled` (the CQ is empty, so it would be the next
    /// polled) reaped and returned at once.
    #[inline]
    fn complete(&mut self, e: CqEntry, polled: bool) -> Option<Wc> {
        if polled {
            debug_assert!(self.cq.is_empty());
            Some(self.reap(e))
        } else {
            self.push(e);
            None
        }
    }

    /// What polling completion `e` does: releases what it held, returns its work completion.
    /// Always inlined: built just before in registers, a completion copied through memory
    /// stalls on its own narrow stores (store forwarding).
    #[inline(always)]
    fn reap(&mut self, e: CqEntry) -> Wc {
        let mut wc = e.wc;
        if e.release != NIL {
            self.list.unref(e.release);
        }
        if e.op_seq != NO_OP {
            self.ops_reaped = self.ops_reaped.max(e.op_seq + 1);
        }
        if e.unexpected {
            self.unexp_polled = self.unexp_polled.wrapping_add(1);
            if self.unexp_polled.wrapping_sub(self.sw_cnt) > MAX_SYNC_DIFF {
                wc.flags |= WcFlags::TM_SYNC_REQ;
            }
        }
        wc
    }

    /// The oldest completion that may be polled while a multi-packet unexpected message is
    /// still arriving: one queued before the first pending completion, or an op or NO_TAG
    /// completion after it (see [`CqEntry::ordered`]).
    #[cold]
    fn pop_past_pending(&mut self) -> Option<CqEntry> {
        let mut blocked = false;
        let i = self.cq.iter().position(|e| {
            if e.pending {
                blocked = true;
                return false;
            }
            !(blocked && e.ordered())
        })?;
        self.cq.remove(i)
    }

    /// Makes the pending completion of the unexpected message from `src` pollable, with
    /// `status` if given.
    fn settle_pending(&mut self, src: u32, status: Option<WcStatus>) {
        if let Some(e) = self.cq.iter_mut().find(|e| e.pending && e.wc.src == src) {
            e.pending = false;
            if let Some(st) = status {
                e.wc.status = st;
            }
            self.cq_pending -= 1;
        }
    }

    /// The next message the SRQ wants sent (the FIN of a completed rendezvous), if any.
    #[inline]
    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        self.tx.pop_front()
    }

    #[inline]
    fn push(&mut self, e: CqEntry) {
        self.cq.push_back(e);
    }

    /// Whether polling would find nothing: no completion queued and nothing to transmit.
    #[inline]
    pub fn quiet(&self) -> bool {
        self.cq.is_empty() && self.tx.is_empty()
    }

    /// [`TmSrq::arrive`] of a whole eager message followed by [`TmSrq::poll_cq`] of its
    /// completion, fused, for the common case where the result is known in advance: no
    /// message is in progress and no completion is queued, so this message's completion
    /// would be the next polled. The message matches the first eligible tagged buffer, or
    /// takes the oldest SRQ buffer and is counted unexpected, exactly as through `arrive`;
    /// the completion that `poll_cq` would return is returned instead of queued, and what
    /// polling it would release (the consumed entry's handle) is released.
    ///
    /// `None` (nothing changed) when either condition does not hold, or the message is not
    /// a well-formed eager one, or it matches nothing and no SRQ buffer is posted: the caller
    /// then takes the general path, which reports every such case.
    #[inline]
    pub fn arrive_whole_polled(&mut self, src: u32, msg: &[u8]) -> Option<Polled> {
        if msg.first() != Some(&(TmOp::Eager as u8)) || msg.len() < TMH_LEN || !self.inflight.is_empty() || !self.cq.is_empty() {
            return None;
        }
        let len = msg.len();
        if self.list.listed() != 0 {
            let tmh = Tmh::decode_as_hardware(msg)?;
            if let Some(h) = self.list.lookup(tmh.tag) {
                let (pl, wc) = self.match_eager(h, src, &tmh, len, len, true);
                return Some(Polled::Matched(pl, wc?));
            }
        }
        // Without an SRQ buffer the general path reports the RNR (and counts it).
        if self.srq.is_empty() {
            return None;
        }
        let (_, wc) = self.deliver_to_srq(src, len, len, WcOpcode::TmRecv, true, true);
        Some(Polled::Unexpected(wc?))
    }

    /// A whole message (one packet) arrives from `src`, exactly as it came off the wire:
    /// TMH, optional RVH and meta-data, payload (or a NO_TAG opcode byte and anything).
    ///
    /// # Errors
    /// As [`TmSrq::arrive_first`].
    #[inline]
    pub fn arrive(&mut self, src: u32, msg: &[u8]) -> Result<Arrival, TmErrno> {
        self.arrive_first(src, msg, msg.len())
    }

    /// The first packet of a message of `total_len` bytes arrives from `src`. If `first` is
    /// shorter than `total_len`, the rest comes through [`TmSrq::arrive_continuation`], in
    /// order, before any other message from `src` (RC delivers messages of one connection
    /// whole and in order). Matching happens now: a matched multi-packet eager message
    /// completes MATCH now and DATA_VALID with its last packet; an unexpected one takes its
    /// SRQ buffer now and completes with its last packet.
    ///
    /// # Errors
    /// - [`TmErrno::BadMsg`]: empty packet, `total_len < first.len()`, unknown opcode,
    ///   an eager first packet shorter than a TMH, a
    ///   rendezvous request not whole in one packet, shorter than TMH and RVH, or longer than
    ///   `max_rndv_hdr_size`. Nothing changed.
    /// - [`TmErrno::Inval`]: a message from `src` is still in progress. Nothing changed.
    pub fn arrive_first(&mut self, src: u32, first: &[u8], total_len: usize) -> Result<Arrival, TmErrno> {
        let Some(&op) = first.first() else {
            return Err(TmErrno::BadMsg);
        };
        if total_len < first.len() {
            return Err(TmErrno::BadMsg);
        }
        if !self.inflight.is_empty() && self.inflight.iter().any(|f| f.src == src) {
            return Err(TmErrno::Inval);
        }
        match TmOp::from_u8(op) {
            Ok(TmOp::Eager) => {
                let tmh = Tmh::decode_as_hardware(first).ok_or(TmErrno::BadMsg)?;
                match self.list.lookup(tmh.tag) {
                    Some(h) => Ok(Arrival::Place(self.match_eager(h, src, &tmh, first.len(), total_len, false).0)),
                    None => Ok(self.deliver_to_srq(src, first.len(), total_len, WcOpcode::TmRecv, true, false).0),
                }
            }
            Ok(TmOp::Rndv) => {
                if total_len != first.len() || first.len() < TMH_LEN + RVH_LEN || first.len() > self.caps.max_rndv_hdr_size as usize {
                    return Err(TmErrno::BadMsg);
                }
                let tmh = Tmh::decode_as_hardware(first).ok_or(TmErrno::BadMsg)?;
                let rvh = rvh_of(&first[TMH_LEN..]).ok_or(TmErrno::BadMsg)?;
                match self.list.lookup(tmh.tag) {
                    Some(h) => Ok(self.match_rndv(h, src, &tmh, rvh, first)),
                    None => Ok(self.deliver_to_srq(src, first.len(), total_len, WcOpcode::TmRecv, true, false).0),
                }
            }
            // The hardware looks at nothing but the opcode of these: delivered whole, as
            // NO_TAG (mlx5 reports FIN with the NO_TAG CQE opcode), never counted (mlx5 counts
            // only TM_UNEXPECTED CQEs; rdma-core's tests/test_tag_matching.py, test_tm_no_tag,
            // checks the count stays put).
            Ok(TmOp::NoTag) | Ok(TmOp::Fin) => Ok(self.deliver_to_srq(src, first.len(), total_len, WcOpcode::TmNoTag, false, false).0),
            Err(_) => Err(TmErrno::BadMsg),
        }
    }

    /// The next packet of the message in progress from `src`. The packet that completes
    /// the message queues its completion (DATA_VALID of a matched message, or the unexpected
    /// / NO_TAG receive).
    ///
    /// # Errors
    /// - [`TmErrno::Inval`]: no message from `src` is in progress.
    /// - [`TmErrno::BadMsg`]: more bytes than the message has left. Nothing changed.
    pub fn arrive_continuation(&mut self, src: u32, bytes: &[u8]) -> Result<Arrival, TmErrno> {
        let i = self.inflight.iter().position(|f| f.src == src).ok_or(TmErrno::Inval)?;
        let f = self.inflight[i];
        if bytes.len() > f.total - f.received {
            return Err(TmErrno::BadMsg);
        }
        let off = f.received;
        let received = off + bytes.len();
        let done = received == f.total;
        if done {
            self.inflight.swap_remove(i);
        } else {
            self.inflight[i].received = received;
        }
        let place = match f.target {
            InTarget::Tagged(h) => {
                let s = self.list.slots[h as usize];
                let dst_off = off - TMH_LEN;
                if done {
                    self.list.slots[h as usize].state = SlotState::Done;
                    let wc = Wc {
                        wr_id: s.recv_wr_id,
                        opcode: WcOpcode::TmRecv,
                        status: len_status(s.payload, s.len),
                        flags: WcFlags::TM_DATA_VALID,
                        byte_len: s.payload,
                        handle: h,
                        src,
                        tag: s.msg_tag,
                        app_ctx: s.app_ctx,
                    };
                    self.push(CqEntry { wc, release: h, op_seq: NO_OP, unexpected: false, pending: false });
                }
                Placement {
                    buffer: Buffer::Tagged { recv_wr_id: s.recv_wr_id, handle: h },
                    src_off: 0,
                    dst_off,
                    len: clip(dst_off, bytes.len(), s.len),
                }
            }
            InTarget::Srq { wr_id, len, opcode, unexpected } => {
                if done && unexpected {
                    self.settle_pending(src, None);
                } else if done {
                    self.push_srq_completion(src, wr_id, len, f.total, opcode, false, false, false);
                }
                Placement { buffer: Buffer::Srq { wr_id }, src_off: 0, dst_off: off, len: clip(off, bytes.len(), len) }
            }
        };
        Ok(Arrival::Place(place))
    }

    /// The connection to `src` failed in the middle of a multi-packet message: the message
    /// is cut off. A matched entry completes `TM_DATA_VALID` with
    /// [`WcStatus::WrFlushErr`] (and is freed when that is polled); an unexpected or NO_TAG
    /// message completes with that status in its SRQ buffer (an unexpected one still counts
    /// toward software's unexpected count). Returns false if no message from `src` was in
    /// progress. Rendezvous reads from a failed peer are reported with
    /// [`TmSrq::read_failed`].
    pub fn abort_message(&mut self, src: u32) -> bool {
        let Some(i) = self.inflight.iter().position(|f| f.src == src) else {
            return false;
        };
        let f = self.inflight.swap_remove(i);
        match f.target {
            InTarget::Tagged(h) => {
                let s = &mut self.list.slots[h as usize];
                s.state = SlotState::Done;
                let wc = Wc {
                    wr_id: s.recv_wr_id,
                    opcode: WcOpcode::TmRecv,
                    status: WcStatus::WrFlushErr,
                    flags: WcFlags::TM_DATA_VALID,
                    byte_len: s.payload,
                    handle: h,
                    src,
                    tag: s.msg_tag,
                    app_ctx: s.app_ctx,
                };
                self.push(CqEntry { wc, release: h, op_seq: NO_OP, unexpected: false, pending: false });
            }
            InTarget::Srq { unexpected: true, .. } => self.settle_pending(src, Some(WcStatus::WrFlushErr)),
            InTarget::Srq { wr_id, opcode, .. } => {
                let wc = Wc {
                    wr_id,
                    opcode,
                    status: WcStatus::WrFlushErr,
                    flags: WcFlags::NONE,
                    byte_len: f.total as u64,
                    handle: 0,
                    src,
                    tag: 0,
                    app_ctx: 0,
                };
                self.push(CqEntry { wc, release: NIL, op_seq: NO_OP, unexpected: false, pending: false });
            }
        }
        true
    }

    /// Reports that the read of `id` finished: queues the DATA_VALID completion (the entry's
    /// handle is freed when it is polled) and the FIN to the sender ([`TmSrq::poll_transmit`]).
    ///
    /// # Errors
    /// [`TmErrno::Inval`] if `id` is not a read in progress (already reported, or stale).
    pub fn read_complete(&mut self, id: ReadId) -> Result<(), TmErrno> {
        let s = self.take_read(id)?;
        let msg = Fin { tmh: Tmh { op: TmOp::Fin, app_ctx: s.app_ctx, tag: s.msg_tag }, rvh: s.rvh }.to_bytes();
        self.tx.push_back(Transmit { dst: s.src, msg });
        self.finish_read(id.handle, WcStatus::Success);
        Ok(())
    }

    /// Reports that the read of `id` failed with `status`: queues a DATA_VALID completion with
    /// that status (the buffer's content is undefined) and sends no FIN; what the sender is
    /// told is up to software.
    ///
    /// # Errors
    /// [`TmErrno::Inval`] if `id` is not a read in progress, or `status` is not an error.
    pub fn read_failed(&mut self, id: ReadId, status: WcStatus) -> Result<(), TmErrno> {
        if status == WcStatus::Success {
            return Err(TmErrno::Inval);
        }
        self.take_read(id)?;
        self.counters.read_failures += 1;
        self.finish_read(id.handle, status);
        Ok(())
    }

    fn take_read(&mut self, id: ReadId) -> Result<super::list::Slot, TmErrno> {
        match self.list.slots.get_mut(id.handle as usize) {
            Some(s) if s.gen == id.gen && s.state == SlotState::Matched && s.read_pending => {
                s.read_pending = false;
                s.state = SlotState::Done;
                Ok(*s)
            }
            _ => Err(TmErrno::Inval),
        }
    }

    fn finish_read(&mut self, h: u32, status: WcStatus) {
        let s = self.list.slots[h as usize];
        let wc = Wc {
            wr_id: s.recv_wr_id,
            opcode: WcOpcode::TmRecv,
            status,
            flags: WcFlags::TM_DATA_VALID,
            byte_len: s.payload,
            handle: h,
            src: s.src,
            tag: s.msg_tag,
            app_ctx: s.app_ctx,
        };
        self.push(CqEntry { wc, release: h, op_seq: NO_OP, unexpected: false, pending: false });
    }

    /// Takes `h` out of the list for a message from `src`; returns the entry's
    /// `(recv_wr_id, buffer length)`.
    #[inline]
    fn consume(&mut self, h: u32, src: u32, tmh: &Tmh) -> Consumed {
        self.list.unlink(h);
        self.counters.hw_matched += 1;
        let s = &mut self.list.slots[h as usize];
        s.state = SlotState::Matched;
        s.src = src;
        s.msg_tag = tmh.tag;
        s.app_ctx = tmh.app_ctx;
        Consumed { recv_wr_id: s.recv_wr_id, len: s.len }
    }

    /// Entry `h` matched an eager message: its placement, and with `polled` (a whole message
    /// while the CQ is empty) its completion, reaped instead of queued. Always inlined: the
    /// completion then reaches the fused caller in registers (store forwarding, see `reap`).
    #[inline(always)]
    fn match_eager(&mut self, h: u32, src: u32, tmh: &Tmh, first_len: usize, total_len: usize, polled: bool) -> (Placement, Option<Wc>) {
        let s = self.consume(h, src, tmh);
        let payload = (total_len - TMH_LEN) as u64;
        self.list.slots[h as usize].payload = payload;
        let mut wc = Wc {
            wr_id: s.recv_wr_id,
            opcode: WcOpcode::TmRecv,
            status: WcStatus::Success,
            flags: WcFlags::TM_MATCH | WcFlags::TM_DATA_VALID,
            byte_len: payload,
            handle: h,
            src,
            tag: tmh.tag,
            app_ctx: tmh.app_ctx,
        };
        let mut done = None;
        if first_len == total_len {
            self.list.slots[h as usize].state = SlotState::Done;
            wc.status = len_status(payload, s.len);
            done = self.complete(CqEntry { wc, release: h, op_seq: NO_OP, unexpected: false, pending: false }, polled);
        } else {
            wc.flags = WcFlags::TM_MATCH;
            wc.byte_len = 0;
            self.push(CqEntry { wc, release: NIL, op_seq: NO_OP, unexpected: false, pending: false });
            self.inflight.push(Inflight { src, target: InTarget::Tagged(h), received: first_len, total: total_len });
        }
        let placement = Placement {
            buffer: Buffer::Tagged { recv_wr_id: s.recv_wr_id, handle: h },
            src_off: TMH_LEN,
            dst_off: 0,
            len: clip(0, first_len - TMH_LEN, s.len),
        };
        (placement, done)
    }

    fn match_rndv(&mut self, h: u32, src: u32, tmh: &Tmh, rvh: Rvh, msg: &[u8]) -> Arrival {
        let s = self.consume(h, src, tmh);
        // The hardware reads the RVH alone: whatever follows it is software's business.
        let len = rvh.len;
        let mut wc = Wc {
            wr_id: s.recv_wr_id,
            opcode: WcOpcode::TmRecv,
            status: WcStatus::Success,
            flags: WcFlags::TM_MATCH,
            byte_len: 0,
            handle: h,
            src,
            tag: tmh.tag,
            app_ctx: tmh.app_ctx,
        };
        if len as usize > s.len {
            // The buffer cannot hold the payload: hand the request to software, in the buffer.
            self.counters.rndv_incomplete += 1;
            let slot = &mut self.list.slots[h as usize];
            slot.state = SlotState::Done;
            slot.payload = msg.len() as u64;
            wc.status = WcStatus::TmRndvIncomplete;
            wc.flags = WcFlags::TM_MATCH | WcFlags::TM_DATA_VALID;
            wc.byte_len = msg.len() as u64;
            self.push(CqEntry { wc, release: h, op_seq: NO_OP, unexpected: false, pending: false });
            return Arrival::Place(Placement {
                buffer: Buffer::Tagged { recv_wr_id: s.recv_wr_id, handle: h },
                src_off: 0,
                dst_off: 0,
                len: clip(0, msg.len(), s.len),
            });
        }
        self.counters.rndv_reads += 1;
        let slot = &mut self.list.slots[h as usize];
        slot.rvh = rvh;
        slot.payload = u64::from(len);
        slot.read_pending = true;
        let gen = slot.gen;
        self.push(CqEntry { wc, release: NIL, op_seq: NO_OP, unexpected: false, pending: false });
        Arrival::Read(ReadRequest {
            id: ReadId { handle: h, gen },
            src,
            va: rvh.va,
            rkey: rvh.rkey,
            len,
            recv_wr_id: s.recv_wr_id,
            handle: h,
        })
    }

    /// Delivers a message whole to the next SRQ buffer (or refuses it: RNR).
    #[inline]
    fn deliver_to_srq(
        &mut self,
        src: u32,
        first_len: usize,
        total_len: usize,
        opcode: WcOpcode,
        unexpected: bool,
        polled: bool,
    ) -> (Arrival, Option<Wc>) {
        let Some((wr_id, len)) = self.srq.pop() else {
            self.counters.rnr += 1;
            return (Arrival::Rnr, None);
        };
        if unexpected {
            // Completes as TmRecv with neither MATCH nor DATA_VALID, as mlx5 does and
            // rdma-core's tests/test_tag_matching.py (test_tm_unexpected_tag) expects.
            self.hw_cnt = self.hw_cnt.wrapping_add(1);
            self.counters.unexpected += 1;
        } else {
            self.counters.no_tag += 1;
        }
        let multi = first_len != total_len;
        // A multi-packet unexpected message is counted now, so its completion takes its place
        // in the queue now (pending until the last packet): the seed serializes the matching
        // completions with the completions of unexpected messages.
        let mut done = None;
        if !multi || unexpected {
            done = self.push_srq_completion(src, wr_id, len, total_len, opcode, unexpected, multi, polled && !multi);
        }
        if multi {
            self.inflight.push(Inflight {
                src,
                target: InTarget::Srq { wr_id, len, opcode, unexpected },
                received: first_len,
                total: total_len,
            });
        }
        (Arrival::Place(Placement { buffer: Buffer::Srq { wr_id }, src_off: 0, dst_off: 0, len: clip(0, first_len, len) }), done)
    }

    /// Queues the completion of a message delivered to SRQ buffer `wr_id`, or with `polled`
    /// (never for a pending one) reaps and returns it.
    #[allow(clippy::too_many_arguments)]
    #[inline]
    fn push_srq_completion(
        &mut self,
        src: u32,
        wr_id: u64,
        len: usize,
        total: usize,
        opcode: WcOpcode,
        unexpected: bool,
        pending: bool,
        polled: bool,
    ) -> Option<Wc> {
        let wc = Wc {
            wr_id,
            opcode,
            status: len_status(total as u64, len),
            flags: WcFlags::NONE,
            byte_len: total as u64,
            handle: 0,
            src,
            tag: 0,
            app_ctx: 0,
        };
        self.cq_pending += usize::from(pending);
        self.complete(CqEntry { wc, release: NIL, op_seq: NO_OP, unexpected, pending }, polled)
    }
}

const _: () = assert!(std::mem::size_of::<CqEntry>() <= 64);

/// What a match needs of the entry it consumed.
#[derive(Clone, Copy)]
struct Consumed {
    recv_wr_id: u64,
    len: usize,
}

#[cfg(test)]
mod wr_ring_tests {
    use super::WrRing;

    /// FIFO order across the wrap, a full ring refuses (and keeps what it has), and
    /// `len`/`is_empty` follow.
    #[test]
    fn fifo_across_the_wrap_and_full_refuses() {
        let mut r = WrRing::new(3);
        assert!(r.is_empty() && r.pop().is_none());
        let mut next = 0u64;
        let mut expect = std::collections::VecDeque::new();
        for round in 0..10 {
            // Fill to the brim (the ring's start moves each round), then take some out.
            while r.len() < 3 {
                assert!(r.push((next, next as usize * 2)));
                expect.push_back((next, next as usize * 2));
                next += 1;
            }
            assert!(!r.push((99, 99)), "round {round}: a full ring refuses");
            for _ in 0..(round % 3 + 1) {
                assert_eq!(r.pop(), expect.pop_front());
            }
            assert_eq!(r.len(), expect.len());
        }
        while let Some(wr) = r.pop() {
            assert_eq!(Some(wr), expect.pop_front());
        }
        assert!(r.is_empty() && expect.is_empty());
    }
}
