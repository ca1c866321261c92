//! Direct server return end to end in namespaces: backends running the real `lb decap` with the
//! VIP on `lo`, answering the client over a path of their own (the reply path does not cross
//! lb: its return path counts nothing and its backend-side interface receives next to nothing
//! while tens of megabytes come back); real TCP and UDP through the VIP, both modes and
//! families: the spread over the backends, 20 MB echoed streams compared by digest, drain and
//! health flags, the health checker's verdicts. Every link is at MTU 1500, so the client's
//! full-size segments do not fit once encapsulated: the streams complete only because lb
//! answers them with "fragmentation needed" / "packet too big" and the client lowers its path
//! MTU to the VIP (which the test reads back from the client's route cache).

use std::{
    net::{IpAddr, SocketAddr},
    time::Duration,
};

use lb_common::counter;
use lb_tests::{
    daemon::Daemon,
    decap::DecapGuard,
    inproc::InProcess,
    netns::Netns,
    require_root,
    servers::{self, connect},
    topology::{Arms, Sandbox, VIP, VIP6},
    traffic::{assert_shares, echo_once, echo_transfer, udp_echo},
};

/// The service port: the backends' and the VIP's (direct server return keeps the port).
const PORT: u16 = 8080;

fn vip4() -> SocketAddr {
    SocketAddr::from((VIP, PORT))
}

fn vip6() -> SocketAddr {
    SocketAddr::from((VIP6, PORT))
}

/// A sandbox of 3 backends holding both VIPs behind `lb decap`, replies going straight to the
/// client (two-arm: over the client's second leg), and the decapsulators' guards.
fn sandbox(arms: Arms) -> (Sandbox, Vec<DecapGuard>) {
    require_root();
    let mut sb = Sandbox::build(arms, 3, PORT).unwrap();
    sb.serve_vip(VIP.into(), None).unwrap();
    sb.serve_vip(VIP6.into(), None).unwrap();
    if arms == Arms::Two {
        sb.direct_return().unwrap();
    }
    let decaps = sb
        .backends
        .iter()
        .map(|b| DecapGuard::start(&b.ns, &[&b.ifname], &[]).unwrap())
        .collect();
    (sb, decaps)
}

/// The DSR services (TCP and UDP on both VIPs) in `mode`, with `extra` in each.
fn config(sb: &Sandbox, mode: &str, extra: &str) -> String {
    let extra = format!("forwarding = \"{mode}\"\n{extra}");
    sb.config6(PORT, &[], &extra, true).replace(
        "[lb]\n",
        "[lb]\nconntrack = { size = 65536, ipv6_size = 65536 }\n",
    )
}

/// Received bytes of `ifname` in `ns` (`ip -s link`).
fn rx_bytes(ns: &Netns, ifname: &str) -> u64 {
    let out = ns.ip(&["-s", "-o", "link", "show", ifname]).unwrap();
    // "... RX: bytes packets ... \    <bytes> <packets> ..."
    let fields: Vec<&str> = out.split_whitespace().collect();
    let at = fields.iter().position(|f| *f == "RX:").expect("RX stats");
    let labels = fields[at + 1..].iter().take_while(|f| **f != "\\").count();
    fields[at + 1 + labels + 1].parse().expect("a byte count")
}

/// The path MTU the client's kernel learned for `vip` (its route cache), if any.
fn learned_mtu(client: &Netns, vip: IpAddr) -> Option<u32> {
    let out = client.ip(&["route", "get", &vip.to_string()]).ok()?;
    let words: Vec<&str> = out.split_whitespace().collect();
    let at = words.iter().position(|w| *w == "mtu")?;
    words.get(at + 1)?.parse().ok()
}

fn spreads_streams_and_udp(arms: Arms, mode: &str) {
    let (sb, decaps) = sandbox(arms);
    let lb = InProcess::start(&sb, &config(&sb, mode, "")).unwrap();
    let lb_backend_side = sb.lb_ports.last().unwrap();
    let rx_before = rx_bytes(&sb.lb, &lb_backend_side.ifname);
    let third = 1.0 / 3.0;
    let names = [
        ("backend-0", third),
        ("backend-1", third),
        ("backend-2", third),
    ];
    for vip in [vip4(), vip6()] {
        let n = 900;
        let seen = servers::spread(&sb.client.ns, vip, n);
        assert_shares(&seen, n, &names);
    }
    // 20 MB each way per stream; the client's full-size segments need lb's PMTU answers.
    let streams: Vec<_> = [vip4(), vip4(), vip6(), vip6()]
        .into_iter()
        .enumerate()
        .map(|(i, vip)| {
            let (conn, _) = connect(&sb.client.ns, vip).unwrap();
            std::thread::spawn(move || echo_transfer(conn, 20 << 20, i as u8))
        })
        .collect();
    for s in streams {
        s.join().unwrap();
    }
    let overhead = if mode == "gue" { (28, 48) } else { (20, 40) };
    assert_eq!(
        learned_mtu(&sb.client.ns, VIP.into()),
        Some(1500 - overhead.0),
        "IPv4 path MTU to the VIP"
    );
    assert_eq!(
        learned_mtu(&sb.client.ns, VIP6.into()),
        Some(1500 - overhead.1),
        "IPv6 path MTU to the VIP"
    );
    for vip in [vip4(), vip6()] {
        let udp = udp_echo(&sb.client.ns, vip, 60);
        assert_eq!(udp.values().sum::<usize>(), 60);
        assert!(udp.len() >= 2, "UDP flows spread over backends: {udp:?}");
    }

    let stats = lb.stats();
    assert_eq!(stats.counter(counter::REPLY), 0, "no reply crossed lb");
    assert!(stats.counter(counter::ICMP_TOO_BIG) > 0, "{stats:?}");
    assert_eq!(stats.counter(counter::DROP_TOO_BIG), 0);
    assert_eq!(stats.counter(counter::DROP_NO_ROUTE), 0);
    assert_eq!(stats.counter(counter::DROP_NO_SNAT_PORT), 0);
    let fwd = if arms == Arms::One {
        counter::FWD_TX
    } else {
        counter::FWD_REDIRECT
    };
    assert!(stats.counter(fwd) > 0);
    // 80 MB came back to the client; lb's backend side received (almost) none of it: the
    // neighbour upkeep's replies, nothing of the streams.
    if arms == Arms::Two {
        let rx = rx_bytes(&sb.lb, &lb_backend_side.ifname) - rx_before;
        assert!(
            rx < 2 << 20,
            "lb's backend side received {rx} bytes: replies crossed lb"
        );
    }
    let decapsulated: u64 = decaps
        .iter()
        .map(|d| {
            let s = d.stats().unwrap();
            let name = if mode == "gue" {
                "decap_gue"
            } else {
                "decap_ipip"
            };
            s.counter(name)
                + if mode == "gue" {
                    0
                } else {
                    s.counter("decap_ipv6_in_ip")
                }
        })
        .sum();
    assert!(
        decapsulated > 40 << 10,
        "the backends took {decapsulated} packets out of their tunnels"
    );
}

#[test]
fn two_arm_ipip_spreads_flows_keeps_20mb_streams_intact_and_replies_bypass_lb() {
    spreads_streams_and_udp(Arms::Two, "ipip");
}

#[test]
fn two_arm_gue_spreads_flows_keeps_20mb_streams_intact_and_replies_bypass_lb() {
    spreads_streams_and_udp(Arms::Two, "gue");
}

#[test]
fn one_arm_gue_spreads_flows_and_keeps_20mb_streams_intact() {
    spreads_streams_and_udp(Arms::One, "gue");
}

#[test]
fn drain_and_health_flags_steer_new_flows_of_a_dsr_service() {
    let (sb, _decaps) = sandbox(Arms::Two);
    let mut lb = InProcess::start(&sb, &config(&sb, "ipip", "")).unwrap();
    // The IPv4 TCP service (config6 lists the IPv6 services first).
    let tcp = lb
        .config
        .services
        .iter()
        .position(|s| s.name == "tcp")
        .unwrap();
    let mut conn = lb_tests::traffic::connect_to(&sb.client.ns, vip4(), "backend-0");
    echo_once(&mut conn, b"before");
    // Drained: its connection goes on, no new flows.
    lb.set_drained(tcp, 0, true);
    let seen = servers::spread(&sb.client.ns, vip4(), 300);
    assert!(!seen.contains_key("backend-0"), "{seen:?}");
    echo_once(&mut conn, &[7u8; 1 << 20]);
    lb.set_drained(tcp, 0, false);
    // A cleared health flag: no new flows at once, and back with the flag.
    lb.set_up(tcp, 1, false);
    let seen = servers::spread(&sb.client.ns, vip4(), 300);
    assert!(!seen.contains_key("backend-1"), "{seen:?}");
    assert_eq!(seen.values().sum::<usize>(), 300);
    lb.set_up(tcp, 1, true);
    let seen = servers::spread(&sb.client.ns, vip4(), 300);
    assert!(seen.get("backend-1").copied().unwrap_or(0) > 50, "{seen:?}");
}

#[test]
fn the_health_checker_takes_a_dead_dsr_backend_out_and_back() {
    let (mut sb, _decaps) = sandbox(Arms::Two);
    let backends: Vec<String> = sb
        .backends
        .iter()
        .map(|b| format!("{{ address = \"{}:{PORT}\" }}", b.addr))
        .collect();
    let config = format!(
        "[lb]\ninterfaces = [{}]\nxdp_mode = \"native\"\n\n[[service]]\nname = \"tcp\"\n\
         vip = \"{}\"\nforwarding = \"gue\"\nbackends = [{}]\n[service.check]\nkind = \"tcp\"\n\
         timeout = \"200ms\"\ninterval = \"300ms\"\nunhealthy_threshold = 2\nhealthy_threshold = 2\n",
        sb.interfaces_toml(),
        vip4(),
        backends.join(", ")
    );
    let daemon = Daemon::start(&sb.lb, &config).unwrap();
    let victim = format!("{}:{PORT}", sb.backends[2].addr);
    for b in &sb.backends {
        let at = format!("{}:{PORT}", b.addr);
        daemon.wait_state("tcp", &at, "healthy", Duration::from_secs(20));
    }
    let seen = servers::spread(&sb.client.ns, vip4(), 300);
    assert!(seen.get("backend-2").copied().unwrap_or(0) > 50, "{seen:?}");
    sb.stop_backend(2);
    daemon.wait_state("tcp", &victim, "unhealthy", Duration::from_secs(20));
    let seen = servers::spread(&sb.client.ns, vip4(), 300);
    assert!(!seen.contains_key("backend-2"), "{seen:?}");
    sb.start_backend(2).unwrap();
    daemon.wait_state("tcp", &victim, "healthy", Duration::from_secs(20));
    let status = daemon.status().unwrap();
    let service = status.service("tcp").unwrap();
    assert_eq!(service.forwarding, "gue");
    assert!(service.passive_signals.is_empty(), "passive checks are off");
}

/// Backends as containers: one host, each backend in a network namespace of its own running
/// `lb decap` with the default pin path. Each namespace's decapsulator lives in a directory of
/// its own (the host's bpffs is shared), shows its own counters and interface, and stopping one
/// leaves the others decapsulating. Behind an IP-in-IP service (IPv4) and a GUE one (IPv6).
#[test]
fn backends_in_three_namespaces_each_decapsulate_with_the_default_pin_path() {
    require_root();
    let mut sb = Sandbox::build(Arms::One, 3, PORT).unwrap();
    sb.serve_vip(VIP.into(), None).unwrap();
    sb.serve_vip(VIP6.into(), None).unwrap();
    let decaps: Vec<DecapGuard> = sb
        .backends
        .iter()
        .map(|b| DecapGuard::start_default(&b.ns, &[&b.ifname]).unwrap())
        .collect();
    let dirs: std::collections::BTreeSet<_> = decaps.iter().map(|d| d.pin_path()).collect();
    assert_eq!(dirs.len(), 3, "one pin directory per namespace: {dirs:?}");

    let mut config = format!(
        "[lb]\ninterfaces = [{}]\nxdp_mode = \"native\"\n\n",
        sb.interfaces_toml()
    );
    config += &sb.services_toml(
        false,
        PORT,
        &sb.backends_toml(false, &[]),
        "forwarding = \"ipip\"",
    );
    config += &sb.services_toml(
        true,
        PORT,
        &sb.backends_toml(true, &[]),
        "forwarding = \"gue\"",
    );
    let mut lb = InProcess::start(&sb, &config).unwrap();
    let third = 1.0 / 3.0;
    let names = [
        ("backend-0", third),
        ("backend-1", third),
        ("backend-2", third),
    ];
    for vip in [vip4(), vip6()] {
        let n = 300;
        let seen = servers::spread(&sb.client.ns, vip, n);
        assert_shares(&seen, n, &names);
    }
    for (decap, b) in decaps.iter().zip(&sb.backends) {
        let stats = decap.stats().unwrap();
        let ifaces: Vec<&str> = stats.interfaces.iter().map(|i| i.name.as_str()).collect();
        assert_eq!(ifaces, [b.ifname.as_str()], "{}: {stats:?}", b.name);
        assert!(
            stats.counter("decap_ipip") >= 50 && stats.counter("decap_gue") >= 50,
            "{}: its own counters: {stats:?}",
            b.name
        );
    }

    // One backend's decapsulator stopped: the other two keep answering (backend 0 drained in
    // lb, so that no new flow goes where nothing decapsulates any more).
    let out = decaps[0].stop().unwrap();
    assert!(out.contains(&sb.backends[0].ifname), "{out}");
    assert!(!decaps[0].pin_path().exists());
    for s in 0..4 {
        lb.set_drained(s, 0, true);
    }
    for vip in [vip4(), vip6()] {
        let n = 100;
        let seen = servers::spread(&sb.client.ns, vip, n);
        assert_shares(&seen, n, &[("backend-1", 0.5), ("backend-2", 0.5)]);
    }
    for decap in &decaps[1..] {
        assert_eq!(decap.stats().unwrap().interfaces.len(), 1);
    }
}
