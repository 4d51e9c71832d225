//! The progress engine of one rank: fabric, matching, protocols, requests.
//!
//! Laid out by protocol stage, as UCX's `ucp/tag/` is; each stage is a struct that owns its
//! state, and this file holds what every stage shares (`State`: rank, matcher, requests,
//! statistics, the outbox and the stage structs) and the wire constants:
//!
//! | file | stage |
//! |---|---|
//! | [`progress`] | one round of progress, waiting and back-off |
//! | [`arrival`] | every packet from the fabric, through the soft TM-SRQ; control dispatch |
//! | [`recv`] | posting receives (the offload decision), probing |
//! | [`eager`] | eager send (the data-message queues) and receive |
//! | [`credit`] | eager flow control |
//! | [`unexpected`] | unexpected messages and their buffers |
//! | [`outbox`] | what leaves the engine besides data messages, and failures |
//! | [`rndv`] | rendezvous: the reader, the target, single copy, adapt, threshold, and `way` (the rules) |
//! | [`offload`] | the soft TM-SRQ's tagged buffers, completions and sync |
//! | [`requests`] | request naming, completion, cancel and abandon |
//! | [`leave`] | finalize, departed peers (`PeerGone`), collective aborts |
//! | [`comm_ids`] | communicator ids in use, freed once their last user ends |
//! | [`nbc`] | non-blocking schedules, through the [`Schedule`] trait |
//! | [`fabric`] | the fabric and how its peers stand |
//! | [`shmcoll`] | hooks of the shared-memory collectives and the doorbell |
//! | [`stats`] | `TMPI_STATS=1` counters |
//! | `ofi` | point-to-point matched by the OFI provider (feature `ofi`, `TMPI_OFI_MATCHING`) |
//!
//! `DESIGN.md` at the repository's root draws how the stages fit together.
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
//!   - one memcpy through a shared heap (`World::alloc_shared`, see [`rndv`] and
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

mod arrival;
mod comm_ids;
mod credit;
mod eager;
mod fabric;
mod leave;
mod nbc;
mod offload;
#[cfg(feature = "ofi")]
mod ofi;
mod outbox;
mod progress;
mod recv;
mod requests;
mod rndv;
mod shmcoll;
mod stats;
#[cfg(test)]
mod testkit;
mod unexpected;

use credit::Credit;
use eager::{OutData, OutMsg};
pub(crate) use fabric::AnyFabric;
use fabric::{Fabric, PeerCaps, ProcessAlive, Wakeup};
pub(crate) use leave::Need;
pub(crate) use nbc::Schedule;
use offload::{wr_to_rid, Offload};
use outbox::Outbox;
pub(crate) use progress::Backoff;
use requests::{wire_name, OwnedRecv, PlacedRndv, RecvPhase, RecvState, Req, ReqKind, SendPhase, SendState};
use rndv::reader::Reads;
use rndv::target::Target;
use rndv::threshold::Threshold;
use rndv::way::EAGER_NT_MIN;
use rndv::{read_key, CmaWrite, RmaOut, RndvInfo, RndvSend, Ways, RNDV_HDR_MAX};
pub(crate) use shmcoll::Slot;
use stats::Stats;
use tmpi_trace::event::Proto;
use unexpected::{Incoming, Unexpected, UxMsg};

use std::collections::VecDeque;
use std::sync::Arc;

use tmpi_transport::fabric::{Packet, PeerState, PKT_FIRST, PKT_LAST, PKT_RMA, PKT_WHOLE};
use tmpi_transport::mr::{Access, CacheConfig, CachedMr, Domain, DomainAttr, Monitor, MrCache, MrMode, RemoteOp};
use tmpi_transport::shm::cma;
use tmpi_transport::tm::{Arrival, Buffer, OpsWr, ReadId, TmCap, TmCaps, TmSrq, Wc, WcFlags, WcOpcode, WcStatus};
use tmpi_transport::wire::{
    Control, FabricKey, Fin, HeapPlace, ReadMode, ReadRequest, Rma, RndvRequest, Rvh, TmOp, Tmh, CONTROL_MAX_LEN, RMA_MAX_LEN,
    RMA_RESP_HDR_LEN, RNDV_REQ_LEN, RVH_LEN_IN_META, TMH_LEN,
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

/// Engine state other than the fabric, split from [`Engine`] so that the fabric's poll
/// callback ([`State::on_packet`]) can borrow it while the fabric is borrowed for the poll.
///
/// Who owns what: the core (rank, matcher, requests, counters, collective aborts) and one
/// struct per stage, each in the file of its stage with private fields: the stages talk
/// through methods and the [`Outbox`]. The arrival side (inside the poll callback) may not
/// touch the fabric, so whatever it needs sent, and any failure it meets, goes into the
/// outbox, which [`Engine::progress`] empties. The data messages waiting for ring space
/// (`Engine::out`) are the sending side's only.
struct State {
    rank: usize,
    /// Posted receives (software side; see [`crate::matching`]).
    matcher: SwMatcher<ReqId, Key>,
    /// Every pending request (send or receive), by [`ReqId`].
    reqs: Slab<Req>,
    stats: Stats,
    /// What leaves the engine other than data messages, and the first failure not reported
    /// yet (see [`outbox`]).
    outbox: Outbox,
    /// The soft TM-SRQ and the offload policy ([`offload`]).
    offload: Offload,
    /// Messages that arrived before their receive, and where continuations go ([`unexpected`]).
    ux: Unexpected,
    /// Eager flow control ([`credit`]).
    credit: Credit,
    /// Where rendezvous starts, and the advice that moves it ([`rndv::threshold`]).
    threshold: Threshold,
    /// Rendezvous reads in progress ([`rndv::reader`]).
    reads: Reads,
    /// Registration cache and fi_mr domain of rendezvous sends ([`rndv::target`]).
    target: Target,
    /// How rendezvous bytes move: single copy, the rings, shared heaps ([`rndv`]).
    ways: Ways,
    /// Collective calls that failed elsewhere, the most recent [`ABORTS_KEPT`].
    aborts: VecDeque<Abort>,
}

/// A collective call another member gave up (see [`Engine::abort_collective`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Abort {
    /// The communicator's collective context.
    ctx: u32,
    /// The call's sequence number: its low 16 bits when a rank departed, all 32 when a
    /// member failed the call itself.
    seq: u32,
    /// The departed rank, or the member that failed (world ranks).
    rank: usize,
    /// `rank` failed the call with an error of its own rather than departing.
    failed: bool,
}

/// Longest eager message a peer may announce: its credit never exceeds 2^31 bytes.
const MAX_EAGER_LEN: usize = 1 << 31;
/// Bookkeeping bytes counted per unexpected message on top of its payload (and charged to
/// the sender's credit with every eager message).
const UX_OVERHEAD: usize = 128;

/// One rank's engine.
pub(crate) struct Engine {
    fabric: AnyFabric,
    st: State,
    /// Per destination: data messages waiting for ring space, in order.
    out: Vec<VecDeque<OutMsg>>,
    /// Messages in `out`, all destinations together.
    out_pending: usize,
    /// The largest packet to every peer (the small-message path's bound; the other paths
    /// take each peer's own, [`PeerCaps::max_packet`]).
    max_packet: usize,
    /// What the fabric offers towards each world rank: its largest packet and parts, single
    /// copy, and whether a multi-packet stream alone in its queue is cut into pipelined
    /// chunks (see [`eager::stream_chunk`]).
    peers: Vec<PeerCaps>,
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
    nbc: Slab<Box<dyn Schedule>>,
    /// Matching by the OFI provider, when on (see `ofi`).
    #[cfg(feature = "ofi")]
    pm: Option<ofi::ProvMatch>,
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
    pub(crate) fn new(fabric: AnyFabric, rank: usize, size: usize, cfg: Config) -> Result<Self> {
        let peers: Vec<PeerCaps> = (0..size).map(|r| fabric.peer_caps(r)).collect();
        let local: Vec<bool> = peers.iter().map(|c| c.single_copy).collect();
        let oversubscribed = size > crate::sys::usable_cpus();
        let st = State {
            rank,
            matcher: SwMatcher::new(),
            reqs: Slab::new(),
            stats: Stats::default(),
            outbox: Outbox::default(),
            offload: Offload::new(&cfg)?,
            ux: Unexpected::new(size),
            credit: Credit::new(cfg.unexpected_max, size),
            threshold: Threshold::new(&cfg, rank, &local, oversubscribed),
            reads: Reads::new(size),
            target: Target::new(&cfg)?,
            ways: Ways::new(&cfg, rank, &peers),
            aborts: VecDeque::new(),
        };
        Ok(Engine {
            max_packet: fabric.max_packet(),
            spin: cfg.poll_spin.unwrap_or_else(|| progress::auto_spin(&fabric, oversubscribed)),
            fabric,
            st,
            out: (0..size).map(|_| VecDeque::new()).collect(),
            out_pending: 0,
            peers,
            size,
            cfg,
            comm_ids: comm_ids::CommIds::new(),
            idle_calls: 0,
            dead: vec![false; size],
            next_probe: 0,
            nbc: Slab::new(),
            #[cfg(feature = "ofi")]
            pm: None,
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
