//! `send_layout` and `recv_layout` between every ordered pair of ranks (issue 55 item 4): a
//! layout of a few blocks is gathered straight into one packet where the fabric takes that
//! many parts (16 on shared memory, 3 over TCP) and packed where it does not, so each fabric
//! must carry layouts of 1 to 20 blocks alike.
//!
//! For every ordered pair (in one global order, so blocking sends never wait on each other in
//! a cycle) the sender sends vectors and indexed layouts of 1 to 20 blocks (blocks of 1 and 3
//! `u32`s, zero-length blocks among them), one of 64 blocks, and one of 1.6 MB (a rendezvous);
//! the receiver takes each one with `recv_vec` or `recv_layout` (alternately) and compares it
//! with the sender's elements.
//!
//! Then the typed calls (issue 59 items 2 and 3) on every pair: a derived `Probe` with padding,
//! bools, a nested struct, an array and a tuple, whole and through layouts, blocking and not,
//! small and a rendezvous; a message whose bool byte is 2 refused with `InvalidValue` and the
//! buffer left as it was; and the typed collectives (`bcast`, `gather`, `scatter`,
//! `allgather`, `alltoall`) with layouts on either side, the typed v-collectives (regions with
//! gaps left alone) and `ssend_typed` around the ring. Prints
//! `layouts: N ranks: C checks: OK`.

use std::error::Error as StdError;

use tmpi::datatype::{pack, Layout};
use tmpi::{Buf, BufMut, Comm, Element};
use tmpi_tests::Verdict;

/// The layouts sent, each with the length of the sender's buffer it needs.
fn layouts() -> Vec<(Layout, usize)> {
    let mut v = Vec::new();
    for blocks in 1..=20usize {
        for blocklen in [1usize, 3] {
            let stride = blocklen + 2;
            v.push((Layout::vector(blocks, blocklen, stride), blocks * stride));
        }
        // Irregular blocks, every third one empty, in descending places.
        let lens: Vec<usize> = (0..blocks).map(|i| if i % 3 == 2 { 0 } else { 1 + i % 4 }).collect();
        let displs: Vec<usize> = (0..blocks).map(|i| (blocks - i) * 8).collect();
        v.push((Layout::indexed(&lens, &displs), (blocks + 1) * 8));
    }
    v.push((Layout::vector(64, 2, 5), 64 * 5));
    v.push((Layout::vector(4, 100_000, 100_001), 4 * 100_001));
    v
}

/// The sender's buffer for layout `i` from `src` to `dst`.
fn data(src: usize, dst: usize, i: usize, len: usize) -> Vec<u32> {
    (0..len).map(|j| (src * 1_000_003 + dst * 10_007 + i * 101 + j) as u32).collect()
}

fn send_all(w: &Comm, dst: usize, v: &mut Verdict) -> tmpi::Result<()> {
    for (i, (l, len)) in layouts().iter().enumerate() {
        let m = data(w.rank(), dst, i, *len);
        let r = w.send_layout(&m, l, dst, i as u32);
        v.check(r.is_ok(), || format!("send_layout {i} ({} elements) to {dst}: {r:?}", l.len()));
        r?;
    }
    Ok(())
}

fn recv_all(w: &Comm, src: usize, v: &mut Verdict) -> tmpi::Result<()> {
    for (i, (l, len)) in layouts().iter().enumerate() {
        let want = pack(&data(src, w.rank(), i, *len), l)?;
        let got = if i % 2 == 0 {
            w.recv_vec::<u32>(src, i as u32)?.0
        } else {
            // Into a layout of its own: the same blocks one element further apart.
            let mut buf = vec![0u32; *len + l.blocks().len()];
            let mine = spread(l);
            let st = w.recv_layout(&mut buf, &mine, src, i as u32)?;
            v.check(st.count::<u32>() == l.len(), || format!("recv_layout {i} from {src}: {} elements", st.count::<u32>()));
            pack(&buf, &mine)?
        };
        v.check(got == want, || format!("layout {i} ({} elements) from {src}: wrong elements", l.len()));
    }
    Ok(())
}

/// `l` with each block one element further on than the one before.
fn spread(l: &Layout) -> Layout {
    let (lens, displs): (Vec<usize>, Vec<usize>) = l.blocks().enumerate().map(|(i, (start, len))| (len, start + i)).unzip();
    Layout::indexed(&lens, &displs)
}

#[derive(Clone, Copy, Debug, PartialEq, Element)]
struct Inner {
    on: bool,
    v: u64,
}

/// Padding after `flag` and inside `inner` and the tuple; five bools.
#[derive(Clone, Copy, Debug, PartialEq, Element)]
struct Probe {
    flag: bool,
    x: u32,
    inner: Inner,
    pair: (u8, i32),
    bits: [bool; 3],
}

fn probe(src: usize, dst: usize, i: usize) -> Probe {
    let k = src * 1_000 + dst * 100 + i;
    Probe {
        flag: k % 2 == 1,
        x: k as u32,
        inner: Inner { on: i % 3 == 0, v: k as u64 * 7 },
        pair: (i as u8, -(k as i32)),
        bits: [true, k % 5 == 0, false],
    }
}

const BLANK: Probe = Probe { flag: false, x: 0, inner: Inner { on: false, v: 0 }, pair: (0, 0), bits: [false; 3] };
/// Elements of the rendezvous-sized typed message (packed to 26 bytes each: about 2.6 MB).
const BIG: usize = 100_000;

/// Typed messages from this rank to `dst`: whole, every third through a layout, a rendezvous
/// without blocking, and a message with a bad bool byte.
fn typed_send(w: &Comm, dst: usize) -> tmpi::Result<()> {
    let me = w.rank();
    let ps: Vec<Probe> = (0..12).map(|i| probe(me, dst, i)).collect();
    w.send_typed(&ps, dst, 100)?;
    w.send_typed((&ps, &Layout::vector(4, 1, 3)), dst, 101)?;
    let big: Vec<Probe> = (0..BIG).map(|i| probe(me, dst, i)).collect();
    tmpi::scope(|s| w.isend_typed(s, &big, dst, 102)?.wait())?;
    let mut bad = vec![0u8; Probe::type_map().size()];
    bad[Probe::type_map().bools()[1]] = 2;
    w.send(&bad, dst, 103)
}

fn typed_recv(w: &Comm, src: usize, v: &mut Verdict) -> tmpi::Result<()> {
    let me = w.rank();
    let want: Vec<Probe> = (0..12).map(|i| probe(src, me, i)).collect();
    let mut got = vec![BLANK; 12];
    w.recv_typed(&mut got, src, 100)?;
    v.check(got == want, || format!("typed whole from {src}"));
    // Every third sent, received into the odd places.
    let mut odd = vec![BLANK; 8];
    let st = w.recv_typed((&mut odd, &Layout::vector(4, 1, 2).offset(1)), src, 101)?;
    let ok = (0..8).all(|i| odd[i] == if i % 2 == 1 { want[(i / 2) * 3] } else { BLANK });
    v.check(ok && st.count_typed::<Probe>() == 4, || format!("typed layout from {src}: {odd:?}"));
    let mut big = vec![BLANK; BIG];
    tmpi::scope(|s| w.irecv_typed(s, &mut big, src, 102)?.wait())?;
    v.check(big.iter().enumerate().all(|(i, p)| *p == probe(src, me, i)), || format!("typed rendezvous from {src}"));
    let mut keep = [probe(7, 7, 7)];
    let bad = w.recv_typed(&mut keep, src, 103);
    v.check(matches!(bad, Err(tmpi::Error::InvalidValue { byte: 2, .. })) && keep == [probe(7, 7, 7)], || {
        format!("a bad bool from {src}: {bad:?}, buffer {keep:?}")
    });
    Ok(())
}

/// The typed collectives, with layouts on the sending or receiving side.
fn typed_collectives(w: &Comm, v: &mut Verdict) -> tmpi::Result<()> {
    let (me, p) = (w.rank(), w.size());
    // bcast: rank 0's every-other element into every rank's first ones.
    let mut b: Vec<Probe> = (0..6).map(|i| if me == 0 { probe(0, 0, i) } else { BLANK }).collect();
    let lay = if me == 0 { Layout::vector(3, 1, 2) } else { Layout::vector(1, 3, 0) };
    w.bcast_typed((&mut b, &lay), 0)?;
    v.check(me == 0 || b[..3] == [probe(0, 0, 0), probe(0, 0, 2), probe(0, 0, 4)], || format!("bcast_typed: {b:?}"));
    // gather at the last rank, into every other place.
    let root = p - 1;
    let mine = [probe(me, root, 0), probe(me, root, 1)];
    let mut at_root = vec![BLANK; 4 * p];
    let spread = Layout::vector(2 * p, 1, 2);
    let recv = (me == root).then(|| BufMut::laid(&mut at_root, &spread));
    w.gather_typed(&mine, recv, root)?;
    if me == root {
        let ok = (0..2 * p).all(|k| at_root[2 * k] == probe(k / 2, root, k % 2) && at_root[2 * k + 1] == BLANK);
        v.check(ok, || format!("gather_typed: {at_root:?}"));
    }
    // scatter from rank 0 of its reversed elements (a layout of one-element blocks).
    let all: Vec<Probe> = (0..p).map(|r| probe(0, r, 9)).collect();
    let (lens, displs): (Vec<usize>, Vec<usize>) = (0..p).map(|r| (1, p - 1 - r)).unzip();
    let rev = Layout::indexed(&lens, &displs);
    let rev_all: Vec<Probe> = all.iter().rev().copied().collect();
    let mut one = [BLANK];
    w.scatter_typed((me == 0).then(|| Buf::laid(&rev_all, &rev)), &mut one, 0)?;
    v.check(one == [probe(0, me, 9)], || format!("scatter_typed: {one:?}"));
    // allgather and alltoall.
    let mut every = vec![BLANK; p];
    w.allgather_typed(&[probe(me, 0, 3)], &mut every)?;
    v.check(every.iter().enumerate().all(|(r, x)| *x == probe(r, 0, 3)), || format!("allgather_typed: {every:?}"));
    let out: Vec<Probe> = (0..p).map(|d| probe(me, d, 4)).collect();
    let mut inn = vec![BLANK; p];
    w.alltoall_typed(&out, &mut inn)?;
    v.check(inn.iter().enumerate().all(|(s, x)| *x == probe(s, me, 4)), || format!("alltoall_typed: {inn:?}"));
    Ok(())
}

/// The typed v-collectives: rank `r` contributes `r + 1` elements, each region followed by one
/// element the call must leave alone; and a synchronous typed send around the ring.
fn typed_v_collectives(w: &Comm, v: &mut Verdict) -> tmpi::Result<()> {
    let (me, p) = (w.rank(), w.size());
    let counts: Vec<usize> = (0..p).map(|r| r + 1).collect();
    let displs: Vec<usize> = (0..p).map(|r| r * (r + 3) / 2).collect();
    let total = displs[p - 1] + counts[p - 1] + 1;
    let want: Vec<Probe> = (0..total)
        .map(|k| (0..p).find(|&r| (displs[r]..displs[r] + counts[r]).contains(&k)).map_or(BLANK, |r| probe(r, 0, k - displs[r])))
        .collect();
    let mine: Vec<Probe> = (0..=me).map(|i| probe(me, 0, i)).collect();
    let mut every = vec![BLANK; total];
    w.allgatherv_typed(&mine, &mut every, &counts, &displs)?;
    v.check(every == want, || format!("allgatherv_typed: {every:?}"));
    let mut at_root = vec![BLANK; total];
    w.gatherv_typed(&mine, (me == 0).then_some(&mut at_root[..]), &counts, &displs, 0)?;
    v.check(me != 0 || at_root == want, || format!("gatherv_typed: {at_root:?}"));
    let mut back = vec![BLANK; me + 1];
    w.scatterv_typed((me == 0).then_some(&want[..]), &counts, &displs, &mut back, 0)?;
    v.check(back == mine, || format!("scatterv_typed: {back:?}"));
    // alltoallv: two elements to every rank, received in reverse rank order.
    let out: Vec<Probe> = (0..2 * p).map(|k| probe(me, k / 2, k % 2)).collect();
    let (twos, evens) = (vec![2; p], (0..p).map(|d| 2 * d).collect::<Vec<_>>());
    let rev: Vec<usize> = (0..p).map(|s| 2 * (p - 1 - s)).collect();
    let mut inn = vec![BLANK; 2 * p];
    w.alltoallv_typed(&out, &twos, &evens, &mut inn, &twos, &rev)?;
    let ok = (0..p).all(|s| inn[rev[s]] == probe(s, me, 0) && inn[rev[s] + 1] == probe(s, me, 1));
    v.check(ok, || format!("alltoallv_typed: {inn:?}"));
    if p == 1 {
        return Ok(()); // a synchronous send to itself would wait for a receive never posted
    }
    let mut got = [BLANK];
    let (next, prev) = ((me + 1) % p, (me + p - 1) % p);
    if me % 2 == 0 {
        w.ssend_typed(&[probe(me, next, 5)], next, 104)?;
        w.recv_typed(&mut got, prev, 104)?;
    } else {
        w.recv_typed(&mut got, prev, 104)?;
        w.ssend_typed(&[probe(me, next, 5)], next, 104)?;
    }
    v.check(got == [probe(prev, me, 5)], || format!("ssend_typed: {got:?}"));
    Ok(())
}

fn main() -> Result<(), Box<dyn StdError>> {
    let w = tmpi::init()?;
    let (r, p) = (w.rank(), w.size());
    let mut v = Verdict::new("layouts", r);
    for a in 0..p {
        for b in (0..p).filter(|&b| b != a) {
            if a == r {
                send_all(&w, b, &mut v)?;
            } else if b == r {
                recv_all(&w, a, &mut v)?;
            }
        }
    }
    for a in 0..p {
        for b in (0..p).filter(|&b| b != a) {
            if a == r {
                typed_send(&w, b)?;
            } else if b == r {
                typed_recv(&w, a, &mut v)?;
            }
        }
    }
    typed_collectives(&w, &mut v)?;
    typed_v_collectives(&w, &mut v)?;
    v.finish(&w, &format!("{p} ranks"))?;
    w.finalize()?;
    Ok(())
}
