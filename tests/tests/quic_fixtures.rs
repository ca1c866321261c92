//! QUIC routing by server ID through BPF_PROG_TEST_RUN, exact bytes: long headers go by Maglev,
//! a short header naming a backend goes there whatever its 4-tuple (a new port, an address
//! the connection table never saw) and the table learns it; unknown server IDs, another config
//! rotation, packets too short to hold the ID and a named backend that is down fall back to
//! Maglev. Full NAT and direct server return, IPv4 and IPv6, in the fixed network of
//! [`lb_tests::testnet`].

use std::net::IpAddr;

use lb_common::counter::*;
use lb_tests::{
    fixture::{Fixture, XDP_REDIRECT, check_expected},
    packet::{Encap, Packet, at, encapsulate},
    quic::{CidLayout, initial, short_header as short},
    require_root,
    testnet::{TestNet, backend_mac, flow_hash},
};

/// The connection ID of `server_id` in the layout (`config`, `offset`, `bytes`).
fn cid(config: u8, offset: usize, bytes: usize, server_id: u64) -> [u8; 8] {
    CidLayout {
        server_id_bytes: bytes as u8,
        cid_offset: offset as u8,
        config_id: config,
    }
    .cid(server_id)
}

/// The MAC of backend 10.0.2.(i + 2) / 2001:db8:2::(i + 2), by its address.
fn mac_of(backend: &str) -> [u8; 6] {
    let last = backend.rsplit(['.', ':']).next().unwrap();
    backend_mac(u8::from_str_radix(last, 16).unwrap() - 2)
}

const SERVICES: &str = r#"
[[service]]
name = "h3"
vip = "10.100.0.5:443"
protocol = "udp"
quic = { server_id_bytes = 2 }
backends = [{ address = "10.0.2.2:443", server_id = 1 }, { address = "10.0.2.3:443", server_id = 258 }, { address = "10.0.2.4:443" }]

[[service]]
name = "h3-dsr"
vip = "10.100.0.6:443"
protocol = "udp"
forwarding = "ipip"
quic = { server_id_bytes = 1, cid_offset = 3, config_id = 2 }
backends = [{ address = "10.0.2.2:443", server_id = 5 }, { address = "10.0.2.3:443", server_id = 6 }]

[[service]]
name = "h3-v6"
vip = "[2001:db8:100::5]:443"
protocol = "udp"
quic = { server_id_bytes = 2 }
backends = [{ address = "[2001:db8:2::2]:443", server_id = 1 }, { address = "[2001:db8:2::3]:443", server_id = 2 }]

[[service]]
name = "h3-v6-gue"
vip = "[2001:db8:100::6]:443"
protocol = "udp"
forwarding = "gue"
quic = { server_id_bytes = 3, cid_offset = 1 }
backends = [{ address = "[2001:db8:2::2]:443", server_id = 70000 }, { address = "[2001:db8:2::3]:443", server_id = 70001 }]
"#;

struct Service<'a> {
    e: &'a TestNet,
    /// Index in SERVICES.
    index: usize,
    vip: &'static str,
    client: &'static str,
    backends: &'static [&'static str],
    /// Outer source of direct server return (None: full NAT from lb's address).
    dsr: Option<(&'static str, Option<u16>)>,
    snat: &'static str,
}

impl Service<'_> {
    /// The backend Maglev gives `client:cport` (all are up).
    fn maglev(&self, cport: u16) -> &'static str {
        let hash = flow_hash(self.client, cport, self.vip, 443, 17);
        let ring = self.e.balancer.ring(self.index);
        let id = ring[(hash as u32 % ring.len() as u32) as usize];
        let i = (0..self.backends.len())
            .find(|&i| self.e.balancer.backend_id(self.index, i) == Some(id))
            .unwrap();
        self.backends[i]
    }

    /// The packet of `client:cport` with `payload`, as it reaches `backend`.
    fn sent(&self, cport: u16, payload: &[u8], backend: &str) -> Vec<u8> {
        let input = Packet::udp(&at(self.client, cport), &at(self.vip, 443)).payload(payload);
        match self.dsr {
            Some((outer, gue_port)) => encapsulate(
                &input.build(),
                &Encap {
                    gue_port,
                    src: outer.parse::<IpAddr>().unwrap(),
                    dst: backend.parse::<IpAddr>().unwrap(),
                    hash: flow_hash(self.client, cport, self.vip, 443, 17),
                    smac: self.e.vb_mac,
                    dmac: mac_of(backend),
                },
            ),
            None => {
                let port = self.e.snat_port(self.client, cport, self.vip, 443, 17);
                Packet::udp(&at(self.snat, port), &at(backend, 443))
                    .payload(payload)
                    .ttl(63)
                    .macs(self.e.vb_mac, mac_of(backend))
                    .build()
            }
        }
    }

    fn fixture(&self, desc: &str, cport: u16, payload: &[u8], backend: &str) -> Fixture {
        Fixture::new(
            format!("{}: {desc}", self.vip),
            Packet::udp(&at(self.client, cport), &at(self.vip, 443))
                .payload(payload)
                .build(),
            XDP_REDIRECT,
            FWD_REDIRECT,
        )
        .ingress(self.e.vc)
        .output(self.sent(cport, payload, backend))
    }
}

/// The cases of one service whose backends 0 and 1 have server IDs `ids`, in the layout
/// (`config`, `offset`, `bytes`).
fn cases(s: &Service, ids: [u64; 2], config: u8, offset: usize, bytes: usize) -> Vec<Fixture> {
    // A port whose Maglev pick is backend 0, so that naming backend 1 moves the packet.
    let base = (50000..51000)
        .find(|&p| s.maglev(p) == s.backends[0])
        .unwrap();
    let to_1 = short(cid(config, offset, bytes, ids[1]));
    let mut out = vec![
        s.fixture(
            "a long header (Initial) goes by Maglev",
            base,
            &initial(),
            s.backends[0],
        )
        .also(CT_NEW),
        s.fixture(
            "a short header naming backend 1 on backend 0's flow moves there",
            base,
            &to_1,
            s.backends[1],
        )
        .also(CT_NEW)
        .also(QUIC_ROUTED)
        .also(QUIC_LEARNED),
        s.fixture(
            "the next one stays there, learned",
            base,
            &to_1,
            s.backends[1],
        )
        .also(QUIC_ROUTED),
        s.fixture(
            "the client's new port (a NAT rebinding): the same backend",
            base + 1000,
            &to_1,
            s.backends[1],
        )
        .also(CT_NEW)
        .also(QUIC_ROUTED)
        .also(QUIC_LEARNED),
    ];
    let unknown = base + 1001;
    out.push(
        s.fixture(
            "an unknown server ID goes by Maglev",
            unknown,
            &short(cid(config, offset, bytes, 99)),
            s.maglev(unknown),
        )
        .also(CT_NEW)
        .also(QUIC_UNKNOWN_SERVER_ID),
    );
    let unroutable = base + 1002;
    out.push(
        s.fixture(
            "config rotation 0b111 (unroutable) goes by Maglev",
            unroutable,
            &short(cid(7, offset, bytes, ids[1])),
            s.maglev(unroutable),
        )
        .also(CT_NEW)
        .also(QUIC_FALLBACK),
    );
    let truncated = base + 1003;
    let mut tiny = short(cid(config, offset, bytes, ids[1]));
    tiny.truncate(offset + 2);
    out.push(
        s.fixture(
            "a short header too short to hold the server ID goes by Maglev",
            truncated,
            &tiny,
            s.maglev(truncated),
        )
        .also(CT_NEW)
        .also(QUIC_FALLBACK),
    );
    let empty = base + 1004;
    out.push(
        s.fixture(
            "an empty datagram goes by Maglev",
            empty,
            &[],
            s.maglev(empty),
        )
        .also(CT_NEW),
    );
    if config != 0 {
        let other = base + 1005;
        out.push(
            s.fixture(
                "another config rotation goes by Maglev",
                other,
                &short(cid(config - 1, offset, bytes, ids[1])),
                s.maglev(other),
            )
            .also(CT_NEW)
            .also(QUIC_FALLBACK),
        );
    }
    out
}

#[test]
fn short_headers_go_to_the_backend_their_connection_id_names() {
    require_root();
    let e = TestNet::new("ring_size = 1009", SERVICES).unwrap();
    let services = [
        (
            Service {
                e: &e,
                index: 0,
                vip: "10.100.0.5",
                client: "10.0.1.2",
                backends: &["10.0.2.2", "10.0.2.3", "10.0.2.4"],
                dsr: None,
                snat: "10.0.2.1",
            },
            [1, 258],
            0,
            1,
            2,
        ),
        (
            Service {
                e: &e,
                index: 1,
                vip: "10.100.0.6",
                client: "10.0.1.2",
                backends: &["10.0.2.2", "10.0.2.3"],
                dsr: Some(("10.0.2.1", None)),
                snat: "10.0.2.1",
            },
            [5, 6],
            2,
            3,
            1,
        ),
        (
            Service {
                e: &e,
                index: 2,
                vip: "2001:db8:100::5",
                client: "2001:db8:1::2",
                backends: &["2001:db8:2::2", "2001:db8:2::3"],
                dsr: None,
                snat: "2001:db8:2::1",
            },
            [1, 2],
            0,
            1,
            2,
        ),
        (
            Service {
                e: &e,
                index: 3,
                vip: "2001:db8:100::6",
                client: "2001:db8:1::2",
                backends: &["2001:db8:2::2", "2001:db8:2::3"],
                dsr: Some(("2001:db8:2::1", Some(lb_common::DEFAULT_GUE_PORT))),
                snat: "2001:db8:2::1",
            },
            [70000, 70001],
            0,
            1,
            3,
        ),
    ];
    let mut fixtures = Vec::new();
    for (s, ids, config, offset, bytes) in &services {
        fixtures.extend(cases(s, *ids, *config, *offset, *bytes));
    }
    check_expected(&fixtures);
    e.run(&fixtures);
}

#[test]
fn a_named_backend_that_is_down_is_not_used() {
    require_root();
    let mut e = TestNet::new("ring_size = 1009", SERVICES).unwrap();
    // Backend 1 (server ID 258) down: its flows' packets and new paths go by Maglev, which
    // no longer has it.
    let TestNet { balancer, dp, .. } = &mut e;
    balancer.set_up(0, 1, false, dp).unwrap();
    let s = Service {
        e: &e,
        index: 0,
        vip: "10.100.0.5",
        client: "10.0.1.2",
        backends: &["10.0.2.2", "10.0.2.3", "10.0.2.4"],
        dsr: None,
        snat: "10.0.2.1",
    };
    let cport = 52000;
    let pick = s.maglev(cport);
    assert_ne!(pick, "10.0.2.3", "the ring without backend 1");
    let fixtures = [s
        .fixture(
            "a short header naming a backend that is down goes by Maglev",
            cport,
            &short(cid(0, 1, 2, 258)),
            pick,
        )
        .also(CT_NEW)
        .also(QUIC_FALLBACK)];
    check_expected(&fixtures);
    e.run(&fixtures);
}
