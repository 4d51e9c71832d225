//! Proving the job secret on a connection, before anything else is read from it: the one
//! scheme both the TCP fabric ([`Purpose::Fabric`]) and the bootstrap service
//! ([`Purpose::Bootstrap`], over its Unix socket and over TCP) use.
//!
//! The secret itself never crosses the network: each side proves it knows the secret by an
//! HMAC-SHA256 over a fresh random challenge from the other side (so a recorded exchange cannot
//! be replayed), bound to the ranks, the job size and the purpose (an answer made for one
//! channel is worth nothing on the other):
//!
//! ```text
//! acceptor  -> connector: magic (8) | nonce_a (16)                                    24 bytes
//! connector -> acceptor:  rank u32le | size u32le | nonce_c (16) | mac_c (32)         56 bytes
//!     mac_c = HMAC(secret, connect_label | nonce_a | rank | size)
//! acceptor  -> connector: mac_a (32)
//!     mac_a = HMAC(secret, accept_label | nonce_c | acceptor's rank | size)
//! ```
//!
//! The acceptor reads exactly 56 bytes (with a deadline) and checks the MAC before it trusts
//! the rank named; a connection that fails is closed and counted. The connector checks the
//! acceptor's answer the same way, so neither side talks to an impostor. The bootstrap
//! service carries the answer inside its `hello` frame and the proof inside its reply
//! (see [`crate::bootstrap::proto`]); the fabric sends them bare.

use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::secret::JobSecret;

/// What a proof is for: the labels and magic that keep the two channels apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Purpose {
    /// A connection of the TCP fabric between two ranks.
    Fabric,
    /// A rank's connection to the bootstrap service of `tmpirun`.
    Bootstrap,
}

impl Purpose {
    /// First bytes of the acceptor's challenge.
    pub fn magic(self) -> &'static [u8; 8] {
        match self {
            Purpose::Fabric => b"TMPITCP1",
            Purpose::Bootstrap => b"TMPIBST3",
        }
    }

    fn labels(self) -> (&'static [u8], &'static [u8]) {
        match self {
            Purpose::Fabric => (b"tmpi-tcp-connect", b"tmpi-tcp-accept"),
            Purpose::Bootstrap => (b"tmpi-bootstrap-connect", b"tmpi-bootstrap-accept"),
        }
    }
}

/// Rank the bootstrap service proves itself as (it is no rank).
pub const SERVICE_RANK: u32 = u32::MAX;
/// Bytes of a nonce.
pub const NONCE_LEN: usize = 16;
/// Bytes of a MAC.
pub const MAC_LEN: usize = 32;
/// Bytes of the acceptor's challenge.
pub const CHALLENGE_LEN: usize = 8 + NONCE_LEN;
/// Bytes of the connector's answer.
pub const ANSWER_LEN: usize = 8 + NONCE_LEN + MAC_LEN;

type HmacSha256 = Hmac<Sha256>;

fn keyed(secret: &JobSecret, label: &[u8], nonce: &[u8; NONCE_LEN], rank: u32, size: u32) -> HmacSha256 {
    // HMAC accepts keys of any length: `new_from_slice` cannot fail for it.
    let mut m = <HmacSha256 as Mac>::new_from_slice(secret.as_bytes()).unwrap_or_else(|_| unreachable!("HMAC takes any key length"));
    m.update(label);
    m.update(nonce);
    m.update(&rank.to_le_bytes());
    m.update(&size.to_le_bytes());
    m
}

/// A fresh random nonce.
///
/// # Errors
/// The system's random source fails.
pub fn nonce() -> crate::Result<[u8; NONCE_LEN]> {
    let mut n = [0u8; NONCE_LEN];
    getrandom::getrandom(&mut n)
        .map_err(|e| crate::Error::Io { op: "getrandom (TCP challenge)".into(), source: std::io::Error::other(e.to_string()) })?;
    Ok(n)
}

/// The acceptor's challenge.
pub fn challenge(p: Purpose, nonce_a: &[u8; NONCE_LEN]) -> [u8; CHALLENGE_LEN] {
    let mut b = [0u8; CHALLENGE_LEN];
    b[..8].copy_from_slice(p.magic());
    b[8..].copy_from_slice(nonce_a);
    b
}

/// The connector's answer to `challenge`, or `None` if the challenge is not one.
pub fn answer(
    p: Purpose,
    secret: &JobSecret,
    challenge: &[u8; CHALLENGE_LEN],
    rank: u32,
    size: u32,
    nonce_c: &[u8; NONCE_LEN],
) -> Option<[u8; ANSWER_LEN]> {
    if &challenge[..8] != p.magic() {
        return None;
    }
    let nonce_a: &[u8; NONCE_LEN] = challenge[8..].try_into().ok()?;
    let tag = keyed(secret, p.labels().0, nonce_a, rank, size).finalize().into_bytes();
    let mut b = [0u8; ANSWER_LEN];
    b[..4].copy_from_slice(&rank.to_le_bytes());
    b[4..8].copy_from_slice(&size.to_le_bytes());
    b[8..8 + NONCE_LEN].copy_from_slice(nonce_c);
    b[8 + NONCE_LEN..].copy_from_slice(&tag);
    Some(b)
}

/// Checks a connector's answer to the challenge with `nonce_a`: the rank it proved, and its
/// nonce, or `None` when the MAC (or the job size) is wrong. Constant time in the MAC.
pub fn check_answer(
    p: Purpose,
    secret: &JobSecret,
    nonce_a: &[u8; NONCE_LEN],
    size: u32,
    ans: &[u8; ANSWER_LEN],
) -> Option<(u32, [u8; NONCE_LEN])> {
    let (rank, their_size, nonce_c) = verify_answer(p, secret, nonce_a, ans)?;
    (their_size == size).then_some((rank, nonce_c))
}

/// Checks a connector's answer to the challenge with `nonce_a` whatever job size it names:
/// the rank and size it proved, and its nonce, or `None` when the MAC is wrong (constant
/// time in the MAC). The caller compares the size itself (to say what is wrong).
pub fn verify_answer(
    p: Purpose,
    secret: &JobSecret,
    nonce_a: &[u8; NONCE_LEN],
    ans: &[u8; ANSWER_LEN],
) -> Option<(u32, u32, [u8; NONCE_LEN])> {
    let rank = u32::from_le_bytes([ans[0], ans[1], ans[2], ans[3]]);
    let their_size = u32::from_le_bytes([ans[4], ans[5], ans[6], ans[7]]);
    let nonce_c: [u8; NONCE_LEN] = ans[8..8 + NONCE_LEN].try_into().ok()?;
    let ok = keyed(secret, p.labels().0, nonce_a, rank, their_size).verify_slice(&ans[8 + NONCE_LEN..]).is_ok();
    ok.then_some((rank, their_size, nonce_c))
}

/// The acceptor's proof, answering the connector's nonce.
pub fn accept_proof(p: Purpose, secret: &JobSecret, nonce_c: &[u8; NONCE_LEN], acceptor: u32, size: u32) -> [u8; MAC_LEN] {
    keyed(secret, p.labels().1, nonce_c, acceptor, size).finalize().into_bytes().into()
}

/// Checks the acceptor's proof (constant time).
pub fn check_accept(p: Purpose, secret: &JobSecret, nonce_c: &[u8; NONCE_LEN], acceptor: u32, size: u32, proof: &[u8; MAC_LEN]) -> bool {
    keyed(secret, p.labels().1, nonce_c, acceptor, size).verify_slice(proof).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exchange_proves_and_refuses() {
        for p in [Purpose::Fabric, Purpose::Bootstrap] {
            let s = JobSecret::new().unwrap();
            let other = JobSecret::new().unwrap();
            let na = nonce().unwrap();
            let nc = nonce().unwrap();
            let ch = challenge(p, &na);
            let ans = answer(p, &s, &ch, 3, 4, &nc).unwrap();
            assert_eq!(check_answer(p, &s, &na, 4, &ans), Some((3, nc)));
            // Wrong secret, wrong size, another challenge, a flipped bit: refused.
            assert_eq!(check_answer(p, &other, &na, 4, &ans), None);
            assert_eq!(check_answer(p, &s, &na, 5, &ans), None);
            assert_eq!(check_answer(p, &s, &nonce().unwrap(), 4, &ans), None);
            let mut bad = ans;
            bad[0] ^= 1; // claims another rank
            assert_eq!(check_answer(p, &s, &na, 4, &bad), None);
            let forged = answer(p, &other, &ch, 3, 4, &nc).unwrap();
            assert_eq!(check_answer(p, &s, &na, 4, &forged), None);
            let mut not_magic = ch;
            not_magic[0] = b'X';
            assert!(answer(p, &s, &not_magic, 3, 4, &nc).is_none());
            let pr = accept_proof(p, &s, &nc, 1, 4);
            assert!(check_accept(p, &s, &nc, 1, 4, &pr));
            assert!(!check_accept(p, &s, &nc, 2, 4, &pr));
            assert!(!check_accept(p, &other, &nc, 1, 4, &pr));
        }
    }

    #[test]
    fn a_proof_for_one_purpose_is_worth_nothing_for_the_other() {
        let s = JobSecret::new().unwrap();
        let (na, nc) = (nonce().unwrap(), nonce().unwrap());
        // The challenges differ, and an answer to the fabric's is no answer to the service's.
        assert!(answer(Purpose::Bootstrap, &s, &challenge(Purpose::Fabric, &na), 0, 2, &nc).is_none());
        let ans = answer(Purpose::Fabric, &s, &challenge(Purpose::Fabric, &na), 0, 2, &nc).unwrap();
        assert_eq!(check_answer(Purpose::Bootstrap, &s, &na, 2, &ans), None);
        let pr = accept_proof(Purpose::Bootstrap, &s, &nc, 1, 2);
        assert!(!check_accept(Purpose::Fabric, &s, &nc, 1, 2, &pr));
    }
}
