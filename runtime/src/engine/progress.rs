//! Progress and waiting: one round of progress drives every queue and the fabric; waits spin,
//! then yield, then sleep ([`Backoff`]), and look at the peers' liveness in the slow phase.
//! On shared memory the sleep is on the rank's doorbell ([`Engine::idle`]): a peer that writes
//! to the rank wakes it at once, so a sleeping rank costs no latency and no CPU.
//!
//! With TCP peers, the spin is short and the sleep is in `ppoll(2)` on the rank's sockets
//! ([`tmpi_transport::fabric::Fabric::sleep`]), which wakes it as soon as data arrives. A long
//! spin there would cost more than CPU: each empty poll is a system call per peer, and the
//! kernel's receive processing of a loopback or veth packet is a softirq that, once deferred
//! to `ksoftirqd`, cannot run on a CPU where a rank spins until the scheduler tick preempts
//! the rank (4 ms here). A TCP-only rank sleeps right after its spin. A hybrid rank (shared
//! memory peers too) yields first, as a shared-memory rank does, since the doorbell of its
//! shared-memory peers cannot wake a `ppoll`; its sleep then ends at the same short timeouts
//! as the plain sleep it replaces, or at once for TCP data.

use super::*;

/// Idle strategy of a waiting rank: spin, then yield, then sleep in growing steps.
pub(crate) struct Backoff {
    idle: u32,
    spin: u32,
    /// Yields before the sleep phase.
    yields: u32,
}

/// Empty polls before a waiting rank yields, when it has a core to itself.
const SPIN: u32 = 20_000;
/// Empty polls before a waiting rank yields, when ranks outnumber cores: none. A rank that
/// polls in vain holds a core that a rank sharing it needs to make the progress it waits
/// for; each poll of the rings costs about as much as a `sched_yield` that finds no other
/// rank to run, and much less than one the other rank then needs (bench/results/shmcoll.md:
/// 64 polls made a 4-rank barrier on 2 cores 2-3x slower). Open MPI yields likewise after
/// every empty progress round when oversubscribed.
const SPIN_OVERSUBSCRIBED: u32 = 0;
/// Yields before sleeping, in general.
const YIELDS: u32 = 2000;
/// Yields before sleeping on a doorbell when ranks outnumber cores: a yielding rank takes
/// turns on the CPU from the ranks with work to do, and the doorbell wakes a sleeper as soon
/// as something arrives, so sleeping early is cheaper for everyone.
const YIELDS_DOORBELL_OVERSUBSCRIBED: u32 = 32;
/// Empty polls of one TCP connection (one `recv` system call each) a waiting rank with TCP
/// peers spends spinning before it sleeps in `ppoll` (`TMPI_POLL_SPIN=auto`): divided among
/// its connections, at least one round. About 35 us here: longer than a quiet round trip over
/// veth, so a ping-pong does not pay for waking up, and short enough that a packet held up in
/// `ksoftirqd` by the spin waits no longer than that (bench/results/tcp-netns.md).
const TCP_SPIN_RECVS: u32 = 100;

impl Backoff {
    pub(crate) fn new(spin: u32) -> Self {
        Backoff { idle: 0, spin, yields: YIELDS }
    }

    pub(crate) fn reset(&mut self) {
        self.idle = 0;
    }

    /// Waits a little; returns true once in a while in the slow phase (time for liveness checks).
    /// Its sleep is a plain sleep, which nothing cuts short: it keeps the long yield phase.
    pub(crate) fn snooze(&mut self) -> bool {
        self.yields = YIELDS;
        match self.step() {
            Some(d) => {
                std::thread::sleep(d);
                true
            }
            None if self.idle <= self.spin => {
                std::hint::spin_loop();
                false
            }
            None => self.idle % 256 == 0,
        }
    }

    /// One step of the back-off: spins or yields here (`None`), or says how long to sleep
    /// (the caller sleeps, on a doorbell where it has one).
    fn step(&mut self) -> Option<std::time::Duration> {
        self.idle = self.idle.saturating_add(1);
        let i = self.idle;
        if i <= self.spin {
            // No `spin_loop` (PAUSE) here, for the waits of [`Engine::idle`]: each of their
            // steps is a whole progress round (tens of ns), which already keeps the loop from
            // hammering one line, and a PAUSE only delays noticing what arrived (a 2-rank
            // barrier measured 0.14 us with it, 0.13 without; bench/results/shmcoll.md).
            // [`Backoff::snooze`] keeps it: at `Threading::Multiple` its spin lets go of the
            // engine between steps, and the pause gives other threads a window to take it.
            None
        } else if i <= self.spin + self.yields {
            std::thread::yield_now();
            None
        } else {
            let extra = (i - self.spin - self.yields).min(20);
            Some(std::time::Duration::from_micros(20 * u64::from(extra)))
        }
    }
}

/// `TMPI_POLL_SPIN=auto`: the spin budget of a rank on `fabric`, `oversubscribed` when ranks
/// outnumber cores. With connections that each empty poll asks the kernel about (TCP peers),
/// [`TCP_SPIN_RECVS`] divided among them (at least one round, at most the budget it would have
/// otherwise).
pub(crate) fn auto_spin(fabric: &AnyFabric, oversubscribed: bool) -> u32 {
    match fabric.polled_connections() {
        0 if oversubscribed => SPIN_OVERSUBSCRIBED,
        0 => SPIN,
        n => (TCP_SPIN_RECVS / u32::try_from(n).unwrap_or(u32::MAX)).clamp(1, if oversubscribed { 64 } else { SPIN }),
    }
}

/// CPUs this process may use (read once).
fn usable_cpus() -> usize {
    static CPUS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *CPUS.get_or_init(crate::sys::usable_cpus)
}

/// `test`/`iprobe` calls between two liveness checks.
pub(super) const IDLE_CHECK_EVERY: u32 = 4096;

impl Engine {
    /// One round of progress; returns how many events happened.
    #[inline]
    pub(crate) fn progress(&mut self) -> Result<usize> {
        if let Some(e) = self.st.outbox.take_failure() {
            return Err(e);
        }
        let mut n = 0;
        if self.out_pending > 0 {
            n += self.push_out()?;
        }
        n += self.drain_before_poll()?;
        let st = &mut self.st;
        n += self.fabric.poll(|p| st.on_packet(p))?;
        #[cfg(feature = "ofi")]
        if self.pm.is_some() {
            n += self.pm_progress(false)?;
        }
        #[cfg(feature = "ofi")]
        if self.st.ways.fabric.on {
            n += self.fabric_reads_done()?;
        }
        if let Some(e) = self.st.outbox.take_failure() {
            return Err(e);
        }
        if self.ctl_queued() {
            n += self.flush_ctl()?;
        }
        if !self.nbc.is_empty() {
            n += self.progress_nbc()?;
        }
        Ok(n)
    }

    /// Progresses until `rid` completes, or until it cannot: then [`Error::PeerGone`].
    ///
    /// A request that is already complete (most of a `wait_all` over a window: the first
    /// wait's progress completed the rest) is collected without setting up the back-off.
    #[inline(always)]
    pub(crate) fn wait(&mut self, rid: ReqId) -> Result<Status> {
        match self.take_if_done(rid) {
            Some(r) => r,
            None => self.wait_pending(rid),
        }
    }

    /// [`Engine::wait`] for a request that was not complete at the first look.
    #[inline(never)]
    fn wait_pending(&mut self, rid: ReqId) -> Result<Status> {
        let mut b = self.backoff();
        loop {
            if self.progress()? == 0 {
                if self.idle(&mut b, |_| false) {
                    self.check_gone(&Need::Req(rid))?;
                }
            } else {
                b.reset();
            }
            if let Some(r) = self.take_if_done(rid) {
                return r;
            }
        }
    }

    /// One step of `b`'s back-off; its sleep phase sleeps on this rank's doorbell (shared
    /// memory) when nothing is queued to go out, unless `busy(segment)` says that something
    /// the caller waits for is already there, or in `ppoll` on its sockets (TCP peers).
    /// Returns true when it is time for liveness checks, as [`Backoff::snooze`].
    pub(crate) fn idle(&mut self, b: &mut Backoff, busy: impl FnOnce(&tmpi_transport::shm::segment::Segment) -> bool) -> bool {
        match b.step() {
            // Only a doorbell or a socket makes an early sleep cheap: without one, yield as long
            // as usual.
            Some(_) if b.idle <= b.spin + YIELDS && !self.can_doze() => {
                std::thread::yield_now();
                b.idle % 256 == 0
            }
            Some(d) => {
                self.doze(d, busy);
                true
            }
            None => b.idle % 256 == 0 && b.idle > b.spin,
        }
    }

    /// Progresses until `done(self)` holds, or until `need` cannot be met: then
    /// [`Error::PeerGone`].
    pub(crate) fn wait_until(&mut self, need: &Need, mut done: impl FnMut(&mut Engine) -> bool) -> Result<()> {
        let mut b = self.backoff();
        while !done(self) {
            if self.progress()? == 0 {
                if self.idle(&mut b, |_| false) {
                    self.check_gone(need)?;
                }
            } else {
                b.reset();
            }
        }
        Ok(())
    }

    /// A fresh back-off with this engine's spin budget.
    pub(crate) fn backoff(&self) -> Backoff {
        let mut b = Backoff::new(self.spin);
        match self.fabric.wakeup() {
            Wakeup::Doorbell if self.size > usable_cpus() => b.yields = YIELDS_DOORBELL_OVERSUBSCRIBED,
            // A rank whose every peer can end its sleep in `ppoll` (or in the OFI completion
            // queue's descriptor) sleeps right after its spin when it has a core to itself:
            // nothing else can wake it sooner. When ranks outnumber cores it yields first, as
            // long as usual: the rank it waits for may be the one it would leave the core
            // to, and a wake-up costs more than the yields (`osu_allreduce` at 4 ranks on 2
            // cores, 2026-11-30: 8 B 70-103 us against 198-216 over OFI `tcp`, 58-112
            // against 102-110 over TCP; bench/results/HISTORY.md).
            Wakeup::Sockets { all: true } if self.size <= usable_cpus() => b.yields = 0,
            _ => {}
        }
        b
    }

    /// One step of a `test` on `rid`: a round of progress unless it is done already, and the
    /// periodic liveness check when that round found nothing.
    ///
    /// # Errors
    /// A failure of progress; [`Error::PeerGone`] as [`Engine::idle_check`].
    pub(crate) fn test_step(&mut self, rid: ReqId) -> Result<()> {
        if !self.is_done(rid) && self.progress()? == 0 {
            self.idle_check(&Need::Req(rid))?;
        }
        Ok(())
    }

    /// For loops that poll without blocking (`test`, `iprobe`): every so many idle calls,
    /// whether `need` can still be met.
    ///
    /// # Errors
    /// [`Error::PeerGone`] as [`Engine::check_gone`].
    pub(crate) fn idle_check(&mut self, need: &Need) -> Result<()> {
        self.idle_calls = self.idle_calls.wrapping_add(1);
        if self.idle_calls % IDLE_CHECK_EVERY == 0 {
            self.check_gone(need)?;
        }
        Ok(())
    }

    /// Test hook: puts `bytes` on the wire to world rank `dest` as one raw packet (waiting for
    /// ring space), so tests can play a peer that breaks the protocol.
    pub(crate) fn inject(&mut self, dest: usize, flags: u8, total_len: u64, bytes: &[u8]) -> Result<()> {
        if dest == self.st.rank || dest >= self.size {
            return Err(Error::InvalidRank { rank: dest, size: self.size });
        }
        let mut b = self.backoff();
        while !self.fabric.try_send(dest, flags, total_len, &[bytes])? {
            self.progress()?;
            if b.snooze() {
                self.check_gone(&Need::Peers(Peers::rank(dest)))?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::testkit::{pair, recv, send};
    use super::*;

    #[test]
    fn wait_returns_once_the_message_is_in() {
        let (mut a, mut b) = pair();
        send(&mut a, 1, 1, b"hi", false);
        let mut buf = [0u8; 2];
        let r = recv(&mut b, Some(0), Some(1), &mut buf);
        assert_eq!(b.wait(r).expect("ok").len(), 2);
    }

    #[test]
    fn a_wait_on_a_finalized_peer_ends_with_peer_gone() {
        let (mut a, mut b) = pair();
        send(&mut a, 1, 1, b"first", false);
        a.finalize().expect("finalize");
        let mut buf = [0u8; 8];
        // What the peer sent before it left is still received...
        let r = recv(&mut b, Some(0), Some(1), &mut buf);
        assert!(b.wait(r).is_ok());
        // ...and a receive nobody can satisfy any more fails instead of hanging.
        let r = recv(&mut b, Some(0), Some(1), &mut buf);
        match b.wait(r) {
            Err(Error::PeerGone { rank: 0 }) => {}
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn backoff_spins_then_reports_the_slow_phase() {
        let mut b = Backoff::new(3);
        assert!(!(0..3).any(|_| b.snooze()), "spinning never asks for liveness checks");
        assert!((0..2000).any(|_| b.snooze()), "the yield phase asks now and then");
        b.reset();
        assert!(!b.snooze());
    }
}
