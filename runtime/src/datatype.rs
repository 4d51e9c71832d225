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
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Layout {
    blocks: Vec<(usize, usize)>,
}

impl Layout {
    /// `count` blocks of `blocklen` elements, block `i` starting at `i * stride` (MPI's
    /// `Type_vector`): a matrix column is `vector(rows, 1, cols)`.
    pub fn vector(count: usize, blocklen: usize, stride: usize) -> Layout {
        Layout { blocks: (0..count).map(|i| (i.saturating_mul(stride), blocklen)).collect() }
    }

    /// Blocks of `lens[i]` elements at `displs[i]` (MPI's `Type_indexed`); pairs beyond the
    /// shorter slice are ignored.
    pub fn indexed(lens: &[usize], displs: &[usize]) -> Layout {
        Layout { blocks: displs.iter().copied().zip(lens.iter().copied()).collect() }
    }

    /// Every block moved `by` elements further into the buffer.
    pub fn offset(mut self, by: usize) -> Layout {
        for b in &mut self.blocks {
            b.0 = b.0.saturating_add(by);
        }
        self
    }

    /// The blocks, `(start, len)` in elements.
    pub fn blocks(&self) -> &[(usize, usize)] {
        &self.blocks
    }

    /// Number of elements selected.
    pub fn len(&self) -> usize {
        self.blocks.iter().fold(0usize, |a, b| a.saturating_add(b.1))
    }

    /// Whether nothing is selected.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Checks that every block lies inside a buffer of `buf_len` elements.
    ///
    /// # Errors
    /// [`Error::InvalidBuffer`] naming the first block that does not fit.
    pub fn check(&self, buf_len: usize) -> Result<()> {
        for (i, &(start, len)) in self.blocks.iter().enumerate() {
            if start.checked_add(len).is_none_or(|end| end > buf_len) {
                return Err(Error::InvalidBuffer(format!(
                    "layout block {i} ({len} elements at {start}) does not fit a buffer of {buf_len} elements"
                )));
            }
        }
        Ok(())
    }
}

/// Copies the elements of `buf` that `layout` selects, in order, into a new vector.
///
/// # Errors
/// [`Error::InvalidBuffer`] when a block does not fit `buf`.
pub fn pack<T: Pod>(buf: &[T], layout: &Layout) -> Result<Vec<T>> {
    layout.check(buf.len())?;
    let mut out = Vec::with_capacity(layout.len());
    for &(start, len) in &layout.blocks {
        out.extend_from_slice(&buf[start..start + len]);
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
    for &(start, len) in &layout.blocks {
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
    /// [`Error::InvalidBuffer`] when the layout does not fit `buf`; as [`Comm::send`].
    pub fn send_layout<T: Pod>(&self, buf: &[T], layout: &Layout, dest: Rank, tag: Tag) -> Result<()> {
        if seen::on() {
            return seen::call(What::new(Kind::SendLayout).to(self, dest).tag(tag).bytes(layout.len() * size_of::<T>()).sends(self, dest, layout.len() * size_of::<T>()), || {
                self.send_layout(buf, layout, dest, tag)
            });
        }
        layout.check(buf.len())?;
        // A small message of a few blocks is gathered straight into the ring: no packed copy.
        if layout.blocks.len() <= GATHER_BLOCKS {
            self.recv_args(Source::Rank(dest), TagMatch::Tag(tag))?;
            let mut parts: [&[u8]; GATHER_BLOCKS] = [&[]; GATHER_BLOCKS];
            for (p, &(start, len)) in parts.iter_mut().zip(&layout.blocks) {
                *p = bytemuck::cast_slice(&buf[start..start + len]);
            }
            let tag64 = crate::matching::encode_tag(self.user_ctx(), self.rank() as u32, tag);
            if self.eng()?.try_send_gather(self.world_rank(dest), tag64, &parts[..layout.blocks.len()])? {
                return Ok(());
            }
        }
        let packed = pack(buf, layout)?;
        self.send(&packed, dest, tag)
    }

    /// Receives a message into the elements of `buf` that `layout` selects.
    ///
    /// # Errors
    /// [`Error::InvalidBuffer`] when the layout does not fit `buf`; [`Error::Truncated`] when
    /// the message has more elements than the layout; as [`Comm::recv`].
    pub fn recv_layout<T: Pod>(&self, buf: &mut [T], layout: &Layout, src: impl Into<Source>, tag: impl Into<TagMatch>) -> Result<Status> {
        let (src, tag) = (src.into(), tag.into());
        if seen::on() {
            return seen::matched(What::new(Kind::RecvLayout).from(self, src).tag_match(tag), src, |s| {
                self.recv_layout(buf, layout, s, tag)
            });
        }
        layout.check(buf.len())?;
        let mut packed = vec![T::zeroed(); layout.len()];
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
