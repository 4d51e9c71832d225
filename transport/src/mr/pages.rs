//! Whether a range of this process's address space is mapped: the check behind
//! `FI_MR_ALLOCATED` (one `mincore` system call per 4 MiB or so), and the page size.

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
