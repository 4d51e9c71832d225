//! Messages of any `serde` type (feature `serde`): [`Comm::send_serialized`] encodes a value
//! (JSON today: self-describing, so a receiver learns the length and the shape from the
//! message itself) and [`Comm::recv_serialized`] receives a message of any size into a buffer
//! sized on arrival and decodes it.
//!
//! ```
//! use std::collections::BTreeMap;
//! let got = tmpi::run_local(2, |w| {
//!     if w.rank() == 0 {
//!         let mut m = BTreeMap::new();
//!         m.insert("answer".to_string(), vec![4u32, 2]);
//!         w.send_serialized(&m, 1, 0).unwrap();
//!         None
//!     } else {
//!         let (m, _st): (BTreeMap<String, Vec<u32>>, _) = w.recv_serialized(0, 0).unwrap();
//!         Some(m)
//!     }
//! });
//! assert_eq!(got[1].as_ref().unwrap()["answer"], vec![4, 2]);
//! ```

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::comm::{Comm, Source, Status, TagMatch};
use crate::error::{Error, Result};
use crate::seen::{self, Kind, What};
use crate::{Rank, Tag};

impl Comm {
    /// Sends `value` encoded (see the module docs) to `dest`.
    ///
    /// # Errors
    /// [`Error::InvalidBuffer`] when the value cannot be encoded (a map with non-string keys,
    /// a failing `Serialize` impl); as [`Comm::send`].
    pub fn send_serialized<T: Serialize + ?Sized>(&self, value: &T, dest: Rank, tag: Tag) -> Result<()> {
        let bytes =
            serde_json::to_vec(value).map_err(|e| Error::InvalidBuffer(format!("send_serialized: cannot encode the value: {e}")))?;
        self.send(&bytes, dest, tag)
    }

    /// Receives a message sent by [`Comm::send_serialized`], whatever its size, and decodes it.
    ///
    /// # Errors
    /// [`Error::InvalidBuffer`] when the message does not decode as a `T` (it is consumed);
    /// as [`Comm::recv_vec`].
    pub fn recv_serialized<T: DeserializeOwned>(&self, src: impl Into<Source>, tag: impl Into<TagMatch>) -> Result<(T, Status)> {
        let (src, tag) = (src.into(), tag.into());
        if seen::on() {
            return seen::calls::matched(What::new(Kind::RecvSerialized).from(self, src).tag_match(tag), src, |s| {
                self.recv_serialized(s, tag)
            });
        }
        let (bytes, st) = self.recv_vec::<u8>(src, tag)?;
        let v = serde_json::from_slice(&bytes).map_err(|e| {
            Error::InvalidBuffer(format!("recv_serialized: the message from rank {} tag {} does not decode: {e}", st.source(), st.tag()))
        })?;
        Ok((v, st))
    }
}

#[cfg(test)]
mod tests {
    use serde::{Deserialize, Serialize};

    use crate::{run_local, Error};

    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    struct Particle {
        id: u64,
        name: String,
        pos: [f64; 3],
        tags: Vec<String>,
    }

    #[test]
    fn round_trip_of_variable_size_values_and_bad_input() {
        let got = run_local(3, |w| {
            let (r, n) = (w.rank(), w.size());
            let mine: Vec<Particle> = (0..r * 50 + 1)
                .map(|i| Particle { id: i as u64, name: format!("p{r}-{i}"), pos: [i as f64, 0.5, -1.0], tags: vec!["x".into(); i % 3] })
                .collect();
            w.send_serialized(&mine, (r + 1) % n, 1).unwrap();
            let (got, st): (Vec<Particle>, _) = w.recv_serialized((r + n - 1) % n, 1).unwrap();
            assert!(!st.is_empty());
            // Garbage and the wrong type are errors, not panics.
            w.send(&[0xffu8, 0, 1], (r + 1) % n, 2).unwrap();
            let bad: crate::Result<(Vec<Particle>, _)> = w.recv_serialized((r + n - 1) % n, 2);
            assert!(matches!(bad, Err(Error::InvalidBuffer(_))));
            w.send_serialized(&"a string", (r + 1) % n, 3).unwrap();
            let wrong: crate::Result<(Particle, _)> = w.recv_serialized((r + n - 1) % n, 3);
            assert!(matches!(wrong, Err(Error::InvalidBuffer(_))));
            got
        });
        for (r, g) in got.iter().enumerate() {
            let from = (r + 2) % 3;
            assert_eq!(g.len(), from * 50 + 1);
            assert_eq!(g.last().unwrap().name, format!("p{from}-{}", from * 50));
        }
    }

    #[test]
    fn stats_serialize() {
        let s = run_local(1, |w| w.stats().unwrap()).pop().unwrap();
        let j = serde_json::to_string(&s).unwrap();
        let back: crate::Stats = serde_json::from_str(&j).unwrap();
        assert_eq!(back, s);
    }
}
