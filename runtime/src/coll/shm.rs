//! Shared-memory collectives: barrier, broadcast, reduce and allreduce through flags and slots
//! in the job's segment, as Open MPI's coll/sm and MPICH's release-gather collectives do.
//!
//! # Contexts
//!
//! Each communicator of 2 to `COLL_MAX_RANKS` ranks on the shared-memory fabric holds one of
//! the segment's collective contexts: the world communicator context 0 for the whole job, a
//! communicator from `dup`/`split` one taken from the pool by its rank 0 when it is created
//! (the choice reaches the other members in a point-to-point broadcast, [`assign`]) and given
//! back by the last member that drops it. When the pool is exhausted, or on the in-process and
//! single-rank fabrics, the communicator keeps the point-to-point algorithms of
//! [`crate::coll`]. A context's generation (bumped at each allocation) is the high half of
//! every flag value, so flags an earlier communicator left behind never look current.
//!
//! # One call
//!
//! Every call has a number `s`: how many calls went through the communicator's slots
//! before it (`CommInner::shm_seq`; the collectives that never use the slots, such as gather
//! and scatter, are not counted, see the reuse rule below). It uses the slots of parity
//! `s % 2`. A rank writes its data (a reduction operand,
//! or the broadcast root's buffer) and a description of the call (kind, operator, root,
//! length) into its slot, then stores `gen << 32 | s` into its arrival word. Then, in one of
//! two ways:
//!
//! - **All-to-all** (communicators of up to [`ALL_TO_ALL_MAX_RANKS`] ranks): every rank waits
//!   until every other rank has arrived, checks that all described the same call, and reads
//!   what it needs out of the others' slots itself; a rank that wants a reduction's result
//!   combines all operands in rank order (rank 0's on the left, so every rank gets the same
//!   bits). One cache-line transfer is on the critical path instead of two (arrival, then
//!   release), and when ranks outnumber cores, no rank waits for a leader that waits for its
//!   turn on a core to combine and release. Each rank reads `n - 1` arrival words, hence the
//!   limit. A broadcast is the exception: its root publishes and leaves, and the others wait
//!   for the root alone, copy, and only then arrive (`Call::bcast_direct`).
//! - **Through a leader** (larger communicators): rank 0 does not write its data; it waits
//!   until every rank has arrived, checks that all described the same call, combines the
//!   operands in rank order (its own on the left), writes the result into its own slot, a
//!   status word, and stores `gen << 32 | s` into the context's release word. The others wait
//!   for the release and copy what they need out of the leader's (or the root's) slot.
//!
//! Reuse is safe without acknowledgements: a rank writes its slot of parity `s % 2` again only
//! in call `s + 2`, after it saw every rank arrive in call `s + 1` (all-to-all: every arrival
//! first waits for that, which after any call but a broadcast from this rank holds at once) or
//! the release of call `s + 1`, which the leader gives only after that; and every rank
//! arrives in `s + 1` only after it finished reading in call `s`. So `s + 1` must be a call
//! through the slots: a gather or scatter in between synchronises nothing (a rank that only
//! sends leaves at once), which is why those are not counted.
//!
//! Messages larger than a slot, or above the measured crossover, use the point-to-point
//! algorithms after the same arrival and release without data (a handshake): ranks that pass
//! different lengths thus get an error instead of some of them taking the shared-memory path
//! and the others waiting in point-to-point (all of them, except the root of a broadcast that
//! took the slots: it does not wait to hear).
//!
//! # Waiting and failures
//!
//! A waiting rank keeps driving point-to-point progress, backs off as any wait does and sleeps
//! on its doorbell; every store another rank waits for is followed by a wake of that rank (in
//! the all-to-all calls, by every rank once it saw all arrivals: an earlier wake would only
//! rouse a rank that still has someone to wait for). In
//! the slow phase it checks liveness: a rank it waits for that departed, a failed peer, or an
//! abort notice for this call ([`crate::engine`]'s `CTL_COLL_ABORT`) ends the wait with
//! [`Error::PeerGone`]. In an all-to-all call every rank that waits for the departed one finds
//! that out itself; through a leader, the leader that finds a rank departed releases the
//! others with that news in the status word.

use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};

use tmpi_transport::shm::segment::{Segment, COLL_SLOT_BYTES};

use crate::comm::Comm;
use crate::engine::{Engine, Need, Peers, Slot};
use crate::error::{Error, Result};
use crate::op::{check_op, Op, Reducible};
use crate::sync::EngineGuard;

/// Largest payload (bytes) that goes through the slots; larger calls use point-to-point after
/// a handshake. Measured on 2 to 32 ranks (bench/results/shmcoll.md); at most a slot.
pub(crate) const SHM_MAX_BYTES: usize = COLL_SLOT_BYTES;

/// Largest communicator whose calls go all-to-all (every rank waits for every other rank's
/// arrival and reads the slots itself, see the module docs); larger ones gather at a leader.
pub(crate) const ALL_TO_ALL_MAX_RANKS: usize = 8;

/// Kinds of call, in the description word.
const KIND_BARRIER: u64 = 1;
const KIND_BCAST: u64 = 2;
const KIND_REDUCE: u64 = 3;
const KIND_ALLREDUCE: u64 = 4;
/// The call failed its local argument checks on this rank.
const KIND_BAD: u64 = 0x7f;
/// Set in the kind of a handshake (data too large for a slot; point-to-point follows).
const KIND_HANDSHAKE: u64 = 0x80;

/// Status of a released call (low half of its status word; the high half is the call's
/// sequence number): fine.
const ST_OK: u32 = 0;
/// Status: ranks described different calls (erroneous program).
const ST_MISMATCH: u32 = 1;
/// Status: world rank `status - ST_GONE` departed.
const ST_GONE: u32 = 2;

/// Gives a new communicator its collective context (collective over `comm`): its rank 0 takes
/// one from the pool and broadcasts the choice. Communicators that cannot use one (another
/// fabric, one rank, too many ranks) get [`Slot::None`] without communication.
///
/// # Errors
/// [`Error::PeerGone`] from the broadcast.
pub(crate) fn assign(comm: &Comm) -> Result<()> {
    let n = comm.size();
    let eligible = {
        let e = comm.eng()?;
        e.cfg.shm_coll && e.shm_segment().is_some_and(|s| n >= 2 && n <= s.coll_ranks())
    };
    if !eligible {
        comm.inner.shm.set(Slot::None);
        return Ok(());
    }
    let mut choice = [0u32; 2];
    if comm.rank() == 0 {
        if let Some((ctx, gen)) = comm.eng()?.shm_segment().and_then(|s| s.coll_alloc(n)) {
            choice = [ctx as u32, gen];
            // Set at once, so that dropping the communicator gives it back even if the
            // broadcast fails.
            comm.inner.shm.set(Slot::Ctx { ctx: ctx as u16, gen });
        }
    }
    let c = crate::coll_ctx::CollCtx::new(comm)?;
    c.finish(crate::coll::run::bcast(&c, bytemuck::cast_slice_mut(&mut choice), 0))?;
    comm.inner.shm.set(if choice[0] == 0 { Slot::None } else { Slot::Ctx { ctx: choice[0] as u16, gen: choice[1] } });
    Ok(())
}

/// One collective call on the slots of a communicator.
pub(crate) struct Call<'a> {
    comm: &'a Comm,
    ctx: usize,
    /// `gen << 32 | n`, `n` the call's number among the calls through the context's slots
    /// (`CommInner::shm_seq`): the value of this call's arrival and release words.
    flag: u64,
    /// The call's sequence number, as its tags carry it (for abort notices).
    seq: u32,
    parity: usize,
}

/// Description of a call: kind, operator, root, element size in the first word; byte length
/// in the second.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Desc {
    word: u64,
    len: u64,
}

impl Desc {
    fn new(kind: u64, op: Option<Op>, root: usize, elem: usize, len: usize) -> Self {
        let op = op.and_then(|o| Op::ALL.iter().position(|&x| x == o)).map_or(0xff, |i| i as u64);
        Desc { word: kind | op << 8 | (elem as u64 & 0xffff) << 16 | (root as u64 & 0xffff_ffff) << 32, len: len as u64 }
    }
}

impl<'a> Call<'a> {
    /// The call with sequence number `seq` (the communicator's counter before this call) on
    /// `comm`, if `comm` has a context; `None`: use point-to-point.
    #[inline(always)]
    pub(crate) fn new(comm: &'a Comm, seq: u32) -> Option<Self> {
        let (ctx, gen) = match comm.inner.shm.get() {
            Slot::Ctx { ctx, gen } => (usize::from(ctx), gen),
            Slot::None => return None,
            Slot::Unset => Self::first_use(comm)?,
        };
        // The slots go by the context's own count of calls, not by `seq`: a collective
        // that does not pass through them (gather, scatter...) lets a rank leave before the
        // others have read what it wrote in the call before, so it cannot stand for `s + 1`
        // in the reuse rule (see the module docs).
        let n = comm.inner.shm_seq.load(Relaxed);
        comm.inner.shm_seq.store(n.wrapping_add(1), Relaxed);
        Some(Call { comm, ctx, flag: u64::from(gen) << 32 | u64::from(n), seq: seq & 0xffff, parity: (n & 1) as usize })
    }

    /// The first call on `comm` while its slot is unset: the world communicator takes context
    /// 0 (if the job's segment has room for its ranks and the slots are on); any other
    /// communicator would have got its context from [`assign`] when it was made, so it has
    /// none. Returns the context and its generation.
    #[cold]
    #[inline(never)]
    fn first_use(comm: &Comm) -> Option<(usize, u32)> {
        let world = comm.inner.id == 0 && comm.inner.members.is_none();
        let gen = {
            let e = comm.eng().ok()?;
            e.shm_segment()
                .filter(|s| e.cfg.shm_coll && world && comm.size() >= 2 && comm.size() <= s.coll_ranks())
                .map(|s| s.coll_world_gen())
        };
        match gen {
            Some(gen) => {
                comm.inner.shm.set(Slot::Ctx { ctx: 0, gen });
                Some((0, gen))
            }
            None => {
                comm.inner.shm.set(Slot::None);
                None
            }
        }
    }

    /// Blocks until every rank has called it.
    #[inline(always)]
    pub(crate) fn barrier(&self) -> Result<()> {
        let mut e = self.comm.eng()?;
        let desc = Desc::new(KIND_BARRIER, None, 0, 0, 0);
        if self.all_to_all() {
            return self.arrive_all(&mut e, desc, None, |_| false);
        }
        self.exchange(&mut e, desc, None, |_| Ok(()))
    }

    /// Whether this call goes all-to-all rather than through the leader.
    fn all_to_all(&self) -> bool {
        self.comm.size() <= ALL_TO_ALL_MAX_RANKS
    }

    /// Broadcast of `buf` from `root` (checked by the caller).
    pub(crate) fn bcast(&self, buf: &mut [u8], root: usize) -> Result<()> {
        if buf.len() > SHM_MAX_BYTES {
            return self.handshake(Desc::new(KIND_BCAST | KIND_HANDSHAKE, None, root, 1, buf.len()));
        }
        let rank = self.comm.rank();
        let mut e = self.comm.eng()?;
        let desc = Desc::new(KIND_BCAST, None, root, 1, buf.len());
        let (ctx, par) = (self.ctx, self.parity);
        if self.all_to_all() {
            return self.bcast_direct(&mut e, desc, buf, root);
        }
        let data = (rank == root && rank != 0).then_some(&buf[..]);
        self.exchange(&mut e, desc, data, |seg| if root == 0 { seg.coll_write(ctx, 0, par, buf).map_err(Error::from) } else { Ok(()) })?;
        if rank != root {
            let seg = shm(&e)?;
            // SAFETY: the root writes this slot again only in call s + 2, after every rank
            // (this one included) arrived in s + 1; this rank copies before it arrives there.
            buf.copy_from_slice(unsafe { seg.coll_data(ctx, root, par, buf.len()) });
        }
        Ok(())
    }

    /// The all-to-all broadcast, without a synchronisation of all ranks: the root publishes its
    /// buffer and leaves; every other rank waits for the root's arrival alone, copies, and
    /// then arrives itself (so its arrival also says it has finished reading). As an MPI
    /// broadcast may, the root does not wait for the others: at 4 ranks on 2 cores a
    /// broadcast of up to a slot took as long as a barrier (1.4-2.2 us, Open MPI's 0.3-0.4),
    /// since the root waited for the last rank to be scheduled. The reuse of the root's slot
    /// two calls later is made safe by [`Call::await_previous`].
    ///
    /// A rank that finds that the root described another call arrives all the same (its own
    /// description tells the others) and fails; the root itself checks nothing.
    fn bcast_direct(&self, e: &mut EngineGuard<'_>, desc: Desc, buf: &mut [u8], root: usize) -> Result<()> {
        let (ctx, par, flag) = (self.ctx, self.parity, self.flag);
        let (n, rank) = (self.comm.size(), self.comm.rank());
        let others = |me: usize| (0..n).filter(move |&j| j != me);
        if rank == root {
            self.publish(e, desc, Some(buf))?;
            e.shm_wake_all(others(rank).map(|j| self.comm.world_rank(j)));
            return Ok(());
        }
        self.wait(e, |seg| (!released(seg.coll_slot(ctx, root, par).flag.load(Acquire), flag)).then_some(root))?;
        let outcome = {
            let seg = shm(e)?;
            let s = seg.coll_slot(ctx, root, par);
            if s.flag.load(Acquire) != flag {
                // The root has gone two calls further, which it does only after this rank
                // arrived in the next one: it failed a call since (see `arrive_all`).
                let gone = (0..n).map(|k| self.comm.world_rank(k)).find(|&w| e.departed(w));
                Err(Error::PeerGone { rank: gone.unwrap_or_else(|| self.comm.world_rank(root)) })
            } else if s.meta[0].load(Relaxed) != desc.word || s.meta[1].load(Relaxed) != desc.len {
                Err(mismatch())
            } else {
                // SAFETY: the root wrote this slot before its arrival, which this rank saw
                // (acquire), and writes it again only in call s + 2, after every rank (this
                // one included) arrived in s + 1; this rank copies before it arrives anywhere.
                buf.copy_from_slice(unsafe { seg.coll_data(ctx, root, par, buf.len()) });
                Ok(())
            }
        };
        self.publish(e, desc, None)?;
        e.shm_wake_all(others(rank).map(|j| self.comm.world_rank(j)));
        outcome
    }

    /// In an all-to-all communicator, before a rank's arrival in call `s` (its slot of that
    /// parity is about to be written): waits until every other rank has arrived in call
    /// `s - 1`. A rank arrives in `s - 1` only after it finished reading in `s - 2`, the last
    /// call that used this slot, so nobody still reads it. After a call in which this rank
    /// saw every other arrive (all but a broadcast's root) this holds at once, and
    /// `CommInner::shm_seen_all` says so without reading the others' flags; after a
    /// broadcast from this rank it is the wait the root skipped.
    #[inline(always)]
    fn await_previous(&self, e: &mut EngineGuard<'_>) -> Result<()> {
        let seq = self.flag as u32;
        if !self.all_to_all() || seq == 0 || self.comm.inner.shm_seen_all.load(Relaxed) == seq {
            return Ok(());
        }
        self.await_arrivals_in_previous(e)
    }

    /// [`Call::await_previous`] when it has to look: reads the others' flags of call `s - 1`.
    #[inline(never)]
    fn await_arrivals_in_previous(&self, e: &mut EngineGuard<'_>) -> Result<()> {
        let (ctx, prev, ppar) = (self.ctx, self.flag - 1, 1 - self.parity);
        let (n, rank) = (self.comm.size(), self.comm.rank());
        let mut next = 0;
        let mut missing = |seg: &Segment| {
            while next < n && (next == rank || released(seg.coll_slot(ctx, next, ppar).flag.load(Acquire), prev)) {
                next += 1;
            }
            (next < n).then_some(next)
        };
        if missing(shm(e)?).is_some() {
            self.wait(e, &mut missing)?;
        }
        Ok(())
    }

    /// Reduction of `send` into `recv` at `root` (`all`: at every rank). `recv` is `Some`
    /// where a result is wanted, with the length of `send`.
    pub(crate) fn reduce<T: Reducible>(&self, send: &[T], recv: Option<&mut [T]>, op: Op, root: usize, all: bool) -> Result<()> {
        let bytes = std::mem::size_of_val(send);
        let kind = if all { KIND_ALLREDUCE } else { KIND_REDUCE };
        let desc = |k| Desc::new(k, Some(op), root, std::mem::size_of::<T>(), bytes);
        if bytes > SHM_MAX_BYTES {
            return self.handshake(desc(kind | KIND_HANDSHAKE));
        }
        let mut e = self.comm.eng()?;
        if self.all_to_all() {
            // The root of a reduce needs no slot of its own.
            let publish = all || self.comm.rank() != root;
            self.reduce_all_to_all(&mut e, desc(kind), (send, publish), recv, op)
        } else {
            self.reduce_through_leader(&mut e, desc(kind), send, recv, op)
        }
    }

    /// [`Call::reduce`] among few ranks: every rank that wants the result (`recv`) combines
    /// all operands itself, in rank order (the same bits everywhere). `send` goes to this
    /// rank's slot when `publish`.
    fn reduce_all_to_all<T: Reducible>(
        &self,
        e: &mut EngineGuard<'_>,
        desc: Desc,
        (send, publish): (&[T], bool),
        recv: Option<&mut [T]>,
        op: Op,
    ) -> Result<()> {
        let (rank, ctx, par, n) = (self.comm.rank(), self.ctx, self.parity, self.comm.size());
        let bytes = std::mem::size_of_val(send);
        let data = publish.then_some(bytemuck::cast_slice::<T, u8>(send));
        let wants = recv.is_some();
        self.arrive_all(e, desc, data, |_| wants)?;
        let Some(acc) = recv else { return Ok(()) };
        let seg = shm(e)?;
        for j in 0..n {
            let other: &[T] = if j == rank {
                send
            } else {
                // SAFETY: rank j wrote this slot before its arrival, which this rank saw, and
                // writes it again only in call s + 2, after this rank arrived in s + 1.
                bytemuck::cast_slice(unsafe { seg.coll_data(ctx, j, par, bytes) })
            };
            if j == 0 {
                acc.copy_from_slice(other);
            } else {
                T::reduce_into(op, acc, other)?;
            }
        }
        Ok(())
    }

    /// [`Call::reduce`] among many ranks: the leader (rank 0) combines every operand in
    /// rank order and writes the result to its slot, from which the others that want it copy.
    fn reduce_through_leader<T: Reducible>(
        &self,
        e: &mut EngineGuard<'_>,
        desc: Desc,
        send: &[T],
        mut recv: Option<&mut [T]>,
        op: Op,
    ) -> Result<()> {
        let (rank, ctx, par, n) = (self.comm.rank(), self.ctx, self.parity, self.comm.size());
        let bytes = std::mem::size_of_val(send);
        let data = (rank != 0).then_some(bytemuck::cast_slice::<T, u8>(send));
        self.exchange(e, desc, data, |seg| {
            let mut scratch;
            let acc: &mut [T] = match recv.as_deref_mut() {
                Some(r) => r,
                None => {
                    scratch = send.to_vec();
                    &mut scratch
                }
            };
            acc.copy_from_slice(send);
            for j in 1..n {
                // SAFETY: rank j wrote this slot before its arrival, which the leader saw, and
                // writes it again only after this call's release.
                let other = unsafe { seg.coll_data(ctx, j, par, bytes) };
                T::reduce_into(op, acc, bytemuck::cast_slice(other))?;
            }
            seg.coll_write(ctx, 0, par, bytemuck::cast_slice(acc)).map_err(Error::from)
        })?;
        if let (true, Some(r)) = (rank != 0, recv) {
            let seg = shm(e)?;
            // SAFETY: the leader writes its slot of this parity again only in call s + 2, after
            // this rank arrived in s + 1.
            let res = unsafe { seg.coll_data(ctx, 0, par, bytes) };
            bytemuck::cast_slice_mut::<T, u8>(r).copy_from_slice(res);
        }
        Ok(())
    }

    /// Takes part in the call as a rank whose arguments failed the local checks: the others
    /// get an error rather than wait for this rank.
    pub(crate) fn refuse(&self) -> Result<()> {
        let mut e = self.comm.eng()?;
        let desc = Desc::new(KIND_BAD, None, 0, 0, 0);
        let r =
            if self.all_to_all() { self.arrive_all(&mut e, desc, None, |_| false) } else { self.exchange(&mut e, desc, None, |_| Ok(())) };
        r.or_else(|err| match err {
            Error::InvalidBuffer(_) => Ok(()),
            other => Err(other),
        })
    }

    /// Arrival and release without data: every rank described the same call (whose data then
    /// goes point-to-point).
    fn handshake(&self, desc: Desc) -> Result<()> {
        let mut e = self.comm.eng()?;
        if self.all_to_all() {
            return self.arrive_all(&mut e, desc, None, |_| false);
        }
        self.exchange(&mut e, desc, None, |_| Ok(()))
    }

    /// The all-to-all arrival: publishes `data` and `desc`, then waits until every other rank
    /// has arrived and checks that all described the same call (`needs_data(j)`: this rank
    /// reads rank `j`'s slot afterwards). Every rank, once it saw all
    /// arrivals, wakes the ranks that sleep on their doorbells (see [`Engine::shm_wake_all`]:
    /// one fence and a load of each doorbell when none sleeps). That cannot miss a sleeper: a
    /// rank sleeps only after it announced it and, after a fence, still missed the arrival of
    /// some rank `m`; `m`'s fence comes after its own arrival, so if it came before the
    /// sleeper's, the sleeper would have seen that arrival, and if it came after, `m` sees the
    /// announcement. And `m` gets through: the last rank to announce a sleep sees every
    /// arrival of the ranks that announced before it, so not every rank can sleep at once.
    /// The fence comes after the wait rather than right after the arrival, so that the
    /// arrival's store drains while the rank reads the others' flags.
    fn arrive_all(&self, e: &mut EngineGuard<'_>, desc: Desc, data: Option<&[u8]>, needs_data: impl Fn(usize) -> bool) -> Result<()> {
        let (ctx, par, flag) = (self.ctx, self.parity, self.flag);
        let n = self.comm.size();
        let rank = self.comm.rank();
        // The first rank (in rank order) whose arrival this rank has not seen yet.
        let mut next = usize::from(rank == 0);
        let mut missing = |seg: &Segment| {
            while next < n && (next == rank || released(seg.coll_slot(ctx, next, par).flag.load(Acquire), flag)) {
                next += 1;
            }
            (next < n).then_some(next)
        };
        self.publish(e, desc, data)?;
        if missing(shm(e)?).is_some() {
            self.wait(e, &mut missing)?;
        }
        self.comm.inner.shm_seen_all.store((flag as u32).wrapping_add(1), Relaxed);
        e.shm_wake_all((0..n).filter(|&j| j != rank).map(|j| self.comm.world_rank(j)));
        let seg = shm(e)?;
        // A flag of a later call (same parity, so `s + 2` on): that rank got through this
        // call, then failed the next one (a member departed; it cannot have ended `s + 1`
        // without this rank) and went on. It did arrive here, but its description and data
        // for this call are overwritten: a call that needs its data fails as the next one did.
        let mut overtaken = None;
        let mut same = true;
        for j in (0..n).filter(|&j| j != rank) {
            let s = seg.coll_slot(ctx, j, par);
            if s.flag.load(Acquire) != flag {
                overtaken.get_or_insert(j);
                continue;
            }
            same &= s.meta[0].load(Relaxed) == desc.word && s.meta[1].load(Relaxed) == desc.len;
        }
        if !same {
            return Err(mismatch());
        }
        match overtaken {
            Some(j) if needs_data(j) => {
                let gone = (0..n).map(|k| self.comm.world_rank(k)).find(|&w| e.departed(w));
                Err(Error::PeerGone { rank: gone.unwrap_or_else(|| self.comm.world_rank(j)) })
            }
            _ => Ok(()),
        }
    }

    /// This rank's arrival in the call: its data (if any) and description into its slot, then
    /// its flag (release), so whoever sees the flag sees both.
    #[inline(always)]
    fn publish(&self, e: &mut EngineGuard<'_>, desc: Desc, data: Option<&[u8]>) -> Result<()> {
        self.await_previous(e)?;
        let (ctx, par, rank) = (self.ctx, self.parity, self.comm.rank());
        let seg = shm(e)?;
        if let Some(d) = data {
            seg.coll_write(ctx, rank, par, d)?;
        }
        let slot = seg.coll_slot(ctx, rank, par);
        slot.meta[0].store(desc.word, Relaxed);
        slot.meta[1].store(desc.len, Relaxed);
        slot.flag.store(self.flag, Release);
        Ok(())
    }

    /// One arrival and release. Ranks other than the leader publish `data` and `desc` and wait
    /// for the release; the leader waits for all of them, checks their descriptions against
    /// its own, runs `combine` and releases.
    fn exchange(
        &self,
        e: &mut EngineGuard<'_>,
        desc: Desc,
        data: Option<&[u8]>,
        combine: impl FnOnce(&Segment) -> Result<()>,
    ) -> Result<()> {
        if self.comm.rank() != 0 {
            return self.follow(e, desc, data);
        }
        let outcome = match self.arrivals(e, desc) {
            Ok(()) => combine(shm(e)?),
            err => err,
        };
        let code = match &outcome {
            Ok(()) => ST_OK,
            Err(Error::PeerGone { rank }) => ST_GONE.saturating_add(u32::try_from(*rank).unwrap_or(u32::MAX - ST_GONE)),
            Err(_) => ST_MISMATCH,
        };
        self.release(e, code)?;
        outcome
    }

    /// [`Call::exchange`] on a rank other than the leader: publishes, waits for the release
    /// and returns the leader's outcome.
    fn follow(&self, e: &mut EngineGuard<'_>, desc: Desc, data: Option<&[u8]>) -> Result<()> {
        let (ctx, par, flag) = (self.ctx, self.parity, self.flag);
        self.publish(e, desc, data)?;
        e.shm_wake(self.comm.world_rank(0));
        self.wait(e, |seg| (!released(seg.coll_release(ctx).0.load(Acquire), flag)).then_some(0))?;
        let word = shm(e)?.coll_release(ctx).1[par].load(Relaxed);
        let code = word as u32;
        if (word >> 32) as u32 != flag as u32 {
            // The leader has ended two more calls since: the one after this failed (it
            // did not wait for this rank), so a rank departed. This call's own outcome is
            // gone; report the departure.
            let rank = if code >= ST_GONE { (code - ST_GONE) as usize } else { self.comm.world_rank(0) };
            return Err(Error::PeerGone { rank });
        }
        match code {
            ST_OK => Ok(()),
            ST_MISMATCH => Err(mismatch()),
            c if c >= ST_GONE => Err(Error::PeerGone { rank: (c - ST_GONE) as usize }),
            _ => Err(Error::State(format!("shared-memory collective: unknown status {code:#x}"))),
        }
    }

    /// The leader's side of [`Call::exchange`]: waits for every other rank's arrival and
    /// checks that each described the call as `desc` does.
    fn arrivals(&self, e: &mut EngineGuard<'_>, desc: Desc) -> Result<()> {
        let (ctx, par, flag) = (self.ctx, self.parity, self.flag);
        let n = self.comm.size();
        let mut next = 1;
        self.wait(e, |seg| {
            while next < n && seg.coll_slot(ctx, next, par).flag.load(Acquire) == flag {
                next += 1;
            }
            (next < n).then_some(next)
        })?;
        let seg = shm(e)?;
        let same = (1..n).all(|j| {
            let s = seg.coll_slot(ctx, j, par);
            s.meta[0].load(Relaxed) == desc.word && s.meta[1].load(Relaxed) == desc.len
        });
        if same {
            Ok(())
        } else {
            Err(mismatch())
        }
    }

    /// The leader releases the call with status `code` and wakes the other ranks.
    fn release(&self, e: &mut EngineGuard<'_>, code: u32) -> Result<()> {
        let (ctx, par, flag) = (self.ctx, self.parity, self.flag);
        {
            let seg = shm(e)?;
            let (release, st) = seg.coll_release(ctx);
            st[par].store((flag & 0xffff_ffff) << 32 | u64::from(code), Relaxed);
            release.store(flag, Release);
        }
        for j in 1..self.comm.size() {
            e.shm_wake(self.comm.world_rank(j));
        }
        Ok(())
    }

    /// Waits, driving progress, until `pending(segment)` is `None`; it names the rank of the
    /// communicator still awaited otherwise. Ends with [`Error::PeerGone`] as the module docs
    /// say.
    fn wait(&self, e: &mut EngineGuard<'_>, mut pending: impl FnMut(&Segment) -> Option<usize>) -> Result<()> {
        let mut b = e.backoff();
        loop {
            let Some(who) = pending(shm(e)?) else { return Ok(()) };
            if e.progress()? != 0 {
                b.reset();
                continue;
            }
            if e.idle(&mut b, |seg| pending(seg).is_none()) {
                if let Some(gone) = e.coll_aborted(self.comm.coll_ctx(), self.seq) {
                    return Err(Error::PeerGone { rank: gone });
                }
                let w = self.comm.world_rank(who);
                let gone = match e.check_gone(&Need::Peers(Peers::rank(w))) {
                    Err(err) => Some(err),
                    Ok(()) => e.departed(w).then_some(Error::PeerGone { rank: w }),
                };
                if let Some(err) = gone {
                    // A rank stores its flag before it departs, and its departure was read
                    // first: a flag it set is visible now, and then nothing is missing.
                    if pending(shm(e)?).is_none() {
                        return Ok(());
                    }
                    return Err(err);
                }
            }
        }
    }
}

/// Whether release word `rel` says the call with flag value `flag` has ended: same
/// generation, and its sequence number is this call's or a later one (after a failure the
/// leader may end the next call before this rank saw the release of this one).
fn released(rel: u64, flag: u64) -> bool {
    rel >> 32 == flag >> 32 && (rel as u32).wrapping_sub(flag as u32) as i32 >= 0
}

fn shm(e: &Engine) -> Result<&Segment> {
    e.shm_segment().ok_or_else(|| Error::State("shared-memory collective without a shared-memory fabric".into()))
}

fn mismatch() -> Error {
    Error::InvalidBuffer("collective: ranks passed different arguments (kind, root, operator or length)".into())
}

/// The local argument checks of a reduction, as the point-to-point algorithms make them.
pub(crate) fn check_reduce<T: Reducible>(send: &[T], recv: Option<&[T]>, op: Op, root: usize, size: usize, is_root: bool) -> Result<()> {
    crate::coll::check_root(root, size)?;
    check_op::<T>(op)?;
    if is_root {
        let r = recv.ok_or_else(|| Error::InvalidBuffer("reduce: the root must pass a receive buffer".into()))?;
        if r.len() != send.len() {
            return Err(Error::InvalidBuffer(format!("reduce: receive buffer has {} elements, send buffer {}", r.len(), send.len())));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::world::run_shm_threads;

    /// Small segments: the tests run many jobs at once.
    fn cfg() -> Config {
        Config { shm_ring_size: 64 << 10, ..Config::default() }
    }

    /// Element counts (u64) below, at and above the slot size: the slot path and the
    /// handshake + point-to-point path.
    const COUNTS: [usize; 6] = [0, 1, 3, 128, SHM_MAX_BYTES / 8, SHM_MAX_BYTES / 8 + 1];

    fn check_all(c: &Comm, rounds: usize) {
        let (r, n) = (c.rank() as u64, c.size() as u64);
        for round in 0..rounds as u64 {
            for &k in &COUNTS {
                let send: Vec<u64> = (0..k as u64).map(|i| i * 7 + r + round).collect();
                let mut out = vec![0u64; k];
                c.allreduce(&send, &mut out, Op::Sum).unwrap();
                let want: Vec<u64> = (0..k as u64).map(|i| n * (i * 7 + round) + n * (n - 1) / 2).collect();
                assert_eq!(out, want, "allreduce k={k} n={n}");
                let root = (round as usize + k) % c.size();
                let mut b: Vec<u64> = if c.rank() == root { (0..k as u64).map(|i| i ^ round).collect() } else { vec![9; k] };
                c.bcast(&mut b, root).unwrap();
                assert!(b.iter().enumerate().all(|(i, &x)| x == i as u64 ^ round), "bcast k={k} root={root}");
                let mut red = vec![0u64; k];
                let mine = (c.rank() == root).then_some(&mut red[..]);
                c.reduce(&send, mine, Op::Max, root).unwrap();
                if c.rank() == root {
                    let want: Vec<u64> = (0..k as u64).map(|i| i * 7 + n - 1 + round).collect();
                    assert_eq!(red, want, "reduce k={k} root={root}");
                }
                c.barrier().unwrap();
            }
        }
    }

    #[test]
    fn collectives_at_1_to_9_ranks() {
        for n in 1..=9 {
            run_shm_threads(n, cfg(), |w| {
                let expect_shm = n >= 2;
                check_all(&w, 3);
                assert_eq!(matches!(w.inner.shm.get(), Slot::Ctx { ctx: 0, .. }), expect_shm, "world uses context 0");
            });
        }
    }

    /// Communicators from dup and split get their own contexts, stay correct when their
    /// collectives interleave with the world's and with point-to-point traffic, and give the
    /// contexts back when dropped.
    #[test]
    fn dup_and_split_interleaved_with_p2p() {
        run_shm_threads(6, cfg(), |w| {
            let d = w.dup().unwrap();
            let s = w.split(Some(w.rank() as u32 % 2), -(w.rank() as i32)).unwrap().unwrap();
            assert!(matches!(d.inner.shm.get(), Slot::Ctx { .. }));
            assert!(matches!(s.inner.shm.get(), Slot::Ctx { .. }));
            for i in 0..20u64 {
                let right = (w.rank() + 1) % w.size();
                let left = (w.rank() + w.size() - 1) % w.size();
                let mut got = [0u64];
                // An eager send left unreceived across the collectives below.
                w.send(&[i * 100 + w.rank() as u64], right, 5).unwrap();
                let mut a = [0u64];
                s.allreduce(&[1u64], &mut a, Op::Sum).unwrap();
                assert_eq!(a[0], 3);
                d.barrier().unwrap();
                w.recv(&mut got, left, 5).unwrap();
                assert_eq!(got[0], i * 100 + left as u64);
                let mut b = [0u64];
                d.allreduce(&[w.rank() as u64], &mut b, Op::Max).unwrap();
                assert_eq!(b[0], 5);
                // In `s` the ranks are ordered by descending world rank.
                let mut m = [if s.rank() == 0 { i } else { 0 }];
                s.bcast(&mut m, 0).unwrap();
                assert_eq!(m[0], i);
            }
            check_all(&s, 1);
            check_all(&d, 1);
        });
    }

    /// More communicators than contexts: the others use point-to-point, and every context
    /// comes back when its communicator is dropped.
    #[test]
    fn pool_exhaustion_falls_back_and_recycles() {
        run_shm_threads(3, cfg(), |w| {
            for _ in 0..2 {
                let comms: Vec<Comm> = (0..tmpi_transport::shm::segment::COLL_CONTEXTS + 4).map(|_| w.dup().unwrap()).collect();
                let with = comms.iter().filter(|c| matches!(c.inner.shm.get(), Slot::Ctx { .. })).count();
                assert_eq!(with, tmpi_transport::shm::segment::COLL_CONTEXTS - 1);
                for c in comms.iter().rev() {
                    let mut a = [0u32];
                    c.allreduce(&[c.rank() as u32 + 1], &mut a, Op::Sum).unwrap();
                    assert_eq!(a[0], 6);
                }
                w.barrier().unwrap();
            }
        });
    }

    /// A broadcast root leaves without waiting: in a run of broadcasts from one root, with
    /// other calls between them, while one rank sleeps now and then, the root cannot
    /// overwrite a slot before the slowest rank has read it, and every rank gets every
    /// buffer.
    #[test]
    fn a_broadcast_root_that_runs_ahead_overwrites_nothing_unread() {
        for n in [2, 3, 4, ALL_TO_ALL_MAX_RANKS] {
            run_shm_threads(n, cfg(), |w| {
                let rank = w.rank();
                for round in 0..40u64 {
                    let root = (round / 8) as usize % n;
                    if rank == (round as usize + 1) % n && round % 5 == 0 {
                        std::thread::sleep(std::time::Duration::from_millis(5));
                    }
                    let len = 1 + (round as usize * 37) % (SHM_MAX_BYTES / 8);
                    let mut b: Vec<u64> = if rank == root { (0..len as u64).map(|i| i * 3 + round).collect() } else { vec![0; len] };
                    w.bcast(&mut b, root).unwrap();
                    assert!(b.iter().enumerate().all(|(i, &x)| x == i as u64 * 3 + round), "n={n} round={round} rank={rank}");
                    if round % 7 == 6 {
                        let mut out = [0u64];
                        w.allreduce(&[round], &mut out, Op::Sum).unwrap();
                        assert_eq!(out[0], round * n as u64);
                    }
                    if round % 11 == 10 {
                        w.barrier().unwrap();
                    }
                }
            });
        }
    }

    /// Ranks that disagree about a call get errors, not a hang, and the next call works.
    #[test]
    fn mismatched_calls_are_errors() {
        let res = run_shm_threads(4, cfg(), |w| {
            let k = if w.rank() == 3 { 2 } else { 3 };
            let mut out = vec![0u64; k];
            let a = w.allreduce(&vec![1u64; k], &mut out, Op::Sum);
            let big = if w.rank() == 1 { 10 } else { SHM_MAX_BYTES + 10 };
            let b = w.bcast(&mut vec![0u8; big], 0);
            let mut bad = [0u32; 2];
            // Only rank 2 passes a wrong receive length.
            let len = if w.rank() == 2 { 1 } else { 2 };
            let c = w.allreduce(&[1u32, 2][..len], &mut bad, Op::Sum);
            let mut ok = [0u32];
            w.allreduce(&[1u32], &mut ok, Op::Sum).unwrap();
            (a.is_err(), b.is_err(), c.is_err(), ok[0])
        });
        for (a, b, c, ok) in res {
            assert!(a && b && c, "{a} {b} {c}");
            assert_eq!(ok, 4);
        }
    }

    /// A rank that comes late, after the others went to sleep on their doorbells, in the
    /// all-to-all calls and through the leader: every call still ends with the right result.
    #[test]
    fn a_late_rank_ends_the_sleep_of_the_others() {
        for n in [4, ALL_TO_ALL_MAX_RANKS + 1] {
            run_shm_threads(n, cfg(), |w| {
                for round in 0..3u64 {
                    if w.rank() == (round as usize) % n {
                        std::thread::sleep(std::time::Duration::from_millis(30));
                    }
                    let mut out = [0u64];
                    w.allreduce(&[w.rank() as u64 + round], &mut out, Op::Sum).unwrap();
                    let n = n as u64;
                    assert_eq!(out[0], n * (n - 1) / 2 + n * round);
                    w.barrier().unwrap();
                }
            });
        }
    }

    /// A rank whose communicator ends (its thread unwinds) while the others wait in a
    /// shared-memory barrier: they get `PeerGone`, not a hang.
    #[test]
    fn departed_rank_ends_a_barrier() {
        let res = run_shm_threads(4, cfg(), |w| {
            w.barrier().unwrap();
            if w.rank() == 2 {
                return None;
            }
            Some(w.barrier())
        });
        for (r, x) in res.iter().enumerate() {
            if r != 2 {
                assert!(matches!(x, Some(Err(Error::PeerGone { .. }))), "rank {r}: {x:?}");
            }
        }
    }
}
