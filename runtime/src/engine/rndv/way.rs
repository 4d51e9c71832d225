//! How the bytes of a rendezvous move: the rules (and the constants behind them) that choose
//! between streaming through the rings, single copy (CMA), a shared heap, splitting a read
//! between both ranks, and copies around the cache.
//!
//! Two pure functions hold the rules of a read: [`plan_read`], the reader's (copy at once
//! what the sender pre-granted, and whether to ask the target for a share, or ask the target
//! for the read), and [`plan_grant`], the target's (grant through a shared heap or for single
//! copy, split or whole, or stream). The stages gather the facts and carry the plan out
//! (`reader.rs`, `target.rs`); the table tests at the end of this file state the rules.

use tmpi_transport::wire::ReadMode;

/// Single-copy reads of at least this many bytes are split: the reader copies the first half,
/// the target (otherwise idle until FIN) writes the second half, so both cores copy.
pub(in crate::engine) const CMA_SPLIT_MIN: usize = 128 * 1024;
/// ...and from this many bytes, a read the target was asked for (not pre-granted) when it
/// has no reads of its own in flight. A pre-granted read (below [`CMA_PREGRANT_MAX`]) is not
/// asked for: asking and then splitting cost `osu_latency` 1.40x the time at 16 KiB, 1.09x at
/// 32 KiB; from [`CMA_SHARE_MIN`] it is shared instead, without a round trip.
pub(in crate::engine) const CMA_SPLIT_WINDOW_MIN: usize = 32 * 1024;
/// ...but below this size not while the target has reads of its own in flight (see
/// `State::serve_read`).
pub(in crate::engine) const CMA_SPLIT_BUSY_MAX: usize = 1 << 20;
/// ...nor below [`CMA_SPLIT_DEEP_MAX`] while the target has this many reads of its own in
/// flight: with a queue that deep on both sides there is no idle tail for the split to fill.
pub(in crate::engine) const CMA_SPLIT_DEEP: usize = 16;
/// See [`CMA_SPLIT_DEEP`]: from this size the split pays even then (`osu_bibw` 8-64 MiB
/// took 1.3-1.7x the time without it). Was 4 MiB: not splitting 4 MiB either moved 1.17-1.18x
/// the bytes in `osu_bibw` (two runs of 5, `bench/results/p2p-2026-11-27e.md`).
pub(in crate::engine) const CMA_SPLIT_DEEP_MAX: usize = 8 << 20;
/// A pre-granted read of at least this many bytes is split without a round trip: the
/// reader asks the target for its share ([`ReadMode::Share`]) and starts copying its own at
/// once, while the target (waiting for FIN) writes the rest. So is one behind other reads
/// (a window), unless the target is reading from this rank too (`State::peer_reading`): `osu_bw` 32/64 KiB 1.15/1.16x the bytes of asking for a split,
/// `osu_bibw` level, where a share in both directions took 0.72-0.80x.
pub(in crate::engine) const CMA_SHARE_MIN: usize = 32 * 1024;
/// A rendezvous below this many bytes goes out pre-granted for single copy (see
/// `State::may_pregrant`), shared by [`CMA_SHARE_MIN`]'s rules. From it on, asking pays:
/// the target starts its half as it grants, and the halves are even (`osu_latency` 2/4 MiB
/// 1.06/1.04x the time pre-granted); below it the round trip is the larger cost (128/256/512
/// KiB 0.92/0.95/0.97x the time pre-granted, 9 runs; `osu_bw` and `osu_bibw` level).
pub(in crate::engine) const CMA_PREGRANT_MAX: usize = 1 << 20;
/// A streamed read of at least this many bytes (every rendezvous at the default threshold),
/// among other reads in flight, is copied out of the rings with non-temporal stores
/// ([`tmpi_transport::shm::copy_streaming`]) where the rings carry packets larger than
/// [`STREAM_NT_PACKET_OVER`] (4 MiB rings, the default up to 4 ranks, carry 1 MiB packets
/// less a record header): `osu_bw` 1-8 MiB moved 1.4-2.0x the bytes of plain copies out of
/// the same rings (`bench/results/p2p-2026-11-27e.md`), and from 256 KiB rather than 1 MiB,
/// `osu_bw` 256/512 KiB 1.50/1.59x and `osu_bibw` 1.13/1.20x (`p2p-2026-11-27f.md`). Out of
/// smaller packets (1 MiB rings) the same stores moved 0.56-0.72x the bytes (`osu_bibw -W 8`
/// 1-8 MiB), so there, and for a lone read, they start at half the L3 as before
/// ([`tmpi_transport::shm::streaming_copy_min`]). Where only one rank of the pair reads
/// (`osu_bw`), a quiet host later measured the opposite from 256 KiB to 1 MiB, so there
/// windows go around the cache from [`STREAM_NT_ONE_WAY_MIN`].
pub(in crate::engine) const STREAM_NT_MIN: usize = 256 << 10;
/// See [`STREAM_NT_MIN`].
pub(in crate::engine) const STREAM_NT_PACKET_OVER: usize = 512 << 10;
/// Where the reading rank does not serve reads of its peer at the same time (`osu_bw`, not
/// `osu_bibw`), streamed reads in a window go around the cache only from this size: on a
/// quiet host (cache line 43 ns) `osu_bw` 256/512 KiB moved 1.34/1.18x the bytes with plain
/// stores (48.6/44.8 against 36.4/37.8 GB/s, 3 interleaved runs; 1 MiB level, 2-8 MiB
/// 0.74-0.78x), while `osu_bibw` needs them from [`STREAM_NT_MIN`] (256 KiB-1 MiB 1.41-1.86x
/// the bytes with them). A window's 64 receive slots (distinct, in tmpi's `osu_bw` and in
/// the C peers' `bw` alike) take 16 MiB at 256 KiB, which the 32 MiB L3 holds; the earlier
/// measurement of the one-way case from 256 KiB was on a noisy host.
/// Not from 1 MiB though: with plain stores at 512 KiB the first period of the rings there
/// timed slow now and then (235 against single copy's 163 thousandths of a tick per byte),
/// single copy was chosen and carried up to 1-4 MiB (`tmpi-compare`'s short `osu_bw` run at
/// 18-21 GB/s from 512 KiB; 2 of 12 runs with 1 MiB here, 0 of 8 with 512 KiB). Plain stores
/// at 512 KiB again, with no choice carried from 512 KiB to 1 MiB, moved `osu_bw` 512 KiB at
/// 43.8-47.6 GB/s in 11 quiet runs and at 19.5-28.7 in 7 others (2 of those with exactly the
/// fast runs' operations, the rings chosen; 2 chose single copy), where non-temporal stores
/// move 32.8-37.0. Eager 512 KiB messages show the same two levels (17-21 against 41-49
/// GB/s, same operations): likely where the pages of the receive buffer and of the rings
/// fall in the 1 MiB L2, which changes from run to run (`bench/results/p2p-2026-11-28.md`,
/// session 32).
pub(in crate::engine) const STREAM_NT_ONE_WAY_MIN: usize = 512 << 10;

/// An eager message of at least this many bytes that lands in a posted receive while others
/// are posted (a window) is copied out of the ring with non-temporal stores where this rank
/// sends its peer such messages too (`osu_bibw`), as streamed reads are from
/// [`STREAM_NT_MIN`] there: `osu_bibw` 512 KiB (eager since the advice reaches the 512 KiB
/// class) moved 35.6 against 28.0 GB/s with plain stores (5 interleaved runs, medians; Open
/// MPI without CMA 28.2). Not one way: copying every such packet so, `osu_bw` 256/512 KiB
/// moved 0.82/0.92x the bytes, its receive buffers staying in the cache
/// (`bench/results/p2p-2026-11-28.md`, session 34).
pub(in crate::engine) const EAGER_NT_MIN: usize = 512 << 10;
/// A peer that received such a message from this rank within this many of its arrivals here
/// counts as sending both ways (see `State::eager_both_ways`).
pub(in crate::engine) const EAGER_BOTH_WAYS_WITHIN: u64 = 64;

/// The smallest streamed read copied out with non-temporal stores when the fabric's largest
/// packet is `max_packet` bytes (see [`STREAM_NT_MIN`]).
pub(in crate::engine) fn stream_nt_min(max_packet: usize) -> usize {
    if max_packet > STREAM_NT_PACKET_OVER {
        STREAM_NT_MIN
    } else {
        tmpi_transport::shm::streaming_copy_min()
    }
}
/// Whether a streamed read of `n` bytes is copied out of the rings with non-temporal stores
/// ([`tmpi_transport::shm::copy_streaming`]): from half the L3 always, and from `nt_min`
/// ([`stream_nt_min`]) among other reads in flight (`windowed`), where the peer reads from
/// this rank at the same time (`both_ways`), else from [`STREAM_NT_ONE_WAY_MIN`].
pub(in crate::engine) fn copies_out_around_cache(n: usize, windowed: bool, both_ways: bool, nt_min: usize) -> bool {
    let window_min = if both_ways { nt_min } else { nt_min.max(STREAM_NT_ONE_WAY_MIN) };
    n >= tmpi_transport::shm::streaming_copy_min() || (windowed && n >= window_min)
}
/// A peer that sent a FIN within this many of our reads is reading from us (see
/// `State::peer_reading`).
pub(in crate::engine) const PEER_READING_WITHIN: u64 = 64;

/// Shared-heap reads the target was asked for are split from this many bytes when both
/// buffers lie in shared heaps: the reader copies the first half, the target the second,
/// both with memcpy. Below [`HEAP_SPLIT_BUSY_MAX`], not while the target has reads of its
/// own in flight (each core has its own copies then, as in `osu_bibw`).
pub(in crate::engine) const HEAP_SPLIT_MIN: usize = 256 << 10;
/// See [`HEAP_SPLIT_MIN`]: from here a heap read is split even while the target reads too.
pub(in crate::engine) const HEAP_SPLIT_BUSY_MAX: usize = 1 << 20;
/// A read pre-granted from the target's shared heap into a buffer in this rank's heap is
/// split without a round trip from this many bytes, by [`CMA_SHARE_MIN`]'s rules: the reader
/// asks the target for its share ([`ReadMode::Share`], naming the buffer's place in its heap)
/// and copies its own part at once, while the target memcpys the rest into our heap.
pub(in crate::engine) const HEAP_SHARE_MIN: usize = 64 << 10;

/// Bytes a reader copies itself of a pre-granted read of `n` bytes split without a round trip
/// ([`CMA_SHARE_MIN`]): half and [`SHARE_LEAD`], in whole pages; the target writes the rest.
pub(in crate::engine) fn share_split(n: usize) -> usize {
    ((n / 2 + SHARE_LEAD) & !4095).min(n)
}

/// What the reader of a split without a round trip copies beyond half: the target starts its
/// share a message later (`osu_latency` 32/64 KiB, 5 runs: 0.93/0.86x the time of no split
/// with 8 KiB, 0.98/0.89x with 12 KiB, 1.04/0.93x with none).
pub(in crate::engine) const SHARE_LEAD: usize = 8 << 10;
/// A rendezvous from this rank's shared heap is pre-granted below this many bytes (see
/// `State::may_pregrant`): `osu_latency -d shared` 16-256 KiB 0.78-0.90x the time of asking.
/// Not from here: a window of reads copied at once as they arrive has fewer in flight, so
/// fewer may go around the cache (`State::around_cache`); `osu_bw -d shared` measured
/// 0.88/0.75x at 256/512 KiB pre-granted (5 runs, not in rotated order, on a noisy host:
/// `bench/results/p2p-2026-11-27b.md`), so those sizes still ask.
pub(in crate::engine) const HEAP_PREGRANT_MAX: usize = 256 << 10;
/// The smallest read that goes around the cache because of the reads in flight with it
/// (`State::around_cache`).
pub(in crate::engine) const AROUND_CACHE_MIN: usize = 64 << 10;

/// What the reader knows when a rendezvous request has matched a receive ([`plan_read`]).
#[derive(Debug, Clone, Copy, Default)]
pub(in crate::engine) struct ReadFacts {
    /// Bytes to read (the message, or the receive buffer if that is shorter).
    pub(in crate::engine) n: usize,
    /// The message's length, as its request announced it.
    pub(in crate::engine) len: usize,
    /// The receive still has its buffer (an abandoned one streams and discards).
    pub(in crate::engine) has_buf: bool,
    /// Single copy is the way chosen for this read (`TMPI_SINGLE_COPY_MIN`, or the adapt
    /// stage's measurement), and single copy reaches the sender.
    pub(in crate::engine) cma: bool,
    /// The sender pre-granted the read ([`tmpi_transport::tm::RndvRequest::pregranted`]).
    pub(in crate::engine) pregranted: bool,
    /// The range lies in the sender's shared heap, which this rank maps already.
    pub(in crate::engine) sender_heap: bool,
    /// The receive buffer lies in this rank's shared heap.
    pub(in crate::engine) own_heap: bool,
    /// Other reads of this rank are in flight.
    pub(in crate::engine) others: bool,
    /// The sender has lately been reading from this rank (`State::peer_reading`).
    pub(in crate::engine) peer_reading: bool,
    /// The request carries the sender's registration in the fabric's own domain
    /// ([`tmpi_transport::wire::FabricKey`]) and this rank reads with the fabric
    /// (`TMPI_OFI_RNDV`): the fabric's RDMA read (`fi_read`) may move the bytes.
    pub(in crate::engine) fabric_key: bool,
}

/// How a read starts ([`plan_read`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::engine) enum ReadStart {
    /// Ask the target: for a grant to copy it by single copy (`cma`), else for a stream.
    Ask {
        /// A single-copy request (the target may grant, split, or serve it from a heap).
        cma: bool,
    },
    /// Copy what the sender pre-granted at once, without asking: from its shared heap
    /// (`heap`) or by single copy. This rank copies `[0, split)`; from `split < n` the target
    /// is asked for the rest ([`ReadMode::Share`]) and writes it meanwhile.
    AtOnce {
        /// From the sender's shared heap (one memcpy), not by single copy.
        heap: bool,
        /// Bytes this rank copies itself.
        split: usize,
    },
    /// Read it with the fabric's RDMA read (`fi_read` into the receive buffer, from the
    /// sender's `fi_mr_reg` registration): no request to the target, whose FIN ends it.
    Fabric,
}

/// The reader's plan for a read ([`plan_read`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::engine) struct ReadPlan {
    pub(in crate::engine) start: ReadStart,
    /// The target may write into the receive buffer (a share, or once asked for single copy):
    /// the buffer must outlive the read even if the receive is abandoned.
    pub(in crate::engine) remote_write: bool,
}

impl ReadPlan {
    /// Bytes this rank copies itself before the target answers (all of them unless a share
    /// goes to the target). The read's phase holds it from then on
    /// ([`ReadPhase::split`](super::reader::ReadPhase::split)): the tests check the two agree.
    #[cfg(test)]
    pub(in crate::engine) fn split(&self, n: usize) -> usize {
        match self.start {
            ReadStart::AtOnce { split, .. } => split,
            ReadStart::Ask { .. } | ReadStart::Fabric => n,
        }
    }
}

/// How the reader starts a read, from `f`:
///
/// - A read the sender pre-granted (below [`CMA_PREGRANT_MAX`]) is copied at once: from the
///   sender's shared heap where this rank maps it already, else by single copy where that is
///   the way chosen and the receive buffer is not in this rank's own heap (the target must be
///   asked then: it writes into our heap with a memcpy whichever way is asked).
/// - Copied at once, a single copy from [`CMA_SHARE_MIN`] (a heap copy into our own heap from
///   [`HEAP_SHARE_MIN`]; from the sender's heap into another buffer, never) is shared with the
///   target, asked now: alone in flight (the target waits for our FIN), or in a window while
///   the target is not reading from us itself (`osu_bw`: it waits too; in `osu_bibw` each core
///   has its own reads to copy, and a share only adds its system call). A window counts from
///   [`CMA_SPLIT_WINDOW_MIN`].
/// - A share is [`share_split`] (half and a lead), except a heap share in a window, an even
///   half: the target's memcpy starts as soon as it is asked, and the lead only helps a lone
///   read (`osu_bw -d shared` 64/128 KiB 1.07/1.07x the bytes of the lead, `osu_latency`
///   128 KiB 0.85x the time with it).
/// - Else, a request that carries the sender's registration in the fabric's own domain is
///   read with the fabric's RDMA read (`fi_read`) where this rank reads that way
///   (`TMPI_OFI_RNDV`), a receive buffer is there and there is something to read.
/// - Anything else asks the target, for single copy where that is the way chosen.
pub(in crate::engine) fn plan_read(f: &ReadFacts) -> ReadPlan {
    let n = f.n;
    let pregranted = f.pregranted && n <= f.len && n < CMA_PREGRANT_MAX;
    let from_heap = pregranted && n > 0 && f.has_buf && f.sender_heap;
    let at_once = from_heap || (f.cma && pregranted && !f.own_heap);
    if !at_once && f.fabric_key && f.has_buf && n > 0 {
        // The provider writes into the receive buffer until the read completes.
        return ReadPlan { start: ReadStart::Fabric, remote_write: true };
    }
    if !at_once {
        return ReadPlan { start: ReadStart::Ask { cma: f.cma }, remote_write: f.cma };
    }
    let windowed = f.others && n >= CMA_SPLIT_WINDOW_MIN;
    let share_min = match (from_heap, f.own_heap) {
        (true, true) => HEAP_SHARE_MIN,
        (true, false) => usize::MAX,
        (false, _) => CMA_SHARE_MIN,
    };
    let share = f.has_buf && n >= share_min && !(windowed && f.peer_reading);
    let split = match share {
        true if from_heap && windowed => (n / 2) & !4095,
        true => share_split(n),
        false => n,
    };
    ReadPlan { start: ReadStart::AtOnce { heap: from_heap, split }, remote_write: split < n }
}

/// What the target knows when a read request passed its key check ([`plan_grant`]).
#[derive(Debug, Clone, Copy)]
pub(in crate::engine) struct GrantFacts {
    /// Bytes asked for (the checked range).
    pub(in crate::engine) n: usize,
    /// What the reader asked for.
    pub(in crate::engine) mode: ReadMode,
    /// Shared heaps are on here.
    pub(in crate::engine) heaps: bool,
    /// The range lies in this rank's shared heap, and the reader maps it.
    pub(in crate::engine) from_heap: bool,
    /// The receive buffer lies in the reader's shared heap, which this rank may map.
    pub(in crate::engine) into_heap: bool,
    /// Single copy is on here (`TMPI_SINGLE_COPY=cma`, not refused by the kernel).
    pub(in crate::engine) cma: bool,
    /// Reads of this rank's own in flight.
    pub(in crate::engine) reads: usize,
}

/// How the target serves a checked read ([`plan_grant`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::engine) enum GrantPlan {
    /// Through the shared heaps: the grant names this rank's heap when the range lies there
    /// (the reader memcpys `[0, split)`), and this rank memcpys `[split, n)` into the
    /// reader's heap when its buffer lies there.
    Heap {
        /// Bytes the reader copies (0: none, this rank writes everything).
        split: usize,
    },
    /// A single-copy grant: the reader copies `[0, split)`, this rank writes `[split, n)`
    /// into its buffer by single copy.
    SingleCopy {
        /// Bytes the reader copies.
        split: usize,
    },
    /// The range goes back through the rings.
    Stream,
    /// The reader's share of a pre-granted read ([`ReadMode::Share`]): written unasked, if
    /// the send was pre-granted to that reader.
    Share,
}

/// How the target serves a checked read, from `f`:
///
/// - Shared heaps come first, in either mode but a share: a range in this rank's heap that
///   the reader maps is granted for a memcpy, split from [`HEAP_SPLIT_MIN`] when the reader's
///   buffer is in its heap too (this rank memcpys the second half into it), but below
///   [`HEAP_SPLIT_BUSY_MAX`] not while this rank has reads of its own in flight (each core
///   has its own copies then, as in `osu_bibw`). A reader's buffer in its heap alone gets
///   this rank's share written there: the second half of a single-copy request from
///   [`CMA_SPLIT_MIN`] (the reader copies the first with CMA), else all of it.
/// - A single-copy request is granted, and from [`CMA_SPLIT_WINDOW_MIN`] (a reader asks for
///   a read below [`CMA_SPLIT_MIN`] only when it has others in flight, or the sender could
///   not pre-grant it) split in halves, this rank writing the second while the reader copies
///   the first; not where the reader named no buffer, and not while this rank is busy: below
///   [`CMA_SPLIT_BUSY_MAX`] with reads of its own in flight (each core already copies what it
///   receives, and the split only adds its system calls: 1.12-1.18x at 128-256 KiB), below
///   [`CMA_SPLIT_DEEP_MAX`] with [`CMA_SPLIT_DEEP`] of them (`osu_bibw`'s default window of
///   64: 1.17/1.23/1.17x at 1/2/4 MiB without it, and 0.60-0.77x at 8-64 MiB). From 1 MiB
///   the split evens out the tail of a short window (`osu_bibw -W 8`: 0.62-0.83x without it).
/// - A stream request is streamed; a share is written.
pub(in crate::engine) fn plan_grant(f: &GrantFacts) -> GrantPlan {
    let n = f.n;
    let half = (n / 2) & !4095;
    let single = matches!(f.mode, ReadMode::SingleCopy { .. });
    if f.heaps && n > 0 && !matches!(f.mode, ReadMode::Share { .. }) {
        let busy = f.reads > 0 && n < HEAP_SPLIT_BUSY_MAX;
        match (f.from_heap, f.into_heap) {
            (true, true) if n >= HEAP_SPLIT_MIN && !busy => return GrantPlan::Heap { split: half },
            (true, _) => return GrantPlan::Heap { split: n },
            (false, true) if single && f.cma && n >= CMA_SPLIT_MIN => return GrantPlan::Heap { split: half },
            (false, true) => return GrantPlan::Heap { split: 0 },
            (false, false) => {}
        }
    }
    match f.mode {
        ReadMode::Stream => GrantPlan::Stream,
        ReadMode::Share { .. } => GrantPlan::Share,
        ReadMode::SingleCopy { dst } => {
            let busy = f.reads > 0 && (n < CMA_SPLIT_BUSY_MAX || (n < CMA_SPLIT_DEEP_MAX && f.reads >= CMA_SPLIT_DEEP));
            let split = if dst != 0 && n >= CMA_SPLIT_WINDOW_MIN && !busy { half } else { n };
            GrantPlan::SingleCopy { split }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Windows of streamed reads go around the cache from 256 KiB where both ranks read
    /// (`osu_bibw`), from 512 KiB where one does (`osu_bw`), and a lone read only from half the
    /// L3; out of small packets (1 MiB rings), only from half the L3.
    #[test]
    fn windows_go_around_the_cache_from_a_size_that_depends_on_the_direction() {
        let big = tmpi_transport::shm::streaming_copy_min();
        let nt = stream_nt_min(1 << 20);
        assert_eq!(nt, STREAM_NT_MIN);
        for (n, windowed, both, around) in [
            (256 << 10, true, true, true),
            (256 << 10, true, false, false),
            (512 << 10, true, false, true),
            ((512 << 10) - 1, true, false, false),
            (1 << 20, true, false, true),
            (1 << 20, false, true, false),
            ((128 << 10) - 1, true, true, false),
            (big - 1, false, true, false),
            (big, false, false, true),
        ] {
            // (Half the L3 is at least 512 KiB; a read of that size always goes around.)
            let around = around || n >= big;
            assert_eq!(copies_out_around_cache(n, windowed, both, nt), around, "{n} windowed {windowed} both {both}");
        }
        let small = stream_nt_min(256 << 10);
        assert!(!copies_out_around_cache(big - 1, true, true, small));
        assert!(copies_out_around_cache(big, true, false, small));
    }

    /// The reader's rules ([`plan_read`]), one row each: what the sender pre-granted is copied
    /// at once (by single copy unless our buffer is in our heap; from the sender's heap where
    /// we map it), shared with the target from a size that depends on the way, and not in a
    /// window where the target reads from us too; everything else asks.
    #[test]
    fn plan_read_table() {
        const K: usize = 1024;
        let ask = |cma| ReadPlan { start: ReadStart::Ask { cma }, remote_write: cma };
        let at_once = |heap, split, n| ReadPlan { start: ReadStart::AtOnce { heap, split }, remote_write: split < n };
        let cma = ReadFacts { has_buf: true, cma: true, pregranted: true, ..ReadFacts::default() };
        let heap = ReadFacts { has_buf: true, pregranted: true, sender_heap: true, own_heap: true, ..ReadFacts::default() };
        let fabric = ReadPlan { start: ReadStart::Fabric, remote_write: true };
        // (what, facts with n = len, plan)
        let rows: Vec<(&str, ReadFacts, usize, ReadPlan)> = vec![
            ("asked single copy", ReadFacts { has_buf: true, cma: true, ..ReadFacts::default() }, 256 * K, ask(true)),
            ("asked stream", ReadFacts { has_buf: true, ..ReadFacts::default() }, 256 * K, ask(false)),
            ("pre-granted stream asks", ReadFacts { cma: false, ..cma }, 64 * K, ask(false)),
            ("pre-granted below a share", cma, 16 * K, at_once(false, 16 * K, 16 * K)),
            ("pre-granted lone share", cma, 64 * K, at_once(false, share_split(64 * K), 64 * K)),
            ("share in a window", ReadFacts { others: true, ..cma }, 64 * K, at_once(false, share_split(64 * K), 64 * K)),
            ("no share both ways", ReadFacts { others: true, peer_reading: true, ..cma }, 64 * K, at_once(false, 64 * K, 64 * K)),
            ("both ways, lone", ReadFacts { peer_reading: true, ..cma }, 64 * K, at_once(false, share_split(64 * K), 64 * K)),
            ("both ways, small window", ReadFacts { others: true, peer_reading: true, ..cma }, 31 * K, at_once(false, 31 * K, 31 * K)),
            ("into own heap asks", ReadFacts { own_heap: true, ..cma }, 64 * K, ask(true)),
            ("not pre-granted from 1 MiB", cma, CMA_PREGRANT_MAX, ask(true)),
            ("no buffer, no share", ReadFacts { has_buf: false, ..cma }, 64 * K, at_once(false, 64 * K, 64 * K)),
            ("heap lone share", heap, 128 * K, at_once(true, share_split(128 * K), 128 * K)),
            ("heap window halves", ReadFacts { others: true, ..heap }, 128 * K, at_once(true, 64 * K, 128 * K)),
            ("heap below its share", heap, 32 * K, at_once(true, 32 * K, 32 * K)),
            ("heap into a plain buffer", ReadFacts { own_heap: false, ..heap }, 128 * K, at_once(true, 128 * K, 128 * K)),
            ("heap, no buffer", ReadFacts { has_buf: false, ..heap }, 128 * K, ask(false)),
            ("heap not mapped", ReadFacts { sender_heap: false, ..heap }, 128 * K, ask(false)),
            ("fabric key: fi_read", ReadFacts { has_buf: true, fabric_key: true, ..ReadFacts::default() }, 64 * K, fabric),
            ("fabric key, no buffer: stream", ReadFacts { fabric_key: true, ..ReadFacts::default() }, 64 * K, ask(false)),
            ("fabric key, empty: nothing to read", ReadFacts { has_buf: true, fabric_key: true, ..ReadFacts::default() }, 0, ask(false)),
            ("fabric key, pre-granted copy first", ReadFacts { fabric_key: true, ..cma }, 16 * K, at_once(false, 16 * K, 16 * K)),
            (
                "fabric key, asked single copy loses",
                ReadFacts { has_buf: true, cma: true, fabric_key: true, ..ReadFacts::default() },
                256 * K,
                fabric,
            ),
        ];
        for (what, f, n, want) in rows {
            let f = ReadFacts { n, len: n, ..f };
            assert_eq!(plan_read(&f), want, "{what}: {f:?}");
            assert_eq!(want.split(n) < n, matches!(want.start, ReadStart::AtOnce { split, .. } if split < n), "{what}");
            assert_eq!(want.start == ReadStart::Fabric, f.fabric_key && f.has_buf && n > 0 && !(f.pregranted && f.cma), "{what}");
        }
        // A read shorter than the message (a small receive buffer) is pre-granted all the same.
        assert_eq!(plan_read(&ReadFacts { n: 16 * K, len: 20 * K, ..cma }), at_once(false, 16 * K, 16 * K));
    }

    /// The target's rules ([`plan_grant`]), one row each: heaps first (split when both
    /// buffers are in heaps and this rank is not busy), then a single-copy grant split in
    /// halves where the reader named its buffer and this rank is not busy, else whole.
    #[test]
    fn plan_grant_table() {
        const K: usize = 1024;
        const M: usize = 1 << 20;
        let single = ReadMode::SingleCopy { dst: 0x1000 };
        let base = GrantFacts { n: 0, mode: single, heaps: false, from_heap: false, into_heap: false, cma: true, reads: 0 };
        let both = GrantFacts { heaps: true, from_heap: true, into_heap: true, ..base };
        let sc = |split| GrantPlan::SingleCopy { split };
        let heap = |split| GrantPlan::Heap { split };
        // (what, facts, n, plan)
        let rows: Vec<(&str, GrantFacts, usize, GrantPlan)> = vec![
            ("stream", GrantFacts { mode: ReadMode::Stream, ..base }, 256 * K, GrantPlan::Stream),
            ("share", GrantFacts { mode: ReadMode::Share { dst: 1 }, ..both }, 256 * K, GrantPlan::Share),
            ("single copy, idle: halves", base, 256 * K, sc(128 * K)),
            ("single copy from the window minimum", base, CMA_SPLIT_WINDOW_MIN, sc(16 * K)),
            ("single copy below it: whole", base, CMA_SPLIT_WINDOW_MIN - 1, sc(CMA_SPLIT_WINDOW_MIN - 1)),
            ("single copy, no buffer named", GrantFacts { mode: ReadMode::SingleCopy { dst: 0 }, ..base }, 256 * K, sc(256 * K)),
            ("single copy, busy below 1 MiB", GrantFacts { reads: 1, ..base }, 512 * K, sc(512 * K)),
            ("single copy, 2 MiB, few reads", GrantFacts { reads: CMA_SPLIT_DEEP - 1, ..base }, 2 * M, sc(M)),
            ("single copy, 2 MiB, deep", GrantFacts { reads: CMA_SPLIT_DEEP, ..base }, 2 * M, sc(2 * M)),
            ("single copy, 8 MiB, deep", GrantFacts { reads: CMA_SPLIT_DEEP, ..base }, 8 * M, sc(4 * M)),
            ("heap both, idle", both, HEAP_SPLIT_MIN, heap(HEAP_SPLIT_MIN / 2)),
            ("heap both, small", both, HEAP_SPLIT_MIN - 4096, heap(HEAP_SPLIT_MIN - 4096)),
            ("heap both, busy", GrantFacts { reads: 1, ..both }, 512 * K, heap(512 * K)),
            ("heap both, busy from 1 MiB", GrantFacts { reads: 1, ..both }, M, heap(M / 2)),
            ("from heap, streamed request", GrantFacts { mode: ReadMode::Stream, into_heap: false, ..both }, 256 * K, heap(256 * K)),
            ("into heap, single copy", GrantFacts { from_heap: false, ..both }, CMA_SPLIT_MIN, heap(CMA_SPLIT_MIN / 2)),
            ("into heap, small", GrantFacts { from_heap: false, ..both }, CMA_SPLIT_MIN - 4096, heap(0)),
            ("into heap, no single copy", GrantFacts { from_heap: false, cma: false, ..both }, 256 * K, heap(0)),
            ("into heap, stream", GrantFacts { from_heap: false, mode: ReadMode::Stream, ..both }, 256 * K, heap(0)),
            ("heaps on, neither", GrantFacts { heaps: true, ..base }, 256 * K, sc(128 * K)),
            ("heaps off", GrantFacts { heaps: false, ..both }, 256 * K, sc(128 * K)),
            ("empty", both, 0, sc(0)),
        ];
        for (what, f, n, want) in rows {
            let f = GrantFacts { n, ..f };
            assert_eq!(plan_grant(&f), want, "{what}: {f:?}");
        }
    }
}
