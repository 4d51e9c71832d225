//! Shared pieces of the OSU-style benchmark binaries in `src/bin/`.
//!
//! The binaries mirror the OSU Micro-Benchmarks 7.x programs of the same name (`osu_latency`,
//! `osu_bw`, ...) closely enough that their output can be compared column for column with
//! OSU's and with the C peers in `bench/c/`:
//!
//! * the same options: `-m [MIN:]MAX`, `-i ITERS`, `-x WARMUP`, `-W WINDOW`, `-f`, `-h`, and
//!   `-d host|shared` for where the buffers live (OSU's `-d` picks host or device memory;
//!   here `shared` means tmpi's shared heap, [`tmpi::World::alloc_shared`]);
//! * the same defaults per benchmark family ([`Family`]): 10000/100 iterations/warm-up for
//!   latency sizes up to [`LARGE_MESSAGE_SIZE`] and 1000/10 above, 100/10 and 20/2 for
//!   bandwidth, 1000/100 and 100/10 for collectives;
//! * the same layout: a blank line, `# <title>`, a column header with the size left-aligned in
//!   10 characters and each value right-aligned in [`FIELD_WIDTH`] with
//!   [`FLOAT_PRECISION`] decimals.
//!
//! ```
//! use tmpi_bench::{Family, Options, Parsed};
//! let args = ["-m", "8:64", "-i", "5"].map(String::from);
//! let Parsed::Run(o) = Options::parse(Family::Latency, args)? else { unreachable!() };
//! assert_eq!(o.sizes().collect::<Vec<_>>(), vec![8, 16, 32, 64]);
//! assert_eq!(o.loops(64), (5, 100));
//! assert_eq!(tmpi_bench::row(8, 1.5), "8                         1.50");
//! # Ok::<(), tmpi_bench::UsageError>(())
//! ```

use std::fmt;
use std::process::ExitCode;

/// Width of every value column (OSU `FIELD_WIDTH`).
pub const FIELD_WIDTH: usize = 20;
/// Width of the size column (OSU prints sizes with `%-10d`).
pub const SIZE_WIDTH: usize = 10;
/// Decimals of every value (OSU `FLOAT_PRECISION`).
pub const FLOAT_PRECISION: usize = 2;
/// Sizes above this use the "large" iteration and warm-up counts (OSU `LARGE_MESSAGE_SIZE`).
pub const LARGE_MESSAGE_SIZE: usize = 8192;
/// Default largest size of the point-to-point benchmarks (OSU `MAX_MESSAGE_SIZE`, 4 MiB).
pub const MAX_MESSAGE_SIZE: usize = 1 << 22;
/// Default largest size of the collective benchmarks (OSU `MAX_MSG_SIZE_COLL`, 1 MiB).
pub const MAX_MSG_SIZE_COLL: usize = 1 << 20;
/// Default window of the bandwidth benchmarks (OSU `WINDOW_SIZE_LARGE`).
pub const WINDOW_SIZE: usize = 64;
/// Alignment of every benchmark buffer (one page, as OSU's `posix_memalign(getpagesize())`).
pub const PAGE: usize = 4096;

/// The benchmark family; it decides the default options, as in OSU's `process_options`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// Point-to-point latency: sizes 0..=4 MiB, 10000/100 then 1000/10 iterations/warm-up.
    Latency,
    /// Bandwidth and message rate: sizes 1..=4 MiB, 100/10 then 20/2, window 64.
    Bandwidth,
    /// Collectives: sizes 1..=1 MiB, 1000/100 then 100/10.
    Collective,
}

/// Options shared by all benchmarks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    /// Smallest message size in bytes (0 is allowed only where the family starts at 0).
    pub min_size: usize,
    /// Largest message size in bytes.
    pub max_size: usize,
    /// Timed iterations for sizes up to [`LARGE_MESSAGE_SIZE`].
    pub iterations: usize,
    /// Warm-up iterations for sizes up to [`LARGE_MESSAGE_SIZE`].
    pub skip: usize,
    /// Timed iterations for larger sizes.
    pub iterations_large: usize,
    /// Warm-up iterations for larger sizes.
    pub skip_large: usize,
    /// Messages in flight per iteration of the bandwidth benchmarks.
    pub window: usize,
    /// Print minimum/maximum latency and the iteration count too (`-f`, collectives only).
    pub full: bool,
    /// Where the message buffers live (`-d`).
    pub buffers: Placement,
}

/// Where a benchmark's message buffers live (`-d`, after OSU's buffer placement option).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Placement {
    /// Ordinary process memory (`-d host`, the default).
    #[default]
    Host,
    /// tmpi's shared heap (`-d shared`): peers copy from and into it with one memcpy.
    Shared,
}

/// What the command line asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Parsed {
    /// Run with these options.
    Run(Options),
    /// Print the usage text and exit successfully.
    Help,
}

/// A command line that cannot be understood.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsageError(pub String);

impl fmt::Display for UsageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UsageError {}

impl Options {
    /// The OSU defaults of `family`.
    pub fn defaults(family: Family) -> Self {
        match family {
            Family::Latency => Options {
                min_size: 0,
                max_size: MAX_MESSAGE_SIZE,
                iterations: 10_000,
                skip: 100,
                iterations_large: 1000,
                skip_large: 10,
                window: WINDOW_SIZE,
                full: false,
                buffers: Placement::Host,
            },
            Family::Bandwidth => Options {
                min_size: 1,
                max_size: MAX_MESSAGE_SIZE,
                iterations: 100,
                skip: 10,
                iterations_large: 20,
                skip_large: 2,
                window: WINDOW_SIZE,
                full: false,
                buffers: Placement::Host,
            },
            Family::Collective => Options {
                min_size: 1,
                max_size: MAX_MSG_SIZE_COLL,
                iterations: 1000,
                skip: 100,
                iterations_large: 100,
                skip_large: 10,
                window: WINDOW_SIZE,
                full: false,
                buffers: Placement::Host,
            },
        }
    }

    /// Parses OSU-style options (program name excluded).
    ///
    /// `-m MAX` sets the largest size, `-m MIN:MAX` both, `-m MIN:` only the smallest;
    /// `-i N` sets both iteration counts, `-x N` both warm-up counts, `-W N` the window,
    /// `-f` full statistics, `-h`/`--help` asks for the usage text.
    ///
    /// # Errors
    /// [`UsageError`] for an unknown option, a missing or malformed value, `MIN > MAX`,
    /// zero iterations or a zero window.
    pub fn parse<I>(family: Family, args: I) -> Result<Parsed, UsageError>
    where
        I: IntoIterator<Item = String>,
    {
        let mut o = Options::defaults(family);
        let mut it = args.into_iter();
        while let Some(arg) = it.next() {
            let (flag, inline) = split_flag(&arg)?;
            let mut value = |name: &str| -> Result<String, UsageError> {
                match inline.clone() {
                    Some(v) => Ok(v),
                    None => it.next().ok_or_else(|| UsageError(format!("option {name} needs a value"))),
                }
            };
            match flag.as_str() {
                "-h" | "--help" => return Ok(Parsed::Help),
                "-f" | "--full" => o.full = true,
                "-d" | "--buffers" => {
                    o.buffers = match value("-d")?.as_str() {
                        "host" | "cpu" => Placement::Host,
                        "shared" => Placement::Shared,
                        v => return Err(UsageError(format!("-d: {v:?} is not host or shared"))),
                    }
                }
                "-m" | "--message-size" => {
                    let v = value("-m")?;
                    set_sizes(&mut o, &v)?;
                }
                "-i" | "--iterations" => {
                    let n = parse_num(&value("-i")?, "-i")?;
                    if n == 0 {
                        return Err(UsageError("-i: iterations must be at least 1".into()));
                    }
                    o.iterations = n;
                    o.iterations_large = n;
                }
                "-x" | "--warmup" => {
                    let n = parse_num(&value("-x")?, "-x")?;
                    o.skip = n;
                    o.skip_large = n;
                }
                "-W" | "--window-size" => {
                    let n = parse_num(&value("-W")?, "-W")?;
                    if n == 0 {
                        return Err(UsageError("-W: window must be at least 1".into()));
                    }
                    o.window = n;
                }
                _ => return Err(UsageError(format!("unknown option {arg:?}"))),
            }
        }
        if o.min_size > o.max_size {
            return Err(UsageError(format!("-m: smallest size {} is above largest size {}", o.min_size, o.max_size)));
        }
        Ok(Parsed::Run(o))
    }

    /// (timed iterations, warm-up iterations) for messages of `size` bytes.
    pub fn loops(&self, size: usize) -> (usize, usize) {
        if size > LARGE_MESSAGE_SIZE {
            (self.iterations_large, self.skip_large)
        } else {
            (self.iterations, self.skip)
        }
    }

    /// The sizes to run, OSU style: `min`, then doubling (0 is followed by 1) up to `max`.
    pub fn sizes(&self) -> impl Iterator<Item = usize> {
        let max = self.max_size;
        std::iter::successors(Some(self.min_size), |&s| if s == 0 { Some(1) } else { s.checked_mul(2) }).take_while(move |&s| s <= max)
    }
}

/// Splits `--flag=value` and `-mVALUE` forms; plain flags come back with no inline value.
fn split_flag(arg: &str) -> Result<(String, Option<String>), UsageError> {
    if let Some(rest) = arg.strip_prefix("--") {
        return Ok(match rest.split_once('=') {
            Some((f, v)) => (format!("--{f}"), Some(v.to_string())),
            None => (arg.to_string(), None),
        });
    }
    let mut chars = arg.chars();
    match (chars.next(), chars.next()) {
        (Some('-'), Some(c)) => {
            let rest: String = chars.collect();
            Ok((format!("-{c}"), (!rest.is_empty()).then_some(rest)))
        }
        _ => Err(UsageError(format!("unexpected argument {arg:?}"))),
    }
}

fn parse_num(v: &str, flag: &str) -> Result<usize, UsageError> {
    v.trim().parse::<usize>().map_err(|_| UsageError(format!("{flag}: {v:?} is not a non-negative integer")))
}

fn set_sizes(o: &mut Options, v: &str) -> Result<(), UsageError> {
    match v.split_once(':') {
        None => o.max_size = parse_num(v, "-m")?,
        Some((lo, hi)) => {
            if lo.is_empty() && hi.is_empty() {
                return Err(UsageError("-m: expected MAX, MIN:MAX, MIN: or :MAX".into()));
            }
            if !lo.is_empty() {
                o.min_size = parse_num(lo, "-m")?;
            }
            if !hi.is_empty() {
                o.max_size = parse_num(hi, "-m")?;
            }
        }
    }
    Ok(())
}

/// The usage text of benchmark `name` (`extra` documents its own options, if any).
pub fn usage(name: &str, family: Family, extra: &str) -> String {
    let d = Options::defaults(family);
    let mut s = format!(
        "Usage: tmpirun -n N {name} [options]\n\
         Options:\n\
         \x20 -m, --message-size [MIN:]MAX  sizes to run, in bytes (default {}:{})\n\
         \x20 -i, --iterations N            timed iterations (default {} for sizes <= {}, {} above)\n\
         \x20 -x, --warmup N                warm-up iterations (default {}, {} above)\n\
         \x20 -d, --buffers host|shared     message buffers in process memory or tmpi's shared heap (default host)\n",
        d.min_size, d.max_size, d.iterations, LARGE_MESSAGE_SIZE, d.iterations_large, d.skip, d.skip_large
    );
    if family == Family::Bandwidth {
        s.push_str(&format!("  -W, --window-size N           messages in flight (default {})\n", d.window));
    }
    if family == Family::Collective {
        s.push_str("  -f, --full                    print min/max latency and iterations too\n");
    }
    s.push_str(extra);
    s.push_str("  -h, --help                    print this text\n");
    s
}

/// The preamble OSU prints before the column header: a blank line, then `# <title>`.
pub fn preamble(title: &str) -> String {
    format!("\n# {title}")
}

/// A column header: `# Size` in the size column, then each title right-aligned.
pub fn header(columns: &[&str]) -> String {
    let mut s = format!("{:<SIZE_WIDTH$}", "# Size");
    for c in columns {
        s.push_str(&format!("{c:>FIELD_WIDTH$}"));
    }
    s
}

/// One result row: the size, then one value.
pub fn row(size: usize, value: f64) -> String {
    rows(size, &[value])
}

/// One result row: the size, then each value.
pub fn rows(size: usize, values: &[f64]) -> String {
    let mut s = format!("{size:<SIZE_WIDTH$}");
    for v in values {
        s.push_str(&format!("{v:>FIELD_WIDTH$.FLOAT_PRECISION$}"));
    }
    s
}

/// The collective header (OSU `print_only_header` for collectives), with `-f` columns.
pub fn coll_header(with_size: bool, full: bool) -> String {
    let mut s = if with_size { header(&["Avg Latency(us)"]) } else { "# Avg Latency(us)".to_string() };
    if full {
        s.push_str(&format!("{:>FIELD_WIDTH$}{:>FIELD_WIDTH$}{:>12}", "Min Latency(us)", "Max Latency(us)", "Iterations"));
    }
    s
}

/// A collective result row (OSU `print_stats`): without a size the average takes 17 columns.
pub fn coll_row(size: Option<usize>, avg: f64, min: f64, max: f64, iterations: Option<usize>) -> String {
    let mut s = match size {
        Some(size) => row(size, avg),
        None => format!("{avg:>17.FLOAT_PRECISION$}"),
    };
    if let Some(it) = iterations {
        s.push_str(&format!("{min:>FIELD_WIDTH$.FLOAT_PRECISION$}{max:>FIELD_WIDTH$.FLOAT_PRECISION$}{it:>12}"));
    }
    s
}

/// One page of zeroes; a `Vec<Page>` is a page-aligned byte buffer without `unsafe`.
#[derive(Clone, Copy)]
#[repr(C, align(4096))]
struct Page([u8; PAGE]);

// SAFETY: `Page` is `repr(C)`, contains only `u8`s, and is exactly `PAGE` bytes with alignment
// `PAGE`, so it has no padding; every bit pattern is a valid value, all zeroes included.
unsafe impl bytemuck::Zeroable for Page {}
// SAFETY: as above: no padding, no invalid bit patterns, `Copy` and `'static`.
unsafe impl bytemuck::Pod for Page {}

const _: () = assert!(std::mem::size_of::<Page>() == PAGE && std::mem::align_of::<Page>() == PAGE);

/// A page-aligned byte buffer, as OSU allocates with `posix_memalign(getpagesize())`, in
/// process memory or in tmpi's shared heap.
pub struct AlignedBuf {
    pages: Pages,
    len: usize,
}

enum Pages {
    Host(Vec<Page>),
    Shared(tmpi::SharedBuf<Page>),
}

impl fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AlignedBuf").field("len", &self.len).finish()
    }
}

impl AlignedBuf {
    /// `len` bytes, page-aligned, every byte set to `fill` (this touches every page, as
    /// OSU's `set_buffer_pt2pt` does, so no page fault lands inside a timed loop).
    pub fn new(len: usize, fill: u8) -> Self {
        let mut b = AlignedBuf { pages: Pages::Host(vec![Page([0; PAGE]); len.div_ceil(PAGE).max(1)]), len };
        b.fill(fill);
        b
    }

    /// `len` bytes placed as `placement` says, every byte set to `fill`.
    ///
    /// # Errors
    /// The shared heap refused the size (see [`tmpi::World::alloc_shared`]).
    pub fn alloc(world: &tmpi::World, placement: Placement, len: usize, fill: u8) -> tmpi::Result<Self> {
        if placement == Placement::Host {
            return Ok(Self::new(len, fill));
        }
        let mut b = AlignedBuf { pages: Pages::Shared(world.alloc_shared::<Page>(len.div_ceil(PAGE).max(1))?), len };
        if !b.is_shared() && world.rank() == 0 {
            eprintln!("# note: a {len}-byte buffer did not fit in the shared heap (TMPI_SHARED_HEAP) and is in process memory");
        }
        b.fill(fill);
        Ok(b)
    }

    /// Whether the buffer lives in the shared heap.
    pub fn is_shared(&self) -> bool {
        matches!(&self.pages, Pages::Shared(p) if p.is_shared())
    }

    fn pages(&self) -> &[Page] {
        match &self.pages {
            Pages::Host(v) => v,
            Pages::Shared(b) => b,
        }
    }

    fn pages_mut(&mut self) -> &mut [Page] {
        match &mut self.pages {
            Pages::Host(v) => v,
            Pages::Shared(b) => b,
        }
    }

    /// Sets the first `len` bytes to `v` (or all of them when `len` is larger).
    pub fn fill_prefix(&mut self, len: usize, v: u8) {
        let n = len.min(self.len);
        self.as_mut_slice()[..n].fill(v);
    }

    /// Sets every byte to `v`.
    pub fn fill(&mut self, v: u8) {
        self.as_mut_slice().fill(v);
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        &bytemuck::cast_slice::<Page, u8>(self.pages())[..self.len]
    }

    /// The bytes, mutably.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        let len = self.len;
        &mut bytemuck::cast_slice_mut::<Page, u8>(self.pages_mut())[..len]
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// Byte distance between consecutive receive slots of `size` bytes in a window buffer: the
/// size rounded up to a cache line (OSU's `MESSAGE_ALIGNMENT`), never 0.
pub fn slot_stride(size: usize) -> usize {
    size.div_ceil(64).max(1) * 64
}

/// Splits the first `window * slot_stride(size)` bytes of `buf` into `window` disjoint
/// receive slots of `size` bytes each.
///
/// # Errors
/// [`UsageError`] when `buf` is too small.
pub fn window_slots(buf: &mut [u8], size: usize, window: usize) -> Result<Vec<&mut [u8]>, UsageError> {
    let stride = slot_stride(size);
    let need = stride.checked_mul(window).ok_or_else(|| UsageError("window buffer size overflows".into()))?;
    if buf.len() < need {
        return Err(UsageError(format!("window buffer of {} bytes is smaller than {need}", buf.len())));
    }
    Ok(buf[..need].chunks_mut(stride).map(|c| &mut c[..size]).collect())
}

/// Parses the options of benchmark `name` from the process arguments.
///
/// Returns `Err(code)` when the program should exit at once: after `-h` (success) or a bad
/// command line (failure). Only rank 0 (by `TMPI_RANK`, absent = 0) prints, as OSU does.
pub fn options_or_exit(name: &str, family: Family, extra_usage: &str) -> Result<Options, ExitCode> {
    let rank0 = std::env::var("TMPI_RANK").map_or(true, |r| r.trim() == "0");
    match Options::parse(family, std::env::args().skip(1)) {
        Ok(Parsed::Run(o)) => Ok(o),
        Ok(Parsed::Help) => {
            if rank0 {
                print!("{}", usage(name, family, extra_usage));
            }
            Err(ExitCode::SUCCESS)
        }
        Err(e) => {
            if rank0 {
                eprintln!("{name}: {e}");
                eprint!("{}", usage(name, family, extra_usage));
            }
            Err(ExitCode::FAILURE)
        }
    }
}

/// An error that rank 0 has already explained on stderr; [`report`] exits non-zero without
/// printing it again on every rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reported;

impl fmt::Display for Reported {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("reported by rank 0")
    }
}

impl std::error::Error for Reported {}

/// The error type of the benchmark bodies.
pub type BoxError = Box<dyn std::error::Error>;

/// Fails with [`Reported`] unless `ok`; rank 0 prints `msg` on stderr first (as OSU prints
/// "This test requires exactly two processes").
///
/// # Errors
/// [`Reported`] when `ok` is false.
pub fn require(rank: usize, ok: bool, msg: &str) -> Result<(), BoxError> {
    if ok {
        return Ok(());
    }
    if rank == 0 {
        eprintln!("{msg}");
    }
    Err(Box::new(Reported))
}

/// Runs a benchmark body and turns its error into a message on stderr and a failing exit.
pub fn report(name: &str, r: Result<(), BoxError>) -> ExitCode {
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.is::<Reported>() => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("{name}: error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Average, minimum and maximum of every rank's `value` (OSU's three `MPI_Reduce` calls),
/// meaningful at rank 0 only (other ranks get their own value three times).
///
/// # Errors
/// Whatever the reductions fail with.
pub fn reduce_stats(comm: &tmpi::Comm, value: f64) -> tmpi::Result<(f64, f64, f64)> {
    let root = comm.rank() == 0;
    let (mut sum, mut min, mut max) = ([value], [value], [value]);
    comm.reduce(&[value], root.then_some(&mut min[..]), tmpi::Op::Min, 0)?;
    comm.reduce(&[value], root.then_some(&mut max[..]), tmpi::Op::Max, 0)?;
    comm.reduce(&[value], root.then_some(&mut sum[..]), tmpi::Op::Sum, 0)?;
    Ok((sum[0] / comm.size() as f64, min[0], max[0]))
}

/// The arguments of the single-thread cost measurements (`comm_window_cost`, `window_cost`,
/// `pingpong_cost`): `--rounds N` (default `default_rounds`; more than the `warm` rounds not
/// counted) and the positional arguments, returned as they are.
///
/// ```
/// let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
/// assert_eq!(tmpi_bench::cost_args(args(&["8", "--rounds", "700"]), 6000, 500), Ok((700, args(&["8"]))));
/// assert_eq!(tmpi_bench::cost_args(args(&[]), 6000, 500), Ok((6000, vec![])));
/// assert!(tmpi_bench::cost_args(args(&["--rounds", "400"]), 6000, 500).is_err());
/// assert!(tmpi_bench::cost_args(args(&["--rounds"]), 6000, 500).is_err());
/// ```
///
/// # Errors
/// A message for a missing or bad number, or too few rounds.
pub fn cost_args<I: IntoIterator<Item = String>>(args: I, default_rounds: usize, warm: usize) -> Result<(usize, Vec<String>), String> {
    let mut it = args.into_iter();
    let (mut rounds, mut rest) = (default_rounds, Vec::new());
    while let Some(x) = it.next() {
        if x == "--rounds" {
            let v = it.next().ok_or("--rounds needs a number")?;
            rounds = v.parse().map_err(|_| format!("--rounds {v:?}: not a number"))?;
        } else {
            rest.push(x);
        }
    }
    if rounds <= warm {
        return Err(format!("--rounds must exceed the {warm} warm-up rounds"));
    }
    Ok((rounds, rest))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(f: Family, a: &[&str]) -> Result<Parsed, UsageError> {
        Options::parse(f, a.iter().map(|s| s.to_string()))
    }

    fn run(f: Family, a: &[&str]) -> Options {
        match parse(f, a) {
            Ok(Parsed::Run(o)) => o,
            other => panic!("expected options, got {other:?}"),
        }
    }

    #[test]
    fn defaults_follow_osu() {
        let l = run(Family::Latency, &[]);
        assert_eq!((l.min_size, l.max_size, l.loops(8192), l.loops(8193)), (0, 1 << 22, (10000, 100), (1000, 10)));
        let b = run(Family::Bandwidth, &[]);
        assert_eq!((b.min_size, b.window, b.loops(1), b.loops(1 << 20)), (1, 64, (100, 10), (20, 2)));
        let c = run(Family::Collective, &[]);
        assert_eq!((c.max_size, c.loops(4), c.loops(16384)), (1 << 20, (1000, 100), (100, 10)));
    }

    #[test]
    fn sizes_double_and_zero_is_followed_by_one() {
        let l = run(Family::Latency, &["-m", "0:8"]);
        assert_eq!(l.sizes().collect::<Vec<_>>(), vec![0, 1, 2, 4, 8]);
        let l = run(Family::Latency, &["-m", "3:20"]);
        assert_eq!(l.sizes().collect::<Vec<_>>(), vec![3, 6, 12]);
        let l = run(Family::Latency, &["-m", "16"]);
        assert_eq!(l.sizes().last(), Some(16));
        let l = run(Family::Latency, &["-m", "1024:"]);
        assert_eq!((l.min_size, l.max_size), (1024, MAX_MESSAGE_SIZE));
        let l = run(Family::Latency, &["-m:64"]);
        assert_eq!((l.min_size, l.max_size), (0, 64));
    }

    #[test]
    fn options_set_both_small_and_large_counts() {
        let o = run(Family::Bandwidth, &["-i", "7", "-x3", "-W", "16", "-f"]);
        assert_eq!((o.loops(1), o.loops(1 << 20), o.window, o.full), ((7, 3), (7, 3), 16, true));
        let o = run(Family::Bandwidth, &["--iterations=9", "--window-size", "2"]);
        assert_eq!((o.iterations, o.window), (9, 2));
    }

    #[test]
    fn bad_command_lines_are_errors() {
        for bad in
            [&["-i"][..], &["-i", "0"], &["-i", "x"], &["-W", "0"], &["-m", "64:8"], &["-m", ":"], &["-q"], &["stray"], &["-x", "-1"]]
        {
            assert!(parse(Family::Latency, bad).is_err(), "{bad:?} should be rejected");
        }
        assert_eq!(parse(Family::Latency, &["-h"]), Ok(Parsed::Help));
    }

    #[test]
    fn layout_matches_osu_printf() {
        // printf("%-*s%*s", 10, "# Size", 20, "Avg Latency(us)")
        assert_eq!(header(&["Avg Latency(us)"]), "# Size         Avg Latency(us)");
        // printf("%-*d%*.*f", 10, 4096, 20, 2, 12.345)
        assert_eq!(row(4096, 12.345), "4096                     12.35");
        assert_eq!(rows(8, &[1.0, 2.5]), format!("{:<10}{:>20}{:>20}", 8, "1.00", "2.50"));
        assert_eq!(coll_row(None, 3.1234, 0.0, 0.0, None), "             3.12");
        assert_eq!(coll_header(false, false), "# Avg Latency(us)");
        assert_eq!(coll_row(Some(4), 1.0, 0.5, 2.0, Some(10)).len(), 10 + 20 * 3 + 12);
        assert_eq!(preamble("x"), "\n# x");
    }

    #[test]
    fn buffers_are_page_aligned_filled_and_sliced() {
        let mut b = AlignedBuf::new(10_000, b'a');
        assert_eq!(b.as_slice().as_ptr() as usize % PAGE, 0);
        assert_eq!(b.len(), 10_000);
        assert!(b.as_slice().iter().all(|&x| x == b'a'));
        b.fill_prefix(3, b'b');
        assert_eq!(&b.as_slice()[..4], b"bbba");
        assert!(AlignedBuf::new(0, 0).is_empty());
        let mut w = AlignedBuf::new(4 * 128, 0);
        let slots = window_slots(w.as_mut_slice(), 65, 4).map_err(|e| e.0).unwrap_or_default();
        assert_eq!(slots.len(), 4);
        assert!(slots.iter().all(|s| s.len() == 65));
        assert!(window_slots(w.as_mut_slice(), 65, 5).is_err());
        assert_eq!((slot_stride(0), slot_stride(1), slot_stride(64), slot_stride(65)), (64, 64, 64, 128));
    }
}
