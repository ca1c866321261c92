//! The status page and the metrics as their users see them, from a `Status` built here (no
//! daemon): the page served over HTTP/1.0 by a tiny server and loaded in headless Chromium (its
//! DOM and a screenshot: healthy rows green, unhealthy rows red), and the metrics through
//! `promtool check metrics`. Also checks that these checks can fail. The live page of a running
//! daemon, kept open in Chromium while a backend fails: updated in place, no reload. The page
//! with JavaScript off: complete as served, and refreshed by its `<noscript>` meta refresh. And
//! its layout on a laptop (1280 px: the tables fit) and on a phone (390 px: only they scroll).

use std::{
    io::{Read as _, Write as _},
    net::TcpListener,
    sync::{
        Arc,
        atomic::{AtomicU32, Ordering},
    },
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use lb::{
    api::{
        PAGE_REFRESH_S,
        html::{self, HEALTHY_COLOUR, NEUTRAL_COLOUR, PENDING_COLOUR, UNHEALTHY_COLOUR},
        metrics,
    },
    model::{
        Admin, AnnounceStatus, BackendStatus, Event, Events, HealthState, LatencyHistogram,
        NamedCounter, ProbeCounters, ServiceStatus, Status, VipStatus,
    },
};
use lb_tests::{
    daemon::Daemon,
    netns::Netns,
    require_root,
    topology::{Arms, Sandbox},
    webcheck::{
        Browser, chromium_dump_dom, chromium_screenshot, count_colour_pixels, promtool_check,
    },
};

const WIDTH: u32 = 1280;
const HEIGHT: u32 = 800;
/// Anti-aliased text and borders are not the background colour; the fills are exact (sRGB).
const TOLERANCE: u8 = 2;
/// A row 1200 px wide and ~25 px high is ~30 000 pixels; text covers part of it.
const MANY: usize = 5000;

fn backend(address: &str, state: &str, counters: ProbeCounters) -> BackendStatus {
    let (ip, port) = address.rsplit_once(':').expect("ip:port");
    BackendStatus {
        address: address.to_owned(),
        ip: ip.trim_matches(['[', ']']).to_owned(),
        port: port.parse().expect("port"),
        weight: 1,
        state: HealthState::from_name(state).expect("a state name"),
        admin: Admin::Enabled,
        available: state == "healthy",
        ejected: None,
        ejected_for_s: None,
        state_for_s: 12.0,
        counters,
        last_probe_latency_ms: (state == "healthy").then_some(0.8),
        last_failure: (state == "unhealthy").then(|| "timeout after 2s".to_owned()),
        discovered: false,
        packets: 120,
        bytes: 64_000,
        new_flows: 9,
    }
}

fn service(name: &str, vip: &str, backends: Vec<BackendStatus>) -> ServiceStatus {
    ServiceStatus {
        name: name.to_owned(),
        vip: vip.to_owned(),
        protocol: "tcp".to_owned(),
        forwarding: "nat".to_owned(),
        syn_proxy: "off".to_owned(),
        syn_proxy_engaged: false,
        syn_proxy_rate: None,
        syn_proxy_half_open: None,
        passive_signals: Vec::new(),
        check: "http".to_owned(),
        through_tunnel: false,
        failure_window_s: Some(10.0),
        success_window_s: Some(10.0),
        healthy_threshold: 3,
        unhealthy_threshold: 3,
        failure_thresholds: None,
        packets: 240,
        bytes: 128_000,
        new_flows: 18,
        available_backends: backends.iter().filter(|b| b.available).count() as u32,
        state: lb::model::ServiceState::of(true, &backends),
        policy_in_force: None,
        // Route health injection: both VIPs announced.
        announce: Some("healthy".to_owned()),
        announce_min_available: Some(1),
        vip_announced: Some(true),
        discovery: None,
        backends,
    }
}

/// "web" with a healthy and an unhealthy backend (or two healthy ones), and "dns" with one
/// backend still initializing.
fn status(with_unhealthy: bool) -> Status {
    let ok = ProbeCounters {
        success: 5,
        ..ProbeCounters::default()
    };
    let failing = ProbeCounters {
        timeout_failure: 4,
        ..ProbeCounters::default()
    };
    let second = if with_unhealthy {
        backend("10.0.1.3:80", "unhealthy", failing)
    } else {
        backend("10.0.1.3:80", "healthy", ok)
    };
    Status {
        time: T,
        services: vec![
            service(
                "web <main>",
                "10.1.0.1:80",
                vec![backend("10.0.1.2:80", "healthy", ok), second],
            ),
            service(
                "dns",
                "10.1.0.2:53",
                vec![backend(
                    "10.0.2.2:53",
                    "initializing",
                    ProbeCounters::default(),
                )],
            ),
        ],
        counters: vec![
            NamedCounter {
                name: "xdp_tx".to_owned(),
                value: 480,
            },
            NamedCounter {
                name: "drop_no_backend".to_owned(),
                value: 2,
            },
        ],
        probe_latency: vec![LatencyHistogram {
            kind: "http".to_owned(),
            bounds_s: vec![0.001, 0.01, 0.1],
            counts: vec![3, 10, 10],
            count: 11,
            sum_s: 0.4,
        }],
        half_open_syns: None,
        events_total: 3,
        resources: Default::default(),
        announce: Some(AnnounceStatus {
            state: "announcing".to_owned(),
            table: 200,
            protocol: 250,
            grace_s: 5.0,
            last_change: Some(1_789_999_990.0),
            vips: ["10.1.0.1", "10.1.0.2"]
                .iter()
                .map(|vip| VipStatus {
                    vip: (*vip).to_owned(),
                    announced: true,
                    wanted: Some(true),
                    reason: "web: 1 of 2 backends available (needs 1)".to_owned(),
                    services: vec!["web".to_owned()],
                    since: Some(1_789_999_990.0),
                    error: None,
                })
                .collect(),
        }),
        config: None,
    }
}

/// A request to the tiny server: its path (with the query) and whether it asks for JSON (the
/// page's script does, for the status).
struct Request<'a> {
    path: &'a str,
    json: bool,
}

/// An answer: content type and body; `None` is a 404.
type Answer = Option<(&'static str, String)>;

/// Serves what `answer` says over HTTP/1.0 from `listener`, on a thread that lives as long as
/// the test process: enough for the requests Chromium makes.
fn serve(listener: TcpListener, answer: impl Fn(&Request) -> Answer + Send + 'static) -> String {
    let url = format!("http://{}/", listener.local_addr().expect("local addr"));
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { continue };
            let mut head = Vec::new();
            let mut buf = [0; 1024];
            while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                match conn.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => head.extend_from_slice(&buf[..n]),
                }
            }
            let head = String::from_utf8_lossy(&head);
            let path = match head.split_whitespace().take(2).collect::<Vec<_>>()[..] {
                ["GET", path] => path,
                _ => "",
            };
            let json = head.lines().any(|l| {
                l.to_ascii_lowercase()
                    .starts_with("accept: application/json")
            });
            let (status, (kind, body)) = match answer(&Request { path, json }) {
                Some(found) => ("200 OK", found),
                None => ("404 Not Found", ("text/plain", "not found\n".to_owned())),
            };
            let _ = write!(
                conn,
                "HTTP/1.0 {status}\r\nContent-Type: {kind}; charset=utf-8\r\n\
                 Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    url
}

/// `page` at `/`, nothing else.
fn html_only(page: String) -> impl Fn(&Request) -> Answer + Send + 'static {
    move |r| (r.path == "/").then(|| ("text/html", page.clone()))
}

/// The daemon's clock in [`status`], Unix seconds.
const T: f64 = 1_790_000_000.0;

/// [`status`] with every kind of row, and the widest values a long-running host shows: "web"
/// also has an IPv6 backend failing HTTP checks, a drained one and one ejected by passive
/// checks; the first backend's counters are a month's (a probe a second, 90 TB).
fn wide_status() -> Status {
    let mut st = status(true);
    let web = &mut st.services[0];
    let first = &mut web.backends[0];
    first.counters.success = 2_592_000;
    first.packets = 123_456_789_012;
    first.bytes = 98_765_432_109_876;
    first.new_flows = 1_234_567_890;
    let mut v6 = backend(
        "[2001:db8:100::a]:8080",
        "mostly_unhealthy",
        ProbeCounters {
            http_failure: 2,
            ..ProbeCounters::default()
        },
    );
    v6.last_failure = Some("HTTP 503 Service Unavailable (expected 200)".to_owned());
    let mut drained = backend("10.0.1.4:80", "drained", ProbeCounters::default());
    drained.admin = Admin::Drained;
    let mut ejected = backend(
        "10.0.1.5:80",
        "healthy",
        ProbeCounters {
            success: 7,
            ..ProbeCounters::default()
        },
    );
    ejected.available = false;
    ejected.ejected = Some("service: refused".to_owned());
    ejected.ejected_for_s = Some(12.0);
    web.backends.extend([v6, drained, ejected]);
    web.available_backends = web.backends.iter().filter(|b| b.available).count() as u32;
    web.state = lb::model::ServiceState::of(true, &web.backends);
    st
}

/// The event log behind [`wide_status`], oldest first.
fn wide_events() -> Vec<Event> {
    let event =
        |ago: f64, backend: &str, from: &str, to: &str, source: &str, reason: Option<&str>| Event {
            seq: 0,
            time: T - ago,
            service: "web <main>".to_owned(),
            backend: backend.to_owned(),
            from: from.to_owned(),
            to: to.to_owned(),
            source: source.to_owned(),
            counters: ProbeCounters::default(),
            healthy_threshold: 3,
            unhealthy_threshold: 3,
            flag_write_us: None,
            reason: reason.map(str::to_owned),
            vip: None,
        };
    let mut announced = event(480.0, "", "withdrawn", "announced", "announce", None);
    announced.service = String::new();
    announced.vip = Some("10.1.0.1".to_owned());
    announced.reason = Some("web: 1 of 2 backends available (needs 1)".to_owned());
    let mut events = vec![
        event(
            500.0,
            "10.0.1.2:80",
            "initializing",
            "healthy",
            "http",
            None,
        ),
        event(
            500.0,
            "10.0.1.3:80",
            "initializing",
            "healthy",
            "http",
            None,
        ),
        announced,
        event(
            300.0,
            "[2001:db8:100::a]:8080",
            "initializing",
            "mostly_unhealthy",
            "http",
            Some("HTTP 503 Service Unavailable (expected 200)"),
        ),
        event(
            240.0,
            "10.0.1.4:80",
            "healthy",
            "drained",
            "admin: drained",
            None,
        ),
        event(
            120.0,
            "10.0.1.3:80",
            "healthy",
            "unhealthy",
            "http",
            Some("timeout after 2s"),
        ),
    ];
    for (seq, e) in (1..).zip(&mut events) {
        e.seq = seq;
    }
    events
}

/// [`wide_status`] as the daemon serves it: the page at `/`, its JSON (for the script's polls)
/// with traffic, and the event log at `/v1/events`. `polls` counts the JSON requests. Each poll
/// moves the status's clock on by a minute, so that a few polls draw most of the 5-minute
/// sparklines: packets at a steady rate (1.23 M/s on the first backend, fewer on the next ones,
/// none on the unhealthy), new flows swinging.
fn wide_site(polls: Arc<AtomicU32>) -> impl Fn(&Request) -> Answer + Send + 'static {
    const STEP_S: u64 = 60;
    let page = html::page(&wide_status(), &wide_events(), 5);
    move |r| match r.path {
        "/" if r.json => {
            let n = polls.fetch_add(1, Ordering::Relaxed) + 1;
            let mut st = wide_status();
            st.time = T + (STEP_S * u64::from(n)) as f64;
            for (i, b) in st
                .services
                .iter_mut()
                .flat_map(|s| &mut s.backends)
                .enumerate()
            {
                let pps = match b.state {
                    HealthState::Unhealthy => 0,
                    _ => 1_234_567 >> (3 * i),
                };
                b.packets += u64::from(n) * STEP_S * pps;
                b.bytes += u64::from(n) * STEP_S * pps * 800;
                b.new_flows += (1..=u64::from(n))
                    .map(|k| STEP_S * pps / 100 * (1 + k % 4) / 2)
                    .sum::<u64>();
            }
            Some((
                "application/json",
                serde_json::to_string(&st).expect("json"),
            ))
        }
        "/" => Some(("text/html", page.clone())),
        path if path.starts_with("/v1/events") => {
            let after: u64 = path
                .split_once("after=")
                .and_then(|(_, rest)| rest.split('&').next()?.parse().ok())
                .unwrap_or(0);
            let events = Events {
                events: wide_events()
                    .into_iter()
                    .filter(|e| e.seq > after)
                    .collect(),
                dropped: 0,
            };
            Some((
                "application/json",
                serde_json::to_string(&events).expect("json"),
            ))
        }
        _ => None,
    }
}

fn serve_status(status: &Status) -> String {
    serve(
        TcpListener::bind("127.0.0.1:0").expect("bind"),
        html_only(html::page(status, &[], 5)),
    )
}

/// Loaded from inside a namespace (the way the end-to-end tests reach the daemon): the DOM has
/// one table per service and the rows with their states; the screenshot has thousands of green
/// and of red pixels.
#[test]
fn page_in_chromium_shows_states_and_colours() {
    require_root();
    let ns = Netns::new("page").expect("namespace");
    let listener = ns.enter(|| TcpListener::bind("127.0.0.1:0").expect("bind in namespace"));
    let url = serve(listener, html_only(html::page(&status(true), &[], 5)));

    let dom = chromium_dump_dom(Some(&ns), &url).expect("dump-dom");
    assert_eq!(dom.matches("<table").count(), 2, "{dom}");
    for (state, address) in [
        ("healthy", "10.0.1.2:80"),
        ("unhealthy", "10.0.1.3:80"),
        ("initializing", "10.0.2.2:53"),
    ] {
        let row = format!(
            "<tr class=\"state-{state}\" data-state=\"{state}\" data-backend=\"{address}\">"
        );
        assert!(dom.contains(&row), "no {row} in\n{dom}");
    }
    assert!(dom.contains("web &lt;main&gt;"), "{dom}");
    assert_eq!(dom.matches(">VIP announced</span>").count(), 2, "{dom}");
    assert!(
        dom.contains("announcing — 2 of 2 VIPs announced (table 200)"),
        "{dom}"
    );
    assert!(dom.contains("<title>lb status</title>"), "{dom}");

    let img = chromium_screenshot(Some(&ns), &url, WIDTH, HEIGHT).expect("screenshot");
    assert_eq!((img.width, img.height), (WIDTH, HEIGHT));
    let green = count_colour_pixels(&img, HEALTHY_COLOUR, TOLERANCE);
    let red = count_colour_pixels(&img, UNHEALTHY_COLOUR, TOLERANCE);
    eprintln!("green pixels {green}, red pixels {red}");
    assert!(green >= MANY, "only {green} healthy-coloured pixels");
    assert!(red >= MANY, "only {red} unhealthy-coloured pixels");
}

/// From the host's loopback, with every backend of "web" healthy: green, and no red at all.
#[test]
fn healthy_page_has_no_red() {
    let url = serve_status(&status(false));
    let img = chromium_screenshot(None, &url, WIDTH, HEIGHT).expect("screenshot");
    let green = count_colour_pixels(&img, HEALTHY_COLOUR, TOLERANCE);
    let red = count_colour_pixels(&img, UNHEALTHY_COLOUR, TOLERANCE);
    eprintln!("green pixels {green}, red pixels {red}");
    assert!(green >= 2 * MANY, "only {green} healthy-coloured pixels");
    assert_eq!(red, 0);
}

#[test]
fn metrics_pass_promtool() {
    for with_unhealthy in [true, false] {
        let text = metrics::render(&status(with_unhealthy));
        promtool_check(&text).unwrap_or_else(|e| panic!("{e:#}\n{text}"));
    }
}

/// The check can fail: a parse error, a lint problem, a repeated series, a split family.
#[test]
fn promtool_rejects_broken_text() {
    let good = metrics::render(&status(true));
    let broken = [
        // Unterminated label value.
        "# HELP lb_x_total x\n# TYPE lb_x_total counter\nlb_x_total{a=\"b} 1\n".to_owned(),
        // A counter without `_total` (lint).
        "# HELP lb_x x\n# TYPE lb_x counter\nlb_x 1\n".to_owned(),
        // A repeated series (promtool 2.42 lets this through; promtool_check does not).
        format!("{good}lb_events_total 4\n"),
        // A family's samples split by another family.
        format!("{good}lb_service_packets_total{{service=\"other\"}} 1\n"),
    ];
    for text in broken {
        assert!(promtool_check(&text).is_err(), "promtool accepted:\n{text}");
    }
}

/// Fast checks on the TCP service, so that a stopped backend is unhealthy within a second.
const CHECK: &str = "[service.check]\ntimeout = \"200ms\"\ninterval = \"300ms\"\nhealthy_threshold = 2\nunhealthy_threshold = 2\n";

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_secs_f64()
}

/// The daemon's page, open in Chromium while backend 1 is stopped: within 2 s of the daemon's
/// verdict the row is unhealthy (class, colour) with the reason, the service banner degraded,
/// and the page was not reloaded (its load stamp, a mark left in its JavaScript heap, and its
/// update counter all carry on). A screenshot goes to `target/status-page.png`.
#[test]
fn live_page_shows_a_failing_backend_without_reload() {
    require_root();
    let mut sb = Sandbox::build(Arms::Two, 2, 8080).expect("sandbox");
    let config = sb.config(80, &[], "").replacen(
        "\n[[service]]\nname = \"udp\"",
        &format!("\n{CHECK}\n[[service]]\nname = \"udp\""),
        1,
    );
    let daemon = Daemon::start(&sb.lb, &config).expect("daemon");
    let addrs: Vec<String> = sb
        .backends
        .iter()
        .map(|b| format!("{}:8080", b.addr))
        .collect();
    let addr = |i: usize| addrs[i].clone();
    for i in 0..2 {
        daemon.wait_state("tcp", &addr(i), "healthy", Duration::from_secs(10));
    }

    let url = "http://127.0.0.1:9090/v1/healthcheck";
    let mut page = Browser::open(Some(&sb.lb), url, WIDTH, HEIGHT).expect("chromium");
    let row = |i: usize| format!("document.querySelector('tr[data-backend=\"{}\"]')", addr(i));
    // Live: a few updates applied, and the rates computed from successive counters.
    page.wait_for(
        "Number(document.body.dataset.updates) >= 3",
        Duration::from_secs(20),
    )
    .expect("the script updates the page");
    let pps = page
        .eval(&format!(
            "{}.querySelector('[data-f=pps]').textContent",
            row(0)
        ))
        .unwrap();
    assert_ne!(pps, "–", "no rate after three updates");
    let loaded_at = page.eval("document.body.dataset.loadedAt").unwrap();
    page.eval("window.lbTestMark = 42").unwrap();
    let updates_before = page.eval("Number(document.body.dataset.updates)").unwrap();
    assert_eq!(
        page.eval(&format!("{}.dataset.state", row(1))).unwrap(),
        "healthy"
    );

    sb.stop_backend(1);
    daemon.wait_state("tcp", &addr(1), "unhealthy", Duration::from_secs(10));
    let moved = daemon.wait_moved_at("tcp", &addr(1), "unhealthy", Duration::from_secs(5));
    let shown = page
        .wait_for(
            &format!(
                "(() => {{ const r = {}; return r.dataset.state === 'unhealthy' && \
                 r.querySelector('[data-f=reason]').textContent !== '–' && \
                 r.querySelector('[data-f=reason]').textContent; }})()",
                row(1)
            ),
            Duration::from_secs(10),
        )
        .expect("the page shows the backend unhealthy");
    let lag = unix_now() - moved;
    eprintln!("shown {lag:.2} s after the daemon's verdict: {shown}");
    assert!(
        lag <= 2.0,
        "the page showed it {lag:.2} s after the verdict"
    );
    let json = daemon.status().unwrap();
    let reason = json.service("tcp").unwrap().backend(&addr(1)).unwrap();
    assert_eq!(
        shown.as_str(),
        reason.last_failure.as_deref(),
        "the reason of the JSON"
    );
    assert_eq!(shown, "connection refused");

    // No reload: the same document, still counting updates.
    assert_eq!(
        page.eval("document.body.dataset.loadedAt").unwrap(),
        loaded_at
    );
    assert_eq!(page.eval("window.lbTestMark").unwrap(), 42);
    let updates = page.eval("Number(document.body.dataset.updates)").unwrap();
    assert!(
        updates.as_u64() > updates_before.as_u64(),
        "{updates} after {updates_before}"
    );

    // Rows, classes and colours per state; the banner and counters.
    let colour = |i: usize| format!("getComputedStyle({}.cells[0]).backgroundColor", row(i));
    let rgb = |[r, g, b]: [u8; 3]| format!("rgb({r}, {g}, {b})");
    assert_eq!(page.eval(&colour(0)).unwrap(), rgb(HEALTHY_COLOUR));
    assert_eq!(page.eval(&colour(1)).unwrap(), rgb(UNHEALTHY_COLOUR));
    assert_eq!(
        page.eval(&format!("{}.className", row(1))).unwrap(),
        "state-unhealthy"
    );
    assert_eq!(
        page.eval("document.querySelectorAll('tr[data-backend]').length")
            .unwrap(),
        4,
        "two backends in each of the two services"
    );
    let banner = page
        .eval(
            "document.querySelector('table[data-service=tcp]').closest('section')\
             .querySelector('.banner').textContent",
        )
        .unwrap();
    assert_eq!(
        banner, "tcp — degraded — 1/2 backends available",
        "the banner"
    );
    let failures = page
        .eval(&format!(
            "{}.querySelector('[data-f=tcp_failure]').textContent",
            row(1)
        ))
        .unwrap();
    assert!(
        failures.as_str().and_then(|f| f.parse::<u32>().ok()) >= Some(2),
        "consecutive tcp failures {failures}"
    );

    // At this width the tables fit, sparklines included.
    assert_fits(&page.eval(LAYOUT).unwrap());

    let (png, img) = page.screenshot().expect("screenshot");
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/status-page.png");
    std::fs::write(&path, &png).expect("writing the screenshot");
    println!("screenshot: {}", path.display());
    eprintln!("screenshot: {}", path.display());
    let green = count_colour_pixels(&img, HEALTHY_COLOUR, TOLERANCE);
    let red = count_colour_pixels(&img, UNHEALTHY_COLOUR, TOLERANCE);
    eprintln!("green pixels {green}, red pixels {red}");
    assert!(green >= MANY && red >= MANY / 2, "green {green}, red {red}");

    // The timeline: backend-1's bar turns red (down) at the kill, then green again after it
    // comes back; the last events list the moves.
    let bands = |i: usize| {
        format!(
            "[...document.querySelectorAll('.tl[data-backend=\"tcp {}\"] .band')].map((b) => b.className.split(' ')[1]).join(',')",
            addr(i)
        )
    };
    page.wait_for(
        &format!("{}.endsWith('band-down')", bands(1)),
        Duration::from_secs(5),
    )
    .expect("the timeline shows the backend down");
    sb.start_backend(1).expect("restart");
    daemon.wait_state("tcp", &addr(1), "healthy", Duration::from_secs(10));
    let shown = page
        .wait_for(
            &format!(
                "(() => {{ const b = {}; return /band-down.*band-up$/.test(b) && b; }})()",
                bands(1)
            ),
            Duration::from_secs(5),
        )
        .expect("the timeline shows the recovery after the failure");
    eprintln!("backend-1's timeline: {shown}");
    assert_eq!(
        page.eval(&format!("{}.endsWith('band-up')", bands(0)))
            .unwrap(),
        true,
        "the healthy backend's bar is up now"
    );
    let events = page
        .eval("document.getElementById('events').textContent")
        .unwrap();
    let events = events.as_str().unwrap_or_default();
    assert!(
        events.contains(&format!("tcp {} ", addr(1))) && events.contains("→ unhealthy"),
        "{events}"
    );
    let (png, _) = page.screenshot().expect("screenshot");
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../target/status-page-recovered.png");
    std::fs::write(&path, &png).expect("writing the screenshot");
    eprintln!("screenshot after the recovery: {}", path.display());
}

/// Everything the page shows of its services, collected in one evaluation.
const SNAPSHOT: &str = r#"(() => {
  const text = (el) => el ? el.textContent : null;
  return {
    refresh: document.querySelector('meta[http-equiv=refresh]')?.content ?? null,
    loaded_at: document.body.dataset.loadedAt,
    updates: document.body.dataset.updates,
    mode: text(document.getElementById('mode')),
    host: text(document.getElementById('host')),
    banners: [...document.querySelectorAll('.banner')].map((b) => [b.className, b.textContent]),
    rows: [...document.querySelectorAll('tr[data-backend]')].map((r) => ({
      backend: r.dataset.backend,
      state: r.dataset.state,
      class: r.className,
      colour: getComputedStyle(r.cells[0]).backgroundColor,
      f: Object.fromEntries([...r.querySelectorAll('[data-f]')].map((e) => [e.dataset.f, e.textContent])),
    })),
    timelines: [...document.querySelectorAll('#timelines .tl')].map((t) => [t.dataset.backend,
      [...t.querySelectorAll('.band')].map((b) => b.className.replace('band band-', '')).join(',')]),
    events: [...document.querySelectorAll('#events li')].map((l) => l.textContent),
    links: [...document.querySelectorAll('a[href]')].map((a) => a.getAttribute('href')),
  };
})()"#;

fn rgb([r, g, b]: [u8; 3]) -> String {
    format!("rgb({r}, {g}, {b})")
}

fn write_screenshot(name: &str, png: &[u8]) -> std::path::PathBuf {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../target")
        .join(name);
    std::fs::write(&path, png).expect("writing the screenshot");
    eprintln!("screenshot: {}", path.display());
    path
}

/// Without JavaScript (off in Chromium before the page loads), the page as served is complete:
/// the meta refresh is in force, the script never ran (no JSON asked for), and banners, rows,
/// states, colours, reasons, counters, the timelines and the last events are all there, each as
/// the status and the event log say. A full-page screenshot goes to
/// `target/status-page-noscript.png`.
#[test]
fn page_without_javascript_is_complete() {
    let polls = Arc::new(AtomicU32::new(0));
    let url = serve(
        TcpListener::bind("127.0.0.1:0").expect("bind"),
        wide_site(polls.clone()),
    );
    let mut page = Browser::open_without_script(None, &url, WIDTH, HEIGHT).expect("chromium");
    // Longer than a poll: the script would have asked for the JSON by now.
    std::thread::sleep(Duration::from_millis(1500));
    let shot: serde_json::Value = page.eval(SNAPSHOT).expect("snapshot");
    assert_eq!(polls.load(Ordering::Relaxed), 0, "the script ran");
    // The <noscript> in <head> was parsed as markup: the refresh is an element.
    assert_eq!(shot["refresh"], "5", "{shot:#}");
    assert_eq!(shot["updates"], "0");
    assert_eq!(shot["mode"], "this page reloads every 5 s");
    assert_eq!(
        shot["host"],
        "Host: announcing — 2 of 2 VIPs announced (table 200)"
    );

    let status = wide_status();
    let banners: Vec<(String, String)> = status
        .services
        .iter()
        .map(|s| {
            (
                format!("banner svc-{}", s.state.as_str()),
                format!(
                    "{} — {} — {}/{} backends available — VIP announced",
                    s.name,
                    s.state.as_str(),
                    s.available_backends,
                    s.backends.len()
                ),
            )
        })
        .collect();
    assert_eq!(
        serde_json::to_value(&banners).unwrap(),
        shot["banners"],
        "banners"
    );
    assert_eq!(
        banners[0].1,
        "web <main> — degraded — 1/5 backends available — VIP announced"
    );

    // Per row: state, class, colour, words, reason, and every number as the status has it.
    let (ok, bad) = (rgb(HEALTHY_COLOUR), rgb(UNHEALTHY_COLOUR));
    let (pending, off) = (rgb(PENDING_COLOUR), rgb(NEUTRAL_COLOUR));
    let expected = [
        ("10.0.1.2:80", "state-healthy", &ok, "healthy"),
        ("10.0.1.3:80", "state-unhealthy", &bad, "unhealthy"),
        (
            "[2001:db8:100::a]:8080",
            "state-mostly_unhealthy",
            &bad,
            "mostly unhealthy",
        ),
        ("10.0.1.4:80", "state-drained", &off, "drained"),
        (
            "10.0.1.5:80",
            "state-healthy ejected",
            &bad,
            "healthy, ejected (service: refused, 12 s left)",
        ),
        (
            "10.0.2.2:53",
            "state-initializing",
            &pending,
            "initializing",
        ),
    ];
    let rows = shot["rows"].as_array().expect("rows");
    let backends: Vec<&BackendStatus> = status.services.iter().flat_map(|s| &s.backends).collect();
    assert_eq!(rows.len(), expected.len(), "{shot:#}");
    assert_eq!(backends.len(), expected.len());
    for ((row, b), (address, class, colour, words)) in rows.iter().zip(backends).zip(expected) {
        assert_eq!(row["backend"], address);
        assert_eq!(b.address, address);
        assert_eq!(row["state"], b.state.as_str(), "{row}");
        assert_eq!(row["class"], class, "{row}");
        assert_eq!(row["colour"], *colour, "{row}");
        let f = &row["f"];
        assert_eq!(f["state"], words, "{row}");
        assert_eq!(
            f["reason"],
            b.last_failure.as_deref().unwrap_or("–"),
            "{row}"
        );
        assert_eq!(f["admin"], b.admin.as_str(), "{row}");
        assert_eq!(f["weight"], b.weight.to_string(), "{row}");
        assert_eq!(f["since"], "12 s", "{row}");
        let c = &b.counters;
        for (k, v) in [
            ("success", u64::from(c.success)),
            ("tcp_failure", u64::from(c.tcp_failure)),
            ("tls_failure", u64::from(c.tls_failure)),
            ("http_failure", u64::from(c.http_failure)),
            ("payload_failure", u64::from(c.payload_failure)),
            ("timeout_failure", u64::from(c.timeout_failure)),
            ("packets", b.packets),
            ("bytes", b.bytes),
            ("new_flows", b.new_flows),
        ] {
            assert_eq!(f[k], v.to_string(), "{k} of {row}");
        }
        // Rates need two polls of the script.
        assert_eq!((&f["pps"], &f["fps"]), (&"–".into(), &"–".into()), "{row}");
    }

    // The timelines over the log's 500 s, and the events newest first.
    let timelines = serde_json::json!([
        ["web <main> 10.0.1.2:80", "up"],
        ["web <main> 10.0.1.3:80", "up,down"],
        ["web <main> [2001:db8:100::a]:8080", "pending,down"],
        ["web <main> 10.0.1.4:80", "up,off"],
        ["web <main> 10.0.1.5:80", "down"],
        ["dns 10.0.2.2:53", "pending"],
    ]);
    assert_eq!(shot["timelines"], timelines, "{shot:#}");
    let events = shot["events"].as_array().expect("events");
    assert_eq!(events.len(), wide_events().len());
    assert_eq!(
        events[0],
        "2026-09-21 14:11:20 UTC web <main> 10.0.1.3:80 healthy → unhealthy (http: timeout after 2s)"
    );
    assert_eq!(
        events[3],
        "2026-09-21 14:05:20 UTC VIP 10.1.0.1 withdrawn → announced \
         (announce: web: 1 of 2 backends available (needs 1))"
    );
    for link in ["/v1/healthcheck", "/metrics", "/v1/events"] {
        assert!(
            shot["links"].as_array().unwrap().contains(&link.into()),
            "no link to {link}: {shot:#}"
        );
    }

    let (png, img) = page.screenshot_full_page().expect("screenshot");
    write_screenshot("status-page-noscript.png", &png);
    let green = count_colour_pixels(&img, HEALTHY_COLOUR, TOLERANCE);
    let red = count_colour_pixels(&img, UNHEALTHY_COLOUR, TOLERANCE);
    eprintln!("green pixels {green}, red pixels {red}");
    assert!(green >= MANY && red >= MANY, "green {green}, red {red}");
    assert_eq!(polls.load(Ordering::Relaxed), 0, "the script ran");
}

/// The daemon's page with JavaScript off: the `<noscript>` refresh reloads it, and a backend
/// stopped shows up unhealthy (row, reason, banner, timeline, events) within a refresh period
/// and a second of the daemon's verdict, every time in a freshly served document (its load stamp
/// moves on, the script's update counter stays 0). A full-page screenshot goes to
/// `target/status-page-noscript-live.png`.
#[test]
fn noscript_refresh_shows_a_failing_backend() {
    require_root();
    let mut sb = Sandbox::build(Arms::Two, 2, 8080).expect("sandbox");
    let config = sb.config(80, &[], "").replacen(
        "\n[[service]]\nname = \"udp\"",
        &format!("\n{CHECK}\n[[service]]\nname = \"udp\""),
        1,
    );
    let daemon = Daemon::start(&sb.lb, &config).expect("daemon");
    let addrs: Vec<String> = sb
        .backends
        .iter()
        .map(|b| format!("{}:8080", b.addr))
        .collect();
    for a in &addrs {
        daemon.wait_state("tcp", a, "healthy", Duration::from_secs(10));
    }
    let url = "http://127.0.0.1:9090/v1/healthcheck";
    let mut page =
        Browser::open_without_script(Some(&sb.lb), url, WIDTH, HEIGHT).expect("chromium");
    let refresh = Duration::from_secs(PAGE_REFRESH_S.into());
    let first = page.eval("document.body.dataset.loadedAt").unwrap();
    assert_eq!(
        page.eval("document.querySelector('meta[http-equiv=refresh]').content")
            .unwrap(),
        PAGE_REFRESH_S.to_string()
    );
    // A reload, not a script: a new document.
    page.wait_for_across_loads(
        &format!("document.body.dataset.loadedAt !== {first}"),
        refresh + Duration::from_secs(2),
    )
    .expect("the page reloads itself");

    sb.stop_backend(1);
    daemon.wait_state("tcp", &addrs[1], "unhealthy", Duration::from_secs(10));
    let moved = daemon.wait_moved_at("tcp", &addrs[1], "unhealthy", Duration::from_secs(5));
    let row = format!(
        "document.querySelector('tr[data-backend=\"{}\"]')",
        addrs[1]
    );
    let shown = page
        .wait_for_across_loads(
            &format!(
                "(() => {{ const r = {row}; return r.dataset.state === 'unhealthy' && \
                 r.querySelector('[data-f=reason]').textContent; }})()"
            ),
            refresh + Duration::from_secs(5),
        )
        .expect("the page shows the backend unhealthy");
    let lag = unix_now() - moved;
    eprintln!("shown {lag:.2} s after the daemon's verdict without JavaScript: {shown}");
    assert_eq!(shown, "connection refused");
    assert!(
        lag <= refresh.as_secs_f64() + 1.0,
        "the page showed it {lag:.2} s after the verdict"
    );
    let shot = page.eval(SNAPSHOT).expect("snapshot");
    assert_eq!(shot["updates"], "0", "the script ran");
    assert!(
        shot["loaded_at"]
            .as_str()
            .and_then(|t| t.parse::<f64>().ok())
            > Some(moved),
        "a document served after the verdict: {shot:#}"
    );
    assert_eq!(
        shot["banners"][0][1], "tcp — degraded — 1/2 backends available",
        "{shot:#}"
    );
    let row = shot["rows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["backend"] == addrs[1].as_str())
        .expect("the row");
    assert_eq!(row["colour"], rgb(UNHEALTHY_COLOUR));
    assert!(
        row["f"]["tcp_failure"]
            .as_str()
            .and_then(|n| n.parse::<u32>().ok())
            >= Some(2),
        "{row}"
    );
    let timeline = shot["timelines"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t[0] == format!("tcp {}", addrs[1]).as_str())
        .expect("its timeline");
    assert!(
        timeline[1].as_str().is_some_and(|b| b.ends_with("up,down")),
        "{timeline}"
    );
    // Among the last (the udp service's checks of that backend may have moved since).
    assert!(
        shot["events"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e.as_str().is_some_and(
                |e| e.contains(&format!("tcp {} ", addrs[1])) && e.contains("→ unhealthy")
            )),
        "{shot:#}"
    );
    let (png, _) = page.screenshot_full_page().expect("screenshot");
    write_screenshot("status-page-noscript-live.png", &png);
}

/// Where the page's boxes end against the viewport: the document's and the body's widths, the
/// sparklines' edges, each table wrapper's scrolling, and the elements outside the wrappers
/// that stick out on the right.
const LAYOUT: &str = r#"(() => {
  const vw = document.documentElement.clientWidth;
  const outside = [...document.body.querySelectorAll('*')]
    .filter((e) => !(e.parentElement && e.parentElement.closest('.wrap')))
    .filter((e) => e.getBoundingClientRect().right > vw + 0.5)
    .map((e) => e.tagName.toLowerCase() + (e.className ? '.' + e.className : '') + ' ' +
      Math.round(e.getBoundingClientRect().right));
  return {
    vw,
    doc: document.documentElement.scrollWidth,
    body: [document.body.scrollWidth, document.body.clientWidth],
    sparks: [...document.querySelectorAll('svg.spark')].map((s) => {
      const r = s.getBoundingClientRect();
      return [r.left, r.right];
    }),
    wraps: [...document.querySelectorAll('.wrap')].map((w) => [w.scrollWidth, w.clientWidth]),
    // For the log: how wide each table would be at its narrowest (the room left at this width).
    narrowest: [...document.querySelectorAll('.wrap table')].map((t) => {
      t.style.width = 'min-content';
      const w = t.offsetWidth;
      t.style.width = '';
      return w;
    }),
    outside,
  };
})()"#;

/// Checks the live daemon's page too (`live_page_shows_a_failing_backend_without_reload`):
/// at its width nothing scrolls, the tables included, and every sparkline is in view.
fn assert_fits(layout: &serde_json::Value) {
    let vw = layout["vw"].as_f64().expect("vw");
    assert!(layout["doc"].as_f64() <= Some(vw), "{layout:#}");
    for w in layout["wraps"].as_array().expect("wraps") {
        assert!(
            w[0].as_f64() <= w[1].as_f64(),
            "a table scrolls: {layout:#}"
        );
    }
    let sparks = layout["sparks"].as_array().expect("sparks");
    assert!(!sparks.is_empty());
    for s in sparks {
        assert!(
            s[0].as_f64() >= Some(0.0) && s[1].as_f64() <= Some(vw),
            "a sparkline out of view: {layout:#}"
        );
    }
    assert_eq!(layout["outside"], serde_json::json!([]), "{layout:#}");
}

/// The layout, with the widest rows ([`wide_status`]) and the script running (rates of 1.2 M
/// packets/s, sparklines): at 1280×800 the tables fit, nothing scrolls sideways and every
/// sparkline is in view; on a phone (390×844) the page's body does not overflow, only the tables
/// scroll inside their wrappers, and the banners, timelines and events fit. Screenshots of both
/// go to `target/status-page-1280.png` and `target/status-page-390.png`. And the checks can fail:
/// an element wider than the viewport is caught.
#[test]
fn layout_fits_a_laptop_and_a_phone() {
    let url = serve(
        TcpListener::bind("127.0.0.1:0").expect("bind"),
        wide_site(Arc::new(AtomicU32::new(0))),
    );
    let mut page = Browser::open(None, &url, WIDTH, HEIGHT).expect("chromium");
    page.wait_for(
        "Number(document.body.dataset.updates) >= 5 && \
         document.querySelector('[data-f=pps]').textContent !== '–'",
        Duration::from_secs(20),
    )
    .expect("the script updates the page");
    assert_eq!(
        page.eval("document.querySelector('[data-f=pps]').textContent")
            .unwrap(),
        "1.23 M",
        "rates in three digits"
    );
    // Screenshots first: they show what went wrong when a check fails.
    let (png, _) = page.screenshot().expect("screenshot");
    write_screenshot("status-page-1280.png", &png);
    let layout = page.eval(LAYOUT).unwrap();
    eprintln!("at {WIDTH} px: {layout}");
    assert_fits(&layout);

    page.resize(390, 844, true).unwrap();
    let (png, _) = page.screenshot().expect("screenshot");
    write_screenshot("status-page-390.png", &png);
    let (png, _) = page.screenshot_full_page().expect("screenshot");
    write_screenshot("status-page-390-full.png", &png);
    // Scrolled to the table's far end, the backend column stays in view.
    let kept = page
        .eval(
            "(() => { const w = document.querySelector('.wrap'); w.scrollLeft = w.scrollWidth; \
             return [w.scrollLeft, w.querySelector('tbody td').getBoundingClientRect().left - \
             w.getBoundingClientRect().left]; })()",
        )
        .unwrap();
    assert!(
        kept[0].as_f64() > Some(300.0) && kept[1].as_f64().is_some_and(|x| x.abs() < 1.0),
        "scrolled by {}, the backend cell {} px from the frame's left",
        kept[0],
        kept[1]
    );
    let (png, _) = page.screenshot().expect("screenshot");
    write_screenshot("status-page-390-scrolled.png", &png);
    let layout = page.eval(LAYOUT).unwrap();
    eprintln!("at 390 px: {layout}");
    assert_eq!(layout["vw"], 390, "{layout:#}");
    assert!(layout["doc"].as_f64() <= Some(390.0), "{layout:#}");
    let body = &layout["body"];
    assert!(body[0].as_f64() <= body[1].as_f64(), "{layout:#}");
    assert_eq!(layout["outside"], serde_json::json!([]), "{layout:#}");
    // The tables are wider than a phone: they scroll, inside their wrappers.
    let wraps = layout["wraps"].as_array().expect("wraps");
    assert!(
        wraps.iter().all(|w| w[0].as_f64() > w[1].as_f64()),
        "{layout:#}"
    );

    // Caught: something wider than the phone, outside the wrappers.
    page.eval(
        "document.getElementById('history').insertAdjacentHTML('beforeend', \
         '<p id=\"wide\" style=\"width: 600px\">wide</p>')",
    )
    .unwrap();
    let layout = page.eval(LAYOUT).unwrap();
    assert!(layout["doc"].as_f64() > Some(390.0), "{layout:#}");
    assert_eq!(layout["outside"][0], "p 616", "{layout:#}");
}
