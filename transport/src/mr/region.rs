//! The region handle (`fid_mr`), and the counters and endpoints a region can be bound to.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use super::domain::{Domain, Segment};
use super::flags::{Access, BindFlags, MrMode, RegFlags};
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
    /// Application context, returned by [`MemoryRegion::context`].
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

    fn same(&self, other: &Counter) -> bool {
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

    fn same(&self, other: &Endpoint) -> bool {
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
    pub(crate) changes: Option<Arc<super::domain::PageChanges>>,
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
        super::domain::settle(&self.in_flight);
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

/// A registered memory region (`fid_mr`). Dropping it is `fi_close` without a way to report
/// `-FI_EBUSY`: a region with no open counter or endpoint bound is deregistered at once (its
/// key stops working); one that still has them stays registered, owned by its domain, until
/// they are closed and the domain reaps it ([`Domain::reap`], also done by every
/// registration), so a drop never bypasses the rule [`MemoryRegion::close`] enforces.
pub struct MemoryRegion {
    pub(crate) domain: Domain,
    pub(crate) inner: Arc<RegionInner>,
}

impl fmt::Debug for MemoryRegion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryRegion")
            .field("desc", &self.inner.desc)
            .field("iov", &self.inner.iov)
            .field("access", &self.inner.access)
            .field("enabled", &self.is_enabled())
            .finish_non_exhaustive()
    }
}

/// `close` refused: the region is handed back with the errno.
#[derive(Debug, thiserror::Error)]
#[error("fi_close: {errno}")]
pub struct CloseError {
    /// Why (`MrErrno::Busy`).
    pub errno: MrErrno,
    /// The region, still registered.
    pub region: MemoryRegion,
}

impl MemoryRegion {
    /// `fi_mr_desc`: the local descriptor.
    pub fn desc(&self) -> MrDesc {
        self.inner.desc
    }

    /// `fi_mr_key`: the remote key.
    ///
    /// # Errors
    /// [`MrErrno::KeyNotAvail`] under `FI_MR_RAW` (use [`MemoryRegion::raw_attr`]).
    pub fn key(&self) -> Result<u64, MrErrno> {
        self.inner.key()
    }

    /// `fi_mr_raw_attr`: writes the raw key (`mr_key_size` bytes) to the front of `raw_key`
    /// and returns the base address and the key size. Usable in every mode.
    ///
    /// # Errors
    /// [`MrErrno::TooSmall`] with the size needed when `raw_key` is shorter than
    /// `mr_key_size`; nothing is written then.
    pub fn raw_attr(&self, raw_key: &mut [u8]) -> Result<RawAttr, MrErrno> {
        self.inner.raw_attr(raw_key)
    }

    /// The registered segments.
    pub fn segments(&self) -> &[Segment] {
        &self.inner.iov
    }

    /// The access rights.
    pub fn access(&self) -> Access {
        self.inner.access
    }

    /// The context given to `regattr` (0 for `reg`/`regv`).
    pub fn context(&self) -> u64 {
        self.inner.context
    }

    /// Whether the region is usable: enabled, not revoked by the cache's monitor, and (under
    /// `FI_MR_MMU_NOTIFY`) refreshed since its pages last changed.
    pub fn is_enabled(&self) -> bool {
        self.inner.usable()
    }

    /// Number of successful [`MemoryRegion::refresh`] calls.
    pub fn refresh_count(&self) -> u64 {
        self.inner.refreshes.load(Ordering::Acquire)
    }

    fn check_bindable(&self) -> Result<(), MrErrno> {
        // Regions created disabled take no more bindings once enabled (fi_mr_enable).
        if self.inner.created_disabled && self.inner.enabled.load(Ordering::Acquire) {
            return Err(MrErrno::OpBadState);
        }
        Ok(())
    }

    /// `fi_mr_bind` with a counter: `flags` must be exactly [`BindFlags::REMOTE_WRITE`]
    /// (the only event the man page defines for regions). Binding the same counter again
    /// is accepted.
    ///
    /// # Errors
    /// - [`MrErrno::BadFlags`]: unknown bits in `flags`.
    /// - [`MrErrno::Inval`]: empty `flags`; counter closed; under `FI_MR_RMA_EVENT` the
    ///   region was not registered with [`RegFlags::RMA_EVENT`].
    /// - [`MrErrno::OpBadState`]: the region was created disabled and is already enabled.
    pub fn bind_counter(&self, counter: &Counter, flags: BindFlags) -> Result<(), MrErrno> {
        if flags.unknown_bits() != 0 {
            return Err(MrErrno::BadFlags);
        }
        if flags.is_empty() || counter.is_closed() {
            return Err(MrErrno::Inval);
        }
        if self.inner.mode.contains(MrMode::RMA_EVENT) && !self.inner.flags.contains(RegFlags::RMA_EVENT) {
            return Err(MrErrno::Inval);
        }
        self.check_bindable()?;
        let mut b = lock(&self.inner.bindings);
        if let Some(entry) = b.counters.iter_mut().find(|(c, _)| c.same(counter)) {
            entry.1 |= flags;
        } else {
            b.counters.push((counter.clone(), flags));
        }
        Ok(())
    }

    /// `fi_mr_bind` with an endpoint: `flags` must be 0. A region has at most one endpoint.
    ///
    /// # Errors
    /// - [`MrErrno::BadFlags`]: non-zero `flags`.
    /// - [`MrErrno::Inval`]: endpoint closed, or another open endpoint already bound.
    /// - [`MrErrno::OpBadState`]: the region was created disabled and is already enabled.
    pub fn bind_endpoint(&self, ep: &Endpoint, flags: u64) -> Result<(), MrErrno> {
        if flags != 0 {
            return Err(MrErrno::BadFlags);
        }
        if !ep.is_open() {
            return Err(MrErrno::Inval);
        }
        self.check_bindable()?;
        let mut b = lock(&self.inner.bindings);
        match &b.endpoint {
            Some(cur) if cur.same(ep) => Ok(()),
            Some(cur) if cur.is_open() => Err(MrErrno::Inval),
            _ => {
                b.endpoint = Some(ep.clone());
                Ok(())
            }
        }
    }

    /// `fi_mr_enable`: enables a region created disabled. Enabling an enabled region is a
    /// no-op.
    ///
    /// # Errors
    /// [`MrErrno::OpBadState`] under `FI_MR_ENDPOINT` when no open endpoint is bound.
    pub fn enable(&self) -> Result<(), MrErrno> {
        if self.inner.mode.contains(MrMode::ENDPOINT) {
            let b = lock(&self.inner.bindings);
            if !b.endpoint.as_ref().is_some_and(Endpoint::is_open) {
                return Err(MrErrno::OpBadState);
            }
        }
        self.inner.enabled.store(true, Ordering::Release);
        Ok(())
    }

    /// `fi_mr_refresh`: tells the provider the pages behind `iov` (or the whole region when
    /// `iov` is empty) may have changed. Checks that every range lies inside one registered
    /// segment; under `FI_MR_ALLOCATED` the region's pages must be mapped now. Then it has the
    /// effect the man page gives it, disabling and re-enabling access: a region whose pages
    /// changed under `FI_MR_MMU_NOTIFY` (refused since [`Domain::pages_changed`]) is usable
    /// again. Allowed in every mode; required by the man page only under `FI_MR_MMU_NOTIFY`.
    ///
    /// # Errors
    /// [`MrErrno::BadFlags`] for non-zero `flags`; [`MrErrno::Inval`] for a range outside
    /// the region, of length 0, or overflowing; [`MrErrno::Fault`] under `FI_MR_ALLOCATED`
    /// when pages of the region are not mapped (it stays disabled).
    pub fn refresh(&self, iov: &[Segment], flags: u64) -> Result<(), MrErrno> {
        if flags != 0 {
            return Err(MrErrno::BadFlags);
        }
        for s in iov {
            let end = s.addr.checked_add(s.len).ok_or(MrErrno::Inval)?;
            let inside = s.len > 0 && self.inner.iov.iter().any(|r| s.addr >= r.addr && end <= r.addr + r.len);
            if !inside {
                return Err(MrErrno::Inval);
            }
        }
        if self.inner.mode.contains(MrMode::ALLOCATED) && !self.inner.iov.iter().all(|s| super::pages::mapped(s.addr, s.len)) {
            return Err(MrErrno::Fault);
        }
        if let Some(ch) = &self.inner.changes {
            self.inner.seen_changes.store(ch.epoch(), Ordering::Release);
        }
        self.inner.stale.store(false, Ordering::Release);
        self.inner.refreshes.fetch_add(1, Ordering::AcqRel);
        Ok(())
    }

    /// `fi_close`: deregisters the region.
    ///
    /// # Errors
    /// [`MrErrno::Busy`] (with the region handed back) while an open counter or endpoint is
    /// bound to it; close those first.
    pub fn close(self) -> Result<(), CloseError> {
        if self.inner.busy() {
            return Err(CloseError { errno: MrErrno::Busy, region: self });
        }
        drop(self);
        Ok(())
    }
}

impl Drop for MemoryRegion {
    fn drop(&mut self) {
        self.domain.close_or_orphan(&self.inner);
    }
}
