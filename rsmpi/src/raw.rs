//! Access to raw handles (rsmpi's `AsRaw` family).

/// The traits of this module that `mpi::traits::*` brings in.
pub mod traits {
    pub use super::{AsRaw, AsRawMut, FromRaw, MatchesRaw};
}

/// Something with a raw handle.
///
/// # Safety
/// The handle must be valid while `self` lives.
pub unsafe trait AsRaw {
    /// The handle type.
    type Raw;
    /// The handle.
    fn as_raw(&self) -> Self::Raw;
}

// SAFETY: forwards to the pointee, which outlives the reference.
unsafe impl<T: AsRaw> AsRaw for &T {
    type Raw = T::Raw;
    fn as_raw(&self) -> T::Raw {
        (**self).as_raw()
    }
}

/// Something whose raw handle can be written.
///
/// # Safety
/// As [`AsRaw`].
pub unsafe trait AsRawMut: AsRaw {
    /// A pointer to the handle.
    fn as_raw_mut(&mut self) -> *mut Self::Raw;
}

/// Something that can be built from a raw handle.
pub trait FromRaw: AsRaw {
    /// Builds the value.
    ///
    /// # Safety
    /// The handle must be valid and of the right kind.
    unsafe fn from_raw(handle: Self::Raw) -> Self;
}

/// A type whose raw handle matches its kind.
///
/// # Safety
/// As [`AsRaw`].
pub unsafe trait MatchesRaw: AsRaw {}
