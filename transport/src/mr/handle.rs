//! The region handle (`fid_mr`) and the registration calls that make one
//! (`fi_mr_reg`, `fi_mr_regv`, `fi_mr_regattr`): a [`MemoryRegion`] owns its region's entry
//! in its [`Domain`] and closes it when dropped.

use std::fmt;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::domain::{Domain, KeyChoice};
use super::flags::{Access, BindFlags, MrMode, RegFlags};
use super::pages::Segment;
use super::region::{Counter, Endpoint, MrAttr, MrDesc, RawAttr, RegionInner};
use super::{lock, MrErrno};

impl Domain {
    /// `fi_mr_reg`: registers `[addr, addr + len)`.
    ///
    /// # Errors
    /// As [`Domain::regattr`].
    pub fn reg(
        &self,
        addr: usize,
        len: usize,
        access: Access,
        offset: u64,
        requested_key: u64,
        flags: RegFlags,
    ) -> Result<MemoryRegion, MrErrno> {
        let iov = [Segment { addr, len }];
        self.regattr(&MrAttr::new(&iov, access, offset, requested_key), flags)
    }

    /// `fi_mr_regv`: registers several segments as one region. Peers see the segments as one
    /// contiguous range, in order (offset 0 is the first byte of the first segment; under
    /// `FI_MR_VIRT_ADDR` that byte's address).
    ///
    /// # Errors
    /// As [`Domain::regattr`].
    pub fn regv(&self, iov: &[Segment], access: Access, offset: u64, requested_key: u64, flags: RegFlags) -> Result<MemoryRegion, MrErrno> {
        self.regattr(&MrAttr::new(iov, access, offset, requested_key), flags)
    }

    /// `fi_mr_regattr`: the general registration call.
    ///
    /// The region starts enabled, except under `FI_MR_ENDPOINT` (always disabled until an
    /// endpoint is bound and [`MemoryRegion::enable`] is called) and under `FI_MR_RMA_EVENT`
    /// when `flags` has [`RegFlags::RMA_EVENT`] (disabled until enabled, so counters can be
    /// bound first).
    ///
    /// Keys: under `FI_MR_PROV_KEY`, `requested_key` is ignored entirely (any value, even
    /// one that would be rejected otherwise) and the key is a random value of `mr_key_size`
    /// bytes drawn with `getrandom`. Without it, `requested_key` is the key.
    ///
    /// Under `FI_MR_ALLOCATED` every segment must be backed by mapped pages now (a
    /// `mincore` check); without it any range may be registered, mapped or not, as the man
    /// page's default says.
    ///
    /// # Errors
    /// - [`MrErrno::NoSys`]: device memory (`iface` not system, `FI_HMEM_DEVICE_ONLY`,
    ///   `FI_HMEM_HOST_ALLOC`, `FI_MR_DMABUF`) or an `auth_key`.
    /// - [`MrErrno::BadFlags`]: `flags` has bits libfabric's registration calls do not
    ///   define here (e.g. [`super::FI_RMA_PMEM`]).
    /// - [`MrErrno::Fault`]: under `FI_MR_ALLOCATED`, a segment with unmapped pages.
    /// - [`MrErrno::Inval`]: unknown `access` bits; `offset` not 0; no segment or more than
    ///   `mr_iov_limit`; a segment of length 0 or whose end overflows; total length overflows.
    /// - [`MrErrno::KeyRejected`]: (no `PROV_KEY`) `requested_key` wider than `mr_key_size`
    ///   bytes, or [`KEY_NOTAVAIL`](super::KEY_NOTAVAIL).
    /// - [`MrErrno::NoKey`]: (no `PROV_KEY`) `requested_key` is in use.
    /// - [`MrErrno::NoSpace`] / [`MrErrno::Other`]: (`PROV_KEY`) no free key was found /
    ///   the random source failed.
    pub fn regattr(&self, attr: &MrAttr<'_>, flags: RegFlags) -> Result<MemoryRegion, MrErrno> {
        self.register(attr, flags, KeyChoice::Requested(attr.requested_key))
    }

    pub(crate) fn register(&self, attr: &MrAttr<'_>, flags: RegFlags, key: KeyChoice) -> Result<MemoryRegion, MrErrno> {
        Ok(MemoryRegion { domain: self.clone(), inner: self.add_region(attr, flags, key)? })
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
