//! Messages that arrived before their receive: the unexpected queue (its messages, the bytes
//! they hold, recycled buffers for small ones), and where the continuation packets of each
//! source's current message go, expected or not.

use super::*;

/// Unexpected messages up to this many bytes are stored in recycled buffers of this capacity.
const UX_POOL_LEN: usize = 4096;
/// Recycled unexpected-message buffers kept per rank (at most 1 MiB).
const UX_POOL_KEEP: usize = 256;

/// A message that arrived before its receive was posted.
pub(super) struct UxMsg {
    pub(super) src_world: usize,
    pub(super) tag64: u64,
    pub(super) total: usize,
    pub(super) data: Vec<u8>,
    pub(super) complete: bool,
    /// (sender world rank, sender request index) to acknowledge on match.
    pub(super) ack: Option<(usize, u32)>,
    /// A rendezvous request: the data is still at the sender.
    pub(super) rndv: Option<RndvInfo>,
}

/// Where the continuation packets of a source's current message go.
#[derive(Clone, Copy)]
pub(super) enum Incoming {
    Idle,
    /// The rest of a message that was refused (forged source, no memory): read and dropped.
    Discard,
    Expected {
        req: ReqId,
    },
    Unexpected {
        ux: Key,
    },
}

impl UxMsg {
    /// Bytes the message counts for while it waits: its payload (none for a rendezvous
    /// request, whose data is still at the sender) and [`UX_OVERHEAD`].
    fn charge(&self) -> usize {
        if self.rndv.is_some() {
            UX_OVERHEAD
        } else {
            self.total + UX_OVERHEAD
        }
    }
}

/// The unexpected stage (see the module docs).
pub(super) struct Unexpected {
    /// Messages that arrived before their receive.
    msgs: Slab<UxMsg>,
    /// Bytes they hold (payload plus bookkeeping).
    bytes: usize,
    /// Buffers of [`UX_POOL_LEN`] bytes for small unexpected messages, kept for reuse.
    pool: Vec<Vec<u8>>,
    /// Per source: where the continuation packets of its current message go.
    incoming: Vec<Incoming>,
}

impl Unexpected {
    /// An empty queue for a job of `size` ranks.
    pub(super) fn new(size: usize) -> Self {
        Unexpected { msgs: Slab::new(), bytes: 0, pool: Vec::new(), incoming: vec![Incoming::Idle; size] }
    }

    /// The key the next inserted message gets.
    #[inline]
    pub(super) fn vacant_key(&self) -> Key {
        self.msgs.vacant_key()
    }

    /// Queues `m`; its bytes count from now on.
    #[inline]
    pub(super) fn insert(&mut self, m: UxMsg) -> Key {
        self.bytes += m.charge();
        self.msgs.insert(m)
    }

    /// Takes message `k` out; its bytes no longer count.
    #[inline]
    pub(super) fn remove(&mut self, k: Key) -> Option<UxMsg> {
        let m = self.msgs.remove(k)?;
        self.bytes -= m.charge();
        Some(m)
    }

    #[inline]
    pub(super) fn get(&self, k: Key) -> Option<&UxMsg> {
        self.msgs.get(k)
    }

    #[inline]
    pub(super) fn get_mut(&mut self, k: Key) -> Option<&mut UxMsg> {
        self.msgs.get_mut(k)
    }

    /// The keys of the messages queued.
    pub(super) fn keys(&self) -> impl Iterator<Item = Key> + '_ {
        self.msgs.keys()
    }

    /// An empty buffer for a message of `total` bytes: a recycled one for a small message;
    /// `None` when the memory cannot be had.
    #[inline]
    pub(super) fn buffer(&mut self, total: usize) -> Option<Vec<u8>> {
        let (mut v, cap) = if total <= UX_POOL_LEN { (self.pool.pop().unwrap_or_default(), UX_POOL_LEN) } else { (Vec::new(), total) };
        v.try_reserve_exact(cap).ok()?;
        Some(v)
    }

    /// Keeps the buffer of a consumed small unexpected message for the next one, so that the
    /// unexpected path does not allocate in steady state.
    #[inline]
    pub(super) fn recycle(&mut self, mut v: Vec<u8>) {
        if v.capacity() == UX_POOL_LEN && self.pool.len() < UX_POOL_KEEP {
            v.clear();
            self.pool.push(v);
        }
    }

    /// Where the continuation packets from `src` go (`None`: no such rank).
    #[inline]
    pub(super) fn incoming(&self, src: usize) -> Option<Incoming> {
        self.incoming.get(src).copied()
    }

    /// Sends the continuation packets from `src` to `to`.
    #[inline]
    pub(super) fn set_incoming(&mut self, src: usize, to: Incoming) {
        self.incoming[src] = to;
    }

    /// Bytes the unexpected messages hold.
    pub(super) fn bytes(&self) -> usize {
        self.bytes
    }

    /// Recycled buffers kept.
    #[cfg(test)]
    pub(super) fn pool_len(&self) -> usize {
        self.pool.len()
    }
}
