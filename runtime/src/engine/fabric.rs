//! The fabric under one engine is `tmpi_transport::fabric::AnyFabric` (shared memory, TCP,
//! both, channels between threads, or nothing for a job of one rank), driven through the
//! `tmpi_transport::fabric::Fabric` trait; this file adds what only the runtime can judge:
//! whether a peer's process on this host still runs.

pub(crate) use tmpi_transport::fabric::{AnyFabric, Fabric, PeerCaps, Wakeup};

/// Liveness of peers' processes, beyond what the fabric records.
pub(crate) trait ProcessAlive {
    /// Whether `rank`'s process still runs (a system call or two: used sparingly). Peers on
    /// other hosts and threads of this process count as running: their fabric reports their
    /// end ([`Fabric::peer_state`]).
    fn process_alive(&self, rank: usize) -> bool;
}

impl ProcessAlive for AnyFabric {
    fn process_alive(&self, rank: usize) -> bool {
        let pid = self.peer_pid(rank);
        pid == std::process::id() || crate::sys::pid_alive(pid)
    }
}
