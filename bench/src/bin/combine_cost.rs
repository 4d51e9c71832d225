//! Serial against parallel combining of a reduction (`f64` sum) from 16 KiB to 16 MiB: the
//! measurement behind `tmpi::op::PAR_THRESHOLD_BYTES`, the size from which the runtime
//! combines buffers with rayon in chunks of `PAR_CHUNK_BYTES`. It was the ignored test
//! `op::tests::bench_threshold`.
//!
//! `combine_cost` prints one line per size: the mean time of the serial kernel over the
//! whole buffer, and of the kernel on `PAR_CHUNK_BYTES` chunks spread over rayon's threads.
//! It asserts nothing about time.

use rayon::prelude::*;
use tmpi::op::PAR_CHUNK_BYTES;
use tmpi::{Op, Reducible};

fn main() {
    for kib in [16usize, 64, 128, 256, 512, 1024, 4096, 16384] {
        let n = kib * 1024 / 8;
        let mut a = vec![1.0f64; n];
        let b = vec![2.0f64; n];
        let reps = (64 * 1024 / kib).max(4);
        let t = std::time::Instant::now();
        for _ in 0..reps {
            f64::kernel(Op::Sum, &mut a, &b, false);
        }
        let ser = t.elapsed().as_secs_f64() / reps as f64;
        let chunk = PAR_CHUNK_BYTES / 8;
        let t = std::time::Instant::now();
        for _ in 0..reps {
            a.par_chunks_mut(chunk).zip(b.par_chunks(chunk)).for_each(|(x, y)| f64::kernel(Op::Sum, x, y, false));
        }
        let par = t.elapsed().as_secs_f64() / reps as f64;
        println!("{kib:>6} KiB serial {:>9.1} us parallel {:>9.1} us", ser * 1e6, par * 1e6);
    }
}
