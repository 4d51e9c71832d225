//! A PMI-2 client: how ranks started by Slurm (`srun --mpi=pmi2`) find each other without
//! `tmpirun`.
//!
//! Slurm's `mpi/pmi2` plugin gives every task a connected socket (`PMI_FD`) and its place
//! (`PMI_RANK`, `PMI_SIZE`, `PMI_JOBID`). The wire protocol:
//!
//! - a PMI-1 style handshake, one line each way: `cmd=init pmi_version=2 pmi_subversion=0\n`,
//!   answered by `cmd=response_to_init ... rc=0\n`;
//! - then PMI-2 frames: a 6-character decimal length, left-aligned and padded with spaces,
//!   then that many bytes of `key=value;` pairs, the first being `cmd=`. A `;` inside a value
//!   is doubled. Every reply carries `rc` (0 is success) and, on failure, `errmsg`.
//!
//! The commands used here: `fullinit` (this task's rank and the job size), `job-getid` (the
//! key-value space of the job), `info-getjobattr` (for example `PMI_process_mapping`),
//! `kvs-put`, `kvs-fence` (a barrier that also publishes what was put), `kvs-get`, `abort`
//! and `finalize`. Values are stored as hex, so any bytes can be published.
//!
//! Decoding never panics: a reply that is too long, not UTF-8, not `key=value` pairs, not the
//! answer to the command sent, or missing a field is an [`Error::Bootstrap`] that says so.

use std::io::{Read, Write};
use std::os::fd::FromRawFd;
use std::os::unix::net::UnixStream;
use std::time::Duration;

use crate::error::{Error, Result};

/// `PMI_FD`: the task's connected socket to the PMI-2 server (`srun`'s step daemon).
pub const ENV_PMI_FD: &str = "PMI_FD";
/// `PMI_RANK`: the task's rank.
pub const ENV_PMI_RANK: &str = "PMI_RANK";
/// `PMI_SIZE`: number of tasks.
pub const ENV_PMI_SIZE: &str = "PMI_SIZE";
/// `PMI_JOBID`: the job step's id, as the PMI server names it.
pub const ENV_PMI_JOBID: &str = "PMI_JOBID";

/// How long a reply may take. A fence waits for the slowest task of the job to get there,
/// so it is generous; a server that never answers still ends in an error, not a hang.
const REPLY_TIMEOUT: Duration = Duration::from_secs(300);
/// Longest frame the 6-digit length field can announce.
const MAX_FRAME: usize = 999_999;
/// Longest key accepted (Slurm's limit is 64 bytes; values are limited by the frame).
const MAX_KEY: usize = 64;

/// Number of hosts a `PMI_process_mapping` value describes: `(vector,(first,hosts,ranks),...)`
/// blocks, each of `hosts` hosts; `None` if it does not parse.
pub fn mapping_nodes(m: &str) -> Option<usize> {
    let body = m.trim().strip_prefix("(vector,")?.strip_suffix(')')?;
    let mut hosts = 0usize;
    for block in body.split("),") {
        let nums: Vec<usize> =
            block.trim_matches(|c| c == '(' || c == ')').split(',').map(|n| n.trim().parse().ok()).collect::<Option<_>>()?;
        let [_, h, _] = nums[..] else { return None };
        hosts = hosts.checked_add(h)?;
    }
    Some(hosts)
}

/// A connected PMI-2 client, after `fullinit`.
#[derive(Debug)]
pub struct Pmi2Client {
    s: UnixStream,
    rank: usize,
    size: usize,
    /// The key-value space of the job (`job-getid`), named in every `kvs-get`.
    kvs: String,
}

/// One reply: its `key=value` pairs in order.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Reply(Vec<(String, String)>);

impl Reply {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }

    fn need(&self, key: &str) -> Result<&str> {
        self.get(key).ok_or_else(|| Error::Bootstrap(format!("PMI-2 reply without `{key}`")))
    }
}

/// Splits a frame body into `key=value` pairs (`;;` is a `;` inside a value).
fn parse(body: &str) -> Result<Reply> {
    let mut pairs = Vec::new();
    let mut cur = String::new();
    let mut it = body.chars().peekable();
    let mut flush = |cur: &mut String| -> Result<()> {
        if cur.is_empty() {
            return Ok(());
        }
        let (k, v) = cur.split_once('=').ok_or_else(|| Error::Bootstrap(format!("PMI-2 reply field without `=`: {cur:?}")))?;
        pairs.push((k.to_string(), v.to_string()));
        cur.clear();
        Ok(())
    };
    while let Some(c) = it.next() {
        if c == ';' {
            if it.peek() == Some(&';') {
                it.next();
                cur.push(';');
            } else {
                flush(&mut cur)?;
            }
        } else {
            cur.push(c);
        }
    }
    flush(&mut cur)?;
    Ok(Reply(pairs))
}

/// A value as it goes on the wire (`;` doubled).
fn escape(v: &str) -> String {
    v.replace(';', ";;")
}

fn check_key(key: &str) -> Result<()> {
    if key.is_empty() || key.len() > MAX_KEY || !key.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.') {
        return Err(Error::InvalidArgument(format!("PMI-2 key {key:?}: 1 to {MAX_KEY} of A-Z a-z 0-9 - _ .")));
    }
    Ok(())
}

fn hex(v: &[u8]) -> String {
    v.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if s.len() % 2 != 0 {
        return None;
    }
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok()).collect()
}

fn io_err(op: &str, e: std::io::Error) -> Error {
    if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) {
        return Error::Bootstrap(format!("the PMI-2 server did not answer {op} within {} s", REPLY_TIMEOUT.as_secs()));
    }
    Error::Io { op: format!("PMI-2 {op}"), source: e }
}

impl Pmi2Client {
    /// Connects through `PMI_FD` when the process was started by a PMI-2 launcher (Slurm's
    /// `srun --mpi=pmi2`); `None` when `PMI_FD` is not set.
    ///
    /// # Errors
    /// [`Error::Bootstrap`] for a malformed `PMI_FD`/`PMI_RANK`, or a failed handshake.
    pub fn from_env() -> Result<Option<Self>> {
        let Some(fd) = std::env::var_os(ENV_PMI_FD) else { return Ok(None) };
        let bad = |var: &str, v: &std::ffi::OsStr| Error::Bootstrap(format!("{var}={v:?} is not a number"));
        let fd: i32 = fd.to_str().and_then(|s| s.trim().parse().ok()).filter(|&fd| fd > 2).ok_or_else(|| bad(ENV_PMI_FD, &fd))?;
        let rank = std::env::var_os(ENV_PMI_RANK).unwrap_or_default();
        let rank: usize = rank.to_str().and_then(|s| s.trim().parse().ok()).ok_or_else(|| bad(ENV_PMI_RANK, &rank))?;
        let jobid = std::env::var(ENV_PMI_JOBID).unwrap_or_default();
        // The fd must be an open socket before this process takes ownership of it.
        // SAFETY: fstat only reads the descriptor's metadata into `st`.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: `st` is a valid out-pointer for the duration of the call.
        if unsafe { libc::fstat(fd, &mut st) } != 0 || st.st_mode & libc::S_IFMT != libc::S_IFSOCK {
            return Err(Error::Bootstrap(format!("{ENV_PMI_FD}={fd} is not an open socket")));
        }
        // SAFETY: the launcher handed this process the descriptor for PMI alone, it is open
        // and a socket (checked above), and nothing else in this process owns it: from here
        // on the client does (it closes it when dropped). The variable is removed below so
        // that a second `from_env` cannot take the same descriptor again.
        let s = unsafe { UnixStream::from_raw_fd(fd) };
        std::env::remove_var(ENV_PMI_FD);
        Self::connect(s, rank, &jobid).map(Some)
    }

    /// Runs the handshake and `fullinit` on a connected socket, as task `rank` of PMI job
    /// `jobid`.
    ///
    /// # Errors
    /// [`Error::Bootstrap`] if the server refuses or answers something else; I/O errors.
    pub fn connect(s: UnixStream, rank: usize, jobid: &str) -> Result<Self> {
        s.set_read_timeout(Some(REPLY_TIMEOUT)).map_err(|e| io_err("set-timeout", e))?;
        let mut c = Pmi2Client { s, rank, size: 0, kvs: String::new() };
        c.s.write_all(b"cmd=init pmi_version=2 pmi_subversion=0\n").map_err(|e| io_err("init", e))?;
        let line = c.read_line()?;
        let fields: Vec<(&str, &str)> = line.split_whitespace().filter_map(|f| f.split_once('=')).collect();
        let field = |k: &str| fields.iter().find(|(kk, _)| *kk == k).map(|(_, v)| *v);
        if field("cmd") != Some("response_to_init") || field("rc") != Some("0") || field("pmi_version") != Some("2") {
            return Err(Error::Bootstrap(format!("the PMI server does not speak PMI-2: {line:?}")));
        }
        let r = c.call("fullinit", &[("pmijobid", jobid), ("pmirank", &rank.to_string()), ("threaded", "FALSE")])?;
        let num = |k: &str| -> Result<usize> {
            r.need(k)?.parse().map_err(|_| Error::Bootstrap(format!("PMI-2 fullinit: `{k}` is not a number")))
        };
        c.size = num("size")?;
        let got = num("rank")?;
        if got != rank || c.size == 0 || rank >= c.size {
            return Err(Error::Bootstrap(format!("PMI-2 fullinit: rank {got} of {} (this task is rank {rank})", c.size)));
        }
        let r = c.call("job-getid", &[])?;
        c.kvs = r.need("jobid")?.to_string();
        Ok(c)
    }

    /// This task's rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Number of tasks.
    pub fn size(&self) -> usize {
        self.size
    }

    /// The job's key-value space id (as `job-getid` names it).
    pub fn kvs_id(&self) -> &str {
        &self.kvs
    }

    /// Publishes `value` under `key` (visible to the others after the next fence).
    ///
    /// # Errors
    /// A bad key, a refused put, I/O.
    pub fn put(&mut self, key: &str, value: &[u8]) -> Result<()> {
        check_key(key)?;
        self.call("kvs-put", &[("key", key), ("value", &hex(value))]).map(drop)
    }

    /// The value another task put under `key` before the last fence.
    ///
    /// # Errors
    /// [`Error::Bootstrap`] if no task put `key`; I/O.
    pub fn get(&mut self, key: &str) -> Result<Vec<u8>> {
        check_key(key)?;
        let kvs = self.kvs.clone();
        let r = self.call("kvs-get", &[("jobid", &kvs), ("srcid", "-1"), ("key", key)])?;
        if r.get("found") != Some("TRUE") {
            return Err(Error::Bootstrap(format!("PMI-2: no task published `{key}`")));
        }
        unhex(r.need("value")?).ok_or_else(|| Error::Bootstrap(format!("PMI-2: the value of `{key}` is not hex")))
    }

    /// Waits until every task has fenced; what was put before becomes visible.
    ///
    /// # Errors
    /// A refused fence (a task died), I/O.
    pub fn fence(&mut self) -> Result<()> {
        self.call("kvs-fence", &[]).map(drop)
    }

    /// A job attribute (`info-getjobattr`), for example `PMI_process_mapping`; `None` if the
    /// server has none.
    ///
    /// # Errors
    /// I/O, a malformed reply.
    pub fn job_attr(&mut self, key: &str) -> Result<Option<String>> {
        check_key(key)?;
        let r = self.call("info-getjobattr", &[("key", key)])?;
        Ok((r.get("found") == Some("TRUE")).then(|| r.get("value").unwrap_or_default().to_string()))
    }

    /// Asks the launcher to end the whole job (no reply is awaited: the server kills the
    /// tasks).
    ///
    /// # Errors
    /// I/O.
    pub fn abort(&mut self, code: i32, msg: &str) -> Result<()> {
        let _ = code; // PMI-2's abort carries no exit code; the launcher reports a failure.
        self.send("abort", &[("isworld", "TRUE"), ("msg", msg)])
    }

    /// Tells the server this task is done with PMI.
    ///
    /// # Errors
    /// I/O, a refused finalize.
    pub fn finalize(&mut self) -> Result<()> {
        self.call("finalize", &[]).map(drop)
    }

    fn read_line(&mut self) -> Result<String> {
        let mut line = Vec::new();
        let mut b = [0u8; 1];
        while b[0] != b'\n' {
            if line.len() > 1024 {
                return Err(Error::Bootstrap("PMI handshake line longer than 1 KiB".into()));
            }
            match self.s.read(&mut b) {
                Ok(0) => return Err(Error::Bootstrap("the PMI server closed the connection during the handshake".into())),
                Ok(_) => line.push(b[0]),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(io_err("init", e)),
            }
        }
        String::from_utf8(line).map_err(|_| Error::Bootstrap("PMI handshake line is not UTF-8".into()))
    }

    fn send(&mut self, cmd: &str, args: &[(&str, &str)]) -> Result<()> {
        let mut body = format!("cmd={cmd};");
        for (k, v) in args {
            body.push_str(k);
            body.push('=');
            body.push_str(&escape(v));
            body.push(';');
        }
        if body.len() > MAX_FRAME {
            return Err(Error::InvalidArgument(format!("PMI-2 {cmd} of {} bytes exceeds the protocol's {MAX_FRAME}", body.len())));
        }
        let frame = format!("{:<6}{body}", body.len());
        self.s.write_all(frame.as_bytes()).map_err(|e| io_err(cmd, e))
    }

    /// Sends a command and reads its reply, which must be `<cmd>-response` with `rc=0`.
    fn call(&mut self, cmd: &str, args: &[(&str, &str)]) -> Result<Reply> {
        self.send(cmd, args)?;
        let mut len = [0u8; 6];
        self.s.read_exact(&mut len).map_err(|e| io_err(cmd, e))?;
        let n: usize = std::str::from_utf8(&len)
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .ok_or_else(|| Error::Bootstrap(format!("PMI-2 reply to {cmd}: bad length field {len:?}")))?;
        let mut body = vec![0u8; n];
        self.s.read_exact(&mut body).map_err(|e| io_err(cmd, e))?;
        let body = String::from_utf8(body).map_err(|_| Error::Bootstrap(format!("PMI-2 reply to {cmd} is not UTF-8")))?;
        let r = parse(&body)?;
        let want = format!("{cmd}-response");
        if r.get("cmd") != Some(want.as_str()) {
            return Err(Error::Bootstrap(format!("PMI-2: sent {cmd}, got {body:?}")));
        }
        match r.get("rc") {
            Some("0") => Ok(r),
            _ => Err(Error::Bootstrap(format!("PMI-2 {cmd} failed: {}", r.get("errmsg").unwrap_or(&body)))),
        }
    }
}

/// A PMI-2 server for tests: serves `size` clients over socket pairs, as Slurm's step daemon
/// does (one key-value space, fences as barriers). Not part of the API.
#[doc(hidden)]
pub mod fake {
    use std::collections::HashMap;
    use std::io::{Read, Write};
    use std::os::unix::net::UnixStream;
    use std::sync::{Arc, Condvar, Mutex};
    use std::thread::JoinHandle;

    #[derive(Default)]
    struct Kvs {
        committed: HashMap<String, String>,
        pending: HashMap<String, String>,
        fenced: usize,
        epoch: u64,
        aborted: Option<String>,
    }

    /// Serves `size` tasks; returns their sockets (task `i` gets element `i`) and the server
    /// threads, which end when their task finalizes or disconnects.
    pub fn serve(size: usize) -> (Vec<UnixStream>, Vec<JoinHandle<Option<String>>>) {
        let kvs = Arc::new((Mutex::new(Kvs::default()), Condvar::new()));
        let mut clients = Vec::new();
        let mut threads = Vec::new();
        for rank in 0..size {
            let (c, s) = UnixStream::pair().expect("socketpair");
            clients.push(c);
            let kvs = kvs.clone();
            threads.push(std::thread::spawn(move || task(s, rank, size, &kvs)));
        }
        (clients, threads)
    }

    fn frame(s: &mut UnixStream, body: &str) -> Option<()> {
        s.write_all(format!("{:<6}{body}", body.len()).as_bytes()).ok()
    }

    /// A task's `kvs-fence`: waits until all `size` tasks have fenced (what they put is then
    /// committed) or the job aborted; returns the reply.
    fn fence((m, cv): &(Mutex<Kvs>, Condvar), size: usize) -> Option<String> {
        let mut g = m.lock().ok()?;
        let epoch = g.epoch;
        g.fenced += 1;
        if g.fenced == size {
            let p = std::mem::take(&mut g.pending);
            g.committed.extend(p);
            g.fenced = 0;
            g.epoch += 1;
            cv.notify_all();
        }
        while g.epoch == epoch && g.aborted.is_none() {
            g = cv.wait(g).ok()?;
        }
        Some(
            if g.aborted.is_some() { "cmd=kvs-fence-response;rc=1;errmsg=job aborted;" } else { "cmd=kvs-fence-response;rc=0;" }
                .to_string(),
        )
    }

    /// Serves one task; returns the abort message if it aborted.
    fn task(mut s: UnixStream, rank: usize, size: usize, kvs: &(Mutex<Kvs>, Condvar)) -> Option<String> {
        let mut line = Vec::new();
        let mut b = [0u8; 1];
        while b[0] != b'\n' {
            s.read_exact(&mut b).ok()?;
            line.push(b[0]);
        }
        s.write_all(b"cmd=response_to_init pmi_version=2 pmi_subversion=0 rc=0\n").ok()?;
        loop {
            let mut len = [0u8; 6];
            s.read_exact(&mut len).ok()?;
            let n: usize = std::str::from_utf8(&len).ok()?.trim().parse().ok()?;
            let mut body = vec![0u8; n];
            s.read_exact(&mut body).ok()?;
            let r = super::parse(std::str::from_utf8(&body).ok()?).ok()?;
            let cmd = r.get("cmd")?.to_string();
            let reply = match cmd.as_str() {
                "fullinit" => format!("cmd=fullinit-response;rc=0;pmi-version=2;pmi-subversion=0;rank={rank};size={size};appnum=0;"),
                "job-getid" => "cmd=job-getid-response;rc=0;jobid=fake.0;".to_string(),
                "info-getjobattr" => match r.get("key") {
                    Some("PMI_process_mapping") => format!("cmd=info-getjobattr-response;rc=0;found=TRUE;value=(vector,(0,1,{size}));"),
                    _ => "cmd=info-getjobattr-response;rc=0;found=FALSE;".to_string(),
                },
                "kvs-put" => {
                    let (k, v) = (r.get("key")?.to_string(), r.get("value")?.to_string());
                    kvs.0.lock().ok()?.pending.insert(k, v);
                    "cmd=kvs-put-response;rc=0;".to_string()
                }
                "kvs-fence" => fence(kvs, size)?,
                "kvs-get" => match kvs.0.lock().ok()?.committed.get(r.get("key")?) {
                    Some(v) => format!("cmd=kvs-get-response;rc=0;found=TRUE;value={v};"),
                    None => "cmd=kvs-get-response;rc=0;found=FALSE;".to_string(),
                },
                "abort" => {
                    let msg = r.get("msg").unwrap_or_default().to_string();
                    let (m, cv) = kvs;
                    m.lock().ok()?.aborted = Some(msg.clone());
                    cv.notify_all();
                    return Some(msg);
                }
                "finalize" => {
                    frame(&mut s, "cmd=finalize-response;rc=0;")?;
                    return None;
                }
                _ => format!("cmd={cmd}-response;rc=1;errmsg=unknown command;"),
            };
            frame(&mut s, &reply)?;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_pairs_and_escaped_semicolons() {
        let r = parse("cmd=kvs-get-response;rc=0;value=a;;b;found=TRUE;").expect("parse");
        assert_eq!(r.get("value"), Some("a;b"));
        assert_eq!(r.get("found"), Some("TRUE"));
        assert!(parse("cmd=x;novalue;").is_err());
        assert_eq!(escape("x;y"), "x;;y");
        assert_eq!(unhex(&hex(&[0, 1, 0xab, 0xff])), Some(vec![0, 1, 0xab, 0xff]));
        assert_eq!(unhex("abc"), None);
        assert_eq!(unhex("zz"), None);
    }

    #[test]
    fn process_mapping_counts_hosts() {
        assert_eq!(mapping_nodes("(vector,(0,1,4))"), Some(1));
        assert_eq!(mapping_nodes("(vector,(0,2,2))"), Some(2));
        assert_eq!(mapping_nodes("(vector,(0,2,2),(2,1,1))"), Some(3));
        assert_eq!(mapping_nodes("(vector,(0,x,2))"), None);
        assert_eq!(mapping_nodes("garbage"), None);
        assert_eq!(mapping_nodes(""), None);
    }

    #[test]
    fn tasks_exchange_values_through_a_fence() {
        let n = 3;
        let (clients, servers) = fake::serve(n);
        let tasks: Vec<_> = clients
            .into_iter()
            .enumerate()
            .map(|(rank, s)| {
                std::thread::spawn(move || -> Result<Vec<Vec<u8>>> {
                    let mut c = Pmi2Client::connect(s, rank, "fake")?;
                    assert_eq!((c.rank(), c.size(), c.kvs_id()), (rank, 3, "fake.0"));
                    assert!(c.job_attr("PMI_process_mapping")?.is_some());
                    c.put(&format!("addr-{rank}"), format!("rank {rank}; here").as_bytes())?;
                    c.fence()?;
                    let got = (0..3).map(|p| c.get(&format!("addr-{p}"))).collect::<Result<Vec<_>>>()?;
                    assert!(c.get("nobody-put-this").is_err());
                    c.finalize()?;
                    Ok(got)
                })
            })
            .collect();
        for t in tasks {
            let got = t.join().expect("task").expect("pmi");
            assert_eq!(got, (0..n).map(|p| format!("rank {p}; here").into_bytes()).collect::<Vec<_>>());
        }
        for s in servers {
            assert_eq!(s.join().expect("server"), None);
        }
    }

    /// Reads the client's handshake line.
    fn read_line(s: &mut UnixStream) {
        let mut b = [0u8; 1];
        while b[0] != b'\n' && s.read_exact(&mut b).is_ok() {}
    }

    #[test]
    fn bad_input_is_an_error() {
        let (mut clients, _servers) = fake::serve(1);
        let mut c = Pmi2Client::connect(clients.pop().expect("client"), 0, "fake").expect("connect");
        assert!(c.put("", b"x").is_err());
        assert!(c.put("has space", b"x").is_err());
        assert!(c.put(&"k".repeat(65), b"x").is_err());
        // A server that answers garbage.
        let (a, mut b) = UnixStream::pair().expect("pair");
        let t = std::thread::spawn(move || {
            read_line(&mut b);
            let _ = b.write_all(b"cmd=response_to_init pmi_version=1 rc=0\n");
        });
        assert!(matches!(Pmi2Client::connect(a, 0, "x"), Err(Error::Bootstrap(_))));
        t.join().expect("server");
        let (a, mut b) = UnixStream::pair().expect("pair");
        let t = std::thread::spawn(move || {
            read_line(&mut b);
            let _ = b.write_all(b"cmd=response_to_init pmi_version=2 pmi_subversion=0 rc=0\n");
            let mut buf = [0u8; 256];
            let _ = b.read(&mut buf);
            let _ = b.write_all(b"xx    garbage");
        });
        assert!(matches!(Pmi2Client::connect(a, 0, "x"), Err(Error::Bootstrap(_))));
        t.join().expect("server");
    }
}
