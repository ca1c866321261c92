//! TOML text → validated [`Config`], collecting every problem with its path.

use std::{
    collections::HashMap,
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
    path::PathBuf,
    time::Duration,
};

use super::{
    AllUnhealthy, Backend, Config, ConfigErrors, Conntrack, DEFAULT_API, DEFAULT_PIN_PATH,
    ExistingFlows, Forwarding, Lb, MAX_RING_ENTRIES, MAX_WEIGHT, Passive, Problem, Protocol,
    RING_SIZE_RANGE, Service, SnatAddresses, SynProxy, XdpMode,
    fields::{Fields, Problems, Shown},
};

/// Parses and validates a whole config file.
pub fn parse(text: &str) -> Result<Config, ConfigErrors> {
    let table: toml::Table = toml::from_str(text).map_err(|e| {
        // The location is the problem's path; toml's own message repeats it with the line
        // quoted, which is kept for the context.
        let at = e.span().map_or(0, |s| s.start);
        ConfigErrors(vec![Problem {
            path: location(text, at),
            message: format!("invalid TOML: {}", e.message().trim_end()),
        }])
    })?;
    let problems = Problems::default();
    let config = read_config(&table, &problems);
    let problems = problems.into_vec();
    match config {
        Some(config) if problems.is_empty() => Ok(config),
        _ => Err(ConfigErrors(problems)),
    }
}

fn read_config(table: &toml::Table, problems: &Problems) -> Option<Config> {
    let top = Fields::new(table, "", problems);
    let lb = top.required("lb", |f| f.table("lb"));
    // Whether the services may say how their VIPs are announced, whatever else [lb] holds.
    let announce_on = lb.is_some_and(|t| t.contains_key("announce"));
    let lb = lb.and_then(|t| read_lb(&Fields::new(t, "lb", problems)));
    let services: Vec<_> = top
        .tables("service")
        .into_iter()
        .map(|(i, t)| {
            read_service(
                &Fields::new(t, format!("service[{i}]"), problems),
                announce_on,
            )
        })
        .collect();
    top.finish();
    let services: Vec<Service> = services.into_iter().collect::<Option<_>>()?;
    let lb = lb?;
    check_services(&lb, &services, problems);
    Some(Config { lb, services })
}

fn read_lb(f: &Fields) -> Option<Lb> {
    let interfaces = f.required("interfaces", |f| Some(f.strings("interfaces")));
    let interfaces = interfaces.map(|list| {
        if list.is_empty() {
            f.problem("interfaces", "at least one interface is required");
        }
        let mut names: Vec<String> = Vec::new();
        for (i, name) in list {
            let key = format!("interfaces[{i}]");
            if let Err(e) = check_ifname(name) {
                f.problem(&key, e);
            } else if names.iter().any(|n| n == name) {
                f.problem(&key, format!("duplicate interface {:?}", Shown(name)));
            }
            names.push(name.to_owned());
        }
        names
    });
    let xdp_mode = f.choice(
        "xdp_mode",
        &[
            ("auto", XdpMode::Auto),
            ("native", XdpMode::Native),
            ("skb", XdpMode::Skb),
        ],
        XdpMode::Auto,
    );
    let api = match f.str("api") {
        None => DEFAULT_API.parse().ok(),
        Some(s) => s
            .parse::<SocketAddr>()
            .map_err(|_| f.problem("api", format!("expected IP:PORT, got {:?}", Shown(s))))
            .ok(),
    };
    let pin_path = match f.str("pin_path") {
        None => Some(crate::netns::default_pin_path(DEFAULT_PIN_PATH)),
        Some(s) if valid_pin_path(s) => Some(PathBuf::from(s.trim_end_matches('/'))),
        Some(s) => {
            f.problem(
                "pin_path",
                format!(
                    "expected a directory under /sys/fs/bpf/ (at most {MAX_PIN_PATH} of A-Z a-z 0-9 - _ . /), got {:?}",
                    Shown(s)
                ),
            );
            None
        }
    };
    let api_token = match f.str("api_token") {
        Some(t)
            if t.len() < 16 || t.len() > MAX_TOKEN || t.chars().any(|c| !c.is_ascii_graphic()) =>
        {
            f.problem(
                "api_token",
                format!("expected 16 to {MAX_TOKEN} printable ASCII characters without spaces"),
            );
            None
        }
        t => Some(t.map(str::to_owned)),
    };
    let snat_address = read_snat_addresses(f);
    let snat_ports = match f.str("snat_ports") {
        None => {
            let p = lb_common::Params::DEFAULT;
            Some(p.snat_port_min..=p.snat_port_min + (p.snat_port_count - 1))
        }
        Some(text) => {
            let range = text
                .split_once('-')
                .and_then(|(a, b)| {
                    Some((a.trim().parse::<u16>().ok()?, b.trim().parse::<u16>().ok()?))
                })
                .filter(|(a, b)| *a >= 1024 && a <= b);
            if range.is_none() {
                f.problem(
                    "snat_ports",
                    format!(
                        "expected FIRST-LAST within 1024-65535, got {:?}",
                        Shown(text)
                    ),
                );
            }
            range.map(|(a, b)| a..=b)
        }
    };
    let ring_size = f
        .int_in(
            "ring_size",
            RING_SIZE_RANGE,
            i64::from(lb_common::DEFAULT_RING_SIZE),
        )
        .and_then(|n| {
            let n = n as u32;
            if !crate::maglev::is_prime(n) {
                f.problem("ring_size", format!("{n} is not a prime"));
                return None;
            }
            Some(n)
        });
    let max_services = f
        .int_in(
            "max_services",
            1..=65536,
            i64::from(lb_common::DEFAULT_MAX_SERVICES),
        )
        .map(|n| n as u32);
    let max_backends = f
        .int_in(
            "max_backends",
            1..=1 << 20,
            i64::from(lb_common::DEFAULT_MAX_BACKENDS),
        )
        .map(|n| n as u32);
    if let (Some(r), Some(s)) = (ring_size, max_services)
        && u64::from(r) * u64::from(s) > MAX_RING_ENTRIES
    {
        f.problem(
            "ring_size",
            format!(
                "ring_size × max_services = {} exceeds {MAX_RING_ENTRIES}",
                u64::from(r) * u64::from(s)
            ),
        );
    }
    let conntrack = match f.table("conntrack") {
        None if f.has("conntrack") => None,
        None => Some(Conntrack::default()),
        Some(t) => read_conntrack(&Fields::new(t, f.path("conntrack"), f.problems())),
    };
    let translate_icmp = f.bool_or("translate_icmp", true);
    let icmp_reply_rate = f
        .int_in(
            "icmp_reply_rate",
            1..=1_000_000,
            i64::from(lb_common::Params::DEFAULT.icmp_reply_rate),
        )
        .map(|n| n as u32);
    let syn_rate_per_source = f
        .int_in(
            "syn_rate_per_source",
            0..=1_000_000,
            i64::from(lb_common::Params::DEFAULT.syn_rate_per_source),
        )
        .map(|n| n as u32);
    let dsr_flood_rate = f
        .int_in(
            "dsr_flood_rate",
            0..=10_000_000,
            i64::from(lb_common::Params::DEFAULT.dsr_flood_rate),
        )
        .map(|n| n as u32);
    let syn_proxy_flows = f
        .int_in(
            "syn_proxy_flows",
            1024..=(1 << 24),
            i64::from(lb_common::DEFAULT_PROXY_FLOWS),
        )
        .map(|n| n as u32);
    let syn_cookie_key_file = Some(f.str("syn_cookie_key_file").map(PathBuf::from));
    let auto = crate::synproxy_auto::Thresholds::default();
    // An engage threshold and the release threshold below it (equal at most).
    let pair = |engage: &'static str, release: &'static str, defaults: (u64, u64)| {
        let e = f.int_in(engage, 1..=100_000_000, defaults.0 as i64);
        let r = f.int_in(release, 0..=100_000_000, defaults.1 as i64);
        match (e, r) {
            (Some(e), Some(r)) if r > e => {
                f.problem(
                    release,
                    format!(
                        "{r} is above {engage} ({e}): the proxy would engage and release at once"
                    ),
                );
                None
            }
            (Some(e), Some(r)) => Some((e as u64, r as u64)),
            _ => None,
        }
    };
    let rates = pair(
        "syn_proxy_engage_rate",
        "syn_proxy_release_rate",
        (auto.engage_rate, auto.release_rate),
    );
    let half_open = pair(
        "syn_proxy_engage_half_open",
        "syn_proxy_release_half_open",
        (auto.engage_half_open, auto.release_half_open),
    );
    let release_after = f.duration(
        "syn_proxy_release_after",
        Duration::from_secs(1)..=Duration::from_secs(86400),
        auto.release_after,
    );
    let syn_proxy_auto = match (rates, half_open, release_after, &conntrack) {
        (Some((engage_rate, release_rate)), Some((eh, rh)), Some(after), Some(ct)) => {
            Some(crate::synproxy_auto::Thresholds {
                engage_rate,
                release_rate,
                engage_half_open: eh,
                release_half_open: rh,
                release_after: after,
                half_open_window: ct.tcp_syn_timeout,
            })
        }
        _ => None,
    };
    let gue_port = f
        .int_in(
            "gue_port",
            1..=65535,
            i64::from(lb_common::DEFAULT_GUE_PORT),
        )
        .map(|n| n as u16);
    let announce = match f.table("announce") {
        None if f.has("announce") => None,
        None => Some(None),
        Some(t) => {
            super::announce::read_lb_announce(&Fields::new(t, f.path("announce"), f.problems()))
                .map(Some)
        }
    };
    f.finish();
    Some(Lb {
        interfaces: interfaces?,
        xdp_mode: xdp_mode?,
        api: api?,
        api_token: api_token?,
        pin_path: pin_path?,
        snat_address: snat_address?,
        snat_ports: snat_ports?,
        ring_size: ring_size?,
        max_services: max_services?,
        max_backends: max_backends?,
        conntrack: conntrack?,
        translate_icmp: translate_icmp?,
        icmp_reply_rate: icmp_reply_rate?,
        syn_rate_per_source: syn_rate_per_source?,
        dsr_flood_rate: dsr_flood_rate?,
        syn_proxy_flows: syn_proxy_flows?,
        syn_cookie_key_file: syn_cookie_key_file?,
        syn_proxy_auto: syn_proxy_auto?,
        gue_port: gue_port?,
        announce: announce?,
    })
}

fn read_conntrack(f: &Fields) -> Option<Conntrack> {
    let d = Conntrack::default();
    let range = Duration::from_secs(1)..=Duration::from_secs(7 * 86400);
    // The tables are indexed by hash bits: powers of two.
    let power_of_two = |key: &'static str, default: u32| {
        f.int_in(key, 1024..=1 << 26, i64::from(default))
            .and_then(|n| {
                let n = n as u32;
                if !n.is_power_of_two() {
                    f.problem(
                        key,
                        format!("{n} is not a power of two (e.g. {})", n.next_power_of_two()),
                    );
                    return None;
                }
                Some(n)
            })
    };
    let size = power_of_two("size", d.size);
    let ipv6_size = power_of_two("ipv6_size", d.ipv6_size);
    let syn = f.duration("tcp_syn_timeout", range.clone(), d.tcp_syn_timeout);
    let established = f.duration(
        "tcp_established_timeout",
        range.clone(),
        d.tcp_established_timeout,
    );
    let closing = f.duration("tcp_closing_timeout", range.clone(), d.tcp_closing_timeout);
    let closed = f.duration("tcp_closed_timeout", range.clone(), d.tcp_closed_timeout);
    if let (Some(closed), Some(closing)) = (closed, closing)
        && closed > closing
    {
        f.problem(
            "tcp_closed_timeout",
            format!(
                "{} is longer than tcp_closing_timeout ({}): a closed flow leaves the table then",
                super::fields::show(closed),
                super::fields::show(closing)
            ),
        );
    }
    let udp = f.duration("udp_timeout", range, d.udp_timeout);
    f.finish();
    Some(Conntrack {
        size: size?,
        ipv6_size: ipv6_size?,
        tcp_syn_timeout: syn?,
        tcp_established_timeout: established?,
        tcp_closing_timeout: closing?,
        tcp_closed_timeout: closed?,
        udp_timeout: udp?,
    })
}

/// Longest `pin_path`: its last part names the ids file in /run/lb, which must fit a file name.
const MAX_PIN_PATH: usize = 200;
/// Longest `api_token`.
const MAX_TOKEN: usize = 256;

fn valid_pin_path(s: &str) -> bool {
    s.len() > "/sys/fs/bpf/".len()
        && s.len() <= MAX_PIN_PATH
        && s.starts_with("/sys/fs/bpf/")
        && !s.contains("..")
        && !s.contains("//")
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./".contains(c))
}

/// Why `ip` cannot be a VIP, backend or SNAT address, if it cannot.
fn unusable(ip: IpAddr) -> Option<&'static str> {
    let ip = match ip {
        IpAddr::V4(ip) => ip,
        IpAddr::V6(ip) => return unusable6(ip),
    };
    if ip.is_unspecified() || ip.octets()[0] == 0 {
        Some("is in 0.0.0.0/8 (\"this network\")")
    } else if ip.is_loopback() {
        Some("is a loopback address: the datapath never sees its traffic")
    } else if ip.is_broadcast() {
        Some("is the broadcast address")
    } else if ip.is_multicast() {
        Some("is a multicast address")
    } else {
        None
    }
}

/// Why IPv6 address `ip` cannot be a VIP, backend or SNAT address, if it cannot.
fn unusable6(ip: Ipv6Addr) -> Option<&'static str> {
    if ip.is_unspecified() {
        Some("is the unspecified address")
    } else if ip.is_loopback() {
        Some("is a loopback address: the datapath never sees its traffic")
    } else if ip.is_multicast() {
        Some("is a multicast address")
    } else if ip.is_unicast_link_local() {
        Some("is link-local (fe80::/10): it needs a zone, and lb balances routed addresses")
    } else if ip.to_ipv4_mapped().is_some() {
        Some("is an IPv4-mapped address: write the IPv4 address itself")
    } else {
        None
    }
}

/// An IP address of either family, with a message an operator can act on.
fn parse_ip(text: &str) -> Result<IpAddr, String> {
    let ip: IpAddr = text
        .parse()
        .map_err(|_| format!("invalid IP address {:?}", Shown(text)))?;
    match unusable(ip) {
        None => Ok(ip),
        Some(why) => Err(format!("{ip} {why}")),
    }
}

/// An optional IP address: `Some(None)` when absent, `None` when invalid (reported).
fn read_ip(f: &Fields, key: &'static str) -> Option<Option<IpAddr>> {
    match f.str(key) {
        // Not a string: reported.
        None if f.has(key) => None,
        None => Some(None),
        Some(text) => match parse_ip(text) {
            Ok(ip) => Some(Some(ip)),
            Err(e) => {
                f.problem(key, e);
                None
            }
        },
    }
}

/// `[lb] snat_address`: one address, or a list of one per family.
fn read_snat_addresses(f: &Fields) -> Option<SnatAddresses> {
    const KEY: &str = "snat_address";
    let texts: Option<Vec<&str>> = match f.value(KEY) {
        None => Some(Vec::new()),
        Some(v) => match (v.as_str(), v.as_array()) {
            (Some(text), _) => Some(vec![text]),
            (None, Some(list)) => list.iter().map(|v| v.as_str()).collect(),
            (None, None) => None,
        },
    };
    let Some(texts) = texts else {
        f.problem(
            KEY,
            "expected an IP address or a list of IP addresses (strings)",
        );
        return None;
    };
    let mut out = SnatAddresses::default();
    for text in texts {
        let ip = match parse_ip(text) {
            Ok(ip) => ip,
            Err(e) => {
                f.problem(KEY, e);
                return None;
            }
        };
        let taken = match ip {
            IpAddr::V4(v4) => out.v4.replace(v4).is_some(),
            IpAddr::V6(v6) => out.v6.replace(v6).is_some(),
        };
        if taken {
            f.problem(
                KEY,
                format!("{ip}: one address per family (IPv4, IPv6) at most"),
            );
            return None;
        }
    }
    Some(out)
}

fn check_ifname(name: &str) -> Result<(), String> {
    // Linux: at most IFNAMSIZ - 1 bytes, no '/', ':', whitespace or NUL, not "." or "..".
    if name.is_empty() || name.len() > 15 {
        return Err(format!(
            "invalid interface name {:?}: 1 to 15 bytes",
            Shown(name)
        ));
    }
    if name == "."
        || name == ".."
        || name.contains(['/', ':'])
        || name.contains(|c: char| c.is_whitespace() || c.is_control())
    {
        return Err(format!("invalid interface name {:?}", Shown(name)));
    }
    Ok(())
}

/// `[service.passive]` (SPEC §3).
fn read_passive(f: &Fields) -> Option<Passive> {
    let d = Passive::default();
    let enabled = f.bool_or("enabled", true);
    let failures = f.int_in("failures", 1..=1000, i64::from(d.settings.failures));
    let window = f.duration(
        "window",
        Duration::from_secs(1)..=Duration::from_secs(3600),
        d.settings.window,
    );
    let ejection = f.duration(
        "ejection",
        Duration::from_secs(1)..=Duration::from_secs(3600),
        d.settings.ejection,
    );
    let traffic_triggered = f.bool_or("traffic_triggered", false);
    let idle = f.duration(
        "traffic_idle",
        Duration::from_secs(1)..=Duration::from_secs(7 * 24 * 3600),
        d.traffic_idle,
    );
    let no_data = match f.has("no_data_timeout") {
        true => f
            .duration(
                "no_data_timeout",
                Duration::from_millis(100)..=Duration::from_secs(60),
                Duration::ZERO,
            )
            .map(Some),
        false => Some(None),
    };
    f.finish();
    Some(Passive {
        enabled: enabled?,
        settings: super::PassiveSettings {
            failures: failures? as u32,
            window: window?,
            ejection: ejection?,
        },
        traffic_triggered: traffic_triggered?,
        traffic_idle: idle?,
        no_data_timeout: no_data?,
    })
}

fn read_service(f: &Fields, announce_on: bool) -> Option<Service> {
    let name = f.required("name", |f| f.str("name")).and_then(|n| {
        let ok = !n.is_empty()
            && n.len() <= 64
            && n.chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c));
        if !ok {
            f.problem(
                "name",
                format!("invalid name {:?}: 1 to 64 of A-Z a-z 0-9 - _ .", Shown(n)),
            );
        }
        ok.then(|| n.to_owned())
    });
    let vip = f
        .required("vip", |f| f.str("vip"))
        .and_then(|s| parse_addr(s).map_err(|e| f.problem("vip", e)).ok());
    let protocol = f.choice(
        "protocol",
        &[("tcp", Protocol::Tcp), ("udp", Protocol::Udp)],
        Protocol::Tcp,
    );
    let forwarding = f.choice(
        "forwarding",
        &[
            ("nat", Forwarding::Nat),
            ("ipip", Forwarding::Ipip),
            ("gue", Forwarding::Gue),
        ],
        Forwarding::Nat,
    );
    let snat_address = read_ip(f, "snat_address");
    let existing_flows = f.choice(
        "existing_flows",
        &[
            ("reschedule", ExistingFlows::Reschedule),
            ("keep", ExistingFlows::Keep),
        ],
        ExistingFlows::Reschedule,
    );
    let syn_proxy = f.choice(
        "syn_proxy",
        &[
            ("off", SynProxy::Off),
            ("on", SynProxy::On),
            ("auto", SynProxy::Auto),
        ],
        SynProxy::Auto,
    );
    // `auto` by default where the proxy can be (TCP, full NAT); off where it cannot.
    let proxiable = protocol == Some(Protocol::Tcp) && forwarding == Some(Forwarding::Nat);
    let syn_proxy = if f.has("syn_proxy") || proxiable {
        syn_proxy
    } else {
        syn_proxy.map(|_| SynProxy::Off)
    };
    if syn_proxy.is_some_and(|p| p != SynProxy::Off) {
        if protocol == Some(Protocol::Udp) {
            f.problem("syn_proxy", "the SYN proxy is for TCP services");
        } else if forwarding.is_some_and(|fw| fw != Forwarding::Nat) {
            f.problem(
                "syn_proxy",
                "direct server return cannot be proxied (the backends answer clients past lb); its services have flood mode instead (`[lb] dsr_flood_rate`)",
            );
        }
    }
    let on_all_unhealthy = f.choice(
        "on_all_unhealthy",
        &[
            ("use-all", AllUnhealthy::UseAll),
            ("first", AllUnhealthy::First),
            ("drop", AllUnhealthy::Drop),
        ],
        AllUnhealthy::UseAll,
    );
    let answer_ping = f.bool_or("answer_ping", true);
    let check = match (f.table("check"), protocol) {
        (Some(t), Some(protocol)) => {
            super::check::read_check(&Fields::new(t, f.path("check"), f.problems()), protocol)
        }
        (None, Some(protocol)) if !f.has("check") => Some(super::Check::default_for(protocol)),
        _ => None,
    };
    let passive = match f.table("passive") {
        Some(t) => read_passive(&Fields::new(t, f.path("passive"), f.problems())),
        None if f.has("passive") => None,
        None => Some(Passive::default()),
    };
    let discovery = match f.table("backends_from") {
        Some(t) => {
            super::discovery::read(&Fields::new(t, f.path("backends_from"), f.problems()), vip)
                .map(Some)
        }
        None if f.has("backends_from") => {
            f.problem(
                "backends_from",
                "expected a table ({ dns = \"NAME\", ... })",
            );
            None
        }
        None => Some(None),
    };
    let quic = match f.table("quic") {
        Some(t) => super::quic::read(&Fields::new(t, f.path("quic"), f.problems())).map(Some),
        None if f.has("quic") => None,
        None => Some(None),
    };
    let from_dns = f.has("backends_from");
    let backends = if from_dns && !f.has("backends") {
        Some(Vec::new())
    } else {
        f.required("backends", |f| Some(f.tables("backends")))
    }
    .map(|list| {
        if list.is_empty() && !from_dns {
            f.problem("backends", "at least one backend is required");
        }
        list.into_iter()
            .map(|(i, t)| {
                read_backend(&Fields::new(
                    t,
                    f.path(&format!("backends[{i}]")),
                    f.problems(),
                ))
            })
            .collect::<Vec<_>>()
    });
    let announce =
        super::announce::read_service_announce(f, announce_on, backends.as_ref().map(Vec::len));
    f.finish();
    let backends: Vec<Backend> = backends?.into_iter().collect::<Option<_>>()?;
    let service = Service {
        name: name?,
        vip: vip?,
        protocol: protocol?,
        backends,
        forwarding: forwarding?,
        snat_address: snat_address?,
        existing_flows: existing_flows?,
        syn_proxy: syn_proxy?,
        on_all_unhealthy: on_all_unhealthy?,
        answer_ping: answer_ping?,
        check: check?,
        passive: passive?,
        announce: announce?,
        discovery: discovery?,
        quic: quic?,
    };
    check_quic(f, &service);
    if service.protocol == Protocol::Udp && service.passive.no_data_timeout.is_some() {
        f.problems().push(
            f.path("passive.no_data_timeout"),
            "only for TCP services: UDP has no connection whose answer is awaited",
        );
    }
    if service.forwarding.is_dsr() && service.passive.no_data_timeout.is_some() {
        f.problems().push(
            f.path("passive.no_data_timeout"),
            format!(
                "not with forwarding = \"{}\": the backend answers the client directly, so lb \
                 never sees data come back (direct server return's passive signal is the \
                 connect timeout)",
                service.forwarding.as_str()
            ),
        );
    }
    if service.check.through_tunnel && !service.forwarding.is_dsr() {
        f.problems().push(
            f.path("check.through_tunnel"),
            "only with direct server return (forwarding = \"ipip\" or \"gue\"): under full \
             NAT the traffic goes to the backend's own address, which the probes check already",
        );
    }
    // A service is one family, its VIP's: the datapath rewrites addresses in place.
    let vip_family = family(service.vip.ip());
    if let Some(snat) = service.snat_address
        && family(snat) != vip_family
    {
        f.problems().push(
            f.path("snat_address"),
            format!(
                "{snat} is {}, the VIP {} is {vip_family}: a service's addresses are one family",
                family(snat),
                service.vip
            ),
        );
    }
    let mut seen = HashMap::new();
    for (i, b) in service.backends.iter().enumerate() {
        let path = f.path(&format!("backends[{i}].address"));
        if family(b.address.ip()) != vip_family {
            f.problems().push(
                path,
                format!(
                    "{} is {}, the VIP {} is {vip_family}: a service balances one family \
                     (make an {} service for it)",
                    b.address,
                    family(b.address.ip()),
                    service.vip,
                    family(b.address.ip())
                ),
            );
        } else if let Some(first) = seen.insert(b.address, i) {
            f.problems()
                .push(path, format!("duplicate of backends[{first}]"));
        } else if b.address == service.vip {
            f.problems()
                .push(path, "a backend cannot be the VIP itself");
        } else if service.forwarding.is_dsr() && b.address.port() != service.vip.port() {
            f.problems().push(
                path,
                format!(
                    "port {} differs from the VIP's {}: with forwarding = \"{}\" the packet \
                     reaches the backend unchanged, on the VIP's port (write {}; probe another \
                     port with check.port)",
                    b.address.port(),
                    service.vip.port(),
                    service.forwarding.as_str(),
                    SocketAddr::new(b.address.ip(), service.vip.port())
                ),
            );
        }
    }
    Some(service)
}

fn read_backend(f: &Fields) -> Option<Backend> {
    let address = f
        .required("address", |f| f.str("address"))
        .and_then(|s| parse_addr(s).map_err(|e| f.problem("address", e)).ok());
    let weight = match f.int("weight") {
        None => Some(1),
        Some(w) if (0..=i64::from(MAX_WEIGHT)).contains(&w) => Some(w as u32),
        Some(w) => {
            f.problem("weight", format!("invalid weight {w}: 0 to {MAX_WEIGHT}"));
            None
        }
    };
    let server_id = match f.int("server_id") {
        None => Some(None),
        Some(id) if id >= 0 => Some(Some(id as u64)),
        Some(id) => {
            f.problem("server_id", format!("invalid server ID {id}: 0 or more"));
            None
        }
    };
    f.finish();
    Some(Backend {
        address: address?,
        weight: weight?,
        server_id: server_id?,
    })
}

/// A service's QUIC settings against its protocol and its backends' server IDs.
fn check_quic(f: &Fields, service: &Service) {
    let Some(quic) = service.quic else {
        for (i, b) in service.backends.iter().enumerate() {
            if b.server_id.is_some() {
                f.problems().push(
                    f.path(&format!("backends[{i}].server_id")),
                    "only in a service with `quic` (it says where the server ID is)",
                );
            }
        }
        return;
    };
    if service.protocol != Protocol::Udp {
        f.problems()
            .push(f.path("quic"), "only for UDP services: QUIC runs over UDP");
    }
    let mut seen = HashMap::new();
    for (i, b) in service.backends.iter().enumerate() {
        let Some(id) = b.server_id else { continue };
        let path = f.path(&format!("backends[{i}].server_id"));
        if id > quic.max_server_id() {
            f.problems().push(
                path,
                format!(
                    "{id} does not fit in quic.server_id_bytes = {} (at most {})",
                    quic.server_id_bytes,
                    quic.max_server_id()
                ),
            );
        } else if let Some(first) = seen.insert(id, i) {
            f.problems().push(
                path,
                format!("{id} is already backends[{first}]'s: a server ID names one backend"),
            );
        }
    }
}

/// Problems that span services: unique names and (VIP, port, protocol), map capacities.
fn check_services(lb: &Lb, services: &[Service], problems: &Problems) {
    let mut names = HashMap::new();
    let mut vips = HashMap::new();
    for (i, s) in services.iter().enumerate() {
        if let Some(first) = names.insert(s.name.as_str(), i) {
            problems.push(
                format!("service[{i}].name"),
                format!("duplicate of service[{first}] ({:?})", s.name),
            );
        }
        if let Some(first) = vips.insert((s.vip, s.protocol), i) {
            problems.push(
                format!("service[{i}].vip"),
                format!(
                    "{} {} is already service[{first}]",
                    s.vip,
                    s.protocol.as_str()
                ),
            );
        }
    }
    // A VIP answers pings or does not: its services agree.
    let mut ping: HashMap<IpAddr, (usize, bool)> = HashMap::new();
    for (i, s) in services.iter().enumerate() {
        match ping.get(&s.vip.ip()) {
            Some(&(first, answer)) if answer != s.answer_ping => problems.push(
                format!("service[{i}].answer_ping"),
                format!(
                    "{} disagrees with service[{first}] on the same VIP {}",
                    s.answer_ping,
                    s.vip.ip()
                ),
            ),
            Some(_) => {}
            None => {
                ping.insert(s.vip.ip(), (i, s.answer_ping));
            }
        }
    }
    // A backend at a VIP address would send its flows back to lb (the VIP is routed here).
    let vip_of: HashMap<IpAddr, usize> = services
        .iter()
        .enumerate()
        .rev()
        .map(|(i, s)| (s.vip.ip(), i))
        .collect();
    for (i, s) in services.iter().enumerate() {
        for (j, b) in s.backends.iter().enumerate() {
            match vip_of.get(&b.address.ip()) {
                Some(&k) if b.address != s.vip => problems.push(
                    format!("service[{i}].backends[{j}].address"),
                    format!(
                        "{} is the VIP address of service[{k}] ({:?}): flows sent there would come back to lb",
                        b.address.ip(),
                        services[k].name
                    ),
                ),
                _ => {}
            }
        }
    }
    if services.len() > lb.max_services as usize {
        problems.push(
            "service",
            format!(
                "{} services, more than lb.max_services = {}",
                services.len(),
                lb.max_services
            ),
        );
    }
    let backends: usize = services.iter().map(|s| s.backends.len()).sum();
    if backends > lb.max_backends as usize {
        problems.push(
            "service",
            format!(
                "{backends} backends in all, more than lb.max_backends = {}",
                lb.max_backends
            ),
        );
    }
}

/// "line L, column C" (1-based, columns in characters) of byte `offset` of `text`.
pub(crate) fn location(text: &str, offset: usize) -> String {
    let mut offset = offset.min(text.len());
    while !text.is_char_boundary(offset) {
        offset -= 1;
    }
    let before = &text[..offset];
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    format!("line {line}, column {column}")
}

/// `IPv4:PORT` or `[IPv6]:PORT`, with messages an operator can act on.
pub(crate) fn parse_addr(s: &str) -> Result<SocketAddr, String> {
    let (ip, port) = if let Some(rest) = s.strip_prefix('[') {
        let Some((ip, port)) = rest.split_once("]:") else {
            return Err(format!("expected [IPv6]:PORT, got {:?}", Shown(s)));
        };
        let ip: Ipv6Addr = ip
            .parse()
            .map_err(|_| format!("invalid IPv6 address {:?}", Shown(ip)))?;
        (IpAddr::V6(ip), port)
    } else {
        let Some((ip, port)) = s.rsplit_once(':') else {
            return Err(format!(
                "expected IPv4:PORT or [IPv6]:PORT, got {:?}",
                Shown(s)
            ));
        };
        if ip.contains(':') {
            return Err(format!(
                "{:?}: an IPv6 address with a port is written in brackets, [IPv6]:PORT",
                Shown(s)
            ));
        }
        let ip: Ipv4Addr = ip
            .parse()
            .map_err(|_| format!("invalid IPv4 address {:?}", Shown(ip)))?;
        (IpAddr::V4(ip), port)
    };
    let port: u16 = match port.parse::<u32>() {
        Ok(p @ 1..=65535) => p as u16,
        Ok(p) => return Err(format!("invalid port {p}")),
        Err(_) => return Err(format!("invalid port {:?}", Shown(port))),
    };
    if let Some(why) = unusable(ip) {
        return Err(format!("{ip} {why}"));
    }
    Ok(SocketAddr::new(ip, port))
}

/// "IPv4" or "IPv6".
pub(crate) fn family(ip: IpAddr) -> &'static str {
    if ip.is_ipv4() { "IPv4" } else { "IPv6" }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
[lb]
interfaces = ["eth1"]
xdp_mode = "auto"
api = "127.0.0.1:9090"

[[service]]
name = "web"
vip = "10.100.0.1:80"
protocol = "tcp"
backends = [ { address = "10.0.2.2:8080", weight = 1 }, { address = "10.0.3.2:8080" } ]
"#;

    fn problems(text: &str) -> Vec<String> {
        match parse(text) {
            Ok(c) => panic!("accepted: {c:?}"),
            Err(e) => e.0.iter().map(ToString::to_string).collect(),
        }
    }

    #[test]
    fn the_syn_proxy_is_for_tcp_full_nat_services() {
        let on = GOOD.replace(
            "protocol = \"tcp\"\n",
            "protocol = \"tcp\"\nsyn_proxy = \"on\"\n",
        );
        assert_eq!(parse(&on).unwrap().services[0].syn_proxy, SynProxy::On);
        // Unsaid: `auto` where the proxy can be, off where it cannot (no error there).
        assert_eq!(parse(GOOD).unwrap().services[0].syn_proxy, SynProxy::Auto);
        let udp = GOOD.replace("protocol = \"tcp\"", "protocol = \"udp\"");
        assert_eq!(parse(&udp).unwrap().services[0].syn_proxy, SynProxy::Off);
        let dsr = GOOD
            .replace(
                "protocol = \"tcp\"",
                "protocol = \"tcp\"\nforwarding = \"ipip\"",
            )
            .replace(":8080", ":80");
        assert_eq!(parse(&dsr).unwrap().services[0].syn_proxy, SynProxy::Off);
        let off = on.replace("syn_proxy = \"on\"", "syn_proxy = \"off\"");
        assert_eq!(parse(&off).unwrap().services[0].syn_proxy, SynProxy::Off);
        let auto = on.replace("syn_proxy = \"on\"", "syn_proxy = \"auto\"");
        assert_eq!(parse(&auto).unwrap().services[0].syn_proxy, SynProxy::Auto);
        assert_eq!(
            problems(&auto.replace("[lb]\n", "[lb]\nsyn_proxy_release_rate = 30000\n")),
            [
                "lb.syn_proxy_release_rate: 30000 is above syn_proxy_engage_rate (20000): the proxy would engage and release at once"
            ]
        );
        assert_eq!(
            problems(&auto.replace("[lb]\n", "[lb]\nsyn_proxy_release_half_open = 10001\n")),
            [
                "lb.syn_proxy_release_half_open: 10001 is above syn_proxy_engage_half_open (10000): the proxy would engage and release at once"
            ]
        );
        let slow = auto.replace(
            "[lb]\n",
            "[lb]\nsyn_proxy_engage_half_open = 300\nsyn_proxy_release_half_open = 30\nconntrack = { tcp_syn_timeout = \"5s\" }\n",
        );
        let t = parse(&slow).unwrap().lb.syn_proxy_auto;
        assert_eq!(
            (t.engage_half_open, t.release_half_open, t.half_open_window),
            (300, 30, Duration::from_secs(5))
        );
        assert_eq!(
            problems(&on.replace("protocol = \"tcp\"", "protocol = \"udp\"")),
            ["service[0].syn_proxy: the SYN proxy is for TCP services"]
        );
        assert_eq!(
            problems(
                &on.replace(
                    "protocol = \"tcp\"",
                    "protocol = \"tcp\"\nforwarding = \"ipip\""
                )
                .replace(":8080", ":80")
            ),
            [
                "service[0].syn_proxy: direct server return cannot be proxied (the backends answer clients past lb); its services have flood mode instead (`[lb] dsr_flood_rate`)"
            ]
        );
        assert_eq!(
            problems(&on.replace("syn_proxy = \"on\"", "syn_proxy = \"maybe\"")),
            ["service[0].syn_proxy: expected one of off, on, auto, got \"maybe\""]
        );
        let v6 = on
            .replace("10.100.0.1:80", "[2001:db8::1]:80")
            .replace("10.0.2.2:8080", "[2001:db8:2::2]:8080")
            .replace("10.0.3.2:8080", "[2001:db8:3::2]:8080");
        assert_eq!(parse(&v6).unwrap().services[0].syn_proxy, SynProxy::On);
    }

    const QUIC: &str = r#"
[lb]
interfaces = ["eth1"]

[[service]]
name = "h3"
vip = "10.100.0.1:443"
protocol = "udp"
quic = { server_id_bytes = 2 }
backends = [ { address = "10.0.2.2:443", server_id = 1 }, { address = "10.0.3.2:443", server_id = 65535 }, { address = "10.0.4.2:443" } ]
"#;

    #[test]
    fn quic_layouts_and_server_ids() {
        let c = parse(QUIC).unwrap();
        let q = c.services[0].quic.unwrap();
        assert_eq!((q.server_id_bytes, q.cid_offset, q.config_id), (2, 1, None));
        let ids: Vec<_> = c.services[0].backends.iter().map(|b| b.server_id).collect();
        assert_eq!(ids, [Some(1), Some(65535), None], "a backend may have none");
        let full = QUIC.replace(
            "quic = { server_id_bytes = 2 }",
            "quic = { server_id_bytes = 8, cid_offset = 12, config_id = 6 }",
        );
        let q = parse(&full).unwrap().services[0].quic.unwrap();
        assert_eq!(
            (q.server_id_bytes, q.cid_offset, q.config_id),
            (8, 12, Some(6))
        );
        assert_eq!(q.max_server_id(), u64::MAX);

        let bad = |from: &str, to: &str| problems(&QUIC.replace(from, to));
        assert_eq!(
            bad("server_id = 65535", "server_id = 65536"),
            [
                "service[0].backends[1].server_id: 65536 does not fit in quic.server_id_bytes = 2 (at most 65535)"
            ]
        );
        assert_eq!(
            bad("server_id = 65535", "server_id = 1"),
            [
                "service[0].backends[1].server_id: 1 is already backends[0]'s: a server ID names one backend"
            ]
        );
        assert_eq!(
            bad("server_id = 65535", "server_id = -1"),
            ["service[0].backends[1].server_id: invalid server ID -1: 0 or more"]
        );
        assert_eq!(
            bad("protocol = \"udp\"", "protocol = \"tcp\""),
            ["service[0].quic: only for UDP services: QUIC runs over UDP"]
        );
        assert_eq!(
            bad("quic = { server_id_bytes = 2 }\n", ""),
            [
                "service[0].backends[0].server_id: only in a service with `quic` (it says where the server ID is)",
                "service[0].backends[1].server_id: only in a service with `quic` (it says where the server ID is)"
            ]
        );
        assert_eq!(
            bad("server_id_bytes = 2", "server_id_bytes = 9"),
            ["service[0].quic.server_id_bytes: 9 is out of range 1-8"]
        );
        assert_eq!(
            bad(
                "server_id_bytes = 2",
                "server_id_bytes = 8, cid_offset = 13"
            ),
            [
                "service[0].quic.cid_offset: the server ID (8 bytes from byte 13) must end within a connection ID (20 bytes at most)"
            ]
        );
        assert_eq!(
            bad("server_id_bytes = 2", "server_id_bytes = 2, config_id = 7"),
            ["service[0].quic.config_id: 7 is out of range 0-6"]
        );
        assert_eq!(
            bad("server_id_bytes = 2", "server_id_bytes = 2, cid = 1"),
            ["service[0].quic.cid: unknown key"]
        );
        assert_eq!(
            bad("quic = { server_id_bytes = 2 }", "quic = {}"),
            ["service[0].quic.server_id_bytes: missing"]
        );
        assert_eq!(
            bad("quic = { server_id_bytes = 2 }", "quic = 2"),
            ["service[0].quic: expected a table, got integer"]
        );
    }

    #[test]
    fn quic_checks_probe_udp() {
        let c = parse(&QUIC.replace(
            "quic = { server_id_bytes = 2 }",
            "quic = { server_id_bytes = 2 }\ncheck = { kind = \"quic\", timeout = \"1s\" }",
        ))
        .unwrap();
        assert_eq!(c.services[0].check.kind, crate::config::CheckKind::Quic);
        let tcp = GOOD.replace(
            "protocol = \"tcp\"",
            "protocol = \"tcp\"\ncheck = { kind = \"quic\" }",
        );
        assert_eq!(
            problems(&tcp),
            [
                "service[0].check.kind: a quic check probes UDP but the service is TCP: set port to the UDP port to probe"
            ]
        );
        let payload = QUIC.replace(
            "quic = { server_id_bytes = 2 }",
            "check = { kind = \"quic\", send = \"x\" }",
        );
        let found = problems(&payload);
        assert!(
            found.contains(
                &"service[0].check.send: only for tcp-connect and udp checks, not quic".to_owned()
            ),
            "{found:?}"
        );
    }

    #[test]
    fn the_documented_example_parses_with_defaults() {
        let c = parse(GOOD).unwrap();
        assert_eq!(c.lb.ring_size, 65537);
        assert_eq!(c.lb.snat_ports, 1024..=32767);
        assert_eq!(c.lb.conntrack, Conntrack::default());
        assert_eq!(c.services[0].existing_flows, ExistingFlows::Reschedule);
        assert_eq!(c.services[0].on_all_unhealthy, AllUnhealthy::UseAll);
        let tuned = parse(&GOOD.replace("[lb]", "[lb]\nring_size = 1009\nsnat_ports = \"40000-40099\"\nconntrack = { size = 4096, udp_timeout = \"1.5s\" }")).unwrap();
        assert_eq!(tuned.lb.ring_size, 1009);
        assert_eq!(tuned.lb.snat_ports, 40000..=40099);
        assert_eq!(tuned.lb.conntrack.size, 4096);
        assert_eq!(tuned.lb.conntrack.udp_timeout, Duration::from_millis(1500));
        assert_eq!(c.lb.interfaces, ["eth1"]);
        assert_eq!(c.lb.xdp_mode, XdpMode::Auto);
        assert_eq!(c.lb.api, "127.0.0.1:9090".parse().unwrap());
        assert_eq!(c.services[0].protocol, Protocol::Tcp);
        assert_eq!(c.services[0].backends[1].weight, 1, "default weight");
        let minimal = parse("[lb]\ninterfaces = [\"eth1\"]\n").unwrap();
        assert_eq!(minimal.lb.api, DEFAULT_API.parse().unwrap());
        assert!(minimal.services.is_empty());
    }

    #[test]
    fn each_bad_input_is_reported_at_its_path() {
        let cases: &[(&str, &str, &str)] = &[
            (
                "address = \"10.0.3.2:8080\"",
                "address = \"10.0.3.2:70000\"",
                "service[0].backends[1].address: invalid port 70000",
            ),
            (
                "address = \"10.0.3.2:8080\"",
                "address = \"10.0.3.2\"",
                "service[0].backends[1].address: expected IPv4:PORT or [IPv6]:PORT, got \"10.0.3.2\"",
            ),
            (
                "address = \"10.0.3.2:8080\"",
                "address = \"10.0.3.300:80\"",
                "service[0].backends[1].address: invalid IPv4 address \"10.0.3.300\"",
            ),
            (
                "address = \"10.0.3.2:8080\"",
                "address = \"[fd00::1]:80\"",
                "service[0].backends[1].address: [fd00::1]:80 is IPv6, the VIP 10.100.0.1:80 is IPv4: a service balances one family (make an IPv6 service for it)",
            ),
            (
                "address = \"10.0.3.2:8080\"",
                "address = \"fd00::1:80\"",
                "service[0].backends[1].address: \"fd00::1:80\": an IPv6 address with a port is written in brackets, [IPv6]:PORT",
            ),
            (
                "address = \"10.0.3.2:8080\"",
                "address = \"[fd00::1:80\"",
                "service[0].backends[1].address: expected [IPv6]:PORT, got \"[fd00::1:80\"",
            ),
            (
                "address = \"10.0.3.2:8080\"",
                "address = \"[fd00::zz]:80\"",
                "service[0].backends[1].address: invalid IPv6 address \"fd00::zz\"",
            ),
            (
                "vip = \"10.100.0.1:80\"",
                "vip = \"[fe80::1]:80\"",
                "service[0].vip: fe80::1 is link-local (fe80::/10): it needs a zone, and lb balances routed addresses",
            ),
            (
                "vip = \"10.100.0.1:80\"",
                "vip = \"[::ffff:10.100.0.1]:80\"",
                "service[0].vip: ::ffff:10.100.0.1 is an IPv4-mapped address: write the IPv4 address itself",
            ),
            (
                "vip = \"10.100.0.1:80\"",
                "vip = \"[::1]:80\"",
                "service[0].vip: ::1 is a loopback address: the datapath never sees its traffic",
            ),
            (
                "vip = \"10.100.0.1:80\"",
                "vip = \"[ff02::1]:80\"",
                "service[0].vip: ff02::1 is a multicast address",
            ),
            (
                "[lb]",
                "[lb]\nsnat_address = [\"10.0.0.1\", \"10.0.0.2\"]",
                "lb.snat_address: 10.0.0.2: one address per family (IPv4, IPv6) at most",
            ),
            (
                "[lb]",
                "[lb]\nsnat_address = [\"10.0.0.1\", 7]",
                "lb.snat_address: expected an IP address or a list of IP addresses (strings)",
            ),
            (
                "[lb]",
                "[lb]\nconntrack = { ipv6_size = 3000 }",
                "lb.conntrack.ipv6_size: 3000 is not a power of two (e.g. 4096)",
            ),
            (
                "address = \"10.0.3.2:8080\"",
                "address = \"10.0.2.2:8080\"",
                "service[0].backends[1].address: duplicate of backends[0]",
            ),
            (
                "address = \"10.0.3.2:8080\"",
                "address = \"10.100.0.1:80\"",
                "service[0].backends[1].address: a backend cannot be the VIP itself",
            ),
            (
                "address = \"10.0.3.2:8080\"",
                "adress = \"10.0.3.2:8080\"",
                "service[0].backends[1].address: missing",
            ),
            (
                "address = \"10.0.3.2:8080\"",
                "adress = \"10.0.3.2:8080\"",
                "service[0].backends[1].adress: unknown key",
            ),
            (
                "weight = 1",
                "weight = 1001",
                "service[0].backends[0].weight: invalid weight 1001: 0 to 1000",
            ),
            (
                "weight = 1",
                "weight = -1",
                "service[0].backends[0].weight: invalid weight -1: 0 to 1000",
            ),
            (
                "weight = 1",
                "weight = \"1\"",
                "service[0].backends[0].weight: expected an integer, got string",
            ),
            (
                "xdp_mode = \"auto\"",
                "xdp_mode = \"fast\"",
                "lb.xdp_mode: expected one of auto, native, skb, got \"fast\"",
            ),
            (
                "api = \"127.0.0.1:9090\"",
                "api = \"localhost\"",
                "lb.api: expected IP:PORT, got \"localhost\"",
            ),
            (
                "api = \"127.0.0.1:9090\"",
                "api = \"127.0.0.1:9090\"\npin_path = \"/tmp/lb\"",
                "lb.pin_path: expected a directory under /sys/fs/bpf/ (at most 200 of A-Z a-z 0-9 - _ . /), got \"/tmp/lb\"",
            ),
            (
                "api = \"127.0.0.1:9090\"",
                "api = \"127.0.0.1:9090\"\napi_token = \"short\"",
                "lb.api_token: expected 16 to 256 printable ASCII characters without spaces",
            ),
            (
                "interfaces = [\"eth1\"]",
                "interfaces = []",
                "lb.interfaces: at least one interface is required",
            ),
            (
                "interfaces = [\"eth1\"]",
                "interfaces = [\"eth1\", \"eth1\"]",
                "lb.interfaces[1]: duplicate interface \"eth1\"",
            ),
            (
                "interfaces = [\"eth1\"]",
                "interfaces = [\"a-very-long-interface\"]",
                "lb.interfaces[0]: invalid interface name \"a-very-long-interface\": 1 to 15 bytes",
            ),
            (
                "interfaces = [\"eth1\"]",
                "interfaces = [1]",
                "lb.interfaces[0]: expected a string, got integer",
            ),
            (
                "interfaces = [\"eth1\"]",
                "interfaces = \"eth1\"",
                "lb.interfaces: expected an array, got string",
            ),
            ("interfaces = [\"eth1\"]", "", "lb.interfaces: missing"),
            (
                "protocol = \"tcp\"",
                "protocol = \"sctp\"",
                "service[0].protocol: expected one of tcp, udp, got \"sctp\"",
            ),
            (
                "name = \"web\"",
                "name = \"web site\"",
                "service[0].name: invalid name \"web site\": 1 to 64 of A-Z a-z 0-9 - _ .",
            ),
            (
                "vip = \"10.100.0.1:80\"",
                "vip = \"10.100.0.1:0\"",
                "service[0].vip: invalid port 0",
            ),
            (
                "vip = \"10.100.0.1:80\"",
                "vip = \"0.0.0.0:80\"",
                "service[0].vip: 0.0.0.0 is in 0.0.0.0/8 (\"this network\")",
            ),
            (
                "backends = [",
                "backendz = [",
                "service[0].backends: missing",
            ),
            ("[lb]", "[lb]\ncolour = \"blue\"", "lb.colour: unknown key"),
            ("[lb]", "verbose = true\n[lb]", "verbose: unknown key"),
        ];
        let more: &[(&str, &str, &str)] = &[
            (
                "[lb]",
                "[lb]\nring_size = 65536",
                "lb.ring_size: 65536 is not a prime",
            ),
            (
                "[lb]",
                "[lb]\nring_size = 3",
                "lb.ring_size: 3 is out of range 7-1048573",
            ),
            (
                "[lb]",
                "[lb]\nsnat_ports = \"100-200\"",
                "lb.snat_ports: expected FIRST-LAST within 1024-65535, got \"100-200\"",
            ),
            (
                "[lb]",
                "[lb]\nsnat_address = \"10.0.0\"",
                "lb.snat_address: invalid IP address \"10.0.0\"",
            ),
            (
                "[lb]",
                "[lb]\nmax_services = 0",
                "lb.max_services: 0 is out of range 1-65536",
            ),
            (
                "[lb]",
                "[lb]\nconntrack = { udp_timeout = \"soon\" }",
                "lb.conntrack.udp_timeout: expected a duration like \"500ms\", \"2s\", \"15m\", got \"soon\"",
            ),
            (
                "[lb]",
                "[lb]\nconntrack = { tcp_syn_timeout = \"10d\" }",
                "lb.conntrack.tcp_syn_timeout: 10d is out of range 1s-168h",
            ),
            (
                "[lb]",
                "[lb]\nconntrack = { tcp_closed_timeout = \"20s\" }",
                "lb.conntrack.tcp_closed_timeout: 20s is longer than tcp_closing_timeout (10s): a closed flow leaves the table then",
            ),
            (
                "[lb]",
                "[lb]\nconntrack = { size = 4096, colour = 1 }",
                "lb.conntrack.colour: unknown key",
            ),
            (
                "[lb]",
                "[lb]\nconntrack = { size = 5000 }",
                "lb.conntrack.size: 5000 is not a power of two (e.g. 8192)",
            ),
            (
                "protocol = \"tcp\"",
                "protocol = \"tcp\"\nexisting_flows = \"move\"",
                "service[0].existing_flows: expected one of reschedule, keep, got \"move\"",
            ),
            (
                "protocol = \"tcp\"",
                "protocol = \"tcp\"\non_all_unhealthy = \"all\"",
                "service[0].on_all_unhealthy: expected one of use-all, first, drop, got \"all\"",
            ),
        ];
        let big = "a".repeat(1 << 20);
        let hostile: &[(&str, &str, &str)] = &[
            (
                "vip = \"10.100.0.1:80\"",
                "vip = \"127.0.0.1:80\"",
                "service[0].vip: 127.0.0.1 is a loopback address: the datapath never sees its traffic",
            ),
            (
                "address = \"10.0.3.2:8080\"",
                "address = \"127.0.0.53:53\"",
                "service[0].backends[1].address: 127.0.0.53 is a loopback address: the datapath never sees its traffic",
            ),
            (
                "address = \"10.0.3.2:8080\"",
                "address = \"0.1.2.3:80\"",
                "service[0].backends[1].address: 0.1.2.3 is in 0.0.0.0/8 (\"this network\")",
            ),
            (
                "address = \"10.0.3.2:8080\"",
                "address = \"10.100.0.1:8080\"",
                "service[0].backends[1].address: 10.100.0.1 is the VIP address of service[0] (\"web\"): flows sent there would come back to lb",
            ),
            (
                "interfaces = [\"eth1\"]",
                "interfaces = [\"eth\\u0000\"]",
                "lb.interfaces[0]: invalid interface name \"eth\\0\"",
            ),
            (
                "vip = \"10.100.0.1:80\"",
                "vip = \"10.100.0.1:99999999999\"",
                "service[0].vip: invalid port \"99999999999\"",
            ),
        ];
        let long_host = format!("name = \"{big}\"");
        let long: &[(&str, &str, &str)] = &[(
            "name = \"web\"",
            &long_host,
            "service[0].name: invalid name \"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\"... (1048576 bytes): 1 to 64 of A-Z a-z 0-9 - _ .",
        )];
        let long_pin = format!("api = \"127.0.0.1:9090\"\npin_path = \"/sys/fs/bpf/{big}\"");
        let long_pin: &[(&str, &str, &str)] = &[(
            "api = \"127.0.0.1:9090\"",
            &long_pin,
            "lb.pin_path: expected a directory under /sys/fs/bpf/ (at most 200 of A-Z a-z 0-9 - _ . /), got \"/sys/fs/bpf/aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\"... (1048588 bytes)",
        )];
        for (from, to, want) in cases
            .iter()
            .chain(more)
            .chain(hostile)
            .chain(long)
            .chain(long_pin)
        {
            assert!(
                GOOD.contains(from),
                "case {want}: {from:?} not in the base config"
            );
            let got = problems(&GOOD.replacen(from, to, 1));
            assert!(got.iter().any(|p| p == want), "want {want:?}, got {got:?}");
        }
    }

    #[test]
    fn every_problem_is_reported_not_just_the_first() {
        let text = GOOD
            .replace("10.0.3.2:8080", "10.0.3.2:70000")
            .replace("\"auto\"", "\"fast\"")
            .replace("protocol = \"tcp\"", "protocol = \"tcp\"\ncolour = 1");
        let got = problems(&text);
        assert_eq!(got.len(), 3, "{got:?}");
    }

    #[test]
    fn services_must_not_collide() {
        let text = format!(
            "{GOOD}\n[[service]]\nname = \"web\"\nvip = \"10.100.0.1:80\"\nbackends = [{{ address = \"10.0.9.9:80\" }}]\n"
        );
        let got = problems(&text);
        assert!(
            got.contains(&"service[1].name: duplicate of service[0] (\"web\")".to_owned()),
            "{got:?}"
        );
        assert!(
            got.contains(&"service[1].vip: 10.100.0.1:80 tcp is already service[0]".to_owned()),
            "{got:?}"
        );
        // Same VIP and port over UDP is a different service.
        let udp = format!(
            "{GOOD}\n[[service]]\nname = \"dns\"\nvip = \"10.100.0.1:80\"\nprotocol = \"udp\"\nbackends = [{{ address = \"10.0.9.9:80\" }}]\n"
        );
        assert!(parse(&udp).is_ok());
    }

    #[test]
    fn toml_syntax_errors_say_where() {
        let got = problems("[lb\ninterfaces = 1");
        assert_eq!(
            got,
            ["line 1, column 4: invalid TOML: unclosed table, expected `]`"]
        );
        let got = problems("[lb]\ninterfaces = [\"eth1\"]\nx = \"ä\" z\n");
        assert!(
            got[0].starts_with("line 3, column 9: invalid TOML"),
            "{got:?}"
        );
        let not_utf8 = super::super::text(b"[lb]\n# caf\xe9\n").unwrap_err();
        assert_eq!(
            not_utf8.0[0].to_string(),
            "line 2, column 6: not UTF-8 (byte 0xe9): TOML files are UTF-8"
        );
    }

    fn with_check(check: &str) -> String {
        format!("{GOOD}\n[service.check]\n{check}\n")
    }

    #[test]
    fn forwarding_modes_and_their_rules() {
        let c = parse(GOOD).unwrap();
        assert_eq!(c.services[0].forwarding, Forwarding::Nat);
        assert_eq!(c.lb.gue_port, lb_common::DEFAULT_GUE_PORT);
        let dsr = GOOD
            .replace(":8080", ":80")
            .replace(
                "protocol = \"tcp\"",
                "protocol = \"tcp\"\nforwarding = \"gue\"",
            )
            .replace("[lb]", "[lb]\ngue_port = 5555");
        let c = parse(&dsr).unwrap();
        assert_eq!(c.services[0].forwarding, Forwarding::Gue);
        assert_eq!(c.lb.gue_port, 5555);
        let ipip = parse(&dsr.replace("\"gue\"", "\"ipip\"")).unwrap();
        assert_eq!(ipip.services[0].forwarding, Forwarding::Ipip);
        assert_eq!(
            problems(&dsr.replace("\"gue\"", "\"dsr\"")),
            ["service[0].forwarding: expected one of nat, ipip, gue, got \"dsr\""]
        );
        assert_eq!(
            problems(&dsr.replace("gue_port = 5555", "gue_port = 0")),
            ["lb.gue_port: 0 is out of range 1-65535"]
        );
        // The packet arrives unchanged: on the VIP's port.
        assert_eq!(
            problems(&dsr.replace("10.0.3.2:80", "10.0.3.2:8080")),
            [
                "service[0].backends[1].address: port 8080 differs from the VIP's 80: with \
                 forwarding = \"gue\" the packet reaches the backend unchanged, on the VIP's \
                 port (write 10.0.3.2:80; probe another port with check.port)"
            ]
        );
        // No replies through lb: no "no data back".
        let no_data = format!("{dsr}[service.passive]\nno_data_timeout = \"1s\"\n");
        assert_eq!(
            problems(&no_data),
            [
                "service[0].passive.no_data_timeout: not with forwarding = \"gue\": the backend \
                 answers the client directly, so lb never sees data come back (direct server \
                 return's passive signal is the connect timeout)"
            ]
        );
        let mut fixed = parse(&dsr).unwrap().lb;
        fixed.gue_port = 6080;
        assert_eq!(c.lb.fixed_differences(&fixed), ["gue_port"]);
    }

    /// The datapath reads its rates from the parameters it was loaded with: a reload that
    /// changed them was accepted and changed nothing. Now it is refused, naming them.
    #[test]
    fn datapath_rates_change_with_a_restart_only() {
        let c = parse(GOOD).unwrap();
        assert_eq!(
            c.lb.dsr_flood_rate,
            lb_common::Params::DEFAULT.dsr_flood_rate
        );
        let mut other = c.lb.clone();
        other.syn_rate_per_source = 5;
        other.dsr_flood_rate = 0;
        assert_eq!(
            c.lb.fixed_differences(&other),
            ["syn_rate_per_source", "dsr_flood_rate"]
        );
        let set = parse(&GOOD.replace("[lb]\n", "[lb]\ndsr_flood_rate = 0\n")).unwrap();
        assert_eq!(set.lb.dsr_flood_rate, 0);
        assert_eq!(
            problems(&GOOD.replace("[lb]\n", "[lb]\ndsr_flood_rate = -1\n")),
            ["lb.dsr_flood_rate: -1 is out of range 0-10000000"]
        );
    }

    #[test]
    fn checks_through_the_tunnel() {
        let dsr = GOOD.replace(":8080", ":80").replace(
            "protocol = \"tcp\"",
            "protocol = \"tcp\"\nforwarding = \"ipip\"",
        );
        let through = |kind: &str| {
            format!("{dsr}\n[service.check]\nkind = \"{kind}\"\nthrough_tunnel = true\n")
        };
        for kind in ["tcp", "tcp-connect", "http", "https"] {
            let c = parse(&through(kind)).unwrap();
            assert!(c.services[0].check.through_tunnel, "{kind}");
        }
        assert!(!parse(&dsr).unwrap().services[0].check.through_tunnel);
        for kind in ["udp", "icmp", "none"] {
            let text = through(kind).replace("kind = \"udp\"", "kind = \"udp\"\nport = 53");
            assert_eq!(
                problems(&text),
                [format!(
                    "service[0].check.through_tunnel: not for {kind} checks: tcp, tcp-connect, \
                     http and https probes go through the tunnel"
                )]
            );
        }
        // Full NAT: the traffic's path is the backend's own address, probed already.
        assert_eq!(
            problems(&with_check("kind = \"tcp\"\nthrough_tunnel = true")),
            [
                "service[0].check.through_tunnel: only with direct server return (forwarding = \
                 \"ipip\" or \"gue\"): under full NAT the traffic goes to the backend's own \
                 address, which the probes check already"
            ]
        );
        assert_eq!(
            problems(&through("tcp").replace("= true", "= \"yes\"")),
            ["service[0].check.through_tunnel: expected a boolean, got string"]
        );
    }

    #[test]
    fn checks_default_by_protocol_and_parse_fully() {
        let c = parse(GOOD).unwrap();
        assert_eq!(
            c.services[0].check,
            crate::config::Check::default_for(Protocol::Tcp)
        );
        assert_eq!(c.services[0].check.kind, crate::config::CheckKind::Tcp);
        let udp = parse(&GOOD.replace("protocol = \"tcp\"", "protocol = \"udp\"")).unwrap();
        assert_eq!(udp.services[0].check.kind, crate::config::CheckKind::Udp);
        let c = parse(&with_check(
            "kind = \"https\"\nport = 8443\ntimeout = \"500ms\"\ninterval = \"1s\"\nhealthy_threshold = 2\n\
             unhealthy_threshold = 4\nmethod = \"HEAD\"\npath = \"/health\"\nhost = \"example.com\"\n\
             headers = { X-Check = \"lb\" }\nstatus = [200, \"300-302\"]\nverify_tls = false\n\
             tcp_failures = 2\ntimeouts = 3\nhttp_failures = 254\nunhealthy_status = [429, 404, \"500-505\"]",
        ))
        .unwrap();
        let check = &c.services[0].check;
        assert_eq!(
            (
                check.window.tcp_failures,
                check.window.timeouts,
                check.window.http_failures
            ),
            (Some(2), Some(3), Some(254))
        );
        assert_eq!(check.kind, crate::config::CheckKind::Https);
        assert_eq!(check.port, Some(8443));
        assert_eq!(check.window.timeout, Duration::from_millis(500));
        assert_eq!(
            check.window.unhealthy_interval,
            Duration::from_secs(1),
            "defaults to interval"
        );
        assert_eq!(
            (
                check.window.healthy_threshold,
                check.window.unhealthy_threshold
            ),
            (2, 4)
        );
        let http = check.http.as_ref().unwrap();
        assert_eq!(http.method, crate::config::HttpMethod::Head);
        assert_eq!(http.path, "/health");
        assert_eq!(http.host.as_deref(), Some("example.com"));
        assert_eq!(http.headers, [("X-Check".to_owned(), "lb".to_owned())]);
        assert_eq!(http.status, [200..=200, 300..=302]);
        assert_eq!(
            http.unhealthy_status,
            Some(vec![429..=429, 404..=404, 500..=505])
        );
        // A DNS probe: a query in hex, the reply's ID and flags under a mask.
        let c = parse(&with_check(
            "kind = \"udp\"\nport = 53\nsend_hex = \"12 34 01 00\"\nexpect_hex = \"1234 8000\"\n\
             expect_mask_hex = \"ff ff 80 0f\"\nexpect_offset = 0",
        ))
        .unwrap();
        let check = &c.services[0].check;
        assert_eq!(check.send.as_deref(), Some(&[0x12, 0x34, 0x01, 0x00][..]));
        // Each backend's probe key holds a clone of the check: its payload is shared.
        let copy = check.clone();
        assert_eq!(
            copy.send.as_deref().map(<[u8]>::as_ptr),
            check.send.as_deref().map(<[u8]>::as_ptr)
        );
        assert_eq!(
            check.expect,
            Some(crate::config::Expect {
                bytes: vec![0x12, 0x34, 0x80, 0x00],
                offset: 0,
                mask: Some(vec![0xff, 0xff, 0x80, 0x0f]),
            })
        );
        assert!(!http.verify_tls);
    }

    #[test]
    fn bad_checks_are_reported_at_their_path() {
        let cases: &[(&str, &str)] = &[
            (
                "kind = \"ping\"",
                "service[0].check.kind: expected one of tcp, tcp-connect, udp, quic, icmp, http, https, none, got \"ping\"",
            ),
            (
                "timeout = \"61s\"",
                "service[0].check.timeout: 61s is out of range 10ms-1m",
            ),
            (
                "timeout = \"3s\"\ninterval = \"2s\"",
                "service[0].check.interval: must not be shorter than timeout",
            ),
            (
                "healthy_threshold = 11",
                "service[0].check.healthy_threshold: 11 is out of range 1-10",
            ),
            (
                "unhealthy_threshold = 0",
                "service[0].check.unhealthy_threshold: 0 is out of range 1-10",
            ),
            (
                "send = \"PING\"",
                "service[0].check.send: only for tcp-connect and udp checks, not tcp",
            ),
            (
                "kind = \"udp\"\nexpect = \"PONG\"",
                "service[0].check.expect: needs send (or send_hex)",
            ),
            (
                "kind = \"icmp\"\nsend = \"x\"",
                "service[0].check.send: only for tcp-connect and udp checks, not icmp",
            ),
            (
                "path = \"/x\"",
                "service[0].check.path: only for http and https checks, not tcp",
            ),
            (
                "kind = \"http\"\npath = \"health\"",
                "service[0].check.path: expected an absolute path without spaces, got \"health\"",
            ),
            (
                "kind = \"http\"\nstatus = [700]",
                "service[0].check.status[0]: expected a code 100-599 or \"FIRST-LAST\"",
            ),
            (
                "kind = \"http\"\nverify_tls = false",
                "service[0].check.verify_tls: only for https checks",
            ),
            (
                "kind = \"http\"\nheaders = { \"Bad Name\" = \"x\" }",
                "service[0].check.headers.\"Bad Name\": expected a header name (1-64 of A-Z a-z 0-9 - _) with a single-line string value",
            ),
            (
                "kind = \"none\"\nport = 80",
                "service[0].check.port: kind = \"none\" probes nothing",
            ),
            (
                "kind = \"http\"\nstatus = [200]\nunhealthy_status = [\"500-505\", 200]",
                "service[0].check.unhealthy_status: 200 is in status too: a code is healthy or unhealthy, not both",
            ),
            (
                "unhealthy_status = [500]",
                "service[0].check.unhealthy_status: only for http and https checks, not tcp",
            ),
            (
                "kind = \"http\"\nunhealthy_status = [600]",
                "service[0].check.unhealthy_status[0]: expected a code 100-599 or \"FIRST-LAST\"",
            ),
            (
                "kind = \"udp\"\nsend = \"x\"\nsend_hex = \"78\"",
                "service[0].check.send_hex: give send or send_hex, not both",
            ),
            (
                "kind = \"udp\"\nsend_hex = \"12 3\"",
                "service[0].check.send_hex: expected hex bytes (\"12 34 ab\"): an odd number of hex digits",
            ),
            (
                "kind = \"udp\"\nsend = \"x\"\nexpect_hex = \"12 34\"\nexpect_mask_hex = \"ff\"",
                "service[0].check.expect_mask_hex: 1 bytes, but expect has 2: one mask byte per expected byte",
            ),
            (
                "kind = \"udp\"\nsend = \"x\"\nexpect_offset = 2",
                "service[0].check.expect_offset: needs expect (or expect_hex)",
            ),
            (
                "expect_hex = \"00\"",
                "service[0].check.expect_hex: only for tcp-connect and udp checks, not tcp",
            ),
            (
                "tcp_failures = 0",
                "service[0].check.tcp_failures: 0 is out of range 1-254",
            ),
            (
                "kind = \"http\"\ntimeouts = 255",
                "service[0].check.timeouts: 255 is out of range 1-254",
            ),
            (
                "http_failures = 2",
                "service[0].check.http_failures: only http and https checks have HTTP failures, not tcp",
            ),
            ("colour = 1", "service[0].check.colour: unknown key"),
            (
                "interval = \"99999999999999999999s\"",
                "service[0].check.interval: 99999999999999999999s is out of range 10ms-5m",
            ),
            (
                "timeout = \"99999999999999999999999999999999999999999999.5d\"",
                "service[0].check.timeout: 99999999999999999999999999999999999999999999.5d is out of range 10ms-1m",
            ),
            (
                "interval = \"1.2.3s\"",
                "service[0].check.interval: expected a duration like \"500ms\", \"2s\", \"15m\", got \"1.2.3s\"",
            ),
            (
                "interval = \"-1s\"",
                "service[0].check.interval: expected a duration like \"500ms\", \"2s\", \"15m\", got \"-1s\"",
            ),
            (
                "timeout = \"2s\"\nunhealthy_interval = \"500ms\"",
                "service[0].check.unhealthy_interval: must not be shorter than timeout",
            ),
            (
                "kind = \"tcp-connect\"\nsend = \"\"",
                "service[0].check.send: empty: leave the key out instead",
            ),
            (
                "kind = \"udp\"",
                "service[0].check.kind: a udp check probes UDP but the service is TCP: set port to the UDP port to probe",
            ),
        ];
        for (check, want) in cases {
            let got = problems(&with_check(check));
            assert!(
                got.iter().any(|p| p == want),
                "{check}: want {want:?}, got {got:?}"
            );
        }
    }

    #[test]
    fn a_flood_of_problems_is_listed_up_to_a_bound() {
        let bad = "[[service]]\nname = \"x y\"\nvip = \"10.100.0.1:80\"\nbackends = [{ address = \"10.0.2.2:80\" }]\n";
        let text = format!("[lb]\ninterfaces = [\"eth1\"]\n{}", bad.repeat(3000));
        let got = problems(&text);
        assert_eq!(got.len(), super::super::fields::MAX_PROBLEMS + 1);
        let last = got.last().unwrap();
        assert!(
            last.starts_with("file: ")
                && last.ends_with("more problems not listed (the first 1000 are)"),
            "{last}"
        );
    }

    #[test]
    fn checks_of_the_other_protocol_need_a_port() {
        let udp = GOOD.replace("protocol = \"tcp\"", "protocol = \"udp\"");
        for kind in ["tcp", "tcp-connect", "http", "https"] {
            let text = format!("{udp}\n[service.check]\nkind = \"{kind}\"\n");
            let want = format!(
                "service[0].check.kind: a {kind} check probes TCP but the service is UDP: set port to the TCP port to probe"
            );
            assert_eq!(problems(&text), [want]);
            // A health port of the other protocol is a real set-up.
            assert!(parse(&format!("{text}port = 8080\n")).is_ok(), "{kind}");
        }
        assert!(parse(&format!("{udp}\n[service.check]\nkind = \"icmp\"\n")).is_ok());
    }

    #[test]
    fn unbounded_http_values_are_refused() {
        let big = "x".repeat(1 << 20);
        for (check, want) in [
            (
                format!("kind = \"http\"\nhost = \"{big}\""),
                "service[0].check.host: 1048576 bytes, more than 260",
            ),
            (
                format!("kind = \"http\"\npath = \"/{big}\""),
                "service[0].check.path: 1048577 bytes, more than 2048",
            ),
            (
                format!("kind = \"http\"\nheaders = {{ X-A = \"{big}\" }}"),
                "service[0].check.headers.X-A: 1048576 bytes, more than 1024",
            ),
            (
                "kind = \"http\"\nheaders = { X-A = \"a\\u0000b\" }".to_owned(),
                "service[0].check.headers.X-A: expected a header name (1-64 of A-Z a-z 0-9 - _) with a single-line string value",
            ),
            (
                format!("kind = \"tcp-connect\"\nsend = \"{big}\""),
                "service[0].check.send: 1048576 bytes, more than 4096",
            ),
        ] {
            assert_eq!(problems(&with_check(&check)), [want]);
        }
    }

    #[test]
    fn durations_are_exact_and_checked() {
        use super::super::parse_duration as d;
        assert_eq!(d("1.5s"), Some(Duration::from_millis(1500)));
        assert_eq!(d("0.1s"), Some(Duration::from_millis(100)));
        assert_eq!(d("250ms"), Some(Duration::from_millis(250)));
        assert_eq!(d("1.0000000001s"), Some(Duration::from_secs(1)));
        assert_eq!(d("15m"), Some(Duration::from_secs(900)));
        assert_eq!(d("7d"), Some(Duration::from_secs(7 * 86400)));
        assert_eq!(d(".5s"), Some(Duration::from_millis(500)));
        for bad in [
            "",
            "s",
            ".s",
            "1",
            "1..2s",
            "1.2.3s",
            "-1s",
            "1 s",
            "1S",
            "٣s",
            "1e3s",
            "NaNs",
            "infs",
            "99999999999999999999d",
            "18446744073709551616s",
        ] {
            assert_eq!(d(bad), None, "{bad:?}");
        }
        assert_eq!(
            d("18446744073709551615s"),
            Some(Duration::from_secs(u64::MAX))
        );
    }

    #[test]
    fn passive_section() {
        let c = parse(&format!(
            "{GOOD}[service.passive]\nfailures = 5\nwindow = \"30s\"\nejection = \"10s\"\n"
        ))
        .unwrap();
        let p = &c.services[0].passive;
        assert!(p.enabled);
        assert_eq!(p.settings.failures, 5);
        assert_eq!(p.settings.window, Duration::from_secs(30));
        assert_eq!(p.settings.ejection, Duration::from_secs(10));
        assert!(
            !parse(GOOD).unwrap().services[0].passive.enabled,
            "off without the table"
        );
        let errors = parse(&format!(
            "{GOOD}[service.passive]\nfailures = 0\nejection = \"2h\"\nsize = 3\n"
        ))
        .unwrap_err();
        let text: Vec<String> = errors.0.iter().map(ToString::to_string).collect();
        assert_eq!(
            text,
            [
                "service[0].passive.failures: 0 is out of range 1-1000",
                "service[0].passive.ejection: 2h is out of range 1s-1h",
                "service[0].passive.size: unknown key",
            ]
        );
    }
}
