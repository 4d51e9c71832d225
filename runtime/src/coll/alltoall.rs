//! Alltoall: pairwise exchange, Bruck, linear.
//!
//! The planners move block `j` of `send` (`blk` bytes each, group order) to member `j`, and
//! member `i`'s block for this member into block `i` of `recv`.

use super::plan::{Grp, Plan, Span};
use crate::error::{Error, Result};

/// Pairwise exchange in `n - 1` rounds: in round `i` exchange with `me ^ i` when `n` is a power
/// of two (every pair meets exactly once, both sides in the same round), otherwise send to
/// `me + i` and receive from `me - i`. One message in flight per member and round, so memory
/// stays flat however large `n` is (Open MPI's choice for large messages).
pub(crate) fn plan_pairwise(p: &mut Plan, g: Grp<'_>, send: Span, recv: Span, blk: usize, tag: u32) {
    let (me, n) = (g.me, g.n);
    let block = |s: Span, r: usize| s.sub(r * blk..(r + 1) * blk);
    p.next();
    p.copy(block(send, me), block(recv, me));
    let pof2 = n.is_power_of_two();
    for i in 1..n {
        let (to, from) = if pof2 { (me ^ i, me ^ i) } else { ((me + i) % n, (me + n - i) % n) };
        p.send(block(send, to), g.rank(to), tag);
        p.recv(block(recv, from), g.rank(from), tag);
        p.next();
    }
    p.next();
}

/// Every block at once: one round of `n - 1` sends and `n - 1` receives (Open MPI's basic
/// linear; the fewest rounds, the most messages in flight).
pub(crate) fn plan_linear(p: &mut Plan, g: Grp<'_>, send: Span, recv: Span, blk: usize, tag: u32) {
    let (me, n) = (g.me, g.n);
    let block = |s: Span, r: usize| s.sub(r * blk..(r + 1) * blk);
    p.next();
    p.copy(block(send, me), block(recv, me));
    for i in 1..n {
        let from = (me + n - i) % n;
        p.recv(block(recv, from), g.rank(from), tag);
    }
    for i in 1..n {
        let to = (me + i) % n;
        p.send(block(send, to), g.rank(to), tag);
    }
    p.next();
}

/// Bruck's alltoall for small blocks: `ceil(log2 n)` rounds instead of `n - 1`, each moving
/// about half the blocks. Blocks are first rotated so that scratch block `i` is the one for
/// member `me + i`; in round `k` the blocks whose index has bit `k` set go (packed) to
/// `me + 2^k` and as many come from `me - 2^k` into the same indices; a block that started
/// at `s` for `t` thus travels `t - s` members and arrives at index `t - s`, so at the end
/// block `me - i` of `recv` is scratch block `i`.
pub(crate) fn plan_bruck(p: &mut Plan, g: Grp<'_>, send: Span, recv: Span, blk: usize, tag: u32) {
    let (me, n) = (g.me, g.n);
    let block = |s: Span, r: usize| s.sub(r * blk..(r + 1) * blk);
    let b = p.temp(n * blk);
    let moving = |k: usize| (0..n).filter(move |i| i & (1 << k) != 0);
    let most = (0..usize::BITS as usize).take_while(|&k| 1 << k < n).map(|k| moving(k).count()).max().unwrap_or(0);
    let (sp, rp) = (p.temp(most * blk), p.temp(most * blk));
    p.next();
    for i in 0..n {
        p.copy(block(send, (me + i) % n), block(b, i));
    }
    let mut k = 0;
    while 1 << k < n {
        let d = 1 << k;
        for (j, i) in moving(k).enumerate() {
            p.copy(block(b, i), block(sp, j));
        }
        let cnt = moving(k).count();
        p.send(sp.sub(0..cnt * blk), g.rank((me + d) % n), tag);
        p.recv(rp.sub(0..cnt * blk), g.rank((me + n - d) % n), tag);
        p.next();
        for (j, i) in moving(k).enumerate() {
            p.copy(block(rp, j), block(b, i));
        }
        k += 1;
    }
    for i in 0..n {
        p.copy(block(b, i), block(recv, (me + n - i) % n));
    }
    p.next();
}

/// The argument checks of [`super::run::alltoall`]: `send` and `recv` bytes, of elements of
/// `elem` bytes (at least 1), the same length and a whole number of elements per rank (so no
/// element is split between two ranks' blocks).
pub(crate) fn check_alltoall(size: usize, elem: usize, send: usize, recv: usize) -> Result<()> {
    let row = super::mul_len(size, elem.max(1), "alltoall")?;
    if send != recv || send % row != 0 {
        return Err(Error::InvalidBuffer(format!(
            "alltoall: send has {send} bytes and receive {recv}; both must be the same multiple of \
             {size} ranks * {} bytes an element",
            elem.max(1)
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::check_alltoall;

    /// (ranks, bytes an element, send bytes, receive bytes, accepted).
    const CASES: &[(usize, usize, usize, usize, bool)] = &[
        (2, 4, 16, 16, true),
        (2, 4, 0, 0, true),
        (1, 8, 24, 24, true),
        // 20 bytes split in two blocks of 10: each would end inside a 4-byte element.
        (2, 4, 20, 20, false),
        (4, 4, 36, 36, false),
        (3, 1, 7, 7, false),
        (2, 4, 16, 24, false),
        // An element of no bytes (a zero-sized type) counts as one byte.
        (3, 0, 6, 6, true),
        (usize::MAX, 2, 4, 4, false),
    ];

    #[test]
    fn whole_elements_per_rank_and_equal_lengths() {
        for &(size, elem, send, recv, ok) in CASES {
            assert_eq!(check_alltoall(size, elem, send, recv).is_ok(), ok, "{size} ranks, {elem}-byte elements, {send} -> {recv}");
        }
    }
}
