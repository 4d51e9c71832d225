//! What every fabric hands the runtime: packets, with a few flags (defined in [`crate::packet`]
//! and re-exported here); [`Fabric`], the trait every
//! fabric implements (shared memory, TCP, threads of one process, and the hybrid of shared
//! memory and TCP); and [`AnyFabric`], the one the engine drives, an enum of them whose calls
//! are a `match` each, so the shared-memory path stays monomorphic and inlined (no `dyn` call
//! per packet).
//!
//! What differs between fabrics is what they report, never their kind: per peer
//! ([`PeerCaps`]) the largest packet, how many parts a packet may be gathered from, whether
//! single copy reaches the peer's memory and whether a long stream to it is worth cutting into
//! pipelined pieces; for the rank ([`Wakeup`]) what ends its sleep; and ([`Caps`]) whether the
//! fabric matches tags or serves RMA reads itself, which the extension traits
//! [`TagMatching`] and [`RmaRead`] then provide (no fabric here does yet: a libfabric one
//! will).
//!
//! | file | what |
//! |---|---|
//! | `mod.rs` | the [`Fabric`] trait and its capabilities (packets and peer states re-exported) |
//! | [`any`] | [`AnyFabric`]: one of the fabrics, chosen at start-up |
//! | [`hybrid`] | [`HybridFabric`]: shared memory on this host, TCP to the others |
//! | `impls.rs` | [`Fabric`] for the shared-memory, TCP and in-process fabrics |

pub mod any;
pub mod hybrid;
mod impls;

pub use any::AnyFabric;
pub use hybrid::HybridFabric;

pub use crate::packet::{Packet, PeerState, PKT_FIRST, PKT_LAST, PKT_RMA, PKT_WHOLE};

use crate::error::{Error, Result};
use crate::shm::segment::Segment;

/// `TMPI_FABRIC`: which fabric links ranks.
pub const ENV_FABRIC: &str = "TMPI_FABRIC";

/// What `TMPI_FABRIC` asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FabricChoice {
    /// Shared memory between ranks of one host, TCP between hosts.
    #[default]
    Auto,
    /// Shared memory only (every rank must be on one host).
    Shm,
    /// TCP between every pair of ranks, even on one host (for testing).
    Tcp,
    /// libfabric's OFI fabric between every pair of ranks (cargo feature `ofi`; a build
    /// without it refuses this choice at `init`).
    Ofi,
}

impl FabricChoice {
    /// Parses `auto`, `shm`, `tcp` or `ofi` (in every build: whether the build has the OFI
    /// fabric is checked where the fabric is built).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] naming `TMPI_FABRIC` for anything else.
    pub fn parse(s: &str) -> Result<Self> {
        match s.trim() {
            "auto" | "" => Ok(FabricChoice::Auto),
            "shm" => Ok(FabricChoice::Shm),
            "tcp" => Ok(FabricChoice::Tcp),
            "ofi" => Ok(FabricChoice::Ofi),
            v => Err(Error::InvalidArgument(format!("{ENV_FABRIC}={v:?}: expected auto, shm, tcp or ofi"))),
        }
    }
}

/// What a fabric offers towards one peer ([`Fabric::peer_caps`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerCaps {
    /// The largest packet payload [`Fabric::try_send`] takes to this peer.
    pub max_packet: usize,
    /// Most parts one packet to this peer may be gathered from (three over TCP, one
    /// `sendmsg` with the frame header; any number into a ring or a channel).
    pub max_parts: usize,
    /// Single copy reaches the peer's memory (`process_vm_readv`/`writev`, a mapped heap):
    /// it runs on this host.
    pub single_copy: bool,
    /// The peer's core copies a packet out as soon as it is in (a shared ring it polls), so a
    /// long stream alone in its queue is best cut into pipelined pieces: the peer copies out
    /// one piece while this rank copies in the next.
    pub pipelined: bool,
}

/// What ends a waiting rank's sleep on a fabric ([`Fabric::wakeup`], [`Fabric::sleep`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wakeup {
    /// Nothing ends it early (threads over channels, a job of one rank): the rank yields as
    /// long as usual, then sleeps plainly.
    Nothing,
    /// Every packet sent to the rank rings its doorbell (shared memory), but no bell says
    /// that room to send freed up: the rank sleeps on it only while nothing of its own waits
    /// to go out.
    Doorbell,
    /// The rank sleeps in `ppoll` on its sockets: data, room for a send that found the
    /// kernel's buffer full, or a peer's end wake it. `all`: every peer is behind a socket;
    /// otherwise some are not (the hybrid fabric's shared-memory peers), and the rank yields
    /// before it sleeps and keeps its sleeps short.
    Sockets {
        /// Every peer can wake the sleep.
        all: bool,
    },
}

/// What a fabric does itself beyond carrying packets ([`Fabric::caps`]). Only the OFI
/// fabric (cargo feature `ofi`) matches tags, once its `enable_matching` is called, through
/// `ofi::p2p::TaggedP2p` (the engine does not drive it yet: it matches tags in the soft
/// TM-SRQ and software); none serves rendezvous reads itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Caps {
    /// The fabric matches tagged receives itself ([`TagMatching`]: `fi_trecv` with tag and
    /// ignore bits, `FI_PEEK`/`FI_CLAIM` probes, `fi_cancel`).
    pub tag_matching: bool,
    /// The fabric reads registered remote memory itself ([`RmaRead`]: `fi_read` from memory
    /// the target registered with `fi_mr_reg`), so rendezvous data needs no serving by the
    /// target's engine.
    pub rma_read: bool,
}

/// A fabric: packets to and from the other ranks of the job, how each peer stands, what
/// reaches it, and how a waiting rank sleeps. Ranks are world ranks.
///
/// The engine needs nothing else from a fabric; what differs between fabrics it learns from
/// [`Fabric::peer_caps`], [`Fabric::wakeup`] and [`Fabric::caps`], never from their kind.
pub trait Fabric {
    /// Tries to send one packet, the concatenation of `parts` (at most the peer's
    /// [`PeerCaps::max_parts`], at most [`PeerCaps::max_packet`] bytes), to `dest`, flagged
    /// `flags` (`PKT_*`) in a message of `total_len` bytes. `Ok(false)`: no room now
    /// (back-pressure: make progress and retry).
    ///
    /// # Errors
    /// A bad destination, an oversized packet; [`Error::PeerGone`] where the fabric learns it
    /// at once (in-process).
    fn try_send(&mut self, dest: usize, flags: u8, total_len: u64, parts: &[&[u8]]) -> Result<bool>;

    /// Hands waiting packets to `f` (at most a burst per source), which returns false to
    /// leave a packet where it is (it is offered again); returns how many were taken.
    ///
    /// # Errors
    /// A corrupt record or a malformed frame, naming the peer that sent it.
    fn poll<F: FnMut(Packet<'_>) -> bool>(&mut self, f: F) -> Result<usize>;

    /// Whether a packet from `src` waits to be read.
    fn pending_from(&mut self, src: usize) -> bool;

    /// Whether `dest` has taken every packet sent to it so far (a shared ring it drained:
    /// the receiver keeps up, or waits); false where the fabric cannot tell.
    fn drained(&mut self, _dest: usize) -> bool {
        false
    }

    /// The largest packet payload [`Fabric::try_send`] takes to every peer (the smallest of
    /// the peers' [`PeerCaps::max_packet`]).
    fn max_packet(&self) -> usize;

    /// What the fabric offers towards `rank`.
    fn peer_caps(&self, rank: usize) -> PeerCaps;

    /// How `rank` stands by what the fabric knows: attached, finalized (it sends nothing more,
    /// and that is fine), or failed (it left without finalizing). A local process that died
    /// without a word is found by its pid ([`Fabric::peer_pid`]).
    fn peer_state(&self, rank: usize) -> PeerState;

    /// Process id of `rank` when it runs on this host in another process (0 if it has not
    /// attached yet); this process's id for threads, self-delivery and peers on other hosts,
    /// whose liveness the fabric itself reports.
    fn peer_pid(&self, _rank: usize) -> u32 {
        std::process::id()
    }

    /// Records that this rank finalized cleanly (over TCP: hands the last bytes to the
    /// peers' kernels first).
    fn mark_finalized(&mut self);

    /// What ends this rank's sleep (see [`Fabric::sleep`]).
    fn wakeup(&self) -> Wakeup {
        Wakeup::Nothing
    }

    /// Sleeps for at most `timeout`, as [`Fabric::wakeup`] says: on the doorbell (asking
    /// `busy` about the job's segment after the sleep is announced, and not sleeping if it
    /// says something is there), in `ppoll` on the sockets (returning at once when a packet
    /// already waits in a user-space buffer or a shared ring), or plainly. Returns whether
    /// something may be ready; the caller polls either way. Call it for a doorbell only with
    /// nothing of this rank's own queued to go out.
    fn sleep(&mut self, timeout: std::time::Duration, _busy: impl FnOnce(&Segment) -> bool) -> bool {
        std::thread::sleep(timeout);
        false
    }

    /// Wakes `rank` if it sleeps on its doorbell, after a store it may wait for (a collective
    /// flag in the segment). Fenced: the wake-up cannot be lost.
    fn wake(&self, _rank: usize) {}

    /// Wakes those of `ranks` that sleep on their doorbells, after stores they may wait for:
    /// one fence for all of them.
    fn wake_all(&self, ranks: impl Iterator<Item = usize>) {
        for r in ranks {
            self.wake(r);
        }
    }

    /// The job's shared-memory segment when every rank of the job is in it under its world
    /// rank (its collective contexts and doorbells serve the shared-memory collectives).
    fn segment(&self) -> Option<&Segment> {
        None
    }

    /// Connections an empty poll asks the kernel about (one system call each): what a spin
    /// costs on this fabric.
    fn polled_connections(&self) -> usize {
        0
    }

    /// Connections refused at start-up for not proving the job secret.
    fn bad_connections(&self) -> u64 {
        0
    }

    /// What the fabric does itself beyond carrying packets.
    fn caps(&self) -> Caps {
        Caps::default()
    }

    /// A short name of the fabric, for reports (`shm`, `tcp`, `hybrid`, `local`, `single`,
    /// `ofi`, `hybrid-ofi`).
    fn name(&self) -> &'static str;

    /// The libfabric provider under the fabric (`tcp;ofi_rxm`, `verbs;ofi_rxm`), for reports;
    /// `None` for the fabrics of this crate's own.
    fn provider(&self) -> Option<&str> {
        None
    }
}

/// A fabric that matches tagged receives itself ([`Caps::tag_matching`]), as libfabric's
/// `FI_TAGGED` providers do: the engine would hand it receives instead of keeping them in the
/// soft TM-SRQ and the software matcher. No fabric implements it: the OFI fabric's matching
/// is `ofi::p2p::TaggedP2p` (owned buffers, copied out), and this raw-buffer shape is what a
/// path receiving straight into the user's buffer would need.
pub trait TagMatching: Fabric {
    /// A handle the fabric returns with a receive's completion (`fi_context`).
    type Context: Copy;

    /// Posts a receive of the messages whose tag equals `tag` in the bits `ignore` leaves
    /// set (`fi_trecv`), into `len` bytes at `buf`.
    ///
    /// # Safety
    /// `buf` must be valid for writes of `len` bytes, by nobody else, until the receive
    /// completes or is cancelled.
    ///
    /// # Errors
    /// The provider's refusal (no room, a bad buffer).
    unsafe fn post_tagged(&mut self, tag: u64, ignore: u64, buf: *mut u8, len: usize, ctx: Self::Context) -> Result<()>;

    /// The length and tag of a message matching `tag`/`ignore` that has arrived unexpected,
    /// if any (`FI_PEEK`); with `claim`, taken out of matching for one later receive
    /// (`FI_CLAIM`).
    fn probe_tagged(&mut self, tag: u64, ignore: u64, claim: bool) -> Option<(usize, u64)>;

    /// Cancels a posted receive (`fi_cancel`); whether it was still posted.
    fn cancel_tagged(&mut self, ctx: Self::Context) -> bool;
}

/// A fabric that reads registered remote memory itself ([`Caps::rma_read`]), as libfabric's
/// `FI_RMA` providers do (`fi_read` of memory the target registered with `fi_mr_reg`): a
/// rendezvous reader would then fetch the data without the target's engine serving it. No
/// fabric of this crate implements it yet.
pub trait RmaRead: Fabric {
    /// Reads `len` bytes at remote address `addr` under `key` of `src` into `dst`
    /// (`fi_read`); completion is reported by a later [`RmaRead::read_done`].
    ///
    /// # Safety
    /// `dst` must be valid for writes of `len` bytes, by nobody else, until the read is
    /// reported done.
    ///
    /// # Errors
    /// The provider's refusal (a bad key or range, no room).
    unsafe fn read(&mut self, src: usize, addr: u64, key: u64, dst: *mut u8, len: usize, id: u64) -> Result<()>;

    /// The next completed read, by the `id` given to [`RmaRead::read`], and whether it
    /// succeeded.
    fn read_done(&mut self) -> Option<(u64, bool)>;
}

#[cfg(test)]
mod tests;
