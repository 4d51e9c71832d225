//! Test harness: ranks as threads, [`CollP2p`] over `std::sync::mpsc` channels.
//!
//! One channel per ordered (source, destination) pair keeps messages non-overtaking per pair;
//! each rank parks messages whose tag it is not waiting for in a map keyed by (source, tag), so
//! receives in any tag order work. In [`Mode::Rendezvous`] a send returns only after the
//! receiver has matched it (like a rendezvous-protocol or synchronous send), so an algorithm
//! that relies on buffering would deadlock, and the timeouts turn that into a test failure.
//!
//! Schedules ([`Plan`]) run as the engine runs them: a round's sends are all posted, its
//! receives taken in whatever order their messages come, and the round ends when every send
//! has been matched (rendezvous) and every receive has its message. The harness copies data in
//! and out of the plan's buffers, so it needs no pointer tricks.

use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender};
use std::time::Duration;

use super::plan::{Action, Buf, Plan, Span};
use super::select::{Force, Setting};
use super::topo::Topo;
use super::CollP2p;
use crate::error::{Error, Result};

/// How long any wait may take before the harness reports a (probable) deadlock.
const TIMEOUT: Duration = Duration::from_secs(20);

/// Send semantics of the harness.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Mode {
    /// Sends complete at once (unbounded buffering).
    Eager,
    /// Sends complete when the receiver matches them.
    Rendezvous,
}

struct Msg {
    tag: u32,
    data: Vec<u8>,
    /// Signalled when the message is matched (rendezvous mode).
    ack: Option<Sender<()>>,
}

/// One rank's endpoint.
pub(super) struct ThreadP2p {
    rank: usize,
    size: usize,
    mode: Mode,
    to: Vec<Sender<Msg>>,
    from: Vec<Receiver<Msg>>,
    parked: RefCell<HashMap<(usize, u32), VecDeque<Msg>>>,
    /// Messages sent by this rank (for tests that count traffic).
    pub(super) sent: RefCell<usize>,
    /// The `TMPI_COLL_*` overrides the planners see.
    force: Force,
    /// The hosts the planners see (`None`: one host).
    topo: Option<Topo>,
}

impl ThreadP2p {
    fn check(&self, r: usize) -> Result<()> {
        if r < self.size {
            Ok(())
        } else {
            Err(Error::InvalidRank { rank: r, size: self.size })
        }
    }

    /// Queues a message; returns the channel that reports its match in rendezvous mode.
    fn post(&self, buf: &[u8], dest: usize, tag: u32) -> Result<Option<Receiver<()>>> {
        self.check(dest)?;
        let (ack, done) = match self.mode {
            Mode::Eager => (None, None),
            Mode::Rendezvous => {
                let (tx, rx) = channel();
                (Some(tx), Some(rx))
            }
        };
        *self.sent.borrow_mut() += 1;
        self.to[dest].send(Msg { tag, data: buf.to_vec(), ack }).map_err(|_| Error::PeerGone { rank: dest })?;
        Ok(done)
    }

    fn complete(&self, done: Option<Receiver<()>>, dest: usize) -> Result<()> {
        match done.map(|d| d.recv_timeout(TIMEOUT)) {
            None | Some(Ok(())) => Ok(()),
            Some(Err(RecvTimeoutError::Timeout)) => {
                Err(Error::State(format!("rank {}: send to {dest} not matched within {TIMEOUT:?} (deadlock?)", self.rank)))
            }
            Some(Err(RecvTimeoutError::Disconnected)) => Err(Error::PeerGone { rank: dest }),
        }
    }

    /// A message from `src` with `tag` if one has come (parking the others it passes).
    fn try_take(&self, src: usize, tag: u32) -> Result<Option<Msg>> {
        if let Some(m) = self.parked.borrow_mut().get_mut(&(src, tag)).and_then(VecDeque::pop_front) {
            return Ok(Some(m));
        }
        loop {
            match self.from[src].try_recv() {
                Ok(m) if m.tag == tag => return Ok(Some(m)),
                Ok(m) => self.parked.borrow_mut().entry((src, m.tag)).or_default().push_back(m),
                Err(std::sync::mpsc::TryRecvError::Empty) => return Ok(None),
                Err(std::sync::mpsc::TryRecvError::Disconnected) => return Err(Error::PeerGone { rank: src }),
            }
        }
    }

    /// Takes one message for each of `want` (source, tag), in whatever order they come.
    fn take_all(&self, want: &[(usize, u32)]) -> Result<Vec<Msg>> {
        let mut got: Vec<Option<Msg>> = want.iter().map(|_| None).collect();
        let start = std::time::Instant::now();
        let mut left = want.len();
        while left > 0 {
            let mut moved = false;
            for (i, &(src, tag)) in want.iter().enumerate() {
                // Receives of one (source, tag) match in the order they were posted.
                if got[i].is_none() && want[..i].iter().zip(&got).all(|(w, g)| *w != (src, tag) || g.is_some()) {
                    if let Some(m) = self.try_take(src, tag)? {
                        got[i] = Some(m);
                        left -= 1;
                        moved = true;
                    }
                }
            }
            if !moved {
                if start.elapsed() > TIMEOUT {
                    let missing: Vec<_> = want.iter().zip(&got).filter(|(_, g)| g.is_none()).map(|(w, _)| *w).collect();
                    return Err(Error::State(format!("rank {}: nothing from {missing:?} within {TIMEOUT:?} (deadlock?)", self.rank)));
                }
                std::thread::sleep(Duration::from_micros(20));
            }
        }
        Ok(got.into_iter().flatten().collect())
    }

    fn take(&self, src: usize, tag: u32) -> Result<Msg> {
        if let Some(m) = self.parked.borrow_mut().get_mut(&(src, tag)).and_then(VecDeque::pop_front) {
            return Ok(m);
        }
        loop {
            let m = self.from[src].recv_timeout(TIMEOUT).map_err(|e| match e {
                RecvTimeoutError::Timeout => {
                    Error::State(format!("rank {}: nothing from {src} tag {tag} within {TIMEOUT:?} (deadlock?)", self.rank))
                }
                RecvTimeoutError::Disconnected => Error::PeerGone { rank: src },
            })?;
            if m.tag == tag {
                return Ok(m);
            }
            self.parked.borrow_mut().entry((src, m.tag)).or_default().push_back(m);
        }
    }
}

/// The buffers of a plan run by the harness.
struct Bufs<'a> {
    input: &'a [u8],
    output: &'a mut [u8],
    temps: Vec<Vec<u8>>,
}

impl Bufs<'_> {
    fn slice(&self, s: Span) -> Result<&[u8]> {
        let b: &[u8] = match s.buf {
            Buf::In => self.input,
            Buf::Out => self.output,
            Buf::Temp(i) => self.temps.get(i).ok_or_else(|| Error::State(format!("no scratch buffer {i}")))?,
        };
        b.get(s.off..s.off + s.len).ok_or_else(|| Error::State(format!("span {s:?} outside its buffer of {} bytes", b.len())))
    }

    fn slice_mut(&mut self, s: Span) -> Result<&mut [u8]> {
        if s.len == 0 {
            return Ok(&mut []);
        }
        let b: &mut [u8] = match s.buf {
            Buf::In => return Err(Error::State("a write into the send buffer".into())),
            Buf::Out => self.output,
            Buf::Temp(i) => self.temps.get_mut(i).ok_or_else(|| Error::State(format!("no scratch buffer {i}")))?,
        };
        let n = b.len();
        b.get_mut(s.off..s.off + s.len).ok_or_else(|| Error::State(format!("span {s:?} outside its buffer of {n} bytes")))
    }
}

impl ThreadP2p {
    /// One round of `plan` (see the module docs); `degraded`: a tolerant plan's first error.
    fn run_round(&self, plan: &Plan, i: usize, bufs: &mut Bufs<'_>, degraded: &mut Option<Error>) -> Result<()> {
        let mut posted = Vec::new();
        let mut recvs: Vec<(Span, usize, u32)> = Vec::new();
        for a in plan.round_acts(i) {
            match *a {
                Action::Send { s, dest, tag } => {
                    let data = if degraded.is_some() { &[][..] } else { bufs.slice(s)? };
                    posted.push((self.post(data, dest, tag)?, dest));
                }
                Action::Recv { s, src, tag } => recvs.push((s, src, tag)),
                _ if degraded.is_some() => {}
                Action::Copy { from, to } => {
                    let d = bufs.slice(from)?.to_vec();
                    bufs.slice_mut(to)?.copy_from_slice(&d);
                }
                Action::Reduce { from, acc, left } => {
                    let d = bufs.slice(from)?.to_vec();
                    let f = plan.reduce.as_ref().ok_or_else(|| Error::State("no reduction".into()))?;
                    f(&d, bufs.slice_mut(acc)?, left)?;
                }
            }
        }
        let want: Vec<(usize, u32)> = recvs.iter().map(|r| (r.1, r.2)).collect();
        for ((s, src, tag), m) in recvs.into_iter().zip(self.take_all(&want)?) {
            if let Some(ack) = m.ack {
                let _ = ack.send(());
            }
            let r = if m.data.len() > s.len {
                Err(Error::Truncated { source_rank: src, tag, len: m.data.len(), capacity: s.len })
            } else if m.data.len() < s.len && degraded.is_none() {
                Err(super::short_message(m.data.len(), s.len, src))
            } else {
                bufs.slice_mut(s)?[..m.data.len()].copy_from_slice(&m.data);
                Ok(())
            };
            match r {
                Err(e) if plan.tolerant && !matches!(e, Error::PeerGone { .. }) => {
                    degraded.get_or_insert(e);
                }
                r => r?,
            }
        }
        for (done, dest) in posted {
            self.complete(done, dest)?;
        }
        Ok(())
    }
}

impl CollP2p for ThreadP2p {
    fn rank(&self) -> usize {
        self.rank
    }
    fn size(&self) -> usize {
        self.size
    }
    fn setting(&self) -> Setting<'_> {
        Setting { rank: self.rank, size: self.size, force: &self.force, topo: self.topo.as_ref() }
    }
    fn run(&self, mut plan: Plan, input: Option<&[u8]>, output: Option<&mut [u8]>) -> Result<()> {
        plan.check()?;
        let mut none = [];
        let mut bufs = Bufs {
            input: input.unwrap_or(&[]),
            output: output.unwrap_or(&mut none),
            temps: plan.temps.iter().map(|&n| vec![0; n]).collect(),
        };
        let mut degraded = plan.error.take();
        for i in 0..plan.len() {
            self.run_round(&plan, i, &mut bufs, &mut degraded)?;
        }
        degraded.map_or(Ok(()), Err)
    }
    fn send(&self, buf: &[u8], dest: usize, tag: u32) -> Result<()> {
        let done = self.post(buf, dest, tag)?;
        self.complete(done, dest)
    }
    fn recv(&self, buf: &mut [u8], src: usize, tag: u32) -> Result<usize> {
        self.check(src)?;
        let m = self.take(src, tag)?;
        if let Some(ack) = m.ack {
            // The sender may have given up (timeout); nothing to tell it then.
            let _ = ack.send(());
        }
        if m.data.len() > buf.len() {
            return Err(Error::Truncated { source_rank: src, tag, len: m.data.len(), capacity: buf.len() });
        }
        buf[..m.data.len()].copy_from_slice(&m.data);
        Ok(m.data.len())
    }
    fn sendrecv(&self, sbuf: &[u8], dest: usize, stag: u32, rbuf: &mut [u8], src: usize, rtag: u32) -> Result<usize> {
        self.check(src)?;
        let done = self.post(sbuf, dest, stag)?;
        let n = self.recv(rbuf, src, rtag)?;
        self.complete(done, dest)?;
        Ok(n)
    }
}

/// Runs `f` on `n` ranks (threads) and returns each rank's result, in rank order.
pub(super) fn run<R: Send>(n: usize, mode: Mode, f: impl Fn(&ThreadP2p) -> R + Sync) -> Vec<R> {
    run_on(n, mode, None, Force::AUTO, f)
}

/// [`run`] with rank `r` on host `hosts[r]` (`None`: one host) and the overrides `force`.
pub(super) fn run_on<R: Send>(n: usize, mode: Mode, hosts: Option<&[usize]>, force: Force, f: impl Fn(&ThreadP2p) -> R + Sync) -> Vec<R> {
    let topo = hosts.map(|h| Topo::from_hosts(h.to_vec())).filter(|t| t.hosts() > 1);
    // txs[src][dst] / rxs[dst][src]
    let mut txs: Vec<Vec<Sender<Msg>>> = (0..n).map(|_| Vec::with_capacity(n)).collect();
    let mut rxs: Vec<Vec<Option<Receiver<Msg>>>> = (0..n).map(|_| (0..n).map(|_| None).collect()).collect();
    for (src, row) in txs.iter_mut().enumerate() {
        for rx_row in rxs.iter_mut() {
            let (tx, rx) = channel();
            row.push(tx);
            rx_row[src] = Some(rx);
        }
    }
    let eps: Vec<ThreadP2p> = txs
        .into_iter()
        .zip(rxs)
        .enumerate()
        .map(|(rank, (to, from))| ThreadP2p {
            rank,
            size: n,
            mode,
            to,
            from: from.into_iter().flatten().collect(),
            parked: RefCell::new(HashMap::new()),
            sent: RefCell::new(0),
            force,
            topo: topo.clone(),
        })
        .collect();
    let f = &f;
    std::thread::scope(|s| {
        let hs: Vec<_> = eps
            .into_iter()
            .map(|ep| {
                std::thread::Builder::new()
                    .name(format!("rank{}", ep.rank))
                    .spawn_scoped(s, move || f(&ep))
                    .expect("spawn test rank thread")
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("test rank thread panicked")).collect()
    })
}
