//! The engine's executor of collective schedules ([`crate::coll::plan`]): a [`Sched`] runs one
//! [`Plan`] on the engine, a round at a time, advanced by every round of progress while it is
//! in flight. Blocking collectives start one and wait for it; non-blocking ones return its
//! request.
//!
//! Memory: transfers and local steps touch three kinds of buffers: scratch the schedule owns
//! (taken when it starts, 16-byte aligned, never resized or moved until the schedule is
//! dropped), and the user's send and receive buffers, which are borrowed for as long as the
//! request may run (a blocking call's frame, or the request's [`crate::Scope`]): the call or
//! the scope finishes or abandons the request before the borrow ends, and abandoning abandons
//! every transfer first (the engine forgets their pointers) and then drops the schedule.

use crate::buffer::{RawBuf, RawBufMut};
use crate::coll::plan::{Action, Buf, Plan, Span};
use crate::coll::scratch;
use crate::engine::{Engine, Peers, ReqId};
use crate::error::{Error, Result};
use crate::matching;
use crate::seen;

/// A scratch buffer: 16-byte aligned, owned through a raw pointer so that the pointers the
/// engine holds into it stay valid (no reborrow of the allocation) until it is dropped. Its
/// memory comes from and goes back to [`scratch`]'s pool, so a collective's scratch is not
/// faulted in and zeroed afresh on every call.
struct Temp {
    ptr: *mut u128,
    len: usize,
    cap: usize,
}

// SAFETY: a `Temp` owns its heap allocation (given back once, in `Drop`) like the `Vec<u128>`
// it came from, which is `Send`; the raw pointer only avoids reborrowing it. The pointers the
// engine holds into it move with the engine, which one thread uses at a time (`crate::sync`).
unsafe impl Send for Temp {}

impl Temp {
    fn new(bytes: usize) -> Self {
        let mut v = std::mem::ManuallyDrop::new(scratch::take(bytes.div_ceil(16)));
        Temp { ptr: v.as_mut_ptr(), len: v.len(), cap: v.capacity() }
    }
}

impl Drop for Temp {
    fn drop(&mut self) {
        // SAFETY: `ptr`, `len` and `cap` are the parts of the `Vec` taken apart in
        // `Temp::new`, rebuilt only here, once.
        scratch::give(unsafe { Vec::from_raw_parts(self.ptr, self.len, self.cap) });
    }
}

/// The members of a communicator, as a schedule needs them to post transfers.
pub(crate) struct Members {
    /// Collective context of the communicator.
    pub(crate) ctx: u32,
    pub(crate) rank: usize,
    pub(crate) size: usize,
    /// World rank of each member (`None`: the identity).
    pub(crate) world: Option<crate::engine::WorldRanks>,
    /// The collective's sequence number (the tag's upper 16 bits).
    pub(crate) seq: u32,
    /// The call's whole sequence number, by which a member that fails the call names it to
    /// the others (`None`: the group channel of `Comm::create_group`, whose calls have none).
    pub(crate) full: Option<u32>,
    /// One tag for every message in place of the sequence number and the phase (the group
    /// channel of `Comm::create_group`, whose tag is the user's; messages then pair by source
    /// and order alone, which the plans it runs keep).
    pub(crate) fixed_tag: Option<u32>,
    /// The rank each member has in match keys when it is not its index here: the group
    /// channel of `Comm::create_group` keys by the parent communicator's ranks, so that the
    /// channels of two groups on one parent (a rank may be in one while a faster peer is
    /// already in the next) never take each other's messages.
    pub(crate) keys: Option<crate::engine::WorldRanks>,
}

impl Members {
    fn world_rank(&self, r: usize) -> Result<usize> {
        match &self.world {
            None if r < self.size => Ok(r),
            Some(m) if r < m.len() => Ok(m[r]),
            _ => Err(Error::InvalidRank { rank: r, size: self.size }),
        }
    }

    /// The source field of member `r`'s messages.
    fn key(&self, r: usize) -> u32 {
        self.keys.as_ref().map_or(r, |k| k.get(r).copied().unwrap_or(r)) as u32
    }

    fn tag(&self, t: u32) -> u32 {
        match self.fixed_tag {
            Some(f) => f,
            None => (self.seq & 0xffff) << 8 | (t & 0xff),
        }
    }
}

/// A round in progress, as the trace draws it once its transfers completed: started at `t0`
/// (trace clock), with sends and receives (`sends`, `recvs`) of `bytes` in all, to or from
/// world rank `peer` (`None`: several).
struct Phase {
    t0: u64,
    sends: bool,
    recvs: bool,
    bytes: usize,
    peer: Option<Option<usize>>,
}

impl Phase {
    fn add(&mut self, send: bool, peer: usize, bytes: usize) {
        self.sends |= send;
        self.recvs |= !send;
        self.bytes += bytes;
        self.peer = match self.peer {
            None => Some(Some(peer)),
            Some(Some(p)) if p == peer => Some(Some(p)),
            Some(_) => Some(None),
        };
    }

    /// Ends the round's phase event (`failed`: with an error).
    fn end(self, failed: bool) {
        let step = match (self.sends, self.recvs) {
            (true, false) => seen::Step::Send,
            (false, true) => seen::Step::Recv,
            _ => seen::Step::Sendrecv,
        };
        seen::transfer(step, self.peer.flatten(), self.bytes, failed, self.t0);
    }
}

/// A running schedule (see the module docs).
pub(crate) struct Sched {
    rid: Option<ReqId>,
    who: Members,
    plan: Plan,
    /// The next round to start.
    round: usize,
    /// Transfers of the current round: request, and for a receive the bytes expected (`None`:
    /// any length, once the plan is degraded).
    pending: Vec<(ReqId, Option<(usize, usize)>)>,
    /// The round in progress as the trace draws it, when the schedule is traced
    /// ([`Sched::trace_rounds`]).
    phase: Option<Phase>,
    traced: bool,
    temps: Vec<Temp>,
    input: Option<RawBuf>,
    output: Option<RawBufMut>,
    /// A tolerant plan's first error (see [`crate::coll::plan`]): from then on sends are empty
    /// and local steps skipped.
    degraded: Option<Error>,
    finished: bool,
}

impl Sched {
    /// A schedule for `plan` on `who`.
    ///
    /// # Errors
    /// [`Error::State`] when the plan breaks the rules of [`Plan::check`] (a bug).
    ///
    /// # Safety
    /// `input` and `output` (when given) must stay valid until the schedule has finished or
    /// has been abandoned, `input` unmodified and `output` untouched by anyone else (the
    /// contract of [`RawBuf::new`] and [`RawBufMut::new`]).
    pub(crate) unsafe fn new(mut plan: Plan, who: Members, input: Option<RawBuf>, output: Option<RawBufMut>) -> Result<Self> {
        plan.check()?;
        let temps = plan.temps.iter().map(|&n| Temp::new(n)).collect();
        let degraded = plan.error.take();
        Ok(Sched {
            rid: None,
            who,
            plan,
            round: 0,
            pending: Vec::new(),
            phase: None,
            traced: false,
            temps,
            input,
            output,
            degraded,
            finished: false,
        })
    }

    pub(crate) fn set_request(&mut self, rid: ReqId) {
        self.rid = Some(rid);
    }

    pub(crate) fn is_finished(&self) -> bool {
        self.finished
    }

    /// The collective context of the communicator it runs on.
    pub(crate) fn ctx(&self) -> u32 {
        self.who.ctx
    }

    /// The transfers in flight.
    pub(crate) fn pending(&self) -> Vec<ReqId> {
        self.pending.iter().map(|p| p.0).collect()
    }

    /// Start address of a span, checked against its buffer.
    fn addr(&self, s: &Span, write: bool) -> Result<*mut u8> {
        if s.len == 0 {
            return Ok(std::ptr::NonNull::<u128>::dangling().as_ptr().cast());
        }
        let (base, cap) = match s.buf {
            Buf::Temp(i) => {
                let t = self.temps.get(i).ok_or_else(|| internal("no such scratch buffer"))?;
                (t.ptr.cast::<u8>(), self.plan.temps[i])
            }
            Buf::In if !write => {
                let b = self.input.ok_or_else(|| internal("no send buffer"))?;
                (b.addr() as *mut u8, b.len())
            }
            Buf::In => return Err(internal("write into the send buffer")),
            Buf::Out => {
                let b = self.output.ok_or_else(|| internal("no receive buffer"))?;
                (b.addr() as *mut u8, b.cap())
            }
        };
        match s.off.checked_add(s.len) {
            // `wrapping_add` stays inside the buffer (checked): no pointer arithmetic overflow.
            Some(end) if end <= cap => Ok(base.wrapping_add(s.off)),
            _ => Err(internal("span outside its buffer")),
        }
    }

    /// Runs as far as it can; returns how many rounds started (and 1 for the end).
    pub(crate) fn advance(&mut self, e: &mut Engine) -> usize {
        if self.finished {
            return 0;
        }
        match self.step(e) {
            Ok(n) => n,
            Err(err) => {
                self.fail(e, err);
                1
            }
        }
    }

    /// Collects the transfers of the round that have completed; true when none is left.
    fn collect(&mut self, e: &mut Engine) -> Result<bool> {
        let mut i = 0;
        while i < self.pending.len() {
            let (rid, want) = self.pending[i];
            let Some(r) = e.take_if_done(rid) else {
                i += 1;
                continue;
            };
            self.pending.swap_remove(i);
            let r = r.and_then(|st| match want {
                Some((len, src)) if st.len() != len => Err(crate::coll::short_message(st.len(), len, src)),
                _ => Ok(()),
            });
            match r {
                Ok(()) => {}
                Err(err @ Error::PeerGone { .. }) => return Err(err),
                Err(err) if self.plan.tolerant => {
                    self.degraded.get_or_insert(err);
                }
                Err(err) => return Err(err),
            }
        }
        Ok(self.pending.is_empty())
    }

    fn step(&mut self, e: &mut Engine) -> Result<usize> {
        let mut n = 0;
        loop {
            if !self.collect(e)? {
                return Ok(n);
            }
            if self.traced {
                self.next_phase();
            }
            if self.round == self.plan.len() {
                self.phase = None;
                self.finished = true;
                let r = self.degraded.take().map_or(Ok(()), Err);
                if let Some(rid) = self.rid {
                    e.complete_nbc(rid, r);
                }
                return Ok(n + 1);
            }
            let i = self.round;
            self.round += 1;
            n += 1;
            for k in 0..self.plan.round_acts(i).len() {
                let a = self.plan.round_acts(i)[k];
                self.run(e, a)?;
            }
        }
    }

    fn run(&mut self, e: &mut Engine, a: Action) -> Result<()> {
        let degraded = self.degraded.is_some();
        match a {
            Action::Send { s, dest, tag } => self.send(e, if degraded { Span::empty() } else { s }, dest, tag),
            Action::Recv { s, src, tag } => self.recv(e, s, src, tag),
            _ if degraded => Ok(()),
            Action::Copy { from, to } => {
                let src = self.addr(&from, false)?;
                let dst = self.addr(&to, true)?;
                // SAFETY: both ranges lie in live buffers (checked by `addr`) with no transfer
                // in flight on them (`Plan::check`: a step never touches what an earlier
                // transfer of its round moves; the rounds before have completed); `copy`
                // allows overlap, and the lengths are equal (`Plan::check`).
                unsafe { std::ptr::copy(src, dst, from.len) };
                Ok(())
            }
            Action::Reduce { from, acc, left } => {
                let f = self.plan.reduce.as_ref().ok_or_else(|| internal("no reduction"))?;
                let src = self.addr(&from, false)?;
                let dst = self.addr(&acc, true)?;
                // SAFETY: both ranges lie in live buffers (checked by `addr`), do not overlap
                // and have equal lengths (`Plan::check`), and no transfer is in flight on them;
                // the slices end with this statement.
                let (a, b) = unsafe { (std::slice::from_raw_parts(src, from.len), std::slice::from_raw_parts_mut(dst, acc.len)) };
                f(a, b, left)
            }
        }
    }

    /// Starts sending span `s` (empty once degraded) to member `dest`.
    fn send(&mut self, e: &mut Engine, s: Span, dest: usize, tag: u32) -> Result<()> {
        let p = self.addr(&s, false)?;
        // SAFETY: `p..p + s.len` lies in a live buffer (checked by `addr`): scratch this
        // schedule owns, or a user buffer borrowed until the schedule ends or is abandoned
        // (`Sched::new`). Abandoning abandons this send first, so the view never outlives the
        // memory, and the plan writes no span while it is sent (`Plan::check`).
        let raw = unsafe { RawBuf::new(std::slice::from_raw_parts(p, s.len)) };
        let w = &self.who;
        let tag64 = matching::encode_tag(w.ctx, w.key(w.rank), w.tag(tag));
        let world = w.world_rank(dest)?;
        if seen::counting() {
            seen::message_out(world, s.len);
        }
        if let Some(ph) = self.phase.as_mut() {
            ph.add(true, world, s.len);
        }
        if let Some(rid) = e.start_send(world, tag64, raw, false)? {
            self.pending.push((rid, None));
        }
        Ok(())
    }

    /// Posts the receive of span `s` from member `src`.
    fn recv(&mut self, e: &mut Engine, s: Span, src: usize, tag: u32) -> Result<()> {
        let degraded = self.degraded.is_some();
        let p = self.addr(&s, true)?;
        // SAFETY: as for a send; the plan neither reads nor writes the span until this
        // receive has completed (`Plan::check`), and abandoning abandons it first.
        let raw = unsafe { RawBufMut::new(std::slice::from_raw_parts_mut(p, s.len)) };
        let w = &self.who;
        let world = w.world_rank(src)?;
        if let Some(ph) = self.phase.as_mut() {
            ph.add(false, world, s.len);
        }
        let rid = e.post_recv(w.ctx, Some(w.key(src)), Some(w.tag(tag)), raw, Peers::rank(world))?;
        self.pending.push((rid, (!degraded).then_some((s.len, src))));
        Ok(())
    }

    /// Draws each round of this schedule in the trace as one phase event (a blocking call's
    /// schedule, whose rounds nest in its call; a non-blocking one's would straddle calls).
    pub(crate) fn trace_rounds(&mut self) {
        self.traced = true;
    }

    /// The trace's phase of the round that starts now, if the schedule is traced; the last
    /// one ended (see [`Phase`]).
    fn next_phase(&mut self) {
        if let Some(ph) = self.phase.take() {
            if ph.sends || ph.recvs {
                ph.end(false);
            }
        }
        if self.traced && seen::tracing() {
            self.phase = Some(Phase { t0: seen::now(), sends: false, recvs: false, bytes: 0, peer: None });
        }
    }

    /// Ends the collective with `err`: every transfer in flight is abandoned, and the other
    /// members are told if a rank departed or the call failed here (see
    /// [`Engine::fail_collective`]; not when it failed because another member's did).
    pub(crate) fn fail(&mut self, e: &mut Engine, err: Error) {
        self.abandon(e);
        let members = || (0..self.who.size).filter_map(|r| self.who.world_rank(r).ok()).collect::<Vec<usize>>().into_iter();
        match (&err, self.who.full) {
            (Error::PeerGone { rank }, _) => e.abort_collective(self.who.ctx, self.who.seq & 0xffff, *rank, members()),
            (Error::CollectiveFailed { .. }, _) | (_, None) => {}
            // A tolerant plan takes its part in every round even after an error.
            _ if self.plan.tolerant => {}
            (_, Some(full)) => e.fail_collective(self.who.ctx, full, members()),
        }
        if let Some(rid) = self.rid {
            e.complete_nbc(rid, Err(err));
        }
    }

    /// Abandons every transfer in flight and stops; nothing touches a buffer afterwards.
    pub(crate) fn abandon(&mut self, e: &mut Engine) {
        if let Some(ph) = self.phase.take() {
            ph.end(true);
        }
        for (rid, _) in self.pending.drain(..) {
            e.abandon(rid);
        }
        self.round = self.plan.len();
        self.finished = true;
    }
}

/// How the engine holds a schedule (its methods above).
impl crate::engine::Schedule for Sched {
    fn set_request(&mut self, rid: ReqId) {
        Sched::set_request(self, rid)
    }
    fn advance(&mut self, e: &mut Engine) -> usize {
        Sched::advance(self, e)
    }
    fn is_finished(&self) -> bool {
        Sched::is_finished(self)
    }
    fn ctx(&self) -> u32 {
        Sched::ctx(self)
    }
    fn call(&self) -> Option<u32> {
        self.who.full
    }
    fn pending(&self) -> Vec<ReqId> {
        Sched::pending(self)
    }
    fn fail(&mut self, e: &mut Engine, err: Error) {
        Sched::fail(self, e, err)
    }
    fn abandon(&mut self, e: &mut Engine) {
        Sched::abandon(self, e)
    }
}

#[cold]
fn internal(what: &str) -> Error {
    Error::State(format!("collective schedule internal error: {what}"))
}
