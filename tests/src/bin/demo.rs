//! `cargo xtask demo`: a sandbox in network namespaces (a client, lb, three backends serving HTTP
//! and UDP echo), `lb run` on it with health checks, real traffic through the VIP and its spread
//! over the backends; then one backend dies and comes back: the health events as they happen,
//! the traffic moving away and returning, `lb status`, and a summary in which every number is
//! measured. Everything is removed on exit, on error and on Ctrl-C.

use std::{
    io::{BufRead as _, Read as _, Write as _},
    net::{SocketAddr, TcpStream, UdpSocket},
    os::unix::process::CommandExt as _,
    process::{Child, Stdio},
    sync::{
        atomic::{AtomicBool, AtomicU16, Ordering},
        mpsc,
    },
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use anyhow::{Context as _, bail};
use clap::Parser;
use lb::model::{Event, Events, Status};
use lb_tests::{
    daemon::{self, Daemon},
    decap::DecapGuard,
    lb_bin,
    netns::Netns,
    topology::{Arms, HTTP_PORT, Sandbox, VIP, VIP6},
};

#[path = "demo/cluster.rs"]
mod cluster;

#[derive(Parser)]
struct Args {
    /// Do not wait for Enter before cleaning up.
    #[arg(long)]
    unattended: bool,
    /// The scale-out demo instead: three lb hosts behind an ECMP router running BIRD.
    #[arg(long)]
    cluster: bool,
}

/// The two services: HTTP on VIP:80 (backends' port 8000, checked with HTTP GETs) and UDP echo
/// on VIP:7 (backends' port 8080, checked with a datagram that must be echoed).
const WEB: &str = "web";
/// The same HTTP service over IPv6: VIP6:80 → the backends' IPv6 addresses, port 8000.
const WEB6: &str = "web6";
/// HTTP with direct server return: VIP_DSR:80 → the backends, which hold VIP_DSR on `lo`, take
/// the GUE header off with `lb decap` and answer the client directly; checked with HTTP GETs to
/// their own address (port 8000).
const WEB_DSR: &str = "web-dsr";
const VIP_DSR: std::net::Ipv4Addr = std::net::Ipv4Addr::new(10, 100, 0, 2);
const ECHO: &str = "udp-echo";
const ECHO_VIP_PORT: u16 = 7;
/// The sandbox's echo servers (TCP and UDP) listen here.
const ECHO_PORT: u16 = 8080;
/// The backend that dies and comes back.
const VICTIM: usize = 1;
/// Requests per traffic phase: a new connection (HTTP) or a new source port (UDP) each.
const HTTP_N: usize = 300;
const UDP_N: usize = 90;
/// While waiting for an event: how long to wait for its line before the next look (and, while
/// backend is dying, the next HTTP request).
const LOOK: Duration = Duration::from_millis(50);

/// The checks' timing, fast enough for a demo (sub-second timeouts are accepted for demos).
const CHECK_TIMEOUT_MS: u64 = 500;
const CHECK_INTERVAL_S: u64 = 1;
const CHECK_THRESHOLD: u32 = 2;

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::SeqCst);
}

fn checkpoint() -> anyhow::Result<()> {
    if INTERRUPTED.load(Ordering::SeqCst) {
        bail!("interrupted");
    }
    Ok(())
}

/// Whether stdout is a terminal (then headings are bold and event lines marked in grey).
fn tty() -> bool {
    // SAFETY: isatty has no preconditions.
    unsafe { libc::isatty(1) == 1 }
}

fn say(text: &str) {
    if tty() {
        println!("\n\x1b[1m{text}\x1b[0m");
    } else {
        println!("\n{text}");
    }
}

fn main() {
    let args = Args::parse();
    // Ctrl-C / SIGTERM only set a flag, so the guards below always get to clean up.
    for sig in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: the handler only stores to an atomic.
        unsafe { libc::signal(sig, on_signal as *const () as libc::sighandler_t) };
    }
    let started = Instant::now();
    let result = if args.cluster {
        cluster::run(args.unattended)
    } else {
        demo(&args)
    };
    say("cleaning up: namespaces, veths, servers and the lb processes are removed");
    if let Err(e) = result {
        eprintln!("demo failed: {e:#}");
        std::process::exit(1);
    }
    println!("   demo done in {:.1} s", started.elapsed().as_secs_f64());
}

fn demo(args: &Args) -> anyhow::Result<()> {
    lb_tests::require_root();
    say("1. sandbox (network namespaces, nothing outside them is touched):");
    println!(
        "   client 10.0.1.2 ── 10.0.1.1 [lb] 10.0.2.1 ── bridge ── backends 10.0.2.10, .11, .12"
    );
    println!(
        "   VIP {VIP}: tcp/80 → backends:{HTTP_PORT} (HTTP), udp/{ECHO_VIP_PORT} → backends:{ECHO_PORT} (UDP echo)"
    );
    println!(
        "   and IPv6 on the same links: client 2001:db8:1::2 ── ::1 [lb] 2001:db8:2::1 ── backends ::10, ::11, ::12"
    );
    println!("   VIP [{VIP6}]: tcp/80 → backends:{HTTP_PORT} (HTTP)");
    println!(
        "   VIP {VIP_DSR}: tcp/80, direct server return (GUE): the backends hold {VIP_DSR} on lo, take"
    );
    println!(
        "   the outer header off with `lb decap` and answer the client directly over its second leg"
    );
    println!("   (client 10.0.2.200 on the backends' bridge): replies never cross lb");
    let mut sb = Sandbox::build(Arms::Two, 3, ECHO_PORT)?;
    sb.serve_vip(VIP_DSR.into(), Some(80))?;
    sb.direct_return()?;
    let decaps = sb
        .backends
        .iter()
        .map(|b| DecapGuard::start(&b.ns, &[&b.ifname], &[]))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let names: Vec<String> = sb.backends.iter().map(|b| b.name.clone()).collect();
    let victim = names[VICTIM].clone();
    let web_addrs: Vec<String> = sb
        .backends
        .iter()
        .map(|b| format!("{}:{HTTP_PORT}", b.addr))
        .collect();
    let echo_addrs: Vec<String> = sb
        .backends
        .iter()
        .map(|b| format!("{}:{ECHO_PORT}", b.addr))
        .collect();
    let web6_addrs: Vec<String> = sb
        .backends
        .iter()
        .map(|b| format!("[{}]:{HTTP_PORT}", b.addr6))
        .collect();
    let dsr_addrs: Vec<String> = sb
        .backends
        .iter()
        .map(|b| format!("{}:80", b.addr))
        .collect();
    let dsr_addr = |i: usize| dsr_addrs[i].as_str();
    let web_addr = |i: usize| web_addrs[i].as_str();
    let web6_addr = |i: usize| web6_addrs[i].as_str();
    let echo_addr = |i: usize| echo_addrs[i].as_str();
    println!(
        "   namespaces: {} (lb), {} (client), backends {}",
        sb.lb.name(),
        sb.client.ns.name(),
        sb.backends
            .iter()
            .map(|b| b.ns.name())
            .collect::<Vec<_>>()
            .join(", ")
    );
    checkpoint()?;

    let config = config(&sb);
    say("2. lb run --no-pin with this config:");
    for line in config.lines() {
        println!("   {line}");
    }
    let mut daemon = Daemon::start(&sb.lb, &config)?;
    println!(
        "   lb is running (pid {}), XDP attached to {}; its control API answers on 127.0.0.1:9090 in {}",
        daemon.process.pid(),
        sb.lb_interfaces().join(" and "),
        sb.lb.name()
    );
    println!("   the first verdicts, as `lb events --follow` prints them:");
    let mut events = Follower::start(&daemon)?;
    for i in 0..names.len() {
        events.wait_for(
            WEB,
            web_addr(i),
            "healthy",
            0,
            Duration::from_secs(15),
            || Ok(()),
        )?;
        events.wait_for(
            ECHO,
            echo_addr(i),
            "healthy",
            0,
            Duration::from_secs(15),
            || Ok(()),
        )?;
        events.wait_for(
            WEB6,
            web6_addr(i),
            "healthy",
            0,
            Duration::from_secs(15),
            || Ok(()),
        )?;
        events.wait_for(
            WEB_DSR,
            dsr_addr(i),
            "healthy",
            0,
            Duration::from_secs(15),
            || Ok(()),
        )?;
    }
    events.pump(Duration::from_millis(100))?;
    let status = daemon.status()?;
    let windows = |service: &str| -> anyhow::Result<(f64, f64)> {
        let s = status.service(service).context("service missing")?;
        match (s.failure_window_s, s.success_window_s) {
            (Some(f), Some(s)) => Ok((f, s)),
            _ => bail!("lb status shows no check windows for {service}"),
        }
    };
    let (web_windows, echo_windows) = (windows(WEB)?, windows(ECHO)?);
    println!("   lb status (the windows: how long a dead backend can still get new flows, and a");
    println!("   recovered one waits for them):");
    print_indented(&lb_text(&daemon, &["status"])?);
    checkpoint()?;

    say(&format!(
        "3. curl http://{VIP}/, http://[{VIP6}]/ and http://{VIP_DSR}/ (direct server return) from the \
         client, three times each"
    ));
    let dsr_before = daemon.status()?;
    let urls = [
        format!("http://{VIP}/"),
        format!("http://[{VIP6}]/"),
        format!("http://{VIP_DSR}/"),
    ];
    for url in urls.iter().flat_map(|u| [u, u, u]) {
        let out = sb
            .client
            .ns
            .exec(&["curl", "-sS", "-g", "--max-time", "5", url])?;
        if !out.status.success() {
            bail!(
                "curl failed: {}\nlb log:\n{}",
                String::from_utf8_lossy(&out.stderr),
                daemon.log_text()
            );
        }
        print!("   {}", String::from_utf8_lossy(&out.stdout));
    }
    show_dsr(&daemon, &dsr_before, &decaps, &names)?;
    checkpoint()?;

    let mut phases = Vec::new();
    say(&format!(
        "4. all backends healthy: {HTTP_N} HTTP requests (a new connection each) and {UDP_N} UDP flows"
    ));
    let phase = traffic(&sb, &daemon, "1. all healthy", HTTP_N, UDP_N)?;
    phase.print(&names);
    phase.require_no_failures()?;
    phases.push(phase);

    say(&format!(
        "5. {victim}'s servers are stopped (its ports now answer with RST); the client keeps \
         sending\n   HTTP requests (pausing up to {} ms between them); the events as they happen:",
        LOOK.as_millis()
    ));
    let mark = events.last_seq();
    let before = Counts::read(&daemon, &sb)?;
    sb.stop_backend(VICTIM);
    let killed = now_unix();
    println!("   {} {victim} stopped", clock(killed));
    let mut detection = Phase::new("2. killed, not yet ejected", names.len());
    let limit = Duration::from_secs_f64(web_windows.0) + Duration::from_secs(10);
    let web_down = events.wait_for(WEB, web_addr(VICTIM), "unhealthy", mark, limit, || {
        detection.count_http(&names, http_get(&sb.client.ns));
        Ok(())
    })?;
    let requests_ended = now_unix();
    detection.lb = Counts::read(&daemon, &sb)?.minus(&before);
    let echo_down =
        events.wait_for(ECHO, echo_addr(VICTIM), "unhealthy", mark, limit, || Ok(()))?;
    let web6_down =
        events.wait_for(WEB6, web6_addr(VICTIM), "unhealthy", mark, limit, || Ok(()))?;
    let dsr_down = events.wait_for(WEB_DSR, dsr_addr(VICTIM), "unhealthy", mark, limit, || {
        Ok(())
    })?;
    events.pump(Duration::from_millis(100))?;
    let detected = [
        Timing::new(WEB, &event(&daemon, web_down)?, killed, web_windows.0),
        Timing::new(ECHO, &event(&daemon, echo_down)?, killed, echo_windows.0),
        Timing::new(WEB6, &event(&daemon, web6_down)?, killed, web_windows.0),
        Timing::new(WEB_DSR, &event(&daemon, dsr_down)?, killed, web_windows.0),
    ];
    for t in &detected {
        println!(
            "   {} {victim} unhealthy {:.2} s after the kill; bound: failure window {} s + up to \
             {CHECK_INTERVAL_S} s of probe phase ({})",
            t.service,
            t.seconds,
            t.window,
            t.verdict()
        );
    }
    println!(
        "   (the failure window assumes probes that time out; refused ones fail at once, so it \
         can be quicker)"
    );
    println!(
        "   meanwhile, in {:.2} s: {} HTTP requests, {} answered, {} refused (sent to {victim} \
         before it was ejected);\n   lb counted {} new flows to {victim}",
        requests_ended - killed,
        detection.http_total(),
        detection.http.iter().sum::<usize>(),
        detection.http_failed,
        detection.lb.web[VICTIM]
    );
    phases.push(detection);
    checkpoint()?;

    say(&format!(
        "6. {victim} ejected: {HTTP_N} HTTP requests and {UDP_N} UDP flows again"
    ));
    let phase = traffic(&sb, &daemon, "3. ejected", HTTP_N, UDP_N)?;
    phase.print(&names);
    phase.require_no_failures()?;
    if phase.lb.web[VICTIM] + phase.lb.udp[VICTIM] > 0 {
        bail!("lb still sent new flows to the unhealthy {victim}");
    }
    println!("   {victim} got no new flows: the others took its share");
    phases.push(phase);
    checkpoint()?;

    say(&format!(
        "7. {victim}'s servers are started again; the events as they happen:"
    ));
    let mark = events.last_seq();
    sb.start_backend(VICTIM)?;
    let restarted = now_unix();
    println!("   {} {victim} started", clock(restarted));
    let limit = Duration::from_secs_f64(web_windows.1) + Duration::from_secs(10);
    let web_up = events.wait_for(WEB, web_addr(VICTIM), "healthy", mark, limit, || Ok(()))?;
    let echo_up = events.wait_for(ECHO, echo_addr(VICTIM), "healthy", mark, limit, || Ok(()))?;
    let web6_up = events.wait_for(WEB6, web6_addr(VICTIM), "healthy", mark, limit, || Ok(()))?;
    let dsr_up = events.wait_for(WEB_DSR, dsr_addr(VICTIM), "healthy", mark, limit, || Ok(()))?;
    events.pump(Duration::from_millis(100))?;
    let recovered = [
        Timing::new(WEB, &event(&daemon, web_up)?, restarted, web_windows.1),
        Timing::new(ECHO, &event(&daemon, echo_up)?, restarted, echo_windows.1),
        Timing::new(WEB6, &event(&daemon, web6_up)?, restarted, web_windows.1),
        Timing::new(WEB_DSR, &event(&daemon, dsr_up)?, restarted, web_windows.1),
    ];
    for t in &recovered {
        println!(
            "   {} {victim} healthy {:.2} s after the restart; bound: success window at most {} s \
             + up to {CHECK_INTERVAL_S} s until the first probe ({})",
            t.service,
            t.seconds,
            t.window,
            t.verdict()
        );
    }
    checkpoint()?;

    say(&format!(
        "8. {victim} back: {HTTP_N} HTTP requests and {UDP_N} UDP flows again"
    ));
    let phase = traffic(&sb, &daemon, "4. back", HTTP_N, UDP_N)?;
    phase.print(&names);
    phase.require_no_failures()?;
    phases.push(phase);
    checkpoint()?;

    say("9. lb status");
    print_indented(&lb_text(&daemon, &["status"])?);
    say(&format!(
        "   {victim}'s health timeline in {WEB}, from the event log (what the status page draws as \
         coloured bands), with the reasons:"
    ));
    print_timeline(&daemon, WEB, web_addr(VICTIM), killed)?;

    say("10. summary (all measured in this run)");
    println!("   detection ({victim} killed → its unhealthy event):");
    for t in &detected {
        println!("     {}", t.summary("failure window"));
    }
    println!("   recovery ({victim} restarted → its healthy event):");
    for t in &recovered {
        println!("     {}", t.summary("success window at most"));
    }
    println!(
        "   flows per backend, answered at the client (HTTP requests / UDP flows); lb's own count of \
         new flows in brackets:"
    );
    print!("   {:<28}", "phase");
    for n in &names {
        print!(" {n:>20}");
    }
    println!(" {:>8}", "refused");
    for p in &phases {
        p.summary_row();
    }

    say("11. the status page and the CLI");
    let page_url = "http://127.0.0.1:9090/v1/healthcheck";
    let (code, page) = daemon::http(&daemon.ns, "GET", page_url, &["Accept: text/html"]);
    println!(
        "   checked now: {page_url} with Accept: text/html answers {code}, {} bytes, {} backend rows",
        page.len(),
        page.matches("data-backend=").count()
    );
    let ns = sb.lb.name();
    let lb = lb_bin();
    let lb = lb.display();
    println!(
        "   the API listens on 127.0.0.1:9090 inside the namespace {ns} (`/` redirects to the page):"
    );
    println!("     sudo ip netns exec {ns} curl -s -H 'Accept: text/html' {page_url}");
    println!("     sudo ip netns exec {ns} curl -s {page_url}            # JSON");
    println!("     sudo ip netns exec {ns} curl -s http://127.0.0.1:9090/metrics");
    println!("     sudo ip netns exec {ns} {lb} status");
    println!("     sudo ip netns exec {ns} {lb} events --follow");
    println!(
        "     sudo ip netns exec {} curl -s http://{VIP}/         # traffic from the client",
        sb.client.ns.name()
    );

    drop(events);
    if args.unattended {
        println!(
            "   (--unattended: not waiting; without it the demo keeps all this up until Enter)"
        );
    } else {
        say("press Enter to stop lb and clean up (Ctrl-C works too)");
        wait_for_enter();
    }
    say("12. stopping lb (SIGTERM)");
    let code = daemon.stop(libc::SIGTERM);
    let attached = sb
        .lb_ports
        .iter()
        .any(|p| sb.lb.xdp_attached(&p.ifname).unwrap_or(true));
    println!(
        "   lb exited with {}; XDP program {}",
        code.map_or("a kill".into(), |c| format!("status {c}")),
        if attached {
            "STILL ATTACHED"
        } else {
            "detached"
        }
    );
    if code != Some(0) || attached {
        bail!("lb did not shut down cleanly:\n{}", daemon.log_text());
    }
    Ok(())
}

/// The demo's config: the services over all backends, each with a fast check.
fn config(sb: &Sandbox) -> String {
    let list = |port: u16| {
        sb.backends
            .iter()
            .map(|b| format!("{{ address = \"{}:{port}\" }}", b.addr))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let list6 = sb
        .backends
        .iter()
        .map(|b| format!("{{ address = \"[{}]:{HTTP_PORT}\" }}", b.addr6))
        .collect::<Vec<_>>()
        .join(", ");
    let timing = format!(
        "timeout = \"{CHECK_TIMEOUT_MS}ms\"\ninterval = \"{CHECK_INTERVAL_S}s\"\n\
         healthy_threshold = {CHECK_THRESHOLD}\nunhealthy_threshold = {CHECK_THRESHOLD}\n"
    );
    format!(
        "[lb]\ninterfaces = [{}]\nxdp_mode = \"auto\"\napi = \"127.0.0.1:9090\"\nconntrack = {{ size = 65536 }}\n\n\
         [[service]]\nname = \"{WEB}\"\nvip = \"{VIP}:80\"\nprotocol = \"tcp\"\nbackends = [{}]\n\
         [service.check]\nkind = \"http\"\npath = \"/\"\n{timing}\n\
         [[service]]\nname = \"{ECHO}\"\nvip = \"{VIP}:{ECHO_VIP_PORT}\"\nprotocol = \"udp\"\nbackends = [{}]\n\
         [service.check]\nkind = \"udp\"\nsend = \"ping\"\nexpect = \"backend-\"\n{timing}\n\
         [[service]]\nname = \"{WEB6}\"\nvip = \"[{VIP6}]:80\"\nprotocol = \"tcp\"\nbackends = [{list6}]\n\
         [service.check]\nkind = \"http\"\npath = \"/\"\n{timing}\n\
         [[service]]\nname = \"{WEB_DSR}\"\nvip = \"{VIP_DSR}:80\"\nprotocol = \"tcp\"\nforwarding = \"gue\"\n\
         backends = [{}]\n[service.check]\nkind = \"http\"\nport = {HTTP_PORT}\npath = \"/\"\n{timing}",
        sb.interfaces_toml(),
        list(HTTP_PORT),
        list(ECHO_PORT),
        list(80),
    )
}

/// What direct server return did for the requests of step 3: lb's counters of the DSR service
/// (the requests only) and its return path (no reply), and what the backends' decapsulators
/// took out of their tunnels.
fn show_dsr(
    daemon: &Daemon,
    before: &Status,
    decaps: &[DecapGuard],
    names: &[String],
) -> anyhow::Result<()> {
    let now = daemon.status()?;
    let service = |s: &Status| -> anyhow::Result<(u64, u64)> {
        let svc = s.service(WEB_DSR).context("web-dsr missing")?;
        Ok((svc.packets, svc.bytes))
    };
    let (p0, b0) = service(before)?;
    let (p1, b1) = service(&now)?;
    let replies = |s: &Status| {
        s.counters
            .iter()
            .find(|c| c.name == "reply")
            .map_or(0, |c| c.value)
    };
    println!(
        "   {WEB_DSR}: lb forwarded {} packets ({} bytes) of the 3 requests, the client's side only; \
         lb's return path counted {} replies meanwhile (the full-NAT services' answers), the \
         DSR answers went from the backends to the client directly",
        p1 - p0,
        b1 - b0,
        replies(&now) - replies(before)
    );
    for (name, d) in names.iter().zip(decaps) {
        let s = d.stats()?;
        println!(
            "   {name}: lb decap took {} packets out of GUE, passed {} others untouched",
            s.counter("decap_gue"),
            s.counter("pass_not_encap")
        );
    }
    Ok(())
}

/// The transitions of `backend` in `service`, times relative to `since` (the kill), each with
/// its reason, and a text bar of the states over that time as the status page's timeline draws
/// them; then the last failure the status keeps.
fn print_timeline(daemon: &Daemon, service: &str, backend: &str, since: f64) -> anyhow::Result<()> {
    let text = lb_text(daemon, &["events", "--json"])?;
    let events: Events = serde_json::from_str(&text).context("lb events --json")?;
    let mine: Vec<&Event> = events
        .events
        .iter()
        .filter(|e| e.service == service && e.backend == backend)
        .collect();
    let end = now_unix();
    let start = mine.first().map_or(since, |e| e.time.min(since));
    // One character per 100 ms: + taking flows, ~ in between, x out, . initializing.
    let mark = |state: &str| match state {
        "healthy" => '+',
        "mostly_healthy" | "mostly_unhealthy" => '~',
        "unhealthy" => 'x',
        _ => '.',
    };
    let mut bar = String::new();
    let mut t = start;
    while t < end {
        let state = mine
            .iter()
            .rev()
            .find(|e| e.time <= t)
            .map_or("initializing", |e| e.to.as_str());
        bar.push(mark(state));
        t += 0.1;
    }
    for e in &mine {
        println!(
            "   {:+7.2} s  {} -> {}{}",
            e.time - since,
            e.from,
            e.to,
            e.reason
                .as_deref()
                .map(|r| format!("  ({r})"))
                .unwrap_or_default()
        );
    }
    println!(
        "   [{bar}]  (100 ms a character: + healthy, ~ changing, x unhealthy, . initializing)"
    );
    let status = daemon.status()?;
    if let Some(last) = status
        .service(service)
        .and_then(|s| s.backend(backend))
        .and_then(|b| b.last_failure.clone())
    {
        println!("   its last failure, as the status and the page show it: {last}");
    }
    Ok(())
}

/// Runs `lb ARGS` against the daemon; its stdout, or an error with its stderr.
fn lb_text(daemon: &Daemon, args: &[&str]) -> anyhow::Result<String> {
    let out = daemon.lb(args);
    if !out.status.success() {
        bail!(
            "lb {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn print_indented(text: &str) {
    for line in text.trim_end().lines() {
        println!("   {line}");
    }
}

fn now_unix() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs_f64()
}

/// A Unix time as the event lines show it (UTC).
fn clock(t: f64) -> String {
    let secs = t as i64;
    let millis = ((t - secs as f64) * 1000.0) as u32;
    format!(
        "{:02}:{:02}:{:02}.{millis:03}Z",
        (secs / 3600) % 24,
        (secs / 60) % 60,
        secs % 60
    )
}

/// The event with sequence number `seq`, from `lb events --json`.
fn event(daemon: &Daemon, seq: u64) -> anyhow::Result<Event> {
    let after = seq.saturating_sub(1).to_string();
    let text = lb_text(daemon, &["events", "--json", "--after", &after])?;
    let events: Events = serde_json::from_str(&text).context("lb events --json")?;
    events
        .events
        .into_iter()
        .find(|e| e.seq == seq)
        .with_context(|| format!("event #{seq} is no longer in lb's log"))
}

/// How long a transition took, against its window.
struct Timing {
    service: &'static str,
    seconds: f64,
    /// The window `lb status` shows for it.
    window: f64,
    flag_write_us: Option<u64>,
}

impl Timing {
    fn new(service: &'static str, event: &Event, since: f64, window: f64) -> Self {
        Self {
            service,
            seconds: event.time - since,
            window,
            flag_write_us: event.flag_write_us,
        }
    }

    /// The window plus up to one interval for where the probe cycle stood.
    fn bound(&self) -> f64 {
        self.window + CHECK_INTERVAL_S as f64
    }

    fn verdict(&self) -> &'static str {
        if self.seconds <= self.bound() {
            "within it"
        } else {
            "OVER it"
        }
    }

    fn summary(&self, window: &str) -> String {
        format!(
            "{:<9} {:>5.2} s  (bound {} s: {window} {} s + {CHECK_INTERVAL_S} s of probe phase; {}){}",
            self.service,
            self.seconds,
            self.bound(),
            self.window,
            self.verdict(),
            self.flag_write_us.map_or(String::new(), |us| format!(
                "; datapath flag written {us} µs after the verdict"
            ))
        )
    }
}

/// `lb events --follow` in the lb namespace: its lines are printed as they arrive and the
/// transitions in them remembered. Killed when dropped.
struct Follower {
    child: Child,
    lines: mpsc::Receiver<String>,
    /// (seq, service, backend, new state) of every event line so far.
    seen: Vec<(u64, String, String, String)>,
}

impl Follower {
    fn start(daemon: &Daemon) -> anyhow::Result<Self> {
        let mut child = daemon
            .ns
            .command(lb_bin())
            .args(["events", "--follow", "--api", &daemon.api])
            // Its own process group: Ctrl-C is for the demo, which then stops it.
            .process_group(0)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .context("starting lb events --follow")?;
        let out = child.stdout.take().context("no stdout")?;
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(out).lines() {
                let Ok(line) = line else { return };
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        Ok(Self {
            child,
            lines,
            seen: Vec::new(),
        })
    }

    /// Prints (and remembers) the lines that arrive within `wait`.
    fn pump(&mut self, wait: Duration) -> anyhow::Result<()> {
        let first = match self.lines.recv_timeout(wait) {
            Ok(line) => line,
            Err(mpsc::RecvTimeoutError::Timeout) => return Ok(()),
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                // Ctrl-C also reaches lb run, whose exit ends the stream: say what happened.
                std::thread::sleep(Duration::from_millis(100));
                checkpoint()?;
                bail!("lb events --follow ended")
            }
        };
        self.show(first);
        while let Ok(line) = self.lines.try_recv() {
            self.show(line);
        }
        Ok(())
    }

    /// `#SEQ DATE TIME SERVICE BACKEND FROM -> TO (...)`, read around the arrow so the time's
    /// format does not matter.
    fn show(&mut self, line: String) {
        if tty() {
            println!("   \x1b[2m│\x1b[0m {line}");
        } else {
            println!("   │ {line}");
        }
        let w: Vec<&str> = line.split_whitespace().collect();
        let arrow = w.iter().position(|&x| x == "->");
        let at = |back: usize, ahead: usize| {
            arrow
                .and_then(|a| (a + ahead).checked_sub(back))
                .and_then(|i| w.get(i))
        };
        if let (Some(seq), Some(service), Some(backend), Some(to)) = (
            w.first()
                .and_then(|s| s.strip_prefix('#'))
                .and_then(|s| s.parse().ok()),
            at(3, 0),
            at(2, 0),
            at(0, 1),
        ) {
            self.seen.push((
                seq,
                (*service).to_owned(),
                (*backend).to_owned(),
                (*to).to_owned(),
            ));
        }
    }

    fn last_seq(&self) -> u64 {
        self.seen.iter().map(|e| e.0).max().unwrap_or(0)
    }

    /// Waits for `service backend -> to` after event `after`, printing events meanwhile and
    /// running `tick` between looks; the event's sequence number.
    fn wait_for(
        &mut self,
        service: &str,
        backend: &str,
        to: &str,
        after: u64,
        limit: Duration,
        mut tick: impl FnMut() -> anyhow::Result<()>,
    ) -> anyhow::Result<u64> {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(e) = self
                .seen
                .iter()
                .find(|e| e.0 > after && e.1 == service && e.2 == backend && e.3 == to)
            {
                return Ok(e.0);
            }
            checkpoint()?;
            if Instant::now() > deadline {
                bail!("no event {service} {backend} -> {to} within {limit:?}");
            }
            tick()?;
            self.pump(LOOK)?;
        }
    }
}

impl Drop for Follower {
    fn drop(&mut self) {
        let _ = self.child.kill(); // a client: nothing to lose
        let _ = self.child.wait();
    }
}

/// New flows per backend (by index) of both services, as lb counts them.
#[derive(Clone, Default)]
struct Counts {
    web: Vec<u64>,
    udp: Vec<u64>,
}

impl Counts {
    fn read(daemon: &Daemon, sb: &Sandbox) -> anyhow::Result<Self> {
        let status: Status = daemon.status()?;
        let per = |service: &str, port: u16| -> anyhow::Result<Vec<u64>> {
            let s = status.service(service).context("service missing")?;
            sb.backends
                .iter()
                .map(|b| {
                    s.backend(&format!("{}:{port}", b.addr))
                        .map(|b| b.new_flows)
                        .context("backend missing")
                })
                .collect()
        };
        Ok(Self {
            web: per(WEB, HTTP_PORT)?,
            udp: per(ECHO, ECHO_PORT)?,
        })
    }

    fn minus(&self, before: &Self) -> Self {
        let d = |a: &[u64], b: &[u64]| a.iter().zip(b).map(|(a, b)| a - b).collect();
        Self {
            web: d(&self.web, &before.web),
            udp: d(&self.udp, &before.udp),
        }
    }
}

/// One phase of traffic: answers per backend (by index) at the client, and lb's counts.
struct Phase {
    name: String,
    http: Vec<usize>,
    udp: Vec<usize>,
    http_failed: usize,
    udp_failed: usize,
    /// Whether UDP was sent in this phase.
    with_udp: bool,
    lb: Counts,
}

impl Phase {
    fn new(name: &str, backends: usize) -> Self {
        Self {
            name: name.to_owned(),
            http: vec![0; backends],
            udp: vec![0; backends],
            http_failed: 0,
            udp_failed: 0,
            with_udp: false,
            lb: Counts::default(),
        }
    }

    fn count_http(&mut self, names: &[String], result: anyhow::Result<String>) {
        match result.ok().and_then(|n| names.iter().position(|x| *x == n)) {
            Some(i) => self.http[i] += 1,
            None => self.http_failed += 1,
        }
    }

    fn count_udp(&mut self, names: &[String], result: anyhow::Result<String>) {
        match result.ok().and_then(|n| names.iter().position(|x| *x == n)) {
            Some(i) => self.udp[i] += 1,
            None => self.udp_failed += 1,
        }
    }

    fn http_total(&self) -> usize {
        self.http.iter().sum::<usize>() + self.http_failed
    }

    fn print(&self, names: &[String]) {
        println!(
            "   {:<10} {:>14} {:>16}   {:>9} {:>16}",
            "backend", "HTTP answered", "lb: new flows", "UDP flows", "lb: new flows"
        );
        for (i, n) in names.iter().enumerate() {
            println!(
                "   {n:<10} {:>14} {:>16}   {:>9} {:>16}",
                self.http[i], self.lb.web[i], self.udp[i], self.lb.udp[i]
            );
        }
        if self.http_failed + self.udp_failed > 0 {
            println!(
                "   failed: {} HTTP requests, {} UDP flows",
                self.http_failed, self.udp_failed
            );
        }
    }

    fn require_no_failures(&self) -> anyhow::Result<()> {
        if self.http_failed + self.udp_failed > 0 {
            bail!(
                "{}: {} HTTP requests and {} UDP flows failed although every backend in use was healthy",
                self.name,
                self.http_failed,
                self.udp_failed
            );
        }
        Ok(())
    }

    fn summary_row(&self) {
        print!("   {:<28}", self.name);
        for i in 0..self.http.len() {
            let cell = if self.with_udp {
                format!(
                    "{}/{} [{}/{}]",
                    self.http[i], self.udp[i], self.lb.web[i], self.lb.udp[i]
                )
            } else {
                format!("{}/- [{}/-]", self.http[i], self.lb.web[i])
            };
            print!(" {cell:>20}");
        }
        println!(" {:>8}", self.http_failed + self.udp_failed);
    }
}

/// `http_n` HTTP requests and then `udp_n` UDP flows through the VIP.
fn traffic(
    sb: &Sandbox,
    daemon: &Daemon,
    name: &str,
    http_n: usize,
    udp_n: usize,
) -> anyhow::Result<Phase> {
    let names: Vec<String> = sb.backends.iter().map(|b| b.name.clone()).collect();
    let before = Counts::read(daemon, sb)?;
    let mut phase = Phase::new(name, names.len());
    phase.with_udp = true;
    for _ in 0..http_n {
        checkpoint()?;
        phase.count_http(&names, http_get(&sb.client.ns));
    }
    for i in 0..udp_n {
        checkpoint()?;
        phase.count_udp(&names, udp_echo(&sb.client.ns, i));
    }
    phase.lb = Counts::read(daemon, sb)?.minus(&before);
    Ok(phase)
}

/// One HTTP GET through the VIP on a new connection; returns the backend that answered.
fn http_get(client: &Netns) -> anyhow::Result<String> {
    let mut conn = client.enter(|| {
        TcpStream::connect_timeout(&SocketAddr::from((VIP, 80)), Duration::from_secs(5))
    })?;
    conn.set_read_timeout(Some(Duration::from_secs(5)))?;
    conn.write_all(
        format!("GET / HTTP/1.1\r\nHost: {VIP}\r\nConnection: close\r\n\r\n").as_bytes(),
    )?;
    let mut response = String::new();
    conn.read_to_string(&mut response)?;
    let body = response.split("\r\n\r\n").nth(1).unwrap_or_default();
    body.trim()
        .strip_prefix("hello from ")
        .map(str::to_owned)
        .with_context(|| format!("unexpected response {response:?}"))
}

/// One datagram through the VIP from a source port not used before in this run (so it is a new
/// flow for lb, not one its connection table still remembers); returns the backend that answered.
fn udp_echo(client: &Netns, i: usize) -> anyhow::Result<String> {
    static NEXT_PORT: AtomicU16 = AtomicU16::new(50000);
    let port = NEXT_PORT.fetch_add(1, Ordering::Relaxed);
    let socket = client.enter(|| UdpSocket::bind(("0.0.0.0", port)))?;
    socket.connect(SocketAddr::from((VIP, ECHO_VIP_PORT)))?;
    socket.set_read_timeout(Some(Duration::from_secs(2)))?;
    let mut buf = [0u8; 256];
    for _ in 0..2 {
        socket.send(format!("query {i}").as_bytes())?;
        if let Ok(n) = socket.recv(&mut buf) {
            let reply = String::from_utf8_lossy(&buf[..n]).into_owned();
            return Ok(reply.split(':').next().unwrap_or_default().to_owned());
        }
    }
    bail!("no UDP reply to datagram {i}")
}

/// Waits for Enter on stdin, or for Ctrl-C (polling, so the signal flag is seen).
fn wait_for_enter() {
    let mut fds = libc::pollfd {
        fd: 0,
        events: libc::POLLIN,
        revents: 0,
    };
    while !INTERRUPTED.load(Ordering::SeqCst) {
        // SAFETY: one valid pollfd.
        if unsafe { libc::poll(&mut fds, 1, 200) } > 0 {
            let mut line = String::new();
            let _ = std::io::stdin().read_line(&mut line); // any input (or EOF) continues
            return;
        }
    }
}
