//! The fi_mr memory-registration model and its registration cache.
//!
//! This is a software model of what `fi_mr(3)` gives an application (see
//! `seeds/fi_mr.3.md`): a [`Domain`] opened with `mr_mode` bits ([`MrMode`]), a key size and an
//! iov limit; [`Domain::reg`], [`Domain::regv`] and [`Domain::regattr`] that return a
//! [`MemoryRegion`] (the `fid_mr`), with its `desc`, `key`, `raw_attr`, `bind`, `enable`,
//! `refresh` and `close`; `map_raw`/`unmap_key` on the domain; and the errors of the man page
//! ([`MrErrno`]). A region records addresses and lengths; it never owns or touches memory.
//!
//! The target side of a remote access calls [`Domain::check_remote`] with the (key, address,
//! length, operation) the initiator named. It checks the key, the region's state, the range and
//! the access rights *before* any byte moves and returns the local segments to copy, or a
//! [`RemoteAccessError`] that the fabric reports to the initiator as a failed access.
//!
//! [`cache`] holds the registration cache ([`MrCache`]) with its userfaultfd monitor.
//!
//! ```
//! use tmpi_transport::mr::{Access, Domain, DomainAttr, MrMode, RegFlags, RemoteOp};
//! let dom = Domain::open(DomainAttr {
//!     mr_mode: MrMode::PROV_KEY | MrMode::VIRT_ADDR,
//!     ..DomainAttr::default()
//! })
//! .unwrap();
//! let buf = vec![7u8; 64];
//! let base = buf.as_ptr() as usize;
//! let mr = dom.reg(base, buf.len(), Access::REMOTE_READ, 0, 0, RegFlags::empty()).unwrap();
//! let key = mr.key().unwrap();
//! // A peer reads 16 bytes at base + 8: allowed, one local segment.
//! let r = dom.check_remote(key, base as u64 + 8, 16, RemoteOp::Read).unwrap();
//! assert_eq!(r.segments()[0].addr, base + 8);
//! // Writing is not allowed: refused before anything moves.
//! assert!(dom.check_remote(key, base as u64, 16, RemoteOp::Write).is_err());
//! mr.close().unwrap();
//! ```
//!
//! Mode bits the model does not need (`FI_MR_HMEM`, `FI_MR_COLLECTIVE`) are cleared at
//! [`Domain::open`] and reported ([`Domain::cleared_mode`]), as `fi_getinfo` does; device
//! memory and authorization keys are `-FI_ENOSYS`. `transport/CONFORMANCE.md` lists every
//! concept of the man page with the file and tests that cover it.
//!
//! Files: `flags` (bit types), `domain` (domain, keys, remote and local checks, page-change
//! notices), `region` (the region handle, counters and endpoints), `pages` (the
//! `FI_MR_ALLOCATED` check), `cache/` (the registration cache).

pub mod cache;
mod domain;
mod flags;
mod handle;
mod pages;
mod region;

#[cfg(test)]
mod tests;
#[cfg(test)]
pub(crate) mod tests_libfabric;

pub use cache::{CacheConfig, CacheDomain, CacheRegion, CacheStats, CachedMr, KnobError, Monitor, MonitorStatus, MrCache};
pub use domain::{Domain, DomainAttr, MappedKey, RawKey, RemoteOp, ResolvedRange, DEFAULT_MR_IOV_LIMIT, KEY_NOTAVAIL, MAX_MR_KEY_SIZE};
pub use flags::{Access, BindFlags, MrMode, RegFlags, FI_RMA_PMEM};
pub use handle::{CloseError, MemoryRegion};
pub use pages::Segment;
pub use region::{Counter, Endpoint, HmemIface, MrAttr, MrDesc, RawAttr};

/// Why a remote access was refused by [`Domain::check_remote`]. The fabric reports it to the
/// initiator as a failed access (`FI_EACCES`); no byte of the target was touched.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RemoteAccessError {
    /// No region has this key: never registered, closed, or replaced by a new registration.
    #[error("unknown memory key")]
    UnknownKey,
    /// The region exists but is disabled (not yet enabled, or its memory was unmapped).
    #[error("memory region disabled")]
    Disabled,
    /// The range is not inside the region (or its arithmetic overflows).
    #[error("range outside the memory region")]
    OutOfRange,
    /// The region was not registered with the access this operation needs
    /// (`REMOTE_READ` for reads, `REMOTE_WRITE` for writes, or the local access asked).
    #[error("access not granted by the memory region")]
    Denied,
}

/// Fabric errno values returned by the fi_mr calls (`rdma/fi_errno.h`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum MrErrno {
    /// `-FI_EINVAL`: an argument the call does not accept (non-zero `offset`, `len` 0, too
    /// many iov entries, unknown access bits, an unknown key for `unmap_key`, ...).
    #[error("FI_EINVAL: invalid argument")]
    Inval,
    /// `-FI_EBUSY`: `close` while an open counter or endpoint is still bound to the region.
    #[error("FI_EBUSY: resources still bound to the memory region")]
    Busy,
    /// `-FI_ENOKEY`: the requested key is already in use by another region.
    #[error("FI_ENOKEY: requested key already in use")]
    NoKey,
    /// `-FI_EKEYREJECTED`: the requested key is out of the range the domain supports
    /// (wider than `mr_key_size`, or the reserved value [`KEY_NOTAVAIL`]).
    #[error("FI_EKEYREJECTED: requested key not available")]
    KeyRejected,
    /// `-FI_EBADFLAGS`: flags the call does not support.
    #[error("FI_EBADFLAGS: flags not supported")]
    BadFlags,
    /// `-FI_ETOOSMALL`: the raw-key buffer is too small; `needed` is the size required.
    #[error("FI_ETOOSMALL: buffer too small, {needed} bytes needed")]
    TooSmall {
        /// The buffer size needed (the domain's `mr_key_size`).
        needed: usize,
    },
    /// `FI_KEY_NOTAVAIL`: `fi_mr_key` has no 64-bit key to give because the domain uses raw
    /// keys (`FI_MR_RAW`); use `raw_attr`.
    #[error("FI_KEY_NOTAVAIL: key must be read with raw_attr")]
    KeyNotAvail,
    /// `-FI_EOPBADSTATE`: the call is not allowed in the region's state (binding after
    /// `enable`, `enable` under `FI_MR_ENDPOINT` without an endpoint bound).
    #[error("FI_EOPBADSTATE: operation not permitted in current state")]
    OpBadState,
    /// `-FI_ENOSPC`: no unused provider key could be found (tiny `mr_key_size`, key space
    /// nearly full).
    #[error("FI_ENOSPC: no provider key available")]
    NoSpace,
    /// `-FI_EOTHER`: the operating system's random source failed while choosing a key.
    #[error("FI_EOTHER: random source failed")]
    Other,
    /// `-FI_EFAULT`: under `FI_MR_ALLOCATED`, a registered range (or, at `refresh`, the
    /// region) is not backed by mapped pages.
    #[error("FI_EFAULT: memory not mapped")]
    Fault,
    /// `-FI_ENOSYS`: a feature the model does not have: device memory (`iface` other than
    /// system, `FI_HMEM_DEVICE_ONLY`, `FI_HMEM_HOST_ALLOC`, `FI_MR_DMABUF`) or an
    /// authorization key.
    #[error("FI_ENOSYS: not supported by this model")]
    NoSys,
    /// `-FI_EACCES`: a remote (or local) access was refused; see [`RemoteAccessError`].
    #[error("FI_EACCES: {0}")]
    Access(RemoteAccessError),
}

impl MrErrno {
    /// The positive fabric errno value (`FI_E*` of `rdma/fi_errno.h`) a C caller would see
    /// negated. [`MrErrno::KeyNotAvail`] is reported by `fi_mr_key` as a key value, not an
    /// errno; it maps to `FI_ENOKEY` ("required key not available").
    pub fn code(self) -> i32 {
        match self {
            MrErrno::Inval => 22,
            MrErrno::Busy => 16,
            MrErrno::NoKey | MrErrno::KeyNotAvail => 266,
            MrErrno::KeyRejected => 129,
            MrErrno::BadFlags => 260,
            MrErrno::TooSmall { .. } => 257,
            MrErrno::OpBadState => 258,
            MrErrno::NoSpace => 28,
            MrErrno::Other => 256,
            MrErrno::Access(_) => 13,
            MrErrno::Fault => 14,
            MrErrno::NoSys => 38,
        }
    }
}

impl From<RemoteAccessError> for MrErrno {
    fn from(e: RemoteAccessError) -> Self {
        MrErrno::Access(e)
    }
}

/// Locks a mutex, ignoring poisoning: every structure guarded here is left consistent at each
/// point where a panic could occur (no panics are expected; this avoids cascading ones).
fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}
