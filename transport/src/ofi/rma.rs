//! Rendezvous reads over the OFI fabric's endpoint: the sender registers its buffer with
//! `fi_mr_reg` (through tmpi's registration cache, [`MrCache<OfiDomain>`], so repeated sends
//! of one buffer hit it), the receiver `fi_read`s it straight into its receive buffer.
//!
//! The provider's `mr_mode` bits ([`read_support`]):
//!
//! - `FI_MR_VIRT_ADDR`: a peer names the buffer by its virtual address, else by its offset in
//!   the region ([`ReadRegion::remote_addr`]).
//! - `FI_MR_PROV_KEY`: the provider chooses the key (the cache asks for none); keys are at
//!   most `mr_key_size` bytes, and one wider than 8 cannot be sent: reads are off.
//! - `FI_MR_ENDPOINT`: the region must be bound to the endpoint and enabled before use, which
//!   a shared cache cannot do: each send registers its own region, bound and enabled here.
//! - `FI_MR_RAW`: keys need `fi_mr_raw_attr` and the peer's `fi_mr_map_raw`: not supported,
//!   reads are off (the rendezvous streams through the packets).
//! - `FI_MR_LOCAL`: the OFI fabric refuses such providers when it opens
//!   ([`super::OfiFabric::new`]), so reads never meet it.
//!
//! Reads are posted into memory the caller owns ([`super::Endpoint::read_raw`]); one the
//! provider has no room for (`-FI_EAGAIN`) waits in a queue and is posted again at the next
//! progress. Each ends in a [`ReadDone`], taken with [`super::OfiFabric::take_reads_done`].

use std::collections::VecDeque;

use super::core::{Desc, OfiDomain, OfiMr, Post};
use super::OfiFabric;
use crate::error::{Error, Result};
use crate::mr::cache::{CacheConfig, CacheStats, CachedMr, MrCache};
use crate::mr::{Access, MrMode, RegFlags, Segment};

/// The `user` word of the fabric's `fi_read`s (packets use rank numbers and `u64::MAX`,
/// matching by the provider its own word).
pub(crate) const READ_USER_BASE: u64 = 1 << 62;

/// Why reads cannot run on a provider whose `mr_mode` is `mode` with keys of `key_size`
/// bytes, or `None` when they can.
pub fn read_support(mode: MrMode, key_size: usize) -> Option<String> {
    if mode.contains(MrMode::RAW) {
        return Some("the provider requires FI_MR_RAW (raw keys mapped at the peer), which tmpi does not support".into());
    }
    if key_size > 8 {
        return Some(format!("the provider's memory keys are {key_size} bytes, wider than the 8 a rendezvous request carries"));
    }
    if mode.contains(MrMode::LOCAL) {
        return Some("the provider requires FI_MR_LOCAL, which the OFI fabric does not register for".into());
    }
    None
}

/// A send buffer's registration for reads: from the cache, or (under `FI_MR_ENDPOINT`) its
/// own region, bound to the endpoint and enabled. Released (to the cache, or closed) on drop.
#[derive(Debug)]
pub enum ReadRegion {
    /// A cached registration.
    Cached(CachedMr<OfiDomain>),
    /// A registration of this send alone.
    Bound(OfiMr),
}

impl ReadRegion {
    fn mr(&self) -> &OfiMr {
        match self {
            ReadRegion::Cached(c) => c.region().mr(),
            ReadRegion::Bound(m) => m,
        }
    }

    /// The remote key (`fi_mr_key`).
    pub fn key(&self) -> Option<u64> {
        self.mr().key()
    }

    /// The address a peer names for local address `addr` (virtual address or offset, as the
    /// provider's `FI_MR_VIRT_ADDR` says).
    pub fn remote_addr(&self, addr: usize) -> Option<u64> {
        self.mr().remote_addr(addr)
    }

    /// Whether it came from the cache.
    pub fn is_cached(&self) -> bool {
        matches!(self, ReadRegion::Cached(c) if c.is_cached())
    }
}

/// A finished `fi_read`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadDone {
    /// The caller's name for the read.
    pub user: u64,
    /// `None` on success, else the positive `FI_E*` it completed with.
    pub error: Option<i32>,
}

/// Counters of the fabric's reads.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReadStats {
    /// `fi_read`s posted.
    pub posted: u64,
    /// Bytes they read.
    pub bytes: u64,
    /// Those that completed with an error.
    pub failed: u64,
    /// Times a post met `-FI_EAGAIN` and was queued.
    pub queued: u64,
    /// Registrations made for sends outside the cache (caching off, a range the monitor
    /// could not watch, or `FI_MR_ENDPOINT`); the cache counts its own hits and misses.
    pub regs: u64,
}

struct Pending {
    src: u64,
    dst: *mut u8,
    len: usize,
    addr: u64,
    key: u64,
    user: u64,
}

/// The reads' state in an [`OfiFabric`].
pub(crate) struct Reads {
    cache: Option<MrCache<OfiDomain>>,
    domain: OfiDomain,
    queue: VecDeque<Pending>,
    pub(crate) done: Vec<ReadDone>,
    pub(crate) stats: ReadStats,
}

impl Reads {
    pub(crate) fn queue_is_empty(&self) -> bool {
        self.queue.is_empty()
    }
}

// SAFETY: the raw destinations of queued reads are the caller's (`post_read`'s contract); the
// fabric is used from one thread at a time.
unsafe impl Send for Reads {}

impl OfiFabric {
    /// Turns reads on with a registration cache of `cfg` (none under `FI_MR_ENDPOINT`,
    /// whose regions are bound per send).
    ///
    /// # Errors
    /// [`Error::Fabric`] naming why the provider's `mr_mode` or key size rules reads out
    /// ([`read_support`]), or the cache's failure.
    pub fn enable_reads(&mut self, cfg: CacheConfig) -> Result<()> {
        let offer = self.endpoint().offer();
        if let Some(why) = read_support(offer.mr_mode, offer.mr_key_size) {
            return Err(Error::Fabric(format!("OFI rendezvous reads on {}: {why}", offer.provider)));
        }
        let domain = OfiDomain { inner: std::sync::Arc::clone(&self.endpoint().dom) };
        let cache = if domain.mr_mode().contains(MrMode::ENDPOINT) {
            None
        } else {
            Some(MrCache::new(domain.clone(), cfg).map_err(|e| Error::Fabric(format!("OFI registration cache: {e:?}")))?)
        };
        self.reads = Some(Reads { cache, domain, queue: VecDeque::new(), done: Vec::new(), stats: ReadStats::default() });
        Ok(())
    }

    /// Whether [`OfiFabric::enable_reads`] turned reads on.
    pub fn reads_enabled(&self) -> bool {
        self.reads.is_some()
    }

    /// Registers `[addr, addr + len)` for peers' reads (`REMOTE_READ`): through the cache,
    /// or bound to the endpoint and enabled under `FI_MR_ENDPOINT`.
    ///
    /// # Errors
    /// Reads off; the registration's failure ([`Error::Ofi`], or the cache's errno).
    pub fn register_read(&mut self, addr: usize, len: usize) -> Result<ReadRegion> {
        let Some(r) = self.reads.as_mut() else { return Err(Error::InvalidArgument("OFI reads are off".into())) };
        let region = match &r.cache {
            Some(c) => ReadRegion::Cached(c.get(addr, len, Access::REMOTE_READ).map_err(|e| Error::Fabric(format!("fi_mr_reg: {e:?}")))?),
            None => {
                let mut mr = r.domain.reg(&[Segment { addr, len }], Access::REMOTE_READ, 0, RegFlags::empty())?;
                mr.bind_enable(self.endpoint())?;
                ReadRegion::Bound(mr)
            }
        };
        if let Some(r) = self.reads.as_mut() {
            if !region.is_cached() || r.cache.as_ref().is_some_and(|c| !c.is_caching()) {
                r.stats.regs += 1;
            }
        }
        Ok(region)
    }

    /// The registration cache's counters (`None`: reads off or no cache).
    pub fn read_cache_stats(&self) -> Option<CacheStats> {
        self.reads.as_ref()?.cache.as_ref().map(MrCache::stats)
    }

    /// The reads' counters (`None`: reads off).
    pub fn read_stats(&self) -> Option<ReadStats> {
        self.reads.as_ref().map(|r| r.stats)
    }

    /// `fi_read` of `len` bytes at `addr` of rank `src`'s region with `key` into `dst`; it
    /// ends in a [`ReadDone`] named `user` (at most `2^62 - 1`). Queued if the provider has no
    /// room now.
    ///
    /// # Safety
    /// `dst` must be valid for writes of `len` bytes, by nobody else, until its [`ReadDone`]
    /// was taken ([`OfiFabric::take_reads_done`]) or the fabric is dropped.
    ///
    /// # Errors
    /// Reads off, a bad rank or name; [`Error::Ofi`] naming `fi_read`.
    pub unsafe fn post_read(&mut self, src: usize, dst: *mut u8, len: usize, addr: u64, key: u64, user: u64) -> Result<()> {
        let Some(&src_addr) = self.addrs.get(src) else { return Err(Error::InvalidArgument(format!("OFI read from rank {src}"))) };
        if self.reads.is_none() || user >= READ_USER_BASE {
            return Err(Error::InvalidArgument("OFI read: reads off, or a name too large".into()));
        }
        let p = Pending { src: src_addr, dst, len, addr, key, user };
        if self.reads.as_ref().is_some_and(|r| !r.queue.is_empty()) {
            if let Some(r) = self.reads.as_mut() {
                r.queue.push_back(p);
            }
            return Ok(());
        }
        // SAFETY: the caller's promise covers `dst` until the read's end is taken.
        if let Some(p) = unsafe { self.try_post(p) }? {
            if let Some(r) = self.reads.as_mut() {
                r.queue.push_back(p);
            }
        }
        Ok(())
    }

    /// Posts `p`; gives it back while the provider has no room.
    ///
    /// # Safety
    /// As [`OfiFabric::post_read`].
    unsafe fn try_post(&mut self, p: Pending) -> Result<Option<Pending>> {
        // SAFETY: the caller's promise (`post_read`) covers `p.dst` for `p.len` bytes.
        let post = unsafe { self.ep.read_raw(p.dst, p.len, Desc::NONE, p.src, p.addr, p.key, READ_USER_BASE | p.user) }?;
        let Some(r) = self.reads.as_mut() else { return Ok(None) };
        match post {
            Post::Posted(_) => {
                r.stats.posted += 1;
                r.stats.bytes += p.len as u64;
                Ok(None)
            }
            Post::Busy(_) => {
                r.stats.queued += 1;
                Ok(Some(p))
            }
        }
    }

    /// Posts the queued reads the provider has room for now, in order.
    pub(crate) fn retry_reads(&mut self) -> Result<()> {
        while let Some(p) = self.reads.as_mut().and_then(|r| r.queue.pop_front()) {
            // SAFETY: `p` was queued by `post_read`, whose caller's promise still holds (its
            // end has not been taken).
            if let Some(p) = unsafe { self.try_post(p) }? {
                if let Some(r) = self.reads.as_mut() {
                    r.queue.push_front(p);
                }
                break;
            }
        }
        Ok(())
    }

    /// A completion of one of the fabric's reads.
    pub(crate) fn read_completed(&mut self, user: u64, error: Option<i32>) {
        if let Some(r) = self.reads.as_mut() {
            if error.is_some() {
                r.stats.failed += 1;
            }
            r.done.push(ReadDone { user: user & !READ_USER_BASE, error });
        }
    }

    /// The reads that ended since the last call (progress the fabric to learn of more).
    pub fn take_reads_done(&mut self) -> Vec<ReadDone> {
        self.reads.as_mut().map(|r| std::mem::take(&mut r.done)).unwrap_or_default()
    }
}
