//! Point-to-point semantics and bad arguments, checked through a real job.
//!
//! Every rank: a rank outside the communicator is `InvalidRank`, a tag above `TAG_UB` is
//! `InvalidTag` (send, ssend, recv, probe, iprobe, isend, irecv, sendrecv), and `TAG_UB`
//! itself works (a message to self).
//!
//! Ranks 0 and 1 (phases separated by barriers of all ranks):
//! 1. a receive buffer too small gives `Truncated` with the message consumed: the next
//!    receive gets the following message (eager and rendezvous sizes, blocking and `irecv`);
//! 2. `recv_vec` of any length (0 included) and `TypeMismatch` (also consuming);
//! 3. `probe` / `iprobe` report source, tag and length without consuming;
//! 4. `sendrecv` between different element types, with wildcards;
//! 5. `ssend` does not complete before the receive is posted (the message rank 1 sends after
//!    its `ssend` cannot be there while rank 0 has not received);
//! 6. non-overtaking between large and small messages on one tag;
//! 7. `Request::test` and `cancel` on an `irecv` that never matches; `wait_any`.
//!
//! All ranks: every rank except 0 sends one message to rank 0, which receives them with
//! `ANY_SOURCE` / `ANY_TAG` and checks each status (source, tag, count).

use std::error::Error as StdError;
use std::time::Duration;

use tmpi::{Error, Status, ANY_SOURCE, ANY_TAG, TAG_UB};
use tmpi_tests::Verdict;

fn word(seed: u64, i: usize) -> u64 {
    seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ (i as u64).wrapping_mul(0x0000_0100_0000_01b3)
}

fn pattern(seed: u64, len: usize) -> Vec<u64> {
    (0..len).map(|i| word(seed, i)).collect()
}

fn is_invalid_rank(rank: usize, size: usize) -> impl FnOnce(&Error) -> bool {
    move |e| matches!(e, Error::InvalidRank { rank: r, size: s } if *r == rank && *s == size)
}

fn is_invalid_tag(tag: u32) -> impl FnOnce(&Error) -> bool {
    move |e| matches!(e, Error::InvalidTag { tag: t } if *t == tag)
}

fn local_checks(world: &tmpi::Comm, v: &mut Verdict) {
    let (rank, n) = (world.rank(), world.size());
    let bad_tag = TAG_UB + 1;
    v.check(TAG_UB >= (1 << 23) - 1, || format!("TAG_UB {TAG_UB} < 2^23 - 1"));
    for bad in [n, n + 1, usize::MAX] {
        v.check_err(world.send(&[1u8], bad, 0), is_invalid_rank(bad, n), "send: InvalidRank");
        v.check_err(world.ssend(&[1u8], bad, 0), is_invalid_rank(bad, n), "ssend: InvalidRank");
        let mut b = [0u8; 1];
        v.check_err(world.recv(&mut b, bad, 0), is_invalid_rank(bad, n), "recv: InvalidRank");
        v.check_err(world.probe(bad, 0), is_invalid_rank(bad, n), "probe: InvalidRank");
        v.check_err(world.iprobe(bad, 0), is_invalid_rank(bad, n), "iprobe: InvalidRank");
        v.check_err(world.recv_vec::<u8>(bad, ANY_TAG), is_invalid_rank(bad, n), "recv_vec: InvalidRank");
        v.check_err(world.sendrecv(&[1u8], bad, 0, &mut b, rank, 0), is_invalid_rank(bad, n), "sendrecv (dest): InvalidRank");
        v.check_err(world.sendrecv(&[1u8], rank, 0, &mut b, bad, 0), is_invalid_rank(bad, n), "sendrecv (source): InvalidRank");
        let (sbuf, mut rbuf) = ([1u8], [0u8]);
        tmpi::scope(|s| {
            v.check_err(world.isend(s, &sbuf, bad, 0), is_invalid_rank(bad, n), "isend: InvalidRank");
            v.check_err(world.irecv(s, &mut rbuf, bad, 0), is_invalid_rank(bad, n), "irecv: InvalidRank");
        });
    }
    let e = world.send(&[1u8], n, 0).unwrap_err().to_string();
    v.check(e.contains(&n.to_string()), || format!("InvalidRank message {e:?} does not name rank {n}"));

    for bad in [bad_tag, u32::MAX] {
        v.check_err(world.send(&[1u8], rank, bad), is_invalid_tag(bad), "send: InvalidTag");
        v.check_err(world.ssend(&[1u8], rank, bad), is_invalid_tag(bad), "ssend: InvalidTag");
        let mut b = [0u8; 1];
        v.check_err(world.recv(&mut b, rank, bad), is_invalid_tag(bad), "recv: InvalidTag");
        v.check_err(world.probe(ANY_SOURCE, bad), is_invalid_tag(bad), "probe: InvalidTag");
        v.check_err(world.iprobe(rank, bad), is_invalid_tag(bad), "iprobe: InvalidTag");
        v.check_err(world.sendrecv(&[1u8], rank, bad, &mut b, rank, 0), is_invalid_tag(bad), "sendrecv (send tag): InvalidTag");
        let (sbuf, mut rbuf) = ([1u8], [0u8]);
        tmpi::scope(|s| {
            v.check_err(world.isend(s, &sbuf, rank, bad), is_invalid_tag(bad), "isend: InvalidTag");
            v.check_err(world.irecv(s, &mut rbuf, ANY_SOURCE, bad), is_invalid_tag(bad), "irecv: InvalidTag");
        });
    }
    // Nothing was sent by the failed calls: no message to self is pending.
    match world.iprobe(rank, ANY_TAG) {
        Ok(None) => v.check(true, String::new),
        other => v.check(false, || format!("after refused sends, iprobe(self) = {other:?}")),
    }
    // TAG_UB itself is valid: a message to self.
    let r = world.send(&[41u64, 42], rank, TAG_UB);
    v.check(r.is_ok(), || format!("send to self with TAG_UB: {r:?}"));
    let mut b = [0u64; 2];
    match world.recv(&mut b, rank, TAG_UB) {
        Ok(st) => v.check(b == [41, 42] && st.source() == rank && st.tag() == TAG_UB && st.count::<u64>() == 2, || {
            format!("self message with TAG_UB: {b:?} {st:?}")
        }),
        Err(e) => v.check(false, || format!("recv from self with TAG_UB: {e}")),
    }
}

fn expect_status(v: &mut Verdict, what: &str, st: tmpi::Result<Status>, src: usize, tag: u32, len: usize) {
    match st {
        Ok(st) => v.check(st.source() == src && st.tag() == tag && st.len() == len && !st.cancelled(), || {
            format!("{what}: status {st:?}, expected source {src} tag {tag} len {len}")
        }),
        Err(e) => v.check(false, || format!("{what}: {e}")),
    }
}

fn truncation(world: &tmpi::Comm, v: &mut Verdict) -> tmpi::Result<()> {
    const BIG: usize = 40_000; // u64 words: 320 KB, beyond the eager limit
    match world.rank() {
        1 => {
            world.send(&pattern(1, 8), 0, 10)?;
            world.send(&pattern(2, 2), 0, 10)?;
            world.send(&pattern(3, BIG), 0, 11)?;
            world.send(&pattern(4, 3), 0, 11)?;
            world.send(&pattern(5, 100), 0, 12)?;
            world.send(&pattern(6, 1), 0, 12)?;
        }
        0 => {
            let mut small = [0u64; 4];
            v.check_err(
                world.recv(&mut small, 1, 10),
                |e| matches!(e, Error::Truncated { source_rank: 1, tag: 10, len: 64, capacity: 32 }),
                "Truncated {source 1, tag 10, len 64, capacity 32}",
            );
            v.check(small[..] == pattern(1, 4)[..], || format!("truncated receive holds {small:?}, expected the first 4 words"));
            let mut two = [0u64; 2];
            let st = world.recv(&mut two, 1, 10);
            expect_status(v, "message after a truncated one", st, 1, 10, 16);
            v.check(two[..] == pattern(2, 2)[..], || "message after a truncated one: wrong payload".into());

            let mut half = vec![0u64; BIG / 2];
            v.check_err(
                world.recv(&mut half, ANY_SOURCE, 11),
                |e| {
                    matches!(e, Error::Truncated { source_rank: 1, tag: 11, len, capacity }
                    if *len == BIG * 8 && *capacity == BIG * 4)
                },
                "Truncated for a rendezvous-size message",
            );
            let mut three = [0u64; 3];
            let st = world.recv(&mut three, 1, ANY_TAG);
            expect_status(v, "message after a truncated large one", st, 1, 11, 24);
            v.check(three[..] == pattern(4, 3)[..], || "after truncated large: wrong payload".into());

            let mut ten = [0u64; 10];
            let mut one = [0u64; 1];
            let (r1, r2) = tmpi::scope(|s| -> tmpi::Result<_> {
                let a = world.irecv(s, &mut ten, 1, 12)?;
                let b = world.irecv(s, &mut one, 1, 12)?;
                Ok((a.wait(), b.wait()))
            })?;
            v.check_err(r1, |e| matches!(e, Error::Truncated { source_rank: 1, tag: 12, len: 800, capacity: 80 }), "irecv: Truncated");
            expect_status(v, "irecv after a truncated irecv", r2, 1, 12, 8);
            v.check(one[0] == word(6, 0), || "irecv after truncated: wrong payload".into());
        }
        _ => {}
    }
    Ok(())
}

fn vectors_and_probes(world: &tmpi::Comm, v: &mut Verdict) -> tmpi::Result<()> {
    match world.rank() {
        1 => {
            world.send::<u32>(&[], 0, 20)?;
            let big: Vec<u32> = (0..1000).map(|i| i * 3).collect();
            world.send(&big, 0, 21)?;
            world.send(&[7u8; 12], 0, 22)?;
            world.send(&[9u64], 0, 22)?;
            world.send(&[5u16; 100], 0, 23)?;
        }
        0 => {
            receive_vectors(world, v);
            probes(world, v);
        }
        _ => {}
    }
    Ok(())
}

/// Rank 0's `recv_vec`s of rank 1's messages of tags 20-22: out of tag order, empty, and
/// not a whole number of elements (`TypeMismatch`, the message consumed).
fn receive_vectors(world: &tmpi::Comm, v: &mut Verdict) {
    // Out of tag order: tag 21 first.
    match world.recv_vec::<u32>(1, 21) {
        Ok((data, st)) => {
            v.check(data.len() == 1000 && data.iter().enumerate().all(|(i, &x)| x == 3 * i as u32), || {
                format!("recv_vec: {} elements / wrong values", data.len())
            });
            expect_status(v, "recv_vec 1000 u32", Ok(st), 1, 21, 4000);
        }
        Err(e) => v.check(false, || format!("recv_vec: {e}")),
    }
    match world.recv_vec::<u64>(ANY_SOURCE, 20) {
        Ok((data, st)) => {
            v.check(data.is_empty(), || format!("empty message gave {} elements", data.len()));
            expect_status(v, "recv_vec of an empty message", Ok(st), 1, 20, 0);
        }
        Err(e) => v.check(false, || format!("recv_vec of an empty message: {e}")),
    }
    v.check_err(
        world.recv_vec::<u64>(1, 22),
        |e| matches!(e, Error::TypeMismatch { source_rank: 1, len: 12, elem: 8 }),
        "TypeMismatch {len 12, elem 8}",
    );
    match world.recv_vec::<u64>(1, 22) {
        Ok((data, st)) => {
            v.check(data == [9], || format!("message after a type mismatch: {data:?}"));
            expect_status(v, "message after a type mismatch", Ok(st), 1, 22, 8);
        }
        Err(e) => v.check(false, || format!("message after a type mismatch: {e}")),
    }
}

/// Rank 0's probes of rank 1's tag-23 message: `probe` and `iprobe` leave it in place, a tag
/// nobody sent finds nothing, and nothing is left once it is received.
fn probes(world: &tmpi::Comm, v: &mut Verdict) {
    let st = world.probe(ANY_SOURCE, ANY_TAG);
    expect_status(v, "probe(ANY, ANY)", st, 1, 23, 200);
    match world.iprobe(1, 23) {
        Ok(Some(st)) => expect_status(v, "iprobe after probe", Ok(st), 1, 23, 200),
        other => v.check(false, || format!("iprobe after probe: {other:?} (probe consumed?)")),
    }
    match world.iprobe(ANY_SOURCE, 99) {
        Ok(None) => v.check(true, String::new),
        other => v.check(false, || format!("iprobe of a tag nobody sent: {other:?}")),
    }
    let mut buf = [0u16; 100];
    let st = world.recv(&mut buf, 1, 23);
    expect_status(v, "recv after probe", st, 1, 23, 200);
    v.check(buf == [5u16; 100], || "recv after probe: payload".into());
    match world.iprobe(ANY_SOURCE, ANY_TAG) {
        Ok(None) => v.check(true, String::new),
        other => v.check(false, || format!("iprobe after everything was received: {other:?}")),
    }
}

fn sendrecv(world: &tmpi::Comm, v: &mut Verdict) -> tmpi::Result<()> {
    let rank = world.rank();
    if rank > 1 {
        return Ok(());
    }
    let peer = 1 - rank;
    let mine: Vec<u64> = pattern(100 + rank as u64, 5);
    let mut got = [0u8; 40];
    let st = world.sendrecv(&mine, peer, 30 + rank as u32, &mut got, peer, 30 + peer as u32);
    expect_status(v, "sendrecv u64 -> u8", st, peer, 30 + peer as u32, 40);
    let want: Vec<u8> = pattern(100 + peer as u64, 5).iter().flat_map(|w| w.to_ne_bytes()).collect();
    v.check(got[..] == want[..], || "sendrecv: payload".into());
    // Wildcards, and a large message each way (both directions at once must not deadlock).
    let big = pattern(200 + rank as u64, 50_000);
    let mut back = vec![0u64; 50_000];
    let st = world.sendrecv(&big, peer, 32, &mut back, ANY_SOURCE, ANY_TAG);
    expect_status(v, "sendrecv with wildcards", st, peer, 32, 400_000);
    v.check(back == pattern(200 + peer as u64, 50_000), || "large sendrecv: payload".into());
    Ok(())
}

fn synchronous(world: &tmpi::Comm, v: &mut Verdict) -> tmpi::Result<()> {
    match world.rank() {
        1 => {
            world.ssend(&[11u64], 0, 40)?;
            world.send(&[12u64], 0, 41)?;
        }
        0 => {
            std::thread::sleep(Duration::from_millis(400));
            // Rank 1 sends tag 41 only after its ssend completed, which needs our receive.
            match world.iprobe(1, 41) {
                Ok(None) => v.check(true, String::new),
                other => v.check(false, || format!("the message sent after ssend is here before the ssend was received: {other:?}")),
            }
            let mut b = [0u64];
            let st = world.recv(&mut b, 1, 40);
            expect_status(v, "ssend message", st, 1, 40, 8);
            let st = world.recv(&mut b, 1, 41);
            expect_status(v, "message after ssend", st, 1, 41, 8);
            v.check(b[0] == 12, || "message after ssend: payload".into());
        }
        _ => {}
    }
    Ok(())
}

fn ordering(world: &tmpi::Comm, v: &mut Verdict) -> tmpi::Result<()> {
    const K: u64 = 24;
    let len = |k: u64| if k % 3 == 0 { 20_000 } else { 2 };
    match world.rank() {
        1 => {
            let msgs: Vec<Vec<u64>> = (0..K)
                .map(|k| {
                    let mut m = pattern(300 + k, len(k));
                    m[0] = k;
                    m
                })
                .collect();
            tmpi::scope(|s| -> tmpi::Result<()> {
                let mut reqs = Vec::new();
                for m in &msgs {
                    reqs.push(world.isend(s, m, 0, 50)?);
                }
                tmpi::wait_all(reqs)?;
                Ok(())
            })?;
        }
        0 => {
            for k in 0..K {
                match world.recv_vec::<u64>(ANY_SOURCE, ANY_TAG) {
                    Ok((m, st)) => {
                        v.check(m.len() == len(k) && m[0] == k && st.source() == 1 && st.tag() == 50, || {
                            format!("message {k}: got #{} of {} words ({st:?}): overtaken", m.first().copied().unwrap_or(u64::MAX), m.len())
                        });
                    }
                    Err(e) => v.check(false, || format!("ordering recv {k}: {e}")),
                }
            }
        }
        _ => {}
    }
    Ok(())
}

fn requests(world: &tmpi::Comm, v: &mut Verdict) -> tmpi::Result<()> {
    let rank = world.rank();
    if rank > 1 {
        return Ok(());
    }
    let peer = 1 - rank;
    let mut never = [0u64; 4];
    let mut a = [0u64; 1];
    let mut b = [0u64; 1];
    let sa = [rank as u64 + 10];
    let sb = [rank as u64 + 20];
    tmpi::scope(|s| -> tmpi::Result<()> {
        let mut r = world.irecv(s, &mut never, peer, 60)?;
        match r.test() {
            Ok(None) => v.check(true, String::new),
            other => v.check(false, || format!("test() of an unmatched irecv: {other:?}")),
        }
        r.cancel()?;
        match r.wait() {
            Ok(st) => v.check(st.cancelled(), || format!("cancelled irecv: status {st:?} not cancelled")),
            Err(e) => v.check(false, || format!("wait on a cancelled irecv: {e}")),
        }
        let mut reqs = vec![world.irecv(s, &mut a, peer, 61)?, world.irecv(s, &mut b, peer, 62)?];
        // Send tag 62 first: wait_any should then be able to return it before tag 61.
        let w2 = world.isend(s, &sb, peer, 62)?;
        let w1 = world.isend(s, &sa, peer, 61)?;
        let mut seen = Vec::new();
        while !reqs.is_empty() {
            let before = reqs.len();
            let (i, st) = tmpi::wait_any(&mut reqs)?;
            v.check(i < before && reqs.len() == before - 1, || format!("wait_any index {i} of {before}"));
            seen.push(st.tag());
        }
        seen.sort_unstable();
        v.check(seen == [61, 62], || format!("wait_any completed tags {seen:?}"));
        w1.wait()?;
        w2.wait()?;
        Ok(())
    })?;
    v.check(a[0] == peer as u64 + 10 && b[0] == peer as u64 + 20, || format!("wait_any payloads {a:?} {b:?}"));
    v.check(never == [0; 4], || "a cancelled irecv wrote its buffer".into());
    Ok(())
}

fn wildcard_statuses(world: &tmpi::Comm, v: &mut Verdict) -> tmpi::Result<()> {
    let (rank, n) = (world.rank(), world.size());
    if rank == 0 {
        let mut seen = vec![false; n];
        for _ in 1..n {
            let mut buf = vec![0u32; n + 1];
            match world.recv(&mut buf, ANY_SOURCE, ANY_TAG) {
                Ok(st) => {
                    let src = st.source();
                    let ok = src >= 1
                        && src < n
                        && !seen[src]
                        && st.tag() == 100 + src as u32
                        && st.count::<u32>() == src + 1
                        && buf[..=src].iter().all(|&x| x == src as u32);
                    v.check(ok, || format!("ANY_SOURCE/ANY_TAG status {st:?}"));
                    if src < n {
                        seen[src] = true;
                    }
                }
                Err(e) => v.check(false, || format!("ANY_SOURCE/ANY_TAG recv: {e}")),
            }
        }
    } else {
        world.send(&vec![rank as u32; rank + 1], 0, 100 + rank as u32)?;
    }
    Ok(())
}

fn main() -> Result<(), Box<dyn StdError>> {
    let world = tmpi::init()?;
    let mut v = Verdict::new("badcalls", world.rank());
    local_checks(&world, &mut v);
    world.barrier()?;
    if world.size() >= 2 {
        truncation(&world, &mut v)?;
        world.barrier()?;
        vectors_and_probes(&world, &mut v)?;
        world.barrier()?;
        sendrecv(&world, &mut v)?;
        world.barrier()?;
        synchronous(&world, &mut v)?;
        world.barrier()?;
        ordering(&world, &mut v)?;
        world.barrier()?;
        requests(&world, &mut v)?;
        world.barrier()?;
    }
    wildcard_statuses(&world, &mut v)?;
    let summary =
        format!("{} ranks: invalid rank/tag, truncation, recv_vec, probe, sendrecv, ssend, ordering, requests, wildcards", world.size());
    v.finish(&world, &summary)?;
    world.finalize()?;
    Ok(())
}
