//! Which address the TCP fabric listens on: `TMPI_TCP_IF` (an interface name or an IP
//! address), else loopback for a job on one host, else the first IPv4 address of an interface
//! that is up and not loopback. Never the wildcard address.

use std::ffi::CStr;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::error::{Error, Result};

/// `TMPI_TCP_IF`: interface name or address the TCP fabric binds to.
pub const ENV_TCP_IF: &str = "TMPI_TCP_IF";

/// One address of one interface.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IfAddr {
    /// Interface name, e.g. `eth0`.
    pub name: String,
    /// The address.
    pub ip: IpAddr,
    /// The interface is up.
    pub up: bool,
    /// The interface is loopback.
    pub loopback: bool,
}

/// The addresses of this host's interfaces (`getifaddrs`).
///
/// # Errors
/// `getifaddrs` failed.
pub fn interfaces() -> Result<Vec<IfAddr>> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs writes a list head into `head`; it is freed below with freeifaddrs.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return Err(Error::last_os("getifaddrs"));
    }
    let mut out = Vec::new();
    let mut cur = head;
    while !cur.is_null() {
        // SAFETY: `cur` is a node of the list getifaddrs returned, valid until freeifaddrs.
        let ifa = unsafe { &*cur };
        cur = ifa.ifa_next;
        if ifa.ifa_addr.is_null() || ifa.ifa_name.is_null() {
            continue;
        }
        // SAFETY: ifa_name is a NUL-terminated string owned by the list.
        let name = unsafe { CStr::from_ptr(ifa.ifa_name) }.to_string_lossy().into_owned();
        // SAFETY: ifa_addr is non-null and points to a sockaddr whose family says its type.
        let family = i32::from(unsafe { (*ifa.ifa_addr).sa_family });
        let ip = match family {
            libc::AF_INET => {
                // SAFETY: family AF_INET: the sockaddr is a sockaddr_in.
                let sin = unsafe { &*ifa.ifa_addr.cast::<libc::sockaddr_in>() };
                IpAddr::V4(Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)))
            }
            libc::AF_INET6 => {
                // SAFETY: family AF_INET6: the sockaddr is a sockaddr_in6.
                let sin6 = unsafe { &*ifa.ifa_addr.cast::<libc::sockaddr_in6>() };
                IpAddr::V6(Ipv6Addr::from(sin6.sin6_addr.s6_addr))
            }
            _ => continue,
        };
        let flags = ifa.ifa_flags;
        out.push(IfAddr { name, ip, up: flags & libc::IFF_UP as u32 != 0, loopback: flags & libc::IFF_LOOPBACK as u32 != 0 });
    }
    // SAFETY: `head` came from getifaddrs and is freed once; no reference into it survives.
    unsafe { libc::freeifaddrs(head) };
    Ok(out)
}

/// The address to listen on. `tcp_if` is `TMPI_TCP_IF` (an address, or an interface name:
/// its first IPv4 address, else its first IPv6 one); unset, `single_host` jobs use loopback,
/// others the first IPv4 address of an interface that is up and not loopback.
///
/// # Errors
/// [`Error::InvalidArgument`] naming `TMPI_TCP_IF` for an interface that does not exist or has
/// no address, or when no interface fits.
pub fn listen_ip(tcp_if: Option<&str>, single_host: bool) -> Result<IpAddr> {
    match tcp_if.map(str::trim).filter(|s| !s.is_empty()) {
        Some(s) => {
            if let Ok(ip) = s.parse::<IpAddr>() {
                if ip.is_unspecified() {
                    return Err(Error::InvalidArgument(format!("{ENV_TCP_IF}={s}: the wildcard address is not allowed")));
                }
                return Ok(ip);
            }
            let all = interfaces()?;
            let mine: Vec<&IfAddr> = all.iter().filter(|a| a.name == s).collect();
            mine.iter()
                .find(|a| a.ip.is_ipv4())
                .or_else(|| mine.first())
                .map(|a| a.ip)
                .ok_or_else(|| Error::InvalidArgument(format!("{ENV_TCP_IF}={s}: no interface of that name with an address")))
        }
        None if single_host => Ok(IpAddr::V4(Ipv4Addr::LOCALHOST)),
        None => interfaces()?
            .into_iter()
            .find(|a| a.up && !a.loopback && a.ip.is_ipv4())
            .map(|a| a.ip)
            .ok_or_else(|| Error::InvalidArgument(format!("no network interface is up; set {ENV_TCP_IF}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_is_found_and_named() {
        let all = interfaces().unwrap();
        let lo = all.iter().find(|a| a.loopback && a.ip.is_ipv4()).expect("a loopback interface");
        assert_eq!(listen_ip(Some(&lo.name), false).unwrap(), lo.ip);
        assert_eq!(listen_ip(None, true).unwrap(), IpAddr::V4(Ipv4Addr::LOCALHOST));
        assert_eq!(listen_ip(Some("127.0.0.1"), false).unwrap(), IpAddr::V4(Ipv4Addr::LOCALHOST));
        let e = listen_ip(Some("no-such-if0"), false).unwrap_err().to_string();
        assert!(e.contains("TMPI_TCP_IF=no-such-if0"), "{e}");
        assert!(listen_ip(Some("0.0.0.0"), true).is_err());
    }
}
