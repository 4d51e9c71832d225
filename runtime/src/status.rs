//! [`Status`]: what a completed operation tells about its message; built only through its
//! constructors, so the engine never spells out its fields.

use bytemuck::Pod;

use crate::{Rank, Tag};

/// What a completed receive (or a probe) tells about its message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Status {
    pub(crate) source: Rank,
    pub(crate) tag: Tag,
    pub(crate) len: usize,
    pub(crate) cancelled: bool,
}

impl Status {
    /// A receive that took `len` bytes from `source` (in its communicator) with `tag`.
    #[inline]
    pub(crate) fn received(source: Rank, tag: Tag, len: usize) -> Self {
        Status { source, tag, len, cancelled: false }
    }

    /// A completed send (a send's status says nothing about the message).
    #[inline]
    pub(crate) fn sent() -> Self {
        Status { source: 0, tag: 0, len: 0, cancelled: false }
    }

    /// A receive cancelled before it matched.
    pub(crate) fn cancelled_recv() -> Self {
        Status { source: 0, tag: 0, len: 0, cancelled: true }
    }

    /// Rank (in the communicator) that sent the message.
    pub fn source(&self) -> Rank {
        self.source
    }
    /// Tag of the message.
    pub fn tag(&self) -> Tag {
        self.tag
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
        self.cancelled
    }
}
