//! [`Comm::split_type`]: one communicator per node (MPI's `Comm_split_type` with
//! `MPI_COMM_TYPE_SHARED`).

use crate::comm::Comm;
use crate::error::Result;
use crate::seen::{self, Kind, What};

/// How [`Comm::split_type`] groups ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum SplitType {
    /// Ranks that can share memory: the same host ([`crate::processor_name`]).
    Shared,
}

/// 64-bit FNV-1a of a host name (stable across processes and builds).
fn host_hash(name: &str) -> u64 {
    name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}

impl Comm {
    /// Splits into one communicator per node (collective); ranks keep their order, or are
    /// ordered by `key` first as in [`Comm::split`].
    ///
    /// ```
    /// let sizes = tmpi::run_local(3, |w| {
    ///     let node = w.split_type(tmpi::SplitType::Shared, 0).unwrap();
    ///     node.size()
    /// });
    /// assert_eq!(sizes, vec![3, 3, 3]); // threads of one process share a node
    /// ```
    ///
    /// # Errors
    /// As [`Comm::split`].
    pub fn split_type(&self, kind: SplitType, key: i32) -> Result<Comm> {
        if seen::on() {
            return seen::call(What::new(Kind::SplitType).on(self), || self.split_type(kind, key));
        }
        let SplitType::Shared = kind;
        let name = crate::processor_name();
        let mut all = vec![0u64; self.size()];
        self.allgather(&[host_hash(&name)], &mut all)?;
        // The color is the lowest rank on the same host (a hash collision between two hosts
        // would merge them; names are compared through 64-bit hashes only).
        let me = host_hash(&name);
        let color = all.iter().position(|&h| h == me).unwrap_or(self.rank()) as u32;
        let c = self.split(Some(color), key)?;
        c.ok_or_else(|| crate::Error::State("split_type: split with a color returned no communicator".into()))
    }
}
