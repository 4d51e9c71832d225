//! What machine the comparison ran on.

use std::process::Command;
use std::time::{SystemTime, UNIX_EPOCH};

/// The facts printed at the top of the report.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Machine {
    /// Kernel release (`uname -r`).
    pub kernel: String,
    /// CPU model name (`/proc/cpuinfo`).
    pub cpu: String,
    /// Logical CPUs this process may run on.
    pub cores: usize,
    /// UTC date and time the run started, `YYYY-MM-DD HH:MM:SS UTC`.
    pub date: String,
    /// `/proc/loadavg`'s 1-, 5- and 15-minute load averages when the run started.
    pub load_before: String,
    /// The same when it ended.
    pub load_after: String,
    /// Version lines of the peer libraries found, and of tmpi's checkout.
    pub versions: Vec<String>,
    /// The priority every benchmark process ran at, when it was raised (see
    /// `run::set_priority`).
    pub priority: Option<String>,
}

impl Machine {
    /// Looks at this machine now (load after is filled in later by [`load_average`]).
    pub fn probe() -> Self {
        let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .map(|s| s.trim().to_string())
            .ok()
            .filter(|s| !s.is_empty())
            .or_else(|| first_line(&["uname", "-r"]))
            .unwrap_or_else(|| "unknown".into());
        let cpu = std::fs::read_to_string("/proc/cpuinfo").ok().and_then(|s| cpu_model(&s)).unwrap_or_else(|| "unknown".into());
        Machine {
            kernel,
            cpu,
            cores: std::thread::available_parallelism().map_or(0, usize::from),
            date: utc_string(SystemTime::now()),
            load_before: load_average(),
            load_after: String::new(),
            versions: Vec::new(),
            priority: None,
        }
    }
}

/// The `model name` of the first CPU in a `/proc/cpuinfo` text.
pub fn cpu_model(cpuinfo: &str) -> Option<String> {
    cpuinfo.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        (k.trim() == "model name").then(|| v.trim().to_string())
    })
}

/// The three load averages of `/proc/loadavg`, or `unknown`.
pub fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "unknown".into())
}

/// The first non-empty line `argv` prints on stdout or stderr, if it runs.
pub fn first_line(argv: &[&str]) -> Option<String> {
    let (prog, args) = argv.split_first()?;
    let out = Command::new(prog).args(args).output().ok()?;
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    text.lines().map(str::trim).find(|l| !l.is_empty()).map(str::to_string)
}

/// `t` as `YYYY-MM-DD HH:MM:SS UTC`.
pub fn utc_string(t: SystemTime) -> String {
    let secs = t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let days = i64::try_from(secs / 86_400).unwrap_or(0);
    let rem = secs % 86_400;
    let (y, m, d) = civil_from_days(days);
    format!("{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02} UTC", rem / 3600, rem % 3600 / 60, rem % 60)
}

/// (year, month, day) of the day `z` days after 1970-01-01 (proleptic Gregorian calendar).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    // d is in 1..=31 and m in 1..=12 by construction.
    (y, m as u32, d as u32)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn dates_are_utc_calendar_dates() {
        assert_eq!(utc_string(UNIX_EPOCH), "1970-01-01 00:00:00 UTC");
        let t = UNIX_EPOCH + Duration::from_secs(951_782_400 + 3661); // 2000-02-29 01:01:01
        assert_eq!(utc_string(t), "2000-02-29 01:01:01 UTC");
        let t = UNIX_EPOCH + Duration::from_secs(1_735_689_599); // 2024-12-31 23:59:59
        assert_eq!(utc_string(t), "2024-12-31 23:59:59 UTC");
    }

    #[test]
    fn cpu_model_is_read_from_cpuinfo() {
        let text = "processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 7B13\n";
        assert_eq!(cpu_model(text).as_deref(), Some("AMD EPYC 7B13"));
        assert_eq!(cpu_model("processor : 0\n"), None);
    }
}
