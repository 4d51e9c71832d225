//! The job's shared-memory segment: a file in `/dev/shm`, mode 0600, mapped by every rank.
//!
//! ```text
//! offset 0                 SegHeader (128 bytes: magic, version, geometry, ready flag)
//! offset 128               RankCtl[nranks] (128 bytes each: pid, departure, doorbell)
//! coll_off                 COLL_CONTEXTS collective contexts (see below)
//! rings_off (128-aligned)  pair layout (ring_size > 0): nranks * nranks rings, ring (dst, src)
//!                          at index dst * nranks + src, each a RingCtl (256 bytes) and ring_size
//!                          bytes of data;
//!                          queued layout (ring_size 0): one region per rank (its queue, see
//!                          [`super::inbox`])
//! pool_off (4096-aligned)  queued layout only: one pool of fragments per rank
//! ```
//!
//! Which layout: a job of up to `TMPI_SHM_PAIRS_MAX` ranks (64 by default) gets a ring per
//! ordered pair, sized by the runtime's `ring_size_for`, exactly as before the queued layout
//! existed; a larger one gets the queues, whose memory grows with the ranks, not their square
//! (see [`super::inbox`] and `bench/results/shm-scale.md`).
//!
//! A collective context serves the shared-memory collectives of one communicator at a time:
//! a `CollHdr` (allocation generation and reference count on one cache line; the leader's
//! release word (used when a leader combines) and two status words on the next), then for each of `min(nranks, COLL_MAX_RANKS)`
//! communicator ranks two slots (used by alternate collective calls), each a cache line of
//! header ([`SlotHdr`]: the rank's arrival word and three words of call description) and
//! [`COLL_SLOT_BYTES`] of data. Context 0 belongs to the world communicator for the whole job;
//! the others are taken and given back by communicators as they are created and dropped
//! ([`Segment::coll_alloc`], [`Segment::coll_free`]).
//!
//! The doorbell of a rank is a pair of words in its `RankCtl`: `sleeping`, set while the rank
//! is about to sleep or sleeps, and `bell`, the futex word it sleeps on. A rank that writes
//! something another rank waits for (a ring record, a collective flag) rings the bell only if
//! `sleeping` is set, so the common case costs one load.
//!
//! All positions are offsets from the start of the mapping, never pointers. The creator
//! writes the header and sets `ready` last (release); openers check magic, version, geometry
//! and the file size against the header before touching anything else.
//!
//! Memory is checked before it is promised: the creator compares the segment's whole size (in
//! the queued layout, with every fragment of every pool) with what the tmpfs, the host and the
//! memory cgroup can give ([`super::room`]), and a shortage is an error of
//! [`Segment::create`] naming the need and each bound. Memory is given with `posix_fallocate`
//! (where `ftruncate` alone would leave a sparse file that a full `/dev/shm` turns into SIGBUS
//! at the first touch of a missing page): in the pair layout every page of the file at start,
//! and every rank maps it with `MAP_POPULATE`, so the first messages of a run cost what the
//! later ones do (no page faults); in the queued layout everything before the pools at start,
//! and each fragment of a pool by its owner when it first needs it (`Segment::allocate_pool_range`),
//! so a job takes the memory its traffic uses.

use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::ptr::NonNull;

use memmap2::{MmapMut, MmapOptions};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use super::queue_layout::{self, POOL_BYTES};
use super::ring::{self, Consumer, Producer, RingCtl};
use super::room;
use crate::error::{Error, Result};

/// "TMPISHM\0" as a big-endian integer.
pub const MAGIC: u64 = u64::from_be_bytes(*b"TMPISHM\0");
/// Layout version; bump on any change of this file's layout or of the ring format.
pub const VERSION: u32 = 4;
/// `gone` value of a rank that detached without finalizing.
pub const GONE_DETACHED: u32 = 1;
/// `gone` value of a rank that finalized cleanly.
pub const GONE_FINALIZED: u32 = 2;
/// Largest job the segment layout accepts.
pub const MAX_RANKS: usize = 4096;

/// Start of the segment.
#[repr(C, align(128))]
struct SegHeader {
    magic: AtomicU64,
    version: u32,
    nranks: u32,
    ring_size: u64,
    rings_off: u64,
    total_len: u64,
    /// Set to 1 (release) by the creator once everything else is initialised.
    ready: AtomicU32,
    _pad0: u32,
    /// Start of the pools (queued layout), 0 in the pair layout.
    pool_off: u64,
    _pad: [u8; 72],
}

const _: () = assert!(std::mem::size_of::<SegHeader>() == 128);

/// Per-rank control block.
#[repr(C, align(128))]
struct RankCtl {
    /// Process id of the rank, written by that rank when it attaches.
    pid: AtomicU32,
    /// 0 while attached; [`GONE_FINALIZED`] once the rank finalized cleanly; otherwise
    /// [`GONE_DETACHED`] once it detached (its fabric was dropped). Written by that rank.
    gone: AtomicU32,
    /// Non-zero while the rank is about to sleep or sleeps on `bell`. Written by that rank.
    sleeping: AtomicU32,
    /// Futex word of the rank's doorbell: bumped by whoever wakes it.
    bell: AtomicU32,
    _pad: [u8; 112],
}

const _: () = assert!(std::mem::size_of::<RankCtl>() == 128);

const RING_STRIDE_HDR: usize = std::mem::size_of::<RingCtl>();

/// Collective contexts in a segment (context 0 is the world communicator's).
pub const COLL_CONTEXTS: usize = 16;
/// Largest communicator the shared-memory collectives serve (larger ones use point-to-point).
pub const COLL_MAX_RANKS: usize = 64;
/// Bytes of data in one collective slot: the largest payload of a shared-memory collective.
pub const COLL_SLOT_BYTES: usize = 4096;
/// `refs` of a context that is never given back (the world's).
const COLL_PERMANENT: u32 = u32::MAX;

/// Header of a collective context.
#[repr(C, align(128))]
struct CollHdr {
    /// Bumped each time the context is taken; goes into the high half of every flag value, so
    /// a flag left by an earlier user never equals one of the current user's.
    gen: AtomicU32,
    /// Members that still hold the context (0: free).
    refs: AtomicU32,
    _pad0: [u8; 120],
    /// The leader's release word: generation << 32 | sequence number of the last call it ended.
    release: AtomicU64,
    /// How the last call of each parity ended (written before `release`); its meaning is the
    /// runtime's. One per parity, so that ending a call never overwrites the outcome of the
    /// previous one, which a slow rank may still be about to read.
    status: [AtomicU64; 2],
    _pad1: [u8; 104],
}

const _: () = assert!(std::mem::size_of::<CollHdr>() == 256);

/// Header of one slot of a collective context.
#[repr(C, align(128))]
pub struct SlotHdr {
    /// The owner's arrival word: generation << 32 | sequence number of its last call.
    pub flag: AtomicU64,
    /// The owner's description of the call (written before `flag`); meaning is the runtime's.
    pub meta: [AtomicU64; 3],
    _pad: [u8; 96],
}

const _: () = assert!(std::mem::size_of::<SlotHdr>() == 128);

const SLOT_STRIDE: usize = std::mem::size_of::<SlotHdr>() + COLL_SLOT_BYTES;

/// Ranks with slots in each collective context.
fn coll_ranks_for(nranks: usize) -> usize {
    nranks.min(COLL_MAX_RANKS)
}

fn coll_ctx_stride(nranks: usize) -> usize {
    std::mem::size_of::<CollHdr>() + coll_ranks_for(nranks) * 2 * SLOT_STRIDE
}

/// A mapped segment.
pub struct Segment {
    base: NonNull<u8>,
    nranks: usize,
    ring_size: usize,
    rings_off: usize,
    pool_off: usize,
    path: String,
    /// The mapping (unmapped when dropped); accessed only through `base`.
    _map: MmapMut,
    _file: File,
}

// SAFETY: the mapping is process-wide memory; all shared fields are accessed atomically or
// through the ring protocol. Segment itself has no thread-affine state.
unsafe impl Send for Segment {}

/// Where the parts of a segment lie.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Geometry {
    /// Start of the rings (pair layout) or of the queue regions (queued layout).
    rings_off: usize,
    /// Start of the pools (queued layout), 0 in the pair layout.
    pool_off: usize,
    /// Bytes of the whole file.
    total: usize,
    /// Bytes at the start of the file given memory at creation.
    eager: usize,
}

/// `ring_size` of a segment with the queued layout (no rings).
pub const QUEUED: usize = 0;

fn geometry(nranks: usize, ring_size: usize) -> Result<Geometry> {
    if nranks == 0 || nranks > MAX_RANKS {
        return Err(Error::InvalidArgument(format!("{nranks} ranks: shm supports 1..={MAX_RANKS}")));
    }
    if ring_size != QUEUED && (!ring_size.is_power_of_two() || !(4096..=(1 << 30)).contains(&ring_size)) {
        return Err(Error::InvalidArgument(format!("ring size {ring_size}: must be a power of two from 4096 to 1 GiB")));
    }
    let coll_off = 128 + nranks * 128;
    let rings_off = (coll_off + COLL_CONTEXTS * coll_ctx_stride(nranks)).next_multiple_of(128);
    let overflow = || Error::InvalidArgument("shm segment size overflows".into());
    if ring_size == QUEUED {
        let pool_off = (rings_off + nranks * queue_layout::region_bytes(nranks)).next_multiple_of(4096);
        let total = nranks.checked_mul(POOL_BYTES).and_then(|p| p.checked_add(pool_off)).ok_or_else(overflow)?;
        return Ok(Geometry { rings_off, pool_off, total, eager: pool_off });
    }
    let total = nranks
        .checked_mul(nranks)
        .and_then(|r| r.checked_mul(RING_STRIDE_HDR + ring_size))
        .and_then(|r| r.checked_add(rings_off))
        .ok_or_else(overflow)?;
    Ok(Geometry { rings_off, pool_off: 0, total, eager: total })
}

/// Bytes of the segment of a job of `nranks` ranks with rings of `ring_size` bytes
/// ([`QUEUED`]: the queued layout, every fragment counted): what [`Segment::create`] checks
/// against the memory that can be had.
///
/// # Errors
/// Bad geometry.
pub fn segment_bytes(nranks: usize, ring_size: usize) -> Result<u64> {
    geometry(nranks, ring_size).map(|g| g.total as u64)
}

fn shm_path(name: &str) -> Result<String> {
    if name.is_empty() || name.len() > 200 || name.contains('/') || name.starts_with('.') {
        return Err(Error::InvalidArgument(format!("invalid shm segment name {name:?}")));
    }
    Ok(format!("/dev/shm/{name}"))
}

/// Gives bytes `off..off + len` of `file` real storage, so that no later touch of the mapping
/// there can fail for want of memory.
fn allocate(file: &File, off: usize, len: usize, path: &str) -> Result<()> {
    let (Ok(o), Ok(l)) = (libc::off_t::try_from(off), libc::off_t::try_from(len)) else {
        return Err(Error::InvalidArgument(format!("shm segment of {} bytes is too large", off.saturating_add(len))));
    };
    loop {
        // SAFETY: plain system call on a descriptor we own; no pointers.
        let rc = unsafe { libc::posix_fallocate(file.as_raw_fd(), o, l) };
        match rc {
            0 => return Ok(()),
            libc::EINTR => continue,
            libc::ENOSPC | libc::EFBIG => {
                let dir = path.rsplit_once('/').map_or("/dev/shm", |(d, _)| d);
                let free = room::free_bytes(dir).map_or_else(|| "an unknown number of bytes".to_string(), |f| format!("{f} bytes"));
                return Err(Error::Io {
                    op: format!(
                        "allocate the shared-memory segment {path}: it needs {len} bytes more but {dir} has {free} free \
                         (enlarge {dir}, e.g. `docker run --shm-size=...`, or lower TMPI_SHM_RING_SIZE)"
                    ),
                    source: std::io::Error::from_raw_os_error(rc),
                });
            }
            // Not supported by the file system (not tmpfs): the ftruncate'd size stands.
            libc::EOPNOTSUPP | libc::ENODEV => return Ok(()),
            e => return Err(Error::Io { op: format!("allocate {len} bytes for {path}"), source: std::io::Error::from_raw_os_error(e) }),
        }
    }
}

fn map(file: &File, len: usize, path: &str, populate: bool) -> Result<(MmapMut, NonNull<u8>)> {
    // SAFETY: a shared read-write mapping of a regular file we opened read-write, sized to at
    // least `len` bytes before this call (posix_fallocate/ftruncate), placed where the kernel
    // chooses, so no existing memory is affected. memmap2's own condition, that nothing
    // modifies the file while Rust references to its bytes exist, is kept by never forming
    // one from the map (it is not dereferenced as a slice): other ranks write the segment
    // concurrently, so every access goes through the raw `base` pointer with atomics or the
    // ring protocol. `populate` (MAP_POPULATE) only pre-faults the pages (a failure to do so
    // is not an error: they fault in later as usual).
    let mut map = unsafe {
        let mut o = MmapOptions::new();
        o.len(len);
        if populate {
            o.populate();
        }
        o.map_mut(file)
    }
    .map_err(|e| Error::Io { op: format!("mmap {path}"), source: e })?;
    let base = NonNull::new(map.as_mut_ptr()).ok_or_else(|| Error::InvalidArgument(format!("mmap {path}: null mapping")))?;
    Ok((map, base))
}

impl Segment {
    /// Creates and initialises the segment file (fails if it exists).
    ///
    /// # Errors
    /// Bad geometry, or the file cannot be created, sized or mapped.
    pub fn create(name: &str, nranks: usize, ring_size: usize) -> Result<Self> {
        let path = shm_path(name)?;
        let g = geometry(nranks, ring_size)?;
        let dir = path.rsplit_once('/').map_or("/dev/shm", |(d, _)| d);
        room::check(&path, g.total as u64, nranks, &room::bounds(dir)?)?;
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .map_err(|e| Error::Io { op: format!("create {path}"), source: e })?;
        let cleanup = |e: Error| {
            let _ = std::fs::remove_file(&path);
            e
        };
        allocate(&file, 0, g.eager, &path).map_err(cleanup)?;
        file.set_len(g.total as u64).map_err(|e| cleanup(Error::Io { op: format!("size {path} to {} bytes", g.total), source: e }))?;
        let (map, base) = map(&file, g.total, &path, g.pool_off == 0).map_err(cleanup)?;
        let seg = Segment { base, nranks, ring_size, rings_off: g.rings_off, pool_off: g.pool_off, path, _map: map, _file: file };
        // The world communicator's collective context is taken for the whole job (before
        // `ready`, so every opener sees it).
        let world = seg.coll_hdr(0);
        world.gen.store(1, Ordering::Relaxed);
        world.refs.store(COLL_PERMANENT, Ordering::Relaxed);
        // SAFETY: the mapping starts with room for a SegHeader (total > 128), is 4096-aligned,
        // zero-filled (posix_fallocate, ftruncate), and nobody else uses it before `ready` is
        // set.
        let h = unsafe { &mut *seg.base.as_ptr().cast::<SegHeader>() };
        h.version = VERSION;
        h.nranks = nranks as u32;
        h.ring_size = ring_size as u64;
        h.rings_off = g.rings_off as u64;
        h.pool_off = g.pool_off as u64;
        h.total_len = g.total as u64;
        h.magic.store(MAGIC, Ordering::Relaxed);
        h.ready.store(1, Ordering::Release);
        Ok(seg)
    }

    /// Opens a segment created by [`Segment::create`] and checks it.
    ///
    /// # Errors
    /// The file is missing or not a segment of this build (magic, version, size) or of a job
    /// of `nranks` ranks.
    pub fn open(name: &str, nranks: usize) -> Result<Self> {
        let path = shm_path(name)?;
        let file =
            OpenOptions::new().read(true).write(true).open(&path).map_err(|e| Error::Io { op: format!("open {path}"), source: e })?;
        let flen = file.metadata().map_err(|e| Error::Io { op: format!("stat {path}"), source: e })?.len() as usize;
        let bad = |what: String| Error::ShmLayout { name: name.to_string(), what };
        if flen < std::mem::size_of::<SegHeader>() {
            return Err(bad(format!("file has {flen} bytes, less than a header")));
        }
        // Mapped without MAP_POPULATE until the layout is known: populating the unallocated
        // pools of the queued layout would allocate them.
        let (first, base) = map(&file, flen, &path, false)?;
        let mut seg = Segment { base, nranks: 0, ring_size: 0, rings_off: 0, pool_off: 0, path, _map: first, _file: file };
        // SAFETY: the mapping holds at least a SegHeader (checked above); fields other than the
        // atomics are written by the creator before its release store of `ready`.
        let h = unsafe { &*seg.base.as_ptr().cast::<SegHeader>() };
        if h.ready.load(Ordering::Acquire) != 1 {
            return Err(bad("segment not initialised yet".into()));
        }
        if h.magic.load(Ordering::Relaxed) != MAGIC {
            return Err(bad("bad magic".into()));
        }
        if h.version != VERSION {
            return Err(bad(format!("layout version {} but this build speaks {VERSION}", h.version)));
        }
        if h.nranks as usize != nranks {
            return Err(bad(format!("segment is for {} ranks, job has {nranks}", h.nranks)));
        }
        let ring_size = h.ring_size as usize;
        let g = geometry(nranks, ring_size).map_err(|e| bad(e.to_string()))?;
        if g.rings_off as u64 != h.rings_off || g.pool_off as u64 != h.pool_off || g.total as u64 != h.total_len || g.total != flen {
            return Err(bad("geometry in header does not match the file".into()));
        }
        if ring_size != QUEUED {
            // The pair layout: every page was allocated at creation; map it again, populated.
            let (populated, base) = map(&seg._file, flen, &seg.path, true)?;
            (seg._map, seg.base) = (populated, base);
        }
        seg.nranks = nranks;
        seg.ring_size = ring_size;
        seg.rings_off = g.rings_off;
        seg.pool_off = g.pool_off;
        Ok(seg)
    }

    /// Number of ranks the segment was made for.
    pub fn nranks(&self) -> usize {
        self.nranks
    }

    /// Largest payload of one ring record, or of one packet of the queued layout.
    pub fn max_record_payload(&self) -> usize {
        if self.queued() {
            queue_layout::LARGE_FRAG
        } else {
            ring::max_payload(self.ring_size)
        }
    }

    /// Whether the segment has the queued layout (a queue per rank, no rings).
    pub fn queued(&self) -> bool {
        self.ring_size == QUEUED
    }

    /// Bytes of the file that have memory behind them (its allocated blocks): what the job's
    /// shared memory takes now.
    ///
    /// # Errors
    /// `fstat` failed.
    pub fn allocated_bytes(&self) -> Result<u64> {
        use std::os::unix::fs::MetadataExt;
        let m = self._file.metadata().map_err(|e| Error::Io { op: format!("stat {}", self.path), source: e })?;
        Ok(m.blocks() * 512)
    }

    /// The queue regions and the pools of the queued layout.
    pub(crate) fn queue_areas(&self) -> (NonNull<u8>, NonNull<u8>) {
        debug_assert!(self.queued());
        // SAFETY: both offsets lie inside the mapping (geometry), which is not null.
        unsafe {
            (NonNull::new_unchecked(self.base.as_ptr().add(self.rings_off)), NonNull::new_unchecked(self.base.as_ptr().add(self.pool_off)))
        }
    }

    /// Gives memory to bytes `off..off + len` of `rank`'s pool (queued layout).
    ///
    /// # Errors
    /// The range is outside the pool, or the memory cannot be had.
    pub(crate) fn allocate_pool_range(&self, rank: usize, off: usize, len: usize) -> Result<()> {
        if !self.queued() || rank >= self.nranks || off.checked_add(len).is_none_or(|e| e > POOL_BYTES) {
            return Err(Error::InvalidArgument(format!("pool range {off}+{len} of rank {rank}")));
        }
        allocate(&self._file, self.pool_off + rank * POOL_BYTES + off, len, &self.path)
    }

    fn ring_ctl(&self, dst: usize, src: usize) -> NonNull<RingCtl> {
        assert!(dst < self.nranks && src < self.nranks, "ring index out of range");
        let off = self.rings_off + (dst * self.nranks + src) * (RING_STRIDE_HDR + self.ring_size);
        // SAFETY: off + stride <= len by the geometry check; 128-aligned as RingCtl requires.
        unsafe { NonNull::new_unchecked(self.base.as_ptr().add(off).cast::<RingCtl>()) }
    }

    /// The first word of the data area of the ring from `src` to `dst` (tests corrupt a
    /// record header through it).
    #[cfg(test)]
    pub(crate) fn ring_first_word(&self, src: usize, dst: usize) -> &AtomicU64 {
        // SAFETY: the ring's data area follows its RingCtl inside the mapping, which lives as
        // long as `self`; it is 8-aligned (RingCtl is 128-aligned and 256 bytes), and record
        // headers are only ever accessed atomically.
        unsafe { &*self.ring_ctl(dst, src).as_ptr().add(1).cast::<AtomicU64>() }
    }

    /// The producing end of the ring from `src` to `dst`. Call once per ring per job.
    pub(crate) fn producer(&self, src: usize, dst: usize) -> Producer {
        // SAFETY: ring_ctl points at a RingCtl followed by ring_size bytes inside the mapping,
        // which the fabric keeps alive as long as the producer; only `src` produces into it.
        unsafe { Producer::new(self.ring_ctl(dst, src), self.ring_size) }
    }

    /// The consuming end of the ring from `src` to `dst`. Call once per ring per job.
    pub(crate) fn consumer(&self, src: usize, dst: usize) -> Consumer {
        // SAFETY: as for `producer`; only `dst` consumes from it.
        unsafe { Consumer::new(self.ring_ctl(dst, src), self.ring_size) }
    }

    fn rank_ctl(&self, rank: usize) -> &RankCtl {
        assert!(rank < self.nranks, "rank out of range");
        // SAFETY: rank control blocks follow the header inside the mapping; only atomics in it.
        unsafe { &*self.base.as_ptr().add(128 + rank * 128).cast::<RankCtl>() }
    }

    /// Records the process id of `rank`.
    pub fn set_pid(&self, rank: usize, pid: u32) {
        self.rank_ctl(rank).pid.store(pid, Ordering::Release);
    }

    /// The process id `rank` recorded (0 if none yet).
    pub fn pid(&self, rank: usize) -> u32 {
        self.rank_ctl(rank).pid.load(Ordering::Acquire)
    }

    /// Records how `rank` left ([`GONE_DETACHED`] does not overwrite [`GONE_FINALIZED`]).
    pub fn set_gone(&self, rank: usize, how: u32) {
        let g = &self.rank_ctl(rank).gone;
        if how == GONE_FINALIZED {
            g.store(how, Ordering::Release);
        } else {
            let _ = g.compare_exchange(0, how, Ordering::AcqRel, Ordering::Acquire);
        }
    }

    /// How `rank` left: 0 (still attached), [`GONE_DETACHED`] or [`GONE_FINALIZED`].
    pub fn gone(&self, rank: usize) -> u32 {
        self.rank_ctl(rank).gone.load(Ordering::Acquire)
    }

    /// `rank`'s doorbell: its `sleeping` word and its futex word.
    pub fn doorbell(&self, rank: usize) -> (&AtomicU32, &AtomicU32) {
        let c = self.rank_ctl(rank);
        (&c.sleeping, &c.bell)
    }

    /// Communicator ranks with slots in each collective context.
    pub fn coll_ranks(&self) -> usize {
        coll_ranks_for(self.nranks)
    }

    fn coll_hdr(&self, ctx: usize) -> &CollHdr {
        assert!(ctx < COLL_CONTEXTS, "collective context out of range");
        let off = 128 + self.nranks * 128 + ctx * coll_ctx_stride(self.nranks);
        // SAFETY: the contexts lie between the rank control blocks and the rings (geometry),
        // 128-aligned; a CollHdr holds only atomics and padding.
        unsafe { &*self.base.as_ptr().add(off).cast::<CollHdr>() }
    }

    /// Generation of the world communicator's context (0), taken for the whole job.
    pub fn coll_world_gen(&self) -> u32 {
        self.coll_hdr(0).gen.load(Ordering::Acquire)
    }

    /// Takes a free collective context for a communicator of `members` ranks (at most
    /// [`Segment::coll_ranks`]); returns it and its new generation (never 0), or `None` when
    /// every context is in use.
    pub fn coll_alloc(&self, members: usize) -> Option<(usize, u32)> {
        if members == 0 || members > self.coll_ranks() {
            return None;
        }
        for ctx in 1..COLL_CONTEXTS {
            let h = self.coll_hdr(ctx);
            if h.refs.compare_exchange(0, members as u32, Ordering::AcqRel, Ordering::Relaxed).is_ok() {
                let mut gen = h.gen.fetch_add(1, Ordering::AcqRel).wrapping_add(1);
                if gen == 0 {
                    gen = h.gen.fetch_add(1, Ordering::AcqRel).wrapping_add(1);
                }
                return Some((ctx, gen));
            }
        }
        None
    }

    /// One member gives context `ctx` back; the last one frees it.
    pub fn coll_free(&self, ctx: usize) {
        if ctx == 0 || ctx >= COLL_CONTEXTS {
            return;
        }
        let _ = self.coll_hdr(ctx).refs.fetch_update(Ordering::AcqRel, Ordering::Relaxed, |r| match r {
            0 | COLL_PERMANENT => None,
            r => Some(r - 1),
        });
    }

    /// The leader's release word and status words (one per parity) of context `ctx`.
    pub fn coll_release(&self, ctx: usize) -> (&AtomicU64, &[AtomicU64; 2]) {
        let h = self.coll_hdr(ctx);
        (&h.release, &h.status)
    }

    fn slot_ptr(&self, ctx: usize, rank: usize, parity: usize) -> *mut u8 {
        assert!(rank < self.coll_ranks() && parity < 2, "collective slot out of range");
        let h: *const CollHdr = self.coll_hdr(ctx);
        // SAFETY: the slot lies inside its context (rank < coll_ranks, parity < 2), which lies
        // inside the mapping.
        unsafe { h.cast::<u8>().cast_mut().add(std::mem::size_of::<CollHdr>() + (rank * 2 + parity) * SLOT_STRIDE) }
    }

    /// Header of the slot of communicator rank `rank` for calls of parity `parity` in `ctx`.
    pub fn coll_slot(&self, ctx: usize, rank: usize, parity: usize) -> &SlotHdr {
        // SAFETY: slot_ptr is in bounds and 128-aligned; a SlotHdr holds atomics and padding.
        unsafe { &*self.slot_ptr(ctx, rank, parity).cast::<SlotHdr>() }
    }

    /// Copies `bytes` into the data of a slot (see [`Segment::coll_slot`]).
    ///
    /// # Errors
    /// `bytes` is longer than [`COLL_SLOT_BYTES`].
    pub fn coll_write(&self, ctx: usize, rank: usize, parity: usize, bytes: &[u8]) -> Result<()> {
        if bytes.len() > COLL_SLOT_BYTES {
            return Err(Error::InvalidArgument(format!("{} bytes do not fit a collective slot", bytes.len())));
        }
        let p = self.slot_ptr(ctx, rank, parity);
        // SAFETY: the data area (COLL_SLOT_BYTES after the header) is inside the mapping and
        // holds at least bytes.len() bytes; it is plain shared memory, which no Rust reference
        // covers (readers copy out of it or borrow it per `coll_data`'s contract), and it
        // cannot overlap `bytes`, which is process memory outside the mapping or a borrow that
        // `coll_data`'s caller promised not to hold while the slot is written.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), p.add(std::mem::size_of::<SlotHdr>()), bytes.len()) };
        Ok(())
    }

    /// The first `len` bytes of a slot's data (at most [`COLL_SLOT_BYTES`]; 128-aligned).
    ///
    /// # Safety
    /// No process may write the slot's data while the returned slice lives: the caller holds
    /// the protocol's guarantee that the owner does not (before it writes this slot again it
    /// waits until every reader is done with this call: the leader's release of it, or, where
    /// every rank reads every slot, every rank's arrival in the next call).
    #[inline]
    pub unsafe fn coll_data(&self, ctx: usize, rank: usize, parity: usize, len: usize) -> &[u8] {
        let p = self.slot_ptr(ctx, rank, parity);
        // SAFETY: in bounds (len clamped to the data area); not written while the slice lives
        // by the caller's contract.
        unsafe { std::slice::from_raw_parts(p.add(std::mem::size_of::<SlotHdr>()), len.min(COLL_SLOT_BYTES)) }
    }

    /// Removes the file name (the mapping stays).
    ///
    /// # Errors
    /// The unlink failed other than with ENOENT.
    pub fn unlink(&self) -> Result<()> {
        match std::fs::remove_file(&self.path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(Error::Io { op: format!("unlink {}", self.path), source: e }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name() -> String {
        let mut b = [0u8; 8];
        getrandom::getrandom(&mut b).unwrap();
        format!("tmpi-test-{}", b.iter().map(|x| format!("{x:02x}")).collect::<String>())
    }

    #[test]
    fn create_open_check() {
        let n = name();
        let s = Segment::create(&n, 3, 4096).unwrap();
        let meta = std::fs::metadata(format!("/dev/shm/{n}")).unwrap();
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        assert!(Segment::create(&n, 3, 4096).is_err(), "exclusive create");
        assert!(Segment::open(&n, 4).is_err(), "wrong job size refused");
        let o = Segment::open(&n, 3).unwrap();
        s.set_pid(2, 1234);
        assert_eq!(o.pid(2), 1234);
        s.unlink().unwrap();
        assert!(!std::path::Path::new(&format!("/dev/shm/{n}")).exists());
    }

    /// Size of the file system holding `dir`.
    fn size_bytes(dir: &str) -> Option<u64> {
        let c = std::ffi::CString::new(dir).ok()?;
        let mut st = std::mem::MaybeUninit::<libc::statvfs>::zeroed();
        // SAFETY: as in `free_bytes`.
        if unsafe { libc::statvfs(c.as_ptr(), st.as_mut_ptr()) } != 0 {
            return None;
        }
        // SAFETY: filled by statvfs.
        let st = unsafe { st.assume_init() };
        Some(st.f_blocks.saturating_mul(st.f_frsize))
    }

    #[test]
    fn pages_are_allocated_at_create() {
        let n = name();
        let s = Segment::create(&n, 2, 1 << 16).unwrap();
        let meta = std::fs::metadata(format!("/dev/shm/{n}")).unwrap();
        use std::os::unix::fs::MetadataExt;
        // Not a sparse file: every byte has storage behind it.
        assert!(meta.blocks() * 512 >= meta.len(), "{} blocks for {} bytes", meta.blocks(), meta.len());
        s.unlink().unwrap();
    }

    #[test]
    fn shortage_is_an_error_naming_the_sizes() {
        // Ask for more than the whole of /dev/shm (rings of 1 GiB: 4 GiB at 2 ranks, 9 at
        // 3...): tmpfs refuses that before allocating anything, so the test takes no memory.
        let total = size_bytes("/dev/shm").unwrap_or(u64::MAX);
        let ranks = (2..=64usize).find(|&r| (r * r) as u64 * (1 << 30) > total.saturating_add(1 << 30));
        let Some(ranks) = ranks else { return };
        let n = name();
        let e = Segment::create(&n, ranks, 1 << 30).err().expect("an impossible segment must be refused");
        let msg = e.to_string();
        assert!(!std::path::Path::new(&format!("/dev/shm/{n}")).exists(), "the failed segment was left behind");
        assert!(msg.contains("needs") && msg.contains("free") && msg.contains("/dev/shm"), "{msg}");
    }

    #[test]
    fn rejects_garbage_file() {
        let n = name();
        std::fs::write(format!("/dev/shm/{n}"), vec![0xabu8; 4096]).unwrap();
        let r = Segment::open(&n, 2);
        std::fs::remove_file(format!("/dev/shm/{n}")).unwrap();
        assert!(r.is_err());
        assert!(Segment::create("bad/name", 2, 4096).is_err());
        assert!(Segment::create(&name(), 2, 1000).is_err());
    }
}
