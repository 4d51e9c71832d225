//! What a registered region is (`RegionInner`: made by the domain, owned by its handle in
//! `handle`), its attributes and descriptor, and the counters and endpoints it can be bound to.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use super::flags::{Access, BindFlags, MrMode, RegFlags};
use super::pages::{settle, PageChanges, Segment};
use super::{lock, MrErrno};

/// Local memory descriptor of a region (`fi_mr_desc`): what data-transfer calls take as `desc`
/// under `FI_MR_LOCAL`. Opaque; unique among the regions a domain ever registered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MrDesc(pub(crate) u64);

impl MrDesc {
    /// The descriptor as a number (for logs and wire formats that carry it).
    pub fn as_u64(self) -> u64 {
        self.0
    }
}

/// `enum fi_hmem_iface`: which API allocated the memory of a registration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HmemIface {
    /// `FI_HMEM_SYSTEM`: ordinary host memory (malloc, mmap): the only memory this model has.
    #[default]
    System,
    /// `FI_HMEM_CUDA`.
    Cuda,
    /// `FI_HMEM_ROCR`.
    Rocr,
    /// `FI_HMEM_ZE`.
    Ze,
    /// `FI_HMEM_NEURON`.
    Neuron,
    /// `FI_HMEM_SYNAPSEAI`.
    SynapseAi,
}

/// The arguments of `fi_mr_regattr` (`struct fi_mr_attr`).
///
/// Device memory (`iface`/`device`, `FI_MR_DMABUF`'s `dmabuf`, `hmem_data`) would name memory
/// a GPU or accelerator owns; this model has only host memory, so anything but
/// [`HmemIface::System`] is `-FI_ENOSYS`, as is an `auth_key`: authorization keys would limit a
/// region to peers programmed with the same key, and no domain here is opened with one
/// (`FI_AV_AUTH_KEY`), so there is nothing to check it against.
#[derive(Debug, Clone, Copy)]
pub struct MrAttr<'a> {
    /// The segments registered as one region (`mr_iov`, `iov_count`).
    pub iov: &'a [Segment],
    /// Access rights.
    pub access: Access,
    /// Reserved; must be 0.
    pub offset: u64,
    /// The key asked for; ignored under `FI_MR_PROV_KEY`.
    pub requested_key: u64,
    /// Application context, returned by [`MemoryRegion::context`](super::MemoryRegion::context).
    pub context: u64,
    /// `iface` (the `device` field is meaningless without device memory): anything but
    /// [`HmemIface::System`] is `-FI_ENOSYS`.
    pub iface: HmemIface,
    /// `auth_key` (`auth_key_size` is its length): empty, or `-FI_ENOSYS`.
    pub auth_key: &'a [u8],
}

impl<'a> MrAttr<'a> {
    /// Host memory, no context, no authorization key: the attributes `fi_mr_reg` and
    /// `fi_mr_regv` stand for.
    pub fn new(iov: &'a [Segment], access: Access, offset: u64, requested_key: u64) -> MrAttr<'a> {
        MrAttr { iov, access, offset, requested_key, context: 0, iface: HmemIface::System, auth_key: &[] }
    }
}

/// What `fi_mr_raw_attr` returns besides the key bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawAttr {
    /// The address a peer adds offsets to: the first segment's address under
    /// `FI_MR_VIRT_ADDR`, 0 otherwise. Passed unchanged to the peer's `map_raw`.
    pub base_addr: u64,
    /// Number of key bytes written (the domain's `mr_key_size`).
    pub key_size: usize,
}

/// A completion counter (`fid_cntr`) that a region can be bound to with
/// [`BindFlags::REMOTE_WRITE`]: it counts the remote writes the target side grants.
///
/// Cloning gives another handle to the same counter.
#[derive(Clone, Default)]
pub struct Counter {
    inner: Arc<CounterInner>,
}

#[derive(Default)]
struct CounterInner {
    value: AtomicU64,
    closed: AtomicBool,
}

impl Counter {
    /// Opens a counter at 0.
    pub fn new() -> Self {
        Self::default()
    }

    /// The number of events counted so far.
    pub fn value(&self) -> u64 {
        self.inner.value.load(Ordering::Acquire)
    }

    /// Closes the counter: it stops counting and no longer keeps bound regions from closing.
    /// Closing twice is harmless.
    pub fn close(&self) {
        self.inner.closed.store(true, Ordering::Release);
    }

    /// Whether [`Counter::close`] was called.
    pub fn is_closed(&self) -> bool {
        self.inner.closed.load(Ordering::Acquire)
    }

    pub(crate) fn add_event(&self) {
        if !self.is_closed() {
            self.inner.value.fetch_add(1, Ordering::AcqRel);
        }
    }

    pub(crate) fn same(&self, other: &Counter) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }
}

impl fmt::Debug for Counter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Counter").field("value", &self.value()).field("closed", &self.is_closed()).finish()
    }
}

/// The MR model's view of an endpoint (`fid_ep`): what a region is bound to under
/// `FI_MR_ENDPOINT`. The fabric that owns the real endpoint keeps this handle open as long as
/// the endpoint is, and closes it with it.
#[derive(Clone)]
pub struct Endpoint {
    open: Arc<AtomicBool>,
}

impl Default for Endpoint {
    fn default() -> Self {
        Self::new()
    }
}

impl Endpoint {
    /// An open endpoint.
    pub fn new() -> Self {
        Self { open: Arc::new(AtomicBool::new(true)) }
    }

    /// Closes the endpoint; bound regions may then be closed.
    pub fn close(&self) {
        self.open.store(false, Ordering::Release);
    }

    /// Whether the endpoint is still open.
    pub fn is_open(&self) -> bool {
        self.open.load(Ordering::Acquire)
    }

    pub(crate) fn same(&self, other: &Endpoint) -> bool {
        Arc::ptr_eq(&self.open, &other.open)
    }
}

impl fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Endpoint").field("open", &self.is_open()).finish()
    }
}

#[derive(Default)]
pub(crate) struct Bindings {
    pub(crate) counters: Vec<(Counter, BindFlags)>,
    pub(crate) endpoint: Option<Endpoint>,
}

/// The state of one registration, shared by its handle, the domain's key table and (for
/// cached registrations) the cache.
pub(crate) struct RegionInner {
    /// The 64-bit key (first 8 bytes of the raw key, little-endian).
    pub(crate) key: u64,
    /// Raw key bytes beyond the first 8 (only when `mr_key_size` > 8).
    pub(crate) raw_tail: Box<[u8]>,
    pub(crate) desc: MrDesc,
    pub(crate) iov: Box<[Segment]>,
    /// Sum of the segment lengths.
    pub(crate) total_len: usize,
    pub(crate) access: Access,
    pub(crate) flags: RegFlags,
    pub(crate) context: u64,
    /// The domain's mode and key size, copied so a region can answer alone.
    pub(crate) mode: MrMode,
    pub(crate) key_size: usize,
    /// Created disabled (`FI_MR_ENDPOINT`, or `FI_MR_RMA_EVENT` with `FI_RMA_EVENT`).
    pub(crate) created_disabled: bool,
    /// Written by `enable`; read by the access checks.
    pub(crate) enabled: AtomicBool,
    /// Set once when the region is deregistered or its memory is unmapped (the cache's
    /// monitor thread sets it without any lock). Never cleared.
    pub(crate) revoked: AtomicBool,
    /// Under `FI_MR_MMU_NOTIFY`: the pages behind the region changed
    /// ([`Domain::pages_changed`]) and no `refresh` has followed; access is refused.
    pub(crate) stale: AtomicBool,
    /// The domain's page changes, under `FI_MR_MMU_NOTIFY` only.
    pub(crate) changes: Option<Arc<PageChanges>>,
    /// The change epoch up to which this region has been checked (or refreshed).
    pub(crate) seen_changes: AtomicU64,
    /// Number of `refresh` calls.
    pub(crate) refreshes: AtomicU64,
    pub(crate) bindings: Mutex<Bindings>,
    /// The domain's count of invalidation batches in progress.
    pub(crate) in_flight: Arc<AtomicUsize>,
}

impl RegionInner {
    /// Whether remote and local accesses may use the region now.
    pub(crate) fn usable(&self) -> bool {
        settle(&self.in_flight);
        self.enabled.load(Ordering::Acquire) && !self.revoked.load(Ordering::Acquire) && !self.changed()
    }

    /// Under `FI_MR_MMU_NOTIFY`: whether the pages changed since the last refresh.
    fn changed(&self) -> bool {
        let Some(ch) = &self.changes else { return false };
        if self.stale.load(Ordering::Acquire) {
            return true;
        }
        let (seen, now) = (self.seen_changes.load(Ordering::Acquire), ch.epoch());
        if seen >= now {
            return false;
        }
        if ch.touched_since(seen, now, &self.iov) {
            self.stale.store(true, Ordering::Release);
            return true;
        }
        // Nothing of ours: remember how far we looked (unless a refresh moved it on).
        let _ = self.seen_changes.compare_exchange(seen, now, Ordering::AcqRel, Ordering::Acquire);
        false
    }

    /// Whether an open counter or endpoint is bound to the region (`fi_close` would be
    /// `-FI_EBUSY`).
    pub(crate) fn busy(&self) -> bool {
        let b = lock(&self.bindings);
        b.counters.iter().any(|(c, _)| !c.is_closed()) || b.endpoint.as_ref().is_some_and(Endpoint::is_open)
    }

    pub(crate) fn revoke(&self) {
        self.revoked.store(true, Ordering::Release);
    }

    /// The address peers add offsets to.
    pub(crate) fn base_addr(&self) -> u64 {
        if self.mode.contains(MrMode::VIRT_ADDR) {
            self.iov.first().map_or(0, |s| s.addr as u64)
        } else {
            0
        }
    }

    pub(crate) fn key(&self) -> Result<u64, MrErrno> {
        if self.mode.contains(MrMode::RAW) {
            Err(MrErrno::KeyNotAvail)
        } else {
            Ok(self.key)
        }
    }

    pub(crate) fn raw_attr(&self, raw_key: &mut [u8]) -> Result<RawAttr, MrErrno> {
        let n = self.key_size;
        let out = raw_key.get_mut(..n).ok_or(MrErrno::TooSmall { needed: n })?;
        let head = n.min(8);
        out[..head].copy_from_slice(&self.key.to_le_bytes()[..head]);
        out[head..].copy_from_slice(&self.raw_tail);
        Ok(RawAttr { base_addr: self.base_addr(), key_size: n })
    }

    /// Counts one granted remote write on every open counter bound for it.
    pub(crate) fn count_remote_write(&self) {
        let b = lock(&self.bindings);
        for (c, f) in &b.counters {
            if f.contains(BindFlags::REMOTE_WRITE) {
                c.add_event();
            }
        }
    }
}
