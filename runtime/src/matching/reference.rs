//! The reference matcher: two lists and linear scans, MPI's rules written down literally.
//!
//! It is the model that [`super::SwMatcher`] is tested against; it is also a fine matcher when
//! the queues are short. Every operation is O(queue length).

use super::{keys_overlap, Arrived, Matcher, Posted, RecvId};

/// A queued receive of the reference matcher.
#[derive(Debug)]
struct RefRecv<R> {
    id: RecvId,
    tag: u64,
    mask: u64,
    r: R,
}

/// A tag matcher with linear scans over a posted list and an unexpected list.
///
/// - `posted` is in post order; an arrival takes the first entry that matches.
/// - `unexpected` is in arrival order; a post or probe takes the first entry that matches.
#[derive(Debug)]
pub struct RefMatcher<R, M> {
    posted: Vec<RefRecv<R>>,
    unexpected: Vec<(u64, M)>,
    /// Sequence number of the next post.
    next_seq: u64,
}

impl<R, M> Default for RefMatcher<R, M> {
    fn default() -> Self {
        RefMatcher { posted: Vec::new(), unexpected: Vec::new(), next_seq: 0 }
    }
}

impl<R, M> RefMatcher<R, M> {
    /// An empty matcher.
    pub fn new() -> Self {
        Self::default()
    }

    fn first_unexpected(&self, tag: u64, mask: u64) -> Option<usize> {
        self.unexpected.iter().position(|(t, _)| t & mask == tag & mask)
    }
}

impl<R, M> Matcher<R, M> for RefMatcher<R, M> {
    fn post(&mut self, tag: u64, mask: u64, r: R) -> Posted<R, M> {
        let id = RecvId::of_mask(self.next_seq, mask);
        self.next_seq += 1;
        match self.first_unexpected(tag, mask) {
            Some(i) => {
                let (_, m) = self.unexpected.remove(i);
                Posted::Matched(r, m)
            }
            None => {
                self.posted.push(RefRecv { id, tag, mask, r });
                Posted::Queued(id)
            }
        }
    }

    fn arrive(&mut self, tag: u64, m: M) -> Arrived<R, M> {
        match self.posted.iter().position(|p| tag & p.mask == p.tag & p.mask) {
            Some(i) => {
                let p = self.posted.remove(i);
                Arrived::Matched(p.id, p.r, m)
            }
            None => {
                self.unexpected.push((tag, m));
                Arrived::Unexpected
            }
        }
    }

    fn cancel(&mut self, id: RecvId, tag: u64) -> Option<R> {
        let i = self.posted.iter().position(|p| p.id == id && (p.tag ^ tag) & p.mask == 0)?;
        Some(self.posted.remove(i).r)
    }

    fn probe(&self, tag: u64, mask: u64) -> Option<(u64, &M)> {
        let i = self.first_unexpected(tag, mask)?;
        self.unexpected.get(i).map(|(t, m)| (*t, m))
    }

    fn probe_mut(&mut self, tag: u64, mask: u64) -> Option<(u64, &mut M)> {
        let i = self.first_unexpected(tag, mask)?;
        self.unexpected.get_mut(i).map(|(t, m)| (*t, m))
    }

    fn take_probed(&mut self, tag: u64, mask: u64) -> Option<(u64, M)> {
        let i = self.first_unexpected(tag, mask)?;
        Some(self.unexpected.remove(i))
    }

    fn posted_len(&self) -> usize {
        self.posted.len()
    }

    fn unexpected_len(&self) -> usize {
        self.unexpected.len()
    }

    fn has_posted_match(&self, tag: u64) -> bool {
        self.posted.iter().any(|p| tag & p.mask == p.tag & p.mask)
    }

    fn earlier_posted_overlaps(&self, tag: u64, mask: u64) -> bool {
        self.posted.iter().any(|p| keys_overlap(p.tag, p.mask, tag, mask))
    }
}
