//! `MPI_Cart_map`: where this rank would sit in a Cartesian grid.

use crate::error::{Error, Result};
use crate::{Comm, Rank};

impl Comm {
    /// The rank this process would have in a Cartesian grid of `dims` over this communicator
    /// (`MPI_Cart_map`), or `None` when the grid has fewer places than the communicator has
    /// ranks and this one is left out. tmpi keeps ranks in order (rank `r` gets place `r`):
    /// [`Comm::cart_create`] with `reorder` does the same, so the answer is what a later
    /// `cart_create` gives. Local: no communication.
    ///
    /// ```
    /// let got = tmpi::run_local(3, |w| w.cart_map(&[2], &[false]).unwrap());
    /// assert_eq!(got, vec![Some(0), Some(1), None]);
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidTopology`] when `periods` and `dims` differ in length or the grid has
    /// more places than the communicator has ranks.
    pub fn cart_map(&self, dims: &[usize], periods: &[bool]) -> Result<Option<Rank>> {
        if dims.len() != periods.len() {
            return Err(Error::InvalidTopology(format!("cart_map: {} dimensions but {} periods", dims.len(), periods.len())));
        }
        let places = dims.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
        match places {
            Some(p) if p <= self.size() => Ok((self.rank() < p).then_some(self.rank())),
            _ => Err(Error::InvalidTopology(format!("cart_map: a grid of {dims:?} has more places than the {} ranks", self.size()))),
        }
    }
}
