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
//!   [`wait_any`], [`wait_some`], [`test_any`], [`test_some`], [`test_all`]: buffers stay
//!   borrowed until the scope ends, so it is sound in safe Rust.
//! - Matched probes and more: [`Comm::mprobe`], [`Comm::improbe`], [`Message`],
//!   [`Comm::sendrecv_replace`]; non-contiguous data with [`datatype::Layout`]
//!   ([`Comm::send_layout`], [`Comm::recv_layout`], [`datatype::pack`], [`datatype::unpack`]).
//! - Communicators: [`Comm::dup`], [`Comm::split`], [`Comm::create`] from a [`Group`] (disjoint
//!   groups at once), [`Comm::create_group`] by the group's members alone, [`Comm::compare`].
//! - Cartesian topologies: [`dims_create`], [`Comm::cart_create`], [`CartComm`] (coordinates,
//!   shifts, sub-grids, [`CartComm::neighbor_allgather`], [`CartComm::neighbor_alltoall`]).
//! - Collectives: [`Comm::barrier`], [`Comm::bcast`], [`Comm::reduce`], [`Comm::allreduce`],
//!   [`Comm::gather`], [`Comm::scatter`], [`Comm::allgather`], [`Comm::alltoall`] with [`Op`].
//! - Variable-count collectives and prefix reductions: [`Comm::gatherv`], [`Comm::scatterv`],
//!   [`Comm::allgatherv`], [`Comm::alltoallv`], [`Comm::reduce_scatter`],
//!   [`Comm::reduce_scatter_block`], [`Comm::scan`], [`Comm::exscan`].
//! - Shared heap: [`World::alloc_shared`] returns a [`SharedBuf`] (derefs to `[T]`) that the
//!   other ranks of the node map; a large message from or into one is a single `memcpy`.
//! - Non-blocking collectives: [`Comm::ibarrier`], [`Comm::ibcast`], [`Comm::ireduce`],
//!   [`Comm::iallreduce`], [`Comm::igather`], [`Comm::igatherv`], [`Comm::iscatter`],
//!   [`Comm::iscatterv`], [`Comm::iallgather`], [`Comm::iallgatherv`], [`Comm::ialltoall`],
//!   [`Comm::ialltoallv`], [`Comm::ireduce_scatter`], [`Comm::ireduce_scatter_block`],
//!   [`Comm::iscan`], [`Comm::iexscan`].
//! - User-defined reductions: [`UserOp`] (commutative or not, applied in rank order) with
//!   [`Comm::allreduce_with`] and the other `*_with` calls; MINLOC/MAXLOC on [`Loc`].
//! - Environment: [`wtime`], [`wtick`], [`processor_name`], [`library_version`],
//!   [`is_initialized`], [`is_finalized`], [`World::abort`], [`Comm::stats`] ([`Stats`]),
//!   [`Comm::split_type`].
#![cfg_attr(feature = "serde", doc = "- With the `serde` feature: [`Comm::send_serialized`] and [`Comm::recv_serialized`] for any")]
#![cfg_attr(not(feature = "serde"), doc = "- With the `serde` feature: `Comm::send_serialized` and `Comm::recv_serialized` for any")]
//!   `serde` type (variable size, sized on arrival); [`Stats`] is `Serialize`/`Deserialize`.
//! - Threads: [`init_thread`] with a [`Threading`] level (MPI's `SINGLE`, `FUNNELED`,
//!   `SERIALIZED`, `MULTIPLE`); see [Threads](#threads) below.
//! - Configuration: `TMPI_*` environment variables, see [`config::KNOBS`].
//!
//! Errors are values of [`Error`]; nothing panics on bad input from the user or the wire.
//!
//! # Threads
//!
//! [`init`] starts the runtime at [`Threading::Single`]; [`init_thread`] at any of MPI's four
//! levels, and returns the level provided (always the one asked for):
//!
//! | level | who may call | a call the level does not allow |
//! |---|---|---|
//! | [`Threading::Single`], [`Threading::Funneled`] | the thread that started the runtime | from another thread: [`Error::Thread`] |
//! | [`Threading::Serialized`] | any thread, one at a time (the program orders them) | while another thread is inside a call: [`Error::Thread`] |
//! | [`Threading::Multiple`] | any thread, at any time | — |
//!
//! At every level [`Comm`], [`World`], [`Request`], [`Message`] and [`CartComm`] are
//! `Send + Sync`: the level decides what a call from another thread does, and it is never
//! undefined behaviour. A [`Scope`] stays with the thread that opened it (each thread opens its
//! own); its requests may be moved to, and waited on by, other threads inside it.
//!
//! At [`Threading::Multiple`], threads share communicators by reference (`&World`, `&Comm`, or
//! clones) and send, receive, probe and wait concurrently, through one progress engine per
//! rank: a blocking call holds it for one round of progress at a time and lets it go between
//! rounds (spinning, then yielding, then sleeping as ranks and threads outnumber cores), so
//! every waiting thread completes everybody's operations, and a thread that polls in a loop
//! hands the engine to one waiting for it. Messages are never lost or reordered: MPI's
//! non-overtaking rule holds per source, tag and communicator, hence per pair of sending and
//! receiving threads, and a plain [`Comm::probe`] may be overtaken by another thread's
//! receive, so with several receiving threads use [`Comm::mprobe`]. Two collectives on one
//! communicator at the same time are erroneous, as in MPI: the later call fails with
//! [`Error::Thread`] (use a [`Comm::dup`] per thread for concurrent collectives; after such an
//! error the communicator's collectives may no longer match across ranks). A user operation
//! ([`UserOp`]) that calls tmpi gets [`Error::Thread`] at every level.
//!
//! One rule is the program's own: a task of a thread pool (rayon) that blocks in tmpi holds
//! its pool thread, so it must not wait for something only another task of a pool can
//! provide; post receives first, or block only on messages whose sends are under way (see
//! `examples/src/bin/rayon_hybrid.rs`).
//!
//! ```
//! use tmpi::Threading;
//! // Two ranks of four threads each; thread t of one rank talks to thread t of the other.
//! let ok = tmpi::run_local_threaded(2, Threading::Multiple, |world| {
//!     let w: &tmpi::Comm = &world;
//!     let peer = 1 - w.rank();
//!     std::thread::scope(|s| {
//!         let threads: Vec<_> = (0..4u32)
//!             .map(|t| {
//!                 s.spawn(move || {
//!                     (0..100u32).all(|i| {
//!                         let mut got = [0u32; 2];
//!                         w.sendrecv(&[t, i], peer, t, &mut got, peer, t).unwrap();
//!                         got == [t, i]
//!                     })
//!                 })
//!             })
//!             .collect();
//!         threads.into_iter().all(|h| h.join().unwrap())
//!     })
//! });
//! assert_eq!(ok, vec![true, true]);
//! ```

// `#[derive(Element)]` names `::tmpi`; this lets the crate's own code and tests use it.
#[allow(unused_extern_crates)]
extern crate self as tmpi;

mod alloc;
mod attrs;
pub mod bsend;
mod buffer;
mod cartmap;
pub mod coll;
mod coll_ctx;
mod coll_glue;
mod comm;
pub mod config;
pub mod datatype;
mod detached;
pub mod distgraph;
mod engine;
mod envelope;
pub mod error;
mod group;
mod heap;
pub mod inter;
mod launch;
pub mod matching;
mod modes;
mod mprobe;
pub mod names;
mod nbc;
mod node;
pub mod one;
pub mod op;
pub mod reqset;
mod request;
mod seen;
#[cfg(feature = "serde")]
mod serialized;
mod slab;
pub mod spawn;
mod stats;
mod status;
mod sync;
mod sys;
mod topo;
pub mod typed;
pub mod typemap;
pub mod vecrecv;
mod version;
mod world;

pub use bsend::{buffer_attach, buffer_detach, buffer_size, BSEND_OVERHEAD};
pub use comm::{Comm, Source, Status, TagMatch, ANY_SOURCE, ANY_TAG};
pub use detached::Detached;
pub use distgraph::DistGraphComm;
pub use error::{Error, Result};
pub use group::{CommCmp, Group, GroupCmp};
pub use heap::SharedBuf;
pub use inter::{InterComm, InterRoot};
pub use mprobe::Message;
pub use names::Attribute;
pub use node::SplitType;
pub use op::{Loc, Op, Reducible, UserOp};
pub use reqset::{Completion, Done, RequestSet};
pub use request::{scope, test_all, test_any, test_some, wait_all, wait_any, wait_some, Request, Scope};
pub use spawn::{appnum, parent};
pub use stats::Stats;
pub use sync::Threading;
/// `#[derive(Element)]`: see [`Element`](trait@Element).
pub use tmpi_derive::Element;
pub use topo::{dims_create, CartComm};
pub use typed::{Buf, BufMut, TypedRequest};
pub use typemap::{Element, TypeMap, TypeMapBuilder};
pub use vecrecv::VecRequest;
pub use version::{mpi_version, MPI_VERSION};
#[cfg(feature = "ofi")]
#[doc(hidden)]
pub use world::ofi_pair_one_thread;
pub use world::{
    init, init_thread, is_finalized, is_initialized, library_version, processor_name, run_local, run_local_threaded, run_local_with,
    run_shm_threads, shm_pair_one_thread, wtick, wtime, World,
};

/// A rank in a communicator.
pub type Rank = usize;
/// A user tag, `0..=TAG_UB`.
pub type Tag = u32;
/// Largest user tag (2^24 - 1: the tag field of the 64-bit match key).
pub const TAG_UB: Tag = (1 << 24) - 1;
