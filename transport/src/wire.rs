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
//! One-sided packets of the rendezvous protocol (read requests, responses, grants: [`Rma`])
//! travel apart from tagged messages, as the fabric's `PKT_RMA` packets.
//! Decoding never panics: short or unknown input is an [`Error::Malformed`].

use crate::error::{Error, Result};
use crate::shm::heap::HeapDesc;

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
        // Two whole words (opcode, three zero bytes, the context; the tag), each one store:
        // the header is copied into the ring right after, and a copy that read bytes written
        // piecemeal would wait for those stores to reach the cache.
        let w0 = u64::from(self.op as u8) | u64::from(u32::from_le_bytes(self.app_ctx.to_be_bytes())) << 32;
        out[..8].copy_from_slice(&w0.to_le_bytes());
        out[8..].copy_from_slice(&self.tag.to_be_bytes());
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
        Ok(Self::fields(op, b))
    }

    /// Reads a header as the hardware does: opcode, `app_ctx` and tag. Unlike
    /// [`Tmh::decode`] (the software decoder, which refuses them) the reserved bytes are
    /// ignored: rdma-core's suite (`tests/test_tag_matching.py`, `write_tm_header`) sends
    /// TMHs whose reserved bytes and `app_ctx` are left over from the payload and expects
    /// them matched. `None` for a buffer shorter than [`TMH_LEN`] or an unknown opcode.
    #[inline]
    pub fn decode_as_hardware(buf: &[u8]) -> Option<Self> {
        let b = buf.first_chunk::<TMH_LEN>()?;
        let op = match b[0] {
            0 => TmOp::NoTag,
            1 => TmOp::Rndv,
            2 => TmOp::Fin,
            3 => TmOp::Eager,
            _ => return None,
        };
        Some(Self::fields(op, b))
    }

    /// The header of opcode `op` whose other fields are in `b`.
    #[inline(always)]
    fn fields(op: TmOp, b: &[u8; TMH_LEN]) -> Self {
        let app_ctx = u32::from_be_bytes([b[4], b[5], b[6], b[7]]);
        let tag = u64::from_be_bytes([b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]]);
        Tmh { op, app_ctx, tag }
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

/// Length of a FIN message: the request's TMH (opcode FIN) and RVH.
pub const FIN_LEN: usize = TMH_LEN + RVH_LEN;

/// A FIN: the receiver of a rendezvous has its data. It repeats the request's TMH (with
/// opcode FIN) and RVH, which name the send it completes. Sent by software and by the
/// TM-SRQ alike.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fin {
    /// The request's TMH (its opcode is replaced by FIN).
    pub tmh: Tmh,
    /// The request's RVH.
    pub rvh: Rvh,
}

impl Fin {
    /// The encoded FIN.
    #[inline]
    pub fn to_bytes(&self) -> [u8; FIN_LEN] {
        let mut b = [0u8; FIN_LEN];
        b[..TMH_LEN].copy_from_slice(&Tmh { op: TmOp::Fin, ..self.tmh }.to_bytes());
        b[TMH_LEN..].copy_from_slice(&self.rvh.to_bytes());
        b
    }
}

/// Length of the rendezvous meta-data this crate defines after the RVH: the payload length and
/// flags, each a big-endian `u64` (see [`RndvRequest`]).
pub const RNDV_META_LEN: usize = 16;
/// Meta-data flag: the sender has checked the RVH's range for a single-copy read by the
/// destination (see [`RndvRequest::pregranted`]).
pub const RNDV_FLAG_PREGRANTED: u64 = 1;
/// Length of a rendezvous request built by [`RndvRequest::encode`]: TMH, RVH, meta-data.
pub const RNDV_REQ_LEN: usize = TMH_LEN + RVH_LEN + RNDV_META_LEN;
/// Meta-data flag: a fabric key follows the meta-data ([`FabricKey`], the OFI fabric's
/// `fi_mr_reg` registration of the same buffer, which the receiver may `fi_read`).
pub const RNDV_FLAG_FABRIC_KEY: u64 = 2;
/// Length of the [`FabricKey`] after the meta-data: the key and the address, each a
/// big-endian `u64`.
pub const RNDV_FABRIC_LEN: usize = 16;
/// Length of a rendezvous request with a fabric key ([`RndvRequest::encode_with`]): 64 bytes,
/// the whole of `max_rndv_hdr_size`.
pub const RNDV_REQ_FABRIC_LEN: usize = RNDV_REQ_LEN + RNDV_FABRIC_LEN;
/// Where the meta-data's two words start in a rendezvous request: the length, then the flags.
const META_LEN_AT: usize = TMH_LEN + RVH_LEN;
const META_FLAGS_AT: usize = META_LEN_AT + 8;

/// The RVH `len` that tmpi's senders write for a payload of `u32::MAX` bytes or more: "the
/// length does not fit the RVH; read it from the meta-data". Hardware gives it no meaning
/// (it is an ordinary length to it); see [`RndvRequest`] for why that is safe.
pub const RVH_LEN_IN_META: u32 = u32::MAX;

/// A rendezvous request as tmpi's senders build it: `TMH | RVH | meta-data`, where the
/// meta-data is the payload length and a word of flags ([`RNDV_FLAG_PREGRANTED`]), each a
/// big-endian `u64`: 48 bytes, within the 64 of `max_rndv_hdr_size`.
///
/// # What the hardware path reads, and the two software extensions
///
/// The TM-SRQ serves an expected request from the RVH alone (`va`, 32-bit `rkey`, 32-bit
/// `len`), as the seed says (the optional data "may be inspected by receiver SW if the
/// message is deemed unexpected"); bytes after the RVH never change what it reads. So that
/// the RVH is the whole truth:
///
/// - **Keys.** The `rkey` is the sender's fi_mr key itself: the runtime opens its fi_mr
///   domain with `mr_key_size` 4 (as libfabric's verbs provider does, whose keys are the
///   verbs rkeys), so every key fits 32 bits and the target's key check
///   ([`crate::mr::Domain::check_remote`] with `u64::from(rkey)`) stays the single
///   authority before any byte moves. A wider key cannot be encoded ([`RndvRequest::rkey`]
///   is a `u32`); truncating one would only make the target refuse the read.
/// - **Payloads of `u32::MAX` bytes or more** (the software path): the RVH's `len` is
///   [`RVH_LEN_IN_META`] and the real length is in the meta-data. The runtime never posts a
///   tagged buffer of `u32::MAX` bytes or more, and the model refuses one (an ADD above
///   [`MAX_TAGGED_LEN`](crate::tm::MAX_TAGGED_LEN) is `EINVAL`), so the hardware finds every tagged buffer smaller than
///   `RVH_LEN_IN_META` and completes such a request `TM_RNDV_INCOMPLETE` with the headers
///   in the buffer, or it arrives unexpected: either way software finishes it, reading the
///   length with [`RndvRequest::payload_len`]. (UCX reaches the same end differently: it
///   sends rendezvous requests the device cannot serve as tagged eager messages, its
///   "software rendezvous".)
///
/// Software reads the same `(va, rkey, len)` as the hardware, except for the length of the
/// long messages above.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RndvRequest {
    /// TMH `app_ctx`.
    pub app_ctx: u32,
    /// TMH tag.
    pub tag: u64,
    /// RVH address of the sender's registered buffer.
    pub va: u64,
    /// RVH remote key: the sender's fi_mr key.
    pub rkey: u32,
    /// Payload length.
    pub len: u64,
    /// The sender (the read's target) has already checked `(rkey, va, len, read)` in its
    /// fi_mr domain for a single-copy read by the destination, and holds the buffer until
    /// FIN: the receiver may copy it without asking (one round trip fewer). Only software
    /// reads it; the hardware path serves the RVH as always.
    pub pregranted: bool,
}

impl RndvRequest {
    /// The encoded request (TMH with opcode RNDV, RVH, meta-data).
    pub fn encode(&self) -> [u8; RNDV_REQ_LEN] {
        let mut b = [0u8; RNDV_REQ_LEN];
        let tmh = Tmh { op: TmOp::Rndv, app_ctx: self.app_ctx, tag: self.tag };
        let rvh = Rvh { va: self.va, rkey: self.rkey, len: u32::try_from(self.len).unwrap_or(RVH_LEN_IN_META) };
        b[..TMH_LEN].copy_from_slice(&tmh.to_bytes());
        b[TMH_LEN..TMH_LEN + RVH_LEN].copy_from_slice(&rvh.to_bytes());
        b[META_LEN_AT..META_FLAGS_AT].copy_from_slice(&self.len.to_be_bytes());
        let flags = if self.pregranted { RNDV_FLAG_PREGRANTED } else { 0 };
        b[META_FLAGS_AT..].copy_from_slice(&flags.to_be_bytes());
        b
    }

    /// The payload length software reads from a whole request `req` (TMH, RVH, anything): the
    /// RVH's `len`, unless it is [`RVH_LEN_IN_META`], in which case the meta-data's (which
    /// must then be there and be at least `u32::MAX`). `None` for a request too short or
    /// inconsistent.
    pub fn payload_len(req: &[u8]) -> Option<u64> {
        let rvh = Rvh::decode(req.get(TMH_LEN..)?).ok()?;
        if rvh.len != RVH_LEN_IN_META {
            return Some(u64::from(rvh.len));
        }
        let m: [u8; 8] = req.get(META_LEN_AT..META_FLAGS_AT)?.try_into().ok()?;
        let len = u64::from_be_bytes(m);
        (len >= u64::from(RVH_LEN_IN_META)).then_some(len)
    }

    /// Reads a whole request as software does (see [`RndvRequest::payload_len`]); `None` if
    /// it is not a valid rendezvous request.
    pub fn parse(req: &[u8]) -> Option<RndvRequest> {
        let tmh = Tmh::decode_as_hardware(req).filter(|t| t.op == TmOp::Rndv)?;
        let rvh = Rvh::decode(req.get(TMH_LEN..)?).ok()?;
        let len = Self::payload_len(req)?;
        Some(RndvRequest { app_ctx: tmh.app_ctx, tag: tmh.tag, va: rvh.va, rkey: rvh.rkey, len, pregranted: Self::pregranted(req) })
    }

    /// The request with a fabric key after its meta-data ([`RNDV_FLAG_FABRIC_KEY`]).
    pub fn encode_with(&self, fk: FabricKey) -> [u8; RNDV_REQ_FABRIC_LEN] {
        let mut b = [0u8; RNDV_REQ_FABRIC_LEN];
        b[..RNDV_REQ_LEN].copy_from_slice(&self.encode());
        let flags = RNDV_FLAG_FABRIC_KEY | if self.pregranted { RNDV_FLAG_PREGRANTED } else { 0 };
        b[META_FLAGS_AT..RNDV_REQ_LEN].copy_from_slice(&flags.to_be_bytes());
        b[RNDV_REQ_LEN..RNDV_REQ_LEN + 8].copy_from_slice(&fk.key.to_be_bytes());
        b[RNDV_REQ_LEN + 8..].copy_from_slice(&fk.addr.to_be_bytes());
        b
    }

    /// The fabric key of a whole request `req`, if its flags announce one and it is there
    /// (`None` for a request without, or one cut short).
    pub fn fabric_key(req: &[u8]) -> Option<FabricKey> {
        let f: [u8; 8] = req.get(META_FLAGS_AT..RNDV_REQ_LEN)?.try_into().ok()?;
        if u64::from_be_bytes(f) & RNDV_FLAG_FABRIC_KEY == 0 {
            return None;
        }
        let k: [u8; 8] = req.get(RNDV_REQ_LEN..RNDV_REQ_LEN + 8)?.try_into().ok()?;
        let a: [u8; 8] = req.get(RNDV_REQ_LEN + 8..RNDV_REQ_FABRIC_LEN)?.try_into().ok()?;
        Some(FabricKey { key: u64::from_be_bytes(k), addr: u64::from_be_bytes(a) })
    }

    /// Whether a whole request `req` says [`RndvRequest::pregranted`] (false when its
    /// meta-data is short or absent).
    pub fn pregranted(req: &[u8]) -> bool {
        req.get(META_FLAGS_AT..RNDV_REQ_LEN)
            .and_then(|f| <[u8; 8]>::try_from(f).ok())
            .is_some_and(|f| u64::from_be_bytes(f) & RNDV_FLAG_PREGRANTED != 0)
    }
}

/// The sender's registration of a rendezvous buffer in a real fabric's domain (the OFI
/// fabric's `fi_mr_reg`), sent after the request's meta-data: the receiver reads the buffer
/// with `fi_read` at `addr` (the first byte's address, as the provider's `FI_MR_VIRT_ADDR`
/// says: virtual address or offset in the region) with `key`. The RVH keeps naming the soft
/// registration, which serves a streamed read if the `fi_read` fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FabricKey {
    /// The remote key (`fi_mr_key`).
    pub key: u64,
    /// The address the reader names for the buffer's first byte.
    pub addr: u64,
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
const CTL_EAGER_BELOW: u8 = 4;
const CTL_REVOKE: u8 = 5;
const CTL_REVOKE_ACK: u8 = 6;
const CTL_READ_WAY: u8 = 7;

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
    /// A collective call failed at the sender, because a rank departed or (when `gone` is
    /// the sender itself) with an error of the sender's own; its other members give up on it
    /// too. Kind 3, three fields.
    CollAbort {
        /// The collective context of the communicator.
        ctx: u32,
        /// The call's sequence number on that communicator (its low 16 bits for a
        /// departure, all 32 for the sender's own failure).
        seq: u32,
        /// World rank of the departed member, or of the sender when the call failed there.
        gone: u32,
    },
    /// The receiver measured that messages below `bytes` go at least as fast eagerly as by
    /// rendezvous: the sender sends them eagerly from now on (it never lowers its threshold
    /// for this, nor raises it above its configured one). Kind 4, one field.
    EagerBelow {
        /// Messages shorter than this go eagerly.
        bytes: u32,
    },
    /// The sender of a pre-granted rendezvous (see `tm::RndvRequest::pregranted`) abandons it:
    /// the receiver must not copy its buffer any more (a later read asks, and is refused), and
    /// answers [`Control::RevokeAck`] unless its FIN went first. Kind 5, one field.
    Revoke {
        /// The send's wire name (its `app_ctx`).
        name: u32,
    },
    /// Answer to [`Control::Revoke`]: the receiver will not touch the send's buffer. Kind 6,
    /// one field.
    RevokeAck {
        /// The send's wire name.
        name: u32,
    },
    /// The sender (the lower rank of two that read the same sizes from each other) will do
    /// its next rendezvous reads of `2^class ..= 2^(class+1) - 1` bytes `way`'s way; the
    /// receiver reads its own of that class the same way. Kind 7, two fields.
    ReadWay {
        /// The size class: log2 of its smallest read (below 64).
        class: u32,
        /// 0: pipelined through the rings; 1: single copy.
        way: u32,
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
            Control::EagerBelow { bytes } => (CTL_EAGER_BELOW, std::slice::from_ref(bytes)),
            Control::Revoke { name } => (CTL_REVOKE, std::slice::from_ref(name)),
            Control::RevokeAck { name } => (CTL_REVOKE_ACK, std::slice::from_ref(name)),
            Control::ReadWay { class, way } => {
                out[1] = CTL_READ_WAY;
                out[4..8].copy_from_slice(&class.to_be_bytes());
                out[8..12].copy_from_slice(&way.to_be_bytes());
                return 12;
            }
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
            Some(&CTL_EAGER_BELOW) => (CTL_EAGER_BELOW, 1),
            Some(&CTL_REVOKE) => (CTL_REVOKE, 1),
            Some(&CTL_REVOKE_ACK) => (CTL_REVOKE_ACK, 1),
            Some(&CTL_READ_WAY) => (CTL_READ_WAY, 2),
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
            CTL_EAGER_BELOW => Control::EagerBelow { bytes: field(0) },
            CTL_REVOKE => Control::Revoke { name: field(0) },
            CTL_REVOKE_ACK => Control::RevokeAck { name: field(0) },
            CTL_READ_WAY => Control::ReadWay { class: field(0), way: field(1) },
            _ => Control::CollAbort { ctx: field(0), seq: field(1), gone: field(2) },
        })
    }
}

impl std::fmt::Display for Control {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Control::SsendAck { name } => write!(f, "SSEND_ACK(send {name:#x})"),
            Control::Credit { bytes } => write!(f, "CREDIT({bytes} bytes)"),
            Control::EagerBelow { bytes } => write!(f, "EAGER_BELOW({bytes} bytes)"),
            Control::Revoke { name } => write!(f, "REVOKE(send {name:#x})"),
            Control::RevokeAck { name } => write!(f, "REVOKE_ACK(send {name:#x})"),
            Control::ReadWay { class, way } => write!(f, "READ_WAY(class {class}, way {way})"),
            Control::CollAbort { ctx, seq, gone } => write!(f, "COLL_ABORT(context {ctx}, call {seq}, rank {gone} departed or failed it)"),
        }
    }
}

/// Size of the header every RMA packet starts with.
pub const RMA_HDR_LEN: usize = 16;
/// Bytes in front of the data of a read response ([`Rma::ReadResp`]).
pub const RMA_RESP_HDR_LEN: usize = RMA_HDR_LEN + 8;
/// Size of the longest encoded [`Rma`] packet, not counting a read response's data (a read
/// request naming a shared-heap destination).
pub const RMA_MAX_LEN: usize = RMA_HDR_LEN + READ_REQ_BODY + HEAP_PLACE_LEN;

const RMA_READ_REQ: u8 = 1;
const RMA_READ_RESP: u8 = 2;
const RMA_READ_ERR: u8 = 3;
const RMA_READ_GRANT: u8 = 4;
const RMA_WRITE_DONE: u8 = 5;
/// Read request flags.
const REQ_SINGLE_COPY: u8 = 1;
const REQ_READER_MAPS: u8 = 2;
const REQ_DST_HEAP: u8 = 4;
const REQ_SHARE: u8 = 8;
/// Grant flags.
const GRANT_HEAP: u8 = 1;
/// Body of a read request without its heap place: send be32, va, key, len, dst be64.
const READ_REQ_BODY: usize = 4 + 4 * 8;
/// Body of a grant without its heap place: split be64.
const GRANT_BODY: usize = 8;
/// An encoded [`HeapPlace`]: offset be64, nonce be64, fd be32.
const HEAP_PLACE_LEN: usize = 20;

/// A place in a rank's shared heap (`tmpi_transport::shm::heap`): an offset in the heap that
/// `heap` describes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeapPlace {
    /// Offset from the start of the heap.
    pub off: u64,
    /// Which heap (its owner's memory file).
    pub heap: HeapDesc,
}

impl HeapPlace {
    fn encode(&self, out: &mut [u8]) {
        out[..8].copy_from_slice(&self.off.to_be_bytes());
        out[8..16].copy_from_slice(&self.heap.nonce.to_be_bytes());
        out[16..20].copy_from_slice(&self.heap.fd.to_be_bytes());
    }

    fn decode(b: &[u8; HEAP_PLACE_LEN]) -> Self {
        HeapPlace { off: be64_at(b, 0), heap: HeapDesc { nonce: be64_at(b, 8), fd: be32_at(b, 16) } }
    }
}

/// How the reader of a rendezvous wants the data of a read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReadMode {
    /// Streamed back through the ring ([`Rma::ReadResp`] packets).
    Stream,
    /// Granted ([`Rma::Grant`]) for the reader to copy itself (CMA single copy); the target
    /// may write a share of a large read into the reader's buffer at `dst` (0: the reader
    /// names no buffer, the target writes nothing).
    SingleCopy {
        /// Reader's address of the read's first byte.
        dst: u64,
    },
    /// The target's share of a pre-granted single copy ([`RndvRequest::pregranted`]): the
    /// reader copies the part of the send before `va` itself, without asking, and the target
    /// writes the requested range into the reader's buffer and answers [`Rma::WriteDone`]
    /// (no grant). The range's offset in the read is its offset in the send.
    Share {
        /// Reader's address of the read's first byte (not of the share's).
        dst: u64,
    },
}

/// An RDMA read request: the reader asks the target (the rendezvous sender) for `len` bytes
/// at `va` under memory key `key`, which the target checks in its fi_mr domain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadRequest {
    /// The reader's name for the read, echoed in every answer.
    pub read: u64,
    /// Streamed or single copy.
    pub mode: ReadMode,
    /// The rendezvous send whose buffer is read (its wire name, the request's `app_ctx`).
    pub send: u32,
    /// Target address of the first byte (the RVH's `va`).
    pub va: u64,
    /// Memory key of the send's registration.
    pub key: u64,
    /// Bytes to read.
    pub len: u64,
    /// The reader maps the target's shared heap: a range in it may be granted for a plain
    /// memcpy, whatever the mode.
    pub reader_maps_heap: bool,
    /// The reader's buffer lies in its own shared heap, here: the target may write its share
    /// there with a memcpy.
    pub dst_heap: Option<HeapPlace>,
}

/// A one-sided (RDMA) packet of the rendezvous protocol, sent as a `PKT_RMA` packet (which
/// bypasses the TM-SRQ). Every kind has the same header, and names the read it belongs to:
///
/// ```text
/// kind u8 | flags u8 | 0 0 | body length be32 | read be64 | body
///
/// READ_REQ   (1)  send be32 | va be64 | key be64 | len be64 | dst be64 [| heap place]
///                 flags: 1 single copy, 2 reader maps our heap, 4 heap place follows,
///                 8 the target's share of a pre-granted single copy (not with 1)
/// READ_RESP  (2)  offset be64 | data
/// READ_ERR   (3)  (empty)
/// READ_GRANT (4)  split be64 [| heap place]    flags: 1 heap place follows
/// WRITE_DONE (5)  (empty)
///
/// heap place: offset be64 | nonce be64 | fd be32
/// ```
///
/// The body length makes every truncation detectable; decoding never panics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rma<'a> {
    /// Reader to target: read a range of a rendezvous send's buffer.
    ReadReq(ReadRequest),
    /// Target to reader: bytes `[offset, offset + data.len())` of a streamed read.
    ReadResp {
        /// The reader's name for the read.
        read: u64,
        /// Offset of `data` within the read.
        offset: u64,
        /// The bytes.
        data: &'a [u8],
    },
    /// Target to reader: the read is refused (key check, a send that is gone or abandoned),
    /// or the target's share of it failed.
    ReadErr {
        /// The reader's name for the read.
        read: u64,
    },
    /// Target to reader: the key check passed; the reader copies `[0, split)` itself, the
    /// target writes `[split, len)` into the reader's buffer and says so with
    /// [`Rma::WriteDone`].
    Grant {
        /// The reader's name for the read.
        read: u64,
        /// First byte of the target's share (the read's length: none).
        split: u64,
        /// The range lies in the target's shared heap, here: copy it with a memcpy from a
        /// mapping of that heap.
        heap: Option<HeapPlace>,
    },
    /// Target to reader: its share of a split read is written.
    WriteDone {
        /// The reader's name for the read.
        read: u64,
    },
}

impl<'a> Rma<'a> {
    /// The reader's name for the read the packet belongs to.
    #[inline]
    pub fn read(&self) -> u64 {
        match self {
            Rma::ReadReq(r) => r.read,
            Rma::ReadResp { read, .. } | Rma::ReadErr { read } | Rma::Grant { read, .. } | Rma::WriteDone { read } => *read,
        }
    }

    /// The data a read response carries (empty for every other kind): [`Rma::encode`] does
    /// not copy it, the caller sends it right after the header.
    #[inline]
    pub fn data(&self) -> &'a [u8] {
        match self {
            Rma::ReadResp { data, .. } => data,
            _ => &[],
        }
    }

    /// Writes the packet into `out`, except the data of a read response (see [`Rma::data`]);
    /// returns the length written.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a read response whose data is too long for its 32-bit
    /// body length.
    #[inline]
    pub fn encode(&self, out: &mut [u8; RMA_MAX_LEN]) -> Result<usize> {
        let (kind, flags, body): (u8, u8, usize) = match self {
            Rma::ReadReq(r) => {
                let b = &mut out[RMA_HDR_LEN..];
                b[0..4].copy_from_slice(&r.send.to_be_bytes());
                b[4..12].copy_from_slice(&r.va.to_be_bytes());
                b[12..20].copy_from_slice(&r.key.to_be_bytes());
                b[20..28].copy_from_slice(&r.len.to_be_bytes());
                let (mut flags, dst) = match r.mode {
                    ReadMode::Stream => (0, 0),
                    ReadMode::SingleCopy { dst } => (REQ_SINGLE_COPY, dst),
                    ReadMode::Share { dst } => (REQ_SHARE, dst),
                };
                b[28..36].copy_from_slice(&dst.to_be_bytes());
                if r.reader_maps_heap {
                    flags |= REQ_READER_MAPS;
                }
                let mut body = READ_REQ_BODY;
                if let Some(h) = &r.dst_heap {
                    flags |= REQ_DST_HEAP;
                    h.encode(&mut b[READ_REQ_BODY..]);
                    body += HEAP_PLACE_LEN;
                }
                (RMA_READ_REQ, flags, body)
            }
            Rma::ReadResp { offset, data, .. } => {
                out[RMA_HDR_LEN..RMA_RESP_HDR_LEN].copy_from_slice(&offset.to_be_bytes());
                let body = data.len().checked_add(8).filter(|&b| u32::try_from(b).is_ok());
                let Some(body) = body else {
                    return Err(Error::InvalidArgument(format!("a read response of {} bytes", data.len())));
                };
                (RMA_READ_RESP, 0, body)
            }
            Rma::ReadErr { .. } => (RMA_READ_ERR, 0, 0),
            Rma::Grant { split, heap, .. } => {
                out[RMA_HDR_LEN..RMA_HDR_LEN + 8].copy_from_slice(&split.to_be_bytes());
                match heap {
                    Some(h) => {
                        h.encode(&mut out[RMA_HDR_LEN + GRANT_BODY..]);
                        (RMA_READ_GRANT, GRANT_HEAP, GRANT_BODY + HEAP_PLACE_LEN)
                    }
                    None => (RMA_READ_GRANT, 0, GRANT_BODY),
                }
            }
            Rma::WriteDone { .. } => (RMA_WRITE_DONE, 0, 0),
        };
        out[0] = kind;
        out[1] = flags;
        out[2..4].fill(0);
        out[4..8].copy_from_slice(&(body as u32).to_be_bytes());
        out[8..16].copy_from_slice(&self.read().to_be_bytes());
        Ok(RMA_HDR_LEN + body - self.data().len())
    }

    /// Reads an RMA packet (the whole of it: a read response's data is the rest of `buf`).
    ///
    /// # Errors
    /// [`Error::Malformed`] for a short packet, a length that disagrees with the header or the
    /// kind, an unknown kind or flag, or non-zero reserved bytes.
    pub fn parse(buf: &'a [u8]) -> Result<Self> {
        let Some((h, body)) = buf.split_first_chunk::<RMA_HDR_LEN>() else {
            return Err(Error::Malformed { what: "RMA packet shorter than its header" });
        };
        let (kind, flags) = (h[0], h[1]);
        if h[2..4] != [0, 0] {
            return Err(Error::Malformed { what: "RMA packet reserved bytes are not zero" });
        }
        if usize::try_from(be32_at(h, 4)).ok() != Some(body.len()) {
            return Err(Error::Malformed { what: "RMA packet length disagrees with its header" });
        }
        let read = be64_at(h, 8);
        let bad_len = Error::Malformed { what: "RMA packet of the wrong length for its kind" };
        match kind {
            RMA_READ_REQ => Self::parse_read_req(read, flags, body),
            RMA_READ_RESP => {
                if flags != 0 {
                    return Err(Error::Malformed { what: "unknown read response flag" });
                }
                let Some((off, data)) = body.split_first_chunk::<8>() else { return Err(bad_len) };
                Ok(Rma::ReadResp { read, offset: u64::from_be_bytes(*off), data })
            }
            RMA_READ_GRANT => {
                if flags & !GRANT_HEAP != 0 {
                    return Err(Error::Malformed { what: "unknown read grant flag" });
                }
                let want = GRANT_BODY + if flags & GRANT_HEAP != 0 { HEAP_PLACE_LEN } else { 0 };
                if body.len() != want {
                    return Err(bad_len);
                }
                let heap = if flags & GRANT_HEAP != 0 { heap_place(&body[GRANT_BODY..]) } else { None };
                Ok(Rma::Grant { read, split: be64_at(body, 0), heap })
            }
            RMA_READ_ERR | RMA_WRITE_DONE => {
                if flags != 0 {
                    return Err(Error::Malformed { what: "unknown RMA notice flag" });
                }
                if !body.is_empty() {
                    return Err(bad_len);
                }
                Ok(if kind == RMA_READ_ERR { Rma::ReadErr { read } } else { Rma::WriteDone { read } })
            }
            _ => Err(Error::Malformed { what: "unknown RMA packet kind" }),
        }
    }

    /// The body of a read request (`RMA_READ_REQ`), after the common header.
    fn parse_read_req(read: u64, flags: u8, body: &'a [u8]) -> Result<Self> {
        if flags & !(REQ_SINGLE_COPY | REQ_READER_MAPS | REQ_DST_HEAP | REQ_SHARE) != 0 {
            return Err(Error::Malformed { what: "unknown read request flag" });
        }
        let want = READ_REQ_BODY + if flags & REQ_DST_HEAP != 0 { HEAP_PLACE_LEN } else { 0 };
        if body.len() != want {
            return Err(Error::Malformed { what: "RMA packet of the wrong length for its kind" });
        }
        let dst = be64_at(body, 28);
        let mode = if flags & REQ_SHARE != 0 {
            if flags & REQ_SINGLE_COPY != 0 || dst == 0 {
                return Err(Error::Malformed { what: "share request without a single destination" });
            }
            ReadMode::Share { dst }
        } else if flags & REQ_SINGLE_COPY != 0 {
            ReadMode::SingleCopy { dst }
        } else if dst == 0 {
            ReadMode::Stream
        } else {
            return Err(Error::Malformed { what: "streamed read request naming a destination" });
        };
        Ok(Rma::ReadReq(ReadRequest {
            read,
            mode,
            send: be32_at(body, 0),
            va: be64_at(body, 4),
            key: be64_at(body, 12),
            len: be64_at(body, 20),
            reader_maps_heap: flags & REQ_READER_MAPS != 0,
            dst_heap: if flags & REQ_DST_HEAP != 0 { heap_place(&body[READ_REQ_BODY..]) } else { None },
        }))
    }
}

/// The heap place at the start of `b`, if `b` is long enough.
fn heap_place(b: &[u8]) -> Option<HeapPlace> {
    b.first_chunk::<HEAP_PLACE_LEN>().map(HeapPlace::decode)
}

/// The big-endian `u32` at `at` (the caller checked the length; 0 past the end).
#[inline]
fn be32_at(b: &[u8], at: usize) -> u32 {
    b.get(at..at + 4).map_or(0, |x| u32::from_be_bytes([x[0], x[1], x[2], x[3]]))
}

/// The big-endian `u64` at `at` (the caller checked the length; 0 past the end).
#[inline]
fn be64_at(b: &[u8], at: usize) -> u64 {
    b.get(at..at + 8).map_or(0, |x| u64::from_be_bytes([x[0], x[1], x[2], x[3], x[4], x[5], x[6], x[7]]))
}

impl std::fmt::Display for HeapPlace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "heap (fd {}, nonce {:#x}) at {:#x}", self.heap.fd, self.heap.nonce, self.off)
    }
}

impl std::fmt::Display for Rma<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Rma::ReadReq(r) => {
                write!(f, "READ_REQ(read {:#x}, send {:#x}, {} bytes at {:#x} key {:#x}, ", r.read, r.send, r.len, r.va, r.key)?;
                match r.mode {
                    ReadMode::Stream => write!(f, "streamed")?,
                    ReadMode::SingleCopy { dst } => write!(f, "single copy into {dst:#x}")?,
                    ReadMode::Share { dst } => write!(f, "target's share into the read at {dst:#x}")?,
                }
                if r.reader_maps_heap {
                    write!(f, ", reader maps the target's heap")?;
                }
                if let Some(h) = &r.dst_heap {
                    write!(f, ", destination in {h}")?;
                }
                write!(f, ")")
            }
            Rma::ReadResp { read, offset, data } => write!(f, "READ_RESP(read {read:#x}, {} bytes at {offset})", data.len()),
            Rma::ReadErr { read } => write!(f, "READ_ERR(read {read:#x})"),
            Rma::Grant { read, split, heap } => {
                write!(f, "READ_GRANT(read {read:#x}, reader copies up to {split}")?;
                if let Some(h) = heap {
                    write!(f, " from {h}")?;
                }
                write!(f, ")")
            }
            Rma::WriteDone { read } => write!(f, "WRITE_DONE(read {read:#x})"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// CONFORMANCE.md: T14.
    #[test]
    fn tmh_layout_is_big_endian() {
        let h = Tmh { op: TmOp::Eager, app_ctx: 0x0102_0304, tag: 0x1122_3344_5566_7788 };
        assert_eq!(h.to_bytes(), [3, 0, 0, 0, 1, 2, 3, 4, 0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88]);
    }

    /// CONFORMANCE.md: T16.
    #[test]
    fn rvh_layout_is_big_endian() {
        let r = Rvh { va: 0x0102_0304_0506_0708, rkey: 0xaabb_ccdd, len: 0x10 };
        assert_eq!(r.to_bytes(), [1, 2, 3, 4, 5, 6, 7, 8, 0xaa, 0xbb, 0xcc, 0xdd, 0, 0, 0, 0x10]);
    }

    /// CONFORMANCE.md: T15.
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

    /// CONFORMANCE.md: T17.
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
        let n = Control::EagerBelow { bytes: 65536 }.encode(&mut b);
        assert_eq!(&b[..n], &[0, 4, 0, 0, 0, 1, 0, 0]);
        assert_eq!(Control::EagerBelow { bytes: 65536 }.to_string(), "EAGER_BELOW(65536 bytes)");
        // Wrong length, unknown kind, reserved bytes set.
        assert!(Control::decode(&[2, 0, 0, 1, 2, 3]).is_err());
        assert!(Control::decode(&[9, 0, 0, 1, 2, 3, 4]).is_err());
        assert!(Control::decode(&[2, 1, 0, 1, 2, 3, 4]).is_err());
        assert!(Control::decode(&[]).is_err());
    }

    fn place(off: u64, nonce: u64, fd: u32) -> HeapPlace {
        HeapPlace { off, heap: HeapDesc { nonce, fd } }
    }

    /// One packet of every kind and shape (each optional part present and absent).
    fn every_rma(data: &[u8]) -> Vec<Rma<'_>> {
        let req = ReadRequest {
            read: 0x0102_0304_0506_0708,
            mode: ReadMode::Stream,
            send: 0xa0b0_c0d0,
            va: 0x7f00_0000_1000,
            key: 0x55,
            len: 1 << 20,
            reader_maps_heap: false,
            dst_heap: None,
        };
        vec![
            Rma::ReadReq(req),
            Rma::ReadReq(ReadRequest { mode: ReadMode::SingleCopy { dst: 0x7e00_0000_2000 }, reader_maps_heap: true, ..req }),
            Rma::ReadReq(ReadRequest { mode: ReadMode::SingleCopy { dst: 0 }, ..req }),
            Rma::ReadReq(ReadRequest { dst_heap: Some(place(8192, 11, 3)), ..req }),
            Rma::ReadReq(ReadRequest { mode: ReadMode::Share { dst: 0x7e00_0000_2000 }, ..req }),
            Rma::ReadResp { read: 9, offset: 4096, data },
            Rma::ReadResp { read: 9, offset: 0, data: &[] },
            Rma::ReadErr { read: u64::MAX },
            Rma::Grant { read: 1, split: 65536, heap: None },
            Rma::Grant { read: 1, split: 0, heap: Some(place(1 << 30, u64::MAX, u32::MAX)) },
            Rma::WriteDone { read: 0 },
        ]
    }

    fn rma_bytes(m: &Rma<'_>) -> Vec<u8> {
        let mut b = [0u8; RMA_MAX_LEN];
        let n = m.encode(&mut b).unwrap();
        let mut v = b[..n].to_vec();
        v.extend_from_slice(m.data());
        v
    }

    #[test]
    fn rma_layout() {
        let m = rma_bytes(&Rma::ReadResp { read: 0x0102_0304_0506_0708, offset: 0x10, data: b"xy" });
        assert_eq!(m, [2, 0, 0, 0, 0, 0, 0, 10, 1, 2, 3, 4, 5, 6, 7, 8, 0, 0, 0, 0, 0, 0, 0, 0x10, b'x', b'y']);
        assert_eq!(RMA_RESP_HDR_LEN, 24, "read response data stays 8-byte aligned");
        let m = rma_bytes(&Rma::WriteDone { read: 7 });
        assert_eq!(m, [5, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 7]);
        let m = rma_bytes(&Rma::Grant { read: 7, split: 3, heap: Some(place(1, 2, 3)) });
        assert_eq!(m.len(), RMA_HDR_LEN + 8 + 20);
        assert_eq!(&m[..2], &[4, 1]);
        let longest = every_rma(&[]).iter().map(|m| rma_bytes(m).len()).max();
        assert_eq!(longest, Some(RMA_MAX_LEN));
        let req = every_rma(&[])[3];
        assert_eq!(
            req.to_string(),
            "READ_REQ(read 0x102030405060708, send 0xa0b0c0d0, 1048576 bytes at 0x7f0000001000 key 0x55, streamed, \
             destination in heap (fd 3, nonce 0xb) at 0x2000)"
        );
        assert_eq!(Rma::ReadResp { read: 1, offset: 8, data: b"abc" }.to_string(), "READ_RESP(read 0x1, 3 bytes at 8)");
    }

    #[test]
    fn every_rma_kind_round_trips() {
        for m in every_rma(b"some data") {
            let b = rma_bytes(&m);
            assert_eq!(Rma::parse(&b).unwrap(), m, "{m}");
            assert_eq!(Rma::parse(&b).unwrap().read(), m.read());
        }
    }

    #[test]
    fn every_truncation_of_every_rma_kind_is_an_error() {
        for m in every_rma(b"0123456789") {
            let b = rma_bytes(&m);
            for n in 0..b.len() {
                assert!(Rma::parse(&b[..n]).is_err(), "{m} cut to {n} bytes");
            }
            // One byte too many is as wrong as one too few.
            let mut long = b.clone();
            long.push(0);
            assert!(Rma::parse(&long).is_err(), "{m} with a byte more");
        }
    }

    #[test]
    fn malformed_rma_is_an_error() {
        for m in every_rma(b"d") {
            let b = rma_bytes(&m);
            for kind in [0u8, 6, 7, 0x80, 0xff] {
                let mut x = b.clone();
                x[0] = kind;
                assert!(Rma::parse(&x).is_err(), "kind {kind}");
            }
            let mut x = b.clone();
            x[3] = 1;
            assert!(Rma::parse(&x).is_err(), "reserved byte of {m}");
            let mut x = b.clone();
            x[1] |= 0x80;
            assert!(Rma::parse(&x).is_err(), "unknown flag of {m}");
        }
        // The heap-place flag without the place, and a streamed read naming a destination.
        let mut x = rma_bytes(&Rma::Grant { read: 1, split: 2, heap: None });
        x[1] = 1;
        assert!(Rma::parse(&x).is_err());
        let mut x = rma_bytes(&every_rma(&[])[0]);
        x[RMA_HDR_LEN + 35] = 1;
        assert!(Rma::parse(&x).is_err());
        // A share request without a destination, or also asking for a grant.
        let mut x = rma_bytes(&every_rma(&[])[0]);
        x[1] = REQ_SHARE;
        assert!(Rma::parse(&x).is_err());
        let mut x = rma_bytes(&every_rma(&[])[4]);
        assert!(Rma::parse(&x).is_ok());
        x[1] |= REQ_SINGLE_COPY;
        assert!(Rma::parse(&x).is_err());
        assert!(Rma::parse(&[]).is_err());
    }

    proptest! {
        #[test]
        fn rma_roundtrip(kind in 0u8..5, read: u64, a: u64, b: u64, c: u64, d in 1u64.., send: u32, flags in 0u8..16, fd: u32,
                         data in proptest::collection::vec(any::<u8>(), 0..64)) {
            let heap = (flags & 4 != 0).then(|| place(c, d, fd));
            let m = match kind {
                0 => Rma::ReadReq(ReadRequest {
                    read,
                    mode: match flags & 9 { 0 => ReadMode::Stream, 8 => ReadMode::Share { dst: d }, _ => ReadMode::SingleCopy { dst: d } },
                    send, va: a, key: b, len: c,
                    reader_maps_heap: flags & 2 != 0,
                    dst_heap: heap,
                }),
                1 => Rma::ReadResp { read, offset: a, data: &data },
                2 => Rma::ReadErr { read },
                3 => Rma::Grant { read, split: a, heap },
                _ => Rma::WriteDone { read },
            };
            let bytes = rma_bytes(&m);
            prop_assert_eq!(Rma::parse(&bytes).unwrap(), m);
        }
        #[test]
        fn rma_parse_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..96)) {
            let _ = Rma::parse(&bytes);
        }
        #[test]
        fn rma_parse_never_panics_on_a_valid_header(kind in 0u8..8, flags in 0u8..8, body in proptest::collection::vec(any::<u8>(), 0..64)) {
            let mut b = vec![kind, flags, 0, 0];
            b.extend_from_slice(&(body.len() as u32).to_be_bytes());
            b.extend_from_slice(&[0; 8]);
            b.extend_from_slice(&body);
            let _ = Rma::parse(&b);
        }
    }

    proptest! {
        #[test]
        fn control_roundtrip(kind in 0u8..7, a: u32, b: u32, c: u32) {
            let m = match kind {
                0 => Control::SsendAck { name: a },
                1 => Control::Credit { bytes: a },
                2 => Control::EagerBelow { bytes: a },
                3 => Control::Revoke { name: a },
                4 => Control::RevokeAck { name: a },
                5 => Control::ReadWay { class: a, way: b },
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
        /// CONFORMANCE.md: T14.
        #[test]
        fn tmh_roundtrip(op in 0u8..4, ctx: u32, tag: u64) {
            let h = Tmh { op: TmOp::from_u8(op).unwrap(), app_ctx: ctx, tag };
            prop_assert_eq!(Tmh::decode(&h.to_bytes()).unwrap(), h);
        }
        /// CONFORMANCE.md: T16.
        #[test]
        fn rvh_roundtrip(va: u64, rkey: u32, len: u32) {
            let r = Rvh { va, rkey, len };
            prop_assert_eq!(Rvh::decode(&r.to_bytes()).unwrap(), r);
        }
        /// CONFORMANCE.md: T66.
        #[test]
        fn parse_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            let _ = Message::parse(&bytes);
        }
    }
}

#[cfg(test)]
mod fabric_key_tests {
    use super::*;

    /// A fabric key rides after the meta-data and reads back; the request stays what it was
    /// without one (same bytes before it, same parse); a request whose flag announces a key
    /// it does not carry has none.
    #[test]
    fn fabric_key_round_trips_after_the_meta_data() {
        let fk = FabricKey { key: 0x0123_4567_89ab_cdef, addr: 0x7fff_0000_1234 };
        for pregranted in [false, true] {
            let r = RndvRequest { app_ctx: 7, tag: 0x55, va: 0x1000, rkey: 9, len: 70_000, pregranted };
            let b = r.encode_with(fk);
            assert_eq!(RndvRequest::fabric_key(&b), Some(fk));
            assert_eq!(RndvRequest::parse(&b), Some(r));
            assert_eq!(RndvRequest::pregranted(&b), pregranted);
            assert_eq!(&b[..META_FLAGS_AT], &r.encode()[..META_FLAGS_AT]);
            assert_eq!(RndvRequest::fabric_key(&r.encode()), None);
            assert_eq!(RndvRequest::fabric_key(&b[..RNDV_REQ_FABRIC_LEN - 1]), None);
        }
    }
}
