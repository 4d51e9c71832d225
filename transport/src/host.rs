//! Which host a rank runs on: the identity that decides which ranks share memory.

/// `TMPI_NODE_ID`: the launcher's name for the host a rank runs on (optional).
pub const ENV_NODE_ID: &str = "TMPI_NODE_ID";

/// This host's identity: ranks with equal identities share memory. [`ENV_NODE_ID`] when the
/// launcher set it; else the host name and the kernel's boot id (the name alone is not
/// enough: containers and copies of one image share names).
pub fn host_id() -> String {
    if let Some(id) = std::env::var_os(ENV_NODE_ID).filter(|v| !v.is_empty()) {
        return format!("node:{}", id.to_string_lossy());
    }
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
    let mut name = [0u8; 256];
    // SAFETY: the pointer and length describe `name`, which outlives the call.
    let rc = unsafe { libc::gethostname(name.as_mut_ptr().cast(), name.len()) };
    let end = name.iter().position(|&b| b == 0).unwrap_or(name.len());
    let host = if rc == 0 { String::from_utf8_lossy(&name[..end]).into_owned() } else { String::new() };
    format!("{host}/{}", boot.trim())
}
