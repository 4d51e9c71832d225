//! `tmpirun`: starts the ranks of a tmpi job on this node.
//!
//! ```text
//! tmpirun -n 4 [--tag-output] [--timeout SECS] [-x VAR[=VALUE]]... [--oversubscribe]
//!         [--bind-to core|socket|none] [--map-by core|socket] [--report-bindings]
//!         [--report-pids] program [args...]
//! tmpirun --info
//! ```
//!
//! See `tmpirun --help` for the environment each rank gets, the output format and the exit
//! statuses; [`job`] for how the job runs and ends.

mod binding;
mod cleanup;
mod cli;
mod error;
mod job;
mod output;
mod sys;

use clap::Parser;
use tmpi_transport::bootstrap::{KNOBS, LAUNCHER_VARS};

use crate::error::{Error, Result};

fn main() {
    let code = match real_main() {
        Ok(code) => code,
        Err(e) => {
            eprintln!("tmpirun: {e}");
            e.exit_code()
        }
    };
    std::process::exit(code);
}

fn real_main() -> Result<i32> {
    // Handle the job-ending signals from the start, so that no exit path skips cleanup.
    let sigs = sys::SignalPipe::new()?;
    cleanup::install_panic_hook();
    let cli = cli::Cli::parse_from(cli::normalize_args(std::env::args_os()));
    let binder = binding::Binder::new();
    if cli.info {
        print_info(&binder);
        return Ok(0);
    }
    let np = cli.np.ok_or_else(|| Error::Usage("-n N is required".into()))? as usize;
    let (prog, args) = cli.command.split_first().ok_or_else(|| Error::Usage("no program given".into()))?;
    let program = cli::resolve_program(prog)?;
    let exports = cli::parse_exports(&cli.export)?;
    let topo = binder.topology()?;
    let ncores = topo.ncores();
    // Like MPICH's hydra, more ranks than cores is allowed by default (the runtime then
    // yields instead of spinning); --no-oversubscribe restores Open MPI's refusal.
    if np > ncores && cli.no_oversubscribe && !cli.oversubscribe {
        return Err(Error::Usage(format!(
            "{np} ranks requested but only {ncores} core(s) ({} CPU(s)) are available to \
             tmpirun and --no-oversubscribe was given",
            topo.ncpus()
        )));
    }
    sys::raise_nofile_limit();
    let spec = job::JobSpec {
        program,
        argv0: prog.clone(),
        args: args.to_vec(),
        np,
        tag_output: cli.tag_output,
        exports,
        timeout: cli.timeout,
        placements: binding::plan(&topo, np, cli.bind_to, cli.map_by),
        report_bindings: cli.report_bindings,
        report_pids: cli.report_pids,
    };
    job::run(&spec, &sigs, &binder)
}

/// `--info`: every knob, its default, its value here if set, and what it does; how ranks
/// are bound.
fn print_info(binder: &binding::Binder) {
    let mut out =
        format!("tmpirun {} (tmpi)\n\nRuntime knobs (environment variables; pass them with -x NAME=VALUE):\n", env!("CARGO_PKG_VERSION"));
    for k in KNOBS {
        let now = match std::env::var(k.name) {
            Ok(v) => format!("  (set here: {v})"),
            Err(_) => String::new(),
        };
        out.push_str(&format!("  {:<24} default: {}{now}\n      {}\n", k.name, k.default, k.meaning));
    }
    out.push_str("\nSet by tmpirun for each rank: ");
    out.push_str(&LAUNCHER_VARS.join(", "));
    out.push_str("\n\nBinding: ");
    out.push_str(&binder.describe());
    out.push('\n');
    output::write_to(output::Sink::Stdout, out.as_bytes());
}
