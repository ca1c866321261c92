//! `cargo xtask demo`: a sandbox in network namespaces with `lb` on it, some traffic, and what lb
//! saw. Everything is removed on exit, on error and on Ctrl-C.

use std::{
    io::{Read as _, Write as _},
    net::{TcpListener, TcpStream, UdpSocket},
    process::Stdio,
    sync::atomic::{AtomicBool, Ordering},
    time::Duration,
};

use anyhow::{Context as _, bail};
use clap::Parser;
use lb_tests::{
    daemon::Daemon,
    lb_bin,
    netns::{Netns, veth},
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
    say("cleaning up: namespaces, veths and the lb process are removed");
    if let Err(e) = result {
        eprintln!("demo failed: {e:#}");
        std::process::exit(1);
    }
}

fn demo(args: &Args) -> anyhow::Result<()> {
    lb_tests::require_root();
    say("1. sandbox: client (10.0.1.2) <-veth-> lb (10.0.1.1, XDP); VIP 10.100.0.1 routed via lb");
    let client_ns = Netns::new("client")?;
    let lb_ns = Netns::new("lb")?;
    let (client, lb) = veth(&client_ns, "10.0.1.2/24", &lb_ns, "10.0.1.1/24")?;
    client_ns.ip(&["route", "add", "10.100.0.0/24", "via", "10.0.1.1"])?;
    println!("   namespaces {} and {}", client_ns.name(), lb_ns.name());

    let config = format!(
        r#"[lb]
interfaces = ["{}"]
xdp_mode = "auto"
api = "127.0.0.1:9090"

[[service]]
name = "web"
vip = "10.100.0.1:80"
protocol = "tcp"
backends = [{{ address = "10.0.2.2:8080" }}, {{ address = "10.0.3.2:8080" }}]

[[service]]
name = "dns"
vip = "10.100.0.1:53"
protocol = "udp"
backends = [{{ address = "10.0.2.2:5353" }}]
"#,
        lb.ifname
    );
    say("2. lb run with this config:");
    println!("{config}");
    let mut daemon = Daemon::start(&lb_ns, &config)?;
    println!(
        "   lb is running (pid {}), XDP attached to {}",
        daemon.process.pid(),
        lb.ifname
    );
    checkpoint()?;

    say("3. traffic that is not for a VIP passes untouched");
    let ping = client
        .ns
        .exec(&["ping", "-c", "3", "-i", "0.2", "-W", "2", lb.addr()])?;
    print!("{}", String::from_utf8_lossy(&ping.stdout));
    if !ping.status.success() {
        bail!("ping to the balancer's own address failed");
    }
    let listener = lb.ns.enter(|| TcpListener::bind("10.0.1.1:7000"))?;
    let server = std::thread::spawn(move || -> std::io::Result<()> {
        let (mut conn, _) = listener.accept()?;
        let mut buf = vec![0u8; 4 << 20];
        conn.read_exact(&mut buf)?;
        conn.write_all(&buf)
    });
    let sent: Vec<u8> = (0..4u32 << 20).map(|i| (i % 251) as u8).collect();
    let mut conn = client.ns.enter(|| {
        TcpStream::connect_timeout(
            &"10.0.1.1:7000".parse().expect("addr"),
            Duration::from_secs(5),
        )
    })?;
    conn.set_read_timeout(Some(Duration::from_secs(10)))?;
    conn.write_all(&sent)?;
    let mut echoed = vec![0u8; sent.len()];
    conn.read_exact(&mut echoed)?;
    server.join().expect("server thread")?;
    if echoed != sent {
        bail!("TCP echo through the XDP host came back corrupted");
    }
    println!("   TCP to 10.0.1.1:7000: 4 MiB sent and echoed back intact");
    checkpoint()?;

    say("4. traffic for the VIPs is recognised and counted (forwarding comes with the datapath)");
    let udp = client.ns.enter(|| UdpSocket::bind("10.0.1.2:0"))?;
    for _ in 0..10 {
        udp.send_to(b"query", "10.100.0.1:53")?;
    }
    println!("   10 UDP datagrams to 10.100.0.1:53");
    for _ in 0..3 {
        let r = client.ns.enter(|| {
            TcpStream::connect_timeout(
                &"10.100.0.1:80".parse().expect("addr"),
                Duration::from_millis(200),
            )
        });
        if r.is_ok() {
            bail!("a TCP connection to the VIP succeeded, but nothing forwards yet");
        }
    }
    println!("   3 TCP connection attempts to 10.100.0.1:80");
    checkpoint()?;

    say("5. lb stats (from the control API):");
    let status = lb_ns
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
    checkpoint().ok(); // interrupted or not, stop lb properly
    say("6. stopping lb (SIGTERM)");
    let code = daemon.stop(libc::SIGTERM);
    let attached = lb.ns.xdp_attached(&lb.ifname)?;
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
