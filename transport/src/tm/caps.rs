//! Device tag-matching capabilities (`struct ibv_tm_caps`) and the per-SRQ request
//! (`struct ibv_tm_cap`, plus the SRQ depth of `ibv_srq_attr::max_wr`).

use super::TmErrno;

/// Capability flags of [`TmCaps::flags`] (`enum ibv_tm_cap_flags`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct TmCapFlags(pub u32);

impl TmCapFlags {
    /// `IBV_TM_CAP_RC`: tag matching is supported on RC transport.
    pub const RC: TmCapFlags = TmCapFlags(1 << 0);

    /// True if every bit of `other` is set in `self`.
    #[inline]
    pub const fn contains(self, other: TmCapFlags) -> bool {
        self.0 & other.0 == other.0
    }
}

/// What the (modelled) device supports, as `ibv_query_device_ex()` reports it in `tm_caps`.
///
/// [`TmCaps::default`] is the device this crate models: a ConnectX-class NIC with a
/// 1023-entry matching list (the hardware list has 2^10 entries, one kept as a sentinel).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TmCaps {
    /// Maximum size of a rendezvous request (TMH, RVH and meta-data together), in bytes.
    pub max_rndv_hdr_size: u32,
    /// Maximum number of tagged buffers in a TM-SRQ matching list.
    pub max_num_tags: u32,
    /// Maximum number of outstanding tag-list operations.
    pub max_ops: u32,
    /// Maximum number of scatter entries of a tagged buffer (the model supports exactly one).
    pub max_sge: u32,
    /// Capability flags, see [`TmCapFlags`].
    pub flags: TmCapFlags,
    /// Maximum number of untagged buffers posted to the SRQ at once (`max_srq_wr`).
    pub max_srq_wr: u32,
}

impl Default for TmCaps {
    fn default() -> Self {
        TmCaps { max_rndv_hdr_size: 64, max_num_tags: 1023, max_ops: 1024, max_sge: 1, flags: TmCapFlags::RC, max_srq_wr: 1 << 15 }
    }
}

/// The TM properties requested when creating a TM-SRQ (`struct ibv_tm_cap`, plus the SRQ
/// depth `max_wr` that `ibv_create_srq_ex` takes alongside it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TmCap {
    /// Size of the matching list.
    pub max_num_tags: u32,
    /// Number of outstanding tag-list operations (the depth of the command queue).
    pub max_ops: u32,
    /// Depth of the untagged SRQ (buffers for unexpected and NO_TAG messages).
    pub max_wr: u32,
}

impl Default for TmCap {
    /// The largest list the default device allows, 1024 outstanding ops, 4096 SRQ buffers.
    fn default() -> Self {
        TmCap { max_num_tags: 1023, max_ops: 1024, max_wr: 4096 }
    }
}

impl TmCaps {
    /// Checks a creation request against these capabilities, as the kernel does when
    /// `ibv_create_srq_ex` asks for an `IBV_SRQT_TM` SRQ.
    ///
    /// # Errors
    /// [`TmErrno::Inval`] if the device lacks [`TmCapFlags::RC`] or `max_sge` is 0, if a
    /// device limit does not fit the 16-bit hardware indices, or if any requested value is 0
    /// or exceeds the matching capability.
    pub fn validate(&self, cap: &TmCap) -> Result<(), TmErrno> {
        let device_ok = self.flags.contains(TmCapFlags::RC)
            && self.max_sge >= 1
            && self.max_num_tags <= u32::from(u16::MAX)
            && self.max_rndv_hdr_size >= (crate::wire::TMH_LEN + crate::wire::RVH_LEN) as u32;
        let request_ok = (1..=self.max_num_tags).contains(&cap.max_num_tags)
            && (1..=self.max_ops).contains(&cap.max_ops)
            && (1..=self.max_srq_wr).contains(&cap.max_wr);
        if device_ok && request_ok {
            Ok(())
        } else {
            Err(TmErrno::Inval)
        }
    }
}
