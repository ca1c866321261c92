//! The real-QUIC harness itself (`lb_tests::quic`: aioquic's server and client), without lb: a
//! client and a server namespace joined by a veth; downloads with no move, with a new source
//! port, and with a new address and connection ID, over IPv4 and IPv6; every connection ID the
//! server issued carries its server ID where its layout says; a transfer to nobody ends as a
//! stall before its timeout.

use std::{
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
    time::{Duration, Instant},
};

use lb_tests::{
    netns::{Netns, veth},
    quic::{CidLayout, Migration, QuicServer, Transfer, download, hex},
    require_root,
};

const CLIENT4: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 201, 0, 1));
/// The client's second address, for the address migration.
const CLIENT4_B: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 201, 0, 3));
const SERVER4: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 201, 0, 2));
const CLIENT6: IpAddr = IpAddr::V6(Ipv6Addr::new(0xfd00, 0x201, 0, 0, 0, 0, 0, 1));
const CLIENT6_B: IpAddr = IpAddr::V6(Ipv6Addr::new(0xfd00, 0x201, 0, 0, 0, 0, 0, 3));
const SERVER6: IpAddr = IpAddr::V6(Ipv6Addr::new(0xfd00, 0x201, 0, 0, 0, 0, 0, 2));
const PORT: u16 = 4433;
/// Big enough that a move happens mid-transfer with data in flight, small enough to be quick.
const BYTES: u64 = 3 << 20;
const TIMEOUT: Duration = Duration::from_secs(30);

/// The first byte's config ID, the server ID right after it (the draft's usual place).
const LAYOUT4: CidLayout = CidLayout {
    server_id_bytes: 2,
    cid_offset: 1,
    config_id: 1,
};
const SERVER_ID4: u64 = 0x2a17;
/// Another placement: the server ID further in, a byte longer.
const LAYOUT6: CidLayout = CidLayout {
    server_id_bytes: 3,
    cid_offset: 3,
    config_id: 5,
};
const SERVER_ID6: u64 = 0x0b_0c0d;

struct Bed {
    client: Netns,
    // Dropped before the namespaces.
    server: QuicServer,
    _server_ns: Netns,
}

/// A client and a server namespace joined by a veth (the client with a second address), and a
/// server of `family`'s layout.
fn bed(v6: bool) -> Bed {
    require_root();
    let client = Netns::new("quicc").unwrap();
    let server_ns = Netns::new("quics").unwrap();
    let (c, s) = veth(&client, "10.201.0.1/24", &server_ns, "10.201.0.2/24").unwrap();
    for cidr in ["10.201.0.3/24", "fd00:201::1/64", "fd00:201::3/64"] {
        c.add_address(cidr).unwrap();
    }
    s.add_address("fd00:201::2/64").unwrap();
    let server = if v6 {
        let listen = SocketAddr::new(SERVER6, PORT);
        QuicServer::start(&server_ns, listen, "six", SERVER_ID6, LAYOUT6).unwrap()
    } else {
        let listen = SocketAddr::new(SERVER4, PORT);
        QuicServer::start(&server_ns, listen, "four", SERVER_ID4, LAYOUT4).unwrap()
    };
    Bed {
        client,
        server,
        _server_ns: server_ns,
    }
}

impl Bed {
    fn download(&self, bind: IpAddr, plan: &Migration) -> Transfer {
        let started = Instant::now();
        let t = download(
            &self.client,
            self.server.listen,
            BYTES,
            Some(bind),
            plan,
            TIMEOUT,
        )
        .unwrap();
        eprintln!(
            "{plan:?}: {} bytes in {:?} (client's own {:?}), paths {:?}, dcids {:?}",
            t.bytes,
            started.elapsed(),
            t.elapsed,
            t.paths,
            t.dcids.iter().map(|c| hex(c)).collect::<Vec<_>>()
        );
        t
    }
}

/// Completed from the right server with every byte, `migrations` moves done, and every CID the
/// server issued (and the client used) in `layout` with `server_id`.
fn assert_transfer(
    t: &Transfer,
    server: &QuicServer,
    migrations: u32,
    layout: CidLayout,
    server_id: u64,
) {
    assert!(
        t.completed && t.exit_code == Some(0),
        "not completed: {:?}\n{}\nserver's log:\n{}",
        t.error,
        t.log,
        server.log()
    );
    assert_eq!(t.error, None);
    assert_eq!(t.bytes, BYTES);
    assert_eq!(t.server.as_deref(), Some(server.name.as_str()));
    assert_eq!(t.migrations, migrations, "{}", t.log);
    assert_eq!(t.paths.len(), migrations as usize + 1, "{:?}", t.paths);
    assert!(!t.dcids.is_empty(), "the client used no server-issued CID");
    // The server issues its first and then up to 7 more (the client's limit is 8).
    assert!(t.issued_cids.len() >= 2, "{:?}", t.issued_cids);
    for cid in t.dcids.iter().chain(&t.issued_cids) {
        layout.check(cid, server_id).unwrap();
    }
    for cid in &t.dcids {
        assert!(
            t.issued_cids.contains(cid),
            "used {} it was not given",
            hex(cid)
        );
    }
}

#[test]
fn download_without_migration() {
    let bed = bed(false);
    let t = bed.download(CLIENT4, &Migration::none());
    assert_transfer(&t, &bed.server, 0, LAYOUT4, SERVER_ID4);
    assert_eq!(t.dcids.len(), 1, "a CID change without a move");
    assert_eq!(t.paths[0].ip(), CLIENT4);
}

#[test]
fn download_across_a_port_rebinding() {
    let bed = bed(false);
    let t = bed.download(CLIENT4, &Migration::rebind_port(0.4));
    assert_transfer(&t, &bed.server, 1, LAYOUT4, SERVER_ID4);
    // Same address, another port, the same CID (a NAT rebinding the client does not know of).
    assert_eq!((t.paths[0].ip(), t.paths[1].ip()), (CLIENT4, CLIENT4));
    assert_ne!(t.paths[0].port(), t.paths[1].port());
    assert_eq!(t.dcids.len(), 1);
    let log = bed.server.log();
    let promoted = format!("Network path ('{CLIENT4}', {}) promoted", t.paths[1].port());
    assert!(log.contains(&promoted), "the server saw no move:\n{log}");
}

#[test]
fn download_across_an_address_and_cid_change() {
    let bed = bed(false);
    let plan = Migration::new_address(CLIENT4_B, 0.5).with_change_cid();
    let t = bed.download(CLIENT4, &plan);
    assert_transfer(&t, &bed.server, 1, LAYOUT4, SERVER_ID4);
    assert_eq!((t.paths[0].ip(), t.paths[1].ip()), (CLIENT4, CLIENT4_B));
    // The first CID, then one from a NEW_CONNECTION_ID frame: both carry the server ID.
    assert_eq!(t.dcids.len(), 2, "no CID change");
    assert_ne!(t.dcids[0], t.dcids[1]);
    let log = bed.server.log();
    assert!(
        log.contains(&format!("Network path ('{CLIENT4_B}'")) && log.contains("Peer switching"),
        "the server saw no move:\n{log}"
    );
}

#[test]
fn download_over_ipv6_across_both_moves() {
    let bed = bed(true);
    let plan = Migration {
        rebind_port_at: Some(0.3),
        new_address: Some((CLIENT6_B, 0.6)),
        change_cid: true,
        stall: None,
    };
    let t = bed.download(CLIENT6, &plan);
    assert_transfer(&t, &bed.server, 2, LAYOUT6, SERVER_ID6);
    let ips: Vec<IpAddr> = t.paths.iter().map(SocketAddr::ip).collect();
    assert_eq!(ips, [CLIENT6, CLIENT6, CLIENT6_B]);
    assert_eq!(t.dcids.len(), 3, "a CID change at each move");
}

/// A server that is not there: the client gives up on the stall (half the timeout at most),
/// before its timeout, and says so.
#[test]
fn a_transfer_to_nobody_stalls_before_its_timeout() {
    let bed = bed(false);
    let timeout = Duration::from_secs(4);
    let nobody = SocketAddr::new(SERVER4, PORT + 1);
    let started = Instant::now();
    let t = download(
        &bed.client,
        nobody,
        BYTES,
        None,
        &Migration::none(),
        timeout,
    )
    .unwrap();
    assert!(!t.completed);
    assert_eq!(t.exit_code, Some(1));
    assert_eq!(t.bytes, 0);
    assert!(
        t.error.as_deref().is_some_and(|e| e.contains("stalled")),
        "{:?}",
        t.error
    );
    assert!(
        started.elapsed() < timeout + Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
}
