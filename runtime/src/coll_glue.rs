//! The public collective operations and communicator constructors, on top of the generic
//! algorithms in [`crate::coll`], run on each communicator's private collective context.

use std::sync::Arc;

use bytemuck::Pod;

use crate::coll::{self, shm, topo};
use crate::coll_ctx::CollCtx;
use crate::comm::{Comm, CommInner};
use crate::error::{Error, Result};
use crate::op::{Op, Reducible};
use crate::seen::{self, Kind, What};
use crate::Rank;

impl<'a> CollCtx<'a> {
    /// The call on the communicator's shared-memory collective context, if it has one.
    #[inline(always)]
    fn shm(&self) -> Option<shm::Call<'a>> {
        shm::Call::new(self.comm(), self.full_seq())
    }
}

/// Runs `f`, the point-to-point path of a collective that also has a shared-memory one, out of
/// line: the small calls' path through the slots then stays compact enough to be inlined
/// whole (a schedule's setup inlined beside it cost the 2-rank barrier 31 instructions more
/// per call, 632 against 601, in `tests::shm_small_call_cost`).
#[inline(never)]
fn out_of_line<R>(f: impl FnOnce() -> Result<R>) -> Result<R> {
    f()
}

/// Largest communicator id: contexts `2 * id` and `2 * id + 1` stay below `2^19`, and the
/// context of `Comm::create_group`'s exchanges, `2^19 + id`, within the tag's 20 bits.
pub(crate) const MAX_COMM_ID: u32 = (1 << 18) - 1;

impl Comm {
    /// Agrees on a communicator id that every member of `self` has free, and takes it
    /// (collective). Usually two small allreduces: the highest of the members' lowest words
    /// with a free id, then the AND of that word's free bits; if no id of it is free
    /// everywhere, the next word.
    fn agree_comm_id(&self) -> Result<u32> {
        let mut from = 0usize;
        loop {
            let mine = self.eng()?.comm_id_first_free_word(from) as u64;
            let mut w = [0u64];
            let c = CollCtx::new(self)?;
            c.finish(coll::run::allreduce(&c, &[mine], &mut w, Op::Max))?;
            let w = w[0] as usize;
            if w * 64 > MAX_COMM_ID as usize {
                return Err(Error::State(format!("out of communicator ids ({} in use at once at most)", MAX_COMM_ID)));
            }
            let free = self.eng()?.comm_id_free_word(w);
            let mut all = [0u64];
            let c = CollCtx::new(self)?;
            c.finish(coll::run::allreduce(&c, &[free], &mut all, Op::BitAnd))?;
            if all[0] != 0 {
                let id = (w * 64) as u32 + all[0].trailing_zeros();
                if id > MAX_COMM_ID {
                    return Err(Error::State(format!("out of communicator ids ({} in use at once at most)", MAX_COMM_ID)));
                }
                return Ok(id);
            }
            from = w + 1;
        }
    }

    /// Builds a communicator on agreed id `id` (and takes the id on this rank).
    pub(crate) fn with_id(&self, id: u32, rank: Rank, size: usize, members: Option<crate::engine::WorldRanks>) -> Result<Comm> {
        self.eng()?.comm_id_take(id);
        Ok(Comm {
            inner: Arc::new(CommInner {
                eng: self.inner.eng.clone(),
                coll_seq: Default::default(),
                shm_seq: Default::default(),
                shm_seen_all: Default::default(),
                shm: Default::default(),
                coll_busy: Default::default(),
                machine: self.inner.machine.derive(members.as_ref().map(|m| m.as_slice()), size),
                id,
                rank,
                size,
                members,
                attrs: Default::default(),
            }),
        })
    }

    /// A communicator of the same ranks on a fresh context, for the runtime's own use: no
    /// name, no attributes copied (collective).
    pub(crate) fn dup_private(&self) -> Result<Comm> {
        let id = self.agree_comm_id()?;
        let c = self.with_id(id, self.inner.rank, self.inner.size, self.inner.members.clone())?;
        shm::assign(&c)?;
        Ok(c)
    }

    /// A new communicator with the same ranks and a fresh context (collective).
    ///
    /// # Errors
    /// [`Error::PeerGone`]; [`Error::State`] when communicator ids run out.
    pub fn dup(&self) -> Result<Comm> {
        if seen::on() {
            return seen::call(What::new(Kind::Dup).on(self), || self.dup());
        }
        let id = self.agree_comm_id()?;
        let c = self.with_id(id, self.inner.rank, self.inner.size, self.inner.members.clone())?;
        shm::assign(&c)?;
        crate::names::copy_on_dup(self, &c);
        Ok(c)
    }

    /// Splits into one communicator per color, ranks ordered by `key` then old rank (collective).
    /// A `None` color takes part but gets `None`.
    ///
    /// # Errors
    /// As [`Comm::dup`].
    pub fn split(&self, color: Option<u32>, key: i32) -> Result<Option<Comm>> {
        if seen::on() {
            return seen::call(What::new(Kind::Split).on(self), || self.split(color, key));
        }
        let n = self.size();
        let mine = [u32::from(color.is_some()), color.unwrap_or(0), key as u32];
        let mut all = vec![0u32; 3 * n];
        let c = CollCtx::new(self)?;
        c.finish(coll::run::allgather(&c, bytemuck::cast_slice(&mine), bytemuck::cast_slice_mut(&mut all)))?;
        let id = self.agree_comm_id()?;
        let Some(color) = color else { return Ok(None) };
        let mut group: Vec<(i32, usize)> =
            (0..n).filter(|&r| all[3 * r] == 1 && all[3 * r + 1] == color).map(|r| (all[3 * r + 2] as i32, r)).collect();
        group.sort_unstable();
        let rank = group.iter().position(|&(_, r)| r == self.rank()).ok_or_else(|| Error::State("split lost this rank".into()))?;
        let members = Arc::new(group.iter().map(|&(_, r)| self.world_rank(r)).collect::<Vec<_>>());
        let size = members.len();
        let c = self.with_id(id, rank, size, Some(members))?;
        shm::assign(&c)?;
        Ok(Some(c))
    }

    /// Blocks until every rank has called it.
    ///
    /// # Errors
    /// [`Error::PeerGone`].
    pub fn barrier(&self) -> Result<()> {
        if seen::on() {
            return seen::call(What::new(Kind::Barrier).on(self), || self.barrier());
        }
        let c = CollCtx::new(self)?;
        if let Some(s) = c.shm() {
            return c.finish(s.barrier());
        }
        c.finish(out_of_line(|| coll::run::barrier(&c)))
    }

    /// Broadcasts `buf` from `root` to every rank.
    ///
    /// # Errors
    /// [`Error::InvalidRoot`]; [`Error::Truncated`] when ranks pass different lengths.
    pub fn bcast<T: Pod>(&self, buf: &mut [T], root: Rank) -> Result<()> {
        if seen::on() {
            return seen::call(What::new(Kind::Bcast).to(self, root).bytes(size_of_val(buf)), || self.bcast(buf, root));
        }
        let c = CollCtx::new(self)?;
        let buf: &mut [u8] = bytemuck::cast_slice_mut(buf);
        if let Some(s) = c.shm() {
            if let Err(e) = coll::check_root(root, self.size()) {
                s.refuse()?;
                return Err(e);
            }
            c.finish(s.bcast(buf, root))?;
            if buf.len() <= shm::SHM_MAX_BYTES {
                return Ok(());
            }
        }
        c.finish(out_of_line(|| coll::run::bcast(&c, buf, root)))
    }

    /// Combines `send` of every rank with `op` into `recv` at `root` (`None` elsewhere).
    ///
    /// # Errors
    /// [`Error::InvalidRoot`], [`Error::InvalidBuffer`], [`Error::InvalidOp`].
    pub fn reduce<T: Pod + Reducible>(&self, send: &[T], recv: Option<&mut [T]>, op: Op, root: Rank) -> Result<()> {
        if seen::on() {
            return seen::call(What::new(Kind::Reduce).to(self, root).bytes(size_of_val(send)), || self.reduce(send, recv, op, root));
        }
        let c = CollCtx::new(self)?;
        if let Some(s) = c.shm() {
            let is_root = self.rank() == root;
            if let Err(e) = shm::check_reduce(send, recv.as_deref(), op, root, self.size(), is_root) {
                s.refuse()?;
                return Err(e);
            }
            let recv = if is_root { recv } else { None };
            if std::mem::size_of_val(send) <= shm::SHM_MAX_BYTES {
                return c.finish(s.reduce(send, recv, op, root, false));
            }
            c.finish(s.reduce::<T>(send, None, op, root, false))?;
            return c.finish(out_of_line(|| coll::run::reduce(&c, send, recv, op, root)));
        }
        c.finish(out_of_line(|| coll::run::reduce(&c, send, recv, op, root)))
    }

    /// Combines `send` of every rank with `op` into `recv` on every rank.
    ///
    /// # Errors
    /// [`Error::InvalidBuffer`], [`Error::InvalidOp`].
    pub fn allreduce<T: Pod + Reducible>(&self, send: &[T], recv: &mut [T], op: Op) -> Result<()> {
        if seen::on() {
            return seen::call(What::new(Kind::Allreduce).on(self).bytes(size_of_val(send)), || self.allreduce(send, recv, op));
        }
        let c = CollCtx::new(self)?;
        if let Some(s) = c.shm() {
            if let Err(e) = shm::check_reduce(send, Some(recv), op, 0, self.size(), true) {
                s.refuse()?;
                return Err(e);
            }
            if std::mem::size_of_val(send) <= shm::SHM_MAX_BYTES {
                return c.finish(s.reduce(send, Some(recv), op, 0, true));
            }
            c.finish(s.reduce::<T>(send, None, op, 0, true))?;
        }
        c.finish(out_of_line(|| coll::run::allreduce(&c, send, recv, op)))
    }

    /// Collects `send` of every rank, in rank order, into `recv` at `root`.
    ///
    /// # Errors
    /// [`Error::InvalidRoot`], [`Error::InvalidBuffer`].
    pub fn gather<T: Pod>(&self, send: &[T], recv: Option<&mut [T]>, root: Rank) -> Result<()> {
        if seen::on() {
            return seen::call(What::new(Kind::Gather).to(self, root).bytes(size_of_val(send)), || self.gather(send, recv, root));
        }
        let c = CollCtx::new(self)?;
        c.finish(coll::run::gather(&c, bytemuck::cast_slice(send), recv.map(|r| bytemuck::cast_slice_mut(r)), root))
    }

    /// Distributes consecutive blocks of `send` at `root` to every rank's `recv`.
    ///
    /// # Errors
    /// [`Error::InvalidRoot`], [`Error::InvalidBuffer`].
    pub fn scatter<T: Pod>(&self, send: Option<&[T]>, recv: &mut [T], root: Rank) -> Result<()> {
        if seen::on() {
            return seen::call(What::new(Kind::Scatter).to(self, root).bytes(size_of_val(recv)), || self.scatter(send, recv, root));
        }
        let c = CollCtx::new(self)?;
        c.finish(coll::run::scatter(&c, send.map(|s| bytemuck::cast_slice(s)), bytemuck::cast_slice_mut(recv), root))
    }

    /// Collects `send` of every rank, in rank order, into `recv` on every rank.
    ///
    /// # Errors
    /// [`Error::InvalidBuffer`].
    pub fn allgather<T: Pod>(&self, send: &[T], recv: &mut [T]) -> Result<()> {
        if seen::on() {
            return seen::call(What::new(Kind::Allgather).on(self).bytes(size_of_val(send)), || self.allgather(send, recv));
        }
        let c = CollCtx::new(self)?;
        c.finish(coll::run::allgather(&c, bytemuck::cast_slice(send), bytemuck::cast_slice_mut(recv)))
    }

    /// Sends block `j` of `send` to rank `j` and receives block `i` of `recv` from rank `i`.
    ///
    /// # Errors
    /// [`Error::InvalidBuffer`] when `send` and `recv` differ in length or their length is
    /// not a multiple of the communicator's size (checked before any communication).
    pub fn alltoall<T: Pod>(&self, send: &[T], recv: &mut [T]) -> Result<()> {
        self.alltoall_bytes(bytemuck::cast_slice(send), bytemuck::cast_slice_mut(recv), size_of::<T>())
    }

    /// [`Comm::alltoall`] of elements of `elem` bytes, given as bytes.
    pub(crate) fn alltoall_bytes(&self, send: &[u8], recv: &mut [u8], elem: usize) -> Result<()> {
        if seen::on() {
            return seen::call(What::new(Kind::Alltoall).on(self).bytes(send.len()), || self.alltoall_bytes(send, recv, elem));
        }
        let c = CollCtx::new(self)?;
        c.finish(coll::run::alltoall(&c, send, recv, elem))
    }
}

/// Variable-count collectives, reduce-scatter and prefix reductions (algorithms in
/// `coll::vcoll`). Counts and displacements are in elements of `T`, one per rank.
impl Comm {
    /// Collects `send` of every rank into `recv` at `root`: rank `r`'s elements land at
    /// `recv[displs[r]..displs[r] + counts[r]]`, where `counts[r]` is rank `r`'s `send.len()`.
    /// `recv`, `counts` and `displs` are read at the root only (others may pass `None`, `&[]`).
    ///
    /// ```
    /// let got = tmpi::run_local(3, |w| {
    ///     let r = w.rank();
    ///     let send = vec![r as u32; r + 1]; // rank r sends r + 1 elements
    ///     let (counts, displs) = ([1, 2, 3], [5, 3, 0]); // blocks in reverse order
    ///     let mut all = vec![0u32; 6];
    ///     let recv = (r == 0).then_some(&mut all[..]);
    ///     w.gatherv(&send, recv, &counts, &displs, 0).unwrap();
    ///     all
    /// });
    /// assert_eq!(got[0], vec![2, 2, 2, 1, 1, 0]);
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidRoot`]; at the root [`Error::InvalidBuffer`] when `recv` is missing, a
    /// block does not fit `recv`, two blocks overlap, the root's count is not `send.len()` or a
    /// rank's block has another length than its count (the root still takes every rank's
    /// block, so no rank waits for it); [`Error::PeerGone`].
    pub fn gatherv<T: Pod>(&self, send: &[T], recv: Option<&mut [T]>, counts: &[usize], displs: &[usize], root: Rank) -> Result<()> {
        if seen::on() {
            return seen::call(What::new(Kind::Gatherv).to(self, root).bytes(size_of_val(send)), || {
                self.gatherv(send, recv, counts, displs, root)
            });
        }
        let c = CollCtx::new(self)?;
        c.finish(coll::gatherv(&c, send, recv, counts, displs, root))
    }

    /// Distributes blocks of `send` at `root`: rank `r` receives
    /// `send[displs[r]..displs[r] + counts[r]]` into its `recv` (of length `counts[r]`).
    /// `send`, `counts` and `displs` are read at the root only; send blocks may overlap.
    ///
    /// ```
    /// let got = tmpi::run_local(3, |w| {
    ///     let r = w.rank();
    ///     let data = [10u8, 11, 12, 13, 14, 15];
    ///     let mut mine = vec![0u8; r + 1];
    ///     let send = (r == 1).then_some(&data[..]);
    ///     w.scatterv(send, &[1, 2, 3], &[0, 1, 3], &mut mine, 1).unwrap();
    ///     mine
    /// });
    /// assert_eq!(got, vec![vec![10], vec![11, 12], vec![13, 14, 15]]);
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidRoot`]; at the root [`Error::InvalidBuffer`] when `send` is missing, a
    /// block does not fit `send` or the root's count is not `recv.len()` (the root then sends
    /// every rank an empty block); elsewhere [`Error::InvalidBuffer`] when the block received
    /// has another length than `recv`; [`Error::PeerGone`].
    pub fn scatterv<T: Pod>(&self, send: Option<&[T]>, counts: &[usize], displs: &[usize], recv: &mut [T], root: Rank) -> Result<()> {
        if seen::on() {
            return seen::call(What::new(Kind::Scatterv).to(self, root).bytes(size_of_val(recv)), || {
                self.scatterv(send, counts, displs, recv, root)
            });
        }
        let c = CollCtx::new(self)?;
        c.finish(coll::scatterv(&c, send, counts, displs, recv, root))
    }

    /// Collects `send` of every rank into `recv` on every rank: rank `r`'s elements land at
    /// `recv[displs[r]..displs[r] + counts[r]]`, where `counts[r]` is rank `r`'s `send.len()`.
    ///
    /// ```
    /// let got = tmpi::run_local(3, |w| {
    ///     let r = w.rank();
    ///     let mut all = vec![0u16; 6];
    ///     w.allgatherv(&vec![r as u16; r + 1], &mut all, &[1, 2, 3], &[0, 1, 3]).unwrap();
    ///     all
    /// });
    /// assert!(got.iter().all(|a| a == &[0, 1, 1, 2, 2, 2]));
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidBuffer`] when a block does not fit `recv`, two blocks overlap, this rank's
    /// count is not `send.len()`, or a block arrives with another length than its count (the rank
    /// still completes its part, so no rank waits for it); [`Error::PeerGone`].
    pub fn allgatherv<T: Pod>(&self, send: &[T], recv: &mut [T], counts: &[usize], displs: &[usize]) -> Result<()> {
        if seen::on() {
            return seen::call(What::new(Kind::Allgatherv).on(self).bytes(size_of_val(send)), || {
                self.allgatherv(send, recv, counts, displs)
            });
        }
        let c = CollCtx::new(self)?;
        c.finish(coll::run::allgatherv(&c, send, recv, counts, displs))
    }

    /// Sends `send[sdispls[j]..sdispls[j] + scounts[j]]` to rank `j` and receives rank `i`'s
    /// block for this rank into `recv[rdispls[i]..rdispls[i] + rcounts[i]]`. `scounts[j]` on
    /// rank `i` must equal `rcounts[i]` on rank `j`.
    ///
    /// ```
    /// // Rank r sends j + 1 copies of r to rank j.
    /// let got = tmpi::run_local(3, |w| {
    ///     let (r, p) = (w.rank(), w.size());
    ///     let scounts: Vec<usize> = (0..p).map(|j| j + 1).collect();
    ///     let sdispls: Vec<usize> = (0..p).map(|j| j * (j + 1) / 2).collect();
    ///     let send: Vec<i64> = (0..p).flat_map(|j| vec![r as i64; j + 1]).collect();
    ///     let (rcounts, rdispls) = (vec![r + 1; p], (0..p).map(|i| i * (r + 1)).collect::<Vec<_>>());
    ///     let mut recv = vec![-1i64; p * (r + 1)];
    ///     w.alltoallv(&send, &scounts, &sdispls, &mut recv, &rcounts, &rdispls).unwrap();
    ///     recv
    /// });
    /// assert_eq!(got[1], vec![0, 0, 1, 1, 2, 2]);
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidBuffer`] when a block does not fit its buffer, receive blocks overlap,
    /// `scounts[rank] != rcounts[rank]`, or a block arrives with another length than its count
    /// (the rank still completes its part, so no rank waits for it); [`Error::PeerGone`].
    #[allow(clippy::too_many_arguments)]
    pub fn alltoallv<T: Pod>(
        &self,
        send: &[T],
        scounts: &[usize],
        sdispls: &[usize],
        recv: &mut [T],
        rcounts: &[usize],
        rdispls: &[usize],
    ) -> Result<()> {
        if seen::on() {
            return seen::call(What::new(Kind::Alltoallv).on(self).bytes(size_of_val(send)), || {
                self.alltoallv(send, scounts, sdispls, recv, rcounts, rdispls)
            });
        }
        let c = CollCtx::new(self)?;
        c.finish(coll::alltoallv(&c, send, scounts, sdispls, recv, rcounts, rdispls))
    }

    /// Combines `send` of every rank with `op` and leaves block `r` of the result in rank `r`'s
    /// `recv`: the blocks are consecutive, `counts[r]` elements each, and `send.len()` is the
    /// sum of `counts` (the same on every rank).
    ///
    /// ```
    /// let got = tmpi::run_local(3, |w| {
    ///     let send: Vec<u64> = (0..6).map(|i| i * 10 + w.rank() as u64).collect();
    ///     let counts = [3, 0, 3];
    ///     let mut mine = vec![0u64; counts[w.rank()]];
    ///     w.reduce_scatter(&send, &mut mine, &counts, tmpi::Op::Sum).unwrap();
    ///     mine
    /// });
    /// assert_eq!(got, vec![vec![3, 33, 63], vec![], vec![93, 123, 153]]);
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidOp`]; [`Error::InvalidBuffer`] when `counts` has not one entry per rank,
    /// does not sum to `send.len()`, or `recv.len() != counts[rank]`; mismatched lengths
    /// between ranks; [`Error::PeerGone`].
    pub fn reduce_scatter<T: Pod + Reducible>(&self, send: &[T], recv: &mut [T], counts: &[usize], op: Op) -> Result<()> {
        if seen::on() {
            return seen::call(What::new(Kind::ReduceScatter).on(self).bytes(size_of_val(send)), || {
                self.reduce_scatter(send, recv, counts, op)
            });
        }
        let c = CollCtx::new(self)?;
        c.finish(coll::run::reduce_scatter(&c, send, recv, counts, op))
    }

    /// [`Comm::reduce_scatter`] with equal blocks: `send.len() == size * recv.len()`, and rank
    /// `r` gets elements `r * recv.len()..(r + 1) * recv.len()` of the reduction.
    ///
    /// ```
    /// let got = tmpi::run_local(2, |w| {
    ///     let send = [1i32, 2, 3, 4];
    ///     let mut mine = [0i32; 2];
    ///     w.reduce_scatter_block(&send, &mut mine, tmpi::Op::Prod).unwrap();
    ///     mine
    /// });
    /// assert_eq!(got, vec![[1, 4], [9, 16]]);
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidOp`]; [`Error::InvalidBuffer`] when the lengths do not fit; mismatched
    /// lengths between ranks; [`Error::PeerGone`].
    pub fn reduce_scatter_block<T: Pod + Reducible>(&self, send: &[T], recv: &mut [T], op: Op) -> Result<()> {
        if seen::on() {
            return seen::call(What::new(Kind::ReduceScatterBlock).on(self).bytes(size_of_val(send)), || {
                self.reduce_scatter_block(send, recv, op)
            });
        }
        let c = CollCtx::new(self)?;
        c.finish(coll::run::reduce_scatter_block(&c, send, recv, op))
    }

    /// Inclusive prefix reduction: rank `r` gets `send` of ranks `0..=r` combined element-wise
    /// with `op`, lower ranks on the left.
    ///
    /// ```
    /// let got = tmpi::run_local(4, |w| {
    ///     let mut acc = [0u32];
    ///     w.scan(&[w.rank() as u32 + 1], &mut acc, tmpi::Op::Sum).unwrap();
    ///     acc[0]
    /// });
    /// assert_eq!(got, vec![1, 3, 6, 10]);
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidOp`]; [`Error::InvalidBuffer`] when `recv.len() != send.len()` or ranks
    /// pass different lengths; [`Error::PeerGone`].
    pub fn scan<T: Pod + Reducible>(&self, send: &[T], recv: &mut [T], op: Op) -> Result<()> {
        if seen::on() {
            return seen::call(What::new(Kind::Scan).on(self).bytes(size_of_val(send)), || self.scan(send, recv, op));
        }
        let c = CollCtx::new(self)?;
        c.finish(coll::scan(&c, send, recv, op))
    }

    /// Exclusive prefix reduction: rank `r > 0` gets `send` of ranks `0..r` combined with `op`;
    /// rank 0's `recv` is left unchanged.
    ///
    /// ```
    /// let got = tmpi::run_local(4, |w| {
    ///     let mut offset = [0usize];
    ///     w.exscan(&[10 * (w.rank() + 1)], &mut offset, tmpi::Op::Sum).unwrap();
    ///     offset[0]
    /// });
    /// assert_eq!(got, vec![0, 10, 30, 60]);
    /// ```
    ///
    /// # Errors
    /// As [`Comm::scan`].
    pub fn exscan<T: Pod + Reducible>(&self, send: &[T], recv: &mut [T], op: Op) -> Result<()> {
        if seen::on() {
            return seen::call(What::new(Kind::Exscan).on(self).bytes(size_of_val(send)), || self.exscan(send, recv, op));
        }
        let c = CollCtx::new(self)?;
        c.finish(coll::exscan(&c, send, recv, op))
    }
}

/// Learns the world's hosts (collective over `world`, which has made no other collective yet):
/// one host without communication when `one_host` (the fabric is shared memory only, or the
/// job has one rank), else by gathering every rank's host identity.
///
/// # Errors
/// [`crate::Error::PeerGone`] and transport errors of the gather.
pub(crate) fn learn_hosts(world: &Comm, one_host: bool) -> Result<()> {
    let n = world.size();
    let keys = if one_host {
        vec![0u64; n]
    } else {
        let me = topo::key_of(&tmpi_transport::host::host_id());
        let mut all = vec![0u64; n];
        let c = CollCtx::new(world)?;
        c.finish(crate::coll::run::allgather(&c, bytemuck::bytes_of(&me), bytemuck::cast_slice_mut(&mut all)))?;
        all
    };
    // Set once: a second learning of one world cannot happen.
    let _ = world.inner.machine.hosts.set(topo::Hosts::world(topo::Topo::from_keys(&keys)));
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::run_local;

    /// Instructions per blocking call of the small collectives that go through the shared-memory
    /// slots (barrier and an 8 B allreduce at 2 ranks, as `osu_barrier` and `osu_allreduce`
    /// time them), counted with callgrind: `COLL_COST_CALL=barrier COLL_COST_ITERS=N valgrind
    /// --tool=callgrind --separate-threads=yes <test binary> --ignored --exact
    /// coll_glue::tests::shm_small_call_cost` (or `COLL_COST_CALL=allreduce`), once with N =
    /// 500 and once with 1000: the difference of rank 1's thread (the fourth) over 500 is the
    /// cost of one call. Rank 1 starts each call only once rank 0 has started it and had 5 ms
    /// to arrive, so rank 1 arrives second and does not wait: its count holds no spinning and
    /// does not depend on the host's load.
    #[test]
    #[ignore = "a measurement, not a test"]
    fn shm_small_call_cost() {
        let iters: usize = std::env::var("COLL_COST_ITERS").ok().and_then(|v| v.parse().ok()).unwrap_or(1000);
        let barrier = std::env::var("COLL_COST_CALL").map_or(true, |v| v == "barrier");
        let cfg = crate::config::Config { shm_ring_size: 64 << 10, ..crate::config::Config::default() };
        let started = std::sync::atomic::AtomicUsize::new(0);
        crate::world::run_shm_threads(2, cfg, |w| {
            let mut out = [0u64];
            for i in 0..iters {
                if w.rank() == 0 {
                    started.store(i + 1, std::sync::atomic::Ordering::SeqCst);
                } else {
                    while started.load(std::sync::atomic::Ordering::SeqCst) <= i {
                        std::thread::sleep(std::time::Duration::from_micros(100));
                    }
                    std::thread::sleep(std::time::Duration::from_millis(5));
                }
                if barrier {
                    w.barrier().unwrap();
                } else {
                    w.allreduce(&[i as u64], &mut out, crate::Op::Sum).unwrap();
                    assert_eq!(out[0], 2 * i as u64);
                }
            }
        });
    }

    /// Communicator ids come back when communicators are dropped: a million dup/drop cycles
    /// would run out of ids otherwise (the limit is 2^19 at once); here the id of a fresh dup
    /// stays the lowest free one.
    #[test]
    fn dup_recycles_ids() {
        let ids = run_local(3, |w| {
            let mut last = 0;
            for _ in 0..300 {
                let c = w.dup().unwrap();
                last = c.inner.id;
                let d = c.dup().unwrap();
                assert_ne!(d.inner.id, c.inner.id);
            }
            let kept: Vec<_> = (0..70).map(|_| w.dup().unwrap()).collect();
            let ids: Vec<u32> = kept.iter().map(|c| c.inner.id).collect();
            (last, ids)
        });
        for (last, ids) in &ids {
            assert_eq!(*last, 1, "dropped ids are reused");
            assert_eq!(*ids, (1..=70).collect::<Vec<u32>>(), "ids past the first word are agreed too");
        }
    }

    /// Ranks that disagree about a collective (here the root of a bcast) cannot feed the next
    /// collective stale data: every collective call has its own tags.
    #[test]
    fn a_disagreeing_collective_does_not_leak_into_the_next() {
        let got = run_local(2, |w| {
            let mut b = [w.rank() as u32 + 10];
            // Each rank thinks it is the root: both send, nobody receives.
            w.bcast(&mut b, w.rank()).unwrap();
            let mut c = [if w.rank() == 0 { 77u32 } else { 0 }];
            w.bcast(&mut c, 0).unwrap();
            c[0]
        });
        assert_eq!(got, vec![77, 77]);
    }
}
