//! The ICMP and UDP probes (`lb::health::probe::{icmp, udp}`) against real kernels: a prober and
//! backend namespaces joined by veth pairs. The prober's sockets are created inside its
//! namespace, so everything it sends and sees stays between the namespaces.
//!
//! Linux rate-limits the ICMP errors a host sends (a burst of about 6 per peer, then about one a
//! second), and a UDP probe of a closed port relies on them. Each test builds fresh namespaces
//! (so a fresh peer entry in the backend's kernel) and sends a closed port at most 3 datagrams,
//! well inside the burst.

use std::{
    future::Future,
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use lb::config::Expect;
use lb::health::{
    outcome::Reason,
    probe::{icmp::IcmpProber, udp},
    window::ProbeResult,
};
use lb_tests::{
    netns::{Netns, add_address, veth},
    require_root,
};

const BACKEND_IP: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 0, 9, 2));
/// On the prober's link, but no host has it.
const ABSENT_IP: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 0, 9, 3));
const TIMEOUT: Duration = Duration::from_secs(2);
/// How late a timed-out probe may return.
const SLACK: Duration = Duration::from_millis(250);
const ECHO_PORT: u16 = 7001;
const CLOSED_PORT: u16 = 7009;

struct Pair {
    prober: Netns,
    backend: Netns,
}

fn pair() -> Pair {
    require_root();
    let prober = Netns::new("icmpp").unwrap();
    let backend = Netns::new("icmpb").unwrap();
    veth(&prober, "10.0.9.1/24", &backend, "10.0.9.2/24").unwrap();
    Pair { prober, backend }
}

fn backend(port: u16) -> SocketAddr {
    SocketAddr::new(BACKEND_IP, port)
}

/// Runs `f` with a prober created inside `ns`, on a runtime whose thread lives there too (the UDP
/// probe's sockets are created on the calling thread).
fn with_prober<F, Fut>(ns: &Netns, f: F)
where
    F: FnOnce(Arc<IcmpProber>) -> Fut + Send,
    Fut: Future<Output = ()>,
{
    ns.block_on(|| async {
        let prober = IcmpProber::new().expect("raw socket (root)");
        f(Arc::new(prober)).await;
    });
}

fn nft(ns: &Netns, args: &[&str]) {
    ns.nft(args).unwrap();
}

fn nft_input(ns: &Netns, policy: &str) {
    ns.input_chain(policy).unwrap();
}

fn drop_all_input(ns: &Netns) {
    ns.drop_all_input().unwrap();
}

/// A UDP server in the backend namespace answering "PONG" to "PING" and ignoring anything else;
/// stopped when dropped.
struct EchoServer {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl EchoServer {
    fn start(ns: &Netns, port: u16) -> Self {
        Self::start_at(ns, backend(port))
    }

    fn start_at(ns: &Netns, addr: SocketAddr) -> Self {
        let socket = ns.enter(|| UdpSocket::bind(addr)).unwrap();
        socket
            .set_read_timeout(Some(Duration::from_millis(50)))
            .unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let thread = std::thread::spawn({
            let stop = Arc::clone(&stop);
            move || {
                let mut buf = [0u8; 1500];
                while !stop.load(Ordering::Relaxed) {
                    if let Ok((n, from)) = socket.recv_from(&mut buf)
                        && &buf[..n] == b"PING"
                    {
                        let _ = socket.send_to(b"PONG", from);
                    }
                }
            }
        });
        Self {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for EchoServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn assert_success(result: ProbeResult, timeout: Duration) {
    match result {
        ProbeResult::Success { latency } => {
            assert!(latency > Duration::ZERO && latency < timeout, "{latency:?}");
        }
        other => panic!("want success, got {other:?}"),
    }
}

/// Runs `probe`, checks it timed out about when it should.
async fn assert_times_out(timeout: Duration, probe: impl Future<Output = ProbeResult>) {
    let start = Instant::now();
    assert_eq!(probe.await, ProbeResult::Timeout);
    let took = start.elapsed();
    assert!(took >= timeout && took < timeout + SLACK, "{took:?}");
}

#[test]
fn icmp_live_host_is_success() {
    let p = pair();
    with_prober(&p.prober, |prober| async move {
        for _ in 0..3 {
            let start = Instant::now();
            assert_success(prober.probe(BACKEND_IP, TIMEOUT).await, TIMEOUT);
            assert!(start.elapsed() < TIMEOUT / 2, "the reply came back at once");
        }
    });
}

#[test]
fn icmp_dropping_host_is_timeout() {
    let p = pair();
    drop_all_input(&p.backend);
    with_prober(&p.prober, |prober| async move {
        let timeout = Duration::from_millis(300);
        assert_times_out(timeout, prober.probe(BACKEND_IP, timeout)).await;
    });
}

#[test]
fn icmp_absent_host_is_timeout() {
    let p = pair();
    with_prober(&p.prober, |prober| async move {
        // ARP gives up after about 3 s: within a shorter timeout the probe just times out.
        let timeout = Duration::from_millis(500);
        assert_times_out(timeout, prober.probe(ABSENT_IP, timeout)).await;
        // The live host is still answered, after and during a probe of the absent one.
        let (absent, live) = tokio::join!(
            prober.probe(ABSENT_IP, timeout),
            prober.probe(BACKEND_IP, timeout)
        );
        assert_eq!(absent, ProbeResult::Timeout);
        assert_success(live, timeout);
    });
}

#[test]
fn icmp_absent_host_is_unreachable_once_arp_fails() {
    let p = pair();
    with_prober(&p.prober, |prober| async move {
        // Past ARP's give-up time the local kernel reports a host unreachable quoting the echo.
        let start = Instant::now();
        assert_eq!(
            prober.probe(ABSENT_IP, Duration::from_secs(6)).await,
            ProbeResult::TcpFailure(Reason::Unreachable(1))
        );
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "{:?}",
            start.elapsed()
        );
    });
}

#[test]
fn icmp_rejected_is_tcp_failure() {
    let p = pair();
    // A firewall answering echo requests with a host unreachable.
    nft_input(&p.backend, "accept");
    nft(
        &p.backend,
        &[
            "add",
            "rule",
            "inet",
            "lbt",
            "in",
            "icmp",
            "type",
            "echo-request",
            "reject",
            "with",
            "icmp",
            "type",
            "host-unreachable",
        ],
    );
    with_prober(&p.prober, |prober| async move {
        for _ in 0..2 {
            let start = Instant::now();
            assert_eq!(
                prober.probe(BACKEND_IP, TIMEOUT).await,
                ProbeResult::TcpFailure(Reason::Unreachable(1))
            );
            assert!(start.elapsed() < TIMEOUT / 2, "the error came back at once");
        }
    });
}

#[test]
fn udp_without_payload_listening_port_is_success() {
    let p = pair();
    let _server = EchoServer::start(&p.backend, ECHO_PORT);
    with_prober(&p.prober, |prober| async move {
        // The neighbour resolved first: the short windows below time the probe, not a lost
        // first solicitation on a busy machine.
        assert_success(prober.probe(BACKEND_IP, TIMEOUT).await, TIMEOUT);
        let timeout = Duration::from_millis(500);
        for _ in 0..2 {
            let start = Instant::now();
            let result = udp::probe(&prober, backend(ECHO_PORT), None, None, timeout).await;
            assert_success(result, timeout);
            // Only the absence of a refusal says the port is open: the probe waits it out.
            let took = start.elapsed();
            assert!(took >= timeout && took < timeout + SLACK, "{took:?}");
        }
    });
}

#[test]
fn udp_without_payload_closed_port_is_tcp_failure() {
    let p = pair();
    with_prober(&p.prober, |prober| async move {
        for _ in 0..3 {
            assert_eq!(
                udp::probe(&prober, backend(CLOSED_PORT), None, None, TIMEOUT).await,
                ProbeResult::TcpFailure(Reason::Unreachable(3))
            );
        }
    });
}

#[test]
fn udp_with_payload() {
    let p = pair();
    let _server = EchoServer::start(&p.backend, ECHO_PORT);
    with_prober(&p.prober, |prober| async move {
        let to = backend(ECHO_PORT);
        let probe = |send: Option<&'static [u8]>, expect: Option<&'static [u8]>| {
            let expect = expect.map(Expect::prefix);
            let prober = &prober;
            async move { udp::probe(prober, to, send, expect.as_ref(), TIMEOUT).await }
        };
        let start = Instant::now();
        assert_success(
            probe(Some(b"PING".as_slice()), Some(b"PONG".as_slice())).await,
            TIMEOUT,
        );
        assert!(start.elapsed() < TIMEOUT / 2, "the reply ends the probe");
        assert_success(
            probe(Some(b"PING".as_slice()), Some(b"PO".as_slice())).await,
            TIMEOUT,
        );
        assert_success(probe(Some(b"PING".as_slice()), None).await, TIMEOUT);
        assert_eq!(
            probe(Some(b"PING".as_slice()), Some(b"NOPE".as_slice())).await,
            ProbeResult::PayloadFailure(Reason::Mismatch)
        );
        assert_eq!(
            probe(Some(b"PING".as_slice()), Some(b"PONG and more".as_slice())).await,
            ProbeResult::PayloadFailure(Reason::Mismatch)
        );
        // The server ignores anything but PING: silence.
        let timeout = Duration::from_millis(300);
        assert_times_out(
            timeout,
            udp::probe(
                &prober,
                to,
                Some(b"HELLO"),
                Some(&Expect::prefix(b"PONG")),
                timeout,
            ),
        )
        .await;
        assert_eq!(
            udp::probe(
                &prober,
                backend(CLOSED_PORT),
                Some(b"PING"),
                Some(&Expect::prefix(b"PONG")),
                TIMEOUT
            )
            .await,
            ProbeResult::TcpFailure(Reason::Unreachable(3))
        );
    });
}

#[test]
fn udp_silent_host_is_failure() {
    let p = pair();
    let _server = EchoServer::start(&p.backend, ECHO_PORT);
    drop_all_input(&p.backend);
    with_prober(&p.prober, |prober| async move {
        let timeout = Duration::from_millis(300);
        // No echo reply: a failure, although nothing refused the datagram.
        assert_times_out(
            timeout,
            udp::probe(&prober, backend(ECHO_PORT), None, None, timeout),
        )
        .await;
        assert_times_out(
            timeout,
            udp::probe(&prober, backend(ECHO_PORT), Some(b"PING"), None, timeout),
        )
        .await;
    });
}

#[test]
fn concurrent_icmp_probes_get_their_own_answers() {
    require_root();
    // Two live hosts on two links, and a third address that drops ICMP on the second host.
    let prober = Netns::new("icmpp").unwrap();
    let first = Netns::new("icmpb").unwrap();
    let second = Netns::new("icmpb").unwrap();
    veth(&prober, "10.0.9.1/24", &first, "10.0.9.2/24").unwrap();
    let (_, b) = veth(&prober, "10.0.10.1/24", &second, "10.0.10.2/24").unwrap();
    second
        .ip(&["addr", "add", "10.0.10.3/24", "dev", &b.ifname])
        .unwrap();
    nft_input(&second, "accept");
    nft(
        &second,
        &[
            "add",
            "rule",
            "inet",
            "lbt",
            "in",
            "ip",
            "daddr",
            "10.0.10.3",
            "drop",
        ],
    );
    let hosts = [Ipv4Addr::new(10, 0, 9, 2), Ipv4Addr::new(10, 0, 10, 2)].map(IpAddr::V4);
    let silent = IpAddr::V4(Ipv4Addr::new(10, 0, 10, 3));
    with_prober(&prober, move |prober| async move {
        let timeout = Duration::from_secs(1);
        let mut probes = tokio::task::JoinSet::new();
        for i in 0..60 {
            let target = if i % 6 == 5 { silent } else { hosts[i % 2] };
            let prober = Arc::clone(&prober);
            probes.spawn(async move { (target, prober.probe(target, timeout).await) });
        }
        let (mut ok, mut timed_out) = (0, 0);
        while let Some(done) = probes.join_next().await {
            let (target, result) = done.unwrap();
            match result {
                ProbeResult::Success { latency } if target != silent && latency < timeout => {
                    ok += 1;
                }
                ProbeResult::Timeout if target == silent => timed_out += 1,
                other => panic!("{target}: {other:?}"),
            }
        }
        assert_eq!((ok, timed_out), (50, 10));
        // Nothing was left behind: the prober still answers.
        assert_success(prober.probe(hosts[1], timeout).await, timeout);
    });
}

// ---- IPv6 targets -------------------------------------------------------------------------
//
// The same namespaces, dual-stack: 2001:db8:9::1 and 2001:db8:9::2 beside the IPv4 addresses
// (duplicate address detection off, so they are usable at once). Echo probes of IPv6 targets
// are ICMPv6 (128/129) through the prober's raw ICMPv6 socket; errors are ICMPv6 destination
// unreachables (type 1), rate-limited like ICMP ones: a closed port gets at most 3 datagrams
// per test here too.

const BACKEND_IP6: IpAddr = IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 9, 0, 0, 0, 0, 2));
/// On the prober's link, but no host has it.
const ABSENT_IP6: IpAddr = IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 9, 0, 0, 0, 0, 3));

/// [`pair`] with an IPv6 address on each end too.
fn dual_pair() -> Pair {
    require_root();
    let prober = Netns::new("icmpp").unwrap();
    let backend = Netns::new("icmpb").unwrap();
    let (a, b) = veth(&prober, "10.0.9.1/24", &backend, "10.0.9.2/24").unwrap();
    a.add_address("2001:db8:9::1/64").unwrap();
    b.add_address("2001:db8:9::2/64").unwrap();
    Pair { prober, backend }
}

fn backend6(port: u16) -> SocketAddr {
    SocketAddr::new(BACKEND_IP6, port)
}

#[test]
fn icmpv6_live_host_is_success() {
    let p = dual_pair();
    with_prober(&p.prober, |prober| async move {
        for _ in 0..3 {
            let start = Instant::now();
            assert_success(prober.probe(BACKEND_IP6, TIMEOUT).await, TIMEOUT);
            assert!(start.elapsed() < TIMEOUT / 2, "the reply came back at once");
        }
        // The IPv4 address of the same host, through the other socket, alike.
        assert_success(prober.probe(BACKEND_IP, TIMEOUT).await, TIMEOUT);
    });
}

#[test]
fn icmpv6_dropping_host_is_timeout() {
    let p = dual_pair();
    drop_all_input(&p.backend);
    with_prober(&p.prober, |prober| async move {
        let timeout = Duration::from_millis(300);
        assert_times_out(timeout, prober.probe(BACKEND_IP6, timeout)).await;
    });
}

#[test]
fn icmpv6_absent_host_is_timeout_then_address_unreachable() {
    let p = dual_pair();
    with_prober(&p.prober, |prober| async move {
        // Neighbour discovery gives up after about 3 s: within a shorter timeout the probe
        // just times out, and the live host is answered meanwhile.
        let timeout = Duration::from_millis(500);
        let (absent, live) = tokio::join!(
            assert_times_out(timeout, prober.probe(ABSENT_IP6, timeout)),
            prober.probe(BACKEND_IP6, timeout)
        );
        let () = absent;
        assert_success(live, timeout);
        // Past that, the local kernel reports an ICMPv6 address unreachable (code 3) quoting
        // the echo request.
        let start = Instant::now();
        assert_eq!(
            prober.probe(ABSENT_IP6, Duration::from_secs(6)).await,
            ProbeResult::TcpFailure(Reason::Unreachable6(3))
        );
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "{:?}",
            start.elapsed()
        );
    });
}

#[test]
fn icmpv6_rejected_is_tcp_failure() {
    let p = dual_pair();
    // A firewall answering echo requests with "administratively prohibited" (code 1).
    nft_input(&p.backend, "accept");
    nft(
        &p.backend,
        &[
            "add",
            "rule",
            "inet",
            "lbt",
            "in",
            "icmpv6",
            "type",
            "echo-request",
            "reject",
            "with",
            "icmpv6",
            "type",
            "admin-prohibited",
        ],
    );
    with_prober(&p.prober, |prober| async move {
        for _ in 0..2 {
            let start = Instant::now();
            let result = prober.probe(BACKEND_IP6, TIMEOUT).await;
            assert_eq!(result, ProbeResult::TcpFailure(Reason::Unreachable6(1)));
            assert_eq!(
                result.failure(TIMEOUT).unwrap(),
                "ICMPv6 communication administratively prohibited"
            );
            assert!(start.elapsed() < TIMEOUT / 2, "the error came back at once");
        }
    });
}

#[test]
fn udp6_without_payload_listening_port_is_success() {
    let p = dual_pair();
    let _server = EchoServer::start_at(&p.backend, backend6(ECHO_PORT));
    with_prober(&p.prober, |prober| async move {
        // The neighbour resolved first: the short windows below time the probe, not a lost
        // first solicitation on a busy machine.
        assert_success(prober.probe(BACKEND_IP6, TIMEOUT).await, TIMEOUT);
        let timeout = Duration::from_millis(500);
        for _ in 0..2 {
            let start = Instant::now();
            let result = udp::probe(&prober, backend6(ECHO_PORT), None, None, timeout).await;
            assert_success(result, timeout);
            let took = start.elapsed();
            assert!(took >= timeout && took < timeout + SLACK, "{took:?}");
        }
    });
}

#[test]
fn udp6_without_payload_closed_port_is_tcp_failure() {
    let p = dual_pair();
    with_prober(&p.prober, |prober| async move {
        for _ in 0..3 {
            let start = Instant::now();
            let result = udp::probe(&prober, backend6(CLOSED_PORT), None, None, TIMEOUT).await;
            // ICMPv6 port unreachable: type 1 code 4.
            assert_eq!(result, ProbeResult::TcpFailure(Reason::Unreachable6(4)));
            assert_eq!(result.failure(TIMEOUT).unwrap(), "ICMPv6 port unreachable");
            assert!(start.elapsed() < TIMEOUT / 2, "the error came back at once");
        }
    });
}

#[test]
fn udp6_with_payload() {
    let p = dual_pair();
    let _server = EchoServer::start_at(&p.backend, backend6(ECHO_PORT));
    with_prober(&p.prober, |prober| async move {
        let to = backend6(ECHO_PORT);
        let probe = |send: Option<&'static [u8]>, expect: Option<&'static [u8]>| {
            let expect = expect.map(Expect::prefix);
            let prober = &prober;
            async move { udp::probe(prober, to, send, expect.as_ref(), TIMEOUT).await }
        };
        let start = Instant::now();
        assert_success(
            probe(Some(b"PING".as_slice()), Some(b"PONG".as_slice())).await,
            TIMEOUT,
        );
        assert!(start.elapsed() < TIMEOUT / 2, "the reply ends the probe");
        assert_success(probe(Some(b"PING".as_slice()), None).await, TIMEOUT);
        assert_eq!(
            probe(Some(b"PING".as_slice()), Some(b"NOPE".as_slice())).await,
            ProbeResult::PayloadFailure(Reason::Mismatch)
        );
        // The server ignores anything but PING: silence.
        let timeout = Duration::from_millis(300);
        assert_times_out(
            timeout,
            udp::probe(
                &prober,
                to,
                Some(b"HELLO"),
                Some(&Expect::prefix(b"PONG")),
                timeout,
            ),
        )
        .await;
        assert_eq!(
            udp::probe(
                &prober,
                backend6(CLOSED_PORT),
                Some(b"PING"),
                Some(&Expect::prefix(b"PONG")),
                TIMEOUT
            )
            .await,
            ProbeResult::TcpFailure(Reason::Unreachable6(4))
        );
    });
}

#[test]
fn udp6_silent_host_is_failure() {
    let p = dual_pair();
    let _server = EchoServer::start_at(&p.backend, backend6(ECHO_PORT));
    drop_all_input(&p.backend);
    with_prober(&p.prober, |prober| async move {
        let timeout = Duration::from_millis(300);
        // No ICMPv6 echo reply: a failure, although nothing refused the datagram.
        assert_times_out(
            timeout,
            udp::probe(&prober, backend6(ECHO_PORT), None, None, timeout),
        )
        .await;
        assert_times_out(
            timeout,
            udp::probe(&prober, backend6(ECHO_PORT), Some(b"PING"), None, timeout),
        )
        .await;
    });
}

#[test]
fn concurrent_icmp_and_icmpv6_probes_get_their_own_answers() {
    require_root();
    // Two dual-stack hosts on two links; on the second, an IPv4 and an IPv6 address that drop
    // echo requests.
    let prober = Netns::new("icmpp").unwrap();
    let first = Netns::new("icmpb").unwrap();
    let second = Netns::new("icmpb").unwrap();
    let (a, b) = veth(&prober, "10.0.9.1/24", &first, "10.0.9.2/24").unwrap();
    a.add_address("2001:db8:9::1/64").unwrap();
    b.add_address("2001:db8:9::2/64").unwrap();
    let (a, b) = veth(&prober, "10.0.10.1/24", &second, "10.0.10.2/24").unwrap();
    a.add_address("2001:db8:10::1/64").unwrap();
    for cidr in ["2001:db8:10::2/64", "2001:db8:10::3/64", "10.0.10.3/24"] {
        add_address(&second, &b.ifname, cidr).unwrap();
    }
    nft_input(&second, "accept");
    for (family, silent) in [("ip", "10.0.10.3"), ("ip6", "2001:db8:10::3")] {
        nft(
            &second,
            &[
                "add", "rule", "inet", "lbt", "in", family, "daddr", silent, "drop",
            ],
        );
    }
    let hosts: [IpAddr; 4] = [
        "10.0.9.2".parse().unwrap(),
        "2001:db8:9::2".parse().unwrap(),
        "10.0.10.2".parse().unwrap(),
        "2001:db8:10::2".parse().unwrap(),
    ];
    let silent: [IpAddr; 2] = [
        "10.0.10.3".parse().unwrap(),
        "2001:db8:10::3".parse().unwrap(),
    ];
    with_prober(&prober, move |prober| async move {
        let timeout = Duration::from_secs(1);
        let mut probes = tokio::task::JoinSet::new();
        for i in 0..120 {
            let target = if i % 6 >= 4 {
                silent[i % 2]
            } else {
                hosts[i % 4]
            };
            let prober = Arc::clone(&prober);
            probes.spawn(async move { (target, prober.probe(target, timeout).await) });
        }
        let (mut ok, mut timed_out) = (0, 0);
        while let Some(done) = probes.join_next().await {
            let (target, result) = done.unwrap();
            match result {
                ProbeResult::Success { latency }
                    if !silent.contains(&target) && latency < timeout =>
                {
                    ok += 1;
                }
                ProbeResult::Timeout if silent.contains(&target) => timed_out += 1,
                other => panic!("{target}: {other:?}"),
            }
        }
        assert_eq!((ok, timed_out), (80, 40));
        for host in hosts {
            assert_success(prober.probe(host, timeout).await, timeout);
        }
    });
}
