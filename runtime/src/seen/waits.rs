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
use crate::Status;

/// What these calls need of a request type: its key, and its completion calls as they run
/// when nothing is seen (inside [`call`], which turns seeing off). `crate::Request` is the one
/// implementation; the trait keeps this layer below the request layer that calls it.
pub(crate) trait Completion: Keyed + Sized {
    fn wait(self) -> Result<Status>;
    fn test(&mut self) -> Result<Option<Status>>;
    fn wait_all(reqs: Vec<Self>) -> Result<Vec<Status>>;
    fn wait_any(reqs: &mut Vec<Self>) -> Result<(usize, Status)>;
    fn test_any(reqs: &mut Vec<Self>) -> Result<Option<(usize, Status)>>;
    fn wait_some(reqs: &mut Vec<Self>) -> Result<Vec<(usize, Result<Status>)>>;
    fn test_some(reqs: &mut Vec<Self>) -> Result<Vec<(usize, Result<Status>)>>;
    fn test_all(reqs: &mut Vec<Self>) -> Result<Option<Vec<Status>>>;
}

fn keys<R: Keyed>(reqs: &[R]) -> Vec<Option<ReqId>> {
    reqs.iter().map(Keyed::key).collect()
}

/// `Request::wait`.
#[cold]
#[inline(never)]
pub(crate) fn wait<R: Completion>(w: What<'_>, r: R) -> Result<Status> {
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
pub(crate) fn test<R: Completion>(w: What<'_>, r: &mut R) -> Result<Option<Status>> {
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
pub(crate) fn wait_all<R: Completion>(w: What<'_>, reqs: Vec<R>) -> Result<Vec<Status>> {
    let ks = keys(&reqs);
    let res = call(w, || R::wait_all(reqs));
    if let Ok(sts) = &res {
        ks.iter().zip(sts).for_each(|(k, st)| completed(*k, st));
    }
    res
}

/// Waits for exactly the requests at `picked` (indices into `reqs` as it is), removes them
/// and returns their results in order.
fn take_picked<R: Completion>(w: &What<'_>, reqs: &mut Vec<R>, picked: &[u32]) -> Result<Vec<(usize, Result<Status>)>> {
    let mut idx: Vec<usize> = picked.iter().map(|&i| i as usize).collect();
    idx.sort_unstable();
    idx.dedup();
    if idx.last().is_some_and(|&i| i >= reqs.len()) || idx.len() != picked.len() {
        let d = Decision::Picked { call: w.kind, indices: picked.to_vec() };
        return Err(mismatch(w, &d));
    }
    let taken: Vec<(usize, R)> = idx.iter().rev().map(|&i| (i, reqs.remove(i))).collect();
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
pub(crate) fn some<R: Completion>(w: What<'_>, reqs: &mut Vec<R>, test: bool) -> Result<Vec<(usize, Result<Status>)>> {
    let ks = keys(reqs);
    let res = match replayed_pick(&w) {
        Some(p) => {
            let picked = p?;
            call(w, || take_picked(&w, reqs, &picked))
        }
        None => call(w, || if test { R::test_some(reqs) } else { R::wait_some(reqs) }),
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
pub(crate) fn any<R: Completion>(w: What<'_>, reqs: &mut Vec<R>, test: bool) -> Result<Option<(usize, Status)>> {
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
        None => call(w, || if test { R::test_any(reqs) } else { R::wait_any(reqs).map(Some) }),
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
pub(crate) fn test_all<R: Completion>(w: What<'_>, reqs: &mut Vec<R>) -> Result<Option<Vec<Status>>> {
    let ks = keys(reqs);
    let res = if is(REPLAY) {
        match next(&w)? {
            Decision::Answer { found: false, .. } => call(w, || Ok(None)),
            Decision::Answer { found: true, .. } => call(w, || R::wait_all(std::mem::take(reqs)).map(Some)),
            other => return Err(mismatch(&w, &other)),
        }
    } else {
        call(w, || R::test_all(reqs))
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
