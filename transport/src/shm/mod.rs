//! Shared-memory fabric: one segment per job in `/dev/shm`; one single-producer ring per
//! ordered pair of ranks in a job of up to `TMPI_SHM_PAIRS_MAX` ranks, one queue per rank
//! beyond ([`inbox`]).
//!
//! - [`segment`]: creating, opening and checking the mapped file (magic, version, layout).
//! - [`inbox`]: the queued layout of large jobs (a queue per receiver, fragments per sender).
//! - [`room`]: the memory a segment can have, checked before it is created.
//! - [`cma`]: single-copy transfers between processes (process_vm_readv/writev).
//! - [`heap`]: the shared heap, memory of one rank that peers map and copy with memcpy.
//! - [`ring`]: the lock-free single-producer/single-consumer ring of variable-size records.
//! - [`futex`]: the doorbell's sleep and wake (Linux futexes on words of the segment).
//!
//! Doorbells: a rank with nothing to do for a while sleeps in the kernel ([`ShmFabric::doze`])
//! instead of polling, and whoever writes to it wakes it: a packet into its ring
//! ([`ShmFabric::try_send`]) or a collective flag ([`ShmFabric::wake`]). The writer looks at
//! the sleeper's `sleeping` word and makes the system call only when it is set, so a rank
//! that is not asleep costs its peers one load per packet. The sleeper sets `sleeping`, then
//! looks for work once more, then sleeps with a timeout: a wake-up is lost only when a
//! packet's store and the sender's load of `sleeping` pass each other in the store buffers
//! (the ring path has no fence, to keep it cheap), and then the timeout ends the sleep.
//!
//! [`ShmFabric`] ties them together for one rank: it sends packets into the ring of each
//! destination and polls the rings of every source. It is the only place with `unsafe` in
//! the fabric besides the two modules above.
//!
//! Trust model: ranks of one job trust each other (as with any MPI). A corrupt record header
//! is still caught (length and position checks) and reported as [`crate::Error::PeerProtocol`]
//! naming the peer whose ring it is, rather than read out of bounds.

pub mod cma;
pub mod futex;
pub mod heap;
pub mod inbox;
mod queue_layout;
pub mod ring;
pub mod room;
pub mod segment;

use crate::error::{Error, Result};
use crate::packet::Packet;
use inbox::Queues;
use ring::{Consumer, Producer};
use segment::Segment;
use std::sync::atomic::{AtomicU32, Ordering};

/// One rank's view of the job's shared-memory fabric.
pub struct ShmFabric {
    seg: Segment,
    rank: usize,
    size: usize,
    tx: Vec<Option<Producer>>,
    rx: Vec<Option<Consumer>>,
    /// Sources with a ring (every rank but this one), in polling order.
    sources: Vec<usize>,
    next_src: usize,
    /// Per source rank: whether the last poll took a packet from it (see [`Self::poll`]).
    streak: Vec<bool>,
    /// The queues of the queued layout (then `tx`, `rx` and `sources` are empty).
    queues: Option<Box<Queues>>,
}

/// Most packets [`ShmFabric::poll`] takes from one streaming source in one call.
const BURST: usize = 32;
/// Ring bytes after which [`ShmFabric::poll`] ends a burst (the packet that crosses it is the
/// last): 32 records of small messages, or one packet of 8 KiB or more.
const BURST_BYTES: u64 = 8 << 10;

impl ShmFabric {
    /// Creates the segment `/dev/shm/<name>` for `size` ranks (rank 0 does this, before the
    /// others open it).
    ///
    /// # Errors
    /// I/O errors creating or mapping the file; an existing file of that name.
    pub fn create(name: &str, rank: usize, size: usize, ring_size: usize) -> Result<Self> {
        let seg = Segment::create(name, size, ring_size)?;
        Self::from_segment(seg, rank)
    }

    /// Opens the segment that rank 0 created.
    ///
    /// # Errors
    /// I/O errors, or a segment whose header does not match this build or job size.
    pub fn open(name: &str, rank: usize, size: usize) -> Result<Self> {
        let seg = Segment::open(name, size)?;
        Self::from_segment(seg, rank)
    }

    fn from_segment(seg: Segment, rank: usize) -> Result<Self> {
        let size = seg.nranks();
        if rank >= size {
            return Err(Error::InvalidArgument(format!("rank {rank} >= size {size}")));
        }
        seg.set_pid(rank, std::process::id());
        if seg.queued() {
            let queues = Some(Box::new(Queues::new(&seg, rank)));
            return Ok(ShmFabric {
                seg,
                rank,
                size,
                tx: Vec::new(),
                rx: Vec::new(),
                sources: Vec::new(),
                next_src: 0,
                streak: Vec::new(),
                queues,
            });
        }
        let mut tx = Vec::with_capacity(size);
        let mut rx = Vec::with_capacity(size);
        for peer in 0..size {
            if peer == rank {
                tx.push(None);
                rx.push(None);
            } else {
                tx.push(Some(seg.producer(rank, peer)));
                rx.push(Some(seg.consumer(peer, rank)));
            }
        }
        let sources = (0..size).filter(|&p| p != rank).collect();
        Ok(ShmFabric { seg, rank, size, tx, rx, sources, next_src: 0, streak: vec![false; size], queues: None })
    }

    /// Removes the segment's name from `/dev/shm` (mappings stay valid). Called once every
    /// rank has opened it.
    ///
    /// # Errors
    /// The unlink failed for a reason other than the file being gone already.
    pub fn unlink(&self) -> Result<()> {
        self.seg.unlink()
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Number of ranks in the job.
    pub fn size(&self) -> usize {
        self.size
    }

    /// The largest packet payload one record carries.
    pub fn max_packet(&self) -> usize {
        self.seg.max_record_payload()
    }

    /// Process id that rank `peer` recorded in the segment (0 if it has not attached yet).
    pub fn peer_pid(&self, peer: usize) -> u32 {
        self.seg.pid(peer)
    }

    /// Whether rank `peer` has detached from the segment (dropped its fabric: finished or
    /// unwound), or wrote a corrupt record into this rank's ring ([`Self::poll`]). A process
    /// that died without detaching is found by its pid instead.
    pub fn peer_departed(&self, peer: usize) -> bool {
        peer < self.size && (self.seg.gone(peer) != 0 || self.cut_off(peer))
    }

    /// Whether `peer`'s ring was dropped for a corrupt record ([`Self::poll`]): every other
    /// rank has one.
    fn cut_off(&self, peer: usize) -> bool {
        match &self.queues {
            Some(q) => q.cut_off(peer),
            None => peer != self.rank && self.rx[peer].is_none(),
        }
    }

    /// Whether rank `peer` finalized cleanly (it will send nothing more, and that is fine);
    /// never for a peer that wrote a corrupt record.
    pub fn peer_finalized(&self, peer: usize) -> bool {
        peer < self.size && self.seg.gone(peer) == segment::GONE_FINALIZED && !self.cut_off(peer)
    }

    /// Whether a packet from `src` waits in its ring. Read [`Self::peer_finalized`] first:
    /// whatever a peer pushed before it finalized is then visible here. A corrupt record
    /// counts as pending (the next poll reports it).
    pub fn pending_from(&mut self, src: usize) -> bool {
        match self.rx.get_mut(src) {
            Some(Some(c)) => !matches!(c.peek(), Ok(None)),
            _ => self.queues.as_ref().is_some_and(|q| q.pending_from(src)),
        }
    }

    /// Records that this rank finalized cleanly.
    pub fn mark_finalized(&self) {
        self.seg.set_gone(self.rank, segment::GONE_FINALIZED);
    }

    /// Whether `dest` has taken everything this rank put into its ring (false for a bad
    /// `dest`): a sender that finds it so knows the receiver is keeping up, or waiting.
    pub fn drained(&mut self, dest: usize) -> bool {
        match self.tx.get_mut(dest) {
            Some(Some(p)) => p.is_drained(),
            _ => self.queues.as_ref().is_some_and(|q| q.drained(dest)),
        }
    }

    /// Tries to put one packet (the concatenation of `parts`) into `dest`'s ring. Returns
    /// `Ok(false)` when the ring has no room now (back-pressure: make progress and retry).
    ///
    /// # Errors
    /// `dest` is this rank or out of range, or the packet is larger than [`Self::max_packet`].
    #[inline]
    pub fn try_send(&mut self, dest: usize, flags: u8, total_len: u64, parts: &[&[u8]]) -> Result<bool> {
        let pushed = match self.tx.get_mut(dest) {
            Some(Some(p)) => p.try_push(flags, total_len, parts)?,
            _ => match self.queues.as_mut() {
                Some(q) => q.try_send(&self.seg, dest, flags, total_len, parts)?,
                None => return Err(Error::InvalidArgument(format!("no ring from rank {} to {dest}", self.rank))),
            },
        };
        if pushed {
            let (sleeping, bell) = self.seg.doorbell(dest);
            if sleeping.load(Ordering::Relaxed) != 0 {
                ring_bell(bell);
            }
        }
        Ok(pushed)
    }

    /// The job's segment (collective contexts, doorbells).
    pub fn segment(&self) -> &Segment {
        &self.seg
    }

    /// Wakes rank `rank` if it sleeps on its doorbell; call after a store it may wait for
    /// (a collective flag). Fenced, so the store is visible before `sleeping` is read: the
    /// wake-up cannot be lost.
    pub fn wake(&self, rank: usize) {
        if rank >= self.size {
            return;
        }
        std::sync::atomic::fence(Ordering::SeqCst);
        let (sleeping, bell) = self.seg.doorbell(rank);
        if sleeping.load(Ordering::Relaxed) != 0 {
            ring_bell(bell);
        }
    }

    /// Sleeps on this rank's doorbell for at most `timeout`, unless a packet waits in a ring
    /// or `busy(segment)` says there is something to do (it is asked after the rank announced
    /// its sleep, so whatever a peer writes after that rings the bell). Any wake-up, timeout
    /// or signal ends it; the caller re-checks what it waits for.
    pub fn doze(&mut self, timeout: std::time::Duration, busy: impl FnOnce(&Segment) -> bool) {
        let (sleeping, bell) = self.seg.doorbell(self.rank);
        let seen = bell.load(Ordering::Acquire);
        sleeping.store(1, Ordering::Relaxed);
        std::sync::atomic::fence(Ordering::SeqCst);
        let mut idle = !self.queues.as_ref().is_some_and(|q| q.busy());
        for c in self.rx.iter_mut().flatten() {
            if !matches!(c.peek(), Ok(None)) {
                idle = false;
                break;
            }
        }
        if idle && !busy(&self.seg) {
            futex::wait(bell, seen, timeout);
        }
        sleeping.store(0, Ordering::Relaxed);
    }

    /// Delivers packets to `f`, round-robin over the sources: one from each source that has
    /// one, or a burst of up to `BURST` packets (ending after `BURST_BYTES` of ring) from a
    /// source that had one in the last poll too. Returns how many were delivered. A packet's
    /// bytes are valid only during the call.
    ///
    /// `f` returns `false` to leave a packet in its ring (flow control); it is offered again
    /// on the next poll.
    ///
    /// In the queued layout, packets come in the order they were queued, whatever their
    /// source, and a packet `f` leaves is offered again, alone, on the next poll (its queue
    /// holds everything behind it).
    ///
    /// # Errors
    /// A corrupt record (bad length): [`Error::PeerProtocol`] naming the ring's sender, once.
    /// Nothing more is read from that ring (what follows a bad length cannot be framed), and
    /// the sender counts as failed from then on ([`Self::peer_departed`]), as a TCP peer
    /// that sends a malformed frame does: waits on it end with the usual peer failure.
    #[inline]
    pub fn poll<F: FnMut(Packet<'_>) -> bool>(&mut self, mut f: F) -> Result<usize> {
        let n = self.sources.len();
        let mut delivered = 0;
        for i in 0..n {
            let mut idx = self.next_src + i;
            if idx >= n {
                idx -= n;
            }
            let src = self.sources[idx];
            let Some(Some(c)) = self.rx.get_mut(src) else { continue };
            // A source that had a packet in the last round is streaming: take a burst of its
            // packets. One that had none gets one look: a lone packet (a ping-pong) is handed
            // over at once, without a look at the next slot (a cache line the sender owns, ~50
            // ns) before the caller can answer it.
            // A burst ends after BURST_BYTES too: a rank copying in a long run of large
            // packets would leave its own sends waiting (`osu_bibw` at 16-128 KiB halved).
            let burst = if self.streak[src] { BURST } else { 1 };
            let (mut k, mut bytes) = (0, 0);
            while k < burst && bytes < BURST_BYTES {
                if burst > 1 {
                    c.prefetch_ahead();
                }
                let rec = match c.peek() {
                    Ok(Some(rec)) => rec,
                    Ok(None) => break,
                    Err(Error::Malformed { what }) => {
                        self.rx[src] = None;
                        self.streak[src] = false;
                        return Err(Error::PeerProtocol { rank: src, what });
                    }
                    Err(e) => return Err(e),
                };
                let pkt = Packet { src, flags: rec.flags, total_len: rec.total_len, data: rec.data };
                if !f(pkt) {
                    break;
                }
                let span = rec.span;
                c.release(span);
                k += 1;
                bytes += span;
            }
            self.streak[src] = k > 0;
            delivered += k;
        }
        self.next_src = if self.next_src + 1 >= n { 0 } else { self.next_src + 1 };
        if let Some(q) = self.queues.as_mut() {
            delivered += q.poll(&self.seg, &mut f)?;
        }
        Ok(delivered)
    }
}

/// Transfers of at least this many bytes are written with [`copy_streaming`] by the receiver:
/// half the level-3 cache of CPU 0 as sysfs reports it (16 MiB when it does not say), beyond
/// which the destination would push the rest of the working set out of the cache anyway.
/// Measured on 2 ranks with a 32 MiB L3 (bench/results/large-pipeline.md).
pub fn streaming_copy_min() -> usize {
    static MIN: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *MIN.get_or_init(|| {
        let l3 = std::fs::read_to_string("/sys/devices/system/cpu/cpu0/cache/index3/size").ok().and_then(|s| parse_cache_size(&s));
        l3.filter(|&b| b >= 1 << 20).map_or(16 << 20, |b| b / 2)
    })
}

/// A sysfs cache size (`32768K`, `8M`, `1024`) in bytes.
fn parse_cache_size(s: &str) -> Option<usize> {
    let s = s.trim();
    let (num, mul) = match s.as_bytes().last()? {
        b'K' => (&s[..s.len() - 1], 1 << 10),
        b'M' => (&s[..s.len() - 1], 1 << 20),
        b'G' => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    num.parse::<usize>().ok()?.checked_mul(mul)
}

/// Copies `n` bytes from `src` to `dst`; up to 32 bytes (packet headers, small messages) are
/// copied inline (two overlapping unaligned words) instead of through a call to `memcpy`,
/// whose dispatch costs more than such a copy; from 2 KiB to 8 KiB in AVX vectors
/// (`VECTOR_COPY_MAX` says why). The ring's producer and the runtime's receive buffers both
/// copy with it.
///
/// # Safety
/// As [`std::ptr::copy_nonoverlapping`]: `src` readable and `dst` writable for `n` bytes, the
/// two ranges disjoint.
#[inline(always)]
pub unsafe fn copy_bytes(src: *const u8, dst: *mut u8, n: usize) {
    // SAFETY: (every arm) each word read or written lies inside [0, n) of `src` and `dst`
    // (the 16..=32 arm's last two start at n - 16 >= 0 and n - 8), which are valid for n
    // bytes and disjoint (ours); `two_words` gets W <= n <= 2 W, its contract.
    unsafe {
        match n {
            // Words of 8 bytes, not 16: what is copied at these lengths is mostly a header
            // the caller has just written in 8-byte words, and a 16-byte load across two
            // such stores waits for them to reach the cache (a store-forwarding stall).
            16..=32 => {
                let (a, b) = (load8(src), load8(src.add(8)));
                let (c, d) = (load8(src.add(n - 16)), load8(src.add(n - 8)));
                dst.cast::<u64>().write_unaligned(a);
                dst.add(8).cast::<u64>().write_unaligned(b);
                dst.add(n - 16).cast::<u64>().write_unaligned(c);
                dst.add(n - 8).cast::<u64>().write_unaligned(d);
            }
            8..=15 => two_words::<u64>(src, dst, n),
            4..=7 => two_words::<u32>(src, dst, n),
            2..=3 => two_words::<u16>(src, dst, n),
            1 => *dst = *src,
            0 => {}
            _ if n > VECTOR_COPY_ABOVE && n <= VECTOR_COPY_MAX && has_avx() => copy_avx(src, dst, n),
            _ => std::ptr::copy_nonoverlapping(src, dst, n),
        }
    }
}

/// [`copy_bytes`] into lines this core has not claimed for writing (the ring lines of a
/// stream's packet, last read by the peer's core): past 32 bytes always `memcpy`, never the
/// vector loop. From 2 KiB that is `rep movsb`, which can write whole lines without first
/// fetching them from the other core, where each vector store waits for its line. The 4 and
/// 8 KiB end pieces of a 16 KiB stream measured `osu_latency` 16 KiB 0.63 against 0.67 us
/// and 32 KiB 0.89 against 0.93 (8 paired runs; the blocking send alone of 16 KiB 0.38
/// against 0.43-0.47 us), bench/results/p2p-2026-11-28.md, session 31.
///
/// # Safety
/// As [`copy_bytes`].
#[inline(always)]
pub unsafe fn copy_unclaimed(src: *const u8, dst: *mut u8, n: usize) {
    if n <= 32 {
        // SAFETY: the caller's contract is copy_bytes's.
        unsafe { copy_bytes(src, dst, n) }
    } else {
        // SAFETY: as above (copy_nonoverlapping's contract is the same).
        unsafe { std::ptr::copy_nonoverlapping(src, dst, n) }
    }
}

/// Copies of more than this many bytes and at most [`VECTOR_COPY_MAX`] go through
/// [`copy_avx`] instead of `memcpy`. Debian 12's glibc copies 2112 bytes or more
/// (`rep_movsb_threshold` on this AMD host) with `rep movsb`, whose start-up costs more than
/// a vector loop's whole copy at these lengths; below that it runs a vector loop of its own,
/// which measured as fast as ours (`osu_bw` 512 B-2 KiB 0.93-0.96x with ours).
const VECTOR_COPY_ABOVE: usize = 2048;

/// The longest copy [`copy_avx`] makes. Measured against `memcpy` (3 interleaved runs, quiet
/// host): `osu_latency` 4 KiB 0.29 against 0.37 us, 8 KiB 0.46 against 0.53; `osu_bw` 4 KiB
/// 32-35 against 17.5-18.4 GB/s, 8 KiB 33-39 against 27.5-30; `osu_bibw` 4 KiB 40-42
/// against 28-30. Longer copies were no faster (16 KiB messages) or slower: the 12 KiB
/// first piece of a pipelined 128 KiB stream, whose ring lines nobody has claimed for
/// writing, took `osu_latency` 128 KiB from 2.7 to 3.0 us (likely because a vector loop
/// fetches each line it writes, where `rep movsb` may write whole lines without the fetch).
const VECTOR_COPY_MAX: usize = 8192;

/// Whether this CPU has AVX (32-byte vector loads and stores); read once by the standard
/// library and cached.
#[inline(always)]
fn has_avx() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Copies `n` bytes (at least 128) in 32-byte vectors: the first one unaligned, then four
/// at a time from the first 32-byte aligned destination byte (stores that split no line),
/// and the last four ending at `n` (overlapping what came before).
///
/// # Safety
/// As [`copy_bytes`], `n >= 128`, and the CPU must have AVX.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx")]
unsafe fn copy_avx(src: *const u8, dst: *mut u8, n: usize) {
    use std::arch::x86_64::{__m256i, _mm256_loadu_si256, _mm256_storeu_si256};
    // SAFETY: every vector read or written lies inside [0, n) of `src` and `dst` (the first
    // at 0 with n >= 32; the loop's at i..i + 128 with i < n - 128; the last four at n - 128
    // >= 0), which the caller made valid and disjoint; the caller checked AVX; the loads and
    // stores are the unaligned kind.
    unsafe {
        let (s, d) = (src.cast::<__m256i>(), dst.cast::<__m256i>());
        let t = n - 128;
        let (w, x, y, z) = (
            _mm256_loadu_si256(src.add(t).cast()),
            _mm256_loadu_si256(src.add(t + 32).cast()),
            _mm256_loadu_si256(src.add(t + 64).cast()),
            _mm256_loadu_si256(src.add(t + 96).cast()),
        );
        // The first vector unaligned, the loop from the first 32-byte aligned destination
        // byte past it (stores that cross no line).
        _mm256_storeu_si256(d, _mm256_loadu_si256(s));
        let mut i = (dst as usize).wrapping_neg() & 31;
        while i < t {
            let (s, d) = (s.byte_add(i), d.byte_add(i));
            let (a, b, c, e) =
                (_mm256_loadu_si256(s), _mm256_loadu_si256(s.add(1)), _mm256_loadu_si256(s.add(2)), _mm256_loadu_si256(s.add(3)));
            _mm256_storeu_si256(d, a);
            _mm256_storeu_si256(d.add(1), b);
            _mm256_storeu_si256(d.add(2), c);
            _mm256_storeu_si256(d.add(3), e);
            i += 128;
        }
        _mm256_storeu_si256(dst.add(t).cast(), w);
        _mm256_storeu_si256(dst.add(t + 32).cast(), x);
        _mm256_storeu_si256(dst.add(t + 64).cast(), y);
        _mm256_storeu_si256(dst.add(t + 96).cast(), z);
    }
}

#[cfg(not(target_arch = "x86_64"))]
unsafe fn copy_avx(src: *const u8, dst: *mut u8, n: usize) {
    // SAFETY: as the caller's contract.
    unsafe { std::ptr::copy_nonoverlapping(src, dst, n) }
}

/// Reads the 8 bytes at `p` (any alignment) with one 8-byte load. Written in assembly so
/// that the compiler cannot merge two neighbouring reads into one 16-byte load: the headers
/// [`copy_bytes`] copies were just written in 8-byte words, and a 16-byte load across two
/// such stores waits until both reach the cache (a store-forwarding stall, about 15 cycles,
/// longer while older stores wait for their lines).
///
/// # Safety
/// `p` must be readable for 8 bytes.
#[inline(always)]
unsafe fn load8(p: *const u8) -> u64 {
    #[cfg(target_arch = "x86_64")]
    {
        let v: u64;
        // SAFETY: the caller makes `p` readable for 8 bytes; x86-64 loads need no alignment.
        unsafe {
            std::arch::asm!("mov {v}, qword ptr [{p}]", p = in(reg) p, v = out(reg) v, options(nostack, preserves_flags, readonly, pure))
        };
        v
    }
    #[cfg(not(target_arch = "x86_64"))]
    // SAFETY: as above.
    unsafe {
        p.cast::<u64>().read_unaligned()
    }
}

/// Copies `n` bytes as two unaligned words of type `W`, the first at 0 and the second ending
/// at `n` (they overlap when `n < 2 * size_of::<W>()`).
///
/// # Safety
/// As [`copy_bytes`], and `size_of::<W>() <= n <= 2 * size_of::<W>()`.
#[inline(always)]
unsafe fn two_words<W: Copy>(src: *const u8, dst: *mut u8, n: usize) {
    let w = std::mem::size_of::<W>();
    // SAFETY: both words lie in [0, n) of `src` and of `dst` (the second starts at n - w >= 0),
    // which the caller made valid and disjoint; unaligned accesses need no alignment.
    unsafe {
        let (a, b) = (src.cast::<W>().read_unaligned(), src.add(n - w).cast::<W>().read_unaligned());
        dst.cast::<W>().write_unaligned(a);
        dst.add(n - w).cast::<W>().write_unaligned(b);
    }
}

/// Copies `src` into `dst` (the shorter length of the two) with non-temporal stores where the
/// CPU has them: the destination bypasses the caches, which saves the read of every
/// destination line (and the eviction of useful data) when a transfer is far larger than the
/// last-level cache. Smaller copies are faster with a plain `memcpy`. Returns the bytes copied.
pub fn copy_streaming(dst: &mut [u8], src: &[u8]) -> usize {
    let n = dst.len().min(src.len());
    // SAFETY: both slices hold at least `n` bytes, and a `&mut` slice cannot overlap a `&`
    // one.
    unsafe { copy_streaming_raw(dst.as_mut_ptr(), src.as_ptr(), n) };
    n
}

/// [`copy_streaming`] between raw pointers, for memory no slice may cover (a peer's shared
/// heap, which the peer may touch outside the range copied).
///
/// # Safety
/// `src` must be readable and `dst` writable for `n` bytes, the two ranges must not overlap,
/// and nothing may write `[src, src + n)` or access `[dst, dst + n)` meanwhile.
pub(crate) unsafe fn copy_streaming_raw(dst: *mut u8, src: *const u8, n: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_sfence, _mm_stream_si128};
        // Head: plain copy up to the first 16-byte aligned destination byte; tail: the rest
        // after the last whole 64 bytes.
        let head = dst.align_offset(16).min(n);
        let body = (n - head) & !63;
        let done = head + body;
        // SAFETY: [0, head) and [done, n) lie inside both ranges, which the caller vouches
        // for (readable, writable, not overlapping, untouched meanwhile).
        unsafe {
            std::ptr::copy_nonoverlapping(src, dst, head);
            std::ptr::copy_nonoverlapping(src.add(done), dst.add(done), n - done);
        }
        let (d, s) = (dst.wrapping_add(head), src.wrapping_add(head));
        let mut i = 0;
        while i < body {
            // SAFETY: SSE2 is part of x86_64. [head + i, head + i + 64) lies inside both
            // ranges (`body` is a multiple of 64 and `head + body <= n`); `d + i` is 16-byte
            // aligned (`head` aligned it and `i` is a multiple of 16), as `_mm_stream_si128`
            // requires; the loads are unaligned loads.
            unsafe {
                let a = _mm_loadu_si128(s.add(i).cast::<__m128i>());
                let b = _mm_loadu_si128(s.add(i + 16).cast::<__m128i>());
                let c = _mm_loadu_si128(s.add(i + 32).cast::<__m128i>());
                let e = _mm_loadu_si128(s.add(i + 48).cast::<__m128i>());
                _mm_stream_si128(d.add(i).cast::<__m128i>(), a);
                _mm_stream_si128(d.add(i + 16).cast::<__m128i>(), b);
                _mm_stream_si128(d.add(i + 32).cast::<__m128i>(), c);
                _mm_stream_si128(d.add(i + 48).cast::<__m128i>(), e);
            }
            i += 64;
        }
        // SAFETY: a store fence has no memory-safety requirement; it orders the streaming
        // stores before whatever this rank publishes next.
        unsafe { _mm_sfence() };
    }
    #[cfg(not(target_arch = "x86_64"))]
    // SAFETY: the caller vouches for both ranges.
    unsafe {
        std::ptr::copy_nonoverlapping(src, dst, n)
    };
}

/// Wakes the sleeper on `bell`.
#[cold]
fn ring_bell(bell: &AtomicU32) {
    bell.fetch_add(1, Ordering::Release);
    futex::wake(bell);
}

impl Drop for ShmFabric {
    fn drop(&mut self) {
        self.seg.set_gone(self.rank, segment::GONE_DETACHED);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::packet::PKT_WHOLE;

    #[test]
    fn copy_bytes_copies_every_length_exactly() {
        let lens: Vec<usize> = (0..=40).collect();
        check_copies(&[0], &[0], &lens, copy_with_copy_bytes);
    }

    /// Rank 0 and rank 1 of a fresh 2-rank segment, in this process.
    fn pair() -> (ShmFabric, ShmFabric) {
        let mut b = [0u8; 8];
        getrandom::getrandom(&mut b).expect("random name");
        let name = format!("tmpi-test-{}", b.iter().map(|x| format!("{x:02x}")).collect::<String>());
        let a = ShmFabric::create(&name, 0, 2, 1 << 16).expect("create");
        let b = ShmFabric::open(&name, 1, 2).expect("open");
        a.segment().unlink().expect("unlink");
        (a, b)
    }

    /// A source whose last poll found nothing gets one packet per poll (a ping is answered
    /// without a look further); one that is streaming gets up to a burst, in order.
    #[test]
    fn a_streaming_source_is_drained_in_bursts_and_a_lone_packet_alone() {
        let (mut a, mut b) = pair();
        let n = BURST as u32 + 8;
        for i in 0..n {
            assert!(a.try_send(1, PKT_WHOLE, 4, &[&i.to_le_bytes()]).expect("send"));
        }
        let mut got = Vec::new();
        let mut take = |f: &mut ShmFabric| {
            f.poll(|p| {
                got.push(u32::from_le_bytes(p.data.try_into().expect("4 bytes")));
                true
            })
            .expect("poll")
        };
        assert_eq!(take(&mut b), 1, "first packet after a quiet poll: alone");
        assert_eq!(take(&mut b), BURST, "then a burst");
        assert_eq!(take(&mut b), 7);
        assert_eq!(take(&mut b), 0);
        assert!(a.try_send(1, PKT_WHOLE, 4, &[&n.to_le_bytes()]).expect("send"));
        assert!(a.try_send(1, PKT_WHOLE, 4, &[&(n + 1).to_le_bytes()]).expect("send"));
        assert_eq!(take(&mut b), 1, "quiet again: one look");
        assert_eq!(take(&mut b), 1);
        assert_eq!(got, (0..n + 2).collect::<Vec<_>>());
        // A burst also ends once it has taken BURST_BYTES of the ring (the packet that
        // crosses the limit is its last).
        let big = vec![7u8; 5000];
        for _ in 0..4 {
            assert!(a.try_send(1, PKT_WHOLE, 5000, &[&big]).expect("send"));
        }
        assert_eq!(b.poll(|_| true).expect("poll"), 2, "streaming: 5 KiB, then 10 KiB > BURST_BYTES");
        assert_eq!(b.poll(|_| true).expect("poll"), 2);
        assert_eq!(b.poll(|_| true).expect("poll"), 0);
        // A packet the caller leaves stays first in its ring.
        assert!(a.try_send(1, PKT_WHOLE, 2, &[b"hi"]).expect("send"));
        assert_eq!(b.poll(|_| false).expect("poll"), 0);
        assert_eq!(b.poll(|p| p.data == b"hi").expect("poll"), 1);
    }

    /// A corrupt record header in a peer's ring is an error naming that peer, reported once
    /// (the record is never read); from then on that peer counts as failed, even once it
    /// finalizes, and its ring is read no more.
    #[test]
    fn a_corrupt_record_names_its_sender() {
        let (mut a, mut b) = pair();
        assert!(a.try_send(1, PKT_WHOLE, 4, &[b"ping"]).expect("send"));
        a.segment().ring_first_word(0, 1).fetch_or(0xff_ffff, Ordering::AcqRel);
        assert!(!b.peer_departed(0));
        let e = b.poll(|_| panic!("delivered")).expect_err("corrupt");
        assert!(matches!(e, Error::PeerProtocol { rank: 0, .. }), "{e}");
        assert!(b.peer_departed(0), "the corrupt ring's sender counts as failed");
        assert_eq!(b.poll(|_| panic!("delivered")).expect("reported once"), 0);
        assert!(!b.pending_from(0));
        a.mark_finalized();
        assert!(!b.peer_finalized(0) && b.peer_departed(0), "failed, not finalized");
        // The other direction is untouched.
        assert!(b.try_send(0, PKT_WHOLE, 4, &[b"pong"]).expect("send"));
        assert_eq!(a.poll(|p| p.data == b"pong").expect("poll"), 1);
    }

    /// The ranks' ends of a fresh segment of `n` ranks with the queued layout, in this process.
    fn queued(n: usize) -> Vec<ShmFabric> {
        let mut b = [0u8; 8];
        getrandom::getrandom(&mut b).expect("random name");
        let name = format!("tmpi-test-{}", b.iter().map(|x| format!("{x:02x}")).collect::<String>());
        let mut v = vec![ShmFabric::create(&name, 0, n, segment::QUEUED).expect("create")];
        for r in 1..n {
            v.push(ShmFabric::open(&name, r, n).expect("open"));
        }
        v[0].segment().unlink().expect("unlink");
        v
    }

    /// Takes every packet that waits at `f` as (source, flags, total, payload).
    fn drain(f: &mut ShmFabric) -> Vec<(usize, u8, u64, Vec<u8>)> {
        let mut got = Vec::new();
        while f
            .poll(|p| {
                got.push((p.src, p.flags, p.total_len, p.data.to_vec()));
                true
            })
            .expect("poll")
            > 0
        {}
        got
    }

    /// Packets of every size class (inline, small and large fragments, in several parts)
    /// arrive whole, in the order each sender sent them; `drained` and `pending_from` follow
    /// what was taken; a packet the receiver leaves is offered again first.
    #[test]
    fn queued_layout_delivers_in_order_and_keeps_what_is_left() {
        let mut f = queued(3);
        assert!(f[0].segment().queued() && f[0].max_packet() == inbox::LARGE_FRAG);
        let sizes = [0usize, 1, 95, 96, 97, 4000, 4096, 4097, 100_000, inbox::LARGE_FRAG];
        let body = |src: usize, i: usize, len: usize| (0..len).map(|k| (k * 7 + i * 13 + src) as u8).collect::<Vec<u8>>();
        for (i, &len) in sizes.iter().enumerate() {
            for src in [1, 2] {
                let b = body(src, i, len);
                let (x, y) = b.split_at(len / 3);
                assert!(f[src].try_send(0, 3, len as u64 + 5, &[x, y]).expect("send"));
            }
        }
        assert!(!f[1].drained(0) && f[0].pending_from(1) && f[0].pending_from(2) && !f[1].pending_from(0));
        // The first packet is left: it comes again, first, on the next poll.
        assert_eq!(f[0].poll(|_| false).expect("poll"), 0);
        assert!(f[0].pending_from(1));
        let got = drain(&mut f[0]);
        assert_eq!(got.len(), 2 * sizes.len());
        for src in [1, 2] {
            let mine: Vec<_> = got.iter().filter(|g| g.0 == src).collect();
            for (i, &len) in sizes.iter().enumerate() {
                assert_eq!((mine[i].1, mine[i].2), (3, len as u64 + 5));
                assert!(mine[i].3 == body(src, i, len), "packet {i} from {src}");
            }
        }
        assert!(f[1].drained(0) && f[2].drained(0) && !f[0].pending_from(1));
        assert!(f[1].try_send(1, 0, 1, &[b"x"]).is_err() && f[1].try_send(3, 0, 1, &[b"x"]).is_err());
        assert!(f[1].try_send(0, 0, 1, &[&vec![0u8; inbox::LARGE_FRAG + 1]]).is_err());
    }

    /// A full queue and an exhausted pool push back (`Ok(false)`) and take packets again
    /// once the receiver has read some; fragments are used again.
    #[test]
    fn queued_layout_applies_back_pressure() {
        let mut f = queued(2);
        let mut sent = 0;
        while f[1].try_send(0, 0, 8, &[&[1u8; 8]]).expect("send") {
            sent += 1;
        }
        assert_eq!(sent, inbox::CELLS);
        assert_eq!(drain(&mut f[0]).len(), inbox::CELLS);
        let big = vec![2u8; 8192];
        let mut frags = 0;
        while f[1].try_send(0, 0, 8192, &[&big]).expect("send") {
            frags += 1;
        }
        assert_eq!(frags, inbox::LARGE_FRAGS, "every large fragment in use");
        assert_eq!(drain(&mut f[0]).len(), frags);
        for _ in 0..10 * inbox::FRAGS {
            assert!(f[1].try_send(0, 0, 8192, &[&big]).expect("send"));
            assert_eq!(drain(&mut f[0]).len(), 1);
        }
        // Memory was given to the fragments used, not to the whole pool.
        let bytes = f[0].segment().allocated_bytes().expect("stat");
        assert!(bytes < segment::segment_bytes(2, segment::QUEUED).expect("size"), "{bytes}");
    }

    /// Many senders in threads into one queue, with packets of every class: each sender's
    /// packets arrive whole and in order.
    #[test]
    fn queued_layout_takes_many_senders_at_once() {
        let n = 5;
        let per = 20_000u32;
        let mut f = queued(n);
        let mut rx = f.remove(0);
        std::thread::scope(|s| {
            for mut tx in f {
                s.spawn(move || {
                    for i in 0..per {
                        let len = [4usize, 90, 300, 5000][i as usize % 4];
                        let mut b = vec![tx.rank() as u8; len];
                        b[..4].copy_from_slice(&i.to_le_bytes());
                        while !tx.try_send(0, 1, len as u64, &[&b]).expect("send") {
                            std::thread::yield_now();
                        }
                    }
                    // Finalized only once everything sent has been taken.
                    while !tx.drained(0) {
                        std::thread::yield_now();
                    }
                });
            }
            let mut next = vec![0u32; n];
            while next[1..].iter().any(|&k| k < per) {
                rx.poll(|p| {
                    let i = u32::from_le_bytes(p.data[..4].try_into().expect("4 bytes"));
                    assert_eq!(i, next[p.src], "from {}", p.src);
                    assert!(p.data[4..].iter().all(|&b| b == p.src as u8));
                    next[p.src] += 1;
                    true
                })
                .expect("poll");
            }
        });
    }

    /// A corrupt cell is an error naming its sender, once; the sender is then cut off (its
    /// later packets are dropped) and the others go on.
    #[test]
    fn queued_layout_cuts_off_the_sender_of_a_corrupt_cell() {
        let mut f = queued(3);
        assert!(f[1].try_send(0, 0, 4, &[b"ping"]).expect("send"));
        // The cell's length word (at byte 16 of the first cell of rank 0's queue) lies.
        let (regions, _) = f[0].segment().queue_areas();
        let cells = inbox::region_bytes(3) - inbox::CELLS * inbox::CELL_BYTES;
        // SAFETY: the first cell of rank 0's queue lies inside the mapping; its length word is
        // 4-aligned, and nothing else touches it meanwhile (the sender is done).
        unsafe { regions.as_ptr().add(cells + 16).cast::<u32>().write_volatile(5000) };
        let e = f[0].poll(|_| panic!("delivered")).expect_err("corrupt");
        assert!(matches!(e, Error::PeerProtocol { rank: 1, .. }), "{e}");
        assert!(f[0].peer_departed(1) && !f[0].peer_departed(2));
        assert!(f[1].try_send(0, 0, 4, &[b"more"]).expect("send"));
        assert!(f[2].try_send(0, 0, 4, &[b"pong"]).expect("send"));
        let got = drain(&mut f[0]);
        assert_eq!(got.len(), 1);
        assert_eq!((got[0].0, &got[0].3[..]), (2, &b"pong"[..]));
        f[1].mark_finalized();
        assert!(!f[0].peer_finalized(1));
    }

    /// A cell claimed by a rank that died before publishing it is skipped once the receiver
    /// sees its claimant gone; until then it counts as pending.
    #[test]
    fn queued_layout_skips_a_cell_its_dead_claimant_never_published() {
        let mut f = queued(3);
        let (regions, _) = f[0].segment().queue_areas();
        let cells = inbox::region_bytes(3) - inbox::CELLS * inbox::CELL_BYTES;
        // Rank 1 claims cell 0 (position 0) and `head` moves to 1, as its claim would.
        // SAFETY: the queue's control word and first cell's state lie inside the mapping,
        // 8-aligned, and are only accessed atomically.
        unsafe {
            (*regions.as_ptr().cast::<std::sync::atomic::AtomicU64>()).store(1, Ordering::Release);
            (*regions.as_ptr().add(cells).cast::<std::sync::atomic::AtomicU64>()).store(2, Ordering::Release);
        }
        assert!(f[2].try_send(0, 0, 4, &[b"late"]).expect("send"));
        assert!(f[0].pending_from(1) && f[0].pending_from(2), "a claimed cell hides what follows");
        for _ in 0..3 * 4096 {
            assert_eq!(f[0].poll(|_| true).expect("poll"), 0, "nothing passes a live claimant");
        }
        f[0].segment().set_gone(1, segment::GONE_DETACHED);
        let mut got = Vec::new();
        for _ in 0..2 * 4096 {
            got.extend(drain(&mut f[0]));
        }
        assert_eq!(got.len(), 1);
        assert_eq!((got[0].0, &got[0].3[..]), (2, &b"late"[..]));
    }

    /// Runs `copy(dst, src)` at every offset pair and length given, from a patterned source
    /// into a destination filled with 0xee, and checks the copy and that nothing outside it
    /// was written.
    fn check_copies(dst_offs: &[usize], src_offs: &[usize], lens: &[usize], copy: impl Fn(&mut [u8], &[u8])) {
        let src: Vec<u8> = (0..9000u32).map(|i| (i * 13 + 5) as u8).collect();
        for &dst_off in dst_offs {
            for &src_off in src_offs {
                for &len in lens {
                    let mut dst = vec![0xeeu8; dst_off + len + 8];
                    copy(&mut dst[dst_off..dst_off + len], &src[src_off..src_off + len]);
                    assert_eq!(&dst[dst_off..dst_off + len], &src[src_off..src_off + len], "{dst_off} {src_off} {len}");
                    assert!(dst[..dst_off].iter().chain(&dst[dst_off + len..]).all(|&b| b == 0xee), "wrote outside");
                }
            }
        }
    }

    /// [`copy_bytes`] between two slices of one length.
    fn copy_with_copy_bytes(dst: &mut [u8], src: &[u8]) {
        assert_eq!(dst.len(), src.len());
        // SAFETY: `dst` and `src` hold `src.len()` bytes each and cannot overlap (`&mut`).
        unsafe { copy_bytes(src.as_ptr(), dst.as_mut_ptr(), src.len()) }
    }

    #[test]
    fn copy_bytes_copies_vector_lengths_at_every_alignment() {
        let lens = [2047, 2048, 2049, 2111, 2112, 3000, 4096, 4097, 8191, 8192, 8193];
        check_copies(&[0, 1, 8, 24, 31, 32, 33], &[0, 3, 16], &lens, copy_with_copy_bytes);
    }

    #[test]
    fn copy_unclaimed_copies_every_length() {
        let lens = [0, 1, 31, 32, 33, 2048, 2049, 4096, 8192, 8193];
        check_copies(&[0, 1, 32], &[0, 3], &lens, |dst, src| {
            // SAFETY: `dst` and `src` hold `src.len()` bytes each (check_copies slices them so)
            // and cannot overlap (`&mut`).
            unsafe { copy_unclaimed(src.as_ptr(), dst.as_mut_ptr(), src.len()) }
        });
    }

    #[test]
    fn streaming_copy_is_a_copy_at_every_alignment_and_length() {
        let lens = [0, 1, 15, 16, 63, 64, 65, 127, 128, 1000, 4096 + 17];
        check_copies(&[0, 1, 8, 15, 16, 33], &[0, 1, 5, 16], &lens, |dst, src| assert_eq!(copy_streaming(dst, src), src.len()));
        let src: Vec<u8> = (0..5000u32).map(|i| (i * 7 + 3) as u8).collect();
        // Unequal lengths: the shorter one counts.
        let mut dst = [0u8; 100];
        assert_eq!(copy_streaming(&mut dst, &src[..70]), 70);
        assert_eq!(copy_streaming(&mut dst[..10], &src), 10);
    }

    #[test]
    fn cache_sizes_parse_as_sysfs_writes_them() {
        assert_eq!(parse_cache_size("32768K\n"), Some(32 << 20));
        assert_eq!(parse_cache_size("8M"), Some(8 << 20));
        assert_eq!(parse_cache_size("4096"), Some(4096));
        assert_eq!(parse_cache_size(""), None);
        assert_eq!(parse_cache_size("lots"), None);
        assert_eq!(parse_cache_size("99999999999999999999G"), None);
        assert!(streaming_copy_min() >= 1 << 19);
    }
}
