//! Gather and scatter: binomial tree for small blocks, linear for large ones.

use super::{abs, check_root, mul_len, recv_exact, rel, tags, CollP2p, GATHER_LINEAR_BYTES};
use crate::error::{Error, Result};

/// Number of relative ranks in the binomial subtree of `vr`: `[vr, vr + lowbit(vr))` clipped
/// to `size` (the whole communicator for `vr == 0`).
fn subtree(vr: usize, size: usize) -> usize {
    if vr == 0 {
        size
    } else {
        (vr & vr.wrapping_neg()).min(size - vr)
    }
}

/// Collects `send` of every rank, in rank order, into `recv` at `root`.
///
/// At the root `recv` must be `Some` with `recv.len() == size * send.len()`; other ranks may
/// pass `None` (a `Some` there is ignored). Blocks below [`GATHER_LINEAR_BYTES`] travel up a
/// binomial tree (`log2 p` steps, interior ranks forward their subtree's blocks); larger blocks
/// go straight to the root, which receives them directly in place.
///
/// # Errors
/// Before any communication: [`Error::InvalidRoot`], [`Error::InvalidBuffer`] (root without a
/// buffer, or the wrong length). Then transport errors and mismatched lengths between ranks.
pub fn gather<C: CollP2p + ?Sized>(c: &C, send: &[u8], recv: Option<&mut [u8]>, root: usize) -> Result<()> {
    let (rank, size) = (c.rank(), c.size());
    check_root(root, size)?;
    let recv = if rank == root {
        let r = recv.ok_or_else(|| Error::InvalidBuffer("gather: the root must pass a receive buffer".into()))?;
        let want = mul_len(size, send.len(), "gather")?;
        if r.len() != want {
            return Err(Error::InvalidBuffer(format!(
                "gather: receive buffer has {} bytes, {size} ranks * {} bytes = {want} needed",
                r.len(),
                send.len()
            )));
        }
        Some(r)
    } else {
        None
    };
    if send.is_empty() {
        return Ok(());
    }
    if size == 1 {
        if let Some(r) = recv {
            r.copy_from_slice(send);
        }
        return Ok(());
    }
    if send.len() < GATHER_LINEAR_BYTES {
        gather_binomial(c, send, recv, root)
    } else {
        gather_linear(c, send, recv, root)
    }
}

/// Linear gather: every rank sends to the root, which receives block `r` from rank `r` in
/// rank order, directly into `recv`.
pub(crate) fn gather_linear<C: CollP2p + ?Sized>(c: &C, send: &[u8], recv: Option<&mut [u8]>, root: usize) -> Result<()> {
    let (rank, size) = (c.rank(), c.size());
    let blk = send.len();
    match recv {
        Some(out) if rank == root => {
            for (r, dst) in out.chunks_exact_mut(blk.max(1)).enumerate().take(size) {
                if r == rank {
                    dst.copy_from_slice(send);
                } else {
                    recv_exact(c, dst, r, tags::GATHER)?;
                }
            }
            Ok(())
        }
        _ => c.send(send, root, tags::GATHER),
    }
}

/// Binomial gather: relative rank `vr` collects the blocks of its subtree, in relative order,
/// into one buffer (children `vr + 2^j` deliver theirs at offset `2^j` blocks) and sends it to
/// its parent; the root rotates relative order back into rank order.
pub(crate) fn gather_binomial<C: CollP2p + ?Sized>(c: &C, send: &[u8], recv: Option<&mut [u8]>, root: usize) -> Result<()> {
    let (rank, size) = (c.rank(), c.size());
    let blk = send.len();
    let vr = rel(rank, root, size);
    let sub = subtree(vr, size);
    let lowbit = vr & vr.wrapping_neg();
    if sub == 1 && vr != 0 {
        // A leaf sends its own block: no copy.
        return c.send(send, abs(vr - lowbit, root, size), tags::GATHER);
    }
    // Interior ranks (and the root unless it is rank 0) collect into a scratch buffer; root 0
    // collects straight into `recv`, where relative and absolute order coincide.
    let mut own = Vec::new();
    let direct = root == 0 && vr == 0 && recv.is_some();
    let (buf, out): (&mut [u8], Option<&mut [u8]>) = match recv {
        Some(r) if direct => (r, None),
        r => {
            own.resize(sub * blk, 0);
            (&mut own[..], r)
        }
    };
    buf[..blk].copy_from_slice(send);
    let mut mask = 1;
    while mask < size {
        if vr & mask != 0 {
            return c.send(&buf[..sub * blk], abs(vr - mask, root, size), tags::GATHER);
        }
        let child = vr + mask;
        if child < size {
            let cnt = subtree(child, size);
            let dst = &mut buf[mask * blk..(mask + cnt) * blk];
            recv_exact(c, dst, abs(child, root, size), tags::GATHER)?;
        }
        mask <<= 1;
    }
    // Root: relative block j belongs to rank (j + root) % size.
    if let Some(out) = out {
        let split = (size - root) * blk;
        out[root * blk..].copy_from_slice(&buf[..split]);
        out[..root * blk].copy_from_slice(&buf[split..]);
    }
    Ok(())
}

/// Distributes consecutive blocks of `send` at `root`: rank `r` receives block `r` into `recv`.
///
/// At the root `send` must be `Some` with `send.len() == size * recv.len()`; other ranks may
/// pass `None` (a `Some` there is ignored). Blocks below [`GATHER_LINEAR_BYTES`] travel down a
/// binomial tree; larger ones go straight from the root to each rank.
///
/// # Errors
/// Before any communication: [`Error::InvalidRoot`], [`Error::InvalidBuffer`] (root without a
/// buffer, or the wrong length). Then transport errors and mismatched lengths between ranks.
pub fn scatter<C: CollP2p + ?Sized>(c: &C, send: Option<&[u8]>, recv: &mut [u8], root: usize) -> Result<()> {
    let (rank, size) = (c.rank(), c.size());
    check_root(root, size)?;
    let send = if rank == root {
        let s = send.ok_or_else(|| Error::InvalidBuffer("scatter: the root must pass a send buffer".into()))?;
        let want = mul_len(size, recv.len(), "scatter")?;
        if s.len() != want {
            return Err(Error::InvalidBuffer(format!(
                "scatter: send buffer has {} bytes, {size} ranks * {} bytes = {want} needed",
                s.len(),
                recv.len()
            )));
        }
        Some(s)
    } else {
        None
    };
    if recv.is_empty() {
        return Ok(());
    }
    if size == 1 {
        if let Some(s) = send {
            recv.copy_from_slice(s);
        }
        return Ok(());
    }
    if recv.len() < GATHER_LINEAR_BYTES {
        scatter_binomial(c, send, recv, root)
    } else {
        scatter_linear(c, send, recv, root)
    }
}

/// Linear scatter: the root sends block `r` to rank `r` in rank order.
pub(crate) fn scatter_linear<C: CollP2p + ?Sized>(c: &C, send: Option<&[u8]>, recv: &mut [u8], root: usize) -> Result<()> {
    let (rank, size) = (c.rank(), c.size());
    let blk = recv.len();
    match send {
        Some(all) if rank == root => {
            for (r, src) in all.chunks_exact(blk.max(1)).enumerate().take(size) {
                if r == rank {
                    recv.copy_from_slice(src);
                } else {
                    c.send(src, r, tags::SCATTER)?;
                }
            }
            Ok(())
        }
        _ => recv_exact(c, recv, root, tags::SCATTER),
    }
}

/// Binomial scatter: relative rank `vr` receives its subtree's blocks (relative order) from its
/// parent, passes each child `vr + 2^j` its subtree's part (largest first) and keeps block 0.
/// The root first rotates rank order into relative order (unless it is rank 0).
pub(crate) fn scatter_binomial<C: CollP2p + ?Sized>(c: &C, send: Option<&[u8]>, recv: &mut [u8], root: usize) -> Result<()> {
    let (rank, size) = (c.rank(), c.size());
    let blk = recv.len();
    let vr = rel(rank, root, size);
    let sub = subtree(vr, size);
    let lowbit = vr & vr.wrapping_neg();
    if sub == 1 && vr != 0 {
        return recv_exact(c, recv, abs(vr - lowbit, root, size), tags::SCATTER);
    }
    let mut own = Vec::new();
    let buf: &[u8] = match send {
        Some(all) if vr == 0 && root == 0 => all,
        Some(all) if vr == 0 => {
            own.reserve_exact(all.len());
            own.extend_from_slice(&all[root * blk..]);
            own.extend_from_slice(&all[..root * blk]);
            &own
        }
        _ => {
            own.resize(sub * blk, 0);
            recv_exact(c, &mut own, abs(vr - lowbit, root, size), tags::SCATTER)?;
            &own
        }
    };
    // Children vr + mask for mask < lowbit(vr) (every mask < size at the root), largest first.
    let mut mask = if vr == 0 { super::pof2_floor(size - 1).max(1) } else { lowbit >> 1 };
    while mask > 0 {
        let child = vr + mask;
        if child < size {
            let cnt = subtree(child, size);
            c.send(&buf[mask * blk..(mask + cnt) * blk], abs(child, root, size), tags::SCATTER)?;
        }
        mask >>= 1;
    }
    recv.copy_from_slice(&buf[..blk]);
    Ok(())
}
