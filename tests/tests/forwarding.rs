//! Real traffic through the XDP datapath in namespaces: TCP servers on 3 backends, many client
//! flows, one-arm and two-arm. The datapath runs in-process so the tests can flip health flags
//! and drain backends the way the health checker will.

use std::{
    collections::HashMap,
    net::{SocketAddr, TcpStream, UdpSocket},
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use lb_common::counter;
use lb_tests::{
    inproc::{InProcess, raise_fd_limit},
    netns::Netns,
    require_root,
    servers::{self, connect},
    topology::{Arms, Sandbox, VIP},
    traffic::{assert_shares, echo_once, echo_transfer, echo_transfer_counted},
};

const PORT: u16 = 8080;

fn vip() -> SocketAddr {
    SocketAddr::from((VIP, 80))
}

fn sandbox(arms: Arms, weights: &[u32], extra: &str) -> (Sandbox, InProcess) {
    require_root();
    let sb = Sandbox::build(arms, 3, PORT).unwrap();
    let mut config = sb.config(80, weights, extra);
    config = config.replace("[lb]\n", "[lb]\nconntrack = { size = 65536 }\n");
    let lb = InProcess::start(&sb, &config).unwrap();
    (sb, lb)
}

fn spread(client: &Netns, n: usize) -> HashMap<String, usize> {
    servers::spread(client, vip(), n)
}

fn check_two_or_one_arm(arms: Arms, flows: usize, transfers: usize) {
    let (sb, lb) = sandbox(arms, &[], "");
    let seen = spread(&sb.client.ns, flows);
    let third = 1.0 / 3.0;
    assert_shares(
        &seen,
        flows,
        &[
            ("backend-0", third),
            ("backend-1", third),
            ("backend-2", third),
        ],
    );

    let streams: Vec<_> = (0..transfers)
        .map(|i| {
            let (conn, _) = connect(&sb.client.ns, vip()).unwrap();
            std::thread::spawn(move || echo_transfer(conn, 20 << 20, i as u8))
        })
        .collect();
    for s in streams {
        s.join().unwrap();
    }

    let udp = lb_tests::traffic::udp_echo(&sb.client.ns, vip(), 60);
    assert_eq!(udp.values().sum::<usize>(), 60);
    assert!(udp.len() >= 2, "UDP flows spread over backends: {udp:?}");

    let stats = lb.stats();
    let fwd = if arms == Arms::One {
        counter::FWD_TX
    } else {
        counter::FWD_REDIRECT
    };
    assert!(stats.counter(fwd) > 0, "{stats:?}");
    assert!(stats.counter(counter::REPLY) > 0);
    assert_eq!(stats.counter(counter::DROP_NO_SNAT_PORT), 0);
    assert_eq!(stats.counter(counter::DROP_NO_ROUTE), 0);
    let tcp_new: u64 = stats.backends[..3].iter().map(|b| b.new_flows).sum();
    assert!(tcp_new >= (flows + transfers) as u64, "{stats:?}");
}

#[test]
fn two_arm_spreads_flows_and_keeps_20mb_streams_intact() {
    check_two_or_one_arm(Arms::Two, 3000, 3);
}

#[test]
fn one_arm_spreads_flows_and_keeps_20mb_streams_intact() {
    check_two_or_one_arm(Arms::One, 1500, 2);
}

#[test]
fn weights_1_2_3_shape_the_spread() {
    let (sb, _lb) = sandbox(Arms::Two, &[1, 2, 3], "");
    let seen = spread(&sb.client.ns, 3000);
    assert_shares(
        &seen,
        3000,
        &[
            ("backend-0", 1.0 / 6.0),
            ("backend-1", 2.0 / 6.0),
            ("backend-2", 3.0 / 6.0),
        ],
    );
}

#[test]
fn a_cleared_flag_stops_new_flows_at_once_and_recovery_brings_them_back() {
    let (sb, mut lb) = sandbox(Arms::Two, &[], "");
    lb.set_up(0, 1, false);
    let seen = spread(&sb.client.ns, 300);
    assert!(
        !seen.contains_key("backend-1"),
        "a flow reached the unavailable backend: {seen:?}"
    );
    assert_eq!(seen.values().sum::<usize>(), 300);
    lb.set_up(0, 1, true);
    let seen = spread(&sb.client.ns, 300);
    assert!(seen.get("backend-1").copied().unwrap_or(0) > 50, "{seen:?}");
}

#[test]
fn flags_take_effect_before_the_ring_is_rewritten() {
    // The datapath re-checks a slot's backend flag for new flows, so a flag write alone (the
    // first thing a verdict writes) keeps new flows away.
    let (sb, mut lb) = sandbox(Arms::Two, &[], "");
    let id = lb.balancer.backend_id(0, 2).unwrap();
    let ring_before = lb.balancer.ring(0).to_vec();
    let info = lb_common::BackendInfo {
        flags: 0,
        ..read_backend(&lb, id)
    };
    lb::balancer::MapWriter::set_backend(&mut lb.dp, id, lb::entries::AnyBackend::V4(info))
        .unwrap();
    assert_eq!(lb.balancer.ring(0), &ring_before[..], "ring untouched");
    let seen = spread(&sb.client.ns, 300);
    assert!(!seen.contains_key("backend-2"), "{seen:?}");
}

fn read_backend(lb: &InProcess, id: u32) -> lb_common::BackendInfo {
    // Same values the balancer wrote; rebuilt from the config to avoid reading the map back.
    let b = &lb.config.services[0].backends[id as usize];
    let std::net::IpAddr::V4(ip) = b.address.ip() else {
        panic!("an IPv4 backend")
    };
    lb_common::BackendInfo {
        addr: u32::from_ne_bytes(ip.octets()),
        snat_addr: u32::from_ne_bytes([10, 0, 2, 1]),
        port: b.address.port().to_be(),
        no_data_ticks: 0,
        flags: lb_common::backend_flags::UP,
    }
}

fn connect_to(client: &Netns, name: &str) -> TcpStream {
    lb_tests::traffic::connect_to(client, vip(), name)
}

#[test]
fn a_drained_backend_keeps_its_connections_and_gets_no_new_ones() {
    let (sb, mut lb) = sandbox(Arms::Two, &[], "");
    let mut conn = connect_to(&sb.client.ns, "backend-0");
    echo_once(&mut conn, b"before");
    lb.set_drained(0, 0, true);
    let seen = spread(&sb.client.ns, 300);
    assert!(!seen.contains_key("backend-0"), "{seen:?}");
    echo_once(&mut conn, &[7u8; 1 << 20]);
}

#[test]
fn a_long_stream_survives_ring_changes() {
    let (sb, mut lb) = sandbox(Arms::Two, &[], "");
    let conn = connect_to(&sb.client.ns, "backend-1");
    const LEN: usize = 60 << 20;
    let received = Arc::new(AtomicUsize::new(0));
    let stream = {
        let received = received.clone();
        std::thread::spawn(move || echo_transfer_counted(conn, LEN, 9, &received))
    };
    // While it runs: another backend leaves and returns, a third is drained (its slots move),
    // and the stream's own backend is drained too, so its ring slot now points elsewhere. Each
    // change waits for another MiB of the stream, and must find it still running.
    for (i, (b, step)) in [(0, "down"), (0, "up"), (2, "drain"), (1, "drain")]
        .into_iter()
        .enumerate()
    {
        let deadline = Instant::now() + Duration::from_secs(30);
        while received.load(Ordering::Relaxed) < (i + 1) << 20 {
            assert!(
                !stream.is_finished() && Instant::now() < deadline,
                "the stream stalled"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        match step {
            "down" => lb.set_up(0, b, false),
            "up" => lb.set_up(0, b, true),
            _ => lb.set_drained(0, b, true),
        }
        let at = received.load(Ordering::Relaxed);
        assert!(
            at < LEN,
            "the stream was over before the ring change {step} of backend {b}"
        );
        eprintln!("ring change {step} of backend {b} at {at} of {LEN} bytes");
    }
    stream.join().unwrap();
    assert_eq!(lb.stats().counter(counter::CT_RESCHEDULED), 0);
}

#[test]
fn flows_of_an_unavailable_backend_are_rescheduled_or_kept_by_policy() {
    for (policy, moved) in [("reschedule", true), ("keep", false)] {
        let (sb, mut lb) = sandbox(Arms::Two, &[], &format!("existing_flows = \"{policy}\""));
        let socket = sb.client.ns.enter(|| UdpSocket::bind("0.0.0.0:0")).unwrap();
        socket.connect(SocketAddr::from((VIP, 80))).unwrap();
        socket
            .set_read_timeout(Some(Duration::from_secs(2)))
            .unwrap();
        let ask = |socket: &UdpSocket| {
            let mut buf = [0u8; 256];
            socket.send(b"who").unwrap();
            let n = socket.recv(&mut buf).unwrap();
            let reply = String::from_utf8_lossy(&buf[..n]).into_owned();
            reply.split(':').next().unwrap().to_owned()
        };
        let first = ask(&socket);
        let idx: usize = first.trim_start_matches("backend-").parse().unwrap();
        lb.set_up(1, idx, false); // service 1 is the UDP service
        let after = ask(&socket);
        assert_eq!(after != first, moved, "{policy}: {first} -> {after}");
    }
}

#[test]
fn five_thousand_concurrent_connections_share_no_snat_port() {
    // Client and server ends both live in this process: two descriptors per connection.
    let limit = raise_fd_limit(32768).unwrap();
    assert!(
        limit >= 11000,
        "open-file limit {limit} is too low for 5000 connections"
    );
    let (sb, lb) = sandbox(Arms::Two, &[], "");
    let n = 5000usize;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let ok = sb.client.ns.enter(|| {
        rt.block_on(async {
            use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _, AsyncWriteExt as _};
            // Open all first (each greeted), then exchange a unique token on each: a SNAT port
            // shared by two flows would cross or reset them.
            let mut conns = Vec::with_capacity(n);
            for i in 0..n {
                let socket = tokio::net::TcpSocket::new_v4().unwrap();
                let stream = tokio::time::timeout(Duration::from_secs(10), socket.connect(vip()))
                    .await
                    .unwrap_or_else(|_| panic!("connect {i} timed out"))
                    .unwrap_or_else(|e| panic!("connect {i}: {e}"));
                let mut reader = tokio::io::BufReader::new(stream);
                let mut greeting = String::new();
                reader.read_line(&mut greeting).await.unwrap();
                assert!(greeting.starts_with("backend-"), "{greeting:?}");
                conns.push(reader);
            }
            let mut ok = 0;
            for (i, conn) in conns.iter_mut().enumerate() {
                let token = (i as u64).to_be_bytes();
                conn.get_mut().write_all(&token).await.unwrap();
                let mut back = [0u8; 8];
                conn.read_exact(&mut back).await.unwrap();
                assert_eq!(back, token, "connection {i} got another flow's data");
                ok += 1;
            }
            ok
        })
    });
    assert_eq!(ok, n);
    let stats = lb.stats();
    assert_eq!(stats.counter(counter::DROP_NO_SNAT_PORT), 0);
    assert!(stats.counter(counter::CT_NEW) >= n as u64);
}

#[test]
fn traffic_to_and_through_the_balancer_host_is_unaffected() {
    let (sb, lb) = sandbox(Arms::Two, &[], "");
    let before = lb.stats();
    let ping = sb
        .client
        .ns
        .exec(&["ping", "-c", "3", "-i", "0.2", "-W", "2", "10.0.1.1"])
        .unwrap();
    assert!(ping.status.success(), "{ping:?}");
    // Through the host: the client reaches a backend's own address, routed (not balanced) by it.
    let (mut conn, name) =
        connect(&sb.client.ns, SocketAddr::from((sb.backends[2].addr, PORT))).unwrap();
    assert_eq!(name, "backend-2");
    echo_once(&mut conn, &[1u8; 256 << 10]);
    let ping = sb
        .client
        .ns
        .exec(&["ping", "-c", "2", "-i", "0.2", "-W", "2", "10.0.2.10"])
        .unwrap();
    assert!(ping.status.success(), "{ping:?}");
    let after = lb.stats();
    assert!(after.counter(counter::PASS_NOT_VIP) - before.counter(counter::PASS_NOT_VIP) >= 10);
    assert_eq!(
        after.counter(counter::CT_NEW),
        before.counter(counter::CT_NEW),
        "nothing balanced"
    );
}
