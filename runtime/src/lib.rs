//! tmpi runtime (being built).
pub mod coll;
pub mod error;
pub mod op;
pub use error::{Error, Result};
/// A rank in a communicator.
pub type Rank = usize;
/// A user tag, `0..=TAG_UB`.
pub type Tag = u32;
/// Largest user tag.
pub const TAG_UB: Tag = (1 << 24) - 1;
