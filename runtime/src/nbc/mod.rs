//! Non-blocking collectives: `ibarrier`, `ibcast`, `ireduce`, `iallreduce`, `igather(v)`,
//! `iscatter(v)`, `iallgather(v)`, `ialltoall(v)`, `ireduce_scatter(_block)`, `iscan`,
//! `iexscan`.
//!
//! Each returns a [`Request`] of a [`Scope`], exactly like [`Comm::isend`]: its buffers stay
//! borrowed until the scope ends, [`Request::wait`], [`Request::test`], [`crate::wait_all`]
//! and [`crate::wait_any`] work on it, and the scope finishes (or, when it unwinds, abandons)
//! it. A collective progresses whenever the engine is driven: any wait or test, any blocking
//! call, on any communicator. Several may be in flight at once on one communicator, and they
//! mix with point-to-point and blocking collectives: every rank must start the collectives of
//! a communicator (blocking or not) in the same order, as in MPI; each call's messages carry
//! its sequence number, so they never match another call's.
//!
//! ```
//! let got = tmpi::run_local(4, |w| {
//!     let mine = [w.rank() as u64 + 1];
//!     let (mut sum, mut all) = ([0u64], vec![0u64; 4]);
//!     tmpi::scope(|s| {
//!         let r1 = w.iallreduce(s, &mine, &mut sum, tmpi::Op::Sum).unwrap();
//!         let r2 = w.iallgather(s, &mine, &mut all).unwrap();
//!         // ... overlap computation or point-to-point here ...
//!         tmpi::wait_all(vec![r1, r2]).unwrap();
//!     });
//!     (sum[0], all)
//! });
//! assert!(got.iter().all(|(s, a)| *s == 10 && a == &[1, 2, 3, 4]));
//! ```
//!
//! # How they run
//!
//! A collective is a schedule built when it starts (rounds of sends, receives and local
//! copies or reductions, see `sched`), which the engine advances in each round of progress
//! while any is in flight (nothing is checked when none is). The algorithms are the simple,
//! order-preserving ones: a dissemination barrier, binomial trees for broadcast and for
//! reduction to rank 0 (lower ranks always the left operand, so a non-commutative operator is
//! applied in rank order, and every rank of an allreduce gets bitwise the same result), linear
//! gathers, scatters and exchanges, and a chain for scans.
//!
//! # Errors
//!
//! Arguments are checked when the call starts ([`Error::InvalidRoot`],
//! [`Error::InvalidBuffer`], [`Error::InvalidOp`]); the call then returns the error at once and
//! takes no part in the collective (as in MPI, the other ranks' parts of an erroneous call may
//! not complete). Lengths that differ between ranks, and departed ranks
//! ([`Error::PeerGone`]), are reported when the request completes.

mod sched;
mod userop;

use bytemuck::Pod;

pub(crate) use sched::Sched;
use sched::{Action, Buf, Members, Plan, ReduceFn, Span};

use crate::buffer::{RawBuf, RawBufMut};
use crate::coll::vcoll::check_layout;
use crate::coll_glue::CollCtx;
use crate::comm::Comm;
use crate::error::{Error, Result};
use crate::op::{check_op, Op, Reducible};
use crate::request::{Request, Scope};
use crate::seen::{self, Kind, What};
use crate::Rank;

/// Tags of the schedules' phases (8 bits; the call's sequence number is above them).
mod tags {
    pub(super) const BARRIER: u32 = 1;
    pub(super) const BCAST: u32 = 2;
    pub(super) const REDUCE: u32 = 3;
    pub(super) const TO_ROOT: u32 = 4;
    pub(super) const GATHER: u32 = 5;
    pub(super) const SCATTER: u32 = 6;
    pub(super) const ALLGATHER: u32 = 7;
    pub(super) const ALLTOALL: u32 = 8;
    pub(super) const SCAN: u32 = 9;
}

fn out(off: usize, len: usize) -> Span {
    Span::new(Buf::Out, off, len)
}

fn inp(off: usize, len: usize) -> Span {
    Span::new(Buf::In, off, len)
}

/// A combining step on typed slices: `(from, acc)`.
type Combine<'a, T> = dyn Fn(&[T], &mut [T]) -> Result<()> + 'a;

/// `acc = from op acc` or `acc op from` on byte views of `T` elements; unaligned views (user
/// buffers are aligned, scratch is 16-byte aligned) are combined through aligned copies.
fn typed<T: Pod>(from: &[u8], acc: &mut [u8], f: &Combine<'_, T>) -> Result<()> {
    if let (Ok(a), true) = (bytemuck::try_cast_slice::<u8, T>(from), bytemuck::try_cast_slice::<u8, T>(acc).is_ok()) {
        if let Ok(b) = bytemuck::try_cast_slice_mut::<u8, T>(acc) {
            return f(a, b);
        }
    }
    let copy = |bytes: &[u8]| -> Vec<T> {
        let mut v = vec![T::zeroed(); bytes.len() / std::mem::size_of::<T>().max(1)];
        let vb: &mut [u8] = bytemuck::cast_slice_mut(&mut v);
        let n = vb.len().min(bytes.len());
        vb[..n].copy_from_slice(&bytes[..n]);
        v
    };
    let (a, mut b) = (copy(from), copy(acc));
    f(&a, &mut b)?;
    let bb: &[u8] = bytemuck::cast_slice(&b);
    let n = bb.len().min(acc.len());
    acc[..n].copy_from_slice(&bb[..n]);
    Ok(())
}

/// The reduction step of a predefined operator.
fn builtin<T: Reducible>(op: Op) -> ReduceFn {
    Box::new(move |from: &[u8], acc: &mut [u8], left: bool| {
        typed::<T>(from, acc, &|f, a| if left { T::reduce_into_from_left(op, f, a) } else { T::reduce_into(op, a, f) })
    })
}

// ---- plans -------------------------------------------------------------------------------

/// Dissemination barrier: round `k` sends to `rank + 2^k` and receives from `rank - 2^k`.
fn plan_barrier(p: &mut Plan, r: usize, n: usize) {
    let mut d = 1;
    while d < n {
        p.round(vec![
            Action::Send { s: Span::empty(), dest: (r + d) % n, tag: tags::BARRIER },
            Action::Recv { s: Span::empty(), src: (r + n - d) % n, tag: tags::BARRIER },
        ]);
        d <<= 1;
    }
}

/// Binomial broadcast of `buf` from `root`: receive from the parent, then send to the children.
fn plan_bcast(p: &mut Plan, r: usize, n: usize, buf: Span, root: usize) {
    let vr = (r + n - root) % n;
    let abs = |v: usize| (v + root) % n;
    let mut mask = 1;
    while mask < n {
        if vr & mask != 0 {
            p.round(vec![Action::Recv { s: buf, src: abs(vr - mask), tag: tags::BCAST }]);
            break;
        }
        mask <<= 1;
    }
    let mut sends = Vec::new();
    mask >>= 1;
    while mask > 0 {
        if vr + mask < n {
            sends.push(Action::Send { s: buf, dest: abs(vr + mask), tag: tags::BCAST });
        }
        mask >>= 1;
    }
    p.round(sends);
}

/// Binomial reduction of `input` (`len` bytes) to rank 0 in rank order: rank `r` holds the
/// result of ranks `r..r + 2^k` after step `k` and is always the left operand. Returns the
/// span holding the result at rank 0 (`None` elsewhere).
fn plan_reduce0(p: &mut Plan, r: usize, n: usize, input: Span, len: usize) -> Option<Span> {
    let acc = p.temp(len);
    let tmp = p.temp(len);
    let mut cur = vec![Action::Copy { from: input, to: acc }];
    let mut combine = false;
    let mut mask = 1;
    while mask < n {
        if combine {
            cur.push(Action::Reduce { from: tmp, acc, left: false });
            combine = false;
        }
        if r & mask != 0 {
            cur.push(Action::Send { s: acc, dest: r - mask, tag: tags::REDUCE });
            p.round(cur);
            return None;
        }
        if r + mask < n {
            cur.push(Action::Recv { s: tmp, src: r + mask, tag: tags::REDUCE });
            combine = true;
            p.round(std::mem::take(&mut cur));
        }
        mask <<= 1;
    }
    if combine {
        cur.push(Action::Reduce { from: tmp, acc, left: false });
    }
    p.round(cur);
    Some(acc)
}

/// Block `i` of a layout, in bytes.
fn block(counts: &[usize], displs: &[usize], i: usize, es: usize) -> (usize, usize) {
    (displs[i] * es, counts[i] * es)
}

impl Comm {
    /// Registers `plan` as a schedule on this communicator's collective context and returns
    /// its request.
    fn start_plan<'s>(
        &self,
        s: &'s Scope<'s, '_>,
        c: &CollCtx<'_>,
        plan: Plan,
        input: Option<&'s [u8]>,
        output: Option<&'s mut [u8]>,
    ) -> Result<Request<'s>> {
        let who = Members { ctx: self.coll_ctx(), rank: self.rank(), size: self.size(), world: self.inner.members.clone(), seq: c.seq() };
        // SAFETY: `input` and `output` are borrowed for 's; the request is registered in the
        // scope (`Request::new`), which finishes or abandons it before 's ends, and
        // abandoning it abandons every transfer of the schedule and drops the schedule, so
        // nothing touches the buffers afterwards.
        let sched = unsafe { Sched::new(plan, who, input.map(|b| RawBuf::new(b)), output.map(|b| RawBufMut::new(b))) };
        let eng = &self.inner.eng;
        let rid = eng.lock()?.start_nbc(sched);
        Ok(Request::new(eng, Some(rid), s))
    }

    /// Non-blocking [`Comm::barrier`]: the request completes once every rank has started it.
    ///
    /// ```
    /// tmpi::run_local(3, |w| {
    ///     tmpi::scope(|s| {
    ///         let mut b = w.ibarrier(s).unwrap();
    ///         while b.test().unwrap().is_none() { /* useful work */ }
    ///     })
    /// });
    /// ```
    ///
    /// # Errors
    /// [`Error::PeerGone`] (from the request).
    pub fn ibarrier<'s>(&self, s: &'s Scope<'s, '_>) -> Result<Request<'s>> {
        if seen::on() {
            return seen::call(What::new(Kind::Ibarrier).on(self), || self.ibarrier(s));
        }
        let c = CollCtx::new(self)?;
        let mut plan = Plan::new();
        plan_barrier(&mut plan, self.rank(), self.size());
        self.start_plan(s, &c, plan, None, None)
    }

    /// Non-blocking [`Comm::bcast`] of `buf` from `root`.
    ///
    /// ```
    /// let got = tmpi::run_local(3, |w| {
    ///     let mut buf = if w.rank() == 2 { [7u32, 8] } else { [0, 0] };
    ///     tmpi::scope(|s| w.ibcast(s, &mut buf, 2).unwrap().wait().unwrap());
    ///     buf
    /// });
    /// assert!(got.iter().all(|b| b == &[7, 8]));
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidRoot`]; from the request, [`Error::Truncated`] or
    /// [`Error::InvalidBuffer`] when ranks pass different lengths, [`Error::PeerGone`].
    pub fn ibcast<'s, T: Pod>(&self, s: &'s Scope<'s, '_>, buf: &'s mut [T], root: Rank) -> Result<Request<'s>> {
        if seen::on() {
            return seen::call(What::new(Kind::Ibcast).to(self, root).bytes(size_of_val(buf)), || self.ibcast(s, buf, root));
        }
        let c = CollCtx::new(self)?;
        check_root(root, self.size())?;
        let bytes: &mut [u8] = bytemuck::cast_slice_mut(buf);
        let mut plan = Plan::new();
        plan_bcast(&mut plan, self.rank(), self.size(), out(0, bytes.len()), root);
        self.start_plan(s, &c, plan, None, Some(bytes))
    }

    /// Non-blocking [`Comm::reduce`]: combines `send` of every rank with `op`, in rank order,
    /// into `recv` at `root` (`None` elsewhere).
    ///
    /// ```
    /// let got = tmpi::run_local(3, |w| {
    ///     let (me, mut m) = ([w.rank() as i32 - 5], [0i32]);
    ///     tmpi::scope(|s| {
    ///         let recv = (w.rank() == 1).then_some(&mut m[..]);
    ///         w.ireduce(s, &me, recv, tmpi::Op::Min, 1).unwrap().wait().unwrap();
    ///     });
    ///     m[0]
    /// });
    /// assert_eq!(got[1], -5);
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidRoot`], [`Error::InvalidOp`]; [`Error::InvalidBuffer`] when `recv` is
    /// missing at the root or has another length than `send`; from the request, mismatched
    /// lengths between ranks, [`Error::PeerGone`].
    pub fn ireduce<'s, T: Pod + Reducible>(
        &self,
        s: &'s Scope<'s, '_>,
        send: &'s [T],
        recv: Option<&'s mut [T]>,
        op: Op,
        root: Rank,
    ) -> Result<Request<'s>> {
        if seen::on() {
            return seen::call(What::new(Kind::Ireduce).to(self, root).bytes(size_of_val(send)), || self.ireduce(s, send, recv, op, root));
        }
        self.ireduce_f(s, send, recv, builtin::<T>(op), check_op::<T>(op), root)
    }

    /// Non-blocking [`Comm::allreduce`]: every rank gets `send` of all ranks combined with `op`
    /// in rank order (bitwise the same result everywhere).
    ///
    /// ```
    /// let got = tmpi::run_local(3, |w| {
    ///     let (me, mut x) = ([1.5, w.rank() as f64], [0.0f64; 2]);
    ///     tmpi::scope(|s| w.iallreduce(s, &me, &mut x, tmpi::Op::Sum).unwrap().wait().unwrap());
    ///     x
    /// });
    /// assert!(got.iter().all(|x| x == &[4.5, 3.0]));
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidOp`]; [`Error::InvalidBuffer`] when `recv.len() != send.len()`; from the
    /// request, mismatched lengths between ranks, [`Error::PeerGone`].
    pub fn iallreduce<'s, T: Pod + Reducible>(
        &self,
        s: &'s Scope<'s, '_>,
        send: &'s [T],
        recv: &'s mut [T],
        op: Op,
    ) -> Result<Request<'s>> {
        if seen::on() {
            return seen::call(What::new(Kind::Iallreduce).on(self).bytes(size_of_val(send)), || self.iallreduce(s, send, recv, op));
        }
        self.iallreduce_f(s, send, recv, builtin::<T>(op), check_op::<T>(op))
    }

    /// Non-blocking [`Comm::gather`]: `send` of every rank, in rank order, into `recv` at
    /// `root` (`None` elsewhere).
    ///
    /// ```
    /// let got = tmpi::run_local(3, |w| {
    ///     let (me, mut all) = ([w.rank() as u8; 2], vec![0u8; 6]);
    ///     tmpi::scope(|s| {
    ///         let recv = (w.rank() == 0).then_some(&mut all[..]);
    ///         w.igather(s, &me, recv, 0).unwrap().wait().unwrap();
    ///     });
    ///     all
    /// });
    /// assert_eq!(got[0], vec![0, 0, 1, 1, 2, 2]);
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidRoot`]; [`Error::InvalidBuffer`] at the root when `recv` is missing or is
    /// not `size * send.len()` long; from the request, mismatched lengths, [`Error::PeerGone`].
    pub fn igather<'s, T: Pod>(&self, s: &'s Scope<'s, '_>, send: &'s [T], recv: Option<&'s mut [T]>, root: Rank) -> Result<Request<'s>> {
        if seen::on() {
            return seen::call(What::new(Kind::Igather).to(self, root).bytes(size_of_val(send)), || self.igather(s, send, recv, root));
        }
        let n = self.size();
        let counts = vec![send.len(); n];
        let displs: Vec<usize> = (0..n).map(|i| i * send.len()).collect();
        if self.rank() == root {
            if let Some(b) = &recv {
                if Some(b.len()) != send.len().checked_mul(n) {
                    CollCtx::new(self)?;
                    return Err(len_err("igather", "receive", b.len(), send.len().saturating_mul(n)));
                }
            }
        }
        self.igatherv_named("igather", s, send, recv, &counts, &displs, root)
    }

    /// Non-blocking [`Comm::gatherv`]: rank `r`'s `send` lands at
    /// `recv[displs[r]..displs[r] + counts[r]]` at `root`. `recv`, `counts` and `displs` are
    /// read at the root only (and copied when the call starts).
    ///
    /// ```
    /// let got = tmpi::run_local(3, |w| {
    ///     let r = w.rank();
    ///     let send = vec![r as u32; r + 1];
    ///     let mut all = vec![0u32; 6];
    ///     tmpi::scope(|s| {
    ///         let recv = (r == 2).then_some(&mut all[..]);
    ///         w.igatherv(s, &send, recv, &[1, 2, 3], &[5, 3, 0], 2).unwrap().wait().unwrap();
    ///     });
    ///     all
    /// });
    /// assert_eq!(got[2], vec![2, 2, 2, 1, 1, 0]);
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidRoot`]; at the root [`Error::InvalidBuffer`] when `recv` is missing, a
    /// block does not fit it, two blocks overlap or the root's count is not `send.len()`; from
    /// the request, a block of another length than its count, [`Error::PeerGone`].
    pub fn igatherv<'s, T: Pod>(
        &self,
        s: &'s Scope<'s, '_>,
        send: &'s [T],
        recv: Option<&'s mut [T]>,
        counts: &[usize],
        displs: &[usize],
        root: Rank,
    ) -> Result<Request<'s>> {
        if seen::on() {
            return seen::call(What::new(Kind::Igatherv).to(self, root).bytes(size_of_val(send)), || {
                self.igatherv(s, send, recv, counts, displs, root)
            });
        }
        self.igatherv_named("igatherv", s, send, recv, counts, displs, root)
    }

    #[allow(clippy::too_many_arguments)]
    fn igatherv_named<'s, T: Pod>(
        &self,
        what: &str,
        s: &'s Scope<'s, '_>,
        send: &'s [T],
        recv: Option<&'s mut [T]>,
        counts: &[usize],
        displs: &[usize],
        root: Rank,
    ) -> Result<Request<'s>> {
        let c = CollCtx::new(self)?;
        let (r, n) = (self.rank(), self.size());
        check_root(root, n)?;
        let es = std::mem::size_of::<T>();
        let sb: &[u8] = bytemuck::cast_slice(send);
        let mut plan = Plan::new();
        let mut output = None;
        if r == root {
            let recv = recv.ok_or_else(|| Error::InvalidBuffer(format!("{what}: the root needs a receive buffer")))?;
            check_layout(what, "receive", counts, displs, n, recv.len(), true)?;
            if counts[r] != send.len() {
                return Err(len_err(what, "own count of the", counts[r], send.len()));
            }
            let mut acts = Vec::with_capacity(n);
            for i in 0..n {
                let (off, len) = block(counts, displs, i, es);
                if i == r {
                    acts.push(Action::Copy { from: inp(0, sb.len()), to: out(off, len) });
                } else {
                    acts.push(Action::Recv { s: out(off, len), src: i, tag: tags::GATHER });
                }
            }
            plan.round(acts);
            output = Some(bytemuck::cast_slice_mut::<T, u8>(recv));
        } else {
            plan.round(vec![Action::Send { s: inp(0, sb.len()), dest: root, tag: tags::GATHER }]);
        }
        self.start_plan(s, &c, plan, Some(sb), output)
    }

    /// Non-blocking [`Comm::scatter`]: consecutive blocks of `send` at `root` (`None`
    /// elsewhere) to every rank's `recv`.
    ///
    /// ```
    /// let got = tmpi::run_local(3, |w| {
    ///     let data: Vec<u16> = (0..6).collect();
    ///     let mut mine = [0u16; 2];
    ///     tmpi::scope(|s| {
    ///         let send = (w.rank() == 0).then_some(&data[..]);
    ///         w.iscatter(s, send, &mut mine, 0).unwrap().wait().unwrap();
    ///     });
    ///     mine
    /// });
    /// assert_eq!(got, vec![[0, 1], [2, 3], [4, 5]]);
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidRoot`]; [`Error::InvalidBuffer`] at the root when `send` is missing or is
    /// not `size * recv.len()` long; from the request, mismatched lengths, [`Error::PeerGone`].
    pub fn iscatter<'s, T: Pod>(&self, s: &'s Scope<'s, '_>, send: Option<&'s [T]>, recv: &'s mut [T], root: Rank) -> Result<Request<'s>> {
        if seen::on() {
            return seen::call(What::new(Kind::Iscatter).to(self, root).bytes(size_of_val(recv)), || self.iscatter(s, send, recv, root));
        }
        let n = self.size();
        let counts = vec![recv.len(); n];
        let displs: Vec<usize> = (0..n).map(|i| i * recv.len()).collect();
        if self.rank() == root {
            if let Some(b) = &send {
                if Some(b.len()) != recv.len().checked_mul(n) {
                    CollCtx::new(self)?;
                    return Err(len_err("iscatter", "send", b.len(), recv.len().saturating_mul(n)));
                }
            }
        }
        self.iscatterv_named("iscatter", s, send, &counts, &displs, recv, root)
    }

    /// Non-blocking [`Comm::scatterv`]: rank `r` receives
    /// `send[displs[r]..displs[r] + counts[r]]` from `root` into `recv`. `send`, `counts` and
    /// `displs` are read at the root only.
    ///
    /// ```
    /// let got = tmpi::run_local(3, |w| {
    ///     let data = [10u8, 11, 12, 13, 14, 15];
    ///     let mut mine = vec![0u8; w.rank() + 1];
    ///     tmpi::scope(|s| {
    ///         let send = (w.rank() == 0).then_some(&data[..]);
    ///         w.iscatterv(s, send, &[1, 2, 3], &[0, 1, 3], &mut mine, 0).unwrap().wait().unwrap();
    ///     });
    ///     mine
    /// });
    /// assert_eq!(got, vec![vec![10], vec![11, 12], vec![13, 14, 15]]);
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidRoot`]; at the root [`Error::InvalidBuffer`] when `send` is missing, a
    /// block does not fit it or the root's count is not `recv.len()`; from the request, a block
    /// of another length than `recv`, [`Error::PeerGone`].
    pub fn iscatterv<'s, T: Pod>(
        &self,
        s: &'s Scope<'s, '_>,
        send: Option<&'s [T]>,
        counts: &[usize],
        displs: &[usize],
        recv: &'s mut [T],
        root: Rank,
    ) -> Result<Request<'s>> {
        if seen::on() {
            return seen::call(What::new(Kind::Iscatterv).to(self, root).bytes(size_of_val(recv)), || {
                self.iscatterv(s, send, counts, displs, recv, root)
            });
        }
        self.iscatterv_named("iscatterv", s, send, counts, displs, recv, root)
    }

    #[allow(clippy::too_many_arguments)]
    fn iscatterv_named<'s, T: Pod>(
        &self,
        what: &str,
        s: &'s Scope<'s, '_>,
        send: Option<&'s [T]>,
        counts: &[usize],
        displs: &[usize],
        recv: &'s mut [T],
        root: Rank,
    ) -> Result<Request<'s>> {
        let c = CollCtx::new(self)?;
        let (r, n) = (self.rank(), self.size());
        check_root(root, n)?;
        let es = std::mem::size_of::<T>();
        let rb: &mut [u8] = bytemuck::cast_slice_mut(recv);
        let mut plan = Plan::new();
        let mut input = None;
        if r == root {
            let send = send.ok_or_else(|| Error::InvalidBuffer(format!("{what}: the root needs a send buffer")))?;
            check_layout(what, "send", counts, displs, n, send.len(), false)?;
            if counts[r] * es != rb.len() {
                return Err(len_err(what, "own count of the", counts[r], rb.len() / es.max(1)));
            }
            let mut acts = Vec::with_capacity(n);
            for i in 0..n {
                let (off, len) = block(counts, displs, i, es);
                if i == r {
                    acts.push(Action::Copy { from: inp(off, len), to: out(0, rb.len()) });
                } else {
                    acts.push(Action::Send { s: inp(off, len), dest: i, tag: tags::SCATTER });
                }
            }
            plan.round(acts);
            input = Some(bytemuck::cast_slice::<T, u8>(send));
        } else {
            plan.round(vec![Action::Recv { s: out(0, rb.len()), src: root, tag: tags::SCATTER }]);
        }
        self.start_plan(s, &c, plan, input, Some(rb))
    }

    /// Non-blocking [`Comm::allgather`]: `send` of every rank, in rank order, into `recv` on
    /// every rank.
    ///
    /// ```
    /// let got = tmpi::run_local(3, |w| {
    ///     let (me, mut all) = ([w.rank() as u64 * 2], [0u64; 3]);
    ///     tmpi::scope(|s| w.iallgather(s, &me, &mut all).unwrap().wait().unwrap());
    ///     all
    /// });
    /// assert!(got.iter().all(|a| a == &[0, 2, 4]));
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidBuffer`] when `recv` is not `size * send.len()` long; from the request,
    /// mismatched lengths, [`Error::PeerGone`].
    pub fn iallgather<'s, T: Pod>(&self, s: &'s Scope<'s, '_>, send: &'s [T], recv: &'s mut [T]) -> Result<Request<'s>> {
        if seen::on() {
            return seen::call(What::new(Kind::Iallgather).on(self).bytes(size_of_val(send)), || self.iallgather(s, send, recv));
        }
        let n = self.size();
        if Some(recv.len()) != send.len().checked_mul(n) {
            CollCtx::new(self)?;
            return Err(len_err("iallgather", "receive", recv.len(), send.len().saturating_mul(n)));
        }
        let counts = vec![send.len(); n];
        let displs: Vec<usize> = (0..n).map(|i| i * send.len()).collect();
        self.iallgatherv_named("iallgather", s, send, recv, &counts, &displs)
    }

    /// Non-blocking [`Comm::allgatherv`]: rank `r`'s `send` lands at
    /// `recv[displs[r]..displs[r] + counts[r]]` on every rank.
    ///
    /// ```
    /// let got = tmpi::run_local(3, |w| {
    ///     let r = w.rank();
    ///     let mut all = vec![0u16; 6];
    ///     let send = vec![r as u16; r + 1];
    ///     tmpi::scope(|s| w.iallgatherv(s, &send, &mut all, &[1, 2, 3], &[0, 1, 3]).unwrap().wait().unwrap());
    ///     all
    /// });
    /// assert!(got.iter().all(|a| a == &[0, 1, 1, 2, 2, 2]));
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidBuffer`] when a block does not fit `recv`, two blocks overlap or this
    /// rank's count is not `send.len()`; from the request, a block of another length than its
    /// count, [`Error::PeerGone`].
    pub fn iallgatherv<'s, T: Pod>(
        &self,
        s: &'s Scope<'s, '_>,
        send: &'s [T],
        recv: &'s mut [T],
        counts: &[usize],
        displs: &[usize],
    ) -> Result<Request<'s>> {
        if seen::on() {
            return seen::call(What::new(Kind::Iallgatherv).on(self).bytes(size_of_val(send)), || {
                self.iallgatherv(s, send, recv, counts, displs)
            });
        }
        self.iallgatherv_named("iallgatherv", s, send, recv, counts, displs)
    }

    fn iallgatherv_named<'s, T: Pod>(
        &self,
        what: &str,
        s: &'s Scope<'s, '_>,
        send: &'s [T],
        recv: &'s mut [T],
        counts: &[usize],
        displs: &[usize],
    ) -> Result<Request<'s>> {
        let c = CollCtx::new(self)?;
        let (r, n) = (self.rank(), self.size());
        check_layout(what, "receive", counts, displs, n, recv.len(), true)?;
        if counts[r] != send.len() {
            return Err(len_err(what, "own count of the", counts[r], send.len()));
        }
        let es = std::mem::size_of::<T>();
        let sb: &[u8] = bytemuck::cast_slice(send);
        let mut acts = Vec::with_capacity(2 * n);
        for i in 0..n {
            let (off, len) = block(counts, displs, i, es);
            if i == r {
                acts.push(Action::Copy { from: inp(0, sb.len()), to: out(off, len) });
            } else {
                acts.push(Action::Recv { s: out(off, len), src: i, tag: tags::ALLGATHER });
                acts.push(Action::Send { s: inp(0, sb.len()), dest: i, tag: tags::ALLGATHER });
            }
        }
        let mut plan = Plan::new();
        plan.round(acts);
        self.start_plan(s, &c, plan, Some(sb), Some(bytemuck::cast_slice_mut(recv)))
    }

    /// Non-blocking [`Comm::alltoall`]: block `j` of `send` to rank `j`, block `i` of `recv`
    /// from rank `i`.
    ///
    /// ```
    /// let got = tmpi::run_local(3, |w| {
    ///     let r = w.rank() as u32;
    ///     let send = [10 * r, 10 * r + 1, 10 * r + 2];
    ///     let mut recv = [0u32; 3];
    ///     tmpi::scope(|s| w.ialltoall(s, &send, &mut recv).unwrap().wait().unwrap());
    ///     recv
    /// });
    /// assert_eq!(got[1], [1, 11, 21]);
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidBuffer`] when `send` and `recv` differ in length or are not a multiple
    /// of `size`; from the request, mismatched lengths, [`Error::PeerGone`].
    pub fn ialltoall<'s, T: Pod>(&self, s: &'s Scope<'s, '_>, send: &'s [T], recv: &'s mut [T]) -> Result<Request<'s>> {
        if seen::on() {
            return seen::call(What::new(Kind::Ialltoall).on(self).bytes(size_of_val(send)), || self.ialltoall(s, send, recv));
        }
        let n = self.size();
        if send.len() != recv.len() || send.len() % n != 0 {
            CollCtx::new(self)?;
            return Err(Error::InvalidBuffer(format!(
                "ialltoall: send ({}) and receive ({}) buffers must have the same length, a multiple of {n}",
                send.len(),
                recv.len()
            )));
        }
        let b = send.len() / n;
        let counts = vec![b; n];
        let displs: Vec<usize> = (0..n).map(|i| i * b).collect();
        self.ialltoallv(s, send, &counts, &displs, recv, &counts, &displs)
    }

    /// Non-blocking [`Comm::alltoallv`]: `send[sdispls[j]..][..scounts[j]]` to rank `j`, rank
    /// `i`'s block into `recv[rdispls[i]..][..rcounts[i]]`.
    ///
    /// ```
    /// let got = tmpi::run_local(2, |w| {
    ///     let r = w.rank();
    ///     // rank r sends j + 1 copies of r to rank j
    ///     let send: Vec<u8> = if r == 0 { vec![0, 0, 0] } else { vec![1, 1, 1] };
    ///     let mut recv = vec![9u8; 2 * (r + 1)];
    ///     let (rc, rd) = ([r + 1, r + 1], [0, r + 1]);
    ///     tmpi::scope(|s| w.ialltoallv(s, &send, &[1, 2], &[0, 1], &mut recv, &rc, &rd).unwrap().wait().unwrap());
    ///     recv
    /// });
    /// assert_eq!(got, vec![vec![0, 1], vec![0, 0, 1, 1]]);
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidBuffer`] when a block does not fit its buffer, receive blocks overlap or
    /// `scounts[rank] != rcounts[rank]`; from the request, a block of another length than its
    /// count, [`Error::PeerGone`].
    #[allow(clippy::too_many_arguments)]
    pub fn ialltoallv<'s, T: Pod>(
        &self,
        s: &'s Scope<'s, '_>,
        send: &'s [T],
        scounts: &[usize],
        sdispls: &[usize],
        recv: &'s mut [T],
        rcounts: &[usize],
        rdispls: &[usize],
    ) -> Result<Request<'s>> {
        if seen::on() {
            return seen::call(What::new(Kind::Ialltoallv).on(self).bytes(size_of_val(send)), || {
                self.ialltoallv(s, send, scounts, sdispls, recv, rcounts, rdispls)
            });
        }
        let c = CollCtx::new(self)?;
        let (r, n) = (self.rank(), self.size());
        check_layout("ialltoallv", "send", scounts, sdispls, n, send.len(), false)?;
        check_layout("ialltoallv", "receive", rcounts, rdispls, n, recv.len(), true)?;
        if scounts[r] != rcounts[r] {
            return Err(len_err("ialltoallv", "own receive count of the", rcounts[r], scounts[r]));
        }
        let es = std::mem::size_of::<T>();
        let mut acts = Vec::with_capacity(2 * n);
        for i in 0..n {
            let (soff, slen) = block(scounts, sdispls, i, es);
            let (roff, rlen) = block(rcounts, rdispls, i, es);
            if i == r {
                acts.push(Action::Copy { from: inp(soff, slen), to: out(roff, rlen) });
            } else {
                acts.push(Action::Recv { s: out(roff, rlen), src: i, tag: tags::ALLTOALL });
                acts.push(Action::Send { s: inp(soff, slen), dest: i, tag: tags::ALLTOALL });
            }
        }
        let mut plan = Plan::new();
        plan.round(acts);
        self.start_plan(s, &c, plan, Some(bytemuck::cast_slice(send)), Some(bytemuck::cast_slice_mut(recv)))
    }

    /// Non-blocking [`Comm::reduce_scatter`]: `send` of every rank combined with `op`, block
    /// `r` (of `counts[r]` elements, blocks consecutive) left in rank `r`'s `recv`.
    ///
    /// ```
    /// let got = tmpi::run_local(3, |w| {
    ///     let send: Vec<u64> = (0..6).map(|i| i * 10 + w.rank() as u64).collect();
    ///     let counts = [3, 0, 3];
    ///     let mut mine = vec![0u64; counts[w.rank()]];
    ///     tmpi::scope(|s| w.ireduce_scatter(s, &send, &mut mine, &counts, tmpi::Op::Sum).unwrap().wait().unwrap());
    ///     mine
    /// });
    /// assert_eq!(got, vec![vec![3, 33, 63], vec![], vec![93, 123, 153]]);
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidOp`]; [`Error::InvalidBuffer`] when `counts` has not one entry per
    /// rank, does not sum to `send.len()`, or `recv.len() != counts[rank]`; from the request,
    /// mismatched lengths, [`Error::PeerGone`].
    pub fn ireduce_scatter<'s, T: Pod + Reducible>(
        &self,
        s: &'s Scope<'s, '_>,
        send: &'s [T],
        recv: &'s mut [T],
        counts: &[usize],
        op: Op,
    ) -> Result<Request<'s>> {
        if seen::on() {
            return seen::call(What::new(Kind::IreduceScatter).on(self).bytes(size_of_val(send)), || {
                self.ireduce_scatter(s, send, recv, counts, op)
            });
        }
        self.ireduce_scatter_f(s, send, recv, counts, builtin::<T>(op), check_op::<T>(op))
    }

    /// Non-blocking [`Comm::reduce_scatter_block`]: [`Comm::ireduce_scatter`] with equal blocks
    /// of `recv.len()` elements.
    ///
    /// ```
    /// let got = tmpi::run_local(2, |w| {
    ///     let mut mine = [0i32; 2];
    ///     tmpi::scope(|s| w.ireduce_scatter_block(s, &[1, 2, 3, 4], &mut mine, tmpi::Op::Prod).unwrap().wait().unwrap());
    ///     mine
    /// });
    /// assert_eq!(got, vec![[1, 4], [9, 16]]);
    /// ```
    ///
    /// # Errors
    /// As [`Comm::ireduce_scatter`]; [`Error::InvalidBuffer`] when `send.len() != size * recv.len()`.
    pub fn ireduce_scatter_block<'s, T: Pod + Reducible>(
        &self,
        s: &'s Scope<'s, '_>,
        send: &'s [T],
        recv: &'s mut [T],
        op: Op,
    ) -> Result<Request<'s>> {
        if seen::on() {
            return seen::call(What::new(Kind::IreduceScatterBlock).on(self).bytes(size_of_val(send)), || {
                self.ireduce_scatter_block(s, send, recv, op)
            });
        }
        let n = self.size();
        let counts = vec![recv.len(); n];
        self.ireduce_scatter(s, send, recv, &counts, op)
    }

    /// Non-blocking [`Comm::scan`] (inclusive prefix reduction in rank order).
    ///
    /// ```
    /// let got = tmpi::run_local(4, |w| {
    ///     let (me, mut acc) = ([w.rank() as u32 + 1], [0u32]);
    ///     tmpi::scope(|s| w.iscan(s, &me, &mut acc, tmpi::Op::Sum).unwrap().wait().unwrap());
    ///     acc[0]
    /// });
    /// assert_eq!(got, vec![1, 3, 6, 10]);
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidOp`]; [`Error::InvalidBuffer`] when `recv.len() != send.len()`; from the
    /// request, mismatched lengths, [`Error::PeerGone`].
    pub fn iscan<'s, T: Pod + Reducible>(&self, s: &'s Scope<'s, '_>, send: &'s [T], recv: &'s mut [T], op: Op) -> Result<Request<'s>> {
        if seen::on() {
            return seen::call(What::new(Kind::Iscan).on(self).bytes(size_of_val(send)), || self.iscan(s, send, recv, op));
        }
        self.iprefix("iscan", s, send, recv, builtin::<T>(op), check_op::<T>(op), true)
    }

    /// Non-blocking [`Comm::exscan`] (exclusive prefix reduction; rank 0's `recv` unchanged).
    ///
    /// ```
    /// let got = tmpi::run_local(4, |w| {
    ///     let (me, mut off) = ([10 * (w.rank() + 1)], [0usize]);
    ///     tmpi::scope(|s| w.iexscan(s, &me, &mut off, tmpi::Op::Sum).unwrap().wait().unwrap());
    ///     off[0]
    /// });
    /// assert_eq!(got, vec![0, 10, 30, 60]);
    /// ```
    ///
    /// # Errors
    /// As [`Comm::iscan`].
    pub fn iexscan<'s, T: Pod + Reducible>(&self, s: &'s Scope<'s, '_>, send: &'s [T], recv: &'s mut [T], op: Op) -> Result<Request<'s>> {
        if seen::on() {
            return seen::call(What::new(Kind::Iexscan).on(self).bytes(size_of_val(send)), || self.iexscan(s, send, recv, op));
        }
        self.iprefix("iexscan", s, send, recv, builtin::<T>(op), check_op::<T>(op), false)
    }

    // ---- the schedules, generic over the reduction step ----

    pub(crate) fn ireduce_f<'s, T: Pod>(
        &self,
        s: &'s Scope<'s, '_>,
        send: &'s [T],
        recv: Option<&'s mut [T]>,
        f: ReduceFn,
        op_ok: Result<()>,
        root: Rank,
    ) -> Result<Request<'s>> {
        let c = CollCtx::new(self)?;
        check_root(root, self.size())?;
        op_ok?;
        let (r, n) = (self.rank(), self.size());
        let recv = if r == root {
            match recv {
                Some(b) if b.len() == send.len() => Some(bytemuck::cast_slice_mut::<T, u8>(b)),
                Some(b) => return Err(len_err("ireduce", "receive", b.len(), send.len())),
                None => return Err(Error::InvalidBuffer("ireduce: the root needs a receive buffer".into())),
            }
        } else {
            None
        };
        let sb: &[u8] = bytemuck::cast_slice(send);
        let len = sb.len();
        let mut plan = Plan::new();
        plan.reduce = Some(f);
        let acc = plan_reduce0(&mut plan, r, n, inp(0, len), len);
        if let Some(acc) = acc {
            if root == 0 {
                plan.round(vec![Action::Copy { from: acc, to: out(0, len) }]);
            } else {
                plan.round(vec![Action::Send { s: acc, dest: root, tag: tags::TO_ROOT }]);
            }
        }
        if r == root && root != 0 {
            plan.round(vec![Action::Recv { s: out(0, len), src: 0, tag: tags::TO_ROOT }]);
        }
        self.start_plan(s, &c, plan, Some(sb), recv)
    }

    pub(crate) fn iallreduce_f<'s, T: Pod>(
        &self,
        s: &'s Scope<'s, '_>,
        send: &'s [T],
        recv: &'s mut [T],
        f: ReduceFn,
        op_ok: Result<()>,
    ) -> Result<Request<'s>> {
        let c = CollCtx::new(self)?;
        op_ok?;
        if recv.len() != send.len() {
            return Err(len_err("iallreduce", "receive", recv.len(), send.len()));
        }
        let (r, n) = (self.rank(), self.size());
        let sb: &[u8] = bytemuck::cast_slice(send);
        let len = sb.len();
        let mut plan = Plan::new();
        plan.reduce = Some(f);
        if let Some(acc) = plan_reduce0(&mut plan, r, n, inp(0, len), len) {
            plan.round(vec![Action::Copy { from: acc, to: out(0, len) }]);
        }
        plan_bcast(&mut plan, r, n, out(0, len), 0);
        self.start_plan(s, &c, plan, Some(sb), Some(bytemuck::cast_slice_mut(recv)))
    }

    pub(crate) fn ireduce_scatter_f<'s, T: Pod>(
        &self,
        s: &'s Scope<'s, '_>,
        send: &'s [T],
        recv: &'s mut [T],
        counts: &[usize],
        f: ReduceFn,
        op_ok: Result<()>,
    ) -> Result<Request<'s>> {
        let c = CollCtx::new(self)?;
        op_ok?;
        let (r, n) = (self.rank(), self.size());
        if counts.len() != n {
            return Err(Error::InvalidBuffer(format!("ireduce_scatter: {} counts given, the communicator has {n} ranks", counts.len())));
        }
        let mut displs = Vec::with_capacity(n);
        let mut total = 0usize;
        for &k in counts {
            displs.push(total);
            total = total.checked_add(k).ok_or_else(|| Error::InvalidBuffer("ireduce_scatter: the counts overflow usize".into()))?;
        }
        if total != send.len() {
            return Err(len_err("ireduce_scatter", "send", send.len(), total));
        }
        if recv.len() != counts[r] {
            return Err(len_err("ireduce_scatter", "receive", recv.len(), counts[r]));
        }
        let es = std::mem::size_of::<T>();
        let sb: &[u8] = bytemuck::cast_slice(send);
        let mut plan = Plan::new();
        plan.reduce = Some(f);
        match plan_reduce0(&mut plan, r, n, inp(0, sb.len()), sb.len()) {
            Some(acc) => {
                let mut acts = Vec::with_capacity(n);
                for i in 0..n {
                    let (off, len) = block(counts, &displs, i, es);
                    let from = Span::new(acc.buf, off, len);
                    if i == r {
                        acts.push(Action::Copy { from, to: out(0, len) });
                    } else {
                        acts.push(Action::Send { s: from, dest: i, tag: tags::SCATTER });
                    }
                }
                plan.round(acts);
            }
            None => plan.round(vec![Action::Recv { s: out(0, counts[r] * es), src: 0, tag: tags::SCATTER }]),
        }
        self.start_plan(s, &c, plan, Some(sb), Some(bytemuck::cast_slice_mut(recv)))
    }

    /// Prefix reduction along the chain of ranks: rank `r` receives the prefix of ranks
    /// `0..r` from `r - 1`, and sends the prefix of `0..=r` to `r + 1`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn iprefix<'s, T: Pod>(
        &self,
        what: &str,
        s: &'s Scope<'s, '_>,
        send: &'s [T],
        recv: &'s mut [T],
        f: ReduceFn,
        op_ok: Result<()>,
        inclusive: bool,
    ) -> Result<Request<'s>> {
        let c = CollCtx::new(self)?;
        op_ok?;
        if recv.len() != send.len() {
            return Err(len_err(what, "receive", recv.len(), send.len()));
        }
        let (r, n) = (self.rank(), self.size());
        let len = std::mem::size_of_val(send);
        let mut plan = Plan::new();
        plan.reduce = Some(f);
        let (me, o) = (inp(0, len), out(0, len));
        let next = r + 1 < n;
        if r == 0 {
            let mut acts = Vec::new();
            if inclusive {
                acts.push(Action::Copy { from: me, to: o });
            }
            if next {
                acts.push(Action::Send { s: me, dest: 1, tag: tags::SCAN });
            }
            plan.round(acts);
        } else {
            let prev = plan.temp(len);
            plan.round(vec![Action::Recv { s: prev, src: r - 1, tag: tags::SCAN }]);
            if inclusive {
                let mut acts = vec![Action::Copy { from: me, to: o }, Action::Reduce { from: prev, acc: o, left: true }];
                if next {
                    acts.push(Action::Send { s: o, dest: r + 1, tag: tags::SCAN });
                }
                plan.round(acts);
            } else {
                let mut acts = vec![Action::Copy { from: prev, to: o }];
                if next {
                    let mine = plan.temp(len);
                    acts.push(Action::Copy { from: me, to: mine });
                    acts.push(Action::Reduce { from: prev, acc: mine, left: true });
                    acts.push(Action::Send { s: mine, dest: r + 1, tag: tags::SCAN });
                }
                plan.round(acts);
            }
        }
        self.start_plan(s, &c, plan, Some(bytemuck::cast_slice(send)), Some(bytemuck::cast_slice_mut(recv)))
    }
}

fn check_root(root: usize, size: usize) -> Result<()> {
    if root < size {
        Ok(())
    } else {
        Err(Error::InvalidRoot { root, size })
    }
}

#[cold]
fn len_err(what: &str, buf: &str, got: usize, want: usize) -> Error {
    Error::InvalidBuffer(format!("{what}: the {buf} buffer has {got} elements, {want} expected"))
}

#[cfg(test)]
mod tests;
