//! Health checks through the tunnel end to end: a one-arm sandbox whose backends run the real
//! `lb decap` and hold the VIPs on `lo`, a real `lb run` with direct-server-return services
//! whose checks (`tcp` half-open, `tcp-connect`, `http`, both families; `https` over IPv4) go
//! through the tunnel, and beside them full-NAT services with plain checks of the same kinds on
//! the backends' own addresses. All healthy; then one backend loses its VIPs (or its
//! decapsulator): its checks through the tunnel find it unhealthy while the plain ones still
//! say healthy; restored, it is healthy again. A reload moves checks out of the tunnel and back.
//! Half-open probes through the tunnel leave no half-open connection on the backends (lb resets
//! the SYN+ACK through the tunnel: the kernel's own reset would go to the backend's address,
//! unencapsulated).

use std::{net::IpAddr, time::Duration};

use lb_common::counter;
use lb_tests::{
    daemon::Daemon,
    decap::DecapGuard,
    netns::{Netns, add_address},
    require_root,
    servers::{self, Servers},
    topology::{Arms, HTTP_PORT, HTTPS_PORT, Sandbox, VIP, VIP6},
};

/// The echo servers' port on the VIPs and the backends' own addresses.
const PORT: u16 = 8080;
/// A second VIP of each family, for the full-NAT services with plain checks.
const NAT_VIP: &str = "10.100.0.2";
const NAT_VIP6: &str = "2001:db8:100::2";
/// Fast checks: a dead path is out within about a second.
const TIMING: &str =
    "timeout = \"200ms\"\ninterval = \"300ms\"\nunhealthy_threshold = 2\nhealthy_threshold = 2\n";
const LIMIT: Duration = Duration::from_secs(20);

/// Two backends holding both VIPs (TCP echo on `PORT`, HTTP on `HTTP_PORT`, HTTPS on the IPv4
/// VIP's `HTTPS_PORT`) behind `lb decap`.
fn sandbox() -> (Sandbox, Vec<DecapGuard>, Vec<Servers>) {
    require_root();
    let mut sb = Sandbox::build(Arms::One, 2, PORT).unwrap();
    sb.serve_vip(VIP.into(), Some(HTTP_PORT)).unwrap();
    sb.serve_vip(VIP6.into(), Some(HTTP_PORT)).unwrap();
    let https = sb
        .backends
        .iter()
        .map(|b| {
            let at = std::net::SocketAddr::new(VIP.into(), HTTPS_PORT);
            servers::start_https(&b.ns, at, &b.name).unwrap()
        })
        .collect();
    let decaps = sb
        .backends
        .iter()
        .map(|b| DecapGuard::start(&b.ns, &[&b.ifname], &[]).unwrap())
        .collect();
    (sb, decaps, https)
}

/// `[a]:p` for IPv6 addresses, `a:p` for IPv4.
fn at(ip: IpAddr, port: u16) -> String {
    std::net::SocketAddr::new(ip, port).to_string()
}

/// The backends' addresses of one family.
fn addrs(sb: &Sandbox, v6: bool) -> Vec<IpAddr> {
    sb.backends
        .iter()
        .map(|b| if v6 { b.addr6.into() } else { b.addr.into() })
        .collect()
}

/// A service `name` on `vip:port` over the backends (of the VIP's family) on `port`, with
/// `forwarding` and the check `check`.
fn service(
    sb: &Sandbox,
    name: &str,
    vip: IpAddr,
    port: u16,
    forwarding: &str,
    check: &str,
) -> String {
    let backends: Vec<String> = addrs(sb, vip.is_ipv6())
        .into_iter()
        .map(|a| format!("{{ address = \"{}\" }}", at(a, port)))
        .collect();
    format!(
        "[[service]]\nname = \"{name}\"\nvip = \"{}\"\nforwarding = \"{forwarding}\"\n\
         backends = [{}]\n[service.check]\n{check}{TIMING}\n",
        at(vip, port),
        backends.join(", ")
    )
}

/// The services of `mode` (`ipip` or `gue`): per family, `tcp` (through the tunnel if
/// `tcp_through`), `conn` (tcp-connect to the echo port) and `http` checked through the tunnel,
/// and `plain` and `plain-http` (full NAT) checked on the backends' own addresses; `https4`
/// through the tunnel too.
fn config(sb: &Sandbox, mode: &str, tcp_through: bool) -> String {
    let mut text = format!(
        "[lb]\ninterfaces = [{}]\nxdp_mode = \"native\"\n\n",
        sb.interfaces_toml()
    );
    for (suffix, vip, nat_vip) in [
        ("4", IpAddr::from(VIP), NAT_VIP.parse::<IpAddr>().unwrap()),
        ("6", IpAddr::from(VIP6), NAT_VIP6.parse().unwrap()),
    ] {
        let through = "through_tunnel = true\n";
        text += &service(
            sb,
            &format!("tcp{suffix}"),
            vip,
            PORT,
            mode,
            &format!("kind = \"tcp\"\nthrough_tunnel = {tcp_through}\n"),
        );
        // Its own port is served by nobody: the check probes the echo port.
        text += &service(
            sb,
            &format!("conn{suffix}"),
            vip,
            9000,
            mode,
            &format!("kind = \"tcp-connect\"\nport = {PORT}\n{through}"),
        );
        text += &service(
            sb,
            &format!("http{suffix}"),
            vip,
            HTTP_PORT,
            mode,
            &format!("kind = \"http\"\n{through}"),
        );
        text += &service(
            sb,
            &format!("plain{suffix}"),
            nat_vip,
            PORT,
            "nat",
            "kind = \"tcp\"\n",
        );
        text += &service(
            sb,
            &format!("plain-http{suffix}"),
            nat_vip,
            HTTP_PORT,
            "nat",
            "kind = \"http\"\n",
        );
    }
    text += &service(
        sb,
        "https4",
        VIP.into(),
        HTTPS_PORT,
        mode,
        "kind = \"https\"\nverify_tls = false\nthrough_tunnel = true\n",
    );
    text
}

/// Every (service, backend) of `config` and the port its backends are at.
fn all(sb: &Sandbox) -> Vec<(String, String)> {
    let mut out = https(sb, 0);
    out.extend(https(sb, 1));
    for (suffix, v6) in [("4", false), ("6", true)] {
        for (name, port) in [
            ("tcp", PORT),
            ("conn", 9000),
            ("http", HTTP_PORT),
            ("plain", PORT),
            ("plain-http", HTTP_PORT),
        ] {
            for a in addrs(sb, v6) {
                out.push((format!("{name}{suffix}"), at(a, port)));
            }
        }
    }
    out
}

/// The https check of backend `i` (IPv4).
fn https(sb: &Sandbox, i: usize) -> Vec<(String, String)> {
    vec![(
        "https4".to_owned(),
        at(sb.backends[i].addr.into(), HTTPS_PORT),
    )]
}

/// The checks through the tunnel, of backend `i`.
fn through_tunnel(sb: &Sandbox, i: usize) -> Vec<(String, String)> {
    let b = &sb.backends[i];
    let mut out = https(sb, i);
    for (suffix, ip) in [("4", IpAddr::from(b.addr)), ("6", IpAddr::from(b.addr6))] {
        for (name, port) in [("tcp", PORT), ("conn", 9000), ("http", HTTP_PORT)] {
            out.push((format!("{name}{suffix}"), at(ip, port)));
        }
    }
    out
}

/// The plain checks of backend `i`.
fn plain(sb: &Sandbox, i: usize) -> Vec<(String, String)> {
    let b = &sb.backends[i];
    let mut out = Vec::new();
    for (suffix, ip) in [("4", IpAddr::from(b.addr)), ("6", IpAddr::from(b.addr6))] {
        for (name, port) in [("plain", PORT), ("plain-http", HTTP_PORT)] {
            out.push((format!("{name}{suffix}"), at(ip, port)));
        }
    }
    out
}

fn wait_all(daemon: &Daemon, which: &[(String, String)], state: &str) {
    for (service, backend) in which {
        daemon.wait_state(service, backend, state, LIMIT);
    }
}

/// The plain checks of backend `i` still say healthy.
fn plain_still_healthy(daemon: &Daemon, sb: &Sandbox, i: usize) {
    let status = daemon.status().unwrap();
    for (service, backend) in plain(sb, i) {
        let state = &status
            .service(&service)
            .and_then(|s| s.backend(&backend))
            .unwrap()
            .state;
        assert_eq!(state, "healthy", "{service} {backend}");
    }
}

/// SYN+ACKs (and SYNs) the namespace retransmitted so far (`/proc/net/netstat`'s
/// TcpExt TCPSynRetrans, both families): one left without an answer is retransmitted after a
/// second, one reset is not.
fn syn_retransmitted(ns: &Netns) -> u64 {
    ns.netstat("TcpExt:", "TCPSynRetrans").unwrap()
}

/// Connections in SYN-RECV on `ns` (`ss`): half-open ones the prober left.
/// The connections of `ns` in SYN-RECV, as "local peer" address pairs (`ss`).
fn half_open(ns: &Netns) -> Vec<String> {
    let out = ns
        .command("ss")
        .args(["-Htn", "state", "syn-recv"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| l.split_whitespace().skip(2).collect::<Vec<_>>().join(" "))
        .collect()
}

fn set_vips(b: &lb_tests::topology::BackendHost, held: bool) {
    for cidr in [format!("{VIP}/32"), format!("{VIP6}/128")] {
        if held {
            add_address(&b.ns, "lo", &cidr).unwrap();
        } else {
            b.ns.ip(&["addr", "del", &cidr, "dev", "lo"]).unwrap();
        }
    }
}

fn checks_through_the_tunnel(mode: &str) {
    let (sb, decaps, _https) = sandbox();
    let daemon = Daemon::start(&sb.lb, &config(&sb, mode, true)).unwrap();
    wait_all(&daemon, &all(&sb), "healthy");
    let status = daemon.status().unwrap();
    for name in ["tcp4", "conn4", "http6"] {
        assert!(status.service(name).unwrap().through_tunnel, "{name}");
    }
    assert!(!status.service("plain4").unwrap().through_tunnel);

    // Half-open probes through the tunnel leave nothing half open: no SYN+ACK is retransmitted
    // (each probe's is reset through the tunnel), no connection waits in SYN-RECV. A probe in
    // flight is in SYN-RECV for the moment until its RST: only one still there after the
    // 3.5 s of watching (with its own source port: one per probe) was left behind.
    let before: Vec<(u64, Vec<String>)> = sb
        .backends
        .iter()
        .map(|b| (syn_retransmitted(&b.ns), half_open(&b.ns)))
        .collect();
    std::thread::sleep(Duration::from_millis(3500));
    for (b, (retransmitted, open)) in sb.backends.iter().zip(before) {
        let again = syn_retransmitted(&b.ns) - retransmitted;
        assert_eq!(again, 0, "{}: SYN+ACKs retransmitted", b.name);
        let stayed: Vec<String> = half_open(&b.ns)
            .into_iter()
            .filter(|c| open.contains(c))
            .collect();
        assert!(
            stayed.is_empty(),
            "{}: half-open connections {stayed:?}",
            b.name
        );
    }

    // Backend 1 loses its VIPs: what is sent to the VIP is no longer its own.
    set_vips(&sb.backends[1], false);
    wait_all(&daemon, &through_tunnel(&sb, 1), "unhealthy");
    plain_still_healthy(&daemon, &sb, 1);
    wait_all(&daemon, &through_tunnel(&sb, 0), "healthy");
    set_vips(&sb.backends[1], true);
    wait_all(&daemon, &through_tunnel(&sb, 1), "healthy");

    // Its decapsulator stops: the tunnel ends there.
    decaps[1].stop().unwrap();
    wait_all(&daemon, &through_tunnel(&sb, 1), "unhealthy");
    plain_still_healthy(&daemon, &sb, 1);
    decaps[1].update(&[&sb.backends[1].ifname], &[]).unwrap();
    wait_all(&daemon, &all(&sb), "healthy");

    // A reload takes the tcp checks out of the tunnel: without its VIPs backend 1 is then
    // healthy to them and still unhealthy to the others; back through the tunnel (a new
    // probe), unhealthy to them too; its VIPs back, healthy to all.
    let reload = |tcp_through: bool| {
        std::fs::write(&daemon.config, config(&sb, mode, tcp_through)).unwrap();
        let out = daemon.lb(&["reload"]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let tcp1: Vec<(String, String)> = ["4", "6"]
        .into_iter()
        .zip([
            IpAddr::from(sb.backends[1].addr),
            sb.backends[1].addr6.into(),
        ])
        .map(|(suffix, ip)| (format!("tcp{suffix}"), at(ip, PORT)))
        .collect();
    let others1: Vec<(String, String)> = through_tunnel(&sb, 1)
        .into_iter()
        .filter(|k| !tcp1.contains(k))
        .collect();
    reload(false);
    assert!(
        !daemon
            .status()
            .unwrap()
            .service("tcp4")
            .unwrap()
            .through_tunnel
    );
    set_vips(&sb.backends[1], false);
    wait_all(&daemon, &others1, "unhealthy");
    wait_all(&daemon, &tcp1, "healthy");
    reload(true);
    wait_all(&daemon, &tcp1, "unhealthy");
    set_vips(&sb.backends[1], true);
    wait_all(&daemon, &all(&sb), "healthy");

    let events = daemon.events().unwrap();
    assert!(
        events.events.iter().any(|e| e.service == "tcp4"
            && e.to == "unhealthy"
            && e.source == "tcp through the tunnel"),
        "{events:#?}"
    );
    let stats = daemon.stats().unwrap();
    let count = |i: u32| stats.counter(counter::NAMES[i as usize]).unwrap_or(0);
    assert!(
        count(counter::PROBE_ENCAPSULATED) > 0,
        "{:?}",
        stats.counters
    );
    assert!(count(counter::PASS_PROBE_REPLY) > 0, "{:?}", stats.counters);
    assert_eq!(count(counter::PROBE_DROPPED), 0, "{:?}", stats.counters);
    // The backends took the probes out of their tunnels.
    for d in &decaps {
        let s = d.stats().unwrap();
        let name = if mode == "gue" {
            "decap_gue"
        } else {
            "decap_ipip"
        };
        assert!(s.counter(name) > 0, "{s:?}");
    }
}

#[test]
fn ipip_checks_through_the_tunnel_find_a_backend_without_its_vip_or_decapsulator() {
    checks_through_the_tunnel("ipip");
}

#[test]
fn gue_checks_through_the_tunnel_find_a_backend_without_its_vip_or_decapsulator() {
    checks_through_the_tunnel("gue");
}
