//! The process-wide state `initialize` sets up (the world, the threading level provided, the
//! main thread) and what the other modules ask of it: the world's handle, whether a datatype
//! may be built on this thread, the job's abort.

use std::sync::RwLock;
use std::thread::ThreadId;

/// Threading levels (`MPI_THREAD_*`), ordered.
#[derive(Copy, Clone, PartialEq, Eq, PartialOrd, Ord, Debug)]
pub enum Threading {
    /// One thread.
    Single,
    /// Only the main thread calls.
    Funneled,
    /// Any thread, one at a time.
    Serialized,
    /// Any thread, at any time.
    Multiple,
}

impl Threading {
    pub(crate) fn to_tmpi(self) -> tmpi::Threading {
        match self {
            Threading::Single => tmpi::Threading::Single,
            Threading::Funneled => tmpi::Threading::Funneled,
            Threading::Serialized => tmpi::Threading::Serialized,
            Threading::Multiple => tmpi::Threading::Multiple,
        }
    }

    pub(crate) fn from_tmpi(t: tmpi::Threading) -> Threading {
        match t {
            tmpi::Threading::Single => Threading::Single,
            tmpi::Threading::Funneled => Threading::Funneled,
            tmpi::Threading::Serialized => Threading::Serialized,
            _ => Threading::Multiple,
        }
    }
}

pub(crate) struct State {
    pub(crate) world: Option<tmpi::World>,
    pub(crate) threading: Threading,
    pub(crate) main_thread: ThreadId,
}

/// The runtime of this process; `None` before `initialize`; `Some` with `world: None` after
/// the universe was dropped (finalized).
pub(crate) static STATE: RwLock<Option<State>> = RwLock::new(None);

/// The world communicator's tmpi handle, panicking (naming `call`) outside init..finalize.
pub(crate) fn world_comm(call: &str) -> tmpi::Comm {
    let st = STATE.read().unwrap_or_else(|p| p.into_inner());
    match st.as_ref() {
        None => panic!("mpi: {call} before mpi::initialize"),
        Some(State { world: None, .. }) => panic!("mpi: {call} after the universe was dropped (finalized)"),
        Some(State { world: Some(w), .. }) => (**w).clone(),
    }
}

/// Panics unless datatypes may be built on this thread now (see `#[derive(Equivalence)]`).
pub(crate) fn check_datatype_thread(type_name: &str) {
    let st = STATE.read().unwrap_or_else(|p| p.into_inner());
    match st.as_ref() {
        None => panic!("mpi: the datatype of {type_name} was built before mpi::initialize"),
        Some(State { world: None, .. }) => panic!("mpi: the datatype of {type_name} was built after the universe was dropped"),
        Some(s) => {
            if s.threading != Threading::Multiple && std::thread::current().id() != s.main_thread {
                panic!(
                    "mpi: the datatype of {type_name} was first built on a thread other than the main one while the threading level is {:?} (build it on the main thread first, or initialize with Threading::Multiple)",
                    s.threading
                );
            }
        }
    }
}

/// Ends the whole job with `code` (`MPI_Abort`).
pub(crate) fn abort(code: i32) -> ! {
    let st = STATE.read().unwrap_or_else(|p| p.into_inner());
    if let Some(State { world: Some(w), .. }) = st.as_ref() {
        w.abort(code)
    }
    std::process::exit(code)
}
