//! Dynamic processes: [`Comm::spawn`] and [`Comm::spawn_multiple`] start new processes as a
//! job of their own, connected to the spawning communicator by an [`InterComm`]; a spawned
//! process finds its parents with [`parent`] (MPI's `MPI_Comm_spawn`,
//! `MPI_Comm_spawn_multiple`, `MPI_Comm_get_parent`, `MPI_APPNUM`).
//!
//! How: the spawn's root asks `tmpirun` (a `spawn` request of the bootstrap protocol, see
//! `tmpi_transport::bootstrap::spawn`), which starts the children and answers with the
//! *bridge*: a job of the parents and the children together, with a bootstrap service of its
//! own. Every parent and every child (at [`crate::init`]) wires a fabric up through it, as any
//! job does (shared memory on one host), and runs an engine on it; the intercommunicator is
//! built on that engine's world, whose ranks are the parents (in the spawning communicator's
//! order) and then the children (in their world's order). The children's own world is their
//! job's alone, as in MPI.
//!
//! Only `tmpirun` starts processes: under Slurm (`srun`), or in a program started alone, a
//! spawn fails with [`Error::Spawn`] on every rank of the communicator, naming why.

use std::ffi::OsStr;
use std::process::Command;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use tmpi_transport::bootstrap::spawn::{Bridge, SpawnApp, SpawnRequest, ENV_APPNUM, ENV_PARENT};
use tmpi_transport::bootstrap::{BootstrapClient, JobSecret};

use crate::comm::Comm;
use crate::engine::{AnyFabric, Engine};
use crate::error::{Error, Result};
use crate::inter::InterComm;
use crate::sync::EngineCell;
use crate::Rank;

/// The tag of the intercommunicator's creation over a bridge's world (the only creation
/// there).
const BRIDGE_TAG: crate::Tag = 1;

/// What this process needs to join a bridge, set at [`crate::init`] under `tmpirun`.
pub(crate) struct JobLink {
    /// The job's secret: the bridge's service admits it.
    pub(crate) secret: JobSecret,
}

static LINK: OnceLock<JobLink> = OnceLock::new();
static PARENT: OnceLock<InterComm> = OnceLock::new();
/// The engines of the bridges this process joined: finalized with the world.
static BRIDGES: Mutex<Vec<Arc<EngineCell>>> = Mutex::new(Vec::new());

/// Records what a later spawn needs (at init, under `tmpirun`).
pub(crate) fn set_link(link: JobLink) {
    let _ = LINK.set(link);
}

/// The intercommunicator to the parents of this process, if `tmpirun` started it through a
/// spawn ([`Comm::spawn`]); `None` in every other process (MPI's `MPI_Comm_get_parent`).
/// Its remote group is the spawning communicator's ranks, its local group this process's
/// world.
pub fn parent() -> Option<InterComm> {
    PARENT.get().cloned()
}

/// The index of this process's command in the spawn that started it (MPI's `MPI_APPNUM`:
/// 0 for [`Comm::spawn`], the position in the list for [`Comm::spawn_multiple`]); `None`
/// in a process no spawn started.
pub fn appnum() -> Option<usize> {
    std::env::var(ENV_APPNUM).ok().and_then(|v| v.parse().ok())
}

/// At init of a spawned child (`TMPI_PARENT` set): joins the bridge as its rank
/// `parents + world.rank()` and keeps the intercommunicator for [`parent`].
pub(crate) fn join_parent(world: &Comm) -> Result<()> {
    let Some(v) = std::env::var_os(ENV_PARENT) else { return Ok(()) };
    let bridge = Bridge::parse(&v.to_string_lossy())?;
    if bridge.size - bridge.parents != world.size() {
        return Err(Error::Spawn(format!(
            "{ENV_PARENT}: the bridge has {} children, this job {} ranks",
            bridge.size - bridge.parents,
            world.size()
        )));
    }
    let ic = join(world, &bridge, bridge.parents + world.rank())?;
    let _ = PARENT.set(ic);
    Ok(())
}

/// Finalizes the engines of the bridges this process joined (at the world's finalize):
/// each hands over its own outgoing data and leaves.
pub(crate) fn finalize_bridges() -> Result<()> {
    let cells = std::mem::take(&mut *BRIDGES.lock().unwrap_or_else(PoisonError::into_inner));
    let mut first = Ok(());
    for cell in cells {
        let r = cell.lock_for_cleanup().and_then(|mut e| e.hand_over());
        cell.close();
        if let Ok(mut e) = cell.lock_for_cleanup() {
            e.mark_finalized();
        }
        first = first.and(r);
    }
    first
}

/// Wires up bridge rank `rank` and builds the intercommunicator between the parents (ranks
/// `0..parents` of the bridge) and the children; `comm` is the caller's communicator (its
/// engine's configuration and thread level serve the bridge's). Any failure is
/// [`Error::Spawn`], saying what it met (a child that ended before it joined, a fabric error).
fn join(comm: &Comm, bridge: &Bridge, rank: usize) -> Result<InterComm> {
    join_bridge(comm, bridge, rank).map_err(|e| match e {
        Error::Spawn(_) => e,
        e => Error::Spawn(format!("joining parents and children: {e}")),
    })
}

fn join_bridge(comm: &Comm, bridge: &Bridge, rank: usize) -> Result<InterComm> {
    let link = LINK.get().ok_or_else(|| Error::Spawn("this process was not started by tmpirun".into()))?;
    let (cfg, level) = (comm.eng()?.cfg.clone(), comm.inner.eng.level());
    let env = bridge.env(rank, link.secret.clone());
    let mut bc = BootstrapClient::connect_to(&bridge.bootstrap, rank, bridge.size, &link.secret)?;
    let fabric = crate::launch::wire(&mut bc, &env, &cfg)?;
    bc.finalize()?;
    let one_host = matches!(fabric, AnyFabric::Shm(_));
    let joint = crate::comm::world_comm(Engine::new(fabric, rank, bridge.size, cfg)?, level);
    BRIDGES.lock().unwrap_or_else(PoisonError::into_inner).push(joint.inner.eng.clone());
    crate::coll_glue::learn_hosts(&joint, one_host)?;
    let child = rank >= bridge.parents;
    let side = joint.split(Some(u32::from(child)), rank as i32)?.ok_or_else(|| Error::Spawn("no side of the bridge".into()))?;
    side.intercomm_create(0, &joint, if child { 0 } else { bridge.parents }, BRIDGE_TAG)
}

/// A `Command` as a spawn request's command of `procs` processes.
fn app_of(cmd: &Command, procs: usize) -> Result<SpawnApp> {
    let text = |s: &OsStr, what: &str| s.to_str().map(str::to_string).ok_or_else(|| Error::Spawn(format!("the {what} {s:?} is not UTF-8")));
    let mut env = Vec::new();
    for (k, v) in cmd.get_envs() {
        match v {
            Some(v) => env.push((text(k, "variable name")?, text(v, "value")?)),
            None => return Err(Error::Spawn(format!("removing {k:?} from a spawned process's environment is not supported"))),
        }
    }
    Ok(SpawnApp {
        program: text(cmd.get_program(), "program")?,
        args: cmd.get_args().map(|a| text(a, "argument")).collect::<Result<_>>()?,
        env,
        cwd: cmd.get_current_dir().map(|d| text(d.as_os_str(), "directory")).transpose()?,
        procs: u32::try_from(procs).map_err(|_| Error::Spawn(format!("{procs} processes")))?,
    })
}

/// At the root: asks the launcher for the processes.
fn ask(parents: usize, commands: &[Command], procs: &[usize]) -> Result<Bridge> {
    if commands.len() != procs.len() {
        return Err(Error::Spawn(format!("{} commands but {} process counts", commands.len(), procs.len())));
    }
    let apps = commands.iter().zip(procs).map(|(c, &n)| app_of(c, n)).collect::<Result<Vec<_>>>()?;
    let req = SpawnRequest { parents: u32::try_from(parents).map_err(|_| Error::Spawn("too many parents".into()))?, apps };
    req.check().map_err(|e| Error::Spawn(e.to_string()))?;
    crate::launch::spawn_through_launcher(req)
}

/// The root's outcome, at every rank of `comm`: the bridge, or the root's error.
fn share(comm: &Comm, root: Rank, mine: Option<Result<Bridge>>) -> Result<Bridge> {
    let text = match &mine {
        Some(Ok(b)) => format!("+{}", b.to_env()),
        Some(Err(Error::Spawn(m))) => format!("-{m}"),
        Some(Err(e)) => format!("-{e}"),
        None => String::new(),
    };
    let mut len = [text.len() as u64];
    comm.bcast(&mut len, root)?;
    let mut bytes = text.into_bytes();
    bytes.resize(len[0] as usize, 0);
    comm.bcast(&mut bytes, root)?;
    if let Some(r) = mine {
        return r;
    }
    let text = String::from_utf8_lossy(&bytes);
    match text.split_at_checked(1) {
        Some(("+", b)) => Ok(Bridge::parse(b)?),
        Some(("-", e)) => Err(Error::Spawn(format!("at the root (rank {root}): {e}"))),
        _ => Err(Error::Spawn("the root sent no outcome".into())),
    }
}

impl Comm {
    /// Starts `procs` processes of `command` as a new job, and returns the intercommunicator
    /// to them (MPI's `MPI_Comm_spawn`; collective over `self`). Only at `root` do `command`
    /// and `procs` count. The children's world is their own; [`parent`] gives them the
    /// intercommunicator to this communicator's ranks. `tmpirun` starts them on its host and
    /// forwards their output; a child that fails ends the job, as a rank does.
    ///
    /// `command` gives the program, its arguments, variables set for it (removing one is
    /// refused) and its directory; the rest of its environment is the job's.
    ///
    /// ```no_run
    /// # fn main() -> tmpi::Result<()> {
    /// let world = tmpi::init()?;
    /// match tmpi::parent() {
    ///     None => {
    ///         let mut me = std::process::Command::new(std::env::current_exe().unwrap());
    ///         me.arg("child");
    ///         let children = world.spawn(0, &me, 2)?;
    ///         assert_eq!(children.remote_size(), 2);
    ///     }
    ///     Some(parents) => assert_eq!(parents.remote_size(), world.size()),
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidRoot`] (every rank alike). [`Error::Spawn`] on every rank when the
    /// root's arguments are refused or `tmpirun` cannot start the processes (a program that
    /// does not exist, a job across hosts), or when this process was not started by
    /// `tmpirun` (Slurm cannot grow a running job; a program started alone has no launcher).
    /// Transport errors when the bridge cannot be wired up.
    pub fn spawn(&self, root: Rank, command: &Command, procs: usize) -> Result<InterComm> {
        self.spawn_multiple(root, std::slice::from_ref(command), &[procs])
    }

    /// Starts several commands as one new job (MPI's `MPI_Comm_spawn_multiple`): `procs[i]`
    /// processes of `commands[i]`, numbered in that order in the children's world; a child
    /// learns its command's index from [`appnum`]. Otherwise as [`Comm::spawn`].
    ///
    /// # Errors
    /// As [`Comm::spawn`]; [`Error::Spawn`] also when the two lists differ in length.
    pub fn spawn_multiple(&self, root: Rank, commands: &[Command], procs: &[usize]) -> Result<InterComm> {
        if root >= self.size() {
            return Err(Error::InvalidRoot { root, size: self.size() });
        }
        let mine = (self.rank() == root).then(|| ask(self.size(), commands, procs));
        let bridge = share(self, root, mine)?;
        if bridge.parents != self.size() {
            return Err(Error::Spawn(format!("the bridge has {} parents, the communicator {} ranks", bridge.parents, self.size())));
        }
        join(self, &bridge, self.rank())
    }
}
