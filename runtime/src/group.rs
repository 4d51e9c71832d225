//! Process groups ([`Group`]) and communicators built from them ([`Comm::create`],
//! collective over the communicator, and [`Comm::create_group`], among the group's members
//! alone), and communicator comparison ([`Comm::compare`]).
//!
//! A group is an ordered list of distinct processes (named by their world rank inside the
//! runtime); its set operations follow MPI's ordering rules. Groups are local objects: making
//! and combining them never communicates.

use std::collections::HashSet;
use std::sync::Arc;

use crate::comm::Comm;
use crate::error::{Error, Result};
use crate::seen::{self, Kind, What};
use crate::Rank;

/// How two groups relate ([`Group::compare`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GroupCmp {
    /// Same members in the same order (`MPI_IDENT`).
    Identical,
    /// Same members in another order (`MPI_SIMILAR`).
    Similar,
    /// Different members (`MPI_UNEQUAL`).
    Unequal,
}

/// How two communicators relate ([`Comm::compare`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CommCmp {
    /// The same communicator (the same context; clones of one `Comm` are identical)
    /// (`MPI_IDENT`).
    Identical,
    /// Different contexts, same members in the same order (`MPI_CONGRUENT`), e.g. a `dup`.
    Congruent,
    /// Different contexts, same members in another order (`MPI_SIMILAR`).
    Similar,
    /// Different members (`MPI_UNEQUAL`).
    Unequal,
}

/// An ordered group of processes, such as the members of a communicator ([`Comm::group`]).
/// Ranks in a group are positions in it, `0..size()`.
///
/// ```
/// use tmpi::GroupCmp;
/// let ok = tmpi::run_local(4, |w| {
///     let g = w.group();
///     let evens = g.incl(&[0, 2]).unwrap();
///     let odds = g.excl(&[0, 2]).unwrap();
///     assert_eq!(evens.union(&odds).compare(&g), GroupCmp::Similar);
///     assert_eq!(evens.translate_ranks(&[1], &g).unwrap(), vec![Some(2)]);
///     assert_eq!(evens.rank(), if w.rank() % 2 == 0 { Some(w.rank() / 2) } else { None });
///     true
/// });
/// assert!(ok.iter().all(|&b| b));
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct Group {
    /// World rank of each member, in group order.
    members: Arc<[usize]>,
    /// This process's world rank.
    me: usize,
}

impl std::fmt::Debug for Group {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Group").field("members", &self.members).field("rank", &self.rank()).finish()
    }
}

impl Group {
    /// The group of the processes of world ranks `members`, in that order, seen from the
    /// process of world rank `me`.
    pub(crate) fn from_world_ranks(members: Vec<usize>, me: usize) -> Group {
        Group { members: members.into(), me }
    }

    fn with(&self, members: Vec<usize>) -> Group {
        Group { members: members.into(), me: self.me }
    }

    /// Number of processes in the group.
    pub fn size(&self) -> usize {
        self.members.len()
    }

    /// This process's rank in the group, `None` if it is not a member (`MPI_UNDEFINED`).
    pub fn rank(&self) -> Option<Rank> {
        self.members.iter().position(|&m| m == self.me)
    }

    /// A group with no members.
    pub fn empty(&self) -> Group {
        self.with(Vec::new())
    }

    fn check_list(&self, what: &str, ranks: &[Rank]) -> Result<()> {
        let mut seen = HashSet::with_capacity(ranks.len());
        for &r in ranks {
            if r >= self.size() {
                return Err(Error::InvalidRank { rank: r, size: self.size() });
            }
            if !seen.insert(r) {
                return Err(Error::InvalidGroup(format!("{what}: rank {r} is listed twice")));
            }
        }
        Ok(())
    }

    /// The members at `ranks`, in that order: rank `i` of the new group is rank `ranks[i]` of
    /// this one.
    ///
    /// # Errors
    /// [`Error::InvalidRank`] for a rank outside the group, [`Error::InvalidGroup`] for one
    /// listed twice.
    pub fn incl(&self, ranks: &[Rank]) -> Result<Group> {
        self.check_list("incl", ranks)?;
        Ok(self.with(ranks.iter().map(|&r| self.members[r]).collect()))
    }

    /// The members not at `ranks`, in their order here.
    ///
    /// # Errors
    /// As [`Group::incl`].
    pub fn excl(&self, ranks: &[Rank]) -> Result<Group> {
        self.check_list("excl", ranks)?;
        let out: HashSet<usize> = ranks.iter().copied().collect();
        Ok(self.with((0..self.size()).filter(|r| !out.contains(r)).map(|r| self.members[r]).collect()))
    }

    /// The members of `self` followed by those of `other` that are not in `self`.
    pub fn union(&self, other: &Group) -> Group {
        let mine: HashSet<usize> = self.members.iter().copied().collect();
        self.with(self.members.iter().copied().chain(other.members.iter().copied().filter(|m| !mine.contains(m))).collect())
    }

    /// The members of `self` that are also in `other`, in their order here.
    pub fn intersection(&self, other: &Group) -> Group {
        let theirs: HashSet<usize> = other.members.iter().copied().collect();
        self.with(self.members.iter().copied().filter(|m| theirs.contains(m)).collect())
    }

    /// The members of `self` that are not in `other`, in their order here.
    pub fn difference(&self, other: &Group) -> Group {
        let theirs: HashSet<usize> = other.members.iter().copied().collect();
        self.with(self.members.iter().copied().filter(|m| !theirs.contains(m)).collect())
    }

    /// The ranks in `other` of the processes at `ranks` in `self` (`None`: not a member of
    /// `other`, `MPI_UNDEFINED`).
    ///
    /// # Errors
    /// [`Error::InvalidRank`] for a rank outside `self`.
    pub fn translate_ranks(&self, ranks: &[Rank], other: &Group) -> Result<Vec<Option<Rank>>> {
        ranks
            .iter()
            .map(|&r| {
                let m = *self.members.get(r).ok_or(Error::InvalidRank { rank: r, size: self.size() })?;
                Ok(other.members.iter().position(|&o| o == m))
            })
            .collect()
    }

    /// Whether the groups have the same members, in the same order.
    pub fn compare(&self, other: &Group) -> GroupCmp {
        if self.members == other.members {
            GroupCmp::Identical
        } else if self.size() == other.size()
            && self.members.iter().copied().collect::<HashSet<_>>() == other.members.iter().copied().collect()
        {
            GroupCmp::Similar
        } else {
            GroupCmp::Unequal
        }
    }
}

impl Comm {
    /// The group of this communicator's members, in rank order (a local call).
    pub fn group(&self) -> Group {
        Group { members: (0..self.size()).map(|r| self.world_rank(r)).collect(), me: self.world_rank(self.rank()) }
    }

    /// A new communicator of the members of `group`, ranked in group order (MPI's
    /// `Comm_create`; collective over `self`: every rank of `self` calls it). Ranks outside
    /// the group get `None`.
    ///
    /// Ranks may pass different groups, as MPI allows since MPI-2.2, as long as the groups of
    /// the members are disjoint and every member of a group passes that same group (the same
    /// processes in the same order); each group gets a communicator of its own. A rank that
    /// belongs to no group passes any group it is not a member of (an empty one, say).
    ///
    /// ```
    /// // Ranks {0, 1} and {2, 3} build a communicator each, in one call.
    /// let got = tmpi::run_local(4, |w| {
    ///     let mine: Vec<usize> = if w.rank() < 2 { vec![0, 1] } else { vec![2, 3] };
    ///     let c = w.create(&w.group().incl(&mine).unwrap()).unwrap().unwrap();
    ///     let mut sum = [0usize];
    ///     c.allreduce(&[w.rank()], &mut sum, tmpi::Op::Sum).unwrap();
    ///     (c.rank(), c.size(), sum[0])
    /// });
    /// assert_eq!(got, vec![(0, 2, 1), (1, 2, 1), (0, 2, 5), (1, 2, 5)]);
    /// ```
    ///
    /// # Errors
    /// On every rank alike: [`Error::InvalidGroup`] when some rank's group has a process that
    /// is not a member of `self`, or when the members disagree (groups that overlap, or
    /// members of one group that passed it in different orders or passed another); as
    /// [`Comm::split`].
    pub fn create(&self, group: &Group) -> Result<Option<Comm>> {
        if seen::on() {
            return seen::call(What::new(Kind::Create).on(self), || self.create(group));
        }
        let n = self.size();
        let in_parent = self.parent_ranks(group);
        let mine = match (&in_parent, group.rank()) {
            (Some(_), Some(i)) => [fingerprint(&group.members), i as u64],
            _ => [0, NOT_A_MEMBER],
        };
        let mut all = vec![0u64; 2 * n];
        self.allgather(&mine, &mut all)?;
        // Each member checks that every member of its group passed the same group and sits
        // where the group puts it; then every rank learns the worst verdict.
        let verdict = match (&in_parent, group.rank()) {
            (None, _) => BAD_OUTSIDE,
            (Some(ranks), Some(_)) if ranks.iter().enumerate().any(|(i, &p)| all[2 * p..2 * p + 2] != [mine[0], i as u64]) => BAD_DISAGREE,
            _ => 0,
        };
        let mut worst = [0u64];
        self.allreduce(&[verdict], &mut worst, crate::Op::Max)?;
        match worst[0] {
            0 => {}
            BAD_OUTSIDE => return Err(Error::InvalidGroup("create: a group has processes outside the communicator".into())),
            _ => {
                return Err(Error::InvalidGroup(
                    "create: the members disagree about their group (groups overlap, or a member passed another group or order)".into(),
                ))
            }
        }
        match (in_parent, group.rank()) {
            (Some(ranks), Some(i)) => {
                // The group's first member names it: disjoint groups have different ones.
                let key = i32::try_from(i).map_err(|_| Error::InvalidGroup("create: group too large".into()))?;
                self.split(Some(ranks[0] as u32), key)
            }
            _ => self.split(None, 0),
        }
    }

    /// A new communicator of the members of `group`, ranked in group order, made by the
    /// members alone (MPI's `Comm_create_group`): only they call it, and it communicates only
    /// among them, so the other ranks of `self` need not take part (they may be in another
    /// `create_group`, or anything else, meanwhile).
    ///
    /// `tag` tells apart the calls that threads of one process make at the same time on
    /// `self`; its messages never meet user messages or collectives, whatever the tag.
    ///
    /// ```
    /// // Ranks 1 and 3 build a communicator while ranks 0 and 2 do something else.
    /// let got = tmpi::run_local(4, |w| {
    ///     if w.rank() % 2 == 0 {
    ///         return None;
    ///     }
    ///     let odd = w.group().incl(&[3, 1]).unwrap();
    ///     let c = w.create_group(&odd, 7).unwrap();
    ///     Some((c.rank(), c.size()))
    /// });
    /// assert_eq!(got, vec![None, Some((1, 2)), None, Some((0, 2))]);
    /// ```
    ///
    /// # Errors
    /// Before any communication: [`Error::InvalidTag`] for a tag above [`crate::TAG_UB`];
    /// [`Error::InvalidGroup`] when this process is not a member of `group` or the group has
    /// a process outside `self`. [`Error::InvalidGroup`] on every member when the members
    /// passed the same processes in different orders. Members that pass groups of different
    /// processes are erroneous (as in MPI): they may fail so, or wait for each other. As
    /// [`Comm::dup`].
    pub fn create_group(&self, group: &Group, tag: crate::Tag) -> Result<Comm> {
        if tag > crate::TAG_UB {
            return Err(Error::InvalidTag { tag });
        }
        let me = group.rank().ok_or_else(|| Error::InvalidGroup("create_group: this process is not a member of the group".into()))?;
        let ranks = self
            .parent_ranks(group)
            .ok_or_else(|| Error::InvalidGroup("create_group: the group has processes outside the communicator".into()))?;
        // The members talk in the order of their ranks here, which members that agree on the
        // processes agree on whatever order they passed; the order itself is checked below.
        let mut sorted = ranks.clone();
        sorted.sort_unstable();
        let chan = GroupChan { comm: self, me: sorted.binary_search(&ranks[me]).unwrap_or(0), ranks: sorted, tag };
        let id = chan.agree_id(fingerprint(&group.members))?;
        let members = Arc::new(group.members.to_vec());
        let c = self.with_id(id, me, members.len(), Some(members))?;
        crate::coll::shm::assign(&c)?;
        Ok(c)
    }

    /// The rank in `self` of each member of `group`, `None` if one is not in `self`.
    fn parent_ranks(&self, group: &Group) -> Option<Vec<Rank>> {
        let index: std::collections::HashMap<usize, Rank> = (0..self.size()).map(|r| (self.world_rank(r), r)).collect();
        group.members.iter().map(|m| index.get(m).copied()).collect()
    }

    /// Compares two communicators (a local call): the same context, the same members in the
    /// same order, the same members in another order, or different members.
    ///
    /// ```
    /// use tmpi::CommCmp;
    /// tmpi::run_local(2, |w| {
    ///     let d = w.dup().unwrap();
    ///     assert_eq!(w.compare(&w), CommCmp::Identical);
    ///     assert_eq!(w.compare(&d), CommCmp::Congruent);
    ///     let rev = w.split(Some(0), -(w.rank() as i32)).unwrap().unwrap();
    ///     assert_eq!(w.compare(&rev), CommCmp::Similar);
    /// });
    /// ```
    pub fn compare(&self, other: &Comm) -> CommCmp {
        if Arc::ptr_eq(&self.inner, &other.inner) || Arc::ptr_eq(&self.inner.eng, &other.inner.eng) && self.inner.id == other.inner.id {
            return CommCmp::Identical;
        }
        match self.group().compare(&other.group()) {
            GroupCmp::Identical => CommCmp::Congruent,
            GroupCmp::Similar => CommCmp::Similar,
            GroupCmp::Unequal => CommCmp::Unequal,
        }
    }
}

/// [`Comm::create`]'s position of a rank that is not a member of its group.
const NOT_A_MEMBER: u64 = u64::MAX;
/// [`Comm::create`]'s verdicts (0: agreed): a group with processes outside the communicator,
/// members that disagree.
const BAD_OUTSIDE: u64 = 2;
const BAD_DISAGREE: u64 = 1;

/// A 64-bit fingerprint of a group: its size and its members in order (FNV-1a over their
/// world ranks). Members compare fingerprints to learn whether they passed the same group.
fn fingerprint(members: &[usize]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for w in std::iter::once(members.len()).chain(members.iter().copied()) {
        for b in (w as u64).to_le_bytes() {
            h = (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    h
}

/// Where [`Comm::create_group`] talks: its own context per communicator, beside the two every
/// communicator has (user `2 id`, collectives `2 id + 1`, all below `2^19` because ids stay
/// at most [`crate::coll_glue::MAX_COMM_ID`]), so that its messages never meet another kind.
const GROUP_CTX_BASE: u32 = 1 << 19;
const _: () = assert!(2 * crate::coll_glue::MAX_COMM_ID + 1 < GROUP_CTX_BASE);
const _: () = assert!(GROUP_CTX_BASE + crate::coll_glue::MAX_COMM_ID <= crate::matching::MAX_CTX);

/// Point-to-point among the members of a group on the group-creation context of a
/// communicator: the collective algorithms of [`crate::coll`] run over it unchanged, with every
/// message on the caller's tag (their own tags only label phases; within one call, messages
/// pair one to one by source and order).
struct GroupChan<'a> {
    comm: &'a Comm,
    /// The members' ranks in `comm`, ascending; `me` indexes this rank.
    ranks: Vec<Rank>,
    me: usize,
    tag: crate::Tag,
}

impl GroupChan<'_> {
    fn ctx(&self) -> u32 {
        GROUP_CTX_BASE | self.comm.inner.id
    }

    fn peer(&self, r: usize) -> Result<Rank> {
        self.ranks.get(r).copied().ok_or(Error::InvalidRank { rank: r, size: self.ranks.len() })
    }

    /// Agrees on a communicator id that every member has free, and checks that every member
    /// passed the group of fingerprint `fp` (the same algorithm as the collective one of
    /// `Comm::dup`, over the members only).
    fn agree_id(&self, fp: u64) -> Result<u32> {
        let mut from = 0usize;
        loop {
            let first = self.comm.eng()?.comm_id_first_free_word(from) as u64;
            let mut max = [0u64; 3];
            crate::coll::run::allreduce(self, &[first, fp, !fp], &mut max, crate::Op::Max)?;
            if max[1] != !max[2] {
                return Err(Error::InvalidGroup("create_group: the members passed the group in different orders".into()));
            }
            // Every member sees the same maxima, so all return alike.
            let w = max[0] as usize;
            let out_of_ids = || Error::State(format!("out of communicator ids ({} in use at once at most)", crate::coll_glue::MAX_COMM_ID));
            if w * 64 > crate::coll_glue::MAX_COMM_ID as usize {
                return Err(out_of_ids());
            }
            let free = self.comm.eng()?.comm_id_free_word(w);
            let mut all = [0u64];
            crate::coll::run::allreduce(self, &[free], &mut all, crate::Op::BitAnd)?;
            if all[0] != 0 {
                let id = (w * 64) as u32 + all[0].trailing_zeros();
                return if id > crate::coll_glue::MAX_COMM_ID { Err(out_of_ids()) } else { Ok(id) };
            }
            from = w + 1;
        }
    }
}

impl crate::coll::CollP2p for GroupChan<'_> {
    fn rank(&self) -> usize {
        self.me
    }
    fn size(&self) -> usize {
        self.ranks.len()
    }
    fn run(&self, plan: crate::coll::plan::Plan, input: Option<&[u8]>, output: Option<&mut [u8]>) -> Result<()> {
        let world = Arc::new(self.ranks.iter().map(|&r| self.comm.world_rank(r)).collect::<Vec<_>>());
        let who = crate::nbc::sched::Members {
            ctx: self.ctx(),
            rank: self.me,
            size: self.ranks.len(),
            world: Some(world),
            seq: 0,
            full: None,
            fixed_tag: Some(self.tag),
            keys: Some(Arc::new(self.ranks.clone())),
        };
        crate::coll_ctx::run_plan(self.comm, who, plan, input, output)
    }
    fn send(&self, buf: &[u8], dest: usize, _tag: u32) -> Result<()> {
        self.comm.send_ctx(self.ctx(), buf, self.peer(dest)?, self.tag, false)
    }
    fn recv(&self, buf: &mut [u8], src: usize, _tag: u32) -> Result<usize> {
        let from = self.peer(src)? as u32;
        self.comm.recv_ctx(self.ctx(), buf, Some(from), Some(self.tag)).map(|s| s.len())
    }
    fn sendrecv(&self, sbuf: &[u8], dest: usize, _stag: u32, rbuf: &mut [u8], src: usize, _rtag: u32) -> Result<usize> {
        let (to, from) = (self.peer(dest)?, self.peer(src)? as u32);
        self.comm.sendrecv_ctx(self.ctx(), sbuf, to, self.tag, rbuf, Some(from), Some(self.tag)).map(|s| s.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::run_local;

    #[test]
    fn set_operations_follow_mpi_order() {
        run_local(6, |w| {
            let g = w.group();
            assert_eq!(g.size(), 6);
            assert_eq!(g.rank(), Some(w.rank()));
            let a = g.incl(&[5, 1, 3]).unwrap();
            let b = g.incl(&[3, 4, 5]).unwrap();
            let ranks = |x: &Group| x.translate_ranks(&(0..x.size()).collect::<Vec<_>>(), &g).unwrap();
            assert_eq!(ranks(&a.union(&b)), [5, 1, 3, 4].map(Some));
            assert_eq!(ranks(&a.intersection(&b)), [5, 3].map(Some));
            assert_eq!(ranks(&a.difference(&b)), [Some(1)]);
            assert_eq!(ranks(&g.excl(&[0, 4]).unwrap()), [1, 2, 3, 5].map(Some));
            assert_eq!(a.translate_ranks(&[0, 1, 2], &b).unwrap(), vec![Some(2), None, Some(0)]);
            assert_eq!(a.rank(), [5, 1, 3].iter().position(|&r| r == w.rank()));
            assert_eq!(a.compare(&a.clone()), GroupCmp::Identical);
            assert_eq!(a.compare(&g.incl(&[1, 3, 5]).unwrap()), GroupCmp::Similar);
            assert_eq!(a.compare(&b), GroupCmp::Unequal);
            assert_eq!(a.difference(&a).size(), 0);
            assert_eq!(a.difference(&a).compare(&g.empty()), GroupCmp::Identical);
            assert!(matches!(g.incl(&[1, 1]), Err(Error::InvalidGroup(_))));
            assert!(matches!(g.excl(&[6]), Err(Error::InvalidRank { rank: 6, size: 6 })));
            assert!(matches!(a.translate_ranks(&[3], &g), Err(Error::InvalidRank { .. })));
        });
    }

    #[test]
    fn create_compare_on_world_and_split() {
        for n in 1..=7 {
            run_local(n, |w| {
                let g = w.group();
                // Reverse order of the odd ranks.
                let odd: Vec<usize> = (0..n).filter(|r| r % 2 == 1).rev().collect();
                let c = w.create(&g.incl(&odd).unwrap()).unwrap();
                match c {
                    Some(c) => {
                        assert_eq!(c.size(), odd.len());
                        assert_eq!(odd[c.rank()], w.rank());
                        let mut s = [0u64];
                        c.allreduce(&[w.rank() as u64], &mut s, crate::Op::Sum).unwrap();
                        assert_eq!(s[0], odd.iter().sum::<usize>() as u64);
                        assert_eq!(c.compare(&w), if n == 1 { CommCmp::Similar } else { CommCmp::Unequal });
                        assert_eq!(c.group().compare(&g.incl(&odd).unwrap()), GroupCmp::Identical);
                    }
                    None => assert_eq!(w.rank() % 2, 0),
                }
                let d = w.dup().unwrap();
                assert_eq!(w.compare(&w.clone()), CommCmp::Identical);
                assert_eq!(w.compare(&d), CommCmp::Congruent);
                let rev = w.split(Some(1), -(w.rank() as i32)).unwrap().unwrap();
                assert_eq!(d.compare(&rev), if n == 1 { CommCmp::Congruent } else { CommCmp::Similar });
                // create on a split communicator, from its own group: the whole of it.
                let all = rev.create(&rev.group()).unwrap().unwrap();
                assert_eq!(all.compare(&rev), CommCmp::Congruent);
                // A group with processes outside the communicator is refused everywhere.
                if n > 1 {
                    let half = w.split(Some((w.rank() % 2) as u32), 0).unwrap().unwrap();
                    assert!(matches!(half.create(&g), Err(Error::InvalidGroup(_))));
                }
                let empty = w.create(&g.empty()).unwrap();
                assert!(empty.is_none());
            });
        }
    }

    /// Issue 55 item 9: ranks {0, 1} created from group {0, 1} and ranks {2, 3} from {2, 3};
    /// every rank used to get one 4-rank communicator, with no error.
    #[test]
    fn create_with_disjoint_groups_gives_one_communicator_per_group() {
        for n in [4, 5, 6] {
            let got = run_local(n, |w| {
                let r = w.rank();
                // Pairs {0, 1}, {2, 3}, ... in reverse order; a last odd rank passes the empty group.
                let pair: Vec<usize> = if r + 1 == n && n % 2 == 1 { vec![] } else { vec![r | 1, r & !1] };
                let c = w.create(&w.group().incl(&pair).unwrap()).unwrap();
                c.map(|c| {
                    let mut sum = [0usize];
                    c.allreduce(&[r], &mut sum, crate::Op::Sum).unwrap();
                    let peer = 1 - c.rank();
                    c.send(&[r], peer, 3).unwrap();
                    let mut from = [0usize];
                    c.recv(&mut from, peer, 3).unwrap();
                    (c.rank(), c.size(), sum[0], from[0])
                })
            });
            for (r, g) in got.iter().enumerate() {
                if r + 1 == n && n % 2 == 1 {
                    assert_eq!(*g, None, "{n} ranks, rank {r}");
                } else {
                    assert_eq!(*g, Some((1 - r % 2, 2, 2 * (r & !1) + 1, r ^ 1)), "{n} ranks, rank {r}");
                }
            }
        }
    }

    #[test]
    fn create_refuses_overlapping_and_inconsistent_groups_on_every_rank() {
        let cases: [fn(usize) -> Vec<usize>; 3] = [
            // Overlapping: {0, 1}, {1, 2}, {2, 3}, {3, 0}.
            |r| vec![r, (r + 1) % 4],
            // One group, but rank 1 passes it in another order.
            |r| if r == 1 { vec![1, 0, 2, 3] } else { vec![0, 1, 2, 3] },
            // Rank 3 is a member of {2, 3} but passes the empty group.
            |r| {
                if r == 3 {
                    vec![]
                } else if r == 2 {
                    vec![2, 3]
                } else {
                    vec![0, 1]
                }
            },
        ];
        for (i, case) in cases.iter().enumerate() {
            let got = run_local(4, |w| {
                let r = w.create(&w.group().incl(&case(w.rank())).unwrap());
                // The world still works after the refusal.
                let mut s = [0u32];
                w.allreduce(&[1u32], &mut s, crate::Op::Sum).unwrap();
                (matches!(r, Err(Error::InvalidGroup(_))), s[0])
            });
            assert_eq!(got, vec![(true, 4); 4], "case {i}");
        }
        // A group of processes outside the communicator, passed by one rank only.
        let got = run_local(4, |w| {
            let half = w.split(Some((w.rank() / 2) as u32), 0).unwrap().unwrap();
            let g = if w.rank() == 0 { w.group().incl(&[0, 3]).unwrap() } else { half.group() };
            matches!(half.create(&g), Err(Error::InvalidGroup(_)))
        });
        assert_eq!(got, vec![true, true, false, false], "only the half with the bad group fails");
    }

    #[test]
    fn create_group_runs_among_the_members_alone() {
        let got = run_local(5, |w| {
            let r = w.rank();
            // Evens and odds, each group in reverse order, at the same time with the same tag;
            // rank 4 (an even) then makes a second communicator with rank 1 alone while ranks
            // 0, 2 and 3 exchange user messages on the world with that same tag.
            let mut g: Vec<usize> = (0..5).filter(|x| x % 2 == r % 2).collect();
            g.reverse();
            let c = w.create_group(&w.group().incl(&g).unwrap(), 9).unwrap();
            let mut sum = [0usize];
            c.allreduce(&[r], &mut sum, crate::Op::Sum).unwrap();
            let pair = match r {
                1 | 4 => {
                    let p = w.create_group(&w.group().incl(&[4, 1]).unwrap(), 9).unwrap();
                    let mut b = [r];
                    p.bcast(&mut b, 0).unwrap();
                    Some((p.rank(), b[0]))
                }
                0 | 2 => {
                    w.send(&[r], 3, 9).unwrap();
                    None
                }
                _ => {
                    let (a, b) = (w.recv_vec::<usize>(0, 9).unwrap().0, w.recv_vec::<usize>(2, 9).unwrap().0);
                    Some((a[0], b[0]))
                }
            };
            (c.rank(), c.size(), sum[0], pair)
        });
        assert_eq!(got, vec![(2, 3, 6, None), (1, 2, 4, Some((1, 4))), (1, 3, 6, None), (0, 2, 4, Some((0, 2))), (0, 3, 6, Some((0, 4)))]);
    }

    /// Rank 1 waits in its first `create_group` (with a late rank 3) while rank 4, done with
    /// its own first group, already starts a second one with rank 1 on the same parent and
    /// tag: rank 4's messages, though it is the second member of that pair as rank 3 is of
    /// the first, wait for the second call instead of being taken for rank 3's.
    #[test]
    fn create_group_keeps_a_fast_peers_next_call_apart() {
        let got = run_local(5, |w| {
            let r = w.rank();
            if r == 3 {
                std::thread::sleep(std::time::Duration::from_millis(300));
            }
            let first: &[usize] = if r % 2 == 1 { &[1, 3] } else { &[0, 2, 4] };
            let c = w.create_group(&w.group().incl(first).unwrap(), 5).unwrap();
            let pair = if r == 1 || r == 4 {
                let p = w.create_group(&w.group().incl(&[1, 4]).unwrap(), 5).unwrap();
                let mut b = [r];
                p.bcast(&mut b, 1).unwrap();
                Some(b[0])
            } else {
                None
            };
            (c.size(), pair)
        });
        assert_eq!(got, vec![(3, None), (2, Some(4)), (3, None), (2, None), (3, Some(4))]);
    }

    #[test]
    fn create_group_refusals() {
        let got = run_local(4, |w| {
            let r = w.rank();
            let g = w.group();
            let mut errs = vec![
                matches!(w.create_group(&g, crate::TAG_UB + 1), Err(Error::InvalidTag { .. })),
                matches!(w.create_group(&g.incl(&[(r + 1) % 4]).unwrap(), 1), Err(Error::InvalidGroup(_))),
                matches!(w.create_group(&g.empty(), 1), Err(Error::InvalidGroup(_))),
            ];
            // On a half, a group with a process of the other half.
            let half = w.split(Some((r / 2) as u32), 0).unwrap().unwrap();
            errs.push(matches!(half.create_group(&g.incl(&[r, r ^ 2]).unwrap(), 1), Err(Error::InvalidGroup(_))));
            // Members that pass their group in different orders: every member learns it.
            let order = if r % 2 == 0 { [0, 1, 2, 3] } else { [3, 2, 1, 0] };
            errs.push(matches!(w.create_group(&g.incl(&order).unwrap(), 4), Err(Error::InvalidGroup(_))));
            // And then a good call on the half works (a parent other than the world).
            let c = half.create_group(&half.group().incl(&[1, 0]).unwrap(), 4).unwrap();
            let mut s = [0usize];
            c.allreduce(&[r], &mut s, crate::Op::Sum).unwrap();
            (errs, c.rank(), s[0])
        });
        for (r, (errs, rank, sum)) in got.iter().enumerate() {
            assert!(errs.iter().all(|&e| e), "rank {r}: {errs:?}");
            assert_eq!((*rank, *sum), (1 - r % 2, if r < 2 { 1 } else { 5 }), "rank {r}");
        }
    }
}
