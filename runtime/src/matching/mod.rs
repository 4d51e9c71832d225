//! MPI tag matching in software: the 64-bit match key and two matchers behind one trait.
//!
//! - [`SwMatcher`] (`sw.rs`): the one the runtime uses. Exact receives live in hash buckets keyed
//!   by the full tag; each of MPI's three wildcard forms (`ANY_SOURCE` with a tag, a source with
//!   `ANY_TAG`, both wildcards) in its own hash map keyed by `(context, tag)`, `(context, source)`
//!   or the context; unexpected messages in the buckets plus one arrival-ordered list and, per
//!   wildcard form in use, an index by the same keys. Posts, arrivals and probes of every MPI
//!   form are O(1) however deep the queues are; only receives with a non-MPI mask are scanned.
//! - [`RefMatcher`] (`reference.rs`): plain linear scans over two lists, obviously correct; the
//!   model the fast one is tested against, operation by operation.
//!
//! Both are pure state machines (no I/O, no clock, no threads), generic over the caller's handle
//! for a posted receive (`R`) and for a stored message (`M`).
//!
//! # The match key
//!
//! A message carries one `u64`: `[context id: 20 bits][source rank: 20 bits][user tag: 24 bits]`
//! (the Open MPI pml/ucx layout). A receive is a `(tag, mask)` pair and matches a message iff
//! `msg_tag & mask == recv_tag & mask`. [`recv_key`] builds it: `ANY_SOURCE` clears the source
//! bits of the mask, `ANY_TAG` the tag bits; the context bits are always in the mask, so traffic
//! on different communicators (and the runtime's internal contexts) never mixes.
//!
//! ```
//! use tmpi::matching::{encode_tag, recv_key, Arrived, Matcher, Posted, SwMatcher};
//!
//! let mut m: SwMatcher<&str, &str> = SwMatcher::new();
//! // Rank 3 sends tag 7 on context 1 before anyone asked for it: it is unexpected.
//! assert!(matches!(m.arrive(encode_tag(1, 3, 7), "hello"), Arrived::Unexpected));
//! // A receive from any source with tag 7 on context 1 takes it.
//! let (tag, mask) = recv_key(1, None, Some(7));
//! assert!(matches!(m.post(tag, mask, "recv A"), Posted::Matched("recv A", "hello")));
//! // A receive with nothing to match is queued, and the next arrival goes to it.
//! let (tag, mask) = recv_key(1, Some(3), None);
//! let Posted::Queued(id) = m.post(tag, mask, "recv B") else { unreachable!() };
//! assert!(matches!(m.arrive(encode_tag(1, 3, 9), "world"), Arrived::Matched(i, "recv B", "world") if i == id));
//! ```
//!
//! # Semantics (MPI 3.1 §3.5, "Order")
//!
//! - A posted receive takes the *oldest* stored (unexpected) message that matches it.
//! - An arriving message goes to the *earliest posted* queued receive that matches it; receives
//!   are ordered by their [`RecvId`] (post order), across exact and wildcard ones.
//! - Together these give non-overtaking: two messages from one source on one communicator that
//!   both match a receive are matched in arrival order (the transport delivers each source's
//!   messages in send order).
//! - Invariant of every matcher: no stored message matches any queued receive.

pub mod hash;
mod reference;
mod sw;
#[cfg(test)]
mod tests;

pub use reference::RefMatcher;
pub use sw::SwMatcher;

/// Width of the context-id field of a match key.
pub const CTX_BITS: u32 = 20;
/// Width of the source-rank field of a match key.
pub const SRC_BITS: u32 = 20;
/// Width of the user-tag field of a match key.
pub const TAG_BITS: u32 = 24;

/// Bit position of the user-tag field (the low bits).
pub const TAG_SHIFT: u32 = 0;
/// Bit position of the source-rank field.
pub const SRC_SHIFT: u32 = TAG_BITS;
/// Bit position of the context-id field (the high bits).
pub const CTX_SHIFT: u32 = TAG_BITS + SRC_BITS;

const _: () = assert!(CTX_BITS + SRC_BITS + TAG_BITS == 64);

/// Largest context id that fits the key.
pub const MAX_CTX: u32 = (1 << CTX_BITS) - 1;
/// Largest source rank that fits the key.
pub const MAX_SRC: u32 = (1 << SRC_BITS) - 1;
/// Largest user tag that fits the key (MPI's `TAG_UB`).
pub const MAX_TAG: u32 = (1 << TAG_BITS) - 1;

/// The user-tag bits of a match key.
pub const TAG_FIELD: u64 = (MAX_TAG as u64) << TAG_SHIFT;
/// The source-rank bits of a match key.
pub const SRC_FIELD: u64 = (MAX_SRC as u64) << SRC_SHIFT;
/// The context-id bits of a match key.
pub const CTX_FIELD: u64 = (MAX_CTX as u64) << CTX_SHIFT;
/// The mask of a fully specified receive (no wildcard): every bit must match.
pub const FULL_MASK: u64 = u64::MAX;

/// Builds a message's match key. Each argument is truncated to its field width (the caller
/// validates ranges; see [`try_encode_tag`] for a checked form).
#[inline]
pub const fn encode_tag(ctx: u32, src: u32, tag: u32) -> u64 {
    (((ctx & MAX_CTX) as u64) << CTX_SHIFT) | (((src & MAX_SRC) as u64) << SRC_SHIFT) | (((tag & MAX_TAG) as u64) << TAG_SHIFT)
}

/// Builds a message's match key, or `None` if a field does not fit its width.
#[inline]
pub const fn try_encode_tag(ctx: u32, src: u32, tag: u32) -> Option<u64> {
    if ctx > MAX_CTX || src > MAX_SRC || tag > MAX_TAG {
        None
    } else {
        Some(encode_tag(ctx, src, tag))
    }
}

/// The context id of a match key.
#[inline]
pub const fn decode_ctx(key: u64) -> u32 {
    ((key & CTX_FIELD) >> CTX_SHIFT) as u32
}

/// The source rank of a match key.
#[inline]
pub const fn decode_src(key: u64) -> u32 {
    ((key & SRC_FIELD) >> SRC_SHIFT) as u32
}

/// The user tag of a match key.
#[inline]
pub const fn decode_tag(key: u64) -> u32 {
    ((key & TAG_FIELD) >> TAG_SHIFT) as u32
}

/// The `(tag, mask)` of a receive on context `ctx` from `src` (`None`: any source) with user tag
/// `tag` (`None`: any tag). Wildcard fields are zero in the returned tag and cleared in the mask;
/// the context bits are always in the mask. Values are truncated like [`encode_tag`].
#[inline]
pub const fn recv_key(ctx: u32, src: Option<u32>, tag: Option<u32>) -> (u64, u64) {
    let mut mask = FULL_MASK;
    let s = match src {
        Some(s) => s,
        None => {
            mask &= !SRC_FIELD;
            0
        }
    };
    let t = match tag {
        Some(t) => t,
        None => {
            mask &= !TAG_FIELD;
            0
        }
    };
    (encode_tag(ctx, s, t), mask)
}

/// Number of MPI's wildcard receive forms (the wildcard classes).
const CLASSES: usize = 3;

/// The masks of MPI's three wildcard receive forms, by class: `ANY_SOURCE` with a tag, a source
/// with `ANY_TAG`, `ANY_SOURCE` with `ANY_TAG` (what [`recv_key`] builds).
const CLASS_MASKS: [u64; CLASSES] = [CTX_FIELD | TAG_FIELD, CTX_FIELD | SRC_FIELD, CTX_FIELD];

/// The form of an exact receive (`mask == FULL_MASK`) in a [`RecvId`]; the wildcard classes are
/// forms `0..CLASSES`.
const FORM_EXACT: u64 = CLASSES as u64;
/// The form of a receive with any other mask (not an MPI receive) in a [`RecvId`].
const FORM_RAW: u64 = FORM_EXACT + 1;

/// The wildcard class of `mask`, if it is one of MPI's forms.
#[inline]
fn class_of(mask: u64) -> Option<usize> {
    CLASS_MASKS.iter().position(|&m| m == mask)
}

/// Identifies a queued receive: its post sequence number and its form (exact, one of MPI's
/// three wildcard forms, or another mask), packed in one `u64`.
///
/// Every call to [`Matcher::post`] takes the next sequence number (0, 1, 2, ...), whether or not
/// it matched at once, so ids are unique, and ids compare in post order: a smaller id means an
/// earlier post. The form is what lets [`Matcher::cancel`] go straight to the receive's queue,
/// given the tag the receive was posted with; no index from ids to queues is kept. Two matchers
/// given the same operations issue the same ids.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RecvId(u64);

impl RecvId {
    /// Low bits that hold the form; the sequence number is above them (2^61 posts before it
    /// would overflow: centuries at a post per nanosecond).
    const FORM_BITS: u32 = 3;

    /// The id of post number `seq` of form `form` (a class, [`FORM_EXACT`] or [`FORM_RAW`]).
    #[inline]
    const fn new(seq: u64, form: u64) -> Self {
        RecvId(seq << Self::FORM_BITS | form)
    }

    /// The id of post number `seq` of a receive with mask `mask`.
    #[inline]
    fn of_mask(seq: u64, mask: u64) -> Self {
        let form = if mask == FULL_MASK { FORM_EXACT } else { class_of(mask).map_or(FORM_RAW, |c| c as u64) };
        Self::new(seq, form)
    }

    /// The post sequence number: 0 for the first call to [`Matcher::post`], then 1, 2, ...
    #[inline]
    pub const fn seq(self) -> u64 {
        self.0 >> Self::FORM_BITS
    }

    /// The form: a wildcard class (`0..CLASSES`), [`FORM_EXACT`] or [`FORM_RAW`]; larger values
    /// are never issued.
    #[inline]
    const fn form(self) -> u64 {
        self.0 & ((1 << Self::FORM_BITS) - 1)
    }
}

/// Outcome of [`Matcher::post`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use]
pub enum Posted<R, M> {
    /// The receive matched the oldest matching unexpected message, which is removed; both
    /// handles are given back.
    Matched(R, M),
    /// Nothing matched; the receive is queued under this id (see [`Matcher::cancel`]).
    Queued(RecvId),
}

/// Outcome of [`Matcher::arrive`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use]
pub enum Arrived<R, M> {
    /// The message matched the earliest posted matching receive (its id and handle), which is
    /// removed from the queue; the message handle is given back.
    Matched(RecvId, R, M),
    /// No queued receive matched; the matcher stored the message as unexpected.
    Unexpected,
}

/// Whether a message could match both `(t1, m1)` and `(t2, m2)`: they agree on every bit both
/// masks care about.
#[inline]
pub const fn keys_overlap(t1: u64, m1: u64, t2: u64, m2: u64) -> bool {
    (t1 ^ t2) & m1 & m2 == 0
}

/// A tag matcher: the queue of posted receives and the store of unexpected messages of one rank.
///
/// `R` is the caller's handle for a posted receive, `M` its handle for a stored message. Tags
/// are full match keys ([`encode_tag`]); a receive is `(tag, mask)` ([`recv_key`]), any mask is
/// allowed and bits of `tag` outside `mask` are ignored.
pub trait Matcher<R, M> {
    /// Posts a receive. It takes the oldest matching unexpected message if there is one, else it
    /// is queued behind every receive posted before it.
    fn post(&mut self, tag: u64, mask: u64, r: R) -> Posted<R, M>;

    /// Delivers a message with match key `tag`. It goes to the earliest posted matching
    /// receive, else it is stored as unexpected (after every message that arrived before it).
    fn arrive(&mut self, tag: u64, m: M) -> Arrived<R, M>;

    /// Removes a queued receive and gives its handle back. `tag` is the tag the receive was
    /// posted with (bits outside its mask do not matter): with the form in `id` it names the
    /// queue the receive sits in. `None` if `id` is not queued (already matched, already
    /// cancelled, or never issued) or `tag` is not its receive's; nothing changes then.
    fn cancel(&mut self, id: RecvId, tag: u64) -> Option<R>;

    /// The oldest unexpected message matching `(tag, mask)`, with its match key; not removed.
    fn probe(&self, tag: u64, mask: u64) -> Option<(u64, &M)>;

    /// Like [`Matcher::probe`], with mutable access to the stored handle.
    fn probe_mut(&mut self, tag: u64, mask: u64) -> Option<(u64, &mut M)>;

    /// Removes and returns the oldest unexpected message matching `(tag, mask)`, with its match
    /// key (what `MPI_Mprobe` does). Queued receives are not consulted: by the matcher's
    /// invariant none of them matches a stored message.
    fn take_probed(&mut self, tag: u64, mask: u64) -> Option<(u64, M)>;

    /// Number of queued receives.
    fn posted_len(&self) -> usize;

    /// Number of stored unexpected messages.
    fn unexpected_len(&self) -> usize;

    /// Would a message arriving now with match key `tag` match a queued receive?
    fn has_posted_match(&self, tag: u64) -> bool;

    /// Could some queued receive match a message that `(tag, mask)` could also match? Used by the
    /// offload policy: a new receive may go to the hardware list only if no earlier
    /// software-only receive competes with it for the same messages.
    fn earlier_posted_overlaps(&self, tag: u64, mask: u64) -> bool;
}
