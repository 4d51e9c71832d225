//! The key-value service `tmpirun` serves to the ranks of one job.
//!
//! One [`BootstrapServer`] listens on a Unix socket and drives every connection from one
//! thread, without blocking: its epoll descriptor ([`BootstrapServer::as_raw_fd`]) becomes
//! readable when there is work, and [`BootstrapServer::process`] does all of it and returns
//! what the launcher must know ([`ServerEvent`]: aborts, finalizes, lost ranks). Tests and
//! simple users run it in a thread instead with [`BootstrapServer::spawn`].
//!
//! Semantics:
//! - `put` stores a value (a later put of the same key replaces it) and wakes every `get`
//!   waiting for that key.
//! - `get` is answered as soon as the key exists, by whichever rank put it.
//! - `fence` is answered when every rank of the job has entered it; puts are acknowledged
//!   before the client goes on, so after a fence every earlier put is visible.
//! - A rank that finalizes or disconnects makes every pending and later fence fail (it can
//!   never complete). When every rank of the job has connected and each one still here is
//!   waiting in `get`/`fence` with nothing to answer it, no put can ever come: the waiters
//!   get an error instead of hanging forever.
//! - Each rank connects once; a second `hello` for the same rank is refused.
//!
//! Admission: a connection is a stranger until its `hello` proves the job's secret
//! ([`JobSecret`]): the server sends every new connection a fresh random challenge, and the
//! `hello` must carry `HMAC(secret, challenge, rank, size)` ([`crate::auth`], the scheme
//! the TCP fabric uses), checked in constant time before anything else in the frame is looked
//! at. The secret never travels, and an answer recorded on one connection is worth nothing on
//! another. The server answers an admitted `hello` with its own proof, so a rank knows it talks
//! to its job's `tmpirun`. Until then the server reads at most one `hello` frame from a
//! connection, and one that has not proven itself within [`HELLO_DEADLINE`] is closed. At most
//! [`STRANGERS_BEYOND_RANKS`] more connections than ranks still missing may wait to prove
//! themselves at once (the oldest gives way to a newcomer), and when the process runs out of
//! descriptors the oldest of them is closed to make room, or accepting pauses for a moment
//! ([`NOFILE_PAUSE`]): a flood of strangers can neither keep a rank out nor make the server
//! spin. With
//! [`BootstrapServer::admit_pids`], the connecting process (its `SO_PEERCRED` pid, taken at
//! `connect`) must also be one of the given processes or a descendant of one, and of the
//! server's own user (Unix-socket clients only). With [`BootstrapServer::listen_tcp`] the
//! server also accepts ranks of other hosts over TCP; they are admitted by the proof in
//! their `hello` alone. A stranger is closed and reported as [`ServerEvent::Refused`]; it
//! changes nothing else (no rank slot is taken, no fence is broken).
//!
//! Liveness: with [`BootstrapServer::set_peer_timeout`], TCP connections get kernel keepalive
//! and `TCP_USER_TIMEOUT` ([`crate::tcp::alive`]), so the connection of a rank whose host
//! vanished ends within that time: [`ServerEvent::Unreachable`] rather than
//! [`ServerEvent::Lost`]. [`BootstrapServer::unanswered_ranks`] names the ranks whose host owes
//! an answer right now.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::proto::{self, Reply, Request, HELLO_FRAME_LEN, MAX_FRAME};
use crate::auth::{self, Purpose};
use crate::error::{Error, Result};
use crate::secret::JobSecret;

/// How long a new connection has to prove the job secret in its `hello` before it is closed
/// as a stranger (and reported as [`ServerEvent::Refused`]). A rank sends its `hello` as soon
/// as it has read its challenge, so this is generous even for hundreds of ranks starting on a
/// loaded host.
pub const HELLO_DEADLINE: Duration = Duration::from_secs(10);

/// Connections waiting to prove themselves, beyond the ranks still missing, that the server
/// keeps at once; beyond that the oldest is closed for each newcomer.
pub const STRANGERS_BEYOND_RANKS: usize = 64;

/// How long accepting pauses when the process has no descriptor left and no stranger to
/// close (doubling up to [`NOFILE_PAUSE_MAX`] while it lasts).
pub const NOFILE_PAUSE: Duration = Duration::from_millis(50);
/// Longest pause of accepting for want of descriptors.
pub const NOFILE_PAUSE_MAX: Duration = Duration::from_secs(1);

/// Total bytes of keys and values the server keeps before refusing puts.
pub const MAX_STORE_BYTES: usize = 256 << 20;

/// Epoll token of the listening socket.
const LISTENER: u64 = u64::MAX;
/// Epoll token of the TCP listening socket ([`BootstrapServer::listen_tcp`]).
const TCP_LISTENER: u64 = u64::MAX - 1;

/// A client connection: over the Unix socket (local ranks) or TCP (ranks on other hosts).
enum ConnStream {
    Unix(UnixStream),
    Tcp(TcpStream),
}

impl ConnStream {
    fn set_nonblocking(&self) -> io::Result<()> {
        match self {
            ConnStream::Unix(s) => s.set_nonblocking(true),
            ConnStream::Tcp(s) => s.set_nonblocking(true),
        }
    }
}

impl Read for ConnStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            ConnStream::Unix(s) => s.read(buf),
            ConnStream::Tcp(s) => s.read(buf),
        }
    }
}

impl Write for ConnStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            ConnStream::Unix(s) => s.write(buf),
            ConnStream::Tcp(s) => s.write(buf),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl AsRawFd for ConnStream {
    fn as_raw_fd(&self) -> RawFd {
        match self {
            ConnStream::Unix(s) => s.as_raw_fd(),
            ConnStream::Tcp(s) => s.as_raw_fd(),
        }
    }
}

/// Something the launcher should know about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServerEvent {
    /// A rank connected and said hello.
    Connected {
        /// Its rank.
        rank: usize,
    },
    /// A rank asked to end the job.
    Abort {
        /// Its rank.
        rank: usize,
        /// The exit code it asked for.
        code: i32,
        /// Its message.
        message: String,
    },
    /// A rank finalized (and closed its connection).
    Finalized {
        /// Its rank.
        rank: usize,
    },
    /// A rank's connection closed without a finalize (it exited or crashed).
    Lost {
        /// Its rank.
        rank: usize,
    },
    /// A rank's TCP connection ended because its host stopped answering (keepalive or
    /// retransmissions unanswered for the peer timeout) or became unreachable: the host
    /// vanished (power loss, a cut network), or the network between it and `tmpirun` did.
    /// Otherwise as [`ServerEvent::Lost`].
    Unreachable {
        /// Its rank.
        rank: usize,
        /// What the kernel said (`Connection timed out`, `No route to host`...).
        error: String,
    },
    /// A rank asks for processes to be started (`MPI_Comm_spawn`): the launcher starts them,
    /// or not, and answers with [`BootstrapServer::answer_spawn`]. The rank waits until then.
    Spawn {
        /// Its rank.
        rank: usize,
        /// What to start.
        request: super::spawn::SpawnRequest,
    },
    /// A connection that did not prove to be a rank of this job (wrong or missing secret,
    /// a process that is not a rank nor a rank's descendant): closed, and nothing else
    /// changed.
    Refused {
        /// The connecting process, as the kernel saw it at `connect` (`SO_PEERCRED`).
        pid: Option<i32>,
        /// Why it was refused.
        reason: String,
    },
    /// A rank broke the protocol after proving itself (bad frame, bad hello); its connection
    /// was closed.
    Rejected {
        /// Rank, if it had said hello.
        rank: Option<usize>,
        /// What was wrong.
        reason: String,
    },
}

/// Where a rank stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RankState {
    /// Not connected yet.
    Absent,
    /// Connected on this token.
    Here(u64),
    /// Finalized.
    Finalized,
    /// Connection lost without finalize.
    Lost,
}

/// What a connection is waiting for.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Wait {
    None,
    Get(String),
    Fence,
    /// For the launcher's answer to a spawn.
    Spawn,
}

struct Conn {
    stream: ConnStream,
    /// The peer's pid from `SO_PEERCRED`, if the kernel told.
    pid: Option<i32>,
    rank: Option<usize>,
    inbuf: Vec<u8>,
    outbuf: Vec<u8>,
    wait: Wait,
    /// EPOLLOUT is registered.
    want_out: bool,
    /// Close once `outbuf` is flushed (after finalize or a refused hello).
    close_after_flush: bool,
    /// The nonce of the challenge this connection was sent (its `hello` answers it).
    nonce: [u8; auth::NONCE_LEN],
    /// When it was accepted (a stranger has [`HELLO_DEADLINE`] to prove itself).
    since: Instant,
}

/// The bootstrap key-value server of one job.
pub struct BootstrapServer {
    listener: UnixListener,
    /// The TCP listener for ranks on other hosts, once [`BootstrapServer::listen_tcp`] made it.
    tcp: Option<TcpListener>,
    path: PathBuf,
    epoll: OwnedFd,
    size: usize,
    secret: JobSecret,
    /// Processes (and their descendants) allowed to connect; `None`: any of this user.
    admit: Option<Vec<i32>>,
    /// Liveness of TCP connections ([`BootstrapServer::set_peer_timeout`]).
    peer_timeout: Option<Duration>,
    /// Accepting pauses until then, for want of descriptors (listeners out of the epoll set).
    paused: Option<Instant>,
    /// The length of the next such pause.
    pause_len: Duration,
    conns: HashMap<u64, Conn>,
    next_token: u64,
    ranks: Vec<RankState>,
    ever_connected: usize,
    store: HashMap<String, Vec<u8>>,
    store_bytes: usize,
    /// Tokens waiting for each missing key.
    get_waiters: HashMap<String, Vec<u64>>,
    fence_waiters: Vec<u64>,
    /// Why fences can no longer complete, once a rank has left.
    fence_broken: Option<String>,
    /// Connections whose wait ended: parse their buffered input again.
    resume: Vec<u64>,
    events: Vec<ServerEvent>,
}

/// This host's `CLOCK_MONOTONIC` in nanoseconds (the answer to [`Request::Clock`]).
fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid, writable timespec for the call; on failure it stays zeroed.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64).wrapping_mul(1_000_000_000).wrapping_add(ts.tv_nsec as u64)
}

fn io_err(op: impl Into<String>, source: io::Error) -> Error {
    Error::Io { op: op.into(), source }
}

impl BootstrapServer {
    /// Listens on a new Unix socket at `path` for a job of `size` ranks, admitting clients
    /// that prove they know `secret`.
    ///
    /// The caller chooses a path in a directory only it can reach (`tmpirun` uses a private
    /// 0700 directory); the socket file is removed when the server is dropped.
    ///
    /// # Errors
    /// `size` of zero; the socket or epoll set cannot be created (e.g. the path exists).
    pub fn bind(path: &Path, size: usize, secret: JobSecret) -> Result<Self> {
        if size == 0 || size > u32::MAX as usize {
            return Err(Error::InvalidArgument(format!("bootstrap job size {size}")));
        }
        let listener = UnixListener::bind(path).map_err(|e| io_err(format!("bind {}", path.display()), e))?;
        listener.set_nonblocking(true).map_err(|e| io_err("bootstrap listener nonblocking", e))?;
        // SAFETY: epoll_create1 takes no pointers; the result is checked before use.
        let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if fd < 0 {
            return Err(Error::last_os("epoll_create1"));
        }
        // SAFETY: `fd` is a new descriptor that nothing else owns.
        let epoll = unsafe { OwnedFd::from_raw_fd(fd) };
        let server = BootstrapServer {
            listener,
            tcp: None,
            path: path.to_path_buf(),
            epoll,
            size,
            secret,
            admit: None,
            peer_timeout: None,
            paused: None,
            pause_len: NOFILE_PAUSE,
            conns: HashMap::new(),
            next_token: 0,
            ranks: vec![RankState::Absent; size],
            ever_connected: 0,
            store: HashMap::new(),
            store_bytes: 0,
            get_waiters: HashMap::new(),
            fence_waiters: Vec::new(),
            fence_broken: None,
            resume: Vec::new(),
            events: Vec::new(),
        };
        server.ctl(libc::EPOLL_CTL_ADD, server.listener.as_raw_fd(), libc::EPOLLIN as u32, LISTENER)?;
        Ok(server)
    }

    /// From now on, admits only connections from these processes or their descendants (and
    /// of this process's user): `tmpirun` passes the pids of the ranks it spawned. The check
    /// is made when a connection is accepted, on the pid the kernel recorded at `connect`.
    pub fn admit_pids(&mut self, pids: Vec<i32>) {
        self.admit = Some(pids);
    }

    /// Bounds how long a rank's host may leave its TCP connection unanswered
    /// (`TMPI_PEER_TIMEOUT`): kernel keepalive and `TCP_USER_TIMEOUT` on every TCP connection
    /// accepted from now on, so that one whose host vanished ends within `timeout`
    /// ([`ServerEvent::Unreachable`]). `None`: no bound (the kernel's defaults).
    pub fn set_peer_timeout(&mut self, timeout: Option<Duration>) {
        self.peer_timeout = timeout;
    }

    /// Ranks connected over TCP whose host owes an answer now: data or keepalive probes sent
    /// and not acknowledged yet ([`crate::tcp::alive::Exchange::owed`]). A host that vanished
    /// is in this list until its connection ends ([`ServerEvent::Unreachable`]); a live one
    /// only for a round trip.
    pub fn unanswered_ranks(&self) -> Vec<usize> {
        let mut v: Vec<usize> = self
            .conns
            .values()
            .filter(|c| matches!(c.stream, ConnStream::Tcp(_)))
            .filter_map(|c| c.rank.filter(|_| crate::tcp::alive::exchange(c.stream.as_raw_fd()).is_some_and(|x| x.owed())))
            .collect();
        v.sort_unstable();
        v
    }

    /// When [`process`](Self::process) has timed work to do (a stranger's deadline, the end
    /// of a pause in accepting), if ever: wait no longer than this.
    pub fn next_wake(&self) -> Option<Instant> {
        let oldest = self.conns.values().filter(|c| c.rank.is_none() && !c.close_after_flush).map(|c| c.since).min();
        let expiry = oldest.map(|t| t + HELLO_DEADLINE + Duration::from_millis(1));
        [expiry, self.paused].into_iter().flatten().min()
    }

    /// Also listens on TCP at `ip` (a port the kernel chooses), for ranks on other hosts;
    /// returns the address to give them (`TMPI_BOOTSTRAP=tcp:ADDR:PORT`).
    ///
    /// A TCP client is admitted by its `hello` alone: it must carry the job's secret, checked
    /// before anything else in it ([`BootstrapServer::admit_pids`] cannot apply: the kernel
    /// knows no pid for a TCP peer). `ip` must be a particular address, never the wildcard.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for the wildcard address or a second call; the socket
    /// cannot be bound.
    pub fn listen_tcp(&mut self, ip: IpAddr) -> Result<SocketAddr> {
        if ip.is_unspecified() {
            return Err(Error::InvalidArgument("the bootstrap service does not listen on the wildcard address".into()));
        }
        if self.tcp.is_some() {
            return Err(Error::InvalidArgument("the bootstrap service already listens on TCP".into()));
        }
        let l = TcpListener::bind(SocketAddr::new(ip, 0)).map_err(|e| io_err(format!("bind the bootstrap service to {ip}"), e))?;
        l.set_nonblocking(true).map_err(|e| io_err("bootstrap TCP listener nonblocking", e))?;
        let addr = l.local_addr().map_err(|e| io_err("bootstrap TCP listener address", e))?;
        self.ctl(libc::EPOLL_CTL_ADD, l.as_raw_fd(), libc::EPOLLIN as u32, TCP_LISTENER)?;
        self.tcp = Some(l);
        Ok(addr)
    }

    /// The socket's path (what `TMPI_BOOTSTRAP` holds).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Number of ranks of the job.
    pub fn size(&self) -> usize {
        self.size
    }

    fn ctl(&self, op: i32, fd: RawFd, events: u32, token: u64) -> Result<()> {
        let mut ev = libc::epoll_event { events, u64: token };
        // SAFETY: both descriptors are open (owned by `self`), and `ev` is a valid
        // epoll_event that lives for the duration of the call.
        let rc = unsafe { libc::epoll_ctl(self.epoll.as_raw_fd(), op, fd, &mut ev) };
        if rc < 0 {
            return Err(Error::last_os("epoll_ctl (bootstrap)"));
        }
        Ok(())
    }

    /// Does all the work that is ready without blocking and returns the events since the
    /// last call.
    ///
    /// # Errors
    /// Only failures of the server itself (epoll); a misbehaving client is disconnected and
    /// reported as [`ServerEvent::Rejected`] instead.
    pub fn process(&mut self) -> Result<Vec<ServerEvent>> {
        if self.paused.is_some_and(|p| Instant::now() >= p) {
            self.resume_accepting();
        }
        let mut evs = [libc::epoll_event { events: 0, u64: 0 }; 64];
        loop {
            // SAFETY: `evs` is a writable array of `evs.len()` epoll_event; timeout 0.
            let n = unsafe { libc::epoll_wait(self.epoll.as_raw_fd(), evs.as_mut_ptr(), evs.len() as i32, 0) };
            if n < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(io_err("epoll_wait (bootstrap)", e));
            }
            let n = n as usize;
            for ev in &evs[..n] {
                let (token, flags) = (ev.u64, ev.events);
                if token == LISTENER {
                    self.accept_all();
                } else if token == TCP_LISTENER {
                    self.accept_tcp();
                } else {
                    self.service(token, flags);
                }
            }
            self.drain_resume();
            self.check_deadlock();
            self.drain_resume();
            if n < evs.len() {
                break;
            }
        }
        if self.conns.values().any(|c| c.rank.is_none()) {
            self.expire_strangers();
        }
        Ok(std::mem::take(&mut self.events))
    }

    /// Blocks up to `timeout` (forever when `None`) until there is work, then does it.
    ///
    /// # Errors
    /// As [`process`](Self::process).
    pub fn wait(&mut self, timeout: Option<Duration>) -> Result<Vec<ServerEvent>> {
        let ms = timeout.map_or(-1, |d| d.as_millis().min(i32::MAX as u128) as i32);
        let mut pfd = libc::pollfd { fd: self.epoll.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        // SAFETY: `pfd` is one valid pollfd for the duration of the call.
        let rc = unsafe { libc::poll(&mut pfd, 1, ms) };
        if rc < 0 && io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
            return Err(Error::last_os("poll (bootstrap)"));
        }
        self.process()
    }

    /// Runs the server in a new thread until the returned handle is stopped or dropped.
    ///
    /// # Errors
    /// The stop descriptor or the thread cannot be created.
    pub fn spawn(mut self) -> Result<ServerThread> {
        // SAFETY: eventfd takes no pointers; the result is checked.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(Error::last_os("eventfd"));
        }
        // SAFETY: `fd` is a new descriptor that nothing else owns.
        let stop = std::sync::Arc::new(unsafe { OwnedFd::from_raw_fd(fd) });
        let stop2 = stop.clone();
        let (tx, rx) = mpsc::channel();
        let join = std::thread::Builder::new()
            .name("tmpi-bootstrap".into())
            .spawn(move || -> Result<()> {
                loop {
                    let mut pfds = [
                        libc::pollfd { fd: self.epoll.as_raw_fd(), events: libc::POLLIN, revents: 0 },
                        libc::pollfd { fd: stop2.as_raw_fd(), events: libc::POLLIN, revents: 0 },
                    ];
                    // Wakes for timed work (strangers past HELLO_DEADLINE, a pause in accepting),
                    // and each second at least.
                    let ms = self.next_wake().map_or(1000, |w| w.saturating_duration_since(Instant::now()).as_millis().clamp(1, 1000));
                    // SAFETY: `pfds` is an array of 2 valid pollfd.
                    let rc = unsafe { libc::poll(pfds.as_mut_ptr(), 2, ms as libc::c_int) };
                    if rc < 0 && io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
                        return Err(Error::last_os("poll (bootstrap thread)"));
                    }
                    if pfds[1].revents != 0 {
                        return Ok(());
                    }
                    for ev in self.process()? {
                        // The receiver may be gone; the server keeps serving regardless.
                        let _ = tx.send(ev);
                    }
                }
            })
            .map_err(|e| io_err("spawn bootstrap thread", e))?;
        Ok(ServerThread { events: rx, stop, join: Some(join) })
    }

    fn accept_all(&mut self) {
        loop {
            match self.listener.accept() {
                Ok((stream, _)) => {
                    let cred = peer_cred(&stream);
                    if let Some(why) = self.stranger_process(cred) {
                        self.events.push(ServerEvent::Refused { pid: cred.map(|c| c.pid), reason: why });
                        continue; // dropping the stream closes it
                    }
                    self.add_conn(ConnStream::Unix(stream), cred.map(|c| c.pid));
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if out_of_descriptors(&e) => {
                    if !self.make_room() {
                        return;
                    }
                }
                // WouldBlock: all accepted. Other errors are retried on the next readiness;
                // nothing to tear down.
                Err(_) => return,
            }
        }
    }

    /// Out of descriptors: closes the oldest stranger to make room (true), or, with none to
    /// close, takes the listeners out of the epoll set for a pause (false): a connection waiting
    /// in the backlog would otherwise keep them readable and the server spinning.
    fn make_room(&mut self) -> bool {
        if self.refuse_oldest_stranger("tmpirun ran out of file descriptors") {
            return true;
        }
        let _ = self.ctl(libc::EPOLL_CTL_DEL, self.listener.as_raw_fd(), 0, LISTENER);
        if let Some(l) = &self.tcp {
            let _ = self.ctl(libc::EPOLL_CTL_DEL, l.as_raw_fd(), 0, TCP_LISTENER);
        }
        self.paused = Some(Instant::now() + self.pause_len);
        self.pause_len = (self.pause_len * 2).min(NOFILE_PAUSE_MAX);
        false
    }

    /// Puts the listeners back into the epoll set after a pause.
    fn resume_accepting(&mut self) {
        self.paused = None;
        let _ = self.ctl(libc::EPOLL_CTL_ADD, self.listener.as_raw_fd(), libc::EPOLLIN as u32, LISTENER);
        if let Some(l) = &self.tcp {
            let _ = self.ctl(libc::EPOLL_CTL_ADD, l.as_raw_fd(), libc::EPOLLIN as u32, TCP_LISTENER);
        }
    }

    /// Closes the stranger (a connection without a proven `hello`) that has waited longest, if
    /// there is one; whether one was closed.
    fn refuse_oldest_stranger(&mut self, why: &str) -> bool {
        let oldest = self.conns.iter().filter(|(_, c)| c.rank.is_none() && !c.close_after_flush).min_by_key(|(_, c)| c.since);
        let Some((&t, c)) = oldest else { return false };
        let pid = c.pid;
        self.refuse(t, pid, format!("{why}: the connection that waited longest without a hello is closed"));
        true
    }

    /// Accepts TCP clients: strangers until their `hello` proves the job secret.
    fn accept_tcp(&mut self) {
        loop {
            let Some(l) = &self.tcp else { return };
            match l.accept() {
                Ok((stream, _)) => {
                    let _ = stream.set_nodelay(true);
                    if let Some(t) = self.peer_timeout {
                        let _ = crate::tcp::alive::set_keepalive(stream.as_raw_fd(), t);
                        let _ = crate::tcp::alive::set_user_timeout(stream.as_raw_fd(), t);
                    }
                    self.add_conn(ConnStream::Tcp(stream), None);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if out_of_descriptors(&e) => {
                    if !self.make_room() {
                        return;
                    }
                }
                Err(_) => return,
            }
        }
    }

    /// Takes a new connection and sends it its challenge. Beyond the cap on strangers, the
    /// oldest one is closed first.
    fn add_conn(&mut self, stream: ConnStream, pid: Option<i32>) {
        if stream.set_nonblocking().is_err() {
            return;
        }
        let missing = self.ranks.iter().filter(|r| **r == RankState::Absent).count();
        let strangers = self.conns.values().filter(|c| c.rank.is_none() && !c.close_after_flush).count();
        if strangers >= missing + STRANGERS_BEYOND_RANKS {
            self.refuse_oldest_stranger("too many connections waiting to prove themselves");
        }
        let Ok(nonce) = auth::nonce() else {
            // No randomness: the connection cannot be challenged, so it is not taken.
            self.events.push(ServerEvent::Refused { pid, reason: "no random nonce for its challenge (getrandom failed)".into() });
            return;
        };
        self.pause_len = NOFILE_PAUSE;
        let token = self.next_token;
        self.next_token += 1;
        if self.ctl(libc::EPOLL_CTL_ADD, stream.as_raw_fd(), libc::EPOLLIN as u32, token).is_err() {
            return;
        }
        self.conns.insert(
            token,
            Conn {
                stream,
                pid,
                rank: None,
                inbuf: Vec::new(),
                outbuf: auth::challenge(Purpose::Bootstrap, &nonce).to_vec(),
                wait: Wait::None,
                want_out: false,
                close_after_flush: false,
                nonce,
                since: Instant::now(),
            },
        );
        self.flush(token);
    }

    /// Closes the connections that have not proven themselves in time.
    fn expire_strangers(&mut self) {
        let now = Instant::now();
        let late: Vec<(u64, Option<i32>)> = self
            .conns
            .iter()
            .filter(|(_, c)| c.rank.is_none() && !c.close_after_flush && now.duration_since(c.since) > HELLO_DEADLINE)
            .map(|(&t, c)| (t, c.pid))
            .collect();
        for (t, pid) in late {
            self.refuse(t, pid, format!("no hello within {} s", HELLO_DEADLINE.as_secs()));
        }
    }

    /// Handles readiness of one connection.
    fn service(&mut self, token: u64, flags: u32) {
        if flags & libc::EPOLLOUT as u32 != 0 {
            self.flush(token);
        }
        if flags & (libc::EPOLLIN | libc::EPOLLHUP | libc::EPOLLERR) as u32 != 0 {
            let mut eof = false;
            let mut unreachable = None;
            if let Some(c) = self.conns.get_mut(&token) {
                let mut chunk = [0u8; 16 * 1024];
                loop {
                    match c.stream.read(&mut chunk) {
                        Ok(0) => {
                            eof = true;
                            break;
                        }
                        Ok(n) => {
                            c.inbuf.extend_from_slice(&chunk[..n]);
                            // Before its hello, a client has not proven anything: read no
                            // more than one hello frame from it.
                            if c.rank.is_none() && c.inbuf.len() > HELLO_FRAME_LEN {
                                let (pid, len) = (c.pid, c.inbuf.len());
                                self.refuse(token, pid, format!("sent {len} bytes before proving itself with a hello"));
                                return;
                            }
                            // An honest client has at most one request outstanding.
                            if c.inbuf.len() > 2 * (MAX_FRAME + 4) {
                                let rank = c.rank;
                                self.reject(token, rank, "client sent more than it may have outstanding".into());
                                return;
                            }
                        }
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                        Err(e) => {
                            if crate::tcp::alive::is_unreachable(&e) {
                                unreachable = Some(e.to_string());
                            }
                            eof = true;
                            break;
                        }
                    }
                }
            }
            self.parse(token);
            if let Some(error) = unreachable {
                self.close_unreachable(token, error);
            } else if eof {
                self.close(token);
            }
        }
    }

    /// Handles the buffered requests of a connection while it is not waiting.
    fn parse(&mut self, token: u64) {
        loop {
            let Some(c) = self.conns.get_mut(&token) else {
                return;
            };
            if c.wait != Wait::None || c.close_after_flush || !c.outbuf.is_empty() {
                return;
            }
            let (rank, pid) = (c.rank, c.pid);
            let body = match proto::take_frame(&mut c.inbuf) {
                Ok(Some(b)) => b,
                Ok(None) => return,
                Err(e) if rank.is_none() => return self.refuse(token, pid, e.to_string()),
                Err(e) => return self.reject(token, rank, e.to_string()),
            };
            match Request::decode(&body) {
                Ok(req) => self.handle(token, req),
                Err(e) if rank.is_none() => return self.refuse(token, pid, e.to_string()),
                Err(e) => return self.reject(token, rank, e.to_string()),
            }
        }
    }

    fn handle(&mut self, token: u64, req: Request) {
        let Some(rank) = self.conns.get(&token).and_then(|c| c.rank) else {
            return self.hello(token, req);
        };
        match req {
            Request::Hello { .. } => self.reject(token, Some(rank), "second hello".into()),
            Request::Put { key, value } => self.put(token, key, value),
            Request::Get { key } => self.get(token, key),
            Request::Fence => self.fence(token),
            Request::Abort { code, message } => {
                self.events.push(ServerEvent::Abort { rank, code, message });
                self.reply(token, Reply::Ok);
            }
            Request::Finalize => {
                self.ranks[rank] = RankState::Finalized;
                self.events.push(ServerEvent::Finalized { rank });
                self.break_fences(format!("fence cannot complete: rank {rank} has finalized"));
                self.reply(token, Reply::Ok);
                if let Some(c) = self.conns.get_mut(&token) {
                    c.close_after_flush = true;
                }
                self.flush(token);
            }
            Request::Clock => self.reply(token, Reply::Value(monotonic_ns().to_le_bytes().to_vec())),
            Request::Spawn(request) => {
                if let Some(c) = self.conns.get_mut(&token) {
                    c.wait = Wait::Spawn;
                }
                self.events.push(ServerEvent::Spawn { rank, request });
            }
        }
    }

    /// Stores `value` under `key` for the rank on `token` (unless the store would overflow)
    /// and answers the gets waiting for it.
    fn put(&mut self, token: u64, key: String, value: Vec<u8>) {
        let old = self.store.get(&key).map_or(0, |v| key.len() + v.len());
        let new_total = self.store_bytes - old + key.len() + value.len();
        if new_total > MAX_STORE_BYTES {
            return self.reply(token, Reply::Err(format!("store full ({MAX_STORE_BYTES} bytes of keys and values)")));
        }
        self.store_bytes = new_total;
        if let Some(waiters) = self.get_waiters.remove(&key) {
            for w in waiters {
                self.end_wait(w, Reply::Value(value.clone()));
            }
        }
        self.store.insert(key, value);
        self.reply(token, Reply::Ok);
    }

    /// Answers a get of `key` at once, or when a rank puts it.
    fn get(&mut self, token: u64, key: String) {
        if let Some(v) = self.store.get(&key) {
            let v = v.clone();
            self.reply(token, Reply::Value(v));
        } else {
            self.get_waiters.entry(key.clone()).or_default().push(token);
            if let Some(c) = self.conns.get_mut(&token) {
                c.wait = Wait::Get(key);
            }
        }
    }

    /// Enters the rank on `token` into the fence, which ends when every rank is in it (or
    /// fails at once when a rank left).
    fn fence(&mut self, token: u64) {
        if let Some(why) = &self.fence_broken {
            let why = why.clone();
            return self.reply(token, Reply::Err(why));
        }
        if let Some(c) = self.conns.get_mut(&token) {
            c.wait = Wait::Fence;
        }
        self.fence_waiters.push(token);
        if self.fence_waiters.len() == self.size {
            for w in std::mem::take(&mut self.fence_waiters) {
                self.end_wait(w, Reply::Ok);
            }
        }
    }

    /// The launcher knows rank `rank` will never connect (its process ended first): it
    /// counts as lost, and the fences, which can no longer complete, fail with `why` (as do
    /// gets that only waiting ranks remain to answer). Nothing changes for a rank that
    /// connected.
    pub fn mark_gone(&mut self, rank: usize, why: &str) {
        if self.ranks.get(rank) != Some(&RankState::Absent) {
            return;
        }
        self.ranks[rank] = RankState::Lost;
        self.ever_connected += 1;
        self.break_fences(format!("fence cannot complete: {why}"));
        self.check_deadlock();
        self.drain_resume();
    }

    /// Answers rank `rank`'s spawn ([`ServerEvent::Spawn`]): the bridge's text when the
    /// processes started, else why not. Nothing happens if the rank is no longer waiting
    /// for it (its connection closed meanwhile).
    pub fn answer_spawn(&mut self, rank: usize, answer: std::result::Result<String, String>) {
        let Some(&RankState::Here(token)) = self.ranks.get(rank) else { return };
        if self.conns.get(&token).is_some_and(|c| c.wait == Wait::Spawn) {
            self.end_wait(token, answer.map_or_else(Reply::Err, |b| Reply::Value(b.into_bytes())));
            self.drain_resume();
        }
    }

    fn hello(&mut self, token: u64, req: Request) {
        let pid = self.conns.get(&token).and_then(|c| c.pid);
        let Request::Hello { version, rank, size, nonce, mac } = req else {
            return self.refuse(token, pid, "first request is not hello".into());
        };
        // The proof first: nothing else a stranger says is worth an answer.
        let Some(nonce_a) = self.conns.get(&token).map(|c| c.nonce) else { return };
        let mut ans = [0u8; auth::ANSWER_LEN];
        ans[..4].copy_from_slice(&rank.to_le_bytes());
        ans[4..8].copy_from_slice(&size.to_le_bytes());
        ans[8..8 + auth::NONCE_LEN].copy_from_slice(&nonce);
        ans[8 + auth::NONCE_LEN..].copy_from_slice(&mac);
        if auth::verify_answer(Purpose::Bootstrap, &self.secret, &nonce_a, &ans).is_none() {
            return self.refuse(token, pid, "wrong job secret (its hello does not answer this connection's challenge)".into());
        }
        let proof = auth::accept_proof(Purpose::Bootstrap, &self.secret, &nonce, auth::SERVICE_RANK, size);
        let (rank, size) = (rank as usize, size as usize);
        let refuse = if version != proto::VERSION {
            Some(format!("protocol version {version}, server speaks {}", proto::VERSION))
        } else if size != self.size {
            Some(format!("client says the job has {size} ranks, it has {}", self.size))
        } else if rank >= self.size {
            Some(format!("rank {rank} out of range for {} ranks", self.size))
        } else if self.ranks[rank] != RankState::Absent {
            Some(format!("rank {rank} already connected"))
        } else {
            None
        };
        if let Some(why) = refuse {
            self.events.push(ServerEvent::Rejected { rank: None, reason: why.clone() });
            self.reply(token, Reply::Err(why));
            if let Some(c) = self.conns.get_mut(&token) {
                c.close_after_flush = true;
            }
            return self.flush(token);
        }
        if let Some(c) = self.conns.get_mut(&token) {
            c.rank = Some(rank);
        }
        self.ranks[rank] = RankState::Here(token);
        self.ever_connected += 1;
        self.events.push(ServerEvent::Connected { rank });
        self.reply(token, Reply::Value(proof.to_vec()));
    }

    /// Fails every pending fence and every later one.
    fn break_fences(&mut self, why: String) {
        if self.fence_broken.is_none() {
            self.fence_broken = Some(why.clone());
        }
        for w in std::mem::take(&mut self.fence_waiters) {
            self.end_wait(w, Reply::Err(why.clone()));
        }
    }

    /// If every rank has connected and every one still here is waiting, nothing can ever
    /// answer them: fail the waits.
    fn check_deadlock(&mut self) {
        if self.ever_connected < self.size {
            return;
        }
        let mut waiting = 0;
        for st in &self.ranks {
            match *st {
                RankState::Here(t) => match self.conns.get(&t) {
                    // The launcher answers a spawn: that rank will go on.
                    Some(c) if c.wait == Wait::Spawn => return,
                    Some(c) if c.wait != Wait::None => waiting += 1,
                    _ => return,
                },
                RankState::Absent => return,
                RankState::Finalized | RankState::Lost => {}
            }
        }
        if waiting == 0 {
            return;
        }
        let keys: Vec<String> = self.get_waiters.keys().cloned().collect();
        for (key, ws) in std::mem::take(&mut self.get_waiters) {
            for w in ws {
                self.end_wait(w, Reply::Err(format!("get {key:?}: no rank can put it (every remaining rank is waiting)")));
            }
        }
        let why = format!("fence cannot complete: other ranks are waiting in get ({keys:?})");
        for w in std::mem::take(&mut self.fence_waiters) {
            self.end_wait(w, Reply::Err(why.clone()));
        }
    }

    /// Answers a held `get`/`fence` and lets the connection's next request through.
    fn end_wait(&mut self, token: u64, reply: Reply) {
        if let Some(c) = self.conns.get_mut(&token) {
            c.wait = Wait::None;
            self.reply(token, reply);
            self.resume.push(token);
        }
    }

    fn drain_resume(&mut self) {
        while let Some(t) = self.resume.pop() {
            self.parse(t);
        }
    }

    fn reply(&mut self, token: u64, reply: Reply) {
        if let Some(c) = self.conns.get_mut(&token) {
            reply.encode(&mut c.outbuf);
            self.flush(token);
        }
    }

    /// Writes what it can of a connection's output; arms EPOLLOUT for the rest.
    fn flush(&mut self, token: u64) {
        let Some(c) = self.conns.get_mut(&token) else {
            return;
        };
        let mut dead = false;
        while !c.outbuf.is_empty() {
            match c.stream.write(&c.outbuf) {
                Ok(0) => {
                    dead = true;
                    break;
                }
                Ok(n) => {
                    c.outbuf.drain(..n);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => {
                    dead = true;
                    break;
                }
            }
        }
        if dead {
            return self.close(token);
        }
        let want_out = !c.outbuf.is_empty();
        if c.outbuf.is_empty() && c.close_after_flush {
            return self.close(token);
        }
        if want_out != c.want_out {
            c.want_out = want_out;
            let fd = c.stream.as_raw_fd();
            let ev = libc::EPOLLIN as u32 | if want_out { libc::EPOLLOUT as u32 } else { 0 };
            if self.ctl(libc::EPOLL_CTL_MOD, fd, ev, token).is_err() {
                return self.close(token);
            }
        }
        if !want_out {
            // Output drained: requests held back behind it may go on.
            self.resume.push(token);
        }
    }

    /// Closes a connection that did not prove to be a rank of this job.
    /// It gets one error reply, written if the socket takes it at once (a rank started with
    /// a wrong `TMPI_JOB_SECRET` then says why), and is never read from again.
    fn refuse(&mut self, token: u64, pid: Option<i32>, reason: String) {
        if let Some(c) = self.conns.get_mut(&token) {
            let mut out = Vec::new();
            Reply::Err(format!("refused: {reason}")).encode(&mut out);
            let _ = c.stream.write(&out);
        }
        self.events.push(ServerEvent::Refused { pid, reason });
        self.close(token);
    }

    /// Why a connecting process may not talk to this server, if it may not: another user,
    /// or (with [`BootstrapServer::admit_pids`]) neither a rank nor a rank's descendant.
    fn stranger_process(&self, cred: Option<libc::ucred>) -> Option<String> {
        let Some(admit) = &self.admit else {
            return None;
        };
        let Some(cred) = cred else {
            return Some("the kernel did not say who connected (SO_PEERCRED)".into());
        };
        // SAFETY: geteuid takes no arguments and cannot fail.
        let me = unsafe { libc::geteuid() };
        if cred.uid != me {
            return Some(format!("process {} of user {} is not of this job's user {me}", cred.pid, cred.uid));
        }
        if descends_from(cred.pid, admit) {
            None
        } else {
            Some(format!("process {} is not a rank of this job nor started by one", cred.pid))
        }
    }

    fn reject(&mut self, token: u64, rank: Option<usize>, reason: String) {
        self.events.push(ServerEvent::Rejected { rank, reason });
        self.close(token);
    }

    /// Drops the connection of a rank whose host stopped answering: as [`Self::close`], but
    /// reported as [`ServerEvent::Unreachable`].
    fn close_unreachable(&mut self, token: u64, error: String) {
        let Some(rank) = self.conns.get(&token).and_then(|c| c.rank) else {
            return self.close(token);
        };
        if self.ranks[rank] == RankState::Here(token) {
            // Recorded first, so that `close` does not report the rank as merely lost.
            self.ranks[rank] = RankState::Lost;
            self.events.push(ServerEvent::Unreachable { rank, error });
            self.break_fences(format!("fence cannot complete: the host of rank {rank} stopped answering"));
        }
        self.close(token);
    }

    /// Drops a connection and everything it was waiting for.
    fn close(&mut self, token: u64) {
        let Some(c) = self.conns.remove(&token) else {
            return;
        };
        // Closing the descriptor removes it from the epoll set.
        match c.wait {
            Wait::Get(key) => {
                if let Some(ws) = self.get_waiters.get_mut(&key) {
                    ws.retain(|&w| w != token);
                    if ws.is_empty() {
                        self.get_waiters.remove(&key);
                    }
                }
            }
            Wait::Fence => self.fence_waiters.retain(|&w| w != token),
            Wait::None | Wait::Spawn => {}
        }
        if let Some(rank) = c.rank {
            if self.ranks[rank] == RankState::Here(token) {
                self.ranks[rank] = RankState::Lost;
                self.events.push(ServerEvent::Lost { rank });
                self.break_fences(format!("fence cannot complete: rank {rank} is gone"));
            }
        }
    }
}

/// Whether an `accept` failed for want of descriptors or kernel memory (retrying at once would
/// spin: the connection stays queued and the listener readable).
fn out_of_descriptors(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM))
}

/// The credentials the kernel recorded when the peer of `stream` connected.
fn peer_cred(stream: &UnixStream) -> Option<libc::ucred> {
    let mut cred = libc::ucred { pid: 0, uid: 0, gid: 0 };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `cred`, a live ucred, and updates
    // `len`; the descriptor is open (owned by `stream`).
    let rc =
        unsafe { libc::getsockopt(stream.as_raw_fd(), libc::SOL_SOCKET, libc::SO_PEERCRED, std::ptr::addr_of_mut!(cred).cast(), &mut len) };
    (rc == 0 && len as usize == std::mem::size_of::<libc::ucred>() && cred.pid > 0).then_some(cred)
}

/// The parent pid in `/proc/<pid>/stat` (`None` when the process is gone).
fn parent_of(pid: i32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name, which is in parentheses and may contain anything.
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut f = rest.split_ascii_whitespace();
    let _state = f.next()?;
    f.next()?.parse().ok()
}

/// [`parent_of`] for the tests of this module.
#[cfg(test)]
pub(crate) fn parent_of_for_tests(pid: i32) -> Option<i32> {
    parent_of(pid)
}

/// Whether `pid` is one of `roots` or descends from one (walking parent pids; at most 256
/// steps, and a process that exits meanwhile counts as not descending).
pub(crate) fn descends_from(pid: i32, roots: &[i32]) -> bool {
    let mut p = pid;
    for _ in 0..256 {
        if roots.contains(&p) {
            return true;
        }
        if p <= 1 {
            return false;
        }
        match parent_of(p) {
            Some(pp) if pp != p => p = pp,
            _ => return false,
        }
    }
    false
}

impl AsRawFd for BootstrapServer {
    /// The epoll descriptor: readable when [`BootstrapServer::process`] has work to do.
    fn as_raw_fd(&self) -> RawFd {
        self.epoll.as_raw_fd()
    }
}

impl Drop for BootstrapServer {
    fn drop(&mut self) {
        // The socket file is ours; it may already be gone.
        let _ = std::fs::remove_file(&self.path);
    }
}

/// A [`BootstrapServer`] running in its own thread ([`BootstrapServer::spawn`]).
pub struct ServerThread {
    events: mpsc::Receiver<ServerEvent>,
    stop: std::sync::Arc<OwnedFd>,
    join: Option<JoinHandle<Result<()>>>,
}

impl ServerThread {
    /// Events from the server, in order.
    pub fn events(&self) -> &mpsc::Receiver<ServerEvent> {
        &self.events
    }

    /// Stops the server thread and waits for it (the socket file is removed).
    ///
    /// # Errors
    /// The error that ended the server thread early, if any.
    pub fn stop(mut self) -> Result<()> {
        self.stop_inner()
    }

    fn stop_inner(&mut self) -> Result<()> {
        let one = 1u64.to_ne_bytes();
        // SAFETY: writes 8 bytes from a live array to the eventfd we own.
        unsafe { libc::write(self.stop.as_raw_fd(), one.as_ptr().cast(), 8) };
        match self.join.take() {
            Some(j) => j.join().unwrap_or_else(|_| Err(Error::Bootstrap("bootstrap server thread panicked".into()))),
            None => Ok(()),
        }
    }
}

impl Drop for ServerThread {
    fn drop(&mut self) {
        let _ = self.stop_inner();
    }
}
