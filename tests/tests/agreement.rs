//! Two lb hosts with the same config pick the same backend for the same flow, without sharing
//! any state: the same 10,000 new flows of each family (and of a direct-server-return service)
//! fed through two datapaths loaded independently, each in a network of its own, land on the
//! same backends. What makes two hosts disagree, and for how long: a health verdict one host
//! has and the other has not yet (until its own probes agree, at most the failure window), or a
//! different config (until both run the same); the test shows the first: flows move only from
//! the backend one host took out.

use std::collections::HashMap;

use lb_tests::{
    fixture::{XDP_REDIRECT, run_once},
    packet::{Packet, TCP_SYN},
    require_root,
    testnet::TestNet,
};

const SERVICES: &str = r#"
[[service]]
name = "web"
vip = "10.100.0.1:80"
backends = [{ address = "10.0.2.2:8080" }, { address = "10.0.2.3:8080" }, { address = "10.0.2.4:8080" }, { address = "10.0.2.5:8080", weight = 2 }, { address = "10.0.2.6:8080" }]

[[service]]
name = "web6"
vip = "[2001:db8:100::1]:80"
backends = [{ address = "[2001:db8:2::2]:8080" }, { address = "[2001:db8:2::3]:8080" }, { address = "[2001:db8:2::4]:8080" }]

[[service]]
name = "dsr"
vip = "10.100.0.2:80"
forwarding = "gue"
backends = [{ address = "10.0.2.2:80" }, { address = "10.0.2.3:80" }, { address = "10.0.2.4:80" }, { address = "10.0.2.5:80" }]
"#;

const FLOWS: usize = 10_000;

fn host() -> TestNet {
    TestNet::new(
        "ring_size = 65537\nsyn_rate_per_source = 0\nconntrack = { size = 65536, ipv6_size = 65536 }",
        SERVICES,
    )
    .unwrap()
}

/// The SYNs of `FLOWS` flows to `vip` from many clients and ports.
fn flows(vip: &str) -> Vec<Vec<u8>> {
    (0..FLOWS)
        .map(|i| {
            let port = 1024 + (i * 7919) % 60000;
            let client = if vip.starts_with('[') {
                format!("[2001:db8:1::{:x}]:{port}", 2 + i % 200)
            } else {
                format!("10.0.1.{}:{port}", 2 + i % 200)
            };
            Packet::tcp(&client, vip, TCP_SYN).build()
        })
        .collect()
}

/// The backend (IP address, as it appears in the frame lb sends) each flow was sent to.
fn picks(net: &TestNet, frames: &[Vec<u8>]) -> Vec<String> {
    net.ns.enter(|| {
        frames
            .iter()
            .map(|f| {
                let out = run_once(net.dp.program(), f, net.vc).unwrap();
                assert_eq!(out.verdict, XDP_REDIRECT, "a SYN was not forwarded");
                destination(&out.output)
            })
            .collect()
    })
}

/// The destination address of an Ethernet frame (IPv4 or IPv6; the outer one if encapsulated).
fn destination(frame: &[u8]) -> String {
    match u16::from_be_bytes([frame[12], frame[13]]) {
        0x86dd => {
            let b: [u8; 16] = frame[38..54].try_into().unwrap();
            std::net::Ipv6Addr::from(b).to_string()
        }
        _ => {
            let b: [u8; 4] = frame[30..34].try_into().unwrap();
            std::net::Ipv4Addr::from(b).to_string()
        }
    }
}

#[test]
fn two_hosts_with_the_same_config_pick_the_same_backends() {
    require_root();
    let (a, b) = (host(), host());
    for vip in ["10.100.0.1:80", "[2001:db8:100::1]:80", "10.100.0.2:80"] {
        let frames = flows(vip);
        let (pa, pb) = (picks(&a, &frames), picks(&b, &frames));
        let differ = pa.iter().zip(&pb).filter(|(x, y)| x != y).count();
        assert_eq!(
            differ, 0,
            "{vip}: {differ} of {FLOWS} flows picked differently"
        );
        let mut spread: HashMap<&str, usize> = HashMap::new();
        for p in &pa {
            *spread.entry(p).or_default() += 1;
        }
        assert!(spread.len() >= 3, "{vip}: {spread:?}");
        eprintln!("{vip}: {FLOWS} flows, both hosts alike: {spread:?}");
    }
}

#[test]
fn a_verdict_only_one_host_has_moves_only_that_backends_flows() {
    require_root();
    let (a, mut b) = (host(), host());
    // Host b has found backend 10.0.2.4 (index 2 of "web") down; host a not yet.
    b.balancer.set_up(0, 2, false, &mut b.dp).unwrap();
    let frames = flows("10.100.0.1:80");
    let (pa, pb) = (picks(&a, &frames), picks(&b, &frames));
    let mut moved = 0;
    for (x, y) in pa.iter().zip(&pb) {
        if x != y {
            assert_eq!(
                x, "10.0.2.4",
                "a flow of a healthy backend moved: {x} → {y}"
            );
            moved += 1;
        }
    }
    let on_down = pa.iter().filter(|p| *p == "10.0.2.4").count();
    assert_eq!(
        moved, on_down,
        "every flow of the down backend moved, and only those"
    );
    assert!(!pb.iter().any(|p| p == "10.0.2.4"));
    eprintln!("{moved} of {FLOWS} flows disagree: exactly those of the backend host b took out");
}
