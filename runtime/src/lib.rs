//! # tmpi
//!
//! A pure-Rust, MPI-style messaging runtime: SPMD programs with point-to-point messages and
//! collectives, launched across ranks with `tmpirun`. No C MPI library is involved.
//!
//! ```no_run
//! fn main() -> tmpi::Result<()> {
//!     let world = tmpi::init()?;
//!     let (rank, size) = (world.rank(), world.size());
//!     if rank == 0 {
//!         for src in 1..size {
//!             let mut buf = [0u64; 1];
//!             let st = world.recv(&mut buf, tmpi::ANY_SOURCE, 7)?;
//!             println!("got {} from rank {}", buf[0], st.source());
//!         }
//!     } else {
//!         world.send(&[rank as u64], 0, 7)?;
//!     }
//!     let mut sum = [0u64];
//!     world.allreduce(&[1u64], &mut sum, tmpi::Op::Sum)?;
//!     assert_eq!(sum[0], size as u64);
//!     world.finalize()
//! }
//! ```
//!
//! Run it with `tmpirun -n 4 target/release/myprog`; started alone it is rank 0 of 1.
//!
//! - Point-to-point: [`Comm::send`], [`Comm::ssend`], [`Comm::recv`], [`Comm::recv_vec`],
//!   [`Comm::sendrecv`], [`Comm::probe`], [`Comm::iprobe`]; wildcards [`ANY_SOURCE`],
//!   [`ANY_TAG`]; every message is matched by (communicator, source, tag) with MPI's
//!   non-overtaking rule.
//! - Non-blocking: [`scope`], [`Comm::isend`], [`Comm::irecv`], [`Request`], [`wait_all`],
//!   [`wait_any`]: buffers stay borrowed until the scope ends, so it is sound in safe Rust.
//! - Communicators: [`Comm::dup`], [`Comm::split`], [`Comm::create`] from a [`Group`],
//!   [`Comm::compare`].
//! - Cartesian topologies: [`dims_create`], [`Comm::cart_create`], [`CartComm`] (coordinates,
//!   shifts, sub-grids, [`CartComm::neighbor_allgather`], [`CartComm::neighbor_alltoall`]).
//! - Collectives: [`Comm::barrier`], [`Comm::bcast`], [`Comm::reduce`], [`Comm::allreduce`],
//!   [`Comm::gather`], [`Comm::scatter`], [`Comm::allgather`], [`Comm::alltoall`] with [`Op`].
//! - Variable-count collectives and prefix reductions: [`Comm::gatherv`], [`Comm::scatterv`],
//!   [`Comm::allgatherv`], [`Comm::alltoallv`], [`Comm::reduce_scatter`],
//!   [`Comm::reduce_scatter_block`], [`Comm::scan`], [`Comm::exscan`].
//! - Environment: [`wtime`], [`wtick`], [`processor_name`], [`library_version`],
//!   [`is_initialized`].
//! - Configuration: `TMPI_*` environment variables, see [`config::KNOBS`].
//!
//! Errors are values of [`Error`]; nothing panics on bad input from the user or the wire.

mod buffer;
pub mod coll;
mod coll_glue;
mod comm;
pub mod config;
mod engine;
pub mod error;
mod group;
mod nbc;
pub mod matching;
mod mprobe;
pub mod op;
mod request;
mod slab;
mod sys;
mod topo;
mod world;

pub use comm::{Comm, Source, Status, TagMatch, ANY_SOURCE, ANY_TAG};
pub use error::{Error, Result};
pub use group::{CommCmp, Group, GroupCmp};
pub use op::{Loc, Op, Reducible, UserOp};
pub use mprobe::Message;
pub use request::{scope, test_all, test_any, test_some, wait_all, wait_any, wait_some, Request, Scope};
pub use topo::{dims_create, CartComm};
pub use world::{init, is_initialized, library_version, processor_name, run_local, run_local_with, run_shm_threads, wtick, wtime, World};

/// A rank in a communicator.
pub type Rank = usize;
/// A user tag, `0..=TAG_UB`.
pub type Tag = u32;
/// Largest user tag (2^24 - 1: the tag field of the 64-bit match key).
pub const TAG_UB: Tag = (1 << 24) - 1;
