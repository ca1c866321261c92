//! `[service.check]`: which active check a service's backends get, its timing and thresholds
//! (SPEC §2 ranges and defaults), and the kind-specific options.

use std::{ops::RangeInclusive, time::Duration};

use bytes::Bytes;

use super::WindowSettings;
use super::{
    Expect, Protocol,
    fields::{Fields, Shown},
};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CheckKind {
    /// Half-open: SYN, SYN+ACK = up (then the kernel's RST), RST = down.
    Tcp,
    /// Full handshake, optional send/expect.
    TcpConnect,
    /// ICMP echo plus a datagram (port unreachable = down), or send/expect.
    Udp,
    /// A QUIC first datagram of a reserved version: a Version Negotiation answer = up.
    Quic,
    Icmp,
    Http,
    Https,
    /// No checks: backends count as available (state `disabled`).
    None,
}

impl CheckKind {
    /// Every kind, in declaration order (`kind as usize` indexes it).
    pub const ALL: [Self; 8] = [
        Self::Tcp,
        Self::TcpConnect,
        Self::Udp,
        Self::Quic,
        Self::Icmp,
        Self::Http,
        Self::Https,
        Self::None,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Tcp => "tcp",
            Self::TcpConnect => "tcp-connect",
            Self::Udp => "udp",
            Self::Quic => "quic",
            Self::Icmp => "icmp",
            Self::Http => "http",
            Self::Https => "https",
            Self::None => "none",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum HttpMethod {
    Get,
    Head,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct HttpOptions {
    pub method: HttpMethod,
    pub path: String,
    /// None: the backend's ip:port.
    pub host: Option<String>,
    pub headers: Vec<(String, String)>,
    /// Healthy status codes (default 200-399).
    pub status: Vec<RangeInclusive<u16>>,
    /// Codes that count as failures; None: every code outside `status`.
    pub unhealthy_status: Option<Vec<RangeInclusive<u16>>>,
    /// HTTPS only: verify the certificate (default true).
    pub verify_tls: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Check {
    pub kind: CheckKind,
    /// Probe this port instead of the backend's.
    pub port: Option<u16>,
    pub window: WindowSettings,
    /// tcp-connect and udp: bytes to send, and what the reply must hold. Shared, not copied:
    /// every backend's probe key holds this check (up to 4 KiB each, 10,000 targets), and
    /// each probe sends from it.
    pub send: Option<Bytes>,
    pub expect: Option<Expect>,
    /// http and https.
    pub http: Option<HttpOptions>,
    /// Direct server return: probe the VIP on the backend through the service's tunnel (the
    /// probe encapsulated as the traffic is) rather than the backend's own address. tcp,
    /// tcp-connect, http and https.
    pub through_tunnel: bool,
}

impl Check {
    /// SPEC's windows in seconds: (failure window, success window at the worst response time,
    /// the timeout). None for kind none.
    pub fn windows(&self) -> Option<(f64, f64)> {
        (self.kind != CheckKind::None).then(|| {
            let w = &self.window;
            (
                w.failure_window().as_secs_f64(),
                w.success_window(w.timeout).as_secs_f64(),
            )
        })
    }

    /// The check a service gets without a `[service.check]` table: half-open TCP for TCP
    /// services, the UDP check for UDP services, with the SPEC defaults.
    pub fn default_for(protocol: Protocol) -> Self {
        Self {
            kind: match protocol {
                Protocol::Tcp => CheckKind::Tcp,
                Protocol::Udp => CheckKind::Udp,
            },
            port: None,
            window: WindowSettings::default(),
            send: None,
            expect: None,
            http: None,
            through_tunnel: false,
        }
    }

    /// The kind as events and logs name the check: "tcp", or "tcp through the tunnel".
    pub fn label(&self) -> String {
        if self.through_tunnel {
            format!("{} through the tunnel", self.kind.as_str())
        } else {
            self.kind.as_str().to_owned()
        }
    }

    /// The kinds whose probes can go through the tunnel: TCP connections, which lb's TC
    /// program encapsulates and whose replies its XDP program recognises.
    pub fn tunnels(kind: CheckKind) -> bool {
        matches!(
            kind,
            CheckKind::Tcp | CheckKind::TcpConnect | CheckKind::Http | CheckKind::Https
        )
    }
}

/// Healthy HTTP status codes unless configured: 200-399.
pub fn default_status() -> Vec<RangeInclusive<u16>> {
    std::iter::once(200..=399).collect()
}

/// Sub-second values are accepted for tests and demos; the documented ranges are in seconds.
const MIN: Duration = Duration::from_millis(10);

pub fn read_check(f: &Fields, protocol: Protocol) -> Option<Check> {
    let d = Check::default_for(protocol);
    let kind = f.choice(
        "kind",
        &[
            ("tcp", CheckKind::Tcp),
            ("tcp-connect", CheckKind::TcpConnect),
            ("udp", CheckKind::Udp),
            ("quic", CheckKind::Quic),
            ("icmp", CheckKind::Icmp),
            ("http", CheckKind::Http),
            ("https", CheckKind::Https),
            ("none", CheckKind::None),
        ],
        d.kind,
    );
    let port = f
        .int_in("port", 1..=65535, 0)
        .map(|p| (p != 0).then_some(p as u16));
    let timeout = f.duration("timeout", MIN..=Duration::from_secs(60), d.window.timeout);
    let interval = f.duration(
        "interval",
        MIN..=Duration::from_secs(300),
        d.window.interval,
    );
    let unhealthy_interval = match f.has("unhealthy_interval") {
        true => f.duration(
            "unhealthy_interval",
            MIN..=Duration::from_secs(300),
            Duration::ZERO,
        ),
        false => interval,
    };
    let healthy = f.int_in("healthy_threshold", 1..=10, 3).map(|n| n as u32);
    let unhealthy = f.int_in("unhealthy_threshold", 1..=10, 3).map(|n| n as u32);
    // Optional: absent means unhealthy_threshold.
    let per_kind = |f: &Fields, key: &'static str| match f.has(key) {
        true => f.int_in(key, 1..=254, 0).map(|n| Some(n as u32)),
        false => Some(None),
    };
    let tcp_failures = per_kind(f, "tcp_failures");
    let timeouts = per_kind(f, "timeouts");
    let http_failures = per_kind(f, "http_failures");
    // Seed 004: an interval is at least the timeout; the period while unavailable too.
    if let (Some(t), Some(i)) = (timeout, interval)
        && i < t
    {
        f.problem("interval", "must not be shorter than timeout");
    }
    if let (Some(t), Some(u)) = (timeout, unhealthy_interval)
        && f.has("unhealthy_interval")
        && u < t
    {
        f.problem("unhealthy_interval", "must not be shorter than timeout");
    }
    let send = payload(f, "send", "send_hex").map(Bytes::from);
    let expect = read_expect(f);
    let http = read_http(f, kind);
    let through_tunnel = f.bool_or("through_tunnel", false);
    // Options that do not belong to the kind are mistakes, not silently ignored settings.
    if let Some(kind) = kind {
        let payload = matches!(kind, CheckKind::TcpConnect | CheckKind::Udp);
        for key in PAYLOAD_KEYS {
            if !payload && f.has(key) {
                f.problem(
                    key,
                    format!("only for tcp-connect and udp checks, not {}", kind.as_str()),
                );
            }
        }
        let sends = f.has("send") || f.has("send_hex");
        for key in ["expect", "expect_hex"] {
            if f.has(key) && !sends && kind == CheckKind::Udp {
                f.problem(key, "needs send (or send_hex)");
            }
        }
        if through_tunnel == Some(true) && !Check::tunnels(kind) {
            f.problem(
                "through_tunnel",
                format!(
                    "not for {} checks: tcp, tcp-connect, http and https probes go through the \
                     tunnel",
                    kind.as_str()
                ),
            );
        }
        if kind == CheckKind::None && f.has("port") {
            f.problem("port", "kind = \"none\" probes nothing");
        }
        if f.has("http_failures") && !matches!(kind, CheckKind::Http | CheckKind::Https) {
            f.problem(
                "http_failures",
                format!(
                    "only http and https checks have HTTP failures, not {}",
                    kind.as_str()
                ),
            );
        }
        for key in ["tcp_failures", "timeouts"] {
            if kind == CheckKind::None && f.has(key) {
                f.problem(key, "kind = \"none\" probes nothing");
            }
        }
        // A TCP probe of a UDP port (or the other way round) checks a port nobody serves; a
        // health port of the other protocol is common, so it is fine once named.
        let probes = match kind {
            CheckKind::Tcp | CheckKind::TcpConnect | CheckKind::Http | CheckKind::Https => {
                Some(Protocol::Tcp)
            }
            CheckKind::Udp | CheckKind::Quic => Some(Protocol::Udp),
            CheckKind::Icmp | CheckKind::None => None,
        };
        if let Some(probes) = probes
            && probes != protocol
            && !f.has("port")
        {
            f.problem(
                "kind",
                format!(
                    "a {} check probes {} but the service is {}: set port to the {} port to probe",
                    kind.as_str(),
                    probes.as_str().to_uppercase(),
                    protocol.as_str().to_uppercase(),
                    probes.as_str().to_uppercase(),
                ),
            );
        }
    }
    f.finish();
    let mut window = WindowSettings {
        timeout: timeout?,
        interval: interval?,
        unhealthy_interval: unhealthy_interval?,
        healthy_threshold: healthy?,
        unhealthy_threshold: unhealthy?,
        tcp_failures: tcp_failures?,
        timeouts: timeouts?,
        http_failures: http_failures?,
    };
    if window.unhealthy_interval.is_zero() {
        window.unhealthy_interval = window.interval;
    }
    Some(Check {
        kind: kind?,
        port: port?,
        window,
        send,
        expect,
        http: http?,
        through_tunnel: through_tunnel?,
    })
}

/// Longest `send` / `expect` payload: a health check, not a transfer.
pub const MAX_PAYLOAD: usize = 4096;
/// Longest `host`: a DNS name (253) with a port.
pub const MAX_HOST: usize = 260;
/// Longest `path` (request target).
pub const MAX_PATH: usize = 2048;
/// Extra headers at most, and the longest name and value.
pub const MAX_HEADERS: usize = 32;
pub const MAX_HEADER_NAME: usize = 64;
pub const MAX_HEADER_VALUE: usize = 1024;
/// Entries of `status` at most.
pub const MAX_STATUS: usize = 64;

/// `send` / `expect`: non-empty (leave the key out to send nothing), at most [`MAX_PAYLOAD`].
/// The payload keys, for the kinds that have none.
const PAYLOAD_KEYS: [&str; 6] = [
    "send",
    "send_hex",
    "expect",
    "expect_hex",
    "expect_offset",
    "expect_mask_hex",
];

/// Bytes given as text at `key` or as hex at `hex_key` (one of them).
fn payload(f: &Fields, key: &'static str, hex_key: &'static str) -> Option<Vec<u8>> {
    let bytes = match (f.has(key), f.has(hex_key)) {
        (true, true) => {
            f.problem(hex_key, format!("give {key} or {hex_key}, not both"));
            return None;
        }
        (true, false) => f.str(key)?.as_bytes().to_vec(),
        (false, true) => hex(f, hex_key)?,
        (false, false) => return None,
    };
    let shown = if f.has(key) { key } else { hex_key };
    if bytes.is_empty() {
        f.problem(shown, "empty: leave the key out instead");
    } else if bytes.len() > MAX_PAYLOAD {
        f.problem(
            shown,
            format!("{} bytes, more than {MAX_PAYLOAD}", bytes.len()),
        );
    }
    Some(bytes)
}

fn hex(f: &Fields, key: &'static str) -> Option<Vec<u8>> {
    let text = f.str(key)?;
    match super::payload::parse_hex(text) {
        Ok(bytes) => Some(bytes),
        Err(e) => {
            f.problem(key, format!("expected hex bytes (\"12 34 ab\"): {e}"));
            None
        }
    }
}

/// `expect`/`expect_hex`, with `expect_offset` and `expect_mask_hex`.
fn read_expect(f: &Fields) -> Option<Expect> {
    let bytes = payload(f, "expect", "expect_hex");
    let offset = f
        .int_in("expect_offset", 0..=MAX_PAYLOAD as i64, 0)
        .map(|n| n as usize);
    let mask = match f.has("expect_mask_hex") {
        true => hex(f, "expect_mask_hex"),
        false => None,
    };
    if bytes.is_none() {
        for key in ["expect_offset", "expect_mask_hex"] {
            if f.has(key) {
                f.problem(key, "needs expect (or expect_hex)");
            }
        }
        return None;
    }
    let bytes = bytes?;
    if let Some(m) = &mask
        && m.len() != bytes.len()
    {
        f.problem(
            "expect_mask_hex",
            format!(
                "{} bytes, but expect has {}: one mask byte per expected byte",
                m.len(),
                bytes.len()
            ),
        );
    }
    Some(Expect {
        bytes,
        offset: offset?,
        mask,
    })
}

/// The HTTP options: required shape for http/https, refused for other kinds.
fn read_http(f: &Fields, kind: Option<CheckKind>) -> Option<Option<HttpOptions>> {
    let is_http = matches!(kind, Some(CheckKind::Http | CheckKind::Https));
    let keys = [
        "method",
        "path",
        "host",
        "headers",
        "status",
        "unhealthy_status",
        "verify_tls",
    ];
    if !is_http {
        if let Some(kind) = kind {
            for key in keys {
                if f.has(key) {
                    f.problem(
                        key,
                        format!("only for http and https checks, not {}", kind.as_str()),
                    );
                }
            }
        }
        return Some(None);
    }
    let method = f.choice(
        "method",
        &[("GET", HttpMethod::Get), ("HEAD", HttpMethod::Head)],
        HttpMethod::Get,
    );
    let path = match f.str("path") {
        None => Some("/".to_owned()),
        Some(p) if p.len() > MAX_PATH => {
            f.problem("path", format!("{} bytes, more than {MAX_PATH}", p.len()));
            None
        }
        Some(p)
            if p.starts_with('/') && !p.contains(|c: char| c.is_whitespace() || c.is_control()) =>
        {
            Some(p.to_owned())
        }
        Some(p) => {
            f.problem(
                "path",
                format!(
                    "expected an absolute path without spaces, got {:?}",
                    Shown(p)
                ),
            );
            None
        }
    };
    let host = match f.str("host") {
        Some(h) if h.len() > MAX_HOST => {
            f.problem("host", format!("{} bytes, more than {MAX_HOST}", h.len()));
            None
        }
        Some(h) if h.is_empty() || h.contains(|c: char| c.is_whitespace() || c.is_control()) => {
            f.problem("host", format!("invalid host {:?}", Shown(h)));
            None
        }
        h => Some(h.map(str::to_owned)),
    };
    let headers = match f.table("headers") {
        None => Some(Vec::new()),
        Some(t) if t.len() > MAX_HEADERS => {
            f.problem(
                "headers",
                format!("{} headers, more than {MAX_HEADERS}", t.len()),
            );
            None
        }
        Some(t) => {
            let mut out = Vec::new();
            let mut ok = true;
            for (name, value) in t {
                let path = format!("headers.{}", super::fields::file_key(name));
                let valid_name = !name.is_empty()
                    && name.len() <= MAX_HEADER_NAME
                    && name
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || "-_".contains(c));
                match value.as_str() {
                    Some(v) if v.len() > MAX_HEADER_VALUE => {
                        f.problem(
                            &path,
                            format!("{} bytes, more than {MAX_HEADER_VALUE}", v.len()),
                        );
                        ok = false;
                    }
                    Some(v) if valid_name && !v.contains(|c: char| c.is_control() && c != '\t') => {
                        out.push((name.clone(), v.to_owned()))
                    }
                    _ => {
                        f.problem(&path, format!("expected a header name (1-{MAX_HEADER_NAME} of A-Z a-z 0-9 - _) with a single-line string value"));
                        ok = false;
                    }
                }
            }
            ok.then_some(out)
        }
    };
    let status = match codes(f, "status") {
        Some(None) => Some(default_status()),
        other => other.flatten(),
    };
    // Seed 002 (APISIX): codes that count as failures; then a code in neither set moves no
    // counter. Absent: every code outside `status` is a failure.
    let unhealthy_status = codes(f, "unhealthy_status");
    if let (Some(healthy), Some(Some(unhealthy))) = (&status, &unhealthy_status)
        && let Some(code) = (100..=599u16).find(|c| {
            healthy.iter().any(|r| r.contains(c)) && unhealthy.iter().any(|r| r.contains(c))
        })
    {
        f.problem(
            "unhealthy_status",
            format!("{code} is in status too: a code is healthy or unhealthy, not both"),
        );
    }
    let verify_tls = match (kind, f.has("verify_tls")) {
        (Some(CheckKind::Https), _) => f.bool_or("verify_tls", true),
        (_, true) => {
            f.problem("verify_tls", "only for https checks");
            None
        }
        _ => Some(true),
    };
    Some(Some(HttpOptions {
        method: method?,
        path: path?,
        host: host?,
        headers: headers?,
        status: status?,
        unhealthy_status: unhealthy_status?,
        verify_tls: verify_tls?,
    }))
}

/// A list of status codes and "FIRST-LAST" ranges at `key`: `Some(None)` when absent, `None`
/// on a problem (reported).
fn codes(f: &Fields, key: &'static str) -> Option<Option<Vec<RangeInclusive<u16>>>> {
    if !f.has(key) {
        return Some(None);
    }
    let items = f.array(key)?;
    if items.len() > MAX_STATUS {
        f.problem(
            key,
            format!("{} entries, more than {MAX_STATUS}", items.len()),
        );
        return None;
    }
    if items.is_empty() {
        f.problem(key, "at least one status code or range");
        return None;
    }
    let mut out = Vec::new();
    let mut ok = true;
    for (i, item) in items.iter().enumerate() {
        let parsed = match (item.as_integer(), item.as_str()) {
            (Some(n), _) => u16::try_from(n).ok().map(|n| n..=n),
            (_, Some(s)) => s.split_once('-').and_then(|(a, b)| {
                Some(a.trim().parse::<u16>().ok()?..=b.trim().parse::<u16>().ok()?)
            }),
            _ => None,
        };
        match parsed.filter(|r| {
            (100..=599).contains(r.start()) && (100..=599).contains(r.end()) && r.start() <= r.end()
        }) {
            Some(r) => out.push(r),
            None => {
                f.problem(
                    &format!("{key}[{i}]"),
                    "expected a code 100-599 or \"FIRST-LAST\"",
                );
                ok = false;
            }
        }
    }
    ok.then_some(Some(out))
}
