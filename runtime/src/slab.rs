//! A slab with generation-checked handles, for requests and unexpected messages.

/// A handle into a [`Slab`]: index plus generation, so a stale handle never finds a reused slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Key {
    pub(crate) idx: u32,
    pub(crate) gen: u32,
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
            Key { idx: self.slots.len() as u32, gen: 0 }
        } else {
            match &self.slots[self.free as usize] {
                Slot::Empty(gen, _) => Key { idx: self.free, gen: *gen },
                Slot::Full(..) => unreachable!("free list points at a full slot"),
            }
        }
    }

    /// As [`Slab::insert`], with the value made by `f` once its slot is chosen, so that a
    /// large value can be written in place rather than built elsewhere and moved.
    #[inline]
    pub(crate) fn insert_with(&mut self, f: impl FnOnce() -> T) -> Key {
        self.len += 1;
        if self.free == NIL {
            self.slots.push(Slot::Full(0, f()));
            return Key { idx: self.slots.len() as u32 - 1, gen: 0 };
        }
        let idx = self.free;
        let slot = &mut self.slots[idx as usize];
        let (gen, next) = match slot {
            Slot::Empty(g, n) => (*g, *n),
            Slot::Full(..) => unreachable!("free list points at a full slot"),
        };
        self.free = next;
        *slot = Slot::Full(gen, f());
        Key { idx, gen }
    }

    #[inline]
    pub(crate) fn insert(&mut self, v: T) -> Key {
        self.insert_with(|| v)
    }

    #[inline]
    pub(crate) fn get(&self, k: Key) -> Option<&T> {
        match self.slots.get(k.idx as usize) {
            Some(Slot::Full(g, v)) if *g == k.gen => Some(v),
            _ => None,
        }
    }

    #[inline]
    pub(crate) fn get_mut(&mut self, k: Key) -> Option<&mut T> {
        match self.slots.get_mut(k.idx as usize) {
            Some(Slot::Full(g, v)) if *g == k.gen => Some(v),
            _ => None,
        }
    }

    /// Looks a slot up by index alone (for handles that travelled without a generation).
    #[inline]
    pub(crate) fn key_of(&self, idx: u32) -> Option<Key> {
        match self.slots.get(idx as usize) {
            Some(Slot::Full(g, _)) => Some(Key { idx, gen: *g }),
            _ => None,
        }
    }

    #[inline]
    pub(crate) fn remove(&mut self, k: Key) -> Option<T> {
        let slot = self.slots.get_mut(k.idx as usize)?;
        match slot {
            Slot::Full(g, _) if *g == k.gen => {
                let old = std::mem::replace(slot, Slot::Empty(k.gen.wrapping_add(1), self.free));
                self.free = k.idx;
                self.len -= 1;
                match old {
                    Slot::Full(_, v) => Some(v),
                    Slot::Empty(..) => None,
                }
            }
            _ => None,
        }
    }

    /// Frees the slot of `k` in place (its value is dropped where it lies, never moved out);
    /// returns whether `k` named a full slot.
    #[inline]
    pub(crate) fn free(&mut self, k: Key) -> bool {
        let Some(slot) = self.slots.get_mut(k.idx as usize) else { return false };
        match slot {
            Slot::Full(g, _) if *g == k.gen => {
                *slot = Slot::Empty(k.gen.wrapping_add(1), self.free);
                self.free = k.idx;
                self.len -= 1;
                true
            }
            _ => false,
        }
    }

    /// Number of full slots.
    #[cfg(test)]
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
            Slot::Full(g, _) => Some(Key { idx: i as u32, gen: *g }),
            Slot::Empty(..) => None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reuse_bumps_generation() {
        let mut s = Slab::new();
        let a = s.insert(1);
        assert_eq!(s.vacant_key().idx, 1);
        assert_eq!(s.remove(a), Some(1));
        let v = s.vacant_key();
        let b = s.insert(2);
        assert_eq!(v, b);
        assert_eq!(a.idx, b.idx);
        assert_ne!(a.gen, b.gen);
        assert!(s.get(a).is_none());
        assert_eq!(s.get(b), Some(&2));
        assert_eq!(s.len(), 1);
        assert_eq!(s.key_of(b.idx), Some(b));
        assert!(!s.free(a));
        assert!(s.free(b));
        assert!(s.get(b).is_none());
        assert!(s.is_empty());
        assert_eq!(s.vacant_key(), Key { idx: b.idx, gen: b.gen + 1 });
    }
}
