//! Route health injection end to end, with real BIRD 2. A "router" namespace (the sandbox's
//! client) peers over BGP with the lb host, where BIRD runs docs/bird.conf (its example
//! addresses replaced) and `lb run` keeps the announced VIPs in kernel table 200. The router's
//! BIRD installs what it learns into its kernel's main table, where a watcher stamps each route
//! as it comes and goes (rtnetlink notifications). Backends are the sandbox's real servers.
//!
//! Measured and checked: a VIP whose backends all die is withdrawn at the router within 1 s of
//! the daemon's verdict (each round printed, with min/median/max), and announced again when one
//! comes back; `always` stays, `never` never appears; the status page (Chromium) follows without
//! a reload; drain-host withdraws and lb keeps
//! forwarding, undrain-host announces again, and a drained host stays drained across a
//! restart; a reload changes the services' settings, not the table; a restart (SIGTERM, then
//! `lb run` on the pinned datapath) keeps the routes without a withdraw in between; `lb stop`
//! withdraws while lb still runs and forwards, then stops after the grace period; after kill -9
//! the routes stay (and traffic flows), and `lb stop` without a daemon withdraws them; with
//! docs/bird.conf's BFD a host gone silent leaves the router's table within a second.

use std::{
    net::{IpAddr, SocketAddr},
    path::Path,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use lb::announce::{KernelTable, ROUTE_PROTOCOL, RouteTable};
use lb_tests::{
    bird::{self, Bird},
    daemon::{Daemon, PinGuard},
    lb_bin,
    netns::{Netns, sh},
    require_root,
    routewatch::RouteWatch,
    servers,
    topology::{Arms, Sandbox},
    webcheck::Browser,
};

const TABLE: u32 = 200;
/// The router's kernel table BIRD installs into, and BIRD's route protocol there.
const MAIN: u32 = 254;
const RTPROT_BIRD: u8 = 12;
const HOST: &str = "10.0.1.1";
const ROUTER: &str = "10.0.1.2";
const WEB: &str = "10.100.0.1";
const ALWAYS: &str = "10.100.0.2";
const NEVER: &str = "10.100.0.3";
const WEB6: &str = "2001:db8:100::1";
/// How long an expected event may take to show in `lb events`.
const WAIT: Duration = Duration::from_secs(3);
/// How long the router may take to drop a withdrawn VIP after the daemon's verdict.
const BOUND: f64 = 1.0;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// Sandbox, the router's BIRD (in the client's namespace) and the host's, the session up.
struct Bed {
    // Dropped in this order: the watcher, the BIRDs (by pid), then the namespaces.
    routes: RouteWatch,
    host_bird: Bird,
    router_bird: Bird,
    sb: Sandbox,
}

fn bed() -> Bed {
    let sb = Sandbox::build(Arms::Two, 2, 8080).expect("sandbox");
    // The client is the router: it reaches the VIPs by what BGP tells it, nothing else.
    let router = &sb.client.ns;
    router.ip(&["route", "del", "10.100.0.0/24"]).unwrap();
    router
        .ip(&["-6", "route", "del", "2001:db8:100::/64"])
        .unwrap();
    let routes = RouteWatch::start(router, MAIN, RTPROT_BIRD).expect("route watcher");
    let router_bird =
        Bird::start(router, &bird::router_config(ROUTER, HOST)).expect("the router's BIRD");
    let host_bird = Bird::start(
        &sb.lb,
        &bird::host_config(HOST, ROUTER).expect("docs/bird.conf"),
    )
    .expect("the lb host's BIRD");
    router_bird
        .wait_up("lbhost", Duration::from_secs(20))
        .expect("BGP session");
    host_bird
        .wait_up("upstream", Duration::from_secs(5))
        .expect("BGP session");
    Bed {
        routes,
        host_bird,
        router_bird,
        sb,
    }
}

const CHECK: &str = "[service.check]\ntimeout = \"200ms\"\ninterval = \"300ms\"\nhealthy_threshold = 1\nunhealthy_threshold = 2\n";

/// Four services over the two backends: "web" (announce healthy, the default), its IPv6 twin
/// "web6", "always" and "never", each on a VIP of its own.
fn config(sb: &Sandbox, pin: &str, grace: &str) -> String {
    let list = |v6: bool| {
        sb.backends
            .iter()
            .map(|b| {
                let ip: IpAddr = if v6 { b.addr6.into() } else { b.addr.into() };
                format!("{{ address = \"{}\" }}", SocketAddr::new(ip, 8080))
            })
            .collect::<Vec<_>>()
            .join(", ")
    };
    let (v4, v6) = (list(false), list(true));
    format!(
        "[lb]\ninterfaces = [{}]\nxdp_mode = \"native\"\npin_path = \"{pin}\"\n\n\
         [lb.announce]\ntable = {TABLE}\ngrace = \"{grace}\"\n\n\
         [[service]]\nname = \"web\"\nvip = \"{WEB}:80\"\nbackends = [{v4}]\n{CHECK}\n\
         [[service]]\nname = \"web6\"\nvip = \"[{WEB6}]:80\"\nannounce = \"healthy\"\nbackends = [{v6}]\n{CHECK}\n\
         [[service]]\nname = \"always\"\nvip = \"{ALWAYS}:80\"\nannounce = \"always\"\nbackends = [{v4}]\n{CHECK}\n\
         [[service]]\nname = \"never\"\nvip = \"{NEVER}:80\"\nannounce = \"never\"\nbackends = [{v4}]\n{CHECK}",
        sb.interfaces_toml()
    )
}

/// Waits until every backend of "web" shows `state`.
fn wait_web(daemon: &Daemon, sb: &Sandbox, state: &str) {
    for b in &sb.backends {
        daemon.wait_state(
            "web",
            &format!("{}:8080", b.addr),
            state,
            Duration::from_secs(10),
        );
    }
}

/// The VIPs lb's protocol routes in table 200 of `ns`.
fn lb_routes(ns: &Netns) -> Vec<IpAddr> {
    ns.enter(|| KernelTable::open(TABLE).and_then(|mut t| t.list()))
        .expect("reading table 200")
        .into_iter()
        .collect()
}

/// The last event of a VIP moving to `to` ("announced", "withdrawn") since `after`, waiting
/// for it at most `limit`.
fn vip_event(
    daemon: &Daemon,
    vip: &str,
    to: &str,
    after: f64,
    limit: Duration,
) -> Option<lb::model::Event> {
    let deadline = Instant::now() + limit;
    loop {
        let found = daemon.events().ok().and_then(|e| {
            e.events
                .into_iter()
                .rev()
                .find(|e| e.vip.as_deref() == Some(vip) && e.to == to && e.time >= after)
        });
        if found.is_some() || Instant::now() > deadline {
            return found;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// When the last of "web"'s backends moved to `to` since `after` (the verdict that changed the
/// VIP's availability), by the daemon's own events; or the first, with `first`.
fn verdict_time(daemon: &Daemon, to: &str, after: f64, first: bool) -> f64 {
    let events = daemon.events().expect("events").events;
    let times = events
        .iter()
        .filter(|e| e.service == "web" && e.to == to && e.time >= after)
        .map(|e| e.time);
    let t = if first {
        times.reduce(f64::min)
    } else {
        times.reduce(f64::max)
    };
    t.unwrap_or_else(|| panic!("no verdict of web -> {to} since {after}"))
}

/// A TCP connection to `vip`:80 from the router: the backend's greeting.
fn greeting(router: &Netns, vip: &str) -> String {
    servers::connect(router, SocketAddr::new(ip(vip), 80))
        .map(|(_, name)| name)
        .unwrap_or_else(|e| panic!("connecting to {vip}: {e:#}"))
}

/// Forwarding by the host whatever BGP says: a static route to the host for `vip` while `f`
/// runs (protocol static, which the watcher ignores).
fn through_the_host<T>(router: &Netns, vip: &str, f: impl FnOnce() -> T) -> T {
    let dst = format!("{vip}/32");
    router
        .ip(&[
            "route", "add", &dst, "via", HOST, "proto", "static", "metric", "4000",
        ])
        .unwrap();
    let out = f();
    router
        .ip(&[
            "route", "del", &dst, "via", HOST, "proto", "static", "metric", "4000",
        ])
        .unwrap();
    out
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn stats(name: &str, v: &[f64]) -> String {
    let mut sorted = v.to_vec();
    let med = median(&mut sorted);
    format!(
        "{name}: {} ms; min {:.1} ms, median {:.1} ms, max {:.1} ms",
        v.iter()
            .map(|s| format!("{:.1}", s * 1e3))
            .collect::<Vec<_>>()
            .join(", "),
        sorted[0] * 1e3,
        med * 1e3,
        sorted[sorted.len() - 1] * 1e3
    )
}

/// The lb host's table written and read over rtnetlink, without BIRD: blackhole host routes of
/// protocol 250, both families, a table beyond 255; other routes left alone.
#[test]
fn the_kernel_table() {
    require_root();
    let ns = Netns::new("rt").unwrap();
    let (v4, v6, other, elsewhere) = (ip(WEB), ip(WEB6), ip("10.100.0.9"), ip("10.100.0.8"));
    // A table that does not exist yet holds nothing.
    assert!(lb_routes(&ns).is_empty());
    ns.enter(|| -> std::io::Result<()> {
        let mut t = KernelTable::open(TABLE)?;
        t.add(v4)?;
        t.add(v4)?; // again: replaced, no error
        t.add(v6)?;
        Ok(())
    })
    .unwrap();
    // Routes of another protocol in the table, and of lb's in another table, are not lb's.
    ns.ip(&[
        "route",
        "add",
        "blackhole",
        "10.100.0.9/32",
        "table",
        "200",
        "proto",
        "static",
    ])
    .unwrap();
    ns.ip(&[
        "route",
        "add",
        "blackhole",
        "10.100.0.8/32",
        "table",
        "201",
        "proto",
        "250",
    ])
    .unwrap();
    assert_eq!(lb_routes(&ns), [v4, v6]);
    let shown = ns.ip(&["route", "show", "table", "200"]).unwrap();
    assert!(shown.contains("blackhole 10.100.0.1 proto 250"), "{shown}");
    let shown6 = ns.ip(&["-6", "route", "show", "table", "200"]).unwrap();
    assert!(
        shown6.contains("blackhole 2001:db8:100::1 dev lo proto 250"),
        "{shown6}"
    );
    ns.enter(|| -> std::io::Result<()> {
        let mut t = KernelTable::open(TABLE)?;
        t.remove(v4)?;
        t.remove(v4)?; // gone already: fine
        t.remove(other)?; // not lb's: not removed (its protocol differs)
        Ok(())
    })
    .unwrap();
    assert_eq!(lb_routes(&ns), [v6]);
    assert!(
        ns.ip(&["route", "show", "table", "200"])
            .unwrap()
            .contains("10.100.0.9")
    );
    // A table id beyond a byte travels in RTA_TABLE.
    let big = 4_000_000_000u32;
    let listed = ns
        .enter(|| -> std::io::Result<Vec<IpAddr>> {
            let mut t = KernelTable::open(big)?;
            t.add(v4)?;
            Ok(t.list()?.into_iter().collect())
        })
        .unwrap();
    assert_eq!(listed, [v4]);
    assert!(
        ns.ip(&["route", "show", "table", &big.to_string()])
            .unwrap()
            .contains("blackhole 10.100.0.1 proto 250")
    );
    // `lb stop` without a daemon: lb's routes of the table go, nothing else.
    let flushed = ns.enter(|| lb::announce::flush(TABLE)).unwrap();
    assert_eq!(flushed, [v6]);
    assert!(lb_routes(&ns).is_empty());
    assert!(
        ns.ip(&["route", "show", "table", "200"])
            .unwrap()
            .contains("10.100.0.9")
    );
    assert!(
        ns.ip(&["route", "show", "table", "201"])
            .unwrap()
            .contains(&elsewhere.to_string())
    );
    assert_eq!(ROUTE_PROTOCOL, 250);
}

/// Health moves the route: the router drops the VIP within 1 s of the daemon's verdict that
/// its last backend died, and installs it again when one comes back; `always` stays, `never`
/// never shows.
#[test]
fn health_moves_the_route_at_the_router() {
    require_root();
    let _one = lb_tests::timing_sensitive();
    let mut bed = bed();
    let pin = PinGuard::unique();
    let daemon = Daemon::start_pinned(&bed.sb.lb, &config(&bed.sb, &pin.0, "1s")).expect("lb");
    let routes = &bed.routes;
    for vip in [WEB, ALWAYS, WEB6] {
        routes
            .wait(ip(vip), true, Duration::from_secs(15))
            .unwrap_or_else(|| panic!("{vip} never reached the router\n{}", daemon.log_text()));
    }
    wait_web(&daemon, &bed.sb, "healthy");
    let router = bed.sb.client.ns.clone();
    assert!(greeting(&router, WEB).starts_with("backend-"));
    let shown = bed.router_bird.birdc(&["show", "route"]).unwrap();
    eprintln!("the router's BIRD:\n{shown}");
    assert!(
        shown.contains("10.100.0.1/32") && shown.contains("via 10.0.1.1"),
        "{shown}"
    );

    // What the daemon says.
    let status = daemon.status().unwrap();
    let a = status
        .announce
        .as_ref()
        .expect("the host's announcing state");
    assert_eq!(
        (a.state.as_str(), a.table, a.protocol),
        ("announcing", TABLE, 250)
    );
    let web = status.service("web").unwrap();
    assert_eq!(
        (
            web.announce.as_deref(),
            web.announce_min_available,
            web.vip_announced
        ),
        (Some("healthy"), Some(1), Some(true))
    );
    let never = status.service("never").unwrap();
    assert_eq!(
        (never.announce.as_deref(), never.vip_announced),
        (Some("never"), Some(false))
    );
    let text = String::from_utf8_lossy(&daemon.lb(&["status"]).stdout).into_owned();
    eprintln!("lb status:\n{text}");
    assert!(
        text.contains("host: announcing, 3 of 4 VIPs announced in table 200 (proto 250)"),
        "{text}"
    );
    assert!(
        text.contains("announce healthy (at least 1 available): VIP announced"),
        "{text}"
    );
    assert!(text.contains("announce never: VIP withdrawn"), "{text}");
    let (_, metrics) = daemon.http("GET", "http://127.0.0.1:9090/metrics", &[]);
    for line in [
        "lb_vip_announced{vip=\"10.100.0.1\"} 1",
        "lb_vip_announced{vip=\"10.100.0.3\"} 0",
        "lb_host_announce_state{state=\"announcing\"} 1",
    ] {
        assert!(metrics.lines().any(|l| l == line), "{line}\n{metrics}");
    }
    assert!(metrics.contains("lb_vip_announce_last_change_timestamp_seconds{vip=\"10.100.0.1\"} "));

    // Rounds of every backend dying and coming back.
    let (mut withdrawn, mut in_lb, mut announced) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..5 {
        let start = unix_now();
        for i in 0..bed.sb.backends.len() {
            bed.sb.stop_backend(i);
        }
        // The verdicts first (their time depends on the checks and the machine's load), then
        // the route, which must follow them.
        wait_web(&daemon, &bed.sb, "unhealthy");
        let gone = routes
            .wait(ip(WEB), false, Duration::from_secs(5))
            .unwrap_or_else(|| {
                panic!(
                    "round {round}: {WEB} still at the router\n{}",
                    daemon.log_text()
                )
            });
        let verdict = verdict_time(&daemon, "unhealthy", start, false);
        let event = vip_event(&daemon, WEB, "withdrawn", start, WAIT).expect("a withdraw event");
        assert_eq!(
            event.reason.as_deref(),
            Some("web: 0 of 2 backends available (needs 1)")
        );
        routes
            .wait(ip(WEB6), false, Duration::from_secs(5))
            .expect("web6 withdrawn too");
        assert!(routes.present(ip(ALWAYS)), "announce = always stays");
        eprintln!(
            "round {round}: verdict {verdict:.3}, withdraw event +{:.1} ms, gone at the router +{:.1} ms",
            (event.time - verdict) * 1e3,
            (gone - verdict) * 1e3
        );
        in_lb.push(event.time - verdict);
        withdrawn.push(gone - verdict);

        let start = unix_now();
        bed.sb.start_backend(0).unwrap();
        daemon.wait_state(
            "web",
            &format!("{}:8080", bed.sb.backends[0].addr),
            "healthy",
            Duration::from_secs(20),
        );
        let back = routes
            .wait(ip(WEB), true, Duration::from_secs(5))
            .unwrap_or_else(|| panic!("round {round}: {WEB} not announced again"));
        let verdict = verdict_time(&daemon, "healthy", start, true);
        announced.push(back - verdict);
        let event = vip_event(&daemon, WEB, "announced", start, WAIT).expect("an announce event");
        assert_eq!(
            event.reason.as_deref(),
            Some("web: 1 of 2 backends available (needs 1)")
        );
        bed.sb.start_backend(1).unwrap();
        wait_web(&daemon, &bed.sb, "healthy");
        routes
            .wait(ip(WEB6), true, Duration::from_secs(5))
            .expect("web6 back");
    }
    eprintln!("{}", stats("verdict -> withdraw event in lb", &in_lb));
    eprintln!(
        "{}",
        stats("verdict -> route gone at the router", &withdrawn)
    );
    eprintln!(
        "{}",
        stats("verdict -> route back at the router", &announced)
    );
    for (i, t) in withdrawn.iter().enumerate() {
        assert!(
            *t > 0.0 && *t <= BOUND,
            "round {i}: {t:.3} s after the verdict"
        );
    }
    for t in &announced {
        assert!(
            *t > 0.0 && *t <= BOUND,
            "announced {t:.3} s after the verdict"
        );
    }
    assert!(greeting(&router, WEB).starts_with("backend-"));

    // The status page follows without a reload: the banner's VIP and the host's line.
    let mut page = Browser::open(
        Some(&bed.sb.lb),
        "http://127.0.0.1:9090/v1/healthcheck",
        1200,
        900,
    )
    .expect("chromium");
    let banner = "document.querySelector('table[data-service=web]').closest('section').querySelector('[data-f=announce]').textContent";
    page.wait_for(
        &format!("Number(document.body.dataset.updates) >= 1 && {banner} === 'VIP announced'"),
        Duration::from_secs(20),
    )
    .expect("the banner says the VIP is announced");
    for i in 0..bed.sb.backends.len() {
        bed.sb.stop_backend(i);
    }
    routes
        .wait(ip(WEB), false, Duration::from_secs(5))
        .expect("withdrawn");
    let host = page
        .wait_for(
            &format!("{banner} === 'VIP withdrawn' && document.getElementById('host').textContent"),
            Duration::from_secs(5),
        )
        .expect("the banner follows the withdrawal");
    assert_eq!(
        host, "Host: announcing — 1 of 4 VIPs announced (table 200)",
        "the host's line"
    );
    let listed = page
        .eval("document.getElementById('events').textContent")
        .unwrap();
    assert!(
        listed
            .as_str()
            .unwrap_or_default()
            .contains("VIP 10.100.0.1 announced → withdrawn (announce: web: 0 of 2"),
        "{listed}"
    );
    drop(page);
    for i in 0..bed.sb.backends.len() {
        bed.sb.start_backend(i).unwrap();
    }
    routes
        .wait(ip(WEB), true, Duration::from_secs(5))
        .expect("announced again");

    // `never` was never announced, anywhere.
    assert!(routes.changes_of(ip(NEVER)).is_empty());
    assert!(!lb_routes(&bed.sb.lb).contains(&ip(NEVER)));
    assert!(
        !bed.host_bird
            .birdc(&["show", "route"])
            .unwrap()
            .contains("10.100.0.3")
    );
    // The withdrawals in the event log and in `lb events`.
    let text = String::from_utf8_lossy(&daemon.lb(&["events"]).stdout).into_owned();
    assert!(
        text.lines().any(|l| l.contains(
            "VIP 10.100.0.1 announced -> withdrawn: web: 0 of 2 backends available (needs 1)"
        )),
        "{text}"
    );
    let log = daemon.log_text();
    eprintln!(
        "lb's log, the VIPs:\n{}",
        log.lines()
            .filter(|l| l.contains("VIP") || l.contains("announcing"))
            .take(6)
            .collect::<Vec<_>>()
            .join("\n")
    );
    drop(daemon);
}

/// drain-host and undrain-host, a drained host across a restart, a reload of the services'
/// settings (and one of the table, refused), a restart that keeps the routes, `lb stop` with
/// its grace period, and kill -9 followed by `lb stop` without a daemon.
#[test]
fn drain_restart_and_stop() {
    require_root();
    let _one = lb_tests::timing_sensitive();
    let bed = bed();
    let pin = PinGuard::unique();
    let text = config(&bed.sb, &pin.0, "2s");
    let mut daemon = Daemon::start_pinned(&bed.sb.lb, &text).expect("lb");
    let routes = &bed.routes;
    let router = bed.sb.client.ns.clone();
    let all = [WEB, ALWAYS, WEB6];
    let wait_all = |present: bool, limit: Duration| {
        for vip in all {
            routes
                .wait(ip(vip), present, limit)
                .unwrap_or_else(|| panic!("{vip} present = {present} never seen"));
        }
    };
    wait_all(true, Duration::from_secs(15));
    wait_web(&daemon, &bed.sb, "healthy");

    // drain-host: every VIP withdrawn; lb keeps forwarding.
    let start = unix_now();
    let out = daemon.lb(&["drain-host"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        said.starts_with("host drained: every VIP withdrawn from table 200 (0 still announced)"),
        "{said}"
    );
    wait_all(false, Duration::from_secs(2));
    let gone = routes.changes_of(ip(WEB)).last().unwrap().time;
    eprintln!(
        "drain-host: gone at the router {:.1} ms after the request",
        (gone - start) * 1e3
    );
    assert_eq!(
        vip_event(&daemon, WEB, "withdrawn", start, WAIT).and_then(|e| e.reason),
        Some("drain-host".to_owned())
    );
    let status = daemon.status().unwrap();
    assert_eq!(status.announce.as_ref().unwrap().state, "drained");
    assert!(lb_routes(&bed.sb.lb).is_empty());
    let name = through_the_host(&router, WEB, || greeting(&router, WEB));
    assert!(
        name.starts_with("backend-"),
        "forwarding while drained: {name}"
    );

    // Drained across a restart of the pinned datapath.
    assert_eq!(daemon.stop(libc::SIGTERM), Some(0));
    let mut daemon = Daemon::start_pinned(&bed.sb.lb, &text).expect("lb again");
    let status = daemon.status().unwrap();
    assert_eq!(status.announce.as_ref().unwrap().state, "drained");
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        all.iter().all(|v| !routes.present(ip(v))),
        "a drained host announced after a restart"
    );
    let out = daemon.lb(&["undrain-host"]);
    assert!(out.status.success());
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        said.starts_with("host announcing: 3 of 4 VIPs announced in table 200"),
        "{said}"
    );
    wait_all(true, Duration::from_secs(2));

    // A reload changes a service's setting: web's VIP goes; the table cannot change.
    let start = unix_now();
    std::fs::write(
        &daemon.config,
        text.replace("name = \"web\"\n", "name = \"web\"\nannounce = \"never\"\n"),
    )
    .unwrap();
    let out = daemon.lb(&["reload"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let gone = routes
        .wait(ip(WEB), false, Duration::from_secs(2))
        .expect("web withdrawn");
    eprintln!(
        "reload: gone at the router {:.1} ms after the request",
        (gone - start) * 1e3
    );
    assert_eq!(
        vip_event(&daemon, WEB, "withdrawn", start, WAIT).and_then(|e| e.reason),
        Some("web: announce = never".to_owned())
    );
    std::fs::write(&daemon.config, &text).unwrap();
    assert!(daemon.lb(&["reload"]).status.success());
    routes
        .wait(ip(WEB), true, Duration::from_secs(2))
        .expect("web back");
    std::fs::write(&daemon.config, text.replace("table = 200", "table = 201")).unwrap();
    let out = daemon.lb(&["reload"]);
    assert_eq!(out.status.code(), Some(64));
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("lb.announce.table: cannot change while running"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::write(&daemon.config, &text).unwrap();

    // A restart keeps the routes: no withdraw at the router in between.
    let before = unix_now();
    assert_eq!(daemon.stop(libc::SIGTERM), Some(0));
    std::thread::sleep(Duration::from_secs(1));
    assert!(
        all.iter().all(|v| routes.present(ip(v))),
        "the routes stay while no lb runs"
    );
    assert_eq!(lb_routes(&bed.sb.lb).len(), 3);
    let mut daemon = Daemon::start_pinned(&bed.sb.lb, &text).expect("lb again");
    wait_web(&daemon, &bed.sb, "healthy");
    std::thread::sleep(Duration::from_secs(1));
    for vip in all {
        let dropped: Vec<_> = routes
            .changes_of(ip(vip))
            .into_iter()
            .filter(|c| c.time >= before && !c.present)
            .collect();
        assert!(
            dropped.is_empty(),
            "{vip} withdrawn across the restart: {dropped:?}"
        );
        assert!(vip_event(&daemon, vip, "withdrawn", before, Duration::ZERO).is_none());
    }
    assert!(greeting(&router, WEB).starts_with("backend-"));

    // `lb stop`: withdrawn first, while lb still runs and forwards; it ends after the grace.
    let start = unix_now();
    let out = daemon.lb(&["stop"]);
    assert!(out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("withdrawing its VIPs, forwards for 2s more"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    wait_all(false, Duration::from_secs(2));
    assert!(daemon.process.running(), "the routes went while lb ran");
    let gone = routes.changes_of(ip(WEB)).last().unwrap().time;
    let name = through_the_host(&router, WEB, || greeting(&router, WEB));
    assert!(
        name.starts_with("backend-"),
        "forwarding in the grace period: {name}"
    );
    assert!(daemon.process.running(), "still in the grace period");
    let deadline = Instant::now() + Duration::from_secs(10);
    while daemon.process.running() {
        assert!(Instant::now() < deadline, "lb stop did not end the daemon");
        std::thread::sleep(Duration::from_millis(20));
    }
    let ended = unix_now();
    eprintln!(
        "lb stop: gone at the router after {:.1} ms, lb ended after {:.2} s (grace 2 s)",
        (gone - start) * 1e3,
        ended - start
    );
    assert!(
        ended - start >= 2.0,
        "ended {:.2} s after lb stop",
        ended - start
    );
    assert!(
        daemon
            .log_text()
            .contains("every VIP withdrawn; forwarding for the grace period")
    );
    assert!(!Path::new(&pin.0).exists(), "pins left");
    assert!(!lb::daemon::host_file(Path::new(&pin.0)).exists());

    // kill -9: the routes stay and traffic flows (the pinned datapath forwards); `lb stop`
    // without a daemon withdraws them and removes the datapath.
    let mut daemon = Daemon::start_pinned(&bed.sb.lb, &text).expect("lb once more");
    wait_all(true, Duration::from_secs(5));
    daemon
        .process
        .stop_with(libc::SIGKILL, Duration::from_secs(5));
    std::thread::sleep(Duration::from_millis(1500));
    assert!(all.iter().all(|v| routes.present(ip(v))));
    assert!(
        greeting(&router, WEB).starts_with("backend-"),
        "forwarding after kill -9"
    );
    let out = sh(std::process::Command::new("nsenter")
        .arg(format!("--net=/run/netns/{}", bed.sb.lb.name()))
        .arg(lb_bin())
        .args(["stop", "--pin-path", &pin.0]))
    .expect("lb stop without a daemon");
    assert!(
        out.contains("withdrew the VIPs the stopped daemon announced: 10.100.0.1, 10.100.0.2, 2001:db8:100::1"),
        "{out}"
    );
    wait_all(false, Duration::from_secs(2));
    assert!(!Path::new(&pin.0).exists(), "pins left");
    assert!(lb_routes(&bed.sb.lb).is_empty());
    drop(daemon);

    // docs/bird.conf's BFD: a host gone silent (its namespace drops everything both ways, so
    // no withdrawal can leave it) is out of the router's table well before BGP's 3 s hold time.
    let daemon = Daemon::start_pinned(&bed.sb.lb, &text).expect("lb for the silent host");
    wait_all(true, Duration::from_secs(5));
    let lb_ns = &bed.sb.lb;
    lb_ns.input_chain("drop").unwrap();
    let start = unix_now();
    lb_ns.output_chain("drop").unwrap();
    let gone = routes
        .wait(ip(WEB), false, Duration::from_secs(5))
        .expect("the router drops a silent host's routes");
    eprintln!(
        "silent host: gone at the router after {:.0} ms (BFD 100 ms x 3; hold time 3 s)",
        (gone - start) * 1e3
    );
    assert!(gone - start < 1.0, "{:.2} s: BFD did not act", gone - start);
    lb_ns.clear_input_chain().unwrap();
    drop(daemon);
}
