//! One configuration for several hosts (SPEC §6): three lb hosts behind a BIRD router with
//! ECMP take their services from one etcd (Debian's etcd-server, in the router's namespace),
//! their `[lb]` from local files. Every revision written is applied by every host (the time
//! from the write to the last host's apply, over 20 changes); after each change the three
//! hosts' live datapaths send the same 10,000 new flows to the same backends; an invalid
//! revision is refused by every host, which keep what runs; etcd stopped and started again
//! while connections go through the hosts: none fails, and the hosts catch up.

use std::{
    net::{Ipv4Addr, SocketAddr},
    time::{Duration, Instant},
};

use lb_tests::{
    cluster::Cluster,
    daemon::{Daemon, Launch, PinGuard, TempDir},
    etcd::Etcd,
    live,
    packet::{Packet, TCP_SYN},
    require_root,
    traffic::ConnectLoop,
};

const PORT: u16 = 8080;
const VIP: Ipv4Addr = Ipv4Addr::new(10, 100, 0, 1);
/// The agreement's flows go to a direct-server-return service: no SNAT port is taken per
/// flow (200,000 test flows would exhaust full NAT's), and the outer destination is the pick.
const DSR_VIP: Ipv4Addr = Ipv4Addr::new(10, 100, 0, 2);
const KEY: &str = "/lb/test/config";
const FLOWS: usize = 10_000;

fn etcd_addr() -> SocketAddr {
    "10.1.0.1:2379".parse().unwrap()
}

/// The services' document: the backends with `weights`.
fn document(c: &Cluster, weights: &[u32]) -> String {
    let backends: Vec<String> = c
        .backends
        .iter()
        .zip(weights)
        .map(|(b, w)| format!("{{ address = \"{}:{PORT}\", weight = {w} }}", b.addr))
        .collect();
    let check = "[service.check]\nkind = \"tcp\"\ntimeout = \"200ms\"\ninterval = \"300ms\"\n\
                 healthy_threshold = 1\n";
    format!(
        "# the fleet's services\n[[service]]\nname = \"web\"\nvip = \"{VIP}:{PORT}\"\nannounce = \"always\"\n\
         backends = [{b}]\n{check}\n\
         [[service]]\nname = \"dsr\"\nvip = \"{DSR_VIP}:{PORT}\"\nforwarding = \"gue\"\nannounce = \"never\"\n\
         backends = [{b}]\n{check}",
        b = backends.join(", ")
    )
}

/// Waits until every daemon runs version `version`; when the last one did, from `since`.
fn all_at(daemons: &[Daemon], version: &str, since: Instant, limit: Duration) -> Duration {
    let mut done = vec![None; daemons.len()];
    loop {
        for (i, d) in daemons.iter().enumerate() {
            if done[i].is_none() {
                let v = d.status().ok().and_then(|s| s.config).map(|c| c.version);
                if v.as_deref() == Some(version) {
                    done[i] = Some(since.elapsed());
                }
            }
        }
        if let Some(last) = done.iter().copied().collect::<Option<Vec<_>>>() {
            return last.into_iter().max().unwrap_or_default();
        }
        assert!(
            since.elapsed() < limit,
            "version {version} not on every host after {limit:?}: {done:?}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The backend each of the flows `round` makes goes to, through host `i`'s live datapath.
fn picks(c: &Cluster, pins: &[PinGuard], i: usize, round: usize) -> Vec<[u8; 4]> {
    let host = &c.hosts[i];
    let link = std::path::Path::new(&pins[i].0).join(format!("link-{}", host.uplink.ifname));
    let prog = live::program_of_link(&link).unwrap();
    let ingress = host.ns.ifindex(&host.uplink.ifname).unwrap();
    host.ns.enter(|| {
        (0..FLOWS)
            .map(|n| {
                let client = format!(
                    "10.1.{}.{}:{}",
                    1 + round % 200,
                    2 + n % 250,
                    1024 + (n * 7 + round) % 60000
                );
                let frame = Packet::tcp(&client, &format!("{DSR_VIP}:{PORT}"), TCP_SYN).build();
                let (verdict, out) = live::run(&prog, &frame, ingress).unwrap();
                assert!(
                    verdict == 3 || verdict == 4,
                    "host {i}: a SYN ({client}) was not forwarded (verdict {verdict})"
                );
                [out[30], out[31], out[32], out[33]]
            })
            .collect()
    })
}

#[test]
fn every_host_applies_every_revision_and_agrees() {
    require_root();
    let c = Cluster::build(3, 3, PORT).unwrap();
    let mut etcd = Etcd::start(&c.router, etcd_addr()).unwrap();
    let source = format!("etcd://{}/lb/test", etcd_addr());
    let pins: Vec<PinGuard> = (0..3).map(|_| PinGuard::unique()).collect();
    let mut daemons: Vec<Daemon> = (0..3)
        .map(|i| {
            let local = c
                .lb_config(i, "1s", "")
                // No per-source SYN limit: the agreement's 10,000 SYNs come from 250 sources.
                .replace(
                    "[lb]\n",
                    &format!(
                        "[lb]\npin_path = \"{}\"\nsyn_rate_per_source = 0\n",
                        pins[i].0
                    ),
                );
            Daemon::start_with(
                &c.hosts[i].ns,
                &local,
                &Launch {
                    pinned: true,
                    args: &["--config-source", &source],
                    ..Launch::default()
                },
            )
            .unwrap()
        })
        .collect();

    // The first revision: every host applies it, its VIP announced by all three.
    let started = Instant::now();
    let rev = etcd.put(KEY, &document(&c, &[1, 1, 1])).unwrap();
    all_at(&daemons, &rev.to_string(), started, Duration::from_secs(10));
    for d in &daemons {
        for b in &c.backends {
            d.wait_state(
                "web",
                &format!("{}:{PORT}", b.addr),
                "healthy",
                Duration::from_secs(10),
            );
        }
    }
    c.wait_nexthops(VIP, &[0, 1, 2], Duration::from_secs(15))
        .unwrap();

    // 20 changes of the weights: the time until the last host applied each, and the three
    // hosts' picks of 10,000 new flows after each.
    let mut took = Vec::new();
    for round in 0..20 {
        let weights = [1 + round as u32 % 3, 1 + (round as u32 + 1) % 4, 2];
        let since = Instant::now();
        let rev = etcd.put(KEY, &document(&c, &weights)).unwrap();
        took.push(all_at(
            &daemons,
            &rev.to_string(),
            since,
            Duration::from_secs(10),
        ));
        let first = picks(&c, &pins, 0, round);
        for i in 1..3 {
            let other = picks(&c, &pins, i, round);
            let differ = first.iter().zip(&other).filter(|(a, b)| a != b).count();
            assert_eq!(
                differ, 0,
                "round {round}: host {i} sends {differ} of {FLOWS} flows elsewhere than host 0"
            );
        }
    }
    took.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    eprintln!(
        "write to the last host's apply, 20 changes: median {:.1} ms, max {:.1} ms",
        ms(took[took.len() / 2]),
        ms(took[took.len() - 1])
    );
    assert!(took[took.len() - 1] < Duration::from_secs(5), "{took:?}");

    // A change through one host's API goes to etcd, and every host applies it.
    let since = Instant::now();
    let out = daemons[1].lb(&[
        "backend",
        "set",
        "web",
        &format!("{}:{PORT}", c.backends[0].addr),
        "--weight",
        "5",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let written = daemons[1].status().unwrap().config.unwrap().version;
    all_at(&daemons, &written, since, Duration::from_secs(10));
    for d in &daemons {
        let s = d.status().unwrap();
        let b = s
            .service("web")
            .unwrap()
            .backend(&format!("{}:{PORT}", c.backends[0].addr))
            .unwrap()
            .clone();
        assert_eq!(b.weight, 5);
    }

    // An invalid revision: refused by every host, each keeping what it runs.
    let running = daemons[0].status().unwrap().config.unwrap().version;
    let bad = etcd
        .put(
            KEY,
            "[[service]]\nname = \"web\"\nvip = \"not an address\"\n",
        )
        .unwrap()
        .to_string();
    for d in &daemons {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let config = d.status().unwrap().config.unwrap();
            if config.refused_version.as_deref() == Some(bad.as_str()) {
                assert_eq!(config.version, running);
                assert!(config.refused_reason.unwrap().contains("service[0].vip"));
                break;
            }
            assert!(Instant::now() < deadline, "{bad} not refused: {config:?}");
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(d.status().unwrap().service("web").is_some());
    }

    // etcd goes away while connections go through the hosts, and comes back.
    let load = ConnectLoop::start(&c.client, SocketAddr::from((VIP, PORT)));
    load.wait(20);
    etcd.stop();
    for d in &daemons {
        let deadline = Instant::now() + Duration::from_secs(15);
        while d.status().unwrap().config.unwrap().error.is_none() {
            assert!(Instant::now() < deadline, "etcd's absence not noticed");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    load.wait(50);
    etcd.restart().unwrap();
    let since = Instant::now();
    let rev = etcd.put(KEY, &document(&c, &[1, 1, 1])).unwrap();
    all_at(&daemons, &rev.to_string(), since, Duration::from_secs(15));
    load.wait(20);
    let (made, failures) = load.finish();
    assert!(
        failures.is_empty(),
        "{} of {made} failed: {failures:?}",
        failures.len()
    );
    for d in &daemons {
        assert!(d.status().unwrap().config.unwrap().error.is_none());
    }

    // A host restarted while etcd is away starts with the last revision it applied (kept
    // beside its local file) and adopts its pinned datapath.
    etcd.stop();
    daemons[2].stop(libc::SIGTERM);
    let again = Daemon::start_with_path(
        &c.hosts[2].ns,
        TempDir::new().unwrap(),
        daemons[2].config.clone(),
        &Launch {
            pinned: true,
            args: &["--config-source", &source],
            ..Launch::default()
        },
    );
    let again = match again {
        Ok(d) => d,
        Err(e) => panic!("{e:#}"),
    };
    assert_eq!(
        again.status().unwrap().config.unwrap().version,
        rev.to_string()
    );
    assert!(
        again
            .log_text()
            .contains("starting with the last revision applied here")
    );
}
