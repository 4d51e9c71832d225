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
    assert_eq!(bad(DomainAttr { mr_mode: MrMode::from_bits_retain(1 << 12), ..d }), MrErrno::Inval, "not a libfabric bit");
    assert!(Domain::open(DomainAttr { mr_key_size: 16, mr_mode: MrMode::RAW, ..d }).is_ok());
}

/// CONFORMANCE.md: M1, M41, M43, M44, M61, M68.
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

/// CONFORMANCE.md: M24, M66, M67.
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

/// CONFORMANCE.md: M30, M42.
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

/// CONFORMANCE.md: M23, M28.
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

/// CONFORMANCE.md: T21, M21.
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

/// CONFORMANCE.md: M21, M50, M53.
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

/// CONFORMANCE.md: M6.
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

/// CONFORMANCE.md: M2.
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

/// CONFORMANCE.md: M8, M9, M10, M11, M12, M27.
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

/// CONFORMANCE.md: M9, M14.
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

/// CONFORMANCE.md: M4, M15, M19, M32, M51, M68.
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

/// CONFORMANCE.md: M15, M17.
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

/// CONFORMANCE.md: M16, M19, M33.
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

/// CONFORMANCE.md: M7, M25, M26, M46, M47.
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

/// CONFORMANCE.md: M18, M22.
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

/// CONFORMANCE.md: M69.
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

// ---------------------------------------------------------------- issue 17, items 6 to 8

use super::cache::testmem::Mapping;
use super::pages::page_size;

/// Item 8, probed: `FI_MR_HMEM` and `FI_MR_COLLECTIVE` asked for by an application were refused
/// with EINVAL; a provider clears the bits it does not need, as `fi_getinfo` does, and says so.
///
/// CONFORMANCE.md: M34, M35, M36, M37, M38, M45, M52, M55, M56, M62.
#[test]
fn unneeded_mode_bits_are_cleared_and_reported() {
    let asked = MrMode::HMEM | MrMode::COLLECTIVE | MrMode::VIRT_ADDR | MrMode::PROV_KEY;
    let d = dom(asked);
    assert_eq!(d.attr().mr_mode, MrMode::VIRT_ADDR | MrMode::PROV_KEY);
    assert_eq!(d.cleared_mode(), MrMode::HMEM | MrMode::COLLECTIVE);
    assert_eq!(dom(MrMode::LOCAL).cleared_mode(), MrMode::empty());
    // FI_MR_BASIC alone is basic registration (never cleared); with other bits it is invalid.
    let b = dom(MrMode::BASIC);
    assert_eq!(b.attr().mr_mode, MrMode::BASIC | MrMode::VIRT_ADDR | MrMode::ALLOCATED | MrMode::PROV_KEY);
    assert_eq!(b.cleared_mode(), MrMode::empty());
    assert_eq!(dom(MrMode::SCALABLE).attr().mr_mode, MrMode::empty());
    for m in [MrMode::BASIC | MrMode::LOCAL, MrMode::SCALABLE | MrMode::RAW, MrMode::BASIC | MrMode::SCALABLE] {
        assert_eq!(Domain::open(DomainAttr { mr_mode: m, ..DomainAttr::default() }).unwrap_err(), MrErrno::Inval, "{m:?}");
    }
    // FI_COLLECTIVE access is accepted (and nothing requires it); device memory and
    // authorization keys are -FI_ENOSYS.
    let buf = [0u8; 64];
    let base = buf.as_ptr() as usize;
    let mr = d.reg(base, 64, Access::COLLECTIVE | Access::SEND | Access::RECV, 0, 0, NOFL).unwrap();
    assert!(mr.access().contains(Access::COLLECTIVE));
    let iov = [Segment { addr: base, len: 64 }];
    let cuda = MrAttr { iface: HmemIface::Cuda, ..MrAttr::new(&iov, RR, 0, 0) };
    assert_eq!(d.regattr(&cuda, NOFL).unwrap_err(), MrErrno::NoSys);
    let auth = MrAttr { auth_key: b"secret", ..MrAttr::new(&iov, RR, 0, 0) };
    assert_eq!(d.regattr(&auth, NOFL).unwrap_err(), MrErrno::NoSys);
    for f in [RegFlags::DMABUF, RegFlags::HMEM_DEVICE_ONLY, RegFlags::HMEM_HOST_ALLOC] {
        assert_eq!(d.reg(base, 64, RR, 0, 0, f).unwrap_err(), MrErrno::NoSys, "{f:?}");
    }
    assert_eq!((MrErrno::NoSys.code(), MrErrno::Fault.code()), (38, 14));
}

/// Item 6, probed: `FI_MR_ALLOCATED` did nothing. Registering a range with unmapped pages now
/// fails with `-FI_EFAULT`; without the bit any range may be registered (the man page's
/// default).
///
/// CONFORMANCE.md: M22, M29.
#[test]
fn allocated_requires_mapped_pages() {
    let p = page_size();
    let mut m = Mapping::new(3 * p).unwrap();
    let d = dom(MrMode::ALLOCATED | MrMode::PROV_KEY);
    let mr = d.reg(m.addr(), 3 * p, RR, 0, 0, NOFL).unwrap();
    m.unmap_part(p, p);
    assert_eq!(d.reg(m.addr(), 3 * p, RR, 0, 0, NOFL).unwrap_err(), MrErrno::Fault);
    let iov = [Segment { addr: m.addr(), len: p }, Segment { addr: m.addr() + p + 8, len: 8 }];
    assert_eq!(d.regv(&iov, RR, 0, 0, NOFL).unwrap_err(), MrErrno::Fault, "second segment in the hole");
    assert!(d.reg(m.addr() + 2 * p, p, RR, 0, 0, NOFL).is_ok());
    // refresh re-verifies under ALLOCATED.
    assert_eq!(mr.refresh(&[], 0), Err(MrErrno::Fault));
    // Without ALLOCATED, the hole registers fine.
    assert!(dom(MrMode::PROV_KEY).reg(m.addr() + p, p, RR, 0, 0, NOFL).is_ok());
}

/// Item 6, probed: under `FI_MR_MMU_NOTIFY`, `refresh` only counted. A region whose pages
/// changed now refuses access until `refresh`, which re-enables it.
///
/// CONFORMANCE.md: M18, M31.
#[test]
fn mmu_notify_refuses_access_until_refresh() {
    let buf = vec![5u8; 4 * 4096];
    let base = buf.as_ptr() as usize;
    let d = dom(MrMode::MMU_NOTIFY | MrMode::PROV_KEY | MrMode::VIRT_ADDR);
    let mr = d.reg(base, 4096, RR, 0, 0, NOFL).unwrap();
    let other = d.reg(base + 2 * 4096, 4096, RR, 0, 0, NOFL).unwrap();
    let (k, k2) = (mr.key().unwrap(), other.key().unwrap());
    d.check_remote(k, base as u64, 16, RemoteOp::Read).unwrap();
    d.pages_changed(base + 100, base + 200);
    assert_eq!(d.check_remote(k, base as u64, 16, RemoteOp::Read), Err(acc(RemoteAccessError::Disabled)));
    assert!(!mr.is_enabled());
    assert!(d.check_remote(k2, (base + 2 * 4096) as u64, 16, RemoteOp::Read).is_ok(), "not its pages");
    mr.refresh(&[], 0).unwrap();
    assert!(mr.is_enabled());
    d.check_remote(k, base as u64, 16, RemoteOp::Read).unwrap();
    // More changes than the ring remembers, none of ours: still refused (conservative).
    for i in 0..100 {
        d.pages_changed(base + 8 * 4096 + i, base + 8 * 4096 + i + 1);
    }
    assert!(!other.is_enabled(), "fell behind the ring: treated as changed");
    other.refresh(&[], 0).unwrap();
    assert!(other.is_enabled());
    // Without MMU_NOTIFY a page change is the cache's business, not the region's.
    let plain = dom(MrMode::PROV_KEY);
    let r = plain.reg(base, 4096, RR, 0, 0, NOFL).unwrap();
    plain.pages_changed(base, base + 4096);
    assert!(r.is_enabled());
}

/// Item 6 through the registration cache's monitor: it is the domain's MMU notifier, so a
/// `madvise(MADV_DONTNEED)` of registered pages disables an MMU_NOTIFY region outside the
/// cache as soon as the call returns.
///
/// CONFORMANCE.md: M31.
#[test]
fn mmu_notify_through_the_cache_monitor() {
    let p = page_size();
    let d = dom(MrMode::MMU_NOTIFY | MrMode::PROV_KEY | MrMode::VIRT_ADDR);
    let cache = MrCache::new(d.clone(), CacheConfig::default()).unwrap();
    if !cache.is_caching() {
        eprintln!("skipped: no userfaultfd monitor here ({:?})", cache.monitor_status());
        return;
    }
    let mut m = Mapping::new(2 * p).unwrap();
    m.fill(3);
    let cached = cache.get(m.addr(), 2 * p, RR).unwrap();
    let mr = d.reg(m.addr(), p, RR, 0, 0, NOFL).unwrap();
    assert!(mr.is_enabled());
    m.discard(0, p);
    assert!(!mr.is_enabled(), "the monitor saw the pages go");
    assert!(!cached.is_valid());
    mr.refresh(&[], 0).unwrap();
    assert!(mr.is_enabled());
}

/// Item 7, probed: dropping a region skipped the `-FI_EBUSY` rule. A region dropped while a
/// counter is bound stays registered (its key keeps working, the counter keeps counting) until
/// the counter is closed and the domain reaps it.
///
/// CONFORMANCE.md: M4.
#[test]
fn dropping_a_bound_region_does_not_bypass_ebusy() {
    let buf = [0u8; 64];
    let base = buf.as_ptr() as usize;
    let d = dom(MrMode::RMA_EVENT | MrMode::PROV_KEY);
    let c = Counter::new();
    let mr = d.reg(base, 64, RW, 0, 0, RegFlags::RMA_EVENT).unwrap();
    mr.bind_counter(&c, BindFlags::REMOTE_WRITE).unwrap();
    mr.enable().unwrap();
    let key = mr.key().unwrap();
    drop(mr);
    assert_eq!(d.region_count(), 1, "still registered");
    d.check_remote(key, 0, 8, RemoteOp::Write).unwrap();
    assert_eq!(c.value(), 1);
    assert_eq!(d.reap(), 0, "counter still open");
    // A failed close handed back and then dropped is the same case.
    let mr2 = d.reg(base, 64, RW, 0, 0, RegFlags::RMA_EVENT).unwrap();
    mr2.bind_counter(&c, BindFlags::REMOTE_WRITE).unwrap();
    drop(mr2.close().unwrap_err());
    assert_eq!(d.region_count(), 2);
    c.close();
    assert_eq!(d.reap(), 2);
    assert_eq!(d.region_count(), 0);
    assert_eq!(d.check_remote(key, 0, 8, RemoteOp::Write), Err(acc(RemoteAccessError::UnknownKey)));
    // Endpoints likewise; a registration call reaps too.
    let ep = Endpoint::new();
    let de = dom(MrMode::ENDPOINT);
    let mr = de.reg(base, 64, RR, 0, 7, NOFL).unwrap();
    mr.bind_endpoint(&ep, 0).unwrap();
    drop(mr);
    assert_eq!(de.region_count(), 1);
    ep.close();
    let _other = de.reg(base, 64, RR, 0, 8, NOFL).unwrap();
    assert_eq!(de.region_count(), 1, "the orphan was reaped by the registration");
    // An unbound region still goes at once.
    drop(de.reg(base, 64, RR, 0, 9, NOFL).unwrap());
    assert_eq!(de.region_count(), 1);
}

/// Item 7, probed: under `FI_MR_RAW` an 8-byte key was accepted by `check_remote` without any
/// `map_raw`. The mapping is now required: the target takes raw keys only, and the key an
/// initiator holds is a local handle, not the wire key.
///
/// CONFORMANCE.md: M10, M13, M27.
#[test]
fn raw_mode_requires_the_mapping_even_for_8_byte_keys() {
    let buf = [7u8; 32];
    let base = buf.as_ptr() as usize;
    let attr = DomainAttr { mr_mode: MrMode::RAW | MrMode::PROV_KEY | MrMode::VIRT_ADDR, mr_key_size: 8, mr_iov_limit: 1 };
    let (target, peer) = (Domain::open(attr).unwrap(), Domain::open(attr).unwrap());
    let mr = target.reg(base, 32, RR, 0, 0, NOFL).unwrap();
    assert_eq!(mr.key(), Err(MrErrno::KeyNotAvail));
    let mut raw = [0u8; 8];
    mr.raw_attr(&mut raw).unwrap();
    let as_u64 = u64::from_le_bytes(raw);
    assert_eq!(target.check_remote(as_u64, base as u64, 8, RemoteOp::Read), Err(acc(RemoteAccessError::UnknownKey)));
    let mapped = peer.map_raw(base as u64, &raw, 0).unwrap();
    let wire = peer.mapped_key(mapped).unwrap();
    assert_eq!(wire.raw_key, raw);
    target.check_remote_raw(&wire.raw_key, base as u64, 8, RemoteOp::Read).unwrap();
    // Two mappings of one raw key are two handles, each to be unmapped.
    let again = peer.map_raw(base as u64, &raw, 0).unwrap();
    assert_ne!(again, mapped);
    peer.unmap_key(mapped).unwrap();
    assert!(peer.mapped_key(mapped).is_none());
    assert!(peer.mapped_key(again).is_some());
    peer.unmap_key(again).unwrap();
}

/// `FI_READ` and `FI_WRITE` (the local side of RMA) under `FI_MR_LOCAL`: granted exactly.
///
/// CONFORMANCE.md: M26, M48, M49.
#[test]
fn local_read_and_write_access() {
    let buf = [0u8; 64];
    let base = buf.as_ptr() as usize;
    let d = dom(MrMode::LOCAL);
    let r = d.reg(base, 64, Access::READ, 0, 1, NOFL).unwrap();
    let w = d.reg(base, 64, Access::WRITE, 0, 2, NOFL).unwrap();
    d.check_local(r.desc(), base, 64, Access::READ).unwrap();
    d.check_local(w.desc(), base, 64, Access::WRITE).unwrap();
    assert_eq!(d.check_local(r.desc(), base, 8, Access::WRITE), Err(acc(RemoteAccessError::Denied)));
    assert_eq!(d.check_local(w.desc(), base, 8, Access::READ), Err(acc(RemoteAccessError::Denied)));
}

/// Issue 55 item 11 (CONFORMANCE.md M13): a raw key worked at the target without the
/// initiator's `map_raw`, and kept working after `unmap_key`. A data transfer now carries a
/// `RawKey`, which only a mapping gives and which names nothing once the mapping is released
/// (raw bytes from `raw_attr` do not even compile as one; see `Domain::check_remote_raw`).
///
/// CONFORMANCE.md: M10, M11, M13.
#[test]
fn raw_keys_reach_a_region_only_through_a_live_mapping() {
    let buf = [5u8; 64];
    let base = buf.as_ptr() as usize;
    for key_size in [8, 16] {
        let attr = DomainAttr { mr_mode: MrMode::RAW | MrMode::PROV_KEY | MrMode::VIRT_ADDR, mr_key_size: key_size, mr_iov_limit: 1 };
        let (target, initiator) = (Domain::open(attr).unwrap(), Domain::open(attr).unwrap());
        let mr = target.reg(base, 64, RR, 0, 0, NOFL).unwrap();
        let mut raw = vec![0u8; key_size];
        let at = mr.raw_attr(&mut raw).unwrap();
        let first = initiator.map_raw(at.base_addr, &raw, 0).unwrap();
        let second = initiator.map_raw(at.base_addr, &raw, 0).unwrap();
        let (k1, k2) = (initiator.mapped_key(first).unwrap().raw_key, initiator.mapped_key(second).unwrap().raw_key);
        assert!(k1 == raw[..] && k1.is_mapped() && k2.is_mapped());
        target.check_remote_raw(&k1, base as u64, 64, RemoteOp::Read).unwrap();
        initiator.unmap_key(first).unwrap();
        assert!(!k1.is_mapped(), "{key_size}-byte key: released with its mapping");
        assert_eq!(target.check_remote_raw(&k1, base as u64, 8, RemoteOp::Read), Err(acc(RemoteAccessError::UnknownKey)));
        // The other mapping of the same raw key is its own, still in place.
        target.check_remote_raw(&k2, base as u64, 8, RemoteOp::Read).unwrap();
        drop(initiator);
        assert_eq!(
            target.check_remote_raw(&k2, base as u64, 8, RemoteOp::Read),
            Err(acc(RemoteAccessError::UnknownKey)),
            "the initiator's domain is closed"
        );
    }
    // Short keys without FI_MR_RAW map to themselves; the shared mapping lives until its last
    // unmap.
    let d = Domain::open(DomainAttr { mr_key_size: 4, ..DomainAttr::default() }).unwrap();
    let mr = d.reg(base, 64, RR, 0, 0x0a0b_0c0d, NOFL).unwrap();
    let mut raw = [0u8; 4];
    mr.raw_attr(&mut raw).unwrap();
    let (a, b) = (d.map_raw(0, &raw, 0).unwrap(), d.map_raw(0, &raw, 0).unwrap());
    let wire = d.mapped_key(a).unwrap().raw_key;
    d.check_remote_raw(&wire, 0, 8, RemoteOp::Read).unwrap();
    d.unmap_key(a).unwrap();
    d.check_remote_raw(&wire, 0, 8, RemoteOp::Read).unwrap();
    d.unmap_key(b).unwrap();
    assert_eq!(d.check_remote_raw(&wire, 0, 8, RemoteOp::Read), Err(acc(RemoteAccessError::UnknownKey)));
}
