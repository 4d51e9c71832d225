//! The acceptor's side of the TCP fabric's handshake ([`crate::auth`]), for many connections
//! side by side: a stranger that trickles bytes, or says nothing, holds only its own
//! handshake, never the real peers' behind it.
//!
//! Each accepted connection gets its own deadline, [`HANDSHAKE_TIMEOUT`] from its accept, for
//! the whole exchange (not per read); at most [`MAX_PENDING`] handshakes run at once (the
//! oldest gives way to a newcomer); and when the process is out of descriptors the oldest
//! handshake is closed to make room, or accepting pauses briefly, instead of spinning.

use std::io::{self, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use crate::auth;
use crate::error::{Error, Result};
use crate::secret::JobSecret;

/// How long one handshake may take, from its accept, before the connection is closed as bad.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

/// Handshakes in progress at once; the oldest is closed to admit one more.
pub const MAX_PENDING: usize = 64;

/// How long accepting pauses when the process has no descriptor left and no handshake to close.
const NOFILE_PAUSE: Duration = Duration::from_millis(50);

/// Where one handshake stands after a step.
pub(super) enum Step {
    /// Waiting for the peer (or for room to write).
    Pending,
    /// Proven: the peer's rank.
    Done(usize),
    /// Refused, broken, or the peer went away.
    Failed,
}

/// One accepted connection proving itself.
pub(super) struct Handshake {
    sock: TcpStream,
    nonce: [u8; auth::NONCE_LEN],
    /// Bytes still to write: the challenge, later the proof.
    out: Vec<u8>,
    answer: [u8; auth::ANSWER_LEN],
    got: usize,
    /// The rank it proved, once its answer checked out (the proof is then being written).
    proved: Option<usize>,
    deadline: Instant,
}

impl Handshake {
    /// Starts the handshake on a fresh connection: sends the challenge (as much as the socket
    /// takes now). `None` when the socket cannot be set up.
    pub(super) fn start(sock: TcpStream, deadline: Instant) -> Option<Self> {
        sock.set_nonblocking(true).ok()?;
        let nonce = auth::nonce().ok()?;
        let out = auth::challenge(auth::Purpose::Fabric, &nonce).to_vec();
        Some(Handshake { sock, nonce, out, answer: [0; auth::ANSWER_LEN], got: 0, proved: None, deadline })
    }

    /// Does what can be done without blocking. `may(rank)` says whether a proven rank is one
    /// this rank expects and does not have yet; the proof is sent only then.
    pub(super) fn step(&mut self, me: u32, size: u32, secret: &JobSecret, may: impl Fn(usize) -> bool) -> Step {
        loop {
            while !self.out.is_empty() {
                match self.sock.write(&self.out) {
                    Ok(0) => return Step::Failed,
                    Ok(n) => drop(self.out.drain(..n)),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Step::Pending,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(_) => return Step::Failed,
                }
            }
            if let Some(peer) = self.proved {
                return Step::Done(peer);
            }
            // Exactly the answer's bytes: anything after it is the peer's first frame.
            match self.sock.read(&mut self.answer[self.got..]) {
                Ok(0) => return Step::Failed,
                Ok(n) => self.got += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Step::Pending,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => return Step::Failed,
            }
            if self.got < auth::ANSWER_LEN {
                continue;
            }
            let Some((peer, nonce_c)) = auth::check_answer(auth::Purpose::Fabric, secret, &self.nonce, size, &self.answer) else {
                return Step::Failed;
            };
            if !may(peer as usize) {
                return Step::Failed;
            }
            self.out = auth::accept_proof(auth::Purpose::Fabric, secret, &nonce_c, me, size).to_vec();
            self.proved = Some(peer as usize);
        }
    }

    /// The events to wait for.
    fn events(&self) -> libc::c_short {
        if self.out.is_empty() {
            libc::POLLIN
        } else {
            libc::POLLOUT
        }
    }

    /// The connection, once [`Step::Done`].
    pub(super) fn into_stream(self) -> TcpStream {
        self.sock
    }

    /// The deadline of this handshake.
    #[cfg(test)]
    pub(super) fn deadline(&self) -> Instant {
        self.deadline
    }

    /// Sleeps until this handshake's socket is ready or its deadline passes.
    #[cfg(test)]
    pub(super) fn wait(&self) {
        let mut p = [libc::pollfd { fd: self.sock.as_raw_fd(), events: self.events(), revents: 0 }];
        sleep_on(&mut p, self.deadline);
    }
}

/// What one rank knows to accept its higher peers.
pub(super) struct Acceptor<'a> {
    listener: TcpListener,
    me: u32,
    size: u32,
    secret: &'a JobSecret,
    pending: Vec<Handshake>,
    /// Connections closed without proving the secret (or proving an unexpected rank).
    pub(super) bad: u64,
    /// Accepting pauses until then (out of descriptors).
    paused: Option<Instant>,
}

impl<'a> Acceptor<'a> {
    /// Takes the listening socket (made non-blocking).
    ///
    /// # Errors
    /// The socket cannot be made non-blocking.
    pub(super) fn new(listener: TcpListener, me: u32, size: u32, secret: &'a JobSecret) -> Result<Self> {
        listener.set_nonblocking(true).map_err(|source| Error::Io { op: "TCP listener non-blocking".into(), source })?;
        Ok(Acceptor { listener, me, size, secret, pending: Vec::new(), bad: 0, paused: None })
    }

    /// Accepts every connection waiting, starting a handshake for each, until `deadline` (the
    /// job's) at the latest for each.
    ///
    /// # Errors
    /// `accept` fails in a way that no waiting makes good.
    pub(super) fn accept_waiting(&mut self, deadline: Instant) -> Result<()> {
        let now = Instant::now();
        if self.paused.is_some_and(|p| now < p) {
            return Ok(());
        }
        self.paused = None;
        loop {
            match self.listener.accept() {
                Ok((s, _)) => {
                    if self.pending.len() >= MAX_PENDING {
                        self.drop_oldest();
                    }
                    match Handshake::start(s, deadline.min(Instant::now() + HANDSHAKE_TIMEOUT)) {
                        Some(h) => self.pending.push(h),
                        None => self.bad += 1,
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if out_of_descriptors(&e) => {
                    if self.pending.is_empty() {
                        self.paused = Some(Instant::now() + NOFILE_PAUSE);
                        return Ok(());
                    }
                    self.drop_oldest();
                }
                Err(source) => return Err(Error::Io { op: "accept a TCP fabric connection".into(), source }),
            }
        }
    }

    /// Closes the handshake that has run longest.
    fn drop_oldest(&mut self) {
        if let Some(i) = (0..self.pending.len()).min_by_key(|&i| self.pending[i].deadline) {
            self.pending.swap_remove(i);
            self.bad += 1;
        }
    }

    /// Steps every handshake; returns the proven ones (rank and stream). `may(rank)` as
    /// [`Handshake::step`]; a rank proven once is not accepted twice.
    pub(super) fn step_all(&mut self, may: impl Fn(usize) -> bool) -> Vec<(usize, TcpStream)> {
        let now = Instant::now();
        let mut done: Vec<(usize, TcpStream)> = Vec::new();
        let mut i = 0;
        while i < self.pending.len() {
            // Ranks another handshake already proved, or that came in this round.
            let others = self.pending.iter().enumerate().filter(|&(j, _)| j != i).filter_map(|(_, h)| h.proved);
            let taken: Vec<usize> = others.chain(done.iter().map(|(r, _)| *r)).collect();
            let (me, size, secret) = (self.me, self.size, self.secret);
            let h = &mut self.pending[i];
            let step = if now >= h.deadline { Step::Failed } else { h.step(me, size, secret, |r| may(r) && !taken.contains(&r)) };
            match step {
                Step::Pending => i += 1,
                Step::Done(r) => done.push((r, self.pending.swap_remove(i).into_stream())),
                Step::Failed => {
                    self.pending.swap_remove(i);
                    self.bad += 1;
                }
            }
        }
        done
    }

    /// Sleeps until the listener or a handshake is ready, the earliest handshake deadline, or
    /// `deadline` (at most 50 ms while accepting is paused).
    pub(super) fn wait(&self, deadline: Instant) {
        let mut fds = Vec::with_capacity(self.pending.len() + 1);
        let mut until = self.pending.iter().map(|h| h.deadline).fold(deadline, Instant::min);
        match self.paused {
            Some(p) => until = until.min(p),
            None => fds.push(libc::pollfd { fd: self.listener.as_raw_fd(), events: libc::POLLIN, revents: 0 }),
        }
        for h in &self.pending {
            fds.push(libc::pollfd { fd: h.sock.as_raw_fd(), events: h.events(), revents: 0 });
        }
        sleep_on(&mut fds, until);
    }

    /// Connections still proving themselves when the caller stops: they count as bad.
    pub(super) fn finish(self) -> u64 {
        self.bad + self.pending.len() as u64
    }
}

/// Whether an `accept` failed for want of descriptors or kernel memory (retrying at once
/// would spin: the connection stays queued and the listener stays readable).
fn out_of_descriptors(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM))
}

/// `poll` on `fds` until one is ready or `until` passes (at least 1 ms, at most 1 s a call).
fn sleep_on(fds: &mut [libc::pollfd], until: Instant) {
    let ms = until.saturating_duration_since(Instant::now()).as_millis().clamp(1, 1000) as libc::c_int;
    // SAFETY: `fds` is a live slice of initialized pollfd for descriptors the caller owns for
    // the duration of the call; the kernel writes only their `revents`.
    unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
}
