//! The names and typed attributes a communicator holds ([`Attrs`], a field of its shared
//! state, so they go when its last handle goes); [`crate::names`] is the API on them.

use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

/// A type that can be attached to communicators. See the [module docs](crate::names).
pub trait Attribute: Any + Send + Sync + Sized {
    /// The value the duplicate of a communicator gets ([`crate::Comm::dup`]); `None`: not
    /// copied.
    fn copy_on_dup(&self) -> Option<Self> {
        None
    }
}

/// An attribute as a communicator stores it.
pub(crate) trait Stored: Send + Sync {
    fn as_any(&self) -> &dyn Any;
    fn copy(&self) -> Option<Box<dyn Stored>>;
}

impl<A: Attribute> Stored for A {
    fn as_any(&self) -> &dyn Any {
        self
    }
    fn copy(&self) -> Option<Box<dyn Stored>> {
        self.copy_on_dup().map(|a| Box::new(a) as Box<dyn Stored>)
    }
}

/// What a communicator's attribute calls share.
#[derive(Default)]
pub(crate) struct Entry {
    pub(crate) name: Option<String>,
    pub(crate) attrs: HashMap<TypeId, Box<dyn Stored>>,
}

/// A communicator's name and attributes, shared by its clones. The values' `Drop` (MPI's
/// delete callback) runs outside the lock: when a value is replaced or deleted, and when the
/// communicator's shared state goes.
#[derive(Default)]
pub(crate) struct Attrs(Mutex<Entry>);

impl Attrs {
    /// The entry, locked (a panic while it was held left nothing half done: each change is
    /// one map operation).
    pub(crate) fn lock(&self) -> MutexGuard<'_, Entry> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Copies of the attributes that ask to be copied to a duplicate.
    pub(crate) fn copies(&self) -> Vec<(TypeId, Box<dyn Stored>)> {
        self.lock().attrs.iter().filter_map(|(k, v)| v.copy().map(|c| (*k, c))).collect()
    }
}
