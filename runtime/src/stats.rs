//! Typed statistics of one rank ([`Stats`]): the engine's, its soft TM-SRQ's and its MR
//! cache's counters as a struct a program can read, diff, print and parse back. The
//! `tmpi-stats` line that `TMPI_STATS=1` prints at finalize is [`Stats`]'s `Display` form.

use std::fmt;
use std::str::FromStr;

use crate::comm::Comm;
use crate::error::{Error, Result};

macro_rules! stats {
    ($($(#[$doc:meta])* $name:ident),* $(,)?) => {
        /// Counters of one rank since it started (see the module docs). Every field is a count
        /// of events or bytes, except `rank` and the high-water marks `tm_list_hwm` and
        /// `ux_peak_bytes`.
        ///
        /// ```
        /// let got = tmpi::run_local(2, |w| {
        ///     let before = w.stats().unwrap();
        ///     if w.rank() == 0 {
        ///         w.send(&[0u8; 100], 1, 0).unwrap();
        ///     } else {
        ///         w.recv(&mut [0u8; 100], 0, 0).unwrap();
        ///     }
        ///     let d = w.stats().unwrap().diff(&before);
        ///     // Round trip through the text form.
        ///     let line = d.to_string();
        ///     assert_eq!(line.parse::<tmpi::Stats>().unwrap(), d);
        ///     (d.msgs_sent, d.bytes_recv)
        /// });
        /// assert_eq!(got, vec![(1, 0), (0, 100)]);
        /// ```
        #[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
        #[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
        #[non_exhaustive]
        pub struct Stats {
            $($(#[$doc])* pub $name: u64,)*
        }

        impl Stats {
            /// Every counter with its name, in the order of the `tmpi-stats` line.
            pub fn fields(&self) -> Vec<(&'static str, u64)> {
                vec![$((stringify!($name), self.$name)),*]
            }

            fn set(&mut self, key: &str, v: u64) -> bool {
                match key {
                    $(stringify!($name) => self.$name = v,)*
                    _ => return false,
                }
                true
            }
        }
    };
}

stats! {
    /// This rank (in the world).
    rank,
    /// Messages sent (self-sends included).
    msgs_sent,
    /// Messages received.
    msgs_recv,
    /// Payload bytes sent.
    bytes_sent,
    /// Payload bytes received.
    bytes_recv,
    /// Messages sent eagerly.
    eager,
    /// Messages sent by rendezvous.
    rndv,
    /// Receives matched in the TM-SRQ's tag list.
    hw_matched,
    /// Receives matched by the software matcher.
    sw_matched,
    /// Messages that arrived before their receive.
    unexpected,
    /// TM-SRQ synchronisations.
    tm_syncs,
    /// Rendezvous requests the TM-SRQ could not complete in hardware.
    rndv_incomplete,
    /// MR-cache lookups that found a registration (with the OFI fabric's rendezvous reads,
    /// `TMPI_OFI_RNDV=read`, its `fi_mr_reg` cache's too: the four `mr_cache_*` counters
    /// add both caches').
    mr_cache_hits,
    /// MR-cache lookups that registered.
    mr_cache_misses,
    /// Registrations the MR cache evicted.
    mr_cache_evictions,
    /// Registrations invalidated because their memory was unmapped.
    mr_cache_invalidations,
    /// Messages the TM-SRQ delivered unexpected.
    hw_unexpected,
    /// Receives added to the TM-SRQ's tag list.
    tm_adds,
    /// Receives removed from it.
    tm_dels,
    /// Most entries in the tag list at once.
    tm_list_hwm,
    /// Eager-size messages sent by rendezvous because credit ran out.
    credit_rndv,
    /// Most bytes held by unexpected messages at once.
    ux_peak_bytes,
    /// Rendezvous reads done with one kernel copy (CMA).
    cma_reads,
    /// Bytes of those reads.
    cma_bytes,
    /// Times the kernel refused CMA.
    cma_fallbacks,
    /// Times a receiver's measurements moved where this rank's rendezvous to it starts (see
    /// `TMPI_RNDV_THRESHOLD=auto`).
    eager_advice,
    /// Single-copy reads this rank made at once, without a read request, because the sender
    /// had checked the range with its rendezvous request.
    pregranted_reads,
    /// Of those, reads split without a round trip: this rank copied the start and asked the
    /// sender to write the rest into its buffer at the same time.
    pregranted_splits,
    /// Single-copy reads (in `cma_reads`) that shared one `process_vm_readv` with others
    /// queued at the same time from the same rank (up to 16 reads of at most 64 KiB, 256 KiB
    /// in all): each call has a fixed cost of about a quarter of a 16 KiB copy.
    cma_batched,
    /// Shared-heap reads and writes this rank granted or made (one `memcpy` each).
    heap_grants,
    /// Bytes moved through shared heaps.
    heap_bytes,
    /// Transfers that could not use a peer's shared heap (fell back to the rings or CMA).
    heap_fallbacks,
}

impl Stats {
    /// `self - earlier`, counter by counter (saturating at 0); `rank` and the high-water marks
    /// (`tm_list_hwm`, `ux_peak_bytes`) are kept from `self`.
    pub fn diff(&self, earlier: &Stats) -> Stats {
        let mut d = *self;
        for ((k, now), (_, before)) in self.fields().into_iter().zip(earlier.fields()) {
            if !matches!(k, "rank" | "tm_list_hwm" | "ux_peak_bytes") {
                d.set(k, now.saturating_sub(before));
            }
        }
        d
    }
}

impl fmt::Display for Stats {
    /// The `tmpi-stats` line: `tmpi-stats rank=0 msgs_sent=... ...`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("tmpi-stats")?;
        for (k, v) in self.fields() {
            write!(f, " {k}={v}")?;
        }
        Ok(())
    }
}

impl FromStr for Stats {
    type Err = Error;

    /// Parses a `tmpi-stats` line (or just its `key=value` pairs); unknown keys are ignored,
    /// missing ones are 0.
    ///
    /// # Errors
    /// [`Error::InvalidBuffer`] for a pair that is not `key=number`.
    fn from_str(s: &str) -> Result<Stats> {
        let mut st = Stats::default();
        for word in s.split_whitespace().filter(|w| *w != "tmpi-stats") {
            let bad = || Error::InvalidBuffer(format!("stats: {word:?} is not key=number"));
            let (k, v) = word.split_once('=').ok_or_else(bad)?;
            let v: u64 = v.parse().map_err(|_| bad())?;
            st.set(k, v);
        }
        Ok(st)
    }
}

impl Comm {
    /// This rank's counters now (engine, TM-SRQ, MR cache); see [`Stats`].
    ///
    /// # Errors
    /// [`Error::Thread`] from a thread the [`crate::Threading`] level does not admit.
    pub fn stats(&self) -> crate::Result<Stats> {
        Ok(self.eng()?.stats())
    }
}

#[cfg(test)]
mod tests {
    use super::Stats;

    /// The typed counters and the `tmpi-stats` line that tests parse say the same.
    #[test]
    fn matches_the_stats_line() {
        crate::run_local(2, |w| {
            let peer = 1 - w.rank();
            let mut b = vec![0u8; 300_000];
            w.sendrecv(&vec![1u8; 300_000], peer, 0, &mut b, peer, 0).unwrap();
            let line = w.stats_line();
            let typed = w.stats().unwrap();
            let parsed: Stats = line.parse().unwrap();
            assert_eq!(parsed, typed, "{line}");
            for word in line.split_whitespace().skip(1) {
                let (k, v) = word.split_once('=').unwrap();
                let got = typed.fields().into_iter().find(|f| f.0 == k);
                assert_eq!(got, Some((k, v.parse().unwrap())), "{k} missing or different");
            }
            assert_eq!(typed.fields().len(), line.split_whitespace().count() - 1);
            let d = typed.diff(&typed);
            assert_eq!((d.msgs_sent, d.rank), (0, w.rank() as u64));
            assert!("tmpi-stats x=y".parse::<Stats>().is_err());
        });
    }
}
