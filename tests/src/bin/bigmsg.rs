//! Messages of every size class from 0 bytes to 64 MiB between neighbours on a ring
//! (rank r sends to r+1 and receives from r-1; one rank talks to itself).
//!
//! For each size: an expected receive (posted before a barrier, sent after it), an unexpected
//! one (sent before the barrier, posted after it), a synchronous send, and a truncated receive
//! (half the buffer: `Truncated`, the message consumed, the next one intact; and alone,
//! nothing written past the buffer). Then a 2 MiB
//! message goes out 12 times from the same buffer and the rank's own `mr_cache_hits` must grow
//! by at least 11 (the sender's registration cache, unless `TMPI_MR_CACHE_MAX_COUNT=0`).
//! First, one way only (rank 0 to rank 1), and last, around the ring, a window of 8 messages
//! (32 and 16 KiB) whose requests are all in before any receive is posted.
//! Every payload is checked.
//!
//! `bigmsg [--deny-cma] [--deny-open] [--shared send|recv|both] [--offset K] [MAX_BYTES]` stops at
//! MAX_BYTES (default 64 MiB); `--offset K` puts the send buffers K bytes and the receive
//! buffers 2K + 1 bytes into their allocations (odd addresses, for K odd); `--deny-cma` makes the kernel refuse cross-memory attach in this process
//! (seccomp), as containers often do; `--shared` allocates the send buffer, the receive buffer
//! or both with `World::alloc_shared` (the shared heap) instead of `Vec`; `--deny-open` makes
//! `open`/`openat` fail in this thread once the buffers are allocated, so that it cannot map
//! any peer's shared heap (opening `/proc/<pid>/fd/N` is refused, as where permissions forbid
//! it) and must fall back.

use std::error::Error as StdError;

use tmpi::{Comm, Error};
use tmpi_tests::Verdict;

const KIB: usize = 1024;
const MIB: usize = 1024 * KIB;
const SIZES: [usize; 20] = [
    0,
    1,
    63,
    64,
    4095,
    4 * KIB,
    16 * KIB,
    64 * KIB - 1,
    64 * KIB,
    64 * KIB + 1,
    256 * KIB - 1,
    256 * KIB,
    256 * KIB + 1,
    MIB - 1,
    MIB + 7,
    4 * MIB,
    8 * MIB + 3,
    16 * MIB,
    32 * MIB,
    64 * MIB,
];
const REPEATS: usize = 12;
/// Messages of the window phase.
const WINDOW: usize = 8;

/// A payload nobody else sends: derived from the sender, the size and the variant.
fn fill(buf: &mut [u8], sender: usize, size: usize, variant: u64) {
    let mut x = (sender as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ (size as u64) << 8 ^ variant;
    for c in buf.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let b = x.to_le_bytes();
        c.copy_from_slice(&b[..c.len()]);
    }
}

/// Makes `open` and `openat` fail with `EACCES` in this thread from now on (a seccomp filter).
fn deny_open_calls() -> std::io::Result<()> {
    const LD_NR: u16 = 0x20; // BPF_LD | BPF_W | BPF_ABS
    const JEQ: u16 = 0x15; // BPF_JMP | BPF_JEQ | BPF_K
    const RET: u16 = 0x06; // BPF_RET | BPF_K
    let f = |code, jt, jf, k| libc::sock_filter { code, jt, jf, k };
    let mut prog = [
        f(LD_NR, 0, 0, 0),
        f(JEQ, 2, 0, libc::SYS_openat as u32),
        f(JEQ, 1, 0, libc::SYS_open as u32),
        f(RET, 0, 0, 0x7fff_0000),
        f(RET, 0, 0, 0x0005_0000 | libc::EACCES as u32),
    ];
    let fprog = libc::sock_fprog { len: prog.len() as u16, filter: prog.as_mut_ptr() };
    // SAFETY: prctl with integer arguments only.
    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fprog` points at `prog`, a valid filter program that lives across the call.
    if unsafe { libc::prctl(libc::PR_SET_SECCOMP, libc::SECCOMP_MODE_FILTER, &fprog as *const libc::sock_fprog) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Bytes from a `Vec` or from the shared heap, `len` of them in use.
struct Buf {
    mem: Box<dyn std::ops::DerefMut<Target = [u8]>>,
    /// Where the bytes in use start in `mem`.
    off: usize,
    len: usize,
    /// In the shared heap (not a private fallback).
    shared: bool,
}

impl Buf {
    fn new(world: &tmpi::World, shared: bool, cap: usize, off: usize) -> tmpi::Result<Buf> {
        if shared {
            let b = world.alloc_shared::<u8>(cap + off)?;
            return Ok(Buf { shared: b.is_shared(), mem: Box::new(b), off, len: 0 });
        }
        Ok(Buf { mem: Box::new(vec![0u8; cap + off]), off, len: 0, shared: false })
    }
}

impl std::ops::Deref for Buf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.mem[self.off..self.off + self.len]
    }
}

impl std::ops::DerefMut for Buf {
    fn deref_mut(&mut self) -> &mut [u8] {
        &mut self.mem[self.off..self.off + self.len]
    }
}

struct Ctx<'a> {
    w: &'a Comm,
    next: usize,
    prev: usize,
    out: Buf,
    want: Vec<u8>,
    got: Buf,
}

impl Ctx<'_> {
    fn prepare(&mut self, size: usize, variant: u64) {
        self.out.len = size;
        fill(&mut self.out, self.w.rank(), size, variant);
        self.want.resize(size, 0);
        fill(&mut self.want, self.prev, size, variant);
        self.got.len = size;
        self.got.fill(0xa5);
    }

    fn check(&self, v: &mut Verdict, what: &str, size: usize, st: tmpi::Result<tmpi::Status>) {
        match st {
            Ok(st) => v.check(st.source() == self.prev && st.len() == size && *self.got == self.want[..], || {
                let bad = self.got.iter().zip(&self.want).position(|(a, b)| a != b);
                format!("{what} {size} B: status {st:?}, first wrong byte {bad:?}")
            }),
            Err(e) => v.check(false, || format!("{what} {size} B: {e}")),
        }
    }
}

/// Checks the receives of a window of messages of `each` bytes from `from` (none on a rank
/// that only sent).
fn check_window(v: &mut Verdict, c: &Ctx<'_>, each: usize, from: usize, sts: tmpi::Result<Vec<tmpi::Result<tmpi::Status>>>) {
    match sts {
        Ok(sts) => {
            for (m, st) in sts.into_iter().enumerate() {
                let part = m * each..(m + 1) * each;
                v.check(matches!(&st, Ok(st) if st.source() == from && st.len() == each) && c.got[part.clone()] == c.want[part], || {
                    format!("window message {m} of {each} B: {st:?} or payload wrong")
                });
            }
        }
        Err(e) => v.check(false, || format!("window of {WINDOW} x {each} B: {e}")),
    }
}

/// The command line (see the module's documentation).
struct Opts {
    deny_cma: bool,
    deny_open: bool,
    /// Send and receive buffers in the shared heap.
    shared: (bool, bool),
    off: usize,
    max: usize,
}

/// Removes flag `name` from `args`; whether it was there.
fn take_flag(args: &mut Vec<String>, name: &str) -> bool {
    let found = args.iter().any(|a| a == name);
    args.retain(|a| a != name);
    found
}

/// Removes option `name` and its value from `args`, parsed by `parse` (`None`: absent).
fn take_opt<T>(args: &mut Vec<String>, name: &str, parse: impl Fn(Option<&str>) -> Result<T, String>) -> Result<Option<T>, String> {
    let Some(i) = args.iter().position(|a| a == name) else { return Ok(None) };
    let v = parse(args.get(i + 1).map(String::as_str))?;
    args.drain(i..(i + 2).min(args.len()));
    Ok(Some(v))
}

fn parse_args() -> Result<Opts, String> {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let deny_cma = take_flag(&mut args, "--deny-cma");
    let deny_open = take_flag(&mut args, "--deny-open");
    let shared = take_opt(&mut args, "--shared", |v| match v {
        Some("send") => Ok((true, false)),
        Some("recv") => Ok((false, true)),
        Some("both") => Ok((true, true)),
        other => Err(format!("bigmsg: --shared takes send, recv or both, not {other:?}")),
    })?;
    let off = take_opt(&mut args, "--offset", |v| match v.map(str::parse::<usize>) {
        Some(Ok(k)) if k < 4096 => Ok(k),
        other => Err(format!("bigmsg: --offset takes a number of bytes below 4096, not {other:?}")),
    })?;
    let max = match args.first() {
        Some(a) => a.parse().map_err(|_| format!("bigmsg: MAX_BYTES must be a number, not {a:?}"))?,
        None => 64 * MIB,
    };
    Ok(Opts { deny_cma, deny_open, shared: shared.unwrap_or((false, false)), off: off.unwrap_or(0), max })
}

fn main() -> Result<(), Box<dyn StdError>> {
    let o = parse_args()?;
    if o.deny_cma {
        tmpi_tests::deny_cma().map_err(|e| format!("bigmsg: cannot install the seccomp filter: {e}"))?;
    }
    let world = tmpi::init()?;
    let w: &Comm = &world;
    let (rank, n) = (w.rank(), w.size());
    let mut v = Verdict::new("bigmsg", rank);
    let sizes: Vec<usize> = SIZES.iter().copied().filter(|&s| s <= o.max).collect();
    let cap = sizes.iter().copied().max().unwrap_or(0).max(2 * MIB);
    let (out, got) = (Buf::new(&world, o.shared.0, cap, o.off)?, Buf::new(&world, o.shared.1, cap, 2 * o.off + usize::from(o.off > 0))?);
    if o.shared != (false, false) {
        println!("bigmsg: rank {rank} buffers in the shared heap: send {}, recv {}", out.shared, got.shared);
    }
    if o.deny_open {
        deny_open_calls().map_err(|e| format!("bigmsg: cannot install the seccomp filter: {e}"))?;
    }
    let mut c = Ctx { w, next: (rank + 1) % n, prev: (rank + n - 1) % n, out, want: Vec::new(), got };
    c.one_way(&mut v, (32 * KIB).min(o.max))?;
    for &size in &sizes {
        c.expected(&mut v, size);
        c.unexpected(&mut v, size);
        c.synchronous(&mut v, size);
        if size >= 2 {
            c.truncated(&mut v, size);
            c.truncated_alone(&mut v, size);
        }
    }
    c.repeats(&mut v, (2 * MIB).min(o.max.max(1)))?;
    c.ring_window(&mut v, (16 * KIB).min(o.max));
    v.finish(w, &format!("{} sizes up to {} B at {n} ranks", sizes.len(), o.max))?;
    world.finalize()?;
    Ok(())
}

impl Ctx<'_> {
    /// First, one way only (rank 0 to rank 1, as in `osu_bw`): a window of `each`-byte
    /// requests, all in before the receives. By single copy the sender writes a share of
    /// each read.
    fn one_way(&mut self, v: &mut Verdict, each: usize) -> tmpi::Result<()> {
        let (w, rank, n) = (self.w, self.w.rank(), self.w.size());
        if n < 2 || each == 0 {
            return Ok(());
        }
        if rank >= 2 {
            return w.barrier();
        }
        self.prepare(WINDOW * each, 8);
        // (Rank 1's `prev` is rank 0, so `want` holds what rank 0 sends.)
        let peer = 1 - rank;
        let (out, got) = (&self.out, &mut self.got);
        let sts = tmpi::scope(|s| -> tmpi::Result<Vec<tmpi::Result<tmpi::Status>>> {
            let mut qs = Vec::with_capacity(WINDOW);
            if rank == 0 {
                for (m, d) in out.chunks(each).enumerate() {
                    qs.push(w.isend(s, d, peer, 200 + m as tmpi::Tag)?);
                }
            }
            w.barrier()?;
            let mut rs = Vec::with_capacity(WINDOW);
            if rank == 1 {
                for (m, b) in got.chunks_mut(each).enumerate() {
                    rs.push(w.irecv(s, b, peer, 200 + m as tmpi::Tag)?);
                }
            }
            let sts = rs.into_iter().map(|r| r.wait()).collect();
            for q in qs {
                q.wait()?;
            }
            Ok(sts)
        });
        check_window(v, self, each, peer, sts);
        Ok(())
    }

    /// Expected: the receive is posted before anyone sends.
    fn expected(&mut self, v: &mut Verdict, size: usize) {
        self.prepare(size, 1);
        let (w, prev, next) = (self.w, self.prev, self.next);
        let (out, got) = (&self.out, &mut self.got);
        let st = tmpi::scope(|s| -> tmpi::Result<tmpi::Status> {
            let r = w.irecv(s, got, prev, 1)?;
            w.barrier()?;
            let q = w.isend(s, out, next, 1)?;
            let st = r.wait();
            q.wait()?;
            st
        });
        self.check(v, "expected", size, st);
    }

    /// Unexpected: the message (or its rendezvous request) arrives before the receive.
    fn unexpected(&mut self, v: &mut Verdict, size: usize) {
        self.prepare(size, 2);
        let (w, prev, next) = (self.w, self.prev, self.next);
        let (out, got) = (&self.out, &mut self.got);
        let st = tmpi::scope(|s| -> tmpi::Result<tmpi::Status> {
            let q = w.isend(s, out, next, 2)?;
            w.barrier()?;
            let st = w.recv(got, prev, 2);
            q.wait()?;
            st
        });
        self.check(v, "unexpected", size, st);
    }

    /// A synchronous send.
    fn synchronous(&mut self, v: &mut Verdict, size: usize) {
        self.prepare(size, 3);
        let (w, prev, next) = (self.w, self.prev, self.next);
        let (out, got) = (&self.out, &mut self.got);
        let st = tmpi::scope(|s| -> tmpi::Result<tmpi::Status> {
            let r = w.irecv(s, got, prev, 3)?;
            w.ssend(out, next, 3)?;
            r.wait()
        });
        self.check(v, "ssend", size, st);
    }

    /// Truncation: half the buffer; the message is consumed and the next one is intact.
    fn truncated(&mut self, v: &mut Verdict, size: usize) {
        self.prepare(size, 4);
        let half = size / 2;
        let (w, prev, next) = (self.w, self.prev, self.next);
        let (out, got) = (&self.out, &mut self.got);
        let r = tmpi::scope(|s| -> tmpi::Result<(tmpi::Result<tmpi::Status>, tmpi::Result<tmpi::Status>)> {
            let (a, b) = got.split_at_mut(half);
            let r1 = w.irecv(s, a, prev, 4)?;
            let r2 = w.irecv(s, &mut b[..size - half], prev, 5)?;
            let q1 = w.isend(s, out, next, 4)?;
            let q2 = w.isend(s, &out[..size - half], next, 5)?;
            let t = (r1.wait(), r2.wait());
            q1.wait()?;
            q2.wait()?;
            Ok(t)
        });
        let (r1, r2) = match r {
            Ok(t) => t,
            Err(e) => return v.check(false, || format!("truncation at {size} B: {e}")),
        };
        v.check_err(
            r1,
            |e| matches!(e, Error::Truncated { len, capacity, .. } if *len == size && *capacity == half),
            &format!("Truncated {size} into {half}"),
        );
        v.check(self.got[..half] == self.want[..half], || format!("truncated {size} B: the part that fits differs"));
        v.check(matches!(&r2, Ok(st) if st.len() == size - half) && self.got[half..] == self.want[..size - half], || {
            format!("message after a truncated {size} B one: {r2:?} or payload wrong")
        });
    }

    /// Nothing is written past a truncated receive's buffer (the rest of `got` keeps its
    /// filler).
    fn truncated_alone(&mut self, v: &mut Verdict, size: usize) {
        self.prepare(size, 7);
        let half = size / 2;
        let (w, prev, next) = (self.w, self.prev, self.next);
        let (out, got) = (&self.out, &mut self.got);
        let r = tmpi::scope(|s| -> tmpi::Result<tmpi::Result<tmpi::Status>> {
            let r1 = w.irecv(s, &mut got[..half], prev, 7)?;
            let q1 = w.isend(s, out, next, 7)?;
            let t = r1.wait();
            q1.wait()?;
            Ok(t)
        });
        let kept = self.got[half..].iter().all(|&b| b == 0xa5);
        v.check(matches!(&r, Ok(Err(Error::Truncated { .. }))) && kept && self.got[..half] == self.want[..half], || {
            format!("truncated {size} B alone: {r:?}, bytes past the buffer kept: {kept}")
        });
    }

    /// The same buffer of `size` bytes sent repeatedly: the registration cache hits after the
    /// first time.
    fn repeats(&mut self, v: &mut Verdict, size: usize) -> tmpi::Result<()> {
        self.prepare(size, 6);
        let (w, prev, next) = (self.w, self.prev, self.next);
        // The typed counters: a counter the runtime stopped reporting is a compile error here,
        // not a zero that skips the check below.
        let before = w.stats()?;
        for i in 0..REPEATS {
            let (out, got) = (&self.out, &mut self.got);
            let st = tmpi::scope(|s| -> tmpi::Result<tmpi::Status> {
                let r = w.irecv(s, got, prev, 6)?;
                w.send(out, next, 6)?;
                r.wait()
            });
            self.check(v, &format!("repeat {i}"), size, st);
        }
        let d = w.stats()?.diff(&before);
        let (hits, rndvs) = (d.mr_cache_hits, d.rndv);
        let cache_on = std::env::var("TMPI_MR_CACHE_MAX_COUNT").map_or(true, |v| v.trim() != "0");
        if rndvs > 0 && cache_on {
            v.check(hits + 1 >= rndvs, || format!("{rndvs} rendezvous sends of one buffer but only {hits} MR cache hits"));
        }
        if w.rank() == 0 {
            println!("bigmsg: repeated {size} B sends: rndv {rndvs}, mr_cache_hits {hits}");
        }
        Ok(())
    }

    /// A window of rendezvous requests of `each` bytes around the ring, all in before any
    /// receive is posted: the receiver finds them together (and, by single copy, copies them
    /// with one system call: `cma_batched`).
    fn ring_window(&mut self, v: &mut Verdict, each: usize) {
        if each == 0 {
            return;
        }
        self.prepare(WINDOW * each, 7);
        let (w, prev, next) = (self.w, self.prev, self.next);
        let (out, got) = (&self.out, &mut self.got);
        let sts = tmpi::scope(|s| -> tmpi::Result<Vec<tmpi::Result<tmpi::Status>>> {
            let mut qs = Vec::with_capacity(WINDOW);
            for (m, d) in out.chunks(each).enumerate() {
                qs.push(w.isend(s, d, next, 100 + m as tmpi::Tag)?);
            }
            w.barrier()?;
            let mut rs = Vec::with_capacity(WINDOW);
            for (m, b) in got.chunks_mut(each).enumerate() {
                rs.push(w.irecv(s, b, prev, 100 + m as tmpi::Tag)?);
            }
            let sts = rs.into_iter().map(|r| r.wait()).collect();
            for q in qs {
                q.wait()?;
            }
            Ok(sts)
        });
        check_window(v, self, each, prev, sts);
    }
}
