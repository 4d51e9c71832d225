//! Allgather: recursive doubling, Bruck, ring.

use super::{mul_len, sendrecv_exact, split_pair, tags, CollP2p, ALLGATHER_BRUCK_BYTES, ALLGATHER_LONG_BYTES};
use crate::error::{Error, Result};

/// Collects `send` of every rank, in rank order, into `recv` on every rank
/// (`recv.len() == size * send.len()`).
///
/// Power-of-two rank counts with a total below [`ALLGATHER_LONG_BYTES`]: recursive doubling
/// (`log2 p` exchanges, doubling in size). Other counts below [`ALLGATHER_BRUCK_BYTES`]: Bruck
/// (`ceil(log2 p)` exchanges, then a local rotation). Otherwise: ring (`p - 1` neighbour
/// exchanges of one block, bandwidth-optimal).
///
/// # Errors
/// [`Error::InvalidBuffer`] before any communication when the lengths do not fit; then
/// transport errors and mismatched lengths between ranks.
pub fn allgather<C: CollP2p + ?Sized>(c: &C, send: &[u8], recv: &mut [u8]) -> Result<()> {
    let (rank, size) = (c.rank(), c.size());
    let blk = send.len();
    let total = mul_len(size, blk, "allgather")?;
    if recv.len() != total {
        return Err(Error::InvalidBuffer(format!(
            "allgather: receive buffer has {} bytes, {size} ranks * {blk} bytes = {total} needed",
            recv.len()
        )));
    }
    if blk == 0 {
        return Ok(());
    }
    if size == 1 {
        recv.copy_from_slice(send);
        return Ok(());
    }
    if size.is_power_of_two() && total < ALLGATHER_LONG_BYTES {
        recv[rank * blk..(rank + 1) * blk].copy_from_slice(send);
        allgather_recursive_doubling(c, recv, blk)
    } else if total < ALLGATHER_BRUCK_BYTES {
        allgather_bruck(c, send, recv)
    } else {
        recv[rank * blk..(rank + 1) * blk].copy_from_slice(send);
        allgather_ring(c, recv, blk)
    }
}

/// Recursive doubling in place (power-of-two `p`; block `rank` of `buf` already holds this
/// rank's data): in step `m` exchange the `m` blocks of my aligned group with partner
/// `rank ^ m`'s group.
pub(crate) fn allgather_recursive_doubling<C: CollP2p + ?Sized>(c: &C, buf: &mut [u8], blk: usize) -> Result<()> {
    let (rank, size) = (c.rank(), c.size());
    if !size.is_power_of_two() {
        return Err(super::internal(format!("recursive doubling needs 2^k ranks, not {size}")));
    }
    let mut m = 1;
    while m < size {
        let partner = rank ^ m;
        let (mine, theirs) = (rank & !(m - 1), partner & !(m - 1));
        let (s, r) = split_pair(buf, mine * blk..(mine + m) * blk, theirs * blk..(theirs + m) * blk)?;
        sendrecv_exact(c, s, partner, r, partner, tags::ALLGATHER)?;
        m <<= 1;
    }
    Ok(())
}

/// Bruck's allgather for any `p`: a scratch buffer starts with my block; in step `d = 1, 2, 4,
/// ...` send its first `min(d, p - d)` blocks to `rank - d` and append as many from
/// `rank + d`. Scratch block `j` then holds rank `(rank + j) % p`'s data; rotate into `recv`.
pub(crate) fn allgather_bruck<C: CollP2p + ?Sized>(c: &C, send: &[u8], recv: &mut [u8]) -> Result<()> {
    let (rank, size) = (c.rank(), c.size());
    let blk = send.len();
    let mut tmp = vec![0u8; size * blk];
    tmp[..blk].copy_from_slice(send);
    let mut d = 1;
    while d < size {
        let cnt = d.min(size - d);
        let to = (rank + size - d) % size;
        let from = (rank + d) % size;
        let (s, r) = split_pair(&mut tmp, 0..cnt * blk, d * blk..(d + cnt) * blk)?;
        sendrecv_exact(c, s, to, r, from, tags::ALLGATHER)?;
        d <<= 1;
    }
    let split = (size - rank) * blk;
    recv[rank * blk..].copy_from_slice(&tmp[..split]);
    recv[..rank * blk].copy_from_slice(&tmp[split..]);
    Ok(())
}

/// Ring allgather in place (block `rank` of `buf` already holds this rank's data): in step `i`
/// send block `rank - i` to `rank + 1` and receive block `rank - i - 1` from `rank - 1`.
pub(crate) fn allgather_ring<C: CollP2p + ?Sized>(c: &C, buf: &mut [u8], blk: usize) -> Result<()> {
    let (rank, size) = (c.rank(), c.size());
    let right = (rank + 1) % size;
    let left = (rank + size - 1) % size;
    for i in 0..size - 1 {
        let sb = (rank + size - i) % size;
        let rb = (rank + size - i - 1) % size;
        let (s, r) = split_pair(buf, sb * blk..(sb + 1) * blk, rb * blk..(rb + 1) * blk)?;
        sendrecv_exact(c, s, right, r, left, tags::ALLGATHER)?;
    }
    Ok(())
}
