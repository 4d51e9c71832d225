//! Parsers of the benchmark programs' output.
//!
//! tmpi's OSU-style binaries and the C peers print the same layout: comment lines starting
//! with `#`, blank lines, and one row per size (`SIZE VALUE [VALUE...]`, the size left-aligned
//! in 10 columns, each value right-aligned in 20 with 2 decimals).

use crate::error::Error;

/// One result row.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    /// Message size in bytes.
    pub size: usize,
    /// The values after the size, in column order.
    pub values: Vec<f64>,
}

/// Parses the rows of an OSU-style output.
///
/// Lines whose first word is not a size (an MPI library's warning on stdout, say) are
/// skipped; a line that starts with a size must be followed by finite, non-negative numbers.
///
/// # Errors
/// [`Error::Parse`] for a malformed row or an output without any row.
pub fn parse_osu(text: &str) -> Result<Vec<Row>, Error> {
    let mut rows: Vec<Row> = Vec::new();
    for (no, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let mut words = line.split_whitespace();
        let Some(Ok(size)) = words.next().map(str::parse::<usize>) else {
            continue;
        };
        let mut values = Vec::new();
        for w in words {
            match w.parse::<f64>() {
                Ok(v) if v.is_finite() && v >= 0.0 => values.push(v),
                _ => return Err(Error::Parse(format!("line {}: {w:?} is not a finite non-negative number in {line:?}", no + 1))),
            }
        }
        if values.is_empty() {
            return Err(Error::Parse(format!("line {}: size {size} without a value", no + 1)));
        }
        if rows.iter().any(|r| r.size == size) {
            return Err(Error::Parse(format!("line {}: size {size} appears twice", no + 1)));
        }
        rows.push(Row { size, values });
    }
    if rows.is_empty() {
        return Err(Error::Parse("no result row in the output".into()));
    }
    Ok(rows)
}

/// The value in `column` of the row of each size in `sizes`, in that order.
///
/// # Errors
/// [`Error::Parse`] when a size has no row or its row lacks that column.
pub fn pick(rows: &[Row], sizes: &[usize], column: usize) -> Result<Vec<(usize, f64)>, Error> {
    sizes
        .iter()
        .map(|&s| {
            let row = rows.iter().find(|r| r.size == s).ok_or_else(|| Error::Parse(format!("no row for size {s}")))?;
            let v = row.values.get(column).ok_or_else(|| Error::Parse(format!("row for size {s} has no value column {column}")))?;
            Ok((s, *v))
        })
        .collect()
}

/// The lone value of an output without a size column (`osu_barrier`, `coll barrier`): the one
/// line that is neither a comment nor blank and holds a single number.
///
/// # Errors
/// [`Error::Parse`] when there is no such line, or more than one.
pub fn parse_single(text: &str) -> Result<f64, Error> {
    let values: Vec<f64> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            match (w.next().map(str::parse::<f64>), w.next()) {
                (Some(Ok(v)), None) if v.is_finite() && v >= 0.0 => Some(v),
                _ => None,
            }
        })
        .collect();
    match values[..] {
        [v] => Ok(v),
        [] => Err(Error::Parse("no result value in the output".into())),
        _ => Err(Error::Parse(format!("{} result values where one was expected", values.len()))),
    }
}

/// The cache-line figure of `bench/c/cacheline.c`: (median, best) nanoseconds per one-way
/// transfer, from its line `ns per one-way transfer: median M, best B`.
///
/// # Errors
/// [`Error::Parse`] when that line is missing or malformed.
pub fn parse_cacheline(text: &str) -> Result<(f64, f64), Error> {
    parse_probe_line(text, "ns per one-way transfer", "cache-line")
}

/// The copy-bandwidth figure of `bench/c/cacheline.c ROUNDS MIB`: (median, best) GB/s through
/// its two-copy pipeline, from its line `pipe copy GB/s (...): median M, best B`.
///
/// # Errors
/// [`Error::Parse`] when that line is missing or malformed.
pub fn parse_pipe(text: &str) -> Result<(f64, f64), Error> {
    parse_probe_line(text, "pipe copy GB/s", "pipe-copy")
}

/// The `median M, best B` pair after the first `:` of the line starting with `prefix`.
fn parse_probe_line(text: &str, prefix: &str, what: &str) -> Result<(f64, f64), Error> {
    let bad = || Error::Parse(format!("no {what} figure in {text:?}"));
    let line = text
        .lines()
        .find_map(|l| l.trim().strip_prefix(prefix).and_then(|rest| rest.split_once(':')).map(|(_, figures)| figures))
        .ok_or_else(bad)?;
    let mut median = None;
    let mut best = None;
    for part in line.split(',') {
        let mut w = part.split_whitespace();
        let (Some(name), Some(v)) = (w.next(), w.next()) else {
            return Err(bad());
        };
        let v: f64 = v.parse().map_err(|_| bad())?;
        if !v.is_finite() || v <= 0.0 {
            return Err(bad());
        }
        match name {
            "median" => median = Some(v),
            "best" => best = Some(v),
            _ => {}
        }
    }
    Ok((median.ok_or_else(bad)?, best.ok_or_else(bad)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    const LAT: &str = "\n# tmpi OSU-style Latency Test\n# Size         Avg Latency(us)\n\
                       1                         0.52\n2                         0.53\n\
                       4096                      1.75\n";

    #[test]
    fn osu_rows_parse_and_comments_are_skipped() {
        let rows = parse_osu(LAT).map_err(|e| e.to_string());
        assert_eq!(
            rows,
            Ok(vec![Row { size: 1, values: vec![0.52] }, Row { size: 2, values: vec![0.53] }, Row { size: 4096, values: vec![1.75] },])
        );
    }

    #[test]
    fn message_rate_rows_have_two_columns_and_noise_lines_are_ignored() {
        let text = "# tmpi OSU-style Multiple Bandwidth / Message Rate Test\n\
                    # [ pairs: 1 ] [ window size: 64 ]\n\
                    # Size                  MB/s          Messages/s\n\
                    [host:123] some warning on stdout\n\
                    8                       40.00          5000000.00\n";
        let rows = parse_osu(text).unwrap_or_default();
        assert_eq!(pick(&rows, &[8], 1).map_err(|e| e.to_string()), Ok(vec![(8, 5_000_000.0)]));
        assert!(pick(&rows, &[8], 2).is_err());
        assert!(pick(&rows, &[16], 0).is_err());
    }

    #[test]
    fn malformed_outputs_are_errors() {
        for bad in ["", "# only a header\n", "8\n", "8    nan\n", "8    -1.0\n", "8    1.0   x\n", "8  1.0\n8  2.0\n"] {
            assert!(parse_osu(bad).is_err(), "{bad:?} should be rejected");
        }
    }

    #[test]
    fn single_values_and_depth_rows_parse() {
        let barrier = "\n# tmpi OSU-style Barrier Latency Test\n# Avg Latency(us)\n             0.78\n";
        assert_eq!(parse_single(barrier).ok(), Some(0.78));
        assert!(parse_single("# nothing\n").is_err());
        assert!(parse_single("1.0\n2.0\n").is_err());
        assert!(parse_single("-1.0\n").is_err());
        let depth = "\n# tmpi OSU-style Latency vs Matching-Queue Depth Test\n\
                     # Variant posted-any: D never-matching ANY_SOURCE receives stay posted\n\
                     # Depth   Size               Latency(us)\n\
                     0         8                         0.17\n\
                     4096      8                         2.90\n";
        let rows = parse_osu(depth).unwrap_or_default();
        assert_eq!(pick(&rows, &[0, 4096], 1).map_err(|e| e.to_string()), Ok(vec![(0, 0.17), (4096, 2.90)]));
    }

    #[test]
    fn cacheline_figure_parses() {
        let text = "# cache-line ping-pong, cores 0 <-> 1, 1000 round trips per run, 5 runs\n\
                    ns per one-way transfer: median 31.4, best 29.9\n";
        assert_eq!(parse_cacheline(text).ok(), Some((31.4, 29.9)));
        assert!(parse_cacheline("ns per one-way transfer: median x, best 1\n").is_err());
        assert!(parse_cacheline("ns per one-way transfer: best 1\n").is_err());
        assert!(parse_cacheline("nothing\n").is_err());
    }

    #[test]
    fn pipe_figure_parses() {
        let text = "# cache-line ping-pong, cores 0 <-> 1, 1000 round trips per run, 5 runs\n\
                    ns per one-way transfer: median 31.4, best 29.9\n\
                    pipe copy GB/s (128 KiB messages, 4 MiB ring, 1024 MiB per run, 5 runs): median 52.1, best 54.8\n";
        assert_eq!(parse_pipe(text).ok(), Some((52.1, 54.8)));
        assert_eq!(parse_cacheline(text).ok(), Some((31.4, 29.9)));
        assert!(parse_pipe("ns per one-way transfer: median 31.4, best 29.9\n").is_err());
        assert!(parse_pipe("pipe copy GB/s (x): median 0, best 1\n").is_err());
        assert!(parse_pipe("pipe copy GB/s median 1, best 1\n").is_err());
    }
}
