//! Typed communicator attributes (rsmpi's `CommAttribute`).
//!
//! An attribute is a value of a type implementing [`CommAttribute`], at most one per type on a
//! communicator. [`Communicator::duplicate`](crate::traits::Communicator::duplicate) clones it
//! onto the new communicator when the type says `CLONE_ON_DUP` (MPI's copy callback); it is
//! dropped when replaced or when its communicator is dropped (MPI's delete callback).

use std::any::Any;

/// The traits of this module that `mpi::traits::*` brings in.
pub mod traits {
    pub use super::CommAttribute;
}

/// A type that can be attached to communicators.
pub trait CommAttribute: 'static + Sized + Clone {
    /// Whether `duplicate` clones the attribute onto the new communicator.
    const CLONE_ON_DUP: bool = false;
}

/// A stored attribute, type-erased.
pub(crate) trait AttrEntry {
    fn as_any(&self) -> &dyn Any;
    fn dup_entry(&self) -> Option<Box<dyn AttrEntry>>;
}

/// A stored attribute of type `A`.
pub(crate) struct Entry<A>(pub(crate) A);

impl<A: CommAttribute> AttrEntry for Entry<A> {
    fn as_any(&self) -> &dyn Any {
        &self.0
    }
    fn dup_entry(&self) -> Option<Box<dyn AttrEntry>> {
        if A::CLONE_ON_DUP {
            Some(Box::new(Entry(self.0.clone())))
        } else {
            None
        }
    }
}
