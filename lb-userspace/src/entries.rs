//! The datapath's per-family map entries behind one type each: the balancer plans services and
//! backends of both families alike, and only the map writer picks the family's map.

use std::net::{IpAddr, SocketAddr};

use anyhow::bail;
use lb_common::{
    BackendInfo, BackendInfo6, ServiceKey, ServiceKey6, TunnelProbe, TunnelProbe6, addr6,
};

/// A service map key of either family.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AnyServiceKey {
    V4(ServiceKey),
    V6(ServiceKey6),
}

impl AnyServiceKey {
    /// The key of the service at `vip` for protocol number `proto`.
    pub fn new(vip: SocketAddr, proto: u8) -> Self {
        match vip.ip() {
            IpAddr::V4(ip) => Self::V4(ServiceKey::new(ip.octets(), vip.port(), proto)),
            IpAddr::V6(ip) => Self::V6(ServiceKey6::new(ip.octets(), vip.port(), proto)),
        }
    }
}

/// A backend map entry of either family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AnyBackend {
    V4(BackendInfo),
    V6(BackendInfo6),
}

impl AnyBackend {
    /// The entry of backend `addr` whose flows leave from `snat` (the same family), flags 0.
    pub fn new(addr: SocketAddr, snat: IpAddr, no_data_ticks: u16) -> anyhow::Result<Self> {
        let port = addr.port().to_be();
        Ok(match (addr.ip(), snat) {
            (IpAddr::V4(a), IpAddr::V4(s)) => Self::V4(BackendInfo {
                addr: u32::from_ne_bytes(a.octets()),
                snat_addr: u32::from_ne_bytes(s.octets()),
                port,
                no_data_ticks,
                flags: 0,
            }),
            (IpAddr::V6(a), IpAddr::V6(s)) => Self::V6(BackendInfo6 {
                addr: addr6(a.octets()),
                snat_addr: addr6(s.octets()),
                port,
                no_data_ticks,
                flags: 0,
            }),
            _ => bail!("SNAT address {snat} is not of the family of backend {addr}"),
        })
    }

    /// [`lb_common::backend_flags`] bits.
    pub fn flags(&self) -> u32 {
        match self {
            Self::V4(b) => b.flags,
            Self::V6(b) => b.flags,
        }
    }

    pub fn set_flags(&mut self, flags: u32) {
        match self {
            Self::V4(b) => b.flags = flags,
            Self::V6(b) => b.flags = flags,
        }
    }

    /// The SNAT address flows to this backend leave from.
    pub fn snat_ip(&self) -> IpAddr {
        match self {
            Self::V4(b) => IpAddr::V4(b.snat_addr.to_ne_bytes().into()),
            Self::V6(b) => IpAddr::V6(lb_common::addr6_octets(b.snat_addr).into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_are_of_the_address_family() {
        let v6: SocketAddr = "[2001:db8::2]:8080".parse().unwrap();
        let snat6: IpAddr = "2001:db8:2::1".parse().unwrap();
        let b = AnyBackend::new(v6, snat6, 0).unwrap();
        assert!(matches!(b, AnyBackend::V6(_)));
        assert_eq!(b.snat_ip(), snat6);
        let v4: IpAddr = "10.0.2.1".parse().unwrap();
        let err = AnyBackend::new(v6, v4, 0).unwrap_err().to_string();
        assert!(err.contains("not of the family"), "{err}");
        let AnyServiceKey::V6(k) = AnyServiceKey::new(v6, 6) else {
            panic!("an IPv6 VIP has an IPv6 key")
        };
        assert_eq!(k.port, 8080u16.to_be());
        assert_eq!(
            lb_common::addr6_octets(k.addr),
            [0x20, 1, 0xd, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2]
        );
    }
}

/// A slot of the tunnel table (health probes through the tunnel) of either family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AnyTunnel {
    V4(TunnelProbe),
    V6(TunnelProbe6),
}

impl AnyTunnel {
    /// The slot of probes to `backend` that go to `vip` there, encapsulated as `flags` say
    /// ([`lb_common::backend_flags`]'s `ENCAP_*`); the two of one family.
    pub fn new(backend: IpAddr, vip: IpAddr, flags: u32) -> anyhow::Result<Self> {
        Ok(match (backend, vip) {
            (IpAddr::V4(b), IpAddr::V4(v)) => Self::V4(TunnelProbe {
                backend: u32::from_ne_bytes(b.octets()),
                vip: u32::from_ne_bytes(v.octets()),
                flags,
            }),
            (IpAddr::V6(b), IpAddr::V6(v)) => Self::V6(TunnelProbe6 {
                backend: addr6(b.octets()),
                vip: addr6(v.octets()),
                flags,
            }),
            _ => bail!("VIP {vip} is not of the family of backend {backend}"),
        })
    }

    /// A free slot of the same family's table (its probes are dropped).
    pub fn cleared(&self) -> Self {
        match self {
            Self::V4(_) => Self::V4(TunnelProbe::default()),
            Self::V6(_) => Self::V6(TunnelProbe6::default()),
        }
    }
}
