//! Dissemination barrier.

use super::{tags, CollP2p};
use crate::error::Result;

/// Blocks until every rank of the communicator has entered the barrier.
///
/// Dissemination: in round `k` each rank sends an empty message to `rank + 2^k` and waits for
/// one from `rank - 2^k` (mod p), `ceil(log2 p)` rounds for any p. A rank leaves only after it
/// has, transitively, heard from every other rank.
///
/// # Errors
/// Transport errors of [`CollP2p`], e.g. [`crate::Error::PeerGone`].
pub fn barrier<C: CollP2p + ?Sized>(c: &C) -> Result<()> {
    let (rank, size) = (c.rank(), c.size());
    let mut dist = 1;
    while dist < size {
        let to = (rank + dist) % size;
        let from = (rank + size - dist) % size;
        c.sendrecv(&[], to, tags::BARRIER, &mut [], from, tags::BARRIER)?;
        dist <<= 1;
    }
    Ok(())
}
