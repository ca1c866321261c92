//! `cargo xtask demo`: a sandbox in network namespaces (a client, lb, three backends serving
//! HTTP and UDP echo), `lb run` on it, real HTTP and UDP traffic through the VIP, the spread and
//! lb's counters. Everything is removed on exit, on error and on Ctrl-C.

use std::{
    collections::BTreeMap,
    io::{Read as _, Write as _},
    net::{SocketAddr, TcpStream, UdpSocket},
    process::Stdio,
    sync::atomic::{AtomicBool, Ordering},
    time::Duration,
};

use anyhow::{Context as _, bail};
use clap::Parser;
use lb_tests::{
    daemon::Daemon,
    lb_bin,
    netns::Netns,
    topology::{Arms, HTTP_PORT, Sandbox, VIP},
};

#[derive(Parser)]
struct Args {
    /// Do not wait for Enter before cleaning up.
    #[arg(long)]
    unattended: bool,
}

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

fn say(text: &str) {
    println!("\n\x1b[1m{text}\x1b[0m");
}

fn main() {
    let args = Args::parse();
    // Ctrl-C / SIGTERM only set a flag, so the guards below always get to clean up.
    for sig in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: the handler only stores to an atomic.
        unsafe { libc::signal(sig, on_signal as *const () as libc::sighandler_t) };
    }
    let result = demo(&args);
    say("cleaning up: namespaces, veths, servers and the lb process are removed");
    if let Err(e) = result {
        eprintln!("demo failed: {e:#}");
        std::process::exit(1);
    }
}

fn demo(args: &Args) -> anyhow::Result<()> {
    lb_tests::require_root();
    say("1. sandbox (network namespaces, nothing outside them is touched):");
    println!(
        "   client 10.0.1.2 ── 10.0.1.1 [lb] 10.0.2.1 ── bridge ── backends 10.0.2.10, .11, .12"
    );
    println!(
        "   VIP {VIP}: tcp/80 → backends:{HTTP_PORT} (HTTP), udp/53 → backends:8080 (UDP echo)"
    );
    let sb = Sandbox::build(Arms::Two, 3, 8080)?;
    let backends: Vec<String> = sb
        .backends
        .iter()
        .map(|b| format!("{{ address = \"{}:{HTTP_PORT}\" }}", b.addr))
        .collect();
    let udp_backends: Vec<String> = sb
        .backends
        .iter()
        .map(|b| format!("{{ address = \"{}:8080\" }}", b.addr))
        .collect();
    let interfaces: Vec<String> = sb
        .lb_interfaces()
        .iter()
        .map(|i| format!("\"{i}\""))
        .collect();
    let config = format!(
        "[lb]\ninterfaces = [{}]\nxdp_mode = \"auto\"\napi = \"127.0.0.1:9090\"\nconntrack = {{ size = 65536 }}\n\n\
         [[service]]\nname = \"web\"\nvip = \"{VIP}:80\"\nprotocol = \"tcp\"\nbackends = [{}]\n\n\
         [[service]]\nname = \"dns-like\"\nvip = \"{VIP}:53\"\nprotocol = \"udp\"\nbackends = [{}]\n",
        interfaces.join(", "),
        backends.join(", "),
        udp_backends.join(", ")
    );
    say("2. lb run with this config:");
    println!("{config}");
    let mut daemon = Daemon::start(&sb.lb, &config)?;
    println!(
        "   lb is running (pid {}), XDP attached to {}",
        daemon.process.pid(),
        sb.lb_interfaces().join(" and ")
    );
    checkpoint()?;

    say(&format!(
        "3. curl http://{VIP}/ from the client, three times"
    ));
    for _ in 0..3 {
        let out =
            sb.client
                .ns
                .exec(&["curl", "-sS", "--max-time", "5", &format!("http://{VIP}/")])?;
        if !out.status.success() {
            let stats = sb.lb.command(lb_bin()).arg("stats").output()?;
            bail!(
                "curl failed: {}\nlb stats:\n{}\nlb log:\n{}",
                String::from_utf8_lossy(&out.stderr),
                String::from_utf8_lossy(&stats.stdout),
                daemon.log_text()
            );
        }
        print!("   {}", String::from_utf8_lossy(&out.stdout));
    }
    checkpoint()?;

    say("4. 300 HTTP requests (a new connection each) and 90 UDP datagrams: the spread");
    let mut http = BTreeMap::new();
    for _ in 0..300 {
        *http.entry(http_get(&sb.client.ns)?).or_insert(0) += 1;
    }
    let mut udp = BTreeMap::new();
    for i in 0..90 {
        *udp.entry(udp_echo(&sb.client.ns, i)?).or_insert(0) += 1;
    }
    for b in &sb.backends {
        println!(
            "   {:<10} {:>4} HTTP requests  {:>3} UDP flows",
            b.name,
            http.get(&b.name).copied().unwrap_or(0),
            udp.get(&b.name).copied().unwrap_or(0)
        );
    }
    checkpoint()?;

    say("5. traffic that is not for a VIP passes untouched: ping the balancer's own address");
    let ping = sb
        .client
        .ns
        .exec(&["ping", "-c", "3", "-i", "0.2", "-W", "2", "10.0.1.1"])?;
    print!("{}", String::from_utf8_lossy(&ping.stdout));
    if !ping.status.success() {
        bail!("ping to the balancer's own address failed");
    }

    say("6. lb stats (from the control API):");
    let status = sb
        .lb
        .command(lb_bin())
        .arg("stats")
        .stdin(Stdio::null())
        .status()
        .context("lb stats")?;
    if !status.success() {
        bail!("lb stats failed");
    }

    if !args.unattended {
        say("press Enter to stop lb and clean up (Ctrl-C works too)");
        wait_for_enter();
    }
    say("7. stopping lb (SIGTERM)");
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

/// One datagram through the VIP from a new source port; returns the backend that answered.
fn udp_echo(client: &Netns, i: usize) -> anyhow::Result<String> {
    let socket = client.enter(|| UdpSocket::bind("0.0.0.0:0"))?;
    socket.connect(SocketAddr::from((VIP, 53)))?;
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
