//! Collectives with bad arguments return errors at once, and the communicator still works.
//!
//! On the world communicator every rank makes the same mistake (so no rank is left waiting):
//! a root outside the communicator (`InvalidRoot`), reduction buffers of different lengths,
//! an `allgather` / `alltoall` receive buffer of the wrong length (`InvalidBuffer`), a bitwise
//! operator on floats (`InvalidOp`). After each, a correct `allreduce` must still give the
//! right answer. Mistakes only a root can make (no receive buffer at the root of `reduce` /
//! `gather`, no send buffer at the root of `scatter`, a root buffer of the wrong length) are
//! made on a communicator of one rank (each rank's own, from `split`), where they cannot leave
//! other ranks waiting.

use std::error::Error as StdError;

use tmpi::{Comm, Error, Op};
use tmpi_tests::Verdict;

fn invalid_root(root: usize, size: usize) -> impl FnOnce(&Error) -> bool {
    move |e| matches!(e, Error::InvalidRoot { root: r, size: s } if *r == root && *s == size)
}

fn invalid_buffer(e: &Error) -> bool {
    matches!(e, Error::InvalidBuffer(_))
}

/// A correct collective after a refused one: the communicator is not left in a bad state.
fn still_works(c: &Comm, v: &mut Verdict, after: &str) -> tmpi::Result<()> {
    let mut s = [0u64; 2];
    c.allreduce(&[1u64, c.rank() as u64], &mut s, Op::Sum)?;
    let p = c.size() as u64;
    v.check(s == [p, p * (p - 1) / 2], || format!("allreduce after {after}: {s:?}"));
    Ok(())
}

fn symmetric(c: &Comm, v: &mut Verdict) -> tmpi::Result<()> {
    let p = c.size();
    for root in [p, p + 3, usize::MAX] {
        let mut b = [1u32; 4];
        v.check_err(c.bcast(&mut b, root), invalid_root(root, p), "bcast: InvalidRoot");
        let mut out = [0u32; 4];
        v.check_err(c.reduce(&[1u32; 4], Some(&mut out), Op::Sum, root), invalid_root(root, p), "reduce: InvalidRoot");
        let mut all = vec![0u32; 4 * p];
        v.check_err(c.gather(&[1u32; 4], Some(&mut all), root), invalid_root(root, p), "gather: InvalidRoot");
        v.check_err(c.scatter(Some(&all), &mut out, root), invalid_root(root, p), "scatter: InvalidRoot");
        still_works(c, v, &format!("root {root}"))?;
    }

    let mut three = [0u64; 3];
    v.check_err(c.allreduce(&[1u64; 4], &mut three, Op::Sum), invalid_buffer, "allreduce 4 -> 3: InvalidBuffer");
    let mut five = [0u64; 5];
    v.check_err(c.allreduce(&[1u64; 4], &mut five, Op::Max), invalid_buffer, "allreduce 4 -> 5: InvalidBuffer");
    still_works(c, v, "allreduce with bad lengths")?;

    let mut short = vec![0u16; 2 * p - 1];
    v.check_err(c.allgather(&[1u16; 2], &mut short), invalid_buffer, "allgather short: InvalidBuffer");
    let mut long = vec![0u16; 2 * p + 1];
    v.check_err(c.allgather(&[1u16; 2], &mut long), invalid_buffer, "allgather long: InvalidBuffer");
    still_works(c, v, "allgather with bad lengths")?;

    let send = vec![1u8; 2 * p];
    let mut out = vec![0u8; 2 * p + 1];
    v.check_err(c.alltoall(&send, &mut out), invalid_buffer, "alltoall recv != send: InvalidBuffer");
    if p > 1 {
        let send = vec![1u8; 2 * p + 1];
        let mut out = vec![0u8; 2 * p + 1];
        v.check_err(c.alltoall(&send, &mut out), invalid_buffer, "alltoall not divisible: InvalidBuffer");
    }
    still_works(c, v, "alltoall with bad lengths")?;

    let mut f = [0f64; 2];
    v.check_err(
        c.allreduce(&[1.0f64, 2.0], &mut f, Op::BitAnd),
        |e| matches!(e, Error::InvalidOp { .. }),
        "allreduce BitAnd on f64: InvalidOp",
    );
    let mut g = [0f32; 2];
    v.check_err(
        c.reduce(&[1.0f32, 2.0], Some(&mut g), Op::BitXor, 0),
        |e| matches!(e, Error::InvalidOp { .. }),
        "reduce BitXor on f32: InvalidOp",
    );
    still_works(c, v, "float bitwise operators")
}

fn root_only(me: &Comm, v: &mut Verdict) -> tmpi::Result<()> {
    v.check(me.size() == 1 && me.rank() == 0, || format!("self comm: size {} rank {}", me.size(), me.rank()));
    v.check_err(me.reduce(&[1u32; 3], None, Op::Sum, 0), invalid_buffer, "reduce root without recv");
    let mut two = [0u32; 2];
    v.check_err(me.reduce(&[1u32; 3], Some(&mut two), Op::Sum, 0), invalid_buffer, "reduce root recv too short");
    v.check_err(me.gather(&[1u32; 3], None, 0), invalid_buffer, "gather root without recv");
    v.check_err(me.gather(&[1u32; 3], Some(&mut two), 0), invalid_buffer, "gather root recv too short");
    let mut three = [0u32; 3];
    v.check_err(me.scatter(None, &mut three, 0), invalid_buffer, "scatter root without send");
    v.check_err(me.scatter(Some(&[1u32; 4]), &mut three, 0), invalid_buffer, "scatter root send too long");
    still_works(me, v, "root-only mistakes")?;
    // And the good versions on the same communicator.
    let mut out = [0u32; 3];
    me.gather(&[4u32, 5, 6], Some(&mut out), 0)?;
    v.check(out == [4, 5, 6], || format!("gather on self: {out:?}"));
    me.scatter(Some(&[7u32, 8, 9]), &mut out, 0)?;
    v.check(out == [7, 8, 9], || format!("scatter on self: {out:?}"));
    Ok(())
}

fn main() -> Result<(), Box<dyn StdError>> {
    let world = tmpi::init()?;
    let mut v = Verdict::new("badcoll", world.rank());
    symmetric(&world, &mut v)?;
    let me = world.split(Some(world.rank() as u32), 0)?;
    match me {
        Some(me) => root_only(&me, &mut v)?,
        None => v.check(false, || "split with a color returned None".into()),
    }
    let dup = world.dup()?;
    symmetric(&dup, &mut v)?;
    let summary = format!("{} ranks: InvalidRoot, InvalidBuffer, InvalidOp, communicators still work", world.size());
    v.finish(&world, &summary)?;
    world.finalize()?;
    Ok(())
}
