//! The 64-bit tag tmpi gives the provider to match (`fi_tsend`/`fi_trecv`).
//!
//! ```text
//!  63    60 59             44 43                 24 23                      0
//! | proto 4 |   context 16    |      source 20      |         tag 24          |
//! ```
//!
//! - **proto** says what the message is, and is never ignored by a receive, so a wildcard
//!   receive can only match messages of its own protocol: [`PROTO_MPI`] (point-to-point,
//!   phase 2), [`PROTO_PACKET`] (the packet channel of [`super::OfiFabric`], which matches
//!   any source and context), [`PROTO_SYNC_ACK`] (the acknowledgement of a synchronous send,
//!   phase 2; kept out of every MPI receive's reach, as MPICH keeps its `SSEND_ACK` bit
//!   outside its protocol mask and Open MPI's `ANY_TAG` mask excludes its internal tags).
//! - **context** is the communicator's context id. tmpi's software match key
//!   (`tmpi::matching`) has 20 context bits; over OFI a job may use 2^16 of them (phase 2
//!   checks this when it creates a communicator, as MPICH checks its 20 and Open MPI its
//!   12-30 bits of communicator id).
//! - **source** is the sending rank (20 bits, `bootstrap::MAX_RANKS`). It is in the tag
//!   (Open MPI's `ofi_tag_1` style) rather than in remote CQ data (MPICH's and Open MPI's
//!   default where `FI_REMOTE_CQ_DATA` is offered), so the layout needs nothing beyond
//!   `FI_TAGGED` and a receive can filter on the source in the provider either way.
//! - **tag** is the MPI tag (`TAG_UB` = 2^24 - 1, as in the software matcher).
//!
//! `ANY_TAG` ignores the tag field; `ANY_SOURCE` ignores the source field and posts with
//! `FI_ADDR_UNSPEC`. A receive from one source sets the source field and, where the provider
//! offers `FI_DIRECTED_RECV`, also names the source's `fi_addr_t`, so the provider filters by
//! address as well as by bits.

/// Width of the protocol field.
pub const PROTO_BITS: u32 = 4;
/// Width of the context field.
pub const CTX_BITS: u32 = 16;
/// Width of the source field.
pub const SRC_BITS: u32 = 20;
/// Width of the MPI tag field.
pub const TAG_BITS: u32 = 24;
/// Position of the source field.
pub const SRC_SHIFT: u32 = TAG_BITS;
/// Position of the context field.
pub const CTX_SHIFT: u32 = TAG_BITS + SRC_BITS;
/// Position of the protocol field.
pub const PROTO_SHIFT: u32 = CTX_SHIFT + CTX_BITS;
const _: () = assert!(PROTO_SHIFT + PROTO_BITS == 64);

/// The MPI tag bits.
pub const TAG_FIELD: u64 = (1 << TAG_BITS) - 1;
/// The source bits.
pub const SRC_FIELD: u64 = ((1 << SRC_BITS) - 1) << SRC_SHIFT;
/// The context bits.
pub const CTX_FIELD: u64 = ((1 << CTX_BITS) - 1) << CTX_SHIFT;
/// The protocol bits.
pub const PROTO_FIELD: u64 = ((1 << PROTO_BITS) - 1) << PROTO_SHIFT;

/// Point-to-point messages of MPI (phase 2).
pub const PROTO_MPI: u64 = 0;
/// Packets of [`super::OfiFabric`].
pub const PROTO_PACKET: u64 = 1;
/// Synchronous-send acknowledgements (phase 2).
pub const PROTO_SYNC_ACK: u64 = 2;

/// Wildcard source or tag in [`recv`].
pub const ANY: Option<u32> = None;

/// A message's tag, or `None` when a field does not fit its width.
pub const fn send(proto: u64, ctx: u32, src: u32, tag: u32) -> Option<u64> {
    if proto >= 1 << PROTO_BITS || ctx >= 1 << CTX_BITS || src >= 1 << SRC_BITS || tag >= 1 << TAG_BITS {
        return None;
    }
    Some(proto << PROTO_SHIFT | (ctx as u64) << CTX_SHIFT | (src as u64) << SRC_SHIFT | tag as u64)
}

/// A receive's `(tag, ignore)` for `src` and `tag` (`None`: any), or `None` when a field
/// does not fit. The protocol and context are never ignored.
pub const fn recv(proto: u64, ctx: u32, src: Option<u32>, tag: Option<u32>) -> Option<(u64, u64)> {
    let (s, si) = match src {
        Some(s) => (s, 0),
        None => (0, SRC_FIELD),
    };
    let (t, ti) = match tag {
        Some(t) => (t, 0),
        None => (0, TAG_FIELD),
    };
    match send(proto, ctx, s, t) {
        Some(bits) => Some((bits, si | ti)),
        None => None,
    }
}

/// The fields of a tag: `(proto, context, source, tag)`.
pub const fn fields(bits: u64) -> (u64, u32, u32, u32) {
    (bits >> PROTO_SHIFT, ((bits & CTX_FIELD) >> CTX_SHIFT) as u32, ((bits & SRC_FIELD) >> SRC_SHIFT) as u32, (bits & TAG_FIELD) as u32)
}

/// Whether a message tagged `bits` matches a receive `(tag, ignore)`, as a provider decides
/// (`fi_tagged(3)`: equal in every bit not ignored).
pub const fn matches(bits: u64, tag: u64, ignore: u64) -> bool {
    (bits ^ tag) & !ignore == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_are_disjoint_and_cover_64_bits() {
        let all = [TAG_FIELD, SRC_FIELD, CTX_FIELD, PROTO_FIELD];
        for (i, a) in all.iter().enumerate() {
            for b in &all[i + 1..] {
                assert_eq!(a & b, 0);
            }
        }
        assert_eq!(all.iter().fold(0, |x, y| x | y), u64::MAX);
    }

    #[test]
    fn wildcard_table() {
        let m = send(PROTO_MPI, 7, 3, 42).unwrap();
        assert_eq!(fields(m), (PROTO_MPI, 7, 3, 42));
        // (receive source, receive tag, receive context, matches)
        let table: &[(Option<u32>, Option<u32>, u32, bool)] = &[
            (Some(3), Some(42), 7, true),
            (None, Some(42), 7, true),
            (Some(3), None, 7, true),
            (None, None, 7, true),
            (Some(4), Some(42), 7, false),
            (Some(3), Some(41), 7, false),
            (None, None, 8, false),
        ];
        for &(src, tg, ctx, want) in table {
            let (t, i) = recv(PROTO_MPI, ctx, src, tg).unwrap();
            assert_eq!(matches(m, t, i), want, "{src:?} {tg:?} {ctx}");
        }
        // A wildcard MPI receive never matches another protocol's message.
        let ack = send(PROTO_SYNC_ACK, 7, 3, 42).unwrap();
        let (t, i) = recv(PROTO_MPI, 7, ANY, ANY).unwrap();
        assert!(!matches(ack, t, i));
    }

    #[test]
    fn out_of_range_fields_are_refused() {
        assert_eq!(send(16, 0, 0, 0), None);
        assert_eq!(send(0, 1 << 16, 0, 0), None);
        assert_eq!(send(0, 0, 1 << 20, 0), None);
        assert_eq!(send(0, 0, 0, 1 << 24), None);
        assert!(send(15, (1 << 16) - 1, (1 << 20) - 1, (1 << 24) - 1).is_some_and(|t| t == u64::MAX));
        assert_eq!(recv(0, 0, Some(1 << 20), ANY), None);
    }
}
