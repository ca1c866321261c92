//! ICMP through a running lb on real networks (issue 13): path MTU discovery across a link with a
//! smaller MTU between the client and lb, ping to a VIP, and a VIP port no service has.
//!
//! ```text
//!  client 10.0.5.2 ─ 10.0.5.1 [r2] 10.0.6.2 ═══ MTU 1400 ═══ 10.0.6.1 [r1] 10.0.1.2 ─ [lb] ─ backend
//! ```
//! r1 is the sandbox's client namespace turned router. The backend sends 1500-byte packets (the
//! client's MSS says 1460); r1 cannot forward them into the 1400 link and answers with
//! "fragmentation needed" to their source, the VIP. Only if lb translates that error to the
//! backend does the backend lower its path MTU and the download go on.

use std::{
    net::SocketAddr,
    time::{Duration, Instant},
};

use lb_tests::{
    daemon::Daemon,
    netns::{Netns, veth},
    require_root,
    servers::{blob, start_blob},
    topology::{Arms, Sandbox, VIP},
};

const BLOB_PORT: u16 = 9000;
const SIZE: usize = 2 << 20;

struct Bed {
    sb: Sandbox,
    client: Netns,
    _r2: Netns,
    _blob: lb_tests::servers::Servers,
}

fn bed() -> Bed {
    require_root();
    let sb = Sandbox::build(Arms::Two, 1, 8080).unwrap();
    let r1 = sb.client.ns.clone();
    let r2 = Netns::new("r2").unwrap();
    let client = Netns::new("pmtu-client").unwrap();
    let (r1_side, r2_side) = veth(&r1, "10.0.6.1/24", &r2, "10.0.6.2/24").unwrap();
    for p in [&r1_side, &r2_side] {
        p.ns.ip(&["link", "set", &p.ifname, "mtu", "1400"]).unwrap();
    }
    veth(&r2, "10.0.5.1/24", &client, "10.0.5.2/24").unwrap();
    for r in [&r1, &r2] {
        r.sysctl("net/ipv4/ip_forward", "1").unwrap();
    }
    client
        .ip(&["route", "add", "default", "via", "10.0.5.1"])
        .unwrap();
    r2.ip(&["route", "add", "default", "via", "10.0.6.1"])
        .unwrap();
    r1.ip(&["route", "add", "10.0.5.0/24", "via", "10.0.6.2"])
        .unwrap();
    let b = &sb.backends[0];
    let blob = start_blob(&b.ns, SocketAddr::from((b.addr, BLOB_PORT)), SIZE).unwrap();
    Bed {
        sb,
        client,
        _r2: r2,
        _blob: blob,
    }
}

fn config(bed: &Bed, lb_extra: &str) -> String {
    format!(
        "[lb]\ninterfaces = [{}]\nxdp_mode = \"native\"\n{lb_extra}\n\
         [[service]]\nname = \"blob\"\nvip = \"{VIP}:{BLOB_PORT}\"\n\
         backends = [{{ address = \"{}:{BLOB_PORT}\" }}]\n[service.check]\nkind = \"none\"\n",
        bed.sb.interfaces_toml(),
        bed.sb.backends[0].addr
    )
}

/// Downloads from the VIP for at most `limit`: the bytes received.
fn download(client: &Netns, limit: Duration) -> Vec<u8> {
    lb_tests::traffic::download(client, SocketAddr::from((VIP, BLOB_PORT)), SIZE, limit)
}

#[test]
fn path_mtu_discovery_works_through_lb_and_black_holes_without_translation() {
    let bed = bed();
    // Translation off: the router's error is dropped at lb, the backend keeps sending 1500-byte
    // packets, the download stalls after the handshake and the first small segments.
    let off = Daemon::start(&bed.sb.lb, &config(&bed, "translate_icmp = false")).unwrap();
    let got = download(&bed.client, Duration::from_secs(4));
    assert!(
        got.len() < SIZE / 4,
        "the download went through without translation ({} bytes): the test proves nothing",
        got.len()
    );
    let s = off.status().unwrap();
    assert!(s.counter("drop_icmp").unwrap() > 0, "{:?}", s.counters);
    drop(off);

    // Translation on: the error reaches the backend, which lowers its path MTU.
    let on = Daemon::start(&bed.sb.lb, &config(&bed, "")).unwrap();
    let started = Instant::now();
    let got = download(&bed.client, Duration::from_secs(30));
    let took = started.elapsed();
    assert_eq!(got.len(), SIZE, "{} of {SIZE} bytes in {took:?}", got.len());
    assert!(got == blob(SIZE), "the content differs");
    let s = on.status().unwrap();
    let translated = s.counter("icmp_translated_in").unwrap();
    assert!(translated > 0, "{:?}", s.counters);
    eprintln!(
        "2 MiB through a 1400-byte link in {took:?}; {translated} ICMP errors translated to the backend"
    );
    // The backend learnt the path MTU of its flow to the SNAT address.
    let b = &bed.sb.backends[0];
    let route = b.ns.ip(&["route", "get", "10.0.2.1"]).unwrap();
    assert!(route.contains("mtu 1400"), "{route}");
}

/// A VIP answers ping like a host; a port or protocol no service has is dropped and counted,
/// never passed to the kernel (which would route it back out).
#[test]
fn a_vip_answers_ping_and_drops_what_no_service_takes() {
    require_root();
    let sb = Sandbox::build(Arms::Two, 1, 8080).unwrap();
    let daemon = Daemon::start(&sb.lb, &sb.config(80, &[], "")).unwrap();
    let out = sb
        .client
        .ns
        .exec(&["ping", "-c", "3", "-i", "0.2", "-W", "2", &VIP.to_string()])
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("3 received"), "{text}");
    // A SYN to port 81 (no service): no answer, counted; lb's kernel never sees it (before, it
    // got it, had no route to the VIP, and counted InNoRoutes; with a default route it would
    // have sent it back out).
    let kernel = || {
        let snmp = sb
            .lb
            .exec(&["cat", "/proc/net/netstat", "/proc/net/snmp"])
            .unwrap();
        let snmp = String::from_utf8_lossy(&snmp.stdout).into_owned();
        (
            stat(&snmp, "IpExt:", "InNoRoutes"),
            stat(&snmp, "Ip:", "ForwDatagrams"),
        )
    };
    let before = kernel();
    let to = SocketAddr::from((VIP, 81));
    let refused = sb
        .client
        .ns
        .enter(|| std::net::TcpStream::connect_timeout(&to, Duration::from_millis(500)));
    assert!(refused.is_err());
    let s = daemon.status().unwrap();
    assert_eq!(s.counter("icmp_echo_reply"), Some(3), "{:?}", s.counters);
    assert!(
        s.counter("drop_no_service").unwrap() >= 1,
        "{:?}",
        s.counters
    );
    assert_eq!(
        kernel(),
        before,
        "(InNoRoutes, ForwDatagrams) of lb's kernel moved"
    );
}

/// Field `field` of the `prefix` lines of /proc/net/snmp or netstat; 0 if absent.
fn stat(text: &str, prefix: &str, field: &str) -> u64 {
    lb_tests::netns::stat_field(text, prefix, field).unwrap_or(0)
}
