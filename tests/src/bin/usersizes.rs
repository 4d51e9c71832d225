//! Sizes from the caller are errors, never aborts (issue 55, item 7), in a real job: every
//! rank asks for what no machine holds, checks that each request is refused with
//! `InvalidBuffer`, and then shows the job is whole (a ring exchange of layouts and an
//! allreduce). `tests/tests/usersizes.rs` runs it through `tmpirun`.
//!
//! - `alloc_shared::<u8>` of more than this machine's memory (at least 2^40 bytes): the heap
//!   cannot serve it, and its fallback to private memory used to abort;
//! - `Layout::vector(usize::MAX / 2, 1, 0)`, which used to panic when built, sent and packed;
//! - a layout whose blocks each fit the buffer but overlap to 2^60 elements, sent and received
//!   (each used to abort allocating them), and a receive layout that selects more elements
//!   than its buffer has.

use std::error::Error as StdError;

use tmpi::datatype::{pack, Layout};
use tmpi::Error;
use tmpi_tests::Verdict;

fn invalid_buffer(e: &Error) -> bool {
    matches!(e, Error::InvalidBuffer(_))
}

fn main() -> Result<(), Box<dyn StdError>> {
    let world = tmpi::init()?;
    let (rank, n) = (world.rank(), world.size());
    let (next, prev) = ((rank + 1) % n, (rank + n - 1) % n);
    let mut v = Verdict::new("usersizes", rank);

    let mem = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| m.lines().find_map(|l| l.strip_prefix("MemTotal:")?.trim().strip_suffix("kB")?.trim().parse::<usize>().ok()))
        .map_or(usize::MAX / 2, |kib| kib.saturating_mul(1024));
    let too_big = mem.saturating_add(1).max(1 << 40);
    v.check_err(world.alloc_shared::<u8>(too_big), invalid_buffer, "alloc_shared beyond memory: InvalidBuffer");

    let huge = Layout::vector(usize::MAX / 2, 1, 0);
    v.check_err(pack(&[1u8], &huge), invalid_buffer, "pack of usize::MAX / 2 elements: InvalidBuffer");
    v.check_err(world.send_layout(&[1u8], &huge, next, 1), invalid_buffer, "send_layout of usize::MAX / 2 elements: InvalidBuffer");

    let mut buf = vec![rank as u64; 1 << 20];
    let overlapping = Layout::vector(1 << 40, 1 << 20, 0);
    v.check_err(world.send_layout(&buf, &overlapping, next, 1), invalid_buffer, "send_layout of 2^60 overlapping elements: InvalidBuffer");
    v.check_err(
        world.recv_layout(&mut buf, &overlapping, prev, 1),
        invalid_buffer,
        "recv_layout of 2^60 overlapping elements: InvalidBuffer",
    );
    v.check_err(
        world.recv_layout(&mut buf[..10], &Layout::vector(4, 4, 2), prev, 1),
        invalid_buffer,
        "recv_layout of 16 elements into 10: InvalidBuffer",
    );

    // Nothing was sent or received by the refused calls: the ring's layouts are the first
    // messages on tag 1 (32 blocks: packed, then sent as one message).
    let col = Layout::vector(32, 1, 8).offset(rank % 8);
    let sent = pack(&buf, &col)?;
    let mut got = vec![u64::MAX; 32];
    tmpi::scope(|s| -> tmpi::Result<()> {
        let r = world.irecv(s, &mut got, prev, 1)?;
        world.send_layout(&buf, &col, next, 1)?;
        r.wait().map(|_| ())
    })?;
    v.check(got == [prev as u64; 32] && sent == [rank as u64; 32], || format!("ring of layouts: got {got:?}"));
    let mut sum = [0u64];
    world.allreduce(&[1u64], &mut sum, tmpi::Op::Sum)?;
    v.check(sum[0] == n as u64, || format!("allreduce after the refusals: {}", sum[0]));
    v.finish(&world, &format!("{n} ranks, {} refusals", 6))?;
    world.finalize()?;
    Ok(())
}
