//! Reduce and allreduce: binomial tree, recursive doubling, Rabenseifner.
//!
//! Non-power-of-two rank counts (`p = 2^k + rem`) are handled as MPICH does: among the first
//! `2 * rem` ranks each even rank hands its vector to the odd rank above it, which combines the
//! two (even on the left) and takes part as "new rank" `rank / 2`; ranks from `2 * rem` on are
//! new rank `rank - rem`. New ranks are ordered like the ranks they stand for, so "lower new
//! rank on the left" keeps a fixed operand order. Allreduce unfolds at the end: odd ranks send
//! the result back to their even partners.

use super::scratch::with_scratch;
use super::{
    abs, check_root, pof2_floor, recv_exact, rel, sendrecv_exact, split_pair, tags, CollP2p, ALLREDUCE_LONG_BYTES, ALLREDUCE_RING_BYTES,
    REDUCE_LONG_BYTES,
};
use crate::error::{Error, Result};
use crate::op::{check_op, Op, Reducible};

/// Bytes of a typed slice. `cast_slice` to `u8` cannot fail (alignment 1, any length).
fn bytes<T: Reducible>(s: &[T]) -> &[u8] {
    bytemuck::cast_slice(s)
}

/// Mutable bytes of a typed slice (cannot fail, as [`bytes`]).
fn bytes_mut<T: Reducible>(s: &mut [T]) -> &mut [u8] {
    bytemuck::cast_slice_mut(s)
}

/// Combines `send` of every rank element-wise with `op` into `recv` at `root`.
///
/// `recv` must be `Some` at the root, with `recv.len() == send.len()`; other ranks may pass
/// `None` (a `Some` there is ignored). Binomial tree up to [`REDUCE_LONG_BYTES`]; above it (with
/// at least one element per power-of-two rank) Rabenseifner's reduce-scatter by recursive
/// halving, after which every block goes straight to the root. The result is reproducible for a
/// given `(p, root, count)`; see the module docs of [`crate::coll`].
///
/// # Errors
/// Before any communication: [`Error::InvalidRoot`], [`Error::InvalidOp`],
/// [`Error::InvalidBuffer`] (root without `recv`, or lengths differ). Then transport errors and
/// mismatched lengths between ranks.
pub fn reduce<T: Reducible, C: CollP2p + ?Sized>(c: &C, send: &[T], recv: Option<&mut [T]>, op: Op, root: usize) -> Result<()> {
    let (rank, size) = (c.rank(), c.size());
    check_root(root, size)?;
    check_op::<T>(op)?;
    let recv = if rank == root {
        let r = recv.ok_or_else(|| Error::InvalidBuffer("reduce: the root must pass a receive buffer".into()))?;
        if r.len() != send.len() {
            return Err(Error::InvalidBuffer(format!("reduce: receive buffer has {} elements, send buffer {}", r.len(), send.len())));
        }
        Some(r)
    } else {
        None
    };
    if size == 1 || send.is_empty() {
        if let Some(r) = recv {
            r.copy_from_slice(send);
        }
        return Ok(());
    }
    if std::mem::size_of_val(send) > REDUCE_LONG_BYTES && send.len() >= pof2_floor(size) {
        reduce_rabenseifner(c, send, recv, op, root)
    } else {
        reduce_binomial(c, send, recv, op, root)
    }
}

/// Binomial-tree reduce: relative rank `vr` combines the vectors of its children `vr + 2^j`
/// (for `2^j < lowbit(vr)`, smallest first, each on the right) and sends the result to its
/// parent `vr - lowbit(vr)`. `recv` is `Some` exactly at the root, with the right length.
pub(crate) fn reduce_binomial<T: Reducible, C: CollP2p + ?Sized>(
    c: &C,
    send: &[T],
    recv: Option<&mut [T]>,
    op: Op,
    root: usize,
) -> Result<()> {
    let (rank, size) = (c.rank(), c.size());
    let vr = rel(rank, root, size);
    let has_child = vr % 2 == 0 && vr + 1 < size;
    if !has_child && vr != 0 {
        // A leaf sends its own vector: no copy.
        return c.send(bytes(send), abs(vr - (vr & vr.wrapping_neg()), root, size), tags::REDUCE);
    }
    let mut own;
    let acc: &mut [T] = match recv {
        Some(r) if vr == 0 => {
            r.copy_from_slice(send);
            r
        }
        _ => {
            own = send.to_vec();
            &mut own
        }
    };
    with_scratch(send.len(), |tmp: &mut [T]| {
        let mut mask = 1;
        while mask < size {
            if vr & mask == 0 {
                let child = vr | mask;
                if child < size {
                    recv_exact(c, bytes_mut(tmp), abs(child, root, size), tags::REDUCE)?;
                    T::reduce_into(op, acc, tmp)?;
                }
            } else {
                return c.send(bytes(acc), abs(vr - mask, root, size), tags::REDUCE);
            }
            mask <<= 1;
        }
        if vr == 0 {
            Ok(())
        } else {
            Err(super::internal(format!("reduce: relative rank {vr} found no parent")))
        }
    })
}

/// Real rank of new rank `nr` after the non-power-of-two fold with `rem` extra ranks.
fn real_rank(nr: usize, rem: usize) -> usize {
    if nr < rem {
        2 * nr + 1
    } else {
        nr + rem
    }
}

/// First element of block `b` when `n` elements are cut into `blocks` nearly equal blocks (the
/// first `n % blocks` blocks have one element more).
fn disp(b: usize, n: usize, blocks: usize) -> usize {
    b * (n / blocks) + b.min(n % blocks)
}

/// Element range of blocks `lo..hi`.
fn block_elems(lo: usize, hi: usize, n: usize, blocks: usize) -> std::ops::Range<usize> {
    disp(lo, n, blocks)..disp(hi, n, blocks)
}

/// The non-power-of-two fold: returns this rank's new rank, or `None` if it sat out (its
/// vector went to `rank + 1`). `tmp.len() == acc.len()`.
fn fold<T: Reducible, C: CollP2p + ?Sized>(c: &C, acc: &mut [T], tmp: &mut [T], op: Op, rem: usize) -> Result<Option<usize>> {
    let rank = c.rank();
    if rank >= 2 * rem {
        return Ok(Some(rank - rem));
    }
    if rank % 2 == 0 {
        c.send(bytes(acc), rank + 1, tags::REDUCE_FOLD)?;
        Ok(None)
    } else {
        recv_exact(c, bytes_mut(tmp), rank - 1, tags::REDUCE_FOLD)?;
        T::reduce_into_from_left(op, tmp, acc)?;
        Ok(Some(rank / 2))
    }
}

/// Undoes [`fold`] for allreduce: odd ranks below `2 * rem` send the result to `rank - 1`.
fn unfold<T: Reducible, C: CollP2p + ?Sized>(c: &C, acc: &mut [T], rem: usize) -> Result<()> {
    let rank = c.rank();
    if rank >= 2 * rem {
        Ok(())
    } else if rank % 2 == 1 {
        c.send(bytes(acc), rank - 1, tags::REDUCE_FOLD)
    } else {
        recv_exact(c, bytes_mut(acc), rank + 1, tags::REDUCE_FOLD)
    }
}

/// Reduce-scatter by recursive halving among `pof2` new ranks. Afterwards block `nr` of `acc`
/// (of `pof2` blocks, see [`disp`]) holds the full reduction; other blocks hold partial data.
///
/// Step `m = pof2/2, ..., 1`: the partner is `nr ^ m`; the rank with bit `m` clear keeps the
/// lower half of its current block range and sends the upper half, the other the reverse; the
/// half received is combined with the clear-bit side's data on the left.
///
/// With `from`, this rank's contribution is there rather than in `acc` (no fold ran): the
/// first step sends the half it gives away from `from` and copies in only the half it keeps.
#[allow(clippy::too_many_arguments)]
fn reduce_scatter_halving<T: Reducible, C: CollP2p + ?Sized>(
    c: &C,
    mut from: Option<&[T]>,
    acc: &mut [T],
    tmp: &mut [T],
    nr: usize,
    pof2: usize,
    rem: usize,
    op: Op,
) -> Result<()> {
    let n = acc.len();
    let (mut lo, mut hi) = (0, pof2);
    let mut m = pof2 / 2;
    while m > 0 {
        let partner = real_rank(nr ^ m, rem);
        let mid = lo + m;
        let low_side = nr & m == 0;
        let (keep, give) = if low_side { ((lo, mid), (mid, hi)) } else { ((mid, hi), (lo, mid)) };
        let kr = block_elems(keep.0, keep.1, n, pof2);
        let gr = block_elems(give.0, give.1, n, pof2);
        // The first step may read this rank's contribution from `from` instead of `acc`: the
        // half it gives away is sent from there, and only the half it keeps is copied in.
        let give_src = match from.take() {
            Some(src) => {
                acc[kr.clone()].copy_from_slice(&src[kr.clone()]);
                &src[gr]
            }
            None => &acc[gr],
        };
        sendrecv_exact(c, bytes(give_src), partner, bytes_mut(&mut tmp[kr.clone()]), partner, tags::REDUCE_SCATTER)?;
        if low_side {
            T::reduce_into(op, &mut acc[kr.clone()], &tmp[kr])?;
        } else {
            T::reduce_into_from_left(op, &tmp[kr.clone()], &mut acc[kr])?;
        }
        (lo, hi) = keep;
        m >>= 1;
    }
    Ok(())
}

/// The first half of Rabenseifner's reduce and allreduce: the fold, then the reduce-scatter by
/// recursive halving (see [`reduce_scatter_halving`], which also says what `from` is), with
/// the scratch they receive into. Returns this rank's new rank (`None`: folded away).
fn fold_and_halve<T: Reducible, C: CollP2p + ?Sized>(
    c: &C,
    from: Option<&[T]>,
    acc: &mut [T],
    pof2: usize,
    rem: usize,
    op: Op,
) -> Result<Option<usize>> {
    with_scratch(acc.len(), |tmp: &mut [T]| {
        let newrank = fold(c, acc, tmp, op, rem)?;
        if let Some(nr) = newrank {
            reduce_scatter_halving(c, from, acc, tmp, nr, pof2, rem, op)?;
        }
        Ok(newrank)
    })
}

/// Rabenseifner reduce: fold, reduce-scatter by recursive halving, then every new rank sends
/// its block to the root, which receives them in block order.
pub(crate) fn reduce_rabenseifner<T: Reducible, C: CollP2p + ?Sized>(
    c: &C,
    send: &[T],
    recv: Option<&mut [T]>,
    op: Op,
    root: usize,
) -> Result<()> {
    let (rank, size) = (c.rank(), c.size());
    let n = send.len();
    let pof2 = pof2_floor(size);
    let rem = size - pof2;
    let mut acc = send.to_vec();
    let newrank = fold_and_halve(c, None, &mut acc, pof2, rem, op)?;
    match recv {
        Some(out) if rank == root => {
            for b in 0..pof2 {
                let src = real_rank(b, rem);
                let r = block_elems(b, b + 1, n, pof2);
                if src == rank {
                    out[r.clone()].copy_from_slice(&acc[r]);
                } else {
                    recv_exact(c, bytes_mut(&mut out[r]), src, tags::REDUCE_GATHER)?;
                }
            }
            Ok(())
        }
        _ => match newrank {
            Some(nr) if rank != root => {
                let r = block_elems(nr, nr + 1, n, pof2);
                c.send(bytes(&acc[r]), root, tags::REDUCE_GATHER)
            }
            _ => Ok(()),
        },
    }
}

/// Combines `send` of every rank element-wise with `op` into `recv` on every rank; the result
/// is bitwise identical on all ranks.
///
/// Recursive doubling up to [`ALLREDUCE_LONG_BYTES`] (`log2 p` exchanges of the whole vector);
/// above it (with at least one element per power-of-two rank) Rabenseifner: reduce-scatter by
/// recursive halving, then allgather by recursive doubling, about `2 n` bytes per rank. Rank
/// counts that are not a power of two switch to the ring from [`ALLREDUCE_RING_BYTES`] on,
/// which needs no fold (the fold costs the folded ranks two extra whole-vector transfers).
///
/// # Errors
/// Before any communication: [`Error::InvalidOp`], [`Error::InvalidBuffer`] when
/// `recv.len() != send.len()`. Then transport errors and mismatched lengths between ranks.
pub fn allreduce<T: Reducible, C: CollP2p + ?Sized>(c: &C, send: &[T], recv: &mut [T], op: Op) -> Result<()> {
    check_op::<T>(op)?;
    if recv.len() != send.len() {
        return Err(Error::InvalidBuffer(format!("allreduce: receive buffer has {} elements, send buffer {}", recv.len(), send.len())));
    }
    let size = c.size();
    let bytes = std::mem::size_of_val(send);
    let ring = bytes >= ALLREDUCE_RING_BYTES && !size.is_power_of_two() && send.len() >= size;
    if size > 1 && !ring && bytes > ALLREDUCE_LONG_BYTES && send.len() >= pof2_floor(size) {
        // Reads the contribution from `send` itself.
        return allreduce_rabenseifner(c, Some(send), recv, op);
    }
    recv.copy_from_slice(send);
    if size == 1 || send.is_empty() {
        Ok(())
    } else if ring {
        allreduce_ring(c, recv, op)
    } else {
        allreduce_recursive_doubling(c, recv, op)
    }
}

/// Recursive-doubling allreduce in place on `acc` (which holds this rank's contribution).
///
/// Step `m = 1, 2, ...`: new ranks `nr` and `nr ^ m` hold the reductions of the aligned groups
/// of `m` new ranks they belong to; both compute `lower group op upper group` on the same
/// operands, so they end with the same bits.
pub(crate) fn allreduce_recursive_doubling<T: Reducible, C: CollP2p + ?Sized>(c: &C, acc: &mut [T], op: Op) -> Result<()> {
    let size = c.size();
    let pof2 = pof2_floor(size);
    let rem = size - pof2;
    with_scratch(acc.len(), |tmp: &mut [T]| -> Result<()> {
        if let Some(nr) = fold(c, acc, tmp, op, rem)? {
            let mut m = 1;
            while m < pof2 {
                let partner = real_rank(nr ^ m, rem);
                sendrecv_exact(c, bytes(acc), partner, bytes_mut(tmp), partner, tags::ALLREDUCE)?;
                if nr & m == 0 {
                    T::reduce_into(op, acc, tmp)?;
                } else {
                    T::reduce_into_from_left(op, tmp, acc)?;
                }
                m <<= 1;
            }
        }
        Ok(())
    })?;
    unfold(c, acc, rem)
}

/// Rabenseifner allreduce into `acc`: fold, reduce-scatter by recursive halving (new rank `nr`
/// ends with block `nr`), allgather by recursive doubling (after step `m` a rank holds the `2m`
/// blocks of its aligned group), unfold.
///
/// This rank's contribution is in `from` (`acc` then holds anything of the same length) or,
/// with `None`, already in `acc`. Reading it from `from` saves copying the half this rank
/// gives away in the first step (1 MiB on 2 ranks: the whole-vector copy was 12% of the
/// time); with a fold (not a power of two) it is copied whole first.
pub(crate) fn allreduce_rabenseifner<T: Reducible, C: CollP2p + ?Sized>(c: &C, from: Option<&[T]>, acc: &mut [T], op: Op) -> Result<()> {
    let size = c.size();
    let n = acc.len();
    let pof2 = pof2_floor(size);
    let rem = size - pof2;
    let from = match from {
        Some(src) if rem > 0 || pof2 < 2 => {
            acc.copy_from_slice(src);
            None
        }
        f => f,
    };
    let newrank = fold_and_halve(c, from, acc, pof2, rem, op)?;
    if let Some(nr) = newrank {
        let mut m = 1;
        while m < pof2 {
            let pnr = nr ^ m;
            let (mine, theirs) = (nr & !(m - 1), pnr & !(m - 1));
            let s = block_elems(mine, mine + m, n, pof2);
            let r = block_elems(theirs, theirs + m, n, pof2);
            let (sb, rb) = split_pair(acc, s, r)?;
            sendrecv_exact(c, bytes(sb), real_rank(pnr, rem), bytes_mut(rb), real_rank(pnr, rem), tags::ALLREDUCE_ALLGATHER)?;
            m <<= 1;
        }
    }
    unfold(c, acc, rem)
}

/// Ring allreduce in place on `acc` (any `p`; `acc` is cut into `p` blocks as in [`disp`]).
///
/// Reduce-scatter: in step `k = 0..p-1` send block `rank - k` to `rank + 1`, receive block
/// `rank - k - 1` from `rank - 1` and combine it (incoming partial on the left); rank `r` then
/// holds the full block `r + 1`. Each block is reduced along one chain, then only copied, so
/// every rank ends with the same bits. Allgather: `p - 1` more steps pass the full blocks on.
pub(crate) fn allreduce_ring<T: Reducible, C: CollP2p + ?Sized>(c: &C, acc: &mut [T], op: Op) -> Result<()> {
    let (rank, size) = (c.rank(), c.size());
    let n = acc.len();
    let right = (rank + 1) % size;
    let left = (rank + size - 1) % size;
    let blk = |b: usize| block_elems(b % size, b % size + 1, n, size);
    with_scratch(blk(0).len(), |tmp: &mut [T]| -> Result<()> {
        for k in 0..size - 1 {
            let s = blk(rank + size - k);
            let r = blk(rank + 2 * size - k - 1);
            let t = &mut tmp[..r.len()];
            sendrecv_exact(c, bytes(&acc[s]), right, bytes_mut(t), left, tags::ALLREDUCE_RING)?;
            T::reduce_into_from_left(op, t, &mut acc[r])?;
        }
        Ok(())
    })?;
    for k in 0..size - 1 {
        let s = blk(rank + 1 + size - k);
        let r = blk(rank + size - k);
        let (sb, rb) = split_pair(acc, s, r)?;
        sendrecv_exact(c, bytes(sb), right, bytes_mut(rb), left, tags::ALLREDUCE_RING)?;
    }
    Ok(())
}
