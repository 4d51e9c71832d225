//! A large job's traffic and the shared memory it takes.
//!
//! `scalecheck [BYTES]`: every rank passes a token around the ring of all ranks (rank 0 starts
//! it, each adds its rank), then shifts a message of BYTES bytes (default 262144) to its right
//! neighbour with `sendrecv` (long enough to stream through several packets), then runs an
//! `alltoall` of 24 bytes per pair and an `allreduce` of 1000 `u64`, checking every result.
//! After a barrier rank 0 measures the job's shared-memory segment: the bytes the tmpfs
//! allocated for it (`st_blocks` of the file, reached through `/proc/self/map_files` since the
//! name is unlinked) and its mapped size. It prints
//! `scalecheck: N ranks: ring, shift, alltoall, allreduce: K checks: OK` and
//! `scalecheck: shm allocated=A mapped=M` (A and M in bytes; `none` when the job has no
//! segment).

use std::error::Error as StdError;
use std::os::unix::fs::MetadataExt;

use tmpi::Op;
use tmpi_tests::Verdict;

const TAG: u32 = 3;

fn main() -> Result<(), Box<dyn StdError>> {
    let bytes: usize = std::env::args().nth(1).map_or(Ok(262_144), |a| a.parse())?;
    let world = tmpi::init()?;
    let (me, p) = (world.rank(), world.size());
    let mut v = Verdict::new("scalecheck", me);
    let (right, left) = ((me + 1) % p, (me + p - 1) % p);

    // The token: rank 0 starts it with 0, each rank adds its own rank and passes it on.
    let mut tok = [0u64];
    if me == 0 {
        world.send(&tok, right, TAG)?;
        world.recv(&mut tok, left, TAG)?;
        let want = (p as u64) * (p as u64 - 1) / 2;
        v.check(tok[0] == want, || format!("the token came back as {} (want {want})", tok[0]));
    } else {
        world.recv(&mut tok, left, TAG)?;
        tok[0] += me as u64;
        world.send(&tok, right, TAG)?;
    }

    // The shift: a long message from each rank to its right neighbour.
    let out: Vec<u8> = (0..bytes).map(|i| (i * 31 + me * 7) as u8).collect();
    let mut inb = vec![0u8; bytes];
    world.sendrecv(&out, right, TAG + 1, &mut inb, left, TAG + 1)?;
    let ok = inb.iter().enumerate().all(|(i, &b)| b == (i * 31 + left * 7) as u8);
    v.check(ok, || format!("the shifted message from rank {left} differs"));

    // alltoall: 3 words per pair, each naming source, destination and a salt.
    let send: Vec<u64> = (0..p).flat_map(|d| [me as u64, d as u64, 0xabcd]).collect();
    let mut recv = vec![0u64; 3 * p];
    world.alltoall(&send, &mut recv)?;
    let ok = (0..p).all(|s| recv[3 * s..3 * s + 3] == [s as u64, me as u64, 0xabcd]);
    v.check(ok, || "alltoall delivered a wrong block".into());

    // allreduce.
    let send: Vec<u64> = (0..1000u64).map(|j| j + me as u64).collect();
    let mut sum = vec![0u64; 1000];
    world.allreduce(&send, &mut sum, Op::Sum)?;
    let p64 = p as u64;
    let ok = sum.iter().enumerate().all(|(j, &x)| x == p64 * j as u64 + p64 * (p64 - 1) / 2);
    v.check(ok, || "allreduce gave a wrong sum".into());

    world.barrier()?;
    let shm = if me == 0 { segment_size() } else { None };
    v.finish(&world, &format!("{p} ranks: ring, shift, alltoall, allreduce"))?;
    if me == 0 {
        match shm {
            Some((alloc, mapped)) => println!("scalecheck: shm allocated={alloc} mapped={mapped}"),
            None => println!("scalecheck: shm none"),
        }
    }
    world.finalize()?;
    Ok(())
}

/// The job's segment as this process maps it: (bytes allocated in the tmpfs, bytes mapped).
fn segment_size() -> Option<(u64, u64)> {
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    // The largest mapping of a /dev/shm/tmpi-* file that is not a shared heap is the segment.
    let (range, len) = maps
        .lines()
        .filter(|l| l.contains("/dev/shm/tmpi-") && !l.contains("heap"))
        .filter_map(|l| {
            let range = l.split_whitespace().next()?;
            let (a, b) = range.split_once('-')?;
            let len = u64::from_str_radix(b, 16).ok()? - u64::from_str_radix(a, 16).ok()?;
            Some((range.to_string(), len))
        })
        .max_by_key(|&(_, len)| len)?;
    let meta = std::fs::metadata(format!("/proc/self/map_files/{range}")).ok()?;
    Some((meta.blocks() * 512, len))
}
