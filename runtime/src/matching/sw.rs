//! The software matcher the runtime uses: O(1) for exact receives however deep the queues are.
//!
//! # Layout
//!
//! - **Buckets**, one per full match key, in a hash map ([`FoldHashMap`]). A bucket holds the
//!   *exact* receives posted for that key (`mask == FULL_MASK`) and the unexpected messages that
//!   arrived with that key, each in order. By the matcher's invariant (no stored message matches
//!   a queued receive) at most one of the two is non-empty at any time.
//! - **Wildcard receives** (any other mask) in one queue in post order.
//! - Every receive carries its post sequence number (= its [`RecvId`]), every unexpected message
//!   an arrival sequence number.
//! - **Arrival order**: one list of `(arrival seq, key)` over all unexpected messages, so a
//!   wildcard receive or probe finds the oldest matching message across buckets.
//! - **Exact index**: one list of `(post seq, key)` over the exact receives, so [`Matcher::cancel`]
//!   finds a receive's bucket from its id (binary search: the list is sorted by seq).
//!
//! # Operations
//!
//! - Arrival with key `k`: candidate A is the head of `k`'s bucket (the oldest exact receive for
//!   `k`), candidate B the first live wildcard receive that matches; the one with the smaller
//!   seq wins. The wildcard scan stops at A's seq, so when no wildcard receive is older than A it
//!   costs at most one step: exact matching does not depend on how many receives are queued.
//! - Exact post of `k`: the head of `k`'s bucket of unexpected messages is the oldest matching
//!   message (only messages with key `k` match), so that is one hash lookup.
//! - Wildcard post or probe: the first *live* entry of the arrival-order list that matches.
//!   Whatever message it names is the head of its bucket: any older message in that bucket has
//!   the same key, would match too and would have been found first.
//!
//! # Lazy deletion
//!
//! Removing from the middle of a `VecDeque` is O(n), so the three ordered lists delete lazily:
//! - wildcard receives become tombstones (`r: None`), popped when they reach either end;
//! - an arrival-order entry `(u, k)` is live iff `k`'s bucket exists and its first message has
//!   arrival seq `<= u`: messages only ever leave a bucket from the front (every take is of the
//!   oldest match, which is a bucket head), so nothing needs marking;
//! - an exact-index entry `(s, k)` is live iff `k`'s bucket still holds seq `s` (binary search).
//!
//! Each list is compacted in place (`retain`) when it holds more than twice its live count plus a
//! slack, and cleared when nothing in it is live, so compaction costs O(1) amortised per removal
//! and memory stays proportional to what is queued.
//!
//! # No allocation in steady state
//!
//! Buckets are not removed when they empty, so a key used again finds its bucket and its
//! `VecDeque`s with their capacity. Empty buckets are swept (in one pass, `#[cold]`) only once
//! there are more of them than `max(1024, non-empty buckets)`, which bounds memory by the number
//! of keys in flight and keeps sweeping O(1) amortised; up to 64 swept buckets are kept as spares
//! for new keys. The ordered lists are compacted in place and keep their capacity.

use std::collections::hash_map::Entry;
use std::collections::VecDeque;
use std::fmt;

use super::hash::FoldHashMap;
use super::{keys_overlap, Arrived, Matcher, Posted, RecvId, FULL_MASK};

/// Size knobs of the lazy structures (fixed in production, tiny in tests to exercise them).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Tuning {
    /// Empty buckets are swept once they exceed `max(empty_floor, non-empty buckets)`.
    pub(crate) empty_floor: usize,
    /// A lazily deleted list is compacted once `len > 2 * live + list_slack`.
    pub(crate) list_slack: usize,
    /// Most swept buckets kept for reuse.
    pub(crate) spare_max: usize,
    /// A spare bucket's queues are shrunk to this capacity.
    pub(crate) spare_capacity: usize,
}

impl Tuning {
    const DEFAULT: Tuning = Tuning { empty_floor: 1024, list_slack: 64, spare_max: 64, spare_capacity: 16 };
}

/// Entries examined by linear scans; counted only in tests, to check what is O(1).
#[cfg(test)]
struct Steps(std::sync::atomic::AtomicU64);

#[cfg(test)]
impl Steps {
    fn new() -> Self {
        Steps(std::sync::atomic::AtomicU64::new(0))
    }

    #[inline]
    fn bump(&self) {
        self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
}

#[cfg(not(test))]
struct Steps;

#[cfg(not(test))]
impl Steps {
    fn new() -> Self {
        Steps
    }

    #[inline(always)]
    fn bump(&self) {}
}

/// The receives and messages of one full match key.
struct Bucket<R, M> {
    /// Exact receives for this key: `(post seq, handle)`, oldest first, seqs increasing.
    posted: VecDeque<(RecvId, R)>,
    /// Unexpected messages with this key: `(arrival seq, handle)`, oldest first, seqs increasing.
    ux: VecDeque<(u64, M)>,
}

impl<R, M> Default for Bucket<R, M> {
    fn default() -> Self {
        Bucket { posted: VecDeque::new(), ux: VecDeque::new() }
    }
}

impl<R, M> Bucket<R, M> {
    #[inline]
    fn is_empty(&self) -> bool {
        self.posted.is_empty() && self.ux.is_empty()
    }
}

/// A queued wildcard receive; `r` is `None` once it matched or was cancelled (a tombstone).
struct Wild<R> {
    seq: RecvId,
    /// The receive's tag with the bits outside `mask` cleared.
    tag: u64,
    mask: u64,
    r: Option<R>,
}

/// The fast software tag matcher.
///
/// Exact receives (`mask == FULL_MASK`) and unexpected messages live in per-key hash buckets,
/// wildcard receives in one post-ordered queue, and one arrival-ordered list spans all
/// unexpected messages. An arrival compares its bucket's oldest receive with the first matching
/// wildcard receive and takes the earlier post; an exact post takes its bucket's oldest message.
/// Both are O(1) whatever else is queued; wildcard posts and probes scan the unexpected list.
/// Lists delete lazily and compact in place, empty buckets are kept for reuse (bounded), so the
/// exact path does not allocate in steady state. The design notes are in `sw.rs`.
pub struct SwMatcher<R, M> {
    /// Buckets by full match key. Invariant: in each, `posted` or `ux` is empty.
    buckets: FoldHashMap<u64, Bucket<R, M>>,
    /// How many buckets in `buckets` are empty.
    empty_buckets: usize,
    /// Swept buckets kept for reuse, at most `tuning.spare_max`, all empty.
    spare: Vec<Bucket<R, M>>,
    /// Wildcard receives in post order (seqs increasing), with tombstones.
    wild: VecDeque<Wild<R>>,
    /// Non-tombstone entries of `wild`.
    wild_live: usize,
    /// `(post seq, key)` of exact receives in post order, lazily deleted.
    exact_index: VecDeque<(RecvId, u64)>,
    /// Exact receives queued (sum of the buckets' `posted` lengths).
    exact_live: usize,
    /// `(arrival seq, key)` of unexpected messages in arrival order, lazily deleted.
    ux_order: VecDeque<(u64, u64)>,
    /// Unexpected messages stored (sum of the buckets' `ux` lengths).
    ux_live: usize,
    /// Seq of the next post (= the next `RecvId`).
    next_seq: RecvId,
    /// Arrival seq of the next unexpected message.
    next_useq: u64,
    tuning: Tuning,
    steps: Steps,
}

impl<R, M> Default for SwMatcher<R, M> {
    fn default() -> Self {
        Self::with_tuning(Tuning::DEFAULT)
    }
}

impl<R, M> fmt::Debug for SwMatcher<R, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SwMatcher")
            .field("exact_posted", &self.exact_live)
            .field("wild_posted", &self.wild_live)
            .field("unexpected", &self.ux_live)
            .field("buckets", &self.buckets.len())
            .field("next_id", &self.next_seq)
            .finish()
    }
}

/// Takes the first live wildcard receive with seq `< before` that matches `tag`.
#[inline]
fn take_wild_match<R>(wild: &mut VecDeque<Wild<R>>, tag: u64, before: RecvId, steps: &Steps) -> Option<(RecvId, R)> {
    for w in wild.iter_mut() {
        steps.bump();
        if w.seq >= before {
            return None;
        }
        if tag & w.mask == w.tag {
            if let Some(r) = w.r.take() {
                return Some((w.seq, r));
            }
        }
    }
    None
}

/// Whether the unexpected message `(useq, key)` is still stored (see "Lazy deletion").
#[inline]
fn ux_live<R, M>(buckets: &FoldHashMap<u64, Bucket<R, M>>, useq: u64, key: u64) -> bool {
    buckets.get(&key).and_then(|b| b.ux.front()).is_some_and(|&(first, _)| first <= useq)
}

/// Whether the exact receive `(seq, key)` is still queued.
#[inline]
fn exact_live<R, M>(buckets: &FoldHashMap<u64, Bucket<R, M>>, seq: RecvId, key: u64) -> bool {
    buckets.get(&key).is_some_and(|b| b.posted.binary_search_by_key(&seq, |p| p.0).is_ok())
}

impl<R, M> SwMatcher<R, M> {
    /// An empty matcher.
    pub fn new() -> Self {
        Self::default()
    }

    pub(crate) fn with_tuning(tuning: Tuning) -> Self {
        SwMatcher {
            buckets: FoldHashMap::default(),
            empty_buckets: 0,
            spare: Vec::new(),
            wild: VecDeque::new(),
            wild_live: 0,
            exact_index: VecDeque::new(),
            exact_live: 0,
            ux_order: VecDeque::new(),
            ux_live: 0,
            next_seq: 0,
            next_useq: 0,
            tuning,
            steps: Steps::new(),
        }
    }

    /// A new bucket, from the spares if there is one.
    #[inline]
    fn fresh_bucket(spare: &mut Vec<Bucket<R, M>>) -> Bucket<R, M> {
        spare.pop().unwrap_or_default()
    }

    /// Bookkeeping after a bucket became empty: sweep empty buckets once there are too many.
    #[inline]
    fn bucket_emptied(&mut self) {
        self.empty_buckets += 1;
        let busy = self.buckets.len() - self.empty_buckets;
        if self.empty_buckets > self.tuning.empty_floor.max(busy) {
            self.sweep_empty_buckets();
        }
    }

    #[cold]
    fn sweep_empty_buckets(&mut self) {
        let spare = &mut self.spare;
        let t = self.tuning;
        self.buckets.retain(|_, b| {
            if !b.is_empty() {
                return true;
            }
            if spare.len() < t.spare_max {
                let mut b = std::mem::take(b);
                b.posted.shrink_to(t.spare_capacity);
                b.ux.shrink_to(t.spare_capacity);
                spare.push(b);
            }
            false
        });
        self.empty_buckets = 0;
    }

    /// After a wildcard receive left `wild`: drop tombstones at the ends, compact if needed.
    #[inline]
    fn tidy_wild(&mut self) {
        if self.wild_live == 0 {
            self.wild.clear();
            return;
        }
        while self.wild.front().is_some_and(|w| w.r.is_none()) {
            self.wild.pop_front();
        }
        while self.wild.back().is_some_and(|w| w.r.is_none()) {
            self.wild.pop_back();
        }
        if self.wild.len() > 2 * self.wild_live + self.tuning.list_slack {
            self.compact_wild();
        }
    }

    #[cold]
    fn compact_wild(&mut self) {
        self.wild.retain(|w| w.r.is_some());
    }

    /// After the exact receive `removed` left its bucket: drop its index entry if it is at
    /// either end (the FIFO and LIFO patterns then never compact), clear or compact if needed.
    #[inline]
    fn tidy_exact_index(&mut self, removed: RecvId) {
        if self.exact_index.front().is_some_and(|e| e.0 == removed) {
            self.exact_index.pop_front();
        } else if self.exact_index.back().is_some_and(|e| e.0 == removed) {
            self.exact_index.pop_back();
        }
        if self.exact_live == 0 {
            self.exact_index.clear();
        } else if self.exact_index.len() > 2 * self.exact_live + self.tuning.list_slack {
            self.compact_exact_index();
        }
    }

    #[cold]
    fn compact_exact_index(&mut self) {
        let buckets = &self.buckets;
        self.exact_index.retain(|&(seq, key)| exact_live(buckets, seq, key));
    }

    /// After the unexpected message `removed` (arrival seq) left its bucket: drop its entry if
    /// it is at either end, clear or compact the arrival list if needed.
    #[inline]
    fn tidy_ux_order(&mut self, removed: u64) {
        if self.ux_order.front().is_some_and(|e| e.0 == removed) {
            self.ux_order.pop_front();
        } else if self.ux_order.back().is_some_and(|e| e.0 == removed) {
            self.ux_order.pop_back();
        }
        if self.ux_live == 0 {
            self.ux_order.clear();
        } else if self.ux_order.len() > 2 * self.ux_live + self.tuning.list_slack {
            self.compact_ux_order();
        }
    }

    #[cold]
    fn compact_ux_order(&mut self) {
        let buckets = &self.buckets;
        self.ux_order.retain(|&(useq, key)| ux_live(buckets, useq, key));
    }

    /// The key of the bucket whose first unexpected message is the oldest one matching
    /// `(tag, mask)`.
    fn find_unexpected(&self, tag: u64, mask: u64) -> Option<u64> {
        if self.ux_live == 0 {
            return None;
        }
        if mask == FULL_MASK {
            return self.buckets.get(&tag).is_some_and(|b| !b.ux.is_empty()).then_some(tag);
        }
        let want = tag & mask;
        for &(useq, key) in &self.ux_order {
            self.steps.bump();
            if key & mask == want && ux_live(&self.buckets, useq, key) {
                return Some(key);
            }
        }
        None
    }

    /// Removes the oldest unexpected message matching `(tag, mask)`.
    fn take_unexpected(&mut self, tag: u64, mask: u64) -> Option<(u64, M)> {
        let key = self.find_unexpected(tag, mask)?;
        let b = self.buckets.get_mut(&key)?;
        let (useq, m) = b.ux.pop_front()?;
        let emptied = b.is_empty();
        self.ux_live -= 1;
        if emptied {
            self.bucket_emptied();
        }
        self.tidy_ux_order(useq);
        Some((key, m))
    }

    /// Post of a receive with `mask == FULL_MASK`: one hash lookup.
    fn post_exact(&mut self, tag: u64, seq: RecvId, r: R) -> Posted<R, M> {
        match self.buckets.entry(tag) {
            Entry::Occupied(mut e) => {
                let b = e.get_mut();
                if let Some((useq, m)) = b.ux.pop_front() {
                    let emptied = b.is_empty();
                    self.ux_live -= 1;
                    if emptied {
                        self.bucket_emptied();
                    }
                    self.tidy_ux_order(useq);
                    return Posted::Matched(r, m);
                }
                if b.posted.is_empty() {
                    // `ux` is empty too: the bucket stops being an empty one.
                    self.empty_buckets -= 1;
                }
                b.posted.push_back((seq, r));
            }
            Entry::Vacant(e) => {
                let mut b = Self::fresh_bucket(&mut self.spare);
                b.posted.push_back((seq, r));
                e.insert(b);
            }
        }
        self.exact_index.push_back((seq, tag));
        self.exact_live += 1;
        Posted::Queued(seq)
    }

    /// Stores `m` as unexpected in a new bucket for `tag` (there is none).
    fn store_unexpected_new(&mut self, tag: u64, m: M) {
        let useq = self.next_useq;
        self.next_useq += 1;
        let mut b = Self::fresh_bucket(&mut self.spare);
        b.ux.push_back((useq, m));
        self.buckets.insert(tag, b);
        self.ux_order.push_back((useq, tag));
        self.ux_live += 1;
    }

    /// Entries examined by linear scans since the last call (tests only).
    #[cfg(test)]
    pub(crate) fn take_steps(&self) -> u64 {
        self.steps.0.swap(0, std::sync::atomic::Ordering::Relaxed)
    }

    /// Capacities of every internal structure, to check that steady state does not allocate
    /// (tests only).
    #[cfg(test)]
    pub(crate) fn footprint(&self) -> Vec<usize> {
        let mut v = vec![
            self.buckets.len(),
            self.buckets.capacity(),
            self.spare.len(),
            self.wild.capacity(),
            self.exact_index.capacity(),
            self.ux_order.capacity(),
        ];
        let mut per_bucket: Vec<(u64, usize, usize)> =
            self.buckets.iter().map(|(&k, b)| (k, b.posted.capacity(), b.ux.capacity())).collect();
        per_bucket.sort_unstable();
        v.extend(per_bucket.into_iter().flat_map(|(k, p, u)| [k as usize, p, u]));
        v
    }

    /// Checks every structural invariant; panics with a message if one fails (tests only).
    #[cfg(test)]
    pub(crate) fn check_invariants(&self) {
        let mut exact = 0;
        let mut ux = 0;
        let mut empty = 0;
        for (&k, b) in &self.buckets {
            assert!(b.posted.is_empty() || b.ux.is_empty(), "bucket {k:#x} has receives and messages");
            assert!(b.posted.iter().zip(b.posted.iter().skip(1)).all(|(a, c)| a.0 < c.0));
            assert!(b.ux.iter().zip(b.ux.iter().skip(1)).all(|(a, c)| a.0 < c.0));
            exact += b.posted.len();
            ux += b.ux.len();
            empty += usize::from(b.is_empty());
            for &(seq, _) in &b.posted {
                assert!(self.exact_index.binary_search_by_key(&seq, |e| e.0).is_ok(), "seq {seq} not indexed");
            }
            for &(useq, _) in &b.ux {
                let i = self.ux_order.binary_search_by_key(&useq, |e| e.0);
                assert!(i.is_ok_and(|i| self.ux_order[i].1 == k), "useq {useq} not ordered");
            }
        }
        assert_eq!(exact, self.exact_live);
        assert_eq!(ux, self.ux_live);
        assert_eq!(empty, self.empty_buckets);
        assert_eq!(self.wild.iter().filter(|w| w.r.is_some()).count(), self.wild_live);
        assert!(self.wild.iter().zip(self.wild.iter().skip(1)).all(|(a, c)| a.seq < c.seq));
        assert!(self.exact_index.iter().zip(self.exact_index.iter().skip(1)).all(|(a, c)| a.0 < c.0));
        assert!(self.ux_order.iter().zip(self.ux_order.iter().skip(1)).all(|(a, c)| a.0 < c.0));
        assert!(self.wild.len() <= 2 * self.wild_live + self.tuning.list_slack + 1);
        assert!(self.exact_index.len() <= 2 * self.exact_live + self.tuning.list_slack + 1);
        assert!(self.ux_order.len() <= 2 * self.ux_live + self.tuning.list_slack + 1);
        assert!(self.spare.len() <= self.tuning.spare_max && self.spare.iter().all(Bucket::is_empty));
    }
}

impl<R, M> Matcher<R, M> for SwMatcher<R, M> {
    fn post(&mut self, tag: u64, mask: u64, r: R) -> Posted<R, M> {
        let seq = self.next_seq;
        self.next_seq += 1;
        if mask == FULL_MASK {
            return self.post_exact(tag, seq, r);
        }
        if let Some((_, m)) = self.take_unexpected(tag, mask) {
            return Posted::Matched(r, m);
        }
        self.wild.push_back(Wild { seq, tag: tag & mask, mask, r: Some(r) });
        self.wild_live += 1;
        Posted::Queued(seq)
    }

    fn arrive(&mut self, tag: u64, m: M) -> Arrived<R, M> {
        if let Some(b) = self.buckets.get_mut(&tag) {
            let exact_seq = b.posted.front().map(|p| p.0);
            if self.wild_live > 0 {
                let before = exact_seq.unwrap_or(RecvId::MAX);
                if let Some((seq, r)) = take_wild_match(&mut self.wild, tag, before, &self.steps) {
                    self.wild_live -= 1;
                    self.tidy_wild();
                    return Arrived::Matched(seq, r, m);
                }
            }
            if let Some((seq, r)) = b.posted.pop_front() {
                let emptied = b.is_empty();
                self.exact_live -= 1;
                if emptied {
                    self.bucket_emptied();
                }
                self.tidy_exact_index(seq);
                return Arrived::Matched(seq, r, m);
            }
            // Unexpected, and the bucket is at hand: store without a second lookup.
            let useq = self.next_useq;
            self.next_useq += 1;
            if b.is_empty() {
                self.empty_buckets -= 1;
            }
            b.ux.push_back((useq, m));
            self.ux_order.push_back((useq, tag));
            self.ux_live += 1;
            return Arrived::Unexpected;
        } else if self.wild_live > 0 {
            if let Some((seq, r)) = take_wild_match(&mut self.wild, tag, RecvId::MAX, &self.steps) {
                self.wild_live -= 1;
                self.tidy_wild();
                return Arrived::Matched(seq, r, m);
            }
        }
        self.store_unexpected_new(tag, m);
        Arrived::Unexpected
    }

    fn cancel(&mut self, id: RecvId) -> Option<R> {
        if id >= self.next_seq {
            return None;
        }
        if let Ok(i) = self.wild.binary_search_by_key(&id, |w| w.seq) {
            let r = self.wild.get_mut(i)?.r.take()?;
            self.wild_live -= 1;
            self.tidy_wild();
            return Some(r);
        }
        let i = self.exact_index.binary_search_by_key(&id, |e| e.0).ok()?;
        let &(_, key) = self.exact_index.get(i)?;
        let b = self.buckets.get_mut(&key)?;
        let j = b.posted.binary_search_by_key(&id, |p| p.0).ok()?;
        let (_, r) = b.posted.remove(j)?;
        let emptied = b.is_empty();
        self.exact_live -= 1;
        if emptied {
            self.bucket_emptied();
        }
        self.tidy_exact_index(id);
        Some(r)
    }

    fn probe(&self, tag: u64, mask: u64) -> Option<(u64, &M)> {
        let key = self.find_unexpected(tag, mask)?;
        let (_, m) = self.buckets.get(&key)?.ux.front()?;
        Some((key, m))
    }

    fn probe_mut(&mut self, tag: u64, mask: u64) -> Option<(u64, &mut M)> {
        let key = self.find_unexpected(tag, mask)?;
        let (_, m) = self.buckets.get_mut(&key)?.ux.front_mut()?;
        Some((key, m))
    }

    fn take_probed(&mut self, tag: u64, mask: u64) -> Option<(u64, M)> {
        self.take_unexpected(tag, mask)
    }

    fn posted_len(&self) -> usize {
        self.exact_live + self.wild_live
    }

    fn unexpected_len(&self) -> usize {
        self.ux_live
    }

    fn has_posted_match(&self, tag: u64) -> bool {
        self.buckets.get(&tag).is_some_and(|b| !b.posted.is_empty()) || self.wild.iter().any(|w| w.r.is_some() && tag & w.mask == w.tag)
    }

    /// Cost: O(wildcard receives) for an exact `(tag, mask)`; a wildcard one also scans the
    /// buckets (O(distinct keys queued or recently used)).
    fn earlier_posted_overlaps(&self, tag: u64, mask: u64) -> bool {
        if self.wild.iter().any(|w| w.r.is_some() && keys_overlap(w.tag, w.mask, tag, mask)) {
            return true;
        }
        if self.exact_live == 0 {
            return false;
        }
        if mask == FULL_MASK {
            return self.buckets.get(&tag).is_some_and(|b| !b.posted.is_empty());
        }
        self.buckets.iter().any(|(&k, b)| !b.posted.is_empty() && (k ^ tag) & mask == 0)
    }
}
