//! Allgather: recursive doubling, Bruck, ring.
//!
//! The planners collect `n` blocks of `blk` bytes in group order into `buf`; the caller puts
//! this member's own block in place first (Bruck takes it from `send`).

use super::plan::{Grp, Plan, Span};
use crate::error::{Error, Result};

/// Recursive doubling in place (power-of-two `n`; block `me` of `buf` already holds this
/// member's data): in step `m` exchange the `m` blocks of my aligned group with partner
/// `me ^ m`'s group.
pub(crate) fn plan_recursive_doubling(p: &mut Plan, g: Grp<'_>, buf: Span, blk: usize, tag: u32) {
    let me = g.me;
    p.next();
    let mut m = 1;
    while m < g.n {
        let partner = me ^ m;
        let (mine, theirs) = (me & !(m - 1), partner & !(m - 1));
        p.send(buf.sub(mine * blk..(mine + m) * blk), g.rank(partner), tag);
        p.recv(buf.sub(theirs * blk..(theirs + m) * blk), g.rank(partner), tag);
        p.next();
        m <<= 1;
    }
}

/// Bruck's allgather for any `n`: a scratch buffer starts with my block; in step `d = 1, 2,
/// 4, ...` send its first `min(d, n - d)` blocks to `me - d` and append as many from `me + d`.
/// Scratch block `j` then holds member `(me + j) % n`'s data; rotate into `buf`.
pub(crate) fn plan_bruck(p: &mut Plan, g: Grp<'_>, send: Span, buf: Span, tag: u32) {
    let (me, n, blk) = (g.me, g.n, send.len);
    let tmp = p.temp(n * blk);
    p.next();
    p.copy(send, tmp.sub(0..blk));
    let mut d = 1;
    while d < n {
        let cnt = d.min(n - d);
        p.send(tmp.sub(0..cnt * blk), g.rank((me + n - d) % n), tag);
        p.recv(tmp.sub(d * blk..(d + cnt) * blk), g.rank((me + d) % n), tag);
        p.next();
        d <<= 1;
    }
    let split = (n - me) * blk;
    p.copy(tmp.sub(0..split), buf.sub(me * blk..n * blk));
    p.copy(tmp.sub(split..n * blk), buf.sub(0..me * blk));
    p.next();
}

/// Ring allgather in place (block `me` of `buf` already holds this member's data): in step
/// `i` send block `me - i` to `me + 1` and receive block `me - i - 1` from `me - 1`.
pub(crate) fn plan_ring(p: &mut Plan, g: Grp<'_>, buf: Span, blk: usize, tag: u32) {
    let (me, n) = (g.me, g.n);
    let (right, left) = (g.rank((me + 1) % n), g.rank((me + n - 1) % n));
    p.next();
    for i in 0..n.saturating_sub(1) {
        let sb = (me + n - i) % n;
        let rb = (me + n - i - 1) % n;
        p.send(buf.sub(sb * blk..(sb + 1) * blk), right, tag);
        p.recv(buf.sub(rb * blk..(rb + 1) * blk), left, tag);
        p.next();
    }
}

/// The argument checks of [`super::run::allgather`].
pub(crate) fn check_allgather(size: usize, blk: usize, recv: usize) -> Result<()> {
    let total = super::mul_len(size, blk, "allgather")?;
    if recv != total {
        return Err(Error::InvalidBuffer(format!(
            "allgather: receive buffer has {recv} bytes, {size} ranks * {blk} bytes = {total} needed"
        )));
    }
    Ok(())
}

/// [`allgather`] by recursive doubling (power-of-two rank counts; block `rank` of `buf`
/// already holds this rank's data).
///
/// # Errors
/// [`crate::Error::State`] for other rank counts; transport errors.
#[cfg(test)]
pub(crate) fn allgather_recursive_doubling<C: super::CollP2p + ?Sized>(c: &C, buf: &mut [u8], blk: usize) -> Result<()> {
    if !c.size().is_power_of_two() {
        return Err(super::internal(format!("recursive doubling needs 2^k ranks, not {}", c.size())));
    }
    let mut p = Plan::new();
    plan_recursive_doubling(&mut p, Grp::all(c.rank(), c.size()), super::plan::out(0, buf.len()), blk, super::tags::ALLGATHER);
    c.run(p, None, Some(buf))
}

/// [`allgather`] by Bruck's algorithm.
///
/// # Errors
/// Transport errors and mismatched lengths between ranks.
#[cfg(test)]
pub(crate) fn allgather_bruck<C: super::CollP2p + ?Sized>(c: &C, send: &[u8], recv: &mut [u8]) -> Result<()> {
    let mut p = Plan::new();
    plan_bruck(
        &mut p,
        Grp::all(c.rank(), c.size()),
        super::plan::inp(0, send.len()),
        super::plan::out(0, recv.len()),
        super::tags::ALLGATHER_BRUCK,
    );
    c.run(p, Some(send), Some(recv))
}

/// [`allgather`] around the ring (block `rank` of `buf` already holds this rank's data).
///
/// # Errors
/// Transport errors and mismatched lengths between ranks.
#[cfg(test)]
pub(crate) fn allgather_ring<C: super::CollP2p + ?Sized>(c: &C, buf: &mut [u8], blk: usize) -> Result<()> {
    let mut p = Plan::new();
    plan_ring(&mut p, Grp::all(c.rank(), c.size()), super::plan::out(0, buf.len()), blk, super::tags::ALLGATHER_RING);
    c.run(p, None, Some(buf))
}
