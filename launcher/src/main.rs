//! `tmpirun`: starts the ranks of a tmpi job on this node, or on several hosts through
//! `ssh` ([`hosts`]).
//!
//! ```text
//! tmpirun -n 4 [--tag-output] [--timeout SECS] [-x VAR[=VALUE]]... [--oversubscribe]
//!         [--bind-to core|socket|none] [--map-by core|socket] [--report-bindings]
//!         [--report-pids] [--host H[:N],... | --hostfile FILE] [--launch-agent CMD]
//!         program [args...]
//! tmpirun --info
//! ```
//!
//! See `tmpirun --help` for the environment each rank gets, the output format and the exit
//! statuses; [`job`] for how the job runs and ends.

mod binding;
mod cleanup;
mod cli;
mod error;
mod hosts;
mod job;
mod output;
mod seen;
mod sys;

use clap::Parser;
use tmpi_transport::bootstrap::{KNOBS, LAUNCHER_VARS};

use crate::error::{Error, Result};

fn main() {
    // libfabric's dependencies (libpsm2) take SIGSEGV, SIGABRT, SIGINT, SIGTERM... as they
    // load; a crash of tmpirun must read as one, and its own signal handling comes later.
    #[cfg(feature = "ofi")]
    tmpi_transport::ofi::signals::restore_default_signals();
    let code = match real_main() {
        Ok(code) => code,
        Err(e) => {
            output::write_own(&format!("tmpirun: {}\n", output::bounded(&e.to_string(), output::MAX_OWN_LINE)));
            e.exit_code()
        }
    };
    // A rank's unfinished last line on stderr (one ended while printing) gets its newline.
    output::write_own("");
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
    let spec = job_spec(&cli, &binder)?;
    let seeing = seen::Seeing::prepare(&cli, spec.np)?;
    let status = job::run(&spec, &sigs, &binder)?;
    seeing.finish();
    Ok(status)
}

/// The job the command line asks for, checked against this machine's cores and file limit.
fn job_spec(cli: &cli::Cli, binder: &binding::Binder) -> Result<job::JobSpec> {
    let peer_timeout = peer_timeout()?;
    let (np, multi) = rank_layout(cli, peer_timeout)?;
    let (prog, args) = cli.command.split_first().ok_or_else(|| Error::Usage("no program given".into()))?;
    let program = cli::resolve_program(prog)?;
    let exports = cli::parse_exports(&cli.export)?;
    let topo = binder.topology()?;
    let nlocal = multi.as_ref().map_or(np, |m| m.node_of.iter().filter(|&&n| !m.remote[n]).count());
    check_oversubscribe(cli, &topo, nlocal)?;
    let placements = plan_placements(cli, &topo, np, nlocal, multi.as_ref());
    check_fd_limit(np, nlocal)?;
    Ok(job::JobSpec {
        program,
        argv0: prog.clone(),
        args: args.to_vec(),
        np,
        tag_output: cli.tag_output,
        exports,
        timeout: cli.timeout,
        placements,
        multi,
        report_bindings: cli.report_bindings,
        report_pids: cli.report_pids,
        peer_timeout,
    })
}

/// The hosts `--hostfile` or `--host` name, if either was given.
fn host_list(cli: &cli::Cli) -> Result<Option<Vec<hosts::Host>>> {
    Ok(if let Some(f) = &cli.hostfile {
        let text = hosts::read_hostfile(f)?;
        Some(hosts::parse_hostfile(f, &text)?)
    } else if !cli.host.is_empty() {
        Some(hosts::parse_host_list(&cli.host)?)
    } else {
        None
    })
}

/// The number of ranks, and their layout over hosts when the job runs on several.
fn rank_layout(cli: &cli::Cli, peer_timeout: Option<std::time::Duration>) -> Result<(usize, Option<job::MultiHost>)> {
    let host_list = host_list(cli)?;
    let np_flag = cli.np.map(|n| n as usize);
    Ok(match &host_list {
        None => (np_flag.ok_or_else(|| Error::Usage("-n N is required (or --host/--hostfile)".into()))?, None),
        Some(list) => {
            let host_of = hosts::map_ranks(list, np_flag)?;
            (host_of.len(), multi_host(list, &host_of, cli.launch_agent.as_deref(), peer_timeout)?)
        }
    })
}

/// Refuses more local ranks than cores when `--no-oversubscribe` was given.
fn check_oversubscribe(cli: &cli::Cli, topo: &binding::Topology, nlocal: usize) -> Result<()> {
    let ncores = topo.ncores();
    // Like MPICH's hydra, more ranks than cores is allowed by default (the runtime then
    // yields instead of spinning); --no-oversubscribe restores Open MPI's refusal.
    if nlocal > ncores && cli.no_oversubscribe && !cli.oversubscribe {
        return Err(Error::Usage(format!(
            "{np} ranks requested but only {ncores} core(s) ({} CPU(s)) are available to \
             tmpirun and --no-oversubscribe was given",
            topo.ncpus(),
            np = nlocal,
        )));
    }
    Ok(())
}

/// Each rank's placement: the local ranks' as planned, remote (and unplanned) ranks unbound.
fn plan_placements(
    cli: &cli::Cli,
    topo: &binding::Topology,
    np: usize,
    nlocal: usize,
    multi: Option<&job::MultiHost>,
) -> Vec<binding::Placement> {
    let mut local_places = binding::plan(topo, nlocal, cli.bind_to, cli.map_by).into_iter();
    let unbound = binding::Placement { bound: binding::Bound::Nothing, socket: 0, cores: Vec::new(), cpus: None };
    (0..np)
        .map(|r| match multi {
            Some(m) if m.remote[m.node_of[r]] => unbound.clone(),
            _ => local_places.next().unwrap_or_else(|| unbound.clone()),
        })
        .collect()
}

/// Raises the open-file limit, and refuses a job that would still need more files than it.
fn check_fd_limit(np: usize, nlocal: usize) -> Result<()> {
    // Checked before any rank starts: past the limit, a job of hundreds of ranks used to fail
    // in the middle of its start ("start rank 505: Too many open files").
    let need = sys::fds_needed(nlocal, np - nlocal);
    if let Some(limit) = sys::raise_nofile_limit().filter(|&l| need > l) {
        return Err(Error::Usage(format!(
            "{nlocal} ranks on this host and {} on others need about {need} open files in tmpirun ({} per local rank: \
             two output pipes and a bootstrap connection; one per remote rank) but its limit is {limit} (`ulimit -n`, hard \
             limit included): raise it or start fewer ranks",
            np - nlocal,
            sys::FDS_PER_RANK
        )));
    }
    Ok(())
}

/// The job's layout over several hosts, or `None` when every host given is this machine
/// (the job then runs exactly as a one-host job).
fn multi_host(
    list: &[hosts::Host],
    host_of: &[usize],
    agent: Option<&str>,
    peer_timeout: Option<std::time::Duration>,
) -> Result<Option<job::MultiHost>> {
    let ips = hosts::local_ips()?;
    let local: Vec<bool> = list.iter().map(|h| hosts::is_local(&h.name, &ips)).collect();
    if host_of.iter().all(|&h| local[h]) {
        return Ok(None);
    }
    // Nodes: every local entry is one node; remote entries of one name are one node.
    let mut names: Vec<String> = Vec::new();
    let mut remote: Vec<bool> = Vec::new();
    let mut node_of_entry = Vec::with_capacity(list.len());
    for (h, is_local) in list.iter().zip(&local) {
        let found = names.iter().zip(&remote).position(|(n, &r)| if *is_local { !r } else { r && *n == h.name });
        node_of_entry.push(found.unwrap_or_else(|| {
            names.push(h.name.clone());
            remote.push(!is_local);
            names.len() - 1
        }));
    }
    let node_of: Vec<usize> = host_of.iter().map(|&h| node_of_entry[h]).collect();
    let first_remote = names.iter().zip(&remote).find(|(_, &r)| r).map(|(n, _)| n.clone()).unwrap_or_default();
    let bootstrap_ip = match std::env::var("TMPI_TCP_IF").ok().filter(|s| !s.trim().is_empty()) {
        Some(v) => tmpi_transport::tcp::iface::listen_ip(Some(&v), false)?,
        None => hosts::source_ip_towards(&first_remote)?,
    };
    let cwd = std::env::current_dir().map_err(|e| Error::io("current directory", e))?;
    Ok(Some(job::MultiHost { names, remote, node_of, agent: hosts::agent_for(agent, peer_timeout)?, bootstrap_ip, cwd }))
}

/// `TMPI_PEER_TIMEOUT` from tmpirun's environment (the ranks get the same value).
///
/// # Errors
/// [`Error::Usage`] naming the variable for a value it does not accept.
fn peer_timeout() -> Result<Option<std::time::Duration>> {
    use tmpi_transport::tcp::alive;
    alive::peer_timeout_from_env().map_err(|_| {
        let v = std::env::var(alive::ENV_PEER_TIMEOUT).unwrap_or_default();
        Error::Usage(format!(
            "{}={}: expected {}",
            alive::ENV_PEER_TIMEOUT,
            output::bounded(&format!("{v:?}"), 200),
            alive::PEER_TIMEOUT_EXPECTED
        ))
    })
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
    out.push_str("\n\nOFI (libfabric) providers: ");
    out.push_str(&ofi_providers());
    out.push('\n');
    output::write_to(output::Sink::Stdout, out.as_bytes());
}

/// `--info`'s line on libfabric: the providers `fi_getinfo` offers an RDM endpoint with
/// `FI_TAGGED | FI_RMA` on, each marked `(hardware)` when `TMPI_FABRIC=auto` would take it
/// between hosts, and with who matches point-to-point on it by default
/// (`TMPI_OFI_MATCHING=auto`: `Matching::default_for`).
#[cfg(feature = "ofi")]
fn ofi_providers() -> String {
    use tmpi_transport::ofi;
    let (major, minor) = ofi::version();
    match ofi::providers() {
        Ok(v) if v.is_empty() => format!("none found (libfabric {major}.{minor})"),
        Ok(v) => {
            let names: Vec<String> = v
                .iter()
                .map(|p| {
                    let hw = if ofi::is_hardware(p) { " (hardware)" } else { "" };
                    let m = match ofi::p2p::Matching::default_for(p) {
                        ofi::p2p::Matching::Provider => "provider",
                        _ => "software",
                    };
                    format!("{p}{hw} (matching: {m})")
                })
                .collect();
            format!("{} (libfabric {major}.{minor}; TMPI_FABRIC=ofi takes the first, or TMPI_OFI_PROVIDER)", names.join(", "))
        }
        Err(e) => format!("fi_getinfo failed: {e}"),
    }
}

/// Without the feature, says how to get it.
#[cfg(not(feature = "ofi"))]
fn ofi_providers() -> String {
    "not built (cargo build --release --features ofi)".into()
}
