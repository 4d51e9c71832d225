//! # tmpi-transport
//!
//! What a NIC, its driver and libfabric would give an MPI library, modelled in software:
//!
//! - [`wire`]: the tag-matching headers (TMH, RVH) exactly as rdma-core's `tm_types.h` lays
//!   them out, big-endian, with a decoder that rejects malformed input.
//! - [`tm`]: the soft TM-SRQ, a sans-IO model of RDMA hardware tag matching.
//! - [`mr`]: the fi_mr memory-registration model and its registration cache.
//! - [`shm`]: the shared-memory fabric between processes of one node.
//! - [`local`]: ranks as threads of one process, for tests.
//! - [`tcp`]: the TCP fabric between hosts (one connection per pair of ranks).
//! - `ofi` (cargo feature `ofi`): libfabric's providers: safe wrappers, the tag layout and
//!   the OFI packet fabric.
//! - [`packet`]: what every fabric delivers: packets, their flags, peer states.
//! - [`fabric`]: packets, the [`fabric::Fabric`] trait every fabric implements, and
//!   [`fabric::AnyFabric`], the one the runtime drives (shared memory, TCP, or both in one
//!   job).
//! - [`secret`] and [`auth`]: the job's secret, and how a connection proves it (the TCP
//!   fabric and the bootstrap service alike).
//! - [`bootstrap`]: the key-value service that `tmpirun` serves and ranks use to meet.
//! - [`fi_shm`]: the names of the regions libfabric's `shm` provider leaves in `/dev/shm`.
//! - [`host`]: which host a rank runs on (ranks of one host share memory).
//! - [`knobs`]: every `TMPI_*` environment variable, its default and meaning.
//!
//! This crate never depends on the runtime (`tmpi`); the runtime and the launcher use it.
//!
//! ```
//! use tmpi_transport::wire::{Tmh, TmOp, TMH_LEN};
//! let h = Tmh { op: TmOp::Eager, app_ctx: 7, tag: 0xdead_beef };
//! let mut buf = [0u8; TMH_LEN];
//! h.encode(&mut buf);
//! assert_eq!(Tmh::decode(&buf).unwrap(), h);
//! ```

pub mod auth;
pub mod bootstrap;
pub mod error;
pub mod fabric;
pub mod fi_shm;
pub mod host;
pub mod knobs;
pub mod local;
pub mod mr;
#[cfg(feature = "ofi")]
pub mod ofi;
pub mod packet;
pub mod secret;
pub mod shm;
pub mod tcp;
pub mod tm;
pub mod wire;

pub use error::{Error, Result};
