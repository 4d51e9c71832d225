//! Several hosts: `--host`, `--hostfile`, which hosts are this machine, and how a rank is
//! started on another one (through `ssh` or `TMPI_RSH` / `--launch-agent`).
//!
//! A remote rank runs under a small POSIX `sh` wrapper ([`REMOTE_WRAPPER`]) started by the
//! agent. Its stdin (the agent's: the ssh session's) is the one channel from `tmpirun` to the
//! rank's host, the *link* ([`Link`]), and it carries, in order:
//!
//! 1. the job secret, one line (so the secret is never on a command line that `ps` shows);
//! 2. one line, `1` when this rank gets `tmpirun`'s stdin (rank 0), else `0`;
//! 3. for rank 0 only, `tmpirun`'s stdin in frames: a line `D<n>` followed by `n` bytes of
//!    data, and at the end of `tmpirun`'s stdin one line `E`, after which nothing more is
//!    sent. The wrapper copies each frame's bytes into a FIFO that is the rank's stdin and
//!    closes it at `E`, so the rank sees end of file exactly when `tmpirun`'s input ends.
//!    (The frame bodies are copied by GNU `head -c`, which never reads past its count, or
//!    where that is missing by `dd bs=1`, which is slower but POSIX.)
//!
//! After that the link stays open, silent, for the whole job: it ends exactly when `tmpirun`
//! or the agent (the ssh connection) goes away, and then the wrapper's watchdog kills the
//! rank's session. The rank runs in its own session with stdin from the FIFO (rank 0) or
//! `/dev/null`; the watchdog runs in a session of its own too (and ignores SIGHUP, SIGINT and
//! SIGTERM), so that when the agent runs the wrapper on this machine (`ip netns exec`,
//! `nsenter`, a container's entry, `sh -c`) the signals `tmpirun` sends the agent's process
//! group to end the job end the wrapper but never the watchdog, which then kills the rank.
//! The wrapper exits with the rank's status, which the agent passes back.

use std::ffi::OsString;
use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, ToSocketAddrs, UdpSocket};
use std::path::Path;
use std::process::ChildStdin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

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
        if line.len() > MAX_HOSTFILE_LINE {
            return Err(Error::Usage(format!("{at}: line longer than {MAX_HOSTFILE_LINE} bytes")));
        }
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

/// The agent command as [`agent`] makes it, and for plain `ssh` also ssh's own liveness
/// options for a peer timeout of `peer_timeout` (`TMPI_PEER_TIMEOUT`; none when `None`):
/// `-o ServerAliveInterval=I -o ServerAliveCountMax=3` with `I` half the timeout, so that ssh
/// gives up on a host that stopped answering after about twice the timeout, when `tmpirun`'s
/// own watch (the bootstrap connection of a rank, after one timeout) has not ended the job
/// already: it covers the ranks that have no such connection (before `tmpi::init`, or not
/// tmpi programs).
///
/// # Errors
/// As [`agent`].
pub fn agent_for(flag: Option<&str>, peer_timeout: Option<Duration>) -> Result<Vec<String>> {
    let mut words = agent(flag)?;
    let plain_ssh = words.iter().map(String::as_str).eq(["ssh", "-x", "-o", "BatchMode=yes"]);
    if let (Some(t), true) = (peer_timeout, plain_ssh) {
        let interval = t.as_secs().div_ceil(2).max(1);
        words.extend(["-o".into(), format!("ServerAliveInterval={interval}"), "-o".into(), "ServerAliveCountMax=3".into()]);
    }
    Ok(words)
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
///
/// The watchdog (`W`, its own `sh` under `setsid`) copies rank 0's stdin frames into the
/// FIFO, then waits for the end of the link and SIGKILLs the rank's session. When the rank
/// ends first, the wrapper SIGKILLs the watchdog's session and exits with the rank's status.
/// Without `setsid` both stay in the wrapper's group; the watchdog still ignores the signals
/// that end the job, which leaves it the grace before SIGKILL to act.
pub const REMOTE_WRAPPER: &str = r#"IFS= read -r s || exit 126
IFS= read -r m || exit 126
TMPI_JOB_SECRET=$s; export TMPI_JOB_SECRET
exec 3<&0
i=/dev/null d=
if [ "$m" = 1 ]; then
d=$(mktemp -d "${TMPDIR:-/tmp}/tmpi-stdin.XXXXXX") || exit 126
i=$d/in
mkfifo -m 600 "$i" || { rmdir "$d"; exit 126; }
fi
S=; if command -v setsid >/dev/null 2>&1; then S=setsid; fi
$S env "$@" <"$i" 3<&- &
p=$!
W='trap "" HUP INT TERM
p=$1 m=$2 i=$3 d=$4
if [ "$m" = 1 ]; then
if head --version 2>/dev/null | grep -q GNU; then c() { head -c "$1"; }; else c() { dd bs=1 count="$1" 2>/dev/null; }; fi
exec 4>"$i"; rm -rf "$d"
while IFS= read -r h; do case $h in D*) c "${h#D}" >&4 || break;; *) break;; esac; done
exec 4>&-
fi
cat
kill -KILL -"$p"; kill -KILL "$p"'
$S sh -c "$W" tmpi-watchdog "$p" "$m" "$i" "$d" <&3 >/dev/null 2>&1 &
w=$!
exec 3<&-
wait "$p"; rc=$?
kill -KILL -"$w" 2>/dev/null || kill -KILL "$w" 2>/dev/null
exit "$rc""#;

/// Largest hostfile `tmpirun` reads (bytes): far more than a hostfile of any cluster, and
/// `--hostfile /dev/zero` is an error at once, not a read until memory runs out.
pub const MAX_HOSTFILE_BYTES: u64 = 4 << 20;

/// Longest line of a hostfile (bytes).
pub const MAX_HOSTFILE_LINE: usize = 4096;

/// Reads the hostfile at `path`, at most [`MAX_HOSTFILE_BYTES`].
///
/// # Errors
/// [`Error::Usage`] naming the file when it cannot be read, is larger than that, or is no
/// text (a NUL byte, or not UTF-8).
pub fn read_hostfile(path: &Path) -> Result<String> {
    let at = |why: String| Error::Usage(format!("--hostfile {}: {why}", path.display()));
    let f = std::fs::File::open(path).map_err(|e| at(e.to_string()))?;
    let mut bytes = Vec::new();
    f.take(MAX_HOSTFILE_BYTES + 1).read_to_end(&mut bytes).map_err(|e| at(e.to_string()))?;
    if bytes.len() as u64 > MAX_HOSTFILE_BYTES {
        return Err(at(format!("larger than {} MiB: not a hostfile", MAX_HOSTFILE_BYTES >> 20)));
    }
    if let Some(off) = bytes.iter().position(|&b| b == 0) {
        return Err(at(format!("not a text file (a NUL byte at offset {off})")));
    }
    String::from_utf8(bytes).map_err(|e| at(format!("not UTF-8 text (at byte {})", e.utf8_error().valid_up_to())))
}

/// Largest frame of stdin data on a [`Link`].
const STDIN_FRAME: usize = 64 * 1024;

/// The stdin pipe of a remote rank's agent (see the module documentation): open while the
/// job runs; dropping it closes the pipe, which makes the remote wrapper kill the rank. For
/// rank 0 a thread ([`Link::forward_stdin`]) shares it to send `tmpirun`'s stdin in frames;
/// dropping the `Link` never waits for that thread (if it is inside a write, the thread closes
/// the pipe itself when the write returns).
pub struct Link {
    pipe: Arc<Mutex<Option<ChildStdin>>>,
    closed: Arc<AtomicBool>,
}

impl Link {
    /// Sends the secret line and whether this rank gets stdin; the link stays open.
    ///
    /// # Errors
    /// The agent is gone already.
    pub fn new(mut pipe: ChildStdin, secret_hex: &str, gets_stdin: bool) -> std::io::Result<Self> {
        // 36 bytes: the pipe takes them at once.
        pipe.write_all(format!("{secret_hex}\n{}\n", u8::from(gets_stdin)).as_bytes())?;
        Ok(Link { pipe: Arc::new(Mutex::new(Some(pipe))), closed: Arc::new(AtomicBool::new(false)) })
    }

    /// Starts a thread that forwards `input` (tmpirun's stdin) over this link in frames, and
    /// `E` at its end. The thread ends at end of input, when the link is closed, or when the
    /// agent is gone; if it is still blocked reading the terminal at exit, the process exit
    /// ends it.
    ///
    /// # Errors
    /// The thread cannot be started.
    pub fn forward_stdin(&self, mut input: impl Read + Send + 'static) -> std::io::Result<()> {
        let (pipe, closed) = (self.pipe.clone(), self.closed.clone());
        std::thread::Builder::new().name("tmpirun-stdin".into()).spawn(move || {
            let mut buf = vec![0u8; STDIN_FRAME];
            let mut frame = Vec::with_capacity(STDIN_FRAME + 16);
            loop {
                let n = loop {
                    match input.read(&mut buf) {
                        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                        Ok(n) => break n,
                        Err(_) => break 0,
                    }
                };
                frame.clear();
                if n == 0 {
                    frame.extend_from_slice(b"E\n");
                } else {
                    frame.extend_from_slice(format!("D{n}\n").as_bytes());
                    frame.extend_from_slice(&buf[..n]);
                }
                if !send(&pipe, &closed, &frame) || n == 0 {
                    return;
                }
            }
        })?;
        Ok(())
    }
}

/// Writes `frame` on the shared pipe unless the link was closed; whether it went. Closes
/// the pipe itself when the link was closed meanwhile (the owner could not take the lock).
fn send(pipe: &Mutex<Option<ChildStdin>>, closed: &AtomicBool, frame: &[u8]) -> bool {
    let close = |g: &mut Option<ChildStdin>| {
        g.take();
        false
    };
    let Ok(mut g) = pipe.lock() else { return false };
    if closed.load(Ordering::SeqCst) {
        return close(&mut g);
    }
    let ok = match g.as_mut() {
        Some(w) => w.write_all(frame).is_ok(),
        None => false,
    };
    drop(g);
    // The owner sets `closed` before it tries the lock: if it tried while we held it, we see
    // the flag now and close the pipe for it.
    if closed.load(Ordering::SeqCst) {
        if let Ok(mut g) = pipe.lock() {
            return close(&mut g);
        }
    }
    ok
}

impl Drop for Link {
    fn drop(&mut self) {
        self.closed.store(true, Ordering::SeqCst);
        if let Ok(mut g) = self.pipe.try_lock() {
            g.take();
        }
    }
}

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
        use std::process::{Command, Stdio};
        // Exit status passes through, the secret arrives from stdin.
        let mut c = Command::new("sh")
            .args(["-c", REMOTE_WRAPPER, "w", "X=1", "sh", "-c", "test \"$TMPI_JOB_SECRET$X\" = abc1 && exit 7"])
            .stdin(Stdio::piped())
            .spawn()
            .unwrap();
        let link = Link::new(c.stdin.take().unwrap(), "abc", false).unwrap();
        assert_eq!(c.wait().unwrap().code(), Some(7));
        drop(link);
        // A rank that would run for long ends soon after the link closes.
        let mut c = Command::new("sh").args(["-c", REMOTE_WRAPPER, "w", "sleep", "60"]).stdin(Stdio::piped()).spawn().unwrap();
        let link = Link::new(c.stdin.take().unwrap(), "abc", false).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(200));
        let t = std::time::Instant::now();
        drop(link);
        let st = c.wait().unwrap();
        assert!(!st.success());
        assert!(t.elapsed() < std::time::Duration::from_secs(20), "{:?}", t.elapsed());
    }

    /// Runs `prog` under the wrapper as rank 0 with `input` as tmpirun's stdin, `path` as
    /// PATH; its stdout.
    fn rank0_reads(input: Vec<u8>, prog: &str, path: &str) -> Vec<u8> {
        use std::process::{Command, Stdio};
        let mut c = Command::new("sh")
            .args(["-c", REMOTE_WRAPPER, "w", "sh", "-c", prog])
            .env("PATH", path)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let link = Link::new(c.stdin.take().unwrap(), "abc", true).unwrap();
        link.forward_stdin(std::io::Cursor::new(input)).unwrap();
        let out = c.wait_with_output().unwrap();
        assert!(out.status.success(), "{:?}", out.status);
        drop(link);
        out.stdout
    }

    #[test]
    fn rank_0_gets_the_stdin_of_tmpirun_and_its_end() {
        let path = std::env::var("PATH").unwrap_or_else(|_| "/usr/bin:/bin".into());
        // Binary data of several frames, then end of file (cat returns: the rank is not
        // killed for it, and the link stays open until it is dropped).
        let data: Vec<u8> = (0..300_000u32).map(|i| (i * 7 % 251) as u8).collect();
        assert_eq!(rank0_reads(data.clone(), "cat; echo end", &path), [&data[..], b"end\n"].concat());
        assert_eq!(rank0_reads(Vec::new(), "cat; echo end", &path), b"end\n");
        // Without GNU head (a `head` that fails first in PATH), the POSIX fallback.
        let dir = std::env::temp_dir().join(format!("tmpi-nohead-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let fake = dir.join("head");
        std::fs::write(&fake, "#!/bin/sh\nexit 1\n").unwrap();
        std::fs::set_permissions(&fake, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        let small: Vec<u8> = b"line one\nline two\n\0binary\xff".to_vec();
        let got = rank0_reads(small.clone(), "cat; echo end", &format!("{}:{path}", dir.display()));
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(got, [&small[..], b"end\n"].concat());
    }

    #[test]
    fn plain_ssh_gets_liveness_options_for_the_peer_timeout() {
        let t = |s| Some(Duration::from_secs(s));
        let alive = |i: &str| ["ssh", "-x", "-o", "BatchMode=yes", "-o", i, "-o", "ServerAliveCountMax=3"].map(String::from).to_vec();
        assert_eq!(agent_for(Some("ssh"), t(20)).unwrap(), alive("ServerAliveInterval=10"));
        assert_eq!(agent_for(Some("ssh"), t(3)).unwrap(), alive("ServerAliveInterval=2"));
        assert_eq!(agent_for(Some("ssh"), t(1)).unwrap(), alive("ServerAliveInterval=1"));
        assert_eq!(agent_for(Some("ssh"), None).unwrap(), ["ssh", "-x", "-o", "BatchMode=yes"]);
        // An agent the user spelled out keeps exactly their words.
        assert_eq!(agent_for(Some("ssh -p 2222"), t(20)).unwrap(), ["ssh", "-p", "2222"]);
        assert_eq!(agent_for(Some("ip netns exec ns1"), t(20)).unwrap(), ["ip", "netns", "exec", "ns1"]);
    }

    #[test]
    fn hostfiles_are_bounded() {
        let e = read_hostfile(Path::new("/dev/zero")).unwrap_err().to_string();
        assert!(e.contains("/dev/zero") && e.contains("larger than 4 MiB"), "{e}");
        let dir = std::env::temp_dir().join(format!("tmpi-hostfile-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("hf");
        std::fs::write(&f, format!("h1 slots=2\n{}\n", "h".repeat(MAX_HOSTFILE_LINE + 1))).unwrap();
        let text = read_hostfile(&f).unwrap();
        let e = parse_hostfile(&f, &text).unwrap_err().to_string();
        assert!(e.contains(":2: line longer than 4096 bytes") && e.len() < 300, "{e}");
        std::fs::write(&f, b"h1\n\0\0\n").unwrap();
        let e = read_hostfile(&f).unwrap_err().to_string();
        assert!(e.contains("not a text file (a NUL byte at offset 3)"), "{e}");
        std::fs::write(&f, b"h1 \xff\n").unwrap();
        assert!(read_hostfile(&f).unwrap_err().to_string().contains("not UTF-8"));
        std::fs::write(&f, "h1 slots=2\nh2\n").unwrap();
        assert_eq!(parse_hostfile(&f, &read_hostfile(&f).unwrap()).unwrap().len(), 2);
        let e = read_hostfile(&dir.join("missing")).unwrap_err().to_string();
        assert!(e.starts_with("--hostfile ") && e.contains("missing"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Issue 55 item 6: an agent that runs the wrapper on this machine puts it in the agent's
    /// process group, which tmpirun signals (SIGTERM, then SIGKILL) as it closes the link: the
    /// watchdog must survive that and kill the rank, which runs in a session of its own.
    #[test]
    fn the_watchdog_outlives_the_signals_to_the_agents_group() {
        use std::os::unix::process::CommandExt;
        use std::process::{Command, Stdio};
        for rank0 in [false, true] {
            let dir = std::env::temp_dir().join(format!("tmpi-watchdog-{}-{rank0}", std::process::id()));
            std::fs::create_dir_all(&dir).unwrap();
            let pidfile = dir.join("pid");
            let script = format!("echo $$ > {}; exec sleep 60", pidfile.display());
            let mut c = Command::new("sh")
                .args(["-c", REMOTE_WRAPPER, "w", "sh", "-c", &script])
                .stdin(Stdio::piped())
                .process_group(0)
                .spawn()
                .unwrap();
            let group = c.id() as i32;
            let link = Link::new(c.stdin.take().unwrap(), "abc", rank0).unwrap();
            let rank = rank_and_watchdog_up(&pidfile);
            // As tmpirun ends a job: the link closes, the group gets SIGTERM, then SIGKILL.
            drop(link);
            // SAFETY: kill(2) has no memory effects; `group` is the wrapper's own new group.
            unsafe { libc::kill(-group, libc::SIGTERM) };
            std::thread::sleep(std::time::Duration::from_millis(300));
            // SAFETY: as above.
            unsafe { libc::kill(-group, libc::SIGKILL) };
            let _ = c.wait();
            let left = outlives(rank, std::time::Duration::from_secs(20));
            if left {
                // SAFETY: as above; the rank this test started.
                unsafe { libc::kill(rank, libc::SIGKILL) };
            }
            let _ = std::fs::remove_dir_all(&dir);
            assert!(!left, "rank 0: {rank0}: the rank (pid {rank}) outlived its job");
        }
    }

    /// Waits (at most 20 s each) until the rank has written its pid to `pidfile` and its
    /// watchdog runs; returns the rank's pid.
    fn rank_and_watchdog_up(pidfile: &std::path::Path) -> i32 {
        let t = std::time::Instant::now();
        let rank = loop {
            if let Some(p) = std::fs::read_to_string(pidfile).ok().and_then(|s| s.trim().parse::<i32>().ok()) {
                break p;
            }
            assert!(t.elapsed() < std::time::Duration::from_secs(20), "the rank never started");
            std::thread::sleep(std::time::Duration::from_millis(10));
        };
        // The wrapper starts the watchdog just after the rank: wait for it (its command line
        // names the rank's pid; `setsid` has made its session by the time `sh` runs it), or a
        // loaded host can deliver the signals before it exists.
        let mark = format!("\0tmpi-watchdog\0{rank}\0");
        let watchdog_up = || {
            std::fs::read_dir("/proc")
                .into_iter()
                .flatten()
                .flatten()
                .any(|e| std::fs::read(e.path().join("cmdline")).is_ok_and(|c| String::from_utf8_lossy(&c).contains(&mark)))
        };
        while !watchdog_up() {
            assert!(t.elapsed() < std::time::Duration::from_secs(20), "the watchdog never started");
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        rank
    }

    /// Whether process `pid` (not a child of this one) is still alive after `limit`: gone
    /// means no such pid, or a zombie no one reaps (which `kill` still finds: read its state).
    fn outlives(pid: i32, limit: std::time::Duration) -> bool {
        let t = std::time::Instant::now();
        let alive = || std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| !s.contains(") Z"));
        while alive() && t.elapsed() < limit {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        alive()
    }
}
