//! Shared-memory fabric: one segment per job in `/dev/shm`, one single-producer ring per
//! ordered pair of ranks.
//!
//! - [`segment`]: creating, opening and checking the mapped file (magic, version, layout).
//! - [`cma`]: single-copy transfers between processes (process_vm_readv/writev).
//! - [`heap`]: the shared heap, memory of one rank that peers map and copy with memcpy.
//! - [`ring`]: the lock-free single-producer/single-consumer ring of variable-size records.
//! - [`futex`]: the doorbell's sleep and wake (Linux futexes on words of the segment).
//!
//! Doorbells: a rank with nothing to do for a while sleeps in the kernel ([`ShmFabric::doze`])
//! instead of polling, and whoever writes to it wakes it: a packet into its ring
//! ([`ShmFabric::try_send`]) or a collective flag ([`ShmFabric::wake`]). The writer looks at
//! the sleeper's `sleeping` word and makes the system call only when it is set, so a rank
//! that is not asleep costs its peers one load per packet. The sleeper sets `sleeping`, then
//! looks for work once more, then sleeps with a timeout: a wake-up is lost only when a
//! packet's store and the sender's load of `sleeping` pass each other in the store buffers
//! (the ring path has no fence, to keep it cheap), and then the timeout ends the sleep.
//!
//! [`ShmFabric`] ties them together for one rank: it sends packets into the ring of each
//! destination and polls the rings of every source. It is the only place with `unsafe` in
//! the fabric besides the two modules above.
//!
//! Trust model: ranks of one job trust each other (as with any MPI). A corrupt record header
//! is still caught (length and position checks) and reported as [`crate::Error::Malformed`]
//! rather than read out of bounds.

pub mod cma;
pub mod futex;
pub mod heap;
pub mod ring;
pub mod segment;

use crate::error::{Error, Result};
use crate::fabric::Packet;
use ring::{Consumer, Producer};
use segment::Segment;
use std::sync::atomic::{AtomicU32, Ordering};

/// One rank's view of the job's shared-memory fabric.
pub struct ShmFabric {
    seg: Segment,
    rank: usize,
    size: usize,
    tx: Vec<Option<Producer>>,
    rx: Vec<Option<Consumer>>,
    /// Sources with a ring (every rank but this one), in polling order.
    sources: Vec<usize>,
    next_src: usize,
}

impl ShmFabric {
    /// Creates the segment `/dev/shm/<name>` for `size` ranks (rank 0 does this, before the
    /// others open it).
    ///
    /// # Errors
    /// I/O errors creating or mapping the file; an existing file of that name.
    pub fn create(name: &str, rank: usize, size: usize, ring_size: usize) -> Result<Self> {
        let seg = Segment::create(name, size, ring_size)?;
        Self::from_segment(seg, rank)
    }

    /// Opens the segment that rank 0 created.
    ///
    /// # Errors
    /// I/O errors, or a segment whose header does not match this build or job size.
    pub fn open(name: &str, rank: usize, size: usize) -> Result<Self> {
        let seg = Segment::open(name, size)?;
        Self::from_segment(seg, rank)
    }

    fn from_segment(seg: Segment, rank: usize) -> Result<Self> {
        let size = seg.nranks();
        if rank >= size {
            return Err(Error::InvalidArgument(format!("rank {rank} >= size {size}")));
        }
        let mut tx = Vec::with_capacity(size);
        let mut rx = Vec::with_capacity(size);
        for peer in 0..size {
            if peer == rank {
                tx.push(None);
                rx.push(None);
            } else {
                tx.push(Some(seg.producer(rank, peer)));
                rx.push(Some(seg.consumer(peer, rank)));
            }
        }
        seg.set_pid(rank, std::process::id());
        let sources = (0..size).filter(|&p| p != rank).collect();
        Ok(ShmFabric { seg, rank, size, tx, rx, sources, next_src: 0 })
    }

    /// Removes the segment's name from `/dev/shm` (mappings stay valid). Called once every
    /// rank has opened it.
    ///
    /// # Errors
    /// The unlink failed for a reason other than the file being gone already.
    pub fn unlink(&self) -> Result<()> {
        self.seg.unlink()
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Number of ranks in the job.
    pub fn size(&self) -> usize {
        self.size
    }

    /// The largest packet payload one record carries.
    pub fn max_packet(&self) -> usize {
        self.seg.max_record_payload()
    }

    /// Process id that rank `peer` recorded in the segment (0 if it has not attached yet).
    pub fn peer_pid(&self, peer: usize) -> u32 {
        self.seg.pid(peer)
    }

    /// Whether rank `peer` has detached from the segment (dropped its fabric: finished or
    /// unwound). A process that died without detaching is found by its pid instead.
    pub fn peer_departed(&self, peer: usize) -> bool {
        peer < self.size && self.seg.gone(peer) != 0
    }

    /// Whether rank `peer` finalized cleanly (it will send nothing more, and that is fine).
    pub fn peer_finalized(&self, peer: usize) -> bool {
        peer < self.size && self.seg.gone(peer) == segment::GONE_FINALIZED
    }

    /// Whether a packet from `src` waits in its ring. Read [`Self::peer_finalized`] first:
    /// whatever a peer pushed before it finalized is then visible here. A corrupt record
    /// counts as pending (the next poll reports it).
    pub fn pending_from(&mut self, src: usize) -> bool {
        match self.rx.get_mut(src) {
            Some(Some(c)) => !matches!(c.peek(), Ok(None)),
            _ => false,
        }
    }

    /// Records that this rank finalized cleanly.
    pub fn mark_finalized(&self) {
        self.seg.set_gone(self.rank, segment::GONE_FINALIZED);
    }

    /// Tries to put one packet (the concatenation of `parts`) into `dest`'s ring. Returns
    /// `Ok(false)` when the ring has no room now (back-pressure: make progress and retry).
    ///
    /// # Errors
    /// `dest` is this rank or out of range, or the packet is larger than [`Self::max_packet`].
    #[inline]
    pub fn try_send(&mut self, dest: usize, flags: u8, total_len: u64, parts: &[&[u8]]) -> Result<bool> {
        let pushed = match self.tx.get_mut(dest) {
            Some(Some(p)) => p.try_push(flags, total_len, parts)?,
            _ => return Err(Error::InvalidArgument(format!("no ring from rank {} to {dest}", self.rank))),
        };
        if pushed {
            let (sleeping, bell) = self.seg.doorbell(dest);
            if sleeping.load(Ordering::Relaxed) != 0 {
                ring_bell(bell);
            }
        }
        Ok(pushed)
    }

    /// The job's segment (collective contexts, doorbells).
    pub fn segment(&self) -> &Segment {
        &self.seg
    }

    /// Wakes rank `rank` if it sleeps on its doorbell; call after a store it may wait for
    /// (a collective flag). Fenced, so the store is visible before `sleeping` is read: the
    /// wake-up cannot be lost.
    pub fn wake(&self, rank: usize) {
        if rank >= self.size {
            return;
        }
        std::sync::atomic::fence(Ordering::SeqCst);
        let (sleeping, bell) = self.seg.doorbell(rank);
        if sleeping.load(Ordering::Relaxed) != 0 {
            ring_bell(bell);
        }
    }

    /// Sleeps on this rank's doorbell for at most `timeout`, unless a packet waits in a ring
    /// or `busy(segment)` says there is something to do (it is asked after the rank announced
    /// its sleep, so whatever a peer writes after that rings the bell). Any wake-up, timeout
    /// or signal ends it; the caller re-checks what it waits for.
    pub fn doze(&mut self, timeout: std::time::Duration, busy: impl FnOnce(&Segment) -> bool) {
        let (sleeping, bell) = self.seg.doorbell(self.rank);
        let seen = bell.load(Ordering::Acquire);
        sleeping.store(1, Ordering::Relaxed);
        std::sync::atomic::fence(Ordering::SeqCst);
        let mut idle = true;
        for c in self.rx.iter_mut().flatten() {
            if !matches!(c.peek(), Ok(None)) {
                idle = false;
                break;
            }
        }
        if idle && !busy(&self.seg) {
            futex::wait(bell, seen, timeout);
        }
        sleeping.store(0, Ordering::Relaxed);
    }

    /// Delivers at most one packet from each source that has one, round-robin, to `f`;
    /// returns how many were delivered. A packet's bytes are valid only during the call.
    ///
    /// `f` returns `false` to leave a packet in its ring (flow control); it is offered again
    /// on the next poll.
    ///
    /// # Errors
    /// A corrupt record (bad length); the packet is not delivered.
    #[inline]
    pub fn poll<F: FnMut(Packet<'_>) -> bool>(&mut self, mut f: F) -> Result<usize> {
        let n = self.sources.len();
        let mut delivered = 0;
        for i in 0..n {
            let mut idx = self.next_src + i;
            if idx >= n {
                idx -= n;
            }
            let src = self.sources[idx];
            let Some(Some(c)) = self.rx.get_mut(src) else { continue };
            if let Some(rec) = c.peek()? {
                let pkt = Packet { src, flags: rec.flags, total_len: rec.total_len, data: rec.data };
                if f(pkt) {
                    let len = rec.data.len();
                    c.release(len);
                    delivered += 1;
                }
            }
        }
        self.next_src = if self.next_src + 1 >= n { 0 } else { self.next_src + 1 };
        Ok(delivered)
    }
}

/// Wakes the sleeper on `bell`.
#[cold]
fn ring_bell(bell: &AtomicU32) {
    bell.fetch_add(1, Ordering::Release);
    futex::wake(bell);
}

impl Drop for ShmFabric {
    fn drop(&mut self) {
        self.seg.set_gone(self.rank, segment::GONE_DETACHED);
    }
}
