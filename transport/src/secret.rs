//! The per-job secret: what proves that a connection comes from a rank of the job.
//!
//! `tmpirun` draws 128 random bits per job ([`JobSecret::new`], from `getrandom`) and puts
//! them, as 32 lowercase hex digits, in each rank's environment ([`ENV_JOB_SECRET`]). The
//! secret itself is never sent: a rank proves it in its `hello` to the bootstrap service, and
//! each side of a TCP fabric connection proves it to the other, by an HMAC over a fresh
//! challenge ([`crate::auth`], checked in constant time before anything else the
//! connection says is trusted). This module makes, encodes and compares it.

use std::fmt;
use std::io;

use crate::error::{Error, Result};

/// `TMPI_JOB_SECRET`: the job's secret, 32 lowercase hex digits.
pub const ENV_JOB_SECRET: &str = "TMPI_JOB_SECRET";

/// Bytes of a secret (128 bits).
pub const SECRET_LEN: usize = 16;

/// A job's secret. Its `Debug` output does not show the bytes.
#[derive(Clone, PartialEq, Eq)]
pub struct JobSecret([u8; SECRET_LEN]);

impl fmt::Debug for JobSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("JobSecret(..)")
    }
}

impl JobSecret {
    /// A new random secret.
    ///
    /// # Errors
    /// The system's random source fails.
    pub fn new() -> Result<Self> {
        let mut b = [0u8; SECRET_LEN];
        getrandom::getrandom(&mut b)
            .map_err(|e| Error::Io { op: "getrandom (job secret)".into(), source: io::Error::other(e.to_string()) })?;
        Ok(JobSecret(b))
    }

    /// A secret with these bytes (tests).
    pub fn from_bytes(b: [u8; SECRET_LEN]) -> Self {
        JobSecret(b)
    }

    /// The raw bytes (the HMAC key of [`crate::auth`]).
    pub fn as_bytes(&self) -> &[u8; SECRET_LEN] {
        &self.0
    }

    /// The text form put in [`ENV_JOB_SECRET`]: 32 lowercase hex digits.
    pub fn to_hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// Parses the text form.
    ///
    /// # Errors
    /// [`Error::Bootstrap`] naming [`ENV_JOB_SECRET`] unless `s` is exactly 32 hex digits.
    pub fn from_hex(s: &str) -> Result<Self> {
        let bad = || Error::Bootstrap(format!("{ENV_JOB_SECRET}: expected {} hex digits", 2 * SECRET_LEN));
        if s.len() != 2 * SECRET_LEN || !s.is_ascii() {
            return Err(bad());
        }
        let mut b = [0u8; SECRET_LEN];
        for (i, out) in b.iter_mut().enumerate() {
            *out = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).map_err(|_| bad())?;
        }
        Ok(JobSecret(b))
    }

    /// Whether `presented` is this secret. Takes the same time whatever the bytes (no early
    /// exit on the first difference), so a stranger learns nothing from timing.
    pub fn matches(&self, presented: &[u8]) -> bool {
        if presented.len() != SECRET_LEN {
            return false;
        }
        let mut diff = 0u8;
        for (a, b) in self.0.iter().zip(presented) {
            diff |= a ^ b;
        }
        // black_box: keep the compiler from turning the fold into an early-exit compare.
        std::hint::black_box(diff) == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_roundtrip_and_compare() {
        let s = JobSecret::new().unwrap();
        let h = s.to_hex();
        assert_eq!(h.len(), 32);
        assert!(h.bytes().all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()));
        let back = JobSecret::from_hex(&h).unwrap();
        assert_eq!(back, s);
        assert!(s.matches(back.as_bytes()));
        let mut wrong = *s.as_bytes();
        wrong[15] ^= 1;
        assert!(!s.matches(&wrong));
        assert!(!s.matches(&s.as_bytes()[..15]));
        assert!(!s.matches(&[]));
        assert_ne!(JobSecret::new().unwrap(), s, "two draws of 128 bits collided");
        assert_eq!(format!("{s:?}"), "JobSecret(..)");
    }

    #[test]
    fn bad_text_is_refused() {
        for t in ["", "00", &"g".repeat(32), &"0".repeat(31), &"0".repeat(33), &"é".repeat(16)] {
            assert!(JobSecret::from_hex(t).is_err(), "{t:?}");
        }
    }
}
