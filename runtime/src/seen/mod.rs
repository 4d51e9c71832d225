//! Seeing a job: the hooks behind `TMPI_TRACE` (a timeline of every call and message),
//! `TMPI_PROFILE` (time, calls and bytes per call kind; messages per destination) and
//! `TMPI_RECORD`/`TMPI_REPLAY` (the rank's nondeterministic decisions, written and forced).
//!
//! The public calls reach here through one line each:
//!
//! ```text
//! if seen::on() { return seen::call(What::new(Kind::Send).to(self, dest).tag(tag).bytes(n), || self.send(buf, dest, tag)); }
//! ```
//!
//! When nothing is on, that line is one load of a flag (set once, at init) and a branch that
//! is never taken. When something is on, the call runs again inside [`call`] (or one of the
//! replay-aware wrappers of [`calls`]) with the hooks off for this thread ([`Inside`]), so a
//! public call made by another (`recv_vec` probes, then receives) is one span, not two.
//!
//! State lives in one process-wide `State` (`state.rs`) made at `tmpi::init` (ranks made by `run_local`
//! are threads of one process and are never seen).

pub(crate) mod calls;
mod state;
pub(crate) mod waits;

use std::cell::Cell;
use std::sync::atomic::{AtomicU8, Ordering::Relaxed};

pub(crate) use state::{finish, start};
pub(crate) use tmpi_trace::event::Kind;

use tmpi_trace::event::{aux, Event, NONE};

use crate::envelope::{Source, TagMatch};
use crate::Status;

/// [`FLAGS`] bit: events go to the trace ring.
pub(crate) const TRACE: u8 = 1;
/// [`FLAGS`] bit: calls are counted for the profile.
pub(crate) const PROFILE: u8 = 2;
/// [`FLAGS`] bit: decisions are recorded.
pub(crate) const RECORD: u8 = 4;
/// [`FLAGS`] bit: decisions are replayed.
pub(crate) const REPLAY: u8 = 8;

/// What is on, set at init and cleared at finalize; 0 for a process that sees nothing.
static FLAGS: AtomicU8 = AtomicU8::new(0);

/// [`THIS_THREAD`]: not looked at yet (the first call of a thread goes the slow way once).
const UNKNOWN: u8 = 0;
/// [`THIS_THREAD`]: calls of this thread are not seen (nothing is on, or the thread is inside
/// a seen call, whose own calls are part of it).
const OFF: u8 = 1;
/// [`THIS_THREAD`]: calls of this thread are seen.
const SEEING: u8 = 2;

thread_local! {
    /// Whether this thread's calls are seen: [`FLAGS`] as this thread last read it, or [`OFF`]
    /// while it is inside a seen call.
    static THIS_THREAD: Cell<u8> = const { Cell::new(UNKNOWN) };
}

/// Whether the calling public call may be seen: false (the one branch the public calls pay)
/// once this thread has found nothing on, or while it is inside a seen call; the slow path
/// ([`engaged`]) decides the rest.
#[inline(always)]
pub(crate) fn on() -> bool {
    THIS_THREAD.with(Cell::get) != OFF
}

/// Whether this thread's call is to be seen now: takes [`FLAGS`] into [`THIS_THREAD`] (the
/// first call of a thread, and after finalize cleared it).
fn engaged() -> bool {
    let now = if FLAGS.load(Relaxed) == 0 { OFF } else { SEEING };
    THIS_THREAD.with(|t| {
        if t.get() != OFF {
            t.set(now);
        }
        t.get() == SEEING
    })
}

/// Makes this thread look at [`FLAGS`] again at its next call (seeing starts or stops).
pub(crate) fn refresh_this_thread() {
    THIS_THREAD.with(|t| t.set(UNKNOWN));
}

/// Whether decisions are being recorded (checked where requests end outside a seen call).
#[inline(always)]
pub(crate) fn recording() -> bool {
    FLAGS.load(Relaxed) & RECORD != 0
}

/// Whether messages are counted (profile) or drawn (trace): checked where every message
/// starts, inside seen calls too.
#[inline(always)]
pub(crate) fn counting() -> bool {
    FLAGS.load(Relaxed) & (PROFILE | TRACE) != 0
}

/// Whether events go to the trace ring (checked by steps inside seen calls).
#[inline(always)]
pub(crate) fn tracing() -> bool {
    FLAGS.load(Relaxed) & TRACE != 0
}

/// One step of a collective's point-to-point algorithm (see [`step`]).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Step {
    Send = 1,
    Recv = 2,
    Sendrecv = 3,
}

/// Runs step `f` of a collective on `c` with rank `peer` (`bytes` out or in) as a phase event
/// of the trace.
#[cold]
#[inline(never)]
pub(crate) fn step<R>(s: Step, c: &dyn Ranks, peer: crate::Rank, bytes: usize, f: impl FnOnce() -> crate::Result<R>) -> crate::Result<R> {
    let t0 = tmpi_trace::clock::now_ns();
    let r = f();
    let t1 = tmpi_trace::clock::now_ns();
    let mut w = What::new(Kind::CollPhase).to(c, peer).bytes(bytes);
    w.aux = s as u32 | if r.is_err() { aux::FAILED } else { 0 };
    state::event_only(&w, t0, t1);
    r
}

/// The trace clock (nanoseconds), for a phase that [`transfer`] ends later.
#[inline]
pub(crate) fn now() -> u64 {
    tmpi_trace::clock::now_ns()
}

/// One round of a collective's schedule, its transfers with world rank `peer` (`None`:
/// several ranks; `bytes` out and in), from `t0` to now (`failed`: with an error), as a phase
/// event of the trace, as [`step`] records a point-to-point step.
#[cold]
#[inline(never)]
pub(crate) fn transfer(s: Step, peer: Option<usize>, bytes: usize, failed: bool, t0: u64) {
    let t1 = now();
    let mut w = What::new(Kind::CollPhase).bytes(bytes);
    w.peer = peer.map_or(NONE, |p| p as u32);
    w.aux = s as u32 | if failed { aux::FAILED } else { 0 };
    state::event_only(&w, t0, t1);
}

/// One end of a message as the engine decided it, for [`message`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct Msg {
    /// It leaves this rank (true), or a receive of this rank matched it.
    pub(crate) out: bool,
    /// The other rank (world).
    pub(crate) peer: usize,
    /// Its match key.
    pub(crate) tag64: u64,
    /// Its payload bytes.
    pub(crate) bytes: usize,
    /// How it goes: [`tmpi_trace::event::Proto`] bits (protocol, way, how it matched).
    pub(crate) proto: u32,
}

/// The engine's one hook into seeing (a flag read and a branch when tracing is off): one end of
/// a message to or from world rank `peer` with match key `tag64`, going as `proto` says (see
/// [`message`]).
#[inline(always)]
pub(crate) fn msg(out: bool, peer: usize, tag64: u64, bytes: usize, proto: u32) {
    if tracing() {
        message(Msg { out, peer, tag64, bytes, proto });
    }
}

/// What [`msg`] calls when tracing, where the engine decides how a
/// message goes: when a message leaves this rank (eager or rendezvous) and when a receive of
/// this rank matched one (offloaded or in software, expected or unexpected; for a rendezvous,
/// when its read starts and its way is chosen). Writes the message's event, numbered per
/// (direction, peer, match key) so that the merger can join the two ends.
#[cold]
#[inline(never)]
pub(crate) fn message(m: Msg) {
    state::message(m);
}

/// A message of `bytes` starts towards world rank `dest`.
#[cold]
#[inline(never)]
pub(crate) fn message_out(dest: usize, bytes: usize) {
    state::message_out(dest, bytes);
}

/// Whether `bit` is on.
#[inline]
fn is(bit: u8) -> bool {
    FLAGS.load(Relaxed) & bit != 0
}

/// Marks this thread inside a seen call until dropped (its calls are not seen meanwhile).
pub(crate) struct Inside(u8);

impl Inside {
    pub(crate) fn enter() -> Self {
        Inside(THIS_THREAD.with(|c| c.replace(OFF)))
    }
}

impl Drop for Inside {
    fn drop(&mut self) {
        THIS_THREAD.with(|c| c.set(self.0));
    }
}

/// What seeing needs of a communicator: its number and how its ranks map to the world's.
/// [`crate::Comm`] implements it; seeing sits below the communicators and knows no more of them.
pub(crate) trait Ranks {
    /// The communicator's number (its low bits go into every event's `aux`).
    fn comm_id(&self) -> u32;
    /// Its number of ranks.
    fn size(&self) -> usize;
    /// The world rank of its rank `r` (below [`Ranks::size`]).
    fn world_rank(&self, r: crate::Rank) -> usize;
}

/// What a call was about: filled from its arguments before it runs and from its outcome
/// after ([`Outcome`]).
#[derive(Clone, Copy)]
pub(crate) struct What<'a> {
    kind: Kind,
    comm: Option<&'a dyn Ranks>,
    /// World rank of the peer (destination, source or root), or [`NONE`].
    peer: u32,
    tag: u32,
    bytes: u64,
    aux: u32,
    /// Requests a completion call was given.
    reqs: u64,
    /// The message the call sends: (world rank, bytes), or ([`NONE`], 0).
    out: (u32, u64),
}

impl<'a> What<'a> {
    pub(crate) fn new(kind: Kind) -> Self {
        What { kind, comm: None, peer: NONE, tag: NONE, bytes: 0, aux: 0, reqs: 0, out: (NONE, 0) }
    }

    /// On communicator `c`.
    pub(crate) fn on(mut self, c: &'a dyn Ranks) -> Self {
        self.comm = Some(c);
        self.aux |= c.comm_id() & aux::COMM_MASK;
        self
    }

    /// To (or from, or rooted at) rank `r` of communicator `c`.
    pub(crate) fn to(self, c: &'a dyn Ranks, r: crate::Rank) -> Self {
        let mut w = self.on(c);
        if r < c.size() {
            w.peer = c.world_rank(r) as u32;
        }
        w
    }

    /// From `src` of communicator `c`.
    pub(crate) fn from(self, c: &'a dyn Ranks, src: Source) -> Self {
        match src {
            Source::Rank(r) => self.to(c, r),
            Source::Any => {
                let mut w = self.on(c);
                w.aux |= aux::ANY_SOURCE;
                w
            }
        }
    }

    pub(crate) fn tag(mut self, t: crate::Tag) -> Self {
        self.tag = t;
        self
    }

    pub(crate) fn tag_match(mut self, t: TagMatch) -> Self {
        self.tag = match t {
            TagMatch::Tag(t) => t,
            TagMatch::Any => NONE,
        };
        self
    }

    pub(crate) fn bytes(mut self, n: usize) -> Self {
        self.bytes = n as u64;
        self
    }

    /// The call sends one message of `n` bytes to rank `dest` of communicator `c` (counted in
    /// the profile when the call does not fail).
    pub(crate) fn sends(mut self, c: &dyn Ranks, dest: crate::Rank, n: usize) -> Self {
        if dest < c.size() {
            self.out = (c.world_rank(dest) as u32, n as u64);
        }
        self
    }

    /// A completion call over `n` requests.
    pub(crate) fn reqs(mut self, n: usize) -> Self {
        self.reqs = n as u64;
        self
    }

    /// Takes what a status says: the source (as a world rank) and tag of the message, and its
    /// length.
    pub(crate) fn status(&mut self, st: &Status) {
        if st.cancelled() {
            return;
        }
        if let Some(c) = self.comm {
            if st.source() < c.size() {
                self.peer = c.world_rank(st.source()) as u32;
            }
        }
        self.tag = st.tag();
        self.bytes = st.len() as u64;
    }
}

/// What a call's result tells its span.
pub(crate) trait Outcome {
    fn note(&self, w: &mut What<'_>);
}

/// What a call's successful value tells its span.
pub(crate) trait Seen {
    fn note(&self, _w: &mut What<'_>) {}
}

impl<T: Seen> Outcome for crate::Result<T> {
    fn note(&self, w: &mut What<'_>) {
        match self {
            Ok(v) => v.note(w),
            Err(_) => w.aux |= aux::FAILED,
        }
    }
}

impl Seen for () {}
impl<T: Seen> Seen for Option<T> {
    fn note(&self, w: &mut What<'_>) {
        match self {
            Some(v) => v.note(w),
            None => w.aux |= aux::EMPTY,
        }
    }
}
impl Seen for Status {
    fn note(&self, w: &mut What<'_>) {
        w.status(self);
    }
}
impl<T> Seen for (T, Status) {
    fn note(&self, w: &mut What<'_>) {
        w.status(&self.1);
    }
}
impl Seen for Vec<Status> {
    fn note(&self, w: &mut What<'_>) {
        w.bytes = self.iter().map(|s| s.len() as u64).sum();
    }
}
impl Seen for Vec<(usize, crate::Result<Status>)> {
    fn note(&self, w: &mut What<'_>) {
        w.bytes = self.iter().filter_map(|(_, r)| r.as_ref().ok()).map(|s| s.len() as u64).sum();
        if self.is_empty() {
            w.aux |= aux::EMPTY;
        }
    }
}

/// Runs public call `f` as one seen call: timed, recorded in the trace ring, counted in the
/// profile.
#[cold]
#[inline(never)]
pub(crate) fn call<R: Outcome>(mut w: What<'_>, f: impl FnOnce() -> R) -> R {
    if !engaged() {
        return f();
    }
    let _in = Inside::enter();
    let t0 = tmpi_trace::clock::now_ns();
    state::open(&w, t0);
    let r = f();
    let t1 = tmpi_trace::clock::now_ns();
    state::close();
    r.note(&mut w);
    state::span(&w, t0, t1);
    r
}

/// The thread index events of this thread carry.
fn thread_index() -> u16 {
    thread_local! {
        static INDEX: Cell<u16> = const { Cell::new(u16::MAX) };
    }
    INDEX.with(|i| {
        if i.get() == u16::MAX {
            i.set(state::register_thread());
        }
        i.get()
    })
}

/// The event of a span.
fn event(w: &What<'_>, t0: u64, t1: u64) -> Event {
    Event {
        t0,
        dur: t1.saturating_sub(t0).max(1),
        bytes: w.bytes,
        id: w.reqs,
        peer: w.peer,
        tag: w.tag,
        kind: w.kind.code(),
        thread: thread_index(),
        aux: w.aux,
    }
}
