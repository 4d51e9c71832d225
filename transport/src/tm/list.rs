//! The matching list: entry slots, free handles, and an index that finds the first eligible
//! matching entry without scanning the list.
//!
//! # Index
//!
//! Entries are grouped by mask into classes; inside a class, entries live in hash buckets
//! keyed by their (pre-masked) tag, each bucket an intrusive FIFO in insertion order. Every
//! entry carries a sequence number from one global counter, so the first entry in list order
//! that matches a message is the bucket head with the smallest sequence number among the
//! classes. Lookup costs one hash probe per live mask class: O(1) when all receives use one or
//! two masks (exact, and ANY_TAG), O(distinct masks) in general, never O(list length).
//!
//! # Phase eligibility
//!
//! Entries added while software's unexpected count is stale are not matched until a list op
//! brings the counts level. Such entries always form a suffix of the list in sequence order
//! (an in-phase ADD is itself a level op, which re-enables every earlier entry), so the
//! eligible entries are exactly those with `seq < match_limit`, one compare per lookup.

use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};

/// "No entry" in the intrusive links.
pub(super) const NIL: u32 = u32::MAX;

/// Hasher for 64-bit tags: folds the high half (context id, source rank) into the low bits
/// that pick the hash bucket, then multiplies. A couple of cycles, no allocation.
#[derive(Default, Clone, Copy)]
pub(super) struct TagHasher(u64);

impl Hasher for TagHasher {
    #[inline]
    fn finish(&self) -> u64 {
        self.0
    }

    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }

    #[inline]
    fn write_u64(&mut self, v: u64) {
        let x = (self.0 ^ v ^ (v >> 29)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        self.0 = x ^ (x >> 32);
    }
}

type TagMap = HashMap<u64, Bucket, BuildHasherDefault<TagHasher>>;

/// Where an entry is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum SlotState {
    /// Not in use; the handle is in the free queue.
    Free,
    /// In the matching list.
    Listed,
    /// Matched; its data phase (more packets, or the rendezvous read) is under way.
    Matched,
    /// Out of the list for good (consumed or deleted); waits for its completions to be polled.
    Done,
}

/// One entry of the list.
#[derive(Debug, Clone, Copy)]
pub(super) struct Slot {
    pub(super) state: SlotState,
    /// Holders of the handle: the hardware (listed or matched, until its final consumption
    /// completion is polled) and each queued ADD/DEL completion. At 0 the handle is freed.
    pub(super) refs: u8,
    /// Bumped at each ADD; makes stale rendezvous read ids detectable.
    pub(super) gen: u32,
    /// Position in list order.
    pub(super) seq: u64,
    /// Tag, pre-masked.
    pub(super) tag: u64,
    pub(super) mask: u64,
    pub(super) recv_wr_id: u64,
    /// Buffer length.
    pub(super) len: usize,
    /// Index of the mask class.
    pub(super) class: u32,
    pub(super) prev: u32,
    pub(super) next: u32,
    /// For a matched message: sender, TMH fields, RVH (for the FIN), payload length.
    pub(super) src: u32,
    pub(super) msg_tag: u64,
    pub(super) app_ctx: u32,
    pub(super) rvh: crate::wire::Rvh,
    pub(super) payload: u64,
    /// A rendezvous read was requested and has not been reported.
    pub(super) read_pending: bool,
}

impl Slot {
    const EMPTY: Slot = Slot {
        state: SlotState::Free,
        refs: 0,
        gen: 0,
        seq: 0,
        tag: 0,
        mask: 0,
        recv_wr_id: 0,
        len: 0,
        class: 0,
        prev: NIL,
        next: NIL,
        src: 0,
        msg_tag: 0,
        app_ctx: 0,
        rvh: crate::wire::Rvh { va: 0, rkey: 0, len: 0 },
        payload: 0,
        read_pending: false,
    };
}

#[derive(Debug, Clone, Copy)]
struct Bucket {
    head: u32,
    tail: u32,
}

struct Class {
    mask: u64,
    /// Listed entries in this class.
    count: u32,
    buckets: TagMap,
}

/// The list and its index. See the module documentation.
pub(super) struct TagList {
    pub(super) slots: Vec<Slot>,
    free: VecDeque<u32>,
    classes: Vec<Class>,
    listed: usize,
    next_seq: u64,
    match_limit: u64,
}

impl TagList {
    /// A list of `n` entries, all allocated now.
    pub(super) fn new(n: u32) -> Self {
        let n_us = n as usize;
        let exact = Class { mask: u64::MAX, count: 0, buckets: TagMap::with_capacity_and_hasher(n_us, Default::default()) };
        TagList {
            slots: vec![Slot::EMPTY; n_us],
            free: (0..n).collect(),
            classes: vec![exact],
            listed: 0,
            next_seq: 0,
            match_limit: u64::MAX,
        }
    }

    /// Entries in the list now.
    #[inline]
    pub(super) fn listed(&self) -> usize {
        self.listed
    }

    /// True if no handle is free.
    #[inline]
    pub(super) fn is_full(&self) -> bool {
        self.free.is_empty()
    }

    /// Takes a free handle.
    #[inline]
    pub(super) fn alloc(&mut self) -> Option<u32> {
        self.free.pop_front()
    }

    /// Returns a handle whose holders are all gone (FIFO, so handles are reused as late as
    /// possible, like mlx5's free-entry queue).
    #[inline]
    fn free_handle(&mut self, h: u32) {
        self.free.push_back(h);
    }

    /// Drops one holder of `h`; frees the handle when none remains.
    pub(super) fn unref(&mut self, h: u32) {
        let Some(s) = self.slots.get_mut(h as usize) else {
            return;
        };
        s.refs = s.refs.saturating_sub(1);
        if s.refs == 0 && s.state != SlotState::Free {
            s.state = SlotState::Free;
            self.free_handle(h);
        }
    }

    /// Every entry becomes eligible: software's count is level with the hardware's. Returns
    /// true if entries had been added out of phase since the previous resync.
    #[inline]
    pub(super) fn resync(&mut self) -> bool {
        let was_limited = self.match_limit != u64::MAX;
        self.match_limit = u64::MAX;
        was_limited
    }

    /// Puts the allocated slot `h` at the end of the list. `stale`: added with a count that
    /// is not level, so not eligible until the next [`TagList::resync`].
    pub(super) fn insert(&mut self, h: u32, tag: u64, mask: u64, stale: bool) {
        let seq = self.next_seq;
        self.next_seq += 1;
        if stale && self.match_limit == u64::MAX {
            self.match_limit = seq;
        }
        let key = tag & mask;
        let ci = self.class_for(mask);
        let class = &mut self.classes[ci];
        class.count += 1;
        let prev = match class.buckets.get_mut(&key) {
            Some(b) => {
                let prev = b.tail;
                b.tail = h;
                prev
            }
            None => {
                class.buckets.insert(key, Bucket { head: h, tail: h });
                NIL
            }
        };
        if prev != NIL {
            self.slots[prev as usize].next = h;
        }
        let s = &mut self.slots[h as usize];
        s.state = SlotState::Listed;
        s.seq = seq;
        s.tag = key;
        s.mask = mask;
        s.class = ci as u32;
        s.prev = prev;
        s.next = NIL;
        self.listed += 1;
    }

    /// Index of the class for `mask`, creating it (reusing an empty class's map if any).
    fn class_for(&mut self, mask: u64) -> usize {
        if let Some(i) = self.classes.iter().position(|c| c.mask == mask) {
            return i;
        }
        if let Some(i) = self.classes.iter().position(|c| c.count == 0) {
            self.classes[i].mask = mask;
            return i;
        }
        self.classes.push(Class { mask, count: 0, buckets: TagMap::default() });
        self.classes.len() - 1
    }

    /// Takes the listed entry `h` out of the list (its state is left for the caller to set).
    pub(super) fn unlink(&mut self, h: u32) {
        // The four fields the unlinking needs, not a copy of the whole slot (two cache lines).
        let s = &self.slots[h as usize];
        debug_assert_eq!(s.state, SlotState::Listed);
        let (class, prev, next, tag) = (s.class, s.prev, s.next, s.tag);
        let class = &mut self.classes[class as usize];
        class.count -= 1;
        if prev != NIL {
            self.slots[prev as usize].next = next;
        }
        if next != NIL {
            self.slots[next as usize].prev = prev;
        }
        if prev == NIL && next == NIL {
            class.buckets.remove(&tag);
        } else if let Some(b) = class.buckets.get_mut(&tag) {
            if b.head == h {
                b.head = next;
            }
            if b.tail == h {
                b.tail = prev;
            }
        }
        let s = &mut self.slots[h as usize];
        s.prev = NIL;
        s.next = NIL;
        self.listed -= 1;
    }

    /// The first eligible entry in list order whose `tag & mask` equals `msg_tag & mask`.
    #[inline(always)]
    pub(super) fn lookup(&self, msg_tag: u64) -> Option<u32> {
        if self.listed == 0 {
            return None;
        }
        self.lookup_listed(msg_tag)
    }

    /// [`TagList::lookup`] on a non-empty list.
    fn lookup_listed(&self, msg_tag: u64) -> Option<u32> {
        let mut best = NIL;
        let mut best_seq = u64::MAX;
        for c in &self.classes {
            if c.count == 0 {
                continue;
            }
            if let Some(b) = c.buckets.get(&(msg_tag & c.mask)) {
                let seq = self.slots[b.head as usize].seq;
                if seq < best_seq {
                    best_seq = seq;
                    best = b.head;
                }
            }
        }
        // Ineligible entries are a suffix in sequence order: if the first matching entry is
        // not eligible, no matching entry is.
        (best != NIL && best_seq < self.match_limit).then_some(best)
    }
}
