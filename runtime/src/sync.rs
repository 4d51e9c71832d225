//! The thread model: which threads may drive a rank's engine, and how ([`Threading`]).
//!
//! Every communicator, request and probed message of a rank shares one [`EngineCell`], the
//! only way to the rank's progress engine. A call takes the engine with
//! [`EngineCell::lock`] for as long as it needs it and gets an [`EngineGuard`]; how it gets
//! one depends on the level chosen at start-up ([`crate::init_thread`]):
//!
//! - [`Threading::Single`] and [`Threading::Funneled`]: only the thread that started the
//!   runtime may call. The check is a compare of a thread token (no atomic read-modify-write),
//!   and a flag catches a call made from inside another (a user operation that calls tmpi),
//!   as `RefCell` would; both are errors ([`Error::Thread`]).
//! - [`Threading::Serialized`]: any thread, one at a time; the engine is taken with a
//!   `try_lock`, and a second thread calling while the first is inside gets an error instead
//!   of waiting.
//! - [`Threading::Multiple`]: any thread, at any time. The engine is a mutex; a blocking call
//!   holds it for one round of progress at a time and lets go of it between rounds (while it
//!   spins, yields or sleeps, [`EngineGuard::wait`]), so the other threads of the rank post,
//!   complete and progress their own operations meanwhile: one progress engine serves them
//!   all. A thread that takes the engine back right after giving it up, while others wait
//!   for it, first lets one of them in, so that a thread polling in a loop cannot starve the
//!   rest.
//!
//! This module holds all the `unsafe` of the thread model: the engine lives in an
//! `UnsafeCell` and the guard hands out `&mut Engine` under the rules above.

use std::cell::{Cell, UnsafeCell};
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64};
use std::sync::{Mutex, PoisonError};

use tmpi_transport::shm::futex;

use crate::engine::{Backoff, Engine, Need, ReqId};
use crate::error::{Error, Result};
use crate::Status;

/// How the threads of a process may use tmpi: MPI's thread levels (`MPI_THREAD_*`), from the
/// most restrictive to the least. Chosen once, with [`crate::init_thread`]; [`crate::init`]
/// chooses [`Threading::Single`].
///
/// Whatever the level, every tmpi type that can be is `Send + Sync`, and breaking the level's
/// rule is an [`Error::Thread`], never undefined behaviour.
///
/// ```
/// use tmpi::Threading;
/// let sums = tmpi::run_local_threaded(2, Threading::Multiple, |w| {
///     let peer = 1 - w.rank();
///     // Four threads per rank, each talking to the same thread of the peer on its own tag.
///     std::thread::scope(|s| {
///         let hs: Vec<_> = (0..4u32)
///             .map(|t| {
///                 let w = &*w;
///                 s.spawn(move || {
///                     let mut got = [0u32];
///                     w.sendrecv(&[t], peer, t, &mut got, peer, t).unwrap();
///                     got[0]
///                 })
///             })
///             .collect();
///         hs.into_iter().map(|h| h.join().unwrap()).sum::<u32>()
///     })
/// });
/// assert_eq!(sums, vec![6, 6]);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Threading {
    /// One thread: only the thread that started the runtime calls tmpi
    /// (`MPI_THREAD_SINGLE`). A call from another thread fails with [`Error::Thread`].
    Single,
    /// The process may have other threads, but only the thread that started the runtime calls
    /// tmpi (`MPI_THREAD_FUNNELED`). In tmpi this is the same as [`Threading::Single`].
    Funneled,
    /// Any thread may call, but never two at once: the program orders them
    /// (`MPI_THREAD_SERIALIZED`). A call made while another thread is inside one fails with
    /// [`Error::Thread`] (it does not wait). A blocking call keeps the engine while it waits.
    Serialized,
    /// Any thread may call at any time (`MPI_THREAD_MULTIPLE`): sends, receives, probes and
    /// waits from several threads at once, with one progress engine and MPI's ordering for
    /// each pair of sending and receiving threads. Two collectives on one communicator at once
    /// are erroneous, as in MPI: the later one fails with [`Error::Thread`].
    Multiple,
}

impl Threading {
    /// Whether a thread other than the one that started the runtime may call.
    fn any_thread(self) -> bool {
        self >= Threading::Serialized
    }
}

/// A number for the calling thread, unique for the life of the process (never reused, unlike
/// a thread's stack or TLS address); 0 is never a thread's.
#[inline]
pub(crate) fn thread_token() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    thread_local! {
        static TOKEN: Cell<u64> = const { Cell::new(0) };
    }
    #[cold]
    #[inline(never)]
    fn first(t: &Cell<u64>) -> u64 {
        let v = NEXT.fetch_add(1, Relaxed);
        t.set(v);
        v
    }
    TOKEN.with(|t| {
        let v = t.get();
        if v != 0 {
            v
        } else {
            first(t)
        }
    })
}

/// Yields a thread gives away at most, when it takes the engine back right after letting it
/// go while others wait (a bound in case the waiter is descheduled for long).
const HANDOFF_YIELDS: u32 = 64;

/// A rank's engine and who may use it; see the module docs.
pub(crate) struct EngineCell {
    level: Threading,
    /// Token of the thread that started the runtime.
    started_by: u64,
    /// `Single`, `Funneled`: the token [`EngineCell::lock`]'s fast path admits; `started_by`
    /// until [`EngineCell::close`], then 0 (no thread's), so that every later call takes the
    /// slow path, which reports the closing.
    owner: AtomicU64,
    /// Set by [`EngineCell::close`] (the world was finalized): calls fail, clean-up still runs.
    closed: AtomicBool,
    /// Token of the thread holding a guard, 0 when none. Written only by the holder (set on
    /// taking, cleared before giving back), so a thread that reads its own token holds it.
    holder: AtomicU64,
    /// `Serialized`, `Multiple`: taken for as long as a guard has the engine.
    lock: RawLock,
    /// `Multiple`: threads blocked on `lock`.
    waiting: AtomicU64,
    /// `Multiple`: times `lock` was taken (written under it).
    turns: AtomicU64,
    /// `Multiple`: token of the thread that took `lock` last.
    last: AtomicU64,
    eng: UnsafeCell<Engine>,
}

// SAFETY: the engine (the only field that is not `Sync` by itself) is reached only through an
// `EngineGuard`, and a guard exists only where `lock` admitted the calling thread: at
// `Single`/`Funneled` that thread is `started_by` (tokens are never reused, so no other thread
// can pass for it, not even after it ended) and `holder` is zero, so there is one guard at a
// time, on one thread; at `Serialized`/`Multiple` the guard holds `lock`, so one guard at a
// time in the process, and the mutex orders each guard's accesses before the next one's.
// Sending the cell to another thread needs `Engine: Send` (see `crate::engine`).
unsafe impl Sync for EngineCell {}

impl EngineCell {
    /// A cell for `eng`, owned by the calling thread, used at `level`.
    pub(crate) fn new(eng: Engine, level: Threading) -> Self {
        EngineCell {
            level,
            started_by: thread_token(),
            owner: AtomicU64::new(thread_token()),
            closed: AtomicBool::new(false),
            holder: AtomicU64::new(0),
            lock: RawLock(AtomicU32::new(0)),
            waiting: AtomicU64::new(0),
            turns: AtomicU64::new(0),
            last: AtomicU64::new(0),
            eng: UnsafeCell::new(eng),
        }
    }

    /// The thread level this engine was started at.
    pub(crate) fn level(&self) -> Threading {
        self.level
    }

    fn error(&self, what: &'static str) -> Error {
        Error::Thread { level: self.level, what }
    }

    /// Takes the engine for a call, as the level allows (see the module docs).
    ///
    /// # Errors
    /// [`Error::Thread`]: at `Single`/`Funneled` from a thread other than the one that
    /// started the runtime; at `Serialized` while another thread is inside a call; at any
    /// level from inside another call on the same thread (a user operation calling tmpi).
    /// [`Error::State`]: the world was finalized ([`EngineCell::close`]).
    #[inline]
    pub(crate) fn lock(&self) -> Result<EngineGuard<'_>> {
        self.take(false)
    }

    /// [`EngineCell::lock`] and [`EngineCell::lock_for_cleanup`]: inline, the case that needs
    /// no further check (at `Single`/`Funneled`, the starting thread while the world is open
    /// and no guard is out); the rest in [`EngineCell::lock_slow`].
    #[inline(always)]
    fn take(&self, cleanup: bool) -> Result<EngineGuard<'_>> {
        let me = thread_token();
        if !self.level.any_thread() && me == self.owner.load(Relaxed) && self.holder.load(Relaxed) == 0 {
            self.holder.store(me, Relaxed);
            return Ok(EngineGuard { cell: self });
        }
        self.lock_slow(me, cleanup)
    }

    /// [`EngineCell::lock`] at `Serialized`/`Multiple`, its errors at the other levels, and
    /// (with `cleanup`) the engine after [`EngineCell::close`].
    #[cold]
    #[inline(never)]
    fn lock_slow(&self, me: u64, cleanup: bool) -> Result<EngineGuard<'_>> {
        if !cleanup && self.closed.load(Acquire) {
            return Err(Error::State("a tmpi call after the world was finalized (a communicator, request or message outlived it)".into()));
        }
        let nested = || self.error("a tmpi call from inside another (a user operation calling tmpi?)");
        if !self.level.any_thread() {
            if me != self.started_by {
                return Err(self.error("a call from a thread other than the one that started the runtime"));
            }
            if self.holder.load(Relaxed) != 0 {
                return Err(nested());
            }
            // The starting thread, no guard out: the closed engine, for clean-up.
            self.holder.store(me, Relaxed);
            return Ok(EngineGuard { cell: self });
        }
        if self.holder.load(Relaxed) == me {
            return Err(nested());
        }
        if self.level == Threading::Multiple {
            self.acquire(me);
        } else if cleanup {
            // Clean-up must happen: wait for the engine instead of failing.
            self.lock.lock();
        } else if !self.lock.try_lock() {
            return Err(self.error("two threads called at once"));
        }
        self.holder.store(me, Relaxed);
        Ok(EngineGuard { cell: self })
    }

    /// [`EngineCell::lock`] for clean-up paths (the end of a scope, a dropped communicator or
    /// message, finalize itself): at `Serialized` it waits for the engine instead of failing,
    /// since the clean-up must happen, and it still admits calls after [`EngineCell::close`].
    ///
    /// # Errors
    /// As [`EngineCell::lock`], except the `Serialized` case and the closing.
    #[inline]
    pub(crate) fn lock_for_cleanup(&self) -> Result<EngineGuard<'_>> {
        self.take(true)
    }

    /// Marks the world finalized: from now on [`EngineCell::lock`] fails with
    /// [`Error::State`] (MPI calls any call after `MPI_Finalize` erroneous; here it is a clear
    /// error), while [`EngineCell::lock_for_cleanup`] still admits the clean-up of whatever
    /// outlived the world.
    pub(crate) fn close(&self) {
        self.closed.store(true, Release);
        self.owner.store(0, Relaxed);
    }

    /// Whether [`EngineCell::close`] was called.
    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Acquire)
    }

    /// Takes the mutex (`Multiple`), first letting a waiting thread in if this thread had it
    /// last.
    fn acquire(&self, me: u64) {
        if self.waiting.load(Relaxed) != 0 && self.last.load(Relaxed) == me {
            let turn = self.turns.load(Relaxed);
            for _ in 0..HANDOFF_YIELDS {
                if self.waiting.load(Relaxed) == 0 || self.turns.load(Relaxed) != turn {
                    break;
                }
                std::thread::yield_now();
            }
        }
        if !self.lock.try_lock() {
            self.waiting.fetch_add(1, Relaxed);
            self.lock.lock();
            self.waiting.fetch_sub(1, Relaxed);
        }
        self.turns.store(self.turns.load(Relaxed).wrapping_add(1), Relaxed);
        self.last.store(me, Relaxed);
    }
}

/// How long a thread sleeps on the lock's futex at most before it looks again (a safety net:
/// every release that saw a sleeper wakes it).
const LOCK_NAP: std::time::Duration = std::time::Duration::from_millis(50);

/// The engine's mutex at `Serialized`/`Multiple`: a futex word, 0 free, 1 taken, 2 taken with
/// a thread asleep on it. Unlike `std::sync::Mutex` it has no guard type, so that
/// [`EngineGuard`] is one pointer at every level: at `Single` the guard is built and dropped
/// in registers (an `Option<MutexGuard>` field cost ~5 ns per call in a store-forwarding
/// stall, measured with `comm_window_cost`).
struct RawLock(AtomicU32);

impl RawLock {
    /// Takes the lock if it is free.
    fn try_lock(&self) -> bool {
        self.0.compare_exchange(0, 1, Acquire, Relaxed).is_ok()
    }

    /// Takes the lock, spinning a little, then sleeping on the word until it is given back.
    fn lock(&self) {
        for _ in 0..64 {
            if self.0.load(Relaxed) == 0 && self.try_lock() {
                return;
            }
            std::hint::spin_loop();
        }
        // Marked "with a sleeper" whenever this thread may sleep, so the holder wakes it.
        while self.0.swap(2, Acquire) != 0 {
            futex::wait(&self.0, 2, LOCK_NAP);
        }
    }

    /// Gives the lock back (the caller holds it), waking a sleeper if there may be one.
    fn unlock(&self) {
        if self.0.swap(0, Release) == 2 {
            futex::wake(&self.0);
        }
    }
}

/// The engine, taken by one call (see [`EngineCell::lock`]). Derefs to [`Engine`]; its
/// waiting methods ([`EngineGuard::wait`], [`EngineGuard::wait_until`],
/// [`EngineGuard::idle`]) stand in for the engine's own and, at [`Threading::Multiple`], let go
/// of the engine between rounds of progress.
///
/// At `Serialized`/`Multiple` a guard always holds the cell's lock (also on unwinding out of
/// [`EngineGuard::pause`], which takes it back first), and gives it back when dropped.
pub(crate) struct EngineGuard<'a> {
    cell: &'a EngineCell,
}

impl EngineGuard<'_> {
    /// Whether this guard holds `cell`'s engine.
    #[inline]
    pub(crate) fn holds(&self, cell: &EngineCell) -> bool {
        std::ptr::eq(self.cell, cell)
    }
}

impl Drop for EngineGuard<'_> {
    #[inline]
    fn drop(&mut self) {
        // Cleared before the lock is given back.
        self.cell.holder.store(0, Relaxed);
        if self.cell.level.any_thread() {
            self.cell.lock.unlock();
        }
    }
}

impl std::ops::Deref for EngineGuard<'_> {
    type Target = Engine;
    #[inline]
    fn deref(&self) -> &Engine {
        // SAFETY: this guard is the only one (see `unsafe impl Sync for EngineCell`), and it
        // gives out the engine only while it holds it (`pause` takes `&mut self`, so no
        // reference from here lives across it).
        unsafe { &*self.cell.eng.get() }
    }
}

impl std::ops::DerefMut for EngineGuard<'_> {
    #[inline]
    fn deref_mut(&mut self) -> &mut Engine {
        // SAFETY: as in `deref`; `&mut self` makes this the only reference from this guard.
        unsafe { &mut *self.cell.eng.get() }
    }
}

impl EngineGuard<'_> {
    fn multiple(&self) -> bool {
        self.cell.level == Threading::Multiple
    }

    /// Runs `f` without the engine at [`Threading::Multiple`] (other threads may take it
    /// meanwhile), then takes it back; at the other levels just runs `f`.
    pub(crate) fn pause<R>(&mut self, f: impl FnOnce() -> R) -> R {
        if !self.multiple() {
            return f();
        }
        /// Takes the engine back when dropped, so the guard holds it again even if `f`
        /// unwinds.
        struct Retake<'a>(&'a EngineCell, u64);
        impl Drop for Retake<'_> {
            fn drop(&mut self) {
                self.0.acquire(self.1);
                self.0.holder.store(self.1, Relaxed);
            }
        }
        let me = thread_token();
        self.cell.holder.store(0, Relaxed);
        self.cell.lock.unlock();
        let _retake = Retake(self.cell, me);
        f()
    }

    /// One step of `b`'s back-off, as [`Engine::idle`]; at [`Threading::Multiple`] without
    /// the engine (a plain spin, yield or sleep: the doorbell belongs to the whole rank).
    pub(crate) fn idle(&mut self, b: &mut Backoff, busy: impl FnOnce(&tmpi_transport::shm::segment::Segment) -> bool) -> bool {
        if self.multiple() {
            self.pause(|| b.snooze())
        } else {
            (**self).idle(b, busy)
        }
    }

    /// Progresses until `rid` completes, as [`Engine::wait`], letting go of the engine
    /// between rounds at [`Threading::Multiple`].
    ///
    /// # Errors
    /// The request's error; [`Error::PeerGone`] when it cannot complete.
    #[inline]
    pub(crate) fn wait(&mut self, rid: ReqId) -> Result<Status> {
        if !self.multiple() {
            return (**self).wait(rid);
        }
        let mut b = self.backoff();
        loop {
            if let Some(r) = self.take_if_done(rid) {
                return r;
            }
            if self.round(&mut b)? {
                self.check_gone(&Need::Req(rid))?;
            }
        }
    }

    /// Progresses until `done(engine)` holds, as [`Engine::wait_until`], letting go of the
    /// engine between rounds at [`Threading::Multiple`].
    ///
    /// # Errors
    /// A failure of progress; [`Error::PeerGone`] when `need` cannot be met.
    pub(crate) fn wait_until(&mut self, need: &Need, mut done: impl FnMut(&mut Engine) -> bool) -> Result<()> {
        if !self.multiple() {
            return (**self).wait_until(need, done);
        }
        let mut b = self.backoff();
        while !done(self) {
            if self.round(&mut b)? {
                self.check_gone(need)?;
            }
        }
        Ok(())
    }

    /// One round of progress, then a pause without the engine (a back-off step if nothing
    /// happened); true when it is time for liveness checks.
    fn round(&mut self, b: &mut Backoff) -> Result<bool> {
        if self.progress()? == 0 {
            Ok(self.pause(|| b.snooze()))
        } else {
            b.reset();
            self.pause(|| ());
            Ok(false)
        }
    }
}

/// A `Copy` value shared by the threads of a communicator (its collective counter and
/// shared-memory slot): `Cell`'s `get`/`set` over a mutex, so communicators are `Sync`.
#[derive(Debug, Default)]
pub(crate) struct SyncCell<T: Copy>(Mutex<T>);

impl<T: Copy> SyncCell<T> {
    pub(crate) fn get(&self) -> T {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn set(&self, v: T) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = v;
    }

    /// Returns the value and replaces it with `f(value)`, atomically.
    pub(crate) fn update(&self, f: impl FnOnce(T) -> T) -> T {
        let mut g = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let old = *g;
        *g = f(old);
        old
    }
}

/// Marks a communicator as inside a collective call, so that two threads cannot run
/// collectives on it at once (erroneous in MPI; here an [`Error::Thread`], never a race on
/// its shared-memory slots). Nested calls of one thread (a communicator constructor running
/// its allreduces) are fine.
#[derive(Debug, Default)]
pub(crate) struct CollBusy(AtomicU64);

impl CollBusy {
    /// Enters a collective on the calling thread: `Ok(true)` if this call must [`leave`]
    /// (it entered first), `Ok(false)` when nested.
    ///
    /// [`leave`]: CollBusy::leave
    ///
    /// # Errors
    /// [`Error::Thread`] when another thread is inside a collective on the communicator.
    pub(crate) fn enter(&self, level: Threading) -> Result<bool> {
        if !level.any_thread() {
            // One thread only: nothing can overlap.
            return Ok(false);
        }
        let me = thread_token();
        match self.0.compare_exchange(0, me, std::sync::atomic::Ordering::Acquire, Relaxed) {
            Ok(_) => Ok(true),
            Err(t) if t == me => Ok(false),
            Err(_) => Err(Error::Thread { level, what: "two collectives on one communicator at once" }),
        }
    }

    /// Leaves what [`CollBusy::enter`] entered with `Ok(true)`.
    pub(crate) fn leave(&self) {
        self.0.store(0, std::sync::atomic::Ordering::Release);
    }
}

/// What the thread model promises, checked when the crate builds.
const _: () = {
    const fn send_sync<T: Send + Sync>() {}
    send_sync::<crate::Comm>();
    send_sync::<crate::World>();
    send_sync::<crate::Message>();
    send_sync::<crate::Request<'static>>();
    send_sync::<crate::CartComm>();
};

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::Threading;
    use crate::coll_ctx::CollCtx;
    use crate::{run_local_threaded, scope, Error, UserOp, ANY_SOURCE};

    fn is_thread_error<T: std::fmt::Debug>(r: crate::Result<T>) -> bool {
        matches!(r, Err(Error::Thread { .. }))
    }

    #[test]
    fn single_and_funneled_refuse_other_threads() {
        for level in [Threading::Single, Threading::Funneled] {
            let ok = run_local_threaded(2, level, |w| {
                let w = &*w;
                let peer = 1 - w.rank();
                let from_other = std::thread::scope(|s| s.spawn(|| w.send(&[1u8], peer, 0)).join().expect("thread"));
                let refused = is_thread_error(from_other);
                // The owner thread is unaffected.
                let mut b = [0u8];
                w.sendrecv(&[7u8], peer, 1, &mut b, peer, 1).expect("sendrecv");
                refused && b[0] == 7 && w.threading() == level
            });
            assert_eq!(ok, vec![true, true], "{level:?}");
        }
    }

    #[test]
    fn serialized_takes_turns_and_refuses_overlap() {
        let ok = run_local_threaded(2, Threading::Serialized, |w| {
            let w = &*w;
            let peer = 1 - w.rank();
            // Threads one after the other: fine.
            for t in 0..3u8 {
                let got = std::thread::scope(|s| {
                    s.spawn(|| {
                        let mut b = [0u8];
                        w.sendrecv(&[t], peer, u32::from(t), &mut b, peer, u32::from(t)).map(|_| b[0])
                    })
                    .join()
                    .expect("thread")
                });
                assert_eq!(got.expect("turn"), t);
            }
            // A thread calling while another holds the engine is refused, not made to wait.
            let held = w.inner.eng.lock().expect("lock");
            let other = std::thread::scope(|s| s.spawn(|| w.iprobe(ANY_SOURCE, 0)).join().expect("thread"));
            drop(held);
            is_thread_error(other) && w.iprobe(ANY_SOURCE, 0).is_ok()
        });
        assert_eq!(ok, vec![true, true]);
    }

    #[test]
    fn a_user_op_calling_tmpi_gets_an_error_not_a_panic() {
        for level in [Threading::Single, Threading::Multiple] {
            let ok = run_local_threaded(2, level, |w| {
                let comm = w.dup().expect("dup");
                let seen = std::sync::Arc::new(Mutex::new(None));
                let seen2 = seen.clone();
                let op = UserOp::new(true, move |a: &u32, b: &u32| {
                    *seen2.lock().expect("seen") = Some(comm.iprobe(ANY_SOURCE, 0).map(|_| ()));
                    a + b
                });
                let mut out = [0u32];
                w.allreduce_with(&[w.rank() as u32 + 1], &mut out, &op).expect("allreduce_with");
                let inner = seen.lock().expect("seen").take();
                // Where the op ran (at least one rank combines), its call was refused.
                assert_eq!(out[0], 3);
                inner.map(is_thread_error)
            });
            assert!(ok.iter().all(|r| *r != Some(false)) && ok.contains(&Some(true)), "{level:?}: {ok:?}");
        }
    }

    #[test]
    fn multiple_threads_exchange_in_order() {
        const THREADS: u32 = 4;
        const MSGS: u32 = 500;
        let ok = run_local_threaded(3, Threading::Multiple, |w| {
            let w = &*w;
            let (rank, n) = (w.rank(), w.size());
            std::thread::scope(|s| {
                let hs: Vec<_> = (0..THREADS)
                    .map(|t| {
                        s.spawn(move || {
                            let mut next = vec![0u32; n];
                            for i in 0..MSGS {
                                for p in (0..n).filter(|&p| p != rank) {
                                    w.send(&[rank as u32, t, i], p, t).expect("send");
                                }
                                // Any source, this thread's tag: per source, in order.
                                for _ in 1..n {
                                    let mut m = [0u32; 3];
                                    let st = w.recv(&mut m, ANY_SOURCE, t).expect("recv");
                                    let src = st.source();
                                    assert_eq!(m[..2], [src as u32, t], "content");
                                    assert_eq!(m[2], next[src], "order from {src}");
                                    next[src] += 1;
                                }
                            }
                            next.iter().enumerate().all(|(p, &c)| p == rank || c == MSGS)
                        })
                    })
                    .collect();
                hs.into_iter().all(|h| h.join().expect("thread"))
            })
        });
        assert_eq!(ok, vec![true; 3]);
    }

    #[test]
    fn a_thread_blocked_in_recv_does_not_block_the_others() {
        // Rank 1's thread A waits for tag 1, which rank 0 sends only after it received tag 2
        // from rank 1's thread B: with the engine held for the whole wait, this would hang.
        let ok = run_local_threaded(2, Threading::Multiple, |w| {
            let w = &*w;
            if w.rank() == 0 {
                let mut b = [0u8];
                w.recv(&mut b, 1, 2).expect("recv 2");
                w.send(&[b[0] + 1], 1, 1).expect("send 1");
                true
            } else {
                std::thread::scope(|s| {
                    let a = s.spawn(|| {
                        let mut b = [0u8];
                        w.recv(&mut b, 0, 1).expect("recv 1");
                        b[0]
                    });
                    let b = s.spawn(|| {
                        std::thread::sleep(std::time::Duration::from_millis(20));
                        w.send(&[41u8], 0, 2).expect("send 2");
                    });
                    b.join().expect("b");
                    a.join().expect("a") == 42
                })
            }
        });
        assert_eq!(ok, vec![true, true]);
    }

    #[test]
    fn requests_from_several_threads_and_a_leaked_one() {
        let ok = run_local_threaded(2, Threading::Multiple, |w| {
            let w = &*w;
            let peer = 1 - w.rank();
            std::thread::scope(|ts| {
                let hs: Vec<_> = (0..3u32)
                    .map(|t| {
                        ts.spawn(move || {
                            let sbuf = [t, w.rank() as u32];
                            let mut rbuf = [0u32; 2];
                            let mut leaked = [0u32; 2];
                            scope(|s| {
                                let r = w.irecv(s, &mut rbuf, peer, t).expect("irecv");
                                let l = w.irecv(s, &mut leaked, peer, 100 + t).expect("irecv leaked");
                                // The scope still completes it before `leaked` is read.
                                #[allow(clippy::forget_non_drop)]
                                std::mem::forget(l);
                                let a = w.isend(s, &sbuf, peer, t).expect("isend");
                                let b = w.isend(s, &sbuf, peer, 100 + t).expect("isend 2");
                                // A request may be waited on by another thread.
                                let st = std::thread::scope(|x| x.spawn(move || r.wait()).join().expect("waiter")).expect("wait");
                                assert_eq!(st.source(), peer);
                                crate::wait_all(vec![a, b]).expect("sends");
                            });
                            rbuf == [t, peer as u32] && leaked == [t, peer as u32]
                        })
                    })
                    .collect();
                hs.into_iter().all(|h| h.join().expect("thread"))
            })
        });
        assert_eq!(ok, vec![true, true]);
    }

    #[test]
    fn two_collectives_on_one_communicator_at_once_are_an_error() {
        let ok = run_local_threaded(2, Threading::Multiple, |w| {
            let w = &*w;
            let d = w.dup().expect("dup");
            // This thread is inside a collective on the world...
            let c = CollCtx::new(w);
            // ...so another thread's collective on it fails, blocking or not; one on another
            // communicator does not, and neither does the world's once the first call ended.
            let (other, other_nb, on_dup) = std::thread::scope(|s| {
                s.spawn(|| {
                    let nb = scope(|sc| w.ibarrier(sc).map(drop));
                    (w.barrier(), nb, d.barrier())
                })
                .join()
                .expect("thread")
            });
            drop(c);
            let after = w.barrier();
            is_thread_error(other) && is_thread_error(other_nb) && on_dup.is_ok() && after.is_ok()
        });
        assert_eq!(ok, vec![true, true]);
    }

    #[test]
    fn collectives_on_different_communicators_from_different_threads() {
        let ok = run_local_threaded(3, Threading::Multiple, |w| {
            let comms: Vec<_> = (0..3).map(|_| w.dup().expect("dup")).collect();
            std::thread::scope(|s| {
                let hs: Vec<_> = comms
                    .iter()
                    .enumerate()
                    .map(|(i, c)| {
                        s.spawn(move || {
                            let mut sum = [0u64];
                            for _ in 0..50 {
                                c.allreduce(&[i as u64 + 1], &mut sum, crate::Op::Sum).expect("allreduce");
                                c.barrier().expect("barrier");
                            }
                            sum[0] == 3 * (i as u64 + 1)
                        })
                    })
                    .collect();
                hs.into_iter().all(|h| h.join().expect("thread"))
            })
        });
        assert_eq!(ok, vec![true; 3]);
    }
}
