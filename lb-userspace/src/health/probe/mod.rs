//! The probe kinds. Each takes a target and a timeout and returns a [`ProbeResult`]; the window
//! state machine and the scheduler do the rest.

pub mod http;
pub mod icmp;
pub mod quic;
pub mod tcp_connect;
pub mod tcp_syn;
pub mod tunnel;
pub mod udp;

mod link;
mod sys;

pub use super::window::ProbeResult;
pub use tunnel::Via;

/// The wildcard address of `ip`'s family, any port: where a socket towards `ip` binds.
pub fn wildcard(ip: std::net::IpAddr) -> std::net::SocketAddr {
    match ip {
        std::net::IpAddr::V4(_) => (std::net::Ipv4Addr::UNSPECIFIED, 0).into(),
        std::net::IpAddr::V6(_) => (std::net::Ipv6Addr::UNSPECIFIED, 0).into(),
    }
}
