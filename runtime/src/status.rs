//! [`Status`]: what a completed operation tells about its message; built only through its
//! constructors, so the engine never spells out its fields.

use std::num::NonZeroU64;

use bytemuck::Pod;

use crate::{Rank, Tag};

/// What a completed receive (or a probe) tells about its message.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Status {
    pub(crate) len: usize,
    /// [`VALID`], [`CANCELLED`], the source rank in bits 32..62 and the tag in bits 0..32.
    /// Two whole words: a status is written and copied word by word (a copy never waits on
    /// the stores of a word's pieces, which made every hand-over of the earlier `u32` + `bool`
    /// layout stall), and with the always-set bit an `Option<Status>` is two words too.
    meta: NonZeroU64,
}

/// `Status::meta` bit set in every status (the niche of `Option<Status>`).
const VALID: u64 = 1 << 63;
/// `Status::meta` bit of a cancelled operation.
const CANCELLED: u64 = 1 << 62;
/// Position and width of the source rank in `Status::meta` (ranks are below
/// `tmpi_transport::bootstrap::MAX_RANKS`, 2^20).
const SOURCE_SHIFT: u32 = 32;
const SOURCE_MASK: u64 = (1 << 30) - 1;

impl std::fmt::Debug for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Status")
            .field("source", &self.source())
            .field("tag", &self.tag())
            .field("len", &self.len)
            .field("cancelled", &self.cancelled())
            .finish()
    }
}

impl Status {
    #[inline]
    fn with(source: Rank, tag: Tag, len: usize, flags: u64) -> Self {
        debug_assert!(source as u64 <= SOURCE_MASK);
        let meta = VALID | flags | (source as u64 & SOURCE_MASK) << SOURCE_SHIFT | u64::from(tag);
        Status { len, meta: NonZeroU64::new(meta).unwrap_or(NonZeroU64::MAX) }
    }

    /// A receive that took `len` bytes from `source` (in its communicator) with `tag`.
    #[inline]
    pub(crate) fn received(source: Rank, tag: Tag, len: usize) -> Self {
        Status::with(source, tag, len, 0)
    }

    /// A completed send (a send's status says nothing about the message).
    #[inline]
    pub(crate) fn sent() -> Self {
        Status::with(0, 0, 0, 0)
    }

    /// A receive cancelled before it matched.
    pub(crate) fn cancelled_recv() -> Self {
        Status::with(0, 0, 0, CANCELLED)
    }

    /// Rank (in the communicator) that sent the message.
    pub fn source(&self) -> Rank {
        ((self.meta.get() >> SOURCE_SHIFT) & SOURCE_MASK) as Rank
    }
    /// Tag of the message.
    pub fn tag(&self) -> Tag {
        self.meta.get() as Tag
    }
    /// Bytes received (or, from a probe, that would be received).
    pub fn len(&self) -> usize {
        self.len
    }
    /// Whether no bytes were received.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// Number of whole `T` elements received.
    pub fn count<T: Pod>(&self) -> usize {
        match std::mem::size_of::<T>() {
            0 => 0,
            n => self.len / n,
        }
    }
    /// Whether the operation was cancelled.
    pub fn cancelled(&self) -> bool {
        self.meta.get() & CANCELLED != 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_status_keeps_what_it_was_built_with_in_two_words() {
        let st = Status::received(1 << 20, u32::MAX, usize::MAX);
        assert_eq!((st.source(), st.tag(), st.len(), st.cancelled()), (1 << 20, u32::MAX, usize::MAX, false));
        let c = Status::cancelled_recv();
        assert!(c.cancelled() && c.is_empty());
        assert!(!Status::sent().cancelled());
        assert_eq!(std::mem::size_of::<Option<Status>>(), 16);
        assert_eq!(format!("{:?}", Status::received(3, 7, 2)), "Status { source: 3, tag: 7, len: 2, cancelled: false }");
    }
}
