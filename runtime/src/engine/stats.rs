//! Counters printed by `TMPI_STATS=1`, and the `tmpi-stats` line.

use super::*;

/// Counters printed by `TMPI_STATS=1`.
#[derive(Debug, Default, Clone)]
pub(crate) struct Stats {
    pub msgs_sent: u64,
    pub msgs_recv: u64,
    pub bytes_sent: u64,
    pub bytes_recv: u64,
    pub eager: u64,
    pub rndv: u64,
    pub sw_matched: u64,
    /// Messages of eager size sent as rendezvous because the receiver's credit was used up
    /// (flow control).
    pub credit_rndv: u64,
    /// Most bytes held by unexpected messages at once.
    pub ux_peak_bytes: u64,
    pub unexpected: u64,
    pub tm_syncs: u64,
    /// Rendezvous reads done with one kernel copy (CMA), and their bytes.
    pub cma_reads: u64,
    pub cma_bytes: u64,
    /// Times the kernel refused CMA and reads fell back to the pipelined copy.
    pub cma_fallbacks: u64,
    /// Advice (`Control::EagerBelow`) that raised where rendezvous starts, received.
    pub eager_advice: u64,
    /// Single-copy reads started without a request, pre-granted by their sender.
    pub pregranted: u64,
    /// Of those, split with the sender without a round trip ([`ReadMode::Share`]).
    pub pregranted_splits: u64,
    /// Single-copy reads that shared their system call with others ([`crate::buffer::cma_read_many`]).
    pub cma_batched: u64,
}

impl Engine {
    /// The `tmpi-stats` line printed at finalize under `TMPI_STATS=1`: the `Display` form of
    /// [`crate::Stats`], so the line and the typed counters can never disagree.
    pub(crate) fn stats_line(&self) -> String {
        self.stats().to_string()
    }
}

impl Engine {
    /// The counters of [`Engine::stats_line`] as a [`crate::Stats`].
    pub(crate) fn stats(&self) -> crate::Stats {
        let s = &self.st.stats;
        let tm = self.st.offload.tm().counters();
        #[allow(unused_mut)]
        let mut mc = self.st.target.mr_stats();
        // With the OFI fabric's rendezvous reads, its registration cache holds the send
        // buffers' `fi_mr_reg` registrations: the counters are both caches'.
        #[cfg(feature = "ofi")]
        if let Some(f) = self.ofi_read_cache_stats() {
            mc.hits += f.hits;
            mc.misses += f.misses;
            mc.evictions += f.evictions;
            mc.invalidations += f.invalidations;
        }
        let heap = self.st.ways.heap_counters();
        crate::Stats {
            rank: self.st.rank as u64,
            msgs_sent: s.msgs_sent,
            msgs_recv: s.msgs_recv,
            bytes_sent: s.bytes_sent,
            bytes_recv: s.bytes_recv,
            eager: s.eager,
            rndv: s.rndv,
            hw_matched: tm.hw_matched,
            sw_matched: s.sw_matched,
            unexpected: s.unexpected,
            tm_syncs: s.tm_syncs,
            rndv_incomplete: tm.rndv_incomplete,
            mr_cache_hits: mc.hits,
            mr_cache_misses: mc.misses,
            mr_cache_evictions: mc.evictions,
            mr_cache_invalidations: mc.invalidations,
            hw_unexpected: tm.unexpected,
            tm_adds: tm.adds,
            tm_dels: tm.dels,
            tm_list_hwm: tm.list_hwm,
            credit_rndv: s.credit_rndv,
            ux_peak_bytes: s.ux_peak_bytes,
            cma_reads: s.cma_reads,
            cma_bytes: s.cma_bytes,
            cma_fallbacks: s.cma_fallbacks,
            eager_advice: s.eager_advice,
            pregranted_reads: s.pregranted,
            pregranted_splits: s.pregranted_splits,
            cma_batched: s.cma_batched,
            heap_grants: heap.0,
            heap_bytes: heap.1,
            heap_fallbacks: heap.2,
        }
    }
}
