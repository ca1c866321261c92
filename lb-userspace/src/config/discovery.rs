//! Backends from DNS: a service's `backends_from = { dns = "NAME", ... }`. The daemon resolves
//! the name (daemon/discovery.rs) and merges the addresses into the service's backends before
//! they are applied, each validated as a backend written in the file would be.

use std::{net::SocketAddr, time::Duration};

use super::{
    MAX_WEIGHT,
    fields::{Fields, Shown},
};

/// `backends_from`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Discovery {
    /// The name resolved.
    pub name: String,
    pub record: Record,
    /// The backends' port (A and AAAA; SRV records give their own).
    pub port: Option<u16>,
    /// The servers asked, in order; empty: those of /etc/resolv.conf.
    pub resolvers: Vec<SocketAddr>,
    pub refresh: Refresh,
    /// The weight of each address (A and AAAA; SRV records give their own).
    pub weight: u32,
    pub on_empty: OnEmpty,
    /// How long one query waits for an answer (each resolver is tried in turn).
    pub timeout: Duration,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Record {
    A,
    Aaaa,
    /// RFC 2782: target, port and weight; the lowest priority's records are the backends.
    Srv,
}

impl Record {
    pub fn as_str(self) -> &'static str {
        match self {
            Record::A => "A",
            Record::Aaaa => "AAAA",
            Record::Srv => "SRV",
        }
    }
}

/// When the name is resolved again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refresh {
    /// When the answer's TTL runs out, bounded by `min` and `max`.
    Ttl { min: Duration, max: Duration },
    /// Every so often, whatever the TTL.
    Every(Duration),
}

/// What an answer with no address (NXDOMAIN, or no record of the type) does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnEmpty {
    /// Keep the last addresses (a name that vanished is more likely a broken zone than an
    /// empty pool).
    KeepLast,
    /// Apply it: the service has no backends from DNS until the name has addresses again.
    Apply,
}

pub const DEFAULT_MIN_TTL: Duration = Duration::from_secs(1);
pub const DEFAULT_MAX_TTL: Duration = Duration::from_secs(300);
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(2);

/// A DNS name as resolvers take it: 1-253 characters, labels of 1-63 letters, digits, `-` and
/// `_`, a trailing dot allowed.
fn valid_name(name: &str) -> bool {
    let name = name.strip_suffix('.').unwrap_or(name);
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        })
}

/// `backends_from` of a service whose VIP is `vip`.
pub(super) fn read(f: &Fields, vip: Option<SocketAddr>) -> Option<Discovery> {
    let name = f.required("dns", |f| f.str("dns")).and_then(|n| {
        if valid_name(n) {
            Some(n.to_owned())
        } else {
            f.problem(
                "dns",
                format!(
                    "{:?} is not a DNS name (labels of A-Z a-z 0-9 - _)",
                    Shown(n)
                ),
            );
            None
        }
    });
    let default_record = match vip {
        Some(v) if v.is_ipv6() => Record::Aaaa,
        _ => Record::A,
    };
    let record = f.choice(
        "type",
        &[
            ("A", Record::A),
            ("AAAA", Record::Aaaa),
            ("SRV", Record::Srv),
        ],
        default_record,
    );
    if let (Some(record), Some(vip)) = (record, vip) {
        let fits = match record {
            Record::A => vip.is_ipv4(),
            Record::Aaaa => vip.is_ipv6(),
            Record::Srv => true,
        };
        if !fits {
            f.problem(
                "type",
                format!(
                    "{} records give {} addresses, the VIP {vip} is {}: a service balances one \
                     family",
                    record.as_str(),
                    if record == Record::A { "IPv4" } else { "IPv6" },
                    if vip.is_ipv4() { "IPv4" } else { "IPv6" }
                ),
            );
        }
    }
    let port = match (record, f.int("port")) {
        (Some(Record::Srv), Some(_)) => {
            f.problem("port", "SRV records give each backend's port: leave it out");
            None
        }
        (Some(Record::Srv), None) => Some(None),
        (_, Some(p)) if (1..=65535).contains(&p) => Some(Some(p as u16)),
        (_, Some(p)) => {
            f.problem("port", format!("invalid port {p}: 1 to 65535"));
            None
        }
        // The VIP's port, as direct server return needs anyway.
        (_, None) => Some(vip.map(|v| v.port())),
    };
    let resolvers = f
        .strings("resolvers")
        .into_iter()
        .filter_map(|(i, text)| {
            let parsed = text.parse::<SocketAddr>().or_else(|_| {
                text.parse::<std::net::IpAddr>()
                    .map(|ip| SocketAddr::new(ip, 53))
            });
            match parsed {
                Ok(a) => Some(a),
                Err(_) => {
                    f.problem(
                        &format!("resolvers[{i}]"),
                        format!("expected IP or IP:PORT, got {:?}", Shown(text)),
                    );
                    None
                }
            }
        })
        .collect::<Vec<_>>();
    let ttl_range = Duration::from_millis(100)..=Duration::from_secs(86_400);
    let min = f.duration("min_ttl", ttl_range.clone(), DEFAULT_MIN_TTL);
    let max = f.duration("max_ttl", ttl_range.clone(), DEFAULT_MAX_TTL);
    let refresh = match f.str("refresh") {
        None if f.has("refresh") => {
            f.problem("refresh", "expected \"ttl\" or a duration (e.g. \"30s\")");
            None
        }
        None | Some("ttl" | "TTL") => match (min, max) {
            (Some(min), Some(max)) if min > max => {
                f.problem("min_ttl", "longer than max_ttl");
                None
            }
            (Some(min), Some(max)) => Some(Refresh::Ttl { min, max }),
            _ => None,
        },
        Some(_) => f
            .duration("refresh", ttl_range, DEFAULT_MAX_TTL)
            .map(Refresh::Every),
    };
    let weight = match f.int("weight") {
        Some(_) if record == Some(Record::Srv) => {
            f.problem(
                "weight",
                "SRV records give each backend's weight: leave it out",
            );
            None
        }
        None => Some(1),
        Some(w) if (0..=i64::from(MAX_WEIGHT)).contains(&w) => Some(w as u32),
        Some(w) => {
            f.problem("weight", format!("invalid weight {w}: 0 to {MAX_WEIGHT}"));
            None
        }
    };
    let on_empty = f.choice(
        "on_empty",
        &[("keep_last", OnEmpty::KeepLast), ("apply", OnEmpty::Apply)],
        OnEmpty::KeepLast,
    );
    let timeout = f.duration(
        "timeout",
        Duration::from_millis(100)..=Duration::from_secs(30),
        DEFAULT_TIMEOUT,
    );
    f.finish();
    Some(Discovery {
        name: name?,
        record: record?,
        port: port?,
        resolvers,
        refresh: refresh?,
        weight: weight?,
        on_empty: on_empty?,
        timeout: timeout?,
    })
}

#[cfg(test)]
mod tests {
    use crate::config::{self, parse};

    fn service(from: &str) -> Result<config::Config, String> {
        parse(&format!(
            "[lb]\ninterfaces = [\"eth0\"]\n[[service]]\nname = \"web\"\nvip = \"10.100.0.1:80\"\n\
             backends_from = {from}\n"
        ))
        .map_err(|e| e.to_string())
    }

    #[test]
    fn a_service_may_take_its_backends_from_dns_alone() {
        let c =
            service("{ dns = \"web.example.internal\", port = 8080, resolvers = [\"10.0.0.53\"] }")
                .unwrap();
        let d = c.services[0].discovery.as_ref().unwrap();
        assert_eq!(d.record, super::Record::A);
        assert_eq!(d.port, Some(8080));
        assert_eq!(
            d.resolvers,
            ["10.0.0.53:53".parse::<std::net::SocketAddr>().unwrap()]
        );
        assert!(c.services[0].backends.is_empty());
        let c = service("{ dns = \"_http._tcp.web.example\", type = \"SRV\", refresh = \"30s\" }")
            .unwrap();
        let d = c.services[0].discovery.as_ref().unwrap();
        assert_eq!(
            (d.port, d.refresh),
            (
                None,
                super::Refresh::Every(std::time::Duration::from_secs(30))
            )
        );
    }

    #[test]
    fn mistakes_are_named() {
        for (from, want) in [
            (
                "{ dns = \"a..b\" }",
                "service[0].backends_from.dns: \"a..b\" is not a DNS name",
            ),
            (
                "{ dns = \"web\", type = \"AAAA\" }",
                "service[0].backends_from.type: AAAA records give IPv6 addresses",
            ),
            (
                "{ dns = \"web\", type = \"SRV\", port = 80 }",
                "service[0].backends_from.port: SRV records give each backend's port",
            ),
            (
                "{ dns = \"web\", resolvers = [\"dns.example\"] }",
                "service[0].backends_from.resolvers[0]: expected IP or IP:PORT",
            ),
            (
                "{ dns = \"web\", min_ttl = \"10m\", max_ttl = \"1m\" }",
                "service[0].backends_from.min_ttl: longer than max_ttl",
            ),
            (
                "{ dns = \"web\", on_empty = \"drop\" }",
                "service[0].backends_from.on_empty",
            ),
            (
                "{ dns = \"web\", ttl = 5 }",
                "service[0].backends_from.ttl: unknown key",
            ),
        ] {
            let err = service(from).unwrap_err();
            assert!(err.contains(want), "{from}: {err}");
        }
        // Neither backends nor backends_from: a service needs one of them.
        let err = parse(
            "[lb]\ninterfaces = [\"eth0\"]\n[[service]]\nname = \"web\"\nvip = \"10.100.0.1:80\"\n",
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("service[0].backends: missing"), "{err}");
    }
}
