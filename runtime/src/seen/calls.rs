//! The calls whose outcome is a nondeterministic decision, seen with record and replay
//! (`TMPI_RECORD`, `TMPI_REPLAY`): each records the decision its call made, or forces the
//! recorded one, around [`super::call`].
//!
//! - blocking wildcard receives and probes ([`matched`]): the source a message came from;
//!   replayed by receiving from that source (MPI's non-overtaking rule then picks the same
//!   message, as the rest of the run is replayed too);
//! - non-blocking wildcard receives ([`posted`]): by the number of the post, the source its
//!   completion reported; replayed by posting the receive on that source;
//! - tests and non-blocking probes ([`answered`]): found or not; replayed by answering
//!   "nothing" at once, or by trying until the call finds what it found;
//! - the completion calls of requests (`wait_any`, `wait_some`, `test_any`, `test_some`,
//!   `test_all`, in [`super::waits`]): which requests they reported; replayed by waiting for
//!   exactly those.
//!
//! A replay that meets a decision of another call, or the end of the record, fails with
//! [`Error::Replay`] (and so does every later decision of the rank).

use tmpi_trace::event::NONE;
use tmpi_trace::record::Decision;

use super::state::{self, lock};
use super::{call, is, Outcome, What, RECORD, REPLAY};
use crate::engine::ReqId;
use crate::envelope::Source;
use crate::error::{Error, Result};
use crate::{Rank, Status};

/// A result that names the message it matched.
pub(crate) trait Matched {
    fn source(&self) -> Rank;
}

impl Matched for Status {
    fn source(&self) -> Rank {
        Status::source(self)
    }
}

impl<T> Matched for (T, Status) {
    fn source(&self) -> Rank {
        self.1.source()
    }
}

/// Whether decisions are recorded or replayed (and this thread's call is seen).
fn deciding() -> bool {
    is(RECORD | REPLAY) && super::engaged()
}

/// Records `d` (a record that cannot grow is reported once and stops).
pub(super) fn push(d: Decision) {
    let Some(m) = state::get().and_then(|s| s.record.as_ref()) else { return };
    let mut g = lock(m);
    if let Some(r) = g.as_mut() {
        if let Err(e) = r.push(&d) {
            eprintln!("tmpi: TMPI_RECORD: {e}; recording stops here");
            *g = None;
        }
    }
}

/// The next recorded decision, which must be `w`'s call's.
pub(super) fn next(w: &What<'_>) -> Result<Decision> {
    let s = state::get().ok_or_else(|| Error::State("replay without a record".into()))?;
    if let Some(why) = lock(&s.diverged).clone() {
        return Err(Error::Replay(why));
    }
    let rp = s.replay.as_ref().ok_or_else(|| Error::State("replay without a record".into()))?;
    let asked = describe(w);
    let r = lock(rp).next(w.kind, &asked);
    r.map_err(|d| {
        let why = d.to_string();
        *lock(&s.diverged) = Some(why.clone());
        Error::Replay(why)
    })
}

/// `w`'s call in words: `recv from any source, tag 5`.
fn describe(w: &What<'_>) -> String {
    let mut s = w.kind.name().to_string();
    if w.aux & tmpi_trace::event::aux::ANY_SOURCE != 0 {
        s.push_str(" from any source");
    }
    if w.tag != NONE {
        s.push_str(&format!(", tag {}", w.tag));
    }
    s
}

/// The divergence of a replay whose record has `got` where `w`'s call asked.
pub(super) fn mismatch(w: &What<'_>, got: &Decision) -> Error {
    let why = format!(
        "replay diverged at rank {}: the program made {}, the record has {}",
        state::get().map_or(0, |s| s.rank),
        describe(w),
        got.describe()
    );
    if let Some(s) = state::get() {
        *lock(&s.diverged) = Some(why.clone());
    }
    Error::Replay(why)
}

/// A blocking receive or probe from `src`: records which source a wildcard one matched, or
/// receives from the recorded source.
#[cold]
#[inline(never)]
pub(crate) fn matched<X: Matched>(w: What<'_>, src: Source, f: impl FnOnce(Source) -> Result<X>) -> Result<X>
where
    Result<X>: Outcome,
{
    if src != Source::Any || !deciding() {
        return call(w, || f(src));
    }
    if is(REPLAY) {
        return match next(&w)? {
            Decision::Matched { source, .. } => call(w, || f(Source::Rank(source as Rank))),
            other => Err(mismatch(&w, &other)),
        };
    }
    let r = call(w, || f(Source::Any));
    let got = match &r {
        Ok(x) => Some(x.source()),
        Err(Error::Truncated { source_rank, .. }) => Some(*source_rank),
        Err(_) => None,
    };
    if let Some(s) = got {
        push(Decision::Matched { call: w.kind, source: s as u32, seq: 0 });
    }
    r
}

/// A call that answers "found" or "nothing yet" (`iprobe`, `improbe`, `test`): records the
/// answer, or gives the recorded one (trying until it finds what the record found; a probe
/// from any source tries the recorded source).
#[cold]
#[inline(never)]
pub(crate) fn answered<X: Matched>(w: What<'_>, src: Source, mut f: impl FnMut(Source) -> Result<Option<X>>) -> Result<Option<X>>
where
    Result<Option<X>>: Outcome,
{
    if !deciding() {
        return call(w, || f(src));
    }
    if is(REPLAY) {
        let (found, source) = match next(&w)? {
            Decision::Answer { found, source, .. } => (found, source),
            other => return Err(mismatch(&w, &other)),
        };
        if !found {
            return call(w, || Ok(None));
        }
        let forced = if src == Source::Any && source != NONE { Source::Rank(source as Rank) } else { src };
        return call(w, || loop {
            if let Some(x) = f(forced)? {
                return Ok(Some(x));
            }
            std::thread::yield_now();
        });
    }
    let r = call(w, || f(src));
    if let Ok(o) = &r {
        push(Decision::Answer { call: w.kind, found: o.is_some(), source: o.as_ref().map_or(NONE, |x| x.source() as u32) });
    }
    r
}

/// Posting a non-blocking receive from `src`: a wildcard one gets the next post number;
/// recording remembers its request, replay posts it on the recorded source.
#[cold]
#[inline(never)]
pub(crate) fn posted<R: Keyed>(w: What<'_>, src: Source, f: impl FnOnce(Source) -> Result<R>) -> Result<R>
where
    Result<R>: Outcome,
{
    let Some(s) = state::get().filter(|_| src == Source::Any && deciding()) else {
        return call(w, || f(src));
    };
    let post = s.posts.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    if let Some(rp) = s.replay.as_ref() {
        let forced = lock(rp).posted(post).map_or(Source::Any, |(source, _)| Source::Rank(source as Rank));
        return call(w, || f(forced));
    }
    let r = call(w, || f(Source::Any));
    if let Some(k) = r.as_ref().ok().and_then(Keyed::key) {
        lock(&s.post_of).insert(k, post);
    }
    r
}

/// A request that names its engine request.
pub(crate) trait Keyed {
    fn key(&self) -> Option<ReqId>;
}

/// Notes that request `key` completed with `st`: a recorded wildcard post gets its decision.
pub(crate) fn completed(key: Option<ReqId>, st: &Status) {
    let Some(s) = state::get().filter(|_| is(RECORD)) else { return };
    let Some(k) = key else { return };
    let post = lock(&s.post_of).remove(&k);
    if let (Some(post), false) = (post, st.cancelled()) {
        push(Decision::Posted { post, source: st.source() as u32, seq: 0 });
    }
}

/// [`completed`] for a request that ended at the end of its scope (if it ended well).
pub(crate) fn settled(key: ReqId, r: &Result<Status>) {
    if let Ok(st) = r {
        completed(Some(key), st);
    }
}

/// [`completed`] for a `VecRequest::wait` result, passed through.
pub(crate) fn completed_vec<T>(key: Option<ReqId>, r: Result<(Vec<T>, Status)>) -> Result<(Vec<T>, Status)> {
    if let Ok((_, st)) = &r {
        completed(key, st);
    }
    r
}

/// [`completed`] for a `VecRequest::test` result, passed through.
pub(crate) fn completed_vec_opt<T>(key: Option<ReqId>, r: Result<Option<(Vec<T>, Status)>>) -> Result<Option<(Vec<T>, Status)>> {
    if let Ok(Some((_, st))) = &r {
        completed(key, st);
    }
    r
}
