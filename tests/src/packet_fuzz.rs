//! The packet fuzzer (issue 13): seeded random and mutated frames through the XDP program
//! (BPF_PROG_TEST_RUN) with services, SNAT addresses and live flows set up, each judged by the
//! properties every packet must have:
//!
//! - a defined verdict (DROP, PASS, TX or REDIRECT; never ABORTED or anything else);
//! - exactly one verdict counter moved (checked packet by packet for the first
//!   [`EXACT`] packets, then per batch: as many verdict counts as packets, and per verdict class
//!   as many as the program returned);
//! - PASS and DROP leave the frame as it came, byte for byte;
//! - TX and REDIRECT send a frame whose checksums (IPv4, TCP/UDP, ICMP, the quoted IPv4 header)
//!   are right where the input's were and wrong where the input's were (lb updates checksums
//!   incrementally, as IPVS and netfilter NAT do: it neither checks nor launders them), to a
//!   backend or to a client lb has seen (the SYN proxy's own segments too: it answers only
//!   segments whose checksum it checked, so a damaged one is dropped, never made right). An
//!   encapsulated frame (direct server return) carries
//!   the input's datagram unchanged behind a right outer IPv4 checksum; lb's own answer to a
//!   packet too big has right checksums and quotes the input as it came.
//!
//! Frames start from seeds covering every path of both families (new and live flows both ways,
//! UDP, echo, ICMP / ICMPv6 errors about flows from either side, the SYN proxy's handshake and
//! translated segments, fragments, IPv4 options, IPv6
//! extension headers, neighbour discovery, VLAN tags, other protocols and addresses). Each is first cut at every length, then they are mutated: random frames, flipped
//! bytes, header fields set to edge values, truncations at any offset, garbage appended, VLAN
//! tags added, destinations pointed at lb's addresses. A failure names the seed and shows both
//! frames in hex.

use std::{
    collections::HashSet,
    fmt::Write as _,
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
};

use anyhow::Context as _;

use crate::{
    fixture::{XDP_DROP, XDP_PASS, XDP_REDIRECT, XDP_TX, hex_diff, run_once, verdict_name},
    packet::{
        Checksums, EXT_DEST_OPTS, EXT_HOP_BY_HOP, EXT_ROUTING, ICMP_DEST_UNREACH, ICMP_FRAG_NEEDED,
        ICMP_PORT_UNREACH, ICMP_TIME_EXCEEDED, ICMP6_DEST_UNREACH, ICMP6_NEIGHBOR_SOLICIT,
        ICMP6_PACKET_TOO_BIG, ICMP6_PORT_UNREACH, ICMP6_TIME_EXCEEDED, Packet, TCP_ACK, TCP_FIN,
        TCP_PSH, TCP_RST, TCP_SYN, checksums, decapsulate,
    },
    quic,
    rng::Rng,
    testnet::{BACKEND_MAC, TestNet},
};
use lb_common::counter;

/// Packets whose counters are read one by one (the rest are checked per batch).
pub const EXACT: usize = 3000;
/// Packets per batch check.
const BATCH: usize = 500;
/// Shortest frame run: an Ethernet header.
const MIN_FRAME: usize = 14;
/// Failures collected before giving up.
const MAX_FAILURES: usize = 8;

const SERVICES: &str = r#"
[[service]]
name = "web"
vip = "10.100.0.1:80"
backends = [{ address = "10.0.2.2:8080" }, { address = "10.0.2.3:8080" }]
[service.passive]
no_data_timeout = "100ms"

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
name = "quiet"
vip = "10.100.0.3:80"
answer_ping = false
backends = [{ address = "10.0.2.4:8080" }]

[[service]]
name = "web6"
vip = "[2001:db8:100::1]:80"
backends = [{ address = "[2001:db8:2::2]:8080" }, { address = "[2001:db8:2::3]:8080" }]
[service.passive]
no_data_timeout = "100ms"

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
name = "dsr"
vip = "10.100.0.4:80"
forwarding = "ipip"
backends = [{ address = "10.0.2.5:80" }, { address = "10.0.2.6:80" }]

[[service]]
name = "dsr-udp"
vip = "10.100.0.4:53"
protocol = "udp"
forwarding = "gue"
backends = [{ address = "10.0.2.5:53" }]

[[service]]
name = "dsr6"
vip = "[2001:db8:100::4]:80"
forwarding = "gue"
backends = [{ address = "[2001:db8:2::5]:80" }]

[[service]]
name = "dsr6-ipip"
vip = "[2001:db8:100::4]:443"
forwarding = "ipip"
backends = [{ address = "[2001:db8:2::5]:443" }]

[[service]]
name = "proxied"
vip = "10.100.0.5:80"
syn_proxy = "on"
backends = [{ address = "10.0.2.7:8080" }]

[[service]]
name = "proxied6"
vip = "[2001:db8:100::5]:80"
syn_proxy = "on"
backends = [{ address = "[2001:db8:2::7]:8080" }]

[[service]]
name = "quic"
vip = "10.100.0.1:443"
protocol = "udp"
quic = { server_id_bytes = 2 }
backends = [{ address = "10.0.2.2:443", server_id = 1 }, { address = "10.0.2.3:443", server_id = 2 }]

[[service]]
name = "quic6"
vip = "[2001:db8:100::1]:443"
protocol = "udp"
quic = { server_id_bytes = 1, cid_offset = 4, config_id = 1 }
backends = [{ address = "[2001:db8:2::2]:443", server_id = 1 }, { address = "[2001:db8:2::3]:443", server_id = 2 }]

[[service]]
name = "quic-dsr"
vip = "10.100.0.4:443"
protocol = "udp"
forwarding = "gue"
quic = { server_id_bytes = 3, cid_offset = 2 }
backends = [{ address = "10.0.2.5:443", server_id = 7 }, { address = "10.0.2.6:443", server_id = 8 }]
"#;

/// Addresses a mutated destination is pointed at: VIPs, SNAT addresses, others.
const TARGETS: [[u8; 4]; 8] = [
    [10, 100, 0, 1],
    [10, 100, 0, 5],
    [10, 100, 0, 2],
    [10, 100, 0, 3],
    [10, 100, 0, 4],
    [10, 0, 2, 1],
    [10, 0, 1, 1],
    [10, 0, 1, 9],
];

/// IPv6 addresses a mutated destination is pointed at: VIPs, SNAT addresses, others.
const TARGETS6: [[u8; 16]; 7] = [
    [0x20, 1, 0xd, 0xb8, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1],
    [0x20, 1, 0xd, 0xb8, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 5],
    [0x20, 1, 0xd, 0xb8, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2],
    [0x20, 1, 0xd, 0xb8, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 4],
    [0x20, 1, 0xd, 0xb8, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1],
    [0x20, 1, 0xd, 0xb8, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1],
    [0x20, 1, 0xd, 0xb8, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 9],
];

/// What a run found.
#[derive(Debug, Default)]
pub struct Report {
    pub packets: usize,
    /// Returns by verdict (DROP, PASS, TX, REDIRECT).
    pub verdicts: [u64; 5],
    /// Verdict counters moved over the run, by name.
    pub counters: Vec<(String, u64)>,
    pub failures: Vec<String>,
}

impl Report {
    pub fn summary(&self) -> String {
        let mut s = format!(
            "{} packets: {} dropped, {} passed, {} TX, {} redirected",
            self.packets, self.verdicts[1], self.verdicts[2], self.verdicts[3], self.verdicts[4]
        );
        let moved: Vec<String> = self
            .counters
            .iter()
            .filter(|(_, v)| *v > 0)
            .map(|(n, v)| format!("{n} {v}"))
            .collect();
        let _ = write!(s, "\n  counters: {}", moved.join(", "));
        s
    }
}

struct Seed {
    frame: Vec<u8>,
    ingress: u32,
}

/// The network, the flows set up in it and the frames to start from.
pub struct Bed {
    net: TestNet,
    seeds: Vec<Seed>,
    backends: HashSet<IpAddr>,
}

/// (source, destination) of what lb sent (no VLAN tag, no options or extension headers): a
/// frame's addresses and ports as strings, `a.b.c.d:port` or `[v6]:port`.
fn addressing(frame: &[u8]) -> (String, String) {
    let port = |o: usize| u16::from_be_bytes([frame[o], frame[o + 1]]);
    let (src, dst, l4) = (
        source(frame),
        destination(frame),
        if is_v6(frame) { 54 } else { 34 },
    );
    let at = |ip: Option<IpAddr>, o| SocketAddr::new(ip.expect("an address"), port(o)).to_string();
    (at(src, l4), at(dst, l4 + 2))
}

fn is_v6(frame: &[u8]) -> bool {
    let l3 = l3(frame);
    frame.get(l3 - 2..l3) == Some(&[0x86, 0xdd])
}

/// Frames of the direct-server-return services: a connection's packets (whose replies never
/// come through lb), UDP, packets too big for the encapsulation (with and without DF), and
/// errors from a router on the replies' way, to the VIP.
/// All arrive on the client side, `vc`.
fn dsr_seeds(vc: u32, seed: &mut dyn FnMut(Vec<u8>, u32)) {
    for (client, vip, router) in [
        ("10.0.1.5:49000", "10.100.0.4:80", "10.0.1.99:0"),
        (
            "[2001:db8:1::5]:49000",
            "[2001:db8:100::4]:80",
            "[2001:db8:1::99]:0",
        ),
        (
            "[2001:db8:1::5]:49001",
            "[2001:db8:100::4]:443",
            "[2001:db8:1::99]:0",
        ),
    ] {
        let v6 = vip.starts_with('[');
        let syn = Packet::tcp(client, vip, TCP_SYN);
        let data = Packet::tcp(client, vip, TCP_ACK | TCP_PSH)
            .seq(1001, 5001)
            .payload(b"GET / HTTP/1.1\r\n\r\n");
        seed(syn.build(), vc);
        seed(syn.clone().vlan(9).build(), vc);
        seed(data.build(), vc);
        seed(Packet::tcp(client, vip, TCP_FIN | TCP_ACK).build(), vc);
        let big = Packet::tcp(client, vip, TCP_ACK)
            .seq(1, 1)
            .payload(&[0x5a; 1460 - 20]);
        seed(big.clone().dont_fragment().build(), vc);
        seed(big.build(), vc);
        // The backend's reply, as a router on its way to the client quotes it.
        let reply = Packet::tcp(vip, client, TCP_ACK | TCP_PSH)
            .payload(&[0x41; 600])
            .datagram();
        let vip_ip = &vip[..vip.rfind(':').unwrap_or(0)];
        let (ty, code) = if v6 {
            (ICMP6_PACKET_TOO_BIG, 0)
        } else {
            (ICMP_DEST_UNREACH, ICMP_FRAG_NEEDED)
        };
        for len in [28, 48, 600] {
            let to = format!("{vip_ip}:0");
            seed(
                Packet::icmp_error(router, &to, ty, code, 1280, &reply, len).build(),
                vc,
            );
        }
    }
    let udp = Packet::udp("10.0.1.5:49100", "10.100.0.4:53").payload(b"query");
    seed(udp.build(), vc);
    seed(udp.udp_zero_checksum().build(), vc);
    for payload in quic_payloads(2, 3, 0, 8) {
        seed(
            Packet::udp("10.0.1.5:49200", "10.100.0.4:443")
                .payload(&payload)
                .build(),
            vc,
        );
    }
}

/// QUIC payloads for a service whose server IDs are `bytes` long from `offset`, with config
/// rotation bits `config`, naming server `id`: a short header, one naming nobody, the
/// unroutable rotation, an Initial, and a short header cut just short of the server ID.
fn quic_payloads(offset: u8, bytes: u8, config: u8, id: u64) -> Vec<Vec<u8>> {
    let short = |config_id: u8, id: u64| {
        let layout = quic::CidLayout {
            server_id_bytes: bytes,
            cid_offset: offset,
            config_id,
        };
        quic::short_header(layout.cid(id))
    };
    let mut cut = short(config, id);
    cut.truncate(usize::from(offset) + 3);
    vec![
        short(config, id),
        short(config, 200),
        short(7, id),
        quic::initial(),
        cut,
    ]
}

/// The SYN proxy's services (`proxied`, `proxied6`): a connection opened through the cookie
/// (SYN, the cookie's ACK, the backend's SYN+ACK), then its segments both ways, those the
/// balancer translates itself and those with SACK blocks the proxy's programs translate; the
/// SYN and the cookie's ACK of a connection not made yet; the backend's SYN+ACK again. Client
/// timestamps throughout, so every option path is there to mutate.
fn proxy_seeds(
    run: &dyn Fn(&[u8], u32) -> anyhow::Result<crate::fixture::RunResult>,
    (vc, vb, vb_mac): (u32, u32, [u8; 6]),
    seed: &mut dyn FnMut(Vec<u8>, u32),
) -> anyhow::Result<()> {
    let be32 = |b: &[u8], at: usize| u32::from_be_bytes(b[at..at + 4].try_into().expect("4"));
    let ts = |val: u32, ecr: u32| {
        let mut o = vec![1, 1, 8, 10];
        o.extend(val.to_be_bytes());
        o.extend(ecr.to_be_bytes());
        o
    };
    // MSS 1460, SACK permitted, timestamps, window scale 7.
    let syn_opts = |val: u32| {
        let mut o = vec![2, 4, 5, 180, 4, 2, 8, 10];
        o.extend(val.to_be_bytes());
        o.extend([0, 0, 0, 0, 1, 3, 3, 7]);
        o
    };
    for (vip, client_ip, l4) in [
        ("10.100.0.5:80", "10.0.1.2", 34),
        ("[2001:db8:100::5]:80", "[2001:db8:1::2]", 54),
    ] {
        // SYN → lb's SYN+ACK (the cookie, lb's timestamp); the ACK of the cookie → lb's SYN
        // to the backend.
        let handshake = |port: u16| -> anyhow::Result<(Packet, Packet)> {
            let client = format!("{client_ip}:{port}");
            let syn = Packet::tcp(&client, vip, TCP_SYN)
                .seq(1000, 0)
                .tcp_options(&syn_opts(7));
            let out = run(&syn.build(), vc)?;
            anyhow::ensure!(
                out.verdict == XDP_TX,
                "proxied SYN to {vip}: {}",
                verdict_name(out.verdict)
            );
            let (cookie, lb_ts) = (be32(&out.output, l4 + 4), be32(&out.output, l4 + 28));
            let ack = Packet::tcp(&client, vip, TCP_ACK)
                .seq(1001, cookie.wrapping_add(1))
                .window(502)
                .tcp_options(&ts(8, lb_ts));
            Ok((syn, ack))
        };
        let (syn, ack) = handshake(47400)?;
        let out = run(&ack.build(), vc)?;
        anyhow::ensure!(
            out.verdict == XDP_REDIRECT,
            "the cookie's ACK to {vip}: {}",
            verdict_name(out.verdict)
        );
        let (snat, backend) = addressing(&out.output);
        let from_backend = |flags: u8, seq: u32, opts: &[u8], data: &[u8]| {
            Packet::tcp(&backend, &snat, flags)
                .seq(seq, 1001)
                .window(300)
                .tcp_options(opts)
                .payload(data)
                .macs(BACKEND_MAC, vb_mac)
        };
        let synack = from_backend(
            TCP_SYN | TCP_ACK,
            5000,
            &[
                2, 4, 5, 180, 4, 2, 8, 10, 0, 0, 0x10, 0, 0, 0, 0, 8, 1, 3, 3, 9,
            ],
            b"",
        );
        let out = run(&synack.build(), vb)?;
        anyhow::ensure!(
            out.verdict == XDP_REDIRECT,
            "the backend's SYN+ACK from {backend}: {}",
            verdict_name(out.verdict)
        );
        let lb_ts = be32(&ack.clone().build(), l4 + 28);
        let client = format!("{client_ip}:47400");
        let data = Packet::tcp(&client, vip, TCP_ACK | TCP_PSH)
            .seq(1001, be32(&ack.clone().build(), l4 + 8))
            .window(502)
            .tcp_options(&ts(9, lb_ts))
            .payload(b"GET / HTTP/1.1\r\n\r\n");
        let mut sack = ts(10, lb_ts);
        let cookie = be32(&ack.clone().build(), l4 + 8).wrapping_sub(1);
        sack.extend([1, 1, 5, 10]);
        sack.extend(cookie.wrapping_add(101).to_be_bytes());
        sack.extend(cookie.wrapping_add(201).to_be_bytes());
        seed(syn.build(), vc);
        seed(ack.build(), vc);
        seed(data.build(), vc);
        seed(
            Packet::tcp(&client, vip, TCP_ACK)
                .seq(1019, cookie.wrapping_add(18))
                .tcp_options(&sack)
                .build(),
            vc,
        );
        seed(
            Packet::tcp(&client, vip, TCP_FIN | TCP_ACK)
                .tcp_options(&ts(11, lb_ts))
                .build(),
            vc,
        );
        seed(Packet::tcp(&client, vip, TCP_RST).build(), vc);
        seed(synack.build(), vb);
        seed(
            from_backend(TCP_ACK | TCP_PSH, 5001, &ts(0x1005, 9), &[0x41; 300]).build(),
            vb,
        );
        seed(from_backend(TCP_ACK, 5001, &[], b"").build(), vb);
        seed(from_backend(TCP_RST, 5001, &[], b"").build(), vb);
        // A connection not made yet: its SYN, and its cookie's ACK (run by the fuzzer first).
        let (syn, ack) = handshake(47401)?;
        seed(syn.build(), vc);
        seed(ack.build(), vc);
        // A SYN with data (whose data the proxy drops).
        seed(syn.payload(b"early").build(), vc);
    }
    Ok(())
}

impl Bed {
    /// Loads the datapath, sets up live flows (TCP handshakes, UDP exchanges) and builds the
    /// seed frames.
    pub fn new() -> anyhow::Result<Self> {
        let net = TestNet::new("ring_size = 1009\nconntrack = { size = 4096 }", SERVICES)?;
        let (vc, vb) = (net.vc, net.vb);
        let run = |frame: &[u8], ingress: u32| {
            net.ns
                .enter(|| run_once(net.dp.program(), frame, ingress))
                .context("test run")
        };
        let mut seeds = Vec::new();
        let mut seed = |frame: Vec<u8>, ingress| seeds.push(Seed { frame, ingress });
        // Live TCP flows: SYN, the backend's SYN+ACK, the client's ACK, data both ways.
        let vips = [
            "10.100.0.1:80",
            "10.100.0.2:80",
            "10.100.0.3:80",
            "[2001:db8:100::1]:80",
            "[2001:db8:100::2]:80",
        ];
        for (i, vip) in vips.iter().enumerate() {
            let v6 = vip.starts_with('[');
            for n in 0..3u16 {
                let port = 47000 + i as u16 * 10 + n;
                let client = if v6 {
                    format!("[2001:db8:1::{}]:{port}", 2 + n)
                } else {
                    format!("10.0.1.{}:{port}", 2 + n)
                };
                let syn = Packet::tcp(&client, vip, TCP_SYN);
                let out = run(&syn.build(), vc)?;
                if out.verdict != XDP_REDIRECT && out.verdict != XDP_TX {
                    continue;
                }
                let (snat, backend) = addressing(&out.output);
                let ingress = if out.verdict == XDP_TX { vc } else { vb };
                let from_backend = |flags: u8, data: &[u8]| {
                    Packet::tcp(&backend, &snat, flags)
                        .payload(data)
                        .macs(BACKEND_MAC, net.vb_mac)
                };
                run(&from_backend(TCP_SYN | TCP_ACK, b"").build(), ingress)?;
                let ack = Packet::tcp(&client, vip, TCP_ACK).seq(1001, 5001);
                run(&ack.build(), vc)?;
                let data = Packet::tcp(&client, vip, TCP_ACK | TCP_PSH)
                    .seq(1001, 5001)
                    .payload(b"GET / HTTP/1.1\r\n\r\n");
                seed(syn.build(), vc);
                seed(ack.build(), vc);
                seed(data.build(), vc);
                seed(Packet::tcp(&client, vip, TCP_FIN | TCP_ACK).build(), vc);
                seed(Packet::tcp(&client, vip, TCP_RST).build(), vc);
                let reply = from_backend(TCP_ACK | TCP_PSH, &[0x41; 600]);
                seed(reply.build(), ingress);
                seed(from_backend(TCP_RST, b"").build(), ingress);
                seed(from_backend(TCP_FIN | TCP_ACK, b"").build(), ingress);
                // What lb sends the client for that reply, as a router on the way quotes it.
                let to_client = Packet::tcp(vip, &client, TCP_ACK | TCP_PSH)
                    .payload(&[0x41; 600])
                    .ttl(63);
                let vip_ip = &vip[..vip.rfind(':').unwrap_or(0)];
                let (router, errors) = if v6 {
                    (
                        "[2001:db8:1::99]:0",
                        [
                            (ICMP6_PACKET_TOO_BIG, 0),
                            (ICMP6_DEST_UNREACH, 1),
                            (ICMP6_TIME_EXCEEDED, 0),
                        ],
                    )
                } else {
                    (
                        "10.0.1.99:0",
                        [
                            (ICMP_DEST_UNREACH, ICMP_FRAG_NEEDED),
                            (ICMP_DEST_UNREACH, 1),
                            (ICMP_TIME_EXCEEDED, 0),
                        ],
                    )
                };
                for (ty, code) in errors {
                    for len in [28, 48, 700] {
                        seed(
                            Packet::icmp_error(
                                router,
                                &format!("{vip_ip}:0"),
                                ty,
                                code,
                                1400,
                                &to_client.datagram(),
                                len,
                            )
                            .build(),
                            vc,
                        );
                    }
                }
                // From the backend's side: quoting what lb sent it.
                let sent = Packet::tcp(&snat, &backend, TCP_ACK | TCP_PSH)
                    .payload(b"GET / HTTP/1.1\r\n\r\n")
                    .ttl(63);
                let snat_ip = &snat[..snat.rfind(':').unwrap_or(0)];
                let backend_ip = &backend[..backend.rfind(':').unwrap_or(0)];
                let errors = if v6 {
                    [
                        (ICMP6_DEST_UNREACH, ICMP6_PORT_UNREACH),
                        (ICMP6_PACKET_TOO_BIG, 0),
                        (ICMP6_TIME_EXCEEDED, 0),
                    ]
                } else {
                    [
                        (ICMP_DEST_UNREACH, ICMP_PORT_UNREACH),
                        (ICMP_DEST_UNREACH, ICMP_FRAG_NEEDED),
                        (ICMP_TIME_EXCEEDED, 0),
                    ]
                };
                for (ty, code) in errors {
                    seed(
                        Packet::icmp_error(
                            &format!("{backend_ip}:0"),
                            &format!("{snat_ip}:0"),
                            ty,
                            code,
                            1300,
                            &sent.datagram(),
                            28,
                        )
                        .macs(BACKEND_MAC, net.vb_mac)
                        .build(),
                        ingress,
                    );
                }
            }
        }
        // UDP both ways.
        for (client, vip) in [
            ("10.0.1.2:47100", "10.100.0.1:53"),
            ("[2001:db8:1::2]:47100", "[2001:db8:100::1]:53"),
        ] {
            let query = Packet::udp(client, vip).payload(b"query");
            let out = run(&query.build(), vc)?;
            if out.verdict == XDP_REDIRECT {
                let (snat, backend) = addressing(&out.output);
                seed(
                    Packet::udp(&backend, &snat)
                        .payload(b"answer")
                        .macs(BACKEND_MAC, net.vb_mac)
                        .build(),
                    vb,
                );
            }
            seed(query.build(), vc);
            seed(query.clone().udp_zero_checksum().build(), vc);
        }
        // QUIC: a connection's packets by its connection ID, from its first port and a new one.
        for (clients, vip, layout) in [
            (
                ["10.0.1.2:47200", "10.0.1.3:47201"],
                "10.100.0.1:443",
                (1, 2, 0),
            ),
            (
                ["[2001:db8:1::2]:47200", "[2001:db8:1::3]:47201"],
                "[2001:db8:100::1]:443",
                (4, 1, 1),
            ),
        ] {
            for client in clients {
                for payload in quic_payloads(layout.0, layout.1, layout.2, 2) {
                    let packet = Packet::udp(client, vip).payload(&payload);
                    run(&packet.build(), vc)?;
                    seed(packet.build(), vc);
                }
            }
        }
        // ICMP to lb's addresses and others, other traffic.
        for (client, dst) in [
            ("10.0.1.2:0", "10.100.0.1:0"),
            ("10.0.1.2:0", "10.100.0.3:0"),
            ("10.0.1.2:0", "10.0.2.1:0"),
            ("10.0.1.2:0", "10.0.1.9:0"),
            ("[2001:db8:1::2]:0", "[2001:db8:100::1]:0"),
            ("[2001:db8:1::2]:0", "[2001:db8:2::1]:0"),
            ("[2001:db8:1::2]:0", "[2001:db8:1::9]:0"),
        ] {
            seed(
                Packet::icmp_echo(client, dst, false, 7, 1)
                    .payload(b"ping")
                    .build(),
                vc,
            );
            seed(Packet::icmp_echo(client, dst, true, 7, 1).build(), vc);
        }
        // IPv6 only: neighbour discovery, extension headers, fragments.
        for dst in [
            "[2001:db8:100::1]:0",
            "[ff02::1:ff00:1]:0",
            "[2001:db8:1::1]:0",
        ] {
            seed(
                Packet::icmp_other("[2001:db8:1::2]:0", dst, ICMP6_NEIGHBOR_SOLICIT, 0, [0; 4])
                    .payload(&[0x20, 1, 0xd, 0xb8, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1])
                    .ttl(255)
                    .build(),
                vc,
            );
        }
        let syn6 = Packet::tcp("[2001:db8:1::7]:48000", "[2001:db8:100::1]:80", TCP_SYN);
        seed(syn6.clone().vlan(5).build(), vc);
        seed(syn6.clone().ext_header(EXT_HOP_BY_HOP, 0).build(), vc);
        seed(
            syn6.clone()
                .ext_header(EXT_ROUTING, 1)
                .ext_header(EXT_DEST_OPTS, 2)
                .build(),
            vc,
        );
        seed(
            (0..5)
                .fold(syn6.clone(), |p, _| p.ext_header(EXT_DEST_OPTS, 0))
                .build(),
            vc,
        );
        seed(syn6.clone().fragment(true, 0).build(), vc);
        seed(
            syn6.clone()
                .ext_header(EXT_HOP_BY_HOP, 0)
                .fragment(false, 9)
                .build(),
            vc,
        );
        seed(
            Packet::ip_proto("[2001:db8:1::7]:0", "[2001:db8:100::1]:0", 47)
                .payload(&[0; 12])
                .build(),
            vc,
        );
        let syn = Packet::tcp("10.0.1.7:48000", "10.100.0.1:80", TCP_SYN);
        seed(syn.clone().vlan(5).build(), vc);
        seed(syn.clone().ip_options(&[1, 1, 7, 3, 4, 0]).build(), vc);
        seed(syn.clone().fragment(true, 0).build(), vc);
        seed(syn.clone().fragment(false, 9).build(), vc);
        seed(
            Packet::tcp("10.0.1.7:48001", "10.100.0.1:443", TCP_SYN).build(),
            vc,
        );
        seed(
            Packet::tcp("10.0.1.7:48002", "10.0.1.9:22", TCP_SYN).build(),
            vc,
        );
        seed(
            Packet::tcp("10.0.1.7:48003", "10.0.2.1:22", TCP_SYN).build(),
            vc,
        );
        seed(
            Packet::ip_proto("10.0.1.7:0", "10.100.0.1:0", 47)
                .payload(&[0; 12])
                .build(),
            vc,
        );
        seed(syn.clone().ether_type(0x86dd).build(), vc);
        seed(syn.clone().ether_type(0x0806).build(), vc);
        dsr_seeds(vc, &mut seed);
        proxy_seeds(&run, (vc, vb, net.vb_mac), &mut seed)?;
        let backends = net
            .balancer
            .backend_addresses()
            .iter()
            .map(|a| a.ip())
            .collect();
        Ok(Self {
            net,
            seeds,
            backends,
        })
    }

    /// Runs `packets` fuzzed frames with `seed`.
    pub fn run(&self, packets: usize, seed: u64) -> anyhow::Result<Report> {
        self.net.ns.enter(|| self.run_here(packets, seed))
    }

    fn run_here(&self, packets: usize, seed: u64) -> anyhow::Result<Report> {
        let mut rng = Rng::new(seed);
        let mut report = Report::default();
        // The clients lb knows: those of the flows set up, and every source sent since.
        let mut sources: HashSet<IpAddr> =
            self.seeds.iter().filter_map(|s| source(&s.frame)).collect();
        let start = self.net.dp.stats()?.counters;
        let mut batch_start = start.clone();
        let mut batch = [0u64; 5];
        // First every seed cut at every length (truncation at each offset), then random ones.
        let mut cuts = self.seeds.iter().flat_map(|s| {
            (MIN_FRAME..s.frame.len()).map(move |n| (s.frame[..n].to_vec(), s.ingress))
        });
        for i in 0..packets {
            let (frame, ingress) = cuts.next().unwrap_or_else(|| self.frame(&mut rng));
            if let Some(src) = source(&frame) {
                sources.insert(src);
            }
            let before = (i < EXACT).then(|| self.net.dp.stats()).transpose()?;
            let out = run_once(self.net.dp.program(), &frame, ingress)?;
            let mut wrong: Vec<String> = Vec::new();
            if matches!(out.verdict, XDP_DROP | XDP_PASS | XDP_TX | XDP_REDIRECT) {
                report.verdicts[out.verdict as usize] += 1;
                batch[out.verdict as usize] += 1;
            } else {
                wrong.push(format!("verdict {}", verdict_name(out.verdict)));
            }
            match out.verdict {
                XDP_DROP | XDP_PASS if out.output != frame => {
                    wrong.push(format!("{} changed the frame", verdict_name(out.verdict)));
                }
                XDP_TX | XDP_REDIRECT => {
                    let was = checksums(&frame);
                    if let Some(inner) = decapsulate(&out.output, lb_common::DEFAULT_GUE_PORT) {
                        // Direct server return: the input's datagram unchanged inside.
                        let outer = checksums(&out.output);
                        if inner[l3(&inner)..] != frame[l3(&frame)..] {
                            wrong.push("encapsulated datagram differs from the input's".into());
                        }
                        if is_v6(&out.output) != (outer.ip.is_none()) {
                            wrong.push(format!("outer header checksum: {outer:?}"));
                        } else if outer.ip == Some(false) {
                            wrong.push("wrong outer IPv4 checksum".into());
                        }
                    } else if let Some(quote) =
                        too_big_quote(&out.output).filter(|_| !is_icmp(&frame))
                    {
                        // lb's own answer to a packet too big: right checksums, the input
                        // quoted as it came.
                        let now = checksums(&out.output);
                        if !frame[l3(&frame)..].starts_with(quote) {
                            wrong.push("the answer's quote differs from the input".into());
                        }
                        if now.ip == Some(false)
                            || now.icmp != Some(true)
                            || now.quoted_ip != was.ip
                        {
                            wrong.push(format!("answer's checksums {now:?}, input's {was:?}"));
                        }
                    } else {
                        let now = checksums(&out.output);
                        if !preserved(&was, &now) {
                            wrong.push(format!("checksums in {was:?}, out {now:?}"));
                        }
                    }
                    match destination(&out.output) {
                        Some(dst) if self.backends.contains(&dst) || sources.contains(&dst) => {}
                        other => {
                            wrong.push(format!("sent to {other:?}, neither a backend nor a client"))
                        }
                    }
                }
                _ => {}
            }
            if let Some(before) = before {
                let after = self.net.dp.stats()?;
                let moved: Vec<usize> = (0..counter::VERDICTS as usize)
                    .filter(|&c| after.counters[c] != before.counters[c])
                    .collect();
                let one = moved.len() == 1
                    && after.counters[moved[0]] == before.counters[moved[0]] + 1
                    && class(moved[0] as u32) == out.verdict;
                if !one {
                    let names: Vec<&str> = moved.iter().map(|&c| counter::NAMES[c]).collect();
                    wrong.push(format!(
                        "verdict {} moved verdict counters {names:?}",
                        verdict_name(out.verdict)
                    ));
                }
            }
            if !wrong.is_empty() && report.failures.len() < MAX_FAILURES {
                report.failures.push(format!(
                    "seed {seed}, packet {i} (ingress {ingress}): {}\n{}",
                    wrong.join("; "),
                    hex_diff(&frame, &out.output)
                ));
            }
            if (i + 1) % BATCH == 0 || i + 1 == packets {
                let now = self.net.dp.stats()?.counters;
                let mut by_class = [0u64; 5];
                for c in 0..counter::VERDICTS as usize {
                    by_class[class(c as u32) as usize] += now[c] - batch_start[c];
                }
                if by_class != batch {
                    report.failures.push(format!(
                        "seed {seed}, packets to {i}: verdict counters by class {by_class:?}, returned {batch:?}"
                    ));
                }
                batch_start = now;
                batch = [0; 5];
            }
            report.packets += 1;
            if report.failures.len() >= MAX_FAILURES {
                break;
            }
        }
        let end = self.net.dp.stats()?.counters;
        report.counters = (0..counter::COUNT as usize)
            .map(|c| (counter::NAMES[c].to_owned(), end[c] - start[c]))
            .collect();
        Ok(report)
    }

    /// One frame to run and the interface it arrives on.
    fn frame(&self, rng: &mut Rng) -> (Vec<u8>, u32) {
        let ingress = if rng.chance(2) {
            self.net.vc
        } else {
            self.net.vb
        };
        if rng.chance(12) {
            // Random bytes, now and then behind a valid Ethernet+IPv4 or IPv6 start.
            let most = if rng.chance(3) { 1600 } else { 120 };
            let len = MIN_FRAME + rng.below(most);
            let mut f = rng.bytes(len);
            if f.len() >= 54 && rng.chance(3) {
                f[12..14].copy_from_slice(&[0x86, 0xdd]);
                f[14] = 0x60;
                f[38..54].copy_from_slice(rng.pick(&TARGETS6));
            } else if f.len() >= 34 && rng.chance(2) {
                f[12..14].copy_from_slice(&[0x08, 0x00]);
                f[14] = 0x45;
                f[30..34].copy_from_slice(rng.pick(&TARGETS));
            }
            return (f, ingress);
        }
        let s = rng.pick(&self.seeds);
        let mut f = s.frame.clone();
        let ingress = if rng.chance(8) { ingress } else { s.ingress };
        let rounds = if rng.chance(6) { 0 } else { 1 + rng.below(3) };
        for _ in 0..rounds {
            mutate(rng, &mut f);
        }
        // The kernel refuses test runs of frames shorter than an Ethernet header (a NIC never
        // delivers one either).
        while f.len() < MIN_FRAME {
            f.push(rng.byte());
        }
        (f, ingress)
    }
}

/// The verdict (XDP action) a verdict counter stands for.
fn class(c: u32) -> u32 {
    use counter::*;
    match c {
        PASS_NOT_IP | PASS_NOT_VIP | PASS_MALFORMED | PASS_FRAGMENT | PASS_EXT_HEADERS => XDP_PASS,
        FWD_TX | ICMP_ECHO_REPLY | ICMP_TOO_BIG | SYN_PROXY_SYNACK | SYN_PROXY_RESET
        | SYN_PROXY_STALE => XDP_TX,
        FWD_REDIRECT => XDP_REDIRECT,
        _ => XDP_DROP,
    }
}

/// A right checksum stays right and a wrong one wrong; a layer may not appear or vanish.
fn preserved(was: &Checksums, now: &Checksums) -> bool {
    was.ip == now.ip && was.l4 == now.l4 && was.icmp == now.icmp && was.quoted_ip == now.quoted_ip
}

/// The quote of `frame` if it is ICMP fragmentation needed or ICMPv6 packet too big (what lb
/// answers a packet too big for its path with).
fn too_big_quote(frame: &[u8]) -> Option<&[u8]> {
    let l3 = l3(frame);
    let (proto, hdr, ty) = if is_v6(frame) {
        (58, 40, [ICMP6_PACKET_TOO_BIG, 0])
    } else {
        (1, 20, [ICMP_DEST_UNREACH, ICMP_FRAG_NEEDED])
    };
    let ip_proto = *frame.get(l3 + if is_v6(frame) { 6 } else { 9 })?;
    let icmp = frame.get(l3 + hdr..)?;
    (ip_proto == proto && icmp.get(0..2)? == ty).then(|| icmp.get(8..))?
}

/// Whether `frame` is ICMP or ICMPv6 (by its IP header's protocol / next header).
fn is_icmp(frame: &[u8]) -> bool {
    let at = l3(frame) + if is_v6(frame) { 6 } else { 9 };
    matches!(frame.get(at), Some(1 | 58))
}

fn l3(frame: &[u8]) -> usize {
    if frame.get(12..14) == Some(&[0x81, 0x00]) {
        18
    } else {
        14
    }
}

/// The frame's IP source address (IPv4 or IPv6 by its EtherType).
fn source(frame: &[u8]) -> Option<IpAddr> {
    address(frame, 12, 8)
}

/// The frame's IP destination address.
fn destination(frame: &[u8]) -> Option<IpAddr> {
    address(frame, 16, 24)
}

/// The address at `v4` (IPv4) or `v6` (IPv6) bytes into the IP header.
fn address(frame: &[u8], v4: usize, v6: usize) -> Option<IpAddr> {
    let l3 = l3(frame);
    if is_v6(frame) {
        let b: [u8; 16] = frame.get(l3 + v6..l3 + v6 + 16)?.try_into().ok()?;
        return Some(Ipv6Addr::from(b).into());
    }
    let b: [u8; 4] = frame.get(l3 + v4..l3 + v4 + 4)?.try_into().ok()?;
    Some(Ipv4Addr::from(b).into())
}

/// One mutation of `f`.
fn mutate(rng: &mut Rng, f: &mut Vec<u8>) {
    if f.is_empty() {
        return;
    }
    let l3 = l3(f);
    if is_v6(f) {
        return mutate6(rng, f, l3);
    }
    let ihl = f.get(l3).map_or(20, |v| usize::from(v & 0x0f) * 4).max(20);
    let l4 = l3 + ihl;
    // Offsets of the fields that steer the program: Ethernet type, IPv4 header, TCP/UDP/ICMP
    // header, the quoted IPv4 and transport headers of an ICMP error.
    let fields: [usize; 22] = [
        12,
        l3,
        l3 + 2,
        l3 + 3,
        l3 + 6,
        l3 + 7,
        l3 + 8,
        l3 + 9,
        l3 + 10,
        l3 + 16,
        l3 + 19,
        l4,
        l4 + 1,
        l4 + 2,
        l4 + 3,
        l4 + 4,
        l4 + 5,
        l4 + 12,
        l4 + 13,
        l4 + 8,
        l4 + 17,
        l4 + 8 + 20,
    ];
    mutate_at(rng, f, &fields, l3 + 16, &|rng, f, o| {
        if f.len() >= o + 4 {
            f[o..o + 4].copy_from_slice(rng.pick(&TARGETS));
        }
    });
}

/// One mutation of an IPv6 frame `f` whose header is at `l3`.
fn mutate6(rng: &mut Rng, f: &mut Vec<u8>, l3: usize) {
    // The transport (or first extension) header, when there are no extension headers.
    let l4 = l3 + 40;
    // Version, payload length, next header, hop limit, the destination's last bytes, the
    // first 8 bytes after the header (an extension header's next/length, ports, ICMPv6 type and
    // code), TCP flags, the quoted IPv6 header's next header and its ports.
    let fields: [usize; 20] = [
        12,
        l3,
        l3 + 4,
        l3 + 5,
        l3 + 6,
        l3 + 7,
        l3 + 38,
        l3 + 39,
        l4,
        l4 + 1,
        l4 + 2,
        l4 + 3,
        l4 + 4,
        l4 + 6,
        l4 + 7,
        l4 + 13,
        l4 + 8,
        l4 + 8 + 6,
        l4 + 8 + 40,
        l4 + 8 + 43,
    ];
    mutate_at(rng, f, &fields, l3 + 24, &|rng, f, o| {
        if f.len() >= o + 16 {
            f[o..o + 16].copy_from_slice(rng.pick(&TARGETS6));
        }
    });
}

/// One mutation of `f`: random bytes, one of `fields` set to an edge value, a cut, garbage
/// appended, a VLAN tag, or the destination (at `dst`) pointed at an address by `retarget`.
fn mutate_at(
    rng: &mut Rng,
    f: &mut Vec<u8>,
    fields: &[usize],
    dst: usize,
    retarget: &dyn Fn(&mut Rng, &mut Vec<u8>, usize),
) {
    match rng.below(10) {
        0 | 1 => {
            for _ in 0..=rng.below(4) {
                let i = rng.below(f.len());
                f[i] = rng.byte();
            }
        }
        2..=4 => {
            let at = *rng.pick(fields);
            let random = rng.byte();
            // IPv4's and IPv6's: versions, header lengths, protocols and extension header
            // types, ICMPv6 types.
            let edge = [
                0, 1, 2, 4, 5, 6, 0x0f, 0x10, 0x11, 0x40, 0x45, 0x4f, 0x7f, 0x80, 0xff, 0x60, 43,
                44, 58, 60, 129, 135, random,
            ];
            if at < f.len() {
                f[at] = *rng.pick(&edge);
            }
        }
        5 | 6 => {
            let cut = rng.below(f.len() + 1);
            f.truncate(cut);
        }
        7 => {
            let n = rng.below(64);
            let extra = rng.bytes(n);
            f.extend_from_slice(&extra);
        }
        8 => {
            // A VLAN tag (another one, maybe: QinQ).
            if f.len() >= 14 {
                let tag = [0x81, 0x00, 0x00, rng.byte()];
                f.splice(12..12, tag);
            }
        }
        _ => retarget(rng, f, dst),
    }
}
