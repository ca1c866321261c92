//! `lb decap` end to end: a backend namespace holding VIPs on `lo` runs the real binary; a
//! namespace standing in for the balancer encapsulates the client's packets (IP in IP, GUE) and
//! sends them on; servers bound to the VIPs answer, straight from the VIP to the client. Also:
//! running it again updates it in place, `--stop` leaves nothing, the host's own traffic is
//! untouched, and mistakes are refused with what to do.

use std::{
    net::{IpAddr, SocketAddr, UdpSocket},
    path::PathBuf,
    time::{Duration, Instant},
};

use lb::decap::DecapStatus;
use lb_tests::{
    decap::{DecapGuard, hold_vip, lb_decap_command},
    lb_bin,
    netns::{Netns, Port, attach_pass_program, veth},
    relay::{Relay, RelaySpec},
    require_root, servers,
    traffic::echo_once,
};

const VIP4: &str = "10.100.0.1";
const VIP6: &str = "fd00:100::1";
const PORT: u16 = 8080;

/// client ── lb (the balancer's stand-in: encapsulates, and routes the replies) ── backend.
struct Net {
    client: Netns,
    lb: Netns,
    backend: Netns,
    /// lb's end towards the client, lb's and the backend's ends of their link.
    lb_client_side: Port,
    lb_backend_side: Port,
    backend_port: Port,
}

fn net() -> Net {
    require_root();
    let client = Netns::new("dcl").unwrap();
    let lb = Netns::new("dlb").unwrap();
    let backend = Netns::new("dbe").unwrap();
    let (c, lc) = veth(&client, "10.0.9.2/24", &lb, "10.0.9.1/24").unwrap();
    c.add_address("fd00:9::2/64").unwrap();
    lc.add_address("fd00:9::1/64").unwrap();
    let (lb_b, b) = veth(&lb, "10.0.1.1/24", &backend, "10.0.1.2/24").unwrap();
    lb_b.add_address("fd00:1::1/64").unwrap();
    b.add_address("fd00:1::2/64").unwrap();
    // Room for the outer header: a client's full-sized packet, encapsulated, is up to 48
    // bytes larger (docs/datapath.md, "Backends for direct server return").
    for port in [&lb_b, &b] {
        port.ns
            .ip(&["link", "set", &port.ifname, "mtu", "1600"])
            .unwrap();
    }
    for (ns, gw4, gw6) in [
        (&client, "10.0.9.1", "fd00:9::1"),
        (&backend, "10.0.1.1", "fd00:1::1"),
    ] {
        ns.ip(&["route", "add", "default", "via", gw4]).unwrap();
        ns.ip(&["-6", "route", "add", "default", "via", gw6])
            .unwrap();
    }
    lb.sysctl("net/ipv4/ip_forward", "1").unwrap();
    lb.sysctl("net/ipv6/conf/all/forwarding", "1").unwrap();
    // The VIPs are routed to the backend (so replies from them pass reverse path checks), but
    // their packets never go there plain: the relay takes them before the kernel, which drops
    // them.
    lb.ip(&["route", "add", VIP4, "via", "10.0.1.2"]).unwrap();
    lb.ip(&["-6", "route", "add", VIP6, "via", "fd00:1::2"])
        .unwrap();
    lb.nft(&["add", "table", "inet", "lbt"]).unwrap();
    lb.nft(&[
        "add",
        "chain",
        "inet",
        "lbt",
        "vips",
        "{ type filter hook forward priority 0; policy accept; }",
    ])
    .unwrap();
    for rule in [
        ["ip", "daddr", VIP4, "drop"],
        ["ip6", "daddr", VIP6, "drop"],
    ] {
        let mut args = vec!["add", "rule", "inet", "lbt", "vips"];
        args.extend(rule);
        lb.nft(&args).unwrap();
    }
    hold_vip(&backend, VIP4.parse().unwrap()).unwrap();
    hold_vip(&backend, VIP6.parse().unwrap()).unwrap();
    Net {
        client,
        lb,
        backend,
        lb_client_side: lc,
        lb_backend_side: lb_b,
        backend_port: b,
    }
}

impl Net {
    /// Encapsulates the client's packets to the VIPs towards the backend: IP in IP, or GUE to
    /// `gue_port`.
    fn relay(&self, gue_port: Option<u16>) -> Relay {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        Relay::start(
            &self.lb,
            RelaySpec {
                from_if: self.lb_client_side.ifname.clone(),
                to_if: self.lb_backend_side.ifname.clone(),
                vips: vec![ip(VIP4), ip(VIP6)],
                gue_port,
                src4: ip("10.0.1.1"),
                dst4: ip("10.0.1.2"),
                src6: ip("fd00:1::1"),
                dst6: ip("fd00:1::2"),
                smac: self.lb.mac(&self.lb_backend_side.ifname).unwrap(),
                dmac: self.backend.mac(&self.backend_port.ifname).unwrap(),
            },
        )
        .unwrap()
    }

    fn backend_if(&self) -> &str {
        &self.backend_port.ifname
    }
}

fn vip(ip: &str) -> SocketAddr {
    SocketAddr::new(ip.parse().unwrap(), PORT)
}

/// A UDP request from `ns` to `to`, sent up to `tries` times: the answer and where it came
/// from.
fn udp_request(ns: &Netns, to: SocketAddr, tries: usize) -> Option<(String, SocketAddr)> {
    ns.enter(|| {
        let any = if to.is_ipv4() { "0.0.0.0:0" } else { "[::]:0" };
        let socket = UdpSocket::bind(any).unwrap();
        socket
            .set_read_timeout(Some(Duration::from_millis(1500)))
            .unwrap();
        let mut buf = [0u8; 1500];
        for _ in 0..tries {
            socket.send_to(b"ping", to).unwrap();
            if let Ok((n, from)) = socket.recv_from(&mut buf) {
                return Some((String::from_utf8_lossy(&buf[..n]).into_owned(), from));
            }
        }
        None
    })
}

/// TCP to `to` from `ns`: the server's greeting, then 32 KiB echoed (full-sized segments).
fn tcp_exchange(ns: &Netns, to: SocketAddr) -> String {
    let (mut conn, greeting) =
        servers::connect(ns, to).unwrap_or_else(|e| panic!("TCP to {to}: {e:#}"));
    let data: Vec<u8> = (0..32 * 1024).map(|i| (i % 251) as u8).collect();
    echo_once(&mut conn, &data);
    greeting
}

/// The decapsulator's stats once every frame `relay` sent since `before` is counted in one of
/// `counters` (at most 3 s later: the last segments of closed connections may be on their way).
fn settled(
    decap: &DecapGuard,
    relay: &Relay,
    before: &DecapStatus,
    counters: &[&str],
) -> DecapStatus {
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        let s = decap.stats().unwrap();
        let opened: u64 = counters
            .iter()
            .map(|c| s.counter(c) - before.counter(c))
            .sum();
        if opened >= relay.relayed() || Instant::now() > deadline {
            return s;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn tcp_and_udp_reach_the_vips_through_ip_in_ip_and_gue() {
    let n = net();
    let _servers4 = servers::start(&n.backend, vip(VIP4), "backend").unwrap();
    let _servers6 = servers::start(&n.backend, vip(VIP6), "backend").unwrap();
    let decap = DecapGuard::start(&n.backend, &[n.backend_if()], &[]).unwrap();
    for (gue_port, counters) in [
        (None, &["decap_ipip", "decap_ipv6_in_ip"][..]),
        (Some(lb_common::DEFAULT_GUE_PORT), &["decap_gue"][..]),
    ] {
        let relay = n.relay(gue_port);
        let before = decap.stats().unwrap();
        for vip_ip in [VIP4, VIP6] {
            let (answer, from) = udp_request(&n.client, vip(vip_ip), 3)
                .unwrap_or_else(|| panic!("no UDP answer from {vip_ip} ({gue_port:?})"));
            assert_eq!(answer, "backend:ping");
            assert_eq!(from, vip(vip_ip), "the answer comes from the VIP");
            assert_eq!(tcp_exchange(&n.client, vip(vip_ip)), "backend");
        }
        let after = settled(&decap, &relay, &before, counters);
        let opened = |name: &str| after.counter(name) - before.counter(name);
        assert!(relay.relayed() > 20, "{}", relay.relayed());
        // Every frame sent was opened, each by its encapsulation's counter.
        let total: u64 = counters.iter().map(|c| opened(c)).sum();
        assert_eq!(total, relay.relayed(), "{after:#?}");
        assert!(counters.iter().all(|c| opened(c) > 0), "{after:#?}");
        for name in [
            "drop_malformed",
            "drop_ecn",
            "pass_malformed",
            "pass_not_local",
        ] {
            assert_eq!(after.counter(name), 0, "{name}: {after:#?}");
        }
    }
    let s = decap.stats().unwrap();
    assert!(s.strict);
    assert_eq!(s.gue_port, lb_common::DEFAULT_GUE_PORT);
    assert_eq!(s.interfaces.len(), 1);
    assert_eq!(s.interfaces[0].name, n.backend_if());
    assert_eq!(s.interfaces[0].mode.as_deref(), Some("native"));
    for own in ["10.0.1.2", "fd00:1::2", VIP4] {
        assert!(s.addresses.contains(&own.parse().unwrap()), "{own}: {s:#?}");
    }
}

#[test]
fn running_again_updates_in_place_and_stop_removes_everything() {
    let n = net();
    let _servers = servers::start(&n.backend, vip(VIP4), "backend").unwrap();
    let ifname = n.backend_if();
    // Strict destination with an address that is not the backend's: nothing is opened.
    let decap = DecapGuard::start(&n.backend, &[ifname], &["--address", "10.0.1.99"]).unwrap();
    let relay = n.relay(None);
    assert_eq!(udp_request(&n.client, vip(VIP4), 1), None);
    let first = decap.stats().unwrap();
    assert!(first.counter("pass_not_local") >= 1, "{first:#?}");
    assert_eq!(first.counter("decap_ipip"), 0);
    assert_eq!(
        first.addresses,
        vec!["10.0.1.99".parse::<IpAddr>().unwrap()]
    );

    // Again with the host's addresses: the same link, a new program, the counters kept.
    let said = decap.update(&[ifname], &[]).unwrap();
    assert!(said.contains("replaced in place"), "{said}");
    assert!(said.contains("removed 10.0.1.99"), "{said}");
    let second = decap.stats().unwrap();
    assert_eq!(second.interfaces[0].link_id, first.interfaces[0].link_id);
    assert_ne!(
        second.interfaces[0].program_id,
        first.interfaces[0].program_id
    );
    assert!(second.counter("pass_not_local") >= first.counter("pass_not_local"));
    assert!(second.addresses.contains(&"10.0.1.2".parse().unwrap()));
    assert!(!second.addresses.contains(&"10.0.1.99".parse().unwrap()));
    let (answer, _) = udp_request(&n.client, vip(VIP4), 3).expect("an answer after the update");
    assert_eq!(answer, "backend:ping");
    assert!(decap.stats().unwrap().counter("decap_ipip") >= 1);

    // Another GUE port, and a second interface attached.
    drop(relay);
    let relay = n.relay(Some(7000));
    let other = Netns::new("dot").unwrap();
    let (extra, _) = veth(&n.backend, "10.0.7.1/24", &other, "10.0.7.2/24").unwrap();
    decap
        .update(&[ifname, &extra.ifname], &["--gue-port", "7000"])
        .unwrap();
    let third = decap.stats().unwrap();
    assert_eq!(third.gue_port, 7000);
    assert_eq!(third.interfaces.len(), 2, "{third:#?}");
    assert!(n.backend.xdp_attached(&extra.ifname).unwrap());
    let (answer, _) = udp_request(&n.client, vip(VIP4), 3).expect("an answer over GUE 7000");
    assert_eq!(answer, "backend:ping");
    assert!(decap.stats().unwrap().counter("decap_gue") >= 1);
    drop(relay);

    // The second interface no longer listed: detached.
    let said = decap.update(&[ifname], &["--gue-port", "7000"]).unwrap();
    assert!(
        said.contains(&format!("detached from {}", extra.ifname)),
        "{said}"
    );
    assert!(!n.backend.xdp_attached(&extra.ifname).unwrap());

    // --stop: nothing pinned, nothing attached.
    let said = decap.stop().unwrap();
    assert!(said.contains("lb decap stopped"), "{said}");
    assert!(!decap.pin_path().exists());
    assert!(!n.backend.xdp_attached(ifname).unwrap());
    assert!(decap.stop().unwrap().contains("nothing is pinned"));
}

#[test]
fn the_hosts_own_traffic_is_untouched() {
    let n = net();
    let own4: SocketAddr = "10.0.1.2:9000".parse().unwrap();
    let own6: SocketAddr = "[fd00:1::2]:9000".parse().unwrap();
    let _s4 = servers::start(&n.backend, own4, "host").unwrap();
    let _s6 = servers::start(&n.backend, own6, "host").unwrap();
    let decap = DecapGuard::start(&n.backend, &[n.backend_if()], &[]).unwrap();
    for (from, to) in [
        (&n.lb, "10.0.1.2"),
        (&n.lb, "fd00:1::2"),
        (&n.client, "10.0.1.2"),
        (&n.client, "fd00:1::2"),
    ] {
        let out = from
            .exec(&["ping", "-c", "3", "-i", "0.2", "-W", "2", to])
            .unwrap();
        assert!(
            out.status.success(),
            "ping {to}: {}",
            String::from_utf8_lossy(&out.stdout)
        );
    }
    for to in [own4, own6] {
        assert_eq!(tcp_exchange(&n.lb, to), "host");
        assert_eq!(tcp_exchange(&n.client, to), "host");
        let (answer, from) = udp_request(&n.client, to, 3).expect("UDP answer");
        assert_eq!((answer.as_str(), from), ("host:ping", to));
    }
    let s = decap.stats().unwrap();
    assert!(s.counter("pass_not_encap") > 50, "{s:#?}");
    for c in &s.counters {
        if c.name != "pass_not_encap" {
            assert_eq!(c.value, 0, "{}: {s:#?}", c.name);
        }
    }
}

/// A pin directory of a test that never sets one up itself (the set-ups below must fail):
/// removed on drop whatever they left.
struct PinPath(PathBuf);

impl PinPath {
    fn new(tag: &str) -> Self {
        Self(PathBuf::from(format!(
            "/sys/fs/bpf/lb-decap-test-{}-{tag}",
            std::process::id()
        )))
    }

    fn arg(&self) -> &str {
        self.0.to_str().unwrap()
    }
}

impl Drop for PinPath {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(self.0.join("not-ours"));
        if let Err(e) = lb::dataplane::remove_pinned(&self.0) {
            eprintln!("warning: {e:#}");
        }
    }
}

/// `lb decap ARGS` in `ns` (nsenter): (exit code, stderr).
fn lb_decap(ns: &Netns, args: &[&str]) -> (i32, String) {
    let out = lb_decap_command(ns).args(args).output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn mistakes_are_refused_with_the_fix() {
    require_root();
    let ns = Netns::new("derr").unwrap();
    let peer = Netns::new("derrpeer").unwrap();
    let (port, _) = veth(&ns, "10.0.5.1/24", &peer, "10.0.5.2/24").unwrap();
    let pin = PinPath::new("errors");
    let iface = port.ifname.as_str();

    // Usage: exit 2.
    for args in [
        vec!["--gue-port", "0", "--interface", iface],
        vec!["--address", "224.0.0.1", "--interface", iface],
        vec!["--interface", iface, "--interface", iface],
        vec!["--stop", "--interface", iface],
        vec![
            "--any-destination",
            "--address",
            "10.0.5.1",
            "--interface",
            iface,
        ],
        vec![],
    ] {
        let mut all = args.clone();
        all.extend(["--pin-path", pin.arg()]);
        let (code, err) = lb_decap(&ns, &all);
        assert_eq!(code, 2, "{args:?}: {err}");
    }

    // An interface that does not exist: exit 1, named, nothing pinned.
    let (code, err) = lb_decap(&ns, &["--interface", "nosuch0", "--pin-path", pin.arg()]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("\"nosuch0\" does not exist"), "{err}");
    assert!(!pin.0.exists());

    // Another XDP program on the interface: refused, and the failed set-up leaves nothing.
    let pass = attach_pass_program(&port).unwrap();
    let (code, err) = lb_decap(&ns, &["--interface", iface, "--pin-path", pin.arg()]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains(&format!(
            "another XDP program is already attached to {iface}"
        )),
        "{err}"
    );
    assert!(!pin.0.exists(), "a failed set-up left {}", pin.0.display());
    drop(pass);

    // `ip netns exec`: a private mount namespace, where a pin would not outlive the command.
    let out = ns
        .command(lb_bin())
        .args(["decap", "--interface", iface, "--pin-path", pin.arg()])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("nsenter --net=/run/netns/NS lb decap"),
        "{err}"
    );
    assert!(!ns.xdp_attached(iface).unwrap());

    // A directory holding what lb decap never pins is not its own: neither set up nor removed.
    std::fs::create_dir_all(pin.0.join("not-ours")).unwrap();
    let (code, err) = lb_decap(&ns, &["--interface", iface, "--pin-path", pin.arg()]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("not lb decap's pin directory"), "{err}");
    let (code, err) = lb_decap(&ns, &["--stop", "--pin-path", pin.arg()]);
    assert_eq!(code, 1, "{err}");
    assert!(pin.0.join("not-ours").exists());

    // --stats of nothing: exit 1, saying how to set it up.
    let (code, err) = lb_decap(&ns, &["--stats", "--pin-path", "/sys/fs/bpf/lb-decap-none"]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("lb decap --interface IF"), "{err}");
}

/// What `hold_vip` promises: the backend takes the VIP's packets but never answers ARP or
/// neighbour solicitations for it (lb holds it on the network), while it still answers for its
/// own address.
#[test]
fn the_vip_is_not_announced() {
    let n = net();
    let link = n.lb_backend_side.ifname.as_str();
    // Routes that make lb ask the link for the VIPs themselves, not for the backend.
    n.lb.ip(&["route", "replace", VIP4, "dev", link]).unwrap();
    n.lb.ip(&["-6", "route", "replace", VIP6, "dev", link])
        .unwrap();
    for (vip, own) in [(VIP4, "10.0.1.2"), (VIP6, "fd00:1::2")] {
        let asked = n.lb.exec(&["ping", "-c", "2", "-W", "1", vip]).unwrap();
        assert!(!asked.status.success(), "{vip} answered");
        let own_ok = n.lb.exec(&["ping", "-c", "1", "-W", "2", own]).unwrap();
        assert!(own_ok.status.success(), "{own} did not answer");
        let neigh = n.lb.ip(&["neigh", "show", vip]).unwrap();
        assert!(!neigh.contains("lladdr"), "{vip} resolved: {neigh}");
        let neigh = n.lb.ip(&["neigh", "show", own]).unwrap();
        assert!(neigh.contains("lladdr"), "{own} not resolved: {neigh}");
    }
}
