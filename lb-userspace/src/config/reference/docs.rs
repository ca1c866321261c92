//! What each key means: the words the reference shows beside what the reader's own calls say
//! (type, default, range). A test fails when this list and the reader's keys differ.

use super::super::asked::Ty;

/// One key's documentation; `default` and `ty` only where the reader's call cannot say it (a
/// default that depends on other keys, a value of several shapes).
#[derive(Debug, Clone, Copy)]
pub struct Doc {
    pub path: &'static str,
    pub doc: &'static str,
    pub default: Option<&'static str>,
    pub ty: Option<Shape>,
}

/// The shapes the reader takes as a raw value and checks itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// One string, or an array of strings.
    StringOrStrings,
    /// A table of string values under names of the user's.
    StringMap,
    /// An array of status codes (integers) and `"FIRST-LAST"` ranges (strings).
    Codes,
}

impl Shape {
    pub fn ty(self) -> Ty {
        match self {
            Shape::StringOrStrings => Ty::StringOrStrings,
            Shape::StringMap => Ty::StringMap,
            Shape::Codes => Ty::Codes,
        }
    }
}

const fn d(path: &'static str, doc: &'static str) -> Doc {
    Doc {
        path,
        doc,
        default: None,
        ty: None,
    }
}

impl Doc {
    const fn default(self, default: &'static str) -> Self {
        Self {
            default: Some(default),
            ..self
        }
    }

    const fn shape(self, ty: Shape) -> Self {
        Self {
            ty: Some(ty),
            ..self
        }
    }
}

pub const DOCS: &[Doc] = &[
    d("lb", "The balancer's own settings."),
    d("service", "The virtual services, zero or more (at most `lb.max_services`)."),
    // [lb]
    d("lb.interfaces", "NICs the XDP program attaches to: at least one, 1-15 character names, no duplicates."),
    d("lb.xdp_mode", "How XDP attaches: `auto` tries native (driver) mode and falls back to `skb` (generic)."),
    d("lb.api", "The control API's listener, `IP:PORT` (an IPv6 one as `[::1]:9090`).")
        .default("127.0.0.1:9090"),
    d("lb.api_token", "Bearer token of the admin endpoints, 16-256 printable characters; `LB_API_TOKEN` in the environment overrides it. Needed for admin actions on a non-loopback `api`."),
    d("lb.pin_path", "bpffs directory of the pinned datapath (at most 200 of `A-Z a-z 0-9 - _ . /`), so a restarted daemon adopts it. Outside the host's network namespace the default gets `-netns-INODE` appended.")
        .default("/sys/fs/bpf/lb"),
    d("lb.snat_address", "Source address of forwarded flows: one address, or one per family (`[\"10.0.2.1\", \"2001:db8:2::1\"]`). Unset: the address the kernel uses towards each backend (its egress interface's).")
        .shape(Shape::StringOrStrings),
    d("lb.snat_ports", "SNAT source ports, `FIRST-LAST` within 1024-65535; keep them out of the kernel's `ip_local_port_range`.")
        .default("1024-32767"),
    d("lb.ring_size", "Maglev ring slots per service, a prime. Fixed while the datapath is loaded."),
    d("lb.max_services", "Services the maps hold, fixed at load time."),
    d("lb.max_backends", "Backends over all services the maps hold (a host:port in two services counts twice), fixed at load time."),
    d("lb.conntrack", "The connection tables' sizes and timeouts (an inline table is fine)."),
    d("lb.conntrack.size", "IPv4 flows the connection table holds (40 + 2 × 64 bytes a flow), a power of two."),
    d("lb.conntrack.ipv6_size", "IPv6 flows the IPv6 connection table holds (64 + 2 × 112 bytes a flow), a power of two."),
    d("lb.conntrack.tcp_syn_timeout", "How long a TCP flow that has not completed its handshake is kept idle."),
    d("lb.conntrack.tcp_established_timeout", "How long an established TCP flow is kept idle."),
    d("lb.conntrack.tcp_closing_timeout", "How long a TCP flow closing (a FIN one way) is kept idle."),
    d("lb.conntrack.tcp_closed_timeout", "How long a flow closed both ways (FIN each way, or RST) keeps its SNAT port; at most `tcp_closing_timeout`."),
    d("lb.conntrack.udp_timeout", "How long a UDP flow is kept idle."),
    d("lb.syn_proxy_flows", "Proxied flows (services with `syn_proxy = \"on\"`) each family's translation table holds; the least recently used go first. Fixed while running."),
    d("lb.syn_cookie_key_file", "A file holding the SYN cookie key, 32 hex digits: lb hosts behind the same routers share it, so a client's ACK validates on another host than its SYN's. Without it each daemon draws a random key at start. Read again at every reload (and runtime change): a new key in it becomes the current one and the key before it stays valid for the cookies it made, so rotate by writing the new key on every host and reloading each within a cookie's lifetime (about a minute; an ACK that reaches a host that has not reloaded yet with a new key's cookie is dropped and its client sends its SYN again). A file that cannot be read fails the reload."),
    d("lb.dsr_flood_rate", "New TCP connections a second one direct-server-return service takes into the connection table, per CPU, before flood mode (0: never): beyond it, and for a second after the rate falls back, SYNs are forwarded by Maglev without a table entry (`dsr_flood`), so a flood of spoofed SYNs cannot fill or churn the table; a client's flow gets its entry with its next packet. Fixed while running."),
    d("lb.syn_rate_per_source", "New TCP connections a second one source address may open, per CPU (0: no limit): a flooding address cannot churn the tables; beyond it SYNs are dropped (`drop_syn_rate`). A burst may pass up to a quarter of the rate more: a sketch in front of the per-source buckets lets a quiet group of sources an eighth of the rate a second without them (docs/datapath.md)."),
    d("lb.translate_icmp", "Translate ICMP errors about balanced flows (path MTU discovery through lb); false: those sent to a VIP are dropped, those sent to a SNAT address passed."),
    d("lb.icmp_reply_rate", "Echo replies of VIPs a second per CPU at most; also the budget of answers to packets too big for their path."),
    d("lb.gue_port", "UDP destination port of `forwarding = \"gue\"` (the backends decapsulate there)."),
    d("lb.announce", "Route health injection (docs/operating.md, \"Running several lb hosts\"): without it lb announces nothing. Adding or removing it needs a restart."),
    d("lb.announce.table", "The kernel routing table lb keeps the announced VIPs in; not 253-255 (the kernel's default, main and local tables). lb owns it: routes of its protocol (250) there that it does not want are removed. Not changed by a reload."),
    d("lb.announce.grace", "After withdrawing every VIP (`lb stop`), how long lb keeps forwarding before it stops."),
    // [[service]]
    d("service.name", "Unique name: 1-64 of `A-Z a-z 0-9 - _ .`."),
    d("service.vip", "`IPv4:PORT` or `[IPv6]:PORT`; the service's family (its backends and SNAT address are of it too). (vip, protocol) is unique; not loopback, 0.0.0.0/8, broadcast or multicast; an IPv6 VIP not `::`, link-local or IPv4-mapped."),
    d("service.protocol", "The transport protocol balanced."),
    d("service.forwarding", "Full NAT (`nat`), or direct server return in IP in IP (`ipip`) or GUE (`gue`); with `ipip` and `gue` the backends' ports must be the VIP's."),
    d("service.snat_address", "Overrides `lb.snat_address` for this service; with `ipip` and `gue` the outer source of the encapsulated packets."),
    d("lb.syn_proxy_engage_rate", "Services with `syn_proxy = \"auto\"`: new connections a second (SYNs of one service, all CPUs) above which the proxy engages."),
    d("lb.syn_proxy_release_rate", "Services with `syn_proxy = \"auto\"`: new connections a second below which, for `syn_proxy_release_after`, the proxy releases (at most `syn_proxy_engage_rate`)."),
    d("lb.syn_proxy_engage_half_open", "Services with `syn_proxy = \"auto\"`: half-open connections (the service's SYNs of the last `conntrack.tcp_syn_timeout` whose handshake did not complete, all CPUs) above which the proxy engages: a flood too slow for `syn_proxy_engage_rate` that would fill the connection table over the SYN timeout."),
    d("lb.syn_proxy_release_half_open", "Services with `syn_proxy = \"auto\"`: half-open connections below which, with the rate below `syn_proxy_release_rate`, for `syn_proxy_release_after`, the proxy releases (at most `syn_proxy_engage_half_open`)."),
    d("lb.syn_proxy_release_after", "Services with `syn_proxy = \"auto\"`: how long the rate and the half-open connections must stay below their release thresholds before the proxy releases."),
    d("service.syn_proxy", "`auto`: the proxy engages while the service's new connections a second are above `[lb] syn_proxy_engage_rate` or its half-open connections above `syn_proxy_engage_half_open`, and releases after `syn_proxy_release_after` below both release thresholds (each change an event; the status says whether it is engaged). `on`: lb answers every SYN itself with a SYN cookie (from XDP, taking no state); only a client that completes the handshake gets a flow, and lb then opens the connection to the backend and translates sequence numbers, SACK and timestamps for the flow's life. A flood of spoofed SYNs never reaches the tables or the backends. TCP full-NAT services only. `off`: connections go through as they come. Unsaid: `auto` for TCP full-NAT services, `off` for the others (UDP, direct server return), which cannot be proxied."),
    d("service.existing_flows", "Flows of a backend that became unavailable: `reschedule` them to another backend, or `keep` them where they are."),
    d("service.on_all_unhealthy", "New flows when no backend is available: spread over all (`use-all`), send to the first (`first`), or `drop` them."),
    d("service.answer_ping", "The VIP answers ICMP echo (services on one VIP must agree)."),
    d("service.announce", "When this service wants its VIP announced: while `healthy`, `always` or `never`. Only with `[lb.announce]`; the VIP is announced while one of its services wants it."),
    d("service.announce_min_available", "With `announce = \"healthy\"`: announced while at least this many backends take new flows (1 to the number of backends).")
        .default("1"),
    d("service.backends", "The backends, at least one (unless `backends_from` gives them)."),
    d("service.backends.address", "`IPv4:PORT` or `[IPv6]:PORT` of the VIP's family, unique in the service, not at a VIP address (its flows would come back to lb)."),
    d("service.backends.weight", "Relative weight, 0-1000; 0 drains the backend.")
        .default("1"),
    d("service.backends.server_id", "With `quic`: the server ID this backend's QUIC server writes into the connection IDs it issues (an integer that fits in `quic.server_id_bytes`, unique in the service). A backend without one gets only the flows Maglev gives it.")
        .default("none"),
    // [service.check]
    d("service.check", "The active health check; without it `tcp` for TCP services, `udp` for UDP ones (docs/health-checking.md)."),
    d("service.check.kind", "What a probe is. A check of the other protocol than the service's (tcp, tcp-connect, http(s) of a UDP service, udp of a TCP one) needs `port`.")
        .default("tcp for TCP services, udp for UDP services"),
    d("service.check.port", "Probe this port instead of the backend's.")
        .default("the backend's port"),
    d("service.check.timeout", "How long a probe waits for its answer (sub-second values from 10ms are accepted, for tests and demos)."),
    d("service.check.interval", "Probe period while the backend is available; not shorter than `timeout`."),
    d("service.check.unhealthy_interval", "Probe period while the backend is not available; not shorter than `timeout`.")
        .default("interval"),
    d("service.check.healthy_threshold", "Consecutive successes to become healthy."),
    d("service.check.unhealthy_threshold", "Consecutive failures to become unhealthy."),
    d("service.check.tcp_failures", "Refused, reset, unreachable or TLS failures in a row that eject.")
        .default("unhealthy_threshold"),
    d("service.check.timeouts", "Timeouts in a row that eject.")
        .default("unhealthy_threshold"),
    d("service.check.http_failures", "Wrong HTTP answers in a row that eject (http and https only).")
        .default("unhealthy_threshold"),
    d("service.check.send", "tcp-connect and udp: the bytes to send (udp: one datagram), 1-4096; or `send_hex`."),
    d("service.check.send_hex", "Instead of `send`: the bytes in hex (whitespace between pairs allowed), for binary protocols."),
    d("service.check.expect", "tcp-connect and udp: what the reply must hold at `expect_offset`, 1-4096 bytes; or `expect_hex`. udp needs `send`."),
    d("service.check.expect_hex", "Instead of `expect`: the bytes in hex."),
    d("service.check.expect_offset", "Where in the reply `expect` is compared."),
    d("service.check.expect_mask_hex", "One byte per expected byte: only its 1 bits are compared."),
    d("service.check.method", "http and https: the request's method."),
    d("service.check.path", "http and https: the request's absolute path, at most 2048 bytes.")
        .default("/"),
    d("service.check.host", "http and https: the Host header, at most 260 bytes; https: the SNI (an IP address is none).")
        .default("the backend's ip:port ([v6]:port)"),
    d("service.check.headers", "http and https: extra headers, at most 32 (names 1-64 of `A-Z a-z 0-9 - _`, single-line values up to 1024 bytes).")
        .shape(Shape::StringMap),
    d("service.check.status", "http and https: healthy status codes and `\"FIRST-LAST\"` ranges, at most 64.")
        .default("[\"200-399\"]")
        .shape(Shape::Codes),
    d("service.check.unhealthy_status", "http and https: codes that count as failures. With it, a code in neither set moves no counter; without it, every code outside `status` is a failure. A code may not be in both.")
        .default("every code outside status")
        .shape(Shape::Codes),
    d("service.check.verify_tls", "https: verify the certificate (webpki roots); false still encrypts."),
    d("service.check.through_tunnel", "Direct server return (`ipip`, `gue`) with kinds tcp, tcp-connect, http, https: probe the VIP on each backend through the service's tunnel, not the backend's own address."),
    // [service.passive]
    d("service.passive", "Passive checks from real traffic; without the table they are off."),
    d("service.passive.enabled", "Passive checks on, when the table is there."),
    d("service.passive.failures", "Failures within `window` (counted from the first) that eject."),
    d("service.passive.window", "The window failures are counted in."),
    d("service.passive.ejection", "How long an ejection lasts at least."),
    d("service.passive.traffic_triggered", "Probe a backend only from its first flow until `traffic_idle` after its last."),
    d("service.passive.traffic_idle", "With `traffic_triggered`: how long after a backend's last flow its probes stop."),
    d("service.passive.no_data_timeout", "TCP only: a connection whose client sent data and got none back for this long is a failure of the backend.")
        .default("off"),
    // [service.backends_from]
    d("service.backends_from", "The backends from DNS instead of (or besides) `backends` (docs/operating.md, \"Backends from DNS\")."),
    d("service.backends_from.dns", "The name (absolute: no search domain is added)."),
    d("service.backends_from.type", "`A` (IPv4 VIP), `AAAA` (IPv6 VIP) or `SRV` (each record's target, port and weight; the lowest priority's records are the backends).")
        .default("the VIP's family"),
    d("service.backends_from.port", "The backends' port (A and AAAA; not with SRV), 1-65535.")
        .default("the VIP's port"),
    d("service.backends_from.weight", "Each address's weight, 0-1000 (A and AAAA; SRV weights are the records').")
        .default("1"),
    d("service.backends_from.resolvers", "Servers asked in turn, `IP` or `IP:PORT` (UDP, TCP for truncated answers).")
        .default("/etc/resolv.conf's"),
    d("service.backends_from.refresh", "`\"ttl\"`: resolve again when the answer's smallest TTL runs out, bounded by `min_ttl` and `max_ttl`; or a duration.")
        .default("ttl"),
    d("service.backends_from.min_ttl", "The shortest TTL honoured."),
    d("service.backends_from.max_ttl", "The longest TTL honoured."),
    d("service.backends_from.timeout", "One query's wait for an answer."),
    // [service.quic]
    d("service.quic", "UDP services: route QUIC short-header packets by the server ID in their destination connection ID (QUIC-LB draft's plaintext layout), so a connection follows its client to a new address or port (docs/datapath.md, \"QUIC\")."),
    d("service.quic.server_id_bytes", "The server ID's length in bytes (the draft's server ID length)."),
    d("service.quic.cid_offset", "Where the server ID starts in the connection ID: 1 is right after the first octet, whose top three bits are the config rotation bits."),
    d("service.quic.config_id", "Route only connection IDs whose config rotation bits are this; others (and 7, \"unroutable\", always) go by the connection table and Maglev.")
        .default("any but 7"),
    d("service.backends_from.on_empty", "An answer with no address (NXDOMAIN, no record of the type): `keep_last` the addresses in use, or `apply` it."),
];
