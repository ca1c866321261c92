//! Direct server return through BPF_PROG_TEST_RUN: for each mode (`ipip`, `gue`) and family,
//! the exact bytes of a SYN, an established packet, a mid-stream packet without an entry (as
//! after another balancer had the flow), UDP, a VLAN tag kept, a packet too big for the path
//! (answered with ICMP to the client) and an ICMP error about a flow (encapsulated to its
//! backend), with their verdicts and counters, in the fixed network of [`lb_tests::testnet`].

use std::net::IpAddr;

use lb_common::{DEFAULT_GUE_PORT, counter::*};
use lb_tests::{
    fixture::{Fixture, XDP_DROP, XDP_REDIRECT, XDP_TX, check_expected},
    packet::{
        CLIENT_MAC, Encap, ICMP_DEST_UNREACH, ICMP_FRAG_NEEDED, ICMP6_PACKET_TOO_BIG, LB_MAC,
        Packet, TCP_ACK, TCP_PSH, TCP_SYN, at, encapsulate,
    },
    require_root,
    testnet::{BACKEND_MAC, TestNet, flow_hash},
};

const SERVICES: &str = r#"
[[service]]
name = "ipip4"
vip = "10.100.0.1:80"
forwarding = "ipip"
backends = [{ address = "10.0.2.2:80" }]

[[service]]
name = "gue4"
vip = "10.100.0.2:80"
forwarding = "gue"
backends = [{ address = "10.0.2.2:80" }]

[[service]]
name = "dns4"
vip = "10.100.0.1:53"
protocol = "udp"
forwarding = "gue"
backends = [{ address = "10.0.2.2:53" }]

[[service]]
name = "nat4"
vip = "10.100.0.3:80"
backends = [{ address = "10.0.2.9:8080" }]

[[service]]
name = "ipip6"
vip = "[2001:db8:100::1]:80"
forwarding = "ipip"
backends = [{ address = "[2001:db8:2::2]:80" }]

[[service]]
name = "gue6"
vip = "[2001:db8:100::2]:80"
forwarding = "gue"
backends = [{ address = "[2001:db8:2::2]:80" }]

[[service]]
name = "dns6"
vip = "[2001:db8:100::1]:53"
protocol = "udp"
forwarding = "ipip"
backends = [{ address = "[2001:db8:2::2]:53" }]
"#;

fn env() -> TestNet {
    require_root();
    let e = TestNet::new("ring_size = 1009", SERVICES).unwrap();
    // A path with a smaller MTU than the link's, for the full-NAT service's backend. Locked:
    // forwarding (the kernel's, and lb's through its route lookups) honours a route's MTU only
    // then, or with net.ipv4.ip_forward_use_pmtu.
    e.ns.ip(&[
        "route",
        "add",
        "10.0.2.9/32",
        "dev",
        &e.vb_name,
        "mtu",
        "lock",
        "1400",
    ])
    .unwrap();
    e
}

/// A client packet of `client:cport → vip:vport` as lb sends it to `backend` in `mode`
/// (`gue` or not), from lb's address `outer_src`.
struct Dsr<'a> {
    e: &'a TestNet,
    outer_src: &'static str,
    backend: &'static str,
}

impl Dsr<'_> {
    fn encap(&self, inner: &Packet, gue: bool, flow: (&str, u16, &str, u16, u8)) -> Vec<u8> {
        let hash = flow_hash(flow.0, flow.1, flow.2, flow.3, flow.4);
        encapsulate(
            &inner.build(),
            &Encap {
                gue_port: gue.then_some(DEFAULT_GUE_PORT),
                src: self.outer_src.parse::<IpAddr>().unwrap(),
                dst: self.backend.parse::<IpAddr>().unwrap(),
                hash,
                smac: self.e.vb_mac,
                dmac: BACKEND_MAC,
            },
        )
    }
}

/// SYN, established, mid-stream, UDP and a VLAN tag for both modes of one family.
fn flows(e: &TestNet, v6: bool) -> Vec<Fixture> {
    let (client, vips, dns_vip, outer_src, backend) = if v6 {
        (
            "2001:db8:1::2",
            [("2001:db8:100::1", false), ("2001:db8:100::2", true)],
            "2001:db8:100::1",
            "2001:db8:2::1",
            "2001:db8:2::2",
        )
    } else {
        (
            "10.0.1.2",
            [("10.100.0.1", false), ("10.100.0.2", true)],
            "10.100.0.1",
            "10.0.2.1",
            "10.0.2.2",
        )
    };
    let d = Dsr {
        e,
        outer_src,
        backend,
    };
    let mut out = Vec::new();
    for (i, (vip, gue)) in vips.into_iter().enumerate() {
        let mode = if gue { "gue" } else { "ipip" };
        let cport = 40000 + i as u16;
        let flow = (client, cport, vip, 80, 6);
        let (c, v) = (at(client, cport), at(vip, 80));
        let syn = Packet::tcp(&c, &v, TCP_SYN).tos(0x2e << 2);
        let data = Packet::tcp(&c, &v, TCP_ACK | TCP_PSH)
            .seq(1001, 5001)
            .payload(b"GET / HTTP/1.1\r\n\r\n");
        out.push(
            Fixture::new(
                format!("{mode}: SYN to the VIP, unchanged inside the outer header (DSCP kept)"),
                syn.build(),
                XDP_REDIRECT,
                FWD_REDIRECT,
            )
            .ingress(e.vc)
            .output(d.encap(&syn, gue, flow))
            .also(CT_NEW),
        );
        out.push(
            Fixture::new(
                format!("{mode}: established packet with data, the same backend"),
                data.build(),
                XDP_REDIRECT,
                FWD_REDIRECT,
            )
            .ingress(e.vc)
            .output(d.encap(&data, gue, flow)),
        );
        // A flow lb never saw: another balancer had it (or lb restarted).
        let mport = 41000 + i as u16;
        let mid = Packet::tcp(&at(client, mport), &v, TCP_ACK).seq(7000, 9000);
        out.push(
            Fixture::new(
                format!("{mode}: mid-stream without an entry, to Maglev's backend, re-created"),
                mid.build(),
                XDP_REDIRECT,
                FWD_REDIRECT,
            )
            .ingress(e.vc)
            .output(d.encap(&mid, gue, (client, mport, vip, 80, 6)))
            .also(CT_NEW)
            .also(CT_MISS_MIDSTREAM),
        );
        let tagged = Packet::tcp(&at(client, 42000 + i as u16), &v, TCP_SYN).vlan(7);
        out.push(
            Fixture::new(
                format!("{mode}: a VLAN tag is kept, the outer header after it"),
                tagged.build(),
                XDP_REDIRECT,
                FWD_REDIRECT,
            )
            .ingress(e.vc)
            .output(d.encap(&tagged, gue, (client, 42000 + i as u16, vip, 80, 6)))
            .also(CT_NEW)
            .also(VLAN),
        );
    }
    if v6 {
        // GUE's UDP checksum over IPv6 comes from the inner transport checksum, which
        // extension headers stand between: left 0, which RFC 6935 allows tunnels.
        let ext = Packet::tcp(&at(client, 46000), &at(vips[1].0, 80), TCP_SYN)
            .ext_header(lb_tests::packet::EXT_DEST_OPTS, 0);
        let mut want = d.encap(&ext, true, (client, 46000, vips[1].0, 80, 6));
        want[14 + 40 + 6..14 + 40 + 8].copy_from_slice(&[0, 0]);
        out.push(
            Fixture::new(
                "gue: inner extension headers, the outer UDP checksum 0",
                ext.build(),
                XDP_REDIRECT,
                FWD_REDIRECT,
            )
            .ingress(e.vc)
            .output(want)
            .also(CT_NEW)
            .also(IPV6_EXT_HEADERS),
        );
    }
    // UDP: gue for IPv4's DNS service, ipip for IPv6's.
    let udp = Packet::udp(&at(client, 43000), &at(dns_vip, 53)).payload(b"query");
    out.push(
        Fixture::new(
            "UDP to a direct-server-return service",
            udp.build(),
            XDP_REDIRECT,
            FWD_REDIRECT,
        )
        .ingress(e.vc)
        .output(d.encap(&udp, !v6, (client, 43000, dns_vip, 53, 17)))
        .also(CT_NEW),
    );
    out
}

#[test]
fn encapsulated_flows_of_both_modes_and_families() {
    let e = env();
    for v6 in [false, true] {
        let fixtures = flows(&e, v6);
        check_expected(&fixtures);
        e.run(&fixtures);
    }
}

/// The ICMP answer to a too-big `pkt` from `client` to `vip`: the MTU that fits, quoting the
/// first 548 (IPv4) or 1232 (IPv6) bytes of it.
fn too_big_answer(pkt: &Packet, client: &str, vip: &str, mtu: u16) -> Vec<u8> {
    let quoted = pkt.datagram();
    let v6 = client.contains(':');
    let answer = if v6 {
        Packet::icmp_error(
            &at(vip, 0),
            &at(client, 0),
            ICMP6_PACKET_TOO_BIG,
            0,
            mtu,
            &quoted,
            1232,
        )
    } else {
        Packet::icmp_error(
            &at(vip, 0),
            &at(client, 0),
            ICMP_DEST_UNREACH,
            ICMP_FRAG_NEEDED,
            mtu,
            &quoted,
            548,
        )
        .tos(0xc0)
        .ip_id(0)
    };
    answer.macs(LB_MAC, CLIENT_MAC).build()
}

#[test]
fn packets_too_big_for_the_path_are_answered_with_the_mtu_that_fits() {
    let e = env();
    // A 1500-byte datagram (the links' MTU): the encapsulated one would not fit.
    let full = |src: &str, dst: &str, header: usize| {
        Packet::tcp(src, dst, TCP_ACK)
            .seq(1, 1)
            .payload(&vec![0x5a; 1500 - header - 20])
    };
    let mut fixtures = Vec::new();
    for (vip, overhead, mode) in [("10.100.0.1", 20, "ipip"), ("10.100.0.2", 28, "gue")] {
        let pkt = full("10.0.1.2:44000", &at(vip, 80), 20).dont_fragment();
        fixtures.push(
            Fixture::new(
                format!(
                    "IPv4 {mode}: 1500 bytes with DF → fragmentation needed, MTU 1500 - {overhead}"
                ),
                pkt.build(),
                XDP_TX,
                ICMP_TOO_BIG,
            )
            .ingress(e.vc)
            .output(too_big_answer(&pkt, "10.0.1.2", vip, 1500 - overhead)),
        );
    }
    for (vip, overhead, mode) in [
        ("2001:db8:100::1", 40, "ipip"),
        ("2001:db8:100::2", 48, "gue"),
    ] {
        let pkt = full("[2001:db8:1::2]:44000", &at(vip, 80), 40);
        fixtures.push(
            Fixture::new(
                format!("IPv6 {mode}: 1500 bytes → packet too big, MTU 1500 - {overhead}"),
                pkt.build(),
                XDP_TX,
                ICMP_TOO_BIG,
            )
            .ingress(e.vc)
            .output(too_big_answer(&pkt, "2001:db8:1::2", vip, 1500 - overhead)),
        );
    }
    // Full NAT adds nothing, but the route to this backend has MTU 1400.
    let nat = full("10.0.1.2:44001", "10.100.0.3:80", 20).dont_fragment();
    fixtures.push(
        Fixture::new(
            "full NAT over a route of MTU 1400: fragmentation needed, MTU 1400",
            nat.build(),
            XDP_TX,
            ICMP_TOO_BIG,
        )
        .ingress(e.vc)
        .output(too_big_answer(&nat, "10.0.1.2", "10.100.0.3", 1400)),
    );
    let fits = Packet::tcp("10.0.1.2:44002", "10.100.0.3:80", TCP_SYN).payload(&[1; 1300]);
    fixtures.push(
        Fixture::new(
            "full NAT: a packet that fits the route's MTU is forwarded",
            fits.build(),
            XDP_REDIRECT,
            FWD_REDIRECT,
        )
        .ingress(e.vc)
        .any_output()
        .also(CT_NEW),
    );
    fixtures.push(
        Fixture::new(
            "IPv4 without DF: lb does not fragment, dropped",
            full("10.0.1.2:44003", "10.100.0.1:80", 20).build(),
            XDP_DROP,
            DROP_TOO_BIG,
        )
        .ingress(e.vc),
    );
    // What fits exactly: 1480 bytes inside 20 of IP in IP.
    let exact = full("10.0.1.2:44004", "10.100.0.1:80", 40).dont_fragment();
    fixtures.push(
        Fixture::new(
            "IPv4 ipip: 1480 bytes fit the 1500-byte path exactly",
            exact.build(),
            XDP_REDIRECT,
            FWD_REDIRECT,
        )
        .ingress(e.vc)
        .any_output()
        .also(CT_NEW)
        .also(CT_MISS_MIDSTREAM),
    );
    check_expected(&fixtures);
    e.run(&fixtures);
}

#[test]
fn icmp_errors_about_a_dsr_flow_go_to_its_backend_unchanged() {
    let e = env();
    let mut fixtures = Vec::new();
    for (client, vip, router, backend, outer_src) in [
        (
            "10.0.1.2",
            "10.100.0.1",
            "10.0.1.254",
            "10.0.2.2",
            "10.0.2.1",
        ),
        (
            "2001:db8:1::2",
            "2001:db8:100::1",
            "2001:db8:1::fe",
            "2001:db8:2::2",
            "2001:db8:2::1",
        ),
    ] {
        let v6 = client.contains(':');
        let (c, v) = (at(client, 45000), at(vip, 80));
        let syn = Packet::tcp(&c, &v, TCP_SYN);
        fixtures.push(
            Fixture::new("SYN: the flow", syn.build(), XDP_REDIRECT, FWD_REDIRECT)
                .ingress(e.vc)
                .any_output()
                .also(CT_NEW),
        );
        // The backend's reply (from the VIP, straight to the client) hit a smaller MTU on its
        // way: the router says so to the VIP, which is routed to lb.
        let reply = Packet::tcp(&v, &c, TCP_ACK | TCP_PSH)
            .seq(5001, 1001)
            .payload(&[0x42; 1400])
            .datagram();
        let (ty, code) = if v6 {
            (ICMP6_PACKET_TOO_BIG, 0)
        } else {
            (ICMP_DEST_UNREACH, ICMP_FRAG_NEEDED)
        };
        let err = Packet::icmp_error(&at(router, 0), &at(vip, 0), ty, code, 1280, &reply, 548)
            .macs(CLIENT_MAC, LB_MAC);
        let d = Dsr {
            e: &e,
            outer_src: if v6 { "2001:db8:2::1" } else { outer_src },
            backend,
        };
        fixtures.push(
            Fixture::new(
                format!(
                    "{} error about the flow: encapsulated to its backend",
                    if v6 { "ICMPv6" } else { "ICMP" }
                ),
                err.build(),
                XDP_REDIRECT,
                FWD_REDIRECT,
            )
            .ingress(e.vc)
            .output(d.encap(&err, false, (client, 45000, vip, 80, 6)))
            .also(ICMP_ENCAPSULATED),
        );
    }
    check_expected(&fixtures);
    e.run(&fixtures);
}

/// Flood mode (`dsr_flood_rate`, here 3 a second): a direct-server-return service's SYNs beyond
/// the rate on one CPU are forwarded as before (the same bytes to the same backend) but take no
/// connection table entry (`dsr_flood`, no `ct_new`); such a flow's next packet makes its entry
/// (a mid-stream miss). Each service counts its own; full NAT, which needs its entries, and UDP
/// never enter flood mode.
#[test]
fn syns_beyond_the_flood_rate_of_a_dsr_service_take_no_entry() {
    require_root();
    let e = TestNet::new("ring_size = 1009\ndsr_flood_rate = 3", SERVICES).unwrap();
    let mut rows = Vec::new();
    for (client, vip, outer_src, backend, gue) in [
        ("10.0.1.2", "10.100.0.1", "10.0.2.1", "10.0.2.2", false),
        (
            "2001:db8:1::2",
            "2001:db8:100::2",
            "2001:db8:2::1",
            "2001:db8:2::2",
            true,
        ),
    ] {
        let d = Dsr {
            e: &e,
            outer_src,
            backend,
        };
        let mode = if gue { "gue, IPv6" } else { "ipip, IPv4" };
        for i in 0..5u16 {
            let cport = 50000 + i;
            let syn = Packet::tcp(&at(client, cport), &at(vip, 80), TCP_SYN);
            let row = Fixture::new(
                format!("{mode}: SYN {} of 5", i + 1),
                syn.build(),
                XDP_REDIRECT,
                FWD_REDIRECT,
            )
            .ingress(e.vc)
            .output(d.encap(&syn, gue, (client, cport, vip, 80, 6)));
            rows.push(if i < 3 {
                row.also(CT_NEW)
            } else {
                row.also(DSR_FLOOD)
            });
        }
        // The last flooded SYN's handshake completes: its ACK finds no entry and makes one.
        let ack = Packet::tcp(&at(client, 50004), &at(vip, 80), TCP_ACK).seq(1, 1);
        rows.push(
            Fixture::new(
                format!("{mode}: the ACK of a SYN sent in flood mode makes its entry"),
                ack.build(),
                XDP_REDIRECT,
                FWD_REDIRECT,
            )
            .ingress(e.vc)
            .output(d.encap(&ack, gue, (client, 50004, vip, 80, 6)))
            .also(CT_MISS_MIDSTREAM)
            .also(CT_NEW),
        );
        // ... and the next packet of that flow is an established one.
        let data = Packet::tcp(&at(client, 50004), &at(vip, 80), TCP_ACK | TCP_PSH)
            .seq(1, 1)
            .payload(b"GET / HTTP/1.1\r\n\r\n");
        rows.push(
            Fixture::new(
                format!("{mode}: then its data goes by its entry"),
                data.build(),
                XDP_REDIRECT,
                FWD_REDIRECT,
            )
            .ingress(e.vc)
            .output(d.encap(&data, gue, (client, 50004, vip, 80, 6))),
        );
    }
    // Another service keeps its own count: the IPv4 gue service is under its rate.
    let syn = Packet::tcp(&at("10.0.1.2", 50010), &at("10.100.0.2", 80), TCP_SYN);
    rows.push(
        Fixture::new(
            "another DSR service: its own count, an entry",
            syn.build(),
            XDP_REDIRECT,
            FWD_REDIRECT,
        )
        .ingress(e.vc)
        .any_output()
        .also(CT_NEW),
    );
    for i in 0..5u16 {
        let nat = Packet::tcp(&at("10.0.1.2", 51000 + i), &at("10.100.0.3", 80), TCP_SYN);
        rows.push(
            Fixture::new(
                format!("full NAT: SYN {} of 5, an entry each", i + 1),
                nat.build(),
                XDP_REDIRECT,
                FWD_REDIRECT,
            )
            .ingress(e.vc)
            .any_output()
            .also(CT_NEW),
        );
        let udp = Packet::udp(&at("10.0.1.2", 52000 + i), &at("10.100.0.1", 53)).payload(b"q");
        rows.push(
            Fixture::new(
                format!(
                    "UDP to a DSR service: datagram {} of 5, an entry each",
                    i + 1
                ),
                udp.build(),
                XDP_REDIRECT,
                FWD_REDIRECT,
            )
            .ingress(e.vc)
            .any_output()
            .also(CT_NEW),
        );
    }
    // The rate is per CPU and per second: one CPU, rows run within milliseconds.
    e.ns.enter(|| {
        lb_tests::fixture::on_cpu0();
        lb_tests::fixture::run_fixtures(&e.dp, &rows);
    });
}
