//! The registration cache: reuse registrations across transfers, drop them when their memory
//! goes away.
//!
//! libfabric's design (`prov/util/src/util_mr_cache.c`), lessons included:
//!
//! - A range map of entries. [`MrCache::get`] hits when an entry covers `[addr, addr + len)`
//!   with at least the access asked. Otherwise it registers exactly the range asked, with the
//!   access asked plus whatever the overlapping entries granted, and evicts those overlapping
//!   entries (they are not merged: merged ranges grow without bound and may span memory that
//!   is later unmapped piecewise).
//! - Entries are reference-counted while in use (a [`CachedMr`] holds a reference and drops
//!   it on drop, without taking the cache lock) and kept on an LRU ordered by last use (the
//!   last [`MrCache::get`] that returned them). [`CacheConfig::max_count`] and
//!   [`CacheConfig::max_size`] bound *every* entry of the cache, in use or not (the seed: "the
//!   total number of memory regions that may be registered with the cache"). A new entry
//!   that would pass a bound first flushes unused entries, least recently used first; if it
//!   still does not fit (too many entries in use, or larger than `max_size` alone) the
//!   registration is served uncached, as libfabric does, and counted in
//!   [`CacheStats::uncached`].
//! - A memory monitor invalidates entries whose memory is unmapped, so a later `mmap` at the
//!   same address never hits a stale registration ([`Monitor::Userfaultfd`], see below).
//! - Nothing is allocated or freed while the cache lock is held (see `store.rs` for how):
//!   the monitor thread needs that lock while some `munmap` waits for it, and a free under
//!   the lock can itself unmap heap pages.
//!
//! # The userfaultfd monitor
//!
//! One userfaultfd per cache, asking for unmap, remove (`madvise`) and remap events. Each
//! range is registered when its entry is created, in write-protect mode (which never stops a
//! thread: nothing is actually write-protected), or in MISSING mode when the kernel refuses WP
//! for that range (the monitor thread then fills faulting pages with zero pages). A dedicated
//! thread polls the fd; for each batch it takes the cache lock *before* reading the events, so
//! by the time the kernel lets the `munmap` return the entries are already out of the index
//! and their regions revoked ([`super::Domain::check_remote`] refuses them). Unused entries are
//! deregistered by the next cache call in a user thread (the monitor thread never frees
//! anything); entries in use are deregistered when their last user releases them.
//!
//! # The lookup fast path, and what a hit guarantees
//!
//! A hit takes the cache lock once, for a binary search and a reference count increment: no
//! system call, no allocation (the release takes no lock at all). It does not read the
//! userfaultfd: the monitor thread does, and it signals each batch it sees pending (an atomic
//! counter, bumped *before* it takes the lock) while every drain of the fd records the
//! signal count it started from. A lookup that finds the count moved past the last complete
//! drain reads and applies the pending events itself, under the lock, before it looks
//! anything up, as every miss does too.
//!
//! So a hit never returns an entry whose memory was unmapped (or discarded, or moved) by a
//! `munmap` that has returned, in any thread, since the monitor applies an event under the
//! lock before the kernel lets its `munmap` return: in particular `munmap`, `mmap` at the same
//! address, `get` never hits the old mapping's entry, in one thread or in threads ordered by
//! any synchronization. A `munmap` still *in progress* in another thread when `get` runs is a
//! concurrent operation: its event may be queued but not yet seen by the monitor thread (not
//! yet scheduled), and the address range is already free, so another thread may have mapped
//! new memory there and `get` it. The hit then returns the old entry; it is revoked before
//! that `munmap` returns ([`CachedMr::is_valid`] turns false, remote accesses are refused, an
//! error at the initiator, never a read of other memory), and the next `get` of the range
//! misses. (Reading the fd on every lookup, as this cache did before, narrows that window to
//! the few kernel instructions between the unmap and the queueing of its event, which no
//! userfaultfd user can close, libfabric's monitor included, at the price of a system call
//! per hit.) Lock-free queries ([`CachedMr::is_valid`], [`super::Domain::check_remote`],
//! [`MrCache::stats`]) wait while an event batch is being applied, so they too see the
//! invalidation once `munmap` has returned.
//!
//! A registration made while an event for its range was pending is discarded and redone (the
//! cache keeps the last 32 invalidated ranges to tell; further back it redoes it anyway).
//! Ranges are never unregistered from the userfaultfd: two entries may share a page, and
//! unregistering one would blind the monitor to the other. A range the kernel will not let us
//! register (not fully mapped, hugetlbfs, a private file mapping, monitored by another
//! userfaultfd) is served uncached.
//!
//! Without a working monitor the cache does not cache: with [`Monitor::Disabled`], with
//! `max_count` 0, or when the userfaultfd cannot be opened (no permission, old kernel) every
//! `get` registers and every release deregisters. [`MrCache::monitor_status`] says which, and
//! why.
//!
//! One process should use one cache per set of buffers: a page can be registered with one
//! userfaultfd only, so two caches monitoring the same pages serve the second uncached.

mod store;
mod uffd;

#[cfg(test)]
pub(crate) use self::uffd::testmem;

#[cfg(test)]
mod tests;

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard, Weak};
use std::thread::JoinHandle;

use self::store::Store;
use self::uffd::{Event, Uffd, Waker};
use super::domain::{Domain, KeyChoice};
use super::flags::{Access, MrMode, RegFlags};
use super::handle::MemoryRegion;
use super::pages::Segment;
use super::region::{MrAttr, MrDesc, RawAttr};
use super::{lock, MrErrno};

/// A domain the cache registers in: the fi_mr model ([`Domain`]) or a real one (libfabric's,
/// with the `ofi` feature: `crate::ofi::OfiDomain`). The same cache, statistics and
/// userfaultfd monitor serve each.
pub trait CacheDomain: Send + Sync + 'static {
    /// A registration of this domain.
    type Region: CacheRegion;
    /// Registers `[addr, addr + len)` with `access` for the cache (its key is the domain's
    /// choice: random in the model, the provider's otherwise).
    ///
    /// # Errors
    /// The registration's errno.
    fn register_range(&self, addr: usize, len: usize, access: Access) -> Result<Self::Region, MrErrno>;
    /// Whether regions need an endpoint bound before use (`FI_MR_ENDPOINT`), which a shared
    /// cache cannot do: [`MrCache::new`] refuses such domains.
    fn needs_endpoint(&self) -> bool;
    /// An invalidation batch starts: called under the cache lock, so it must neither
    /// allocate, free nor block. Default: nothing.
    fn begin_invalidation(&self) {}
    /// The batch begun by [`CacheDomain::begin_invalidation`] ends (same rules).
    fn end_invalidation(&self) {}
    /// The monitor saw `[start, end)` unmapped or changed (same rules). Default: nothing.
    fn pages_changed(&self, _start: usize, _end: usize) {}
    /// Waits until no invalidation batch is in progress. Default: nothing.
    fn settle(&self) {}
}

/// A registration the cache holds: what it needs to know of it, and its revocation.
pub trait CacheRegion: Send + Sync + 'static {
    /// Stops the region from serving accesses, because its memory went away. Called under
    /// the cache lock: it must neither allocate, free nor block (the deregistration itself
    /// happens when the last handle drops, outside the lock).
    fn revoke(&self);
    /// Whether the region serves accesses (false once revoked).
    fn usable(&self) -> bool;
    /// Start address of the registered range.
    fn start(&self) -> usize;
    /// Registered bytes.
    fn bytes(&self) -> usize;
    /// The access it grants.
    fn granted(&self) -> Access;
    /// Whether peers address it by virtual address (`FI_MR_VIRT_ADDR`) rather than offset.
    fn virt_addr(&self) -> bool;
}

impl CacheDomain for Domain {
    type Region = MemoryRegion;
    fn register_range(&self, addr: usize, len: usize, access: Access) -> Result<MemoryRegion, MrErrno> {
        let iov = [Segment { addr, len }];
        let attr = MrAttr::new(&iov, access, 0, 0);
        self.register(&attr, RegFlags::empty(), KeyChoice::Random)
    }
    fn needs_endpoint(&self) -> bool {
        self.attr().mr_mode.contains(MrMode::ENDPOINT)
    }
    fn begin_invalidation(&self) {
        self.begin_invalidation_batch();
    }
    fn end_invalidation(&self) {
        self.end_invalidation_batch();
    }
    fn pages_changed(&self, start: usize, end: usize) {
        Domain::pages_changed(self, start, end);
    }
    fn settle(&self) {
        Domain::settle(self);
    }
}

impl CacheRegion for MemoryRegion {
    fn revoke(&self) {
        self.inner.revoke();
    }
    fn usable(&self) -> bool {
        self.inner.usable()
    }
    fn start(&self) -> usize {
        self.inner.iov[0].addr
    }
    fn bytes(&self) -> usize {
        self.inner.total_len
    }
    fn granted(&self) -> Access {
        self.inner.access
    }
    fn virt_addr(&self) -> bool {
        self.inner.mode.contains(MrMode::VIRT_ADDR)
    }
}

/// Ends an invalidation batch when dropped.
struct Batch<'a, D: CacheDomain>(&'a D);

impl<'a, D: CacheDomain> Batch<'a, D> {
    fn begin(d: &'a D) -> Self {
        d.begin_invalidation();
        Batch(d)
    }
}

impl<D: CacheDomain> Drop for Batch<'_, D> {
    fn drop(&mut self) {
        self.0.end_invalidation();
    }
}

/// Default [`CacheConfig::max_count`].
pub const DEFAULT_MAX_COUNT: usize = 1024;

/// Entries the store starts with (it doubles when full).
const INITIAL_SLOTS: usize = 64;

/// Invalidated ranges remembered to judge registrations made concurrently with an event.
const RECENT: usize = 32;

/// Attempts at caching a registration that keeps racing with invalidations before serving
/// it uncached.
const MAX_RACES: usize = 4;

/// Which memory monitor invalidates entries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Monitor {
    /// userfaultfd events (the default).
    Userfaultfd,
    /// No monitor: caching is off (nothing would notice unmapped memory).
    Disabled,
}

/// Cache configuration (the runtime reads it from `TMPI_MR_CACHE_*`, or libfabric's
/// `FI_MR_CACHE_*` when those are unset; see [`CacheConfig::parse`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheConfig {
    /// Most entries the cache holds, in use or not (`TMPI_MR_CACHE_MAX_COUNT`, default 1024).
    /// 0 disables caching.
    pub max_count: usize,
    /// Most bytes the cache's entries cover, in use or not (`TMPI_MR_CACHE_MAX_SIZE`, default
    /// unlimited: `usize::MAX`).
    pub max_size: usize,
    /// The monitor (`TMPI_MR_CACHE_MONITOR`).
    pub monitor: Monitor,
}

impl Default for CacheConfig {
    fn default() -> Self {
        Self { max_count: DEFAULT_MAX_COUNT, max_size: usize::MAX, monitor: Monitor::Userfaultfd }
    }
}

/// Environment variable for [`CacheConfig::max_count`].
pub const ENV_MAX_COUNT: &str = "TMPI_MR_CACHE_MAX_COUNT";
/// Environment variable for [`CacheConfig::max_size`].
pub const ENV_MAX_SIZE: &str = "TMPI_MR_CACHE_MAX_SIZE";
/// Environment variable for [`CacheConfig::monitor`].
pub const ENV_MONITOR: &str = "TMPI_MR_CACHE_MONITOR";
/// libfabric's name for [`ENV_MAX_COUNT`], read when that is unset.
pub const FI_ENV_MAX_COUNT: &str = "FI_MR_CACHE_MAX_COUNT";
/// libfabric's name for [`ENV_MAX_SIZE`], read when that is unset.
pub const FI_ENV_MAX_SIZE: &str = "FI_MR_CACHE_MAX_SIZE";
/// libfabric's name for [`ENV_MONITOR`], read when that is unset.
pub const FI_ENV_MONITOR: &str = "FI_MR_CACHE_MONITOR";

/// Largest [`CacheConfig::max_count`] accepted (2^30).
pub const MAX_COUNT_LIMIT: usize = 1 << 30;

/// What accepted values of the count variables look like.
pub const EXPECT_COUNT: &str = "an integer from 0 to 1073741824";
/// What accepted values of the size variables look like.
pub const EXPECT_SIZE: &str = "bytes (e.g. 1048576, 512k, 2g; suffixes k, m, g, t are binary) or unlimited";
/// What accepted values of the monitor variables look like.
pub const EXPECT_MONITOR: &str = "userfaultfd (or uffd, memhooks, kdreg2: all select tmpi's userfaultfd monitor) or disabled";

/// A `TMPI_MR_CACHE_*` / `FI_MR_CACHE_*` value the cache does not accept.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{var}={value:?}: expected {expected}")]
pub struct KnobError {
    /// The variable that was read (the `TMPI_` one, or its `FI_` alias when it was unset).
    pub var: &'static str,
    /// Its value.
    pub value: String,
    /// What it accepts.
    pub expected: &'static str,
}

impl CacheConfig {
    /// Reads the cache settings from the process environment.
    ///
    /// # Errors
    /// [`crate::Error::InvalidArgument`] naming the variable and its value.
    pub fn from_env() -> crate::Result<CacheConfig> {
        Self::from_lookup(|k| std::env::var(k).ok())
    }

    /// [`CacheConfig::from_env`] reading variables through `get`.
    ///
    /// # Errors
    /// As [`CacheConfig::from_env`].
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> crate::Result<CacheConfig> {
        Self::parse(get).map_err(|e| crate::Error::InvalidArgument(e.to_string()))
    }

    /// The one parser of the cache settings (the runtime's configuration calls it too). For
    /// each setting the `TMPI_` variable is read, or its libfabric alias when it is unset
    /// (`FI_MR_CACHE_MAX_COUNT`, `FI_MR_CACHE_MAX_SIZE`, `FI_MR_CACHE_MONITOR`, so a
    /// libfabric user's settings carry over); unset settings keep the defaults. One rule for
    /// both names:
    /// - count: an integer from 0 to [`MAX_COUNT_LIMIT`]; 0 disables caching;
    /// - size: bytes, with an optional binary suffix `k`/`m`/`g`/`t`, or `unlimited` (or
    ///   empty);
    /// - monitor: `userfaultfd` (also `uffd`, and libfabric's `memhooks` and `kdreg2`, which
    ///   ask for a host-memory monitor: tmpi's is userfaultfd) or `disabled` (caching off, as
    ///   in libfabric).
    ///
    /// # Errors
    /// [`KnobError`] for the first value not accepted.
    pub fn parse(get: impl Fn(&str) -> Option<String>) -> Result<CacheConfig, KnobError> {
        let read = |tmpi: &'static str, fi: &'static str| get(tmpi).map(|v| (tmpi, v)).or_else(|| get(fi).map(|v| (fi, v)));
        let bad = |var: &'static str, value: &str, expected: &'static str| KnobError { var, value: value.to_owned(), expected };
        let mut cfg = CacheConfig::default();
        if let Some((var, v)) = read(ENV_MAX_COUNT, FI_ENV_MAX_COUNT) {
            cfg.max_count = v.trim().parse().ok().filter(|&n| n <= MAX_COUNT_LIMIT).ok_or_else(|| bad(var, &v, EXPECT_COUNT))?;
        }
        if let Some((var, v)) = read(ENV_MAX_SIZE, FI_ENV_MAX_SIZE) {
            cfg.max_size = parse_size(&v).ok_or_else(|| bad(var, &v, EXPECT_SIZE))?;
        }
        if let Some((var, v)) = read(ENV_MONITOR, FI_ENV_MONITOR) {
            cfg.monitor = match v.trim() {
                "userfaultfd" | "uffd" | "memhooks" | "kdreg2" => Monitor::Userfaultfd,
                "disabled" => Monitor::Disabled,
                _ => return Err(bad(var, &v, EXPECT_MONITOR)),
            };
        }
        Ok(cfg)
    }
}

pub(crate) fn parse_size(v: &str) -> Option<usize> {
    let v = v.trim().to_ascii_lowercase();
    if v == "unlimited" || v.is_empty() {
        return Some(usize::MAX);
    }
    let (num, shift) = match v.as_bytes().last()? {
        b'k' => (&v[..v.len() - 1], 10),
        b'm' => (&v[..v.len() - 1], 20),
        b'g' => (&v[..v.len() - 1], 30),
        b't' => (&v[..v.len() - 1], 40),
        _ => (&v[..], 0),
    };
    let n: usize = num.parse().ok()?;
    n.checked_mul(1usize.checked_shl(shift)?)
}

/// Cache counters, readable at any time ([`MrCache::stats`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// `get` calls served by an existing entry.
    pub hits: u64,
    /// `get` calls that registered (including every call when caching is off).
    pub misses: u64,
    /// Entries removed to make room: overlapped by a new registration, or flushed to keep the
    /// cache within its bounds.
    pub evictions: u64,
    /// Entries removed because their memory was unmapped, dropped or moved.
    pub invalidations: u64,
    /// Registrations served uncached while caching is on (monitor could not watch the range,
    /// repeated races with invalidations, or no room within the bounds).
    pub uncached: u64,
}

/// What the monitor is doing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MonitorStatus {
    /// The userfaultfd monitor runs; `write_protect` says whether WP registration is
    /// available (otherwise ranges are registered in MISSING mode).
    Userfaultfd {
        /// WP registration available.
        write_protect: bool,
    },
    /// No monitor by configuration ([`Monitor::Disabled`] or `max_count` 0): caching off.
    Disabled,
    /// The userfaultfd monitor was asked for but could not start: caching off. The reason.
    Unavailable(String),
}

#[derive(Default)]
struct Counters {
    hits: AtomicU64,
    misses: AtomicU64,
    evictions: AtomicU64,
    invalidations: AtomicU64,
    uncached: AtomicU64,
}

fn bump(c: &AtomicU64, n: usize) {
    if n > 0 {
        c.fetch_add(n as u64, Ordering::Relaxed);
    }
}

/// Counts a hit. Only ever called under the cache lock, which orders these updates, so a
/// plain load and store do (no atomic read-modify-write on the hit path); readers of the
/// counter need no lock.
fn count_hit(hits: &AtomicU64) {
    hits.store(hits.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
}

struct CacheState<D: CacheDomain> {
    store: Store<D>,
    /// Number of invalidation events handled so far.
    epoch: u64,
    /// [`Shared::signals`] as read before the last drain of the userfaultfd that reached an
    /// empty queue. While `signals` still equals it, the monitor thread has seen no event
    /// that has not been applied, and a lookup need not read the userfaultfd itself.
    drained: u64,
    /// The ranges of the last [`RECENT`] events, at `epoch % RECENT`.
    recent: [(usize, usize); RECENT],
}

impl<D: CacheDomain> CacheState<D> {
    /// Whether an event since `since` touched `[start, end)` (conservatively yes when the
    /// history does not reach back that far).
    fn invalidated_since(&self, since: u64, start: usize, end: usize) -> bool {
        if self.epoch - since > RECENT as u64 {
            return true;
        }
        (since..self.epoch).any(|e| {
            let (s, t) = self.recent[(e % RECENT as u64) as usize];
            s < end && start < t
        })
    }

    fn record(&mut self, start: usize, end: usize) {
        self.recent[(self.epoch % RECENT as u64) as usize] = (start, end);
        self.epoch += 1;
    }
}

struct Shared<D: CacheDomain> {
    domain: D,
    cfg: CacheConfig,
    /// The monitor's userfaultfd; read-locked by `get` (registering ranges) and by the
    /// monitor thread for its whole life, write-locked once to close it when the cache drops.
    uffd: RwLock<Option<Uffd>>,
    state: Mutex<CacheState<D>>,
    /// Event batches the monitor thread has seen pending: incremented when `poll` reports
    /// the userfaultfd readable, before the thread takes the lock to read them. Compared with
    /// [`CacheState::drained`] by the lookup fast path.
    signals: AtomicU64,
    stats: Counters,
}

impl<D: CacheDomain> Shared<D> {
    /// Drops the registrations of dead entries, one at a time, each outside the lock.
    fn drain_dead(&self) {
        loop {
            let mr = {
                let mut st = lock(&self.state);
                if !st.store.has_dead() {
                    return;
                }
                st.store.pop_dead()
            };
            drop(mr);
        }
    }

    /// Makes room for one more entry: allocates a larger store unlocked, then moves into it.
    fn grow(&self, seen_capacity: usize) {
        let mut bigger = Store::with_capacity(seen_capacity.saturating_mul(2));
        let mut st = lock(&self.state);
        if st.store.capacity() == seen_capacity {
            st.store.migrate_into(&mut bigger);
            std::mem::swap(&mut st.store, &mut bigger);
        }
        drop(st);
        drop(bigger);
    }

    /// Reads every pending event and applies it, under the cache lock held by the caller
    /// (`st`). Both the monitor thread and `get` do this: the lock is taken before reading,
    /// so once the kernel lets a `munmap` return (when its event is read) the entries are
    /// already invalidated for anyone who takes the lock next. Never allocates or frees.
    fn apply_events(&self, st: &mut CacheState<D>, uffd: &Uffd) -> std::io::Result<()> {
        let mut events = [Event::Other; 16];
        // Read before the first `read`: a batch the monitor signals after this point may have
        // been queued after our last read, so it keeps `signals` ahead of `drained`.
        let seen = self.signals.load(Ordering::SeqCst);
        let _batch = Batch::begin(&self.domain);
        loop {
            let n = uffd.read_events(&mut events)?;
            if n == 0 {
                st.drained = seen;
                return Ok(());
            }
            for ev in &events[..n] {
                let range = match *ev {
                    Event::Unmap { start, end } | Event::Remove { start, end } => (start, end),
                    Event::Remap { from, len } => (from, from.saturating_add(len)),
                    Event::Pagefault { addr, write_protect } => {
                        uffd.resolve_fault(addr, write_protect);
                        continue;
                    }
                    Event::Other => continue,
                };
                st.record(range.0, range.1);
                let n = st.store.invalidate(range.0, range.1);
                bump(&self.stats.invalidations, n);
                // The monitor is this domain's MMU notifier too: regions registered outside
                // the cache under FI_MR_MMU_NOTIFY refuse access until refreshed (lock- and
                // allocation-free, as everything under this lock must be).
                self.domain.pages_changed(range.0, range.1);
            }
        }
    }
}

fn lock_read<T>(l: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn lock_write<T>(l: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn monitor_loop<D: CacheDomain>(shared: Arc<Shared<D>>, waker: Arc<Waker>) {
    let guard = lock_read(&shared.uffd);
    let Some(uffd) = guard.as_ref() else { return };
    loop {
        match uffd::wait(uffd, &waker) {
            Ok(r) if r.stop => return,
            Ok(r) if r.events => {
                // Tell lookups that events wait, before taking the lock they may hold (see
                // `MrCache::get`), then read and apply them.
                shared.signals.fetch_add(1, Ordering::SeqCst);
                let mut st = lock(&shared.state);
                if shared.apply_events(&mut st, uffd).is_err() {
                    return;
                }
            }
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return,
        }
    }
}

/// The registration cache over domain `D` (the fi_mr model by default). See the [module
/// documentation](self).
pub struct MrCache<D: CacheDomain = Domain> {
    shared: Arc<Shared<D>>,
    caching: bool,
    status: MonitorStatus,
    monitor: Option<(Arc<Waker>, JoinHandle<()>)>,
}

impl<D: CacheDomain> fmt::Debug for MrCache<D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MrCache").field("config", &self.shared.cfg).field("status", &self.status).field("stats", &self.stats()).finish()
    }
}

fn start_monitor() -> Result<(Uffd, Arc<Waker>), String> {
    let uffd = Uffd::open().map_err(|e| format!("userfaultfd: {e}"))?;
    let waker = Waker::new().map_err(|e| format!("eventfd: {e}"))?;
    Ok((uffd, Arc::new(waker)))
}

impl<D: CacheDomain> MrCache<D> {
    /// A cache registering through `domain`. With caching enabled it starts the monitor
    /// thread; if the monitor cannot start, the cache runs with caching off and
    /// [`MrCache::monitor_status`] says why (never an error: registrations still work).
    ///
    /// # Errors
    /// [`MrErrno::Inval`] for a domain in `FI_MR_ENDPOINT` mode: its regions need an
    /// endpoint bound before they can be used, which a shared cache cannot do.
    pub fn new(domain: D, cfg: CacheConfig) -> Result<MrCache<D>, MrErrno> {
        if domain.needs_endpoint() {
            return Err(MrErrno::Inval);
        }
        let wanted = cfg.max_count > 0 && cfg.monitor == Monitor::Userfaultfd;
        let (uffd, waker, status) = if wanted {
            match start_monitor() {
                Ok((u, w)) => {
                    let status = MonitorStatus::Userfaultfd { write_protect: u.has_write_protect() };
                    (Some(u), Some(w), status)
                }
                Err(why) => (None, None, MonitorStatus::Unavailable(why)),
            }
        } else {
            (None, None, MonitorStatus::Disabled)
        };
        let shared = Arc::new(Shared {
            domain,
            cfg,
            uffd: RwLock::new(uffd),
            state: Mutex::new(CacheState {
                store: Store::with_capacity(INITIAL_SLOTS.min(cfg.max_count.saturating_mul(2).max(1))),
                epoch: 0,
                drained: 0,
                recent: [(0, 0); RECENT],
            }),
            signals: AtomicU64::new(0),
            stats: Counters::default(),
        });
        let mut cache = MrCache { shared, caching: false, status, monitor: None };
        if let Some(w) = waker {
            let (s, w2) = (Arc::clone(&cache.shared), Arc::clone(&w));
            match std::thread::Builder::new().name("tmpi-mr-monitor".into()).spawn(move || monitor_loop(s, w2)) {
                Ok(h) => {
                    cache.monitor = Some((w, h));
                    cache.caching = true;
                }
                Err(e) => cache.status = MonitorStatus::Unavailable(format!("monitor thread: {e}")),
            }
        }
        Ok(cache)
    }

    /// Whether registrations are cached (a monitor runs and `max_count` > 0).
    pub fn is_caching(&self) -> bool {
        self.caching
    }

    /// What the monitor is doing.
    pub fn monitor_status(&self) -> &MonitorStatus {
        &self.status
    }

    /// The configuration.
    pub fn config(&self) -> &CacheConfig {
        &self.shared.cfg
    }

    /// The domain registrations are made in.
    pub fn domain(&self) -> &D {
        &self.shared.domain
    }

    /// A snapshot of the counters (an invalidation batch in progress is waited for, so a
    /// `munmap` that returned is counted).
    pub fn stats(&self) -> CacheStats {
        self.shared.domain.settle();
        let c = &self.shared.stats;
        CacheStats {
            hits: c.hits.load(Ordering::Relaxed),
            misses: c.misses.load(Ordering::Relaxed),
            evictions: c.evictions.load(Ordering::Relaxed),
            invalidations: c.invalidations.load(Ordering::Relaxed),
            uncached: c.uncached.load(Ordering::Relaxed),
        }
    }

    /// Number of entries in the cache (in use or not), and of unused entries with their bytes.
    pub fn usage(&self) -> (usize, usize, usize) {
        let st = lock(&self.shared.state);
        let (n, b) = st.store.unused_usage();
        (st.store.cached_count(), n, b)
    }

    /// Deregisters every unused entry now (entries in use stay).
    pub fn flush(&self) {
        {
            let mut st = lock(&self.shared.state);
            let n = st.store.trim(0, 0);
            bump(&self.shared.stats.evictions, n);
        }
        self.shared.drain_dead();
    }

    fn register(&self, addr: usize, len: usize, access: Access) -> Result<D::Region, MrErrno> {
        self.shared.domain.register_range(addr, len, access)
    }

    fn uncached(&self, mr: D::Region) -> CachedMr<D> {
        CachedMr { mr: Holder::Owned(mr), cached: false }
    }

    /// A registration covering `[addr, addr + len)` with at least `access`, from the cache if
    /// an entry covers it, else newly registered (and cached, evicting overlapping entries).
    /// The handle keeps the entry in use until dropped. The region may be larger than asked
    /// and grant more access. Keys of cached registrations are random whatever the domain's
    /// `FI_MR_PROV_KEY` setting.
    ///
    /// # Errors
    /// [`MrErrno::Inval`] for `len` 0, a range that wraps, or unknown access bits; any error
    /// of the registration itself.
    pub fn get(&self, addr: usize, len: usize, access: Access) -> Result<CachedMr<D>, MrErrno> {
        let end = addr.checked_add(len).filter(|_| len > 0).ok_or(MrErrno::Inval)?;
        if access.unknown_bits() != 0 {
            return Err(MrErrno::Inval);
        }
        let sh = &self.shared;
        if !self.caching {
            let mr = self.register(addr, len, access)?;
            bump(&sh.stats.misses, 1);
            return Ok(self.uncached(mr));
        }
        // The fast path: one short critical section, no system call, no allocation. Every
        // event the monitor thread has read is applied already (it applies them under this
        // lock before the kernel lets their munmap return). If it has seen events it has not
        // applied yet (`signals` moved past `drained`), the slow path reads them here first.
        {
            let mut st = lock(&sh.state);
            if sh.signals.load(Ordering::SeqCst) == st.drained {
                if let Some(slot) = st.store.lookup(addr, end, access) {
                    let mr = st.store.acquire(slot);
                    count_hit(&sh.stats.hits);
                    // Entries the monitor thread invalidated while unused are deregistered by
                    // the next cache call (it never frees anything itself).
                    let dead = st.store.has_dead();
                    drop(st);
                    if dead {
                        sh.drain_dead();
                    }
                    return Ok(CachedMr { mr: Holder::Shared(mr), cached: true });
                }
            }
        }
        self.get_slow(addr, len, end, access)
    }

    /// [`MrCache::get`] past the fast path: a miss, or events are waiting to be read.
    #[inline(never)]
    fn get_slow(&self, addr: usize, len: usize, end: usize, access: Access) -> Result<CachedMr<D>, MrErrno> {
        let sh = &self.shared;
        sh.drain_dead();
        let uffd_guard = lock_read(&sh.uffd);
        let uffd = uffd_guard.as_ref();
        // (registration, access it grants, epoch before it was made)
        let mut pending: Option<(Arc<Entry<D>>, Access, u64)> = None;
        let mut counted = false;
        let mut races = 0;
        loop {
            let st = self.lock_applied(uffd);
            if let Some(slot) = st.store.lookup(addr, end, access) {
                return Ok(self.slow_hit(st, slot, counted, pending));
            }
            let Some((mr, want, epoch)) = pending.take() else {
                let want = access | st.store.overlapping_access(addr, end);
                let epoch = st.epoch;
                drop(st);
                match self.register_for_entry(addr, len, want, uffd, &mut counted)? {
                    Registered::Entry(e) => pending = Some((e, want, epoch)),
                    Registered::Uncached(mr) => return Ok(mr),
                }
                continue;
            };
            if st.invalidated_since(epoch, addr, end) {
                // The memory under the new registration changed while it was being made:
                // drop it and register again (or give up caching it after a few races).
                drop(st);
                races += 1;
                if races >= MAX_RACES {
                    bump(&sh.stats.uncached, 1);
                    return Ok(CachedMr { mr: Holder::Shared(mr), cached: false });
                }
                drop(mr);
                continue;
            }
            if st.store.needs_grow() {
                let cap = st.store.capacity();
                drop(st);
                sh.grow(cap);
                pending = Some((mr, want, epoch));
                continue;
            }
            return Ok(self.insert_entry(st, addr, len, want, mr));
        }
    }

    /// Takes the cache lock and, under it, applies the events waiting on `uffd`.
    fn lock_applied(&self, uffd: Option<&Uffd>) -> MutexGuard<'_, CacheState<D>> {
        let sh = &self.shared;
        let mut st = lock(&sh.state);
        // Apply events the monitor thread has not read yet: another thread's munmap of
        // this very range may be waiting for it while its pages are already mapped anew.
        if let Some(u) = uffd {
            // A read error leaves the events to the monitor thread, which stops on it.
            let _ = sh.apply_events(&mut st, u);
        }
        st
    }

    /// [`MrCache::get_slow`]'s hit on `slot`, under the cache lock (`st`, released here):
    /// counted unless the miss already was, and `pending` (a registration of ours that lost
    /// the race to it) dropped.
    fn slow_hit(
        &self,
        mut st: MutexGuard<'_, CacheState<D>>,
        slot: u32,
        counted: bool,
        pending: Option<(Arc<Entry<D>>, Access, u64)>,
    ) -> CachedMr<D> {
        let mr = st.store.acquire(slot);
        if !counted {
            count_hit(&self.shared.stats.hits);
        }
        drop(st);
        // A registration of ours that lost a race is dropped here, unlocked.
        drop(pending);
        self.shared.drain_dead();
        CachedMr { mr: Holder::Shared(mr), cached: true }
    }

    /// [`MrCache::get_slow`]'s miss, unlocked: counts it (once, with `counted`), registers
    /// `[addr, addr + len)` with `want` and has the monitor watch it; an entry to insert, or
    /// the registration served uncached when the range cannot be watched.
    fn register_for_entry(
        &self,
        addr: usize,
        len: usize,
        want: Access,
        uffd: Option<&Uffd>,
        counted: &mut bool,
    ) -> Result<Registered<D>, MrErrno> {
        let sh = &self.shared;
        if !*counted {
            bump(&sh.stats.misses, 1);
            *counted = true;
        }
        let mr = self.register(addr, len, want)?;
        let watched = uffd.is_some_and(|u| u.register(addr, len).is_ok());
        if !watched {
            bump(&sh.stats.uncached, 1);
            return Ok(Registered::Uncached(self.uncached(mr)));
        }
        // Allocated here, unlocked: the entry and its handles share it.
        Ok(Registered::Entry(Arc::new(Entry { mr, dead: AtomicBool::new(false), cache: Arc::downgrade(sh) })))
    }

    /// [`MrCache::get_slow`]'s new entry `mr`, under the cache lock (`st`, released here):
    /// evicts the entries overlapping `[addr, addr + len)` (checked not to overflow by
    /// [`MrCache::get`]) and inserts it, or serves it uncached when
    /// it does not fit within the limits.
    fn insert_entry(&self, mut st: MutexGuard<'_, CacheState<D>>, addr: usize, len: usize, want: Access, mr: Arc<Entry<D>>) -> CachedMr<D> {
        let sh = &self.shared;
        let end = addr + len;
        let n = st.store.evict_overlapping(addr, end);
        bump(&sh.stats.evictions, n);
        let (max_count, max_size) = (sh.cfg.max_count, sh.cfg.max_size);
        if !st.store.fits(len, max_count, max_size) {
            // Past the limits (which count every entry, in use or not): flush unused
            // entries, least recently used first, and if that is not enough, serve this
            // registration uncached (libfabric's behaviour).
            let n = st.store.trim(max_count.saturating_sub(1), max_size.saturating_sub(len));
            bump(&sh.stats.evictions, n);
            if !st.store.fits(len, max_count, max_size) {
                drop(st);
                sh.drain_dead();
                bump(&sh.stats.uncached, 1);
                return CachedMr { mr: Holder::Shared(mr), cached: false };
            }
        }
        st.store.insert(addr, end, want, Arc::clone(&mr));
        drop(st);
        sh.drain_dead();
        CachedMr { mr: Holder::Shared(mr), cached: true }
    }
}

/// What [`MrCache::get_slow`]'s registration of a missed range gave.
enum Registered<D: CacheDomain> {
    /// The entry to insert, once the cache lock is retaken.
    Entry(Arc<Entry<D>>),
    /// The registration served uncached (its range cannot be watched).
    Uncached(CachedMr<D>),
}

impl<D: CacheDomain> Drop for MrCache<D> {
    fn drop(&mut self) {
        if let Some((waker, handle)) = self.monitor.take() {
            waker.wake();
            // The thread only returns; a panic in it has nothing left for us to clean up.
            let _ = handle.join();
        }
        // Close the userfaultfd now that nobody reads it: an unread unmap event would block
        // its munmap until the fd closes.
        drop(lock_write(&self.shared.uffd).take());
        {
            let mut st = lock(&self.shared.state);
            st.store.detach_all();
        }
        self.shared.drain_dead();
    }
}

/// A cache entry's registration, shared by the entry (its slot in the store) and the handles
/// using it; the last reference deregisters.
pub(super) struct Entry<D: CacheDomain> {
    mr: D::Region,
    /// Out of the cache (set under the lock when its slot's reference moves to the dead
    /// stack).
    dead: AtomicBool,
    /// The cache, for the release of a dead entry.
    cache: Weak<Shared<D>>,
}

/// How a [`CachedMr`] holds its registration.
enum Holder<D: CacheDomain> {
    /// Shared with the cache entry (and any other handle of it).
    Shared(Arc<Entry<D>>),
    /// Registered for this use only; deregistered when dropped.
    Owned(D::Region),
}

/// A registration from [`MrCache::get`], in use until dropped.
pub struct CachedMr<D: CacheDomain = Domain> {
    mr: Holder<D>,
    /// It came from (and its entry stays in) the cache.
    cached: bool,
}

impl<D: CacheDomain> fmt::Debug for CachedMr<D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CachedMr")
            .field("addr", &self.addr())
            .field("len", &self.len())
            .field("access", &self.access())
            .field("cached", &self.is_cached())
            .finish()
    }
}

impl CachedMr<Domain> {
    /// The remote key (see [`MemoryRegion::key`]).
    ///
    /// # Errors
    /// [`MrErrno::KeyNotAvail`] under `FI_MR_RAW`.
    pub fn key(&self) -> Result<u64, MrErrno> {
        self.region().inner.key()
    }

    /// The local descriptor.
    pub fn desc(&self) -> MrDesc {
        self.region().inner.desc
    }

    /// The raw key (see [`MemoryRegion::raw_attr`]).
    ///
    /// # Errors
    /// [`MrErrno::TooSmall`] when `raw_key` is shorter than the key.
    pub fn raw_attr(&self, raw_key: &mut [u8]) -> Result<RawAttr, MrErrno> {
        self.region().inner.raw_attr(raw_key)
    }
}

impl<D: CacheDomain> CachedMr<D> {
    /// The domain's registration behind this handle (for the key and descriptor of a real
    /// domain's region).
    pub fn region(&self) -> &D::Region {
        match &self.mr {
            Holder::Shared(entry) => &entry.mr,
            Holder::Owned(mr) => mr,
        }
    }

    /// Start address of the registered range (may be below the address asked).
    pub fn addr(&self) -> usize {
        self.region().start()
    }

    /// Length of the registered range.
    pub fn len(&self) -> usize {
        self.region().bytes()
    }

    /// Always false: registrations are never empty.
    pub fn is_empty(&self) -> bool {
        self.region().bytes() == 0
    }

    /// The access the registration grants (at least what was asked).
    pub fn access(&self) -> Access {
        self.region().granted()
    }

    /// The address a peer names to reach local address `addr` of this registration: `addr`
    /// itself under `FI_MR_VIRT_ADDR`, its offset from the registration start otherwise.
    /// `None` if `addr` is outside the registration.
    pub fn remote_addr(&self, addr: usize) -> Option<u64> {
        let start = self.addr();
        if addr < start || addr - start > self.len() {
            return None;
        }
        if self.region().virt_addr() {
            Some(addr as u64)
        } else {
            Some((addr - start) as u64)
        }
    }

    /// Whether the registration is usable (false once its memory was unmapped).
    pub fn is_valid(&self) -> bool {
        self.region().usable()
    }

    /// Whether it came from (and returns to) the cache, rather than being registered for
    /// this use only.
    pub fn is_cached(&self) -> bool {
        self.cached
    }
}

impl<D: CacheDomain> Drop for CachedMr<D> {
    fn drop(&mut self) {
        // A release takes no lock: dropping the reference is all. An entry the cache has
        // already let go of (invalidated by the monitor thread while in use; other removals
        // are drained by the call that made them) still has a reference on the dead stack;
        // dropping that one first makes this handle's, dropped right after this body, the
        // last, so the registration goes with its last user, as it would uncached.
        if let Holder::Shared(entry) = &self.mr {
            if entry.dead.load(Ordering::Acquire) {
                if let Some(shared) = entry.cache.upgrade() {
                    shared.drain_dead();
                }
            }
        }
    }
}
