//! The vocabulary every fabric shares: a [`Packet`] as a fabric's poll delivers it, its
//! `PKT_*` flags, and how a peer stands ([`PeerState`]). The fabrics (shared memory, TCP,
//! threads, OFI) speak it; [`crate::fabric`] re-exports it beside the trait they implement.
//!
//! A message larger than one packet is sent as consecutive packets to one destination
//! (`FIRST`, then continuations, the last one `LAST`); packets of one source arrive in order,
//! and a sender never interleaves the packets of two messages to the same destination.

/// The packet starts a message (it carries the TMH).
pub const PKT_FIRST: u8 = 1;
/// The packet ends a message.
pub const PKT_LAST: u8 = 2;
/// A message in one packet.
pub const PKT_WHOLE: u8 = PKT_FIRST | PKT_LAST;
/// An RDMA read request, response or refusal: served by the endpoint itself, never seen by
/// the receiver's TM-SRQ (as an RDMA read bypasses the SRQ of a real NIC). Independent of the
/// message packet sequence: it may appear between the packets of a message.
pub const PKT_RMA: u8 = 4;

/// One packet as delivered by a fabric's poll.
#[derive(Debug, Clone, Copy)]
pub struct Packet<'a> {
    /// The sending rank.
    pub src: usize,
    /// `PKT_*` flags.
    pub flags: u8,
    /// Length of the whole message this packet belongs to (headers included).
    pub total_len: u64,
    /// The packet's bytes; valid only during the poll callback.
    pub data: &'a [u8],
}

/// How a peer stands, as its fabric sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeerState {
    /// Attached and running.
    Alive,
    /// It finalized cleanly: everything it sent is in the fabric, and it sends nothing more.
    Finalized,
    /// It left without finalizing (its process died or its end was dropped while unwinding).
    Failed,
}
