//! Wire format of tagged messages: the Tag Matching Header (TMH) and the Rendezvous Header
//! (RVH), byte for byte as rdma-core's `infiniband/tm_types.h` defines them (big-endian).
//!
//! ```text
//! TMH (16 bytes): opcode u8 | reserved [u8; 3] | app_ctx be32 | tag be64
//! RVH (16 bytes): va be64 | rkey be32 | len be32
//! ```
//!
//! Message formats: eager `TMH | payload`; rendezvous request `TMH | RVH | meta-data`;
//! rendezvous response (FIN) `TMH | RVH` with the opcode changed to FIN; runtime control
//! messages ([`Control`]) `NO_TAG | kind | 0 0 | fields be32...`, which no NIC ever matches.
//! Decoding never panics: short or unknown input is an [`Error::Malformed`].

use crate::error::{Error, Result};

/// Size of an encoded [`Tmh`].
pub const TMH_LEN: usize = 16;
/// Size of an encoded [`Rvh`].
pub const RVH_LEN: usize = 16;

/// TMH opcodes (`enum ibv_tmh_op`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum TmOp {
    /// A message without a tag; always unexpected at the receiver.
    NoTag = 0,
    /// A rendezvous request: TMH | RVH | optional meta-data.
    Rndv = 1,
    /// A rendezvous completion: copy of the request's TMH and RVH with this opcode.
    Fin = 2,
    /// An eager tagged message: TMH | payload.
    Eager = 3,
}

impl TmOp {
    /// Decodes an opcode byte.
    ///
    /// # Errors
    /// [`Error::Malformed`] for a value that is not an opcode.
    #[inline]
    pub fn from_u8(v: u8) -> Result<Self> {
        match v {
            0 => Ok(TmOp::NoTag),
            1 => Ok(TmOp::Rndv),
            2 => Ok(TmOp::Fin),
            3 => Ok(TmOp::Eager),
            _ => Err(Error::Malformed { what: "unknown TMH opcode" }),
        }
    }
}

/// Tag Matching Header (`struct ibv_tmh`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Tmh {
    /// Operation.
    pub op: TmOp,
    /// Opaque user data (`app_ctx`), returned by `read_tm_info` as `priv`.
    pub app_ctx: u32,
    /// The 64-bit match tag.
    pub tag: u64,
}

impl Tmh {
    /// Writes the header into `out`.
    #[inline]
    pub fn encode(&self, out: &mut [u8; TMH_LEN]) {
        out[0] = self.op as u8;
        out[1..4].fill(0);
        out[4..8].copy_from_slice(&self.app_ctx.to_be_bytes());
        out[8..16].copy_from_slice(&self.tag.to_be_bytes());
    }

    /// Returns the encoded header.
    #[inline]
    pub fn to_bytes(&self) -> [u8; TMH_LEN] {
        let mut b = [0u8; TMH_LEN];
        self.encode(&mut b);
        b
    }

    /// Reads a header from the start of `buf` (extra bytes are the rest of the message).
    ///
    /// # Errors
    /// [`Error::Malformed`] if `buf` is shorter than [`TMH_LEN`], the opcode is unknown, or
    /// the reserved bytes are not zero.
    #[inline]
    pub fn decode(buf: &[u8]) -> Result<Self> {
        // (let-else, not `ok_or`: an error built eagerly is dropped on every message.)
        let Some(b) = buf.first_chunk::<TMH_LEN>() else {
            return Err(Error::Malformed { what: "message shorter than a TMH" });
        };
        let op = TmOp::from_u8(b[0])?;
        if b[1..4] != [0, 0, 0] {
            return Err(Error::Malformed { what: "TMH reserved bytes are not zero" });
        }
        let app_ctx = u32::from_be_bytes([b[4], b[5], b[6], b[7]]);
        let tag = u64::from_be_bytes([b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]]);
        Ok(Tmh { op, app_ctx, tag })
    }
}

/// Rendezvous Header (`struct ibv_rvh`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Rvh {
    /// Address of the sender's registered buffer (virtual address or offset, per `mr_mode`).
    pub va: u64,
    /// Remote key of the registration (low 32 bits; see the runtime's rendezvous meta-data
    /// for the full 64-bit key).
    pub rkey: u32,
    /// Length of the rendezvous payload.
    pub len: u32,
}

impl Rvh {
    /// Writes the header into `out`.
    #[inline]
    pub fn encode(&self, out: &mut [u8; RVH_LEN]) {
        out[0..8].copy_from_slice(&self.va.to_be_bytes());
        out[8..12].copy_from_slice(&self.rkey.to_be_bytes());
        out[12..16].copy_from_slice(&self.len.to_be_bytes());
    }

    /// Returns the encoded header.
    #[inline]
    pub fn to_bytes(&self) -> [u8; RVH_LEN] {
        let mut b = [0u8; RVH_LEN];
        self.encode(&mut b);
        b
    }

    /// Reads a header from the start of `buf`.
    ///
    /// # Errors
    /// [`Error::Malformed`] if `buf` is shorter than [`RVH_LEN`].
    #[inline]
    pub fn decode(buf: &[u8]) -> Result<Self> {
        let Some(b) = buf.first_chunk::<RVH_LEN>() else {
            return Err(Error::Malformed { what: "message shorter than an RVH" });
        };
        Ok(Rvh {
            va: u64::from_be_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]),
            rkey: u32::from_be_bytes([b[8], b[9], b[10], b[11]]),
            len: u32::from_be_bytes([b[12], b[13], b[14], b[15]]),
        })
    }
}

/// A whole tagged message split into its parts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Message<'a> {
    /// `NO_TAG`: everything after the opcode byte is opaque.
    NoTag(&'a [u8]),
    /// Eager: header and payload.
    Eager(Tmh, &'a [u8]),
    /// Rendezvous request: header, RVH and the optional meta-data.
    Rndv(Tmh, Rvh, &'a [u8]),
    /// Rendezvous completion: header and the RVH of the request it completes.
    Fin(Tmh, Rvh),
}

impl<'a> Message<'a> {
    /// Splits a message as it came off the wire.
    ///
    /// # Errors
    /// [`Error::Malformed`] for a short message, unknown opcode, or non-zero reserved bytes.
    pub fn parse(buf: &'a [u8]) -> Result<Self> {
        let Some(&first) = buf.first() else {
            return Err(Error::Malformed { what: "empty message" });
        };
        let op = TmOp::from_u8(first)?;
        if op == TmOp::NoTag {
            return Ok(Message::NoTag(&buf[1..]));
        }
        let tmh = Tmh::decode(buf)?;
        let rest = &buf[TMH_LEN..];
        match op {
            TmOp::Eager => Ok(Message::Eager(tmh, rest)),
            TmOp::Rndv => Ok(Message::Rndv(tmh, Rvh::decode(rest)?, &rest[RVH_LEN..])),
            TmOp::Fin => Ok(Message::Fin(tmh, Rvh::decode(rest)?)),
            TmOp::NoTag => unreachable!("handled above"),
        }
    }
}

/// Size of the longest encoded [`Control`] message.
pub const CONTROL_MAX_LEN: usize = 16;

const CTL_SSEND_ACK: u8 = 1;
const CTL_CREDIT: u8 = 2;
const CTL_COLL_ABORT: u8 = 3;

/// A control message between two runtimes, sent as a `NO_TAG` message (always unexpected at
/// the receiver's TM-SRQ, never counted, as a NIC treats `NO_TAG`):
///
/// ```text
/// NO_TAG u8 | kind u8 | 0 0 | fields, each be32
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Control {
    /// The receiver matched a synchronous send; `name` is the send's wire name (its
    /// `app_ctx` without the synchronous bit). Kind 1, one field.
    SsendAck {
        /// The send's wire name.
        name: u32,
    },
    /// The receiver consumed eager messages worth `bytes` of the sender's credit. Kind 2,
    /// one field.
    Credit {
        /// Credit returned, in bytes.
        bytes: u32,
    },
    /// A collective call failed because a rank departed; its other members give up on it
    /// too. Kind 3, three fields.
    CollAbort {
        /// The collective context of the communicator.
        ctx: u32,
        /// The call's sequence number on that communicator.
        seq: u32,
        /// World rank of the departed member.
        gone: u32,
    },
}

impl Control {
    /// Writes the whole message (opcode included) into `out`; returns its length.
    pub fn encode(&self, out: &mut [u8; CONTROL_MAX_LEN]) -> usize {
        out[0] = TmOp::NoTag as u8;
        out[2..4].fill(0);
        let (kind, fields): (u8, &[u32]) = match self {
            Control::SsendAck { name } => (CTL_SSEND_ACK, std::slice::from_ref(name)),
            Control::Credit { bytes } => (CTL_CREDIT, std::slice::from_ref(bytes)),
            Control::CollAbort { ctx, seq, gone } => {
                out[1] = CTL_COLL_ABORT;
                out[4..8].copy_from_slice(&ctx.to_be_bytes());
                out[8..12].copy_from_slice(&seq.to_be_bytes());
                out[12..16].copy_from_slice(&gone.to_be_bytes());
                return 16;
            }
        };
        out[1] = kind;
        for (i, f) in fields.iter().enumerate() {
            out[4 + 4 * i..8 + 4 * i].copy_from_slice(&f.to_be_bytes());
        }
        4 + 4 * fields.len()
    }

    /// Reads a control message from the body of a `NO_TAG` message (what follows the opcode,
    /// as [`Message::NoTag`] gives it).
    ///
    /// # Errors
    /// [`Error::Malformed`] for an unknown kind, a length that does not fit the kind, or
    /// non-zero reserved bytes.
    pub fn decode(body: &[u8]) -> Result<Self> {
        let field = |i: usize| -> u32 { u32::from_be_bytes([body[3 + 4 * i], body[4 + 4 * i], body[5 + 4 * i], body[6 + 4 * i]]) };
        let (kind, n) = match body.first() {
            Some(&CTL_SSEND_ACK) => (CTL_SSEND_ACK, 1),
            Some(&CTL_CREDIT) => (CTL_CREDIT, 1),
            Some(&CTL_COLL_ABORT) => (CTL_COLL_ABORT, 3),
            _ => return Err(Error::Malformed { what: "unknown control message" }),
        };
        if body.len() != 3 + 4 * n {
            return Err(Error::Malformed { what: "control message of the wrong length" });
        }
        if body[1..3] != [0, 0] {
            return Err(Error::Malformed { what: "control message reserved bytes are not zero" });
        }
        Ok(match kind {
            CTL_SSEND_ACK => Control::SsendAck { name: field(0) },
            CTL_CREDIT => Control::Credit { bytes: field(0) },
            _ => Control::CollAbort { ctx: field(0), seq: field(1), gone: field(2) },
        })
    }
}

impl std::fmt::Display for Control {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Control::SsendAck { name } => write!(f, "SSEND_ACK(send {name:#x})"),
            Control::Credit { bytes } => write!(f, "CREDIT({bytes} bytes)"),
            Control::CollAbort { ctx, seq, gone } => write!(f, "COLL_ABORT(context {ctx}, call {seq}, rank {gone} departed)"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn tmh_layout_is_big_endian() {
        let h = Tmh { op: TmOp::Eager, app_ctx: 0x0102_0304, tag: 0x1122_3344_5566_7788 };
        assert_eq!(h.to_bytes(), [3, 0, 0, 0, 1, 2, 3, 4, 0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88]);
    }

    #[test]
    fn rvh_layout_is_big_endian() {
        let r = Rvh { va: 0x0102_0304_0506_0708, rkey: 0xaabb_ccdd, len: 0x10 };
        assert_eq!(r.to_bytes(), [1, 2, 3, 4, 5, 6, 7, 8, 0xaa, 0xbb, 0xcc, 0xdd, 0, 0, 0, 0x10]);
    }

    #[test]
    fn rejects_malformed() {
        assert!(Tmh::decode(&[3, 0, 0]).is_err());
        assert!(Tmh::decode(&[9; 16]).is_err());
        let mut b = Tmh { op: TmOp::Eager, app_ctx: 0, tag: 0 }.to_bytes();
        b[2] = 1;
        assert!(Tmh::decode(&b).is_err());
        assert!(Message::parse(&[]).is_err());
        let rndv_short = Tmh { op: TmOp::Rndv, app_ctx: 0, tag: 0 }.to_bytes();
        assert!(Message::parse(&rndv_short).is_err());
    }

    #[test]
    fn parses_each_kind() {
        let t = Tmh { op: TmOp::Eager, app_ctx: 1, tag: 2 };
        let mut m = t.to_bytes().to_vec();
        m.extend_from_slice(b"abc");
        assert_eq!(Message::parse(&m).unwrap(), Message::Eager(t, b"abc"));
        let t = Tmh { op: TmOp::Rndv, ..t };
        let r = Rvh { va: 5, rkey: 6, len: 7 };
        let mut m = t.to_bytes().to_vec();
        m.extend_from_slice(&r.to_bytes());
        m.extend_from_slice(b"meta");
        assert_eq!(Message::parse(&m).unwrap(), Message::Rndv(t, r, b"meta"));
        assert_eq!(Message::parse(&[0, 9, 9]).unwrap(), Message::NoTag(&[9, 9]));
    }

    #[test]
    fn control_layout() {
        let mut b = [0u8; CONTROL_MAX_LEN];
        let n = Control::Credit { bytes: 0x0102_0304 }.encode(&mut b);
        assert_eq!(&b[..n], &[0, 2, 0, 0, 1, 2, 3, 4]);
        let n = Control::CollAbort { ctx: 1, seq: 2, gone: 3 }.encode(&mut b);
        assert_eq!(&b[..n], &[0, 3, 0, 0, 0, 0, 0, 1, 0, 0, 0, 2, 0, 0, 0, 3]);
        assert_eq!(Control::SsendAck { name: 7 }.to_string(), "SSEND_ACK(send 0x7)");
        // Wrong length, unknown kind, reserved bytes set.
        assert!(Control::decode(&[2, 0, 0, 1, 2, 3]).is_err());
        assert!(Control::decode(&[9, 0, 0, 1, 2, 3, 4]).is_err());
        assert!(Control::decode(&[2, 1, 0, 1, 2, 3, 4]).is_err());
        assert!(Control::decode(&[]).is_err());
    }

    proptest! {
        #[test]
        fn control_roundtrip(kind in 0u8..3, a: u32, b: u32, c: u32) {
            let m = match kind {
                0 => Control::SsendAck { name: a },
                1 => Control::Credit { bytes: a },
                _ => Control::CollAbort { ctx: a, seq: b, gone: c },
            };
            let mut buf = [0u8; CONTROL_MAX_LEN];
            let n = m.encode(&mut buf);
            prop_assert_eq!(Message::parse(&buf[..n]).unwrap(), Message::NoTag(&buf[1..n]));
            prop_assert_eq!(Control::decode(&buf[1..n]).unwrap(), m);
        }
        #[test]
        fn control_decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..24)) {
            let _ = Control::decode(&bytes);
        }
        #[test]
        fn tmh_roundtrip(op in 0u8..4, ctx: u32, tag: u64) {
            let h = Tmh { op: TmOp::from_u8(op).unwrap(), app_ctx: ctx, tag };
            prop_assert_eq!(Tmh::decode(&h.to_bytes()).unwrap(), h);
        }
        #[test]
        fn rvh_roundtrip(va: u64, rkey: u32, len: u32) {
            let r = Rvh { va, rkey, len };
            prop_assert_eq!(Rvh::decode(&r.to_bytes()).unwrap(), r);
        }
        #[test]
        fn parse_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            let _ = Message::parse(&bytes);
        }
    }
}
