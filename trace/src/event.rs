//! The event record: one fixed-size binary record per span, message or note, and the kinds of
//! events with their names.
//!
//! A record is [`EVENT_BYTES`] (48) bytes, little-endian, with no pointers, so a rank's ring
//! can live in a file and be read back by another process (the merger) even after the rank
//! died.

/// Bytes of one encoded [`Event`].
pub const EVENT_BYTES: usize = 48;

/// "No rank" / "no tag" in [`Event::peer`] and [`Event::tag`].
pub const NONE: u32 = u32::MAX;

/// One event of a rank: a span (`dur > 0`), or an instant.
///
/// Field use by [`Class`]:
///
/// | class | `peer` | `tag` | `bytes` | `id` | `aux` |
/// |---|---|---|---|---|---|
/// | point-to-point, posts, probes | world rank of the destination or the matched source ([`NONE`]: any, not matched) | tag ([`NONE`]: any) | payload bytes | 0 | [`aux`] bits |
/// | completions (`wait`, `test`...) | as above for one request | | | requests asked about | [`aux`] bits |
/// | collectives | root ([`NONE`]: none) | | bytes of this rank's send buffer | 0 | [`aux`] bits |
/// | message | the other rank (world) | tag | payload bytes | context id x 2^40 + the message's number among those of its envelope (direction, peer, context, tag), from 1 | [`Proto`] bits |
/// | note | | | count | | |
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Event {
    /// Start, in nanoseconds of the rank host's `CLOCK_MONOTONIC`.
    pub t0: u64,
    /// Duration in nanoseconds; 0 for an instant.
    pub dur: u64,
    /// Payload bytes (or a count, by kind).
    pub bytes: u64,
    /// A message end's number: its context id x 2^40 + its place (1, 2, ...) among the
    /// messages of its direction, peer, context and tag, counted alike by sender and receiver;
    /// for completions, the requests asked about; else 0.
    pub id: u64,
    /// The other rank (world rank), or [`NONE`].
    pub peer: u32,
    /// The tag, or [`NONE`].
    pub tag: u32,
    /// [`Kind`] as its code.
    pub kind: u16,
    /// The thread of the rank (0 = the first thread that recorded).
    pub thread: u16,
    /// Kind-specific bits (see [`aux`] and [`Proto`]).
    pub aux: u32,
}

/// Bits of [`Event::aux`] for calls.
pub mod aux {
    /// The call returned an error.
    pub const FAILED: u32 = 1 << 31;
    /// The call asked for any source.
    pub const ANY_SOURCE: u32 = 1 << 30;
    /// A test or probe that found nothing.
    pub const EMPTY: u32 = 1 << 29;
    /// The call had not returned when the rank's trace ended (the rank was stuck in it when
    /// it was killed, or died in it); its duration runs to the end of the job.
    pub const OPEN: u32 = 1 << 28;
    /// The communicator id, in the low 24 bits.
    pub const COMM_MASK: u32 = (1 << 24) - 1;
}

impl Event {
    /// The record's bytes.
    pub fn encode(&self) -> [u8; EVENT_BYTES] {
        let mut b = [0u8; EVENT_BYTES];
        b[0..8].copy_from_slice(&self.t0.to_le_bytes());
        b[8..16].copy_from_slice(&self.dur.to_le_bytes());
        b[16..24].copy_from_slice(&self.bytes.to_le_bytes());
        b[24..32].copy_from_slice(&self.id.to_le_bytes());
        b[32..36].copy_from_slice(&self.peer.to_le_bytes());
        b[36..40].copy_from_slice(&self.tag.to_le_bytes());
        b[40..42].copy_from_slice(&self.kind.to_le_bytes());
        b[42..44].copy_from_slice(&self.thread.to_le_bytes());
        b[44..48].copy_from_slice(&self.aux.to_le_bytes());
        b
    }

    /// Reads a record back (any 48 bytes decode; [`Kind::from_code`] tells a known kind).
    pub fn decode(b: &[u8; EVENT_BYTES]) -> Self {
        let u64_at = |i: usize| u64::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3], b[i + 4], b[i + 5], b[i + 6], b[i + 7]]);
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let u16_at = |i: usize| u16::from_le_bytes([b[i], b[i + 1]]);
        Event {
            t0: u64_at(0),
            dur: u64_at(8),
            bytes: u64_at(16),
            id: u64_at(24),
            peer: u32_at(32),
            tag: u32_at(36),
            kind: u16_at(40),
            thread: u16_at(42),
            aux: u32_at(44),
        }
    }

    /// The event's kind, if its code is known.
    pub fn kind(&self) -> Option<Kind> {
        Kind::from_code(self.kind)
    }

    /// End of the event (start + duration, saturating).
    pub fn end(&self) -> u64 {
        self.t0.saturating_add(self.dur)
    }
}

/// What a kind of event is, for grouping in the timeline (`cat`) and the profile.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Class {
    /// Start-up and shut-down of the runtime.
    Life,
    /// Blocking point-to-point calls and probes.
    P2p,
    /// Posting a non-blocking operation.
    Post,
    /// Completing requests (`wait`, `test` and their families).
    Complete,
    /// Blocking collectives (and neighbour collectives).
    Coll,
    /// Starting a non-blocking collective.
    Nbc,
    /// Making communicators.
    Comm,
    /// One message leaving or matched (the engine's view: protocol, sequence).
    Message,
    /// A phase of a collective or of a protocol inside a call.
    Phase,
    /// A note about the trace itself (events dropped).
    Note,
}

impl Class {
    /// The `cat` of the trace-event format.
    pub fn name(self) -> &'static str {
        match self {
            Class::Life => "life",
            Class::P2p => "p2p",
            Class::Post => "post",
            Class::Complete => "complete",
            Class::Coll => "coll",
            Class::Nbc => "nbc",
            Class::Comm => "comm",
            Class::Message => "msg",
            Class::Phase => "phase",
            Class::Note => "note",
        }
    }

    /// Whether spans of this class are tmpi calls (counted as time in communication).
    pub fn is_call(self) -> bool {
        !matches!(self, Class::Message | Class::Phase | Class::Note)
    }
}

macro_rules! kinds {
    ($($(#[$doc:meta])* $name:ident = $code:literal, $text:literal, $class:ident;)*) => {
        /// Every kind of event, with a stable code (the record's `kind`).
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        #[non_exhaustive]
        pub enum Kind {
            $($(#[$doc])* $name,)*
        }

        impl Kind {
            /// Every kind, in code order.
            pub const ALL: &'static [Kind] = &[$(Kind::$name),*];

            /// The record code.
            pub fn code(self) -> u16 {
                match self {
                    $(Kind::$name => $code,)*
                }
            }

            /// The kind of a record code.
            pub fn from_code(c: u16) -> Option<Kind> {
                match c {
                    $($code => Some(Kind::$name),)*
                    _ => None,
                }
            }

            /// The name shown in the timeline and the profile (the API call's name).
            pub fn name(self) -> &'static str {
                match self {
                    $(Kind::$name => $text,)*
                }
            }

            /// The kind named `s` (as [`Kind::name`] gives it).
            pub fn from_name(s: &str) -> Option<Kind> {
                match s {
                    $($text => Some(Kind::$name),)*
                    _ => None,
                }
            }

            /// Its class.
            pub fn class(self) -> Class {
                match self {
                    $(Kind::$name => Class::$class,)*
                }
            }
        }
    };
}

kinds! {
    /// `tmpi::init`.
    Init = 1, "init", Life;
    /// `World::finalize` (or the world's drop).
    Finalize = 2, "finalize", Life;
    /// `Comm::send`.
    Send = 10, "send", P2p;
    /// `Comm::ssend`.
    Ssend = 11, "ssend", P2p;
    /// `Comm::recv`.
    Recv = 12, "recv", P2p;
    /// `Comm::recv_vec`.
    RecvVec = 13, "recv_vec", P2p;
    /// `Comm::sendrecv`.
    Sendrecv = 14, "sendrecv", P2p;
    /// `Comm::sendrecv_replace`.
    SendrecvReplace = 15, "sendrecv_replace", P2p;
    /// `Comm::probe`.
    Probe = 16, "probe", P2p;
    /// `Comm::iprobe`.
    Iprobe = 17, "iprobe", P2p;
    /// `Comm::mprobe`.
    Mprobe = 18, "mprobe", P2p;
    /// `Comm::improbe`.
    Improbe = 19, "improbe", P2p;
    /// `Message::recv`, `Message::recv_vec`, `Comm::mrecv`.
    Mrecv = 20, "mrecv", P2p;
    /// `Comm::send_layout`.
    SendLayout = 21, "send_layout", P2p;
    /// `Comm::recv_layout`.
    RecvLayout = 22, "recv_layout", P2p;
    /// `Comm::recv_serialized`.
    RecvSerialized = 24, "recv_serialized", P2p;
    /// `Comm::isend`.
    Isend = 30, "isend", Post;
    /// `Comm::issend`.
    Issend = 31, "issend", Post;
    /// `Comm::irecv`.
    Irecv = 32, "irecv", Post;
    /// `Comm::irecv_vec`.
    IrecvVec = 33, "irecv_vec", Post;
    /// `Message::irecv`.
    Imrecv = 34, "imrecv", Post;
    /// `Request::wait` (and `VecRequest::wait`).
    Wait = 40, "wait", Complete;
    /// `Request::test` (and `VecRequest::test`).
    Test = 41, "test", Complete;
    /// `Request::cancel` (and `VecRequest::cancel`).
    Cancel = 42, "cancel", Complete;
    /// `tmpi::wait_all`.
    WaitAll = 43, "wait_all", Complete;
    /// `tmpi::wait_any`.
    WaitAny = 44, "wait_any", Complete;
    /// `tmpi::wait_some`.
    WaitSome = 45, "wait_some", Complete;
    /// `tmpi::test_any`.
    TestAny = 46, "test_any", Complete;
    /// `tmpi::test_some`.
    TestSome = 47, "test_some", Complete;
    /// `tmpi::test_all`.
    TestAll = 48, "test_all", Complete;
    /// `Comm::barrier`.
    Barrier = 60, "barrier", Coll;
    /// `Comm::bcast`.
    Bcast = 61, "bcast", Coll;
    /// `Comm::reduce` (and `reduce_with`).
    Reduce = 62, "reduce", Coll;
    /// `Comm::allreduce` (and `allreduce_with`).
    Allreduce = 63, "allreduce", Coll;
    /// `Comm::gather`.
    Gather = 64, "gather", Coll;
    /// `Comm::scatter`.
    Scatter = 65, "scatter", Coll;
    /// `Comm::allgather`.
    Allgather = 66, "allgather", Coll;
    /// `Comm::alltoall`.
    Alltoall = 67, "alltoall", Coll;
    /// `Comm::gatherv`.
    Gatherv = 68, "gatherv", Coll;
    /// `Comm::scatterv`.
    Scatterv = 69, "scatterv", Coll;
    /// `Comm::allgatherv`.
    Allgatherv = 70, "allgatherv", Coll;
    /// `Comm::alltoallv`.
    Alltoallv = 71, "alltoallv", Coll;
    /// `Comm::reduce_scatter` (and `reduce_scatter_with`).
    ReduceScatter = 72, "reduce_scatter", Coll;
    /// `Comm::reduce_scatter_block`.
    ReduceScatterBlock = 73, "reduce_scatter_block", Coll;
    /// `Comm::scan` (and `scan_with`).
    Scan = 74, "scan", Coll;
    /// `Comm::exscan` (and `exscan_with`).
    Exscan = 75, "exscan", Coll;
    /// `CartComm::neighbor_allgather`.
    NeighborAllgather = 76, "neighbor_allgather", Coll;
    /// `CartComm::neighbor_alltoall`.
    NeighborAlltoall = 77, "neighbor_alltoall", Coll;
    /// `Comm::ibarrier`.
    Ibarrier = 80, "ibarrier", Nbc;
    /// `Comm::ibcast`.
    Ibcast = 81, "ibcast", Nbc;
    /// `Comm::ireduce` (and `ireduce_with`).
    Ireduce = 82, "ireduce", Nbc;
    /// `Comm::iallreduce` (and `iallreduce_with`).
    Iallreduce = 83, "iallreduce", Nbc;
    /// `Comm::igather`.
    Igather = 84, "igather", Nbc;
    /// `Comm::iscatter`.
    Iscatter = 85, "iscatter", Nbc;
    /// `Comm::iallgather`.
    Iallgather = 86, "iallgather", Nbc;
    /// `Comm::ialltoall`.
    Ialltoall = 87, "ialltoall", Nbc;
    /// `Comm::igatherv`.
    Igatherv = 88, "igatherv", Nbc;
    /// `Comm::iscatterv`.
    Iscatterv = 89, "iscatterv", Nbc;
    /// `Comm::iallgatherv`.
    Iallgatherv = 90, "iallgatherv", Nbc;
    /// `Comm::ialltoallv`.
    Ialltoallv = 91, "ialltoallv", Nbc;
    /// `Comm::ireduce_scatter` (and its `_with` form).
    IreduceScatter = 92, "ireduce_scatter", Nbc;
    /// `Comm::ireduce_scatter_block`.
    IreduceScatterBlock = 93, "ireduce_scatter_block", Nbc;
    /// `Comm::iscan` (and `iscan_with`).
    Iscan = 94, "iscan", Nbc;
    /// `Comm::iexscan` (and `iexscan_with`).
    Iexscan = 95, "iexscan", Nbc;
    /// `Comm::dup`.
    Dup = 100, "dup", Comm;
    /// `Comm::split`.
    Split = 101, "split", Comm;
    /// `Comm::split_type`.
    SplitType = 102, "split_type", Comm;
    /// `Comm::create`.
    Create = 103, "create", Comm;
    /// `Comm::cart_create`.
    CartCreate = 104, "cart_create", Comm;
    /// `CartComm::sub`.
    CartSub = 105, "cart_sub", Comm;
    /// `Comm::dist_graph_create_adjacent`.
    DistGraphCreate = 106, "dist_graph_create_adjacent", Comm;
    /// A message leaving this rank (its protocol in `aux`, see [`Proto`]).
    MsgOut = 120, "msg out", Message;
    /// A message matched by a receive of this rank (its protocol and how it matched in `aux`).
    MsgIn = 121, "msg in", Message;
    /// A step of a collective's point-to-point algorithm (`aux`: 1 send, 2 receive, 3 both;
    /// `peer`: the rank it exchanged with).
    CollPhase = 130, "coll step", Phase;
    /// Events of this rank were dropped: `bytes` of them, the oldest first (the ring was full).
    Dropped = 140, "events dropped", Note;
}

/// How a message went, in the low byte of a message event's `aux`; bits 8.. say how it matched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Proto(pub u32);

impl Proto {
    /// Eager: copied through the fabric and, if unexpected, buffered at the receiver.
    pub const EAGER: u32 = 1;
    /// Rendezvous: the receiver reads the sender's registered buffer.
    pub const RNDV: u32 = 2;
    /// A message to this rank itself.
    pub const SELF: u32 = 3;
    /// Rendezvous read by single copy (CMA).
    pub const WAY_CMA: u32 = 1 << 4;
    /// Rendezvous read streamed through the rings (or the TCP connection).
    pub const WAY_STREAM: u32 = 2 << 4;
    /// Rendezvous read by `memcpy` from a shared heap.
    pub const WAY_HEAP: u32 = 3 << 4;
    /// Rendezvous read by the fabric's own RDMA read (the OFI fabric's `fi_read`).
    pub const WAY_FABRIC_READ: u32 = 4 << 4;
    /// Matched by the soft TM-SRQ's tag list (offloaded).
    pub const OFFLOADED: u32 = 1 << 8;
    /// Matched in software.
    pub const SOFTWARE: u32 = 1 << 9;
    /// Arrived before its receive was posted (unexpected).
    pub const UNEXPECTED: u32 = 1 << 10;
    /// A message of a collective (its communicator's collective context).
    pub const COLLECTIVE: u32 = 1 << 11;

    /// Words for the timeline's arguments: `eager`, `rendezvous (cma)`, `offloaded`, ...
    pub fn describe(self) -> Vec<&'static str> {
        let mut out = Vec::new();
        out.push(match self.0 & 0xf {
            Proto::EAGER => "eager",
            Proto::RNDV => "rendezvous",
            Proto::SELF => "self",
            _ => "unknown protocol",
        });
        match self.0 & 0xf0 {
            Proto::WAY_CMA => out.push("single copy (cma)"),
            Proto::WAY_STREAM => out.push("streamed"),
            Proto::WAY_HEAP => out.push("shared heap"),
            Proto::WAY_FABRIC_READ => out.push("fabric read (fi_read)"),
            _ => {}
        }
        for (bit, word) in [
            (Proto::OFFLOADED, "offloaded (TM-SRQ)"),
            (Proto::SOFTWARE, "software matched"),
            (Proto::UNEXPECTED, "unexpected"),
            (Proto::COLLECTIVE, "collective"),
        ] {
            if self.0 & bit != 0 {
                out.push(word);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_round_trips_through_its_bytes() {
        let e =
            Event { t0: 1, dur: u64::MAX, bytes: 3, id: 4, peer: NONE, tag: 6, kind: Kind::Send.code(), thread: 7, aux: aux::FAILED | 9 };
        assert_eq!(Event::decode(&e.encode()), e);
        assert_eq!(e.end(), u64::MAX);
        assert_eq!(e.kind(), Some(Kind::Send));
    }

    #[test]
    fn kinds_have_unique_codes_and_names() {
        let mut codes: Vec<u16> = Kind::ALL.iter().map(|k| k.code()).collect();
        codes.sort_unstable();
        codes.dedup();
        assert_eq!(codes.len(), Kind::ALL.len());
        for &k in Kind::ALL {
            assert_eq!(Kind::from_code(k.code()), Some(k));
            assert_eq!(Kind::from_name(k.name()), Some(k));
        }
        assert_eq!(Kind::from_code(0), None);
        assert!(Kind::Wait.class().is_call() && !Kind::MsgIn.class().is_call());
    }

    #[test]
    fn protocols_are_described() {
        let p = Proto(Proto::RNDV | Proto::WAY_CMA | Proto::OFFLOADED);
        assert_eq!(p.describe(), ["rendezvous", "single copy (cma)", "offloaded (TM-SRQ)"]);
        assert_eq!(Proto(Proto::EAGER | Proto::UNEXPECTED | Proto::SOFTWARE).describe(), ["eager", "software matched", "unexpected"]);
    }
}
