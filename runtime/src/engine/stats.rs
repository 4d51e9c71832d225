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
}

impl Engine {
    /// The `tmpi-stats` line printed at finalize under `TMPI_STATS=1`.
    pub(crate) fn stats_line(&self) -> String {
        let s = &self.st.stats;
        let tm = self.st.tm.counters();
        let mc = self.st.mr.stats();
        format!(
            "tmpi-stats rank={} msgs_sent={} msgs_recv={} bytes_sent={} bytes_recv={} eager={} rndv={} hw_matched={} sw_matched={} unexpected={} tm_syncs={} rndv_incomplete={}",
            self.st.rank, s.msgs_sent, s.msgs_recv, s.bytes_sent, s.bytes_recv, s.eager, s.rndv, tm.hw_matched, s.sw_matched, s.unexpected, s.tm_syncs, tm.rndv_incomplete
        ) + &format!(
            " mr_cache_hits={} mr_cache_misses={} mr_cache_evictions={} mr_cache_invalidations={} hw_unexpected={} tm_adds={} tm_dels={} tm_list_hwm={} credit_rndv={} ux_peak_bytes={}",
            mc.hits, mc.misses, mc.evictions, mc.invalidations, tm.unexpected, tm.adds, tm.dels, tm.list_hwm, s.credit_rndv, s.ux_peak_bytes
        ) + &format!(" cma_reads={} cma_bytes={} cma_fallbacks={}", s.cma_reads, s.cma_bytes, s.cma_fallbacks)
    }
}

impl Engine {
    /// The counters of [`Engine::stats_line`] as a [`crate::Stats`].
    pub(crate) fn stats(&self) -> crate::Stats {
        let s = &self.st.stats;
        let tm = self.st.tm.counters();
        let mc = self.st.mr.stats();
        let mut t = crate::Stats::default();
        t.rank = self.st.rank as u64;
        (t.msgs_sent, t.msgs_recv, t.bytes_sent, t.bytes_recv, t.eager, t.rndv) =
            (s.msgs_sent, s.msgs_recv, s.bytes_sent, s.bytes_recv, s.eager, s.rndv);
        (t.hw_matched, t.sw_matched, t.unexpected, t.tm_syncs, t.rndv_incomplete) =
            (tm.hw_matched, s.sw_matched, s.unexpected, s.tm_syncs, tm.rndv_incomplete);
        (t.mr_cache_hits, t.mr_cache_misses, t.mr_cache_evictions, t.mr_cache_invalidations) =
            (mc.hits, mc.misses, mc.evictions, mc.invalidations);
        (t.hw_unexpected, t.tm_adds, t.tm_dels, t.tm_list_hwm) = (tm.unexpected, tm.adds, tm.dels, tm.list_hwm);
        (t.credit_rndv, t.ux_peak_bytes, t.cma_reads, t.cma_bytes, t.cma_fallbacks) =
            (s.credit_rndv, s.ux_peak_bytes, s.cma_reads, s.cma_bytes, s.cma_fallbacks);
        t
    }
}
