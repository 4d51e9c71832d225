//! Non-contiguous layouts: MPI's vector and indexed datatypes as [`Layout`], with public
//! [`pack`]/[`unpack`] and [`Comm::send_layout`]/[`Comm::recv_layout`], which send and receive
//! the selected elements of a buffer without the caller copying them by hand (a column of a
//! row-major matrix, a set of scattered blocks).
//!
//! [`Comm::send_layout`] gathers a message of at most 15 blocks that fits one eager packet
//! straight into the ring (no packed copy); larger ones are packed first.
//!
//! User structs are sent by value in every call once they are `bytemuck::Pod`: derive it on a
//! `#[repr(C)]` struct without padding (`#[derive(Clone, Copy, bytemuck::Pod,
//! bytemuck::Zeroable)]`), and every send, receive, collective and [`crate::UserOp`] accepts
//! it. [`Layout`]s select elements of any such type.
//!
//! Structs with padding or `bool`s derive [`crate::Element`] instead, and go through the typed
//! calls of [`crate::typed`], which also take a slice paired with a [`Layout`] in every
//! point-to-point call and collective (`send_typed`, `irecv_typed`, `gather_typed`, ...).
//!
//! ```
//! use tmpi::datatype::Layout;
//! // Rank 0 sends column 1 of a 3x4 row-major matrix; rank 1 receives it into column 2.
//! let got = tmpi::run_local(2, |w| {
//!     let col = |c: usize| Layout::vector(3, 1, 4).offset(c);
//!     let mut m: Vec<u32> = (0..12).collect();
//!     if w.rank() == 0 {
//!         w.send_layout(&m, &col(1), 1, 0).unwrap();
//!     } else {
//!         w.recv_layout(&mut m, &col(2), 0, 0).unwrap();
//!     }
//!     m
//! });
//! assert_eq!(got[1], vec![0, 1, 1, 3, 4, 5, 5, 7, 8, 9, 9, 11]);
//! ```

use bytemuck::Pod;

use crate::comm::{Comm, Source, Status, TagMatch};
use crate::error::{Error, Result};
use crate::seen::{self, Kind, What};
use crate::{Rank, Tag};

/// Which elements of a buffer a message carries, in order: blocks `(start, len)` in elements.
///
/// A [`Layout::vector`] is kept as its three numbers, however many blocks it has, so that no
/// argument makes building one allocate; the calls that use a layout bound what it selects
/// (see [`pack`], [`Comm::send_layout`] and [`Comm::recv_layout`]).
#[derive(Debug, Clone, Default)]
pub struct Layout {
    shape: Shape,
}

#[derive(Debug, Clone)]
enum Shape {
    /// `count` blocks of `blocklen` elements, block `i` at `offset + i * stride` (saturating).
    Vector { count: usize, blocklen: usize, stride: usize, offset: usize },
    /// Blocks listed one by one.
    Blocks(Vec<(usize, usize)>),
}

impl Default for Shape {
    fn default() -> Self {
        Shape::Blocks(Vec::new())
    }
}

/// Two layouts are equal when they list the same blocks in the same order, however they were
/// built.
impl PartialEq for Layout {
    fn eq(&self, other: &Layout) -> bool {
        self.block_count() == other.block_count() && self.blocks().eq(other.blocks())
    }
}

impl Eq for Layout {}

/// The blocks of a [`Layout`], `(start, len)` in elements ([`Layout::blocks`]).
#[derive(Debug, Clone)]
pub struct Blocks<'a> {
    layout: &'a Layout,
    next: usize,
    end: usize,
}

impl Iterator for Blocks<'_> {
    type Item = (usize, usize);

    fn next(&mut self) -> Option<(usize, usize)> {
        (self.next < self.end).then(|| {
            self.next += 1;
            self.layout.block(self.next - 1)
        })
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.end - self.next, Some(self.end - self.next))
    }
}

impl ExactSizeIterator for Blocks<'_> {}

impl Layout {
    /// `count` blocks of `blocklen` elements, block `i` starting at `i * stride` (MPI's
    /// `Type_vector`): a matrix column is `vector(rows, 1, cols)`. Blocks may overlap (a
    /// `stride` below `blocklen`); see [`Comm::recv_layout`] for what a receive accepts.
    pub fn vector(count: usize, blocklen: usize, stride: usize) -> Layout {
        Layout { shape: Shape::Vector { count, blocklen, stride, offset: 0 } }
    }

    /// Blocks of `lens[i]` elements at `displs[i]` (MPI's `Type_indexed`); pairs beyond the
    /// shorter slice are ignored.
    pub fn indexed(lens: &[usize], displs: &[usize]) -> Layout {
        Layout { shape: Shape::Blocks(displs.iter().copied().zip(lens.iter().copied()).collect()) }
    }

    /// Every block moved `by` elements further into the buffer.
    pub fn offset(mut self, by: usize) -> Layout {
        match &mut self.shape {
            Shape::Vector { offset, .. } => *offset = offset.saturating_add(by),
            Shape::Blocks(blocks) => {
                for b in blocks {
                    b.0 = b.0.saturating_add(by);
                }
            }
        }
        self
    }

    /// The same blocks counted in units `by` times smaller (the layout of a buffer's bytes
    /// when its elements are `by` bytes each); sizes saturate, so [`Layout::check`] refuses
    /// what overflows.
    pub(crate) fn scaled(&self, by: usize) -> Layout {
        let shape = match &self.shape {
            Shape::Vector { count, blocklen, stride, offset } => Shape::Vector {
                count: *count,
                blocklen: blocklen.saturating_mul(by),
                stride: stride.saturating_mul(by),
                offset: offset.saturating_mul(by),
            },
            Shape::Blocks(b) => Shape::Blocks(b.iter().map(|&(s, l)| (s.saturating_mul(by), l.saturating_mul(by))).collect()),
        };
        Layout { shape }
    }

    /// The blocks, `(start, len)` in elements, in order.
    pub fn blocks(&self) -> Blocks<'_> {
        Blocks { layout: self, next: 0, end: self.block_count() }
    }

    /// Number of blocks.
    pub fn block_count(&self) -> usize {
        match &self.shape {
            Shape::Vector { count, .. } => *count,
            Shape::Blocks(b) => b.len(),
        }
    }

    /// Block `i` (`i < block_count()`).
    fn block(&self, i: usize) -> (usize, usize) {
        match &self.shape {
            Shape::Vector { blocklen, stride, offset, .. } => (offset.saturating_add(i.saturating_mul(*stride)), *blocklen),
            Shape::Blocks(b) => b[i],
        }
    }

    /// Number of elements selected (`usize::MAX` if that does not fit a `usize`).
    pub fn len(&self) -> usize {
        match &self.shape {
            Shape::Vector { count, blocklen, .. } => count.saturating_mul(*blocklen),
            Shape::Blocks(b) => b.iter().fold(0usize, |a, b| a.saturating_add(b.1)),
        }
    }

    /// Whether nothing is selected.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether a vector's blocks are all empty: then nothing needs visiting, however many
    /// blocks it counts.
    fn all_blocks_empty(&self) -> bool {
        matches!(self.shape, Shape::Vector { blocklen: 0, .. })
    }

    /// Checks that every block lies inside a buffer of `buf_len` elements.
    ///
    /// # Errors
    /// [`Error::InvalidBuffer`] naming the first block that does not fit.
    pub fn check(&self, buf_len: usize) -> Result<()> {
        let fits = |(start, len): (usize, usize)| start.checked_add(len).is_some_and(|end| end <= buf_len);
        let first_bad = match &self.shape {
            Shape::Blocks(b) => b.iter().position(|&blk| !fits(blk)),
            // Starts never decrease along a vector, so the blocks that do not fit are a
            // suffix: find where it begins without visiting every block.
            Shape::Vector { count, .. } => {
                let (mut lo, mut hi) = (0, *count);
                while lo < hi {
                    let mid = lo + (hi - lo) / 2;
                    if fits(self.block(mid)) {
                        lo = mid + 1;
                    } else {
                        hi = mid;
                    }
                }
                (lo < *count).then_some(lo)
            }
        };
        match first_bad {
            None => Ok(()),
            Some(i) => {
                let (start, len) = self.block(i);
                Err(Error::InvalidBuffer(format!(
                    "layout block {i} ({len} elements at {start}) does not fit a buffer of {buf_len} elements"
                )))
            }
        }
    }
}

/// An empty vector with room for the elements `layout` selects, or [`Error::InvalidBuffer`]
/// when they cannot be held in this machine's memory (`what` names the call).
fn room_for<T: Pod>(layout: &Layout, what: &str) -> Result<Vec<T>> {
    let n = layout.len();
    crate::alloc::reserved_vec(n).ok_or_else(|| {
        Error::InvalidBuffer(format!(
            "{what}: the layout selects {n} elements of {} bytes, more than this process can allocate (its blocks overlap or repeat)",
            std::mem::size_of::<T>()
        ))
    })
}

/// Copies the elements of `buf` that `layout` selects, in order, into a new vector.
///
/// # Errors
/// [`Error::InvalidBuffer`] when a block does not fit `buf`, or when the elements selected
/// (blocks may overlap or repeat) are more than this process can allocate.
pub fn pack<T: Pod>(buf: &[T], layout: &Layout) -> Result<Vec<T>> {
    layout.check(buf.len())?;
    let mut out = room_for(layout, "pack")?;
    if !layout.all_blocks_empty() {
        for (start, len) in layout.blocks() {
            out.extend_from_slice(&buf[start..start + len]);
        }
    }
    Ok(out)
}

/// Writes `packed` into the elements of `buf` that `layout` selects, in order (the inverse of
/// [`pack`]). Returns how many elements were written: `packed` may be shorter than the layout.
///
/// # Errors
/// [`Error::InvalidBuffer`] when a block does not fit `buf` or `packed` is longer than the
/// layout (`buf` is unchanged then).
pub fn unpack<T: Pod>(packed: &[T], buf: &mut [T], layout: &Layout) -> Result<usize> {
    layout.check(buf.len())?;
    if packed.len() > layout.len() {
        return Err(Error::InvalidBuffer(format!("unpack: {} elements for a layout of {}", packed.len(), layout.len())));
    }
    let mut at = 0;
    if packed.is_empty() {
        return Ok(0);
    }
    for (start, len) in layout.blocks() {
        let n = len.min(packed.len() - at);
        buf[start..start + n].copy_from_slice(&packed[at..at + n]);
        at += n;
        if at == packed.len() {
            break;
        }
    }
    Ok(at)
}

/// Most blocks a layout may have to be gathered straight into the ring by
/// [`Comm::send_layout`] (one below the engine's limit, which counts the header too).
const GATHER_BLOCKS: usize = 15;

impl Comm {
    /// Sends the elements of `buf` that `layout` selects, as one message of `layout.len()`
    /// elements (a receiver may take it contiguously or with a layout of its own).
    ///
    /// # Errors
    /// [`Error::InvalidBuffer`] when the layout does not fit `buf`, or when it selects more
    /// elements (blocks may overlap or repeat) than this process can pack; as [`Comm::send`].
    pub fn send_layout<T: Pod>(&self, buf: &[T], layout: &Layout, dest: Rank, tag: Tag) -> Result<()> {
        if seen::on() {
            return seen::call(
                What::new(Kind::SendLayout).to(self, dest).tag(tag).bytes(layout.len() * size_of::<T>()).sends(
                    self,
                    dest,
                    layout.len() * size_of::<T>(),
                ),
                || self.send_layout(buf, layout, dest, tag),
            );
        }
        layout.check(buf.len())?;
        // A small message of a few blocks is gathered straight into the ring: no packed copy.
        if layout.block_count() <= GATHER_BLOCKS {
            self.recv_args(Source::Rank(dest), TagMatch::Tag(tag))?;
            let mut parts: [&[u8]; GATHER_BLOCKS] = [&[]; GATHER_BLOCKS];
            for (p, (start, len)) in parts.iter_mut().zip(layout.blocks()) {
                *p = bytemuck::cast_slice(&buf[start..start + len]);
            }
            let tag64 = crate::matching::encode_tag(self.user_ctx(), self.rank() as u32, tag);
            if self.eng()?.try_send_gather(self.world_rank(dest), tag64, &parts[..layout.block_count()])? {
                return Ok(());
            }
        }
        let packed = pack(buf, layout)?;
        self.send(&packed, dest, tag)
    }

    /// Receives a message into the elements of `buf` that `layout` selects.
    ///
    /// The blocks of a receive layout must not overlap (as in MPI): a layout that selects more
    /// elements than `buf` has is refused before anything is received.
    ///
    /// # Errors
    /// [`Error::InvalidBuffer`] when the layout does not fit `buf` or selects more elements
    /// than `buf` has; [`Error::Truncated`] when the message has more elements than the
    /// layout; as [`Comm::recv`].
    pub fn recv_layout<T: Pod>(&self, buf: &mut [T], layout: &Layout, src: impl Into<Source>, tag: impl Into<TagMatch>) -> Result<Status> {
        let (src, tag) = (src.into(), tag.into());
        if seen::on() {
            return seen::calls::matched(What::new(Kind::RecvLayout).from(self, src).tag_match(tag), src, |s| {
                self.recv_layout(buf, layout, s, tag)
            });
        }
        layout.check(buf.len())?;
        if layout.len() > buf.len() {
            return Err(Error::InvalidBuffer(format!(
                "recv_layout: the layout selects {} elements of a {}-element buffer (its blocks overlap)",
                layout.len(),
                buf.len()
            )));
        }
        let mut packed = room_for::<T>(layout, "recv_layout")?;
        packed.resize(layout.len(), T::zeroed());
        let st = self.recv(&mut packed, src, tag)?;
        let n = st.count::<T>().min(packed.len());
        unpack(&packed[..n], buf, layout)?;
        Ok(st)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pack_unpack_round_trip_and_bounds() {
        let m: Vec<u16> = (0..20).collect();
        let l = Layout::indexed(&[2, 0, 3], &[1, 9, 15]);
        assert_eq!(l.len(), 5);
        let p = pack(&m, &l).unwrap();
        assert_eq!(p, vec![1, 2, 15, 16, 17]);
        let mut z = vec![0u16; 20];
        assert_eq!(unpack(&p, &mut z, &l).unwrap(), 5);
        assert_eq!(pack(&z, &l).unwrap(), p);
        assert_eq!(unpack(&p[..3], &mut z, &l).unwrap(), 3);
        assert!(pack(&m, &Layout::vector(3, 2, 10)).is_err());
        assert!(pack(&m, &Layout::vector(2, 1, usize::MAX)).is_err());
        assert!(pack(&m, &Layout::indexed(&[1], &[usize::MAX])).is_err());
        assert!(unpack(&[1u16; 6], &mut z, &l).is_err());
        let v = Layout::vector(4, 1, 5).offset(4);
        assert_eq!(pack(&m, &v).unwrap(), vec![4, 9, 14, 19]);
        assert!(Layout::default().is_empty());
    }

    /// Issue 55 item 7: sizes from the caller are errors, never aborts. A vector of
    /// `usize::MAX / 2` blocks used to panic (capacity overflow) when built; overlapping
    /// layouts that each fit made `send_layout`/`recv_layout` allocate 2^40 elements or more
    /// and abort.
    #[test]
    fn huge_and_overlapping_layouts_are_errors() {
        let huge = Layout::vector(usize::MAX / 2, 1, 0);
        assert_eq!((huge.block_count(), huge.blocks().len(), huge.len()), (usize::MAX / 2, usize::MAX / 2, usize::MAX / 2));
        assert_eq!(huge.blocks().nth(12345), Some((0, 1)));
        huge.check(1).expect("every block of the vector fits a 1-element buffer");
        assert!(matches!(pack(&[7u8], &huge), Err(Error::InvalidBuffer(_))));
        // Each block fits the 8 MiB buffer; together they select 2^60 elements.
        let overlapping = Layout::vector(1 << 40, 1 << 20, 0);
        let buf = vec![1u64; 1 << 20];
        overlapping.check(buf.len()).expect("each block fits");
        assert!(matches!(pack(&buf, &overlapping), Err(Error::InvalidBuffer(_))));
        // A vector that runs past the buffer names its first block that does not fit, found
        // without visiting the others.
        let long = Layout::vector(1 << 40, 2, 3).offset(1);
        let e = long.check(100).unwrap_err().to_string();
        assert!(e.contains("layout block 33 (2 elements at 100)"), "{e}");
        // Zero-length blocks select nothing, however many there are.
        assert_eq!(pack(&buf, &Layout::vector(usize::MAX, 0, 0)).unwrap(), Vec::<u64>::new());
        // Layouts compare by their blocks, however they were built.
        assert_eq!(Layout::vector(3, 2, 4).offset(1), Layout::indexed(&[2, 2, 2], &[1, 5, 9]));
        assert_ne!(Layout::vector(3, 2, 4), Layout::vector(2, 2, 4));
        let got = crate::run_local(2, |w| {
            let peer = 1 - w.rank();
            let mut small = vec![5u64; 1 << 20];
            let errs = [
                w.send_layout(&buf, &overlapping, peer, 1).unwrap_err(),
                w.send_layout(&[7u8], &huge, peer, 1).unwrap_err(),
                w.recv_layout(&mut small, &overlapping, peer, 1).unwrap_err(),
                w.recv_layout(&mut small[..4], &Layout::vector(3, 2, 1), peer, 1).unwrap_err(),
            ];
            // Nothing was sent or received: the next message is the one both expect.
            w.send(&[w.rank() as u64], peer, 2).unwrap();
            let st = w.recv(&mut small[..1], peer, 2).unwrap();
            (errs.iter().all(|e| matches!(e, Error::InvalidBuffer(_))), st.count::<u64>(), small[0])
        });
        assert_eq!(got, vec![(true, 1, 1), (true, 1, 0)]);
    }

    #[test]
    fn gathered_and_packed_sends_carry_the_same_message() {
        // 3 blocks go gathered into the ring, 40 blocks packed, a message beyond a ring record
        // packed; each arrives contiguous and in order, after a plain send that precedes it.
        let m: Vec<u32> = (0..100_000).collect();
        let layouts = [Layout::vector(3, 2, 10), Layout::vector(40, 1, 2), Layout::vector(2, 40_000, 50_000)];
        for shm in [false, true] {
            let body = |w: crate::World| {
                if w.rank() == 0 {
                    for (i, l) in layouts.iter().enumerate() {
                        w.send(&[i as u32], 1, 1).unwrap();
                        w.send_layout(&m, l, 1, 1).unwrap();
                    }
                    assert!(matches!(w.send_layout(&m, &layouts[0], 5, 1), Err(Error::InvalidRank { .. })));
                    assert!(matches!(w.send_layout(&m, &layouts[0], 1, crate::TAG_UB + 1), Err(Error::InvalidTag { .. })));
                    assert!(matches!(w.send_layout(&m[..5], &layouts[0], 1, 1), Err(Error::InvalidBuffer(_))));
                } else {
                    for (i, l) in layouts.iter().enumerate() {
                        assert_eq!(w.recv_vec::<u32>(0, 1).unwrap().0, vec![i as u32]);
                        assert_eq!(w.recv_vec::<u32>(0, 1).unwrap().0, pack(&m, l).unwrap(), "layout {i}");
                    }
                }
            };
            if shm {
                crate::run_shm_threads(2, crate::config::Config::default(), body);
            } else {
                crate::run_local(2, body);
            }
        }
    }

    #[test]
    fn layouts_over_the_wire() {
        #[repr(C)]
        #[derive(Clone, Copy, Debug, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
        struct P {
            x: f32,
            id: u32,
        }
        let got = crate::run_local(2, |w| {
            let mut grid: Vec<P> = (0..16).map(|i| P { x: i as f32, id: i }).collect();
            if w.rank() == 0 {
                // The diagonal of a 4x4 grid.
                w.send_layout(&grid, &Layout::vector(4, 1, 5), 1, 3).unwrap();
                Vec::new()
            } else {
                grid.fill(P { x: 0.0, id: 0 });
                // Into the first column.
                let st = w.recv_layout(&mut grid, &Layout::vector(4, 1, 4), 0, 3).unwrap();
                assert_eq!(st.count::<P>(), 4);
                grid.iter().map(|p| p.id).collect()
            }
        });
        assert_eq!(got[1], vec![0, 0, 0, 0, 5, 0, 0, 0, 10, 0, 0, 0, 15, 0, 0, 0]);
    }
}
