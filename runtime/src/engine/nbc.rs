//! Non-blocking collectives, the engine's side: each one is a request of kind
//! [`ReqKind::Coll`] whose schedule (any [`Schedule`]) sits in `Engine::nbc` and is advanced
//! by every round of progress while any is in flight. The schedules themselves (what to send,
//! receive and combine, round by round) are written above the engine, which knows them only
//! through this trait.

use super::*;

/// A non-blocking schedule as the engine holds it: something that posts and completes
/// transfers on the engine, round by round, until it has finished. The engine keeps it from
/// [`Engine::start_nbc`] until it finishes or its request is abandoned.
pub(crate) trait Schedule: Send {
    /// The request that completes when the schedule has run to its end
    /// ([`Engine::complete_nbc`]).
    fn set_request(&mut self, rid: ReqId);
    /// Runs as far as it can; returns how many rounds moved on.
    fn advance(&mut self, e: &mut Engine) -> usize;
    /// Whether it has run to its end (or was abandoned).
    fn is_finished(&self) -> bool;
    /// The collective context of the communicator it runs on.
    fn ctx(&self) -> u32;
    /// The call's whole sequence number on that context, when its calls are numbered (a
    /// member that fails the call names it so, see [`Engine::fail_collective`]).
    fn call(&self) -> Option<u32>;
    /// The transfers in flight.
    fn pending(&self) -> Vec<ReqId>;
    /// Ends it with `err`: its transfers are abandoned and its request completes with `err`.
    fn fail(&mut self, e: &mut Engine, err: Error);
    /// Abandons every transfer in flight and stops; nothing touches a buffer afterwards.
    fn abandon(&mut self, e: &mut Engine);
}

/// A schedule in the engine's keeping.
type Sched = Box<dyn Schedule>;

impl Engine {
    /// Registers `sched` and returns the request that completes when it has run to its end.
    /// Its first round starts at once.
    pub(crate) fn start_nbc(&mut self, sched: impl Schedule + 'static) -> ReqId {
        let mut sched: Sched = Box::new(sched);
        let k = self.nbc.vacant_key();
        let rid = self.st.reqs.insert(Req { kind: ReqKind::Coll(k), result: None, detached: false });
        sched.set_request(rid);
        // A panic in a user operator must not drop a schedule whose transfers the engine
        // still holds: they are abandoned first.
        if let Err(p) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| sched.advance(self))) {
            sched.abandon(self);
            self.st.reqs.remove(rid);
            std::panic::resume_unwind(p);
        }
        if sched.is_finished() {
            return rid;
        }
        let got = self.nbc.insert(sched);
        debug_assert_eq!(got, k, "the schedule slab handed out another key than it promised");
        rid
    }

    /// Completes the request of a schedule with `r`.
    pub(crate) fn complete_nbc(&mut self, rid: ReqId, r: Result<()>) {
        let Some(req) = self.st.reqs.get_mut(rid) else { return };
        if req.result.is_none() {
            req.result = Some(r.map(|()| Status::sent()).map_err(Box::new));
        }
        if req.detached {
            self.st.reqs.remove(rid);
        }
    }

    /// Advances every schedule in flight; returns how many rounds moved on.
    pub(super) fn progress_nbc(&mut self) -> Result<usize> {
        // The schedules post and complete requests on this engine, so they are taken out while
        // they run (a nested progress, from an abandon inside a schedule, sees none).
        let mut active = std::mem::replace(&mut self.nbc, Slab::new());
        let keys: Vec<Key> = active.keys().collect();
        let mut n = 0;
        for k in keys {
            let Some(s) = active.get_mut(k) else { continue };
            match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| s.advance(self))) {
                Ok(m) => n += m,
                Err(p) => {
                    // A user operator panicked: put every schedule back, so that the scope
                    // that unwinds abandons their transfers before their memory goes.
                    self.nbc = active;
                    std::panic::resume_unwind(p);
                }
            }
            if s.is_finished() {
                active.remove(k);
            }
        }
        debug_assert!(self.nbc.is_empty(), "a schedule was started during progress");
        self.nbc = active;
        Ok(n)
    }

    /// The request `rid` of schedule `k` is abandoned (its scope unwinds, or its wait failed):
    /// its transfers are abandoned, so nothing touches the user's buffers any more, and the
    /// slot is freed.
    pub(super) fn abandon_nbc(&mut self, rid: ReqId, k: Key) {
        if let Some(mut s) = self.nbc.remove(k) {
            s.abandon(self);
        }
        self.st.reqs.remove(rid);
    }

    /// Liveness of schedule `k` for a waiter: if another member failed the call, or one of its
    /// transfers can no longer complete, the collective fails now (its other members are told
    /// of a departure) and the waiter collects that.
    pub(super) fn check_gone_nbc(&mut self, k: Key) -> Result<()> {
        let Some(s) = self.nbc.get(k) else { return Ok(()) };
        let err = match s.call().and_then(|seq| self.st.failed_call(s.ctx(), seq)) {
            Some(rank) => Some(Error::CollectiveFailed { rank }),
            None => s.pending().into_iter().find_map(|sub| self.check_gone(&Need::Req(sub)).err()),
        };
        let Some(err) = err else { return Ok(()) };
        if let Some(mut s) = self.nbc.remove(k) {
            s.fail(self, err);
        }
        Ok(())
    }
}
