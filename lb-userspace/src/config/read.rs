//! TOML text → validated [`Config`], collecting every problem with its path.

use std::{
    collections::HashMap,
    net::{Ipv4Addr, SocketAddr, SocketAddrV4},
};

use super::{
    Backend, Config, ConfigErrors, DEFAULT_API, Lb, MAX_WEIGHT, Problem, Protocol, Service,
    XdpMode,
    fields::{Fields, Problems},
};

/// Parses and validates a whole config file.
pub fn parse(text: &str) -> Result<Config, ConfigErrors> {
    let table: toml::Table = toml::from_str(text).map_err(|e| {
        ConfigErrors(vec![Problem {
            path: String::new(),
            message: format!("invalid TOML: {}", e.to_string().trim_end()),
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
    let lb = lb.and_then(|t| read_lb(&Fields::new(t, "lb", problems)));
    let services: Vec<_> = top
        .tables("service")
        .into_iter()
        .map(|(i, t)| read_service(&Fields::new(t, format!("service[{i}]"), problems)))
        .collect();
    top.finish();
    let services: Vec<Service> = services.into_iter().collect::<Option<_>>()?;
    check_services(&services, problems);
    Some(Config { lb: lb?, services })
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
                f.problem(&key, format!("duplicate interface {name:?}"));
            }
            names.push(name.to_owned());
        }
        names
    });
    let xdp_mode = match f.str("xdp_mode") {
        None => Some(XdpMode::Auto),
        Some("auto") => Some(XdpMode::Auto),
        Some("native") => Some(XdpMode::Native),
        Some("skb") => Some(XdpMode::Skb),
        Some(other) => {
            f.problem(
                "xdp_mode",
                format!("expected auto, native or skb, got {other:?}"),
            );
            None
        }
    };
    let api = match f.str("api") {
        None => DEFAULT_API.parse().ok(),
        Some(s) => s
            .parse::<SocketAddr>()
            .map_err(|_| f.problem("api", format!("expected IP:PORT, got {s:?}")))
            .ok(),
    };
    f.finish();
    let (interfaces, xdp_mode, api) = (interfaces?, xdp_mode?, api?);
    Some(Lb {
        interfaces,
        xdp_mode,
        api,
    })
}

fn check_ifname(name: &str) -> Result<(), String> {
    // Linux: at most IFNAMSIZ - 1 bytes, no '/', ':' or whitespace, not "." or "..".
    if name.is_empty() || name.len() > 15 {
        return Err(format!(
            "invalid interface name {name:?}: 1 to 15 characters"
        ));
    }
    if name == "."
        || name == ".."
        || name.contains(['/', ':'])
        || name.contains(char::is_whitespace)
    {
        return Err(format!("invalid interface name {name:?}"));
    }
    Ok(())
}

fn read_service(f: &Fields) -> Option<Service> {
    let name = f.required("name", |f| f.str("name")).and_then(|n| {
        let ok = !n.is_empty()
            && n.len() <= 64
            && n.chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c));
        if !ok {
            f.problem(
                "name",
                format!("invalid name {n:?}: 1 to 64 of A-Z a-z 0-9 - _ ."),
            );
        }
        ok.then(|| n.to_owned())
    });
    let vip = f
        .required("vip", |f| f.str("vip"))
        .and_then(|s| parse_addr(s).map_err(|e| f.problem("vip", e)).ok());
    let protocol = match f.str("protocol") {
        None | Some("tcp") => Some(Protocol::Tcp),
        Some("udp") => Some(Protocol::Udp),
        Some(other) => {
            f.problem("protocol", format!("expected tcp or udp, got {other:?}"));
            None
        }
    };
    let backends = f
        .required("backends", |f| Some(f.tables("backends")))
        .map(|list| {
            if list.is_empty() {
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
    f.finish();
    let backends: Vec<Backend> = backends?.into_iter().collect::<Option<_>>()?;
    let service = Service {
        name: name?,
        vip: vip?,
        protocol: protocol?,
        backends,
    };
    let mut seen = HashMap::new();
    for (i, b) in service.backends.iter().enumerate() {
        let path = f.path(&format!("backends[{i}].address"));
        if let Some(first) = seen.insert(b.address, i) {
            f.problems()
                .push(path, format!("duplicate of backends[{first}]"));
        } else if b.address == service.vip {
            f.problems()
                .push(path, "a backend cannot be the VIP itself");
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
    f.finish();
    Some(Backend {
        address: address?,
        weight: weight?,
    })
}

/// Problems that span services: unique names and unique (VIP, port, protocol).
fn check_services(services: &[Service], problems: &Problems) {
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
    if services.len() > lb_common::MAX_SERVICES as usize {
        problems.push(
            "service",
            format!("at most {} services", lb_common::MAX_SERVICES),
        );
    }
}

/// `IPv4:PORT`, with messages an operator can act on.
pub(crate) fn parse_addr(s: &str) -> Result<SocketAddrV4, String> {
    if s.starts_with('[') {
        return Err(format!("{s:?}: IPv6 is not supported yet"));
    }
    let Some((ip, port)) = s.rsplit_once(':') else {
        return Err(format!("expected IPv4:PORT, got {s:?}"));
    };
    let ip: Ipv4Addr = ip
        .parse()
        .map_err(|_| format!("invalid IPv4 address {ip:?}"))?;
    let port: u32 = port.parse().map_err(|_| format!("invalid port {port:?}"))?;
    if port == 0 || port > 65535 {
        return Err(format!("invalid port {port}"));
    }
    if ip.is_unspecified() || ip.is_broadcast() || ip.is_multicast() {
        return Err(format!(
            "{ip} cannot be used as a service or backend address"
        ));
    }
    Ok(SocketAddrV4::new(ip, port as u16))
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
    fn the_documented_example_parses_with_defaults() {
        let c = parse(GOOD).unwrap();
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
                "service[0].backends[1].address: expected IPv4:PORT, got \"10.0.3.2\"",
            ),
            (
                "address = \"10.0.3.2:8080\"",
                "address = \"10.0.3.300:80\"",
                "service[0].backends[1].address: invalid IPv4 address \"10.0.3.300\"",
            ),
            (
                "address = \"10.0.3.2:8080\"",
                "address = \"[fd00::1]:80\"",
                "service[0].backends[1].address: \"[fd00::1]:80\": IPv6 is not supported yet",
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
                "lb.xdp_mode: expected auto, native or skb, got \"fast\"",
            ),
            (
                "api = \"127.0.0.1:9090\"",
                "api = \"localhost\"",
                "lb.api: expected IP:PORT, got \"localhost\"",
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
                "lb.interfaces[0]: invalid interface name \"a-very-long-interface\": 1 to 15 characters",
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
                "service[0].protocol: expected tcp or udp, got \"sctp\"",
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
                "service[0].vip: 0.0.0.0 cannot be used as a service or backend address",
            ),
            (
                "backends = [",
                "backendz = [",
                "service[0].backends: missing",
            ),
            ("[lb]", "[lb]\ncolour = \"blue\"", "lb.colour: unknown key"),
            ("[lb]", "verbose = true\n[lb]", "verbose: unknown key"),
        ];
        for (from, to, want) in cases {
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
        assert!(got[0].starts_with("invalid TOML"), "{got:?}");
        assert!(got[0].contains("line 1"), "{got:?}");
    }
}
