//! The fi_mr memory-registration model (placeholder; being built).

/// Fabric errno values returned by the fi_mr calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum MrErrno {
    /// -FI_EINVAL.
    #[error("FI_EINVAL: invalid argument")]
    Inval,
}
