//! What is compared: the library configurations, the benchmarks, and the command lines that
//! run one benchmark over a range of sizes under one configuration.

use std::fmt;
use std::path::Path;

/// One library configuration under test.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Lib {
    /// tmpi, launched by `tmpirun`.
    Tmpi,
    /// tmpi with the point-to-point benchmarks' buffers in its shared heap (`-d shared`:
    /// `World::alloc_shared`); other benchmarks do not run under it.
    TmpiShared,
    /// Open MPI with its defaults (shared memory through `btl/vader`, CMA single copy).
    Ompi,
    /// Open MPI with `--mca btl_vader_single_copy_mechanism none` (copy-in/copy-out only).
    OmpiNoCma,
    /// MPICH (Debian's build: ch4 device over UCX).
    Mpich,
    /// tmpi over libfabric (`TMPI_FABRIC=ofi`, provider [`OFI_PROVIDER`]); needs tmpi's
    /// benchmarks built with the feature `ofi`. Not in the default set.
    TmpiOfi,
    /// tmpi over its own TCP fabric (`TMPI_FABRIC=tcp`, loopback): what `auto` uses between
    /// hosts, the baseline of the OFI comparison.
    TmpiTcp,
    /// Open MPI over libfabric (`--mca pml cm --mca mtl ofi`, provider [`OFI_PROVIDER`]).
    OmpiOfi,
}

/// The libfabric provider of the OFI configurations: `tcp` (through `ofi_rxm`), the one both
/// tmpi and Open MPI's `mtl ofi` run on here (Open MPI's OFI MTL refuses `shm`:
/// bench/results/ofi-floor.md), bound to loopback (`FI_TCP_IFACE=lo`).
pub const OFI_PROVIDER: &str = "tcp";

/// The configurations of the OFI comparison (`--ofi`).
pub const OFI_LIBS: [Lib; 3] = [Lib::TmpiOfi, Lib::TmpiTcp, Lib::OmpiOfi];

impl Lib {
    /// Every configuration, tmpi first.
    pub const ALL: [Lib; 8] = [Lib::Tmpi, Lib::TmpiShared, Lib::TmpiOfi, Lib::TmpiTcp, Lib::Ompi, Lib::OmpiNoCma, Lib::OmpiOfi, Lib::Mpich];

    /// Whether this is a tmpi configuration (not a peer).
    pub fn is_tmpi(self) -> bool {
        self.peer().is_none()
    }

    /// Whether `bench` runs under this configuration (the shared heap only changes where
    /// point-to-point buffers live).
    pub fn runs(self, bench: Bench) -> bool {
        self != Lib::TmpiShared || matches!(bench, Bench::Latency | Bench::Bw | Bench::Bibw | Bench::MsgRate)
    }

    /// Short name used on the command line, in file names and in raw data.
    pub fn key(self) -> &'static str {
        match self {
            Lib::Tmpi => "tmpi",
            Lib::TmpiShared => "tmpi-shared",
            Lib::Ompi => "ompi",
            Lib::OmpiNoCma => "ompi-nosc",
            Lib::Mpich => "mpich",
            Lib::TmpiOfi => "tmpi-ofi",
            Lib::TmpiTcp => "tmpi-tcp",
            Lib::OmpiOfi => "ompi-ofi",
        }
    }

    /// Human-readable name for tables and plot legends.
    pub fn label(self) -> &'static str {
        match self {
            Lib::Tmpi => "tmpi",
            Lib::TmpiShared => "tmpi (shared heap)",
            Lib::Ompi => "Open MPI",
            Lib::OmpiNoCma => "Open MPI (no CMA)",
            Lib::Mpich => "MPICH",
            Lib::TmpiOfi => "tmpi (OFI tcp)",
            Lib::TmpiTcp => "tmpi (own TCP)",
            Lib::OmpiOfi => "Open MPI (mtl ofi, tcp)",
        }
    }

    /// The peer implementation whose binaries this configuration runs (`None` for tmpi).
    pub fn peer(self) -> Option<Peer> {
        match self {
            Lib::Tmpi | Lib::TmpiShared | Lib::TmpiOfi | Lib::TmpiTcp => None,
            Lib::Ompi | Lib::OmpiNoCma | Lib::OmpiOfi => Some(Peer::OpenMpi),
            Lib::Mpich => Some(Peer::Mpich),
        }
    }

    /// Parses a [`Lib::key`].
    pub fn from_key(s: &str) -> Option<Lib> {
        Lib::ALL.into_iter().find(|l| l.key() == s)
    }
}

impl fmt::Display for Lib {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.key())
    }
}

/// A peer MPI implementation, as Debian packages it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Peer {
    /// Open MPI (`mpicc.openmpi`, `mpirun.openmpi`).
    OpenMpi,
    /// MPICH (`mpicc.mpich`, `mpirun.mpich`).
    Mpich,
}

impl Peer {
    /// Both peers.
    pub const ALL: [Peer; 2] = [Peer::OpenMpi, Peer::Mpich];

    /// Debian's suffix of the alternatives (`mpicc.<suffix>`), also the build directory name.
    pub fn suffix(self) -> &'static str {
        match self {
            Peer::OpenMpi => "openmpi",
            Peer::Mpich => "mpich",
        }
    }

    /// Human-readable name.
    pub fn label(self) -> &'static str {
        match self {
            Peer::OpenMpi => "Open MPI",
            Peer::Mpich => "MPICH",
        }
    }

    /// The Debian packages that provide its compiler wrapper and launcher.
    pub fn packages(self) -> &'static str {
        match self {
            Peer::OpenMpi => "openmpi-bin libopenmpi-dev",
            Peer::Mpich => "mpich libmpich-dev",
        }
    }
}

/// One benchmark: a program pair (tmpi's binary, the C peer) and the values it gives.
///
/// Every benchmark stores its values by a "size" key: the message size, except
/// [`Bench::Barrier`] (keyed by the number of ranks) and the depth benchmarks (keyed by the
/// queue depth `D`, with 8-byte messages).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Bench {
    /// Ping-pong latency (`osu_latency` / `lat`).
    Latency,
    /// Unidirectional windowed bandwidth (`osu_bw` / `bw`).
    Bw,
    /// Bidirectional windowed bandwidth (`osu_bibw` / `bibw`).
    Bibw,
    /// 8-byte message rate of one pair, window 64 (`osu_mbw_mr -m 8:8` / `msgrate`).
    MsgRate,
    /// Barrier latency at 2 and 4 ranks (`osu_barrier` / `coll barrier`).
    Barrier,
    /// Allreduce latency at 2 ranks, 8 B to 1 MiB (`osu_allreduce` / `coll allreduce`).
    Allreduce2,
    /// Allreduce latency at 4 ranks.
    Allreduce4,
    /// 8-byte ping-pong with `D` never-matching receives from the peer posted
    /// (`osu_latency_depth -v posted-specific` / `depth -v posted-specific`).
    DepthSpecific,
    /// The same with `D` `ANY_SOURCE` receives posted (`-v posted-any`).
    DepthAny,
    /// The same with `D` unreceived messages from the peer queued (`-v unexpected`).
    DepthUnexpected,
}

/// A group of benchmarks selected together on the command line (`--benches`).
pub const GROUPS: [(&str, &[Bench]); 7] = [
    ("latency", &[Bench::Latency]),
    ("bw", &[Bench::Bw]),
    ("bibw", &[Bench::Bibw]),
    ("msgrate", &[Bench::MsgRate]),
    ("barrier", &[Bench::Barrier]),
    ("allreduce", &[Bench::Allreduce2, Bench::Allreduce4]),
    ("depth", &[Bench::DepthSpecific, Bench::DepthAny, Bench::DepthUnexpected]),
];

/// The queue depths of the depth benchmarks (osu_latency_depth's defaults).
pub const DEPTHS: [usize; 5] = [0, 16, 256, 1024, 4096];

/// Rank counts of the barrier benchmark.
pub const BARRIER_RANKS: [usize; 2] = [2, 4];

/// How a benchmark's output is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rows {
    /// One row per message size (`SIZE VALUE...`).
    Sizes,
    /// One lone value (barrier), stored under the rank count.
    Single,
    /// One row per depth (`DEPTH SIZE LATENCY`), 8-byte messages only.
    Depths,
}

impl Bench {
    /// Every benchmark, in the order they run within a repetition.
    pub const ALL: [Bench; 10] = [
        Bench::Latency,
        Bench::Bw,
        Bench::Bibw,
        Bench::MsgRate,
        Bench::Barrier,
        Bench::Allreduce2,
        Bench::Allreduce4,
        Bench::DepthSpecific,
        Bench::DepthAny,
        Bench::DepthUnexpected,
    ];

    /// Short name for file names and raw data.
    pub fn key(self) -> &'static str {
        match self {
            Bench::Latency => "latency",
            Bench::Bw => "bw",
            Bench::Bibw => "bibw",
            Bench::MsgRate => "msgrate",
            Bench::Barrier => "barrier",
            Bench::Allreduce2 => "allreduce-2",
            Bench::Allreduce4 => "allreduce-4",
            Bench::DepthSpecific => "depth-posted-specific",
            Bench::DepthAny => "depth-posted-any",
            Bench::DepthUnexpected => "depth-unexpected",
        }
    }

    /// Title of its table and plot.
    pub fn title(self) -> &'static str {
        match self {
            Bench::Latency => "Ping-pong latency",
            Bench::Bw => "Unidirectional bandwidth",
            Bench::Bibw => "Bidirectional bandwidth",
            Bench::MsgRate => "Message rate (8 B, window 64, 1 pair)",
            Bench::Barrier => "Barrier latency",
            Bench::Allreduce2 => "Allreduce latency (f32 sum), 2 ranks",
            Bench::Allreduce4 => "Allreduce latency (f32 sum), 4 ranks",
            Bench::DepthSpecific => "8 B ping-pong latency with D posted never-matching receives from the peer",
            Bench::DepthAny => "8 B ping-pong latency with D posted never-matching ANY_SOURCE receives",
            Bench::DepthUnexpected => "8 B ping-pong latency with D unreceived messages queued",
        }
    }

    /// Unit of the compared value.
    pub fn unit(self) -> &'static str {
        match self {
            Bench::Bw | Bench::Bibw => "MB/s",
            Bench::MsgRate => "messages/s",
            _ => "us",
        }
    }

    /// Whether a larger value is better (bandwidth, rate) or worse (latency).
    pub fn higher_is_better(self) -> bool {
        matches!(self, Bench::Bw | Bench::Bibw | Bench::MsgRate)
    }

    /// How its output is read.
    pub fn rows(self) -> Rows {
        match self {
            Bench::Barrier => Rows::Single,
            Bench::DepthSpecific | Bench::DepthAny | Bench::DepthUnexpected => Rows::Depths,
            _ => Rows::Sizes,
        }
    }

    /// The label of the row stored under `key` (a size, a rank count or a depth).
    pub fn row_label(self, key: usize) -> String {
        match self.rows() {
            Rows::Sizes => size_label(key),
            Rows::Single => format!("{key} ranks"),
            Rows::Depths => format!("D = {key}"),
        }
    }

    /// The tmpi binary (in the release directory).
    pub fn tmpi_bin(self) -> &'static str {
        match self {
            Bench::Latency => "osu_latency",
            Bench::Bw => "osu_bw",
            Bench::Bibw => "osu_bibw",
            Bench::MsgRate => "osu_mbw_mr",
            Bench::Barrier => "osu_barrier",
            Bench::Allreduce2 | Bench::Allreduce4 => "osu_allreduce",
            Bench::DepthSpecific | Bench::DepthAny | Bench::DepthUnexpected => "osu_latency_depth",
        }
    }

    /// The C peer program (`bench/c/<name>.c`).
    pub fn peer_bin(self) -> &'static str {
        match self {
            Bench::Latency => "lat",
            Bench::Bw => "bw",
            Bench::Bibw => "bibw",
            Bench::MsgRate => "msgrate",
            Bench::Barrier | Bench::Allreduce2 | Bench::Allreduce4 => "coll",
            Bench::DepthSpecific | Bench::DepthAny | Bench::DepthUnexpected => "depth",
        }
    }

    /// The arguments that come before the options, for the C peer only (`coll` takes the
    /// collective's name).
    pub fn peer_prefix(self) -> &'static [&'static str] {
        match self {
            Bench::Barrier => &["barrier"],
            Bench::Allreduce2 | Bench::Allreduce4 => &["allreduce"],
            _ => &[],
        }
    }

    /// Options both programs get after the OSU ones (the depth variant and depths).
    pub fn extra_args(self) -> Vec<String> {
        let variant = match self {
            Bench::DepthSpecific => "posted-specific",
            Bench::DepthAny => "posted-any",
            Bench::DepthUnexpected => "unexpected",
            _ => return Vec::new(),
        };
        let depths: Vec<String> = DEPTHS.iter().map(ToString::to_string).collect();
        vec!["-v".into(), variant.into(), "-d".into(), depths.join(",")]
    }

    /// Which value column of an output row is compared (0 = the first after the size;
    /// the message-rate programs print MB/s then messages/s, the depth programs the size then
    /// the latency).
    pub fn column(self) -> usize {
        match self {
            Bench::MsgRate => 1,
            _ if self.rows() == Rows::Depths => 1,
            _ => 0,
        }
    }
}

impl fmt::Display for Bench {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.key())
    }
}

/// One invocation of a benchmark program: a contiguous range of doubling sizes that share
/// their iteration counts and window.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Segment {
    /// Smallest size (bytes).
    pub min: usize,
    /// Largest size (bytes).
    pub max: usize,
    /// Timed iterations per size.
    pub iters: usize,
    /// Warm-up iterations per size.
    pub warmup: usize,
    /// Messages in flight (bandwidth and message rate only).
    pub window: Option<usize>,
    /// Number of ranks.
    pub np: usize,
}

impl Segment {
    /// The OSU-style options of this segment (`-m MIN:MAX -i N -x N [-W N]`; a barrier has no
    /// sizes, so no `-m`).
    pub fn args(&self) -> Vec<String> {
        let mut a = Vec::new();
        if self.min > 0 {
            a.extend(["-m".to_string(), format!("{}:{}", self.min, self.max)]);
        }
        a.extend(["-i".to_string(), self.iters.to_string(), "-x".to_string(), self.warmup.to_string()]);
        if let Some(w) = self.window {
            a.push("-W".into());
            a.push(w.to_string());
        }
        a
    }

    /// The sizes the program prints a row for: `min`, doubling, up to `max`.
    pub fn sizes(&self) -> Vec<usize> {
        let mut v = Vec::new();
        let mut s = self.min.max(1);
        while s <= self.max {
            v.push(s);
            match s.checked_mul(2) {
                Some(n) => s = n,
                None => break,
            }
        }
        v
    }
}

/// Largest size above which bandwidth runs use [`LARGE_WINDOW`] instead of 64: a window of 64
/// receive slots of 64 MiB would need 4 GiB per rank.
pub const WINDOW_SWITCH: usize = 4 << 20;
/// Window of the bandwidth runs above [`WINDOW_SWITCH`].
pub const LARGE_WINDOW: usize = 8;
/// Window of the other bandwidth and message-rate runs (OSU's default).
pub const WINDOW: usize = 64;

/// One tier of sizes: (largest size of the tier, timed iterations, warm-up, window).
type Tier = (usize, usize, usize, Option<usize>);

/// The segments of `bench`: for latency, bw and bibw they cover sizes 1..=`max_size`
/// (doubling); allreduce covers 8 B..1 MiB with OSU's collective counts; barrier runs once per
/// rank count; the depth benchmarks run 8-byte messages. `quick` divides the iteration counts by
/// ten (at least 2 timed, 1 warm-up).
pub fn segments(bench: Bench, max_size: usize, quick: bool) -> Vec<Segment> {
    let shrink = |iters: usize, warmup: usize| if quick { ((iters / 10).max(2), (warmup / 10).max(1)) } else { (iters, warmup) };
    let (lo, max_size, np, tiers): (usize, usize, usize, &[Tier]) = match bench {
        Bench::Latency => (1, max_size, 2, &[(8 << 10, 10_000, 100, None), (1 << 20, 1000, 10, None), (usize::MAX, 100, 5, None)]),
        Bench::Bw | Bench::Bibw => (
            1,
            max_size,
            2,
            &[(8 << 10, 100, 10, Some(WINDOW)), (WINDOW_SWITCH, 20, 2, Some(WINDOW)), (usize::MAX, 10, 2, Some(LARGE_WINDOW))],
        ),
        Bench::Allreduce2 | Bench::Allreduce4 => {
            let np = if bench == Bench::Allreduce2 { 2 } else { 4 };
            (8, COLL_MAX_SIZE, np, &[(8 << 10, 1000, 100, None), (usize::MAX, 100, 10, None)])
        }
        Bench::MsgRate => {
            let (iters, warmup) = if quick { (100, 10) } else { (2000, 200) };
            return vec![Segment { min: 8, max: 8, iters, warmup, window: Some(WINDOW), np: 2 }];
        }
        Bench::Barrier => {
            let (iters, warmup) = shrink(1000, 100);
            return BARRIER_RANKS.iter().map(|&np| Segment { min: 0, max: 0, iters, warmup, window: None, np }).collect();
        }
        Bench::DepthSpecific | Bench::DepthAny | Bench::DepthUnexpected => {
            let (iters, warmup) = shrink(DEPTH_ITERS, DEPTH_WARMUP);
            return vec![Segment { min: 8, max: 8, iters, warmup, window: None, np: 2 }];
        }
    };
    let mut out = Vec::new();
    let mut lo = lo;
    for &(top, iters, warmup, window) in tiers {
        let hi = top.min(max_size);
        if lo <= hi {
            let (iters, warmup) = shrink(iters, warmup);
            out.push(Segment { min: lo, max: hi, iters, warmup, window, np });
        }
        match top.checked_mul(2) {
            Some(n) => lo = n,
            None => break,
        }
    }
    out
}

/// `TMPI_SHARED_HEAP` of the `tmpi-shared` configuration (8 GiB).
pub const SHARED_HEAP: u64 = 8 << 30;

/// Largest allreduce size (OSU's default for collectives, 1 MiB).
pub const COLL_MAX_SIZE: usize = 1 << 20;
/// Timed 8-byte ping-pongs per depth (warm-up: [`DEPTH_WARMUP`]).
pub const DEPTH_ITERS: usize = 5000;
/// Warm-up ping-pongs per depth.
pub const DEPTH_WARMUP: usize = 500;

/// The command line (program first) that runs `prog` with `args` on `np` ranks under `lib`.
/// `bin_dir` holds `tmpirun`; `prog` is a full path.
pub fn command_line(lib: Lib, np: usize, bin_dir: &Path, prog: &Path, args: &[String]) -> Vec<String> {
    let np = np.to_string();
    let tmpirun = |env: &[String]| {
        let mut v = vec![bin_dir.join("tmpirun").display().to_string()];
        for e in env {
            v.extend(["-x".to_string(), e.clone()]);
        }
        v.extend(["-n".to_string(), np.clone()]);
        v
    };
    let mut v: Vec<String> = match lib {
        Lib::Tmpi => tmpirun(&[]),
        // The receive window of osu_bw/osu_bibw (64 slots of up to 64 MiB) must fit in the
        // heap, or it falls back to private memory: 8 GiB of address space (pages are only
        // taken as written, as with ordinary buffers).
        Lib::TmpiShared => tmpirun(&[format!("TMPI_SHARED_HEAP={SHARED_HEAP}")]),
        Lib::TmpiOfi => tmpirun(&["TMPI_FABRIC=ofi".into(), format!("TMPI_OFI_PROVIDER={OFI_PROVIDER}"), "FI_TCP_IFACE=lo".into()]),
        Lib::TmpiTcp => tmpirun(&["TMPI_FABRIC=tcp".into()]),
        Lib::Ompi | Lib::OmpiNoCma | Lib::OmpiOfi => {
            let mut v = vec!["mpirun.openmpi".into(), "--allow-run-as-root".into(), "--oversubscribe".into(), "-np".into(), np];
            if lib == Lib::OmpiNoCma {
                v.extend(["--mca".into(), "btl_vader_single_copy_mechanism".into(), "none".into()]);
            }
            if lib == Lib::OmpiOfi {
                for (k, val) in [("pml", "cm"), ("mtl", "ofi"), ("mtl_ofi_provider_include", OFI_PROVIDER), ("oob_tcp_if_include", "lo")] {
                    v.extend(["--mca".into(), k.into(), val.into()]);
                }
                v.extend(["-x".into(), "FI_TCP_IFACE=lo".into()]);
            }
            v
        }
        Lib::Mpich => vec!["mpirun.mpich".into(), "-np".into(), np],
    };
    v.push(prog.display().to_string());
    v.extend(args.iter().cloned());
    v
}

/// `n` bytes as `1 B`, `4 KiB`, `64 MiB` (binary units, exact powers only shortened).
pub fn size_label(n: usize) -> String {
    const UNITS: [(usize, &str); 3] = [(1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")];
    for (u, name) in UNITS {
        if n >= u && n % u == 0 {
            return format!("{} {name}", n / u);
        }
    }
    format!("{n} B")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_labels() {
        assert_eq!(size_label(1), "1 B");
        assert_eq!(size_label(3000), "3000 B");
        assert_eq!(size_label(64 << 10), "64 KiB");
        assert_eq!(size_label(64 << 20), "64 MiB");
    }

    #[test]
    fn latency_segments_cover_every_size_once() {
        let segs = segments(Bench::Latency, 64 << 20, false);
        assert_eq!(segs.len(), 3);
        let all: Vec<usize> = segs.iter().flat_map(Segment::sizes).collect();
        let want: Vec<usize> = (0..=26).map(|k| 1usize << k).collect();
        assert_eq!(all, want);
        assert_eq!((segs[0].iters, segs[1].iters, segs[2].iters), (10_000, 1000, 100));
    }

    #[test]
    fn small_max_drops_tiers_and_quick_shrinks_loops() {
        let segs = segments(Bench::Bw, 1 << 20, true);
        assert_eq!(segs.len(), 2);
        assert_eq!((segs[1].min, segs[1].max), (16 << 10, 1 << 20));
        assert_eq!((segs[0].iters, segs[0].warmup), (10, 1));
        assert_eq!((segs[1].iters, segs[1].warmup), (2, 1));
        let segs = segments(Bench::Bibw, 64 << 20, false);
        assert_eq!(segs[2].window, Some(LARGE_WINDOW));
        assert_eq!((segs[2].min, segs[2].max), (8 << 20, 64 << 20));
        let segs = segments(Bench::Latency, 100, false);
        assert_eq!(segs.len(), 1);
        assert_eq!(segs[0].sizes().last(), Some(&64));
    }

    #[test]
    fn collective_and_depth_segments() {
        let segs = segments(Bench::Allreduce4, 64 << 20, false);
        assert_eq!(segs.len(), 2);
        assert_eq!((segs[0].min, segs[0].max, segs[0].iters, segs[0].np), (8, 8 << 10, 1000, 4));
        assert_eq!((segs[1].min, segs[1].max, segs[1].iters, segs[1].warmup), (16 << 10, 1 << 20, 100, 10));
        let segs = segments(Bench::Barrier, 1 << 20, true);
        assert_eq!(segs.iter().map(|s| s.np).collect::<Vec<_>>(), vec![2, 4]);
        assert_eq!(segs[0].args().join(" "), "-i 100 -x 10");
        let segs = segments(Bench::DepthAny, 1 << 20, true);
        assert_eq!(segs.len(), 1);
        let mut a = segs[0].args();
        a.extend(Bench::DepthAny.extra_args());
        assert_eq!(a.join(" "), "-m 8:8 -i 500 -x 50 -v posted-any -d 0,16,256,1024,4096");
        assert_eq!(Bench::DepthAny.column(), 1);
        assert_eq!(Bench::Barrier.row_label(4), "4 ranks");
        assert_eq!(Bench::DepthUnexpected.row_label(4096), "D = 4096");
        assert_eq!(Bench::Allreduce2.row_label(1 << 20), "1 MiB");
        let all: Vec<Bench> = GROUPS.iter().flat_map(|g| g.1.iter().copied()).collect();
        assert_eq!(all, Bench::ALL.to_vec());
    }

    #[test]
    fn command_lines_follow_peers_sh() {
        let args = Segment { min: 8, max: 8, iters: 5, warmup: 1, window: Some(64), np: 2 }.args();
        assert_eq!(args.join(" "), "-m 8:8 -i 5 -x 1 -W 64");
        let p = Path::new("/p/lat");
        let c = command_line(Lib::OmpiNoCma, 2, Path::new("/b"), p, &args[..2]);
        assert_eq!(
            c.join(" "),
            "mpirun.openmpi --allow-run-as-root --oversubscribe -np 2 --mca \
             btl_vader_single_copy_mechanism none /p/lat -m 8:8"
        );
        let c = command_line(Lib::Tmpi, 16, Path::new("/b"), Path::new("/b/hello"), &[]);
        assert_eq!(c.join(" "), "/b/tmpirun -n 16 /b/hello");
        assert_eq!(command_line(Lib::Mpich, 2, Path::new("/b"), p, &[]).join(" "), "mpirun.mpich -np 2 /p/lat");
        assert_eq!(Lib::from_key("ompi-nosc"), Some(Lib::OmpiNoCma));
        assert_eq!(Lib::from_key("lam"), None);
        let c = command_line(Lib::TmpiOfi, 2, Path::new("/b"), p, &[]);
        assert_eq!(c.join(" "), "/b/tmpirun -x TMPI_FABRIC=ofi -x TMPI_OFI_PROVIDER=tcp -x FI_TCP_IFACE=lo -n 2 /p/lat");
        let c = command_line(Lib::OmpiOfi, 2, Path::new("/b"), p, &[]);
        assert_eq!(
            c.join(" "),
            "mpirun.openmpi --allow-run-as-root --oversubscribe -np 2 --mca pml cm --mca mtl ofi \
             --mca mtl_ofi_provider_include tcp --mca oob_tcp_if_include lo -x FI_TCP_IFACE=lo /p/lat"
        );
        assert_eq!(command_line(Lib::TmpiTcp, 2, Path::new("/b"), p, &[]).join(" "), "/b/tmpirun -x TMPI_FABRIC=tcp -n 2 /p/lat");
        assert!(OFI_LIBS.iter().all(|l| Lib::from_key(l.key()) == Some(*l)));
    }
}
