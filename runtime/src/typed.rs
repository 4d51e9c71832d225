//! Buffers of any [`Element`] type, whole or through a [`Layout`], in point-to-point calls and
//! collectives: [`Comm::send_typed`], [`Comm::recv_typed`], [`Comm::sendrecv_typed`],
//! [`Comm::isend_typed`], [`Comm::irecv_typed`], [`Comm::bcast_typed`],
//! [`Comm::gather_typed`], [`Comm::scatter_typed`], [`Comm::allgather_typed`],
//! [`Comm::alltoall_typed`], the v-collectives [`Comm::gatherv_typed`],
//! [`Comm::scatterv_typed`], [`Comm::allgatherv_typed`], [`Comm::alltoallv_typed`] (counts in
//! elements), [`Comm::ssend_typed`], and for reducible elements [`Comm::reduce_typed`] and
//! [`Comm::allreduce_typed`].
//!
//! A buffer is a [`Buf`] (to read) or a [`BufMut`] (to write): a slice, or the elements of a
//! slice that a [`Layout`] selects (`Buf::laid`, or a `(slice, &layout)` pair). Each call takes
//! `impl Into<Buf>`, so `&v`, `&v[..]`, `&array` and `(&v, &layout)` all work. What crosses the
//! wire is always the selected elements' data in order, packed ([`TypeMap`](crate::TypeMap)): a rank may send
//! a column through a layout and its peer receive it into a plain slice, or a struct with
//! padding on one side and the same struct on the other.
//!
//! Nothing is copied when it need not be: a whole slice of a type without padding or `bool`
//! (every `Pod` type, a derived struct of such fields laid out without gaps) is sent and
//! received in place; a layout over such a type is sent as [`Comm::send_layout`] sends it
//! (small messages gathered straight from the blocks). Any other buffer is packed into one
//! temporary on the way out and received into one on the way in, then checked (every `bool`
//! byte must be 0 or 1: [`Error::InvalidValue`] otherwise, with the buffer unchanged) and
//! unpacked. Counts in a [`Status`] are packed bytes: [`Status::count_typed`] gives elements.
//!
//! Why separate calls and not [`Comm::send`] itself: `send` takes `&[T]` with `T: Pod`, which
//! the contract fixes, and a generic buffer parameter would lose Rust's deref coercion for
//! the callers of `send` (see [`crate::one`]); every `Pod` element type keeps `send`, and
//! these calls take everything `send` takes plus layouts and [`Element`] types.
//!
//! ```
//! #[derive(Clone, Copy, Debug, PartialEq, tmpi::Element)]
//! struct Particle {
//!     alive: bool,
//!     pos: [f64; 3],
//!     id: u16,
//! }
//! let got = tmpi::run_local(2, |w| {
//!     let mut ps = [Particle { alive: false, pos: [0.0; 3], id: 0 }; 2];
//!     if w.rank() == 0 {
//!         ps[1] = Particle { alive: true, pos: [1.0, 2.0, 3.0], id: 7 };
//!         w.send_typed(&ps, 1, 0).unwrap();
//!     } else {
//!         w.recv_typed(&mut ps, 0, 0).unwrap();
//!     }
//!     ps[1]
//! });
//! assert_eq!(got[1], Particle { alive: true, pos: [1.0, 2.0, 3.0], id: 7 });
//! ```

use std::borrow::Cow;
use std::ptr::NonNull;

use crate::comm::{Comm, Source, Status, TagMatch};
use crate::datatype::Layout;
use crate::error::{Error, Result};
use crate::op::{Op, Reducible};
use crate::request::{Request, Scope};
use crate::typemap::Element;
use crate::{Rank, Tag};

mod vcoll;

/// Elements to read: a slice, or the elements of a slice that a [`Layout`] selects.
#[derive(Debug)]
pub struct Buf<'a, T> {
    elems: &'a [T],
    layout: Option<&'a Layout>,
}

impl<T> Clone for Buf<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for Buf<'_, T> {}

/// Elements to write: a slice, or the elements of a slice that a [`Layout`] selects (whose
/// blocks must not overlap).
#[derive(Debug)]
pub struct BufMut<'a, T> {
    elems: &'a mut [T],
    layout: Option<&'a Layout>,
}

impl<'a, T> Buf<'a, T> {
    /// The elements of `elems` that `layout` selects, in the layout's order.
    pub fn laid(elems: &'a [T], layout: &'a Layout) -> Self {
        Buf { elems, layout: Some(layout) }
    }
}

impl<'a, T> BufMut<'a, T> {
    /// The elements of `elems` that `layout` selects, in the layout's order.
    pub fn laid(elems: &'a mut [T], layout: &'a Layout) -> Self {
        BufMut { elems, layout: Some(layout) }
    }
}

impl<'a, T> From<&'a [T]> for Buf<'a, T> {
    fn from(elems: &'a [T]) -> Self {
        Buf { elems, layout: None }
    }
}
impl<'a, T> From<&'a Vec<T>> for Buf<'a, T> {
    fn from(elems: &'a Vec<T>) -> Self {
        Buf { elems, layout: None }
    }
}
impl<'a, T, const N: usize> From<&'a [T; N]> for Buf<'a, T> {
    fn from(elems: &'a [T; N]) -> Self {
        Buf { elems, layout: None }
    }
}
impl<'a, T> From<(&'a [T], &'a Layout)> for Buf<'a, T> {
    fn from((elems, layout): (&'a [T], &'a Layout)) -> Self {
        Buf::laid(elems, layout)
    }
}
impl<'a, T> From<(&'a Vec<T>, &'a Layout)> for Buf<'a, T> {
    fn from((elems, layout): (&'a Vec<T>, &'a Layout)) -> Self {
        Buf::laid(elems, layout)
    }
}
impl<'a, T> From<&'a mut [T]> for BufMut<'a, T> {
    fn from(elems: &'a mut [T]) -> Self {
        BufMut { elems, layout: None }
    }
}
impl<'a, T> From<&'a mut Vec<T>> for BufMut<'a, T> {
    fn from(elems: &'a mut Vec<T>) -> Self {
        BufMut { elems, layout: None }
    }
}
impl<'a, T, const N: usize> From<&'a mut [T; N]> for BufMut<'a, T> {
    fn from(elems: &'a mut [T; N]) -> Self {
        BufMut { elems, layout: None }
    }
}
impl<'a, T> From<(&'a mut [T], &'a Layout)> for BufMut<'a, T> {
    fn from((elems, layout): (&'a mut [T], &'a Layout)) -> Self {
        BufMut::laid(elems, layout)
    }
}
impl<'a, T> From<(&'a mut Vec<T>, &'a Layout)> for BufMut<'a, T> {
    fn from((elems, layout): (&'a mut Vec<T>, &'a Layout)) -> Self {
        BufMut::laid(elems, layout)
    }
}

/// The bytes of `elems`, whose type is dense.
fn dense_bytes<T: Element>(elems: &[T]) -> &[u8] {
    debug_assert!(T::type_map().is_dense());
    // SAFETY: a dense map covers every byte of `T` with data, so every byte of the slice is
    // initialized (Element's contract), and `T` has no interior mutability; the bytes are
    // borrowed for as long as `elems`.
    unsafe { std::slice::from_raw_parts(elems.as_ptr().cast::<u8>(), std::mem::size_of_val(elems)) }
}

/// The bytes of `elems`, whose type is received in place (dense, no `bool`).
fn direct_bytes<T: Element>(elems: &mut [T]) -> &mut [u8] {
    debug_assert!(T::type_map().direct_recv());
    // SAFETY: every byte is data and any bytes written there make a valid `T` (a dense map
    // with no bool, Element's contract); the bytes are borrowed exclusively for as long as
    // `elems`.
    unsafe { std::slice::from_raw_parts_mut(elems.as_mut_ptr().cast::<u8>(), std::mem::size_of_val(elems)) }
}

/// The blocks `(start, len)` of a buffer of `len` elements, checked against it.
fn blocks(layout: Option<&Layout>, len: usize) -> Result<Vec<(usize, usize)>> {
    match layout {
        None => Ok(vec![(0, len)]),
        Some(l) => {
            l.check(len)?;
            Ok(l.blocks().filter(|b| b.1 > 0).collect())
        }
    }
}

impl<'a, T: Element> Buf<'a, T> {
    /// Elements selected.
    pub fn len(&self) -> usize {
        self.layout.map_or(self.elems.len(), Layout::len)
    }

    /// Whether nothing is selected.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The selected elements packed; borrowed when the buffer is a whole dense slice.
    fn packed(self) -> Result<Cow<'a, [u8]>> {
        let map = T::type_map();
        if self.layout.is_none() && map.is_dense() {
            return Ok(Cow::Borrowed(dense_bytes(self.elems)));
        }
        let blocks = blocks(self.layout, self.elems.len())?;
        let bytes = self.len().checked_mul(map.size()).filter(|&b| b <= crate::sys::physical_memory());
        let mut out = bytes
            .and_then(crate::alloc::zeroed_vec::<u8>)
            .ok_or_else(|| Error::InvalidBuffer(format!("the layout selects {} elements, more than this process can pack", self.len())))?;
        let mut pos = 0;
        for (start, n) in blocks {
            let part = &self.elems[start..start + n];
            // SAFETY: `part` is `n` initialized elements of `T`, which `map` describes
            // (Element's contract); `out[pos..]` holds the `n * size` bytes they pack to (the
            // blocks' lengths add up to `len()`).
            unsafe { map.pack_into(part.as_ptr().cast::<u8>(), n, &mut out[pos..]) };
            pos += n * map.size();
        }
        Ok(Cow::Owned(out))
    }
}

impl<T: Element> BufMut<'_, T> {
    /// Elements selected.
    pub fn len(&self) -> usize {
        self.layout.map_or(self.elems.len(), Layout::len)
    }

    /// Whether nothing is selected.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// A read view of the same elements.
    fn as_buf(&self) -> Buf<'_, T> {
        Buf { elems: self.elems, layout: self.layout }
    }

    /// Checks the layout; a receive layout may not select more elements than the slice has.
    fn check(&self) -> Result<()> {
        if let Some(l) = self.layout {
            l.check(self.elems.len())?;
            if l.len() > self.elems.len() {
                return Err(Error::InvalidBuffer(format!(
                    "a receive layout selects {} elements of a {}-element buffer (its blocks overlap)",
                    l.len(),
                    self.elems.len()
                )));
            }
        }
        Ok(())
    }

    /// The slice's bytes, when received in place (whole slice, dense type, no `bool`).
    fn direct(&mut self) -> Option<&mut [u8]> {
        (self.layout.is_none() && T::type_map().direct_recv()).then(|| direct_bytes(self.elems))
    }

    /// Zeroed room for the selected elements, packed.
    fn room(&self) -> Result<Vec<u8>> {
        self.check()?;
        let n = self.len().saturating_mul(T::type_map().size());
        crate::alloc::zeroed_vec::<u8>(n).ok_or_else(|| Error::InvalidBuffer(format!("cannot allocate {n} bytes to receive into")))
    }

    /// Checks and writes the packed elements of `packed` (from `source_rank`) into the
    /// selected elements, in order. `packed` may hold fewer elements than selected.
    ///
    /// # Errors
    /// [`Error::InvalidValue`] for a bad `bool`, [`Error::TypeMismatch`] when `packed` is not
    /// whole elements; nothing is written then.
    fn fill(&mut self, packed: &[u8], source_rank: Rank) -> Result<()> {
        let map = T::type_map();
        map.check_bools(packed, source_rank)?;
        if map.size() == 0 || packed.len() % map.size() != 0 {
            if packed.is_empty() {
                return Ok(());
            }
            return Err(Error::TypeMismatch { source_rank, len: packed.len(), elem: map.size() });
        }
        let mut left = packed.len() / map.size();
        let mut pos = 0;
        for (start, len) in blocks(self.layout, self.elems.len())? {
            let n = len.min(left);
            let part = &mut self.elems[start..start + n];
            // SAFETY: `part` is `n` elements of `T`, exclusively borrowed, which `map`
            // describes; `packed[pos..]` holds `n * size` bytes (n <= what is left) whose
            // bools were checked above.
            unsafe { map.unpack_from(&packed[pos..], part.as_mut_ptr().cast::<u8>(), n) };
            pos += n * map.size();
            left -= n;
            if left == 0 {
                break;
            }
        }
        Ok(())
    }
}

/// A dense buffer through a layout, as bytes and a byte layout (for `send_layout`).
fn dense_laid<'b, T: Element>(b: &Buf<'b, T>) -> Option<(&'b [u8], Layout)> {
    let l = b.layout?;
    T::type_map().is_dense().then(|| (dense_bytes(b.elems), l.scaled(std::mem::size_of::<T>())))
}

impl Status {
    /// Elements of `T` the message held (its packed bytes over `T`'s packed size; 0 for a
    /// type of no data).
    pub fn count_typed<T: Element>(&self) -> usize {
        self.len().checked_div(T::type_map().size()).unwrap_or(0)
    }
}

impl Comm {
    /// Sends the elements of `buf` (a slice, or a slice through a [`Layout`]).
    ///
    /// # Errors
    /// [`Error::InvalidBuffer`] when the layout does not fit the slice; as [`Comm::send`].
    pub fn send_typed<'a, T: Element>(&self, buf: impl Into<Buf<'a, T>>, dest: Rank, tag: Tag) -> Result<()> {
        let buf = buf.into();
        if let Some((bytes, l)) = dense_laid(&buf) {
            return self.send_layout(bytes, &l, dest, tag);
        }
        self.send(&buf.packed()?, dest, tag)
    }

    /// Receives a message into the elements of `buf`.
    ///
    /// # Errors
    /// [`Error::InvalidValue`] when a received `bool` is neither 0 nor 1,
    /// [`Error::TypeMismatch`] when the message is not whole elements (`buf` is unchanged
    /// then); [`Error::InvalidBuffer`] when the layout does not fit; as [`Comm::recv`].
    pub fn recv_typed<'a, T: Element>(
        &self,
        buf: impl Into<BufMut<'a, T>>,
        src: impl Into<Source>,
        tag: impl Into<TagMatch>,
    ) -> Result<Status> {
        let mut buf = buf.into();
        if let Some(bytes) = buf.direct() {
            return self.recv(bytes, src, tag);
        }
        let mut room = buf.room()?;
        let st = self.recv(&mut room, src, tag)?;
        buf.fill(&room[..st.len()], st.source())?;
        Ok(st)
    }

    /// Sends `sbuf` to `dest` and receives into `rbuf` from `src`, without deadlock (as
    /// [`Comm::sendrecv`], with typed buffers).
    ///
    /// # Errors
    /// As [`Comm::send_typed`] and [`Comm::recv_typed`].
    #[allow(clippy::too_many_arguments)]
    pub fn sendrecv_typed<'a, 'b, T: Element, U: Element>(
        &self,
        sbuf: impl Into<Buf<'a, T>>,
        dest: Rank,
        stag: Tag,
        rbuf: impl Into<BufMut<'b, U>>,
        src: impl Into<Source>,
        rtag: impl Into<TagMatch>,
    ) -> Result<Status> {
        let (sbuf, mut rbuf) = (sbuf.into(), rbuf.into());
        let packed = sbuf.packed()?;
        if let Some(bytes) = rbuf.direct() {
            return self.sendrecv(&packed, dest, stag, bytes, src, rtag);
        }
        let mut room = rbuf.room()?;
        let st = self.sendrecv(&packed, dest, stag, &mut room, src, rtag)?;
        rbuf.fill(&room[..st.len()], st.source())?;
        Ok(st)
    }

    /// Starts sending the elements of `buf`, borrowed until the scope ends (packed first when
    /// the buffer is not a whole dense slice; the packed copy lives in the request).
    ///
    /// # Errors
    /// As [`Comm::isend`] and [`Comm::send_typed`].
    pub fn isend_typed<'scope, T: Element>(
        &self,
        s: &'scope Scope<'scope, '_>,
        buf: impl Into<Buf<'scope, T>>,
        dest: Rank,
        tag: Tag,
    ) -> Result<TypedRequest<'scope, T>> {
        match buf.into().packed()? {
            Cow::Borrowed(bytes) => Ok(TypedRequest::plain(self.isend(s, bytes, dest, tag)?)),
            Cow::Owned(v) => {
                let temp = Temp::new(v);
                // SAFETY: the temporary is freed only once the request has completed (or is
                // leaked), see `TypedRequest`'s drop; it is not touched meanwhile.
                let bytes: &'scope [u8] = unsafe { temp.slice() };
                let mut r = TypedRequest { req: None, temp: Some(temp), dst: None };
                r.req = Some(self.isend(s, bytes, dest, tag)?);
                Ok(r)
            }
        }
    }

    /// Posts a receive into the elements of `buf`, borrowed until the scope ends. A buffer
    /// that is not received in place (a layout, padding, `bool`) is filled when the request
    /// completes in [`TypedRequest::wait`] or [`TypedRequest::test`] (or when it is dropped).
    ///
    /// # Errors
    /// As [`Comm::irecv`]; [`Error::InvalidBuffer`] when the layout does not fit.
    pub fn irecv_typed<'scope, T: Element>(
        &self,
        s: &'scope Scope<'scope, '_>,
        buf: impl Into<BufMut<'scope, T>>,
        src: impl Into<Source>,
        tag: impl Into<TagMatch>,
    ) -> Result<TypedRequest<'scope, T>> {
        let buf = buf.into();
        if buf.layout.is_none() && T::type_map().direct_recv() {
            return Ok(TypedRequest::plain(self.irecv(s, direct_bytes(buf.elems), src, tag)?));
        }
        let temp = Temp::new(buf.room()?);
        // SAFETY: as in `isend_typed`; nothing reads the temporary before the request
        // completes.
        let bytes: &'scope mut [u8] = unsafe { temp.slice_mut() };
        let mut r = TypedRequest { req: None, temp: Some(temp), dst: Some(buf) };
        r.req = Some(self.irecv(s, bytes, src, tag)?);
        Ok(r)
    }

    /// Broadcasts the elements of `buf` from `root`.
    ///
    /// # Errors
    /// As [`Comm::bcast`]; [`Error::InvalidValue`] on a rank that received a bad `bool`.
    pub fn bcast_typed<'a, T: Element>(&self, buf: impl Into<BufMut<'a, T>>, root: Rank) -> Result<()> {
        let mut buf = buf.into();
        if let Some(bytes) = buf.direct() {
            return self.bcast(bytes, root);
        }
        let mut room = if self.rank() == root { buf.as_buf().packed()?.into_owned() } else { buf.room()? };
        self.bcast(&mut room, root)?;
        if self.rank() != root {
            buf.fill(&room, root)?;
        }
        Ok(())
    }

    /// Collects the elements of `send` from every rank, in rank order, into `recv` at `root`
    /// (`None` elsewhere).
    ///
    /// # Errors
    /// As [`Comm::gather`]; [`Error::InvalidValue`] at the root for a bad `bool`.
    pub fn gather_typed<'a, T: Element>(&self, send: impl Into<Buf<'a, T>>, recv: Option<BufMut<'_, T>>, root: Rank) -> Result<()> {
        let packed = send.into().packed()?;
        match recv {
            Some(mut r) if self.rank() == root => {
                if let Some(bytes) = r.direct() {
                    return self.gather(&packed, Some(bytes), root);
                }
                let mut room = r.room()?;
                self.gather(&packed, Some(&mut room), root)?;
                r.fill(&room, root)
            }
            _ => self.gather(&packed, None, root),
        }
    }

    /// Distributes consecutive blocks of `send`'s elements at `root` to every rank's `recv`.
    ///
    /// # Errors
    /// As [`Comm::scatter`]; [`Error::InvalidValue`] for a bad `bool`.
    pub fn scatter_typed<'a, T: Element>(&self, send: Option<Buf<'_, T>>, recv: impl Into<BufMut<'a, T>>, root: Rank) -> Result<()> {
        let packed = match send.filter(|_| self.rank() == root) {
            Some(s) => Some(s.packed()?),
            None => None,
        };
        let mut recv = recv.into();
        if let Some(bytes) = recv.direct() {
            return self.scatter(packed.as_deref(), bytes, root);
        }
        let mut room = recv.room()?;
        self.scatter(packed.as_deref(), &mut room, root)?;
        recv.fill(&room, root)
    }

    /// Collects the elements of `send` from every rank, in rank order, into `recv` on every
    /// rank.
    ///
    /// # Errors
    /// As [`Comm::allgather`]; [`Error::InvalidValue`] for a bad `bool`.
    pub fn allgather_typed<'a, 'b, T: Element>(&self, send: impl Into<Buf<'a, T>>, recv: impl Into<BufMut<'b, T>>) -> Result<()> {
        let packed = send.into().packed()?;
        let mut recv = recv.into();
        if let Some(bytes) = recv.direct() {
            return self.allgather(&packed, bytes);
        }
        let mut room = recv.room()?;
        self.allgather(&packed, &mut room)?;
        recv.fill(&room, self.rank())
    }

    /// Sends block `j` of `send`'s elements to rank `j` and receives block `i` of `recv` from
    /// rank `i`.
    ///
    /// # Errors
    /// As [`Comm::alltoall`]; [`Error::InvalidValue`] for a bad `bool`.
    pub fn alltoall_typed<'a, 'b, T: Element>(&self, send: impl Into<Buf<'a, T>>, recv: impl Into<BufMut<'b, T>>) -> Result<()> {
        let elem = T::type_map().size();
        let packed = send.into().packed()?;
        let mut recv = recv.into();
        if let Some(bytes) = recv.direct() {
            return self.alltoall_bytes(&packed, bytes, elem);
        }
        let mut room = recv.room()?;
        self.alltoall_bytes(&packed, &mut room, elem)?;
        recv.fill(&room, self.rank())
    }
}

/// The reductions: elements of a reducible type (a primitive number) through layouts.
impl Comm {
    /// Combines the elements of `send` of every rank with `op` into the elements of `recv` on
    /// every rank (as [`Comm::allreduce`], with either side through a [`Layout`]).
    ///
    /// # Errors
    /// As [`Comm::allreduce`]; [`Error::InvalidBuffer`] when a layout does not fit.
    pub fn allreduce_typed<'a, 'b, T: Reducible + Element>(
        &self,
        send: impl Into<Buf<'a, T>>,
        recv: impl Into<BufMut<'b, T>>,
        op: Op,
    ) -> Result<()> {
        let send = reducible(send.into())?;
        let recv = recv.into();
        match recv.layout {
            None => self.allreduce(&send, recv.elems, op),
            Some(l) => {
                recv.check()?;
                let mut out = send.to_vec();
                self.allreduce(&send, &mut out, op)?;
                crate::datatype::unpack(&out, recv.elems, l).map(drop)
            }
        }
    }

    /// Combines the elements of `send` of every rank with `op` into the elements of `recv` at
    /// `root` (`None` elsewhere), either side through a [`Layout`] (as [`Comm::reduce`]).
    ///
    /// # Errors
    /// As [`Comm::reduce`]; [`Error::InvalidBuffer`] when a layout does not fit.
    pub fn reduce_typed<'a, T: Reducible + Element>(
        &self,
        send: impl Into<Buf<'a, T>>,
        recv: Option<BufMut<'_, T>>,
        op: Op,
        root: Rank,
    ) -> Result<()> {
        let send = reducible(send.into())?;
        let Some(recv) = recv.filter(|_| self.rank() == root) else {
            return self.reduce(&send, None, op, root);
        };
        recv.check()?;
        match recv.layout {
            None => self.reduce(&send, Some(recv.elems), op, root),
            Some(l) => {
                let mut out = send.to_vec();
                self.reduce(&send, Some(&mut out), op, root)?;
                crate::datatype::unpack(&out, recv.elems, l).map(drop)
            }
        }
    }
}

/// The selected elements of a reducible buffer, in order (borrowed when it is a whole slice).
fn reducible<T: Reducible>(b: Buf<'_, T>) -> Result<Cow<'_, [T]>> {
    match b.layout {
        None => Ok(Cow::Borrowed(b.elems)),
        Some(l) => crate::datatype::pack(b.elems, l).map(Cow::Owned),
    }
}

/// A packed temporary owned by a [`TypedRequest`], kept as a raw pointer (not a `Vec`) because
/// the request's operation reads or writes it through a slice that outlives each move of the
/// request.
#[derive(Debug)]
struct Temp {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: a Temp owns its allocation like a `Box<[u8]>` does.
unsafe impl Send for Temp {}

impl Temp {
    fn new(v: Vec<u8>) -> Temp {
        let b = Box::into_raw(v.into_boxed_slice());
        let len = b.len();
        // SAFETY: `Box::into_raw` never returns null.
        Temp { ptr: unsafe { NonNull::new_unchecked(b.cast::<u8>()) }, len }
    }

    /// The bytes for the scope's lifetime.
    ///
    /// # Safety
    /// The temporary must not be freed while the returned slice is in use.
    unsafe fn slice<'s>(&self) -> &'s [u8] {
        // SAFETY: `len` bytes allocated in `new`, initialized; alive per the caller.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The bytes for the scope's lifetime, to write.
    ///
    /// # Safety
    /// As [`Temp::slice`], and nothing else may use the bytes while the slice is in use.
    unsafe fn slice_mut<'s>(&self) -> &'s mut [u8] {
        // SAFETY: as in `slice`; exclusive per the caller.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }

    /// The first `n` bytes (the operation has completed).
    fn head(&self, n: usize) -> &[u8] {
        // SAFETY: the allocation is alive while `self` is, and the operation that wrote it
        // has completed (callers), so nothing else uses it.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), n.min(self.len)) }
    }
}

impl Drop for Temp {
    fn drop(&mut self) {
        let raw = std::ptr::slice_from_raw_parts_mut(self.ptr.as_ptr(), self.len);
        // SAFETY: made by `Box::into_raw` in `new` with this length, freed once here.
        drop(unsafe { Box::from_raw(raw) });
    }
}

/// A typed send or receive ([`Comm::isend_typed`], [`Comm::irecv_typed`]): a [`Request`] and,
/// when the buffer was packed, the packed temporary and where to unpack it.
///
/// Dropping it before completion waits for the operation (a receive is then unpacked if its
/// data is valid), except while the thread panics, when the temporary is leaked instead.
#[derive(Debug)]
pub struct TypedRequest<'scope, T: Element> {
    req: Option<Request<'scope>>,
    temp: Option<Temp>,
    dst: Option<BufMut<'scope, T>>,
}

impl<'scope, T: Element> TypedRequest<'scope, T> {
    fn plain(req: Request<'scope>) -> Self {
        TypedRequest { req: Some(req), temp: None, dst: None }
    }

    /// Unpacks a completed receive.
    fn finish(&mut self, st: Status) -> Result<Status> {
        if let (Some(dst), Some(temp)) = (self.dst.as_mut(), self.temp.as_ref()) {
            dst.fill(temp.head(st.len()), st.source())?;
        }
        Ok(st)
    }

    /// Waits for the operation; a packed receive is checked and unpacked into its buffer.
    ///
    /// # Errors
    /// As [`Request::wait`]; [`Error::InvalidValue`] or [`Error::TypeMismatch`] for a
    /// received message that is not valid elements (the buffer is unchanged then).
    pub fn wait(mut self) -> Result<Status> {
        let Some(req) = self.req.take() else {
            return Err(Error::State("typed request already completed".into()));
        };
        match req.wait() {
            Ok(st) => self.finish(st),
            Err(e) => {
                // The engine has settled the operation, but keep to the safe side.
                if let Some(t) = self.temp.take() {
                    std::mem::forget(t);
                }
                Err(e)
            }
        }
    }

    /// Whether the operation has completed (then as [`TypedRequest::wait`]); `Ok(None)` if
    /// not yet. After it has returned a status, it returns an error.
    ///
    /// # Errors
    /// As [`TypedRequest::wait`].
    pub fn test(&mut self) -> Result<Option<Status>> {
        let Some(req) = self.req.as_mut() else {
            return Err(Error::State("typed request already completed".into()));
        };
        match req.test()? {
            None => Ok(None),
            Some(st) => {
                self.req = None;
                self.finish(st).map(Some)
            }
        }
    }
}

impl<T: Element> Drop for TypedRequest<'_, T> {
    fn drop(&mut self) {
        let Some(req) = self.req.take() else { return };
        if std::thread::panicking() {
            // The scope abandons the operation; its temporary must outlive whatever the
            // engine still holds.
            if let Some(t) = self.temp.take() {
                std::mem::forget(t);
            }
            return;
        }
        match req.wait() {
            Ok(st) => {
                let _ = self.finish(st);
            }
            Err(_) => {
                if let Some(t) = self.temp.take() {
                    std::mem::forget(t);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Element;

    #[derive(Clone, Copy, Debug, PartialEq, Element)]
    struct Padded {
        flag: bool,
        x: u32,
        pair: (u8, i16),
        grid: [[bool; 2]; 2],
    }

    #[derive(Clone, Copy, Debug, PartialEq, Element)]
    struct Dense(u32, [u16; 2]);

    fn padded(i: u8) -> Padded {
        Padded { flag: i % 2 == 1, x: u32::from(i) * 1000, pair: (i, -i16::from(i)), grid: [[true, false], [i > 1, true]] }
    }

    /// The derived maps: a struct with padding and bools packs to its data bytes; one without
    /// padding is dense and received in place.
    #[test]
    fn derived_maps() {
        let m = Padded::type_map();
        assert_eq!(m.size(), 1 + 4 + 1 + 2 + 4);
        assert_eq!(m.extent() as usize, std::mem::size_of::<Padded>());
        assert_eq!(m.bools().len(), 5);
        assert!(!m.is_dense());
        assert!(std::ptr::eq(m, Padded::type_map()), "built once");
        assert!(Dense::type_map().is_dense() && Dense::type_map().direct_recv());
    }

    /// Typed point-to-point and collectives of a struct with padding and bools, through
    /// layouts, blocking and not; a bad bool is an error that leaves the buffer alone.
    #[test]
    fn typed_calls() {
        let got = crate::run_local(2, |w| {
            let peer = 1 - w.rank();
            let mut out = Vec::new();
            let every_other = Layout::vector(2, 1, 2);
            if w.rank() == 0 {
                let ps: Vec<Padded> = (0..4).map(padded).collect();
                w.send_typed(&ps, peer, 1).unwrap();
                w.send_typed((&ps, &every_other), peer, 2).unwrap();
                w.send(&[1u8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 7], peer, 3).unwrap();
                let col: Vec<u64> = (0..6).collect();
                w.send_typed(Buf::laid(&col, &Layout::vector(3, 1, 2)), peer, 4).unwrap();
            } else {
                let mut ps = [padded(9); 4];
                w.recv_typed(&mut ps, peer, 1).unwrap();
                out.push(ps == [padded(0), padded(1), padded(2), padded(3)]);
                let mut two = [padded(9); 4];
                let st = w.recv_typed((&mut two[..], &Layout::indexed(&[1, 1], &[3, 0])), peer, 2).unwrap();
                out.push(st.count_typed::<Padded>() == 2 && two == [padded(2), padded(9), padded(9), padded(0)]);
                let mut keep = [padded(5)];
                let bad = w.recv_typed(&mut keep, peer, 3);
                out.push(matches!(bad, Err(Error::InvalidValue { byte: 7, .. })) && keep == [padded(5)]);
                let mut col = [0u64; 3];
                w.recv_typed(&mut col, peer, 4).unwrap();
                out.push(col == [0, 2, 4]);
            }
            let mine = [padded(w.rank() as u8), padded(3)];
            let mut back = [padded(9); 2];
            let swap = Layout::indexed(&[1, 1], &[1, 0]);
            crate::scope(|s| {
                let r = w.irecv_typed(s, (&mut back[..], &swap), peer, 5).unwrap();
                w.isend_typed(s, &mine, peer, 5).unwrap().wait().unwrap();
                r.wait().unwrap();
            });
            out.push(back == [padded(3), padded(peer as u8)]);
            let mut all = [padded(9); 2];
            w.allgather_typed(&[padded(w.rank() as u8)], &mut all).unwrap();
            out.push(all == [padded(0), padded(1)]);
            let mut b = [Dense(w.rank() as u32, [1, 2])];
            w.bcast_typed(&mut b, 1).unwrap();
            out.push(b == [Dense(1, [1, 2])]);
            // Sum a column of a 2x3 matrix into the last row of another, and at the root.
            let m: Vec<i64> = (0..6).map(|i| i * (w.rank() as i64 + 1)).collect();
            let col1 = Layout::vector(2, 1, 3).offset(1);
            let mut sum = vec![0i64; 6];
            let row = Layout::vector(1, 2, 0).offset(4);
            w.allreduce_typed((&m, &col1), (&mut sum, &row), Op::Sum).unwrap();
            out.push(sum == [0, 0, 0, 0, 3, 12]);
            let mut at_root = [0i64; 2];
            w.reduce_typed((&m, &col1), Some(BufMut::laid(&mut at_root, &Layout::indexed(&[1, 1], &[1, 0]))), Op::Max, 0).unwrap();
            out.push(w.rank() == 1 || at_root == [8, 2]);
            out
        });
        assert_eq!(got, vec![vec![true; 5], vec![true; 9]]);
    }
}
