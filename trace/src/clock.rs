//! Clocks: what each rank stamps its events with, and how ranks of different hosts are put on
//! one time line.
//!
//! Every event carries nanoseconds of its host's `CLOCK_MONOTONIC` ([`now_ns`]). Ranks of one
//! host share that clock (one kernel: same boot id, [`boot_id`]), so their events need no
//! correction. A rank of another host measures its clock against `tmpirun`'s with a few round
//! trips through its bootstrap connection, at init and at finalize, NTP-style: it notes its
//! clock before (`t0`) and after (`t3`) each request, `tmpirun` answers with its own clock `s`,
//! and the sample says `s - (t0 + t3) / 2` with an error of at most half the round trip; the
//! sample of the shortest round trip is kept ([`Sample`], [`best`]). The merger gives every
//! host ([`Domain`]) the offsets of its best samples, and between init and finalize draws the
//! offset on the straight line through them (the two clocks' drift).

/// Nanoseconds of `CLOCK_MONOTONIC` (0 if the clock cannot be read, which Linux never does).
#[inline]
pub fn now_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid, writable timespec for the call; on failure it stays zeroed.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    if rc != 0 {
        return 0;
    }
    (ts.tv_sec as u64).wrapping_mul(1_000_000_000).wrapping_add(ts.tv_nsec as u64)
}

/// This kernel's boot id (`/proc/sys/kernel/random/boot_id`): processes with the same one share
/// `CLOCK_MONOTONIC`. Empty if it cannot be read.
pub fn boot_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id").map(|s| s.trim().to_string()).unwrap_or_default()
}

/// One round trip to the reference clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Sample {
    /// Local clock when the request left.
    pub t0: u64,
    /// The reference clock in the answer.
    pub reference: u64,
    /// Local clock when the answer came back.
    pub t3: u64,
}

impl Sample {
    /// Round-trip time (ns).
    pub fn rtt(&self) -> u64 {
        self.t3.saturating_sub(self.t0)
    }

    /// Local time at the middle of the round trip.
    pub fn mid(&self) -> u64 {
        self.t0 + self.rtt() / 2
    }

    /// Reference minus local clock (ns): add it to a local time to get reference time. The
    /// true offset is within [`Sample::rtt`] / 2 of it.
    pub fn offset(&self) -> i64 {
        self.reference as i64 - self.mid() as i64
    }

    /// Whether the sample is usable (a round trip that went forward).
    pub fn is_valid(&self) -> bool {
        self.t0 != 0 && self.t3 >= self.t0 && self.reference != 0
    }
}

/// The valid sample of the shortest round trip, if any.
pub fn best(samples: &[Sample]) -> Option<Sample> {
    samples.iter().copied().filter(Sample::is_valid).min_by_key(Sample::rtt)
}

/// How to correct the clock of one host: offsets at two moments, drawn as a line between them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Domain {
    /// Best sample at init, if any.
    pub start: Option<Sample>,
    /// Best sample at finalize, if any.
    pub end: Option<Sample>,
}

impl Domain {
    /// A domain whose clock is the reference (offset 0 throughout).
    pub fn reference() -> Self {
        Domain { start: None, end: None }
    }

    /// Takes a rank's samples into the domain, keeping the better ones.
    pub fn absorb(&mut self, start: Option<Sample>, end: Option<Sample>) {
        let better = |a: Option<Sample>, b: Option<Sample>| match (a, b) {
            (Some(x), Some(y)) => Some(if y.rtt() < x.rtt() { y } else { x }),
            (x, None) => x,
            (None, y) => y,
        };
        self.start = better(self.start, start.filter(Sample::is_valid));
        self.end = better(self.end, end.filter(Sample::is_valid));
    }

    /// The offset (ns) to add to local time `t`.
    pub fn offset_at(&self, t: u64) -> i64 {
        match (self.start, self.end) {
            (None, None) => 0,
            (Some(s), None) | (None, Some(s)) => s.offset(),
            (Some(a), Some(b)) => {
                let (ta, tb) = (a.mid(), b.mid());
                if tb <= ta || t <= ta {
                    return a.offset();
                }
                if t >= tb {
                    return b.offset();
                }
                let frac = (t - ta) as f64 / (tb - ta) as f64;
                a.offset() + ((b.offset() - a.offset()) as f64 * frac).round() as i64
            }
        }
    }

    /// The worst error of the correction: half the longer kept round trip (ns).
    pub fn error_bound(&self) -> u64 {
        [self.start, self.end].iter().flatten().map(|s| s.rtt() / 2).max().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_clock_moves_forward() {
        let a = now_ns();
        let b = now_ns();
        assert!(a > 0 && b >= a);
    }

    /// A reference 1000 ns ahead, seen through round trips of various lengths whose answers
    /// were stamped anywhere inside the trip: every estimate is within half its trip, and the
    /// shortest trip is kept.
    #[test]
    fn the_shortest_round_trip_wins_and_is_within_half_its_length() {
        let ahead = 1000i64;
        let cases = [
            // (t0, reference time stamped at local time ts, t3)
            (10_000u64, 10_000u64, 10_400u64),
            (20_000, 20_390, 20_400),
            (30_000, 30_050, 30_100),
            (40_000, 40_000, 44_000),
        ];
        let samples: Vec<Sample> = cases.iter().map(|&(t0, ts, t3)| Sample { t0, reference: (ts as i64 + ahead) as u64, t3 }).collect();
        for s in &samples {
            assert!((s.offset() - ahead).unsigned_abs() <= s.rtt() / 2, "{s:?}: {}", s.offset());
        }
        let b = best(&samples).unwrap();
        assert_eq!(b.rtt(), 100);
        assert_eq!(best(&[Sample { t0: 5, reference: 7, t3: 4 }]), None, "a trip that went backwards is no sample");
    }

    #[test]
    fn a_domain_draws_the_drift_between_its_two_samples() {
        let s = |mid: u64, off: i64| Sample { t0: mid - 10, reference: (mid as i64 + off) as u64, t3: mid + 10 };
        let mut d = Domain::default();
        d.absorb(Some(s(1_000, 100)), Some(s(11_000, 300)));
        // A worse sample from another rank of the host changes nothing.
        d.absorb(Some(Sample { t0: 900, reference: 2_000, t3: 1_900 }), None);
        let table = [(0u64, 100i64), (1_000, 100), (6_000, 200), (11_000, 300), (50_000, 300)];
        for (t, want) in table {
            assert_eq!(d.offset_at(t), want, "at {t}");
        }
        assert_eq!(d.error_bound(), 10);
        assert_eq!(Domain::reference().offset_at(123), 0);
        let mut one = Domain::default();
        one.absorb(None, Some(s(500, -40)));
        assert_eq!(one.offset_at(0), -40);
    }
}
