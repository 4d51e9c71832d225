//! A receive's envelope: where its message may come from ([`Source`]) and which tags it
//! accepts ([`TagMatch`]), with the wildcards `ANY_SOURCE` and `ANY_TAG`.

use crate::{Rank, Tag};

/// Where a receive may come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Source {
    /// Any rank of the communicator (`MPI_ANY_SOURCE`).
    Any,
    /// One rank.
    Rank(Rank),
}

impl From<Rank> for Source {
    fn from(r: Rank) -> Self {
        Source::Rank(r)
    }
}

/// Which tags a receive accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TagMatch {
    /// Any tag (`MPI_ANY_TAG`).
    Any,
    /// One tag.
    Tag(Tag),
}

impl From<Tag> for TagMatch {
    fn from(t: Tag) -> Self {
        TagMatch::Tag(t)
    }
}

/// Receive from any rank.
pub const ANY_SOURCE: Source = Source::Any;
/// Receive any tag.
pub const ANY_TAG: TagMatch = TagMatch::Any;
