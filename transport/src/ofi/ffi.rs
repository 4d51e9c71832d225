//! The C shim's functions (`shim.c`) and the libfabric header values Rust needs.
//!
//! Everything here is `unsafe` to call; the safe wrappers are in [`super::core`]. The shim's
//! structs ([`Attrs`], [`Comp`]) are declared in `shim.c` and mirrored here field for field;
//! no libfabric struct crosses the boundary. The constants are copied from libfabric 1.17's
//! headers and checked against the shim (`tofi_constant`) by a test.

// The header values are mirrored whole; some only serve the constants test and phase 2.
#![allow(dead_code)]

use std::ffi::{c_char, c_int, c_void};

/// Opaque `struct fi_info`.
#[repr(C)]
pub struct FiInfo {
    _p: [u8; 0],
}
/// Opaque `struct fid_fabric`.
#[repr(C)]
pub struct FidFabric {
    _p: [u8; 0],
}
/// Opaque `struct fid_domain`.
#[repr(C)]
pub struct FidDomain {
    _p: [u8; 0],
}
/// Opaque `struct fid_cq`.
#[repr(C)]
pub struct FidCq {
    _p: [u8; 0],
}
/// Opaque `struct fid_av`.
#[repr(C)]
pub struct FidAv {
    _p: [u8; 0],
}
/// Opaque `struct fid_ep`.
#[repr(C)]
pub struct FidEp {
    _p: [u8; 0],
}
/// Opaque `struct fid_mr`.
#[repr(C)]
pub struct FidMr {
    _p: [u8; 0],
}

/// `struct tofi_attrs` of `shim.c`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct Attrs {
    pub prov_name: *const c_char,
    pub fabric_name: *const c_char,
    pub domain_name: *const c_char,
    pub caps: u64,
    pub mode: u64,
    pub mr_mode: u64,
    pub mr_key_size: u64,
    pub mr_iov_limit: u64,
    pub max_msg_size: u64,
    pub inject_size: u64,
    pub mem_tag_format: u64,
    pub addr_format: u64,
    pub tx_size: u64,
    pub rx_size: u64,
    pub iov_limit: u64,
    pub threading: u64,
}

/// `struct tofi_comp` of `shim.c`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct Comp {
    pub ctx: *mut c_void,
    pub flags: u64,
    pub len: u64,
    pub tag: u64,
    pub data: u64,
    pub olen: u64,
    pub err: i32,
    pub prov_errno: i32,
}

impl Comp {
    pub const ZERO: Comp = Comp { ctx: std::ptr::null_mut(), flags: 0, len: 0, tag: 0, data: 0, olen: 0, err: 0, prov_errno: 0 };
}

/// `struct iovec`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct IoVec {
    pub base: *const c_void,
    pub len: usize,
}

extern "C" {
    pub fn tofi_version() -> u32;
    pub fn tofi_strerror(code: c_int) -> *const c_char;
    pub fn tofi_getinfo(prov: *const c_char, node: *const c_char, caps: u64, mode: u64, mr_mode: u64, out: *mut *mut FiInfo) -> c_int;
    pub fn tofi_freeinfo(info: *mut FiInfo);
    pub fn tofi_info_next(info: *const FiInfo) -> *mut FiInfo;
    pub fn tofi_info_dup(info: *const FiInfo) -> *mut FiInfo;
    pub fn tofi_info_attrs(info: *const FiInfo, a: *mut Attrs);
    pub fn tofi_fabric(info: *mut FiInfo, fabric: *mut *mut FidFabric) -> c_int;
    pub fn tofi_domain(fabric: *mut FidFabric, info: *mut FiInfo, domain: *mut *mut FidDomain) -> c_int;
    pub fn tofi_cq_open(domain: *mut FidDomain, size: u64, want_fd: c_int, cq: *mut *mut FidCq) -> c_int;
    pub fn tofi_cq_wait_fd(cq: *mut FidCq, fd: *mut c_int) -> c_int;
    pub fn tofi_trywait(fabric: *mut FidFabric, cq: *mut FidCq) -> c_int;
    pub fn tofi_av_open(domain: *mut FidDomain, count: u64, av: *mut *mut FidAv) -> c_int;
    pub fn tofi_av_insert(av: *mut FidAv, addr: *const c_void, fi_addr: *mut u64) -> c_int;
    pub fn tofi_endpoint(domain: *mut FidDomain, info: *mut FiInfo, cq: *mut FidCq, av: *mut FidAv, ep: *mut *mut FidEp) -> c_int;
    pub fn tofi_getname(ep: *mut FidEp, addr: *mut c_void, len: *mut u64) -> c_int;
    pub fn tofi_close_fabric(f: *mut FidFabric) -> c_int;
    pub fn tofi_close_domain(d: *mut FidDomain) -> c_int;
    pub fn tofi_close_cq(c: *mut FidCq) -> c_int;
    pub fn tofi_close_av(a: *mut FidAv) -> c_int;
    pub fn tofi_close_ep(e: *mut FidEp) -> c_int;
    pub fn tofi_close_mr(m: *mut FidMr) -> c_int;
    pub fn tofi_tsend(ep: *mut FidEp, buf: *const c_void, len: u64, desc: *mut c_void, dest: u64, tag: u64, ctx: *mut c_void) -> i64;
    pub fn tofi_tinject(ep: *mut FidEp, buf: *const c_void, len: u64, dest: u64, tag: u64) -> i64;
    pub fn tofi_trecv(
        ep: *mut FidEp,
        buf: *mut c_void,
        len: u64,
        desc: *mut c_void,
        src: u64,
        tag: u64,
        ignore: u64,
        ctx: *mut c_void,
    ) -> i64;
    pub fn tofi_trecvmsg(
        ep: *mut FidEp,
        buf: *mut c_void,
        len: u64,
        desc: *mut c_void,
        src: u64,
        tag: u64,
        ignore: u64,
        ctx: *mut c_void,
        flags: u64,
    ) -> i64;
    pub fn tofi_cancel(ep: *mut FidEp, ctx: *mut c_void) -> i64;
    pub fn tofi_read(ep: *mut FidEp, buf: *mut c_void, len: u64, desc: *mut c_void, src: u64, addr: u64, key: u64, ctx: *mut c_void)
        -> i64;
    pub fn tofi_cq_read(cq: *mut FidCq, out: *mut Comp, count: u64) -> i64;
    pub fn tofi_mr_regv(
        domain: *mut FidDomain,
        iov: *const IoVec,
        count: u64,
        access: u64,
        requested_key: u64,
        flags: u64,
        context: u64,
        mr: *mut *mut FidMr,
    ) -> c_int;
    pub fn tofi_mr_key(mr: *mut FidMr) -> u64;
    pub fn tofi_mr_desc(mr: *mut FidMr) -> *mut c_void;
    pub fn tofi_mr_raw_attr(mr: *mut FidMr, base_addr: *mut u64, raw_key: *mut u8, key_size: *mut u64) -> c_int;
    pub fn tofi_mr_bind_ep(mr: *mut FidMr, ep: *mut FidEp) -> c_int;
    pub fn tofi_mr_enable(mr: *mut FidMr) -> c_int;
    pub fn tofi_mr_map_raw(domain: *mut FidDomain, base_addr: u64, raw_key: *mut u8, key_size: u64, key: *mut u64) -> c_int;
    pub fn tofi_mr_unmap_key(domain: *mut FidDomain, key: u64) -> c_int;
    pub fn tofi_constant(i: u32) -> u64;
}

pub const FI_MSG: u64 = 1 << 1;
pub const FI_RMA: u64 = 1 << 2;
pub const FI_TAGGED: u64 = 1 << 3;
pub const FI_READ: u64 = 1 << 8;
pub const FI_WRITE: u64 = 1 << 9;
pub const FI_RECV: u64 = 1 << 10;
pub const FI_SEND: u64 = 1 << 11;
pub const FI_REMOTE_READ: u64 = 1 << 12;
pub const FI_REMOTE_WRITE: u64 = 1 << 13;
pub const FI_DIRECTED_RECV: u64 = 1 << 59;
pub const FI_SOURCE: u64 = 1 << 57;
pub const FI_PEEK: u64 = 1 << 19;
pub const FI_CLAIM: u64 = 1 << 59;
pub const FI_DISCARD: u64 = 1 << 58;
pub const FI_CONTEXT: u64 = 1 << 59;
pub const FI_CONTEXT2: u64 = 1 << 52;
pub const FI_MR_LOCAL: u64 = 1 << 2;
pub const FI_MR_RAW: u64 = 1 << 3;
pub const FI_MR_VIRT_ADDR: u64 = 1 << 4;
pub const FI_MR_ALLOCATED: u64 = 1 << 5;
pub const FI_MR_PROV_KEY: u64 = 1 << 6;
pub const FI_MR_MMU_NOTIFY: u64 = 1 << 7;
pub const FI_MR_RMA_EVENT: u64 = 1 << 8;
pub const FI_MR_ENDPOINT: u64 = 1 << 9;
pub const FI_MR_HMEM: u64 = 1 << 10;
pub const FI_ADDR_UNSPEC: u64 = u64::MAX;
pub const FI_KEY_NOTAVAIL: u64 = u64::MAX;
pub const FI_EAGAIN: i32 = 11;
pub const FI_ENOENT: i32 = 2;
pub const FI_ENOMSG: i32 = 42;
pub const FI_ECANCELED: i32 = 125;
pub const FI_EAVAIL: i32 = 259;
pub const FI_ETRUNC: i32 = 265;
pub const FI_ENODATA: i32 = 61;
pub const FI_EACCES: i32 = 13;
pub const FI_EINVAL: i32 = 22;
pub const FI_ENOKEY: i32 = 266;
pub const FI_EKEYREJECTED: i32 = 129;
pub const FI_EBADFLAGS: i32 = 260;
pub const FI_ETOOSMALL: i32 = 257;
pub const FI_ENOSYS: i32 = 38;
pub const FI_EOPBADSTATE: i32 = 258;
pub const FI_EBUSY: i32 = 16;
pub const FI_ENOSPC: i32 = 28;
pub const FI_EFAULT: i32 = 14;
pub const FI_EOTHER: i32 = 256;
pub const FI_ENOMEM: i32 = 12;
pub const FI_REMOTE_CQ_DATA: u64 = 1 << 17;
pub const FI_MULTI_RECV: u64 = 1 << 16;
pub const FI_LOCAL_COMM: u64 = 1 << 51;
pub const FI_REMOTE_COMM: u64 = 1 << 52;
pub const FI_COLLECTIVE: u64 = 1 << 6;
pub const FI_MR_COLLECTIVE: u64 = 1 << 11;

/// The values above in the order of `tofi_constant` (errno values as the shim's positive
/// `FI_E*`).
#[cfg(test)]
pub const CONSTANTS: &[u64] = &[
    FI_MSG,
    FI_RMA,
    FI_TAGGED,
    FI_READ,
    FI_WRITE,
    FI_RECV,
    FI_SEND,
    FI_REMOTE_READ,
    FI_REMOTE_WRITE,
    FI_DIRECTED_RECV,
    FI_SOURCE,
    FI_PEEK,
    FI_CLAIM,
    FI_DISCARD,
    FI_CONTEXT,
    FI_CONTEXT2,
    FI_MR_LOCAL,
    FI_MR_RAW,
    FI_MR_VIRT_ADDR,
    FI_MR_ALLOCATED,
    FI_MR_PROV_KEY,
    FI_MR_MMU_NOTIFY,
    FI_MR_RMA_EVENT,
    FI_MR_ENDPOINT,
    FI_MR_HMEM,
    FI_ADDR_UNSPEC,
    FI_KEY_NOTAVAIL,
    FI_EAGAIN as u64,
    FI_ENOMSG as u64,
    FI_ECANCELED as u64,
    FI_EAVAIL as u64,
    FI_ETRUNC as u64,
    FI_ENODATA as u64,
    FI_EACCES as u64,
    FI_EINVAL as u64,
    FI_ENOKEY as u64,
    FI_EKEYREJECTED as u64,
    FI_EBADFLAGS as u64,
    FI_ETOOSMALL as u64,
    FI_ENOSYS as u64,
    FI_EOPBADSTATE as u64,
    FI_EBUSY as u64,
    FI_ENOSPC as u64,
    FI_EFAULT as u64,
    FI_EOTHER as u64,
    FI_ENOMEM as u64,
    FI_RECV | FI_TAGGED,
    FI_REMOTE_CQ_DATA,
    FI_MULTI_RECV,
    FI_LOCAL_COMM,
    FI_REMOTE_COMM,
    FI_COLLECTIVE,
    FI_MR_COLLECTIVE,
];
