//! Schedules: rounds of sends, receives and local steps, run by the engine's progress.
//!
//! A [`Plan`] is built when the collective starts (what to do, round by round); a [`Sched`]
//! runs it. A round's actions are taken in order when the round starts: local steps (copy,
//! combine) run at once, transfers are posted; the round ends when all its transfers have
//! completed, and the next one starts. A receive must bring exactly the bytes the plan expects.
//! A failed transfer abandons the others and ends the collective with its error; if a rank
//! departed, the collective's other members are told (as blocking collectives do).
//!
//! Memory: transfers and local steps touch three kinds of buffers: scratch the schedule owns
//! (allocated at the start, 16-byte aligned, never resized or moved until the schedule is
//! dropped), and the user's send and receive buffers, which are borrowed for the lifetime of
//! the request's scope ([`crate::Scope`]): the scope finishes or abandons the request before
//! the borrow ends, and abandoning abandons every transfer first (the engine forgets their
//! pointers) and then drops the schedule.

use crate::buffer::{RawBuf, RawBufMut};
use crate::engine::{Engine, Peers, ReqId};
use crate::error::{Error, Result};
use crate::matching;

/// Combines `from` into `acc` (`acc = from op acc` when the flag is set, else `acc op from`),
/// both holding the same number of elements of the collective's type, as bytes.
pub(crate) type ReduceFn = Box<dyn Fn(&[u8], &mut [u8], bool) -> Result<()> + Send + Sync>;

/// Which buffer a span lies in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Buf {
    /// Scratch buffer `i` of the plan.
    Temp(usize),
    /// The user's send buffer (read only).
    In,
    /// The user's receive buffer.
    Out,
}

/// A byte range of a buffer.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Span {
    pub(crate) buf: Buf,
    pub(crate) off: usize,
    pub(crate) len: usize,
}

impl Span {
    pub(crate) fn new(buf: Buf, off: usize, len: usize) -> Self {
        Span { buf, off, len }
    }

    /// A span of no bytes (barrier messages).
    pub(crate) fn empty() -> Self {
        Span { buf: Buf::Temp(usize::MAX), off: 0, len: 0 }
    }

    fn overlaps(&self, o: &Span) -> bool {
        self.buf == o.buf && self.len > 0 && o.len > 0 && self.off < o.off + o.len && o.off < self.off + self.len
    }
}

/// One step of a round.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Action {
    /// Send the span to comm rank `dest` with collective tag `tag` (8 bits).
    Send { s: Span, dest: usize, tag: u32 },
    /// Receive exactly `s.len` bytes from comm rank `src` into the span.
    Recv { s: Span, src: usize, tag: u32 },
    /// Copy `from` to `to` (same length).
    Copy { from: Span, to: Span },
    /// Combine `from` into `acc` with the plan's reduction (`left`: `from` is the left operand).
    Reduce { from: Span, acc: Span, left: bool },
}

/// What a collective does, round by round.
pub(crate) struct Plan {
    pub(crate) rounds: Vec<Vec<Action>>,
    /// Sizes in bytes of the scratch buffers.
    pub(crate) temps: Vec<usize>,
    pub(crate) reduce: Option<ReduceFn>,
}

impl Plan {
    pub(crate) fn new() -> Self {
        Plan { rounds: Vec::new(), temps: Vec::new(), reduce: None }
    }

    /// A new scratch buffer of `len` bytes; returns its whole span.
    pub(crate) fn temp(&mut self, len: usize) -> Span {
        self.temps.push(len);
        Span::new(Buf::Temp(self.temps.len() - 1), 0, len)
    }

    /// Appends a round (empty rounds are dropped).
    pub(crate) fn round(&mut self, actions: Vec<Action>) {
        if !actions.is_empty() {
            self.rounds.push(actions);
        }
    }
}

/// A scratch buffer: 16-byte aligned, owned through a raw pointer so that the pointers the
/// engine holds into it stay valid (no reborrow of the allocation) until it is dropped.
struct Temp {
    ptr: *mut u128,
    words: usize,
}

// SAFETY: a `Temp` owns its heap allocation (freed once, in `Drop`) like the `Box<[u128]>`
// it came from, which is `Send`; the raw pointer only avoids reborrowing it. The pointers the
// engine holds into it move with the engine, which one thread uses at a time (`crate::sync`).
unsafe impl Send for Temp {}

impl Temp {
    fn new(bytes: usize) -> Self {
        let words = bytes.div_ceil(16);
        let b: Box<[u128]> = vec![0u128; words].into_boxed_slice();
        Temp { ptr: Box::into_raw(b).cast::<u128>(), words }
    }
}

impl Drop for Temp {
    fn drop(&mut self) {
        // SAFETY: `ptr` and `words` come from `Box::into_raw` of a boxed slice of that length
        // in `Temp::new`, and are freed only here, once.
        drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(self.ptr, self.words)) });
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
}

impl Members {
    fn world_rank(&self, r: usize) -> Result<usize> {
        match &self.world {
            None if r < self.size => Ok(r),
            Some(m) if r < m.len() => Ok(m[r]),
            _ => Err(Error::InvalidRank { rank: r, size: self.size }),
        }
    }

    fn tag(&self, t: u32) -> u32 {
        (self.seq & 0xffff) << 8 | (t & 0xff)
    }
}

/// A running schedule (see the module docs).
pub(crate) struct Sched {
    rid: Option<ReqId>,
    who: Members,
    rounds: std::vec::IntoIter<Vec<Action>>,
    /// Transfers of the current round: request, and for a receive the bytes expected.
    pending: Vec<(ReqId, Option<(usize, usize)>)>,
    temps: Vec<Temp>,
    sizes: Vec<usize>,
    input: Option<RawBuf>,
    output: Option<RawBufMut>,
    reduce: Option<ReduceFn>,
    finished: bool,
}

impl Sched {
    /// A schedule for `plan` on `who`.
    ///
    /// # Safety
    /// `input` and `output` (when given) must stay valid until the schedule has finished or
    /// has been abandoned, `input` unmodified and `output` untouched by anyone else (the
    /// contract of [`RawBuf::new`] and [`RawBufMut::new`]).
    pub(crate) unsafe fn new(plan: Plan, who: Members, input: Option<RawBuf>, output: Option<RawBufMut>) -> Self {
        let temps = plan.temps.iter().map(|&n| Temp::new(n)).collect();
        Sched {
            rid: None,
            who,
            rounds: plan.rounds.into_iter(),
            pending: Vec::new(),
            temps,
            sizes: plan.temps,
            input,
            output,
            reduce: plan.reduce,
            finished: false,
        }
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
                (t.ptr.cast::<u8>(), self.sizes[i])
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

    fn step(&mut self, e: &mut Engine) -> Result<usize> {
        let mut n = 0;
        loop {
            let mut i = 0;
            while i < self.pending.len() {
                let (rid, want) = self.pending[i];
                match e.take_if_done(rid) {
                    None => i += 1,
                    Some(r) => {
                        self.pending.swap_remove(i);
                        let st = r?;
                        if let Some((len, src)) = want {
                            if st.len() != len {
                                return Err(Error::InvalidBuffer(format!(
                                    "collective: {} bytes from rank {src} where {len} were expected \
                                     (ranks passed different buffer lengths?)",
                                    st.len()
                                )));
                            }
                        }
                    }
                }
            }
            if !self.pending.is_empty() {
                return Ok(n);
            }
            let Some(round) = self.rounds.next() else {
                self.finished = true;
                if let Some(rid) = self.rid {
                    e.complete_nbc(rid, Ok(()));
                }
                return Ok(n + 1);
            };
            n += 1;
            for a in round {
                self.run(e, a)?;
            }
        }
    }

    fn run(&mut self, e: &mut Engine, a: Action) -> Result<()> {
        let w = &self.who;
        match a {
            Action::Send { s, dest, tag } => {
                let p = self.addr(&s, false)?;
                // SAFETY: `p..p + s.len` lies in a live buffer (checked by `addr`): scratch
                // this schedule owns, or a user buffer borrowed until the schedule ends or is
                // abandoned (`Sched::new`). Abandoning abandons this send first, so the view
                // never outlives the memory, and the plan writes no span while it is sent.
                let raw = unsafe { RawBuf::new(std::slice::from_raw_parts(p, s.len)) };
                let tag64 = matching::encode_tag(w.ctx, w.rank as u32, w.tag(tag));
                if crate::seen::counting() {
                    crate::seen::message_out(w.world_rank(dest)?, s.len);
                }
                if let Some(rid) = e.start_send(w.world_rank(dest)?, tag64, raw, false)? {
                    self.pending.push((rid, None));
                }
            }
            Action::Recv { s, src, tag } => {
                let p = self.addr(&s, true)?;
                // SAFETY: as for a send; the plan neither reads nor writes the span until this
                // receive has completed, and abandoning abandons it first.
                let raw = unsafe { RawBufMut::new(std::slice::from_raw_parts_mut(p, s.len)) };
                let world = w.world_rank(src)?;
                let rid = e.post_recv(w.ctx, Some(src as u32), Some(w.tag(tag)), raw, Peers::rank(world))?;
                self.pending.push((rid, Some((s.len, src))));
            }
            Action::Copy { from, to } => {
                if from.len != to.len {
                    return Err(internal("copy between spans of different lengths"));
                }
                let src = self.addr(&from, false)?;
                let dst = self.addr(&to, true)?;
                // SAFETY: both ranges lie in live buffers (checked by `addr`) with no transfer
                // in flight on them (rounds start only when the previous one has completed);
                // `copy` allows overlap.
                unsafe { std::ptr::copy(src, dst, from.len) };
            }
            Action::Reduce { from, acc, left } => {
                if from.overlaps(&acc) || from.len != acc.len {
                    return Err(internal("reduction between overlapping or unequal spans"));
                }
                let f = self.reduce.as_ref().ok_or_else(|| internal("no reduction"))?;
                let src = self.addr(&from, false)?;
                let dst = self.addr(&acc, true)?;
                // SAFETY: both ranges lie in live buffers (checked by `addr`), do not overlap
                // (checked above) and have no transfer in flight on them; the slices end with
                // this statement.
                let (a, b) = unsafe { (std::slice::from_raw_parts(src, from.len), std::slice::from_raw_parts_mut(dst, acc.len)) };
                f(a, b, left)?;
            }
        }
        Ok(())
    }

    /// Ends the collective with `err`: every transfer in flight is abandoned, and if a rank
    /// departed the other members are told.
    pub(crate) fn fail(&mut self, e: &mut Engine, err: Error) {
        self.abandon(e);
        if let Error::PeerGone { rank } = err {
            let members: Vec<usize> = (0..self.who.size).filter_map(|r| self.who.world_rank(r).ok()).collect();
            e.abort_collective(self.who.ctx, self.who.seq & 0xffff, rank, members.into_iter());
        }
        if let Some(rid) = self.rid {
            e.complete_nbc(rid, Err(err));
        }
    }

    /// Abandons every transfer in flight and stops; nothing touches a buffer afterwards.
    pub(crate) fn abandon(&mut self, e: &mut Engine) {
        for (rid, _) in self.pending.drain(..) {
            e.abandon(rid);
        }
        self.rounds = Vec::new().into_iter();
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
    Error::State(format!("non-blocking collective internal error: {what}"))
}
