//! Allocations whose size comes from outside the runtime (an argument of the caller, a length
//! announced on the wire): bounded by this machine's memory and fallible, so that a size
//! nobody could serve is an error for the caller to report, never an abort of the process.

use bytemuck::Pod;

/// Bytes that `len` elements of `T` take, counting a zero-sized element as one byte (so that a
/// length is bounded even where the memory is not: a loop over the elements still costs time),
/// or `None` when that exceeds the address space or this machine's physical memory.
pub(crate) fn bounded_bytes<T>(len: usize) -> Option<usize> {
    let bytes = len.checked_mul(std::mem::size_of::<T>().max(1))?;
    (bytes <= isize::MAX as usize && bytes <= crate::sys::physical_memory()).then_some(bytes)
}

/// An empty vector with room for `len` elements of `T`, or `None` when [`bounded_bytes`]
/// refuses the length or the allocator refuses the memory.
pub(crate) fn reserved_vec<T>(len: usize) -> Option<Vec<T>> {
    bounded_bytes::<T>(len)?;
    let mut v = Vec::new();
    v.try_reserve_exact(len).ok()?;
    Some(v)
}

/// A vector of `len` zeroed elements of `T`, or `None` as [`reserved_vec`].
pub(crate) fn zeroed_vec<T: Pod>(len: usize) -> Option<Vec<T>> {
    let mut v = reserved_vec(len)?;
    v.resize(len, T::zeroed());
    Some(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lengths_beyond_memory_are_refused_before_any_allocation() {
        let mem = crate::sys::physical_memory();
        // (length, element size 1, 8 or 0) -> accepted?
        let table: [(usize, bool, bool, bool); 6] = [
            (0, true, true, true),
            (4096, true, true, true),
            (mem / 8, true, true, true),
            (mem / 8 + 1, true, false, true),
            (mem.saturating_add(1), false, false, false),
            (usize::MAX, false, false, false),
        ];
        for (len, u8_ok, u64_ok, zst_ok) in table {
            assert_eq!(bounded_bytes::<u8>(len).is_some(), u8_ok, "u8 x {len}");
            assert_eq!(bounded_bytes::<u64>(len).is_some(), u64_ok, "u64 x {len}");
            assert_eq!(bounded_bytes::<()>(len).is_some(), zst_ok, "() x {len}");
        }
        assert!(zeroed_vec::<u8>(1 << 62).is_none());
        assert!(reserved_vec::<u64>(usize::MAX / 2).is_none());
        assert_eq!(zeroed_vec::<u32>(3), Some(vec![0, 0, 0]));
    }
}
