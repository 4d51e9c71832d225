//! Tag-list operations (`struct ibv_ops_wr` for `ibv_post_srq_ops`).

/// Flags of an [`OpsWr`] (`enum ibv_ops_flags`, same bit values).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct OpsFlags(pub u32);

impl OpsFlags {
    /// No flag: the op completes silently unless it fails.
    pub const NONE: OpsFlags = OpsFlags(0);
    /// `IBV_OPS_SIGNALED`: produce a completion when the op succeeds.
    pub const SIGNALED: OpsFlags = OpsFlags(1 << 0);
    /// `IBV_OPS_TM_SYNC`: the op carries [`OpsWr::unexpected_cnt`]. Without this flag the
    /// count is ignored and the SRQ keeps the last count it was given.
    pub const TM_SYNC: OpsFlags = OpsFlags(1 << 1);
    /// Every defined bit.
    pub const ALL: OpsFlags = OpsFlags(Self::SIGNALED.0 | Self::TM_SYNC.0);

    /// True if every bit of `other` is set in `self`.
    #[inline]
    pub const fn contains(self, other: OpsFlags) -> bool {
        self.0 & other.0 == other.0
    }
}

impl core::ops::BitOr for OpsFlags {
    type Output = OpsFlags;
    #[inline]
    fn bitor(self, rhs: OpsFlags) -> OpsFlags {
        OpsFlags(self.0 | rhs.0)
    }
}

/// The operation of an [`OpsWr`] (`enum ibv_ops_wr_opcode` with its arguments).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpsOp {
    /// `IBV_WR_TAG_ADD`: append a tagged buffer to the matching list. A message matches when
    /// `msg.tag & mask == tag & mask` (the tag is masked on entry, as mlx5 does, so bits of
    /// `tag` outside `mask` never matter).
    Add {
        /// Match tag.
        tag: u64,
        /// Bits of the tag that must be equal; `u64::MAX` for an exact match.
        mask: u64,
        /// Identifies the buffer in its receive completions.
        recv_wr_id: u64,
        /// Length of the buffer's single scatter entry (0 is allowed).
        len: usize,
    },
    /// `IBV_WR_TAG_DEL`: remove an entry. Fails with a [`super::WcStatus::TmErr`] completion if
    /// the entry is no longer in the list (consumed, being consumed, deleted).
    Del {
        /// The handle its ADD returned.
        handle: u32,
    },
    /// `IBV_WR_TAG_SYNC`: no list change; only reports the unexpected count (set
    /// [`OpsFlags::TM_SYNC`]).
    Sync,
}

/// One tag-list work request (`struct ibv_ops_wr`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpsWr {
    /// Identifies the op in its completion.
    pub wr_id: u64,
    /// What to do.
    pub opcode: OpsOp,
    /// [`OpsFlags::SIGNALED`], [`OpsFlags::TM_SYNC`].
    pub flags: OpsFlags,
    /// Number of unexpected messages software has handled, used when
    /// [`OpsFlags::TM_SYNC`] is set. Only its low 16 bits reach the hardware, so software may
    /// keep a wrapping 16-bit or a 32-bit count.
    pub unexpected_cnt: u32,
    /// Output of a successful ADD posted through [`super::TmSrq::post_srq_ops`]: the new
    /// entry's handle (input of DEL is [`OpsOp::Del::handle`]). Unchanged for other ops.
    pub handle: u32,
}

impl OpsWr {
    /// A TAG_ADD carrying the unexpected count (flags `TM_SYNC`, plus `SIGNALED` if asked).
    pub fn add(wr_id: u64, tag: u64, mask: u64, recv_wr_id: u64, len: usize, unexpected_cnt: u32, signaled: bool) -> Self {
        OpsWr { wr_id, opcode: OpsOp::Add { tag, mask, recv_wr_id, len }, flags: sync_flags(signaled), unexpected_cnt, handle: 0 }
    }

    /// A TAG_DEL carrying the unexpected count (flags `TM_SYNC`, plus `SIGNALED` if asked).
    pub fn del(wr_id: u64, handle: u32, unexpected_cnt: u32, signaled: bool) -> Self {
        OpsWr { wr_id, opcode: OpsOp::Del { handle }, flags: sync_flags(signaled), unexpected_cnt, handle: 0 }
    }

    /// A TAG_SYNC reporting `unexpected_cnt` (flags `TM_SYNC`, plus `SIGNALED` if asked): the
    /// flags rdma-core's suite posts it with (`tests/test_tag_matching.py`, `post_sync`:
    /// `IBV_OPS_SIGNALED | IBV_OPS_TM_SYNC`); without `TM_SYNC` the count would be ignored.
    pub fn sync(wr_id: u64, unexpected_cnt: u32, signaled: bool) -> Self {
        OpsWr { wr_id, opcode: OpsOp::Sync, flags: sync_flags(signaled), unexpected_cnt, handle: 0 }
    }
}

#[inline]
fn sync_flags(signaled: bool) -> OpsFlags {
    if signaled {
        OpsFlags::SIGNALED | OpsFlags::TM_SYNC
    } else {
        OpsFlags::TM_SYNC
    }
}
