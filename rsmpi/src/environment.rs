//! Starting and stopping: the [`Universe`], threading levels, time and version queries.

pub use crate::state::Threading;
use crate::state::{State, STATE};
use crate::topology::SimpleCommunicator;

/// The MPI environment; finalizes when dropped.
#[derive(Debug)]
pub struct Universe {
    /// The size of the buffer attached for buffered sends (tmpi's `buffer_attach`).
    buffer: Option<usize>,
}

impl Universe {
    /// The world communicator.
    pub fn world(&self) -> SimpleCommunicator {
        SimpleCommunicator::world()
    }

    /// The universe size (the number of processes the job may hold): the world's size.
    pub fn size(&self) -> Option<usize> {
        Some(self.world().handle_size())
    }

    /// The application number of this process: the index of its command in the spawn that
    /// started it, else 0 (tmpirun starts one application).
    pub fn appnum(&self) -> Option<isize> {
        Some(tmpi::appnum().map_or(0, |a| a as isize))
    }

    /// The size of the attached buffer for buffered sends.
    pub fn buffer_size(&self) -> usize {
        self.buffer.unwrap_or(0)
    }

    /// Attaches a buffer of `size` bytes for buffered sends (detaching any previous one).
    pub fn set_buffer_size(&mut self, size: usize) {
        self.detach_buffer();
        if size > 0 {
            crate::ok(tmpi::buffer_attach(size), "set_buffer_size");
            self.buffer = Some(size);
        }
    }

    /// Detaches the buffer, first waiting until every buffered send has been handed over.
    pub fn detach_buffer(&mut self) {
        if self.buffer.take().is_some() {
            tmpi::buffer_detach();
        }
    }

    /// Disconnects from a parent job (this process has none: tmpirun does not spawn).
    pub fn disconnect_parent(&mut self) {}
}

impl Drop for Universe {
    fn drop(&mut self) {
        self.detach_buffer();
        let world = {
            let mut st = STATE.write().unwrap_or_else(|p| p.into_inner());
            st.as_mut().and_then(|s| s.world.take())
        };
        if let Some(w) = world {
            if let Err(e) = w.finalize() {
                eprintln!("mpi: finalize failed: {e}");
            }
        }
    }
}

/// Whether `initialize` has been called.
pub fn is_initialized() -> bool {
    STATE.read().map(|s| s.is_some()).unwrap_or(false)
}

/// Whether the universe has been dropped.
pub fn is_finalized() -> bool {
    STATE.read().map(|s| s.as_ref().is_some_and(|s| s.world.is_none())).unwrap_or(false)
}

/// Initializes the runtime (single-threaded use); `None` if it was initialized before.
pub fn initialize() -> Option<Universe> {
    initialize_with_threading(Threading::Single).map(|(u, _)| u)
}

/// Initializes the runtime asking for a threading level; returns the level provided (never
/// more than asked). `None` if it was initialized before.
pub fn initialize_with_threading(threading: Threading) -> Option<(Universe, Threading)> {
    let mut st = STATE.write().unwrap_or_else(|p| p.into_inner());
    if st.is_some() {
        return None;
    }
    let (world, provided) = match tmpi::init_thread(threading.to_tmpi()) {
        Ok(v) => v,
        Err(e) => panic!("mpi: initialize failed: {e}"),
    };
    let provided = Threading::from_tmpi(provided).min(threading);
    *st = Some(State { world: Some(world), threading: provided, main_thread: std::thread::current().id() });
    Some((Universe { buffer: None }, provided))
}

/// The threading level provided.
pub fn threading_support() -> Threading {
    STATE.read().ok().and_then(|s| s.as_ref().map(|s| s.threading)).unwrap_or(Threading::Single)
}

/// The MPI standard version the API follows: (major, minor).
pub fn version() -> (i32, i32) {
    let (major, minor) = tmpi::mpi_version();
    (major as i32, minor as i32)
}

/// The library's version string.
pub fn library_version() -> Result<String, std::string::FromUtf8Error> {
    Ok(tmpi::library_version())
}

/// The name of this host.
pub fn processor_name() -> Result<String, std::string::FromUtf8Error> {
    Ok(tmpi::processor_name())
}

/// Seconds since an arbitrary point (`MPI_Wtime`).
pub fn time() -> f64 {
    tmpi::wtime()
}

/// The resolution of [`time`] in seconds.
pub fn time_resolution() -> f64 {
    tmpi::wtick()
}
