//! The cache's entries, range index and LRU, in storage that never allocates or frees.
//!
//! Everything here runs under the cache lock, and the monitor thread takes that lock while a
//! `munmap` somewhere in the process waits for it. An allocation or a free under the lock
//! could itself `munmap`/`madvise` heap pages the cache monitors (glibc trims its heaps) and
//! deadlock on the monitor. So [`Store`] is built with a fixed capacity *outside* the lock
//! ([`Store::with_capacity`]) and every operation stays inside it:
//!
//! - `slots` (entries), `index` (the range map), `free` and `dead` (slot-number stacks) all
//!   have capacity >= the slot capacity, and each slot number is in `free` or `dead` at most
//!   once and in `index` at most once, so no push ever reallocates.
//! - A new entry needs a free slot: when `needs_grow()` says there is none, the caller drops
//!   the lock, builds a store twice as large, re-takes the lock, [`Store::migrate_into`] the
//!   new one (moves only) and drops the old, empty one after unlocking.
//! - The range map is a vector sorted by start address (binary search, `insert`/`remove`
//!   shift elements in place) rather than a `BTreeMap`, whose nodes are allocated and freed
//!   on insert and remove.
//! - Each entry's registration is an `Arc<Entry>`: the slot holds one reference and
//!   every handle in use one more, so an entry is in use exactly when its count is above 1
//!   (handles are only made under the lock, so a count of 1 seen under the lock stays 1).
//!   Releasing a handle is dropping its reference: no lock, and the last reference
//!   deregisters. (Only the release of an entry already out of the cache takes the lock, to
//!   drop the dead stack's reference first: see `CachedMr`'s `Drop`.)
//! - Entries removed from the cache keep their reference in the slot and go on the `dead`
//!   stack; [`Store::pop_dead`] moves it out so the caller drops it unlocked (which
//!   deregisters, unless a handle still holds it: then that handle's drop does).
//! - The LRU is intrusive (`prev`/`next` slot numbers in the entries) and holds every entry
//!   in the index, most recently *acquired* first (a release takes no lock, so it cannot
//!   reorder). [`Store::trim`] walks it from the least recent end and evicts the entries not
//!   in use.
//!
//! Entries in the index never overlap: a registration that needs a new entry first evicts
//! every entry overlapping its range (not merged).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::super::flags::Access;
use super::{CacheDomain, CacheRegion, Entry};

const NIL: u32 = u32::MAX;

/// Where an entry is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Unused slot, on the free stack.
    Free,
    /// In the index (findable) and on the LRU.
    Cached,
    /// On the dead stack: out of the index (evicted by an overlap or the bounds, invalidated,
    /// or the cache closing), its reference waiting to be dropped.
    Dead,
}

struct Slot<D: CacheDomain> {
    start: usize,
    access: Access,
    state: State,
    prev: u32,
    next: u32,
    mr: Option<Arc<Entry<D>>>,
}

impl<D: CacheDomain> Slot<D> {
    /// Whether a handle holds the entry (more references than the slot's own).
    fn in_use(&self) -> bool {
        self.mr.as_ref().is_some_and(|m| Arc::strong_count(m) > 1)
    }
}

#[derive(Clone, Copy)]
struct IndexEnt {
    start: usize,
    end: usize,
    slot: u32,
}

/// Entries, the range index and the LRU.
pub(super) struct Store<D: CacheDomain> {
    slots: Vec<Slot<D>>,
    free: Vec<u32>,
    dead: Vec<u32>,
    index: Vec<IndexEnt>,
    /// Most recently acquired (or inserted) entry.
    lru_head: u32,
    /// Least recently acquired entry (evicted first when unused).
    lru_tail: u32,
    /// Bytes of the entries in the index (in use or not).
    cached_bytes: usize,
}

impl<D: CacheDomain> Store<D> {
    /// An empty store for `cap` entries (allocates: call it without the lock).
    pub(super) fn with_capacity(cap: usize) -> Store<D> {
        let cap = cap.clamp(1, NIL as usize - 1);
        Store {
            slots: Vec::with_capacity(cap),
            free: Vec::with_capacity(cap),
            dead: Vec::with_capacity(cap),
            index: Vec::with_capacity(cap),
            lru_head: NIL,
            lru_tail: NIL,
            cached_bytes: 0,
        }
    }

    /// Slot capacity.
    pub(super) fn capacity(&self) -> usize {
        self.slots.capacity()
    }

    /// Whether a new entry would need more room than the store has.
    pub(super) fn needs_grow(&self) -> bool {
        self.free.is_empty() && self.slots.len() == self.slots.capacity()
    }

    /// Moves everything into `new` (which must be empty and at least as large); `self` is
    /// left empty. Does not allocate.
    pub(super) fn migrate_into(&mut self, new: &mut Store<D>) {
        debug_assert!(new.capacity() >= self.capacity() && new.slots.is_empty());
        new.slots.append(&mut self.slots);
        new.free.extend_from_slice(&self.free);
        new.dead.extend_from_slice(&self.dead);
        new.index.extend_from_slice(&self.index);
        new.lru_head = self.lru_head;
        new.lru_tail = self.lru_tail;
        new.cached_bytes = self.cached_bytes;
        self.cached_bytes = 0;
        self.free.clear();
        self.dead.clear();
        self.index.clear();
        self.lru_head = NIL;
        self.lru_tail = NIL;
    }

    /// Number of entries in the index.
    pub(super) fn cached_count(&self) -> usize {
        self.index.len()
    }

    /// Whether one more entry of `len` bytes fits the limits (counting every entry in the
    /// index, in use or not).
    pub(super) fn fits(&self, len: usize, max_count: usize, max_size: usize) -> bool {
        self.index.len() < max_count && self.cached_bytes.checked_add(len).is_some_and(|b| b <= max_size)
    }

    /// Number of entries in the index not in use, and their bytes (walks the index).
    pub(super) fn unused_usage(&self) -> (usize, usize) {
        self.index.iter().filter(|e| !self.slots[e.slot as usize].in_use()).fold((0, 0), |(n, b), e| (n + 1, b + (e.end - e.start)))
    }

    /// Position of the first index entry ending after `addr`.
    fn first_ending_after(&self, addr: usize) -> usize {
        // Entries do not overlap, so ends are sorted like starts.
        self.index.partition_point(|e| e.end <= addr)
    }

    /// The entry covering `[start, end)` with at least `access`, if any.
    pub(super) fn lookup(&self, start: usize, end: usize, access: Access) -> Option<u32> {
        let e = self.index.get(self.first_ending_after(start))?;
        let s = &self.slots[e.slot as usize];
        (e.start <= start && end <= e.end && s.access.contains(access)).then_some(e.slot)
    }

    /// The union of the access of entries overlapping `[start, end)` (a new registration
    /// replacing them keeps what they granted).
    pub(super) fn overlapping_access(&self, start: usize, end: usize) -> Access {
        let mut acc = Access::empty();
        for e in self.index[self.first_ending_after(start)..].iter() {
            if e.start >= end {
                break;
            }
            acc |= self.slots[e.slot as usize].access;
        }
        acc
    }

    /// Takes a reference on a cached entry for a handle (cloning the `Arc` only increments
    /// a counter) and makes it the most recently used.
    pub(super) fn acquire(&mut self, slot: u32) -> Arc<Entry<D>> {
        debug_assert_eq!(self.slots[slot as usize].state, State::Cached);
        if self.lru_head != slot {
            self.lru_unlink(slot);
            self.lru_push_front(slot);
        }
        match &self.slots[slot as usize].mr {
            Some(mr) => Arc::clone(mr),
            None => unreachable!("a live cache entry always holds its registration"),
        }
    }

    /// Adds an entry for `[start, end)` holding `mr` (the caller keeps its other references
    /// for the handle). The caller has evicted overlapping entries and checked
    /// `!needs_grow()`.
    pub(super) fn insert(&mut self, start: usize, end: usize, access: Access, mr: Arc<Entry<D>>) {
        let slot = Slot { start, access, state: State::Cached, prev: NIL, next: NIL, mr: Some(mr) };
        let n = match self.free.pop() {
            Some(n) => {
                self.slots[n as usize] = slot;
                n
            }
            None => {
                debug_assert!(self.slots.len() < self.slots.capacity());
                self.slots.push(slot);
                (self.slots.len() - 1) as u32
            }
        };
        let pos = self.index.partition_point(|e| e.start < start);
        debug_assert!(self.index.len() < self.index.capacity());
        self.index.insert(pos, IndexEnt { start, end, slot: n });
        self.cached_bytes += end - start;
        self.lru_push_front(n);
    }

    /// Takes the entry at index position `pos` out of the index and the LRU; its reference
    /// goes on the dead stack (handles holding it keep it alive).
    fn unindex(&mut self, pos: usize) {
        let e = self.index.remove(pos);
        self.cached_bytes -= e.end - e.start;
        self.lru_unlink(e.slot);
        let s = &mut self.slots[e.slot as usize];
        s.state = State::Dead;
        if let Some(entry) = &s.mr {
            entry.dead.store(true, Ordering::Release);
        }
        debug_assert!(self.dead.len() < self.dead.capacity());
        self.dead.push(e.slot);
    }

    /// Removes every entry overlapping `[start, end)` from the index; returns how many.
    pub(super) fn evict_overlapping(&mut self, start: usize, end: usize) -> usize {
        let pos = self.first_ending_after(start);
        let mut n = 0;
        while self.index.get(pos).is_some_and(|e| e.start < end) {
            self.unindex(pos);
            n += 1;
        }
        n
    }

    /// The memory of `[start, end)` is gone: removes overlapping entries from the index and
    /// revokes their regions at once (remote accesses fail from now on). Returns how many.
    pub(super) fn invalidate(&mut self, start: usize, end: usize) -> usize {
        let pos = self.first_ending_after(start);
        let mut n = 0;
        while let Some(e) = self.index.get(pos).copied().filter(|e| e.start < end) {
            if let Some(entry) = &self.slots[e.slot as usize].mr {
                entry.mr.revoke();
            }
            self.unindex(pos);
            n += 1;
        }
        n
    }

    /// Evicts least recently acquired entries not in use until the cache holds at most
    /// `max_count` entries and `max_size` bytes, counting every entry (in use or not), or no
    /// unused entry is left. Returns how many were evicted. Walks past entries in use.
    pub(super) fn trim(&mut self, max_count: usize, max_size: usize) -> usize {
        let mut n = 0;
        let mut cur = self.lru_tail;
        while cur != NIL && (self.index.len() > max_count || self.cached_bytes > max_size) {
            let s = &self.slots[cur as usize];
            let prev = s.prev;
            if !s.in_use() {
                let pos = self.index.partition_point(|e| e.start < s.start);
                debug_assert_eq!(self.index[pos].slot, cur);
                self.unindex(pos);
                n += 1;
            }
            cur = prev;
        }
        n
    }

    /// Takes every entry out of the index (the cache is closing): their references go on the
    /// dead stack; handles in use keep theirs.
    pub(super) fn detach_all(&mut self) {
        while !self.index.is_empty() {
            self.unindex(self.index.len() - 1);
        }
    }

    /// Whether dead entries wait for their reference to be dropped.
    pub(super) fn has_dead(&self) -> bool {
        !self.dead.is_empty()
    }

    /// Frees one dead slot and hands its reference out, to be dropped unlocked.
    pub(super) fn pop_dead(&mut self) -> Option<Arc<Entry<D>>> {
        let n = self.dead.pop()?;
        let s = &mut self.slots[n as usize];
        debug_assert_eq!(s.state, State::Dead);
        s.state = State::Free;
        let mr = s.mr.take();
        self.free.push(n);
        mr
    }

    fn lru_push_front(&mut self, slot: u32) {
        let old = self.lru_head;
        {
            let s = &mut self.slots[slot as usize];
            s.prev = NIL;
            s.next = old;
        }
        if old != NIL {
            self.slots[old as usize].prev = slot;
        } else {
            self.lru_tail = slot;
        }
        self.lru_head = slot;
    }

    fn lru_unlink(&mut self, slot: u32) {
        let (prev, next) = {
            let s = &self.slots[slot as usize];
            (s.prev, s.next)
        };
        if prev != NIL {
            self.slots[prev as usize].next = next;
        } else {
            self.lru_head = next;
        }
        if next != NIL {
            self.slots[next as usize].prev = prev;
        } else {
            self.lru_tail = prev;
        }
        let s = &mut self.slots[slot as usize];
        s.prev = NIL;
        s.next = NIL;
    }
}
