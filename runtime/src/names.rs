//! Communicator names and typed attributes (`MPI_Comm_set_name`, `MPI_Comm_set_attr` with
//! copy and delete callbacks).
//!
//! An attribute is a value of a type implementing [`Attribute`], at most one per type on a
//! communicator (the type is the key). [`Comm::dup`] asks each attribute for its copy
//! ([`Attribute::copy_on_dup`], MPI's copy callback; `None` by default: not copied). A value is
//! dropped (MPI's delete callback is its `Drop`) when it is replaced, deleted, or when the last
//! handle to its communicator is dropped. Clones of a `Comm` share its attributes and name.
//!
//! ```
//! #[derive(Clone, Debug, PartialEq)]
//! struct Tuning(u32);
//! impl tmpi::Attribute for Tuning {
//!     fn copy_on_dup(&self) -> Option<Self> {
//!         Some(self.clone())
//!     }
//! }
//! let ok = tmpi::run_local(2, |w| {
//!     w.set_attr(Tuning(3));
//!     let d = w.dup().unwrap();
//!     d.set_name("copy");
//!     (w.name(), d.name(), d.attr::<Tuning>())
//! });
//! assert_eq!(ok[0], ("MPI_COMM_WORLD".to_string(), "copy".to_string(), Some(Tuning(3))));
//! ```

use std::any::TypeId;

pub use crate::attrs::Attribute;
use crate::Comm;

/// Copies the attributes of `from` that ask for it onto its duplicate `to`.
pub(crate) fn copy_on_dup(from: &Comm, to: &Comm) {
    let copies = from.inner.attrs.copies();
    if !copies.is_empty() {
        to.inner.attrs.lock().attrs.extend(copies);
    }
}

impl Comm {
    /// Names the communicator (`MPI_Comm_set_name`), for its clones too.
    pub fn set_name(&self, name: &str) {
        self.inner.attrs.lock().name = Some(name.to_string());
    }

    /// The communicator's name (`MPI_Comm_get_name`): what [`Comm::set_name`] gave,
    /// `"MPI_COMM_WORLD"` for the world, else empty.
    pub fn name(&self) -> String {
        let set = self.inner.attrs.lock().name.clone();
        set.unwrap_or_else(|| if self.inner.id == 0 { "MPI_COMM_WORLD".to_string() } else { String::new() })
    }

    /// Sets the attribute of type `A`, dropping any previous one (`MPI_Comm_set_attr`).
    pub fn set_attr<A: Attribute>(&self, value: A) {
        let old = self.inner.attrs.lock().attrs.insert(TypeId::of::<A>(), Box::new(value));
        drop(old);
    }

    /// A copy of the attribute of type `A`, if set (`MPI_Comm_get_attr`).
    pub fn attr<A: Attribute + Clone>(&self) -> Option<A> {
        self.with_attr(A::clone)
    }

    /// Runs `f` on the attribute of type `A`, if set. `f` must not call attribute or name
    /// functions of the same communicator (they would wait for the lock `f` runs under).
    pub fn with_attr<A: Attribute, R>(&self, f: impl FnOnce(&A) -> R) -> Option<R> {
        let e = self.inner.attrs.lock();
        e.attrs.get(&TypeId::of::<A>()).and_then(|b| b.as_any().downcast_ref::<A>()).map(f)
    }

    /// Deletes the attribute of type `A` (`MPI_Comm_delete_attr`); whether one was set.
    pub fn delete_attr<A: Attribute>(&self) -> bool {
        let old = self.inner.attrs.lock().attrs.remove(&TypeId::of::<A>());
        old.is_some()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    use super::*;

    struct Counted(Arc<AtomicUsize>, bool);
    impl Drop for Counted {
        fn drop(&mut self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }
    impl Attribute for Counted {
        fn copy_on_dup(&self) -> Option<Self> {
            self.1.then(|| Counted(self.0.clone(), self.1))
        }
    }

    /// Copy on dup as the attribute says; the delete callback (Drop) runs on replace, on
    /// delete and when the communicator goes away; names are per communicator.
    #[test]
    fn copy_delete_and_names() {
        let out = crate::run_local(2, |w| {
            let drops = Arc::new(AtomicUsize::new(0));
            let d = w.dup().unwrap();
            d.set_attr(Counted(drops.clone(), true));
            d.set_attr(Counted(drops.clone(), true)); // replaces: one drop
            let after_replace = drops.load(Ordering::SeqCst);
            let dd = d.dup().unwrap(); // copied
            let copied = dd.with_attr(|_: &Counted| ()).is_some();
            let e = d.dup().unwrap(); // gets a copy too...
            e.set_attr(Counted(drops.clone(), false)); // ...which this replaces: a drop
            let not_copied = e.dup().unwrap().with_attr(|_: &Counted| ()).is_none();
            let deleted = e.delete_attr::<Counted>() && !e.delete_attr::<Counted>();
            drop(dd); // its copy dropped with it
            drop(d); // and the original
            d_names(&w);
            (after_replace, copied, not_copied, deleted, drops.load(Ordering::SeqCst))
        });
        // Drops: the replaced value, e's copy replaced, e's value deleted, dd's copy, d's value.
        assert!(out.iter().all(|o| *o == (1, true, true, true, 5)), "{out:?}");
    }

    fn d_names(w: &Comm) {
        assert_eq!(w.name(), "MPI_COMM_WORLD");
        let d = w.dup().unwrap();
        assert_eq!(d.name(), "");
        d.set_name("left");
        assert_eq!((d.clone().name(), w.name()), ("left".to_string(), "MPI_COMM_WORLD".to_string()));
    }
}
