//! Eager point-to-point through the two matchers of `tmpi_transport::ofi::p2p`, for
//! instruction counts under callgrind (wall time on a shared host means nothing):
//!
//! ```text
//! ofi_p2p_rate <provider|soft|auto> <tcp|shm> <messages> [bytes]
//! ```
//!
//! Two endpoints of one process: rank 1 sends `messages` messages of `bytes` bytes (8 by
//! default) to rank 0, which keeps a window of 16 exact receives posted. Run it twice with
//! different counts under `valgrind --tool=callgrind`; the difference of the totals divided
//! by the difference of the counts is the cost of one message, both sides together.

use tmpi_transport::ofi::p2p::{Matching, TaggedP2p};
use tmpi_transport::ofi::{getinfo, Endpoint, Hints, OfiDomain, FI_ADDR_UNSPEC};

const WINDOW: usize = 16;

type Res<T> = Result<T, Box<dyn std::error::Error>>;

fn endpoints(provider: &str) -> Res<Vec<(Endpoint, Vec<u64>)>> {
    let hints = Hints { provider: Some(provider.into()), node: Some("127.0.0.1".into()) };
    let offer = getinfo(&hints)?.into_iter().next().ok_or("no offer")?;
    let d = OfiDomain::open(offer)?;
    let mut eps = vec![Endpoint::open(&d, 2)?, Endpoint::open(&d, 2)?];
    let names = [eps[0].name()?, eps[1].name()?];
    let a01 = eps[0].insert(&names[1])?;
    let a10 = eps[1].insert(&names[0])?;
    let mut it = eps.drain(..);
    let (e0, e1) = (it.next().ok_or("ep")?, it.next().ok_or("ep")?);
    Ok(vec![(e0, vec![FI_ADDR_UNSPEC, a01]), (e1, vec![a10, FI_ADDR_UNSPEC])])
}

fn drive(ps: &mut [Box<dyn TaggedP2p>], n: usize, bytes: usize) -> Res<()> {
    let data = vec![7u8; bytes];
    let (mut posted, mut sent, mut got) = (0, 0, 0);
    let mut done = Vec::new();
    while got < n {
        while posted < n && posted - got < WINDOW {
            ps[0].post_recv(0, Some(1), Some(5), bytes)?;
            posted += 1;
        }
        while sent < posted {
            ps[1].send(0, 0, 5, &data)?;
            sent += 1;
        }
        ps[1].progress(&mut done)?;
        ps[0].progress(&mut done)?;
        got += done.len();
        done.clear();
    }
    Ok(())
}

fn main() -> Res<()> {
    let args: Vec<String> = std::env::args().collect();
    let usage = "usage: ofi_p2p_rate <provider|soft|auto> <tcp|shm> <messages> [bytes]";
    let (matcher, provider) = (args.get(1).ok_or(usage)?, args.get(2).ok_or(usage)?);
    let n: usize = args.get(3).ok_or(usage)?.parse()?;
    let bytes: usize = args.get(4).map_or(Ok(8), |b| b.parse())?;
    let eps = endpoints(provider)?;
    let mut ps: Vec<Box<dyn TaggedP2p>> = Vec::new();
    let matching = match matcher.as_str() {
        "provider" => Matching::Provider,
        "soft" => Matching::Software,
        "auto" => Matching::default_for(provider),
        _ => return Err(usage.into()),
    };
    for (r, (e, a)) in eps.into_iter().enumerate() {
        ps.push(matching.open(e, r as u32, a)?);
    }
    // Warm up (connections, first allocations), then the measured messages.
    drive(&mut ps, 64, bytes)?;
    drive(&mut ps, n, bytes)?;
    println!("{matching:?} matching over {provider}: {n} messages of {bytes} bytes");
    Ok(())
}
