//! The XDP program through BPF_PROG_TEST_RUN: every parse path and the forwarding paths, each
//! with its verdict, exact output bytes and the counter that must count it, in the fixed
//! network of [`lb_tests::testnet`].

use lb::dataplane::monotonic_coarse_ns;
use lb_common::{SYN_EPOCH_SHIFT, counter::*};
use lb_tests::{
    fixture::{Fixture, XDP_DROP, XDP_PASS, XDP_REDIRECT, XDP_TX, run_once, verdict_name},
    packet::{
        CLIENT_MAC, ICMP_DEST_UNREACH, ICMP_FRAG_NEEDED, ICMP_TIME_EXCEEDED, LB_MAC, Packet,
        TCP_ACK, TCP_FIN, TCP_PSH, TCP_RST, TCP_SYN, verify_checksums,
    },
    require_root,
    testnet::{BACKEND_MAC, ONE_ARM_MAC, TestNet},
};

const CLIENT: &str = "10.0.1.2";

const SERVICES: &str = r#"
[[service]]
name = "web"
vip = "10.100.0.1:80"
backends = [{ address = "10.0.2.2:8080" }]

[[service]]
name = "dns"
vip = "10.100.0.1:53"
protocol = "udp"
backends = [{ address = "10.0.2.2:5353" }]

[[service]]
name = "one-arm"
vip = "10.100.0.2:80"
backends = [{ address = "10.0.1.20:8080" }]

[[service]]
name = "drained"
vip = "10.100.0.3:80"
backends = [{ address = "10.0.2.2:9000", weight = 0 }]
"#;

fn env() -> TestNet {
    require_root();
    TestNet::new("ring_size = 1009", SERVICES).unwrap()
}

fn snat_port(e: &TestNet, client: &str, cport: u16, vip: &str, vport: u16, proto: u8) -> u16 {
    e.snat_port(client, cport, vip, vport, proto)
}

#[test]
fn forwarding_and_return_paths() {
    let e = env();
    let vip = "10.100.0.1";
    let p = snat_port(&e, CLIENT, 40000, vip, 80, 6);
    let client_syn = Packet::tcp("10.0.1.2:40000", "10.100.0.1:80", TCP_SYN);
    let to_backend = |pkt: Packet| pkt.ttl(63).macs(e.vb_mac, BACKEND_MAC).build();
    let snat = format!("10.0.2.1:{p}");
    let pu = snat_port(&e, CLIENT, 40001, vip, 53, 17);
    let snat_udp = format!("10.0.2.1:{pu}");
    let pz = snat_port(&e, CLIENT, 40002, vip, 53, 17);
    let p1 = snat_port(&e, CLIENT, 40003, "10.100.0.2", 80, 6);
    let pm = snat_port(&e, CLIENT, 40004, vip, 80, 6);
    let fixtures = vec![
        Fixture::new(
            "SYN to the VIP: full NAT to the backend, redirected to the backend side",
            client_syn.clone().build(),
            XDP_REDIRECT,
            FWD_REDIRECT,
        )
        .ingress(e.vc)
        .output(to_backend(Packet::tcp(&snat, "10.0.2.2:8080", TCP_SYN)))
        .also(CT_NEW),
        Fixture::new(
            "established packet with data: same backend and SNAT port",
            Packet::tcp("10.0.1.2:40000", "10.100.0.1:80", TCP_ACK | TCP_PSH).seq(1001, 5001).payload(b"GET / HTTP/1.1\r\n\r\n").build(),
            XDP_REDIRECT,
            FWD_REDIRECT,
        )
        .ingress(e.vc)
        .output(to_backend(Packet::tcp(&snat, "10.0.2.2:8080", TCP_ACK | TCP_PSH).seq(1001, 5001).payload(b"GET / HTTP/1.1\r\n\r\n"))),
        Fixture::new(
            "reply from the backend: back to VIP → client, to the client's MAC, redirected to its side",
            Packet::tcp("10.0.2.2:8080", &snat, TCP_SYN | TCP_ACK).seq(5000, 1001).macs(BACKEND_MAC, e.vb_mac).build(),
            XDP_REDIRECT,
            FWD_REDIRECT,
        )
        .ingress(e.vb)
        .output(Packet::tcp("10.100.0.1:80", "10.0.1.2:40000", TCP_SYN | TCP_ACK).seq(5000, 1001).ttl(63).macs(LB_MAC, CLIENT_MAC).build())
        .also(REPLY),
        Fixture::new(
            "reply to a SNAT port no flow holds: the host's own traffic, passed",
            Packet::tcp("10.0.2.2:8080", "10.0.2.1:12345", TCP_SYN | TCP_ACK).macs(BACKEND_MAC, e.vb_mac).build(),
            XDP_PASS,
            PASS_NOT_VIP,
        )
        .ingress(e.vb),
        Fixture::new(
            "client FIN: forwarded",
            Packet::tcp("10.0.1.2:40000", "10.100.0.1:80", TCP_FIN | TCP_ACK).seq(1019, 5001).build(),
            XDP_REDIRECT,
            FWD_REDIRECT,
        )
        .ingress(e.vc)
        .output(to_backend(Packet::tcp(&snat, "10.0.2.2:8080", TCP_FIN | TCP_ACK).seq(1019, 5001))),
        Fixture::new(
            "UDP to the VIP",
            Packet::udp("10.0.1.2:40001", "10.100.0.1:53").payload(b"query").build(),
            XDP_REDIRECT,
            FWD_REDIRECT,
        )
        .ingress(e.vc)
        .output(to_backend(Packet::udp(&snat_udp, "10.0.2.2:5353").payload(b"query")))
        .also(CT_NEW),
        Fixture::new(
            "UDP reply",
            Packet::udp("10.0.2.2:5353", &snat_udp).payload(b"answer").macs(BACKEND_MAC, e.vb_mac).build(),
            XDP_REDIRECT,
            FWD_REDIRECT,
        )
        .ingress(e.vb)
        .output(Packet::udp("10.100.0.1:53", "10.0.1.2:40001").payload(b"answer").ttl(63).macs(LB_MAC, CLIENT_MAC).build())
        .also(REPLY),
        Fixture::new(
            "UDP with checksum 0: stays 0",
            Packet::udp("10.0.1.2:40002", "10.100.0.1:53").payload(b"q").udp_zero_checksum().build(),
            XDP_REDIRECT,
            FWD_REDIRECT,
        )
        .ingress(e.vc)
        .output(to_backend(Packet::udp(&format!("10.0.2.1:{pz}"), "10.0.2.2:5353").payload(b"q").udp_zero_checksum()))
        .also(CT_NEW),
        Fixture::new(
            "one-arm: the backend is on the ingress side, XDP_TX",
            Packet::tcp("10.0.1.2:40003", "10.100.0.2:80", TCP_SYN).build(),
            XDP_TX,
            FWD_TX,
        )
        .ingress(e.vc)
        .output(Packet::tcp(&format!("10.0.1.1:{p1}"), "10.0.1.20:8080", TCP_SYN).ttl(63).macs(e.vc_mac, ONE_ARM_MAC).build())
        .also(CT_NEW),
        Fixture::new(
            "TCP without SYN and without a table entry: re-created, counted",
            Packet::tcp("10.0.1.2:40004", "10.100.0.1:80", TCP_ACK).seq(7, 7).build(),
            XDP_REDIRECT,
            FWD_REDIRECT,
        )
        .ingress(e.vc)
        .output(to_backend(Packet::tcp(&format!("10.0.2.1:{pm}"), "10.0.2.2:8080", TCP_ACK).seq(7, 7)))
        .also(CT_MISS_MIDSTREAM)
        .also(CT_NEW),
        Fixture::new(
            "802.1Q-tagged SYN with IP options after the FIN: a new connection, tag and options kept",
            client_syn.clone().vlan(10).ip_options(&[1, 1, 1, 1]).build(),
            XDP_REDIRECT,
            FWD_REDIRECT,
        )
        .ingress(e.vc)
        .output(to_backend(Packet::tcp(&snat, "10.0.2.2:8080", TCP_SYN).vlan(10).ip_options(&[1, 1, 1, 1])))
        .also(VLAN)
        .also(IP_OPTIONS)
        .also(CT_NEW),
        Fixture::new("TTL 1 to the VIP", client_syn.clone().ttl(1).build(), XDP_DROP, DROP_TTL).ingress(e.vc),
        Fixture::new(
            "only backend drained (weight 0): no backend for a new flow",
            Packet::tcp("10.0.1.2:40005", "10.100.0.3:80", TCP_SYN).build(),
            XDP_DROP,
            DROP_NO_BACKEND,
        )
        .ingress(e.vc),
        Fixture::new(
            "to the balancer's own address (a SNAT address): passed",
            Packet::tcp("10.0.1.2:40006", "10.0.1.1:22", TCP_SYN).build(),
            XDP_PASS,
            PASS_NOT_VIP,
        )
        .ingress(e.vc),
        Fixture::new(
            "fragment to a SNAT address (the host's own): passed",
            Packet::udp("10.0.1.2:40007", "10.0.1.1:53").fragment(true, 0).build(),
            XDP_PASS,
            PASS_FRAGMENT,
        )
        .ingress(e.vc),
    ];
    for f in &fixtures {
        if let Some(out) = &f.output {
            verify_checksums(out).unwrap_or_else(|err| panic!("{}: expected frame: {err}", f.desc));
        }
    }
    e.run(&fixtures);
}

#[test]
fn parse_paths_have_defined_counted_verdicts() {
    let e = env();
    let syn = Packet::tcp("10.0.1.2:40100", "10.100.0.1:80", TCP_SYN);
    let syn_frame = syn.build();
    let udp = Packet::udp("10.0.1.2:40101", "10.100.0.1:53").payload(b"query");
    let other = "10.0.1.9:22";
    let truncated = |mut f: Vec<u8>, len: usize| {
        f.truncate(len);
        f
    };
    let with_byte = |mut f: Vec<u8>, at: usize, v: u8| {
        f[at] = v;
        f
    };
    let fixtures = vec![
        Fixture::new(
            "TCP to another address",
            Packet::tcp("10.0.1.2:1000", other, TCP_SYN).build(),
            XDP_PASS,
            PASS_NOT_VIP,
        ),
        // A VIP is routed to lb, not configured on it: the kernel would route a packet for a
        // port or protocol no service has back out (a loop), so it is dropped (issue 13).
        Fixture::new(
            "TCP to the VIP address, other port: dropped, never passed",
            Packet::tcp("10.0.1.2:1", "10.100.0.1:443", TCP_SYN).build(),
            XDP_DROP,
            DROP_NO_SERVICE,
        ),
        Fixture::new(
            "UDP to the TCP service's port",
            Packet::udp("10.0.1.2:1", "10.100.0.1:80").build(),
            XDP_DROP,
            DROP_NO_SERVICE,
        ),
        Fixture::new(
            "TCP to the UDP service's port",
            Packet::tcp("10.0.1.2:1", "10.100.0.1:53", TCP_SYN).build(),
            XDP_DROP,
            DROP_NO_SERVICE,
        ),
        Fixture::new(
            "another protocol (GRE) to the VIP address",
            Packet::ip_proto("10.0.1.2:0", "10.100.0.1:0", 47)
                .payload(&[0; 8])
                .build(),
            XDP_DROP,
            DROP_NO_SERVICE,
        ),
        Fixture::new(
            "another protocol to another address: passed",
            Packet::ip_proto("10.0.1.2:0", other, 47)
                .payload(&[0; 8])
                .build(),
            XDP_PASS,
            PASS_NOT_VIP,
        ),
        Fixture::new(
            "tagged TCP to another address",
            Packet::tcp("10.0.1.2:1000", other, TCP_SYN).vlan(3).build(),
            XDP_PASS,
            PASS_NOT_VIP,
        )
        .also(VLAN),
        Fixture::new(
            "ARP",
            syn.clone().ether_type(0x0806).build(),
            XDP_PASS,
            PASS_NOT_IP,
        ),
        Fixture::new(
            "IPv4 bytes behind the IPv6 EtherType",
            syn.clone().ether_type(0x86dd).build(),
            XDP_PASS,
            PASS_MALFORMED,
        ),
        Fixture::new(
            "two stacked 802.1Q tags",
            syn.clone().vlan(5).ether_type(0x8100).build(),
            XDP_PASS,
            PASS_NOT_IP,
        )
        .also(VLAN),
        Fixture::new(
            "first fragment to the VIP",
            syn.clone().fragment(true, 0).build(),
            XDP_DROP,
            DROP_FRAGMENT,
        ),
        Fixture::new(
            "later fragment to the VIP",
            syn.clone().fragment(false, 100).build(),
            XDP_DROP,
            DROP_FRAGMENT,
        ),
        Fixture::new(
            "fragment to another address",
            Packet::udp("10.0.1.2:1000", other)
                .fragment(true, 0)
                .build(),
            XDP_PASS,
            PASS_FRAGMENT,
        ),
        // (Frames shorter than 14 bytes never reach XDP: the kernel and BPF_PROG_TEST_RUN refuse them.)
        Fixture::new(
            "Ethernet header only",
            truncated(syn_frame.clone(), 14),
            XDP_PASS,
            PASS_MALFORMED,
        ),
        Fixture::new(
            "VLAN tag cut",
            truncated(syn.clone().vlan(1).build(), 16),
            XDP_PASS,
            PASS_MALFORMED,
        ),
        Fixture::new(
            "IPv4 header cut at 19 bytes",
            truncated(syn_frame.clone(), 33),
            XDP_PASS,
            PASS_MALFORMED,
        ),
        Fixture::new(
            "IPv4 version 6 in an IPv4 EtherType",
            with_byte(syn_frame.clone(), 14, 0x65),
            XDP_DROP,
            DROP_MALFORMED,
        ),
        Fixture::new(
            "IHL 4",
            with_byte(syn_frame.clone(), 14, 0x44),
            XDP_DROP,
            DROP_MALFORMED,
        ),
        Fixture::new(
            "IHL beyond the datagram",
            with_byte(syn_frame.clone(), 14, 0x4f),
            XDP_DROP,
            DROP_MALFORMED,
        ),
        Fixture::new(
            "total length beyond the frame",
            with_byte(syn_frame.clone(), 16, 0x05),
            XDP_DROP,
            DROP_MALFORMED,
        ),
        Fixture::new(
            "TCP header cut",
            truncated(syn_frame.clone(), 14 + 20 + 10),
            XDP_DROP,
            DROP_MALFORMED,
        ),
        Fixture::new(
            "TCP data offset 4",
            with_byte(syn_frame.clone(), 14 + 20 + 12, 0x40),
            XDP_DROP,
            DROP_MALFORMED,
        ),
        Fixture::new(
            "TCP data offset beyond the datagram",
            with_byte(syn_frame.clone(), 14 + 20 + 12, 0xf0),
            XDP_DROP,
            DROP_MALFORMED,
        ),
        Fixture::new(
            "UDP header cut",
            truncated(udp.build(), 14 + 20 + 4),
            XDP_DROP,
            DROP_MALFORMED,
        ),
        Fixture::new(
            "UDP length 7",
            with_byte(udp.build(), 14 + 20 + 5, 7),
            XDP_DROP,
            DROP_MALFORMED,
        ),
        Fixture::new(
            "UDP length beyond the datagram",
            with_byte(udp.build(), 14 + 20 + 5, 200),
            XDP_DROP,
            DROP_MALFORMED,
        ),
        Fixture::new(
            "cut TCP to another address",
            truncated(Packet::tcp("10.0.1.2:1000", other, TCP_SYN).build(), 40),
            XDP_PASS,
            PASS_MALFORMED,
        ),
    ];
    let fixtures: Vec<Fixture> = fixtures.into_iter().map(|f| f.ingress(e.vc)).collect();
    e.run(&fixtures);
}

#[test]
fn padding_after_the_datagram_is_forwarded_as_is() {
    let e = env();
    let mut frame = Packet::tcp("10.0.1.2:40200", "10.100.0.1:80", TCP_SYN).build();
    frame.extend_from_slice(&[0; 6]);
    let p = snat_port(&e, CLIENT, 40200, "10.100.0.1", 80, 6);
    let mut want = Packet::tcp(&format!("10.0.2.1:{p}"), "10.0.2.2:8080", TCP_SYN)
        .ttl(63)
        .macs(e.vb_mac, BACKEND_MAC)
        .build();
    want.extend_from_slice(&[0; 6]);
    e.run(&[Fixture::new(
        "SYN with Ethernet padding",
        frame,
        XDP_REDIRECT,
        FWD_REDIRECT,
    )
    .ingress(e.vc)
    .output(want)
    .also(CT_NEW)]);
}

#[test]
fn all_backends_unavailable_policies() {
    require_root();
    let services = |policy: &str| {
        format!(
            "[[service]]\nname = \"web\"\nvip = \"10.100.0.1:80\"\non_all_unhealthy = \"{policy}\"\n\
             backends = [{{ address = \"10.0.2.2:8080\" }}, {{ address = \"10.0.2.3:8080\" }}]\n"
        )
    };
    for (policy, verdict, counter) in [
        ("drop", XDP_DROP, DROP_NO_BACKEND),
        ("use-all", XDP_REDIRECT, FWD_REDIRECT),
        ("first", XDP_REDIRECT, FWD_REDIRECT),
    ] {
        let mut e = TestNet::new("ring_size = 1009", &services(policy)).unwrap();
        for b in 0..2 {
            e.balancer.set_up(0, b, false, &mut e.dp).unwrap();
        }
        let syn = Packet::tcp("10.0.1.2:41000", "10.100.0.1:80", TCP_SYN).build();
        let mut f = Fixture::new(
            format!("{policy}: SYN while every backend is down"),
            syn,
            verdict,
            counter,
        )
        .ingress(e.vc);
        if policy == "first" {
            let p = e.snat_port(CLIENT, 41000, "10.100.0.1", 80, 6);
            f = f
                .output(
                    Packet::tcp(&format!("10.0.2.1:{p}"), "10.0.2.2:8080", TCP_SYN)
                        .ttl(63)
                        .macs(e.vb_mac, BACKEND_MAC)
                        .build(),
                )
                .also(CT_NEW);
        } else if policy == "use-all" {
            // Forwarded somewhere; which backend is the ring's business.
            let out =
                e.ns.enter(|| lb_tests::fixture::run_once(e.dp.program(), &f.input, e.vc))
                    .unwrap();
            assert_eq!(out.verdict, XDP_REDIRECT, "{policy}");
            continue;
        }
        e.run(&[f]);
    }
}

/// A SYN flood cannot exhaust the table into silence: live flows it overwrites are counted,
/// and an overwritten flow's next packet re-creates it on the same backend.
#[test]
fn a_flood_overwrites_counted_entries_and_flows_recover() {
    require_root();
    let e = TestNet::new(
        "ring_size = 1009\nsnat_ports = \"1024-65535\"\nconntrack = { size = 1024 }",
        SERVICES,
    )
    .unwrap();
    let run = |frame: &[u8]| {
        e.ns.enter(|| lb_tests::fixture::run_once(e.dp.program(), frame, e.vc))
            .unwrap()
    };
    let first = run(&Packet::tcp("10.0.1.2:42000", "10.100.0.1:80", TCP_SYN).build());
    assert_eq!(first.verdict, XDP_REDIRECT);
    // Handshake done: an established flow, which a flood of half-open ones must not push out.
    assert_eq!(
        run(&Packet::tcp("10.0.1.2:42000", "10.100.0.1:80", TCP_ACK).build()).verdict,
        XDP_REDIRECT
    );
    for i in 0..4000u32 {
        let client = format!("10.0.{}.{}:{}", 3 + i / 250, 1 + i % 250, 1024 + i);
        let out = run(&Packet::tcp(&client, "10.100.0.1:80", TCP_SYN).build());
        if out.verdict != XDP_REDIRECT {
            let stats = e.dp.stats().unwrap();
            let moved: Vec<String> = NAMES
                .iter()
                .zip(&stats.counters)
                .map(|(n, v)| format!("{n}={v}"))
                .collect();
            panic!(
                "flood SYN {i}: {}; {}",
                lb_tests::fixture::verdict_name(out.verdict),
                moved.join(" ")
            );
        }
    }
    let stats = e.dp.stats().unwrap();
    assert!(
        stats.counter(CT_EVICTED) > 1000,
        "evictions counted: {}",
        stats.counter(CT_EVICTED)
    );
    let again = run(&Packet::tcp("10.0.1.2:42000", "10.100.0.1:80", TCP_ACK).build());
    assert_eq!(again.verdict, XDP_REDIRECT);
    assert_eq!(
        &again.output[30..34],
        &first.output[30..34],
        "same backend after re-creation"
    );
}

/// The test network with tables of 1,024 flows (NAT: 2,048) and no per-source SYN limit: a few
/// flows fill a set.
fn small_tables() -> TestNet {
    TestNet::new(
        "ring_size = 1009\nconntrack = { size = 1024 }\nsyn_rate_per_source = 0",
        SERVICES,
    )
    .unwrap()
}

/// Issue 13: a SYN flood whose flows the backend answers (SYN+ACK) and the attacker's kernel
/// resets filled the NAT table with flows a new one could not displace (they had replies), and
/// every new flow was dropped. Now such flows give way; an established flow keeps its entry,
/// both ways.
#[test]
fn answered_half_open_flows_make_room_in_the_nat_table() {
    require_root();
    let e = small_tables();
    let run = |frame: &[u8], ingress: u32| {
        e.ns.enter(|| lb_tests::fixture::run_once(e.dp.program(), frame, ingress))
            .unwrap()
    };
    let backend_side = |out: &[u8]| -> (String, String) {
        let ip = |o: usize| std::net::Ipv4Addr::new(out[o], out[o + 1], out[o + 2], out[o + 3]);
        let port = |o: usize| u16::from_be_bytes([out[o], out[o + 1]]);
        (
            format!("{}:{}", ip(26), port(34)),
            format!("{}:{}", ip(30), port(36)),
        )
    };
    // An established flow: SYN, the backend's SYN+ACK, the client's ACK, data both ways.
    let syn = run(
        &Packet::tcp("10.0.1.2:42500", "10.100.0.1:80", TCP_SYN).build(),
        e.vc,
    );
    assert_eq!(syn.verdict, XDP_REDIRECT);
    let (snat, backend) = backend_side(&syn.output);
    let reply = |flags| {
        Packet::tcp(&backend, &snat, flags)
            .payload(b"data")
            .macs(BACKEND_MAC, e.vb_mac)
            .build()
    };
    assert_eq!(run(&reply(TCP_SYN | TCP_ACK), e.vb).verdict, XDP_REDIRECT);
    assert_eq!(
        run(
            &Packet::tcp("10.0.1.2:42500", "10.100.0.1:80", TCP_ACK).build(),
            e.vc
        )
        .verdict,
        XDP_REDIRECT
    );
    assert_eq!(run(&reply(TCP_ACK | TCP_PSH), e.vb).verdict, XDP_REDIRECT);
    // The flood: 4000 SYNs, each answered by the backend and reset by the attacker.
    for i in 0..4000u32 {
        let client = format!("10.0.{}.{}:{}", 3 + i / 250, 1 + i % 250, 1024 + i);
        let out = run(
            &Packet::tcp(&client, "10.100.0.1:80", TCP_SYN).build(),
            e.vc,
        );
        assert_eq!(
            out.verdict,
            XDP_REDIRECT,
            "flood SYN {i}: {}",
            lb_tests::fixture::verdict_name(out.verdict)
        );
        let (fsnat, fbackend) = backend_side(&out.output);
        let syn_ack = Packet::tcp(&fbackend, &fsnat, TCP_SYN | TCP_ACK)
            .macs(BACKEND_MAC, e.vb_mac)
            .build();
        assert_eq!(
            run(&syn_ack, e.vb).verdict,
            XDP_REDIRECT,
            "flood SYN+ACK {i}"
        );
        let rst = Packet::tcp(&client, "10.100.0.1:80", TCP_RST).build();
        assert_eq!(run(&rst, e.vc).verdict, XDP_REDIRECT, "flood RST {i}");
    }
    let stats = e.dp.stats().unwrap();
    assert!(
        stats.counter(NAT_EVICTED) > 1000,
        "{}",
        stats.counter(NAT_EVICTED)
    );
    assert_eq!(
        stats.counter(DROP_NO_SNAT_PORT) + stats.counter(DROP_NAT_FULL),
        0
    );
    // The established flow still has both ways.
    let again = run(&reply(TCP_ACK | TCP_PSH), e.vb);
    assert_eq!(again.verdict, XDP_REDIRECT, "its reply was not translated");
    let fwd = run(
        &Packet::tcp("10.0.1.2:42500", "10.100.0.1:80", TCP_ACK).build(),
        e.vc,
    );
    assert_eq!(
        backend_side(&fwd.output),
        (snat, backend),
        "same SNAT port and backend"
    );
}

/// A flood's handshakes can push a real client's handshake out of the NAT table (both in their
/// handshake, the older gives way). Its connection entry must go with it: the flow kept going
/// out on its SNAT port while the backend's replies to it found no NAT entry, went to the
/// kernel and were answered with a RST (the synflood test's legitimate requests that hung).
/// Now its next packet makes the flow again, on the same port, and the replies find it.
#[test]
fn a_handshake_whose_nat_entry_gives_way_is_made_again_by_its_next_packet() {
    use lb_common::{FlowKey, ways};
    use lb_tests::testnet::{flow_hash, ne};
    require_root();
    let e = small_tables();
    let run = |frame: &[u8], ingress: u32| {
        e.ns.enter(|| run_once(e.dp.program(), frame, ingress))
            .unwrap()
    };
    let (vip, backend, snat_addr) = ("10.100.0.1", "10.0.2.2", "10.0.2.1");
    let ct_set =
        |client: &str, port: u16| ways(flow_hash(client, port, vip, 80, 6), e.params.table_mask);
    let nat_set = |client: &str, port: u16| {
        let snat = e.snat_port(client, port, vip, 80, 6);
        let key = FlowKey::new(ne(backend), ne(snat_addr), 8080u16.to_be(), snat.to_be(), 6);
        ways(key.hash(), e.params.nat_mask)
    };
    let from_backend = |snat: u16, flags: u8| {
        Packet::tcp(
            &format!("{backend}:8080"),
            &format!("{snat_addr}:{snat}"),
            flags,
        )
        .macs(BACKEND_MAC, e.vb_mac)
        .build()
    };
    let client = |c: &str, flags: u8| Packet::tcp(c, "10.100.0.1:80", flags).build();
    // The real client's handshake, answered by the backend.
    let (real, real_port) = (CLIENT, 42600);
    let real_addr = format!("{real}:{real_port}");
    let p = e.snat_port(real, real_port, vip, 80, 6);
    assert_eq!(
        run(&client(&real_addr, TCP_SYN), e.vc).verdict,
        XDP_REDIRECT
    );
    assert_eq!(
        run(&from_backend(p, TCP_SYN | TCP_ACK), e.vb).verdict,
        XDP_REDIRECT
    );
    // Two flood flows whose NAT entries share its set (not its connection table set), each
    // answered by the backend after it: younger handshakes.
    let flood: Vec<String> = (0..u32::MAX)
        .map(|i| {
            (
                format!("10.0.{}.{}", 3 + i / 250 % 200, 1 + i % 250),
                1024 + (i % 60000) as u16,
            )
        })
        .filter(|(a, port)| {
            nat_set(a, *port) == nat_set(real, real_port)
                && ct_set(a, *port) != ct_set(real, real_port)
        })
        .take(2)
        .map(|(a, port)| format!("{a}:{port}"))
        .collect();
    for f in &flood {
        let (a, port) = f.split_once(':').unwrap();
        let port: u16 = port.parse().unwrap();
        assert_eq!(
            run(&client(f, TCP_SYN), e.vc).verdict,
            XDP_REDIRECT,
            "flood SYN {f}"
        );
        let fp = e.snat_port(a, port, vip, 80, 6);
        assert_eq!(
            run(&from_backend(fp, TCP_SYN | TCP_ACK), e.vb).verdict,
            XDP_REDIRECT,
            "flood SYN+ACK {f}"
        );
    }
    assert_eq!(
        e.dp.stats().unwrap().counter(NAT_EVICTED),
        1,
        "the real handshake gave way"
    );
    // The client's ACK and request go out on the same port, and the backend's answer comes back.
    let ack = run(&client(&real_addr, TCP_ACK), e.vc);
    assert_eq!(ack.verdict, XDP_REDIRECT);
    assert_eq!(
        u16::from_be_bytes([ack.output[34], ack.output[35]]),
        p,
        "same SNAT port"
    );
    let answer = run(&from_backend(p, TCP_ACK), e.vb);
    assert_eq!(
        answer.verdict,
        XDP_REDIRECT,
        "the backend's answer: {} (no NAT entry)",
        verdict_name(answer.verdict)
    );
    assert_eq!(&answer.output[30..34], &[10, 0, 1, 2], "to the real client");
}

#[test]
fn a_syn_on_a_closing_flow_starts_a_new_one() {
    let e = env();
    let syn = Packet::tcp("10.0.1.2:43000", "10.100.0.1:80", TCP_SYN).build();
    let fin = Packet::tcp("10.0.1.2:43000", "10.100.0.1:80", TCP_FIN | TCP_ACK).build();
    let row = |desc: &str, frame: &Vec<u8>| {
        Fixture::new(desc, frame.clone(), XDP_REDIRECT, FWD_REDIRECT)
            .ingress(e.vc)
            .any_output()
    };
    e.run(&[
        row("SYN", &syn).also(CT_NEW),
        row("FIN: closing", &fin),
        row(
            "SYN after FIN: the client reuses its port, a new connection",
            &syn,
        )
        .also(CT_NEW),
        row("retransmitted SYN of a live flow: not new", &syn),
    ]);
}

/// With one SNAT port, a second client gets it only once the first flow is closed both ways
/// (a FIN from each side) and `tcp_closed_timeout` has passed since the last FIN; a half-closed
/// flow keeps it.
#[test]
fn a_port_closed_both_ways_is_free_after_the_closed_hold() {
    require_root();
    let e = TestNet::new(
        "ring_size = 1009\nsnat_ports = \"40000-40000\"\nconntrack = { tcp_closed_timeout = \"1s\" }",
        SERVICES,
    )
    .unwrap();
    let snat = "10.0.2.1:40000";
    let a = "10.0.1.2:41000";
    let from_client = |flags| {
        Fixture::new(
            "A: client segment",
            Packet::tcp(a, "10.100.0.1:80", flags).build(),
            XDP_REDIRECT,
            FWD_REDIRECT,
        )
        .ingress(e.vc)
        .any_output()
    };
    let from_backend = |desc: &str, flags| e.from_backend(desc, "10.0.2.2:8080", snat, flags);
    let b_syn = Packet::tcp("10.0.1.2:41001", "10.100.0.1:80", TCP_SYN);
    let b_refused = |desc: &str| {
        (0..lb_common::SNAT_PORT_TRIES).fold(
            Fixture::new(desc, b_syn.clone().build(), XDP_DROP, DROP_NO_SNAT_PORT).ingress(e.vc),
            |f, _| f.also(SNAT_PORT_RETRY),
        )
    };
    let hold = std::time::Duration::from_millis(1300);
    e.run(&[
        from_client(TCP_SYN).also(CT_NEW),
        from_backend("A: SYN+ACK", TCP_SYN | TCP_ACK),
        from_client(TCP_ACK),
        b_refused("B while A is open: no port"),
        from_client(TCP_FIN | TCP_ACK),
    ]);
    std::thread::sleep(hold);
    e.run(&[
        b_refused("B after the hold, A half-closed: no port"),
        from_backend("A: backend FIN, closed both ways", TCP_FIN | TCP_ACK),
        b_refused("B at once after the last FIN: still held"),
    ]);
    std::thread::sleep(hold);
    e.run(&[Fixture::new(
        "B after the hold: takes the port",
        b_syn.clone().build(),
        XDP_REDIRECT,
        FWD_REDIRECT,
    )
    .ingress(e.vc)
    .output(
        Packet::tcp(snat, "10.0.2.2:8080", TCP_SYN)
            .ttl(63)
            .macs(e.vb_mac, BACKEND_MAC)
            .build(),
    )
    .also(CT_NEW)]);
}

/// ICMP for a VIP (issue 13): echo requests answered in place, everything else dropped and
/// counted, errors about a live flow translated to its backend (the path MTU case: the router's
/// "fragmentation needed" about a reply to the client goes to the backend, quoting what the
/// backend sent, every checksum right), errors about no flow dropped.
#[test]
fn icmp_to_a_vip() {
    let e = env();
    let vip = "10.100.0.1";
    let p = snat_port(&e, CLIENT, 40200, vip, 80, 6);
    let echo = Packet::icmp_echo("10.0.1.2:0", "10.100.0.1:0", false, 0x77, 3).payload(b"abcdefgh");
    // A reply to the client lb forwarded, 1400 bytes of data, as the router received it.
    let reply = Packet::tcp("10.100.0.1:80", "10.0.1.2:40200", TCP_ACK)
        .seq(5001, 1001)
        .payload(&[0x5a; 1400])
        .ttl(63);
    // The same packet as the backend sent it: what the translated error must quote.
    let from_backend = Packet::tcp("10.0.2.2:8080", &format!("10.0.2.1:{p}"), TCP_ACK)
        .seq(5001, 1001)
        .payload(&[0x5a; 1400])
        .ttl(63);
    let frag_needed = |quoted: &Packet, len| {
        Packet::icmp_error(
            "10.0.1.99:0",
            "10.100.0.1:0",
            ICMP_DEST_UNREACH,
            ICMP_FRAG_NEEDED,
            1400,
            &quoted.datagram(),
            len,
        )
    };
    let to_backend = |quoted: &Packet, len| {
        Packet::icmp_error(
            "10.0.2.1:0",
            "10.0.2.2:0",
            ICMP_DEST_UNREACH,
            ICMP_FRAG_NEEDED,
            1400,
            &quoted.datagram(),
            len,
        )
        .ttl(63)
        .macs(e.vb_mac, BACKEND_MAC)
        .build()
    };
    let time_exceeded = Packet::icmp_error(
        "10.0.1.99:0",
        "10.100.0.1:0",
        ICMP_TIME_EXCEEDED,
        0,
        0,
        &reply.datagram(),
        28,
    );
    let unknown = Packet::tcp("10.100.0.1:80", "10.0.1.2:40299", TCP_ACK).ttl(63);
    let fixtures = vec![
        Fixture::new(
            "echo request to the VIP: answered",
            echo.build(),
            XDP_TX,
            ICMP_ECHO_REPLY,
        )
        .ingress(e.vc)
        .output(
            Packet::icmp_echo("10.100.0.1:0", "10.0.1.2:0", true, 0x77, 3)
                .payload(b"abcdefgh")
                .macs(LB_MAC, CLIENT_MAC)
                .build(),
        ),
        Fixture::new(
            "echo reply to the VIP: dropped",
            Packet::icmp_echo("10.0.1.2:0", "10.100.0.1:0", true, 1, 1).build(),
            XDP_DROP,
            DROP_ICMP,
        )
        .ingress(e.vc),
        Fixture::new(
            "echo request to another address: passed",
            Packet::icmp_echo("10.0.1.2:0", "10.0.1.9:0", false, 1, 1).build(),
            XDP_PASS,
            PASS_NOT_VIP,
        )
        .ingress(e.vc),
        Fixture::new(
            "truncated ICMP to the VIP",
            echo.build()[..14 + 20 + 4].to_vec(),
            XDP_DROP,
            DROP_MALFORMED,
        )
        .ingress(e.vc),
        Fixture::new(
            "fragmentation needed about no flow: dropped",
            frag_needed(&unknown, 28).build(),
            XDP_DROP,
            DROP_ICMP_NO_FLOW,
        )
        .ingress(e.vc),
        Fixture::new(
            "fragmentation needed quoting a fragment's middle: dropped",
            frag_needed(&reply.clone().fragment(true, 100), 28).build(),
            XDP_DROP,
            DROP_ICMP_NO_FLOW,
        )
        .ingress(e.vc),
        Fixture::new(
            "the flow's SYN",
            Packet::tcp("10.0.1.2:40200", "10.100.0.1:80", TCP_SYN).build(),
            XDP_REDIRECT,
            FWD_REDIRECT,
        )
        .ingress(e.vc)
        .any_output()
        .also(CT_NEW),
        Fixture::new(
            "fragmentation needed about the flow, 28 bytes quoted: to the backend",
            frag_needed(&reply, 28).build(),
            XDP_REDIRECT,
            FWD_REDIRECT,
        )
        .ingress(e.vc)
        .output(to_backend(&from_backend, 28))
        .also(ICMP_TRANSLATED_IN),
        Fixture::new(
            "the same with 576 bytes quoted (the TCP checksum inside is rewritten too)",
            frag_needed(&reply, 548).build(),
            XDP_REDIRECT,
            FWD_REDIRECT,
        )
        .ingress(e.vc)
        .output(to_backend(&from_backend, 548))
        .also(ICMP_TRANSLATED_IN),
        Fixture::new(
            "the same with the whole packet quoted",
            frag_needed(&reply, 2000).build(),
            XDP_REDIRECT,
            FWD_REDIRECT,
        )
        .ingress(e.vc)
        .output(to_backend(&from_backend, 2000))
        .also(ICMP_TRANSLATED_IN),
        Fixture::new(
            "time exceeded about the flow: to the backend",
            time_exceeded.build(),
            XDP_REDIRECT,
            FWD_REDIRECT,
        )
        .ingress(e.vc)
        .output(
            Packet::icmp_error(
                "10.0.2.1:0",
                "10.0.2.2:0",
                ICMP_TIME_EXCEEDED,
                0,
                0,
                &from_backend.datagram(),
                28,
            )
            .ttl(63)
            .macs(e.vb_mac, BACKEND_MAC)
            .build(),
        )
        .also(ICMP_TRANSLATED_IN),
        Fixture::new(
            "an error whose outer TTL is 1",
            frag_needed(&reply, 28).ttl(1).build(),
            XDP_DROP,
            DROP_TTL,
        )
        .ingress(e.vc),
    ];
    for f in &fixtures {
        if let Some(out) = &f.output {
            verify_checksums(out).unwrap_or_else(|err| panic!("{}: expected frame: {err}", f.desc));
        }
    }
    e.run(&fixtures);
}

/// Echo replies are rate-limited per CPU (`icmp_reply_rate`), and a VIP with `answer_ping = false`
/// answers none.
#[test]
fn echo_replies_are_rate_limited_and_can_be_off() {
    require_root();
    let e = TestNet::new(
        "ring_size = 1009\nicmp_reply_rate = 5",
        "[[service]]\nname = \"web\"\nvip = \"10.100.0.1:80\"\nbackends = [{ address = \"10.0.2.2:8080\" }]\n\
         [[service]]\nname = \"quiet\"\nvip = \"10.100.0.7:80\"\nanswer_ping = false\nbackends = [{ address = \"10.0.2.2:8080\" }]\n",
    )
    .unwrap();
    let echo = |dst: &str, seq| {
        Packet::icmp_echo("10.0.1.2:0", &format!("{dst}:0"), false, 9, seq).build()
    };
    // The budget is per CPU: the runs stay on one. A burst of 5, then none until time refills
    // the bucket (a second for 5 more; the rows take milliseconds).
    let mut rows: Vec<Fixture> = (0..5)
        .map(|i| {
            Fixture::new(
                format!("echo {i}: within the burst"),
                echo("10.100.0.1", i),
                XDP_TX,
                ICMP_ECHO_REPLY,
            )
            .any_output()
        })
        .collect();
    rows.push(Fixture::new(
        "echo 5: beyond the rate",
        echo("10.100.0.1", 5),
        XDP_DROP,
        DROP_ICMP_RATE,
    ));
    rows.push(Fixture::new(
        "echo to a VIP that does not answer",
        echo("10.100.0.7", 1),
        XDP_DROP,
        DROP_ICMP,
    ));
    e.ns.enter(|| {
        lb_tests::fixture::on_cpu0();
        lb_tests::fixture::run_fixtures(&e.dp, &rows);
    });
}

/// The kernel verifies a program by walking its paths, up to a million instructions: past that
/// it refuses to load it, on this kernel or a slightly different one. Keep a wide margin, and
/// show where the programs stand.
#[test]
fn the_programs_stay_well_inside_the_verifiers_limit() {
    let e = env();
    let counts = e.dp.verified_instructions();
    eprintln!("verifier: {counts:?}");
    for (name, n) in counts {
        let n = n.expect("the kernel reports verified instructions (5.16+)");
        assert!(
            n <= 700_000,
            "{name}: {n} instructions processed of 1,000,000"
        );
    }
}

/// A change of a service reaches the next new flow to it at once, in both families: each CPU
/// keeps the service map's last answer per destination (a new flow then skips the hash map's
/// lookup), and every change of the service maps voids what they keep. Each change below is
/// made after a new flow to the same destination was answered, so a kept answer would show.
#[test]
fn a_change_of_a_service_reaches_its_next_new_flow() {
    require_root();
    let services = r#"
[[service]]
name = "web"
vip = "10.100.0.1:80"
backends = [{ address = "10.0.2.2:8080" }]

[[service]]
name = "web6"
vip = "[2001:db8:100::1]:80"
backends = [{ address = "[2001:db8:2::2]:8080" }]
"#;
    let mut e = TestNet::new("", services).unwrap();
    let mut port = 41000u16;
    let mut syn = |e: &TestNet, vip: &str| {
        port += 1;
        let client = if vip.starts_with('[') {
            format!("[2001:db8:1::2]:{port}")
        } else {
            format!("{CLIENT}:{port}")
        };
        let frame = Packet::tcp(&client, vip, TCP_SYN).build();
        let r =
            e.ns.enter(|| run_once(e.dp.program(), &frame, e.vc))
                .unwrap();
        verdict_name(r.verdict)
    };
    for (name, vip) in [("web", "10.100.0.1:80"), ("web6", "[2001:db8:100::1]:80")] {
        let sid = e.balancer.service_index(name).unwrap();
        assert_eq!(
            syn(&e, vip),
            "XDP_REDIRECT",
            "{name}: a new flow is forwarded"
        );
        assert_eq!(syn(&e, vip), "XDP_REDIRECT", "{name}: and the next");
        e.balancer.set_syn_proxy(sid, true, &mut e.dp).unwrap();
        assert_eq!(
            syn(&e, vip),
            "XDP_TX",
            "{name}: proxied: answered with a cookie"
        );
        e.balancer.set_syn_proxy(sid, false, &mut e.dp).unwrap();
        assert_eq!(
            syn(&e, vip),
            "XDP_REDIRECT",
            "{name}: released: forwarded again"
        );
    }
    // Both services removed by a reload, their VIPs kept by others: their next SYNs find none.
    let text = format!(
        "[lb]\ninterfaces = [\"{}\", \"{}\"]\n[[service]]\nname = \"other\"\n\
         vip = \"10.100.0.1:81\"\nbackends = [{{ address = \"10.0.2.2:8080\" }}]\n\
         [[service]]\nname = \"other6\"\nvip = \"[2001:db8:100::1]:81\"\n\
         backends = [{{ address = \"[2001:db8:2::2]:8080\" }}]\n",
        e.vc_name, e.vb_name
    );
    let config = lb::config::parse(&text).unwrap();
    let TestNet {
        ns, dp, balancer, ..
    } = &mut e;
    ns.enter(|| {
        balancer.apply(
            &config,
            |sid, backend| lb::daemon::snat_address(&config, sid, backend),
            |_, _, _| true,
            dp,
        )
    })
    .unwrap();
    let dropped = e.dp.stats().unwrap().counter(DROP_NO_SERVICE);
    assert_eq!(syn(&e, "10.100.0.1:80"), "XDP_DROP");
    assert_eq!(syn(&e, "[2001:db8:100::1]:80"), "XDP_DROP");
    assert_eq!(e.dp.stats().unwrap().counter(DROP_NO_SERVICE), dropped + 2);
}

/// The SYN sketch in front of the per-source buckets: a source whose sketch cell is quiet passes
/// without its bucket, so a loud source that empties a bucket it shares (by hash) does not
/// drop the quiet one's first SYNs, which it did before the sketch. The loud one passes its
/// burst and the quiet share more, no further (see `lb_common::SynCell`).
#[test]
fn a_quiet_source_is_not_dropped_for_a_loud_one_sharing_its_bucket() {
    require_root();
    // Per-CPU state: every SYN on one CPU.
    lb_tests::fixture::on_cpu0();
    // A token each 62.5 ms: none is earned in a run shorter than 50 ms.
    const RATE: u32 = 16;
    let quiet = usize::from(lb_common::syn_quiet(RATE));
    assert!(quiet > 0, "the sketch is off below 8 SYNs a second");
    let e = TestNet::new(
        &format!("ring_size = 1009\nsyn_rate_per_source = {RATE}"),
        SERVICES,
    )
    .unwrap();
    let verdict = |client: &str, port: u16| {
        let frame = Packet::tcp(&format!("{client}:{port}"), "10.100.0.1:80", TCP_SYN).build();
        let v = e.ns.enter(|| run_once(e.dp.program(), &frame, e.vc));
        verdict_name(v.unwrap().verdict)
    };
    let ne = lb_tests::testnet::ne;
    // A source of 10.16.0.0/12 in `a`'s bucket and not in its cell.
    let partner = |a: &str| {
        let (cell, bucket) = lb_common::syn_slots(ne(a));
        (0u32..1 << 20)
            .map(|i| std::net::Ipv4Addr::from(0x0a10_0000 + i).to_string())
            .find(|b| {
                let (c, b) = lb_common::syn_slots(ne(b));
                b == bucket && c != cell
            })
            .expect("a partner in a /12")
    };
    for attempt in 0..5 {
        // Fresh sources each attempt: a bucket of their own, emptied by nobody yet.
        let loud = format!("10.0.1.{}", 10 + attempt);
        let quiet_src = partner(&loud);
        let start = early_in_an_epoch();
        let loud_passed = (40000..40000 + 3 * RATE as u16)
            .filter(|&port| verdict(&loud, port) == "XDP_REDIRECT")
            .count();
        let quiet_verdicts: Vec<_> = (40000..=40000 + quiet as u16)
            .map(|port| verdict(&quiet_src, port))
            .collect();
        let end = monotonic_coarse_ns();
        // A run that crossed into the sketch's next epoch or let a token be earned is done
        // again: the counts below hold within one epoch and one bucket's burst.
        if end >> SYN_EPOCH_SHIFT != start >> SYN_EPOCH_SHIFT || end - start >= 50_000_000 {
            continue;
        }
        let mut expected = vec!["XDP_REDIRECT"; quiet];
        expected.push("XDP_DROP");
        assert_eq!(
            quiet_verdicts, expected,
            "the quiet source, {quiet_src}, after {loud} emptied their bucket"
        );
        assert_eq!(
            loud_passed,
            RATE as usize + quiet,
            "the loud source's SYNs passed"
        );
        return;
    }
    panic!("five runs crossed the sketch's epoch or took 50 ms");
}

/// The datapath's clock once it is at least 50 ms into an epoch of the SYN sketch with half a
/// second of it left. The wait is for the clock, not for another party: the datapath's
/// reading of it may lag a tick or two.
fn early_in_an_epoch() -> u64 {
    const EPOCH: u64 = 1 << SYN_EPOCH_SHIFT;
    const LEAD: u64 = 50_000_000;
    let into = monotonic_coarse_ns() % EPOCH;
    let wait = if into < LEAD {
        LEAD - into
    } else if into > EPOCH - 500_000_000 {
        EPOCH - into + LEAD
    } else {
        0
    };
    std::thread::sleep(std::time::Duration::from_nanos(wait));
    monotonic_coarse_ns()
}

/// The per-source SYN limit: a source's SYNs beyond its burst are dropped (counted), other
/// sources' pass; a bucket refilled (how lb-bench creates one flow anew again and again under
/// the limit at its default) lets its source's next SYN through.
#[test]
fn a_source_beyond_its_syn_rate_is_dropped_until_its_bucket_refills() {
    require_root();
    let mut e = TestNet::new("ring_size = 1009\nsyn_rate_per_source = 1", SERVICES).unwrap();
    let syn = |client: &str, port: u16| {
        Packet::tcp(&format!("{client}:{port}"), "10.100.0.1:80", TCP_SYN).build()
    };
    let run = |e: &TestNet, frame: &[u8]| {
        e.ns.enter(|| run_once(e.dp.program(), frame, e.vc))
            .unwrap()
            .verdict
    };
    // One SYN a second, a burst of one: of SYNs sent back to back, all but the first within a
    // second are dropped. (Five: a second's stall between two of them would refill a token.)
    let before = e.dp.stats().unwrap().counter(DROP_SYN_RATE);
    let dropped = (41000..41005)
        .filter(|&port| run(&e, &syn(CLIENT, port)) == XDP_DROP)
        .count() as u64;
    assert!(dropped >= 1, "no SYN of five back to back was dropped");
    assert_eq!(
        e.dp.stats().unwrap().counter(DROP_SYN_RATE),
        before + dropped
    );
    assert_eq!(
        run(&e, &syn("10.0.1.3", 41000)),
        XDP_REDIRECT,
        "another source"
    );
    e.dp.refill_syn_bucket(lb_tests::testnet::ne(CLIENT))
        .unwrap();
    assert_eq!(
        verdict_name(run(&e, &syn(CLIENT, 41005))),
        "XDP_REDIRECT",
        "after the refill"
    );
}
