//! Intercommunicators: [`InterComm`], made by [`Comm::intercomm_create`] (MPI's
//! `MPI_Intercomm_create`) and turned into an ordinary communicator by [`InterComm::merge`]
//! (`MPI_Intercomm_merge`).
//!
//! An intercommunicator joins two disjoint groups, the local one (this process's) and the
//! remote one. Point-to-point addresses the remote group: `send(buf, r, tag)` goes to rank `r`
//! of the remote group, a receive from `r` (or [`crate::ANY_SOURCE`], any rank of the remote
//! group) takes what rank `r` of the remote group sent, and a status's source is a remote rank.
//!
//! How it is built: the remote side is an ordinary communicator context whose members are the
//! remote group's processes, on an id that every process of both groups has free (agreed as
//! [`Comm::dup`]'s, the two groups' halves combined by their leaders). A message names its
//! sender by its rank in the sender's group, which is its remote rank for the receiver, so the
//! engine's matching and its check that no peer speaks for another hold unchanged. Each group
//! also has a private communicator of its own for the local half of the collectives
//! ([`InterComm::barrier`], [`InterComm::bcast`], [`InterComm::allreduce`],
//! [`InterComm::allgather`]), whose messages between the groups go on the remote context's
//! collective side, each call's on a tag of its own.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use bytemuck::Pod;

use crate::comm::{Comm, Source, Status, TagMatch};
use crate::error::{Error, Result};
use crate::group::Group;
use crate::op::{Op, Reducible};
use crate::request::{Request, Scope};
use crate::{Rank, Tag, TAG_UB};

/// Where the leaders of [`Comm::intercomm_create`] talk over the peer communicator: a context
/// per peer communicator, `INTER_CTX_BASE + id`, beside the user (`2 id`), collective
/// (`2 id + 1`) and group-creation (`2^19 + id`) ones, so that its messages meet no other kind.
const INTER_CTX_BASE: u32 = (1 << 19) | (1 << 18);
const _: () = assert!(INTER_CTX_BASE + crate::coll_glue::MAX_COMM_ID <= crate::matching::MAX_CTX);

/// The root of a collective over an intercommunicator, as MPI names it for this process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum InterRoot {
    /// This process is the root (`MPI_ROOT`): its data goes to the remote group.
    Root,
    /// Another process of this group is the root (`MPI_PROC_NULL`): this process takes no
    /// data part.
    ProcNull,
    /// The root is this rank of the remote group: this process receives.
    Remote(Rank),
}

/// An intercommunicator: point-to-point between two disjoint groups, collectives across
/// them (see the [module docs](crate::inter)). Cheap to clone; clones share the
/// communicator.
///
/// ```
/// // Ranks 0, 1 form one group, ranks 2, 3, 4 the other; rank 0 of each side is its leader.
/// let got = tmpi::run_local(5, |w| {
///     let low = w.rank() < 2;
///     let half = w.split(Some(u32::from(low)), 0).unwrap().unwrap();
///     let ic = half.intercomm_create(0, &w, if low { 2 } else { 0 }, 9).unwrap();
///     // Each rank sends its world rank to the remote rank of the same number, if any.
///     if ic.rank() < ic.remote_size() {
///         ic.send(&[w.rank()], ic.rank(), 1).unwrap();
///     }
///     let mut from = [usize::MAX];
///     if ic.rank() < ic.remote_size() {
///         ic.recv(&mut from, ic.rank(), 1).unwrap();
///     }
///     // Merged, the group that passes `high = false` comes first.
///     let all = ic.merge(!low).unwrap();
///     (ic.rank(), ic.size(), ic.remote_size(), from[0], all.rank())
/// });
/// assert_eq!(got[0], (0, 2, 3, 2, 0));
/// assert_eq!(got[4], (2, 3, 2, usize::MAX, 4));
/// ```
#[derive(Clone)]
pub struct InterComm {
    /// The remote side: rank = this process's rank in its group, size and members those of
    /// the remote group. Its user context carries point-to-point, its collective context the
    /// collectives' messages between the groups.
    wire: Comm,
    /// The local group's private communicator.
    local: Comm,
    /// Whether this group comes first in [`InterComm::merge`] when both pass the same `high`.
    first: bool,
    /// Collectives started on this intercommunicator (their number tags their messages).
    seq: Arc<AtomicU32>,
}

impl std::fmt::Debug for InterComm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InterComm")
            .field("id", &self.wire.inner.id)
            .field("rank", &self.rank())
            .field("size", &self.size())
            .field("remote_size", &self.remote_size())
            .finish()
    }
}

/// Kinds of the collectives' messages between the groups (the low 8 bits of their tags).
const KIND_BARRIER: u32 = 1;
const KIND_BCAST: u32 = 2;
const KIND_AGREE: u32 = 3;
const KIND_ALLREDUCE: u32 = 4;
const KIND_ALLGATHER: u32 = 5;

/// Verdicts of [`Comm::intercomm_create`]'s leader check, which its group learns.
const BAD_REMOTE_RANK: u64 = 1;
const BAD_REMOTE_IN_GROUP: u64 = 2;

/// One leader's channel to the other: `comm`'s context `ctx`, peer `peer`, tag `tag`.
struct Link<'a> {
    comm: &'a Comm,
    peer: Rank,
    ctx: u32,
    tag: Tag,
}

impl Link<'_> {
    /// Sends `out` to the other leader and receives its message of `into.len()` words.
    fn exchange(&self, out: &[u64], into: &mut [u64]) -> Result<()> {
        let (peer, tag) = (self.peer, self.tag);
        let st = self.comm.sendrecv_ctx(
            self.ctx,
            bytemuck::cast_slice(out),
            peer,
            tag,
            bytemuck::cast_slice_mut(into),
            Some(peer as u32),
            Some(tag),
        )?;
        if st.len != std::mem::size_of_val(into) {
            return Err(Error::State(format!(
                "intercommunicator: the other leader sent {} bytes where {} were expected (the groups disagree about a call)",
                st.len,
                std::mem::size_of_val(into)
            )));
        }
        Ok(())
    }
}

/// Both groups at once, for the constructors: the local group's private communicator, its
/// leader, and the leader's link to the other leader.
struct Across<'a> {
    local: &'a Comm,
    leader: Rank,
    link: Link<'a>,
}

/// The word a leader broadcasts first: its exchange with the other leader worked.
const LINK_OK: u64 = 1;

impl Across<'_> {
    /// The other group's leader's `theirs_len` words for the leader's `mine`, at every member
    /// of this group (collective over it).
    ///
    /// # Errors
    /// The leader's exchange error, at every member (as [`Error::State`] but at the leader).
    fn swap(&self, mine: &[u64], theirs_len: usize) -> Result<Vec<u64>> {
        let mut got = vec![0u64; theirs_len + 1];
        let mut failure = None;
        if self.local.rank() == self.leader {
            match self.link.exchange(mine, &mut got[1..]) {
                Ok(()) => got[0] = LINK_OK,
                Err(e) => failure = Some(e),
            }
        }
        self.local.bcast(&mut got, self.leader)?;
        if let Some(e) = failure {
            return Err(e);
        }
        if got[0] != LINK_OK {
            return Err(Error::State("intercommunicator: the group's leader could not reach the other group".into()));
        }
        got.remove(0);
        Ok(got)
    }

    /// `op` (`Max` or `BitAnd`) of `v` over every process of both groups, at every one.
    fn allreduce(&self, v: &[u64], op: Op) -> Result<Vec<u64>> {
        let mut mine = vec![0u64; v.len()];
        self.local.allreduce(v, &mut mine, op)?;
        let theirs = self.swap(&mine, v.len())?;
        Ok(mine.iter().zip(theirs).map(|(&a, b)| if op == Op::BitAnd { a & b } else { a.max(b) }).collect())
    }

    /// A communicator id that every process of both groups has free (the algorithm of
    /// `Comm::dup`, each step combined across the groups).
    fn agree_id(&self) -> Result<u32> {
        let max_id = crate::coll_glue::MAX_COMM_ID;
        let out_of_ids = || Error::State(format!("out of communicator ids ({max_id} in use at once at most)"));
        let mut from = 0usize;
        loop {
            let first = self.local.eng()?.comm_id_first_free_word(from) as u64;
            let w = self.allreduce(&[first], Op::Max)?[0] as usize;
            if w * 64 > max_id as usize {
                return Err(out_of_ids());
            }
            let free = self.local.eng()?.comm_id_free_word(w);
            let all = self.allreduce(&[free], Op::BitAnd)?[0];
            if all != 0 {
                let id = (w * 64) as u32 + all.trailing_zeros();
                return if id > max_id { Err(out_of_ids()) } else { Ok(id) };
            }
            from = w + 1;
        }
    }
}

impl Comm {
    /// An intercommunicator between this communicator's group and another, disjoint group
    /// (MPI's `MPI_Intercomm_create`; collective over `self`, and over the other group's
    /// communicator at the same time).
    ///
    /// Every rank of `self` passes the same `local_leader`, the rank in `self` of this group's
    /// leader. Only at the leader do `peer_comm` and `remote_leader` count: `remote_leader` is
    /// the other group's leader's rank in `peer_comm`, a communicator both leaders belong to
    /// (the other ranks pass any communicator, `self` say). The leaders talk over `peer_comm`
    /// with `tag`; those messages never meet user messages or collectives of `peer_comm`,
    /// whatever the tag, but two creations at once over one peer communicator between the same
    /// leaders need different tags.
    ///
    /// # Errors
    /// Before any communication: [`Error::InvalidRank`] (every rank alike) for a
    /// `local_leader` outside `self`, [`Error::InvalidTag`] for a tag above [`TAG_UB`]. On
    /// every rank of the group, as its leader finds them: [`Error::InvalidRank`] for a
    /// `remote_leader` outside `peer_comm`, [`Error::InvalidGroup`] when it names a process of
    /// this group (the other group's leader is then left waiting, as in MPI: the call is
    /// erroneous). On every rank of both groups: [`Error::InvalidGroup`] when the groups
    /// overlap. As [`Comm::dup`].
    pub fn intercomm_create(&self, local_leader: Rank, peer_comm: &Comm, remote_leader: Rank, tag: Tag) -> Result<InterComm> {
        self.check_rank(local_leader)?;
        if tag > TAG_UB {
            return Err(Error::InvalidTag { tag });
        }
        let local = self.dup_private()?;
        let mut verdict = [0u64];
        if self.rank() == local_leader {
            verdict[0] = leader_verdict(self, peer_comm, remote_leader);
        }
        local.bcast(&mut verdict, local_leader)?;
        match verdict[0] {
            0 => {}
            BAD_REMOTE_RANK => return Err(Error::InvalidRank { rank: remote_leader, size: peer_comm.size() }),
            _ => {
                return Err(Error::InvalidGroup(
                    "intercomm_create: the remote leader is a process of the local group (the groups overlap)".into(),
                ))
            }
        }
        let link = Link { comm: peer_comm, peer: remote_leader, ctx: INTER_CTX_BASE + peer_comm.inner.id, tag };
        let across = Across { local: &local, leader: local_leader, link };
        let mine: Vec<u64> = (0..self.size()).map(|r| self.world_rank(r) as u64).collect();
        let n = across.swap(&[mine.len() as u64], 1)?[0] as usize;
        let theirs = across.swap(&mine, n)?;
        if theirs.iter().any(|t| mine.contains(t)) {
            return Err(Error::InvalidGroup("intercomm_create: the local and the remote group overlap".into()));
        }
        let id = across.agree_id()?;
        let remote: Vec<usize> = theirs.iter().map(|&w| w as usize).collect();
        let first = mine.iter().min() < theirs.iter().min();
        let wire = local.with_id(id, self.rank(), remote.len(), Some(Arc::new(remote)))?;
        Ok(InterComm { wire, local, first, seq: Arc::default() })
    }
}

/// The local leader's check of [`Comm::intercomm_create`]'s `remote_leader` (0: fine).
fn leader_verdict(local: &Comm, peer: &Comm, remote_leader: Rank) -> u64 {
    if remote_leader >= peer.size() {
        return BAD_REMOTE_RANK;
    }
    let w = peer.world_rank(remote_leader);
    if (0..local.size()).any(|r| local.world_rank(r) == w) {
        return BAD_REMOTE_IN_GROUP;
    }
    0
}

impl InterComm {
    /// This process's rank in its (the local) group.
    pub fn rank(&self) -> Rank {
        self.local.rank()
    }

    /// Number of processes in the local group.
    pub fn size(&self) -> usize {
        self.local.size()
    }

    /// The communicator through which this intercommunicator's point-to-point calls reach
    /// the remote group (for adapters such as `tmpi-rsmpi`): its `rank` is this process's
    /// rank in the local group, its `size` and ranks those of the remote group. Only
    /// point-to-point calls on it are meaningful; a collective on it is erroneous.
    pub fn remote_view(&self) -> &Comm {
        &self.wire
    }

    /// Number of processes in the remote group.
    pub fn remote_size(&self) -> usize {
        self.wire.size()
    }

    /// The local group (a local call).
    pub fn group(&self) -> Group {
        self.local.group()
    }

    /// The remote group, in its rank order (a local call); this process is not a member.
    pub fn remote_group(&self) -> Group {
        let me = self.local.world_rank(self.local.rank());
        Group::from_world_ranks((0..self.remote_size()).map(|r| self.wire.world_rank(r)).collect(), me)
    }

    /// The tag of this process's next collective call of kind `kind`.
    fn next_tag(&self, kind: u32) -> Tag {
        let seq = self.seq.fetch_add(1, Ordering::Relaxed);
        (seq & 0xffff) << 8 | kind
    }

    /// Both groups, for a constructor: the leaders (rank 0 of each group) talk on the
    /// collective context.
    fn across(&self) -> Across<'_> {
        let link = Link { comm: &self.wire, peer: 0, ctx: self.wire.coll_ctx(), tag: self.next_tag(KIND_AGREE) };
        Across { local: &self.local, leader: 0, link }
    }

    /// A new intercommunicator of the same groups with fresh contexts (collective over both
    /// groups).
    ///
    /// # Errors
    /// As [`Comm::dup`].
    pub fn dup(&self) -> Result<InterComm> {
        let across = self.across();
        let id = across.agree_id()?;
        let local = self.local.dup_private()?;
        let wire = local.with_id(id, self.rank(), self.remote_size(), self.wire.inner.members.clone())?;
        Ok(InterComm { wire, local, first: self.first, seq: Arc::default() })
    }

    /// An intracommunicator of both groups (MPI's `MPI_Intercomm_merge`; collective over
    /// both groups). The group whose processes pass `high = false` comes first; when both
    /// groups pass the same value, the group of the lower process in the world comes first
    /// (MPI leaves that order to the implementation). Every process of a group passes the
    /// same `high` (the leader's counts).
    ///
    /// # Errors
    /// As [`Comm::dup`].
    pub fn merge(&self, high: bool) -> Result<Comm> {
        let across = self.across();
        let remote_high = across.swap(&[u64::from(high)], 1)?[0] != 0;
        let mut mine = [u64::from(high)];
        self.local.bcast(&mut mine, 0)?;
        let high = mine[0] != 0;
        let first = if high == remote_high { self.first } else { !high };
        let local = (0..self.size()).map(|r| self.local.world_rank(r));
        let remote = (0..self.remote_size()).map(|r| self.wire.world_rank(r));
        let members: Vec<usize> = if first { local.chain(remote).collect() } else { remote.chain(local).collect() };
        let rank = if first { self.rank() } else { self.remote_size() + self.rank() };
        let id = across.agree_id()?;
        let n = members.len();
        let c = self.local.with_id(id, rank, n, Some(Arc::new(members)))?;
        crate::coll::shm::assign(&c)?;
        Ok(c)
    }

    /// Blocks until every process of both groups has called it (collective over both).
    ///
    /// # Errors
    /// [`Error::PeerGone`].
    pub fn barrier(&self) -> Result<()> {
        let tag = self.next_tag(KIND_BARRIER);
        self.local.barrier()?;
        if self.local.rank() == 0 {
            let ctx = self.wire.coll_ctx();
            self.wire.sendrecv_ctx(ctx, &[], 0, tag, &mut [], Some(0), Some(tag))?;
        }
        self.local.barrier()
    }

    /// Broadcasts `buf` from a root in one group to every process of the other (collective
    /// over both groups; MPI's intercommunicator `MPI_Bcast`). In the root's group the root
    /// passes [`InterRoot::Root`] and the others [`InterRoot::ProcNull`] (their `buf` is left
    /// alone); every process of the other group passes [`InterRoot::Remote`] with the root's
    /// rank in the root's group, and receives into `buf`.
    ///
    /// # Errors
    /// [`Error::InvalidRoot`] for a remote root outside the remote group (every process of
    /// the group alike); [`Error::Truncated`] when the lengths differ; [`Error::PeerGone`].
    pub fn bcast<T: Pod>(&self, buf: &mut [T], root: InterRoot) -> Result<()> {
        let tag = self.next_tag(KIND_BCAST);
        let ctx = self.wire.coll_ctx();
        let bytes: &mut [u8] = bytemuck::cast_slice_mut(buf);
        match root {
            InterRoot::Root => self.wire.send_ctx(ctx, bytes, 0, tag, false),
            InterRoot::ProcNull => Ok(()),
            InterRoot::Remote(r) => {
                crate::coll::check_root(r, self.remote_size())?;
                let mut got = Ok(());
                if self.local.rank() == 0 {
                    got = self.wire.recv_ctx(ctx, bytes, Some(r as u32), Some(tag)).and_then(|st| {
                        if st.len == bytes.len() {
                            Ok(())
                        } else {
                            Err(Error::Truncated { source_rank: r, tag, len: st.len, capacity: bytes.len() })
                        }
                    });
                }
                // The group's broadcast runs even when the leader's receive failed, so that
                // no member waits for it.
                let spread = self.local.bcast(bytes, 0);
                got.and(spread)
            }
        }
    }

    /// The leaders' half of a collective: rank 0 of each group sends `mine` to the other's
    /// rank 0 and receives its `theirs`, which is then broadcast to the group. `theirs` is
    /// broadcast even when the leader's exchange failed, so that no member waits for it.
    fn leaders_swap(&self, tag: Tag, mine: &[u8], theirs: &mut [u8]) -> Result<()> {
        let mut got = Ok(());
        if self.local.rank() == 0 {
            let ctx = self.wire.coll_ctx();
            got = self.wire.sendrecv_ctx(ctx, mine, 0, tag, theirs, Some(0), Some(tag)).and_then(|st| {
                if st.len == theirs.len() {
                    Ok(())
                } else {
                    Err(Error::Truncated { source_rank: 0, tag, len: st.len, capacity: theirs.len() })
                }
            });
        }
        let spread = self.local.bcast(theirs, 0);
        got.and(spread)
    }

    /// Combines `send` of every process of the remote group with `op` into `recv` (MPI's
    /// intercommunicator `MPI_Allreduce`: each group receives the other's reduction;
    /// collective over both groups).
    ///
    /// # Errors
    /// [`Error::InvalidBuffer`] when `send` and `recv` differ in length (on that process);
    /// [`Error::InvalidOp`]; [`Error::Truncated`] when the groups pass different lengths;
    /// [`Error::PeerGone`].
    pub fn allreduce<T: Pod + Reducible>(&self, send: &[T], recv: &mut [T], op: Op) -> Result<()> {
        let tag = self.next_tag(KIND_ALLREDUCE);
        if send.len() != recv.len() {
            return Err(Error::InvalidBuffer(format!("allreduce: send has {} elements, recv {}", send.len(), recv.len())));
        }
        let mut mine = vec![T::zeroed(); send.len()];
        let root = self.local.rank() == 0;
        self.local.reduce(send, root.then_some(&mut mine[..]), op, 0)?;
        self.leaders_swap(tag, bytemuck::cast_slice(&mine), bytemuck::cast_slice_mut(recv))
    }

    /// Collects `send` of every process of the remote group, in its rank order, into `recv`
    /// (MPI's intercommunicator `MPI_Allgather`; collective over both groups): `recv` holds
    /// `remote_size() * send.len()` elements.
    ///
    /// # Errors
    /// [`Error::InvalidBuffer`] when `recv` does not hold that many; [`Error::Truncated`]
    /// when the groups pass different lengths; [`Error::PeerGone`].
    pub fn allgather<T: Pod>(&self, send: &[T], recv: &mut [T]) -> Result<()> {
        let tag = self.next_tag(KIND_ALLGATHER);
        let want = send
            .len()
            .checked_mul(self.remote_size())
            .ok_or_else(|| Error::InvalidBuffer("allgather: the receive length overflows".into()))?;
        if recv.len() != want {
            return Err(Error::InvalidBuffer(format!(
                "allgather: recv has {} elements, {} remote ranks of {} need {want}",
                recv.len(),
                self.remote_size(),
                send.len()
            )));
        }
        let root = self.local.rank() == 0;
        let mut mine = vec![T::zeroed(); if root { send.len() * self.size() } else { 0 }];
        self.local.gather(send, root.then_some(&mut mine[..]), 0)?;
        self.leaders_swap(tag, bytemuck::cast_slice(&mine), bytemuck::cast_slice_mut(recv))
    }

    /// Sends `buf` to rank `dest` of the remote group (as [`Comm::send`]).
    ///
    /// # Errors
    /// [`Error::InvalidRank`] for a rank outside the remote group; as [`Comm::send`].
    pub fn send<T: Pod>(&self, buf: &[T], dest: Rank, tag: Tag) -> Result<()> {
        self.wire.send(buf, dest, tag)
    }

    /// Synchronous send to rank `dest` of the remote group (as [`Comm::ssend`]).
    ///
    /// # Errors
    /// As [`InterComm::send`].
    pub fn ssend<T: Pod>(&self, buf: &[T], dest: Rank, tag: Tag) -> Result<()> {
        self.wire.ssend(buf, dest, tag)
    }

    /// Receives from rank `src` of the remote group, or any of them ([`crate::ANY_SOURCE`]);
    /// the status's source is a remote rank (as [`Comm::recv`]).
    ///
    /// # Errors
    /// As [`Comm::recv`], with ranks of the remote group.
    pub fn recv<T: Pod>(&self, buf: &mut [T], src: impl Into<Source>, tag: impl Into<TagMatch>) -> Result<Status> {
        self.wire.recv(buf, src, tag)
    }

    /// Receives a message of any length from the remote group (as [`Comm::recv_vec`]).
    ///
    /// # Errors
    /// As [`Comm::recv_vec`].
    pub fn recv_vec<T: Pod>(&self, src: impl Into<Source>, tag: impl Into<TagMatch>) -> Result<(Vec<T>, Status)> {
        self.wire.recv_vec(src, tag)
    }

    /// Sends to and receives from the remote group without deadlock (as [`Comm::sendrecv`]).
    ///
    /// # Errors
    /// As [`Comm::sendrecv`].
    #[allow(clippy::too_many_arguments)]
    pub fn sendrecv<T: Pod, U: Pod>(
        &self,
        sbuf: &[T],
        dest: Rank,
        stag: Tag,
        rbuf: &mut [U],
        src: impl Into<Source>,
        rtag: impl Into<TagMatch>,
    ) -> Result<Status> {
        self.wire.sendrecv(sbuf, dest, stag, rbuf, src, rtag)
    }

    /// Waits for a message from the remote group and returns its status (as [`Comm::probe`]).
    ///
    /// # Errors
    /// As [`Comm::probe`].
    pub fn probe(&self, src: impl Into<Source>, tag: impl Into<TagMatch>) -> Result<Status> {
        self.wire.probe(src, tag)
    }

    /// The status of a message from the remote group, if one is there (as [`Comm::iprobe`]).
    ///
    /// # Errors
    /// As [`Comm::iprobe`].
    pub fn iprobe(&self, src: impl Into<Source>, tag: impl Into<TagMatch>) -> Result<Option<Status>> {
        self.wire.iprobe(src, tag)
    }

    /// Starts sending `buf` to rank `dest` of the remote group (as [`Comm::isend`]).
    ///
    /// # Errors
    /// As [`Comm::isend`].
    pub fn isend<'scope, T: Pod>(&self, s: &'scope Scope<'scope, '_>, buf: &'scope [T], dest: Rank, tag: Tag) -> Result<Request<'scope>> {
        self.wire.isend(s, buf, dest, tag)
    }

    /// Starts a synchronous send to rank `dest` of the remote group (as [`Comm::issend`]).
    ///
    /// # Errors
    /// As [`Comm::issend`].
    pub fn issend<'scope, T: Pod>(&self, s: &'scope Scope<'scope, '_>, buf: &'scope [T], dest: Rank, tag: Tag) -> Result<Request<'scope>> {
        self.wire.issend(s, buf, dest, tag)
    }

    /// Starts receiving from the remote group (as [`Comm::irecv`]).
    ///
    /// # Errors
    /// As [`Comm::irecv`].
    pub fn irecv<'scope, T: Pod>(
        &self,
        s: &'scope Scope<'scope, '_>,
        buf: &'scope mut [T],
        src: impl Into<Source>,
        tag: impl Into<TagMatch>,
    ) -> Result<Request<'scope>> {
        self.wire.irecv(s, buf, src, tag)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{run_local, ANY_SOURCE, ANY_TAG};

    /// Splits `w` into the first `low` ranks and the rest, and joins them with an
    /// intercommunicator whose leaders are world ranks `0` and `low` (rank 0 of each half).
    fn halves(w: &Comm, low: usize) -> (bool, InterComm) {
        let lo = w.rank() < low;
        let half = w.split(Some(u32::from(lo)), 0).unwrap().unwrap();
        let ic = half.intercomm_create(0, w, if lo { low } else { 0 }, 5).unwrap();
        (lo, ic)
    }

    #[test]
    fn point_to_point_addresses_the_remote_group() {
        for (n, low) in [(2, 1), (3, 1), (3, 2), (4, 2), (5, 3)] {
            let got = run_local(n, |w| {
                let (lo, ic) = halves(&w, low);
                assert_eq!((ic.size(), ic.remote_size()), if lo { (low, n - low) } else { (n - low, low) });
                assert_eq!(ic.group().size(), ic.size());
                let rg = ic.remote_group();
                assert_eq!((rg.size(), rg.rank()), (ic.remote_size(), None));
                // Every rank sends its world rank to every remote rank, then receives from any
                // remote rank as many messages as there are remote ranks.
                for d in 0..ic.remote_size() {
                    ic.send(&[w.rank() as u64], d, 3).unwrap();
                }
                let mut from = Vec::new();
                for _ in 0..ic.remote_size() {
                    let mut b = [0u64];
                    let st = ic.recv(&mut b, ANY_SOURCE, ANY_TAG).unwrap();
                    // The source is a rank of the remote group, whose world rank it sent.
                    let world = if lo { low + st.source() } else { st.source() };
                    assert_eq!(b[0] as usize, world);
                    from.push(b[0]);
                }
                from.sort_unstable();
                // Out-of-range remote ranks are refused.
                assert!(matches!(ic.send(&[1u8], ic.remote_size(), 0), Err(Error::InvalidRank { .. })));
                assert!(matches!(ic.recv(&mut [0u8], ic.remote_size(), 0), Err(Error::InvalidRank { .. })));
                from
            });
            for (r, f) in got.iter().enumerate() {
                let want: Vec<u64> = if r < low { (low..n).map(|x| x as u64).collect() } else { (0..low).map(|x| x as u64).collect() };
                assert_eq!(*f, want, "{n} ranks, low {low}, rank {r}");
            }
        }
    }

    #[test]
    fn nonblocking_probe_and_sendrecv_across() {
        let got = run_local(4, |w| {
            let (_, ic) = halves(&w, 2);
            let peer = ic.rank();
            let mine = [w.rank() as u32; 3];
            let mut got = [0u32; 3];
            crate::scope(|s| {
                let r = ic.irecv(s, &mut got, peer, 7).unwrap();
                let t = ic.isend(s, &mine, peer, 7).unwrap();
                t.wait().unwrap();
                assert_eq!(r.wait().unwrap().source(), peer);
            });
            ic.send(&[w.rank() as u8], peer, 8).unwrap();
            let st = ic.probe(ANY_SOURCE, 8).unwrap();
            assert_eq!((st.source(), st.len), (peer, 1));
            let (v, _) = ic.recv_vec::<u8>(peer, 8).unwrap();
            let mut back = [0u8];
            ic.sendrecv(&v, peer, 9, &mut back, peer, 9).unwrap();
            assert!(ic.iprobe(ANY_SOURCE, ANY_TAG).unwrap().is_none());
            (got[0], v[0], back[0])
        });
        assert_eq!(got, vec![(2, 2, 0), (3, 3, 1), (0, 0, 2), (1, 1, 3)]);
    }

    #[test]
    fn merge_orders_the_groups_by_high_then_by_world_rank() {
        for (n, low) in [(2, 1), (3, 1), (4, 2), (5, 2)] {
            let got = run_local(n, |w| {
                let (lo, ic) = halves(&w, low);
                // The low half passes high = true: it comes second.
                let a = ic.merge(lo).unwrap();
                // Both pass the same: the half with world rank 0 comes first.
                let b = ic.merge(true).unwrap();
                let mut sum = [0usize];
                a.allreduce(&[w.rank()], &mut sum, Op::Sum).unwrap();
                (a.rank(), a.size(), b.rank(), sum[0])
            });
            for (r, &(ar, an, br, sum)) in got.iter().enumerate() {
                let want_a = if r < low { n - low + r } else { r - low };
                assert_eq!((ar, an, br, sum), (want_a, n, r, n * (n - 1) / 2), "{n} ranks, rank {r}");
            }
        }
    }

    #[test]
    fn barrier_bcast_and_dup_across() {
        for (n, low) in [(2, 1), (3, 2), (4, 1), (4, 3)] {
            let got = run_local(n, |w| {
                let (lo, ic) = halves(&w, low);
                ic.barrier().unwrap();
                // The low half's rank 1 (or 0) broadcasts to the high half, then the high
                // half's last rank to the low half.
                let lroot = 1.min(low - 1);
                let hroot = n - low - 1;
                let mut b = [w.rank() as u32 + 100; 2];
                let root = match (lo, ic.rank()) {
                    (true, r) if r == lroot => InterRoot::Root,
                    (true, _) => InterRoot::ProcNull,
                    (false, _) => InterRoot::Remote(lroot),
                };
                ic.bcast(&mut b, root).unwrap();
                let first = b[0];
                let d = ic.dup().unwrap();
                let root = match (lo, d.rank()) {
                    (false, r) if r == hroot => InterRoot::Root,
                    (false, _) => InterRoot::ProcNull,
                    (true, _) => InterRoot::Remote(hroot),
                };
                let mut c = [w.rank() as u32 + 200];
                d.bcast(&mut c, root).unwrap();
                d.barrier().unwrap();
                // A remote root outside the remote group is refused on that side alone.
                assert!(matches!(d.bcast(&mut c, InterRoot::Remote(d.remote_size())), Err(Error::InvalidRoot { .. })));
                (first, c[0])
            });
            let lroot = 1.min(low - 1) as u32;
            let hroot = (n - 1) as u32;
            for (r, &(first, second)) in got.iter().enumerate() {
                let r32 = r as u32;
                if r < low {
                    assert_eq!((first, second), (r32 + 100, hroot + 200), "{n}/{low} rank {r}");
                } else {
                    assert_eq!((first, second), (lroot + 100, r32 + 200), "{n}/{low} rank {r}");
                }
            }
        }
    }

    #[test]
    fn create_refuses_bad_leaders() {
        let got = run_local(4, |w| {
            let lo = w.rank() < 2;
            let half = w.split(Some(u32::from(lo)), 0).unwrap().unwrap();
            let bad_local = matches!(half.intercomm_create(2, &w, 0, 1), Err(Error::InvalidRank { rank: 2, .. }));
            let bad_tag = matches!(half.intercomm_create(0, &w, 0, TAG_UB + 1), Err(Error::InvalidTag { .. }));
            // Each leader names a remote leader outside the peer communicator, then one of its
            // own group: every rank of each group learns it.
            let out = matches!(half.intercomm_create(0, &w, 4, 1), Err(Error::InvalidRank { rank: 4, .. }));
            let own = if lo { 1 } else { 3 };
            let mine = matches!(half.intercomm_create(0, &w, own, 1), Err(Error::InvalidGroup(_)));
            // The whole world against itself: its leader is in its own group.
            let itself = matches!(w.intercomm_create(0, &w, 0, 1), Err(Error::InvalidGroup(_)));
            // And the communicators still work: a good call follows.
            let ic = half.intercomm_create(0, &w, if lo { 2 } else { 0 }, 1).unwrap();
            ic.barrier().unwrap();
            [bad_local, bad_tag, out, mine, itself]
        });
        for (r, g) in got.iter().enumerate() {
            assert!(g.iter().all(|&b| b), "rank {r}: {g:?}");
        }
    }

    /// A receive that only a departed remote rank could satisfy fails, from that rank or from
    /// `ANY_SOURCE` over the remote group, and does not wait for the local group.
    #[test]
    fn receives_from_a_departed_remote_group_fail() {
        let got = run_local(3, |w| {
            let (lo, ic) = halves(&w, 1);
            if lo {
                drop(ic);
                w.finalize().unwrap();
                return (true, true);
            }
            let any = ic.recv(&mut [0u8], ANY_SOURCE, 1);
            let one = ic.recv(&mut [0u8], 0, 1);
            (matches!(any, Err(Error::PeerGone { .. })), matches!(one, Err(Error::PeerGone { .. })))
        });
        assert_eq!(got, vec![(true, true); 3]);
    }

    #[test]
    fn allreduce_and_allgather_take_the_remote_groups_data() {
        for (n, low) in [(2, 1), (3, 1), (4, 3), (5, 2)] {
            let got = run_local(n, |w| {
                let (lo, ic) = halves(&w, low);
                let r = w.rank() as u64;
                let mut sum = [0u64; 2];
                ic.allreduce(&[r, 1], &mut sum, Op::Sum).unwrap();
                let mut all = vec![0u64; ic.remote_size() * 2];
                ic.allgather(&[r, r * 10], &mut all).unwrap();
                let bad = matches!(ic.allgather(&[r], &mut [0u64; 0]), Err(Error::InvalidBuffer(_)) if ic.remote_size() > 0);
                let bad2 = matches!(ic.allreduce(&[r], &mut [0u64; 2], Op::Sum), Err(Error::InvalidBuffer(_)));
                // The group that failed its own call alone is erroneous in MPI; here both
                // sides failed alike before any communication, so the next call pairs up.
                ic.barrier().unwrap();
                (lo, sum, all, bad && bad2)
            });
            for (r, (lo, sum, all, bad)) in got.into_iter().enumerate() {
                let remote: Vec<u64> = if lo { (low..n).map(|x| x as u64).collect() } else { (0..low).map(|x| x as u64).collect() };
                assert_eq!(sum, [remote.iter().sum::<u64>(), remote.len() as u64], "{n}/{low} rank {r}");
                let want: Vec<u64> = remote.iter().flat_map(|&x| [x, x * 10]).collect();
                assert_eq!(all, want, "{n}/{low} rank {r}");
                assert!(bad, "{n}/{low} rank {r}");
            }
        }
    }
}
