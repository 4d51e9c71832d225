//! Matched probes ([`Comm::mprobe`], [`Comm::improbe`]) and their receives ([`Message`]), and
//! [`Comm::sendrecv_replace`].
//!
//! A plain probe says what the next receive *would* get, but another receive (another thread,
//! or a library's receive on the same communicator) may take the message first. A matched
//! probe takes the message out of matching: only the [`Message`] it returns can receive it.

use std::sync::Arc;

use bytemuck::Pod;

use crate::buffer::RawBufMut;
use crate::comm::{finish, Comm, Source, Status, TagMatch};
use crate::engine::{Need, Peers};
use crate::error::{Error, Result};
use crate::request::{Request, Scope};
use crate::seen::{self, Kind, What};
use crate::slab::Key;
use crate::sync::EngineCell;
use crate::{Rank, Tag};

/// A message taken out of matching by [`Comm::mprobe`] or [`Comm::improbe`]; receive it with
/// [`Message::recv`], [`Message::recv_vec`] or [`Message::irecv`]. Dropping it discards the
/// message.
#[must_use = "a probed message is discarded when dropped; receive it"]
pub struct Message {
    eng: Arc<EngineCell>,
    ux: Option<Key>,
    from: Peers,
    status: Status,
}

impl std::fmt::Debug for Message {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Message").field("status", &self.status).finish()
    }
}

impl Message {
    /// Source, tag and length of the message.
    pub fn status(&self) -> Status {
        self.status
    }

    fn take(&mut self) -> Result<Key> {
        self.ux.take().ok_or_else(|| Error::State("message already received".into()))
    }

    /// Receives the message into `buf`.
    ///
    /// # Errors
    /// [`Error::Truncated`] when it is longer than `buf` (it is consumed);
    /// [`Error::PeerGone`] if its sender departed in the middle of it.
    pub fn recv<T: Pod>(mut self, buf: &mut [T]) -> Result<Status> {
        if seen::on() {
            return seen::call(What::new(Kind::Mrecv), || self.recv(buf));
        }
        let ux = self.take()?;
        let mut e = self.eng.lock()?;
        // SAFETY: `buf` is borrowed for this call, and `finish` returns only once the receive
        // has completed or has been abandoned.
        let raw = unsafe { RawBufMut::new(bytemuck::cast_slice_mut(buf)) };
        let rid = e.mrecv(ux, raw, self.from.clone())?;
        finish(&mut e, rid)
    }

    /// Receives the message into a vector of its length.
    ///
    /// # Errors
    /// [`Error::TypeMismatch`] if it is not a whole number of `T`; [`Error::NoMemory`]; as
    /// [`Message::recv`].
    pub fn recv_vec<T: Pod>(self) -> Result<(Vec<T>, Status)> {
        if seen::on() {
            return seen::call(What::new(Kind::Mrecv), || self.recv_vec());
        }
        let st = self.status;
        let elem = std::mem::size_of::<T>();
        if elem == 0 || st.len() % elem != 0 {
            // Consume it all the same (dropping `self` discards it).
            return Err(Error::TypeMismatch { source_rank: st.source(), len: st.len(), elem });
        }
        let no_memory = || Error::NoMemory { bytes: st.len(), rank: st.source() };
        if st.len() > crate::sys::physical_memory() {
            return Err(no_memory());
        }
        let mut v: Vec<T> = Vec::new();
        v.try_reserve_exact(st.len() / elem).map_err(|_| no_memory())?;
        v.resize(st.len() / elem, T::zeroed());
        let got = self.recv(&mut v)?;
        Ok((v, got))
    }

    /// Starts receiving the message into `buf` (MPI's `imrecv`).
    ///
    /// # Errors
    /// As [`Message::recv`] (from the request).
    pub fn irecv<'s, T: Pod>(mut self, s: &'s Scope<'s, '_>, buf: &'s mut [T]) -> Result<Request<'s>> {
        if seen::on() {
            return seen::call(What::new(Kind::Imrecv).bytes(size_of_val(buf)), || self.irecv(s, buf));
        }
        let ux = self.take()?;
        let eng = &self.eng;
        let rid = {
            let mut e = eng.lock()?;
            // SAFETY: `buf` is borrowed for 's, and the scope finishes or abandons the request
            // before 's ends (it is registered in `Request::new`).
            let raw = unsafe { RawBufMut::new(bytemuck::cast_slice_mut(buf)) };
            e.mrecv(ux, raw, self.from.clone())?
        };
        Ok(Request::new(eng, Some(rid), s))
    }
}

impl crate::seen::Seen for Message {
    fn note(&self, w: &mut crate::seen::What<'_>) {
        w.status(&self.status());
    }
}

impl crate::seen::calls::Matched for Message {
    fn source(&self) -> crate::Rank {
        self.status().source()
    }
}

impl Drop for Message {
    fn drop(&mut self) {
        let Some(ux) = self.ux.take() else { return };
        // Discard: receive it into nothing and let the engine free the request when done.
        if let Ok(mut e) = self.eng.lock_for_cleanup() {
            // SAFETY: an empty buffer: nothing is ever written through it.
            let raw = unsafe { RawBufMut::new(&mut []) };
            if let Ok(rid) = e.mrecv(ux, raw, self.from.clone()) {
                e.abandon(rid);
            }
        }
    }
}

impl Comm {
    /// Waits for a matching message and takes it out of matching: only the returned
    /// [`Message`] can receive it.
    ///
    /// ```
    /// let got = tmpi::run_local(2, |w| {
    ///     if w.rank() == 0 {
    ///         w.send(&[1u16, 2, 3], 1, 4).unwrap();
    ///         0
    ///     } else {
    ///         let m = w.mprobe(tmpi::ANY_SOURCE, tmpi::ANY_TAG).unwrap();
    ///         assert_eq!((m.status().source(), m.status().tag()), (0, 4));
    ///         let (v, _) = m.recv_vec::<u16>().unwrap();
    ///         v.len()
    ///     }
    /// });
    /// assert_eq!(got[1], 3);
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidRank`], [`Error::InvalidTag`], [`Error::PeerGone`].
    pub fn mprobe(&self, src: impl Into<Source>, tag: impl Into<TagMatch>) -> Result<Message> {
        let (src, tag) = (src.into(), tag.into());
        if seen::on() {
            return seen::calls::matched(What::new(Kind::Mprobe).from(self, src).tag_match(tag), src, |s| self.mprobe(s, tag));
        }
        let (s, t) = self.recv_args(src, tag)?;
        let ctx = self.user_ctx();
        let from = self.peers(s);
        let need = Need::Peers(from.clone());
        let mut e = self.eng()?;
        let mut got = None;
        e.wait_until(&need, |e| {
            got = e.mprobe_at(ctx, s, t, &from);
            got.is_some()
        })?;
        let (status, ux) = got.ok_or_else(|| Error::State("mprobe finished without a message".into()))?;
        Ok(self.message(status, ux))
    }

    /// [`Comm::mprobe`] that does not wait: `None` when no matching message is there now.
    ///
    /// # Errors
    /// As [`Comm::mprobe`].
    pub fn improbe(&self, src: impl Into<Source>, tag: impl Into<TagMatch>) -> Result<Option<Message>> {
        let (src, tag) = (src.into(), tag.into());
        if seen::on() {
            return seen::calls::answered(What::new(Kind::Improbe).from(self, src).tag_match(tag), src, |s| self.improbe(s, tag));
        }
        let (s, t) = self.recv_args(src, tag)?;
        let mut e = self.eng()?;
        if e.progress()? == 0 {
            e.idle_check(&Need::Peers(self.peers(s)))?;
        }
        let got = e.mprobe_at(self.user_ctx(), s, t, &self.peers(s));
        drop(e);
        Ok(got.map(|(status, ux)| self.message(status, ux)))
    }

    /// Receives a message taken by [`Comm::mprobe`] (MPI's `mrecv`; same as [`Message::recv`]).
    ///
    /// # Errors
    /// As [`Message::recv`].
    pub fn mrecv<T: Pod>(&self, msg: Message, buf: &mut [T]) -> Result<Status> {
        msg.recv(buf)
    }

    fn message(&self, status: Status, ux: Key) -> Message {
        let from = self.peers(Some(status.source() as u32));
        Message { eng: self.inner.eng.clone(), ux: Some(ux), from, status }
    }

    /// Sends `buf` to `dest` and replaces its contents with a message from `src` of at most
    /// the same length (MPI's `sendrecv_replace`). The outgoing data is copied first.
    ///
    /// ```
    /// let got = tmpi::run_local(3, |w| {
    ///     let (r, n) = (w.rank(), w.size());
    ///     let mut b = [r as u32; 4];
    ///     w.sendrecv_replace(&mut b, (r + 1) % n, 0, (r + n - 1) % n, 0).unwrap();
    ///     b[0]
    /// });
    /// assert_eq!(got, vec![2, 0, 1]);
    /// ```
    ///
    /// # Errors
    /// As [`Comm::sendrecv`].
    pub fn sendrecv_replace<T: Pod>(
        &self,
        buf: &mut [T],
        dest: Rank,
        stag: Tag,
        src: impl Into<Source>,
        rtag: impl Into<TagMatch>,
    ) -> Result<Status> {
        let (src, rtag) = (src.into(), rtag.into());
        if seen::on() {
            let w = What::new(Kind::SendrecvReplace).from(self, src).tag_match(rtag).bytes(size_of_val(buf)).sends(
                self,
                dest,
                size_of_val(buf),
            );
            return seen::calls::matched(w, src, |s| self.sendrecv_replace(buf, dest, stag, s, rtag));
        }
        let out = buf.to_vec();
        self.sendrecv(&out, dest, stag, buf, src, rtag)
    }
}

#[cfg(test)]
mod tests {
    use crate::{run_local, scope, test_all, test_any, test_some, wait_some, Error, ANY_SOURCE, ANY_TAG};

    #[test]
    fn mprobe_takes_the_message_out_of_matching() {
        let got = run_local(3, |w| {
            let r = w.rank();
            if r == 0 {
                // Two messages from each peer, tags 1 then 2.
                let mut got = Vec::new();
                for _ in 0..4 {
                    let m = w.mprobe(ANY_SOURCE, ANY_TAG).unwrap();
                    let st = m.status();
                    // A plain probe no longer sees that message: it is taken.
                    if let Some(p) = w.iprobe(st.source(), st.tag()).unwrap() {
                        assert!(p.source() != st.source() || p.tag() != st.tag(), "the probed message is still matchable");
                    }
                    let mut buf = vec![0u32; st.count::<u32>()];
                    let rs = m.recv(&mut buf).unwrap();
                    assert_eq!(rs.len(), st.len());
                    got.push((st.source(), st.tag(), buf));
                }
                got.sort();
                got
            } else {
                w.send(&vec![r as u32; r], 0, 1).unwrap();
                w.send(&vec![r as u32 + 10; 20_000], 0, 2).unwrap();
                Vec::new()
            }
        });
        let g = &got[0];
        assert_eq!(g.len(), 4);
        assert_eq!(g[0], (1, 1, vec![1]));
        assert_eq!(g[1], (1, 2, vec![11; 20_000]));
        assert_eq!(g[2], (2, 1, vec![2, 2]));
        assert_eq!(g[3], (2, 2, vec![12; 20_000]));
    }

    #[test]
    fn improbe_irecv_drop_and_truncation() {
        run_local(2, |w| {
            if w.rank() == 1 {
                for t in 0..4u32 {
                    w.send(&[t; 8], 0, t).unwrap();
                }
                w.barrier().unwrap();
                return;
            }
            w.barrier().unwrap();
            // A dropped message is discarded; the next one is still there.
            let m = loop {
                if let Some(m) = w.improbe(1, 0).unwrap() {
                    break m;
                }
            };
            drop(m);
            assert!(w.iprobe(1, 0).unwrap().is_none());
            let m = w.mprobe(1, 1).unwrap();
            let mut small = [0u32; 2];
            assert!(matches!(m.recv(&mut small), Err(Error::Truncated { .. })));
            let m = w.mprobe(1, 2).unwrap();
            let mut b = [0u32; 8];
            scope(|s| {
                let q = m.irecv(s, &mut b).unwrap();
                assert_eq!(q.wait().unwrap().tag(), 2);
            });
            assert_eq!(b, [2; 8]);
            let m = w.mprobe(1, 3).unwrap();
            assert!(matches!(m.recv_vec::<[u8; 3]>(), Err(Error::TypeMismatch { .. })));
            assert!(w.improbe(1, ANY_TAG).unwrap().is_none());
        });
    }

    #[test]
    fn request_sets() {
        run_local(2, |w| {
            let peer = 1 - w.rank();
            let sends: Vec<[u64; 2]> = (0..6).map(|i| [i, w.rank() as u64]).collect();
            let mut recvs = [[0u64; 2]; 6];
            scope(|s| {
                let mut rr: Vec<_> = recvs.iter_mut().enumerate().map(|(i, b)| w.irecv(s, b, peer, i as u32).unwrap()).collect();
                assert!(test_all(&mut rr).unwrap().is_none());
                assert_eq!(rr.len(), 6);
                // Send in reverse order: completions come in any order.
                for i in (0..6).rev() {
                    w.send(&sends[i], peer, i as u32).unwrap();
                }
                let mut seen = 0;
                if let Some((_, st)) = test_any(&mut rr).unwrap() {
                    assert_eq!(st.len(), 16);
                    seen += 1;
                }
                for (_, r) in test_some(&mut rr).unwrap() {
                    r.unwrap();
                    seen += 1;
                }
                while !rr.is_empty() {
                    let got = wait_some(&mut rr).unwrap();
                    assert!(!got.is_empty());
                    assert!(got.windows(2).all(|p| p[0].0 < p[1].0));
                    seen += got.len();
                }
                assert_eq!(seen, 6);
                let mut none = Vec::new();
                assert!(wait_some(&mut none).is_err());
                assert_eq!(test_all(&mut none).unwrap(), Some(vec![]));
                assert!(test_any(&mut none).unwrap().is_none());
            });
            for (i, b) in recvs.iter().enumerate() {
                assert_eq!(*b, [i as u64, peer as u64]);
            }
        });
    }

    /// `Request::cancel` (which existed before) on a receive that has not matched: its status
    /// says cancelled, and the message it would have taken goes to the next receive.
    #[test]
    fn cancel_of_a_pending_receive() {
        run_local(2, |w| {
            let peer = 1 - w.rank();
            let mut a = [0u32];
            let mut b = [0u32];
            scope(|s| {
                let mut r = w.irecv(s, &mut a, peer, 8).unwrap();
                r.cancel().unwrap();
                assert!(r.wait().unwrap().cancelled());
            });
            w.send(&[7u32], peer, 8).unwrap();
            w.recv(&mut b, peer, 8).unwrap();
            assert_eq!((a[0], b[0]), (0, 7));
        });
    }

    #[test]
    fn sendrecv_replace_rotates() {
        let got = run_local(4, |w| {
            let (r, n) = (w.rank(), w.size());
            let mut b = vec![r as u16; 5000];
            w.sendrecv_replace(&mut b, (r + 1) % n, 3, (r + n - 1) % n, 3).unwrap();
            b
        });
        for (r, b) in got.iter().enumerate() {
            assert!(b.iter().all(|&x| x as usize == (r + 3) % 4));
        }
    }
}
