//! The control API and CLI of a running `lb` (SPEC §4): status as JSON, the HTML page in a real
//! browser, Prometheus metrics through promtool, events (recent and followed), the error
//! contract (400, 401, 404, exit codes), admin actions and reloads that keep flows, and the
//! hitless restart of a pinned datapath.

use std::{
    io::{BufRead as _, Read as _, Write as _},
    net::SocketAddr,
    process::Stdio,
    time::{Duration, Instant},
};

use lb::{api::html, model::Events};
use lb_tests::{
    daemon::{Daemon, PinGuard},
    lb_bin, require_root,
    servers::{self, connect},
    topology::{Arms, Sandbox, VIP},
    webcheck,
};

const API: &str = "http://127.0.0.1:9090";

/// Fast checks so the tests see verdicts in a second.
const CHECK: &str = "[service.check]\ntimeout = \"200ms\"\ninterval = \"300ms\"\nhealthy_threshold = 2\nunhealthy_threshold = 2\n";

/// The sandbox's config with the fast check on the TCP service.
fn config(sb: &Sandbox, weights: &[u32], lb_extra: &str) -> String {
    sb.config(80, weights, "")
        .replacen(
            "\n[[service]]\nname = \"udp\"",
            &format!("\n{CHECK}\n[[service]]\nname = \"udp\""),
            1,
        )
        .replacen("[lb]\n", &format!("[lb]\n{lb_extra}"), 1)
}

fn start() -> (Sandbox, Daemon) {
    require_root();
    let sb = Sandbox::build(Arms::Two, 3, 8080).unwrap();
    let daemon = Daemon::start(&sb.lb, &config(&sb, &[], "")).unwrap();
    for b in &sb.backends {
        daemon.wait_state(
            "tcp",
            &format!("{}:8080", b.addr),
            "healthy",
            Duration::from_secs(5),
        );
    }
    (sb, daemon)
}

fn vip() -> SocketAddr {
    SocketAddr::from((VIP, 80))
}

/// `config` without the first backend entry of `addr` (as [`Sandbox::config`] writes it).
fn without_backend(config: &str, addr: &str) -> String {
    let entry = format!("{{ address = \"{addr}\", weight = 1 }}");
    if config.contains(&format!("{entry}, ")) {
        config.replacen(&format!("{entry}, "), "", 1)
    } else {
        config.replacen(&format!(", {entry}"), "", 1)
    }
}

fn code(out: &std::process::Output) -> i32 {
    out.status.code().unwrap_or(-1)
}

#[test]
fn status_json_html_metrics_and_events() {
    let (mut sb, daemon) = start();
    let dead = format!("{}:8080", sb.backends[1].addr);

    // JSON: every service, every backend with its fields.
    let (status, body) = daemon.http("GET", &format!("{API}/v1/healthcheck"), &[]);
    assert_eq!(status, 200, "{body}");
    let json: serde_json::Value = serde_json::from_str(&body).unwrap();
    let tcp = &json["services"][0];
    assert_eq!(tcp["name"], "tcp");
    assert_eq!(tcp["vip"], format!("{VIP}:80"));
    assert_eq!(tcp["check"], "tcp");
    assert_eq!(tcp["failure_window_s"], 0.7, "200ms × 2 + 300ms × 1");
    let b0 = &tcp["backends"][0];
    for key in [
        "ip",
        "port",
        "weight",
        "state",
        "admin",
        "available",
        "counters",
        "last_probe_latency_ms",
        "packets",
        "bytes",
    ] {
        assert!(!b0[key].is_null(), "backend field {key} missing: {b0}");
    }
    assert!(b0["counters"]["success"].as_u64().unwrap() >= 2);
    let udp = &json["services"][1];
    assert_eq!(udp["check"], "udp", "the default check of a UDP service");
    let (status, body) = daemon.http("GET", &format!("{API}/v1/healthcheck/tcp"), &[]);
    assert_eq!(status, 200);
    let one: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(one["services"].as_array().unwrap().len(), 1);

    // A follower sees the coming transition live.
    let mut follower = daemon
        .ns
        .command(lb_bin())
        .args(["events", "--follow"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let follower_out = follower.stdout.take().unwrap();
    let (lines_tx, lines_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(follower_out).lines() {
            if lines_tx.send(line.unwrap_or_default()).is_err() {
                return;
            }
        }
    });
    // Connected once it has printed the log so far (the backends' first verdicts).
    lines_rx
        .recv_timeout(Duration::from_secs(10))
        .expect("lb events --follow printed nothing");

    sb.stop_backend(1);
    daemon.wait_state("tcp", &dead, "unhealthy", Duration::from_secs(3));
    let deadline = Instant::now() + Duration::from_secs(5);
    let followed = loop {
        let line = lines_rx
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            .expect("lb events --follow printed no transition to unhealthy");
        if line.contains(&dead) && line.contains("-> unhealthy") {
            break line;
        }
    };
    // The source and why: the stopped backend refuses the SYNs.
    assert!(followed.contains("(tcp: connection refused;"), "{followed}");
    let _ = follower.kill();
    let _ = follower.wait();

    // The recent events, as JSON: the transition with its source, counters and flag write.
    let out = daemon.lb(&["events", "--json"]);
    assert_eq!(code(&out), 0);
    let events: Events = serde_json::from_slice(&out.stdout).unwrap();
    let e = events
        .events
        .iter()
        .find(|e| e.backend == dead && e.to == "unhealthy")
        .expect("unhealthy event");
    assert_eq!((e.service.as_str(), e.source.as_str()), ("tcp", "tcp"));
    assert_eq!(e.reason.as_deref(), Some("connection refused"));
    assert!(e.counters.tcp_failure + e.counters.timeout_failure >= 2);
    let s = daemon.status().unwrap();
    let b = s.service("tcp").unwrap().backend(&dead).unwrap();
    assert_eq!(
        b.last_failure.as_deref(),
        Some("connection refused"),
        "{b:?}"
    );
    assert_eq!(e.unhealthy_threshold, 2);
    assert!(e.flag_write_us.is_some(), "the flag was written");

    // Metrics: valid for promtool, with the states.
    let (status, metrics) = daemon.http("GET", &format!("{API}/metrics"), &[]);
    assert_eq!(status, 200);
    webcheck::promtool_check(&metrics).unwrap();
    let line =
        format!("lb_backend_state{{service=\"tcp\",backend=\"{dead}\",state=\"unhealthy\"}} 1");
    assert!(metrics.contains(&line), "{line} missing:\n{metrics}");
    assert!(metrics.contains("lb_probe_latency_seconds_bucket{kind=\"tcp\""));
    // The half-open checks' SYNs: the first to each backend through the kernel, later ones to
    // the backends that answered through the link layer.
    let syns = |path: &str| -> u64 {
        let prefix = format!("lb_probe_syns_total{{path=\"{path}\"}} ");
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{prefix} missing:\n{metrics}"))
    };
    assert!(syns("kernel") >= 3, "one per backend at least");
    assert!(syns("link") > 0, "no SYN took the link-layer path");

    // The page in a browser: rows by state, green and red.
    let url = format!("{API}/v1/healthcheck");
    let dom = webcheck::chromium_dump_dom(Some(&daemon.ns), &url).unwrap();
    assert!(
        dom.contains(&format!("data-backend=\"{dead}\""))
            && dom.contains("data-state=\"unhealthy\""),
        "{dom}"
    );
    assert!(dom.contains("data-state=\"healthy\""));
    let shot = webcheck::chromium_screenshot(Some(&daemon.ns), &url, 1400, 1000).unwrap();
    let green = webcheck::count_colour_pixels(&shot, html::HEALTHY_COLOUR, 2);
    let red = webcheck::count_colour_pixels(&shot, html::UNHEALTHY_COLOUR, 2);
    assert!(green > 1000 && red > 1000, "green {green}, red {red}");
    // `/` leads to the page.
    let (status, _) = daemon.http("GET", &format!("{API}/"), &[]);
    assert_eq!(status, 303);

    // CLI table.
    let out = daemon.lb(&["status", "tcp"]);
    assert_eq!(code(&out), 0);
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(table.contains("failure window 0.7s"), "{table}");
    assert!(table.contains("2/3 backends available"), "{table}");
}

#[test]
fn errors_have_their_status_and_exit_code() {
    let (_sb, daemon) = start();
    let cases = [
        ("GET", "/v1/healthcheck/nope", 404),
        ("GET", "/v1/nope", 404),
        ("GET", "/v1/events?after=abc", 400),
        (
            "POST",
            "/v1/services/tcp/backends/not-an-address/drain",
            400,
        ),
        ("POST", "/v1/services/tcp/backends/10.9.9.9:80/drain", 404),
        ("POST", "/v1/services/nope/backends/10.9.9.9:80/drain", 404),
        (
            "POST",
            "/v1/services/tcp/backends/10.0.2.10:8080/explode",
            400,
        ),
        ("DELETE", "/v1/healthcheck", 405),
        ("POST", "/v1/host/explode", 400),
    ];
    for (method, path, want) in cases {
        let (status, body) = daemon.http(method, &format!("{API}{path}"), &[]);
        assert_eq!(status, want, "{method} {path}: {body}");
        let json: serde_json::Value = serde_json::from_str(&body)
            .unwrap_or_else(|e| panic!("{method} {path}: not JSON ({e}): {body}"));
        assert!(json["error"].is_string(), "{method} {path}: {body}");
    }
    let out = daemon.lb(&["status", "nope"]);
    assert_eq!(code(&out), 3, "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no service \"nope\""));
    let out = daemon.lb(&["backend", "drain", "tcp", "10.9.9.9:80"]);
    assert_eq!(code(&out), 3);
    // Without [lb.announce] there is nothing to withdraw, and lb says so.
    for (command, what) in [("drain-host", "withdraw"), ("undrain-host", "announce")] {
        let out = daemon.lb(&[command]);
        assert_eq!(code(&out), 0, "{}", String::from_utf8_lossy(&out.stderr));
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim(),
            format!("lb announces nothing (no [lb.announce] in its config): nothing to {what}")
        );
    }
    let out = daemon.lb(&["status", "--api", "127.0.0.1:9"]);
    assert_eq!(code(&out), 69, "no daemon there");
    assert!(String::from_utf8_lossy(&out.stderr).contains("is `lb run` running"));
}

#[test]
fn admin_needs_a_token_beyond_loopback() {
    require_root();
    let sb = Sandbox::build(Arms::Two, 1, 8080).unwrap();
    let token = "s3cret-token-0123456789";
    let api = "10.0.1.1:9090"; // lb's client-side address
    let daemon = Daemon::start(
        &sb.lb,
        &config(
            &sb,
            &[],
            &format!("api = \"{api}\"\napi_token = \"{token}\"\n"),
        ),
    )
    .unwrap_or_else(|e| panic!("{e:#}"));
    let client = |method: &str, url: &str, headers: &[&str]| {
        lb_tests::daemon::http(&sb.client.ns, method, url, headers)
    };
    let url = format!("http://{api}/v1/services/tcp/backends/10.0.2.10:8080/drain");
    let (status, _) = client("GET", &format!("http://{api}/v1/healthcheck"), &[]);
    assert_eq!(status, 200, "reading needs no token");
    let (status, body) = client("POST", &url, &[]);
    assert_eq!(status, 401, "{body}");
    let (status, _) = client(
        "POST",
        &url,
        &["Authorization: Bearer wrong-token-0123456789"],
    );
    assert_eq!(status, 401);
    let (status, body) = client("POST", &url, &[&format!("Authorization: Bearer {token}")]);
    assert_eq!(status, 200, "{body}");
    // The CLI takes the token from the environment.
    let out = sb
        .client
        .ns
        .command(lb_bin())
        .args(["backend", "enable", "tcp", "10.0.2.10:8080", "--api", api])
        .output()
        .unwrap();
    assert_eq!(code(&out), 77, "{}", String::from_utf8_lossy(&out.stderr));
    let out = sb
        .client
        .ns
        .command(lb_bin())
        .env("LB_API_TOKEN", token)
        .args(["backend", "enable", "tcp", "10.0.2.10:8080", "--api", api])
        .output()
        .unwrap();
    assert_eq!(code(&out), 0, "{}", String::from_utf8_lossy(&out.stderr));
    drop(daemon);
}

/// Sends a line on an open connection through the VIP and reads the echo.
fn echo(stream: &mut std::net::TcpStream, text: &str) -> anyhow::Result<()> {
    stream.write_all(format!("{text}\n").as_bytes())?;
    let mut buf = vec![0u8; text.len() + 1];
    stream.read_exact(&mut buf)?;
    anyhow::ensure!(buf == format!("{text}\n").as_bytes(), "echo mismatch");
    Ok(())
}

#[test]
fn drain_keeps_connections_and_stops_new_ones() {
    let (sb, daemon) = start();
    let (mut stream, name) = connect(&sb.client.ns, vip()).unwrap();
    let i: usize = name.trim_start_matches("backend-").parse().unwrap();
    let addr = format!("{}:8080", sb.backends[i].addr);
    let out = daemon.lb(&["backend", "drain", "tcp", &addr]);
    assert_eq!(code(&out), 0, "{}", String::from_utf8_lossy(&out.stderr));
    daemon.wait_state("tcp", &addr, "drained", Duration::from_secs(1));
    echo(&mut stream, "still here").unwrap();
    let seen = servers::spread(&sb.client.ns, vip(), 60);
    assert!(!seen.contains_key(&name), "{name} drained but got {seen:?}");
    echo(&mut stream, "and still").unwrap();
    let status = daemon.status().unwrap();
    let b = status.service("tcp").unwrap().backend(&addr).unwrap();
    assert_eq!((b.admin.as_str(), b.available), ("drained", false));
    let out = daemon.lb(&["backend", "enable", "tcp", &addr]);
    assert_eq!(code(&out), 0);
    let seen = servers::spread(&sb.client.ns, vip(), 90);
    assert!(seen.get(&name).copied().unwrap_or(0) > 10, "{seen:?}");
    let events = daemon.lb(&["events"]);
    let text = String::from_utf8_lossy(&events.stdout);
    assert!(
        text.contains("admin: drained") && text.contains("admin: enabled"),
        "{text}"
    );
}

#[test]
fn reload_applies_in_place_and_rejects_bad_files() {
    let (sb, daemon) = start();
    let (mut stream, name) = connect(&sb.client.ns, vip()).unwrap();
    let kept: usize = name.trim_start_matches("backend-").parse().unwrap();
    let removed = (kept + 1) % 3;
    let removed_addr = format!("{}:8080", sb.backends[removed].addr);

    // A bad file is rejected with every problem; nothing changes.
    let good = std::fs::read_to_string(&daemon.config).unwrap();
    std::fs::write(
        &daemon.config,
        good.replacen("protocol = \"tcp\"", "protocol = \"sctp\"", 1)
            .replacen("weight = 1", "weight = -1", 1),
    )
    .unwrap();
    let before = daemon.status().unwrap();
    let out = daemon.lb(&["reload"]);
    assert_eq!(code(&out), 64, "{}", String::from_utf8_lossy(&out.stderr));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("service[0].protocol") && err.contains("service[0].backends[0].weight"),
        "{err}"
    );
    // Keys only a restart can change are refused too.
    std::fs::write(
        &daemon.config,
        good.replacen("[lb]\n", "[lb]\nring_size = 1009\n", 1),
    )
    .unwrap();
    let out = daemon.lb(&["reload"]);
    assert_eq!(code(&out), 64);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("lb.ring_size: cannot change while running")
    );
    let after = daemon.status().unwrap();
    let names = |s: &lb::model::Status| -> Vec<(String, Vec<String>)> {
        s.services
            .iter()
            .map(|s| {
                (
                    s.name.clone(),
                    s.backends.iter().map(|b| b.address.clone()).collect(),
                )
            })
            .collect()
    };
    assert_eq!(names(&before), names(&after));
    echo(&mut stream, "after rejected reloads").unwrap();

    // A good one: drop a backend of the TCP service (SIGHUP does the same as `lb reload`).
    let new = without_backend(&good, &removed_addr);
    assert_ne!(new, good);
    std::fs::write(&daemon.config, &new).unwrap();
    let kill = unsafe { libc::kill(daemon.process.pid() as i32, libc::SIGHUP) };
    assert_eq!(kill, 0);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let s = daemon.status().unwrap();
        if s.service("tcp").unwrap().backends.len() == 2 {
            assert_eq!(
                s.service("udp").unwrap().backends.len(),
                3,
                "only tcp changed"
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "SIGHUP reload not applied:\n{}",
            daemon.log_text()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    echo(&mut stream, "after the reload").unwrap();
    let seen = servers::spread(&sb.client.ns, vip(), 60);
    let gone = format!("backend-{removed}");
    assert!(
        !seen.contains_key(&gone),
        "{gone} was removed but got {seen:?}"
    );
    // The kept backends kept their health (no new initializing round).
    let s = daemon.status().unwrap();
    assert!(
        s.service("tcp")
            .unwrap()
            .backends
            .iter()
            .all(|b| b.state == "healthy"),
        "{s:?}"
    );
    let text = String::from_utf8_lossy(&daemon.lb(&["events"]).stdout).into_owned();
    assert!(
        text.contains(&format!("{removed_addr} healthy -> unused (reload")),
        "{text}"
    );

    // And back, through the API.
    std::fs::write(&daemon.config, &good).unwrap();
    let out = daemon.lb(&["reload"]);
    assert_eq!(code(&out), 0, "{}", String::from_utf8_lossy(&out.stderr));
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        said.contains("backends added") && said.contains("probes: 1 started"),
        "{said}"
    );
    daemon.wait_state("tcp", &removed_addr, "healthy", Duration::from_secs(3));
    echo(&mut stream, "after the second reload").unwrap();

    // A changed check restarts the probes of every backend under it, and says so.
    std::fs::write(
        &daemon.config,
        good.replacen("interval = \"300ms\"", "interval = \"400ms\"", 1),
    )
    .unwrap();
    let out = daemon.lb(&["reload"]);
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        said.contains("probes: 3 started") && said.contains("3 stopped"),
        "{said}"
    );
    echo(&mut stream, "after the check changed").unwrap();
}

/// An admin change is forgotten with its backend: a backend removed by a reload and added
/// back starts afresh (its state's age counts from then), and the daemon keeps no record of
/// backends it no longer has (a record per admin change on replaced backends, kept forever).
#[test]
fn a_backend_removed_and_added_back_forgets_its_admin_change() {
    let (sb, daemon) = start();
    // The UDP service (the last) without checks: its backends' age is their admin change's.
    let mut good = std::fs::read_to_string(&daemon.config).unwrap();
    good.push_str("\n[service.check]\nkind = \"none\"\n");
    std::fs::write(&daemon.config, &good).unwrap();
    let out = daemon.lb(&["reload"]);
    assert_eq!(code(&out), 0, "{}", String::from_utf8_lossy(&out.stderr));
    let addr = format!("{}:8080", sb.backends[0].addr);
    let out = daemon.lb(&["backend", "disable", "udp", &addr]);
    assert_eq!(code(&out), 0, "{}", String::from_utf8_lossy(&out.stderr));

    let udp_from = good.find("name = \"udp\"").unwrap();
    let (head, tail) = good.split_at(udp_from);
    let without = without_backend(tail, &addr);
    assert_ne!(without, tail);
    std::fs::write(&daemon.config, format!("{head}{without}")).unwrap();
    let out = daemon.lb(&["reload"]);
    assert_eq!(code(&out), 0, "{}", String::from_utf8_lossy(&out.stderr));
    let status = daemon.status().unwrap();
    assert!(status.service("udp").unwrap().backend(&addr).is_none());

    let added = Instant::now();
    std::fs::write(&daemon.config, &good).unwrap();
    let out = daemon.lb(&["reload"]);
    assert_eq!(code(&out), 0, "{}", String::from_utf8_lossy(&out.stderr));
    let status = daemon.status().unwrap();
    let b = status
        .service("udp")
        .unwrap()
        .backend(&addr)
        .unwrap()
        .clone();
    let bound = added.elapsed().as_secs_f64();
    assert_eq!(b.admin, "enabled", "{b:?}");
    assert!(
        b.state_for_s <= bound,
        "in its state for {} s, but added back {bound} s ago: {b:?}",
        b.state_for_s
    );
}

#[test]
fn a_pinned_datapath_survives_the_daemon() {
    require_root();
    let mut sb = Sandbox::build(Arms::Two, 3, 8080).unwrap();
    let cleanup = PinGuard::unique();
    let pin = cleanup.0.clone();
    let config = config(&sb, &[], &format!("pin_path = \"{pin}\"\n"));
    let mut daemon = Daemon::start_pinned(&sb.lb, &config).unwrap();
    let down = format!("{}:8080", sb.backends[2].addr);
    for b in &sb.backends {
        let addr = format!("{}:8080", b.addr);
        daemon.wait_state("tcp", &addr, "healthy", Duration::from_secs(5));
    }
    sb.stop_backend(2);
    daemon.wait_state("tcp", &down, "unhealthy", Duration::from_secs(3));
    let (mut stream, name) = connect(&sb.client.ns, vip()).unwrap();
    assert_ne!(name, "backend-2");

    // kill -9: nothing is cleaned up, the pinned program keeps forwarding the open stream.
    daemon.stop(libc::SIGKILL);
    for p in &sb.lb_ports {
        assert!(
            sb.lb.xdp_attached(&p.ifname).unwrap(),
            "XDP left on {}",
            p.ifname
        );
    }
    echo(&mut stream, "daemon gone").unwrap();
    let seen = servers::spread(&sb.client.ns, vip(), 30);
    assert!(
        !seen.contains_key("backend-2"),
        "the dead backend's flag stayed down: {seen:?}"
    );

    // A new daemon adopts it: same stream, the down flag kept until its first verdict.
    let daemon = Daemon::start_pinned(&sb.lb, &config).unwrap();
    assert!(
        daemon.log_text().contains("adopting the pinned datapath"),
        "{}",
        daemon.log_text()
    );
    let s = daemon.status().unwrap();
    let b = s.service("tcp").unwrap().backend(&down).unwrap();
    assert!(!b.available, "flag kept: {b:?}");
    // ... and the state says so (issue 14: it read `initializing`, which counts as available).
    assert_eq!(b.state, "unhealthy", "{b:?}");
    for other in &s.service("tcp").unwrap().backends {
        if other.address != down {
            assert!(other.available && other.state != "unhealthy", "{other:?}");
        }
    }
    echo(&mut stream, "new daemon").unwrap();
    sb.start_backend(2).unwrap();
    daemon.wait_state("tcp", &down, "healthy", Duration::from_secs(3));
    let seen = servers::spread(&sb.client.ns, vip(), 90);
    assert!(seen.get("backend-2").copied().unwrap_or(0) > 5, "{seen:?}");
    echo(&mut stream, "still").unwrap();

    // `lb stop` removes everything.
    let out = daemon.lb(&["stop"]);
    assert_eq!(code(&out), 0, "{}", String::from_utf8_lossy(&out.stderr));
    let mut daemon = daemon;
    let deadline = Instant::now() + Duration::from_secs(10);
    while daemon.process.running() {
        assert!(Instant::now() < deadline, "lb stop did not end the daemon");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(!std::path::Path::new(&pin).exists(), "pins left at {pin}");
    for p in &sb.lb_ports {
        assert!(!sb.lb.xdp_attached(&p.ifname).unwrap());
    }
}

/// What a reload must not change: services, backends, their states and admin settings.
fn shape(s: &lb::model::Status) -> Vec<String> {
    s.services
        .iter()
        .flat_map(|s| {
            s.backends
                .iter()
                .map(move |b| format!("{} {} {} {} {}", s.name, s.vip, b.address, b.state, b.admin))
        })
        .collect()
}

/// Rejected reloads so far, by the way they came.
fn rejected(daemon: &Daemon, via: &str) -> Vec<lb::model::Event> {
    let out = daemon.lb(&["events", "--json"]);
    let events: Events = serde_json::from_slice(&out.stdout).unwrap();
    events
        .events
        .into_iter()
        .filter(|e| e.source == format!("reload rejected ({via})"))
        .collect()
}

/// Issue 14: bad files through `lb reload`, the API and SIGHUP are each rejected with their
/// problems, logged and evented, and change nothing; the daemon lives on (a huge duration made
/// SIGHUP kill it).
#[test]
fn hostile_reloads_are_rejected_logged_and_evented() {
    let (sb, mut daemon) = start();
    let good = std::fs::read_to_string(&daemon.config).unwrap();
    let before = daemon.status().unwrap();
    let lb_side = "10.0.1.1"; // lb's own address on the client side
    let bad: Vec<(&str, Vec<u8>, &str)> = vec![
        (
            "huge duration",
            good.replacen(
                "interval = \"300ms\"",
                "interval = \"99999999999999999999s\"",
                1,
            )
            .into_bytes(),
            "service[0].check.interval: 99999999999999999999s is out of range",
        ),
        (
            "not UTF-8",
            [good.as_bytes(), b"# \xff\xfe\n"].concat(),
            "not UTF-8 (byte 0xff)",
        ),
        (
            "deep nesting",
            format!("{good}x = {}1{}\n", "[".repeat(5000), "]".repeat(5000)).into_bytes(),
            "invalid TOML",
        ),
        (
            "a megabyte host",
            good.replacen(
                "interval = \"300ms\"",
                &format!(
                    "interval = \"300ms\"\nkind = \"http\"\nhost = \"{}\"",
                    "h".repeat(1 << 20)
                ),
                1,
            )
            .into_bytes(),
            "service[0].check.host: 1048576 bytes, more than 260",
        ),
        (
            "a VIP that is lb's own address",
            good.replacen(
                &format!("vip = \"{VIP}:80\""),
                &format!("vip = \"{lb_side}:80\""),
                1,
            )
            .into_bytes(),
            "service[0].vip: 10.0.1.1 is an address of this host",
        ),
        (
            "a loopback backend",
            good.replacen(
                &format!("\"{}:8080\"", sb.backends[0].addr),
                "\"127.0.0.1:8080\"",
                1,
            )
            .into_bytes(),
            "127.0.0.1 is a loopback address",
        ),
        (
            "a truncated file",
            good.as_bytes()[..good.len() / 3].to_vec(),
            "",
        ),
        ("an empty file", Vec::new(), "lb: missing"),
    ];
    for (i, (what, bytes, want)) in bad.iter().enumerate() {
        std::fs::write(&daemon.config, bytes).unwrap();
        // lb reload: exit 64 with the problem.
        let out = daemon.lb(&["reload"]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(code(&out), 64, "{what}: {err}");
        assert!(err.contains(want), "{what}: want {want:?} in {err}");
        // The API: 400 with the problems.
        let (status, body) = daemon.http("POST", &format!("{API}/v1/reload"), &[]);
        assert_eq!(status, 400, "{what}: {body}");
        let reply: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert!(
            reply["problems"].as_array().is_some_and(|p| !p.is_empty()),
            "{body}"
        );
        // SIGHUP: rejected, evented, the daemon alive.
        let kill = unsafe { libc::kill(daemon.process.pid() as i32, libc::SIGHUP) };
        assert_eq!(kill, 0);
        let deadline = Instant::now() + Duration::from_secs(10);
        while rejected(&daemon, "SIGHUP").len() <= i {
            assert!(
                daemon.process.running(),
                "{what}: SIGHUP killed lb:\n{}",
                daemon.log_text()
            );
            assert!(
                Instant::now() < deadline,
                "{what}: no rejection event\n{}",
                daemon.log_text()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        let event = rejected(&daemon, "SIGHUP").pop().unwrap();
        assert!(
            event.reason.as_deref().is_some_and(|r| r.contains(want)),
            "{what}: {event:?}"
        );
    }
    // `lb reload` goes through the API as well.
    assert_eq!(rejected(&daemon, "API").len(), 2 * bad.len());
    assert!(daemon.process.running());
    let log = daemon.log_text();
    assert_eq!(
        log.matches("reload rejected; the running state is unchanged")
            .count(),
        3 * bad.len(),
        "{log}"
    );
    assert!(!log.contains("panicked"), "{log}");
    // Nothing changed, and the datapath still serves.
    let after = daemon.status().unwrap();
    assert_eq!(shape(&before), shape(&after));
    let seen = servers::spread(&sb.client.ns, vip(), 30);
    assert_eq!(seen.values().sum::<usize>(), 30, "{seen:?}");
    // A good file is taken again.
    std::fs::write(&daemon.config, &good).unwrap();
    let out = daemon.lb(&["reload"]);
    assert_eq!(code(&out), 0, "{}", String::from_utf8_lossy(&out.stderr));
}

/// Issue 14: 1,100 idle connections to the API of a daemon started at the usual 1,024
/// open-file limit used up every descriptor: the API stopped answering and every HTTP probe
/// failed, so all backends went unhealthy. Now lb raises its limit, caps the API (a new
/// connection closes the oldest idle one) and closes connections that send no request.
#[test]
fn idle_api_connections_neither_lock_the_api_nor_blind_the_checks() {
    require_root();
    let sb = Sandbox::build(Arms::Two, 3, 8080).unwrap();
    let check = format!(
        "[service.check]\nkind = \"http\"\nport = {}\npath = \"/\"\ntimeout = \"200ms\"\n\
         interval = \"300ms\"\nhealthy_threshold = 2\nunhealthy_threshold = 2\n",
        lb_tests::topology::HTTP_PORT
    );
    let config = sb.config(80, &[], "").replacen(
        "\n[[service]]\nname = \"udp\"",
        &format!("\n{check}\n[[service]]\nname = \"udp\""),
        1,
    );
    let daemon = Daemon::start_under(&sb.lb, &config, &["prlimit", "--nofile=1024:1024"]).unwrap();
    for b in &sb.backends {
        daemon.wait_state(
            "tcp",
            &format!("{}:8080", b.addr),
            "healthy",
            Duration::from_secs(5),
        );
    }

    // 1,100 connections that never send a byte, from the daemon's namespace.
    lb_tests::inproc::raise_fd_limit(4096).unwrap();
    let api: SocketAddr = "127.0.0.1:9090".parse().unwrap();
    let opened = Instant::now();
    let idle: Vec<std::net::TcpStream> = sb.lb.enter(|| {
        (0..1100)
            .map(|i| {
                std::net::TcpStream::connect_timeout(&api, Duration::from_secs(5))
                    .unwrap_or_else(|e| panic!("connection {i}: {e}"))
            })
            .collect()
    });
    // The API still answers, and the probes keep passing through two failure windows.
    let deadline = Instant::now() + Duration::from_secs(10);
    let during = loop {
        match daemon.status() {
            Ok(s) => break s,
            Err(e) => assert!(
                Instant::now() < deadline,
                "the API stopped answering: {e:#}"
            ),
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(
        during.resources.api_evicted_total > 0,
        "{:?}",
        during.resources
    );
    assert!(
        during.resources.api_connections <= during.resources.api_connections_max,
        "{:?}",
        during.resources
    );
    daemon.holds_for(
        Duration::from_millis(1500),
        "the probes pass while the API is crowded",
        |s| {
            s.service("tcp")
                .is_some_and(|t| t.backends.iter().all(|b| b.state == "healthy"))
        },
    );
    let events = String::from_utf8_lossy(&daemon.lb(&["events"]).stdout).into_owned();
    assert!(!events.contains("-> unhealthy"), "{events}");
    let log = daemon.log_text();
    assert!(log.contains("control API at its connection cap"), "{log}");
    let (status, metrics) = daemon.http("GET", &format!("{API}/metrics"), &[]);
    assert_eq!(status, 200);
    assert!(
        metrics.lines().any(
            |l| l.starts_with("lb_api_connections_closed_total{why=\"evicted\"}")
                && !l.ends_with(" 0")
        ),
        "{metrics}"
    );

    // An open connection that sends no request is closed after the header timeout: the last
    // ones opened are still held, each sees its end.
    for mut c in idle.into_iter().rev().take(5) {
        c.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let mut buf = [0u8; 64];
        let n = c.read(&mut buf).unwrap_or(0);
        assert_eq!(n, 0, "the server sent {:?}", &buf[..n]);
    }
    let held = opened.elapsed();
    assert!(held < Duration::from_secs(20), "closed after {held:?}");
    // Raising the hard limit needs CAP_SYS_RESOURCE, which this machine's root lacks: lb ran at
    // 1,024 and said so; the API's cap kept the probes' share all the same.
    let s = daemon.status().unwrap();
    if s.resources.fd_limit < lb::resources::WANTED_FILES {
        assert!(
            daemon.log_text().contains("open-file limit 1024 is below"),
            "{}",
            daemon.log_text()
        );
    }
    // So is a slow one that never finishes its head (slowloris).
    let mut slow = sb.lb.enter(|| std::net::TcpStream::connect(api)).unwrap();
    let started = Instant::now();
    slow.write_all(b"GET /v1/healthcheck HTTP/1.1\r\nHost: x\r\n")
        .unwrap();
    slow.set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let mut rest = Vec::new();
    let _ = slow.read_to_end(&mut rest);
    let took = started.elapsed();
    assert!(
        took >= Duration::from_secs(9) && took < Duration::from_secs(15),
        "slow header closed after {took:?}"
    );
}

/// A client that asks for the metrics and then reads none of them is let go after the send
/// timeout: it held the answer (MBs) and its connection (busy, so never evicted) for ever, and
/// 256 of them locked the API.
#[test]
fn a_client_that_stops_reading_its_answer_is_let_go() {
    require_root();
    let sb = Sandbox::build(Arms::Two, 3, 8080).unwrap();
    // 7,000 backends without checks (ports of the sandbox's own backends): 10 MB of metrics,
    // more than the sockets' buffers hold (4 MB at most for the sender, here).
    let backends: Vec<String> = (0..7000)
        .map(|i| {
            let b = &sb.backends[i % sb.backends.len()];
            format!("{{ address = \"{}:{}\" }}", b.addr, 20000 + i)
        })
        .collect();
    let config = format!(
        "{}\n[[service]]\nname = \"big\"\nvip = \"{}\"\nprotocol = \"tcp\"\nbackends = [{}]\n\
         [service.check]\nkind = \"none\"\n",
        sb.config(80, &[], "")
            .replacen("[lb]\n", "[lb]\nmax_backends = 8192\n", 1),
        SocketAddr::from((VIP, 81)),
        backends.join(", ")
    );
    let daemon = Daemon::start(&sb.lb, &config).unwrap();
    let (status, whole) = daemon.http("GET", &format!("{API}/metrics"), &[]);
    assert_eq!(status, 200);
    assert!(whole.len() > 8 << 20, "metrics of {} bytes", whole.len());

    let api: SocketAddr = "127.0.0.1:9090".parse().unwrap();
    let mut stalled = sb.lb.enter(|| std::net::TcpStream::connect(api)).unwrap();
    stalled
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let asked = Instant::now();
    // Only the status request's own connection stays open.
    let deadline = asked + lb::api::SEND_TIMEOUT + Duration::from_secs(20);
    loop {
        let open = daemon.status().unwrap().resources.api_connections;
        if open == 1 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{open} API connections {:?} after a client stopped reading",
            asked.elapsed()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(
        asked.elapsed() >= lb::api::SEND_TIMEOUT,
        "let go after {:?}",
        asked.elapsed()
    );
    // What it had not taken is gone: the answer was cut.
    stalled
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut got = Vec::new();
    let _ = stalled.read_to_end(&mut got);
    assert!(
        got.len() < whole.len(),
        "read {} of {}",
        got.len(),
        whole.len()
    );
}

/// Seed 004's service states, as backends fail and come back: healthy, degraded, down with the
/// all-unhealthy policy named; in the JSON, `lb status`, the metrics and the page.
#[test]
fn the_service_state_follows_its_backends() {
    use lb::model::ServiceState;
    let (mut sb, daemon) = start();
    let state = || {
        let s = daemon.status().unwrap();
        let t = s.service("tcp").unwrap();
        (t.state, t.policy_in_force.clone())
    };
    assert_eq!(state(), (ServiceState::Healthy, None));
    let addrs: Vec<String> = sb
        .backends
        .iter()
        .map(|b| format!("{}:8080", b.addr))
        .collect();
    let addr = |i: usize| addrs[i].as_str();
    sb.stop_backend(1);
    daemon.wait_state("tcp", addr(1), "unhealthy", Duration::from_secs(5));
    assert_eq!(state(), (ServiceState::Degraded, None));
    let out = daemon.lb(&["status", "tcp"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("tcp  degraded  check"), "{text}");

    sb.stop_backend(0);
    sb.stop_backend(2);
    daemon.wait_state("tcp", addr(0), "unhealthy", Duration::from_secs(5));
    daemon.wait_state("tcp", addr(2), "unhealthy", Duration::from_secs(5));
    assert_eq!(
        state(),
        (ServiceState::Down, Some("use-all".to_owned())),
        "no backend available: the policy decides"
    );
    let out = daemon.lb(&["status", "tcp"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("down  check") && text.contains("(on_all_unhealthy = use-all in force)"),
        "{text}"
    );
    let (_, metrics) = daemon.http("GET", &format!("{API}/metrics"), &[]);
    assert!(
        metrics.contains("lb_service_state{service=\"tcp\",state=\"down\"} 1")
            && metrics.contains("lb_service_state{service=\"tcp\",state=\"healthy\"} 0"),
        "{metrics}"
    );
    let (_, page) = daemon.http(
        "GET",
        &format!("{API}/v1/healthcheck"),
        &["Accept: text/html"],
    );
    assert!(
        page.contains("down (on_all_unhealthy = use-all in force)"),
        "{page}"
    );
    // The same URL as a page or as JSON, each with its type.
    let content_type = |headers: &[&str]| {
        let mut curl = daemon.ns.command("curl");
        curl.args(["-s", "-o", "/dev/null", "-m", "10", "-w", "%{content_type}"]);
        for h in headers {
            curl.args(["-H", h]);
        }
        let out = curl
            .arg(format!("{API}/v1/healthcheck/tcp"))
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    assert_eq!(
        content_type(&["Accept: text/html"]),
        "text/html; charset=utf-8"
    );
    assert_eq!(content_type(&[]), "application/json");

    sb.start_backend(0).unwrap();
    daemon.wait_state("tcp", addr(0), "healthy", Duration::from_secs(5));
    assert_eq!(state(), (ServiceState::Degraded, None));
}

/// IPv6 services in every face of the daemon: canonical addresses in JSON, `lb status`, the page
/// and the metrics; admin actions through the CLI and through URLs with the address written
/// raw, percent-encoded or not canonical; the API listening on an IPv6 address.
#[test]
fn ipv6_services_through_the_api_and_cli() {
    require_root();
    let sb = Sandbox::build(Arms::Two, 3, 8080).unwrap();
    let config = sb
        .config6(80, &[], "", true)
        .replacen(
            "\n[[service]]\nname = \"udp6\"",
            &format!("\n{CHECK}\n[[service]]\nname = \"udp6\""),
            1,
        )
        .replacen("[lb]\n", "[lb]\napi = \"[::1]:9090\"\n", 1);
    let daemon = Daemon::start(&sb.lb, &config).unwrap();
    assert_eq!(daemon.api, "[::1]:9090");
    let api = "http://[::1]:9090";
    let addr = |i: usize| format!("[{}]:8080", sb.backends[i].addr6);
    for i in 0..3 {
        daemon.wait_state("tcp6", &addr(i), "healthy", Duration::from_secs(5));
    }

    let (status, body) = daemon.http("GET", &format!("{api}/v1/healthcheck"), &[]);
    assert_eq!(status, 200, "{body}");
    let json: serde_json::Value = serde_json::from_str(&body).unwrap();
    let tcp6 = &json["services"][0];
    assert_eq!(tcp6["name"], "tcp6");
    assert_eq!(tcp6["vip"], "[2001:db8:100::1]:80");
    assert_eq!(tcp6["backends"][0]["address"], addr(0));
    assert_eq!(tcp6["backends"][0]["ip"], sb.backends[0].addr6.to_string());

    let text = String::from_utf8_lossy(&daemon.lb(&["status"]).stdout).into_owned();
    assert!(
        text.contains("[2001:db8:100::1]:80") && text.contains(&addr(1)),
        "{text}"
    );
    let (_, page) = daemon.http(
        "GET",
        &format!("{api}/v1/healthcheck"),
        &["Accept: text/html"],
    );
    assert!(page.contains(&addr(2)), "{page}");
    let (_, metrics) = daemon.http("GET", &format!("{api}/metrics"), &[]);
    assert!(
        metrics.contains(&format!("service=\"tcp6\",backend=\"{}\"", addr(0))),
        "{metrics}"
    );

    // The CLI encodes the address itself.
    let out = daemon.lb(&["backend", "drain", "tcp6", &addr(0)]);
    assert_eq!(code(&out), 0, "{}", String::from_utf8_lossy(&out.stderr));
    daemon.wait_state("tcp6", &addr(0), "drained", Duration::from_secs(1));
    // Raw brackets (curl -g), percent-encoded, and a longer spelling of the same address.
    let raw = format!("{api}/v1/services/tcp6/backends/{}/drain", addr(1));
    let out = sb
        .lb
        .command("curl")
        .args([
            "-s",
            "-g",
            "-m",
            "10",
            "-X",
            "POST",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
        ])
        .arg(&raw)
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "200", "{raw}");
    daemon.wait_state("tcp6", &addr(1), "drained", Duration::from_secs(1));
    let encoded = addr(2).replace('[', "%5B").replace(']', "%5D");
    let (status, body) = daemon.http(
        "POST",
        &format!("{api}/v1/services/tcp6/backends/{encoded}/disable"),
        &[],
    );
    assert_eq!(status, 200, "{body}");
    let long = format!("[2001:0db8:0002:0000::{:x}]:8080", 0x12);
    assert_eq!(addr(2), "[2001:db8:2::12]:8080");
    let (status, body) = daemon.http(
        "POST",
        &format!(
            "{api}/v1/services/tcp6/backends/{}/enable",
            long.replace('[', "%5B").replace(']', "%5D")
        ),
        &[],
    );
    assert_eq!(status, 200, "{body}");
    let reply: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(reply["backend"], addr(2), "answered in canonical form");
    // An IPv4 address is no backend of the IPv6 service.
    let (status, _) = daemon.http(
        "POST",
        &format!(
            "{api}/v1/services/tcp6/backends/{}:8080/drain",
            sb.backends[0].addr
        ),
        &[],
    );
    assert_eq!(status, 404);
    // Only backend-2 takes new IPv6 flows now; the IPv4 service is untouched.
    let seen = servers::spread(
        &sb.client.ns,
        SocketAddr::from((lb_tests::topology::VIP6, 80)),
        60,
    );
    assert_eq!(seen.keys().collect::<Vec<_>>(), ["backend-2"], "{seen:?}");
    let seen = servers::spread(&sb.client.ns, vip(), 60);
    assert_eq!(seen.len(), 3, "{seen:?}");
}

/// The default pin directory of `lb run` in `ns` (the host's default plus `-netns-INODE`).
fn default_pin(ns: &lb_tests::netns::Netns) -> PinGuard {
    let netns = lb::netns::NetNs::of(&std::path::Path::new("/run/netns").join(ns.name())).unwrap();
    let path = lb::netns::pin_path_for(lb::config::DEFAULT_PIN_PATH, &netns);
    PinGuard(path.to_string_lossy().into_owned())
}

/// Two daemons in two network namespaces of one host, both with the default pin path: each
/// pins its datapath in a directory of its own and forwards. A datapath left pinned by one
/// (stopped with SIGTERM) is neither adopted nor removed from the other namespace, even when
/// named explicitly: the refusal names the namespace it belongs to.
#[test]
fn daemons_in_two_namespaces_keep_their_own_pinned_datapaths() {
    require_root();
    let sbs = [
        Sandbox::build(Arms::Two, 1, 8080).unwrap(),
        Sandbox::build(Arms::Two, 1, 8080).unwrap(),
    ];
    let pins = [default_pin(&sbs[0].lb), default_pin(&sbs[1].lb)];
    assert_ne!(pins[0].0, pins[1].0);
    let mut daemons: Vec<Daemon> = sbs
        .iter()
        .map(|sb| Daemon::start_pinned(&sb.lb, &config(sb, &[], "")).unwrap())
        .collect();
    for (sb, pin) in sbs.iter().zip(&pins) {
        assert!(
            std::path::Path::new(&pin.0)
                .join("link-".to_owned() + &sb.lb_ports[0].ifname)
                .exists(),
            "{}",
            pin.0
        );
        let (mut stream, name) = connect(&sb.client.ns, vip()).unwrap();
        assert_eq!(name, "backend-0");
        echo(&mut stream, "through lb").unwrap();
    }

    // The first daemon goes with SIGTERM: its datapath stays pinned and forwarding.
    daemons[0].stop(libc::SIGTERM);
    let attached = |sb: &Sandbox| {
        sb.lb_ports
            .iter()
            .all(|p| sb.lb.xdp_attached(&p.ifname).unwrap())
    };
    assert!(attached(&sbs[0]));
    // From the second namespace: `lb stop --pin-path <the first's>` with no daemon answering
    // there (the second daemon stopped first) is refused, naming the first namespace.
    let out = daemons[1].lb(&["stop"]);
    assert_eq!(code(&out), 0, "{}", String::from_utf8_lossy(&out.stderr));
    while daemons[1].process.running() {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(!std::path::Path::new(&pins[1].0).exists());
    // nsenter, not `ip netns exec`: the pins are only in sight from the host's mount namespace.
    let out = std::process::Command::new("nsenter")
        .arg(format!("--net=/run/netns/{}", sbs[1].lb.name()))
        .arg(lb_bin())
        .args(["stop", "--pin-path", &pins[0].0])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_ne!(code(&out), 0, "{err}");
    assert!(
        err.contains(sbs[0].lb.name()) && err.contains("never adopts, replaces or removes"),
        "{err}"
    );
    // Nor does a daemon there adopt it.
    let foreign = config(&sbs[1], &[], &format!("pin_path = \"{}\"\n", pins[0].0));
    let refused = Daemon::start_pinned(&sbs[1].lb, &foreign);
    let err = format!(
        "{:#}",
        refused
            .err()
            .expect("a daemon adopted another namespace's datapath")
    );
    assert!(err.contains(sbs[0].lb.name()), "{err}");
    // The first namespace's datapath is untouched and forwards.
    assert!(attached(&sbs[0]));
    let (mut stream, name) = connect(&sbs[0].client.ns, vip()).unwrap();
    assert_eq!(name, "backend-0");
    echo(&mut stream, "still through lb").unwrap();
    drop(daemons);
}
