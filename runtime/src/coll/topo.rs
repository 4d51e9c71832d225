//! Which ranks of a communicator share a host: what the node-aware collectives
//! ([`super::hier`]) are built on.
//!
//! The world learns it once, in `init`: each rank's host identity (`TMPI_NODE_ID` when the
//! launcher sets it, else the host name and boot id, as the fabric uses) is hashed to 64 bits
//! and gathered from every rank (`coll_glue::learn_hosts`), unless the fabric says so already (shared memory
//! only, or one rank: one host). A communicator made later derives its own map from the
//! world's and its members, without communication, so every rank of it computes the same map.

use std::sync::Arc;

/// The hosts of a communicator's ranks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Topo {
    /// Host index of each rank (hosts numbered by their lowest rank, in rank order).
    host_of: Vec<usize>,
    /// Ranks of each host in rank order, the hosts one after another.
    order: Vec<usize>,
    /// Where each host's ranks start in `order` (one more entry: the end).
    start: Vec<usize>,
    /// Index of each rank within its host.
    local: Vec<usize>,
    /// Every host's ranks are consecutive ranks: `order` is rank order, and the hosts in host
    /// order take the ranks in rank order (a reduction then combines in rank order).
    pub(crate) contiguous: bool,
}

impl Topo {
    /// The map of ranks whose hosts have identities `keys` (one per rank).
    pub(crate) fn from_keys(keys: &[u64]) -> Topo {
        let mut host_of = Vec::with_capacity(keys.len());
        let mut firsts: Vec<u64> = Vec::new();
        for &k in keys {
            let h = match firsts.iter().position(|&f| f == k) {
                Some(h) => h,
                None => {
                    firsts.push(k);
                    firsts.len() - 1
                }
            };
            host_of.push(h);
        }
        Topo::from_hosts(host_of)
    }

    /// The map where rank `r` runs on host `host_of[r]` (hosts numbered by first appearance).
    pub(crate) fn from_hosts(host_of: Vec<usize>) -> Topo {
        let hosts = host_of.iter().max().map_or(0, |&m| m + 1);
        let mut count = vec![0usize; hosts];
        for &h in &host_of {
            count[h] += 1;
        }
        let mut start = vec![0usize; hosts + 1];
        for h in 0..hosts {
            start[h + 1] = start[h] + count[h];
        }
        let mut fill = start.clone();
        let mut order = vec![0usize; host_of.len()];
        let mut local = vec![0usize; host_of.len()];
        for (r, &h) in host_of.iter().enumerate() {
            local[r] = fill[h] - start[h];
            order[fill[h]] = r;
            fill[h] += 1;
        }
        let contiguous = order.iter().enumerate().all(|(i, &r)| i == r);
        Topo { host_of, order, start, local, contiguous }
    }

    /// Number of hosts.
    pub(crate) fn hosts(&self) -> usize {
        self.start.len() - 1
    }

    /// The host of rank `r`.
    pub(crate) fn host_of(&self, r: usize) -> usize {
        self.host_of[r]
    }

    /// The index of rank `r` among its host's ranks.
    pub(crate) fn local(&self, r: usize) -> usize {
        self.local[r]
    }

    /// The ranks of host `h`, in rank order.
    pub(crate) fn ranks(&self, h: usize) -> &[usize] {
        &self.order[self.start[h]..self.start[h + 1]]
    }

    /// Every rank, host by host (host order, rank order within a host).
    pub(crate) fn order(&self) -> &[usize] {
        &self.order
    }

    /// Where host `h`'s ranks start in [`Topo::order`].
    #[cfg(test)]
    pub(crate) fn start(&self, h: usize) -> usize {
        self.start[h]
    }

    /// The lowest rank of each host (its leader), in host order.
    #[cfg(test)]
    pub(crate) fn leaders(&self) -> Vec<usize> {
        (0..self.hosts()).map(|h| self.order[self.start[h]]).collect()
    }

    /// The most ranks on one host.
    #[cfg(test)]
    pub(crate) fn max_local(&self) -> usize {
        (0..self.hosts()).map(|h| self.start[h + 1] - self.start[h]).max().unwrap_or(0)
    }

    /// The map of a communicator whose rank `i` is rank `members[i]` here.
    pub(crate) fn restrict(&self, members: impl Iterator<Item = usize>) -> Topo {
        let keys: Vec<u64> = members.map(|m| self.host_of[m] as u64).collect();
        Topo::from_keys(&keys)
    }
}

/// What a communicator's collectives know of the hosts: the world's map (shared by every
/// communicator of the world) and its own, `None` when all its ranks share one host.
#[derive(Debug, Clone)]
pub(crate) struct Hosts {
    world: Arc<Topo>,
    pub(crate) topo: Option<Arc<Topo>>,
}

impl Hosts {
    /// The world's hosts, from its map.
    pub(crate) fn world(world: Topo) -> Hosts {
        let world = Arc::new(world);
        let topo = (world.hosts() > 1).then(|| world.clone());
        Hosts { world, topo }
    }

    /// The hosts of a communicator whose rank `i` is world rank `members[i]`.
    pub(crate) fn derive(&self, members: impl Iterator<Item = usize>) -> Hosts {
        let t = self.world.restrict(members);
        let topo = (t.hosts() > 1).then(|| Arc::new(t));
        Hosts { world: self.world.clone(), topo }
    }
}

/// 64-bit FNV-1a of a host identity (stable across processes and builds).
pub(crate) fn key_of(id: &str) -> u64 {
    id.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One case of [`maps_from_keys`]: keys, hosts, order, contiguous, most ranks on a host.
    type Case = (&'static [u64], usize, &'static [usize], bool, usize);

    /// Table of host maps: hosts by first appearance, ranks per host, contiguity.
    #[test]
    fn maps_from_keys() {
        let cases: [Case; 4] = [
            (&[7, 7, 7], 1, &[0, 1, 2], true, 3),
            (&[5, 5, 9, 9, 9], 2, &[0, 1, 2, 3, 4], true, 3),
            (&[1, 2, 1, 2, 1], 2, &[0, 2, 4, 1, 3], false, 3),
            (&[3, 4, 5], 3, &[0, 1, 2], true, 1),
        ];
        for (keys, hosts, order, contiguous, max_local) in cases {
            let t = Topo::from_keys(keys);
            assert_eq!((t.hosts(), t.order(), t.contiguous, t.max_local()), (hosts, order, contiguous, max_local), "{keys:?}");
            for r in 0..keys.len() {
                let h = t.host_of(r);
                assert_eq!(t.ranks(h)[t.local(r)], r);
                assert_eq!(t.order()[t.start(h) + t.local(r)], r);
            }
        }
        let t = Topo::from_keys(&[1, 2, 1, 2, 1]);
        assert_eq!(t.leaders(), vec![0, 1]);
        // Ranks 3, 4 and 1 of it: hosts 2, 1, 2 -> renumbered 0, 1, 0.
        let s = t.restrict([3, 4, 1].into_iter());
        assert_eq!((s.hosts(), s.order()), (2, &[0, 2, 1][..]));
    }
}
