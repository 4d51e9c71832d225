//! Broadcast: binomial tree, or binomial scatter + ring allgather for long messages.

use super::{abs, check_root, recv_exact, rel, sendrecv_exact, split_pair, tags, CollP2p, BCAST_LONG_BYTES, BCAST_MIN_PROCS_LONG};
use crate::error::Result;

/// Copies `buf` of `root` into `buf` of every rank. Every rank passes the same length.
///
/// Binomial tree below [`BCAST_LONG_BYTES`] or with fewer than [`BCAST_MIN_PROCS_LONG`] ranks
/// (`log2 p` steps, the whole message each); otherwise the root scatters the message in `p`
/// pieces down a binomial tree and a ring allgather assembles it everywhere, which moves about
/// `2 n` bytes per rank instead of `n log2 p`.
///
/// # Errors
/// [`crate::Error::InvalidRoot`] before any communication; [`crate::Error::Truncated`] or
/// [`crate::Error::InvalidBuffer`] when ranks pass different lengths; transport errors.
pub fn bcast<C: CollP2p + ?Sized>(c: &C, buf: &mut [u8], root: usize) -> Result<()> {
    let size = c.size();
    check_root(root, size)?;
    if size == 1 || buf.is_empty() {
        return Ok(());
    }
    if buf.len() < BCAST_LONG_BYTES || size < BCAST_MIN_PROCS_LONG {
        bcast_binomial(c, buf, root)
    } else {
        bcast_scatter_ring(c, buf, root)
    }
}

/// Binomial-tree broadcast (relative rank `vr` receives from `vr - lowbit(vr)`, then sends to
/// `vr + 2^j` for every `2^j < lowbit(vr)`, largest first).
pub(crate) fn bcast_binomial<C: CollP2p + ?Sized>(c: &C, buf: &mut [u8], root: usize) -> Result<()> {
    let (rank, size) = (c.rank(), c.size());
    let vr = rel(rank, root, size);
    let mut mask = 1;
    while mask < size {
        if vr & mask != 0 {
            recv_exact(c, buf, abs(vr - mask, root, size), tags::BCAST)?;
            break;
        }
        mask <<= 1;
    }
    mask >>= 1;
    while mask > 0 {
        if vr + mask < size {
            c.send(buf, abs(vr + mask, root, size), tags::BCAST)?;
        }
        mask >>= 1;
    }
    Ok(())
}

/// Byte range of relative rank `vr`'s piece `[vr * chunk, (vr + 1) * chunk)`, clipped to `n`.
fn piece(first: usize, count: usize, chunk: usize, n: usize) -> std::ops::Range<usize> {
    let lo = (first * chunk).min(n);
    let hi = ((first + count) * chunk).min(n);
    lo..hi
}

/// Scatter (binomial) + ring allgather broadcast (van de Geijn), for long messages.
///
/// The message is cut into `p` pieces of `ceil(n / p)` bytes (the last ones may be short or
/// empty); relative rank `vr` owns piece `vr`. The scatter sends each subtree its pieces; the
/// ring then circulates every piece once around all ranks.
pub(crate) fn bcast_scatter_ring<C: CollP2p + ?Sized>(c: &C, buf: &mut [u8], root: usize) -> Result<()> {
    let (rank, size) = (c.rank(), c.size());
    let n = buf.len();
    let chunk = n.div_ceil(size);
    let vr = rel(rank, root, size);

    // Scatter: receive my subtree's pieces [vr, vr + lowbit(vr)) from the parent.
    let mut mask = 1;
    while mask < size {
        if vr & mask != 0 {
            let r = piece(vr, mask.min(size - vr), chunk, n);
            if !r.is_empty() {
                recv_exact(c, &mut buf[r], abs(vr - mask, root, size), tags::BCAST_SCATTER)?;
            }
            break;
        }
        mask <<= 1;
    }
    // ... and hand each child its subtree's pieces.
    mask >>= 1;
    while mask > 0 {
        let child = vr + mask;
        if child < size {
            let r = piece(child, mask.min(size - child), chunk, n);
            if !r.is_empty() {
                c.send(&buf[r], abs(child, root, size), tags::BCAST_SCATTER)?;
            }
        }
        mask >>= 1;
    }

    // Ring allgather in relative ranks: in step i send piece vr - i to the right neighbour and
    // receive piece vr - i - 1 from the left one. Pieces are skipped on both sides when empty.
    let right = abs((vr + 1) % size, root, size);
    let left = abs((vr + size - 1) % size, root, size);
    for i in 0..size - 1 {
        let s = piece((vr + size - i) % size, 1, chunk, n);
        let r = piece((vr + size - i - 1) % size, 1, chunk, n);
        match (s.is_empty(), r.is_empty()) {
            (true, true) => {}
            (false, true) => c.send(&buf[s], right, tags::BCAST_RING)?,
            (true, false) => recv_exact(c, &mut buf[r], left, tags::BCAST_RING)?,
            (false, false) => {
                let (sb, rb) = split_pair(buf, s, r)?;
                sendrecv_exact(c, sb, right, rb, left, tags::BCAST_RING)?;
            }
        }
    }
    Ok(())
}
