//! Communicators and blocking point-to-point.

use std::sync::Arc;

use bytemuck::Pod;

use crate::buffer::{RawBuf, RawBufMut};
use crate::engine::{Engine, Need, Peers, ReqId, WorldRanks};
use crate::error::{Error, Result};
use crate::matching;
use crate::seen::{self, Kind, What};
use crate::sync::{CollBusy, EngineCell, EngineGuard, SyncCell};
use crate::{Rank, Tag, TAG_UB};

pub use crate::envelope::{Source, TagMatch, ANY_SOURCE, ANY_TAG};
pub use crate::status::Status;

pub(crate) struct CommInner {
    pub(crate) eng: Arc<EngineCell>,
    /// Collectives started on this communicator: their sequence number goes into every tag
    /// they use, so one collective's messages never match another's.
    pub(crate) coll_seq: SyncCell<u32>,
    /// Calls on this communicator's shared-memory collective context so far: their own
    /// counter, which picks the slots of a call (see [`crate::coll::shm`]). Collectives that
    /// do not go through the slots (gather, scatter...) do not count here, since they do not
    /// synchronise the ranks the way the slots' reuse needs. One thread at a time is inside
    /// a collective on a communicator ([`CollBusy`], whose enter and leave order the calls of
    /// different threads), so a plain load and store count it, without a read-modify-write.
    pub(crate) shm_seq: std::sync::atomic::AtomicU32,
    /// `s + 1` for the last call `s` on the slots in which this rank saw every other rank
    /// arrive (0: none yet): the next call's wait for the others' arrival in `s` then holds
    /// at once (`Call::await_previous`). Counted like `shm_seq`.
    pub(crate) shm_seen_all: std::sync::atomic::AtomicU32,
    /// The communicator's context for shared-memory collectives (see [`crate::coll::shm`]).
    pub(crate) shm: SyncCell<crate::engine::Slot>,
    /// The thread inside a collective on this communicator (see [`CollBusy`]).
    pub(crate) coll_busy: CollBusy,
    /// What its collectives know of the machine (see [`crate::coll::Machine`]).
    pub(crate) machine: crate::coll::Machine,
    /// Communicator id; user traffic uses context `2 * id`, collectives `2 * id + 1`.
    pub(crate) id: u32,
    pub(crate) rank: Rank,
    pub(crate) size: usize,
    /// World rank of each member; `None` for the identity (the world communicator).
    pub(crate) members: Option<WorldRanks>,
    /// Its name and attributes ([`crate::names`]), dropped with it.
    pub(crate) attrs: crate::attrs::Attrs,
}

impl Drop for CommInner {
    fn drop(&mut self) {
        // The engine is held only inside tmpi calls, which never drop a communicator while
        // they hold it; if it ever were (or if this is a thread the level does not admit), the
        // id would merely stay taken. The id is freed once nothing on this rank uses it.
        if let Ok(mut e) = self.eng.lock_for_cleanup() {
            e.comm_id_release(self.id);
            e.shm_release(self.shm.get());
        }
    }
}

/// A communicator: a group of ranks and a private matching context. Cheap to clone.
///
/// `Send + Sync`: which threads may call it at the same time is the [`crate::Threading`]
/// level the runtime was started at.
#[derive(Clone)]
pub struct Comm {
    pub(crate) inner: Arc<CommInner>,
}

impl std::fmt::Debug for Comm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Comm").field("id", &self.inner.id).field("rank", &self.inner.rank).field("size", &self.inner.size).finish()
    }
}

/// Waits for `rid`; on failure the engine forgets the caller's buffer before it is returned.
///
/// A request that is already complete (most of a `wait_all` over a window: the first wait's
/// progress took in the rest) is collected inline, without the calls of a wait.
#[inline(always)]
pub(crate) fn finish(e: &mut EngineGuard<'_>, rid: ReqId) -> Result<crate::Status> {
    match e.take_if_done_boxed(rid) {
        Some(Ok(st)) => Ok(st),
        Some(Err(err)) => {
            e.abandon(rid);
            Err(*err)
        }
        None => finish_pending(e, rid),
    }
}

/// [`finish`] for a request that was not complete at the first look.
#[inline(never)]
fn finish_pending(e: &mut EngineGuard<'_>, rid: ReqId) -> Result<crate::Status> {
    let r = e.wait(rid);
    if r.is_err() {
        e.abandon(rid);
    }
    r
}

impl seen::Seen for Comm {}

/// Seeing names a communicator by its number and its peers by their world ranks.
impl seen::Ranks for Comm {
    fn comm_id(&self) -> u32 {
        self.inner.id
    }

    fn size(&self) -> usize {
        Comm::size(self)
    }

    fn world_rank(&self, r: Rank) -> usize {
        Comm::world_rank(self, r)
    }
}

impl Comm {
    /// This process's rank in the communicator.
    pub fn rank(&self) -> Rank {
        self.inner.rank
    }

    /// Number of ranks in the communicator.
    pub fn size(&self) -> usize {
        self.inner.size
    }

    /// The rank's engine, as the thread level allows (see [`crate::sync`]).
    ///
    /// # Errors
    /// [`Error::Thread`] when the level does not admit this call.
    #[inline]
    pub(crate) fn eng(&self) -> Result<EngineGuard<'_>> {
        self.inner.eng.lock()
    }

    /// The thread level of this communicator's runtime.
    pub fn threading(&self) -> crate::Threading {
        self.inner.eng.level()
    }

    /// The engine for a clean-up path (see `EngineCell::lock_for_cleanup`), unless the thread
    /// level does not admit it here.
    pub(crate) fn try_eng(&self) -> Option<EngineGuard<'_>> {
        self.inner.eng.lock_for_cleanup().ok()
    }

    #[inline]
    pub(crate) fn user_ctx(&self) -> u32 {
        self.inner.id * 2
    }

    #[inline]
    pub(crate) fn coll_ctx(&self) -> u32 {
        self.inner.id * 2 + 1
    }

    #[inline]
    pub(crate) fn world_rank(&self, r: Rank) -> usize {
        match &self.inner.members {
            None => r,
            Some(m) => m[r],
        }
    }

    #[inline]
    pub(crate) fn check_rank(&self, rank: Rank) -> Result<()> {
        if rank >= self.inner.size {
            return Err(Error::InvalidRank { rank, size: self.inner.size });
        }
        Ok(())
    }

    #[inline]
    fn check_tag(tag: Tag) -> Result<()> {
        if tag > TAG_UB {
            return Err(Error::InvalidTag { tag });
        }
        Ok(())
    }

    /// Validates a receive's source and tag into the matcher's terms.
    #[inline]
    pub(crate) fn recv_args(&self, src: Source, tag: TagMatch) -> Result<(Option<u32>, Option<u32>)> {
        let s = match src {
            Source::Any => None,
            Source::Rank(r) => {
                self.check_rank(r)?;
                Some(r as u32)
            }
        };
        let t = match tag {
            TagMatch::Any => None,
            TagMatch::Tag(t) => {
                Self::check_tag(t)?;
                Some(t)
            }
        };
        Ok((s, t))
    }

    /// Starts sending `bytes` on context `ctx`; `None` when already complete.
    ///
    /// # Safety
    /// `bytes` must outlive the returned request (see [`crate::buffer`]).
    #[inline(always)]
    pub(crate) unsafe fn start_send_bytes(
        &self,
        e: &mut Engine,
        ctx: u32,
        bytes: &[u8],
        dest: Rank,
        tag: Tag,
        sync: bool,
    ) -> Result<Option<ReqId>> {
        self.check_rank(dest)?;
        Self::check_tag(tag)?;
        let tag64 = matching::encode_tag(ctx, self.inner.rank as u32, tag);
        // SAFETY: forwarded to the caller.
        let raw = unsafe { RawBuf::new(bytes) };
        e.start_send(self.world_rank(dest), tag64, raw, sync)
    }

    /// Posts a receive of `bytes` on context `ctx`.
    ///
    /// # Safety
    /// `bytes` must outlive the returned request (see [`crate::buffer`]).
    #[inline]
    pub(crate) unsafe fn post_recv_bytes(
        &self,
        e: &mut Engine,
        ctx: u32,
        bytes: &mut [u8],
        src: Option<u32>,
        tag: Option<u32>,
    ) -> Result<ReqId> {
        // SAFETY: forwarded to the caller.
        let raw = unsafe { RawBufMut::new(bytes) };
        e.post_recv(ctx, src, tag, raw, self.peers(src))
    }

    /// Whom a receive from `src` (`None`: any source) waits for, in world ranks.
    pub(crate) fn peers(&self, src: Option<u32>) -> Peers {
        match src {
            Some(r) => Peers::rank(self.world_rank(r as Rank)),
            None => Peers::any(self.inner.members.clone()),
        }
    }

    pub(crate) fn send_ctx(&self, ctx: u32, bytes: &[u8], dest: Rank, tag: Tag, sync: bool) -> Result<()> {
        let mut e = self.eng()?;
        // SAFETY: `bytes` is borrowed for this call, and `finish` returns only once the send
        // is complete or abandoned.
        if let Some(rid) = unsafe { self.start_send_bytes(&mut e, ctx, bytes, dest, tag, sync)? } {
            finish(&mut e, rid)?;
        }
        Ok(())
    }

    pub(crate) fn recv_ctx(&self, ctx: u32, bytes: &mut [u8], src: Option<u32>, tag: Option<u32>) -> Result<Status> {
        let mut e = self.eng()?;
        // SAFETY: `bytes` is borrowed for this call, and `finish` returns only once the
        // receive is complete or abandoned.
        let rid = unsafe { self.post_recv_bytes(&mut e, ctx, bytes, src, tag)? };
        finish(&mut e, rid)
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn sendrecv_ctx(
        &self,
        ctx: u32,
        sbuf: &[u8],
        dest: Rank,
        stag: Tag,
        rbuf: &mut [u8],
        src: Option<u32>,
        rtag: Option<u32>,
    ) -> Result<Status> {
        let mut e = self.eng()?;
        // SAFETY: both buffers are borrowed for this call, and both requests are finished or
        // abandoned before it returns.
        let rr = unsafe { self.post_recv_bytes(&mut e, ctx, rbuf, src, rtag)? };
        // SAFETY: as above.
        let sr = match unsafe { self.start_send_bytes(&mut e, ctx, sbuf, dest, stag, false) } {
            Ok(sr) => sr,
            Err(err) => {
                e.abandon(rr);
                return Err(err);
            }
        };
        let sres = match sr {
            Some(sr) => finish(&mut e, sr).map(|_| ()),
            None => Ok(()),
        };
        if let Err(err) = sres {
            e.abandon(rr);
            return Err(err);
        }
        finish(&mut e, rr)
    }

    /// Test hook: sends `bytes` to world rank `dest` as one raw fabric packet with `flags`
    /// (`tmpi_transport::fabric::PKT_*`) and `total_len`, bypassing every protocol, so a test
    /// can play a peer that sends garbage.
    ///
    /// # Errors
    /// A bad rank, a packet the fabric cannot carry, [`Error::PeerGone`].
    #[doc(hidden)]
    pub fn inject_packet(&self, dest: Rank, flags: u8, total_len: u64, bytes: &[u8]) -> Result<()> {
        self.eng()?.inject(dest, flags, total_len, bytes)
    }

    /// This rank's `tmpi-stats` line (what `TMPI_STATS=1` prints at finalize).
    #[doc(hidden)]
    pub fn stats_line(&self) -> String {
        self.eng().map_or_else(|e| format!("tmpi-stats unavailable: {e}"), |e| e.stats_line())
    }

    /// Sends `buf` to `dest` with `tag` (standard mode: returns once `buf` may be reused).
    ///
    /// # Errors
    /// [`Error::InvalidRank`], [`Error::InvalidTag`], [`Error::PeerGone`].
    pub fn send<T: Pod>(&self, buf: &[T], dest: Rank, tag: Tag) -> Result<()> {
        if seen::on() {
            return self.send_seen(Kind::Send, bytemuck::cast_slice(buf), dest, tag);
        }
        self.send_ctx(self.user_ctx(), bytemuck::cast_slice(buf), dest, tag, false)
    }

    /// [`Comm::send`] or [`Comm::ssend`] (`kind`) as a seen call: out of line, so that the
    /// public calls keep no frame for it when nothing is seen.
    #[cold]
    #[inline(never)]
    fn send_seen(&self, kind: Kind, buf: &[u8], dest: Rank, tag: Tag) -> Result<()> {
        let w = What::new(kind).to(self, dest).tag(tag).bytes(buf.len()).sends(self, dest, buf.len());
        seen::call(w, || if kind == Kind::Ssend { self.ssend(buf, dest, tag) } else { self.send(buf, dest, tag) })
    }

    /// Synchronous send: returns once the matching receive has started.
    ///
    /// # Errors
    /// As [`Comm::send`].
    pub fn ssend<T: Pod>(&self, buf: &[T], dest: Rank, tag: Tag) -> Result<()> {
        if seen::on() {
            return self.send_seen(Kind::Ssend, bytemuck::cast_slice(buf), dest, tag);
        }
        self.send_ctx(self.user_ctx(), bytemuck::cast_slice(buf), dest, tag, true)
    }

    /// Receives into `buf` a message from `src` with `tag` (either may be a wildcard).
    ///
    /// # Errors
    /// [`Error::Truncated`] if the message is longer than `buf` (the message is consumed and
    /// `buf` holds its first bytes); [`Error::InvalidRank`], [`Error::InvalidTag`],
    /// [`Error::PeerGone`].
    pub fn recv<T: Pod>(&self, buf: &mut [T], src: impl Into<Source>, tag: impl Into<TagMatch>) -> Result<Status> {
        let (src, tag) = (src.into(), tag.into());
        if seen::on() {
            return self.recv_seen(bytemuck::cast_slice_mut(buf), src, tag);
        }
        let (s, t) = self.recv_args(src, tag)?;
        self.recv_ctx(self.user_ctx(), bytemuck::cast_slice_mut(buf), s, t)
    }

    /// [`Comm::recv`] as a seen call, out of line (see [`Comm::send_seen`]).
    #[cold]
    #[inline(never)]
    fn recv_seen(&self, buf: &mut [u8], src: Source, tag: TagMatch) -> Result<Status> {
        seen::calls::matched(What::new(Kind::Recv).from(self, src).tag_match(tag), src, |s| self.recv(buf, s, tag))
    }

    /// Receives a message of any length into a new vector.
    ///
    /// # Errors
    /// [`Error::TypeMismatch`] if the message is not a whole number of `T`; as [`Comm::recv`].
    pub fn recv_vec<T: Pod>(&self, src: impl Into<Source>, tag: impl Into<TagMatch>) -> Result<(Vec<T>, Status)> {
        let (src, tag) = (src.into(), tag.into());
        if seen::on() {
            return seen::calls::matched(What::new(Kind::RecvVec).from(self, src).tag_match(tag), src, |s| self.recv_vec(s, tag));
        }
        // Probe, then receive exactly that message: it is the oldest from its source with its
        // tag, so a receive naming both takes it (non-overtaking), whatever path it came by.
        let st = self.probe(src, tag)?;
        let elem = std::mem::size_of::<T>();
        let n = if elem == 0 { 0 } else { st.len.div_ceil(elem) };
        // The length comes from the wire: more than this machine holds is refused before any
        // allocation, and a failed allocation is an error, not an abort.
        let no_memory = || Error::NoMemory { bytes: st.len, rank: st.source() };
        if st.len > crate::sys::physical_memory() {
            return Err(no_memory());
        }
        let mut v: Vec<T> = Vec::new();
        v.try_reserve_exact(n).map_err(|_| no_memory())?;
        v.resize(n, T::zeroed());
        let ctx = self.user_ctx();
        let got = self.recv_ctx(ctx, bytemuck::cast_slice_mut(&mut v), Some(st.source() as u32), Some(st.tag()))?;
        if elem == 0 || got.len % elem != 0 {
            return Err(Error::TypeMismatch { source_rank: got.source(), len: got.len, elem });
        }
        v.truncate(got.len / elem);
        Ok((v, got))
    }

    /// Sends `sbuf` to `dest` and receives into `rbuf` from `src`, without deadlock.
    ///
    /// # Errors
    /// As [`Comm::send`] and [`Comm::recv`].
    #[allow(clippy::too_many_arguments)]
    pub fn sendrecv<T: Pod, U: Pod>(
        &self,
        sbuf: &[T],
        dest: Rank,
        stag: Tag,
        rbuf: &mut [U],
        src: impl Into<Source>,
        rtag: impl Into<TagMatch>,
    ) -> Result<Status> {
        let (src, rtag) = (src.into(), rtag.into());
        if seen::on() {
            let w = What::new(Kind::Sendrecv).from(self, src).tag_match(rtag).sends(self, dest, size_of_val(sbuf));
            return seen::calls::matched(w, src, |s| self.sendrecv(sbuf, dest, stag, rbuf, s, rtag));
        }
        let (s, t) = self.recv_args(src, rtag)?;
        self.check_rank(dest)?;
        Self::check_tag(stag)?;
        self.sendrecv_ctx(self.user_ctx(), bytemuck::cast_slice(sbuf), dest, stag, bytemuck::cast_slice_mut(rbuf), s, t)
    }

    /// Waits until a matching message is available and returns its status without receiving it.
    ///
    /// # Errors
    /// [`Error::InvalidRank`], [`Error::InvalidTag`], [`Error::PeerGone`].
    pub fn probe(&self, src: impl Into<Source>, tag: impl Into<TagMatch>) -> Result<Status> {
        let (src, tag) = (src.into(), tag.into());
        if seen::on() {
            return seen::calls::matched(What::new(Kind::Probe).from(self, src).tag_match(tag), src, |s| self.probe(s, tag));
        }
        let (s, t) = self.recv_args(src, tag)?;
        let ctx = self.user_ctx();
        let from = self.peers(s);
        let need = Need::Peers(from.clone());
        let mut e = self.eng()?;
        let mut st = None;
        e.wait_until(&need, |e| {
            st = e.probe_at(ctx, s, t, &from);
            st.is_some()
        })?;
        st.ok_or_else(|| Error::State("probe finished without a message".into()))
    }

    /// Returns the status of a matching message if one is available now.
    ///
    /// # Errors
    /// As [`Comm::probe`].
    pub fn iprobe(&self, src: impl Into<Source>, tag: impl Into<TagMatch>) -> Result<Option<Status>> {
        let (src, tag) = (src.into(), tag.into());
        if seen::on() {
            return seen::calls::answered(What::new(Kind::Iprobe).from(self, src).tag_match(tag), src, |s| self.iprobe(s, tag));
        }
        let (s, t) = self.recv_args(src, tag)?;
        let mut e = self.eng()?;
        if e.progress()? == 0 {
            e.idle_check(&Need::Peers(self.peers(s)))?;
        }
        Ok(e.probe_at(self.user_ctx(), s, t, &self.peers(s)))
    }
}

/// The world communicator of engine `eng`.
pub(crate) fn world_comm(eng: Engine, level: crate::Threading) -> Comm {
    let rank = eng.rank();
    let size = eng.size();
    let machine = crate::coll::Machine { force: eng.cfg.coll, hosts: Default::default() };
    Comm {
        inner: Arc::new(CommInner {
            eng: Arc::new(EngineCell::new(eng, level)),
            coll_seq: Default::default(),
            shm_seq: Default::default(),
            shm_seen_all: Default::default(),
            shm: Default::default(),
            coll_busy: Default::default(),
            machine,
            id: 0,
            rank,
            size,
            members: None,
            attrs: Default::default(),
        }),
    }
}
