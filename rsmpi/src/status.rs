//! [`Status`]: what a completed receive or probe tells of its message (re-exported by
//! [`crate::point_to_point`], its rsmpi path).

use crate::datatype::traits::*;
use crate::ffi::{MPI_Status, RSMPI_ANY_TAG};
use crate::topology::Rank;
use crate::{iidx, Count, Tag};

/// The status of a received (or probed) message.
#[derive(Copy, Clone)]
pub struct Status(MPI_Status);

impl Status {
    /// From a raw status.
    pub fn from_raw(status: MPI_Status) -> Status {
        Status(status)
    }

    pub(crate) fn from_tmpi(s: &tmpi::Status) -> Status {
        Status(MPI_Status {
            MPI_SOURCE: iidx(s.source()),
            MPI_TAG: s.tag() as i32,
            MPI_ERROR: 0,
            count: s.len() as i64,
            cancelled: i32::from(s.cancelled()),
        })
    }

    pub(crate) fn empty() -> Status {
        Status(MPI_Status { MPI_SOURCE: crate::ffi::RSMPI_PROC_NULL, MPI_TAG: RSMPI_ANY_TAG, ..MPI_Status::default() })
    }

    pub(crate) fn from_tmpi_len(n: usize) -> Status {
        Status(MPI_Status { count: n as i64, ..Self::empty().0 })
    }

    pub(crate) fn bytes(&self) -> usize {
        self.0.count as usize
    }

    /// The sender's rank.
    pub fn source_rank(&self) -> Rank {
        self.0.MPI_SOURCE
    }

    /// The message tag.
    pub fn tag(&self) -> Tag {
        self.0.MPI_TAG
    }

    /// The number of elements of `d` received (`MPI_UNDEFINED` when not a whole number).
    pub fn count<D: Datatype>(&self, d: D) -> Count {
        let size = d.type_desc().size();
        let b = self.bytes();
        if size == 0 {
            return 0;
        }
        if b % size != 0 {
            return crate::ffi::MPI_UNDEFINED;
        }
        iidx(b / size)
    }

    /// Whether the operation was cancelled.
    pub fn is_cancelled(&self) -> bool {
        self.0.cancelled != 0
    }
}

impl std::fmt::Debug for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Status {{ source_rank: {}, tag: {} }}", self.source_rank(), self.tag())
    }
}
