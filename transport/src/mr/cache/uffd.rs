//! userfaultfd, eventfd and poll system calls for the cache's memory monitor: the only
//! `unsafe` of the registration cache (plus, for tests, the `mmap`/`munmap` helper
//! [`testmem::Mapping`]).
//!
//! The constants and structures are those of `<linux/userfaultfd.h>` (x86-64 and every other
//! 64-bit Linux: the ioctl encoding and the 32-byte packed `uffd_msg` are the same).
//!
//! Kernel facts this relies on (checked on 6.18, the machine's kernel):
//! - `UFFD_FEATURE_EVENT_UNMAP` / `EVENT_REMOVE` / `EVENT_REMAP` make `munmap`,
//!   `madvise(MADV_DONTNEED/REMOVE)` and `mremap` of a registered range post an event and
//!   *wait until a reader has read it*, so invalidation finishes before those calls return.
//! - Registering a range with `UFFDIO_REGISTER_MODE_WP` alone write-protects nothing (only
//!   `UFFDIO_WRITEPROTECT` does, which we never call), so WP registration delivers those
//!   events without ever stopping a thread on a page fault. `MODE_MISSING` (libfabric's
//!   choice) also stops threads touching unpopulated pages until the reader fills them; it is
//!   the fallback when WP registration is refused for a range.
//! - `vm.unprivileged_userfaultfd = 0` allows the syscall to root/CAP_SYS_PTRACE, or to anyone
//!   with `UFFD_USER_MODE_ONLY`. That flag makes kernel-mode faults in MISSING ranges fail
//!   with EFAULT, so with it the MISSING fallback is not used.

use std::io;
use std::mem::size_of;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use crate::mr::pages::page_size;

const UFFD_API: u64 = 0xaa;
const UFFD_USER_MODE_ONLY: libc::c_int = 1;

const UFFD_FEATURE_PAGEFAULT_FLAG_WP: u64 = 1 << 0;
const UFFD_FEATURE_EVENT_REMAP: u64 = 1 << 2;
const UFFD_FEATURE_EVENT_REMOVE: u64 = 1 << 3;
const UFFD_FEATURE_EVENT_UNMAP: u64 = 1 << 6;
const UFFD_FEATURE_WP_HUGETLBFS_SHMEM: u64 = 1 << 12;

const UFFD_EVENT_PAGEFAULT: u8 = 0x12;
const UFFD_EVENT_REMAP: u8 = 0x14;
const UFFD_EVENT_REMOVE: u8 = 0x15;
const UFFD_EVENT_UNMAP: u8 = 0x16;

const UFFD_PAGEFAULT_FLAG_WP: u64 = 1 << 1;

const UFFDIO_REGISTER_MODE_MISSING: u64 = 1 << 0;
const UFFDIO_REGISTER_MODE_WP: u64 = 1 << 1;

const fn ioc(dir: u64, nr: u64, size: usize) -> u64 {
    (dir << 30) | ((size as u64) << 16) | (0xaa << 8) | nr
}
const IOC_READ: u64 = 2;
const IOC_RW: u64 = 3;

#[repr(C)]
struct UffdioApi {
    api: u64,
    features: u64,
    ioctls: u64,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct UffdioRange {
    start: u64,
    len: u64,
}

#[repr(C)]
struct UffdioRegister {
    range: UffdioRange,
    mode: u64,
    ioctls: u64,
}

#[repr(C)]
struct UffdioZeropage {
    range: UffdioRange,
    mode: u64,
    zeropage: i64,
}

#[repr(C)]
struct UffdioWriteprotect {
    range: UffdioRange,
    mode: u64,
}

/// `struct uffd_msg`: 1-byte event, 7 reserved bytes, a 24-byte union of u64 fields.
#[repr(C)]
#[derive(Clone, Copy)]
struct UffdMsg {
    event: u8,
    reserved: [u8; 7],
    arg: [u64; 3],
}

const _: () = assert!(size_of::<UffdMsg>() == 32);
const _: () = assert!(size_of::<UffdioApi>() == 24);
const _: () = assert!(size_of::<UffdioRegister>() == 32);

const UFFDIO_API: u64 = ioc(IOC_RW, 0x3f, size_of::<UffdioApi>());
const UFFDIO_REGISTER: u64 = ioc(IOC_RW, 0x00, size_of::<UffdioRegister>());
const UFFDIO_WAKE: u64 = ioc(IOC_READ, 0x02, size_of::<UffdioRange>());
const UFFDIO_ZEROPAGE: u64 = ioc(IOC_RW, 0x04, size_of::<UffdioZeropage>());
const UFFDIO_WRITEPROTECT: u64 = ioc(IOC_RW, 0x06, size_of::<UffdioWriteprotect>());

const _: () = assert!(UFFDIO_API == 0xc018_aa3f);
const _: () = assert!(UFFDIO_REGISTER == 0xc020_aa00);

/// How a range was registered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RegisterMode {
    /// `UFFDIO_REGISTER_MODE_WP`: events only, no fault handling.
    WriteProtect,
    /// `UFFDIO_REGISTER_MODE_MISSING`: events, and faults on unpopulated pages that the
    /// monitor thread fills with zero pages.
    Missing,
}

/// One event read from the userfaultfd.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Event {
    /// Pages of `[start, end)` were unmapped.
    Unmap { start: usize, end: usize },
    /// Pages of `[start, end)` were dropped (`madvise`); the range stays mapped.
    Remove { start: usize, end: usize },
    /// `[from, from + len)` moved elsewhere (`mremap`).
    Remap { from: usize, len: usize },
    /// A thread faulted on `addr` (MISSING registration, or a write-protected page).
    Pagefault { addr: usize, write_protect: bool },
    /// An event this monitor does not ask for.
    Other,
}

fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// An initialised userfaultfd (non-blocking, close-on-exec).
#[derive(Debug)]
pub(crate) struct Uffd {
    fd: OwnedFd,
    /// The kernel reports `PAGEFAULT_FLAG_WP`: WP registration is available.
    wp: bool,
    /// MISSING registration may be used as fallback (not with `UFFD_USER_MODE_ONLY`).
    missing_ok: bool,
    page: usize,
}

fn open_fd(flags: libc::c_int) -> io::Result<OwnedFd> {
    // SAFETY: the userfaultfd syscall takes one integer flag argument and returns a new fd
    // or -1; no memory is passed.
    let r = unsafe { libc::syscall(libc::SYS_userfaultfd, flags) };
    let fd = cvt(libc::c_int::try_from(r).unwrap_or(-1))?;
    // SAFETY: fd was just returned by the kernel and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn api(fd: &OwnedFd, features: u64) -> io::Result<u64> {
    let mut a = UffdioApi { api: UFFD_API, features, ioctls: 0 };
    // SAFETY: UFFDIO_API reads and writes a `struct uffdio_api`, which `a` is (repr(C),
    // same layout, checked size); `a` lives across the call.
    cvt(unsafe { libc::ioctl(fd.as_raw_fd(), UFFDIO_API as _, &mut a as *mut UffdioApi) })?;
    if a.api != UFFD_API {
        return Err(io::Error::new(io::ErrorKind::Unsupported, "userfaultfd API mismatch"));
    }
    Ok(a.features)
}

impl Uffd {
    /// Opens and initialises a userfaultfd asking for unmap, remove and remap events.
    ///
    /// # Errors
    /// The syscall is not permitted or not available, or the kernel lacks the events.
    pub(crate) fn open() -> io::Result<Uffd> {
        let base = libc::O_CLOEXEC | libc::O_NONBLOCK;
        let (probe, user_only) = match open_fd(base) {
            Ok(fd) => (fd, false),
            Err(e) if e.raw_os_error() == Some(libc::EPERM) => (open_fd(base | UFFD_USER_MODE_ONLY)?, true),
            Err(e) => return Err(e),
        };
        // UFFDIO_API may be called once per fd: ask what exists on a probe fd first.
        let supported = api(&probe, 0)?;
        drop(probe);
        let needed = UFFD_FEATURE_EVENT_UNMAP | UFFD_FEATURE_EVENT_REMOVE;
        if supported & needed != needed {
            return Err(io::Error::new(io::ErrorKind::Unsupported, "kernel lacks userfaultfd unmap/remove events"));
        }
        let optional = UFFD_FEATURE_EVENT_REMAP | UFFD_FEATURE_PAGEFAULT_FLAG_WP | UFFD_FEATURE_WP_HUGETLBFS_SHMEM;
        let want = needed | (supported & optional);
        let fd = open_fd(base | if user_only { UFFD_USER_MODE_ONLY } else { 0 })?;
        let got = api(&fd, want)?;
        let wp = got & UFFD_FEATURE_PAGEFAULT_FLAG_WP != 0;
        if !wp && user_only {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "no write-protect registration, and MISSING is unusable in user-mode-only fds",
            ));
        }
        Ok(Uffd { fd, wp, missing_ok: !user_only, page: page_size() })
    }

    /// Whether write-protect registration is available.
    pub(crate) fn has_write_protect(&self) -> bool {
        self.wp
    }

    pub(crate) fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    fn ioctl_register(&self, range: UffdioRange, mode: u64) -> io::Result<()> {
        let mut r = UffdioRegister { range, mode, ioctls: 0 };
        // SAFETY: UFFDIO_REGISTER reads and writes a `struct uffdio_register`, which `r` is;
        // the kernel validates the range itself (it only changes VMA flags).
        cvt(unsafe { libc::ioctl(self.raw_fd(), UFFDIO_REGISTER as _, &mut r as *mut UffdioRegister) })?;
        Ok(())
    }

    /// Registers the pages covering `[addr, addr + len)`: write-protect mode first, MISSING
    /// mode if that is refused (and allowed). Registering a range this fd already covers is
    /// fine; a range another userfaultfd covers gives `EBUSY`.
    ///
    /// # Errors
    /// The kernel refused both modes (range not fully mapped, unsupported mapping type such as
    /// hugetlbfs with small-page alignment or a private file mapping, already registered
    /// elsewhere).
    pub(crate) fn register(&self, addr: usize, len: usize) -> io::Result<RegisterMode> {
        let start = addr & !(self.page - 1);
        let end = addr
            .checked_add(len)
            .and_then(|e| e.checked_add(self.page - 1))
            .map(|e| e & !(self.page - 1))
            .ok_or_else(|| io::Error::from_raw_os_error(libc::EINVAL))?;
        let range = UffdioRange { start: start as u64, len: (end - start) as u64 };
        let mut err = io::Error::from_raw_os_error(libc::EINVAL);
        if self.wp {
            match self.ioctl_register(range, UFFDIO_REGISTER_MODE_WP) {
                Ok(()) => return Ok(RegisterMode::WriteProtect),
                Err(e) => err = e,
            }
        }
        if self.missing_ok && err.raw_os_error() != Some(libc::EBUSY) {
            self.ioctl_register(range, UFFDIO_REGISTER_MODE_MISSING)?;
            return Ok(RegisterMode::Missing);
        }
        Err(err)
    }

    /// Reads as many pending events as fit in `out` without blocking; 0 when none is pending.
    ///
    /// # Errors
    /// A read error other than `EAGAIN`/`EINTR`.
    pub(crate) fn read_events(&self, out: &mut [Event]) -> io::Result<usize> {
        const N: usize = 16;
        let mut msgs = [UffdMsg { event: 0, reserved: [0; 7], arg: [0; 3] }; N];
        let want = out.len().min(N) * size_of::<UffdMsg>();
        // SAFETY: `msgs` is a writable buffer of at least `want` bytes living across the call;
        // the kernel writes whole `uffd_msg` records into it.
        let r = unsafe { libc::read(self.raw_fd(), msgs.as_mut_ptr().cast(), want) };
        if r < 0 {
            let e = io::Error::last_os_error();
            return match e.raw_os_error() {
                Some(libc::EAGAIN) | Some(libc::EINTR) => Ok(0),
                _ => Err(e),
            };
        }
        let n = usize::try_from(r).unwrap_or(0) / size_of::<UffdMsg>();
        for (o, m) in out.iter_mut().zip(&msgs[..n]) {
            let a = m.arg;
            *o = match m.event {
                UFFD_EVENT_UNMAP => Event::Unmap { start: a[0] as usize, end: a[1] as usize },
                UFFD_EVENT_REMOVE => Event::Remove { start: a[0] as usize, end: a[1] as usize },
                UFFD_EVENT_REMAP => Event::Remap { from: a[0] as usize, len: a[2] as usize },
                UFFD_EVENT_PAGEFAULT => Event::Pagefault { addr: a[1] as usize, write_protect: a[0] & UFFD_PAGEFAULT_FLAG_WP != 0 },
                _ => Event::Other,
            };
        }
        Ok(n)
    }

    /// Resolves a fault so the faulting thread continues: a zero page for a missing page
    /// (or a wake-up if another thread populated it first), write permission back for a
    /// write-protect fault. Without allocation; never fails loudly (nothing to report to).
    pub(crate) fn resolve_fault(&self, addr: usize, write_protect: bool) {
        let range = UffdioRange { start: (addr & !(self.page - 1)) as u64, len: self.page as u64 };
        if write_protect {
            let mut w = UffdioWriteprotect { range, mode: 0 };
            // SAFETY: UFFDIO_WRITEPROTECT reads a `struct uffdio_writeprotect` (`w`); mode 0
            // removes protection and wakes the faulting thread.
            unsafe { libc::ioctl(self.raw_fd(), UFFDIO_WRITEPROTECT as _, &mut w as *mut UffdioWriteprotect) };
            return;
        }
        let mut z = UffdioZeropage { range, mode: 0, zeropage: 0 };
        // SAFETY: UFFDIO_ZEROPAGE reads and writes a `struct uffdio_zeropage` (`z`); it maps
        // the shared zero page at a page the kernel reported missing in a registered range.
        let r = unsafe { libc::ioctl(self.raw_fd(), UFFDIO_ZEROPAGE as _, &mut z as *mut UffdioZeropage) };
        if r < 0 {
            let mut wake = range;
            // SAFETY: UFFDIO_WAKE reads a `struct uffdio_range` (`wake`); it only wakes
            // threads waiting on faults in that range (EEXIST: already populated).
            unsafe { libc::ioctl(self.raw_fd(), UFFDIO_WAKE as _, &mut wake as *mut UffdioRange) };
        }
    }
}

/// An eventfd that tells the monitor thread to stop.
#[derive(Debug)]
pub(crate) struct Waker {
    fd: OwnedFd,
}

impl Waker {
    pub(crate) fn new() -> io::Result<Waker> {
        // SAFETY: eventfd takes two integers and returns a new fd or -1.
        let fd = cvt(unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) })?;
        // SAFETY: fd was just returned by the kernel and is owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(Waker { fd })
    }

    pub(crate) fn wake(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live u64 to the eventfd.
        unsafe { libc::write(self.fd.as_raw_fd(), (&one as *const u64).cast(), 8) };
    }
}

/// What [`wait`] saw.
pub(crate) struct Ready {
    /// The waker fired: stop.
    pub(crate) stop: bool,
    /// Events are pending on the userfaultfd.
    pub(crate) events: bool,
}

/// Blocks until the userfaultfd has events or the waker fired.
///
/// # Errors
/// `poll` failed (`EINTR` included; the caller retries).
pub(crate) fn wait(uffd: &Uffd, waker: &Waker) -> io::Result<Ready> {
    let mut fds = [
        libc::pollfd { fd: uffd.raw_fd(), events: libc::POLLIN, revents: 0 },
        libc::pollfd { fd: waker.fd.as_raw_fd(), events: libc::POLLIN, revents: 0 },
    ];
    // SAFETY: `fds` is an array of 2 valid pollfd structures living across the call.
    cvt(unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) })?;
    let bad = libc::POLLERR | libc::POLLHUP | libc::POLLNVAL;
    Ok(Ready { stop: fds[1].revents != 0 || fds[0].revents & bad != 0, events: fds[0].revents & libc::POLLIN != 0 })
}

/// Anonymous memory for tests: `mmap`/`munmap` wrapped in a safe type.
#[cfg(test)]
pub(crate) mod testmem {
    use std::io;

    /// An anonymous private read-write mapping; what is still mapped is unmapped on drop.
    #[derive(Debug)]
    pub(crate) struct Mapping {
        addr: usize,
        len: usize,
        mapped: bool,
        /// Per page: unmapped by `unmap_part` (the address may belong to someone else now).
        holes: Vec<bool>,
    }

    impl Mapping {
        /// Maps `len` bytes wherever the kernel chooses.
        pub(crate) fn new(len: usize) -> io::Result<Mapping> {
            Self::map(0, len, 0)
        }

        /// Maps `len` bytes exactly at `addr` (`MAP_FIXED_NOREPLACE`: fails if anything is
        /// mapped there).
        pub(crate) fn at(addr: usize, len: usize) -> io::Result<Mapping> {
            let m = Self::map(addr, len, libc::MAP_FIXED_NOREPLACE)?;
            if m.addr != addr {
                return Err(io::Error::new(io::ErrorKind::AddrInUse, "mapped elsewhere"));
            }
            Ok(m)
        }

        fn map(hint: usize, len: usize, extra: libc::c_int) -> io::Result<Mapping> {
            // SAFETY: an anonymous mapping request; with MAP_FIXED_NOREPLACE the kernel never
            // replaces an existing mapping, so no live memory of this process is affected.
            let p = unsafe {
                libc::mmap(
                    hint as *mut libc::c_void,
                    len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | extra,
                    -1,
                    0,
                )
            };
            if p == libc::MAP_FAILED {
                return Err(io::Error::last_os_error());
            }
            let pages = len.div_ceil(super::page_size());
            Ok(Mapping { addr: p as usize, len, mapped: true, holes: vec![false; pages] })
        }

        pub(crate) fn addr(&self) -> usize {
            self.addr
        }

        /// Writes `byte` to every byte (populates the pages).
        pub(crate) fn fill(&mut self, byte: u8) {
            assert!(self.mapped);
            // SAFETY: [addr, addr + len) is our own live read-write mapping.
            unsafe { std::ptr::write_bytes(self.addr as *mut u8, byte, self.len) };
        }

        /// Reads byte `i`.
        pub(crate) fn get(&self, i: usize) -> u8 {
            assert!(self.mapped && i < self.len);
            // SAFETY: addr + i is inside our own live mapping.
            unsafe { *((self.addr + i) as *const u8) }
        }

        /// Drops the pages of `[off, off + len)` (`madvise(MADV_DONTNEED)`); the range stays
        /// mapped and reads back as zeros.
        pub(crate) fn discard(&mut self, off: usize, len: usize) {
            assert!(self.mapped && off.checked_add(len).is_some_and(|e| e <= self.len));
            // SAFETY: the range is inside our own live private anonymous mapping; dropping
            // its pages only makes them read back as zeros.
            let r = unsafe { libc::madvise((self.addr + off) as *mut libc::c_void, len, libc::MADV_DONTNEED) };
            assert_eq!(r, 0, "madvise: {}", io::Error::last_os_error());
        }

        /// Grows the mapping by 64 pages with `mremap(MREMAP_MAYMOVE)`: the kernel moves it when
        /// it cannot grow in place. Returns the old address.
        pub(crate) fn remap_grow(&mut self) -> usize {
            assert!(self.mapped && self.holes.iter().all(|h| !h));
            let page = super::page_size();
            let new_len = self.len + 64 * page;
            // SAFETY: the old range is a mapping this value owns entirely; MREMAP_MAYMOVE
            // lets the kernel place the grown mapping anywhere free, never over other
            // mappings. The value then owns the new range instead.
            let p = unsafe { libc::mremap(self.addr as *mut libc::c_void, self.len, new_len, libc::MREMAP_MAYMOVE) };
            assert_ne!(p, libc::MAP_FAILED, "mremap: {}", io::Error::last_os_error());
            let old = self.addr;
            self.addr = p as usize;
            self.len = new_len;
            self.holes = vec![false; new_len / page];
            old
        }

        /// Maps fresh zeroed memory over the whole mapping, at the same address, in one call
        /// (`mmap` with `MAP_FIXED`: the kernel unmaps the old pages, posting the unmap event,
        /// and maps new ones; no other thread can take the range in between).
        pub(crate) fn replace(&mut self) {
            assert!(self.mapped && self.holes.iter().all(|h| !h));
            // SAFETY: the range is exactly a mapping this value created and still owns
            // entirely (no page unmapped); MAP_FIXED replaces only it, with an anonymous
            // private mapping this value then owns. Tests keep only its address as a number.
            let p = unsafe {
                libc::mmap(
                    self.addr as *mut libc::c_void,
                    self.len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                    -1,
                    0,
                )
            };
            assert_ne!(p, libc::MAP_FAILED, "mmap: {}", io::Error::last_os_error());
            assert_eq!(p as usize, self.addr);
        }

        /// Unmaps `[off, off + len)` of the mapping (page-aligned); the rest stays mapped until
        /// drop, which unmaps only what is still ours.
        pub(crate) fn unmap_part(&mut self, off: usize, len: usize) {
            let page = super::page_size();
            assert!(self.mapped && off.checked_add(len).is_some_and(|e| e <= self.len));
            assert!(off % page == 0 && len % page == 0);
            for h in &mut self.holes[off / page..(off + len) / page] {
                assert!(!*h, "page unmapped twice");
                *h = true;
            }
            // SAFETY: the range is inside a mapping this value created and owns; tests keep
            // only its address as a number and never touch unmapped parts.
            let r = unsafe { libc::munmap((self.addr + off) as *mut libc::c_void, len) };
            assert_eq!(r, 0, "munmap: {}", io::Error::last_os_error());
        }

        /// Unmaps now (the pages not already unmapped by `unmap_part`).
        pub(crate) fn unmap(&mut self) {
            if !self.mapped {
                return;
            }
            self.mapped = false;
            let page = super::page_size();
            let mut i = 0;
            while i < self.holes.len() {
                if self.holes[i] {
                    i += 1;
                    continue;
                }
                let run = self.holes[i..].iter().take_while(|h| !**h).count();
                let len = (run * page).min(self.len - i * page);
                // SAFETY: the run is part of a mapping this value created and still owns
                // (never unmapped before); tests keep only its address as a number.
                let r = unsafe { libc::munmap((self.addr + i * page) as *mut libc::c_void, len) };
                assert_eq!(r, 0, "munmap: {}", io::Error::last_os_error());
                i += run;
            }
        }
    }

    impl Drop for Mapping {
        fn drop(&mut self) {
            self.unmap();
        }
    }
}
