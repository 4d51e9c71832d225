//! The software matcher the runtime uses: O(1) for every MPI receive form however deep the
//! queues are.
//!
//! # Layout
//!
//! - **Buckets**, one per full match key, in a hash map ([`FoldHashMap`]). A bucket holds the
//!   *exact* receives posted for that key (`mask == FULL_MASK`) and the unexpected messages that
//!   arrived with that key, each in order. By the matcher's invariant (no stored message matches
//!   a queued receive) at most one of the two is non-empty at any time.
//! - **Wildcard classes**: MPI has three wildcard forms, each a fixed mask ([`CLASS_MASKS`]):
//!   `ANY_SOURCE` with a tag (context and tag bits), a source with `ANY_TAG` (context and source
//!   bits), and `ANY_SOURCE` with `ANY_TAG` (context bits). Each class has its own hash map from
//!   the masked key (`(ctx, tag)`, `(ctx, src)`, `ctx`) to a queue of receives in post order.
//!   Every receive in the queue a message's key selects matches that message, and no other
//!   receive of the class does, so the queue's head is the class's candidate: one lookup.
//! - **Raw receives**: any other mask (not an MPI receive; the runtime never posts one) in one
//!   queue in post order, scanned.
//! - Every receive carries its [`RecvId`] (its post sequence number and its form: exact, a
//!   wildcard class, or raw), every unexpected message an arrival sequence number.
//! - **Arrival order**: one list of `(arrival seq, key)` over all unexpected messages, so a raw
//!   receive finds the oldest matching message across buckets.
//! - **Unexpected class indexes**: for each wildcard class that has been used (a receive or
//!   probe of that form), a hash map from the masked key to the `(arrival seq, key)` of the
//!   unexpected messages with that masked key, in arrival order. A program that never uses a
//!   wildcard form does not pay for its index; the first use builds it from the arrival-order
//!   list (once, O(unexpected messages)).
//!
//! There is no index from ids to queues: [`Matcher::cancel`] is given the receive's tag, and the
//! form in the id says which map to look it up in (the bucket of the tag, or the class's queue at
//! the masked tag). Keeping such an index cost a push at every post and a pop at every match.
//!
//! # Operations
//!
//! - Arrival with key `k`: the candidates are the head of `k`'s bucket and the head of the queue
//!   at `k & mask` in each wildcard class that holds receives: at most four lookups. The one with
//!   the smallest seq is the earliest posted matching receive. Raw receives, if any, are scanned
//!   only up to that seq. Receives that cannot match `k` are never looked at.
//! - Exact post of `k`: the head of `k`'s bucket of unexpected messages is the oldest matching
//!   message (only messages with key `k` match), so that is one hash lookup.
//! - Cancel: one lookup of the receive's queue, whose front is checked first (receives mostly
//!   leave in post order: the TM-SRQ completes them so), then a binary search by id; a raw
//!   receive is found in the raw queue the same way and becomes a tombstone.
//! - Wildcard post or probe of class `c`: the first *live* entry of `c`'s unexpected index at the
//!   masked key; only messages that match are in that queue. A raw post or probe scans the
//!   arrival-order list. Either way, the message an entry names is the head of its bucket: any
//!   older message in that bucket has the same key, would match too and would come first.
//!
//! # Lazy deletion
//!
//! Removing from the middle of a `VecDeque` is O(n), so the ordered lists that span keys delete
//! lazily (a receive cancelled from the middle of its own key's queue is removed there at once:
//! those queues are short in practice):
//! - raw receives become tombstones (`r: None`), popped when they reach either end;
//! - an unexpected entry `(u, k)` (arrival-order list or class index) is live iff `k`'s bucket
//!   exists and its first message has arrival seq `<= u`: messages only ever leave a bucket from
//!   the front (every take is of the oldest match, which is a bucket head), so nothing needs
//!   marking. A message's entries are popped at once when they are at either end of their queue
//!   (always, when messages are taken in arrival order), later when they reach the front.
//!
//! Each list is compacted in place (`retain`) when it holds more than twice its live count plus a
//! slack, and cleared when nothing in it is live, so compaction costs O(1) amortised per removal
//! and memory stays proportional to what is queued.
//!
//! # No allocation in steady state
//!
//! Buckets and class queues are not removed when they empty, so a key used again finds its
//! queues with their capacity. Empty ones are swept (in one pass, `#[cold]`) only once there are
//! more of them than `max(64, non-empty ones)`, which bounds memory by the number of keys in
//! flight and keeps sweeping O(1) amortised; up to 128 swept buckets are kept as spares for new
//! keys, so that every swept bucket can serve a new key: collectives put their call's sequence
//! number in their tags, so each call uses new keys, and would otherwise allocate a bucket per
//! call (and keep the map large and cold). The ordered lists are compacted in place and keep their capacity.

use std::collections::hash_map::Entry;
use std::collections::VecDeque;
use std::fmt;
use std::sync::atomic::{AtomicU8, Ordering};

use super::hash::FoldHashMap;
use super::{class_of, keys_overlap, Arrived, Matcher, Posted, RecvId, CLASSES, CLASS_MASKS, FORM_EXACT, FORM_RAW, FULL_MASK};

/// Size knobs of the lazy structures (fixed in production, tiny in tests to exercise them).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Tuning {
    /// Empty buckets (or class queues) are swept once they exceed `max(empty_floor, non-empty)`.
    pub(crate) empty_floor: usize,
    /// A lazily deleted list is compacted once `len > 2 * live + list_slack`.
    pub(crate) list_slack: usize,
    /// Most swept buckets kept for reuse.
    pub(crate) spare_max: usize,
    /// A spare bucket's queues are shrunk to this capacity.
    pub(crate) spare_capacity: usize,
}

impl Tuning {
    const DEFAULT: Tuning = Tuning { empty_floor: 64, list_slack: 64, spare_max: 128, spare_capacity: 16 };
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
    /// Exact receives for this key: `(id, handle)`, oldest first, ids increasing.
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

/// Queues by masked key: the receives of one wildcard class, or its unexpected index. Queues are
/// kept when they empty (reuse without allocation) and swept once empty ones dominate.
struct Queues<T> {
    map: FoldHashMap<u64, VecDeque<(u64, T)>>,
    /// Queues in `map` that are empty.
    empty: usize,
    /// Entries over all queues (for an unexpected index, stale ones included).
    len: usize,
}

impl<T> Default for Queues<T> {
    fn default() -> Self {
        Queues { map: FoldHashMap::default(), empty: 0, len: 0 }
    }
}

impl<T> Queues<T> {
    /// Appends `(seq, v)` to the queue at `key` (seqs increase along every queue).
    #[inline]
    fn push(&mut self, key: u64, seq: u64, v: T) {
        match self.map.entry(key) {
            Entry::Occupied(e) => {
                let q = e.into_mut();
                if q.is_empty() {
                    self.empty -= 1;
                }
                q.push_back((seq, v));
            }
            Entry::Vacant(e) => {
                let mut q = VecDeque::new();
                q.push_back((seq, v));
                e.insert(q);
            }
        }
        self.len += 1;
    }

    /// Seq of the head of the queue at `key`.
    #[inline]
    fn head(&self, key: u64) -> Option<u64> {
        self.map.get(&key).and_then(VecDeque::front).map(|e| e.0)
    }

    /// Bookkeeping after `n` entries left the queue at some key, which is now empty if
    /// `emptied`: sweep empty queues once there are too many.
    #[inline]
    fn removed(&mut self, n: usize, emptied: bool, floor: usize) {
        self.len -= n;
        if emptied {
            self.empty += 1;
            let busy = self.map.len() - self.empty;
            if self.empty > floor.max(busy) {
                self.sweep();
            }
        }
    }

    #[cold]
    fn sweep(&mut self) {
        self.map.retain(|_, q| !q.is_empty());
        self.empty = 0;
    }

    /// Removes the entry with seq `seq` from the queue at `key` (binary search).
    fn remove(&mut self, key: u64, seq: u64, floor: usize) -> Option<T> {
        let q = self.map.get_mut(&key)?;
        let j = seq_position(q, seq, |e| e.0)?;
        let (_, v) = q.remove(j)?;
        let emptied = q.is_empty();
        self.removed(1, emptied, floor);
        Some(v)
    }
}

/// Where the entry with seq `seq` sits in `q` (seqs increasing): the front is checked first,
/// since receives mostly leave in the order they were posted (the TM-SRQ completes them so),
/// then a binary search.
#[inline]
fn seq_position<T>(q: &VecDeque<T>, seq: u64, seq_of: impl Fn(&T) -> u64) -> Option<usize> {
    match q.front() {
        Some(e) if seq_of(e) == seq => Some(0),
        _ => q.binary_search_by_key(&seq, seq_of).ok(),
    }
}

/// A queued raw receive; `r` is `None` once it matched or was cancelled (a tombstone).
struct Raw<R> {
    id: RecvId,
    /// The receive's tag with the bits outside `mask` cleared.
    tag: u64,
    mask: u64,
    r: Option<R>,
}

/// The fast software tag matcher.
///
/// Exact receives (`mask == FULL_MASK`) and unexpected messages live in per-key hash buckets,
/// each of MPI's three wildcard forms in its own hash map keyed by the bits it matches on, any
/// other mask in one scanned queue; one arrival-ordered list spans all unexpected messages, and
/// per wildcard form an index of them by the same masked key. An arrival compares the oldest
/// receive of its bucket with the oldest of each wildcard form's queue for its key and takes the
/// earliest post; a post takes the oldest message of its bucket or index queue. All of it is
/// O(1) whatever else is queued. Lists delete lazily and compact in place, empty queues are kept
/// for reuse (bounded), so the common paths do not allocate in steady state. The design notes
/// are in `sw.rs`.
pub struct SwMatcher<R, M> {
    /// Buckets by full match key. Invariant: in each, `posted` or `ux` is empty.
    buckets: FoldHashMap<u64, Bucket<R, M>>,
    /// How many buckets in `buckets` are empty.
    empty_buckets: usize,
    /// Swept buckets kept for reuse, at most `tuning.spare_max`, all empty.
    spare: Vec<Bucket<R, M>>,
    /// Wildcard receives by class, keyed by `tag & CLASS_MASKS[c]`, each queue in post order:
    /// `(id, handle)`, the id as its `u64`.
    wild: [Queues<R>; CLASSES],
    /// Receives queued in `wild` (sum of the classes' `len`).
    wild_live: usize,
    /// Receives with any other mask in post order (ids increasing), with tombstones.
    raw: VecDeque<Raw<R>>,
    /// Non-tombstone entries of `raw`.
    raw_live: usize,
    /// Exact receives queued (sum of the buckets' `posted` lengths).
    exact_live: usize,
    /// `(arrival seq, key)` of unexpected messages in arrival order, lazily deleted.
    ux_order: VecDeque<(u64, u64)>,
    /// Per wildcard class, once enabled: `(arrival seq, key)` of the unexpected messages by
    /// `key & CLASS_MASKS[c]`, each queue in arrival order, lazily deleted.
    ux_index: [Queues<u64>; CLASSES],
    /// Which entries of `ux_index` are maintained.
    ux_indexed: [bool; CLASSES],
    /// Classes a probe (which cannot build an index: it takes `&self`) asked for; the next
    /// mutating call builds them. A bit per class.
    ux_wanted: AtomicU8,
    /// Unexpected messages stored (sum of the buckets' `ux` lengths).
    ux_live: usize,
    /// Sequence number of the next post (of the next `RecvId`).
    next_seq: u64,
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
            .field("raw_posted", &self.raw_live)
            .field("unexpected", &self.ux_live)
            .field("buckets", &self.buckets.len())
            .field("next_id", &self.next_seq)
            .finish()
    }
}

/// Takes the first live raw receive posted before the receive with id bits `before` that
/// matches `tag`.
#[inline]
fn take_raw_match<R>(raw: &mut VecDeque<Raw<R>>, tag: u64, before: u64, steps: &Steps) -> Option<(RecvId, R)> {
    for w in raw.iter_mut() {
        steps.bump();
        if w.id.0 >= before {
            return None;
        }
        if tag & w.mask == w.tag {
            if let Some(r) = w.r.take() {
                return Some((w.id, r));
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
            wild: Default::default(),
            wild_live: 0,
            raw: VecDeque::new(),
            raw_live: 0,
            exact_live: 0,
            ux_order: VecDeque::new(),
            ux_index: Default::default(),
            ux_indexed: [false; CLASSES],
            ux_wanted: AtomicU8::new(0),
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

    /// The earliest posted wildcard candidate for `tag`, as its sequence number (`u64::MAX`:
    /// none) and class: the head of each class's queue for `tag`. Ids are compared as their
    /// `u64` (the same order).
    #[inline(always)]
    fn wild_candidate(&self, tag: u64) -> (u64, Option<usize>) {
        let mut wild_seq = u64::MAX;
        let mut class = None;
        if self.wild_live > 0 {
            for (c, q) in self.wild.iter().enumerate() {
                if q.len > 0 {
                    if let Some(s) = q.head(tag & CLASS_MASKS[c]) {
                        if s < wild_seq {
                            wild_seq = s;
                            class = Some(c);
                        }
                    }
                }
            }
        }
        (wild_seq, class)
    }

    /// After a raw receive left `raw`: drop tombstones at the ends, compact if needed.
    #[inline]
    fn tidy_raw(&mut self) {
        if self.raw_live == 0 {
            self.raw.clear();
            return;
        }
        while self.raw.front().is_some_and(|w| w.r.is_none()) {
            self.raw.pop_front();
        }
        while self.raw.back().is_some_and(|w| w.r.is_none()) {
            self.raw.pop_back();
        }
        if self.raw.len() > 2 * self.raw_live + self.tuning.list_slack {
            self.compact_raw();
        }
    }

    #[cold]
    fn compact_raw(&mut self) {
        self.raw.retain(|w| w.r.is_some());
    }

    /// After the unexpected message `(removed, key)` left its bucket: drop its entries in the
    /// arrival list and the class indexes if they are at either end, clear or compact if needed.
    #[inline]
    fn ux_removed(&mut self, removed: u64, key: u64) {
        self.ux_live -= 1;
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
        for (c, mask) in CLASS_MASKS.into_iter().enumerate() {
            if !self.ux_indexed[c] {
                continue;
            }
            let ix = &mut self.ux_index[c];
            if let Some(q) = ix.map.get_mut(&(key & mask)) {
                let popped = if q.front().is_some_and(|e| e.0 == removed) {
                    q.pop_front()
                } else if q.back().is_some_and(|e| e.0 == removed) {
                    q.pop_back()
                } else {
                    None
                };
                if popped.is_some() {
                    let emptied = q.is_empty();
                    ix.removed(1, emptied, self.tuning.empty_floor);
                }
            }
            if self.ux_index[c].len > 2 * self.ux_live + self.tuning.list_slack {
                self.compact_ux_index(c);
            }
        }
    }

    #[cold]
    fn compact_ux_order(&mut self) {
        let buckets = &self.buckets;
        self.ux_order.retain(|&(useq, key)| ux_live(buckets, useq, key));
    }

    /// Drops the stale entries of class `c`'s unexpected index, and its empty queues.
    #[cold]
    fn compact_ux_index(&mut self, c: usize) {
        let buckets = &self.buckets;
        let ix = &mut self.ux_index[c];
        let mut len = 0;
        ix.map.retain(|_, q| {
            q.retain(|&(useq, key)| ux_live(buckets, useq, key));
            len += q.len();
            !q.is_empty()
        });
        ix.len = len;
        ix.empty = 0;
    }

    /// Starts maintaining class `c`'s unexpected index, built from the arrival-order list.
    #[cold]
    fn enable_ux_index(&mut self, c: usize) {
        let mut ix = Queues::default();
        for &(useq, key) in &self.ux_order {
            if ux_live(&self.buckets, useq, key) {
                ix.push(key & CLASS_MASKS[c], useq, key);
            }
        }
        self.ux_index[c] = ix;
        self.ux_indexed[c] = true;
    }

    /// Builds the indexes that probes asked for.
    #[cold]
    fn enable_wanted(&mut self) {
        let wanted = self.ux_wanted.swap(0, Ordering::Relaxed);
        for c in 0..CLASSES {
            if wanted & (1 << c) != 0 && !self.ux_indexed[c] {
                self.enable_ux_index(c);
            }
        }
    }

    /// Records a new unexpected message `(useq, key)` in the arrival list and the indexes.
    #[inline]
    fn index_unexpected(&mut self, useq: u64, key: u64) {
        self.ux_order.push_back((useq, key));
        self.ux_live += 1;
        for ((ix, &on), mask) in self.ux_index.iter_mut().zip(&self.ux_indexed).zip(CLASS_MASKS) {
            if on {
                ix.push(key & mask, useq, key);
            }
        }
    }

    /// The key of the bucket whose first unexpected message is the oldest one matching
    /// `(tag, mask)`. A wildcard form whose index is not built yet is scanned for, and the index
    /// is asked for.
    fn find_unexpected(&self, tag: u64, mask: u64) -> Option<u64> {
        if self.ux_live == 0 {
            return None;
        }
        if mask == FULL_MASK {
            return self.buckets.get(&tag).is_some_and(|b| !b.ux.is_empty()).then_some(tag);
        }
        let want = tag & mask;
        if let Some(c) = class_of(mask) {
            if self.ux_indexed[c] {
                let q = self.ux_index[c].map.get(&want)?;
                for &(useq, key) in q {
                    if ux_live(&self.buckets, useq, key) {
                        return Some(key);
                    }
                    self.steps.bump();
                }
                return None;
            }
            self.ux_wanted.fetch_or(1 << c, Ordering::Relaxed);
        }
        for &(useq, key) in &self.ux_order {
            self.steps.bump();
            if key & mask == want && ux_live(&self.buckets, useq, key) {
                return Some(key);
            }
        }
        None
    }

    /// Like [`Self::find_unexpected`], but builds the index first and pops the stale entries it
    /// passes.
    fn find_unexpected_mut(&mut self, tag: u64, mask: u64) -> Option<u64> {
        if self.ux_live == 0 {
            return None;
        }
        let Some(c) = class_of(mask) else {
            return self.find_unexpected(tag, mask);
        };
        if !self.ux_indexed[c] {
            self.enable_ux_index(c);
        }
        let buckets = &self.buckets;
        let ix = &mut self.ux_index[c];
        let q = ix.map.get_mut(&(tag & mask))?;
        let mut stale = 0;
        let found = loop {
            let Some(&(useq, key)) = q.front() else { break None };
            if ux_live(buckets, useq, key) {
                break Some(key);
            }
            self.steps.bump();
            q.pop_front();
            stale += 1;
        };
        if stale > 0 {
            let emptied = q.is_empty();
            ix.removed(stale, emptied, self.tuning.empty_floor);
        }
        found
    }

    /// Removes the oldest unexpected message matching `(tag, mask)`.
    fn take_unexpected(&mut self, tag: u64, mask: u64) -> Option<(u64, M)> {
        let key = self.find_unexpected_mut(tag, mask)?;
        let b = self.buckets.get_mut(&key)?;
        let (useq, m) = b.ux.pop_front()?;
        let emptied = b.is_empty();
        if emptied {
            self.bucket_emptied();
        }
        self.ux_removed(useq, key);
        Some((key, m))
    }

    /// Post of a receive with `mask == FULL_MASK`: one hash lookup.
    #[inline(always)]
    fn post_exact(&mut self, tag: u64, id: RecvId, r: R) -> Posted<R, M> {
        match self.buckets.entry(tag) {
            Entry::Occupied(mut e) => {
                let b = e.get_mut();
                if let Some((useq, m)) = b.ux.pop_front() {
                    let emptied = b.is_empty();
                    if emptied {
                        self.bucket_emptied();
                    }
                    self.ux_removed(useq, tag);
                    return Posted::Matched(r, m);
                }
                if b.posted.is_empty() {
                    // `ux` is empty too: the bucket stops being an empty one.
                    self.empty_buckets -= 1;
                }
                b.posted.push_back((id, r));
            }
            Entry::Vacant(e) => {
                let mut b = Self::fresh_bucket(&mut self.spare);
                b.posted.push_back((id, r));
                e.insert(b);
            }
        }
        self.exact_live += 1;
        Posted::Queued(id)
    }

    /// Stores `m` as unexpected in a new bucket for `tag` (there is none).
    fn store_unexpected_new(&mut self, tag: u64, m: M) {
        let useq = self.next_useq;
        self.next_useq += 1;
        let mut b = Self::fresh_bucket(&mut self.spare);
        b.ux.push_back((useq, m));
        self.buckets.insert(tag, b);
        self.index_unexpected(useq, tag);
    }

    /// Entries examined by linear scans since the last call (tests only).
    #[cfg(test)]
    pub(crate) fn take_steps(&self) -> u64 {
        self.steps.0.swap(0, std::sync::atomic::Ordering::Relaxed)
    }

    /// Which wildcard classes have their unexpected index built (tests only).
    #[cfg(test)]
    pub(crate) fn ux_indexed(&self) -> [bool; 3] {
        self.ux_indexed
    }

    /// Capacities of every internal structure, to check that steady state does not allocate
    /// (tests only).
    #[cfg(test)]
    pub(crate) fn footprint(&self) -> Vec<usize> {
        let mut v = vec![self.buckets.len(), self.buckets.capacity(), self.spare.len(), self.raw.capacity(), self.ux_order.capacity()];
        let mut per_bucket: Vec<(u64, usize, usize)> =
            self.buckets.iter().map(|(&k, b)| (k, b.posted.capacity(), b.ux.capacity())).collect();
        per_bucket.sort_unstable();
        v.extend(per_bucket.into_iter().flat_map(|(k, p, u)| [k as usize, p, u]));
        for c in 0..CLASSES {
            for (map_len, map_cap, mut queues) in [
                (
                    self.wild[c].map.len(),
                    self.wild[c].map.capacity(),
                    self.wild[c].map.iter().map(|(&k, q)| (k, q.capacity())).collect::<Vec<_>>(),
                ),
                (
                    self.ux_index[c].map.len(),
                    self.ux_index[c].map.capacity(),
                    self.ux_index[c].map.iter().map(|(&k, q)| (k, q.capacity())).collect::<Vec<_>>(),
                ),
            ] {
                queues.sort_unstable();
                v.extend([map_len, map_cap]);
                v.extend(queues.into_iter().flat_map(|(k, cap)| [k as usize, cap]));
            }
        }
        v
    }

    /// Checks every structural invariant; panics with a message if one fails (tests only).
    #[cfg(test)]
    pub(crate) fn check_invariants(&self) {
        // Every queued receive's id: issued, of the form of the queue it is in, and unique.
        let mut ids = Vec::new();
        self.check_buckets(&mut ids);
        self.check_wild(&mut ids);
        self.check_ux_index();
        assert_eq!(self.raw.iter().filter(|w| w.r.is_some()).count(), self.raw_live);
        assert!(self.raw.iter().all(|w| class_of(w.mask).is_none() && w.mask != FULL_MASK));
        assert!(sorted(&self.raw.iter().map(|w| w.id.0).collect::<Vec<_>>()));
        for w in &self.raw {
            self.issued(&mut ids, w.id, FORM_RAW);
        }
        let n = ids.len();
        ids.sort_unstable();
        ids.dedup_by_key(|id| id.seq());
        assert_eq!(ids.len(), n, "two queued receives share a sequence number");
        assert!(sorted(&self.ux_order.iter().map(|e| e.0).collect::<Vec<_>>()));
        assert!(self.raw.len() <= 2 * self.raw_live + self.tuning.list_slack + 1);
        assert!(self.ux_order.len() <= 2 * self.ux_live + self.tuning.list_slack + 1);
        assert!(self.spare.len() <= self.tuning.spare_max && self.spare.iter().all(Bucket::is_empty));
    }

    /// A queued receive's id was issued and is of the form of the queue it is in; it joins `ids`.
    #[cfg(test)]
    fn issued(&self, ids: &mut Vec<RecvId>, id: RecvId, form: u64) {
        assert!(id.seq() < self.next_seq, "{id:?} never issued");
        assert_eq!(id.form(), form, "{id:?} in a queue of form {form}");
        ids.push(id);
    }

    /// The exact buckets: receives or messages, never both; each queue in order; the live
    /// counts; each message in the arrival order and in every class index kept.
    #[cfg(test)]
    fn check_buckets(&self, ids: &mut Vec<RecvId>) {
        let (mut exact, mut ux, mut empty) = (0, 0, 0);
        for (&k, b) in &self.buckets {
            assert!(b.posted.is_empty() || b.ux.is_empty(), "bucket {k:#x} has receives and messages");
            assert!(sorted(&b.posted.iter().map(|p| p.0 .0).collect::<Vec<_>>()));
            assert!(sorted(&b.ux.iter().map(|p| p.0).collect::<Vec<_>>()));
            exact += b.posted.len();
            ux += b.ux.len();
            empty += usize::from(b.is_empty());
            for &(id, _) in &b.posted {
                self.issued(ids, id, FORM_EXACT);
            }
            for &(useq, _) in &b.ux {
                let i = self.ux_order.binary_search_by_key(&useq, |e| e.0);
                assert!(i.is_ok_and(|i| self.ux_order[i].1 == k), "useq {useq} not ordered");
                for (c, mask) in CLASS_MASKS.into_iter().enumerate() {
                    if self.ux_indexed[c] {
                        let q = self.ux_index[c].map.get(&(k & mask));
                        assert!(q.is_some_and(|q| q.binary_search(&(useq, k)).is_ok()), "useq {useq} not in class {c}");
                    }
                }
            }
        }
        assert_eq!(exact, self.exact_live);
        assert_eq!(ux, self.ux_live);
        assert_eq!(empty, self.empty_buckets);
    }

    /// The three wildcard classes' queues: keys inside their class's mask, each queue in
    /// order, the counts kept.
    #[cfg(test)]
    fn check_wild(&self, ids: &mut Vec<RecvId>) {
        let mut wild = 0;
        for (c, q) in self.wild.iter().enumerate() {
            let mut len = 0;
            for (&k, queue) in &q.map {
                assert_eq!(k & CLASS_MASKS[c], k, "class {c} key {k:#x} has bits outside the mask");
                assert!(sorted(&queue.iter().map(|e| e.0).collect::<Vec<_>>()));
                for &(id, _) in queue {
                    self.issued(ids, RecvId(id), c as u64);
                }
                len += queue.len();
            }
            assert_eq!(len, q.len);
            assert_eq!(q.map.values().filter(|q| q.is_empty()).count(), q.empty);
            wild += len;
        }
        assert_eq!(wild, self.wild_live);
    }

    /// The unexpected messages' class indexes: empty when not kept, else in order, under
    /// their class's key, counted, and bounded by the live messages.
    #[cfg(test)]
    fn check_ux_index(&self) {
        for (c, ix) in self.ux_index.iter().enumerate() {
            if !self.ux_indexed[c] {
                assert_eq!(ix.len, 0);
                continue;
            }
            let mut len = 0;
            for (&k, q) in &ix.map {
                assert!(sorted(&q.iter().map(|e| e.0).collect::<Vec<_>>()));
                assert!(q.iter().all(|e| e.1 & CLASS_MASKS[c] == k));
                len += q.len();
            }
            assert_eq!(len, ix.len);
            assert_eq!(ix.map.values().filter(|q| q.is_empty()).count(), ix.empty);
            assert!(ix.len <= 2 * self.ux_live + self.tuning.list_slack + 1);
        }
    }
}

/// Whether `s` is strictly increasing (tests only).
#[cfg(test)]
fn sorted(s: &[u64]) -> bool {
    s.iter().zip(s.iter().skip(1)).all(|(a, c)| a < c)
}

// `post`, `post_exact` and `arrive` are always inlined: they run once per message, and as calls
// their register saves and restores cost about 20 instructions each (`comm_window_cost_8b`).
impl<R, M> Matcher<R, M> for SwMatcher<R, M> {
    #[inline(always)]
    fn post(&mut self, tag: u64, mask: u64, r: R) -> Posted<R, M> {
        let seq = self.next_seq;
        self.next_seq += 1;
        if mask == FULL_MASK {
            return self.post_exact(tag, RecvId::new(seq, FORM_EXACT), r);
        }
        if let Some((_, m)) = self.take_unexpected(tag, mask) {
            return Posted::Matched(r, m);
        }
        let id = match class_of(mask) {
            Some(c) => {
                let id = RecvId::new(seq, c as u64);
                self.wild[c].push(tag & mask, id.0, r);
                self.wild_live += 1;
                id
            }
            None => {
                let id = RecvId::new(seq, FORM_RAW);
                self.raw.push_back(Raw { id, tag: tag & mask, mask, r: Some(r) });
                self.raw_live += 1;
                id
            }
        };
        Posted::Queued(id)
    }

    #[inline(always)]
    fn arrive(&mut self, tag: u64, m: M) -> Arrived<R, M> {
        if self.ux_wanted.load(Ordering::Relaxed) != 0 {
            self.enable_wanted();
        }
        let (wild_seq, class) = self.wild_candidate(tag);
        // One lookup of the bucket serves the exact candidate, its match and the store.
        let bucket = self.buckets.get_mut(&tag);
        let exact_seq = bucket.as_ref().and_then(|b| b.posted.front()).map_or(u64::MAX, |p| p.0 .0);
        if self.raw_live > 0 {
            if let Some((id, r)) = take_raw_match(&mut self.raw, tag, exact_seq.min(wild_seq), &self.steps) {
                self.raw_live -= 1;
                self.tidy_raw();
                return Arrived::Matched(id, r, m);
            }
        }
        if let Some(c) = class.filter(|_| wild_seq < exact_seq) {
            let q = &mut self.wild[c];
            let popped = q.map.get_mut(&(tag & CLASS_MASKS[c])).and_then(|queue| Some((queue.pop_front()?, queue.is_empty())));
            if let Some(((id, r), emptied)) = popped {
                q.removed(1, emptied, self.tuning.empty_floor);
                self.wild_live -= 1;
                return Arrived::Matched(RecvId(id), r, m);
            }
        }
        let Some(b) = bucket else {
            self.store_unexpected_new(tag, m);
            return Arrived::Unexpected;
        };
        if let Some((id, r)) = b.posted.pop_front() {
            let emptied = b.is_empty();
            self.exact_live -= 1;
            if emptied {
                self.bucket_emptied();
            }
            return Arrived::Matched(id, r, m);
        }
        // Unexpected, and the bucket is at hand: store without a second lookup.
        let useq = self.next_useq;
        self.next_useq += 1;
        if b.is_empty() {
            self.empty_buckets -= 1;
        }
        b.ux.push_back((useq, m));
        self.index_unexpected(useq, tag);
        Arrived::Unexpected
    }

    /// Cost: one hash lookup (none for a raw receive), then a look at the front of the
    /// receive's queue and, if it is not there, a binary search of that queue.
    fn cancel(&mut self, id: RecvId, tag: u64) -> Option<R> {
        let floor = self.tuning.empty_floor;
        match id.form() {
            FORM_EXACT => {
                let b = self.buckets.get_mut(&tag)?;
                let j = seq_position(&b.posted, id.0, |p| p.0 .0)?;
                let (_, r) = b.posted.remove(j)?;
                let emptied = b.is_empty();
                self.exact_live -= 1;
                if emptied {
                    self.bucket_emptied();
                }
                Some(r)
            }
            FORM_RAW => {
                let i = seq_position(&self.raw, id.0, |w| w.id.0)?;
                let w = self.raw.get_mut(i).filter(|w| tag & w.mask == w.tag)?;
                let r = w.r.take()?;
                self.raw_live -= 1;
                self.tidy_raw();
                Some(r)
            }
            c => {
                let c = usize::try_from(c).ok()?;
                let r = self.wild.get_mut(c)?.remove(tag & CLASS_MASKS.get(c)?, id.0, floor)?;
                self.wild_live -= 1;
                Some(r)
            }
        }
    }

    fn probe(&self, tag: u64, mask: u64) -> Option<(u64, &M)> {
        let key = self.find_unexpected(tag, mask)?;
        let (_, m) = self.buckets.get(&key)?.ux.front()?;
        Some((key, m))
    }

    fn probe_mut(&mut self, tag: u64, mask: u64) -> Option<(u64, &mut M)> {
        let key = self.find_unexpected_mut(tag, mask)?;
        let (_, m) = self.buckets.get_mut(&key)?.ux.front_mut()?;
        Some((key, m))
    }

    fn take_probed(&mut self, tag: u64, mask: u64) -> Option<(u64, M)> {
        self.take_unexpected(tag, mask)
    }

    fn posted_len(&self) -> usize {
        self.exact_live + self.wild_live + self.raw_live
    }

    fn unexpected_len(&self) -> usize {
        self.ux_live
    }

    /// Cost: at most four lookups, plus a scan of the raw receives if there are any.
    fn has_posted_match(&self, tag: u64) -> bool {
        self.buckets.get(&tag).is_some_and(|b| !b.posted.is_empty())
            || (self.wild_live > 0 && self.wild.iter().enumerate().any(|(c, q)| q.len > 0 && q.head(tag & CLASS_MASKS[c]).is_some()))
            || (self.raw_live > 0 && self.raw.iter().any(|w| w.r.is_some() && tag & w.mask == w.tag))
    }

    /// Cost: for an exact `(tag, mask)`, at most four lookups (plus a scan of the raw receives if
    /// there are any). A wildcard query looks up directly the queues whose mask is within its
    /// own and scans the keys of the others (O(distinct keys queued or recently used)).
    fn earlier_posted_overlaps(&self, tag: u64, mask: u64) -> bool {
        if self.raw_live > 0 && self.raw.iter().any(|w| w.r.is_some() && keys_overlap(w.tag, w.mask, tag, mask)) {
            return true;
        }
        if self.wild_live > 0 {
            for (c, q) in self.wild.iter().enumerate() {
                if q.len == 0 {
                    continue;
                }
                let cm = CLASS_MASKS[c];
                let hit = if cm & !mask == 0 {
                    q.head(tag & cm).is_some()
                } else {
                    q.map.iter().any(|(&k, queue)| !queue.is_empty() && (k ^ tag) & cm & mask == 0)
                };
                if hit {
                    return true;
                }
            }
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
