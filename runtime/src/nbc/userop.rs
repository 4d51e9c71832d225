//! Reductions with a user-defined operator ([`UserOp`]), blocking and non-blocking. They run
//! on the same schedules as the non-blocking collectives (the blocking forms start one and
//! wait for it), so every one of them combines in rank order, lower ranks on the left.

use bytemuck::Pod;

use crate::coll::plan::ReduceFn;
use crate::coll::typed;
use crate::comm::Comm;
use crate::error::Result;
use crate::nbc::Reduction;
use crate::op::UserOp;
use crate::request::{scope, Request, Scope};
use crate::seen::{self, Kind, What};
use crate::Rank;

fn user<T: Pod>(op: &UserOp<T>) -> ReduceFn {
    let op = op.clone();
    Box::new(move |from: &[u8], acc: &mut [u8], left: bool| typed::<T>(from, acc, &|f, a| op.combine(a, f, left)))
}

/// Reductions with a [`UserOp`]: the same calls as with an [`crate::Op`], on any `Pod` type.
impl Comm {
    /// [`Comm::reduce`] with a user operator, in rank order.
    ///
    /// ```
    /// // "Last rank wins": not commutative.
    /// let last = tmpi::UserOp::new(false, |_a: &u8, b: &u8| *b);
    /// let got = tmpi::run_local(3, |w| {
    ///     let mut x = [0u8];
    ///     w.reduce_with(&[w.rank() as u8 + 1], (w.rank() == 0).then_some(&mut x[..]), &last, 0).unwrap();
    ///     x[0]
    /// });
    /// assert_eq!(got[0], 3);
    /// ```
    ///
    /// # Errors
    /// As [`Comm::ireduce`].
    pub fn reduce_with<T: Pod>(&self, send: &[T], recv: Option<&mut [T]>, op: &UserOp<T>, root: Rank) -> Result<()> {
        if seen::on() {
            return seen::call(What::new(Kind::Reduce).to(self, root).bytes(size_of_val(send)), || self.reduce_with(send, recv, op, root));
        }
        scope(|s| self.ireduce_f(s, send, recv, Reduction { f: user(op), ok: Ok(()), commutative: op.is_commutative() }, root)?.wait())
            .map(drop)
    }

    /// [`Comm::allreduce`] with a user operator, in rank order (the same result everywhere).
    /// See [`UserOp`] for an example.
    ///
    /// # Errors
    /// As [`Comm::iallreduce`].
    pub fn allreduce_with<T: Pod>(&self, send: &[T], recv: &mut [T], op: &UserOp<T>) -> Result<()> {
        if seen::on() {
            return seen::call(What::new(Kind::Allreduce).on(self).bytes(size_of_val(send)), || self.allreduce_with(send, recv, op));
        }
        scope(|s| self.iallreduce_f(s, send, recv, Reduction { f: user(op), ok: Ok(()), commutative: op.is_commutative() })?.wait())
            .map(drop)
    }

    /// [`Comm::reduce_scatter`] with a user operator.
    ///
    /// ```
    /// let or = tmpi::UserOp::new(true, |a: &[u8; 2], b: &[u8; 2]| [a[0] | b[0], a[1] | b[1]]);
    /// let got = tmpi::run_local(2, |w| {
    ///     let bit = 1u8 << w.rank();
    ///     let mut mine = [[0u8; 2]];
    ///     w.reduce_scatter_with(&[[bit, 0], [0, bit]], &mut mine, &[1, 1], &or).unwrap();
    ///     mine[0]
    /// });
    /// assert_eq!(got, vec![[3, 0], [0, 3]]);
    /// ```
    ///
    /// # Errors
    /// As [`Comm::ireduce_scatter`].
    pub fn reduce_scatter_with<T: Pod>(&self, send: &[T], recv: &mut [T], counts: &[usize], op: &UserOp<T>) -> Result<()> {
        if seen::on() {
            return seen::call(What::new(Kind::ReduceScatter).on(self).bytes(size_of_val(send)), || {
                self.reduce_scatter_with(send, recv, counts, op)
            });
        }
        scope(|s| {
            self.ireduce_scatter_f(s, send, recv, counts, Reduction { f: user(op), ok: Ok(()), commutative: op.is_commutative() })?.wait()
        })
        .map(drop)
    }

    /// [`Comm::scan`] with a user operator: rank `r` gets `send` of ranks `0..=r` combined in
    /// rank order.
    ///
    /// ```
    /// // Compose affine maps x -> a x + b (not commutative): rank r holds (a, b).
    /// let compose = tmpi::UserOp::new(false, |f: &[i64; 2], g: &[i64; 2]| [g[0] * f[0], g[0] * f[1] + g[1]]);
    /// let got = tmpi::run_local(3, |w| {
    ///     let mut acc = [[0i64; 2]];
    ///     w.scan_with(&[[2, w.rank() as i64]], &mut acc, &compose).unwrap();
    ///     acc[0]
    /// });
    /// assert_eq!(got, vec![[2, 0], [4, 1], [8, 4]]);
    /// ```
    ///
    /// # Errors
    /// As [`Comm::iscan`].
    pub fn scan_with<T: Pod>(&self, send: &[T], recv: &mut [T], op: &UserOp<T>) -> Result<()> {
        if seen::on() {
            return seen::call(What::new(Kind::Scan).on(self).bytes(size_of_val(send)), || self.scan_with(send, recv, op));
        }
        scope(|s| self.iprefix("scan_with", s, send, recv, user(op), Ok(()), true)?.wait()).map(drop)
    }

    /// [`Comm::exscan`] with a user operator (rank 0's `recv` unchanged).
    ///
    /// # Errors
    /// As [`Comm::iscan`].
    pub fn exscan_with<T: Pod>(&self, send: &[T], recv: &mut [T], op: &UserOp<T>) -> Result<()> {
        if seen::on() {
            return seen::call(What::new(Kind::Exscan).on(self).bytes(size_of_val(send)), || self.exscan_with(send, recv, op));
        }
        scope(|s| self.iprefix("exscan_with", s, send, recv, user(op), Ok(()), false)?.wait()).map(drop)
    }

    /// Non-blocking [`Comm::reduce_with`].
    ///
    /// # Errors
    /// As [`Comm::ireduce`].
    pub fn ireduce_with<'s, T: Pod>(
        &self,
        s: &'s Scope<'s, '_>,
        send: &'s [T],
        recv: Option<&'s mut [T]>,
        op: &UserOp<T>,
        root: Rank,
    ) -> Result<Request<'s>> {
        if seen::on() {
            return seen::call(What::new(Kind::Ireduce).to(self, root).bytes(size_of_val(send)), || {
                self.ireduce_with(s, send, recv, op, root)
            });
        }
        self.ireduce_f(s, send, recv, Reduction { f: user(op), ok: Ok(()), commutative: op.is_commutative() }, root)
    }

    /// Non-blocking [`Comm::allreduce_with`].
    ///
    /// ```
    /// use tmpi::{Loc, UserOp};
    /// let got = tmpi::run_local(3, |w| {
    ///     let me = [Loc { value: (w.rank() as i32 - 1).abs(), index: w.rank() as i32 }];
    ///     let mut m = [Loc { value: 0, index: 0 }];
    ///     tmpi::scope(|s| w.iallreduce_with(s, &me, &mut m, &UserOp::max_loc()).unwrap().wait().unwrap());
    ///     m[0]
    /// });
    /// assert!(got.iter().all(|m| *m == Loc { value: 1, index: 0 }));
    /// ```
    ///
    /// # Errors
    /// As [`Comm::iallreduce`].
    pub fn iallreduce_with<'s, T: Pod>(
        &self,
        s: &'s Scope<'s, '_>,
        send: &'s [T],
        recv: &'s mut [T],
        op: &UserOp<T>,
    ) -> Result<Request<'s>> {
        if seen::on() {
            return seen::call(What::new(Kind::Iallreduce).on(self).bytes(size_of_val(send)), || self.iallreduce_with(s, send, recv, op));
        }
        self.iallreduce_f(s, send, recv, Reduction { f: user(op), ok: Ok(()), commutative: op.is_commutative() })
    }

    /// Non-blocking [`Comm::reduce_scatter_with`].
    ///
    /// # Errors
    /// As [`Comm::ireduce_scatter`].
    pub fn ireduce_scatter_with<'s, T: Pod>(
        &self,
        s: &'s Scope<'s, '_>,
        send: &'s [T],
        recv: &'s mut [T],
        counts: &[usize],
        op: &UserOp<T>,
    ) -> Result<Request<'s>> {
        if seen::on() {
            return seen::call(What::new(Kind::IreduceScatter).on(self).bytes(size_of_val(send)), || {
                self.ireduce_scatter_with(s, send, recv, counts, op)
            });
        }
        self.ireduce_scatter_f(s, send, recv, counts, Reduction { f: user(op), ok: Ok(()), commutative: op.is_commutative() })
    }

    /// Non-blocking [`Comm::scan_with`].
    ///
    /// # Errors
    /// As [`Comm::iscan`].
    pub fn iscan_with<'s, T: Pod>(&self, s: &'s Scope<'s, '_>, send: &'s [T], recv: &'s mut [T], op: &UserOp<T>) -> Result<Request<'s>> {
        if seen::on() {
            return seen::call(What::new(Kind::Iscan).on(self).bytes(size_of_val(send)), || self.iscan_with(s, send, recv, op));
        }
        self.iprefix("iscan_with", s, send, recv, user(op), Ok(()), true)
    }

    /// Non-blocking [`Comm::exscan_with`].
    ///
    /// # Errors
    /// As [`Comm::iscan`].
    pub fn iexscan_with<'s, T: Pod>(&self, s: &'s Scope<'s, '_>, send: &'s [T], recv: &'s mut [T], op: &UserOp<T>) -> Result<Request<'s>> {
        if seen::on() {
            return seen::call(What::new(Kind::Iexscan).on(self).bytes(size_of_val(send)), || self.iexscan_with(s, send, recv, op));
        }
        self.iprefix("iexscan_with", s, send, recv, user(op), Ok(()), false)
    }
}
