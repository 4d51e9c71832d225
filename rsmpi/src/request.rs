//! Requests of non-blocking operations, their scopes and collections.
//!
//! As in rsmpi, a request borrows its buffer for a scope's lifetime and must be completed
//! (waited on, tested to completion, or handed to a guard or a collection) before the scope
//! ends; a scope that ends with a request outstanding aborts the process, since the buffer
//! could otherwise be touched after it is freed. Underneath, each request is a
//! [`tmpi::Detached`] request: one that is dropped unfinished is abandoned by tmpi (its buffer
//! forgotten), so no transfer ever touches memory after its owner lets go.

use std::cell::Cell;
use std::marker::PhantomData;

use crate::datatype::pack;
use crate::datatype::TypeDesc;
use crate::status::Status;

/// Where a completed receive's packed bytes go (buffers whose type is not dense).
pub(crate) struct Unpack {
    pub(crate) base: *mut u8,
    pub(crate) desc: TypeDesc,
    pub(crate) temp: Vec<u8>,
    /// Parts to unpack: (first element, elements, byte offset in `temp`); `None`: the whole
    /// received length at element 0.
    pub(crate) parts: Option<Vec<(usize, usize, usize)>>,
    pub(crate) count: usize,
    pub(crate) call: &'static str,
}

impl Unpack {
    pub(crate) fn apply(self, received: usize) {
        let ext = self.desc.extent();
        match self.parts {
            None => {
                let n = received.min(self.temp.len());
                // SAFETY: `base` points at `count` writable elements of `desc` (the request's
                // buffer, borrowed until the request completes, which is now).
                unsafe { pack::unpack(&self.temp[..n], self.base, self.count, &self.desc, self.call) }
            }
            Some(parts) => {
                for (first, n, off) in parts {
                    let bytes = &self.temp[off..off + n * self.desc.size()];
                    // SAFETY: as above, for the elements of this part.
                    unsafe { pack::unpack(bytes, self.base.wrapping_offset(first as isize * ext), n, &self.desc, self.call) }
                }
            }
        }
    }
}

/// The state of one rsmpi request: tmpi requests, what must stay alive while they run, and
/// what to do when they are done.
#[derive(Default)]
pub(crate) struct Pending {
    /// Dropped first: abandoning them makes tmpi forget the buffers below.
    pub(crate) reqs: Vec<tmpi::Detached>,
    /// The status to report (from the first request, or set at start for operations that
    /// completed at once).
    pub(crate) status: Option<Status>,
    pub(crate) unpack: Option<Unpack>,
    pub(crate) keep: Vec<Vec<u8>>,
    /// Runs after completion (a reduction's combine step, a value's move).
    pub(crate) after: Option<Box<dyn FnOnce()>>,
}

impl Pending {
    pub(crate) fn done(status: Status) -> Pending {
        Pending { status: Some(status), ..Pending::default() }
    }

    pub(crate) fn one(req: tmpi::Detached) -> Pending {
        Pending { reqs: vec![req], ..Pending::default() }
    }

    fn finish(&mut self) -> Status {
        let st = self.status.unwrap_or_else(Status::empty);
        if let Some(u) = self.unpack.take() {
            u.apply(st.bytes());
        }
        if let Some(f) = self.after.take() {
            f();
        }
        self.keep.clear();
        st
    }

    pub(crate) fn wait(&mut self) -> Status {
        let mut first = self.status.is_none();
        for mut r in self.reqs.drain(..) {
            let st = crate::ok(r.wait(), "wait");
            if first {
                self.status = Some(Status::from_tmpi(&st));
                first = false;
            }
        }
        self.finish()
    }

    pub(crate) fn test(&mut self) -> Option<Status> {
        let mut i = 0;
        while i < self.reqs.len() {
            match crate::ok(self.reqs[i].test(), "test") {
                Some(st) => {
                    if self.status.is_none() {
                        self.status = Some(Status::from_tmpi(&st));
                    }
                    self.reqs.remove(i);
                }
                None => i += 1,
            }
        }
        if self.reqs.is_empty() {
            Some(self.finish())
        } else {
            None
        }
    }

    pub(crate) fn cancel(&self) {
        for r in &self.reqs {
            crate::ok(r.cancel(), "cancel");
        }
    }
}

/// A scope that requests belong to.
///
/// # Safety
/// `unregister` must be called once per `register`, when a request completes.
pub unsafe trait Scope<'a> {
    /// A request joined the scope.
    fn register(&self);
    /// A request of the scope completed.
    ///
    /// # Safety
    /// Only for a registered request.
    unsafe fn unregister(&self);
}

/// The scope of requests that own their buffers or borrow `'static` ones.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct StaticScope;

// SAFETY: nothing to count: its requests borrow nothing that can be freed.
unsafe impl Scope<'static> for StaticScope {
    fn register(&self) {}
    unsafe fn unregister(&self) {}
}

/// The scope made by [`scope`]; aborts the process if it ends with requests outstanding.
#[derive(Debug)]
pub struct LocalScope<'a> {
    num_requests: Cell<usize>,
    phantom: PhantomData<Cell<&'a ()>>,
}

impl Drop for LocalScope<'_> {
    fn drop(&mut self) {
        if self.num_requests.get() != 0 {
            eprintln!(
                "mpi: a request scope ended with {} request(s) not completed; aborting (their buffers are about to be freed)",
                self.num_requests.get()
            );
            std::process::abort();
        }
    }
}

// SAFETY: counts requests; the scope's end checks the count.
unsafe impl<'a> Scope<'a> for &LocalScope<'a> {
    fn register(&self) {
        self.num_requests.set(self.num_requests.get() + 1);
    }
    unsafe fn unregister(&self) {
        self.num_requests.set(self.num_requests.get().checked_sub(1).expect("mpi: a request left its scope twice"));
    }
}

/// Runs `f` with a scope for requests; every request must be completed inside.
pub fn scope<'a, F, R>(f: F) -> R
where
    F: FnOnce(&LocalScope<'a>) -> R,
{
    f(&LocalScope { num_requests: Cell::new(0), phantom: PhantomData })
}

/// [`scope`] with a [`RequestCollection`] reserved for `reserve` requests.
pub fn multiple_scope<'a, F, R, D>(reserve: usize, f: F) -> R
where
    D: 'a + ?Sized,
    F: FnOnce(&LocalScope<'a>, &mut RequestCollection<'a, D>) -> R,
{
    f(&LocalScope { num_requests: Cell::new(0), phantom: PhantomData }, &mut RequestCollection::new(reserve))
}

/// A pending non-blocking operation on a buffer of type `D`.
#[must_use]
pub struct Request<'a, D: ?Sized, S: Scope<'a> = StaticScope> {
    inner: Option<Box<Pending>>,
    data: &'a D,
    scope: S,
    phantom: PhantomData<Cell<&'a ()>>,
}

impl<'a, D: ?Sized, S: Scope<'a>> std::fmt::Debug for Request<'a, D, S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Request").field("pending", &self.inner.is_some()).finish()
    }
}

impl<'a, D: ?Sized, S: Scope<'a>> Drop for Request<'a, D, S> {
    fn drop(&mut self) {
        if self.inner.is_some() && !std::thread::panicking() {
            panic!("mpi: a request was dropped without being completed");
        }
    }
}

impl<'a, D: ?Sized, S: Scope<'a>> Request<'a, D, S> {
    pub(crate) fn new(p: Pending, data: &'a D, scope: S) -> Self {
        scope.register();
        Request { inner: Some(Box::new(p)), data, scope, phantom: PhantomData }
    }

    fn take(mut self) -> (Box<Pending>, &'a D) {
        let p = self.inner.take().expect("a request holds its operation until completed");
        // SAFETY: registered in `new`; leaves the scope once, here (inner is now None).
        unsafe { self.scope.unregister() };
        (p, self.data)
    }

    /// Waits; returns the buffer.
    pub fn wait_for_data(self) -> &'a D {
        let (mut p, d) = self.take();
        p.wait();
        d
    }

    /// Waits; returns the status.
    pub fn wait(self) -> Status {
        let (mut p, _) = self.take();
        p.wait()
    }

    /// Waits, discarding the status.
    pub fn wait_without_status(self) {
        self.wait();
    }

    /// The status if complete, else the request back.
    pub fn test(self) -> Result<Status, Self> {
        self.test_with_data().map(|(s, _)| s)
    }

    /// The status and buffer if complete, else the request back.
    pub fn test_with_data(mut self) -> Result<(Status, &'a D), Self> {
        let st = self.inner.as_mut().expect("a request holds its operation until completed").test();
        match st {
            Some(st) => {
                let (_, d) = self.take();
                Ok((st, d))
            }
            None => Err(self),
        }
    }

    /// Asks to cancel the operation (a receive not yet matched); wait on it afterwards.
    pub fn cancel(&self) {
        if let Some(p) = &self.inner {
            p.cancel();
        }
    }

    /// Moves the request into a shorter scope.
    pub fn shrink_scope_to<'b, S2>(self, scope: S2) -> Request<'b, D, S2>
    where
        'a: 'b,
        S2: Scope<'b>,
    {
        let (p, d) = self.take();
        Request::new(*p, d, scope)
    }
}

/// Waits for any request of `requests` to complete, removes it and returns its index and
/// status; `None` when the list is empty.
pub fn wait_any<'a, D, S: Scope<'a>>(requests: &mut Vec<Request<'a, D, S>>) -> Option<(usize, Status)> {
    if requests.is_empty() {
        return None;
    }
    let mut spins = 0u32;
    loop {
        for i in 0..requests.len() {
            let st = requests[i].inner.as_mut().expect("a request holds its operation until completed").test();
            if let Some(st) = st {
                let r = requests.remove(i);
                let _ = r.take();
                return Some((i, st));
            }
        }
        spins = spins.wrapping_add(1);
        if spins % 64 == 0 {
            std::thread::yield_now();
        }
    }
}

/// Waits for its request when dropped.
#[derive(Debug)]
pub struct WaitGuard<'a, D: ?Sized, S: Scope<'a> = StaticScope>(Option<Request<'a, D, S>>);

impl<'a, D: ?Sized, S: Scope<'a>> Drop for WaitGuard<'a, D, S> {
    fn drop(&mut self) {
        if let Some(r) = self.0.take() {
            r.wait();
        }
    }
}

impl<'a, D: ?Sized, S: Scope<'a>> From<WaitGuard<'a, D, S>> for Request<'a, D, S> {
    fn from(mut g: WaitGuard<'a, D, S>) -> Self {
        g.0.take().expect("a guard holds its request")
    }
}

impl<'a, D: ?Sized, S: Scope<'a>> From<Request<'a, D, S>> for WaitGuard<'a, D, S> {
    fn from(r: Request<'a, D, S>) -> Self {
        WaitGuard(Some(r))
    }
}

/// Cancels, then waits for, its request when dropped.
#[derive(Debug)]
pub struct CancelGuard<'a, D: ?Sized, S: Scope<'a> = StaticScope>(WaitGuard<'a, D, S>);

impl<'a, D: ?Sized, S: Scope<'a>> Drop for CancelGuard<'a, D, S> {
    fn drop(&mut self) {
        if let Some(r) = &self.0 .0 {
            r.cancel();
        }
    }
}

impl<'a, D: ?Sized, S: Scope<'a>> From<CancelGuard<'a, D, S>> for WaitGuard<'a, D, S> {
    fn from(mut g: CancelGuard<'a, D, S>) -> Self {
        WaitGuard(g.0 .0.take())
    }
}

impl<'a, D: ?Sized, S: Scope<'a>> From<WaitGuard<'a, D, S>> for CancelGuard<'a, D, S> {
    fn from(g: WaitGuard<'a, D, S>) -> Self {
        CancelGuard(g)
    }
}

impl<'a, D: ?Sized, S: Scope<'a>> From<Request<'a, D, S>> for CancelGuard<'a, D, S> {
    fn from(r: Request<'a, D, S>) -> Self {
        CancelGuard(WaitGuard::from(r))
    }
}

enum Slot<'a, D: ?Sized> {
    Pending(Box<Pending>, &'a D),
    Done(Status, &'a D),
    Taken,
}

/// Requests waited on or tested together; each completion hands back the request's index
/// (in the order added), its status and its buffer.
pub struct RequestCollection<'a, D: ?Sized> {
    slots: Vec<Slot<'a, D>>,
    incomplete: usize,
}

impl<'a, D: ?Sized> Drop for RequestCollection<'a, D> {
    fn drop(&mut self) {
        if self.incomplete != 0 && !std::thread::panicking() {
            panic!("mpi: a request collection was dropped with {} request(s) not completed", self.incomplete);
        }
    }
}

impl<'a, D: ?Sized> RequestCollection<'a, D> {
    fn new(reserve: usize) -> Self {
        RequestCollection { slots: Vec::with_capacity(reserve), incomplete: 0 }
    }

    /// Requests not yet reported complete.
    pub fn incomplete(&self) -> usize {
        self.incomplete
    }

    /// Adds a request; returns its index.
    pub fn add<S: Scope<'a>>(&mut self, req: Request<'a, D, S>) -> usize {
        let (p, d) = req.take();
        self.slots.push(Slot::Pending(p, d));
        self.incomplete += 1;
        self.slots.len() - 1
    }

    /// Tests slot `i`; true if it is complete (now `Done`).
    fn poll(&mut self, i: usize) -> bool {
        match &mut self.slots[i] {
            Slot::Pending(p, d) => match p.test() {
                Some(st) => {
                    let d: &'a D = d;
                    self.slots[i] = Slot::Done(st, d);
                    true
                }
                None => false,
            },
            Slot::Done(..) => true,
            Slot::Taken => false,
        }
    }

    fn report(&mut self, i: usize) -> (usize, Status, &'a D) {
        match std::mem::replace(&mut self.slots[i], Slot::Taken) {
            Slot::Done(st, d) => {
                self.incomplete -= 1;
                (i, st, d)
            }
            _ => unreachable!("only completed slots are reported"),
        }
    }

    /// One pass: every slot that is complete now.
    fn pass(&mut self) -> Vec<usize> {
        (0..self.slots.len()).filter(|&i| self.poll(i)).collect()
    }

    /// Waits for one request; `None` when none is left.
    pub fn wait_any(&mut self) -> Option<(usize, Status, &'a D)> {
        if self.incomplete == 0 {
            return None;
        }
        let mut spins = 0u32;
        loop {
            if let Some(i) = (0..self.slots.len()).find(|&i| self.poll(i)) {
                return Some(self.report(i));
            }
            spins = spins.wrapping_add(1);
            if spins % 64 == 0 {
                std::thread::yield_now();
            }
        }
    }

    /// Waits until at least one request completes; `result` gets every completed one.
    pub fn wait_some(&mut self, result: &mut Vec<(usize, Status, &'a D)>) {
        result.clear();
        if self.incomplete == 0 {
            return;
        }
        let mut spins = 0u32;
        loop {
            self.test_some(result);
            if !result.is_empty() {
                return;
            }
            spins = spins.wrapping_add(1);
            if spins % 64 == 0 {
                std::thread::yield_now();
            }
        }
    }

    /// Waits for every request; `result` gets them all, in index order.
    pub fn wait_all(&mut self, result: &mut Vec<(usize, Status, &'a D)>) {
        result.clear();
        for i in 0..self.slots.len() {
            if let Slot::Pending(p, d) = &mut self.slots[i] {
                let st = p.wait();
                let d: &'a D = d;
                self.slots[i] = Slot::Done(st, d);
            }
            if matches!(self.slots[i], Slot::Done(..)) {
                result.push(self.report(i));
            }
        }
    }

    /// One completed request, if any is complete now.
    pub fn test_any(&mut self) -> Option<(usize, Status, &'a D)> {
        (0..self.slots.len()).find(|&i| self.poll(i)).map(|i| self.report(i))
    }

    /// Every request complete now (possibly none).
    pub fn test_some(&mut self, result: &mut Vec<(usize, Status, &'a D)>) {
        result.clear();
        for i in self.pass() {
            result.push(self.report(i));
        }
    }

    /// If every request is complete, reports them all and returns true; else reports none.
    pub fn test_all(&mut self, result: &mut Vec<(usize, Status, &'a D)>) -> bool {
        result.clear();
        let done = self.pass().len();
        let live = self.slots.iter().filter(|s| !matches!(s, Slot::Taken)).count();
        if done < live {
            return false;
        }
        for i in 0..self.slots.len() {
            if matches!(self.slots[i], Slot::Done(..)) {
                result.push(self.report(i));
            }
        }
        true
    }
}
