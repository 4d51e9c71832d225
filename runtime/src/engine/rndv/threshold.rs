//! Where rendezvous starts, per destination: `TMPI_RNDV_THRESHOLD`, or with `auto` a low start
//! towards the ranks of this host that a receiver raises where it measured eager to pay
//! ([`Control::EagerBelow`], see [`adapt`]), never above the configured ceiling.

use super::*;

/// The threshold stage: the sender's cut-over per destination and the receiver's advice.
pub(in crate::engine) struct Threshold {
    /// Sender side, per destination: messages of at least this many bytes go by rendezvous.
    from: Vec<usize>,
    /// Receiver side: `TMPI_RNDV_THRESHOLD` is auto (senders of this host may start low and
    /// are advised), and the highest `Control::EagerBelow` sent to each peer.
    adaptive: bool,
    advised: Vec<usize>,
    /// Messages of at least this many bytes always go by rendezvous, whatever a receiver
    /// advises (`Config::advice_ceiling`).
    ceiling: usize,
}

impl Threshold {
    /// The cut-over of rank `rank` towards each of `size` ranks: rendezvous starts low towards
    /// the peers single copy reaches (`local`) while the job does not outnumber the cores (a
    /// rank that must wait its turn for a core to serve a read is better sent eagerly).
    pub(in crate::engine) fn new(cfg: &Config, rank: usize, local: &[bool], oversubscribed: bool) -> Self {
        let from = local
            .iter()
            .enumerate()
            .map(|(d, &near)| {
                let low = cfg.rndv_adaptive() && d != rank && !oversubscribed && near;
                if low {
                    adapt::RNDV_LOW.min(cfg.rndv_ceiling())
                } else {
                    cfg.rndv_ceiling()
                }
            })
            .collect();
        Threshold { from, adaptive: cfg.rndv_adaptive(), advised: vec![0; local.len()], ceiling: cfg.advice_ceiling() }
    }

    /// Whether a message of `len` bytes to `dest` is below its rendezvous start.
    #[inline(always)]
    pub(in crate::engine) fn eager_below(&self, dest: usize, len: usize) -> bool {
        self.from.get(dest).is_some_and(|&t| len < t)
    }

    /// Messages to `dest` of at least this many bytes go by rendezvous.
    #[cfg(test)]
    pub(in crate::engine) fn rndv_from(&self, dest: usize) -> usize {
        self.from[dest]
    }

    /// `src` advised eager below `bytes`: the start is raised to it (never lowered, never
    /// above the ceiling).
    pub(in crate::engine) fn raise(&mut self, src: usize, bytes: usize) {
        let ceiling = self.ceiling;
        if let Some(t) = self.from.get_mut(src) {
            *t = (*t).max(bytes.min(ceiling));
        }
    }

    /// The advice sent to `src` so far.
    #[cfg(test)]
    pub(in crate::engine) fn advised(&self, src: usize) -> usize {
        self.advised[src]
    }

    /// Whether the threshold is auto.
    #[cfg(test)]
    pub(in crate::engine) fn adaptive(&self) -> bool {
        self.adaptive
    }

    /// The starts towards every rank.
    #[cfg(test)]
    pub(in crate::engine) fn starts(&self) -> &[usize] {
        &self.from
    }
}

impl State {
    /// `TMPI_RNDV_THRESHOLD=auto`: a rendezvous read of `n` bytes from `src` ended; if this rank
    /// has found that eager pays for messages of that size (or single copy is impossible,
    /// which leaves the rings either way), it tells `src` to send them eagerly
    /// ([`Control::EagerBelow`], once per size).
    pub(super) fn advise(&mut self, src: usize, n: usize) {
        if !self.threshold.adaptive || n >= self.threshold.ceiling {
            return;
        }
        let below = adapt::class_end(n).min(self.threshold.ceiling);
        if self.advised_up_to(src, below) {
            return;
        }
        let eager = if self.ways.cma_to(src) { self.ways.copy.eager_pays(n) } else { Some(true) };
        if eager == Some(true) {
            self.tell_eager_below(src, below);
        }
    }
    /// Whether `src` was told to send eagerly below `below` or more already (or is no rank).
    fn advised_up_to(&self, src: usize, below: usize) -> bool {
        self.threshold.advised.get(src).is_none_or(|&a| a >= below)
    }
    /// Tells `src` to send messages below `below` eagerly ([`Control::EagerBelow`]).
    fn tell_eager_below(&mut self, src: usize, below: usize) {
        self.threshold.advised[src] = below;
        self.outbox.control(src, Control::EagerBelow { bytes: below as u32 });
    }
    /// `TMPI_RNDV_THRESHOLD=auto`: lower-ranked `src`, which leads this rank's reads of a
    /// size class (both read it from each other, see [`adapt::Epochs::lead`]), found that
    /// eager pays for messages below `below`. A follower times none of its reads, so it
    /// would never find that itself: it advises `src` the same, for the pair's two
    /// directions move alike (`osu_bibw` 256 KiB: 51-53 GB/s with one direction eager, 33-36
    /// with both by rendezvous).
    pub(in crate::engine) fn advise_as_led(&mut self, src: usize, below: usize) {
        let below = below.min(self.threshold.ceiling);
        if !self.threshold.adaptive
            || src >= self.rank
            || below == 0
            || !self.ways.copy.follows(below - 1, src)
            || self.advised_up_to(src, below)
        {
            return;
        }
        self.tell_eager_below(src, below);
    }
}
