//! # tmpi-trace: seeing what a tmpi job did, and making it happen again
//!
//! The pieces of `tmpirun --trace`, `--profile`, `--record` and `--replay` that need neither
//! the runtime nor the launcher, so both can use them:
//!
//! - [`event`]: the fixed-size binary record of one call, message or note (48 bytes), and the
//!   kinds of events;
//! - [`ring`]: a rank's trace file, a ring of records mapped into the rank's memory (bounded,
//!   the oldest dropped and counted when full, readable after the rank died);
//! - [`clock`]: the clocks events are stamped with and how ranks of other hosts are aligned
//!   (NTP-style samples against `tmpirun`, the shortest round trip kept);
//! - [`merge`]: the ranks' files as one Chrome trace-event / Perfetto JSON file (a process per
//!   rank, a track per thread, a complete event per call, a flow from each send to the receive
//!   that matched it);
//! - [`check`]: a checker of such files against the rules of Perfetto's JSON importer;
//! - [`profile`]: a rank's communication profile (time and calls per call kind, messages and
//!   bytes per destination, the longest waits), its text form, and the job's report;
//! - [`record`]: a rank's record of nondeterministic decisions (which message a wildcard
//!   receive matched, what a test answered), for deterministic replay;
//! - [`plot`]: the traffic matrix as an SVG heat map and a timeline picture of a trace.
//!
//! ```
//! use tmpi_trace::event::{Event, Kind};
//! use tmpi_trace::ring::{RankFile, RankInfo, RankTrace};
//!
//! let path = std::env::temp_dir().join(format!("doc-{}.tmpitrace", std::process::id()));
//! let info = RankInfo { rank: 0, size: 1, ..Default::default() };
//! let mut file = RankFile::create(&path, &info, 1024)?;
//! file.push(&Event { t0: 1_000, dur: 500, kind: Kind::Barrier.code(), ..Default::default() });
//! file.seal(&[(0, "main".into())], 2_000)?;
//! let trace = RankTrace::read(&path)?;
//! let (json, summary) = tmpi_trace::merge::merge(&[trace], &tmpi_trace::merge::Options { size: 1, ..Default::default() });
//! let checked = tmpi_trace::check::check(&json).expect("a valid trace");
//! assert_eq!((summary.events, checked.spans["barrier"]), (1, 1));
//! # std::fs::remove_file(&path)?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#[cfg(feature = "tools")]
pub mod check;
pub mod clock;
pub mod event;
pub mod merge;
#[cfg(feature = "tools")]
pub mod plot;
pub mod profile;
pub mod record;
pub mod ring;

/// What can go wrong reading and writing traces, profiles and records.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A file could not be created, read, written or mapped.
    #[error("{0}: {1}")]
    Io(String, #[source] std::io::Error),
    /// A file or text is not what it should be (names the file and what is wrong).
    #[error("{0}")]
    Format(String),
    /// A picture could not be drawn.
    #[error("plot: {0}")]
    Plot(String),
}

/// This crate's result.
pub type Result<T, E = Error> = std::result::Result<T, E>;
