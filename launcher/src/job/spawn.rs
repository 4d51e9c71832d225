//! Dynamic processes: what `tmpirun` does with a rank's spawn request
//! ([`ServerEvent::Spawn`](tmpi_transport::bootstrap::ServerEvent::Spawn)).
//!
//! A spawn makes two jobs (see [`tmpi_transport::bootstrap::spawn`]). The children's job is
//! served like the job's own: its processes join [`Running::ranks`](super::Running) and are
//! watched, forwarded, signalled and reported as the ranks are (a failing child ends the job
//! and is named `spawned rank J (spawn N: PROGRAM)`; `--tag-output` labels its lines
//! `[spawnN.J]`). The bridge of parents and children only wires them up: its service is
//! dropped once all its ranks have finalized or left. The children run on this host,
//! unbound, numbered in the order of the commands; each finds the bridge in `TMPI_PARENT` and
//! its command's index in `TMPI_APPNUM`. A command whose program cannot be found (or
//! started) fails the whole spawn with nothing left running, and the job goes on. A child
//! may spawn in turn (its job's processes are then the parents). Not in a job across hosts:
//! the answer says so.

use std::ffi::OsString;
use std::fmt;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use tmpi_transport::bootstrap::spawn::{Bridge, SpawnApp, SpawnRequest, ENV_APPNUM, ENV_PARENT};
use tmpi_transport::bootstrap::{BootstrapAddr, JobSecret};

use super::{export_pairs, launcher_pid, say, start_process, streams_of, Boot, JobEnv, JobFiles, JobSpec, LastLine, Rank, Served, Stream};
use crate::{cleanup, cli, sys};

/// Which process of which spawn a spawned rank is.
#[derive(Debug)]
pub(super) struct Spawned {
    /// The spawn, counted from 1 in the order of the spawns that started.
    spawn: usize,
    /// Its rank among the spawn's children.
    rank: usize,
    /// Its command's program, as the request named it.
    program: String,
    /// Its rank in the spawn's bridge (after the parents).
    bridge_rank: usize,
}

impl Spawned {
    /// The label of its spawn's bootstrap services ([`Served`]).
    pub(super) fn label(&self) -> String {
        format!("spawn {}", self.spawn)
    }

    /// Its rank in the bridge.
    pub(super) fn bridge_rank(&self) -> usize {
        self.bridge_rank
    }
}

impl fmt::Display for Spawned {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "spawned rank {} (spawn {}: {})", self.rank, self.spawn, self.program)
    }
}

/// What a started spawn adds to the running job.
pub(super) struct Started {
    /// The children, in their rank order.
    pub(super) ranks: Vec<Rank>,
    pub(super) streams: Vec<Stream>,
    /// The children's bootstrap service.
    pub(super) children: Served,
    /// The bridge's.
    pub(super) bridge: Served,
    /// The answer to the spawning rank: [`Bridge::to_env`].
    pub(super) answer: String,
}

/// Starts spawns; holds what every spawn's children share with the job.
pub(super) struct Spawner {
    secret: JobSecret,
    /// The job's `-x` exports.
    exports: Vec<(String, OsString)>,
    tag_output: bool,
    report_pids: bool,
    /// The job runs across hosts: no spawn (yet).
    across_hosts: bool,
    /// Spawns started so far.
    made: usize,
}

impl Spawner {
    pub(super) fn new(spec: &JobSpec, secret: JobSecret) -> Spawner {
        Spawner {
            secret,
            exports: export_pairs(spec, false),
            tag_output: spec.tag_output,
            report_pids: spec.report_pids,
            across_hosts: spec.multi.is_some(),
            made: 0,
        }
    }

    /// Starts what `req` asks for: the children become processes `first..` of the job;
    /// `parents` are the pids of the spawning job's processes (admitted to the bridge).
    ///
    /// # Errors
    /// Why not, for the spawning rank; nothing of the spawn is left running then.
    pub(super) fn start(&mut self, req: &SpawnRequest, parents: Vec<i32>, first: usize) -> Result<Started, String> {
        if self.across_hosts {
            return Err("spawn is not supported in a job across hosts yet (tmpirun starts children on its own host only)".into());
        }
        let programs = req.apps.iter().map(resolve).collect::<Result<Vec<_>, _>>()?;
        let (p, c) = (req.parents as usize, req.total());
        let (kids, bridge) = self.jobs(p, c)?;
        let spawn = self.made + 1;
        let addr = BootstrapAddr::Unix(bridge.server.path().to_path_buf());
        let answer =
            Bridge { jobid: bridge.jobid.clone(), shm_name: bridge.shm_name.clone(), parents: p, size: p + c, bootstrap: addr }.to_env();
        let (ranks, streams) = match self.start_children(req, &programs, &kids, &answer, spawn, first) {
            Ok(started) => started,
            Err(e) => {
                cleanup::remove_sockdir(&kids.sockdir);
                cleanup::remove_sockdir(&bridge.sockdir);
                return Err(e);
            }
        };
        self.made = spawn;
        let label = format!("spawn {spawn}");
        let (mut children, mut bridge) = (kids.server, Served::new(bridge.server, None, bridge.sockdir, label.clone()));
        let pids: Vec<i32> = ranks.iter().map(|r| r.pid).collect();
        children.admit_pids(pids.clone());
        bridge.server.admit_pids(parents.into_iter().chain(pids).collect());
        let children = Served::new(children, Some(first), kids.sockdir, label);
        Ok(Started { ranks, streams, children, bridge, answer })
    }

    /// The children's job (`c` ranks) and the bridge (`p + c`).
    fn jobs(&self, p: usize, c: usize) -> Result<(JobFiles, JobFiles), String> {
        let no = |e: crate::error::Error| format!("cannot set up the spawn's jobs: {e}");
        let kids = JobFiles::new(c, &self.secret).map_err(no)?;
        match JobFiles::new(p + c, &self.secret) {
            Ok(bridge) => Ok((kids, bridge)),
            Err(e) => {
                cleanup::remove_sockdir(&kids.sockdir);
                Err(no(e))
            }
        }
    }

    /// Starts the children of spawn number `spawn` (`programs`: the commands' resolved
    /// programs; `parent`: the bridge, for `TMPI_PARENT`), processes `first..` of the job.
    /// On a failure, kills those it started.
    fn start_children(
        &self,
        req: &SpawnRequest,
        programs: &[PathBuf],
        kids: &JobFiles,
        parent: &str,
        spawn: usize,
        first: usize,
    ) -> Result<(Vec<Rank>, Vec<Stream>), String> {
        let c = req.total();
        let (pid, secret, sock) = (launcher_pid(), self.secret.to_hex(), kids.server.path().to_path_buf());
        let env = JobEnv { jobid: &kids.jobid, shm_name: &kids.shm_name, sock: &sock, launcher_pid: &pid, secret: &secret };
        let mut ranks: Vec<Rank> = Vec::with_capacity(c);
        let mut streams = Vec::with_capacity(2 * c);
        let numbered = req.apps.iter().zip(programs).enumerate().flat_map(|(k, (app, path))| (0..app.procs).map(move |_| (k, app, path)));
        for (j, (k, app, path)) in numbered.enumerate() {
            let mut cmd = Command::new(path);
            cmd.arg0(&app.program).args(&app.args);
            if let Some(d) = &app.cwd {
                cmd.current_dir(d);
            }
            cmd.envs(self.exports.iter().map(|(n, v)| (n, v))).envs(app.env.iter().map(|(n, v)| (n, v)));
            env.apply(&mut cmd, j, c, (j, c));
            cmd.env(ENV_PARENT, parent).env(ENV_APPNUM, k.to_string());
            let who = Spawned { spawn, rank: j, program: app.program.clone(), bridge_rank: req.parents as usize + j };
            match self.start_one(cmd, who, first + j) {
                Ok((rank, out)) => {
                    ranks.push(rank);
                    streams.extend(out);
                }
                Err(e) => {
                    ranks.iter().for_each(|r| kill(r.pid));
                    return Err(format!("cannot start program {:?}: {e}", app.program));
                }
            }
        }
        Ok((ranks, streams))
    }

    /// Starts one child, process `g` of the job.
    fn start_one(&self, cmd: Command, who: Spawned, g: usize) -> crate::error::Result<(Rank, Vec<Stream>)> {
        let mut child = start_process(cmd, Stdio::null(), || format!("start {who}"))?;
        let pid = child.id() as i32;
        let streams = match streams_of(&mut child, g, &format!("spawn{}.{}", who.spawn, who.rank), self.tag_output) {
            Ok(s) => s,
            Err(e) => {
                kill(pid);
                return Err(e);
            }
        };
        if self.report_pids {
            say(&format!("{who} pid {pid}"));
        }
        Ok((Rank { pid, host: None, exit: None, boot: Boot::Never, last_err: LastLine::default(), spawned: Some(who) }, streams))
    }
}

/// Kills and reaps a child of a spawn that failed.
fn kill(pid: i32) {
    sys::kill_group(pid, libc::SIGKILL);
    cleanup::reap_child(pid);
}

/// Finds a command's program as `tmpirun` finds the job's ([`cli::resolve_program`]; a
/// relative path with a `/` from the command's working directory), as an absolute path (the
/// child starts in that directory).
fn resolve(app: &SpawnApp) -> Result<PathBuf, String> {
    let no = |why: String| format!("no program {:?} to spawn ({why})", app.program);
    let here = std::env::current_dir().map_err(|e| no(format!("tmpirun's working directory: {e}")))?;
    let dir = app.cwd.as_ref().map_or_else(|| here.clone(), |d| here.join(d));
    if !dir.is_dir() {
        return Err(no(format!("its working directory {} is not a directory", dir.display())));
    }
    let prog = if app.program.contains('/') { dir.join(&app.program) } else { PathBuf::from(&app.program) };
    let found = cli::resolve_program(prog.as_os_str()).map_err(|e| no(e.to_string()))?;
    Ok(here.join(found))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn app(program: &str, cwd: Option<&str>) -> SpawnApp {
        SpawnApp { program: program.into(), args: Vec::new(), env: Vec::new(), cwd: cwd.map(Into::into), procs: 1 }
    }

    #[test]
    fn programs_are_found_as_the_ranks_are_and_made_absolute() {
        let found = resolve(&app("sh", None)).expect("sh in PATH");
        assert!(found.is_absolute() && found.ends_with("sh"), "{}", found.display());
        // A relative path with a '/' is taken from the command's directory.
        assert_eq!(resolve(&app("./sh", Some("/bin"))).map(|p| p.starts_with("/bin") && p.ends_with("sh")), Ok(true));
        let refused = [
            ("no-such-program-for-spawn", None, "no program \"no-such-program-for-spawn\" to spawn (cannot run program"),
            ("sh", Some("/no/such/dir"), "its working directory /no/such/dir is not a directory"),
            ("/etc/passwd", None, "is not executable"),
            ("./sh", None, "no program \"./sh\" to spawn"),
        ];
        for (prog, cwd, says) in refused {
            let e = resolve(&app(prog, cwd)).expect_err(prog);
            assert!(e.contains(says), "{prog}: {e}");
        }
    }

    #[test]
    fn spawned_processes_are_named_by_spawn_and_rank() {
        let s = Spawned { spawn: 2, rank: 5, program: "./w".into(), bridge_rank: 7 };
        assert_eq!(s.to_string(), "spawned rank 5 (spawn 2: ./w)");
    }
}
