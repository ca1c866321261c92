//! The configuration: its model, and reading + validating a TOML file into it. A file either
//! yields a complete, valid [`Config`] or the list of every problem in it.

mod fields;
mod read;

use std::{
    net::{SocketAddr, SocketAddrV4},
    path::Path,
};

pub use fields::Problem;
pub use read::parse;

/// The default control API listener.
pub const DEFAULT_API: &str = "127.0.0.1:9090";
/// Largest backend weight accepted (weights are relative; 0 drains).
pub const MAX_WEIGHT: u32 = 1000;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    pub lb: Lb,
    pub services: Vec<Service>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lb {
    /// Interfaces the XDP program is attached to.
    pub interfaces: Vec<String>,
    pub xdp_mode: XdpMode,
    /// Control API listener.
    pub api: SocketAddr,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum XdpMode {
    /// Native (driver) mode where the driver supports it, generic (skb) mode otherwise.
    Auto,
    Native,
    Skb,
}

impl XdpMode {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::Native => "native",
            Self::Skb => "skb",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Protocol {
    Tcp,
    Udp,
}

impl Protocol {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Tcp => "tcp",
            Self::Udp => "udp",
        }
    }

    /// IP protocol number.
    pub fn number(self) -> u8 {
        match self {
            Self::Tcp => lb_common::PROTO_TCP,
            Self::Udp => lb_common::PROTO_UDP,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Service {
    pub name: String,
    pub vip: SocketAddrV4,
    pub protocol: Protocol,
    pub backends: Vec<Backend>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Backend {
    pub address: SocketAddrV4,
    /// Relative share of new flows; 0 = drained.
    pub weight: u32,
}

/// Every problem found in a config file.
#[derive(Debug, thiserror::Error)]
#[error("{}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("\n"))]
pub struct ConfigErrors(pub Vec<Problem>);

/// Reads and validates `path`.
pub fn load(path: &Path) -> Result<Config, ConfigErrors> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        ConfigErrors(vec![Problem {
            path: String::new(),
            message: format!("cannot read {}: {e}", path.display()),
        }])
    })?;
    parse(&text)
}
