//! A lock-free single-producer/single-consumer ring of variable-size records in shared memory.
//!
//! Layout of one ring: a [`RingCtl`] (the producer's `head` and the consumer's `tail`, each on
//! its own pair of cache lines) followed by `size` bytes of data (`size` a power of two).
//!
//! A record starts on a 32-byte boundary and is padded to a multiple of 32 bytes. Its header
//! is one word when the packet is a whole message (its total length is its own length) and two
//! otherwise:
//!
//! ```text
//! word0 (atomic u64): stamp u32 << 32 | flags u8 << 24 | payload length (24 bits)
//! word1 (u64):        total length of the message the packet belongs to (only with FLAG_TOTAL)
//! payload
//! ```
//!
//! So a message of up to 8 bytes behind its 16-byte TMH fills half a cache line, and two of
//! them travel to the consumer in one line transfer (as Open MPI's fast boxes do, with 32-byte
//! slots and an 8-byte header).
//!
//! The stamp is derived from the record's position (`pos / 32 + 1`, wrapping, never 0), so the
//! consumer knows a record is new by its header alone: it polls one cache line that the producer
//! writes, and never reads `head`. Stale *payload* of an earlier lap could carry anything where
//! the next record will start, the right stamp included (a payload of counters easily does), so
//! the producer, before it publishes a record, zeroes the header slot where the next record will
//! start ("zero ahead"; the slot is part of the room a push needs). The consumer reads a header
//! slot only after the record before it, so it sees that zero or the new header, never stale
//! data; the very first slot is zero in a fresh segment. The consumer never writes into the
//! data area, so a line moves once from producer to consumer and back only as the producer's
//! next write. A record never wraps around the end: the producer writes the record at offset 0
//! (and zeroes ahead of it) before it publishes a skip record at the end.
//!
//! How far ahead the producer may run: a record that needs more than [`STREAM_SMALL`] bytes (header
//! and the slot zeroed ahead included) and less than a quarter of the ring and [`LARGE_RECORD`] is
//! started only while fewer than [`STREAM_WINDOW`] bytes are in flight. Without that, a window of
//! messages of 4-128 KiB fills the whole ring before the consumer catches up; the likely cost (a
//! reading, not a measurement of caches) is that the consumer then reads lines that have left the
//! producer's L2 (1 MiB per core here). `osu_bw` and `osu_bibw` at 32-128 KiB measured 1.1-1.4x
//! with the limit (bench/results/p2p-2026-11-25c.md). Records longer than the window are all of the
//! largest ([`LARGE_RECORD`]): they once were mid-size in rings over 1.5 MiB, and each then waited
//! for the one before it to be taken whole, producer and consumer taking turns (`osu_latency` 16-32
//! MiB, a lone stream in 512 KiB pieces through a 4 MiB ring, took 0.59-0.62x the time once one
//! could start behind another, bench/results/p2p-2026-11-27f.md). Small records (every small
//! message, every control packet) and the largest (streamed rendezvous data, whose pipelining needs
//! two of them in flight, and eager messages of [`LARGE_RECORD`] and up) are limited by the ring's
//! size alone.
//!
//! Records longer than a line: the consumer fetches all of a record's lines (up to 4 KiB) as
//! soon as it has read the header, and the producer, after such a record (up to 16 KiB), claims
//! the lines the next one will take (`prefetchw`), so that neither side waits for one line
//! transfer after another (`bench/results/p2p-2026-11-26.md`). Only for whole messages: a
//! packet of a longer message (a piece of a pipelined stream, the record that carries the total
//! length) gets neither. There the consumer copies out one piece while the producer copies in
//! the next, and the hardware prefetchers keep up with both; the claims and the fetch of a
//! whole piece at once only competed with those copies for the line transfers between the cores
//! (`osu_latency` 64-256 KiB in 16 KiB pieces: 1.48-2.5 against 2.1-6.9 us with them,
//! bench/results/p2p-2026-11-28.md, session 30). Unclaimed, a packet's lines are written by
//! `memcpy` (`super::copy_unclaimed`), not by the vector loop of small messages.
//!
//! Who writes what: `head` and records are written by the producer only; `tail` by the
//! consumer only. The producer publishes a record with a release store of `word0` after
//! writing `word1` and the payload; the consumer reads them after an acquire load of `word0`,
//! and publishes `tail` with a release store after it has finished reading the record.

use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::{Error, Result};

/// Records start on multiples of this.
pub const REC_ALIGN: u64 = 32;
/// Bytes of the longest record header (with the total length).
pub const REC_HDR: usize = 16;
/// Bytes of the header of a whole message (word0 alone).
const REC_HDR_SHORT: usize = 8;
/// Flag bit of a skip record (reserved to the ring).
const FLAG_SKIP: u8 = 0x80;
/// Flag bit of a record whose header holds the total length (reserved to the ring).
const FLAG_TOTAL: u8 = 0x40;
/// The flag bits the ring keeps for itself.
const FLAGS_RESERVED: u8 = FLAG_SKIP | FLAG_TOTAL;
/// Largest payload expressible in the header.
const MAX_LEN_FIELD: usize = (1 << 24) - 1;
/// Records of at most this many bytes are limited by the ring's size alone (see the module
/// docs on how far ahead the producer may run).
pub const STREAM_SMALL: u64 = 4096;
/// How far past the next record [`Consumer::prefetch_ahead`] fetches.
const PREFETCH_AHEAD: u64 = 256;
/// Bytes in flight (published, not yet released) below which a mid-size record may start.
pub const STREAM_WINDOW: u64 = 384 << 10;
/// A record of this many bytes or more (header and the slot zeroed ahead included) is one of
/// the largest even where that is less than a quarter of the ring: limited by the ring's size
/// alone, it may start behind any number of records in flight. In a 4 MiB ring, records of
/// 256-512 KiB limited to one in flight before them (a window of eager messages, as in
/// `osu_bw`) ran at two levels from run to run, with the same operations: 512 KiB at 47-51
/// or 15-21 GB/s, 256 KiB at 48-53 or 20-32; as the largest they moved 46-50 and 49-52 in
/// every run the host was quiet (`bench/results/p2p-2026-11-28.md`, session 33).
pub const LARGE_RECORD: u64 = 256 << 10;
// Every mid-size record is then shorter than the window (`Producer::stream_room_for`).
const _: () = assert!(LARGE_RECORD < STREAM_WINDOW);
/// In a ring larger than this, a record shorter than a quarter of the ring and [`LARGE_RECORD`]
/// that would start at or past this offset goes to offset 0 instead (behind a skip record, as at
/// the end of the ring) when few bytes are in flight (`Producer::rewinds`): small and mid-size
/// records cycle through the first [`HOT_SPAN`] bytes, which stay in the caches, and only the
/// largest (streamed rendezvous data) use the rest. A 4 MiB ring (the default up to 4 ranks, for
/// its 1 MiB packets) used whole by 16 KiB eager messages took `osu_bibw` 16 KiB 0.77x the bytes of
/// a 1 MiB ring (`bench/results/p2p-2026-11-27e.md`).
pub const HOT_SPAN: u64 = 1 << 20;

/// Records of whole messages of at most this many bytes (a 4 KiB eager message with its
/// headers) are fetched whole as soon as their header is seen (not packets of longer
/// messages, see the module docs). It was 16 KiB until the copies of 2-8 KiB went to vector
/// loops (`super::copy_bytes`); then the fetch of an 8 KiB message's 129 lines at once
/// measured slower than none: `osu_latency` 8 KiB 0.39-0.40 against 0.45-0.46 us, with
/// `osu_bw` and `osu_bibw` 8-16 KiB level (3 interleaved runs; without the fetch at 4 KiB
/// and below, `osu_bibw` 2 KiB ran 19-28 against 33-36 GB/s), bench/results/p2p-2026-11-28.md,
/// session 30.
const PREFETCH_RECORD_MAX: u64 = 4160;
/// Records of whole messages of at most this many bytes (a 16 KiB eager message with its
/// headers) make their producer claim the lines of the next one (see
/// [`Producer::claim_ahead`]; not packets of longer messages, see the module docs).
const CLAIM_RECORD_MAX: u64 = 16448;
/// How far past the next header slot [`Producer::claim_ahead`] claims lines at least (at most
/// a record's length).
const CLAIM_AHEAD: u64 = 256;

/// Whether this CPU has `prefetchw` (CPUID 0x8000_0001, ECX bit 8); read once.
fn has_prefetchw() -> bool {
    static HAS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *HAS.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            // Leaf 0x8000_0000 gives the highest extended leaf: 0x8000_0001 only where it exists.
            std::arch::x86_64::__cpuid(0x8000_0000).eax >= 0x8000_0001 && std::arch::x86_64::__cpuid(0x8000_0001).ecx & (1 << 8) != 0
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            false
        }
    })
}

/// Asks the CPU to fetch the cache line at `p` for reading.
#[inline(always)]
fn prefetch(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch never faults and changes nothing but the caches, whatever the address.
    unsafe {
        std::arch::x86_64::_mm_prefetch(p.cast::<i8>(), std::arch::x86_64::_MM_HINT_T0)
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// Control block of one ring.
#[repr(C, align(128))]
pub struct RingCtl {
    /// Bytes ever produced (monotonic). Written by the producer only.
    head: AtomicU64,
    _pad0: [u8; 120],
    /// Bytes ever consumed (monotonic). Written by the consumer only.
    tail: AtomicU64,
    _pad1: [u8; 120],
}

const _: () = assert!(std::mem::size_of::<RingCtl>() == 256);
const _: () = assert!(std::mem::align_of::<RingCtl>() == 128);

#[inline]
fn stamp(pos: u64) -> u32 {
    // Never 0: a zeroed slot is never a record.
    ((pos / REC_ALIGN) as u32).wrapping_add(1).max(1)
}

/// Bytes of a record of `payload` bytes, with the long header or the short one.
#[inline]
fn rec_len(payload: usize, long: bool) -> u64 {
    let hdr = if long { REC_HDR } else { REC_HDR_SHORT };
    (hdr as u64 + payload as u64).div_ceil(REC_ALIGN) * REC_ALIGN
}

/// Largest payload of one record for a ring of `size` bytes.
pub fn max_payload(size: usize) -> usize {
    (size / 4 - REC_HDR).min(MAX_LEN_FIELD)
}

/// The producing end of a ring.
pub struct Producer {
    ctl: NonNull<RingCtl>,
    data: NonNull<u8>,
    size: u64,
    /// Private copy of `head`.
    head: u64,
    /// Last `tail` read from the consumer; refreshed only when the ring looks full.
    tail_cache: u64,
    max_payload: usize,
    /// Whether [`Producer::claim_ahead`] runs (the CPU has `prefetchw`).
    claim: bool,
    /// Ring position up to which lines have been claimed.
    claimed_to: u64,
}

// SAFETY: a Producer is the only writer of its ring's head and records; the pointers stay
// valid while the segment mapping lives, which the fabric guarantees by owning both.
unsafe impl Send for Producer {}

impl Producer {
    /// # Safety
    /// `ctl` must point to an initialised `RingCtl` followed by `size` bytes of data, mapped for
    /// as long as the producer lives, with at most one `Producer` per ring.
    pub(crate) unsafe fn new(ctl: NonNull<RingCtl>, size: usize) -> Self {
        debug_assert!(size.is_power_of_two());
        // SAFETY: the data area directly follows the control block (caller's contract).
        let data = unsafe { NonNull::new_unchecked(ctl.as_ptr().add(1).cast::<u8>()) };
        // SAFETY: ctl is valid (caller's contract); we only read atomics.
        let (head, tail) = unsafe {
            let c = ctl.as_ref();
            (c.head.load(Ordering::Relaxed), c.tail.load(Ordering::Acquire))
        };
        Producer {
            ctl,
            data,
            size: size as u64,
            head,
            tail_cache: tail,
            max_payload: max_payload(size),
            claim: has_prefetchw(),
            claimed_to: 0,
        }
    }

    /// Bytes needed at `head` for a record of `payload` bytes (`long`: with the total length):
    /// the record, the header slot after it (zeroed ahead, see the module docs), and a skip
    /// record if the record does not fit before the end of the data area, or if it is not
    /// one of the largest and would start past [`HOT_SPAN`].
    #[inline]
    fn needed(&self, payload: usize, long: bool) -> (u64, bool) {
        let rec = rec_len(payload, long) + REC_ALIGN;
        let off = self.head & (self.size - 1);
        let contiguous = self.size - off;
        if rec - REC_ALIGN > contiguous || (off >= HOT_SPAN && self.rewinds(payload)) {
            (contiguous + rec, true)
        } else {
            (rec, false)
        }
    }

    /// Whether a record of `payload` bytes that would start past [`HOT_SPAN`] goes back to offset
    /// 0: one not of the largest ([`Producer::is_largest`]), while at most [`STREAM_WINDOW`] bytes
    /// are in flight by the cached `tail` (a stale one only makes it wait for a later record). Not
    /// behind one of the largest records still in flight: the tail packet of a stream (a few bytes
    /// after each 1 MiB packet) would then leave the rest of the ring unused, and `osu_bw` 1 MiB
    /// through the rings moved 0.27x the bytes.
    #[inline]
    fn rewinds(&self, payload: usize) -> bool {
        !self.is_largest(payload) && self.head - self.tail_cache <= STREAM_WINDOW
    }

    /// Whether a record of `payload` bytes (with the header slot zeroed after it) takes a
    /// quarter of the ring or [`LARGE_RECORD`] bytes or more: one of the largest, which
    /// streamed rendezvous data and a window's eager messages of 256 KiB and up use, limited
    /// by the ring's size alone and never sent back to offset 0 early.
    #[inline]
    fn is_largest(&self, payload: usize) -> bool {
        rec_len(payload, true) + REC_ALIGN >= (self.size / 4).min(LARGE_RECORD)
    }

    /// Whether `need` bytes at `head` may be written now: they fit in the released space, and
    /// a mid-size record also waits until fewer than [`STREAM_WINDOW`] bytes are in flight.
    #[inline]
    fn room_for(&mut self, need: u64, payload: usize) -> bool {
        if need > STREAM_SMALL {
            return self.stream_room_for(need, payload);
        }
        // A small record (every small message): the ring's size is its only limit (a bound on
        // the bytes in flight of `u64::MAX` is no bound, and the check folds away).
        self.fits_now(need, u64::MAX)
    }

    /// [`Producer::room_for`] of a record of more than [`STREAM_SMALL`] bytes, out of the small
    /// records' way (its copy dwarfs the call).
    #[inline(never)]
    fn stream_room_for(&mut self, need: u64, payload: usize) -> bool {
        // Mid-size by the record alone (a skip in `need` does not make it large). Every
        // mid-size record is shorter than the window (`LARGE_RECORD` < `STREAM_WINDOW`).
        let most_in_flight = if self.is_largest(payload) { u64::MAX } else { STREAM_WINDOW - 1 };
        self.fits_now(need, most_in_flight)
    }

    /// Whether `need` bytes fit in the released space with at most `most_in_flight` bytes in
    /// flight before them, reading the consumer's `tail` again only if the cached one says no.
    #[inline(always)]
    fn fits_now(&mut self, need: u64, most_in_flight: u64) -> bool {
        let fits = |p: &Self| p.head + need - p.tail_cache <= p.size && p.head - p.tail_cache <= most_in_flight;
        fits(self) || {
            self.refresh_tail();
            fits(self)
        }
    }

    /// Reads the consumer's `tail` again (a line the consumer writes).
    #[inline]
    fn refresh_tail(&mut self) {
        // SAFETY: ctl valid for the producer's life (constructor contract).
        self.tail_cache = unsafe { self.ctl.as_ref() }.tail.load(Ordering::Acquire);
    }

    /// Whether a record of `payload` bytes fits now.
    pub fn has_room(&mut self, payload: usize) -> bool {
        payload <= self.max_payload && {
            let (need, _) = self.needed(payload, true);
            self.room_for(need, payload)
        }
    }

    /// Whether the consumer has taken every record published so far (one read of its
    /// `tail`, a line the consumer writes).
    pub fn is_drained(&mut self) -> bool {
        self.refresh_tail();
        self.tail_cache == self.head
    }

    /// Appends one record whose payload is the concatenation of `parts`. `Ok(false)` when the
    /// ring is full.
    ///
    /// # Errors
    /// The payload is larger than the ring's record limit, or `flags` uses the reserved bit.
    #[inline]
    pub fn try_push(&mut self, flags: u8, total_len: u64, parts: &[&[u8]]) -> Result<bool> {
        // The engine's packets are a header and a payload: no loop for those.
        let payload: usize = match parts {
            [a, b] => a.len() + b.len(),
            _ => parts.iter().map(|p| p.len()).sum(),
        };
        if payload > self.max_payload || flags & FLAGS_RESERVED != 0 {
            return Err(self.refusal(payload, flags));
        }
        let long = total_len != payload as u64;
        let (need, skip) = self.needed(payload, long);
        if !self.room_for(need, payload) {
            return Ok(false);
        }
        // A record that does not fit before the end goes to offset 0, behind a skip record
        // published last (so the consumer, once it sees the skip, finds the record in place).
        let skip_at = skip.then(|| {
            let off = self.head & (self.size - 1);
            let at = (off, stamp(self.head));
            self.head += self.size - off;
            at
        });
        let off = self.head & (self.size - 1);
        let rec = rec_len(payload, long);
        // SAFETY: the record [off, off + rec) lies inside the data area (no wrap, checked by
        // `needed`), and so does the next header slot (off + rec < size, or 0 at the end), all
        // released by the consumer (`room_for` counted them); a skip record's slot `skip_at`
        // too (the space before offset 0 that `needed` counted).
        unsafe { self.write_record(off, rec, (flags, total_len, payload), parts, skip_at) };
        self.head += rec;
        // SAFETY: ctl valid for the producer's life.
        unsafe { self.ctl.as_ref() }.head.store(self.head, Ordering::Release);
        if self.claim && rec > 64 && rec <= CLAIM_RECORD_MAX && !long {
            self.claim_ahead(rec);
        }
        Ok(true)
    }

    /// Writes the record of `parts` (`payload` bytes of a message of `total_len`, with
    /// `flags`) at `off`, zeroes the next header slot (`off + rec`), and publishes the record's
    /// header, then the skip record at `skip_at` (offset and stamp) if there is one.
    ///
    /// # Safety
    /// `[off, off + rec)`, the header slot after it and `skip_at`'s slot lie inside the data
    /// area and are released by the consumer, which reads none of it before the release
    /// stores here; `payload` is the total length of `parts`, and `rec` is `rec_len` of it.
    #[inline(always)]
    unsafe fn write_record(
        &mut self,
        off: u64,
        rec: u64,
        (flags, total_len, payload): (u8, u64, usize),
        parts: &[&[u8]],
        skip_at: Option<(u64, u32)>,
    ) {
        let long = total_len != payload as u64;
        // SAFETY: the caller's contract: the ranges written lie in the data area, released
        // by the consumer; we are the only writer.
        unsafe {
            let base = self.data.as_ptr().add(off as usize);
            let mut dst = if long {
                base.add(8).cast::<u64>().write(total_len);
                base.add(REC_HDR)
            } else {
                base.add(REC_HDR_SHORT)
            };
            for p in parts {
                // A stream's packet finds its lines unclaimed (`claim_ahead` is for whole
                // messages): `copy_unclaimed` writes them without fetching them first.
                if long {
                    super::copy_unclaimed(p.as_ptr(), dst, p.len());
                } else {
                    super::copy_bytes(p.as_ptr(), dst, p.len());
                }
                dst = dst.add(p.len());
            }
            self.header((off + rec) & (self.size - 1)).store(0, Ordering::Relaxed);
            let flags = if long { flags | FLAG_TOTAL } else { flags };
            let word0 = (stamp(self.head) as u64) << 32 | (flags as u64) << 24 | payload as u64;
            self.header(off).store(word0, Ordering::Release);
            if let Some((at, st)) = skip_at {
                self.header(at).store((st as u64) << 32 | (FLAG_SKIP as u64) << 24, Ordering::Release);
            }
        }
    }

    /// Claims (`prefetchw`: fetch for writing) the lines of the ring from the line after the
    /// next header slot to `rec` bytes past it ([`CLAIM_AHEAD`] at least: the next record is
    /// likely as long as this one), each line once, so that the next record's stores do not
    /// each wait for the consumer's copy of their line to be invalidated (it read them a lap
    /// ago) before its header can be published. Only after records of more than one line (up to
    /// [`CLAIM_RECORD_MAX`]) of whole messages: the next header slot's own line is the one the
    /// consumer polls, and claiming lines ahead of a stream of small records only fights the
    /// consumer's [`Consumer::prefetch_ahead`]. With the consumer fetching a whole record at
    /// once (in [`Consumer::peek`]), 5 interleaved runs each against neither: `osu_latency`
    /// 64-512 B 0.68-0.87x the time, 1-4 KiB 0.94-0.95x, 8 KiB 0.85x; `osu_bw` and `osu_bibw`
    /// 1-4 KiB 1.10-1.33x, `osu_bibw` 64-128 B 1.35-1.64x; `osu_bw` 64-128 B 0.93-0.98x.
    #[inline(always)]
    fn claim_ahead(&mut self, rec: u64) {
        let next = self.head & (self.size - 1);
        let lap = self.head - next;
        let from = ((next & !63) + 64).max(self.claimed_to.saturating_sub(lap));
        let to = (next + CLAIM_AHEAD.max(rec)).min(self.size);
        self.claimed_to = lap + to;
        let mut a = from;
        while a < to {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `a` lies inside the data area (below `size`); `prefetchw` exists on this
            // CPU (`claim` is set only then), never faults and changes nothing but the caches.
            unsafe {
                std::arch::asm!("prefetchw [{0}]", in(reg) self.data.as_ptr().add(a as usize), options(nostack, preserves_flags, readonly))
            };
            a += 64;
        }
    }

    /// Why [`Producer::try_push`] refuses a packet of `payload` bytes with `flags`.
    #[cold]
    fn refusal(&self, payload: usize, flags: u8) -> Error {
        if payload > self.max_payload {
            Error::InvalidArgument(format!("packet of {payload} bytes exceeds the ring's limit of {}", self.max_payload))
        } else {
            Error::InvalidArgument(format!("packet flags {:#x} are reserved", flags & FLAGS_RESERVED))
        }
    }

    /// # Safety
    /// `off` must be a 32-aligned offset inside the data area.
    #[inline]
    unsafe fn header(&self, off: u64) -> &AtomicU64 {
        // SAFETY: aligned (32 | off, data area 128-aligned) and inside the mapping (caller).
        unsafe { &*self.data.as_ptr().add(off as usize).cast::<AtomicU64>() }
    }
}

/// A record as the consumer sees it.
pub struct Record<'a> {
    /// Flags given by the producer.
    pub flags: u8,
    /// Total length of the message this packet belongs to.
    pub total_len: u64,
    /// The payload.
    pub data: &'a [u8],
    /// Bytes of the whole record in the ring (what [`Consumer::release`] takes).
    pub span: u64,
}

/// The consuming end of a ring.
pub struct Consumer {
    ctl: NonNull<RingCtl>,
    data: NonNull<u8>,
    size: u64,
    /// Private copy of `tail`: position of the next record.
    pos: u64,
    max_payload: usize,
}

// SAFETY: a Consumer is the only reader of its ring's records and only writer of its tail; the
// mapping outlives it (the fabric owns both).
unsafe impl Send for Consumer {}

impl Consumer {
    /// # Safety
    /// As [`Producer::new`], with at most one `Consumer` per ring.
    pub(crate) unsafe fn new(ctl: NonNull<RingCtl>, size: usize) -> Self {
        // SAFETY: data follows ctl (caller's contract).
        let data = unsafe { NonNull::new_unchecked(ctl.as_ptr().add(1).cast::<u8>()) };
        // SAFETY: ctl valid (caller's contract).
        let pos = unsafe { ctl.as_ref() }.tail.load(Ordering::Relaxed);
        Consumer { ctl, data, size: size as u64, pos, max_payload: max_payload(size) }
    }

    #[inline]
    fn word0(&self, off: u64) -> u64 {
        // SAFETY: off is 32-aligned and inside the data area; word0 is only accessed atomically.
        unsafe { &*self.data.as_ptr().add(off as usize).cast::<AtomicU64>() }.load(Ordering::Acquire)
    }

    /// The next record, if the producer has published one. Stays available until
    /// [`Self::release`].
    ///
    /// # Errors
    /// [`Error::Malformed`] when a header announces more bytes than a record may hold.
    #[inline]
    pub fn peek(&mut self) -> Result<Option<Record<'_>>> {
        let mut off = self.pos & (self.size - 1);
        let mut w = self.word0(off);
        if (w >> 32) as u32 != stamp(self.pos) {
            return Ok(None);
        }
        let mut flags = (w >> 24) as u8;
        if flags & FLAG_SKIP != 0 {
            self.pos += self.size - off;
            // SAFETY: ctl valid for the consumer's life.
            unsafe { self.ctl.as_ref() }.tail.store(self.pos, Ordering::Release);
            off = 0;
            w = self.word0(0);
            if (w >> 32) as u32 != stamp(self.pos) {
                return Ok(None);
            }
            flags = (w >> 24) as u8;
        }
        let len = (w & 0xff_ffff) as usize;
        let long = flags & FLAG_TOTAL != 0;
        let span = rec_len(len, long);
        if len > self.max_payload || off + span > self.size || flags & FLAG_SKIP != 0 {
            return Err(Error::Malformed { what: "shm record header out of bounds" });
        }
        if span <= PREFETCH_RECORD_MAX && !long {
            // Fetch the record's other lines at once, while the caller matches its header:
            // they cross from the producer's core together, not one after another (see
            // `Producer::claim_ahead` for what both measured). Not a packet of a longer
            // message (module docs).
            let mut a = (off & !63) + 64;
            while a < off + span {
                // Inside the record, checked above.
                prefetch(self.data.as_ptr().wrapping_add(a as usize));
                a += 64;
            }
        }
        // SAFETY: the record lies inside the data area (checked above); the acquire load of
        // word0 made the producer's writes of word1 and the payload visible, and the producer
        // does not touch the record again until we advance tail in `release`.
        unsafe {
            let base = self.data.as_ptr().add(off as usize);
            let (total_len, at) = if long { (base.add(8).cast::<u64>().read(), REC_HDR) } else { (len as u64, REC_HDR_SHORT) };
            let data = std::slice::from_raw_parts(base.add(at), len);
            Ok(Some(Record { flags: flags & !FLAGS_RESERVED, total_len, data, span }))
        }
    }

    /// Asks the CPU to start fetching the ring a few lines past the next record (a stream of
    /// small records crosses a cache line the producer wrote every one or two records).
    #[inline(always)]
    pub fn prefetch_ahead(&self) {
        let ahead = (self.pos + PREFETCH_AHEAD) & (self.size - 1);
        prefetch(self.data.as_ptr().wrapping_add(ahead as usize));
    }

    /// Consumes the record just peeked, whose [`Record::span`] was `span`.
    #[inline]
    pub fn release(&mut self, span: u64) {
        self.pos += span;
        // SAFETY: ctl valid for the consumer's life.
        unsafe { self.ctl.as_ref() }.tail.store(self.pos, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A ring in ordinary (128-aligned) heap memory.
    struct HeapRing {
        mem: Vec<RingCtl>,
    }

    impl HeapRing {
        fn new(size: usize) -> Self {
            let n = 1 + size / std::mem::size_of::<RingCtl>();
            let mem =
                (0..n).map(|_| RingCtl { head: AtomicU64::new(0), _pad0: [0; 120], tail: AtomicU64::new(0), _pad1: [0; 120] }).collect();
            HeapRing { mem }
        }
        fn ends(&mut self, size: usize) -> (Producer, Consumer) {
            let ctl = NonNull::new(self.mem.as_mut_ptr()).unwrap();
            // SAFETY: the vector holds a RingCtl followed by at least `size` bytes, lives for the
            // test, and we create exactly one of each end.
            unsafe { (Producer::new(ctl, size), Consumer::new(ctl, size)) }
        }
    }

    /// Takes the next record, which must be there, and returns its span.
    fn take_next(c: &mut Consumer) -> u64 {
        let span = c.peek().unwrap().expect("record").span;
        c.release(span);
        span
    }

    /// Takes the next record, which must be there and carry `payload`.
    fn take_payload(c: &mut Consumer, payload: &[u8]) {
        let rec = c.peek().unwrap().expect("record");
        assert_eq!(rec.data, payload);
        let span = rec.span;
        c.release(span);
    }

    /// A header whose length is past what a record may hold is refused, not read: the record
    /// stays where it is and every look reports it.
    #[test]
    fn a_corrupt_header_is_malformed() {
        let size = 4096;
        let mut h = HeapRing::new(size);
        let (mut p, mut c) = h.ends(size);
        assert!(p.try_push(crate::packet::PKT_WHOLE, 8, &[&[1u8; 8]]).unwrap());
        // The record's first word is the data area's first 8 bytes: the `head` of the vector's
        // second element. Its length field (low 24 bits) becomes the largest.
        h.mem[1].head.fetch_or(0xff_ffff, Ordering::AcqRel);
        for _ in 0..2 {
            assert!(matches!(c.peek(), Err(Error::Malformed { .. })));
        }
    }

    /// In a ring larger than [`HOT_SPAN`], records shorter than a quarter of the ring start
    /// below it while few bytes are in flight (they go back to offset 0 behind a skip), but
    /// not behind one of the largest still in flight (a stream's tail packet); every record
    /// arrives whole and in order.
    #[test]
    fn small_records_stay_in_the_hot_span_and_large_ones_use_the_ring() {
        let size = 4 << 20;
        let mut r = HeapRing::new(size);
        let (mut p, mut c) = r.ends(size);
        let mask = size as u64 - 1;
        let push = |p: &mut Producer, len: usize, i: u32| {
            let payload: Vec<u8> = (0..len).map(|k| (k as u32 ^ i) as u8).collect();
            let before = p.head & mask;
            assert!(p.try_push(1, len as u64, &[&payload]).unwrap());
            (payload, before, (p.head - rec_len(len, false)) & mask)
        };
        let (mut rewound, mut tails_past) = (0, 0);
        for i in 0..2_000u32 {
            if i % 50 == 49 {
                // One of the largest, and a stream's tail packet behind it while it is in
                // flight: that one stays where it is.
                let (big, _, at) = push(&mut p, max_payload(size), i);
                let (tail, _, tail_at) = push(&mut p, 16, i);
                assert_eq!(tail_at, (at + rec_len(big.len(), false)) & mask);
                tails_past += usize::from(tail_at >= HOT_SPAN);
                take_payload(&mut c, &big);
                take_payload(&mut c, &tail);
            } else {
                let (payload, before, at) = push(&mut p, 16 << 10, i);
                assert!(at < HOT_SPAN || before < HOT_SPAN, "a 16 KiB record started at {at}");
                rewound += usize::from(before >= HOT_SPAN && at == 0);
                take_payload(&mut c, &payload);
            }
            // The producer sees the consumer's progress (as it does once it runs short).
            p.refresh_tail();
        }
        assert!(rewound > 0, "records went back to offset 0");
        assert!(tails_past > 0, "a tail packet behind a large record stayed past the hot span");
    }

    #[test]
    fn roundtrip_and_wrap() {
        let size = 4096;
        let mut r = HeapRing::new(size);
        let (mut p, mut c) = r.ends(size);
        assert!(c.peek().unwrap().is_none());
        for i in 0..10_000u32 {
            let len = (i as usize * 37) % max_payload(size);
            let payload: Vec<u8> = (0..len).map(|k| (k as u32 ^ i) as u8).collect();
            // Every other packet is a whole message (the short header).
            let total = len as u64 + u64::from(i % 2);
            assert!(p.try_push(3, total, &[&payload]).unwrap());
            let rec = c.peek().unwrap().expect("record");
            assert_eq!(rec.flags, 3);
            assert_eq!(rec.total_len, total);
            assert_eq!(rec.data, &payload[..]);
            let span = rec.span;
            c.release(span);
        }
    }

    /// Lines ahead are claimed once each, up to [`CLAIM_AHEAD`] (or a record) past the next header slot,
    /// and only after records of more than one line; a lap starts claiming again from its
    /// beginning. The records themselves are untouched by it.
    #[test]
    fn lines_ahead_are_claimed_once_and_records_stay_intact() {
        let size = 4096;
        let mut r = HeapRing::new(size);
        let (mut p, mut c) = r.ends(size);
        p.claim = true;
        assert!(p.try_push(1, 8, &[&[7u8; 8]]).unwrap());
        assert_eq!(p.claimed_to, 0, "a one-line record claims nothing");
        let rec = c.peek().unwrap().unwrap();
        assert_eq!((rec.flags, rec.data), (1, &[7u8; 8][..]));
        let span = rec.span;
        c.release(span);
        let payload: Vec<u8> = (0..100u8).collect();
        let mut pushed = 0;
        for i in 0..100u64 {
            if !p.try_push(2, 100, &[&payload]).unwrap() {
                break;
            }
            pushed += 1;
            let next = p.head & (p.size - 1);
            assert_eq!(p.claimed_to, p.head - next + (next + CLAIM_AHEAD.max(128)).min(p.size), "record {i}");
            let rec = c.peek().unwrap().unwrap();
            assert_eq!((rec.flags, rec.data), (2, &payload[..]));
            let span = rec.span;
            c.release(span);
        }
        assert!(pushed > size / 128, "the ring wrapped: {pushed} records of 128 bytes");
        // A packet of a longer message (its header carries the total) claims nothing.
        let before = p.claimed_to;
        assert!(p.try_push(3, 1000, &[&payload]).unwrap());
        assert_eq!(p.claimed_to, before, "a stream packet claims no lines");
        let rec = c.peek().unwrap().unwrap();
        assert_eq!((rec.flags, rec.total_len, rec.data), (3, 1000, &payload[..]));
    }

    #[test]
    fn full_ring_applies_back_pressure() {
        let size = 4096;
        let mut r = HeapRing::new(size);
        let (mut p, mut c) = r.ends(size);
        let mut pushed = 0;
        while p.try_push(1, 100, &[&[7u8; 100]]).unwrap() {
            pushed += 1;
        }
        assert!(pushed >= 4096 / 192 - 1);
        let rec = c.peek().unwrap().unwrap();
        let span = rec.span;
        c.release(span);
        assert!(p.try_push(1, 100, &[&[7u8; 100]]).unwrap());
        assert!(p.try_push(1, 0, &[&[0u8; 2000]]).is_err(), "oversized packet is refused");
        assert!(!p.is_drained());
        while let Some(rec) = c.peek().unwrap() {
            let span = rec.span;
            c.release(span);
        }
        assert!(p.is_drained());
    }

    #[test]
    fn mid_size_records_stop_at_the_stream_window_and_others_at_the_ring_size() {
        let size = 4 << 20;
        let mut r = HeapRing::new(size);
        let (mut p, mut c) = r.ends(size);
        let mid = vec![5u8; 64 << 10];
        let mut in_flight = 0u64;
        while p.try_push(1, mid.len() as u64, &[&mid]).unwrap() {
            in_flight += rec_len(mid.len(), false);
        }
        // Started while fewer than STREAM_WINDOW bytes were in flight, so the last one ends
        // at most one record past it, far below the ring's size.
        assert!(in_flight >= STREAM_WINDOW && in_flight < STREAM_WINDOW + rec_len(mid.len(), false), "{in_flight}");
        assert!(!p.has_room(mid.len()));
        // Small records (messages, control packets) still go in, up to the ring's size.
        assert!(p.try_push(1, 100, &[&[1u8; 100]]).unwrap());
        assert!(p.has_room(STREAM_SMALL as usize / 2));
        // So does one of the largest records (streamed rendezvous data).
        let big = vec![9u8; max_payload(size)];
        assert!(p.try_push(1, big.len() as u64 + 1, &[&big]).unwrap());
        // Once the consumer has taken the mid-size records, the window opens again.
        let mut taken = 0u64;
        while taken < in_flight {
            taken += take_next(&mut c);
        }
        assert!(!p.has_room(mid.len()), "the large record is still in flight");
        while let Some(rec) = c.peek().unwrap() {
            let span = rec.span;
            c.release(span);
        }
        assert!(p.try_push(1, mid.len() as u64, &[&mid]).unwrap());
        let rec = c.peek().unwrap().expect("record");
        assert_eq!(rec.data, &mid[..]);
    }

    /// Records of `LARGE_RECORD` bytes and up are of the largest though shorter than a
    /// quarter of the ring: they run ahead until the ring is full, not one behind another.
    #[test]
    fn records_from_256_kib_fill_the_ring() {
        let size = 4 << 20;
        let mut r = HeapRing::new(size);
        let (mut p, mut c) = r.ends(size);
        let long = vec![6u8; 512 << 10];
        assert!(rec_len(long.len(), true) + REC_ALIGN < size as u64 / 4, "under a quarter");
        // Seven fit (each a little over 512 KiB); the eighth waits for the consumer.
        for k in 0..7 {
            assert!(p.try_push(1, long.len() as u64 + 1, &[&long]).unwrap(), "record {k}");
        }
        assert!(!p.has_room(long.len()));
        assert!(!p.try_push(1, long.len() as u64 + 1, &[&long]).unwrap());
        // The eighth goes back to offset 0 (the end has too little left), where the first two
        // were.
        take_next(&mut c);
        assert!(!p.try_push(1, long.len() as u64 + 1, &[&long]).unwrap());
        take_next(&mut c);
        assert!(p.try_push(1, long.len() as u64 + 1, &[&long]).unwrap());
        for _ in 0..6 {
            take_payload(&mut c, &long);
        }
        assert!(p.is_drained());
        // Just under `LARGE_RECORD`, a record is mid-size: it waits for the window.
        let mid = vec![7u8; (LARGE_RECORD - 256) as usize];
        assert!(p.try_push(1, mid.len() as u64 + 1, &[&mid]).unwrap());
        assert!(p.try_push(1, mid.len() as u64 + 1, &[&mid]).unwrap());
        assert!(!p.try_push(1, mid.len() as u64 + 1, &[&mid]).unwrap(), "past the window");
    }

    /// The payload of an old record can hold, where a later lap's record will start, exactly
    /// the header that record's stamp makes valid (data of counters often does). The consumer
    /// must not take it for a record before the producer wrote one there.
    #[test]
    fn stale_payload_that_looks_like_a_header_is_not_a_record() {
        let size = 4096;
        let mut r = HeapRing::new(size);
        let (mut p, mut c) = r.ends(size);
        // Lap 0: a record at 0 whose payload holds, at ring offset 128, the header a record at
        // position 4096 + 128 would have.
        let fake = (u64::from(stamp(4096 + 128)) << 32) | 5;
        let mut payload = vec![0u8; 1008];
        payload[128 - REC_HDR_SHORT..128 - REC_HDR_SHORT + 8].copy_from_slice(&fake.to_le_bytes());
        for _ in 0..4 {
            assert!(p.try_push(1, 1008, &[&payload]).unwrap());
            take_next(&mut c);
        }
        // Lap 1: one 128-byte record, consumed; nothing else was pushed.
        assert!(p.try_push(2, 112, &[&[9u8; 112]]).unwrap());
        take_next(&mut c);
        assert!(c.peek().unwrap().is_none(), "a stale payload was read as a record");
        // The ring goes on normally.
        assert!(p.try_push(3, 4, &[b"next"]).unwrap());
        assert_eq!(c.peek().unwrap().expect("record").data, b"next");
    }

    #[test]
    fn threads_exchange_many_records() {
        let size = 8192;
        let mut r = HeapRing::new(size);
        let (mut p, mut c) = r.ends(size);
        let n = 200_000u64;
        std::thread::scope(|s| {
            s.spawn(move || {
                for i in 0..n {
                    let b = i.to_le_bytes();
                    let parts: &[&[u8]] = if i % 7 == 0 { &[&b, &[0u8; 300]] } else { &[&b] };
                    // Odd packets are whole messages (short header), even ones carry `i`.
                    let total = if i % 2 == 1 { parts.iter().map(|p| p.len() as u64).sum() } else { i };
                    while !p.try_push(0, total, parts).unwrap() {
                        std::hint::spin_loop();
                    }
                }
            });
            let mut next = 0;
            while next < n {
                if let Some(rec) = c.peek().unwrap() {
                    let whole: u64 = if next % 7 == 0 { 308 } else { 8 };
                    assert_eq!(rec.total_len, if next % 2 == 1 { whole } else { next });
                    assert_eq!(u64::from_le_bytes(rec.data[..8].try_into().unwrap()), next);
                    let span = rec.span;
                    c.release(span);
                    next += 1;
                } else {
                    std::hint::spin_loop();
                }
            }
        });
    }
}
