//! Communicator ids: which ones this rank has in use, and when a dropped communicator's id
//! may be agreed on again.
//!
//! A new communicator's id is agreed by its members (`Comm::agree_comm_id`): an id is taken
//! only where every member has it free (MPICH's context-id mask, agreed one 64-bit word at a
//! time). A communicator that is dropped gives its id back, but only once nothing on this rank
//! uses it any more: a request still pending on it (a receive, `ANY_SOURCE` too, or a send), a
//! non-blocking collective still running, a message taken by a matched probe or waiting
//! unexpected, a message queued for ring space. Until then the id stays taken (retired), and
//! since the agreement takes only ids free on every member, no new communicator can get an
//! id whose old traffic is still under way on any of them.
//!
//! Whether a retired id is still used is found by a look over the engine's requests,
//! schedules and messages when an id is agreed ([`Engine::comm_id_free_word`]), not counted
//! per request: the small-message path pays nothing for it.

use super::*;

/// The communicator ids one rank has in use: a bit per id (id 0, the world, always), and those
/// of dropped communicators that something on this rank still uses.
pub(crate) struct CommIds {
    used: Vec<u64>,
    /// Ids whose communicator was dropped while something still used them (still in `used`).
    retired: Vec<u32>,
}

impl CommIds {
    pub(super) fn new() -> Self {
        CommIds { used: vec![1], retired: Vec::new() }
    }

    /// The free bits of word `w` (ids `64 w ..= 64 w + 63`).
    fn free_word(&self, w: usize) -> u64 {
        !self.used.get(w).copied().unwrap_or(0)
    }

    fn take(&mut self, id: u32) {
        let w = id as usize / 64;
        if self.used.len() <= w {
            self.used.resize(w + 1, 0);
        }
        self.used[w] |= 1 << (id % 64);
    }

    fn free(&mut self, id: u32) {
        if id != 0 {
            if let Some(w) = self.used.get_mut(id as usize / 64) {
                *w &= !(1 << (id % 64));
            }
        }
    }
}

/// Whether match key `key` is on a context of communicator `id` (user traffic uses context
/// `2 id`, collectives `2 id + 1`).
fn on_comm(key: u64, id: u32) -> bool {
    matching::decode_ctx(key) >> 1 == id
}

impl Engine {
    /// Takes the agreed id `id` on this rank. Notices of collective calls given up on an
    /// earlier communicator of this id are forgotten: the new one numbers its calls from the
    /// start again, and must not take them for its own.
    pub(crate) fn comm_id_take(&mut self, id: u32) {
        self.comm_ids.take(id);
        self.st.forget_aborts(id);
    }

    /// The communicator of id `id` was dropped: the id is free again now if nothing on this
    /// rank uses it, else once the last user has ended (see the module docs).
    pub(crate) fn comm_id_release(&mut self, id: u32) {
        if id == 0 {
            return;
        }
        if self.comm_id_in_use(id) {
            self.comm_ids.retired.push(id);
        } else {
            self.comm_ids.free(id);
        }
    }

    /// The free ids of word `w` (ids `64 w ..= 64 w + 63`) on this rank, after freeing the
    /// retired ids whose last user has ended.
    pub(crate) fn comm_id_free_word(&mut self, w: usize) -> u64 {
        self.reap_comm_ids();
        self.comm_ids.free_word(w)
    }

    /// The lowest word at or after `from` with an id free on this rank.
    pub(crate) fn comm_id_first_free_word(&mut self, from: usize) -> usize {
        self.reap_comm_ids();
        (from..).find(|&w| self.comm_ids.free_word(w) != 0).unwrap_or(from)
    }

    /// Frees the retired ids that nothing uses any more.
    fn reap_comm_ids(&mut self) {
        let mut retired = std::mem::take(&mut self.comm_ids.retired);
        retired.retain(|&id| {
            let used = self.comm_id_in_use(id);
            if !used {
                self.comm_ids.free(id);
            }
            used
        });
        self.comm_ids.retired = retired;
    }

    /// Whether a request, schedule or message of this rank is on communicator `id`.
    fn comm_id_in_use(&self, id: u32) -> bool {
        let st = &self.st;
        let req_uses = |k: Key| match st.reqs.get(k).map(|r| &r.kind) {
            Some(ReqKind::Recv(r)) => on_comm(r.key, id),
            Some(ReqKind::Send(s)) => on_comm(s.key, id),
            Some(ReqKind::Coll(k)) => self.nbc.get(*k).is_some_and(|s| s.ctx() >> 1 == id),
            None => false,
        };
        st.reqs.keys().any(req_uses)
            || self.nbc.keys().any(|k| self.nbc.get(k).is_some_and(|s| s.ctx() >> 1 == id))
            || st.ux.keys().any(|k| st.ux.get(k).is_some_and(|u| on_comm(u.tag64, id)))
            || self.out.iter().flatten().any(|m| out_msg_on(m, id))
    }
}

/// Whether queued message `m` (an abandoned send's too, whose request is gone) is on
/// communicator `id`.
fn out_msg_on(m: &OutMsg, id: u32) -> bool {
    Tmh::decode(&m.hdr[..m.hdr_len]).is_ok_and(|t| on_comm(t.tag, id))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_taken_and_freed_by_word() {
        let mut ids = CommIds::new();
        assert_eq!(ids.free_word(0), !1, "the world's id 0 is always taken");
        ids.take(5);
        ids.take(70);
        assert_eq!(ids.free_word(0), !(1 | 1 << 5));
        assert_eq!(ids.free_word(1), !(1 << 6));
        ids.free(5);
        ids.free(0);
        assert_eq!(ids.free_word(0), !1, "id 0 is never freed");
        assert_eq!(ids.free_word(9), u64::MAX);
    }

    /// A dropped communicator's id stays taken while a receive on it (here `ANY_SOURCE` on its
    /// user context), an unexpected message or a queued send is pending, and is free for the
    /// next agreement once they have ended.
    #[test]
    fn a_released_id_waits_for_its_last_user() {
        let (mut a, mut b) = testkit::pair();
        let free = |e: &mut Engine, id: u32| e.comm_id_free_word(0) & 1 << id != 0;
        a.comm_id_take(5);
        b.comm_id_take(5);
        let mut buf = [0u8; 8];
        // SAFETY: `buf` outlives the receive, which is cancelled and collected below.
        let raw = unsafe { RawBufMut::new(&mut buf) };
        let rid = a.post_recv(10, None, Some(3), raw, Peers::any(None)).expect("post");
        a.comm_id_release(5);
        assert!(!free(&mut a, 5), "a pending receive keeps the id");
        a.cancel(rid);
        assert!(a.take_if_done(rid).expect("cancelled").expect("status").cancelled());
        assert!(free(&mut a, 5), "freed once its last user ended");

        // An unexpected message on the collective context (2 id + 1) keeps it on `b`.
        let data = [1u8; 8];
        // SAFETY: `data` outlives the send, which goes out eagerly at once.
        let sent = a.start_send(1, matching::encode_tag(11, 0, 4), unsafe { RawBuf::new(&data) }, false).expect("send");
        assert!(sent.is_none());
        testkit::settle(&mut [&mut a, &mut b]);
        b.comm_id_release(5);
        assert!(!free(&mut b, 5), "an unexpected message keeps the id");
        let got = b.probe_now(11, None, None).expect("the message is unexpected");
        assert_eq!(got.len(), 8);
        let mut into = [0u8; 8];
        // SAFETY: `into` outlives the receive, which completes at once from the unexpected queue.
        let rid = b.post_recv(11, None, None, unsafe { RawBufMut::new(&mut into) }, Peers::any(None)).expect("post");
        assert!(b.take_if_done(rid).expect("done").is_ok());
        assert!(free(&mut b, 5));
        assert!(!free(&mut b, 0), "the world's id is never free");
    }

    #[test]
    fn keys_name_their_communicator() {
        for id in [0u32, 1, 7, (1 << 19) - 1] {
            for ctx in [2 * id, 2 * id + 1] {
                let key = matching::encode_tag(ctx, 3, 9);
                assert!(on_comm(key, id));
                assert!(!on_comm(key, id ^ 1));
            }
        }
    }
}
