//! Work completions of the TM-SRQ's completion queue (`struct ibv_wc` as read through the
//! extended CQ API, with `ibv_wc_read_tm_info`).

/// Completion opcodes the TM-SRQ produces (the TM subset of `enum ibv_wc_opcode`).
///
/// `IBV_WC_RECV` is not produced: like mlx5, the model reports unexpected tagged messages as
/// [`WcOpcode::TmRecv`] with neither [`WcFlags::TM_MATCH`] nor [`WcFlags::TM_DATA_VALID`]
/// (see [`Wc::is_unexpected`]). This differs from the seed's words on purpose: rdma-core's own
/// suite expects it (`tests/test_tag_matching.py`, `test_tm_unexpected_tag`: opcode
/// `IBV_WC_TM_RECV`, flags 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WcOpcode {
    /// `IBV_WC_TM_ADD`: completion of a TAG_ADD operation.
    TmAdd,
    /// `IBV_WC_TM_DEL`: completion of a TAG_DEL operation.
    TmDel,
    /// `IBV_WC_TM_SYNC`: completion of a TAG_SYNC operation.
    TmSync,
    /// `IBV_WC_TM_RECV`: a tagged message: matched (flags say which phase) or unexpected.
    TmRecv,
    /// `IBV_WC_TM_NO_TAG`: a message whose opcode is NO_TAG or FIN, delivered whole to an
    /// SRQ buffer. Not counted as unexpected (rdma-core's `tests/test_tag_matching.py`,
    /// `test_tm_no_tag`, expects this opcode and an unchanged unexpected count).
    TmNoTag,
}

/// Completion statuses the TM-SRQ produces (a subset of `enum ibv_wc_status`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WcStatus {
    /// `IBV_WC_SUCCESS`.
    Success,
    /// `IBV_WC_LOC_LEN_ERR`: the message was longer than the buffer it landed in; only the
    /// buffer's length was written and [`Wc::byte_len`] is the length that did not fit.
    LocLenErr,
    /// `IBV_WC_REM_ACCESS_ERR`: a rendezvous read was refused by the target (key, range or
    /// access check); reported through [`super::TmSrq::read_failed`].
    RemAccessErr,
    /// `IBV_WC_RETRY_EXC_ERR`: the peer of a rendezvous read did not answer.
    RetryExcErr,
    /// `IBV_WC_WR_FLUSH_ERR`: a multi-packet message was cut off because its connection
    /// failed ([`super::TmSrq::abort_message`]).
    WrFlushErr,
    /// `IBV_WC_GENERAL_ERR`: any other failure of a rendezvous read.
    GeneralErr,
    /// `IBV_WC_TM_ERR`: a TAG_DEL failed because the entry was not in the list (already
    /// consumed by a message, being consumed, or never added).
    TmErr,
    /// `IBV_WC_TM_RNDV_INCOMPLETE`: a rendezvous request matched a tagged buffer smaller than
    /// its payload; the request's TMH, RVH and meta-data were written to the buffer instead
    /// and software must finish the transfer. Matching has completed.
    TmRndvIncomplete,
}

/// Completion flags (the TM subset of `enum ibv_wc_flags`, same bit values).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct WcFlags(pub u32);

impl WcFlags {
    /// No flag.
    pub const NONE: WcFlags = WcFlags(0);
    /// `IBV_WC_TM_SYNC_REQ`: software should report its unexpected count (TAG_SYNC).
    pub const TM_SYNC_REQ: WcFlags = WcFlags(1 << 4);
    /// `IBV_WC_TM_MATCH`: the message matched a tagged buffer.
    pub const TM_MATCH: WcFlags = WcFlags(1 << 5);
    /// `IBV_WC_TM_DATA_VALID`: the matched message's data phase has ended (successfully
    /// when the status is [`WcStatus::Success`]).
    pub const TM_DATA_VALID: WcFlags = WcFlags(1 << 6);

    /// True if every bit of `other` is set in `self`.
    #[inline]
    pub const fn contains(self, other: WcFlags) -> bool {
        self.0 & other.0 == other.0
    }

    /// True if any bit of `other` is set in `self`.
    #[inline]
    pub const fn intersects(self, other: WcFlags) -> bool {
        self.0 & other.0 != 0
    }
}

impl core::ops::BitOr for WcFlags {
    type Output = WcFlags;
    #[inline]
    fn bitor(self, rhs: WcFlags) -> WcFlags {
        WcFlags(self.0 | rhs.0)
    }
}

impl core::ops::BitOrAssign for WcFlags {
    #[inline]
    fn bitor_assign(&mut self, rhs: WcFlags) {
        self.0 |= rhs.0;
    }
}

/// One work completion.
///
/// | opcode | `wr_id` | `handle` | `src` | `byte_len` | tm info |
/// |---|---|---|---|---|---|
/// | `TmAdd`/`TmDel`/`TmSync` | the op's `wr_id` | the entry (ADD/DEL) | 0 | 0 | none |
/// | `TmRecv` matched | the entry's `recv_wr_id` | the entry | sender | payload length (0 on a MATCH-only completion; header length on RNDV_INCOMPLETE) | `(tag, app_ctx)` |
/// | `TmRecv` unexpected | the SRQ buffer's `wr_id` | 0 | sender | whole message length | none: parse the TMH from the buffer |
/// | `TmNoTag` | the SRQ buffer's `wr_id` | 0 | sender | whole message length | none |
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Wc {
    /// The op's `wr_id`, the tagged buffer's `recv_wr_id`, or the SRQ buffer's `wr_id`.
    pub wr_id: u64,
    /// What completed.
    pub opcode: WcOpcode,
    /// How it ended.
    pub status: WcStatus,
    /// `TM_SYNC_REQ`, `TM_MATCH`, `TM_DATA_VALID`.
    pub flags: WcFlags,
    /// Bytes the message carried for this buffer (see the table above). When it exceeds the
    /// buffer's length the status is [`WcStatus::LocLenErr`] and the data was cut.
    pub byte_len: u64,
    /// The tag-list entry the completion refers to (ADD, DEL, matched receives), else 0.
    pub handle: u32,
    /// The source (QP / peer id given to `arrive`) of a receive completion, else 0.
    pub src: u32,
    /// TMH tag and app_ctx of a matched message (see [`Wc::read_tm_info`]).
    pub(super) tag: u64,
    pub(super) app_ctx: u32,
}

impl Wc {
    /// `ibv_wc_read_tm_info`: the `(tag, app_ctx)` of the TMH of a matched message.
    ///
    /// `None` for list-operation, NO_TAG and unexpected completions: hardware does not report
    /// the TMH of an unexpected message (rdma-core's tests read tag 0); software parses it
    /// from the SRQ buffer, where the whole message landed.
    #[inline]
    pub fn read_tm_info(&self) -> Option<(u64, u32)> {
        let matched = self.opcode == WcOpcode::TmRecv && self.flags.intersects(WcFlags::TM_MATCH | WcFlags::TM_DATA_VALID);
        matched.then_some((self.tag, self.app_ctx))
    }

    /// True for an unexpected tagged message: [`WcOpcode::TmRecv`] with neither
    /// [`WcFlags::TM_MATCH`] nor [`WcFlags::TM_DATA_VALID`]. Software must count every such
    /// completion, whatever its status, in the `unexpected_cnt` it reports to the SRQ.
    #[inline]
    pub fn is_unexpected(&self) -> bool {
        self.opcode == WcOpcode::TmRecv && !self.flags.intersects(WcFlags::TM_MATCH | WcFlags::TM_DATA_VALID)
    }
}
