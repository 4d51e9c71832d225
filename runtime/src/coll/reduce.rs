//! Reduce and allreduce: binomial tree, recursive doubling, Rabenseifner, ring.
//!
//! Non-power-of-two rank counts (`p = 2^k + rem`) are handled as MPICH does: among the first
//! `2 * rem` members each even one hands its vector to the odd one above it, which combines
//! the two (even on the left) and takes part as "new rank" `me / 2`; members from `2 * rem` on
//! are new rank `me - rem`. New ranks are ordered like the members they stand for, so "lower
//! new rank on the left" keeps a fixed operand order. Allreduce unfolds at the end: odd
//! members send the result back to their even partners.
//!
//! Every planner here combines in group order (lower members on the left), so it is exact for
//! operators that are not commutative too, except where its docs say otherwise (the ring, and
//! a binomial tree rooted elsewhere than member 0).

use bytemuck::Pod;

use super::plan::{pof2_floor, Grp, Plan, ReduceFn, Span};
use crate::error::{Error, Result};
use crate::op::{Op, Reducible};

/// A combining step on typed slices: `(from, acc)`.
pub(crate) type Combine<'a, T> = dyn Fn(&[T], &mut [T]) -> Result<()> + 'a;

/// `acc = from op acc` or `acc op from` on byte views of `T` elements; unaligned views (user
/// buffers are aligned, scratch is 16-byte aligned, but a test harness's need not be) are
/// combined through aligned copies.
pub(crate) fn typed<T: Pod>(from: &[u8], acc: &mut [u8], f: &Combine<'_, T>) -> Result<()> {
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
pub(crate) fn builtin<T: Reducible>(op: Op) -> ReduceFn {
    Box::new(move |from: &[u8], acc: &mut [u8], left: bool| {
        typed::<T>(from, acc, &|f, a| if left { T::reduce_into_from_left(op, f, a) } else { T::reduce_into(op, a, f) })
    })
}

/// A reduction of `n` elements of `es` bytes.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Vector {
    /// Elements.
    pub(crate) n: usize,
    /// Bytes per element.
    pub(crate) es: usize,
}

impl Vector {
    pub(crate) fn bytes(&self) -> usize {
        self.n * self.es
    }

    /// First element of block `b` when the vector is cut into `blocks` nearly equal blocks
    /// (the first `n % blocks` have one element more).
    fn disp(&self, b: usize, blocks: usize) -> usize {
        b * (self.n / blocks) + b.min(self.n % blocks)
    }

    /// Bytes of blocks `lo..hi` of `blocks`, within `s`.
    pub(crate) fn blocks(&self, s: Span, lo: usize, hi: usize, blocks: usize) -> Span {
        s.sub(self.disp(lo, blocks) * self.es..self.disp(hi, blocks) * self.es)
    }
}

/// Relative member of `me` in a tree rooted at `root`, and back.
fn rel(me: usize, root: usize, n: usize) -> usize {
    (me + n - root) % n
}

/// Binomial-tree reduce of `send` to member `root` of `g`, into `recv` (`Some` there only):
/// relative member `vr` combines the vectors of its children `vr + 2^j` (for `2^j <
/// lowbit(vr)`, smallest first, each on the right) and sends the result to its parent
/// `vr - lowbit(vr)`. Rooted at member 0 it combines in group order; with `ordered` and
/// another root it reduces to member 0 and sends the result on (for operators that are not
/// commutative), else the order is rotated by the root.
pub(crate) fn plan_reduce_binomial(p: &mut Plan, g: Grp<'_>, send: Span, recv: Option<Span>, root: usize, ordered: bool, tag: u32) {
    let n = g.n;
    let tree_root = if ordered { 0 } else { root };
    let vr = rel(g.me, tree_root, n);
    let abs = |v: usize| g.rank((v + tree_root) % n);
    let len = send.len;
    p.next();
    if vr != 0 && (vr % 2 == 1 || vr + 1 >= n) {
        // A leaf sends its own vector: no copy.
        p.send(send, abs(vr - (vr & vr.wrapping_neg())), tag);
        p.next();
    } else {
        let acc = match recv {
            Some(r) if vr == 0 && g.me == root => r,
            _ => p.temp(len),
        };
        let tmp = p.temp(len);
        p.copy(send, acc);
        let mut mask = 1;
        while mask < n {
            if vr & mask != 0 {
                p.send(acc, abs(vr - mask), tag);
                p.next();
                break;
            }
            if vr + mask < n {
                p.recv(tmp, abs(vr + mask), tag);
                p.next();
                p.combine(tmp, acc, false);
            }
            mask <<= 1;
        }
        if vr == 0 && g.me != root {
            // Ordered, and the root is another member: the result goes on to it.
            p.send(acc, g.rank(root), tag + 1);
        }
        p.next();
    }
    if g.me == root && tree_root != root {
        if let Some(r) = recv {
            p.recv(r, g.rank(tree_root), tag + 1);
            p.next();
        }
    }
}

/// Group member of new rank `nr` after the non-power-of-two fold with `rem` extra members.
fn real_rank(nr: usize, rem: usize) -> usize {
    if nr < rem {
        2 * nr + 1
    } else {
        nr + rem
    }
}

/// The non-power-of-two fold on `acc` (which holds this member's contribution): returns its
/// new rank, or `None` if it sat out (its vector went to `me + 1`). Leaves a pending combine
/// at the head of the next round.
fn plan_fold(p: &mut Plan, g: Grp<'_>, acc: Span, tmp: Span, rem: usize, tag: u32) -> Option<usize> {
    let me = g.me;
    if me >= 2 * rem {
        return Some(me - rem);
    }
    if me % 2 == 0 {
        p.send(acc, g.rank(me + 1), tag);
        p.next();
        None
    } else {
        p.recv(tmp, g.rank(me - 1), tag);
        p.next();
        p.combine(tmp, acc, true);
        Some(me / 2)
    }
}

/// Undoes [`plan_fold`] for allreduce: odd members below `2 * rem` send the result to `me - 1`.
fn plan_unfold(p: &mut Plan, g: Grp<'_>, acc: Span, rem: usize, tag: u32) {
    let me = g.me;
    if me < 2 * rem {
        if me % 2 == 1 {
            p.send(acc, g.rank(me - 1), tag);
        } else {
            p.recv(acc, g.rank(me + 1), tag);
        }
        p.next();
    }
}

/// Reduce-scatter by recursive halving among `pof2` new ranks. Afterwards block `nr` of `acc`
/// (of `pof2` blocks, see [`Vector::blocks`]) holds the full reduction, once the combine this
/// leaves at the head of the next round has run; other blocks hold partial data.
///
/// Step `m = pof2/2, ..., 1`: the partner is `nr ^ m`; the member with bit `m` clear keeps the
/// lower half of its current block range and sends the upper half, the other the reverse; the
/// half received is combined with the clear-bit side's data on the left.
///
/// With `from`, this member's contribution is there rather than in `acc` (no fold ran): the
/// first step sends the half it gives away from `from` and copies in only the half it keeps
/// (1 MiB on 2 ranks: copying the whole vector was 12% of the time).
#[allow(clippy::too_many_arguments)]
fn plan_halving(
    p: &mut Plan,
    g: Grp<'_>,
    mut from: Option<Span>,
    acc: Span,
    tmp: Span,
    v: Vector,
    nr: usize,
    rem: usize,
    pof2: usize,
    tag: u32,
) {
    let (mut lo, mut hi) = (0, pof2);
    let mut m = pof2 / 2;
    while m > 0 {
        let partner = g.rank(real_rank(nr ^ m, rem));
        let mid = lo + m;
        let low_side = nr & m == 0;
        let (keep, give) = if low_side { ((lo, mid), (mid, hi)) } else { ((mid, hi), (lo, mid)) };
        let kr = v.blocks(acc, keep.0, keep.1, pof2);
        let give_src = match from.take() {
            Some(src) => {
                p.copy(v.blocks(src, keep.0, keep.1, pof2), kr);
                v.blocks(src, give.0, give.1, pof2)
            }
            None => v.blocks(acc, give.0, give.1, pof2),
        };
        let t = v.blocks(tmp, keep.0, keep.1, pof2);
        p.send(give_src, partner, tag);
        p.recv(t, partner, tag);
        p.next();
        p.combine(t, kr, !low_side);
        (lo, hi) = keep;
        m >>= 1;
    }
}

/// Rabenseifner reduce to member `root` of `g`: fold, reduce-scatter by recursive halving,
/// then every new rank sends its block to the root, which takes them all at once.
pub(crate) fn plan_reduce_rabenseifner(p: &mut Plan, g: Grp<'_>, send: Span, recv: Option<Span>, v: Vector, root: usize, tag: u32) {
    let pof2 = pof2_floor(g.n);
    let rem = g.n - pof2;
    let acc = p.temp(send.len);
    let tmp = p.temp(send.len);
    p.next();
    p.copy(send, acc);
    let newrank = plan_fold(p, g, acc, tmp, rem, tag);
    if let Some(nr) = newrank {
        plan_halving(p, g, None, acc, tmp, v, nr, rem, pof2, tag + 1);
    }
    p.next();
    match recv {
        Some(o) if g.me == root => {
            for b in 0..pof2 {
                let src = real_rank(b, rem);
                if src == g.me {
                    p.copy(v.blocks(acc, b, b + 1, pof2), v.blocks(o, b, b + 1, pof2));
                }
            }
            for b in 0..pof2 {
                let src = real_rank(b, rem);
                if src != g.me {
                    p.recv(v.blocks(o, b, b + 1, pof2), g.rank(src), tag + 2);
                }
            }
        }
        _ => {
            if let Some(nr) = newrank.filter(|_| g.me != root) {
                p.send(v.blocks(acc, nr, nr + 1, pof2), g.rank(root), tag + 2);
            }
        }
    }
    p.next();
}

/// Recursive-doubling allreduce in place on `acc` (which holds this member's contribution).
///
/// Step `m = 1, 2, ...`: new ranks `nr` and `nr ^ m` hold the reductions of the aligned groups
/// of `m` new ranks they belong to; both compute `lower group op upper group` on the same
/// operands, so they end with the same bits.
pub(crate) fn plan_recursive_doubling(p: &mut Plan, g: Grp<'_>, acc: Span, tag: u32) {
    let pof2 = pof2_floor(g.n);
    let rem = g.n - pof2;
    let tmp = p.temp(acc.len);
    p.next();
    if let Some(nr) = plan_fold(p, g, acc, tmp, rem, tag) {
        let mut m = 1;
        while m < pof2 {
            let partner = g.rank(real_rank(nr ^ m, rem));
            p.send(acc, partner, tag + 1);
            p.recv(tmp, partner, tag + 1);
            p.next();
            p.combine(tmp, acc, nr & m != 0);
            m <<= 1;
        }
    }
    p.next();
    plan_unfold(p, g, acc, rem, tag);
}

/// Rabenseifner allreduce into `acc`: fold, reduce-scatter by recursive halving (new rank `nr`
/// ends with block `nr`), allgather by recursive doubling (after step `m` a member holds the
/// `2m` blocks of its aligned group), unfold. This member's contribution is in `from` (then
/// `acc` holds anything of the same length) or already in `acc`.
pub(crate) fn plan_rabenseifner(p: &mut Plan, g: Grp<'_>, from: Option<Span>, acc: Span, v: Vector, tag: u32) {
    let pof2 = pof2_floor(g.n);
    let rem = g.n - pof2;
    let tmp = p.temp(acc.len);
    p.next();
    let from = match from {
        Some(src) if rem > 0 || pof2 < 2 => {
            p.copy(src, acc);
            None
        }
        f => f,
    };
    if let Some(nr) = plan_fold(p, g, acc, tmp, rem, tag) {
        plan_halving(p, g, from, acc, tmp, v, nr, rem, pof2, tag + 1);
        let mut m = 1;
        while m < pof2 {
            let pnr = nr ^ m;
            let (mine, theirs) = (nr & !(m - 1), pnr & !(m - 1));
            let partner = g.rank(real_rank(pnr, rem));
            p.send(v.blocks(acc, mine, mine + m, pof2), partner, tag + 2);
            p.recv(v.blocks(acc, theirs, theirs + m, pof2), partner, tag + 2);
            p.next();
            m <<= 1;
        }
    }
    p.next();
    plan_unfold(p, g, acc, rem, tag);
}

/// Ring allreduce in place on `acc` (any `n`; `acc` is cut into `n` blocks as in
/// [`Vector::blocks`]). For commutative operators only: block `b` is combined along the chain
/// that starts at member `b + 1`.
///
/// Reduce-scatter: in step `k = 0..n-1` send block `me - k` to `me + 1`, receive block
/// `me - k - 1` from `me - 1` and combine it (incoming partial on the left); member `r` then
/// holds the full block `r + 1`. Each block is reduced along one chain, then only copied, so
/// every member ends with the same bits. Allgather: `n - 1` more steps pass the full blocks on.
pub(crate) fn plan_ring(p: &mut Plan, g: Grp<'_>, acc: Span, v: Vector, tag: u32) {
    let (me, n) = (g.me, g.n);
    let (right, left) = (g.rank((me + 1) % n), g.rank((me + n - 1) % n));
    let blk = |s: Span, b: usize| v.blocks(s, b % n, b % n + 1, n);
    let tmp = p.temp(blk(acc, 0).len);
    p.next();
    for k in 0..n - 1 {
        let r = blk(acc, me + 2 * n - k - 1);
        let t = tmp.sub(0..r.len);
        p.send(blk(acc, me + n - k), right, tag);
        p.recv(t, left, tag);
        p.next();
        p.combine(t, r, true);
    }
    p.next();
    for k in 0..n - 1 {
        p.send(blk(acc, me + 1 + n - k), right, tag + 1);
        p.recv(blk(acc, me + n - k), left, tag + 1);
        p.next();
    }
}

/// Allreduce as a reduce to member 0 in group order and a binomial broadcast: only member 0
/// ever applies the operator (for operators that are not commutative, where the ring cannot
/// serve, and whose calls may be costly).
pub(crate) fn plan_reduce_bcast(p: &mut Plan, g: Grp<'_>, send: Span, acc: Span, tag: u32) {
    plan_reduce_binomial(p, g, send, Some(acc), 0, true, tag);
    super::bcast::plan_binomial(p, g, acc, 0, tag + 2);
}

/// The argument checks of [`super::run::reduce`], as every path makes them.
pub(crate) fn check_reduce<T>(send: &[T], recv: Option<&[T]>, is_root: bool) -> Result<()> {
    if is_root {
        let r = recv.ok_or_else(|| Error::InvalidBuffer("reduce: the root must pass a receive buffer".into()))?;
        if r.len() != send.len() {
            return Err(Error::InvalidBuffer(format!("reduce: receive buffer has {} elements, send buffer {}", r.len(), send.len())));
        }
    }
    Ok(())
}

/// [`reduce`] by the binomial tree (rooted at `root`).
///
/// # Errors
/// As [`reduce`].
#[cfg(test)]
pub(crate) fn reduce_binomial<T: Reducible, C: super::CollP2p + ?Sized>(
    c: &C,
    send: &[T],
    recv: Option<&mut [T]>,
    op: Op,
    root: usize,
) -> Result<()> {
    let mut p = Plan::reducing(builtin::<T>(op));
    let len = std::mem::size_of_val(send);
    let recv = if c.rank() == root { recv } else { None };
    plan_reduce_binomial(
        &mut p,
        Grp::all(c.rank(), c.size()),
        super::plan::inp(0, len),
        recv.as_ref().map(|_| super::plan::out(0, len)),
        root,
        false,
        super::tags::REDUCE,
    );
    c.run(p, Some(bytemuck::cast_slice(send)), recv.map(|r| bytemuck::cast_slice_mut(r)))
}

/// [`reduce`] by Rabenseifner's reduce-scatter and gather.
///
/// # Errors
/// As [`reduce`].
#[cfg(test)]
pub(crate) fn reduce_rabenseifner<T: Reducible, C: super::CollP2p + ?Sized>(
    c: &C,
    send: &[T],
    recv: Option<&mut [T]>,
    op: Op,
    root: usize,
) -> Result<()> {
    let mut p = Plan::reducing(builtin::<T>(op));
    let v = Vector { n: send.len(), es: std::mem::size_of::<T>() };
    let recv = if c.rank() == root { recv } else { None };
    let o = recv.as_ref().map(|_| super::plan::out(0, v.bytes()));
    plan_reduce_rabenseifner(&mut p, Grp::all(c.rank(), c.size()), super::plan::inp(0, v.bytes()), o, v, root, super::tags::REDUCE_FOLD);
    c.run(p, Some(bytemuck::cast_slice(send)), recv.map(|r| bytemuck::cast_slice_mut(r)))
}

/// Runs an allreduce planner on `acc` (which holds this rank's contribution, or receives it
/// from `from`).
#[cfg(test)]
fn allreduce_with<T: Reducible, C: super::CollP2p + ?Sized>(
    c: &C,
    from: Option<&[T]>,
    acc: &mut [T],
    op: Op,
    plan: impl FnOnce(&mut Plan, Grp<'_>, Option<Span>, Span, Vector),
) -> Result<()> {
    let mut p = Plan::reducing(builtin::<T>(op));
    let v = Vector { n: acc.len(), es: std::mem::size_of::<T>() };
    plan(&mut p, Grp::all(c.rank(), c.size()), from.map(|_| super::plan::inp(0, v.bytes())), super::plan::out(0, v.bytes()), v);
    c.run(p, from.map(|f| bytemuck::cast_slice(f)), Some(bytemuck::cast_slice_mut(acc)))
}

/// Recursive-doubling allreduce in place on `acc`, which holds this rank's contribution.
///
/// # Errors
/// Transport errors and mismatched lengths between ranks.
#[cfg(test)]
pub(crate) fn allreduce_recursive_doubling<T: Reducible, C: super::CollP2p + ?Sized>(c: &C, acc: &mut [T], op: Op) -> Result<()> {
    allreduce_with(c, None, acc, op, |p, g, _, a, _| plan_recursive_doubling(p, g, a, super::tags::ALLREDUCE))
}

/// Rabenseifner allreduce into `acc`; this rank's contribution is in `from`, or with `None`
/// already in `acc`.
///
/// # Errors
/// Transport errors and mismatched lengths between ranks.
#[cfg(test)]
pub(crate) fn allreduce_rabenseifner<T: Reducible, C: super::CollP2p + ?Sized>(
    c: &C,
    from: Option<&[T]>,
    acc: &mut [T],
    op: Op,
) -> Result<()> {
    allreduce_with(c, from, acc, op, |p, g, f, a, v| plan_rabenseifner(p, g, f, a, v, super::tags::REDUCE_FOLD))
}

/// Ring allreduce in place on `acc`, which holds this rank's contribution.
///
/// # Errors
/// Transport errors and mismatched lengths between ranks.
#[cfg(test)]
pub(crate) fn allreduce_ring<T: Reducible, C: super::CollP2p + ?Sized>(c: &C, acc: &mut [T], op: Op) -> Result<()> {
    allreduce_with(c, None, acc, op, |p, g, _, a, v| plan_ring(p, g, a, v, super::tags::ALLREDUCE_RING))
}
