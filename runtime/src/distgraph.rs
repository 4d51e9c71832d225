//! Distributed graph topologies: [`Comm::dist_graph_create_adjacent`] and
//! [`DistGraphComm`] with its neighbour collectives (MPI's `MPI_Dist_graph_create_adjacent`,
//! `MPI_Neighbor_allgather`, `MPI_Neighbor_alltoall`, unweighted).
//!
//! Each rank names the ranks it receives from (its sources, in the order its receive blocks
//! use) and the ranks it sends to (its destinations, in the order its send blocks use). The
//! graph must be consistent: rank `a` lists `b` among its destinations as many times as `b`
//! lists `a` among its sources. An edge listed twice carries two messages, matched in list
//! order. `reorder` is accepted and ignored (ranks are kept), as in [`Comm::cart_create`].
//!
//! The neighbour messages travel on a communicator of their own (made with the graph), so
//! they never meet user messages or other collectives; each call posts every receive, then
//! every send, then waits, so any graph completes without an order of its own.

use std::ops::Deref;

use bytemuck::Pod;

use crate::comm::Comm;
use crate::error::{Error, Result};
use crate::op::Op;
use crate::seen::{self, Kind, What};
use crate::{Rank, Tag};

/// Tags of the neighbour collectives on the graph's own communicator.
const TAG_ALLGATHER: Tag = 1;
const TAG_ALLTOALL: Tag = 2;

/// Verdicts of the creation check, the worst of which every rank learns.
const BAD_RANK: u64 = 2;
const BAD_EDGES: u64 = 1;

/// A communicator with a distributed graph topology ([`Comm::dist_graph_create_adjacent`]).
/// Derefs to [`Comm`], so every communicator call works on it too.
#[derive(Clone, Debug)]
pub struct DistGraphComm {
    comm: Comm,
    /// Where the neighbour collectives' messages go.
    wire: Comm,
    sources: Vec<Rank>,
    destinations: Vec<Rank>,
}

impl Deref for DistGraphComm {
    type Target = Comm;
    fn deref(&self) -> &Comm {
        &self.comm
    }
}

impl seen::Seen for DistGraphComm {}

impl Comm {
    /// A communicator of the same ranks with the graph whose edges into this rank come from
    /// `sources` and whose edges out of it go to `destinations` (collective; see the
    /// [module docs](crate::distgraph)).
    ///
    /// ```
    /// // A ring where each rank sends to the next and receives from the previous.
    /// let got = tmpi::run_local(3, |w| {
    ///     let (r, n) = (w.rank(), w.size());
    ///     let g = w.dist_graph_create_adjacent(&[(r + n - 1) % n], &[(r + 1) % n], false).unwrap();
    ///     let mut from = [0usize];
    ///     g.neighbor_allgather(&[r], &mut from).unwrap();
    ///     from[0]
    /// });
    /// assert_eq!(got, vec![2, 0, 1]);
    /// ```
    ///
    /// # Errors
    /// On every rank alike: [`Error::InvalidTopology`] when some rank names a rank outside the
    /// communicator, or the ranks' lists disagree (an edge one end lists and the other does
    /// not, as often); as [`Comm::dup`].
    pub fn dist_graph_create_adjacent(&self, sources: &[Rank], destinations: &[Rank], reorder: bool) -> Result<DistGraphComm> {
        if seen::on() {
            return seen::call(What::new(Kind::DistGraphCreate).on(self), || {
                self.dist_graph_create_adjacent(sources, destinations, reorder)
            });
        }
        let _ = reorder;
        match self.graph_verdict(sources, destinations)? {
            0 => {}
            BAD_RANK => return Err(Error::InvalidTopology(format!("dist_graph_create_adjacent: a rank names a neighbour outside the communicator of {} ranks", self.size()))),
            _ => {
                return Err(Error::InvalidTopology(
                    "dist_graph_create_adjacent: the graph is inconsistent (some rank's destinations disagree with the sources of the rank it names)".into(),
                ))
            }
        }
        let comm = self.dup()?;
        let wire = comm.dup()?;
        Ok(DistGraphComm { comm, wire, sources: sources.to_vec(), destinations: destinations.to_vec() })
    }

    /// The worst verdict over every rank on the graph's lists (collective): each rank counts
    /// its edges to each rank, an alltoall tells each rank how many edges come to it from
    /// each, and those must be the counts of its sources.
    fn graph_verdict(&self, sources: &[Rank], destinations: &[Rank]) -> Result<u64> {
        let n = self.size();
        let in_range = sources.iter().chain(destinations).all(|&r| r < n);
        let (mut outgoing, mut listed) = (vec![0u64; n], vec![0u64; n]);
        if in_range {
            destinations.iter().for_each(|&d| outgoing[d] += 1);
            sources.iter().for_each(|&s| listed[s] += 1);
        }
        let mut incoming = vec![0u64; n];
        self.alltoall(&outgoing, &mut incoming)?;
        let mine = match (in_range, incoming == listed) {
            (false, _) => BAD_RANK,
            (true, false) => BAD_EDGES,
            (true, true) => 0,
        };
        let mut worst = [0u64];
        self.allreduce(&[mine], &mut worst, Op::Max)?;
        Ok(worst[0])
    }
}

impl DistGraphComm {
    /// The communicator (without the topology).
    pub fn comm(&self) -> &Comm {
        &self.comm
    }

    /// The ranks this rank receives from, in receive-block order.
    pub fn sources(&self) -> &[Rank] {
        &self.sources
    }

    /// The ranks this rank sends to, in send-block order.
    pub fn destinations(&self) -> &[Rank] {
        &self.destinations
    }

    /// Sends `send` to every destination and receives each source's block into `recv`
    /// (`sources().len()` blocks of `send.len()`, in [`DistGraphComm::sources`] order)
    /// (collective).
    ///
    /// # Errors
    /// [`Error::InvalidBuffer`] when `recv.len() != sources().len() * send.len()`, or a
    /// source's block is shorter; [`Error::Truncated`] when it is longer; [`Error::PeerGone`].
    pub fn neighbor_allgather<T: Pod>(&self, send: &[T], recv: &mut [T]) -> Result<()> {
        if seen::on() {
            return seen::call(What::new(Kind::NeighborAllgather).on(&self.comm).bytes(size_of_val(send)), || {
                self.neighbor_allgather(send, recv)
            });
        }
        if Some(recv.len()) != send.len().checked_mul(self.sources.len()) {
            return Err(Error::InvalidBuffer(format!(
                "neighbor_allgather: receive buffer has {} elements, {} sources * {} needed",
                recv.len(),
                self.sources.len(),
                send.len()
            )));
        }
        self.exchange(TAG_ALLGATHER, |_| send, recv, send.len())
    }

    /// Sends block `j` of `send` to destination `j` and receives source `i`'s block into
    /// block `i` of `recv` (blocks of one length: `send` has `destinations().len()` of them,
    /// `recv` has `sources().len()`) (collective).
    ///
    /// # Errors
    /// [`Error::InvalidBuffer`] when the buffers are not whole blocks of one length, or a
    /// source's block is shorter; [`Error::Truncated`] when it is longer; [`Error::PeerGone`].
    pub fn neighbor_alltoall<T: Pod>(&self, send: &[T], recv: &mut [T]) -> Result<()> {
        if seen::on() {
            return seen::call(What::new(Kind::NeighborAlltoall).on(&self.comm).bytes(size_of_val(send)), || {
                self.neighbor_alltoall(send, recv)
            });
        }
        let b = block_len(send.len(), self.destinations.len(), recv.len(), self.sources.len()).ok_or_else(|| {
            Error::InvalidBuffer(format!(
                "neighbor_alltoall: send has {} elements for {} destinations and receive {} for {} sources; both must be whole blocks of one length",
                send.len(),
                self.destinations.len(),
                recv.len(),
                self.sources.len()
            ))
        })?;
        self.exchange(TAG_ALLTOALL, |j| &send[j * b..(j + 1) * b], recv, b)
    }

    /// Posts a receive of `b` elements from each source into its block of `recv`, sends
    /// `block(j)` to each destination `j`, and waits for all; each receive must fill its block.
    fn exchange<'a, T: Pod>(&self, tag: Tag, block: impl Fn(usize) -> &'a [T], recv: &mut [T], b: usize) -> Result<()> {
        let want = b * size_of::<T>();
        crate::scope(|s| -> Result<()> {
            let mut rest = &mut recv[..];
            let mut recvs = Vec::with_capacity(self.sources.len());
            for &src in &self.sources {
                let (mine, tail) = std::mem::take(&mut rest).split_at_mut(b);
                rest = tail;
                recvs.push((src, self.wire.irecv(s, mine, src, tag)?));
            }
            let sends = (self.destinations.iter().enumerate())
                .map(|(j, &dest)| self.wire.isend(s, block(j), dest, tag))
                .collect::<Result<Vec<_>>>()?;
            for (src, r) in recvs {
                let got = r.wait()?.len();
                if got != want {
                    return Err(Error::InvalidBuffer(format!(
                        "neighbour collective: {got} bytes from rank {src} where {want} were expected"
                    )));
                }
            }
            crate::wait_all(sends).map(|_| ())
        })
    }
}

/// The common block length of a send of `s` elements in `outs` blocks and a receive of `r`
/// in `ins` blocks; `None` when they are not whole blocks of one length. With no block on
/// either side, its buffer must be empty.
fn block_len(s: usize, outs: usize, r: usize, ins: usize) -> Option<usize> {
    let per = |len: usize, k: usize| -> Option<Option<usize>> {
        match k {
            0 => (len == 0).then_some(None),
            _ => (len % k == 0).then_some(Some(len / k)),
        }
    };
    match (per(s, outs)?, per(r, ins)?) {
        (Some(a), Some(b)) => (a == b).then_some(a),
        (Some(a), None) | (None, Some(a)) => Some(a),
        (None, None) => Some(0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::run_local;

    #[test]
    fn block_len_table() {
        // (send length, destinations, receive length, sources) and the block length.
        type Case = ((usize, usize, usize, usize), Option<usize>);
        let cases: [Case; 9] = [
            ((6, 3, 4, 2), Some(2)),
            ((6, 3, 0, 0), Some(2)),
            ((0, 0, 4, 2), Some(2)),
            ((0, 0, 0, 0), Some(0)),
            ((0, 2, 0, 1), Some(0)),
            ((6, 3, 6, 2), None),
            ((5, 3, 0, 0), None),
            ((1, 0, 2, 2), None),
            ((2, 1, 1, 0), None),
        ];
        for ((s, o, r, i), want) in cases {
            assert_eq!(block_len(s, o, r, i), want, "{s} in {o}, {r} in {i}");
        }
    }

    /// Rank 0 is a hub: it sends to every other rank and receives from each twice (an edge
    /// listed twice); the others send to 0 twice and receive from 0 once, and rank 1 also
    /// sends to the last rank, which receives from it.
    fn hub(r: Rank, n: usize) -> (Vec<Rank>, Vec<Rank>) {
        if r == 0 {
            let others: Vec<Rank> = (1..n).flat_map(|p| [p, p]).collect();
            return (others, (1..n).collect());
        }
        let mut dests = vec![0, 0];
        let mut srcs = vec![0];
        if r == 1 {
            dests.push(n - 1);
        }
        if r == n - 1 {
            srcs.push(1);
        }
        (srcs, dests)
    }

    #[test]
    fn neighbour_collectives_on_an_irregular_graph() {
        let n = 4;
        let got = run_local(n, |w| {
            let r = w.rank();
            let (srcs, dests) = hub(r, n);
            let g = w.dist_graph_create_adjacent(&srcs, &dests, true).unwrap();
            let mut from = vec![0u32; srcs.len()];
            g.neighbor_allgather(&[r as u32], &mut from).unwrap();
            // Block j of rank r's send: 100 * r + j.
            let send: Vec<u32> = (0..dests.len() as u32).map(|j| 100 * r as u32 + j).collect();
            let mut got = vec![0u32; srcs.len()];
            g.neighbor_alltoall(&send, &mut got).unwrap();
            (from, got)
        });
        // Rank 0 hears from 1, 1, 2, 2, 3, 3 (each sends its blocks 0 and 1 to it).
        assert_eq!(got[0], (vec![1, 1, 2, 2, 3, 3], vec![100, 101, 200, 201, 300, 301]));
        assert_eq!(got[1], (vec![0], vec![0]));
        assert_eq!(got[2], (vec![0], vec![1]));
        // Rank 3 hears from 0 (its block 2) and from 1 (its block 2).
        assert_eq!(got[3], (vec![0, 1], vec![2, 102]));
    }

    #[test]
    fn refusals() {
        let got = run_local(3, |w| {
            let r = w.rank();
            // Rank 2 names rank 7; then rank 0 sends to 1, which does not list it.
            let far = w.dist_graph_create_adjacent(&[], if r == 2 { &[7] } else { &[] }, false);
            let lopsided = w.dist_graph_create_adjacent(&[], if r == 0 { &[1] } else { &[] }, false);
            let ring = w.dist_graph_create_adjacent(&[(r + 2) % 3], &[(r + 1) % 3], false).unwrap();
            let short = ring.neighbor_allgather(&[1u8, 2], &mut [0u8; 1]);
            let uneven = ring.neighbor_alltoall(&[1u8, 2], &mut [0u8; 1]);
            // The world still works after all of them.
            let mut sum = [0usize];
            w.allreduce(&[1], &mut sum, Op::Sum).unwrap();
            [far, lopsided].iter().all(|e| matches!(e, Err(Error::InvalidTopology(_))))
                && [short, uneven].iter().all(|e| matches!(e, Err(Error::InvalidBuffer(_))))
                && sum[0] == 3
        });
        assert_eq!(got, vec![true; 3]);
    }
}
