//! The shared-memory links of a large job: one queue per receiving rank and one pool of
//! fragments per sending rank, so that the segment grows with the ranks, not their square.
//!
//! A job of up to `TMPI_SHM_PAIRS_MAX` ranks (64 by default) keeps one ring per ordered pair
//! ([`super::ring`]); a larger one uses these queues instead (the segment's `ring_size` is 0).
//! The design is that of Open MPI's `btl/vader` (a FIFO per receiver, fragments from per-sender
//! free lists) and MPICH's ch4 `posix` eager module (a queue of cells per receiver, cells from
//! per-sender pools); see `bench/results/shm-scale.md` for the measurements behind it.
//!
//! ```text
//! per rank (its "region"):
//!   InboxCtl           head: the next position producers claim (128 bytes)
//!   taken[nranks]      packets this rank took from each sender (u64 each), for `drained`
//!   busy[FRAGS]        this rank's fragments: 1 while a receiver holds one (u32 each)
//!   cells[CELLS]       the queue, 128 bytes each
//! per rank, in the pool area (4096-aligned):
//!   SMALL_FRAGS fragments of SMALL_FRAG bytes, then LARGE_FRAGS of LARGE_FRAG bytes
//! ```
//!
//! A cell is a 32-byte header (`state`, source rank, flags, length, fragment, total length)
//! and [`INLINE_MAX`] bytes of payload: a packet that fits is copied into the cell, a longer
//! one into a fragment of the sender's pool that the cell names. The fragment's `busy` word is
//! set by the sender when it takes it and cleared by the receiver once it has read it.
//!
//! The queue is a bounded multi-producer, single-consumer queue of cells with a sequence
//! number per cell (D. Vyukov's bounded queue), with one change: a producer claims a cell by a
//! compare-and-swap on the cell's `state` that writes its own rank into it, then moves `head`
//! on (any producer that finds the cell at `head` claimed or published moves `head` on for
//! it). So a claimed cell names its producer, and a consumer stuck behind a cell whose
//! producer died between its claim and its publication skips it instead of waiting forever.
//!
//! `state` packs a sequence number (48 bits) and a claimant (16 bits, rank + 1, 0 for none).
//! For the cell of position `pos`: free is `(pos, 0)`, claimed `(pos, src + 1)`, published
//! `(pos + 1, 0)`, and once consumed it is free for the position one lap later,
//! `(pos + CELLS, 0)`. The stored sequence is the logical one minus the cell's index, so that
//! the zeroed memory of a fresh segment is a queue whose every cell is free.
//!
//! Who writes what: producers write `head`, the cell they claimed and fragments of their own
//! pool; the consumer writes `state` (consumed), `taken`, and the `busy` words of the
//! fragments it read. A producer publishes a cell with a release store of `state` after
//! writing the rest; the consumer reads the cell (and the fragment it names) after an acquire
//! load of `state`, and releases the cell and fragment with release stores once it is done.

use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use super::queue_layout::{frag_place, region_layout, CELL_HDR};
pub use super::queue_layout::{
    region_bytes, CELLS, CELL_BYTES, FRAGS, INLINE_MAX, LARGE_FRAG, LARGE_FRAGS, POOL_BYTES, SMALL_FRAG, SMALL_FRAGS,
};
use super::segment::{Segment, GONE_FINALIZED};
use crate::error::{Error, Result};
use crate::packet::Packet;

/// `frag` of a cell whose payload is inline.
const NO_FRAG: u32 = u32::MAX;
/// Bits of `state` that hold the claimant.
const TAG_BITS: u32 = 16;
const TAG_MASK: u64 = (1 << TAG_BITS) - 1;
/// Polls stuck behind one claimed cell between two looks at whether its claimant lives.
const STUCK_CHECK_EVERY: u32 = 4096;
/// Most packets one poll takes.
const BURST: usize = 32;
/// Bytes after which a poll ends (the packet that crosses it is the last).
const BURST_BYTES: usize = 256 << 10;

const _: () = assert!(CELLS.is_power_of_two() && FRAGS <= 128 && super::segment::MAX_RANKS < TAG_MASK as usize);

/// Control block of one rank's queue.
#[repr(C, align(128))]
struct InboxCtl {
    /// The next position a producer claims (monotonic).
    head: AtomicU64,
    _pad: [u8; 120],
}

/// Header of one cell; `INLINE_MAX` bytes of payload follow it.
#[repr(C)]
struct CellHdr {
    state: AtomicU64,
    src: u32,
    flags: u8,
    _pad: [u8; 3],
    len: u32,
    frag: u32,
    total: u64,
}

const _: () = assert!(std::mem::size_of::<CellHdr>() == CELL_HDR && std::mem::size_of::<InboxCtl>() == 128);

fn pack(seq: u64, tag: u64) -> u64 {
    (seq << TAG_BITS) | tag
}

/// The logical sequence number and claimant of cell `idx` from its stored `state`.
fn unpack(state: u64, idx: usize) -> (u64, u64) {
    ((state >> TAG_BITS).wrapping_add(idx as u64) & SEQ_MASK, state & TAG_MASK)
}

const SEQ_MASK: u64 = (1 << (64 - TAG_BITS)) - 1;

/// The stored `state` of cell `idx` for logical sequence `seq` and claimant `tag`.
fn state_of(seq: u64, tag: u64, idx: usize) -> u64 {
    pack(seq.wrapping_sub(idx as u64) & SEQ_MASK, tag)
}

/// `seq - pos` as a signed number of 48 bits.
fn seq_diff(seq: u64, pos: u64) -> i64 {
    ((seq.wrapping_sub(pos) << TAG_BITS) as i64) >> TAG_BITS
}

/// A packet the consumer was refused, held until it is taken (its cell is already free).
struct Parked {
    src: usize,
    flags: u8,
    total: u64,
    /// The payload of an inline packet (copied out of its cell).
    inline: Vec<u8>,
    /// The fragment and length of a packet in a fragment (still busy).
    frag: Option<(u32, usize)>,
}

/// One rank's ends of the queues: producer into every other rank's queue, consumer of its own.
pub(crate) struct Queues {
    me: usize,
    nranks: usize,
    /// Start of rank 0's region; regions follow one another.
    regions: NonNull<u8>,
    stride: usize,
    /// Start of rank 0's pool; pools follow one another.
    pools: NonNull<u8>,
    /// Fragments of this rank's pool that have memory behind them: the first `small` small
    /// ones and the first `large` large ones.
    small: usize,
    large: usize,
    /// Where the search for a free fragment starts next, per class.
    next_small: usize,
    next_large: usize,
    /// Packets sent to each rank.
    sent: Vec<u64>,
    /// Packets taken from each rank (the consumer's copy of its `taken` counters).
    taken: Vec<u64>,
    /// The consumer's position.
    tail: u64,
    parked: Option<Parked>,
    /// Senders cut off for a corrupt cell.
    cut: Vec<bool>,
    /// Polls spent behind the claimed cell at `tail`.
    stuck: u32,
}

// SAFETY: the pointers point into the segment mapping, which the fabric owns alongside; all
// shared words are accessed atomically or under the queue protocol.
unsafe impl Send for Queues {}

impl Queues {
    /// This rank's ends in `seg`, a segment of the queued layout.
    pub(crate) fn new(seg: &Segment, me: usize) -> Self {
        let n = seg.nranks();
        let (regions, pools) = seg.queue_areas();
        Queues {
            me,
            nranks: n,
            regions,
            stride: region_bytes(n),
            pools,
            small: 0,
            large: 0,
            next_small: 0,
            next_large: 0,
            sent: vec![0; n],
            taken: vec![0; n],
            tail: 0,
            parked: None,
            cut: vec![false; n],
            stuck: 0,
        }
    }

    fn region(&self, rank: usize) -> *mut u8 {
        debug_assert!(rank < self.nranks);
        self.regions.as_ptr().wrapping_add(rank * self.stride)
    }

    fn ctl(&self, rank: usize) -> &InboxCtl {
        // SAFETY: every rank's region starts with an InboxCtl (128-aligned: the regions start
        // on a multiple of 128 and their stride is one) inside the mapping, which lives as
        // long as `self`; it holds atomics only.
        unsafe { &*self.region(rank).cast::<InboxCtl>() }
    }

    fn taken_word(&self, rank: usize, src: usize) -> &AtomicU64 {
        let (taken, ..) = region_layout(self.nranks);
        // SAFETY: `taken` holds `nranks` words inside the region; 8-aligned; atomics only.
        unsafe { &*self.region(rank).add(taken + src * 8).cast::<AtomicU64>() }
    }

    fn busy_word(&self, rank: usize, frag: usize) -> &AtomicU32 {
        let (_, busy, ..) = region_layout(self.nranks);
        // SAFETY: `busy` holds FRAGS words inside the region (frag < FRAGS, checked by every
        // caller); 4-aligned; atomics only.
        unsafe { &*self.region(rank).add(busy + frag * 4).cast::<AtomicU32>() }
    }

    /// The cell of position `pos` in `rank`'s queue, and its index.
    fn cell(&self, rank: usize, pos: u64) -> (*mut CellHdr, usize) {
        let (.., cells, _) = region_layout(self.nranks);
        let idx = (pos as usize) & (CELLS - 1);
        (self.region(rank).wrapping_add(cells + idx * CELL_BYTES).cast::<CellHdr>(), idx)
    }

    fn state(&self, cell: *mut CellHdr) -> &AtomicU64 {
        // SAFETY: every caller passes a cell from `Self::cell`: inside the mapping, which
        // lives as long as `self`, 128-aligned; `state` is an atomic.
        unsafe { &(*cell).state }
    }

    fn frag_ptr(&self, rank: usize, frag: usize) -> *mut u8 {
        self.pools.as_ptr().wrapping_add(rank * POOL_BYTES + frag_place(frag).0)
    }

    /// Whether everything sent to `dest` has been taken.
    pub(crate) fn drained(&self, dest: usize) -> bool {
        dest < self.nranks && dest != self.me && self.taken_word(dest, self.me).load(Ordering::Acquire) == self.sent[dest]
    }

    /// Whether `src` was cut off for a corrupt cell.
    pub(crate) fn cut_off(&self, src: usize) -> bool {
        self.cut.get(src).copied().unwrap_or(false)
    }

    /// A free fragment of this rank's pool of at least `len` bytes (taken: `busy` set), giving
    /// a new one memory when all that have some are in use. `None` when every fragment that
    /// fits is in use (or no more memory can be had and some are in use).
    fn take_frag(&mut self, seg: &Segment, len: usize) -> Result<Option<usize>> {
        let small = len <= SMALL_FRAG;
        let (first, have, next) = if small { (0, self.small, self.next_small) } else { (SMALL_FRAGS, self.large, self.next_large) };
        for k in 0..have {
            let i = (next + k) % have;
            let busy = self.busy_word(self.me, first + i);
            if busy.load(Ordering::Acquire) == 0 {
                busy.store(1, Ordering::Relaxed);
                let nx = (i + 1) % have;
                if small {
                    self.next_small = nx
                } else {
                    self.next_large = nx
                }
                return Ok(Some(first + i));
            }
        }
        let max = if small { SMALL_FRAGS } else { LARGE_FRAGS };
        if have < max {
            let f = first + have;
            let (off, cap) = frag_place(f);
            match seg.allocate_pool_range(self.me, off, cap) {
                Ok(()) => {
                    if small {
                        self.small += 1
                    } else {
                        self.large += 1
                    }
                    self.busy_word(self.me, f).store(1, Ordering::Relaxed);
                    return Ok(Some(f));
                }
                Err(e) if have == 0 => return Err(e),
                Err(_) => {}
            }
        }
        if small && self.large > 0 {
            return self.take_frag(seg, SMALL_FRAG + 1);
        }
        Ok(None)
    }

    /// Claims the next free cell of `dest`'s queue; `None` when it is full.
    fn claim(&self, dest: usize) -> Option<(*mut CellHdr, usize, u64)> {
        let head = &self.ctl(dest).head;
        loop {
            let pos = head.load(Ordering::Acquire);
            let (cell, idx) = self.cell(dest, pos);
            let st = self.state(cell);
            let w = st.load(Ordering::Acquire);
            let (seq, tag) = unpack(w, idx);
            match seq_diff(seq, pos) {
                0 if tag == 0 => {
                    let mine = state_of(pos, self.me as u64 + 1, idx);
                    if st.compare_exchange(w, mine, Ordering::AcqRel, Ordering::Relaxed).is_ok() {
                        let _ = head.compare_exchange(pos, pos + 1, Ordering::AcqRel, Ordering::Relaxed);
                        return Some((cell, idx, pos));
                    }
                }
                // Claimed or published at `pos`, `head` not yet moved past it: move it on.
                0 | 1 => {
                    let _ = head.compare_exchange(pos, pos + 1, Ordering::AcqRel, Ordering::Relaxed);
                }
                // The cell still holds the previous lap: full, unless `head` moved meanwhile.
                d if d < 0 && head.load(Ordering::Acquire) == pos => return None,
                // A stale `head`: read it again.
                _ => {}
            }
        }
    }

    /// Sends one packet (the concatenation of `parts`) to `dest`; `Ok(false)` when its queue
    /// or this rank's pool has no room now.
    pub(crate) fn try_send(&mut self, seg: &Segment, dest: usize, flags: u8, total: u64, parts: &[&[u8]]) -> Result<bool> {
        if dest >= self.nranks || dest == self.me {
            return Err(Error::InvalidArgument(format!("no queue from rank {} to {dest}", self.me)));
        }
        let len: usize = parts.iter().map(|p| p.len()).sum();
        if len > LARGE_FRAG {
            return Err(Error::InvalidArgument(format!("packet of {len} bytes exceeds the shm maximum {LARGE_FRAG}")));
        }
        // A cheap look first: no fragment is filled for a queue that is full.
        if self.looks_full(dest) {
            return Ok(false);
        }
        let frag = if len > INLINE_MAX {
            let Some(f) = self.take_frag(seg, len)? else { return Ok(false) };
            write_parts(self.frag_ptr(self.me, f), parts);
            Some(f)
        } else {
            None
        };
        let Some((cell, idx, pos)) = self.claim(dest) else {
            if let Some(f) = frag {
                self.busy_word(self.me, f).store(0, Ordering::Release);
            }
            return Ok(false);
        };
        // SAFETY: this rank claimed the cell (its `state` names us), so no other process
        // reads or writes the rest of it until we publish; it lies inside the mapping, with
        // INLINE_MAX bytes after its header, and `len <= INLINE_MAX` for an inline payload.
        unsafe {
            let c = cell;
            (*c).src = self.me as u32;
            (*c).flags = flags;
            (*c).len = len as u32;
            (*c).frag = frag.map_or(NO_FRAG, |f| f as u32);
            (*c).total = total;
            if frag.is_none() {
                write_parts(c.cast::<u8>().add(CELL_HDR), parts);
            }
        }
        self.state(cell).store(state_of(pos + 1, 0, idx), Ordering::Release);
        self.sent[dest] += 1;
        Ok(true)
    }

    /// Whether the cell at `dest`'s `head` still holds the previous lap.
    fn looks_full(&self, dest: usize) -> bool {
        let pos = self.ctl(dest).head.load(Ordering::Relaxed);
        let (cell, idx) = self.cell(dest, pos);
        let (seq, _) = unpack(self.state(cell).load(Ordering::Relaxed), idx);
        seq_diff(seq, pos) < 0
    }

    /// What the cell at `tail` holds: `Some(true)` published, `Some(false)` claimed but not
    /// yet published, `None` free.
    fn at_tail(&self) -> Option<bool> {
        let (cell, idx) = self.cell(self.me, self.tail);
        let (seq, tag) = unpack(self.state(cell).load(Ordering::Acquire), idx);
        match seq_diff(seq, self.tail) {
            1 => Some(true),
            0 if tag != 0 => Some(false),
            _ => None,
        }
    }

    /// Whether a packet waits (or may: a claimed cell is not yet published).
    pub(crate) fn busy(&self) -> bool {
        self.parked.is_some() || self.at_tail() == Some(true)
    }

    /// Whether a packet from `src` waits, or may (a claimed cell before it is not published).
    pub(crate) fn pending_from(&self, src: usize) -> bool {
        if self.parked.as_ref().is_some_and(|p| p.src == src) {
            return true;
        }
        let head = self.ctl(self.me).head.load(Ordering::Acquire);
        let mut pos = self.tail;
        while pos != head && pos.wrapping_sub(self.tail) < CELLS as u64 {
            let (cell, idx) = self.cell(self.me, pos);
            let (seq, _) = unpack(self.state(cell).load(Ordering::Acquire), idx);
            if seq_diff(seq, pos) != 1 {
                return true;
            }
            // SAFETY: the cell is published (acquire above): its header is written and stays
            // so until this rank, its only consumer, frees it.
            if unsafe { (*cell).src } as usize == src {
                return true;
            }
            pos += 1;
        }
        false
    }

    /// Frees the cell at `tail` and moves on.
    fn free_cell(&mut self) {
        let (cell, idx) = self.cell(self.me, self.tail);
        self.state(cell).store(state_of(self.tail + CELLS as u64, 0, idx), Ordering::Release);
        self.tail += 1;
    }

    /// Counts a packet from `src` taken and gives its fragment back.
    fn done(&mut self, src: usize, frag: Option<(u32, usize)>) {
        if let Some((f, _)) = frag {
            self.busy_word(src, f as usize).store(0, Ordering::Release);
        }
        self.taken[src] += 1;
        self.taken_word(self.me, src).store(self.taken[src], Ordering::Release);
    }

    /// Offers the parked packet again; whether it was taken.
    fn offer_parked<F: FnMut(Packet<'_>) -> bool>(&mut self, f: &mut F) -> bool {
        let Some(p) = self.parked.take() else { return true };
        let data = match p.frag {
            // SAFETY: the fragment stays busy (unwritten by its owner) until `done` below,
            // and holds `len` bytes inside the mapping (checked when it was read).
            Some((fr, len)) => unsafe { std::slice::from_raw_parts(self.frag_ptr(p.src, fr as usize), len) },
            None => &p.inline[..],
        };
        if f(Packet { src: p.src, flags: p.flags, total_len: p.total, data }) {
            self.done(p.src, p.frag);
            true
        } else {
            self.parked = Some(p);
            false
        }
    }

    /// Delivers waiting packets to `f` in the order they were queued (see
    /// [`super::ShmFabric::poll`]).
    pub(crate) fn poll<F: FnMut(Packet<'_>) -> bool>(&mut self, seg: &Segment, f: &mut F) -> Result<usize> {
        if !self.offer_parked(f) {
            return Ok(0);
        }
        let mut n = 0;
        let mut bytes = 0;
        while n < BURST && bytes < BURST_BYTES {
            match self.at_tail() {
                Some(true) => self.stuck = 0,
                Some(false) => {
                    self.unstick(seg);
                    break;
                }
                None => break,
            }
            let (cell, _) = self.cell(self.me, self.tail);
            // SAFETY: published (acquire in `at_tail`): the header is written and stays so
            // until we free the cell.
            let (src, flags, len, frag, total) =
                unsafe { ((*cell).src as usize, (*cell).flags, (*cell).len as usize, (*cell).frag, (*cell).total) };
            let data = match self.payload(cell, src, len, frag) {
                Ok(d) => d,
                Err(e) => {
                    self.free_cell();
                    if src < self.nranks && src != self.me {
                        self.cut[src] = true;
                    }
                    return Err(e);
                }
            };
            let frag = (frag != NO_FRAG).then_some((frag, len));
            if self.cut[src] {
                self.free_cell();
                continue;
            }
            if !f(Packet { src, flags, total_len: total, data }) {
                let inline = if frag.is_none() { data.to_vec() } else { Vec::new() };
                self.parked = Some(Parked { src, flags, total, inline, frag });
                self.free_cell();
                break;
            }
            self.free_cell();
            self.done(src, frag);
            n += 1;
            bytes += len;
        }
        Ok(n)
    }

    /// The payload of a published cell, checked: a source that is another rank of the job, a
    /// length that fits the cell or the fragment, a fragment that exists.
    fn payload(&self, cell: *mut CellHdr, src: usize, len: usize, frag: u32) -> Result<&[u8]> {
        if src >= self.nranks || src == self.me {
            return Err(Error::Malformed { what: "a queue cell naming no other rank of the job" });
        }
        let bad = |what: &'static str| Error::PeerProtocol { rank: src, what };
        let p = if frag == NO_FRAG {
            if len > INLINE_MAX {
                return Err(bad("a queue cell longer than a cell"));
            }
            cell.cast::<u8>().wrapping_add(CELL_HDR)
        } else {
            let f = frag as usize;
            if f >= FRAGS || len > frag_place(f).1 {
                return Err(bad("a queue cell naming a fragment that does not hold it"));
            }
            self.frag_ptr(src, f)
        };
        // SAFETY: `len` bytes at `p` lie inside the cell or the fragment (checked above), in
        // the mapping, which outlives every use (the slice is handed to the poll callback
        // only, and parked copies it or keeps the fragment busy); nothing writes them until
        // the cell and fragment are given back.
        Ok(unsafe { std::slice::from_raw_parts(p, len) })
    }

    /// Called while the cell at `tail` is claimed but not published: now and then, looks
    /// whether its claimant is gone (detached, or its process dead) and if so skips the cell,
    /// which it will never publish.
    fn unstick(&mut self, seg: &Segment) {
        self.stuck += 1;
        if self.stuck % STUCK_CHECK_EVERY != 0 {
            return;
        }
        let (cell, idx) = self.cell(self.me, self.tail);
        let st = self.state(cell);
        let w = st.load(Ordering::Acquire);
        let (seq, tag) = unpack(w, idx);
        if seq_diff(seq, self.tail) != 0 || tag == 0 {
            return;
        }
        let src = (tag - 1) as usize;
        if src >= self.nranks || !claimant_gone(seg, src) {
            return;
        }
        if st.compare_exchange(w, state_of(self.tail + CELLS as u64, 0, idx), Ordering::AcqRel, Ordering::Relaxed).is_ok() {
            self.tail += 1;
            self.stuck = 0;
        }
    }
}

/// Whether rank `src` can no longer publish a cell it claimed: it detached without
/// finalizing, or its process is gone.
fn claimant_gone(seg: &Segment, src: usize) -> bool {
    let gone = seg.gone(src);
    if gone != 0 && gone != GONE_FINALIZED {
        return true;
    }
    let pid = seg.pid(src);
    // SAFETY: kill with signal 0 sends nothing; it only checks that the process exists.
    pid != 0 && unsafe { libc::kill(pid as libc::pid_t, 0) } != 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH)
}

/// Copies `parts` one after another to `dst`.
fn write_parts(dst: *mut u8, parts: &[&[u8]]) {
    let mut at = 0;
    for p in parts {
        // SAFETY: every caller gives a `dst` with room for the sum of the parts' lengths (a
        // fragment of at least that capacity, or a cell's inline area for at most INLINE_MAX
        // bytes), in the shared mapping, which no Rust reference covers and which cannot
        // overlap the parts (process memory or borrows of other parts of the mapping that
        // this rank does not write).
        unsafe { super::copy_bytes(p.as_ptr(), dst.add(at), p.len()) };
        at += p.len();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_pack_and_unpack_at_every_index_and_wrap() {
        for idx in [0usize, 1, 511] {
            for seq in [0u64, 1, 511, 512, SEQ_MASK - 1, SEQ_MASK] {
                for tag in [0u64, 1, 4096] {
                    assert_eq!(unpack(state_of(seq, tag, idx), idx), (seq, tag), "{seq} {tag} {idx}");
                }
            }
            // A zeroed cell is free for its own index.
            assert_eq!(unpack(0, idx), (idx as u64, 0));
        }
        assert_eq!(seq_diff(0, SEQ_MASK), 1);
        assert_eq!(seq_diff(SEQ_MASK, 0), -1);
        assert_eq!(seq_diff(5, 5 + CELLS as u64), -(CELLS as i64));
    }

    #[test]
    fn fragments_are_laid_out_back_to_back() {
        assert_eq!(frag_place(0), (0, SMALL_FRAG));
        assert_eq!(frag_place(SMALL_FRAGS - 1).0 + SMALL_FRAG, frag_place(SMALL_FRAGS).0);
        assert_eq!(frag_place(FRAGS - 1).0 + LARGE_FRAG, POOL_BYTES);
        let (taken, busy, cells, stride) = region_layout(3);
        assert!(taken == 128 && busy == 256 && cells % 128 == 0 && stride == cells + CELLS * CELL_BYTES);
    }
}
