//! The one error type of the launcher.

use std::io;

/// Result alias of the launcher.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Why `tmpirun` could not run a job (a failing rank is not an error: it is the job's status).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The command line asks for something impossible (bad `-x`, too many ranks without
    /// `--oversubscribe`, a program that does not exist). Exit status 2.
    #[error("{0}")]
    Usage(String),
    /// A system call failed while setting up or running the job. Exit status 1.
    #[error("{op}: {source}")]
    Io {
        /// What was being done.
        op: String,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// The topology could not be discovered or a binding could not be applied.
    #[error("binding: {0}")]
    #[cfg_attr(not(feature = "hwloc"), allow(dead_code))]
    Binding(String),
    /// The bootstrap service failed.
    #[error(transparent)]
    Transport(#[from] tmpi_transport::Error),
}

impl Error {
    /// Wraps the current `errno` with the name of the failed operation.
    #[cold]
    pub fn last_os(op: impl Into<String>) -> Self {
        Error::Io { op: op.into(), source: io::Error::last_os_error() }
    }

    /// Wraps an I/O error with the name of the failed operation.
    #[cold]
    pub fn io(op: impl Into<String>, source: io::Error) -> Self {
        Error::Io { op: op.into(), source }
    }

    /// The exit status `tmpirun` ends with when this error stops it.
    pub fn exit_code(&self) -> i32 {
        match self {
            Error::Usage(_) => 2,
            _ => 1,
        }
    }
}
