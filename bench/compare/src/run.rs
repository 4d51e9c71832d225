//! Running one program with a time limit and collecting its output.

use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::error::Error;

/// What one finished (or stopped) program did.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// Its standard output.
    pub stdout: String,
    /// Its standard error.
    pub stderr: String,
    /// Whether it exited with status 0 within its time limit.
    pub success: bool,
    /// Its exit status, as text (`exit status: 1`, `signal: 9`, ...).
    pub status: String,
    /// Wall time from just before the start to its exit and the end of its output.
    pub elapsed: Duration,
    /// Whether it was stopped because it ran past its time limit.
    pub timed_out: bool,
}

impl Outcome {
    /// `Ok(self)` when it succeeded, else an [`Error::Run`] that quotes the end of stderr.
    ///
    /// # Errors
    /// [`Error::Run`] for a failed or stopped program.
    pub fn check(self, what: &str) -> Result<Outcome, Error> {
        if self.success {
            return Ok(self);
        }
        let why = if self.timed_out { format!("stopped after {:.0} s", self.elapsed.as_secs_f64()) } else { self.status.clone() };
        Err(Error::Run(format!("{what}: {why}{}", tail(&self.stderr, 6))))
    }
}

/// The last `n` non-empty lines of `text`, each on its own indented line.
fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    let start = lines.len().saturating_sub(n);
    lines[start..].iter().map(|l| format!("\n    {l}")).collect()
}

/// Whether programs run raised (see [`set_priority`]).
static RAISED: AtomicBool = AtomicBool::new(false);

/// From now on, [`run`] starts every program in a session of its own at the highest priority
/// this process may give: autogroup nice -20 (`/proc/self/autogroup`) and nice -20, each only
/// if permitted. On a host shared with other work (builds, other tenants' processes in their
/// own sessions), this keeps that work off the cores during a run; it cannot keep it out of
/// the shared caches. Every configuration gets the same treatment. Returns what took effect
/// for this process's children, for the report (`None` when nothing could be raised).
pub fn set_priority() -> Option<String> {
    RAISED.store(true, Ordering::Relaxed);
    // A child inherits what its parent may do: probe with a short-lived child.
    let probe = run(&["sh".into(), "-c".into(), "cat /proc/self/autogroup; nice".into()], Duration::from_secs(10)).ok()?;
    let text: Vec<&str> = probe.stdout.lines().map(str::trim).collect();
    let auto = text.first().and_then(|l| l.rsplit_once("nice ")).map(|(_, n)| n.trim().to_string());
    let nice = text.get(1).map(|n| n.to_string());
    if auto.as_deref() != Some("-20") && nice.as_deref() != Some("-20") {
        RAISED.store(false, Ordering::Relaxed);
        return None;
    }
    Some(format!(
        "every benchmark process in a session of its own, autogroup nice {}, nice {}",
        auto.unwrap_or_else(|| "?".into()),
        nice.unwrap_or_else(|| "?".into())
    ))
}

/// In a freshly forked child: a new session (and process group), then the highest priority
/// permitted. Only async-signal-safe system calls; failures are ignored (the run goes on at
/// normal priority).
fn raise_in_child() -> std::io::Result<()> {
    // SAFETY: setsid, open, write, close and setpriority are async-signal-safe system calls
    // on plain arguments and a static C string; nothing is allocated or locked in the child.
    unsafe {
        libc::setsid();
        let fd = libc::open(c"/proc/self/autogroup".as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
        if fd >= 0 {
            libc::write(fd, b"-20".as_ptr().cast(), 3);
            libc::close(fd);
        }
        libc::setpriority(libc::PRIO_PROCESS, 0, -20);
    }
    Ok(())
}

/// Runs `argv` (program first) with no standard input, in a process group of its own (a
/// session of its own after [`set_priority`]), and
/// waits for it, at most `timeout`; past that its group gets SIGTERM, and SIGKILL 5 s later
/// (so ranks that outlive a stopped launcher do not keep its output open).
///
/// # Errors
/// [`Error::Usage`] for an empty command, [`Error::Io`] when it cannot be started.
pub fn run(argv: &[String], timeout: Duration) -> Result<Outcome, Error> {
    let (prog, args) = argv.split_first().ok_or_else(|| Error::Usage("empty command".into()))?;
    let mut cmd = Command::new(prog);
    cmd.args(args).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    if RAISED.load(Ordering::Relaxed) {
        // SAFETY: `raise_in_child` makes only async-signal-safe calls (see there).
        unsafe { cmd.pre_exec(raise_in_child) };
    } else {
        cmd.process_group(0);
    }
    let t0 = Instant::now();
    let child = cmd.spawn().map_err(|e| Error::io(format!("starting {}", argv.join(" ")), e))?;
    let pid = child.id();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let r = child.wait_with_output();
        // The receiver may have given up; nothing else to do then.
        let _ = tx.send((r, Instant::now()));
    });
    let mut timed_out = false;
    let (result, end) = match rx.recv_timeout(timeout) {
        Ok(v) => v,
        Err(_) => {
            timed_out = true;
            signal(pid, libc::SIGTERM);
            match rx.recv_timeout(Duration::from_secs(5)) {
                Ok(v) => v,
                Err(_) => {
                    signal(pid, libc::SIGKILL);
                    rx.recv().map_err(|_| Error::Run(format!("lost track of {} (pid {pid})", argv.join(" "))))?
                }
            }
        }
    };
    let out = result.map_err(|e| Error::io(format!("waiting for {}", argv.join(" ")), e))?;
    Ok(Outcome {
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        success: out.status.success() && !timed_out,
        status: out.status.to_string(),
        elapsed: end.duration_since(t0),
        timed_out,
    })
}

/// Sends `sig` to the process group led by the child `pid` that this process started.
fn signal(pid: u32, sig: libc::c_int) {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return;
    };
    // SAFETY: kill(2) takes plain integers and touches no memory of ours. `-pid` names the
    // process group our child leads (`process_group(0)`, or `setsid` in `raise_in_child`); its waiting thread has not reported
    // yet, so the child is not reaped and the group id cannot have been reused.
    unsafe {
        libc::kill(-pid, sig);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sh(script: &str) -> Vec<String> {
        vec!["sh".into(), "-c".into(), script.into()]
    }

    #[test]
    fn output_and_status_are_collected() {
        let o = run(&sh("echo out; echo err >&2; exit 3"), Duration::from_secs(20));
        let o = o.map_err(|e| e.to_string());
        let Ok(o) = o else {
            panic!("sh did not run: {o:?}");
        };
        assert_eq!((o.stdout.as_str(), o.stderr.as_str()), ("out\n", "err\n"));
        assert!(!o.success && !o.timed_out);
        let e = o.check("job").map(|_| ()).map_err(|e| e.to_string());
        assert!(matches!(&e, Err(m) if m.contains("job") && m.contains("err")), "{e:?}");
    }

    #[test]
    fn a_program_past_its_limit_is_stopped() {
        let o = run(&sh("sleep 30 & sleep 30; wait"), Duration::from_millis(200)).map_err(|e| e.to_string());
        assert!(matches!(&o, Ok(o) if o.timed_out && !o.success), "{o:?}");
        assert!(matches!(&o, Ok(o) if o.elapsed < Duration::from_secs(10)), "{o:?}");
        assert!(run(&[], Duration::from_secs(1)).is_err());
        assert!(run(&["/nonexistent/prog".into()], Duration::from_secs(1)).is_err());
    }
}
