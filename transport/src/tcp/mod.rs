//! TCP fabric: ranks on different hosts, one stream socket per pair of ranks.
//!
//! - [`crate::auth`]: the challenge-response that proves the job secret on every connection
//!   (the bootstrap service proves it the same way).
//! - [`iface`]: which address to listen on (`TMPI_TCP_IF`).
//! - [`alive`]: noticing a peer whose host went silent (`TMPI_PEER_TIMEOUT`).
//! - `handshake`: the acceptor's side of the handshake, many connections side by side.
//!
//! **Connections are made eagerly, at start-up** ([`TcpFabric::establish`]): rank `r` connects
//! to every TCP peer below it and accepts every peer above it, then closes its listening
//! socket. Eager because a peer is watched for failure through its connection (a peer never
//! connected to could die unseen), because a connection problem (firewall, wrong interface,
//! a stranger without the secret) then shows at `init` and not in the middle of a
//! collective, and because the handshake is the only blocking step, so it belongs before the
//! program runs. The cost, `n - 1` sockets per rank, is what MPI jobs of this size afford.
//!
//! **Silence**: a peer whose host vanished sends nothing, not even an end of stream; with a
//! peer timeout ([`TcpFabric::set_peer_timeout`], `TMPI_PEER_TIMEOUT`) it is taken for failed
//! once its kernel has left keepalive probes or data unanswered that long ([`alive`]).
//!
//! **Progress** is the engine's: sockets are non-blocking, written by [`TcpFabric::try_send`]
//! and read by [`TcpFabric::poll`] from the engine's one progress loop, with no thread per
//! peer. It uses `std::net` and `libc` only (`sendmsg` for gathered writes with
//! `MSG_NOSIGNAL`): a job has few peers per rank and each idle poll is one `recv` per peer
//! that has nothing buffered, so an event queue (`polling`, `mio`) would add a dependency and
//! a system call of its own without saving any here. A packet goes straight from the caller's
//! buffers to the kernel (one gathered `sendmsg`); only the rest of a packet the kernel took in
//! part waits in a per-peer [`BytesMut`]. While such a rest waits, or when the kernel takes
//! nothing, `try_send` says "full" (as a full ring does) and the engine, which keeps its
//! messages queued by reference, retries after progress: under back-pressure no byte is copied
//! twice in user space. (An earlier version queued up to 4 MiB per peer in that buffer, which
//! cost one more copy of every byte sent while the kernel was the bottleneck.)
//!
//! **Framing**: each packet of the fabric interface (`crate::fabric`) is one frame, a 16-byte
//! header then the packet's bytes (the TMH-framed message part, unchanged):
//!
//! ```text
//! flags u8 (PKT_*) | kind u8 (0 data, 1 finalized) | 0 u16 | length u32le | total length u64le
//! ```
//!
//! A `finalized` frame (no payload) is the last thing a rank sends that finalized cleanly;
//! end of stream without it means the peer failed ([`PeerState::Failed`]). A frame with an unknown
//! kind, flags or reserved bits, or longer than [`TcpFabric::max_packet`], is an
//! [`Error::PeerProtocol`] naming the peer, reported once: the connection is then shut and the peer
//! counts as failed (the stream has lost its framing). Sends to a peer that is gone are dropped (as
//! records in the ring of a dead process are): the engine learns of the failure from
//! [`TcpFabric::peer_state`] and names the rank.

pub mod alive;
mod handshake;
pub mod iface;

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use bytes::{Buf, BytesMut};

use crate::auth;
use crate::error::{Error, Result};
use crate::packet::{Packet, PeerState, PKT_FIRST, PKT_LAST, PKT_RMA};
use crate::secret::JobSecret;

/// Largest packet payload of one frame.
pub const MAX_PACKET: usize = 256 * 1024;
/// Most parts one packet may be gathered from ([`TcpFabric::try_send`]): with the frame
/// header, one `sendmsg` of at most four iovecs.
pub const MAX_PARTS: usize = 3;
/// Bytes of a frame header.
pub const FRAME_HDR: usize = 16;
/// Bytes of each peer's receive buffer (several frames: fewer `recv` calls).
const RX_BUF: usize = 2 * (FRAME_HDR + MAX_PACKET);
const KIND_DATA: u8 = 0;
const KIND_FINALIZED: u8 = 1;
/// How long finalize waits for a peer to take this rank's last bytes.
const FLUSH_TIMEOUT: Duration = Duration::from_secs(60);

/// One peer's connection.
struct Conn {
    sock: TcpStream,
    rx: Box<[u8]>,
    rpos: usize,
    rend: usize,
    tx: BytesMut,
    state: PeerState,
    /// The stream ended or broke: nothing more is read or written.
    closed: bool,
    /// A send found the kernel's buffer full: [`TcpFabric::wait`] also wakes when it has room.
    /// Set only on that slow path, cleared when `wait` sees room.
    want_write: bool,
}

/// A frame at the head of a receive buffer.
struct Head {
    flags: u8,
    total: u64,
    len: usize,
}

impl Conn {
    fn new(sock: TcpStream) -> io::Result<Self> {
        sock.set_nodelay(true)?;
        sock.set_nonblocking(true)?;
        Ok(Conn {
            sock,
            rx: vec![0u8; RX_BUF].into_boxed_slice(),
            rpos: 0,
            rend: 0,
            tx: BytesMut::new(),
            state: PeerState::Alive,
            closed: false,
            want_write: false,
        })
    }

    /// The stream ended or broke. A peer that did not say it finalized has failed.
    #[cold]
    fn lost(&mut self) {
        self.closed = true;
        self.tx.clear();
        if self.state == PeerState::Alive {
            self.state = PeerState::Failed;
        }
    }

    /// The peer sent a malformed frame: the stream has lost its framing, so nothing after it
    /// can be read. The connection is shut (the peer sees this rank leave) and the peer counts
    /// as failed, so that waits on it end; `e` is returned to be reported once.
    #[cold]
    fn broken(&mut self, e: Error) -> Error {
        let _ = self.sock.shutdown(Shutdown::Both);
        self.rpos = 0;
        self.rend = 0;
        self.lost();
        e
    }

    /// The peer's host has not answered for `t` ([`alive`]): the connection is shut and the
    /// peer counts as failed, said once on stderr (the error the engine gives, `PeerGone`,
    /// cannot say why).
    #[cold]
    fn silenced(&mut self, me: usize, peer: usize, t: Duration) {
        let at = self.sock.peer_addr().map_or_else(|_| "?".to_string(), |a| a.to_string());
        eprintln!(
            "tmpi: rank {me}: peer rank {peer} at {at} has not answered for {} s ({}): taken for gone",
            t.as_secs(),
            alive::ENV_PEER_TIMEOUT
        );
        let _ = self.sock.shutdown(Shutdown::Both);
        self.rpos = 0;
        self.rend = 0;
        self.lost();
    }

    /// Writes as much of `tx` as the kernel takes.
    fn flush(&mut self) {
        while !self.tx.is_empty() && !self.closed {
            match send_nosignal(&self.sock, &[&self.tx]) {
                Ok(n) => self.tx.advance(n),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => self.lost(),
            }
        }
    }

    /// Reads what the kernel has, after moving an incomplete frame to the front if needed.
    fn fill(&mut self) {
        if self.closed {
            return;
        }
        if self.rpos == self.rend {
            self.rpos = 0;
            self.rend = 0;
        } else if self.rx.len() - self.rpos < FRAME_HDR + MAX_PACKET {
            self.rx.copy_within(self.rpos..self.rend, 0);
            self.rend -= self.rpos;
            self.rpos = 0;
        }
        loop {
            match self.sock.read(&mut self.rx[self.rend..]) {
                Ok(0) => return self.lost(),
                Ok(n) => {
                    self.rend += n;
                    return;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return self.lost(),
            }
        }
    }

    /// The complete data frame at the head of the buffer, if any; `finalized` frames before it
    /// are consumed (the peer is then [`PeerState::Finalized`]).
    #[inline]
    fn head(&mut self, rank: usize) -> Result<Option<Head>> {
        loop {
            let avail = self.rend - self.rpos;
            if avail < FRAME_HDR {
                return Ok(None);
            }
            let h = &self.rx[self.rpos..self.rpos + FRAME_HDR];
            let (flags, kind) = (h[0], h[1]);
            let len = u32::from_le_bytes([h[4], h[5], h[6], h[7]]) as usize;
            let total = u64::from_le_bytes([h[8], h[9], h[10], h[11], h[12], h[13], h[14], h[15]]);
            if h[2] != 0 || h[3] != 0 {
                return Err(Error::PeerProtocol { rank, what: "TCP frame reserved bytes are not zero" });
            }
            match kind {
                KIND_DATA => {
                    // No flag is a continuation: a packet between the first and the last of
                    // a message of three or more packets.
                    if flags & !(PKT_FIRST | PKT_LAST | PKT_RMA) != 0 {
                        return Err(Error::PeerProtocol { rank, what: "TCP frame with unknown packet flags" });
                    }
                    if len > MAX_PACKET {
                        return Err(Error::PeerProtocol { rank, what: "TCP frame longer than the fabric's packet limit" });
                    }
                    if avail < FRAME_HDR + len {
                        return Ok(None);
                    }
                    return Ok(Some(Head { flags, total, len }));
                }
                KIND_FINALIZED if len == 0 && flags == 0 && total == 0 => {
                    self.rpos += FRAME_HDR;
                    if self.state == PeerState::Alive {
                        self.state = PeerState::Finalized;
                    }
                }
                _ => return Err(Error::PeerProtocol { rank, what: "TCP frame of unknown kind" }),
            }
        }
    }
}

impl Conn {
    /// Whether a whole frame (or a malformed header, which the next poll reports) is already
    /// in the receive buffer, so that there is work without asking the kernel.
    fn has_frame(&self) -> bool {
        let avail = self.rend - self.rpos;
        if avail < FRAME_HDR {
            return false;
        }
        let h = &self.rx[self.rpos..self.rpos + FRAME_HDR];
        let len = u32::from_le_bytes([h[4], h[5], h[6], h[7]]) as usize;
        len > MAX_PACKET || avail >= FRAME_HDR + len
    }
}

/// `sendmsg` of `parts` with `MSG_NOSIGNAL | MSG_DONTWAIT`: a vanished peer is an error, never
/// a `SIGPIPE`.
fn send_nosignal(sock: &TcpStream, parts: &[&[u8]]) -> io::Result<usize> {
    let mut iov = [libc::iovec { iov_base: std::ptr::null_mut(), iov_len: 0 }; 4];
    let n = parts.len().min(iov.len());
    for (v, p) in iov.iter_mut().zip(parts) {
        *v = libc::iovec { iov_base: p.as_ptr().cast_mut().cast(), iov_len: p.len() };
    }
    // SAFETY: zeroed msghdr is valid (no name, no control data).
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = iov.as_mut_ptr();
    msg.msg_iovlen = n as _;
    // SAFETY: the iovecs point to `n` live slices that outlive the call; the kernel only reads
    // them (the `*mut` is the C signature's); the descriptor is the stream's own.
    let r = unsafe { libc::sendmsg(sock.as_raw_fd(), &msg, libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT) };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r as usize)
    }
}

fn encode_hdr(flags: u8, kind: u8, len: usize, total: u64) -> [u8; FRAME_HDR] {
    let mut h = [0u8; FRAME_HDR];
    h[0] = flags;
    h[1] = kind;
    h[4..8].copy_from_slice(&(len as u32).to_le_bytes());
    h[8..16].copy_from_slice(&total.to_le_bytes());
    h
}

/// Binds the listening socket of the TCP fabric to `ip` (any free port).
///
/// # Errors
/// The bind failed.
pub fn listen(ip: std::net::IpAddr) -> Result<TcpListener> {
    TcpListener::bind((ip, 0)).map_err(|source| Error::Io { op: format!("bind TCP fabric listener on {ip}"), source })
}

/// One rank's end of the TCP fabric.
pub struct TcpFabric {
    rank: usize,
    conns: Vec<Option<Conn>>,
    /// Peers with a connection, in polling order.
    peers: Vec<usize>,
    next: usize,
    bad: u64,
    /// The peer timeout, once set ([`TcpFabric::set_peer_timeout`]); boxed, since only the
    /// slow paths use it.
    alive: Option<Box<Liveness>>,
}

/// How silent peers are noticed ([`alive`]).
struct Liveness {
    /// How long a peer may leave what it owes unanswered.
    timeout: Duration,
    /// Time between two looks at the connections.
    every: Duration,
    /// When to look next.
    next: Instant,
}

impl TcpFabric {
    /// Connects this rank (`rank` of `size`) to each of `peers` (world rank and the address of
    /// its listener): to the peers below `rank` by connecting, to those above by accepting on
    /// `listener`, which is closed afterwards. Every connection proves `secret` both ways
    /// ([`auth`]); an accepted connection that does not is closed and counted
    /// ([`Self::bad_connections`]). Accepted connections prove themselves side by side, each
    /// within 5 s of its accept (`handshake`): a stranger that trickles bytes, or a crowd of
    /// them, holds up only itself.
    ///
    /// # Errors
    /// A peer cannot be reached or does not prove the secret, or not every peer connected
    /// within `timeout`.
    pub fn establish(
        rank: usize,
        size: usize,
        listener: TcpListener,
        peers: &[(usize, SocketAddr)],
        secret: &JobSecret,
        timeout: Duration,
    ) -> Result<Self> {
        let deadline = Instant::now() + timeout;
        let size32 = u32::try_from(size).map_err(|_| Error::InvalidArgument(format!("job of {size} ranks")))?;
        let mut conns: Vec<Option<Conn>> = (0..size).map(|_| None).collect();
        let mut lower: Vec<&(usize, SocketAddr)> = peers.iter().filter(|(p, _)| *p < rank).collect();
        lower.sort_by_key(|(p, _)| *p);
        for &&(peer, addr) in &lower {
            let s = connect_one(rank as u32, size32, peer as u32, addr, secret, deadline)?;
            conns[peer] = Some(Conn::new(s).map_err(|source| Error::Io { op: format!("set up TCP connection to rank {peer}"), source })?);
        }
        let mut want: Vec<usize> = peers.iter().map(|(p, _)| *p).filter(|&p| p > rank && p < size).collect();
        want.sort_unstable();
        want.dedup();
        let mut acc = handshake::Acceptor::new(listener, rank as u32, size32, secret)?;
        while want.iter().any(|&p| conns[p].is_none()) {
            if Instant::now() >= deadline {
                let missing: Vec<usize> = want.iter().copied().filter(|&p| conns[p].is_none()).collect();
                return Err(Error::Fabric(format!("rank {rank}: ranks {missing:?} did not connect over TCP within {timeout:?}")));
            }
            acc.accept_waiting(deadline)?;
            // Only a rank expected here and not connected yet is sent a proof; any other
            // connection is closed, counted, never trusted.
            for (peer, s) in acc.step_all(|p| want.binary_search(&p).is_ok() && conns[p].is_none()) {
                conns[peer] =
                    Some(Conn::new(s).map_err(|source| Error::Io { op: format!("set up TCP connection from rank {peer}"), source })?);
            }
            if want.iter().any(|&p| conns[p].is_none()) {
                acc.wait(deadline);
            }
        }
        let bad = acc.finish();
        let peers: Vec<usize> = (0..size).filter(|&p| conns[p].is_some()).collect();
        Ok(TcpFabric { rank, conns, peers, next: 0, bad, alive: None })
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Bounds how long a peer may stay silent (`TMPI_PEER_TIMEOUT`, see [`alive`]): kernel
    /// keepalive on every connection, and from now on [`Self::wait`] and
    /// [`Self::mark_finalized`] take a peer that has left data or probes unanswered for
    /// `timeout` for gone ([`PeerState::Failed`]). `None` turns both off. A peer that is busy
    /// but whose host runs is never taken for gone: its kernel answers.
    ///
    /// # Errors
    /// The keepalive options cannot be set on a connection.
    pub fn set_peer_timeout(&mut self, timeout: Option<Duration>) -> Result<()> {
        for (p, c) in self.conns.iter().enumerate() {
            let Some(c) = c else { continue };
            let fd = c.sock.as_raw_fd();
            let on = match timeout {
                Some(t) => alive::set_keepalive(fd, t),
                None => set_keepalive_off(fd),
            };
            on.map_err(|source| Error::Io { op: format!("set TCP keepalive towards rank {p}"), source })?;
        }
        self.alive = timeout.map(|t| {
            let every = (t / 8).clamp(Duration::from_millis(100), Duration::from_secs(1));
            Box::new(Liveness { timeout: t, every, next: Instant::now() + every })
        });
        Ok(())
    }

    /// Every so often (see [`Liveness`]), takes the peers that have left data or probes
    /// unanswered for the peer timeout for gone: the connection is shut and the peer failed.
    fn check_silent(&mut self) {
        let Some(l) = self.alive.as_deref_mut() else { return };
        let now = Instant::now();
        if now < l.next {
            return;
        }
        l.next = now + l.every;
        let t = l.timeout;
        for (p, c) in self.conns.iter_mut().enumerate() {
            let Some(c) = c else { continue };
            if !c.closed && alive::silent_for(c.sock.as_raw_fd(), t) {
                c.silenced(self.rank, p, t);
            }
        }
    }

    /// Connections refused at start-up because they did not prove the job secret.
    pub fn bad_connections(&self) -> u64 {
        self.bad
    }

    /// Whether `rank` is reached through this fabric.
    pub fn has_peer(&self, rank: usize) -> bool {
        matches!(self.conns.get(rank), Some(Some(_)))
    }

    /// The largest packet payload one frame carries.
    pub fn max_packet(&self) -> usize {
        MAX_PACKET
    }

    /// Number of peers reached through this fabric (each empty poll asks the kernel once per
    /// open connection).
    pub fn peer_count(&self) -> usize {
        self.peers.len()
    }

    /// Sleeps in `ppoll(2)` until a connection has something to read (data, end of stream or
    /// an error), a connection whose sends found the kernel's buffer full has room again, or
    /// `timeout` passes; a signal also ends it. Returns at once when a whole frame already
    /// waits in a receive buffer. Returns whether a connection is ready (the caller polls
    /// either way and re-checks what it waits for).
    ///
    /// This is how a waiting rank lets the kernel's network processing run: on a loopback or
    /// veth path that processing is a softirq, which runs in `ksoftirqd` when it is deferred,
    /// and a rank that spins on the same CPU keeps it from running until the scheduler tick.
    /// Asleep here, the rank gives up the CPU and is woken as soon as the data is in.
    pub fn wait(&mut self, timeout: Duration) -> bool {
        self.check_silent();
        // Built per sleep (no field: the fabric's size is part of the engine's layout, which
        // the shared-memory path is sensitive to; an allocation is nothing beside a sleep).
        let mut fds: Vec<libc::pollfd> = Vec::with_capacity(self.peers.len());
        let mut of: Vec<usize> = Vec::with_capacity(self.peers.len());
        for &p in &self.peers {
            let Some(Some(c)) = self.conns.get(p) else { continue };
            if c.closed {
                continue;
            }
            if c.has_frame() {
                return true;
            }
            let mut events = libc::POLLIN;
            if c.want_write || !c.tx.is_empty() {
                events |= libc::POLLOUT;
            }
            fds.push(libc::pollfd { fd: c.sock.as_raw_fd(), events, revents: 0 });
            of.push(p);
        }
        let ts = libc::timespec {
            tv_sec: timeout.as_secs().min(i64::MAX as u64) as libc::time_t,
            tv_nsec: libc::c_long::from(timeout.subsec_nanos() as i32),
        };
        // SAFETY: `fds` holds `len()` initialized entries for descriptors of streams this
        // fabric owns (open for the whole call: `self` is borrowed mutably); the kernel writes
        // only their `revents`. The timespec lives on this frame; a null signal mask keeps the
        // thread's own. With no entries (every connection closed) it only sleeps.
        let r = unsafe { libc::ppoll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, &ts, std::ptr::null()) };
        if r <= 0 {
            return false;
        }
        for (pfd, &p) in fds.iter().zip(&of) {
            if pfd.revents & libc::POLLOUT != 0 {
                if let Some(Some(c)) = self.conns.get_mut(p) {
                    c.want_write = false;
                }
            }
        }
        true
    }

    /// How `rank` stands: finalized once its `finalized` frame was read (after everything it
    /// sent before), failed once its stream ended without one.
    pub fn peer_state(&self, rank: usize) -> PeerState {
        match self.conns.get(rank) {
            Some(Some(c)) => c.state,
            _ => PeerState::Alive,
        }
    }

    /// Whether a whole packet from `src` waits to be delivered (reads what the kernel has).
    /// A malformed frame counts as pending (the next poll reports it).
    pub fn pending_from(&mut self, src: usize) -> bool {
        let Some(Some(c)) = self.conns.get_mut(src) else { return false };
        match c.head(src) {
            Ok(Some(_)) | Err(_) => return true,
            Ok(None) => {}
        }
        c.fill();
        !matches!(c.head(src), Ok(None))
    }

    /// Sends one packet (the concatenation of `parts`) to `dest`, or says the connection is
    /// full: `Ok(false)` when the rest of an earlier packet still waits for the kernel, or
    /// the kernel takes nothing now (make progress and retry). When the kernel takes part of
    /// the packet, the rest is kept and written by later calls and polls. A packet to a peer
    /// whose connection is gone is dropped.
    ///
    /// # Errors
    /// `dest` has no connection here, or the packet is larger than [`Self::max_packet`].
    #[inline]
    pub fn try_send(&mut self, dest: usize, flags: u8, total_len: u64, parts: &[&[u8]]) -> Result<bool> {
        let rank = self.rank;
        let Some(Some(c)) = self.conns.get_mut(dest) else {
            return Err(Error::InvalidArgument(format!("no TCP connection from rank {rank} to {dest}")));
        };
        let len: usize = parts.iter().map(|p| p.len()).sum();
        if len > MAX_PACKET || parts.len() > MAX_PARTS {
            return Err(Error::InvalidArgument(format!("packet of {len} bytes in {} parts exceeds the TCP fabric's limit", parts.len())));
        }
        if c.closed {
            return Ok(true);
        }
        if !c.tx.is_empty() {
            c.flush();
            if !c.tx.is_empty() {
                c.want_write = true;
                return Ok(false);
            }
            if c.closed {
                return Ok(true);
            }
        }
        let hdr = encode_hdr(flags, KIND_DATA, len, total_len);
        let mut all: [&[u8]; 4] = [&hdr, &[], &[], &[]];
        all[1..=parts.len()].copy_from_slice(parts);
        let sent = loop {
            match send_nosignal(&c.sock, &all[..=parts.len()]) {
                Ok(n) => break n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    c.want_write = true;
                    return Ok(false);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => {
                    c.lost();
                    return Ok(true);
                }
            }
        };
        // Keep what the kernel did not take, in order (at most one packet).
        let mut skip = sent;
        for p in &all[..=parts.len()] {
            if skip >= p.len() {
                skip -= p.len();
            } else {
                c.tx.extend_from_slice(&p[skip..]);
                skip = 0;
            }
        }
        Ok(true)
    }

    /// Writes queued bytes, then delivers at most one packet from each peer that has one,
    /// round-robin, to `f`; returns how many were delivered. `f` returns `false` to leave a
    /// packet where it is; it is offered again on the next poll.
    ///
    /// # Errors
    /// [`Error::PeerProtocol`] naming the peer that sent a malformed frame.
    #[inline]
    pub fn poll<F: FnMut(Packet<'_>) -> bool>(&mut self, mut f: F) -> Result<usize> {
        let n = self.peers.len();
        let mut delivered = 0;
        for i in 0..n {
            let mut idx = self.next + i;
            if idx >= n {
                idx -= n;
            }
            let src = self.peers[idx];
            let Some(Some(c)) = self.conns.get_mut(src) else { continue };
            if !c.tx.is_empty() {
                c.flush();
            }
            let h = match c.head(src) {
                Ok(Some(h)) => h,
                Ok(None) => {
                    c.fill();
                    match c.head(src) {
                        Ok(Some(h)) => h,
                        Ok(None) => continue,
                        Err(e) => return Err(c.broken(e)),
                    }
                }
                Err(e) => return Err(c.broken(e)),
            };
            let start = c.rpos + FRAME_HDR;
            let pkt = Packet { src, flags: h.flags, total_len: h.total, data: &c.rx[start..start + h.len] };
            if f(pkt) {
                c.rpos = start + h.len;
                delivered += 1;
            }
        }
        self.next = if self.next + 1 >= n { 0 } else { self.next + 1 };
        Ok(delivered)
    }

    /// Records that this rank finalized: sends the `finalized` frame after everything queued,
    /// waits (up to a minute) until every live peer's kernel acknowledged all of it, and
    /// closes the sending side. What arrives meanwhile is read and dropped (this rank receives
    /// nothing more), so two ranks finalizing towards each other never wait on each other.
    pub fn mark_finalized(&mut self) {
        let fin = encode_hdr(0, KIND_FINALIZED, 0, 0);
        for c in self.conns.iter_mut().flatten() {
            if !c.closed {
                c.tx.extend_from_slice(&fin);
            }
        }
        let deadline = Instant::now() + FLUSH_TIMEOUT;
        let mut idle = 0u32;
        loop {
            self.check_silent();
            let mut busy = false;
            for c in self.conns.iter_mut().flatten() {
                if c.closed {
                    continue;
                }
                c.flush();
                if !c.tx.is_empty() || unacked(&c.sock) > 0 {
                    busy = true;
                }
                // Drop whatever arrives: nothing is received after finalize.
                c.rpos = 0;
                c.rend = 0;
                c.fill();
                c.rend = 0;
            }
            if !busy || Instant::now() >= deadline {
                break;
            }
            idle += 1;
            if idle > 100 {
                std::thread::sleep(Duration::from_micros(200));
            } else {
                std::thread::yield_now();
            }
        }
        for c in self.conns.iter_mut().flatten() {
            let _ = c.sock.shutdown(Shutdown::Write);
        }
    }
}

/// Turns kernel keepalive off on `fd` (`TMPI_PEER_TIMEOUT=0`).
fn set_keepalive_off(fd: std::os::fd::RawFd) -> io::Result<()> {
    let off: libc::c_int = 0;
    // SAFETY: the option value is one live c_int whose size is passed; `fd` is a socket this
    // fabric owns.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_KEEPALIVE,
            std::ptr::addr_of!(off).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Bytes sent on `sock` that the peer's kernel has not acknowledged yet (`SIOCOUTQ`).
fn unacked(sock: &TcpStream) -> usize {
    let mut n: libc::c_int = 0;
    // SAFETY: TIOCOUTQ (= SIOCOUTQ) writes one int into `n`, which outlives the call.
    let r = unsafe { libc::ioctl(sock.as_raw_fd(), libc::TIOCOUTQ, &mut n) };
    if r == 0 {
        n.max(0) as usize
    } else {
        0
    }
}

fn remaining(deadline: Instant) -> Option<Duration> {
    deadline.checked_duration_since(Instant::now()).filter(|d| !d.is_zero())
}

/// Connects to `peer` at `addr` and runs the connector's side of the handshake.
fn connect_one(me: u32, size: u32, peer: u32, addr: SocketAddr, secret: &JobSecret, deadline: Instant) -> Result<TcpStream> {
    let io_err = |what: &str, source: io::Error| Error::Io { op: format!("rank {me}: {what} rank {peer} at {addr}"), source };
    let t = remaining(deadline).ok_or_else(|| Error::Fabric(format!("rank {me}: no time left to connect to rank {peer}")))?;
    let mut s = TcpStream::connect_timeout(&addr, t).map_err(|e| io_err("TCP connect to", e))?;
    let t = remaining(deadline).unwrap_or(Duration::from_millis(1));
    s.set_read_timeout(Some(t)).map_err(|e| io_err("set timeout towards", e))?;
    let mut ch = [0u8; auth::CHALLENGE_LEN];
    s.read_exact(&mut ch).map_err(|e| io_err("read the challenge of", e))?;
    let nonce_c = auth::nonce()?;
    let ans = auth::answer(auth::Purpose::Fabric, secret, &ch, me, size, &nonce_c)
        .ok_or_else(|| Error::Fabric(format!("rank {me}: {addr} (rank {peer}) does not speak the tmpi TCP fabric")))?;
    s.write_all(&ans).map_err(|e| io_err("answer", e))?;
    let mut proof = [0u8; auth::MAC_LEN];
    s.read_exact(&mut proof).map_err(|e| io_err("read the proof of", e))?;
    if !auth::check_accept(auth::Purpose::Fabric, secret, &nonce_c, peer, size, &proof) {
        return Err(Error::Fabric(format!("rank {me}: {addr} did not prove the job secret as rank {peer}")));
    }
    s.set_read_timeout(None).map_err(|e| io_err("clear timeout towards", e))?;
    Ok(s)
}

/// The acceptor's side of the handshake on one connection, blocking until `deadline`: the
/// peer's rank, or `None` (and the stream closed) when it does not prove the secret in time.
#[cfg(test)]
fn accept_one(s: TcpStream, me: u32, size: u32, secret: &JobSecret, deadline: Instant) -> Option<(usize, TcpStream)> {
    let mut h = handshake::Handshake::start(s, deadline)?;
    loop {
        match h.step(me, size, secret, |_| true) {
            handshake::Step::Done(peer) => {
                let s = h.into_stream();
                s.set_nonblocking(false).ok()?;
                return Some((peer, s));
            }
            handshake::Step::Failed => return None,
            handshake::Step::Pending if Instant::now() >= h.deadline() => return None,
            handshake::Step::Pending => h.wait(),
        }
    }
}

#[cfg(test)]
mod tests;
