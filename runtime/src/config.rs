//! Every `TMPI_*` knob in one place: read, validated and documented here.
//!
//! Knobs are read once, at [`crate::init`], before any communication; a bad value is an
//! [`Error::Config`] naming the variable and what it accepts. `tmpirun --info` prints the same
//! table ([`KNOBS`]).

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

use tmpi_transport::fabric::FabricChoice;
pub use tmpi_transport::knobs::{Knob, KNOBS};
use tmpi_transport::mr::{CacheConfig, Monitor};
use tmpi_transport::shm::room::{parse_shm_limit, ENV_SHM_LIMIT, EXPECT_SHM_LIMIT};
use tmpi_transport::shm::segment::{MAX_RANKS, QUEUED};
use tmpi_transport::tcp::alive;

/// Parsed configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// `TMPI_STATS`.
    pub stats: bool,
    /// `TMPI_EAGER_LIMIT`.
    pub eager_limit: usize,
    /// `TMPI_RNDV_THRESHOLD`; `None` = auto: 262144, and [`RNDV_AUTO`]'s adaptive start
    /// between ranks of one host (see `engine::adapt`).
    pub rndv_threshold: Option<usize>,
    /// `TMPI_UNEXPECTED_MAX`.
    pub unexpected_max: usize,
    /// `TMPI_TM_MAX_TAGS`.
    pub tm_max_tags: u32,
    /// `TMPI_TM_THRESH`.
    pub tm_thresh: usize,
    /// `TMPI_SHM_RING_SIZE`; 0 = auto (see [`Config::ring_size_for`]).
    pub shm_ring_size: usize,
    /// `TMPI_SHM_PAIRS_MAX`: largest job (ranks on one host) with a ring per ordered pair;
    /// larger ones use a queue per rank (see [`Config::ring_size_for`]).
    pub shm_pairs_max: usize,
    /// `TMPI_SHM_LIMIT`: most bytes the shared-memory segment may take; `None` = auto (what
    /// the tmpfs, the host and the memory cgroup can give, which is checked in any case).
    pub shm_limit: Option<u64>,
    /// `TMPI_POLL_SPIN`; `None` = auto.
    pub poll_spin: Option<u32>,
    /// `TMPI_MR_CACHE_MAX_COUNT` (or `FI_MR_CACHE_MAX_COUNT`), as
    /// [`CacheConfig::parse`] reads it.
    pub mr_cache_max_count: usize,
    /// `TMPI_MR_CACHE_MAX_SIZE` (or `FI_MR_CACHE_MAX_SIZE`); `None` = unlimited.
    pub mr_cache_max_size: Option<usize>,
    /// `TMPI_MR_CACHE_MONITOR` (or `FI_MR_CACHE_MONITOR`) selects the userfaultfd monitor
    /// (else disabled).
    pub mr_cache_monitor_uffd: bool,
    /// `TMPI_SINGLE_COPY` is `cma` (else `none`: rendezvous data always goes through the rings).
    pub single_copy: bool,
    /// `TMPI_SINGLE_COPY_MIN`; `None` = auto: each receiver measures single copy against the
    /// rings per size class and uses the faster (see `engine::adapt`).
    pub single_copy_min: Option<usize>,
    /// `TMPI_FABRIC`.
    pub fabric: FabricChoice,
    /// `TMPI_TCP_IF`; `None` = auto.
    pub tcp_if: Option<String>,
    /// `TMPI_OFI_PROVIDER`; `None` = auto (libfabric's first offer). Read by builds with the
    /// `ofi` feature, for the OFI fabric (`TMPI_FABRIC=ofi`, or `auto` between hosts over a
    /// hardware provider).
    pub ofi_provider: Option<String>,
    /// `TMPI_OFI_MATCHING`: who matches point-to-point over the OFI fabric; `None` = auto
    /// (`tmpi_transport::ofi::p2p::Matching::default_for` the provider).
    pub ofi_matching: Option<OfiMatching>,
    /// `TMPI_OFI_RNDV`: how a rendezvous's data moves over the OFI fabric; `None` = auto
    /// (the measured default of `Engine::choose_rndv`).
    pub ofi_rndv: Option<OfiRndv>,
    /// `TMPI_SHARED_HEAP`: capacity in bytes of this rank's shared heap (`World::alloc_shared`);
    /// 0 turns the shared heap off (allocations are private, peers' heaps are not mapped).
    pub shared_heap: usize,
    /// `TMPI_SHM_COLL`: shared-memory collectives on.
    pub shm_coll: bool,
    /// `TMPI_COLL_*`: the algorithm forced per collective (see [`crate::coll::select`]).
    pub coll: crate::coll::select::Force,
    /// `TMPI_PEER_TIMEOUT`: how long a peer on another host may leave its TCP connection
    /// unanswered before it counts as gone; `None`: no limit (`0`).
    pub peer_timeout: Option<std::time::Duration>,
    /// `TMPI_TRACE`: the merged trace's path (the rank's ring file is beside it); `None` = off.
    pub trace: Option<PathBuf>,
    /// `TMPI_TRACE_EVENTS`: events the trace ring holds.
    pub trace_events: u64,
    /// `TMPI_PROFILE`: the directory of the profile files; `None` = off.
    pub profile: Option<PathBuf>,
    /// `TMPI_RECORD`: the directory of the decision records; `None` = off.
    pub record: Option<PathBuf>,
    /// `TMPI_REPLAY`: the directory of the records to replay; `None` = off.
    pub replay: Option<PathBuf>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            stats: false,
            eager_limit: 524_288,
            rndv_threshold: None,
            unexpected_max: 64 << 20,
            tm_max_tags: 1023,
            tm_thresh: 16384,
            shm_ring_size: 0,
            shm_pairs_max: 64,
            shm_limit: None,
            poll_spin: None,
            mr_cache_max_count: 1024,
            mr_cache_max_size: None,
            mr_cache_monitor_uffd: true,
            single_copy: true,
            fabric: FabricChoice::Auto,
            tcp_if: None,
            ofi_provider: None,
            ofi_matching: None,
            ofi_rndv: None,
            // Which copy wins depends on the host, by 2x either way
            // (bench/results/adaptive-copy.md): measured per receiver.
            single_copy_min: None,
            shared_heap: 1 << 30,
            shm_coll: true,
            coll: crate::coll::select::Force::AUTO,
            peer_timeout: Some(alive::DEFAULT_PEER_TIMEOUT),
            trace: None,
            trace_events: 1 << 20,
            profile: None,
            record: None,
            replay: None,
        }
    }
}

/// The `TMPI_FABRIC` values this build takes.
const FABRICS: &str = if cfg!(feature = "ofi") { "auto, shm, tcp or ofi" } else { "auto, shm or tcp (ofi needs the cargo feature `ofi`)" };

/// What `TMPI_FABRIC=ofi` gets in a build without the OFI fabric.
const NO_OFI: &str =
    "auto, shm or tcp: this build has no OFI fabric; build with the cargo feature `ofi` (cargo build --release --features ofi; needs libfabric-dev)";

/// `TMPI_OFI_MATCHING` when not auto: who matches point-to-point over the OFI fabric.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OfiMatching {
    /// The provider (`fi_tsend`/`fi_trecv` with the context, source and tag in the tag).
    Provider,
    /// tmpi's software matcher, over the fabric's packets.
    Software,
}

/// `TMPI_OFI_RNDV` when not auto: how a rendezvous's data moves over the OFI fabric.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OfiRndv {
    /// The receiver `fi_read`s the sender's buffer, registered with `fi_mr_reg`.
    Read,
    /// The sender streams the data back through the fabric's packets.
    Stream,
}

fn bad(var: &str, value: &str, expected: &str) -> Error {
    Error::Config { var: var.into(), value: value.into(), expected: expected.into() }
}

fn num(var: &str, v: &str, lo: u64, hi: u64) -> Result<u64> {
    let expected = format!("an integer from {lo} to {hi}");
    let n: u64 = v.trim().parse().map_err(|_| bad(var, v, &expected))?;
    if n < lo || n > hi {
        return Err(bad(var, v, &expected));
    }
    Ok(n)
}

/// `TMPI_RNDV_THRESHOLD=auto`: messages of at least this many bytes always use rendezvous.
pub const RNDV_AUTO: usize = 262_144;
/// `TMPI_RNDV_THRESHOLD=auto`: advice from a receiver (`EAGER_BELOW`, see `engine::adapt`)
/// raises where rendezvous starts up to this many bytes, two size classes above
/// [`RNDV_AUTO`]: on a quiet 2-core AMD EPYC host, 256 KiB messages moved 1.1x the bytes
/// eagerly in `osu_bw` (52.6-54.8 against 48-50 GB/s by a streamed rendezvous) and 1.3-1.4x
/// in `osu_bibw` (46-52 against 33-36), and 512 KiB messages 1.30x in `osu_bw` (47 against
/// 36 GB/s; `bench/results/p2p-2026-11-28.md`, session 33). (Session 33 reverted this once:
/// a hybrid job then hung, because the TCP fabric refused the middle packets of eager
/// messages of three or more packets; session 34 fixed that.)
pub const RNDV_ADVISED_MAX: usize = 1_048_576;

impl Config {
    /// Messages of at least this many bytes always use rendezvous (`TMPI_RNDV_THRESHOLD`, or
    /// [`RNDV_AUTO`]).
    pub fn rndv_ceiling(&self) -> usize {
        self.rndv_threshold.unwrap_or(RNDV_AUTO)
    }

    /// The highest start of rendezvous that a receiver's advice may set: the configured
    /// threshold, or with auto [`RNDV_ADVISED_MAX`].
    pub fn advice_ceiling(&self) -> usize {
        self.rndv_threshold.unwrap_or(RNDV_ADVISED_MAX)
    }

    /// Whether rendezvous starts low between ranks of one host and receivers advise senders
    /// where eager pays (both `TMPI_RNDV_THRESHOLD` and `TMPI_SINGLE_COPY_MIN` auto, single
    /// copy on).
    pub fn rndv_adaptive(&self) -> bool {
        self.rndv_threshold.is_none() && self.single_copy_min.is_none() && self.single_copy
    }

    /// Bytes of each shared-memory ring for a job of `ranks` ranks: the configured size, or
    /// (auto) 4 MiB up to 4 ranks, 1 MiB up to 8, 256 KiB up to 32 and 64 KiB beyond, so
    /// that the segment (one ring per ordered pair) stays near or below 64 MiB while small
    /// jobs get deep pipelines (eager messages up to 256 KiB and streamed rendezvous reads).
    /// A 4 MiB ring carries 1 MiB packets, which a receiver copies out with non-temporal
    /// stores (a window of streamed reads of 256 KiB or more): with the defaults, `osu_bw` 1-8
    /// MiB moved 1.7-2.0x the bytes of 1 MiB rings and `osu_bibw` 1-64 MiB 1.2-1.9x
    /// (`bench/results/p2p-2026-11-27e.md`).
    ///
    /// A job of more than `TMPI_SHM_PAIRS_MAX` ranks (64 by default) gets no rings:
    /// [`QUEUED`], a queue per rank and fragments per sender, whose memory grows with the
    /// ranks, not their square (a ring per pair takes 1 GiB at 128 ranks, 17 GB at 512).
    pub fn ring_size_for(&self, ranks: usize) -> usize {
        if ranks > self.shm_pairs_max {
            return QUEUED;
        }
        match (self.shm_ring_size, ranks) {
            (0, 0..=4) => 4 << 20,
            (0, 5..=8) => 1 << 20,
            (0, 9..=32) => 256 << 10,
            (0, _) => 64 << 10,
            (n, _) => n,
        }
    }

    /// Reads every knob from the process environment.
    ///
    /// # Errors
    /// [`Error::Config`] for the first variable with a value it does not accept.
    pub fn from_env() -> Result<Self> {
        Self::from_lookup(|k| std::env::var(k).ok())
    }

    /// Reads every knob through `get` (the environment, or a map in tests).
    ///
    /// # Errors
    /// [`Error::Config`] for the first variable with a value it does not accept.
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Self> {
        let mut c = Config::default();
        protocol_knobs(&mut c, &get)?;
        shm_knobs(&mut c, &get)?;
        mr_cache_copy_knobs(&mut c, &get)?;
        fabric_knobs(&mut c, &get)?;
        heap_timeout_coll_knobs(&mut c, &get)?;
        c.coll = crate::coll::select::Force::parse(&get)?;
        seen_knobs(&mut c, &get)?;
        Ok(c)
    }
}

/// The knobs of statistics, the message protocols and tag matching.
fn protocol_knobs(c: &mut Config, get: &impl Fn(&str) -> Option<String>) -> Result<()> {
    if let Some(v) = get("TMPI_STATS") {
        c.stats = match v.trim() {
            "1" | "true" | "yes" | "on" => true,
            "0" | "false" | "no" | "off" | "" => false,
            _ => return Err(bad("TMPI_STATS", &v, "0 or 1")),
        };
    }
    if let Some(v) = get("TMPI_EAGER_LIMIT") {
        c.eager_limit = num("TMPI_EAGER_LIMIT", &v, 64, 16 << 20)? as usize;
    }
    if let Some(v) = get("TMPI_RNDV_THRESHOLD").filter(|v| !matches!(v.trim(), "auto" | "")) {
        c.rndv_threshold = Some(num("TMPI_RNDV_THRESHOLD", &v, 1, u64::from(u32::MAX))? as usize);
    }
    if let Some(v) = get("TMPI_UNEXPECTED_MAX") {
        c.unexpected_max = num("TMPI_UNEXPECTED_MAX", &v, 4096, 1 << 40)? as usize;
    }
    if let Some(v) = get("TMPI_TM_MAX_TAGS") {
        c.tm_max_tags = num("TMPI_TM_MAX_TAGS", &v, 0, 65535)? as u32;
    }
    if let Some(v) = get("TMPI_TM_THRESH") {
        c.tm_thresh = num("TMPI_TM_THRESH", &v, 0, u32::MAX as u64)? as usize;
    }
    Ok(())
}

/// The knobs of the shared-memory transport and of polling.
fn shm_knobs(c: &mut Config, get: &impl Fn(&str) -> Option<String>) -> Result<()> {
    if let Some(v) = get("TMPI_SHM_RING_SIZE").filter(|v| v.trim() != "auto") {
        let n = num("TMPI_SHM_RING_SIZE", &v, 4096, 1 << 30)?;
        if !n.is_power_of_two() {
            return Err(bad("TMPI_SHM_RING_SIZE", &v, "a power of two from 4096 to 1073741824"));
        }
        c.shm_ring_size = n as usize;
    }
    if let Some(v) = get("TMPI_SHM_PAIRS_MAX") {
        c.shm_pairs_max = num("TMPI_SHM_PAIRS_MAX", &v, 1, MAX_RANKS as u64)? as usize;
    }
    if let Some(v) = get(ENV_SHM_LIMIT) {
        c.shm_limit = parse_shm_limit(&v).map_err(|_| bad(ENV_SHM_LIMIT, &v, EXPECT_SHM_LIMIT))?;
    }
    if let Some(v) = get("TMPI_POLL_SPIN") {
        c.poll_spin = match v.trim() {
            "auto" | "" => None,
            _ => Some(num("TMPI_POLL_SPIN", &v, 0, 10_000_000)? as u32),
        };
    }
    Ok(())
}

/// The knobs of the MR cache and of single copy.
fn mr_cache_copy_knobs(c: &mut Config, get: &impl Fn(&str) -> Option<String>) -> Result<()> {
    // The MR cache settings have one parser, the cache's own (with libfabric's
    // FI_MR_CACHE_* names read when the TMPI_ ones are unset).
    let mr = CacheConfig::parse(get).map_err(|e| bad(e.var, &e.value, e.expected))?;
    c.mr_cache_max_count = mr.max_count;
    c.mr_cache_max_size = (mr.max_size != usize::MAX).then_some(mr.max_size);
    c.mr_cache_monitor_uffd = mr.monitor == Monitor::Userfaultfd;
    if let Some(v) = get("TMPI_SINGLE_COPY") {
        c.single_copy = match v.trim() {
            "cma" | "auto" | "" => true,
            "none" => false,
            _ => return Err(bad("TMPI_SINGLE_COPY", &v, "cma or none")),
        };
    }
    if let Some(v) = get("TMPI_SINGLE_COPY_MIN").filter(|v| !matches!(v.trim(), "auto" | "")) {
        c.single_copy_min = Some(num("TMPI_SINGLE_COPY_MIN", &v, 0, u64::MAX)? as usize);
    }
    Ok(())
}

/// The knobs that choose the fabric, the TCP interface and how libfabric is used.
fn fabric_knobs(c: &mut Config, get: &impl Fn(&str) -> Option<String>) -> Result<()> {
    if let Some(v) = get("TMPI_FABRIC") {
        c.fabric = FabricChoice::parse(&v).map_err(|_| bad("TMPI_FABRIC", &v, FABRICS))?;
        if c.fabric == FabricChoice::Ofi && !cfg!(feature = "ofi") {
            return Err(bad("TMPI_FABRIC", &v, NO_OFI));
        }
    }
    if let Some(v) = get("TMPI_TCP_IF").filter(|v| !matches!(v.trim(), "auto" | "")) {
        // Resolved now, so that a typo is reported at init naming the variable.
        tmpi_transport::tcp::iface::listen_ip(Some(&v), true)
            .map_err(|_| bad("TMPI_TCP_IF", &v, "an interface of this host (name or address)"))?;
        c.tcp_if = Some(v.trim().to_string());
    }
    if let Some(v) = get("TMPI_OFI_PROVIDER") {
        c.ofi_provider = tmpi_transport::bootstrap::parse_ofi_provider(&v).ok_or_else(|| {
            bad("TMPI_OFI_PROVIDER", &v, "a libfabric provider name as fi_info -l prints it (tcp, shm, tcp;ofi_rxm), or auto")
        })?;
    }
    if let Some(v) = get("TMPI_OFI_MATCHING") {
        c.ofi_matching = match v.trim() {
            "auto" | "" => None,
            "provider" => Some(OfiMatching::Provider),
            "software" => Some(OfiMatching::Software),
            _ => return Err(bad("TMPI_OFI_MATCHING", &v, "auto, provider or software")),
        };
    }
    if let Some(v) = get("TMPI_OFI_RNDV") {
        c.ofi_rndv = match v.trim() {
            "auto" | "" => None,
            "read" => Some(OfiRndv::Read),
            "stream" => Some(OfiRndv::Stream),
            _ => return Err(bad("TMPI_OFI_RNDV", &v, "auto, read or stream")),
        };
    }
    Ok(())
}

/// The knobs of the shared heap, peer liveness and shared-memory collectives.
fn heap_timeout_coll_knobs(c: &mut Config, get: &impl Fn(&str) -> Option<String>) -> Result<()> {
    if let Some(v) = get("TMPI_SHARED_HEAP") {
        let n = num("TMPI_SHARED_HEAP", &v, 0, 1 << 40)? as usize;
        c.shared_heap = if n == 0 { 0 } else { n.max(1 << 16) };
    }
    if let Some(v) = get(alive::ENV_PEER_TIMEOUT) {
        c.peer_timeout = alive::parse_peer_timeout(&v).ok_or_else(|| bad(alive::ENV_PEER_TIMEOUT, &v, alive::PEER_TIMEOUT_EXPECTED))?;
    }
    if let Some(v) = get("TMPI_SHM_COLL") {
        c.shm_coll = match v.trim() {
            "on" | "1" | "auto" | "" => true,
            "off" | "0" => false,
            _ => return Err(bad("TMPI_SHM_COLL", &v, "on or off")),
        };
    }
    Ok(())
}

/// Whether `v` turns a knob off.
fn is_off(v: &str) -> bool {
    matches!(v.trim(), "" | "0" | "off" | "no" | "false")
}

/// An existing directory named by `var`, or `None` when the knob is off.
fn dir_knob(var: &str, v: &str, expected: &str) -> Result<Option<PathBuf>> {
    if is_off(v) {
        return Ok(None);
    }
    let p = Path::new(v.trim());
    if !p.is_dir() {
        return Err(bad(var, v, expected));
    }
    Ok(Some(p.to_path_buf()))
}

/// The knobs of tracing, profiling and record/replay (see `crate::seen`).
fn seen_knobs(c: &mut Config, get: &impl Fn(&str) -> Option<String>) -> Result<()> {
    if let Some(v) = get("TMPI_TRACE").filter(|v| !is_off(v)) {
        let p = PathBuf::from(v.trim());
        let dir_ok = p.parent().is_none_or(|d| d.as_os_str().is_empty() || d.is_dir());
        if p.extension().and_then(|e| e.to_str()) != Some("json") || !dir_ok {
            return Err(bad("TMPI_TRACE", &v, "a path ending in .json in an existing directory, or off"));
        }
        c.trace = Some(p);
    }
    if let Some(v) = get("TMPI_TRACE_EVENTS") {
        c.trace_events = num("TMPI_TRACE_EVENTS", &v, 1024, 1 << 30)?;
    }
    if let Some(v) = get("TMPI_PROFILE") {
        c.profile = match v.trim() {
            "1" | "on" | "yes" | "true" => Some(PathBuf::from(".")),
            _ => dir_knob("TMPI_PROFILE", &v, "on, off or an existing directory")?,
        };
    }
    if let Some(v) = get("TMPI_RECORD") {
        c.record = dir_knob("TMPI_RECORD", &v, "an existing directory, or off")?;
    }
    if let Some(v) = get("TMPI_REPLAY") {
        c.replay = dir_knob("TMPI_REPLAY", &v, "a directory written by TMPI_RECORD, or off")?;
    }
    if c.record.is_some() && c.replay.is_some() {
        return Err(bad(
            "TMPI_REPLAY",
            &get("TMPI_REPLAY").unwrap_or_default(),
            "off while TMPI_RECORD is set (record or replay, not both)",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn parse(pairs: &[(&str, &str)]) -> Result<Config> {
        let m: HashMap<String, String> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        Config::from_lookup(|k| m.get(k).cloned())
    }

    /// Rings per pair up to `TMPI_SHM_PAIRS_MAX` ranks, sized by the rank count or the knob;
    /// the queued layout beyond.
    #[test]
    fn ring_sizes_by_job_size() {
        let auto = parse(&[]).unwrap();
        let small = parse(&[("TMPI_SHM_PAIRS_MAX", "8")]).unwrap();
        let fixed = parse(&[("TMPI_SHM_RING_SIZE", "65536"), ("TMPI_SHM_PAIRS_MAX", "1")]).unwrap();
        for (c, ranks, want) in [
            (&auto, 2, 4 << 20),
            (&auto, 4, 4 << 20),
            (&auto, 5, 1 << 20),
            (&auto, 8, 1 << 20),
            (&auto, 9, 256 << 10),
            (&auto, 32, 256 << 10),
            (&auto, 33, 64 << 10),
            (&auto, 64, 64 << 10),
            (&auto, 65, QUEUED),
            (&auto, 1024, QUEUED),
            (&small, 8, 1 << 20),
            (&small, 9, QUEUED),
            (&fixed, 1, 65536),
            (&fixed, 2, QUEUED),
        ] {
            assert_eq!(c.ring_size_for(ranks), want, "{ranks} ranks, pairs up to {}", c.shm_pairs_max);
        }
        assert_eq!(parse(&[("TMPI_SHM_LIMIT", "1m")]).unwrap().shm_limit, Some(1 << 20));
        assert_eq!(parse(&[("TMPI_SHM_LIMIT", "auto")]).unwrap().shm_limit, None);
        assert!(parse(&[("TMPI_SHM_PAIRS_MAX", "0")]).is_err());
    }

    #[test]
    fn defaults_and_values() {
        let c = parse(&[]).unwrap();
        assert_eq!(c.tm_max_tags, 1023);
        let c = parse(&[("TMPI_STATS", "1"), ("TMPI_SHM_RING_SIZE", "65536"), ("TMPI_POLL_SPIN", "10")]).unwrap();
        assert!(c.stats);
        assert_eq!(c.shm_ring_size, 65536);
        assert_eq!(c.poll_spin, Some(10));
    }

    #[test]
    fn auto_thresholds() {
        let c = parse(&[]).unwrap();
        assert_eq!((c.rndv_threshold, c.single_copy_min, c.rndv_ceiling()), (None, None, RNDV_AUTO));
        assert!(c.rndv_adaptive());
        let c = parse(&[("TMPI_RNDV_THRESHOLD", "auto"), ("TMPI_SINGLE_COPY_MIN", "auto")]).unwrap();
        assert!(c.rndv_adaptive());
        // Any fixed value, or single copy off, fixes where rendezvous starts.
        let c = parse(&[("TMPI_RNDV_THRESHOLD", "100000")]).unwrap();
        assert_eq!((c.rndv_ceiling(), c.rndv_adaptive()), (100_000, false));
        let c = parse(&[("TMPI_SINGLE_COPY_MIN", "0")]).unwrap();
        assert_eq!((c.single_copy_min, c.rndv_adaptive()), (Some(0), false));
        assert!(!parse(&[("TMPI_SINGLE_COPY", "none")]).unwrap().rndv_adaptive());
        for (k, v) in [("TMPI_RNDV_THRESHOLD", "0"), ("TMPI_RNDV_THRESHOLD", "lots"), ("TMPI_SINGLE_COPY_MIN", "-1")] {
            assert!(parse(&[(k, v)]).unwrap_err().to_string().contains(k));
        }
    }

    #[test]
    fn bad_values_name_the_variable() {
        for (k, v) in [
            ("TMPI_STATS", "maybe"),
            ("TMPI_SHM_RING_SIZE", "5000"),
            ("TMPI_TM_MAX_TAGS", "-1"),
            ("TMPI_EAGER_LIMIT", "1"),
            ("TMPI_MR_CACHE_MONITOR", "kernel"),
            ("TMPI_POLL_SPIN", "fast"),
            ("TMPI_SINGLE_COPY", "xpmem"),
        ] {
            let e = parse(&[(k, v)]).unwrap_err().to_string();
            assert!(e.contains(k), "{e}");
        }
    }

    /// The `TMPI_COLL_*` overrides: a name forces the algorithm, `auto` leaves the choice, and
    /// a bad value is refused naming the variable and every value it takes.
    #[test]
    fn coll_overrides() {
        use crate::coll::select::{Allreduce, Alltoall};
        let c = parse(&[("TMPI_COLL_ALLREDUCE", "ring"), ("TMPI_COLL_ALLTOALL", "auto"), ("TMPI_COLL_NODE_AWARE", "off")]).unwrap();
        assert_eq!((c.coll.allreduce, c.coll.alltoall, c.coll.node_aware), (Some(Allreduce::Ring), None::<Alltoall>, Some(false)));
        let Err(Error::Config { var, value, expected }) = parse(&[("TMPI_COLL_ALLREDUCE", "fast")]) else { panic!("fast accepted") };
        assert_eq!((var.as_str(), value.as_str()), ("TMPI_COLL_ALLREDUCE", "fast"));
        assert_eq!(expected, "auto, recursive_doubling, rabenseifner, ring, reduce_bcast");
        let e = parse(&[("TMPI_COLL_NODE_AWARE", "yes")]).unwrap_err().to_string();
        assert!(e.contains("TMPI_COLL_NODE_AWARE") && e.contains("auto, on, off"), "{e}");
    }

    /// `TMPI_OFI_RNDV`: auto (unset too), read or stream; anything else is refused naming
    /// the variable and the values it takes.
    #[test]
    fn ofi_rndv_values() {
        let table: &[(&str, Option<OfiRndv>)] =
            &[("auto", None), ("", None), ("read", Some(OfiRndv::Read)), (" stream ", Some(OfiRndv::Stream))];
        for &(v, want) in table {
            assert_eq!(parse(&[("TMPI_OFI_RNDV", v)]).unwrap().ofi_rndv, want, "{v:?}");
        }
        assert_eq!(parse(&[]).unwrap().ofi_rndv, None);
        let Err(Error::Config { var, value, expected }) = parse(&[("TMPI_OFI_RNDV", "rdma")]) else { panic!("rdma accepted") };
        assert_eq!((var.as_str(), value.as_str(), expected.as_str()), ("TMPI_OFI_RNDV", "rdma", "auto, read or stream"));
    }

    /// `TMPI_OFI_MATCHING`: auto (unset too), provider or software; anything else is refused
    /// naming the variable and the values it takes.
    #[test]
    fn ofi_matching_values() {
        let table: &[(&str, Option<OfiMatching>)] =
            &[("auto", None), ("", None), ("provider", Some(OfiMatching::Provider)), (" software ", Some(OfiMatching::Software))];
        for &(v, want) in table {
            assert_eq!(parse(&[("TMPI_OFI_MATCHING", v)]).unwrap().ofi_matching, want, "{v:?}");
        }
        assert_eq!(parse(&[]).unwrap().ofi_matching, None);
        let Err(Error::Config { var, value, expected }) = parse(&[("TMPI_OFI_MATCHING", "hardware")]) else { panic!("hardware accepted") };
        assert_eq!((var.as_str(), value.as_str(), expected.as_str()), ("TMPI_OFI_MATCHING", "hardware", "auto, provider or software"));
    }

    /// `TMPI_FABRIC=ofi`: taken by a build with the feature `ofi`, refused by one without,
    /// naming the variable and the feature.
    #[test]
    fn fabric_ofi_needs_the_feature() {
        let r = parse(&[("TMPI_FABRIC", "ofi"), ("TMPI_OFI_PROVIDER", "tcp")]);
        if cfg!(feature = "ofi") {
            let c = r.unwrap();
            assert_eq!((c.fabric, c.ofi_provider.as_deref()), (FabricChoice::Ofi, Some("tcp")));
        } else {
            let e = r.unwrap_err().to_string();
            assert!(e.contains("TMPI_FABRIC") && e.contains("cargo feature `ofi`"), "{e}");
        }
        let e = parse(&[("TMPI_FABRIC", "ib")]).unwrap_err().to_string();
        assert!(e.contains("TMPI_FABRIC") && e.contains("ofi"), "{e}");
    }

    /// Issue 12 item 11: one parser, one rule for the MR cache settings (the runtime used to
    /// refuse `512k`, which the cache's own parser accepted), and libfabric's names as
    /// aliases (issue 17 item 5).
    #[test]
    fn mr_cache_knobs_follow_the_cache_parser() {
        let c = parse(&[("TMPI_MR_CACHE_MAX_SIZE", "512k"), ("TMPI_MR_CACHE_MAX_COUNT", "16")]).unwrap();
        assert_eq!((c.mr_cache_max_size, c.mr_cache_max_count), (Some(512 << 10), 16));
        let c =
            parse(&[("FI_MR_CACHE_MAX_COUNT", "3"), ("FI_MR_CACHE_MONITOR", "disabled"), ("FI_MR_CACHE_MAX_SIZE", "unlimited")]).unwrap();
        assert_eq!((c.mr_cache_max_count, c.mr_cache_monitor_uffd, c.mr_cache_max_size), (3, false, None));
        let c = parse(&[("TMPI_MR_CACHE_MONITOR", "uffd"), ("FI_MR_CACHE_MONITOR", "disabled")]).unwrap();
        assert!(c.mr_cache_monitor_uffd);
        for (k, v) in [("TMPI_MR_CACHE_MAX_SIZE", "1x"), ("FI_MR_CACHE_MAX_COUNT", "x"), ("TMPI_MR_CACHE_MAX_COUNT", "2000000000")] {
            let Err(Error::Config { var, value, expected }) = parse(&[(k, v)]) else { panic!("{k}={v} accepted") };
            assert_eq!((var.as_str(), value.as_str()), (k, v));
            assert!(!expected.is_empty());
            // The same verdict from the cache's own parser.
            assert!(CacheConfig::parse(|n| (n == k).then(|| v.to_string())).is_err());
        }
        let d = parse(&[]).unwrap();
        let cd = CacheConfig::default();
        assert_eq!((d.mr_cache_max_count, d.mr_cache_max_size, d.mr_cache_monitor_uffd), (cd.max_count, None, true));
    }

    #[test]
    fn seeing_knobs() {
        let dir = std::env::temp_dir();
        let d = dir.to_str().unwrap();
        let json = dir.join("t.json");
        let c = parse(&[("TMPI_TRACE", json.to_str().unwrap()), ("TMPI_PROFILE", "on"), ("TMPI_RECORD", d), ("TMPI_TRACE_EVENTS", "4096")])
            .unwrap();
        assert_eq!(
            (c.trace.as_deref(), c.profile.as_deref(), c.record.as_deref()),
            (Some(json.as_path()), Some(Path::new(".")), Some(dir.as_path()))
        );
        assert_eq!(c.trace_events, 4096);
        let c = parse(&[("TMPI_TRACE", "off"), ("TMPI_PROFILE", "0"), ("TMPI_REPLAY", d)]).unwrap();
        assert_eq!((c.trace, c.profile, c.replay.as_deref()), (None, None, Some(dir.as_path())));
        assert!(parse(&[("TMPI_TRACE", "out.json")]).is_ok(), "a relative path in the current directory");
        for (k, v) in [
            ("TMPI_TRACE", "out.txt"),
            ("TMPI_TRACE", "/no/such/dir/out.json"),
            ("TMPI_TRACE_EVENTS", "10"),
            ("TMPI_PROFILE", "/no/such/dir"),
            ("TMPI_RECORD", "/no/such/dir"),
        ] {
            assert!(parse(&[(k, v)]).unwrap_err().to_string().contains(k), "{k}={v}");
        }
        assert!(parse(&[("TMPI_RECORD", d), ("TMPI_REPLAY", d)]).unwrap_err().to_string().contains("TMPI_REPLAY"));
    }

    #[test]
    fn every_knob_is_parsed_and_documented_once() {
        // A bad value of every documented knob is refused naming it: all are parsed here.
        for k in KNOBS.iter().filter(|k| !tmpi_transport::bootstrap::LAUNCHER_KNOBS.contains(&k.name)) {
            let e = parse(&[(k.name, "not-a-value")]).unwrap_err().to_string();
            assert!(e.contains(k.name), "{e}");
        }
        let mut names: Vec<_> = KNOBS.iter().map(|k| k.name).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), KNOBS.len());
    }
}
