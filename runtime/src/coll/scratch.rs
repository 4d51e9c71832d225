//! Scratch memory for the collective schedules, kept per thread from one call to the next.
//!
//! A reduction receives its partner's data into a temporary vector as long as its own (or a
//! block of it). Allocated afresh on every call, a vector of 1 MiB came from `mmap`: its pages
//! faulted in (zeroed by the kernel) and were zeroed again by `vec!`, every call. In
//! `osu_allreduce` at 1 MiB on 2 ranks that was about 16% of the time (`memset` 9%,
//! `clear_page` 7%). The scratch is only ever written by a receive before it is read, so its
//! stale contents never matter; it is `Pod` memory, so any bit pattern is a valid `T`.

use std::cell::RefCell;

/// Largest scratch (bytes) kept for the next call; a larger one is freed after its call.
const KEEP_MAX: usize = 16 << 20;

/// Most scratch buffers kept per thread (a schedule takes one per scratch span, and several
/// schedules may be in flight).
const KEEP_COUNT: usize = 8;

thread_local! {
    /// The kept scratch buffers, in 16-byte words (alignment enough for every built-in element
    /// type), the most recently given back last.
    static POOL: RefCell<Vec<Vec<u128>>> = const { RefCell::new(Vec::new()) };
}

/// A scratch buffer of `words` 16-byte words from this thread's pool (its contents are stale
/// data of an earlier call, or zeros), or a new one.
pub(crate) fn take(words: usize) -> Vec<u128> {
    let mut v = POOL.with(|p| p.borrow_mut().pop()).unwrap_or_default();
    if v.len() < words {
        v.resize(words, 0);
    }
    v
}

/// Gives a buffer from [`take`] back to this thread's pool (or frees it when it is large or
/// the pool is full).
pub(crate) fn give(v: Vec<u128>) {
    if v.capacity() * std::mem::size_of::<u128>() <= KEEP_MAX {
        POOL.with(|p| {
            let mut p = p.borrow_mut();
            if p.len() < KEEP_COUNT {
                p.push(v);
            }
        });
    }
}

/// Runs `f` on a scratch slice of `n` elements of `T` whose contents are unspecified (stale
/// data of an earlier call, or zeros). A call made from within `f` gets a scratch of its own.
#[cfg(test)]
pub(crate) fn with_scratch<T: bytemuck::Pod, R>(n: usize, f: impl FnOnce(&mut [T]) -> R) -> R {
    let bytes = n.saturating_mul(std::mem::size_of::<T>());
    if bytes == 0 || std::mem::align_of::<T>() > std::mem::align_of::<u128>() {
        // Zero-sized elements, or an alignment the words do not give (a user's `Pod` type).
        return f(&mut vec![T::zeroed(); n]);
    }
    let need = bytes.div_ceil(std::mem::size_of::<u128>());
    let mut words = take(need);
    let r = {
        let raw: &mut [u8] = bytemuck::cast_slice_mut(&mut words[..need]);
        // Cannot fail: `raw` starts on a 16-byte boundary and `bytes` is a multiple of the
        // element size.
        let slice: &mut [T] = bytemuck::cast_slice_mut(&mut raw[..bytes]);
        f(slice)
    };
    give(words);
    r
}

#[cfg(test)]
mod tests {
    use super::with_scratch;

    #[test]
    fn gives_the_asked_length_and_reuses_the_memory() {
        let first = with_scratch::<f64, _>(1000, |s| {
            assert_eq!(s.len(), 1000);
            s.fill(1.5);
            s.as_ptr() as usize
        });
        let again = with_scratch::<f32, _>(2000, |s| {
            assert_eq!(s.len(), 2000);
            s.as_ptr() as usize
        });
        assert_eq!(first, again, "the same memory serves the next call");
    }

    #[test]
    fn nested_calls_get_their_own_memory() {
        with_scratch::<u32, _>(64, |outer| {
            outer.fill(7);
            with_scratch::<u32, _>(64, |inner| inner.fill(9));
            assert!(outer.iter().all(|&x| x == 7), "the inner call did not write into the outer scratch");
        });
    }

    #[test]
    fn zero_sized_elements_fall_back_to_a_fresh_vector() {
        with_scratch::<(), _>(5, |s| assert_eq!(s.len(), 5));
    }
}
