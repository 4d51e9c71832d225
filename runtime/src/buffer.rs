//! Raw views of user buffers held by pending operations. The runtime's only `unsafe` besides
//! the fabrics lives here.
//!
//! A pending receive keeps a [`RawBufMut`] and writes into it as packets arrive; a pending send
//! keeps a [`RawBuf`] and reads from it as ring space frees up. Both are created by `unsafe`
//! constructors whose callers promise the memory outlives the operation:
//! - blocking calls (`send`, `recv`, ...) do not return before the operation is finished or
//!   abandoned;
//! - non-blocking calls borrow the buffer for the lifetime of a [`crate::Scope`], and the scope
//!   finishes (or abandons) every operation it started before it returns — even if a
//!   `Request` was leaked with `mem::forget`, and also when unwinding.
//!
//! "Abandoned" means the engine has forgotten the pointer: a queued receive is cancelled, a
//! receive in progress discards the rest of its data, and a send in progress copies what is
//! left into an owned buffer (see `Engine::abandon`).

/// A writable user buffer of a pending receive.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RawBufMut {
    ptr: *mut u8,
    cap: usize,
}

impl RawBufMut {
    /// # Safety
    /// `buf` must stay valid, and not be accessed by anyone else, until the operation that
    /// holds this view has finished or has been abandoned (module docs).
    pub(crate) unsafe fn new(buf: &mut [u8]) -> Self {
        RawBufMut { ptr: buf.as_mut_ptr(), cap: buf.len() }
    }

    /// Capacity in bytes.
    #[inline]
    pub(crate) fn cap(&self) -> usize {
        self.cap
    }

    /// Address of the first byte (named to a peer that writes into it with CMA).
    pub(crate) fn addr(&self) -> usize {
        self.ptr as usize
    }

    /// Copies as much of `data` as fits at `off`; returns the bytes copied.
    #[inline]
    pub(crate) fn write_at(&self, off: usize, data: &[u8]) -> usize {
        if off >= self.cap {
            return 0;
        }
        let n = data.len().min(self.cap - off);
        // SAFETY: [off, off + n) lies inside the buffer, which is alive and exclusively ours
        // (constructor contract); `data` never aliases a user receive buffer because it comes
        // from the fabric or from runtime-owned memory.
        unsafe { copy_bytes(data.as_ptr(), self.ptr.add(off), n) };
        n
    }
    /// Lends `[off, off + len)` of the buffer (clamped to its capacity) to `f` as a slice, for
    /// a copy that something else performs (the kernel, for a single-copy read).
    pub(crate) fn fill_with<R>(&self, off: usize, len: usize, f: impl FnOnce(&mut [u8]) -> R) -> R {
        let off = off.min(self.cap);
        let n = len.min(self.cap - off);
        // SAFETY: [off, off + n) lies inside the buffer, which is alive and exclusively ours
        // (constructor contract); the slice does not outlive this call and nothing else
        // touches the buffer meanwhile (the engine is single-threaded).
        let dst = unsafe { std::slice::from_raw_parts_mut(self.ptr.add(off), n) };
        f(dst)
    }
}

/// A readable user buffer of a pending send.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RawBuf {
    ptr: *const u8,
    len: usize,
}

impl RawBuf {
    /// # Safety
    /// `buf` must stay valid and unmodified until the operation that holds this view has
    /// finished or has been abandoned (module docs).
    pub(crate) unsafe fn new(buf: &[u8]) -> Self {
        RawBuf { ptr: buf.as_ptr(), len: buf.len() }
    }

    /// Length in bytes.
    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Address of the first byte.
    #[inline]
    pub(crate) fn addr(&self) -> usize {
        self.ptr as usize
    }

    /// The sub-view `[from, to)`.
    #[inline]
    pub(crate) fn sub(&self, from: usize, to: usize) -> RawBuf {
        assert!(from <= to && to <= self.len, "RawBuf range out of bounds");
        // `from <= len`, so the pointer stays inside (or one past) the same allocation.
        RawBuf { ptr: self.ptr.wrapping_add(from), len: to - from }
    }

    /// The bytes `[from, to)`.
    #[inline]
    pub(crate) fn slice(&self, from: usize, to: usize) -> &[u8] {
        assert!(from <= to && to <= self.len, "RawBuf range out of bounds");
        // SAFETY: in bounds (checked); the memory is alive and unmodified (constructor contract).
        unsafe { std::slice::from_raw_parts(self.ptr.add(from), to - from) }
    }
}

/// Copies `n` bytes from `src` to `dst`; messages of a few bytes are copied inline (two
/// overlapping unaligned words) instead of through a call to `memcpy`.
///
/// # Safety
/// As [`std::ptr::copy_nonoverlapping`]: `src` readable and `dst` writable for `n` bytes, the
/// two ranges disjoint.
#[inline(always)]
pub(crate) unsafe fn copy_bytes(src: *const u8, dst: *mut u8, n: usize) {
    // SAFETY: (every arm) each access lies in [0, n) of `src` or `dst` (the second word of an
    // arm starts at n - width >= 0 and ends at n), which the caller made valid and disjoint;
    // unaligned reads and writes need no alignment.
    unsafe {
        match n {
            0 => {}
            1 => *dst = *src,
            2..=3 => {
                let (a, b) = (src.cast::<u16>().read_unaligned(), src.add(n - 2).cast::<u16>().read_unaligned());
                dst.cast::<u16>().write_unaligned(a);
                dst.add(n - 2).cast::<u16>().write_unaligned(b);
            }
            4..=7 => {
                let (a, b) = (src.cast::<u32>().read_unaligned(), src.add(n - 4).cast::<u32>().read_unaligned());
                dst.cast::<u32>().write_unaligned(a);
                dst.add(n - 4).cast::<u32>().write_unaligned(b);
            }
            8..=16 => {
                let (a, b) = (src.cast::<u64>().read_unaligned(), src.add(n - 8).cast::<u64>().read_unaligned());
                dst.cast::<u64>().write_unaligned(a);
                dst.add(n - 8).cast::<u64>().write_unaligned(b);
            }
            _ => std::ptr::copy_nonoverlapping(src, dst, n),
        }
    }
}

#[cfg(test)]
mod copy_tests {
    use super::copy_bytes;

    #[test]
    fn copy_bytes_copies_every_length_exactly() {
        let src: Vec<u8> = (1..=40).collect();
        for n in 0..=33 {
            let mut dst = vec![0u8; 40];
            // SAFETY: both buffers hold 40 >= n bytes and are distinct allocations.
            unsafe { copy_bytes(src.as_ptr(), dst.as_mut_ptr(), n) };
            assert_eq!(&dst[..n], &src[..n], "n = {n}");
            assert!(dst[n..].iter().all(|&b| b == 0), "n = {n} wrote past its end");
        }
    }
}
