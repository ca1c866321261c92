//! `lb run` on a veth in a namespace: VIP traffic moves the VIP counters, everything else (ARP,
//! ping, a TCP connection to the balancer's own address) is unaffected; SIGTERM detaches.

use std::{
    io::{Read as _, Write as _},
    net::{TcpListener, TcpStream, UdpSocket},
    time::Duration,
};

use lb::api::StatsReply;
use lb_tests::{
    daemon::{Daemon, TempDir},
    lb_bin,
    netns::{Netns, Port, attach_pass_program, enable_gro, veth},
    require_root,
};

fn config(ifname: &str, xdp_mode: &str) -> String {
    format!(
        r#"
[lb]
interfaces = ["{ifname}"]
xdp_mode = "{xdp_mode}"
api = "127.0.0.1:9090"

[[service]]
name = "web"
vip = "10.100.0.1:80"
protocol = "tcp"
backends = [{{ address = "10.0.2.2:8080" }}]

[[service]]
name = "dns"
vip = "10.100.0.1:53"
protocol = "udp"
backends = [{{ address = "10.0.2.2:5353" }}]
"#
    )
}

/// client (10.0.1.2) ⇄ lb (10.0.1.1, XDP), VIP 10.100.0.1 routed via lb.
fn sandbox(xdp_mode: &str) -> (Port, Port, Daemon) {
    require_root();
    let client_ns = Netns::new("client").unwrap();
    let lb_ns = Netns::new("lb").unwrap();
    let (client, lb) = veth(&client_ns, "10.0.1.2/24", &lb_ns, "10.0.1.1/24").unwrap();
    client_ns
        .ip(&["route", "add", "10.100.0.0/24", "via", "10.0.1.1"])
        .unwrap();
    let daemon = Daemon::start(&lb_ns, &config(&lb.ifname, xdp_mode)).unwrap();
    (client, lb, daemon)
}

fn counter(r: &StatsReply, name: &str) -> u64 {
    r.counter(name)
        .unwrap_or_else(|| panic!("no counter {name}"))
}

fn service(r: &StatsReply, name: &str) -> u64 {
    r.services.iter().find(|s| s.name == name).unwrap().packets
}

fn lb_counts_vip_traffic_and_passes_the_rest(xdp_mode: &str, stop_signal: libc::c_int) {
    let (client, lb, mut daemon) = sandbox(xdp_mode);
    assert!(lb.ns.xdp_attached(&lb.ifname).unwrap());
    let before = daemon.stats().unwrap();

    // Non-VIP: ping the balancer's own address (the first one also resolves ARP through XDP).
    let ping = client
        .ns
        .exec(&["ping", "-c", "3", "-i", "0.2", "-W", "2", lb.addr()])
        .unwrap();
    assert!(ping.status.success(), "ping through lb failed: {ping:?}");

    // Non-VIP: a TCP connection to a server on the balancer's own address, 1 MB each way.
    let listener = lb.ns.enter(|| TcpListener::bind("10.0.1.1:7000").unwrap());
    let server = std::thread::spawn(move || {
        let (mut conn, _) = listener.accept().unwrap();
        let mut buf = vec![0u8; 1 << 20];
        conn.read_exact(&mut buf).unwrap();
        conn.write_all(&buf).unwrap();
    });
    let sent: Vec<u8> = (0..1u32 << 20).map(|i| (i * 7 + i / 251) as u8).collect();
    let mut echoed = vec![0u8; sent.len()];
    let mut conn = client
        .ns
        .enter(|| {
            TcpStream::connect_timeout(&"10.0.1.1:7000".parse().unwrap(), Duration::from_secs(5))
        })
        .unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    conn.write_all(&sent).unwrap();
    conn.read_exact(&mut echoed).unwrap();
    assert!(echoed == sent, "TCP data through the XDP host corrupted");
    server.join().unwrap();

    // VIP: 5 UDP datagrams and a TCP connection attempt (not forwarded yet: nothing answers).
    let udp = client.ns.enter(|| UdpSocket::bind("10.0.1.2:0").unwrap());
    for _ in 0..5 {
        udp.send_to(b"query", "10.100.0.1:53").unwrap();
    }
    let syn = client.ns.enter(|| {
        TcpStream::connect_timeout(
            &"10.100.0.1:80".parse().unwrap(),
            Duration::from_millis(300),
        )
    });
    assert!(syn.is_err(), "nothing forwards VIP traffic yet");

    let after = daemon.stats().unwrap();
    let delta = |name| counter(&after, name) - counter(&before, name);
    assert_eq!(
        service(&after, "dns") - service(&before, "dns"),
        5,
        "{after:?}"
    );
    assert!(
        service(&after, "web") - service(&before, "web") >= 1,
        "{after:?}"
    );
    assert!(delta("vip_hit") >= 6, "{after:?}");
    assert!(
        delta("pass_not_vip") >= 3 + 100,
        "ping and the TCP transfer: {after:?}"
    );
    assert!(delta("pass_not_ipv4") >= 1, "ARP: {after:?}");
    for name in ["drop_malformed", "drop_fragment"] {
        assert_eq!(delta(name), 0, "{name}: {after:?}");
    }

    // SIGTERM / SIGINT: clean exit, program detached.
    let code = daemon.stop(stop_signal);
    let log = daemon.log_text();
    assert_eq!(code, Some(0), "lb exit status; log:\n{log}");
    assert!(
        !lb.ns.xdp_attached(&lb.ifname).unwrap(),
        "still attached after exit"
    );
    assert!(log.contains("XDP program detached"), "{log}");
}

#[test]
fn native_mode_counts_vip_traffic_and_passes_the_rest() {
    lb_counts_vip_traffic_and_passes_the_rest("native", libc::SIGTERM);
}

/// Also stopped with SIGINT instead of SIGTERM.
#[test]
fn skb_mode_counts_vip_traffic_and_passes_the_rest() {
    lb_counts_vip_traffic_and_passes_the_rest("skb", libc::SIGINT);
}

#[test]
fn run_on_a_missing_interface_fails_cleanly() {
    require_root();
    let ns = Netns::new("lb").unwrap();
    let dir = TempDir::new().unwrap();
    let config = dir.0.join("lb.toml");
    std::fs::write(&config, config_text("nosuch0")).unwrap();
    let out = ns
        .command(lb_bin())
        .args(["run", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("interface \"nosuch0\" does not exist"),
        "{stderr}"
    );
}

fn config_text(ifname: &str) -> String {
    config(ifname, "auto")
}

#[test]
fn a_second_lb_on_the_same_interface_is_refused_and_the_first_keeps_running() {
    let (_client, lb, daemon) = sandbox("native");
    let out = lb
        .ns
        .command(lb_bin())
        .args(["run", "--config"])
        .arg(&daemon.config)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("already attached"), "{stderr}");
    assert!(daemon.stats().is_ok());
    assert!(lb.ns.xdp_attached(&lb.ifname).unwrap());
}

/// The kit's two ways of making native XDP on veth receive frames: a pass program on the peer, or
/// GRO. Neither may disturb ordinary traffic.
#[test]
fn peer_pass_program_and_gro_leave_traffic_alone() {
    require_root();
    let a = Netns::new("a").unwrap();
    let b = Netns::new("b").unwrap();
    let (pa, pb) = veth(&a, "10.0.9.1/24", &b, "10.0.9.2/24").unwrap();
    let pass = attach_pass_program(&pa).unwrap();
    enable_gro(&pb).unwrap();
    assert!(pa.ns.xdp_attached(&pa.ifname).unwrap());
    let ping = a
        .exec(&["ping", "-c", "2", "-i", "0.2", "-W", "2", pb.addr()])
        .unwrap();
    assert!(ping.status.success(), "{ping:?}");
    drop(pass);
    assert!(!pa.ns.xdp_attached(&pa.ifname).unwrap(), "detached on drop");
}
