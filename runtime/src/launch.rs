//! Who started this rank: `tmpirun` or a PMI-2 launcher ([`Launcher`]), what it says about
//! the job, the fabric wired up through it ([`wire`]), and the link a spawn's root asks it
//! through ([`spawn_through_launcher`]). Below both the world's start-up (`world`) and
//! `spawn`, which use it.

use std::sync::{Arc, Mutex, OnceLock, PoisonError, Weak};

use tmpi_transport::bootstrap::pmi2::Pmi2Client;
use tmpi_transport::bootstrap::wireup::{wire_up, WireUp};
use tmpi_transport::bootstrap::{BootstrapClient, BootstrapEnv, KeyValue};

use crate::config::Config;
use crate::engine::AnyFabric;
use crate::error::{Error, Result};

/// The launcher link of the world `init` made, for a spawn's root ([`spawn_through_launcher`]).
static LAUNCHER: OnceLock<Weak<Mutex<Option<Launcher>>>> = OnceLock::new();

/// Remembers the launcher link of the world `init` made (the first one only).
pub(crate) fn remember(link: &Arc<Mutex<Option<Launcher>>>) {
    let _ = LAUNCHER.set(Arc::downgrade(link));
}

/// Who started this rank, and how to tell it the rank is done or wants the job ended.
pub(crate) enum Launcher {
    /// `tmpirun`, through its bootstrap socket.
    Tmpirun(BootstrapClient),
    /// A PMI-2 launcher (Slurm's `srun --mpi=pmi2`), through `PMI_FD`.
    Pmi2(Pmi2Client),
}

impl Launcher {
    pub(crate) fn kv(&mut self) -> &mut dyn KeyValue {
        match self {
            Launcher::Tmpirun(c) => c,
            Launcher::Pmi2(c) => c,
        }
    }

    pub(crate) fn finalize(&mut self) -> tmpi_transport::Result<()> {
        match self {
            Launcher::Tmpirun(c) => c.finalize(),
            Launcher::Pmi2(c) => c.finalize(),
        }
    }

    pub(crate) fn abort(&mut self, code: i32, msg: &str) -> tmpi_transport::Result<()> {
        match self {
            Launcher::Tmpirun(c) => c.abort(code, msg),
            Launcher::Pmi2(c) => c.abort(code, msg),
        }
    }
}

/// Asks the launcher of this process to start the processes of `req` (a spawn's root).
///
/// # Errors
/// [`Error::Spawn`]: no `tmpirun` started this process (Slurm, or alone), the world is
/// gone, or `tmpirun` refused (its reason).
pub(crate) fn spawn_through_launcher(
    req: tmpi_transport::bootstrap::spawn::SpawnRequest,
) -> Result<tmpi_transport::bootstrap::spawn::Bridge> {
    let none =
        || Error::Spawn("this process was not started by tmpirun (a program started alone has no launcher to start processes)".into());
    let link = LAUNCHER.get().and_then(Weak::upgrade).ok_or_else(none)?;
    let mut l = link.lock().unwrap_or_else(PoisonError::into_inner);
    match l.as_mut() {
        Some(Launcher::Tmpirun(c)) => c.spawn(req).map_err(|e| match e {
            tmpi_transport::Error::Bootstrap(m) => Error::Spawn(m),
            e => Error::Spawn(e.to_string()),
        }),
        Some(Launcher::Pmi2(_)) => Err(Error::Spawn(
            "started by srun: Slurm cannot grow a running job (start the job with tmpirun, inside the allocation, to spawn)".into(),
        )),
        None => Err(none()),
    }
}

/// Wires up the fabric of rank `env.rank` of a job through `kv`, as `cfg` says.
pub(crate) fn wire(kv: &mut dyn KeyValue, env: &BootstrapEnv, cfg: &Config) -> Result<AnyFabric> {
    let ring_size = |n: usize| cfg.ring_size_for(n);
    let how = WireUp {
        choice: cfg.fabric,
        tcp_if: cfg.tcp_if.as_deref(),
        ring_size: &ring_size,
        peer_timeout: cfg.peer_timeout,
        ofi_provider: cfg.ofi_provider.as_deref(),
    };
    Ok(wire_up(kv, env, &how)?)
}

/// The launcher of this process and what it says about the job: `tmpirun` (`TMPI_RANK`
/// set), else a PMI-2 launcher (`PMI_FD` set), else none (a singleton).
pub(crate) fn launcher() -> Result<Option<(Launcher, BootstrapEnv)>> {
    if let Some((bc, env)) = BootstrapClient::from_env()? {
        return Ok(Some((Launcher::Tmpirun(bc), env)));
    }
    let Some(mut c) = Pmi2Client::from_env()? else { return Ok(None) };
    let env = BootstrapEnv::from_pmi2(&mut c)?;
    Ok(Some((Launcher::Pmi2(c), env)))
}
