//! Hitless restart: the datapath pinned in bpffs outlives the `Dataplane` that loaded it (as it
//! outlives a daemon killed with -9), the next load adopts its maps and replaces the program on
//! its links, and detach_all / remove_pinned leave nothing behind.
//!
//! The test process stays in the host's mount namespace (pins are only visible there) and
//! enters the network namespaces with `Netns::enter` (setns of the network namespace only).

use std::{
    io::{Read as _, Write as _},
    net::{Ipv4Addr, SocketAddr, TcpStream},
    path::{Path, PathBuf},
    sync::{
        Once,
        atomic::{AtomicU32, Ordering},
    },
    time::{Duration, Instant},
};

use aya::{
    maps::{Array, Map, MapData},
    programs::{SchedClassifier, TcAttachType, XdpMode},
};
use lb::{
    balancer::{Balancer, MapWriter as _},
    config::{self, Config},
    dataplane::{self, Dataplane},
};
use lb_common::{
    AddrSet, BackendInfo, ServiceInfo, ServiceKey, addr_flags, addr_set, backend_flags, counter,
    map_name,
};
use lb_tests::{
    inproc::wait_for_neighbours,
    netns::{Netns, Port, veth},
    require_root,
    servers::connect,
    topology::{Arms, Sandbox, VIP},
};

static NEXT: AtomicU32 = AtomicU32::new(0);
static SWEEP: Once = Once::new();
const PREFIX: &str = "lb-test-";

/// A pin directory of this test (`/sys/fs/bpf/lb-test-<pid>-<n>`, not created): whatever is
/// pinned there is unpinned (links detached) and the directory removed when it drops, also when
/// the test fails. Directories left by killed runs (whose pid is gone) are removed on first use.
struct PinDir(PathBuf);

impl PinDir {
    fn new() -> Self {
        SWEEP.call_once(sweep_stale);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        Self(Path::new(dataplane::BPFFS).join(format!("{PREFIX}{}-{n}", std::process::id())))
    }

    fn path(&self) -> &Path {
        &self.0
    }

    fn has(&self, name: &str) -> bool {
        self.0.join(name).exists()
    }
}

impl Drop for PinDir {
    fn drop(&mut self) {
        if let Err(e) = dataplane::remove_pinned(&self.0) {
            eprintln!("warning: {e:#}");
        }
    }
}

fn sweep_stale() {
    for (name, path) in lb_tests::netns::stale_entries(Path::new(dataplane::BPFFS), PREFIX) {
        eprintln!("removing stale test pins {name}");
        if let Err(e) = dataplane::remove_pinned(&path) {
            eprintln!("warning: {e:#}");
        }
    }
}

/// Small maps, so that loading is quick.
fn lb_config(iface: &str, conntrack: u32) -> config::Lb {
    let text = format!(
        "[lb]\ninterfaces = [\"{iface}\"]\nmax_services = 4\nring_size = 251\nmax_backends = 64\n\
         conntrack = {{ size = {conntrack} }}\n"
    );
    config::parse(&text)
        .map_err(|e| anyhow::anyhow!("test config: {e}"))
        .unwrap()
        .lb
}

/// A namespace for the balancer with one veth to a peer namespace, forwarding on.
fn net() -> (Netns, Netns, Port) {
    let ns = Netns::new("pin").unwrap();
    let peer = Netns::new("pinpeer").unwrap();
    let (port, _) = veth(&ns, "10.0.1.1/24", &peer, "10.0.1.2/24").unwrap();
    ns.sysctl("net/ipv4/ip_forward", "1").unwrap();
    (ns, peer, port)
}

/// The ids of the TCX egress programs on `ifname` (the health probes' encapsulator).
fn tc_egress_ids(ns: &Netns, ifname: &str) -> Vec<u32> {
    let name = std::ffi::CString::new(ifname).unwrap();
    ns.enter(|| SchedClassifier::query_tcx(name.as_c_str(), TcAttachType::Egress))
        .unwrap()
        .1
        .iter()
        .map(|p| p.id())
        .collect()
}

/// The id of the XDP program attached to `ifname`, if any (`prog/xdp id N` of `ip -d link`).
fn xdp_prog_id(ns: &Netns, ifname: &str) -> Option<u32> {
    let out = ns.ip(&["-d", "link", "show", "dev", ifname]).unwrap();
    let rest = out.split("prog/xdp id ").nth(1)?;
    rest.split_whitespace().next()?.parse().ok()
}

fn ne(ip: &str) -> u32 {
    u32::from_ne_bytes(ip.parse::<Ipv4Addr>().unwrap().octets())
}

const BACKEND_ID: u32 = 3;

fn backend() -> BackendInfo {
    BackendInfo {
        addr: ne("10.0.1.2"),
        snat_addr: ne("10.0.1.1"),
        port: 8080u16.to_be(),
        no_data_ticks: 0,
        flags: backend_flags::UP | backend_flags::DRAINED,
    }
}

fn service() -> (ServiceKey, ServiceInfo) {
    (
        ServiceKey::new([10, 100, 0, 1], 80, lb_common::PROTO_TCP),
        ServiceInfo { id: 1, flags: 0 },
    )
}

#[test]
fn released_datapath_stays_attached_and_is_adopted() {
    require_root();
    let pins = PinDir::new();
    let (ns, _peer, port) = net();
    let iface = port.ifname.as_str();
    let lb = lb_config(iface, 1024);
    let link = format!("link-{iface}");
    let tc_link = format!("tclink-{iface}");

    // First run: fresh pins, attach, write, release.
    ns.enter(|| -> anyhow::Result<()> {
        let mut dp = Dataplane::load(&lb, Some(pins.path()))?;
        assert!(!dp.adopted(), "nothing was pinned yet");
        assert_eq!(dp.attach(iface, config::XdpMode::Native)?, XdpMode::Driver);
        dp.set_backend(BACKEND_ID, lb::entries::AnyBackend::V4(backend()))?;
        let (key, info) = service();
        dp.set_service(lb::entries::AnyServiceKey::V4(key), info)?;
        let vip = ne("10.100.0.1");
        let mut set = AddrSet::default();
        (set.addrs[2], set.flags[2]) = (vip, addr_flags::VIP);
        dp.set_addr_set(addr_set(vip), &set)?;
        dp.release();
        Ok(())
    })
    .unwrap();
    let first = xdp_prog_id(&ns, iface).expect("XDP detached by release()");
    let first_tc = tc_egress_ids(&ns, iface);
    assert_eq!(first_tc.len(), 1, "the TC egress program stays too");
    for name in [
        link.as_str(),
        tc_link.as_str(),
        map_name::CONNTRACK,
        map_name::NAT,
        map_name::BACKENDS,
    ] {
        assert!(
            pins.has(name),
            "{name} not pinned in {}",
            pins.path().display()
        );
    }

    // Second run: adopts the maps, replaces the program on the same link; then dropped.
    ns.enter(|| -> anyhow::Result<()> {
        let mut dp = Dataplane::load(&lb, Some(pins.path()))?;
        assert!(dp.adopted());
        assert_eq!(dp.backend_info(BACKEND_ID)?, backend());
        assert_eq!(
            dp.addr_table()?.addrs().into_iter().collect::<Vec<_>>(),
            [(Ipv4Addr::new(10, 100, 0, 1), addr_flags::VIP)]
        );
        let (key, info) = service();
        assert_eq!(dp.service_info(&key)?, Some(info));
        assert_eq!(
            dp.service_info(&ServiceKey::new([10, 100, 0, 2], 80, lb_common::PROTO_TCP))?,
            None
        );
        // Replaces (no EBUSY), and reports the link's mode.
        assert_eq!(dp.attach(iface, config::XdpMode::Native)?, XdpMode::Driver);
        drop(dp); // neither release() nor detach_all(): must stay attached
        Ok(())
    })
    .unwrap();
    let second = xdp_prog_id(&ns, iface).expect("XDP detached by dropping the Dataplane");
    assert_ne!(first, second, "the program on the link was not replaced");
    assert!(pins.has(&link));
    // The TC egress program too: one, replaced on its link (not a second one beside it).
    let second_tc = tc_egress_ids(&ns, iface);
    assert_eq!(second_tc.len(), 1, "{second_tc:?}");
    assert_ne!(
        first_tc, second_tc,
        "the TC program on the link was not replaced"
    );
    assert!(pins.has(&tc_link));

    // Third run: a request for another mode keeps the link's; detach_all removes everything.
    ns.enter(|| -> anyhow::Result<()> {
        let mut dp = Dataplane::load(&lb, Some(pins.path()))?;
        assert!(dp.adopted());
        assert_eq!(dp.attach(iface, config::XdpMode::Skb)?, XdpMode::Driver);
        assert_ne!(xdp_prog_id(&ns, iface), Some(second));
        assert!(xdp_prog_id(&ns, iface).is_some());
        dp.detach_all();
        Ok(())
    })
    .unwrap();
    assert!(
        !pins.path().exists(),
        "detach_all left {}",
        pins.path().display()
    );
    assert!(
        !ns.xdp_attached(iface).unwrap(),
        "detach_all left XDP on {iface}"
    );
    assert!(
        tc_egress_ids(&ns, iface).is_empty(),
        "detach_all left TC on {iface}"
    );
}

/// Replaces the pinned map `name` with one made as an older lb made it: raw bpf(2), since aya
/// creates maps only from an object. `attr` holds `map_type | key_size << 32`, `value_size |
/// max_entries << 32`, `map_flags`.
fn pin_old_map(dir: &Path, name: &str, attr: [u64; 3]) {
    let path = dir.join(name);
    std::fs::remove_file(&path).unwrap();
    let bpf = |cmd: libc::c_long, attr: &mut [u64; 16]| {
        // SAFETY: bpf(2) with a zeroed attribute buffer larger than the fields the command reads.
        unsafe { libc::syscall(libc::SYS_bpf, cmd, attr.as_mut_ptr(), size_of_val(attr)) }
    };
    // BPF_MAP_CREATE.
    let mut create = [0u64; 16];
    create[..3].copy_from_slice(&attr);
    let fd = bpf(0, &mut create);
    assert!(
        fd >= 0,
        "BPF_MAP_CREATE: {}",
        std::io::Error::last_os_error()
    );
    // BPF_OBJ_PIN: pathname, bpf_fd.
    let cpath = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    let mut pin = [0u64; 16];
    pin[0] = cpath.as_ptr() as u64;
    pin[1] = fd as u64;
    let pinned = bpf(6, &mut pin);
    assert_eq!(
        pinned,
        0,
        "BPF_OBJ_PIN: {}",
        std::io::Error::last_os_error()
    );
    // SAFETY: our own descriptor; the pin keeps the map.
    unsafe { libc::close(fd as i32) };
}

/// The address table as a hash map `u32 → u32` of 4096 entries, as lb pinned it before the
/// table became an array.
fn pin_old_hash_addrs(dir: &Path) {
    pin_old_map(dir, map_name::ADDRS, [1 | 4 << 32, 4 | 4096 << 32, 0]);
}

#[test]
fn incompatible_pins_fail_with_a_clear_error() {
    require_root();
    let pins = PinDir::new();
    // Nothing is attached: the interface name is never looked up.
    Dataplane::load(&lb_config("lbt0", 1024), Some(pins.path()))
        .unwrap()
        .release();
    let err = Dataplane::load(&lb_config("lbt0", 2048), Some(pins.path()))
        .err()
        .expect("a conntrack size other than the pinned one must be refused");
    let msg = err.to_string();
    let dir = pins.path().display().to_string();
    for want in [dir.as_str(), "lb stop", "conntrack.size"] {
        assert!(msg.contains(want), "{want:?} missing from: {msg}");
    }
    // Whichever of the two maps sized by it aya checks first.
    assert!(
        msg.contains(map_name::CONNTRACK) || msg.contains(map_name::NAT),
        "no map named in: {msg}"
    );
    // The failed load left the pinned state alone: the old settings still adopt it.
    assert!(pins.has(map_name::CONNTRACK));
    let dp = Dataplane::load(&lb_config("lbt0", 1024), Some(pins.path())).unwrap();
    assert!(dp.adopted());
    drop(dp);

    // A datapath pinned by an lb whose address table was a hash map (same name, other type).
    pin_old_hash_addrs(pins.path());
    let err = Dataplane::load(&lb_config("lbt0", 1024), Some(pins.path()))
        .err()
        .expect("a pinned hash map where the address table is an array must be refused");
    let msg = err.to_string();
    for want in [
        dir.as_str(),
        "lb stop",
        map_name::ADDRS,
        "another version of lb",
    ] {
        assert!(msg.contains(want), "{want:?} missing from: {msg}");
    }
    assert!(pins.has(map_name::ADDRS) && pins.has(map_name::CONNTRACK));
}

#[test]
fn a_datapath_in_use_is_neither_adopted_nor_removed() {
    require_root();
    let pins = PinDir::new();
    let lb = lb_config("lbt0", 1024);
    let dp = Dataplane::load(&lb, Some(pins.path())).unwrap();
    let err = Dataplane::load(&lb, Some(pins.path()))
        .err()
        .expect("a second load of a pin directory in use must be refused");
    assert!(
        err.to_string().contains("in use by a running lb"),
        "{err:#}"
    );
    let err = dataplane::remove_pinned(pins.path()).unwrap_err();
    assert!(
        err.to_string().contains("in use by a running lb"),
        "{err:#}"
    );
    assert!(pins.has(map_name::CONNTRACK));
    // The lock goes with the Dataplane (with its process, on kill -9).
    dp.release();
    assert!(Dataplane::load(&lb, Some(pins.path())).unwrap().adopted());
}

#[test]
fn remove_pinned_detaches_and_cleans_a_left_directory() {
    require_root();
    let pins = PinDir::new();
    let (ns, _peer, port) = net();
    let iface = port.ifname.as_str();
    ns.enter(|| -> anyhow::Result<()> {
        let mut dp = Dataplane::load(&lb_config(iface, 1024), Some(pins.path()))?;
        dp.attach(iface, config::XdpMode::Skb)?;
        dp.release();
        Ok(())
    })
    .unwrap();
    assert!(ns.xdp_attached(iface).unwrap());

    let removed = dataplane::remove_pinned(pins.path()).unwrap();
    let names: Vec<String> = removed
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        names[0],
        format!("link-{iface}"),
        "links go first: {names:?}"
    );
    for name in [map_name::CONNTRACK, map_name::BACKENDS, map_name::TX_PORTS] {
        assert!(names.iter().any(|n| n == name), "{name} not in {names:?}");
    }
    assert!(
        names.iter().any(|n| *n == format!("tclink-{iface}")),
        "{names:?}"
    );
    assert!(!pins.path().exists());
    // Detached before remove_pinned returns (the last reference is our fd).
    assert!(!ns.xdp_attached(iface).unwrap());
    assert!(tc_egress_ids(&ns, iface).is_empty());
    assert!(
        dataplane::remove_pinned(pins.path()).unwrap().is_empty(),
        "a missing directory is nothing to remove"
    );
    // Never empties a directory outside bpffs.
    assert!(dataplane::remove_pinned(Path::new("/tmp")).is_err());
}

#[test]
fn defunct_link_of_a_recreated_interface_is_attached_anew() {
    require_root();
    let pins = PinDir::new();
    let (ns, _peer, port) = net();
    let iface = port.ifname.as_str();
    let lb = lb_config(iface, 1024);
    ns.enter(|| -> anyhow::Result<()> {
        let mut dp = Dataplane::load(&lb, Some(pins.path()))?;
        dp.attach(iface, config::XdpMode::Native)?;
        dp.release();
        Ok(())
    })
    .unwrap();
    // The interface goes away while no daemon runs (its link turns defunct, its pin stays) and
    // comes back under the same name.
    ns.ip(&["link", "del", iface]).unwrap();
    assert!(pins.has(&format!("link-{iface}")));
    let peer_name = format!("{iface}p");
    ns.ip(&[
        "link", "add", iface, "type", "veth", "peer", "name", &peer_name,
    ])
    .unwrap();
    for dev in [iface, peer_name.as_str()] {
        ns.ip(&["link", "set", dev, "up"]).unwrap();
    }
    ns.enter(|| -> anyhow::Result<()> {
        let mut dp = Dataplane::load(&lb, Some(pins.path()))?;
        assert!(dp.adopted());
        assert_eq!(dp.attach(iface, config::XdpMode::Skb)?, XdpMode::Skb);
        dp.release();
        Ok(())
    })
    .unwrap();
    assert!(ns.xdp_attached(iface).unwrap());
    assert!(pins.has(&format!("link-{iface}")));
    // The TC egress link was defunct too: attached anew, once.
    assert_eq!(tc_egress_ids(&ns, iface).len(), 1);
    assert!(pins.has(&format!("tclink-{iface}")));
}

#[test]
fn links_of_interfaces_no_longer_configured_are_detached() {
    require_root();
    let pins = PinDir::new();
    let (ns, peer, kept) = net();
    let (dropped, _) = veth(&ns, "10.0.3.1/24", &peer, "10.0.3.2/24").unwrap();
    let (kept, dropped) = (kept.ifname.as_str(), dropped.ifname.as_str());
    let lb = lb_config(kept, 1024);
    ns.enter(|| -> anyhow::Result<()> {
        let mut dp = Dataplane::load(&lb, Some(pins.path()))?;
        dp.attach(kept, config::XdpMode::Native)?;
        dp.attach(dropped, config::XdpMode::Native)?;
        dp.release();
        Ok(())
    })
    .unwrap();
    ns.enter(|| -> anyhow::Result<()> {
        let mut dp = Dataplane::load(&lb, Some(pins.path()))?;
        dp.attach(kept, config::XdpMode::Native)?;
        assert_eq!(dp.detach_unused_links()?, [dropped]);
        dp.release();
        Ok(())
    })
    .unwrap();
    assert!(ns.xdp_attached(kept).unwrap());
    assert!(!ns.xdp_attached(dropped).unwrap());
    assert!(pins.has(&format!("link-{kept}")));
    assert!(!pins.has(&format!("link-{dropped}")));
    assert_eq!(tc_egress_ids(&ns, kept).len(), 1);
    assert!(tc_egress_ids(&ns, dropped).is_empty());
    assert!(pins.has(&format!("tclink-{kept}")));
    assert!(!pins.has(&format!("tclink-{dropped}")));
}

/// Sends `msg` on an echo connection and reads it back.
fn echo(conn: &mut TcpStream, msg: &[u8]) -> anyhow::Result<()> {
    conn.write_all(msg)?;
    let mut got = vec![0; msg.len()];
    conn.read_exact(&mut got)?;
    anyhow::ensure!(got == msg, "echo {msg:?} came back as {got:?}");
    Ok(())
}

/// Loads the datapath for `config` pinned at `dir` in the balancer namespace, writes its state
/// and attaches it, like `lb run`.
fn start(sb: &Sandbox, config: &Config, dir: &Path) -> Dataplane {
    let backends = config
        .services
        .iter()
        .flat_map(|s| s.backends.iter().map(|b| b.address.ip()))
        .collect();
    let dp = sb
        .lb
        .enter(|| -> anyhow::Result<_> {
            let mut dp = Dataplane::load(&config.lb, Some(dir))?;
            Balancer::new(
                config,
                |sid, b| lb::daemon::snat_address(config, sid, b),
                &mut dp,
            )?;
            lb::daemon::resolve_neighbours(&backends);
            for iface in &config.lb.interfaces {
                dp.attach(iface, config.lb.xdp_mode)?;
            }
            assert!(dp.detach_unused_links()?.is_empty());
            Ok(dp)
        })
        .unwrap();
    wait_for_neighbours(sb, &backends).unwrap();
    dp
}

/// Both families' connections: the IPv6 tables are pinned and adopted as the IPv4 ones are.
#[test]
fn open_connection_survives_a_restart() {
    require_root();
    let pins = PinDir::new();
    let sb = Sandbox::build(Arms::Two, 2, 8080).unwrap();
    let text = sb.config6(80, &[], "", true).replace(
        "[lb]\n",
        "[lb]\nconntrack = { size = 4096, ipv6_size = 4096 }\n",
    );
    let config = config::parse(&text)
        .map_err(|e| anyhow::anyhow!("{e}"))
        .unwrap();
    let vip = SocketAddr::from((VIP, 80));
    let vip6 = SocketAddr::from((lb_tests::topology::VIP6, 80));

    let dp = start(&sb, &config, pins.path());
    assert!(!dp.adopted());
    let (mut conn, backend) = connect(&sb.client.ns, vip).unwrap();
    echo(&mut conn, b"before\n").unwrap();
    let (mut conn6, backend6) = connect(&sb.client.ns, vip6).unwrap();
    echo(&mut conn6, b"before, over IPv6\n").unwrap();

    // The daemon dies: the pinned program keeps forwarding the open connection.
    drop(dp);
    echo(&mut conn, b"while down\n").unwrap();
    echo(&mut conn6, b"while down, over IPv6\n").unwrap();

    // A new run adopts the connection table: the connection stays on its backend.
    let dp = sb
        .lb
        .enter(|| Dataplane::load(&config.lb, Some(pins.path())))
        .unwrap();
    assert!(dp.adopted());
    drop(dp); // a load alone changes nothing on the interfaces
    echo(&mut conn, b"after an adopting load\n").unwrap();
    let mut dp = start(&sb, &config, pins.path());
    assert!(dp.adopted());
    echo(&mut conn, b"after restart\n").unwrap();
    echo(&mut conn6, b"after restart, over IPv6\n").unwrap();
    let (mut other, _) = connect(&sb.client.ns, vip).unwrap();
    echo(&mut other, b"new connection\n").unwrap();
    let (mut other6, _) = connect(&sb.client.ns, vip6).unwrap();
    echo(&mut other6, b"new connection, over IPv6\n").unwrap();
    eprintln!("connections to {backend} and {backend6} kept across the restart");

    dp.detach_all();
    assert!(!pins.path().exists());
    for port in &sb.lb_ports {
        assert!(!sb.lb.xdp_attached(&port.ifname).unwrap());
    }
}

/// Issue 39: a flow of the SYN proxy lives in pinned maps too (its translation, its table
/// entries): open connections of both families keep working while the daemon is down and after
/// a new run adopts the maps, and new ones are proxied.
#[test]
fn open_proxied_connections_survive_a_restart() {
    require_root();
    let pins = PinDir::new();
    let sb = Sandbox::build(Arms::Two, 2, 8080).unwrap();
    let text = sb.config6(80, &[], "", true).replace(
        "protocol = \"tcp\"\n",
        "protocol = \"tcp\"\nsyn_proxy = \"on\"\n",
    );
    let config = config::parse(&text)
        .map_err(|e| anyhow::anyhow!("{e}"))
        .unwrap();
    let vip = SocketAddr::from((VIP, 80));
    let vip6 = SocketAddr::from((lb_tests::topology::VIP6, 80));
    let dp = start(&sb, &config, pins.path());
    let (mut conn, _) = connect(&sb.client.ns, vip).unwrap();
    echo(&mut conn, b"before\n").unwrap();
    let (mut conn6, _) = connect(&sb.client.ns, vip6).unwrap();
    echo(&mut conn6, b"before, over IPv6\n").unwrap();
    let opened = |dp: &Dataplane| dp.stats().unwrap().counters[counter::SYN_PROXY_OPENED as usize];
    assert_eq!(opened(&dp), 2, "both connections went through the proxy");

    drop(dp);
    echo(&mut conn, b"while down\n").unwrap();
    echo(&mut conn6, b"while down, over IPv6\n").unwrap();

    let mut dp = start(&sb, &config, pins.path());
    assert!(dp.adopted());
    // Far more than a window's worth each way: sequence numbers and timestamps are still
    // translated with the offsets of before.
    let chunk: Vec<u8> = (0..64 * 1024).map(|i| (i % 253) as u8).collect();
    for _ in 0..4 {
        echo(&mut conn, &chunk).unwrap();
        echo(&mut conn6, &chunk).unwrap();
    }
    let (mut other, _) = connect(&sb.client.ns, vip).unwrap();
    echo(&mut other, b"new connection\n").unwrap();
    let (mut other6, _) = connect(&sb.client.ns, vip6).unwrap();
    echo(&mut other6, b"new connection, over IPv6\n").unwrap();
    assert_eq!(opened(&dp), 4, "the new connections went through the proxy");

    dp.detach_all();
    assert!(!pins.path().exists());
}

/// Ring slots are written through a mapping of LB_RINGS, without a system call per slot: what
/// the mapping writes is what the map holds, and a whole ring costs about what writing the same
/// slots into memory costs. Through BPF_MAP_UPDATE_BATCH a slot cost ~180 ns of the kernel's
/// copying and checks: a start with 500 services of 65,537 slots spent some 6 s writing rings
/// before its API answered.
#[test]
fn ring_slots_are_written_through_memory() {
    require_root();
    let pins = PinDir::new();
    let text = "[lb]\ninterfaces = [\"lbt0\"]\nmax_services = 4\nmax_backends = 64\n\
                conntrack = { size = 1024 }\n";
    let lb = config::parse(text)
        .map_err(|e| anyhow::anyhow!("test config: {e}"))
        .unwrap()
        .lb;
    let ring = lb.ring_size;
    // Nothing is attached: the interface name is never looked up.
    let mut dp = Dataplane::load(&lb, Some(pins.path())).unwrap();
    let slots: Vec<(u32, u32)> = (0..ring).map(|s| (s, s % 7 + 1)).collect();
    let mut memory = vec![0u32; ring as usize];
    let (mut map_took, mut memory_took) = (Duration::MAX, Duration::MAX);
    // Each side the least of 7 (the same slots again write the same values).
    for _ in 0..7 {
        let start = Instant::now();
        dp.set_ring_slots(2, &slots).unwrap();
        map_took = map_took.min(start.elapsed());
        let start = Instant::now();
        for &(slot, id) in std::hint::black_box(&slots) {
            memory[slot as usize] = id;
        }
        std::hint::black_box(&memory);
        memory_took = memory_took.min(start.elapsed());
    }
    eprintln!("a ring of {ring} slots: {map_took:?} into LB_RINGS, {memory_took:?} into memory");

    // Read back through the kernel: the program's map holds what was written, and only there.
    let map = MapData::from_pin(pins.path().join(map_name::RINGS)).unwrap();
    let rings = Array::<_, u32>::try_from(Map::Array(map)).unwrap();
    for slot in [0, 1, ring / 2, ring - 1] {
        assert_eq!(rings.get(&(2 * ring + slot), 0).unwrap(), slot % 7 + 1);
    }
    for index in [2 * ring - 1, 3 * ring] {
        assert_eq!(rings.get(&index, 0).unwrap(), 0, "slot {index} written");
    }
    // A slot beyond the array is refused, and nothing of its batch written.
    let err = dp
        .set_ring_slots(3, &[(0, 9), (ring, 9)])
        .expect_err("a slot beyond LB_RINGS must be refused");
    assert!(err.to_string().contains("service 3"), "{err:#}");
    assert_eq!(rings.get(&(3 * ring), 0).unwrap(), 0);

    assert!(
        map_took < memory_took * 5,
        "a ring took {map_took:?} into LB_RINGS against {memory_took:?} into memory"
    );
}

/// A datapath pinned by an lb that wrote its rings with system calls (LB_RINGS made without
/// BPF_F_MMAPABLE, which cannot be mapped) is still adopted: its open connections stay, the
/// rings are made anew, written in full before the new program takes over, and new
/// connections are balanced by them.
#[test]
fn rings_pinned_by_an_older_lb_are_made_anew() {
    require_root();
    let pins = PinDir::new();
    let sb = Sandbox::build(Arms::Two, 2, 8080).unwrap();
    let text = sb.config(80, &[], "").replace(
        "[lb]\n",
        "[lb]\nmax_services = 4\nring_size = 251\nconntrack = { size = 4096 }\n",
    );
    let config = config::parse(&text)
        .map_err(|e| anyhow::anyhow!("{e}"))
        .unwrap();
    let vip = SocketAddr::from((VIP, 80));
    let mappable = |dir: &Path| {
        let info = aya::maps::MapInfo::from_pin(dir.join(map_name::RINGS)).unwrap();
        info.map_flags() & 1 << 10 != 0 // BPF_F_MMAPABLE
    };

    let dp = start(&sb, &config, pins.path());
    assert!(mappable(pins.path()));
    let (mut conn, backend) = connect(&sb.client.ns, vip).unwrap();
    echo(&mut conn, b"before\n").unwrap();
    drop(dp);

    // As an older lb left it: an array of the same shape, without the flag, and empty.
    let entries = u64::from(config.lb.max_services * config.lb.ring_size);
    pin_old_map(
        pins.path(),
        map_name::RINGS,
        [2 | 4 << 32, 4 | entries << 32, 0],
    );
    assert!(!mappable(pins.path()));
    echo(&mut conn, b"while down\n").unwrap();

    let mut dp = start(&sb, &config, pins.path());
    assert!(dp.adopted());
    assert!(mappable(pins.path()), "the old ring array was kept");
    echo(&mut conn, b"after restart\n").unwrap();
    // 20 connections all on one of two backends: one chance in 2^19.
    let mut seen = std::collections::HashSet::new();
    for i in 0..20 {
        let (mut other, to) = connect(&sb.client.ns, vip).unwrap();
        echo(&mut other, format!("new connection {i}\n").as_bytes()).unwrap();
        seen.insert(to);
    }
    eprintln!("kept the connection to {backend}; new ones went to {seen:?}");
    assert_eq!(seen.len(), 2, "new connections reached {seen:?}");

    dp.detach_all();
    assert!(!pins.path().exists());
}
