//! Broadcast: binomial tree, or binomial scatter + ring allgather for long messages.

use super::plan::{Grp, Plan, Span};

/// Binomial-tree broadcast of `buf` from member `root` of `g`: relative member `vr` receives
/// from `vr - lowbit(vr)`, then sends to `vr + 2^j` for every `2^j < lowbit(vr)`, largest
/// first (`log2 n` steps, the whole message each).
pub(crate) fn plan_binomial(p: &mut Plan, g: Grp<'_>, buf: Span, root: usize, tag: u32) {
    let n = g.n;
    let vr = (g.me + n - root) % n;
    let abs = |v: usize| g.rank((v + root) % n);
    p.next();
    let mut mask = 1;
    while mask < n {
        if vr & mask != 0 {
            p.recv(buf, abs(vr - mask), tag);
            p.next();
            break;
        }
        mask <<= 1;
    }
    mask >>= 1;
    while mask > 0 {
        if vr + mask < n {
            p.send(buf, abs(vr + mask), tag);
        }
        mask >>= 1;
    }
    p.next();
}

/// Bytes of pieces `first..first + count` when `n` bytes are cut into pieces of `chunk`.
fn piece(buf: Span, first: usize, count: usize, chunk: usize) -> Span {
    buf.sub(first * chunk..(first + count) * chunk)
}

/// Scatter (binomial) + ring allgather broadcast (van de Geijn), for long messages.
///
/// The message is cut into `n` pieces of `ceil(len / n)` bytes (the last ones may be short or
/// empty); relative member `vr` owns piece `vr`. The scatter sends each subtree its pieces;
/// the ring then circulates every piece once around all members, so each moves about `2 len`
/// bytes instead of `len log2 n`. Empty pieces are skipped on both sides.
pub(crate) fn plan_scatter_allgather(p: &mut Plan, g: Grp<'_>, buf: Span, root: usize, tag: u32) {
    let n = g.n;
    let chunk = buf.len.div_ceil(n.max(1));
    let vr = (g.me + n - root) % n;
    let abs = |v: usize| g.rank((v + root) % n);
    p.next();
    // Scatter: receive my subtree's pieces [vr, vr + lowbit(vr)) from the parent...
    let mut mask = 1;
    while mask < n {
        if vr & mask != 0 {
            let r = piece(buf, vr, mask.min(n - vr), chunk);
            if r.len > 0 {
                p.recv(r, abs(vr - mask), tag);
                p.next();
            }
            break;
        }
        mask <<= 1;
    }
    // ... and hand each child its subtree's pieces.
    mask >>= 1;
    while mask > 0 {
        let child = vr + mask;
        if child < n {
            let r = piece(buf, child, mask.min(n - child), chunk);
            if r.len > 0 {
                p.send(r, abs(child), tag);
            }
        }
        mask >>= 1;
    }
    p.next();
    // Ring allgather in relative ranks: in step i send piece vr - i to the right neighbour and
    // receive piece vr - i - 1 from the left one.
    let (right, left) = (abs((vr + 1) % n), abs((vr + n - 1) % n));
    for i in 0..n.saturating_sub(1) {
        let s = piece(buf, (vr + n - i) % n, 1, chunk);
        let r = piece(buf, (vr + n - i - 1) % n, 1, chunk);
        if s.len > 0 {
            p.send(s, right, tag + 1);
        }
        if r.len > 0 {
            p.recv(r, left, tag + 1);
        }
        p.next();
    }
}

/// [`bcast`] by the binomial tree.
///
/// # Errors
/// As [`bcast`].
#[cfg(test)]
pub(crate) fn bcast_binomial<C: super::CollP2p + ?Sized>(c: &C, buf: &mut [u8], root: usize) -> crate::error::Result<()> {
    super::check_root(root, c.size())?;
    let mut p = Plan::new();
    plan_binomial(&mut p, Grp::all(c.rank(), c.size()), super::plan::out(0, buf.len()), root, super::tags::BCAST);
    c.run(p, None, Some(buf))
}

/// [`bcast`] by scatter + ring allgather.
///
/// # Errors
/// As [`bcast`].
#[cfg(test)]
pub(crate) fn bcast_scatter_ring<C: super::CollP2p + ?Sized>(c: &C, buf: &mut [u8], root: usize) -> crate::error::Result<()> {
    super::check_root(root, c.size())?;
    let mut p = Plan::new();
    plan_scatter_allgather(&mut p, Grp::all(c.rank(), c.size()), super::plan::out(0, buf.len()), root, super::tags::BCAST_SCATTER);
    c.run(p, None, Some(buf))
}
