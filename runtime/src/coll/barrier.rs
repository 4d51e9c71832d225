//! Barrier: dissemination, and the fan-in / fan-out trees the node-aware barrier is made of.

use super::plan::{Grp, Plan, Span};

/// Dissemination barrier on `g` (Hensgen/Finkel/Manber): in round `k` each member sends an
/// empty message to `me + 2^k` and waits for one from `me - 2^k` (mod n), `ceil(log2 n)`
/// rounds for any n. A member leaves only after it has, transitively, heard from every other.
pub(crate) fn plan_dissemination(p: &mut Plan, g: Grp<'_>, tag: u32) {
    let (me, n) = (g.me, g.n);
    let mut d = 1;
    while d < n {
        p.round([
            super::plan::Action::Send { s: Span::empty(), dest: g.rank((me + d) % n), tag },
            super::plan::Action::Recv { s: Span::empty(), src: g.rank((me + n - d) % n), tag },
        ]);
        d <<= 1;
    }
}
