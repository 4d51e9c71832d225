//! Buffered-mode sends (`MPI_Bsend`, `MPI_Ibsend`, `MPI_Buffer_attach`, `MPI_Buffer_detach`).
//!
//! A buffered send copies the message into the process's attached buffer budget and returns
//! at once, whether or not a receive has matched; the copy goes out as the engine makes
//! progress. A send that does not fit what is left of the budget fails with
//! [`Error::InvalidBuffer`] and sends nothing (MPI's `MPI_ERR_BUFFER`). Each message takes
//! [`BSEND_OVERHEAD`] bytes of the budget beyond its data. [`buffer_detach`] waits until every
//! buffered message has been handed over. tmpi's standard `send` never needs the receiver to
//! post first either (eager with credit flow control, rendezvous past a threshold handled
//! without blocking the sender's program when non-blocking), so buffered mode exists for
//! programs written for MPI's semantics: it costs one copy.
//!
//! ```
//! let got = tmpi::run_local(2, |w| {
//!     if w.rank() == 0 {
//!         tmpi::buffer_attach(1 << 20).unwrap();
//!         // Returns before rank 1 posts its receive (rank 1 first waits for tag 2).
//!         w.bsend(&vec![7u8; 300_000], 1, 1).unwrap();
//!         w.send(&[1u8], 1, 2).unwrap();
//!         tmpi::buffer_detach();
//!         0
//!     } else {
//!         w.recv(&mut [0u8], 0, 2).unwrap();
//!         w.recv_vec::<u8>(0, 1).unwrap().0.len()
//!     }
//! });
//! assert_eq!(got[1], 300_000);
//! ```

use std::sync::Mutex;

use bytemuck::Pod;

use crate::detached::Detached;
use crate::error::{Error, Result};
use crate::request::{Request, Scope};
use crate::{Comm, Rank, Tag};

/// Bytes of the attached buffer each buffered message takes beyond its data.
pub const BSEND_OVERHEAD: usize = 96;

/// A buffered message on its way: the request owns a pointer into `data`, so it is declared
/// (and dropped) first.
struct InFlight {
    req: Detached,
    data: Vec<u8>,
}

struct Attached {
    /// Bytes attached (0: none).
    capacity: usize,
    in_flight: Vec<InFlight>,
}

static ATTACHED: Mutex<Attached> = Mutex::new(Attached { capacity: 0, in_flight: Vec::new() });

fn attached() -> std::sync::MutexGuard<'static, Attached> {
    ATTACHED.lock().unwrap_or_else(|p| p.into_inner())
}

/// Attaches a buffer budget of `size` bytes for buffered sends (`MPI_Buffer_attach`); one per
/// process.
///
/// # Errors
/// [`Error::InvalidBuffer`] when a buffer is attached already (detach it first).
pub fn buffer_attach(size: usize) -> Result<()> {
    let mut a = attached();
    if a.capacity != 0 {
        return Err(Error::InvalidBuffer(format!("buffer_attach: a buffer of {} bytes is attached already", a.capacity)));
    }
    a.capacity = size;
    Ok(())
}

/// Waits until every buffered message has been handed over, then detaches the buffer and
/// returns its size (`MPI_Buffer_detach`; 0 when none was attached). A message whose
/// transfer failed (its peer gone) is dropped here, as MPI leaves it to the error handler.
pub fn buffer_detach() -> usize {
    let (size, flights) = {
        let mut a = attached();
        (std::mem::take(&mut a.capacity), std::mem::take(&mut a.in_flight))
    };
    for mut f in flights {
        let _ = f.req.wait();
        drop(f.data);
    }
    size
}

/// The attached buffer's size (0: none).
pub fn buffer_size() -> usize {
    attached().capacity
}

impl Comm {
    /// Sends `buf` in buffered mode (`MPI_Bsend`): copies it into the attached budget and
    /// returns. See the [module docs](crate::bsend).
    ///
    /// # Errors
    /// [`Error::InvalidBuffer`] when it does not fit what is left of the attached buffer (or
    /// none is attached); as [`Comm::isend`].
    pub fn bsend<T: Pod>(&self, buf: &[T], dest: Rank, tag: Tag) -> Result<()> {
        let bytes: &[u8] = bytemuck::cast_slice(buf);
        let mut a = attached();
        a.in_flight.retain_mut(|f| !matches!(f.req.test(), Ok(Some(_)) | Err(_)));
        let used: usize = a.in_flight.iter().map(|f| f.data.len() + BSEND_OVERHEAD).sum();
        if used + bytes.len() + BSEND_OVERHEAD > a.capacity {
            return Err(Error::InvalidBuffer(format!(
                "bsend: a message of {} bytes does not fit the attached buffer ({used} of {} bytes in use, {BSEND_OVERHEAD} more per message)",
                bytes.len(),
                a.capacity
            )));
        }
        let data = bytes.to_vec();
        let (ptr, len) = (data.as_ptr(), data.len());
        let req = crate::scope(|s| -> Result<Detached> {
            // SAFETY: `data`'s heap storage (which does not move with the Vec) lives in the
            // in-flight list beside the request, which is dropped (abandoned) or waited for
            // before it.
            let lent: &[u8] = unsafe { std::slice::from_raw_parts(ptr, len) };
            let r = self.isend(s, lent, dest, tag)?;
            // SAFETY: as above: the buffer outlives the detached request.
            Ok(unsafe { r.detach(s) })
        })?;
        a.in_flight.push(InFlight { req, data });
        Ok(())
    }

    /// Starts a buffered send (`MPI_Ibsend`): the message is copied at once, so the request
    /// is complete when returned.
    ///
    /// # Errors
    /// As [`Comm::bsend`].
    pub fn ibsend<'scope, T: Pod>(&self, s: &'scope Scope<'scope, '_>, buf: &'scope [T], dest: Rank, tag: Tag) -> Result<Request<'scope>> {
        self.bsend(buf, dest, tag)?;
        Ok(Request::new(&self.inner.eng, None, s))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One test touches the process-wide buffer (tests run in threads of one process).
    #[test]
    fn attach_fit_and_detach() {
        assert!(buffer_attach(1000).is_ok());
        assert!(matches!(buffer_attach(10), Err(Error::InvalidBuffer(_))), "a second attach is refused");
        let out = crate::run_local(2, |w| {
            if w.rank() == 0 {
                let too_big = w.bsend(&[0u8; 1000], 1, 1);
                let fits = w.bsend(&[5u8; 100], 1, 1);
                crate::scope(|s| {
                    let r = w.ibsend(s, &[6u8; 100], 1, 1).unwrap();
                    r.wait().unwrap();
                });
                (matches!(too_big, Err(Error::InvalidBuffer(_))), fits.is_ok(), 0)
            } else {
                let a = w.recv_vec::<u8>(0, 1).unwrap().0;
                let b = w.recv_vec::<u8>(0, 1).unwrap().0;
                (true, true, a.len() + b.len() + usize::from(a[0] == 5 && b[0] == 6))
            }
        });
        assert_eq!(buffer_detach(), 1000);
        assert_eq!(buffer_size(), 0);
        assert_eq!(out, vec![(true, true, 0), (true, true, 201)]);
    }
}
