//! Start-up and shut-down: [`init`], [`World`], and ranks-as-threads for tests ([`run_local`]).

use std::ops::Deref;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Instant;

use bytemuck::Pod;
use tmpi_transport::fabric::Fabric as _;
use tmpi_transport::local::LocalFabric;
use tmpi_transport::shm::ShmFabric;

use crate::comm::Comm;
use crate::config::Config;
use crate::engine::{AnyFabric, Engine};
use crate::error::{Error, Result};
use crate::heap::SharedBuf;
use crate::launch::{self, Launcher};
use crate::sync::Threading;

static INITIALIZED: AtomicBool = AtomicBool::new(false);
static FINALIZED: AtomicBool = AtomicBool::new(false);
static EPOCH: OnceLock<Instant> = OnceLock::new();

/// Seconds since an arbitrary point in this process's past; monotonic.
pub fn wtime() -> f64 {
    EPOCH.get_or_init(Instant::now).elapsed().as_secs_f64()
}

/// The world communicator of this process, and the runtime's lifetime: dropping it (or calling
/// [`World::finalize`]) shuts the runtime down. Derefs to [`Comm`].
///
/// `Send + Sync`, like [`Comm`]: at [`Threading::Multiple`] its threads share it by reference
/// (`&World`, or clones of the [`Comm`] it derefs to). Finalize it on a thread the level
/// admits (at `Single`/`Funneled`, the one that started the runtime), after the other threads
/// are done with it. A clone of its communicator (or a `dup`) that outlives it answers every
/// call with [`Error::State`].
pub struct World {
    // Dropped first: when a rank unwinds, tmpirun must see its bootstrap connection go before
    // the peers see it leave the fabric, so that the failing rank is the one reported.
    bootstrap: Arc<Mutex<Option<Launcher>>>,
    comm: Comm,
    finalized: bool,
    /// Made by [`init`] (not [`run_local`]): its finalize counts for [`is_finalized`].
    from_init: bool,
}

impl std::fmt::Debug for World {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("World").field("rank", &self.comm.rank()).field("size", &self.comm.size()).finish()
    }
}

impl Deref for World {
    type Target = Comm;
    fn deref(&self) -> &Comm {
        &self.comm
    }
}

fn world_from_engine(eng: Engine, bootstrap: Option<Launcher>, level: Threading) -> World {
    World { comm: crate::comm::world_comm(eng, level), bootstrap: Arc::new(Mutex::new(bootstrap)), finalized: false, from_init: false }
}

/// Starts the runtime. Under `tmpirun` the rank, size and fabric come from the launcher's
/// environment; under Slurm (`srun --mpi=pmi2`) from its PMI-2 server (`PMI_FD`); a program
/// started alone runs as rank 0 of 1.
///
/// The runtime runs at [`Threading::Single`]: only the calling thread may use it (see
/// [`init_thread`] for the other levels).
///
/// # Errors
/// [`Error::Config`] for a bad `TMPI_*` value; [`Error::State`] when called a second time in
/// one process; transport errors when the job's fabric cannot be set up.
pub fn init() -> Result<World> {
    init_thread(Threading::Single).map(|(w, _)| w)
}

/// Starts the runtime as [`init`] does, at thread level `required` (MPI's
/// `MPI_Init_thread`), and returns the world and the level provided. tmpi provides every
/// level, so the level provided is the one required.
///
/// At [`Threading::Single`] and [`Threading::Funneled`] only the calling thread may use the
/// runtime; at [`Threading::Serialized`] any thread, one at a time; at
/// [`Threading::Multiple`] any thread at any time.
///
/// ```no_run
/// use tmpi::Threading;
/// # fn main() -> tmpi::Result<()> {
/// let (world, provided) = tmpi::init_thread(Threading::Multiple)?;
/// assert_eq!(provided, Threading::Multiple);
/// let peer = (world.rank() + 1) % world.size();
/// let from = (world.rank() + world.size() - 1) % world.size();
/// std::thread::scope(|s| {
///     for t in 0..4u32 {
///         let w = &world;
///         s.spawn(move || -> tmpi::Result<()> {
///             let mut got = [0u32];
///             w.sendrecv(&[t], peer, t, &mut got, from, t)?;
///             assert_eq!(got[0], t);
///             Ok(())
///         });
///     }
/// });
/// world.finalize()
/// # }
/// ```
///
/// # Errors
/// As [`init`].
pub fn init_thread(required: Threading) -> Result<(World, Threading)> {
    if INITIALIZED.swap(true, Ordering::SeqCst) {
        return Err(Error::State("tmpi::init called more than once in this process".into()));
    }
    let t0 = tmpi_trace::clock::now_ns();
    let mut w = init_world(required)?;
    w.from_init = true;
    launch::remember(&w.bootstrap);
    w.start_seeing(t0, required)?;
    Ok((w, required))
}

fn init_world(level: Threading) -> Result<World> {
    // libfabric's dependencies take SIGSEGV, SIGABRT, SIGTERM... when they load: give them
    // back, so that a rank that crashes or is ended reads as such (see the module's docs).
    #[cfg(feature = "ofi")]
    tmpi_transport::ofi::signals::restore_default_signals();
    let _ = wtime();
    let cfg = Config::from_env()?;
    let Some((mut bc, env)) = launch::launcher()? else {
        return Ok(world_from_engine(Engine::new(AnyFabric::Single, 0, 1, cfg)?, None, level));
    };
    let (rank, size) = (env.rank, env.size);
    if matches!(bc, Launcher::Tmpirun(_)) {
        crate::spawn::set_link(crate::spawn::JobLink { secret: env.secret.clone() });
    }
    if size == 1 {
        let world = world_from_engine(Engine::new(AnyFabric::Single, 0, 1, cfg)?, Some(bc), level);
        crate::spawn::join_parent(&world)?;
        return Ok(world);
    }
    let fabric = launch::wire(bc.kv(), &env, &cfg)?;
    let stats = cfg.stats;
    let (kind, bad) = (fabric.name(), fabric.bad_connections());
    let provider = fabric.provider().map(|p| format!(" provider={p}")).unwrap_or_default();
    let one_host = matches!(fabric, AnyFabric::Shm(_));
    #[allow(unused_mut)]
    let mut engine = Engine::new(fabric, rank, size, cfg)?;
    // Who matches point-to-point over OFI (`TMPI_OFI_MATCHING`): said on the fabric line.
    #[cfg(feature = "ofi")]
    let mut matching = engine.choose_matching()?.map(|m| format!(" matching={m}")).unwrap_or_default();
    // How a rendezvous's data moves over OFI (`TMPI_OFI_RNDV`): said on the same line.
    #[cfg(feature = "ofi")]
    matching.extend(engine.choose_rndv()?.map(|w| format!(" rndv={w}")));
    #[cfg(not(feature = "ofi"))]
    let matching = String::new();
    if stats {
        eprintln!("tmpi-fabric rank={rank} kind={kind}{provider}{matching} bad_connections={bad}");
    }
    let world = world_from_engine(engine, Some(bc), level);
    // The collectives' map of the hosts, learned once for the world (one allgather when the
    // job spans hosts); every later communicator derives its own from it.
    crate::coll_glue::learn_hosts(&world, one_host)?;
    crate::spawn::join_parent(&world)?;
    Ok(world)
}

impl World {
    /// Allocates `len` zeroed values of `T` in this rank's shared heap: memory the other
    /// ranks of the node map, so that a rendezvous (a message of at least
    /// `TMPI_RNDV_THRESHOLD` bytes) from or into it is copied by one plain `memcpy`. The
    /// buffer is freed when dropped; operations borrow it, so that cannot happen while one is
    /// in flight.
    ///
    /// Falls back to private memory (see [`SharedBuf::is_shared`]) when the heap is off
    /// (`TMPI_SHARED_HEAP=0`), full, or cannot be created here.
    ///
    /// # Errors
    /// [`Error::InvalidBuffer`] if `len` values of `T` do not fit in the address space, or
    /// (when the heap cannot serve them) are more than this process can allocate: more than
    /// the machine's physical memory, or refused by the allocator.
    pub fn alloc_shared<T: Pod>(&self, len: usize) -> Result<SharedBuf<T>> {
        SharedBuf::alloc(|| Ok(self.eng()?.shared_heap()), len)
    }
}

impl World {
    /// Shuts the runtime down: hands over this rank's own outgoing data (queued messages,
    /// reads it serves or makes), marks the rank departed, prints statistics if
    /// `TMPI_STATS=1`. It never waits for other ranks, so it cannot deadlock: messages this
    /// rank sent are still delivered after it exits, and a receive elsewhere that only this
    /// rank could have matched fails with [`Error::PeerGone`].
    ///
    /// # Errors
    /// A peer broke the protocol while the data was handed over (the rank is then not
    /// marked finalized, and its exit counts as a failure). [`Error::Replay`] when
    /// `TMPI_REPLAY` replayed a record that holds decisions this run never asked for (the
    /// rank did finalize).
    pub fn finalize(mut self) -> Result<()> {
        self.shutdown()
    }

    /// Finalizes: hands over this rank's outgoing data, tells the launcher, and only then
    /// lets the peers see this rank departed. In that order because a peer that fails on
    /// seeing it go (a receive only this rank could match) may exit at once; `tmpirun`, having
    /// heard this rank's finalize first, then waits for this rank's own exit before it
    /// decides who failed first (a `main` that returns `Err` finalizes on the way out).
    fn shutdown(&mut self) -> Result<()> {
        if self.finalized {
            return Ok(());
        }
        let t0 = tmpi_trace::clock::now_ns();
        self.finalized = true;
        if self.from_init {
            FINALIZED.store(true, Ordering::SeqCst);
        }
        // The bridges to spawned processes or parents first (their own data only, too).
        let bridges = crate::spawn::finalize_bridges();
        let mut e = self.comm.inner.eng.lock_for_cleanup()?;
        // This rank's own outgoing data only: finalize never waits for other ranks.
        let r = e.hand_over();
        if e.cfg.stats {
            eprintln!("{}", e.stats_line());
            #[cfg(feature = "ofi")]
            if let Some(line) = e.ofi_stats_line() {
                eprintln!("{line}");
            }
            #[cfg(feature = "ofi")]
            if let Some(line) = e.ofi_rndv_stats_line() {
                eprintln!("{line}");
            }
        }
        drop(e);
        // Every later call through a communicator, request or message that outlived the
        // world fails with `Error::State`; their clean-up on drop still runs.
        self.comm.inner.eng.close();
        let seen = if self.from_init { crate::seen::finish(t0, &mut || self.launcher_clock()) } else { Ok(()) };
        r?;
        bridges?;
        if let Some(bc) = self.bootstrap.lock().unwrap_or_else(PoisonError::into_inner).as_mut() {
            let _ = bc.finalize();
        }
        self.comm.inner.eng.lock_for_cleanup()?.mark_finalized();
        // A replay that ended short of its record: the job finalized, the error is the
        // program's to report.
        seen
    }

    /// Starts tracing, profiling, recording or replaying as `TMPI_*` say (see
    /// [`crate::seen`]); `t0` is when init began.
    fn start_seeing(&self, t0: u64, level: Threading) -> Result<()> {
        let cfg = self.comm.eng()?.cfg.clone();
        let launched = self.bootstrap.lock().unwrap_or_else(PoisonError::into_inner).is_some();
        let multiple = level == Threading::Multiple;
        crate::seen::start(&cfg, self.comm.rank(), self.comm.size(), launched, multiple, t0, &mut || self.launcher_clock())
    }

    /// One round trip to `tmpirun`'s clock (none under another launcher, or alone).
    fn launcher_clock(&self) -> Option<(u64, u64, u64)> {
        match self.bootstrap.lock().unwrap_or_else(PoisonError::into_inner).as_mut() {
            Some(Launcher::Tmpirun(c)) => c.clock(tmpi_trace::clock::now_ns).ok(),
            _ => None,
        }
    }

    /// Ends the whole job: prints a message naming this rank, tells `tmpirun`, and exits the
    /// process with `code` (tmpirun ends the other ranks and exits with it).
    pub fn abort(&self, code: i32) -> ! {
        eprintln!("tmpi: rank {} called abort({code})", self.comm.rank());
        if let Ok(mut b) = self.bootstrap.try_lock() {
            if let Some(bc) = b.as_mut() {
                let _ = bc.abort(code, &format!("rank {} called abort({code})", self.comm.rank()));
            }
        }
        std::process::exit(code)
    }
}

impl Drop for World {
    fn drop(&mut self) {
        if std::thread::panicking() || self.finalized {
            return;
        }
        if let Err(e) = self.shutdown() {
            eprintln!("tmpi: rank {}: finalize failed: {e}", self.comm.rank());
        }
    }
}

/// Runs `f` on `n` ranks that are threads of this process, over the in-process fabric, and
/// returns each rank's result (index = rank). For tests and examples that need no processes.
///
/// ```
/// let sums = tmpi::run_local(3, |world| {
///     let mut s = [0u64];
///     world.allreduce(&[world.rank() as u64], &mut s, tmpi::Op::Sum).unwrap();
///     s[0]
/// });
/// assert_eq!(sums, vec![3, 3, 3]);
/// ```
///
/// # Panics
/// If a rank's thread panics, the panic is propagated after all threads have ended.
pub fn run_local<R: Send>(n: usize, f: impl Fn(World) -> R + Sync) -> Vec<R> {
    run_local_with(n, Config::default(), f)
}

/// The `n` ranks' ends of a new shm segment, all opened by this process (the segment's name
/// is unlinked at once, so nothing is left behind).
///
/// # Panics
/// If the segment cannot be created.
fn shm_fabrics_in_process(n: usize, cfg: &Config) -> Vec<ShmFabric> {
    let mut b = [0u8; 8];
    getrandom::getrandom(&mut b).expect("random segment name");
    let name = format!("tmpi-threads-{}", b.iter().map(|x| format!("{x:02x}")).collect::<String>());
    let first = ShmFabric::create(&name, 0, n, cfg.ring_size_for(n)).expect("create shm segment");
    let mut fabs = vec![first];
    for r in 1..n {
        fabs.push(ShmFabric::open(&name, r, n).expect("open shm segment"));
    }
    fabs[0].unlink().expect("unlink shm segment");
    fabs
}

/// Like [`run_local`], but the threads talk through a real shared-memory segment (the fabric
/// `tmpirun` jobs use), so the shm path can be tested and measured without processes.
///
/// # Panics
/// If the segment cannot be created, or as [`run_local`].
#[doc(hidden)]
pub fn run_shm_threads<R: Send>(n: usize, cfg: Config, f: impl Fn(World) -> R + Sync) -> Vec<R> {
    let fabs = shm_fabrics_in_process(n, &cfg);
    std::thread::scope(|s| {
        let handles: Vec<_> = fabs
            .into_iter()
            .enumerate()
            .map(|(rank, fab)| {
                let f = &f;
                let cfg = cfg.clone();
                s.spawn(move || {
                    f(world_from_engine(Engine::new(AnyFabric::Shm(fab), rank, n, cfg).expect("create engine"), None, Threading::Single))
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p))).collect()
    })
}

/// Two ranks of one job over a real shared-memory segment, both owned by the calling thread,
/// so that one thread drives both sides of every message through the public API: the
/// measurements in `bench/` (`comm_window_cost`, `pingpong_cost`) cost a message without
/// cross-core traffic, and callgrind counts its instructions.
///
/// `TMPI_TRACE` and `TMPI_PROFILE` in `cfg` turn seeing on for the process, to measure its
/// cost (the bench binaries' `TMPI_TRACE=... valgrind --tool=callgrind ...`).
///
/// # Panics
/// If the segment or an engine cannot be created, or seeing cannot start.
#[doc(hidden)]
pub fn shm_pair_one_thread(cfg: Config) -> (World, World) {
    let mut fabs = shm_fabrics_in_process(2, &cfg).into_iter();
    let (a, b) = (fabs.next().expect("rank 0"), fabs.next().expect("rank 1"));
    let w0 = world_from_engine(Engine::new(AnyFabric::Shm(a), 0, 2, cfg.clone()).expect("engine 0"), None, Threading::Single);
    // Tracing or profiling as `cfg` says, as rank 0 (both ranks' events go to its ring), to
    // measure what seeing costs; never finished (the ring is left beside the path).
    let t0 = tmpi_trace::clock::now_ns();
    if let Err(e) = crate::seen::start(&cfg, 0, 2, false, false, t0, &mut || None) {
        panic!("seeing: {e}");
    }
    let w1 = world_from_engine(Engine::new(AnyFabric::Shm(b), 1, 2, cfg).expect("engine 1"), None, Threading::Single);
    (w0, w1)
}

/// [`shm_pair_one_thread`] over the OFI fabric on `cfg`'s provider (`TMPI_OFI_PROVIDER`),
/// with the matching `cfg` asks for (`TMPI_OFI_MATCHING`): what `pingpong_cost --ofi`
/// counts. Builds with the cargo feature `ofi` only.
///
/// # Errors
/// No provider, a libfabric call failing, or the matching refused.
#[cfg(feature = "ofi")]
#[doc(hidden)]
pub fn ofi_pair_one_thread(cfg: Config) -> Result<(World, World)> {
    let ocfg = tmpi_transport::ofi::OfiConfig { provider: cfg.ofi_provider.clone(), node: Some("127.0.0.1".into()) };
    let (a, b) = tmpi_transport::ofi::pair_in_process(&ocfg)?;
    let mut e0 = Engine::new(AnyFabric::Ofi(Box::new(a)), 0, 2, cfg.clone())?;
    let mut e1 = Engine::new(AnyFabric::Ofi(Box::new(b)), 1, 2, cfg)?;
    e0.choose_matching()?;
    e1.choose_matching()?;
    Ok((world_from_engine(e0, None, Threading::Single), world_from_engine(e1, None, Threading::Single)))
}

/// [`run_local`] with an explicit configuration.
///
/// # Panics
/// As [`run_local`].
pub fn run_local_with<R: Send>(n: usize, cfg: Config, f: impl Fn(World) -> R + Sync) -> Vec<R> {
    run_local_at(n, cfg, Threading::Single, f)
}

/// [`run_local`] at thread level `level` (each rank's world is made on, and owned by, that
/// rank's thread).
///
/// ```
/// let got = tmpi::run_local_threaded(2, tmpi::Threading::Multiple, |w| {
///     let w = &*w;
///     // Rank 1 receives on one thread while another sends.
///     std::thread::scope(|s| {
///         let r = s.spawn(|| {
///             let mut b = [0u8];
///             w.recv(&mut b, 1 - w.rank(), 5).unwrap();
///             b[0]
///         });
///         s.spawn(|| w.send(&[w.rank() as u8 + 10], 1 - w.rank(), 5).unwrap());
///         r.join().unwrap()
///     })
/// });
/// assert_eq!(got, vec![11, 10]);
/// ```
///
/// # Panics
/// As [`run_local`].
pub fn run_local_threaded<R: Send>(n: usize, level: Threading, f: impl Fn(World) -> R + Sync) -> Vec<R> {
    run_local_at(n, Config::default(), level, f)
}

fn run_local_at<R: Send>(n: usize, cfg: Config, level: Threading, f: impl Fn(World) -> R + Sync) -> Vec<R> {
    let fabrics = LocalFabric::create(n.max(1), 64 * 1024);
    std::thread::scope(|s| {
        let handles: Vec<_> = fabrics
            .into_iter()
            .enumerate()
            .map(|(rank, fab)| {
                let f = &f;
                let cfg = cfg.clone();
                s.spawn(move || {
                    let fabric = if n <= 1 { AnyFabric::Single } else { AnyFabric::Local(fab) };
                    f(world_from_engine(Engine::new(fabric, rank, n.max(1), cfg).expect("create engine"), None, level))
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p))).collect()
    })
}

/// Resolution of [`wtime`] in seconds: the tick of the monotonic clock it reads
/// (`clock_getres(CLOCK_MONOTONIC)`, typically `1e-9` on Linux).
///
/// ```
/// let t = tmpi::wtick();
/// assert!(t > 0.0 && t < 1.0);
/// ```
pub fn wtick() -> f64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid, writable timespec for the duration of the call; on failure the
    // kernel leaves it untouched and we fall back below.
    let rc = unsafe { libc::clock_getres(libc::CLOCK_MONOTONIC, &mut ts) };
    let t = ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9;
    if rc == 0 && t > 0.0 {
        t
    } else {
        // `Instant` counts nanoseconds on every platform tmpi runs on.
        1e-9
    }
}

/// The name of the host this rank runs on (`MPI_Get_processor_name`): the kernel's host
/// name, or `"localhost"` if it cannot be read.
///
/// ```
/// assert!(!tmpi::processor_name().is_empty());
/// ```
pub fn processor_name() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: the pointer and length describe `buf`, which outlives the call; gethostname
    // writes at most `buf.len()` bytes.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    match std::str::from_utf8(&buf[..end]) {
        Ok(s) if rc == 0 && !s.is_empty() => s.to_string(),
        _ => "localhost".to_string(),
    }
}

/// The library's name and version (`MPI_Get_library_version`), e.g. `"tmpi 0.1.0"`.
///
/// ```
/// assert!(tmpi::library_version().starts_with("tmpi "));
/// ```
pub fn library_version() -> String {
    format!("tmpi {}", env!("CARGO_PKG_VERSION"))
}

/// Whether [`init`] has been called in this process (`MPI_Initialized`). Worlds made by
/// [`run_local`] do not count.
///
/// ```
/// assert!(!tmpi::is_initialized());
/// ```
pub fn is_initialized() -> bool {
    INITIALIZED.load(Ordering::SeqCst)
}

/// Whether the world [`init`] returned has been finalized (by [`World::finalize`] or by being
/// dropped; `MPI_Finalized`). Worlds made by [`run_local`] do not count.
///
/// ```
/// assert!(!tmpi::is_finalized());
/// ```
pub fn is_finalized() -> bool {
    FINALIZED.load(Ordering::SeqCst)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Communicators that outlive their world (a clone, a dup): every call fails with
    /// `Error::State`, a request pending across the finalize fails its wait, and the end of
    /// its scope, the drops and a second finalize of nothing still run (no hang, no abort).
    #[test]
    fn calls_after_finalize_fail_with_a_state_error_and_clean_up() {
        for level in [Threading::Single, Threading::Serialized, Threading::Multiple] {
            calls_after_finalize(level);
        }
    }

    fn calls_after_finalize(level: Threading) {
        let out = run_local_threaded(2, level, |w| {
            let c: Comm = (*w).clone();
            let d = w.dup().expect("dup");
            let peer = 1 - w.rank();
            let mut never = [0u32; 1];
            let waited = crate::scope(|s| {
                // Nothing is ever sent with this tag: pending across the finalize, forgotten
                // at the scope's end.
                let r = c.irecv(s, &mut never, peer, 77).expect("irecv");
                w.finalize().expect("finalize");
                r.wait().expect_err("a wait after finalize")
            });
            let mut x = [0u32];
            let errs = [
                waited,
                c.send(&[1u32], peer, 1).expect_err("send"),
                c.recv(&mut x, peer, 1).expect_err("recv"),
                c.iprobe(peer, 1).expect_err("iprobe"),
                c.barrier().expect_err("barrier"),
                d.allreduce(&[1u32], &mut x, crate::Op::Sum).expect_err("allreduce"),
                d.dup().expect_err("dup"),
            ];
            // What needs no engine still answers.
            assert_eq!((c.rank(), d.size()), (1 - peer, 2));
            drop((c, d));
            errs.iter().map(|e| matches!(e, Error::State(_))).collect::<Vec<_>>()
        });
        for (rank, r) in out.iter().enumerate() {
            assert!(r.iter().all(|&ok| ok), "{level:?}, rank {rank}: {r:?}");
        }
    }
}
