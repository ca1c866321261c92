//! Real IPv6 traffic through the XDP datapath in namespaces, beside IPv4 on the same links: the
//! dual-stack sandbox's TCP and UDP servers on 3 backends, flows spread, 20 MB streams compared
//! by digest, weights, drain and a cleared health flag; the same backends' IPv4 services in the
//! same datapath at once. The datapath runs in-process, as in forwarding.rs.

use std::net::{SocketAddr, TcpStream};

use lb_common::counter;
use lb_tests::{
    inproc::InProcess,
    netns::Netns,
    require_root,
    servers::{self, connect},
    topology::{Arms, Sandbox, VIP, VIP6},
    traffic::{assert_shares, echo_once, echo_transfer, udp_echo},
};

const PORT: u16 = 8080;
/// The first service of the dual config (tcp6, udp6, tcp, udp).
const TCP6: usize = 0;

fn vip6() -> SocketAddr {
    SocketAddr::from((VIP6, 80))
}

fn sandbox(arms: Arms, weights: &[u32]) -> (Sandbox, InProcess) {
    require_root();
    let sb = Sandbox::build(arms, 3, PORT).unwrap();
    let config = sb.config6(80, weights, "", true).replace(
        "[lb]\n",
        "[lb]\nconntrack = { size = 65536, ipv6_size = 65536 }\n",
    );
    let lb = InProcess::start(&sb, &config).unwrap();
    (sb, lb)
}

fn third() -> [(&'static str, f64); 3] {
    let t = 1.0 / 3.0;
    [("backend-0", t), ("backend-1", t), ("backend-2", t)]
}

fn check(arms: Arms, flows: usize, transfers: usize) {
    let (sb, lb) = sandbox(arms, &[]);
    let seen = servers::spread(&sb.client.ns, vip6(), flows);
    assert_shares(&seen, flows, &third());

    let streams: Vec<_> = (0..transfers)
        .map(|i| {
            let (conn, _) = connect(&sb.client.ns, vip6()).unwrap();
            std::thread::spawn(move || echo_transfer(conn, 20 << 20, i as u8))
        })
        .collect();
    for s in streams {
        s.join().unwrap();
    }

    let udp = udp_echo(&sb.client.ns, SocketAddr::from((VIP6, 80)), 60);
    assert_eq!(udp.values().sum::<usize>(), 60);
    assert!(udp.len() >= 2, "UDP flows spread over backends: {udp:?}");

    // The IPv4 services of the same backends, in the same datapath, at the same time.
    let v4 = servers::spread(&sb.client.ns, SocketAddr::from((VIP, 80)), 300);
    assert_eq!(v4.values().sum::<usize>(), 300);
    assert_eq!(v4.len(), 3, "{v4:?}");

    let stats = lb.stats();
    let fwd = if arms == Arms::One {
        counter::FWD_TX
    } else {
        counter::FWD_REDIRECT
    };
    assert!(stats.counter(fwd) > 0, "{stats:?}");
    assert!(stats.counter(counter::REPLY) > 0);
    for c in [
        counter::DROP_NO_SNAT_PORT,
        counter::DROP_NO_ROUTE,
        counter::DROP_MALFORMED,
    ] {
        assert_eq!(
            stats.counter(c),
            0,
            "{}: {stats:?}",
            counter::NAMES[c as usize]
        );
    }
    // The IPv6 TCP service's backends took every IPv6 flow.
    let ids: Vec<u32> = (0..3)
        .map(|b| lb.balancer.backend_id(TCP6, b).unwrap())
        .collect();
    let tcp6_new: u64 = ids
        .iter()
        .map(|&id| stats.backends[id as usize].new_flows)
        .sum();
    assert!(tcp6_new >= (flows + transfers) as u64, "{stats:?}");
}

#[test]
fn two_arm_ipv6_spreads_flows_keeps_20mb_streams_intact_beside_ipv4() {
    check(Arms::Two, 3000, 3);
}

#[test]
fn one_arm_ipv6_spreads_flows_keeps_20mb_streams_intact_beside_ipv4() {
    check(Arms::One, 1500, 2);
}

#[test]
fn ipv6_weights_1_2_3_shape_the_spread() {
    let (sb, _lb) = sandbox(Arms::Two, &[1, 2, 3]);
    let seen = servers::spread(&sb.client.ns, vip6(), 3000);
    assert_shares(
        &seen,
        3000,
        &[
            ("backend-0", 1.0 / 6.0),
            ("backend-1", 2.0 / 6.0),
            ("backend-2", 3.0 / 6.0),
        ],
    );
}

fn connect_to(client: &Netns, name: &str) -> TcpStream {
    lb_tests::traffic::connect_to(client, vip6(), name)
}

#[test]
fn ipv6_drain_keeps_connections_and_a_cleared_flag_stops_new_flows() {
    let (sb, mut lb) = sandbox(Arms::Two, &[]);
    let mut conn = connect_to(&sb.client.ns, "backend-0");
    echo_once(&mut conn, b"before");
    lb.set_drained(TCP6, 0, true);
    let seen = servers::spread(&sb.client.ns, vip6(), 300);
    assert!(!seen.contains_key("backend-0"), "{seen:?}");
    echo_once(&mut conn, &[7u8; 1 << 20]);

    lb.set_up(TCP6, 1, false);
    let seen = servers::spread(&sb.client.ns, vip6(), 300);
    assert_eq!(seen.keys().collect::<Vec<_>>(), ["backend-2"], "{seen:?}");
    lb.set_up(TCP6, 1, true);
    let seen = servers::spread(&sb.client.ns, vip6(), 300);
    assert!(seen.get("backend-1").copied().unwrap_or(0) > 50, "{seen:?}");
    // The UDP service's backends were not touched.
    let udp = udp_echo(&sb.client.ns, SocketAddr::from((VIP6, 80)), 30);
    assert!(udp.len() >= 2, "{udp:?}");
}

#[test]
fn the_ipv6_vip_answers_ping() {
    let (sb, lb) = sandbox(Arms::Two, &[]);
    let before = lb.stats().counter(counter::ICMP_ECHO_REPLY);
    let vip = VIP6.to_string();
    let ping = sb
        .client
        .ns
        .exec(&["ping", "-6", "-c", "3", "-i", "0.2", "-W", "2", &vip])
        .unwrap();
    assert!(ping.status.success(), "{ping:?}");
    assert!(lb.stats().counter(counter::ICMP_ECHO_REPLY) >= before + 3);
}
