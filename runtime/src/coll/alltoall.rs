//! Alltoall: pairwise exchange.

use super::{sendrecv_exact, tags, CollP2p};
use crate::error::{Error, Result};

/// Sends block `j` of `send` to rank `j` and receives block `i` of `recv` from rank `i`
/// (`send.len() == recv.len()`, a multiple of the communicator size).
///
/// Pairwise exchange in `p - 1` rounds: in round `i` exchange with `rank ^ i` when `p` is a
/// power of two (every pair meets exactly once, both sides in the same round), otherwise send
/// to `rank + i` and receive from `rank - i`. One message in flight per rank and round, so
/// memory stays flat however large `p` is (Open MPI's choice for large messages).
///
/// # Errors
/// [`Error::InvalidBuffer`] before any communication when the lengths do not fit; then
/// transport errors and mismatched lengths between ranks.
pub fn alltoall<C: CollP2p + ?Sized>(c: &C, send: &[u8], recv: &mut [u8]) -> Result<()> {
    let (rank, size) = (c.rank(), c.size());
    if send.len() != recv.len() || send.len() % size != 0 {
        return Err(Error::InvalidBuffer(format!(
            "alltoall: send has {} bytes and receive {}; both must be the same multiple of {size} \
             ranks",
            send.len(),
            recv.len()
        )));
    }
    let blk = send.len() / size;
    if blk == 0 {
        return Ok(());
    }
    let block = |r: usize| r * blk..(r + 1) * blk;
    recv[block(rank)].copy_from_slice(&send[block(rank)]);
    let pof2 = size.is_power_of_two();
    for i in 1..size {
        let (to, from) = if pof2 { (rank ^ i, rank ^ i) } else { ((rank + i) % size, (rank + size - i) % size) };
        sendrecv_exact(c, &send[block(to)], to, &mut recv[block(from)], from, tags::ALLTOALL)?;
    }
    Ok(())
}
