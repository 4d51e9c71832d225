//! rsmpi's `mpi` crate (0.8) on top of tmpi: Rust MPI programs run under `tmpirun` unchanged,
//! with no C MPI, no C toolchain and no libclang.
//!
//! A program switches with one line in its `Cargo.toml`:
//!
//! ```toml
//! mpi = { package = "tmpi-rsmpi", path = "…/rsmpi", features = ["derive"] }
//! ```
//!
//! and is started with `tmpirun -n 4 target/release/prog` instead of `mpirun`. The API is
//! rsmpi's: [`initialize`], a [`Universe`](environment::Universe), communicators with
//! [`traits::Communicator`], processes as [`traits::Source`]/[`traits::Destination`]/
//! [`traits::Root`], buffers described by [`traits::Equivalence`], requests in
//! [`request::scope`]s. Where rsmpi hands C handles to user code (an
//! [`UnsafeUserOperation`](collective::UnsafeUserOperation)'s signature), [`ffi`] provides
//! what that code names. A call that cannot be honoured panics with a message naming the call
//! (rsmpi's default error handler aborts the job likewise); none returns a wrong result.
//!
//! ```no_run
//! use mpi::traits::*;
//! let universe = mpi::initialize().unwrap();
//! let world = universe.world();
//! let next = (world.rank() + 1) % world.size();
//! let prev = (world.rank() + world.size() - 1) % world.size();
//! let me = world.rank();
//! mpi::request::scope(|scope| {
//!     let sreq = world.process_at_rank(next).immediate_send(scope, &me);
//!     let (got, _) = world.process_at_rank(prev).receive::<i32>();
//!     assert_eq!(got, prev);
//!     sreq.wait();
//! });
//! ```
#![allow(clippy::missing_safety_doc)]

pub mod attribute;
mod bytes;
pub mod collective;
pub mod datatype;
pub mod environment;
pub mod ffi;
pub mod point_to_point;
pub mod raw;
pub mod request;
mod state;
mod status;
pub mod topology;

/// All traits, for `use mpi::traits::*`.
pub mod traits {
    pub use crate::attribute::traits::*;
    pub use crate::collective::traits::*;
    pub use crate::datatype::traits::*;
    pub use crate::point_to_point::traits::*;
    pub use crate::raw::traits::*;
    pub use crate::topology::traits::*;
    #[cfg(feature = "derive")]
    pub use tmpi_derive::Equivalence;
}

pub use crate::environment::{initialize, initialize_with_threading, is_finalized, is_initialized, time, time_resolution, Threading};
pub use crate::topology::Rank;

/// An MPI error code (rsmpi's alias; this crate reports errors by panicking with a message).
pub type Error = std::os::raw::c_int;
/// A count of elements.
pub type Count = std::os::raw::c_int;
/// A message tag.
pub type Tag = std::os::raw::c_int;
/// A byte address or displacement.
pub type Address = ffi::MPI_Aint;

/// Errors some calls return as values.
#[derive(thiserror::Error, Debug)]
#[non_exhaustive]
pub enum MpiError {
    /// Spawning processes failed: this many of that many were started.
    #[error("Failed to spawn {0} of {1} processes")]
    Spawn(Rank, Rank),
    /// A string given to MPI had an interior NUL byte.
    #[error("An interior 0 byte was found in string")]
    StringNul(#[from] std::ffi::NulError),
}

/// Panics with a message naming `call` when a tmpi call failed.
#[track_caller]
pub(crate) fn ok<T>(r: tmpi::Result<T>, call: &str) -> T {
    match r {
        Ok(v) => v,
        Err(e) => panic!("mpi: {call} failed: {e}"),
    }
}

/// A rank or count from rsmpi's `i32` to `usize`, panicking (naming `call`) when negative.
#[track_caller]
pub(crate) fn uidx(v: i32, call: &str) -> usize {
    usize::try_from(v).unwrap_or_else(|_| panic!("mpi: {call}: {v} is negative"))
}

/// A `usize` to rsmpi's `i32`.
#[track_caller]
pub(crate) fn iidx(v: usize) -> i32 {
    i32::try_from(v).unwrap_or_else(|_| panic!("mpi: {v} does not fit an i32"))
}
