//! The progress engine of one rank: fabric, matching, protocols, requests.
//!
//! Laid out by protocol stage, as UCX's `ucp/tag/` is; this file holds the state every stage
//! shares (the request slab, the unexpected messages, the queues) and the wire constants:
//!
//! | file | stage |
//! |---|---|
//! | [`progress`] | one round of progress, waiting and back-off |
//! | [`arrival`] | every packet from the fabric, through the soft TM-SRQ |
//! | [`recv`] | posting receives (the offload decision), probing |
//! | [`eager`] | eager send and receive, credit flow control, control packets |
//! | [`rndv`] | rendezvous: request, RDMA read served after the key check, FIN |
//! | [`single_copy`] | CMA reads and split writes of rendezvous data |
//! | [`adapt`] | single copy or the rings, and where rendezvous starts, by measurement |
//! | [`offload`] | the soft TM-SRQ's tagged buffers, completions and sync |
//! | [`requests`] | request naming, completion, cancel and abandon |
//! | [`leave`] | finalize, departed peers (`PeerGone`), collective aborts |
//! | [`comm_ids`] | communicator ids in use, freed once their last user ends |
//! | [`fabric`] | the fabric and how its peers stand |
//! | [`shmcoll`] | hooks of the shared-memory collectives and the doorbell |
//! | [`stats`] | `TMPI_STATS=1` counters |
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
//! - a control message ([`Control`]: SSEND_ACK, CREDIT, COLL_ABORT) is one `NO_TAG` packet; control packets may
//!   appear between the packets of a data message, which they never disturb.
//! - a message of at least `TMPI_RNDV_THRESHOLD` bytes is a rendezvous: the sender registers
//!   its buffer (REMOTE_READ) through the MR cache and sends `TMH(RNDV) | RVH | key be64 |
//!   len be64`; the receiver, once the request matched (in the TM-SRQ, which asks for the
//!   read itself, or in software), sends an RDMA read request (a `PKT_RMA` packet, [`Rma`],
//!   as are all the answers below: each names the read, see [`rndv::read_name`]); the
//!   sender's side checks key, range and access in its fi_mr domain before a byte moves.
//!   Then the bytes move one of these ways:
//!   - streamed back through the ring (read responses, a pipelined copy-in/copy-out;
//!     reads below `TMPI_SINGLE_COPY_MIN`, or `TMPI_SINGLE_COPY=none`);
//!   - one memcpy through a shared heap (`World::alloc_shared`, see `rndv.rs` and
//!     `crate::heap`): a grant naming the sender's heap, or the sender's share written into
//!     the reader's heap, whatever the mode (a read pre-granted from the sender's heap into
//!     the reader's asks for that share from 64 KiB, as a pre-granted CMA read does);
//!   - single copy (CMA): the sender answers with a grant, and the reader copies the range
//!     with `process_vm_readv`; from 128 KiB on the grant splits it, and the sender writes
//!     the second half into the reader's buffer with `process_vm_writev` at the same time and
//!     says so (`WRITE_DONE`), so both cores copy. A pre-granted read (below 1 MiB) needs
//!     no grant: the reader copies at once, and from 32 KiB, unless the sender is reading
//!     from it too, it asks the sender for the end of the range (`READ_REQ` of the
//!     target's share) and copies the start meanwhile. A kernel refusal (EPERM/ENOSYS)
//!     turns single copy off for good and the affected part is streamed instead. Abandoning (scope unwind)
//!     a send whose buffer a reader was granted, or a receive a sender may be writing into,
//!     waits for that copy to end, so no process ever touches freed memory.
//!
//!   When all bytes are in, the receiver (or its TM-SRQ) sends `FIN` (the request's TMH and
//!   RVH), which completes the send and releases the registration.

mod adapt;
mod arrival;
mod comm_ids;
mod eager;
mod fabric;
mod leave;
mod nbc;
mod offload;
mod progress;
mod recv;
mod requests;
mod rndv;
mod shmcoll;
mod single_copy;
mod stats;
#[cfg(test)]
mod testkit;

use eager::{credit_per_peer, ctl_msg, Ctl, Incoming, OutData, OutMsg, UxMsg};
pub(crate) use fabric::Fabric;
use fabric::ProcessAlive;
pub(crate) use leave::Need;
use offload::wr_to_rid;
pub(crate) use progress::Backoff;
use requests::{wire_name, OwnedRecv, PlacedRndv, RecvPhase, RecvState, Req, ReqKind, SendPhase, SendState};
use stats::Stats;

use std::collections::VecDeque;
use std::sync::Arc;

use tmpi_transport::fabric::{Packet, PeerState, PKT_FIRST, PKT_LAST, PKT_RMA, PKT_WHOLE};
use tmpi_transport::mr::{Access, CacheConfig, CachedMr, Domain, DomainAttr, Monitor, MrCache, MrMode, RemoteOp};
use tmpi_transport::shm::cma;
use tmpi_transport::tm::{
    Arrival, Buffer, OpsWr, ReadId, RndvRequest, TmCap, TmCaps, TmSrq, Wc, WcFlags, WcOpcode, WcStatus, RNDV_REQ_LEN, RVH_LEN_IN_META,
};
use tmpi_transport::wire::{
    Control, HeapPlace, ReadMode, ReadRequest, Rma, Rvh, TmOp, Tmh, CONTROL_MAX_LEN, RMA_MAX_LEN, RMA_RESP_HDR_LEN, RVH_LEN, TMH_LEN,
};

use crate::buffer::{OwnedBuf, RawBuf, RawBufMut};
use crate::config::Config;
use crate::error::{Error, Result};
use crate::matching::{self, Arrived, Matcher, Posted, RecvId, SwMatcher};
use crate::slab::{Key, Slab};
use crate::{Rank, Status, Tag};

/// `app_ctx` bit of a synchronous send: the receiver acknowledges the match.
const SYNC_FLAG: u32 = 1 << 31;
/// Collectives whose abort notices are remembered.
const ABORTS_KEPT: usize = 64;
/// Bits of a request's slot index in its wire name; the 11 bits above carry the low bits of
/// its generation, so a stale notice never completes the request that reuses the slot.
const WIRE_IDX_BITS: u32 = 20;
const WIRE_IDX_MASK: u32 = (1 << WIRE_IDX_BITS) - 1;
const WIRE_GEN_MASK: u32 = (1 << 11) - 1;
/// Requests that can be named on the wire (synchronous and rendezvous sends) at once.
pub(crate) const MAX_NAMED_REQUESTS: usize = 1 << WIRE_IDX_BITS;
/// SRQ buffers kept posted; each unexpected message takes one and software reposts it.
const SRQ_DEPTH: usize = 64;
/// Capacity of each SRQ buffer: unexpected messages are copied into memory software
/// allocates per message, so the modelled buffer never truncates.
const SRQ_BUF_LEN: usize = usize::MAX / 4;
/// Single-copy reads of at least this many bytes are split: the reader copies the first half,
/// the target (otherwise idle until FIN) writes the second half, so both cores copy.
const CMA_SPLIT_MIN: usize = 128 * 1024;
/// ...and from this many bytes, a read the target was asked for (not pre-granted) when it
/// has no reads of its own in flight. A pre-granted read (below [`CMA_PREGRANT_MAX`]) is not
/// asked for: asking and then splitting cost `osu_latency` 1.40x the time at 16 KiB, 1.09x at
/// 32 KiB; from [`CMA_SHARE_MIN`] it is shared instead, without a round trip.
const CMA_SPLIT_WINDOW_MIN: usize = 32 * 1024;
/// ...but below this size not while the target has reads of its own in flight (see
/// `State::serve_read`).
const CMA_SPLIT_BUSY_MAX: usize = 1 << 20;
/// ...nor below [`CMA_SPLIT_DEEP_MAX`] while the target has this many reads of its own in
/// flight: with a queue that deep on both sides there is no idle tail for the split to fill.
const CMA_SPLIT_DEEP: usize = 16;
/// See [`CMA_SPLIT_DEEP`]: from this size the split pays even then (`osu_bibw` 8-64 MiB
/// took 1.3-1.7x the time without it). Was 4 MiB: not splitting 4 MiB either moved 1.17-1.18x
/// the bytes in `osu_bibw` (two runs of 5, `bench/results/p2p-2026-11-27e.md`).
const CMA_SPLIT_DEEP_MAX: usize = 8 << 20;
/// A pre-granted read of at least this many bytes is split without a round trip: the
/// reader asks the target for its share ([`ReadMode::Share`]) and starts copying its own at
/// once, while the target (waiting for FIN) writes the rest. So is one behind other reads
/// (a window), unless the target is reading from this rank too (`State::peer_reading`): `osu_bw` 32/64 KiB 1.15/1.16x the bytes of asking for a split,
/// `osu_bibw` level, where a share in both directions took 0.72-0.80x.
const CMA_SHARE_MIN: usize = 32 * 1024;
/// A rendezvous below this many bytes goes out pre-granted for single copy (see
/// `State::may_pregrant`), shared by [`CMA_SHARE_MIN`]'s rules. From it on, asking pays:
/// the target starts its half as it grants, and the halves are even (`osu_latency` 2/4 MiB
/// 1.06/1.04x the time pre-granted); below it the round trip is the larger cost (128/256/512
/// KiB 0.92/0.95/0.97x the time pre-granted, 9 runs; `osu_bw` and `osu_bibw` level).
const CMA_PREGRANT_MAX: usize = 1 << 20;
/// A streamed read of at least this many bytes (every rendezvous at the default threshold),
/// among other reads in flight, is copied out of the rings with non-temporal stores
/// ([`tmpi_transport::shm::copy_streaming`]) where the rings carry packets larger than
/// [`STREAM_NT_PACKET_OVER`] (4 MiB rings, the default up to 4 ranks, carry 1 MiB packets
/// less a record header): `osu_bw` 1-8 MiB moved 1.4-2.0x the bytes of plain copies out of
/// the same rings (`bench/results/p2p-2026-11-27e.md`), and from 256 KiB rather than 1 MiB,
/// `osu_bw` 256/512 KiB 1.50/1.59x and `osu_bibw` 1.13/1.20x (`p2p-2026-11-27f.md`). Out of
/// smaller packets (1 MiB rings) the same stores moved 0.56-0.72x the bytes (`osu_bibw -W 8`
/// 1-8 MiB), so there, and for a lone read, they start at half the L3 as before
/// ([`tmpi_transport::shm::streaming_copy_min`]). Where only one rank of the pair reads
/// (`osu_bw`), a quiet host later measured the opposite from 256 KiB to 1 MiB, so there
/// windows go around the cache from [`STREAM_NT_ONE_WAY_MIN`].
const STREAM_NT_MIN: usize = 256 << 10;
/// See [`STREAM_NT_MIN`].
const STREAM_NT_PACKET_OVER: usize = 512 << 10;
/// Where the reading rank does not serve reads of its peer at the same time (`osu_bw`, not
/// `osu_bibw`), streamed reads in a window go around the cache only from this size: on a
/// quiet host (cache line 43 ns) `osu_bw` 256/512 KiB moved 1.34/1.18x the bytes with plain
/// stores (48.6/44.8 against 36.4/37.8 GB/s, 3 interleaved runs; 1 MiB level, 2-8 MiB
/// 0.74-0.78x), while `osu_bibw` needs them from [`STREAM_NT_MIN`] (256 KiB-1 MiB 1.41-1.86x
/// the bytes with them). A window's 64 receive slots (distinct, in tmpi's `osu_bw` and in
/// the C peers' `bw` alike) take 16 MiB at 256 KiB, which the 32 MiB L3 holds; the earlier
/// measurement of the one-way case from 256 KiB was on a noisy host.
/// Not from 1 MiB though: with plain stores at 512 KiB the first period of the rings there
/// timed slow now and then (235 against single copy's 163 thousandths of a tick per byte),
/// single copy was chosen and carried up to 1-4 MiB (`tmpi-compare`'s short `osu_bw` run at
/// 18-21 GB/s from 512 KiB; 2 of 12 runs with 1 MiB here, 0 of 8 with 512 KiB). Plain stores
/// at 512 KiB again, with no choice carried from 512 KiB to 1 MiB, moved `osu_bw` 512 KiB at
/// 43.8-47.6 GB/s in 11 quiet runs and at 19.5-28.7 in 7 others (2 of those with exactly the
/// fast runs' operations, the rings chosen; 2 chose single copy), where non-temporal stores
/// move 32.8-37.0. Eager 512 KiB messages show the same two levels (17-21 against 41-49
/// GB/s, same operations): likely where the pages of the receive buffer and of the rings
/// fall in the 1 MiB L2, which changes from run to run (`bench/results/p2p-2026-11-28.md`,
/// session 32).
const STREAM_NT_ONE_WAY_MIN: usize = 512 << 10;

/// An eager message of at least this many bytes that lands in a posted receive while others
/// are posted (a window) is copied out of the ring with non-temporal stores where this rank
/// sends its peer such messages too (`osu_bibw`), as streamed reads are from
/// [`STREAM_NT_MIN`] there: `osu_bibw` 512 KiB (eager since the advice reaches the 512 KiB
/// class) moved 35.6 against 28.0 GB/s with plain stores (5 interleaved runs, medians; Open
/// MPI without CMA 28.2). Not one way: copying every such packet so, `osu_bw` 256/512 KiB
/// moved 0.82/0.92x the bytes, its receive buffers staying in the cache
/// (`bench/results/p2p-2026-11-28.md`, session 34).
const EAGER_NT_MIN: usize = 512 << 10;
/// A peer that received such a message from this rank within this many of its arrivals here
/// counts as sending both ways (see `State::eager_both_ways`).
const EAGER_BOTH_WAYS_WITHIN: u64 = 64;

/// The smallest streamed read copied out with non-temporal stores when the fabric's largest
/// packet is `max_packet` bytes (see [`STREAM_NT_MIN`]).
fn stream_nt_min(max_packet: usize) -> usize {
    if max_packet > STREAM_NT_PACKET_OVER {
        STREAM_NT_MIN
    } else {
        tmpi_transport::shm::streaming_copy_min()
    }
}
/// Whether a streamed read of `n` bytes is copied out of the rings with non-temporal stores
/// ([`tmpi_transport::shm::copy_streaming`]): from half the L3 always, and from `nt_min`
/// ([`stream_nt_min`]) among other reads in flight (`windowed`), where the peer reads from
/// this rank at the same time (`both_ways`), else from [`STREAM_NT_ONE_WAY_MIN`].
fn copies_out_around_cache(n: usize, windowed: bool, both_ways: bool, nt_min: usize) -> bool {
    let window_min = if both_ways { nt_min } else { nt_min.max(STREAM_NT_ONE_WAY_MIN) };
    n >= tmpi_transport::shm::streaming_copy_min() || (windowed && n >= window_min)
}
/// A peer that sent a FIN within this many of our reads is reading from us (see
/// `State::peer_reading`).
const PEER_READING_WITHIN: u64 = 64;
/// Software syncs the TM-SRQ at least once every this many unexpected messages.
const FORCED_SYNC_EVERY: u32 = 1 << 14;

pub(crate) type ReqId = Key;

/// The world ranks of a communicator's members, by rank in the communicator (one word, so
/// that [`Peers`] is two).
pub(crate) type WorldRanks = Arc<Vec<usize>>;

/// Whom a receive or probe waits for, in world ranks: one rank, or any member of a
/// communicator.
///
/// Two scalars, so that it travels in registers: as an enum of a rank and a
/// slice's `Arc` it was three words, copied on every posted receive through the stack
/// with 16-byte loads over 8-byte stores, which stall (a third of the time of posting a
/// receive, `comm_window_cost`).
#[derive(Clone, Debug)]
pub(crate) struct Peers {
    /// The one world rank, or [`Peers::ANY`].
    one: usize,
    /// With [`Peers::ANY`], the members' world ranks (`None`: the world's ranks).
    members: Option<WorldRanks>,
}

impl Peers {
    /// `one` of a receive from any member.
    const ANY: usize = usize::MAX;

    /// World rank `w` alone.
    #[inline]
    pub(crate) fn rank(w: usize) -> Peers {
        Peers { one: w, members: None }
    }

    /// Any member of the communicator whose world ranks are `members` (`None`: the world).
    #[inline]
    pub(crate) fn any(members: Option<WorldRanks>) -> Peers {
        Peers { one: Peers::ANY, members }
    }

    /// The one rank waited for, `None` for any member.
    #[inline]
    pub(crate) fn one(&self) -> Option<usize> {
        (self.one != Peers::ANY).then_some(self.one)
    }

    /// Whether a message whose match key names comm-local rank `local` may come from world
    /// rank `world` (the fabric's sender): a peer cannot speak for another.
    #[inline]
    fn admits(&self, local: usize, world: usize) -> bool {
        match (self.one(), &self.members) {
            (Some(w), _) => w == world,
            (None, None) => local == world,
            (None, Some(m)) => m.get(local) == Some(&world),
        }
    }
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
    /// The grant went with the request itself ([`RndvRequest::pregranted`]): the reader may
    /// copy without asking, so abandoning the send revokes it first ([`Control::Revoke`]).
    pregranted: bool,
    /// This rank streamed (some of) it to the reader through the rings: its FIN ends a read
    /// that went that way (see `adapt::Epochs::peer_read`).
    streamed: bool,
}

/// What a rendezvous request announces.
#[derive(Debug, Clone, Copy)]
struct RndvInfo {
    tmh: Tmh,
    rvh: Rvh,
    key: u64,
    len: usize,
    /// The sender checked the range for our single-copy read already
    /// ([`RndvRequest::pregranted`]).
    pregranted: bool,
}

impl RndvInfo {
    fn parse(req: &[u8]) -> Result<Self> {
        let tmh = Tmh::decode(req)?;
        let rvh = Rvh::decode(req.get(TMH_LEN..).unwrap_or(&[]))?;
        // The RVH is what the hardware path reads; software reads the same, except the length
        // of a payload the RVH cannot hold (`RVH_LEN_IN_META`), which is in the meta-data.
        let len = RndvRequest::payload_len(req).ok_or_else(|| malformed("rendezvous request of 4 GiB or more without its length"))?;
        let len = usize::try_from(len).map_err(|_| malformed("rendezvous length overflows"))?;
        Ok(RndvInfo { tmh, rvh, key: u64::from(rvh.rkey), len, pregranted: RndvRequest::pregranted(req) })
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
    /// A pre-granted single copy started without a request: nothing was asked of the target,
    /// which may revoke the grant ([`Control::Revoke`]) until the copy is done (except its
    /// share, when `split < n`: asked with [`ReadMode::Share`], and the target's to refuse).
    at_once: bool,
    /// The target revoked its pre-grant while its share was asked for: the answer goes back
    /// when the read ends, after its FIN.
    revoke_ack: bool,
    /// How [`adapt::Epochs`] placed the read (`TMPI_SINGLE_COPY_MIN=auto`); it must hear of
    /// its end.
    placed: Option<adapt::Placed>,
}

/// A range of a rendezvous send buffer being streamed to a reader.
struct RmaOut {
    dest: usize,
    /// The reader's name for the read ([`Rma::read`]).
    read: u64,
    buf: RawBuf,
    off: usize,
    /// Offset of `buf` within the read.
    base: usize,
}

/// The target's share of a split single-copy read: `buf` goes to `dst` in the reader.
#[derive(Clone, Copy)]
struct CmaWrite {
    dest: usize,
    /// The reader's name for the read ([`Rma::read`]).
    read: u64,
    buf: RawBuf,
    /// Reader's address of the read's first byte, and the offset of `buf` within the read.
    dst: u64,
    base: usize,
}

/// Engine state other than the fabric, split from [`Engine`] so that the fabric's poll
/// callback ([`State::on_packet`]) can borrow it while the fabric is borrowed for the poll.
///
/// Who owns what: the arrival side (`State`, inside the poll callback) may not touch the
/// fabric, so what it needs sent goes into queues that [`Engine::progress`] drains right
/// after the poll: control packets, FINs and RMA requests into `ctlq`, read responses into
/// `rma_out`, single-copy work into `cma_q`/`cma_w`. The callback cannot return an error
/// either: it parks the first one in `error`, and `progress` reports it. Everything else
/// (requests, unexpected messages, matching, the TM-SRQ, credit) belongs to `State` alone.
/// The data messages waiting for ring space (`Engine::out`) are the sending side's only.
struct State {
    rank: usize,
    /// Posted receives (software side; see [`crate::matching`]).
    matcher: SwMatcher<ReqId, Key>,
    /// Every pending request (send or receive), by [`ReqId`].
    reqs: Slab<Req>,
    /// Messages that arrived before their receive.
    ux: Slab<UxMsg>,
    /// Per source: where the continuation packets of its current message go.
    incoming: Vec<Incoming>,
    /// Small packets to send, filled by the arrival side, drained by [`Engine::flush_ctl`].
    ctlq: VecDeque<(usize, Ctl)>,
    stats: Stats,
    /// The first error the poll callback met; [`Engine::progress`] returns it.
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
    /// Rendezvous reads this rank has started, and per world rank their count when that rank
    /// last sent a FIN for a send of ours (0: never): whether it is reading from us (see
    /// `State::peer_reading`).
    reads_begun: u64,
    fin_seen: Vec<u64>,
    /// Eager messages of [`EAGER_NT_MIN`] or more that arrived into posted receives, and per
    /// world rank their count (plus one; 0: never) when this rank last started one of that
    /// size to it: whether the two send each other such messages (see
    /// `State::eager_both_ways`).
    big_eager_in: u64,
    big_eager_out: Vec<u64>,
    /// Registration cache (sender side of rendezvous) and its domain (target key checks).
    mr: MrCache,
    domain: Domain,
    /// Read responses to stream.
    rma_out: VecDeque<RmaOut>,
    /// Single-copy reads may be tried (`TMPI_SINGLE_COPY=cma` and the kernel has not refused).
    cma: bool,
    /// `TMPI_SINGLE_COPY_MIN`: smaller reads stream through the ring; `None`: `copy` chooses.
    cma_min: Option<usize>,
    /// Single copy or the rings, by measurement (`TMPI_SINGLE_COPY_MIN=auto`).
    copy: adapt::Epochs,
    /// Streamed reads of at least this many bytes are copied out with non-temporal stores
    /// ([`stream_nt_min`]).
    stream_nt_min: usize,
    /// Sender side, per destination: messages of at least this many bytes go by rendezvous
    /// (`TMPI_RNDV_THRESHOLD`, or with auto the adaptive start a receiver's
    /// `Control::EagerBelow` raises; see [`adapt`]).
    rndv_from: Vec<usize>,
    /// Receiver side: `TMPI_RNDV_THRESHOLD` is auto (senders of this host may start low and
    /// are advised), and the highest `Control::EagerBelow` sent to each peer.
    rndv_adaptive: bool,
    advised: Vec<usize>,
    /// Messages of at least this many bytes always go by rendezvous, whatever a receiver
    /// advises (`Config::advice_ceiling`).
    rndv_ceiling: usize,
    /// Per world rank: its memory is reachable by single copy (same host; not over TCP).
    cma_peers: Vec<bool>,
    /// Reads granted by their target, waiting for this rank to copy the data (CMA).
    cma_q: VecDeque<Key>,
    /// This rank's shares of split single-copy reads, to write into the readers.
    cma_w: VecDeque<CmaWrite>,
    /// The shared heap: this rank's, the peers' it mapped, and grants in flight through them.
    heaps: crate::heap::Heaps,
    /// Bytes held by unexpected messages (payload plus bookkeeping), and the budget
    /// (`TMPI_UNEXPECTED_MAX`) above which messages that no posted receive matches are left
    /// in the sender's ring.
    ux_bytes: usize,
    /// Eager credit (bytes) this rank may still send to each peer before it must switch to
    /// rendezvous; refilled by the peer's `Control::Credit` as it consumes what was sent.
    credits: Vec<usize>,
    /// Credit this rank owes each peer for eager messages it consumed, returned in batches.
    owed: Vec<usize>,
    /// Batch size of credit returns.
    credit_batch: usize,
    /// An error met while the engine could not report it (abandon waits): reported by the
    /// next progress.
    deferred: Option<Error>,
    /// Buffers of [`UX_POOL_LEN`] bytes for small unexpected messages, kept for reuse.
    ux_pool: Vec<Vec<u8>>,
    /// Collective calls that failed elsewhere because a rank departed: (collective context,
    /// sequence number, departed rank), the most recent [`ABORTS_KEPT`].
    aborts: VecDeque<(u32, u32, usize)>,
}

/// Unexpected messages up to this many bytes are stored in recycled buffers of this capacity.
const UX_POOL_LEN: usize = 4096;
/// Recycled unexpected-message buffers kept per rank (at most 1 MiB).
const UX_POOL_KEEP: usize = 256;

/// Longest eager message a peer may announce: its credit never exceeds 2^31 bytes.
const MAX_EAGER_LEN: usize = 1 << 31;
/// Bookkeeping bytes counted per unexpected message on top of its payload (and charged to
/// the sender's credit with every eager message).
const UX_OVERHEAD: usize = 128;

/// One rank's engine.
pub(crate) struct Engine {
    fabric: Fabric,
    st: State,
    /// Per destination: data messages waiting for ring space, in order.
    out: Vec<VecDeque<OutMsg>>,
    /// Messages in `out`, all destinations together.
    out_pending: usize,
    max_packet: usize,
    /// Whether a multi-packet stream that is alone in its queue is cut into pipelined chunks
    /// (shared memory; see [`eager::stream_chunk`]).
    pipelined: bool,
    size: usize,
    spin: u32,
    pub(crate) cfg: Config,
    /// Communicator ids this rank uses (see [`comm_ids`]).
    comm_ids: comm_ids::CommIds,
    /// Non-blocking polls since the last liveness check (see [`Engine::idle_check`]).
    idle_calls: u32,
    /// Peers whose process was found dead (sticky), and the next peer to look at.
    dead: Vec<bool>,
    next_probe: usize,
    /// Non-blocking collectives in flight (progressed by `Engine::progress` while any is).
    nbc: Slab<crate::nbc::Sched>,
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
        let nt_min = stream_nt_min(max_packet);
        let pipelined = matches!(fabric, Fabric::Shm(_));
        let cma_peers: Vec<bool> = (0..size).map(|r| fabric.single_copy_to(r)).collect();
        let heaps = crate::heap::Heaps::new(cfg.shared_heap, size, |r| cma_peers[r]);
        let oversubscribed = size > crate::sys::usable_cpus();
        let spin = cfg.poll_spin.unwrap_or_else(|| progress::auto_spin(&fabric, oversubscribed));
        // Rendezvous starts low towards the peers of this host while it is not oversubscribed
        // (a rank that must wait its turn for a core to serve a read is better sent eagerly).
        let rndv_from = (0..size)
            .map(|d| {
                let low = cfg.rndv_adaptive() && d != rank && !oversubscribed && cma_peers[d];
                if low {
                    adapt::RNDV_LOW.min(cfg.rndv_ceiling())
                } else {
                    cfg.rndv_ceiling()
                }
            })
            .collect();
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
                reads_begun: 0,
                fin_seen: vec![0; size],
                big_eager_in: 0,
                big_eager_out: vec![0; size],
                mr,
                domain,
                rma_out: VecDeque::new(),
                cma: cfg.single_copy,
                cma_min: cfg.single_copy_min,
                copy: adapt::Epochs::paired().streaming_from(nt_min),
                stream_nt_min: nt_min,
                rndv_from,
                rndv_adaptive: cfg.rndv_adaptive(),
                advised: vec![0; size],
                rndv_ceiling: cfg.advice_ceiling(),
                cma_peers,
                cma_q: VecDeque::new(),
                cma_w: VecDeque::new(),
                heaps,
                ux_bytes: 0,
                credits: vec![credit_per_peer(cfg.unexpected_max, size); size],
                owed: vec![0; size],
                credit_batch: (credit_per_peer(cfg.unexpected_max, size) / 4).max(1),
                deferred: None,
                ux_pool: Vec::new(),
                aborts: VecDeque::new(),
            },
            out: (0..size).map(|_| VecDeque::new()).collect(),
            out_pending: 0,
            max_packet,
            pipelined,
            size,
            spin,
            cfg,
            comm_ids: comm_ids::CommIds::new(),
            idle_calls: 0,
            dead: vec![false; size],
            next_probe: 0,
            nbc: Slab::new(),
        })
    }

    pub(crate) fn rank(&self) -> usize {
        self.st.rank
    }

    pub(crate) fn size(&self) -> usize {
        self.size
    }
}

fn malformed(what: &'static str) -> Error {
    Error::Transport(tmpi_transport::Error::Malformed { what })
}

/// A packet from `src` that breaks the protocol.
#[cold]
fn malformed_from(src: usize, what: &'static str) -> Error {
    Error::Protocol { rank: src, what }
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
        let k = Key::new(5, 3);
        let n = wire_name(k);
        assert_eq!(n & WIRE_IDX_MASK, 5);
        assert_eq!(n >> WIRE_IDX_BITS, 3);
        assert_eq!(n & SYNC_FLAG, 0);
        let k2 = Key::new(WIRE_IDX_MASK, u32::MAX);
        assert_eq!(wire_name(k2) & SYNC_FLAG, 0);
    }

    /// Windows of streamed reads go around the cache from 256 KiB where both ranks read
    /// (`osu_bibw`), from 512 KiB where one does (`osu_bw`), and a lone read only from half the
    /// L3; out of small packets (1 MiB rings), only from half the L3.
    #[test]
    fn windows_go_around_the_cache_from_a_size_that_depends_on_the_direction() {
        let big = tmpi_transport::shm::streaming_copy_min();
        let nt = stream_nt_min(1 << 20);
        assert_eq!(nt, STREAM_NT_MIN);
        for (n, windowed, both, around) in [
            (256 << 10, true, true, true),
            (256 << 10, true, false, false),
            (512 << 10, true, false, true),
            ((512 << 10) - 1, true, false, false),
            (1 << 20, true, false, true),
            (1 << 20, false, true, false),
            ((128 << 10) - 1, true, true, false),
            (big - 1, false, true, false),
            (big, false, false, true),
        ] {
            // (Half the L3 is at least 512 KiB; a read of that size always goes around.)
            let around = around || n >= big;
            assert_eq!(copies_out_around_cache(n, windowed, both, nt), around, "{n} windowed {windowed} both {both}");
        }
        let small = stream_nt_min(256 << 10);
        assert!(!copies_out_around_cache(big - 1, true, true, small));
        assert!(copies_out_around_cache(big, true, false, small));
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
        assert!(Peers::rank(3).admits(0, 3));
        assert!(!Peers::rank(3).admits(3, 2));
        assert!(Peers::any(None).admits(2, 2));
        assert!(!Peers::any(None).admits(1, 2));
        let m: WorldRanks = Arc::new(vec![4, 7]);
        assert!(Peers::any(Some(m.clone())).admits(1, 7));
        assert!(!Peers::any(Some(m.clone())).admits(1, 4));
        assert!(!Peers::any(Some(m)).admits(2, 4));
        assert_eq!((Peers::rank(5).one(), Peers::any(None).one()), (Some(5), None));
    }
}
