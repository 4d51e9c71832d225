//! The process-wide state of seeing: the trace ring, the profile's counters and the decision
//! record or replay, made at init ([`start`]) and closed at finalize ([`finish`]).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU16, AtomicU64, Ordering::Relaxed};
use std::sync::{Mutex, MutexGuard, OnceLock, PoisonError};

use tmpi_trace::clock::{self, now_ns, Sample};
use tmpi_trace::event::{Event, Kind, Proto};

/// The requests of recorded wildcard posts not completed yet (their decisions come later).
pub(crate) type PostOf = HashMap<crate::slab::Key, u64>;
use tmpi_trace::profile::{Profiler, Report};
use tmpi_trace::record::{Record, Recorder, Replayer};
use tmpi_trace::ring::{RankFile, RankInfo, RankTrace};

use super::{Msg, What, FLAGS, PROFILE, RECORD, REPLAY, TRACE};
use crate::config::Config;
use crate::error::{Error, Result};

/// Round trips to the reference clock at init and at finalize (the shortest is kept).
const CLOCK_SAMPLES: usize = 8;

/// Everything seeing keeps for this process's rank.
pub(crate) struct State {
    pub(crate) rank: u32,
    size: u32,
    host: String,
    init_ns: u64,
    /// Started by a launcher (`tmpirun` or PMI-2): it merges, not the rank.
    launched: bool,
    ring: Mutex<Option<RankFile>>,
    /// Where the merged trace goes.
    trace_path: Option<PathBuf>,
    profile: Option<(Mutex<Profiler>, PathBuf)>,
    pub(crate) record: Option<Mutex<Option<Recorder>>>,
    pub(crate) replay: Option<Mutex<Replayer>>,
    threads: Mutex<Vec<(u16, String)>>,
    next_thread: AtomicU16,
    /// Wildcard non-blocking receives posted so far (record and replay number them).
    pub(crate) posts: AtomicU64,
    /// Recording: the requests of wildcard posts not completed yet, with their numbers.
    pub(crate) post_of: Mutex<PostOf>,
    /// Replay: why it diverged, once it has (every later decision fails alike).
    pub(crate) diverged: Mutex<Option<String>>,
    /// The trace's message numbering (see [`message`]).
    msgs: Mutex<Msgs>,
}

/// Messages seen so far, per (leaving, peer, match key), and an unexpected rendezvous whose
/// read has not started yet (its way is chosen then).
#[derive(Default)]
struct Msgs {
    seq: HashMap<(bool, u32, u64), u64>,
    pending: Option<(usize, u64, u32)>,
}

static STATE: OnceLock<State> = OnceLock::new();

/// The state, once seeing started.
pub(crate) fn get() -> Option<&'static State> {
    STATE.get()
}

/// Locks `m`, taking over a lock poisoned by a panicking thread (what it guards stays
/// usable: records are whole or not written).
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Gives the calling thread its index among this rank's threads (named after the thread).
pub(super) fn register_thread() -> u16 {
    let Some(s) = get() else { return 0 };
    let i = s.next_thread.fetch_add(1, Relaxed).min(u16::MAX - 1);
    let name = std::thread::current().name().map_or_else(|| format!("thread {i}"), str::to_string);
    lock(&s.threads).push((i, name));
    i
}

/// Samples of the launcher's clock through `clock` (none without a launcher).
fn samples(clock: &mut dyn FnMut() -> Option<(u64, u64, u64)>) -> Option<Sample> {
    let got: Vec<Sample> = (0..CLOCK_SAMPLES).map_while(|_| clock()).map(|(t0, reference, t3)| Sample { t0, reference, t3 }).collect();
    clock::best(&got)
}

fn config_err(var: &str, value: &Path, what: String) -> Error {
    Error::Config { var: var.into(), value: value.display().to_string(), expected: what }
}

/// The trace ring file of this rank (an old one of the same name is replaced).
fn open_ring(cfg: &Config, path: &Path, info: &RankInfo) -> Result<RankFile> {
    let file = PathBuf::from(format!("{}.rank{}", path.display(), info.rank));
    let _ = std::fs::remove_file(&file);
    RankFile::create(&file, info, cfg.trace_events)
        .map_err(|e| config_err("TMPI_TRACE", path, format!("a path where this rank can write its trace: {e}")))
}

fn open_record(dir: &Path, rank: u32, size: u32) -> Result<Recorder> {
    let file = tmpi_trace::record::rank_path(dir, rank as usize);
    let _ = std::fs::remove_file(&file);
    Recorder::create(&file, rank, size)
        .map_err(|e| config_err("TMPI_RECORD", dir, format!("a directory where this rank can write its record: {e}")))
}

fn open_replay(dir: &Path, rank: u32, size: u32) -> Result<Replayer> {
    let rec = Record::read(&tmpi_trace::record::rank_path(dir, rank as usize))
        .map_err(|e| config_err("TMPI_REPLAY", dir, format!("a directory with the record of this rank: {e}")))?;
    if rec.size != size || rec.rank != rank {
        return Err(config_err(
            "TMPI_REPLAY",
            dir,
            format!("the record of a job of {size} ranks (it has rank {} of {})", rec.rank, rec.size),
        ));
    }
    Ok(Replayer::new(rec))
}

/// Starts seeing for rank `rank` of `size`, as `cfg` says; `t0` is when init began,
/// `clock` one round trip to the launcher's clock (if it has one).
///
/// # Errors
/// [`Error::Config`] naming the knob whose file cannot be made or read; [`Error::Thread`]
/// for record or replay at [`crate::Threading::Multiple`].
pub(crate) fn start(
    cfg: &Config,
    rank: usize,
    size: usize,
    launched: bool,
    multiple: bool,
    t0: u64,
    clock: &mut dyn FnMut() -> Option<(u64, u64, u64)>,
) -> Result<()> {
    if (cfg.record.is_some() || cfg.replay.is_some()) && multiple {
        return Err(Error::Thread {
            level: crate::Threading::Multiple,
            what: "TMPI_RECORD and TMPI_REPLAY need the calls of a rank in one order: a level below Multiple",
        });
    }
    let info = RankInfo {
        rank: rank as u32,
        size: size as u32,
        pid: std::process::id(),
        boot_id: clock::boot_id(),
        host: crate::processor_name(),
        jobid: std::env::var(tmpi_transport::bootstrap::ENV_JOBID).unwrap_or_default(),
        init_ns: t0,
    };
    let Some((state, flags)) = State::open(cfg, info, launched, clock)? else { return Ok(()) };
    if STATE.set(state).is_err() {
        return Err(Error::State("tmpi: seeing started twice".into()));
    }
    FLAGS.store(flags, Relaxed);
    super::refresh_this_thread();
    span(&What::new(Kind::Init), t0, now_ns());
    Ok(())
}

impl State {
    /// Opens what `cfg` asks for (trace ring, profile, record, replay) for the rank `info`
    /// describes; `None` when it asks for nothing; else the state and its flags.
    fn open(
        cfg: &Config,
        info: RankInfo,
        launched: bool,
        clock: &mut dyn FnMut() -> Option<(u64, u64, u64)>,
    ) -> Result<Option<(State, u8)>> {
        let (rank, size) = (info.rank, info.size);
        let ring = match &cfg.trace {
            Some(p) => {
                let mut f = open_ring(cfg, p, &info)?;
                f.set_start_sample(samples(clock));
                Some(f)
            }
            None => None,
        };
        let profile = cfg.profile.as_ref().map(|d| (Mutex::new(Profiler::new(size as usize)), d.clone()));
        let record = cfg.record.as_deref().map(|d| open_record(d, rank, size)).transpose()?.map(|r| Mutex::new(Some(r)));
        let replay = cfg.replay.as_deref().map(|d| open_replay(d, rank, size)).transpose()?.map(Mutex::new);
        let flag = |on: bool, f: u8| if on { f } else { 0 };
        let flags = flag(ring.is_some(), TRACE)
            | flag(profile.is_some(), PROFILE)
            | flag(record.is_some(), RECORD)
            | flag(replay.is_some(), REPLAY);
        if flags == 0 {
            return Ok(None);
        }
        let state = State {
            rank,
            size,
            host: info.host,
            init_ns: info.init_ns,
            launched,
            ring: Mutex::new(ring),
            trace_path: cfg.trace.clone(),
            profile,
            record,
            replay,
            threads: Mutex::new(Vec::new()),
            next_thread: AtomicU16::new(0),
            posts: AtomicU64::new(0),
            post_of: Mutex::new(Default::default()),
            diverged: Mutex::new(None),
            msgs: Mutex::new(Msgs::default()),
        };
        Ok(Some((state, flags)))
    }
}

/// Records a finished call.
pub(super) fn span(w: &What<'_>, t0: u64, t1: u64) {
    let Some(s) = get() else { return };
    if super::is(TRACE) {
        let e = super::event(w, t0, t1);
        if let Some(f) = lock(&s.ring).as_mut() {
            f.push(&e);
        }
    }
    if let Some((p, _)) = &s.profile {
        let mut p = lock(p);
        let at = t0.saturating_sub(s.init_ns);
        p.call(w.kind, t1.saturating_sub(t0), w.bytes, at, w.peer, w.tag);
        if w.out.0 != tmpi_trace::event::NONE && w.aux & tmpi_trace::event::aux::FAILED == 0 {
            p.sent(w.out.0 as usize, w.out.1);
        }
    }
}

/// Keeps call `w`, begun at `t0`, in the trace file while this thread is in it, so that a
/// rank killed inside it (a hang ended by `--timeout`) still shows it; [`close`] when it
/// returns.
pub(super) fn open(w: &What<'_>, t0: u64) {
    let Some(s) = get().filter(|_| super::is(TRACE)) else { return };
    let e = super::event(w, t0, t0);
    if let Some(f) = lock(&s.ring).as_mut() {
        f.open_call(&e);
    }
}

/// This thread's call (see [`open`]) returned.
pub(super) fn close() {
    let Some(s) = get().filter(|_| super::is(TRACE)) else { return };
    let thread = super::thread_index();
    if let Some(f) = lock(&s.ring).as_mut() {
        f.close_call(thread);
    }
}

/// Records an event in the trace ring only (not a call: the profile does not count it).
pub(super) fn event_only(w: &What<'_>, t0: u64, t1: u64) {
    let Some(s) = get().filter(|_| super::is(TRACE)) else { return };
    let e = super::event(w, t0, t1);
    if let Some(f) = lock(&s.ring).as_mut() {
        f.push(&e);
    }
}

/// Counts a message that starts towards world rank `dest`.
pub(super) fn message_out(dest: usize, bytes: usize) {
    if let Some((p, _)) = get().and_then(|s| s.profile.as_ref()) {
        lock(p).sent(dest, bytes as u64);
    }
}

/// Writes the event of one end of a message (see [`super::message`]): its number counts the
/// messages of its direction, peer and match key, which the sender and the receiver count
/// alike (messages of one envelope match in the order they were sent); the context goes
/// above it, so that `(source, destination, tag, id)` names one message of the job.
pub(super) fn message(m: Msg) {
    let Some(s) = get().filter(|_| super::is(TRACE)) else { return };
    let mut g = lock(&s.msgs);
    let mut proto = m.proto;
    if !m.out && proto & 0xf == Proto::RNDV {
        if proto & 0xf0 == 0 {
            // Matched unexpected: its read starts next and says how the bytes move.
            g.pending = Some((m.peer, m.tag64, proto));
            return;
        }
        if let Some((_, _, p)) = g.pending.take_if(|(peer, t, _)| *peer == m.peer && *t == m.tag64) {
            proto |= p;
        }
    }
    let seq = g.seq.entry((m.out, m.peer as u32, m.tag64)).or_insert(0);
    *seq += 1;
    let seq = *seq & ((1 << tmpi_trace::merge::MSG_SEQ_BITS) - 1);
    drop(g);
    let ctx = m.tag64 >> crate::matching::CTX_SHIFT;
    if ctx % 2 == 1 && ctx < 1 << 19 {
        proto |= Proto::COLLECTIVE;
    }
    let e = Event {
        t0: now_ns(),
        dur: 1,
        bytes: m.bytes as u64,
        id: ctx << tmpi_trace::merge::MSG_SEQ_BITS | seq,
        peer: m.peer as u32,
        tag: (m.tag64 & crate::matching::TAG_FIELD) as u32,
        kind: if m.out { Kind::MsgOut } else { Kind::MsgIn }.code(),
        thread: super::thread_index(),
        aux: proto,
    };
    if let Some(f) = lock(&s.ring).as_mut() {
        f.push(&e);
    }
}

/// Ends seeing at finalize: records the finalize span (begun at `t0`), samples the clock
/// again, seals the trace ring, writes the profile and closes the record. A rank started
/// without a launcher writes the merged trace (and prints its profile) itself.
///
/// # Errors
/// [`Error::Replay`] when a replay ends with recorded decisions left (the recorded run went
/// further than this one); everything else is still closed.
pub(crate) fn finish(t0: u64, clock: &mut dyn FnMut() -> Option<(u64, u64, u64)>) -> Result<()> {
    let Some(s) = get() else { return Ok(()) };
    if FLAGS.load(Relaxed) == 0 {
        return Ok(());
    }
    span(&What::new(Kind::Finalize), t0, now_ns());
    FLAGS.store(0, Relaxed);
    super::refresh_this_thread();
    let fini = now_ns();
    if let Some(mut f) = lock(&s.ring).take() {
        f.set_end_sample(samples(clock));
        let path = f.path().to_path_buf();
        let threads = lock(&s.threads).clone();
        if let Err(e) = f.seal(&threads, fini) {
            eprintln!("tmpi: rank {}: TMPI_TRACE: {e}", s.rank);
        } else if !s.launched {
            write_alone(s, &path);
        }
    }
    if let Some((p, dir)) = &s.profile {
        let prof = lock(p).snapshot(s.rank, &s.host, fini.saturating_sub(s.init_ns));
        if s.launched || s.size > 1 {
            let file = dir.join(format!("tmpi-profile.rank{}", s.rank));
            if let Err(e) = std::fs::write(&file, prof.to_text()) {
                eprintln!("tmpi: rank {}: TMPI_PROFILE: cannot write {}: {e}", s.rank, file.display());
            }
        } else {
            eprint!("{}", Report::new(1, vec![prof]).text());
        }
    }
    if let Some(r) = s.record.as_ref().and_then(|m| lock(m).take()) {
        if let Err(e) = r.finish() {
            eprintln!("tmpi: rank {}: TMPI_RECORD: {e}", s.rank);
        }
    }
    let unfinished = s.replay.as_ref().filter(|_| lock(&s.diverged).is_none()).and_then(|r| lock(r).unfinished());
    unfinished.map_or(Ok(()), |why| Err(Error::Replay(why)))
}

/// A rank started alone merges its own trace into the JSON file and removes its ring file.
fn write_alone(s: &State, ring: &Path) {
    let Some(out) = &s.trace_path else { return };
    let merged =
        RankTrace::read(ring).map(|t| tmpi_trace::merge::merge(&[t], &tmpi_trace::merge::Options { size: 1, ..Default::default() }));
    match merged.map_err(|e| e.to_string()).and_then(|(json, sum)| std::fs::write(out, json).map(|()| sum).map_err(|e| e.to_string())) {
        Ok(sum) => {
            let _ = std::fs::remove_file(ring);
            let dropped = if sum.dropped > 0 { format!(", {} dropped", sum.dropped) } else { String::new() };
            eprintln!("tmpi: trace of {} events in {}{dropped}", sum.events, out.display());
        }
        Err(e) => eprintln!("tmpi: TMPI_TRACE: cannot write {}: {e} (the ring is in {})", out.display(), ring.display()),
    }
}
