//! `send_layout` and `recv_layout` between every ordered pair of ranks (issue 55 item 4): a
//! layout of a few blocks is gathered straight into one packet where the fabric takes that
//! many parts (16 on shared memory, 3 over TCP) and packed where it does not, so each fabric
//! must carry layouts of 1 to 20 blocks alike.
//!
//! For every ordered pair (in one global order, so blocking sends never wait on each other in
//! a cycle) the sender sends vectors and indexed layouts of 1 to 20 blocks (blocks of 1 and 3
//! `u32`s, zero-length blocks among them), one of 64 blocks, and one of 1.6 MB (a rendezvous);
//! the receiver takes each one with `recv_vec` or `recv_layout` (alternately) and compares it
//! with the sender's elements. Prints `layouts: N ranks: C checks: OK`.

use std::error::Error as StdError;

use tmpi::datatype::{pack, Layout};
use tmpi::Comm;
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
    v.finish(&w, &format!("{p} ranks"))?;
    w.finalize()?;
    Ok(())
}
