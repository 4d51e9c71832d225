//! Running one program with a time limit and collecting its output.

use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
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

/// Runs `argv` (program first) with no standard input, in a process group of its own, and
/// waits for it, at most `timeout`; past that its group gets SIGTERM, and SIGKILL 5 s later
/// (so ranks that outlive a stopped launcher do not keep its output open).
///
/// # Errors
/// [`Error::Usage`] for an empty command, [`Error::Io`] when it cannot be started.
pub fn run(argv: &[String], timeout: Duration) -> Result<Outcome, Error> {
    let (prog, args) = argv.split_first().ok_or_else(|| Error::Usage("empty command".into()))?;
    let mut cmd = Command::new(prog);
    cmd.args(args).process_group(0).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
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
    // process group our child leads (`process_group(0)`); its waiting thread has not reported
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
