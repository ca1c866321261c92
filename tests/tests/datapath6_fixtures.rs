//! The IPv6 half of the XDP program through BPF_PROG_TEST_RUN, as datapath_fixtures.rs does for
//! IPv4: each parse path (extension headers, fragments, truncation at every header, UDP without
//! checksum, hop limit), the forwarding and return paths, ICMPv6 (echo, neighbour discovery,
//! errors about a flow both ways), each with its verdict, exact output bytes and counters, in
//! the dual-stack network of [`lb_tests::testnet`].

use lb_common::counter::*;
use lb_tests::{
    fixture::{Fixture, XDP_DROP, XDP_PASS, XDP_REDIRECT, XDP_TX, check_expected},
    packet::{
        CLIENT_MAC, EXT_DEST_OPTS, EXT_HOP_BY_HOP, EXT_ROUTING, ICMP6_DEST_UNREACH,
        ICMP6_NEIGHBOR_SOLICIT, ICMP6_PACKET_TOO_BIG, ICMP6_PORT_UNREACH, ICMP6_TIME_EXCEEDED,
        LB_MAC, Packet, TCP_ACK, TCP_FIN, TCP_PSH, TCP_RST, TCP_SYN,
    },
    require_root,
    testnet::{BACKEND_MAC, ONE_ARM_MAC, TestNet},
};

const CLIENT: &str = "2001:db8:1::2";
const VIP: &str = "2001:db8:100::1";

const SERVICES: &str = r#"
[[service]]
name = "web6"
vip = "[2001:db8:100::1]:80"
backends = [{ address = "[2001:db8:2::2]:8080" }]

[[service]]
name = "dns6"
vip = "[2001:db8:100::1]:53"
protocol = "udp"
backends = [{ address = "[2001:db8:2::2]:5353" }]

[[service]]
name = "one-arm6"
vip = "[2001:db8:100::2]:80"
backends = [{ address = "[2001:db8:1::20]:8080" }]

[[service]]
name = "drained6"
vip = "[2001:db8:100::3]:80"
backends = [{ address = "[2001:db8:2::2]:9000", weight = 0 }]

[[service]]
name = "web4"
vip = "10.100.0.1:80"
backends = [{ address = "10.0.2.2:8080" }]
"#;

fn env() -> TestNet {
    require_root();
    TestNet::new("ring_size = 1009", SERVICES).unwrap()
}

#[test]
fn forwarding_and_return_paths() {
    let e = env();
    let p = e.snat_port(CLIENT, 40000, VIP, 80, 6);
    let snat = format!("[2001:db8:2::1]:{p}");
    let to_backend = |pkt: Packet| pkt.ttl(63).macs(e.vb_mac, BACKEND_MAC).build();
    let client = |port: u16| format!("[{CLIENT}]:{port}");
    let syn = Packet::tcp(&client(40000), "[2001:db8:100::1]:80", TCP_SYN);
    let pu = e.snat_port(CLIENT, 40001, VIP, 53, 17);
    let snat_udp = format!("[2001:db8:2::1]:{pu}");
    let p1 = e.snat_port(CLIENT, 40003, "2001:db8:100::2", 80, 6);
    let pm = e.snat_port(CLIENT, 40004, VIP, 80, 6);
    let fixtures = vec![
        Fixture::new(
            "SYN to the IPv6 VIP: full NAT to the backend, redirected to the backend side",
            syn.clone().build(),
            XDP_REDIRECT,
            FWD_REDIRECT,
        )
        .ingress(e.vc)
        .output(to_backend(Packet::tcp(
            &snat,
            "[2001:db8:2::2]:8080",
            TCP_SYN,
        )))
        .also(CT_NEW),
        Fixture::new(
            "established packet with data: same backend and SNAT port",
            Packet::tcp(&client(40000), "[2001:db8:100::1]:80", TCP_ACK | TCP_PSH)
                .seq(1001, 5001)
                .payload(b"GET / HTTP/1.1\r\n\r\n")
                .build(),
            XDP_REDIRECT,
            FWD_REDIRECT,
        )
        .ingress(e.vc)
        .output(to_backend(
            Packet::tcp(&snat, "[2001:db8:2::2]:8080", TCP_ACK | TCP_PSH)
                .seq(1001, 5001)
                .payload(b"GET / HTTP/1.1\r\n\r\n"),
        )),
        Fixture::new(
            "reply from the backend: back to VIP → client, to the client's MAC",
            Packet::tcp("[2001:db8:2::2]:8080", &snat, TCP_SYN | TCP_ACK)
                .seq(5000, 1001)
                .macs(BACKEND_MAC, e.vb_mac)
                .build(),
            XDP_REDIRECT,
            FWD_REDIRECT,
        )
        .ingress(e.vb)
        .output(
            Packet::tcp("[2001:db8:100::1]:80", &client(40000), TCP_SYN | TCP_ACK)
                .seq(5000, 1001)
                .ttl(63)
                .macs(LB_MAC, CLIENT_MAC)
                .build(),
        )
        .also(REPLY),
        Fixture::new(
            "reply to a SNAT port no flow holds: the host's own traffic, passed",
            Packet::tcp(
                "[2001:db8:2::2]:8080",
                "[2001:db8:2::1]:12345",
                TCP_SYN | TCP_ACK,
            )
            .macs(BACKEND_MAC, e.vb_mac)
            .build(),
            XDP_PASS,
            PASS_NOT_VIP,
        )
        .ingress(e.vb),
        Fixture::new(
            "client FIN: forwarded",
            Packet::tcp(&client(40000), "[2001:db8:100::1]:80", TCP_FIN | TCP_ACK)
                .seq(1019, 5001)
                .build(),
            XDP_REDIRECT,
            FWD_REDIRECT,
        )
        .ingress(e.vc)
        .output(to_backend(
            Packet::tcp(&snat, "[2001:db8:2::2]:8080", TCP_FIN | TCP_ACK).seq(1019, 5001),
        )),
        Fixture::new(
            "UDP to the VIP",
            Packet::udp(&client(40001), "[2001:db8:100::1]:53")
                .payload(b"query")
                .build(),
            XDP_REDIRECT,
            FWD_REDIRECT,
        )
        .ingress(e.vc)
        .output(to_backend(
            Packet::udp(&snat_udp, "[2001:db8:2::2]:5353").payload(b"query"),
        ))
        .also(CT_NEW),
        Fixture::new(
            "UDP reply",
            Packet::udp("[2001:db8:2::2]:5353", &snat_udp)
                .payload(b"answer")
                .macs(BACKEND_MAC, e.vb_mac)
                .build(),
            XDP_REDIRECT,
            FWD_REDIRECT,
        )
        .ingress(e.vb)
        .output(
            Packet::udp("[2001:db8:100::1]:53", &client(40001))
                .payload(b"answer")
                .ttl(63)
                .macs(LB_MAC, CLIENT_MAC)
                .build(),
        )
        .also(REPLY),
        Fixture::new(
            "UDP with checksum 0 to the VIP: invalid over IPv6, dropped",
            Packet::udp(&client(40002), "[2001:db8:100::1]:53")
                .payload(b"q")
                .udp_zero_checksum()
                .build(),
            XDP_DROP,
            DROP_UDP_NO_CHECKSUM,
        )
        .ingress(e.vc),
        Fixture::new(
            "UDP with checksum 0 to another address: passed (the kernel drops it)",
            Packet::udp(&client(40002), "[2001:db8:1::9]:53")
                .payload(b"q")
                .udp_zero_checksum()
                .build(),
            XDP_PASS,
            PASS_MALFORMED,
        )
        .ingress(e.vc),
        Fixture::new(
            "one-arm: the backend is on the ingress side, XDP_TX",
            Packet::tcp(&client(40003), "[2001:db8:100::2]:80", TCP_SYN).build(),
            XDP_TX,
            FWD_TX,
        )
        .ingress(e.vc)
        .output(
            Packet::tcp(
                &format!("[2001:db8:1::1]:{p1}"),
                "[2001:db8:1::20]:8080",
                TCP_SYN,
            )
            .ttl(63)
            .macs(e.vc_mac, ONE_ARM_MAC)
            .build(),
        )
        .also(CT_NEW),
        Fixture::new(
            "TCP without SYN and without a table entry: re-created, counted",
            Packet::tcp(&client(40004), "[2001:db8:100::1]:80", TCP_ACK)
                .seq(7, 7)
                .build(),
            XDP_REDIRECT,
            FWD_REDIRECT,
        )
        .ingress(e.vc)
        .output(to_backend(
            Packet::tcp(
                &format!("[2001:db8:2::1]:{pm}"),
                "[2001:db8:2::2]:8080",
                TCP_ACK,
            )
            .seq(7, 7),
        ))
        .also(CT_MISS_MIDSTREAM)
        .also(CT_NEW),
        Fixture::new(
            "tagged SYN after the FIN: a new connection, the tag kept",
            syn.clone().vlan(10).build(),
            XDP_REDIRECT,
            FWD_REDIRECT,
        )
        .ingress(e.vc)
        .output(to_backend(
            Packet::tcp(&snat, "[2001:db8:2::2]:8080", TCP_SYN).vlan(10),
        ))
        .also(VLAN)
        .also(CT_NEW),
        Fixture::new(
            "hop limit 1 to the VIP",
            syn.clone().ttl(1).build(),
            XDP_DROP,
            DROP_TTL,
        )
        .ingress(e.vc),
        Fixture::new(
            "only backend drained (weight 0): no backend for a new flow",
            Packet::tcp(&client(40005), "[2001:db8:100::3]:80", TCP_SYN).build(),
            XDP_DROP,
            DROP_NO_BACKEND,
        )
        .ingress(e.vc),
        Fixture::new(
            "to the balancer's own IPv6 address (a SNAT address): passed",
            Packet::tcp(&client(40006), "[2001:db8:1::1]:22", TCP_SYN).build(),
            XDP_PASS,
            PASS_NOT_VIP,
        )
        .ingress(e.vc),
        Fixture::new(
            "an IPv4 packet beside: still the IPv4 path",
            Packet::tcp("10.0.1.2:40007", "10.100.0.1:80", TCP_SYN).build(),
            XDP_REDIRECT,
            FWD_REDIRECT,
        )
        .ingress(e.vc)
        .any_output()
        .also(CT_NEW),
    ];
    check_expected(&fixtures);
    e.run(&fixtures);
}

#[test]
fn extension_headers_fragments_and_truncation() {
    let e = env();
    let client = |port: u16| format!("[{CLIENT}]:{port}");
    let syn = |port: u16| Packet::tcp(&client(port), "[2001:db8:100::1]:80", TCP_SYN);
    let snat = |port: u16| format!("[2001:db8:2::1]:{}", e.snat_port(CLIENT, port, VIP, 80, 6));
    let forwarded = |port: u16, p: Packet| {
        Fixture::new(
            format!(
                "SYN from port {port} with extension headers: skipped to TCP, forwarded with them"
            ),
            p.clone().build(),
            XDP_REDIRECT,
            FWD_REDIRECT,
        )
        .ingress(e.vc)
        .also(IPV6_EXT_HEADERS)
        .also(CT_NEW)
    };
    let with_ext = |p: Packet| {
        p.ext_header(EXT_HOP_BY_HOP, 0)
            .ext_header(EXT_ROUTING, 1)
            .ext_header(EXT_DEST_OPTS, 0)
    };
    let out = |port: u16, ext: &dyn Fn(Packet) -> Packet| {
        ext(Packet::tcp(&snat(port), "[2001:db8:2::2]:8080", TCP_SYN))
            .ttl(63)
            .macs(e.vb_mac, BACKEND_MAC)
            .build()
    };
    let five = |p: Packet| {
        p.ext_header(EXT_DEST_OPTS, 0)
            .ext_header(EXT_DEST_OPTS, 0)
            .ext_header(EXT_DEST_OPTS, 0)
            .ext_header(EXT_DEST_OPTS, 0)
            .ext_header(EXT_DEST_OPTS, 0)
    };
    let frame = syn(40100).build();
    let cut = |len: usize| frame[..len].to_vec();
    let udp = Packet::udp(&client(40101), "[2001:db8:100::1]:53").payload(b"query");
    let udp_frame = udp.build();
    let hbh = syn(40102).ext_header(EXT_HOP_BY_HOP, 2).build();
    let fixtures = vec![
        forwarded(40110, syn(40110).ext_header(EXT_HOP_BY_HOP, 0))
            .output(out(40110, &|p| p.ext_header(EXT_HOP_BY_HOP, 0))),
        forwarded(40111, syn(40111).ext_header(EXT_ROUTING, 1))
            .output(out(40111, &|p| p.ext_header(EXT_ROUTING, 1))),
        forwarded(40112, syn(40112).ext_header(EXT_DEST_OPTS, 3))
            .output(out(40112, &|p| p.ext_header(EXT_DEST_OPTS, 3))),
        forwarded(40113, with_ext(syn(40113))).output(out(40113, &with_ext)),
        Fixture::new(
            "five extension headers to the VIP: more than lb reads, dropped",
            five(syn(40114)).build(),
            XDP_DROP,
            DROP_EXT_HEADERS,
        )
        .ingress(e.vc),
        Fixture::new(
            "five extension headers to another address: passed",
            five(Packet::tcp(&client(40115), "[2001:db8:1::9]:22", TCP_SYN)).build(),
            XDP_PASS,
            PASS_EXT_HEADERS,
        )
        .ingress(e.vc),
        Fixture::new(
            "first fragment to the VIP: dropped",
            syn(40116).fragment(true, 0).build(),
            XDP_DROP,
            DROP_FRAGMENT,
        )
        .ingress(e.vc),
        Fixture::new(
            "later fragment to the VIP, after a hop-by-hop header: dropped",
            syn(40117)
                .ext_header(EXT_HOP_BY_HOP, 0)
                .fragment(false, 100)
                .build(),
            XDP_DROP,
            DROP_FRAGMENT,
        )
        .ingress(e.vc),
        Fixture::new(
            "fragment to another address: passed",
            Packet::udp(&client(40118), "[2001:db8:1::9]:53")
                .fragment(true, 0)
                .build(),
            XDP_PASS,
            PASS_FRAGMENT,
        )
        .ingress(e.vc),
        Fixture::new(
            "cut inside the IPv6 header",
            cut(14 + 20),
            XDP_PASS,
            PASS_MALFORMED,
        )
        .ingress(e.vc),
        Fixture::new(
            "cut inside the TCP header, to the VIP",
            cut(14 + 40 + 10),
            XDP_DROP,
            DROP_MALFORMED,
        )
        .ingress(e.vc),
        Fixture::new(
            "cut inside a hop-by-hop header, to the VIP",
            hbh[..14 + 40 + 12].to_vec(),
            XDP_DROP,
            DROP_MALFORMED,
        )
        .ingress(e.vc),
        Fixture::new(
            "cut inside the UDP header, to the VIP",
            udp_frame[..14 + 40 + 6].to_vec(),
            XDP_DROP,
            DROP_MALFORMED,
        )
        .ingress(e.vc),
        Fixture::new(
            "payload length beyond the frame (cut), to the VIP",
            cut(frame.len() - 1),
            XDP_DROP,
            DROP_MALFORMED,
        )
        .ingress(e.vc),
        Fixture::new(
            "version 4 in an IPv6 header to the VIP: malformed, dropped",
            {
                let mut f = frame.clone();
                f[14] = 0x40;
                f
            },
            XDP_DROP,
            DROP_MALFORMED,
        )
        .ingress(e.vc),
        Fixture::new(
            "another protocol (GRE) to the VIP address: dropped",
            Packet::ip_proto(&client(0), "[2001:db8:100::1]:0", 47)
                .payload(&[0; 8])
                .build(),
            XDP_DROP,
            DROP_NO_SERVICE,
        )
        .ingress(e.vc),
        Fixture::new(
            "TCP to the VIP address, other port: dropped",
            Packet::tcp(&client(40119), "[2001:db8:100::1]:443", TCP_SYN).build(),
            XDP_DROP,
            DROP_NO_SERVICE,
        )
        .ingress(e.vc),
        Fixture::new(
            "TCP to another IPv6 address: passed",
            Packet::tcp(&client(40120), "[2001:db8:1::9]:22", TCP_SYN).build(),
            XDP_PASS,
            PASS_NOT_VIP,
        )
        .ingress(e.vc),
    ];
    check_expected(&fixtures);
    e.run(&fixtures);
}

#[test]
fn icmpv6_to_lb_addresses() {
    let e = env();
    let client = |port: u16| format!("[{CLIENT}]:{port}");
    let p = e.snat_port(CLIENT, 40200, VIP, 80, 6);
    let snat = format!("[2001:db8:2::1]:{p}");
    let echo =
        Packet::icmp_echo(&client(0), "[2001:db8:100::1]:0", false, 0x77, 3).payload(b"abcdefgh");
    // A reply lb forwarded to the client, as the router on the way received it.
    let reply = Packet::tcp("[2001:db8:100::1]:80", &client(40200), TCP_ACK)
        .seq(5001, 1001)
        .payload(&[0x5a; 1400])
        .ttl(63);
    // The same packet as the backend sent it: what the translated error must quote.
    let from_backend = Packet::tcp("[2001:db8:2::2]:8080", &snat, TCP_ACK)
        .seq(5001, 1001)
        .payload(&[0x5a; 1400])
        .ttl(63);
    let too_big = |quoted: &Packet, len| {
        Packet::icmp_error(
            "[2001:db8:1::99]:0",
            "[2001:db8:100::1]:0",
            ICMP6_PACKET_TOO_BIG,
            0,
            1280,
            &quoted.datagram(),
            len,
        )
    };
    let to_backend = |ty, mtu, quoted: &Packet, len| {
        Packet::icmp_error(
            "[2001:db8:2::1]:0",
            "[2001:db8:2::2]:0",
            ty,
            0,
            mtu,
            &quoted.datagram(),
            len,
        )
        .ttl(63)
        .macs(e.vb_mac, BACKEND_MAC)
        .build()
    };
    // What the client sent and the backend received, for errors from the backend side.
    let sent = Packet::tcp(&snat, "[2001:db8:2::2]:8080", TCP_ACK | TCP_PSH)
        .seq(1001, 5001)
        .payload(&[7; 600])
        .ttl(63);
    let as_client_sent = Packet::tcp(&client(40200), "[2001:db8:100::1]:80", TCP_ACK | TCP_PSH)
        .seq(1001, 5001)
        .payload(&[7; 600])
        .ttl(63);
    let unknown = Packet::tcp("[2001:db8:100::1]:80", &client(40299), TCP_ACK).ttl(63);
    let fixtures = vec![
        Fixture::new(
            "echo request to the VIP: answered",
            echo.build(),
            XDP_TX,
            ICMP_ECHO_REPLY,
        )
        .ingress(e.vc)
        .output(
            Packet::icmp_echo("[2001:db8:100::1]:0", &client(0), true, 0x77, 3)
                .payload(b"abcdefgh")
                .macs(LB_MAC, CLIENT_MAC)
                .build(),
        ),
        Fixture::new(
            "echo reply to the VIP: dropped",
            Packet::icmp_echo(&client(0), "[2001:db8:100::1]:0", true, 1, 1).build(),
            XDP_DROP,
            DROP_ICMP,
        )
        .ingress(e.vc),
        Fixture::new(
            "neighbour solicitation to the VIP: the kernel's, passed untouched",
            Packet::icmp_other(
                &client(0),
                "[2001:db8:100::1]:0",
                ICMP6_NEIGHBOR_SOLICIT,
                0,
                [0; 4],
            )
            .payload(&[0x20, 1, 0xd, 0xb8, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1])
            .ttl(255)
            .build(),
            XDP_PASS,
            PASS_NOT_VIP,
        )
        .ingress(e.vc),
        Fixture::new(
            "neighbour solicitation to a solicited-node group: passed",
            Packet::icmp_other(
                &client(0),
                "[ff02::1:ff00:1]:0",
                ICMP6_NEIGHBOR_SOLICIT,
                0,
                [0; 4],
            )
            .payload(&[0x20, 1, 0xd, 0xb8, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1])
            .ttl(255)
            .build(),
            XDP_PASS,
            PASS_NOT_VIP,
        )
        .ingress(e.vc),
        Fixture::new(
            "neighbour solicitation to a SNAT address: the host's, passed",
            Packet::icmp_other(
                "[2001:db8:2::2]:0",
                "[2001:db8:2::1]:0",
                ICMP6_NEIGHBOR_SOLICIT,
                0,
                [0; 4],
            )
            .payload(&[0x20, 1, 0xd, 0xb8, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1])
            .ttl(255)
            .macs(BACKEND_MAC, e.vb_mac)
            .build(),
            XDP_PASS,
            PASS_NOT_VIP,
        )
        .ingress(e.vb),
        Fixture::new(
            "truncated ICMPv6 to the VIP",
            echo.build()[..14 + 40 + 4].to_vec(),
            XDP_DROP,
            DROP_MALFORMED,
        )
        .ingress(e.vc),
        Fixture::new(
            "packet too big about no flow: dropped",
            too_big(&unknown, 48).build(),
            XDP_DROP,
            DROP_ICMP_NO_FLOW,
        )
        .ingress(e.vc),
        Fixture::new(
            "the flow's SYN",
            Packet::tcp(&client(40200), "[2001:db8:100::1]:80", TCP_SYN).build(),
            XDP_REDIRECT,
            FWD_REDIRECT,
        )
        .ingress(e.vc)
        .any_output()
        .also(CT_NEW),
        Fixture::new(
            "packet too big about the flow, 48 bytes quoted: to the backend",
            too_big(&reply, 48).build(),
            XDP_REDIRECT,
            FWD_REDIRECT,
        )
        .ingress(e.vc)
        .output(to_backend(ICMP6_PACKET_TOO_BIG, 1280, &from_backend, 48))
        .also(ICMP_TRANSLATED_IN),
        Fixture::new(
            "the same with 1232 bytes quoted (the TCP checksum inside is rewritten too)",
            too_big(&reply, 1232).build(),
            XDP_REDIRECT,
            FWD_REDIRECT,
        )
        .ingress(e.vc)
        .output(to_backend(ICMP6_PACKET_TOO_BIG, 1280, &from_backend, 1232))
        .also(ICMP_TRANSLATED_IN),
        Fixture::new(
            "time exceeded about the flow: to the backend",
            Packet::icmp_error(
                "[2001:db8:1::99]:0",
                "[2001:db8:100::1]:0",
                ICMP6_TIME_EXCEEDED,
                0,
                0,
                &reply.datagram(),
                48,
            )
            .build(),
            XDP_REDIRECT,
            FWD_REDIRECT,
        )
        .ingress(e.vc)
        .output(to_backend(ICMP6_TIME_EXCEEDED, 0, &from_backend, 48))
        .also(ICMP_TRANSLATED_IN),
        Fixture::new(
            "an error whose hop limit is 1",
            too_big(&reply, 48).ttl(1).build(),
            XDP_DROP,
            DROP_TTL,
        )
        .ingress(e.vc),
        Fixture::new(
            "packet too big from the backend side (to the SNAT address): to the client",
            Packet::icmp_error(
                "[2001:db8:2::fe]:0",
                "[2001:db8:2::1]:0",
                ICMP6_PACKET_TOO_BIG,
                0,
                1280,
                &sent.datagram(),
                sent.datagram().len(),
            )
            .macs(BACKEND_MAC, e.vb_mac)
            .build(),
            XDP_REDIRECT,
            FWD_REDIRECT,
        )
        .ingress(e.vb)
        .output(
            Packet::icmp_error(
                "[2001:db8:100::1]:0",
                &client(0),
                ICMP6_PACKET_TOO_BIG,
                0,
                1280,
                &as_client_sent.datagram(),
                as_client_sent.datagram().len(),
            )
            .ttl(63)
            .macs(LB_MAC, CLIENT_MAC)
            .build(),
        )
        .also(ICMP_TRANSLATED_OUT),
        Fixture::new(
            "port unreachable from the backend: to the client, and a passive signal",
            Packet::icmp_error(
                "[2001:db8:2::2]:0",
                "[2001:db8:2::1]:0",
                ICMP6_DEST_UNREACH,
                ICMP6_PORT_UNREACH,
                0,
                &sent.datagram(),
                48,
            )
            .macs(BACKEND_MAC, e.vb_mac)
            .build(),
            XDP_REDIRECT,
            FWD_REDIRECT,
        )
        .ingress(e.vb)
        .output(
            Packet::icmp_error(
                "[2001:db8:100::1]:0",
                &client(0),
                ICMP6_DEST_UNREACH,
                ICMP6_PORT_UNREACH,
                0,
                &as_client_sent.datagram(),
                48,
            )
            .ttl(63)
            .macs(LB_MAC, CLIENT_MAC)
            .build(),
        )
        .also(ICMP_TRANSLATED_OUT)
        .also(SIGNAL_SENT),
        Fixture::new(
            "an echo request to a SNAT address: the host's own, passed",
            Packet::icmp_echo("[2001:db8:2::2]:0", "[2001:db8:2::1]:0", false, 1, 1)
                .macs(BACKEND_MAC, e.vb_mac)
                .build(),
            XDP_PASS,
            PASS_NOT_VIP,
        )
        .ingress(e.vb),
        Fixture::new(
            "the backend resets the flow: forwarded",
            Packet::tcp("[2001:db8:2::2]:8080", &snat, TCP_RST)
                .macs(BACKEND_MAC, e.vb_mac)
                .build(),
            XDP_REDIRECT,
            FWD_REDIRECT,
        )
        .ingress(e.vb)
        .any_output()
        .also(REPLY),
    ];
    check_expected(&fixtures);
    e.run(&fixtures);
}
