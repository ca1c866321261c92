//! The `lb run` daemon on a two-arm sandbox: it balances real TCP and UDP flows over three
//! backends, reports them on its API, leaves other traffic alone, and detaches on SIGTERM/SIGINT.

use std::{net::SocketAddr, time::Duration};

use lb::model::Status;
use lb_tests::{
    daemon::{Daemon, TempDir},
    lb_bin,
    netns::Netns,
    require_root,
    servers::{self, connect},
    topology::{Arms, Sandbox, VIP},
};

fn sandbox() -> (Sandbox, Daemon) {
    require_root();
    let sb = Sandbox::build(Arms::Two, 3, 8080).unwrap();
    let config = sb
        .config(80, &[], "")
        .replace("[lb]\n", "[lb]\nconntrack = { size = 65536 }\n");
    let daemon = Daemon::start(&sb.lb, &config).unwrap();
    (sb, daemon)
}

fn counter(r: &Status, name: &str) -> u64 {
    r.counter(name)
        .unwrap_or_else(|| panic!("no counter {name}"))
}

fn run_and_stop(stop_signal: libc::c_int) {
    let (sb, mut daemon) = sandbox();
    for p in &sb.lb_ports {
        assert!(sb.lb.xdp_attached(&p.ifname).unwrap());
    }
    let before = daemon.stats().unwrap();

    // Balanced: 300 TCP flows over three backends. The first SYN may find a backend's MAC
    // still unresolved (dropped, retransmitted); connect() waits for that.
    let seen = servers::spread(&sb.client.ns, SocketAddr::from((VIP, 80)), 300);
    assert_eq!(seen.len(), 3, "{seen:?}");

    // UDP through the VIP.
    let socket = sb
        .client
        .ns
        .enter(|| std::net::UdpSocket::bind("0.0.0.0:0"))
        .unwrap();
    socket.connect(SocketAddr::from((VIP, 80))).unwrap();
    socket
        .set_read_timeout(Some(Duration::from_secs(2)))
        .unwrap();
    socket.send(b"hello").unwrap();
    let mut buf = [0u8; 128];
    let n = socket.recv(&mut buf).unwrap();
    assert!(String::from_utf8_lossy(&buf[..n]).ends_with(":hello"));

    // Not balanced: the balancer's own address.
    let ping = sb
        .client
        .ns
        .exec(&["ping", "-c", "3", "-i", "0.2", "-W", "2", "10.0.1.1"])
        .unwrap();
    assert!(ping.status.success(), "{ping:?}");

    let after = daemon.stats().unwrap();
    let tcp = after.services.iter().find(|s| s.name == "tcp").unwrap();
    let tcp_before = before.services.iter().find(|s| s.name == "tcp").unwrap();
    assert_eq!(tcp.new_flows - tcp_before.new_flows, 300, "{after:?}");
    for b in &tcp.backends {
        assert!(b.new_flows > 0, "every backend got flows: {after:?}");
    }
    let udp = after.services.iter().find(|s| s.name == "udp").unwrap();
    assert_eq!(udp.new_flows, 1);
    assert!(counter(&after, "pass_not_vip") - counter(&before, "pass_not_vip") >= 3);
    assert!(counter(&after, "fwd_redirect") > 600);
    assert_eq!(counter(&after, "drop_no_snat_port"), 0);

    let code = daemon.stop(stop_signal);
    let log = daemon.log_text();
    assert_eq!(code, Some(0), "lb exit status; log:\n{log}");
    for p in &sb.lb_ports {
        assert!(
            !sb.lb.xdp_attached(&p.ifname).unwrap(),
            "still attached after exit"
        );
    }
    assert!(log.contains("XDP program detached"), "{log}");
}

#[test]
fn lb_run_balances_and_stops_on_sigterm() {
    run_and_stop(libc::SIGTERM);
}

#[test]
fn lb_run_balances_and_stops_on_sigint() {
    run_and_stop(libc::SIGINT);
}

fn run_expecting_failure(ns: &Netns, config: &str) -> String {
    let dir = TempDir::new().unwrap();
    let path = dir.0.join("lb.toml");
    std::fs::write(&path, config).unwrap();
    // Unpinned: these runs fail before pinning matters, and the default pin path (and its
    // lock) is the host's, shared by tests running at the same time.
    let out = ns
        .command(lb_bin())
        .args(["run", "--no-pin", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    stderr
}

const ONE_SERVICE: &str = "\n[[service]]\nname = \"web\"\nvip = \"10.100.0.1:80\"\nbackends = [{ address = \"10.0.2.2:80\" }]\n";

#[test]
fn run_on_a_missing_interface_fails_cleanly() {
    require_root();
    let ns = Netns::new("lb").unwrap();
    let stderr = run_expecting_failure(
        &ns,
        &format!("[lb]\ninterfaces = [\"nosuch0\"]\nsnat_address = \"10.0.2.1\"\n{ONE_SERVICE}"),
    );
    assert!(
        stderr.contains("interface \"nosuch0\" does not exist"),
        "{stderr}"
    );
}

#[test]
fn run_without_ip_forwarding_says_how_to_enable_it() {
    require_root();
    let ns = Netns::new("lb").unwrap();
    let peer = Netns::new("peer").unwrap();
    let (port, _) = lb_tests::netns::veth(&ns, "10.0.2.1/24", &peer, "10.0.2.2/24").unwrap();
    let stderr = run_expecting_failure(
        &ns,
        &format!("[lb]\ninterfaces = [\"{}\"]\n{ONE_SERVICE}", port.ifname),
    );
    assert!(stderr.contains("IPv4 forwarding is off"), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "sysctl -w net.ipv4.conf.{}.forwarding=1",
            port.ifname
        )),
        "{stderr}"
    );
    assert!(!ns.xdp_attached(&port.ifname).unwrap());
}

#[test]
fn a_second_lb_on_the_same_interface_is_refused_and_the_first_keeps_running() {
    let (sb, daemon) = sandbox();
    let config = std::fs::read_to_string(&daemon.config)
        .unwrap()
        .replace("127.0.0.1:9090", "127.0.0.1:9091");
    let stderr = run_expecting_failure(&sb.lb, &config);
    assert!(stderr.contains("already attached"), "{stderr}");
    assert!(daemon.stats().is_ok());
    let (_, name) = connect(&sb.client.ns, SocketAddr::from((VIP, 80))).unwrap();
    assert!(name.starts_with("backend-"));
}

/// Issue 14: `ip netns exec` gives lb a mount namespace of its own; lb mounted a bpffs there,
/// which died with it, so after kill -9 nothing was left to adopt while the log said the
/// datapath kept forwarding. lb now refuses to pin where the pins cannot outlive it, and says
/// how to run it instead.
#[test]
fn pinning_from_a_private_mount_namespace_is_refused() {
    require_root();
    let ns = Netns::new("lb").unwrap();
    let peer = Netns::new("peer").unwrap();
    let (port, _) = lb_tests::netns::veth(&ns, "10.0.2.1/24", &peer, "10.0.2.2/24").unwrap();
    ns.sysctl("net/ipv4/ip_forward", "1").unwrap();
    let dir = TempDir::new().unwrap();
    let pin = format!("/sys/fs/bpf/lb-test-{}-private", std::process::id());
    struct Cleanup(String);
    impl Drop for Cleanup {
        fn drop(&mut self) {
            let ids = lb::daemon::ids_file(std::path::Path::new(&self.0));
            let _ = std::fs::remove_file(ids.with_extension("lock"));
            let _ = std::fs::remove_file(ids);
        }
    }
    let _cleanup = Cleanup(pin.clone());
    let path = dir.0.join("lb.toml");
    std::fs::write(
        &path,
        format!(
            "[lb]\ninterfaces = [\"{}\"]\napi = \"127.0.0.1:9093\"\npin_path = \"{pin}\"\n{ONE_SERVICE}",
            port.ifname
        ),
    )
    .unwrap();
    // `ip netns exec` (Netns::command), pinned: refused before anything is attached.
    let mut child = ns
        .command(lb_bin())
        .args(["run", "--config"])
        .arg(&path)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("lb run went on pinning into a mount namespace that dies with it");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("would die with lb") && stderr.contains("nsenter --net=/run/netns/NS"),
        "{stderr}"
    );
    assert!(!ns.xdp_attached(&port.ifname).unwrap());
}
