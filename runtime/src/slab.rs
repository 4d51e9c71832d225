//! A slab with generation-checked handles, for requests and unexpected messages.

/// A handle into a [`Slab`]: index plus generation, so a stale handle never finds a reused slot.
///
/// One 64-bit word that is never zero (the complement of `gen << 32 | idx`), so that a
/// `Key` and an `Option<Key>` are each one register: handles pass through the request layer
/// by value, never as two 32-bit halves written to memory and read back as one word (a
/// store-forwarding stall on every call).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Key(std::num::NonZeroU64);

/// Slot `u32::MAX` (no slot) at generation 0: what `Key::new(u32::MAX, u32::MAX)` gives.
const NOWHERE: std::num::NonZeroU64 = match std::num::NonZeroU64::new(!(u32::MAX as u64)) {
    Some(v) => v,
    None => unreachable!(),
};

impl Key {
    /// The key of slot `idx` at generation `gen`.
    #[inline]
    pub(crate) const fn new(idx: u32, gen: u32) -> Key {
        let v = !((gen as u64) << 32 | idx as u64);
        // Zero is `idx == u32::MAX` at generation `u32::MAX`; no slot has index `u32::MAX`
        // (it is the free list's end), so generation 0 names the same nothing.
        match std::num::NonZeroU64::new(v) {
            Some(v) => Key(v),
            None => Key(NOWHERE),
        }
    }

    /// The slot's index.
    #[inline]
    pub(crate) fn idx(self) -> u32 {
        !self.0.get() as u32
    }

    /// The slot's generation.
    #[inline]
    pub(crate) fn gen(self) -> u32 {
        (!self.0.get() >> 32) as u32
    }
}

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Key").field("idx", &self.idx()).field("gen", &self.gen()).finish()
    }
}

enum Slot<T> {
    Full(u32, T),
    Empty(u32, u32), // generation, next free
}

/// Vector of slots with a free list; no allocation once it has grown to its working size.
pub(crate) struct Slab<T> {
    slots: Vec<Slot<T>>,
    free: u32,
    len: usize,
}

const NIL: u32 = u32::MAX;

impl<T> Slab<T> {
    pub(crate) fn new() -> Self {
        Slab { slots: Vec::new(), free: NIL, len: 0 }
    }

    /// The key the next `insert` will return.
    #[inline]
    pub(crate) fn vacant_key(&self) -> Key {
        if self.free == NIL {
            Key::new(self.slots.len() as u32, 0)
        } else {
            match &self.slots[self.free as usize] {
                Slot::Empty(gen, _) => Key::new(self.free, *gen),
                Slot::Full(..) => unreachable!("free list points at a full slot"),
            }
        }
    }

    /// As [`Slab::insert`], with the value made by `f` once its slot is chosen (so that a
    /// large value can be written in place rather than built elsewhere and moved), and lent
    /// back (so that a caller that changes it at once does not look the slot up again).
    #[inline(always)]
    pub(crate) fn insert_mut(&mut self, f: impl FnOnce() -> T) -> (Key, &mut T) {
        self.len += 1;
        let (slot, key) = if self.free == NIL {
            self.slots.push(Slot::Full(0, f()));
            let idx = self.slots.len() - 1;
            (&mut self.slots[idx], Key::new(idx as u32, 0))
        } else {
            let idx = self.free;
            let slot = &mut self.slots[idx as usize];
            let (gen, next) = match slot {
                Slot::Empty(g, n) => (*g, *n),
                Slot::Full(..) => unreachable!("free list points at a full slot"),
            };
            self.free = next;
            // The slot is empty (two integers): nothing to drop, and not calling the drop
            // glue lets the value be written in place rather than built on the stack and
            // copied in with wide loads over its narrow stores (a store-forwarding stall).
            std::mem::forget(std::mem::replace(slot, Slot::Full(gen, f())));
            (slot, Key::new(idx, gen))
        };
        match slot {
            Slot::Full(_, v) => (key, v),
            Slot::Empty(..) => unreachable!("the slot was just filled"),
        }
    }

    #[inline]
    pub(crate) fn insert(&mut self, v: T) -> Key {
        self.insert_mut(|| v).0
    }

    #[inline]
    pub(crate) fn get(&self, k: Key) -> Option<&T> {
        match self.slots.get(k.idx() as usize) {
            Some(Slot::Full(g, v)) if *g == k.gen() => Some(v),
            _ => None,
        }
    }

    #[inline]
    pub(crate) fn get_mut(&mut self, k: Key) -> Option<&mut T> {
        match self.slots.get_mut(k.idx() as usize) {
            Some(Slot::Full(g, v)) if *g == k.gen() => Some(v),
            _ => None,
        }
    }

    /// Looks a slot up by index alone (for handles that travelled without a generation).
    #[inline]
    pub(crate) fn key_of(&self, idx: u32) -> Option<Key> {
        match self.slots.get(idx as usize) {
            Some(Slot::Full(g, _)) => Some(Key::new(idx, *g)),
            _ => None,
        }
    }

    #[inline]
    pub(crate) fn remove(&mut self, k: Key) -> Option<T> {
        let slot = self.slots.get_mut(k.idx() as usize)?;
        match slot {
            Slot::Full(g, _) if *g == k.gen() => {
                let old = std::mem::replace(slot, Slot::Empty(k.gen().wrapping_add(1), self.free));
                self.free = k.idx();
                self.len -= 1;
                match old {
                    Slot::Full(_, v) => Some(v),
                    Slot::Empty(..) => None,
                }
            }
            _ => None,
        }
    }

    /// Looks `k` up once and hands its value to `f`; frees the slot when `f` returns `Some`.
    /// `None` when `k` names no full slot.
    ///
    /// The freed value is dropped, unless `owns_nothing` says that what `f` left of it owns
    /// no memory: it is then forgotten, which skips a call of its drop glue (for a request,
    /// about 28 instructions per message, callgrind). A wrong `true` would leak, never more.
    #[inline(always)]
    pub(crate) fn take_if<R>(
        &mut self,
        k: Key,
        f: impl FnOnce(&mut T) -> Option<R>,
        owns_nothing: impl FnOnce(&T) -> bool,
    ) -> Option<Option<R>> {
        let slot = self.slots.get_mut(k.idx() as usize)?;
        let (r, plain) = match slot {
            Slot::Full(g, v) if *g == k.gen() => {
                let r = f(v);
                let plain = r.is_some() && owns_nothing(v);
                (r, plain)
            }
            _ => return None,
        };
        if r.is_some() {
            let empty = Slot::Empty(k.gen().wrapping_add(1), self.free);
            if plain {
                // Never read: the move out compiles to nothing (a `replace` whose result may
                // be dropped copied the whole slot out first).
                std::mem::forget(std::mem::replace(slot, empty));
            } else {
                *slot = empty;
            }
            self.free = k.idx();
            self.len -= 1;
        }
        Some(r)
    }

    /// Number of full slots.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Whether no slot is full.
    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The keys of the full slots, in index order.
    pub(crate) fn keys(&self) -> impl Iterator<Item = Key> + '_ {
        self.slots.iter().enumerate().filter_map(|(i, s)| match s {
            Slot::Full(g, _) => Some(Key::new(i as u32, *g)),
            Slot::Empty(..) => None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_one_word_and_gives_back_its_parts() {
        assert_eq!(std::mem::size_of::<Option<Key>>(), 8);
        for (idx, gen) in [(0, 0), (1, 0), (0, 1), (7, u32::MAX), (u32::MAX - 1, 3), (u32::MAX, 0)] {
            let k = Key::new(idx, gen);
            assert_eq!((k.idx(), k.gen()), (idx, gen));
        }
        // The one pair with no word of its own (from the wire) names no slot either.
        let k = Key::new(u32::MAX, u32::MAX);
        assert_eq!(k.idx(), u32::MAX);
        let mut s: Slab<u8> = Slab::new();
        s.insert(1);
        assert!(s.get(k).is_none());
    }

    #[test]
    fn reuse_bumps_generation() {
        let mut s = Slab::new();
        let a = s.insert(1);
        assert_eq!(s.vacant_key().idx(), 1);
        assert_eq!(s.remove(a), Some(1));
        let v = s.vacant_key();
        let b = s.insert(2);
        assert_eq!(v, b);
        assert_eq!(a.idx(), b.idx());
        assert_ne!(a.gen(), b.gen());
        assert!(s.get(a).is_none());
        assert_eq!(s.get(b), Some(&2));
        assert_eq!(s.len(), 1);
        assert_eq!(s.key_of(b.idx()), Some(b));
        assert!(s.take_if(a, |_| Some(()), |_| true).is_none(), "a stale key frees nothing");
        assert!(s.take_if(b, |_| Some(()), |_| true).is_some());
        assert!(s.get(b).is_none());
        assert!(s.is_empty());
        assert_eq!(s.vacant_key(), Key::new(b.idx(), b.gen() + 1));
    }

    #[test]
    fn take_if_frees_only_when_asked_and_never_through_a_stale_key() {
        let mut s = Slab::new();
        let a = s.insert(Some(5));
        assert_eq!(s.take_if(a, |v: &mut Option<i32>| if *v == Some(6) { v.take() } else { None }, |_| true), Some(None), "kept");
        assert_eq!(s.get(a), Some(&Some(5)));
        assert_eq!(s.take_if(a, Option::take, |_| true), Some(Some(5)), "taken and freed");
        assert!(s.is_empty() && s.get(a).is_none());
        assert_eq!(s.take_if(a, Option::take, |_| true), None, "stale key");
        let b = s.insert(Some(7));
        assert_eq!(b.idx(), a.idx());
        assert_eq!(s.take_if(a, Option::take, |_| true), None, "a stale key does not reach the slot's new value");
        assert_eq!(s.get(b), Some(&Some(7)));
    }

    /// A freed value that owns something is dropped; one said to own nothing is not (and
    /// `owns_nothing` is asked only when the slot is freed, after `f`).
    #[test]
    fn take_if_drops_what_owns_something() {
        let owner = std::rc::Rc::new(());
        let mut s = Slab::new();
        let a = s.insert(Some(owner.clone()));
        let asked = std::cell::Cell::new(0);
        let owns_nothing = |v: &Option<std::rc::Rc<()>>| {
            asked.set(asked.get() + 1);
            v.is_none()
        };
        assert_eq!(s.take_if(a, |_| None::<()>, owns_nothing), Some(None));
        assert_eq!((asked.get(), std::rc::Rc::strong_count(&owner)), (0, 2), "kept: not asked, not dropped");
        assert_eq!(s.take_if(a, |_| Some(()), owns_nothing), Some(Some(())));
        assert_eq!((asked.get(), std::rc::Rc::strong_count(&owner)), (1, 1), "still owning: dropped");
        let b = s.insert(Some(owner.clone()));
        assert_eq!(s.take_if(b, |v| v.take().map(drop), owns_nothing), Some(Some(())));
        assert_eq!((asked.get(), std::rc::Rc::strong_count(&owner), s.len()), (2, 1, 0), "taken out first: nothing left to drop");
    }
}
