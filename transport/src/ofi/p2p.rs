//! MPI point-to-point on one endpoint, behind one interface ([`TaggedP2p`]) with two
//! matchers: the provider's ([`ProviderP2p`]: `fi_tsend`/`fi_trecv` with the [`super::tag`]
//! layout, probes by `FI_PEEK`, matched probes by `FI_CLAIM`, cancel by `fi_cancel`) and
//! software's ([`SoftP2p`]: every message goes to the provider untagged, into receive buffers
//! kept posted, and software matches it by MPI's rules).
//!
//! Both keep MPI's rules, which the differential test in `ofi/tests_p2p.rs` holds them to:
//!
//! - **Order.** A receive takes the oldest matching unexpected message; an arriving message
//!   goes to the earliest posted matching receive (MPI 3.1 §3.5). The provider keeps these
//!   for its own matching (`fi_tagged(3)`: "posted receive operations are matched in the
//!   order they were posted"; messages from one sender in send order with `FI_ORDER_SAS`,
//!   which `getinfo` asks for).
//! - **Truncation.** A message longer than its receive fills the receive and completes
//!   [`Outcome::Received`] with `truncated` set (MPI's `MPI_ERR_TRUNCATE`); the status
//!   counts the bytes received. The provider is never asked to truncate: its receives have
//!   room for any eager message and software cuts (see `ProviderP2p::room` for why).
//! - **Cancel.** A receive still posted completes [`Outcome::Cancelled`]; one already
//!   matched completes as received.
//!
//! Eager messages only: a message longer than the endpoint can take eagerly is refused here
//! (large messages stay with tmpi's rendezvous). What the provider's own large-message path
//! would offer instead, measured on libfabric 1.17's `tcp` (`tcp_large_message_peek_and_truncation`
//! in `ofi/tests_p2p.rs`): `FI_PEEK` reports a 1 MiB message's full length (so `MPI_Probe`
//! would see the true size without a header), and a receive too small for it completes
//! `FI_ETRUNC` without stalling the connection (only an eager message's truncation does).
//! So every message could go whole through the provider into receives of at least the eager
//! size: one matcher, non-overtaking by the provider, truncation reported by it.
//!
//! # For the engine (what driving this from `tmpi`'s engine must keep)
//!
//! - **One matcher per job, not per receive.** The soft TM-SRQ's policy lists some receives
//!   in the offload and keeps the rest in software, because software sees every message the
//!   hardware did not match (it lands in an SRQ buffer). A libfabric provider keeps its
//!   unexpected messages to itself (only `FI_PEEK` sees them), so a receive kept in software
//!   could not take a message the provider holds: with provider matching every receive goes
//!   to the provider, and [`Matching`] is chosen per provider for the whole job.
//! - **Every message through the same matcher.** Non-overtaking holds only among messages
//!   one matcher orders: a rendezvous request must be a tagged message with the same tag as
//!   an eager one (its data may then move by `fi_read` or tmpi's packet stream), never a
//!   packet of tmpi's own channel beside provider-matched eager messages.
//! - **Where it plugs in.** [`super::OfiFabric::enable_matching`] runs this matching on the
//!   packet fabric's own endpoint (packets keep their protocol field, completions go to their
//!   owner by the operation's `user` word), so the engine keeps its packet channel for
//!   control messages (synchronous-send acknowledgements, credits, aborts) and drives
//!   point-to-point through `TaggedP2p` on the same fabric. In the engine, a receive the
//!   provider completed is an unexpected message handed to the receive that was waiting for it:
//!   `State::take_unexpected(rid, ux)` (`runtime/src/engine/eager.rs`) already does the rest
//!   (copy, truncation, credit, acknowledgement, admission check, rendezvous read).
//! - **What the engine must still map.** The provider's source field and directed receives
//!   need world ranks (the receive's `Peers::one`), while tmpi's match key carries the rank in
//!   the communicator: send the TMH (with the key) as the first bytes of each message and the
//!   world rank in the provider's tag. Contexts must fit 16 bits (tmpi's key has 20). Messages
//!   to itself must go through the provider too (its own address in the address vector), or
//!   a wildcard receive posted there would never see them. Probes (`Engine::probe_now` takes
//!   `&self` today) need `&mut` for `FI_PEEK`; a matched probe's handle is a
//!   [`Matched`], not an unexpected-queue key; a receive waiting on a peer that died must be
//!   cancelled in the provider (`engine/leave.rs` fails those of the software queue).

use std::collections::VecDeque;

use super::core::{Claimed, Completion, Desc, Endpoint, OpKind, Post};
use super::{errno, tag, FI_ADDR_UNSPEC};
use crate::error::{Error, Result};

/// What a receive or probe learns of a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Status {
    /// The sending rank.
    pub source: u32,
    /// The MPI tag.
    pub tag: u32,
    /// Bytes: the message's length for a probe; the bytes received for a receive.
    pub len: usize,
}

/// How a receive ended.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Outcome {
    /// It took a message.
    Received {
        /// The message's source and tag, and the bytes received.
        status: Status,
        /// The bytes received (at most the receive's capacity).
        data: Vec<u8>,
        /// The message was longer than the receive (`MPI_ERR_TRUNCATE`).
        truncated: bool,
    },
    /// It was cancelled before a message matched it.
    Cancelled,
}

/// A finished receive: the handle [`TaggedP2p::post_recv`] or [`TaggedP2p::mrecv`] gave,
/// and how it ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Done {
    /// The receive's handle.
    pub handle: u64,
    /// How it ended.
    pub outcome: Outcome,
}

/// A finished receive as [`ProviderCore::finish_with`] lends it.
#[derive(Debug)]
pub enum Delivered<'a> {
    /// It took a message.
    Msg {
        /// The message's provider tag ([`super::tag`] layout).
        tag: u64,
        /// The bytes received (at most the receive's room: all of any message of at most
        /// [`ProviderCore::floor`] bytes).
        data: &'a [u8],
        /// The capacity the receive was posted with.
        cap: usize,
        /// The message was longer than `cap` (or than the room, `FI_ETRUNC`).
        truncated: bool,
    },
    /// It was cancelled before a message matched it.
    Cancelled,
}

/// A message taken out of matching by [`TaggedP2p::improbe`], to receive with
/// [`TaggedP2p::mrecv`].
#[derive(Debug)]
pub struct Matched {
    /// Its source, tag and length.
    pub status: Status,
    inner: MatchedInner,
}

#[derive(Debug)]
enum MatchedInner {
    /// Claimed in the provider (`FI_CLAIM`).
    Claimed(Claimed),
    /// Taken from software's unexpected queue.
    Stored(Vec<u8>),
}

/// MPI point-to-point of one rank: eager sends, receives with wildcards, probes, matched
/// probes, cancel. Ranks are indices into the address table the implementation was given.
/// Handles of receives are issued in order (0, 1, 2, ...) by both implementations.
pub trait TaggedP2p {
    /// Sends `data` to rank `dest` on context `ctx` with `tag`. The data is copied; the send
    /// is complete for MPI on return (queued in order if the provider is busy).
    ///
    /// # Errors
    /// A field out of the tag layout's range, a message longer than the eager limit, or a
    /// libfabric call failing.
    fn send(&mut self, dest: u32, ctx: u32, tag: u32, data: &[u8]) -> Result<()>;

    /// Posts a receive of at most `cap` bytes from `src` (`None`: any source) with `tag`
    /// (`None`: any tag) on context `ctx`; its completion comes from [`TaggedP2p::progress`].
    ///
    /// # Errors
    /// A field out of range, or a libfabric call failing.
    fn post_recv(&mut self, ctx: u32, src: Option<u32>, tag: Option<u32>, cap: usize) -> Result<u64>;

    /// `MPI_Iprobe`: the oldest message a receive with these arguments would take now.
    ///
    /// # Errors
    /// As [`TaggedP2p::post_recv`]; a provider whose `FI_PEEK` does not work.
    fn iprobe(&mut self, ctx: u32, src: Option<u32>, tag: Option<u32>) -> Result<Option<Status>>;

    /// `MPI_Improbe`: like [`TaggedP2p::iprobe`], and the message is taken out of matching.
    ///
    /// # Errors
    /// As [`TaggedP2p::iprobe`].
    fn improbe(&mut self, ctx: u32, src: Option<u32>, tag: Option<u32>) -> Result<Option<Matched>>;

    /// `MPI_Imrecv`: receives a matched message into at most `cap` bytes.
    ///
    /// # Errors
    /// A libfabric call failing.
    fn mrecv(&mut self, m: Matched, cap: usize) -> Result<u64>;

    /// Cancels a posted receive (it completes [`Outcome::Cancelled`] if nothing matched it).
    ///
    /// # Errors
    /// A libfabric call failing.
    fn cancel(&mut self, handle: u64) -> Result<()>;

    /// Makes progress and appends the receives that finished to `done`.
    ///
    /// # Errors
    /// A libfabric call failing, or a send completing with an error.
    fn progress(&mut self, done: &mut Vec<Done>) -> Result<()>;
}

/// Who matches point-to-point messages over an OFI provider.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Matching {
    /// The provider, every receive posted to it ([`ProviderP2p`]).
    Provider,
    /// Software, over untagged provider messages ([`SoftP2p`]).
    Software,
}

impl Matching {
    /// The default for `provider` (as libfabric names it, a layered one as `tcp;ofi_rxm`),
    /// following `bench/results/ofi-matching.md`:
    ///
    /// - `tcp`: the provider. Timed through tmpi's engine (`osu_latency`, `osu_bw`,
    ///   `osu_mbw_mr`, 8 interleaved rounds, 2026-11-29), the provider's matching took
    ///   0.64-0.79x the time from 64 bytes to 512 KiB (0.33x at 16-32 KiB, where its
    ///   rendezvous skips the packet path) and moved 1.05-2.85x the bytes of windows, level
    ///   elsewhere, although it costs more instructions a hop under callgrind (7 400 against
    ///   6 000): software matching's messages past 64 bytes leave the inject path.
    /// - `shm`: software. The two cost the same within 3 % (about 3 000), and libfabric
    ///   1.17's `shm` cannot peek ([`super::Offer::peek_works`]), so probes could not see a
    ///   message the provider holds.
    /// - Providers that drive hardware ([`super::is_hardware`]): the provider, whose matching
    ///   runs in the NIC or its firmware (not measured here: no such hardware).
    /// - Any other software provider (`udp`, `sockets`): software (not measured).
    pub fn default_for(provider: &str) -> Matching {
        if super::is_hardware(provider) || provider.split(';').next() == Some("tcp") {
            Matching::Provider
        } else {
            Matching::Software
        }
    }

    /// Point-to-point of rank `rank` on `ep` with this matching.
    ///
    /// # Errors
    /// As [`SoftP2p::new`].
    pub fn open(self, ep: Endpoint, rank: u32, addrs: Vec<u64>) -> Result<Box<dyn TaggedP2p>> {
        Ok(match self {
            Matching::Provider => Box::new(ProviderP2p::new(ep, rank, addrs)),
            Matching::Software => Box::new(SoftP2p::new(ep, rank, addrs)?),
        })
    }
}

fn range(what: &str) -> Error {
    Error::InvalidArgument(format!("{what} out of the OFI tag layout's range"))
}

/// The outcome of a receive of `cap` bytes that got `data` (already cut to `cap` by the
/// provider, or not by software) from `source` with `tag`.
fn received(source: u32, tag: u32, mut data: Vec<u8>, cap: usize, truncated: bool) -> Outcome {
    let truncated = truncated || data.len() > cap;
    data.truncate(cap);
    Outcome::Received { status: Status { source, tag, len: data.len() }, data, truncated }
}

/// The `user` word of every operation point-to-point posts: the packet fabric posts with
/// others, so completions on an endpoint both share go to their owner
/// ([`ProviderCore::owns`]).
pub const P2P_USER: u64 = u64::MAX - 1;

/// Sends in order: queued while the provider answers `-FI_EAGAIN`; one of at most the
/// provider's inject size with nothing queued before it is injected (`fi_tinject`: no
/// completion to read).
struct SendQueue {
    queue: VecDeque<(u64, u64, Vec<u8>)>,
    /// Sends posted by `fi_tsend` whose completion has not been read.
    out: usize,
    eager_max: usize,
    inject: usize,
}

impl SendQueue {
    fn new(ep: &Endpoint) -> Self {
        let o = ep.offer();
        // Eager: what the provider sends without a rendezvous of its own (ofi_rxm's default
        // eager size is 16 KiB; the offer's inject size bounds it from below), less the
        // software header, so both matchers take the same payloads.
        let max = usize::try_from(o.max_msg_size).unwrap_or(usize::MAX);
        SendQueue {
            queue: VecDeque::new(),
            out: 0,
            eager_max: o.inject_size.max(16 << 10).min(max).saturating_sub(SOFT_HDR),
            inject: o.inject_size,
        }
    }

    /// Refuses a payload longer than the eager limit.
    fn check_len(&self, len: usize) -> Result<()> {
        if len > self.eager_max {
            return Err(Error::InvalidArgument(format!("{len} bytes: more than the eager limit of {}", self.eager_max)));
        }
        Ok(())
    }

    fn push(&mut self, ep: &mut Endpoint, dest: u64, bits: u64, msg: Vec<u8>) -> Result<()> {
        if self.queue.is_empty() && msg.len() <= self.inject && ep.tinject(&msg, dest, bits)? {
            return Ok(());
        }
        self.queue.push_back((dest, bits, msg));
        self.flush(ep)
    }

    fn flush(&mut self, ep: &mut Endpoint) -> Result<()> {
        while let Some((dest, bits, buf)) = self.queue.pop_front() {
            if let Post::Busy(buf) = ep.tsend(buf, Desc::NONE, dest, bits, P2P_USER)? {
                self.queue.push_front((dest, bits, buf));
                break;
            }
            self.out += 1;
        }
        Ok(())
    }

    /// A send's completion `c` was read: only errors matter.
    fn completed(&mut self, c: &Completion) -> Result<()> {
        self.out = self.out.saturating_sub(1);
        match c.error {
            Some(e) => Err(Error::Fabric(format!("fi_tsend completed with error {e} (provider {})", c.prov_errno))),
            None => Ok(()),
        }
    }

    /// Sends queued or not completed yet (injected ones are not counted: they have no
    /// completion).
    fn pending(&self) -> usize {
        self.queue.len() + self.out
    }
}

/// Posts with `op` until the provider takes it, progressing meanwhile (stashing what
/// completes). Receives and peeks need no peer to be posted, only local room.
fn post_until(ep: &mut Endpoint, stash: &mut Vec<Completion>, mut op: impl FnMut(&mut Endpoint) -> Result<Post>) -> Result<super::OpId> {
    for _ in 0..1_000_000 {
        match op(ep)? {
            Post::Posted(id) => return Ok(id),
            Post::Busy(_) => {
                ep.progress(|c| stash.push(c))?;
            }
        }
    }
    Err(Error::Fabric("the provider stayed busy for a million retries".into()))
}

/// Point-to-point matched by the provider, on an endpoint it owns.
pub struct ProviderP2p {
    ep: Endpoint,
    core: ProviderCore,
}

impl ProviderP2p {
    /// Point-to-point of rank `rank` on `ep`, whose peers are at `addrs` (`fi_addr_t` by rank).
    pub fn new(ep: Endpoint, rank: u32, addrs: Vec<u64>) -> Self {
        let core = ProviderCore::new(&ep, rank, addrs);
        ProviderP2p { ep, core }
    }
}

impl TaggedP2p for ProviderP2p {
    fn send(&mut self, dest: u32, ctx: u32, tg: u32, data: &[u8]) -> Result<()> {
        self.core.send(&mut self.ep, dest, ctx, tg, data)
    }

    fn post_recv(&mut self, ctx: u32, src: Option<u32>, tg: Option<u32>, cap: usize) -> Result<u64> {
        self.core.post_recv(&mut self.ep, ctx, src, tg, cap)
    }

    fn iprobe(&mut self, ctx: u32, src: Option<u32>, tg: Option<u32>) -> Result<Option<Status>> {
        self.core.iprobe(&mut self.ep, ctx, src, tg)
    }

    fn improbe(&mut self, ctx: u32, src: Option<u32>, tg: Option<u32>) -> Result<Option<Matched>> {
        self.core.improbe(&mut self.ep, ctx, src, tg)
    }

    fn mrecv(&mut self, m: Matched, cap: usize) -> Result<u64> {
        self.core.mrecv(&mut self.ep, m, cap)
    }

    fn cancel(&mut self, handle: u64) -> Result<()> {
        self.core.cancel(&mut self.ep, handle)
    }

    fn progress(&mut self, done: &mut Vec<Done>) -> Result<()> {
        self.core.progress(&mut self.ep, done)?;
        // Alone on its endpoint: every completion is its own.
        self.core.foreign.clear();
        Ok(())
    }
}

/// The state of matching by the provider, on an endpoint it borrows for each call: alone
/// ([`ProviderP2p`]) or beside the packet fabric ([`super::OfiFabric::enable_matching`]),
/// whose completions it hands back ([`ProviderCore::take_foreign`]).
pub struct ProviderCore {
    rank: u32,
    addrs: Vec<u64>,
    sends: SendQueue,
    next: u64,
    /// Completions read while waiting for a peek's, handled at the next progress.
    stash: Vec<Completion>,
    /// Completions of the endpoint's other user, read while waiting for a peek's.
    foreign: Vec<Completion>,
    /// Receive buffers of [`ProviderCore::room`] bytes, reused (not zeroed again).
    pool: Vec<Vec<u8>>,
    /// Receives posted: handle to (op, cap).
    live: Vec<(u64, super::OpId, usize)>,
}

impl ProviderCore {
    /// Point-to-point of rank `rank` over `ep`, whose peers are at `addrs`.
    pub fn new(ep: &Endpoint, rank: u32, addrs: Vec<u64>) -> Self {
        let sends = SendQueue::new(ep);
        let (stash, foreign, pool, live) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        ProviderCore { rank, addrs, sends, next: 0, stash, foreign, pool, live }
    }

    /// Whether completion `c` is of an operation point-to-point posted.
    pub fn owns(c: &Completion) -> bool {
        c.user == P2P_USER
    }

    /// Completions of the endpoint's other user read during a call, for it to handle.
    pub fn take_foreign(&mut self) -> Vec<Completion> {
        std::mem::take(&mut self.foreign)
    }

    /// The eager limit: the longest payload [`ProviderCore::send`] takes.
    pub fn eager_max(&self) -> usize {
        self.sends.eager_max
    }

    fn keys(ctx: u32, src: Option<u32>, tg: Option<u32>) -> Result<(u64, u64)> {
        tag::recv(tag::PROTO_MPI, ctx, src, tg).ok_or_else(|| range("context, source or tag"))
    }

    fn addr(&self, src: Option<u32>) -> Result<u64> {
        match src {
            None => Ok(FI_ADDR_UNSPEC),
            Some(s) => self.addrs.get(s as usize).copied().ok_or_else(|| range("source rank")),
        }
    }

    /// Reads completions into the stash (what [`ProviderCore::progress`] handles).
    fn read(&mut self, ep: &mut Endpoint) -> Result<()> {
        let stash = &mut self.stash;
        ep.progress(|c| stash.push(c)).map(|_| ())
    }

    /// Peeks (with claim or not) and waits for the peek's own completion.
    fn peek(&mut self, ep: &mut Endpoint, ctx: u32, src: Option<u32>, tg: Option<u32>, claim: bool) -> Result<Option<Completion>> {
        if !ep.offer().peek_works() {
            return Err(Error::Fabric(format!("provider {} cannot peek (FI_PEEK): probe in software", ep.offer().provider)));
        }
        let (bits, ignore) = Self::keys(ctx, src, tg)?;
        let addr = self.addr(src)?;
        let id = post_until(ep, &mut self.stash, |ep| ep.peek(addr, bits, ignore, claim, P2P_USER))?;
        for _ in 0..10_000_000 {
            let mut found = None;
            let stash = &mut self.stash;
            ep.progress(|c| if c.id == id && c.kind == OpKind::Peek { found = Some(c) } else { stash.push(c) })?;
            match found {
                Some(c) if c.error == Some(errno::NOMSG) => return Ok(None),
                Some(c) if c.error.is_some() => return Err(Error::Fabric(format!("FI_PEEK completed with error {:?}", c.error))),
                Some(c) => return Ok(Some(c)),
                None => std::thread::yield_now(),
            }
        }
        Err(Error::Fabric("a peek never completed".into()))
    }

    /// Handles completion `c` of an operation point-to-point posted (see
    /// [`ProviderCore::owns`]), appending a finished receive to `done`.
    ///
    /// # Errors
    /// A send or receive completing with an error other than cancel and truncation.
    pub fn finish(&mut self, c: Completion, done: &mut Vec<Done>) -> Result<()> {
        self.finish_with(c, &mut |handle, d| {
            let outcome = match d {
                Delivered::Cancelled => Outcome::Cancelled,
                Delivered::Msg { tag: bits, data, cap, truncated } => {
                    let (_, _, source, tg) = tag::fields(bits);
                    received(source, tg, data[..cap.min(data.len())].to_vec(), cap, truncated)
                }
            };
            done.push(Done { handle, outcome });
        })
    }

    /// Handles completion `c` as [`ProviderCore::finish`] does, lending a finished receive's
    /// bytes to `f` (with its handle) instead of copying them; the buffer goes back to the
    /// pool afterwards.
    ///
    /// # Errors
    /// As [`ProviderCore::finish`].
    pub fn finish_with(&mut self, c: Completion, f: &mut dyn FnMut(u64, Delivered<'_>)) -> Result<()> {
        if c.kind == OpKind::Send {
            return self.sends.completed(&c);
        }
        let Some(i) = self.live.iter().position(|l| l.1 == c.id) else { return Ok(()) };
        let (handle, _, cap) = self.live.swap_remove(i);
        match c.error {
            Some(errno::CANCELED) => f(handle, Delivered::Cancelled),
            Some(errno::TRUNC) => {
                let n = cap.min(c.buf.len());
                f(handle, Delivered::Msg { tag: c.tag, data: &c.buf[..n], cap, truncated: true });
            }
            Some(e) => return Err(Error::Fabric(format!("fi_trecv completed with error {e} (provider {})", c.prov_errno))),
            None => {
                let n = c.len.min(c.buf.len());
                f(handle, Delivered::Msg { tag: c.tag, data: &c.buf[..n], cap, truncated: n > cap });
            }
        }
        self.give_back(c.buf);
        Ok(())
    }

    /// The buffer given to the provider for a receive of `cap` bytes: room for any eager
    /// message, so the provider never truncates and software cuts to `cap`. libfabric 1.17's
    /// `tcp` (`ofi_rxm`) stalls the connection after a truncated receive: later messages
    /// from that peer never complete (ofiwg/libfabric#8274, fixed in a later release;
    /// `ofi/tests_p2p.rs` shows it).
    fn room(&self, cap: usize) -> usize {
        cap.max(self.floor())
    }

    /// The longest message [`ProviderCore::send_owned`] takes, header included: the eager
    /// limit and the software header's room, what `ofi_rxm` sends eagerly by default. Every
    /// receive has room for it, so the provider never truncates a message it carries eagerly.
    pub fn floor(&self) -> usize {
        self.sends.eager_max + SOFT_HDR
    }

    /// A receive buffer for `cap` bytes: from the pool when it has the usual size.
    fn buffer(&mut self, cap: usize) -> Vec<u8> {
        let len = self.room(cap);
        match self.pool.pop() {
            Some(b) if b.len() == len => b,
            _ => vec![0; len],
        }
    }

    /// Keeps a finished receive's buffer for the next (the pool holds at most 64).
    fn give_back(&mut self, buf: Vec<u8>) {
        if buf.len() == self.floor() && self.pool.len() < 64 {
            self.pool.push(buf);
        }
    }

    fn issue(&mut self, id: super::OpId, cap: usize) -> u64 {
        let h = self.next;
        self.next += 1;
        self.live.push((h, id, cap));
        h
    }

    /// As [`TaggedP2p::send`], over `ep`.
    ///
    /// # Errors
    /// As [`TaggedP2p::send`].
    pub fn send(&mut self, ep: &mut Endpoint, dest: u32, ctx: u32, tg: u32, data: &[u8]) -> Result<()> {
        let bits = tag::send(tag::PROTO_MPI, ctx, self.rank, tg).ok_or_else(|| range("context or tag"))?;
        let addr = self.addrs.get(dest as usize).copied().ok_or_else(|| range("destination rank"))?;
        self.sends.check_len(data.len())?;
        self.sends.push(ep, addr, bits, data.to_vec())
    }

    /// As [`TaggedP2p::post_recv`], over `ep`.
    ///
    /// # Errors
    /// As [`TaggedP2p::post_recv`].
    pub fn post_recv(&mut self, ep: &mut Endpoint, ctx: u32, src: Option<u32>, tg: Option<u32>, cap: usize) -> Result<u64> {
        let (bits, ignore) = Self::keys(ctx, src, tg)?;
        let addr = self.addr(src)?;
        let mut buf = self.buffer(cap);
        let id = loop {
            match ep.trecv(buf, Desc::NONE, addr, bits, ignore, P2P_USER)? {
                Post::Posted(id) => break id,
                Post::Busy(b) => buf = b,
            }
            self.read(ep)?;
        };
        Ok(self.issue(id, cap))
    }

    /// As [`TaggedP2p::iprobe`], over `ep`.
    ///
    /// # Errors
    /// As [`TaggedP2p::iprobe`].
    pub fn iprobe(&mut self, ep: &mut Endpoint, ctx: u32, src: Option<u32>, tg: Option<u32>) -> Result<Option<Status>> {
        Ok(self.peek(ep, ctx, src, tg, false)?.map(|c| {
            let (_, _, source, tag) = tag::fields(c.tag);
            Status { source, tag, len: c.len }
        }))
    }

    /// As [`TaggedP2p::improbe`], over `ep`.
    ///
    /// # Errors
    /// As [`TaggedP2p::improbe`].
    pub fn improbe(&mut self, ep: &mut Endpoint, ctx: u32, src: Option<u32>, tg: Option<u32>) -> Result<Option<Matched>> {
        let Some(c) = self.peek(ep, ctx, src, tg, true)? else { return Ok(None) };
        let claim = c.claimed.ok_or_else(|| Error::Fabric("FI_CLAIM peek completed without a claim".into()))?;
        let (_, _, source, tag) = tag::fields(claim.tag);
        Ok(Some(Matched { status: Status { source, tag, len: claim.len }, inner: MatchedInner::Claimed(claim) }))
    }

    /// As [`TaggedP2p::mrecv`], over `ep`.
    ///
    /// # Errors
    /// As [`TaggedP2p::mrecv`].
    pub fn mrecv(&mut self, ep: &mut Endpoint, m: Matched, cap: usize) -> Result<u64> {
        let MatchedInner::Claimed(mut claim) = m.inner else {
            return Err(Error::InvalidArgument("a matched message of software given to the provider".into()));
        };
        let mut buf = self.buffer(cap);
        for _ in 0..1_000_000 {
            match ep.recv_claimed(claim, buf, Desc::NONE, P2P_USER)? {
                Ok(id) => return Ok(self.issue(id, cap)),
                Err((c, b)) => (claim, buf) = (c, b),
            }
            self.read(ep)?;
        }
        Err(Error::Fabric("the provider stayed busy for a million retries".into()))
    }

    /// As [`TaggedP2p::cancel`], over `ep`.
    ///
    /// # Errors
    /// As [`TaggedP2p::cancel`].
    pub fn cancel(&mut self, ep: &mut Endpoint, handle: u64) -> Result<()> {
        match self.live.iter().find(|l| l.0 == handle) {
            Some(&(_, id, _)) => ep.cancel(id),
            None => Ok(()),
        }
    }

    /// Flushes queued sends and moves the completions read since the last call that are
    /// point-to-point's own to `owned`, for [`ProviderCore::finish`] (those of the endpoint's
    /// other user are kept for [`ProviderCore::take_foreign`]). The endpoint's other user
    /// reads its own completions and hands this core its.
    ///
    /// # Errors
    /// A libfabric call failing.
    pub fn flush(&mut self, ep: &mut Endpoint, owned: &mut Vec<Completion>) -> Result<()> {
        self.sends.flush(ep)?;
        for c in std::mem::take(&mut self.stash) {
            if Self::owns(&c) {
                owned.push(c);
            } else {
                self.foreign.push(c);
            }
        }
        Ok(())
    }

    /// Sends `msg` (at most [`ProviderCore::floor`] bytes, taken as it is) to rank `dest`
    /// on context `ctx` with `tag`: what [`ProviderCore::send`] does without the copy.
    ///
    /// # Errors
    /// A field out of the tag layout's range, a message longer than the floor, or a
    /// libfabric call failing.
    pub fn send_owned(&mut self, ep: &mut Endpoint, dest: u32, ctx: u32, tg: u32, msg: Vec<u8>) -> Result<()> {
        let bits = tag::send(tag::PROTO_MPI, ctx, self.rank, tg).ok_or_else(|| range("context or tag"))?;
        let addr = self.addrs.get(dest as usize).copied().ok_or_else(|| range("destination rank"))?;
        if msg.len() > self.floor() {
            return Err(Error::InvalidArgument(format!("{} bytes: more than the provider's eager floor of {}", msg.len(), self.floor())));
        }
        self.sends.push(ep, addr, bits, msg)
    }

    /// Sends not yet handed to the provider, or whose completion has not been read:
    /// finalize waits for none to be left.
    pub fn sends_pending(&self) -> usize {
        self.sends.pending()
    }

    /// Handles of the receives still posted.
    pub fn live_handles(&self) -> Vec<u64> {
        self.live.iter().map(|l| l.0).collect()
    }

    /// As [`TaggedP2p::progress`], over `ep` (reads its completions too).
    ///
    /// # Errors
    /// As [`TaggedP2p::progress`].
    pub fn progress(&mut self, ep: &mut Endpoint, done: &mut Vec<Done>) -> Result<()> {
        self.sends.flush(ep)?;
        self.read(ep)?;
        let mut owned = Vec::new();
        self.flush(ep, &mut owned)?;
        for c in owned {
            self.finish(c, done)?;
        }
        Ok(())
    }
}

/// Receive buffers [`SoftP2p`] keeps posted to the provider.
const SOFT_DEPTH: usize = 64;
/// Header of a software-matched message: context, source, tag (little-endian `u32`s).
const SOFT_HDR: usize = 12;
/// The provider tag every software-matched message carries.
const SOFT_BITS: u64 = tag::PROTO_SOFT << tag::PROTO_SHIFT;

/// A receive queued in software: handle, context, source, tag, capacity.
type Queued = (u64, u32, Option<u32>, Option<u32>, usize);
/// A message stored unexpected in software: context, source, tag, payload.
type Stored = (u32, u32, u32, Vec<u8>);

fn soft_matches(q: &Queued, ctx: u32, src: u32, tg: u32) -> bool {
    q.1 == ctx && q.2.is_none_or(|s| s == src) && q.3.is_none_or(|t| t == tg)
}

/// Point-to-point matched in software over untagged provider messages (one provider tag,
/// receive buffers kept posted), as tmpi's packet channel does today.
pub struct SoftP2p {
    ep: Endpoint,
    rank: u32,
    addrs: Vec<u64>,
    sends: SendQueue,
    next: u64,
    /// Receives queued, in post order.
    posted: Vec<Queued>,
    /// Unexpected messages, in arrival order.
    unexpected: VecDeque<Stored>,
    /// Finished at post time (an unexpected message matched), given at the next progress.
    ready: Vec<Done>,
}

impl SoftP2p {
    /// Point-to-point of rank `rank` on `ep`, whose peers are at `addrs`; posts the receive
    /// buffers.
    ///
    /// # Errors
    /// A libfabric call failing.
    pub fn new(mut ep: Endpoint, rank: u32, addrs: Vec<u64>) -> Result<Self> {
        let sends = SendQueue::new(&ep);
        let len = sends.eager_max + SOFT_HDR;
        let mut stash = Vec::new();
        for _ in 0..SOFT_DEPTH {
            post_until(&mut ep, &mut stash, |ep| ep.trecv(vec![0; len], Desc::NONE, FI_ADDR_UNSPEC, SOFT_BITS, 0, 0))?;
        }
        if !stash.is_empty() {
            return Err(Error::Fabric("a fresh endpoint completed an operation it was not given".into()));
        }
        Ok(SoftP2p { ep, rank, addrs, sends, next: 0, posted: Vec::new(), unexpected: VecDeque::new(), ready: Vec::new() })
    }

    fn check(ctx: u32, src: Option<u32>, tg: Option<u32>) -> Result<()> {
        tag::recv(tag::PROTO_MPI, ctx, src, tg).map(|_| ()).ok_or_else(|| range("context, source or tag"))
    }

    fn find(&self, ctx: u32, src: Option<u32>, tg: Option<u32>) -> Option<usize> {
        let q = (0, ctx, src, tg, 0);
        self.unexpected.iter().position(|m| soft_matches(&q, m.0, m.1, m.2))
    }

    fn handle(&mut self) -> u64 {
        self.next += 1;
        self.next - 1
    }

    /// One arrival: reposts its buffer, then matches it.
    fn arrive(&mut self, c: Completion, done: &mut Vec<Done>) -> Result<()> {
        if let Some(e) = c.error {
            return Err(Error::Fabric(format!("a software-matched receive buffer completed with error {e}")));
        }
        let msg = &c.buf[..c.len.min(c.buf.len())];
        if msg.len() < SOFT_HDR {
            return Err(Error::Fabric(format!("a software-matched message of {} bytes, shorter than its header", msg.len())));
        }
        let word = |i: usize| u32::from_le_bytes([msg[i], msg[i + 1], msg[i + 2], msg[i + 3]]);
        let (ctx, src, tg) = (word(0), word(4), word(8));
        let data = msg[SOFT_HDR..].to_vec();
        let mut stash = Vec::new();
        let mut buf = c.buf;
        loop {
            match self.ep.trecv(buf, Desc::NONE, FI_ADDR_UNSPEC, SOFT_BITS, 0, 0)? {
                Post::Posted(_) => break,
                Post::Busy(b) => buf = b,
            }
            self.ep.progress(|c| stash.push(c))?;
        }
        match self.posted.iter().position(|q| soft_matches(q, ctx, src, tg)) {
            Some(i) => {
                let (handle, .., cap) = self.posted.remove(i);
                done.push(Done { handle, outcome: received(src, tg, data, cap, false) });
            }
            None => self.unexpected.push_back((ctx, src, tg, data)),
        }
        for c in stash {
            self.complete(c, done)?;
        }
        Ok(())
    }

    fn complete(&mut self, c: Completion, done: &mut Vec<Done>) -> Result<()> {
        match c.kind {
            OpKind::Send => self.sends.completed(&c),
            OpKind::Recv => self.arrive(c, done),
            _ => Ok(()),
        }
    }
}

impl TaggedP2p for SoftP2p {
    fn send(&mut self, dest: u32, ctx: u32, tg: u32, data: &[u8]) -> Result<()> {
        Self::check(ctx, Some(self.rank), Some(tg))?;
        let addr = self.addrs.get(dest as usize).copied().ok_or_else(|| range("destination rank"))?;
        let mut msg = Vec::with_capacity(SOFT_HDR + data.len());
        for w in [ctx, self.rank, tg] {
            msg.extend_from_slice(&w.to_le_bytes());
        }
        msg.extend_from_slice(data);
        self.sends.check_len(data.len())?;
        self.sends.push(&mut self.ep, addr, SOFT_BITS, msg)
    }

    fn post_recv(&mut self, ctx: u32, src: Option<u32>, tg: Option<u32>, cap: usize) -> Result<u64> {
        Self::check(ctx, src, tg)?;
        let h = self.handle();
        match self.find(ctx, src, tg).and_then(|i| self.unexpected.remove(i)) {
            Some((_, s, t, data)) => self.ready.push(Done { handle: h, outcome: received(s, t, data, cap, false) }),
            None => self.posted.push((h, ctx, src, tg, cap)),
        }
        Ok(h)
    }

    fn iprobe(&mut self, ctx: u32, src: Option<u32>, tg: Option<u32>) -> Result<Option<Status>> {
        Self::check(ctx, src, tg)?;
        Ok(self.find(ctx, src, tg).map(|i| {
            let m = &self.unexpected[i];
            Status { source: m.1, tag: m.2, len: m.3.len() }
        }))
    }

    fn improbe(&mut self, ctx: u32, src: Option<u32>, tg: Option<u32>) -> Result<Option<Matched>> {
        Self::check(ctx, src, tg)?;
        Ok(self
            .find(ctx, src, tg)
            .and_then(|i| self.unexpected.remove(i))
            .map(|(_, source, tag, data)| Matched { status: Status { source, tag, len: data.len() }, inner: MatchedInner::Stored(data) }))
    }

    fn mrecv(&mut self, m: Matched, cap: usize) -> Result<u64> {
        let MatchedInner::Stored(data) = m.inner else {
            return Err(Error::InvalidArgument("a message claimed in the provider given to software".into()));
        };
        let h = self.handle();
        self.ready.push(Done { handle: h, outcome: received(m.status.source, m.status.tag, data, cap, false) });
        Ok(h)
    }

    fn cancel(&mut self, handle: u64) -> Result<()> {
        if let Some(i) = self.posted.iter().position(|q| q.0 == handle) {
            self.posted.remove(i);
            self.ready.push(Done { handle, outcome: Outcome::Cancelled });
        }
        Ok(())
    }

    fn progress(&mut self, done: &mut Vec<Done>) -> Result<()> {
        done.append(&mut self.ready);
        self.sends.flush(&mut self.ep)?;
        let mut comps = Vec::new();
        self.ep.progress(|c| comps.push(c))?;
        for c in comps {
            self.complete(c, done)?;
        }
        Ok(())
    }
}
