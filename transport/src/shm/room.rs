//! How much memory a shared-memory segment can really have, checked before it is taken.
//!
//! A segment lives in `/dev/shm`, a tmpfs: its pages are memory, charged to the memory cgroup
//! of the process that allocates them, and never swapped on a host without swap. A tmpfs is
//! often as large as the host's memory or larger, so its free space alone says little: a
//! segment that fits it can still exceed what the host has free, or the cgroup's limit, and
//! then the OOM killer, not `init`, answers. So the need is checked against each of:
//! - the free space of the file system holding the segment (`statvfs`);
//! - the host's available memory (`MemAvailable` in `/proc/meminfo`);
//! - what the memory cgroup of this process (and every cgroup above it) still allows: its
//!   limit less its usage (cgroup v2 `memory.max` and `memory.current`, v1
//!   `memory.limit_in_bytes` and `memory.usage_in_bytes`);
//! - `TMPI_SHM_LIMIT`, a cap the user sets.

use crate::error::{Error, Result};

/// The variable that caps a segment's bytes.
pub const ENV_SHM_LIMIT: &str = "TMPI_SHM_LIMIT";
/// What [`ENV_SHM_LIMIT`] accepts.
pub const EXPECT_SHM_LIMIT: &str = "bytes with an optional binary suffix k/m/g/t, or auto";

/// Parses a value of [`ENV_SHM_LIMIT`]: `None` for `auto` (or empty), bytes otherwise.
///
/// # Errors
/// [`Error::InvalidArgument`] naming the variable, for a value it does not accept.
pub fn parse_shm_limit(v: &str) -> Result<Option<u64>> {
    let t = v.trim();
    if t.is_empty() || t.eq_ignore_ascii_case("auto") {
        return Ok(None);
    }
    match crate::mr::cache::parse_size(t) {
        Some(n) if !t.eq_ignore_ascii_case("unlimited") => Ok(Some(n as u64)),
        _ => Err(Error::InvalidArgument(format!("{ENV_SHM_LIMIT}={v:?}: expected {EXPECT_SHM_LIMIT}"))),
    }
}

/// One bound on a segment's size: what it is and how many bytes it leaves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Bound {
    /// Where the figure comes from, as a user reads it ("/dev/shm has ... free").
    pub what: String,
    /// Bytes it leaves for the segment.
    pub bytes: u64,
}

/// Every bound that applies to a segment in `dir` now.
///
/// # Errors
/// A bad [`ENV_SHM_LIMIT`].
pub fn bounds(dir: &str) -> Result<Vec<Bound>> {
    let mut b = Vec::new();
    if let Some(free) = free_bytes(dir) {
        b.push(Bound { what: format!("{dir} has {free} free"), bytes: free });
    }
    if let Some(avail) = std::fs::read_to_string("/proc/meminfo").ok().and_then(|m| mem_available(&m)) {
        b.push(Bound { what: format!("the host has {avail} available (MemAvailable)"), bytes: avail });
    }
    if let Some((path, room)) = std::fs::read_to_string("/proc/self/cgroup").ok().and_then(|c| cgroup_room(&c, read_cgroup_file)) {
        b.push(Bound { what: format!("the memory cgroup {path} leaves {room}"), bytes: room });
    }
    if let Ok(v) = std::env::var(ENV_SHM_LIMIT) {
        if let Some(l) = parse_shm_limit(&v)? {
            b.push(Bound { what: format!("{ENV_SHM_LIMIT} is {l}"), bytes: l });
        }
    }
    Ok(b)
}

/// Checks `need` bytes against `bounds`.
///
/// # Errors
/// [`Error::Io`] (ENOMEM) naming the segment, the need and every bound, when one is smaller.
pub fn check(path: &str, need: u64, ranks: usize, bounds: &[Bound]) -> Result<()> {
    let Some(least) = bounds.iter().min_by_key(|b| b.bytes) else { return Ok(()) };
    if need <= least.bytes {
        return Ok(());
    }
    let all: Vec<&str> = bounds.iter().map(|b| b.what.as_str()).collect();
    let dir = path.rsplit_once('/').map_or("/dev/shm", |(d, _)| d);
    Err(Error::Io {
        op: format!(
            "allocate the shared-memory segment {path} for {ranks} ranks: it needs {need} bytes but only {} can be had ({}); \
             free memory, enlarge {dir} (e.g. `docker run --shm-size=...`) or the memory limit, run fewer ranks per host, \
             or lower TMPI_SHM_RING_SIZE",
            least.bytes,
            all.join(", ")
        ),
        source: std::io::Error::from_raw_os_error(libc::ENOMEM),
    })
}

/// Bytes free for an unprivileged user in the file system holding `dir`, if it says.
pub(crate) fn free_bytes(dir: &str) -> Option<u64> {
    let c = std::ffi::CString::new(dir).ok()?;
    let mut st = std::mem::MaybeUninit::<libc::statvfs>::zeroed();
    // SAFETY: `c` is a NUL-terminated path and `st` writable storage for one statvfs.
    if unsafe { libc::statvfs(c.as_ptr(), st.as_mut_ptr()) } != 0 {
        return None;
    }
    // SAFETY: statvfs succeeded and filled it (it was zeroed before in any case).
    let st = unsafe { st.assume_init() };
    Some(st.f_bavail.saturating_mul(st.f_frsize))
}

/// `MemAvailable` of a `/proc/meminfo` text, in bytes.
fn mem_available(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let mut it = line.split_whitespace().skip(1);
    let n: u64 = it.next()?.parse().ok()?;
    match it.next() {
        Some("kB") => n.checked_mul(1024),
        None => Some(n),
        Some(_) => None,
    }
}

/// Reads a cgroup file (`None` if it cannot be read).
fn read_cgroup_file(path: &str) -> Option<String> {
    std::fs::read_to_string(path).ok()
}

/// A cgroup's limit (a number, or `max`: none).
fn limit_of(s: &str) -> Option<u64> {
    let t = s.trim();
    // cgroup v1 reports "no limit" as a number near i64::MAX, rounded to a page.
    t.parse::<u64>().ok().filter(|&n| n < (1 << 62))
}

/// The least room any memory cgroup of this process leaves (limit less usage, over its cgroup
/// and every one above it), with the path of the cgroup that sets it, from the text of
/// `/proc/self/cgroup`; `read` reads a file of the cgroup file systems.
fn cgroup_room(self_cgroup: &str, read: impl Fn(&str) -> Option<String>) -> Option<(String, u64)> {
    let mut best: Option<(String, u64)> = None;
    for line in self_cgroup.lines() {
        let mut f = line.splitn(3, ':');
        let (Some(id), Some(ctrls), Some(path)) = (f.next(), f.next(), f.next()) else { continue };
        let (roots, limit, usage): (&[&str], &str, &str) = if id == "0" && ctrls.is_empty() {
            (&["/sys/fs/cgroup", "/sys/fs/cgroup/unified"], "memory.max", "memory.current")
        } else if ctrls.split(',').any(|c| c == "memory") {
            (&["/sys/fs/cgroup/memory"], "memory.limit_in_bytes", "memory.usage_in_bytes")
        } else {
            continue;
        };
        let mut p = path.trim_end_matches('/').to_string();
        loop {
            for root in roots {
                let dir = format!("{root}{p}");
                let Some(l) = read(&format!("{dir}/{limit}")).and_then(|s| limit_of(&s)) else { continue };
                let used = read(&format!("{dir}/{usage}")).and_then(|s| s.trim().parse::<u64>().ok()).unwrap_or(0);
                let room = l.saturating_sub(used);
                if best.as_ref().is_none_or(|(_, b)| room < *b) {
                    best = Some((if p.is_empty() { "/".to_string() } else { p.clone() }, room));
                }
            }
            match p.rfind('/') {
                Some(i) => p.truncate(i),
                None => break,
            }
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_parse() {
        for (v, want) in
            [("auto", Some(None)), ("", Some(None)), ("1m", Some(Some(1 << 20))), ("4096", Some(Some(4096))), ("2G", Some(Some(2 << 30)))]
        {
            assert_eq!(parse_shm_limit(v).ok(), want, "{v}");
        }
        for v in ["x", "1q", "-1", "unlimited"] {
            assert!(parse_shm_limit(v).is_err(), "{v}");
        }
    }

    #[test]
    fn mem_available_reads_kilobytes() {
        let m = "MemTotal:       24000000 kB\nMemFree:  100 kB\nMemAvailable:   23614240 kB\n";
        assert_eq!(mem_available(m), Some(23_614_240 * 1024));
        assert_eq!(mem_available("MemFree: 1 kB\n"), None);
        assert_eq!(mem_available("MemAvailable: x kB\n"), None);
    }

    #[test]
    fn cgroup_room_takes_the_least_over_the_hierarchy() {
        let files = |p: &str| -> Option<String> {
            Some(
                match p {
                    // v1: the job's cgroup has 1 GiB with 300 MiB used; its parent none.
                    "/sys/fs/cgroup/memory/a/b/memory.limit_in_bytes" => "1073741824\n",
                    "/sys/fs/cgroup/memory/a/b/memory.usage_in_bytes" => "314572800\n",
                    "/sys/fs/cgroup/memory/a/memory.limit_in_bytes" => "9223372036854771712\n",
                    "/sys/fs/cgroup/memory/a/memory.usage_in_bytes" => "1\n",
                    // v2: 2 GiB, nothing used, one level up 512 MiB with 12 MiB used.
                    "/sys/fs/cgroup/x/y/memory.max" => "2147483648\n",
                    "/sys/fs/cgroup/x/y/memory.current" => "0\n",
                    "/sys/fs/cgroup/x/memory.max" => "536870912\n",
                    "/sys/fs/cgroup/x/memory.current" => "12582912\n",
                    "/sys/fs/cgroup/memory.max" => "max\n",
                    _ => return None,
                }
                .to_string(),
            )
        };
        assert_eq!(cgroup_room("4:memory:/a/b\n3:cpu:/\n", files), Some(("/a/b".into(), (1 << 30) - 314_572_800)));
        assert_eq!(cgroup_room("0::/x/y\n", files), Some(("/x".into(), (512 << 20) - (12 << 20))));
        assert_eq!(cgroup_room("0::/x/y\n4:memory:/a/b\n", files).map(|r| r.1), Some((512 << 20) - (12 << 20)));
        assert_eq!(cgroup_room("0::/\n", files), None, "no limit anywhere");
        assert_eq!(cgroup_room("garbage", files), None);
    }

    #[test]
    fn the_least_bound_decides_and_every_one_is_named() {
        let b = vec![
            Bound { what: "/dev/shm has 24000 free".into(), bytes: 24_000 },
            Bound { what: "the host has 9000 available (MemAvailable)".into(), bytes: 9_000 },
        ];
        assert!(check("/dev/shm/x", 9_000, 4, &b).is_ok());
        assert!(check("/dev/shm/x", 1, 4, &[]).is_ok());
        let msg = check("/dev/shm/x", 9_001, 4, &b).unwrap_err().to_string();
        assert!(msg.contains("needs 9001 bytes") && msg.contains("only 9000") && msg.contains("/dev/shm has 24000 free"), "{msg}");
        assert!(msg.contains("MemAvailable") && msg.contains("4 ranks"), "{msg}");
    }
}
