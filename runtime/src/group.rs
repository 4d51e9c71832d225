//! Process groups ([`Group`]) and communicators built from them ([`Comm::create`]), and
//! communicator comparison ([`Comm::compare`]).
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

    /// A new communicator of the members of `group`, ranked in group order (collective over
    /// `self`: every rank calls it with the same group). Ranks outside the group get `None`.
    ///
    /// ```
    /// let sizes = tmpi::run_local(4, |w| {
    ///     let g = w.group().incl(&[3, 1]).unwrap();
    ///     w.create(&g).unwrap().map(|c| (c.rank(), c.size()))
    /// });
    /// assert_eq!(sizes, vec![None, Some((1, 2)), None, Some((0, 2))]);
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidGroup`] (before any communication) when `group` has a process that is
    /// not a member of `self`; as [`Comm::split`].
    pub fn create(&self, group: &Group) -> Result<Option<Comm>> {
        if seen::on() {
            return seen::call(What::new(Kind::Create).on(self), || self.create(group));
        }
        let mine = self.group();
        if group.members.iter().any(|m| !mine.members.contains(m)) {
            return Err(Error::InvalidGroup("create: the group has processes outside the communicator".into()));
        }
        let key = match group.rank() {
            Some(i) => Some(i32::try_from(i).map_err(|_| Error::InvalidGroup("create: group too large".into()))?),
            None => None,
        };
        self.split(key.map(|_| 0), key.unwrap_or(0))
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
}
