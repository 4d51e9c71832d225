//! Dynamic processes: what a rank asks `tmpirun` to start ([`SpawnRequest`], the `spawn`
//! request of the bootstrap protocol), and how the spawning ranks and the children find each
//! other afterwards ([`Bridge`]).
//!
//! A spawn makes two jobs out of one: the children are a job of their own (their own world,
//! bootstrap service and fabric), and the spawning communicator's ranks and the children
//! together are a third, the *bridge*: `parents + children` ranks, the parents first in the
//! order of their communicator, then the children in the order of their world. The bridge
//! has a bootstrap service of its own, through which its ranks wire up a fabric as any job
//! does; the intercommunicator between parents and children is built on it. `tmpirun`
//! answers the spawning rank with the bridge (its [`Bridge::to_env`] text), which that rank
//! passes to the other parents; the children find it in [`ENV_PARENT`].

use std::path::PathBuf;

use super::{BootstrapAddr, BootstrapEnv, JobSecret};
use crate::error::{Error, Result};

/// `TMPI_PARENT`: set by `tmpirun` in a spawned child: the bridge to its parents
/// ([`Bridge::to_env`]).
pub const ENV_PARENT: &str = "TMPI_PARENT";
/// `TMPI_APPNUM`: set by `tmpirun` in a spawned child: the index of its command in the
/// spawn's list (MPI's `MPI_APPNUM`; 0 for a plain spawn).
pub const ENV_APPNUM: &str = "TMPI_APPNUM";

/// Most commands in one spawn.
pub const MAX_APPS: usize = 1024;
/// Most arguments, or environment variables, of one command.
pub const MAX_ARGS: usize = 4096;
/// Most processes one spawn may start.
pub const MAX_SPAWN_PROCS: usize = 4096;

/// One command of a spawn: `procs` processes of `program` with `args`, with `env` added to
/// the job's environment and in directory `cwd` (`None`: `tmpirun`'s).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpawnApp {
    /// The program (a path, or a name looked up in `PATH`).
    pub program: String,
    /// Its arguments (without the program).
    pub args: Vec<String>,
    /// Variables set for it, over the job's.
    pub env: Vec<(String, String)>,
    /// Its working directory.
    pub cwd: Option<String>,
    /// How many processes of it.
    pub procs: u32,
}

/// A `spawn` request: `parents` is the size of the spawning communicator (the parents'
/// part of the bridge); `apps` the commands, started as one job in this order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpawnRequest {
    /// Ranks of the spawning communicator.
    pub parents: u32,
    /// The commands.
    pub apps: Vec<SpawnApp>,
}

fn malformed(what: impl Into<String>) -> Error {
    Error::Bootstrap(format!("malformed spawn request: {}", what.into()))
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u32).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

/// A cursor over a request body; every read is bounds-checked.
struct Reader<'a> {
    b: &'a [u8],
}

impl Reader<'_> {
    fn u32(&mut self) -> Result<u32> {
        let (head, rest) = self.b.split_first_chunk::<4>().ok_or_else(|| malformed("body too short"))?;
        self.b = rest;
        Ok(u32::from_le_bytes(*head))
    }

    fn count(&mut self, max: usize, what: &str) -> Result<usize> {
        let n = self.u32()? as usize;
        if n > max {
            return Err(malformed(format!("{n} {what}, at most {max}")));
        }
        Ok(n)
    }

    fn str(&mut self) -> Result<String> {
        let n = self.u32()? as usize;
        if n > self.b.len() {
            return Err(malformed("a string runs past the body"));
        }
        let (s, rest) = self.b.split_at(n);
        self.b = rest;
        String::from_utf8(s.to_vec()).map_err(|_| malformed("a string is not UTF-8"))
    }
}

impl SpawnRequest {
    /// Processes this request starts in all.
    pub fn total(&self) -> usize {
        self.apps.iter().map(|a| a.procs as usize).sum()
    }

    /// Checks the request: at least one process, at most [`MAX_SPAWN_PROCS`]; every command
    /// names a program and starts at least one process; no NUL byte anywhere (no command
    /// line or environment could carry it); variable names without `=`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] naming what is wrong.
    pub fn check(&self) -> Result<()> {
        let bad = |m: String| Err(Error::InvalidArgument(format!("spawn: {m}")));
        if self.apps.is_empty() || self.apps.len() > MAX_APPS {
            return bad(format!("{} commands (1..={MAX_APPS})", self.apps.len()));
        }
        if self.parents == 0 {
            return bad("a spawning communicator of no ranks".into());
        }
        let total = self.total();
        if total == 0 || total > MAX_SPAWN_PROCS {
            return bad(format!("{total} processes in all (1..={MAX_SPAWN_PROCS})"));
        }
        for (i, a) in self.apps.iter().enumerate() {
            let texts = std::iter::once(&a.program).chain(&a.args).chain(a.cwd.iter()).chain(a.env.iter().flat_map(|(k, v)| [k, v]));
            if a.program.is_empty() || a.procs == 0 {
                return bad(format!("command {i}: {:?} with {} processes (a program and at least one)", a.program, a.procs));
            }
            if a.args.len() > MAX_ARGS || a.env.len() > MAX_ARGS {
                return bad(format!("command {i}: more than {MAX_ARGS} arguments or variables"));
            }
            if texts.into_iter().any(|t| t.contains('\0')) || a.env.iter().any(|(k, _)| k.is_empty() || k.contains('=')) {
                return bad(format!("command {i}: a NUL byte, or a variable name that is empty or holds '='"));
            }
        }
        Ok(())
    }

    /// Appends the request's body (after the op code) to `out`.
    pub(crate) fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.parents.to_le_bytes());
        out.extend_from_slice(&(self.apps.len() as u32).to_le_bytes());
        for a in &self.apps {
            out.extend_from_slice(&a.procs.to_le_bytes());
            put_str(out, &a.program);
            out.extend_from_slice(&(a.args.len() as u32).to_le_bytes());
            a.args.iter().for_each(|s| put_str(out, s));
            out.extend_from_slice(&(a.env.len() as u32).to_le_bytes());
            for (k, v) in &a.env {
                put_str(out, k);
                put_str(out, v);
            }
            match &a.cwd {
                Some(c) => {
                    out.push(1);
                    put_str(out, c);
                }
                None => out.push(0),
            }
        }
    }

    /// Decodes a body written by [`SpawnRequest::encode`], then [`SpawnRequest::check`]s it.
    ///
    /// # Errors
    /// [`Error::Bootstrap`] for a malformed body; as [`SpawnRequest::check`].
    pub(crate) fn decode(body: &[u8]) -> Result<Self> {
        let mut r = Reader { b: body };
        let parents = r.u32()?;
        let n = r.count(MAX_APPS, "commands")?;
        let mut apps = Vec::with_capacity(n);
        for _ in 0..n {
            apps.push(Self::decode_app(&mut r)?);
        }
        if !r.b.is_empty() {
            return Err(malformed(format!("{} bytes after the last command", r.b.len())));
        }
        let req = SpawnRequest { parents, apps };
        req.check().map_err(|e| malformed(e.to_string()))?;
        Ok(req)
    }

    fn decode_app(r: &mut Reader<'_>) -> Result<SpawnApp> {
        let procs = r.u32()?;
        let program = r.str()?;
        let nargs = r.count(MAX_ARGS, "arguments")?;
        let args = (0..nargs).map(|_| r.str()).collect::<Result<Vec<_>>>()?;
        let nenv = r.count(MAX_ARGS, "variables")?;
        let env = (0..nenv).map(|_| Ok((r.str()?, r.str()?))).collect::<Result<Vec<_>>>()?;
        let (&flag, rest) = r.b.split_first().ok_or_else(|| malformed("body too short"))?;
        r.b = rest;
        let cwd = match flag {
            0 => None,
            1 => Some(r.str()?),
            f => return Err(malformed(format!("working-directory flag {f}"))),
        };
        Ok(SpawnApp { program, args, env, cwd, procs })
    }
}

/// The job of the parents and children of one spawn together (see the module's docs): its
/// id and shared-memory name (as any job's), its size, how many of its ranks are parents, and
/// its bootstrap service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bridge {
    /// Job id: 16 lowercase hex digits.
    pub jobid: String,
    /// Name of its shared-memory segment (`tmpi-<jobid>-<16 hex>`).
    pub shm_name: String,
    /// Parents (ranks `0..parents`); the children follow.
    pub parents: usize,
    /// Parents and children.
    pub size: usize,
    /// Its bootstrap service.
    pub bootstrap: BootstrapAddr,
}

impl Bridge {
    /// The text that names the bridge (in [`ENV_PARENT`], and in `tmpirun`'s answer to a
    /// spawn): `jobid:shm_name:parents:size:bootstrap`.
    pub fn to_env(&self) -> String {
        format!("{}:{}:{}:{}:{}", self.jobid, self.shm_name, self.parents, self.size, self.bootstrap.to_env().to_string_lossy())
    }

    /// Reads [`Bridge::to_env`]'s text.
    ///
    /// # Errors
    /// [`Error::Bootstrap`] naming what is malformed.
    pub fn parse(v: &str) -> Result<Bridge> {
        let bad = |what: &str| Error::Bootstrap(format!("{ENV_PARENT}={v:?}: {what}"));
        let mut it = v.splitn(5, ':');
        let mut next = |what: &str| it.next().ok_or_else(|| bad(&format!("no {what}")));
        let (jobid, shm_name) = (next("job id")?.to_string(), next("segment name")?.to_string());
        let parents: usize = next("parent count")?.parse().map_err(|_| bad("parent count is not a number"))?;
        let size: usize = next("size")?.parse().map_err(|_| bad("size is not a number"))?;
        let bootstrap = BootstrapAddr::parse(std::path::Path::new(next("bootstrap address")?))?;
        if parents == 0 || size <= parents || size > super::MAX_RANKS {
            return Err(bad(&format!("{parents} parents of {size} ranks")));
        }
        let ok_id = jobid.len() == 16 && jobid.bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase());
        if !ok_id || !shm_name.starts_with(&format!("tmpi-{jobid}-")) {
            return Err(bad("job id or segment name malformed"));
        }
        Ok(Bridge { jobid, shm_name, parents, size, bootstrap })
    }

    /// What bridge rank `rank` needs to wire up, as [`BootstrapEnv`]: the bridge's job,
    /// `secret` (the job's: parents and children share it), every rank on this host.
    pub fn env(&self, rank: usize, secret: JobSecret) -> BootstrapEnv {
        let bootstrap = PathBuf::from(self.bootstrap.to_env());
        BootstrapEnv {
            rank,
            size: self.size,
            jobid: self.jobid.clone(),
            shm_name: self.shm_name.clone(),
            local_rank: rank,
            local_size: self.size,
            bootstrap,
            secret,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn app(p: &str, procs: u32) -> SpawnApp {
        SpawnApp { program: p.into(), args: vec!["a b".into(), String::new()], env: vec![("K".into(), "v=1".into())], cwd: None, procs }
    }

    #[test]
    fn requests_round_trip() {
        let mut two = SpawnRequest { parents: 3, apps: vec![app("/bin/x", 2), app("y", 1)] };
        two.apps[1].cwd = Some("/tmp".into());
        for req in [SpawnRequest { parents: 1, apps: vec![app("x", 1)] }, two] {
            let mut b = Vec::new();
            req.encode(&mut b);
            assert_eq!(SpawnRequest::decode(&b).unwrap(), req);
            // Every prefix is refused, never a panic.
            for n in 0..b.len() {
                assert!(SpawnRequest::decode(&b[..n]).is_err(), "prefix of {n} bytes");
            }
            b.push(0);
            assert!(SpawnRequest::decode(&b).is_err(), "a byte after the end");
        }
    }

    #[test]
    fn bad_requests_are_refused() {
        let bad = [
            SpawnRequest { parents: 1, apps: vec![] },
            SpawnRequest { parents: 0, apps: vec![app("x", 1)] },
            SpawnRequest { parents: 1, apps: vec![app("", 1)] },
            SpawnRequest { parents: 1, apps: vec![app("x", 0)] },
            SpawnRequest { parents: 1, apps: vec![app("x", MAX_SPAWN_PROCS as u32 + 1)] },
            SpawnRequest { parents: 1, apps: vec![app("x\0", 1)] },
            SpawnRequest { parents: 1, apps: vec![SpawnApp { env: vec![("A=B".into(), "1".into())], ..app("x", 1) }] },
        ];
        for (i, req) in bad.iter().enumerate() {
            assert!(req.check().is_err(), "case {i}");
            let mut b = Vec::new();
            req.encode(&mut b);
            assert!(SpawnRequest::decode(&b).is_err(), "case {i}");
        }
        // Counts far beyond the body are refused before any allocation.
        let mut b = 1u32.to_le_bytes().to_vec();
        b.extend_from_slice(&u32::MAX.to_le_bytes());
        assert!(SpawnRequest::decode(&b).is_err());
    }

    #[test]
    fn bridges_round_trip_and_bad_ones_are_refused() {
        let jobid = "0123456789abcdef".to_string();
        let br = Bridge {
            shm_name: format!("tmpi-{jobid}-fedcba9876543210"),
            jobid,
            parents: 2,
            size: 5,
            bootstrap: BootstrapAddr::Unix("/tmp/a:b/sock".into()),
        };
        assert_eq!(Bridge::parse(&br.to_env()).unwrap(), br);
        let tcp = Bridge { bootstrap: BootstrapAddr::Tcp("127.0.0.1:5".parse().unwrap()), ..br.clone() };
        assert_eq!(Bridge::parse(&tcp.to_env()).unwrap(), tcp);
        for v in [
            "",
            "x",
            "0123456789abcdef:tmpi-0123456789abcdef-1:0:5:/s",
            "0123456789abcdef:tmpi-0123456789abcdef-1:5:5:/s",
            "0123456789ABCDEF:tmpi-0123456789ABCDEF-1:1:5:/s",
            "0123456789abcdef:other:1:5:/s",
            "0123456789abcdef:tmpi-0123456789abcdef-1:1:x:/s",
        ] {
            assert!(Bridge::parse(v).is_err(), "{v:?}");
        }
    }
}
