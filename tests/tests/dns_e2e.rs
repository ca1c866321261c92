//! Backends from DNS (SPEC §6), against a real server: Debian's dnsmasq in the balancer's
//! namespace. Records changed under a loop of new connections (new backends take flows within
//! the TTL and an interval, removed ones drain, no connection fails); a record at lb's own VIP
//! left out; SRV ports and weights; a SERVFAIL, a timeout and an empty answer each keeping the
//! last set, the status saying so.

use std::{
    net::SocketAddr,
    time::{Duration, Instant},
};

use lb_tests::{
    daemon::Daemon,
    dns::{Dnsmasq, ServFail},
    netns::Netns,
    require_root,
    servers::{self, connect},
    topology::{Arms, Sandbox, VIP},
    traffic::{ConnectLoop, assert_shares, echo_once},
};

const PORT: u16 = 8080;

fn resolver() -> SocketAddr {
    "127.0.0.1:5353".parse().unwrap()
}

fn vip(port: u16) -> SocketAddr {
    SocketAddr::from((VIP, port))
}

fn hosts(sb: &Sandbox, backends: &[usize]) -> String {
    backends
        .iter()
        .map(|&i| format!("{} web.test\n", sb.backends[i].addr))
        .collect()
}

/// A config with the services in `services` (TOML) on the sandbox's interfaces.
fn config(sb: &Sandbox, services: &str) -> String {
    format!(
        "[lb]\ninterfaces = [{}]\n\n{services}",
        sb.interfaces_toml()
    )
}

const CHECK: &str = "[service.check]\nkind = \"tcp\"\ntimeout = \"200ms\"\ninterval = \"300ms\"\n\
                     healthy_threshold = 1\n";

/// Waits until `seen` holds for the backends `n` new connections reach, failing after `limit`.
fn until_backends(
    ns: &Netns,
    to: SocketAddr,
    what: &str,
    limit: Duration,
    seen: impl Fn(&std::collections::BTreeSet<String>) -> bool,
) -> Duration {
    let start = Instant::now();
    loop {
        let names: std::collections::BTreeSet<String> =
            (0..30).map(|_| connect(ns, to).unwrap().1).collect();
        if seen(&names) {
            return start.elapsed();
        }
        assert!(start.elapsed() < limit, "{what}: {names:?} after {limit:?}");
    }
}

#[test]
fn records_changed_under_load_move_new_flows_and_lose_none() {
    require_root();
    let sb = Sandbox::build(Arms::Two, 3, PORT).unwrap();
    let dns = Dnsmasq::start(&sb.lb, resolver(), &hosts(&sb, &[0, 1]), &[]).unwrap();
    let services = format!(
        "[[service]]\nname = \"web\"\nvip = \"{}\"\n\
         backends_from = {{ dns = \"web.test\", port = {PORT}, resolvers = [\"{}\"], min_ttl = \"500ms\" }}\n{CHECK}",
        vip(80),
        resolver()
    );
    let d = Daemon::start(&sb.lb, &config(&sb, &services)).unwrap();
    let [b0, b1, b2] = [0, 1, 2].map(|i| format!("{}:{PORT}", sb.backends[i].addr));
    for b in [&b0, &b1] {
        d.wait_state("web", b, "healthy", Duration::from_secs(10));
    }
    let s = d.status().unwrap();
    let web = s.service("web").unwrap();
    let disc = web.discovery.as_ref().unwrap();
    assert_eq!(disc.addresses.len(), 2, "{disc:?}");
    assert!(web.backends.iter().all(|b| b.discovered));
    // An established connection to the backend about to go.
    let mut kept = lb_tests::traffic::connect_to(&sb.client.ns, vip(80), "backend-0");

    let load = ConnectLoop::start(&sb.client.ns, vip(80));
    load.wait(20);
    // backend-0 out, backend-2 in, and the VIP itself (a loop) which is left out.
    dns.set_hosts(&format!("{}{VIP} web.test\n", hosts(&sb, &[1, 2])))
        .unwrap();
    let changed = Instant::now();
    d.wait_state("web", &b2, "healthy", Duration::from_secs(10));
    let took = until_backends(
        &sb.client.ns,
        vip(80),
        "backend-2 in, backend-0 out",
        Duration::from_secs(10),
        |n| n.contains("backend-2") && !n.contains("backend-0"),
    );
    eprintln!(
        "records changed: new flows on the new set {:.2} s after (TTL 1 s, min_ttl 500 ms)",
        changed.elapsed().as_secs_f64() - took.as_secs_f64()
    );
    load.wait(50);
    echo_once(&mut kept, b"still there");
    let (made, failures) = load.finish();
    assert!(
        failures.is_empty(),
        "{} of {made} failed: {failures:?}",
        failures.len()
    );
    let s = d.status().unwrap();
    let web = s.service("web").unwrap();
    let disc = web.discovery.as_ref().unwrap();
    assert!(
        web.backend(&b0).is_none() && web.backend(&b2).is_some(),
        "{web:?}"
    );
    assert!(
        disc.rejected
            .iter()
            .any(|r| r.starts_with(&format!("{VIP}:{PORT}")) && r.contains("VIP address")),
        "{disc:?}"
    );
    let events = d.events().unwrap().events;
    assert!(
        events
            .iter()
            .any(|e| e.source == "dns" && e.backend == b2 && e.from == "unused"),
        "{events:#?}"
    );
}

#[test]
fn srv_records_give_ports_and_weights() {
    require_root();
    let sb = Sandbox::build(Arms::Two, 2, PORT).unwrap();
    // The backends serve on 8080 (the sandbox's) and 9090 too.
    let _extra: Vec<_> = sb
        .backends
        .iter()
        .map(|b| {
            servers::start(
                &b.ns,
                SocketAddr::new(b.addr.into(), 9090),
                &format!("{}-9090", b.name),
            )
            .unwrap()
        })
        .collect();
    let hosts = format!(
        "{} b0.test\n{} b1.test\n",
        sb.backends[0].addr, sb.backends[1].addr
    );
    let mut dns = Dnsmasq::start(
        &sb.lb,
        resolver(),
        &hosts,
        &[
            "_web._tcp.web.test,b0.test,8080,10,1",
            "_web._tcp.web.test,b1.test,8080,10,3",
            "_web._tcp.web.test,b0.test,9090,20,1",
        ],
    )
    .unwrap();
    let services = format!(
        "[[service]]\nname = \"web\"\nvip = \"{}\"\n\
         backends_from = {{ dns = \"_web._tcp.web.test\", type = \"SRV\", resolvers = [\"{}\"], min_ttl = \"500ms\" }}\n{CHECK}",
        vip(80),
        resolver()
    );
    let d = Daemon::start(&sb.lb, &config(&sb, &services)).unwrap();
    let [b0, b1] = [0, 1].map(|i| format!("{}:{PORT}", sb.backends[i].addr));
    for b in [&b0, &b1] {
        d.wait_state("web", b, "healthy", Duration::from_secs(10));
    }
    // Priority 10's two records only (priority 20 is a fallback), weighted 1:3.
    let s = d.status().unwrap();
    let web = s.service("web").unwrap();
    assert_eq!(web.backends.len(), 2, "{web:?}");
    assert_eq!(
        (
            web.backend(&b0).unwrap().weight,
            web.backend(&b1).unwrap().weight
        ),
        (1, 3)
    );
    let n = 400;
    let seen = servers::spread(&sb.client.ns, vip(80), n);
    assert_shares(&seen, n, &[("backend-0", 0.25), ("backend-1", 0.75)]);

    // New records: both on port 9090, equal weights.
    dns.set_srv(&[
        "_web._tcp.web.test,b0.test,9090,10,5",
        "_web._tcp.web.test,b1.test,9090,10,5",
    ])
    .unwrap();
    until_backends(
        &sb.client.ns,
        vip(80),
        "port 9090",
        Duration::from_secs(10),
        |n| n.iter().all(|b| b.ends_with("-9090")) && n.len() == 2,
    );
}

#[test]
fn failures_and_empty_answers_keep_the_last_set() {
    require_root();
    let sb = Sandbox::build(Arms::Two, 2, PORT).unwrap();
    let mut dns = Dnsmasq::start(&sb.lb, resolver(), &hosts(&sb, &[0, 1]), &[]).unwrap();
    let spec = |extra: &str| {
        format!(
            "{{ dns = \"web.test\", port = {PORT}, resolvers = [\"{}\"], min_ttl = \"300ms\", timeout = \"300ms\"{extra} }}",
            resolver()
        )
    };
    let services = format!(
        "[[service]]\nname = \"keep\"\nvip = \"{}\"\nbackends_from = {}\n{CHECK}\n\
         [[service]]\nname = \"apply\"\nvip = \"{}\"\nbackends_from = {}\n{CHECK}",
        vip(80),
        spec(""),
        vip(81),
        spec(", on_empty = \"apply\"")
    );
    let d = Daemon::start(&sb.lb, &config(&sb, &services)).unwrap();
    let [b0, b1] = [0, 1].map(|i| format!("{}:{PORT}", sb.backends[i].addr));
    for b in [&b0, &b1] {
        d.wait_state("keep", b, "healthy", Duration::from_secs(10));
    }
    let status_of = |service: &str| {
        let s = d.status().unwrap();
        s.service(service).unwrap().clone()
    };
    // Waits until `service`'s last attempt failed (or came back empty) with `what`.
    let wait_error = |service: &str, what: &str| {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let s = status_of(service);
            let disc = s.discovery.clone().unwrap();
            if disc.error.as_deref().is_some_and(|e| e.contains(what)) {
                assert!(disc.stale);
                return s;
            }
            assert!(
                Instant::now() < deadline,
                "{service}: no {what:?} error: {disc:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    let serves = |service: &str, port: u16| {
        let s = status_of(service);
        assert_eq!(s.backends.len(), 2, "{s:?}");
        assert!(connect(&sb.client.ns, vip(port)).is_ok());
    };

    // A timeout: dnsmasq frozen.
    dns.freeze();
    wait_error("keep", "timed out");
    serves("keep", 80);
    dns.thaw();
    // A SERVFAIL: another server on its port.
    dns.stop();
    let servfail = ServFail::start(&sb.lb, resolver()).unwrap();
    wait_error("keep", "resolving web.test");
    let s = wait_error("apply", "resolving web.test");
    assert_eq!(
        s.backends.len(),
        2,
        "a failure keeps the set, whatever on_empty says"
    );
    serves("keep", 80);
    drop(servfail);
    // Back, then an empty answer: the name gone (NXDOMAIN).
    let dns = Dnsmasq::start(&sb.lb, resolver(), &hosts(&sb, &[0, 1]), &[]).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while status_of("keep").discovery.unwrap().stale {
        assert!(Instant::now() < deadline, "no answer again");
        std::thread::sleep(Duration::from_millis(50));
    }
    dns.set_hosts("").unwrap();
    wait_error("keep", "no address for web.test");
    serves("keep", 80);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !status_of("apply").backends.is_empty() {
        assert!(
            Instant::now() < deadline,
            "on_empty = \"apply\" emptied nothing"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let events = d.events().unwrap().events;
    assert!(
        events
            .iter()
            .any(|e| e.source.starts_with("dns web.test (keep)")
                && e.reason
                    .as_deref()
                    .is_some_and(|r| r.contains("2 addresses kept"))),
        "{events:#?}"
    );
    let (_, metrics) = d.http("GET", &format!("http://{}/metrics", d.api), &[]);
    assert!(
        metrics.contains("lb_dns_stale{service=\"keep\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("lb_dns_addresses{service=\"apply\"} 0"),
        "{metrics}"
    );
}
