//! Gather and scatter: binomial tree for small blocks, linear for large ones.
//!
//! The planners lay blocks out in group order; rooted elsewhere than member 0, the binomial
//! ones rotate between group order and relative order with local copies.

use super::plan::{Grp, Plan, Span};
use crate::error::{Error, Result};

/// Number of relative members in the binomial subtree of `vr`: `[vr, vr + lowbit(vr))`
/// clipped to `n` (the whole group for `vr == 0`).
pub(crate) fn subtree(vr: usize, n: usize) -> usize {
    if vr == 0 {
        n
    } else {
        (vr & vr.wrapping_neg()).min(n - vr)
    }
}

/// Binomial gather of `send` (`blk` bytes) to member `root` of `g`, into `recv` (`n * blk`
/// bytes, `Some` at the root): relative member `vr` collects the blocks of its subtree, in
/// relative order, into one buffer (children `vr + 2^j` deliver theirs at offset `2^j` blocks)
/// and sends it to its parent; the root rotates relative order back into group order (root
/// member 0 collects straight into `recv`).
pub(crate) fn plan_gather_binomial(p: &mut Plan, g: Grp<'_>, send: Span, recv: Option<Span>, root: usize, tag: u32) {
    let (n, blk) = (g.n, send.len);
    let vr = (g.me + n - root) % n;
    let abs = |v: usize| g.rank((v + root) % n);
    let sub = subtree(vr, n);
    let lowbit = vr & vr.wrapping_neg();
    p.next();
    if sub == 1 && vr != 0 {
        // A leaf sends its own block: no copy.
        p.send(send, abs(vr - lowbit), tag);
        p.next();
        return;
    }
    let direct = root == 0 && vr == 0 && recv.is_some();
    let buf = match recv {
        Some(r) if direct => r,
        _ => p.temp(sub * blk),
    };
    p.copy(send, buf.sub(0..blk));
    let mut mask = 1;
    while mask < n && (vr == 0 || mask < lowbit) {
        let child = vr + mask;
        if child < n {
            let cnt = subtree(child, n);
            p.recv(buf.sub(mask * blk..(mask + cnt) * blk), abs(child), tag);
        }
        mask <<= 1;
    }
    p.next();
    if vr != 0 {
        p.send(buf.sub(0..sub * blk), abs(vr - lowbit), tag);
        p.next();
    } else if let Some(o) = recv.filter(|_| !direct) {
        // Relative block j belongs to member (j + root) % n.
        let split = (n - root) * blk;
        p.copy(buf.sub(0..split), o.sub(root * blk..n * blk));
        p.copy(buf.sub(split..n * blk), o.sub(0..root * blk));
        p.next();
    }
}

/// Linear gather: every member sends to the root, which receives block `i` from member `i`
/// directly into `recv`, all at once.
pub(crate) fn plan_gather_linear(p: &mut Plan, g: Grp<'_>, send: Span, recv: Option<Span>, root: usize, tag: u32) {
    let blk = send.len;
    p.next();
    match recv {
        Some(o) if g.me == root => {
            p.copy(send, o.sub(root * blk..(root + 1) * blk));
            for i in (0..g.n).filter(|&i| i != root) {
                p.recv(o.sub(i * blk..(i + 1) * blk), g.rank(i), tag);
            }
        }
        _ => p.send(send, g.rank(root), tag),
    }
    p.next();
}

/// Binomial scatter of `send` (`n * blk` bytes at the root) from member `root` of `g`: relative
/// member `vr` receives its subtree's blocks (relative order) from its parent, passes each
/// child `vr + 2^j` its subtree's part and keeps block 0. The root first rotates group order
/// into relative order (unless it is member 0).
pub(crate) fn plan_scatter_binomial(p: &mut Plan, g: Grp<'_>, send: Option<Span>, recv: Span, root: usize, tag: u32) {
    let (n, blk) = (g.n, recv.len);
    let vr = (g.me + n - root) % n;
    let abs = |v: usize| g.rank((v + root) % n);
    let sub = subtree(vr, n);
    let lowbit = vr & vr.wrapping_neg();
    p.next();
    if sub == 1 && vr != 0 {
        p.recv(recv, abs(vr - lowbit), tag);
        p.next();
        return;
    }
    let buf = match send {
        Some(all) if vr == 0 && root == 0 => all,
        Some(all) if vr == 0 => {
            let t = p.temp(n * blk);
            let split = (n - root) * blk;
            p.copy(all.sub(root * blk..n * blk), t.sub(0..split));
            p.copy(all.sub(0..root * blk), t.sub(split..n * blk));
            p.next();
            t
        }
        _ => {
            let t = p.temp(sub * blk);
            p.recv(t, abs(vr - lowbit), tag);
            p.next();
            t
        }
    };
    // Children vr + mask for mask < lowbit(vr) (every mask < n at the root), largest first.
    let mut mask = if vr == 0 { super::plan::pof2_floor(n - 1).max(1) } else { lowbit >> 1 };
    while mask > 0 {
        let child = vr + mask;
        if child < n {
            let cnt = subtree(child, n);
            p.send(buf.sub(mask * blk..(mask + cnt) * blk), abs(child), tag);
        }
        mask >>= 1;
    }
    p.copy(buf.sub(0..blk), recv);
    p.next();
}

/// Linear scatter: the root sends block `i` to member `i`, all at once.
pub(crate) fn plan_scatter_linear(p: &mut Plan, g: Grp<'_>, send: Option<Span>, recv: Span, root: usize, tag: u32) {
    let blk = recv.len;
    p.next();
    match send {
        Some(all) if g.me == root => {
            for i in (0..g.n).filter(|&i| i != root) {
                p.send(all.sub(i * blk..(i + 1) * blk), g.rank(i), tag);
            }
            p.copy(all.sub(root * blk..(root + 1) * blk), recv);
        }
        _ => p.recv(recv, g.rank(root), tag),
    }
    p.next();
}

/// The argument checks of [`super::run::gather`] at the root.
pub(crate) fn check_gather(what: &str, size: usize, blk: usize, root_buf: Option<usize>) -> Result<()> {
    let side = if what == "gather" { "receive" } else { "send" };
    let have = root_buf.ok_or_else(|| Error::InvalidBuffer(format!("{what}: the root must pass a {side} buffer")))?;
    let want = super::mul_len(size, blk, what)?;
    if have != want {
        return Err(Error::InvalidBuffer(format!("{what}: {side} buffer has {have} bytes, {size} ranks * {blk} bytes = {want} needed")));
    }
    Ok(())
}

/// Runs one gather planner (see [`gather`]; arguments checked by the caller).
#[cfg(test)]
fn gather_by<C: super::CollP2p + ?Sized>(
    c: &C,
    send: &[u8],
    recv: Option<&mut [u8]>,
    root: usize,
    plan: fn(&mut Plan, Grp<'_>, Span, Option<Span>, usize, u32),
) -> Result<()> {
    let recv = if c.rank() == root { recv } else { None };
    let mut p = Plan::new();
    plan(
        &mut p,
        Grp::all(c.rank(), c.size()),
        super::plan::inp(0, send.len()),
        recv.as_ref().map(|r| super::plan::out(0, r.len())),
        root,
        super::tags::GATHER,
    );
    c.run(p, Some(send), recv)
}

/// Runs one scatter planner (see [`scatter`]; arguments checked by the caller).
#[cfg(test)]
fn scatter_by<C: super::CollP2p + ?Sized>(
    c: &C,
    send: Option<&[u8]>,
    recv: &mut [u8],
    root: usize,
    plan: fn(&mut Plan, Grp<'_>, Option<Span>, Span, usize, u32),
) -> Result<()> {
    let send = if c.rank() == root { send } else { None };
    let mut p = Plan::new();
    plan(
        &mut p,
        Grp::all(c.rank(), c.size()),
        send.map(|s| super::plan::inp(0, s.len())),
        super::plan::out(0, recv.len()),
        root,
        super::tags::SCATTER,
    );
    c.run(p, send, Some(recv))
}

/// [`gather`] by the binomial tree.
///
/// # Errors
/// Transport errors and mismatched lengths between ranks.
#[cfg(test)]
pub(crate) fn gather_binomial<C: super::CollP2p + ?Sized>(c: &C, send: &[u8], recv: Option<&mut [u8]>, root: usize) -> Result<()> {
    gather_by(c, send, recv, root, plan_gather_binomial)
}

/// [`gather`] straight to the root.
///
/// # Errors
/// Transport errors and mismatched lengths between ranks.
#[cfg(test)]
pub(crate) fn gather_linear<C: super::CollP2p + ?Sized>(c: &C, send: &[u8], recv: Option<&mut [u8]>, root: usize) -> Result<()> {
    gather_by(c, send, recv, root, plan_gather_linear)
}

/// [`scatter`] by the binomial tree.
///
/// # Errors
/// Transport errors and mismatched lengths between ranks.
#[cfg(test)]
pub(crate) fn scatter_binomial<C: super::CollP2p + ?Sized>(c: &C, send: Option<&[u8]>, recv: &mut [u8], root: usize) -> Result<()> {
    scatter_by(c, send, recv, root, plan_scatter_binomial)
}

/// [`scatter`] straight from the root.
///
/// # Errors
/// Transport errors and mismatched lengths between ranks.
#[cfg(test)]
pub(crate) fn scatter_linear<C: super::CollP2p + ?Sized>(c: &C, send: Option<&[u8]>, recv: &mut [u8], root: usize) -> Result<()> {
    scatter_by(c, send, recv, root, plan_scatter_linear)
}
