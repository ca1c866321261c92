//! The status page and the metrics as their users see them, from a `Status` built here (no
//! daemon): the page served over HTTP/1.0 by a tiny server and loaded in headless Chromium (its
//! DOM and a screenshot: healthy rows green, unhealthy rows red), and the metrics through
//! `promtool check metrics`. Also checks that these checks can fail. And the live page of a
//! running daemon, kept open in Chromium while a backend fails: updated in place, no reload.

use std::{
    io::{Read as _, Write as _},
    net::TcpListener,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use lb::{
    api::{
        html::{self, HEALTHY_COLOUR, UNHEALTHY_COLOUR},
        metrics,
    },
    model::{
        Admin, AnnounceStatus, BackendStatus, HealthState, LatencyHistogram, NamedCounter,
        ProbeCounters, ServiceStatus, Status, VipStatus,
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
    let (ip, port) = address.split_once(':').expect("ip:port");
    BackendStatus {
        address: address.to_owned(),
        ip: ip.to_owned(),
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
        time: 1_790_000_000.0,
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
    }
}

/// Serves `page` at `/` (404 elsewhere) over HTTP/1.0 from `listener`, on a thread that lives
/// as long as the test process: enough for the few requests Chromium makes.
fn serve(listener: TcpListener, page: String) -> String {
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
            let (status, body) = if head.starts_with(b"GET / ") {
                ("200 OK", page.as_str())
            } else {
                ("404 Not Found", "not found\n")
            };
            let _ = write!(
                conn,
                "HTTP/1.0 {status}\r\nContent-Type: text/html; charset=utf-8\r\n\
                 Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    url
}

fn serve_status(status: &Status) -> String {
    serve(
        TcpListener::bind("127.0.0.1:0").expect("bind"),
        html::page(status, 5),
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
    let url = serve(listener, html::page(&status(true), 5));

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
    let moved = daemon
        .moved_at("tcp", &addr(1), "unhealthy")
        .expect("an event of the move");
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
