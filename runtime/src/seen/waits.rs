//! The completion calls of requests (`wait`, `test`, `wait_all`, `wait_any`, `wait_some`,
//! `test_any`, `test_some`, `test_all`) seen with record and replay: which requests they
//! reported is their decision; replayed by waiting for exactly those. A wildcard receive
//! posted earlier gets its own decision when its request completes ([`super::calls::completed`]).

use tmpi_trace::event::NONE;
use tmpi_trace::record::Decision;

use super::calls::{answered, completed, mismatch, next, push, Keyed};
use super::{call, is, What, RECORD, REPLAY};
use crate::engine::ReqId;
use crate::envelope::Source;
use crate::error::Result;
use crate::request::Request;
use crate::Status;

impl Keyed for Request<'_> {
    fn key(&self) -> Option<ReqId> {
        Request::key(self)
    }
}

fn keys(reqs: &[Request<'_>]) -> Vec<Option<ReqId>> {
    reqs.iter().map(Keyed::key).collect()
}

/// `Request::wait`.
#[cold]
#[inline(never)]
pub(crate) fn wait(w: What<'_>, r: Request<'_>) -> Result<Status> {
    let key = r.key();
    let res = call(w, || r.wait());
    if let Ok(st) = &res {
        completed(key, st);
    }
    res
}

/// `Request::test`.
#[cold]
#[inline(never)]
pub(crate) fn test(w: What<'_>, r: &mut Request<'_>) -> Result<Option<Status>> {
    let key = r.key();
    let res = answered(w, Source::Any, |_| r.test());
    if let Ok(Some(st)) = &res {
        completed(key, st);
    }
    res
}

/// `wait_all`.
#[cold]
#[inline(never)]
pub(crate) fn wait_all(w: What<'_>, reqs: Vec<Request<'_>>) -> Result<Vec<Status>> {
    let ks = keys(&reqs);
    let res = call(w, || crate::wait_all(reqs));
    if let Ok(sts) = &res {
        ks.iter().zip(sts).for_each(|(k, st)| completed(*k, st));
    }
    res
}

/// Waits for exactly the requests at `picked` (indices into `reqs` as it is), removes them
/// and returns their results in order.
fn take_picked(w: &What<'_>, reqs: &mut Vec<Request<'_>>, picked: &[u32]) -> Result<Vec<(usize, Result<Status>)>> {
    let mut idx: Vec<usize> = picked.iter().map(|&i| i as usize).collect();
    idx.sort_unstable();
    idx.dedup();
    if idx.last().is_some_and(|&i| i >= reqs.len()) || idx.len() != picked.len() {
        let d = Decision::Picked { call: w.kind, indices: picked.to_vec() };
        return Err(mismatch(w, &d));
    }
    let taken: Vec<(usize, Request<'_>)> = idx.iter().rev().map(|&i| (i, reqs.remove(i))).collect();
    Ok(taken.into_iter().rev().map(|(i, r)| (i, r.wait())).collect())
}

/// The replayed pick of `w`'s call, or `None` when not replaying.
fn replayed_pick(w: &What<'_>) -> Option<Result<Vec<u32>>> {
    if !is(REPLAY) {
        return None;
    }
    Some(next(w).and_then(|d| match d {
        Decision::Picked { indices, .. } => Ok(indices),
        other => Err(mismatch(w, &other)),
    }))
}

/// `wait_some` and `test_some` (`test` says which).
#[cold]
#[inline(never)]
pub(crate) fn some(w: What<'_>, reqs: &mut Vec<Request<'_>>, test: bool) -> Result<Vec<(usize, Result<Status>)>> {
    let ks = keys(reqs);
    let res = match replayed_pick(&w) {
        Some(p) => {
            let picked = p?;
            call(w, || take_picked(&w, reqs, &picked))
        }
        None => call(w, || if test { crate::test_some(reqs) } else { crate::wait_some(reqs) }),
    };
    if let Ok(done) = &res {
        if is(RECORD) {
            push(Decision::Picked { call: w.kind, indices: done.iter().map(|(i, _)| *i as u32).collect() });
        }
        for (i, r) in done {
            if let Ok(st) = r {
                completed(ks.get(*i).copied().flatten(), st);
            }
        }
    }
    res
}

/// `wait_any` and `test_any` (`test` says which): one request or (a test) none.
#[cold]
#[inline(never)]
pub(crate) fn any(w: What<'_>, reqs: &mut Vec<Request<'_>>, test: bool) -> Result<Option<(usize, Status)>> {
    let ks = keys(reqs);
    let res = match replayed_pick(&w) {
        Some(p) => {
            let picked = p?;
            call(w, || -> Result<Option<(usize, Status)>> {
                let mut got = take_picked(&w, reqs, &picked)?;
                match got.pop() {
                    Some((i, r)) if got.is_empty() => r.map(|st| Some((i, st))),
                    None if test => Ok(None),
                    _ => Err(mismatch(&w, &Decision::Picked { call: w.kind, indices: picked.clone() })),
                }
            })
        }
        None => call(w, || if test { crate::test_any(reqs) } else { crate::wait_any(reqs).map(Some) }),
    };
    if let Ok(o) = &res {
        if is(RECORD) {
            push(Decision::Picked { call: w.kind, indices: o.iter().map(|(i, _)| *i as u32).collect() });
        }
        if let Some((i, st)) = o {
            completed(ks.get(*i).copied().flatten(), st);
        }
    }
    res
}

/// `test_all`: all done (and collected) or none.
#[cold]
#[inline(never)]
pub(crate) fn test_all(w: What<'_>, reqs: &mut Vec<Request<'_>>) -> Result<Option<Vec<Status>>> {
    let ks = keys(reqs);
    let res = if is(REPLAY) {
        match next(&w)? {
            Decision::Answer { found: false, .. } => call(w, || Ok(None)),
            Decision::Answer { found: true, .. } => call(w, || crate::wait_all(std::mem::take(reqs)).map(Some)),
            other => return Err(mismatch(&w, &other)),
        }
    } else {
        call(w, || crate::test_all(reqs))
    };
    if let Ok(o) = &res {
        if is(RECORD) {
            push(Decision::Answer { call: w.kind, found: o.is_some(), source: NONE });
        }
        for (k, st) in ks.iter().zip(o.iter().flatten()) {
            completed(*k, st);
        }
    }
    res
}
