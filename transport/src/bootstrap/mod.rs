//! Bootstrap: how the ranks of a job find each other.
//!
//! `tmpirun` serves a small key-value store ([`BootstrapServer`]) over a Unix socket, and for
//! ranks on other hosts also over TCP ([`BootstrapServer::listen_tcp`], [`BootstrapAddr`]), and
//! tells each rank where it is through environment variables ([`BootstrapEnv`]). A rank
//! connects with [`BootstrapClient`], puts what others need (addresses, segment names),
//! fences, and gets what it needs from the others:
//!
//! ```no_run
//! # fn main() -> tmpi_transport::Result<()> {
//! use tmpi_transport::bootstrap::BootstrapClient;
//! match BootstrapClient::from_env()? {
//!     None => { /* not started by tmpirun: a singleton, rank 0 of 1 */ }
//!     Some((mut kv, env)) => {
//!         kv.put(&format!("addr-{}", env.rank), b"...")?;
//!         kv.fence()?;
//!         let peer = kv.get(&format!("addr-{}", (env.rank + 1) % env.size))?;
//!         # let _ = peer;
//!         kv.finalize()?;
//!     }
//! }
//! # Ok(()) }
//! ```
//!
//! - [`proto`]: the length-prefixed binary frames, with caps on every length.
//! - [`server`]: the service, driven without blocking from `tmpirun`'s event loop.
//!
//! The environment contract between `tmpirun` and each rank:
//!
//! | variable            | meaning                                                         |
//! |---------------------|-----------------------------------------------------------------|
//! | `TMPI_RANK`         | this rank, `0..TMPI_SIZE`                                       |
//! | `TMPI_SIZE`         | number of ranks                                                 |
//! | `TMPI_LOCAL_RANK`   | rank among the ranks of this node (= `TMPI_RANK` on one node)   |
//! | `TMPI_LOCAL_SIZE`   | ranks on this node (= `TMPI_SIZE` on one node)                  |
//! | `TMPI_JOBID`        | 16 lowercase hex digits, random per job                         |
//! | `TMPI_BOOTSTRAP`    | path of the bootstrap Unix socket, or `tcp:ADDR:PORT` (remote ranks) |
//! | `TMPI_SHM_NAME`     | `tmpi-<jobid>-<16 hex>`: rank 0 creates `/dev/shm/<name>`        |
//! | `TMPI_LAUNCHER_PID` | pid of `tmpirun`                                                |
//! | `TMPI_JOB_SECRET`   | 32 hex digits, random per job: a `hello` proves it (HMAC), never sends it |
//! | `TMPI_NODE_ID`      | optional: the host a rank runs on (equal ids share memory)      |
//! | `TMPI_PARENT`       | only in a spawned child: the bridge to its parents ([`spawn`])  |
//! | `TMPI_APPNUM`       | only in a spawned child: the index of its command in the spawn  |
//!
//! `tmpirun` removes `/dev/shm/<TMPI_SHM_NAME>` and every `/dev/shm/tmpi-<jobid>*` file when
//! the job ends, whichever way it ends.

pub mod pmi2;
pub mod proto;
pub mod server;
pub mod spawn;
pub mod wireup;

use std::ffi::OsString;
use std::io::{self, Read};
use std::net::{SocketAddr, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

pub use crate::secret::{JobSecret, ENV_JOB_SECRET};
pub use server::{BootstrapServer, ServerEvent, ServerThread};

use crate::error::{Error, Result};
use proto::{Reply, Request};

/// `TMPI_RANK`: this process's rank.
pub const ENV_RANK: &str = "TMPI_RANK";
/// `TMPI_SIZE`: number of ranks.
pub const ENV_SIZE: &str = "TMPI_SIZE";
/// `TMPI_LOCAL_RANK`: rank among the ranks of this node.
pub const ENV_LOCAL_RANK: &str = "TMPI_LOCAL_RANK";
/// `TMPI_LOCAL_SIZE`: number of ranks on this node.
pub const ENV_LOCAL_SIZE: &str = "TMPI_LOCAL_SIZE";
/// `TMPI_JOBID`: 16 hex digits, random per job.
pub const ENV_JOBID: &str = "TMPI_JOBID";
/// `TMPI_BOOTSTRAP`: path of the bootstrap Unix socket, or `tcp:ADDR:PORT`.
pub const ENV_BOOTSTRAP: &str = "TMPI_BOOTSTRAP";

/// How long a rank tries to reach a bootstrap service over TCP before it gives up.
pub const TCP_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a rank waits for the bootstrap service's challenge and its answer to the `hello`
/// (generous: `tmpirun` may be starting hundreds of ranks on a loaded machine).
pub const HELLO_TIMEOUT: Duration = Duration::from_secs(60);

/// Where the bootstrap service is, as `TMPI_BOOTSTRAP` says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BootstrapAddr {
    /// A Unix socket (ranks on `tmpirun`'s host).
    Unix(PathBuf),
    /// A TCP address (`tcp:ADDR:PORT`, ranks on other hosts; IPv6 as `tcp:[ADDR]:PORT`).
    Tcp(SocketAddr),
}

impl BootstrapAddr {
    /// Reads a `TMPI_BOOTSTRAP` value: `tcp:ADDR:PORT`, else the path of a Unix socket.
    ///
    /// # Errors
    /// [`Error::Bootstrap`] for an empty value or a `tcp:` one that is no socket address.
    pub fn parse(v: &Path) -> Result<Self> {
        if v.as_os_str().is_empty() {
            return Err(bad_var(ENV_BOOTSTRAP, "", "the path of a Unix socket or tcp:ADDR:PORT"));
        }
        match v.to_str().and_then(|s| s.strip_prefix("tcp:")) {
            Some(a) => a
                .parse::<SocketAddr>()
                .map(BootstrapAddr::Tcp)
                .map_err(|_| bad_var(ENV_BOOTSTRAP, &v.to_string_lossy(), "tcp:ADDR:PORT with a numeric address")),
            None => Ok(BootstrapAddr::Unix(v.to_path_buf())),
        }
    }

    /// The `TMPI_BOOTSTRAP` value that names this address.
    pub fn to_env(&self) -> OsString {
        match self {
            BootstrapAddr::Unix(p) => p.clone().into_os_string(),
            BootstrapAddr::Tcp(a) => format!("tcp:{a}").into(),
        }
    }
}
/// `TMPI_SHM_NAME`: name of the job's shared-memory segment in `/dev/shm`.
pub const ENV_SHM_NAME: &str = "TMPI_SHM_NAME";
/// `TMPI_LAUNCHER_PID`: pid of `tmpirun`.
pub const ENV_LAUNCHER_PID: &str = "TMPI_LAUNCHER_PID";

/// Every variable `tmpirun` sets for the ranks (a user may not override them with `-x`).
pub const LAUNCHER_VARS: &[&str] =
    &[ENV_RANK, ENV_SIZE, ENV_LOCAL_RANK, ENV_LOCAL_SIZE, ENV_JOBID, ENV_BOOTSTRAP, ENV_SHM_NAME, ENV_LAUNCHER_PID, ENV_JOB_SECRET];

/// Largest job: a source rank has 20 bits in the match tag.
pub const MAX_RANKS: usize = 1 << 20;

/// The knob table lives in [`crate::knobs`]; these names stay here, where they were first
/// documented.
pub use crate::knobs::{Knob, KNOBS, LAUNCHER_KNOBS};

/// `TMPI_OFI_PROVIDER`: the libfabric provider of the OFI fabric.
pub const ENV_OFI_PROVIDER: &str = "TMPI_OFI_PROVIDER";

/// Reads a `TMPI_OFI_PROVIDER` value: `Some(None)` for `auto` (or empty), `Some(Some(name))`
/// for a provider name (lowercase letters, digits, `_`, and `;` between layered providers,
/// as `fi_info -l` prints them), `None` for anything else. Whether libfabric has the provider
/// is known only when the OFI fabric asks it.
pub fn parse_ofi_provider(v: &str) -> Option<Option<String>> {
    let v = v.trim();
    if v.is_empty() || v == "auto" {
        return Some(None);
    }
    let ok = v.split(';').all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_'));
    ok.then(|| Some(v.to_string()))
}

/// What `tmpirun` told this rank through its environment.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct BootstrapEnv {
    /// `TMPI_RANK`.
    pub rank: usize,
    /// `TMPI_SIZE`.
    pub size: usize,
    /// `TMPI_JOBID`: 16 lowercase hex digits.
    pub jobid: String,
    /// `TMPI_SHM_NAME`: `tmpi-<jobid>-<16 hex>`, a file name in `/dev/shm`.
    pub shm_name: String,
    /// `TMPI_LOCAL_RANK` (defaults to `rank` when unset).
    pub local_rank: usize,
    /// `TMPI_LOCAL_SIZE` (defaults to `size` when unset).
    pub local_size: usize,
    /// `TMPI_BOOTSTRAP`: the socket to connect to (a path, or `tcp:ADDR:PORT`: see
    /// [`BootstrapAddr::parse`]).
    pub bootstrap: PathBuf,
    /// `TMPI_JOB_SECRET`: what the rank proves itself with in its `hello` (by an HMAC over
    /// the server's challenge; the secret itself is never sent).
    pub secret: JobSecret,
}

fn bad_var(name: &str, value: &str, want: &str) -> Error {
    Error::Bootstrap(format!("{name}={value:?}: expected {want}"))
}

fn is_hex16(s: &str) -> bool {
    s.len() == 16 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

impl BootstrapEnv {
    /// Reads the process environment; `None` when `TMPI_RANK` is unset (a singleton).
    ///
    /// # Errors
    /// [`Error::Bootstrap`] naming the first variable that is missing or malformed.
    pub fn from_env() -> Result<Option<Self>> {
        Self::from_lookup(|name| std::env::var_os(name))
    }

    /// As [`from_env`](Self::from_env), reading variables through `get`.
    ///
    /// # Errors
    /// As [`from_env`](Self::from_env).
    pub fn from_lookup(get: impl Fn(&str) -> Option<OsString>) -> Result<Option<Self>> {
        let text = |name: &str| -> Result<Option<String>> {
            match get(name) {
                None => Ok(None),
                Some(v) => v.into_string().map(Some).map_err(|v| bad_var(name, &v.to_string_lossy(), "UTF-8 text")),
            }
        };
        let need = |name: &str| -> Result<String> {
            text(name)?.ok_or_else(|| Error::Bootstrap(format!("{name} is not set (but {ENV_RANK} is: started by tmpirun?)")))
        };
        let num = |name: &str, v: &str| -> Result<usize> { v.parse::<usize>().map_err(|_| bad_var(name, v, "a non-negative integer")) };
        let Some(rank) = text(ENV_RANK)? else {
            return Ok(None);
        };
        let rank = num(ENV_RANK, &rank)?;
        let size_s = need(ENV_SIZE)?;
        let size = num(ENV_SIZE, &size_s)?;
        if size == 0 || size > MAX_RANKS {
            return Err(bad_var(ENV_SIZE, &size_s, &format!("1..={MAX_RANKS}")));
        }
        if rank >= size {
            return Err(bad_var(ENV_RANK, &rank.to_string(), &format!("0..{size} (TMPI_SIZE)")));
        }
        let jobid = need(ENV_JOBID)?;
        if !is_hex16(&jobid) {
            return Err(bad_var(ENV_JOBID, &jobid, "16 lowercase hex digits"));
        }
        let shm_name = need(ENV_SHM_NAME)?;
        let ok_shm = shm_name.strip_prefix(&format!("tmpi-{jobid}-")).is_some_and(is_hex16);
        if !ok_shm {
            return Err(bad_var(ENV_SHM_NAME, &shm_name, &format!("tmpi-{jobid}-<16 hex digits>")));
        }
        let secret = JobSecret::from_hex(&need(ENV_JOB_SECRET)?)?;
        let bootstrap = PathBuf::from(need(ENV_BOOTSTRAP)?);
        BootstrapAddr::parse(&bootstrap)?;
        let local_size = match text(ENV_LOCAL_SIZE)? {
            Some(v) => {
                let n = num(ENV_LOCAL_SIZE, &v)?;
                if n == 0 || n > size {
                    return Err(bad_var(ENV_LOCAL_SIZE, &v, &format!("1..={size}")));
                }
                n
            }
            None => size,
        };
        let local_rank = match text(ENV_LOCAL_RANK)? {
            Some(v) => {
                let n = num(ENV_LOCAL_RANK, &v)?;
                if n >= local_size {
                    return Err(bad_var(ENV_LOCAL_RANK, &v, &format!("0..{local_size}")));
                }
                n
            }
            None if local_size == size => rank,
            None => return Err(Error::Bootstrap(format!("{ENV_LOCAL_RANK} is not set"))),
        };
        Ok(Some(BootstrapEnv { rank, size, jobid, shm_name, local_rank, local_size, bootstrap, secret }))
    }
}

/// A new random job id: 16 lowercase hex digits.
///
/// # Errors
/// The system's random source fails.
pub fn new_jobid() -> Result<String> {
    random_hex16()
}

/// The shared-memory segment name for a job: `tmpi-<jobid>-<16 random hex>`.
///
/// # Errors
/// The system's random source fails.
pub fn new_shm_name(jobid: &str) -> Result<String> {
    Ok(format!("tmpi-{jobid}-{}", random_hex16()?))
}

fn random_hex16() -> Result<String> {
    let mut b = [0u8; 8];
    getrandom::getrandom(&mut b).map_err(|e| Error::Io { op: "getrandom".into(), source: io::Error::other(e.to_string()) })?;
    Ok(format!("{:016x}", u64::from_le_bytes(b)))
}

/// The key-value service a job's ranks meet through when they start: `tmpirun`'s
/// ([`BootstrapClient`]) or a PMI-2 server's ([`pmi2::Pmi2Client`], under Slurm). Wire-up
/// ([`wireup::wire_up`]) needs nothing else.
pub trait KeyValue {
    /// Publishes `value` under `key`; visible to every rank after the next fence.
    ///
    /// # Errors
    /// A bad key or value, a lost service.
    fn put(&mut self, key: &str, value: &[u8]) -> Result<()>;
    /// The value some rank put under `key` before the last fence.
    ///
    /// # Errors
    /// No rank put it, a lost service.
    fn get(&mut self, key: &str) -> Result<Vec<u8>>;
    /// Waits until every rank has fenced.
    ///
    /// # Errors
    /// A rank died or left first, a lost service.
    fn fence(&mut self) -> Result<()>;
}

impl KeyValue for BootstrapClient {
    fn put(&mut self, key: &str, value: &[u8]) -> Result<()> {
        BootstrapClient::put(self, key, value)
    }
    fn get(&mut self, key: &str) -> Result<Vec<u8>> {
        BootstrapClient::get(self, key)
    }
    fn fence(&mut self) -> Result<()> {
        BootstrapClient::fence(self)
    }
}

impl KeyValue for pmi2::Pmi2Client {
    fn put(&mut self, key: &str, value: &[u8]) -> Result<()> {
        pmi2::Pmi2Client::put(self, key, value)
    }
    fn get(&mut self, key: &str) -> Result<Vec<u8>> {
        pmi2::Pmi2Client::get(self, key)
    }
    fn fence(&mut self) -> Result<()> {
        pmi2::Pmi2Client::fence(self)
    }
}

impl BootstrapEnv {
    /// The environment of a rank started by a PMI-2 launcher (Slurm): rank and size from
    /// `fullinit`; whether all ranks share this host from `PMI_process_mapping`; a job id,
    /// segment name and job secret chosen by rank 0 and published through the key-value
    /// space (one fence), since no `tmpirun` chose them. The secret is then as private as
    /// the launcher's key-value space.
    ///
    /// # Errors
    /// The PMI server fails, or publishes something malformed.
    pub fn from_pmi2(c: &mut pmi2::Pmi2Client) -> Result<Self> {
        let (rank, size) = (c.rank(), c.size());
        let one_host = c.job_attr("PMI_process_mapping")?.is_some_and(|m| pmi2::mapping_nodes(&m) == Some(1));
        if rank == 0 {
            let jobid = new_jobid()?;
            c.put("tmpi-jobid", jobid.as_bytes())?;
            c.put("tmpi-shm", new_shm_name(&jobid)?.as_bytes())?;
            c.put("tmpi-secret", JobSecret::new()?.to_hex().as_bytes())?;
        }
        c.fence()?;
        let text = |c: &mut pmi2::Pmi2Client, k: &str| -> Result<String> {
            String::from_utf8(c.get(k)?).map_err(|_| Error::Bootstrap(format!("PMI-2: {k} is not text")))
        };
        let jobid = text(c, "tmpi-jobid")?;
        let shm_name = text(c, "tmpi-shm")?;
        let secret = JobSecret::from_hex(&text(c, "tmpi-secret")?)?;
        if !is_hex16(&jobid) || !shm_name.starts_with(&format!("tmpi-{jobid}-")) {
            return Err(Error::Bootstrap(format!("PMI-2: rank 0 published a malformed job id {jobid:?} or segment {shm_name:?}")));
        }
        Ok(BootstrapEnv {
            rank,
            size,
            jobid,
            shm_name,
            local_rank: if one_host { rank } else { 0 },
            // Unknown when the job spans hosts: wire-up finds out which ranks share one.
            local_size: if one_host { size } else { 0 },
            bootstrap: PathBuf::new(),
            secret,
        })
    }
}

/// A rank's connection to the bootstrap service: synchronous, one request at a time.
#[derive(Debug)]
pub struct BootstrapClient {
    stream: ClientStream,
    rank: usize,
    size: usize,
    finalized: bool,
    buf: Vec<u8>,
}

impl BootstrapClient {
    /// Connects to the server at `path` as `rank` of a job of `size` ranks, proving it with
    /// the job's `secret`.
    ///
    /// # Errors
    /// [`Error::Io`] if the socket cannot be reached; [`Error::Bootstrap`] if the server
    /// refuses the rank (wrong secret, out of range, wrong size, already connected).
    pub fn connect(path: &Path, rank: usize, size: usize, secret: &JobSecret) -> Result<Self> {
        Self::connect_to(&BootstrapAddr::Unix(path.to_path_buf()), rank, size, secret)
    }

    /// As [`connect`](Self::connect), to a Unix socket or a TCP address.
    ///
    /// # Errors
    /// As [`connect`](Self::connect); a TCP address not reached within
    /// [`TCP_CONNECT_TIMEOUT`].
    pub fn connect_to(addr: &BootstrapAddr, rank: usize, size: usize, secret: &JobSecret) -> Result<Self> {
        if size == 0 || size > MAX_RANKS || rank >= size {
            return Err(Error::Bootstrap(format!("rank {rank} of {size}: not a valid rank")));
        }
        let stream = match addr {
            BootstrapAddr::Unix(path) => ClientStream::Unix(
                UnixStream::connect(path)
                    .map_err(|source| Error::Io { op: format!("connect to bootstrap socket {}", path.display()), source })?,
            ),
            BootstrapAddr::Tcp(a) => {
                let s = TcpStream::connect_timeout(a, TCP_CONNECT_TIMEOUT)
                    .map_err(|source| Error::Io { op: format!("connect to the bootstrap service at {a}"), source })?;
                let _ = s.set_nodelay(true);
                // A host of tmpirun that vanishes ends this connection within the peer timeout
                // (the runtime has refused a bad value before this; the default stands in).
                if let Some(t) = crate::tcp::alive::peer_timeout_from_env().unwrap_or(Some(crate::tcp::alive::DEFAULT_PEER_TIMEOUT)) {
                    let _ = crate::tcp::alive::set_keepalive(s.as_raw_fd(), t);
                    let _ = crate::tcp::alive::set_user_timeout(s.as_raw_fd(), t);
                }
                ClientStream::Tcp(s)
            }
        };
        let mut c = BootstrapClient { stream, rank, size, finalized: false, buf: Vec::new() };
        c.prove(secret, addr)?;
        Ok(c)
    }

    /// The hello: answers the server's challenge with the job's secret (which never travels)
    /// and checks the server's proof, within [`HELLO_TIMEOUT`] (a server that says nothing is
    /// not waited for forever).
    fn prove(&mut self, secret: &JobSecret, addr: &BootstrapAddr) -> Result<()> {
        use crate::auth::{self, Purpose};
        self.stream.set_read_timeout(Some(HELLO_TIMEOUT)).map_err(|e| self.lost("set a timeout on", e))?;
        let mut ch = [0u8; auth::CHALLENGE_LEN];
        self.stream.read_exact(&mut ch).map_err(|e| self.lost("read the challenge of", e))?;
        let (rank, size) = (self.rank as u32, self.size as u32);
        let nonce_c = auth::nonce()?;
        let ans = auth::answer(Purpose::Bootstrap, secret, &ch, rank, size, &nonce_c).ok_or_else(|| {
            Error::Bootstrap(format!(
                "rank {}: {} is no tmpi bootstrap service (bad challenge)",
                self.rank,
                addr.to_env().to_string_lossy()
            ))
        })?;
        let mut mac = [0u8; auth::MAC_LEN];
        mac.copy_from_slice(&ans[8 + auth::NONCE_LEN..]);
        let hello = Request::Hello { version: proto::VERSION, rank, size, nonce: nonce_c, mac };
        match self.call(&hello)? {
            Reply::Value(p) => {
                let proof: Option<[u8; auth::MAC_LEN]> = p.as_slice().try_into().ok();
                if !proof.is_some_and(|p| auth::check_accept(Purpose::Bootstrap, secret, &nonce_c, auth::SERVICE_RANK, size, &p)) {
                    return Err(Error::Bootstrap(format!(
                        "hello: {} did not prove the job secret (not this job's tmpirun)",
                        addr.to_env().to_string_lossy()
                    )));
                }
            }
            Reply::Err(m) => return Err(Error::Bootstrap(format!("hello: {m}"))),
            Reply::Ok => return Err(Error::Bootstrap("hello: the server gave no proof of the job secret".into())),
        }
        self.stream.set_read_timeout(None).map_err(|e| self.lost("clear the timeout of", e))
    }

    /// Reads the environment `tmpirun` set and connects; `None` when not started by
    /// `tmpirun` (`TMPI_RANK` unset: run as a singleton).
    ///
    /// # Errors
    /// A missing or malformed variable (the error names it); connection errors as
    /// [`connect`](Self::connect).
    pub fn from_env() -> Result<Option<(Self, BootstrapEnv)>> {
        let Some(env) = BootstrapEnv::from_env()? else {
            return Ok(None);
        };
        let c = Self::connect_to(&BootstrapAddr::parse(&env.bootstrap)?, env.rank, env.size, &env.secret)?;
        Ok(Some((c, env)))
    }

    /// This client's rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The job's size.
    pub fn size(&self) -> usize {
        self.size
    }

    /// Stores `value` under `key` for every rank to get (replacing an earlier value).
    ///
    /// # Errors
    /// A key that is empty or longer than [`proto::MAX_KEY_LEN`], a value larger than
    /// [`proto::MAX_VALUE_LEN`], a full store, or a lost server.
    pub fn put(&mut self, key: &str, value: &[u8]) -> Result<()> {
        self.call_ok(&Request::Put { key: key.into(), value: value.to_vec() }, "put")
    }

    /// The value of `key`, waiting until some rank has put it.
    ///
    /// # Errors
    /// A bad key, a lost server (`tmpirun` gone), or a get that can never be answered
    /// (every other rank finalized or is itself waiting).
    pub fn get(&mut self, key: &str) -> Result<Vec<u8>> {
        match self.call(&Request::Get { key: key.into() })? {
            Reply::Value(v) => Ok(v),
            Reply::Err(m) => Err(Error::Bootstrap(format!("get {key:?}: {m}"))),
            Reply::Ok => Err(Error::Bootstrap(format!("get {key:?}: server replied ok without a value"))),
        }
    }

    /// Waits until every rank of the job has called `fence`; afterwards every put made by
    /// any rank before its fence is visible to [`get`](Self::get).
    ///
    /// # Errors
    /// A rank finalized or died before reaching the fence, or the server is gone.
    pub fn fence(&mut self) -> Result<()> {
        self.call_ok(&Request::Fence, "fence")
    }

    /// Asks `tmpirun` to end the whole job with exit status `code` (`msg` is printed).
    ///
    /// # Errors
    /// The server is gone (the caller should then exit with `code` itself).
    pub fn abort(&mut self, code: i32, msg: &str) -> Result<()> {
        self.call_ok(&Request::Abort { code, message: msg.into() }, "abort")
    }

    /// Tells the server this rank is done; the connection is closed. Later calls fail.
    ///
    /// # Errors
    /// The server is gone.
    pub fn finalize(&mut self) -> Result<()> {
        self.call_ok(&Request::Finalize, "finalize")?;
        self.finalized = true;
        Ok(())
    }

    /// One round trip to the server's clock: (this host's `CLOCK_MONOTONIC` before the
    /// request, the server's in its answer, this host's after), in nanoseconds.
    ///
    /// # Errors
    /// The server is gone, or answered something else than its clock.
    pub fn clock(&mut self, now: impl Fn() -> u64) -> Result<(u64, u64, u64)> {
        let t0 = now();
        let reply = self.call(&Request::Clock)?;
        let t3 = now();
        match reply {
            Reply::Value(v) if v.len() == 8 => Ok((t0, u64::from_le_bytes(v.as_slice().try_into().unwrap_or([0; 8])), t3)),
            Reply::Err(m) => Err(Error::Bootstrap(format!("clock: {m}"))),
            _ => Err(Error::Bootstrap("clock: the server's answer is no clock".into())),
        }
    }

    /// Asks `tmpirun` to start the processes of `req` as a new job, and waits until it has:
    /// the answer is the bridge between the spawning communicator and them.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a request [`spawn::SpawnRequest::check`] refuses;
    /// [`Error::Bootstrap`] with `tmpirun`'s reason when it cannot start them (a program
    /// that does not exist, a job across hosts...), or a lost server.
    pub fn spawn(&mut self, req: spawn::SpawnRequest) -> Result<spawn::Bridge> {
        match self.call(&Request::Spawn(req))? {
            Reply::Value(v) => spawn::Bridge::parse(&String::from_utf8_lossy(&v)),
            Reply::Err(m) => Err(Error::Bootstrap(m)),
            Reply::Ok => Err(Error::Bootstrap("the server answered no bridge".into())),
        }
    }

    fn call_ok(&mut self, req: &Request, what: &str) -> Result<()> {
        match self.call(req)? {
            Reply::Ok => Ok(()),
            Reply::Err(m) => Err(Error::Bootstrap(format!("{what}: {m}"))),
            Reply::Value(_) => Err(Error::Bootstrap(format!("{what}: unexpected value reply"))),
        }
    }

    fn call(&mut self, req: &Request) -> Result<Reply> {
        if self.finalized {
            return Err(Error::Bootstrap("client already finalized".into()));
        }
        self.buf.clear();
        req.encode(&mut self.buf)?;
        self.send_all().map_err(|e| self.lost("send to", e))?;
        let mut len = [0u8; 4];
        self.stream.read_exact(&mut len).map_err(|e| self.lost("read from", e))?;
        let len = u32::from_le_bytes(len) as usize;
        proto::check_frame_len(len)?;
        self.buf.clear();
        self.buf.resize(len, 0);
        self.stream.read_exact(&mut self.buf).map_err(|e| self.lost("read from", e))?;
        Reply::decode(&self.buf)
    }

    /// Writes `self.buf` with `MSG_NOSIGNAL`: a vanished server is an error, never a
    /// SIGPIPE, even in a program that does not ignore that signal.
    fn send_all(&self) -> io::Result<()> {
        let mut off = 0;
        while off < self.buf.len() {
            let rest = &self.buf[off..];
            // SAFETY: sends from a live slice of `rest.len()` bytes on a socket we own.
            let n = unsafe { libc::send(self.stream.as_raw_fd(), rest.as_ptr().cast(), rest.len(), libc::MSG_NOSIGNAL) };
            if n < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            off += n as usize;
        }
        Ok(())
    }

    #[cold]
    fn lost(&self, what: &str, e: io::Error) -> Error {
        match e.kind() {
            io::ErrorKind::UnexpectedEof | io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset => {
                Error::Bootstrap(format!("rank {}: the bootstrap server closed the connection (tmpirun gone?)", self.rank))
            }
            _ => Error::Io { op: format!("rank {}: {what} the bootstrap server", self.rank), source: e },
        }
    }
}

/// The client's connection.
#[derive(Debug)]
enum ClientStream {
    Unix(UnixStream),
    Tcp(TcpStream),
}

impl Read for ClientStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            ClientStream::Unix(s) => s.read(buf),
            ClientStream::Tcp(s) => s.read(buf),
        }
    }
}

impl ClientStream {
    fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        match self {
            ClientStream::Unix(s) => s.set_read_timeout(t),
            ClientStream::Tcp(s) => s.set_read_timeout(t),
        }
    }
}

impl AsRawFd for ClientStream {
    fn as_raw_fd(&self) -> RawFd {
        match self {
            ClientStream::Unix(s) => s.as_raw_fd(),
            ClientStream::Tcp(s) => s.as_raw_fd(),
        }
    }
}

#[cfg(test)]
mod tests;
