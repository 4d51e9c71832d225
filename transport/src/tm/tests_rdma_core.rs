//! rdma-core's tag-matching suite (`tests/test_tag_matching.py`, class `TMTest`) replayed
//! against the soft TM-SRQ: the same players, messages and expected completions, reproduced
//! from reading the Python (no code taken from it).
//!
//! What the suite sets up, and what is kept here:
//! - a server TM-SRQ (`max_ops` 10, the device's `max_num_tags`) with 33 untagged receive
//!   buffers of `wr_id` 0 posted up front (its `HW_LIMITAION`), one more posted after each
//!   message; a client that sends 1024-byte messages (`msg_size`) from a buffer it fills with
//!   `'c'` and then overwrites with the headers, so the TMH's reserved bytes and `app_ctx`,
//!   and everything after an RVH, are `'c'` bytes;
//! - tags 1..=9 posted with mask `0xffff`, `wr_id` = `recv_wr_id` = the tag, each ADD checked
//!   to complete `IBV_WC_TM_ADD` with that `wr_id` and no flag; then messages sent with tags
//!   9 down to 1 (or one fixed tag, `0x1234`, that no entry matches);
//! - after every completion the suite checks `wr_id`, opcode, flags and (server side) the tag
//!   `ibv_wc_read_tm_info` returns; every unexpected `IBV_WC_TM_RECV` (neither MATCH nor
//!   DATA_VALID) makes it count one more unexpected message and post a TAG_SYNC with
//!   `IBV_OPS_SIGNALED | IBV_OPS_TM_SYNC` and `wr_id` 27, whose `IBV_WC_TM_SYNC` completion
//!   it checks (no flag); the received bytes are compared with what was sent.
//!
//! The device side of the suite (two QPs, a real RDMA read) is played by the caller, as the
//! model's contract says: placements are copied, and the rendezvous read goes through the
//! client's fi_mr domain, whose key check decides before any byte moves.

use super::*;
use crate::mr::{Access, Domain, DomainAttr, MrMode, RegFlags, RemoteOp};
use crate::wire::{Message, Rvh, TmOp, Tmh, RVH_LEN, TMH_LEN};

const TAG_MASK: u64 = 0xffff;
const MSG_SIZE: usize = 1024;
const SYNC_WRID: u64 = 27;
const HW_LIMITATION: usize = 33;
const FIXED_SEND_TAG: u64 = 0x1234;
const CLIENT: u32 = 1;

/// The server: its TM-SRQ, its one receive buffer (the suite's `server.mr`) and the unexpected
/// count its software keeps.
struct Server {
    srq: TmSrq,
    mr: Vec<u8>,
    unexp_cnt: u32,
}

/// What `verify_cqe` compares: `wr_id`, opcode, flags, and the tag `read_tm_info` returns (0
/// when the completion has none, as the suite reads it).
fn cqe(wc: &Wc) -> (u64, WcOpcode, WcFlags, u64) {
    (wc.wr_id, wc.opcode, wc.flags, wc.read_tm_info().map_or(0, |(tag, _)| tag))
}

impl Server {
    fn new() -> Server {
        let caps = TmCaps::default();
        let srq = TmSrq::with_caps(caps, TmCap { max_num_tags: caps.max_num_tags, max_ops: 10, max_wr: 64 }).unwrap();
        let mut s = Server { srq, mr: vec![0; MSG_SIZE], unexp_cnt: 0 };
        for _ in 0..HW_LIMITATION {
            s.srq.post_srq_recv(0, MSG_SIZE).unwrap();
        }
        s
    }

    /// `poll_cq_ex` on the server: one completion, status success; an unexpected receive is
    /// counted and followed by a checked TAG_SYNC, as the suite does.
    fn poll(&mut self) -> Wc {
        let wc = self.srq.poll_cq().expect("the suite waits for a completion here");
        assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
        if wc.is_unexpected() {
            self.unexp_cnt += 1;
            self.post_sync();
        }
        wc
    }

    fn post_sync(&mut self) {
        let mut wr = [OpsWr::sync(SYNC_WRID, self.unexp_cnt, true)];
        assert_eq!(wr[0].flags, OpsFlags::SIGNALED | OpsFlags::TM_SYNC);
        self.srq.post_srq_ops(&mut wr).unwrap();
        let wc = self.srq.poll_cq().unwrap();
        assert_eq!(cqe(&wc), (SYNC_WRID, WcOpcode::TmSync, WcFlags::NONE, 0));
        assert!(self.srq.in_sync());
    }

    /// `post_recv_tm`: a signaled ADD of the server buffer for `tag` / `0xffff`.
    fn post_recv_tm(&mut self, tag: u64) {
        let mut wr = [OpsWr::add(tag, tag, TAG_MASK, tag, MSG_SIZE, self.unexp_cnt, true)];
        self.srq.post_srq_ops(&mut wr).unwrap();
        let wc = self.poll();
        assert_eq!(cqe(&wc), (tag, WcOpcode::TmAdd, WcFlags::NONE, 0));
        assert_eq!(wc.handle, wr[0].handle);
    }

    /// The device receives `msg` from the client: placements are copied into the server
    /// buffer; a rendezvous read is executed against the client's domain and completed.
    /// Returns the FIN the server's device sends back, if any.
    fn arrive(&mut self, msg: &[u8], client: &Client) -> Option<Transmit> {
        match self.srq.arrive(CLIENT, msg).unwrap() {
            Arrival::Place(p) => {
                let data = p.bytes(msg);
                self.mr[p.dst_off..p.dst_off + data.len()].copy_from_slice(data);
                None
            }
            Arrival::Read(r) => {
                assert_eq!(r.src, CLIENT);
                // The target's key check is the authority; it resolves the RVH's range.
                let range = client.domain.check_remote(u64::from(r.rkey), r.va, u64::from(r.len), RemoteOp::Read).unwrap();
                let mut off = 0;
                for seg in range.segments() {
                    let start = seg.addr - client.base();
                    self.mr[off..off + seg.len].copy_from_slice(&client.buf[start..start + seg.len]);
                    off += seg.len;
                }
                self.srq.read_complete(r.id).unwrap();
                self.srq.poll_transmit()
            }
            Arrival::Rnr => panic!("the suite keeps SRQ buffers posted"),
        }
    }
}

/// The client: its buffer (the suite's `client.mr`, filled with `'c'`) registered for remote
/// reads in its own fi_mr domain (4-byte provider keys: the key is the verbs rkey).
struct Client {
    buf: Vec<u8>,
    domain: Domain,
    rkey: u32,
    _mr: crate::mr::MemoryRegion,
}

impl Client {
    fn new() -> Client {
        let buf = vec![b'c'; MSG_SIZE];
        let domain = Domain::open(DomainAttr { mr_mode: MrMode::VIRT_ADDR | MrMode::PROV_KEY, mr_key_size: 4, mr_iov_limit: 1 }).unwrap();
        let mr = domain.reg(buf.as_ptr() as usize, buf.len(), Access::REMOTE_READ | Access::SEND, 0, 0, RegFlags::empty()).unwrap();
        let rkey = u32::try_from(mr.key().unwrap()).unwrap();
        Client { buf, domain, rkey, _mr: mr }
    }

    fn base(&self) -> usize {
        self.buf.as_ptr() as usize
    }

    /// `write_tm_header`: opcode at byte 0, tag at bytes 8..16; bytes 1..8 keep what was
    /// there. Returns the message sent (the whole buffer).
    fn eager_like(&mut self, op: TmOp, tag: u64) -> Vec<u8> {
        self.buf.fill(b'c');
        self.buf[0] = op as u8;
        self.buf[8..16].copy_from_slice(&tag.to_be_bytes());
        self.buf.clone()
    }

    /// `write_rndvu_header`: TMH as above, then the RVH naming the client's buffer; the
    /// request sent is `max_rndv_hdr_size` bytes, so the 32 bytes after the RVH are `'c'`.
    fn rndv(&mut self, tag: u64, max_rndv_hdr_size: usize) -> Vec<u8> {
        let mut m = self.eager_like(TmOp::Rndv, tag);
        let rvh = Rvh { va: self.base() as u64, rkey: self.rkey, len: MSG_SIZE as u32 };
        m[TMH_LEN..TMH_LEN + RVH_LEN].copy_from_slice(&rvh.to_bytes());
        self.buf[TMH_LEN..TMH_LEN + RVH_LEN].copy_from_slice(&rvh.to_bytes());
        m.truncate(max_rndv_hdr_size);
        m
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Eager,
    Unexpected,
    NoTag,
    Rndv,
}

/// `tm_traffic`: the loop every test of the suite runs.
fn tm_traffic(kind: Kind) {
    let mut server = Server::new();
    let mut client = Client::new();
    let iters = 10u64;
    for tag in 1..iters {
        server.post_recv_tm(tag);
    }
    let mut curr_unexpected_cnt = 1;
    for send_tag in (1..iters).rev() {
        let tag = if matches!(kind, Kind::Unexpected | Kind::NoTag) { FIXED_SEND_TAG } else { send_tag };
        let msg = match kind {
            Kind::Rndv => client.rndv(tag, server.srq.caps().max_rndv_hdr_size as usize),
            Kind::NoTag => client.eager_like(TmOp::NoTag, tag),
            Kind::Eager | Kind::Unexpected => client.eager_like(TmOp::Eager, tag),
        };
        let fin = server.arrive(&msg, &client);
        let wc = server.poll();
        match kind {
            Kind::Eager => {
                assert_eq!(cqe(&wc), (send_tag, WcOpcode::TmRecv, WcFlags::TM_MATCH | WcFlags::TM_DATA_VALID, send_tag));
                // The headers are stripped: the buffer holds msg_size - 16 'c' bytes.
                assert!(server.mr[..MSG_SIZE - TMH_LEN].iter().all(|&b| b == b'c'));
            }
            Kind::Unexpected | Kind::NoTag => {
                let op = if kind == Kind::NoTag { WcOpcode::TmNoTag } else { WcOpcode::TmRecv };
                assert_eq!(cqe(&wc), (0, op, WcFlags::NONE, 0));
                // The whole message, headers included, is in the untagged buffer.
                assert_eq!(server.mr, msg);
                if kind == Kind::Unexpected {
                    assert_eq!(server.unexp_cnt, curr_unexpected_cnt, "unexpected_count");
                    curr_unexpected_cnt += 1;
                } else {
                    assert_eq!(server.unexp_cnt, 0, "NO_TAG is not counted");
                }
            }
            Kind::Rndv => {
                assert_eq!(cqe(&wc), (send_tag, WcOpcode::TmRecv, WcFlags::TM_MATCH, send_tag));
                // The client's receive completion: the FIN, a copy of the request's TMH and
                // RVH with opcode FIN.
                let fin = fin.expect("the device sends FIN after its read");
                assert_eq!(fin.dst, CLIENT);
                let Ok(Message::Fin(tmh, rvh)) = Message::parse(&fin.msg) else { panic!("not a FIN: {fin:?}") };
                assert_eq!((tmh.op, tmh.tag), (TmOp::Fin, send_tag));
                assert_eq!(rvh.to_bytes()[..], msg[TMH_LEN..TMH_LEN + RVH_LEN]);
                let wc = server.poll();
                assert_eq!(cqe(&wc), (send_tag, WcOpcode::TmRecv, WcFlags::TM_DATA_VALID, send_tag));
                // The read brought the client's whole buffer (headers at its front).
                assert_eq!(server.mr, client.buf);
            }
        }
        assert!(server.srq.poll_cq().is_none());
        server.srq.post_srq_recv(0, MSG_SIZE).unwrap();
    }
    let listed = if matches!(kind, Kind::Eager | Kind::Rndv) { 0 } else { 9 };
    assert_eq!(server.srq.tags_listed(), listed);
}

/// rdma-core `tests/test_tag_matching.py::TMTest::test_tm_traffic`.
///
/// CONFORMANCE.md: T6, T28, T48, T50.
#[test]
fn rdma_core_test_tm_traffic() {
    tm_traffic(Kind::Eager);
}

/// rdma-core `tests/test_tag_matching.py::TMTest::test_tm_unexpected_tag`.
///
/// CONFORMANCE.md: T29, T44, T55, T61.
#[test]
fn rdma_core_test_tm_unexpected_tag() {
    tm_traffic(Kind::Unexpected);
}

/// rdma-core `tests/test_tag_matching.py::TMTest::test_tm_no_tag`.
///
/// CONFORMANCE.md: T49, T56.
#[test]
fn rdma_core_test_tm_no_tag() {
    tm_traffic(Kind::NoTag);
}

/// rdma-core `tests/test_tag_matching.py::TMTest::test_tm_rndv`: the request is
/// `max_rndv_hdr_size` bytes, so 32 `'c'` bytes follow the RVH; the read must still be the
/// RVH's (issue 17, deviation 1).
///
/// CONFORMANCE.md: T11, T18, T21, T58, T61.
#[test]
fn rdma_core_test_tm_rndv() {
    tm_traffic(Kind::Rndv);
}

/// The TMH the suite builds, decoded by the software decoder, is refused (its reserved bytes
/// are `'c'`), which is why the hardware model ignores them.
///
/// CONFORMANCE.md: T15.
#[test]
fn rdma_core_headers_have_non_zero_reserved_bytes() {
    let mut c = Client::new();
    let m = c.eager_like(TmOp::Eager, 3);
    assert!(Tmh::decode(&m).is_err());
    let mut s = Server::new();
    s.post_recv_tm(3);
    assert!(matches!(s.srq.arrive(CLIENT, &m).unwrap(), Arrival::Place(Placement { buffer: Buffer::Tagged { recv_wr_id: 3, .. }, .. })));
}
