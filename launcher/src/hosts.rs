//! Several hosts: `--host`, `--hostfile`, which hosts are this machine, and how a rank is
//! started on another one (through `ssh` or `TMPI_RSH` / `--launch-agent`).
//!
//! A remote rank runs under a small POSIX `sh` wrapper ([`REMOTE_WRAPPER`]) started by the
//! agent. The wrapper reads the job secret as the first line of its stdin (so the secret is
//! never on a command line that `ps` shows), starts the rank in its own session with stdin
//! from `/dev/null`, and watches the rest of its stdin: `tmpirun` keeps the pipe to the agent
//! open for the whole job, so stdin ends exactly when `tmpirun` or the agent (the ssh
//! connection) goes away, and then the wrapper kills the rank's session. The wrapper exits
//! with the rank's status, which the agent passes back.

use std::ffi::OsString;
use std::net::{IpAddr, SocketAddr, ToSocketAddrs, UdpSocket};
use std::path::Path;

use crate::error::{Error, Result};

/// `TMPI_RSH`: the command that starts a rank on another host (replaces `ssh`).
pub const ENV_RSH: &str = "TMPI_RSH";

/// One host of the job and the number of ranks it takes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Host {
    /// The name as the user wrote it (what the agent is given).
    pub name: String,
    /// Ranks it takes.
    pub slots: usize,
}

fn check_name(name: &str, at: &str) -> Result<()> {
    let ok = !name.is_empty()
        && !name.starts_with('-')
        && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | ':' | '@' | '[' | ']'));
    if ok {
        Ok(())
    } else {
        Err(Error::Usage(format!("{at}: {name:?} is not a host name")))
    }
}

fn parse_slots(v: &str, at: &str) -> Result<usize> {
    match v.parse::<usize>() {
        Ok(n) if (1..=tmpi_transport::bootstrap::MAX_RANKS).contains(&n) => Ok(n),
        _ => Err(Error::Usage(format!("{at}: slots {v:?} is not a number of ranks (1..={})", tmpi_transport::bootstrap::MAX_RANKS))),
    }
}

/// Parses `--host` values: `h1:2,h2,h3:4` (a host without `:N` takes one slot), repeatable.
///
/// # Errors
/// [`Error::Usage`] naming the bad entry.
pub fn parse_host_list(values: &[String]) -> Result<Vec<Host>> {
    let mut out = Vec::new();
    for v in values {
        for item in v.split(',') {
            let at = format!("--host {v}");
            let item = item.trim();
            let (name, slots) = match item.rsplit_once(':') {
                // `[v6]:N` or `name:N`; a bare IPv6 address has more colons than one.
                Some((n, s)) if !n.contains(':') || n.ends_with(']') => (n, parse_slots(s, &at)?),
                _ => (item, 1),
            };
            check_name(name, &at)?;
            out.push(Host { name: name.to_string(), slots });
        }
    }
    Ok(out)
}

/// Parses a hostfile in Open MPI's format: one host per line, optionally `slots=N`
/// (default 1) and `max_slots=N` (accepted, not used); `#` starts a comment.
///
/// # Errors
/// [`Error::Usage`] naming the file and line of the first bad entry.
pub fn parse_hostfile(path: &Path, text: &str) -> Result<Vec<Host>> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let at = format!("{}:{}", path.display(), i + 1);
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let mut words = line.split_ascii_whitespace();
        let name = words.next().unwrap_or_default();
        check_name(name, &at)?;
        let mut slots = 1;
        for w in words {
            match w.split_once('=') {
                Some(("slots", v)) => slots = parse_slots(v, &at)?,
                Some(("max_slots" | "max-slots", v)) => {
                    parse_slots(v, &at)?;
                }
                _ => return Err(Error::Usage(format!("{at}: unknown word {w:?} (expected slots=N)"))),
            }
        }
        out.push(Host { name: name.to_string(), slots });
    }
    if out.is_empty() {
        return Err(Error::Usage(format!("{}: no host in the hostfile", path.display())));
    }
    Ok(out)
}

/// The host of each rank: slots filled in order, `np` ranks (all slots when `None`).
///
/// # Errors
/// [`Error::Usage`] when more ranks are asked for than the hosts have slots.
pub fn map_ranks(hosts: &[Host], np: Option<usize>) -> Result<Vec<usize>> {
    let total: usize = hosts.iter().map(|h| h.slots).sum();
    let np = np.unwrap_or(total);
    if np > total {
        return Err(Error::Usage(format!("{np} ranks requested but the hosts have only {total} slot(s)")));
    }
    let mut out = Vec::with_capacity(np);
    'fill: for (i, h) in hosts.iter().enumerate() {
        for _ in 0..h.slots {
            if out.len() == np {
                break 'fill;
            }
            out.push(i);
        }
    }
    Ok(out)
}

/// This machine's host name (`gethostname`).
pub fn hostname() -> String {
    let mut name = [0u8; 256];
    // SAFETY: the pointer and length describe `name`, which outlives the call.
    let rc = unsafe { libc::gethostname(name.as_mut_ptr().cast(), name.len()) };
    let end = name.iter().position(|&b| b == 0).unwrap_or(name.len());
    if rc == 0 {
        String::from_utf8_lossy(&name[..end]).into_owned()
    } else {
        String::new()
    }
}

/// Whether `name` is this machine: `localhost`, its host name (or the short one), a loopback
/// address or an address of one of its interfaces. Names are not looked up: a host name
/// other than this machine's is remote.
pub fn is_local(name: &str, local_ips: &[IpAddr]) -> bool {
    let me = hostname();
    let short = me.split('.').next().unwrap_or_default();
    if name == "localhost" || name == me || (!short.is_empty() && name == short) {
        return true;
    }
    match name.trim_start_matches('[').trim_end_matches(']').parse::<IpAddr>() {
        Ok(ip) => ip.is_loopback() || local_ips.contains(&ip),
        Err(_) => false,
    }
}

/// The addresses of this machine's interfaces.
///
/// # Errors
/// `getifaddrs` fails.
pub fn local_ips() -> Result<Vec<IpAddr>> {
    Ok(tmpi_transport::tcp::iface::interfaces()?.into_iter().map(|a| a.ip).collect())
}

/// The address this machine reaches `host` from (the kernel's route choice for a UDP socket
/// "connected" to it: no packet is sent).
///
/// # Errors
/// [`Error::Usage`] when the name does not resolve or no route reaches it.
pub fn source_ip_towards(host: &str) -> Result<IpAddr> {
    let bare = host.rsplit_once('@').map_or(host, |(_, h)| h).trim_start_matches('[').trim_end_matches(']');
    let fail = |why: String| Error::Usage(format!("cannot find the address that reaches host {host:?}: {why} (set TMPI_TCP_IF)"));
    let target: SocketAddr =
        (bare, 22).to_socket_addrs().map_err(|e| fail(e.to_string()))?.next().ok_or_else(|| fail("no address".into()))?;
    let any: SocketAddr = if target.is_ipv4() { "0.0.0.0:0".parse() } else { "[::]:0".parse() }.map_err(|_| fail("bad address".into()))?;
    let s = UdpSocket::bind(any).map_err(|e| fail(e.to_string()))?;
    s.connect(target).map_err(|e| fail(e.to_string()))?;
    let ip = s.local_addr().map_err(|e| fail(e.to_string()))?.ip();
    if ip.is_unspecified() {
        return Err(fail("no route".into()));
    }
    Ok(ip)
}

/// The agent command: `--launch-agent`, else `TMPI_RSH`, else `ssh`, split on whitespace.
/// Plain `ssh` gets non-interactive options (`-x -o BatchMode=yes`): a password prompt
/// would hang the job.
///
/// # Errors
/// [`Error::Usage`] for an empty command.
pub fn agent(flag: Option<&str>) -> Result<Vec<String>> {
    let raw = match flag {
        Some(f) => f.to_string(),
        None => std::env::var(ENV_RSH).unwrap_or_else(|_| "ssh".into()),
    };
    let mut words: Vec<String> = raw.split_ascii_whitespace().map(str::to_string).collect();
    if words.is_empty() {
        return Err(Error::Usage(format!("the launch agent (--launch-agent or {ENV_RSH}) is empty")));
    }
    if words.len() == 1 && words[0] == "ssh" {
        words.extend(["-x", "-o", "BatchMode=yes"].map(String::from));
    }
    Ok(words)
}

/// Quotes `s` for a POSIX shell.
pub fn sh_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// The wrapper a remote rank runs under (see the module documentation). Its arguments are
/// `env`'s: `VAR=VALUE...` then the program and its arguments.
pub const REMOTE_WRAPPER: &str = r#"IFS= read -r s || exit 126
TMPI_JOB_SECRET=$s; export TMPI_JOB_SECRET
exec 3<&0
if command -v setsid >/dev/null 2>&1; then setsid env "$@" </dev/null 3<&- & else env "$@" </dev/null 3<&- & fi
p=$!
{ cat <&3; kill -KILL -"$p"; kill -KILL "$p"; } >/dev/null 2>&1 &
w=$!
exec 3<&-
wait "$p"; rc=$?
kill "$w" 2>/dev/null
exit "$rc""#;

/// The one remote command line (given to the agent after the host name): `cd` to `cwd` if
/// it exists there, then [`REMOTE_WRAPPER`] with `env` and `program` and `args`.
pub fn remote_command(cwd: &Path, env: &[(String, OsString)], program: &Path, args: &[OsString]) -> String {
    let mut words = vec![
        format!("cd {} 2>/dev/null;", sh_quote(&cwd.to_string_lossy())),
        "exec".into(),
        "sh".into(),
        "-c".into(),
        sh_quote(REMOTE_WRAPPER),
        "tmpi-rank".into(),
    ];
    for (k, v) in env {
        words.push(sh_quote(&format!("{k}={}", v.to_string_lossy())));
    }
    words.push(sh_quote(&program.to_string_lossy()));
    for a in args {
        words.push(sh_quote(&a.to_string_lossy()));
    }
    words.join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_lists_are_parsed() {
        let h = parse_host_list(&["a:2,b".into(), "10.0.0.1:3".into(), "[::1]:2".into()]).unwrap();
        let got: Vec<(&str, usize)> = h.iter().map(|h| (h.name.as_str(), h.slots)).collect();
        assert_eq!(got, [("a", 2), ("b", 1), ("10.0.0.1", 3), ("[::1]", 2)]);
        for bad in ["a:0", "a:x", "", "a,,b", "-oProxy=x", "a b:1"] {
            assert!(parse_host_list(&[bad.into()]).is_err(), "{bad}");
        }
    }

    #[test]
    fn hostfiles_are_parsed_and_errors_name_the_line() {
        let p = Path::new("hf");
        let h = parse_hostfile(p, "# cluster\n\nh1 slots=2\nh2   # one slot\n h3 slots=3 max_slots=4\n").unwrap();
        let got: Vec<(&str, usize)> = h.iter().map(|h| (h.name.as_str(), h.slots)).collect();
        assert_eq!(got, [("h1", 2), ("h2", 1), ("h3", 3)]);
        let e = parse_hostfile(p, "h1\nh2 slots=zero\n").unwrap_err().to_string();
        assert!(e.contains("hf:2"), "{e}");
        let e = parse_hostfile(p, "h1 slot=2\n").unwrap_err().to_string();
        assert!(e.contains("hf:1") && e.contains("slot=2"), "{e}");
        assert!(parse_hostfile(p, "# nothing\n").is_err());
    }

    #[test]
    fn ranks_fill_slots_in_order() {
        let hosts = parse_host_list(&["a:2,b:2".into()]).unwrap();
        assert_eq!(map_ranks(&hosts, None).unwrap(), [0, 0, 1, 1]);
        assert_eq!(map_ranks(&hosts, Some(3)).unwrap(), [0, 0, 1]);
        let e = map_ranks(&hosts, Some(5)).unwrap_err().to_string();
        assert!(e.contains("5 ranks") && e.contains("4 slot"), "{e}");
    }

    #[test]
    fn local_names_are_recognised() {
        let ips = local_ips().unwrap();
        assert!(is_local("localhost", &ips));
        assert!(is_local("127.0.0.5", &ips));
        assert!(is_local(&hostname(), &ips));
        assert!(!is_local("surely-not-this-host.invalid", &ips));
        assert!(!is_local("192.0.2.1", &ips));
    }

    #[test]
    fn agents_and_quoting() {
        assert_eq!(agent(Some("ssh")).unwrap(), ["ssh", "-x", "-o", "BatchMode=yes"]);
        assert_eq!(agent(Some(" ssh  -p 2222 ")).unwrap(), ["ssh", "-p", "2222"]);
        assert!(agent(Some("  ")).is_err());
        assert_eq!(sh_quote("it's"), r"'it'\''s'");
        let c = remote_command(Path::new("/w"), &[("A".into(), "1 2".into())], Path::new("/bin/prog"), &["x y".into()]);
        assert!(c.starts_with("cd '/w' 2>/dev/null; exec sh -c '"), "{c}");
        assert!(c.ends_with(" tmpi-rank 'A=1 2' '/bin/prog' 'x y'"), "{c}");
        assert!(!c.contains("'TMPI_JOB_SECRET="), "the secret is not on the command line");
    }

    #[test]
    fn the_wrapper_runs_the_rank_and_kills_it_when_stdin_closes() {
        use std::io::Write;
        use std::process::{Command, Stdio};
        // Exit status passes through, the secret arrives from stdin.
        let mut c = Command::new("sh")
            .args(["-c", REMOTE_WRAPPER, "w", "X=1", "sh", "-c", "test \"$TMPI_JOB_SECRET$X\" = abc1 && exit 7"])
            .stdin(Stdio::piped())
            .spawn()
            .unwrap();
        let mut w = c.stdin.take().unwrap();
        w.write_all(b"abc\n").unwrap();
        assert_eq!(c.wait().unwrap().code(), Some(7));
        drop(w);
        // A rank that would run for long ends soon after stdin closes.
        let mut c = Command::new("sh").args(["-c", REMOTE_WRAPPER, "w", "sleep", "60"]).stdin(Stdio::piped()).spawn().unwrap();
        let mut w = c.stdin.take().unwrap();
        w.write_all(b"abc\n").unwrap();
        std::thread::sleep(std::time::Duration::from_millis(200));
        let t = std::time::Instant::now();
        drop(w);
        let st = c.wait().unwrap();
        assert!(!st.success());
        assert!(t.elapsed() < std::time::Duration::from_secs(20), "{:?}", t.elapsed());
    }
}
