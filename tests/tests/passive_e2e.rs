//! Passive checks end to end (SPEC §3): real client connections through `lb` fail, the datapath
//! reports it, the daemon ejects the backend (service and host scope), and it returns after the
//! ejection time or early when probes pass; still broken, traffic trips it again.

use std::{
    io::ErrorKind,
    net::{SocketAddr, TcpStream},
    time::{Duration, Instant},
};

use lb::model::Events;
use lb_tests::{
    daemon::Daemon,
    require_root,
    topology::{Arms, Sandbox, VIP},
};

/// A config with TCP services on VIP ports `ports`, all over the sandbox's backends, each with
/// `check` and `passive` tables.
fn config(sb: &Sandbox, ports: &[u16], check: &str, passive: &str) -> String {
    let backends: Vec<String> = sb
        .backends
        .iter()
        .map(|b| format!("{{ address = \"{}:{}\" }}", b.addr, sb.service_port))
        .collect();
    let mut out = format!(
        "[lb]\ninterfaces = [{}]\nxdp_mode = \"native\"\n",
        sb.interfaces_toml()
    );
    for port in ports {
        out.push_str(&format!(
            "\n[[service]]\nname = \"web{port}\"\nvip = \"{VIP}:{port}\"\nbackends = [{}]\n[service.check]\n{check}\n[service.passive]\n{passive}\n",
            backends.join(", ")
        ));
    }
    out
}

/// A sandbox with `backends` backends and `lb run` on [`config`].
fn start(backends: usize, ports: &[u16], check: &str, passive: &str) -> (Sandbox, Daemon) {
    require_root();
    let sb = Sandbox::build(Arms::Two, backends, 8080).unwrap();
    let daemon = Daemon::start(&sb.lb, &config(&sb, ports, check, passive)).unwrap();
    (sb, daemon)
}

enum Outcome {
    Connected,
    Refused,
    TimedOut,
}

fn attempt(sb: &Sandbox, port: u16, timeout: Duration) -> Outcome {
    let to = SocketAddr::from((VIP, port));
    match sb
        .client
        .ns
        .enter(|| TcpStream::connect_timeout(&to, timeout))
    {
        Ok(_) => Outcome::Connected,
        Err(e) if e.kind() == ErrorKind::ConnectionRefused => Outcome::Refused,
        Err(e) if e.kind() == ErrorKind::TimedOut => Outcome::TimedOut,
        Err(e) => panic!("connect to {to}: {e}"),
    }
}

fn ejected(daemon: &Daemon, service: &str, backend: &str) -> Option<String> {
    let status = daemon.status().ok()?;
    status.service(service)?.backend(backend)?.ejected.clone()
}

fn events(daemon: &Daemon) -> Events {
    serde_json::from_slice(&daemon.lb(&["events", "--json"]).stdout).unwrap()
}

/// Connects until `backend` of `service` is ejected; returns the refused connections.
fn refuse_until_ejected(sb: &Sandbox, daemon: &Daemon, port: u16, backend: &str) -> u32 {
    let service = format!("web{port}");
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut refused = 0;
    loop {
        if let Outcome::Refused = attempt(sb, port, Duration::from_secs(2)) {
            refused += 1;
        }
        if ejected(daemon, &service, backend).is_some() {
            return refused;
        }
        assert!(
            Instant::now() < deadline,
            "{backend} not ejected after {refused} refused connections:\n{}",
            daemon.log_text()
        );
    }
}

#[test]
fn refused_connections_eject_and_a_broken_backend_is_ejected_again() {
    let _one = lb_tests::timing_sensitive();
    let (mut sb, daemon) = start(
        3,
        &[80],
        "kind = \"none\"",
        "failures = 5\nwindow = \"10s\"\nejection = \"2s\"",
    );
    let dead = format!("{}:8080", sb.backends[1].addr);
    sb.stop_backend(1); // its port answers SYNs with RST

    let refused = refuse_until_ejected(&sb, &daemon, 80, &dead);
    assert!(
        (5..=12).contains(&refused),
        "ejected after {refused} refused connections (rule: 5)"
    );
    let why = ejected(&daemon, "web80", &dead).unwrap();
    assert_eq!(why, "service: refused");
    // Ejected: every new connection lands on a live backend.
    for i in 0..60 {
        assert!(
            matches!(attempt(&sb, 80, Duration::from_secs(2)), Outcome::Connected),
            "connection {i} failed while {dead} is ejected"
        );
    }
    // The ejection ends after 2 s; still broken, traffic trips it again.
    let deadline = Instant::now() + Duration::from_secs(5);
    while ejected(&daemon, "web80", &dead).is_some() {
        assert!(Instant::now() < deadline, "ejection did not end");
        std::thread::sleep(Duration::from_millis(50));
    }
    refuse_until_ejected(&sb, &daemon, 80, &dead);
    let e = events(&daemon);
    let ejections = e
        .events
        .iter()
        .filter(|e| e.backend == dead && e.to == "ejected" && e.source.contains("service ejected"))
        .count();
    let returns = e
        .events
        .iter()
        .filter(|e| e.backend == dead && e.source.contains("returned (timeout)"))
        .count();
    assert_eq!(ejections, 2, "{e:#?}");
    assert!(returns >= 1, "{e:#?}");
    assert!(
        e.events.iter().any(|e| e.backend == dead
            && e.source.contains("5 × refused")
            && e.flag_write_us.is_some()),
        "{e:#?}"
    );
    let out = daemon.lb(&["stats", "--json"]);
    let stats: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let counter = |name: &str| {
        stats["counters"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == name)
            .map(|c| c["value"].as_u64().unwrap())
            .unwrap()
    };
    assert!(counter("signal_sent") >= 10);
    assert_eq!(counter("signal_lost"), 0);
}

#[test]
fn a_silent_backend_is_ejected_through_syn_retransmits() {
    let _one = lb_tests::timing_sensitive();
    let (sb, daemon) = start(
        3,
        &[80],
        "kind = \"none\"",
        "failures = 3\nwindow = \"30s\"\nejection = \"30s\"",
    );
    let silent = format!("{}:8080", sb.backends[2].addr);
    sb.backends[2].ns.drop_all_input().unwrap();
    // Concurrent connects: those hashed to the silent backend retransmit their SYN after ~1 s.
    let started = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..30 {
            s.spawn(|| attempt(&sb, 80, Duration::from_millis(1500)));
        }
    });
    let deadline = Instant::now() + Duration::from_secs(5);
    let why = loop {
        if let Some(why) = ejected(&daemon, "web80", &silent) {
            break why;
        }
        assert!(
            Instant::now() < deadline,
            "silent backend not ejected:\n{}",
            daemon.log_text()
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    eprintln!("ejected {:?} after the first SYNs", started.elapsed());
    assert_eq!(why, "service: connect_timeout");
    for i in 0..30 {
        assert!(
            matches!(attempt(&sb, 80, Duration::from_secs(2)), Outcome::Connected),
            "connection {i} failed while {silent} is ejected"
        );
    }
}

#[test]
fn passing_probes_end_the_host_ejection_early_and_the_service_one_by_time() {
    let _one = lb_tests::timing_sensitive();
    require_root();
    let sb = Sandbox::build(Arms::Two, 3, 8080).unwrap();
    // Backend 0 refuses balanced connections (their source is lb's SNAT port range) but accepts
    // the half-open probes (ephemeral source ports): probes pass while real traffic fails.
    let b = &sb.backends[0];
    b.ns.input_chain("accept").unwrap();
    b.ns.nft(&[
        "add",
        "rule",
        "inet",
        "lbt",
        "in",
        "tcp",
        "dport",
        "8080",
        "tcp",
        "sport",
        "20000-32767",
        "reject",
        "with",
        "tcp",
        "reset",
    ])
    .unwrap();
    let daemon = Daemon::start(
        &sb.lb,
        &config(
            &sb,
            &[80, 81],
            "timeout = \"200ms\"\ninterval = \"300ms\"\nhealthy_threshold = 2\nunhealthy_threshold = 2",
            "failures = 4\nwindow = \"30s\"\nejection = \"8s\"",
        ),
    )
    .unwrap();
    let broken = format!("{}:8080", b.addr);
    daemon.wait_state("web80", &broken, "healthy", Duration::from_secs(5));
    refuse_until_ejected(&sb, &daemon, 80, &broken);
    let ejected_at = Instant::now();
    // The host scope covers the other service on the same host.
    let other = ejected(&daemon, "web81", &broken);
    assert!(
        other.as_deref().is_some_and(|w| w.starts_with("host: ")),
        "web81 {broken}: {other:?}"
    );
    assert_eq!(
        daemon
            .status()
            .unwrap()
            .service("web81")
            .unwrap()
            .available_backends,
        2
    );
    // Probes keep passing: 2 in a row end the host's 8 s ejection within about a second; the
    // service scope's (web80, whose own connections failed) is not theirs to end (seed 000).
    let deadline = Instant::now() + Duration::from_secs(5);
    while ejected(&daemon, "web81", &broken).is_some() {
        assert!(
            Instant::now() < deadline,
            "probes did not end the host ejection:\n{:#?}",
            events(&daemon)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let returned_after = ejected_at.elapsed();
    eprintln!("host scope returned {returned_after:?} after the ejection (ejection time 8 s)");
    let web80 = ejected(&daemon, "web80", &broken);
    assert!(
        returned_after < Duration::from_secs(6)
            && web80.as_deref().is_some_and(|w| w.starts_with("service: ")),
        "web80 {broken} after {returned_after:?}: {web80:?}"
    );
    // Its time up, the service scope returns by itself.
    let deadline = Instant::now() + Duration::from_secs(15);
    while ejected(&daemon, "web80", &broken).is_some() {
        assert!(Instant::now() < deadline, "{:#?}", events(&daemon));
        std::thread::sleep(Duration::from_millis(50));
    }
    let e = events(&daemon);
    let returned = |how: &str| {
        e.events
            .iter()
            .filter(|e| e.backend == broken && e.source.contains(how))
            .map(|e| e.source.clone())
            .collect::<Vec<_>>()
    };
    assert!(!returned("host returned (probes)").is_empty(), "{e:#?}");
    assert!(returned("service returned (probes)").is_empty(), "{e:#?}");
    assert!(!returned("service returned (timeout)").is_empty(), "{e:#?}");
    // Real traffic still fails: ejected again.
    refuse_until_ejected(&sb, &daemon, 81, &broken);
}

#[test]
fn traffic_triggered_probing_starts_with_traffic_and_pauses_when_idle() {
    let _one = lb_tests::timing_sensitive();
    let (mut sb, daemon) = start(
        1,
        &[80],
        "timeout = \"200ms\"\ninterval = \"300ms\"\nhealthy_threshold = 2\nunhealthy_threshold = 2",
        "traffic_triggered = true\ntraffic_idle = \"2s\"",
    );
    let backend = format!("{}:8080", sb.backends[0].addr);
    // No traffic yet: not probed (five intervals without a verdict).
    daemon.holds_for(
        Duration::from_millis(1500),
        "not probed before traffic",
        |s| {
            s.service("web80")
                .and_then(|w| w.backend(&backend))
                .is_some_and(|b| b.state == "initializing")
        },
    );
    // The first flow starts the probes.
    assert!(matches!(
        attempt(&sb, 80, Duration::from_secs(2)),
        Outcome::Connected
    ));
    daemon.wait_state("web80", &backend, "healthy", Duration::from_secs(4));
    // Idle for longer than traffic_idle: probes pause, so a dead backend goes unnoticed...
    // (traffic_idle is 2 s; the probes pause within a second of it.)
    std::thread::sleep(Duration::from_secs(4));
    sb.stop_backend(0);
    daemon.holds_for(Duration::from_millis(1500), "probed although idle", |s| {
        s.service("web80")
            .and_then(|w| w.backend(&backend))
            .is_some_and(|b| b.state == "healthy")
    });
    // ...until traffic comes back (this connection is refused: the backend is dead).
    assert!(matches!(
        attempt(&sb, 80, Duration::from_secs(2)),
        Outcome::Refused
    ));
    daemon.wait_state("web80", &backend, "unhealthy", Duration::from_secs(4));
}

/// "No data back" (issue 13, seed 000): a backend that accepts connections and then never
/// answers is ejected by real traffic in the service that checks for it, and only there (the
/// signal counts in the service scope, not the host's: another service on the host is untouched).
#[test]
fn connections_without_data_back_eject_in_the_service_scope_only() {
    let _one = lb_tests::timing_sensitive();
    require_root();
    let mut sb = Sandbox::build(Arms::Two, 2, 8080).unwrap();
    let backends: Vec<String> = sb
        .backends
        .iter()
        .map(|b| format!("{{ address = \"{}:8080\" }}", b.addr))
        .collect();
    let service = |name: &str, port: u16, passive: &str| {
        format!(
            "\n[[service]]\nname = \"{name}\"\nvip = \"{VIP}:{port}\"\nbackends = [{}]\n\
             [service.check]\nkind = \"none\"\n[service.passive]\n{passive}\n",
            backends.join(", ")
        )
    };
    let config = format!(
        "[lb]\ninterfaces = [{}]\nxdp_mode = \"native\"\n{}{}",
        sb.interfaces_toml(),
        service(
            "quiet",
            80,
            "failures = 2\nwindow = \"30s\"\nejection = \"60s\"\nno_data_timeout = \"300ms\""
        ),
        service(
            "other",
            81,
            "failures = 2\nwindow = \"30s\"\nejection = \"60s\""
        )
    );
    let daemon = Daemon::start(&sb.lb, &config).unwrap();
    // backend-1 hangs after accept.
    sb.stop_backend(1);
    let hung = sb.backends[1].addr;
    let _silent =
        lb_tests::servers::start_silent(&sb.backends[1].ns, SocketAddr::from((hung, 8080)))
            .unwrap();
    let hung = format!("{hung}:8080");
    let to = SocketAddr::from((VIP, 80));
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut unanswered = 0;
    while ejected(&daemon, "quiet", &hung).is_none() {
        assert!(
            Instant::now() < deadline,
            "not ejected:\n{}",
            daemon.log_text()
        );
        let mut conn = sb
            .client
            .ns
            .enter(|| TcpStream::connect_timeout(&to, Duration::from_secs(2)))
            .unwrap();
        conn.set_read_timeout(Some(Duration::from_millis(400)))
            .unwrap();
        std::io::Write::write_all(&mut conn, b"hello\n").unwrap();
        let mut buf = [0u8; 64];
        if matches!(std::io::Read::read(&mut conn, &mut buf), Ok(n) if n > 0) {
            continue; // backend-0 greets
        }
        // Past the timeout: the client's next packet is where lb looks.
        std::io::Write::write_all(&mut conn, b"anyone?\n").unwrap();
        unanswered += 1;
        std::thread::sleep(Duration::from_millis(50));
    }
    let why = ejected(&daemon, "quiet", &hung).unwrap();
    assert_eq!(why, "service: no_data");
    assert!(unanswered >= 2, "{unanswered}");
    // The host scope is not: the other service on the same host keeps the backend.
    assert_eq!(ejected(&daemon, "other", &hung), None);
    let s = daemon.status().unwrap();
    assert!(
        s.service("other")
            .unwrap()
            .backend(&hung)
            .unwrap()
            .available
    );
    assert!(
        !s.service("quiet")
            .unwrap()
            .backend(&hung)
            .unwrap()
            .available
    );
}
