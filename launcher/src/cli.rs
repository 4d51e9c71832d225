//! The command line: `tmpirun -n N [options] program [args...]`.

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{Parser, ValueEnum};
use tmpi_transport::bootstrap::{LAUNCHER_VARS, MAX_RANKS};

use crate::error::{Error, Result};
use crate::sys;

/// What a rank is bound to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum BindTo {
    /// One logical CPU per rank.
    Core,
    /// Every CPU of the rank's socket.
    Socket,
    /// No binding: the OS places the rank.
    None,
}

/// How ranks are laid out over the CPUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum MapBy {
    /// Consecutive ranks on consecutive CPUs (filling socket 0 first).
    Core,
    /// Consecutive ranks round-robin over the sockets.
    Socket,
}

const AFTER_HELP: &str = "\
Environment of each rank: TMPI_RANK, TMPI_SIZE, TMPI_LOCAL_RANK, TMPI_LOCAL_SIZE, TMPI_JOBID,
TMPI_BOOTSTRAP, TMPI_SHM_NAME, TMPI_LAUNCHER_PID, TMPI_JOB_SECRET (what a rank proves itself
with to the bootstrap socket), plus tmpirun's own environment and -x. Ranks on other hosts
(--host, --hostfile) get only these, TMPI_NODE_ID, -x and tmpirun's TMPI_* knobs; they reach
the bootstrap service over TCP (TMPI_BOOTSTRAP=tcp:ADDR:PORT, on the address that routes to
them or TMPI_TCP_IF), and their stdin is /dev/null.
Processes a rank spawns (MPI_Comm_spawn) run on this host as a job of their own with
these variables, plus TMPI_PARENT (the job of parents and children that joins them) and
TMPI_APPNUM (the index of their command); they are members of the running job from then on.

Output: each rank's stdout and stderr go to tmpirun's stdout and stderr a whole line at a time
(lines of different ranks never mix). With --tag-output every line starts with \"[R] \", R the rank
(\"[spawnN.J] \" for child J of the N-th spawn).
stdin goes to rank 0 only; the other ranks read /dev/null.

Exit status: 0 if every rank exited 0 (and finalized, if it started the runtime); otherwise the
status of the first rank that failed (its exit code, 128 + signal number, or 1 for a rank that
exited 0 without finalizing), the code given to abort (1 if outside 1..=255),
124 when --timeout expired, 128 + N when tmpirun got signal N (SIGINT, SIGTERM, SIGHUP),
255 when a host stopped answering for TMPI_PEER_TIMEOUT seconds (tmpirun names it),
2 for a bad command line, 1 when the job could not be started.";

/// `tmpirun`: launches N ranks of a tmpi program on this node.
#[derive(Debug, Parser)]
#[command(name = "tmpirun", version, about, after_help = AFTER_HELP)]
pub struct Cli {
    /// Number of ranks to start (also `-np N`); optional with --host/--hostfile (all slots).
    #[arg(short = 'n', long = "np", value_name = "N",
          value_parser = clap::value_parser!(u32).range(1..=MAX_RANKS as i64))]
    pub np: Option<u32>,

    /// Prefix every line of output with `[R] `, R the rank that wrote it.
    #[arg(long)]
    pub tag_output: bool,

    /// Export VAR to the ranks: with VALUE, or from tmpirun's environment (repeatable).
    #[arg(short = 'x', value_name = "VAR[=VALUE]")]
    pub export: Vec<String>,

    /// End the job after SECS seconds (exit status 124).
    #[arg(long, value_name = "SECS", value_parser = parse_timeout)]
    pub timeout: Option<Duration>,

    /// Allow more ranks than available CPUs (the default; accepted for Open MPI compatibility).
    #[arg(long, overrides_with = "no_oversubscribe")]
    pub oversubscribe: bool,

    /// Refuse to start more ranks than available CPUs (exit status 2).
    #[arg(long)]
    pub no_oversubscribe: bool,

    /// Bind each rank [default: core when ranks <= CPUs, else none].
    #[arg(long, value_enum, value_name = "WHAT")]
    pub bind_to: Option<BindTo>,

    /// Lay ranks out by core or by socket.
    #[arg(long, value_enum, value_name = "WHAT", default_value = "core")]
    pub map_by: MapBy,

    /// Print each rank's binding on stderr.
    #[arg(long)]
    pub report_bindings: bool,

    /// Print "tmpirun: rank R pid P" on stderr for each rank.
    #[arg(long)]
    pub report_pids: bool,

    /// Run on these hosts: `HOST[:SLOTS],...` (1 slot when none given; repeatable). Ranks fill
    /// the slots in order; hosts other than this machine are reached through ssh.
    #[arg(long = "host", value_name = "HOST[:N],...", conflicts_with = "hostfile")]
    pub host: Vec<String>,

    /// Run on the hosts of FILE (Open MPI format: `host slots=N` per line, `#` comments).
    #[arg(long, value_name = "FILE")]
    pub hostfile: Option<PathBuf>,

    /// Command that starts a rank on another host instead of `ssh` (split on whitespace;
    /// overrides TMPI_RSH).
    #[arg(long, value_name = "CMD")]
    pub launch_agent: Option<String>,

    /// List every TMPI_* knob with its default and meaning, then exit.
    #[arg(long)]
    pub info: bool,

    /// Record a timeline of every rank (each call, each message and its protocol, an arrow
    /// from each send to the receive that matched it) and merge it into PATH, a JSON file for
    /// the Perfetto UI or chrome://tracing (sets TMPI_TRACE).
    #[arg(long, value_name = "PATH.json")]
    pub trace: Option<PathBuf>,

    /// When the job ends, print time in communication per rank and per call, messages and
    /// bytes per pair of ranks and the longest waits; write them to tmpi-profile.txt and the
    /// traffic matrix to tmpi-profile.svg (sets TMPI_PROFILE).
    #[arg(long)]
    pub profile: bool,

    /// Record each rank's nondeterministic decisions (wildcard matches, test answers) in DIR,
    /// for --replay (sets TMPI_RECORD).
    #[arg(long, value_name = "DIR", conflicts_with = "replay")]
    pub record: Option<PathBuf>,

    /// Run the program again forcing the decisions recorded in DIR; a rank that departs from
    /// the record fails naming the call (sets TMPI_REPLAY).
    #[arg(long, value_name = "DIR")]
    pub replay: Option<PathBuf>,

    /// The program to run, and its arguments (passed as they are, even ones starting with '-').
    #[arg(value_name = "PROGRAM", required_unless_present = "info", trailing_var_arg = true,
          num_args = 1..)]
    pub command: Vec<OsString>,
}

fn parse_timeout(s: &str) -> std::result::Result<Duration, String> {
    let secs: f64 = s.parse().map_err(|_| format!("{s:?} is not a number of seconds"))?;
    if !(secs > 0.0 && secs <= 1e9) {
        return Err(format!("{s}: the timeout must be more than 0 and at most 1e9 seconds"));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// Options before the program that take a value as the next argument.
const VALUE_OPTS: &[&str] = &[
    "-n",
    "-np",
    "--np",
    "-x",
    "--timeout",
    "--bind-to",
    "--map-by",
    "--host",
    "--hostfile",
    "--launch-agent",
    "--trace",
    "--record",
    "--replay",
];

/// Rewrites Open MPI's `-np N` (and `-np=N`) to `--np`, only before the program.
pub fn normalize_args(args: impl IntoIterator<Item = OsString>) -> Vec<OsString> {
    let mut out = Vec::new();
    let mut it = args.into_iter();
    if let Some(argv0) = it.next() {
        out.push(argv0);
    }
    let mut in_options = true;
    let mut expect_value = false;
    for a in it {
        if !in_options {
            out.push(a);
            continue;
        }
        if expect_value {
            expect_value = false;
            out.push(a);
            continue;
        }
        let s = a.to_string_lossy();
        if s == "--" || !s.starts_with('-') || s == "-" {
            in_options = false;
            out.push(a);
        } else if s == "-np" {
            expect_value = true;
            out.push("--np".into());
        } else if let Some(v) = s.strip_prefix("-np=") {
            out.push(format!("--np={v}").into());
        } else {
            expect_value = VALUE_OPTS.contains(&s.as_ref());
            out.push(a);
        }
    }
    out
}

/// One `-x` request, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Export {
    /// `VAR=VALUE`.
    Set(String, OsString),
    /// `VAR` alone: pass tmpirun's value (ranks inherit it already; this checks it exists).
    Pass(String),
}

/// Checks the `-x` arguments.
///
/// # Errors
/// An empty or malformed name, or a variable that tmpirun sets itself.
pub fn parse_exports(raw: &[String]) -> Result<Vec<Export>> {
    raw.iter()
        .map(|x| {
            let (name, value) = match x.split_once('=') {
                Some((n, v)) => (n, Some(v)),
                None => (x.as_str(), None),
            };
            let valid = !name.is_empty()
                && !name.starts_with(|c: char| c.is_ascii_digit())
                && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
            if !valid {
                return Err(Error::Usage(format!("-x {x}: {name:?} is not a valid variable name")));
            }
            if LAUNCHER_VARS.contains(&name) {
                return Err(Error::Usage(format!("-x {x}: {name} is set by tmpirun for each rank")));
            }
            if let (Some(flag), Some(_)) = (seeing_flag(name), value) {
                // tmpirun merges, reports and checks what these write only when it knows of them.
                return Err(Error::Usage(format!("-x {x}: use {flag} (or {name} in tmpirun's own environment)")));
            }
            Ok(match value {
                Some(v) => Export::Set(name.to_string(), v.into()),
                None => Export::Pass(name.to_string()),
            })
        })
        .collect()
}

/// The tmpirun flag that sets seeing knob `name`, if it is one.
fn seeing_flag(name: &str) -> Option<&'static str> {
    match name {
        "TMPI_TRACE" => Some("--trace PATH"),
        "TMPI_PROFILE" => Some("--profile"),
        "TMPI_RECORD" => Some("--record DIR"),
        "TMPI_REPLAY" => Some("--replay DIR"),
        _ => None,
    }
}

/// Finds the program the way a shell would: a name with a `/` as is, otherwise in `PATH`.
///
/// # Errors
/// [`Error::Usage`] if it does not exist, is a directory, or is not executable.
pub fn resolve_program(prog: &OsStr) -> Result<PathBuf> {
    let shown = prog.to_string_lossy();
    if prog.is_empty() {
        return Err(Error::Usage("the program name is empty".into()));
    }
    let check = |p: &Path| -> std::result::Result<(), String> {
        let md = std::fs::metadata(p).map_err(|e| format!("{}: {e}", p.display()))?;
        if md.is_dir() {
            return Err(format!("{} is a directory", p.display()));
        }
        if !sys::executable(p) {
            return Err(format!("{} is not executable", p.display()));
        }
        Ok(())
    };
    if prog.to_string_lossy().contains('/') {
        let p = PathBuf::from(prog);
        check(&p).map_err(|e| Error::Usage(format!("cannot run program {shown:?}: {e}")))?;
        return Ok(p);
    }
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into());
    let mut last = None;
    for dir in std::env::split_paths(&path) {
        let dir = if dir.as_os_str().is_empty() { PathBuf::from(".") } else { dir };
        let p = dir.join(prog);
        if !p.exists() {
            continue;
        }
        match check(&p) {
            Ok(()) => return Ok(p),
            Err(e) => last = Some(e),
        }
    }
    Err(Error::Usage(match last {
        Some(e) => format!("cannot run program {shown:?}: {e}"),
        None => format!("cannot run program {shown:?}: not found in PATH"),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn norm(v: &[&str]) -> Vec<String> {
        normalize_args(v.iter().map(OsString::from)).into_iter().map(|s| s.into_string().unwrap()).collect()
    }

    #[test]
    fn np_is_rewritten_only_before_the_program() {
        assert_eq!(norm(&["t", "-np", "4", "prog", "-np", "2"]), ["t", "--np", "4", "prog", "-np", "2"]);
        assert_eq!(norm(&["t", "-x", "-np", "-np=3", "p"]), ["t", "-x", "-np", "--np=3", "p"]);
        assert_eq!(norm(&["t", "--", "-np"]), ["t", "--", "-np"]);
    }

    #[test]
    fn clap_takes_trailing_args_verbatim() {
        let cli = Cli::try_parse_from(norm(&["t", "-np", "3", "--tag-output", "prog", "-x", "--info", "-n"])).unwrap();
        assert_eq!(cli.np, Some(3));
        assert!(cli.tag_output);
        assert_eq!(cli.command, ["prog", "-x", "--info", "-n"]);
        assert!(Cli::try_parse_from(["t", "-n", "0", "p"]).is_err());
        assert_eq!(Cli::try_parse_from(["t", "p"]).unwrap().np, None, "-n is checked by main: hosts may give it");
        let cli = Cli::try_parse_from(norm(&["t", "--host", "a:2,b:2", "--launch-agent", "ssh -p 2", "p"])).unwrap();
        assert_eq!((cli.host, cli.launch_agent.as_deref()), (vec!["a:2,b:2".to_string()], Some("ssh -p 2")));
        assert!(Cli::try_parse_from(["t", "--host", "a", "--hostfile", "f", "p"]).is_err());
        assert!(Cli::try_parse_from(["t", "-n", "2"]).is_err(), "program is required");
        assert!(Cli::try_parse_from(["t", "--info"]).is_ok());
        assert!(Cli::try_parse_from(["t", "-n", "1", "--timeout", "0", "p"]).is_err());
        assert!(Cli::try_parse_from(["t", "-n", "1", "--bind-to", "numa", "p"]).is_err());
        let cli = Cli::try_parse_from(["t", "-n", "1", "-x", "A=1", "-x", "B", "--timeout", "1.5", "p"]).unwrap();
        assert_eq!(cli.export, ["A=1", "B"]);
        assert_eq!(cli.timeout, Some(Duration::from_millis(1500)));
    }

    #[test]
    fn seeing_flags_parse() {
        let cli =
            Cli::try_parse_from(norm(&["t", "-n", "2", "--trace", "t.json", "--profile", "--record", "rec", "p", "--trace"])).unwrap();
        assert_eq!((cli.trace, cli.profile, cli.record, cli.replay), (Some("t.json".into()), true, Some("rec".into()), None));
        assert_eq!(cli.command, ["p", "--trace"], "flags after the program are the program's");
        assert!(
            Cli::try_parse_from(["t", "-n", "2", "--record", "a", "--replay", "a", "p"]).is_err(),
            "record and replay exclude each other"
        );
        assert_eq!(Cli::try_parse_from(["t", "-n", "1", "--replay", "d", "p"]).unwrap().replay, Some("d".into()));
    }

    #[test]
    fn exports_are_checked() {
        let e = parse_exports(&["A=1=2".into(), "B".into(), "C=".into()]).unwrap();
        assert_eq!(e, [Export::Set("A".into(), "1=2".into()), Export::Pass("B".into()), Export::Set("C".into(), "".into())]);
        for bad in ["", "=1", "1A=2", "A-B=1", "TMPI_RANK=3", "TMPI_JOB_SECRET=00", "TMPI_JOB_SECRET"] {
            assert!(parse_exports(&[bad.into()]).is_err(), "{bad}");
        }
        // Seeing knobs with a value go through their flags (tmpirun merges what they write).
        let e = parse_exports(&["TMPI_TRACE=/tmp/t.json".into()]).unwrap_err().to_string();
        assert!(e.contains("use --trace PATH"), "{e}");
        assert_eq!(parse_exports(&["TMPI_PROFILE".into()]).unwrap(), [Export::Pass("TMPI_PROFILE".into())]);
    }

    #[test]
    fn programs_are_resolved() {
        assert!(resolve_program(OsStr::new("sh")).unwrap().is_absolute());
        let e = resolve_program(OsStr::new("surely-no-such-program-xyz")).unwrap_err();
        assert!(e.to_string().contains("not found in PATH"), "{e}");
        assert!(resolve_program(OsStr::new("/")).is_err());
        assert!(resolve_program(OsStr::new("./no/such")).is_err());
    }
}
