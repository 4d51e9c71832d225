//! How the bytes of a rendezvous move: the rules (and the constants behind them) that choose
//! between streaming through the rings, single copy (CMA), a shared heap, splitting a read
//! between both ranks, and copies around the cache.

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
}
