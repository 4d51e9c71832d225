//! Proving the job secret on a TCP connection, before anything else is read from it.
//!
//! The secret itself never crosses the network: each side proves it knows the secret by an
//! HMAC-SHA256 over a fresh random challenge from the other side (so a recorded exchange cannot
//! be replayed), bound to the ranks and the job size:
//!
//! ```text
//! acceptor  -> connector: "TMPITCP1" | nonce_a (16)                                   24 bytes
//! connector -> acceptor:  rank u32le | size u32le | nonce_c (16) | mac_c (32)         56 bytes
//!     mac_c = HMAC(secret, "tmpi-tcp-connect" | nonce_a | rank | size)
//! acceptor  -> connector: mac_a (32)
//!     mac_a = HMAC(secret, "tmpi-tcp-accept" | nonce_c | acceptor's rank | size)
//! ```
//!
//! The acceptor reads exactly 56 bytes (with a deadline) and checks the MAC before it trusts
//! the rank named; a connection that fails is closed and counted. The connector checks the
//! acceptor's answer the same way, so neither side talks to an impostor.

use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::bootstrap::JobSecret;

/// First bytes of the acceptor's challenge.
pub const MAGIC: &[u8; 8] = b"TMPITCP1";
/// Bytes of a nonce.
pub const NONCE_LEN: usize = 16;
/// Bytes of a MAC.
pub const MAC_LEN: usize = 32;
/// Bytes of the acceptor's challenge.
pub const CHALLENGE_LEN: usize = MAGIC.len() + NONCE_LEN;
/// Bytes of the connector's answer.
pub const ANSWER_LEN: usize = 8 + NONCE_LEN + MAC_LEN;

const CONNECT_LABEL: &[u8] = b"tmpi-tcp-connect";
const ACCEPT_LABEL: &[u8] = b"tmpi-tcp-accept";

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
pub fn challenge(nonce_a: &[u8; NONCE_LEN]) -> [u8; CHALLENGE_LEN] {
    let mut b = [0u8; CHALLENGE_LEN];
    b[..8].copy_from_slice(MAGIC);
    b[8..].copy_from_slice(nonce_a);
    b
}

/// The connector's answer to `challenge`, or `None` if the challenge is not one.
pub fn answer(
    secret: &JobSecret,
    challenge: &[u8; CHALLENGE_LEN],
    rank: u32,
    size: u32,
    nonce_c: &[u8; NONCE_LEN],
) -> Option<[u8; ANSWER_LEN]> {
    if &challenge[..8] != MAGIC {
        return None;
    }
    let nonce_a: &[u8; NONCE_LEN] = challenge[8..].try_into().ok()?;
    let tag = keyed(secret, CONNECT_LABEL, nonce_a, rank, size).finalize().into_bytes();
    let mut b = [0u8; ANSWER_LEN];
    b[..4].copy_from_slice(&rank.to_le_bytes());
    b[4..8].copy_from_slice(&size.to_le_bytes());
    b[8..8 + NONCE_LEN].copy_from_slice(nonce_c);
    b[8 + NONCE_LEN..].copy_from_slice(&tag);
    Some(b)
}

/// Checks a connector's answer to the challenge with `nonce_a`: the rank it proved, and its
/// nonce, or `None` when the MAC (or the job size) is wrong. Constant time in the MAC.
pub fn check_answer(secret: &JobSecret, nonce_a: &[u8; NONCE_LEN], size: u32, ans: &[u8; ANSWER_LEN]) -> Option<(u32, [u8; NONCE_LEN])> {
    let rank = u32::from_le_bytes([ans[0], ans[1], ans[2], ans[3]]);
    let their_size = u32::from_le_bytes([ans[4], ans[5], ans[6], ans[7]]);
    let nonce_c: [u8; NONCE_LEN] = ans[8..8 + NONCE_LEN].try_into().ok()?;
    let ok = keyed(secret, CONNECT_LABEL, nonce_a, rank, their_size).verify_slice(&ans[8 + NONCE_LEN..]).is_ok();
    (ok && their_size == size).then_some((rank, nonce_c))
}

/// The acceptor's proof, answering the connector's nonce.
pub fn accept_proof(secret: &JobSecret, nonce_c: &[u8; NONCE_LEN], acceptor: u32, size: u32) -> [u8; MAC_LEN] {
    keyed(secret, ACCEPT_LABEL, nonce_c, acceptor, size).finalize().into_bytes().into()
}

/// Checks the acceptor's proof (constant time).
pub fn check_accept(secret: &JobSecret, nonce_c: &[u8; NONCE_LEN], acceptor: u32, size: u32, proof: &[u8; MAC_LEN]) -> bool {
    keyed(secret, ACCEPT_LABEL, nonce_c, acceptor, size).verify_slice(proof).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exchange_proves_and_refuses() {
        let s = JobSecret::new().unwrap();
        let other = JobSecret::new().unwrap();
        let na = nonce().unwrap();
        let nc = nonce().unwrap();
        let ch = challenge(&na);
        let ans = answer(&s, &ch, 3, 4, &nc).unwrap();
        assert_eq!(check_answer(&s, &na, 4, &ans), Some((3, nc)));
        // Wrong secret, wrong size, another challenge, a flipped bit: refused.
        assert_eq!(check_answer(&other, &na, 4, &ans), None);
        assert_eq!(check_answer(&s, &na, 5, &ans), None);
        assert_eq!(check_answer(&s, &nonce().unwrap(), 4, &ans), None);
        let mut bad = ans;
        bad[0] ^= 1; // claims another rank
        assert_eq!(check_answer(&s, &na, 4, &bad), None);
        let forged = answer(&other, &ch, 3, 4, &nc).unwrap();
        assert_eq!(check_answer(&s, &na, 4, &forged), None);
        let mut not_magic = ch;
        not_magic[0] = b'X';
        assert!(answer(&s, &not_magic, 3, 4, &nc).is_none());
        let p = accept_proof(&s, &nc, 1, 4);
        assert!(check_accept(&s, &nc, 1, 4, &p));
        assert!(!check_accept(&s, &nc, 2, 4, &p));
        assert!(!check_accept(&other, &nc, 1, 4, &p));
    }
}
