//! Communicators from groups (issue 55, item 9), run by `tests/tests/groupcomm.rs` at 4-6
//! ranks through `tmpirun`:
//!
//! 1. `create` with disjoint groups: pairs {0, 1}, {2, 3}, ... (each passed in reverse
//!    order), a last odd rank passing the empty group; each pair gets a 2-rank communicator,
//!    and a ring of messages, an allreduce and a bcast on it see only the pair.
//! 2. `create` with groups that overlap, or that members pass in different orders, or that
//!    one member leaves out: `InvalidGroup` on every rank, and the world goes on.
//! 3. `create_group` by the members alone: the even and the odd ranks at once with the same
//!    tag; then ranks 1 and 2 alone (tag 9) while ranks 0 and 3 exchange user messages with
//!    tag 9 on the world; then on a split communicator. Each communicator carries messages
//!    and an allreduce.
//! 4. `create_group` refusals: not a member, a bad tag, a group outside the communicator
//!    (local), and members that pass the group in different orders (every member).
//! 5. `dist_graph_create_adjacent` (issue 59 item 6): a graph where each rank sends to the
//!    next two ranks and to itself, and a hub (rank 0) that hears from every rank twice;
//!    `neighbor_allgather` and `neighbor_alltoall` over it; an inconsistent graph refused on
//!    every rank.
//!
//! With the argument `inter` (run at 2, 3 and 4 ranks, issue 59 item 7), intercommunicators
//! instead: every way of cutting the world in two (first `k` ranks against the rest, and the
//! even ranks against the odd ones), each joined by `intercomm_create` with leaders that are
//! not rank 0 of their half; messages both ways addressed by remote rank and received from
//! `ANY_SOURCE`, non-blocking ones in a scope, `bcast` both ways, `barrier`, `allreduce` and
//! `allgather` across, `dup`, `merge`
//! in both orders with an allreduce on the result; and the refusals (a remote leader outside
//! the peer communicator or inside the own group, on every rank of the group).

use std::error::Error as StdError;

use tmpi::{Comm, Error, InterComm, InterRoot, Op, ANY_SOURCE};
use tmpi_tests::Verdict;

/// A ring on `c` (each rank sends its world rank to the next), an allreduce of the world
/// ranks and a bcast from rank 0: what a working communicator of the world ranks `members`
/// (in rank order) gives.
fn exercise(c: &Comm, world_rank: usize, members: &[usize], v: &mut Verdict, what: &str) -> tmpi::Result<()> {
    let (r, n) = (c.rank(), c.size());
    v.check(n == members.len() && members.get(r) == Some(&world_rank), || {
        format!("{what}: rank {r} of {n}, expected rank {:?} of {}", members.iter().position(|&m| m == world_rank), members.len())
    });
    let mut got = [usize::MAX];
    tmpi::scope(|s| -> tmpi::Result<()> {
        let q = c.irecv(s, &mut got, (r + n - 1) % n, 11)?;
        c.send(&[world_rank], (r + 1) % n, 11)?;
        q.wait().map(|_| ())
    })?;
    let want = members[(r + n - 1) % n.max(1)];
    v.check(got[0] == want, || format!("{what}: ring got {} from rank {}, expected {want}", got[0], (r + n - 1) % n));
    let mut sum = [0usize];
    c.allreduce(&[world_rank], &mut sum, Op::Sum)?;
    let want: usize = members.iter().sum();
    v.check(sum[0] == want, || format!("{what}: allreduce {} expected {want}", sum[0]));
    let mut b = [if r == 0 { world_rank + 1000 } else { 0 }];
    c.bcast(&mut b, 0)?;
    v.check(b[0] == members[0] + 1000, || format!("{what}: bcast {}", b[0]));
    Ok(())
}

fn disjoint_create(w: &Comm, v: &mut Verdict) -> tmpi::Result<()> {
    let (r, n) = (w.rank(), w.size());
    let alone = r + 1 == n && n % 2 == 1;
    let pair: Vec<usize> = if alone { vec![] } else { vec![r | 1, r & !1] };
    match w.create(&w.group().incl(&pair)?)? {
        Some(c) => exercise(&c, r, &pair, v, "create of a pair")?,
        None => v.check(alone, || format!("rank {r} got no communicator from pair {pair:?}")),
    }
    Ok(())
}

fn bad_creates(w: &Comm, v: &mut Verdict) -> tmpi::Result<()> {
    let (r, n) = (w.rank(), w.size());
    let cases: [(&str, Vec<usize>); 3] = [
        ("overlapping groups", vec![r, (r + 1) % n]),
        ("one group in two orders", if r == 1 { vec![1, 0] } else { vec![0, 1] }),
        ("a member passing the empty group", if r == 0 { vec![] } else { (0..n).collect() }),
    ];
    for (what, g) in cases {
        let res = w.create(&w.group().incl(&g)?);
        v.check_err(res, |e| matches!(e, Error::InvalidGroup(_)), &format!("create with {what}: InvalidGroup"));
        let mut s = [0usize];
        w.allreduce(&[1usize], &mut s, Op::Sum)?;
        v.check(s[0] == n, || format!("allreduce after the refused create ({what}): {}", s[0]));
    }
    Ok(())
}

fn group_creates(w: &Comm, v: &mut Verdict) -> tmpi::Result<()> {
    let (r, n) = (w.rank(), w.size());
    let mut same: Vec<usize> = (0..n).filter(|x| x % 2 == r % 2).collect();
    same.reverse();
    let c = w.create_group(&w.group().incl(&same)?, 5)?;
    exercise(&c, r, &same, v, "create_group of evens or odds")?;
    match r {
        1 | 2 => {
            let c = w.create_group(&w.group().incl(&[2, 1])?, 9)?;
            exercise(&c, r, &[2, 1], v, "create_group of ranks 2 and 1")?;
        }
        0 => w.send(&[7u32], 3, 9)?,
        3 => {
            let (m, st) = w.recv_vec::<u32>(0, 9)?;
            v.check(m == [7] && st.tag() == 9, || format!("user message beside create_group: {m:?} {st:?}"));
        }
        _ => {}
    }
    // On a split communicator (its ranks renumbered), by its upper half.
    let half = w.split(Some((r % 2) as u32), -(r as i32))?.ok_or_else(|| Error::State("split gave no communicator".into()))?;
    if half.rank() >= half.size() / 2 {
        let upper: Vec<usize> = (half.size() / 2..half.size()).collect();
        let c = half.create_group(&half.group().incl(&upper)?, 1)?;
        let members: Vec<usize> = upper.iter().map(|&h| same[h]).collect();
        exercise(&c, r, &members, v, "create_group on a split communicator")?;
    }
    w.barrier()
}

fn bad_group_creates(w: &Comm, v: &mut Verdict) -> tmpi::Result<()> {
    let (r, n) = (w.rank(), w.size());
    let g = w.group();
    let is_invalid_group = |e: &Error| matches!(e, Error::InvalidGroup(_));
    v.check_err(w.create_group(&g.incl(&[(r + 1) % n])?, 1), is_invalid_group, "create_group by a non-member: InvalidGroup");
    v.check_err(w.create_group(&g, tmpi::TAG_UB + 1), |e| matches!(e, Error::InvalidTag { .. }), "create_group with a bad tag: InvalidTag");
    let half = w.split(Some((r % 2) as u32), 0)?.ok_or_else(|| Error::State("split gave no communicator".into()))?;
    let other_half = if r ^ 1 < n { r ^ 1 } else { r - 1 };
    v.check_err(half.create_group(&g.incl(&[r, other_half])?, 1), is_invalid_group, "create_group with a process outside: InvalidGroup");
    let order: Vec<usize> = if r % 2 == 0 { (0..n).collect() } else { (0..n).rev().collect() };
    v.check_err(w.create_group(&g.incl(&order)?, 2), is_invalid_group, "create_group with two orders: InvalidGroup on every member");
    let mut s = [0usize];
    w.allreduce(&[1usize], &mut s, Op::Sum)?;
    v.check(s[0] == n, || format!("allreduce after the refused create_group calls: {}", s[0]));
    Ok(())
}

/// Each rank sends to `r + 1`, `r + 2` (mod n) and itself; rank 0 also hears from every rank
/// twice (each lists 0 twice more among its destinations). Sources in the order the checks
/// below expect.
fn graph(r: usize, n: usize) -> (Vec<usize>, Vec<usize>) {
    let dests = vec![(r + 1) % n, (r + 2) % n, r, 0, 0];
    let mut srcs = vec![(r + n - 1) % n, (r + n - 2) % n, r];
    if r == 0 {
        srcs.extend((0..n).flat_map(|p| [p, p]));
    }
    (srcs, dests)
}

fn dist_graph(w: &Comm, v: &mut Verdict) -> tmpi::Result<()> {
    let (r, n) = (w.rank(), w.size());
    let (srcs, dests) = graph(r, n);
    let g = w.dist_graph_create_adjacent(&srcs, &dests, false)?;
    v.check(g.sources() == srcs && g.destinations() == dests && g.size() == n, || "dist graph: lists or size differ".into());
    let mut from = vec![0u64; 2 * srcs.len()];
    g.neighbor_allgather(&[r as u64, 7], &mut from)?;
    let want: Vec<u64> = srcs.iter().flat_map(|&s| [s as u64, 7]).collect();
    v.check(from == want, || format!("neighbor_allgather: {from:?}, expected {want:?}"));
    // Block j of rank r's send is 10 * r + j; edges listed twice match in list order.
    let send: Vec<u64> = (0..dests.len() as u64).map(|j| 10 * r as u64 + j).collect();
    let mut got = vec![0u64; srcs.len()];
    g.neighbor_alltoall(&send, &mut got)?;
    let mut want = vec![10 * ((r + n - 1) % n) as u64, 10 * ((r + n - 2) % n) as u64 + 1, 10 * r as u64 + 2];
    if r == 0 {
        want.extend((0..n as u64).flat_map(|p| [10 * p + 3, 10 * p + 4]));
    }
    v.check(got == want, || format!("neighbor_alltoall: {got:?}, expected {want:?}"));
    // Rank 1 sends to 2 without 2 listing it: refused everywhere, and the world goes on.
    let bad = w.dist_graph_create_adjacent(&[], if r == 1 { &[2] } else { &[] }, false);
    v.check_err(bad, |e| matches!(e, Error::InvalidTopology(_)), "inconsistent dist graph: InvalidTopology");
    let total = w.allreduce_one(1usize, Op::Sum)?;
    v.check(total == n, || format!("allreduce after the refused graph: {total}"));
    Ok(())
}

/// Joins the ranks of `w` for which `side` is true with the others; the leader of each half is
/// its last rank. Returns the half this rank is in and the intercommunicator.
fn join(w: &Comm, side: &dyn Fn(usize) -> bool, tag: u32) -> tmpi::Result<(bool, Vec<usize>, Vec<usize>, InterComm)> {
    let r = w.rank();
    let me = side(r);
    let mine: Vec<usize> = (0..w.size()).filter(|&x| side(x) == me).collect();
    let theirs: Vec<usize> = (0..w.size()).filter(|&x| side(x) != me).collect();
    let half = w.split(Some(u32::from(me)), 0)?.ok_or(Error::State("split gave no communicator".into()))?;
    let last = |g: &[usize]| g.len() - 1;
    let ic = half.intercomm_create(last(&mine), w, theirs[last(&theirs)], tag)?;
    Ok((me, mine, theirs, ic))
}

/// One intercommunicator between world ranks `mine` (this rank's half, `me` tells which) and
/// `theirs`, exercised.
fn exercise_inter(w: &Comm, me: bool, mine: &[usize], theirs: &[usize], ic: &InterComm, v: &mut Verdict) -> tmpi::Result<()> {
    let x = Inter { me, mine, theirs, ic, what: format!("halves {mine:?} | {theirs:?}"), r: w.rank(), lr: ic.rank() };
    x.shape(v);
    x.blocking(v)?;
    x.nonblocking(v)?;
    x.bcasts(v)?;
    x.collectives(v)?;
    x.dup(v)?;
    for high in [me, !me] {
        x.merged(high, v)?;
    }
    Ok(())
}

/// What [`exercise_inter`] exercises, and this rank's world (`r`) and local (`lr`) ranks.
struct Inter<'a> {
    me: bool,
    mine: &'a [usize],
    theirs: &'a [usize],
    ic: &'a InterComm,
    what: String,
    r: usize,
    lr: usize,
}

impl Inter<'_> {
    /// Sizes, ranks and groups.
    fn shape(&self, v: &mut Verdict) {
        let (ic, what, lr) = (self.ic, &self.what, self.lr);
        v.check(ic.size() == self.mine.len() && ic.remote_size() == self.theirs.len() && self.mine[lr] == self.r, || {
            format!("{what}: rank {lr} of {}, remote {}", ic.size(), ic.remote_size())
        });
        let rg = ic.remote_group();
        v.check(rg.size() == self.theirs.len() && rg.rank().is_none() && ic.group().rank() == Some(lr), || format!("{what}: groups"));
    }

    /// Everyone sends its world rank to every remote rank.
    fn blocking(&self, v: &mut Verdict) -> tmpi::Result<()> {
        let (ic, what, theirs) = (self.ic, &self.what, self.theirs);
        for d in 0..ic.remote_size() {
            ic.send(&[self.r as u64], d, 21)?;
        }
        let mut got = vec![0u64; theirs.len()];
        for _ in 0..theirs.len() {
            let mut b = [0u64];
            let st = ic.recv(&mut b, ANY_SOURCE, 21)?;
            v.check(theirs.get(st.source()) == Some(&(b[0] as usize)), || format!("{what}: {} from remote rank {}", b[0], st.source()));
            got[st.source()] = b[0];
        }
        let want: Vec<u64> = theirs.iter().map(|&x| x as u64).collect();
        v.check(got == want, || format!("{what}: got {got:?} from the remote ranks"));
        Ok(())
    }

    /// Rank `lr` sends to remote rank `lr % remote`; it hears from the remote ranks `x` with
    /// `x % size == lr`.
    fn nonblocking(&self, v: &mut Verdict) -> tmpi::Result<()> {
        let (ic, what, lr) = (self.ic, &self.what, self.lr);
        let (size, remote) = (ic.size(), ic.remote_size());
        let senders: Vec<usize> = (0..remote).filter(|x| x % size == lr).collect();
        let mut bufs = vec![[0u64; 4]; senders.len()];
        let out = [self.r as u64; 4];
        let mut from = tmpi::scope(|s| -> tmpi::Result<Vec<usize>> {
            let mut reqs = Vec::new();
            for b in bufs.iter_mut() {
                reqs.push(ic.irecv(s, b, ANY_SOURCE, 22)?);
            }
            ic.isend(s, &out, lr % remote, 22)?.wait()?;
            reqs.into_iter().map(|q| q.wait().map(|st| st.source())).collect()
        })?;
        from.sort_unstable();
        v.check(from == senders, || format!("{what}: non-blocking messages from {from:?}, expected {senders:?}"));
        let mut vals: Vec<u64> = bufs.iter().map(|b| b[3]).collect();
        vals.sort_unstable();
        let want: Vec<u64> = senders.iter().map(|&x| self.theirs[x] as u64).collect();
        v.check(vals == want, || format!("{what}: non-blocking values {vals:?}, expected {want:?}"));
        Ok(())
    }

    /// Broadcasts both ways: from rank 0 of the `true` half, then from the last of the other.
    fn bcasts(&self, v: &mut Verdict) -> tmpi::Result<()> {
        let (me, r, lr) = (self.me, self.r, self.lr);
        let other_last = if me { self.theirs.len() - 1 } else { self.mine.len() - 1 };
        for (root_side, root) in [(true, 0), (false, other_last)] {
            let mut b = [r as u64 + 500; 3];
            let who = match (me == root_side, lr == root) {
                (true, true) => InterRoot::Root,
                (true, false) => InterRoot::ProcNull,
                (false, _) => InterRoot::Remote(root),
            };
            self.ic.bcast(&mut b, who)?;
            let root_world = if me == root_side { self.mine[root] } else { self.theirs[root] };
            let want = if me == root_side && lr != root { r as u64 + 500 } else { root_world as u64 + 500 };
            v.check(b == [want; 3], || format!("{}: bcast from the {root_side} side's rank {root} gave {b:?}", self.what));
        }
        Ok(())
    }

    /// A barrier; each side receives the other side's sum and its ranks in order.
    fn collectives(&self, v: &mut Verdict) -> tmpi::Result<()> {
        let (ic, what, theirs) = (self.ic, &self.what, self.theirs);
        ic.barrier()?;
        let mut sum = [0u64];
        ic.allreduce(&[self.r as u64], &mut sum, Op::Sum)?;
        let want: u64 = theirs.iter().map(|&x| x as u64).sum();
        v.check(sum[0] == want, || format!("{what}: allreduce across gave {}, expected {want}", sum[0]));
        let mut all = vec![0u64; theirs.len()];
        ic.allgather(&[self.r as u64], &mut all)?;
        v.check(all.iter().map(|&x| x as usize).eq(theirs.iter().copied()), || format!("{what}: allgather across gave {all:?}"));
        Ok(())
    }

    /// A duplicate carries messages of its own.
    fn dup(&self, v: &mut Verdict) -> tmpi::Result<()> {
        let (ic, lr) = (self.ic, self.lr);
        let (size, remote) = (ic.size(), ic.remote_size());
        let d = ic.dup()?;
        d.send(&[self.r as u32], lr % remote, 23)?;
        for _ in (0..remote).filter(|x| x % size == lr) {
            let (m, st) = d.recv_vec::<u32>(ANY_SOURCE, 23)?;
            v.check(m == [self.theirs[st.source()] as u32], || format!("{}: dup carried {m:?}", self.what));
        }
        d.barrier()
    }

    /// `merge(high)`: the half passing `high = false` comes first.
    fn merged(&self, high: bool, v: &mut Verdict) -> tmpi::Result<()> {
        let (what, r) = (&self.what, self.r);
        let all = self.ic.merge(high)?;
        let (a, b) = if high { (self.theirs, self.mine) } else { (self.mine, self.theirs) };
        let order: Vec<usize> = a.iter().chain(b).copied().collect();
        let pos = order.iter().position(|&x| x == r);
        v.check(all.size() == order.len() && Some(all.rank()) == pos, || format!("{what}: merge({high}) rank {}", all.rank()));
        let mut sum = [0usize];
        all.allreduce(&[r], &mut sum, Op::Sum)?;
        v.check(sum[0] == order.iter().sum::<usize>(), || format!("{what}: merged allreduce {}", sum[0]));
        let mut top = [if all.rank() == 0 { r } else { usize::MAX }];
        all.bcast(&mut top, 0)?;
        v.check(top[0] == order[0], || format!("{what}: merged bcast {}", top[0]));
        Ok(())
    }
}

/// `intercomm_create` refusals, on every rank of a half: a remote leader outside the peer
/// communicator, a remote leader in the own group.
fn bad_inters(w: &Comm, v: &mut Verdict) -> tmpi::Result<()> {
    let n = w.size();
    let low = w.rank() < n / 2;
    let half = w.split(Some(u32::from(low)), 0)?.ok_or(Error::State("split gave no communicator".into()))?;
    let r = half.intercomm_create(0, w, n, 31);
    v.check_err(r, |e| matches!(e, Error::InvalidRank { rank, .. } if *rank == n), "InvalidRank for a remote leader outside the peer");
    let own = if low { 0 } else { n / 2 };
    let r = half.intercomm_create(0, w, own, 31);
    v.check_err(r, |e| matches!(e, Error::InvalidGroup(_)), "InvalidGroup for a remote leader in the own group");
    let r = w.intercomm_create(0, w, n - 1, 31);
    v.check_err(r, |e| matches!(e, Error::InvalidGroup(_)), "InvalidGroup for the world against itself");
    Ok(())
}

fn inter_main(world: &Comm) -> Result<(), Box<dyn StdError>> {
    let n = world.size();
    let mut v = Verdict::new("groupcomm", world.rank());
    let mut cuts: Vec<Box<dyn Fn(usize) -> bool>> = (1..n).map(|k| Box::new(move |x: usize| x < k) as Box<dyn Fn(usize) -> bool>).collect();
    cuts.push(Box::new(|x| x % 2 == 0));
    for (i, cut) in cuts.iter().enumerate() {
        let (me, mine, theirs, ic) = join(world, cut.as_ref(), 40 + i as u32)?;
        exercise_inter(world, me, &mine, &theirs, &ic, &mut v)?;
    }
    bad_inters(world, &mut v)?;
    v.finish(world, &format!("{n} ranks: intercommunicators over {} cuts, refusals", cuts.len()))?;
    Ok(())
}

fn main() -> Result<(), Box<dyn StdError>> {
    let world = tmpi::init()?;
    let n = world.size();
    if std::env::args().nth(1).as_deref() == Some("inter") {
        if n < 2 {
            return Err(format!("groupcomm inter needs at least 2 ranks, got {n}").into());
        }
        inter_main(&world)?;
        world.finalize()?;
        return Ok(());
    }
    let mut v = Verdict::new("groupcomm", world.rank());
    if n < 4 {
        return Err(format!("groupcomm needs at least 4 ranks, got {n}").into());
    }
    disjoint_create(&world, &mut v)?;
    bad_creates(&world, &mut v)?;
    group_creates(&world, &mut v)?;
    bad_group_creates(&world, &mut v)?;
    dist_graph(&world, &mut v)?;
    v.finish(&world, &format!("{n} ranks: create with disjoint groups, create_group, refusals, dist graph"))?;
    world.finalize()?;
    Ok(())
}
