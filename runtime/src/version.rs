//! The version of the MPI standard whose semantics tmpi follows (`MPI_Get_version`).

/// `(major, minor)` of the MPI standard tmpi's semantics follow: 3.1 (non-blocking
/// collectives, matched probes, `MPI_Comm_create_group`; no one-sided or I/O chapters).
pub const MPI_VERSION: (u32, u32) = (3, 1);

/// The MPI standard version tmpi follows (`MPI_Get_version`); callable before [`crate::init`]
/// and after finalizing, as in MPI.
///
/// ```
/// let (major, minor) = tmpi::mpi_version();
/// assert!(major >= 3, "{major}.{minor}");
/// ```
pub fn mpi_version() -> (u32, u32) {
    MPI_VERSION
}
