//! The rendezvous protocol: `TMH(RNDV) | RVH` announces a registered buffer; the receiver
//! reads it (an RDMA read request, served by the target after its fi_mr key check: streamed
//! back through the ring, granted for single copy, or through a shared heap), then sends `FIN`.
//!
//! | file | what |
//! |---|---|
//! | `mod.rs` | the sender's start, the records the stages pass, and the ways' state |
//! | [`reader`] | the reader: starting a read, asking, the answers, the FIN |
//! | [`target`] | the target: the key check, serving a read, the FIN that ends a send |
//! | [`way`] | the rules of how the bytes move, and the constants behind them |
//! | [`single_copy`] | CMA reads and writes, and memcpys through the shared heaps |
//! | [`adapt`] | single copy or the rings, and where rendezvous starts, by measurement |
//! | [`threshold`] | where rendezvous starts, per destination, and the advice that raises it |

use super::*;
use crate::heap::HeapSrc;

pub(super) mod adapt;
#[cfg(feature = "ofi")]
pub(super) mod fabric_read;
pub(super) mod reader;
pub(super) mod single_copy;
pub(super) mod target;
pub(super) mod threshold;
pub(super) mod way;

#[cfg(test)]
mod tests;

use way::*;

/// The longest rendezvous request this build sends (and so the room of a queued message's
/// header): with the feature `ofi`, one may carry a fabric key ([`FabricKey`]).
#[cfg(feature = "ofi")]
pub(in crate::engine) const RNDV_HDR_MAX: usize = tmpi_transport::wire::RNDV_REQ_FABRIC_LEN;
/// The longest rendezvous request this build sends (and so the room of a queued message's
/// header).
#[cfg(not(feature = "ofi"))]
pub(in crate::engine) const RNDV_HDR_MAX: usize = RNDV_REQ_LEN;

/// A rendezvous request as it goes out: its bytes and length.
pub(in crate::engine) type RndvHdr = ([u8; RNDV_HDR_MAX], usize);

/// A rendezvous send: what its target must keep until the FIN.
pub(in crate::engine) struct RndvSend {
    pub(in crate::engine) buf: Option<RawBuf>,
    /// The registration (`None` for an empty message, which has nothing to read).
    pub(in crate::engine) _mr: Option<CachedMr>,
    /// The match key and the RVH's address, which a FIN must repeat.
    pub(in crate::engine) tag64: u64,
    pub(in crate::engine) va: u64,
    /// A reader that was granted a single-copy read of `buf` (it copies the memory itself
    /// until its FIN): abandoning the send must wait for that FIN.
    pub(in crate::engine) granted: Option<usize>,
    /// The grant went with the request itself ([`RndvRequest::pregranted`]): the reader may
    /// copy without asking, so abandoning the send revokes it first ([`Control::Revoke`]).
    pub(in crate::engine) pregranted: bool,
    /// This rank streamed (some of) it to the reader through the rings: its FIN ends a read
    /// that went that way (see `adapt::Epochs::peer_read`).
    pub(in crate::engine) streamed: bool,
    /// The buffer's registration in the OFI fabric's domain (`fi_mr_reg`, through its cache),
    /// announced with the request as a fabric key ([`FabricKey`]) for the reader's `fi_read`:
    /// held until FIN, then released to the cache.
    #[cfg(feature = "ofi")]
    pub(in crate::engine) fabric_mr: Option<tmpi_transport::ofi::ReadRegion>,
}

impl RndvSend {
    /// Whether the reader may touch the buffer without asking (a pre-grant, a fabric key):
    /// abandoning the send revokes that first, and waits for the answer or the FIN.
    pub(in crate::engine) fn revocable(&self) -> bool {
        #[cfg(feature = "ofi")]
        if self.fabric_mr.is_some() {
            return true;
        }
        self.pregranted
    }
}

/// What a rendezvous request announces.
#[derive(Debug, Clone, Copy)]
pub(in crate::engine) struct RndvInfo {
    pub(in crate::engine) tmh: Tmh,
    pub(in crate::engine) rvh: Rvh,
    pub(in crate::engine) key: u64,
    pub(in crate::engine) len: usize,
    /// The sender checked the range for our single-copy read already
    /// ([`RndvRequest::pregranted`]).
    pub(in crate::engine) pregranted: bool,
    /// The sender's registration of the buffer in the fabric's own domain, for the fabric's
    /// RDMA read ([`RndvRequest::fabric_key`]).
    pub(in crate::engine) fabric: Option<FabricKey>,
}

impl RndvInfo {
    pub(in crate::engine) fn parse(req: &[u8]) -> Result<Self> {
        let tmh = Tmh::decode(req)?;
        let rvh = Rvh::decode(req.get(TMH_LEN..).unwrap_or(&[]))?;
        // The RVH is what the hardware path reads; software reads the same, except the length
        // of a payload the RVH cannot hold (`RVH_LEN_IN_META`), which is in the meta-data.
        let len = RndvRequest::payload_len(req).ok_or_else(|| malformed("rendezvous request of 4 GiB or more without its length"))?;
        let len = usize::try_from(len).map_err(|_| malformed("rendezvous length overflows"))?;
        let (pregranted, fabric) = (RndvRequest::pregranted(req), RndvRequest::fabric_key(req));
        Ok(RndvInfo { tmh, rvh, key: u64::from(rvh.rkey), len, pregranted, fabric })
    }
}

/// A range of a rendezvous send buffer being streamed to a reader.
pub(in crate::engine) struct RmaOut {
    pub(in crate::engine) dest: usize,
    /// The reader's name for the read ([`Rma::read`]).
    pub(in crate::engine) read: u64,
    pub(in crate::engine) buf: RawBuf,
    pub(in crate::engine) off: usize,
    /// Offset of `buf` within the read.
    pub(in crate::engine) base: usize,
}

/// The target's share of a split single-copy read: `buf` goes to `dst` in the reader.
#[derive(Clone, Copy)]
pub(in crate::engine) struct CmaWrite {
    pub(in crate::engine) dest: usize,
    /// The reader's name for the read ([`Rma::read`]).
    pub(in crate::engine) read: u64,
    pub(in crate::engine) buf: RawBuf,
    /// Reader's address of the read's first byte, and the offset of `buf` within the read.
    pub(in crate::engine) dst: u64,
    pub(in crate::engine) base: usize,
}

/// The ways stage: what decides how the bytes of a rendezvous move (single copy, the rings,
/// the shared heaps) and where copies go around the cache.
pub(in crate::engine) struct Ways {
    /// Single-copy reads may be tried (`TMPI_SINGLE_COPY=cma` and the kernel has not refused).
    cma: bool,
    /// `TMPI_SINGLE_COPY_MIN`: smaller reads stream through the ring; `None`: `copy` chooses.
    cma_min: Option<usize>,
    /// Single copy or the rings, by measurement (`TMPI_SINGLE_COPY_MIN=auto`).
    copy: adapt::Epochs,
    /// Per world rank: streamed reads from it of at least this many bytes are copied out with
    /// non-temporal stores ([`stream_nt_min`] of its largest packet).
    stream_nt_min: Vec<usize>,
    /// Per world rank: its memory is reachable by single copy (same host; not over TCP).
    cma_peers: Vec<bool>,
    /// The shared heap: this rank's, the peers' it mapped, and grants in flight through them.
    heaps: crate::heap::Heaps,
    /// Eager messages of [`EAGER_NT_MIN`] or more that arrived into posted receives, and per
    /// world rank their count (plus one; 0: never) when this rank last started one of that
    /// size to it: whether the two send each other such messages (see
    /// [`Ways::eager_both_ways`]).
    big_eager_in: u64,
    big_eager_out: Vec<u64>,
    /// The fabric's own RDMA read as a way (`TMPI_OFI_RNDV`).
    #[cfg(feature = "ofi")]
    pub(in crate::engine) fabric: fabric_read::FabricReads,
}

impl Ways {
    /// The ways of rank `rank` of `cfg` towards peers with `peers`' capabilities.
    pub(in crate::engine) fn new(cfg: &Config, rank: usize, peers: &[PeerCaps]) -> Self {
        let size = peers.len();
        // Streamed reads come out of the packets of the peers single copy reaches (the
        // measurements behind `STREAM_NT_MIN` are of shared-memory rings).
        let local = peers.iter().enumerate().filter(|&(r, c)| r != rank && c.single_copy).map(|(_, c)| c.max_packet).max();
        let nt_min = stream_nt_min(local.unwrap_or_else(|| peers.iter().map(|c| c.max_packet).min().unwrap_or(usize::MAX)));
        let cma_peers: Vec<bool> = peers.iter().map(|c| c.single_copy).collect();
        let heaps = crate::heap::Heaps::new(cfg.shared_heap, size, |r| cma_peers[r]);
        Ways {
            cma: cfg.single_copy,
            cma_min: cfg.single_copy_min,
            copy: adapt::Epochs::paired().streaming_from(nt_min),
            stream_nt_min: peers.iter().map(|c| stream_nt_min(c.max_packet)).collect(),
            cma_peers,
            heaps,
            big_eager_in: 0,
            big_eager_out: vec![0; size],
            #[cfg(feature = "ofi")]
            fabric: fabric_read::FabricReads::default(),
        }
    }

    /// Whether this rank reads rendezvous data with the fabric's RDMA read where the sender
    /// announced a fabric key (`TMPI_OFI_RNDV`; never without the feature `ofi`).
    #[inline]
    pub(in crate::engine) fn fabric_reads(&self) -> bool {
        #[cfg(feature = "ofi")]
        return self.fabric.on;
        #[cfg(not(feature = "ofi"))]
        false
    }

    /// Whether single copy may move data between this rank and world rank `r` (on, not refused
    /// by the kernel, and `r` on this host).
    pub(in crate::engine) fn cma_to(&self, r: usize) -> bool {
        self.cma && self.cma_peers.get(r).copied().unwrap_or(false)
    }

    /// An eager message of [`EAGER_NT_MIN`] or more arrived into a posted receive.
    #[inline]
    pub(in crate::engine) fn big_eager_arrived(&mut self) {
        self.big_eager_in += 1;
    }

    /// This rank started an eager message of [`EAGER_NT_MIN`] or more to `dest`.
    #[inline]
    pub(in crate::engine) fn big_eager_sent(&mut self, dest: usize) {
        self.big_eager_out[dest] = self.big_eager_in + 1;
    }

    /// Whether `src` and this rank send each other eager messages of [`EAGER_NT_MIN`] or
    /// more: this rank started one to `src` within the last [`EAGER_BOTH_WAYS_WITHIN`] of
    /// those that arrived here.
    pub(in crate::engine) fn eager_both_ways(&self, src: usize) -> bool {
        self.big_eager_out.get(src).is_some_and(|&at| at != 0 && self.big_eager_in + 1 - at < EAGER_BOTH_WAYS_WITHIN)
    }

    /// `src` leads this rank's reads of size class `class` and chose `way` for the next
    /// period ([`Control::ReadWay`]: only a lower rank leads, a way is one of two).
    ///
    /// # Errors
    /// [`Error::Protocol`] for a way, a class or a leader that cannot be.
    pub(in crate::engine) fn led(&mut self, src: usize, rank: usize, class: u32, way: u32) -> Result<()> {
        let arm = match way {
            0 => adapt::Arm::Stream,
            1 => adapt::Arm::Cma,
            _ => return Err(malformed_from(src, "READ_WAY names no way")),
        };
        if src >= rank || class >= usize::BITS {
            return Err(malformed_from(src, "READ_WAY from a higher rank or for no size class"));
        }
        self.copy.lead(class as usize, arm, src);
        Ok(())
    }

    /// The shared heaps' counters: grants served, bytes copied, fall-backs.
    pub(in crate::engine) fn heap_counters(&self) -> (u64, u64, u64) {
        (self.heaps.grants_served, self.heaps.bytes, self.heaps.fallbacks)
    }
}

/// How a read is named on the wire ([`Rma::read`]): its slot in `State::reads`, index and
/// generation, so an answer to a read that is gone never reaches the one reusing the slot.
#[inline]
pub(in crate::engine) fn read_name(k: Key) -> u64 {
    u64::from(k.idx()) << 32 | u64::from(k.gen())
}

/// The read a peer's answer names (see [`read_name`]).
#[inline]
pub(in crate::engine) fn read_key(name: u64) -> Key {
    Key::new((name >> 32) as u32, name as u32)
}

impl From<HeapSrc> for HeapPlace {
    fn from(h: HeapSrc) -> Self {
        HeapPlace { off: h.off, heap: h.desc }
    }
}

impl From<HeapPlace> for HeapSrc {
    fn from(p: HeapPlace) -> Self {
        HeapSrc { off: p.off, desc: p.heap }
    }
}

impl Engine {
    /// Starts a rendezvous send: register, then send the request; FIN completes it. An empty
    /// message has nothing to register (fi_mr refuses a zero length) and nothing to read.
    #[cold]
    pub(in crate::engine) fn start_rndv(&mut self, dest: usize, tag64: u64, data: RawBuf) -> Result<ReqId> {
        let (req, (hdr, hdr_len)) = self.rndv_request(dest, tag64, data)?;
        self.queue_out(dest, OutMsg { req, hdr, hdr_len, data: OutData::Owned(Vec::new()), off: 0, started: false })?;
        Ok(req)
    }

    /// The send request and the request message of a rendezvous of `data` to `dest`: the
    /// buffer registered (also in the OFI fabric's domain, for the reader's `fi_read`, where
    /// rendezvous reads go that way), the request named on the wire.
    pub(in crate::engine) fn rndv_request(&mut self, dest: usize, tag64: u64, data: RawBuf) -> Result<(ReqId, RndvHdr)> {
        self.st.stats.rndv += 1;
        let (addr, len) = (data.addr(), data.len());
        // First: a cache's userfaultfd watch of the pages goes to the first that asks, and
        // the fabric's registration is the one worth caching (`fi_mr_reg` is a system call).
        #[cfg(feature = "ofi")]
        let (fabric_mr, fk) = self.fabric_register(dest, data);
        let (mr, key, va) = if len == 0 {
            (None, 0, 0)
        } else {
            let mr = self.st.target.mr.get(addr, len, Access::REMOTE_READ).map_err(tmpi_transport::Error::from)?;
            let key = mr.key().map_err(tmpi_transport::Error::from)?;
            let va = mr.remote_addr(addr).ok_or_else(|| Error::State("registration does not cover the send buffer".into()))?;
            (Some(mr), key, va)
        };
        let rkey = u32::try_from(key).map_err(|_| Error::State("memory key wider than the RVH's 32-bit rkey".into()))?;
        let pregranted =
            self.st.may_pregrant(dest, addr, va, len) && self.st.target.domain.check_remote(key, va, len as u64, RemoteOp::Read).is_ok();
        let mut send = RndvSend {
            buf: Some(data),
            _mr: mr,
            tag64,
            va,
            granted: None,
            pregranted,
            streamed: false,
            #[cfg(feature = "ofi")]
            fabric_mr,
        };
        // A pre-grant or a fabric key lets the reader touch the buffer without asking: it
        // holds until FIN or the answer to a revoke.
        send.granted = send.revocable().then_some(dest);
        let req = self.st.new_send(dest, tag64, true, Some(send))?;
        let r = RndvRequest { app_ctx: wire_name(req), tag: tag64, va, rkey, len: len as u64, pregranted };
        let mut hdr = [0u8; RNDV_HDR_MAX];
        #[cfg(feature = "ofi")]
        if let Some(fk) = fk {
            hdr.copy_from_slice(&r.encode_with(fk));
            return Ok((req, (hdr, RNDV_HDR_MAX)));
        }
        hdr[..RNDV_REQ_LEN].copy_from_slice(&r.encode());
        Ok((req, (hdr, RNDV_REQ_LEN)))
    }
}

impl State {
    /// The rendezvous state of send `k`, if it is a live rendezvous send.
    pub(in crate::engine) fn rndv_send(&mut self, k: Option<ReqId>) -> Option<&mut RndvSend> {
        match self.reqs.get_mut(k?) {
            Some(Req { kind: ReqKind::Send(SendState { rndv: Some(r), .. }), .. }) => Some(r),
            _ => None,
        }
    }

    /// [`State::rndv_send`], to read.
    pub(in crate::engine) fn rndv_send_ref(&self, k: ReqId) -> Option<&RndvSend> {
        match self.reqs.get(k) {
            Some(Req { kind: ReqKind::Send(SendState { rndv: Some(r), .. }), .. }) => Some(r),
            _ => None,
        }
    }

    /// Whether a rendezvous of `len` bytes at `addr` (`va` in its registration) to `dest` goes
    /// out pre-granted: the target's key check done with the request, so that the reader may
    /// copy at once instead of asking (one round trip fewer; the send holds its buffer until
    /// FIN as for any grant). Only where the reader may copy it straight from this rank's
    /// memory, below [`CMA_PREGRANT_MAX`]: from this rank's shared heap (below
    /// [`HEAP_PREGRANT_MAX`]) to a rank a grant of ours has named the heap to already (so it
    /// maps it, and finds the range by its address; before, it asks, and the grant names the
    /// heap), else by single copy, on and possible to `dest` and allowed by
    /// `TMPI_SINGLE_COPY_MIN` (a split the reader wants is asked for without a round trip,
    /// [`ReadMode::Share`]).
    fn may_pregrant(&self, dest: usize, addr: usize, va: u64, len: usize) -> bool {
        if len == 0 || len >= CMA_PREGRANT_MAX {
            return false;
        }
        if self.ways.heaps.locate(addr, len).is_some() {
            // The reader finds the range in our heap by its address.
            return len < HEAP_PREGRANT_MAX && va == addr as u64 && self.ways.heaps.named_to.get(dest).copied().unwrap_or(false);
        }
        self.ways.cma_to(dest) && self.ways.cma_min.is_none_or(|m| len >= m)
    }
}

impl Engine {
    /// This rank's shared heap, created on first use (`None`: off or unavailable).
    pub(crate) fn shared_heap(&mut self) -> Option<std::sync::Arc<tmpi_transport::shm::heap::Heap>> {
        self.st.ways.heaps.own()
    }
}
