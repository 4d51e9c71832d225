//! The topology from `/sys/devices/system/cpu` (the back-end without hwloc).

use super::Pu;

const CPU_DIR: &str = "/sys/devices/system/cpu";

/// Every online CPU with its socket and core. Values sysfs does not give are guessed
/// harmlessly: socket 0, and a core of its own. When the online list is unreadable,
/// `fallback` (the allowed CPUs) stands for it.
pub fn pus(fallback: &[usize]) -> Vec<Pu> {
    let online =
        std::fs::read_to_string(format!("{CPU_DIR}/online")).ok().and_then(|s| parse_list(s.trim())).unwrap_or_else(|| fallback.to_vec());
    let read = |cpu: usize, what: &str| -> Option<i64> {
        std::fs::read_to_string(format!("{CPU_DIR}/cpu{cpu}/topology/{what}")).ok()?.trim().parse().ok()
    };
    online
        .into_iter()
        .map(|cpu| Pu {
            cpu,
            socket: read(cpu, "physical_package_id").and_then(|s| usize::try_from(s).ok()).unwrap_or(0),
            core: read(cpu, "core_id").and_then(|c| u64::try_from(c).ok()),
        })
        .collect()
}

/// Parses a kernel CPU list such as `0-3,8,10-11`; `None` if malformed.
pub fn parse_list(s: &str) -> Option<Vec<usize>> {
    let mut out = Vec::new();
    if s.is_empty() {
        return Some(out);
    }
    for part in s.split(',') {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (usize, usize) = (a.parse().ok()?, b.parse().ok()?);
                if a > b || b - a > 1 << 16 {
                    return None;
                }
                out.extend(a..=b);
            }
            None => out.push(part.parse().ok()?),
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists_parse() {
        assert_eq!(parse_list("0-3,8,10-11"), Some(vec![0, 1, 2, 3, 8, 10, 11]));
        assert_eq!(parse_list("5"), Some(vec![5]));
        assert_eq!(parse_list(""), Some(vec![]));
        for bad in ["3-1", "a", "1,,2", "-1", "0-99999999"] {
            assert_eq!(parse_list(bad), None, "{bad}");
        }
    }

    #[test]
    fn every_allowed_cpu_is_online() {
        let allowed = crate::sys::allowed_cpus().unwrap();
        let all: Vec<usize> = pus(&[]).iter().map(|p| p.cpu).collect();
        assert!(allowed.iter().all(|c| all.contains(c)), "{allowed:?} {all:?}");
    }
}
