//! Single copy (CMA): after a grant, the reader copies its share of a rendezvous with
//! `process_vm_readv`; from 128 KiB the target writes the other share with
//! `process_vm_writev` at the same time. A kernel refusal turns single copy off for good.
//!
//! Shared heap: a grant that names the target's heap is copied with one memcpy from this
//! rank's mapping of it, and a share owed to a reader whose buffer is in its heap is written
//! with one memcpy into our mapping of that heap. A heap that cannot be mapped falls back to
//! the ring for that peer.

#[cfg(feature = "ofi")]
use super::reader::ReadPhase;
use super::*;
use crate::buffer::{RawBufMut, CMA_MANY};

/// Single-copy reads of at most this many bytes queued together from one rank are copied with
/// one `process_vm_readv` (up to [`CMA_MANY`] reads and [`CMA_BATCH_BYTES`] in all), and the
/// shares a target writes for one reader with one `process_vm_writev`: the call's fixed cost
/// (about 0.3 us here) is a quarter of a 16 KiB copy, 3% of 64 KiB. Up to 256 KiB and 1 MiB a
/// call (was 64 KiB and 256 KiB): `osu_bw` 128/256 KiB 1.11/1.12x the bytes, `osu_bibw`
/// 1.08/1.02x (7 runs); reads of 512 KiB gained nothing batched by two or four.
const CMA_BATCH_READ_MAX: usize = 256 << 10;
/// ...and at most this many bytes per call: the first read's FIN waits for the whole copy.
const CMA_BATCH_BYTES: usize = 1 << 20;

impl Engine {
    /// Copies the data of granted reads straight from the target's memory (one kernel copy).
    /// If the kernel refuses (permissions, seccomp), single copy is off for good and the read
    /// is asked again in streaming mode.
    #[cold]
    pub(in crate::engine) fn run_cma(&mut self) -> Result<usize> {
        let mut n = 0;
        while let Some(key) = self.st.outbox.next_read() {
            let Some(op) = self.st.reads.get(key) else {
                self.st.ways.heaps.grants.remove(&(key.idx(), key.gen()));
                continue;
            };
            #[cfg(feature = "ofi")]
            if let ReadPhase::Fabric { .. } = op.phase {
                self.post_fabric_read(key);
                n += 1;
                continue;
            }
            let (src, rid, len, va, total) = (op.src, op.rid, op.split(), op.info.rvh.va, op.n);
            let pid = self.fabric.peer_pid(src);
            let buf = match self.st.reqs.get(rid) {
                Some(Req { kind: ReqKind::Recv(r), .. }) => r.buf,
                _ => None,
            };
            if let Some(h) = self.st.ways.heaps.grants.remove(&(key.idx(), key.gen())) {
                self.copy_from_heap(key, (src, pid, h), buf, len, total)?;
                self.st.drain_cq()?;
                n += 1;
                continue;
            }
            if len == 0 {
                // The target writes everything into our shared heap.
                self.st.read_progress(key, 0)?;
                self.st.drain_cq()?;
                n += 1;
                continue;
            }
            if let (Some(b), true) = (buf, len <= CMA_BATCH_READ_MAX) {
                if let Some(k) = self.cma_batch(key, src, pid, (b, len, va))? {
                    n += k;
                    continue;
                }
            }
            self.cma_one(key, pid, buf, len, va)?;
            n += 1;
        }
        Ok(n)
    }

    /// Copies `[0, len)` of read `key` (of `total` bytes) from the range `h` of the shared
    /// heap of `src` (process `pid`) into `buf` with one memcpy; a heap that cannot be mapped
    /// here asks for the bytes through the ring instead.
    fn copy_from_heap(
        &mut self,
        key: Key,
        (src, pid, h): (usize, u32, HeapSrc),
        buf: Option<RawBufMut>,
        len: usize,
        total: usize,
    ) -> Result<()> {
        let copied = match buf {
            None => Some(Ok(())),
            Some(b) => {
                let streaming = self.st.around_cache(total);
                self.st.ways.heaps.peer(src, pid, h.desc).map(|p| b.fill_with(0, len, |dst| p.read(h.off, dst, streaming)))
            }
        };
        match copied {
            Some(Ok(())) => {
                self.st.ways.heaps.bytes += len as u64;
                self.st.read_progress(key, len)?;
            }
            None => {
                // Its heap cannot be mapped here: ask for our share through the ring.
                self.st.ways.heaps.fallbacks += 1;
                self.st.request_streamed(key, len);
            }
            Some(Err(_)) => {
                if let Some(op) = self.st.reads.get_mut(key) {
                    op.phase = op.phase.failed(op.n);
                }
                self.st.read_progress(key, len)?;
            }
        }
        Ok(())
    }

    /// Copies plain single-copy read `first` with the reads queued behind it from the same
    /// rank, in one system call (see [`CMA_BATCH_READ_MAX`]); `None` when none can join it
    /// (the caller copies it alone). Reads the batch could not fill (a bad range, a refusal)
    /// are copied one by one, as alone.
    fn cma_batch(&mut self, key: Key, src: usize, pid: u32, first: (RawBufMut, usize, u64)) -> Result<Option<usize>> {
        let mut keys = [key; CMA_MANY];
        let mut reads = [(RawBufMut::empty(), 0, 0); CMA_MANY];
        reads[0] = first;
        let (mut k, mut total) = (1, first.1);
        while k < CMA_MANY {
            let Some(next) = self.st.outbox.peek_read() else { break };
            let Some(op) = self.st.reads.get(next) else { break };
            let len = op.split();
            if op.src != src || len == 0 || len > CMA_BATCH_READ_MAX || total + len > CMA_BATCH_BYTES {
                break;
            }
            if !self.st.ways.heaps.grants.is_empty() && self.st.ways.heaps.grants.contains_key(&(next.idx(), next.gen())) {
                break;
            }
            let Some(Req { kind: ReqKind::Recv(RecvState { buf: Some(b), .. }), .. }) = self.st.reqs.get(op.rid) else { break };
            (keys[k], reads[k]) = (next, (*b, len, op.info.rvh.va));
            self.st.outbox.next_read();
            (k, total) = (k + 1, total + len);
        }
        if k == 1 {
            return Ok(None);
        }
        let want: usize = reads[..k].iter().map(|(b, len, _)| (*len).min(b.cap())).sum();
        let batched = matches!(crate::buffer::cma_read_many(pid, &reads[..k]), Some(Ok(moved)) if moved == want);
        if batched {
            self.st.stats.cma_batched += k as u64;
        }
        for (i, (&key, &(b, len, va))) in keys[..k].iter().zip(&reads[..k]).enumerate() {
            let r = if batched {
                self.st.stats.cma_reads += 1;
                self.st.stats.cma_bytes += len as u64;
                self.st.read_progress(key, len).and_then(|()| self.st.drain_cq())
            } else {
                self.cma_one(key, pid, Some(b), len, va)
            };
            if let Err(e) = r {
                // The reads not yet done go back to the front of the queue, in order (a
                // batched one is copied again): none is lost.
                for &rest in keys[i + 1..k].iter().rev() {
                    self.st.outbox.unread(rest);
                }
                return Err(e);
            }
        }
        Ok(Some(k))
    }

    /// Copies `len` bytes of single-copy read `key` from address `va` of process `pid` into
    /// `buf`, with a system call of its own.
    fn cma_one(&mut self, key: Key, pid: u32, buf: Option<RawBufMut>, len: usize, va: u64) -> Result<()> {
        // An abandoned receive has no buffer: nothing to copy, the send still gets its FIN.
        let r = buf.map_or(Ok(()), |b| b.fill_with(0, len, |dst| cma::read(pid, va, dst)));
        match r {
            Ok(()) => {
                self.st.stats.cma_reads += 1;
                self.st.stats.cma_bytes += len as u64;
                self.st.read_progress(key, len)?;
            }
            Err(e) if e.is_unsupported() => {
                // Ask for our share through the ring (the target's share comes its own way).
                self.st.ways.cma = false;
                self.st.stats.cma_fallbacks += 1;
                self.st.request_streamed(key, len);
            }
            Err(_) => {
                if let Some(op) = self.st.reads.get_mut(key) {
                    op.phase = op.phase.failed(op.n);
                }
                self.st.read_progress(key, len)?;
            }
        }
        // A read the TM-SRQ issued completes there: collect its completion and FIN.
        self.st.drain_cq()
    }

    /// Writes this rank's shares of split single-copy reads into the readers' buffers, then
    /// tells each reader. If the kernel refuses, the share is streamed through the ring.
    ///
    /// A share streamed instead of written waits until no control packet to its reader is
    /// queued: the grant that told the reader its split goes first. (The grant of a heap write
    /// leaves the whole read to this rank; streamed ahead of it, the data completed the read,
    /// and the grant then named a read the reader no longer had: "read grant for no read".)
    #[cold]
    pub(in crate::engine) fn run_cma_writes(&mut self) -> Result<usize> {
        let mut n = 0;
        let mut later = Vec::new();
        while let Some(w) = self.st.outbox.next_write() {
            let pid = self.fabric.peer_pid(w.dest);
            let whole = w.buf.slice(0, w.buf.len());
            let granting = |st: &State| st.outbox.has_ctl_for(w.dest);
            if let Some(h) = self.st.ways.heaps.writes.remove(&(w.dest, w.read)) {
                match self.st.ways.heaps.peer(w.dest, pid, h.desc) {
                    Some(p) => {
                        // The read's whole length decides, as for the reader's part.
                        let streaming = w.base + whole.len() >= tmpi_transport::shm::streaming_copy_min();
                        // SAFETY: `h` names the reader's receive buffer in its shared heap, as
                        // its read request did, and `[base, base + len)` is the share our grant
                        // left to us (inside the read, checked when it was made); the reader
                        // keeps that buffer lent until our WRITE_DONE or READ_ERR arrives, even
                        // if its receive is abandoned. `write` checks the range is in the heap.
                        match unsafe { p.write(h.off.wrapping_add(w.base as u64), whole, streaming) } {
                            Ok(()) => {
                                self.st.ways.heaps.bytes += whole.len() as u64;
                                self.st.outbox.rma(w.dest, Rma::WriteDone { read: w.read });
                            }
                            Err(_) => self.st.outbox.rma(w.dest, Rma::ReadErr { read: w.read }),
                        }
                    }
                    None => {
                        if granting(&self.st) {
                            self.st.ways.heaps.writes.insert((w.dest, w.read), h);
                            later.push(w);
                            continue;
                        }
                        // The reader's heap cannot be mapped here: stream the share.
                        self.st.ways.heaps.fallbacks += 1;
                        self.st.outbox.stream(RmaOut { dest: w.dest, read: w.read, buf: w.buf, off: 0, base: w.base });
                    }
                }
                n += 1;
                continue;
            }
            if pid == std::process::id() {
                // Ranks that are threads of this process: no cross-process write; stream it.
                if granting(&self.st) {
                    later.push(w);
                    continue;
                }
                self.st.outbox.stream(RmaOut { dest: w.dest, read: w.read, buf: w.buf, off: 0, base: w.base });
                n += 1;
                continue;
            }
            if whole.len() <= CMA_BATCH_READ_MAX {
                n += self.cma_write_batch(w, pid);
                continue;
            }
            self.cma_write_one(w, pid);
            n += 1;
        }
        self.st.outbox.requeue_writes(later);
        Ok(n)
    }

    /// Writes share `first` with the shares queued behind it for the same reader, in one
    /// system call (the limits of [`Engine::cma_batch`]); shares the call could not write (a
    /// bad range, a refusal) are written one by one, as alone. Returns the shares written.
    fn cma_write_batch(&mut self, first: CmaWrite, pid: u32) -> usize {
        let mut ws = [first; CMA_MANY];
        let (mut k, mut total) = (1, first.buf.len());
        while k < CMA_MANY {
            let Some(w) = self.st.outbox.peek_write() else { break };
            let len = w.buf.len();
            if w.dest != first.dest || len > CMA_BATCH_READ_MAX || total + len > CMA_BATCH_BYTES {
                break;
            }
            if !self.st.ways.heaps.writes.is_empty() && self.st.ways.heaps.writes.contains_key(&(w.dest, w.read)) {
                break;
            }
            ws[k] = *w;
            self.st.outbox.next_write();
            (k, total) = (k + 1, total + len);
        }
        if k == 1 {
            self.cma_write_one(first, pid);
            return 1;
        }
        let ws = &ws[..k];
        let mut parts: [(u64, &[u8]); CMA_MANY] = [(0, &[]); CMA_MANY];
        for (p, w) in parts.iter_mut().zip(ws) {
            *p = (w.dst.wrapping_add(w.base as u64), w.buf.slice(0, w.buf.len()));
        }
        // SAFETY: as for one share (`cma_write_one`), for each: `dst` is the receive buffer
        // its reader named in its read request and `[base, base + len)` the share its grant
        // left to us; each reader keeps its buffer alive and untouched until our WRITE_DONE
        // or READ_ERR arrives. `pid` is not this process (checked by the caller).
        let batched = matches!(unsafe { cma::write_many(pid, &parts[..k]) }, Ok(moved) if moved == total);
        for &w in ws {
            if batched {
                self.st.stats.cma_bytes += w.buf.len() as u64;
                self.st.outbox.rma(w.dest, Rma::WriteDone { read: w.read });
            } else {
                self.cma_write_one(w, pid);
            }
        }
        if batched {
            self.st.stats.cma_batched += k as u64;
        }
        k
    }

    /// Writes share `w` into its reader (process `pid`, not this one) with a system call of
    /// its own, and tells the reader.
    fn cma_write_one(&mut self, w: CmaWrite, pid: u32) {
        let whole = w.buf.slice(0, w.buf.len());
        // SAFETY: `dst` is the receive buffer the reader named in its single-copy read
        // request, and `[base, base + len)` is the share its grant left to us (checked
        // against the read's length when the grant was made). The reader keeps that
        // buffer alive and untouched until our WRITE_DONE or READ_ERR arrives, even if
        // its receive is abandoned (it waits for the share while we are alive).
        match unsafe { cma::write(pid, w.dst.wrapping_add(w.base as u64), whole) } {
            Ok(()) => {
                self.st.stats.cma_bytes += whole.len() as u64;
                self.st.outbox.rma(w.dest, Rma::WriteDone { read: w.read });
            }
            Err(e) if e.is_unsupported() => {
                self.st.ways.cma = false;
                self.st.stats.cma_fallbacks += 1;
                self.st.outbox.stream(RmaOut { dest: w.dest, read: w.read, buf: w.buf, off: 0, base: w.base });
            }
            Err(_) => {
                self.st.outbox.rma(w.dest, Rma::ReadErr { read: w.read });
            }
        }
    }
}
