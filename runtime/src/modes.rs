//! Ready-mode sends (`MPI_Rsend`, `MPI_Irsend`).
//!
//! A ready send tells the library that the matching receive is already posted. MPI lets an
//! implementation deliver it as a standard send, and tmpi does: it is correct whether or not
//! the receive was posted (where MPI would call the program erroneous), and costs what a
//! standard send costs.

use bytemuck::Pod;

use crate::{Comm, Rank, Request, Result, Scope, Tag};

impl Comm {
    /// Sends `buf` in ready mode (`MPI_Rsend`): the program asserts that the receive is
    /// posted. Delivered as [`Comm::send`].
    ///
    /// ```
    /// let got = tmpi::run_local(2, |w| {
    ///     if w.rank() == 1 {
    ///         let mut x = [0u32];
    ///         tmpi::scope(|s| {
    ///             let r = w.irecv(s, &mut x, 0, 3).unwrap();
    ///             w.barrier().unwrap();
    ///             r.wait().unwrap();
    ///         });
    ///         x[0]
    ///     } else {
    ///         w.barrier().unwrap();
    ///         w.rsend(&[7u32], 1, 3).unwrap();
    ///         0
    ///     }
    /// });
    /// assert_eq!(got[1], 7);
    /// ```
    ///
    /// # Errors
    /// As [`Comm::send`].
    pub fn rsend<T: Pod>(&self, buf: &[T], dest: Rank, tag: Tag) -> Result<()> {
        self.send(buf, dest, tag)
    }

    /// Starts a ready-mode send (`MPI_Irsend`); see [`Comm::rsend`].
    ///
    /// # Errors
    /// As [`Comm::isend`].
    pub fn irsend<'scope, T: Pod>(&self, s: &'scope Scope<'scope, '_>, buf: &'scope [T], dest: Rank, tag: Tag) -> Result<Request<'scope>> {
        self.isend(s, buf, dest, tag)
    }
}
