//! Schedules: what one rank does in one collective call, round by round.
//!
//! Every collective algorithm is written once, as a planner that fills a [`Plan`]: rounds of
//! sends, receives and local steps (copies and reductions) on spans of three kinds of buffer,
//! the user's send buffer ([`Buf::In`], read only), the user's receive buffer ([`Buf::Out`])
//! and scratch buffers the plan asks for ([`Buf::Temp`]). The same plan is then either run to
//! completion by a blocking call or handed to the engine, which progresses it while the
//! program does other things (a non-blocking call); see [`crate::nbc`]'s `Sched`, and the
//! thread harness of the unit tests, which runs plans with sends that block until they are
//! matched.
//!
//! # What a round means
//!
//! A round's actions are taken in order when the round starts: local steps run at once,
//! transfers are posted. The round ends when all its transfers have completed, and the next
//! one starts. So a step that needs data received in round `k` goes at the head of round
//! `k + 1`, and a span sent in round `k` may be written again from round `k + 1` on.
//! [`Plan::check`] enforces the rules this implies (see there); every executor runs it.
//!
//! # Errors inside a plan
//!
//! A receive must bring exactly the bytes its span expects. Normally the first failed transfer
//! ends the call with its error. A *tolerant* plan (the variable-count collectives, whose
//! ranks must not strand each other when one of them passed bad arguments) instead records the
//! first error and goes on with every later send empty, every later receive taking whatever
//! comes and every local step skipped, so that each rank still takes its part in every round;
//! the call then ends with that error. [`Plan::fail_locally`] starts a plan in that state.

use std::ops::Range;

use crate::error::{Error, Result};

/// Combines `from` into `acc` (`acc = from op acc` when the flag is set, else `acc op from`),
/// both holding the same number of elements of the collective's type, as bytes.
pub(crate) type ReduceFn = Box<dyn Fn(&[u8], &mut [u8], bool) -> Result<()> + Send + Sync>;

/// Which buffer a span lies in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Buf {
    /// The user's send buffer (read only).
    In,
    /// The user's receive buffer.
    Out,
    /// Scratch buffer `i` of the plan.
    Temp(usize),
}

/// A byte range of a buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Span {
    pub(crate) buf: Buf,
    pub(crate) off: usize,
    pub(crate) len: usize,
}

impl Span {
    pub(crate) const fn new(buf: Buf, off: usize, len: usize) -> Self {
        Span { buf, off, len }
    }

    /// A span of no bytes (the messages of a barrier).
    pub(crate) const fn empty() -> Self {
        Span { buf: Buf::In, off: 0, len: 0 }
    }

    /// Bytes `r` of this span (relative to its start), clipped to it.
    pub(crate) fn sub(self, r: Range<usize>) -> Span {
        let lo = r.start.min(self.len);
        let hi = r.end.clamp(lo, self.len);
        Span { buf: self.buf, off: self.off + lo, len: hi - lo }
    }

    fn overlaps(&self, o: &Span) -> bool {
        self.buf == o.buf && self.len > 0 && o.len > 0 && self.off < o.off + o.len && o.off < self.off + self.len
    }
}

/// Bytes `off..off + len` of the user's receive buffer.
pub(crate) const fn out(off: usize, len: usize) -> Span {
    Span::new(Buf::Out, off, len)
}

/// Bytes `off..off + len` of the user's send buffer.
pub(crate) const fn inp(off: usize, len: usize) -> Span {
    Span::new(Buf::In, off, len)
}

/// One step of a round.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Action {
    /// Send the span to comm rank `dest` with collective tag `tag` (8 bits).
    Send { s: Span, dest: usize, tag: u32 },
    /// Receive exactly `s.len` bytes from comm rank `src` into the span.
    Recv { s: Span, src: usize, tag: u32 },
    /// Copy `from` to `to` (same length; may overlap).
    Copy { from: Span, to: Span },
    /// Combine `from` into `acc` with the plan's reduction (`left`: `from` is the left operand).
    Reduce { from: Span, acc: Span, left: bool },
}

impl Action {
    fn is_transfer(&self) -> bool {
        matches!(self, Action::Send { .. } | Action::Recv { .. })
    }

    /// The spans the action reads and the one it writes.
    fn spans(&self) -> (Option<Span>, Option<Span>, Option<Span>) {
        match *self {
            Action::Send { s, .. } => (Some(s), None, None),
            Action::Recv { s, .. } => (None, None, Some(s)),
            Action::Copy { from, to } => (Some(from), None, Some(to)),
            Action::Reduce { from, acc, .. } => (Some(from), Some(acc), Some(acc)),
        }
    }
}

/// What one rank does in a collective call, round by round (see the module docs).
pub(crate) struct Plan {
    acts: Vec<Action>,
    /// End (exclusive index into `acts`) of each closed round.
    ends: Vec<usize>,
    /// Sizes in bytes of the scratch buffers.
    pub(crate) temps: Vec<usize>,
    /// The reduction the plan's [`Action::Reduce`] steps apply.
    pub(crate) reduce: Option<ReduceFn>,
    /// The plan goes on after a failed transfer (see the module docs).
    pub(crate) tolerant: bool,
    /// An error this rank found before the call started: it takes its part with empty
    /// messages and returns this error at the end.
    pub(crate) error: Option<Error>,
}

impl std::fmt::Debug for Plan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Plan").field("rounds", &self.rounds().collect::<Vec<_>>()).field("temps", &self.temps).finish()
    }
}

impl Default for Plan {
    fn default() -> Self {
        Self::new()
    }
}

impl Plan {
    pub(crate) fn new() -> Self {
        Plan { acts: Vec::new(), ends: Vec::new(), temps: Vec::new(), reduce: None, tolerant: false, error: None }
    }

    /// A plan combining with `f`.
    pub(crate) fn reducing(f: ReduceFn) -> Self {
        Plan { reduce: Some(f), ..Plan::new() }
    }

    /// A new scratch buffer of `len` bytes; returns its whole span.
    pub(crate) fn temp(&mut self, len: usize) -> Span {
        self.temps.push(len);
        Span::new(Buf::Temp(self.temps.len() - 1), 0, len)
    }

    /// Appends an action to the open round.
    pub(crate) fn push(&mut self, a: Action) {
        self.acts.push(a);
    }

    /// Appends a send to the open round.
    pub(crate) fn send(&mut self, s: Span, dest: usize, tag: u32) {
        self.push(Action::Send { s, dest, tag });
    }

    /// Appends a receive to the open round.
    pub(crate) fn recv(&mut self, s: Span, src: usize, tag: u32) {
        self.push(Action::Recv { s, src, tag });
    }

    /// Appends a copy to the open round (nothing when the spans are empty or the same).
    pub(crate) fn copy(&mut self, from: Span, to: Span) {
        if from.len > 0 && from != to {
            self.push(Action::Copy { from, to });
        }
    }

    /// Appends a reduction step to the open round.
    pub(crate) fn combine(&mut self, from: Span, acc: Span, left: bool) {
        if from.len > 0 {
            self.push(Action::Reduce { from, acc, left });
        }
    }

    /// Closes the open round (nothing when it is empty).
    pub(crate) fn next(&mut self) {
        if self.acts.len() > self.ends.last().copied().unwrap_or(0) {
            self.ends.push(self.acts.len());
        }
    }

    /// Appends a whole round.
    pub(crate) fn round(&mut self, actions: impl IntoIterator<Item = Action>) {
        self.next();
        self.acts.extend(actions);
        self.next();
    }

    /// The call fails on this rank with `e`, which still takes its part (see the module docs).
    pub(crate) fn fail_locally(&mut self, e: Error) {
        self.tolerant = true;
        self.error.get_or_insert(e);
    }

    /// Closes the open round; the actions of round `i` are `round_range(i)`.
    pub(crate) fn finish(&mut self) {
        self.next();
    }

    /// Number of closed rounds.
    pub(crate) fn len(&self) -> usize {
        self.ends.len()
    }

    /// The actions of round `i`.
    pub(crate) fn round_acts(&self, i: usize) -> &[Action] {
        let lo = if i == 0 { 0 } else { self.ends[i - 1] };
        &self.acts[lo..self.ends[i]]
    }

    /// The closed rounds, in order.
    pub(crate) fn rounds(&self) -> impl Iterator<Item = &[Action]> {
        (0..self.ends.len()).map(|i| self.round_acts(i))
    }

    /// Checks the rules that make a round safe to run with its transfers in flight together:
    /// no two receives, and no receive and send, of one round overlap; and an action after a
    /// transfer in its round neither reads what that transfer receives nor writes what it
    /// sends or receives (local steps before it may: they run before it is posted). A copy
    /// or reduction reads and writes spans of equal length, a reduction two spans that do not
    /// overlap; nothing writes into the send buffer. Closes the open round first.
    ///
    /// # Errors
    /// [`Error::State`] naming the round and the rule (a planner's bug, never the user's).
    pub(crate) fn check(&mut self) -> Result<()> {
        self.next();
        for (i, round) in self.rounds().enumerate() {
            check_round(round).map_err(|what| Error::State(format!("collective schedule, round {i}: {what} ({round:?})")))?;
        }
        if self.acts.len() != self.ends.last().copied().unwrap_or(0) {
            return Err(Error::State("collective schedule: actions after the last round".into()));
        }
        Ok(())
    }
}

fn check_round(round: &[Action]) -> std::result::Result<(), &'static str> {
    for (j, a) in round.iter().enumerate() {
        let (reads, reads2, writes) = a.spans();
        if writes.is_some_and(|w| w.buf == Buf::In && w.len > 0) {
            return Err("a write into the send buffer");
        }
        match *a {
            Action::Copy { from, to } if from.len != to.len => return Err("a copy between spans of different lengths"),
            Action::Reduce { from, acc, .. } if from.len != acc.len || from.overlaps(&acc) => {
                return Err("a reduction between overlapping or unequal spans")
            }
            _ => {}
        }
        for t in round[..j].iter().filter(|t| t.is_transfer()) {
            match *t {
                Action::Recv { s, .. } => {
                    let touches = |x: Option<Span>| x.is_some_and(|x| x.overlaps(&s));
                    if touches(reads) || touches(reads2) || touches(writes) {
                        return Err("an action touches what an earlier transfer of its round receives");
                    }
                }
                Action::Send { s, .. } if writes.is_some_and(|w| w.overlaps(&s)) => {
                    return Err("an action writes what an earlier transfer of its round sends");
                }
                _ => {}
            }
        }
    }
    Ok(())
}

/// A group of ranks of a communicator that an algorithm runs on: the whole communicator, or
/// a part of it (the ranks of one host, or one rank per host), as a list of comm ranks.
/// Algorithms number the members `0..n` ("group ranks") and map them back with
/// [`Grp::rank`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct Grp<'a> {
    /// This rank's index in the group.
    pub(crate) me: usize,
    /// Number of members.
    pub(crate) n: usize,
    /// Comm rank of each member; `None`: member `i` is comm rank `i`.
    list: Option<&'a [usize]>,
}

impl<'a> Grp<'a> {
    /// The whole communicator.
    pub(crate) const fn all(rank: usize, size: usize) -> Self {
        Grp { me: rank, n: size, list: None }
    }

    /// The group of the comm ranks `list`, this rank being member `me`.
    pub(crate) fn of(me: usize, list: &'a [usize]) -> Self {
        Grp { me, n: list.len(), list: Some(list) }
    }

    /// Comm rank of member `i`.
    #[inline]
    pub(crate) fn rank(&self, i: usize) -> usize {
        match self.list {
            None => i,
            Some(l) => l[i],
        }
    }
}

/// Largest power of two `<= n` (0 for 0).
pub(crate) fn pof2_floor(n: usize) -> usize {
    if n == 0 {
        0
    } else {
        1 << (usize::BITS - 1 - n.leading_zeros())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(i: usize, off: usize, len: usize) -> Span {
        Span::new(Buf::Temp(i), off, len)
    }

    /// The rules of [`Plan::check`], one case each.
    #[test]
    fn check_states_the_round_rules() {
        let cases: Vec<(Vec<Action>, bool)> = vec![
            // Send and receive of disjoint spans, or of different buffers: fine.
            (vec![Action::Send { s: out(0, 8), dest: 1, tag: 1 }, Action::Recv { s: out(8, 8), src: 1, tag: 1 }], true),
            // A local step before the transfers may touch anything.
            (vec![Action::Copy { from: inp(0, 8), to: out(0, 8) }, Action::Send { s: out(0, 8), dest: 1, tag: 1 }], true),
            // Two sends of one span: fine (reads only).
            (vec![Action::Send { s: out(0, 8), dest: 1, tag: 1 }, Action::Send { s: out(0, 8), dest: 2, tag: 1 }], true),
            // A receive overlapping a send of its round.
            (vec![Action::Send { s: out(0, 8), dest: 1, tag: 1 }, Action::Recv { s: out(4, 8), src: 1, tag: 1 }], false),
            // Two receives into one span.
            (vec![Action::Recv { s: t(0, 0, 8), src: 1, tag: 1 }, Action::Recv { s: t(0, 0, 8), src: 2, tag: 1 }], false),
            // Reading what a receive of the round brings.
            (vec![Action::Recv { s: t(0, 0, 8), src: 1, tag: 1 }, Action::Reduce { from: t(0, 0, 8), acc: out(0, 8), left: false }], false),
            // Writing what a send of the round sends.
            (vec![Action::Send { s: out(0, 8), dest: 1, tag: 1 }, Action::Copy { from: inp(0, 8), to: out(0, 8) }], false),
            // Writing into the send buffer, copies of unequal lengths, overlapping reductions.
            (vec![Action::Recv { s: inp(0, 8), src: 1, tag: 1 }], false),
            (vec![Action::Copy { from: inp(0, 8), to: out(0, 4) }], false),
            (vec![Action::Reduce { from: out(0, 8), acc: out(4, 8), left: true }], false),
        ];
        for (i, (acts, ok)) in cases.into_iter().enumerate() {
            let mut p = Plan::new();
            p.round(acts);
            assert_eq!(p.check().is_ok(), ok, "case {i}: {p:?}");
        }
    }

    #[test]
    fn rounds_close_and_empty_rounds_vanish() {
        let mut p = Plan::new();
        p.next();
        p.send(Span::empty(), 1, 1);
        p.next();
        p.next();
        p.recv(Span::empty(), 1, 1);
        p.finish();
        assert_eq!(p.len(), 2);
        assert!(matches!(p.round_acts(1), [Action::Recv { .. }]));
        assert_eq!(out(4, 10).sub(2..6), out(6, 4));
        assert_eq!(out(4, 10).sub(8..20), out(12, 2));
    }
}
