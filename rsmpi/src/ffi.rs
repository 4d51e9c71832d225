//! The C-level names rsmpi programs may mention (there is no C MPI underneath).
//!
//! rsmpi re-exports its C bindings here; programs name them mostly in the signature of an
//! [`UnsafeUserOperation`](crate::collective::UnsafeUserOperation)'s function. The handles are
//! tmpi-rsmpi's own: a datatype handle points at this crate's type map.
#![allow(non_camel_case_types, non_snake_case)]

use std::os::raw::{c_int, c_void};

/// A byte address or displacement.
pub type MPI_Aint = isize;
/// A count that can hold any byte count.
pub type MPI_Count = i64;
/// A byte offset in a file.
pub type MPI_Offset = i64;

/// A datatype handle: the address of tmpi-rsmpi's type map, valid while its owner lives.
#[repr(transparent)]
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct MPI_Datatype(pub *const c_void);

/// The status of a completed receive.
#[repr(C)]
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct MPI_Status {
    /// The sender's rank.
    pub MPI_SOURCE: c_int,
    /// The message tag.
    pub MPI_TAG: c_int,
    /// The error code (0: none).
    pub MPI_ERROR: c_int,
    /// Bytes received.
    pub count: i64,
    /// Whether the operation was cancelled.
    pub cancelled: c_int,
}

/// Any source, as a rank.
pub const RSMPI_ANY_SOURCE: c_int = -1;
/// Any tag.
pub const RSMPI_ANY_TAG: c_int = -1;
/// The null process.
pub const RSMPI_PROC_NULL: c_int = -2;
/// `MPI_UNDEFINED`.
pub const MPI_UNDEFINED: c_int = -32766;
/// `MPI_SUCCESS`.
pub const MPI_SUCCESS: c_int = 0;
