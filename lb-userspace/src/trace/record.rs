//! Pure: the datapath's trace records (aya-log lines of small integers, lb-ebpf's trace.rs) read
//! back, filtered, and named into [`TraceLine`]s.

use std::{
    collections::HashMap,
    fmt::Write as _,
    net::{IpAddr, Ipv6Addr, SocketAddr},
};

use lb_common::{PROTO_ICMP, PROTO_TCP, PROTO_UDP, TRACE_NONE, counter, trace_kind};

use crate::model::TraceLine;

/// What the datapath's record starts with: a record of another shape is not ours.
const TAG: &str = "lbtrace1";
const PROTO_ICMPV6: u8 = 58;

/// One record of the datapath, as written (ids unnamed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Record {
    /// [`trace_kind`].
    pub kind: u8,
    /// The verdict counter.
    pub reason: u32,
    pub service: Option<u32>,
    pub backend: Option<u32>,
    /// A rescheduled flow's backend before.
    pub prev: Option<u32>,
    /// 0: none (direct server return, or no flow).
    pub snat_port: u16,
    /// 0: unknown (the packet could not be read that far).
    pub proto: u8,
    pub client: Option<IpAddr>,
    pub client_port: u16,
    pub vip: Option<IpAddr>,
    pub vip_port: u16,
}

impl Record {
    /// Reads an `lbtrace1 key=value ...` record; None for anything else.
    pub fn parse(message: &str) -> Option<Self> {
        let mut words = message.split_whitespace();
        if words.next()? != TAG {
            return None;
        }
        let fields: HashMap<&str, &str> = words.filter_map(|w| w.split_once('=')).collect();
        let num = |k: &str| fields.get(k)?.parse::<u64>().ok();
        let id = |k: &str| {
            let v = u32::try_from(num(k)?).ok()?;
            Some((v != TRACE_NONE).then_some(v))
        };
        let addr = |k: &str| {
            let ip: Ipv6Addr = fields.get(k)?.parse().ok()?;
            Some(if ip.is_unspecified() {
                None
            } else {
                Some(ip.to_ipv4_mapped().map_or(IpAddr::V6(ip), IpAddr::V4))
            })
        };
        Some(Self {
            kind: u8::try_from(num("kind")?).ok()?,
            reason: u32::try_from(num("reason")?).ok()?,
            service: id("service")?,
            backend: id("backend")?,
            prev: id("prev")?,
            snat_port: u16::try_from(num("snat")?).ok()?,
            proto: u8::try_from(num("proto")?).ok()?,
            client: addr("client")?,
            client_port: u16::try_from(num("cport")?).ok()?,
            vip: addr("vip")?,
            vip_port: u16::try_from(num("vport")?).ok()?,
        })
    }
}

/// What a trace shows: a service's records, a client's (an address or a prefix), or all.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Filter {
    pub service: Option<u32>,
    pub client: Option<(IpAddr, u8)>,
}

impl Filter {
    pub fn matches(&self, r: &Record) -> bool {
        if self.service.is_some_and(|s| r.service != Some(s)) {
            return false;
        }
        match (self.client, r.client) {
            (None, _) => true,
            (Some(_), None) => false,
            (Some((net, len)), Some(ip)) => in_prefix(ip, net, len),
        }
    }

    /// What the datapath must let through for every filter of `filters` (they are applied
    /// again per stream): the one they agree on, else what all of them have in common.
    pub fn union<'a>(filters: impl IntoIterator<Item = &'a Filter>) -> Filter {
        let mut it = filters.into_iter();
        let Some(first) = it.next() else {
            return Filter::default();
        };
        it.fold(*first, |a, b| Filter {
            service: a.service.filter(|s| b.service == Some(*s)),
            client: a.client.filter(|c| b.client == Some(*c)),
        })
    }
}

/// `ip` in `net`/`len` (of the same family).
pub fn in_prefix(ip: IpAddr, net: IpAddr, len: u8) -> bool {
    match (ip, net) {
        (IpAddr::V4(a), IpAddr::V4(b)) => {
            let mask = u32::MAX
                .checked_shl(32 - u32::from(len.min(32)))
                .unwrap_or(0);
            (u32::from(a) ^ u32::from(b)) & mask == 0
        }
        (IpAddr::V6(a), IpAddr::V6(b)) => {
            let mask = u128::MAX
                .checked_shl(128 - u32::from(len.min(128)))
                .unwrap_or(0);
            (u128::from(a) ^ u128::from(b)) & mask == 0
        }
        _ => false,
    }
}

/// `ADDR` or `ADDR/LEN`: a client filter.
pub fn parse_client(s: &str) -> Result<(IpAddr, u8), String> {
    let (addr, len) = match s.split_once('/') {
        Some((a, l)) => (a, Some(l)),
        None => (s, None),
    };
    let ip: IpAddr = addr
        .trim_start_matches('[')
        .trim_end_matches(']')
        .parse()
        .map_err(|_| format!("client {s:?}: expected an IP address or ADDR/PREFIX"))?;
    let max = if ip.is_ipv4() { 32 } else { 128 };
    let len = match len {
        None => max,
        Some(l) => l
            .parse::<u8>()
            .ok()
            .filter(|l| *l <= max)
            .ok_or_else(|| format!("client {s:?}: the prefix length must be 0-{max}"))?,
    };
    Ok((ip, len))
}

/// Who the ids are: services, backends (those a reload removed too, while their flows may
/// live) and how each service forwards.
#[derive(Debug, Clone, Default)]
pub struct Names {
    pub services: HashMap<u32, String>,
    pub backends: HashMap<u32, SocketAddr>,
    /// Direct server return's encapsulation (`ipip`, `gue`) of the services that use it.
    pub dsr: HashMap<u32, &'static str>,
}

impl Names {
    /// `self` with what `newer` names added or renamed; ids `newer` no longer has keep their
    /// names (a removed backend's flows go on for a while).
    pub fn merged(&self, newer: Names) -> Names {
        let mut out = self.clone();
        // A service `newer` names forwards as `newer` says.
        out.dsr.retain(|id, _| !newer.services.contains_key(id));
        out.services.extend(newer.services);
        out.backends.extend(newer.backends);
        out.dsr.extend(newer.dsr);
        out
    }

    fn backend(&self, id: u32) -> String {
        match self.backends.get(&id) {
            Some(a) => format!("{a} (id {id})"),
            None => format!("id {id}"),
        }
    }
}

/// The record as a line: `new flow 10.0.1.2:40000 → 10.100.0.1:80 tcp (web): backend
/// 10.0.2.11:8080 (id 1), snat port 31337`.
pub fn line(r: &Record, names: &Names, time: f64) -> TraceLine {
    let protocol = match r.proto {
        PROTO_TCP => Some("tcp"),
        PROTO_UDP => Some("udp"),
        PROTO_ICMP => Some("icmp"),
        PROTO_ICMPV6 => Some("icmpv6"),
        _ => None,
    };
    let ported = matches!(r.proto, PROTO_TCP | PROTO_UDP);
    let endpoint = |ip: Option<IpAddr>, port: u16| {
        ip.map(|ip| {
            if ported {
                SocketAddr::new(ip, port).to_string()
            } else {
                ip.to_string()
            }
        })
    };
    let client = endpoint(r.client, r.client_port);
    let vip = endpoint(r.vip, r.vip_port);
    let service = r.service.map(|id| {
        names
            .services
            .get(&id)
            .cloned()
            .unwrap_or_else(|| format!("service id {id}"))
    });
    let verdict = counter::NAMES
        .get(r.reason as usize)
        .map(|n| (*n).to_owned());
    let kind = match r.kind {
        trace_kind::NEW_FLOW => "new_flow",
        trace_kind::RESCHEDULED => "rescheduled",
        trace_kind::MIDSTREAM => "midstream",
        trace_kind::QUIC_ROUTED => "quic_routed",
        trace_kind::FLOOD => "flood",
        trace_kind::PROXY_COOKIE => "proxy_cookie",
        trace_kind::PROXY_CREATED => "proxy_created",
        trace_kind::PROXY_SYN_AGAIN => "proxy_syn_again",
        trace_kind::PROXY_OPENED => "proxy_opened",
        trace_kind::PROXY_FAILED => "proxy_failed",
        trace_kind::PROXY_STALE => "proxy_stale",
        _ => "dropped",
    };
    let mut text = String::from(match r.kind {
        trace_kind::NEW_FLOW => "new flow",
        trace_kind::RESCHEDULED => "rescheduled",
        trace_kind::MIDSTREAM => "re-created mid-stream",
        trace_kind::QUIC_ROUTED => "new QUIC path by connection ID",
        trace_kind::FLOOD => "new flow in flood mode (no table entry)",
        trace_kind::PROXY_COOKIE => "SYN proxy: SYN answered with a cookie",
        trace_kind::PROXY_CREATED => "SYN proxy: cookie valid, flow created, SYN to the backend",
        trace_kind::PROXY_SYN_AGAIN => "SYN proxy: SYN to the backend again",
        trace_kind::PROXY_OPENED => "SYN proxy: backend answered, flow open",
        trace_kind::PROXY_FAILED => "SYN proxy: backend refused or silent, client reset",
        trace_kind::PROXY_STALE => "SYN proxy: backend's TIME_WAIT answered, SYN past it",
        _ => "dropped",
    });
    let _ = write!(
        text,
        " {} → {}",
        client.as_deref().unwrap_or("?"),
        vip.as_deref().unwrap_or("?")
    );
    if let Some(p) = protocol {
        let _ = write!(text, " {p}");
    }
    if let Some(s) = &service {
        let _ = write!(text, " ({s})");
    }
    text.push(':');
    let verdict_name = verdict.as_deref().unwrap_or("?");
    let dropped_verdict = r.reason < counter::VERDICTS && verdict_name.starts_with("drop_");
    if r.kind == trace_kind::PROXY_COOKIE {
        // No state taken: no backend yet.
        text.push_str(" no state taken");
    } else if r.kind == trace_kind::DROPPED {
        if let Some(prev) = r.prev {
            let _ = write!(text, " rescheduled off backend {},", names.backend(prev));
        }
        if let Some(b) = r.backend {
            let _ = write!(text, " backend {},", names.backend(b));
        }
        let _ = write!(text, " {verdict_name}");
    } else {
        if let Some(prev) = r.prev {
            let _ = write!(text, " backend {} unavailable →", names.backend(prev));
        }
        match r.backend {
            Some(b) => {
                let _ = write!(text, " backend {}", names.backend(b));
            }
            None => text.push_str(" backend ?"),
        }
        let dsr = r.service.and_then(|s| names.dsr.get(&s));
        match (r.snat_port, dsr) {
            (0, Some(mode)) => {
                let _ = write!(text, ", dsr {mode}");
            }
            (0, None) => text.push_str(", dsr"),
            (port, _) => {
                let _ = write!(text, ", snat port {port}");
            }
        }
        if dropped_verdict {
            let _ = write!(text, "; then dropped: {verdict_name}");
        }
    }
    TraceLine {
        time,
        kind: kind.to_owned(),
        text,
        service,
        client,
        vip,
        protocol: protocol.map(str::to_owned),
        backend: r.backend.map(|b| {
            names
                .backends
                .get(&b)
                .map_or_else(|| format!("id {b}"), ToString::to_string)
        }),
        backend_id: r.backend,
        previous_backend: r.prev.map(|b| names.backend(b)),
        snat_port: (r.snat_port != 0).then_some(r.snat_port),
        verdict,
    }
}

/// A line of the trace's own.
pub fn notice(text: String, time: f64) -> TraceLine {
    TraceLine {
        time,
        kind: "notice".to_owned(),
        text,
        service: None,
        client: None,
        vip: None,
        protocol: None,
        backend: None,
        backend_id: None,
        previous_backend: None,
        snat_port: None,
        verdict: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names() -> Names {
        Names {
            services: [(0, "web".to_owned()), (1, "dns".to_owned())].into(),
            backends: [
                (1, "10.0.2.11:8080".parse().unwrap()),
                (2, "10.0.2.12:8080".parse().unwrap()),
            ]
            .into(),
            dsr: [(1, "gue")].into(),
        }
    }

    const NEW: &str = "lbtrace1 kind=1 reason=7 service=0 backend=1 prev=4294967295 snat=31337 proto=6 client=::ffff:10.0.1.2 cport=40000 vip=::ffff:10.100.0.1 vport=80";

    #[test]
    fn records_are_read_back() {
        let r = Record::parse(NEW).unwrap();
        assert_eq!(
            r,
            Record {
                kind: trace_kind::NEW_FLOW,
                reason: counter::FWD_REDIRECT,
                service: Some(0),
                backend: Some(1),
                prev: None,
                snat_port: 31337,
                proto: PROTO_TCP,
                client: Some("10.0.1.2".parse().unwrap()),
                client_port: 40000,
                vip: Some("10.100.0.1".parse().unwrap()),
                vip_port: 80,
            }
        );
        let six = "lbtrace1 kind=4 reason=15 service=4294967295 backend=4294967295 prev=4294967295 snat=0 proto=17 client=2001:db8:1::2 cport=5353 vip=2001:db8:100::1 vport=54";
        let r = Record::parse(six).unwrap();
        assert_eq!(r.client, Some("2001:db8:1::2".parse().unwrap()));
        assert_eq!((r.service, r.backend), (None, None));
        for bad in [
            "",
            "hello",
            "lbtrace2 kind=1",
            &NEW.replace("kind=1", "kind=x"),
            &NEW.replace(" vport=80", ""),
            &NEW.replace("client=::ffff:10.0.1.2", "client=nope"),
        ] {
            assert_eq!(Record::parse(bad), None, "{bad}");
        }
        let unknown = NEW.replace("client=::ffff:10.0.1.2", "client=::");
        assert_eq!(Record::parse(&unknown).unwrap().client, None);
    }

    #[test]
    fn lines_name_what_the_ids_are() {
        let n = names();
        let r = Record::parse(NEW).unwrap();
        let l = line(&r, &n, 1.5);
        assert_eq!(
            l.text,
            "new flow 10.0.1.2:40000 → 10.100.0.1:80 tcp (web): backend 10.0.2.11:8080 (id 1), snat port 31337"
        );
        assert_eq!(l.kind, "new_flow");
        assert_eq!(l.verdict.as_deref(), Some("fwd_redirect"));
        assert_eq!(l.snat_port, Some(31337));

        let moved = Record {
            kind: trace_kind::RESCHEDULED,
            prev: Some(2),
            ..r
        };
        assert_eq!(
            line(&moved, &n, 0.0).text,
            "rescheduled 10.0.1.2:40000 → 10.100.0.1:80 tcp (web): backend 10.0.2.12:8080 (id 2) unavailable → backend 10.0.2.11:8080 (id 1), snat port 31337"
        );
        let mid = Record {
            kind: trace_kind::MIDSTREAM,
            backend: Some(9),
            ..r
        };
        assert_eq!(
            line(&mid, &n, 0.0).text,
            "re-created mid-stream 10.0.1.2:40000 → 10.100.0.1:80 tcp (web): backend id 9, snat port 31337"
        );
        let dsr = Record {
            service: Some(1),
            snat_port: 0,
            proto: PROTO_UDP,
            ..r
        };
        assert_eq!(
            line(&dsr, &n, 0.0).text,
            "new flow 10.0.1.2:40000 → 10.100.0.1:80 udp (dns): backend 10.0.2.11:8080 (id 1), dsr gue"
        );
        let quic = Record {
            kind: trace_kind::QUIC_ROUTED,
            service: Some(1),
            proto: PROTO_UDP,
            ..r
        };
        let l = line(&quic, &n, 0.0);
        assert_eq!(l.kind, "quic_routed");
        assert_eq!(
            l.text,
            "new QUIC path by connection ID 10.0.1.2:40000 → 10.100.0.1:80 udp (dns): backend 10.0.2.11:8080 (id 1), snat port 31337"
        );
        let flood = Record {
            kind: trace_kind::FLOOD,
            service: Some(1),
            snat_port: 0,
            ..r
        };
        let l = line(&flood, &n, 0.0);
        assert_eq!(l.kind, "flood");
        assert_eq!(
            l.text,
            "new flow in flood mode (no table entry) 10.0.1.2:40000 → 10.100.0.1:80 tcp (dns): backend 10.0.2.11:8080 (id 1), dsr gue"
        );
        // The SYN proxy's decisions: a cookie names no backend (none is chosen yet); the
        // flow's later ones are named like a new flow.
        let cookie = Record {
            kind: trace_kind::PROXY_COOKIE,
            reason: counter::SYN_PROXY_SYNACK,
            backend: None,
            snat_port: 0,
            ..r
        };
        let l = line(&cookie, &n, 0.0);
        assert_eq!(l.kind, "proxy_cookie");
        assert_eq!(
            l.text,
            "SYN proxy: SYN answered with a cookie 10.0.1.2:40000 → 10.100.0.1:80 tcp (web): no state taken"
        );
        let opened = Record {
            kind: trace_kind::PROXY_OPENED,
            ..r
        };
        let l = line(&opened, &n, 0.0);
        assert_eq!(l.kind, "proxy_opened");
        assert_eq!(
            l.text,
            "SYN proxy: backend answered, flow open 10.0.1.2:40000 → 10.100.0.1:80 tcp (web): backend 10.0.2.11:8080 (id 1), snat port 31337"
        );
        let failed = Record {
            reason: counter::DROP_NO_ROUTE,
            ..r
        };
        assert!(
            line(&failed, &n, 0.0)
                .text
                .ends_with("snat port 31337; then dropped: drop_no_route")
        );
    }

    #[test]
    fn drops_say_their_verdict() {
        let n = names();
        let r = Record::parse(NEW).unwrap();
        let no_service = Record {
            kind: trace_kind::DROPPED,
            reason: counter::DROP_NO_SERVICE,
            service: None,
            backend: None,
            snat_port: 0,
            vip_port: 81,
            ..r
        };
        let l = line(&no_service, &n, 0.0);
        assert_eq!(
            l.text,
            "dropped 10.0.1.2:40000 → 10.100.0.1:81 tcp: drop_no_service"
        );
        assert_eq!(l.kind, "dropped");
        let rate = Record {
            reason: counter::DROP_SYN_RATE,
            service: Some(0),
            vip_port: 80,
            ..no_service
        };
        assert_eq!(
            line(&rate, &n, 0.0).text,
            "dropped 10.0.1.2:40000 → 10.100.0.1:80 tcp (web): drop_syn_rate"
        );
        let no_backend = Record {
            reason: counter::DROP_NO_BACKEND,
            prev: Some(1),
            ..rate
        };
        assert_eq!(
            line(&no_backend, &n, 0.0).text,
            "dropped 10.0.1.2:40000 → 10.100.0.1:80 tcp (web): rescheduled off backend 10.0.2.11:8080 (id 1), drop_no_backend"
        );
        let icmp = Record {
            reason: counter::DROP_ICMP_RATE,
            proto: PROTO_ICMP,
            service: None,
            prev: None,
            ..no_service
        };
        assert_eq!(
            line(&icmp, &n, 0.0).text,
            "dropped 10.0.1.2 → 10.100.0.1 icmp: drop_icmp_rate"
        );
        let unreadable = Record {
            reason: counter::DROP_MALFORMED,
            proto: 0,
            client: None,
            ..icmp
        };
        assert_eq!(
            line(&unreadable, &n, 0.0).text,
            "dropped ? → 10.100.0.1: drop_malformed"
        );
    }

    #[test]
    fn filters_by_service_and_client_prefix() {
        let r = Record::parse(NEW).unwrap();
        let f = |service, client: Option<&str>| Filter {
            service,
            client: client.map(|c| parse_client(c).unwrap()),
        };
        assert!(f(None, None).matches(&r));
        assert!(f(Some(0), None).matches(&r));
        assert!(!f(Some(1), None).matches(&r));
        assert!(f(None, Some("10.0.1.2")).matches(&r));
        assert!(f(Some(0), Some("10.0.1.0/24")).matches(&r));
        assert!(!f(None, Some("10.0.1.3")).matches(&r));
        assert!(!f(None, Some("2001:db8::/32")).matches(&r));
        assert!(f(None, Some("0.0.0.0/0")).matches(&r));
        let none = Record {
            service: None,
            client: None,
            ..r
        };
        assert!(!f(Some(0), None).matches(&none));
        assert!(!f(None, Some("10.0.1.2")).matches(&none));

        assert_eq!(parse_client("10.0.1.2").unwrap().1, 32);
        assert_eq!(parse_client("[2001:db8::1]").unwrap().1, 128);
        assert!(parse_client("10.0.1.2/33").is_err());
        assert!(parse_client("web").is_err());

        let (a, b) = (f(Some(0), Some("10.0.1.2")), f(Some(0), Some("10.0.1.9")));
        assert_eq!(Filter::union([&a, &a]), a);
        assert_eq!(Filter::union([&a, &b]), f(Some(0), None));
        assert_eq!(Filter::union([&a, &f(None, None)]), f(None, None));
        assert_eq!(Filter::union([]), f(None, None));
    }

    #[test]
    fn names_of_removed_ids_stay() {
        let old = names();
        let newer = Names {
            services: [(0, "web".to_owned())].into(),
            backends: [(3, "10.0.2.13:8080".parse().unwrap())].into(),
            dsr: HashMap::new(),
        };
        let m = old.merged(newer);
        assert_eq!(m.backends.len(), 3, "removed backends keep their address");
        assert_eq!(m.services[&1], "dns");
        assert_eq!(
            m.dsr.get(&1),
            Some(&"gue"),
            "a service not renamed keeps its mode"
        );
    }
}
