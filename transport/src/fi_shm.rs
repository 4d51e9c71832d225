//! The regions libfabric's `shm` provider keeps in `/dev/shm`: one per endpoint, named
//! `<pid>:<domain>:<endpoint>` (decimal), unlinked when the endpoint closes, so a process
//! killed before that leaves one behind (16 MiB). Compiled in every build: `tmpirun` removes
//! a dead rank's whatever its own build, and a rank built with the feature `ofi` removes
//! stale ones under its own process id (`ofi::remove_stale_shm_regions`).

/// The process id a region named `name` belongs to, if `name` is one of the provider's.
pub fn region_owner(name: &str) -> Option<u32> {
    let mut parts = name.split(':');
    let pid = parts.next()?;
    let decimal = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    let (dom, ep) = (parts.next()?, parts.next()?);
    if parts.next().is_some() || !decimal(pid) || !decimal(dom) || !decimal(ep) {
        return None;
    }
    pid.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Table of names: the provider's shape only, the owner's process id.
    #[test]
    fn regions_are_recognised_by_shape() {
        let cases: [(&str, Option<u32>); 8] = [
            ("4242:0:1", Some(4242)),
            ("4242:12:0", Some(4242)),
            ("42420:0:1", Some(42420)),
            ("4242:0", None),
            ("4242:0:1:2", None),
            ("4242:a:1", None),
            ("tmpi-4242:0:1", None),
            (":0:1", None),
        ];
        for (name, want) in cases {
            assert_eq!(region_owner(name), want, "{name}");
        }
    }
}
