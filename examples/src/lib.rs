//! Small SPMD programs, one per tmpi feature; each is a binary in `src/bin/`.
//!
//! Run them with the launcher, e.g. `tmpirun -n 3 target/debug/ring`; started alone, a
//! program is rank 0 of 1. Every example checks its own result and exits non-zero when it
//! is wrong, and (except `hello`) prints only from rank 0 and only text that does not
//! depend on timing, so outputs of different runtime configurations can be compared.
//!
//! This library holds the one helper they share: [`check`].

use std::fmt;

/// The error an example returns when its computed result is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WrongResult(pub String);

impl fmt::Display for WrongResult {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "wrong result: {}", self.0)
    }
}

impl std::error::Error for WrongResult {}

/// `Ok(())` when `ok`, otherwise a [`WrongResult`] carrying the message `what` builds.
///
/// ```
/// assert!(tmpi_examples::check(1 + 1 == 2, || "arithmetic".into()).is_ok());
/// let e = tmpi_examples::check(false, || "token was 3, expected 4".into()).unwrap_err();
/// assert_eq!(e.to_string(), "wrong result: token was 3, expected 4");
/// ```
///
/// # Errors
/// [`WrongResult`] when `ok` is false.
pub fn check(ok: bool, what: impl FnOnce() -> String) -> Result<(), WrongResult> {
    if ok {
        Ok(())
    } else {
        Err(WrongResult(what()))
    }
}
