//! Each collective of a communicator from its arguments to its end: the arguments checked,
//! the plan chosen ([`super::select`]'s rules, node-aware through [`super::hier`] when the
//! communicator spans hosts), then run by the communicator's [`CollP2p`]. The plan builders of
//! each algorithm (`allgather.rs`, `reduce.rs`, ...) sit below this file and know nothing of
//! the choice.

use super::allgather::check_allgather;
use super::alltoall::check_alltoall;
use super::gather::check_gather;
use bytemuck::Pod;

use super::hier::{self, Tiers};
use super::plan::{inp, out, Grp, Plan, ReduceFn, Span};
use super::reduce::check_reduce;
use super::reduce::{builtin, Vector};
use super::select::{self, Allgather, Allreduce, Alltoall, Barrier, Bcast, Reduce, ReduceScatter, Setting, Shape, GATHER_LINEAR_BYTES};
use super::vcoll::{check_counts, check_layout, check_own, first_err, plan_allgatherv, vtags};
use super::{tags, CollP2p};
use crate::error::{Error, Result};
use crate::op::{check_op, Op, Reducible};

/// The barrier's plan.
pub(crate) fn barrier_plan(set: &Setting<'_>) -> Plan {
    let mut p = Plan::new();
    if let Some(t) = hier::wanted(set) {
        hier::barrier(&mut p, &Tiers::new(t, set.rank, None));
        p.finish();
        return p;
    }
    match select::barrier(&set.shape(0, 0, true), set.force.barrier) {
        Barrier::Dissemination => super::barrier::plan_dissemination(&mut p, set.all(), tags::BARRIER),
    }
    p.finish();
    p
}

/// The broadcast's plan for a buffer of `len` bytes.
///
/// # Errors
/// [`Error::InvalidRoot`].
pub(crate) fn bcast_plan(set: &Setting<'_>, len: usize, root: usize) -> Result<Plan> {
    super::check_root(root, set.size)?;
    let mut p = Plan::new();
    if let Some(t) = hier::wanted(set).filter(|_| len > 0) {
        hier::bcast(&mut p, set, &Tiers::new(t, set.rank, Some(root)), out(0, len), root);
    } else if set.size > 1 && len > 0 {
        let buf = out(0, len);
        match select::bcast(&set.shape(len, len, true), set.force.bcast) {
            Bcast::Binomial => super::bcast::plan_binomial(&mut p, set.all(), buf, root, tags::BCAST),
            Bcast::ScatterAllgather => super::bcast::plan_scatter_allgather(&mut p, set.all(), buf, root, tags::BCAST_SCATTER),
        }
    }
    p.finish();
    Ok(p)
}

/// The reduce's plan (arguments checked by the caller; `recv` is the root's).
pub(crate) fn reduce_plan(set: &Setting<'_>, f: ReduceFn, commutative: bool, v: Vector, root: usize) -> Result<Plan> {
    super::check_root(root, set.size)?;
    let mut p = Plan::reducing(f);
    let (send, recv) = (inp(0, v.bytes()), (set.rank == root).then_some(out(0, v.bytes())));
    if set.size == 1 || v.n == 0 {
        if let Some(r) = recv {
            p.copy(send, r);
        }
    } else if let Some(t) = hier::wanted(set).filter(|_| commutative) {
        hier::reduce(&mut p, set, &Tiers::new(t, set.rank, Some(root)), send, recv, v, root);
    } else {
        match select::reduce(&set.shape(v.bytes(), v.n, commutative), set.force.reduce) {
            Reduce::Rabenseifner => super::reduce::plan_reduce_rabenseifner(&mut p, set.all(), send, recv, v, root, tags::REDUCE_FOLD),
            Reduce::Binomial => super::reduce::plan_reduce_binomial(&mut p, set.all(), send, recv, root, !commutative, tags::REDUCE),
        }
    }
    p.finish();
    Ok(p)
}

/// The allreduce's plan (arguments checked by the caller).
pub(crate) fn allreduce_plan(set: &Setting<'_>, f: ReduceFn, commutative: bool, v: Vector) -> Result<Plan> {
    let mut p = Plan::reducing(f);
    let (send, acc) = (inp(0, v.bytes()), out(0, v.bytes()));
    if set.size == 1 || v.n == 0 {
        p.copy(send, acc);
    } else if let Some(t) = hier::wanted(set).filter(|_| commutative) {
        hier::allreduce(&mut p, set, &Tiers::new(t, set.rank, None), send, acc, v);
    } else {
        let g = set.all();
        match select::allreduce(&set.shape(v.bytes(), v.n, commutative), set.force.allreduce) {
            Allreduce::Rabenseifner => super::reduce::plan_rabenseifner(&mut p, g, Some(send), acc, v, tags::ALLREDUCE_RAB),
            Allreduce::Ring => {
                p.copy(send, acc);
                super::reduce::plan_ring(&mut p, g, acc, v, tags::ALLREDUCE_RING);
            }
            Allreduce::ReduceBcast => super::reduce::plan_reduce_bcast(&mut p, g, send, acc, tags::REDUCE_BCAST),
            Allreduce::RecursiveDoubling => {
                p.copy(send, acc);
                super::reduce::plan_recursive_doubling(&mut p, g, acc, tags::ALLREDUCE);
            }
        }
    }
    p.finish();
    Ok(p)
}

/// The gather's plan for blocks of `blk` bytes (arguments checked by the caller).
pub(crate) fn gather_plan(set: &Setting<'_>, blk: usize, root: usize) -> Plan {
    let mut p = Plan::new();
    let (send, recv) = (inp(0, blk), (set.rank == root).then_some(out(0, blk * set.size)));
    if set.size == 1 {
        if let Some(r) = recv {
            p.copy(send, r);
        }
    } else if blk > 0 {
        if blk < GATHER_LINEAR_BYTES {
            super::gather::plan_gather_binomial(&mut p, set.all(), send, recv, root, tags::GATHER);
        } else {
            super::gather::plan_gather_linear(&mut p, set.all(), send, recv, root, tags::GATHER);
        }
    }
    p.finish();
    p
}

/// The scatter's plan for blocks of `blk` bytes (arguments checked by the caller).
pub(crate) fn scatter_plan(set: &Setting<'_>, blk: usize, root: usize) -> Plan {
    let mut p = Plan::new();
    let (send, recv) = ((set.rank == root).then_some(inp(0, blk * set.size)), out(0, blk));
    if set.size == 1 {
        if let Some(s) = send {
            p.copy(s, recv);
        }
    } else if blk > 0 {
        if blk < GATHER_LINEAR_BYTES {
            super::gather::plan_scatter_binomial(&mut p, set.all(), send, recv, root, tags::SCATTER);
        } else {
            super::gather::plan_scatter_linear(&mut p, set.all(), send, recv, root, tags::SCATTER);
        }
    }
    p.finish();
    p
}

/// The allgather's plan for blocks of `blk` bytes (arguments checked by the caller).
pub(crate) fn allgather_plan(set: &Setting<'_>, blk: usize) -> Plan {
    let mut p = Plan::new();
    let (n, me) = (set.size, set.rank);
    let (send, buf) = (inp(0, blk), out(0, n * blk));
    if n == 1 {
        p.copy(send, buf);
    } else if let Some(t) = hier::wanted(set).filter(|_| blk > 0) {
        let dest: Vec<Span> = (0..n).map(|r| buf.sub(r * blk..(r + 1) * blk)).collect();
        hier::allgatherv(&mut p, set, &Tiers::new(t, me, None), send, &vec![blk; n], &dest);
    } else if blk > 0 {
        let g = set.all();
        match select::allgather(&set.shape(n * blk, n * blk, true), set.force.allgather) {
            Allgather::RecursiveDoubling => {
                p.copy(send, buf.sub(me * blk..(me + 1) * blk));
                super::allgather::plan_recursive_doubling(&mut p, g, buf, blk, tags::ALLGATHER);
            }
            Allgather::Bruck => super::allgather::plan_bruck(&mut p, g, send, buf, tags::ALLGATHER_BRUCK),
            Allgather::Ring => {
                p.copy(send, buf.sub(me * blk..(me + 1) * blk));
                super::allgather::plan_ring(&mut p, g, buf, blk, tags::ALLGATHER_RING);
            }
        }
    }
    p.finish();
    p
}

/// The alltoall's plan for blocks of `blk` bytes (arguments checked by the caller).
pub(crate) fn alltoall_plan(set: &Setting<'_>, blk: usize) -> Plan {
    let mut p = Plan::new();
    let n = set.size;
    let (send, recv) = (inp(0, n * blk), out(0, n * blk));
    if n == 1 {
        p.copy(send, recv);
    } else if let Some(t) = hier::wanted(set).filter(|t| blk > 0 && select::alltoall_node_aware(&Shape::on(t, blk), set.force.node_aware)) {
        hier::alltoall(&mut p, &Tiers::new(t, set.rank, None), send, recv, blk);
    } else if blk > 0 {
        let g = set.all();
        match select::alltoall(&set.shape(blk, blk, true), set.force.alltoall) {
            Alltoall::Pairwise => super::alltoall::plan_pairwise(&mut p, g, send, recv, blk, tags::ALLTOALL),
            Alltoall::Bruck => super::alltoall::plan_bruck(&mut p, g, send, recv, blk, tags::ALLTOALL_BRUCK),
            Alltoall::Linear => super::alltoall::plan_linear(&mut p, g, send, recv, blk, tags::ALLTOALL_LINEAR),
        }
    }
    p.finish();
    p
}

/// The reduce-scatter's plan: block `r` (`counts[r]` elements of `es` bytes, blocks
/// consecutive in the send buffer) to rank `r` (arguments checked by the caller).
///
/// # Errors
/// [`Error::InvalidBuffer`] when the counts overflow.
pub(crate) fn reduce_scatter_plan(set: &Setting<'_>, f: ReduceFn, commutative: bool, es: usize, counts: &[usize]) -> Result<Plan> {
    let n = set.size;
    let total = counts
        .iter()
        .try_fold(0usize, |a, &c| a.checked_add(c))
        .ok_or_else(|| Error::InvalidBuffer("reduce_scatter: the counts overflow usize".into()))?;
    let displs = super::vcoll::check_counts("reduce_scatter", counts, n, total)?;
    let v = Vector { n: total, es };
    let mut p = Plan::reducing(f);
    let blocks: Vec<Span> = (0..n).map(|i| inp(displs[i] * es, counts[i] * es)).collect();
    let mine = out(0, counts[set.rank] * es);
    if n == 1 {
        p.copy(blocks[0], mine);
    } else if let Some(t) = hier::wanted(set).filter(|_| commutative && set.force.reduce_scatter.is_none()) {
        hier::reduce_scatter(&mut p, set, &Tiers::new(t, set.rank, None), &blocks, mine, v);
    } else {
        match select::reduce_scatter(&set.shape(v.bytes(), total, commutative), set.force.reduce_scatter) {
            ReduceScatter::ReduceScatterv => {
                let rab = select::reduce(&set.shape(v.bytes(), total, commutative), None) == Reduce::Rabenseifner;
                super::vcoll::plan_reduce_then_scatter(&mut p, set.all(), rab, v, &blocks, mine, super::vcoll::vtags::REDUCE_SCATTER)
            }
        }
    }
    p.finish();
    Ok(p)
}

/// Collects `send` of every rank, in rank order, into `recv` on every rank
/// (`recv.len() == size * send.len()`). The algorithm is [`allgather_plan`]'s
/// choice.
///
/// # Errors
/// [`Error::InvalidBuffer`] before any communication when the lengths do not fit; then
/// transport errors and mismatched lengths between ranks.
pub(crate) fn allgather<C: CollP2p + ?Sized>(c: &C, send: &[u8], recv: &mut [u8]) -> Result<()> {
    check_allgather(c.size(), send.len(), recv.len())?;
    let plan = allgather_plan(&c.setting(), send.len());
    c.run(plan, Some(send), Some(recv))
}

/// Sends block `j` of `send` to rank `j` and receives block `i` of `recv` from rank `i`
/// (`send.len() == recv.len()`, a multiple of the communicator size times `elem`, the bytes
/// of one element). The algorithm is [`alltoall_plan`]'s choice.
///
/// # Errors
/// [`Error::InvalidBuffer`] before any communication when the lengths do not fit; then
/// transport errors and mismatched lengths between ranks.
pub(crate) fn alltoall<C: CollP2p + ?Sized>(c: &C, send: &[u8], recv: &mut [u8], elem: usize) -> Result<()> {
    check_alltoall(c.size(), elem, send.len(), recv.len())?;
    let plan = alltoall_plan(&c.setting(), send.len() / c.size());
    c.run(plan, Some(send), Some(recv))
}

/// Blocks until every rank of the communicator has entered the barrier (dissemination; see
/// [`super::select`] for when the node-aware form replaces it).
///
/// # Errors
/// Transport errors of [`CollP2p`], e.g. [`crate::Error::PeerGone`].
pub(crate) fn barrier<C: CollP2p + ?Sized>(c: &C) -> Result<()> {
    let plan = barrier_plan(&c.setting());
    c.run(plan, None, None)
}

/// Copies `buf` of `root` into `buf` of every rank. Every rank passes the same length. The
/// algorithm is [`bcast_plan`]'s choice.
///
/// # Errors
/// [`crate::Error::InvalidRoot`] before any communication; [`crate::Error::Truncated`] or
/// [`crate::Error::InvalidBuffer`] when ranks pass different lengths; transport errors.
pub(crate) fn bcast<C: CollP2p + ?Sized>(c: &C, buf: &mut [u8], root: usize) -> Result<()> {
    let plan = bcast_plan(&c.setting(), buf.len(), root)?;
    c.run(plan, None, Some(buf))
}

/// Collects `send` of every rank, in rank order, into `recv` at `root`.
///
/// At the root `recv` must be `Some` with `recv.len() == size * send.len()`; other ranks may
/// pass `None` (a `Some` there is ignored). The algorithm is [`gather_plan`]'s
/// choice.
///
/// # Errors
/// Before any communication: [`Error::InvalidRoot`], [`Error::InvalidBuffer`] (root without a
/// buffer, or the wrong length). Then transport errors and mismatched lengths between ranks.
pub(crate) fn gather<C: CollP2p + ?Sized>(c: &C, send: &[u8], recv: Option<&mut [u8]>, root: usize) -> Result<()> {
    let (rank, size) = (c.rank(), c.size());
    super::check_root(root, size)?;
    let recv = if rank == root { recv } else { None };
    if rank == root {
        check_gather("gather", size, send.len(), recv.as_ref().map(|r| r.len()))?;
    }
    let plan = gather_plan(&c.setting(), send.len(), root);
    c.run(plan, Some(send), recv)
}

/// Distributes consecutive blocks of `send` at `root`: rank `r` receives block `r` into `recv`.
///
/// At the root `send` must be `Some` with `send.len() == size * recv.len()`; other ranks may
/// pass `None` (a `Some` there is ignored). The algorithm is [`scatter_plan`]'s
/// choice.
///
/// # Errors
/// Before any communication: [`Error::InvalidRoot`], [`Error::InvalidBuffer`] (root without a
/// buffer, or the wrong length). Then transport errors and mismatched lengths between ranks.
pub(crate) fn scatter<C: CollP2p + ?Sized>(c: &C, send: Option<&[u8]>, recv: &mut [u8], root: usize) -> Result<()> {
    let (rank, size) = (c.rank(), c.size());
    super::check_root(root, size)?;
    let send = if rank == root { send } else { None };
    if rank == root {
        check_gather("scatter", size, recv.len(), send.map(<[u8]>::len))?;
    }
    let plan = scatter_plan(&c.setting(), recv.len(), root);
    c.run(plan, send, Some(recv))
}

/// Combines `send` of every rank element-wise with `op` into `recv` at `root`.
///
/// `recv` must be `Some` at the root, with `recv.len() == send.len()`; other ranks may pass
/// `None` (a `Some` there is ignored). The algorithm is [`reduce_plan`]'s
/// choice. The result is reproducible for a given `(p, root, count)`; see the module docs of
/// [`crate::coll`].
///
/// # Errors
/// Before any communication: [`Error::InvalidRoot`], [`Error::InvalidOp`],
/// [`Error::InvalidBuffer`] (root without `recv`, or lengths differ). Then transport errors and
/// mismatched lengths between ranks.
pub(crate) fn reduce<T: Reducible, C: CollP2p + ?Sized>(c: &C, send: &[T], recv: Option<&mut [T]>, op: Op, root: usize) -> Result<()> {
    super::check_root(root, c.size())?;
    check_op::<T>(op)?;
    let recv = if c.rank() == root { recv } else { None };
    check_reduce(send, recv.as_deref(), c.rank() == root)?;
    let v = Vector { n: send.len(), es: std::mem::size_of::<T>() };
    let plan = reduce_plan(&c.setting(), builtin::<T>(op), true, v, root)?;
    c.run(plan, Some(bytemuck::cast_slice(send)), recv.map(|r| bytemuck::cast_slice_mut(r)))
}

/// Combines `send` of every rank element-wise with `op` into `recv` on every rank; the result
/// is bitwise identical on all ranks. The algorithm is [`allreduce_plan`]'s
/// choice.
///
/// # Errors
/// Before any communication: [`Error::InvalidOp`], [`Error::InvalidBuffer`] when
/// `recv.len() != send.len()`. Then transport errors and mismatched lengths between ranks.
pub(crate) fn allreduce<T: Reducible, C: CollP2p + ?Sized>(c: &C, send: &[T], recv: &mut [T], op: Op) -> Result<()> {
    check_op::<T>(op)?;
    if recv.len() != send.len() {
        return Err(Error::InvalidBuffer(format!("allreduce: receive buffer has {} elements, send buffer {}", recv.len(), send.len())));
    }
    let v = Vector { n: send.len(), es: std::mem::size_of::<T>() };
    let plan = allreduce_plan(&c.setting(), builtin::<T>(op), true, v)?;
    c.run(plan, Some(bytemuck::cast_slice(send)), Some(bytemuck::cast_slice_mut(recv)))
}

/// Combines `send` of every rank element-wise with `op` and leaves block `r` of the result
/// (`counts[r]` elements, blocks in rank order) in rank `r`'s `recv`. `send.len()` is the sum of
/// `counts` on every rank.
///
/// # Errors
/// Before any communication: [`Error::InvalidOp`]; [`Error::InvalidBuffer`] when `counts` has
/// not one entry per rank or does not sum to `send.len()`. [`Error::InvalidBuffer`] when
/// `recv.len() != counts[rank]` (the rank takes part with scratch space first). Transport
/// errors, mismatched lengths between ranks, [`Error::PeerGone`].
pub(crate) fn reduce_scatter<T: Reducible, C: CollP2p + ?Sized>(c: &C, send: &[T], recv: &mut [T], counts: &[usize], op: Op) -> Result<()> {
    let (rank, size) = (c.rank(), c.size());
    check_op::<T>(op)?;
    check_counts("reduce_scatter", counts, size, send.len())?;
    let bad = check_own("reduce_scatter", rank, counts[rank], recv.len(), "receive").err();
    let mut scratch = Vec::new();
    let out: &mut [T] = if bad.is_some() {
        scratch.resize(counts[rank], T::zeroed());
        &mut scratch
    } else {
        recv
    };
    let plan = reduce_scatter_plan(&c.setting(), builtin::<T>(op), true, std::mem::size_of::<T>(), counts);
    let r = plan.and_then(|p| c.run(p, Some(bytemuck::cast_slice(send)), Some(bytemuck::cast_slice_mut(out))));
    first_err(bad, r)
}

/// [`reduce_scatter`] with equal blocks: `send.len() == size * recv.len()` on every rank, and
/// rank `r` gets elements `r * recv.len()..(r + 1) * recv.len()` of the reduction.
///
/// # Errors
/// Before any communication: [`Error::InvalidOp`], [`Error::InvalidBuffer`] when the lengths do
/// not fit. Transport errors, mismatched lengths between ranks, [`Error::PeerGone`].
pub(crate) fn reduce_scatter_block<T: Reducible, C: CollP2p + ?Sized>(c: &C, send: &[T], recv: &mut [T], op: Op) -> Result<()> {
    let size = c.size();
    check_op::<T>(op)?;
    if Some(send.len()) != recv.len().checked_mul(size) {
        return Err(Error::InvalidBuffer(format!(
            "reduce_scatter_block: send buffer has {} elements, {size} ranks * {} = receive blocks needed",
            send.len(),
            recv.len()
        )));
    }
    let counts = vec![recv.len(); size];
    let plan = reduce_scatter_plan(&c.setting(), builtin::<T>(op), true, std::mem::size_of::<T>(), &counts)?;
    c.run(plan, Some(bytemuck::cast_slice(send)), Some(bytemuck::cast_slice_mut(recv)))
}

/// The plan of [`allgatherv`] by `algo` (every rank passes the same counts, so every rank
/// chooses alike; a rank whose arguments are bad takes its part with empty messages).
pub(crate) fn allgatherv_plan<T: Pod>(set: &Setting<'_>, send: &[T], recv_len: usize, counts: &[usize], displs: &[usize]) -> Plan {
    let (rank, size) = (set.rank, set.size);
    let es = std::mem::size_of::<T>();
    let mut p = Plan::new();
    p.tolerant = true;
    let checked = check_layout("allgatherv", "receive", counts, displs, size, recv_len, true)
        .and_then(|l| check_own("allgatherv", rank, l.counts[rank], send.len(), "send").map(|()| l));
    let total = (counts.len() == size).then(|| counts.iter().try_fold(0usize, |a, &c| a.checked_add(c.checked_mul(es)?))).flatten();
    let algo = select::allgatherv(set, total);
    let g = Grp::all(rank, size);
    if let Some(t) = hier::wanted(set).filter(|_| total.is_some() && set.force.allgatherv.is_none()) {
        // Block sizes from the counts, which every rank passes alike: the same rounds on
        // every rank even where this rank's own arguments are bad.
        let sizes: Vec<usize> = counts.iter().map(|&c| c * es).collect();
        let tiers = hier::Tiers::new(t, rank, None);
        match checked {
            Ok(l) => {
                let whole = out(0, recv_len * es);
                let dest: Vec<Span> = (0..size).map(|r| l.span(whole, r, es)).collect();
                hier::allgatherv(&mut p, set, &tiers, inp(0, std::mem::size_of_val(send)), &sizes, &dest);
            }
            Err(e) => {
                let dest = vec![Span::empty(); size];
                hier::allgatherv(&mut p, set, &tiers, Span::empty(), &sizes, &dest);
                p.fail_locally(e);
            }
        }
        p.finish();
        return p;
    }
    match checked {
        Ok(l) => {
            let whole = out(0, recv_len * es);
            let sizes: Vec<usize> = (0..size).map(|r| l.counts[r] * es).collect();
            let blocks: Vec<Span> = (0..size).map(|r| l.span(whole, r, es)).collect();
            p.copy(inp(0, std::mem::size_of_val(send)), blocks[rank]);
            plan_allgatherv(&mut p, g, algo, &sizes, &blocks, vtags::ALLGATHERV);
        }
        Err(e) => {
            let sizes = vec![0; size];
            let blocks = vec![Span::empty(); size];
            plan_allgatherv(&mut p, g, algo, &sizes, &blocks, vtags::ALLGATHERV);
            p.fail_locally(e);
        }
    }
    p.finish();
    p
}

/// Collects `send` of every rank into `recv` on every rank: rank `r`'s elements land at
/// `recv[displs[r]..displs[r] + counts[r]]`; `counts[r]` must be rank `r`'s `send.len()`. Every
/// rank passes the same `counts` (the displacements may differ).
///
/// # Errors
/// [`Error::InvalidBuffer`] when a block does not fit `recv`, receive blocks overlap, this rank's
/// count is not `send.len()`, or a block arrives with another length than its count (the rank
/// still completes its rounds with empty messages). Transport errors, [`Error::PeerGone`].
pub(crate) fn allgatherv<T: Pod, C: CollP2p + ?Sized>(c: &C, send: &[T], recv: &mut [T], counts: &[usize], displs: &[usize]) -> Result<()> {
    let plan = allgatherv_plan(&c.setting(), send, recv.len(), counts, displs);
    c.run(plan, Some(bytemuck::cast_slice(send)), Some(bytemuck::cast_slice_mut(recv)))
}
