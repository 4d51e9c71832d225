//! Building a job's fabric through the bootstrap service: which ranks share a host (shared
//! memory), which are reached over TCP, and the three fences that make it safe.
//!
//! 1. Each rank puts its host identity (`fab-host-<rank>`: host name and boot id) and, unless
//!    `TMPI_FABRIC=shm`, the address of its TCP listener (`fab-tcp-<rank>`); fence.
//! 2. The lowest rank of each host group creates the group's segment (rank 0 creates the
//!    job's segment before step 1 when the launcher says all ranks share this host); fence.
//! 3. The others open it; every rank connects to its TCP peers ([`TcpFabric::establish`]);
//!    fence; the creator unlinks the segment's name.
//!
//! With every rank on one host (and `TMPI_FABRIC` `auto` or `shm`) the result is the plain
//! shared-memory fabric, exactly as without TCP.
//!
//! libfabric's OFI fabric (cargo feature `ofi`): `TMPI_FABRIC=ofi` links every pair of ranks
//! through it (`ofi::wire_up`, bound to the address TCP would listen on: loopback on
//! one host). With `auto`, a job across hosts takes it instead of TCP between hosts when every
//! rank finds the same hardware provider (`ofi::auto_provider`: `verbs`, `efa`,
//! `cxi`, `psm2`, `psm3`, `opx`; never a software one); each rank says in step 1 which one it
//! found (`fab-net-<rank>`), so the ranks agree.

use std::net::{SocketAddr, TcpListener};
use std::time::Duration;

use super::{BootstrapEnv, KeyValue};
use crate::error::{Error, Result};
use crate::fabric::{AnyFabric, FabricChoice, HybridFabric};
use crate::host::host_id;
use crate::shm::ShmFabric;
use crate::tcp::{self, TcpFabric};

/// How long the TCP connections of a job may take to come up.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(60);

/// What decides the fabric of one rank.
#[derive(Clone, Copy)]
pub struct WireUp<'a> {
    /// `TMPI_FABRIC`.
    pub choice: FabricChoice,
    /// `TMPI_TCP_IF`, if set.
    pub tcp_if: Option<&'a str>,
    /// Bytes of each shared-memory ring for a segment of `n` ranks.
    pub ring_size: &'a dyn Fn(usize) -> usize,
    /// `TMPI_PEER_TIMEOUT`: how long a TCP peer may stay silent ([`crate::tcp::alive`]);
    /// `None`: no limit.
    pub peer_timeout: Option<Duration>,
    /// `TMPI_OFI_PROVIDER` (`None`: auto), for the OFI fabric.
    pub ofi_provider: Option<&'a str>,
}

/// What `TMPI_FABRIC=ofi` says in a build without the OFI fabric.
pub const NO_OFI: &str = "TMPI_FABRIC=ofi: this build has no OFI fabric: build with the cargo feature `ofi` \
                          (cargo build --release --features ofi; needs libfabric, Debian libfabric-dev)";

fn host_key(r: usize) -> String {
    format!("fab-host-{r}")
}

fn tcp_key(r: usize) -> String {
    format!("fab-tcp-{r}")
}

fn net_key(r: usize) -> String {
    format!("fab-net-{r}")
}

/// `TMPI_FABRIC=ofi`: every pair of ranks over libfabric.
#[cfg(feature = "ofi")]
fn ofi_only(bc: &mut dyn KeyValue, env: &BootstrapEnv, how: &WireUp<'_>) -> Result<AnyFabric> {
    let node = tcp::iface::listen_ip(how.tcp_if, env.local_size == env.size)?.to_string();
    let cfg = crate::ofi::OfiConfig { provider: how.ofi_provider.map(str::to_string), node: Some(node) };
    if how.ofi_provider == Some("shm") {
        crate::ofi::remove_stale_shm_regions(std::process::id());
    }
    let f = crate::ofi::wire_up(bc, env.rank, env.size, &cfg)?;
    bc.fence()?;
    Ok(AnyFabric::Ofi(Box::new(f)))
}

#[cfg(not(feature = "ofi"))]
fn ofi_only(_: &mut dyn KeyValue, _: &BootstrapEnv, _: &WireUp<'_>) -> Result<AnyFabric> {
    Err(Error::Fabric(NO_OFI.into()))
}

/// With `auto` across hosts: the hardware provider this rank would take between hosts ("" for
/// none, or without the feature).
fn auto_net(how: &WireUp<'_>, env: &BootstrapEnv) -> String {
    #[cfg(feature = "ofi")]
    if how.choice == FabricChoice::Auto && env.local_size < env.size {
        let cfg = crate::ofi::OfiConfig { provider: how.ofi_provider.map(str::to_string), node: None };
        return crate::ofi::auto_provider(&cfg).unwrap_or_default();
    }
    let _ = (how, env);
    String::new()
}

/// The network fabric between hosts, if any: libfabric's when every rank named the same
/// hardware provider, else TCP.
enum Net {
    None,
    Tcp(TcpFabric),
    #[cfg(feature = "ofi")]
    Ofi(Box<crate::ofi::OfiFabric>),
}

/// Builds this rank's fabric for a job of at least two ranks.
///
/// # Errors
/// Bootstrap failures, a segment that cannot be created or opened, `TMPI_FABRIC=shm` across
/// hosts, TCP peers that cannot be reached or do not prove the job secret; `TMPI_FABRIC=ofi`
/// in a build without the feature ([`NO_OFI`]), no libfabric provider, a libfabric call
/// failing, ranks on different providers.
pub fn wire_up(bc: &mut dyn KeyValue, env: &BootstrapEnv, how: &WireUp<'_>) -> Result<AnyFabric> {
    if how.choice == FabricChoice::Ofi {
        return ofi_only(bc, env, how);
    }
    let (rank, size) = (env.rank, env.size);
    let me = host_id();
    let early = early_segment(env, how)?;
    let listener: Option<TcpListener> = match how.choice {
        FabricChoice::Shm => None,
        _ => Some(tcp::listen(tcp::iface::listen_ip(how.tcp_if, env.local_size == size)?)?),
    };
    let net = publish(bc, env, how, &me, listener.as_ref())?;
    bc.fence()?;
    let hosts = host_ids(bc, env, &me)?;
    let group = host_group(how, env, &hosts, &me)?;
    let leader = group[0];
    let local = group.iter().position(|&r| r == rank).unwrap_or(0);
    let name = if group.len() == size { env.shm_name.clone() } else { format!("{}-h{leader}", env.shm_name) };
    let mut shm = leader_segment(env, how, &group, &name, early)?;
    bc.fence()?;
    if group.len() > 1 && rank != leader {
        shm = Some(ShmFabric::open(&name, local, group.len())?);
    }
    let net = match listener {
        Some(l) if group.len() < size => connect(bc, env, how, l, &group, &net)?,
        _ => Net::None,
    };
    bc.fence()?;
    if rank == leader {
        if let Some(s) = &shm {
            s.unlink()?;
        }
    }
    assemble(shm, net, env, group)
}

/// Rank 0's segment for the whole job, created first when every rank runs on this host.
fn early_segment(env: &BootstrapEnv, how: &WireUp<'_>) -> Result<Option<ShmFabric>> {
    // When the launcher says every rank runs on this host, rank 0 creates the job's segment
    // before anything else, as a job of one host always did; should the host identities
    // disagree after all (`TMPI_NODE_ID`), it is unlinked and dropped.
    let mut early = None;
    if how.choice != FabricChoice::Tcp && env.local_size == env.size && env.rank == 0 {
        early = Some(ShmFabric::create(&env.shm_name, 0, env.size, (how.ring_size)(env.size))?);
    }
    Ok(early)
}

/// Step 1's puts: host identity, TCP listener address and (`auto` across hosts) the hardware
/// provider, which is returned.
fn publish(bc: &mut dyn KeyValue, env: &BootstrapEnv, how: &WireUp<'_>, me: &str, listener: Option<&TcpListener>) -> Result<String> {
    let rank = env.rank;
    bc.put(&host_key(rank), me.as_bytes())?;
    if let Some(l) = listener {
        let a = l.local_addr().map_err(|source| Error::Io { op: "TCP listener address".into(), source })?;
        bc.put(&tcp_key(rank), a.to_string().as_bytes())?;
    }
    let net = auto_net(how, env);
    if how.choice == FabricChoice::Auto && env.local_size < env.size {
        bc.put(&net_key(rank), net.as_bytes())?;
    }
    Ok(net)
}

/// Every rank's host identity as published in step 1 (this rank's is `me`).
fn host_ids(bc: &mut dyn KeyValue, env: &BootstrapEnv, me: &str) -> Result<Vec<String>> {
    let mut hosts = Vec::with_capacity(env.size);
    for r in 0..env.size {
        hosts.push(if r == env.rank { me.to_string() } else { String::from_utf8_lossy(&bc.get(&host_key(r))?).into_owned() });
    }
    Ok(hosts)
}

/// The ranks that share a segment with this one (itself included, in rank order).
fn host_group(how: &WireUp<'_>, env: &BootstrapEnv, hosts: &[String], me: &str) -> Result<Vec<usize>> {
    let (rank, size) = (env.rank, env.size);
    Ok(match how.choice {
        FabricChoice::Shm => {
            if let Some(r) = hosts.iter().position(|h| *h != me) {
                return Err(Error::Fabric(format!("TMPI_FABRIC=shm, but rank {r} runs on another host than rank {rank}")));
            }
            (0..size).collect()
        }
        FabricChoice::Tcp | FabricChoice::Ofi => vec![rank],
        FabricChoice::Auto => (0..size).filter(|&r| hosts[r] == me).collect(),
    })
}

/// Step 2 for the group's leader: keeps the early segment if the group is the whole job (else
/// unlinks it), or creates the group's segment `name`.
fn leader_segment(
    env: &BootstrapEnv,
    how: &WireUp<'_>,
    group: &[usize],
    name: &str,
    early: Option<ShmFabric>,
) -> Result<Option<ShmFabric>> {
    let mut shm = None;
    if let Some(e) = early {
        if group.len() == env.size {
            shm = Some(e);
        } else {
            e.unlink()?;
        }
    }
    if group.len() > 1 && env.rank == group[0] && shm.is_none() {
        shm = Some(ShmFabric::create(name, 0, group.len(), (how.ring_size)(group.len()))?);
    }
    Ok(shm)
}

/// The fabric made of this rank's segment (if any) and its links to other hosts (if any).
fn assemble(shm: Option<ShmFabric>, net: Net, env: &BootstrapEnv, group: Vec<usize>) -> Result<AnyFabric> {
    let (rank, size) = (env.rank, env.size);
    Ok(match (shm, net) {
        (Some(s), Net::None) => AnyFabric::Shm(s),
        (None, Net::Tcp(t)) => AnyFabric::Tcp(t),
        (Some(s), Net::Tcp(t)) => AnyFabric::Hybrid(Box::new(HybridFabric::new(s, t, size, group)?)),
        #[cfg(feature = "ofi")]
        (None, Net::Ofi(o)) => AnyFabric::Ofi(o),
        #[cfg(feature = "ofi")]
        (Some(s), Net::Ofi(o)) => AnyFabric::HybridOfi(Box::new(HybridFabric::join(s, *o, size, group)?)),
        (None, Net::None) => return Err(Error::Fabric(format!("rank {rank}: no fabric links it to the other {} ranks", size - 1))),
    })
}

/// Links this rank to the ranks of other hosts (those not in `group`): over libfabric when
/// this rank found a hardware provider (`mine`) and every other rank found the same one,
/// else over TCP through `listener`.
fn connect(bc: &mut dyn KeyValue, env: &BootstrapEnv, how: &WireUp<'_>, listener: TcpListener, group: &[usize], mine: &str) -> Result<Net> {
    let (rank, size) = (env.rank, env.size);
    #[cfg(feature = "ofi")]
    if !mine.is_empty()
        && (0..size).filter(|&r| r != rank).try_fold(true, |all, r| Ok::<_, Error>(all && bc.get(&net_key(r))? == mine.as_bytes()))?
    {
        drop(listener);
        let cfg = crate::ofi::OfiConfig { provider: Some(mine.to_string()), node: None };
        return Ok(Net::Ofi(Box::new(crate::ofi::wire_up(bc, rank, size, &cfg)?)));
    }
    let _ = mine;
    let mut peers: Vec<(usize, SocketAddr)> = Vec::with_capacity(size - group.len());
    for r in (0..size).filter(|r| !group.contains(r)) {
        let v = bc.get(&tcp_key(r))?;
        let a = std::str::from_utf8(&v)
            .ok()
            .and_then(|s| s.parse::<SocketAddr>().ok())
            .ok_or_else(|| Error::Bootstrap(format!("rank {r} published a malformed TCP address")))?;
        peers.push((r, a));
    }
    let mut t = TcpFabric::establish(rank, size, listener, &peers, &env.secret, CONNECT_TIMEOUT)?;
    t.set_peer_timeout(how.peer_timeout)?;
    if t.bad_connections() > 0 {
        eprintln!("tmpi: rank {rank}: refused {} TCP connection(s) that did not prove the job secret", t.bad_connections());
    }
    Ok(Net::Tcp(t))
}
