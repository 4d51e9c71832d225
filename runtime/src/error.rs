//! The one error type of the runtime.

use crate::{Rank, Tag};

/// Result alias used by every fallible tmpi call.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything a tmpi call can fail with. `Display` says what happened and to which rank/tag.
///
/// `Debug` prints the same sentence, so that `fn main() -> tmpi::Result<()>` ends with a
/// readable `Error: peer rank 1 is gone` line (which `tmpirun` repeats when it names the
/// failed rank).
#[derive(thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A rank argument is outside the communicator.
    #[error("invalid rank {rank}: communicator has {size} ranks")]
    InvalidRank {
        /// The rank given.
        rank: Rank,
        /// The communicator's size.
        size: usize,
    },
    /// A tag argument is above [`crate::TAG_UB`].
    #[error("invalid tag {tag}: tags must be 0..={ub}", ub = crate::TAG_UB)]
    InvalidTag {
        /// The tag given.
        tag: Tag,
    },
    /// The matched message was longer than the receive buffer; the message was consumed.
    #[error("message truncated: {len} bytes from rank {source_rank} tag {tag} into a {capacity}-byte buffer")]
    Truncated {
        /// Sender of the message.
        source_rank: Rank,
        /// Tag of the message.
        tag: Tag,
        /// Length of the message in bytes.
        len: usize,
        /// Capacity of the receive buffer in bytes.
        capacity: usize,
    },
    /// The received byte count is not a whole number of elements of the requested type.
    #[error("message of {len} bytes from rank {source_rank} is not a whole number of {elem}-byte elements")]
    TypeMismatch {
        /// Sender of the message.
        source_rank: Rank,
        /// Length in bytes.
        len: usize,
        /// Element size in bytes.
        elem: usize,
    },
    /// A received element has a bit pattern its type does not allow (a `bool` byte that is
    /// neither 0 nor 1): nothing was written to the receive buffer.
    #[error("message from rank {source_rank}: byte {byte:#04x} at offset {offset} is not a valid bool (only 0 and 1 are)")]
    InvalidValue {
        /// Sender of the message.
        source_rank: Rank,
        /// Offset of the byte in the packed message.
        offset: usize,
        /// The byte received.
        byte: u8,
    },
    /// The peer process died or closed its end; the operation cannot complete.
    #[error("peer rank {rank} is gone")]
    PeerGone {
        /// The rank that disappeared.
        rank: Rank,
    },
    /// Another member failed this collective call with an error of its own (arguments that
    /// only it got wrong, or lengths that disagreed between the ranks), so this rank's part of
    /// the call can never complete; the call was abandoned here. What the call left in the
    /// receive buffer is undefined (as after any erroneous call in MPI), and messages sent
    /// for it may stay queued on the communicator: go on with a `dup` of it.
    #[error("the collective call failed on rank {rank} (its arguments were invalid or disagreed with this rank's)")]
    CollectiveFailed {
        /// The rank (in the world) whose call failed first, as far as this rank knows.
        rank: Rank,
    },
    /// A peer sent something that breaks the protocol (a forged source, a notice naming no
    /// request of ours, an impossible length). The packet was consumed and ignored.
    #[error("rank {rank} sent a malformed message: {what}")]
    Protocol {
        /// The world rank that sent it.
        rank: Rank,
        /// What was wrong.
        what: &'static str,
    },
    /// A message announced more bytes than this process can allocate (`recv_vec`, or an
    /// unexpected message to buffer).
    #[error("cannot allocate {bytes} bytes for a message from rank {rank}")]
    NoMemory {
        /// Bytes the message announced.
        bytes: usize,
        /// Its sender.
        rank: Rank,
    },
    /// A remote memory access was refused by the target's key check.
    #[error("remote access to rank {rank} refused: {reason}")]
    RemoteAccess {
        /// The target rank.
        rank: Rank,
        /// Why the access was refused.
        reason: String,
    },
    /// A `TMPI_*` variable (or tmpirun flag) has a value the runtime does not accept.
    #[error("configuration: {var}={value:?} is invalid: {expected}")]
    Config {
        /// The variable name.
        var: String,
        /// The value found.
        value: String,
        /// What the variable accepts.
        expected: String,
    },
    /// Buffer lengths do not fit the operation (collectives, sendrecv, layouts, ...), or a
    /// size given by the caller is more than this process can allocate (`alloc_shared`, the
    /// elements a layout selects).
    #[error("invalid buffer: {0}")]
    InvalidBuffer(String),
    /// A root argument is outside the communicator.
    #[error("invalid root {root}: communicator has {size} ranks")]
    InvalidRoot {
        /// The root given.
        root: Rank,
        /// The communicator's size.
        size: usize,
    },
    /// The reduction operator is not defined for the element type (e.g. BitAnd on f64).
    #[error("operator {op} is not defined for {ty}")]
    InvalidOp {
        /// The operator.
        op: &'static str,
        /// The element type.
        ty: &'static str,
    },
    /// `init` was called twice in one process, or a call came after finalize.
    #[error("runtime state: {0}")]
    State(String),
    /// A transport-level failure.
    #[error(transparent)]
    Transport(#[from] tmpi_transport::Error),
    /// A group argument is malformed: a rank listed twice in `Group::incl`/`Group::excl`, or a
    /// group that is not part of the communicator it is used with.
    #[error("invalid group: {0}")]
    InvalidGroup(String),
    /// Cartesian topology arguments do not fit: dimensions whose product does not match the
    /// ranks, a dimension or coordinate out of range, argument lists of different lengths.
    #[error("invalid topology: {0}")]
    InvalidTopology(String),
    /// A call broke the thread level the runtime was started at ([`crate::Threading`]): it
    /// came from a thread other than the one that started the runtime (`Single`,
    /// `Funneled`), while another thread was inside a call (`Serialized`), from inside another
    /// tmpi call on the same thread (a user operation calling tmpi), or it is a collective on
    /// a communicator another thread is running a collective on.
    #[error("thread level {level:?}: {what}")]
    Thread {
        /// The level the runtime was started at.
        level: crate::Threading,
        /// What was wrong.
        what: &'static str,
    },
    /// A replay (`TMPI_REPLAY`) met a call the record does not have at that point: the
    /// program departed from the recorded run. The message names the rank, the decision's
    /// number and both calls; every later decision of the rank fails alike.
    #[error("{0}")]
    Replay(String),
    /// A spawn ([`crate::Comm::spawn`]) could not start its processes or connect to them:
    /// the root's arguments were refused, `tmpirun` could not start them, or no `tmpirun`
    /// started this process. Every rank of the communicator gets it.
    #[error("spawn: {0}")]
    Spawn(String),
}

impl std::fmt::Debug for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(self, f)
    }
}
