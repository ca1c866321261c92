//! HTTP and HTTPS probes (SPEC §2 `http` / `https`; seeds 001, 002, 004).
//!
//! One probe opens a TCP connection to the target (TLS on top for `https`), sends one `GET` or
//! `HEAD` request with `Connection: close`, reads until the status line of the final answer has
//! arrived and drops the connection: the body, and the rest of the header, are never read. The
//! whole exchange (connect, TLS handshake, request, status line) is bounded by the probe timeout.
//!
//! How an outcome maps to a [`ProbeResult`]:
//! - `Success`: a status line with a code in the healthy set; latency = time from the start of
//!   the probe (connect included) until that line arrived.
//! - `HttpFailure`: a status line with another code; or an answer that is not an HTTP/1.x status
//!   line, [`MAX_HEAD`] bytes without a complete one, or a clean close before one (the connection
//!   worked, the application did not answer).
//! - `TcpFailure`: connection refused, reset or unreachable, any other socket error; and a failed
//!   TLS handshake, whatever broke it (certificate that does not verify, protocol error, close in
//!   the middle): seed 000 counts TLS handshake failures as connection failures.
//! - `Timeout`: no complete status line within the timeout, an unanswered SYN included.
//!
//! Interim `1xx` answers (e.g. `103 Early Hints`) are skipped, as a client must; `101` is final
//! (the probe never asks to switch protocols).
//!
//! Header injection: the request is built from configured strings. [`HttpCheck::validate`] is
//! for the config reader and refuses anything that could break the request's framing (CR, LF or
//! NUL in a header value, a header name that is not a token, a path or Host with spaces or control
//! characters, and the headers the probe owns: `Host`, `Connection`, `Content-Length`,
//! `Transfer-Encoding`). [`request`] does not trust that this ran: it percent-encodes spaces,
//! control characters and non-ASCII bytes in the path, strips CR/LF/NUL (and whitespace) from the
//! Host and CR/LF/NUL from header values, and drops headers with an invalid or reserved name, so
//! no configuration can smuggle a second header or request into the probe.

use std::{
    fmt,
    net::{IpAddr, SocketAddr},
    ops::RangeInclusive,
    sync::Arc,
    time::{Duration, Instant},
};

use rustls::{
    ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
    client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier},
    crypto::WebPkiSupportedAlgorithms,
    pki_types::{CertificateDer, DnsName, ServerName, UnixTime},
};
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};
use tokio_rustls::TlsConnector;

use super::{ProbeResult, Via};
use crate::health::outcome::{Reason, from_io, from_tls};

/// The most the probe reads while looking for the status line of the final answer. An answer
/// with no complete status line within this many bytes is not HTTP (`HttpFailure`).
pub const MAX_HEAD: usize = crate::health::outcome::HTTP_MAX_HEAD;

/// The `User-Agent` the probe sends unless the check configures its own.
pub const USER_AGENT: &str = "lb-health";

/// Header names the probe writes itself: configuring them as extra headers would duplicate them
/// or break the request's framing.
const RESERVED_HEADERS: [&str; 4] = ["host", "connection", "content-length", "transfer-encoding"];

/// The request method.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    Get,
    Head,
}

impl Method {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Get => "GET",
            Self::Head => "HEAD",
        }
    }
}

/// What an `http` / `https` check sends and which answers count as healthy.
#[derive(Debug, Clone)]
pub struct HttpCheck {
    pub method: Method,
    /// The request target; starts with '/'.
    pub path: String,
    /// The Host header; `None`: "ip:port" of the target (`[v6]:port` for an IPv6 one).
    pub host: Option<String>,
    /// Extra request headers, sent in this order after the probe's own.
    pub headers: Vec<(String, String)>,
    /// Status codes that count as healthy.
    pub healthy: Vec<RangeInclusive<u16>>,
    /// Status codes that count as failures; `None`: every code not healthy. With a set, a code
    /// in neither is [`ProbeResult::Neutral`] (seed 002, APISIX).
    pub unhealthy: Option<Vec<RangeInclusive<u16>>>,
    /// `Some` for `https`, `None` for plain HTTP.
    pub tls: Option<TlsCheck>,
}

/// TLS settings of an `https` check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsCheck {
    /// Verify the certificate chain against the webpki roots and the name (default true).
    pub verify: bool,
    /// The name sent as SNI and verified against the certificate; see [`server_name`].
    pub server_name: Option<String>,
}

impl Default for TlsCheck {
    fn default() -> Self {
        Self {
            verify: true,
            server_name: None,
        }
    }
}

impl Default for HttpCheck {
    /// `GET /`, Host = target ip:port, no extra headers, healthy 200–399, plain HTTP.
    fn default() -> Self {
        Self {
            method: Method::Get,
            path: "/".into(),
            host: None,
            headers: Vec::new(),
            healthy: vec![RangeInclusive::new(200, 399)],
            unhealthy: None,
            tls: None,
        }
    }
}

/// Why a check cannot be used, from [`HttpCheck::validate`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidHttpCheck {
    #[error("path {0:?} must start with '/' and contain no spaces or control characters")]
    Path(String),
    #[error("host {0:?} must be non-empty printable ASCII without spaces")]
    Host(String),
    #[error("header name {0:?} is not a valid HTTP token")]
    HeaderName(String),
    #[error("header {0:?} is set by the probe itself and cannot be configured")]
    ReservedHeader(String),
    #[error("the value of header {0:?} contains CR, LF or NUL")]
    HeaderValue(String),
    #[error("the healthy status set is empty")]
    NoHealthyStatus,
    #[error("healthy status range {0}-{1} must be non-empty and within 100-999")]
    StatusRange(u16, u16),
    #[error("TLS server name {0:?} is neither a DNS name nor an IP address")]
    ServerName(String),
}

impl HttpCheck {
    /// Checks that the request built from this check is exactly what it says (see the module
    /// doc): for the config reader, so a bad value is refused when the config is loaded rather
    /// than silently cleaned at every probe.
    pub fn validate(&self) -> Result<(), InvalidHttpCheck> {
        if !self.path.starts_with('/') || self.path.bytes().any(|b| b <= b' ' || b == 0x7f) {
            return Err(InvalidHttpCheck::Path(self.path.clone()));
        }
        if let Some(host) = &self.host
            && (host.is_empty() || !host.bytes().all(|b| b.is_ascii_graphic()))
        {
            return Err(InvalidHttpCheck::Host(host.clone()));
        }
        for (name, value) in &self.headers {
            if !is_token(name) {
                return Err(InvalidHttpCheck::HeaderName(name.clone()));
            }
            if is_reserved(name) {
                return Err(InvalidHttpCheck::ReservedHeader(name.clone()));
            }
            if value.bytes().any(|b| matches!(b, b'\r' | b'\n' | 0)) {
                return Err(InvalidHttpCheck::HeaderValue(name.clone()));
            }
        }
        if self.healthy.is_empty() {
            return Err(InvalidHttpCheck::NoHealthyStatus);
        }
        for r in &self.healthy {
            if r.is_empty() || *r.start() < 100 || *r.end() > 999 {
                return Err(InvalidHttpCheck::StatusRange(*r.start(), *r.end()));
            }
        }
        if let Some(TlsCheck {
            server_name: Some(name),
            ..
        }) = &self.tls
            && host_name(name).is_none()
        {
            return Err(InvalidHttpCheck::ServerName(name.clone()));
        }
        Ok(())
    }

    /// Whether `status` is in the healthy set.
    pub fn is_healthy(&self, status: u16) -> bool {
        self.healthy.iter().any(|r| r.contains(&status))
    }

    /// What an answer with `status` is.
    pub fn judge(&self, status: u16, latency: Duration) -> ProbeResult {
        if self.is_healthy(status) {
            return ProbeResult::Success { latency };
        }
        match &self.unhealthy {
            Some(set) if !set.iter().any(|r| r.contains(&status)) => {
                ProbeResult::Neutral(Reason::Status(status))
            }
            _ => ProbeResult::HttpFailure(Reason::Status(status)),
        }
    }
}

/// An RFC 9110 token (header field name).
fn is_token(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

fn is_reserved(name: &str) -> bool {
    RESERVED_HEADERS
        .iter()
        .any(|r| r.eq_ignore_ascii_case(name))
}

/// The request a probe sends: HTTP/1.1 with `Host`, `User-Agent: lb-health` (unless an extra
/// header sets its own), `Connection: close`, then the extra headers. Defensive against header
/// injection whether or not [`HttpCheck::validate`] ran (see the module doc).
pub fn request(check: &HttpCheck, target: SocketAddr) -> String {
    let mut path = String::with_capacity(check.path.len() + 1);
    if !check.path.starts_with('/') {
        path.push('/');
    }
    for b in check.path.bytes() {
        if b <= b' ' || b >= 0x7f {
            path.push_str(&format!("%{b:02X}"));
        } else {
            path.push(char::from(b));
        }
    }
    let host = match &check.host {
        Some(h) => h
            .chars()
            .filter(|c| !c.is_whitespace() && !c.is_control())
            .collect(),
        None => target.to_string(),
    };
    let extra: Vec<(&str, String)> = check
        .headers
        .iter()
        .filter(|(name, _)| is_token(name) && !is_reserved(name))
        .map(|(name, value)| {
            let value = value
                .chars()
                .filter(|c| !matches!(c, '\r' | '\n' | '\0'))
                .collect::<String>();
            (name.as_str(), value.trim().to_string())
        })
        .collect();
    let own_agent = extra
        .iter()
        .any(|(name, _)| name.eq_ignore_ascii_case("user-agent"));

    let mut req = format!(
        "{} {path} HTTP/1.1\r\nHost: {host}\r\n",
        check.method.as_str()
    );
    if !own_agent {
        req.push_str(&format!("User-Agent: {USER_AGENT}\r\n"));
    }
    req.push_str("Connection: close\r\n");
    for (name, value) in extra {
        req.push_str(&format!("{name}: {value}\r\n"));
    }
    req.push_str("\r\n");
    req
}

/// The status code of an HTTP/1.x status line (`HTTP/1.1 200 OK`), read from the first line of
/// `head` (up to the first LF, or all of it; a CR before the LF is ignored). `None` when it is
/// not one. Codes 100–999 are accepted; the reason phrase may be missing.
pub fn parse_status(head: &[u8]) -> Option<u16> {
    let line = match head.iter().position(|&b| b == b'\n') {
        Some(eol) => &head[..eol],
        None => head,
    };
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let rest = line.strip_prefix(VERSION_PREFIX)?;
    let (&minor, rest) = rest.split_first()?;
    if !minor.is_ascii_digit() {
        return None;
    }
    let rest = rest.strip_prefix(b" ")?;
    if rest.len() < 3 || (rest.len() > 3 && rest[3] != b' ') {
        return None;
    }
    let digits = &rest[..3];
    if !digits.iter().all(u8::is_ascii_digit) || digits[0] == b'0' {
        return None;
    }
    Some(digits.iter().fold(0, |n, d| n * 10 + u16::from(d - b'0')))
}

/// What the bytes read so far say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Head {
    /// No complete status line of a final answer yet.
    Incomplete,
    /// The final answer's status code.
    Final(u16),
    /// Not HTTP.
    Invalid,
}

const VERSION_PREFIX: &[u8] = b"HTTP/1.";

/// Looks for the final answer's status line in `buf`, skipping interim 1xx answers (status line,
/// header fields, empty line) other than 101. Bytes that cannot start a status line are
/// `Invalid` at once, so a non-HTTP server that says something and waits is an `HttpFailure`,
/// not a `Timeout`.
fn scan_head(buf: &[u8]) -> Head {
    let mut rest = buf;
    loop {
        let Some(eol) = rest.iter().position(|&b| b == b'\n') else {
            // Not even the start of a status line: no need to wait for its end.
            let start = &rest[..rest.len().min(VERSION_PREFIX.len())];
            return if VERSION_PREFIX.starts_with(start) {
                Head::Incomplete
            } else {
                Head::Invalid
            };
        };
        let Some(code) = parse_status(&rest[..eol]) else {
            return Head::Invalid;
        };
        if !(100..200).contains(&code) || code == 101 {
            return Head::Final(code);
        }
        rest = &rest[eol + 1..];
        loop {
            let Some(eol) = rest.iter().position(|&b| b == b'\n') else {
                return Head::Incomplete;
            };
            let line = &rest[..eol];
            rest = &rest[eol + 1..];
            if line.is_empty() || line == b"\r" {
                break;
            }
        }
    }
}

/// The TLS name of a probe: `tls.server_name` if set and valid; else the `host` if it is a DNS
/// name or an IP literal; else the target's IP. Either may carry a port (`name:port`,
/// `[v6]:port`), which is removed, and a DNS name's trailing dot is dropped. A DNS name is sent
/// as SNI and verified against the certificate's DNS names; an IP is never sent as SNI (RFC 6066)
/// and is verified against the certificate's IP addresses.
pub fn server_name(check: &HttpCheck, tls: &TlsCheck, target: SocketAddr) -> ServerName<'static> {
    if let Some(name) = &tls.server_name
        && let Some(name) = host_name(name)
    {
        return name;
    }
    if let Some(host) = &check.host
        && let Some(name) = host_name(host)
    {
        return name;
    }
    ServerName::from(target.ip())
}

/// The TLS name in a Host value: `name`, `name:port`, `1.2.3.4:port`, `[v6]:port`, or a bare IP
/// literal (`2001:db8::1`, whose colons are not a port's); `None` when it is neither a DNS name
/// nor an IP address.
fn host_name(host: &str) -> Option<ServerName<'static>> {
    if let Ok(ip) = host.parse::<IpAddr>() {
        return Some(ServerName::from(ip));
    }
    let name = if let Some(v6) = host.strip_prefix('[') {
        v6.split_once(']')?.0
    } else {
        match host.rsplit_once(':') {
            Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
            _ => host,
        }
    };
    if let Ok(ip) = name.parse::<IpAddr>() {
        return Some(ServerName::from(ip));
    }
    let name = name.strip_suffix('.').unwrap_or(name);
    DnsName::try_from(name)
        .ok()
        .map(|n| ServerName::DnsName(n.to_owned()))
}

/// The TLS client configurations of all HTTPS probes, built once and shared: building one parses
/// the whole root store, and sharing it shares the session cache (resumed handshakes are cheaper
/// for the backends). Uses the ring provider explicitly, never a process-wide default.
#[derive(Debug, Clone)]
pub struct TlsConfigs {
    /// Verifies the chain against the roots and the name against [`server_name`].
    verifying: Arc<ClientConfig>,
    /// Accepts any certificate (`verify = false`): see [`AcceptAnyCert`].
    insecure: Arc<ClientConfig>,
}

impl Default for TlsConfigs {
    fn default() -> Self {
        Self::new()
    }
}

impl TlsConfigs {
    /// Verification against the Mozilla roots of `webpki-roots` (no system trust store).
    pub fn new() -> Self {
        Self::with_roots(RootCertStore {
            roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
        })
    }

    /// Verification against `roots` instead (a private CA; the tests).
    pub fn with_roots(roots: RootCertStore) -> Self {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = || {
            ClientConfig::builder_with_provider(provider.clone())
                .with_safe_default_protocol_versions()
                .expect("the ring provider supports the default protocol versions")
        };
        let mut verifying = builder()
            .with_root_certificates(roots)
            .with_no_client_auth();
        let mut insecure = builder()
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AcceptAnyCert(
                provider.signature_verification_algorithms,
            )))
            .with_no_client_auth();
        for cfg in [&mut verifying, &mut insecure] {
            cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
        }
        Self {
            verifying: Arc::new(verifying),
            insecure: Arc::new(insecure),
        }
    }

    fn get(&self, verify: bool) -> Arc<ClientConfig> {
        if verify {
            self.verifying.clone()
        } else {
            self.insecure.clone()
        }
    }
}

/// The certificate verifier of `verify = false`. DANGEROUS: it accepts any certificate for any
/// name, so the probe cannot tell the backend from anything that answers in its place. It exists
/// because many backends serve self-signed or internal-CA certificates that no public root
/// vouches for, and the check only asks whether the backend answers HTTPS correctly; the
/// connection is still encrypted, and the handshake signatures are still checked (the server
/// holds the key of the certificate it shows, whatever that certificate is).
struct AcceptAnyCert(WebPkiSupportedAlgorithms);

impl fmt::Debug for AcceptAnyCert {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("AcceptAnyCert")
    }
}

impl ServerCertVerifier for AcceptAnyCert {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_schemes()
    }
}

/// Probes `target` once with `check`, bounded by `timeout` as a whole.
pub async fn probe(
    check: &HttpCheck,
    tls: &TlsConfigs,
    target: SocketAddr,
    timeout: Duration,
) -> ProbeResult {
    probe_via(check, tls, target, None, timeout).await
}

/// [`probe`], through the tunnel when `via` says so (see [`super::tunnel`]).
pub async fn probe_via(
    check: &HttpCheck,
    tls: &TlsConfigs,
    target: SocketAddr,
    via: Option<Via>,
    timeout: Duration,
) -> ProbeResult {
    let start = Instant::now();
    match tokio::time::timeout(timeout, exchange(check, tls, target, via, start)).await {
        Ok(result) => result,
        Err(_) => {
            tracing::debug!(%target, ?timeout, "http probe: no status line within the timeout");
            ProbeResult::Timeout
        }
    }
}

async fn exchange(
    check: &HttpCheck,
    tls: &TlsConfigs,
    target: SocketAddr,
    via: Option<Via>,
    start: Instant,
) -> ProbeResult {
    let stream = match super::tunnel::connect(target, via).await {
        Ok(s) => s,
        Err(e) => return io_failure(target, "connect", &e),
    };
    let _ = stream.set_nodelay(true); // one small write: no reason to wait for an ACK
    let req = request(check, target);
    match &check.tls {
        None => {
            let mut stream = stream;
            ask(&mut stream, check, req.as_bytes(), target, start).await
        }
        Some(tls_check) => {
            let name = server_name(check, tls_check, target);
            let connector = TlsConnector::from(tls.get(tls_check.verify));
            match connector.connect(name, stream).await {
                Ok(mut stream) => ask(&mut stream, check, req.as_bytes(), target, start).await,
                Err(e) => {
                    // Seed 000 counts a failed TLS handshake as a connection failure; it is
                    // counted apart (tls_failure) with what broke it, and moves the same streak.
                    tracing::debug!(%target, error = %e, "https probe: TLS handshake failed");
                    from_tls(&e)
                }
            }
        }
    }
}

/// Sends the request and reads up to the final status line.
async fn ask<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    check: &HttpCheck,
    req: &[u8],
    target: SocketAddr,
    start: Instant,
) -> ProbeResult {
    if let Err(e) = async {
        stream.write_all(req).await?;
        stream.flush().await
    }
    .await
    {
        return io_failure(target, "send", &e);
    }
    let mut buf = vec![0u8; MAX_HEAD];
    let mut len = 0;
    loop {
        let n = match stream.read(&mut buf[len..]).await {
            Ok(n) => n,
            // A TLS peer that closes without close_notify: the same as a plain close here.
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => 0,
            Err(e) => return io_failure(target, "receive", &e),
        };
        len += n;
        match scan_head(&buf[..len]) {
            Head::Final(code) => {
                let result = check.judge(code, start.elapsed());
                if !matches!(result, ProbeResult::Success { .. }) {
                    tracing::debug!(%target, code, ?result, "http probe: not a healthy status");
                }
                return result;
            }
            Head::Invalid => {
                tracing::debug!(%target, "http probe: the answer is not HTTP/1.x");
                return ProbeResult::HttpFailure(Reason::NotHttp);
            }
            Head::Incomplete if n == 0 => {
                tracing::debug!(%target, bytes = len, "http probe: closed before a status line");
                return ProbeResult::HttpFailure(Reason::Closed);
            }
            Head::Incomplete if len == buf.len() => {
                tracing::debug!(%target, "http probe: no status line in {MAX_HEAD} bytes");
                return ProbeResult::HttpFailure(Reason::NoStatusLine);
            }
            Head::Incomplete => {}
        }
    }
}

/// A socket error: the kernel's own timeout is a timeout, a local shortage the host's, anything
/// else a connection failure.
fn io_failure(target: SocketAddr, step: &str, e: &std::io::Error) -> ProbeResult {
    tracing::debug!(%target, step, error = %e, "http probe: connection failed");
    from_io(e)
}

#[cfg(test)]
mod tests {
    use std::net::{Ipv4Addr, Ipv6Addr, SocketAddrV4, SocketAddrV6};

    use super::*;

    const TARGET: SocketAddr = SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::new(10, 0, 9, 2), 8080));
    const TARGET6: SocketAddr = SocketAddr::V6(SocketAddrV6::new(
        Ipv6Addr::new(0x2001, 0xdb8, 9, 0, 0, 0, 0, 2),
        8080,
        0,
        0,
    ));

    #[test]
    fn default_request() {
        assert_eq!(
            request(&HttpCheck::default(), TARGET),
            "GET / HTTP/1.1\r\nHost: 10.0.9.2:8080\r\nUser-Agent: lb-health\r\n\
             Connection: close\r\n\r\n"
        );
    }

    #[test]
    fn default_request_to_an_ipv6_target() {
        // The Host of an IPv6 literal is bracketed (RFC 9110 §7.2, RFC 3986 §3.2.2), port kept
        // as for IPv4.
        assert_eq!(
            request(&HttpCheck::default(), TARGET6),
            "GET / HTTP/1.1\r\nHost: [2001:db8:9::2]:8080\r\nUser-Agent: lb-health\r\n\
             Connection: close\r\n\r\n"
        );
    }

    #[test]
    fn request_with_host_headers_and_head() {
        let check = HttpCheck {
            method: Method::Head,
            path: "/healthz?full=1".into(),
            host: Some("api.example.com".into()),
            headers: vec![
                ("X-Probe".into(), "yes".into()),
                ("Authorization".into(), "Bearer t".into()),
            ],
            ..HttpCheck::default()
        };
        assert_eq!(
            request(&check, TARGET),
            "HEAD /healthz?full=1 HTTP/1.1\r\nHost: api.example.com\r\n\
             User-Agent: lb-health\r\nConnection: close\r\nX-Probe: yes\r\n\
             Authorization: Bearer t\r\n\r\n"
        );
        check.validate().unwrap();
    }

    #[test]
    fn configured_user_agent_replaces_the_default() {
        let check = HttpCheck {
            headers: vec![("user-agent".into(), "mine/1".into())],
            ..HttpCheck::default()
        };
        let req = request(&check, TARGET);
        assert!(!req.contains("lb-health"), "{req}");
        assert!(req.contains("\r\nuser-agent: mine/1\r\n"), "{req}");
    }

    #[test]
    fn request_cannot_be_injected() {
        let check = HttpCheck {
            path: "/a b\r\nX: y/é".into(),
            host: Some("h\r\nEvil: 1".into()),
            headers: vec![
                ("X-Ok".into(), "v\r\nEvil: 2\r\n\r\nGET /x HTTP/1.1".into()),
                ("Bad Name".into(), "v".into()),
                ("Bad\r\nName".into(), "v".into()),
                ("Host".into(), "other".into()),
                ("content-length".into(), "5".into()),
                ("Transfer-Encoding".into(), "chunked".into()),
                ("Connection".into(), "keep-alive".into()),
            ],
            ..HttpCheck::default()
        };
        let req = request(&check, TARGET);
        assert_eq!(
            req,
            "GET /a%20b%0D%0AX:%20y/%C3%A9 HTTP/1.1\r\nHost: hEvil:1\r\nUser-Agent: lb-health\r\n\
             Connection: close\r\nX-Ok: vEvil: 2GET /x HTTP/1.1\r\n\r\n"
        );
        // Exactly one request with one header block.
        assert_eq!(req.matches("\r\n\r\n").count(), 1);
        assert!(req.ends_with("\r\n\r\n"));
    }

    #[test]
    fn validate_refuses_what_request_would_clean() {
        let bad = |f: fn(&mut HttpCheck)| {
            let mut c = HttpCheck::default();
            f(&mut c);
            c.validate().unwrap_err()
        };
        assert!(matches!(
            bad(|c| c.path = "health".into()),
            InvalidHttpCheck::Path(_)
        ));
        assert!(matches!(
            bad(|c| c.path = "/a b".into()),
            InvalidHttpCheck::Path(_)
        ));
        assert!(matches!(
            bad(|c| c.host = Some("a\nb".into())),
            InvalidHttpCheck::Host(_)
        ));
        assert!(matches!(
            bad(|c| c.host = Some(String::new())),
            InvalidHttpCheck::Host(_)
        ));
        assert!(matches!(
            bad(|c| c.headers = vec![("X Y".into(), "v".into())]),
            InvalidHttpCheck::HeaderName(_)
        ));
        assert!(matches!(
            bad(|c| c.headers = vec![("HOST".into(), "v".into())]),
            InvalidHttpCheck::ReservedHeader(_)
        ));
        assert!(matches!(
            bad(|c| c.headers = vec![("X".into(), "a\r\nb".into())]),
            InvalidHttpCheck::HeaderValue(_)
        ));
        assert!(matches!(
            bad(|c| c.healthy.clear()),
            InvalidHttpCheck::NoHealthyStatus
        ));
        assert!(matches!(
            bad(|c| c.healthy = vec![RangeInclusive::new(300, 200)]),
            InvalidHttpCheck::StatusRange(300, 200)
        ));
        assert!(matches!(
            bad(|c| c.healthy = vec![RangeInclusive::new(0, 99)]),
            InvalidHttpCheck::StatusRange(0, 99)
        ));
        assert!(matches!(
            bad(|c| c.tls = Some(TlsCheck {
                verify: true,
                server_name: Some("not a name".into())
            })),
            InvalidHttpCheck::ServerName(_)
        ));
        HttpCheck::default().validate().unwrap();
        // An IPv6 literal is a server name, bare or bracketed.
        for name in ["2001:db8::1", "[2001:db8::1]:443"] {
            HttpCheck {
                tls: Some(TlsCheck {
                    verify: true,
                    server_name: Some(name.into()),
                }),
                ..HttpCheck::default()
            }
            .validate()
            .unwrap();
        }
    }

    #[test]
    fn status_lines() {
        assert_eq!(parse_status(b"HTTP/1.1 200 OK\r\n"), Some(200));
        assert_eq!(
            parse_status(b"HTTP/1.0 503 Service Unavailable\r\nX: y\r\n"),
            Some(503)
        );
        assert_eq!(parse_status(b"HTTP/1.1 302 \r\n"), Some(302));
        assert_eq!(parse_status(b"HTTP/1.1 204\r\n"), Some(204));
        assert_eq!(parse_status(b"HTTP/1.1 404 Not Found\n"), Some(404));
        assert_eq!(parse_status(b"HTTP/1.1 200 OK"), Some(200));
        assert_eq!(parse_status(b"HTTP/1.1 999 odd"), Some(999));
        for bad in [
            &b"hello\r\n"[..],
            b"",
            b"\r\nHTTP/1.1 200 OK\r\n",
            b"HTTP/2 200\r\n",
            b"HTTP/1.1 20\r\n",
            b"HTTP/1.1 2000\r\n",
            b"HTTP/1.1 20x OK\r\n",
            b"HTTP/1.1 099 OK\r\n",
            b"HTTP/1.1  200 OK\r\n",
            b"HTTP/1.x 200 OK\r\n",
            b"http/1.1 200 OK\r\n",
            b"HTTP/1.1 -20 OK\r\n",
            b"SSH-2.0-OpenSSH_9.2\r\n",
        ] {
            assert_eq!(
                parse_status(bad),
                None,
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn final_status_skips_interim_answers() {
        assert_eq!(scan_head(b"HTTP/1.1 200 OK\r\n"), Head::Final(200));
        assert_eq!(scan_head(b"HTTP/1.1 200 OK"), Head::Incomplete);
        assert_eq!(scan_head(b""), Head::Incomplete);
        assert_eq!(scan_head(b"hello\r\n"), Head::Invalid);
        assert_eq!(scan_head(b"HTT"), Head::Incomplete);
        assert_eq!(scan_head(b"HTTP/1.1 2"), Head::Incomplete);
        assert_eq!(scan_head(b"hel"), Head::Invalid);
        assert_eq!(scan_head(b"\x16\x03\x01"), Head::Invalid); // a TLS record
        let hints = b"HTTP/1.1 103 Early Hints\r\nLink: </a.css>; rel=preload\r\n\r\n";
        assert_eq!(scan_head(hints), Head::Incomplete);
        assert_eq!(scan_head(&hints[..30]), Head::Incomplete);
        let both = [&hints[..], b"HTTP/1.1 503 Busy\r\n"].concat();
        assert_eq!(scan_head(&both), Head::Final(503));
        let garbage_after = [&hints[..], b"nope\r\n"].concat();
        assert_eq!(scan_head(&garbage_after), Head::Invalid);
        assert_eq!(
            scan_head(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 No Content\r\n"),
            Head::Final(204)
        );
        assert_eq!(
            scan_head(b"HTTP/1.1 101 Switching Protocols\r\n"),
            Head::Final(101)
        );
    }

    #[test]
    fn healthy_set() {
        let c = HttpCheck::default();
        assert!(c.is_healthy(200) && c.is_healthy(302) && c.is_healthy(399));
        assert!(!c.is_healthy(199) && !c.is_healthy(400) && !c.is_healthy(503));
        let c = HttpCheck {
            healthy: vec![200..=200, 204..=204, 401..=401],
            ..HttpCheck::default()
        };
        assert!(c.is_healthy(200) && c.is_healthy(204) && c.is_healthy(401));
        assert!(!c.is_healthy(201) && !c.is_healthy(302));
    }

    #[test]
    fn sni_rule() {
        let tls = |name: Option<&str>| TlsCheck {
            verify: true,
            server_name: name.map(Into::into),
        };
        let check = |host: Option<&str>| HttpCheck {
            host: host.map(Into::into),
            ..HttpCheck::default()
        };
        let dns = |s: &str| ServerName::try_from(s.to_string()).unwrap();
        let ip = |s: &str| ServerName::from(s.parse::<IpAddr>().unwrap());
        // Default: the target's IP (no SNI).
        assert_eq!(
            server_name(&check(None), &tls(None), TARGET),
            ip("10.0.9.2")
        );
        // An IPv6 target: its IP, never SNI.
        assert_eq!(
            server_name(&check(None), &tls(None), TARGET6),
            ip("2001:db8:9::2")
        );
        assert_eq!(
            server_name(&check(Some("[2001:db8::7]:8080")), &tls(None), TARGET6),
            ip("2001:db8::7")
        );
        // A bare IPv6 literal (server_name, or Host): all of it, its last group is no port.
        assert_eq!(
            server_name(&check(None), &tls(Some("2001:db8::7")), TARGET6),
            ip("2001:db8::7")
        );
        assert_eq!(
            server_name(&check(Some("2001:db8::8")), &tls(None), TARGET),
            ip("2001:db8::8")
        );
        // The Host, port removed, when it is a name.
        assert_eq!(
            server_name(&check(Some("api.example.com:8443")), &tls(None), TARGET),
            dns("api.example.com")
        );
        assert_eq!(
            server_name(&check(Some("api.example.com")), &tls(None), TARGET),
            dns("api.example.com")
        );
        assert_eq!(
            server_name(&check(Some("api.example.com.")), &tls(None), TARGET),
            dns("api.example.com")
        );
        // An IP literal Host: that IP.
        assert_eq!(
            server_name(&check(Some("192.0.2.7:443")), &tls(None), TARGET),
            ip("192.0.2.7")
        );
        assert_eq!(
            server_name(&check(Some("[2001:db8::1]:443")), &tls(None), TARGET),
            ip("2001:db8::1")
        );
        // A Host that is neither: the target's IP.
        assert_eq!(
            server_name(&check(Some("bad_host!")), &tls(None), TARGET),
            ip("10.0.9.2")
        );
        // server_name wins over Host.
        assert_eq!(
            server_name(
                &check(Some("api.example.com")),
                &tls(Some("backend.internal")),
                TARGET
            ),
            dns("backend.internal")
        );
        assert_eq!(
            server_name(&check(None), &tls(Some("10.1.1.1")), TARGET),
            ip("10.1.1.1")
        );
        assert_eq!(
            server_name(&check(None), &tls(Some("backend.internal:8443")), TARGET),
            dns("backend.internal")
        );
        // An invalid server_name falls back to the next rule (validate refuses it).
        assert_eq!(
            server_name(&check(Some("api.example.com")), &tls(Some("a b")), TARGET),
            dns("api.example.com")
        );
    }

    #[test]
    fn tls_configs_build() {
        let c = TlsConfigs::new();
        assert_eq!(c.get(true).alpn_protocols, vec![b"http/1.1".to_vec()]);
        assert!(!Arc::ptr_eq(&c.get(true), &c.get(false)));
    }
}
