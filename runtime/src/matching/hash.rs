//! A small, fast, non-cryptographic hasher for the matcher's 64-bit tag keys.
//!
//! Match keys are structured (`[ctx | src | tag]`), and keys that differ only in their high bits
//! (another source, another communicator) are common. A plain multiply (Fx) leaves the low bits of
//! the hash depending only on the low bits of the key, and the hash table indexes by the low bits,
//! so such keys would all collide. We use a *folded* multiply instead: the full 128-bit product of
//! the state with an odd constant, high half xor low half, so every output bit depends on every
//! input bit. One `mul` instruction on x86-64 and aarch64, no allocation, no seed randomisation
//! (the keys are not attacker-chosen: they come from our own peers' headers, and a peer that wants
//! to slow us down has cheaper ways to do so).

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// Multiplier: 2^64 / golden ratio, odd.
const K: u64 = 0x9e37_79b9_7f4a_7c15;
/// Initial state: hex digits of pi, so that a zero key does not hash to zero.
const SEED: u64 = 0x243f_6a88_85a3_08d3;

/// The 128-bit product of `a` and `b`, folded to 64 bits (low half xor high half).
#[inline]
const fn folded_mul(a: u64, b: u64) -> u64 {
    let p = (a as u128).wrapping_mul(b as u128);
    (p as u64) ^ ((p >> 64) as u64)
}

/// A folded-multiply hasher for small integer keys.
///
/// Each `write_*` of an integer costs one folded multiply; `finish` is free.
///
/// ```
/// use std::hash::{Hash, Hasher};
/// use tmpi::matching::hash::FoldHasher;
///
/// let h = |k: u64| {
///     let mut s = FoldHasher::default();
///     k.hash(&mut s);
///     s.finish()
/// };
/// // Keys that differ only in high bits still differ in the low bits of the hash.
/// assert_ne!(h(1 << 40) & 0xff, h(2 << 40) & 0xff);
/// ```
#[derive(Clone, Copy, Debug)]
pub struct FoldHasher {
    state: u64,
}

impl Default for FoldHasher {
    #[inline]
    fn default() -> Self {
        FoldHasher { state: SEED }
    }
}

impl FoldHasher {
    #[inline]
    fn mix(&mut self, x: u64) {
        self.state = folded_mul(self.state ^ x, K);
    }
}

impl Hasher for FoldHasher {
    #[inline]
    fn finish(&self) -> u64 {
        self.state
    }

    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            let mut w = [0u8; 8];
            w.copy_from_slice(c);
            self.mix(u64::from_le_bytes(w));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut w = [0u8; 8];
            w[..rest.len()].copy_from_slice(rest);
            // Mix the length in so that trailing zero bytes are not lost.
            self.mix(u64::from_le_bytes(w) ^ ((rest.len() as u64) << 59));
        }
    }

    #[inline]
    fn write_u8(&mut self, i: u8) {
        self.mix(u64::from(i));
    }

    #[inline]
    fn write_u16(&mut self, i: u16) {
        self.mix(u64::from(i));
    }

    #[inline]
    fn write_u32(&mut self, i: u32) {
        self.mix(u64::from(i));
    }

    #[inline]
    fn write_u64(&mut self, i: u64) {
        self.mix(i);
    }

    #[inline]
    fn write_usize(&mut self, i: usize) {
        self.mix(i as u64);
    }
}

/// The `BuildHasher` for [`FoldHasher`].
pub type FoldBuildHasher = BuildHasherDefault<FoldHasher>;

/// A `HashMap` hashed with [`FoldHasher`].
pub type FoldHashMap<K, V> = HashMap<K, V, FoldBuildHasher>;

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;
    use std::hash::{BuildHasher, Hash};

    fn h<T: Hash>(k: T) -> u64 {
        FoldBuildHasher::default().hash_one(k)
    }

    #[test]
    fn deterministic() {
        assert_eq!(h(42u64), h(42u64));
        assert_ne!(h(42u64), h(43u64));
        assert_ne!(h(0u64), 0);
    }

    /// Keys differing only in the source field (bits 24..44) or context field (bits 44..64)
    /// must spread over the low bits, which is what the table indexes by.
    #[test]
    fn high_bit_keys_spread_over_low_bits() {
        for shift in [24u32, 44] {
            let low: HashSet<u64> = (0..1024u64).map(|i| h((i << shift) | 7) & 1023).collect();
            // A uniform hash puts 1024 keys in ~647 of 1024 slots; Fx-style would give 1.
            assert!(low.len() > 550, "shift {shift}: only {} distinct low slots", low.len());
            let top: HashSet<u64> = (0..1024u64).map(|i| h((i << shift) | 7) >> 57).collect();
            assert!(top.len() > 100, "shift {shift}: only {} distinct top-7-bit values", top.len());
        }
    }

    #[test]
    fn byte_writes_distinguish_lengths() {
        assert_ne!(h([0u8; 3].as_slice()), h([0u8; 4].as_slice()));
        assert_ne!(h("abc"), h("abd"));
        let mut a = FoldHasher::default();
        a.write(&[1, 2, 3, 4, 5, 6, 7, 8, 9]);
        let mut b = FoldHasher::default();
        b.write(&[1, 2, 3, 4, 5, 6, 7, 8, 9, 0]);
        assert_ne!(a.finish(), b.finish());
    }
}
