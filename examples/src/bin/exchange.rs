//! Variable-size data two ways. First a v-collective: every rank owns a different number of
//! samples; `allgather` shares the counts, `allgatherv` gathers every rank's samples into one
//! array (displacements from the counts), and each rank checks the global mean against the
//! closed form. Then a serde exchange: each rank sends its right neighbour a `Report` struct
//! (strings and vectors of any length) with `send_serialized`, and receives its left
//! neighbour's with `recv_serialized`, sized on arrival.

use std::error::Error;

use serde::{Deserialize, Serialize};
use tmpi_examples::check;

#[derive(Debug, Serialize, Deserialize, PartialEq)]
struct Report {
    rank: usize,
    host: String,
    samples: Vec<u64>,
    note: Option<String>,
}

/// Rank `r` owns `r % 4 + 1` samples: `r * 10 + i`.
fn samples(r: usize) -> Vec<u64> {
    (0..r % 4 + 1).map(|i| (r * 10 + i) as u64).collect()
}

fn main() -> Result<(), Box<dyn Error>> {
    let world = tmpi::init()?;
    let (rank, n) = (world.rank(), world.size());

    // v-collective: counts first, then the data.
    let mine = samples(rank);
    let mut counts = vec![0usize; n];
    world.allgather(&[mine.len()], &mut counts)?;
    let displs: Vec<usize> = counts.iter().scan(0, |at, &c| Some(std::mem::replace(at, *at + c))).collect();
    let total: usize = counts.iter().sum();
    let mut all = vec![0u64; total];
    world.allgatherv(&mine, &mut all, &counts, &displs)?;
    let want: Vec<u64> = (0..n).flat_map(samples).collect();
    check(all == want, || format!("rank {rank}: allgatherv gave {all:?}"))?;
    let mean = all.iter().sum::<u64>() as f64 / total as f64;

    // serde: a struct of variable size to the right neighbour.
    let report = Report { rank, host: tmpi::processor_name(), samples: mine, note: (rank % 2 == 0).then(|| format!("even rank {rank}")) };
    let (right, left) = ((rank + 1) % n, (rank + n - 1) % n);
    let got: Report = if n == 1 {
        world.send_serialized(&report, 0, 5)?;
        world.recv_serialized(0, 5)?.0
    } else if rank % 2 == 0 {
        world.send_serialized(&report, right, 5)?;
        world.recv_serialized(left, 5)?.0
    } else {
        let got = world.recv_serialized(left, 5)?.0;
        world.send_serialized(&report, right, 5)?;
        got
    };
    check(got.rank == left && got.samples == samples(left), || format!("rank {rank}: got {got:?} from {left}"))?;
    check(got.note.is_some() == (left % 2 == 0), || format!("rank {rank}: note {:?}", got.note))?;

    if rank == 0 {
        println!("exchange: {total} samples from {n} ranks (mean {mean:.3}) by allgatherv, reports passed around the ring by serde: OK");
    }
    world.finalize()?;
    Ok(())
}
