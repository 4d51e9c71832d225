//! Tests of the fi_mr model (the registration cache has its own, in `cache/tests.rs`).

use super::*;

fn dom(mode: MrMode) -> Domain {
    Domain::open(DomainAttr { mr_mode: mode, ..DomainAttr::default() }).unwrap()
}

const RR: Access = Access::REMOTE_READ;
const RW: Access = Access::REMOTE_WRITE;
const NOFL: RegFlags = RegFlags::empty();

fn acc(e: RemoteAccessError) -> MrErrno {
    MrErrno::Access(e)
}

/// The initiator side of an RDMA read in a test: the target's check, then the copy of the
/// resolved segments out of `target` (the registered buffer, whose address the segments
/// name). Returns how many bytes were copied into `dst`; on refusal nothing is copied.
fn remote_read(d: &Domain, target: &[u8], key: u64, addr: u64, dst: &mut [u8]) -> (usize, Result<(), MrErrno>) {
    let r = match d.check_remote(key, addr, dst.len() as u64, RemoteOp::Read) {
        Ok(r) => r,
        Err(e) => return (0, Err(e)),
    };
    let base = target.as_ptr() as usize;
    let mut moved = 0;
    for s in r.segments() {
        let from = s.addr - base;
        dst[moved..moved + s.len].copy_from_slice(&target[from..from + s.len]);
        moved += s.len;
    }
    (moved, Ok(()))
}

#[test]
fn open_validates_attributes() {
    let bad = |a: DomainAttr| Domain::open(a).unwrap_err();
    let d = DomainAttr::default();
    assert_eq!(bad(DomainAttr { mr_key_size: 0, ..d }), MrErrno::Inval);
    assert_eq!(bad(DomainAttr { mr_key_size: 16, ..d }), MrErrno::Inval);
    assert_eq!(bad(DomainAttr { mr_key_size: MAX_MR_KEY_SIZE + 1, mr_mode: MrMode::RAW, ..d }), MrErrno::Inval);
    assert_eq!(bad(DomainAttr { mr_iov_limit: 0, ..d }), MrErrno::Inval);
    assert_eq!(bad(DomainAttr { mr_mode: MrMode::from_bits_retain(1 << 10), ..d }), MrErrno::Inval);
    assert!(Domain::open(DomainAttr { mr_key_size: 16, mr_mode: MrMode::RAW, ..d }).is_ok());
}

#[test]
fn reg_argument_errors() {
    let d = dom(MrMode::empty());
    assert_eq!(d.reg(0x1000, 0, RR, 0, 1, NOFL).unwrap_err(), MrErrno::Inval, "len 0");
    assert_eq!(d.reg(0x1000, 8, RR, 4, 1, NOFL).unwrap_err(), MrErrno::Inval, "offset");
    assert_eq!(d.reg(usize::MAX - 3, 8, RR, 0, 1, NOFL).unwrap_err(), MrErrno::Inval, "wrap");
    let bad_access = Access::from_bits_retain(1);
    assert_eq!(d.reg(0x1000, 8, bad_access, 0, 1, NOFL).unwrap_err(), MrErrno::Inval);
    let pmem = RegFlags::from_bits_retain(FI_RMA_PMEM);
    assert_eq!(d.reg(0x1000, 8, RR, 0, 1, pmem).unwrap_err(), MrErrno::BadFlags);
    let iov = [Segment { addr: 0x1000, len: 8 }; 5];
    assert_eq!(d.regv(&iov, RR, 0, 1, NOFL).unwrap_err(), MrErrno::Inval, "iov > limit");
    assert_eq!(d.regv(&[], RR, 0, 1, NOFL).unwrap_err(), MrErrno::Inval, "no iov");
    let _kept = d.regv(&iov[..4], RR, 0, 1, NOFL).unwrap();
    let z = [Segment { addr: 0x1000, len: 8 }, Segment { addr: 0x2000, len: 0 }];
    assert_eq!(d.regv(&z, RR, 0, 2, NOFL).unwrap_err(), MrErrno::Inval, "empty segment");
    assert_eq!(d.region_count(), 1);
}

#[test]
fn requested_keys() {
    let d = Domain::open(DomainAttr { mr_key_size: 2, ..DomainAttr::default() }).unwrap();
    let a = d.reg(0x1000, 8, RR, 0, 0xbeef, NOFL).unwrap();
    assert_eq!(a.key(), Ok(0xbeef));
    assert_eq!(d.reg(0x2000, 8, RR, 0, 0xbeef, NOFL).unwrap_err(), MrErrno::NoKey);
    assert_eq!(d.reg(0x2000, 8, RR, 0, 0x1_0000, NOFL).unwrap_err(), MrErrno::KeyRejected);
    let d8 = dom(MrMode::empty());
    assert_eq!(d8.reg(0x2000, 8, RR, 0, KEY_NOTAVAIL, NOFL).unwrap_err(), MrErrno::KeyRejected);
    assert!(d8.reg(0x2000, 8, RR, 0, u64::MAX - 1, NOFL).is_ok());
    // Closing frees the key for reuse.
    a.close().unwrap();
    assert!(d.reg(0x2000, 8, RR, 0, 0xbeef, NOFL).is_ok());
}

#[test]
fn provider_keys_ignore_requested_key_and_are_random() {
    let d = Domain::open(DomainAttr { mr_mode: MrMode::PROV_KEY, mr_key_size: 8, ..DomainAttr::default() }).unwrap();
    let mut keys = std::collections::HashSet::new();
    let mut regions = Vec::new();
    for i in 0..64 {
        // Same requested key every time, even the reserved one: ignored.
        let rk = if i % 2 == 0 { 5 } else { KEY_NOTAVAIL };
        let mr = d.reg(0x1000 + i * 64, 64, RR, 0, rk, NOFL).unwrap();
        keys.insert(mr.key().unwrap());
        regions.push(mr);
    }
    assert_eq!(keys.len(), 64, "distinct keys");
    assert!(!keys.contains(&5));
    // Not a counter: consecutive registrations are not consecutive numbers.
    let k: Vec<u64> = regions.iter().map(|r| r.key().unwrap()).collect();
    let sequential = k.windows(2).filter(|w| w[1].wrapping_sub(w[0]) == 1).count();
    assert!(sequential < 4, "keys look sequential: {k:x?}");
    // Wide keys use the high bits too.
    assert!(k.iter().any(|&x| x >> 32 != 0));

    let small = Domain::open(DomainAttr { mr_mode: MrMode::PROV_KEY, mr_key_size: 1, ..DomainAttr::default() }).unwrap();
    let mut held = Vec::new();
    let mut last = Ok(());
    for _ in 0..400 {
        match small.reg(0x1000, 8, RR, 0, 0, NOFL) {
            Ok(mr) => {
                assert!(mr.key().unwrap() <= 0xff);
                held.push(mr);
            }
            Err(e) => {
                last = Err(e);
                break;
            }
        }
    }
    assert_eq!(last, Err(MrErrno::NoSpace), "a 1-byte key space runs out");
    assert!(held.len() >= 128);
}

#[test]
fn check_remote_offsets_and_virt_addr() {
    let buf: Vec<u8> = (0..=255).collect();
    let base = buf.as_ptr() as usize;
    for mode in [MrMode::empty(), MrMode::VIRT_ADDR] {
        let d = dom(mode);
        let mr = d.reg(base, 256, RR, 0, 9, NOFL).unwrap();
        let origin = if mode.contains(MrMode::VIRT_ADDR) { base as u64 } else { 0 };
        let r = d.check_remote(9, origin + 10, 20, RemoteOp::Read).unwrap();
        assert_eq!(r.segments(), &[Segment { addr: base + 10, len: 20 }]);
        let mut out = [0u8; 4];
        let (n, res) = remote_read(&d, &buf, 9, origin + 252, &mut out);
        assert_eq!((n, res), (4, Ok(())));
        assert_eq!(out, [252, 253, 254, 255]);
        let mut raw = [0u8; 8];
        assert_eq!(mr.raw_attr(&mut raw).unwrap().base_addr, origin);
    }
}

#[test]
fn refused_accesses_move_nothing() {
    let buf = vec![0xabu8; 128];
    let base = buf.as_ptr() as usize;
    let d = dom(MrMode::PROV_KEY | MrMode::VIRT_ADDR);
    let mr = d.reg(base, 128, RR, 0, 0, NOFL).unwrap();
    let key = mr.key().unwrap();
    let b = base as u64;
    let mut dst = [0u8; 16];
    let mut try_read = |key, addr, len: usize| {
        dst = [0; 16];
        let (n, r) = remote_read(&d, &buf, key, addr, &mut dst[..len]);
        (n, r, dst)
    };
    let refused = |got: (usize, Result<(), MrErrno>, [u8; 16]), want: RemoteAccessError| {
        assert_eq!(got.0, 0, "bytes moved");
        assert_eq!(got.1, Err(acc(want)));
        assert_eq!(got.2, [0; 16], "destination untouched");
    };
    refused(try_read(key ^ 1, b, 16), RemoteAccessError::UnknownKey);
    refused(try_read(key, b - 1, 16), RemoteAccessError::OutOfRange);
    refused(try_read(key, b + 120, 16), RemoteAccessError::OutOfRange);
    refused(try_read(key, u64::MAX - 4, 16), RemoteAccessError::OutOfRange);
    let ok = try_read(key, b + 112, 16);
    assert_eq!((ok.0, ok.1, ok.2), (16, Ok(()), [0xab; 16]));
    // Overflowing length.
    assert_eq!(d.check_remote(key, b + 1, u64::MAX, RemoteOp::Read), Err(acc(RemoteAccessError::OutOfRange)));
    // No REMOTE_WRITE.
    assert_eq!(d.check_remote(key, b, 16, RemoteOp::Write), Err(acc(RemoteAccessError::Denied)));
    // Closed region: its key is gone.
    mr.close().unwrap();
    refused(try_read(key, b, 16), RemoteAccessError::UnknownKey);
}

#[test]
fn remote_read_right_missing() {
    let buf = vec![1u8; 64];
    let d = dom(MrMode::PROV_KEY);
    let mr = d.reg(buf.as_ptr() as usize, 64, RW | Access::SEND, 0, 0, NOFL).unwrap();
    let mut dst = [0u8; 8];
    let (n, r) = remote_read(&d, &buf, mr.key().unwrap(), 0, &mut dst);
    assert_eq!((n, r), (0, Err(acc(RemoteAccessError::Denied))));
    assert!(d.check_remote(mr.key().unwrap(), 0, 8, RemoteOp::Write).is_ok());
}

#[test]
fn stale_key_after_reregistration() {
    let buf = vec![3u8; 64];
    let base = buf.as_ptr() as usize;
    let d = dom(MrMode::PROV_KEY);
    let old = d.reg(base, 64, RR, 0, 0, NOFL).unwrap();
    let old_key = old.key().unwrap();
    drop(old);
    let new = d.reg(base, 64, RR, 0, 0, NOFL).unwrap();
    assert_ne!(new.key().unwrap(), old_key);
    let mut dst = [0u8; 8];
    assert_eq!(remote_read(&d, &buf, old_key, 0, &mut dst).0, 0);
    assert_eq!(remote_read(&d, &buf, new.key().unwrap(), 0, &mut dst).0, 8);
}

#[test]
fn regv_range_spans_segments() {
    let a: Vec<u8> = (0..16).collect();
    let b: Vec<u8> = (16..48).collect();
    let (pa, pb) = (a.as_ptr() as usize, b.as_ptr() as usize);
    let iov = [Segment { addr: pa, len: 16 }, Segment { addr: pb, len: 32 }];
    for mode in [MrMode::empty(), MrMode::VIRT_ADDR] {
        let d = dom(mode);
        let mr = d.regv(&iov, RR, 0, 77, NOFL).unwrap();
        let origin = mr.raw_attr(&mut [0u8; 8]).unwrap().base_addr;
        let r = d.check_remote(77, origin + 12, 10, RemoteOp::Read).unwrap();
        assert_eq!(r.segments(), &[Segment { addr: pa + 12, len: 4 }, Segment { addr: pb, len: 6 }]);
        assert_eq!(r.len(), 10);
        let r = d.check_remote(77, origin + 20, 28, RemoteOp::Read).unwrap();
        assert_eq!(r.segments(), &[Segment { addr: pb + 4, len: 28 }]);
        assert!(d.check_remote(77, origin + 20, 29, RemoteOp::Read).is_err());
        let r = d.check_remote(77, origin + 48, 0, RemoteOp::Read).unwrap();
        assert!(r.is_empty());
    }
}

#[test]
fn raw_keys_and_mapping() {
    let buf = [9u8; 32];
    let base = buf.as_ptr() as usize;
    let attr = DomainAttr { mr_mode: MrMode::RAW | MrMode::PROV_KEY | MrMode::VIRT_ADDR, mr_key_size: 16, mr_iov_limit: 1 };
    let target = Domain::open(attr).unwrap();
    let peer = Domain::open(attr).unwrap();
    let mr = target.reg(base, 32, RR, 0, 0, NOFL).unwrap();
    assert_eq!(mr.key(), Err(MrErrno::KeyNotAvail));
    let mut small = [0u8; 8];
    assert_eq!(mr.raw_attr(&mut small), Err(MrErrno::TooSmall { needed: 16 }));
    assert_eq!(small, [0; 8], "nothing written");
    let mut raw = [0u8; 20];
    let ra = mr.raw_attr(&mut raw).unwrap();
    assert_eq!(ra, RawAttr { base_addr: base as u64, key_size: 16 });
    let raw = &raw[..16];

    assert_eq!(peer.map_raw(ra.base_addr, &raw[..15], 0), Err(MrErrno::Inval));
    assert_eq!(peer.map_raw(ra.base_addr, raw, 1), Err(MrErrno::BadFlags));
    let mapped = peer.map_raw(ra.base_addr, raw, 0).unwrap();
    let back = peer.mapped_key(mapped).unwrap();
    assert_eq!((back.base_addr, back.raw_key.as_slice()), (base as u64, raw));

    // The target checks the whole raw key; the 8-byte prefix alone is not enough.
    assert!(target.check_remote_raw(&back.raw_key, base as u64, 32, RemoteOp::Read).is_ok());
    let mut forged = back.raw_key.clone();
    forged[15] ^= 1;
    assert_eq!(target.check_remote_raw(&forged, base as u64, 32, RemoteOp::Read), Err(acc(RemoteAccessError::UnknownKey)));
    let prefix = u64::from_le_bytes(raw[..8].try_into().unwrap());
    assert!(target.check_remote(prefix, base as u64, 8, RemoteOp::Read).is_err());

    peer.unmap_key(mapped).unwrap();
    assert_eq!(peer.unmap_key(mapped), Err(MrErrno::Inval));
    assert!(peer.mapped_key(mapped).is_none());
}

#[test]
fn raw_functions_with_short_keys() {
    let d = Domain::open(DomainAttr { mr_key_size: 4, ..DomainAttr::default() }).unwrap();
    let mr = d.reg(0x4000, 64, RR, 0, 0x0102_0304, NOFL).unwrap();
    let mut raw = [0u8; 4];
    assert_eq!(mr.raw_attr(&mut raw).unwrap().key_size, 4);
    assert_eq!(raw, [4, 3, 2, 1]);
    let k = d.map_raw(0, &raw, 0).unwrap();
    assert_eq!(k, 0x0102_0304, "short raw keys map to the key itself");
    assert_eq!(d.map_raw(0, &raw, 0).unwrap(), k);
    d.unmap_key(k).unwrap();
    d.unmap_key(k).unwrap();
    assert_eq!(d.unmap_key(k), Err(MrErrno::Inval));
}

#[test]
fn rma_event_counter_binding_enable_and_close() {
    let buf = [0u8; 64];
    let base = buf.as_ptr() as usize;
    let d = dom(MrMode::RMA_EVENT | MrMode::PROV_KEY);
    // Without FI_RMA_EVENT the region starts enabled but takes no counter.
    let plain = d.reg(base, 64, RW, 0, 0, NOFL).unwrap();
    assert!(plain.is_enabled());
    let c = Counter::new();
    assert_eq!(plain.bind_counter(&c, BindFlags::REMOTE_WRITE), Err(MrErrno::Inval));

    let mr = d.reg(base, 64, RW | RR, 0, 0, RegFlags::RMA_EVENT).unwrap();
    let key = mr.key().unwrap();
    assert!(!mr.is_enabled());
    assert_eq!(d.check_remote(key, 0, 8, RemoteOp::Write), Err(acc(RemoteAccessError::Disabled)));
    assert_eq!(mr.bind_counter(&c, BindFlags::empty()), Err(MrErrno::Inval));
    assert_eq!(mr.bind_counter(&c, BindFlags::from_bits_retain(1 << 12)), Err(MrErrno::BadFlags));
    mr.bind_counter(&c, BindFlags::REMOTE_WRITE).unwrap();
    mr.enable().unwrap();
    assert_eq!(mr.bind_counter(&Counter::new(), BindFlags::REMOTE_WRITE), Err(MrErrno::OpBadState));

    d.check_remote(key, 0, 8, RemoteOp::Write).unwrap();
    d.check_remote(key, 8, 8, RemoteOp::Write).unwrap();
    d.check_remote(key, 0, 8, RemoteOp::Read).unwrap();
    assert!(d.check_remote(key, 60, 8, RemoteOp::Write).is_err());
    assert_eq!(c.value(), 2, "granted writes only");

    let err = mr.close().unwrap_err();
    assert_eq!(err.errno, MrErrno::Busy);
    let mr = err.region;
    assert!(d.check_remote(key, 0, 8, RemoteOp::Read).is_ok(), "still registered");
    c.close();
    mr.close().unwrap();
    assert_eq!(d.check_remote(key, 0, 8, RemoteOp::Read), Err(acc(RemoteAccessError::UnknownKey)));
}

#[test]
fn counters_without_rma_event_mode() {
    let d = dom(MrMode::PROV_KEY);
    let mr = d.reg(0x1000, 64, RW, 0, 0, NOFL).unwrap();
    let c = Counter::new();
    mr.bind_counter(&c, BindFlags::REMOTE_WRITE).unwrap();
    mr.bind_counter(&c, BindFlags::REMOTE_WRITE).unwrap();
    d.check_remote(mr.key().unwrap(), 0, 1, RemoteOp::Write).unwrap();
    assert_eq!(c.value(), 1, "a counter bound twice counts once");
}

#[test]
fn endpoint_mode() {
    let d = dom(MrMode::ENDPOINT | MrMode::PROV_KEY);
    let mr = d.reg(0x1000, 64, RR, 0, 0, NOFL).unwrap();
    let key = mr.key().unwrap();
    assert!(!mr.is_enabled());
    assert_eq!(mr.enable(), Err(MrErrno::OpBadState), "no endpoint bound");
    let ep = Endpoint::new();
    assert_eq!(mr.bind_endpoint(&ep, 1), Err(MrErrno::BadFlags));
    mr.bind_endpoint(&ep, 0).unwrap();
    assert_eq!(mr.bind_endpoint(&Endpoint::new(), 0), Err(MrErrno::Inval), "one endpoint");
    assert_eq!(d.check_remote(key, 0, 8, RemoteOp::Read), Err(acc(RemoteAccessError::Disabled)));
    mr.enable().unwrap();
    d.check_remote(key, 0, 8, RemoteOp::Read).unwrap();
    assert_eq!(mr.bind_endpoint(&ep, 0), Err(MrErrno::OpBadState), "after enable");
    let mr = mr.close().unwrap_err().region;
    ep.close();
    mr.close().unwrap();
    assert_eq!(d.region_count(), 0);
}

#[test]
fn local_descriptors() {
    let buf = [0u8; 64];
    let base = buf.as_ptr() as usize;
    let d = dom(MrMode::LOCAL);
    let mr = d.reg(base, 64, Access::SEND, 0, 1, NOFL).unwrap();
    let other = dom(MrMode::empty());
    // Without FI_MR_LOCAL anything goes.
    assert!(other.check_local(mr.desc(), 0, 1, Access::RECV).is_ok());
    d.check_local(mr.desc(), base + 8, 56, Access::SEND).unwrap();
    assert_eq!(d.check_local(mr.desc(), base + 8, 57, Access::SEND), Err(acc(RemoteAccessError::OutOfRange)));
    assert_eq!(d.check_local(mr.desc(), base, 8, Access::RECV), Err(acc(RemoteAccessError::Denied)));
    let desc = mr.desc();
    drop(mr);
    assert_eq!(d.check_local(desc, base, 8, Access::SEND), Err(MrErrno::Inval));
}

#[test]
fn refresh_checks_ranges() {
    let d = dom(MrMode::MMU_NOTIFY);
    let mr = d.regv(&[Segment { addr: 0x1000, len: 0x100 }, Segment { addr: 0x3000, len: 0x100 }], RR, 0, 1, NOFL).unwrap();
    mr.refresh(&[], 0).unwrap();
    mr.refresh(&[Segment { addr: 0x3010, len: 0x10 }], 0).unwrap();
    assert_eq!(mr.refresh(&[Segment { addr: 0x10f0, len: 0x20 }], 0), Err(MrErrno::Inval));
    assert_eq!(mr.refresh(&[Segment { addr: usize::MAX, len: 2 }], 0), Err(MrErrno::Inval));
    assert_eq!(mr.refresh(&[], 4), Err(MrErrno::BadFlags));
    assert_eq!(mr.refresh_count(), 2);
}

#[test]
fn errno_codes() {
    assert_eq!(MrErrno::Inval.code(), 22);
    assert_eq!(MrErrno::NoKey.code(), 266);
    assert_eq!(MrErrno::KeyRejected.code(), 129);
    assert_eq!(MrErrno::BadFlags.code(), 260);
    assert_eq!(MrErrno::TooSmall { needed: 3 }.code(), 257);
    assert_eq!(MrErrno::Access(RemoteAccessError::Denied).code(), 13);
    let e: crate::Error = MrErrno::Busy.into();
    assert!(e.to_string().contains("FI_EBUSY"));
}
