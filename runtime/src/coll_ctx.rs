//! A communicator's private collective context, one collective call at a time ([`CollCtx`]):
//! the point-to-point the generic algorithms of [`crate::coll`] run on (the [`CollP2p`] trait),
//! with every tag numbered by the call, and the blocking run of a schedule on the engine
//! ([`run_plan`]). The public collective calls (`coll_glue.rs`), the non-blocking ones
//! (`nbc`) and the shared-memory collectives (`coll::shm`) all start their calls here.

use crate::buffer::{RawBuf, RawBufMut};
use crate::coll::plan::Plan;
use crate::coll::select::Setting;
use crate::coll::CollP2p;
use crate::comm::Comm;
use crate::engine::ReqId;
use crate::error::{Error, Result};
use crate::nbc::sched::{Members, Sched};
use crate::seen;
use crate::sync::EngineGuard;

/// Point-to-point on a communicator's collective context, for one collective call: every
/// tag carries the call's sequence number on the communicator (16 bits above the algorithm's
/// own 8), so a message of one collective can never match a receive of another, even when
/// ranks disagree about an argument (root, length) or a rank left one early with an error.
pub(crate) struct CollCtx<'a> {
    comm: &'a Comm,
    seq: u32,
    /// The whole sequence number (shared-memory collectives use all 32 bits).
    full: u32,
    /// This call marked the communicator busy and clears it when dropped.
    busy: bool,
    /// A schedule of this call ran: its own failure was told to the other members where
    /// that was needed (`Sched::fail`; a tolerant plan strands no one).
    ran: std::cell::Cell<bool>,
}

impl Drop for CollCtx<'_> {
    fn drop(&mut self) {
        if self.busy {
            self.comm.inner.coll_busy.leave();
        }
    }
}

impl<'a> CollCtx<'a> {
    /// Starts a collective call on `comm`: the one check every collective makes before
    /// anything else, its shortcuts (one rank, empty buffers) included. Every rank of the
    /// communicator calls it once per collective, first thing, so the numbers agree.
    ///
    /// # Errors
    /// [`Error::State`] when the world was finalized (the communicator outlived it);
    /// [`Error::Thread`] at the thread levels where several threads may call, when the call
    /// overlaps a collective of another thread on the same communicator (erroneous, as in
    /// MPI): it then takes no part.
    #[inline(always)]
    pub(crate) fn new(comm: &'a Comm) -> Result<Self> {
        if comm.inner.eng.is_closed() {
            // The engine's own refusal: `Error::State`, worded as every other call's.
            comm.eng()?;
        }
        let busy = comm.inner.coll_busy.enter(comm.threading())?;
        let seq = comm.inner.coll_seq.update(|s| s.wrapping_add(1));
        Ok(CollCtx { comm, seq: seq & 0xffff, full: seq, busy, ran: std::cell::Cell::new(false) })
    }

    /// The communicator of the call.
    pub(crate) fn comm(&self) -> &'a Comm {
        self.comm
    }

    /// The call's whole sequence number (the shared-memory collectives use all 32 bits).
    pub(crate) fn full_seq(&self) -> u32 {
        self.full
    }

    /// Ends the call with `r`: if it failed, the other members are told (unless it failed
    /// because another member's did), so that none of them waits for this rank's part.
    #[inline]
    pub(crate) fn finish<T>(&self, r: Result<T>) -> Result<T> {
        if let Err(e) = &r {
            self.abort(e);
        }
        r
    }

    /// The call failed with `err`: tells the other members, naming the departed rank (a
    /// departure) or this one (an error of its own before any schedule ran: a bad argument).
    #[cold]
    #[inline(never)]
    fn abort(&self, err: &Error) {
        let c = self.comm;
        let members = || (0..c.size()).map(|i| c.world_rank(i)).collect::<Vec<usize>>().into_iter();
        let Ok(mut e) = c.eng() else { return };
        match err {
            Error::PeerGone { rank } => e.abort_collective(c.coll_ctx(), self.seq, *rank, members()),
            Error::CollectiveFailed { .. } => {}
            _ if self.ran.get() => {}
            _ => e.fail_collective(c.coll_ctx(), self.full, members()),
        }
    }

    #[inline]
    fn tag(&self, tag: u32) -> u32 {
        debug_assert!(tag < 256, "collective tags fit 8 bits");
        self.seq << 8 | (tag & 0xff)
    }
}

/// A schedule a blocking call started, abandoned if the call unwinds before it ended (a
/// user operator panicked), so that the engine forgets the call's buffers before they go.
struct Running<'g, 'e> {
    e: &'g mut EngineGuard<'e>,
    rid: Option<ReqId>,
}

impl Drop for Running<'_, '_> {
    fn drop(&mut self) {
        if let Some(rid) = self.rid.take() {
            self.e.abandon(rid);
        }
    }
}

impl CollCtx<'_> {
    /// Who takes part in this call: the communicator's ranks on its collective context, the
    /// call's tags numbered by its sequence number.
    fn members(&self) -> Members {
        let c = self.comm;
        Members {
            ctx: c.coll_ctx(),
            rank: c.rank(),
            size: c.size(),
            world: c.inner.members.clone(),
            seq: self.seq,
            full: Some(self.full),
            fixed_tag: None,
            keys: None,
        }
    }

    /// The schedule of plan `plan` on this call, over `input` and `output`.
    ///
    /// # Safety
    /// As [`Sched::new`]: the buffers must stay valid, `input` unmodified and `output`
    /// untouched by anyone else, until the schedule has finished or has been abandoned.
    pub(crate) unsafe fn sched(&self, plan: Plan, input: Option<&[u8]>, output: Option<&mut [u8]>) -> Result<Sched> {
        // SAFETY: the caller's contract.
        unsafe { Sched::new(plan, self.members(), input.map(|b| RawBuf::new(b)), output.map(|b| RawBufMut::new(b))) }
    }
}

/// Runs `plan` for `who` on `comm`'s engine to its end (a blocking collective).
///
/// # Errors
/// The plan's first error; transport errors, [`Error::PeerGone`].
pub(crate) fn run_plan(comm: &Comm, who: Members, plan: Plan, input: Option<&[u8]>, output: Option<&mut [u8]>) -> Result<()> {
    // SAFETY: `input` and `output` are borrowed for this call, which returns only once the
    // schedule has finished (it then holds no transfer), or has been abandoned: by
    // `comm::finish` when it fails, by `Running` when the call unwinds. Abandoning abandons
    // every transfer, so the engine forgets the buffers before the borrow ends.
    let mut sched = unsafe { Sched::new(plan, who, input.map(|b| RawBuf::new(b)), output.map(|b| RawBufMut::new(b)))? };
    if seen::tracing() {
        sched.trace_rounds();
    }
    let mut e = comm.eng()?;
    let rid = e.start_nbc(sched);
    let mut run = Running { e: &mut e, rid: Some(rid) };
    let r = crate::comm::finish(run.e, rid);
    run.rid = None;
    r.map(drop)
}

impl CollP2p for CollCtx<'_> {
    fn rank(&self) -> usize {
        self.comm.rank()
    }
    fn size(&self) -> usize {
        self.comm.size()
    }
    fn setting(&self) -> Setting<'_> {
        let m = &self.comm.inner.machine;
        Setting { rank: self.comm.rank(), size: self.comm.size(), force: &m.force, topo: m.hosts.get().and_then(|h| h.topo.as_deref()) }
    }
    fn run(&self, plan: Plan, input: Option<&[u8]>, output: Option<&mut [u8]>) -> Result<()> {
        self.ran.set(true);
        run_plan(self.comm, self.members(), plan, input, output)
    }
    fn send(&self, buf: &[u8], dest: usize, tag: u32) -> Result<()> {
        let f = || self.comm.send_ctx(self.comm.coll_ctx(), buf, dest, self.tag(tag), false);
        if seen::counting() {
            seen::message_out(self.comm.world_rank(dest), buf.len());
        }
        if seen::tracing() {
            return seen::step(seen::Step::Send, self.comm, dest, buf.len(), f);
        }
        f()
    }
    fn recv(&self, buf: &mut [u8], src: usize, tag: u32) -> Result<usize> {
        self.comm.check_rank(src)?;
        let n = buf.len();
        let mut f = move || self.comm.recv_ctx(self.comm.coll_ctx(), buf, Some(src as u32), Some(self.tag(tag))).map(|s| s.len());
        if seen::tracing() {
            return seen::step(seen::Step::Recv, self.comm, src, n, f);
        }
        f()
    }
    fn sendrecv(&self, sbuf: &[u8], dest: usize, stag: u32, rbuf: &mut [u8], src: usize, rtag: u32) -> Result<usize> {
        self.comm.check_rank(src)?;
        let ctx = self.comm.coll_ctx();
        if seen::counting() {
            seen::message_out(self.comm.world_rank(dest), sbuf.len());
        }
        let mut f =
            move || self.comm.sendrecv_ctx(ctx, sbuf, dest, self.tag(stag), rbuf, Some(src as u32), Some(self.tag(rtag))).map(|s| s.len());
        if seen::tracing() {
            return seen::step(seen::Step::Sendrecv, self.comm, dest, sbuf.len(), f);
        }
        f()
    }
}
