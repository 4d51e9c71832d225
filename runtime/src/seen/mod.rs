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
//! State lives in one process-wide [`State`] made at `tmpi::init` (ranks made by `run_local`
//! are threads of one process and are never seen).

pub(crate) mod calls;
mod state;

use std::cell::Cell;
use std::sync::atomic::{AtomicU8, Ordering::Relaxed};

pub(crate) use calls::{answered, matched, posted};
pub(crate) use state::{finish, start};
pub(crate) use tmpi_trace::event::Kind;

use tmpi_trace::event::{aux, Event, NONE};

use crate::comm::{Comm, Source, TagMatch};
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

thread_local! {
    /// This thread is inside a seen call: the calls it makes are part of that one.
    static INSIDE: Cell<bool> = const { Cell::new(false) };
}

/// Whether the calling public call is to be seen (tracing, profiling, recording or replaying
/// is on, and this thread is not already inside a seen call).
#[inline(always)]
pub(crate) fn on() -> bool {
    FLAGS.load(Relaxed) != 0 && !INSIDE.with(Cell::get)
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

/// Marks this thread inside a seen call until dropped.
pub(crate) struct Inside(bool);

impl Inside {
    pub(crate) fn enter() -> Self {
        Inside(INSIDE.with(|c| c.replace(true)))
    }
}

impl Drop for Inside {
    fn drop(&mut self) {
        INSIDE.with(|c| c.set(self.0));
    }
}

/// What a call was about: filled from its arguments before it runs and from its outcome
/// after ([`Outcome`]).
#[derive(Clone, Copy)]
pub(crate) struct What<'a> {
    kind: Kind,
    comm: Option<&'a Comm>,
    /// World rank of the peer (destination, source or root), or [`NONE`].
    peer: u32,
    tag: u32,
    bytes: u64,
    aux: u32,
    /// Requests a completion call was given.
    reqs: u64,
}

impl<'a> What<'a> {
    pub(crate) fn new(kind: Kind) -> Self {
        What { kind, comm: None, peer: NONE, tag: NONE, bytes: 0, aux: 0, reqs: 0 }
    }

    /// On communicator `c`.
    pub(crate) fn on(mut self, c: &'a Comm) -> Self {
        self.comm = Some(c);
        self.aux |= c.inner.id & aux::COMM_MASK;
        self
    }

    /// To (or from, or rooted at) rank `r` of communicator `c`.
    pub(crate) fn to(self, c: &'a Comm, r: crate::Rank) -> Self {
        let mut w = self.on(c);
        if r < c.size() {
            w.peer = c.world_rank(r) as u32;
        }
        w
    }

    /// From `src` of communicator `c`.
    pub(crate) fn from(self, c: &'a Comm, src: Source) -> Self {
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

    /// A completion call over `n` requests.
    pub(crate) fn reqs(mut self, n: usize) -> Self {
        self.reqs = n as u64;
        self
    }

    /// Takes what a status says: the source (as a world rank) and tag of the message, and its
    /// length.
    fn status(&mut self, st: &Status) {
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
impl Seen for Comm {}
impl Seen for crate::CartComm {}
impl Seen for crate::Message {
    fn note(&self, w: &mut What<'_>) {
        w.status(&self.status());
    }
}
impl<T: Seen> Seen for Option<T> {
    fn note(&self, w: &mut What<'_>) {
        match self {
            Some(v) => v.note(w),
            None => w.aux |= aux::EMPTY,
        }
    }
}
impl Seen for crate::Request<'_> {}
impl<T: bytemuck::Pod> Seen for crate::VecRequest<T> {}
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
    let _in = Inside::enter();
    let t0 = tmpi_trace::clock::now_ns();
    let r = f();
    let t1 = tmpi_trace::clock::now_ns();
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
