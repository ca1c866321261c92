//! Health probes through the tunnel, through BPF_PROG_TEST_RUN in the fixed network of
//! [`lb_tests::testnet`]: the TC egress program's exact output for marked probe packets (to the
//! VIP, encapsulated as the service's traffic, for both modes and families; checksums right),
//! what it passes untouched (no mark, another mark) and what it drops (a free slot, another
//! destination), the reply key it records; and the XDP program's rewrite of a probe's reply
//! (source VIP → backend, checksums right, passed to the kernel) beside the replies it leaves
//! alone.

use std::net::IpAddr;

use aya::programs::{SchedClassifier, TestRun as _, TestRunOptions};
use lb::tunnels::TunnelPath;
use lb_common::{DEFAULT_GUE_PORT, FlowKey, FlowKey6, PROTO_TCP, TUNNEL_MARK, addr6, counter::*};
use lb_tests::{
    fixture::{Fixture, XDP_PASS, XDP_REDIRECT, hex_diff},
    packet::{Encap, LB_MAC, Packet, TCP_ACK, TCP_PSH, TCP_SYN, at, encapsulate, verify_checksums},
    require_root,
    testnet::{BACKEND_MAC, TestNet, flow_hash, ne},
};

const TC_ACT_OK: u32 = 0;
const TC_ACT_SHOT: u32 = 2;

/// DSR services whose checks go through the tunnel (probe port 8080), one per mode and family,
/// and one whose check does not.
const SERVICES: &str = r#"
[[service]]
name = "ipip4"
vip = "10.100.0.1:80"
forwarding = "ipip"
backends = [{ address = "10.0.2.2:80" }]
[service.check]
kind = "tcp"
port = 8080
through_tunnel = true

[[service]]
name = "gue4"
vip = "10.100.0.2:80"
forwarding = "gue"
backends = [{ address = "10.0.2.3:80" }]
[service.check]
kind = "http"
port = 8080
through_tunnel = true

[[service]]
name = "plain4"
vip = "10.100.0.3:80"
forwarding = "gue"
backends = [{ address = "10.0.2.4:80" }]

[[service]]
name = "ipip6"
vip = "[2001:db8:100::1]:80"
forwarding = "ipip"
backends = [{ address = "[2001:db8:2::2]:80" }]
[service.check]
kind = "tcp-connect"
port = 8080
through_tunnel = true

[[service]]
name = "gue6"
vip = "[2001:db8:100::2]:80"
forwarding = "gue"
backends = [{ address = "[2001:db8:2::3]:80" }]
[service.check]
kind = "tcp"
port = 8080
through_tunnel = true
"#;

fn env() -> TestNet {
    require_root();
    TestNet::new("ring_size = 1009", SERVICES).unwrap()
}

/// A through-tunnel path of the config: (lb's address towards the backend, the backend, the
/// VIP, GUE or not).
struct Path {
    lb: &'static str,
    backend: &'static str,
    vip: &'static str,
    gue: bool,
}

const PATHS: [Path; 4] = [
    Path {
        lb: "10.0.2.1",
        backend: "10.0.2.2",
        vip: "10.100.0.1",
        gue: false,
    },
    Path {
        lb: "10.0.2.1",
        backend: "10.0.2.3",
        vip: "10.100.0.2",
        gue: true,
    },
    Path {
        lb: "2001:db8:2::1",
        backend: "2001:db8:2::2",
        vip: "2001:db8:100::1",
        gue: false,
    },
    Path {
        lb: "2001:db8:2::1",
        backend: "2001:db8:2::3",
        vip: "2001:db8:100::2",
        gue: true,
    },
];

impl Path {
    /// The socket mark of this path's probes, as the balancer planned its slot.
    fn mark(&self, e: &TestNet) -> u32 {
        let forwarding = if self.gue {
            lb::config::Forwarding::Gue
        } else {
            lb::config::Forwarding::Ipip
        };
        let path = TunnelPath {
            backend: self.backend.parse().unwrap(),
            vip: self.vip.parse().unwrap(),
            forwarding,
        };
        e.balancer.tunnels().mark(&path).expect("a slot")
    }

    /// A probe's segment as it leaves lb's stack: lb → backend:8080 (MACs of the route to the
    /// backend).
    fn probe(&self, e: &TestNet, flags: u8) -> Packet {
        Packet::tcp(&at(self.lb, 40001), &at(self.backend, 8080), flags)
            .macs(e.vb_mac, BACKEND_MAC)
            .seq(7000, if flags & TCP_ACK != 0 { 9001 } else { 0 })
    }

    /// The same segment to the VIP, encapsulated to the backend as the service's traffic.
    fn encapsulated(&self, e: &TestNet, flags: u8, payload: &[u8]) -> Vec<u8> {
        let inner = Packet::tcp(&at(self.lb, 40001), &at(self.vip, 8080), flags)
            .macs(e.vb_mac, BACKEND_MAC)
            .seq(7000, if flags & TCP_ACK != 0 { 9001 } else { 0 })
            .payload(payload);
        encapsulate(
            &inner.build(),
            &Encap {
                gue_port: self.gue.then_some(DEFAULT_GUE_PORT),
                src: self.lb.parse().unwrap(),
                dst: self.backend.parse().unwrap(),
                hash: flow_hash(self.lb, 40001, self.vip, 8080, PROTO_TCP),
                smac: e.vb_mac,
                dmac: BACKEND_MAC,
            },
        )
    }

    /// The backend's answer from the VIP to the probe's source, as it reaches lb, and as lb
    /// hands it to its stack (from the backend).
    fn answer(&self, e: &TestNet, from_vip: bool) -> Packet {
        let src = if from_vip { self.vip } else { self.backend };
        Packet::tcp(&at(src, 8080), &at(self.lb, 40001), TCP_SYN | TCP_ACK)
            .macs(BACKEND_MAC, e.vb_mac)
            .seq(9000, 7001)
    }

    /// Whether the TC program recorded the reply key of the probe from port 40001.
    fn recorded(&self, e: &mut TestNet) -> Option<IpAddr> {
        let tcp = PROTO_TCP;
        let (p, q) = (8080u16.to_be(), 40001u16.to_be());
        match (
            self.vip.parse::<IpAddr>().unwrap(),
            self.lb.parse::<IpAddr>().unwrap(),
        ) {
            (IpAddr::V4(vip), IpAddr::V4(lb)) => {
                let key = FlowKey::new(ne(&vip.to_string()), ne(&lb.to_string()), p, q, tcp);
                e.dp.probe_reply(&key)
                    .unwrap()
                    .map(|r| IpAddr::from(r.backend.to_ne_bytes()))
            }
            (IpAddr::V6(vip), IpAddr::V6(lb)) => {
                let key = FlowKey6::new(addr6(vip.octets()), addr6(lb.octets()), p, q, tcp);
                e.dp.probe_reply6(&key)
                    .unwrap()
                    .map(|r| IpAddr::from(lb_common::addr6_octets(r.backend)))
            }
            _ => unreachable!(),
        }
    }
}

/// One run of the TC program on `frame` with `mark`: (verdict, output frame).
fn run_tc(prog: &SchedClassifier, frame: &[u8], mark: u32) -> (u32, Vec<u8>) {
    let mut out = vec![0u8; frame.len() + 256];
    // struct __sk_buff: len, pkt_type, mark; the rest may stay out (zero).
    let ctx: Vec<u8> = [0u32, 0, mark]
        .iter()
        .flat_map(|v| v.to_ne_bytes())
        .collect();
    let r = prog
        .test_run(TestRunOptions {
            data_in: Some(frame),
            data_out: Some(&mut out),
            ctx_in: Some(&ctx),
            repeat: 1,
            ..Default::default()
        })
        .expect("test run of the TC program");
    out.truncate(r.data_size_out as usize);
    (r.return_value, out)
}

/// A TC row: (description, input, mark, verdict, expected output (None: unchanged),
/// informational counter that must move, if any).
struct TcRow {
    desc: String,
    input: Vec<u8>,
    mark: u32,
    verdict: u32,
    output: Option<Vec<u8>>,
    counter: Option<u32>,
}

/// Runs TC rows, reporting every mismatch at once.
fn run_tc_rows(e: &TestNet, rows: &[TcRow]) {
    let mut failures = String::new();
    for row in rows {
        let before = e.dp.stats().unwrap();
        let (verdict, out) = run_tc(e.dp.egress_program(), &row.input, row.mark);
        let after = e.dp.stats().unwrap();
        let mut report = String::new();
        if verdict != row.verdict {
            report += &format!("verdict {verdict}, want {}\n", row.verdict);
        }
        let want = row.output.as_deref().unwrap_or(&row.input);
        if row.verdict == TC_ACT_OK && out != want {
            report += &format!("output differs:\n{}", hex_diff(want, &out));
        }
        if row.verdict == TC_ACT_OK
            && let Err(err) = verify_checksums(&out)
        {
            report += &format!("checksums: {err}\n");
        }
        for i in 0..COUNT {
            let moved = after.counter(i) - before.counter(i);
            let wanted = u64::from(row.counter == Some(i));
            if moved != wanted {
                report += &format!(
                    "counter {} moved by {moved}, want {wanted}\n",
                    NAMES[i as usize]
                );
            }
        }
        if !report.is_empty() {
            failures += &format!("\n--- {} ---\n{report}", row.desc);
        }
    }
    assert!(failures.is_empty(), "TC fixture mismatches:{failures}");
}

#[test]
fn probes_leave_encapsulated_to_the_vip() {
    let mut e = env();
    let mut rows = Vec::new();
    for p in &PATHS {
        let mode = if p.gue { "gue" } else { "ipip" };
        let mark = p.mark(&e);
        for (what, flags, payload) in [
            ("SYN", TCP_SYN, &b""[..]),
            ("ACK", TCP_ACK, &b""[..]),
            (
                "request",
                TCP_ACK | TCP_PSH,
                &b"GET /health HTTP/1.1\r\n\r\n"[..],
            ),
        ] {
            rows.push(TcRow {
                desc: format!("{mode} {}: {what} to the VIP", p.backend),
                input: p.probe(&e, flags).payload(payload).build(),
                mark,
                verdict: TC_ACT_OK,
                output: Some(p.encapsulated(&e, flags, payload)),
                counter: Some(PROBE_ENCAPSULATED),
            });
        }
        rows.push(TcRow {
            desc: format!("{mode} {}: no mark, the host's own packet", p.backend),
            input: p.probe(&e, TCP_SYN).build(),
            mark: 0,
            verdict: TC_ACT_OK,
            output: None,
            counter: None,
        });
        rows.push(TcRow {
            desc: format!("{mode} {}: a mark outside the probes' range", p.backend),
            input: p.probe(&e, TCP_SYN).build(),
            mark: mark ^ 0x1_0000,
            verdict: TC_ACT_OK,
            output: None,
            counter: None,
        });
        // Another host than the slot's backend: never sent, encapsulated or not.
        let other = if p.lb.contains(':') {
            "2001:db8:2::9"
        } else {
            "10.0.2.9"
        };
        rows.push(TcRow {
            desc: format!("{mode} {}: its mark, to another host", p.backend),
            input: Packet::tcp(&at(p.lb, 40001), &at(other, 8080), TCP_SYN)
                .macs(e.vb_mac, BACKEND_MAC)
                .build(),
            mark,
            verdict: TC_ACT_SHOT,
            output: None,
            counter: Some(PROBE_DROPPED),
        });
        // A free slot: dropped rather than sent to the backend's own address.
        rows.push(TcRow {
            desc: format!("{mode} {}: a free slot", p.backend),
            input: p.probe(&e, TCP_SYN).build(),
            mark: TUNNEL_MARK | 0xfff,
            verdict: TC_ACT_SHOT,
            output: None,
            counter: Some(PROBE_DROPPED),
        });
    }
    for row in &rows {
        if let Some(out) = &row.output {
            verify_checksums(out).unwrap_or_else(|err| panic!("{}: expected: {err}", row.desc));
        }
    }
    e.ns.enter(|| run_tc_rows(&e, &rows));
    // The replies the probes await are known, each to its backend.
    for p in &PATHS {
        assert_eq!(
            p.recorded(&mut e),
            Some(p.backend.parse().unwrap()),
            "reply key of {}",
            p.backend
        );
    }
}

#[test]
fn replies_from_the_vip_come_back_from_the_backend() {
    let e = env();
    // The TC program records each path's probe first.
    let probes: Vec<(Vec<u8>, u32)> = PATHS
        .iter()
        .map(|p| (p.probe(&e, TCP_SYN).build(), p.mark(&e)))
        .collect();
    e.ns.enter(|| {
        for (frame, mark) in &probes {
            assert_eq!(run_tc(e.dp.egress_program(), frame, *mark).0, TC_ACT_OK);
        }
    });
    let mut fixtures = Vec::new();
    for p in &PATHS {
        let mode = if p.gue { "gue" } else { "ipip" };
        fixtures.push(
            Fixture::new(
                format!("{mode} {}: SYN+ACK from the VIP", p.backend),
                p.answer(&e, true).build(),
                XDP_PASS,
                PASS_PROBE_REPLY,
            )
            .ingress(e.vb)
            .output(p.answer(&e, false).build()),
        );
        fixtures.push(
            Fixture::new(
                format!("{mode} {}: data from the VIP", p.backend),
                p.answer(&e, true)
                    .payload(b"HTTP/1.1 200 OK\r\n\r\n")
                    .build(),
                XDP_PASS,
                PASS_PROBE_REPLY,
            )
            .ingress(e.vb)
            .output(
                p.answer(&e, false)
                    .payload(b"HTTP/1.1 200 OK\r\n\r\n")
                    .build(),
            ),
        );
        // Another port of lb's: no probe of ours, left as it is.
        let other = Packet::tcp(&at(p.vip, 8080), &at(p.lb, 40002), TCP_SYN | TCP_ACK)
            .macs(BACKEND_MAC, e.vb_mac)
            .build();
        fixtures.push(
            Fixture::new(
                format!("{mode} {}: from the VIP to an unrecorded port", p.backend),
                other,
                XDP_PASS,
                PASS_NOT_VIP,
            )
            .ingress(e.vb),
        );
        // From the backend's own address: the host's own traffic.
        fixtures.push(
            Fixture::new(
                format!("{mode} {}: from the backend's own address", p.backend),
                p.answer(&e, false).build(),
                XDP_PASS,
                PASS_NOT_VIP,
            )
            .ingress(e.vb),
        );
    }
    for f in &fixtures {
        if let Some(out) = &f.output {
            verify_checksums(out).unwrap_or_else(|err| panic!("{}: expected: {err}", f.desc));
        }
    }
    e.run(&fixtures);
    // Balanced traffic to the same VIPs is untouched by all this: a client's SYN is still
    // encapsulated by the XDP program, as the DSR fixtures show in full.
    let syn = Packet::tcp("10.0.1.2:5555", "10.100.0.1:80", TCP_SYN)
        .macs(lb_tests::packet::CLIENT_MAC, LB_MAC)
        .build();
    e.run(&[
        Fixture::new("a client's SYN to the VIP", syn, XDP_REDIRECT, FWD_REDIRECT)
            .ingress(e.vc)
            .any_output()
            .also(CT_NEW),
    ]);
}
