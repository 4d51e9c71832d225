//! libfabric's domains behind tmpi's registration cache ([`crate::mr::MrCache`]): the same
//! cache, statistics and userfaultfd monitor as for the fi_mr model.
//!
//! A revoked region (its memory was unmapped) answers [`CacheRegion::usable`] false at once,
//! under the cache lock, but the provider keeps serving its key until `fi_close`, which runs
//! when its last handle drops (entries nobody uses are closed by the next cache call; one in
//! use, when its user releases it): the close frees memory, which the cache lock forbids.
//! The fi_mr model refuses the stale key at once instead. Users of a real region check
//! [`crate::mr::CachedMr::is_valid`] before they hand its key to a peer.

use std::sync::atomic::{AtomicBool, Ordering};

use super::core::{mr_errno, OfiDomain, OfiMr};
use crate::mr::cache::{CacheDomain, CacheRegion};
use crate::mr::{Access, MrErrno, MrMode, RegFlags, Segment, KEY_NOTAVAIL};

/// A cached registration of an [`OfiDomain`].
#[derive(Debug)]
pub struct OfiCacheMr {
    mr: OfiMr,
    revoked: AtomicBool,
}

impl OfiCacheMr {
    /// The region (its key, descriptor, remote address).
    pub fn mr(&self) -> &OfiMr {
        &self.mr
    }
}

impl CacheRegion for OfiCacheMr {
    fn revoke(&self) {
        self.revoked.store(true, Ordering::Release);
    }
    fn usable(&self) -> bool {
        !self.revoked.load(Ordering::Acquire)
    }
    fn start(&self) -> usize {
        self.mr.segments()[0].addr
    }
    fn bytes(&self) -> usize {
        self.mr.len()
    }
    fn granted(&self) -> Access {
        self.mr.access()
    }
    fn virt_addr(&self) -> bool {
        self.mr.virt_addr()
    }
}

/// Attempts at a random requested key before giving up (keys in use are `-FI_ENOKEY`).
const KEY_ATTEMPTS: usize = 16;

fn random_key(bytes: usize) -> Result<u64, MrErrno> {
    let mut b = [0u8; 8];
    getrandom::getrandom(&mut b).map_err(|_| MrErrno::Other)?;
    let k = u64::from_le_bytes(b);
    Ok(if bytes >= 8 { k } else { k & ((1u64 << (8 * bytes)) - 1) })
}

impl CacheDomain for OfiDomain {
    type Region = OfiCacheMr;

    /// Registers with [`OfiDomain::reg`] (so `REMOTE_WRITE` and `RECV` are refused with
    /// `-FI_EINVAL`: a cache hands regions out to safe code). Without `FI_MR_PROV_KEY` the
    /// requested key is random, as the model's cache keys are, so a peer cannot guess it.
    fn register_range(&self, addr: usize, len: usize, access: Access) -> Result<OfiCacheMr, MrErrno> {
        let iov = [Segment { addr, len }];
        let prov_key = self.mr_mode().contains(MrMode::PROV_KEY);
        for _ in 0..KEY_ATTEMPTS {
            let key = if prov_key { 0 } else { random_key(self.offer().mr_key_size)? };
            if key == KEY_NOTAVAIL {
                continue;
            }
            match self.reg(&iov, access, key, RegFlags::empty()) {
                Ok(mr) => return Ok(OfiCacheMr { mr, revoked: AtomicBool::new(false) }),
                Err(crate::Error::InvalidArgument(_)) => return Err(MrErrno::Inval),
                Err(e) if mr_errno(&e) == MrErrno::NoKey && !prov_key => continue,
                Err(e) => return Err(mr_errno(&e)),
            }
        }
        Err(MrErrno::NoSpace)
    }

    fn needs_endpoint(&self) -> bool {
        self.mr_mode().contains(MrMode::ENDPOINT)
    }
}
