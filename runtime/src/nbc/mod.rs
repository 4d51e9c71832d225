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
//! A collective is the same schedule its blocking twin runs ([`crate::coll::plan`]: rounds
//! of sends, receives and local copies or reductions, the algorithm chosen by
//! [`crate::coll::select`] exactly as for the blocking call), which the engine advances in
//! each round of progress while any is in flight (nothing is checked when none is). The
//! blocking call runs its schedule to the end at once; here the request does. Operators that
//! are not commutative ([`crate::UserOp`]) are combined in rank order.
//!
//! # Errors
//!
//! Arguments are checked when the call starts ([`Error::InvalidRoot`],
//! [`Error::InvalidBuffer`], [`Error::InvalidOp`]); the call then returns the error at once and
//! takes no part in the collective (as in MPI, the other ranks' parts of an erroneous call may
//! not complete). Lengths that differ between ranks, and departed ranks
//! ([`Error::PeerGone`]), are reported when the request completes.

pub(crate) mod sched;
mod userop;

use bytemuck::Pod;

use crate::coll::plan::{Plan, ReduceFn};
use crate::coll::reduce::check_reduce;
use crate::coll::{builtin, run, vcoll, CollP2p, Vector};
use crate::coll_ctx::CollCtx;
use crate::comm::Comm;
use crate::error::{Error, Result};
use crate::op::{check_op, Op, Reducible};
use crate::request::{Request, Scope};
use crate::seen::{self, Kind, What};
use crate::Rank;

impl Comm {
    /// Starts `plan` as a schedule on this call's collective context and returns its request;
    /// an error the plan holds (a bad argument on this rank) is returned instead, and the
    /// call takes no part.
    fn start_plan<'s>(
        &self,
        s: &'s Scope<'s, '_>,
        c: &CollCtx<'_>,
        mut plan: Plan,
        input: Option<&'s [u8]>,
        output: Option<&'s mut [u8]>,
    ) -> Result<Request<'s>> {
        if let Some(e) = plan.error.take() {
            return c.finish(Err(e));
        }
        // SAFETY: `input` and `output` are borrowed for 's; the request is registered in the
        // scope (`Request::new`), which finishes or abandons it before 's ends, and
        // abandoning it abandons every transfer of the schedule and drops the schedule, so
        // nothing touches the buffers afterwards.
        let sched = unsafe { c.sched(plan, input, output)? };
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
        let plan = run::barrier_plan(&c.setting());
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
        let bytes: &mut [u8] = bytemuck::cast_slice_mut(buf);
        let plan = c.finish(run::bcast_plan(&c.setting(), bytes.len(), root))?;
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
        self.ireduce_f(s, send, recv, Reduction::builtin::<T>(op), root)
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
        self.iallreduce_f(s, send, recv, Reduction::builtin::<T>(op))
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
        let c = CollCtx::new(self)?;
        let (rank, size) = (self.rank(), self.size());
        c.finish(crate::coll::check_root(root, size))?;
        let recv = if rank == root { recv.map(|r| bytemuck::cast_slice_mut::<T, u8>(r)) } else { None };
        let sb: &[u8] = bytemuck::cast_slice(send);
        if rank == root {
            c.finish(crate::coll::gather::check_gather("igather", size, sb.len(), recv.as_ref().map(|r| r.len())))?;
        }
        let plan = run::gather_plan(&c.setting(), sb.len(), root);
        self.start_plan(s, &c, plan, Some(sb), recv)
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
        let recv = if self.rank() == root { recv } else { None };
        if self.rank() == root && recv.is_none() {
            return c.finish(Err(Error::InvalidBuffer(format!("{what}: the root needs a receive buffer"))));
        }
        let plan = c.finish(vcoll::gatherv_plan(self.rank(), self.size(), send, recv.as_ref().map(|r| r.len()), counts, displs, root))?;
        self.start_plan(s, &c, plan, Some(bytemuck::cast_slice(send)), recv.map(|r| bytemuck::cast_slice_mut(r)))
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
        let c = CollCtx::new(self)?;
        let (rank, size) = (self.rank(), self.size());
        c.finish(crate::coll::check_root(root, size))?;
        let send = if rank == root { send.map(|b| bytemuck::cast_slice::<T, u8>(b)) } else { None };
        let rb: &mut [u8] = bytemuck::cast_slice_mut(recv);
        if rank == root {
            c.finish(crate::coll::gather::check_gather("iscatter", size, rb.len(), send.map(<[u8]>::len)))?;
        }
        let plan = run::scatter_plan(&c.setting(), rb.len(), root);
        self.start_plan(s, &c, plan, send, Some(rb))
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
        let send = if self.rank() == root { send } else { None };
        if self.rank() == root && send.is_none() {
            return c.finish(Err(Error::InvalidBuffer(format!("{what}: the root needs a send buffer"))));
        }
        let plan = c.finish(vcoll::scatterv_plan(self.rank(), self.size(), send.map(<[T]>::len), counts, displs, recv, root))?;
        self.start_plan(s, &c, plan, send.map(|b| bytemuck::cast_slice(b)), Some(bytemuck::cast_slice_mut(recv)))
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
        let c = CollCtx::new(self)?;
        let (sb, rb): (&[u8], &mut [u8]) = (bytemuck::cast_slice(send), bytemuck::cast_slice_mut(recv));
        c.finish(crate::coll::allgather::check_allgather(self.size(), sb.len(), rb.len()))?;
        let plan = run::allgather_plan(&c.setting(), sb.len());
        self.start_plan(s, &c, plan, Some(sb), Some(rb))
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
        self.iallgatherv_named(s, send, recv, counts, displs)
    }

    fn iallgatherv_named<'s, T: Pod>(
        &self,
        s: &'s Scope<'s, '_>,
        send: &'s [T],
        recv: &'s mut [T],
        counts: &[usize],
        displs: &[usize],
    ) -> Result<Request<'s>> {
        let c = CollCtx::new(self)?;
        let plan = run::allgatherv_plan(&c.setting(), send, recv.len(), counts, displs);
        self.start_plan(s, &c, plan, Some(bytemuck::cast_slice(send)), Some(bytemuck::cast_slice_mut(recv)))
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
        let c = CollCtx::new(self)?;
        let (sb, rb): (&[u8], &mut [u8]) = (bytemuck::cast_slice(send), bytemuck::cast_slice_mut(recv));
        c.finish(crate::coll::alltoall::check_alltoall(self.size(), size_of::<T>(), sb.len(), rb.len()))?;
        let plan = run::alltoall_plan(&c.setting(), sb.len() / self.size());
        self.start_plan(s, &c, plan, Some(sb), Some(rb))
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
        let plan = vcoll::alltoallv_plan(&c.setting(), send, scounts, sdispls, recv.len(), rcounts, rdispls);
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
        self.ireduce_scatter_f(s, send, recv, counts, Reduction::builtin::<T>(op))
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
        op: Reduction,
        root: Rank,
    ) -> Result<Request<'s>> {
        let c = CollCtx::new(self)?;
        c.finish(crate::coll::check_root(root, self.size()))?;
        let Reduction { f, ok, commutative } = op;
        c.finish(ok)?;
        let is_root = self.rank() == root;
        let recv = if is_root { recv } else { None };
        c.finish(check_reduce(send, recv.as_deref(), is_root))?;
        let v = Vector { n: send.len(), es: std::mem::size_of::<T>() };
        let plan = c.finish(run::reduce_plan(&c.setting(), f, commutative, v, root))?;
        self.start_plan(s, &c, plan, Some(bytemuck::cast_slice(send)), recv.map(|r| bytemuck::cast_slice_mut(r)))
    }

    pub(crate) fn iallreduce_f<'s, T: Pod>(
        &self,
        s: &'s Scope<'s, '_>,
        send: &'s [T],
        recv: &'s mut [T],
        op: Reduction,
    ) -> Result<Request<'s>> {
        let c = CollCtx::new(self)?;
        let Reduction { f, ok, commutative } = op;
        c.finish(ok)?;
        if recv.len() != send.len() {
            return c.finish(Err(len_err("iallreduce", "receive", recv.len(), send.len())));
        }
        let v = Vector { n: send.len(), es: std::mem::size_of::<T>() };
        let plan = c.finish(run::allreduce_plan(&c.setting(), f, commutative, v))?;
        self.start_plan(s, &c, plan, Some(bytemuck::cast_slice(send)), Some(bytemuck::cast_slice_mut(recv)))
    }

    pub(crate) fn ireduce_scatter_f<'s, T: Pod>(
        &self,
        s: &'s Scope<'s, '_>,
        send: &'s [T],
        recv: &'s mut [T],
        counts: &[usize],
        op: Reduction,
    ) -> Result<Request<'s>> {
        let c = CollCtx::new(self)?;
        let Reduction { f, ok, commutative } = op;
        c.finish(ok)?;
        let r = self.rank();
        c.finish(vcoll::check_counts("ireduce_scatter", counts, self.size(), send.len()))?;
        if recv.len() != counts[r] {
            return c.finish(Err(len_err("ireduce_scatter", "receive", recv.len(), counts[r])));
        }
        let plan = c.finish(run::reduce_scatter_plan(&c.setting(), f, commutative, std::mem::size_of::<T>(), counts))?;
        self.start_plan(s, &c, plan, Some(bytemuck::cast_slice(send)), Some(bytemuck::cast_slice_mut(recv)))
    }

    /// Prefix reduction by recursive doubling, in rank order (see [`crate::coll::scan`]).
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
        c.finish(op_ok)?;
        if recv.len() != send.len() {
            return c.finish(Err(len_err(what, "receive", recv.len(), send.len())));
        }
        let plan = vcoll::prefix_plan(self.rank(), self.size(), f, std::mem::size_of_val(send), inclusive);
        self.start_plan(s, &c, plan, Some(bytemuck::cast_slice(send)), Some(bytemuck::cast_slice_mut(recv)))
    }
}

/// The reduction step of a reducing collective: how to combine, whether the operator is
/// defined for the type (checked once the call has taken its sequence number), and whether it
/// commutes.
pub(crate) struct Reduction {
    pub(crate) f: ReduceFn,
    pub(crate) ok: Result<()>,
    pub(crate) commutative: bool,
}

impl Reduction {
    /// A predefined operator on `T` (every one commutes).
    fn builtin<T: Pod + Reducible>(op: Op) -> Reduction {
        Reduction { f: builtin::<T>(op), ok: check_op::<T>(op), commutative: true }
    }
}

#[cold]
fn len_err(what: &str, buf: &str, got: usize, want: usize) -> Error {
    Error::InvalidBuffer(format!("{what}: the {buf} buffer has {got} elements, {want} expected"))
}

#[cfg(test)]
mod tests;
