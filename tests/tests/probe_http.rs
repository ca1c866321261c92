//! The HTTP and HTTPS health probes against real servers in network namespaces: status codes and
//! the healthy set, the exact request the backend gets, every failure kind (refused, silent,
//! stuck, not HTTP) and TLS with a self-signed certificate, verified or not.
//!
//! Each test builds its own pair of namespaces, client 10.0.9.1 and backend 10.0.9.2 on a veth
//! pair (and 2001:db8:9::1 and 2001:db8:9::2 for the IPv6 tests); the servers are tokio tasks on
//! sockets bound inside the backend namespace, the probe runs on a thread inside the client
//! namespace.

use std::{
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
    ops::RangeInclusive,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use lb::health::{
    outcome::{Reason, Tls},
    probe::http::{self, HttpCheck, Method, TlsCheck, TlsConfigs},
    window::ProbeResult,
};
use lb_tests::{
    netns::{Netns, veth},
    require_root,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio::{
    io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _},
    net::TcpListener,
    runtime::Runtime,
};
use tokio_rustls::TlsAcceptor;

const BACKEND: Ipv4Addr = Ipv4Addr::new(10, 0, 9, 2);
const BACKEND6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 9, 0, 0, 0, 0, 2);
const PORT: u16 = 8080;
/// Nothing listens here.
const CLOSED_PORT: u16 = 8081;
const TIMEOUT: Duration = Duration::from_millis(800);
/// Scheduling slack allowed past the timeout.
const SLACK: Duration = Duration::from_millis(500);

/// What a test server does with a connection once it has read the request head.
#[derive(Debug, Clone, Copy)]
enum Answer {
    /// `HTTP/1.1 <code>` with an empty body, then close.
    Status(u16),
    /// These bytes, then hold the connection until the client closes it.
    Raw(&'static [u8]),
    /// Never answer; hold the connection until the client closes it.
    Silent,
    /// Close without a byte.
    Close,
    /// The start of a status line, then more than the probe's head limit without a line end,
    /// then hold.
    Flood,
    /// These bytes before reading anything (as an HTTP server answers a TLS ClientHello), then
    /// close.
    Blurt(&'static [u8]),
}

/// What a server saw: each request head and, for TLS, each SNI.
#[derive(Clone, Default)]
struct Log {
    requests: Arc<Mutex<Vec<String>>>,
    sni: Arc<Mutex<Vec<Option<String>>>>,
}

impl Log {
    fn requests(&self) -> Vec<String> {
        self.requests.lock().unwrap().clone()
    }

    fn sni(&self) -> Vec<Option<String>> {
        self.sni.lock().unwrap().clone()
    }
}

struct Bed {
    client: Netns,
    backend: Netns,
    /// Runs the servers.
    rt: Runtime,
}

impl Bed {
    fn new() -> Self {
        require_root();
        let client = Netns::new("hcli").unwrap();
        let backend = Netns::new("hbe").unwrap();
        let (a, b) = veth(&client, "10.0.9.1/24", &backend, "10.0.9.2/24").unwrap();
        a.add_address("2001:db8:9::1/64").unwrap();
        b.add_address("2001:db8:9::2/64").unwrap();
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        Self {
            client,
            backend,
            rt,
        }
    }

    /// A listener on `addr` inside the backend namespace.
    fn listen(&self, addr: SocketAddr) -> TcpListener {
        let std = self
            .backend
            .enter(|| std::net::TcpListener::bind(addr))
            .unwrap();
        std.set_nonblocking(true).unwrap();
        let _guard = self.rt.enter();
        TcpListener::from_std(std).unwrap()
    }

    /// A plain HTTP server on BACKEND:`port`.
    fn serve(&self, port: u16, answer: Answer) -> Log {
        self.serve_on(SocketAddr::from((BACKEND, port)), answer)
    }

    /// A plain HTTP server on `addr`.
    fn serve_on(&self, addr: SocketAddr, answer: Answer) -> Log {
        let listener = self.listen(addr);
        let log = Log::default();
        let l = log.clone();
        self.rt.spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                tokio::spawn(respond(stream, answer, l.clone()));
            }
        });
        log
    }

    /// An HTTPS server on BACKEND:`port` with `cert`.
    fn serve_tls(&self, port: u16, answer: Answer, cert: &SelfSigned) -> Log {
        self.serve_tls_on(SocketAddr::from((BACKEND, port)), answer, cert)
    }

    /// An HTTPS server on `addr` with `cert`.
    fn serve_tls_on(&self, addr: SocketAddr, answer: Answer, cert: &SelfSigned) -> Log {
        let listener = self.listen(addr);
        let acceptor = cert.acceptor();
        let log = Log::default();
        let l = log.clone();
        self.rt.spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let (acceptor, l) = (acceptor.clone(), l.clone());
                tokio::spawn(async move {
                    // A failed handshake is the client's business: it just ends here.
                    if let Ok(tls) = acceptor.accept(stream).await {
                        let sni = tls.get_ref().1.server_name().map(str::to_string);
                        l.sni.lock().unwrap().push(sni);
                        respond(tls, answer, l).await;
                    }
                });
            }
        });
        log
    }

    /// Runs one probe of BACKEND:`port` from the client namespace; its result and how long it
    /// took.
    fn probe_with(
        &self,
        check: &HttpCheck,
        tls: &TlsConfigs,
        port: u16,
    ) -> (ProbeResult, Duration) {
        self.probe_at(check, tls, SocketAddr::from((BACKEND, port)))
    }

    /// Runs one probe of `target` from the client namespace; its result and how long it took.
    fn probe_at(
        &self,
        check: &HttpCheck,
        tls: &TlsConfigs,
        target: SocketAddr,
    ) -> (ProbeResult, Duration) {
        self.client.enter(|| {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            let start = Instant::now();
            let result = rt.block_on(http::probe(check, tls, target, TIMEOUT));
            (result, start.elapsed())
        })
    }

    fn probe(&self, check: &HttpCheck, port: u16) -> ProbeResult {
        self.probe_with(check, &TlsConfigs::new(), port).0
    }
}

/// Reads the request head, then answers as told.
async fn respond<S: AsyncRead + AsyncWrite + Unpin>(mut s: S, answer: Answer, log: Log) {
    if let Answer::Blurt(bytes) = answer {
        let _ = s.write_all(bytes).await;
        let _ = s.shutdown().await;
        return;
    }
    let mut head = Vec::new();
    let mut chunk = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        match s.read(&mut chunk).await {
            Ok(0) | Err(_) => break,
            Ok(n) => head.extend_from_slice(&chunk[..n]),
        }
    }
    log.requests
        .lock()
        .unwrap()
        .push(String::from_utf8_lossy(&head).into_owned());
    let hold = match answer {
        Answer::Status(code) => {
            let reply =
                format!("HTTP/1.1 {code} Test\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
            let _ = s.write_all(reply.as_bytes()).await;
            let _ = s.shutdown().await;
            false
        }
        Answer::Raw(bytes) => {
            let _ = s.write_all(bytes).await;
            let _ = s.flush().await;
            true
        }
        Answer::Silent => true,
        Answer::Close | Answer::Blurt(_) => false,
        Answer::Flood => {
            let _ = s.write_all(b"HTTP/1.1 200 ").await;
            let _ = s.write_all(&[b'a'; 9000]).await;
            let _ = s.flush().await;
            true
        }
    };
    if hold {
        while let Ok(n) = s.read(&mut chunk).await {
            if n == 0 {
                break;
            }
        }
    }
}

/// A self-signed certificate for `backend.test`, 10.0.9.2 and 2001:db8:9::2.
struct SelfSigned {
    cert: CertificateDer<'static>,
    key: Vec<u8>,
}

impl SelfSigned {
    fn new() -> Self {
        let names = vec![
            "backend.test".into(),
            BACKEND.to_string(),
            BACKEND6.to_string(),
        ];
        let ck = rcgen::generate_simple_self_signed(names).unwrap();
        Self {
            cert: ck.cert.der().clone(),
            key: ck.signing_key.serialize_der(),
        }
    }

    /// A self-signed certificate marked as a CA, as `openssl req -x509` makes them.
    fn ca() -> Self {
        let mut params =
            rcgen::CertificateParams::new(vec!["backend.test".into(), BACKEND.to_string()])
                .unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        Self {
            cert: cert.der().clone(),
            key: key.serialize_der(),
        }
    }

    fn acceptor(&self) -> TlsAcceptor {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(
                vec![self.cert.clone()],
                PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(self.key.clone())),
            )
            .unwrap();
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        TlsAcceptor::from(Arc::new(config))
    }

    /// Probe TLS configs that trust this certificate.
    fn trusted(&self) -> TlsConfigs {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(self.cert.clone()).unwrap();
        TlsConfigs::with_roots(roots)
    }
}

fn https(verify: bool, server_name: Option<&str>) -> HttpCheck {
    HttpCheck {
        tls: Some(TlsCheck {
            verify,
            server_name: server_name.map(Into::into),
        }),
        ..HttpCheck::default()
    }
}

fn assert_success(result: ProbeResult) -> Duration {
    match result {
        ProbeResult::Success { latency } => {
            assert!(latency < TIMEOUT, "latency {latency:?}");
            latency
        }
        other => panic!("want Success, got {other:?}"),
    }
}

#[test]
fn status_200_is_success_with_the_default_request() {
    let bed = Bed::new();
    let log = bed.serve(PORT, Answer::Status(200));
    assert_success(bed.probe(&HttpCheck::default(), PORT));
    assert_eq!(
        log.requests(),
        [
            "GET / HTTP/1.1\r\nHost: 10.0.9.2:8080\r\nUser-Agent: lb-health\r\n\
          Connection: close\r\n\r\n"
        ]
    );
}

#[test]
fn status_503_is_http_failure() {
    let bed = Bed::new();
    bed.serve(PORT, Answer::Status(503));
    assert_eq!(
        bed.probe(&HttpCheck::default(), PORT),
        ProbeResult::HttpFailure(Reason::Status(503))
    );
}

/// Seed 002 (APISIX): with `unhealthy_status`, only its codes are failures; a code in neither
/// set is no verdict.
#[test]
fn with_unhealthy_status_a_code_in_neither_set_is_neutral() {
    let bed = Bed::new();
    let check = HttpCheck {
        unhealthy: Some(vec![404..=404, 429..=429, 500..=505]),
        ..HttpCheck::default()
    };
    bed.serve(PORT, Answer::Status(503));
    assert_eq!(
        bed.probe(&check, PORT),
        ProbeResult::HttpFailure(Reason::Status(503))
    );
    bed.serve(PORT + 1, Answer::Status(403));
    assert_eq!(
        bed.probe(&check, PORT + 1),
        ProbeResult::Neutral(Reason::Status(403))
    );
    // Without the set, 403 is a failure as before.
    assert_eq!(
        bed.probe(&HttpCheck::default(), PORT + 1),
        ProbeResult::HttpFailure(Reason::Status(403))
    );
}

#[test]
fn redirect_is_healthy_by_default_only() {
    let bed = Bed::new();
    bed.serve(PORT, Answer::Status(302));
    assert_success(bed.probe(&HttpCheck::default(), PORT));
    let strict = HttpCheck {
        healthy: vec![RangeInclusive::new(200, 200)],
        ..HttpCheck::default()
    };
    assert_eq!(
        bed.probe(&strict, PORT),
        ProbeResult::HttpFailure(Reason::Status(302))
    );
    let with_302 = HttpCheck {
        healthy: vec![200..=200, 302..=302],
        ..HttpCheck::default()
    };
    assert_success(bed.probe(&with_302, PORT));
}

#[test]
fn head_with_host_and_extra_headers() {
    let bed = Bed::new();
    let log = bed.serve(PORT, Answer::Status(204));
    let check = HttpCheck {
        method: Method::Head,
        path: "/healthz?deep=1".into(),
        host: Some("api.example.test:8443".into()),
        headers: vec![
            ("X-Probe".into(), "lb".into()),
            ("Authorization".into(), "Bearer s3cret".into()),
        ],
        ..HttpCheck::default()
    };
    check.validate().unwrap();
    assert_success(bed.probe(&check, PORT));
    let requests = log.requests();
    assert_eq!(requests.len(), 1);
    let req = &requests[0];
    assert!(
        req.starts_with("HEAD /healthz?deep=1 HTTP/1.1\r\n"),
        "{req:?}"
    );
    let hosts: Vec<_> = req
        .lines()
        .filter(|l| l.to_ascii_lowercase().starts_with("host:"))
        .collect();
    assert_eq!(hosts, ["Host: api.example.test:8443"], "{req:?}");
    assert!(req.contains("\r\nX-Probe: lb\r\n"), "{req:?}");
    assert!(
        req.contains("\r\nAuthorization: Bearer s3cret\r\n"),
        "{req:?}"
    );
    assert!(req.contains("\r\nConnection: close\r\n"), "{req:?}");
}

#[test]
fn injected_headers_stay_inside_their_value() {
    let bed = Bed::new();
    let log = bed.serve(PORT, Answer::Status(200));
    let check = HttpCheck {
        headers: vec![("X-A".into(), "1\r\nX-Evil: 2".into())],
        host: Some("h.test\r\nX-Evil: 3".into()),
        ..HttpCheck::default()
    };
    assert!(check.validate().is_err());
    assert_success(bed.probe(&check, PORT));
    let req = &log.requests()[0];
    assert!(!req.lines().any(|l| l.starts_with("X-Evil")), "{req:?}");
}

#[test]
fn closed_port_is_tcp_failure() {
    let bed = Bed::new();
    bed.serve(PORT, Answer::Status(200)); // the host is up, the port is not
    let (result, took) = bed.probe_with(&HttpCheck::default(), &TlsConfigs::new(), CLOSED_PORT);
    assert_eq!(result, ProbeResult::TcpFailure(Reason::Refused));
    assert!(took < TIMEOUT, "took {took:?}");
}

#[test]
fn silent_host_is_timeout() {
    let bed = Bed::new();
    bed.serve(PORT, Answer::Status(200));
    bed.backend.drop_all_input().unwrap();
    let (result, took) = bed.probe_with(&HttpCheck::default(), &TlsConfigs::new(), PORT);
    assert_eq!(result, ProbeResult::Timeout);
    assert!(
        took >= TIMEOUT && took < TIMEOUT + SLACK,
        "took {took:?}, timeout {TIMEOUT:?}"
    );
}

#[test]
fn server_that_never_answers_is_timeout() {
    let bed = Bed::new();
    let log = bed.serve(PORT, Answer::Silent);
    let (result, took) = bed.probe_with(&HttpCheck::default(), &TlsConfigs::new(), PORT);
    assert_eq!(result, ProbeResult::Timeout);
    assert!(
        took >= TIMEOUT && took < TIMEOUT + SLACK,
        "took {took:?}, timeout {TIMEOUT:?}"
    );
    assert_eq!(log.requests().len(), 1, "the request was sent");
}

#[test]
fn answers_that_are_not_http_are_http_failures() {
    let bed = Bed::new();
    bed.serve(PORT, Answer::Raw(b"hello\r\n"));
    bed.serve(PORT + 1, Answer::Flood);
    bed.serve(PORT + 2, Answer::Close);
    bed.serve(PORT + 3, Answer::Raw(b"SSH-2.0-")); // no line end, connection held
    bed.serve(PORT + 4, Answer::Raw(b"HTTP/1.1 200 OK")); // no line end, connection held
    let why = [
        Reason::NotHttp,
        Reason::NoStatusLine,
        Reason::Closed,
        Reason::NotHttp,
    ];
    for (port, why) in (PORT..=PORT + 3).zip(why) {
        let (result, took) = bed.probe_with(&HttpCheck::default(), &TlsConfigs::new(), port);
        assert_eq!(result, ProbeResult::HttpFailure(why), "port {port}");
        assert!(took < TIMEOUT, "port {port} took {took:?}");
    }
    // An incomplete status line is not a status line: the probe waits for its end.
    assert_eq!(
        bed.probe(&HttpCheck::default(), PORT + 4),
        ProbeResult::Timeout
    );
}

#[test]
fn interim_answers_are_skipped() {
    let bed = Bed::new();
    bed.serve(
        PORT,
        Answer::Raw(
            b"HTTP/1.1 103 Early Hints\r\nLink: </s.css>; rel=preload\r\n\r\n\
              HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n",
        ),
    );
    assert_success(bed.probe(&HttpCheck::default(), PORT));
}

#[test]
fn https_self_signed_needs_verify_off() {
    let bed = Bed::new();
    let cert = SelfSigned::new();
    let log = bed.serve_tls(PORT, Answer::Status(200), &cert);

    // verify = false: any certificate, still TLS.
    assert_success(bed.probe(&https(false, None), PORT));
    assert_eq!(log.sni(), [None], "an IP target sends no SNI");
    assert_eq!(
        log.requests()[0],
        "GET / HTTP/1.1\r\nHost: 10.0.9.2:8080\r\nUser-Agent: lb-health\r\n\
         Connection: close\r\n\r\n"
    );

    // verify = true against the webpki roots: the handshake fails, a TLS failure that says why.
    let (result, took) = bed.probe_with(&https(true, None), &TlsConfigs::new(), PORT);
    assert_eq!(
        result,
        ProbeResult::TlsFailure(Reason::Tls(Tls::UnknownIssuer))
    );
    assert_eq!(
        result.failure(TIMEOUT).unwrap(),
        "TLS: certificate not trusted (unknown issuer)"
    );
    assert!(took < TIMEOUT, "took {took:?}");
    assert_eq!(
        log.requests().len(),
        1,
        "no request over an unverified connection"
    );

    // An unhealthy status over TLS is still an HTTP failure.
    let log_503 = bed.serve_tls(PORT + 1, Answer::Status(503), &cert);
    assert_eq!(
        bed.probe(&https(false, None), PORT + 1),
        ProbeResult::HttpFailure(Reason::Status(503))
    );
    assert_eq!(log_503.requests().len(), 1);
}

#[test]
fn https_verified_names_and_sni() {
    let bed = Bed::new();
    let cert = SelfSigned::new();
    let trusted = cert.trusted();
    let log = bed.serve_tls(PORT, Answer::Status(200), &cert);

    // A trusted certificate verifies against the target IP (its IP SAN) ...
    assert_success(bed.probe_with(&https(true, None), &trusted, PORT).0);
    // ... against server_name, sent as SNI ...
    assert_success(
        bed.probe_with(&https(true, Some("backend.test")), &trusted, PORT)
            .0,
    );
    // ... and against the Host when no server_name is set (port removed).
    let by_host = HttpCheck {
        host: Some("backend.test:8080".into()),
        ..https(true, None)
    };
    assert_success(bed.probe_with(&by_host, &trusted, PORT).0);
    assert_eq!(
        log.sni(),
        [
            None,
            Some("backend.test".into()),
            Some("backend.test".into())
        ]
    );
    assert_eq!(
        log.requests()[2].lines().find(|l| l.starts_with("Host:")),
        Some("Host: backend.test:8080")
    );

    // A name the certificate does not carry fails the handshake, unless verify is off.
    assert_eq!(
        bed.probe_with(&https(true, Some("other.test")), &trusted, PORT)
            .0,
        ProbeResult::TlsFailure(Reason::Tls(Tls::WrongName))
    );
    assert_success(
        bed.probe_with(&https(false, Some("other.test")), &trusted, PORT)
            .0,
    );
    assert_eq!(log.sni().last(), Some(&Some("other.test".into())));
}

#[test]
fn https_probe_to_a_plain_http_port_is_a_tls_failure() {
    let bed = Bed::new();
    bed.serve(PORT, Answer::Blurt(b"HTTP/1.1 400 Bad Request\r\n\r\n"));
    let (result, took) = bed.probe_with(&https(false, None), &TlsConfigs::new(), PORT);
    assert_eq!(result, ProbeResult::TlsFailure(Reason::Tls(Tls::Protocol)));
    assert!(took < TIMEOUT, "took {took:?}");
}

/// Issue 14: an `openssl req -x509` certificate is a CA; rustls refuses it as a server's
/// certificate even when trusted, and the reason says so instead of "tcp_failure".
#[test]
fn a_ca_certificate_as_the_servers_is_named_as_such() {
    let bed = Bed::new();
    let cert = SelfSigned::ca();
    bed.serve_tls(PORT, Answer::Status(200), &cert);
    let (result, _) = bed.probe_with(&https(true, None), &cert.trusted(), PORT);
    assert_eq!(
        result,
        ProbeResult::TlsFailure(Reason::Tls(Tls::CaUsedAsEndEntity))
    );
    assert_eq!(
        result.failure(TIMEOUT).unwrap(),
        "TLS: certificate not trusted (self-signed CA used as server certificate)"
    );
    // Verification off: any certificate, still TLS.
    assert_success(bed.probe(&https(false, None), PORT));
}

// ---- IPv6 targets -------------------------------------------------------------------------

fn backend6(port: u16) -> SocketAddr {
    SocketAddr::from((BACKEND6, port))
}

#[test]
fn ipv6_status_200_is_success_with_a_bracketed_host() {
    let bed = Bed::new();
    let log = bed.serve_on(backend6(PORT), Answer::Status(200));
    let (result, _) = bed.probe_at(&HttpCheck::default(), &TlsConfigs::new(), backend6(PORT));
    assert_success(result);
    // The default Host of an IPv6 target: the literal in brackets, and the port.
    assert_eq!(
        log.requests(),
        [
            "GET / HTTP/1.1\r\nHost: [2001:db8:9::2]:8080\r\nUser-Agent: lb-health\r\n\
          Connection: close\r\n\r\n"
        ]
    );
    // A configured Host is sent as configured.
    let check = HttpCheck {
        host: Some("api.example.test".into()),
        ..HttpCheck::default()
    };
    assert_success(bed.probe_at(&check, &TlsConfigs::new(), backend6(PORT)).0);
    let hosts: Vec<String> = log
        .requests()
        .iter()
        .filter_map(|r| {
            r.lines()
                .find(|l| l.starts_with("Host:"))
                .map(str::to_string)
        })
        .collect();
    assert_eq!(
        hosts,
        ["Host: [2001:db8:9::2]:8080", "Host: api.example.test"]
    );
}

#[test]
fn ipv6_error_status_closed_port_and_silent_host() {
    let bed = Bed::new();
    bed.serve_on(backend6(PORT), Answer::Status(503));
    let tls = TlsConfigs::new();
    assert_eq!(
        bed.probe_at(&HttpCheck::default(), &tls, backend6(PORT)).0,
        ProbeResult::HttpFailure(Reason::Status(503))
    );
    // Nothing on this port: the backend's kernel resets the connection.
    let (result, took) = bed.probe_at(&HttpCheck::default(), &tls, backend6(CLOSED_PORT));
    assert_eq!(result, ProbeResult::TcpFailure(Reason::Refused));
    assert!(took < TIMEOUT, "took {took:?}");
    // A server that never answers, then a host that stopped answering at all.
    bed.serve_on(backend6(PORT + 1), Answer::Silent);
    let (result, took) = bed.probe_at(&HttpCheck::default(), &tls, backend6(PORT + 1));
    assert_eq!(result, ProbeResult::Timeout);
    assert!(took >= TIMEOUT && took < TIMEOUT + SLACK, "took {took:?}");
    bed.backend.drop_all_input().unwrap();
    let (result, took) = bed.probe_at(&HttpCheck::default(), &tls, backend6(PORT));
    assert_eq!(result, ProbeResult::Timeout);
    assert!(took >= TIMEOUT && took < TIMEOUT + SLACK, "took {took:?}");
}

#[test]
fn ipv6_https_verifies_the_ip_and_sends_no_sni() {
    let bed = Bed::new();
    let cert = SelfSigned::new();
    let trusted = cert.trusted();
    let log = bed.serve_tls_on(backend6(PORT), Answer::Status(200), &cert);
    // A trusted certificate verifies against the target's IPv6 address (its IP SAN); an IP is
    // never sent as SNI.
    assert_success(bed.probe_at(&https(true, None), &trusted, backend6(PORT)).0);
    assert_eq!(log.sni(), [None]);
    assert_eq!(
        log.requests()[0].lines().find(|l| l.starts_with("Host:")),
        Some("Host: [2001:db8:9::2]:8080")
    );
    // An IPv6 literal as server_name: that IP, verified.
    assert_success(
        bed.probe_at(
            &https(true, Some("2001:db8:9::2")),
            &trusted,
            backend6(PORT),
        )
        .0,
    );
    // Not trusted: the handshake fails and says why; verify off: any certificate.
    assert_eq!(
        bed.probe_at(&https(true, None), &TlsConfigs::new(), backend6(PORT))
            .0,
        ProbeResult::TlsFailure(Reason::Tls(Tls::UnknownIssuer))
    );
    assert_success(
        bed.probe_at(&https(false, None), &TlsConfigs::new(), backend6(PORT))
            .0,
    );
    // An IP the certificate does not carry (the server's other address is fine, this one is
    // not its): a wrong name.
    let other: IpAddr = "2001:db8:9::7".parse().unwrap();
    assert_eq!(
        bed.probe_at(
            &https(true, Some(&other.to_string())),
            &trusted,
            backend6(PORT)
        )
        .0,
        ProbeResult::TlsFailure(Reason::Tls(Tls::WrongName))
    );
}
