//! The soft TM-SRQ: a sans-IO model of RDMA hardware tag matching, as rdma-core's verbs
//! expose it and its mlx5 provider implements it.
//!
//! No threads, clocks or system calls: inputs come in through verbs (`post_srq_recv`,
//! `post_srq_ops`) and arrivals (`arrive*`, `read_complete`/`read_failed`); outputs leave
//! through return values the caller executes ([`Arrival`]: copy these bytes there, or issue
//! this RDMA read), the completion queue ([`TmSrq::poll_cq`]) and the transmit queue
//! ([`TmSrq::poll_transmit`], the FINs of rendezvous the SRQ completed).
//!
//! Files: [`caps`](TmCaps) (device capabilities, creation request), `ops` ([`OpsWr`]),
//! `cq` ([`Wc`]), `list` (the matching list and its index), `srq` ([`TmSrq`]).
//!
//! ```
//! use tmpi_transport::tm::*;
//! use tmpi_transport::wire::{Tmh, TmOp};
//!
//! let mut srq = TmSrq::new(TmCap::default()).unwrap();
//! srq.post_srq_recv(100, 4096).unwrap();
//! let h = srq.post_srq_op(&OpsWr::add(1, 0x42, u64::MAX, 7, 64, 0, true)).unwrap().unwrap();
//! assert_eq!(srq.poll_cq().unwrap().opcode, WcOpcode::TmAdd);
//!
//! let mut msg = Tmh { op: TmOp::Eager, app_ctx: 5, tag: 0x42 }.to_bytes().to_vec();
//! msg.extend_from_slice(b"hello");
//! let Arrival::Place(p) = srq.arrive(3, &msg).unwrap() else { unreachable!() };
//! assert_eq!(p.buffer, Buffer::Tagged { recv_wr_id: 7, handle: h });
//! assert_eq!(p.bytes(&msg), b"hello"); // headers stripped: the caller copies these
//! let wc = srq.poll_cq().unwrap();
//! assert_eq!((wc.wr_id, wc.byte_len, wc.src), (7, 5, 3));
//! assert!(wc.flags.contains(WcFlags::TM_MATCH | WcFlags::TM_DATA_VALID));
//! assert_eq!(wc.read_tm_info(), Some((0x42, 5)));
//! ```
//!
//! # The model, and the choices it makes
//!
//! - **Matching.** `msg.tag & mask == tag & mask` (the entry's tag is masked on ADD, as mlx5
//!   does); the first *eligible* entry in list (ADD) order wins. Lookup is one hash probe per
//!   distinct mask in the list, not a scan (see `list.rs`).
//! - **Phase synchronisation.** The SRQ counts the tagged messages it delivered unexpected
//!   (16 bits, wrapping). Software reports the count it has handled with any op flagged
//!   [`OpsFlags::TM_SYNC`] (only the low 16 bits of [`OpsWr::unexpected_cnt`] are used; an op
//!   without the flag leaves the last reported count in force). An ADD made while the counts
//!   differ is *out of phase*: not matched until an op makes them level, which re-enables
//!   every such entry. Entries added in phase keep matching after later unexpected arrivals.
//! - **`TM_SYNC_REQ`**, as rdma-core's mlx5 provider sets it (`providers/mlx5/cq.c`,
//!   `handle_tag_matching`), not on "all completions" as the seed's summary says: on an ADD or
//!   DEL completion when the count the op left in force differs from the hardware's
//!   (`hw_phase_cnt != op->tag->phase_cnt`); on an unexpected receive when polled once more
//!   than [`MAX_SYNC_DIFF`] unexpected receives have been polled since the last reported
//!   count (`unexp_in - unexp_out > MLX5_TM_MAX_SYNC_DIFF`); never on a SYNC's own completion
//!   (a NOOP carries no tag, so mlx5 skips the comparison), on a matched `TmRecv` or on a
//!   `TmNoTag` (those cases set no flag). A caller that needs the gap at other times has
//!   [`TmSrq::in_sync`].
//! - **Ops** execute when posted (the hardware handles them before the next arrival). Each
//!   holds one of `max_ops` slots until a completion of it or of a later op is polled (the
//!   mlx5 command queue), so unsignaled ops need an occasional signaled one. A full list or
//!   no free op slot is a synchronous `ENOMEM` at the failing op (mlx5's `bad_wr`), not an
//!   error completion. A failing DEL always completes with `TM_ERR`. A handle is reused only
//!   after every completion mentioning it was polled, so a DEL racing a consumption fails
//!   cleanly instead of hitting a new entry; handles are recycled FIFO.
//! - **Unexpected** tagged messages land whole (TMH, RVH, meta-data, payload) in the next SRQ
//!   buffer and complete as [`WcOpcode::TmRecv`] with neither `TM_MATCH` nor `TM_DATA_VALID`
//!   ([`Wc::is_unexpected`]), with no tm info (parse the TMH from the buffer). The seed says
//!   `IBV_WC_RECV`; this is what mlx5 reports and what rdma-core's own suite expects
//!   (`tests/test_tag_matching.py`, `test_tm_unexpected_tag`: opcode `IBV_WC_TM_RECV`, flags 0,
//!   tag 0, and software counts it because neither flag is set). A multi-packet unexpected
//!   message is decided, counted and given its place in the completion queue with its first
//!   packet; its completion becomes pollable with the last packet, and until then no later
//!   match or unexpected completion is polled before it (the seed: the matching completion
//!   "is always serialized with respect to other matches and the completion of unexpected
//!   messages"). **No SRQ buffer** posted: [`Arrival::Rnr`], nothing changes, offer the
//!   message again later (back-pressure, like an RNR NAK; the count is not advanced).
//! - **NO_TAG** messages are always delivered whole to an SRQ buffer as
//!   [`WcOpcode::TmNoTag`] and are not counted (rdma-core's `test_tm_no_tag` expects opcode
//!   `IBV_WC_TM_NO_TAG` and an unchanged unexpected count; mlx5 counts only
//!   `MLX5_CQE_APP_OP_TM_UNEXPECTED`). **FIN** arriving at a TM-SRQ (the sender side of a
//!   rendezvous) is treated the same way: mlx5 reports it with the NO_TAG CQE opcode and UCX
//!   tells the two apart by the opcode byte in the buffer.
//! - **TAG_SYNC** is posted with `SIGNALED | TM_SYNC` ([`OpsWr::sync`]), the flags
//!   rdma-core's suite uses (`post_sync` in `tests/test_tag_matching.py`); without `TM_SYNC`
//!   the count it carries is ignored, as for any op.
//! - **Expected eager**, one packet: one `TmRecv` with `TM_MATCH | TM_DATA_VALID`, headers
//!   stripped. More packets ([`TmSrq::arrive_first`] / [`TmSrq::arrive_continuation`]):
//!   `TM_MATCH` with the first, `TM_DATA_VALID` with the last, same `recv_wr_id`; only the
//!   second frees the entry. A payload larger than the buffer is cut and completes
//!   [`WcStatus::LocLenErr`] with the full length in `byte_len`.
//! - **Expected rendezvous**: `TM_MATCH` completion and an [`Arrival::Read`] for the caller to
//!   execute, described by the RVH alone (`va`, 32-bit `rkey`, 32-bit `len`; bytes after the
//!   RVH never change it, see [`RndvRequest`]); then [`TmSrq::read_complete`] queues
//!   `TM_DATA_VALID` and the FIN (TMH with opcode FIN, and the RVH) to the sender, or
//!   [`TmSrq::read_failed`] queues `TM_DATA_VALID` with the error status and no FIN. Buffer
//!   smaller than the RVH's `len`: one completion `TM_MATCH | TM_DATA_VALID` with status
//!   [`WcStatus::TmRndvIncomplete`], and the request itself (TMH, RVH, meta-data) placed in
//!   the buffer for software to finish. A tagged buffer is one `ibv_sge`, shorter than
//!   [`RVH_LEN_IN_META`]: an ADD longer than [`MAX_TAGGED_LEN`] is refused (`EINVAL`).
//! - **Completion queue** capacity is allocated up front for every completion the SRQ's
//!   resources can have outstanding; it grows (rather than overrunning, as hardware would) only
//!   if software keeps reposting SRQ buffers without polling.
//!
//! Cost: an arrival allocates nothing; with an empty list it is a parse, a ring pop and a
//! completion push. Multi-packet messages in progress are kept per source in a small vector
//! searched linearly (one entry per source with a message half-received).

mod caps;
mod cq;
mod list;
mod ops;
mod srq;

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_rdma_core;

pub use caps::{TmCap, TmCapFlags, TmCaps};
pub use cq::{Wc, WcFlags, WcOpcode, WcStatus};
pub use ops::{OpsFlags, OpsOp, OpsWr};
pub use srq::{
    Arrival, Buffer, Placement, Polled, ReadId, ReadRequest, RndvRequest, TmCounters, TmSrq, Transmit, FIN_LEN, MAX_SYNC_DIFF,
    MAX_TAGGED_LEN, RNDV_FLAG_PREGRANTED, RNDV_META_LEN, RNDV_REQ_LEN, RVH_LEN_IN_META,
};

/// Errno-like failures of the TM-SRQ verbs. Per-message outcomes are completion statuses
/// ([`WcStatus`]) and back-pressure is [`Arrival::Rnr`]; these are refusals of a call, after
/// which nothing has changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TmErrno {
    /// ENOMEM: the tag list, the outstanding-ops budget or the SRQ is full.
    #[error("ENOMEM: tag list or op queue full")]
    NoMem,
    /// EINVAL: an argument the verb does not accept (capabilities exceeded, unknown flags,
    /// a handle out of range, an unknown read id, a continuation with no message in
    /// progress).
    #[error("EINVAL: invalid argument")]
    Inval,
    /// EBADMSG: the arriving bytes are not a message the TM-SRQ accepts (unknown opcode,
    /// short header, oversized rendezvous request, inconsistent lengths).
    #[error("EBADMSG: not a valid tag-matching message")]
    BadMsg,
}
