//! Ping-pong latency while the matching queues are deep: tmpi's own benchmark, OSU-style output.
//!
//! Ranks 0 and 1 ping-pong 8-byte and 1 KiB messages while each of them holds `D` entries
//! that every match has to get past, for `D` in 0, 16, 256, 1024, 4096. Three variants:
//!
//! * `posted-specific`: `D` receives from the peer on a tag that is never sent stay posted
//!   (irecvs in a `tmpi::scope`, cancelled at the end; the cancellation is checked);
//! * `posted-any`: the same with `ANY_SOURCE` receives, which no per-source index can skip;
//! * `unexpected`: `D` messages from the peer on a tag not received until the end sit in the
//!   unexpected queue (drained and counted at the end).
//!
//! `-m` replaces the two default sizes with OSU's doubling range; `-v` picks variants and `-d`
//! depths. `bench/c/depth.c` is the same program for the peers (`tmpi-compare` runs both).

use std::process::ExitCode;

use tmpi_bench::{preamble, report, require, usage, AlignedBuf, BoxError, Family, Options, Parsed, FIELD_WIDTH, SIZE_WIDTH};

const NAME: &str = "osu_latency_depth";
const PING: tmpi::Tag = 1;
const NEVER: tmpi::Tag = 77;
const LATER: tmpi::Tag = 78;
const DEPTHS: [usize; 5] = [0, 16, 256, 1024, 4096];
const SIZES: [usize; 2] = [8, 1024];

/// Usage lines of the options of this program only.
const EXTRA_USAGE: &str = "  -v, --variant V[,V...]        posted-specific, posted-any, unexpected (default: all)\n\
                           \x20 -d, --depths D[,D...]         queue depths (default 0,16,256,1024,4096)\n\
                           \x20 (without -m: sizes 8 and 1024 only)\n";
/// Largest depth accepted on the command line (each entry is a posted receive or a message).
const MAX_DEPTH: usize = 1 << 20;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Variant {
    PostedSpecific,
    PostedAny,
    Unexpected,
}

impl Variant {
    const ALL: [Variant; 3] = [Variant::PostedSpecific, Variant::PostedAny, Variant::Unexpected];

    fn name(self) -> &'static str {
        match self {
            Variant::PostedSpecific => "posted-specific",
            Variant::PostedAny => "posted-any",
            Variant::Unexpected => "unexpected",
        }
    }

    fn describe(self) -> &'static str {
        match self {
            Variant::PostedSpecific => "D never-matching receives from the peer stay posted",
            Variant::PostedAny => "D never-matching ANY_SOURCE receives stay posted",
            Variant::Unexpected => "D unreceived messages from the peer wait in the unexpected queue",
        }
    }
}

/// The command line: OSU's options plus the variants and depths to run.
struct Cli {
    o: Options,
    variants: Vec<Variant>,
    depths: Vec<usize>,
}

/// Splits `-v`/`--variant` and `-d`/`--depths` (with their value, attached or not) from the
/// other arguments, which go to [`Options::parse`]. `Ok(None)` asks for the usage text.
fn parse_cli(args: Vec<String>) -> Result<Option<Cli>, String> {
    let mut rest = Vec::new();
    let mut variants = Vec::new();
    let mut depths = Vec::new();
    let mut it = args.into_iter();
    while let Some(a) = it.next() {
        let (flag, inline) = match a.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f.to_string(), Some(v.to_string())),
            _ if a.len() > 2 && (a.starts_with("-v") || a.starts_with("-d")) && !a.starts_with("--") => {
                (a[..2].to_string(), Some(a[2..].to_string()))
            }
            _ => (a.clone(), None),
        };
        let is_variant = flag == "-v" || flag == "--variant";
        if !is_variant && flag != "-d" && flag != "--depths" {
            rest.push(a);
            continue;
        }
        let value = inline.or_else(|| it.next()).ok_or_else(|| format!("{flag} needs a value"))?;
        for item in value.split(',') {
            if is_variant {
                let v = Variant::ALL.into_iter().find(|v| v.name() == item).ok_or_else(|| format!("unknown variant {item:?}"))?;
                if !variants.contains(&v) {
                    variants.push(v);
                }
            } else {
                let d: usize = item.parse().map_err(|_| format!("{item:?} is not a depth"))?;
                if d > MAX_DEPTH {
                    return Err(format!("depth {d} is above {MAX_DEPTH}"));
                }
                depths.push(d);
            }
        }
    }
    let o = match Options::parse(Family::Latency, rest).map_err(|e| e.to_string())? {
        Parsed::Run(o) => o,
        Parsed::Help => return Ok(None),
    };
    if variants.is_empty() {
        variants = Variant::ALL.to_vec();
    } else {
        // Always in the default order, as depth.c prints them.
        variants.sort_by_key(|v| Variant::ALL.iter().position(|x| x == v));
    }
    if depths.is_empty() {
        depths = DEPTHS.to_vec();
    }
    Ok(Some(Cli { o, variants, depths }))
}

fn main() -> ExitCode {
    let rank0 = std::env::var("TMPI_RANK").map_or(true, |r| r.trim() == "0");
    match parse_cli(std::env::args().skip(1).collect()) {
        Ok(Some(cli)) => report(NAME, run(&cli)),
        Ok(None) => {
            if rank0 {
                print!("{}", usage(NAME, Family::Latency, EXTRA_USAGE));
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            if rank0 {
                eprintln!("{NAME}: {e}");
                eprint!("{}", usage(NAME, Family::Latency, EXTRA_USAGE));
            }
            ExitCode::FAILURE
        }
    }
}

/// `iters + skip` ping-pongs of `size` bytes; returns the mean one-way latency in us (rank 0).
fn pingpong(world: &tmpi::Comm, s: &[u8], r: &mut [u8], iters: usize, skip: usize) -> tmpi::Result<f64> {
    let peer = 1 - world.rank();
    let mut total = 0.0;
    for i in 0..iters + skip {
        if world.rank() == 0 {
            let t0 = tmpi::wtime();
            world.send(s, peer, PING)?;
            world.recv(r, peer, PING)?;
            if i >= skip {
                total += tmpi::wtime() - t0;
            }
        } else {
            world.recv(r, peer, PING)?;
            world.send(s, peer, PING)?;
        }
    }
    Ok(total * 1e6 / (2.0 * iters as f64))
}

/// Runs the ping-pong with `depth` posted never-matching receives; checks they were cancelled.
fn with_posted(world: &tmpi::Comm, any: bool, depth: usize, s: &[u8], r: &mut [u8], iters: usize, skip: usize) -> Result<f64, BoxError> {
    let peer = 1 - world.rank();
    let mut dummies = vec![[0u8; 8]; depth];
    let (lat, statuses) = tmpi::scope(|sc| -> tmpi::Result<(f64, Vec<tmpi::Status>)> {
        let mut reqs = Vec::with_capacity(depth);
        for d in dummies.iter_mut() {
            let src = if any { tmpi::ANY_SOURCE } else { tmpi::Source::Rank(peer) };
            reqs.push(world.irecv(sc, &mut d[..], src, NEVER)?);
        }
        world.barrier()?;
        let lat = pingpong(world, s, r, iters, skip)?;
        for req in reqs.iter_mut() {
            req.cancel()?;
        }
        Ok((lat, tmpi::wait_all(reqs)?))
    })?;
    let not_cancelled = statuses.iter().filter(|st| !st.cancelled()).count();
    if not_cancelled > 0 {
        return Err(format!("{not_cancelled} of {depth} never-matching receives were not cancelled").into());
    }
    Ok(lat)
}

/// Runs the ping-pong with `depth` unreceived messages queued at each side; drains them after.
fn with_unexpected(world: &tmpi::Comm, depth: usize, s: &[u8], r: &mut [u8], iters: usize, skip: usize) -> Result<f64, BoxError> {
    let (rank, peer) = (world.rank(), 1 - world.rank());
    // One side sends while the other waits in the barrier, then the other way round, so no
    // two ranks ever block in send against each other.
    for turn in 0..2 {
        if rank == turn {
            for k in 0..depth {
                world.send(&[k as u64], peer, LATER)?;
            }
        }
        world.barrier()?;
    }
    let lat = pingpong(world, s, r, iters, skip)?;
    for k in 0..depth {
        let mut v = [0u64];
        world.recv(&mut v, peer, LATER)?;
        if v[0] != k as u64 {
            return Err(format!("queued message {k} arrived as {} (order broken)", v[0]).into());
        }
    }
    Ok(lat)
}

fn run(cli: &Cli) -> Result<(), BoxError> {
    let o = &cli.o;
    let world = tmpi::init()?;
    let rank = world.rank();
    require(rank, world.size() == 2, "This test requires exactly two processes")?;
    let defaults = Options::defaults(Family::Latency);
    let sizes: Vec<usize> =
        if (o.min_size, o.max_size) == (defaults.min_size, defaults.max_size) { SIZES.to_vec() } else { o.sizes().collect() };
    let max = sizes.iter().copied().max().unwrap_or(0);
    let sbuf = AlignedBuf::alloc(&world, o.buffers, max, b'a')?;
    let mut rbuf = AlignedBuf::alloc(&world, o.buffers, max, b'b')?;
    if rank == 0 {
        println!("{}", preamble("tmpi OSU-style Latency vs Matching-Queue Depth Test"));
    }
    for &variant in &cli.variants {
        if rank == 0 {
            println!("# Variant {}: {}", variant.name(), variant.describe());
            println!("{:<SIZE_WIDTH$}{:<SIZE_WIDTH$}{:>FIELD_WIDTH$}", "# Depth", "Size", "Latency(us)");
        }
        for &depth in &cli.depths {
            for &size in &sizes {
                let (iters, skip) = o.loops(size);
                let s = &sbuf.as_slice()[..size];
                let r = &mut rbuf.as_mut_slice()[..size];
                world.barrier()?;
                let lat = match variant {
                    Variant::PostedSpecific => with_posted(&world, false, depth, s, r, iters, skip)?,
                    Variant::PostedAny => with_posted(&world, true, depth, s, r, iters, skip)?,
                    Variant::Unexpected => with_unexpected(&world, depth, s, r, iters, skip)?,
                };
                if rank == 0 {
                    println!("{depth:<SIZE_WIDTH$}{size:<SIZE_WIDTH$}{lat:>FIELD_WIDTH$.2}");
                }
            }
        }
    }
    world.finalize()?;
    Ok(())
}
