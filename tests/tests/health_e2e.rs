//! `lb run` with active checks on real backends: a backend whose service dies is marked unhealthy
//! within the failure window and gets no new flows; when it comes back it is healthy again within
//! the success window and flows return. Flags are written within a millisecond of each verdict.

use std::{
    collections::HashMap,
    net::SocketAddr,
    time::{Duration, Instant},
};

use lb_tests::{
    daemon::Daemon,
    require_root,
    servers::connect,
    topology::{Arms, Sandbox, VIP},
};

const TIMEOUT: Duration = Duration::from_millis(200);
const INTERVAL: Duration = Duration::from_millis(300);
const THRESHOLD: u32 = 2;

fn state(daemon: &Daemon, backend: &str) -> String {
    let stats = daemon.stats().unwrap();
    let tcp = stats.services.iter().find(|s| s.name == "tcp").unwrap();
    tcp.backends
        .iter()
        .find(|b| b.address.starts_with(backend))
        .unwrap()
        .state
        .clone()
}

fn wait_for(daemon: &Daemon, backend: &str, want: &str, limit: Duration) -> Duration {
    let start = Instant::now();
    loop {
        if state(daemon, backend) == want {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < limit,
            "{backend} not {want} after {limit:?}:\n{}",
            daemon.log_text()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn spread(sb: &Sandbox, n: usize) -> HashMap<String, usize> {
    let mut seen = HashMap::new();
    for _ in 0..n {
        let (_, name) = connect(&sb.client.ns, SocketAddr::from((VIP, 80))).unwrap();
        *seen.entry(name).or_default() += 1;
    }
    seen
}

#[test]
fn a_dead_backend_is_ejected_within_the_failure_window_and_returns() {
    require_root();
    let mut sb = Sandbox::build(Arms::Two, 3, 8080).unwrap();
    let check = format!(
        "[service.check]\nkind = \"tcp-connect\"\ntimeout = \"{}ms\"\ninterval = \"{}ms\"\nhealthy_threshold = {THRESHOLD}\nunhealthy_threshold = {THRESHOLD}\n",
        TIMEOUT.as_millis(),
        INTERVAL.as_millis()
    );
    let config = sb.config(80, &[], "");
    // The check goes with the TCP service (the first [[service]]).
    let config = config.replacen(
        "\n[[service]]\nname = \"udp\"",
        &format!("\n{check}\n[[service]]\nname = \"udp\""),
        1,
    );
    let daemon = Daemon::start(&sb.lb, &config).unwrap();
    let dead = sb.backends[1].addr.to_string();
    for b in &sb.backends {
        wait_for(
            &daemon,
            &b.addr.to_string(),
            "healthy",
            Duration::from_secs(5),
        );
    }

    // Failure window: timeout × threshold + interval × (threshold − 1), plus up to one interval
    // of phase (the backend dies between probes), 10% and 100 ms of scheduling slack.
    let failure_window = TIMEOUT * THRESHOLD + INTERVAL * (THRESHOLD - 1);
    let bound = (failure_window + INTERVAL).mul_f64(1.1) + Duration::from_millis(100);
    sb.stop_backend(1);
    let took = wait_for(&daemon, &dead, "unhealthy", bound);
    eprintln!("detected in {took:?} (bound {bound:?})");
    let seen = spread(&sb, 150);
    assert!(
        !seen.contains_key("backend-1"),
        "new flows reached the dead backend: {seen:?}"
    );

    // Success window with near-zero response time: interval × (threshold − 1), plus phase.
    sb.start_backend(1).unwrap();
    let bound =
        (INTERVAL * (THRESHOLD - 1) + INTERVAL + TIMEOUT).mul_f64(1.1) + Duration::from_millis(100);
    let took = wait_for(&daemon, &dead, "healthy", bound);
    eprintln!("recovered in {took:?} (bound {bound:?})");
    let seen = spread(&sb, 150);
    assert!(
        seen.get("backend-1").copied().unwrap_or(0) > 10,
        "flows did not return: {seen:?}"
    );

    // Every verdict's flag was in the datapath within a millisecond.
    let log = daemon.log_text();
    let events: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("health state changed"))
        .collect();
    // 3 × initializing → healthy, then down and up again for backend-1 (with mostly_* steps).
    assert!(events.len() >= 5, "transitions logged: {log}");
    let field = |line: &str, name: &str| -> Option<u64> {
        line.split(name)
            .nth(1)?
            .split_whitespace()
            .next()?
            .parse()
            .ok()
    };
    let flags: Vec<u64> = events
        .iter()
        .filter_map(|l| field(l, "flag_write_us="))
        .collect();
    eprintln!("flag write times (µs) of the availability flips: {flags:?}");
    assert_eq!(flags.len(), 2, "one write per flip: {log}");
    assert!(
        flags.iter().all(|&us| us <= 1000),
        "flag write times (µs): {flags:?}"
    );
}
