//! The shared heap: memory of one rank that every rank of the node can map and copy from or
//! into with a plain `memcpy` (what XPMEM gives other MPIs, without a kernel module).
//!
//! Each rank's heap is one anonymous memory file (`memfd_create`) of a fixed capacity, mapped
//! shared by its owner and, on first use, by the peers that copy from or into it. A peer
//! opens it through `/proc/<pid>/fd/<fd>` (which needs the same access as reading the owner's
//! memory, and works where Yama forbids `process_vm_readv`).
//!
//! ```text
//! offset 0      HeapHeader (magic, version, nonce, capacity, the owner's address of the heap), one page
//! offset 4096   blocks handed out by [`Heap::alloc`]
//! ```
//!
//! Safety rules the layout gives:
//! - the file is sealed against shrinking (`F_SEAL_SHRINK`) before anyone maps it, and a peer
//!   checks that seal and the size before it maps: no access through a mapping can fall past
//!   the end of the file (no SIGBUS), whatever the owner does later;
//! - a mapping keeps the pages alive: a peer that dies or frees its heap never makes another
//!   rank's mapping dangle;
//! - the header carries a random nonce that the owner also sends with every grant, so a peer
//!   that opened the wrong file (pid reuse, another namespace) refuses it instead of copying.
//!
//! Which bytes of a heap a peer may touch, and when, is not decided here: the runtime grants a
//! range only after its fi_mr key check and only while the send (or receive) that lends it is
//! live. A [`Block`] that is dropped goes back to the free list; a stale grant cannot name it
//! again because grants are per live operation.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::fs::OpenOptionsExt;
use std::sync::{Arc, Mutex};

use memmap2::{MmapOptions, MmapRaw};

use crate::error::{Error, Result};

/// "TMPIHEAP" as a big-endian integer.
pub const MAGIC: u64 = u64::from_be_bytes(*b"TMPIHEAP");
/// Layout version of the header.
pub const VERSION: u64 = 2;
/// Bytes before the first block (the header page).
pub const HEADER: usize = 4096;
/// Smallest alignment of a block; blocks of at least a page are page-aligned.
pub const MIN_ALIGN: usize = 64;

/// What a peer needs to map a heap and check it is the right one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeapDesc {
    /// The owner's file descriptor number of the memory file.
    pub fd: u32,
    /// Random number written in the header at creation.
    pub nonce: u64,
}

/// Free ranges of a heap (offset → length), first fit, coalesced on free.
#[derive(Debug)]
struct Arena {
    free: BTreeMap<usize, usize>,
    /// Bytes below this offset may hold old data (above it the file is still zero).
    dirty_end: usize,
    used: usize,
}

impl Arena {
    fn new(cap: usize) -> Self {
        let mut free = BTreeMap::new();
        if cap > HEADER {
            free.insert(HEADER, cap - HEADER);
        }
        Arena { free, dirty_end: HEADER, used: 0 }
    }

    /// First fit of `len` bytes aligned to `align` (a power of two).
    fn alloc(&mut self, len: usize, align: usize) -> Option<usize> {
        let (start, flen, at) = self.free.iter().find_map(|(&start, &flen)| {
            let at = start.checked_add(align - 1)? & !(align - 1);
            (at.checked_add(len)? <= start + flen).then_some((start, flen, at))
        })?;
        self.free.remove(&start);
        if at > start {
            self.free.insert(start, at - start);
        }
        let end = at + len;
        if end < start + flen {
            self.free.insert(end, start + flen - end);
        }
        self.used += len;
        Some(at)
    }

    fn free(&mut self, off: usize, len: usize) {
        self.used -= len;
        let (mut off, mut len) = (off, len);
        if let Some((&p, &plen)) = self.free.range(..off).next_back() {
            if p + plen == off {
                self.free.remove(&p);
                off = p;
                len += plen;
            }
        }
        if let Some(&nlen) = self.free.get(&(off + len)) {
            self.free.remove(&(off + len));
            len += nlen;
        }
        self.free.insert(off, len);
    }
}

/// One rank's own shared heap.
pub struct Heap {
    map: MmapRaw,
    // Kept open for the heap's lifetime: peers open it by this descriptor's number.
    file: File,
    cap: usize,
    nonce: u64,
    arena: Mutex<Arena>,
}

impl std::fmt::Debug for Heap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Heap").field("fd", &self.file.as_raw_fd()).field("cap", &self.cap).finish()
    }
}

fn header_words(map: &MmapRaw) -> *mut u64 {
    map.as_mut_ptr().cast::<u64>()
}

impl Heap {
    /// Creates a heap of `cap` bytes (rounded up to pages; the first page is the header).
    /// The memory file is sparse: pages are allocated as blocks are first written.
    ///
    /// # Errors
    /// `memfd_create`, `ftruncate`, sealing or mapping failed (for example a kernel without
    /// memfd); `cap` too small for one block.
    pub fn create(cap: usize) -> Result<Arc<Heap>> {
        let cap = cap.checked_next_multiple_of(4096).filter(|&c| c > HEADER && c <= isize::MAX as usize / 2);
        let cap = cap.ok_or_else(|| Error::InvalidArgument("shared heap capacity out of range".into()))?;
        // SAFETY: a NUL-terminated name and valid flags; the result is checked below.
        let fd = unsafe { libc::memfd_create(c"tmpi-heap".as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
        if fd < 0 {
            return Err(Error::last_os("memfd_create (shared heap)"));
        }
        // SAFETY: `fd` was just returned by memfd_create and is owned by nothing else.
        let file = unsafe { File::from_raw_fd(fd) };
        file.set_len(cap as u64).map_err(|e| Error::Io { op: "ftruncate (shared heap)".into(), source: e })?;
        // SAFETY: fcntl on a descriptor we own, with integer arguments.
        if unsafe { libc::fcntl(fd, libc::F_ADD_SEALS, libc::F_SEAL_SHRINK | libc::F_SEAL_SEAL) } < 0 {
            return Err(Error::last_os("F_ADD_SEALS (shared heap)"));
        }
        let map = MmapOptions::new().len(cap).map_raw(&file).map_err(|e| Error::Io { op: "mmap (shared heap)".into(), source: e })?;
        let mut nb = [0u8; 8];
        getrandom::getrandom(&mut nb).map_err(|e| Error::InvalidArgument(format!("no random nonce for the shared heap: {e}")))?;
        let nonce = u64::from_ne_bytes(nb) | 1;
        let h = header_words(&map);
        // SAFETY: the mapping is `cap` > 4096 bytes long, page-aligned and writable; nobody
        // else can map the file before this function returns (peers learn its fd from grants).
        unsafe {
            h.write(MAGIC);
            h.add(1).write(VERSION);
            h.add(2).write(nonce);
            h.add(3).write(cap as u64);
            h.add(4).write(map.as_ptr() as u64);
        }
        Ok(Arc::new(Heap { map, file, cap, nonce, arena: Mutex::new(Arena::new(cap)) }))
    }

    /// Capacity in bytes, header included.
    pub fn capacity(&self) -> usize {
        self.cap
    }

    /// Bytes handed out in live blocks.
    pub fn used(&self) -> usize {
        self.arena.lock().map_or(0, |a| a.used)
    }

    /// What a peer needs to map this heap.
    pub fn desc(&self) -> HeapDesc {
        HeapDesc { fd: self.file.as_raw_fd() as u32, nonce: self.nonce }
    }

    /// Offset in the heap of `[addr, addr + len)` if that range lies inside its blocks area.
    #[inline]
    pub fn locate(&self, addr: usize, len: usize) -> Option<u64> {
        let base = self.map.as_ptr() as usize;
        let off = addr.checked_sub(base)?;
        (off >= HEADER && off.checked_add(len)? <= self.cap).then_some(off as u64)
    }

    /// A zeroed block of `len` bytes aligned to `align` (a power of two, at most 4096), or
    /// `None` when no free range fits. A zero `len` takes [`MIN_ALIGN`] bytes.
    pub fn alloc(self: &Arc<Self>, len: usize, align: usize) -> Option<Block> {
        if !align.is_power_of_two() || align > 4096 {
            return None;
        }
        let align = align.max(if len >= 4096 { 4096 } else { MIN_ALIGN });
        let size = len.max(1).checked_next_multiple_of(MIN_ALIGN)?;
        let mut a = self.arena.lock().ok()?;
        let off = a.alloc(size, align)?;
        let dirty = a.dirty_end.min(off + size).saturating_sub(off);
        a.dirty_end = a.dirty_end.max(off + size);
        drop(a);
        if dirty > 0 {
            // SAFETY: [off, off + dirty) lies inside the mapping (the arena hands out ranges
            // of [HEADER, cap)) and belongs to the block just taken, which nothing else
            // references yet; a freed block is never lent to a peer any more.
            unsafe { std::ptr::write_bytes(self.map.as_mut_ptr().add(off), 0, dirty) };
        }
        Some(Block { heap: Arc::clone(self), off, size, len })
    }
}

/// A block of a [`Heap`], owned: it returns to the heap's free list on drop. Its memory stays
/// mapped as long as the heap (which the block keeps alive).
pub struct Block {
    heap: Arc<Heap>,
    off: usize,
    size: usize,
    len: usize,
}

impl std::fmt::Debug for Block {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Block").field("off", &self.off).field("len", &self.len).finish()
    }
}

// SAFETY: a Block is an exclusively owned range of a mapping that lives as long as the heap
// it holds an Arc of; the free list it returns to on drop is behind a Mutex.
unsafe impl Send for Block {}
// SAFETY: shared access only reads (`as_bytes`); writing needs `&mut Block`.
unsafe impl Sync for Block {}

impl Block {
    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the block is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Offset of the block in its heap.
    pub fn offset(&self) -> usize {
        self.off
    }

    /// The heap the block belongs to.
    pub fn heap(&self) -> &Arc<Heap> {
        &self.heap
    }

    /// The bytes of the block.
    pub fn as_bytes(&self) -> &[u8] {
        // SAFETY: [off, off + len) is inside the live mapping and owned by this block alone;
        // a peer writes into it only while the runtime has lent it for a receive, which
        // needs `&mut` of the block for the whole operation (so no `&[u8]` exists then).
        unsafe { std::slice::from_raw_parts(self.heap.map.as_ptr().add(self.off), self.len) }
    }

    /// The bytes of the block, writable.
    pub fn as_bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_bytes`, and `&mut self` makes the borrow exclusive; peers only read
        // the block while a send has lent it (a shared borrow for the whole operation).
        unsafe { std::slice::from_raw_parts_mut(self.heap.map.as_mut_ptr().add(self.off), self.len) }
    }
}

impl Drop for Block {
    fn drop(&mut self) {
        if let Ok(mut a) = self.heap.arena.lock() {
            a.free(self.off, self.size);
        }
    }
}

/// A peer's heap, mapped into this process.
pub struct PeerHeap {
    map: MmapRaw,
    desc: HeapDesc,
    /// Where the owner mapped the heap in its own address space (from the header).
    owner_base: u64,
}

impl std::fmt::Debug for PeerHeap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeerHeap").field("len", &self.map.len()).finish()
    }
}

impl PeerHeap {
    /// Maps the heap that process `pid` described with `desc`. The file must be sealed against
    /// shrinking, as long as its header says, and carry the nonce of `desc`.
    ///
    /// # Errors
    /// The file cannot be opened (no such process or descriptor, no permission), is not a
    /// sealed tmpi heap, or is another heap than `desc` names.
    pub fn open(pid: u32, desc: HeapDesc) -> Result<PeerHeap> {
        let path = format!("/proc/{pid}/fd/{}", desc.fd);
        let bad = |what: &str| Error::ShmLayout { name: path.clone(), what: what.into() };
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_CLOEXEC)
            .open(&path)
            .map_err(|e| Error::Io { op: format!("open {path}"), source: e })?;
        // SAFETY: fcntl on a descriptor we own.
        let seals = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GET_SEALS) };
        if seals < 0 || seals & libc::F_SEAL_SHRINK == 0 {
            return Err(bad("not a memory file sealed against shrinking"));
        }
        let len = file.metadata().map_err(|e| Error::Io { op: format!("fstat {path}"), source: e })?.len();
        let len = usize::try_from(len).map_err(|_| bad("size out of range"))?;
        if len <= HEADER || len % 4096 != 0 {
            return Err(bad("size is not a heap's"));
        }
        let map = MmapOptions::new().len(len).map_raw(&file).map_err(|e| Error::Io { op: format!("mmap {path}"), source: e })?;
        let h = header_words(&map);
        // SAFETY: the mapping is at least one page long (checked), and the file cannot shrink
        // below its current size (sealed), so the header words are readable; the owner wrote
        // them before the descriptor was ever named to a peer.
        let (magic, version, nonce, cap, owner_base) =
            unsafe { (h.read(), h.add(1).read(), h.add(2).read(), h.add(3).read(), h.add(4).read()) };
        if magic != MAGIC || version != VERSION {
            return Err(bad("not a tmpi shared heap"));
        }
        if nonce != desc.nonce || cap != len as u64 {
            return Err(bad("another heap than the one granted"));
        }
        Ok(PeerHeap { map, desc, owner_base })
    }

    /// The offset in this heap of the owner's address range `[va, va + len)`, if it lies
    /// inside the blocks area (the owner wrote where it mapped the heap in the header; an
    /// owner that lied only names other offsets of its own heap, which [`PeerHeap::read`]
    /// checks like any other).
    pub fn offset_of(&self, va: u64, len: usize) -> Option<u64> {
        let off = va.checked_sub(self.owner_base)?;
        (off >= HEADER as u64 && off.checked_add(len as u64)? <= self.map.len() as u64).then_some(off)
    }

    /// The descriptor this heap was mapped by.
    pub fn desc(&self) -> HeapDesc {
        self.desc
    }

    /// The nonce of the mapped heap.
    pub fn nonce(&self) -> u64 {
        self.desc.nonce
    }

    fn range(&self, off: u64, len: usize) -> Result<usize> {
        let off = usize::try_from(off).ok().filter(|&o| o >= HEADER && o.checked_add(len).is_some_and(|e| e <= self.map.len()));
        off.ok_or_else(|| Error::InvalidArgument("range outside the peer's shared heap".into()))
    }

    /// Copies `dst.len()` bytes at offset `off` of the peer's heap into `dst`; with
    /// `streaming`, with non-temporal stores ([`super::copy_streaming`], for transfers far
    /// larger than the cache).
    ///
    /// # Errors
    /// The range is not inside the heap's blocks area (nothing is copied).
    pub fn read(&self, off: u64, dst: &mut [u8], streaming: bool) -> Result<()> {
        let off = self.range(off, dst.len())?;
        // SAFETY: [off, off + len) is inside the mapping (checked) of a file that cannot
        // shrink, so it is readable; `dst` is a live exclusive slice of this process, which
        // cannot overlap a peer's heap mapping handed out only here.
        unsafe {
            let from = self.map.as_ptr().add(off);
            if streaming {
                super::copy_streaming_raw(dst.as_mut_ptr(), from, dst.len());
            } else {
                std::ptr::copy_nonoverlapping(from, dst.as_mut_ptr(), dst.len());
            }
        }
        Ok(())
    }

    /// Copies `src` to offset `off` of the peer's heap; with `streaming`, with non-temporal
    /// stores, as [`PeerHeap::read`].
    ///
    /// # Safety
    /// The peer must have lent `[off, off + src.len())` for this write (for tmpi: the
    /// receive buffer of a rendezvous read it asked this rank to write), so that nothing in
    /// that process reads or writes it meanwhile.
    ///
    /// # Errors
    /// The range is not inside the heap's blocks area (nothing is copied).
    pub unsafe fn write(&self, off: u64, src: &[u8], streaming: bool) -> Result<()> {
        let off = self.range(off, src.len())?;
        // SAFETY: the range is inside the mapping (checked) and lent by the peer (caller);
        // `src` is memory of this process outside that mapping's blocks lent to us.
        unsafe {
            let to = self.map.as_mut_ptr().add(off);
            if streaming {
                super::copy_streaming_raw(to, src.as_ptr(), src.len());
            } else {
                std::ptr::copy_nonoverlapping(src.as_ptr(), to, src.len());
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arena_first_fit_and_coalescing() {
        let mut a = Arena::new(HEADER + (1 << 20));
        let x = a.alloc(4096, 4096).unwrap();
        let y = a.alloc(100, 64).unwrap();
        let z = a.alloc(8192, 4096).unwrap();
        assert_eq!(x, HEADER);
        assert!(y >= x + 4096 && z % 4096 == 0 && z >= y + 100);
        a.free(y, 100);
        a.free(x, 4096);
        a.free(z, 8192);
        assert_eq!(a.used, 0);
        assert_eq!(a.free.len(), 1, "{:?}", a.free);
        assert!(a.alloc(2 << 20, 64).is_none());
    }

    #[test]
    fn blocks_are_zeroed_reused_and_mapped_by_a_peer() {
        let h = match Heap::create(1 << 20) {
            Ok(h) => h,
            Err(e) => {
                eprintln!("no memfd here: {e}");
                return;
            }
        };
        let mut b = h.alloc(10000, 8).unwrap();
        assert!(b.as_bytes().iter().all(|&x| x == 0));
        b.as_bytes_mut().fill(7);
        let (addr, off) = (b.as_bytes().as_ptr() as usize, b.offset());
        assert_eq!(h.locate(addr, 10000), Some(off as u64));
        assert_eq!(h.locate(addr, 1 << 20), None);
        let p = match PeerHeap::open(std::process::id(), h.desc()) {
            Ok(p) => p,
            Err(e) => {
                eprintln!("cannot open own /proc fd: {e}");
                return;
            }
        };
        // The owner's addresses translate to offsets of the mapping.
        assert_eq!(p.offset_of(addr as u64, 10000), Some(off as u64));
        assert_eq!(p.offset_of(addr as u64 - off as u64, 10), None, "the header is not a block");
        assert_eq!(p.offset_of(addr as u64, 1 << 20), None, "past the end");
        assert_eq!(p.offset_of(0, 10), None);
        for streaming in [false, true] {
            let mut got = vec![0u8; 10000];
            p.read(off as u64, &mut got, streaming).unwrap();
            assert!(got.iter().all(|&x| x == 7));
            assert!(p.read(0, &mut got, streaming).is_err(), "the header is not a block");
            assert!(p.read((1 << 20) - 10, &mut got, streaming).is_err());
        }
        // Writes through the peer's mapping, plain and streaming, at odd offsets and lengths
        // (head, body and tail of the streaming copy).
        let pattern: Vec<u8> = (0..9999u32).map(|i| (i % 251) as u8).collect();
        for (streaming, at) in [(false, 1usize), (true, 3)] {
            // SAFETY: the block is ours, and nothing reads or writes it meanwhile.
            unsafe { p.write(off as u64 + at as u64, &pattern[..9990], streaming).unwrap() };
            assert_eq!(&b.as_bytes()[at..at + 9990], &pattern[..9990]);
            // SAFETY: as above; the range is refused before anything is copied.
            assert!(unsafe { p.write((1 << 20) - 10, &pattern, streaming) }.is_err());
        }
        drop(b);
        // The same range again, zeroed.
        let b = h.alloc(10000, 8).unwrap();
        assert_eq!(b.offset(), off);
        assert!(b.as_bytes().iter().all(|&x| x == 0));
        assert!(PeerHeap::open(std::process::id(), HeapDesc { nonce: h.nonce ^ 2, ..h.desc() }).is_err());
        assert!(PeerHeap::open(std::process::id(), HeapDesc { fd: 0, ..h.desc() }).is_err());
        assert!(h.alloc(2 << 20, 8).is_none());
    }
}
