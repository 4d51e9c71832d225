//! How rendezvous data moves, chosen by measurement (`TMPI_SINGLE_COPY_MIN=auto`, the
//! default), and where rendezvous starts (`TMPI_RNDV_THRESHOLD=auto`).
//!
//! Which of the two copies of a rendezvous read is faster depends on the machine, and by a
//! factor of two either way: on one 2-core AMD EPYC host the pipelined copy through the rings
//! beat `process_vm_readv` at every size up to 64 MiB, while on a 2-core Intel Xeon host
//! single copy took half the time from 32 KiB up, because a line the sender just wrote into
//! a ring crosses between the cores at about 13 GB/s there (`bench/results/adaptive-copy.md`).
//! No fixed threshold suits both, so each receiver measures.
//!
//! [`CopyChooser`] keeps, per power-of-two size class, recent timings of reads done each way
//! (stream through the rings, or single copy). The unit timed is a busy period ([`Epochs`]):
//! from a read that starts while none is in flight until none is in flight again, every read
//! in it moves the same way, and its sample is its duration per byte. A ping-pong times one
//! read at a time, an `osu_bw` window its 64 reads together: what it gives is the latency of
//! the first and the throughput of the second (timing the lone first read of a window instead
//! chose the rings at 256 KiB, where single copy moved twice the bytes per second). A period
//! whose reads are of several classes, or that a shared heap served, is not timed.
//!
//! How a class chooses:
//! - the first class of the rank to see reads alternates its periods (single copy first)
//!   until it has two samples each way, not counting the class's first period each way (a
//!   cold start: 29 us, then 6 us, then 2.4 us for the same 32 KiB read). A period of
//!   [`CROWD_READS`] reads or more (a window) counts though first in its class where its
//!   cold start is small beside it: for reads of [`WARM_COUNTED_MIN`] or more, or once
//!   another class of the rank has been through that way's first period; and a class decides
//!   after one sample each way, when one is clearly (25%) faster, from such periods (or from
//!   any, from [`WARM_COUNTED_MIN`]);
//! - a later class takes over the choice of the nearest class that compared both ways itself
//!   and for which it carries over: single copy from a smaller class, the rings from a larger
//!   one (single copy's fixed cost weighs less the larger the read, so even a close win
//!   points the right way). With none, it learns as the first did; with one, it tries the
//!   other way after 32 periods (4 when it took single copy over, [`PROBE_SINGLE_SMALL`]):
//!   clearly slower (25%) confirms the choice, else it tries again until it can compare.
//!   Nothing carries over the class from which the receiver copies a window of streamed
//!   reads out of the rings with non-temporal stores (256 KiB with 4 MiB rings,
//!   [`Epochs::streaming_from`]): the rings' cost per byte drops there;
//!   nor to or from a class of 8 MiB or more ([`OWN_CHOICE_MIN`]): each of those learns for
//!   itself;
//! - with samples both ways, the faster by the best of the last four serves the class (a
//!   change needs a 5% margin, so close ways do not flap; from 1 MiB the rings must be 20%
//!   faster, [`STREAM_MARGIN`]), and one period in `probe_every`
//!   (16, doubling to 256 while the choice holds; below 256 KiB a class on single copy
//!   starts at 4, [`PROBE_SINGLE_SMALL`]) tries the other way, so that a change of
//!   conditions is noticed. (Below 256 KiB a rings sample counts at 0.87 of its time there,
//!   [`EAGER_CREDIT`]; from 256 KiB to 1 MiB a tie goes to single copy,
//!   [`STREAM_MARGIN_SMALL`].)
//!   The chosen way is timed one period in [`SAMPLE_EVERY`] (4) and in each of the four
//!   before a try, so that the try meets fresh samples; an untimed period reads no clock;
//! - where two ranks read a class from each other at the same time (`osu_bibw`), the
//!   lower-ranked one leads ([`Epochs::paired`]): it learns and chooses as above, tells the
//!   other the way of its next period as each one ends ([`Control::ReadWay`]), and the other
//!   reads that way, untimed ([`Epochs::peer_read`]): its reads of the class from that rank,
//!   for as long as the two read it from each other ([`Epochs::lead`]); below 256 KiB a period crossed by the
//!   peer's reads of the other way is not counted, and from 256 KiB up to the non-temporal
//!   class such ranks start on single copy.
//!
//! [`Control::ReadWay`]: tmpi_transport::wire::Control::ReadWay
//!
//! Reads outside a timed period follow their class's choice, or the nearest class's.
//!
//! The same samples decide where rendezvous should start. Between ranks of one host that do
//! not outnumber its cores, a sender starts rendezvous at [`RNDV_LOW`] (16 KiB) instead of
//! the configured threshold. For a rendezvous below that threshold, the receiver finds that
//! eager pays once its class has timed reads both ways itself (a choice taken over from
//! another class is not enough) and the streamed read less its request's one-way trip is no
//! slower than the single copy (its grant round trip included): eager is the same copies
//! through the rings without the read request. Then (or when single copy is not possible at
//! all) it tells the sender [`Control::EagerBelow`] the top of that size class, and the
//! sender sends that class eagerly from then on. Advice only ever raises a sender's
//! threshold, never above the configured one (with auto, never above 1 MiB,
//! `RNDV_ADVISED_MAX`: the 256 and 512 KiB classes may go eager). A rank that follows a leader's
//! reads of a class ([`Epochs::lead`]) times none of them, so when the leader advises it
//! eager for the class it advises the leader the same.
//!
//! [`Control::EagerBelow`]: tmpi_transport::wire::Control::EagerBelow
//!
//! Pure state, no clock: times come in as arguments, so the tests drive it step by step.

/// Rendezvous starts here between ranks of one host where single copy may win (see the
/// module docs). On the host where single copy wins from 32 KiB, a 16 KiB ping-pong took
/// 0.69x the time by pre-granted single copy (1.95 against 2.82 us, beating Open MPI's 2.14),
/// while its `osu_bw` streamed faster and was advised back to eager; below 16 KiB the
/// eager copy is the cheaper.
pub(crate) const RNDV_LOW: usize = 16 << 10;

/// The two ways a rendezvous read moves its data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Arm {
    /// Pipelined through the rings: the target copies in, the reader copies out.
    Stream = 0,
    /// One kernel copy (`process_vm_readv`, split with the target's `process_vm_writev` from
    /// 128 KiB).
    Cma = 1,
}

impl Arm {
    fn other(self) -> Arm {
        match self {
            Arm::Stream => Arm::Cma,
            Arm::Cma => Arm::Stream,
        }
    }
}

/// A time of the chooser's measurements. Its unit is a clock tick that only ever meets its
/// own kind: TSC ticks where the kernel keeps time by the TSC (two reads per rendezvous read,
/// each a third of an `Instant::now`), else nanoseconds since the first reading. Every
/// comparison the chooser makes is between two of them (times per byte, a round trip against
/// a copy), so the unit never matters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Stamp(u64);

impl Stamp {
    /// Now.
    #[inline]
    pub(crate) fn now() -> Stamp {
        match crate::sys::tsc() {
            Some(t) => Stamp(t),
            None => {
                static ORIGIN: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
                Stamp(ORIGIN.get_or_init(std::time::Instant::now).elapsed().as_nanos() as u64)
            }
        }
    }

    /// Ticks from `earlier` to `self` (0 if `earlier` is later).
    fn since(self, earlier: Stamp) -> u64 {
        self.0.saturating_sub(earlier.0)
    }
}

/// Tests count ticks as nanoseconds.
#[cfg(test)]
impl std::ops::Add<std::time::Duration> for Stamp {
    type Output = Stamp;
    fn add(self, d: std::time::Duration) -> Stamp {
        Stamp(self.0 + d.as_nanos() as u64)
    }
}

#[cfg(test)]
impl std::ops::AddAssign<std::time::Duration> for Stamp {
    fn add_assign(&mut self, d: std::time::Duration) {
        *self = *self + d;
    }
}

/// Size classes: class `b` holds reads of `2^b ..= 2^(b+1) - 1` bytes.
const CLASSES: usize = 64;
/// Samples kept per way and class.
const KEPT: usize = 4;
/// Samples of each way a class needs before it compares the two.
const LEARN: u32 = 2;
/// Intervals, in timed periods, between tries of the way not chosen: after a comparison,
/// after the rings' choice taken over from another class (single copy's: see
/// [`PROBE_SINGLE_SMALL`]), and the longest.
const PROBE_FIRST: u32 = 16;
const PROBE_INHERITED: u32 = 32;
const PROBE_LONGEST: u32 = 256;
/// ...but below [`TIE_TO_SINGLE_MIN`] a class on single copy tries the rings after this many
/// periods, however it came to single copy, and then twice as late each time the try confirms
/// it. There the rings' win makes the sender go eager, and their samples suffer most from a
/// host whose cache lines cross slowly for a while (this host, for seconds at a time: 155-180
/// ns a line against 27-31): `osu_bw` 16 KiB that learned in such a spell timed the rings at
/// 854-922 against single copy's 355-459 (133-210 against 239-341 otherwise), chose single
/// copy, passed it on to 32-128 KiB, and ran the whole OSU run at 7.7-17 GB/s against 22-31
/// with eager, in 2 of 5 `tmpi-compare` runs (`bench/results/p2p-2026-11-27g.md`).
///
/// A class from [`TIE_TO_SINGLE_MIN`] that took single copy over from a smaller one tries
/// the rings after this many periods too (where [`PROBE_INHERITED`] came after OSU's 22
/// windows): a smaller class that learned in such a spell passed single copy on to every
/// larger class below [`OWN_CHOICE_MIN`], each of which then ran its whole OSU size without a
/// look at the rings.
const PROBE_SINGLE_SMALL: u32 = 4;

/// The first interval between tries of the way not chosen for a class of reads of `n` bytes
/// that chose `arm`, or took it over (`inherited`).
fn probe_first(n: usize, arm: Arm, inherited: bool) -> u32 {
    match (arm, inherited) {
        (Arm::Cma, inherited) if inherited || n < TIE_TO_SINGLE_MIN => PROBE_SINGLE_SMALL,
        (_, true) => PROBE_INHERITED,
        (_, false) => PROBE_FIRST,
    }
}
/// Classes of reads of this many bytes or more neither take another class's choice over nor
/// pass theirs on ([`CopyChooser::nearest_choice`]): each learns for itself. There a window
/// of reads is far larger than the last-level cache, so what wins depends on the moment's
/// memory traffic more than on the size, and a choice taken over was checked only after
/// [`PROBE_INHERITED`] periods, past OSU's 22 windows. In `osu_bibw` 16-64 MiB a close race
/// at 16 MiB (the rings' best period 236 thousandths of a tick per byte, single copy's
/// 244) chose single copy, which 32 and 64 MiB took over for the whole run: 15.2 GB/s at
/// 32 MiB, where the rings move 22-27. Learning for itself, a class decides after one
/// period each way when one is clearly faster, within OSU's two warm-up windows.
const OWN_CHOICE_MIN: usize = 8 << 20;
/// From this read size the first period each way counts if it moved [`CROWD_READS`] reads or
/// more: its cold start is small beside the period. (A lone read's is not: counted, a cold
/// first 2 MiB read made `osu_latency` 2 MiB choose the rings, 1.21x the time.)
const WARM_COUNTED_MIN: usize = 1 << 20;
const CROWD_READS: u64 = 4;
/// From [`WARM_COUNTED_MIN`] a class chooses the rings only when they took under 100/120 of
/// single copy's time per byte: a streamed read costs the target a copy too, which the
/// reader's timing sees only in part. Where both ranks read (`osu_bibw`), their learning
/// periods alternate in step, so each compares both ranks' single copy with both ranks'
/// rings, and single copy's first periods run slow (cold, or after a period of the rings):
/// at 8 MiB, 1.3x its warm time, while the rings' were level, so the two came out within
/// 12% where warm single copy is 1.3x faster. In 3 of 8 runs of `osu_bibw -m 8M:8M -W 8`
/// one rank then chose the rings (11.2-11.7 GB/s against 13.3-14.3); with this margin, 1 of 8.
const STREAM_MARGIN: u64 = 120;
/// From [`TIE_TO_SINGLE_MIN`] to [`WARM_COUNTED_MIN`] the rings are chosen when they took
/// under 100/105 of single copy's time: where both ranks read (`osu_bibw`), a close race let
/// each rank choose its own way (at 256 KiB: rings 466 against single copy 478 ps/B on one
/// rank, 542 against 469 on the other), and a rank streaming from a peer busy with its own
/// single copies waits for it (the streaming rank's samples went to 720-800 ps/B: 8.7 GB/s
/// against 11.6 when both take single copy). Single copy does not wait for the peer's core,
/// so on a tie it is the way two ranks agree on. Below 256 KiB (the default rendezvous
/// threshold) a tie goes to the rings instead: there the rings' win makes the sender go
/// eager ([`CopyChooser::eager_pays`]), which in `osu_bibw` 32-128 KiB moved 1.3-1.5x the
/// bytes of single copy (with the margin there, single copy was chosen and eager advised
/// for 16 KiB only).
const STREAM_MARGIN_SMALL: u64 = 105;
/// From this read size a tie goes to single copy ([`STREAM_MARGIN_SMALL`]); below it the
/// rings get [`EAGER_CREDIT`].
const TIE_TO_SINGLE_MIN: usize = 256 << 10;
/// Below [`TIE_TO_SINGLE_MIN`] a rings sample counts at `EAGER_CREDIT`/100 of its time when
/// set against single copy (in the choice and in [`CopyChooser::eager_pays`]): there the
/// rings' win sends the class eagerly, which moves the same copies without the read
/// request and the target's answer to it. In `osu_bibw` 16 KiB the two ways' periods timed
/// within 15% of each other, either way round from run to run (single copy 233 against the
/// rings' 266 ps/B in one), while eager moved 1.2-1.4x the bytes of single copy.
const EAGER_CREDIT: u64 = 87;

/// A rings sample `s` of a read of `n` bytes as set against single copy ([`EAGER_CREDIT`]).
fn eager_credit(n: usize, s: u64) -> u64 {
    if n < TIE_TO_SINGLE_MIN {
        s.saturating_mul(EAGER_CREDIT) / 100
    } else {
        s
    }
}

/// A class that has chosen times one period of its way in this many (and the [`KEPT`] before
/// each try of the other way).
const SAMPLE_EVERY: u32 = 4;
/// How much slower (in 1/100) a try of the way not chosen must be to confirm a choice taken
/// over from another class.
const CLEAR: u64 = 125;

/// The last [`KEPT`] samples of one way in one class.
#[derive(Debug, Clone, Copy, Default)]
struct Samples {
    ns: [u64; KEPT],
    n: u32,
    /// The smallest of `ns` (once `n > 0`): read at the end of every read (see
    /// [`CopyChooser::eager_pays`]), written only with a sample.
    min: u64,
}

impl Samples {
    fn push(&mut self, ns: u64) {
        self.ns[self.n as usize % KEPT] = ns;
        self.n = self.n.saturating_add(1);
        self.min = self.ns[..(self.n as usize).min(KEPT)].iter().copied().min().unwrap_or(ns);
    }

    /// The best (smallest) kept sample: noise only ever makes a copy slower.
    fn best(&self) -> Option<u64> {
        (self.n > 0).then_some(self.min)
    }
}

#[derive(Debug, Clone, Copy)]
struct Class {
    /// Times per byte by [`Arm`].
    arms: [Samples; 2],
    /// Round trips of single-copy reads (request to grant) alone in their period.
    rtt: Samples,
    chosen: Option<Arm>,
    /// It chose by comparing both ways itself: other classes may take its choice over.
    compared: bool,
    /// Timed periods each way, counted or not (learning alternates by them).
    tries: [u32; 2],
    /// Timed periods since the way not chosen was last tried, and the interval between tries.
    since_probe: u32,
    probe_every: u32,
    /// The first timed period each way was seen (and not counted).
    warm: [bool; 2],
    /// Crossed periods left uncounted ([`CopyChooser::skip_crossed`]).
    skipped: u32,
}

impl Default for Class {
    fn default() -> Self {
        Class {
            arms: [Samples::default(); 2],
            rtt: Samples::default(),
            chosen: None,
            compared: false,
            tries: [0; 2],
            since_probe: 0,
            probe_every: PROBE_FIRST,
            warm: [false; 2],
            skipped: 0,
        }
    }
}

impl Class {
    /// A try of the way not chosen confirmed the choice: the next comes twice as late (up to
    /// [`PROBE_LONGEST`]).
    fn try_less_often(&mut self) {
        self.probe_every = (self.probe_every.max(1) * 2).min(PROBE_LONGEST);
    }

    /// A first try of `arm`, the other way, in a class that took its choice over (before it
    /// has samples enough to compare): clearly slower confirms the choice (try less often),
    /// else try again soon.
    fn first_try_of_other(&mut self, arm: Arm) {
        if let (Some(cur), true) = (self.chosen, self.chosen != Some(arm)) {
            let (tried, kept) = (self.arms[arm as usize].best(), self.arms[cur as usize].best());
            if let (Some(t), Some(k)) = (tried, kept) {
                if t.saturating_mul(100) >= k.saturating_mul(CLEAR) {
                    self.try_less_often();
                }
            }
        }
    }

    /// The class of `n` compares its best times per byte, `s` by the rings and `m` by single
    /// copy, after a period done `arm`'s way: it chooses the faster, changes its choice only
    /// for a clear margin, and tries the other way less often when a try confirmed it.
    fn compare(&mut self, n: usize, arm: Arm, s: u64, m: u64) {
        let c = self;
        // Below `TIE_TO_SINGLE_MIN` the rings stand for eager ([`EAGER_CREDIT`]).
        let s = eager_credit(n, s);
        // From `WARM_COUNTED_MIN`, the rings must be clearly faster ([`STREAM_MARGIN`]).
        let margin = match n {
            _ if n >= WARM_COUNTED_MIN => STREAM_MARGIN,
            _ if n >= TIE_TO_SINGLE_MIN => STREAM_MARGIN_SMALL,
            _ => 100,
        };
        let faster = if s.saturating_mul(margin) < m.saturating_mul(100) { Arm::Stream } else { Arm::Cma };
        c.compared = true;
        match c.chosen {
            None => {
                c.chosen = Some(faster);
                c.probe_every = probe_first(n, faster, false);
            }
            Some(cur) if cur != faster => {
                // Change only for a clear margin (5%), so two close ways do not flap.
                let (cur_ns, new_ns) = if cur == Arm::Cma { (m, s) } else { (s, m) };
                if new_ns.saturating_mul(20) < cur_ns.saturating_mul(19) {
                    c.chosen = Some(faster);
                    c.probe_every = probe_first(n, faster, false);
                    c.since_probe = 0;
                }
            }
            Some(cur) if arm != cur => {
                // A try of the other way confirmed the choice: try less often.
                c.try_less_often();
            }
            Some(_) => {}
        }
    }
}

/// What [`CopyChooser::choose`] decided for one read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Choice {
    /// How the read moves its data.
    pub arm: Arm,
    /// Whether its time is to be measured and given to [`CopyChooser::record`].
    pub measure: bool,
}

/// The measurements and choices of one receiving rank (see the module docs).
#[derive(Debug, Clone)]
pub(crate) struct CopyChooser {
    classes: Box<[Class; CLASSES]>,
    /// The first class whose streamed reads the receiver copies out with non-temporal
    /// stores ([`Epochs::streaming_from`]; [`CLASSES`]: none): no choice carries over
    /// between the classes below it and those from it.
    regime: usize,
}

impl Default for CopyChooser {
    fn default() -> Self {
        CopyChooser { classes: Box::new([Class::default(); CLASSES]), regime: CLASSES }
    }
}

/// The busy period being timed.
#[derive(Debug, Clone, Copy)]
struct Epoch {
    class: usize,
    arm: Arm,
    /// Whether it is timed (a try of a learning class, or of the way not chosen, or a sample
    /// of the chosen way): reads of another class or a shared heap clear it.
    measure: bool,
    t0: Stamp,
    /// Reads of the period in flight, and bytes of those done.
    in_flight: u32,
    bytes: u64,
    /// Reads that joined it: past [`EPOCH_READS`] it takes no more.
    joined: u32,
    rtt: Option<u64>,
    /// A peer read its class from this rank the other way while it ran ([`Epochs::peer_read`]).
    crossed: bool,
    /// A higher-ranked peer read its class from this rank while it ran: this rank leads it
    /// ([`Epochs::peer_read`]).
    led: bool,
}

/// What a lower-ranked peer told this rank of a class it leads ([`Epochs::lead`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Lead {
    /// The leader's rank: only reads from it follow.
    from: usize,
    /// The way it reads the class next.
    arm: Arm,
    /// Reads of the class from the leader that this rank began since the leader last read
    /// the class from this rank, or told its way.
    unmet: u32,
}

/// A follower that began this many reads of a class from its leader while the leader read
/// none of the class from it stops following ([`Epochs::lead`]): the two no longer read the
/// class from each other (an `osu_bibw` window of 64 reads each way crosses at most 64 of one
/// way before one of the other).
const LEAD_UNMET_MAX: u32 = 256;

/// Most reads one timed period takes (a rank that always has reads in flight still decides
/// anew now and then).
const EPOCH_READS: u32 = 1024;

/// The timing of busy periods of reads, and the [`CopyChooser`] it feeds (see the module
/// docs).
#[derive(Debug, Clone)]
pub(crate) struct Epochs {
    chooser: CopyChooser,
    cur: Option<Epoch>,
    /// Reads in flight outside `cur` (while a full or mixed period drains).
    others: u32,
    /// A lower-ranked peer that reads a class from this rank while this rank reads it leads
    /// this rank's reads of it ([`Epochs::paired`]).
    paired: bool,
    /// Per class: a peer read it from this rank while this rank read it too.
    both_ways: [bool; CLASSES],
    /// Per class: the way a lower-ranked peer said it reads the class next
    /// ([`Epochs::lead`]).
    lead: [Option<Lead>; CLASSES],
    /// Per class: the choice for the next period, made when the last one ended and told to
    /// the peer that follows this rank ([`Epochs::finish`]).
    planned: [Option<Choice>; CLASSES],
}

impl Default for Epochs {
    fn default() -> Self {
        Epochs {
            chooser: CopyChooser::default(),
            cur: None,
            others: 0,
            paired: false,
            both_ways: [false; CLASSES],
            lead: [None; CLASSES],
            planned: [None; CLASSES],
        }
    }
}

/// From this class (reads of 256 KiB, [`TIE_TO_SINGLE_MIN`]) two ranks that read a class from
/// each other start on single copy, and below it a crossed period is not counted
/// ([`Epochs::peer_read`]).
const PAIRED_SINGLE_FROM: usize = class_of(TIE_TO_SINGLE_MIN);
/// Most crossed periods a class leaves uncounted ([`Epochs::peer_read`]).
const CROSSED_MAX: u32 = 8;

/// How one read was placed by [`Epochs::start`]; give it back to [`Epochs::finish`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Placed {
    /// How the read moves its data.
    pub arm: Arm,
    in_epoch: bool,
}

impl Epochs {
    /// The periods of a rank whose reads of a class a lower-ranked peer leads where the two
    /// read it from each other at the same time (`osu_bibw`; see [`Epochs::peer_read`]): the
    /// leader learns and chooses as a rank alone does, and tells the follower the way of each
    /// next period, so that the two ranks always move a class the same way and each of the
    /// leader's samples is of what the pair does together. Reads one way only (`osu_bw`), or
    /// by turns (a ping-pong), lead nothing: each rank takes turns by its own periods.
    ///
    /// Below 256 KiB the ranks used to learn in step by the parity of the host's TSC in
    /// slots of 128 ticks per byte of the class instead (0.6 ms at 16 KiB): a slot spanned
    /// several of `osu_bibw`'s windows, so learning cost up to 12 single-copy windows of its
    /// 22 at 32-64 KiB, and the two ranks' samples, each of its own periods, differed by up
    /// to 2x, so the slower rank could choose single copy alone. Led, 16-128 KiB run on 10
    /// rendezvous windows in all and 3-4 of single copy (`TMPI_STATS=1`), and `osu_bibw`
    /// 64/128 KiB moved 1.10/1.06x the bytes (8 paired runs; `bench/results/p2p-2026-11-28.md`).
    ///
    /// From 256 KiB up to the non-temporal class, two ranks reading a class from each other
    /// start on single copy instead, as if taken over from another class (checked after 32
    /// periods): they agree on it, and it waits for neither core. Learning such a class by
    /// turns let the ranks choose differently on a close race (`osu_bibw` 256 KiB 0.70x the
    /// bytes of a sweep whose 16 KiB had chosen single copy and passed it on).
    pub(crate) fn paired() -> Epochs {
        Epochs { paired: true, ..Epochs::default() }
    }

    /// Streamed reads of `n` bytes or more are copied out of the rings with non-temporal
    /// stores, which changes what the rings cost per byte: from there a class learns for
    /// itself instead of taking over a smaller class's choice (see
    /// [`CopyChooser::nearest_choice`]).
    pub(crate) fn streaming_from(mut self, n: usize) -> Epochs {
        self.chooser.regime = class_of(n);
        self
    }

    /// Peer asked this rank for a read of `n` bytes `arm`'s way, or told it (FIN) that a
    /// read of `n` bytes that went `arm`'s way ended (a read from a shared heap counts as
    /// single copy: the peer's core copies by itself).
    ///
    /// Where two ranks read from each other (`osu_bibw`), each one's reads wait for the other
    /// core: a streamed read for its copy into the rings, a single copy not at all. So a
    /// period of one way that overlaps the peer's reads of its class the other way is a
    /// sample of neither: when the two ranks' learning alternations ran one period apart,
    /// every rings sample met the peer's single copy and read 2x slow, and `osu_bibw` 16-64
    /// KiB chose single copy in 5 of 8 runs (10-18 GB/s against 18-25 by eager). While a
    /// class below [`PAIRED_SINGLE_FROM`] of a paired rank ([`Epochs::paired`]) has not
    /// compared the two ways itself, such a crossed period is not counted, up to
    /// [`CROSSED_MAX`] of them (a peer that chose already and reads the other way all the
    /// time must not keep it learning for good).
    ///
    /// The lower-ranked of two such ranks leads (`lower`: the peer has the lower rank). When
    /// a period of such a class ends that a higher-ranked peer's reads of the class crossed,
    /// the leader chooses the way of its next period of the class at once and tells the
    /// peer ([`Epochs::finish`]); the peer reads the class that way, untimed
    /// ([`Epochs::lead`]). Each rank learning by turns for itself let the two choose
    /// differently, the worst mix: in `osu_bibw` one rank timed single copy fast in periods
    /// where the peer streamed (the peer's core busy with its own copies in, not this
    /// rank's), chose it while the other chose the rings, and moved 15.1 GB/s at 16 MiB and
    /// 11.5 at 32 MiB, against 14.7-17.3 where both streamed. Following, the leader's
    /// periods of each way meet the peer's reads of the same way, so it compares what the
    /// pair does together. It is told before the period, not seen in it: a window's reads
    /// are placed at once, when their requests arrive, before the leader's reads of it are
    /// seen (following what it saw, the follower ran a window behind, and the leader's
    /// rings periods met its single copy: `osu_bibw` 256 KiB-8 MiB chose single copy, 0.81-0.91x the bytes).
    pub(crate) fn peer_read(&mut self, arm: Arm, n: usize, src: usize, lower: bool) {
        let class = class_of(n);
        if let Some(l) = self.lead[class].as_mut().filter(|l| l.from == src) {
            l.unmet = 0;
        }
        if let Some(e) = &mut self.cur {
            if e.class == class && self.paired {
                self.both_ways[e.class] = true;
                e.crossed |= e.arm != arm && e.class < PAIRED_SINGLE_FROM;
                e.led |= !lower;
            }
        }
    }

    /// Lower-ranked peer `from`, which reads reads of `class` from this rank while this rank
    /// reads them from it, said it reads its next ones `arm`'s way: this rank's reads of the
    /// class from `from` go that way too (see [`Epochs::peer_read`]). Ignored by a rank not
    /// [`Epochs::paired`].
    ///
    /// Reads of the class from any other peer take this rank's own periods. Once this rank
    /// has begun [`LEAD_UNMET_MAX`] reads of the class from `from` while `from` read none of
    /// it from this rank, the two no longer read the class from each other (`osu_bw` after
    /// `osu_bibw`): this rank stops following, and learns and chooses for itself again.
    pub(crate) fn lead(&mut self, class: usize, arm: Arm, from: usize) {
        if self.paired && class < CLASSES {
            self.lead[class] = Some(Lead { from, arm, unmet: 0 });
        }
    }

    /// Whether peer `from` leads this rank's reads of `n` bytes from it (see
    /// [`Epochs::lead`]).
    pub(crate) fn follows(&self, n: usize, from: usize) -> bool {
        self.lead[class_of(n)].is_some_and(|l| l.from == from)
    }

    /// The way this rank's next read of `n` bytes from `src` goes, if `src` leads it (see
    /// [`Epochs::lead`]); counts the read, and past [`LEAD_UNMET_MAX`] unmet ones leads no more.
    fn follow(&mut self, n: usize, src: usize) -> Option<Arm> {
        let slot = &mut self.lead[class_of(n)];
        let l = slot.as_mut().filter(|l| l.from == src)?;
        if l.unmet >= LEAD_UNMET_MAX {
            *slot = None;
            return None;
        }
        l.unmet += 1;
        Some(l.arm)
    }

    /// Reads of `n` bytes that would learn while a peer reads them from this rank too start
    /// on single copy instead from 256 KiB up to the non-temporal class (see
    /// [`Epochs::paired`]).
    fn start_paired(&mut self, n: usize) {
        let class = class_of(n);
        let learns_paired = self.both_ways[class] && self.chooser.learning(n);
        if learns_paired && (PAIRED_SINGLE_FROM..self.chooser.regime).contains(&class) {
            // From 256 KiB, two ranks reading a class from each other start on single copy
            // (see `Epochs::paired`), up to the class where the rings' copy-out turns to
            // non-temporal stores (256 KiB with 4 MiB rings, so no class there): from there
            // they learn by turns (`osu_bibw` 1-4 MiB
            // through 4 MiB rings moved 1.3-1.4x the bytes of single copy, which a class
            // that starts on it tries again only after 32 periods, past OSU's 22 windows).
            self.chooser.assume(n, Arm::Cma);
        }
    }

    /// A read of `n` bytes from `src` that single copy could serve starts `now` (read only if
    /// the period it starts is timed): how it moves.
    pub(crate) fn start(&mut self, n: usize, src: usize, now: impl FnOnce() -> Stamp) -> Placed {
        let class = class_of(n);
        if let Some(arm) = self.follow(n, src) {
            // Following a lower-ranked peer ([`Epochs::lead`]): untimed, and whatever period runs is not timed either: its reads are mixed.
            if let Some(e) = &mut self.cur {
                e.measure = false;
                e.joined = EPOCH_READS;
            }
            self.others += 1;
            return Placed { arm, in_epoch: false };
        }
        self.start_paired(n);
        match &mut self.cur {
            None if self.others == 0 => {
                let (c, t0) = if let Some(c) = self.planned[class].take() {
                    // Chosen when the last period ended, and told to the follower.
                    (c, if c.measure { now() } else { Stamp(0) })
                } else {
                    let c = self.chooser.choose(n, true);
                    (c, if c.measure { now() } else { Stamp(0) })
                };
                self.cur = Some(Epoch {
                    class,
                    arm: c.arm,
                    measure: c.measure,
                    t0,
                    in_flight: 1,
                    bytes: 0,
                    joined: 1,
                    rtt: None,
                    crossed: false,
                    led: false,
                });
                Placed { arm: c.arm, in_epoch: true }
            }
            Some(e) if e.class == class && e.joined < EPOCH_READS => {
                e.in_flight += 1;
                e.joined += 1;
                Placed { arm: e.arm, in_epoch: true }
            }
            cur => {
                if let Some(e) = cur {
                    // Reads of another class: the period's time says nothing of either.
                    e.measure = e.measure && e.class == class;
                    e.joined = EPOCH_READS;
                }
                self.others += 1;
                Placed { arm: self.chooser.choose(n, false).arm, in_epoch: false }
            }
        }
    }

    /// The first grant of a single-copy read of the period arrived `now` (read only if the
    /// period is timed).
    pub(crate) fn granted(&mut self, p: Placed, now: impl FnOnce() -> Stamp) {
        self.first_grant(p, |t0| now().since(t0));
    }

    /// A single-copy read of the period was granted with its request (pre-granted): a round
    /// trip of none.
    pub(crate) fn pregranted(&mut self, p: Placed) {
        self.first_grant(p, |_| 0);
    }

    /// Records the round trip of a timed period's first grant, `rtt` of the period's start
    /// (called only then).
    fn first_grant(&mut self, p: Placed, rtt: impl FnOnce(Stamp) -> u64) {
        if let (Some(e), true) = (&mut self.cur, p.in_epoch) {
            if e.measure && e.rtt.is_none() {
                e.rtt = Some(rtt(e.t0));
            }
        }
    }

    /// A read of the period was served some other way (a shared heap) or failed: the
    /// period is not timed.
    pub(crate) fn spoil(&mut self, p: Placed) {
        if let (Some(e), true) = (&mut self.cur, p.in_epoch) {
            e.measure = false;
        }
    }

    /// A read of `n` bytes placed as `p` ended `now` (read only if it ends a timed period;
    /// `ok`: all its bytes are in). Returns the class and way this rank chose for its next
    /// period of the class, when the period this read ended is one it leads: to tell the
    /// higher-ranked peer that reads the class too (see [`Epochs::peer_read`]).
    pub(crate) fn finish(&mut self, n: usize, p: Placed, ok: bool, now: impl FnOnce() -> Stamp) -> Option<(usize, Arm)> {
        if !p.in_epoch {
            self.others = self.others.saturating_sub(1);
            return None;
        }
        let e = self.cur.as_mut()?;
        e.in_flight = e.in_flight.saturating_sub(1);
        e.bytes += n as u64;
        e.measure &= ok;
        if e.in_flight == 0 {
            let e = *e;
            self.cur = None;
            if e.measure && !(e.crossed && self.chooser.skip_crossed(1 << e.class)) {
                let ns = now().since(e.t0);
                // A round trip is one only for a read alone in its period: in a crowd the
                // first grant waits behind the target's work for the others (120 us against
                // 0.5 us, in an `osu_bw` window of 32 KiB reads).
                let rtt = e.rtt.filter(|_| e.joined == 1);
                self.chooser.record(1 << e.class, e.arm, e.bytes, ns, rtt);
            }
            if e.led && self.paired {
                self.start_paired(1 << e.class);
                let c = self.chooser.choose(1 << e.class, true);
                self.planned[e.class] = Some(c);
                return Some((e.class, c.arm));
            }
        }
        None
    }

    /// See [`CopyChooser::eager_pays`].
    pub(crate) fn eager_pays(&self, n: usize) -> Option<bool> {
        self.chooser.eager_pays(n)
    }

    /// The chooser, for tests.
    #[cfg(test)]
    pub(crate) fn chooser(&self) -> &CopyChooser {
        &self.chooser
    }
}

/// The size class of a read of `n` bytes.
const fn class_of(n: usize) -> usize {
    let n = if n == 0 { 1 } else { n };
    (usize::BITS - 1 - n.leading_zeros()) as usize
}

/// The first size above `n`'s class.
pub(crate) fn class_end(n: usize) -> usize {
    1usize.checked_shl(class_of(n) as u32 + 1).unwrap_or(usize::MAX)
}

impl CopyChooser {
    /// How to move the reads of a period that starts with a read of `n` bytes (`lone`), or
    /// a read outside any timed period (not `lone`).
    pub(crate) fn choose(&mut self, n: usize, lone: bool) -> Choice {
        let b = class_of(n);
        if self.classes[b].chosen.is_none() {
            if let Some(arm) = self.nearest_choice(b) {
                // Take over the choice of the nearest class that has one, and check it soon.
                let c = &mut self.classes[b];
                c.chosen = Some(arm);
                c.probe_every = probe_first(n, arm, true);
            }
        }
        let c = &mut self.classes[b];
        match c.chosen {
            // No class has chosen yet: try both, single copy first.
            None => {
                let arm = if c.tries[Arm::Cma as usize] <= c.tries[Arm::Stream as usize] { Arm::Cma } else { Arm::Stream };
                Choice { arm, measure: lone }
            }
            Some(arm) if lone => {
                c.since_probe += 1;
                if c.since_probe >= c.probe_every {
                    c.since_probe = 0;
                    Choice { arm: arm.other(), measure: true }
                } else {
                    // The chosen way is timed one period in [`SAMPLE_EVERY`], and in each of
                    // the [`KEPT`] before a try of the other way, which then meets fresh
                    // samples. (Timing every period cost 1-3% of a 16-64 KiB ping-pong: two clock reads
                    // and a sample per read.)
                    let measure = c.since_probe % SAMPLE_EVERY == 0 || c.since_probe + KEPT as u32 >= c.probe_every;
                    Choice { arm, measure }
                }
            }
            Some(arm) => Choice { arm, measure: false },
        }
    }

    /// The choice of the nearest other class that compared both ways itself (the smaller on
    /// a tie), where it carries over: single copy from a smaller class, the rings from a
    /// larger one. Single copy's fixed cost (a system call, page pinning) weighs less the
    /// larger the read, so where it wins, even narrowly, it also wins above, and where the
    /// rings win they also win below; the other way round says nothing. (On the host where
    /// single copy moved twice the rings' bytes from 128 KiB, 16 KiB reads still streamed
    /// faster in `osu_bw`, and 32-128 KiB taking that over ran 0.65-0.93x while they learned.
    /// Requiring a clear win, 25%, to carry single copy over made `osu_bw` 16 KiB-4 MiB
    /// relearn in classes after a close race at 16 KiB: 0.88-0.96x the bytes of fixed single
    /// copy in OSU's short default runs.)
    ///
    /// Nothing carries over the class where the rings' copy-out turns to non-temporal stores
    /// (`regime`): there the rings' cost per byte drops (`osu_bw` 1-8 MiB, 4 MiB rings: 2x
    /// the bytes of single copy, which had won at 256-512 KiB and passed single copy on).
    ///
    /// Nor does anything carry over to or from a class of [`OWN_CHOICE_MIN`] or more: each
    /// learns for itself.
    fn nearest_choice(&self, b: usize) -> Option<Arm> {
        let own = class_of(OWN_CHOICE_MIN);
        if b >= own {
            return None;
        }
        let side = |i: usize| i >= self.regime;
        (1..CLASSES)
            .flat_map(|d| [b.checked_sub(d), Some(b + d)])
            .flatten()
            .filter(|&i| i < own && self.classes[i].compared && side(i) == side(b))
            .find_map(|i| match self.classes[i].chosen {
                Some(Arm::Cma) if i < b => Some(Arm::Cma),
                Some(Arm::Stream) if i > b => Some(Arm::Stream),
                _ => None,
            })
    }

    /// A timed period of reads of `n`'s class done `arm`'s way moved `bytes` in `ns` ticks of
    /// [`Stamp`] (from its first request to its last byte); `rtt`, for single copy, is the
    /// round trip to the grant of a read alone in its period.
    ///
    /// The first period each way of a class is not counted (unless it tries the way the
    /// class did not choose, see below): it pays for what only a first
    /// transfer of that size does (cold caches, first-touch page faults, the sender's
    /// registration): 29 us against 6 us and then 2.4 us, in one run at 32 KiB; and 595
    /// against 107 ps per byte in an `osu_bw` window of 32 KiB that followed 16 KiB.
    pub(crate) fn record(&mut self, n: usize, arm: Arm, bytes: u64, ns: u64, rtt: Option<u64>) {
        // Some class has timed a first period of this way (rank-wide: the cold start a
        // class's first period pays is mostly the rank's first use of that way).
        let warmed = self.classes.iter().any(|c| c.warm[arm as usize]);
        let c = &mut self.classes[class_of(n)];
        c.tries[arm as usize] += 1;
        // A cold first try of the way a class did not choose counts all the same: it can only
        // look slower than it is, which confirms the choice (and the next try, a while later,
        // is warm), and one slow period fewer matters in OSU's short default runs.
        let probe = c.chosen.is_some_and(|ch| ch != arm);
        // A crowded period (a window) counts though first in its class where its cold start
        // is small beside it: from `WARM_COUNTED_MIN`, or once another class has been
        // through that way's cold start (`osu_bw` 32-128 KiB after 16 KiB: first periods
        // 214-281 against 137-337 later by single copy, 106-174 against 98-208 by the rings,
        // where the rank's very first ones took 2 353-9 115 and 245-547).
        let crowded = bytes >= CROWD_READS * n as u64;
        if !std::mem::replace(&mut c.warm[arm as usize], true) && !probe && !(crowded && (n >= WARM_COUNTED_MIN || warmed)) {
            return;
        }
        // Thousandths of a tick per byte: sizes within a class differ by up to 2x.
        c.arms[arm as usize].push(ns.saturating_mul(1000) / bytes.max(1));
        if let Some(r) = rtt {
            c.rtt.push(r);
        }
        let [s, m] = [&c.arms[Arm::Stream as usize], &c.arms[Arm::Cma as usize]];
        // A class learning from scratch decides after one sample each way when one way is
        // clearly (25%) faster, for large reads or in a window once the rank is past its cold
        // starts: each further try of the slower way costs a whole period, a large share of a
        // short run (`osu_bw` 32/64/128 KiB 1.20/1.07/1.08x the bytes, 9 runs; deciding so
        // from lone reads below 1 MiB, a ping-pong's, was measured before as noise).
        let clear = |a: u64, b: u64| a.max(b).saturating_mul(100) >= a.min(b).saturating_mul(CLEAR);
        let decisive = (n >= WARM_COUNTED_MIN || (crowded && warmed))
            && c.chosen.is_none()
            && matches!((s.best(), m.best()), (Some(a), Some(b)) if clear(a, b));
        if (s.n < LEARN || m.n < LEARN) && !decisive {
            c.first_try_of_other(arm);
            return;
        }
        let (Some(s), Some(m)) = (s.best(), m.best()) else { return };
        c.compare(n, arm, s, m);
    }

    /// A timed period of reads of `n`'s class overlapped a peer's reads of the other way
    /// (see [`Epochs::peer_read`]): whether to leave it uncounted (the class has not
    /// compared both ways itself, and has left fewer than [`CROSSED_MAX`] so).
    fn skip_crossed(&mut self, n: usize) -> bool {
        let c = &mut self.classes[class_of(n)];
        let skip = !c.compared && c.skipped < CROSSED_MAX;
        c.skipped += u32::from(skip);
        skip
    }

    /// Reads of `n` bytes go `arm`'s way as if taken over from another class (tried the other
    /// way after [`PROBE_INHERITED`] periods).
    fn assume(&mut self, n: usize, arm: Arm) {
        let c = &mut self.classes[class_of(n)];
        c.chosen = Some(arm);
        c.probe_every = PROBE_INHERITED;
    }

    /// Whether a period of reads of `n` bytes would try a way to learn (its class has not
    /// chosen, nor can take a choice over).
    fn learning(&self, n: usize) -> bool {
        let b = class_of(n);
        self.classes[b].chosen.is_none() && self.nearest_choice(b).is_none()
    }

    /// Whether a message of `n` bytes goes at least as fast eagerly as by a rendezvous (see
    /// the module docs); `None` while that is not known: until the class itself has timed
    /// reads both ways. A choice taken over from another class is not enough: on the host
    /// where single copy wins from 32 KiB, 16 KiB reads streamed faster in `osu_bw`, and
    /// 32 KiB advised eager on that alone ran 0.9x. Advice is never taken back, so it waits
    /// for the class's own comparison.
    pub(crate) fn eager_pays(&self, n: usize) -> Option<bool> {
        let c = &self.classes[class_of(n)];
        c.chosen?;
        let per_read = |ps_per_byte: u64| ps_per_byte.saturating_mul(n as u64) / 1000;
        let s = per_read(eager_credit(n, c.arms[Arm::Stream as usize].best()?));
        let m = per_read(c.arms[Arm::Cma as usize].best()?);
        let one_way = c.rtt.best().unwrap_or(0) / 2;
        Some(s <= m.saturating_add(one_way))
    }

    /// The way chosen for reads of `n` bytes, if their class has chosen.
    #[cfg(test)]
    pub(crate) fn chosen(&self, n: usize) -> Option<Arm> {
        self.classes[class_of(n)].chosen
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// One timed read of `n` bytes that took `ns`.
    fn rec(c: &mut CopyChooser, n: usize, arm: Arm, ns: u64, rtt: Option<u64>) {
        c.record(n, arm, n as u64, ns, rtt);
    }

    /// Drives `c` through lone reads of `n` bytes where a stream takes `stream` ns and a single
    /// copy `cma` ns (round trip `rtt`) for `reads` reads, recording those it times; returns
    /// the ways taken.
    fn drive(c: &mut CopyChooser, n: usize, stream: u64, cma: u64, rtt: u64, reads: usize) -> Vec<Arm> {
        (0..reads)
            .map(|_| {
                let ch = c.choose(n, true);
                assert!(ch.measure || c.chosen(n) == Some(ch.arm), "learning and tries are timed");
                match (ch.measure, ch.arm) {
                    (false, _) => {}
                    (true, Arm::Stream) => rec(c, n, Arm::Stream, stream, None),
                    (true, Arm::Cma) => rec(c, n, Arm::Cma, cma, Some(rtt)),
                }
                ch.arm
            })
            .collect()
    }

    use Arm::{Cma, Stream};

    #[test]
    fn classes_are_powers_of_two() {
        assert_eq!(class_of(0), 0);
        assert_eq!(class_of(1), 0);
        assert_eq!(class_of(32768), 15);
        assert_eq!(class_of(65535), 15);
        assert_eq!(class_of(65536), 16);
        assert_eq!(class_end(40000), 65536);
        assert_eq!(class_end(usize::MAX), usize::MAX);
    }

    /// The first class alternates (its first read each way uncounted, a cold start) and
    /// chooses the faster way; other classes take that choice over and check it after a few
    /// periods, following the other way where it is clearly faster.
    #[test]
    fn the_first_class_learns_and_the_others_take_its_choice_over() {
        let mut c = CopyChooser::default();
        assert_eq!(drive(&mut c, 100_000, 9_000, 5_000, 500, 6), [Cma, Stream, Cma, Stream, Cma, Stream]);
        assert_eq!(c.chosen(100_000), Some(Cma));
        assert_eq!(c.chosen(70_000), Some(Cma), "the same class");
        assert_eq!(c.chosen(200_000), None, "another class has not been asked yet");
        // Single copy is faster at 200 KB too: its reads go that way, the rings are tried
        // after 4 periods (below `TIE_TO_SINGLE_MIN`; counted though cold: it can only
        // confirm), clearly slower, so next after 8, 16 and 32, and the choice holds.
        let ways = drive(&mut c, 200_000, 18_000, 10_000, 500, 100);
        let tries: Vec<usize> = ways.iter().enumerate().filter(|(_, &a)| a == Stream).map(|(i, _)| i).collect();
        assert_eq!(tries, [3, 11, 27, 59]);
        // So does a class from `TIE_TO_SINGLE_MIN` that takes single copy over.
        let ways = drive(&mut c, 300_000, 27_000, 15_000, 500, 40);
        let tries: Vec<usize> = ways.iter().enumerate().filter(|(_, &a)| a == Stream).map(|(i, _)| i).collect();
        assert_eq!(tries, [3, 11, 27]);
        assert_eq!(c.chosen(200_000), Some(Cma));
        // At 1 MB the rings are faster: the choice taken over changes at their second try,
        // 4 periods after the first (which was not clearly slower), within OSU's 22 windows.
        let ways = drive(&mut c, 1 << 20, 40_000, 90_000, 500, 64);
        assert_eq!(c.chosen(1 << 20), Some(Stream));
        assert_eq!(ways[..8], [Cma, Cma, Cma, Stream, Cma, Cma, Cma, Stream]);
        assert!(ways[8..23].iter().all(|&a| a == Stream), "{ways:?}");
    }

    /// No choice carries over the class where the rings' copy-out changes (`regime`): a
    /// class from it learns for itself, a class below it takes over a smaller class's choice.
    #[test]
    fn no_choice_carries_over_the_streaming_class() {
        let mut e = Epochs::default().streaming_from(1 << 20);
        let c = &mut e.chooser;
        assert_eq!(drive(c, 100_000, 9_000, 5_000, 500, 6), [Cma, Stream, Cma, Stream, Cma, Stream]);
        assert_eq!(c.chosen(100_000), Some(Cma));
        assert_eq!(c.choose(300_000, true).arm, Cma);
        assert_eq!(c.chosen(300_000), Some(Cma), "below the streaming class: taken over");
        assert_eq!(c.chosen(2 << 20), None, "from the streaming class: not taken over");
        assert!(c.learning(2 << 20));
        assert_eq!(drive(c, 2 << 20, 40_000, 90_000, 500, 4), [Cma, Stream, Cma, Stream]);
    }

    /// From 8 MiB a class learns for itself: single copy chosen at 4 MiB does not carry up to
    /// it, nor does its choice carry to another class, either way.
    #[test]
    fn classes_from_8_mib_learn_for_themselves() {
        let mut c = CopyChooser::default();
        let crowd = |c: &mut CopyChooser, n: usize, arm: Arm, ns: u64| c.record(n, arm, 8 * n as u64, ns, None);
        crowd(&mut c, 4 << 20, Cma, 8_000_000);
        crowd(&mut c, 4 << 20, Stream, 14_000_000);
        assert_eq!(c.chosen(4 << 20), Some(Cma));
        assert_eq!(c.choose(5 << 20, true).arm, Cma, "below 8 MiB single copy still carries up");
        for n in [8 << 20, 16 << 20, 64 << 20] {
            assert!(c.learning(n), "{n}");
            assert_eq!(c.choose(n, true), Choice { arm: Cma, measure: true });
            assert_eq!(c.chosen(n), None, "{n}: nothing taken over");
        }
        // 16 MiB learns the rings; they carry neither down to 4-8 MiB nor up to 32 MiB.
        crowd(&mut c, 16 << 20, Cma, 40_000_000);
        crowd(&mut c, 16 << 20, Stream, 20_000_000);
        assert_eq!(c.chosen(16 << 20), Some(Stream));
        assert_eq!(c.choose(2 << 20, true).arm, Cma, "2 MiB takes 4 MiB's choice, not 16 MiB's");
        assert!(c.learning(8 << 20) && c.learning(32 << 20));
        assert_eq!(c.chosen(12 << 20), None);
    }

    /// The first read each way of a class is a cold start and does not count.
    #[test]
    fn the_first_read_each_way_is_not_counted() {
        let mut c = CopyChooser::default();
        let n = 40_000;
        for (arm, ns) in [(Cma, 29_000), (Stream, 25_000), (Cma, 2_500), (Stream, 7_000), (Cma, 2_400)] {
            assert_eq!(c.choose(n, true).arm, arm);
            rec(&mut c, n, arm, ns, (arm == Cma).then_some(600));
            assert_eq!(c.chosen(n), None);
        }
        assert_eq!(c.choose(n, true).arm, Stream);
        rec(&mut c, n, Stream, 6_900, None);
        assert_eq!(c.chosen(n), Some(Cma));
        assert_eq!(c.eager_pays(n), Some(false), "the cold 25 us stream would have said otherwise");
    }

    #[test]
    fn reads_in_a_crowd_are_not_measured_and_follow_the_nearest_choice() {
        let mut c = CopyChooser::default();
        assert_eq!(c.choose(1 << 20, false), Choice { arm: Cma, measure: false }, "nothing known: single copy");
        drive(&mut c, 1 << 18, 1_000, 9_000, 500, 6);
        assert_eq!(c.chosen(1 << 18), Some(Stream));
        // The rings carry over to smaller reads only: above, single copy may yet win.
        assert_eq!(c.choose(1 << 16, false), Choice { arm: Stream, measure: false });
        assert_eq!(c.choose(1 << 20, false), Choice { arm: Cma, measure: false });
        assert_eq!(c.chosen(1 << 20), None, "learns for itself");
        // And single copy carries over to larger reads only.
        let mut c = CopyChooser::default();
        drive(&mut c, 1 << 15, 9_000, 1_000, 500, 6);
        assert_eq!(c.chosen(1 << 15), Some(Cma));
        assert_eq!(c.choose(1 << 17, false), Choice { arm: Cma, measure: false });
        assert_eq!(c.chosen(1 << 17), Some(Cma));
        assert_eq!(c.choose(1 << 14, false).arm, Cma, "learning, single copy first");
        assert_eq!(c.chosen(1 << 14), None);
    }

    /// From 1 MiB a crowded first period counts, and a clear difference (25%) decides after
    /// one sample each way; a lone first read does not count, and a close race learns on.
    #[test]
    fn a_large_class_decides_after_one_crowded_period_each_way() {
        let n = 8 << 20;
        let crowd = |c: &mut CopyChooser, arm: Arm, ns: u64| c.record(n, arm, 8 * n as u64, ns, None);
        let mut c = CopyChooser::default();
        crowd(&mut c, Cma, 8_000_000);
        crowd(&mut c, Stream, 14_000_000);
        assert_eq!(c.chosen(n), Some(Cma));
        let mut c = CopyChooser::default();
        crowd(&mut c, Cma, 14_000_000);
        crowd(&mut c, Stream, 8_000_000);
        assert_eq!(c.chosen(n), Some(Stream));
        // Close: two samples each way, as any class.
        let mut c = CopyChooser::default();
        crowd(&mut c, Cma, 10_000_000);
        crowd(&mut c, Stream, 11_000_000);
        assert_eq!(c.chosen(n), None);
        crowd(&mut c, Cma, 10_000_000);
        crowd(&mut c, Stream, 11_000_000);
        assert_eq!(c.chosen(n), Some(Cma));
        // Lone reads (a ping-pong): the cold first one each way is not counted.
        let mut c = CopyChooser::default();
        rec(&mut c, n, Cma, 90_000, None);
        rec(&mut c, n, Stream, 20_000, None);
        assert_eq!(c.chosen(n), None, "nothing counted yet");
        rec(&mut c, n, Cma, 10_000, None);
        rec(&mut c, n, Stream, 20_000, None);
        assert_eq!(c.chosen(n), Some(Cma), "one counted sample each way, clearly apart");
        // Below 1 MiB the rank's first period each way is not counted; then a crowded
        // period decides after one sample each way when clearly apart, and a later class
        // counts its first crowded periods.
        let mut c = CopyChooser::default();
        let crowd_of = |c: &mut CopyChooser, n: usize, arm: Arm, ns: u64| c.record(n, arm, 8 * n as u64, ns, None);
        crowd_of(&mut c, 1 << 19, Cma, 8_000_000);
        crowd_of(&mut c, 1 << 19, Stream, 14_000_000);
        assert_eq!(c.chosen(1 << 19), None, "cold starts");
        crowd_of(&mut c, 1 << 19, Cma, 8_000_000);
        crowd_of(&mut c, 1 << 19, Stream, 14_000_000);
        assert_eq!(c.chosen(1 << 19), Some(Cma));
        crowd_of(&mut c, 1 << 16, Cma, 2_000_000);
        crowd_of(&mut c, 1 << 16, Stream, 1_000_000);
        assert_eq!(c.chosen(1 << 16), Some(Stream), "a later class, clearly apart");
        crowd_of(&mut c, 1 << 17, Cma, 2_000_000);
        crowd_of(&mut c, 1 << 17, Stream, 2_100_000);
        assert_eq!(c.chosen(1 << 17), None, "close: two samples each way, as any class");
        // Lone reads below 1 MiB: the class's cold first one is not counted, and two
        // samples each way decide.
        drive(&mut c, 1 << 18, 9_000, 5_000, 500, 5);
        assert_eq!(c.chosen(1 << 18), None);
        drive(&mut c, 1 << 18, 9_000, 5_000, 500, 1);
        assert_eq!(c.chosen(1 << 18), Some(Cma));
    }

    /// From 1 MiB the rings are chosen only when clearly faster ([`STREAM_MARGIN`]); below,
    /// the faster way wins.
    #[test]
    fn large_reads_take_the_rings_only_when_clearly_faster() {
        let n = 8 << 20;
        for (stream, chosen) in [(9_000_000, Cma), (8_500_000, Cma), (8_000_000, Stream)] {
            let mut c = CopyChooser::default();
            for _ in 0..LEARN {
                c.record(n, Cma, 8 * n as u64, 10_000_000, None);
                c.record(n, Stream, 8 * n as u64, stream, None);
            }
            assert_eq!(c.chosen(n), Some(chosen), "rings {stream} against single copy 10 000 000");
        }
        let mut c = CopyChooser::default();
        let small = 1 << 19;
        for _ in 0..=LEARN {
            c.record(small, Cma, 8 * small as u64, 10_000_000, None);
            c.record(small, Stream, 8 * small as u64, 9_000_000, None);
        }
        assert_eq!(c.chosen(small), Some(Stream));
    }

    #[test]
    fn the_other_way_is_tried_now_and_then_and_a_clear_change_is_followed() {
        let mut c = CopyChooser::default();
        let n = 1 << 19;
        drive(&mut c, n, 40_000, 20_000, 500, 6);
        assert_eq!(c.chosen(n), Some(Cma));
        let ways = drive(&mut c, n, 40_000, 20_000, 500, 1000);
        let tries: Vec<usize> = ways.iter().enumerate().filter(|(_, &a)| a == Stream).map(|(i, _)| i).collect();
        let gaps: Vec<usize> = tries.windows(2).map(|w| w[1] - w[0]).collect();
        assert_eq!(tries[0], 15);
        assert_eq!(&gaps[..5], &[32, 64, 128, 256, 256], "tries back off while the choice holds");
        // Now single copy slows down for good: the choice follows once its kept samples,
        // one period in `SAMPLE_EVERY`, all show it.
        let ways = drive(&mut c, n, 40_000, 60_000, 500, 40);
        assert_eq!(c.chosen(n), Some(Stream));
        let switched = ways.iter().position(|&a| a == Stream).expect("switched");
        assert!(switched <= KEPT * SAMPLE_EVERY as usize, "{ways:?}");
        assert_eq!(ways[switched..].iter().filter(|&&a| a == Cma).count(), 1, "one try back, {ways:?}");
    }

    /// Below `TIE_TO_SINGLE_MIN` a class that chose single copy while the rings ran slow (a
    /// spell of slow cache lines) tries them again after [`PROBE_SINGLE_SMALL`] periods: once
    /// they run fast it follows them within a few periods, and finds that eager pays.
    #[test]
    fn a_small_class_on_single_copy_tries_the_rings_again_soon() {
        let mut c = CopyChooser::default();
        let n = 16 << 10;
        drive(&mut c, n, 9_000, 4_000, 500, 6);
        assert_eq!((c.chosen(n), c.eager_pays(n)), (Some(Cma), Some(false)));
        let ways = drive(&mut c, n, 1_500, 3_000, 500, 3 * PROBE_SINGLE_SMALL as usize);
        assert_eq!(ways.iter().position(|&a| a == Stream), Some(PROBE_SINGLE_SMALL as usize - 1), "{ways:?}");
        assert_eq!((c.chosen(n), c.eager_pays(n)), (Some(Stream), Some(true)), "{ways:?}");
    }

    /// A class that has chosen times its way one period in [`SAMPLE_EVERY`] and in the
    /// [`KEPT`] periods before each try of the other way; an untimed period reads no clock.
    #[test]
    fn a_chosen_way_is_timed_now_and_then() {
        let mut c = CopyChooser::default();
        // From `TIE_TO_SINGLE_MIN`: below, single copy tries the rings sooner.
        let n = TIE_TO_SINGLE_MIN;
        drive(&mut c, n, 40_000, 20_000, 500, 6);
        assert_eq!(c.chosen(n), Some(Cma));
        let timed: Vec<(usize, Arm)> = (1..=PROBE_FIRST as usize)
            .filter_map(|i| {
                let ch = c.choose(n, true);
                ch.measure.then_some((i, ch.arm))
            })
            .collect();
        assert_eq!(timed, [(4, Cma), (8, Cma), (12, Cma), (13, Cma), (14, Cma), (15, Cma), (16, Stream)]);
        let mut e = Epochs::default();
        let t = Stamp::now();
        for i in 0..6 {
            let p = e.start(n, 0, || t);
            e.finish(n, p, true, || t + Duration::from_micros(if p.arm == Cma { 2 } else { 4 } + i));
        }
        assert_eq!(e.chooser().chosen(n), Some(Cma));
        let p = e.start(n, 0, || panic!("an untimed period read the clock"));
        e.granted(p, || panic!("an untimed grant read the clock"));
        e.finish(n, p, true, || panic!("an untimed end read the clock"));
    }

    /// A window of reads in flight together is one period, timed as a whole and moved one
    /// way; a ping-pong is a period per read.
    #[test]
    fn a_busy_period_is_timed_as_a_whole() {
        let mut e = Epochs::default();
        let t = Stamp::now();
        let at = |us: u64| t + Duration::from_micros(us);
        let n = 256 << 10;
        // Four windows of 8 reads: single copy moves a window in 100 us, the rings in 200 us
        // (the first each way a cold start, then one sample each way, clearly apart).
        let mut ways = Vec::new();
        for w in 0..4u64 {
            let start = w * 1000;
            let placed: Vec<Placed> = (0..8).map(|_| e.start(n, 0, || at(start))).collect();
            assert!(placed.iter().all(|p| p.arm == placed[0].arm && p.in_epoch), "one way for the whole window");
            let took = if placed[0].arm == Cma { 100 } else { 200 };
            for p in placed.iter().skip(1) {
                e.finish(n, *p, true, || at(start + took / 2));
            }
            assert_eq!(e.chooser().chosen(n), None, "a period ends with its last read");
            e.finish(n, placed[0], true, || at(start + took));
            ways.push(placed[0].arm);
        }
        assert_eq!(ways, [Cma, Stream, Cma, Stream]);
        assert_eq!(e.chooser().chosen(n), Some(Cma));
        // The next window goes single copy; a read of another class joining it is not part of
        // it (it follows its own class's, here the nearest, choice) and spoils its timing.
        let a = e.start(n, 0, || at(9000));
        assert_eq!(a.arm, Cma);
        let b = e.start(4 << 20, 0, || at(9001));
        assert!(!b.in_epoch);
        assert_eq!(b.arm, Cma);
        e.finish(4 << 20, b, true, || at(9500));
        e.finish(n, a, true, || at(9600));
        // Heap-served or failed reads spoil their period too, and a new one starts after.
        let a = e.start(n, 0, || at(10_000));
        e.spoil(a);
        e.finish(n, a, true, || at(10_010));
        assert!(e.start(n, 0, || at(11_000)).in_epoch);
    }

    /// A paired rank learns by turns whether or not a peer reads the class back, except from
    /// 256 KiB up to the non-temporal class, where a class read both ways starts on single
    /// copy.
    #[test]
    fn paired_classes_from_256_kib_start_on_single_copy() {
        let n = 16 << 10;
        // Reads of 256 KiB and up read back: single copy once that is seen, but by turns from
        // the class where the rings' copy-out turns to streaming stores.
        let big = 256 << 10;
        for (mut e, n, peer, want) in [
            (Epochs::paired(), n, false, [Cma, Stream, Cma, Stream]),
            (Epochs::paired(), n, true, [Cma, Stream, Cma, Stream]),
            (Epochs::default(), n, true, [Cma, Stream, Cma, Stream]),
            (Epochs::paired(), big, false, [Cma, Stream, Cma, Stream]),
            (Epochs::paired(), big, true, [Cma, Cma, Cma, Cma]),
            (Epochs::paired().streaming_from(big), big, true, [Cma, Stream, Cma, Stream]),
            (Epochs::paired().streaming_from(2 * big), big, true, [Cma, Cma, Cma, Cma]),
        ] {
            let ways: Vec<Arm> = (0..4u64)
                .map(|k| {
                    let at = Stamp(k * 10);
                    let p = e.start(n, 0, || at);
                    if peer {
                        e.peer_read(p.arm, n, 0, false);
                    }
                    e.finish(n, p, true, || Stamp(at.0 + 5));
                    p.arm
                })
                .collect();
            assert_eq!(ways, want, "{n} bytes, peer reading: {peer}");
        }
        let mut e = Epochs::paired();
        let p = e.start(big, 0, || Stamp(0));
        e.peer_read(Stream, big, 0, false);
        e.finish(big, p, true, || Stamp(5));
        e.start(big, 0, || Stamp(10));
        assert_eq!(e.chooser().chosen(big), Some(Cma), "taken as if from another class");
    }

    /// A period that a higher-ranked peer's reads of its class crossed chooses the next
    /// period's way when it ends, and that is what is told; the follower reads the class the
    /// way it was told, untimed. Nothing is told for a lower peer or by a rank not paired;
    /// nothing is followed by the latter either.
    #[test]
    fn the_lower_rank_tells_its_next_way_and_the_higher_follows() {
        let big = 32 << 20;
        let nt = || Epochs::paired().streaming_from(256 << 10);
        let period = |e: &mut Epochs, n: usize, k: u64, lower: bool| {
            let p = e.start(n, 0, || Stamp(k * 10));
            e.peer_read(p.arm, n, 0, lower);
            let told = e.finish(n, p, true, || Stamp(k * 10 + 5));
            (p, told)
        };
        // The leader learns by turns, single copy first, and tells each next way in turn.
        let mut e = nt();
        for (k, (now, next)) in [(Cma, Stream), (Stream, Cma), (Cma, Stream)].into_iter().enumerate() {
            let (p, told) = period(&mut e, big, k as u64, false);
            assert_eq!((p.arm, p.in_epoch), (now, true));
            assert_eq!(told, Some((class_of(big), next)), "period {k}");
        }
        // ...and its next period goes the way it told.
        assert_eq!(e.start(big, 0, || Stamp(100)).arm, Stream);
        // Small classes lead too; a lower peer, or a rank not paired: nothing told.
        let small = 16 << 10;
        assert_eq!(period(&mut nt(), small, 0, false).1, Some((class_of(small), Stream)));
        for (mut e, lower) in [(nt(), true), (Epochs::default(), false)] {
            assert_eq!(period(&mut e, big, 0, lower).1, None, "lower: {lower}");
        }
        // The follower reads the way it was told, untimed, and spoils a period that runs.
        let mut e = nt();
        let a = e.start(big, 0, || Stamp(0));
        e.lead(class_of(big), Stream, 0);
        let b = e.start(big, 0, || Stamp(1));
        assert_eq!((b.arm, b.in_epoch), (Stream, false));
        e.finish(big, b, true, || Stamp(2));
        e.finish(big, a, true, || Stamp(3));
        assert_eq!(e.chooser().classes[class_of(big)].tries, [0, 0], "not timed");
        e.lead(class_of(big), Cma, 0);
        assert_eq!(e.start(big, 0, || Stamp(4)).arm, Cma);
        // A small class follows too; a rank not paired goes its own way.
        let mut e = nt();
        e.lead(class_of(small), Stream, 0);
        assert_eq!(e.start(small, 0, || Stamp(0)), Placed { arm: Stream, in_epoch: false });
        let mut e = Epochs::default();
        e.lead(class_of(big), Stream, 0);
        assert_eq!(e.start(big, 0, || Stamp(0)), Placed { arm: Cma, in_epoch: true });
    }

    /// A follower follows its leader's way for reads of the class from the leader only; reads
    /// from another peer take its own periods. Past `LEAD_UNMET_MAX` reads from the leader
    /// that the leader's reads of the class from it did not meet, it learns for itself again;
    /// while the leader keeps reading the class, it keeps following.
    #[test]
    fn a_follower_follows_its_leader_only_while_the_two_read_from_each_other() {
        let big = 32 << 20;
        let (leader, third) = (0, 2);
        let mut e = Epochs::paired().streaming_from(256 << 10);
        e.lead(class_of(big), Stream, leader);
        assert!(e.follows(big, leader) && !e.follows(big, third) && !e.follows(16 << 10, leader));
        // A read from the third rank is this rank's own: timed, single copy first.
        let p = e.start(big, third, || Stamp(0));
        assert_eq!(p, Placed { arm: Cma, in_epoch: true });
        e.finish(big, p, true, || Stamp(5));
        assert_eq!(e.chooser().classes[class_of(big)].tries, [0, 1], "timed");
        // Reads from the leader met by its reads of the class keep following.
        for k in 0..4 * LEAD_UNMET_MAX as u64 {
            let p = e.start(big, leader, || Stamp(10 + k));
            assert_eq!(p, Placed { arm: Stream, in_epoch: false }, "read {k}");
            if k % 64 == 63 {
                e.peer_read(Stream, big, leader, true);
                e.peer_read(Stream, big, third, false);
            }
            e.finish(big, p, true, || Stamp(10 + k));
        }
        // The leader's reads of another class, or a third rank's, do not meet them.
        e.peer_read(Stream, big, leader, true);
        for k in 0..LEAD_UNMET_MAX as u64 {
            e.peer_read(Stream, big, third, false);
            e.peer_read(Stream, 16 << 10, leader, true);
            let p = e.start(big, leader, || Stamp(10_000 + k));
            assert_eq!(p, Placed { arm: Stream, in_epoch: false }, "read {k}");
            e.finish(big, p, true, || Stamp(10_000 + k));
        }
        let p = e.start(big, leader, || Stamp(20_000));
        assert!(p.in_epoch && !e.follows(big, leader), "learns for itself again");
        e.finish(big, p, true, || Stamp(20_005));
        // Told again, it follows again.
        e.lead(class_of(big), Cma, leader);
        assert_eq!(e.start(big, leader, || Stamp(30_000)), Placed { arm: Cma, in_epoch: false });
    }

    /// While a paired rank's class below 256 KiB learns, a period that a peer's reads of its
    /// class the other way crossed is not counted, at most `CROSSED_MAX` times; the peer's
    /// reads of the same way or of another class do not cross it, and a rank not paired
    /// counts every period.
    #[test]
    fn a_crossed_learning_period_is_not_counted() {
        let n = 16 << 10;
        let slot = 1u64 << 20;
        // Periods by turns, the way uncounted ones repeat; the peer reads `peer` in each.
        let run = |e: &mut Epochs, periods: u64, peer: &dyn Fn(Arm) -> Option<(Arm, usize)>| {
            for k in 0..periods {
                let at = Stamp(k * slot);
                let p = e.start(n, 0, || at);
                if let Some((arm, m)) = peer(p.arm) {
                    e.peer_read(arm, m, 0, false);
                }
                e.finish(n, p, true, || Stamp(at.0 + if p.arm == Cma { 4000 } else { 3000 }));
            }
        };
        let other = |a: Arm| a.other();
        // Six periods each crossed: none counted (two of each way would decide otherwise).
        let mut e = Epochs::paired();
        run(&mut e, 6, &|a| Some((other(a), n)));
        assert_eq!(e.chooser().chosen(n), None);
        // Past CROSSED_MAX they count (two more left out, then a first each way, then two).
        run(&mut e, 8, &|a| Some((other(a), n)));
        assert_eq!(e.chooser().chosen(n), Some(Stream));
        // The peer reading the same way, another class, or a rank not paired: counted.
        for (mut e, peer) in [
            (Epochs::paired(), Box::new(|a: Arm| Some((a, n))) as Box<dyn Fn(Arm) -> Option<(Arm, usize)>>),
            (Epochs::paired(), Box::new(|a: Arm| Some((other(a), 4 * n)))),
            (Epochs::default(), Box::new(|a: Arm| Some((other(a), n)))),
        ] {
            run(&mut e, 6, &*peer);
            assert_eq!(e.chooser().chosen(n), Some(Stream));
        }
    }

    #[test]
    fn a_close_race_does_not_flap() {
        let mut c = CopyChooser::default();
        let n = 1 << 18;
        drive(&mut c, n, 10_100, 10_000, 500, 6);
        assert_eq!(c.chosen(n), Some(Cma));
        // The stream is now 2% faster than single copy's best: not enough to change.
        drive(&mut c, n, 9_800, 10_000, 500, 100);
        assert_eq!(c.chosen(n), Some(Cma));
        // A close race still carries over where it holds: single copy to larger classes.
        c.choose(n * 4, true);
        assert_eq!(c.chosen(n * 4), Some(Cma));
        assert_eq!(c.chosen(n / 4), None, "the smaller learn for themselves");
    }

    #[test]
    fn eager_pays_where_the_stream_less_its_request_beats_single_copy() {
        let mut c = CopyChooser::default();
        assert_eq!(c.eager_pays(40_000), None, "still learning");
        // Stream 5.0 us, single copy 3.4 us with a 0.5 us round trip: rendezvous pays.
        drive(&mut c, 40_000, 5_000, 3_400, 500, 6);
        assert_eq!(c.eager_pays(40_000), Some(false));
        // A class that took the choice over is not compared until it tried the rings.
        assert_eq!(c.choose(80_000, true).arm, Cma);
        assert_eq!(c.eager_pays(80_000), None);
        // Stream 4.1 us (3.57 with the eager credit), single copy 3.4 us: the eager copy
        // (3.57 - 0.25) is no slower.
        let mut c = CopyChooser::default();
        drive(&mut c, 80_000, 4_100, 3_400, 500, 6);
        assert_eq!(c.chosen(80_000), Some(Cma));
        assert_eq!(c.eager_pays(80_000), Some(true));
        // Reads through the rings: eager pays in that class; one that takes the choice over
        // says so only once it has tried single copy itself, and only if the rings still win.
        let mut c = CopyChooser::default();
        drive(&mut c, 140_000, 3_000, 6_000, 500, 6);
        assert_eq!(c.eager_pays(140_000), Some(true));
        assert_eq!(c.choose(40_000, true).arm, Stream);
        assert_eq!(c.eager_pays(40_000), None, "taken over, not yet compared");
        for _ in 0..2 {
            rec(&mut c, 40_000, Stream, 4_000, None);
            rec(&mut c, 40_000, Cma, 2_000, Some(500));
        }
        assert_eq!(c.eager_pays(40_000), Some(false), "single copy won here");
        let mut c = CopyChooser::default();
        drive(&mut c, 140_000, 3_000, 6_000, 500, 6);
        c.choose(40_000, true);
        for _ in 0..2 {
            rec(&mut c, 40_000, Stream, 1_000, None);
            rec(&mut c, 40_000, Cma, 2_000, None);
        }
        assert_eq!(c.eager_pays(40_000), Some(true));
    }
}
