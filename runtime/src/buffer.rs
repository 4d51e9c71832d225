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

use std::ptr::NonNull;

/// A writable user buffer of a pending receive.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RawBufMut {
    /// Never null (a slice's pointer), so that an `Option<RawBufMut>` is two words.
    ptr: NonNull<u8>,
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
        let cap = buf.len();
        RawBufMut { ptr: NonNull::from(buf).cast::<u8>(), cap }
    }

    /// A view of no bytes (a receive whose buffer comes later, or never).
    pub(crate) fn empty() -> Self {
        RawBufMut { ptr: NonNull::dangling(), cap: 0 }
    }

    /// Capacity in bytes.
    #[inline]
    pub(crate) fn cap(&self) -> usize {
        self.cap
    }

    /// Address of the first byte (named to a peer that writes into it with CMA).
    pub(crate) fn addr(&self) -> usize {
        self.ptr.as_ptr() as usize
    }

    /// Copies as much of `data` as fits at `off`; returns the bytes copied. Always inlined:
    /// it is the copy out of the ring of every eager message.
    #[inline(always)]
    pub(crate) fn write_at(&self, off: usize, data: &[u8]) -> usize {
        if off >= self.cap {
            return 0;
        }
        let n = data.len().min(self.cap - off);
        // SAFETY: [off, off + n) lies inside the buffer, which is alive and exclusively ours
        // (constructor contract); `data` never aliases a user receive buffer because it comes
        // from the fabric or from runtime-owned memory.
        unsafe { tmpi_transport::shm::copy_bytes(data.as_ptr(), self.ptr.as_ptr().add(off), n) };
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
        let dst = unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr().add(off), n) };
        f(dst)
    }
}

/// Posts the OFI fabric's `fi_read` of `n` bytes (clamped to the buffer's capacity) at
/// `(addr, key)` of rank `src` into `buf`, named `user`; its end comes back through
/// [`OfiFabric::take_reads_done`](tmpi_transport::ofi::OfiFabric::take_reads_done).
///
/// The engine keeps the read (phase `ReadPhase::Fabric`, a remote writer of the buffer)
/// until that end is taken: a receive abandoned meanwhile waits for it (`Engine::abandon_read`).
#[cfg(feature = "ofi")]
pub(crate) fn post_fabric_read(
    f: &mut tmpi_transport::ofi::OfiFabric,
    buf: RawBufMut,
    n: usize,
    src: usize,
    (addr, key): (u64, u64),
    user: u64,
) -> tmpi_transport::Result<()> {
    let n = n.min(buf.cap);
    // SAFETY: `[0, n)` lies inside the buffer, which stays valid and is written by nobody
    // else until the read's end is taken: the engine keeps the read as a remote writer of the
    // buffer until then, and an abandoned receive waits for it (see above). On an error
    // nothing was posted.
    unsafe { f.post_read(src, buf.ptr.as_ptr(), n, addr, key, user) }
}

/// Most reads [`cma_read_many`] takes at once.
pub(crate) const CMA_MANY: usize = 16;

/// Fills `[0, len)` of each receive buffer (clamped to its capacity) from address `va` of
/// process `pid`, with one system call ([`cma::read_many`]): `reads` are `(buffer, len, va)`.
/// Returns the bytes moved (fewer than asked when the kernel stopped at a bad range), or
/// `None`, nothing done, when two of the ranges overlap or there are more than [`CMA_MANY`].
///
/// [`cma::read_many`]: tmpi_transport::shm::cma::read_many
pub(crate) fn cma_read_many(pid: u32, reads: &[(RawBufMut, usize, u64)]) -> Option<Result<usize, tmpi_transport::shm::cma::CmaError>> {
    if reads.len() > CMA_MANY {
        return None;
    }
    let range = |&(b, len, _): &(RawBufMut, usize, u64)| (b.addr(), b.addr() + len.min(b.cap));
    for (i, x) in reads.iter().enumerate() {
        let (a0, a1) = range(x);
        if reads[..i].iter().map(range).any(|(b0, b1)| a0 < b1 && b0 < a1) {
            return None;
        }
    }
    let mut parts: [(u64, &mut [u8]); CMA_MANY] = std::array::from_fn(|_| (0, &mut [][..]));
    for (part, &(b, len, va)) in parts.iter_mut().zip(reads) {
        // SAFETY: each buffer is alive and exclusively ours (constructor contract), the range
        // `[0, min(len, cap))` lies inside it, and no two ranges overlap (checked above), so
        // the slices are disjoint; they do not outlive this call, and nothing else touches the
        // buffers meanwhile (the engine is single-threaded).
        *part = (va, unsafe { std::slice::from_raw_parts_mut(b.ptr.as_ptr(), len.min(b.cap)) });
    }
    Some(tmpi_transport::shm::cma::read_many(pid, &mut parts[..reads.len()]))
}

/// A readable user buffer of a pending send.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RawBuf {
    /// Never null (a slice's pointer), so that an `Option<RawBuf>` is two words.
    ptr: NonNull<u8>,
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
        RawBuf { ptr: NonNull::from(buf).cast::<u8>(), len: buf.len() }
    }

    /// Length in bytes.
    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Address of the first byte.
    #[inline]
    pub(crate) fn addr(&self) -> usize {
        self.ptr.as_ptr() as usize
    }

    /// The sub-view `[from, to)`.
    #[inline]
    pub(crate) fn sub(&self, from: usize, to: usize) -> RawBuf {
        assert!(from <= to && to <= self.len, "RawBuf range out of bounds");
        // SAFETY: `from <= len`, so the pointer stays inside (or one past) the same
        // allocation, and is not null since the start is not.
        RawBuf { ptr: unsafe { self.ptr.add(from) }, len: to - from }
    }

    /// The bytes `[from, to)`.
    #[inline]
    pub(crate) fn slice(&self, from: usize, to: usize) -> &[u8] {
        assert!(from <= to && to <= self.len, "RawBuf range out of bounds");
        // SAFETY: in bounds (checked); the memory is alive and unmodified (constructor contract).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr().add(from), to - from) }
    }
}

/// Memory the runtime allocates for a receive of unknown size (`Comm::irecv_vec`), sized and
/// aligned for `len / elem` elements of the user's type once the message's length is known.
/// It is owned by the receive's slot; the receive writes into it through [`OwnedBuf::view`],
/// and the user gets it as a `Vec<T>` ([`OwnedBuf::into_vec`]) once the receive is complete.
#[derive(Debug)]
pub(crate) struct OwnedBuf {
    ptr: std::ptr::NonNull<u8>,
    len: usize,
    align: usize,
}

// SAFETY: an OwnedBuf is the only owner of its allocation (like a `Box<[u8]>`): moving it to
// another thread moves that ownership, and nothing else points into the memory except the
// view of the receive that holds both, which moves with it.
unsafe impl Send for OwnedBuf {}

impl OwnedBuf {
    /// `len` zeroed bytes aligned to `align` (a power of two); `None` when the allocation
    /// fails or the layout is impossible. Nothing is allocated for `len == 0`.
    pub(crate) fn alloc(len: usize, align: usize) -> Option<OwnedBuf> {
        let layout = std::alloc::Layout::from_size_align(len, align).ok()?;
        if len == 0 {
            // A dangling, aligned pointer: what an empty Vec<T> holds.
            return Some(OwnedBuf { ptr: std::ptr::NonNull::new(align as *mut u8)?, len, align });
        }
        // SAFETY: the layout has a non-zero size.
        let p = unsafe { std::alloc::alloc_zeroed(layout) };
        Some(OwnedBuf { ptr: std::ptr::NonNull::new(p)?, len, align })
    }

    /// A view the receive writes through.
    ///
    /// # Safety
    /// The view must not be used after this buffer is dropped or turned into a `Vec`: the
    /// receive that holds both gives the buffer away only once it is complete (nothing writes
    /// any more), and drops them together otherwise.
    pub(crate) unsafe fn view(&mut self) -> RawBufMut {
        RawBufMut { ptr: self.ptr, cap: self.len }
    }

    /// The bytes as a `Vec<T>`; `None` (the buffer is freed) when they do not form whole,
    /// suitably aligned elements of `T`.
    pub(crate) fn into_vec<T: bytemuck::Pod>(self) -> Option<Vec<T>> {
        let elem = std::mem::size_of::<T>();
        if elem == 0 || self.len % elem != 0 || self.align != std::mem::align_of::<T>() {
            return None;
        }
        if self.len == 0 {
            return Some(Vec::new());
        }
        let this = std::mem::ManuallyDrop::new(self);
        let n = this.len / elem;
        // SAFETY: the memory was allocated by the global allocator with the layout of
        // `[T; n]` (size n * size_of::<T>() = len, align_of::<T>(), both checked above), it is
        // initialised (zeroed, then written) and every bit pattern is a valid T (Pod); the
        // ManuallyDrop gives up our ownership, so the Vec is its only owner.
        Some(unsafe { Vec::from_raw_parts(this.ptr.as_ptr().cast::<T>(), n, n) })
    }
}

impl Drop for OwnedBuf {
    fn drop(&mut self) {
        if self.len != 0 {
            // SAFETY: allocated in `alloc` with exactly this size and alignment (a valid
            // layout, or `alloc` would have failed), and not given away (into_vec forgets self).
            unsafe { std::alloc::dealloc(self.ptr.as_ptr(), std::alloc::Layout::from_size_align_unchecked(self.len, self.align)) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::OwnedBuf;

    #[test]
    fn an_owned_buffer_becomes_a_vec_of_its_type_only() {
        let mut b = OwnedBuf::alloc(24, std::mem::align_of::<u64>()).expect("alloc");
        // SAFETY: the view is used while `b` lives.
        let v = unsafe { b.view() };
        assert_eq!(v.write_at(8, &7u64.to_le_bytes()), 8);
        assert_eq!(b.into_vec::<u64>(), Some(vec![0, 7, 0]));
        let b = OwnedBuf::alloc(24, 1).expect("alloc");
        assert_eq!(b.into_vec::<[u8; 5]>(), None, "24 bytes are no whole number of 5-byte elements");
        let b = OwnedBuf::alloc(24, 1).expect("alloc");
        assert_eq!(b.into_vec::<u64>(), None, "memory aligned for bytes is no Vec<u64>");
        let b = OwnedBuf::alloc(0, 4).expect("empty");
        assert_eq!(b.into_vec::<u32>(), Some(Vec::new()));
        assert!(OwnedBuf::alloc(8, 3).is_none(), "not a power of two");
    }
}
