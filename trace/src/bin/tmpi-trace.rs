//! `tmpi-trace`: merge, check and draw tmpi traces, and report profiles, outside `tmpirun`
//! (jobs started by Slurm leave the ranks' files behind; `tmpirun` does the same itself).
//!
//! ```text
//! tmpi-trace merge PATH [--size N]      PATH.rank0, PATH.rank1, ... -> PATH (JSON)
//! tmpi-trace check FILE.json            the rules of Perfetto's JSON importer
//! tmpi-trace timeline FILE.json OUT.png|OUT.svg [--from US --to US] [--width W --height H]
//! tmpi-trace profile PREFIX [--size N] [--svg OUT.svg]
//! tmpi-trace record DIR                 what a record directory holds
//! ```

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use tmpi_trace::merge::{merge, Options};
use tmpi_trace::profile::{RankProfile, Report};
use tmpi_trace::record::Record;
use tmpi_trace::ring::RankTrace;

const USAGE: &str = "usage:
  tmpi-trace merge PATH [--size N]       merge PATH.rank0, PATH.rank1, ... into PATH
  tmpi-trace check FILE.json             check a trace against Perfetto's JSON importer rules
  tmpi-trace timeline FILE.json OUT.png|OUT.svg [--from US] [--to US] [--width W] [--height H]
  tmpi-trace profile PREFIX [--size N] [--svg OUT.svg]
  tmpi-trace record DIR                  summarize a record directory (tmpirun --record DIR)";

fn flag<T: std::str::FromStr>(args: &[String], name: &str) -> Result<Option<T>, String> {
    match args.iter().position(|a| a == name) {
        None => Ok(None),
        Some(i) => args.get(i + 1).and_then(|v| v.parse().ok()).map(Some).ok_or_else(|| format!("{name} needs a value")),
    }
}

/// The ranks' files `PREFIX.rankR` (R from 0 to `size`, or as many as exist in a row).
fn rank_files(prefix: &Path, size: Option<usize>) -> Vec<(usize, PathBuf)> {
    let name = |r: usize| PathBuf::from(format!("{}.rank{r}", prefix.display()));
    match size {
        Some(n) => (0..n).map(|r| (r, name(r))).filter(|(_, p)| p.exists()).collect(),
        None => (0..).map(|r| (r, name(r))).take_while(|(_, p)| p.exists()).collect(),
    }
}

fn cmd_merge(args: &[String]) -> Result<(), String> {
    let path = PathBuf::from(args.first().ok_or(USAGE)?);
    let size: Option<usize> = flag(args, "--size")?;
    let files = rank_files(&path, size);
    if files.is_empty() {
        return Err(format!("no {}.rank0 (nothing to merge)", path.display()));
    }
    let traces = files.iter().map(|(_, p)| RankTrace::read(p).map_err(|e| e.to_string())).collect::<Result<Vec<_>, _>>()?;
    let n = size.unwrap_or_else(|| traces.iter().map(|t| t.info.size as usize).max().unwrap_or(0));
    let (json, s) = merge(&traces, &Options { size: n, ..Default::default() });
    std::fs::write(&path, json).map_err(|e| format!("write {}: {e}", path.display()))?;
    println!("{}: {} ranks, {} events, {} flows, {} events dropped", path.display(), s.ranks, s.events, s.flows, s.dropped);
    if !s.missing.is_empty() {
        println!("no trace from rank {:?}", s.missing);
    }
    Ok(())
}

fn read_checked(path: &str) -> Result<tmpi_trace::check::Checked, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("read {path}: {e}"))?;
    tmpi_trace::check::check(&text).map_err(|errs| format!("{path}:\n  {}", errs.join("\n  ")))
}

fn cmd_check(args: &[String]) -> Result<(), String> {
    let path = args.first().ok_or(USAGE)?;
    let c = read_checked(path)?;
    let spans: usize = c.spans.values().sum();
    println!("{path}: valid; {} processes, {spans} complete events, {} flows", c.processes.len(), c.flows.len());
    Ok(())
}

fn cmd_timeline(args: &[String]) -> Result<(), String> {
    let (input, out) = (args.first().ok_or(USAGE)?, args.get(1).ok_or(USAGE)?);
    let c = read_checked(input)?;
    let window = match (flag::<f64>(args, "--from")?, flag::<f64>(args, "--to")?) {
        (None, None) => None,
        (a, b) => Some((a.unwrap_or(0.0), b.unwrap_or(f64::MAX))),
    };
    let size = (flag(args, "--width")?.unwrap_or(1600), flag(args, "--height")?.unwrap_or(500));
    tmpi_trace::plot::timeline(&c, Path::new(out), window, size).map_err(|e| e.to_string())?;
    println!("{out}");
    Ok(())
}

fn cmd_profile(args: &[String]) -> Result<(), String> {
    let prefix = PathBuf::from(args.first().ok_or(USAGE)?);
    let size: Option<usize> = flag(args, "--size")?;
    let mut profiles = Vec::new();
    for (_, p) in rank_files(&prefix, size) {
        let text = std::fs::read_to_string(&p).map_err(|e| format!("read {}: {e}", p.display()))?;
        profiles.push(RankProfile::parse(&text).map_err(|e| format!("{}: {e}", p.display()))?);
    }
    let n = size.unwrap_or_else(|| profiles.iter().map(|p| p.size as usize).max().unwrap_or(0));
    let report = Report::new(n, profiles);
    print!("{}", report.text());
    if let Some(svg) = flag::<PathBuf>(args, "--svg")? {
        tmpi_trace::plot::traffic_svg(&report, &svg).map_err(|e| e.to_string())?;
        println!("traffic matrix: {}", svg.display());
    }
    Ok(())
}

fn cmd_record(args: &[String]) -> Result<(), String> {
    let dir = PathBuf::from(args.first().ok_or(USAGE)?);
    for r in 0.. {
        let p = tmpi_trace::record::rank_path(&dir, r);
        if !p.exists() {
            if r == 0 {
                return Err(format!("{}: no record of rank 0", dir.display()));
            }
            break;
        }
        let rec = Record::read(&p).map_err(|e| e.to_string())?;
        let state = if rec.finished { "finished" } else { "stopped before finalize" };
        println!("rank {r}: {} decisions in {} bytes ({state})", rec.decisions(), rec.bytes);
    }
    Ok(())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let rest = args.get(1..).unwrap_or(&[]);
    let r = match args.first().map(String::as_str) {
        Some("merge") => cmd_merge(rest),
        Some("check") => cmd_check(rest),
        Some("timeline") => cmd_timeline(rest),
        Some("profile") => cmd_profile(rest),
        Some("record") => cmd_record(rest),
        Some("-h" | "--help") => {
            println!("{USAGE}");
            Ok(())
        }
        _ => Err(USAGE.to_string()),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tmpi-trace: {e}");
            ExitCode::from(2)
        }
    }
}
