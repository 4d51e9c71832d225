//! Request sets that hand back what completed: the request's index in the set, its status
//! and its buffer.
//!
//! [`wait_any`](crate::wait_any) and friends remove a completed request from a vector and
//! report its index before the removal; the buffer stays lent to the scope until the scope
//! ends. A [`RequestSet`] instead keeps every request at the index it was given, and a
//! completion carries the buffer back: a receive's `&mut [T]` can be read (and reused) as soon
//! as it completes, inside the scope. [`Comm::irecv_vec`] requests join the same set and hand
//! back their `Vec<T>`.
//!
//! ```
//! let sums = tmpi::run_local(3, |w| {
//!     let (me, n) = (w.rank(), w.size());
//!     let mut bufs = vec![[0u64; 2]; n];
//!     let out = [me as u64, 10 * me as u64];
//!     tmpi::scope(|s| {
//!         let mut set = tmpi::RequestSet::new();
//!         for (src, b) in bufs.iter_mut().enumerate() {
//!             set.irecv(&w, s, b, src, 1).unwrap();
//!         }
//!         for dst in 0..n {
//!             set.isend(&w, s, &out, dst, 1).unwrap();
//!         }
//!         let mut sum = 0;
//!         while let Some(done) = set.wait_any().unwrap() {
//!             if let tmpi::Done::Received(b) = done.data {
//!                 // Index i < n is the receive from rank i: read it at once.
//!                 assert_eq!(done.result.unwrap().source(), done.index);
//!                 sum += b[0] + b[1];
//!             }
//!         }
//!         sum
//!     })
//! });
//! assert_eq!(sums, vec![33, 33, 33]);
//! ```

use std::marker::PhantomData;

use bytemuck::Pod;

use crate::comm::{Comm, Source, Status, TagMatch};
use crate::error::Result;
use crate::request::{Request, Scope};
use crate::vecrecv::VecRequest;
use crate::{Rank, Tag};

/// What a completed request hands back.
#[derive(Debug)]
pub enum Done<'s, T> {
    /// A send: the buffer it was lent.
    Sent(&'s [T]),
    /// A receive: the buffer, now holding the message (`result` tells how much).
    Received(&'s mut [T]),
    /// An [`Comm::irecv_vec`] receive: the message (empty if it failed or was cancelled).
    Vec(Vec<T>),
    /// A request added with [`RequestSet::add`] (no buffer known to the set).
    Other,
}

/// One completion: the request's index in the set, its outcome and its buffer.
#[derive(Debug)]
pub struct Completion<'s, T> {
    /// The index [`RequestSet`]'s method returned when the request joined.
    pub index: usize,
    /// The status, or the error the request failed with.
    pub result: Result<Status>,
    /// The request's buffer, handed back.
    pub data: Done<'s, T>,
}

/// A receive buffer the set holds while its request runs: a raw pointer (the only handle to
/// the memory while the engine may write it), turned back into `&'s mut [T]` on completion.
struct RecvBuf<'s, T> {
    ptr: *mut T,
    len: usize,
    _b: PhantomData<&'s mut [T]>,
}

enum Slot<'s, T: Pod> {
    Send(Request<'s>, &'s [T]),
    Recv(Request<'s>, RecvBuf<'s, T>),
    Vec(VecRequest<T>),
    Other(Request<'s>),
    /// Reported (or never filled).
    Taken,
}

/// Requests of one scope, each kept at its index until it is reported complete. See the
/// [module docs](crate::reqset).
pub struct RequestSet<'s, T: Pod> {
    slots: Vec<Slot<'s, T>>,
    pending: usize,
}

impl<T: Pod> std::fmt::Debug for RequestSet<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RequestSet").field("len", &self.slots.len()).field("pending", &self.pending).finish()
    }
}

impl<T: Pod> Default for RequestSet<'_, T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<'s, T: Pod> RequestSet<'s, T> {
    /// An empty set.
    pub fn new() -> Self {
        RequestSet { slots: Vec::new(), pending: 0 }
    }

    /// Requests ever added (the next index).
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// Whether no request was ever added.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// Requests not yet reported complete.
    pub fn pending(&self) -> usize {
        self.pending
    }

    fn push(&mut self, s: Slot<'s, T>) -> usize {
        self.slots.push(s);
        self.pending += 1;
        self.slots.len() - 1
    }

    /// Starts [`Comm::isend`] of `buf` in the set; returns its index.
    ///
    /// # Errors
    /// As [`Comm::isend`] (nothing joins the set then).
    pub fn isend(&mut self, comm: &Comm, s: &'s Scope<'s, '_>, buf: &'s [T], dest: Rank, tag: Tag) -> Result<usize> {
        let r = comm.isend(s, buf, dest, tag)?;
        Ok(self.push(Slot::Send(r, buf)))
    }

    /// Starts [`Comm::issend`] of `buf` in the set; returns its index.
    ///
    /// # Errors
    /// As [`Comm::issend`].
    pub fn issend(&mut self, comm: &Comm, s: &'s Scope<'s, '_>, buf: &'s [T], dest: Rank, tag: Tag) -> Result<usize> {
        let r = comm.issend(s, buf, dest, tag)?;
        Ok(self.push(Slot::Send(r, buf)))
    }

    /// Posts [`Comm::irecv`] into `buf` in the set; returns its index. The completion hands
    /// `buf` back.
    ///
    /// # Errors
    /// As [`Comm::irecv`].
    pub fn irecv(
        &mut self,
        comm: &Comm,
        s: &'s Scope<'s, '_>,
        buf: &'s mut [T],
        src: impl Into<Source>,
        tag: impl Into<TagMatch>,
    ) -> Result<usize> {
        let (ptr, len) = (buf.as_mut_ptr(), buf.len());
        // SAFETY: `buf` is given up here (the set keeps only `ptr`), so the slice made from the
        // same pointer is the one handle the engine writes through; the set rebuilds
        // `&'s mut [T]` from `ptr` only after the request completed, when the engine no longer
        // touches it. If the set is dropped or leaked first, the memory stays borrowed for 's
        // and the scope's end settles the request before 's ends.
        let lent: &'s mut [T] = unsafe { std::slice::from_raw_parts_mut(ptr, len) };
        let r = comm.irecv(s, lent, src, tag)?;
        Ok(self.push(Slot::Recv(r, RecvBuf { ptr, len, _b: PhantomData })))
    }

    /// Posts [`Comm::irecv_vec`] in the set; returns its index. The completion hands the
    /// message back as a `Vec<T>`.
    ///
    /// # Errors
    /// As [`Comm::irecv_vec`].
    pub fn irecv_vec(&mut self, comm: &Comm, src: impl Into<Source>, tag: impl Into<TagMatch>) -> Result<usize> {
        let r = comm.irecv_vec(src, tag)?;
        Ok(self.push(Slot::Vec(r)))
    }

    /// Adds any request of the scope (a collective's, say); its completion carries
    /// [`Done::Other`].
    pub fn add(&mut self, req: Request<'s>) -> usize {
        self.push(Slot::Other(req))
    }

    /// Cancels the request at `index` if it is a receive that has not matched (it then
    /// completes with a cancelled status); no effect otherwise.
    ///
    /// # Errors
    /// As [`Request::cancel`].
    pub fn cancel(&mut self, index: usize) -> Result<()> {
        match self.slots.get_mut(index) {
            Some(Slot::Recv(r, _) | Slot::Send(r, _) | Slot::Other(r)) => r.cancel(),
            Some(Slot::Vec(v)) => v.cancel(),
            _ => Ok(()),
        }
    }

    /// Tests the request at `i`; its completion if it is done.
    fn poll(&mut self, i: usize) -> Result<Option<Completion<'s, T>>> {
        let result = match &mut self.slots[i] {
            Slot::Taken => return Ok(None),
            Slot::Send(r, _) | Slot::Recv(r, _) | Slot::Other(r) => match r.test() {
                Ok(None) => return Ok(None),
                Ok(Some(st)) => Ok(st),
                Err(e) => Err(e),
            },
            Slot::Vec(v) => match v.test() {
                Ok(None) => return Ok(None),
                Ok(Some((vec, st))) => {
                    self.slots[i] = Slot::Taken;
                    self.pending -= 1;
                    return Ok(Some(Completion { index: i, result: Ok(st), data: Done::Vec(vec) }));
                }
                Err(e) => Err(e),
            },
        };
        Ok(Some(self.take(i, result)))
    }

    /// Reports the request at `i` with `result`, collecting it.
    fn take(&mut self, i: usize, result: Result<Status>) -> Completion<'s, T> {
        self.pending -= 1;
        let data = match std::mem::replace(&mut self.slots[i], Slot::Taken) {
            Slot::Send(r, b) => {
                drop(r);
                Done::Sent(b)
            }
            Slot::Recv(r, b) => {
                drop(r);
                // SAFETY: the request completed (`test` reported it), so the engine no longer
                // writes the memory; `ptr`/`len` came from a `&'s mut [T]` given up to the set.
                Done::Received(unsafe { std::slice::from_raw_parts_mut(b.ptr, b.len) })
            }
            Slot::Vec(_) => Done::Vec(Vec::new()),
            Slot::Other(_) | Slot::Taken => Done::Other,
        };
        Completion { index: i, result, data }
    }

    /// A completed request if one is done now; `None` when none is (or none is pending).
    ///
    /// # Errors
    /// A failure to make progress (the engine's lock); a request's own failure is its
    /// completion's `result`.
    pub fn test_any(&mut self) -> Result<Option<Completion<'s, T>>> {
        for i in 0..self.slots.len() {
            if let Some(c) = self.poll(i)? {
                return Ok(Some(c));
            }
        }
        Ok(None)
    }

    /// Every request done now (possibly none).
    ///
    /// # Errors
    /// As [`RequestSet::test_any`].
    pub fn test_some(&mut self) -> Result<Vec<Completion<'s, T>>> {
        let mut out = Vec::new();
        for i in 0..self.slots.len() {
            if let Some(c) = self.poll(i)? {
                out.push(c);
            }
        }
        Ok(out)
    }

    /// Waits for one request; `None` once every request has been reported.
    ///
    /// # Errors
    /// As [`RequestSet::test_any`].
    pub fn wait_any(&mut self) -> Result<Option<Completion<'s, T>>> {
        let mut spins = 0u32;
        while self.pending > 0 {
            if let Some(c) = self.test_any()? {
                return Ok(Some(c));
            }
            spins = spins.wrapping_add(1);
            if spins % 64 == 0 {
                std::thread::yield_now();
            }
        }
        Ok(None)
    }

    /// Waits until at least one request completes; returns every one done by then (empty
    /// once none is pending).
    ///
    /// # Errors
    /// As [`RequestSet::test_any`].
    pub fn wait_some(&mut self) -> Result<Vec<Completion<'s, T>>> {
        let mut spins = 0u32;
        while self.pending > 0 {
            let got = self.test_some()?;
            if !got.is_empty() {
                return Ok(got);
            }
            spins = spins.wrapping_add(1);
            if spins % 64 == 0 {
                std::thread::yield_now();
            }
        }
        Ok(Vec::new())
    }

    /// Waits for every pending request; returns them in index order.
    ///
    /// # Errors
    /// As [`RequestSet::test_any`].
    pub fn wait_all(&mut self) -> Result<Vec<Completion<'s, T>>> {
        let mut out = Vec::with_capacity(self.pending);
        for i in 0..self.slots.len() {
            let result = match &mut self.slots[i] {
                Slot::Taken => continue,
                Slot::Send(r, _) | Slot::Recv(r, _) | Slot::Other(r) => wait_in_place(r),
                Slot::Vec(v) => {
                    let mut got = None;
                    while got.is_none() {
                        match v.test() {
                            Ok(g) => got = g,
                            Err(e) => {
                                out.push(self.take(i, Err(e)));
                                break;
                            }
                        }
                    }
                    if let Some((vec, st)) = got {
                        self.slots[i] = Slot::Taken;
                        self.pending -= 1;
                        out.push(Completion { index: i, result: Ok(st), data: Done::Vec(vec) });
                    }
                    continue;
                }
            };
            out.push(self.take(i, result));
        }
        Ok(out)
    }
}

/// Waits for a request kept in place (its slot is emptied right after).
fn wait_in_place(r: &mut Request<'_>) -> Result<Status> {
    loop {
        match r.test() {
            Ok(Some(st)) => return Ok(st),
            Ok(None) => std::thread::yield_now(),
            Err(e) => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Receives from every rank and vectors join one set; each completion names its index,
    /// hands back its own buffer, and a cancelled receive completes as cancelled.
    #[test]
    fn completions_carry_index_status_and_buffer() {
        let out = crate::run_local(3, |w| {
            let (me, n) = (w.rank(), w.size());
            let mut bufs = vec![[0u32; 3]; n];
            let mut never = [0u32; 1];
            let msg = [me as u32, 7, 9];
            crate::scope(|s| {
                let mut set = RequestSet::new();
                for (src, b) in bufs.iter_mut().enumerate() {
                    assert_eq!(set.irecv(&w, s, b, src, 4).unwrap(), src);
                }
                let cancelled = set.irecv(&w, s, &mut never, me, 99).unwrap();
                let vec_at = set.irecv_vec(&w, crate::ANY_SOURCE, 5).unwrap();
                for d in 0..n {
                    set.isend(&w, s, &msg, d, 4).unwrap();
                }
                set.isend(&w, s, &msg[..1], (me + 1) % n, 5).unwrap();
                set.cancel(cancelled).unwrap();
                let mut seen = vec![false; set.len()];
                while let Some(c) = set.wait_any().unwrap() {
                    assert!(!std::mem::replace(&mut seen[c.index], true), "index {} reported twice", c.index);
                    match c.data {
                        Done::Received(b) if c.index < n => assert_eq!((b[0] as usize, c.result.unwrap().source()), (c.index, c.index)),
                        Done::Received(_) => assert!(c.index == cancelled && c.result.unwrap().cancelled()),
                        Done::Vec(v) => assert_eq!((c.index, v), (vec_at, vec![((me + n - 1) % n) as u32])),
                        Done::Sent(b) => assert_eq!(b[0], me as u32),
                        Done::Other => panic!("no request was added bare"),
                    }
                }
                seen.iter().all(|&s| s) && set.pending() == 0
            })
        });
        assert_eq!(out, vec![true; 3]);
    }

    /// `wait_all` returns every request in index order, with its buffer.
    #[test]
    fn wait_all_in_index_order() {
        let out = crate::run_local(2, |w| {
            let peer = 1 - w.rank();
            let mut a = [0u8; 2];
            let b = [w.rank() as u8, 1];
            crate::scope(|s| {
                let mut set = RequestSet::new();
                set.irecv(&w, s, &mut a, peer, 0).unwrap();
                set.isend(&w, s, &b, peer, 0).unwrap();
                let all = set.wait_all().unwrap();
                let idx: Vec<usize> = all.iter().map(|c| c.index).collect();
                let got = match &all[0].data {
                    Done::Received(x) => x.to_vec(),
                    _ => Vec::new(),
                };
                (idx, got)
            })
        });
        assert_eq!(out[0], (vec![0, 1], vec![1, 1]));
        assert_eq!(out[1], (vec![0, 1], vec![0, 1]));
    }
}
