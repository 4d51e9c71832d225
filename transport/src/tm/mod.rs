//! The soft TM-SRQ: a sans-IO model of RDMA hardware tag matching (placeholder; being built).

/// Errno-like failures of the TM-SRQ verbs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TmErrno {
    /// ENOMEM: the tag list or the outstanding-ops budget is full.
    #[error("ENOMEM: tag list or op queue full")]
    NoMem,
    /// EINVAL: an argument the verb does not accept.
    #[error("EINVAL: invalid argument")]
    Inval,
}
