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

// SAFETY: a `RawBufMut` stands for the `&mut [T]` (`T: Pod`) its constructor's caller lent,
// and is used only to copy bytes into it: `Pod` data is plain bytes (no interior mutability,
// no drop), so holding and using the view on another thread is what sending that
// `&mut [u8]` would allow, and `&mut [u8]` is `Send`. Which thread uses the engine that holds
// it, one at a time, is `crate::sync`'s business.
unsafe impl Send for RawBufMut {}

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
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.ptr.add(off), n) };
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

// SAFETY: a `RawBuf` stands for the `&[T]` (`T: Pod`, so no interior mutability) its
// constructor's caller lent, and is used only to read bytes from it, which is what sending
// that `&[u8]` to another thread would allow (`&[u8]` is `Send`).
unsafe impl Send for RawBuf {}

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
