//! The record of a rank's nondeterministic decisions, for deterministic replay
//! (`tmpirun --record DIR`, `--replay DIR`).
//!
//! What a rank records, in the order its calls make them ([`Decision`]):
//!
//! - which message a blocking wildcard receive or probe matched: its source and the message's
//!   sequence number from that source ([`Decision::Matched`]);
//! - which message a non-blocking `ANY_SOURCE` receive matched, by the receive's number among
//!   this rank's wildcard posts ([`Decision::Posted`]: the replay needs it when the receive is
//!   posted, though it is known only when it completes);
//! - what a `test`, `iprobe`, `improbe`, `test_all` answered ([`Decision::Answer`]; a run of
//!   alike "nothing yet" answers is one record);
//! - which requests `wait_any`, `test_any`, `wait_some`, `test_some` reported
//!   ([`Decision::Picked`]).
//!
//! Only decisions, never payloads. The file is a 64-byte header and 24-byte records (a pick
//! of k requests takes k + 1), mapped into the rank's memory as it is written, so a rank that
//! is killed leaves every decision it made; the header says whether the rank finished
//! ([`Record::finished`]).
//!
//! A [`Replayer`] hands the decisions back in order and says when the program asks for one
//! the record does not have ([`Diverged`]).

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};

use memmap2::{MmapMut, MmapOptions};

use crate::event::{Kind, NONE};
use crate::{Error, Result};

/// File magic.
pub const MAGIC: &[u8; 8] = b"TMPIREC1";
/// Format version.
pub const VERSION: u32 = 1;
/// Header bytes.
pub const HEADER_BYTES: usize = 64;
/// Bytes of one record.
pub const RECORD_BYTES: usize = 24;
/// Records the file has room for at first (it doubles when full).
const FIRST_ROOM: usize = 4096;

const OP_MATCHED: u8 = 1;
const OP_POSTED: u8 = 2;
const OP_ANSWER: u8 = 3;
const OP_PICKED: u8 = 4;
const OP_INDEX: u8 = 5;
const FLAG_FINISHED: u32 = 1;

/// The file of rank `rank` in record directory `dir`.
pub fn rank_path(dir: &Path, rank: usize) -> PathBuf {
    dir.join(format!("rank{rank}.tmpirec"))
}

/// One nondeterministic decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// A blocking wildcard receive or probe (`call`) matched a message from `source` (its rank
    /// in the communicator), the `seq`-th from that rank (0: not known).
    Matched {
        /// The call.
        call: Kind,
        /// The message's source.
        source: u32,
        /// Its sequence number from that source.
        seq: u64,
    },
    /// The `post`-th wildcard non-blocking receive of the rank (from 0) matched a message
    /// from `source`.
    Posted {
        /// Which wildcard post.
        post: u64,
        /// The message's source.
        source: u32,
        /// Its sequence number from that source.
        seq: u64,
    },
    /// A `test`, `iprobe`, `improbe` or `test_all` (`call`) found something (`found`, for a
    /// probe: a message from `source`) or not.
    Answer {
        /// The call.
        call: Kind,
        /// Whether it found something.
        found: bool,
        /// A probe's source ([`NONE`] otherwise).
        source: u32,
    },
    /// `wait_any`, `test_any`, `wait_some` or `test_some` (`call`) reported these requests
    /// (indices into the list as it was passed; none: a test that found nothing).
    Picked {
        /// The call.
        call: Kind,
        /// The indices reported.
        indices: Vec<u32>,
    },
}

impl Decision {
    /// The call that made it (`irecv` for [`Decision::Posted`]).
    pub fn call(&self) -> Kind {
        match self {
            Decision::Matched { call, .. } | Decision::Answer { call, .. } | Decision::Picked { call, .. } => *call,
            Decision::Posted { .. } => Kind::Irecv,
        }
    }

    /// In words, for errors.
    pub fn describe(&self) -> String {
        match self {
            Decision::Matched { call, source, seq } => format!("{} matched message {seq} from rank {source}", call.name()),
            Decision::Posted { post, source, .. } => format!("wildcard receive #{post} matched rank {source}"),
            Decision::Answer { call, found, .. } => format!("{} found {}", call.name(), if *found { "something" } else { "nothing" }),
            Decision::Picked { call, indices } => format!("{} reported requests {indices:?}", call.name()),
        }
    }
}

fn encode(op: u8, call: Kind, flags: u16, a: u32, b: u64, c: u64) -> [u8; RECORD_BYTES] {
    let mut r = [0u8; RECORD_BYTES];
    r[0] = op;
    r[1] = call.code() as u8;
    r[2..4].copy_from_slice(&flags.to_le_bytes());
    r[4..8].copy_from_slice(&a.to_le_bytes());
    r[8..16].copy_from_slice(&b.to_le_bytes());
    r[16..24].copy_from_slice(&c.to_le_bytes());
    r
}

/// A rank's record, open for writing.
#[derive(Debug)]
pub struct Recorder {
    file: File,
    path: PathBuf,
    map: MmapMut,
    /// Records written.
    len: usize,
    /// Records the mapping has room for.
    room: usize,
    /// Index of the last record if it is a run of empty answers that may grow.
    run: Option<usize>,
    /// Decisions recorded (a run counts each answer).
    decisions: u64,
}

impl Recorder {
    /// Creates the record of `rank` of a job of `size` at `path` (which must not exist).
    ///
    /// # Errors
    /// [`Error::Io`] if it cannot be created or mapped.
    pub fn create(path: &Path, rank: u32, size: u32) -> Result<Self> {
        let io = |what: &str, e| Error::Io(format!("{what} {}", path.display()), e);
        let file = OpenOptions::new().read(true).write(true).create_new(true).open(path).map_err(|e| io("create", e))?;
        let mut r = Recorder {
            map: Self::map(&file, path, FIRST_ROOM)?,
            file,
            path: path.to_path_buf(),
            len: 0,
            room: FIRST_ROOM,
            run: None,
            decisions: 0,
        };
        let h = &mut r.map[..HEADER_BYTES];
        h[0..8].copy_from_slice(MAGIC);
        h[8..12].copy_from_slice(&VERSION.to_le_bytes());
        h[16..20].copy_from_slice(&rank.to_le_bytes());
        h[20..24].copy_from_slice(&size.to_le_bytes());
        Ok(r)
    }

    /// Sizes the file for `room` records and maps it.
    fn map(file: &File, path: &Path, room: usize) -> Result<MmapMut> {
        let len = HEADER_BYTES + room * RECORD_BYTES;
        file.set_len(len as u64).map_err(|e| Error::Io(format!("size {}", path.display()), e))?;
        // SAFETY: the file was created by this recorder (`create_new`) and only it writes it;
        // it only ever grows, and each mapping is dropped before the next is made, so no
        // mapping outlives the length it was made for. Readers only read it.
        unsafe { MmapOptions::new().len(len).map_mut(file) }.map_err(|e| Error::Io(format!("map {}", path.display()), e))
    }

    /// Where the record is.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Decisions recorded so far.
    pub fn decisions(&self) -> u64 {
        self.decisions
    }

    fn put(&mut self, rec: [u8; RECORD_BYTES]) -> Result<()> {
        if self.len == self.room {
            self.room *= 2;
            self.map = Self::map(&self.file, &self.path, self.room)?;
        }
        let off = HEADER_BYTES + self.len * RECORD_BYTES;
        self.map[off..off + RECORD_BYTES].copy_from_slice(&rec);
        self.len += 1;
        self.map[24..32].copy_from_slice(&(self.len as u64).to_le_bytes());
        Ok(())
    }

    /// Records `d`; an empty answer right after an alike one lengthens its run.
    ///
    /// # Errors
    /// [`Error::Io`] if the file cannot grow.
    pub fn push(&mut self, d: &Decision) -> Result<()> {
        self.decisions += 1;
        if let Decision::Answer { call, found: false, .. } = d {
            if let Some(i) = self.run {
                let off = HEADER_BYTES + i * RECORD_BYTES;
                if self.map[off + 1] == call.code() as u8 {
                    let n = u64::from_le_bytes(self.map[off + 8..off + 16].try_into().unwrap_or([0; 8])) + 1;
                    self.map[off + 8..off + 16].copy_from_slice(&n.to_le_bytes());
                    return Ok(());
                }
            }
            self.put(encode(OP_ANSWER, *call, 0, NONE, 1, 0))?;
            self.run = Some(self.len - 1);
            return Ok(());
        }
        self.run = None;
        match d {
            Decision::Matched { call, source, seq } => self.put(encode(OP_MATCHED, *call, 0, *source, *seq, 0)),
            Decision::Posted { post, source, seq } => self.put(encode(OP_POSTED, Kind::Irecv, 0, *source, *post, *seq)),
            Decision::Answer { call, found, source } => self.put(encode(OP_ANSWER, *call, u16::from(*found), *source, 1, 0)),
            Decision::Picked { call, indices } => {
                self.put(encode(OP_PICKED, *call, 0, indices.len() as u32, 0, 0))?;
                indices.iter().try_for_each(|&i| self.put(encode(OP_INDEX, *call, 0, i, 0, 0)))
            }
        }
    }

    /// Marks the record finished (the rank reached finalize) and trims the file.
    ///
    /// # Errors
    /// [`Error::Io`] if the file cannot be trimmed or flushed.
    pub fn finish(mut self) -> Result<()> {
        self.map[12..16].copy_from_slice(&FLAG_FINISHED.to_le_bytes());
        self.map.flush().map_err(|e| Error::Io(format!("flush {}", self.path.display()), e))?;
        let len = (HEADER_BYTES + self.len * RECORD_BYTES) as u64;
        drop(self.map);
        self.file.set_len(len).map_err(|e| Error::Io(format!("trim {}", self.path.display()), e))
    }
}

/// A rank's record, read back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// The rank.
    pub rank: u32,
    /// Ranks in the recorded job.
    pub size: u32,
    /// Whether the rank reached finalize (else it was stopped, and the record ends there).
    pub finished: bool,
    /// The decisions in order, each with how many times in a row the rank made it (a run of
    /// empty answers is one record, and stays one entry here however long it is).
    pub runs: Vec<(Decision, u64)>,
    /// Bytes of the file's records.
    pub bytes: u64,
}

impl Record {
    /// How many decisions the record holds (runs counted out).
    pub fn decisions(&self) -> u64 {
        self.runs.iter().map(|r| r.1).sum()
    }

    /// Reads the record at `path`.
    ///
    /// # Errors
    /// [`Error::Io`] if it cannot be read, [`Error::Format`] if it is no record.
    pub fn read(path: &Path) -> Result<Self> {
        let b = std::fs::read(path).map_err(|e| Error::Io(format!("read {}", path.display()), e))?;
        Record::parse(&b).map_err(|e| match e {
            Error::Format(m) => Error::Format(format!("{}: {m}", path.display())),
            other => other,
        })
    }

    /// Parses a record file's bytes.
    ///
    /// # Errors
    /// [`Error::Format`] for a bad header or record.
    pub fn parse(b: &[u8]) -> Result<Self> {
        if b.len() < HEADER_BYTES || &b[0..8] != MAGIC {
            return Err(Error::Format("not a tmpi record (no TMPIREC1 header)".into()));
        }
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        if u32_at(8) != VERSION {
            return Err(Error::Format(format!("record format version {} (this build reads {VERSION})", u32_at(8))));
        }
        let n = u64::from_le_bytes(b[24..32].try_into().unwrap_or([0; 8])) as usize;
        let recs = b[HEADER_BYTES..].chunks_exact(RECORD_BYTES).take(n).collect::<Vec<_>>();
        if recs.len() < n {
            return Err(Error::Format(format!("the header counts {n} records but the file holds {}", recs.len())));
        }
        Ok(Record {
            rank: u32_at(16),
            size: u32_at(20),
            finished: u32_at(12) & FLAG_FINISHED != 0,
            runs: decode_all(&recs)?,
            bytes: (n * RECORD_BYTES) as u64,
        })
    }
}

fn decode_all(recs: &[&[u8]]) -> Result<Vec<(Decision, u64)>> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < recs.len() {
        let r = recs[i];
        let (op, call, flags) = (r[0], Kind::from_code(u16::from(r[1])), u16::from_le_bytes([r[2], r[3]]));
        let a = u32::from_le_bytes([r[4], r[5], r[6], r[7]]);
        let bv = u64::from_le_bytes(r[8..16].try_into().unwrap_or([0; 8]));
        let cv = u64::from_le_bytes(r[16..24].try_into().unwrap_or([0; 8]));
        let bad = || Error::Format(format!("record {i} is malformed"));
        let call = call.ok_or_else(bad)?;
        match op {
            OP_MATCHED => out.push((Decision::Matched { call, source: a, seq: bv }, 1)),
            OP_POSTED => out.push((Decision::Posted { post: bv, source: a, seq: cv }, 1)),
            OP_ANSWER => {
                if bv == 0 || bv > 1 << 48 {
                    return Err(bad());
                }
                out.push((Decision::Answer { call, found: flags & 1 != 0, source: a }, bv));
            }
            OP_PICKED => {
                let k = a as usize;
                let idx = recs.get(i + 1..i + 1 + k).ok_or_else(bad)?;
                if idx.iter().any(|x| x[0] != OP_INDEX) {
                    return Err(bad());
                }
                let indices = idx.iter().map(|x| u32::from_le_bytes([x[4], x[5], x[6], x[7]])).collect();
                out.push((Decision::Picked { call, indices }, 1));
                i += k;
            }
            _ => return Err(bad()),
        }
        i += 1;
    }
    Ok(out)
}

/// A replay that cannot go on: the program asked for a decision the record does not have.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diverged {
    /// The rank.
    pub rank: u32,
    /// The decision's number (from 1) in the rank's sequence.
    pub number: u64,
    /// What the program asked for.
    pub asked: String,
    /// What the record has there ("the end of the record" past it).
    pub recorded: String,
    /// Whether the record ends there because the recorded run was stopped (not finished).
    pub record_cut: bool,
}

impl std::fmt::Display for Diverged {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "replay diverged at rank {}, decision {}: the program made {}, the record has {}",
            self.rank, self.number, self.asked, self.recorded
        )?;
        if self.record_cut {
            write!(f, " (the recorded run of this rank was stopped there)")?;
        }
        Ok(())
    }
}

/// Hands a record's decisions back in order.
#[derive(Debug, Clone)]
pub struct Replayer {
    rank: u32,
    finished: bool,
    /// Decisions made in call order, each with its run's length (the `Posted` ones are
    /// apart, by post number).
    calls: Vec<(Decision, u64)>,
    /// The run the next decision comes from, and how many of it were handed back.
    next: usize,
    used: u64,
    /// Decisions handed back.
    done: u64,
    posted: HashMap<u64, (u32, u64)>,
}

impl Replayer {
    /// A replayer of `rec`.
    pub fn new(rec: Record) -> Self {
        let mut posted = HashMap::new();
        let mut calls = Vec::new();
        for (d, n) in rec.runs {
            match d {
                Decision::Posted { post, source, seq } => {
                    posted.insert(post, (source, seq));
                }
                other => calls.push((other, n)),
            }
        }
        Replayer { rank: rec.rank, finished: rec.finished, calls, next: 0, used: 0, done: 0, posted }
    }

    /// Decisions handed back so far.
    pub fn done(&self) -> u64 {
        self.done
    }

    /// The next decision, which must be one of `call`'s.
    ///
    /// # Errors
    /// [`Diverged`] when the record has another call's decision there, or ends.
    pub fn next(&mut self, call: Kind, asked: &str) -> Result<Decision, Diverged> {
        let number = self.done + 1;
        let diverged =
            |recorded: String, cut: bool| Diverged { rank: self.rank, number, asked: asked.to_string(), recorded, record_cut: cut };
        let Some((d, run)) = self.calls.get(self.next) else {
            return Err(diverged("the end of the record".into(), !self.finished));
        };
        if d.call() != call {
            return Err(diverged(d.describe(), false));
        }
        let d = d.clone();
        self.used += 1;
        if self.used >= *run {
            (self.next, self.used) = (self.next + 1, 0);
        }
        self.done += 1;
        Ok(d)
    }

    /// At the end of the program: why the replay diverged if the record holds decisions the
    /// program never asked for (a recorded run that went further), else `None`.
    pub fn unfinished(&self) -> Option<String> {
        let left = self.calls.get(self.next..).unwrap_or_default();
        let first = left.first()?;
        let more = left.iter().map(|r| r.1).sum::<u64>() - self.used;
        Some(format!(
            "replay diverged at rank {}: the program finished after {} decision(s), the record has {more} more (the next: {})",
            self.rank,
            self.done,
            first.0.describe()
        ))
    }

    /// The source and sequence that wildcard post `post` matched, if the record has it.
    pub fn posted(&self, post: u64) -> Option<(u32, u64)> {
        self.posted.get(&post).copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp(name: &str) -> PathBuf {
        let p = std::env::temp_dir().join(format!("tmpi-rec-test-{}-{name}", std::process::id()));
        let _ = std::fs::remove_file(&p);
        p
    }

    /// `rec`'s decisions with its runs counted out.
    fn expanded(rec: &Record) -> Vec<Decision> {
        rec.runs.iter().flat_map(|(d, n)| std::iter::repeat_n(d.clone(), *n as usize)).collect()
    }

    /// `sample()` as a record's runs, one decision each.
    fn runs() -> Vec<(Decision, u64)> {
        sample().into_iter().map(|d| (d, 1)).collect()
    }

    fn sample() -> Vec<Decision> {
        let empty = Decision::Answer { call: Kind::Test, found: false, source: NONE };
        let mut v = vec![Decision::Matched { call: Kind::Recv, source: 2, seq: 7 }, Decision::Posted { post: 0, source: 1, seq: 3 }];
        v.extend(std::iter::repeat_n(empty.clone(), 5));
        v.push(Decision::Answer { call: Kind::Iprobe, found: false, source: NONE });
        v.push(Decision::Answer { call: Kind::Test, found: true, source: NONE });
        v.push(empty);
        v.push(Decision::Picked { call: Kind::WaitSome, indices: vec![0, 3] });
        v.push(Decision::Picked { call: Kind::TestSome, indices: vec![] });
        v.push(Decision::Answer { call: Kind::Iprobe, found: true, source: 4 });
        v
    }

    #[test]
    fn a_replay_that_stops_short_of_its_record_is_unfinished() {
        let rec = Record { rank: 2, size: 3, finished: true, runs: runs(), bytes: 0 };
        let mut r = Replayer::new(rec);
        // Posted decisions are looked up by post number, not counted as left.
        let calls = sample().iter().filter(|d| !matches!(d, Decision::Posted { .. })).count();
        let why = r.unfinished().expect("nothing replayed yet");
        assert!(why.starts_with("replay diverged at rank 2: the program finished after 0 decision(s)"), "{why}");
        assert!(why.contains(&format!("the record has {calls} more")), "{why}");
        for d in sample().into_iter().filter(|d| !matches!(d, Decision::Posted { .. })) {
            r.next(d.call(), "x").expect("as recorded");
        }
        assert_eq!(r.unfinished(), None);
    }

    #[test]
    fn a_record_reads_back_with_runs_expanded() {
        let p = tmp("rt");
        let mut r = Recorder::create(&p, 3, 5).unwrap();
        for d in sample() {
            r.push(&d).unwrap();
        }
        assert_eq!(r.decisions(), sample().len() as u64);
        let cut = Record::read(&p).unwrap();
        assert!(!cut.finished, "not finished yet");
        r.finish().unwrap();
        let rec = Record::read(&p).unwrap();
        std::fs::remove_file(&p).unwrap();
        assert_eq!((rec.rank, rec.size, rec.finished), (3, 5, true));
        assert_eq!(expanded(&rec), sample());
        assert_eq!(expanded(&cut), sample());
        assert_eq!(rec.decisions(), sample().len() as u64);
        // 5 empty tests are one record; the pick of two takes three.
        assert_eq!(rec.bytes, 11 * RECORD_BYTES as u64);
    }

    #[test]
    fn a_record_grows_past_its_first_room() {
        let p = tmp("grow");
        let mut r = Recorder::create(&p, 0, 1).unwrap();
        let n = FIRST_ROOM as u32 * 2 + 3;
        for i in 0..n {
            r.push(&Decision::Matched { call: Kind::Probe, source: i, seq: 1 }).unwrap();
        }
        r.finish().unwrap();
        let rec = Record::read(&p).unwrap();
        std::fs::remove_file(&p).unwrap();
        assert_eq!(rec.decisions(), u64::from(n));
        assert_eq!(rec.runs.last(), Some(&(Decision::Matched { call: Kind::Probe, source: n - 1, seq: 1 }, 1)));
    }

    #[test]
    fn the_replayer_hands_decisions_back_and_names_a_divergence() {
        let rec = Record { rank: 2, size: 4, finished: true, runs: runs(), bytes: 0 };
        let mut rp = Replayer::new(rec.clone());
        assert_eq!(rp.posted(0), Some((1, 3)));
        assert_eq!(rp.posted(1), None);
        assert_eq!(rp.next(Kind::Recv, "recv").unwrap(), Decision::Matched { call: Kind::Recv, source: 2, seq: 7 });
        let e = rp.next(Kind::WaitAny, "wait_any").unwrap_err();
        assert_eq!((e.rank, e.number, e.record_cut), (2, 2, false));
        assert_eq!(e.to_string(), "replay diverged at rank 2, decision 2: the program made wait_any, the record has test found nothing");
        let mut all = Replayer::new(rec.clone());
        for d in sample().iter().filter(|d| !matches!(d, Decision::Posted { .. })) {
            assert_eq!(&all.next(d.call(), d.call().name()).unwrap(), d);
        }
        let end = all.next(Kind::Test, "test").unwrap_err();
        assert!(end.to_string().contains("the end of the record") && !end.record_cut);
        let mut cut = Replayer::new(Record { finished: false, runs: vec![], ..rec });
        assert!(cut.next(Kind::Test, "test").unwrap_err().record_cut);
    }

    /// A run of empty answers stays one entry however long (a corrupt count cannot make the
    /// reader allocate it), and is handed back one decision at a time.
    #[test]
    fn a_long_run_is_never_expanded() {
        let p = tmp("run");
        let mut r = Recorder::create(&p, 0, 1).unwrap();
        let empty = Decision::Answer { call: Kind::Test, found: false, source: NONE };
        for _ in 0..3 {
            r.push(&empty).unwrap();
        }
        r.finish().unwrap();
        let mut b = std::fs::read(&p).unwrap();
        std::fs::remove_file(&p).unwrap();
        b[HEADER_BYTES + 8..HEADER_BYTES + 16].copy_from_slice(&(1u64 << 40).to_le_bytes());
        let rec = Record::parse(&b).unwrap();
        assert_eq!((rec.runs.len(), rec.decisions()), (1, 1 << 40));
        let mut rp = Replayer::new(rec);
        for _ in 0..3 {
            assert_eq!(rp.next(Kind::Test, "test").unwrap(), empty);
        }
        assert_eq!(rp.done(), 3);
        let why = rp.unfinished().unwrap();
        assert!(why.contains(&format!("the record has {} more", (1u64 << 40) - 3)), "{why}");
        b[HEADER_BYTES + 8..HEADER_BYTES + 16].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(Record::parse(&b).unwrap_err().to_string().contains("malformed"));
    }

    #[test]
    fn bad_records_are_errors() {
        assert!(Record::parse(b"nope").is_err());
        let mut b = vec![0u8; HEADER_BYTES + RECORD_BYTES];
        b[..8].copy_from_slice(MAGIC);
        b[8..12].copy_from_slice(&VERSION.to_le_bytes());
        b[24..32].copy_from_slice(&2u64.to_le_bytes());
        assert!(Record::parse(&b).unwrap_err().to_string().contains("holds 1"));
        b[24..32].copy_from_slice(&1u64.to_le_bytes());
        b[HEADER_BYTES] = 99;
        b[HEADER_BYTES + 1] = Kind::Recv.code() as u8;
        assert!(Record::parse(&b).unwrap_err().to_string().contains("malformed"));
        b[HEADER_BYTES] = OP_PICKED;
        b[HEADER_BYTES + 4] = 3;
        assert!(Record::parse(&b).is_err(), "a pick whose indices are missing");
    }
}
