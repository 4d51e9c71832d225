//! Seeing a job (`--trace`, `--profile`, `--record`, `--replay`): what tmpirun tells the ranks
//! before the job ([`Seeing::prepare`]) and does with what they leave after it
//! ([`Seeing::finish`]). The ranks' side is the runtime's `seen` module; the formats are
//! `tmpi-trace`'s.
//!
//! Files go where every rank can reach them by the same path (a shared file system when
//! ranks run on several hosts, as the program itself must be): the trace's ring files beside
//! the trace (`PATH.rankR`), the profiles in a directory of the current one
//! (`.tmpi-profile-<pid>`, removed after), the records in the record directory.

use std::path::{Path, PathBuf};

use tmpi_trace::merge::{merge, Options};
use tmpi_trace::profile::{RankProfile, Report};
use tmpi_trace::record::{rank_path, Record};
use tmpi_trace::ring::RankTrace;

use crate::cli::Cli;
use crate::error::{Error, Result};
use crate::output;

/// The profile's report, written in the current directory (with `TMPI_PROFILE=DIR`, in DIR).
pub const PROFILE_TEXT: &str = "tmpi-profile.txt";
/// The traffic matrix as an SVG heat map.
pub const PROFILE_SVG: &str = "tmpi-profile.svg";

/// What this job sees.
#[derive(Debug, Default)]
pub struct Seeing {
    np: usize,
    trace: Option<PathBuf>,
    profile: Option<PathBuf>,
    /// The profile directory was made by tmpirun (and is removed after).
    own_profile_dir: bool,
    record: Option<PathBuf>,
    replay: Option<PathBuf>,
}

fn say(msg: &str) {
    output::write_own(&format!("tmpirun: {msg}\n"));
}

fn absolute(p: &Path) -> Result<PathBuf> {
    if p.is_absolute() {
        return Ok(p.to_path_buf());
    }
    Ok(std::env::current_dir().map_err(|e| Error::io("current directory", e))?.join(p))
}

/// A flag's value, else the knob's from tmpirun's environment (unless it says off).
fn flag_or_env(flag: Option<&PathBuf>, var: &str) -> Option<PathBuf> {
    flag.cloned()
        .or_else(|| std::env::var_os(var).filter(|v| !matches!(v.to_str(), Some("" | "0" | "off" | "no" | "false"))).map(PathBuf::from))
}

fn set(var: &str, value: &Path) {
    // tmpirun has no other thread yet: nothing reads the environment meanwhile.
    std::env::set_var(var, value);
}

impl Seeing {
    /// Checks the flags (and the `TMPI_TRACE`, `TMPI_PROFILE`, `TMPI_RECORD`, `TMPI_REPLAY` of
    /// tmpirun's environment, which mean the same), prepares their files and sets the ranks'
    /// knobs.
    ///
    /// # Errors
    /// [`Error::Usage`] for a trace path not ending in `.json`, a replay directory without a
    /// record of every rank of a job of this size, or both record and replay.
    pub fn prepare(cli: &Cli, np: usize) -> Result<Self> {
        let mut s = Seeing { np, ..Default::default() };
        if let Some(p) = flag_or_env(cli.trace.as_ref(), "TMPI_TRACE") {
            s.trace = Some(s.prepare_trace(&p)?);
        }
        if cli.profile || std::env::var("TMPI_PROFILE").is_ok_and(|v| matches!(v.as_str(), "1" | "on" | "yes" | "true")) {
            s.prepare_profile()?;
        } else if let Some(d) = flag_or_env(None, "TMPI_PROFILE") {
            s.profile = Some(absolute(&d)?);
        }
        let record = flag_or_env(cli.record.as_ref(), "TMPI_RECORD");
        let replay = flag_or_env(cli.replay.as_ref(), "TMPI_REPLAY");
        if record.is_some() && replay.is_some() {
            return Err(Error::Usage("--record and --replay (or TMPI_RECORD and TMPI_REPLAY) cannot be used together".into()));
        }
        if let Some(d) = record {
            s.record = Some(s.prepare_record(&d)?);
        }
        if let Some(d) = replay {
            s.replay = Some(s.prepare_replay(&d)?);
        }
        Ok(s)
    }

    fn prepare_trace(&self, p: &Path) -> Result<PathBuf> {
        if p.extension().and_then(|e| e.to_str()) != Some("json") {
            return Err(Error::Usage(format!("--trace {}: the trace's path must end in .json", p.display())));
        }
        let p = absolute(p)?;
        if !p.parent().is_some_and(Path::is_dir) {
            return Err(Error::Usage(format!("--trace {}: no such directory", p.display())));
        }
        for r in 0..self.np {
            let _ = std::fs::remove_file(ring_path(&p, r));
        }
        set("TMPI_TRACE", &p);
        Ok(p)
    }

    fn prepare_profile(&mut self) -> Result<()> {
        let dir = absolute(Path::new(&format!(".tmpi-profile-{}", std::process::id())))?;
        std::fs::create_dir_all(&dir).map_err(|e| Error::io(format!("--profile: create {}", dir.display()), e))?;
        set("TMPI_PROFILE", &dir);
        self.profile = Some(dir);
        self.own_profile_dir = true;
        Ok(())
    }

    fn prepare_record(&self, d: &Path) -> Result<PathBuf> {
        let d = absolute(d)?;
        std::fs::create_dir_all(&d).map_err(|e| Error::io(format!("--record: create {}", d.display()), e))?;
        let replaced = remove_records(&d);
        if replaced > 0 {
            say(&format!("--record: replacing the record of {replaced} rank(s) in {}", d.display()));
        }
        set("TMPI_RECORD", &d);
        Ok(d)
    }

    fn prepare_replay(&self, d: &Path) -> Result<PathBuf> {
        let d = absolute(d)?;
        for r in 0..self.np {
            let rec = Record::read(&rank_path(&d, r)).map_err(|e| Error::Usage(format!("--replay {}: {e}", d.display())))?;
            if rec.size as usize != self.np {
                return Err(Error::Usage(format!(
                    "--replay {}: the record is of a job of {} ranks, this one has {}",
                    d.display(),
                    rec.size,
                    self.np
                )));
            }
        }
        set("TMPI_REPLAY", &d);
        Ok(d)
    }

    /// After the job: merges the trace, reports the profile, sums up the record.
    pub fn finish(&self) {
        if let Some(p) = &self.trace {
            self.finish_trace(p);
        }
        if let Some(d) = &self.profile {
            self.finish_profile(d);
        }
        if let Some(d) = &self.record {
            self.finish_record(d);
        }
    }

    fn finish_trace(&self, path: &Path) {
        let mut traces = Vec::new();
        for r in 0..self.np {
            let f = ring_path(path, r);
            match RankTrace::read(&f) {
                Ok(t) => traces.push(t),
                Err(e) if f.exists() => say(&format!("--trace: rank {r}: {e}")),
                Err(_) => {}
            }
        }
        if traces.is_empty() {
            return say(&format!(
                "--trace: no rank left a trace beside {} (is the program a tmpi program, and could it write there?)",
                path.display()
            ));
        }
        let (json, sum) = merge(
            &traces,
            &Options { size: self.np, reference_boot_id: Some(tmpi_trace::clock::boot_id()), end_ns: Some(tmpi_trace::clock::now_ns()) },
        );
        if let Err(e) = std::fs::write(path, json) {
            return say(&format!("--trace: cannot write {}: {e} (the ranks' files stay beside it)", path.display()));
        }
        for r in 0..self.np {
            let _ = std::fs::remove_file(ring_path(path, r));
        }
        let mut msg = format!(
            "trace of {} ranks in {} ({} events, {} messages joined to their receives",
            sum.ranks,
            path.display(),
            sum.events,
            sum.flows
        );
        if sum.dropped > 0 {
            msg.push_str(&format!(", {} events dropped: the oldest, see TMPI_TRACE_EVENTS", sum.dropped));
        }
        if !sum.missing.is_empty() {
            msg.push_str(&format!("; no trace from rank {}", join(&sum.missing)));
        }
        let cut: Vec<u32> = traces.iter().filter(|t| !t.sealed).map(|t| t.info.rank).collect();
        if !cut.is_empty() {
            msg.push_str(&format!("; rank {} stopped before finalize: its trace ends there", join(&cut)));
        }
        if !sum.unaligned_hosts.is_empty() {
            msg.push_str(&format!("; clocks of {} not aligned", sum.unaligned_hosts.join(", ")));
        }
        say(&format!("{msg})"));
    }

    fn finish_profile(&self, dir: &Path) {
        let mut profiles = Vec::new();
        for r in 0..self.np {
            let f = dir.join(format!("tmpi-profile.rank{r}"));
            match std::fs::read_to_string(&f).map_err(|e| e.to_string()).and_then(|t| RankProfile::parse(&t).map_err(|e| e.to_string())) {
                Ok(p) => profiles.push(p),
                Err(e) if f.exists() => say(&format!("--profile: rank {r}: {e}")),
                Err(_) => {}
            }
            if self.own_profile_dir {
                let _ = std::fs::remove_file(&f);
            }
        }
        if self.own_profile_dir {
            let _ = std::fs::remove_dir(dir);
        }
        let report = Report::new(self.np, profiles);
        let mut text = report.text();
        // Beside the ranks' files when the user chose their directory, else here.
        let out = if self.own_profile_dir { PathBuf::new() } else { dir.to_path_buf() };
        let (svg, txt) = (out.join(PROFILE_SVG), out.join(PROFILE_TEXT));
        match tmpi_trace::plot::traffic_svg(&report, &svg) {
            Ok(()) => text.push_str(&format!("\ntraffic matrix: {}; this report: {}\n", svg.display(), txt.display())),
            Err(e) => text.push_str(&format!("\ntraffic matrix: not drawn ({e})\n")),
        }
        if let Err(e) = std::fs::write(&txt, &text) {
            text.push_str(&format!("(cannot write {}: {e})\n", txt.display()));
        }
        output::write_own(&text);
    }

    fn finish_record(&self, dir: &Path) {
        let (mut decisions, mut bytes, mut cut) = (0u64, 0u64, Vec::new());
        for r in 0..self.np {
            match Record::read(&rank_path(dir, r)) {
                Ok(rec) => {
                    decisions += rec.decisions();
                    bytes += rec.bytes;
                    if !rec.finished {
                        cut.push(r as u32);
                    }
                }
                Err(_) => cut.push(r as u32),
            }
        }
        let mut msg = format!("recorded {decisions} decisions of {} ranks in {} ({bytes} bytes)", self.np, dir.display());
        if !cut.is_empty() {
            msg.push_str(&format!("; rank {} stopped before finalize, so its record ends there", join(&cut)));
        }
        say(&msg);
    }
}

/// The ring file of rank `r` for the trace at `path`.
fn ring_path(path: &Path, r: usize) -> PathBuf {
    PathBuf::from(format!("{}.rank{r}", path.display()))
}

fn join(v: &[u32]) -> String {
    v.iter().map(u32::to_string).collect::<Vec<_>>().join(", ")
}

/// Removes every rank's record file from `dir` (of a job of any size, so that no stale rank
/// of an earlier, larger job mixes into the new record); returns how many there were.
fn remove_records(dir: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else { return 0 };
    let is_record = |name: &str| {
        name.strip_prefix("rank")
            .and_then(|n| n.strip_suffix(".tmpirec"))
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
    };
    entries.flatten().filter(|e| e.file_name().to_str().is_some_and(is_record)).filter(|e| std::fs::remove_file(e.path()).is_ok()).count()
}

#[cfg(test)]
mod tests {
    use super::remove_records;

    #[test]
    fn every_ranks_record_goes_and_nothing_else() {
        let d = std::env::temp_dir().join(format!("tmpirun-records-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        let names = ["rank0.tmpirec", "rank12.tmpirec", "rank.tmpirec", "rankx.tmpirec", "notes.txt", "rank3.tmpirec.bak"];
        for n in names {
            std::fs::write(d.join(n), b"x").unwrap();
        }
        assert_eq!(remove_records(&d), 2);
        let mut left: Vec<String> = std::fs::read_dir(&d).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        left.sort();
        std::fs::remove_dir_all(&d).unwrap();
        assert_eq!(left, ["notes.txt", "rank.tmpirec", "rank3.tmpirec.bak", "rankx.tmpirec"]);
    }
}
