//! Requests that no scope owns ([`Request::detach`](crate::Request::detach)).
//!
//! A [`Scope`](crate::Scope) makes non-blocking operations safe by construction; bindings whose
//! requests must outlive any closure (the rsmpi-compatible crate, whose requests live in its own
//! scopes) take a request out of its tmpi scope with the unsafe [`Request::detach`] and keep the
//! buffer alive themselves. A [`Detached`] dropped before completion is abandoned: the engine
//! forgets its buffer (as at the end of a scope that unwinds), so memory is never touched after
//! the handle is gone.
//!
//! [`Request::detach`]: crate::Request::detach

use std::sync::Arc;

use crate::comm::{finish, Status};
use crate::engine::ReqId;
use crate::error::{Error, Result};
use crate::sync::EngineCell;

/// A pending operation taken out of its scope. See the module docs.
pub struct Detached {
    /// The engine and request; `None`: complete when it was detached (or collected since).
    req: Option<(Arc<EngineCell>, ReqId)>,
    /// Set once a request that was complete at detach time has been collected.
    collected: bool,
}

impl std::fmt::Debug for Detached {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Detached").field("pending", &self.req.is_some()).finish()
    }
}

impl Detached {
    pub(crate) fn new(eng: Arc<EngineCell>, rid: ReqId) -> Detached {
        Detached { req: Some((eng, rid)), collected: false }
    }

    /// A request that completed when it started (a send that went out at once).
    pub(crate) fn done() -> Detached {
        Detached { req: None, collected: false }
    }

    /// Waits for completion and collects the status.
    ///
    /// # Errors
    /// The operation's error; [`Error::State`] when the request was already collected.
    pub fn wait(&mut self) -> Result<Status> {
        match self.req.take() {
            Some((eng, rid)) => {
                self.collected = true;
                let mut e = eng.lock()?;
                finish(&mut e, rid)
            }
            None => self.collect_done(),
        }
    }

    /// Completes the request if it can be completed now (collecting it), else `None`.
    ///
    /// # Errors
    /// As [`Detached::wait`].
    pub fn test(&mut self) -> Result<Option<Status>> {
        let Some((eng, rid)) = &self.req else {
            return self.collect_done().map(Some);
        };
        let rid = *rid;
        let mut e = eng.lock()?;
        e.test_step(rid)?;
        if e.done_status(rid).is_none() {
            return Ok(None);
        }
        let r = finish(&mut e, rid);
        drop(e);
        self.req = None;
        self.collected = true;
        r.map(Some)
    }

    /// Cancels a receive that has not matched yet (its status then says cancelled); no effect
    /// on a send or a receive that has matched.
    ///
    /// # Errors
    /// A failure to lock the engine ([`Error::Thread`]).
    pub fn cancel(&self) -> Result<()> {
        if let Some((eng, rid)) = &self.req {
            eng.lock()?.cancel(*rid);
        }
        Ok(())
    }

    /// Whether the request is known complete (or collected) without making progress.
    pub fn is_done(&self) -> bool {
        match &self.req {
            None => true,
            Some((eng, rid)) => eng.lock().is_ok_and(|e| e.is_done(*rid)),
        }
    }

    fn collect_done(&mut self) -> Result<Status> {
        if std::mem::replace(&mut self.collected, true) {
            return Err(Error::State("request already collected".into()));
        }
        Ok(Status::sent())
    }
}

impl Drop for Detached {
    fn drop(&mut self) {
        if let Some((eng, rid)) = self.req.take() {
            match eng.lock_for_cleanup() {
                // The engine forgets the buffer (waiting out any single copy a peer is making),
                // so the owner may free it once this returns.
                Ok(mut e) => e.abandon(rid),
                Err(_) => {
                    eprintln!(
                        "tmpi: a detached request was dropped while the engine was in use; aborting so no transfer can touch freed memory"
                    );
                    std::process::abort();
                }
            }
        }
    }
}
