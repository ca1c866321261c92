//! Several lb hosts behind an ECMP router (the scale-out issue), end to end in namespaces: a
//! router running BIRD with `merge paths` and the kernel's L4 multipath hash, three lb hosts
//! each running BIRD (docs/bird.conf) and `lb run` announcing its VIPs while healthy, backends
//! behind the hosts (direct server return: `lb decap`, the VIP on `lo`, answers to the clients
//! through the router; full NAT: answers back to the host whose SNAT address the flow has).
//! The figures (convergence, withdrawal, streams broken) are printed; run with `--nocapture`.

use std::{
    collections::HashMap,
    net::{Ipv4Addr, SocketAddr},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use lb_tests::{
    cluster::Cluster,
    daemon::Daemon,
    decap::DecapGuard,
    require_root,
    routewatch::RouteWatch,
    servers,
    traffic::{PacedStream, paced_streams, wait_progress},
};

const PORT: u16 = 8080;
const DSR_VIP: Ipv4Addr = Ipv4Addr::new(10, 100, 0, 1);
const NAT_VIP: Ipv4Addr = Ipv4Addr::new(10, 100, 0, 2);
/// BIRD's route protocol number: what the router's BIRD installs its routes with.
const RTPROT_BIRD: u8 = 12;
const MAIN_TABLE: u32 = 254;

fn check() -> &'static str {
    "[service.check]\nkind = \"tcp\"\ntimeout = \"200ms\"\ninterval = \"300ms\"\n\
     unhealthy_threshold = 2\nhealthy_threshold = 2\n"
}

/// A DSR service (GUE) on [`DSR_VIP`] and a full-NAT one on [`NAT_VIP`], over every backend.
fn services(c: &Cluster) -> String {
    let b = c.backends_toml();
    format!(
        "[[service]]\nname = \"dsr\"\nvip = \"{DSR_VIP}:{PORT}\"\nforwarding = \"gue\"\nbackends = [{b}]\n{}\n\
         [[service]]\nname = \"nat\"\nvip = \"{NAT_VIP}:{PORT}\"\nbackends = [{b}]\n{}",
        check(),
        check()
    )
}

struct Bed {
    c: Cluster,
    lbs: Vec<Option<Daemon>>,
    _decaps: Vec<DecapGuard>,
}

/// The cluster with lb on every host (grace `grace`), both VIPs announced by all.
fn bed(grace: &str) -> Bed {
    require_root();
    let mut c = Cluster::build(3, 3, PORT).unwrap();
    let decaps = c.serve_vip(DSR_VIP.into()).unwrap();
    let lbs = (0..3)
        .map(|i| {
            Some(Daemon::start(&c.hosts[i].ns, &c.lb_config(i, grace, &services(&c))).unwrap())
        })
        .collect();
    let bed = Bed {
        c,
        lbs,
        _decaps: decaps,
    };
    for vip in [DSR_VIP, NAT_VIP] {
        let took = bed
            .c
            .wait_nexthops(vip, &[0, 1, 2], Duration::from_secs(30))
            .unwrap();
        eprintln!("{vip}: announced by all three hosts {took:?} after they started");
    }
    bed
}

impl Bed {
    fn lb(&self, i: usize) -> &Daemon {
        self.lbs[i].as_ref().expect("lb running on that host")
    }

    /// (new flows of `service` on host `i`, per backend name).
    fn flows(&self, i: usize, service: &str) -> (u64, HashMap<String, u64>) {
        let status = self.lb(i).status().unwrap();
        let s = status.service(service).unwrap();
        let per = s
            .backends
            .iter()
            .map(|b| {
                let name = self
                    .c
                    .backends
                    .iter()
                    .find(|x| b.address.starts_with(&x.addr.to_string()))
                    .map(|x| x.name.clone())
                    .unwrap_or_default();
                (name, b.new_flows)
            })
            .collect();
        (s.new_flows, per)
    }

    fn counter(&self, i: usize, name: &str) -> u64 {
        let status = self.lb(i).status().unwrap();
        status
            .counters
            .iter()
            .find(|c| c.name == name)
            .map_or(0, |c| c.value)
    }

    fn wait_all_hosts(&self, service: &str, backend: usize, state: &str) {
        let at = format!("{}:{PORT}", self.c.backends[backend].addr);
        for lb in self.lbs.iter().flatten() {
            lb.wait_state(service, &at, state, Duration::from_secs(20));
        }
    }

    fn streams(&self, vip: Ipv4Addr, n: usize) -> Vec<PacedStream> {
        paced_streams(&self.c.client, SocketAddr::from((vip, PORT)), n).unwrap()
    }
}

fn progress(streams: &[PacedStream], more: usize, limit: Duration) {
    wait_progress(streams, more, limit);
}

/// Finishes the streams: (how many stayed intact, why the others broke).
fn finish(streams: Vec<PacedStream>) -> (usize, Vec<String>) {
    let mut ok = 0;
    let mut broken = Vec::new();
    for s in streams {
        match s.finish() {
            Ok(_) => ok += 1,
            Err(e) => broken.push(e),
        }
    }
    (ok, broken)
}

/// New connections to `vip` every 20 ms (1 s timeout each) while the flag is up: the times
/// (Unix) of those that failed.
fn prober(c: &Cluster, vip: Ipv4Addr, on: Arc<AtomicBool>) -> std::thread::JoinHandle<Vec<f64>> {
    let client = c.client.clone();
    std::thread::spawn(move || {
        let mut failures = Vec::new();
        while on.load(Ordering::Relaxed) {
            let t = unix_now();
            let ok = client.enter(|| {
                std::net::TcpStream::connect_timeout(
                    &SocketAddr::from((vip, PORT)),
                    Duration::from_secs(1),
                )
                .is_ok()
            });
            if !ok {
                failures.push(t);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        failures
    })
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

#[test]
fn the_router_spreads_connections_over_the_hosts_and_maglev_over_the_backends() {
    let b = bed("1s");
    let n = 3000;
    let seen = servers::spread(&b.c.client, SocketAddr::from((DSR_VIP, PORT)), n);
    let mut per_host = Vec::new();
    for i in 0..3 {
        let (total, per_backend) = b.flows(i, "dsr");
        eprintln!("host {i}: {total} of {n} connections, per backend {per_backend:?}");
        assert!(
            (total as f64 / n as f64 - 1.0 / 3.0).abs() < 0.08,
            "host {i} took {total} of {n}"
        );
        for (name, flows) in &per_backend {
            assert!(*flows > 0, "host {i} sent nothing to {name}");
        }
        per_host.push(total);
    }
    assert_eq!(per_host.iter().sum::<u64>(), n as u64);
    for (name, count) in &seen {
        assert!(
            (*count as f64 / n as f64 - 1.0 / 3.0).abs() < 0.05,
            "{name}: {count} of {n} ({seen:?})"
        );
    }
}

#[test]
fn a_dead_backend_moves_its_flows_and_a_service_without_backends_is_withdrawn_within_a_second() {
    let mut b = bed("1s");
    let watch = RouteWatch::start(&b.c.router, MAIN_TABLE, RTPROT_BIRD).unwrap();
    b.c.stop_backend(0);
    b.wait_all_hosts("dsr", 0, "unhealthy");
    // Still announced by every host: one backend down does not withdraw.
    assert_eq!(b.c.nexthops(DSR_VIP).unwrap().len(), 3);
    let seen = servers::spread(&b.c.client, SocketAddr::from((DSR_VIP, PORT)), 300);
    assert!(!seen.contains_key("backend-0"), "{seen:?}");
    assert_eq!(seen.values().sum::<usize>(), 300);
    // The others go too: no host can serve the VIPs.
    b.c.stop_backend(1);
    b.c.stop_backend(2);
    for i in 1..3 {
        b.wait_all_hosts("dsr", i, "unhealthy");
    }
    let gone = watch
        .wait(DSR_VIP.into(), false, Duration::from_secs(10))
        .expect("the VIP withdrawn at the router");
    // The last verdict: the latest of the hosts' moves of their last backend to unhealthy.
    let mut last = 0.0f64;
    for h in 0..3 {
        for k in 0..3 {
            let at = format!("{}:{PORT}", b.c.backends[k].addr);
            if let Some(t) = b.lb(h).moved_at("dsr", &at, "unhealthy") {
                last = last.max(t);
            }
        }
    }
    let took = gone - last;
    eprintln!(
        "{DSR_VIP} gone from the router's table {:.1} ms after the last host's last verdict",
        took * 1e3
    );
    assert!(took < 1.0, "withdrawn {took:.3} s after the last verdict");
    assert!(b.c.nexthops(NAT_VIP).unwrap().is_empty());
    // One backend back: announced again.
    b.c.start_backend(1).unwrap();
    b.wait_all_hosts("dsr", 1, "healthy");
    b.c.wait_nexthops(DSR_VIP, &[0, 1, 2], Duration::from_secs(10))
        .unwrap();
}

#[test]
fn a_dead_host_loses_no_dsr_stream_and_only_nat_streams_break() {
    let b = bed("1s");
    let dsr = b.streams(DSR_VIP, 100);
    let nat = b.streams(NAT_VIP, 100);
    progress(&dsr, 4096, Duration::from_secs(10));
    progress(&nat, 4096, Duration::from_secs(10));
    let (dsr_before, _) = b.flows(1, "dsr");
    let (nat_before, _) = b.flows(1, "nat");
    assert!(dsr_before > 10 && nat_before > 10, "host 1 carries streams");
    let on = Arc::new(AtomicBool::new(true));
    let probe = prober(&b.c, DSR_VIP, on.clone());
    std::thread::sleep(Duration::from_millis(300));
    // Host 1 dies: its link to the router goes down.
    let cut = unix_now();
    b.c.cut_host(1).unwrap();
    let took =
        b.c.wait_nexthops(DSR_VIP, &[0, 2], Duration::from_secs(10))
            .unwrap();
    progress(&dsr, 8192, Duration::from_secs(15));
    on.store(false, Ordering::Relaxed);
    let failures = probe.join().unwrap();
    let (dsr_ok, dsr_broken) = finish(dsr);
    let (nat_ok, nat_broken) = finish(nat);
    let moved: u64 = [0, 2]
        .iter()
        .map(|&i| b.counter(i, "ct_miss_midstream"))
        .sum();
    eprintln!(
        "host 1 ({dsr_before} DSR and {nat_before} NAT connections) cut: the router's route \
         without it {took:?} later; new connections failed {} times, the last {:.0} ms after \
         the cut; DSR streams intact {dsr_ok}/100 ({moved} mid-stream packets picked up by \
         the other hosts); NAT streams intact {nat_ok}/100",
        failures.len(),
        failures.iter().map(|t| (t - cut) * 1e3).fold(0.0, f64::max)
    );
    assert!(dsr_broken.is_empty(), "DSR streams broke: {dsr_broken:?}");
    assert!(moved > 0, "no stream moved to another host");
    // Full NAT: the streams through the dead host break (its SNAT address is gone), those of
    // the others go on. The kernel's multipath is hash-threshold: with the middle one of three
    // next hops gone, the other two keep their parts of the hash space, so no surviving
    // host's flow moves; with the first or last gone, some would move to the other survivor
    // and, under full NAT, break too (under DSR they go on).
    assert_eq!(
        nat_broken.len() as u64,
        nat_before,
        "full-NAT streams broken: {nat_broken:?}"
    );
}

#[test]
fn an_added_host_takes_its_share_and_dsr_streams_that_move_to_it_go_on() {
    let b = bed("1s");
    b.c.cut_host(2).unwrap();
    b.c.wait_nexthops(DSR_VIP, &[0, 1], Duration::from_secs(10))
        .unwrap();
    let dsr = b.streams(DSR_VIP, 60);
    progress(&dsr, 4096, Duration::from_secs(10));
    let before = b.counter(2, "ct_miss_midstream");
    b.c.restore_host(2).unwrap();
    let took =
        b.c.wait_nexthops(DSR_VIP, &[0, 1, 2], Duration::from_secs(20))
            .unwrap();
    progress(&dsr, 8192, Duration::from_secs(15));
    let (ok, broken) = finish(dsr);
    let picked = b.counter(2, "ct_miss_midstream") - before;
    eprintln!(
        "host 2 back: announced at the router {took:?} after its link came up; {picked} \
         mid-stream packets of moved streams picked up by it; streams intact {ok}/60"
    );
    assert!(broken.is_empty(), "{broken:?}");
    assert!(picked > 0, "no stream moved to the added host");
}

#[test]
fn lb_stop_withdraws_first_and_no_dsr_stream_breaks_in_its_grace_period() {
    let mut b = bed("2s");
    let dsr = b.streams(DSR_VIP, 60);
    progress(&dsr, 4096, Duration::from_secs(10));
    let (through, _) = b.flows(1, "dsr");
    assert!(through > 0);
    let mut lb = b.lbs[1].take().unwrap();
    let stopping = {
        let ns = lb.ns.clone();
        let api = lb.api.clone();
        std::thread::spawn(move || {
            ns.command(lb_tests::lb_bin())
                .args(["stop", "--api", &api])
                .output()
                .unwrap()
        })
    };
    let took =
        b.c.wait_nexthops(DSR_VIP, &[0, 2], Duration::from_secs(10))
            .unwrap();
    assert!(
        lb.process.running(),
        "lb ended before its VIPs left the router"
    );
    let out = stopping.join().unwrap();
    assert!(out.status.success(), "{out:?}");
    progress(&dsr, 8192, Duration::from_secs(15));
    let (ok, broken) = finish(dsr);
    eprintln!(
        "lb stop on host 1 ({through} of the streams through it): its VIPs left the router \
         {took:?} after the command, lb stopped after its grace; streams intact {ok}/60"
    );
    assert!(broken.is_empty(), "{broken:?}");
    assert_eq!(lb.stop(libc::SIGTERM), Some(0));
}
