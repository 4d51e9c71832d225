//! The shared heap: [`crate::World::alloc_shared`] hands out buffers that every rank of the node can
//! map, so a rendezvous from or into one moves with one plain `memcpy` (no system call per
//! transfer, no staging through the rings).
//!
//! Each rank's heap is a memory file (`memfd`) of `TMPI_SHARED_HEAP` bytes of address space,
//! created on the first allocation; a peer maps it through `/proc/<pid>/fd` the first time a
//! grant names it (see `tmpi_transport::shm::heap`). The protocol is the usual rendezvous:
//! the sender registers its buffer, the target (sender) checks the reader's fi_mr key and
//! that the range lies in the live send it names, and only then grants the range; the FIN
//! completes the send. A [`SharedBuf`] is borrowed by every operation that uses it, so it
//! cannot be dropped while one is in flight; once dropped, its memory can be handed out
//! again, and a reader holding an old key is refused by the target (the key check names a
//! live send, never bare memory).
//!
//! Whenever the heap cannot serve (no memfd, heap full, peer heap not mappable), everything
//! works as with any other buffer: allocations fall back to private memory
//! ([`SharedBuf::is_shared`] says which) and transfers to the pipelined or CMA copy.

use std::collections::HashMap;
use std::marker::PhantomData;
use std::ops::{Deref, DerefMut};
use std::sync::Arc;

use bytemuck::Pod;
use tmpi_transport::shm::heap::{Block, Heap, HeapDesc, PeerHeap};

use crate::error::{Error, Result};

/// A buffer of `len` values of `T` from this rank's shared heap (or, if the heap could not
/// serve it, from private memory), zero-initialised, freed on drop. Derefs to `[T]`; pass it
/// to any call that takes a slice.
///
/// ```no_run
/// # fn main() -> tmpi::Result<()> {
/// let world = tmpi::init()?;
/// let mut buf = world.alloc_shared::<f64>(1 << 20)?;
/// if world.rank() == 0 {
///     buf.fill(1.5);
///     world.send(&buf, 1, 0)?; // the receiver copies straight out of this buffer
/// } else if world.rank() == 1 {
///     world.recv(&mut buf, 0, 0)?;
/// }
/// # Ok(()) }
/// ```
pub struct SharedBuf<T: Pod> {
    mem: Mem<T>,
    _t: PhantomData<T>,
}

enum Mem<T> {
    Shared(Block),
    Private(Vec<T>),
}

impl<T: Pod> SharedBuf<T> {
    /// Whether the buffer lives in the shared heap (else it is private memory: the heap is
    /// off, full, or not available on this system).
    pub fn is_shared(&self) -> bool {
        matches!(self.mem, Mem::Shared(_))
    }
}

impl<T: Pod> Deref for SharedBuf<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        match &self.mem {
            // The block holds exactly `n * size_of::<T>()` bytes aligned for `T` (see
            // `alloc_shared`), so the cast cannot fail; an empty slice is the harmless answer
            // if it ever did.
            Mem::Shared(b) => bytemuck::try_cast_slice(b.as_bytes()).unwrap_or(&[]),
            Mem::Private(v) => v,
        }
    }
}

impl<T: Pod> DerefMut for SharedBuf<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        match &mut self.mem {
            Mem::Shared(b) => bytemuck::try_cast_slice_mut(b.as_bytes_mut()).unwrap_or(&mut []),
            Mem::Private(v) => v,
        }
    }
}

impl<T: Pod> std::fmt::Debug for SharedBuf<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedBuf").field("len", &self.len()).field("shared", &self.is_shared()).finish()
    }
}

impl<T: Pod> SharedBuf<T> {
    /// `len` zeroed values of `T` from `heap` (this rank's shared heap, if it has one), or
    /// in private memory when the heap cannot serve them: what [`World::alloc_shared`] does.
    ///
    /// [`World::alloc_shared`]: crate::World::alloc_shared
    pub(crate) fn alloc(heap: impl FnOnce() -> Result<Option<Arc<Heap>>>, len: usize) -> Result<SharedBuf<T>> {
        let bytes = len
            .checked_mul(std::mem::size_of::<T>())
            .filter(|&b| b <= isize::MAX as usize)
            .ok_or_else(|| Error::InvalidBuffer(format!("{len} values of {} bytes overflow", std::mem::size_of::<T>())))?;
        let heap = if std::mem::size_of::<T>() == 0 { None } else { heap()? };
        let block = heap.and_then(|h| h.alloc(bytes, std::mem::align_of::<T>()));
        let mem = match block {
            Some(b) if b.len() == bytes => Mem::Shared(b),
            _ => Mem::Private(
                crate::alloc::zeroed_vec(len)
                    .ok_or_else(|| Error::InvalidBuffer(format!("alloc_shared: {bytes} bytes are more than this process can allocate")))?,
            ),
        };
        Ok(SharedBuf { mem, _t: PhantomData })
    }
}

/// A peer heap as this rank knows it.
enum PeerSlot {
    Unknown,
    Mapped(PeerHeap),
    /// Mapping failed once: this peer's heap is not used again (transfers take the other
    /// paths).
    Failed,
}

/// Where a granted read copies from: offset and heap of the target.
#[derive(Clone, Copy, Debug)]
pub(crate) struct HeapSrc {
    pub(crate) off: u64,
    pub(crate) desc: HeapDesc,
}

/// The shared-heap state of one engine.
pub(crate) struct Heaps {
    /// `TMPI_SHARED_HEAP` (0: off).
    cap: usize,
    own: Option<Arc<Heap>>,
    /// Creating the heap failed: allocations are private from now on.
    own_failed: bool,
    peers: Vec<PeerSlot>,
    /// Per peer: a grant of ours has named our heap to it, so it maps the heap (or found it
    /// cannot): from then on our heap sends to it go out pre-granted.
    pub(crate) named_to: Vec<bool>,
    /// Granted reads whose data this rank copies from the target's heap, by read key.
    pub(crate) grants: HashMap<(u32, u32), HeapSrc>,
    /// Target's shares to write into a reader's heap, by (reader, read id): where.
    pub(crate) writes: HashMap<(usize, u64), HeapSrc>,
    /// Reads this rank served through a heap grant; bytes this rank memcpy'd from or into
    /// peers' heaps; transfers that fell back because a peer's heap could not be mapped.
    pub(crate) grants_served: u64,
    pub(crate) bytes: u64,
    pub(crate) fallbacks: u64,
}

impl Heaps {
    /// Heaps of `cap` bytes; `local(peer)`: `peer` runs on this host, so its heap may be
    /// mapped here (a peer on another host never is: its pid names no process here, or
    /// another one).
    pub(crate) fn new(cap: usize, size: usize, local: impl Fn(usize) -> bool) -> Self {
        Heaps {
            cap,
            own: None,
            own_failed: false,
            peers: (0..size).map(|r| if local(r) { PeerSlot::Unknown } else { PeerSlot::Failed }).collect(),
            named_to: vec![false; size],
            grants: HashMap::new(),
            writes: HashMap::new(),
            grants_served: 0,
            bytes: 0,
            fallbacks: 0,
        }
    }

    /// Whether the shared heap is on.
    pub(crate) fn enabled(&self) -> bool {
        self.cap > 0
    }

    /// This rank's heap, created on first use.
    pub(crate) fn own(&mut self) -> Option<Arc<Heap>> {
        if self.cap == 0 || self.own_failed {
            return None;
        }
        if self.own.is_none() {
            match Heap::create(self.cap) {
                Ok(h) => self.own = Some(h),
                Err(_) => self.own_failed = true,
            }
        }
        self.own.clone()
    }

    /// Heap offset and descriptor of `[addr, addr + len)` if it lies in this rank's heap.
    #[inline]
    pub(crate) fn locate(&self, addr: usize, len: usize) -> Option<HeapSrc> {
        let h = self.own.as_ref()?;
        Some(HeapSrc { off: h.locate(addr, len)?, desc: h.desc() })
    }

    /// Whether this rank may map `peer`'s heap (on, and no earlier failure).
    pub(crate) fn may_map(&self, peer: usize) -> bool {
        self.cap > 0 && !matches!(self.peers.get(peer), Some(PeerSlot::Failed) | None)
    }

    /// `peer`'s heap mapped (on first use) from process `pid`, if it can be: a failure is
    /// remembered and the heap of that peer is not tried again.
    pub(crate) fn peer(&mut self, peer: usize, pid: u32, desc: HeapDesc) -> Option<&PeerHeap> {
        if !self.may_map(peer) {
            return None;
        }
        let slot = self.peers.get_mut(peer)?;
        if !matches!(slot, PeerSlot::Mapped(p) if p.nonce() == desc.nonce) {
            *slot = match PeerHeap::open(pid, desc) {
                Ok(p) => PeerSlot::Mapped(p),
                Err(_) => PeerSlot::Failed,
            };
        }
        match slot {
            PeerSlot::Mapped(p) => Some(p),
            _ => None,
        }
    }

    /// Where `peer`'s address range `[va, va + len)` lies in its heap, if this rank has that
    /// heap mapped already (a grant named it before) and the range is inside it: a read
    /// pre-granted by `peer` can then be copied at once.
    pub(crate) fn mapped_place(&self, peer: usize, va: u64, len: usize) -> Option<HeapSrc> {
        match self.peers.get(peer) {
            Some(PeerSlot::Mapped(p)) => Some(HeapSrc { off: p.offset_of(va, len)?, desc: p.desc() }),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 55 item 7: a size the heap cannot serve fell back to `vec![0; len]`, which
    /// aborted the process for `alloc_shared::<u8>(1 << 40)`; it is an error, and the heap
    /// still serves later allocations.
    #[test]
    fn an_allocation_beyond_memory_is_an_error() {
        let too_big = crate::sys::physical_memory().saturating_add(1).max(1 << 40);
        let got = crate::run_local(1, |w| {
            let e = w.alloc_shared::<u8>(too_big).unwrap_err();
            let overflow = w.alloc_shared::<u64>(usize::MAX / 4).unwrap_err();
            let mut ok = w.alloc_shared::<u64>(1000).unwrap();
            ok[999] = 7;
            (matches!(e, Error::InvalidBuffer(_)), matches!(overflow, Error::InvalidBuffer(_)), ok.iter().sum::<u64>())
        });
        assert_eq!(got, vec![(true, true, 7)]);
    }

    /// A peer on another host is never mapped (its pid names no process here, or another
    /// one); a peer of this host may be, until a failure; with the heap off, none is.
    #[test]
    fn only_the_heaps_of_peers_on_this_host_may_be_mapped() {
        let h = Heaps::new(1 << 20, 4, |r| r < 2);
        assert!(h.may_map(0) && h.may_map(1));
        assert!(!h.may_map(2) && !h.may_map(3), "other hosts");
        assert!(!h.may_map(4), "no such rank");
        let off = Heaps::new(0, 4, |_| true);
        assert!((0..4).all(|r| !off.may_map(r)));
    }
}
