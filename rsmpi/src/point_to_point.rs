//! Point-to-point communication: sources, destinations, statuses, matched messages.

use std::mem::MaybeUninit;

use crate::bytes::{owned_bytes, send_bytes};
use crate::datatype::traits::*;
use crate::datatype::{pack, TypeDesc};
use crate::ffi::{RSMPI_ANY_SOURCE, RSMPI_ANY_TAG};
use crate::request::{Pending, Request, Scope, Unpack};
pub use crate::status::Status;
use crate::topology::sealed::AsHandle;
use crate::topology::{traits::*, AnyProcess, CommunicatorRelation, Process, Rank};
use crate::{ok, uidx, Tag};

/// The traits of this module that `mpi::traits::*` brings in.
pub mod traits {
    pub use super::{Destination, MatchedReceiveVec, Source};
}

/// Where received bytes go: straight into the buffer when its type allows, else a temporary
/// that is unpacked afterwards.
pub(crate) struct RecvSpace {
    pub(crate) ptr: *mut u8,
    pub(crate) len: usize,
    pub(crate) unpack: Option<Unpack>,
}

impl RecvSpace {
    pub(crate) fn new<B: BufferMut + ?Sized>(buf: &mut B, call: &'static str) -> RecvSpace {
        let dt = buf.as_datatype();
        let d = dt.type_desc();
        let count = uidx(buf.count(), call);
        let base = buf.pointer_mut() as *mut u8;
        Self::with(base, count, d, call)
    }

    pub(crate) fn with(base: *mut u8, count: usize, d: &TypeDesc, call: &'static str) -> RecvSpace {
        let len = count * d.size();
        if d.direct_recv() {
            return RecvSpace { ptr: base, len, unpack: None };
        }
        let mut temp = vec![0u8; len];
        let ptr = temp.as_mut_ptr();
        RecvSpace { ptr, len, unpack: Some(Unpack { base, desc: d.clone(), temp, parts: None, count, call }) }
    }

    /// The bytes to receive into.
    ///
    /// # Safety
    /// The buffer the space was made for must stay valid and unaliased while the slice lives.
    pub(crate) unsafe fn bytes<'x>(&self) -> &'x mut [u8] {
        if self.len == 0 {
            return &mut [];
        }
        // SAFETY: `ptr` is the user's buffer (valid for `len` bytes, as `BufferMut` promises)
        // or the temporary's heap storage, which `unpack` keeps alive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }

    pub(crate) fn finish(self, received: usize) {
        if let Some(u) = self.unpack {
            u.apply(received);
        }
    }
}

/// rsmpi's source rank to tmpi's source.
pub(crate) fn tsource(r: Rank) -> tmpi::Source {
    if r == RSMPI_ANY_SOURCE {
        tmpi::Source::Any
    } else {
        tmpi::Source::Rank(uidx(r, "receive (source rank)"))
    }
}

/// rsmpi's tag to tmpi's tag match.
pub(crate) fn ttag_match(t: Tag) -> tmpi::TagMatch {
    if t == RSMPI_ANY_TAG {
        tmpi::TagMatch::Any
    } else {
        tmpi::TagMatch::Tag(ttag(t))
    }
}

/// rsmpi's tag to tmpi's tag.
pub(crate) fn ttag(t: Tag) -> tmpi::Tag {
    u32::try_from(t).ok().filter(|&t| t <= tmpi::TAG_UB).unwrap_or_else(|| panic!("mpi: tag {t} is outside 0..={}", tmpi::TAG_UB))
}

/// Starts a tmpi non-blocking operation and takes it out of its tmpi scope.
///
/// # Safety
/// The buffers the operation uses must stay valid until the returned request completes or is
/// dropped.
pub(crate) unsafe fn detached(
    f: impl for<'s> FnOnce(&'s tmpi::Scope<'s, '_>) -> tmpi::Result<tmpi::Request<'s>>,
    call: &str,
) -> tmpi::Detached {
    tmpi::scope(|s| {
        let r = ok(f(s), call);
        // SAFETY: forwarded to the caller.
        unsafe { r.detach(s) }
    })
}

/// Something that can be received from.
///
/// # Safety
/// `source_rank` must be a rank of the communicator or `RSMPI_ANY_SOURCE`.
pub unsafe trait Source: AsCommunicator {
    /// The rank received from (`RSMPI_ANY_SOURCE` for any).
    fn source_rank(&self) -> Rank;

    /// Waits for a message with `tag` and returns its status without receiving it.
    fn probe_with_tag(&self, tag: Tag) -> Status {
        let c = &self.as_communicator().as_handle().comm;
        Status::from_tmpi(&ok(c.probe(tsource(self.source_rank()), ttag_match(tag)), "probe"))
    }

    /// Waits for any message and returns its status without receiving it.
    fn probe(&self) -> Status {
        self.probe_with_tag(RSMPI_ANY_TAG)
    }

    /// Waits for a message with `tag` and claims it for a later receive.
    fn matched_probe_with_tag(&self, tag: Tag) -> (Message, Status) {
        let c = &self.as_communicator().as_handle().comm;
        let m = ok(c.mprobe(tsource(self.source_rank()), ttag_match(tag)), "matched_probe");
        let st = Status::from_tmpi(&m.status());
        (Message(Some(m)), st)
    }

    /// As [`Source::matched_probe_with_tag`] for any tag.
    fn matched_probe(&self) -> (Message, Status) {
        self.matched_probe_with_tag(RSMPI_ANY_TAG)
    }

    /// Receives one value with `tag`.
    fn receive_with_tag<Msg: Equivalence>(&self, tag: Tag) -> (Msg, Status) {
        let mut v = MaybeUninit::<Msg>::uninit();
        let st = recv_raw(self, v.as_mut_ptr() as *mut u8, 1, &Msg::equivalent_datatype(), tag, "receive");
        if st.bytes() == 0 && Msg::equivalent_datatype().type_desc().size() > 0 {
            panic!("mpi: receive: received an empty message where one value was expected");
        }
        // SAFETY: one whole value was received into `v` (checked above).
        (unsafe { v.assume_init() }, st)
    }

    /// Receives one value with any tag.
    fn receive<Msg: Equivalence>(&self) -> (Msg, Status) {
        self.receive_with_tag(RSMPI_ANY_TAG)
    }

    /// Receives into a buffer, with `tag`.
    fn receive_into_with_tag<Buf: ?Sized + BufferMut>(&self, buf: &mut Buf, tag: Tag) -> Status {
        let count = uidx(buf.count(), "receive_into");
        let base = buf.pointer_mut() as *mut u8;
        recv_raw(self, base, count, &buf.as_datatype(), tag, "receive_into")
    }

    /// Receives into a buffer, any tag.
    fn receive_into<Buf: ?Sized + BufferMut>(&self, buf: &mut Buf) -> Status {
        self.receive_into_with_tag(buf, RSMPI_ANY_TAG)
    }

    /// Receives a message of any length with `tag` into a new vector.
    fn receive_vec_with_tag<Msg: Equivalence>(&self, tag: Tag) -> (Vec<Msg>, Status) {
        self.matched_probe_with_tag(tag).matched_receive_vec()
    }

    /// Receives a message of any length into a new vector.
    fn receive_vec<Msg: Equivalence>(&self) -> (Vec<Msg>, Status) {
        self.receive_vec_with_tag(RSMPI_ANY_TAG)
    }

    /// Starts receiving into a buffer, with `tag`.
    fn immediate_receive_into_with_tag<'a, Sc, Buf>(&self, scope: Sc, buf: &'a mut Buf, tag: Tag) -> Request<'a, Buf, Sc>
    where
        Buf: 'a + BufferMut + ?Sized,
        Sc: Scope<'a>,
    {
        let space = RecvSpace::new(buf, "immediate_receive_into");
        let c = self.as_communicator().as_handle().comm.clone();
        let (src, t) = (tsource(self.source_rank()), ttag_match(tag));
        // SAFETY: `space` points into `buf` (borrowed for 'a, which the request holds) or
        // into its own temporary, which the pending operation keeps until completion.
        let req = unsafe { detached(|s| c.irecv(s, space.bytes(), src, t), "immediate_receive_into") };
        let p = Pending { reqs: vec![req], unpack: space.unpack, ..Pending::default() };
        Request::new(p, buf, scope)
    }

    /// Starts receiving into a buffer, any tag.
    fn immediate_receive_into<'a, Sc, Buf>(&self, scope: Sc, buf: &'a mut Buf) -> Request<'a, Buf, Sc>
    where
        Buf: 'a + BufferMut + ?Sized,
        Sc: Scope<'a>,
    {
        self.immediate_receive_into_with_tag(scope, buf, RSMPI_ANY_TAG)
    }

    /// Starts receiving one value with `tag`; the value is delivered by the future.
    fn immediate_receive_with_tag<Msg: Equivalence>(&self, tag: Tag) -> ReceiveFuture<Msg> {
        let mut val: Box<MaybeUninit<Msg>> = Box::new(MaybeUninit::uninit());
        let dt = Msg::equivalent_datatype();
        let space = RecvSpace::with(val.as_mut_ptr() as *mut u8, 1, dt.type_desc(), "immediate_receive");
        let c = self.as_communicator().as_handle().comm.clone();
        let (src, t) = (tsource(self.source_rank()), ttag_match(tag));
        // SAFETY: the box's heap storage (or the temporary) lives in the future beside the
        // request and is not touched until it completes.
        let req = unsafe { detached(|s| c.irecv(s, space.bytes(), src, t), "immediate_receive") };
        let p = Pending { reqs: vec![req], unpack: space.unpack, ..Pending::default() };
        ReceiveFuture { req: Some(Box::new(p)), val }
    }

    /// Starts receiving one value, any tag.
    fn immediate_receive<Msg: Equivalence>(&self) -> ReceiveFuture<Msg> {
        self.immediate_receive_with_tag(RSMPI_ANY_TAG)
    }

    /// The status of a message with `tag` if one is waiting.
    fn immediate_probe_with_tag(&self, tag: Tag) -> Option<Status> {
        let c = &self.as_communicator().as_handle().comm;
        ok(c.iprobe(tsource(self.source_rank()), ttag_match(tag)), "immediate_probe").map(|s| Status::from_tmpi(&s))
    }

    /// The status of any waiting message.
    fn immediate_probe(&self) -> Option<Status> {
        self.immediate_probe_with_tag(RSMPI_ANY_TAG)
    }

    /// Claims a waiting message with `tag`, if there is one.
    fn immediate_matched_probe_with_tag(&self, tag: Tag) -> Option<(Message, Status)> {
        let c = &self.as_communicator().as_handle().comm;
        ok(c.improbe(tsource(self.source_rank()), ttag_match(tag)), "immediate_matched_probe").map(|m| {
            let st = Status::from_tmpi(&m.status());
            (Message(Some(m)), st)
        })
    }

    /// Claims any waiting message, if there is one.
    fn immediate_matched_probe(&self) -> Option<(Message, Status)> {
        self.immediate_matched_probe_with_tag(RSMPI_ANY_TAG)
    }
}

fn recv_raw<S: Source + ?Sized, D: Datatype>(src: &S, base: *mut u8, count: usize, dt: &D, tag: Tag, call: &'static str) -> Status {
    let space = RecvSpace::with(base, count, dt.type_desc(), call);
    let c = &src.as_communicator().as_handle().comm;
    // SAFETY: the caller's buffer is borrowed for this call.
    let st = ok(c.recv(unsafe { space.bytes() }, tsource(src.source_rank()), ttag_match(tag)), call);
    space.finish(st.len());
    Status::from_tmpi(&st)
}

// SAFETY: ANY_SOURCE.
unsafe impl Source for AnyProcess<'_> {
    fn source_rank(&self) -> Rank {
        RSMPI_ANY_SOURCE
    }
}

// SAFETY: a rank of the communicator (checked by `process_at_rank`).
unsafe impl Source for Process<'_> {
    fn source_rank(&self) -> Rank {
        self.rank()
    }
}

/// Bytes of the attached buffer one buffered send takes beyond its data (MPI's
/// `MPI_BSEND_OVERHEAD`).
pub const BSEND_OVERHEAD: usize = tmpi::BSEND_OVERHEAD;

/// Something that can be sent to.
pub trait Destination: AsCommunicator {
    /// The rank sent to.
    fn destination_rank(&self) -> Rank;

    /// Sends a buffer with `tag` (standard mode).
    fn send_with_tag<Buf: ?Sized + Buffer>(&self, buf: &Buf, tag: Tag) {
        let c = &self.as_communicator().as_handle().comm;
        let dest = uidx(self.destination_rank(), "send");
        send_bytes(buf, |b| ok(c.send(b, dest, ttag(tag)), "send"));
    }

    /// Sends a buffer (tag 0).
    fn send<Buf: ?Sized + Buffer>(&self, buf: &Buf) {
        self.send_with_tag(buf, Tag::default())
    }

    /// Sends through the attached buffer: returns once the message is copied there, whether
    /// or not a receive has matched (`MPI_Bsend`). Panics when the buffer is too small.
    fn buffered_send_with_tag<Buf: ?Sized + Buffer>(&self, buf: &Buf, tag: Tag) {
        let c = &self.as_communicator().as_handle().comm;
        let dest = uidx(self.destination_rank(), "buffered_send");
        send_bytes(buf, |b| ok(c.bsend(b, dest, ttag(tag)), "buffered_send"));
    }

    /// [`Destination::buffered_send_with_tag`] with tag 0.
    fn buffered_send<Buf: ?Sized + Buffer>(&self, buf: &Buf) {
        self.buffered_send_with_tag(buf, Tag::default())
    }

    /// Sends and returns once a receive has matched (`MPI_Ssend`).
    fn synchronous_send_with_tag<Buf: ?Sized + Buffer>(&self, buf: &Buf, tag: Tag) {
        let c = &self.as_communicator().as_handle().comm;
        let dest = uidx(self.destination_rank(), "synchronous_send");
        send_bytes(buf, |b| ok(c.ssend(b, dest, ttag(tag)), "synchronous_send"));
    }

    /// [`Destination::synchronous_send_with_tag`] with tag 0.
    fn synchronous_send<Buf: ?Sized + Buffer>(&self, buf: &Buf) {
        self.synchronous_send_with_tag(buf, Tag::default())
    }

    /// Sends, asserting that the receive is already posted (`MPI_Rsend`; tmpi delivers it as
    /// a standard send, which MPI allows).
    ///
    /// # Safety
    /// The matching receive must have been posted (MPI's rule; nothing unsafe happens here if
    /// it was not).
    unsafe fn ready_send_with_tag<Buf: ?Sized + Buffer>(&self, buf: &Buf, tag: Tag) {
        let c = &self.as_communicator().as_handle().comm;
        let dest = uidx(self.destination_rank(), "ready_send");
        send_bytes(buf, |b| ok(c.rsend(b, dest, ttag(tag)), "ready_send"));
    }

    /// [`Destination::ready_send_with_tag`] with tag 0.
    ///
    /// # Safety
    /// As [`Destination::ready_send_with_tag`].
    unsafe fn ready_send<Buf: ?Sized + Buffer>(&self, buf: &Buf) {
        // SAFETY: forwarded.
        unsafe { self.ready_send_with_tag(buf, Tag::default()) }
    }

    /// Starts a standard send with `tag`.
    fn immediate_send_with_tag<'a, Sc, Buf>(&self, scope: Sc, buf: &'a Buf, tag: Tag) -> Request<'a, Buf, Sc>
    where
        Buf: 'a + Buffer + ?Sized,
        Sc: Scope<'a>,
    {
        start_send(self, scope, buf, tag, SendMode::Standard)
    }

    /// Starts a standard send (tag 0).
    fn immediate_send<'a, Sc, Buf>(&self, scope: Sc, buf: &'a Buf) -> Request<'a, Buf, Sc>
    where
        Buf: 'a + Buffer + ?Sized,
        Sc: Scope<'a>,
    {
        self.immediate_send_with_tag(scope, buf, Tag::default())
    }

    /// Starts a buffered send with `tag` (complete once copied to the attached buffer).
    fn immediate_buffered_send_with_tag<'a, Sc, Buf>(&self, scope: Sc, buf: &'a Buf, tag: Tag) -> Request<'a, Buf, Sc>
    where
        Buf: 'a + Buffer + ?Sized,
        Sc: Scope<'a>,
    {
        self.buffered_send_with_tag(buf, tag);
        Request::new(Pending::done(Status::empty()), buf, scope)
    }

    /// Starts a buffered send (tag 0).
    fn immediate_buffered_send<'a, Sc, Buf>(&self, scope: Sc, buf: &'a Buf) -> Request<'a, Buf, Sc>
    where
        Buf: 'a + Buffer + ?Sized,
        Sc: Scope<'a>,
    {
        self.immediate_buffered_send_with_tag(scope, buf, Tag::default())
    }

    /// Starts a synchronous send with `tag`.
    fn immediate_synchronous_send_with_tag<'a, Sc, Buf>(&self, scope: Sc, buf: &'a Buf, tag: Tag) -> Request<'a, Buf, Sc>
    where
        Buf: 'a + Buffer + ?Sized,
        Sc: Scope<'a>,
    {
        start_send(self, scope, buf, tag, SendMode::Synchronous)
    }

    /// Starts a synchronous send (tag 0).
    fn immediate_synchronous_send<'a, Sc, Buf>(&self, scope: Sc, buf: &'a Buf) -> Request<'a, Buf, Sc>
    where
        Buf: 'a + Buffer + ?Sized,
        Sc: Scope<'a>,
    {
        self.immediate_synchronous_send_with_tag(scope, buf, Tag::default())
    }

    /// Starts a ready send with `tag`.
    ///
    /// # Safety
    /// As [`Destination::ready_send_with_tag`].
    unsafe fn immediate_ready_send_with_tag<'a, Sc, Buf>(&self, scope: Sc, buf: &'a Buf, tag: Tag) -> Request<'a, Buf, Sc>
    where
        Buf: 'a + Buffer + ?Sized,
        Sc: Scope<'a>,
    {
        start_send(self, scope, buf, tag, SendMode::Ready)
    }

    /// Starts a ready send (tag 0).
    ///
    /// # Safety
    /// As [`Destination::ready_send_with_tag`].
    unsafe fn immediate_ready_send<'a, Sc, Buf>(&self, scope: Sc, buf: &'a Buf) -> Request<'a, Buf, Sc>
    where
        Buf: 'a + Buffer + ?Sized,
        Sc: Scope<'a>,
    {
        // SAFETY: forwarded.
        unsafe { self.immediate_ready_send_with_tag(scope, buf, Tag::default()) }
    }
}

#[derive(Clone, Copy)]
enum SendMode {
    Standard,
    Synchronous,
    Ready,
}

fn start_send<'a, D, Sc, Buf>(dst: &D, scope: Sc, buf: &'a Buf, tag: Tag, mode: SendMode) -> Request<'a, Buf, Sc>
where
    D: Destination + ?Sized,
    Buf: 'a + Buffer + ?Sized,
    Sc: Scope<'a>,
{
    let c = dst.as_communicator().as_handle().comm.clone();
    let dest = uidx(dst.destination_rank(), "immediate_send");
    let t = ttag(tag);
    let dt = buf.as_datatype();
    let d = dt.type_desc();
    let count = uidx(buf.count(), "immediate_send");
    let mut keep = Vec::new();
    let (ptr, len) = if d.is_dense() {
        (buf.pointer() as *const u8, count * d.size())
    } else {
        // SAFETY: `Buffer` promises `count` readable elements.
        let v = unsafe { pack::pack(buf.pointer() as *const u8, count, d) };
        let p = (v.as_ptr(), v.len());
        keep.push(v);
        p
    };
    // SAFETY: the bytes are `buf`'s (borrowed for 'a, held by the request) or the packed copy
    // kept in the pending operation until it completes.
    let bytes = unsafe {
        if len == 0 {
            &[][..]
        } else {
            std::slice::from_raw_parts(ptr, len)
        }
    };
    // SAFETY: as above.
    let req = unsafe {
        detached(
            |s| match mode {
                SendMode::Standard => c.isend(s, bytes, dest, t),
                SendMode::Synchronous => c.issend(s, bytes, dest, t),
                SendMode::Ready => c.irsend(s, bytes, dest, t),
            },
            "immediate_send",
        )
    };
    Request::new(Pending { reqs: vec![req], keep, ..Pending::default() }, buf, scope)
}

impl Destination for Process<'_> {
    fn destination_rank(&self) -> Rank {
        self.rank()
    }
}

/// A message claimed by a matched probe, to be received exactly once.
#[must_use]
pub struct Message(Option<tmpi::Message>);

impl Message {
    /// Whether the message came from the null process (never, here).
    pub fn is_no_proc(&self) -> bool {
        false
    }

    fn take(&mut self) -> tmpi::Message {
        self.0.take().expect("mpi: a matched message is received once")
    }

    /// Receives the message as one value.
    pub fn matched_receive<Msg: Equivalence>(self) -> (Msg, Status) {
        let mut v = MaybeUninit::<Msg>::uninit();
        let dt = Msg::equivalent_datatype();
        let st = self.recv_raw(v.as_mut_ptr() as *mut u8, 1, dt.type_desc(), "matched_receive");
        if st.bytes() == 0 && dt.type_desc().size() > 0 {
            panic!("mpi: matched_receive: received an empty message where one value was expected");
        }
        // SAFETY: one whole value was received.
        (unsafe { v.assume_init() }, st)
    }

    fn recv_raw(mut self, base: *mut u8, count: usize, d: &TypeDesc, call: &'static str) -> Status {
        let space = RecvSpace::with(base, count, d, call);
        // SAFETY: the caller's buffer is borrowed for this call.
        let st = ok(self.take().recv(unsafe { space.bytes() }), call);
        space.finish(st.len());
        Status::from_tmpi(&st)
    }

    /// Receives the message into a buffer.
    pub fn matched_receive_into<Buf: ?Sized + BufferMut>(self, buf: &mut Buf) -> Status {
        let count = uidx(buf.count(), "matched_receive_into");
        let base = buf.pointer_mut() as *mut u8;
        self.recv_raw(base, count, buf.as_datatype().type_desc(), "matched_receive_into")
    }

    /// Starts receiving the message into a buffer.
    pub fn immediate_matched_receive_into<'a, Sc, Buf>(mut self, scope: Sc, buf: &'a mut Buf) -> Request<'a, Buf, Sc>
    where
        Buf: 'a + BufferMut + ?Sized,
        Sc: Scope<'a>,
    {
        let space = RecvSpace::new(buf, "immediate_matched_receive_into");
        let m = self.take();
        // SAFETY: as for `immediate_receive_into`.
        let req = unsafe { detached(|s| m.irecv(s, space.bytes()), "immediate_matched_receive_into") };
        Request::new(Pending { reqs: vec![req], unpack: space.unpack, ..Pending::default() }, buf, scope)
    }
}

impl Drop for Message {
    fn drop(&mut self) {
        if self.0.is_some() && !std::thread::panicking() {
            panic!("mpi: a matched message was dropped without being received");
        }
    }
}

/// Receiving a matched message of any length into a vector.
pub trait MatchedReceiveVec {
    /// Receives the message into a new vector.
    fn matched_receive_vec<Msg: Equivalence>(self) -> (Vec<Msg>, Status);
}

impl MatchedReceiveVec for (Message, Status) {
    fn matched_receive_vec<Msg: Equivalence>(self) -> (Vec<Msg>, Status) {
        let (m, st) = self;
        let dt = Msg::equivalent_datatype();
        let size = dt.type_desc().size();
        let n = st.bytes().checked_div(size).unwrap_or(0);
        let mut v: Vec<MaybeUninit<Msg>> = (0..n).map(|_| MaybeUninit::uninit()).collect();
        let got = m.recv_raw(v.as_mut_ptr() as *mut u8, n, dt.type_desc(), "receive_vec");
        let k = got.bytes().checked_div(size).unwrap_or(0);
        v.truncate(k);
        // SAFETY: the first `k` elements were received whole; MaybeUninit<Msg> has Msg's layout.
        let v = unsafe {
            let mut v = std::mem::ManuallyDrop::new(v);
            Vec::from_raw_parts(v.as_mut_ptr() as *mut Msg, v.len(), v.capacity())
        };
        (v, got)
    }
}

/// A value being received by [`Source::immediate_receive`].
#[must_use]
pub struct ReceiveFuture<T> {
    req: Option<Box<Pending>>,
    val: Box<MaybeUninit<T>>,
}

impl<T> ReceiveFuture<T> {
    /// Waits for the value.
    pub fn get(mut self) -> (T, Status) {
        let st = self.req.take().expect("a future holds its request").wait();
        (self.value(&st), st)
    }

    fn value(&mut self, st: &Status) -> T {
        assert!(
            st.bytes() > 0 || std::mem::size_of::<T>() == 0,
            "mpi: immediate_receive: received an empty message where one value was expected"
        );
        // SAFETY: the receive completed with a whole value (checked above).
        unsafe { std::ptr::read(self.val.as_ptr()) }
    }

    /// The value if it has arrived, else the future back.
    pub fn r#try(mut self) -> Result<(T, Status), Self> {
        match self.req.as_mut().expect("a future holds its request").test() {
            Some(st) => {
                self.req = None;
                Ok((self.value(&st), st))
            }
            None => Err(self),
        }
    }
}

fn check_same_comm<D: Destination + ?Sized, S: Source + ?Sized>(d: &D, s: &S) {
    let rel = s.as_communicator().compare(d.as_communicator());
    assert!(rel == CommunicatorRelation::Identical, "mpi: send_receive: the source and the destination must be on the same communicator");
}

/// Sends `msg` and receives a value, with tags.
pub fn send_receive_with_tags<M, D, R, S>(msg: &M, destination: &D, sendtag: Tag, source: &S, receivetag: Tag) -> (R, Status)
where
    M: Equivalence,
    D: Destination,
    R: Equivalence,
    S: Source,
{
    let mut v = MaybeUninit::<R>::uninit();
    let dt = R::equivalent_datatype();
    // SAFETY: `v` is one writable R.
    let mut view = unsafe { crate::datatype::MutView::with_count_and_datatype(&mut *(v.as_mut_ptr() as *mut RawBytes), 1, &dt) };
    let st = send_receive_into_with_tags(msg, destination, sendtag, &mut view, source, receivetag);
    assert!(st.bytes() > 0 || dt.type_desc().size() == 0, "mpi: send_receive: received an empty message where one value was expected");
    // SAFETY: one whole R was received.
    (unsafe { v.assume_init() }, st)
}

/// Untyped memory for a [`MutView`](crate::datatype::MutView) whose datatype says what it is.
struct RawBytes;

// SAFETY: only the pointer is used; the view's datatype describes the memory.
unsafe impl PointerMut for RawBytes {
    fn pointer_mut(&mut self) -> *mut std::os::raw::c_void {
        self as *mut RawBytes as *mut std::os::raw::c_void
    }
}

/// Sends `msg` and receives a value (any tag).
pub fn send_receive<R, M, D, S>(msg: &M, destination: &D, source: &S) -> (R, Status)
where
    M: Equivalence,
    D: Destination,
    R: Equivalence,
    S: Source,
{
    send_receive_with_tags(msg, destination, Tag::default(), source, RSMPI_ANY_TAG)
}

/// Sends a buffer and receives into another, with tags.
pub fn send_receive_into_with_tags<M, D, B, S>(msg: &M, destination: &D, sendtag: Tag, buf: &mut B, source: &S, receivetag: Tag) -> Status
where
    M: ?Sized + Buffer,
    D: Destination,
    B: ?Sized + BufferMut,
    S: Source,
{
    check_same_comm(destination, source);
    let c = &source.as_communicator().as_handle().comm;
    let dest = uidx(destination.destination_rank(), "send_receive");
    let space = RecvSpace::new(buf, "send_receive");
    let st = send_bytes(msg, |b| {
        // SAFETY: `buf` is borrowed for this call.
        ok(
            c.sendrecv(b, dest, ttag(sendtag), unsafe { space.bytes() }, tsource(source.source_rank()), ttag_match(receivetag)),
            "send_receive",
        )
    });
    space.finish(st.len());
    Status::from_tmpi(&st)
}

/// Sends a buffer and receives into another (any tag).
pub fn send_receive_into<M, D, B, S>(msg: &M, destination: &D, buf: &mut B, source: &S) -> Status
where
    M: ?Sized + Buffer,
    D: Destination,
    B: ?Sized + BufferMut,
    S: Source,
{
    send_receive_into_with_tags(msg, destination, Tag::default(), buf, source, RSMPI_ANY_TAG)
}

/// Sends a buffer and receives into the same buffer, with tags.
pub fn send_receive_replace_into_with_tags<B, D, S>(buf: &mut B, destination: &D, sendtag: Tag, source: &S, receivetag: Tag) -> Status
where
    B: ?Sized + Buffer + BufferMut,
    D: Destination,
    S: Source,
{
    check_same_comm(destination, source);
    let out = owned_bytes(buf);
    let c = &source.as_communicator().as_handle().comm;
    let dest = uidx(destination.destination_rank(), "send_receive_replace");
    let space = RecvSpace::new(buf, "send_receive_replace");
    // SAFETY: `buf` is borrowed for this call; `out` is a copy of what it held.
    let st = ok(
        c.sendrecv(&out, dest, ttag(sendtag), unsafe { space.bytes() }, tsource(source.source_rank()), ttag_match(receivetag)),
        "send_receive_replace",
    );
    space.finish(st.len());
    Status::from_tmpi(&st)
}

/// Sends a buffer and receives into the same buffer (any tag).
pub fn send_receive_replace_into<B, D, S>(buf: &mut B, destination: &D, source: &S) -> Status
where
    B: ?Sized + Buffer + BufferMut,
    D: Destination,
    S: Source,
{
    send_receive_replace_into_with_tags(buf, destination, Tag::default(), source, RSMPI_ANY_TAG)
}
