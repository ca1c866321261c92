//! The SYN proxy through BPF_PROG_TEST_RUN (issue 39): the exact bytes of each step of a proxied
//! connection, in the fixed network of [`lb_tests::testnet`], with a known cookie key. What lb
//! chooses itself (the cookie, its timestamp) is read from its answer and checked for what it
//! must be: a cookie that validates under the key for this SYN, a timestamp that carries the
//! client's window scale and SACK-permitted.

use std::net::IpAddr;

use lb_common::{
    COOKIE_TICK_SHIFT, CookieKey, addr6, check_cookie, cookie_words, counter::*, make_cookie,
    mapped, trace_kind, ts_decode,
};
use lb_tests::{
    fixture::{Collect, XDP_DROP, XDP_REDIRECT, XDP_TX, everything, hex_diff, run_once},
    packet::{CLIENT_MAC, LB_MAC, Packet, TCP_ACK, TCP_PSH, TCP_RST, TCP_SYN, at},
    require_root,
    testnet::{BACKEND_MAC, TestNet, ne},
};

const SERVICES: &str = r#"
[[service]]
name = "proxied"
vip = "10.100.0.5:80"
syn_proxy = "on"
backends = [{ address = "10.0.2.2:8080" }]

[[service]]
name = "proxied6"
vip = "[2001:db8:100::5]:80"
syn_proxy = "on"
backends = [{ address = "[2001:db8:2::2]:8080" }]
"#;

const KEY: CookieKey = CookieKey {
    k0: 0x0706_0504_0302_0100,
    k1: 0x0f0e_0d0c_0b0a_0908,
};
const KEY2: CookieKey = CookieKey { k0: 11, k1: 22 };

/// A family's addresses in the test network, where its TCP header starts, and the MSS lb
/// announces over it.
struct Fam {
    client: &'static str,
    vip: &'static str,
    backend: &'static str,
    snat: &'static str,
    tcp: usize,
    mss: u16,
}

const V4: Fam = Fam {
    client: "10.0.1.2",
    vip: "10.100.0.5",
    backend: "10.0.2.2",
    snat: "10.0.2.1",
    tcp: 14 + 20,
    mss: 1460,
};
const V6: Fam = Fam {
    client: "2001:db8:1::2",
    vip: "2001:db8:100::5",
    backend: "2001:db8:2::2",
    snat: "2001:db8:2::1",
    tcp: 14 + 40,
    mss: 1440,
};
const CLIENT: &str = V4.client;
const VIP: &str = V4.vip;

/// The cookie clock now (TAI), as the datapath reads it.
fn tick() -> u32 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid timespec to fill.
    assert_eq!(unsafe { libc::clock_gettime(libc::CLOCK_TAI, &mut ts) }, 0);
    ((ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64) >> COOKIE_TICK_SHIFT) as u32
}

/// An address as the datapath holds it in a cookie's words (IPv4 mapped).
fn words_addr(ip: &str) -> [u32; 4] {
    match ip.parse::<IpAddr>().unwrap() {
        IpAddr::V4(_) => mapped(ne(ip)),
        IpAddr::V6(a) => addr6(a.octets()),
    }
}

fn cookie_flow(f: &Fam, cport: u16) -> [u64; 5] {
    cookie_words(
        words_addr(f.client),
        words_addr(f.vip),
        cport.to_be(),
        80u16.to_be(),
    )
}

fn words(cport: u16) -> [u64; 5] {
    cookie_flow(&V4, cport)
}

fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes(b[at..at + 4].try_into().unwrap())
}

struct Net {
    e: TestNet,
}

impl Net {
    /// Runs `frame` arriving on `ingress`; checks the verdict and returns the output.
    fn run(&self, what: &str, frame: &[u8], ingress: u32, verdict: u32) -> Vec<u8> {
        let r = self
            .e
            .ns
            .enter(|| run_once(self.e.dp.program(), frame, ingress))
            .unwrap();
        assert_eq!(r.verdict, verdict, "{what}: verdict");
        r.output
    }

    fn counter(&self, index: u32) -> u64 {
        self.e.dp.stats().unwrap().counters[index as usize]
    }

    fn expect(&self, what: &str, got: &[u8], want: &Packet) {
        let want = want.build();
        assert!(
            got == want.as_slice(),
            "{what}: the frame differs\n{}",
            hex_diff(&want, got)
        );
    }
}

/// Linux's SYN options with timestamp `tsval`: MSS 1460, SACK-permitted, timestamps, NOP,
/// window scale 7.
fn syn_options(tsval: u32) -> Vec<u8> {
    let mut o = vec![2, 4, 5, 180, 4, 2, 8, 10];
    o.extend(tsval.to_be_bytes());
    o.extend([0, 0, 0, 0, 1, 3, 3, 7]);
    o
}

fn ts_option(tsval: u32, tsecr: u32) -> Vec<u8> {
    let mut o = vec![1, 1, 8, 10];
    o.extend(tsval.to_be_bytes());
    o.extend(tsecr.to_be_bytes());
    o
}

#[test]
fn every_step_of_a_proxied_ipv4_connection() {
    every_step(&V4);
}

#[test]
fn every_step_of_a_proxied_ipv6_connection() {
    every_step(&V6);
}

fn every_step(f: &Fam) {
    require_root();
    let mut e = TestNet::new("ring_size = 1009", SERVICES).unwrap();
    e.dp.set_cookie_keys(KEY, None).unwrap();
    // Traced all along: each of the proxy's decisions is a record, its translations are not.
    let collect = Collect::default();
    let (mut trace, mut logger) = e.dp.take_trace(collect.clone()).unwrap();
    trace.start(&everything()).unwrap();
    let (vc, vb, vb_mac) = (e.vc, e.vb, e.vb_mac);
    let snat_port = e.snat_port(f.client, 40000, f.vip, 80, 6);
    let n = Net { e };
    let (client, vip) = (at(f.client, 40000), at(f.vip, 80));
    let (backend, snat) = (at(f.backend, 8080), at(f.snat, snat_port));
    let (tcp, opts) = (f.tcp, f.tcp + 20);

    // 1. The SYN: answered with lb's SYN+ACK, back where it came from; nothing else.
    let syn = Packet::tcp(&client, &vip, TCP_SYN)
        .seq(1000, 0)
        .tcp_options(&syn_options(7));
    let t = tick();
    let out = n.run("SYN", &syn.build(), vc, XDP_TX);
    let cookie = be32(&out, tcp + 4);
    let lb_ts = be32(&out, opts + 8);
    let valid = [t, t + 1]
        .into_iter()
        .find_map(|t| check_cookie(&KEY, &cookie_flow(f, 40000), 1000, cookie, t));
    assert_eq!(valid, Some(3), "the cookie validates, carrying MSS 1460");
    assert_eq!(
        ts_decode(lb_ts),
        (7, true),
        "the timestamp carries the options"
    );
    let mut synack_opts = vec![2, 4];
    synack_opts.extend(f.mss.to_be_bytes());
    synack_opts.extend([4, 2, 8, 10]);
    synack_opts.extend(lb_ts.to_be_bytes());
    synack_opts.extend([0, 0, 0, 7, 1, 3, 3, 7]);
    n.expect(
        "SYN+ACK",
        &out,
        &Packet::tcp(&vip, &client, TCP_SYN | TCP_ACK)
            .macs(LB_MAC, CLIENT_MAC)
            .ttl(63)
            .seq(cookie, 1001)
            .window(0)
            .tcp_options(&synack_opts),
    );
    assert_eq!(n.counter(SYN_PROXY_SYNACK), 1);
    assert_eq!(n.counter(CT_NEW), 0, "a SYN takes no state");

    // 2. The client's ACK returns the cookie: the flow is created, the backend gets a SYN with
    // the client's sequence number and options (its window unscaled).
    let ack = Packet::tcp(&client, &vip, TCP_ACK)
        .seq(1001, cookie + 1)
        .window(502)
        .tcp_options(&ts_option(8, lb_ts));
    let out = n.run("ACK", &ack.build(), vc, XDP_REDIRECT);
    n.expect(
        "SYN to the backend",
        &out,
        &Packet::tcp(&snat, &backend, TCP_SYN)
            .macs(vb_mac, BACKEND_MAC)
            .ttl(63)
            .seq(1000, 0)
            .window(502 << 7)
            .tcp_options(&[
                2, 4, 5, 180, 4, 2, 8, 10, 0, 0, 0, 8, 0, 0, 0, 0, 1, 3, 3, 7,
            ]),
    );
    assert_eq!(n.counter(SYN_PROXY_ACK_VALID), 1);
    assert_eq!(n.counter(CT_NEW), 1);

    // A data segment before the backend answered (a client ignoring the zero window): dropped.
    let early = Packet::tcp(&client, &vip, TCP_ACK | TCP_PSH)
        .seq(1001, cookie + 1)
        .tcp_options(&ts_option(8, lb_ts))
        .payload(b"early");
    n.run("data before the backend", &early.build(), vc, XDP_DROP);
    assert_eq!(n.counter(DROP_SYN_PROXY_PENDING), 1);

    // 3. The backend's SYN+ACK: the client's window update, one byte it already has at lb's
    // initial sequence number, so it acknowledges at once.
    let synack = Packet::tcp(&backend, &snat, TCP_SYN | TCP_ACK)
        .macs(BACKEND_MAC, vb_mac)
        .seq(5000, 1001)
        .window(65160)
        .tcp_options(&[
            2, 4, 5, 180, 4, 2, 8, 10, 0, 1, 0x5f, 0x90, 0, 0, 0, 8, 1, 3, 3, 9,
        ]);
    let out = n.run("backend SYN+ACK", &synack.build(), vb, XDP_REDIRECT);
    let backend_ts = 0x0001_5f90u32;
    let ts_off = lb_ts.wrapping_sub(backend_ts);
    n.expect(
        "window update",
        &out,
        &Packet::tcp(&vip, &client, TCP_ACK)
            .macs(LB_MAC, CLIENT_MAC)
            .ttl(63)
            .seq(cookie, 1001)
            .window(65160 >> 7)
            .tcp_options(&ts_option(lb_ts, 8))
            .payload(&[0]),
    );
    assert_eq!(n.counter(SYN_PROXY_OPENED), 1);

    // 4. The client's data: its acknowledgement and TSecr in the backend's numbers.
    let data = Packet::tcp(&client, &vip, TCP_ACK | TCP_PSH)
        .seq(1001, cookie + 1)
        .window(502)
        .tcp_options(&ts_option(9, lb_ts))
        .payload(b"GET / HTTP/1.1\r\n\r\n");
    let out = n.run("client data", &data.build(), vc, XDP_REDIRECT);
    n.expect(
        "client data translated",
        &out,
        &Packet::tcp(&snat, &backend, TCP_ACK | TCP_PSH)
            .macs(vb_mac, BACKEND_MAC)
            .ttl(63)
            .seq(1001, 5001)
            .window(502)
            .tcp_options(&ts_option(9, backend_ts))
            .payload(b"GET / HTTP/1.1\r\n\r\n"),
    );

    // 5. The backend's data: its sequence number and TSval in lb's; its window (scale 9) in
    // lb's scale 7.
    let reply = Packet::tcp(&backend, &snat, TCP_ACK | TCP_PSH)
        .macs(BACKEND_MAC, vb_mac)
        .seq(5001, 1019)
        .window(100)
        .tcp_options(&ts_option(backend_ts + 5, 9))
        .payload(b"HTTP/1.1 200 OK\r\n");
    let out = n.run("backend data", &reply.build(), vb, XDP_REDIRECT);
    n.expect(
        "backend data translated",
        &out,
        &Packet::tcp(&vip, &client, TCP_ACK | TCP_PSH)
            .macs(LB_MAC, CLIENT_MAC)
            .ttl(63)
            .seq(cookie + 1, 1019)
            .window(400)
            .tcp_options(&ts_option(lb_ts.wrapping_add(5), 9))
            .payload(b"HTTP/1.1 200 OK\r\n"),
    );

    // 6. A SACK from the client: its blocks in the backend's numbers.
    let mut sack = ts_option(10, lb_ts.wrapping_add(5));
    sack.extend([1, 1, 5, 10]);
    sack.extend((cookie + 101).to_be_bytes());
    sack.extend((cookie + 201).to_be_bytes());
    let out = n.run(
        "client SACK",
        &Packet::tcp(&client, &vip, TCP_ACK)
            .seq(1019, cookie + 18)
            .window(502)
            .tcp_options(&sack)
            .build(),
        vc,
        XDP_REDIRECT,
    );
    let mut want = ts_option(10, backend_ts + 5);
    want.extend([1, 1, 5, 10]);
    want.extend(5101u32.to_be_bytes());
    want.extend(5201u32.to_be_bytes());
    n.expect(
        "SACK translated",
        &out,
        &Packet::tcp(&snat, &backend, TCP_ACK)
            .macs(vb_mac, BACKEND_MAC)
            .ttl(63)
            .seq(1019, 5018)
            .window(502)
            .tcp_options(&want),
    );

    // 7. The timestamp laid out otherwise (TS, NOP, NOP; the balancer's own translation takes
    // Linux's NOP, NOP, TS only): the proxy's option walk translates it the same.
    let mut ts_first = ts_option(11, lb_ts.wrapping_add(5));
    ts_first.rotate_left(2);
    let out = n.run(
        "client segment, TS first",
        &Packet::tcp(&client, &vip, TCP_ACK)
            .seq(1019, cookie + 18)
            .window(502)
            .tcp_options(&ts_first)
            .build(),
        vc,
        XDP_REDIRECT,
    );
    let mut want = ts_option(11, backend_ts + 5);
    want.rotate_left(2);
    n.expect(
        "TS first translated",
        &out,
        &Packet::tcp(&snat, &backend, TCP_ACK)
            .macs(vb_mac, BACKEND_MAC)
            .ttl(63)
            .seq(1019, 5018)
            .window(502)
            .tcp_options(&want),
    );

    // 8. A backend segment without options: its sequence number and window only.
    let out = n.run(
        "backend ACK, no options",
        &Packet::tcp(&backend, &snat, TCP_ACK)
            .macs(BACKEND_MAC, vb_mac)
            .seq(5018, 1019)
            .window(3)
            .build(),
        vb,
        XDP_REDIRECT,
    );
    n.expect(
        "backend ACK translated",
        &out,
        &Packet::tcp(&vip, &client, TCP_ACK)
            .macs(LB_MAC, CLIENT_MAC)
            .ttl(63)
            .seq(cookie + 18, 1019)
            .window(12),
    );
    assert!(n.counter(SYN_PROXY_TRANSLATED) >= 5);
    assert_eq!(ts_off, lb_ts.wrapping_sub(backend_ts));

    n.e.ns.enter(|| logger.flush());
    let r = collect.take();
    let kinds: Vec<_> = r.iter().map(|r| (r.kind, r.reason)).collect();
    assert_eq!(
        kinds,
        [
            (trace_kind::PROXY_COOKIE, SYN_PROXY_SYNACK),
            (trace_kind::PROXY_CREATED, FWD_REDIRECT),
            (trace_kind::DROPPED, DROP_SYN_PROXY_PENDING),
            (trace_kind::PROXY_OPENED, FWD_REDIRECT),
        ],
        "{r:#?}"
    );
    let ip: IpAddr = f.client.parse().unwrap();
    for r in &r {
        assert_eq!((r.client, r.client_port, r.vip_port), (Some(ip), 40000, 80));
        assert!(r.service.is_some(), "{r:?}");
    }
    assert_eq!(r[0].backend, None, "a cookie takes no state");
    let created = r[1];
    assert!(created.backend.is_some());
    assert_eq!(created.snat_port, snat_port);
    assert_eq!(
        (r[3].backend, r[3].snat_port),
        (created.backend, created.snat_port)
    );
}

#[test]
fn a_time_wait_on_the_backend_gets_a_syn_past_its_timestamp_ipv4() {
    time_wait(&V4);
}

#[test]
fn a_time_wait_on_the_backend_gets_a_syn_past_its_timestamp_ipv6() {
    time_wait(&V6);
}

/// The backend still holds an earlier connection's 4-tuple in TIME_WAIT and answers lb's SYN
/// with that connection's ACK (its timestamp echoed): lb sends the SYN again at once with a
/// timestamp past it, and moves the client's timestamps by as much both ways for the flow's
/// life. Without timestamps it resets the earlier connection instead.
fn time_wait(f: &Fam) {
    require_root();
    let mut e = TestNet::new("ring_size = 1009", SERVICES).unwrap();
    e.dp.set_cookie_keys(KEY, None).unwrap();
    let collect = Collect::default();
    let (mut trace, mut logger) = e.dp.take_trace(collect.clone()).unwrap();
    trace.start(&everything()).unwrap();
    let (vc, vb, vb_mac) = (e.vc, e.vb, e.vb_mac);
    let snat_port = e.snat_port(f.client, 40000, f.vip, 80, 6);
    let n = Net { e };
    let (client, vip) = (at(f.client, 40000), at(f.vip, 80));
    let (backend, snat) = (at(f.backend, 8080), at(f.snat, snat_port));
    let (tcp, opts) = (f.tcp, f.tcp + 20);

    let syn = Packet::tcp(&client, &vip, TCP_SYN)
        .seq(1000, 0)
        .tcp_options(&syn_options(7));
    let out = n.run("SYN", &syn.build(), vc, XDP_TX);
    let (cookie, lb_ts) = (be32(&out, tcp + 4), be32(&out, opts + 8));
    let ack = Packet::tcp(&client, &vip, TCP_ACK)
        .seq(1001, cookie + 1)
        .window(502)
        .tcp_options(&ts_option(8, lb_ts));
    n.run("ACK", &ack.build(), vc, XDP_REDIRECT);

    // The TIME_WAIT's ACK: its last acknowledgement, its timestamp echoing the earlier
    // connection's last (5000, past the client's 8).
    let stale = Packet::tcp(&backend, &snat, TCP_ACK)
        .macs(BACKEND_MAC, vb_mac)
        .seq(777_000, 999_000)
        .window(64)
        .tcp_options(&ts_option(4242, 5000));
    let out = n.run("TIME_WAIT's ACK", &stale.build(), vb, XDP_TX);
    n.expect(
        "SYN again, its timestamp past the TIME_WAIT's",
        &out,
        &Packet::tcp(&snat, &backend, TCP_SYN)
            .macs(vb_mac, BACKEND_MAC)
            .ttl(63)
            .seq(1000, 0)
            .window(u16::MAX)
            .tcp_options(&[
                2, 4, 5, 180, 4, 2, 8, 10, 0, 0, 0x13, 0x89, 0, 0, 0, 0, 1, 3, 3, 7,
            ]),
    );
    assert_eq!(n.counter(SYN_PROXY_STALE), 1);
    let cts_off = 5001u32 - 8;

    // The backend's SYN+ACK echoes 5001: the client's window update echoes its own 8.
    let synack = Packet::tcp(&backend, &snat, TCP_SYN | TCP_ACK)
        .macs(BACKEND_MAC, vb_mac)
        .seq(5000, 1001)
        .window(65160)
        .tcp_options(&[
            2, 4, 5, 180, 4, 2, 8, 10, 0, 1, 0x5f, 0x90, 0, 0, 0x13, 0x89, 1, 3, 3, 9,
        ]);
    let out = n.run("backend SYN+ACK", &synack.build(), vb, XDP_REDIRECT);
    let backend_ts = 0x0001_5f90u32;
    n.expect(
        "window update",
        &out,
        &Packet::tcp(&vip, &client, TCP_ACK)
            .macs(LB_MAC, CLIENT_MAC)
            .ttl(63)
            .seq(cookie, 1001)
            .window(65160 >> 7)
            .tcp_options(&ts_option(lb_ts, 8))
            .payload(&[0]),
    );

    // Both ways the client's timestamps are moved by as much (the balancer's own translation).
    let data = Packet::tcp(&client, &vip, TCP_ACK | TCP_PSH)
        .seq(1001, cookie + 1)
        .window(502)
        .tcp_options(&ts_option(9, lb_ts))
        .payload(b"GET /");
    let out = n.run("client data", &data.build(), vc, XDP_REDIRECT);
    n.expect(
        "client data translated",
        &out,
        &Packet::tcp(&snat, &backend, TCP_ACK | TCP_PSH)
            .macs(vb_mac, BACKEND_MAC)
            .ttl(63)
            .seq(1001, 5001)
            .window(502)
            .tcp_options(&ts_option(9 + cts_off, backend_ts))
            .payload(b"GET /"),
    );
    let reply = Packet::tcp(&backend, &snat, TCP_ACK | TCP_PSH)
        .macs(BACKEND_MAC, vb_mac)
        .seq(5001, 1006)
        .window(100)
        .tcp_options(&ts_option(backend_ts + 5, 9 + cts_off))
        .payload(b"200");
    let out = n.run("backend data", &reply.build(), vb, XDP_REDIRECT);
    n.expect(
        "backend data translated",
        &out,
        &Packet::tcp(&vip, &client, TCP_ACK | TCP_PSH)
            .macs(LB_MAC, CLIENT_MAC)
            .ttl(63)
            .seq(cookie + 1, 1006)
            .window(400)
            .tcp_options(&ts_option(lb_ts.wrapping_add(5), 9))
            .payload(b"200"),
    );

    // A client without timestamps: the earlier connection is reset at its acknowledgement.
    let client = at(f.client, 40001);
    let snat = at(f.snat, n.e.snat_port(f.client, 40001, f.vip, 80, 6));
    let syn = Packet::tcp(&client, &vip, TCP_SYN)
        .seq(3000, 0)
        .tcp_options(&[2, 4, 5, 180]);
    let out = n.run("SYN, no timestamps", &syn.build(), vc, XDP_TX);
    let cookie = be32(&out, tcp + 4);
    let ack = Packet::tcp(&client, &vip, TCP_ACK).seq(3001, cookie + 1);
    n.run("ACK, no timestamps", &ack.build(), vc, XDP_REDIRECT);
    let stale = Packet::tcp(&backend, &snat, TCP_ACK)
        .macs(BACKEND_MAC, vb_mac)
        .seq(888_000, 123_456)
        .window(64);
    let out = n.run("TIME_WAIT's ACK, no timestamps", &stale.build(), vb, XDP_TX);
    n.expect(
        "RST at its acknowledgement",
        &out,
        &Packet::tcp(&snat, &backend, TCP_RST)
            .macs(vb_mac, BACKEND_MAC)
            .ttl(63)
            .seq(123_456, 0)
            .window(0),
    );
    assert_eq!(n.counter(SYN_PROXY_STALE), 2);

    // Then the backend refuses lb's SYN: its RST goes on to the client, the handshake failed.
    let refused = Packet::tcp(&backend, &snat, TCP_RST | TCP_ACK)
        .macs(BACKEND_MAC, vb_mac)
        .seq(0, 3001);
    n.run("backend RST", &refused.build(), vb, XDP_REDIRECT);
    assert_eq!(n.counter(SYN_PROXY_FAILED), 1);

    n.e.ns.enter(|| logger.flush());
    let r = collect.take();
    let kinds: Vec<_> = r.iter().map(|r| (r.kind, r.client_port)).collect();
    use trace_kind::*;
    assert_eq!(
        kinds,
        [
            (PROXY_COOKIE, 40000),
            (PROXY_CREATED, 40000),
            (PROXY_STALE, 40000),
            (PROXY_OPENED, 40000),
            (PROXY_COOKIE, 40001),
            (PROXY_CREATED, 40001),
            (PROXY_STALE, 40001),
            (PROXY_FAILED, 40001),
        ],
        "{r:#?}"
    );
    assert_eq!(r[2].reason, SYN_PROXY_STALE);
}

#[test]
fn acks_without_a_valid_cookie_are_dropped() {
    require_root();
    let mut e = TestNet::new("ring_size = 1009", SERVICES).unwrap();
    e.dp.set_cookie_keys(KEY2, Some(KEY)).unwrap();
    let vc = e.vc;
    let n = Net { e };
    let vip = at(VIP, 80);
    let ack = |cport: u16, isn: u32, cookie: u32| {
        Packet::tcp(&at(CLIENT, cport), &vip, TCP_ACK)
            .seq(isn + 1, cookie.wrapping_add(1))
            .build()
    };
    let t = tick();
    // A cookie of the previous key (a rotation since its SYN) still opens the flow.
    let old_key = make_cookie(&KEY, &words(41000), 500, t, 2);
    n.run("previous key", &ack(41000, 500, old_key), vc, XDP_REDIRECT);
    assert_eq!(n.counter(SYN_PROXY_ACK_VALID), 1);
    // A guess, another SYN's cookie, and one 3 ticks old (about 3.4 minutes): dropped.
    n.run("a guess", &ack(41001, 500, 0x1234_5678), vc, XDP_DROP);
    let other_isn = make_cookie(&KEY2, &words(41002), 600, t, 2);
    n.run("another SYN's", &ack(41002, 500, other_isn), vc, XDP_DROP);
    let expired = make_cookie(&KEY2, &words(41003), 500, t.wrapping_sub(3), 2);
    n.run("expired", &ack(41003, 500, expired), vc, XDP_DROP);
    // A RST without a flow.
    let rst = Packet::tcp(&at(CLIENT, 41004), &vip, TCP_RST).build();
    n.run("RST", &rst, vc, XDP_DROP);
    assert_eq!(n.counter(DROP_SYN_PROXY_INVALID), 4);
    assert_eq!(n.counter(SYN_PROXY_ACK_VALID), 1);
    assert_eq!(n.counter(CT_NEW), 1);
}

/// The segments the proxy answers with one of its own (a SYN, a cookie's ACK) are checked:
/// with a damaged TCP checksum they are dropped, not answered with a segment whose checksum
/// lb computed anew, which would make a damaged segment a right one. With it right, the same
/// segments are answered; with data, the data is checked too.
#[test]
fn segments_with_a_wrong_checksum_are_not_answered() {
    require_root();
    let mut e = TestNet::new("ring_size = 1009", SERVICES).unwrap();
    e.dp.set_cookie_keys(KEY, None).unwrap();
    let vc = e.vc;
    let n = Net { e };
    for f in [&V4, &V6] {
        let (client, vip) = (at(f.client, 42000), at(f.vip, 80));
        let damaged = |p: Packet| {
            let mut b = p.build();
            b[f.tcp + 16] ^= 0x40;
            b
        };
        let syn = Packet::tcp(&client, &vip, TCP_SYN)
            .seq(1000, 0)
            .tcp_options(&syn_options(7));
        let before = n.counter(DROP_SYN_PROXY_CHECKSUM);
        n.run("damaged SYN", &damaged(syn.clone()), vc, XDP_DROP);
        // Damaged in its data, which the checksum covers (an odd length: the last byte alone).
        let mut with_data = syn.clone().payload(b"early data").build();
        let last = with_data.len() - 1;
        with_data[last] ^= 1;
        n.run("SYN, damaged data", &with_data, vc, XDP_DROP);
        let out = n.run(
            "SYN",
            &syn.clone().payload(b"early data").build(),
            vc,
            XDP_TX,
        );
        let cookie = be32(&out, f.tcp + 4);
        let ack = Packet::tcp(&client, &vip, TCP_ACK).seq(1001, cookie.wrapping_add(1));
        n.run("damaged ACK", &damaged(ack.clone()), vc, XDP_DROP);
        assert_eq!(n.counter(DROP_SYN_PROXY_CHECKSUM), before + 3, "{}", f.vip);
        n.run("ACK", &ack.build(), vc, XDP_REDIRECT);
    }
    assert_eq!(n.counter(SYN_PROXY_ACK_VALID), 2);
}

/// Issue 39: lb hosts behind the same routers share the cookie key through
/// `syn_cookie_key_file`, so a client whose SYN one host answered and whose ACK the routers send
/// to another (their hash changed in between) still gets its connection. Three datapaths, each
/// loaded as the daemon loads it: two reading the same key file, one with a key of its own.
#[test]
fn a_cookie_from_one_host_opens_the_flow_on_another_sharing_the_key_file() {
    require_root();
    let dir = lb_tests::daemon::TempDir::new().unwrap();
    let key_file = dir.0.join("cookie.key");
    std::fs::write(&key_file, "00112233445566778899aabbccddeeff\n").unwrap();
    let shared = format!(
        "ring_size = 1009\nsyn_cookie_key_file = \"{}\"",
        key_file.display()
    );
    let net = |lb: &str| {
        let e = TestNet::new(lb, SERVICES).unwrap();
        let vc = e.vc;
        (Net { e }, vc)
    };
    let (a, a_vc) = net(&shared);
    let (b, b_vc) = net(&shared);
    let (own, own_vc) = net("ring_size = 1009");
    for (i, f) in [&V4, &V6].into_iter().enumerate() {
        let (client, vip) = (at(f.client, 43000), at(f.vip, 80));
        let syn = Packet::tcp(&client, &vip, TCP_SYN)
            .seq(1000, 0)
            .tcp_options(&syn_options(9))
            .build();
        let answer = a.run("SYN on host A", &syn, a_vc, XDP_TX);
        let (cookie, tsval) = (be32(&answer, f.tcp + 4), be32(&answer, f.tcp + 20 + 8));
        let ack = Packet::tcp(&client, &vip, TCP_ACK)
            .seq(1001, cookie.wrapping_add(1))
            .tcp_options(&ts_option(10, tsval))
            .build();
        own.run("ACK on a host with its own key", &ack, own_vc, XDP_DROP);
        let out = b.run("ACK on host B", &ack, b_vc, XDP_REDIRECT);
        assert_eq!(
            out[f.tcp + 13] & (TCP_SYN | TCP_ACK),
            TCP_SYN,
            "{}: host B sends the backend a SYN",
            f.vip
        );
        let n = i as u64 + 1;
        assert_eq!(b.counter(SYN_PROXY_ACK_VALID), n, "{}", f.vip);
        assert_eq!(own.counter(DROP_SYN_PROXY_INVALID), n, "{}", f.vip);
        assert_eq!(a.counter(SYN_PROXY_SYNACK), n, "{}", f.vip);
    }
}
