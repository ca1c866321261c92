//! The status page and the metrics as their users see them, from a `Status` built here (no
//! daemon): the page served over HTTP/1.0 by a tiny server and loaded in headless Chromium (its
//! DOM and a screenshot: healthy rows green, unhealthy rows red), and the metrics through
//! `promtool check metrics`. Also checks that these checks can fail.

use std::{
    io::{Read as _, Write as _},
    net::TcpListener,
};

use lb::{
    api::{
        html::{self, HEALTHY_COLOUR, UNHEALTHY_COLOUR},
        metrics,
    },
    model::{
        Admin, BackendStatus, HealthState, LatencyHistogram, NamedCounter, ProbeCounters,
        ServiceStatus, Status,
    },
};
use lb_tests::{
    netns::Netns,
    require_root,
    webcheck::{chromium_dump_dom, chromium_screenshot, count_colour_pixels, promtool_check},
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
        check: "http".to_owned(),
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
