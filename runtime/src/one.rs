//! One value as a buffer: `send_one(&x, ..)`, `recv_one(&mut x, ..)` and their non-blocking
//! and collective kin, so that a program sends a count or reduces a scalar without
//! `std::slice::from_ref`/`from_mut`.
//!
//! Why separate calls, not `send(&x, ..)`: `send` takes `&[T]`, and Rust turns a `&Vec<T>`,
//! a `&[T; N]`, a `&Box<[T]>`, a `&SharedBuf<T>` or a reference to any type of the program's
//! that derefs to `[T]` into that slice at the call. A parameter generic over a buffer trait
//! (needed to take `&u64` as well) gets no such conversion, so every call that passes a type
//! of its own that derefs to a slice would stop compiling (two of this repository's test
//! programs do), and a blanket impl for "whatever derefs to `[T]`" cannot sit beside one
//! for single values (Rust's coherence rules). The contract's `send(&[T])` stays as it is.
//!
//! Each call is its slice form on a one-element slice: the same matching, errors and
//! statuses (`recv_one` of a longer message is [`Error::Truncated`](crate::Error::Truncated);
//! of an empty one leaves `x` as it was, with a status of length 0).
//!
//! ```
//! let got = tmpi::run_local(3, |w| {
//!     let mut n = 0u64;
//!     if w.rank() == 0 {
//!         n = 42;
//!     }
//!     w.bcast_one(&mut n, 0).unwrap();
//!     let total = w.allreduce_one(w.rank() as u64, tmpi::Op::Sum).unwrap();
//!     (n, total)
//! });
//! assert_eq!(got, vec![(42, 3); 3]);
//! ```

use bytemuck::Pod;

use crate::comm::{Comm, Source, Status, TagMatch};
use crate::error::Result;
use crate::op::{Op, Reducible};
use crate::request::{Request, Scope};
use crate::{Rank, Tag};

impl Comm {
    /// Sends the one value `x` (as [`Comm::send`] of `[x]`).
    ///
    /// # Errors
    /// As [`Comm::send`].
    pub fn send_one<T: Pod>(&self, x: &T, dest: Rank, tag: Tag) -> Result<()> {
        self.send(std::slice::from_ref(x), dest, tag)
    }

    /// Sends the one value `x` in synchronous mode (as [`Comm::ssend`]).
    ///
    /// # Errors
    /// As [`Comm::ssend`].
    pub fn ssend_one<T: Pod>(&self, x: &T, dest: Rank, tag: Tag) -> Result<()> {
        self.ssend(std::slice::from_ref(x), dest, tag)
    }

    /// Receives one value into `x` (as [`Comm::recv`] into `[x]`).
    ///
    /// # Errors
    /// As [`Comm::recv`]: [`crate::Error::Truncated`] for a message of more than one `T`.
    pub fn recv_one<T: Pod>(&self, x: &mut T, src: impl Into<Source>, tag: impl Into<TagMatch>) -> Result<Status> {
        self.recv(std::slice::from_mut(x), src, tag)
    }

    /// Starts sending the one value `x`, borrowed until the scope ends (as [`Comm::isend`]).
    ///
    /// # Errors
    /// As [`Comm::isend`].
    pub fn isend_one<'scope, T: Pod>(&self, s: &'scope Scope<'scope, '_>, x: &'scope T, dest: Rank, tag: Tag) -> Result<Request<'scope>> {
        self.isend(s, std::slice::from_ref(x), dest, tag)
    }

    /// Posts a receive of one value into `x`, borrowed until the scope ends (as
    /// [`Comm::irecv`]).
    ///
    /// # Errors
    /// As [`Comm::irecv`].
    pub fn irecv_one<'scope, T: Pod>(
        &self,
        s: &'scope Scope<'scope, '_>,
        x: &'scope mut T,
        src: impl Into<Source>,
        tag: impl Into<TagMatch>,
    ) -> Result<Request<'scope>> {
        self.irecv(s, std::slice::from_mut(x), src, tag)
    }

    /// Broadcasts the one value `x` from `root` (as [`Comm::bcast`]).
    ///
    /// # Errors
    /// As [`Comm::bcast`].
    pub fn bcast_one<T: Pod>(&self, x: &mut T, root: Rank) -> Result<()> {
        self.bcast(std::slice::from_mut(x), root)
    }

    /// Combines every rank's `x` with `op` and returns the result on every rank (as
    /// [`Comm::allreduce`]).
    ///
    /// # Errors
    /// As [`Comm::allreduce`].
    pub fn allreduce_one<T: Pod + Reducible>(&self, x: T, op: Op) -> Result<T> {
        let mut out = [x];
        self.allreduce(&[x], &mut out, op)?;
        Ok(out[0])
    }

    /// Combines every rank's `x` with `op` at `root`: `Some(result)` there, `None` elsewhere
    /// (as [`Comm::reduce`]).
    ///
    /// # Errors
    /// As [`Comm::reduce`].
    pub fn reduce_one<T: Pod + Reducible>(&self, x: T, op: Op, root: Rank) -> Result<Option<T>> {
        let mut out = [x];
        let at_root = self.rank() == root;
        self.reduce(&[x], at_root.then_some(&mut out[..]), op, root)?;
        Ok(at_root.then_some(out[0]))
    }
}

#[cfg(test)]
mod tests {
    use crate::{Error, Op};

    /// Point-to-point with single values, blocking and not, and what a one-value receive does
    /// with a longer and an empty message.
    #[test]
    fn one_value_point_to_point() {
        let got = crate::run_local(2, |w| {
            let peer = 1 - w.rank();
            let mut x = 0u32;
            let mut y = 0.0f64;
            if w.rank() == 0 {
                w.send_one(&7u32, peer, 1).unwrap();
                w.ssend_one(&2.5f64, peer, 2).unwrap();
                w.send(&[1u32, 2], peer, 3).unwrap();
                w.send::<u32>(&[], peer, 4).unwrap();
            } else {
                w.recv_one(&mut x, peer, 1).unwrap();
                w.recv_one(&mut y, peer, 2).unwrap();
                let long = w.recv_one(&mut 0u32, peer, 3);
                assert!(matches!(long, Err(Error::Truncated { .. })), "{long:?}");
                let mut z = 9u32;
                let st = w.recv_one(&mut z, peer, 4).unwrap();
                assert_eq!((st.len(), z), (0, 9));
            }
            let (mut back, mine) = (0u64, w.rank() as u64 + 10);
            crate::scope(|s| {
                let r = w.irecv_one(s, &mut back, peer, 5).unwrap();
                w.isend_one(s, &mine, peer, 5).unwrap().wait().unwrap();
                r.wait().unwrap();
            });
            (x, y, back)
        });
        assert_eq!(got, vec![(0, 0.0, 11), (7, 2.5, 10)]);
    }

    /// `reduce_one` gives the result at the root alone.
    #[test]
    fn reduce_one_at_the_root() {
        let got = crate::run_local(3, |w| w.reduce_one(w.rank() as i32 + 1, Op::Prod, 2).unwrap());
        assert_eq!(got, vec![None, None, Some(6)]);
    }
}
