//! Non-blocking receives of unknown size: [`Comm::irecv_vec`] posts a receive whose buffer the
//! runtime allocates when a message matches, sized for that message, and hands over as a
//! `Vec<T>` when the request completes.
//!
//! Unlike [`Comm::irecv`], no user buffer is lent, so no [`crate::Scope`] is needed: the
//! request owns everything it touches. Dropping a [`VecRequest`] without waiting cancels the
//! receive if it has not matched yet; a receive that has matched completes on its own and its
//! memory is freed.
//!
//! The receive takes its place in MPI order like any other: it matches the oldest message
//! that fits its source and tag, and an earlier posted receive wins over it.
//!
//! ```
//! let got = tmpi::run_local(2, |w| {
//!     if w.rank() == 0 {
//!         w.send(&[1u32, 2, 3], 1, 5).unwrap();
//!         w.send(&[9u32], 1, 6).unwrap();
//!         Vec::new()
//!     } else {
//!         let a = w.irecv_vec::<u32>(0, 5).unwrap();
//!         let b = w.irecv_vec::<u32>(tmpi::ANY_SOURCE, tmpi::ANY_TAG).unwrap();
//!         let (mut v, st) = a.wait().unwrap();
//!         assert_eq!((st.tag(), st.count::<u32>()), (5, 3));
//!         v.extend(b.wait().unwrap().0);
//!         v
//!     }
//! });
//! assert_eq!(got[1], vec![1, 2, 3, 9]);
//! ```

use std::marker::PhantomData;

use bytemuck::Pod;

use crate::buffer::OwnedBuf;
use crate::comm::{Comm, Source, Status, TagMatch};
use crate::engine::{Need, ReqId};
use crate::error::{Error, Result};
use crate::seen::{self, Kind, What};

/// A pending [`Comm::irecv_vec`]: completes with the message as a `Vec<T>` and its status.
#[must_use = "dropping the request cancels the receive if it has not matched yet"]
pub struct VecRequest<T: Pod> {
    comm: Comm,
    rid: Option<ReqId>,
    _t: PhantomData<fn() -> T>,
}

impl<T: Pod> std::fmt::Debug for VecRequest<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VecRequest").field("pending", &self.rid.is_some()).finish()
    }
}

impl Comm {
    /// Posts a receive of a message of any length from `src` with `tag`; the runtime
    /// allocates its buffer when it matches. See the [module docs](crate::vecrecv).
    ///
    /// # Errors
    /// [`Error::InvalidRank`], [`Error::InvalidTag`]. The request itself fails with
    /// [`Error::TypeMismatch`] when the message is not a whole number of `T`s (it is consumed),
    /// [`Error::NoMemory`] when its length cannot be allocated (it is discarded), and
    /// [`Error::PeerGone`] as any receive.
    pub fn irecv_vec<T: Pod>(&self, src: impl Into<Source>, tag: impl Into<TagMatch>) -> Result<VecRequest<T>> {
        let (src, tag) = (src.into(), tag.into());
        if seen::on() {
            return seen::calls::posted(What::new(Kind::IrecvVec).from(self, src).tag_match(tag), src, |s| self.irecv_vec(s, tag));
        }
        let (s, t) = self.recv_args(src, tag)?;
        let from = self.peers(s);
        let rid = self.eng()?.post_recv_vec(self.user_ctx(), s, t, std::mem::size_of::<T>(), std::mem::align_of::<T>(), from)?;
        Ok(VecRequest { comm: self.clone(), rid: Some(rid), _t: PhantomData })
    }
}

impl<T: Pod> VecRequest<T> {
    /// The engine request, while one is pending (for [`crate::seen`]).
    pub(crate) fn key(&self) -> Option<ReqId> {
        self.rid
    }

    /// Waits for the message.
    ///
    /// # Errors
    /// As [`Comm::irecv_vec`].
    pub fn wait(mut self) -> Result<(Vec<T>, Status)> {
        if seen::on() {
            let key = self.key();
            let r = seen::call(What::new(Kind::Wait).on(&self.comm.clone()).reqs(1), || self.wait());
            return seen::calls::completed_vec(key, r);
        }
        let rid = self.rid.take().ok_or_else(collected)?;
        let mut e = self.comm.eng()?;
        if let Err(err) = e.wait_until(&Need::Req(rid), |e| e.is_done(rid)) {
            e.abandon(rid);
            return Err(err);
        }
        let done = e.take_vec_if_done(rid).ok_or_else(|| Error::State("receive not complete after its wait".into()))?;
        finish(done)
    }

    /// Completes the request if the message is in; `None` otherwise.
    ///
    /// # Errors
    /// As [`Comm::irecv_vec`]; [`Error::State`] once the request has been collected.
    pub fn test(&mut self) -> Result<Option<(Vec<T>, Status)>> {
        if seen::on() {
            let (key, comm) = (self.key(), self.comm.clone());
            let r = seen::calls::answered(What::new(Kind::Test).on(&comm).reqs(1), Source::Any, |_| self.test());
            return seen::calls::completed_vec_opt(key, r);
        }
        let rid = self.rid.ok_or_else(collected)?;
        let mut e = self.comm.eng()?;
        e.test_step(rid)?;
        match e.take_vec_if_done(rid) {
            None => Ok(None),
            Some(done) => {
                self.rid = None;
                finish(done).map(Some)
            }
        }
    }

    /// Cancels the receive if it has not matched yet: it then completes with an empty vector
    /// and a status that says cancelled. No effect once it has matched.
    ///
    /// # Errors
    /// None today; the signature leaves room for fabrics where cancel can fail.
    pub fn cancel(&mut self) -> Result<()> {
        if seen::on() {
            return seen::call(What::new(Kind::Cancel).reqs(1), || self.cancel());
        }
        if let Some(rid) = self.rid {
            self.comm.eng()?.cancel(rid);
        }
        Ok(())
    }
}

impl<T: Pod> crate::seen::Seen for VecRequest<T> {}

impl<T: Pod> crate::seen::calls::Keyed for VecRequest<T> {
    fn key(&self) -> Option<crate::engine::ReqId> {
        VecRequest::key(self)
    }
}

impl<T: Pod> Drop for VecRequest<T> {
    fn drop(&mut self) {
        if let Some(rid) = self.rid.take() {
            // The engine owns every byte this receive touches, so if the engine cannot be
            // reached (the thread level forbids it here) the receive may simply stay there.
            if let Some(mut e) = self.comm.try_eng() {
                e.abandon(rid);
            }
        }
    }
}

fn collected() -> Error {
    Error::State("request already collected".into())
}

/// The user's vector from a completed receive's buffer.
fn finish<T: Pod>(done: Result<(Status, Option<OwnedBuf>)>) -> Result<(Vec<T>, Status)> {
    let (st, buf) = done?;
    let v = match buf {
        Some(b) => b.into_vec::<T>().ok_or_else(|| Error::TypeMismatch {
            source_rank: st.source(),
            len: st.len(),
            elem: std::mem::size_of::<T>(),
        })?,
        None => Vec::new(),
    };
    Ok((v, st))
}

#[cfg(test)]
mod tests {
    use crate::config::Config;
    use crate::{run_local, run_shm_threads, Error, ANY_SOURCE, ANY_TAG};

    #[test]
    fn expected_unexpected_empty_and_large_messages_arrive_whole() {
        // In-process fabric; shared memory with the rings; shared memory with single copy
        // (the peer writes straight into the runtime's buffer).
        let single = Config { single_copy: true, single_copy_min: Some(4096), ..Config::default() };
        let rings = Config { single_copy: false, ..Config::default() };
        // Whether single copy must be used: with the default (auto) it may or may not be.
        for (shm, cfg, cma) in [(false, Config::default(), None), (true, rings, Some(false)), (true, single, Some(true))] {
            let body = |w: crate::World| {
                let peer = 1 - w.rank();
                if w.rank() == 0 {
                    let big: Vec<u64> = (0..300_000).collect();
                    w.barrier().unwrap(); // the receiver has posted its first receive
                    w.send(&[1u16, 2, 3], peer, 1).unwrap();
                    w.send::<u16>(&[], peer, 2).unwrap();
                    w.send(&big, peer, 3).unwrap();
                    w.send(&big[..10], peer, 4).unwrap();
                    w.barrier().unwrap();
                    0
                } else {
                    let a = w.irecv_vec::<u16>(0, 1).unwrap();
                    w.barrier().unwrap();
                    let (va, sa) = a.wait().unwrap();
                    assert_eq!((va, sa.source(), sa.tag(), sa.len()), (vec![1, 2, 3], 0, 1, 6));
                    let (ve, se) = w.irecv_vec::<u16>(0, 2).unwrap().wait().unwrap();
                    assert!(ve.is_empty() && se.is_empty());
                    let (vb, sb) = w.irecv_vec::<u64>(ANY_SOURCE, 3).unwrap().wait().unwrap();
                    assert_eq!((vb.len(), sb.count::<u64>()), (300_000, 300_000));
                    assert!(vb.iter().enumerate().all(|(i, &x)| x == i as u64));
                    w.barrier().unwrap(); // the last message is unexpected by now
                    let (vs, _) = w.irecv_vec::<u64>(0, ANY_TAG).unwrap().wait().unwrap();
                    assert_eq!(vs, (0..10).collect::<Vec<u64>>());
                    w.stats().unwrap().cma_reads
                }
            };
            let r = if shm { run_shm_threads(2, cfg, body) } else { run_local(2, body) };
            if let Some(cma) = cma {
                assert_eq!(r[1] > 0, cma, "single copy used exactly where it is on: {r:?}");
            }
        }
    }

    #[test]
    fn it_takes_its_place_in_mpi_order() {
        let got = run_local(2, |w| {
            if w.rank() == 0 {
                for i in 0..4u32 {
                    w.send(&[i], 1, 9).unwrap();
                }
                vec![]
            } else {
                // Posted in this order, the four receives take the four messages in order,
                // whichever kind each receive is.
                let a = w.irecv_vec::<u32>(0, 9).unwrap();
                let mut b = [0u32];
                let st = crate::scope(|s| {
                    let r = w.irecv(s, &mut b, 0, 9).unwrap();
                    let c = w.irecv_vec::<u32>(ANY_SOURCE, ANY_TAG).unwrap();
                    let d = w.irecv_vec::<u32>(0, 9).unwrap();
                    let (d, _) = d.wait().unwrap();
                    let (c, _) = c.wait().unwrap();
                    r.wait().unwrap();
                    (c, d)
                });
                let (a, _) = a.wait().unwrap();
                vec![a[0], b[0], st.0[0], st.1[0]]
            }
        });
        assert_eq!(got[1], vec![0, 1, 2, 3]);
    }

    #[test]
    fn a_message_of_no_whole_elements_fails_and_is_consumed() {
        run_local(2, |w| {
            if w.rank() == 0 {
                w.send(&[1u8; 7], 1, 1).unwrap();
                w.send(&[5u32], 1, 1).unwrap();
            } else {
                match w.irecv_vec::<u32>(0, 1).unwrap().wait() {
                    Err(Error::TypeMismatch { len: 7, elem: 4, .. }) => {}
                    other => panic!("{other:?}"),
                }
                assert_eq!(w.irecv_vec::<u32>(0, 1).unwrap().wait().unwrap().0, vec![5]);
            }
        });
    }

    #[test]
    fn cancel_drop_and_test() {
        run_local(2, |w| {
            if w.rank() == 0 {
                w.barrier().unwrap();
                w.send(&[3i64], 1, 2).unwrap();
            } else {
                let mut c = w.irecv_vec::<i64>(0, 2).unwrap();
                c.cancel().unwrap();
                let (v, st) = c.wait().unwrap();
                assert!(v.is_empty() && st.cancelled());
                // A dropped request is cancelled: it does not take the message.
                drop(w.irecv_vec::<i64>(0, 2).unwrap());
                let mut t = w.irecv_vec::<i64>(0, 2).unwrap();
                assert!(t.test().unwrap().is_none());
                w.barrier().unwrap();
                let got = loop {
                    if let Some(done) = t.test().unwrap() {
                        break done;
                    }
                };
                assert_eq!(got.0, vec![3]);
                assert!(matches!(t.test(), Err(Error::State(_))));
            }
        });
    }

    #[test]
    fn bad_arguments_are_errors() {
        run_local(1, |w| {
            assert!(matches!(w.irecv_vec::<u8>(3, 0), Err(Error::InvalidRank { .. })));
            assert!(matches!(w.irecv_vec::<u8>(0, crate::TAG_UB + 1), Err(Error::InvalidTag { .. })));
        });
    }
}
