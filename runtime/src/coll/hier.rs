//! Node-aware (hierarchical) plans: inside a host among its ranks (through shared memory),
//! between hosts among one rank per host (its *head*), so that a collective crosses the
//! network once per host instead of once per rank pair an algorithm happens to pair.
//!
//! Every plan here is made of the flat planners of the other modules run on groups
//! ([`Grp`]): the ranks of this rank's host, and the heads of all hosts. Each tier chooses its
//! own algorithm by its own size through [`super::select`] (the heads' tier takes the
//! `TMPI_COLL_*` override), so a host of 2 ranks and a job of 64 hosts each get what suits
//! them. A host's head is its lowest rank, except on the root's host of a rooted collective,
//! whose head is the root (so the data never takes an extra hop).
//!
//! | collective | inside each host | among the heads | inside each host |
//! |---|---|---|---|
//! | barrier | fan-in to the head | dissemination | fan-out |
//! | bcast | | bcast from the root | bcast from the head |
//! | reduce | reduce to the head | reduce to the root | |
//! | allreduce | reduce to the head | allreduce | bcast from the head |
//! | allgather(v) | gather to the head | allgatherv of the hosts' blocks | bcast from the head |
//! | alltoall(v) | gather to the head | alltoallv of the hosts' blocks | scatter from the head |
//! | reduce_scatter | reduce to the head | reduce-scatter of the hosts' blocks | scatter from the head |
//!
//! Reductions combine a host's ranks first, so they are node-aware only for commutative
//! operators (every predefined one); others keep the flat plans, which combine in rank order.

use super::plan::{Buf, Grp, Plan, Span};
use super::reduce::Vector;
use super::select::{self, Setting, Shape};
use super::tags;
use super::topo::Topo;

/// Tags of the phases inside a host (the heads' phases use the flat algorithms' tags).
pub(crate) mod htags {
    /// Barrier fan-in, fan-out (+ 1).
    pub(crate) const BARRIER: u32 = 68;
    /// Broadcast from the head.
    pub(crate) const BCAST: u32 = 72;
    /// Reduce to the head (+ 0..2 binomial, + 2.. Rabenseifner's three).
    pub(crate) const REDUCE: u32 = 76;
    /// Gather to the head.
    pub(crate) const GATHER: u32 = 84;
    /// Scatter from the head.
    pub(crate) const SCATTER: u32 = 88;
    /// The heads' allgatherv of the hosts' blocks.
    pub(crate) const HEADS_ALLGATHER: u32 = 92;
    /// The heads' alltoallv of the hosts' blocks.
    pub(crate) const HEADS_ALLTOALL: u32 = 96;
    /// The heads' reduce-scatter of the hosts' blocks.
    pub(crate) const HEADS_REDUCE_SCATTER: u32 = 100;
}

/// The two tiers as this rank sees them for one call.
pub(crate) struct Tiers<'t> {
    topo: &'t Topo,
    /// This rank's host.
    host: usize,
    /// The ranks of this rank's host (rank order) and this rank's index there.
    local: &'t [usize],
    me_local: usize,
    /// The head's index in `local`.
    head: usize,
    /// Each host's head, in host order.
    heads: Vec<usize>,
}

impl<'t> Tiers<'t> {
    /// The tiers of rank `me`; on `root`'s host (when given) the root is the head.
    pub(crate) fn new(topo: &'t Topo, me: usize, root: Option<usize>) -> Self {
        let host = topo.host_of(me);
        let local = topo.ranks(host);
        let head_of = |h: usize| match root {
            Some(r) if topo.host_of(r) == h => r,
            _ => topo.ranks(h)[0],
        };
        let heads: Vec<usize> = (0..topo.hosts()).map(head_of).collect();
        let head = topo.local(heads[host]);
        Tiers { topo, host, local, me_local: topo.local(me), head, heads }
    }

    fn local(&self) -> Grp<'_> {
        Grp::of(self.me_local, self.local)
    }

    fn is_head(&self) -> bool {
        self.me_local == self.head
    }

    /// The heads' group, on a head only.
    fn heads(&self) -> Option<Grp<'_>> {
        self.is_head().then(|| Grp::of(self.host, &self.heads))
    }
}

/// The communicator's hosts when its calls run node-aware ([`select::node_aware`]).
pub(crate) fn wanted<'a>(set: &Setting<'a>) -> Option<&'a Topo> {
    let t = set.topo?;
    select::node_aware(&Shape::on(t, 0), set.force.node_aware).then_some(t)
}

fn shape(n: usize, bytes: usize, count: usize, commutative: bool) -> Shape {
    Shape { ranks: n, hosts: 1, bytes, count, commutative }
}

/// Node-aware barrier.
pub(crate) fn barrier(p: &mut Plan, t: &Tiers<'_>) {
    fan(p, t, htags::BARRIER, true);
    if let Some(h) = t.heads() {
        super::barrier::plan_dissemination(p, h, tags::BARRIER);
    }
    fan(p, t, htags::BARRIER + 1, false);
}

/// Empty messages from every local rank to the head (`inward`) or back.
fn fan(p: &mut Plan, t: &Tiers<'_>, tag: u32, inward: bool) {
    let g = t.local();
    p.next();
    if t.is_head() {
        for i in (0..g.n).filter(|&i| i != t.head) {
            if inward {
                p.recv(Span::empty(), g.rank(i), tag);
            } else {
                p.send(Span::empty(), g.rank(i), tag);
            }
        }
    } else if inward {
        p.send(Span::empty(), g.rank(t.head), tag);
    } else {
        p.recv(Span::empty(), g.rank(t.head), tag);
    }
    p.next();
}

/// A broadcast of `buf` from member `root` of `g`, by the algorithm `set` chooses for `g`'s
/// size (the override applies on the heads' tier only).
fn bcast_on(p: &mut Plan, set: &Setting<'_>, g: Grp<'_>, buf: Span, root: usize, heads: bool, tag: u32) {
    if g.n < 2 {
        return;
    }
    let force = if heads { set.force.bcast } else { None };
    match select::bcast(&shape(g.n, buf.len, buf.len, true), force) {
        select::Bcast::Binomial => super::bcast::plan_binomial(p, g, buf, root, tag),
        select::Bcast::ScatterAllgather => super::bcast::plan_scatter_allgather(p, g, buf, root, tag + 1),
    }
    p.next();
}

/// Node-aware broadcast of `buf` (the receive buffer) from `root`.
pub(crate) fn bcast(p: &mut Plan, set: &Setting<'_>, t: &Tiers<'_>, buf: Span, root: usize) {
    if let Some(h) = t.heads() {
        bcast_on(p, set, h, buf, t.topo.host_of(root), true, tags::BCAST);
    }
    bcast_on(p, set, t.local(), buf, t.head, false, htags::BCAST);
}

/// Where a reduce goes: `send` of every member to member `root`, into `recv` there.
struct ToRoot {
    send: Span,
    recv: Option<Span>,
    root: usize,
}

/// A reduce `to` on `g` (`recv` is `Some` at the root), by the algorithm `set` chooses for
/// `g`'s size (commutative operators); `heads`: `g` is the hosts' heads, where the override
/// applies.
fn reduce_on(p: &mut Plan, set: &Setting<'_>, g: Grp<'_>, to: ToRoot, v: Vector, heads: bool, tag: u32) {
    let ToRoot { send, recv, root } = to;
    let force = if heads { set.force.reduce } else { None };
    match select::reduce(&shape(g.n, v.bytes(), v.n, true), force) {
        select::Reduce::Rabenseifner => super::reduce::plan_reduce_rabenseifner(p, g, send, recv, v, root, tag + 2),
        select::Reduce::Binomial => super::reduce::plan_reduce_binomial(p, g, send, recv, root, false, tag),
    }
    p.next();
}

/// The first tier of the reductions: this host's vectors combined on its head, into `into`
/// (a span of the vector's length) there; returns where the head's combined vector is.
fn reduce_in_host(
    p: &mut Plan,
    set: &Setting<'_>,
    t: &Tiers<'_>,
    send: Span,
    v: Vector,
    into: impl FnOnce(&mut Plan) -> Span,
) -> Option<Span> {
    let g = t.local();
    if g.n == 1 {
        return Some(send);
    }
    let acc = t.is_head().then(|| into(p));
    reduce_on(p, set, g, ToRoot { send, recv: acc, root: t.head }, v, false, htags::REDUCE);
    acc
}

/// Node-aware reduce of `send` to `root` into `recv` (`Some` at the root).
pub(crate) fn reduce(p: &mut Plan, set: &Setting<'_>, t: &Tiers<'_>, send: Span, recv: Option<Span>, v: Vector, root: usize) {
    let part = reduce_in_host(p, set, t, send, v, |p| p.temp(v.bytes()));
    if let (Some(h), Some(part)) = (t.heads(), part) {
        reduce_on(p, set, h, ToRoot { send: part, recv, root: t.topo.host_of(root) }, v, true, tags::REDUCE);
    }
}

/// Node-aware allreduce of `send` into `acc` (commutative operators).
pub(crate) fn allreduce(p: &mut Plan, set: &Setting<'_>, t: &Tiers<'_>, send: Span, acc: Span, v: Vector) {
    if t.local().n == 1 {
        p.copy(send, acc);
    } else {
        reduce_in_host(p, set, t, send, v, |_| acc);
    }
    if let Some(h) = t.heads() {
        p.next();
        match select::allreduce(&shape(h.n, v.bytes(), v.n, true), set.force.allreduce) {
            select::Allreduce::Rabenseifner => super::reduce::plan_rabenseifner(p, h, None, acc, v, tags::ALLREDUCE_RAB),
            select::Allreduce::Ring => super::reduce::plan_ring(p, h, acc, v, tags::ALLREDUCE_RING),
            select::Allreduce::ReduceBcast => {
                let mine = p.temp(acc.len);
                p.copy(acc, mine);
                super::reduce::plan_reduce_bcast(p, h, mine, acc, tags::REDUCE_BCAST);
            }
            _ => super::reduce::plan_recursive_doubling(p, h, acc, tags::ALLREDUCE),
        }
        p.next();
    }
    bcast_on(p, set, t.local(), acc, t.head, false, htags::BCAST);
}

/// Where each rank's block lies in a buffer that holds the blocks host by host
/// ([`Topo::order`]): `at[r]` for rank `r`, `host[h]` for host `h`'s blocks together.
struct HostOrder {
    at: Vec<Span>,
    host: Vec<Span>,
}

impl HostOrder {
    /// Blocks of `size[r]` bytes in `buf`, host by host.
    fn new(topo: &Topo, buf: Span, size: &[usize]) -> Self {
        let mut at = vec![Span::empty(); size.len()];
        let mut host = Vec::with_capacity(topo.hosts());
        let mut off = 0;
        for h in 0..topo.hosts() {
            let start = off;
            for &r in topo.ranks(h) {
                at[r] = buf.sub(off..off + size[r]);
                off += size[r];
            }
            host.push(buf.sub(start..off));
        }
        HostOrder { at, host }
    }
}

/// Copies what fits of `from` into `to` (they differ only where this rank's arguments were
/// bad, and then the plan skips its local steps).
fn copy_fit(p: &mut Plan, from: Span, to: Span) {
    let n = from.len.min(to.len);
    p.copy(from.sub(0..n), to.sub(0..n));
}

/// Linear gather inside the host: every rank's `mine` into its `blocks` span at the head.
fn gather_in_host(p: &mut Plan, t: &Tiers<'_>, mine: Span, blocks: &HostOrder, tag: u32) {
    let g = t.local();
    p.next();
    if t.is_head() {
        for (i, &r) in t.local.iter().enumerate() {
            if i == t.head {
                copy_fit(p, mine, blocks.at[r]);
            } else {
                p.recv(blocks.at[r], g.rank(i), tag);
            }
        }
    } else {
        p.send(mine, g.rank(t.head), tag);
    }
    p.next();
}

/// Node-aware allgather(v): rank `r`'s `size[r]` bytes (this rank's in `mine`) land in
/// `dest[r]` on every rank. `blocks_total` is the sum of `size`.
pub(crate) fn allgatherv(p: &mut Plan, set: &Setting<'_>, t: &Tiers<'_>, mine: Span, size: &[usize], dest: &[Span]) {
    let total: usize = size.iter().sum();
    // Host order is rank order when every host's ranks are consecutive and the blocks lie
    // in order in one buffer: then the receive buffer serves as it is.
    let direct = t.topo.contiguous
        && dest.first().is_some_and(|d| d.buf == Buf::Out)
        && dest.windows(2).all(|w| w[0].buf == w[1].buf && w[0].off + w[0].len == w[1].off);
    let buf = if direct && !dest.is_empty() { Span::new(dest[0].buf, dest[0].off, total) } else { p.temp(total) };
    let ho = HostOrder::new(t.topo, buf, size);
    gather_in_host(p, t, mine, &ho, htags::GATHER);
    if let Some(h) = t.heads() {
        let sizes: Vec<usize> = ho.host.iter().map(|s| s.len).collect();
        let algo = select::allgather(&shape(h.n, total, total, true), set.force.allgather);
        super::vcoll::plan_allgatherv(p, h, algo, &sizes, &ho.host, htags::HEADS_ALLGATHER);
        p.next();
    }
    bcast_on(p, set, t.local(), buf, t.head, false, htags::BCAST);
    if !direct {
        p.next();
        for (r, d) in dest.iter().enumerate() {
            copy_fit(p, ho.at[r], *d);
        }
        p.next();
    }
}

/// Node-aware alltoall of blocks of `blk` bytes (`send` and `recv`: `n * blk` bytes, block
/// `d` for rank `d`).
///
/// Each head gathers its host's send buffers whole, sends every other head, in one message,
/// the blocks its host's ranks address to that host's ranks, and hands each of its ranks what
/// arrived for it, in source rank order, straight into the receive buffer.
pub(crate) fn alltoall(p: &mut Plan, t: &Tiers<'_>, send: Span, recv: Span, blk: usize) {
    let topo = t.topo;
    let g = t.local();
    let ln = t.local.len();
    let b = |s: Span, i: usize| s.sub(i * blk..(i + 1) * blk);
    p.next();
    let Some(h) = t.heads() else {
        // A rank that is not its host's head: its send buffer to the head, its blocks back.
        p.send(send, g.rank(t.head), htags::GATHER);
        p.next();
        p.recv(recv, g.rank(t.head), htags::SCATTER);
        p.next();
        return;
    };
    // 1. The local ranks' send buffers (the head's own is read in place).
    let from = gather_local(p, t, send);
    // 2. To host hd: for each local source (rank order), its blocks for hd's ranks (rank
    //    order). From host hs: for each source of hs, its blocks for the local ranks.
    let hosts = topo.hosts();
    let outs = pack_for_hosts(p, t, &from, blk);
    let ins: Vec<Span> = (0..hosts).map(|hs| if hs == t.host { Span::empty() } else { p.temp(topo.ranks(hs).len() * ln * blk) }).collect();
    p.next();
    for k in 1..h.n {
        let (to, fr) = ((h.me + k) % h.n, (h.me + h.n - k) % h.n);
        p.send(outs[to], h.rank(to), htags::HEADS_ALLTOALL);
        p.recv(ins[fr], h.rank(fr), htags::HEADS_ALLTOALL);
        p.next();
    }
    // 3. For each local rank d, every source's block in source rank order.
    for (dl, &d) in t.local.iter().enumerate() {
        let dest = if dl == t.head { recv } else { p.temp(recv.len) };
        for (hs, &got) in ins.iter().enumerate() {
            for (si, &s) in topo.ranks(hs).iter().enumerate() {
                let src = if hs == t.host { b(from[si], d) } else { b(got, si * ln + dl) };
                p.copy(src, b(dest, s));
            }
        }
        if dl != t.head {
            p.send(dest, d, htags::SCATTER);
        }
    }
    p.next();
}

/// The head's first step of [`alltoall`]: the send buffers of its host's ranks, in local
/// rank order (its own read in place).
fn gather_local(p: &mut Plan, t: &Tiers<'_>, send: Span) -> Vec<Span> {
    let g = t.local();
    let from = (0..t.local.len())
        .map(|i| {
            if i == t.head {
                return send;
            }
            let s = p.temp(send.len);
            p.recv(s, g.rank(i), htags::GATHER);
            s
        })
        .collect();
    p.next();
    from
}

/// The head's packing for [`alltoall`]: one message per other host `hd` (empty for its own),
/// holding for each local source (rank order) its `blk`-byte blocks for `hd`'s ranks.
fn pack_for_hosts(p: &mut Plan, t: &Tiers<'_>, from: &[Span], blk: usize) -> Vec<Span> {
    let (topo, ln) = (t.topo, t.local.len());
    let b = |s: Span, i: usize| s.sub(i * blk..(i + 1) * blk);
    (0..topo.hosts())
        .map(|hd| {
            if hd == t.host {
                return Span::empty();
            }
            let dn = topo.ranks(hd).len();
            let o = p.temp(ln * dn * blk);
            for (sl, f) in from.iter().enumerate() {
                for (di, &d) in topo.ranks(hd).iter().enumerate() {
                    p.copy(b(*f, d), b(o, sl * dn + di));
                }
            }
            o
        })
        .collect()
}

/// Node-aware reduce-scatter (commutative operators): `blocks[r]` of every rank's send
/// buffer, combined, lands in rank `r`'s `mine`. The hosts' vectors are combined on their
/// heads, the heads reduce-scatter the hosts' shares among themselves around a ring, and each
/// head hands its ranks their blocks.
pub(crate) fn reduce_scatter(p: &mut Plan, set: &Setting<'_>, t: &Tiers<'_>, blocks: &[Span], mine: Span, v: Vector) {
    let topo = t.topo;
    let part = reduce_in_host(p, set, t, Span::new(Buf::In, 0, v.bytes()), v, |p| p.temp(v.bytes()));
    if let (Some(h), Some(part)) = (t.heads(), part) {
        // The vector, host order: a temp holding host hd's blocks together.
        let sizes: Vec<usize> = blocks.iter().map(|b| b.len).collect();
        let total: usize = sizes.iter().sum();
        let acc = p.temp(total);
        let ho = HostOrder::new(topo, acc, &sizes);
        p.next();
        for (r, b) in blocks.iter().enumerate() {
            p.copy(Span::new(part.buf, part.off + b.off, b.len), ho.at[r]);
        }
        p.next();
        // Ring reduce-scatter of the hosts' shares: in step k send share me - k - 1, receive
        // share me - k - 2 and combine; after n - 1 steps a head holds its own share whole.
        let n = h.n;
        let (right, left) = (h.rank((h.me + 1) % n), h.rank((h.me + n - 1) % n));
        let most = ho.host.iter().map(|s| s.len).max().unwrap_or(0);
        let tmp = p.temp(most);
        for k in 0..n - 1 {
            let s = ho.host[(h.me + 2 * n - k - 1) % n];
            let r = ho.host[(h.me + 2 * n - k - 2) % n];
            let tr = tmp.sub(0..r.len);
            p.send(s, right, htags::HEADS_REDUCE_SCATTER);
            p.recv(tr, left, htags::HEADS_REDUCE_SCATTER);
            p.next();
            p.combine(tr, r, true);
        }
        p.next();
        // Hand out: ranks of this host get their blocks.
        for (i, &r) in t.local.iter().enumerate() {
            if i == t.head {
                p.copy(ho.at[r], mine);
            } else {
                p.send(ho.at[r], r, htags::SCATTER);
            }
        }
        p.next();
    } else {
        p.next();
        p.recv(mine, t.local().rank(t.head), htags::SCATTER);
        p.next();
    }
}
