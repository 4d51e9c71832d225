//! The v-collectives with [`Element`] buffers: [`Comm::gatherv_typed`],
//! [`Comm::scatterv_typed`], [`Comm::allgatherv_typed`], [`Comm::alltoallv_typed`], and the
//! synchronous send [`Comm::ssend_typed`].
//!
//! Counts and displacements are in elements of `T`, as in [`Comm::gatherv`] and its kin; the
//! byte-level call underneath gets them scaled by `T`'s packed size. The side of a call whose
//! regions the counts describe is a plain slice (a [`Layout`](crate::datatype::Layout) and displacements
//! would both place the elements); the other side may be any [`Buf`]/[`BufMut`]. A slice of
//! a type received in place is written directly; any other is received packed and only the
//! regions the counts name are unpacked (each checked as the rank it came from sent it), so
//! elements between regions keep their values, as MPI leaves them.

use super::{direct_bytes, Buf, BufMut};
use crate::comm::Comm;
use crate::error::{Error, Result};
use crate::typemap::Element;
use crate::{Rank, Tag};

/// `v` (counts or displacements in elements of packed size `size`) in bytes.
fn in_bytes(v: &[usize], size: usize) -> Result<Vec<usize>> {
    v.iter()
        .map(|&c| {
            c.checked_mul(size)
                .ok_or_else(|| Error::InvalidBuffer(format!("a count or displacement of {c} elements of {size} bytes overflows")))
        })
        .collect()
}

/// A slice's elements packed (borrowed when the type is dense).
fn packed<T: Element>(elems: &[T]) -> Result<std::borrow::Cow<'_, [u8]>> {
    Buf::from(elems).packed()
}

/// Where a v-collective receives: the slice itself, or a packed room of the same number of
/// elements that [`Landing::land`] unpacks region by region.
struct Landing<'a, T: Element> {
    elems: &'a mut [T],
    room: Option<Vec<u8>>,
}

impl<'a, T: Element> Landing<'a, T> {
    fn new(elems: &'a mut [T]) -> Result<Self> {
        let room = if T::type_map().direct_recv() { None } else { Some(BufMut::from(&mut *elems).room()?) };
        Ok(Landing { elems, room })
    }

    /// The bytes the byte-level call writes into.
    fn bytes(&mut self) -> &mut [u8] {
        match &mut self.room {
            Some(r) => r,
            None => direct_bytes(self.elems),
        }
    }

    /// Unpacks region `i` (`displs[i]`, `counts[i]` elements, sent by rank `i`) of the room
    /// into the slice, for every `i`; nothing to do when the slice was written in place.
    fn land(self, counts: &[usize], displs: &[usize]) -> Result<()> {
        let Some(room) = self.room else { return Ok(()) };
        let size = T::type_map().size();
        for (i, (&n, &d)) in counts.iter().zip(displs).enumerate() {
            if n == 0 {
                continue;
            }
            // The byte-level call checked every region against the buffer: in bounds.
            let part = &mut self.elems[d..d + n];
            BufMut::from(part).fill(&room[d * size..(d + n) * size], i)?;
        }
        Ok(())
    }
}

impl Comm {
    /// Sends the elements of `buf` and returns once the receiver has started to receive them
    /// (as [`Comm::ssend`], with a typed buffer).
    ///
    /// # Errors
    /// As [`Comm::ssend`] and [`Comm::send_typed`].
    pub fn ssend_typed<'a, T: Element>(&self, buf: impl Into<Buf<'a, T>>, dest: Rank, tag: Tag) -> Result<()> {
        self.ssend(&buf.into().packed()?, dest, tag)
    }

    /// Collects `send`'s elements from every rank into `recv` at `root`: rank `i`'s go to
    /// `recv[displs[i]..displs[i] + counts[i]]` (as [`Comm::gatherv`], with typed buffers).
    ///
    /// # Errors
    /// As [`Comm::gatherv`]; [`Error::InvalidValue`] at the root for a bad `bool` (the regions
    /// before the one that held it are written).
    pub fn gatherv_typed<'a, T: Element>(
        &self,
        send: impl Into<Buf<'a, T>>,
        recv: Option<&mut [T]>,
        counts: &[usize],
        displs: &[usize],
        root: Rank,
    ) -> Result<()> {
        let size = T::type_map().size();
        let send = send.into().packed()?;
        let Some(recv) = recv.filter(|_| self.rank() == root) else {
            return self.gatherv(&send, None, &[], &[], root);
        };
        let (bcounts, bdispls) = (in_bytes(counts, size)?, in_bytes(displs, size)?);
        let mut at = Landing::new(recv)?;
        self.gatherv(&send, Some(at.bytes()), &bcounts, &bdispls, root)?;
        at.land(counts, displs)
    }

    /// Sends `send[displs[i]..displs[i] + counts[i]]` at `root` to rank `i`'s `recv` (as
    /// [`Comm::scatterv`], with typed buffers; `send` and the counts matter at the root only).
    ///
    /// # Errors
    /// As [`Comm::scatterv`]; [`Error::InvalidValue`] for a bad `bool`.
    pub fn scatterv_typed<'a, T: Element>(
        &self,
        send: Option<&[T]>,
        counts: &[usize],
        displs: &[usize],
        recv: impl Into<BufMut<'a, T>>,
        root: Rank,
    ) -> Result<()> {
        let size = T::type_map().size();
        let send = match send.filter(|_| self.rank() == root) {
            Some(s) => Some(packed(s)?),
            None => None,
        };
        let (bcounts, bdispls) = if send.is_some() { (in_bytes(counts, size)?, in_bytes(displs, size)?) } else { Default::default() };
        let mut recv = recv.into();
        if let Some(bytes) = recv.direct() {
            return self.scatterv(send.as_deref(), &bcounts, &bdispls, bytes, root);
        }
        let mut room = recv.room()?;
        self.scatterv(send.as_deref(), &bcounts, &bdispls, &mut room, root)?;
        recv.fill(&room, root)
    }

    /// Collects `send`'s elements from every rank into `recv` on every rank: rank `i`'s go to
    /// `recv[displs[i]..displs[i] + counts[i]]` (as [`Comm::allgatherv`], typed).
    ///
    /// # Errors
    /// As [`Comm::allgatherv`]; [`Error::InvalidValue`] for a bad `bool`.
    pub fn allgatherv_typed<'a, T: Element>(
        &self,
        send: impl Into<Buf<'a, T>>,
        recv: &mut [T],
        counts: &[usize],
        displs: &[usize],
    ) -> Result<()> {
        let size = T::type_map().size();
        let send = send.into().packed()?;
        let (bcounts, bdispls) = (in_bytes(counts, size)?, in_bytes(displs, size)?);
        let mut at = Landing::new(recv)?;
        self.allgatherv(&send, at.bytes(), &bcounts, &bdispls)?;
        at.land(counts, displs)
    }

    /// Sends `send[sdispls[j]..sdispls[j] + scounts[j]]` to rank `j` and receives rank `i`'s
    /// block into `recv[rdispls[i]..rdispls[i] + rcounts[i]]` (as [`Comm::alltoallv`], typed).
    ///
    /// # Errors
    /// As [`Comm::alltoallv`]; [`Error::InvalidValue`] for a bad `bool`.
    pub fn alltoallv_typed<T: Element>(
        &self,
        send: &[T],
        scounts: &[usize],
        sdispls: &[usize],
        recv: &mut [T],
        rcounts: &[usize],
        rdispls: &[usize],
    ) -> Result<()> {
        let size = T::type_map().size();
        let send = packed(send)?;
        let (sc, sd) = (in_bytes(scounts, size)?, in_bytes(sdispls, size)?);
        let (rc, rd) = (in_bytes(rcounts, size)?, in_bytes(rdispls, size)?);
        let mut at = Landing::new(recv)?;
        self.alltoallv(&send, &sc, &sd, at.bytes(), &rc, &rd)?;
        at.land(rcounts, rdispls)
    }
}

#[cfg(test)]
mod tests {
    use crate::Element;

    #[derive(Clone, Copy, Debug, PartialEq, Default, Element)]
    struct Padded {
        on: bool,
        x: f64,
        id: u16,
    }

    fn p(r: usize, k: usize) -> Padded {
        Padded { on: (r + k) % 2 == 1, x: (10 * r + k) as f64, id: (100 * r + k) as u16 }
    }

    #[test]
    fn typed_v_collectives_place_each_ranks_elements_and_leave_the_gaps() {
        let n = 3;
        // Rank i sends i + 1 elements; one gap element follows each region.
        let counts: Vec<usize> = (0..n).map(|i| i + 1).collect();
        let displs: Vec<usize> = (0..n)
            .scan(0, |at, i| {
                let d = *at;
                *at += i + 2;
                Some(d)
            })
            .collect();
        let total = displs[n - 1] + counts[n - 1] + 1;
        let marker = Padded { on: true, x: -1.0, id: 999 };
        let want: Vec<Padded> = {
            let mut v = vec![marker; total];
            for i in 0..n {
                for k in 0..counts[i] {
                    v[displs[i] + k] = p(i, k);
                }
            }
            v
        };
        let got = crate::run_local(n, |w| {
            let r = w.rank();
            let mine: Vec<Padded> = (0..r + 1).map(|k| p(r, k)).collect();
            let mut all = vec![marker; total];
            w.allgatherv_typed(&mine, &mut all, &counts, &displs).unwrap();
            let mut at_root = vec![marker; total];
            w.gatherv_typed(&mine, (r == 1).then_some(&mut at_root[..]), &counts, &displs, 1).unwrap();
            let mut back = vec![Padded::default(); r + 1];
            w.scatterv_typed((r == 1).then_some(&at_root[..]), &counts, &displs, &mut back, 1).unwrap();
            (all, if r == 1 { Some(at_root) } else { None }, back, mine)
        });
        for (r, (all, root, back, mine)) in got.into_iter().enumerate() {
            assert_eq!(all, want, "allgatherv at rank {r}");
            if let Some(root) = root {
                assert_eq!(root, want, "gatherv at the root");
            }
            assert_eq!(back, mine, "scatterv back to rank {r}");
        }
    }

    #[test]
    fn typed_alltoallv_moves_padded_elements_and_ssend_delivers() {
        let n = 3;
        let got = crate::run_local(n, |w| {
            let r = w.rank();
            // Rank r sends j + 1 elements to rank j, tagged with (r, j).
            let scounts: Vec<usize> = (0..n).map(|j| j + 1).collect();
            let sdispls: Vec<usize> = (0..n).map(|j| j * (j + 1) / 2).collect();
            let send: Vec<Padded> = (0..n).flat_map(|j| (0..j + 1).map(move |k| p(r, 10 * j + k))).collect();
            let rcounts = vec![r + 1; n];
            let rdispls: Vec<usize> = (0..n).map(|i| i * (r + 1)).collect();
            let mut recv = vec![Padded::default(); n * (r + 1)];
            w.alltoallv_typed(&send, &scounts, &sdispls, &mut recv, &rcounts, &rdispls).unwrap();
            let mut one = [Padded::default()];
            if r == 0 {
                w.ssend_typed(&[p(7, 7)], 1, 5).unwrap();
            } else if r == 1 {
                w.recv_typed(&mut one, 0, 5).unwrap();
            }
            (recv, one[0])
        });
        for (r, (recv, one)) in got.into_iter().enumerate() {
            let want: Vec<Padded> = (0..n).flat_map(|i| (0..r + 1).map(move |k| p(i, 10 * r + k))).collect();
            assert_eq!(recv, want, "alltoallv at rank {r}");
            if r == 1 {
                assert_eq!(one, p(7, 7));
            }
        }
    }

    #[test]
    fn typed_v_counts_that_overflow_are_an_error() {
        let got = crate::run_local(1, |w| {
            let mut out = [Padded::default()];
            w.allgatherv_typed(&[Padded::default()], &mut out, &[usize::MAX / 2], &[0]).map_err(|e| e.to_string())
        });
        let e = got[0].as_ref().unwrap_err();
        assert!(e.contains("overflows"), "{e}");
    }
}
