//! Whether a range of this process's address space is mapped: the check behind
//! `FI_MR_ALLOCATED` (one `mincore` system call per 4 MiB or so), and the page size; the
//! ranges a registration covers ([`Segment`]), the page changes a domain records for its
//! regions ([`PageChanges`]) and the wait for a monitor's invalidation batch ([`settle`]).

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

/// The system page size.
pub(crate) fn page_size() -> usize {
    // SAFETY: sysconf has no memory-safety preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(p).ok().filter(|&p| p.is_power_of_two()).unwrap_or(4096)
}

/// Pages asked about per `mincore` call (its result vector lives on the stack).
const CHUNK_PAGES: usize = 1024;

/// True if every page of `[addr, addr + len)` is mapped (resident or not: `mincore` fails
/// with `ENOMEM` on an unmapped page and only then). A range that wraps is not mapped.
pub(crate) fn mapped(addr: usize, len: usize) -> bool {
    let page = page_size();
    let Some(end) = addr.checked_add(len) else { return false };
    let mut at = addr & !(page - 1);
    let mut vec = [0u8; CHUNK_PAGES];
    while at < end {
        let n = ((end - at).div_ceil(page)).min(CHUNK_PAGES);
        // SAFETY: `at` is page-aligned, `n * page` bytes are asked about, and `vec` has room
        // for the `n` result bytes mincore writes; mincore reads no memory of the range (it
        // only looks at the page tables), so any address, mapped or not, is fine. It writes
        // nothing else, so an error leaves nothing half-done.
        let rc = unsafe { libc::mincore(at as *mut libc::c_void, n * page, vec.as_mut_ptr()) };
        if rc != 0 {
            return false;
        }
        at = at.saturating_add(n * page);
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mr::cache::testmem::Mapping;

    /// CONFORMANCE.md: M29.
    #[test]
    fn mapped_ranges_and_holes() {
        let p = page_size();
        let mut m = Mapping::new(3 * p).unwrap();
        assert!(mapped(m.addr() + 5, 2 * p), "untouched pages are mapped");
        m.unmap_part(p, p);
        assert!(!mapped(m.addr(), 3 * p), "a hole in the middle");
        assert!(mapped(m.addr(), p));
        assert!(!mapped(usize::MAX - 3, 8));
        let heap = vec![1u8; 10 << 20];
        assert!(mapped(heap.as_ptr() as usize, heap.len()), "more than one chunk");
    }
}

/// One contiguous piece of a registration (an `iovec`): address and length in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Segment {
    /// Start address in this process.
    pub addr: usize,
    /// Length in bytes.
    pub len: usize,
}

/// Recent page changes of an `FI_MR_MMU_NOTIFY` domain (see [`Domain::pages_changed`]).
pub(crate) struct PageChanges {
    /// Number of changes recorded so far; change `e` is at `ring[e % CHANGES]`.
    epoch: AtomicU64,
    writing: AtomicBool,
    ring: [(AtomicUsize, AtomicUsize); CHANGES],
}

/// Page changes remembered per domain.
const CHANGES: usize = 64;

impl PageChanges {
    pub(crate) fn new() -> Self {
        PageChanges { epoch: AtomicU64::new(0), writing: AtomicBool::new(false), ring: std::array::from_fn(|_| Default::default()) }
    }

    /// Number of changes so far.
    pub(crate) fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Acquire)
    }

    pub(crate) fn record(&self, start: usize, end: usize) {
        while self.writing.compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed).is_err() {
            std::hint::spin_loop();
        }
        let e = self.epoch.load(Ordering::Relaxed);
        let (s, t) = &self.ring[(e % CHANGES as u64) as usize];
        s.store(start, Ordering::Relaxed);
        t.store(end, Ordering::Relaxed);
        self.epoch.store(e + 1, Ordering::Release);
        self.writing.store(false, Ordering::Release);
    }

    /// Whether a change recorded at or after epoch `since` (and before `now`, read with
    /// [`PageChanges::epoch`]) overlaps one of `segs`; true, conservatively, when the ring no
    /// longer reaches back that far.
    pub(crate) fn touched_since(&self, since: u64, now: u64, segs: &[Segment]) -> bool {
        if now.saturating_sub(since) > CHANGES as u64 {
            return true;
        }
        let hit = (since..now).any(|e| {
            let (s, t) = &self.ring[(e % CHANGES as u64) as usize];
            let (s, t) = (s.load(Ordering::Relaxed), t.load(Ordering::Relaxed));
            segs.iter().any(|g| g.addr < t && s < g.addr + g.len)
        });
        // Slots read may have been overwritten meanwhile: then assume the worst.
        hit || self.epoch.load(Ordering::Acquire).saturating_sub(since) > CHANGES as u64
    }
}

/// Waits until no invalidation batch is in progress (returns at once almost always; a batch
/// takes microseconds).
pub(crate) fn settle(in_flight: &AtomicUsize) {
    let mut spins = 0u32;
    while in_flight.load(Ordering::SeqCst) != 0 {
        if spins < 100 {
            std::hint::spin_loop();
            spins += 1;
        } else {
            std::thread::yield_now();
        }
    }
}
