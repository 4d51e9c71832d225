//! Safe wrappers of the libfabric objects: provider discovery ([`getinfo`]), the domain
//! ([`OfiDomain`]: fabric and domain), the endpoint ([`Endpoint`]: RDM endpoint, its
//! completion queue and address vector) and memory regions ([`OfiMr`]).
//!
//! Every object closes itself on drop, in the order libfabric needs (an endpoint and the
//! regions keep their domain alive). Operations that move data take their buffer by value
//! (`Vec<u8>`) and hand it back in the operation's [`Completion`]: the provider may read or
//! write a buffer until the operation completes, so the endpoint owns it until then, and a
//! leaked or dropped request can never leave the provider a dangling pointer. Each operation
//! carries a context of 64 bytes (room for `FI_CONTEXT`/`FI_CONTEXT2`) in a slot whose
//! address does not move while the operation is outstanding.
//!
//! `-FI_EAGAIN` is back-pressure, never an error: posting calls answer [`Post::Busy`] with the
//! buffer, and the caller retries after [`Endpoint::progress`].

use std::ffi::{c_void, CStr, CString};
use std::ptr;
use std::sync::Arc;

use super::ffi;
use crate::error::{Error, Result};
use crate::mr::{Access, MrErrno, MrMode, RegFlags, Segment};

/// The text of a libfabric error number (`fi_strerror`).
pub fn strerror(code: i32) -> String {
    // SAFETY: fi_strerror returns a pointer to a static NUL-terminated string for any code.
    let p = unsafe { ffi::tofi_strerror(code) };
    if p.is_null() {
        return format!("fi_errno {code}");
    }
    // SAFETY: non-null, NUL-terminated and static (see above).
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

/// The [`Error::Ofi`] for `call` returning `ret` (a negative `FI_E*`).
#[cold]
pub fn ofi_error(call: &'static str, ret: i64) -> Error {
    let code = i32::try_from(ret.unsigned_abs()).unwrap_or(i32::MAX);
    Error::Ofi { call, code, text: strerror(code) }
}

fn check(call: &'static str, ret: i64) -> Result<()> {
    if ret == 0 {
        Ok(())
    } else {
        Err(ofi_error(call, ret))
    }
}

/// The fi_mr errno of a failed libfabric call (for code shared with the fi_mr model).
pub fn mr_errno(e: &Error) -> MrErrno {
    let Error::Ofi { code, .. } = e else { return MrErrno::Other };
    match *code {
        ffi::FI_EINVAL => MrErrno::Inval,
        ffi::FI_EBUSY => MrErrno::Busy,
        ffi::FI_ENOKEY => MrErrno::NoKey,
        ffi::FI_EKEYREJECTED => MrErrno::KeyRejected,
        ffi::FI_EBADFLAGS => MrErrno::BadFlags,
        ffi::FI_ETOOSMALL => MrErrno::TooSmall { needed: 0 },
        ffi::FI_EOPBADSTATE => MrErrno::OpBadState,
        ffi::FI_ENOSPC => MrErrno::NoSpace,
        ffi::FI_EFAULT => MrErrno::Fault,
        ffi::FI_ENOSYS => MrErrno::NoSys,
        ffi::FI_EACCES => MrErrno::Access(crate::mr::RemoteAccessError::Denied),
        _ => MrErrno::Other,
    }
}

/// The libfabric version this process runs with, as `(major, minor)`.
pub fn version() -> (u32, u32) {
    // SAFETY: no arguments, no state.
    let v = unsafe { ffi::tofi_version() };
    (v >> 16, v & 0xffff)
}

/// What to ask `fi_getinfo` for.
#[derive(Debug, Clone, Default)]
pub struct Hints {
    /// A provider name (`tcp`, `shm`, `tcp;ofi_rxm`...): libfabric matches it against the
    /// provider and its layering. `None`: every provider.
    pub provider: Option<String>,
    /// The source address (`FI_SOURCE`) endpoints bind to: `127.0.0.1` keeps IP providers on
    /// loopback. `None`: the provider's choice.
    pub node: Option<String>,
}

/// The capabilities every endpoint here asks for: tagged messages, RMA reads (both sides).
pub const BASE_CAPS: u64 = ffi::FI_TAGGED | ffi::FI_RMA | ffi::FI_READ | ffi::FI_REMOTE_READ | ffi::FI_SEND | ffi::FI_RECV;

/// The `mr_mode` bits this code can honour, offered in the hints; the provider answers with
/// those it needs.
pub const OFFERED_MR_MODE: MrMode = MrMode::from_bits_retain(
    MrMode::LOCAL.bits()
        | MrMode::RAW.bits()
        | MrMode::VIRT_ADDR.bits()
        | MrMode::ALLOCATED.bits()
        | MrMode::PROV_KEY.bits()
        | MrMode::ENDPOINT.bits(),
);

/// One provider's offer: an owned `fi_info` and what tmpi reads of it.
pub struct Offer {
    info: *mut ffi::FiInfo,
    /// Provider name as libfabric gives it (`tcp;ofi_rxm`, `shm`).
    pub provider: String,
    /// Fabric name (`127.0.0.1/32`, `shm`).
    pub fabric: String,
    /// Domain name (`lo`, `shm`).
    pub domain: String,
    /// `caps` of the offer.
    pub caps: u64,
    /// `mode` bits the provider requires.
    pub mode: u64,
    /// `mr_mode` bits the provider requires (a subset of [`OFFERED_MR_MODE`]).
    pub mr_mode: MrMode,
    /// Bytes of a memory key (`mr_key_size`).
    pub mr_key_size: usize,
    /// Most segments of one registration (`mr_iov_limit`).
    pub mr_iov_limit: usize,
    /// Largest message (`max_msg_size`).
    pub max_msg_size: u64,
    /// Largest `fi_tinject` (`inject_size`).
    pub inject_size: usize,
    /// Tag bits the provider matches (`mem_tag_format`).
    pub mem_tag_format: u64,
    /// `addr_format` (`FI_SOCKADDR_IN` = 2, `FI_ADDR_STR` = 9...).
    pub addr_format: u64,
    /// Transmit queue depth.
    pub tx_size: usize,
    /// Receive queue depth.
    pub rx_size: usize,
}

// SAFETY: an Offer owns its fi_info (a plain heap structure libfabric does not share), and
// only reads it through &self.
unsafe impl Send for Offer {}

impl Drop for Offer {
    fn drop(&mut self) {
        // SAFETY: `info` was duplicated for this Offer alone and is freed once.
        unsafe { ffi::tofi_freeinfo(self.info) };
    }
}

impl std::fmt::Debug for Offer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Offer")
            .field("provider", &self.provider)
            .field("fabric", &self.fabric)
            .field("domain", &self.domain)
            .field("mr_mode", &self.mr_mode)
            .field("mr_key_size", &self.mr_key_size)
            .field("directed_recv", &self.directed_recv())
            .finish()
    }
}

fn cstr(p: *const std::ffi::c_char) -> String {
    if p.is_null() {
        return String::new();
    }
    // SAFETY: non-null strings of an fi_info are NUL-terminated and live as long as it.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

impl Offer {
    /// Copies the entry `info` of a list into an owned offer.
    ///
    /// # Safety
    /// `info` points to a live `fi_info`.
    unsafe fn from_entry(info: *const ffi::FiInfo) -> Result<Offer> {
        // SAFETY: the caller's promise; the copy is ours to free.
        let own = unsafe { ffi::tofi_info_dup(info) };
        if own.is_null() {
            return Err(ofi_error("fi_dupinfo", -i64::from(ffi::FI_ENOMEM)));
        }
        let mut a = std::mem::MaybeUninit::<ffi::Attrs>::uninit();
        // SAFETY: `own` is live; the shim fills every field of `a`.
        let a = unsafe {
            ffi::tofi_info_attrs(own, a.as_mut_ptr());
            a.assume_init()
        };
        Ok(Offer {
            info: own,
            provider: cstr(a.prov_name),
            fabric: cstr(a.fabric_name),
            domain: cstr(a.domain_name),
            caps: a.caps,
            mode: a.mode,
            mr_mode: MrMode::from_bits_retain(a.mr_mode),
            mr_key_size: a.mr_key_size as usize,
            mr_iov_limit: a.mr_iov_limit as usize,
            max_msg_size: a.max_msg_size,
            inject_size: a.inject_size as usize,
            mem_tag_format: a.mem_tag_format,
            addr_format: a.addr_format,
            tx_size: a.tx_size as usize,
            rx_size: a.rx_size as usize,
        })
    }

    /// Whether endpoints are addressed by IP (`FI_SOCKADDR*`): a source node binds them.
    pub fn ip_addressed(&self) -> bool {
        (1..=3).contains(&self.addr_format)
    }

    /// Whether `FI_PEEK` works as `fi_tagged(3)` says. libfabric 1.17's `shm` posts a peek
    /// as a receive of no bytes: it waits for a message, consumes it and completes with
    /// `FI_ETRUNC` (tested in `ofi/tests.rs`); probes must then stay in software.
    pub fn peek_works(&self) -> bool {
        self.provider != "shm"
    }

    /// The size a message must exceed for the provider to keep it safely while no receive
    /// waits for it; 0: any size. libfabric 1.17's `shm` loses messages of at most its
    /// `inject_size` (4 KiB, its inline and inject protocols) that arrive between processes
    /// before a receive is posted for them, once more than a receive queue's worth are
    /// waiting (the receiver gets the first ones, then none of a block, while every send
    /// succeeded); larger messages go by its CMA protocol, whose sender waits for the
    /// receiver, and arrive. Measured in `ofi/tests.rs`
    /// (`shm_loses_small_unexpected_messages_between_processes`); the packet fabric pads
    /// its packets past this size.
    pub fn unexpected_floor(&self) -> usize {
        if self.provider == "shm" {
            self.inject_size + 1
        } else {
            0
        }
    }

    /// Whether the provider checks the key of a remote read. libfabric 1.17's `shm` does not
    /// (it copies with `process_vm_readv` whatever the key; tested in `ofi/tests.rs`), so a
    /// rendezvous over it must not rely on the key to protect memory.
    pub fn checks_remote_keys(&self) -> bool {
        self.provider != "shm"
    }

    /// Whether the provider refuses a remote read of a region registered without
    /// `REMOTE_READ`. Neither software provider of libfabric 1.17 does (`tcp` checks the key
    /// and the range only; tested in `ofi/tests.rs`); hardware providers are taken to (the
    /// NIC checks the key's rights), which this machine cannot test.
    pub fn checks_remote_access(&self) -> bool {
        self.is_hardware()
    }

    /// Whether receives can name their source (`FI_DIRECTED_RECV`).
    pub fn directed_recv(&self) -> bool {
        self.caps & ffi::FI_DIRECTED_RECV != 0
    }

    /// Whether the provider reaches other hosts over real hardware, not a software emulation
    /// (`tcp`, `udp`, `sockets`, `net`, `shm` and the utility layers are software).
    pub fn is_hardware(&self) -> bool {
        const SOFT: &[&str] = &["tcp", "udp", "sockets", "net", "shm", "sm2", "ofi_rxm", "ofi_rxd", "ofi_mrail", "ofi_hook"];
        !self.provider.split(';').any(|p| SOFT.iter().any(|s| p.starts_with(s)))
    }
}

/// `fi_getinfo` for an RDM endpoint with tagged messages and RMA reads, per `hints`: every
/// offer in libfabric's order (the first is its best). Offers with `FI_DIRECTED_RECV` are
/// asked for first; a provider without it is still listed (receives then filter sources by
/// tag bits only).
///
/// # Errors
/// [`Error::Ofi`] naming `fi_getinfo` (`-FI_ENODATA`: no provider offers it).
///
/// `hints.node` binds IP providers only: a provider with addresses of its own (`shm` names
/// its region after the source address it is given, so two processes given one address
/// would collide) is offered as it is without a node.
pub fn getinfo(hints: &Hints) -> Result<Vec<Offer>> {
    let mut offers = getinfo_any(hints)?;
    if hints.node.is_none() || offers.iter().all(Offer::ip_addressed) {
        return Ok(offers);
    }
    let plain = getinfo_any(&Hints { node: None, ..hints.clone() })?;
    for o in offers.iter_mut().filter(|o| !o.ip_addressed()) {
        if let Some(i) = plain.iter().position(|p| p.provider == o.provider && p.domain == o.domain) {
            *o = plain_take(&plain, i)?;
        }
    }
    Ok(offers)
}

/// An owned copy of `plain[i]`.
fn plain_take(plain: &[Offer], i: usize) -> Result<Offer> {
    // SAFETY: `plain[i].info` is a live fi_info owned by that offer.
    unsafe { Offer::from_entry(plain[i].info) }
}

fn getinfo_any(hints: &Hints) -> Result<Vec<Offer>> {
    match getinfo_caps(hints, BASE_CAPS | ffi::FI_DIRECTED_RECV) {
        Err(Error::Ofi { code: ffi::FI_ENODATA, .. }) => getinfo_caps(hints, BASE_CAPS),
        r => r,
    }
}

fn getinfo_caps(hints: &Hints, caps: u64) -> Result<Vec<Offer>> {
    let text = |s: &Option<String>| -> Result<Option<CString>> {
        s.as_deref().map(CString::new).transpose().map_err(|_| Error::InvalidArgument("a NUL byte in an OFI provider or node name".into()))
    };
    let (prov, node) = (text(&hints.provider)?, text(&hints.node)?);
    let mut head: *mut ffi::FiInfo = ptr::null_mut();
    let mode = ffi::FI_CONTEXT | ffi::FI_CONTEXT2;
    // SAFETY: the strings are NUL-terminated and outlive the call; `head` receives a list we
    // free below.
    let ret = unsafe {
        ffi::tofi_getinfo(
            prov.as_ref().map_or(ptr::null(), |c| c.as_ptr()),
            node.as_ref().map_or(ptr::null(), |c| c.as_ptr()),
            caps,
            mode,
            OFFERED_MR_MODE.bits(),
            &mut head,
        )
    };
    check("fi_getinfo", i64::from(ret))?;
    let mut out = Vec::new();
    let mut cur = head;
    let mut res = Ok(());
    while !cur.is_null() {
        // SAFETY: `cur` is an entry of the live list `head`.
        match unsafe { Offer::from_entry(cur) } {
            Ok(o) => out.push(o),
            Err(e) => {
                res = Err(e);
                break;
            }
        }
        // SAFETY: as above.
        cur = unsafe { ffi::tofi_info_next(cur) };
    }
    // SAFETY: the list came from fi_getinfo and is freed once; the offers hold copies.
    unsafe { ffi::tofi_freeinfo(head) };
    res.map(|()| out)
}

/// The fabric and domain objects of one offer, shared by its endpoints and regions.
pub(crate) struct DomainInner {
    fabric: *mut ffi::FidFabric,
    pub(crate) domain: *mut ffi::FidDomain,
    pub(crate) offer: Offer,
}

// SAFETY: the domain is opened with FI_THREAD_DOMAIN or better, and tmpi serialises calls on
// one domain (an engine drives it from one thread at a time); the pointers are only closed
// once, in Drop.
unsafe impl Send for DomainInner {}
// SAFETY: see Send; the shared calls (registration, key mapping) are thread safe in the
// providers' domains (FI_THREAD_SAFE for tcp and shm, checked by `OfiDomain::open`).
unsafe impl Sync for DomainInner {}

impl Drop for DomainInner {
    fn drop(&mut self) {
        // SAFETY: every endpoint and region holds an Arc of this, so none is open any more;
        // each object is closed once, domain before fabric.
        unsafe {
            ffi::tofi_close_domain(self.domain);
            ffi::tofi_close_fabric(self.fabric);
        }
    }
}

/// An open fabric and access domain of one provider offer.
#[derive(Clone)]
pub struct OfiDomain {
    pub(crate) inner: Arc<DomainInner>,
}

impl std::fmt::Debug for OfiDomain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OfiDomain").field("offer", &self.inner.offer).finish()
    }
}

impl OfiDomain {
    /// Opens the fabric and the domain of `offer`.
    ///
    /// # Errors
    /// [`Error::Ofi`] naming `fi_fabric` or `fi_domain`.
    pub fn open(offer: Offer) -> Result<OfiDomain> {
        let mut fabric = ptr::null_mut();
        // SAFETY: `offer.info` is a live fi_info; `fabric` receives an object we close.
        check("fi_fabric", i64::from(unsafe { ffi::tofi_fabric(offer.info, &mut fabric) }))?;
        let mut domain = ptr::null_mut();
        // SAFETY: as above; on failure the fabric is closed here.
        let ret = unsafe { ffi::tofi_domain(fabric, offer.info, &mut domain) };
        if ret != 0 {
            // SAFETY: opened above, closed once.
            unsafe { ffi::tofi_close_fabric(fabric) };
            return Err(ofi_error("fi_domain", i64::from(ret)));
        }
        Ok(OfiDomain { inner: Arc::new(DomainInner { fabric, domain, offer }) })
    }

    /// The offer this domain was opened from.
    pub fn offer(&self) -> &Offer {
        &self.inner.offer
    }

    /// The `mr_mode` bits the provider requires.
    pub fn mr_mode(&self) -> MrMode {
        self.inner.offer.mr_mode
    }

    /// Registers `iov` for `access` (`fi_mr_regattr`, system memory). Under
    /// `FI_MR_PROV_KEY` the provider chooses the key and `requested_key` is ignored.
    ///
    /// Remote writes and receives into the region change memory behind Rust's back, so
    /// `REMOTE_WRITE` and `RECV` need [`OfiDomain::reg_unchecked`]; reads of the region by
    /// peers (`REMOTE_READ`) and local sends from it only read it.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for `REMOTE_WRITE` or `RECV` access; [`Error::Ofi`] naming
    /// `fi_mr_regattr`.
    pub fn reg(&self, iov: &[Segment], access: Access, requested_key: u64, flags: RegFlags) -> Result<OfiMr> {
        if access.intersects(Access::REMOTE_WRITE | Access::RECV) {
            return Err(Error::InvalidArgument("OfiDomain::reg: REMOTE_WRITE and RECV access need reg_unchecked".into()));
        }
        // SAFETY: peers can only read the ranges (checked above): if the memory goes away
        // first, the provider's copy fails (EFAULT) or reads the new contents; nothing of
        // this process is written.
        unsafe { self.reg_unchecked(iov, access, requested_key, flags, 0) }
    }

    /// [`OfiDomain::reg`] for any access, with `context`.
    ///
    /// # Safety
    /// With `REMOTE_WRITE` or `RECV`, the provider may write the ranges while the region is
    /// open: they must stay allocated and no Rust reference may read them across such a write.
    pub unsafe fn reg_unchecked(
        &self,
        iov: &[Segment],
        access: Access,
        requested_key: u64,
        flags: RegFlags,
        context: u64,
    ) -> Result<OfiMr> {
        let v: Vec<ffi::IoVec> = iov.iter().map(|s| ffi::IoVec { base: s.addr as *const c_void, len: s.len }).collect();
        let mut mr = ptr::null_mut();
        // SAFETY: the iov array lives across the call; what the provider may do with the
        // memory afterwards is the caller's promise.
        let ret = unsafe {
            ffi::tofi_mr_regv(self.inner.domain, v.as_ptr(), v.len() as u64, access.bits(), requested_key, flags.bits(), context, &mut mr)
        };
        check("fi_mr_regattr", i64::from(ret))?;
        let raw = self.mr_mode().contains(MrMode::RAW) || self.inner.offer.mr_key_size > 8;
        // SAFETY: `mr` is a live region until closed by OfiMr's Drop.
        let (key, desc) = unsafe { (if raw { ffi::FI_KEY_NOTAVAIL } else { ffi::tofi_mr_key(mr) }, ffi::tofi_mr_desc(mr)) };
        let total = iov.iter().map(|s| s.len).sum();
        Ok(OfiMr {
            dom: Arc::clone(&self.inner),
            mr,
            key,
            desc,
            iov: iov.into(),
            total,
            access,
            context,
            bound: false,
            enabled: !self.mr_mode().contains(MrMode::ENDPOINT),
        })
    }

    /// `fi_mr_map_raw`: the 64-bit key to use at this side for a peer's raw key.
    ///
    /// # Errors
    /// [`Error::Ofi`] naming `fi_mr_map_raw`.
    pub fn map_raw(&self, base_addr: u64, raw_key: &[u8]) -> Result<u64> {
        let mut k = raw_key.to_vec();
        let mut key = 0u64;
        // SAFETY: `k` and `key` live across the call.
        let ret = unsafe { ffi::tofi_mr_map_raw(self.inner.domain, base_addr, k.as_mut_ptr(), k.len() as u64, &mut key) };
        check("fi_mr_map_raw", i64::from(ret)).map(|()| key)
    }

    /// `fi_mr_unmap_key`.
    ///
    /// # Errors
    /// [`Error::Ofi`] naming `fi_mr_unmap_key`.
    pub fn unmap_key(&self, key: u64) -> Result<()> {
        // SAFETY: a plain call on the live domain.
        check("fi_mr_unmap_key", i64::from(unsafe { ffi::tofi_mr_unmap_key(self.inner.domain, key) }))
    }
}

/// A memory region of an [`OfiDomain`] (`fid_mr`); closed on drop.
pub struct OfiMr {
    dom: Arc<DomainInner>,
    mr: *mut ffi::FidMr,
    key: u64,
    desc: *mut c_void,
    iov: Box<[Segment]>,
    total: usize,
    access: Access,
    context: u64,
    bound: bool,
    enabled: bool,
}

// SAFETY: the region is a handle of a thread-safe domain; its fields are read-only after
// registration except through &mut self.
unsafe impl Send for OfiMr {}
// SAFETY: &self methods only read fields.
unsafe impl Sync for OfiMr {}

impl std::fmt::Debug for OfiMr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OfiMr").field("key", &self.key).field("iov", &self.iov).field("access", &self.access).finish()
    }
}

/// A local descriptor (`fi_mr_desc`) to pass with a buffer under `FI_MR_LOCAL`: only
/// [`Desc::NONE`] is safe to make (see [`OfiMr::desc`]); the endpoint refuses it for a
/// buffer when the provider requires `FI_MR_LOCAL`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Desc(pub(crate) *mut c_void);

// SAFETY: an opaque provider token, only passed back to the provider.
unsafe impl Send for Desc {}

impl Desc {
    /// No descriptor (providers without `FI_MR_LOCAL`).
    pub const NONE: Desc = Desc(ptr::null_mut());
}

impl OfiMr {
    /// The remote key (`fi_mr_key`); `None` under `FI_MR_RAW` or with keys wider than 8
    /// bytes, where [`OfiMr::raw_key`] gives it.
    pub fn key(&self) -> Option<u64> {
        (self.key != ffi::FI_KEY_NOTAVAIL).then_some(self.key)
    }

    /// The raw key and base address (`fi_mr_raw_attr`).
    ///
    /// # Errors
    /// [`Error::Ofi`] naming `fi_mr_raw_attr`.
    pub fn raw_key(&self) -> Result<(u64, Vec<u8>)> {
        let mut base = 0u64;
        let mut buf = vec![0u8; self.dom.offer.mr_key_size.max(8)];
        let mut n = buf.len() as u64;
        // SAFETY: `buf` holds `n` bytes and outlives the call.
        let ret = unsafe { ffi::tofi_mr_raw_attr(self.mr, &mut base, buf.as_mut_ptr(), &mut n) };
        check("fi_mr_raw_attr", i64::from(ret))?;
        buf.truncate(n as usize);
        Ok((base, buf))
    }

    /// The local descriptor, to pass with a buffer inside this region under `FI_MR_LOCAL`.
    ///
    /// # Safety
    /// Providers that need descriptors may read the region's state through it while an
    /// operation is outstanding: the region must stay open until every operation given this
    /// descriptor has completed, and the buffer must lie inside the region.
    pub unsafe fn desc(&self) -> Desc {
        Desc(self.desc)
    }

    /// The registered segments.
    pub fn segments(&self) -> &[Segment] {
        &self.iov
    }

    /// Total registered bytes.
    pub fn len(&self) -> usize {
        self.total
    }

    /// Never true: registrations are not empty.
    pub fn is_empty(&self) -> bool {
        self.total == 0
    }

    /// The access the region was registered with.
    pub fn access(&self) -> Access {
        self.access
    }

    /// Whether peers address the region by virtual address (`FI_MR_VIRT_ADDR`).
    pub fn virt_addr(&self) -> bool {
        self.dom.offer.mr_mode.contains(MrMode::VIRT_ADDR)
    }

    /// The context given at registration.
    pub fn context(&self) -> u64 {
        self.context
    }

    /// Whether the region can be used (under `FI_MR_ENDPOINT`: bound and enabled).
    pub fn is_enabled(&self) -> bool {
        self.enabled
    }

    /// The address a peer names for local address `addr`: `addr` under `FI_MR_VIRT_ADDR`,
    /// else its offset in the region. `None` outside the region's first segment.
    pub fn remote_addr(&self, addr: usize) -> Option<u64> {
        let s = self.iov.first()?;
        if addr < s.addr || addr - s.addr > s.len {
            return None;
        }
        Some(if self.dom.offer.mr_mode.contains(MrMode::VIRT_ADDR) { addr as u64 } else { (addr - s.addr) as u64 })
    }

    /// Under `FI_MR_ENDPOINT`: binds the region to `ep` and enables it (`fi_mr_bind`,
    /// `fi_mr_enable`). Elsewhere nothing to do.
    ///
    /// # Errors
    /// [`Error::Ofi`] naming the call; [`Error::InvalidArgument`] for an endpoint of
    /// another domain.
    pub fn bind_enable(&mut self, ep: &Endpoint) -> Result<()> {
        if !self.dom.offer.mr_mode.contains(MrMode::ENDPOINT) || self.enabled {
            return Ok(());
        }
        if !Arc::ptr_eq(&self.dom, &ep.dom) {
            return Err(Error::InvalidArgument("fi_mr_bind: the endpoint belongs to another domain".into()));
        }
        if !self.bound {
            // SAFETY: both objects are live and of one domain.
            check("fi_mr_bind", i64::from(unsafe { ffi::tofi_mr_bind_ep(self.mr, ep.ep) }))?;
            self.bound = true;
        }
        // SAFETY: a live, bound region.
        check("fi_mr_enable", i64::from(unsafe { ffi::tofi_mr_enable(self.mr) }))?;
        self.enabled = true;
        Ok(())
    }

    /// Closes the region now (`fi_close`), reporting its result (drop ignores it).
    ///
    /// # Errors
    /// [`Error::Ofi`] naming `fi_close`.
    pub fn close(mut self) -> Result<()> {
        let mr = std::mem::replace(&mut self.mr, ptr::null_mut());
        // SAFETY: the live region, closed once (Drop sees null).
        check("fi_close", i64::from(unsafe { ffi::tofi_close_mr(mr) }))
    }
}

impl Drop for OfiMr {
    fn drop(&mut self) {
        if !self.mr.is_null() {
            // SAFETY: the live region, closed once; the domain outlives it (self.dom).
            unsafe { ffi::tofi_close_mr(self.mr) };
        }
    }
}

/// What an operation was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpKind {
    /// `fi_tsend`.
    Send,
    /// `fi_trecv`.
    Recv,
    /// `fi_trecvmsg` with `FI_PEEK` (and `FI_CLAIM` when claiming).
    Peek,
    /// `fi_trecvmsg` with `FI_CLAIM`: the receive of a claimed message.
    ClaimRecv,
    /// `fi_read`.
    Read,
}

/// An outstanding operation, named in its [`Completion`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct OpId {
    index: u32,
    generation: u32,
}

/// Result of posting an operation.
#[derive(Debug)]
pub enum Post {
    /// Posted; it completes later with this id.
    Posted(OpId),
    /// `-FI_EAGAIN`: no room now; the buffer comes back. Make progress and retry.
    Busy(Vec<u8>),
}

/// A claimed message (a successful peek with claim), to receive or discard.
#[derive(Debug)]
pub struct Claimed {
    index: u32,
    generation: u32,
    /// Length of the claimed message.
    pub len: usize,
    /// Its tag.
    pub tag: u64,
}

/// How an operation ended.
#[derive(Debug)]
pub struct Completion {
    /// The operation.
    pub id: OpId,
    /// What it was.
    pub kind: OpKind,
    /// The caller's value given when posting.
    pub user: u64,
    /// Bytes moved (received message length; for a peek, the message's length).
    pub len: usize,
    /// The message's tag (receives and peeks).
    pub tag: u64,
    /// The buffer given when posting.
    pub buf: Vec<u8>,
    /// `None` on success; else the positive `FI_E*` (`FI_ECANCELED` for a cancelled
    /// operation, `FI_ENOMSG` for a peek that found nothing, `FI_ETRUNC` for a truncated
    /// receive, whose `overflow` says how many bytes did not fit).
    pub error: Option<i32>,
    /// Bytes of the message that did not fit (`FI_ETRUNC`).
    pub overflow: usize,
    /// The provider's own error number, when `error` is set.
    pub prov_errno: i32,
    /// For a successful peek with claim: the claimed message.
    pub claimed: Option<Claimed>,
}

/// One operation's slot: its context (first, as `FI_CONTEXT2` requires room for eight
/// pointers the provider may use) and what comes back with its completion.
#[repr(C)]
struct Slot {
    ctx: [*mut c_void; 8],
    index: u32,
    generation: u32,
    kind: OpKind,
    user: u64,
    buf: Vec<u8>,
    /// A claiming peek: the slot stays reserved for the claimed message after completion.
    claim: bool,
    busy: bool,
}

/// Endpoint counters.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct EpStats {
    /// Operations posted.
    pub posted: u64,
    /// Completions read (successful or not).
    pub completed: u64,
    /// Completions with an error.
    pub errors: u64,
    /// Posting calls that met `-FI_EAGAIN`.
    pub eagain: u64,
}

/// An RDM endpoint with its completion queue and address vector.
pub struct Endpoint {
    pub(crate) dom: Arc<DomainInner>,
    cq: *mut ffi::FidCq,
    av: *mut ffi::FidAv,
    pub(crate) ep: *mut ffi::FidEp,
    wait_fd: Option<i32>,
    /// Boxed: a slot's address is its operation's context and must not move when the
    /// vector grows.
    #[allow(clippy::vec_box)]
    slots: Vec<Box<Slot>>,
    free: Vec<u32>,
    outstanding: usize,
    stats: EpStats,
}

// SAFETY: the endpoint owns its objects; the slots' buffers are owned Vecs. It is used from
// one thread at a time (&mut self for every operation).
unsafe impl Send for Endpoint {}

impl Drop for Endpoint {
    fn drop(&mut self) {
        // SAFETY: each object is closed once, the endpoint first (it stops using the slots'
        // buffers and contexts), then its queues; the slots are freed after this body.
        unsafe {
            ffi::tofi_close_ep(self.ep);
            ffi::tofi_close_av(self.av);
            ffi::tofi_close_cq(self.cq);
        }
    }
}

/// Most completions read per [`Endpoint::progress`] call.
const CQ_BATCH: usize = 16;

impl Endpoint {
    /// Opens an endpoint of `domain` with a completion queue (waitable through a file
    /// descriptor where the provider allows it) and an address vector of `peers` entries.
    ///
    /// # Errors
    /// [`Error::Ofi`] naming the failing call.
    pub fn open(domain: &OfiDomain, peers: usize) -> Result<Endpoint> {
        let d = &domain.inner;
        let mut cq = ptr::null_mut();
        let depth = (d.offer.tx_size + d.offer.rx_size).max(128) as u64;
        // SAFETY: the live domain; `cq` receives an object closed below or by Drop.
        let mut ret = unsafe { ffi::tofi_cq_open(d.domain, depth, 1, &mut cq) };
        let mut wait_fd = None;
        if ret == 0 {
            let mut fd = -1;
            // SAFETY: the live CQ; `fd` is written on success.
            if unsafe { ffi::tofi_cq_wait_fd(cq, &mut fd) } == 0 && fd >= 0 {
                wait_fd = Some(fd);
            }
        } else {
            // SAFETY: as above, without a wait object.
            ret = unsafe { ffi::tofi_cq_open(d.domain, depth, 0, &mut cq) };
        }
        check("fi_cq_open", i64::from(ret))?;
        let mut av = ptr::null_mut();
        // SAFETY: the live domain.
        let ret = unsafe { ffi::tofi_av_open(d.domain, peers.max(1) as u64, &mut av) };
        if ret != 0 {
            // SAFETY: opened above, closed once.
            unsafe { ffi::tofi_close_cq(cq) };
            return Err(ofi_error("fi_av_open", i64::from(ret)));
        }
        let mut ep = ptr::null_mut();
        // SAFETY: live domain, CQ and AV; the shim closes the endpoint itself on failure.
        let ret = unsafe { ffi::tofi_endpoint(d.domain, d.offer.info, cq, av, &mut ep) };
        if ret != 0 {
            // SAFETY: opened above, closed once.
            unsafe {
                ffi::tofi_close_av(av);
                ffi::tofi_close_cq(cq);
            }
            return Err(ofi_error("fi_endpoint", i64::from(ret)));
        }
        Ok(Endpoint {
            dom: Arc::clone(d),
            cq,
            av,
            ep,
            wait_fd,
            slots: Vec::new(),
            free: Vec::new(),
            outstanding: 0,
            stats: EpStats::default(),
        })
    }

    /// This endpoint's address (`fi_getname`), to publish to peers.
    ///
    /// # Errors
    /// [`Error::Ofi`] naming `fi_getname`.
    pub fn name(&self) -> Result<Vec<u8>> {
        let mut buf = vec![0u8; 256];
        let mut len = buf.len() as u64;
        // SAFETY: `buf` holds `len` bytes.
        let mut ret = unsafe { ffi::tofi_getname(self.ep, buf.as_mut_ptr().cast(), &mut len) };
        if ret == -ffi::FI_ETOOSMALL && len as usize > buf.len() && len <= 1 << 16 {
            buf.resize(len as usize, 0);
            // SAFETY: as above, with the size asked for.
            ret = unsafe { ffi::tofi_getname(self.ep, buf.as_mut_ptr().cast(), &mut len) };
        }
        check("fi_getname", i64::from(ret))?;
        buf.truncate(len as usize);
        Ok(buf)
    }

    /// Inserts a peer's address (from its [`Endpoint::name`]) into the address vector and
    /// returns its `fi_addr_t`.
    ///
    /// # Errors
    /// [`Error::Ofi`] naming `fi_av_insert` (a malformed address too).
    pub fn insert(&mut self, addr: &[u8]) -> Result<u64> {
        // The provider reads an address of its own format and length; pad a short one so a
        // malformed peer address cannot make it read past our buffer.
        let mut a = addr.to_vec();
        a.resize(a.len().max(256), 0);
        let mut fi_addr = 0u64;
        // SAFETY: `a` is at least as long as any address format the provider reads.
        let ret = unsafe { ffi::tofi_av_insert(self.av, a.as_ptr().cast(), &mut fi_addr) };
        check("fi_av_insert", i64::from(ret)).map(|()| fi_addr)
    }

    /// The domain's offer.
    pub fn offer(&self) -> &Offer {
        &self.dom.offer
    }

    /// Counters.
    pub fn stats(&self) -> EpStats {
        self.stats
    }

    /// Operations posted and not yet completed.
    pub fn outstanding(&self) -> usize {
        self.outstanding
    }

    /// The completion queue's wait descriptor, when the provider gave one.
    pub fn wait_fd(&self) -> Option<i32> {
        self.wait_fd
    }

    /// `fi_trywait`: whether it is safe to sleep on [`Endpoint::wait_fd`] now (false: a
    /// completion may be ready; progress first).
    pub fn try_wait(&self) -> bool {
        // SAFETY: the live fabric and CQ.
        self.wait_fd.is_some() && unsafe { ffi::tofi_trywait(self.dom.fabric, self.cq) } == 0
    }

    /// Refuses a buffer without a descriptor where the provider needs one (`FI_MR_LOCAL`),
    /// which it would otherwise read through a null pointer.
    fn check_desc(&self, call: &'static str, desc: Desc, len: usize) -> Result<()> {
        if desc == Desc::NONE && len > 0 && self.dom.offer.mr_mode.contains(MrMode::LOCAL) {
            return Err(Error::InvalidArgument(format!(
                "{call}: the provider requires FI_MR_LOCAL: pass the buffer's registered descriptor"
            )));
        }
        Ok(())
    }

    fn take_slot(&mut self, kind: OpKind, user: u64, buf: Vec<u8>) -> u32 {
        let index = match self.free.pop() {
            Some(i) => i,
            None => {
                let i = self.slots.len() as u32;
                self.slots.push(Box::new(Slot {
                    ctx: [ptr::null_mut(); 8],
                    index: i,
                    generation: 0,
                    kind,
                    user: 0,
                    buf: Vec::new(),
                    claim: false,
                    busy: false,
                }));
                i
            }
        };
        let s = &mut self.slots[index as usize];
        s.ctx = [ptr::null_mut(); 8];
        s.kind = kind;
        s.user = user;
        s.buf = buf;
        s.claim = false;
        s.busy = true;
        s.generation = s.generation.wrapping_add(1);
        index
    }

    fn ctx(&mut self, index: u32) -> *mut c_void {
        let s: &mut Slot = &mut self.slots[index as usize];
        (s as *mut Slot).cast()
    }

    fn release(&mut self, index: u32) -> Vec<u8> {
        let s = &mut self.slots[index as usize];
        s.busy = false;
        self.free.push(index);
        std::mem::take(&mut s.buf)
    }

    /// Finishes a post: `Posted`, `Busy` (the slot is released and the buffer returned), or
    /// an error (slot released).
    fn posted(&mut self, call: &'static str, index: u32, ret: i64) -> Result<Post> {
        if ret == 0 {
            self.outstanding += 1;
            self.stats.posted += 1;
            let generation = self.slots[index as usize].generation;
            return Ok(Post::Posted(OpId { index, generation }));
        }
        let buf = self.release(index);
        if ret == -i64::from(ffi::FI_EAGAIN) {
            self.stats.eagain += 1;
            return Ok(Post::Busy(buf));
        }
        Err(ofi_error(call, ret))
    }

    /// `fi_tsend` of `buf` to `dest` with `tag`.
    ///
    /// # Errors
    /// [`Error::Ofi`] naming `fi_tsend`.
    pub fn tsend(&mut self, buf: Vec<u8>, desc: Desc, dest: u64, tag: u64, user: u64) -> Result<Post> {
        self.check_desc("fi_tsend", desc, buf.len())?;
        let (p, n) = (buf.as_ptr(), buf.len() as u64);
        let i = self.take_slot(OpKind::Send, user, buf);
        let ctx = self.ctx(i);
        // SAFETY: the buffer is owned by the slot until the completion (or the endpoint's
        // close) and its heap storage does not move; the context is the slot, which does
        // not move either.
        let ret = unsafe { ffi::tofi_tsend(self.ep, p.cast(), n, desc.0, dest, tag, ctx) };
        self.posted("fi_tsend", i, ret)
    }

    /// `fi_tinject`: sends `data` (at most the offer's `inject_size` bytes) at once, with no
    /// completion; `Ok(false)` for `-FI_EAGAIN`.
    ///
    /// # Errors
    /// [`Error::Ofi`] naming `fi_tinject`.
    pub fn tinject(&mut self, data: &[u8], dest: u64, tag: u64) -> Result<bool> {
        // SAFETY: the provider copies `data` before returning.
        let ret = unsafe { ffi::tofi_tinject(self.ep, data.as_ptr().cast(), data.len() as u64, dest, tag) };
        match ret {
            0 => Ok(true),
            r if r == -i64::from(ffi::FI_EAGAIN) => {
                self.stats.eagain += 1;
                Ok(false)
            }
            r => Err(ofi_error("fi_tinject", r)),
        }
    }

    /// `fi_trecv` into `buf` (its length is the receive's size) of a message whose tag
    /// equals `tag` in the bits not set in `ignore`, from `src` (an `fi_addr_t`, or
    /// [`super::FI_ADDR_UNSPEC`] for any source; naming a source needs `FI_DIRECTED_RECV`).
    ///
    /// # Errors
    /// [`Error::Ofi`] naming `fi_trecv`.
    pub fn trecv(&mut self, buf: Vec<u8>, desc: Desc, src: u64, tag: u64, ignore: u64, user: u64) -> Result<Post> {
        self.check_desc("fi_trecv", desc, buf.len())?;
        let src = self.source(src);
        let (p, n) = (buf.as_ptr(), buf.len() as u64);
        let i = self.take_slot(OpKind::Recv, user, buf);
        let ctx = self.ctx(i);
        // SAFETY: as in `tsend`; the provider writes at most `n` bytes into the owned buffer.
        let ret = unsafe { ffi::tofi_trecv(self.ep, p.cast_mut().cast(), n, desc.0, src, tag, ignore, ctx) };
        self.posted("fi_trecv", i, ret)
    }

    /// [`Endpoint::trecv`] into memory the caller owns (the engine's receive buffers): the
    /// completion's `buf` is empty.
    ///
    /// # Safety
    /// `buf` must be valid for writes of `len` bytes, by nobody else, until the receive's
    /// completion has been read (after a cancel too) or the endpoint is dropped.
    ///
    /// # Errors
    /// As [`Endpoint::trecv`].
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn trecv_raw(&mut self, buf: *mut u8, len: usize, desc: Desc, src: u64, tag: u64, ignore: u64, user: u64) -> Result<Post> {
        self.check_desc("fi_trecv", desc, len)?;
        let src = self.source(src);
        let i = self.take_slot(OpKind::Recv, user, Vec::new());
        let ctx = self.ctx(i);
        // SAFETY: the caller's promise covers the buffer; the context is the slot.
        let ret = unsafe { ffi::tofi_trecv(self.ep, buf.cast(), len as u64, desc.0, src, tag, ignore, ctx) };
        self.posted("fi_trecv", i, ret)
    }

    /// [`Endpoint::read`] into memory the caller owns: the completion's `buf` is empty.
    ///
    /// # Safety
    /// As [`Endpoint::trecv_raw`], for the read's destination.
    ///
    /// # Errors
    /// As [`Endpoint::read`].
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn read_raw(&mut self, buf: *mut u8, len: usize, desc: Desc, src: u64, addr: u64, key: u64, user: u64) -> Result<Post> {
        self.check_desc("fi_read", desc, len)?;
        let i = self.take_slot(OpKind::Read, user, Vec::new());
        let ctx = self.ctx(i);
        // SAFETY: as in `trecv_raw`.
        let ret = unsafe { ffi::tofi_read(self.ep, buf.cast(), len as u64, desc.0, src, addr, key, ctx) };
        self.posted("fi_read", i, ret)
    }

    /// A source the provider can take: without `FI_DIRECTED_RECV` every receive is from any
    /// source (the tag's source bits then select).
    fn source(&self, src: u64) -> u64 {
        if self.dom.offer.directed_recv() {
            src
        } else {
            ffi::FI_ADDR_UNSPEC
        }
    }

    /// Probes for a message (`fi_trecvmsg` with `FI_PEEK`, and `FI_CLAIM` when `claim`):
    /// completes with its length and tag, or with `FI_ENOMSG`. A claimed message is taken
    /// out of matching; receive it with [`Endpoint::recv_claimed`] or drop it with
    /// [`Endpoint::discard_claimed`].
    ///
    /// # Errors
    /// [`Error::Ofi`] naming `fi_trecvmsg`.
    pub fn peek(&mut self, src: u64, tag: u64, ignore: u64, claim: bool, user: u64) -> Result<Post> {
        let src = self.source(src);
        let i = self.take_slot(OpKind::Peek, user, Vec::new());
        self.slots[i as usize].claim = claim;
        let ctx = self.ctx(i);
        let flags = ffi::FI_PEEK | if claim { ffi::FI_CLAIM } else { 0 };
        // SAFETY: no buffer; the context is the slot, which stays reserved.
        let ret = unsafe { ffi::tofi_trecvmsg(self.ep, ptr::null_mut(), 0, ptr::null_mut(), src, tag, ignore, ctx, flags) };
        self.posted("fi_trecvmsg", i, ret)
    }

    fn claim_slot(&mut self, c: &Claimed, kind: OpKind, user: u64, buf: Vec<u8>) -> Result<u32> {
        let s = self.slots.get_mut(c.index as usize).filter(|s| s.generation == c.generation && s.claim && !s.busy);
        let Some(s) = s else { return Err(Error::InvalidArgument("a claimed message that is not this endpoint's".into())) };
        s.kind = kind;
        s.user = user;
        s.buf = buf;
        s.claim = false;
        s.busy = true;
        Ok(c.index)
    }

    /// Receives a claimed message into `buf` (`fi_trecvmsg` with `FI_CLAIM`).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a claim of another endpoint; [`Error::Ofi`] naming
    /// `fi_trecvmsg`. On `Busy` the claim is still held: retry.
    pub fn recv_claimed(
        &mut self,
        c: Claimed,
        buf: Vec<u8>,
        desc: Desc,
        user: u64,
    ) -> Result<std::result::Result<OpId, (Claimed, Vec<u8>)>> {
        // A refusal drops the claim (the provider keeps the message claimed).
        self.check_desc("fi_trecvmsg", desc, buf.len())?;
        self.claimed_op(c, buf, desc, user, ffi::FI_CLAIM)
    }

    /// Drops a claimed message (`fi_trecvmsg` with `FI_CLAIM | FI_DISCARD`); it completes
    /// as a receive of no bytes.
    ///
    /// # Errors
    /// As [`Endpoint::recv_claimed`].
    pub fn discard_claimed(&mut self, c: Claimed, user: u64) -> Result<std::result::Result<OpId, (Claimed, Vec<u8>)>> {
        self.claimed_op(c, Vec::new(), Desc::NONE, user, ffi::FI_CLAIM | ffi::FI_DISCARD)
    }

    fn claimed_op(
        &mut self,
        c: Claimed,
        buf: Vec<u8>,
        desc: Desc,
        user: u64,
        flags: u64,
    ) -> Result<std::result::Result<OpId, (Claimed, Vec<u8>)>> {
        let (p, n) = (buf.as_ptr(), buf.len() as u64);
        let i = self.claim_slot(&c, OpKind::ClaimRecv, user, buf)?;
        let ctx = self.ctx(i);
        let bp = if n == 0 { ptr::null_mut() } else { p.cast_mut().cast() };
        // SAFETY: as in `trecv`; the context is the claiming peek's slot, as FI_CLAIM needs.
        let ret = unsafe { ffi::tofi_trecvmsg(self.ep, bp, n, desc.0, ffi::FI_ADDR_UNSPEC, c.tag, 0, ctx, flags) };
        if ret == 0 {
            self.outstanding += 1;
            self.stats.posted += 1;
            return Ok(Ok(OpId { index: i, generation: c.generation }));
        }
        if ret == -i64::from(ffi::FI_EAGAIN) {
            let s = &mut self.slots[i as usize];
            s.busy = false;
            s.claim = true;
            self.stats.eagain += 1;
            let buf = std::mem::take(&mut s.buf);
            return Ok(Err((c, buf)));
        }
        // The claim is lost with the error; its slot is free again.
        self.release(i);
        Err(ofi_error("fi_trecvmsg", ret))
    }

    /// `fi_read`: reads `buf.len()` bytes at `addr` of the region with `key` at peer `src`
    /// into `buf`. A refused key completes with an error (`FI_EACCES` or the provider's
    /// choice), never touching `buf` beyond its length.
    ///
    /// # Errors
    /// [`Error::Ofi`] naming `fi_read`.
    pub fn read(&mut self, buf: Vec<u8>, desc: Desc, src: u64, addr: u64, key: u64, user: u64) -> Result<Post> {
        self.check_desc("fi_read", desc, buf.len())?;
        let (p, n) = (buf.as_ptr(), buf.len() as u64);
        let i = self.take_slot(OpKind::Read, user, buf);
        let ctx = self.ctx(i);
        // SAFETY: as in `trecv`: the provider writes at most `n` bytes into the owned buffer.
        let ret = unsafe { ffi::tofi_read(self.ep, p.cast_mut().cast(), n, desc.0, src, addr, key, ctx) };
        self.posted("fi_read", i, ret)
    }

    /// `fi_cancel` of an outstanding operation: it completes with `FI_ECANCELED` (or
    /// normally, if it finished first). Unknown or finished ids are ignored.
    ///
    /// # Errors
    /// [`Error::Ofi`] naming `fi_cancel`.
    pub fn cancel(&mut self, id: OpId) -> Result<()> {
        let live = self.slots.get(id.index as usize).is_some_and(|s| s.busy && s.generation == id.generation);
        if !live {
            return Ok(());
        }
        let ctx = self.ctx(id.index);
        // SAFETY: the context of an operation still outstanding on this endpoint.
        let ret = unsafe { ffi::tofi_cancel(self.ep, ctx) };
        if ret == 0 || ret == -i64::from(ffi::FI_ENOENT) {
            Ok(())
        } else {
            Err(ofi_error("fi_cancel", ret))
        }
    }

    /// Cancels the receives posted with `user` beyond the first `keep` found (their
    /// completions come back cancelled); returns how many were cancelled.
    ///
    /// # Errors
    /// [`Error::Ofi`] naming `fi_cancel`.
    pub fn cancel_recvs(&mut self, user: u64, keep: usize) -> Result<usize> {
        let ids: Vec<OpId> = self
            .slots
            .iter()
            .filter(|s| s.busy && !s.claim && s.kind == OpKind::Recv && s.user == user)
            .skip(keep)
            .map(|s| OpId { index: s.index, generation: s.generation })
            .collect();
        for &id in &ids {
            self.cancel(id)?;
        }
        Ok(ids.len())
    }

    /// Reads completions (`fi_cq_read`, and `fi_cq_readerr` for an error entry) and hands
    /// each to `f`; returns how many.
    ///
    /// # Errors
    /// [`Error::Ofi`] naming `fi_cq_read` when the queue itself fails.
    pub fn progress(&mut self, mut f: impl FnMut(Completion)) -> Result<usize> {
        let mut comps = [ffi::Comp::ZERO; CQ_BATCH];
        let mut total = 0;
        loop {
            // SAFETY: `comps` holds CQ_BATCH entries.
            let n = unsafe { ffi::tofi_cq_read(self.cq, comps.as_mut_ptr(), CQ_BATCH as u64) };
            if n == -i64::from(ffi::FI_EAGAIN) || n == 0 {
                return Ok(total);
            }
            if n < 0 {
                return Err(ofi_error("fi_cq_read", n));
            }
            for c in &comps[..n as usize] {
                if let Some(done) = self.complete(c) {
                    total += 1;
                    f(done);
                }
            }
            if (n as usize) < CQ_BATCH {
                return Ok(total);
            }
        }
    }

    /// Turns one CQ entry into a [`Completion`] and frees (or, for a claim, keeps) its slot.
    fn complete(&mut self, c: &ffi::Comp) -> Option<Completion> {
        // Find the slot by its address: a context we did not post (or a provider's stray
        // entry) is ignored rather than trusted.
        let slot = c.ctx as *const Slot;
        if slot.is_null() {
            return None;
        }
        // SAFETY: every context this endpoint posts is the address of one of its slots, which
        // are never freed while the endpoint lives (the vector only grows, and the boxes do
        // not move); the provider hands back exactly the contexts it was given.
        let index = unsafe { ptr::addr_of!((*slot).index).read() };
        if !self.slots.get(index as usize).is_some_and(|s| ptr::eq(&**s, slot)) {
            return None;
        }
        let s = &self.slots[index as usize];
        if !s.busy {
            return None;
        }
        let (kind, user, claim, generation) = (s.kind, s.user, s.claim, s.generation);
        self.outstanding -= 1;
        self.stats.completed += 1;
        // Positive FI_E* (libfabric 1.17's shm reports some negated).
        let error = (c.err != 0).then_some(c.err.saturating_abs());
        if error.is_some() {
            self.stats.errors += 1;
        }
        let claimed = if kind == OpKind::Peek && claim && error.is_none() {
            // The slot stays reserved for the claimed message.
            self.slots[index as usize].busy = false;
            Some(Claimed { index, generation, len: c.len as usize, tag: c.tag })
        } else {
            None
        };
        let buf = if claimed.is_some() { Vec::new() } else { self.release(index) };
        Some(Completion {
            id: OpId { index, generation },
            kind,
            user,
            len: c.len as usize,
            tag: c.tag,
            buf,
            error,
            overflow: c.olen as usize,
            prov_errno: c.prov_errno,
            claimed,
        })
    }
}
