//! Noticing a peer that went silent: a host that lost power or was cut off sends no FIN and no
//! RST, so without help its TCP connections stay open forever. `TMPI_PEER_TIMEOUT`
//! ([`ENV_PEER_TIMEOUT`]) bounds how long a peer may leave a connection unanswered.
//!
//! The test is the peer's *kernel*, never its process: a rank that computes for minutes without
//! calling tmpi, or is stopped in a debugger, still has a kernel that acknowledges data and
//! answers keepalive probes, so it is never taken for gone. Two mechanisms, one rule:
//!
//! - **Kernel keepalive** ([`set_keepalive`]) on every connection: after a third of the
//!   timeout without hearing from the peer, the kernel probes it every sixth, and drops the
//!   connection (`ETIMEDOUT`, or `EHOSTUNREACH` when the neighbour vanished) once it has not
//!   answered for about the whole timeout. This covers an idle connection, which is the common
//!   case of a rank waiting for a peer.
//! - **Silence while owed an answer** ([`silent_for`]): keepalive does not run while data is in
//!   flight, and the kernel's retransmissions would take 15 minutes to give up. So the TCP
//!   fabric asks the kernel (`TCP_INFO`) from its wait loop: a connection with unacknowledged
//!   data or unanswered probes whose last acknowledgement is older than the timeout is gone.
//!
//! `TCP_USER_TIMEOUT` is *not* set on fabric connections: since Linux 5.11 it also ends a
//! connection whose peer keeps its receive window closed that long, which is what a live rank
//! that computes without reading does to a sender. The bootstrap connections (a rank and
//! `tmpirun`) carry only small requests and replies that each side reads at once, so there it
//! is set as well ([`set_user_timeout`]) and the kernel alone decides.

use std::io;
use std::os::fd::RawFd;
use std::time::Duration;

use crate::error::{Error, Result};

/// `TMPI_PEER_TIMEOUT`: seconds a peer on another host may leave a connection unanswered
/// before it counts as gone; `0` turns the checks off.
pub const ENV_PEER_TIMEOUT: &str = "TMPI_PEER_TIMEOUT";

/// The default of [`ENV_PEER_TIMEOUT`].
pub const DEFAULT_PEER_TIMEOUT: Duration = Duration::from_secs(20);

/// Largest accepted [`ENV_PEER_TIMEOUT`] (one day).
pub const MAX_PEER_TIMEOUT_SECS: u64 = 86_400;

/// What [`ENV_PEER_TIMEOUT`] accepts, for error messages.
pub const PEER_TIMEOUT_EXPECTED: &str = "seconds from 1 to 86400, or 0 (off)";

/// Reads a `TMPI_PEER_TIMEOUT` value: `Some(None)` for `0` (off), `Some(Some(t))` for a
/// timeout, `None` when the value is not one ([`PEER_TIMEOUT_EXPECTED`]). Empty means the
/// default.
pub fn parse_peer_timeout(v: &str) -> Option<Option<Duration>> {
    let v = v.trim();
    if v.is_empty() {
        return Some(Some(DEFAULT_PEER_TIMEOUT));
    }
    match v.parse::<u64>() {
        Ok(0) => Some(None),
        Ok(s) if s <= MAX_PEER_TIMEOUT_SECS => Some(Some(Duration::from_secs(s))),
        _ => None,
    }
}

/// [`ENV_PEER_TIMEOUT`] from the environment (the default when unset).
///
/// # Errors
/// [`Error::InvalidArgument`] naming the variable for a value [`parse_peer_timeout`] refuses.
pub fn peer_timeout_from_env() -> Result<Option<Duration>> {
    match std::env::var(ENV_PEER_TIMEOUT) {
        Err(_) => Ok(Some(DEFAULT_PEER_TIMEOUT)),
        Ok(v) => parse_peer_timeout(&v)
            .ok_or_else(|| Error::InvalidArgument(format!("{ENV_PEER_TIMEOUT}={v:?}: expected {PEER_TIMEOUT_EXPECTED}"))),
    }
}

/// The kernel keepalive schedule for a timeout of `t`: (idle seconds before the first probe,
/// seconds between probes, probes) such that an unanswered peer is dropped about `t` after it
/// was last heard from (at most one interval later).
pub fn keepalive_schedule(t: Duration) -> (u32, u32, u32) {
    let s = t.as_secs().clamp(1, MAX_PEER_TIMEOUT_SECS) as u32;
    let idle = (s / 3).max(1);
    let intvl = (s / 6).max(1);
    let count = (s.saturating_sub(idle)).div_ceil(intvl).clamp(1, 127);
    (idle, intvl, count)
}

fn setsockopt_int(fd: RawFd, level: libc::c_int, name: libc::c_int, v: libc::c_int) -> io::Result<()> {
    // SAFETY: the option value is one live c_int whose size is passed; `fd` is a socket the
    // caller owns for the duration of the call.
    let rc =
        unsafe { libc::setsockopt(fd, level, name, std::ptr::addr_of!(v).cast(), std::mem::size_of::<libc::c_int>() as libc::socklen_t) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Turns kernel keepalive on for the TCP socket `fd` with [`keepalive_schedule`]`(t)`.
///
/// # Errors
/// A `setsockopt` fails (not a TCP socket).
pub fn set_keepalive(fd: RawFd, t: Duration) -> io::Result<()> {
    let (idle, intvl, count) = keepalive_schedule(t);
    setsockopt_int(fd, libc::SOL_SOCKET, libc::SO_KEEPALIVE, 1)?;
    setsockopt_int(fd, libc::IPPROTO_TCP, libc::TCP_KEEPIDLE, idle as libc::c_int)?;
    setsockopt_int(fd, libc::IPPROTO_TCP, libc::TCP_KEEPINTVL, intvl as libc::c_int)?;
    setsockopt_int(fd, libc::IPPROTO_TCP, libc::TCP_KEEPCNT, count as libc::c_int)
}

/// Sets `TCP_USER_TIMEOUT` on `fd` to `t`: the kernel drops the connection when data or
/// keepalive probes stay unacknowledged that long (only for connections whose peer always
/// reads: see the module documentation).
///
/// # Errors
/// The `setsockopt` fails.
pub fn set_user_timeout(fd: RawFd, t: Duration) -> io::Result<()> {
    let ms = t.as_millis().clamp(1, i32::MAX as u128) as libc::c_int;
    setsockopt_int(fd, libc::IPPROTO_TCP, libc::TCP_USER_TIMEOUT, ms)
}

/// What the kernel says about a connection's exchange with its peer (`TCP_INFO`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Exchange {
    /// Retransmission timeouts since the last acknowledgement (`tcpi_retransmits`).
    pub retransmits: u8,
    /// Keepalive or window probes sent and not answered (`tcpi_probes`).
    pub probes: u8,
    /// Segments sent and not acknowledged (`tcpi_unacked`).
    pub unacked: u32,
    /// Milliseconds since the last acknowledgement from the peer (`tcpi_last_ack_recv`).
    pub last_ack_ms: u32,
}

impl Exchange {
    /// Whether the peer owes an answer: data unacknowledged or probes unanswered.
    pub fn owed(&self) -> bool {
        self.unacked > 0 || self.probes > 0 || self.retransmits > 0
    }
}

/// Reads `TCP_INFO` of `fd`; `None` when the kernel does not give it (not a TCP socket).
pub fn exchange(fd: RawFd) -> Option<Exchange> {
    // The fields used are at fixed offsets of `struct tcp_info` since Linux 2.6: u8
    // retransmits at 2, u8 probes at 3, u32 unacked at 24, u32 last_ack_recv at 56.
    let mut buf = [0u8; 104];
    let mut len = buf.len() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `buf`, which outlives the call, and
    // stores the length written in `len`.
    let rc = unsafe { libc::getsockopt(fd, libc::IPPROTO_TCP, libc::TCP_INFO, buf.as_mut_ptr().cast(), &mut len) };
    if rc != 0 || (len as usize) < 60 {
        return None;
    }
    let u32_at = |o: usize| u32::from_ne_bytes([buf[o], buf[o + 1], buf[o + 2], buf[o + 3]]);
    Some(Exchange { retransmits: buf[2], probes: buf[3], unacked: u32_at(24), last_ack_ms: u32_at(56) })
}

/// Whether the peer of `fd` has left what it owes unanswered for at least `t`: data
/// unacknowledged, or keepalive or window probes unanswered, and no acknowledgement for `t`.
pub fn silent_for(fd: RawFd, t: Duration) -> bool {
    exchange(fd).is_some_and(|x| x.owed() && u128::from(x.last_ack_ms) >= t.as_millis())
}

/// Whether `e` says the peer's host stopped answering or cannot be reached (as opposed to a
/// connection the peer closed or reset).
pub fn is_unreachable(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ETIMEDOUT | libc::EHOSTUNREACH | libc::ENETUNREACH | libc::EHOSTDOWN | libc::ENETDOWN))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peer_timeout_values() {
        let cases: [(&str, Option<Option<u64>>); 9] = [
            ("", Some(Some(20))),
            ("20", Some(Some(20))),
            (" 3 ", Some(Some(3))),
            ("0", Some(None)),
            ("86400", Some(Some(86_400))),
            ("86401", None),
            ("-1", None),
            ("2.5", None),
            ("soon", None),
        ];
        for (v, want) in cases {
            assert_eq!(parse_peer_timeout(v), want.map(|o| o.map(Duration::from_secs)), "{v:?}");
        }
    }

    #[test]
    fn the_keepalive_schedule_drops_a_silent_peer_about_the_timeout_after_it_was_heard() {
        for s in [1u64, 2, 3, 4, 5, 7, 10, 20, 30, 60, 600, 86_400] {
            let (idle, intvl, count) = keepalive_schedule(Duration::from_secs(s));
            let drop_at = u64::from(idle) + u64::from(count) * u64::from(intvl);
            assert!(idle >= 1 && intvl >= 1 && (1..=127).contains(&count), "{s}: {idle} {intvl} {count}");
            // Never before the timeout (but for 1 s, where the kernel's 1 s grain rules), and
            // at most one interval after it.
            assert!(drop_at >= s.max(2) && drop_at <= s + u64::from(intvl).max(1), "{s}: dropped after {drop_at} s");
            assert!(u64::from(idle) <= s.div_ceil(3), "{s}: first probe after {idle} s");
        }
    }

    #[test]
    fn a_live_idle_connection_owes_nothing() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let a = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (b, _) = l.accept().unwrap();
        use std::os::fd::AsRawFd;
        set_keepalive(a.as_raw_fd(), Duration::from_secs(3)).unwrap();
        set_user_timeout(b.as_raw_fd(), Duration::from_secs(3)).unwrap();
        let x = exchange(a.as_raw_fd()).expect("TCP_INFO of a TCP socket");
        assert!(!x.owed(), "{x:?}");
        assert!(!silent_for(a.as_raw_fd(), Duration::ZERO));
        assert!(exchange(l.as_raw_fd()).is_some_and(|x| !x.owed()));
        let (u, _) = std::os::unix::net::UnixStream::pair().unwrap();
        assert!(exchange(u.as_raw_fd()).is_none(), "not TCP");
        assert!(is_unreachable(&io::Error::from_raw_os_error(libc::ETIMEDOUT)));
        assert!(!is_unreachable(&io::Error::from_raw_os_error(libc::ECONNRESET)));
    }
}
