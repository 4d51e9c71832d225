//! Non-blocking operations inside scopes.
//!
//! A [`Scope`] is to requests what `std::thread::scope` is to threads: a buffer lent to
//! [`Comm::isend`] or [`Comm::irecv`] stays borrowed until the scope ends, and the scope does
//! not end before every request it started has completed — even one that was dropped or
//! leaked with `mem::forget`. If the scope's closure panics, the scope instead abandons what
//! is left (the engine forgets the buffers) so that a failing rank never hangs.
//!
//! ```no_run
//! # fn main() -> tmpi::Result<()> {
//! let world = tmpi::init()?;
//! let peer = (world.rank() + 1) % world.size();
//! let (sbuf, mut rbuf) = (vec![world.rank() as u64; 1024], vec![0u64; 1024]);
//! tmpi::scope(|s| -> tmpi::Result<()> {
//!     let r = world.irecv(s, &mut rbuf, tmpi::ANY_SOURCE, 7)?;
//!     let w = world.isend(s, &sbuf, peer, 7)?;
//!     w.wait()?;
//!     let st = r.wait()?;
//!     assert_eq!(st.count::<u64>(), 1024);
//!     Ok(())
//! })?;
//! # Ok(()) }
//! ```

use std::cell::RefCell;
use std::marker::PhantomData;
use std::sync::Arc;

use bytemuck::Pod;

use crate::comm::{finish, Comm, Source, Status, TagMatch};
use crate::engine::{Backoff, Need, ReqId};
use crate::error::{Error, Result};
use crate::seen::{self, Kind, What};
use crate::sync::{EngineCell, EngineGuard};
use crate::{Rank, Tag};

type Eng = Arc<EngineCell>;

/// The requests a scope started on its engine (the engine of its first request).
type Started = Vec<ReqId>;

thread_local! {
    /// Lists of started requests from scopes that ended, kept for the next scopes of this
    /// thread so that a scope in a loop does not allocate.
    static STARTED_POOL: RefCell<Vec<Started>> = const { RefCell::new(Vec::new()) };
}

/// Lists kept in [`STARTED_POOL`] (scopes nest rarely deeper).
const POOL_KEEP: usize = 8;

/// The region inside which non-blocking operations live. See the module docs.
pub struct Scope<'scope, 'env: 'scope> {
    /// The engine of the scope's first request, held once for all requests on it.
    engine: std::cell::OnceCell<Eng>,
    /// Requests started on `engine` (a plain list of handles: pushing one is one store).
    started: RefCell<Started>,
    /// Requests started on another engine (rare: communicators of two runtimes in one
    /// thread, as in tests), each with its engine. The scope keeps each such engine alive
    /// here until its end, which is what lets their requests borrow it for `'scope`.
    others: RefCell<Vec<(Eng, ReqId)>>,
    _scope: PhantomData<&'scope mut &'scope ()>,
    _env: PhantomData<&'env mut &'env ()>,
}

impl std::fmt::Debug for Scope<'_, '_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scope").field("started", &self.started.borrow().len()).finish()
    }
}

/// Runs `f` with a [`Scope`]; returns once every request started in it has completed.
///
/// Errors of requests that were never waited on are discarded at the end of the scope.
pub fn scope<'env, F, R>(f: F) -> R
where
    F: for<'scope> FnOnce(&'scope Scope<'scope, 'env>) -> R,
{
    let started = STARTED_POOL.with(|p| p.borrow_mut().pop()).unwrap_or_default();
    let s = Scope {
        engine: std::cell::OnceCell::new(),
        started: RefCell::new(started),
        others: RefCell::new(Vec::new()),
        _scope: PhantomData,
        _env: PhantomData,
    };
    let end = End(&s);
    let r = f(end.0);
    drop(end);
    r
}

/// Ends a [`scope`] when dropped (also while unwinding): settles the requests it started.
struct End<'a, 'b, 'c>(&'a Scope<'b, 'c>);
impl Drop for End<'_, '_, '_> {
    fn drop(&mut self) {
        let mut started = std::mem::take(&mut *self.0.started.borrow_mut());
        let panicking = std::thread::panicking();
        // The requests on the scope's engine under one lock, then the others (rare) one
        // by one.
        if let Some(eng) = self.0.engine.get() {
            let mut e = cleanup_lock(eng);
            if e.no_requests() {
                // All collected (a window waited for whole): nothing to look up.
                started.clear();
            }
            let forget = panicking || eng.is_closed();
            for rid in started.drain(..) {
                settle(&mut e, rid, forget);
            }
        }
        for (eng, rid) in std::mem::take(&mut *self.0.others.borrow_mut()) {
            let forget = panicking || eng.is_closed();
            settle(&mut cleanup_lock(&eng), rid, forget);
        }
        // Keep the (now empty) list for the next scope; not while unwinding (the pool's
        // borrow may be what panicked) and not an unusually large one.
        if !panicking && started.capacity() <= 4096 {
            let _ = STARTED_POOL.try_with(|p| {
                if let Ok(mut p) = p.try_borrow_mut() {
                    if p.len() < POOL_KEEP {
                        p.push(started);
                    }
                }
            });
        }
    }
}
/// The engine for the end of a scope.
fn cleanup_lock(eng: &EngineCell) -> EngineGuard<'_> {
    eng.lock_for_cleanup().unwrap_or_else(|_| {
        // The engine is busy further up this thread's stack (a panic unwound out of it):
        // it cannot be told to forget the scope's buffers, which are about to be freed.
        // Nothing sound is left but to stop here.
        eprintln!("tmpi: a scope ended while the engine was in use; aborting so no transfer can touch freed memory");
        std::process::abort();
    })
}
/// Ends request `rid` at the end of its scope: forgets its buffer when unwinding or when
/// the world was finalized (no wait could be answered by a call of this rank any more),
/// else waits for it (unless it is done).
#[inline(always)]
fn settle(e: &mut EngineGuard<'_>, rid: ReqId, forget: bool) {
    if forget {
        e.abandon(rid);
    } else if !e.discard(rid) {
        let r = finish(e, rid);
        if seen::recording() {
            seen::calls::settled(rid, &r);
        }
    }
}

/// A pending non-blocking operation. Dropping it leaves the operation to its scope.
#[must_use = "a request completes at the end of its scope at the latest; wait on it to see its result"]
pub struct Request<'scope> {
    /// The request's engine: the scope's first engine, or another one that the scope keeps
    /// alive in `Scope::others` (no reference counting per request).
    eng: &'scope EngineCell,
    /// The request in `eng`; [`SENT`]: complete when it started (a send that went out at
    /// once, whose status is `Status::sent()`); `None`: collected.
    ///
    /// Two words in all, with `eng`: a request is built in two registers and stored where the
    /// caller keeps it with two plain stores. At five words (an engine enum and a cached
    /// `Option<Status>`), `reqs.push(world.irecv(..)?)` built it on the stack and copied it
    /// into the vector with 16-byte loads that straddled its 8-byte stores: a store-forwarding
    /// stall on every request.
    rid: Option<ReqId>,
    _p: PhantomData<&'scope mut ()>,
}

/// [`Request::rid`] of a request complete when it started: a key of no slot (index
/// `u32::MAX`, the slab's free-list end), so no engine request ever has it.
const SENT: ReqId = ReqId::new(u32::MAX, 1);

impl std::fmt::Debug for Request<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = match self.rid {
            None => "collected",
            Some(SENT) => "done",
            Some(_) => "started",
        };
        f.debug_struct("Request").field("state", &state).finish()
    }
}

impl crate::seen::Seen for Request<'_> {}

impl<'scope> Request<'scope> {
    // Always inlined: as a call, two thirds of its cost were the call's register saves.
    #[inline(always)]
    pub(crate) fn new(eng: &Eng, rid: Option<ReqId>, s: &'scope Scope<'scope, '_>) -> Self {
        let first: &'scope EngineCell = s.engine.get_or_init(|| eng.clone());
        let Some(r) = rid else {
            // Never locked (a SENT request needs no engine): the scope's will do.
            return Request { eng: first, rid: Some(SENT), _p: PhantomData };
        };
        let eng = if std::ptr::eq(first, &**eng) {
            s.started.borrow_mut().push(r);
            first
        } else {
            s.others.borrow_mut().push((eng.clone(), r));
            // SAFETY: the clone just pushed to `s.others` keeps this engine alive (an `Arc`'s
            // pointee never moves) until the scope's end (`End::drop`), and no
            // `Request<'scope>` can be used after that: the scope's closure returns nothing
            // that names `'scope`, so every request is gone (or leaked, never to be used) by
            // then. Nothing removes an entry from `others` before the end.
            unsafe { &*Arc::as_ptr(eng) }
        };
        Request { eng, rid: Some(r), _p: PhantomData }
    }

    /// Waits for completion.
    ///
    /// # Errors
    /// The operation's error ([`Error::Truncated`], [`Error::PeerGone`], ...).
    #[inline]
    pub fn wait(mut self) -> Result<Status> {
        if seen::on() {
            return self.wait_seen();
        }
        self.wait_mut()
    }

    /// [`Request::wait`] as a seen call: out of line, so that the public call stays small
    /// enough to inline when nothing is seen.
    #[cold]
    #[inline(never)]
    fn wait_seen(self) -> Result<Status> {
        seen::waits::wait(What::new(Kind::Wait).reqs(1), self)
    }

    /// [`Request::wait`] in place: the request is collected (a second call is an error).
    fn wait_mut(&mut self) -> Result<Status> {
        let rid = self.rid.take().ok_or_else(|| Error::State("request already collected".into()))?;
        if rid == SENT {
            return Ok(Status::sent());
        }
        let mut e = self.eng.lock()?;
        finish(&mut e, rid)
    }

    /// Completes the request if it can be completed now.
    ///
    /// A request found complete stays in the engine with its status until it is waited for
    /// (or its scope ends), so a later [`Request::wait`] returns the same status at once; one
    /// that failed is collected here, with its error.
    ///
    /// # Errors
    /// As [`Request::wait`].
    #[inline]
    pub fn test(&mut self) -> Result<Option<Status>> {
        if seen::on() {
            return self.test_seen();
        }
        let Some(rid) = self.rid else {
            return Err(Error::State("request already collected".into()));
        };
        if rid == SENT {
            return Ok(Some(Status::sent()));
        }
        let mut e = self.eng.lock()?;
        e.test_step(rid)?;
        match e.done_status(rid) {
            None => Ok(None),
            Some(Ok(st)) => Ok(Some(st)),
            Some(Err(())) => {
                self.rid = None;
                finish(&mut e, rid).map(Some)
            }
        }
    }

    /// [`Request::test`] as a seen call, out of line (see [`Request::wait_seen`]).
    #[cold]
    #[inline(never)]
    fn test_seen(&mut self) -> Result<Option<Status>> {
        seen::waits::test(What::new(Kind::Test).reqs(1), self)
    }

    /// Cancels a receive that has not matched yet (its status then says cancelled); no effect
    /// on a send or on a receive that has matched.
    ///
    /// # Errors
    /// None today; the signature leaves room for fabrics where cancel can fail.
    pub fn cancel(&mut self) -> Result<()> {
        if seen::on() {
            return seen::call(What::new(Kind::Cancel).reqs(1), || self.cancel());
        }
        if let Some(rid) = self.rid.filter(|&r| r != SENT) {
            self.eng.lock()?.cancel(rid);
        }
        Ok(())
    }

    /// Abandons a request that can no longer complete and returns why.
    fn fail_gone(mut self) -> Error {
        let Some(rid) = self.rid.take().filter(|&r| r != SENT) else {
            return Error::State("request already collected".into());
        };
        let mut e = match self.eng.lock() {
            Ok(e) => e,
            Err(err) => return err,
        };
        let err = e.check_gone(&Need::Req(rid)).err().unwrap_or_else(|| Error::State("request failed".into()));
        e.abandon(rid);
        err
    }

    /// Takes the request out of its scope: the scope's end no longer waits for it, and the
    /// returned [`crate::Detached`] owns it (waits, tests, cancels; abandons it when dropped
    /// incomplete). For bindings whose requests outlive any closure (the rsmpi crate).
    ///
    /// # Safety
    /// The buffer the request was started with must stay valid (and, for a receive, not be
    /// read or written by anyone else) until the `Detached` reports completion or is dropped.
    pub unsafe fn detach(mut self, s: &Scope<'scope, '_>) -> crate::Detached {
        let rid = match self.rid.take() {
            Some(r) if r != SENT => r,
            _ => return crate::Detached::done(),
        };
        if let Some(first) = s.engine.get().filter(|f| std::ptr::eq(&***f, self.eng)) {
            let mut started = s.started.borrow_mut();
            if let Some(i) = started.iter().rposition(|&r| r == rid) {
                started.swap_remove(i);
            }
            return crate::Detached::new(first.clone(), rid);
        }
        let mut others = s.others.borrow_mut();
        let i = others.iter().rposition(|(e, r)| *r == rid && std::ptr::eq(&**e, self.eng));
        match i {
            Some(i) => crate::Detached::new(others.swap_remove(i).0, rid),
            // Unreachable: every started request is listed in its scope.
            None => crate::Detached::done(),
        }
    }

    /// The engine request, while one is pending (for [`crate::seen`]).
    pub(crate) fn key(&self) -> Option<ReqId> {
        self.rid.filter(|&r| r != SENT)
    }

    fn is_done(&self) -> bool {
        match self.rid {
            None | Some(SENT) => true,
            Some(r) => self.eng.lock().is_ok_and(|e| e.is_done(r)),
        }
    }
}

/// Waits for every request; returns their statuses in order, or the first error (after all
/// have completed).
///
/// # Errors
/// The first failed request's error.
pub fn wait_all<'s>(reqs: Vec<Request<'s>>) -> Result<Vec<Status>> {
    if seen::on() {
        return seen::waits::wait_all(What::new(Kind::WaitAll).reqs(reqs.len()), reqs);
    }
    let mut out = Vec::with_capacity(reqs.len());
    let mut first_err = None;
    // Requests on their scope's engine (nearly always all of them) complete under one lock,
    // taken once for a run of them instead of once per request.
    let mut held: Option<EngineGuard<'s>> = None;
    let mut reqs = reqs;
    // Taken by reference: moving each request out of the vector copied it through the stack,
    // and the copy stalled on the stores that had just written it.
    for r in reqs.iter_mut() {
        let res = match r.rid {
            // Complete when it started (a send that went out at once): no engine needed, and
            // the engine held for the run stays held.
            Some(SENT) => {
                r.rid = None;
                Ok(Status::sent())
            }
            Some(rid) => {
                let cell = r.eng;
                let g = match held.take() {
                    Some(g) if g.holds(cell) => g,
                    other => {
                        drop(other);
                        match cell.lock() {
                            Ok(g) => g,
                            Err(e) => {
                                first_err.get_or_insert(e);
                                continue;
                            }
                        }
                    }
                };
                r.rid = None;
                finish(held.insert(g), rid)
            }
            None => r.wait_mut(),
        };
        match res {
            Ok(s) => out.push(s),
            Err(e) => {
                first_err.get_or_insert(e);
            }
        }
    }
    match first_err {
        Some(e) => Err(e),
        None => Ok(out),
    }
}

/// Waits until one request completes, removes it from `reqs` and returns its index (before
/// removal) and status.
///
/// # Errors
/// [`Error::InvalidBuffer`] for an empty list; the completed request's error (that request is
/// removed too, and the error does not say which one it was: [`wait_some`] gives each
/// completed request's result with its index).
pub fn wait_any(reqs: &mut Vec<Request<'_>>) -> Result<(usize, Status)> {
    if seen::on() {
        return seen::waits::any(What::new(Kind::WaitAny).reqs(reqs.len()), reqs, false)?
            .ok_or_else(|| Error::State("wait_any reported nothing".into()));
    }
    if reqs.is_empty() {
        return Err(Error::InvalidBuffer("wait_any on an empty list of requests".into()));
    }
    let mut backoff: Option<Backoff> = None;
    loop {
        if let Some(i) = reqs.iter().position(|r| r.is_done()) {
            let st = reqs.remove(i).wait()?;
            return Ok((i, st));
        }
        let eng = reqs[0].eng;
        let mut e = eng.lock()?;
        if e.progress()? == 0 {
            let b = backoff.get_or_insert_with(|| e.backoff());
            if e.idle(b, |_| false) {
                // A request that can no longer complete is the one that "completes" (with
                // its error).
                let gone = reqs.iter().position(|r| r.rid.is_some_and(|rid| rid != SENT && e.check_gone(&Need::Req(rid)).is_err()));
                if let Some(i) = gone {
                    drop(e);
                    let r = reqs.remove(i);
                    return Err(r.fail_gone());
                }
            }
        } else if let Some(b) = &mut backoff {
            b.reset();
        }
    }
}

/// Removes every completed request from `reqs` (indices before removal, in order) and collects
/// its result.
fn take_done(reqs: &mut Vec<Request<'_>>) -> Vec<(usize, Result<Status>)> {
    let mut out = Vec::new();
    let mut i = 0;
    let mut orig = 0;
    while i < reqs.len() {
        if reqs[i].is_done() {
            out.push((orig, reqs.remove(i).wait()));
        } else {
            i += 1;
        }
        orig += 1;
    }
    out
}

/// One round of progress on the engine of `reqs` (every request of a thread shares it).
fn poke(reqs: &[Request<'_>]) -> Result<()> {
    if let Some(r) = reqs.iter().find(|r| r.rid.is_some_and(|rid| rid != SENT)) {
        let mut e = r.eng.lock()?;
        if e.progress()? == 0 {
            if let Some(rid) = r.rid {
                e.idle_check(&Need::Req(rid))?;
            }
        }
    }
    Ok(())
}

/// Waits until at least one request completes, then removes every completed one from `reqs`
/// and returns their indices (before removal) and results (MPI's `waitsome`).
///
/// ```
/// let got = tmpi::run_local(2, |w| {
///     let peer = 1 - w.rank();
///     let (a, mut b, mut c) = ([1u8], [0u8], [0u8]);
///     tmpi::scope(|s| {
///         let mut reqs = vec![w.irecv(s, &mut b, peer, 1).unwrap(), w.irecv(s, &mut c, peer, 2).unwrap()];
///         w.send(&a, peer, 2).unwrap();
///         w.send(&a, peer, 1).unwrap();
///         let mut seen = 0;
///         while !reqs.is_empty() {
///             seen += tmpi::wait_some(&mut reqs).unwrap().len();
///         }
///         seen
///     })
/// });
/// assert_eq!(got, vec![2, 2]);
/// ```
///
/// # Errors
/// [`Error::InvalidBuffer`] for an empty list; a failure of progress. A request that failed is
/// reported in its entry; one that can no longer complete fails with [`Error::PeerGone`].
pub fn wait_some(reqs: &mut Vec<Request<'_>>) -> Result<Vec<(usize, Result<Status>)>> {
    if seen::on() {
        return seen::waits::some(What::new(Kind::WaitSome).reqs(reqs.len()), reqs, false);
    }
    if reqs.is_empty() {
        return Err(Error::InvalidBuffer("wait_some on an empty list of requests".into()));
    }
    let mut backoff: Option<Backoff> = None;
    loop {
        let done = take_done(reqs);
        if !done.is_empty() {
            return Ok(done);
        }
        let eng = reqs[0].eng;
        let mut e = eng.lock()?;
        if e.progress()? == 0 {
            let b = backoff.get_or_insert_with(|| e.backoff());
            if e.idle(b, |_| false) {
                let gone = reqs.iter().position(|r| r.rid.is_some_and(|rid| rid != SENT && e.check_gone(&Need::Req(rid)).is_err()));
                if let Some(i) = gone {
                    drop(e);
                    let r = reqs.remove(i);
                    return Ok(vec![(i, Err(r.fail_gone()))]);
                }
            }
        } else if let Some(b) = &mut backoff {
            b.reset();
        }
    }
}

/// Completes one request if one can be completed now: removes it and returns its index (before
/// removal) and status; `None` if none is done (MPI's `testany`).
///
/// # Errors
/// The completed request's error; a failure of progress.
pub fn test_any(reqs: &mut Vec<Request<'_>>) -> Result<Option<(usize, Status)>> {
    if seen::on() {
        return seen::waits::any(What::new(Kind::TestAny).reqs(reqs.len()), reqs, true);
    }
    if !reqs.iter().any(Request::is_done) {
        poke(reqs)?;
    }
    match reqs.iter().position(Request::is_done) {
        Some(i) => Ok(Some((i, reqs.remove(i).wait()?))),
        None => Ok(None),
    }
}

/// Removes every request that can be completed now and returns their indices (before
/// removal) and results; empty if none is done (MPI's `testsome`).
///
/// # Errors
/// A failure of progress.
pub fn test_some(reqs: &mut Vec<Request<'_>>) -> Result<Vec<(usize, Result<Status>)>> {
    if seen::on() {
        return seen::waits::some(What::new(Kind::TestSome).reqs(reqs.len()), reqs, true);
    }
    poke(reqs)?;
    Ok(take_done(reqs))
}

/// If every request can be completed now, completes them all (emptying `reqs`) and returns
/// their statuses in order; otherwise leaves them all in place and returns `None` (MPI's
/// `testall`).
///
/// # Errors
/// The first failed request's error (all are collected); a failure of progress.
pub fn test_all(reqs: &mut Vec<Request<'_>>) -> Result<Option<Vec<Status>>> {
    if seen::on() {
        return seen::waits::test_all(What::new(Kind::TestAll).reqs(reqs.len()), reqs);
    }
    if !reqs.iter().all(Request::is_done) {
        poke(reqs)?;
        if !reqs.iter().all(Request::is_done) {
            return Ok(None);
        }
    }
    wait_all(std::mem::take(reqs)).map(Some)
}

impl Comm {
    /// Starts sending `buf`; the buffer stays borrowed until the scope ends.
    ///
    /// # Errors
    /// [`Error::InvalidRank`], [`Error::InvalidTag`], [`Error::PeerGone`].
    #[inline]
    pub fn isend<'scope, T: Pod>(&self, s: &'scope Scope<'scope, '_>, buf: &'scope [T], dest: Rank, tag: Tag) -> Result<Request<'scope>> {
        if seen::on() {
            return self.isend_seen(s, bytemuck::cast_slice(buf), dest, tag);
        }
        let eng = &self.inner.eng;
        let rid = {
            let mut e = eng.lock()?;
            // SAFETY: `buf` is borrowed for 'scope, and the scope finishes or abandons this
            // request before 'scope ends (it is registered in `Request::new`).
            unsafe { self.start_send_bytes(&mut e, self.user_ctx(), bytemuck::cast_slice(buf), dest, tag, false)? }
        };
        Ok(Request::new(eng, rid, s))
    }

    /// [`Comm::isend`] as a seen call: out of line, so that the public call keeps no frame
    /// for it when nothing is seen.
    #[cold]
    #[inline(never)]
    fn isend_seen<'scope>(&self, s: &'scope Scope<'scope, '_>, buf: &'scope [u8], dest: Rank, tag: Tag) -> Result<Request<'scope>> {
        let w = What::new(Kind::Isend).to(self, dest).tag(tag).bytes(buf.len()).sends(self, dest, buf.len());
        seen::call(w, || self.isend(s, buf, dest, tag))
    }

    /// Starts a synchronous send (completes once matched).
    ///
    /// # Errors
    /// As [`Comm::isend`].
    pub fn issend<'scope, T: Pod>(&self, s: &'scope Scope<'scope, '_>, buf: &'scope [T], dest: Rank, tag: Tag) -> Result<Request<'scope>> {
        if seen::on() {
            return seen::call(
                What::new(Kind::Issend).to(self, dest).tag(tag).bytes(size_of_val(buf)).sends(self, dest, size_of_val(buf)),
                || self.issend(s, buf, dest, tag),
            );
        }
        let eng = &self.inner.eng;
        let rid = {
            let mut e = eng.lock()?;
            // SAFETY: as in `isend`.
            unsafe { self.start_send_bytes(&mut e, self.user_ctx(), bytemuck::cast_slice(buf), dest, tag, true)? }
        };
        Ok(Request::new(eng, rid, s))
    }

    /// Posts a receive into `buf`; the buffer stays borrowed until the scope ends.
    ///
    /// # Errors
    /// [`Error::InvalidRank`], [`Error::InvalidTag`].
    #[inline]
    pub fn irecv<'scope, T: Pod>(
        &self,
        s: &'scope Scope<'scope, '_>,
        buf: &'scope mut [T],
        src: impl Into<Source>,
        tag: impl Into<TagMatch>,
    ) -> Result<Request<'scope>> {
        let (src, tag) = (src.into(), tag.into());
        if seen::on() {
            return self.irecv_seen(s, bytemuck::cast_slice_mut(buf), src, tag);
        }
        let (sr, t) = self.recv_args(src, tag)?;
        let eng = &self.inner.eng;
        let rid = {
            let mut e = eng.lock()?;
            // SAFETY: `buf` is borrowed for 'scope, and the scope finishes or abandons this
            // request before 'scope ends.
            unsafe { self.post_recv_bytes(&mut e, self.user_ctx(), bytemuck::cast_slice_mut(buf), sr, t)? }
        };
        Ok(Request::new(eng, Some(rid), s))
    }

    /// [`Comm::irecv`] as a seen call, out of line (see [`Comm::isend_seen`]).
    #[cold]
    #[inline(never)]
    fn irecv_seen<'scope>(
        &self,
        s: &'scope Scope<'scope, '_>,
        buf: &'scope mut [u8],
        src: Source,
        tag: TagMatch,
    ) -> Result<Request<'scope>> {
        seen::calls::posted(What::new(Kind::Irecv).from(self, src).tag_match(tag).bytes(buf.len()), src, |from| {
            self.irecv(s, buf, from, tag)
        })
    }
}

/// The completion calls as the record/replay layer ([`seen::waits`]) runs them.
impl seen::calls::Keyed for Request<'_> {
    fn key(&self) -> Option<ReqId> {
        Request::key(self)
    }
}

impl seen::waits::Completion for Request<'_> {
    fn wait(self) -> Result<Status> {
        Request::wait(self)
    }
    fn test(&mut self) -> Result<Option<Status>> {
        Request::test(self)
    }
    fn wait_all(reqs: Vec<Self>) -> Result<Vec<Status>> {
        wait_all(reqs)
    }
    fn wait_any(reqs: &mut Vec<Self>) -> Result<(usize, Status)> {
        wait_any(reqs)
    }
    fn test_any(reqs: &mut Vec<Self>) -> Result<Option<(usize, Status)>> {
        test_any(reqs)
    }
    fn wait_some(reqs: &mut Vec<Self>) -> Result<Vec<(usize, Result<Status>)>> {
        wait_some(reqs)
    }
    fn test_some(reqs: &mut Vec<Self>) -> Result<Vec<(usize, Result<Status>)>> {
        test_some(reqs)
    }
    fn test_all(reqs: &mut Vec<Self>) -> Result<Option<Vec<Status>>> {
        test_all(reqs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Two words, so that a request is passed and stored in registers (see `Request::rid`).
    const _: () = assert!(std::mem::size_of::<Request<'static>>() == 16);

    /// `test` leaves a complete request's status for `wait`; a failed one is collected by the
    /// `test` that reports it; a send complete at once is complete to both.
    #[test]
    fn test_then_wait_sees_one_outcome() {
        let out = crate::run_local(2, |w| {
            let peer = 1 - w.rank();
            if w.rank() == 0 {
                w.send(&[1u32, 2, 3], peer, 5).expect("send");
                w.send(&[4u32, 5, 6], peer, 6).expect("send");
                return Vec::new();
            }
            let (mut fits, mut short) = ([0u32; 4], [0u32; 1]);
            crate::scope(|s| {
                let mut r = w.irecv(s, &mut fits, peer, 5).expect("irecv");
                let st = loop {
                    if let Some(st) = r.test().expect("test") {
                        break st;
                    }
                };
                assert_eq!(r.test().expect("test again"), Some(st), "a second test sees the same status");
                let waited = r.wait().expect("wait after test");
                let mut t = w.irecv(s, &mut short, peer, 6).expect("irecv");
                let err = loop {
                    match t.test() {
                        Ok(None) => continue,
                        Ok(Some(st)) => panic!("a truncated receive completed: {st:?}"),
                        Err(e) => break e,
                    }
                };
                let again = t.wait().expect_err("the failure was collected by test");
                let mut sent = w.isend(s, &[9u8], peer, 7).expect("isend");
                let sent_test = sent.test().expect("test of a send").is_some();
                vec![
                    (waited.count::<u32>(), waited.tag()) == (3, 5),
                    matches!(err, Error::Truncated { .. }),
                    matches!(again, Error::State(_)),
                    sent_test,
                    sent.wait().is_ok(),
                ]
            })
        });
        // Rank 1's last send is never received: the run ends with it unreceived.
        let got = &out[1];
        assert!(got.len() == 5 && got.iter().all(|&ok| ok), "{got:?}");
    }
}
