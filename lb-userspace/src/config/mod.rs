//! The configuration: its model, and reading + validating a TOML file into it. A file either
//! yields a complete, valid [`Config`] or the list of every problem in it.

mod announce;
mod asked;
mod check;
mod diff;
pub mod discovery;
pub mod edit;
mod fields;
pub mod host;
mod payload;
mod quic;
mod read;
pub mod reference;
mod settings;

use std::{
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
    ops::RangeInclusive,
    path::{Path, PathBuf},
    time::Duration,
};

pub use announce::{
    Announce, AnnounceMode, DEFAULT_GRACE, DEFAULT_TABLE, MAX_GRACE, ServiceAnnounce,
};
pub use check::{Check, CheckKind, HttpMethod, HttpOptions, default_status};
pub use diff::{BackendChange, Diff, ServiceDiff};
pub use discovery::Discovery;
pub use fields::{Problem, parse_duration, show as show_duration};
pub use payload::Expect;
pub use quic::Quic;
pub use read::parse;
pub use settings::{FailureKind, PassiveSettings, WindowSettings};

/// The default control API listener.
pub const DEFAULT_API: &str = "127.0.0.1:9090";
/// The default bpffs directory of the pinned datapath in the host's network namespace; in any
/// other, `-netns-INODE` is appended (see [`crate::netns::default_pin_path`]).
pub const DEFAULT_PIN_PATH: &str = "/sys/fs/bpf/lb";

impl Lb {
    /// Settings that are fixed while the datapath is loaded (map sizes, ring size, program
    /// parameters, attachments): the `[lb]` keys a reload cannot change.
    pub fn fixed_differences(&self, other: &Lb) -> Vec<&'static str> {
        let mut out = Vec::new();
        let mut check = |name, same: bool| {
            if !same {
                out.push(name);
            }
        };
        check("interfaces", self.interfaces == other.interfaces);
        check("xdp_mode", self.xdp_mode == other.xdp_mode);
        check("api", self.api == other.api);
        check("api_token", self.api_token == other.api_token);
        check("pin_path", self.pin_path == other.pin_path);
        check("snat_ports", self.snat_ports == other.snat_ports);
        check("ring_size", self.ring_size == other.ring_size);
        check("max_services", self.max_services == other.max_services);
        check("max_backends", self.max_backends == other.max_backends);
        check("conntrack", self.conntrack == other.conntrack);
        check(
            "translate_icmp",
            self.translate_icmp == other.translate_icmp,
        );
        check(
            "icmp_reply_rate",
            self.icmp_reply_rate == other.icmp_reply_rate,
        );
        check("gue_port", self.gue_port == other.gue_port);
        // The datapath reads these from its parameters, fixed when the program is loaded.
        check(
            "syn_rate_per_source",
            self.syn_rate_per_source == other.syn_rate_per_source,
        );
        check(
            "dsr_flood_rate",
            self.dsr_flood_rate == other.dsr_flood_rate,
        );
        check(
            "syn_proxy_flows",
            self.syn_proxy_flows == other.syn_proxy_flows,
        );
        // BIRD's config names the table: moving lb's routes to another one while running would
        // withdraw every VIP from a BIRD still reading the old. Whether lb announces at all
        // changes with a restart too (`grace` may change: it is read when lb stops).
        match (&self.announce, &other.announce) {
            (Some(a), Some(b)) => check("announce.table", a.table == b.table),
            (a, b) => check("announce", a.is_some() == b.is_some()),
        }
        out
    }
}
impl Lb {
    /// Every `[lb]` key whose value differs (what a reload may change and what it may not).
    pub fn changed_keys(&self, other: &Lb) -> Vec<&'static str> {
        let mut out = self.fixed_differences(other);
        let mut check = |name, same: bool| {
            if !same && !out.contains(&name) {
                out.push(name);
            }
        };
        check("snat_address", self.snat_address == other.snat_address);
        check("announce", self.announce == other.announce);
        out
    }
}

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
    /// Bearer token required by the API's admin endpoints on a non-loopback listener
    /// (`LB_API_TOKEN` in the environment takes precedence).
    pub api_token: Option<String>,
    /// bpffs directory where the program and maps are pinned, so a restarted daemon adopts the
    /// running datapath (`lb run --no-pin` does not pin).
    pub pin_path: PathBuf,
    /// Source address of forwarded flows, one per family at most; none: the address the kernel
    /// would use towards each backend (its egress interface's).
    pub snat_address: SnatAddresses,
    /// SNAT source ports (keep them out of net.ipv4.ip_local_port_range).
    pub snat_ports: RangeInclusive<u16>,
    /// Slots per Maglev ring (a prime).
    pub ring_size: u32,
    /// Map sizes, fixed at load time.
    pub max_services: u32,
    pub max_backends: u32,
    pub conntrack: Conntrack,
    /// Translate ICMP errors about balanced flows (path MTU discovery through lb); off: drop
    /// those sent to a VIP, pass those sent to a SNAT address.
    pub translate_icmp: bool,
    /// ICMP echo replies per CPU per second at most (VIPs answering pings).
    pub icmp_reply_rate: u32,
    /// New TCP connections per second one source address may open (per CPU); 0: no limit.
    pub syn_rate_per_source: u32,
    /// New TCP connections per second one direct-server-return service takes into the
    /// connection table on one CPU before flood mode; 0: never.
    pub dsr_flood_rate: u32,
    /// Proxied flows each family's translation map holds (fixed at load time).
    pub syn_proxy_flows: u32,
    /// A file holding the SYN cookie key (32 hex digits), shared by every lb host behind the
    /// same routers; none: each daemon draws its own at start.
    pub syn_cookie_key_file: Option<PathBuf>,
    /// When `syn_proxy = "auto"` engages and releases.
    pub syn_proxy_auto: crate::synproxy_auto::Thresholds,
    /// UDP destination port of `gue` encapsulation (the backends decapsulate there).
    pub gue_port: u16,
    /// `[lb.announce]`: route health injection (None: lb announces nothing).
    pub announce: Option<Announce>,
}

pub const RING_SIZE_RANGE: RangeInclusive<i64> = 7..=1_048_573;
/// Ring map entries (max_services × ring_size) at most: 1 GiB of u32.
pub const MAX_RING_ENTRIES: u64 = 1 << 28;

/// `[lb] snat_address`: the SNAT address of each family's services, if set.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SnatAddresses {
    pub v4: Option<Ipv4Addr>,
    pub v6: Option<Ipv6Addr>,
}

impl SnatAddresses {
    /// The address for flows towards `backend`'s family, if one is set.
    pub fn for_family_of(&self, backend: IpAddr) -> Option<IpAddr> {
        match backend {
            IpAddr::V4(_) => self.v4.map(IpAddr::V4),
            IpAddr::V6(_) => self.v6.map(IpAddr::V6),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conntrack {
    /// IPv4 flows tracked (when a set is full, the least useful flow gives way).
    pub size: u32,
    /// IPv6 flows tracked, in tables of their own.
    pub ipv6_size: u32,
    pub tcp_syn_timeout: Duration,
    pub tcp_established_timeout: Duration,
    pub tcp_closing_timeout: Duration,
    /// How long a TCP flow closed both ways (FIN each way, or RST) keeps its SNAT port from
    /// other flows (at most `tcp_closing_timeout`).
    pub tcp_closed_timeout: Duration,
    pub udp_timeout: Duration,
}

impl Default for Conntrack {
    fn default() -> Self {
        use lb_common::ct_state;
        let p = lb_common::Params::DEFAULT;
        let t = |state| Duration::from_nanos(p.timeout(state));
        Self {
            size: lb_common::DEFAULT_CONNTRACK_SIZE,
            ipv6_size: lb_common::DEFAULT_CONNTRACK6_SIZE,
            tcp_syn_timeout: t(ct_state::TCP_SYN),
            tcp_established_timeout: t(ct_state::TCP_ESTABLISHED),
            tcp_closing_timeout: t(ct_state::TCP_CLOSING),
            tcp_closed_timeout: Duration::from_nanos(p.closed_hold_ns),
            udp_timeout: t(ct_state::UDP),
        }
    }
}

/// Whether lb's SYN proxy answers a TCP service's new connections (`syn_proxy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SynProxy {
    /// Connections go to the backends as they come (the default of UDP and direct server
    /// return services, which cannot be proxied).
    Off,
    /// Every SYN is answered by lb with a cookie; only a client that completes the handshake
    /// gets a flow and reaches a backend.
    On,
    /// On while the service's new connections a second are above `[lb]
    /// syn_proxy_engage_rate` or its half-open connections above `syn_proxy_engage_half_open`,
    /// off again after `syn_proxy_release_after` below both release thresholds (the default of
    /// TCP full-NAT services).
    Auto,
}

impl SynProxy {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Off => "off",
            Self::On => "on",
            Self::Auto => "auto",
        }
    }
}

/// What happens to a flow whose backend became unavailable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExistingFlows {
    /// Move it to an available backend (the default).
    Reschedule,
    /// Keep it where it is.
    Keep,
}

/// How a service's packets reach its backends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Forwarding {
    /// Full NAT: destination to the backend, source to lb's SNAT address; replies come back
    /// through lb (the default).
    Nat,
    /// Direct server return: the packet unchanged inside an outer IP header (IPv4-in-IPv4,
    /// IPv6-in-IPv6); the backend holds the VIP and answers the client directly.
    Ipip,
    /// Direct server return in outer IP and UDP headers (GUE variant 1) to `lb.gue_port`.
    Gue,
}

impl Forwarding {
    /// As written in the config.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Nat => "nat",
            Self::Ipip => "ipip",
            Self::Gue => "gue",
        }
    }

    /// Direct server return: no return path through lb.
    pub fn is_dsr(self) -> bool {
        self != Self::Nat
    }

    /// The datapath's backend flag of this mode.
    pub fn backend_flag(self) -> u32 {
        match self {
            Self::Nat => 0,
            Self::Ipip => lb_common::backend_flags::ENCAP_IPIP,
            Self::Gue => lb_common::backend_flags::ENCAP_GUE,
        }
    }
}

/// New flows when no backend is available.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AllUnhealthy {
    /// Spread over all backends as if they were healthy (the default: never cut traffic).
    UseAll,
    /// Everything to the first backend.
    First,
    Drop,
}

impl AllUnhealthy {
    /// As written in the config.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::UseAll => "use-all",
            Self::First => "first",
            Self::Drop => "drop",
        }
    }
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
    /// IPv4 or IPv6: the service's family, which its backends and SNAT address share.
    pub vip: SocketAddr,
    pub protocol: Protocol,
    pub backends: Vec<Backend>,
    /// Full NAT or direct server return.
    pub forwarding: Forwarding,
    /// Overrides `lb.snat_address` for this service (of the VIP's family); with direct server
    /// return, the outer source of the encapsulated packets.
    pub snat_address: Option<IpAddr>,
    pub existing_flows: ExistingFlows,
    pub syn_proxy: SynProxy,
    pub on_all_unhealthy: AllUnhealthy,
    /// The VIP answers ICMP echo requests (services sharing a VIP agree).
    pub answer_ping: bool,
    /// The active check of the backends (`[service.check]`).
    pub check: Check,
    /// Passive checks from real traffic (`[service.passive]`).
    pub passive: Passive,
    /// When its VIP is announced (None without `[lb.announce]`).
    pub announce: Option<ServiceAnnounce>,
    /// Backends from DNS (`backends_from`), merged with `backends` by the daemon.
    pub discovery: Option<Discovery>,
    /// QUIC routing by the server ID in connection IDs (UDP services).
    pub quic: Option<Quic>,
}

/// `[service.passive]`: ejection on failures seen in real traffic (SPEC §3).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Passive {
    /// On when the table is there (unless `enabled = false`).
    pub enabled: bool,
    pub settings: PassiveSettings,
    /// Probe a backend only while it has traffic: from its first flow until `traffic_idle`
    /// after its last.
    pub traffic_triggered: bool,
    pub traffic_idle: Duration,
    /// "No data back": a TCP connection whose client sent data and got none back for this long
    /// is a failure of the backend (service scope). None: off.
    pub no_data_timeout: Option<Duration>,
}

impl Default for Passive {
    /// No table: passive checks off.
    fn default() -> Self {
        Self {
            enabled: false,
            settings: Default::default(),
            traffic_triggered: false,
            traffic_idle: Duration::from_secs(30 * 60),
            no_data_timeout: None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Backend {
    pub address: SocketAddr,
    /// Relative share of new flows; 0 = drained.
    pub weight: u32,
    /// The server ID its QUIC server writes into the connection IDs it issues (services with
    /// `quic`).
    pub server_id: Option<u64>,
}

/// Every problem found in a config file.
#[derive(Debug, thiserror::Error)]
#[error("{}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("\n"))]
pub struct ConfigErrors(pub Vec<Problem>);

/// Largest config file read: room for a million backends, a bound on memory and time.
pub const MAX_FILE_BYTES: u64 = 64 << 20;

/// Reads and validates `path`.
pub fn load(path: &Path) -> Result<Config, ConfigErrors> {
    parse(text(&read_bytes(path)?)?)
}

/// The bytes of config file `path` (at most [`MAX_FILE_BYTES`]).
pub fn read_bytes(path: &Path) -> Result<Vec<u8>, ConfigErrors> {
    let problem = |message: String| {
        ConfigErrors(vec![Problem {
            path: String::new(),
            message,
        }])
    };
    let file = std::fs::File::open(path)
        .map_err(|e| problem(format!("cannot read {}: {e}", path.display())))?;
    let mut bytes = Vec::new();
    std::io::Read::read_to_end(
        &mut std::io::Read::take(file, MAX_FILE_BYTES + 1),
        &mut bytes,
    )
    .map_err(|e| problem(format!("cannot read {}: {e}", path.display())))?;
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err(problem(format!(
            "{} is larger than {} MiB",
            path.display(),
            MAX_FILE_BYTES >> 20
        )));
    }
    Ok(bytes)
}

/// Reads and validates `path` for this host: also refuses VIPs and backends that are this
/// host's own addresses ([`host::check`]). What `lb check-config` uses.
pub fn load_for_host(path: &Path) -> Result<Config, ConfigErrors> {
    parse_for_host(text(&read_bytes(path)?)?)
}

/// Validates `text` for this host, as [`load_for_host`] does a file: what `lb run`, a reload
/// and a change through the API use.
pub fn parse_for_host(text: &str) -> Result<Config, ConfigErrors> {
    let config = parse(text)?;
    let problems = match host::local_addresses() {
        Ok(local) => host::check(&config, &local),
        Err(e) => vec![Problem {
            path: String::new(),
            message: format!("cannot list this host's addresses: {e}"),
        }],
    };
    if problems.is_empty() {
        Ok(config)
    } else {
        Err(ConfigErrors(problems))
    }
}

/// The file as text: TOML is UTF-8, and the first byte that is not says where.
pub fn text(bytes: &[u8]) -> Result<&str, ConfigErrors> {
    std::str::from_utf8(bytes).map_err(|e| {
        let valid = &bytes[..e.valid_up_to()];
        // The first `valid_up_to` bytes are UTF-8 by definition.
        let valid = std::str::from_utf8(valid).unwrap_or_default();
        ConfigErrors(vec![Problem {
            path: read::location(valid, valid.len()),
            message: format!(
                "not UTF-8 (byte 0x{:02x}): TOML files are UTF-8",
                bytes[e.valid_up_to()]
            ),
        }])
    })
}
