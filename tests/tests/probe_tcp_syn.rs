//! The half-open TCP probe (`lb::health::probe::tcp_syn`) against real kernels: a prober and a
//! backend namespace joined by a veth pair. The prober's raw socket is created inside its
//! namespace, so everything it sends and sees stays between the two namespaces.
//!
//! The backend's veth end has RX checksum offload off: veth otherwise marks frames without a
//! checksum as verified, and a wrong TCP checksum in our SYN would go unnoticed.

use std::{
    future::Future,
    io::{Read as _, Write as _},
    net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, TcpListener, TcpStream},
    os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
    sync::Arc,
    time::{Duration, Instant, SystemTime},
};

use lb::health::{
    outcome::Reason,
    probe::tcp_syn::{POOL_PORTS, ROUTE_TTL, SynProber},
    window::ProbeResult,
};
use lb_tests::{
    netns::{Netns, add_address, sh, veth},
    require_root,
};

const PROBER_IP: Ipv4Addr = Ipv4Addr::new(10, 0, 9, 1);
const BACKEND_IP: Ipv4Addr = Ipv4Addr::new(10, 0, 9, 2);
const TIMEOUT: Duration = Duration::from_secs(2);

struct Pair {
    prober: Netns,
    backend: Netns,
    /// The veth ends in each namespace.
    prober_if: String,
    backend_if: String,
}

fn pair() -> Pair {
    require_root();
    let prober = Netns::new("synp").unwrap();
    let backend = Netns::new("synb").unwrap();
    let (a, b) = veth(&prober, "10.0.9.1/24", &backend, "10.0.9.2/24").unwrap();
    sh(backend
        .command("ethtool")
        .args(["-K", &b.ifname, "rx", "off"]))
    .unwrap();
    Pair {
        prober,
        backend,
        prober_if: a.ifname,
        backend_if: b.ifname,
    }
}

fn backend(port: u16) -> SocketAddr {
    SocketAddr::from((BACKEND_IP, port))
}

/// A listener in the backend namespace; the kernel answers SYNs without anyone accepting.
fn listen(ns: &Netns, port: u16) -> TcpListener {
    ns.enter(|| TcpListener::bind(backend(port))).unwrap()
}

/// Runs `f` with a prober created inside `ns`, on a runtime whose thread lives there too (the
/// probe's own sockets are created on the calling thread).
fn with_prober<F, Fut>(ns: &Netns, f: F)
where
    F: FnOnce(Arc<SynProber>) -> Fut + Send,
    Fut: Future<Output = ()>,
{
    ns.block_on(|| async {
        let prober = SynProber::new().expect("raw socket (root)");
        f(Arc::new(prober)).await;
    });
}

fn nft(ns: &Netns, args: &[&str]) {
    ns.nft(args).unwrap();
}

/// Creates table `inet lbt` with an accepting output chain `out` in `ns`, for rules that
/// watch or drop what the prober's host sends.
fn output_chain(ns: &Netns) {
    nft(ns, &["add", "table", "inet", "lbt"]);
    let chain = "{ type filter hook output priority 0; policy accept; }";
    nft(ns, &["add", "chain", "inet", "lbt", "out", chain]);
}

/// Half-open (SYN-RECV) connections the backend holds on `port`.
/// Waits (up to 5 s: the RSTs are processed asynchronously) until no half-open connection to
/// `port` is left; how many are left then.
async fn syn_recv_drained(backend: &Netns, port: u16) -> usize {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let left = syn_recv(backend, port);
        if left == 0 || Instant::now() >= deadline {
            return left;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn syn_recv(backend: &Netns, port: u16) -> usize {
    let out = sh(backend.command("ss").args(["-Htan", "state", "syn-recv"])).unwrap();
    let local = format!("{BACKEND_IP}:{port}");
    out.lines()
        .filter(|l| l.split_whitespace().any(|field| field == local))
        .count()
}

#[test]
fn listening_port_is_success() {
    let p = pair();
    let _server = listen(&p.backend, 7001);
    with_prober(&p.prober, |prober| async move {
        for _ in 0..3 {
            match prober.probe(backend(7001), TIMEOUT).await {
                ProbeResult::Success { latency } => {
                    assert!(latency > Duration::ZERO && latency < TIMEOUT, "{latency:?}");
                }
                other => panic!("want success, got {other:?}"),
            }
        }
    });
}

#[test]
fn closed_port_is_tcp_failure() {
    let p = pair();
    with_prober(&p.prober, |prober| async move {
        let start = Instant::now();
        assert_eq!(
            prober.probe(backend(7009), TIMEOUT).await,
            ProbeResult::TcpFailure(Reason::Refused)
        );
        assert!(start.elapsed() < TIMEOUT / 2, "the RST came back at once");
    });
}

#[test]
fn silent_host_is_timeout() {
    let p = pair();
    let _server = listen(&p.backend, 7001);
    p.backend.drop_all_input().unwrap();
    with_prober(&p.prober, |prober| async move {
        let timeout = Duration::from_millis(300);
        let start = Instant::now();
        assert_eq!(
            prober.probe(backend(7001), timeout).await,
            ProbeResult::Timeout
        );
        let took = start.elapsed();
        assert!(
            took >= timeout && took < timeout + Duration::from_millis(250),
            "{took:?}"
        );
    });
}

#[test]
fn backend_keeps_no_half_open_connection() {
    let p = pair();
    let _server = listen(&p.backend, 7001);
    let (prober_ns, backend_ns) = (p.prober.clone(), p.backend.clone());
    with_prober(&p.prober, move |prober| async move {
        for _ in 0..5 {
            assert!(matches!(
                prober.probe(backend(7001), TIMEOUT).await,
                ProbeResult::Success { .. }
            ));
        }
        assert_eq!(
            syn_recv_drained(&backend_ns, 7001).await,
            0,
            "the local kernel's RST ends each half-open connection"
        );

        // Control: the check above does see half-open connections. With the prober's RSTs
        // dropped, the backend keeps one per probe.
        output_chain(&prober_ns);
        nft(
            &prober_ns,
            &[
                "add", "rule", "inet", "lbt", "out", "tcp", "flags", "&", "rst", "==", "rst",
                "drop",
            ],
        );
        assert!(matches!(
            prober.probe(backend(7001), TIMEOUT).await,
            ProbeResult::Success { .. }
        ));
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(syn_recv(&backend_ns, 7001), 1, "control: RST dropped");
    });
}

#[test]
fn concurrent_probes_get_their_own_answers() {
    let p = pair();
    let open = [7001, 7002, 7003, 7004];
    let _servers: Vec<_> = open.iter().map(|&port| listen(&p.backend, port)).collect();
    let closed = 7009;
    with_prober(&p.prober, move |prober| async move {
        let mut probes = tokio::task::JoinSet::new();
        for i in 0..200 {
            let port = if i % 5 == 4 { closed } else { open[i % 5] };
            let prober = Arc::clone(&prober);
            probes.spawn(async move { (port, prober.probe(backend(port), TIMEOUT).await) });
        }
        let (mut ok, mut refused) = (0, 0);
        while let Some(done) = probes.join_next().await {
            let (port, result) = done.unwrap();
            match result {
                ProbeResult::Success { .. } if port != closed => ok += 1,
                ProbeResult::TcpFailure(Reason::Refused) if port == closed => refused += 1,
                other => panic!("port {port}: {other:?}"),
            }
        }
        assert_eq!((ok, refused), (160, 40));
    });
}

#[test]
fn icmp_reject_times_out_and_leaves_the_prober_working() {
    let p = pair();
    let _servers = [listen(&p.backend, 7001), listen(&p.backend, 7002)];
    // A firewall that rejects with an ICMP error instead of a RST. An unconnected raw socket
    // without IP_RECVERR is not told about it: the probe times out, and the probes around it
    // are undisturbed.
    p.backend.input_chain("accept").unwrap();
    nft(
        &p.backend,
        &[
            "add",
            "rule",
            "inet",
            "lbt",
            "in",
            "tcp",
            "dport",
            "7001",
            "reject",
            "with",
            "icmpx",
            "type",
            "port-unreachable",
        ],
    );
    with_prober(&p.prober, |prober| async move {
        let timeout = Duration::from_millis(300);
        for _ in 0..3 {
            assert_eq!(
                prober.probe(backend(7001), timeout).await,
                ProbeResult::Timeout
            );
            assert!(matches!(
                prober.probe(backend(7002), timeout).await,
                ProbeResult::Success { .. }
            ));
        }
    });
}

fn is_success(result: ProbeResult) -> bool {
    matches!(result, ProbeResult::Success { .. })
}

/// Source ports of the SYNs an unfiltered raw socket has queued (in arrival order), and how many
/// segments it held in all.
fn syn_source_ports(fd: &OwnedFd, to_port: u16) -> Vec<u16> {
    let mut buf = [0u8; 128];
    let mut ports = Vec::new();
    loop {
        // SAFETY: valid fd and buffer.
        let n = unsafe {
            libc::recv(
                fd.as_raw_fd(),
                buf.as_mut_ptr().cast(),
                buf.len(),
                libc::MSG_DONTWAIT,
            )
        };
        if n < 0 {
            break ports;
        }
        let ihl = usize::from(buf[0] & 0x0f) * 4;
        let tcp = &buf[ihl..];
        let (src, dst, flags) = (
            u16::from_be_bytes([tcp[0], tcp[1]]),
            u16::from_be_bytes([tcp[2], tcp[3]]),
            tcp[13],
        );
        if dst == to_port && flags == 0x02 {
            ports.push(src);
        }
    }
}

#[test]
fn a_target_walks_the_port_pool() {
    let p = pair();
    let _server = listen(&p.backend, 7001);
    // Sees every SYN that reaches the backend.
    let capture = p.backend.enter(unfiltered_raw_socket);
    let (backend_ns, rounds) = (p.backend.clone(), POOL_PORTS + 16);
    with_prober(&p.prober, move |prober| async move {
        for _ in 0..rounds {
            assert!(is_success(prober.probe(backend(7001), TIMEOUT).await));
        }
        assert_eq!(
            syn_recv_drained(&backend_ns, 7001).await,
            0,
            "every half-open connection was reset"
        );
        let ports = syn_source_ports(&capture, 7001);
        assert_eq!(ports.len(), rounds);
        let distinct: std::collections::HashSet<u16> = ports.iter().copied().collect();
        assert_eq!(
            distinct.len(),
            POOL_PORTS,
            "the whole pool, and only the pool: {ports:?}"
        );
        assert!(
            ports.windows(POOL_PORTS).all(|w| w
                .iter()
                .copied()
                .collect::<std::collections::HashSet<_>>()
                .len()
                == POOL_PORTS),
            "a port comes back only after all the others: {ports:?}"
        );
    });
}

#[test]
fn more_probes_at_once_than_pooled_ports() {
    let p = pair();
    let _server = listen(&p.backend, 7001);
    with_prober(&p.prober, |prober| async move {
        let mut probes = tokio::task::JoinSet::new();
        for _ in 0..3 * POOL_PORTS {
            let prober = Arc::clone(&prober);
            probes.spawn(async move { prober.probe(backend(7001), TIMEOUT).await });
        }
        let mut ok = 0;
        while let Some(done) = probes.join_next().await {
            let result = done.unwrap();
            assert!(is_success(result), "{result:?}");
            ok += 1;
        }
        assert_eq!(ok, 3 * POOL_PORTS);
    });
}

#[test]
fn each_target_gets_the_source_address_of_its_route() {
    // A second backend behind another interface of the prober, in another subnet. A SYN whose
    // checksum covers the wrong source address would be dropped by the backend (RX checksum
    // offload is off), and its answer would not come back to the right address.
    let p = pair();
    let other = Netns::new("synb2").unwrap();
    let (_, b) = veth(&p.prober, "10.0.10.1/24", &other, "10.0.10.2/24").unwrap();
    sh(other
        .command("ethtool")
        .args(["-K", &b.ifname, "rx", "off"]))
    .unwrap();
    let _servers = [
        listen(&p.backend, 7001),
        other.enter(|| TcpListener::bind("10.0.10.2:7001")).unwrap(),
    ];
    let second = SocketAddr::from((Ipv4Addr::new(10, 0, 10, 2), 7001));
    with_prober(&p.prober, move |prober| async move {
        for _ in 0..5 {
            for target in [backend(7001), second] {
                let result = prober.probe(target, TIMEOUT).await;
                assert!(is_success(result), "{target}: {result:?}");
            }
        }
    });
}

#[test]
fn a_removed_source_address_is_looked_up_again() {
    let p = pair();
    let _server = listen(&p.backend, 7001);
    let ifname = p
        .prober
        .ip(&["-o", "link", "show", "type", "veth"])
        .unwrap();
    let ifname = ifname
        .split(':')
        .nth(1)
        .and_then(|n| n.trim().split('@').next())
        .unwrap()
        .to_owned();
    let prober_ns = p.prober.clone();
    with_prober(&p.prober, move |prober| async move {
        assert!(is_success(prober.probe(backend(7001), TIMEOUT).await));
        // Within ROUTE_TTL the prober would still send from 10.0.9.1; the kernel refuses a
        // source that is no longer local, and the probe looks the route up again.
        prober_ns
            .sysctl("net/ipv4/conf/all/promote_secondaries", "1")
            .unwrap();
        prober_ns
            .ip(&["addr", "add", "10.0.9.3/24", "dev", &ifname])
            .unwrap();
        prober_ns
            .ip(&["addr", "del", "10.0.9.1/24", "dev", &ifname])
            .unwrap();
        let start = Instant::now();
        let result = prober.probe(backend(7001), TIMEOUT).await;
        assert!(is_success(result), "{result:?}");
        assert!(start.elapsed() < ROUTE_TTL);
    });
}

#[test]
fn dropped_probes_leave_the_prober_working() {
    let p = pair();
    let _server = listen(&p.backend, 7001);
    with_prober(&p.prober, |prober| async move {
        // Futures dropped before, while and after their SYN goes out.
        for wait in [0, 1, 50, 200, 1000] {
            let probe = prober.probe(backend(7002), TIMEOUT);
            let _ = tokio::time::timeout(Duration::from_micros(wait), probe).await;
        }
        for _ in 0..3 {
            assert!(is_success(prober.probe(backend(7001), TIMEOUT).await));
        }
    });
}

/// A raw TCP socket without a filter, with a large receive buffer: counts the TCP segments the
/// prober's socket would have seen without its filter.
fn unfiltered_raw_socket() -> OwnedFd {
    unfiltered_raw_socket_of(libc::AF_INET)
}

/// [`unfiltered_raw_socket`] of `family` (AF_INET or AF_INET6).
fn unfiltered_raw_socket_of(family: libc::c_int) -> OwnedFd {
    // SAFETY: plain socket(2) call.
    let fd = unsafe {
        libc::socket(
            family,
            libc::SOCK_RAW | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            libc::IPPROTO_TCP,
        )
    };
    assert!(fd >= 0, "{}", std::io::Error::last_os_error());
    // SAFETY: fresh descriptor.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    set_socket_option(&fd, libc::SO_RCVBUFFORCE, 64 << 20);
    fd
}

/// Sets the `SOL_SOCKET` option `name` of `fd` to `value`.
fn set_socket_option(fd: &OwnedFd, name: libc::c_int, value: libc::c_int) {
    // SAFETY: valid fd and option value.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            name,
            (&raw const value).cast(),
            size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    assert_eq!(rc, 0, "{}", std::io::Error::last_os_error());
}

fn drain_count(fd: &OwnedFd) -> usize {
    let mut buf = [0u8; 64];
    let mut n = 0;
    // SAFETY: valid fd and buffer.
    while unsafe { libc::recv(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) } >= 0 {
        n += 1;
    }
    n
}

#[test]
fn filter_keeps_bulk_traffic_away_from_the_reader() {
    let p = pair();
    let _server = listen(&p.backend, 7001);
    // Bulk data flows from the backend namespace into the prober's: a sink listens there and a
    // client in the backend sends to it. Connected before counting starts; after the handshake
    // the prober's namespace receives only ACK / PSH+ACK / FIN+ACK segments from it.
    let sink = SocketAddrV4::new(PROBER_IP, 7100);
    let sink_listener = p.prober.enter(|| TcpListener::bind(sink)).unwrap();
    let control = p.prober.enter(unfiltered_raw_socket);
    let mut client = p.backend.enter(|| TcpStream::connect(sink)).unwrap();
    const BYTES: usize = 32 << 20;

    with_prober(&p.prober, move |prober| async move {
        tokio::time::sleep(Duration::from_millis(20)).await;
        let before = prober.wakeups();
        let writer = std::thread::spawn(move || {
            let chunk = vec![0x5au8; 64 * 1024];
            for _ in 0..BYTES / chunk.len() {
                client.write_all(&chunk).unwrap();
            }
            // Dropped: FIN, not RST (the sink reads everything).
        });
        let reader = std::thread::spawn(move || {
            let (mut conn, _) = sink_listener.accept().unwrap();
            let mut buf = vec![0u8; 256 * 1024];
            let mut total = 0;
            loop {
                match conn.read(&mut buf).unwrap() {
                    0 => break total,
                    n => total += n,
                }
            }
        });

        // Probes while the transfer runs: each one answer that must wake the reader.
        let mut probes = 0u64;
        loop {
            assert!(matches!(
                prober.probe(backend(7001), TIMEOUT).await,
                ProbeResult::Success { .. }
            ));
            probes += 1;
            if writer.is_finished() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        writer.join().unwrap();
        assert_eq!(reader.join().unwrap(), BYTES);
        tokio::time::sleep(Duration::from_millis(20)).await;
        let woke = prober.wakeups() - before;

        let unrelated = drain_count(&control);
        eprintln!(
            "{probes} probes, reader woke {woke} times; an unfiltered raw socket got {unrelated} segments"
        );
        assert!(
            unrelated > 1000,
            "the transfer reached raw sockets: {unrelated} segments"
        );
        assert!(
            (1..=probes).contains(&woke),
            "woke {woke} times for {probes} probe answers"
        );
    });
}

/// Packet sockets bound to IPv4 (EtherType 0800) in the calling thread's namespace
/// (`/proc/thread-self/net/packet`: sk RefCnt Type Proto Iface ...).
fn ipv4_packet_sockets() -> usize {
    std::fs::read_to_string("/proc/thread-self/net/packet")
        .unwrap()
        .lines()
        .skip(1)
        .filter(|l| l.split_whitespace().nth(3) == Some("0800"))
        .count()
}

/// The prober reads IPv4 replies from a packet socket's ring and sends through a raw socket
/// that receives nothing (IPPROTO_RAW): no raw TCP socket, which the kernel would hand a clone
/// of every TCP segment the host receives. Its sockets close with its reader.
#[test]
fn the_prober_takes_no_copy_of_the_hosts_tcp_traffic_and_closes_with_its_reader() {
    let p = pair();
    p.prober.enter(|| {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let open = || {
                let raw = |proto| raw_sockets("raw", proto);
                (raw(6), raw(255), ipv4_packet_sockets())
            };
            assert_eq!(open(), (0, 0, 0));
            let prober = SynProber::new().unwrap();
            assert_eq!(
                open(),
                (0, 1, 1),
                "(raw TCP, raw IPPROTO_RAW, IPv4 packet) sockets"
            );
            drop(prober);
            // The reader task owns the ring: it closes once the aborted task is dropped.
            let deadline = Instant::now() + Duration::from_secs(1);
            while open() != (0, 0, 0) && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            assert_eq!(open(), (0, 0, 0), "sockets closed with the reader");
        });
    });
}

/// Counts, in the prober's netfilter OUTPUT hook, the SYNs to `port`: those that took the
/// kernel's IP output path (the link-layer path skips it).
fn count_output_syns(ns: &Netns, port: u16) {
    output_chain(ns);
    let port = port.to_string();
    nft(
        ns,
        &[
            "add", "rule", "inet", "lbt", "out", "tcp", "dport", &port, "tcp", "flags", "syn",
            "counter",
        ],
    );
}

fn output_syns(ns: &Netns) -> u64 {
    let out = sh(ns
        .command("nft")
        .args(["list", "chain", "inet", "lbt", "out"]))
    .unwrap();
    let at = out.find("packets ").expect("counter in the chain");
    out[at + 8..]
        .split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap()
}

#[test]
fn answered_targets_skip_the_ip_output_path_until_a_timeout() {
    let p = pair();
    let _server = listen(&p.backend, 7001);
    count_output_syns(&p.prober, 7001);
    let (prober_ns, backend_ns) = (p.prober.clone(), p.backend.clone());
    with_prober(&p.prober, move |prober| async move {
        for _ in 0..5 {
            assert!(is_success(prober.probe(backend(7001), TIMEOUT).await));
        }
        // The first SYN resolved the next hop through the kernel; the others went around it.
        assert_eq!(output_syns(&prober_ns), 1);

        // A timeout sends the next probes through the kernel again, until one is answered.
        backend_ns.drop_all_input().unwrap();
        let timeout = Duration::from_millis(300);
        assert_eq!(
            prober.probe(backend(7001), timeout).await,
            ProbeResult::Timeout
        );
        assert_eq!(output_syns(&prober_ns), 1);
        assert_eq!(
            prober.probe(backend(7001), timeout).await,
            ProbeResult::Timeout
        );
        assert_eq!(output_syns(&prober_ns), 2);
        backend_ns.clear_input_chain().unwrap();
        for _ in 0..3 {
            assert!(is_success(prober.probe(backend(7001), TIMEOUT).await));
        }
        assert_eq!(output_syns(&prober_ns), 3);
    });
}

#[test]
fn a_next_hop_with_a_new_mac_is_followed() {
    let p = pair();
    let _server = listen(&p.backend, 7001);
    let (prober_ns, backend_ns) = (p.prober.clone(), p.backend.clone());
    let (prober_if, backend_if) = (p.prober_if.clone(), p.backend_if.clone());
    with_prober(&p.prober, move |prober| async move {
        for _ in 0..3 {
            assert!(is_success(prober.probe(backend(7001), TIMEOUT).await));
        }
        // The backend moves to another MAC and the prober's kernel learns it (as from a
        // gratuitous ARP): the next SYN goes to the new MAC. One sent to the old MAC would be
        // dropped by the backend's device and time out.
        let new_mac = "02:00:00:09:00:02";
        backend_ns
            .ip(&["link", "set", "dev", &backend_if, "address", new_mac])
            .unwrap();
        prober_ns
            .ip(&[
                "neigh", "replace", "10.0.9.2", "lladdr", new_mac, "dev", &prober_if,
            ])
            .unwrap();
        for _ in 0..3 {
            let result = prober
                .probe(backend(7001), Duration::from_millis(500))
                .await;
            assert!(is_success(result), "{result:?}");
        }
    });
}

#[test]
fn a_route_change_retires_the_link_layer_path_and_other_devices_do_not() {
    let p = pair();
    let _server = listen(&p.backend, 7001);
    count_output_syns(&p.prober, 7001);
    let prober_ns = p.prober.clone();
    with_prober(&p.prober, move |prober| async move {
        for _ in 0..3 {
            assert!(is_success(prober.probe(backend(7001), TIMEOUT).await));
        }
        assert_eq!(output_syns(&prober_ns), 1);
        // A device the probes do not use comes and goes (as container veths do): nothing
        // changes for them.
        prober_ns
            .ip(&[
                "link", "add", "lbtx", "type", "veth", "peer", "name", "lbty",
            ])
            .unwrap();
        for dev in ["lbtx", "lbty"] {
            prober_ns.ip(&["link", "set", dev, "up"]).unwrap();
        }
        assert!(is_success(prober.probe(backend(7001), TIMEOUT).await));
        assert_eq!(output_syns(&prober_ns), 1);
        // Any route change may move a target: its SYNs go through the kernel's routing again.
        prober_ns
            .ip(&["route", "add", "10.0.77.0/24", "dev", "lbtx"])
            .unwrap();
        assert!(is_success(prober.probe(backend(7001), TIMEOUT).await));
        assert_eq!(output_syns(&prober_ns), 2);
    });
}

// ---- IPv6 targets -------------------------------------------------------------------------
//
// The same pair of namespaces, dual-stack: 2001:db8:9::1 and 2001:db8:9::2 beside the IPv4
// addresses (duplicate address detection off, so they are usable at once). Half-open probes of
// IPv6 targets go through the prober's AF_INET6 raw socket, always on the kernel's path.

const PROBER_IP6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 9, 0, 0, 0, 0, 1);
const BACKEND_IP6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 9, 0, 0, 0, 0, 2);

/// [`pair`] with an IPv6 address on each end too.
fn dual_pair() -> Pair {
    let p = pair();
    add_address(&p.prober, &p.prober_if, "2001:db8:9::1/64").unwrap();
    add_address(&p.backend, &p.backend_if, "2001:db8:9::2/64").unwrap();
    p
}

fn backend6(port: u16) -> SocketAddr {
    SocketAddr::from((BACKEND_IP6, port))
}

/// A listener on `addr` in `ns`; the kernel answers SYNs without anyone accepting.
fn listen_at(ns: &Netns, addr: SocketAddr) -> TcpListener {
    ns.enter(|| TcpListener::bind(addr)).unwrap()
}

/// Half-open (SYN-RECV) connections `ns` holds on its address `local`.
fn syn_recv_at(ns: &Netns, local: SocketAddr) -> usize {
    let out = sh(ns.command("ss").args(["-Htan", "state", "syn-recv"])).unwrap();
    let local = local.to_string();
    out.lines()
        .filter(|l| l.split_whitespace().any(|field| field == local))
        .count()
}

/// Waits (up to 5 s) until `ns` holds no half-open connection on `local`; how many are left.
async fn syn_recv_at_drained(ns: &Netns, local: SocketAddr) -> usize {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let left = syn_recv_at(ns, local);
        if left == 0 || Instant::now() >= deadline {
            return left;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[test]
fn ipv6_listening_port_is_success_and_the_kernel_resets_it() {
    let p = dual_pair();
    let _server = listen_at(&p.backend, backend6(7001));
    let (prober_ns, backend_ns) = (p.prober.clone(), p.backend.clone());
    with_prober(&p.prober, move |prober| async move {
        for _ in 0..5 {
            match prober.probe(backend6(7001), TIMEOUT).await {
                ProbeResult::Success { latency } => {
                    assert!(latency > Duration::ZERO && latency < TIMEOUT, "{latency:?}");
                }
                other => panic!("want success, got {other:?}"),
            }
        }
        // The backend's RX checksum offload is off: it verified the TCP checksum the prober's
        // kernel computed over the IPv6 pseudo-header. And no socket owns the connection, so
        // the prober's kernel reset each SYN+ACK.
        assert_eq!(
            syn_recv_at_drained(&backend_ns, backend6(7001)).await,
            0,
            "the local kernel's RST ends each half-open connection"
        );
        // IPv6 targets always take the kernel's path (the link-layer path is IPv4 only).
        assert_eq!(prober.syns_sent(), (0, 5));

        // Control: with the prober's RSTs dropped, the backend keeps the half-open connection.
        output_chain(&prober_ns);
        nft(
            &prober_ns,
            &[
                "add", "rule", "inet", "lbt", "out", "tcp", "flags", "&", "rst", "==", "rst",
                "drop",
            ],
        );
        assert!(is_success(prober.probe(backend6(7001), TIMEOUT).await));
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(
            syn_recv_at(&backend_ns, backend6(7001)),
            1,
            "control: RST dropped"
        );
    });
}

#[test]
fn ipv6_closed_port_is_tcp_failure() {
    let p = dual_pair();
    with_prober(&p.prober, |prober| async move {
        for _ in 0..3 {
            let start = Instant::now();
            assert_eq!(
                prober.probe(backend6(7009), TIMEOUT).await,
                ProbeResult::TcpFailure(Reason::Refused)
            );
            assert!(start.elapsed() < TIMEOUT / 2, "the RST came back at once");
        }
    });
}

#[test]
fn ipv6_silent_or_absent_host_is_timeout() {
    let p = dual_pair();
    let _server = listen_at(&p.backend, backend6(7001));
    let backend_ns = p.backend.clone();
    with_prober(&p.prober, move |prober| async move {
        assert!(is_success(prober.probe(backend6(7001), TIMEOUT).await));
        let timeout = Duration::from_millis(300);
        // A host that stopped answering (it drops everything, neighbour discovery included),
        // and an address on the link that no host has.
        backend_ns.drop_all_input().unwrap();
        let absent = SocketAddr::from((Ipv6Addr::new(0x2001, 0xdb8, 9, 0, 0, 0, 0, 3), 7001));
        for target in [backend6(7001), absent] {
            let start = Instant::now();
            assert_eq!(prober.probe(target, timeout).await, ProbeResult::Timeout);
            let took = start.elapsed();
            assert!(
                took >= timeout && took < timeout + Duration::from_millis(250),
                "{target}: {took:?}"
            );
        }
        // Answering again: success again.
        backend_ns.clear_input_chain().unwrap();
        assert!(is_success(prober.probe(backend6(7001), TIMEOUT).await));
    });
}

/// One prober, IPv4 and IPv6 targets on two links at once (each target from the source address
/// of its own route): every probe gets its own answer, through `probe` futures and through
/// `start_many` batches alike.
#[test]
fn ipv6_and_ipv4_targets_probed_concurrently_through_one_prober() {
    let p = dual_pair();
    let other = Netns::new("synb2").unwrap();
    let (a, b) = veth(&p.prober, "10.0.10.1/24", &other, "10.0.10.2/24").unwrap();
    a.add_address("2001:db8:10::1/64").unwrap();
    b.add_address("2001:db8:10::2/64").unwrap();
    sh(other
        .command("ethtool")
        .args(["-K", &b.ifname, "rx", "off"]))
    .unwrap();
    let second6 = Ipv6Addr::new(0x2001, 0xdb8, 0x10, 0, 0, 0, 0, 2);
    let open: Vec<SocketAddr> = vec![
        backend(7001),
        backend6(7001),
        backend6(7002),
        SocketAddr::from((Ipv4Addr::new(10, 0, 10, 2), 7001)),
        SocketAddr::from((second6, 7001)),
    ];
    let closed = [
        backend6(7009),
        backend(7009),
        SocketAddr::from((second6, 7009)),
    ];
    let mut servers = Vec::new();
    for &addr in &open {
        let ns = if addr.ip() == BACKEND_IP || addr.ip() == BACKEND_IP6 {
            &p.backend
        } else {
            &other
        };
        servers.push(listen_at(ns, addr));
    }
    let targets: Vec<(SocketAddr, bool)> = open
        .iter()
        .map(|&a| (a, true))
        .chain(closed.iter().map(|&a| (a, false)))
        .collect();
    with_prober(&p.prober, move |prober| async move {
        // Futures: 240 probes at once, 30 per target.
        let mut probes = tokio::task::JoinSet::new();
        for i in 0..240 {
            let (target, up) = targets[i % targets.len()];
            let prober = Arc::clone(&prober);
            probes.spawn(async move { (target, up, prober.probe(target, TIMEOUT).await) });
        }
        let (mut ok, mut refused) = (0, 0);
        while let Some(done) = probes.join_next().await {
            let (target, up, result) = done.unwrap();
            match result {
                ProbeResult::Success { .. } if up => ok += 1,
                ProbeResult::TcpFailure(Reason::Refused) if !up => refused += 1,
                other => panic!("{target}: {other:?}"),
            }
        }
        assert_eq!((ok, refused), (150, 90));

        // Batches as the checker starts them: tokens carry the target's place in the high half.
        for round in 0..3u64 {
            let batch: Vec<_> = targets
                .iter()
                .enumerate()
                .map(|(place, &(target, _))| ((place as u64) << 32 | round, target, TIMEOUT, None))
                .collect();
            prober.start_many(&batch);
            let mut results = Vec::new();
            let deadline = Instant::now() + 2 * TIMEOUT;
            while results.len() < batch.len() {
                tokio::time::timeout_at(deadline.into(), prober.finished(&mut results))
                    .await
                    .expect("every probe of the batch finishes");
            }
            results.sort_by_key(|&(token, _)| token);
            for (token, result) in results {
                assert_eq!(token & 0xffff_ffff, round);
                let (target, up) = targets[(token >> 32) as usize];
                match result {
                    ProbeResult::Success { .. } if up => {}
                    ProbeResult::TcpFailure(Reason::Refused) if !up => {}
                    other => panic!("round {round}, {target}: {other:?}"),
                }
            }
        }
    });
}

/// The pooled source ports are the prober's on both families: no local IPv4 or IPv6 socket
/// (IPV6_V6ONLY included, which an IPv4-only reservation would not stop) is given one by an
/// ephemeral bind, so the kernel keeps resetting the backends' SYN+ACKs to them.
#[test]
fn pooled_ports_are_reserved_for_ipv6_sockets_too() {
    let p = dual_pair();
    // A range the pool takes most of: what is left is easy to count.
    let (low, high) = (40000u16, 40099u16);
    p.prober
        .sysctl("net/ipv4/ip_local_port_range", &format!("{low} {high}"))
        .unwrap();
    let _server = listen_at(&p.backend, backend6(7001));
    with_prober(&p.prober, |prober| async move {
        // Takes every port an ephemeral bind of this kind can still get; the sockets are kept
        // until the count is done.
        let grab = |v6only: Option<bool>| {
            let mut held = Vec::new();
            while let Some((fd, port)) = bind_ephemeral(v6only) {
                assert!((low..=high).contains(&port), "{port}");
                held.push((fd, port));
            }
            held.into_iter().map(|(_, port)| port).collect::<Vec<u16>>()
        };
        let range = usize::from(high - low) + 1;
        let free = range - POOL_PORTS;
        for kind in [None, Some(true), Some(false)] {
            let got = grab(kind);
            assert_eq!(
                got.len(),
                free,
                "{kind:?} (IPv4 if None, else IPV6_V6ONLY): {} of {range} ports, the pool holds {POOL_PORTS}",
                got.len()
            );
        }
        // The prober still works on its pool.
        for _ in 0..3 {
            assert!(is_success(prober.probe(backend6(7001), TIMEOUT).await));
            assert_eq!(
                prober.probe(backend(7009), TIMEOUT).await,
                ProbeResult::TcpFailure(Reason::Refused)
            );
        }
    });
}

/// A TCP socket bound to port 0 (IPv4 if `v6only` is None, else IPv6 with IPV6_V6ONLY as
/// given) and the port the kernel gave it; None once none is left.
fn bind_ephemeral(v6only: Option<bool>) -> Option<(OwnedFd, u16)> {
    let family = if v6only.is_some() {
        libc::AF_INET6
    } else {
        libc::AF_INET
    };
    // SAFETY: plain socket(2) call.
    let fd = unsafe { libc::socket(family, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    assert!(fd >= 0, "{}", std::io::Error::last_os_error());
    // SAFETY: fresh descriptor.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: all-zero is a valid sockaddr_in6 (and, cut short, sockaddr_in): the wildcard
    // address, port 0, once the family is set.
    let mut addr: libc::sockaddr_in6 = unsafe { std::mem::zeroed() };
    addr.sin6_family = family as libc::sa_family_t;
    let len = if let Some(only) = v6only {
        let only = libc::c_int::from(only);
        // SAFETY: valid fd and option value.
        let rc = unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                libc::IPPROTO_IPV6,
                libc::IPV6_V6ONLY,
                (&raw const only).cast(),
                size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        assert_eq!(rc, 0, "{}", std::io::Error::last_os_error());
        size_of::<libc::sockaddr_in6>()
    } else {
        size_of::<libc::sockaddr_in>()
    } as libc::socklen_t;
    // SAFETY: valid fd, address and length (a sockaddr_in fits in the storage).
    if unsafe { libc::bind(fd.as_raw_fd(), (&raw const addr).cast(), len) } != 0 {
        return None;
    }
    let mut len = size_of::<libc::sockaddr_in6>() as libc::socklen_t;
    // SAFETY: valid fd and storage of that length.
    let rc = unsafe { libc::getsockname(fd.as_raw_fd(), (&raw mut addr).cast(), &raw mut len) };
    assert_eq!(rc, 0, "{}", std::io::Error::last_os_error());
    // sin_port and sin6_port sit at the same offset.
    Some((fd, u16::from_be(addr.sin6_port)))
}

/// The IPv6 socket's kernel filter (which sees segments from their TCP header, unlike the IPv4
/// one's) keeps bulk IPv6 traffic away from the reader as well.
#[test]
fn ipv6_filter_keeps_bulk_traffic_away_from_the_reader() {
    let p = dual_pair();
    let _server = listen_at(&p.backend, backend6(7001));
    let sink = SocketAddr::from((PROBER_IP6, 7100));
    let sink_listener = p.prober.enter(|| TcpListener::bind(sink)).unwrap();
    let control = p.prober.enter(|| unfiltered_raw_socket_of(libc::AF_INET6));
    let mut client = p.backend.enter(|| TcpStream::connect(sink)).unwrap();
    const BYTES: usize = 32 << 20;
    with_prober(&p.prober, move |prober| async move {
        tokio::time::sleep(Duration::from_millis(20)).await;
        let before = prober.wakeups();
        let writer = std::thread::spawn(move || {
            let chunk = vec![0x5au8; 64 * 1024];
            for _ in 0..BYTES / chunk.len() {
                client.write_all(&chunk).unwrap();
            }
        });
        let reader = std::thread::spawn(move || {
            let (mut conn, _) = sink_listener.accept().unwrap();
            let mut buf = vec![0u8; 256 * 1024];
            let mut total = 0;
            loop {
                match conn.read(&mut buf).unwrap() {
                    0 => break total,
                    n => total += n,
                }
            }
        });
        let mut probes = 0u64;
        loop {
            assert!(is_success(prober.probe(backend6(7001), TIMEOUT).await));
            probes += 1;
            if writer.is_finished() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        writer.join().unwrap();
        assert_eq!(reader.join().unwrap(), BYTES);
        tokio::time::sleep(Duration::from_millis(20)).await;
        let woke = prober.wakeups() - before;
        let unrelated = drain_count(&control);
        eprintln!(
            "{probes} IPv6 probes, reader woke {woke} times; an unfiltered IPv6 raw socket got \
             {unrelated} segments"
        );
        assert!(
            unrelated > 1000,
            "the transfer reached IPv6 raw sockets: {unrelated} segments"
        );
        assert!(
            (1..=probes).contains(&woke),
            "woke {woke} times for {probes} probe answers"
        );
    });
}

/// Raw sockets of protocol `proto` in `/proc/thread-self/net/<table>` (`raw` or `raw6`).
fn raw_sockets(table: &str, proto: u8) -> usize {
    let suffix = format!(":{proto:04X}");
    std::fs::read_to_string(format!("/proc/thread-self/net/{table}"))
        .unwrap()
        .lines()
        .skip(1)
        .filter(|l| {
            l.split_whitespace()
                .nth(1)
                .is_some_and(|a| a.ends_with(&suffix))
        })
        .count()
}

#[test]
fn dropping_the_prober_closes_its_ipv6_socket_too() {
    let p = pair();
    p.prober.enter(|| {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            assert_eq!(raw_sockets("raw6", 6), 0);
            let prober = SynProber::new().unwrap();
            assert_eq!(raw_sockets("raw6", 6), 1, "one IPv6 raw socket");
            assert_eq!(
                raw_sockets("raw", 255),
                1,
                "one IPv4 raw socket (send only)"
            );
            drop(prober);
            let deadline = Instant::now() + Duration::from_secs(1);
            let open = || raw_sockets("raw6", 6) + raw_sockets("raw", 255);
            while open() > 0 && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            assert_eq!(open(), 0);
        });
    });
}

// ---- tcp-connect over IPv6 ------------------------------------------------------------------

/// `tcp-connect` (a full handshake, no raw socket) against an IPv6 backend running the test
/// kit's TCP server (it greets with its name, then echoes): success with and without a payload
/// check, a wrong reply, a refused port, a silent host.
#[test]
fn tcp_connect_to_ipv6_targets() {
    use lb::config::Expect;
    use lb::health::probe::tcp_connect;
    let p = dual_pair();
    let _server = lb_tests::servers::start(&p.backend, backend6(7001), "backend6").unwrap();
    let backend_ns = p.backend.clone();
    p.prober.block_on(|| async move {
        let expect = Expect::prefix(b"backend6");
        let result = tcp_connect::probe(backend6(7001), None, None, TIMEOUT).await;
        assert!(is_success(result), "{result:?}");
        let result = tcp_connect::probe(backend6(7001), Some(b"x"), Some(&expect), TIMEOUT).await;
        assert!(is_success(result), "{result:?}");
        assert_eq!(
            tcp_connect::probe(
                backend6(7001),
                None,
                Some(&Expect::prefix(b"other")),
                TIMEOUT
            )
            .await,
            ProbeResult::PayloadFailure(Reason::Mismatch)
        );
        assert_eq!(
            tcp_connect::probe(backend6(7009), None, None, TIMEOUT).await,
            ProbeResult::TcpFailure(Reason::Refused)
        );
        backend_ns.drop_all_input().unwrap();
        let timeout = Duration::from_millis(300);
        let start = Instant::now();
        assert_eq!(
            tcp_connect::probe(backend6(7001), None, None, timeout).await,
            ProbeResult::Timeout
        );
        let took = start.elapsed();
        assert!(
            took >= timeout && took < timeout + Duration::from_millis(250),
            "{took:?}"
        );
    });
}

/// The SYN+ACKs from `BACKEND_IP` the raw socket `fd` (with `SO_TIMESTAMPNS`) holds: each
/// one's source port and when the prober's host received it (the kernel's stamp).
fn syn_acks_received(fd: &OwnedFd) -> Vec<(u16, SystemTime)> {
    let mut out = Vec::new();
    loop {
        let mut buf = [0u8; 128];
        let mut control = [0u64; 16];
        let mut iov = libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: buf.len(),
        };
        // SAFETY: all-zero is a valid msghdr; the pointers set below outlive the call.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = &raw mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = size_of_val(&control);
        // SAFETY: valid fd and message.
        let n = unsafe { libc::recvmsg(fd.as_raw_fd(), &raw mut msg, 0) };
        if n < 0 {
            return out;
        }
        let packet = &buf[..n as usize];
        let ihl = usize::from(packet[0] & 0x0f) * 4;
        let from_backend = packet[12..16] == BACKEND_IP.octets();
        if !from_backend || packet.len() < ihl + 14 || packet[ihl + 13] != 0x12 {
            continue;
        }
        let port = u16::from_be_bytes([packet[ihl], packet[ihl + 1]]);
        // SAFETY: the control buffer was filled by recvmsg; CMSG_* walk it within its length.
        let stamp = unsafe {
            let mut stamp = None;
            let mut c = libc::CMSG_FIRSTHDR(&raw const msg);
            while !c.is_null() {
                if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_TIMESTAMPNS {
                    let ts = libc::CMSG_DATA(c).cast::<libc::timespec>().read_unaligned();
                    stamp = Some(Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32));
                }
                c = libc::CMSG_NXTHDR(&raw const msg, c);
            }
            stamp.expect("SO_TIMESTAMPNS gives every packet a stamp")
        };
        out.push((port, SystemTime::UNIX_EPOCH + stamp));
    }
}

#[test]
fn a_reply_that_arrived_before_the_deadline_is_never_a_timeout() {
    // The replies' ring hands a block of replies over a while after they arrive (up to a tick
    // of the kernel's timer): a probe whose deadline passes meanwhile must not time out.
    // Short timeouts, one listening port each (so that a late reply cannot be mistaken for
    // the next probe's); an independent socket stamps when each SYN+ACK arrived.
    const PROBES: u16 = 60;
    const TIMEOUT: Duration = Duration::from_millis(1);
    let p = pair();
    let _servers: Vec<_> = (0..PROBES).map(|i| listen(&p.backend, 7200 + i)).collect();
    with_prober(&p.prober, |prober| async move {
        let watch = unfiltered_raw_socket();
        set_socket_option(&watch, libc::SO_TIMESTAMPNS, 1);
        let mut probes = Vec::new();
        for i in 0..PROBES {
            let started = SystemTime::now();
            let result = prober.probe(backend(7200 + i), TIMEOUT).await;
            probes.push((7200 + i, started, result));
        }
        let arrivals = syn_acks_received(&watch);
        let mut wrong = Vec::new();
        let mut slow = Vec::new();
        for (port, started, result) in &probes {
            let arrived = arrivals
                .iter()
                .filter(|&&(from, _)| from == *port)
                .map(|&(_, at)| at)
                .min();
            // Well inside the deadline, which the prober set after `started`.
            let deadline = *started + TIMEOUT - Duration::from_micros(200);
            if arrived.is_some_and(|at| at < deadline) && *result == ProbeResult::Timeout {
                wrong.push(port);
            }
            // The latency runs to when the reply arrived, not to when the ring handed it over.
            if let (ProbeResult::Success { latency }, Some(at)) = (result, arrived) {
                let bound = at.duration_since(*started).unwrap_or_default();
                if *latency > bound + Duration::from_micros(100) {
                    slow.push((port, *latency, bound));
                }
            }
        }
        let timeouts = probes
            .iter()
            .filter(|p| p.2 == ProbeResult::Timeout)
            .count();
        assert!(
            wrong.is_empty(),
            "{} probes timed out though their SYN+ACK arrived before the deadline (ports {wrong:?}; {timeouts} timeouts of {PROBES}, {} SYN+ACKs seen)",
            wrong.len(),
            arrivals.len()
        );
        assert!(
            slow.is_empty(),
            "latencies past the reply's arrival (port, latency, arrival after the start): {slow:?}"
        );
    });
}
