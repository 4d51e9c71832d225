//! A rank's trace file: a header, a ring of [`Event`] records and, once sealed, a trailer with
//! the names of the rank's threads.
//!
//! The ring is the file itself, mapped into the rank's memory: recording an event is a copy of
//! 48 bytes into the mapping and a store of the count into the header, so what was recorded
//! survives the rank however it ends (the pages belong to the file, not to the process), and
//! `tmpirun` merges a killed rank's events too. The ring keeps the last `capacity` events;
//! older ones are overwritten and counted as dropped ([`RankTrace::dropped`]).
//!
//! Layout (little-endian):
//!
//! | offset | bytes | field |
//! |---|---|---|
//! | 0 | 8 | magic `TMPITRC1` |
//! | 8 | 4 | version (1) |
//! | 12 | 4 | flags (bit 0: sealed) |
//! | 16 | 4 | rank |
//! | 20 | 4 | size (ranks in the job) |
//! | 24 | 4 | pid |
//! | 28 | 4 | threads named in the trailer |
//! | 32 | 8 | capacity (events) |
//! | 40 | 8 | events written so far (the ring holds the last `min(written, capacity)`) |
//! | 48 | 24 | clock sample at init (`t0`, reference, `t3`; zero: none) |
//! | 72 | 24 | clock sample at finalize |
//! | 96 | 8 | trailer bytes |
//! | 104 | 8 | local clock at init |
//! | 112 | 8 | local clock at finalize (0: not finalized) |
//! | 128 | 48 | boot id (UTF-8, zero-padded) |
//! | 176 | 64 | host name |
//! | 240 | 32 | job id |
//! | 512 | 48 x 64 | the call each thread (index below 64) is in, as an event (`t0` 0: none) |
//! | 4096 | 48 x capacity | the ring |
//! | after | trailer | per named thread: `u16` index, `u16` length, name (UTF-8) |

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use memmap2::{MmapMut, MmapOptions};

use crate::clock::Sample;
use crate::event::{Event, Kind, EVENT_BYTES, NONE};
use crate::{Error, Result};

/// File magic.
pub const MAGIC: &[u8; 8] = b"TMPITRC1";
/// Format version.
pub const VERSION: u32 = 1;
/// Bytes before the ring.
pub const HEADER_BYTES: usize = 4096;
/// Fewest events a ring holds.
pub const MIN_CAPACITY: u64 = 1024;
/// Most events a ring holds (48 GiB of file).
pub const MAX_CAPACITY: u64 = 1 << 30;
/// Longest thread name kept.
const MAX_THREAD_NAME: usize = 256;

const FLAG_SEALED: u32 = 1;
const OFF_FLAGS: usize = 12;
const OFF_WRITTEN: usize = 40;
const OFF_START: usize = 48;
const OFF_END: usize = 72;
const OFF_TRAILER: usize = 96;
const OFF_FINI: usize = 112;
const OFF_OPEN: usize = 512;
/// Threads whose open call the header keeps (the first 64 a rank names).
pub const OPEN_SLOTS: usize = 64;
const _: () = assert!(OFF_OPEN + OPEN_SLOTS * EVENT_BYTES <= HEADER_BYTES);

/// Who wrote a trace file.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RankInfo {
    /// World rank.
    pub rank: u32,
    /// Ranks in the job.
    pub size: u32,
    /// Process id.
    pub pid: u32,
    /// Boot id of the rank's host ([`crate::clock::boot_id`]).
    pub boot_id: String,
    /// Host name.
    pub host: String,
    /// Job id (empty for a singleton).
    pub jobid: String,
    /// Local clock at init.
    pub init_ns: u64,
}

/// Copies `s` into `dst`, cut on a character boundary to fit with room for a zero byte.
fn put_str(dst: &mut [u8], s: &str) {
    let mut n = s.len().min(dst.len().saturating_sub(1));
    while !s.is_char_boundary(n) {
        n -= 1;
    }
    dst[..n].copy_from_slice(&s.as_bytes()[..n]);
}

fn get_str(src: &[u8]) -> String {
    let end = src.iter().position(|&b| b == 0).unwrap_or(src.len());
    String::from_utf8_lossy(&src[..end]).into_owned()
}

fn put_sample(dst: &mut [u8], s: Option<Sample>) {
    let s = s.unwrap_or_default();
    dst[0..8].copy_from_slice(&s.t0.to_le_bytes());
    dst[8..16].copy_from_slice(&s.reference.to_le_bytes());
    dst[16..24].copy_from_slice(&s.t3.to_le_bytes());
}

fn u32_at(b: &[u8], i: usize) -> u32 {
    u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]])
}

fn u64_at(b: &[u8], i: usize) -> u64 {
    u64::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3], b[i + 4], b[i + 5], b[i + 6], b[i + 7]])
}

fn get_sample(b: &[u8], i: usize) -> Option<Sample> {
    let s = Sample { t0: u64_at(b, i), reference: u64_at(b, i + 8), t3: u64_at(b, i + 16) };
    s.is_valid().then_some(s)
}

/// A rank's trace file, open for recording.
#[derive(Debug)]
pub struct RankFile {
    file: File,
    path: PathBuf,
    map: MmapMut,
    capacity: u64,
    /// Slot the next event goes to.
    next: usize,
    /// Events written so far.
    written: u64,
}

impl RankFile {
    /// Creates the file at `path` (which must not exist) for a ring of `capacity` events.
    ///
    /// # Errors
    /// [`Error::Io`] if the file cannot be created, sized or mapped; [`Error::Format`] for a
    /// capacity outside [`MIN_CAPACITY`]..=[`MAX_CAPACITY`].
    pub fn create(path: &Path, info: &RankInfo, capacity: u64) -> Result<Self> {
        if !(MIN_CAPACITY..=MAX_CAPACITY).contains(&capacity) {
            return Err(Error::Format(format!("a ring of {capacity} events (expected {MIN_CAPACITY}..={MAX_CAPACITY})")));
        }
        let io = |what: &str, e| Error::Io(format!("{what} {}", path.display()), e);
        let file = OpenOptions::new().read(true).write(true).create_new(true).open(path).map_err(|e| io("create", e))?;
        let len = HEADER_BYTES as u64 + capacity * EVENT_BYTES as u64;
        file.set_len(len).map_err(|e| io("size", e))?;
        // SAFETY: the file was just created here (`create_new`), so no other mapping or writer
        // of it exists; tmpi never truncates it while this mapping lives (sealing only grows
        // it, past the mapped length), and readers only read it. Another process truncating a
        // rank's own trace file under it is outside what this type promises to survive.
        let mut map = unsafe { MmapOptions::new().len(len as usize).map_mut(&file) }.map_err(|e| io("map", e))?;
        let h = &mut map[..HEADER_BYTES];
        h[0..8].copy_from_slice(MAGIC);
        h[8..12].copy_from_slice(&VERSION.to_le_bytes());
        h[16..20].copy_from_slice(&info.rank.to_le_bytes());
        h[20..24].copy_from_slice(&info.size.to_le_bytes());
        h[24..28].copy_from_slice(&info.pid.to_le_bytes());
        h[32..40].copy_from_slice(&capacity.to_le_bytes());
        h[104..112].copy_from_slice(&info.init_ns.to_le_bytes());
        put_str(&mut h[128..176], &info.boot_id);
        put_str(&mut h[176..240], &info.host);
        put_str(&mut h[240..272], &info.jobid);
        Ok(RankFile { file, path: path.to_path_buf(), map, capacity, next: 0, written: 0 })
    }

    /// Where the file is.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Records one event (overwriting the oldest when the ring is full).
    #[inline]
    pub fn push(&mut self, e: &Event) {
        let off = HEADER_BYTES + self.next * EVENT_BYTES;
        self.map[off..off + EVENT_BYTES].copy_from_slice(&e.encode());
        self.next += 1;
        if self.next as u64 == self.capacity {
            self.next = 0;
        }
        self.written += 1;
        self.map[OFF_WRITTEN..OFF_WRITTEN + 8].copy_from_slice(&self.written.to_le_bytes());
    }

    /// Notes that thread `e.thread` entered the call `e` describes (its `dur` unknown yet),
    /// so that a rank killed inside it leaves it in the file; [`RankFile::close_call`] when
    /// it returns.
    #[inline]
    pub fn open_call(&mut self, e: &Event) {
        if let Some(off) = open_slot(e.thread) {
            self.map[off..off + EVENT_BYTES].copy_from_slice(&e.encode());
        }
    }

    /// Thread `thread`'s call returned (see [`RankFile::open_call`]).
    #[inline]
    pub fn close_call(&mut self, thread: u16) {
        if let Some(off) = open_slot(thread) {
            self.map[off..off + 8].fill(0);
        }
    }

    /// Events recorded so far.
    pub fn written(&self) -> u64 {
        self.written
    }

    /// Stores the clock sample taken at init.
    pub fn set_start_sample(&mut self, s: Option<Sample>) {
        put_sample(&mut self.map[OFF_START..OFF_START + 24], s);
    }

    /// Stores the clock sample taken at finalize.
    pub fn set_end_sample(&mut self, s: Option<Sample>) {
        put_sample(&mut self.map[OFF_END..OFF_END + 24], s);
    }

    /// Ends recording: writes the thread names after the ring, the finalize time and the
    /// sealed flag.
    ///
    /// # Errors
    /// [`Error::Io`] if the trailer cannot be written (the ring stays readable).
    pub fn seal(mut self, threads: &[(u16, String)], fini_ns: u64) -> Result<()> {
        let mut trailer = Vec::new();
        for (i, name) in threads {
            let mut n = name.len().min(MAX_THREAD_NAME);
            while !name.is_char_boundary(n) {
                n -= 1;
            }
            trailer.extend_from_slice(&i.to_le_bytes());
            trailer.extend_from_slice(&(n as u16).to_le_bytes());
            trailer.extend_from_slice(&name.as_bytes()[..n]);
        }
        let at = HEADER_BYTES as u64 + self.capacity * EVENT_BYTES as u64;
        self.file.write_all_at(&trailer, at).map_err(|e| Error::Io(format!("write {}", self.path.display()), e))?;
        let h = &mut self.map[..HEADER_BYTES];
        h[28..32].copy_from_slice(&(threads.len() as u32).to_le_bytes());
        h[OFF_TRAILER..OFF_TRAILER + 8].copy_from_slice(&(trailer.len() as u64).to_le_bytes());
        h[OFF_FINI..OFF_FINI + 8].copy_from_slice(&fini_ns.to_le_bytes());
        let flags = u32_at(h, OFF_FLAGS) | FLAG_SEALED;
        h[OFF_FLAGS..OFF_FLAGS + 4].copy_from_slice(&flags.to_le_bytes());
        self.map.flush().map_err(|e| Error::Io(format!("flush {}", self.path.display()), e))?;
        self.file.flush().map_err(|e| Error::Io(format!("flush {}", self.path.display()), e))
    }
}

/// A rank's trace, read back from its file.
#[derive(Debug, Clone, PartialEq)]
pub struct RankTrace {
    /// Who wrote it.
    pub info: RankInfo,
    /// Whether the rank sealed it (finalized); a rank that died leaves it unsealed.
    pub sealed: bool,
    /// Clock sample at init.
    pub start: Option<Sample>,
    /// Clock sample at finalize.
    pub end: Option<Sample>,
    /// Local clock at finalize (0: never finalized).
    pub fini_ns: u64,
    /// The ring's capacity.
    pub capacity: u64,
    /// Events recorded that the ring no longer holds (overwritten, or cut when the rank died).
    pub dropped: u64,
    /// The events kept, oldest first.
    pub events: Vec<Event>,
    /// Names of the rank's threads, by index.
    pub threads: Vec<(u16, String)>,
    /// The calls its threads were in when the file was last written (marked
    /// [`aux::OPEN`](crate::event::aux::OPEN), `dur` 0): those of a rank that was killed
    /// or died in a call.
    pub open: Vec<Event>,
}

impl RankTrace {
    /// Reads the trace file at `path`.
    ///
    /// # Errors
    /// [`Error::Io`] if it cannot be read; [`Error::Format`] if it is no trace file or is cut
    /// short.
    pub fn read(path: &Path) -> Result<Self> {
        let bytes = std::fs::read(path).map_err(|e| Error::Io(format!("read {}", path.display()), e))?;
        RankTrace::parse(&bytes).map_err(|e| match e {
            Error::Format(m) => Error::Format(format!("{}: {m}", path.display())),
            other => other,
        })
    }

    /// Parses a trace file's bytes.
    ///
    /// # Errors
    /// [`Error::Format`] for a bad magic, version or length.
    pub fn parse(b: &[u8]) -> Result<Self> {
        let bad = |m: &str| Error::Format(m.to_string());
        if b.len() < HEADER_BYTES || &b[0..8] != MAGIC {
            return Err(bad("not a tmpi trace file (no TMPITRC1 header)"));
        }
        if u32_at(b, 8) != VERSION {
            return Err(Error::Format(format!("trace format version {} (this build reads {VERSION})", u32_at(b, 8))));
        }
        let capacity = u64_at(b, 32);
        let written = u64_at(b, OFF_WRITTEN);
        let ring_end = (capacity as u128) * EVENT_BYTES as u128 + HEADER_BYTES as u128;
        if !(MIN_CAPACITY..=MAX_CAPACITY).contains(&capacity) || (b.len() as u128) < ring_end {
            return Err(bad("the file is shorter than its ring"));
        }
        let sealed = u32_at(b, OFF_FLAGS) & FLAG_SEALED != 0;
        let info = RankInfo {
            rank: u32_at(b, 16),
            size: u32_at(b, 20),
            pid: u32_at(b, 24),
            boot_id: get_str(&b[128..176]),
            host: get_str(&b[176..240]),
            jobid: get_str(&b[240..272]),
            init_ns: u64_at(b, 104),
        };
        let (events, dropped) = ring_events(b, capacity, written, sealed);
        // A cut trailer loses only the threads' names.
        let threads =
            if sealed { trailer(b, ring_end as usize, u32_at(b, 28), u64_at(b, OFF_TRAILER)).unwrap_or_default() } else { Vec::new() };
        Ok(RankTrace {
            info,
            sealed,
            start: get_sample(b, OFF_START),
            end: get_sample(b, OFF_END),
            fini_ns: u64_at(b, OFF_FINI),
            capacity,
            dropped,
            events,
            threads,
            open: open_calls(b),
        })
    }
}

/// Where thread `thread`'s open call is kept in the header, if it has a slot.
fn open_slot(thread: u16) -> Option<usize> {
    let t = usize::from(thread);
    (t < OPEN_SLOTS).then(|| OFF_OPEN + t * EVENT_BYTES)
}

/// The calls the header holds as open (see [`RankFile::open_call`]).
fn open_calls(b: &[u8]) -> Vec<Event> {
    (0..OPEN_SLOTS as u16)
        .filter_map(|t| {
            let off = open_slot(t)?;
            let mut rec = [0u8; EVENT_BYTES];
            rec.copy_from_slice(&b[off..off + EVENT_BYTES]);
            let e = Event::decode(&rec);
            (e.t0 != 0 && e.thread == t && e.kind().is_some()).then_some(Event { dur: 0, aux: e.aux | crate::event::aux::OPEN, ..e })
        })
        .collect()
}

/// The ring's events oldest first, and how many were lost. Of a full ring that was not sealed
/// the oldest slot is skipped: the rank may have died while overwriting it.
fn ring_events(b: &[u8], capacity: u64, written: u64, sealed: bool) -> (Vec<Event>, u64) {
    let slot = |i: u64| {
        let off = HEADER_BYTES + (i as usize) * EVENT_BYTES;
        let mut rec = [0u8; EVENT_BYTES];
        rec.copy_from_slice(&b[off..off + EVENT_BYTES]);
        Event::decode(&rec)
    };
    if written <= capacity {
        return ((0..written).map(slot).collect(), 0);
    }
    let skip = u64::from(!sealed);
    let first = written % capacity;
    let kept = capacity - skip;
    let events = (skip..capacity).map(|k| slot((first + k) % capacity)).collect();
    (events, written - kept)
}

fn trailer(b: &[u8], at: usize, count: u32, len: u64) -> Result<Vec<(u16, String)>> {
    let bad = || Error::Format("the thread names after the ring are cut short".into());
    let end = at.checked_add(usize::try_from(len).map_err(|_| bad())?).ok_or_else(bad)?;
    let t = b.get(at..end).ok_or_else(bad)?;
    let mut out = Vec::new();
    let mut i = 0;
    for _ in 0..count {
        let h = t.get(i..i + 4).ok_or_else(bad)?;
        let (idx, n) = (u16::from_le_bytes([h[0], h[1]]), u16::from_le_bytes([h[2], h[3]]) as usize);
        let name = t.get(i + 4..i + 4 + n).ok_or_else(bad)?;
        out.push((idx, String::from_utf8_lossy(name).into_owned()));
        i += 4 + n;
    }
    Ok(out)
}

/// A note event saying `n` events were dropped before `t0`.
pub fn dropped_note(n: u64, t0: u64) -> Event {
    Event { t0, dur: 0, bytes: n, id: 0, peer: NONE, tag: NONE, kind: Kind::Dropped.code(), thread: 0, aux: 0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info() -> RankInfo {
        RankInfo { rank: 2, size: 4, pid: 99, boot_id: "b00t".into(), host: "h".into(), jobid: "0123".into(), init_ns: 5 }
    }

    fn ev(i: u64) -> Event {
        Event { t0: 100 + i, dur: 1, kind: Kind::Send.code(), peer: 1, tag: 0, ..Default::default() }
    }

    fn tmp(name: &str) -> PathBuf {
        let p = std::env::temp_dir().join(format!("tmpi-trace-test-{}-{name}", std::process::id()));
        let _ = std::fs::remove_file(&p);
        p
    }

    /// The call a thread is in stays in the file until it returns; threads beyond the slots
    /// are not kept (and do not disturb the others).
    #[test]
    fn open_calls_stay_until_they_return() {
        let p = tmp("open");
        let mut f = RankFile::create(&p, &info(), MIN_CAPACITY).unwrap();
        let call = |thread: u16| Event { t0: 500, kind: Kind::Recv.code(), peer: 3, thread, ..Default::default() };
        for t in [0, 5, OPEN_SLOTS as u16] {
            f.open_call(&call(t));
        }
        f.close_call(5);
        f.push(&ev(1));
        let t = RankTrace::read(&p).unwrap();
        assert_eq!(t.open, vec![Event { aux: crate::event::aux::OPEN, ..call(0) }]);
        f.close_call(0);
        let t = RankTrace::read(&p).unwrap();
        std::fs::remove_file(&p).unwrap();
        assert!(t.open.is_empty(), "{:?}", t.open);
    }

    #[test]
    fn a_sealed_file_reads_back_whole() {
        let p = tmp("sealed");
        let mut f = RankFile::create(&p, &info(), MIN_CAPACITY).unwrap();
        for i in 0..10 {
            f.push(&ev(i));
        }
        let s = Sample { t0: 10, reference: 50, t3: 20 };
        f.set_start_sample(Some(s));
        f.seal(&[(0, "main".into()), (1, "worker é".into())], 777).unwrap();
        let t = RankTrace::read(&p).unwrap();
        std::fs::remove_file(&p).unwrap();
        assert_eq!(t.info, info());
        assert!(t.sealed);
        assert_eq!((t.start, t.end, t.fini_ns, t.dropped), (Some(s), None, 777, 0));
        assert_eq!(t.events, (0..10).map(ev).collect::<Vec<_>>());
        assert_eq!(t.threads, [(0, "main".to_string()), (1, "worker é".to_string())]);
    }

    /// A full ring keeps the newest events; unsealed (the rank died), its oldest slot is not
    /// trusted either.
    #[test]
    fn a_full_ring_keeps_the_newest_and_counts_the_rest() {
        let p = tmp("full");
        let mut f = RankFile::create(&p, &info(), MIN_CAPACITY).unwrap();
        let n = MIN_CAPACITY + 10;
        for i in 0..n {
            f.push(&ev(i));
        }
        assert_eq!(f.written(), n);
        let unsealed = RankTrace::read(&p).unwrap();
        assert!(!unsealed.sealed);
        assert_eq!(unsealed.dropped, 11);
        assert_eq!(unsealed.events.first(), Some(&ev(11)));
        assert_eq!(unsealed.events.last(), Some(&ev(n - 1)));
        f.seal(&[], 1).unwrap();
        let sealed = RankTrace::read(&p).unwrap();
        std::fs::remove_file(&p).unwrap();
        assert_eq!(sealed.dropped, 10);
        assert_eq!(sealed.events.len() as u64, MIN_CAPACITY);
        assert_eq!(sealed.events[0], ev(10));
    }

    #[test]
    fn bad_files_are_errors_not_panics() {
        assert!(RankTrace::parse(b"short").is_err());
        let mut b = vec![0u8; HEADER_BYTES];
        b[..8].copy_from_slice(MAGIC);
        b[8..12].copy_from_slice(&VERSION.to_le_bytes());
        b[32..40].copy_from_slice(&MIN_CAPACITY.to_le_bytes());
        let e = RankTrace::parse(&b).unwrap_err();
        assert!(e.to_string().contains("shorter than its ring"), "{e}");
        b[8] = 9;
        assert!(RankTrace::parse(&b).unwrap_err().to_string().contains("version"));
        let p = tmp("cap");
        assert!(RankFile::create(&p, &info(), 5).is_err());
        assert!(!p.exists());
    }
}
