//! Passive health signals through BPF_PROG_TEST_RUN: a backend refusing a SYN, a SYN
//! retransmitted without an answer, an ICMP destination unreachable about a flow; each reported
//! once with the right backend and service, counted, and a full ring buffer counted as lost.

use std::{thread::sleep, time::Duration};

use lb_common::{PassiveSignal, SIGNALS_RING_BYTES, counter::*, signal_kind};
use lb_tests::{
    fixture::{Fixture, XDP_PASS, XDP_REDIRECT, run_once},
    packet::{
        CLIENT_MAC, ICMP_DEST_UNREACH, LB_MAC, Packet, TCP_ACK, TCP_FIN, TCP_PSH, TCP_RST, TCP_SYN,
    },
    require_root,
    testnet::TestNet,
};

/// Two services, so that the ids a signal carries are not all 0.
const SERVICES: &str = r#"
[[service]]
name = "web"
vip = "10.100.0.1:80"
backends = [{ address = "10.0.2.2:8080" }]

[[service]]
name = "api"
vip = "10.100.0.2:80"
backends = [{ address = "10.0.2.3:8080" }]

[[service]]
name = "dns"
vip = "10.100.0.2:53"
protocol = "udp"
backends = [{ address = "10.0.2.3:5353" }]

[[service]]
name = "quiet"
vip = "10.100.0.4:80"
backends = [{ address = "10.0.2.4:8080" }]
[service.passive]
no_data_timeout = "200ms"
"#;

const API_VIP: &str = "10.100.0.2:80";
const API_BACKEND: &str = "10.0.2.3:8080";
const BACKEND_MAC: [u8; 6] = [0x02, 0, 0, 0, 0x01, 0x01];
/// Longer than `SYN_RETRANSMIT_MIN_NS`, so a repeated SYN counts as a retransmission.
const RETRANSMIT_GAP: Duration = Duration::from_millis(250);

fn env() -> TestNet {
    require_root();
    TestNet::new("ring_size = 1009", SERVICES).unwrap()
}

/// The signal `kind` for service `service`'s backend `backend` as the daemon's ids name them.
fn signal(e: &TestNet, service: &str, backend: &str, kind: u32, detail: u32) -> PassiveSignal {
    let s = e.balancer.service_index(service).unwrap();
    let b = e
        .balancer
        .backend_index(s, backend.parse().unwrap())
        .unwrap();
    PassiveSignal {
        backend_id: e.balancer.backend_id(s, b).unwrap(),
        service_id: e.balancer.service_id(s).unwrap(),
        kind,
        detail,
    }
}

/// A client packet to the API service, forwarded to its backend.
fn client(e: &TestNet, desc: &str, cport: u16, flags: u8) -> Fixture {
    Fixture::new(
        desc,
        Packet::tcp(&format!("10.0.1.2:{cport}"), API_VIP, flags).build(),
        XDP_REDIRECT,
        FWD_REDIRECT,
    )
    .ingress(e.vc)
    .any_output()
}

/// A packet of the API backend to the SNAT address of client port `cport`'s flow.
fn backend(e: &TestNet, desc: &str, cport: u16, flags: u8) -> Fixture {
    let p = e.snat_port("10.0.1.2", cport, "10.100.0.2", 80, 6);
    e.from_backend(desc, API_BACKEND, &format!("10.0.2.1:{p}"), flags)
}

#[test]
fn a_backend_refusing_a_syn_is_reported_once() {
    let mut e = env();
    e.run(&[
        client(&e, "SYN", 45000, TCP_SYN).also(CT_NEW),
        backend(
            &e,
            "RST+ACK from the backend: refused",
            45000,
            TCP_RST | TCP_ACK,
        )
        .also(SIGNAL_SENT),
        backend(
            &e,
            "the RST again: the flow is closing, not reported",
            45000,
            TCP_RST | TCP_ACK,
        ),
    ]);
    assert_eq!(
        e.dp.take_signals().unwrap(),
        [signal(&e, "api", API_BACKEND, signal_kind::REFUSED, 0)]
    );
    assert!(e.dp.take_signals().unwrap().is_empty(), "drained");

    // The client tries again from the same port: a new connection, refused again.
    e.run(&[
        client(
            &e,
            "SYN on the closed flow: a new connection",
            45000,
            TCP_SYN,
        )
        .also(CT_NEW),
        backend(&e, "RST: refused again", 45000, TCP_RST).also(SIGNAL_SENT),
    ]);
    assert_eq!(e.dp.take_signals().unwrap().len(), 1);
}

#[test]
fn resets_after_an_answer_are_not_refusals() {
    let mut e = env();
    e.run(&[
        client(&e, "SYN", 45100, TCP_SYN).also(CT_NEW),
        backend(&e, "SYN+ACK", 45100, TCP_SYN | TCP_ACK),
        backend(
            &e,
            "RST before the client's ACK: not a refusal",
            45100,
            TCP_RST,
        ),
        client(
            &e,
            "SYN, established, then RST: a new connection",
            45101,
            TCP_SYN,
        )
        .also(CT_NEW),
        backend(&e, "SYN+ACK", 45101, TCP_SYN | TCP_ACK),
        client(&e, "ACK", 45101, TCP_ACK),
        client(&e, "data", 45101, TCP_ACK),
        backend(&e, "data", 45101, TCP_ACK),
        backend(
            &e,
            "RST of an established connection: not a refusal",
            45101,
            TCP_RST | TCP_ACK,
        ),
        client(&e, "SYN", 45102, TCP_SYN).also(CT_NEW),
        backend(&e, "SYN+ACK", 45102, TCP_SYN | TCP_ACK),
        client(&e, "FIN", 45102, TCP_FIN | TCP_ACK),
        backend(&e, "RST after the client's FIN", 45102, TCP_RST),
    ]);
    // The SYN+ACK was lost on the client's side: its retransmitted SYN is not the backend's fault.
    e.run(&[
        client(&e, "SYN", 45103, TCP_SYN).also(CT_NEW),
        backend(&e, "SYN+ACK", 45103, TCP_SYN | TCP_ACK),
    ]);
    sleep(RETRANSMIT_GAP);
    e.run(&[client(
        &e,
        "SYN retransmitted after the backend answered: not a timeout",
        45103,
        TCP_SYN,
    )]);
    let signals = e.dp.take_signals().unwrap();
    assert!(signals.is_empty(), "{signals:?}");
}

#[test]
fn a_retransmitted_syn_without_answer_is_a_connect_timeout_once_per_flow() {
    let mut e = env();
    e.run(&[
        client(&e, "SYN", 45200, TCP_SYN).also(CT_NEW),
        client(
            &e,
            "the same SYN at once: a duplicate, not a retransmission",
            45200,
            TCP_SYN,
        ),
    ]);
    sleep(RETRANSMIT_GAP);
    e.run(&[
        client(
            &e,
            "SYN retransmitted, no answer: connect timeout",
            45200,
            TCP_SYN,
        )
        .also(SIGNAL_SENT),
        client(&e, "a third SYN: once per flow", 45200, TCP_SYN),
    ]);
    sleep(RETRANSMIT_GAP);
    e.run(&[
        client(&e, "a fourth, later: still once", 45200, TCP_SYN),
        backend(
            &e,
            "then the backend refuses: the same failed attempt, not reported twice",
            45200,
            TCP_RST | TCP_ACK,
        ),
    ]);
    assert_eq!(
        e.dp.take_signals().unwrap(),
        [signal(
            &e,
            "api",
            API_BACKEND,
            signal_kind::CONNECT_TIMEOUT,
            0
        )]
    );
}

/// An ICMP destination unreachable from `from` to the SNAT address, quoting `quoted` (a packet
/// lb sent to the backend; its IPv4 header and first 8 bytes of TCP/UDP).
fn icmp_unreachable(e: &TestNet, from: &str, code: u8, quoted: &Packet) -> Vec<u8> {
    Packet::icmp_error(
        &format!("{from}:0"),
        "10.0.2.1:0",
        ICMP_DEST_UNREACH,
        code,
        0,
        &quoted.datagram(),
        28,
    )
    .macs(BACKEND_MAC, e.vb_mac)
    .build()
}

/// What the client gets of it: from the VIP, quoting `quoted` (what the client sent).
fn to_client(code: u8, quoted: &Packet) -> Vec<u8> {
    Packet::icmp_error(
        "10.100.0.2:0",
        "10.0.1.2:0",
        ICMP_DEST_UNREACH,
        code,
        0,
        &quoted.datagram(),
        28,
    )
    .ttl(63)
    .macs(LB_MAC, CLIENT_MAC)
    .build()
}

#[test]
fn an_icmp_unreachable_about_a_flow_is_reported_and_translated() {
    let mut e = env();
    let p = e.snat_port("10.0.1.2", 45300, "10.100.0.2", 80, 6);
    let sent = Packet::tcp(&format!("10.0.2.1:{p}"), API_BACKEND, TCP_SYN).ttl(63);
    let syn = Packet::tcp("10.0.1.2:45300", "10.100.0.2:80", TCP_SYN).ttl(63);
    let pu = e.snat_port("10.0.1.2", 45301, "10.100.0.2", 53, 17);
    let sent_udp = Packet::udp(&format!("10.0.2.1:{pu}"), "10.0.2.3:5353")
        .payload(b"q")
        .ttl(63);
    let query = Packet::udp("10.0.1.2:45301", "10.100.0.2:53")
        .payload(b"q")
        .ttl(63);
    let other = Packet::tcp("10.0.2.1:1234", API_BACKEND, TCP_SYN);
    let passed = |desc: &str, frame: Vec<u8>| {
        Fixture::new(desc, frame, XDP_PASS, PASS_NOT_VIP).ingress(e.vb)
    };
    // Translated back to the client (issue 13): from the VIP, quoting what the client sent.
    let translated = |desc: &str, frame: Vec<u8>, out: Vec<u8>| {
        Fixture::new(desc, frame, XDP_REDIRECT, FWD_REDIRECT)
            .ingress(e.vb)
            .output(out)
            .also(ICMP_TRANSLATED_OUT)
    };
    e.run(&[
        client(&e, "SYN", 45300, TCP_SYN).also(CT_NEW),
        translated(
            "host unreachable from a router about it: reported, sent to the client",
            icmp_unreachable(&e, "10.0.2.254", 1, &sent),
            to_client(1, &syn),
        )
        .also(SIGNAL_SENT),
        translated(
            "port unreachable about it again: once per TCP connection",
            icmp_unreachable(&e, "10.0.2.3", 3, &sent),
            to_client(3, &syn),
        ),
        passed(
            "about a port no flow holds: the host's, passed",
            icmp_unreachable(&e, "10.0.2.3", 3, &other),
        ),
        Fixture::new(
            "UDP query",
            Packet::udp("10.0.1.2:45301", "10.100.0.2:53")
                .payload(b"q")
                .build(),
            XDP_REDIRECT,
            FWD_REDIRECT,
        )
        .ingress(e.vc)
        .any_output()
        .also(CT_NEW),
        translated(
            "fragmentation needed: path MTU, not a failure",
            icmp_unreachable(&e, "10.0.2.3", 4, &sent_udp),
            to_client(4, &query),
        ),
        translated(
            "port unreachable about the UDP flow",
            icmp_unreachable(&e, "10.0.2.3", 3, &sent_udp),
            to_client(3, &query),
        )
        .also(SIGNAL_SENT),
        translated(
            "and again: UDP reports each one",
            icmp_unreachable(&e, "10.0.2.3", 3, &sent_udp),
            to_client(3, &query),
        )
        .also(SIGNAL_SENT),
        passed(
            "an echo request to the SNAT address: the host's",
            Packet::ip_proto("10.0.2.3:0", "10.0.2.1:0", 1)
                .payload(&[8, 0, 0xf7, 0xfe, 0, 1, 0, 0])
                .build(),
        ),
    ]);
    assert_eq!(
        e.dp.take_signals().unwrap(),
        [
            signal(&e, "api", API_BACKEND, signal_kind::UNREACHABLE, 1),
            signal(&e, "dns", "10.0.2.3:5353", signal_kind::UNREACHABLE, 3),
            signal(&e, "dns", "10.0.2.3:5353", signal_kind::UNREACHABLE, 3),
        ]
    );
}

/// More refusals than the ring holds, none drained: the excess is counted lost, never silent;
/// once drained, signals flow again.
#[test]
fn a_full_ring_counts_lost_signals() {
    let mut e = env();
    let capacity = (SIGNALS_RING_BYTES / 24) as u64; // 8-byte header + 16-byte record
    let flows = capacity + 100;
    let refuse = |e: &TestNet, i: u64| {
        let cport = 1024 + i as u16;
        let syn = Packet::tcp(
            &format!("10.0.{}.{}:{cport}", 3 + i / 250, 1 + i % 250),
            API_VIP,
            TCP_SYN,
        )
        .build();
        let out = run_once(e.dp.program(), &syn, e.vc).unwrap();
        assert_eq!(out.verdict, XDP_REDIRECT, "SYN {i}");
        // Reply to the SNAT port the SYN went out with (bytes 34..36: TCP source port).
        let snat_port = u16::from_be_bytes([out.output[34], out.output[35]]);
        let rst = Packet::tcp(
            API_BACKEND,
            &format!("10.0.2.1:{snat_port}"),
            TCP_RST | TCP_ACK,
        )
        .macs(BACKEND_MAC, e.vb_mac)
        .build();
        let out = run_once(e.dp.program(), &rst, e.vb).unwrap();
        assert_eq!(out.verdict, XDP_REDIRECT, "RST {i}");
    };
    e.ns.enter(|| (0..flows).for_each(|i| refuse(&e, i)));
    let stats = e.dp.stats().unwrap();
    let (sent, lost) = (stats.counter(SIGNAL_SENT), stats.counter(SIGNAL_LOST));
    assert_eq!(sent + lost, flows, "every signal sent or counted lost");
    assert_eq!(sent, capacity, "the ring holds {capacity}");
    let taken = e.dp.take_signals().unwrap();
    assert_eq!(taken.len() as u64, sent);
    let want = signal(&e, "api", API_BACKEND, signal_kind::REFUSED, 0);
    assert!(
        taken.iter().all(|s| *s == want),
        "{:?}",
        taken.iter().find(|s| **s != want)
    );

    e.ns.enter(|| refuse(&e, flows));
    let stats = e.dp.stats().unwrap();
    assert_eq!(
        stats.counter(SIGNAL_SENT),
        sent + 1,
        "room again after draining"
    );
    assert_eq!(stats.counter(SIGNAL_LOST), lost);
    assert_eq!(e.dp.take_signals().unwrap(), [want]);
}

/// The "no data back" signal (issue 13, seed 000): a connection on which the client sent data
/// and the backend sent none (only ACKs) within `no_data_timeout` is reported on the client's
/// next packet after it, once; one that got data back, or of a service without the check, is
/// not.
#[test]
fn a_connection_without_data_back_is_reported_once() {
    let mut e = env();
    let vip = "10.100.0.4:80";
    let backend = "10.0.2.4:8080";
    let to = |cport: u16, flags: u8, data: &[u8], desc: &str| {
        Fixture::new(
            desc,
            Packet::tcp(&format!("10.0.1.2:{cport}"), vip, flags)
                .payload(data)
                .build(),
            XDP_REDIRECT,
            FWD_REDIRECT,
        )
        .ingress(e.vc)
        .any_output()
    };
    let back = |cport: u16, flags: u8, data: &[u8], desc: &str| {
        let p = e.snat_port("10.0.1.2", cport, "10.100.0.4", 80, 6);
        Fixture::new(
            desc,
            Packet::tcp(backend, &format!("10.0.2.1:{p}"), flags)
                .payload(data)
                .macs(BACKEND_MAC, e.vb_mac)
                .build(),
            XDP_REDIRECT,
            FWD_REDIRECT,
        )
        .ingress(e.vb)
        .any_output()
        .also(REPLY)
    };
    let handshake = |cport: u16| {
        vec![
            to(cport, TCP_SYN, b"", "SYN").also(CT_NEW),
            back(cport, TCP_SYN | TCP_ACK, b"", "SYN+ACK"),
            to(cport, TCP_ACK, b"", "ACK"),
            to(
                cport,
                TCP_ACK | TCP_PSH,
                b"GET / HTTP/1.1\r\n\r\n",
                "the request",
            ),
        ]
    };
    // Two connections: one answered with data, one with a bare ACK only.
    let mut rows = handshake(46000);
    rows.push(back(
        46000,
        TCP_ACK | TCP_PSH,
        b"HTTP/1.1 200 OK\r\n\r\n",
        "an answer",
    ));
    rows.extend(handshake(46001));
    rows.push(back(46001, TCP_ACK, b"", "a bare ACK, no answer"));
    // And one of a service without the check, never answered.
    rows.push(
        Fixture::new(
            "the web service's request",
            Packet::tcp("10.0.1.2:46002", "10.100.0.1:80", TCP_SYN).build(),
            XDP_REDIRECT,
            FWD_REDIRECT,
        )
        .ingress(e.vc)
        .any_output()
        .also(CT_NEW),
    );
    e.run(&rows);
    e.run(&[to(46001, TCP_ACK, b"", "before the timeout: nothing yet")]);
    assert!(e.dp.take_signals().unwrap().is_empty());
    // The timeout passes (what is tested is a timeout: nothing to wait for but time).
    sleep(Duration::from_millis(300));
    e.run(&[to(46000, TCP_ACK, b"", "answered: no signal")]);
    e.run(&[
        to(46001, TCP_ACK | TCP_PSH, b"again", "unanswered: reported").also(SIGNAL_SENT),
        to(46001, TCP_FIN | TCP_ACK, b"", "once only"),
        Fixture::new(
            "the other service: never",
            Packet::tcp("10.0.1.2:46002", "10.100.0.1:80", TCP_ACK)
                .payload(b"x")
                .build(),
            XDP_REDIRECT,
            FWD_REDIRECT,
        )
        .ingress(e.vc)
        .any_output(),
    ]);
    assert_eq!(
        e.dp.take_signals().unwrap(),
        [signal(&e, "quiet", backend, signal_kind::NO_DATA, 0)]
    );
}

/// The same signals from IPv6 flows: a refused SYN, a retransmitted SYN without answer, an
/// ICMPv6 port unreachable (reported with ICMP's code for it, 3, as the daemon names codes).
#[test]
fn ipv6_flows_report_refusals_timeouts_and_unreachables() {
    use lb_tests::packet::{ICMP6_DEST_UNREACH, ICMP6_PORT_UNREACH};
    require_root();
    let mut e = TestNet::new(
        "ring_size = 1009",
        "[[service]]\nname = \"web6\"\nvip = \"[2001:db8:100::1]:80\"\nbackends = [{ address = \"[2001:db8:2::3]:8080\" }]\n",
    )
    .unwrap();
    let vip = "[2001:db8:100::1]:80";
    let backend_addr = "[2001:db8:2::3]:8080";
    let client6 = |desc: &str, cport: u16, flags: u8| {
        Fixture::new(
            desc,
            Packet::tcp(&format!("[2001:db8:1::2]:{cport}"), vip, flags).build(),
            XDP_REDIRECT,
            FWD_REDIRECT,
        )
        .ingress(e.vc)
        .any_output()
    };
    let snat = |cport: u16| {
        let p = e.snat_port("2001:db8:1::2", cport, "2001:db8:100::1", 80, 6);
        format!("[2001:db8:2::1]:{p}")
    };
    let backend6 =
        |desc: &str, cport: u16, flags: u8| e.from_backend(desc, backend_addr, &snat(cport), flags);
    let sent = Packet::tcp(&snat(45320), backend_addr, TCP_SYN).ttl(63);
    let unreachable = Packet::icmp_error(
        "[2001:db8:2::3]:0",
        "[2001:db8:2::1]:0",
        ICMP6_DEST_UNREACH,
        ICMP6_PORT_UNREACH,
        0,
        &sent.datagram(),
        48,
    )
    .macs(BACKEND_MAC, e.vb_mac)
    .build();
    e.run(&[
        client6("SYN", 45300, TCP_SYN).also(CT_NEW),
        backend6(
            "RST+ACK from the backend: refused",
            45300,
            TCP_RST | TCP_ACK,
        )
        .also(SIGNAL_SENT),
        client6("another flow's SYN", 45310, TCP_SYN).also(CT_NEW),
        client6("a third flow's SYN", 45320, TCP_SYN).also(CT_NEW),
        Fixture::new(
            "port unreachable about the third: reported and translated",
            unreachable,
            XDP_REDIRECT,
            FWD_REDIRECT,
        )
        .ingress(e.vb)
        .any_output()
        .also(ICMP_TRANSLATED_OUT)
        .also(SIGNAL_SENT),
    ]);
    sleep(RETRANSMIT_GAP);
    e.run(&[client6(
        "the second's SYN retransmitted: connect timeout",
        45310,
        TCP_SYN,
    )
    .also(SIGNAL_SENT)]);
    let sig = |kind, detail| signal(&e, "web6", backend_addr, kind, detail);
    let want = [
        sig(signal_kind::REFUSED, 0),
        sig(signal_kind::UNREACHABLE, 3),
        sig(signal_kind::CONNECT_TIMEOUT, 0),
    ];
    assert_eq!(e.dp.take_signals().unwrap(), want);
}
