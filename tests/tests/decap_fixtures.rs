//! The backend's decapsulator (`lb-decap`) through BPF_PROG_TEST_RUN: every encapsulation it
//! opens, what it passes untouched, malformed frames, truncations at every offset of the outer
//! and inner headers, ECN, parameters changed in place, and mutated frames; each row with its
//! verdict, exact output bytes and the counter that must count it. Inputs are built with the
//! test kit's `encapsulate`, as the balancer encapsulates; a decapsulated frame must be the
//! original inner frame behind the outer frame's MAC addresses.

use lb::decap::{Destinations, Unpinned};
use lb_common::{
    DEFAULT_GUE_PORT, PROTO_IPIP, PROTO_IPV6_IN_IP,
    decap_counter::{self, *},
};
use lb_tests::{
    fixture::{Counters, Fixture, XDP_DROP, XDP_PASS, run_once, run_table},
    packet::{
        EXT_HOP_BY_HOP, Encap, ICMP6_NEIGHBOR_SOLICIT, Packet, TCP_ACK, TCP_SYN, checksum,
        decapsulate, encapsulate, verify_checksums,
    },
    require_root,
    rng::Rng,
};

/// The balancer (outer source), this backend, another backend; both families.
const LB4: &str = "10.0.2.1";
const HOST4: &str = "10.0.2.10";
const OTHER4: &str = "10.0.2.99";
const LB6: &str = "2001:db8:2::1";
const HOST6: &str = "2001:db8:2::10";
const OTHER6: &str = "2001:db8:2::99";
const BALANCER_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x0b];
const HOST_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x0c];
const GUE: Option<u16> = Some(DEFAULT_GUE_PORT);
const IPIP: Option<u16> = None;

const NOT_ECT: u8 = 0;
const ECT1: u8 = 1;
const ECT0: u8 = 2;
const CE: u8 = 3;

/// The decapsulator as `lb decap` sets it up by default: GUE on 6080, strict destination with
/// this host's addresses.
fn decap() -> Unpinned {
    require_root();
    let mut d = Unpinned::load().expect("loading lb-decap");
    d.configure(DEFAULT_GUE_PORT, &host_addresses()).unwrap();
    d
}

fn host_addresses() -> Destinations {
    Destinations::Listed(vec![HOST4.parse().unwrap(), HOST6.parse().unwrap()])
}

fn run(d: &Unpinned, fixtures: &[Fixture]) {
    let read = || d.counters();
    let counters = Counters {
        names: &decap_counter::NAMES,
        verdicts: decap_counter::VERDICTS,
        read: &read,
    };
    run_table(d.program(), &counters, fixtures);
}

fn tcp4() -> Packet {
    Packet::tcp("10.0.1.2:40000", "10.100.0.1:80", TCP_SYN).payload(b"hello")
}

fn udp4() -> Packet {
    Packet::udp("10.0.1.2:40001", "10.100.0.1:53").payload(b"query")
}

fn tcp6() -> Packet {
    Packet::tcp("[2001:db8:1::2]:40000", "[2001:db8:100::1]:80", TCP_ACK).payload(b"GET /")
}

fn udp6() -> Packet {
    Packet::udp("[2001:db8:1::2]:40001", "[2001:db8:100::1]:53").payload(b"q")
}

/// `inner` encapsulated by the balancer at `src` for the backend at `dst` (IP in IP, or GUE
/// to `gue`).
fn enc(inner: &[u8], gue: Option<u16>, src: &str, dst: &str) -> Vec<u8> {
    let src: std::net::IpAddr = src.parse().unwrap();
    let mut frame = encapsulate(
        inner,
        &Encap {
            gue_port: gue,
            src,
            dst: dst.parse().unwrap(),
            hash: 0x0123_4567_89ab_cdef,
            smac: BALANCER_MAC,
            dmac: HOST_MAC,
        },
    );
    // The kit keeps the inner frame's EtherType, which is the outer header's only when both are
    // of one family (always, from lb); these tests mix them too.
    let at = l3(&frame);
    let ether_type: u16 = if src.is_ipv4() { 0x0800 } else { 0x86dd };
    frame[at - 2..at].copy_from_slice(&ether_type.to_be_bytes());
    frame
}

/// Where a frame's IP header starts (past one VLAN tag).
fn l3(frame: &[u8]) -> usize {
    if frame[12..14] == [0x81, 0x00] {
        18
    } else {
        14
    }
}

fn is_v4(frame: &[u8], at: usize) -> bool {
    frame[at] >> 4 == 4
}

/// The IPv4 header at `at` with its checksum computed again.
fn fix_ipv4_checksum(frame: &mut [u8], at: usize) {
    let ihl = usize::from(frame[at] & 0x0f) * 4;
    frame[at + 10..at + 12].fill(0);
    let c = checksum(&frame[at..at + ihl]);
    frame[at + 10..at + 12].copy_from_slice(&c.to_be_bytes());
}

/// The outer header's length: IPv4's IHL, IPv6's 40 (plus a fragment header right after it).
fn outer_len(frame: &[u8]) -> usize {
    let at = l3(frame);
    if is_v4(frame, at) {
        usize::from(frame[at] & 0x0f) * 4
    } else if frame[at + 6] == 44 {
        48
    } else {
        40
    }
}

/// The outer protocol field (IPv4's protocol, IPv6's next header) set to `proto`.
fn set_outer_proto(mut frame: Vec<u8>, proto: u8) -> Vec<u8> {
    let at = l3(&frame);
    if is_v4(&frame, at) {
        frame[at + 9] = proto;
        fix_ipv4_checksum(&mut frame, at);
    } else {
        frame[at + 6] = proto;
    }
    frame
}

/// The outer datagram made a fragment: IPv4's flags and offset; IPv6 gets a fragment header.
fn outer_fragment(mut frame: Vec<u8>, more: bool, offset: u16) -> Vec<u8> {
    let at = l3(&frame);
    if is_v4(&frame, at) {
        let word = (u16::from(more) << 13) | offset;
        frame[at + 6..at + 8].copy_from_slice(&word.to_be_bytes());
        fix_ipv4_checksum(&mut frame, at);
        return frame;
    }
    let next = frame[at + 6];
    let word = (offset << 3) | u16::from(more);
    let mut header = vec![next, 0];
    header.extend_from_slice(&word.to_be_bytes());
    header.extend_from_slice(&[0, 0, 0x12, 0x34]);
    frame.splice(at + 40..at + 40, header);
    frame[at + 6] = 44;
    add_to_ipv6_payload(&mut frame, at, 8);
    frame
}

fn add_to_ipv6_payload(frame: &mut [u8], at: usize, more: i32) {
    let len = i32::from(u16::from_be_bytes([frame[at + 4], frame[at + 5]])) + more;
    frame[at + 4..at + 6].copy_from_slice(&(len as u16).to_be_bytes());
}

/// The frame cut to `keep` bytes with the outer lengths (IP, and GUE's UDP length once its
/// header is whole) saying so: a packet broken before it was encapsulated, or by the sender.
fn cut_consistently(mut frame: Vec<u8>, keep: usize) -> Vec<u8> {
    let at = l3(&frame);
    let udp = at + outer_len(&frame);
    let gue = frame[if is_v4(&frame, at) { at + 9 } else { at + 6 }] == 17;
    frame.truncate(keep);
    if is_v4(&frame, at) {
        frame[at + 2..at + 4].copy_from_slice(&((keep - at) as u16).to_be_bytes());
        fix_ipv4_checksum(&mut frame, at);
    } else {
        frame[at + 4..at + 6].copy_from_slice(&((keep - at - 40) as u16).to_be_bytes());
    }
    if gue && keep >= udp + 8 {
        frame[udp + 4..udp + 6].copy_from_slice(&((keep - udp) as u16).to_be_bytes());
    }
    frame
}

/// The ECN bits of the IP header at `at` set to `ecn` (IPv4's checksum kept right).
fn set_ecn(mut frame: Vec<u8>, at: usize, ecn: u8) -> Vec<u8> {
    if is_v4(&frame, at) {
        frame[at + 1] = (frame[at + 1] & !3) | ecn;
        fix_ipv4_checksum(&mut frame, at);
    } else {
        frame[at + 1] = (frame[at + 1] & !0x30) | (ecn << 4);
    }
    frame
}

/// What decapsulating `outer` must give: its MAC addresses, then `inner` from its VLAN tag or
/// EtherType on, unchanged.
fn stripped(outer: &[u8], inner: &[u8]) -> Vec<u8> {
    let mut out = outer[..12].to_vec();
    out.extend_from_slice(&inner[12..]);
    out
}

fn opened(desc: impl Into<String>, outer: Vec<u8>, inner: &[u8], counter: u32) -> Fixture {
    let output = stripped(&outer, inner);
    Fixture::new(desc, outer, XDP_PASS, counter).output(output)
}

fn untouched(desc: impl Into<String>, frame: Vec<u8>, counter: u32) -> Fixture {
    Fixture::new(desc, frame, XDP_PASS, counter)
}

fn dropped(desc: impl Into<String>, frame: Vec<u8>, counter: u32) -> Fixture {
    Fixture::new(desc, frame, XDP_DROP, counter)
}

#[test]
fn every_encapsulation_is_opened() {
    let d = decap();
    let mut rows = Vec::new();
    for (what, inner) in [("TCP", tcp4().build()), ("UDP", udp4().build())] {
        rows.extend([
            opened(
                format!("IPv4 in IPv4, {what}"),
                enc(&inner, IPIP, LB4, HOST4),
                &inner,
                DECAP_IPIP,
            ),
            opened(
                format!("IPv4 in IPv6 (protocol 4), {what}"),
                set_outer_proto(enc(&inner, IPIP, LB6, HOST6), PROTO_IPIP),
                &inner,
                DECAP_IPIP,
            ),
            opened(
                format!("GUE over IPv4, inner IPv4 {what}"),
                enc(&inner, GUE, LB4, HOST4),
                &inner,
                DECAP_GUE,
            ),
            opened(
                format!("GUE over IPv6, inner IPv4 {what}"),
                enc(&inner, GUE, LB6, HOST6),
                &inner,
                DECAP_GUE,
            ),
        ]);
    }
    for (what, inner) in [("TCP", tcp6().build()), ("UDP", udp6().build())] {
        rows.extend([
            opened(
                format!("IPv6 in IPv6, {what}"),
                enc(&inner, IPIP, LB6, HOST6),
                &inner,
                DECAP_IPV6_IN_IP,
            ),
            opened(
                format!("IPv6 in IPv4 (protocol 41), {what}"),
                set_outer_proto(enc(&inner, IPIP, LB4, HOST4), PROTO_IPV6_IN_IP),
                &inner,
                DECAP_IPV6_IN_IP,
            ),
            opened(
                format!("GUE over IPv6, inner IPv6 {what}"),
                enc(&inner, GUE, LB6, HOST6),
                &inner,
                DECAP_GUE,
            ),
            opened(
                format!("GUE over IPv4, inner IPv6 {what}"),
                enc(&inner, GUE, LB4, HOST4),
                &inner,
                DECAP_GUE,
            ),
        ]);
    }
    let tagged4 = tcp4().vlan(7).build();
    let tagged6 = udp6().vlan(4094).build();
    rows.extend([
        opened(
            "VLAN-tagged IPv4 in IPv4: the tag stays",
            enc(&tagged4, IPIP, LB4, HOST4),
            &tagged4,
            DECAP_IPIP,
        )
        .also(VLAN),
        opened(
            "VLAN-tagged GUE over IPv6: the tag stays",
            enc(&tagged6, GUE, LB6, HOST6),
            &tagged6,
            DECAP_GUE,
        )
        .also(VLAN),
    ]);
    // An outer IPv4 header with options: its IHL says how much to strip.
    let inner = udp4().build();
    let mut with_options = enc(&inner, IPIP, LB4, HOST4);
    with_options.splice(34..34, [1, 1, 1, 0]);
    with_options[14] = 0x46;
    let tot = u16::from_be_bytes([with_options[16], with_options[17]]) + 4;
    with_options[16..18].copy_from_slice(&tot.to_be_bytes());
    fix_ipv4_checksum(&mut with_options, 14);
    rows.push(opened(
        "IPv4 in IPv4, outer header with options",
        with_options,
        &inner,
        DECAP_IPIP,
    ));
    // RFC 6946: an atomic fragment (offset 0, no more fragments) is a whole packet.
    let inner6 = tcp6().build();
    rows.push(opened(
        "IPv6 in IPv6 behind an atomic fragment header: both stripped",
        outer_fragment(enc(&inner6, IPIP, LB6, HOST6), false, 0),
        &inner6,
        DECAP_IPV6_IN_IP,
    ));
    // The outer datagram longer than the inner packet: the stack trims to the inner length.
    let mut padded = enc(&inner, IPIP, LB4, HOST4);
    padded.extend_from_slice(&[0xee; 6]);
    let tot = (padded.len() - 14) as u16;
    padded[16..18].copy_from_slice(&tot.to_be_bytes());
    fix_ipv4_checksum(&mut padded, 14);
    let mut trailing = inner.clone();
    trailing.extend_from_slice(&[0xee; 6]);
    rows.push(opened(
        "IPv4 in IPv4 with bytes after the inner packet: kept, the stack trims them",
        padded,
        &trailing,
        DECAP_IPIP,
    ));
    // The test kit's own decapsulation agrees with the program's on the plain cases.
    for row in &rows[..16] {
        let kit = decapsulate(&row.input, DEFAULT_GUE_PORT);
        assert_eq!(kit.as_ref(), row.output.as_ref(), "{}", row.desc);
    }
    run(&d, &rows);
    eprintln!(
        "lb_decap: {:?} instructions verified",
        d.verified_instructions()
    );
}

#[test]
fn what_is_not_ours_passes_untouched() {
    let d = decap();
    let gue_port = format!("10.0.2.10:{DEFAULT_GUE_PORT}");
    let mut qinq = tcp4().vlan(7).build();
    qinq.splice(16..16, [0x81, 0x00, 0x00, 0x08]);
    let mut hop_by_hop = enc(&tcp6().build(), IPIP, LB6, HOST6);
    hop_by_hop.splice(54..54, [PROTO_IPV6_IN_IP, 0, 1, 4, 0, 0, 0, 0]);
    hop_by_hop[20] = EXT_HOP_BY_HOP;
    add_to_ipv6_payload(&mut hop_by_hop, 14, 8);
    let rows = vec![
        untouched("plain TCP", tcp4().build(), PASS_NOT_ENCAP),
        untouched("plain UDP", udp4().build(), PASS_NOT_ENCAP),
        untouched("plain TCP over IPv6", tcp6().build(), PASS_NOT_ENCAP),
        untouched("plain UDP over IPv6", udp6().build(), PASS_NOT_ENCAP),
        untouched(
            "ICMP echo",
            Packet::icmp_echo("10.0.2.1:0", "10.0.2.10:0", false, 1, 1).build(),
            PASS_NOT_ENCAP,
        ),
        untouched(
            "ICMPv6 echo",
            Packet::icmp_echo("[2001:db8:2::1]:0", "[2001:db8:2::10]:0", false, 1, 1).build(),
            PASS_NOT_ENCAP,
        ),
        untouched(
            "neighbour solicitation",
            Packet::icmp_other(
                "[fe80::1]:0",
                "[ff02::1:ff00:10]:0",
                ICMP6_NEIGHBOR_SOLICIT,
                0,
                [0; 4],
            )
            .build(),
            PASS_NOT_ENCAP,
        ),
        untouched("ARP", udp4().ether_type(0x0806).build(), PASS_NOT_ENCAP),
        untouched("two VLAN tags (QinQ)", qinq, PASS_NOT_ENCAP),
        untouched(
            "GRE (protocol 47)",
            Packet::ip_proto("10.0.2.1:0", "10.0.2.10:0", 47).build(),
            PASS_NOT_ENCAP,
        ),
        untouched(
            "GUE to another port",
            enc(&tcp4().build(), Some(6081), LB4, HOST4),
            PASS_NOT_ENCAP,
        ),
        untouched(
            "IPv6 in IPv6 behind a hop-by-hop header: not looked into",
            hop_by_hop,
            PASS_NOT_ENCAP,
        ),
        untouched(
            "UDP to the GUE port carrying GUE variant 0 (a GUE header)",
            Packet::udp("10.0.2.1:50000", &gue_port)
                .payload(&[0x00, 0x00, 0x00, 0x00, 0x45])
                .build(),
            PASS_GUE_NOT_IP,
        ),
        untouched(
            "UDP to the GUE port, empty",
            Packet::udp("10.0.2.1:50000", &gue_port).build(),
            PASS_GUE_NOT_IP,
        ),
        untouched(
            "strict: IPv4 in IPv4 to another host",
            enc(&tcp4().build(), IPIP, LB4, OTHER4),
            PASS_NOT_LOCAL,
        ),
        untouched(
            "strict: GUE over IPv4 to another host",
            enc(&udp4().build(), GUE, LB4, OTHER4),
            PASS_NOT_LOCAL,
        ),
        untouched(
            "strict: IPv6 in IPv6 to another host",
            enc(&tcp6().build(), IPIP, LB6, OTHER6),
            PASS_NOT_LOCAL,
        ),
        untouched(
            "strict: GUE over IPv6 to another host",
            enc(&udp6().build(), GUE, LB6, OTHER6),
            PASS_NOT_LOCAL,
        ),
        untouched(
            "strict: a broken outer header to another host is not ours to judge",
            bad_checksum(enc(&tcp4().build(), IPIP, LB4, OTHER4)),
            PASS_NOT_LOCAL,
        ),
        untouched(
            "outer IPv4 first fragment of IP in IP",
            outer_fragment(enc(&tcp4().build(), IPIP, LB4, HOST4), true, 0),
            PASS_FRAGMENT,
        ),
        untouched(
            "outer IPv4 last fragment of IP in IP",
            outer_fragment(enc(&tcp4().build(), IPIP, LB4, HOST4), false, 100),
            PASS_FRAGMENT,
        ),
        untouched(
            "outer IPv4 first fragment of GUE",
            outer_fragment(enc(&udp4().build(), GUE, LB4, HOST4), true, 0),
            PASS_FRAGMENT,
        ),
        untouched(
            "outer IPv4 later fragment of UDP: no port to tell GUE by",
            outer_fragment(enc(&udp4().build(), GUE, LB4, HOST4), true, 100),
            PASS_NOT_ENCAP,
        ),
        untouched(
            "outer IPv6 first fragment of IP in IP",
            outer_fragment(enc(&tcp6().build(), IPIP, LB6, HOST6), true, 0),
            PASS_FRAGMENT,
        ),
        untouched(
            "outer IPv6 last fragment of GUE",
            outer_fragment(enc(&udp6().build(), GUE, LB6, HOST6), false, 100),
            PASS_NOT_ENCAP,
        ),
        untouched(
            "outer IPv6 first fragment of GUE",
            outer_fragment(enc(&udp6().build(), GUE, LB6, HOST6), true, 0),
            PASS_FRAGMENT,
        ),
        untouched(
            "an outer fragment to another host",
            outer_fragment(enc(&tcp4().build(), IPIP, LB4, OTHER4), true, 0),
            PASS_NOT_LOCAL,
        ),
    ];
    run(&d, &rows);
}

/// The outer IPv4 header's checksum made wrong.
fn bad_checksum(mut frame: Vec<u8>) -> Vec<u8> {
    frame[24] ^= 0x5a;
    frame
}

#[test]
fn malformed_encapsulated_packets_have_a_verdict() {
    let d = decap();
    let ipip4 = enc(&tcp4().build(), IPIP, LB4, HOST4);
    let gue4 = enc(&udp4().build(), GUE, LB4, HOST4);
    let patched = |frame: &[u8], at: usize, bytes: &[u8], fix: Option<usize>| {
        let mut f = frame.to_vec();
        f[at..at + bytes.len()].copy_from_slice(bytes);
        if let Some(ip) = fix {
            fix_ipv4_checksum(&mut f, ip);
        }
        f
    };
    let inner_len = |f: &[u8]| u16::from_be_bytes([f[36], f[37]]);
    let udp_len = u16::from_be_bytes([gue4[38], gue4[39]]);
    let mut ipv6_jumbo_inner = enc(&tcp6().build(), IPIP, LB6, HOST6);
    ipv6_jumbo_inner[58..60].fill(0);
    let rows = vec![
        dropped(
            "outer IPv4 header checksum wrong",
            bad_checksum(ipip4.clone()),
            DROP_MALFORMED,
        ),
        untouched(
            "outer version 5 (IPv4's EtherType)",
            patched(&ipip4, 14, &[0x55], Some(14)),
            PASS_MALFORMED,
        ),
        untouched(
            "outer IHL 4",
            patched(&ipip4, 14, &[0x44], None),
            PASS_MALFORMED,
        ),
        untouched(
            "outer total length beyond the frame",
            patched(&ipip4, 16, &(ipip4.len() as u16).to_be_bytes(), Some(14)),
            PASS_MALFORMED,
        ),
        untouched(
            "outer IPv6 payload length 0",
            patched(&enc(&tcp6().build(), IPIP, LB6, HOST6), 18, &[0, 0], None),
            PASS_MALFORMED,
        ),
        dropped(
            "protocol 4 carrying IPv6",
            enc(&tcp6().build(), IPIP, LB4, HOST4),
            DROP_MALFORMED,
        ),
        dropped(
            "protocol 41 carrying IPv4",
            enc(&tcp4().build(), IPIP, LB6, HOST6),
            DROP_MALFORMED,
        ),
        dropped(
            "inner IHL 4",
            patched(&ipip4, 34, &[0x44], None),
            DROP_MALFORMED,
        ),
        dropped(
            "inner total length beyond the outer payload",
            patched(&ipip4, 36, &(inner_len(&ipip4) + 1).to_be_bytes(), None),
            DROP_MALFORMED,
        ),
        dropped(
            "inner IPv6 payload length 0 (a jumbogram's)",
            ipv6_jumbo_inner,
            DROP_MALFORMED,
        ),
        dropped(
            "GUE: UDP length beyond the outer datagram",
            patched(&gue4, 38, &(udp_len + 1).to_be_bytes(), None),
            DROP_MALFORMED,
        ),
        dropped(
            "GUE: UDP length shorter than its header",
            patched(&gue4, 38, &4u16.to_be_bytes(), None),
            DROP_MALFORMED,
        ),
        dropped(
            "GUE: inner IPv4 of one byte",
            cut_consistently(gue4.clone(), 14 + 28 + 1),
            DROP_MALFORMED,
        ),
    ];
    run(&d, &rows);
}

#[test]
fn truncations_at_every_offset_have_a_verdict() {
    let d = decap();
    let frames = [
        ("IPv4 in IPv4", enc(&tcp4().build(), IPIP, LB4, HOST4)),
        ("IPv6 in IPv6", enc(&udp6().build(), IPIP, LB6, HOST6)),
        ("GUE over IPv4", enc(&tcp4().build(), GUE, LB4, HOST4)),
        ("GUE over IPv6", enc(&tcp6().build(), GUE, LB6, HOST6)),
        (
            "VLAN-tagged GUE over IPv4, inner IPv6",
            enc(&udp6().vlan(9).build(), GUE, LB4, HOST4),
        ),
    ];
    let mut rows = Vec::new();
    for (what, frame) in frames {
        // Cut as a short frame: the outer length says more than the frame holds.
        // (BPF_PROG_TEST_RUN refuses frames shorter than an Ethernet header.)
        for keep in 14..frame.len() {
            rows.push(untouched(
                format!("{what} cut to {keep} bytes"),
                frame[..keep].to_vec(),
                PASS_MALFORMED,
            ));
        }
        // Cut with the outer lengths saying so: the datagram as sent was short.
        let at = l3(&frame);
        let outer = at + outer_len(&frame);
        let gue = frame[if is_v4(&frame, at) { at + 9 } else { at + 6 }] == 17;
        let inner = if gue { outer + 8 } else { outer };
        for keep in outer..frame.len() {
            let cut = cut_consistently(frame.clone(), keep);
            let desc = format!("{what}, outer datagram of {} bytes", keep - at);
            rows.push(if keep == outer && !is_v4(&frame, at) {
                untouched(desc + ": payload length 0", cut, PASS_MALFORMED)
            } else if keep < inner {
                untouched(desc + ": UDP header cut", cut, PASS_MALFORMED)
            } else if gue && keep == inner {
                untouched(desc + ": empty GUE", cut, PASS_GUE_NOT_IP)
            } else {
                dropped(desc + ": inner packet cut", cut, DROP_MALFORMED)
            });
        }
    }
    eprintln!("{} truncated frames", rows.len());
    run(&d, &rows);
}

#[test]
fn ecn_congestion_marks_are_carried_in() {
    let d = decap();
    let mut rows = Vec::new();
    for (what, inner, gue, lb, host) in [
        ("IPv4 in IPv4", tcp4().build(), IPIP, LB4, HOST4),
        ("IPv6 in IPv6", tcp6().build(), IPIP, LB6, HOST6),
        ("GUE over IPv4, inner IPv6", udp6().build(), GUE, LB4, HOST4),
        ("GUE over IPv6, inner IPv4", udp4().build(), GUE, LB6, HOST6),
    ] {
        let counter = match (gue, inner[12]) {
            (Some(_), _) => DECAP_GUE,
            (None, 0x08) => DECAP_IPIP,
            (None, _) => DECAP_IPV6_IN_IP,
        };
        for (inner_ecn, outer_ecn) in [
            (ECT0, CE),
            (ECT1, CE),
            (CE, CE),
            (NOT_ECT, CE),
            (ECT0, ECT0),
        ] {
            let marked = set_ecn(inner.clone(), 14, inner_ecn);
            let outer = set_ecn(enc(&marked, gue, lb, host), 14, outer_ecn);
            let desc = format!("{what}, inner ECN {inner_ecn}, outer {outer_ecn}");
            rows.push(match (inner_ecn, outer_ecn) {
                (NOT_ECT, CE) => dropped(desc + ": dropped (RFC 6040)", outer, DROP_ECN),
                (ECT0 | ECT1, CE) => {
                    let ce = set_ecn(marked, 14, CE);
                    verify_checksums(&ce).unwrap();
                    opened(desc + ": CE carried in", outer, &ce, counter).also(ECN_CE)
                }
                _ => opened(desc, outer, &marked, counter),
            });
        }
    }
    run(&d, &rows);
}

#[test]
fn strict_destination_off_and_parameters_changed_in_place() {
    let mut d = decap();
    let ipip_other = tcp4().build();
    let gue_other6 = udp6().build();
    d.configure(DEFAULT_GUE_PORT, &Destinations::Any).unwrap();
    run(
        &d,
        &[
            opened(
                "any destination: IPv4 in IPv4 to another host",
                enc(&ipip_other, IPIP, LB4, OTHER4),
                &ipip_other,
                DECAP_IPIP,
            ),
            opened(
                "any destination: GUE over IPv6 to another host",
                enc(&gue_other6, GUE, LB6, OTHER6),
                &gue_other6,
                DECAP_GUE,
            ),
        ],
    );
    // Another GUE port and only the IPv4 address: the program reads both per packet.
    d.configure(7000, &Destinations::Listed(vec![HOST4.parse().unwrap()]))
        .unwrap();
    let inner = udp4().build();
    run(
        &d,
        &[
            untouched(
                "GUE to the old port is plain UDP now",
                enc(&inner, GUE, LB4, HOST4),
                PASS_NOT_ENCAP,
            ),
            opened(
                "GUE to the new port",
                enc(&inner, Some(7000), LB4, HOST4),
                &inner,
                DECAP_GUE,
            ),
            untouched(
                "the IPv6 address is no longer listed",
                enc(&tcp6().build(), IPIP, LB6, HOST6),
                PASS_NOT_LOCAL,
            ),
            untouched(
                "strict again: another host",
                enc(&ipip_other, IPIP, LB4, OTHER4),
                PASS_NOT_LOCAL,
            ),
        ],
    );
}

/// Random mutations of encapsulated frames (bytes flipped in the headers, lengths changed,
/// cuts): each gets exactly one verdict counter; a frame passed or dropped other than by
/// decapsulation is unchanged, a decapsulated one is its input less the outer headers.
#[test]
fn mutated_frames_keep_every_rule() {
    let d = decap();
    let (mut rng, seed) = Rng::from_env("decap fuzz");
    let bases = [
        enc(&tcp4().build(), IPIP, LB4, HOST4),
        enc(&tcp6().build(), IPIP, LB6, HOST6),
        enc(&udp4().build(), GUE, LB4, HOST4),
        enc(&udp6().build(), GUE, LB6, HOST6),
        enc(&udp6().vlan(3).build(), GUE, LB4, HOST4),
        enc(&tcp4().build(), IPIP, LB4, OTHER4),
        set_outer_proto(enc(&tcp6().build(), IPIP, LB4, HOST4), PROTO_IPV6_IN_IP),
    ];
    let decapsulations = [DECAP_IPIP, DECAP_IPV6_IN_IP, DECAP_GUE];
    for n in 0..20_000 {
        let mut frame = rng.pick(&bases).clone();
        for _ in 0..1 + rng.below(3) {
            // Mostly in the headers (the first 100 bytes), where the decisions are.
            let at = rng.below(frame.len().min(100));
            frame[at] = if rng.chance(2) {
                rng.byte()
            } else {
                frame[at] ^ (1 << rng.below(8))
            };
        }
        if rng.chance(4) {
            // Not below an Ethernet header, which BPF_PROG_TEST_RUN refuses.
            frame.truncate(14 + rng.below(frame.len() - 13));
        }
        let before = d.counters().unwrap();
        let r = run_once(d.program(), &frame, 0).unwrap();
        let after = d.counters().unwrap();
        let moved: Vec<usize> = (0..decap_counter::VERDICTS as usize)
            .filter(|&i| after[i] != before[i])
            .collect();
        let ctx = format!("frame {n} (seed {seed}): {frame:02x?}");
        assert_eq!(moved.len(), 1, "{ctx}: verdict counters {moved:?}");
        assert_eq!(after[moved[0]] - before[moved[0]], 1, "{ctx}");
        let counter = moved[0] as u32;
        assert!(
            [XDP_PASS, XDP_DROP].contains(&r.verdict),
            "{ctx}: {}",
            r.verdict
        );
        if decapsulations.contains(&counter) {
            assert_eq!(r.verdict, XDP_PASS, "{ctx}");
            let link = l3(&frame);
            let cut = frame.len() - r.output.len();
            assert_eq!(r.output[..link - 2], frame[..link - 2], "{ctx}");
            // A CE mark carried in changes the inner header too (ecn_congestion_marks_...).
            if after[ECN_CE as usize] == before[ECN_CE as usize] {
                assert_eq!(r.output[link..], frame[link + cut..], "{ctx}");
            }
        } else {
            assert_eq!(r.output, frame, "{ctx}: changed, counted {counter}");
        }
    }
}
