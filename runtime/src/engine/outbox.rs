//! The outbox: everything that leaves the engine other than the data messages themselves.
//!
//! The arrival side (`State`, inside the fabric's poll callback) may not touch the fabric, and
//! the stages that answer a packet do so from there; so whatever they have to send or do goes
//! into this one box, which [`Engine::progress`] empties around the poll:
//!
//! - **control packets** (`NO_TAG` messages: acknowledgements, credit, aborts, revokes,
//!   advice) and FINs, which pass through the peer's TM-SRQ, and **RMA packets** (read
//!   requests, grants, refusals, write completions), which bypass it: [`Outbox::control`],
//!   [`Outbox::fin`], [`Outbox::rma`], sent by [`Engine::flush_ctl`] after the poll;
//! - **read responses** to stream ([`Outbox::stream`], [`Engine::push_streams`]);
//! - **single-copy reads** to make and **shares to write** into readers
//!   ([`Outbox::copy_read`], [`Outbox::copy_write`], run by `rndv::single_copy`);
//! - **failures** ([`Outbox::fail`]).
//!
//! # When a failure surfaces
//!
//! A stage that meets an error it cannot return (inside the poll callback, or in a clean-up
//! such as a cancel, an abandon's wait or a collective's abort notices) records it here. The
//! first one is kept, later ones are dropped (they follow from it). It surfaces as the error
//! of the engine's next step that can return one: [`Engine::progress`] returns it at its
//! start if it was recorded outside a round of progress, or right after the poll if the
//! poll's packets recorded it (that round does nothing more); a self-delivery returns it
//! before it delivers. While a failure waits, the fabric's packets stay where they are (the
//! arrival side refuses them), so none is lost. A wait that must keep polling through errors
//! (`Engine::progress_while`) keeps the first one it meets and records it here when it ends.

use super::*;

/// A small packet queued for sending (control, FIN, RMA requests).
#[derive(Clone, Copy)]
pub(super) struct Ctl {
    pub(super) flags: u8,
    pub(super) len: u8,
    pub(super) bytes: [u8; CTL_MAX],
}

/// Largest control packet (an RDMA read request naming a shared-heap destination).
const CTL_MAX: usize = RMA_MAX_LEN;

impl Ctl {
    fn new(flags: u8, b: &[u8]) -> Self {
        let mut bytes = [0u8; CTL_MAX];
        bytes[..b.len()].copy_from_slice(b);
        Ctl { flags, len: b.len() as u8, bytes }
    }

    /// The packet's bytes.
    pub(super) fn bytes(&self) -> &[u8] {
        &self.bytes[..self.len as usize]
    }
}

/// What leaves the engine besides data messages (see the module docs).
#[derive(Default)]
pub(super) struct Outbox {
    /// Control, FIN and RMA packets, in the order they were queued.
    ctl: VecDeque<(usize, Ctl)>,
    /// Read responses to stream.
    streams: VecDeque<RmaOut>,
    /// Reads granted by their target (or pre-granted), waiting for this rank to copy them.
    reads: VecDeque<Key>,
    /// This rank's shares of split single-copy reads, to write into the readers.
    writes: VecDeque<CmaWrite>,
    /// The first failure not reported yet.
    failure: Option<Error>,
}

impl Outbox {
    /// Queues control message `c` for `dest`.
    pub(super) fn control(&mut self, dest: usize, c: Control) {
        let mut b = [0u8; CONTROL_MAX_LEN];
        let n = c.encode(&mut b);
        self.ctl.push_back((dest, Ctl::new(PKT_WHOLE, &b[..n])));
    }

    /// Queues an encoded FIN (or any whole message of the TM-SRQ's) for `dest`.
    pub(super) fn fin(&mut self, dest: usize, msg: &[u8]) {
        self.ctl.push_back((dest, Ctl::new(PKT_WHOLE, msg)));
    }

    /// Queues RMA packet `m` (anything but a read response, which is streamed) for `dest`; a
    /// packet that cannot be encoded is a failure.
    pub(super) fn rma(&mut self, dest: usize, m: Rma<'_>) {
        debug_assert!(m.data().is_empty(), "read responses are streamed, not queued");
        let mut bytes = [0u8; CTL_MAX];
        match m.encode(&mut bytes) {
            Ok(n) => self.ctl.push_back((dest, Ctl { flags: PKT_RMA | PKT_WHOLE, len: n as u8, bytes })),
            Err(e) => self.fail(e.into()),
        }
    }

    /// Whether a control or RMA packet for `dest` is queued.
    pub(super) fn has_ctl_for(&self, dest: usize) -> bool {
        self.ctl.iter().any(|&(d, _)| d == dest)
    }

    /// Queues a read response to stream.
    pub(super) fn stream(&mut self, r: RmaOut) {
        self.streams.push_back(r);
    }

    /// Queues read `key` for this rank to copy (single copy or a shared heap).
    pub(super) fn copy_read(&mut self, key: Key) {
        self.reads.push_back(key);
    }

    /// The next read to copy, taken out.
    pub(super) fn next_read(&mut self) -> Option<Key> {
        self.reads.pop_front()
    }

    /// The next read to copy, left in place.
    pub(super) fn peek_read(&self) -> Option<Key> {
        self.reads.front().copied()
    }

    /// Puts read `key` back at the front (it is copied next).
    pub(super) fn unread(&mut self, key: Key) {
        self.reads.push_front(key);
    }

    /// The reads queued to copy.
    pub(super) fn reads_queued(&self) -> impl Iterator<Item = Key> + '_ {
        self.reads.iter().copied()
    }

    /// Keeps only the queued reads for which `keep` holds.
    pub(super) fn retain_reads(&mut self, keep: impl FnMut(&Key) -> bool) {
        self.reads.retain(keep);
    }

    /// Queues a share to write into its reader.
    pub(super) fn copy_write(&mut self, w: CmaWrite) {
        self.writes.push_back(w);
    }

    /// The next share to write, taken out.
    pub(super) fn next_write(&mut self) -> Option<CmaWrite> {
        self.writes.pop_front()
    }

    /// The next share to write, left in place.
    pub(super) fn peek_write(&self) -> Option<&CmaWrite> {
        self.writes.front()
    }

    /// Puts shares back at the end of the queue.
    pub(super) fn requeue_writes(&mut self, ws: impl IntoIterator<Item = CmaWrite>) {
        self.writes.extend(ws);
    }

    /// The shares queued to write.
    pub(super) fn writes_queued(&self) -> impl Iterator<Item = &CmaWrite> + '_ {
        self.writes.iter()
    }

    /// Records a failure: the first is kept (see the module docs).
    pub(super) fn fail(&mut self, e: Error) {
        self.failure.get_or_insert(e);
    }

    /// Whether a failure waits to be reported.
    #[inline(always)]
    pub(super) fn failed(&self) -> bool {
        self.failure.is_some()
    }

    /// The failure waiting to be reported, taken out.
    #[inline(always)]
    pub(super) fn take_failure(&mut self) -> Option<Error> {
        self.failure.take()
    }

    /// Whether nothing waits to go out (packets, streams, copies).
    pub(super) fn is_empty(&self) -> bool {
        self.ctl.is_empty() && self.streams.is_empty() && self.writes.is_empty() && self.reads.is_empty()
    }

    /// Drops everything queued for `peer`, which departed (the reads it granted are the
    /// reader's to drop: see `Engine::drop_work_for_departed`).
    pub(super) fn drop_for(&mut self, peer: usize) {
        self.ctl.retain(|(d, _)| *d != peer);
        self.streams.retain(|r| r.dest != peer);
        self.writes.retain(|w| w.dest != peer);
    }

    /// Stops serving the send buffer `[lo, hi)` (its send was abandoned): read responses and
    /// shares taken from it are dropped, and each of their readers is refused.
    pub(super) fn refuse_range(&mut self, lo: usize, hi: usize) {
        let inside = |a: usize| a >= lo && a < hi.max(lo + 1);
        let mut refused = Vec::new();
        self.streams.retain(|r| {
            let keep = !inside(r.buf.addr());
            if !keep {
                refused.push((r.dest, r.read));
            }
            keep
        });
        self.writes.retain(|w| {
            let keep = !inside(w.buf.addr());
            if !keep {
                refused.push((w.dest, w.read));
            }
            keep
        });
        for (dest, read) in refused {
            self.rma(dest, Rma::ReadErr { read });
        }
    }

    /// Whether read responses wait to be streamed, and shares and reads to be copied (what
    /// progress does before it polls).
    #[inline(always)]
    fn before_poll(&self) -> bool {
        !(self.streams.is_empty() && self.writes.is_empty() && self.reads.is_empty())
    }

    /// The failure waiting to be reported, left in place.
    pub(super) fn failure(&self) -> Option<&Error> {
        self.failure.as_ref()
    }

    #[cfg(test)]
    pub(super) fn ctl(&self) -> &VecDeque<(usize, Ctl)> {
        &self.ctl
    }

    #[cfg(test)]
    pub(super) fn streams(&self) -> &VecDeque<RmaOut> {
        &self.streams
    }

    #[cfg(test)]
    pub(super) fn reads(&self) -> &VecDeque<Key> {
        &self.reads
    }

    #[cfg(test)]
    pub(super) fn writes(&self) -> &VecDeque<CmaWrite> {
        &self.writes
    }

    #[cfg(test)]
    pub(super) fn ctl_mut(&mut self) -> &mut VecDeque<(usize, Ctl)> {
        &mut self.ctl
    }

    #[cfg(test)]
    pub(super) fn streams_mut(&mut self) -> &mut VecDeque<RmaOut> {
        &mut self.streams
    }

    #[cfg(test)]
    pub(super) fn writes_mut(&mut self) -> &mut VecDeque<CmaWrite> {
        &mut self.writes
    }
}

impl Engine {
    /// Empties what goes out before a poll: read responses are streamed, then this rank's
    /// shares are written into their readers, then granted reads are copied.
    #[inline(always)]
    pub(super) fn drain_before_poll(&mut self) -> Result<usize> {
        if !self.st.outbox.before_poll() {
            return Ok(0);
        }
        self.drain_copies()
    }

    #[inline(never)]
    fn drain_copies(&mut self) -> Result<usize> {
        let mut n = 0;
        if !self.st.outbox.streams.is_empty() {
            n += self.push_streams()?;
        }
        if !self.st.outbox.writes.is_empty() {
            n += self.run_cma_writes()?;
        }
        if !self.st.outbox.reads.is_empty() {
            n += self.run_cma()?;
        }
        Ok(n)
    }

    /// Sends queued control and RMA packets, in order. A packet that goes through the peer's
    /// TM-SRQ (ACK, FIN) waits while a multi-packet message to that peer is half sent: a
    /// connection delivers messages whole and in order. RMA packets bypass the TM-SRQ and go
    /// at once. One to this rank is delivered here (a failure waiting is returned first).
    pub(super) fn flush_ctl(&mut self) -> Result<usize> {
        let mut n = 0;
        let mut i = 0;
        // A destination whose fabric refused a packet in this pass takes none after it.
        let mut full: Option<usize> = None;
        while i < self.st.outbox.ctl.len() {
            let (dest, c) = self.st.outbox.ctl[i];
            let msg = c.bytes();
            if full == Some(dest) {
                i += 1;
                continue;
            } else if dest == self.st.rank {
                if let Some(e) = self.st.outbox.take_failure() {
                    return Err(e);
                }
                self.st.outbox.ctl.remove(i);
                let p = Packet { src: dest, flags: c.flags, total_len: msg.len() as u64, data: msg };
                if !self.st.on_packet(p) {
                    return Err(Error::State("loopback control packet refused".into()));
                }
                if let Some(e) = self.st.outbox.take_failure() {
                    return Err(e);
                }
            } else if c.flags & PKT_RMA == 0 && self.out[dest].front().is_some_and(|m| m.started) {
                i += 1;
                continue;
            } else if self.fabric.try_send(dest, c.flags, msg.len() as u64, &[msg])? {
                self.st.outbox.ctl.remove(i);
            } else {
                full = Some(dest);
                i += 1;
                continue;
            }
            n += 1;
        }
        Ok(n)
    }

    /// Whether control or RMA packets wait to be sent.
    #[inline(always)]
    pub(super) fn ctl_queued(&self) -> bool {
        !self.st.outbox.ctl.is_empty()
    }

    /// Streams queued read responses into the fabric: one read after another, except that
    /// reads of half the last-level cache or more ([`streaming_copy_min`]) take turns, one
    /// packet of each in turn.
    ///
    /// Taking turns, the reads of a window that name the same send buffer (`osu_bw` and
    /// `osu_bibw` send one buffer a window's times over) copy each piece of it into the ring
    /// one after another, so the source is read from memory once per window instead of once
    /// per read. Read one after the other, a window of 64 MiB reads re-read their 64 MiB
    /// source, twice the last-level cache, from memory for each: `osu_bibw` 64 MiB moved
    /// 23.0 GB/s against 27.8 taking turns, and `osu_bw` 24.2 against 35.0. Smaller sources
    /// stay in the cache, and there turns made `osu_bw` 32-128 KiB move 0.45-0.51x the bytes
    /// in 2 of 3 runs.
    ///
    /// [`streaming_copy_min`]: tmpi_transport::shm::streaming_copy_min
    pub(super) fn push_streams(&mut self) -> Result<usize> {
        let mut n = 0;
        let turns_min = tmpi_transport::shm::streaming_copy_min();
        let q = &mut self.st.outbox.streams;
        loop {
            let alone = q.len() == 1;
            let Some(r) = q.front_mut() else { break };
            let to = self.peers[r.dest];
            let room = to.max_packet.min(1 << 20) - RMA_RESP_HDR_LEN;
            let cut = eager::Cut::new(to.pipelined && alone, r.buf.len(), room);
            if r.off < r.buf.len() {
                let k = cut.piece(r.buf.len(), r.off);
                let m = Rma::ReadResp { read: r.read, offset: (r.base + r.off) as u64, data: r.buf.slice(r.off, r.off + k) };
                let mut h = [0u8; RMA_MAX_LEN];
                let hlen = m.encode(&mut h)?;
                let total = (hlen + k) as u64;
                if !self.fabric.try_send(r.dest, PKT_RMA, total, &[&h[..hlen], m.data()])? {
                    return Ok(n);
                }
                r.off += k;
                n += 1;
            }
            if r.off < r.buf.len() && r.buf.len() < turns_min {
                continue;
            }
            if let Some(r) = q.pop_front().filter(|r| r.off < r.buf.len()) {
                q.push_back(r);
            }
        }
        Ok(n)
    }
}
