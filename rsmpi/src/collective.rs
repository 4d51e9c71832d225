//! Collective operations, reduction operations.
//!
//! Collectives that move data (broadcast, gathers, scatters, all-to-all) run on tmpi's
//! collectives over the buffers' bytes, blocking or non-blocking. Reductions with a system
//! operation on a dense buffer of one numeric type run on tmpi's typed reductions; any other
//! reduction (a user operation, `logical_xor`, `bool`, complex numbers, mixed datatypes)
//! gathers the packed contributions and combines them in rank order on each rank that needs
//! the result, which is correct for non-commutative operations too. The immediate form of such
//! a reduction starts a non-blocking gather and combines when its request completes.

use std::os::raw::{c_int, c_void};
use std::process::Command;

use crate::bytes::send_bytes;
use crate::datatype::traits::*;
use crate::datatype::{pack, DatatypeRef, DynBuffer, DynBufferMut, Prim, TypeDesc};
use crate::ffi::MPI_Datatype;
use crate::point_to_point::{detached, RecvSpace, Status};
use crate::request::{Pending, Request, Scope, StaticScope, Unpack};
use crate::topology::sealed::AsHandle;
use crate::topology::{traits::*, CommHandle, InterCommunicator, Process, Rank};
use crate::{ok, uidx, MpiError};

/// The traits of this module that `mpi::traits::*` brings in.
pub mod traits {
    pub use super::{CommunicatorCollectives, Operation, Root};
}

/// The bytes a rank contributes: the buffer's memory when dense, else a packed copy.
struct SendSide {
    ptr: *const u8,
    len: usize,
    keep: Vec<Vec<u8>>,
}

impl SendSide {
    fn new<B: Buffer + ?Sized>(b: &B) -> SendSide {
        let dt = b.as_datatype();
        let d = dt.type_desc();
        let count = uidx(b.count(), "collective");
        if d.is_dense() {
            return SendSide { ptr: b.pointer() as *const u8, len: count * d.size(), keep: Vec::new() };
        }
        // SAFETY: `Buffer` promises `count` readable elements.
        let v = unsafe { pack::pack(b.pointer() as *const u8, count, d) };
        SendSide { ptr: v.as_ptr(), len: v.len(), keep: vec![v] }
    }

    fn from_vec(v: Vec<u8>) -> SendSide {
        SendSide { ptr: v.as_ptr(), len: v.len(), keep: vec![v] }
    }

    /// # Safety
    /// The buffer the side was made from must outlive the slice.
    unsafe fn bytes<'x>(&self) -> &'x [u8] {
        if self.len == 0 {
            return &[];
        }
        // SAFETY: the user's buffer (valid for `len` bytes) or `keep`'s heap storage.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

/// Byte counts and displacements of a partitioned send buffer (packing each part if needed).
fn send_parts<P: PartitionedBuffer + ?Sized>(p: &P) -> (SendSide, Vec<usize>, Vec<usize>) {
    let dt = p.as_datatype();
    let d = dt.type_desc();
    let counts: Vec<usize> = p.counts().iter().map(|&c| uidx(c, "varcount")).collect();
    let displs: Vec<usize> = p.displs().iter().map(|&c| uidx(c, "varcount")).collect();
    if d.is_dense() {
        let end = counts.iter().zip(&displs).map(|(c, d)| c + d).max().unwrap_or(0);
        let side = SendSide { ptr: p.pointer() as *const u8, len: end * d.size(), keep: Vec::new() };
        return (side, counts.iter().map(|c| c * d.size()).collect(), displs.iter().map(|x| x * d.size()).collect());
    }
    let mut v = Vec::new();
    let mut bd = Vec::new();
    for (&c, &x) in counts.iter().zip(&displs) {
        bd.push(v.len());
        let at = (p.pointer() as *const u8).wrapping_offset(x as isize * d.extent());
        // SAFETY: the partition lies inside the buffer (checked by `Partition::new`).
        v.extend_from_slice(&unsafe { pack::pack(at, c, d) });
    }
    (SendSide::from_vec(v), counts.iter().map(|c| c * d.size()).collect(), bd)
}

/// Where a partitioned receive goes, with byte counts and displacements.
fn recv_parts<P: PartitionedBufferMut + ?Sized>(p: &mut P, call: &'static str) -> (RecvSpace, Vec<usize>, Vec<usize>) {
    let counts: Vec<usize> = p.counts().iter().map(|&c| uidx(c, call)).collect();
    let displs: Vec<usize> = p.displs().iter().map(|&c| uidx(c, call)).collect();
    let dt = p.as_datatype();
    let d = dt.type_desc();
    let base = p.pointer_mut() as *mut u8;
    if d.direct_recv() {
        let end = counts.iter().zip(&displs).map(|(c, d)| c + d).max().unwrap_or(0);
        let space = RecvSpace { ptr: base, len: end * d.size(), unpack: None };
        return (space, counts.iter().map(|c| c * d.size()).collect(), displs.iter().map(|x| x * d.size()).collect());
    }
    let total: usize = counts.iter().sum();
    let mut temp = vec![0u8; total * d.size()];
    let mut parts = Vec::new();
    let mut bd = Vec::new();
    let mut off = 0;
    for (&c, &x) in counts.iter().zip(&displs) {
        parts.push((x, c, off));
        bd.push(off);
        off += c * d.size();
    }
    let ptr = temp.as_mut_ptr();
    let unpack = Unpack { base, desc: d.clone(), temp, parts: Some(parts), count: 0, call };
    (RecvSpace { ptr, len: total * d.size(), unpack: Some(unpack) }, counts.iter().map(|c| c * d.size()).collect(), bd)
}

fn comm_of(h: &CommHandle) -> tmpi::Comm {
    h.comm.clone()
}

/// Runs a blocking data-moving collective and unpacks what it received.
fn blocking(space: RecvSpace, call: &str, f: impl FnOnce(&mut [u8]) -> tmpi::Result<()>) {
    // SAFETY: the receive buffer is borrowed for the duration of the call.
    ok(f(unsafe { space.bytes() }), call);
    let n = space.len;
    space.finish(n);
}

/// Panics (naming `call`, as a failed call does) unless `count` elements split into whole
/// blocks, one per rank of `size`: the byte lengths tmpi checks cannot see an element split
/// between two ranks' blocks.
fn whole_blocks(count: i32, size: usize, call: &str) {
    let n = uidx(count, call);
    if n % size.max(1) != 0 {
        panic!("mpi: {call} failed: {n} elements to send, not a multiple of {size} ranks");
    }
}

/// A started non-blocking collective as an rsmpi request.
fn started<'a, D: ?Sized, Sc: Scope<'a>>(
    req: tmpi::Detached,
    space: Option<RecvSpace>,
    send: Option<SendSide>,
    data: &'a D,
    scope: Sc,
) -> Request<'a, D, Sc> {
    let len = space.as_ref().map_or(0, |s| s.len);
    let p = Pending {
        reqs: vec![req],
        status: Some(Status::from_tmpi_len(len)),
        unpack: space.and_then(|s| s.unpack),
        keep: send.map(|s| s.keep).unwrap_or_default(),
        after: None,
    };
    Request::new(p, data, scope)
}

/// Collective operations on a communicator.
pub trait CommunicatorCollectives: Communicator {
    /// Waits until every rank has called it.
    fn barrier(&self) {
        ok(self.as_handle().comm.barrier(), "barrier");
    }

    /// Every rank's `sendbuf`, in rank order, into every rank's `recvbuf`.
    fn all_gather_into<S: ?Sized + Buffer, R: ?Sized + BufferMut>(&self, sendbuf: &S, recvbuf: &mut R) {
        let c = &self.as_handle().comm;
        let space = RecvSpace::new(recvbuf, "all_gather_into");
        send_bytes(sendbuf, |s| blocking(space, "all_gather_into", |r| c.allgather(s, r)));
    }

    /// Every rank's `sendbuf` into its part of every rank's partitioned `recvbuf`.
    fn all_gather_varcount_into<S: ?Sized + Buffer, R: ?Sized + PartitionedBufferMut>(&self, sendbuf: &S, recvbuf: &mut R) {
        let c = &self.as_handle().comm;
        let (space, counts, displs) = recv_parts(recvbuf, "all_gather_varcount_into");
        send_bytes(sendbuf, |s| blocking(space, "all_gather_varcount_into", |r| c.allgatherv(s, r, &counts, &displs)));
    }

    /// Block `j` of `sendbuf` to rank `j`; rank `i`'s block into block `i` of `recvbuf`.
    fn all_to_all_into<S: ?Sized + Buffer, R: ?Sized + BufferMut>(&self, sendbuf: &S, recvbuf: &mut R) {
        let c = &self.as_handle().comm;
        whole_blocks(sendbuf.count(), c.size(), "all_to_all_into");
        let space = RecvSpace::new(recvbuf, "all_to_all_into");
        send_bytes(sendbuf, |s| blocking(space, "all_to_all_into", |r| c.alltoall(s, r)));
    }

    /// [`CommunicatorCollectives::all_to_all_into`] with parts of varying size.
    fn all_to_all_varcount_into<S: ?Sized + PartitionedBuffer, R: ?Sized + PartitionedBufferMut>(&self, sendbuf: &S, recvbuf: &mut R) {
        let c = &self.as_handle().comm;
        let (send, sc, sd) = send_parts(sendbuf);
        let (space, rc, rd) = recv_parts(recvbuf, "all_to_all_varcount_into");
        // SAFETY: `sendbuf` is borrowed for the call.
        let s = unsafe { send.bytes() };
        blocking(space, "all_to_all_varcount_into", |r| c.alltoallv(s, &sc, &sd, r, &rc, &rd));
    }

    /// Combines every rank's `sendbuf` with `op` into every rank's `recvbuf`.
    fn all_reduce_into<S: ?Sized + Buffer, R: ?Sized + BufferMut, O: Operation>(&self, sendbuf: &S, recvbuf: &mut R, op: O) {
        reduce_impl(self.as_handle(), sendbuf, Some(rparts(recvbuf)), &op, Target::All, "all_reduce_into");
    }

    /// Combines with `op` and leaves block `r` of the result in rank `r`'s `recvbuf`.
    fn reduce_scatter_block_into<S: ?Sized + Buffer, R: ?Sized + BufferMut, O: Operation>(&self, sendbuf: &S, recvbuf: &mut R, op: O) {
        reduce_impl(self.as_handle(), sendbuf, Some(rparts(recvbuf)), &op, Target::ScatterBlock, "reduce_scatter_block_into");
    }

    /// Inclusive prefix reduction: rank `r` gets ranks `0..=r` combined.
    fn scan_into<S: ?Sized + Buffer, R: ?Sized + BufferMut, O: Operation>(&self, sendbuf: &S, recvbuf: &mut R, op: O) {
        reduce_impl(self.as_handle(), sendbuf, Some(rparts(recvbuf)), &op, Target::Scan, "scan_into");
    }

    /// Exclusive prefix reduction: rank `r` gets ranks `0..r` combined (rank 0's `recvbuf`
    /// is left as it is).
    fn exclusive_scan_into<S: ?Sized + Buffer, R: ?Sized + BufferMut, O: Operation>(&self, sendbuf: &S, recvbuf: &mut R, op: O) {
        reduce_impl(self.as_handle(), sendbuf, Some(rparts(recvbuf)), &op, Target::Exscan, "exclusive_scan_into");
    }

    /// Starts a barrier.
    fn immediate_barrier(&self) -> Request<'static, ()> {
        let c = comm_of(self.as_handle());
        // SAFETY: a barrier uses no user buffer.
        let req = unsafe { detached(|s| c.ibarrier(s), "immediate_barrier") };
        started(req, None, None, &(), StaticScope)
    }

    /// Starts [`CommunicatorCollectives::all_gather_into`].
    fn immediate_all_gather_into<'a, S, R, Sc>(&self, scope: Sc, sendbuf: &'a S, recvbuf: &'a mut R) -> Request<'a, R, Sc>
    where
        S: 'a + Buffer + ?Sized,
        R: 'a + BufferMut + ?Sized,
        Sc: Scope<'a>,
    {
        let c = comm_of(self.as_handle());
        let send = SendSide::new(sendbuf);
        let space = RecvSpace::new(recvbuf, "immediate_all_gather_into");
        // SAFETY: both buffers are borrowed for 'a, which the request holds; temporaries live
        // in the pending operation.
        let req = unsafe { detached(|s| c.iallgather(s, send.bytes(), space.bytes()), "immediate_all_gather_into") };
        started(req, Some(space), Some(send), recvbuf, scope)
    }

    /// Starts [`CommunicatorCollectives::all_gather_varcount_into`].
    fn immediate_all_gather_varcount_into<'a, S, R, Sc>(&self, scope: Sc, sendbuf: &'a S, recvbuf: &'a mut R) -> Request<'a, R, Sc>
    where
        S: 'a + Buffer + ?Sized,
        R: 'a + PartitionedBufferMut + ?Sized,
        Sc: Scope<'a>,
    {
        let c = comm_of(self.as_handle());
        let send = SendSide::new(sendbuf);
        let (space, counts, displs) = recv_parts(recvbuf, "immediate_all_gather_varcount_into");
        // SAFETY: as above.
        let req =
            unsafe { detached(|s| c.iallgatherv(s, send.bytes(), space.bytes(), &counts, &displs), "immediate_all_gather_varcount_into") };
        started(req, Some(space), Some(send), recvbuf, scope)
    }

    /// Starts [`CommunicatorCollectives::all_to_all_into`].
    fn immediate_all_to_all_into<'a, S, R, Sc>(&self, scope: Sc, sendbuf: &'a S, recvbuf: &'a mut R) -> Request<'a, R, Sc>
    where
        S: 'a + Buffer + ?Sized,
        R: 'a + BufferMut + ?Sized,
        Sc: Scope<'a>,
    {
        let c = comm_of(self.as_handle());
        whole_blocks(sendbuf.count(), c.size(), "immediate_all_to_all_into");
        let send = SendSide::new(sendbuf);
        let space = RecvSpace::new(recvbuf, "immediate_all_to_all_into");
        // SAFETY: as above.
        let req = unsafe { detached(|s| c.ialltoall(s, send.bytes(), space.bytes()), "immediate_all_to_all_into") };
        started(req, Some(space), Some(send), recvbuf, scope)
    }

    /// Starts [`CommunicatorCollectives::all_to_all_varcount_into`].
    fn immediate_all_to_all_varcount_into<'a, S, R, Sc>(&self, scope: Sc, sendbuf: &'a S, recvbuf: &'a mut R) -> Request<'a, R, Sc>
    where
        S: 'a + PartitionedBuffer + ?Sized,
        R: 'a + PartitionedBufferMut + ?Sized,
        Sc: Scope<'a>,
    {
        let c = comm_of(self.as_handle());
        let (send, sc, sd) = send_parts(sendbuf);
        let (space, rc, rd) = recv_parts(recvbuf, "immediate_all_to_all_varcount_into");
        // SAFETY: as above.
        let req =
            unsafe { detached(|s| c.ialltoallv(s, send.bytes(), &sc, &sd, space.bytes(), &rc, &rd), "immediate_all_to_all_varcount_into") };
        started(req, Some(space), Some(send), recvbuf, scope)
    }

    /// Starts [`CommunicatorCollectives::all_reduce_into`].
    fn immediate_all_reduce_into<'a, S, R, O, Sc>(&self, scope: Sc, sendbuf: &'a S, recvbuf: &'a mut R, op: O) -> Request<'a, R, Sc>
    where
        S: 'a + Buffer + ?Sized,
        R: 'a + BufferMut + ?Sized,
        O: 'a + Operation,
        Sc: Scope<'a>,
    {
        ireduce_impl(self.as_handle(), scope, sendbuf, recvbuf, op, Target::All, "immediate_all_reduce_into")
    }

    /// Starts [`CommunicatorCollectives::reduce_scatter_block_into`].
    fn immediate_reduce_scatter_block_into<'a, S, R, O, Sc>(
        &self,
        scope: Sc,
        sendbuf: &'a S,
        recvbuf: &'a mut R,
        op: O,
    ) -> Request<'a, R, Sc>
    where
        S: 'a + Buffer + ?Sized,
        R: 'a + BufferMut + ?Sized,
        O: 'a + Operation,
        Sc: Scope<'a>,
    {
        ireduce_impl(self.as_handle(), scope, sendbuf, recvbuf, op, Target::ScatterBlock, "immediate_reduce_scatter_block_into")
    }

    /// Starts [`CommunicatorCollectives::scan_into`].
    fn immediate_scan_into<'a, S, R, O, Sc>(&self, scope: Sc, sendbuf: &'a S, recvbuf: &'a mut R, op: O) -> Request<'a, R, Sc>
    where
        S: 'a + Buffer + ?Sized,
        R: 'a + BufferMut + ?Sized,
        O: 'a + Operation,
        Sc: Scope<'a>,
    {
        ireduce_impl(self.as_handle(), scope, sendbuf, recvbuf, op, Target::Scan, "immediate_scan_into")
    }

    /// Starts [`CommunicatorCollectives::exclusive_scan_into`].
    fn immediate_exclusive_scan_into<'a, S, R, O, Sc>(&self, scope: Sc, sendbuf: &'a S, recvbuf: &'a mut R, op: O) -> Request<'a, R, Sc>
    where
        S: 'a + Buffer + ?Sized,
        R: 'a + BufferMut + ?Sized,
        O: 'a + Operation,
        Sc: Scope<'a>,
    {
        ireduce_impl(self.as_handle(), scope, sendbuf, recvbuf, op, Target::Exscan, "immediate_exclusive_scan_into")
    }
}

impl<C: Communicator + ?Sized> CommunicatorCollectives for C {}

fn root_of<R: Root + ?Sized>(r: &R) -> usize {
    uidx(r.root_rank(), "root")
}

/// Collective operations with a root process.
pub trait Root: AsCommunicator {
    /// The root's rank.
    fn root_rank(&self) -> Rank;

    /// The root's `buffer` into every rank's `buffer`.
    fn broadcast_into<Buf: ?Sized + BufferMut>(&self, buffer: &mut Buf) {
        let c = &self.as_communicator().as_handle().comm;
        let root = root_of(self);
        let space = bcast_space(buffer, c.rank() == root, "broadcast_into");
        blocking(space, "broadcast_into", |b| c.bcast(b, root));
    }

    /// Sends `sendbuf` to the root's gather (non-root side).
    fn gather_into<S: ?Sized + Buffer>(&self, sendbuf: &S) {
        let c = &self.as_communicator().as_handle().comm;
        send_bytes(sendbuf, |s| ok(c.gather(s, None, root_of(self)), "gather_into"));
    }

    /// Collects every rank's `sendbuf` into `recvbuf` in rank order (root side).
    fn gather_into_root<S: ?Sized + Buffer, R: ?Sized + BufferMut>(&self, sendbuf: &S, recvbuf: &mut R) {
        let c = &self.as_communicator().as_handle().comm;
        let space = RecvSpace::new(recvbuf, "gather_into_root");
        send_bytes(sendbuf, |s| blocking(space, "gather_into_root", |r| c.gather(s, Some(r), root_of(self))));
    }

    /// Sends `sendbuf` to the root's varcount gather (non-root side).
    fn gather_varcount_into<S: ?Sized + Buffer>(&self, sendbuf: &S) {
        let c = &self.as_communicator().as_handle().comm;
        send_bytes(sendbuf, |s| ok(c.gatherv(s, None, &[], &[], root_of(self)), "gather_varcount_into"));
    }

    /// Collects every rank's `sendbuf` into its part of `recvbuf` (root side).
    fn gather_varcount_into_root<S: ?Sized + Buffer, R: ?Sized + PartitionedBufferMut>(&self, sendbuf: &S, recvbuf: &mut R) {
        let c = &self.as_communicator().as_handle().comm;
        let (space, counts, displs) = recv_parts(recvbuf, "gather_varcount_into_root");
        send_bytes(sendbuf, |s| blocking(space, "gather_varcount_into_root", |r| c.gatherv(s, Some(r), &counts, &displs, root_of(self))));
    }

    /// Receives this rank's block of the root's scatter (non-root side).
    fn scatter_into<R: ?Sized + BufferMut>(&self, recvbuf: &mut R) {
        let c = &self.as_communicator().as_handle().comm;
        let space = RecvSpace::new(recvbuf, "scatter_into");
        blocking(space, "scatter_into", |r| c.scatter(None, r, root_of(self)));
    }

    /// Block `r` of `sendbuf` to rank `r` (root side).
    fn scatter_into_root<S: ?Sized + Buffer, R: ?Sized + BufferMut>(&self, sendbuf: &S, recvbuf: &mut R) {
        let c = &self.as_communicator().as_handle().comm;
        let space = RecvSpace::new(recvbuf, "scatter_into_root");
        send_bytes(sendbuf, |s| blocking(space, "scatter_into_root", |r| c.scatter(Some(s), r, root_of(self))));
    }

    /// Receives this rank's part of the root's varcount scatter (non-root side).
    fn scatter_varcount_into<R: ?Sized + BufferMut>(&self, recvbuf: &mut R) {
        let c = &self.as_communicator().as_handle().comm;
        let space = RecvSpace::new(recvbuf, "scatter_varcount_into");
        blocking(space, "scatter_varcount_into", |r| c.scatterv(None, &[], &[], r, root_of(self)));
    }

    /// Part `r` of `sendbuf` to rank `r` (root side).
    fn scatter_varcount_into_root<S: ?Sized + PartitionedBuffer, R: ?Sized + BufferMut>(&self, sendbuf: &S, recvbuf: &mut R) {
        let c = &self.as_communicator().as_handle().comm;
        let (send, counts, displs) = send_parts(sendbuf);
        let space = RecvSpace::new(recvbuf, "scatter_varcount_into_root");
        // SAFETY: `sendbuf` is borrowed for the call.
        let s = unsafe { send.bytes() };
        blocking(space, "scatter_varcount_into_root", |r| c.scatterv(Some(s), &counts, &displs, r, root_of(self)));
    }

    /// Contributes `sendbuf` to the root's reduction (non-root side).
    fn reduce_into<S: ?Sized + Buffer, O: Operation>(&self, sendbuf: &S, op: O) {
        reduce_impl(self.as_communicator().as_handle(), sendbuf, None, &op, Target::Root(root_of(self)), "reduce_into");
    }

    /// Combines every rank's `sendbuf` with `op` into `recvbuf` (root side).
    fn reduce_into_root<S: ?Sized + Buffer, R: ?Sized + BufferMut, O: Operation>(&self, sendbuf: &S, recvbuf: &mut R, op: O) {
        reduce_impl(
            self.as_communicator().as_handle(),
            sendbuf,
            Some(rparts(recvbuf)),
            &op,
            Target::Root(root_of(self)),
            "reduce_into_root",
        );
    }

    /// Starts [`Root::broadcast_into`].
    fn immediate_broadcast_into<'a, Buf, Sc>(&self, scope: Sc, buf: &'a mut Buf) -> Request<'a, Buf, Sc>
    where
        Buf: 'a + BufferMut + ?Sized,
        Sc: Scope<'a>,
    {
        let c = comm_of(self.as_communicator().as_handle());
        let root = root_of(self);
        let space = bcast_space(buf, c.rank() == root, "immediate_broadcast_into");
        // SAFETY: `buf` is borrowed for 'a (held by the request); temporaries live in it.
        let req = unsafe { detached(|s| c.ibcast(s, space.bytes(), root), "immediate_broadcast_into") };
        started(req, Some(space), None, buf, scope)
    }

    /// Starts [`Root::gather_into`].
    fn immediate_gather_into<'a, S, Sc>(&self, scope: Sc, sendbuf: &'a S) -> Request<'a, S, Sc>
    where
        S: 'a + Buffer + ?Sized,
        Sc: Scope<'a>,
    {
        let c = comm_of(self.as_communicator().as_handle());
        let send = SendSide::new(sendbuf);
        let root = root_of(self);
        // SAFETY: as above.
        let req = unsafe { detached(|s| c.igather(s, send.bytes(), None, root), "immediate_gather_into") };
        started(req, None, Some(send), sendbuf, scope)
    }

    /// Starts [`Root::gather_into_root`].
    fn immediate_gather_into_root<'a, S, R, Sc>(&self, scope: Sc, sendbuf: &'a S, recvbuf: &'a mut R) -> Request<'a, R, Sc>
    where
        S: 'a + Buffer + ?Sized,
        R: 'a + BufferMut + ?Sized,
        Sc: Scope<'a>,
    {
        let c = comm_of(self.as_communicator().as_handle());
        let send = SendSide::new(sendbuf);
        let space = RecvSpace::new(recvbuf, "immediate_gather_into_root");
        let root = root_of(self);
        // SAFETY: as above.
        let req = unsafe { detached(|s| c.igather(s, send.bytes(), Some(space.bytes()), root), "immediate_gather_into_root") };
        started(req, Some(space), Some(send), recvbuf, scope)
    }

    /// Starts [`Root::gather_varcount_into`].
    fn immediate_gather_varcount_into<'a, Sc, S>(&self, scope: Sc, sendbuf: &'a S) -> Request<'a, S, Sc>
    where
        S: 'a + Buffer + ?Sized,
        Sc: Scope<'a>,
    {
        let c = comm_of(self.as_communicator().as_handle());
        let send = SendSide::new(sendbuf);
        let root = root_of(self);
        // SAFETY: as above.
        let req = unsafe { detached(|s| c.igatherv(s, send.bytes(), None, &[], &[], root), "immediate_gather_varcount_into") };
        started(req, None, Some(send), sendbuf, scope)
    }

    /// Starts [`Root::gather_varcount_into_root`].
    fn immediate_gather_varcount_into_root<'a, Sc, S, R>(&self, scope: Sc, sendbuf: &'a S, recvbuf: &'a mut R) -> Request<'a, R, Sc>
    where
        S: 'a + Buffer + ?Sized,
        R: 'a + PartitionedBufferMut + ?Sized,
        Sc: Scope<'a>,
    {
        let c = comm_of(self.as_communicator().as_handle());
        let send = SendSide::new(sendbuf);
        let (space, counts, displs) = recv_parts(recvbuf, "immediate_gather_varcount_into_root");
        let root = root_of(self);
        // SAFETY: as above.
        let req = unsafe {
            detached(|s| c.igatherv(s, send.bytes(), Some(space.bytes()), &counts, &displs, root), "immediate_gather_varcount_into_root")
        };
        started(req, Some(space), Some(send), recvbuf, scope)
    }

    /// Starts [`Root::scatter_into`].
    fn immediate_scatter_into<'a, Sc, R>(&self, scope: Sc, recvbuf: &'a mut R) -> Request<'a, R, Sc>
    where
        R: 'a + BufferMut + ?Sized,
        Sc: Scope<'a>,
    {
        let c = comm_of(self.as_communicator().as_handle());
        let space = RecvSpace::new(recvbuf, "immediate_scatter_into");
        let root = root_of(self);
        // SAFETY: as above.
        let req = unsafe { detached(|s| c.iscatter(s, None, space.bytes(), root), "immediate_scatter_into") };
        started(req, Some(space), None, recvbuf, scope)
    }

    /// Starts [`Root::scatter_into_root`].
    fn immediate_scatter_into_root<'a, Sc, S, R>(&self, scope: Sc, sendbuf: &'a S, recvbuf: &'a mut R) -> Request<'a, R, Sc>
    where
        S: 'a + Buffer + ?Sized,
        R: 'a + BufferMut + ?Sized,
        Sc: Scope<'a>,
    {
        let c = comm_of(self.as_communicator().as_handle());
        let send = SendSide::new(sendbuf);
        let space = RecvSpace::new(recvbuf, "immediate_scatter_into_root");
        let root = root_of(self);
        // SAFETY: as above.
        let req = unsafe { detached(|s| c.iscatter(s, Some(send.bytes()), space.bytes(), root), "immediate_scatter_into_root") };
        started(req, Some(space), Some(send), recvbuf, scope)
    }

    /// Starts [`Root::scatter_varcount_into`].
    fn immediate_scatter_varcount_into<'a, Sc, R>(&self, scope: Sc, recvbuf: &'a mut R) -> Request<'a, R, Sc>
    where
        R: 'a + BufferMut + ?Sized,
        Sc: Scope<'a>,
    {
        let c = comm_of(self.as_communicator().as_handle());
        let space = RecvSpace::new(recvbuf, "immediate_scatter_varcount_into");
        let root = root_of(self);
        // SAFETY: as above.
        let req = unsafe { detached(|s| c.iscatterv(s, None, &[], &[], space.bytes(), root), "immediate_scatter_varcount_into") };
        started(req, Some(space), None, recvbuf, scope)
    }

    /// Starts [`Root::scatter_varcount_into_root`].
    fn immediate_scatter_varcount_into_root<'a, Sc, S, R>(&self, scope: Sc, sendbuf: &'a S, recvbuf: &'a mut R) -> Request<'a, R, Sc>
    where
        S: 'a + PartitionedBuffer + ?Sized,
        R: 'a + BufferMut + ?Sized,
        Sc: Scope<'a>,
    {
        let c = comm_of(self.as_communicator().as_handle());
        let (send, counts, displs) = send_parts(sendbuf);
        let space = RecvSpace::new(recvbuf, "immediate_scatter_varcount_into_root");
        let root = root_of(self);
        // SAFETY: as above.
        let req = unsafe {
            detached(|s| c.iscatterv(s, Some(send.bytes()), &counts, &displs, space.bytes(), root), "immediate_scatter_varcount_into_root")
        };
        started(req, Some(space), Some(send), recvbuf, scope)
    }

    /// Starts [`Root::reduce_into`].
    fn immediate_reduce_into<'a, Sc, S, O>(&self, scope: Sc, sendbuf: &'a S, op: O) -> Request<'a, S, Sc>
    where
        S: 'a + Buffer + ?Sized,
        O: 'a + Operation,
        Sc: Scope<'a>,
    {
        let h = self.as_communicator().as_handle();
        let root = root_of(self);
        let p = match native_ireduce(h, sendbuf, None, &op, Target::Root(root)) {
            Some(p) => p,
            // SAFETY: no receive buffer; the request made here lives within 'a.
            None => unsafe { generic_ireduce(h, sendbuf, None, op, Target::Root(root), "immediate_reduce_into") },
        };
        Request::new(p, sendbuf, scope)
    }

    /// Starts [`Root::reduce_into_root`].
    fn immediate_reduce_into_root<'a, Sc, S, R, O>(&self, scope: Sc, sendbuf: &'a S, recvbuf: &'a mut R, op: O) -> Request<'a, R, Sc>
    where
        S: 'a + Buffer + ?Sized,
        R: 'a + BufferMut + ?Sized,
        O: 'a + Operation,
        Sc: Scope<'a>,
    {
        ireduce_impl(
            self.as_communicator().as_handle(),
            scope,
            sendbuf,
            recvbuf,
            op,
            Target::Root(root_of(self)),
            "immediate_reduce_into_root",
        )
    }

    /// Starts `maxprocs` processes running `command` (`MPI_Comm_spawn`, through `tmpirun`);
    /// on failure prints tmpi's reason and returns [`MpiError::Spawn`] with 0 started.
    fn spawn(&self, command: &Command, maxprocs: Rank) -> Result<InterCommunicator, MpiError> {
        self.spawn_multiple(std::slice::from_ref(command), &[maxprocs])
    }

    /// Starts several commands as one job (`MPI_Comm_spawn_multiple`), as [`Root::spawn`].
    fn spawn_multiple(&self, commands: &[Command], maxprocs: &[Rank]) -> Result<InterCommunicator, MpiError> {
        let total = maxprocs.iter().sum();
        let procs: Vec<usize> = maxprocs.iter().map(|&n| usize::try_from(n).unwrap_or(0)).collect();
        let comm = &self.as_communicator().as_handle().comm;
        match comm.spawn_multiple(root_of(self), commands, &procs) {
            Ok(ic) => Ok(InterCommunicator::new(ic)),
            Err(e) => {
                eprintln!("mpi: spawn: {e}");
                Err(MpiError::Spawn(0, total))
            }
        }
    }
}

impl Root for Process<'_> {
    fn root_rank(&self) -> Rank {
        self.rank()
    }
}

/// The space a broadcast moves through: the buffer itself when dense, else a temporary that
/// holds the root's packed data (and is unpacked everywhere afterwards).
fn bcast_space<B: BufferMut + ?Sized>(buf: &mut B, root: bool, call: &'static str) -> RecvSpace {
    let dt = buf.as_datatype();
    let d = dt.type_desc();
    let count = uidx(buf.count(), call);
    let base = buf.pointer_mut() as *mut u8;
    let space = RecvSpace::with(base, count, d, call);
    if root && space.unpack.is_some() {
        // SAFETY: the root's buffer holds `count` readable elements; the temporary has room
        // for them packed.
        unsafe { pack::pack_into(base, count, d, space.bytes()) };
    }
    space
}

// ---------------------------------------------------------------------------------------------
// Reductions
// ---------------------------------------------------------------------------------------------

/// A system operation.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum SysOp {
    Max,
    Min,
    Sum,
    Prod,
    LAnd,
    BAnd,
    LOr,
    BOr,
    LXor,
    BXor,
}

/// The signature of an [`UnsafeUserOperation`]'s function (MPI's `MPI_User_function`).
pub type UnsafeUserFunction = unsafe extern "C" fn(*mut c_void, *mut c_void, *mut c_int, *mut MPI_Datatype);

/// What an operation does.
#[doc(hidden)]
pub enum OpKind<'a> {
    Sys(SysOpHandle),
    User(&'a (dyn Fn(DynBuffer<'_>, DynBufferMut<'_>) + Sync + 'a)),
    Unsafe(UnsafeUserFunction),
}

/// A system operation, opaque.
#[doc(hidden)]
#[derive(Copy, Clone, Debug)]
pub struct SysOpHandle(SysOp);

/// A reduction operation.
pub trait Operation {
    /// What the operation does.
    #[doc(hidden)]
    fn kind(&self) -> OpKind<'_>;
    /// Whether operands may be combined in any order.
    fn is_commutative(&self) -> bool;
}

impl<T: Operation + ?Sized> Operation for &T {
    fn kind(&self) -> OpKind<'_> {
        (**self).kind()
    }
    fn is_commutative(&self) -> bool {
        (**self).is_commutative()
    }
}

/// A predefined operation.
#[derive(Copy, Clone, Debug)]
pub struct SystemOperation(SysOp);

impl SystemOperation {
    /// The larger operand.
    pub fn max() -> Self {
        SystemOperation(SysOp::Max)
    }
    /// The smaller operand.
    pub fn min() -> Self {
        SystemOperation(SysOp::Min)
    }
    /// The sum.
    pub fn sum() -> Self {
        SystemOperation(SysOp::Sum)
    }
    /// The product.
    pub fn product() -> Self {
        SystemOperation(SysOp::Prod)
    }
    /// Logical and.
    pub fn logical_and() -> Self {
        SystemOperation(SysOp::LAnd)
    }
    /// Bitwise and.
    pub fn bitwise_and() -> Self {
        SystemOperation(SysOp::BAnd)
    }
    /// Logical or.
    pub fn logical_or() -> Self {
        SystemOperation(SysOp::LOr)
    }
    /// Bitwise or.
    pub fn bitwise_or() -> Self {
        SystemOperation(SysOp::BOr)
    }
    /// Logical exclusive or.
    pub fn logical_xor() -> Self {
        SystemOperation(SysOp::LXor)
    }
    /// Bitwise exclusive or.
    pub fn bitwise_xor() -> Self {
        SystemOperation(SysOp::BXor)
    }
}

impl Operation for SystemOperation {
    fn kind(&self) -> OpKind<'_> {
        OpKind::Sys(SysOpHandle(self.0))
    }
    fn is_commutative(&self) -> bool {
        true
    }
}

/// A reduction operation defined by a closure over whole buffers (`inoutvec = invec op
/// inoutvec`).
#[cfg(feature = "user-operations")]
pub struct UserOperation<'a> {
    commute: bool,
    f: Box<dyn Fn(DynBuffer<'_>, DynBufferMut<'_>) + Sync + 'a>,
}

#[cfg(feature = "user-operations")]
impl std::fmt::Debug for UserOperation<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UserOperation").field("commutative", &self.commute).finish()
    }
}

#[cfg(feature = "user-operations")]
impl<'a> UserOperation<'a> {
    /// An associative (not necessarily commutative) operation.
    pub fn associative<F: Fn(DynBuffer<'_>, DynBufferMut<'_>) + Sync + 'a>(function: F) -> Self {
        Self::new(false, function)
    }
    /// A commutative operation.
    pub fn commutative<F: Fn(DynBuffer<'_>, DynBufferMut<'_>) + Sync + 'a>(function: F) -> Self {
        Self::new(true, function)
    }
    /// An operation, commutative or not.
    pub fn new<F: Fn(DynBuffer<'_>, DynBufferMut<'_>) + Sync + 'a>(commute: bool, function: F) -> Self {
        UserOperation { commute, f: Box::new(function) }
    }
}

#[cfg(feature = "user-operations")]
impl Operation for UserOperation<'_> {
    fn kind(&self) -> OpKind<'_> {
        OpKind::User(&*self.f)
    }
    fn is_commutative(&self) -> bool {
        self.commute
    }
}

/// A reduction operation defined by a C-style function (`MPI_Op_create`).
#[derive(Debug)]
pub struct UnsafeUserOperation {
    commute: bool,
    f: UnsafeUserFunction,
}

impl UnsafeUserOperation {
    /// An associative operation.
    ///
    /// # Safety
    /// `function` must combine `*len` elements of the datatype at its first argument into
    /// those at its second, reading and writing nothing else.
    pub unsafe fn associative(function: UnsafeUserFunction) -> Self {
        UnsafeUserOperation { commute: false, f: function }
    }
    /// A commutative operation.
    ///
    /// # Safety
    /// As [`UnsafeUserOperation::associative`].
    pub unsafe fn commutative(function: UnsafeUserFunction) -> Self {
        UnsafeUserOperation { commute: true, f: function }
    }
    /// An operation, commutative or not.
    ///
    /// # Safety
    /// As [`UnsafeUserOperation::associative`].
    pub unsafe fn new(commute: bool, function: UnsafeUserFunction) -> Self {
        UnsafeUserOperation { commute, f: function }
    }
}

impl Operation for UnsafeUserOperation {
    fn kind(&self) -> OpKind<'_> {
        OpKind::Unsafe(self.f)
    }
    fn is_commutative(&self) -> bool {
        self.commute
    }
}

/// Combines `inbuf` into `inoutbuf` locally (`MPI_Reduce_local`).
pub fn reduce_local_into<S: ?Sized + Buffer, R: ?Sized + BufferMut, O: Operation>(inbuf: &S, inoutbuf: &mut R, op: O) {
    let dt = inoutbuf.as_datatype();
    let d = dt.type_desc().clone();
    let count = uidx(inoutbuf.count(), "reduce_local_into");
    let a = crate::bytes::owned_bytes(inbuf);
    // SAFETY: `inoutbuf` holds `count` readable elements of its datatype.
    let mut b = unsafe { pack::pack(inoutbuf.pointer_mut() as *const u8, count, &d) };
    assert!(a.len() == b.len(), "mpi: reduce_local_into: buffers of {} and {} bytes", a.len(), b.len());
    combine(&op.kind(), &d, count, &a, &mut b, "reduce_local_into");
    // SAFETY: `inoutbuf` holds `count` writable elements of its datatype.
    unsafe { pack::unpack(&b, inoutbuf.pointer_mut() as *mut u8, count, &d, "reduce_local_into") };
}

/// `inout = in op inout` over `count` packed elements of `d`.
fn combine(op: &OpKind<'_>, d: &TypeDesc, count: usize, inb: &[u8], io: &mut [u8], call: &str) {
    match op {
        OpKind::Sys(SysOpHandle(s)) => {
            let p = d.prim.unwrap_or_else(|| panic!("mpi: {call}: a predefined operation needs a datatype of one primitive type"));
            sys_combine(*s, p, inb, io, call);
        }
        OpKind::User(f) => with_layout(d, count, inb, io, |a, b| {
            // SAFETY: `a` and `b` are aligned temporaries holding `count` elements of `d`.
            let (x, y) = unsafe {
                (
                    DynBuffer::from_raw(a as *const u8, crate::iidx(count), DatatypeRef::of(d)),
                    DynBufferMut::from_raw(b, crate::iidx(count), DatatypeRef::of(d)),
                )
            };
            f(x, y);
        }),
        OpKind::Unsafe(f) => with_layout(d, count, inb, io, |a, b| {
            let mut len = crate::iidx(count);
            let mut raw = d.raw();
            // SAFETY: the function was promised (at `UnsafeUserOperation`'s construction) to
            // touch `len` elements of the datatype at each pointer, which hold that many.
            unsafe { f(a as *mut c_void, b as *mut c_void, &mut len, &mut raw) };
        }),
    }
}

/// Lays packed operands out as the datatype describes them (in aligned memory), runs `f` on
/// them and packs the result back into `io`.
fn with_layout(d: &TypeDesc, count: usize, inb: &[u8], io: &mut [u8], f: impl FnOnce(*mut u8, *mut u8)) {
    let span = if count == 0 { 0 } else { (count as isize * d.extent()) as usize + d.extent().unsigned_abs() };
    let words = span.div_ceil(16) + 1;
    let mut a = vec![0u128; words];
    let mut b = vec![0u128; words];
    let shift = (-d.lb()).max(0) as usize;
    let pa = (a.as_mut_ptr() as *mut u8).wrapping_add(shift);
    let pb = (b.as_mut_ptr() as *mut u8).wrapping_add(shift);
    // SAFETY: each temporary spans `count` elements of `d` starting `shift` bytes in (so runs
    // at negative offsets down to `lb` stay inside).
    unsafe {
        pack::unpack(inb, pa, count, d, "reduction");
        pack::unpack(io, pb, count, d, "reduction");
    }
    f(pa, pb);
    // SAFETY: as above.
    unsafe { pack::pack_into(pb, count, d, io) };
}

/// `io[k] = y op x[k]` over the elements of type `$t` in `$inb` (x) and `$io` (y), each
/// element by the expression `$e` of `$x` and `$y`.
macro_rules! combine_each {
    ($inb:expr, $io:expr, $t:ty, |$x:ident, $y:ident| $e:expr) => {{
        const N: usize = std::mem::size_of::<$t>();
        for (a, b) in $inb.chunks_exact(N).zip($io.chunks_exact_mut(N)) {
            let $x = <$t>::from_ne_bytes(a.try_into().expect("chunk of N"));
            let $y = <$t>::from_ne_bytes((&*b).try_into().expect("chunk of N"));
            let r: $t = $e;
            b.copy_from_slice(&r.to_ne_bytes());
        }
    }};
}

/// [`combine_each`] of integers of type `$t` by operator `$op` (every operator applies).
macro_rules! combine_int {
    ($op:expr, $inb:expr, $io:expr, $t:ty) => {{
        use SysOp::*;
        combine_each!($inb, $io, $t, |x, y| match $op {
            Max => x.max(y),
            Min => x.min(y),
            Sum => x.wrapping_add(y),
            Prod => x.wrapping_mul(y),
            BAnd => x & y,
            BOr => x | y,
            BXor => x ^ y,
            LAnd => <$t>::from((x != 0) && (y != 0)),
            LOr => <$t>::from((x != 0) || (y != 0)),
            LXor => <$t>::from((x != 0) != (y != 0)),
        })
    }};
}

/// [`combine_each`] of floats of type `$t`: arithmetic operators only (others panic, as
/// rsmpi's do, naming `$call`).
macro_rules! combine_float {
    ($op:expr, $inb:expr, $io:expr, $t:ty, $call:expr) => {{
        use SysOp::*;
        combine_each!($inb, $io, $t, |x, y| match $op {
            Max => x.max(y),
            Min => x.min(y),
            Sum => x + y,
            Prod => x * y,
            op => panic!("mpi: {}: {op:?} is not defined for floating-point numbers", $call),
        })
    }};
}

fn sys_combine(op: SysOp, p: Prim, inb: &[u8], io: &mut [u8], call: &str) {
    match p {
        Prim::I8 => combine_int!(op, inb, io, i8),
        Prim::I16 => combine_int!(op, inb, io, i16),
        Prim::I32 => combine_int!(op, inb, io, i32),
        Prim::I64 => combine_int!(op, inb, io, i64),
        Prim::U8 => combine_int!(op, inb, io, u8),
        Prim::U16 => combine_int!(op, inb, io, u16),
        Prim::U32 => combine_int!(op, inb, io, u32),
        Prim::U64 => combine_int!(op, inb, io, u64),
        Prim::F32 => combine_float!(op, inb, io, f32, call),
        Prim::F64 => combine_float!(op, inb, io, f64, call),
        Prim::Bool => combine_each!(inb, io, u8, |x, y| match op {
            SysOp::LAnd => u8::from(x != 0 && y != 0),
            SysOp::LOr => u8::from(x != 0 || y != 0),
            SysOp::LXor => u8::from((x != 0) != (y != 0)),
            _ => panic!("mpi: {call}: {op:?} is not defined for bool"),
        }),
        Prim::C32 => complex_combine::<4>(op, inb, io, call),
        Prim::C64 => complex_combine::<8>(op, inb, io, call),
    }
}

fn complex_combine<const W: usize>(op: SysOp, inb: &[u8], io: &mut [u8], call: &str) {
    fn rd<const W: usize>(b: &[u8]) -> f64 {
        if W == 4 {
            f64::from(f32::from_ne_bytes(b.try_into().expect("4 bytes")))
        } else {
            f64::from_ne_bytes(b.try_into().expect("8 bytes"))
        }
    }
    fn wr<const W: usize>(b: &mut [u8], v: f64) {
        if W == 4 {
            b.copy_from_slice(&(v as f32).to_ne_bytes());
        } else {
            b.copy_from_slice(&v.to_ne_bytes());
        }
    }
    for (a, b) in inb.chunks_exact(2 * W).zip(io.chunks_exact_mut(2 * W)) {
        let (ar, ai) = (rd::<W>(&a[..W]), rd::<W>(&a[W..]));
        let (br, bi) = (rd::<W>(&b[..W]), rd::<W>(&b[W..]));
        let (r, i) = match op {
            SysOp::Sum => (ar + br, ai + bi),
            SysOp::Prod => (ar * br - ai * bi, ar * bi + ai * br),
            _ => panic!("mpi: {call}: {op:?} is not defined for complex numbers"),
        };
        wr::<W>(&mut b[..W], r);
        wr::<W>(&mut b[W..], i);
    }
}

/// Which ranks get what of a reduction.
#[derive(Copy, Clone, Debug)]
enum Target {
    Root(usize),
    All,
    ScatterBlock,
    Scan,
    Exscan,
}

/// A receive buffer's address, element count and type map.
type RParts = (*mut u8, usize, TypeDesc);

fn rparts<B: BufferMut + ?Sized>(b: &mut B) -> RParts {
    let dt = b.as_datatype();
    let d = dt.type_desc().clone();
    (b.pointer_mut() as *mut u8, uidx(b.count(), "reduction"), d)
}

fn tmpi_op(s: SysOp) -> Option<tmpi::Op> {
    Some(match s {
        SysOp::Max => tmpi::Op::Max,
        SysOp::Min => tmpi::Op::Min,
        SysOp::Sum => tmpi::Op::Sum,
        SysOp::Prod => tmpi::Op::Prod,
        SysOp::LAnd => tmpi::Op::LogicalAnd,
        SysOp::BAnd => tmpi::Op::BitAnd,
        SysOp::LOr => tmpi::Op::LogicalOr,
        SysOp::BOr => tmpi::Op::BitOr,
        SysOp::BXor => tmpi::Op::BitXor,
        SysOp::LXor => return None,
    })
}

/// Calls `$body` with `$t` bound to the Rust type of a numeric primitive.
macro_rules! with_num {
    ($p:expr, $t:ident => $body:expr, else $other:expr) => {
        match $p {
            Prim::I8 => {
                type $t = i8;
                $body
            }
            Prim::I16 => {
                type $t = i16;
                $body
            }
            Prim::I32 => {
                type $t = i32;
                $body
            }
            Prim::I64 => {
                type $t = i64;
                $body
            }
            Prim::U8 => {
                type $t = u8;
                $body
            }
            Prim::U16 => {
                type $t = u16;
                $body
            }
            Prim::U32 => {
                type $t = u32;
                $body
            }
            Prim::U64 => {
                type $t = u64;
                $body
            }
            Prim::F32 => {
                type $t = f32;
                $body
            }
            Prim::F64 => {
                type $t = f64;
                $body
            }
            _ => $other,
        }
    };
}

/// Typed views of byte slices for tmpi's reductions, if aligned.
fn typed<T: tmpi::Reducible>(b: &[u8]) -> Option<&[T]> {
    if (b.as_ptr() as usize) % std::mem::align_of::<T>() != 0 || b.len() % std::mem::size_of::<T>() != 0 {
        return None;
    }
    // SAFETY: aligned, a whole number of T, and every bit pattern is a valid T (Pod).
    Some(unsafe { std::slice::from_raw_parts(b.as_ptr() as *const T, b.len() / std::mem::size_of::<T>()) })
}

fn typed_mut<T: tmpi::Reducible>(b: &mut [u8]) -> Option<&mut [T]> {
    if (b.as_ptr() as usize) % std::mem::align_of::<T>() != 0 || b.len() % std::mem::size_of::<T>() != 0 {
        return None;
    }
    // SAFETY: as above, borrowed mutably.
    Some(unsafe { std::slice::from_raw_parts_mut(b.as_mut_ptr() as *mut T, b.len() / std::mem::size_of::<T>()) })
}

/// Whether a reduction can run on tmpi's typed reductions: its op and numeric primitive.
fn native_plan(op: &OpKind<'_>, send: &TypeDesc, recv: Option<&TypeDesc>) -> Option<(tmpi::Op, Prim)> {
    let OpKind::Sys(SysOpHandle(s)) = op else { return None };
    let p = send.prim?;
    let op = tmpi_op(*s)?;
    let float = matches!(p, Prim::F32 | Prim::F64);
    let bitwise = matches!(op, tmpi::Op::BitAnd | tmpi::Op::BitOr | tmpi::Op::BitXor);
    if !send.is_dense() || recv.is_some_and(|r| !r.direct_recv() || r.prim != Some(p)) || (float && bitwise) {
        return None;
    }
    Some((op, p))
}

/// A reduction on tmpi's typed collectives; false if the buffers are not aligned for it.
fn native_reduce(c: &tmpi::Comm, op: tmpi::Op, p: Prim, s: &[u8], r: Option<&mut [u8]>, t: Target, call: &str) -> bool {
    with_num!(p, T => {
        let Some(s) = typed::<T>(s) else { return false };
        let r = match r {
            Some(r) => match typed_mut::<T>(r) {
                Some(r) => Some(r),
                None => return false,
            },
            None => None,
        };
        let res = match (t, r) {
            (Target::Root(root), r) => c.reduce(s, r, op, root),
            (Target::All, Some(r)) => c.allreduce(s, r, op),
            (Target::ScatterBlock, Some(r)) => c.reduce_scatter_block(s, r, op),
            (Target::Scan, Some(r)) => c.scan(s, r, op),
            (Target::Exscan, Some(r)) => c.exscan(s, r, op),
            _ => return false,
        };
        ok(res, call);
        true
    }, else false)
}

fn reduce_impl<S: Buffer + ?Sized>(h: &CommHandle, sendbuf: &S, recv: Option<RParts>, op: &dyn Operation, t: Target, call: &'static str) {
    let c = &h.comm;
    let kind = op.kind();
    let sdt = sendbuf.as_datatype();
    let sd = sdt.type_desc();
    let scount = uidx(sendbuf.count(), call);
    if let Some((op_t, p)) = native_plan(&kind, sd, recv.as_ref().map(|r| &r.2)) {
        let done = send_bytes(sendbuf, |s| match &recv {
            Some((base, n, d)) => {
                // SAFETY: the receive buffer holds `n` writable dense elements.
                let r = unsafe { std::slice::from_raw_parts_mut(*base, n * d.size()) };
                native_reduce(c, op_t, p, s, Some(r), t, call)
            }
            None => native_reduce(c, op_t, p, s, None, t, call),
        });
        if done {
            return;
        }
    }
    let mine = crate::bytes::owned_bytes(sendbuf);
    let result = generic_reduce(c, &kind, sd, scount, &mine, t, call);
    if let (Some(res), Some((base, n, d))) = (result, recv) {
        // SAFETY: the receive buffer holds `n` writable elements of `d`.
        unsafe { pack::unpack(&res, base, n, &d, call) };
    }
}

/// Gathers the packed contributions and combines them in rank order where the result is
/// needed; returns this rank's result bytes (None where it gets none).
fn generic_reduce(c: &tmpi::Comm, op: &OpKind<'_>, d: &TypeDesc, count: usize, mine: &[u8], t: Target, call: &str) -> Option<Vec<u8>> {
    let (n, me) = (c.size(), c.rank());
    let mut all = vec![0u8; mine.len() * n];
    match t {
        Target::Root(root) => ok(c.gather(mine, (me == root).then_some(&mut all[..]), root), call),
        _ => ok(c.allgather(mine, &mut all), call),
    }
    fold_all(op, d, count, &all, (me, n), t, call)
}

/// This rank's result of a reduction from `all`, every rank's packed contribution of `count`
/// elements of `d` in rank order (as [`generic_reduce`] gathered them); None where it gets
/// none. `at` is (this rank, ranks).
fn fold_all(op: &OpKind<'_>, d: &TypeDesc, count: usize, all: &[u8], at: (usize, usize), t: Target, call: &str) -> Option<Vec<u8>> {
    let (me, n) = at;
    let blen = all.len() / n.max(1);
    let fold = |upto: usize, count: usize, lo: usize, len: usize| -> Vec<u8> {
        let mut acc = all[(upto - 1) * blen + lo..(upto - 1) * blen + lo + len].to_vec();
        for i in (0..upto - 1).rev() {
            combine(op, d, count, &all[i * blen + lo..i * blen + lo + len], &mut acc, call);
        }
        acc
    };
    match t {
        Target::Root(root) if root != me => None,
        Target::Root(_) | Target::All => Some(fold(n, count, 0, blen)),
        Target::Scan => Some(fold(me + 1, count, 0, blen)),
        Target::Exscan => (me > 0).then(|| fold(me, count, 0, blen)),
        Target::ScatterBlock => {
            assert!(count % n == 0, "mpi: {call}: {count} elements do not split into {n} equal blocks");
            let k = count / n;
            Some(fold(n, k, me * k * d.size(), k * d.size()))
        }
    }
}

/// Starts a reduction with a result buffer: on tmpi's non-blocking typed reductions when it
/// can, else as [`generic_ireduce`].
fn ireduce_impl<'a, S, R, O, Sc>(
    h: &CommHandle,
    scope: Sc,
    sendbuf: &'a S,
    recvbuf: &'a mut R,
    op: O,
    t: Target,
    call: &'static str,
) -> Request<'a, R, Sc>
where
    S: 'a + Buffer + ?Sized,
    R: 'a + BufferMut + ?Sized,
    O: 'a + Operation,
    Sc: Scope<'a>,
{
    let recv = rparts(recvbuf);
    let p = match native_ireduce(h, sendbuf, Some(recv.clone()), &op, t) {
        Some(p) => p,
        // SAFETY: the receive buffer is borrowed by the request made here for its life.
        None => unsafe { generic_ireduce(h, sendbuf, Some(recv), op, t, call) },
    };
    Request::new(p, recvbuf, scope)
}

/// [`generic_reduce`] without blocking: starts the gather of the packed contributions (tmpi's
/// non-blocking `igather`/`iallgather`) and combines them when the request completes, so
/// that a rank can start the reduction, then do what the others wait for.
///
/// # Safety
/// `recv` (its `count` elements) must stay writable and untouched by anyone else until the
/// returned operation has finished or been dropped, and the operation must not outlive `O`'s
/// borrows (`'a`): the caller puts it in a request of lifetime `'a`.
unsafe fn generic_ireduce<'a, S, O>(h: &CommHandle, sendbuf: &S, recv: Option<RParts>, op: O, t: Target, call: &'static str) -> Pending
where
    S: Buffer + ?Sized,
    O: 'a + Operation,
{
    let c = &h.comm;
    let (n, me) = (c.size(), c.rank());
    let (d, count) = (sendbuf.as_datatype().type_desc().clone(), uidx(sendbuf.count(), call));
    let mine = crate::bytes::owned_bytes(sendbuf);
    let mut all = vec![0u8; mine.len() * n];
    // SAFETY: `mine` and `all` are heap buffers that move (unchanged) into `after` below, which
    // the operation drops only after its request (`Pending::reqs` is dropped first).
    let (sb, ab): (&[u8], &mut [u8]) =
        unsafe { (std::slice::from_raw_parts(mine.as_ptr(), mine.len()), std::slice::from_raw_parts_mut(all.as_mut_ptr(), all.len())) };
    // SAFETY: as just said, the buffers outlive the request.
    let req = unsafe {
        detached(
            |s| match t {
                Target::Root(root) => c.igather(s, sb, (me == root).then_some(ab), root),
                _ => c.iallgather(s, sb, ab),
            },
            call,
        )
    };
    let after: Box<dyn FnOnce() + 'a> = Box::new(move || {
        let _keep = mine;
        let res = fold_all(&op.kind(), &d, count, &all, (me, n), t, call);
        if let (Some(res), Some((base, k, rd))) = (res, recv) {
            // SAFETY: the caller's contract: `recv` is writable and ours until now.
            unsafe { pack::unpack(&res, base, k, &rd, call) };
        }
    });
    // SAFETY: the caller keeps the operation within `'a` (see `# Safety`), so nothing `after`
    // borrows ends before it runs or is dropped.
    let after: Box<dyn FnOnce()> = unsafe { std::mem::transmute::<Box<dyn FnOnce() + 'a>, Box<dyn FnOnce()>>(after) };
    Pending { after: Some(after), ..Pending::one(req) }
}

fn native_ireduce<S: Buffer + ?Sized>(h: &CommHandle, sendbuf: &S, recv: Option<RParts>, op: &dyn Operation, t: Target) -> Option<Pending> {
    let kind = op.kind();
    let sdt = sendbuf.as_datatype();
    let sd = sdt.type_desc();
    let (op_t, p) = native_plan(&kind, sd, recv.as_ref().map(|r| &r.2))?;
    let c = h.comm.clone();
    let slen = uidx(sendbuf.count(), "reduction") * sd.size();
    // SAFETY: the send buffer is dense with `slen` bytes, borrowed for the request's life.
    let s: &[u8] = unsafe { std::slice::from_raw_parts(sendbuf.pointer() as *const u8, slen) };
    // SAFETY: the receive buffer is dense (checked by `native_plan`) and borrowed likewise.
    let r: Option<&mut [u8]> = recv.as_ref().map(|(b, n, d)| unsafe { std::slice::from_raw_parts_mut(*b, n * d.size()) });
    let req = with_num!(p, T => {
        let s = typed::<T>(s)?;
        let r = match r {
            Some(r) => Some(typed_mut::<T>(r)?),
            None => None,
        };
        // SAFETY: both buffers stay borrowed for the rsmpi request's lifetime, which ends only
        // after this tmpi request completes or is abandoned.
        unsafe {
            match (t, r) {
                (Target::Root(root), r) => detached(|sc| c.ireduce(sc, s, r, op_t, root), "immediate_reduce"),
                (Target::All, Some(r)) => detached(|sc| c.iallreduce(sc, s, r, op_t), "immediate_all_reduce"),
                (Target::ScatterBlock, Some(r)) => detached(|sc| c.ireduce_scatter_block(sc, s, r, op_t), "immediate_reduce_scatter_block"),
                (Target::Scan, Some(r)) => detached(|sc| c.iscan(sc, s, r, op_t), "immediate_scan"),
                (Target::Exscan, Some(r)) => detached(|sc| c.iexscan(sc, s, r, op_t), "immediate_exclusive_scan"),
                _ => return None,
            }
        }
    }, else return None);
    Some(Pending::one(req))
}
