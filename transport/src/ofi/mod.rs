//! The OFI fabric: libfabric's providers (cargo feature `ofi`).
//!
//! libfabric (`fi_getinfo(3)`, `fi_tagged(3)`, `fi_rma(3)`, `fi_mr(3)`) is how MPI libraries
//! reach InfiniBand, RoCE, EFA, Slingshot, Omni-Path and psm3; its software providers (`tcp`
//! through `ofi_rxm`, `shm`, `udp` through `ofi_rxd`, `sockets`) run anywhere. This module
//! gives tmpi:
//!
//! - [`core`]: safe wrappers of the objects: provider discovery ([`getinfo`], [`Offer`]),
//!   [`OfiDomain`] (fabric and domain), [`Endpoint`] (an RDM endpoint with its completion
//!   queue and address vector: tagged send and receive with ignore bits and directed
//!   receives, peek and claim, cancel, `fi_read`) and [`OfiMr`] (`fi_mr_reg` honouring the
//!   provider's `mr_mode`). Buffers of outstanding operations are owned by the endpoint and
//!   come back in their [`Completion`]; `-FI_EAGAIN` is [`Post::Busy`], not an error; a failed
//!   call is [`crate::Error::Ofi`] naming the call and libfabric's text.
//! - [`cache`]: [`OfiDomain`] behind tmpi's registration cache (`MrCache<OfiDomain>`).
//! - [`tag`]: the 64-bit tag layout (protocol, context, source, MPI tag).
//! - [`p2p`]: MPI point-to-point over one endpoint behind one trait ([`p2p::TaggedP2p`]),
//!   matched by the provider ([`p2p::ProviderP2p`]) or in software over untagged provider
//!   messages ([`p2p::SoftP2p`]).
//! - [`OfiFabric`]: the packets of `crate::fabric` over one endpoint, with the peer states,
//!   finalize mark and wait of the other fabrics.
//! - [`wire_up`]: endpoints' addresses (`fi_getname`) exchanged through the bootstrap
//!   key-value service and inserted into each rank's address vector (`fi_av_insert`).
//!
//! The binding is a thin C shim (`shim.c`, compiled by `build.rs` with the `cc` crate): most
//! `fi_*` calls are static inline functions of the headers, and the shim gives each a real
//! symbol taking plain integers and opaque pointers, so no libfabric struct layout is
//! mirrored in Rust (`ffi`).
//!
//! Provider choice: [`ENV_PROVIDER`] (`TMPI_OFI_PROVIDER`) names one; by default the first
//! offer of `fi_getinfo` for an RDM endpoint with `FI_TAGGED | FI_RMA` is used.

pub mod cache;
pub mod core;
mod fabric;
mod ffi;
pub mod p2p;
pub mod packet;
pub mod rma;
pub mod signals;
pub mod tag;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_mr;
#[cfg(test)]
mod tests_p2p;
#[cfg(test)]
mod tests_rma;
pub mod wake;

pub use self::cache::OfiCacheMr;
pub use self::core::{
    getinfo, mr_errno, strerror, version, Claimed, Completion, Desc, Endpoint, EpStats, Hints, Offer, OfiDomain, OfiMr, OpId, OpKind, Post,
    OFFERED_MR_MODE,
};
pub use self::packet::OfiFabric;
pub use self::rma::{read_support, ReadDone, ReadRegion, ReadStats};
pub use self::wake::Waker;

use crate::bootstrap::KeyValue;
use crate::error::{Error, Result};

/// `FI_ADDR_UNSPEC`: a receive from any source.
pub const FI_ADDR_UNSPEC: u64 = ffi::FI_ADDR_UNSPEC;

/// Positive error numbers a [`Completion`] may carry.
pub mod errno {
    /// `FI_ECANCELED`: the operation was cancelled.
    pub const CANCELED: i32 = super::ffi::FI_ECANCELED;
    /// `FI_ENOMSG`: a peek found no message.
    pub const NOMSG: i32 = super::ffi::FI_ENOMSG;
    /// `FI_ETRUNC`: a receive was too small for its message.
    pub const TRUNC: i32 = super::ffi::FI_ETRUNC;
    /// `FI_EACCES`: a remote access was refused.
    pub const ACCES: i32 = super::ffi::FI_EACCES;
}

/// `TMPI_OFI_PROVIDER`: the libfabric provider to use.
pub const ENV_PROVIDER: &str = crate::bootstrap::ENV_OFI_PROVIDER;

/// How to open the OFI fabric.
#[derive(Debug, Clone, Default)]
pub struct OfiConfig {
    /// `TMPI_OFI_PROVIDER` (`None`: libfabric's first offer).
    pub provider: Option<String>,
    /// The address endpoints bind to (`FI_SOURCE`): loopback for a job on one host.
    pub node: Option<String>,
}

impl OfiConfig {
    /// Reads `TMPI_OFI_PROVIDER` through `get`; binds to `node`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] naming the variable for a value no provider name has
    /// ([`crate::bootstrap::parse_ofi_provider`]).
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>, node: Option<String>) -> Result<Self> {
        let provider = match get(ENV_PROVIDER) {
            None => None,
            Some(v) => crate::bootstrap::parse_ofi_provider(&v).ok_or_else(|| {
                Error::InvalidArgument(format!("{ENV_PROVIDER}={v:?}: expected a libfabric provider name as fi_info -l prints it, or auto"))
            })?,
        };
        Ok(OfiConfig { provider, node })
    }

    /// The offers for this configuration, first the one to use.
    ///
    /// # Errors
    /// [`Error::Fabric`] when no provider offers what tmpi needs (naming the provider asked).
    pub fn offers(&self) -> Result<Vec<Offer>> {
        let hints = Hints { provider: self.provider.clone(), node: self.node.clone() };
        match getinfo(&hints) {
            Ok(v) if !v.is_empty() => Ok(v),
            Ok(_) | Err(Error::Ofi { code: ffi::FI_ENODATA, .. }) => Err(Error::Fabric(format!(
                "no libfabric provider{} offers an RDM endpoint with FI_TAGGED | FI_RMA{}",
                self.provider.as_ref().map(|p| format!(" named {p:?}")).unwrap_or_default(),
                self.node.as_ref().map(|n| format!(" on {n}")).unwrap_or_default()
            ))),
            Err(e) => Err(e),
        }
    }
}

/// Removes the regions libfabric's `shm` provider left in `/dev/shm` under process id
/// `pid`: it names them `<pid>:<domain>:<endpoint>` and unlinks them when the endpoint
/// closes, so a process killed before that leaves 16 MiB behind, and a later process given
/// the same id (ids wrap at `pid_max`, 32 768 here) fails `fi_endpoint` with `EBUSY` (seen
/// in CI after the fault matrix over `shm`). Called by this process, under its own id,
/// before it opens its first endpoint: any such region is then a dead process's. Failures
/// are ignored (the open that follows reports what matters).
pub fn remove_stale_shm_regions(pid: u32) {
    let Ok(dir) = std::fs::read_dir("/dev/shm") else { return };
    for entry in dir.flatten() {
        let name = entry.file_name();
        if name.to_str().and_then(crate::fi_shm::region_owner) == Some(pid) {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

fn addr_key(r: usize) -> String {
    format!("fab-ofi-{r}")
}

/// Opens this rank's endpoint on the configured provider, publishes its address under
/// `fab-ofi-<rank>` (with the provider's name, which every rank must share, and its process
/// id and host identity, by which a peer on this host that dies is noticed), fences, and
/// inserts every other rank's address into the address vector.
///
/// # Errors
/// No provider; a libfabric call failing; a peer publishing a malformed address or using
/// another provider; bootstrap failures.
pub fn wire_up(kv: &mut dyn KeyValue, rank: usize, size: usize, cfg: &OfiConfig) -> Result<OfiFabric> {
    let offer = cfg.offers()?.into_iter().next().ok_or_else(|| Error::Fabric("no libfabric provider".into()))?;
    let provider = offer.provider.clone();
    let domain = OfiDomain::open(offer)?;
    let mut ep = Endpoint::open(&domain, size)?;
    let host = crate::host::host_id();
    let mut value = format!("{provider}\0{}\0{host}\0", std::process::id()).into_bytes();
    let own = ep.name()?;
    value.extend_from_slice(&own);
    kv.put(&addr_key(rank), &value)?;
    kv.fence()?;
    let mut addrs = vec![FI_ADDR_UNSPEC; size];
    let mut pids = vec![0u32; size];
    for r in (0..size).filter(|&r| r != rank) {
        let v = kv.get(&addr_key(r))?;
        let p = Published::parse(&v).ok_or_else(|| Error::Bootstrap(format!("rank {r} published a malformed OFI address")))?;
        if p.provider != provider {
            return Err(Error::Fabric(format!(
                "rank {r} uses libfabric provider {:?}, rank {rank} uses {provider:?}: set {ENV_PROVIDER} alike on every rank",
                p.provider
            )));
        }
        addrs[r] = ep.insert(p.addr).map_err(|e| Error::Fabric(format!("rank {r}'s OFI address: {e}")))?;
        pids[r] = if p.host == host { p.pid } else { 0 };
    }
    // Its own address too: point-to-point matched by the provider sends a rank's messages to
    // itself through the provider, so that a wildcard receive posted there sees them.
    addrs[rank] = ep.insert(&own).map_err(|e| Error::Fabric(format!("rank {rank}'s own OFI address: {e}")))?;
    let mut f = OfiFabric::new(rank, ep, addrs)?;
    f.set_peer_pids(pids);
    Ok(f)
}

/// Two ranks' fabrics in this process on the configured provider (endpoints of one domain,
/// each with both addresses in its address vector), for measurements that drive both ranks
/// from one thread.
///
/// # Errors
/// No provider; a libfabric call failing.
pub fn pair_in_process(cfg: &OfiConfig) -> Result<(OfiFabric, OfiFabric)> {
    let offer = cfg.offers()?.into_iter().next().ok_or_else(|| Error::Fabric("no libfabric provider".into()))?;
    let domain = OfiDomain::open(offer)?;
    let mut eps = [Endpoint::open(&domain, 2)?, Endpoint::open(&domain, 2)?];
    let names = [eps[0].name()?, eps[1].name()?];
    let mut addrs = [vec![0u64; 2], vec![0u64; 2]];
    for (ep, at) in eps.iter_mut().zip(addrs.iter_mut()) {
        for (r, name) in names.iter().enumerate() {
            at[r] = ep.insert(name)?;
        }
    }
    let [ea, eb] = eps;
    let [aa, ab] = addrs;
    Ok((OfiFabric::new(0, ea, aa)?, OfiFabric::new(1, eb, ab)?))
}

/// What a rank publishes at wire-up: `provider \0 pid \0 host \0 address`.
struct Published<'a> {
    provider: String,
    pid: u32,
    host: String,
    addr: &'a [u8],
}

impl<'a> Published<'a> {
    fn parse(v: &'a [u8]) -> Option<Self> {
        let mut parts = v.splitn(4, |&b| b == 0);
        let provider = String::from_utf8(parts.next()?.to_vec()).ok()?;
        let pid = std::str::from_utf8(parts.next()?).ok()?.parse().ok()?;
        let host = String::from_utf8(parts.next()?.to_vec()).ok()?;
        let addr = parts.next().filter(|a| !a.is_empty())?;
        Some(Published { provider, pid, host, addr })
    }
}

/// Providers that drive network hardware (InfiniBand and RoCE through `verbs`, AWS `efa`,
/// HPE Slingshot's `cxi`, Omni-Path's `psm2` and `opx`, Intel's `psm3`). `TMPI_FABRIC=auto`
/// takes the OFI fabric between hosts only over one of these; the software providers
/// (`tcp`, `udp`, `sockets`, `shm`) would be no faster than tmpi's own TCP and shared memory.
pub const HARDWARE_PROVIDERS: &[&str] = &["verbs", "efa", "cxi", "psm2", "psm3", "opx"];

/// Whether `provider` (as libfabric names it, a layered one as `verbs;ofi_rxm`) drives
/// network hardware: its core provider (the first name) is one of [`HARDWARE_PROVIDERS`].
pub fn is_hardware(provider: &str) -> bool {
    let core = provider.split(';').next().unwrap_or("");
    HARDWARE_PROVIDERS.contains(&core)
}

/// The names of the providers `fi_getinfo` offers tmpi an RDM endpoint with `FI_TAGGED |
/// FI_RMA` on, in libfabric's order, each once (for `tmpirun --info`).
///
/// # Errors
/// [`Error::Ofi`] when `fi_getinfo` fails otherwise than finding nothing.
pub fn providers() -> Result<Vec<String>> {
    let offers = match getinfo(&Hints::default()) {
        Err(Error::Ofi { code: ffi::FI_ENODATA, .. }) => Vec::new(),
        r => r?,
    };
    let mut names: Vec<String> = Vec::new();
    for o in offers {
        if !names.contains(&o.provider) {
            names.push(o.provider.clone());
        }
    }
    Ok(names)
}

/// The provider `TMPI_FABRIC=auto` would use between hosts: with `TMPI_OFI_PROVIDER` set, that
/// provider if it drives hardware; else the first hardware provider libfabric offers. `None`:
/// keep TCP.
pub fn auto_provider(cfg: &OfiConfig) -> Option<String> {
    match &cfg.provider {
        Some(p) => is_hardware(p).then(|| p.clone()),
        None => providers().ok()?.into_iter().find(|p| is_hardware(p)),
    }
}
