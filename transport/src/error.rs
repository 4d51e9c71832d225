//! The one error type of the transport crate.

use std::io;

/// Result alias of the transport crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong below the runtime.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Bytes from the wire that do not form a valid header or message.
    #[error("malformed message: {what}")]
    Malformed {
        /// What was wrong with it.
        what: &'static str,
    },
    /// A system call failed.
    #[error("{op}: {source}")]
    Io {
        /// The operation that failed, e.g. "mmap /dev/shm/tmpi-…".
        op: String,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// The shared-memory segment is not what this build expects (magic, version, layout).
    #[error("shared-memory segment {name}: {what}")]
    ShmLayout {
        /// Segment name.
        name: String,
        /// What did not match.
        what: String,
    },
    /// The bootstrap service refused a request or spoke an unexpected protocol.
    #[error("bootstrap: {0}")]
    Bootstrap(String),
    /// A peer process or thread is gone (its end of the fabric closed or the process died).
    #[error("peer rank {rank} is gone")]
    PeerGone {
        /// The rank that disappeared.
        rank: usize,
    },
    /// A TM-SRQ verb failed with an errno-like code (see [`crate::tm`]).
    #[error("TM-SRQ: {0}")]
    Tm(#[from] crate::tm::TmErrno),
    /// An fi_mr call failed with a fabric errno (see [`crate::mr`]).
    #[error("fi_mr: {0}")]
    Mr(#[from] crate::mr::MrErrno),
    /// A peer broke the fabric's framing (a malformed frame on its connection).
    #[error("peer rank {rank}: {what}")]
    PeerProtocol {
        /// The rank whose bytes were malformed.
        rank: usize,
        /// What was wrong.
        what: &'static str,
    },
    /// The fabric could not be set up (connections between ranks, `TMPI_FABRIC` choices).
    #[error("fabric: {0}")]
    Fabric(String),
    /// A libfabric call failed (the `ofi` feature): the `fi_*` call, libfabric's error number
    /// (positive `FI_E*`) and its `fi_strerror` text. `-FI_EAGAIN` is never reported this way:
    /// it is back-pressure, which the OFI calls return as a value.
    #[error("{call}: {text} (fi_errno {code})")]
    Ofi {
        /// The libfabric call, e.g. `fi_tsend`.
        call: &'static str,
        /// The positive `FI_E*` error number.
        code: i32,
        /// `fi_strerror(code)`.
        text: String,
    },
    /// An argument was outside what the call accepts.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
}

impl Error {
    /// Wraps the current `errno` with the name of the failed operation.
    #[cold]
    pub fn last_os(op: impl Into<String>) -> Self {
        Error::Io { op: op.into(), source: io::Error::last_os_error() }
    }
}
