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

use std::net::{SocketAddr, TcpListener};
use std::time::Duration;

use super::{BootstrapEnv, KeyValue};
use crate::error::{Error, Result};
use crate::fabric::{AnyFabric, FabricChoice, HybridFabric};
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
}

/// `TMPI_NODE_ID`: the launcher's name for the host a rank runs on (optional).
pub const ENV_NODE_ID: &str = "TMPI_NODE_ID";

/// This host's identity: ranks with equal identities share memory. [`ENV_NODE_ID`] when the
/// launcher set it; else the host name and the kernel's boot id (the name alone is not
/// enough: containers and copies of one image share names).
pub fn host_id() -> String {
    if let Some(id) = std::env::var_os(ENV_NODE_ID).filter(|v| !v.is_empty()) {
        return format!("node:{}", id.to_string_lossy());
    }
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
    let mut name = [0u8; 256];
    // SAFETY: the pointer and length describe `name`, which outlives the call.
    let rc = unsafe { libc::gethostname(name.as_mut_ptr().cast(), name.len()) };
    let end = name.iter().position(|&b| b == 0).unwrap_or(name.len());
    let host = if rc == 0 { String::from_utf8_lossy(&name[..end]).into_owned() } else { String::new() };
    format!("{host}/{}", boot.trim())
}

fn host_key(r: usize) -> String {
    format!("fab-host-{r}")
}

fn tcp_key(r: usize) -> String {
    format!("fab-tcp-{r}")
}

/// Builds this rank's fabric for a job of at least two ranks.
///
/// # Errors
/// Bootstrap failures, a segment that cannot be created or opened, `TMPI_FABRIC=shm` across
/// hosts, TCP peers that cannot be reached or do not prove the job secret.
pub fn wire_up(bc: &mut dyn KeyValue, env: &BootstrapEnv, how: &WireUp<'_>) -> Result<AnyFabric> {
    let (rank, size) = (env.rank, env.size);
    let me = host_id();
    // When the launcher says every rank runs on this host, rank 0 creates the job's segment
    // before anything else, as a job of one host always did; should the host identities
    // disagree after all (`TMPI_NODE_ID`), it is unlinked and dropped.
    let mut early = None;
    if how.choice != FabricChoice::Tcp && env.local_size == size && rank == 0 {
        early = Some(ShmFabric::create(&env.shm_name, 0, size, (how.ring_size)(size))?);
    }
    let listener: Option<TcpListener> = match how.choice {
        FabricChoice::Shm => None,
        _ => Some(tcp::listen(tcp::iface::listen_ip(how.tcp_if, env.local_size == size)?)?),
    };
    bc.put(&host_key(rank), me.as_bytes())?;
    if let Some(l) = &listener {
        let a = l.local_addr().map_err(|source| Error::Io { op: "TCP listener address".into(), source })?;
        bc.put(&tcp_key(rank), a.to_string().as_bytes())?;
    }
    bc.fence()?;
    let mut hosts = Vec::with_capacity(size);
    for r in 0..size {
        hosts.push(if r == rank { me.clone() } else { String::from_utf8_lossy(&bc.get(&host_key(r))?).into_owned() });
    }
    let group: Vec<usize> = match how.choice {
        FabricChoice::Shm => {
            if let Some(r) = hosts.iter().position(|h| *h != me) {
                return Err(Error::Fabric(format!("TMPI_FABRIC=shm, but rank {r} runs on another host than rank {rank}")));
            }
            (0..size).collect()
        }
        FabricChoice::Tcp => vec![rank],
        FabricChoice::Auto => (0..size).filter(|&r| hosts[r] == me).collect(),
    };
    let leader = group[0];
    let local = group.iter().position(|&r| r == rank).unwrap_or(0);
    let name = if group.len() == size { env.shm_name.clone() } else { format!("{}-h{leader}", env.shm_name) };
    let mut shm = None;
    if let Some(e) = early {
        if group.len() == size {
            shm = Some(e);
        } else {
            e.unlink()?;
        }
    }
    if group.len() > 1 && rank == leader && shm.is_none() {
        shm = Some(ShmFabric::create(&name, 0, group.len(), (how.ring_size)(group.len()))?);
    }
    bc.fence()?;
    if group.len() > 1 && rank != leader {
        shm = Some(ShmFabric::open(&name, local, group.len())?);
    }
    let mut tcp = None;
    if let Some(l) = listener {
        if group.len() < size {
            let mut peers: Vec<(usize, SocketAddr)> = Vec::with_capacity(size - group.len());
            for r in (0..size).filter(|r| !group.contains(r)) {
                let v = bc.get(&tcp_key(r))?;
                let a = std::str::from_utf8(&v)
                    .ok()
                    .and_then(|s| s.parse::<SocketAddr>().ok())
                    .ok_or_else(|| Error::Bootstrap(format!("rank {r} published a malformed TCP address")))?;
                peers.push((r, a));
            }
            let mut t = TcpFabric::establish(rank, size, l, &peers, &env.secret, CONNECT_TIMEOUT)?;
            t.set_peer_timeout(how.peer_timeout)?;
            tcp = Some(t);
        }
    }
    bc.fence()?;
    if rank == leader {
        if let Some(s) = &shm {
            s.unlink()?;
        }
    }
    if let Some(t) = &tcp {
        if t.bad_connections() > 0 {
            eprintln!("tmpi: rank {rank}: refused {} TCP connection(s) that did not prove the job secret", t.bad_connections());
        }
    }
    Ok(match (shm, tcp) {
        (Some(s), None) => AnyFabric::Shm(s),
        (None, Some(t)) => AnyFabric::Tcp(t),
        (Some(s), Some(t)) => AnyFabric::Hybrid(Box::new(HybridFabric::new(s, t, size, group)?)),
        (None, None) => return Err(Error::Fabric(format!("rank {rank}: no fabric links it to the other {} ranks", size - 1))),
    })
}
