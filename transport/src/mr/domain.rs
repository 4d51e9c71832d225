//! The resource domain: attributes, the key table, registration, raw keys, access checks.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use super::flags::{Access, MrMode, RegFlags};
use super::pages::{settle, PageChanges, Segment};
use super::region::{Bindings, HmemIface, MrAttr, MrDesc, RegionInner};
use super::{lock, MrErrno, RemoteAccessError};

/// `FI_KEY_NOTAVAIL`: the reserved key value; never issued, rejected as a requested key.
pub const KEY_NOTAVAIL: u64 = u64::MAX;

/// Largest `mr_key_size` a domain accepts (bytes).
pub const MAX_MR_KEY_SIZE: usize = 64;

/// Default `mr_iov_limit`.
pub const DEFAULT_MR_IOV_LIMIT: usize = 4;

/// Keys drawn from the OS per `getrandom` call.
const KEY_POOL: usize = 16;

/// Attempts at drawing an unused provider key before giving up with `ENOSPC`.
const KEY_ATTEMPTS: usize = 64;

/// Domain attributes that shape memory registration (`struct fi_domain_attr`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DomainAttr {
    /// The `FI_MR_*` mode bits in force.
    pub mr_mode: MrMode,
    /// Size of a remote key in bytes (1..=[`MAX_MR_KEY_SIZE`]). Above 8, keys exist only in
    /// raw form and `FI_MR_RAW` is required.
    pub mr_key_size: usize,
    /// Largest number of segments one registration may have (at least 1).
    pub mr_iov_limit: usize,
}

impl Default for DomainAttr {
    /// No mode bits (libfabric's default, "scalable" registration), 8-byte keys,
    /// [`DEFAULT_MR_IOV_LIMIT`] segments.
    fn default() -> Self {
        Self { mr_mode: MrMode::empty(), mr_key_size: 8, mr_iov_limit: DEFAULT_MR_IOV_LIMIT }
    }
}

/// The operation a remote peer asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RemoteOp {
    /// RDMA read from the region: needs `REMOTE_READ`.
    Read,
    /// RDMA write (or atomic) into the region: needs `REMOTE_WRITE`; counted on counters bound
    /// with `REMOTE_WRITE`.
    Write,
}

/// The local segments a granted remote access touches, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedRange {
    repr: Repr,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Repr {
    One([Segment; 1]),
    Many(Vec<Segment>),
}

impl ResolvedRange {
    /// The segments, in the order the remote range covers them.
    pub fn segments(&self) -> &[Segment] {
        match &self.repr {
            Repr::One(s) => s,
            Repr::Many(v) => v,
        }
    }

    /// Total bytes.
    pub fn len(&self) -> usize {
        self.segments().iter().map(|s| s.len).sum()
    }

    /// Whether the access covers no byte.
    pub fn is_empty(&self) -> bool {
        self.segments().is_empty()
    }
}

/// A raw key mapped with [`Domain::map_raw`], as [`Domain::mapped_key`] gives it back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MappedKey {
    /// The base address the target reported.
    pub base_addr: u64,
    /// The raw key, to name the region on the wire.
    pub raw_key: RawKey,
}

/// A raw key as a data transfer carries it to the target ([`Domain::check_remote_raw`]): the
/// bytes of a key that the initiator mapped with [`Domain::map_raw`], valid while that mapping
/// lasts.
///
/// `fi_mr(3)`: under `FI_MR_RAW` "applications must use `fi_mr_raw_attr()` locally and
/// `fi_mr_map_raw()` at the peer before targeting a memory region as part of any data
/// transfer request", "even if the raw key is 64-bits or smaller". The model enforces it with
/// this type: only [`Domain::mapped_key`] hands one out (the bytes `raw_attr` wrote cannot
/// become one), and after the mapping's last [`Domain::unmap_key`] (or the close of the
/// initiator's domain) it names no region. The bytes may still be changed (a forged key),
/// which the target's check refuses as any unknown key.
#[derive(Clone)]
pub struct RawKey {
    bytes: Vec<u8>,
    /// Alive while the initiator's mapping is.
    mapping: std::sync::Weak<()>,
}

impl RawKey {
    /// The key bytes.
    pub fn as_slice(&self) -> &[u8] {
        &self.bytes
    }

    /// Whether the mapping that gave this key is still in place.
    pub fn is_mapped(&self) -> bool {
        self.mapping.strong_count() > 0
    }
}

impl std::ops::Deref for RawKey {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.bytes
    }
}

impl std::ops::DerefMut for RawKey {
    fn deref_mut(&mut self) -> &mut [u8] {
        &mut self.bytes
    }
}

impl fmt::Debug for RawKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RawKey").field("bytes", &self.bytes).field("mapped", &self.is_mapped()).finish()
    }
}

/// Keys compare by their bytes.
impl PartialEq for RawKey {
    fn eq(&self, other: &RawKey) -> bool {
        self.bytes == other.bytes
    }
}

impl Eq for RawKey {}

impl PartialEq<[u8]> for RawKey {
    fn eq(&self, other: &[u8]) -> bool {
        self.bytes == other
    }
}

impl<const N: usize> PartialEq<[u8; N]> for RawKey {
    fn eq(&self, other: &[u8; N]) -> bool {
        self.bytes == other
    }
}

struct MappedEntry {
    key: MappedKey,
    /// How many `map_raw` calls returned this key and await `unmap_key`.
    refs: usize,
    /// What the keys handed out for this mapping hold weakly: dropped with the entry.
    _live: Arc<()>,
}

impl MappedEntry {
    fn new(base_addr: u64, raw_key: &[u8], refs: usize) -> MappedEntry {
        let live = Arc::new(());
        let raw_key = RawKey { bytes: raw_key.to_vec(), mapping: Arc::downgrade(&live) };
        MappedEntry { key: MappedKey { base_addr, raw_key }, refs, _live: live }
    }
}

/// Where a key comes from.
#[derive(Clone, Copy)]
pub(crate) enum KeyChoice {
    /// The caller's `requested_key` (ignored under `FI_MR_PROV_KEY`).
    Requested(u64),
    /// A random key from the domain, whatever the mode (the registration cache uses this).
    Random,
}

struct KeyPool {
    buf: [u64; KEY_POOL],
    left: usize,
}

impl KeyPool {
    fn next(&mut self) -> Result<u64, MrErrno> {
        if self.left == 0 {
            let mut bytes = [0u8; KEY_POOL * 8];
            getrandom::getrandom(&mut bytes).map_err(|_| MrErrno::Other)?;
            for (k, c) in self.buf.iter_mut().zip(bytes.chunks_exact(8)) {
                let mut b = [0u8; 8];
                b.copy_from_slice(c);
                *k = u64::from_le_bytes(b);
            }
            self.left = KEY_POOL;
        }
        self.left -= 1;
        Ok(self.buf[self.left])
    }
}

struct DomainState {
    by_key: HashMap<u64, Arc<RegionInner>>,
    by_desc: HashMap<u64, Arc<RegionInner>>,
    next_desc: u64,
    mapped: HashMap<u64, MappedEntry>,
    rng: KeyPool,
    /// Regions dropped while counters or an endpoint were still bound to them: still
    /// registered until [`Domain::reap`] finds their bindings closed.
    orphans: Vec<Arc<RegionInner>>,
}

/// What a new region allocates before the domain lock is taken (see [`Domain::add_region`]),
/// with the total length its segments add up to.
struct RegionParts {
    iov: Box<[Segment]>,
    raw_tail: Box<[u8]>,
    total_len: usize,
}

struct DomainShared {
    attr: DomainAttr,
    changes: Arc<PageChanges>,
    /// The mode bits asked for at `open` (before clearing).
    requested_mode: MrMode,
    state: Mutex<DomainState>,
    /// Number of invalidation batches a cache monitor is applying right now (see
    /// [`Domain::begin_invalidation_batch`]). Shared with every region of the domain.
    in_flight: Arc<AtomicUsize>,
}

/// A resource domain (`fid_domain`) as far as memory registration goes. Cloning gives another
/// handle to the same domain; it lives while any handle or region does.
///
/// Sans-IO: no thread, clock or system call inside, except `getrandom` for provider keys and,
/// under `FI_MR_ALLOCATED`, `mincore` to see that registered pages are mapped.
#[derive(Clone)]
pub struct Domain {
    shared: Arc<DomainShared>,
}

impl fmt::Debug for Domain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Domain").field("attr", &self.shared.attr).field("regions", &self.region_count()).finish()
    }
}

fn key_mask(key_size: usize) -> u64 {
    if key_size >= 8 {
        u64::MAX
    } else {
        (1u64 << (8 * key_size)) - 1
    }
}

impl Domain {
    /// Opens a domain, treating `attr.mr_mode` as `fi_getinfo` treats the mode bits an
    /// application offers: bits the model does not need are cleared (`FI_MR_HMEM`,
    /// `FI_MR_COLLECTIVE`: there is no device memory and no collective offload), the others
    /// are kept and enforced; [`Domain::attr`] gives the mode in force and
    /// [`Domain::cleared_mode`] what was cleared. The deprecated values `FI_MR_BASIC` (set
    /// alone: `VIRT_ADDR | ALLOCATED | PROV_KEY`, never cleared) and `FI_MR_SCALABLE` (set
    /// alone: no bit) are understood.
    ///
    /// # Errors
    /// [`MrErrno::Inval`] for bits libfabric does not define, `FI_MR_BASIC` or
    /// `FI_MR_SCALABLE` combined with other bits, `mr_key_size` 0 or above
    /// [`MAX_MR_KEY_SIZE`], `mr_key_size` above 8 without `FI_MR_RAW`, or `mr_iov_limit` 0.
    pub fn open(attr: DomainAttr) -> Result<Domain, MrErrno> {
        let requested_mode = attr.mr_mode;
        let legacy = MrMode::BASIC | MrMode::SCALABLE;
        let mode = if requested_mode == MrMode::BASIC {
            MrMode::BASIC | MrMode::VIRT_ADDR | MrMode::ALLOCATED | MrMode::PROV_KEY
        } else if requested_mode == MrMode::SCALABLE {
            MrMode::empty()
        } else if requested_mode.intersects(legacy) {
            return Err(MrErrno::Inval);
        } else {
            MrMode::from_bits_retain(requested_mode.bits() & !(MrMode::HMEM | MrMode::COLLECTIVE).bits())
        };
        let attr = DomainAttr { mr_mode: mode, ..attr };
        let bad_size = attr.mr_key_size == 0 || attr.mr_key_size > MAX_MR_KEY_SIZE;
        let needs_raw = attr.mr_key_size > 8 && !attr.mr_mode.contains(MrMode::RAW);
        if attr.mr_mode.unknown_bits() != 0 || bad_size || needs_raw || attr.mr_iov_limit == 0 {
            return Err(MrErrno::Inval);
        }
        let state = DomainState {
            by_key: HashMap::new(),
            by_desc: HashMap::new(),
            next_desc: 1,
            mapped: HashMap::new(),
            rng: KeyPool { buf: [0; KEY_POOL], left: 0 },
            orphans: Vec::new(),
        };
        let shared = DomainShared {
            attr,
            changes: Arc::new(PageChanges::new()),
            requested_mode,
            state: Mutex::new(state),
            in_flight: Arc::new(AtomicUsize::new(0)),
        };
        Ok(Domain { shared: Arc::new(shared) })
    }

    /// The attributes in force: those the domain was opened with, with the mode bits it did
    /// not need cleared (see [`Domain::open`]).
    pub fn attr(&self) -> &DomainAttr {
        &self.shared.attr
    }

    /// The mode bits asked for at [`Domain::open`] that the domain cleared because it does
    /// not need them (as `fi_getinfo` clears them on output).
    pub fn cleared_mode(&self) -> MrMode {
        let req = self.shared.requested_mode;
        if req.intersects(MrMode::BASIC | MrMode::SCALABLE) {
            return MrMode::empty();
        }
        MrMode::from_bits_retain(req.bits() & !self.shared.attr.mr_mode.bits())
    }

    /// Deregisters the regions dropped while still bound (see [`MemoryRegion`](super::MemoryRegion)) whose
    /// counters and endpoint have all been closed since. Returns how many. Every
    /// registration call does this too.
    pub fn reap(&self) -> usize {
        let ready: Vec<Arc<RegionInner>> = {
            let mut st = lock(&self.shared.state);
            if st.orphans.is_empty() {
                return 0;
            }
            let (ready, keep): (Vec<_>, Vec<_>) = std::mem::take(&mut st.orphans).into_iter().partition(|r| !r.busy());
            st.orphans = keep;
            ready
        };
        for r in &ready {
            self.deregister(r);
        }
        ready.len()
    }

    /// What an MMU notifier reports: the pages behind `[start, end)` changed (unmapped,
    /// discarded, moved). Under `FI_MR_MMU_NOTIFY` every region of the domain overlapping the
    /// range refuses access from now on until [`MemoryRegion::refresh`](super::MemoryRegion::refresh); in other modes
    /// nothing changes here (the registration cache revokes its own entries). The cache's
    /// userfaultfd monitor calls this for every event it reads.
    ///
    /// It takes no lock and allocates nothing (the monitor calls it under the cache lock while
    /// a `munmap` may be waiting): the range goes into a small ring of recent changes that
    /// each region's access check compares with the last change it saw (a region that fell
    /// more than the ring behind counts as changed).
    pub fn pages_changed(&self, start: usize, end: usize) {
        if self.shared.attr.mr_mode.contains(MrMode::MMU_NOTIFY) {
            self.shared.changes.record(start, end);
        }
    }

    /// Marks an invalidation batch in progress (the registration cache's
    /// `CacheDomain::begin_invalidation`): from before the monitor reads events (which is when
    /// the kernel lets the `munmap` that caused them return) until it has revoked the
    /// regions. Access checks and validity queries wait while one is in progress, so after a
    /// `munmap` returns no check can see a region of the unmapped memory as usable.
    /// [`Domain::end_invalidation_batch`] ends it.
    pub(crate) fn begin_invalidation_batch(&self) {
        self.shared.in_flight.fetch_add(1, Ordering::SeqCst);
    }

    /// Ends a batch begun by [`Domain::begin_invalidation_batch`].
    pub(crate) fn end_invalidation_batch(&self) {
        self.shared.in_flight.fetch_sub(1, Ordering::SeqCst);
    }

    /// Waits for invalidation batches in progress to finish.
    pub(crate) fn settle(&self) {
        settle(&self.shared.in_flight);
    }

    /// Number of live registrations.
    pub fn region_count(&self) -> usize {
        lock(&self.shared.state).by_key.len()
    }

    /// Whether two handles name the same domain.
    pub fn same(&self, other: &Domain) -> bool {
        Arc::ptr_eq(&self.shared, &other.shared)
    }

    /// Registers `attr` with key `key` (see [`Domain::regattr`]): the region, in the tables.
    pub(crate) fn add_region(&self, attr: &MrAttr<'_>, flags: RegFlags, key: KeyChoice) -> Result<Arc<RegionInner>, MrErrno> {
        Self::check_reg_flags(attr, flags)?;
        self.reap();
        let total = self.check_reg_attr(attr)?;
        let choice = match key {
            KeyChoice::Requested(_) if self.shared.attr.mr_mode.contains(MrMode::PROV_KEY) => KeyChoice::Random,
            other => other,
        };
        // Allocations happen before the domain lock is taken.
        let parts = self.region_parts(attr, total)?;
        let mut st = lock(&self.shared.state);
        let key = Self::choose_key(&mut st, choice, key_mask(self.shared.attr.mr_key_size))?;
        let desc = MrDesc(st.next_desc);
        st.next_desc += 1;
        let inner = Arc::new(self.new_region(attr, flags, key, desc, parts));
        st.by_key.insert(key, Arc::clone(&inner));
        st.by_desc.insert(desc.0, Arc::clone(&inner));
        drop(st);
        Ok(inner)
    }

    /// [`Domain::add_region`]'s checks of the registration flags and of what the model does not
    /// support (device memory, authorization keys), in the order their errors win.
    fn check_reg_flags(attr: &MrAttr<'_>, flags: RegFlags) -> Result<(), MrErrno> {
        if flags.unknown_bits() != 0 {
            return Err(MrErrno::BadFlags);
        }
        let device = RegFlags::HMEM_DEVICE_ONLY | RegFlags::HMEM_HOST_ALLOC | RegFlags::DMABUF;
        if flags.intersects(device) || attr.iface != HmemIface::System || !attr.auth_key.is_empty() {
            return Err(MrErrno::NoSys);
        }
        Ok(())
    }

    /// [`Domain::add_region`]'s checks of the access, offset and segments of `attr`, in the
    /// order their errors win; the total length.
    fn check_reg_attr(&self, attr: &MrAttr<'_>) -> Result<usize, MrErrno> {
        let dattr = &self.shared.attr;
        if attr.access.unknown_bits() != 0 || attr.offset != 0 {
            return Err(MrErrno::Inval);
        }
        if attr.iov.is_empty() || attr.iov.len() > dattr.mr_iov_limit {
            return Err(MrErrno::Inval);
        }
        let mut total: usize = 0;
        for s in attr.iov {
            if s.len == 0 || s.addr.checked_add(s.len).is_none() {
                return Err(MrErrno::Inval);
            }
            total = total.checked_add(s.len).ok_or(MrErrno::Inval)?;
        }
        if dattr.mr_mode.contains(MrMode::ALLOCATED) && !attr.iov.iter().all(|s| super::pages::mapped(s.addr, s.len)) {
            return Err(MrErrno::Fault);
        }
        Ok(total)
    }

    /// What a new region of `attr` allocates, made before the domain lock is taken: its
    /// segments and the random tail of a key longer than 8 bytes.
    fn region_parts(&self, attr: &MrAttr<'_>, total_len: usize) -> Result<RegionParts, MrErrno> {
        let iov: Box<[Segment]> = attr.iov.into();
        let mut raw_tail = vec![0u8; self.shared.attr.mr_key_size.saturating_sub(8)].into_boxed_slice();
        if !raw_tail.is_empty() {
            getrandom::getrandom(&mut raw_tail).map_err(|_| MrErrno::Other)?;
        }
        Ok(RegionParts { iov, raw_tail, total_len })
    }

    /// The key of a new region, under the domain lock (`st`): the requested one if valid and
    /// free, or a random unused one within `mask`.
    fn choose_key(st: &mut DomainState, choice: KeyChoice, mask: u64) -> Result<u64, MrErrno> {
        match choice {
            KeyChoice::Requested(k) => {
                if k & !mask != 0 || k == KEY_NOTAVAIL {
                    return Err(MrErrno::KeyRejected);
                }
                if st.by_key.contains_key(&k) {
                    return Err(MrErrno::NoKey);
                }
                Ok(k)
            }
            KeyChoice::Random => {
                let mut found = None;
                for _ in 0..KEY_ATTEMPTS {
                    let k = st.rng.next()? & mask;
                    if k != KEY_NOTAVAIL && !st.by_key.contains_key(&k) {
                        found = Some(k);
                        break;
                    }
                }
                found.ok_or(MrErrno::NoSpace)
            }
        }
    }

    /// The region [`Domain::add_region`] registers: `attr` and `flags` under `key` and
    /// `desc`, made of `parts`.
    fn new_region(&self, attr: &MrAttr<'_>, flags: RegFlags, key: u64, desc: MrDesc, parts: RegionParts) -> RegionInner {
        let dattr = &self.shared.attr;
        let mode = dattr.mr_mode;
        let created_disabled = mode.contains(MrMode::ENDPOINT) || (mode.contains(MrMode::RMA_EVENT) && flags.contains(RegFlags::RMA_EVENT));
        RegionInner {
            key,
            raw_tail: parts.raw_tail,
            desc,
            iov: parts.iov,
            total_len: parts.total_len,
            access: attr.access,
            flags,
            context: attr.context,
            mode,
            key_size: dattr.mr_key_size,
            created_disabled,
            enabled: AtomicBool::new(!created_disabled),
            revoked: AtomicBool::new(false),
            stale: AtomicBool::new(false),
            changes: mode.contains(MrMode::MMU_NOTIFY).then(|| Arc::clone(&self.shared.changes)),
            seen_changes: AtomicU64::new(self.shared.changes.epoch()),
            refreshes: AtomicU64::new(0),
            bindings: Mutex::new(Bindings::default()),
            in_flight: Arc::clone(&self.shared.in_flight),
        }
    }

    /// [`super::MemoryRegion`]'s drop: deregisters the region, or, while an open counter or
    /// endpoint is bound to it, keeps it registered until [`Domain::reap`] finds them closed.
    pub(crate) fn close_or_orphan(&self, region: &Arc<RegionInner>) {
        if region.busy() {
            lock(&self.shared.state).orphans.push(Arc::clone(region));
        } else {
            self.deregister(region);
        }
    }

    /// Removes a region from the tables (if it is still the one registered under its key) and
    /// revokes it.
    pub(crate) fn deregister(&self, region: &Arc<RegionInner>) {
        region.revoke();
        let mut st = lock(&self.shared.state);
        if st.by_key.get(&region.key).is_some_and(|r| Arc::ptr_eq(r, region)) {
            st.by_key.remove(&region.key);
        }
        st.by_desc.remove(&region.desc.0);
    }

    /// `fi_mr_map_raw`, at the initiator: turns a raw key received from a peer (with the
    /// base address from its `raw_attr`) into a 64-bit key for data transfers. Under
    /// `FI_MR_RAW`, or with keys longer than 8 bytes, the mapped key is a random local
    /// handle and [`Domain::mapped_key`] gives the raw key back for the wire (the target
    /// checks it with [`Domain::check_remote_raw`]): the mapping cannot be skipped, "even if
    /// the raw key is 64-bits or smaller". Otherwise (keys of at most 8 bytes, no
    /// `FI_MR_RAW`) the mapped key is the key itself. Every successful call must be matched
    /// by [`Domain::unmap_key`].
    ///
    /// # Errors
    /// [`MrErrno::BadFlags`] for non-zero `flags`; [`MrErrno::Inval`] when `raw_key` is not
    /// `mr_key_size` bytes; [`MrErrno::NoSpace`] / [`MrErrno::Other`] when no local handle
    /// could be drawn.
    pub fn map_raw(&self, base_addr: u64, raw_key: &[u8], flags: u64) -> Result<u64, MrErrno> {
        if flags != 0 {
            return Err(MrErrno::BadFlags);
        }
        let n = self.shared.attr.mr_key_size;
        if raw_key.len() != n {
            return Err(MrErrno::Inval);
        }
        let mut st = lock(&self.shared.state);
        if n <= 8 && !self.shared.attr.mr_mode.contains(MrMode::RAW) {
            let mut b = [0u8; 8];
            b[..n].copy_from_slice(raw_key);
            let key = u64::from_le_bytes(b);
            let e = st.mapped.entry(key).or_insert_with(|| MappedEntry::new(base_addr, raw_key, 0));
            e.refs += 1;
            return Ok(key);
        }
        for _ in 0..KEY_ATTEMPTS {
            let k = st.rng.next()?;
            if k != KEY_NOTAVAIL && !st.mapped.contains_key(&k) {
                st.mapped.insert(k, MappedEntry::new(base_addr, raw_key, 1));
                return Ok(k);
            }
        }
        Err(MrErrno::NoSpace)
    }

    /// The raw key and base address behind a key returned by [`Domain::map_raw`]: what a data
    /// transfer that uses the mapped key sends to the target (its [`RawKey`] is valid until
    /// the mapping's last [`Domain::unmap_key`]).
    pub fn mapped_key(&self, key: u64) -> Option<MappedKey> {
        lock(&self.shared.state).mapped.get(&key).map(|e| e.key.clone())
    }

    /// `fi_mr_unmap_key`: releases a key returned by [`Domain::map_raw`].
    ///
    /// # Errors
    /// [`MrErrno::Inval`] when the key is not mapped (or was already released as often as it
    /// was mapped).
    pub fn unmap_key(&self, key: u64) -> Result<(), MrErrno> {
        let mut st = lock(&self.shared.state);
        let e = st.mapped.get_mut(&key).ok_or(MrErrno::Inval)?;
        e.refs -= 1;
        if e.refs == 0 {
            st.mapped.remove(&key);
        }
        Ok(())
    }

    /// The target side of a remote access: may the peer `op` `len` bytes at `addr` of the
    /// region named by `key`? Checks, in order, that the key names a live region, that the
    /// region is enabled (and its memory not unmapped), that the range lies inside it
    /// (virtual address under `FI_MR_VIRT_ADDR`, 0-based offset otherwise; all arithmetic
    /// checked), and that the region grants `REMOTE_READ` (reads) or `REMOTE_WRITE`
    /// (writes). Only then does it resolve the range into local segments; a granted write is
    /// counted on the counters bound with `REMOTE_WRITE`.
    ///
    /// Under `FI_MR_RAW`, or in domains whose keys are wider than 8 bytes, keys travel in
    /// raw form (what the initiator's [`Domain::map_raw`] / [`Domain::mapped_key`] give):
    /// use [`Domain::check_remote_raw`]; this call refuses with `UnknownKey`, so a 64-bit key
    /// never reaches a region without the mapping.
    ///
    /// # Errors
    /// `MrErrno::Access(reason)`; nothing was touched.
    pub fn check_remote(&self, key: u64, addr: u64, len: u64, op: RemoteOp) -> Result<ResolvedRange, MrErrno> {
        if self.shared.attr.mr_key_size > 8 || self.shared.attr.mr_mode.contains(MrMode::RAW) {
            return Err(RemoteAccessError::UnknownKey.into());
        }
        let region = self.lookup_key(key)?;
        resolve(&region, addr, len, op)
    }

    /// [`Domain::check_remote`] for a key in raw form (all `mr_key_size` bytes compared), as a
    /// data transfer carries it: a [`RawKey`] from the initiator's mapping, refused once that
    /// mapping is released. The bytes `raw_attr` writes are not a `RawKey`, so no request
    /// reaches a region without the mapping, as `fi_mr(3)` requires under `FI_MR_RAW`:
    ///
    /// ```compile_fail
    /// use tmpi_transport::mr::{Access, Domain, DomainAttr, MrMode, RegFlags, RemoteOp};
    /// let attr = DomainAttr { mr_mode: MrMode::RAW | MrMode::PROV_KEY, mr_key_size: 8, mr_iov_limit: 1 };
    /// let target = Domain::open(attr).unwrap();
    /// let mr = target.reg(0x1000, 64, Access::REMOTE_READ, 0, 0, RegFlags::empty()).unwrap();
    /// let mut raw = [0u8; 8];
    /// mr.raw_attr(&mut raw).unwrap();
    /// // Without map_raw at the initiator: does not compile.
    /// target.check_remote_raw(&raw, 0, 8, RemoteOp::Read).unwrap();
    /// ```
    ///
    /// ```
    /// use tmpi_transport::mr::{Access, Domain, DomainAttr, MrMode, RegFlags, RemoteOp};
    /// let attr = DomainAttr { mr_mode: MrMode::RAW | MrMode::PROV_KEY, mr_key_size: 8, mr_iov_limit: 1 };
    /// let (target, initiator) = (Domain::open(attr).unwrap(), Domain::open(attr).unwrap());
    /// let mr = target.reg(0x1000, 64, Access::REMOTE_READ, 0, 0, RegFlags::empty()).unwrap();
    /// let mut raw = [0u8; 8];
    /// let at = mr.raw_attr(&mut raw).unwrap();
    /// let key = initiator.map_raw(at.base_addr, &raw, 0).unwrap();
    /// let wire = initiator.mapped_key(key).unwrap().raw_key;
    /// target.check_remote_raw(&wire, 0, 8, RemoteOp::Read).unwrap();
    /// initiator.unmap_key(key).unwrap();
    /// assert!(target.check_remote_raw(&wire, 0, 8, RemoteOp::Read).is_err());
    /// ```
    ///
    /// # Errors
    /// As [`Domain::check_remote`]; `MrErrno::Access(UnknownKey)` for a key whose mapping was
    /// released.
    pub fn check_remote_raw(&self, raw_key: &RawKey, addr: u64, len: u64, op: RemoteOp) -> Result<ResolvedRange, MrErrno> {
        let n = self.shared.attr.mr_key_size;
        if raw_key.len() != n || !raw_key.is_mapped() {
            return Err(RemoteAccessError::UnknownKey.into());
        }
        let head = n.min(8);
        let mut b = [0u8; 8];
        b[..head].copy_from_slice(&raw_key[..head]);
        let region = self.lookup_key(u64::from_le_bytes(b))?;
        // Compare the whole tail before deciding, so the time taken does not say how many
        // bytes matched.
        let diff = region.raw_tail.iter().zip(&raw_key[head..]).fold(0u8, |d, (a, b)| d | (a ^ b));
        if diff != 0 {
            return Err(RemoteAccessError::UnknownKey.into());
        }
        resolve(&region, addr, len, op)
    }

    fn lookup_key(&self, key: u64) -> Result<Arc<RegionInner>, MrErrno> {
        let st = lock(&self.shared.state);
        st.by_key.get(&key).cloned().ok_or(MrErrno::Access(RemoteAccessError::UnknownKey))
    }

    /// The local side under `FI_MR_LOCAL`: may a data transfer use `[addr, addr + len)` with
    /// descriptor `desc` for `access` (`SEND`, `RECV`, `READ`, `WRITE`)? Without `FI_MR_LOCAL`
    /// descriptors are ignored and every buffer is accepted.
    ///
    /// # Errors
    /// [`MrErrno::Inval`] for an unknown descriptor; `MrErrno::Access(Disabled | Denied |
    /// OutOfRange)` when the region is disabled, lacks the access, or does not contain the
    /// buffer within one segment.
    pub fn check_local(&self, desc: MrDesc, addr: usize, len: usize, access: Access) -> Result<(), MrErrno> {
        if !self.shared.attr.mr_mode.contains(MrMode::LOCAL) {
            return Ok(());
        }
        let region = lock(&self.shared.state).by_desc.get(&desc.0).cloned().ok_or(MrErrno::Inval)?;
        if !region.usable() {
            return Err(RemoteAccessError::Disabled.into());
        }
        if !region.access.contains(access) {
            return Err(RemoteAccessError::Denied.into());
        }
        let end = addr.checked_add(len).ok_or(RemoteAccessError::OutOfRange)?;
        if region.iov.iter().any(|s| addr >= s.addr && end <= s.addr + s.len) {
            Ok(())
        } else {
            Err(RemoteAccessError::OutOfRange.into())
        }
    }
}

/// The checks and the resolution of [`Domain::check_remote`], once the key named a region.
fn resolve(r: &RegionInner, addr: u64, len: u64, op: RemoteOp) -> Result<ResolvedRange, MrErrno> {
    use RemoteAccessError as E;
    if !r.usable() {
        return Err(E::Disabled.into());
    }
    let offset = if r.mode.contains(MrMode::VIRT_ADDR) { addr.checked_sub(r.base_addr()).ok_or(E::OutOfRange)? } else { addr };
    let end = offset.checked_add(len).ok_or(E::OutOfRange)?;
    if end > r.total_len as u64 {
        return Err(E::OutOfRange.into());
    }
    let needed = match op {
        RemoteOp::Read => Access::REMOTE_READ,
        RemoteOp::Write => Access::REMOTE_WRITE,
    };
    if !r.access.contains(needed) {
        return Err(E::Denied.into());
    }
    // In range: offset + len <= total_len, which fits in usize.
    let (mut off, mut left) = (offset as usize, len as usize);
    let mut one: Option<Segment> = None;
    let mut many: Vec<Segment> = Vec::new();
    for s in r.iov.iter() {
        if left == 0 {
            break;
        }
        if off >= s.len {
            off -= s.len;
            continue;
        }
        let take = (s.len - off).min(left);
        let seg = Segment { addr: s.addr + off, len: take };
        match one.take() {
            None if many.is_empty() => one = Some(seg),
            prev => {
                many.extend(prev);
                many.push(seg);
            }
        }
        off = 0;
        left -= take;
    }
    if op == RemoteOp::Write {
        r.count_remote_write();
    }
    let repr = match one {
        Some(s) => Repr::One([s]),
        None => Repr::Many(many),
    };
    Ok(ResolvedRange { repr })
}
