//! The geometry of the queued shared-memory layout (see [`super::inbox`]): the cells of each
//! rank's queue, the fragments of each sender's pool, and the bytes of a rank's region. The
//! segment lays itself out by it; the queues read and write inside it.

/// Cells in each rank's queue (a power of two).
pub const CELLS: usize = 512;
/// Bytes of one cell.
pub const CELL_BYTES: usize = 128;
/// Bytes of a cell's header.
pub(crate) const CELL_HDR: usize = 32;
/// Largest packet carried in the cell itself.
pub const INLINE_MAX: usize = CELL_BYTES - CELL_HDR;
/// Bytes of a small fragment.
pub const SMALL_FRAG: usize = 4096;
/// Small fragments per sender.
pub const SMALL_FRAGS: usize = 64;
/// Bytes of a large fragment: the largest packet.
pub const LARGE_FRAG: usize = 128 << 10;
/// Large fragments per sender.
pub const LARGE_FRAGS: usize = 16;
/// Fragments per sender.
pub const FRAGS: usize = SMALL_FRAGS + LARGE_FRAGS;
/// Bytes of one sender's pool.
pub const POOL_BYTES: usize = SMALL_FRAGS * SMALL_FRAG + LARGE_FRAGS * LARGE_FRAG;

/// `n` rounded up to a whole number of 128-byte lines.
pub(crate) fn round128(n: usize) -> usize {
    n.next_multiple_of(128)
}

/// Offsets inside one rank's region for a job of `nranks` ranks: (taken, busy, cells, stride).
pub(crate) fn region_layout(nranks: usize) -> (usize, usize, usize, usize) {
    let taken = 128;
    let busy = taken + round128(nranks * 8);
    let cells = busy + round128(FRAGS * 4);
    (taken, busy, cells, cells + CELLS * CELL_BYTES)
}

/// Bytes of one rank's region (queue, counters, fragment flags) in a job of `nranks` ranks.
pub fn region_bytes(nranks: usize) -> usize {
    region_layout(nranks).3
}

/// Offset and capacity of fragment `f` inside its pool.
pub(crate) fn frag_place(f: usize) -> (usize, usize) {
    if f < SMALL_FRAGS {
        (f * SMALL_FRAG, SMALL_FRAG)
    } else {
        (SMALL_FRAGS * SMALL_FRAG + (f - SMALL_FRAGS) * LARGE_FRAG, LARGE_FRAG)
    }
}
