//! ICMPv6 through a running lb on real networks: path MTU discovery over IPv6 across a link with
//! a smaller MTU between the client and lb, as icmp_e2e.rs does for IPv4. IPv6 routers never
//! fragment: a packet too big for the next link is dropped and "packet too big" goes to its
//! source, so without translation a full-NAT balancer black-holes every large reply.
//!
//! ```text
//!  client 2001:db8:5::2 ─ ::1 [r2] 2001:db8:6::2 ═══ MTU 1400 ═══ ::1 [r1] 2001:db8:1::2 ─ [lb] ─ backend
//! ```
//! r1 is the sandbox's client namespace turned router. The backend sends 1500-byte packets (the
//! client's MSS says 1440); r1 answers "packet too big" to their source, the IPv6 VIP. Only if
//! lb translates that error to the backend does the backend lower its path MTU.

use std::{
    net::SocketAddr,
    time::{Duration, Instant},
};

use lb_tests::{
    daemon::Daemon,
    netns::{Netns, veth},
    require_root,
    servers::{blob, start_blob},
    topology::{Arms, Sandbox, VIP6},
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
    let client = Netns::new("pmtu6-client").unwrap();
    let (r1_side, r2_side) = veth(&r1, "2001:db8:6::1/64", &r2, "2001:db8:6::2/64").unwrap();
    for p in [&r1_side, &r2_side] {
        p.ns.ip(&["link", "set", &p.ifname, "mtu", "1400"]).unwrap();
    }
    veth(&r2, "2001:db8:5::1/64", &client, "2001:db8:5::2/64").unwrap();
    for r in [&r1, &r2] {
        r.sysctl("net/ipv6/conf/all/forwarding", "1").unwrap();
    }
    client
        .ip(&["-6", "route", "add", "default", "via", "2001:db8:5::1"])
        .unwrap();
    r2.ip(&["-6", "route", "add", "default", "via", "2001:db8:6::1"])
        .unwrap();
    r1.ip(&[
        "-6",
        "route",
        "add",
        "2001:db8:5::/64",
        "via",
        "2001:db8:6::2",
    ])
    .unwrap();
    let b = &sb.backends[0];
    let blob = start_blob(&b.ns, SocketAddr::from((b.addr6, BLOB_PORT)), SIZE).unwrap();
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
         [[service]]\nname = \"blob6\"\nvip = \"[{VIP6}]:{BLOB_PORT}\"\n\
         backends = [{{ address = \"[{}]:{BLOB_PORT}\" }}]\n[service.check]\nkind = \"none\"\n",
        bed.sb.interfaces_toml(),
        bed.sb.backends[0].addr6
    )
}

/// Downloads from the VIP for at most `limit`: the bytes received.
fn download(client: &Netns, limit: Duration) -> Vec<u8> {
    lb_tests::traffic::download(client, SocketAddr::from((VIP6, BLOB_PORT)), SIZE, limit)
}

#[test]
fn ipv6_path_mtu_discovery_works_through_lb_and_black_holes_without_translation() {
    let bed = bed();
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
        "2 MiB over IPv6 through a 1400-byte link in {took:?}; {translated} packet-too-big errors translated to the backend"
    );
    // The backend learnt the path MTU of its flow to the SNAT address.
    let b = &bed.sb.backends[0];
    let route = b.ns.ip(&["-6", "route", "get", "2001:db8:2::1"]).unwrap();
    assert!(route.contains("mtu 1400"), "{route}");
}
