//! The one error type of tmpi-compare.

use std::path::PathBuf;

/// Everything that can stop a comparison or spoil one measurement.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A file or process operation failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The underlying error.
        source: std::io::Error,
    },
    /// A benchmark program's output could not be understood.
    #[error("unexpected output: {0}")]
    Parse(String),
    /// A program ran but failed or was stopped after its time limit.
    #[error("{0}")]
    Run(String),
    /// A required program (tmpi's release binaries, a compiler) is missing.
    #[error("{} not found: {hint}", path.display())]
    Missing {
        /// What was looked for.
        path: PathBuf,
        /// How to get it.
        hint: String,
    },
    /// A plot could not be drawn.
    #[error("plot {0}")]
    Plot(String),
    /// Bad command-line values.
    #[error("{0}")]
    Usage(String),
}

impl Error {
    /// An [`Error::Io`] with a description of what was being done.
    pub fn io(what: impl Into<String>, source: std::io::Error) -> Self {
        Error::Io { what: what.into(), source }
    }
}
