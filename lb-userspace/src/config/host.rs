//! What only the host can tell about a config: whether a VIP or backend is one of this host's own
//! addresses. A VIP must be routed to lb, not configured on it: the host's own service on that
//! port would be hijacked by the datapath (and its replies would bypass it). A backend on this
//! host is unreachable: the datapath forwards out of a NIC, never into the host's own stack.
//! Pure: the caller passes the addresses it read ([`local_addresses`]).

use std::net::{IpAddr, Ipv4Addr};

use super::{Config, Problem};

/// One address of this host and the interface that holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalAddress {
    pub interface: String,
    pub ip: IpAddr,
}

/// The problems of `config` on a host holding `local`.
pub fn check(config: &Config, local: &[LocalAddress]) -> Vec<Problem> {
    let holder = |ip: IpAddr| {
        local
            .iter()
            .find(|l| l.ip == ip)
            .map(|l| l.interface.as_str())
    };
    let mut out = Vec::new();
    for (i, s) in config.services.iter().enumerate() {
        if let Some(dev) = holder(s.vip.ip()) {
            out.push(Problem {
                path: format!("service[{i}].vip"),
                message: format!(
                    "{} is an address of this host (on {dev}): a VIP must be routed to lb, not \
                     configured on it, or lb takes over the host's own traffic to that port",
                    s.vip.ip()
                ),
            });
        }
        for (j, b) in s.backends.iter().enumerate() {
            if let Some(dev) = holder(b.address.ip()) {
                out.push(Problem {
                    path: format!("service[{i}].backends[{j}].address"),
                    message: format!(
                        "{} is an address of this host (on {dev}): the datapath forwards out of \
                         a NIC and cannot reach a backend on the balancer itself",
                        b.address.ip()
                    ),
                });
            }
        }
    }
    out
}

/// This network namespace's addresses (getifaddrs).
pub fn local_addresses() -> std::io::Result<Vec<LocalAddress>> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `head` with a list freed below.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let mut out = Vec::new();
    let mut cur = head;
    while !cur.is_null() {
        // SAFETY: a node of the list getifaddrs returned, alive until freeifaddrs.
        let ifa = unsafe { &*cur };
        cur = ifa.ifa_next;
        if ifa.ifa_addr.is_null() || ifa.ifa_name.is_null() {
            continue;
        }
        // SAFETY: non-null sockaddr of the family it says; a NUL-terminated name.
        let (family, name) = unsafe {
            (
                i32::from((*ifa.ifa_addr).sa_family),
                std::ffi::CStr::from_ptr(ifa.ifa_name),
            )
        };
        let ip = match family {
            libc::AF_INET => {
                // SAFETY: an AF_INET address is a sockaddr_in.
                let sin = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in) };
                IpAddr::V4(Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)))
            }
            libc::AF_INET6 => {
                // SAFETY: an AF_INET6 address is a sockaddr_in6.
                let sin6 = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in6) };
                IpAddr::V6(sin6.sin6_addr.s6_addr.into())
            }
            _ => continue,
        };
        out.push(LocalAddress {
            interface: name.to_string_lossy().into_owned(),
            ip,
        });
    }
    // SAFETY: the list from getifaddrs, freed once.
    unsafe { libc::freeifaddrs(head) };
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_vip_or_backend_on_this_host_is_refused() {
        let config = super::super::parse(
            "[lb]\ninterfaces = [\"eth1\"]\n[[service]]\nname = \"web\"\nvip = \"10.0.1.1:80\"\n\
             backends = [{ address = \"10.0.2.2:80\" }, { address = \"10.0.2.1:80\" }]\n",
        )
        .unwrap();
        let local = |dev: &str, ip: &str| LocalAddress {
            interface: dev.into(),
            ip: ip.parse().unwrap(),
        };
        let problems = check(
            &config,
            &[local("eth0", "10.0.1.1"), local("eth1", "10.0.2.1")],
        );
        let text: Vec<String> = problems.iter().map(ToString::to_string).collect();
        assert_eq!(text.len(), 2, "{text:?}");
        assert!(
            text[0].starts_with("service[0].vip: 10.0.1.1 is an address of this host (on eth0)")
        );
        assert!(text[1].starts_with(
            "service[0].backends[1].address: 10.0.2.1 is an address of this host (on eth1)"
        ));
        assert!(check(&config, &[local("lo", "127.0.0.1")]).is_empty());
    }

    #[test]
    fn this_namespace_has_addresses() {
        // Loopback at least, wherever the test runs (its address may be down: it is listed).
        let all = local_addresses().unwrap();
        assert!(all.iter().any(|a| a.interface == "lo"), "{all:?}");
    }
}
