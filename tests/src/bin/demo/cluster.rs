//! `cargo xtask demo --cluster`: three lb hosts behind an ECMP router in namespaces (the test
//! bed of `lb_tests::cluster`): the router's multipath route to the VIP, traffic spread over the
//! hosts and the backends, one configuration for all hosts in etcd (a change through one host's
//! API reaching every host), one host dying while streams run (they go on through the others),
//! and a service losing all its backends (its VIP withdrawn from the router). Every figure is
//! measured in the run; everything is removed at the end, on error and on Ctrl-C.

use std::{
    net::{Ipv4Addr, SocketAddr},
    time::{Duration, Instant},
};

use anyhow::Context as _;
use lb_tests::{
    cluster::Cluster,
    daemon::{Daemon, Launch},
    etcd::Etcd,
    servers,
    traffic::{paced_streams, wait_progress},
};

use super::{checkpoint, print_indented, say};

const PORT: u16 = 8080;
const VIP: Ipv4Addr = Ipv4Addr::new(10, 100, 0, 1);
/// A second service on its own VIP whose backends the demo takes away.
const VIP2: Ipv4Addr = Ipv4Addr::new(10, 100, 0, 3);
const STREAMS: usize = 30;
/// etcd, in the router's namespace, and the key of the services' document.
const ETCD: &str = "10.1.0.1:2379";
const KEY: &str = "/lb/demo/config";
const CONNECTIONS: usize = 600;

pub fn run(unattended: bool) -> anyhow::Result<()> {
    lb_tests::require_root();
    say("1. the cluster (network namespaces, nothing outside them is touched):");
    println!(
        "   client 10.1.0.2 ── 10.1.0.1 [router: BIRD, ECMP over the hosts, L4 hash] ── 10.2.i.2 [lb host i: BIRD + lb]"
    );
    println!(
        "   hosts 10.3.0.11-13 ── bridge ── backends 10.3.0.101-103 (behind `lb decap`, {VIP} on lo),"
    );
    println!("   which answer the client through the router: direct server return");
    let mut c = Cluster::build(3, 3, PORT)?;
    let _decaps = c.serve_vip(VIP.into())?;
    let backends = c.backends_toml();
    let check = "[service.check]\nkind = \"tcp\"\ntimeout = \"200ms\"\ninterval = \"300ms\"\n\
                 unhealthy_threshold = 2\nhealthy_threshold = 2\n";
    let services = format!(
        "[[service]]\nname = \"web\"\nvip = \"{VIP}:{PORT}\"\nforwarding = \"gue\"\nbackends = [{backends}]\n{check}\n\
         [[service]]\nname = \"api\"\nvip = \"{VIP2}:{PORT}\"\nbackends = [{backends}]\n{check}"
    );
    say(&format!(
        "2. one configuration for the three hosts: the services in etcd (Debian's etcd-server, \
         in the router's namespace at {ETCD}), key {KEY}:"
    ));
    let etcd = Etcd::start(&c.router, ETCD.parse()?)?;
    let first = etcd.put(KEY, &services)?;
    print_indented(&services);
    let source = format!("etcd://{ETCD}/lb/demo");
    say(&format!(
        "   and on each host `lb run --config-source {source}` with a local file of its own [lb] \
         (host 0's; the others differ in interfaces):"
    ));
    print_indented(&c.lb_config(0, "1s", ""));
    let mut lbs: Vec<Option<Daemon>> = Vec::new();
    for i in 0..3 {
        lbs.push(Some(Daemon::start_with(
            &c.hosts[i].ns,
            &c.lb_config(i, "1s", ""),
            &Launch {
                args: &["--config-source", &source],
                ..Launch::default()
            },
        )?));
    }
    println!("   every host runs etcd revision {first}");
    for vip in [VIP, VIP2] {
        let took = c.wait_nexthops(vip, &[0, 1, 2], Duration::from_secs(30))?;
        println!(
            "   {vip} announced by all three hosts, at the router {took:.1?} after lb started"
        );
    }
    checkpoint()?;

    say("3. the router's route to the VIP (BIRD merged the three hosts' announcements):");
    print_indented(&c.router.ip(&["route", "show", &format!("{VIP}/32")])?);

    say(&format!(
        "4. {CONNECTIONS} new connections from the client to {VIP}:{PORT}: the router spreads them \
         over the hosts, each host's Maglev over the backends"
    ));
    let seen = servers::spread(&c.client, SocketAddr::from((VIP, PORT)), CONNECTIONS);
    let mut names: Vec<&String> = seen.keys().collect();
    names.sort();
    for (i, lb) in lbs.iter().enumerate() {
        let status = lb.as_ref().context("lb")?.status()?;
        let web = status.service("web").context("web")?;
        let per: Vec<String> = web
            .backends
            .iter()
            .map(|b| format!("{} {}", b.address, b.new_flows))
            .collect();
        println!(
            "   host {i}: {} connections ({})",
            web.new_flows,
            per.join(", ")
        );
    }
    let counts: Vec<String> = names.iter().map(|n| format!("{n} {}", seen[*n])).collect();
    println!("   answered by: {}", counts.join(", "));
    checkpoint()?;

    let b0 = format!("{}:{PORT}", c.backends[0].addr);
    say(&format!(
        "4b. a change through host 2's API, written to etcd: `lb backend set web {b0} --weight 3`"
    ));
    let changed = Instant::now();
    let out = lbs[2]
        .as_ref()
        .context("lb")?
        .lb(&["backend", "set", "web", &b0, "--weight", "3"]);
    print_indented(String::from_utf8_lossy(&out.stdout).trim_end());
    let revision = lbs[2]
        .as_ref()
        .context("lb")?
        .status()?
        .config
        .context("config")?
        .version;
    for (i, lb) in lbs.iter().enumerate() {
        let lb = lb.as_ref().context("lb")?;
        let deadline = Instant::now() + Duration::from_secs(10);
        while lb.status()?.config.context("config")?.version != revision {
            anyhow::ensure!(
                Instant::now() < deadline,
                "host {i} did not apply {revision}"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        println!(
            "   host {i} runs revision {revision} ({:.0} ms after the command)",
            changed.elapsed().as_secs_f64() * 1000.0
        );
    }
    checkpoint()?;

    say(&format!(
        "5. {STREAMS} long-lived streams (a 1 KiB echo every 50 ms each, checked), then host 1 \
         dies: its link to the router is cut"
    ));
    let streams = paced_streams(&c.client, SocketAddr::from((VIP, PORT)), STREAMS)?;
    wait_progress(&streams, 4096, Duration::from_secs(15));
    let through = lbs[1].as_ref().context("lb")?.status()?;
    let before = through.service("web").context("web")?.new_flows;
    let cut = Instant::now();
    c.cut_host(1)?;
    let took = c.wait_nexthops(VIP, &[0, 2], Duration::from_secs(10))?;
    println!(
        "   the router dropped host 1 from the route {took:.1?} after the cut (host 1 had taken \
         {before} connections, some of these streams among them):"
    );
    print_indented(&c.router.ip(&["route", "show", &format!("{VIP}/32")])?);
    wait_progress(&streams, 8192, Duration::from_secs(15));
    let picked: u64 = [0, 2]
        .iter()
        .filter_map(|&i| lbs[i].as_ref()?.status().ok())
        .flat_map(|s| s.counters.into_iter())
        .filter(|c| c.name == "ct_miss_midstream")
        .map(|c| c.value)
        .sum();
    let mut intact = 0;
    let mut broken = Vec::new();
    for s in streams {
        match s.finish() {
            Ok(_) => intact += 1,
            Err(e) => broken.push(e),
        }
    }
    println!(
        "   {:.1} s later: {intact} of {STREAMS} streams intact; hosts 0 and 2 picked up {picked} \
         mid-stream packets of the moved ones and sent them to the same backends (Maglev)",
        cut.elapsed().as_secs_f64()
    );
    for e in &broken {
        println!("   broken: {e}");
    }
    lbs[1] = None;
    checkpoint()?;

    say(&format!(
        "6. every backend's servers stopped: the api service ({VIP2}) has none left, and neither \
         has web"
    ));
    for i in 0..c.backends.len() {
        c.stop_backend(i);
    }
    let stopped = Instant::now();
    let gone = wait_gone(&c, VIP2, Duration::from_secs(20))?;
    println!(
        "   {VIP2} gone from the router's table {:.2} s after the servers stopped (the checks' \
         failure window, then the hosts' withdrawals); the events on host 0:",
        gone.duration_since(stopped).as_secs_f64()
    );
    let events = lbs[0].as_ref().context("lb")?.lb(&["events"]);
    for line in String::from_utf8_lossy(&events.stdout)
        .lines()
        .filter(|l| l.contains("VIP"))
    {
        println!("   {line}");
    }
    say("7. the router's table now:");
    print_indented(&c.router.ip(&["route", "show"])?);
    if !unattended {
        say("press Enter to clean up (Ctrl-C works too)");
        let mut line = String::new();
        let _ = std::io::stdin().read_line(&mut line);
    }
    if !broken.is_empty() {
        anyhow::bail!("{} streams broke when host 1 died", broken.len());
    }
    Ok(())
}

/// Waits until the router has no route to `vip`; when it went.
fn wait_gone(c: &Cluster, vip: Ipv4Addr, limit: Duration) -> anyhow::Result<Instant> {
    let deadline = Instant::now() + limit;
    loop {
        if c.nexthops(vip)?.is_empty() {
            return Ok(Instant::now());
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "{vip} still routed after {limit:?}"
        );
        checkpoint()?;
        std::thread::sleep(Duration::from_millis(2));
    }
}
