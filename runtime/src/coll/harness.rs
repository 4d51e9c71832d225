//! Test harness: ranks as threads, [`CollP2p`] over `std::sync::mpsc` channels.
//!
//! One channel per ordered (source, destination) pair keeps messages non-overtaking per pair;
//! each rank parks messages whose tag it is not waiting for in a map keyed by (source, tag), so
//! receives in any tag order work. In [`Mode::Rendezvous`] a send returns only after the
//! receiver has matched it (like a rendezvous-protocol or synchronous send), so an algorithm
//! that relies on buffering would deadlock, and the timeouts turn that into a test failure.

use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender};
use std::time::Duration;

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

impl CollP2p for ThreadP2p {
    fn rank(&self) -> usize {
        self.rank
    }
    fn size(&self) -> usize {
        self.size
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
