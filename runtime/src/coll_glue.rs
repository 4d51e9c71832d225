//! The public collective operations and communicator constructors, on top of the generic
//! algorithms in [`crate::coll`], run on each communicator's private collective context.

use std::rc::Rc;

use bytemuck::Pod;

use crate::coll::{self, CollP2p};
use crate::comm::{Comm, CommInner};
use crate::error::{Error, Result};
use crate::op::{Op, Reducible};
use crate::Rank;

/// Point-to-point on a communicator's collective context.
pub(crate) struct CollCtx<'a>(pub(crate) &'a Comm);

impl CollP2p for CollCtx<'_> {
    fn rank(&self) -> usize {
        self.0.rank()
    }
    fn size(&self) -> usize {
        self.0.size()
    }
    fn send(&self, buf: &[u8], dest: usize, tag: u32) -> Result<()> {
        self.0.send_ctx(self.0.coll_ctx(), buf, dest, tag, false)
    }
    fn recv(&self, buf: &mut [u8], src: usize, tag: u32) -> Result<usize> {
        self.0.check_rank(src)?;
        self.0.recv_ctx(self.0.coll_ctx(), buf, Some(src as u32), Some(tag)).map(|s| s.len())
    }
    fn sendrecv(&self, sbuf: &[u8], dest: usize, stag: u32, rbuf: &mut [u8], src: usize, rtag: u32) -> Result<usize> {
        self.0.check_rank(src)?;
        self.0.sendrecv_ctx(self.0.coll_ctx(), sbuf, dest, stag, rbuf, Some(src as u32), Some(rtag)).map(|s| s.len())
    }
}

pub(crate) fn barrier_internal(c: &Comm) -> Result<()> {
    coll::barrier(&CollCtx(c))
}

/// Largest communicator id: contexts `2 * id` and `2 * id + 1` must fit the tag's 20 bits.
const MAX_COMM_ID: u32 = (1 << 19) - 1;

impl Comm {
    /// Agrees on a fresh communicator id with every member of `self` (collective).
    fn agree_comm_id(&self) -> Result<u32> {
        let mine = self.eng().next_comm_id;
        let mut id = [0u32];
        coll::allreduce(&CollCtx(self), &[mine], &mut id, Op::Max)?;
        let id = id[0];
        if id > MAX_COMM_ID {
            return Err(Error::State(format!("out of communicator ids (limit {MAX_COMM_ID})")));
        }
        self.eng().next_comm_id = id + 1;
        Ok(id)
    }

    /// A new communicator with the same ranks and a fresh context (collective).
    ///
    /// # Errors
    /// [`Error::PeerGone`]; [`Error::State`] when communicator ids run out.
    pub fn dup(&self) -> Result<Comm> {
        let id = self.agree_comm_id()?;
        Ok(Comm {
            inner: Rc::new(CommInner {
                eng: self.inner.eng.clone(),
                id,
                rank: self.inner.rank,
                size: self.inner.size,
                members: self.inner.members.clone(),
            }),
        })
    }

    /// Splits into one communicator per color, ranks ordered by `key` then old rank (collective).
    /// A `None` color takes part but gets `None`.
    ///
    /// # Errors
    /// As [`Comm::dup`].
    pub fn split(&self, color: Option<u32>, key: i32) -> Result<Option<Comm>> {
        let n = self.size();
        let mine = [u32::from(color.is_some()), color.unwrap_or(0), key as u32];
        let mut all = vec![0u32; 3 * n];
        coll::allgather(&CollCtx(self), bytemuck::cast_slice(&mine), bytemuck::cast_slice_mut(&mut all))?;
        let id = self.agree_comm_id()?;
        let Some(color) = color else { return Ok(None) };
        let mut group: Vec<(i32, usize)> =
            (0..n).filter(|&r| all[3 * r] == 1 && all[3 * r + 1] == color).map(|r| (all[3 * r + 2] as i32, r)).collect();
        group.sort_unstable();
        let rank = group.iter().position(|&(_, r)| r == self.rank()).ok_or_else(|| Error::State("split lost this rank".into()))?;
        let members: Rc<[usize]> = group.iter().map(|&(_, r)| self.world_rank(r)).collect();
        Ok(Some(Comm { inner: Rc::new(CommInner { eng: self.inner.eng.clone(), id, rank, size: members.len(), members: Some(members) }) }))
    }

    /// Blocks until every rank has called it.
    ///
    /// # Errors
    /// [`Error::PeerGone`].
    pub fn barrier(&self) -> Result<()> {
        coll::barrier(&CollCtx(self))
    }

    /// Broadcasts `buf` from `root` to every rank.
    ///
    /// # Errors
    /// [`Error::InvalidRoot`]; [`Error::Truncated`] when ranks pass different lengths.
    pub fn bcast<T: Pod>(&self, buf: &mut [T], root: Rank) -> Result<()> {
        coll::bcast(&CollCtx(self), bytemuck::cast_slice_mut(buf), root)
    }

    /// Combines `send` of every rank with `op` into `recv` at `root` (`None` elsewhere).
    ///
    /// # Errors
    /// [`Error::InvalidRoot`], [`Error::InvalidBuffer`], [`Error::InvalidOp`].
    pub fn reduce<T: Pod + Reducible>(&self, send: &[T], recv: Option<&mut [T]>, op: Op, root: Rank) -> Result<()> {
        coll::reduce(&CollCtx(self), send, recv, op, root)
    }

    /// Combines `send` of every rank with `op` into `recv` on every rank.
    ///
    /// # Errors
    /// [`Error::InvalidBuffer`], [`Error::InvalidOp`].
    pub fn allreduce<T: Pod + Reducible>(&self, send: &[T], recv: &mut [T], op: Op) -> Result<()> {
        coll::allreduce(&CollCtx(self), send, recv, op)
    }

    /// Collects `send` of every rank, in rank order, into `recv` at `root`.
    ///
    /// # Errors
    /// [`Error::InvalidRoot`], [`Error::InvalidBuffer`].
    pub fn gather<T: Pod>(&self, send: &[T], recv: Option<&mut [T]>, root: Rank) -> Result<()> {
        coll::gather(&CollCtx(self), bytemuck::cast_slice(send), recv.map(|r| bytemuck::cast_slice_mut(r)), root)
    }

    /// Distributes consecutive blocks of `send` at `root` to every rank's `recv`.
    ///
    /// # Errors
    /// [`Error::InvalidRoot`], [`Error::InvalidBuffer`].
    pub fn scatter<T: Pod>(&self, send: Option<&[T]>, recv: &mut [T], root: Rank) -> Result<()> {
        coll::scatter(&CollCtx(self), send.map(|s| bytemuck::cast_slice(s)), bytemuck::cast_slice_mut(recv), root)
    }

    /// Collects `send` of every rank, in rank order, into `recv` on every rank.
    ///
    /// # Errors
    /// [`Error::InvalidBuffer`].
    pub fn allgather<T: Pod>(&self, send: &[T], recv: &mut [T]) -> Result<()> {
        coll::allgather(&CollCtx(self), bytemuck::cast_slice(send), bytemuck::cast_slice_mut(recv))
    }

    /// Sends block `j` of `send` to rank `j` and receives block `i` of `recv` from rank `i`.
    ///
    /// # Errors
    /// [`Error::InvalidBuffer`].
    pub fn alltoall<T: Pod>(&self, send: &[T], recv: &mut [T]) -> Result<()> {
        coll::alltoall(&CollCtx(self), bytemuck::cast_slice(send), bytemuck::cast_slice_mut(recv))
    }
}
