//! Which outer destinations the decapsulator opens (strict destination), and what changes in
//! its address maps to get there. Pure: the caller reads the host's addresses and the maps.

use std::{collections::BTreeSet, net::IpAddr};

use lb_common::DECAP_MAX_ADDRS;

use super::Usage;
use crate::config::host::LocalAddress;

/// The outer destinations packets are decapsulated for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Destinations {
    /// Every address of this host (all interfaces of the network namespace), as they are when
    /// `lb decap` runs.
    Host,
    /// These addresses (`--address`).
    Listed(Vec<IpAddr>),
    /// Any (`--any-destination`): strict destination off.
    Any,
}

/// The addresses the maps must hold for `destinations` (none for `Any`), sorted, each once;
/// `host` reads this host's addresses, only when they are the ones asked for.
pub fn wanted(
    destinations: &Destinations,
    host: impl FnOnce() -> anyhow::Result<Vec<LocalAddress>>,
) -> anyhow::Result<Vec<IpAddr>> {
    let addrs: BTreeSet<IpAddr> = match destinations {
        Destinations::Any => BTreeSet::new(),
        Destinations::Listed(list) => {
            for ip in list {
                if let Some(why) = unusable(*ip) {
                    return Err(Usage(format!(
                        "--address {ip}: {why}, never the destination of an outer header"
                    ))
                    .into());
                }
            }
            list.iter().copied().collect()
        }
        Destinations::Host => host()?.into_iter().map(|a| a.ip).collect(),
    };
    for (family, count) in [
        ("IPv4", addrs.iter().filter(|a| a.is_ipv4()).count()),
        ("IPv6", addrs.iter().filter(|a| a.is_ipv6()).count()),
    ] {
        if count > DECAP_MAX_ADDRS as usize {
            return Err(Usage(format!(
                "{count} {family} addresses: the decapsulator holds {DECAP_MAX_ADDRS} of each \
                 family at most (use --any-destination)"
            ))
            .into());
        }
    }
    Ok(addrs.into_iter().collect())
}

/// Why `ip` cannot be an outer destination, if it cannot.
fn unusable(ip: IpAddr) -> Option<&'static str> {
    if ip.is_unspecified() {
        Some("the unspecified address")
    } else if ip.is_multicast() {
        Some("a multicast address")
    } else if ip == IpAddr::from([255, 255, 255, 255]) {
        Some("the broadcast address")
    } else {
        None
    }
}

/// What to change in a map holding `current` so that it holds `wanted`: (remove, add). Kept
/// addresses are not touched, so packets to them are decapsulated throughout.
pub fn plan(current: &[IpAddr], wanted: &[IpAddr]) -> (Vec<IpAddr>, Vec<IpAddr>) {
    let current: BTreeSet<_> = current.iter().collect();
    let wanted: BTreeSet<_> = wanted.iter().collect();
    (
        current.difference(&wanted).map(|a| **a).collect(),
        wanted.difference(&current).map(|a| **a).collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn no_host() -> anyhow::Result<Vec<LocalAddress>> {
        panic!("the host's addresses were not asked for")
    }

    #[test]
    fn host_addresses_are_every_interfaces() {
        let host = || {
            Ok(vec![
                LocalAddress {
                    interface: "lo".into(),
                    ip: ip("127.0.0.1"),
                },
                LocalAddress {
                    interface: "eth0".into(),
                    ip: ip("2001:db8::2"),
                },
                LocalAddress {
                    interface: "eth1".into(),
                    ip: ip("127.0.0.1"),
                },
            ])
        };
        let got = wanted(&Destinations::Host, host).unwrap();
        assert_eq!(got, vec![ip("127.0.0.1"), ip("2001:db8::2")]);
    }

    #[test]
    fn listed_addresses_replace_the_hosts_and_any_needs_none() {
        let listed = Destinations::Listed(vec![ip("10.0.0.2"), ip("10.0.0.2"), ip("fd00::2")]);
        assert_eq!(
            wanted(&listed, no_host).unwrap(),
            vec![ip("10.0.0.2"), ip("fd00::2")]
        );
        assert!(wanted(&Destinations::Any, no_host).unwrap().is_empty());
    }

    #[test]
    fn unusable_addresses_are_usage_errors() {
        for bad in ["0.0.0.0", "224.0.0.1", "255.255.255.255", "::", "ff02::1"] {
            let e = wanted(&Destinations::Listed(vec![ip(bad)]), no_host).unwrap_err();
            assert!(e.is::<Usage>(), "{bad}: {e:#}");
            assert!(e.to_string().contains(bad), "{e}");
        }
    }

    #[test]
    fn too_many_addresses_of_a_family_are_refused() {
        let many = (0..=DECAP_MAX_ADDRS)
            .map(|i| IpAddr::from((0x0a00_0000 + i).to_be_bytes()))
            .collect();
        let e = wanted(&Destinations::Listed(many), no_host).unwrap_err();
        assert!(e.to_string().contains("4097 IPv4 addresses"), "{e}");
    }

    #[test]
    fn a_plan_touches_only_what_changes() {
        let (remove, add) = plan(
            &[ip("10.0.0.1"), ip("10.0.0.2"), ip("fd00::1")],
            &[ip("10.0.0.2"), ip("10.0.0.3")],
        );
        assert_eq!(remove, vec![ip("10.0.0.1"), ip("fd00::1")]);
        assert_eq!(add, vec![ip("10.0.0.3")]);
        assert_eq!(plan(&[ip("10.0.0.2")], &[ip("10.0.0.2")]), (vec![], vec![]));
    }
}
