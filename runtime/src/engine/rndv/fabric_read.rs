//! The fabric's own RDMA read as a way of a rendezvous (feature `ofi`, `TMPI_OFI_RNDV`): on a
//! job whose fabric is OFI alone, the sender registers its buffer with `fi_mr_reg` (through
//! the fabric's registration cache, so repeated sends of one buffer hit it) and announces the
//! key after the request's meta-data ([`FabricKey`]); the reader plans the read as
//! [`ReadStart::Fabric`] and `fi_read`s the range straight into its receive buffer; the FIN
//! completes the send, whose registration goes back to the cache.
//!
//! The soft registration stays: the RVH names it, and the target's key check still guards
//! every streamed read. So a send whose `fi_mr_reg` fails goes without a fabric key, and a
//! read whose `fi_read` fails (posting or completing) is asked again as a stream; the
//! message is never lost to it. Truncation: the reader reads `min(message, buffer)` bytes.

use super::reader::ReadPhase;
use super::*;
use crate::config::OfiRndv;
use tmpi_transport::ofi::{read_support, ReadRegion};

/// The fabric-read way's state in the ways stage.
#[derive(Debug, Default)]
pub(in crate::engine) struct FabricReads {
    /// Reads go this way (chosen at init).
    pub(in crate::engine) on: bool,
    /// Reads whose `fi_read` failed and were asked again as streams.
    pub(in crate::engine) fallbacks: u64,
    /// Sends whose `fi_mr_reg` failed (they went without a fabric key).
    pub(in crate::engine) reg_failed: u64,
    /// Reads that completed through `fi_read`.
    pub(in crate::engine) done: u64,
}

impl Engine {
    /// Chooses how a rendezvous's data moves on a job whose fabric is OFI alone, as
    /// `TMPI_OFI_RNDV` says, and turns the fabric's reads on if chosen; returns the way
    /// (`None` on other fabrics).
    ///
    /// # Errors
    /// [`Error::Config`] for `read` on a provider whose `mr_mode` rules reads out
    /// (`FI_MR_RAW`, keys wider than 8 bytes, `FI_MR_LOCAL`).
    pub(crate) fn choose_rndv(&mut self) -> Result<Option<&'static str>> {
        let choice = self.cfg.ofi_rndv;
        let cache = self.st.target.cache_config();
        let Some(f) = self.fabric.ofi_ops_mut() else { return Ok(None) };
        let offer = f.endpoint().offer();
        let why = read_support(offer.mr_mode, offer.mr_key_size);
        let wanted = match choice {
            Some(OfiRndv::Read) => true,
            Some(OfiRndv::Stream) => false,
            // `auto` reads where the provider's `mr_mode` allows: 2.5-3x the bandwidth of
            // streams from 1 MiB, level below (bench/results/ofi-rndv.md). An abandoned send
            // revokes its key and waits for the reader's answer (`Control::Revoke`).
            None => why.is_none(),
        };
        if !wanted {
            return Ok(Some("stream"));
        }
        if let Some(why) = why {
            return Err(Error::Config { var: "TMPI_OFI_RNDV".into(), value: "read".into(), expected: format!("auto or stream: {why}") });
        }
        f.enable_reads(cache)?;
        self.st.ways.fabric.on = true;
        Ok(Some("read"))
    }

    /// The registration of `data` for `dest`'s `fi_read` and its key, where reads go that
    /// way (not to this rank itself, not empty). A failed registration is counted and the
    /// send goes without one (its reader streams).
    pub(super) fn fabric_register(&mut self, dest: usize, data: RawBuf) -> (Option<ReadRegion>, Option<FabricKey>) {
        if !self.st.ways.fabric.on || dest == self.st.rank || data.len() == 0 {
            return (None, None);
        }
        let Some(f) = self.fabric.ofi_ops_mut() else { return (None, None) };
        let got = f.register_read(data.addr(), data.len()).ok().and_then(|r| {
            let fk = FabricKey { key: r.key()?, addr: r.remote_addr(data.addr())? };
            Some((r, fk))
        });
        match got {
            Some((r, fk)) => (Some(r), Some(fk)),
            None => {
                self.st.ways.fabric.reg_failed += 1;
                (None, None)
            }
        }
    }

    /// Posts the `fi_read` of read `key` ([`ReadPhase::Fabric`]) into its receive buffer; one
    /// the provider refuses is asked again as a stream.
    pub(in crate::engine) fn post_fabric_read(&mut self, key: Key) {
        let Some(op) = self.st.reads.get(key) else { return };
        let (src, n, fk) = (op.src, op.n, op.info.fabric);
        let buf = match self.st.reqs.get(op.rid) {
            Some(Req { kind: ReqKind::Recv(r), .. }) => r.buf,
            _ => None,
        };
        let posted = match (self.fabric.ofi_ops_mut(), buf, fk) {
            (Some(f), Some(b), Some(fk)) => crate::buffer::post_fabric_read(f, b, n, src, (fk.addr, fk.key), read_name(key)).is_ok(),
            _ => false,
        };
        if !posted {
            self.st.restream_fabric_read(key);
        }
    }

    /// Hands the fabric's finished reads to their rendezvous: a read that completed well has
    /// all its bytes (its end sends the FIN), a failed one is asked again as a stream.
    /// Returns how many ended.
    pub(in crate::engine) fn fabric_reads_done(&mut self) -> Result<usize> {
        let Some(f) = self.fabric.ofi_ops_mut() else { return Ok(0) };
        let done = f.take_reads_done();
        for d in &done {
            let key = read_key(d.user);
            let Some(op) = self.st.reads.get(key).filter(|op| matches!(op.phase, ReadPhase::Fabric { .. })) else { continue };
            let n = op.n;
            match d.error {
                None => {
                    self.st.ways.fabric.done += 1;
                    self.st.read_progress(key, n)?;
                }
                Some(_) => self.st.restream_fabric_read(key),
            }
        }
        if !done.is_empty() {
            // A read the TM-SRQ asked for completes there: DATA_VALID, and the FIN it queues.
            self.st.drain_cq()?;
        }
        Ok(done.len())
    }

    /// The OFI fabric's registration cache's counters, while reads go by `fi_read`.
    pub(in crate::engine) fn ofi_read_cache_stats(&self) -> Option<tmpi_transport::mr::CacheStats> {
        self.fabric.ofi_ops()?.read_cache_stats()
    }

    /// The `tmpi-ofi-rndv` line of `TMPI_STATS=1` while reads go by `fi_read`: reads, their
    /// bytes and failures, fall-backs to streams, registrations and the cache's counters.
    pub(crate) fn ofi_rndv_stats_line(&self) -> Option<String> {
        let f = self.fabric.ofi_ops()?;
        let s = f.read_stats()?;
        let w = &self.st.ways.fabric;
        let c = f.read_cache_stats().unwrap_or_default();
        Some(format!(
            "tmpi-ofi-rndv rank={} way=read reads={} done={} bytes={} failed={} fallbacks={} reg_failed={} regs={} queued={} mr_hits={} mr_misses={} mr_evictions={} mr_invalidations={}",
            self.st.rank, s.posted, w.done, s.bytes, s.failed, w.fallbacks, w.reg_failed, s.regs, s.queued, c.hits, c.misses, c.evictions, c.invalidations
        ))
    }
}

impl State {
    /// Read `key`'s `fi_read` could not be posted or failed: the provider no longer writes
    /// into the buffer, and the read is asked again as a stream (the target's key check in
    /// its soft domain guards it as for any stream). One whose sender revoked its key (it
    /// abandoned the send) fails the receive instead, with the owed answer.
    fn restream_fabric_read(&mut self, key: Key) {
        let Some(op) = self.reads.get_mut(key) else { return };
        if op.phase == (ReadPhase::Fabric { ack_owed: true }) {
            op.phase = op.phase.failed(op.n);
            if let Err(e) = self.finish_read(key, false) {
                self.outbox.fail(e);
            }
            return;
        }
        op.phase = ReadPhase::Asked { single: false };
        let n = op.n;
        self.ways.fabric.fallbacks += 1;
        self.request_read(key, false, n, false);
    }
}
