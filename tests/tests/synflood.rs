//! A SYN flood must not lock legitimate clients out (issue 13). With `conntrack = { size = 4096 }`
//! hping3 floods the VIP from one attacker address (its own, nothing spoofed, inside the test's
//! namespaces, 10 s at most) while another client makes sequential HTTP requests through lb:
//! nearly all of them must succeed, an established connection must survive, and the counters
//! must say what the flood did. The SYN proxy is off here (its default, `auto`, would engage):
//! this is the tables' own defence; synproxy_e2e has the proxy's.
//!
//! Before: every legitimate request failed during the flood (the NAT table held the flood's
//! answered half-open flows, `drop_no_snat_port` in millions).

use std::{
    io::{Read as _, Write as _},
    net::SocketAddr,
    process::Stdio,
    time::{Duration, Instant},
};

use lb_tests::{
    daemon::Daemon,
    require_root, servers,
    topology::{Arms, HTTP_PORT, Sandbox, VIP},
};

/// How long the flood lasts (hping3 is killed by `timeout` at the latest then).
const FLOOD: Duration = Duration::from_secs(8);
/// The legitimate client's address, beside the attacker's (the sandbox client's 10.0.1.2).
const LEGIT: &str = "10.0.1.3";

#[test]
fn a_syn_flood_does_not_lock_legitimate_clients_out() {
    require_root();
    let sb = Sandbox::build(Arms::Two, 2, 8080).unwrap();
    let client = &sb.client;
    client
        .ns
        .ip(&["addr", "add", &format!("{LEGIT}/24"), "dev", &client.ifname])
        .unwrap();
    let backends = |port: u16| -> String {
        sb.backends
            .iter()
            .map(|b| format!("{{ address = \"{}:{port}\" }}", b.addr))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let config = format!(
        "[lb]\ninterfaces = [{}]\nxdp_mode = \"native\"\nconntrack = {{ size = 4096 }}\n\n\
         [[service]]\nname = \"web\"\nvip = \"{VIP}:80\"\nsyn_proxy = \"off\"\nbackends = [{}]\n\
         [service.check]\nkind = \"none\"\n\n\
         [[service]]\nname = \"echo\"\nvip = \"{VIP}:7\"\nsyn_proxy = \"off\"\nbackends = [{}]\n\
         [service.check]\nkind = \"none\"\n",
        sb.interfaces_toml(),
        backends(HTTP_PORT),
        backends(sb.service_port)
    );
    let daemon = Daemon::start(&sb.lb, &config).unwrap();

    // An established connection from before the flood.
    let (mut kept, _) = servers::connect(&client.ns, SocketAddr::from((VIP, 7))).unwrap();
    echo(&mut kept, b"before");

    // The flood: SYNs as fast as hping3 sends them, from the attacker's own address.
    let mut hping = client
        .ns
        .command("timeout")
        .args([
            &FLOOD.as_secs().to_string(),
            "hping3",
            "-q",
            "-S",
            "--flood",
            "-p",
            "80",
            "-a",
            "10.0.1.2",
            &VIP.to_string(),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let _reap = Reap(&mut hping);
    let started = Instant::now();
    // Let the flood fill the tables first.
    wait_until(|| {
        daemon
            .status()
            .is_ok_and(|s| s.counter("ct_new").unwrap_or(0) > 20_000)
    });
    let (mut ok, mut failed, mut slowest) = (0, 0, Duration::ZERO);
    while started.elapsed() < FLOOD - Duration::from_secs(1) {
        let t = Instant::now();
        match http_get(
            &client.ns,
            &format!("http://{VIP}/"),
            &["--interface", LEGIT],
        ) {
            Ok(()) => {
                ok += 1;
                slowest = slowest.max(t.elapsed());
            }
            Err(e) => {
                eprintln!("request failed after {:?}: {e}", t.elapsed());
                failed += 1;
            }
        }
    }
    let during = daemon.status().unwrap();
    drop(_reap);
    echo(&mut kept, b"after the flood");

    let c = |name: &str| during.counter(name).unwrap_or(0);
    let moved: Vec<String> = during
        .counters
        .iter()
        .filter(|c| c.value > 0)
        .map(|c| format!("{} {}", c.name, c.value))
        .collect();
    eprintln!("counters: {}", moved.join(", "));
    eprintln!(
        "during an {FLOOD:?} SYN flood: {ok} of {} legitimate requests succeeded (slowest {slowest:?}); \
         ct_new {} ct_evicted {} nat_evicted {} drop_nat_full {} drop_no_snat_port {} fwd {}",
        ok + failed,
        c("ct_new"),
        c("ct_evicted"),
        c("nat_evicted"),
        c("drop_nat_full"),
        c("drop_no_snat_port"),
        c("fwd_redirect") + c("fwd_tx"),
    );
    assert!(
        ok + failed >= 10,
        "too few requests to judge: {ok} + {failed}"
    );
    assert!(
        ok * 100 >= (ok + failed) * 95,
        "{ok} of {} requests during the flood succeeded",
        ok + failed
    );
    // The flood went through the tables, and they made room rather than refusing.
    assert!(c("ct_new") > 4096 * 4, "the flood did not fill the table");
    assert!(c("nat_evicted") > 0);
}

/// One HTTP GET of `url` by curl in `ns` (3 s at most, `extra` arguments before the URL): `Err`
/// names what curl said unless it got a 200.
fn http_get(ns: &lb_tests::netns::Netns, url: &str, extra: &[&str]) -> Result<(), String> {
    let out = ns
        .command("curl")
        .args([
            "-s",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            "--max-time",
            "3",
        ])
        .args(extra)
        .arg(url)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("curl: {e}"))?;
    if out.status.success() && out.stdout == b"200" {
        Ok(())
    } else {
        Err(format!(
            "curl exit {:?}, HTTP {}",
            out.status.code(),
            String::from_utf8_lossy(&out.stdout)
        ))
    }
}

fn echo(conn: &mut std::net::TcpStream, msg: &[u8]) {
    conn.write_all(msg).unwrap();
    let mut back = vec![0u8; msg.len()];
    conn.read_exact(&mut back).unwrap();
    assert_eq!(back, msg);
}

/// Polls `done` until it holds (10 s at most).
fn wait_until(mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(Instant::now() < deadline, "timed out");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Ends the flood even if the test fails: SIGTERM to `timeout` (our child, by its pid), which
/// passes it on to hping3, then waits for it.
struct Reap<'a>(&'a mut std::process::Child);

impl Drop for Reap<'_> {
    fn drop(&mut self) {
        // SAFETY: a signal to our own child process.
        unsafe { libc::kill(self.0.id() as i32, libc::SIGTERM) };
        let _ = self.0.wait();
    }
}

/// Issue 39, flood mode: a flood of SYNs from spoofed sources (each frame another address of
/// 10.99.0.0/16, the test's own, bounded in count and time) at a direct-server-return service
/// with a 16,384-flow table. lb cannot stop it (the backends answer clients directly, so it never
/// sees a handshake complete), but beyond `dsr_flood_rate` the flood's SYNs take no table
/// entry: the table keeps only what it held and real clients' flows, and a client connecting
/// one connection after another during the flood is served.
///
/// Before: every flood SYN took an entry (over 100,000 `ct_new`), evicting live flows.
#[test]
fn a_spoofed_flood_at_a_dsr_service_leaves_the_connection_table_alone() {
    use lb_tests::decap::DecapGuard;
    const RATE: u64 = 1000;
    require_root();
    let mut sb = Sandbox::build(Arms::Two, 2, 8080).unwrap();
    sb.serve_vip(VIP.into(), Some(HTTP_PORT)).unwrap();
    sb.direct_return().unwrap();
    let _decaps: Vec<DecapGuard> = sb
        .backends
        .iter()
        .map(|b| DecapGuard::start(&b.ns, &[&b.ifname], &[]).unwrap())
        .collect();
    let backends = sb
        .backends
        .iter()
        .map(|b| format!("{{ address = \"{}:{HTTP_PORT}\" }}", b.addr))
        .collect::<Vec<_>>()
        .join(", ");
    let config = format!(
        "[lb]\ninterfaces = [{}]\nxdp_mode = \"native\"\nconntrack = {{ size = 16384 }}\n\
         dsr_flood_rate = {RATE}\n\n\
         [[service]]\nname = \"web\"\nvip = \"{VIP}:{HTTP_PORT}\"\nforwarding = \"ipip\"\n\
         backends = [{backends}]\n[service.check]\nkind = \"none\"\n",
        sb.interfaces_toml(),
    );
    let daemon = Daemon::start(&sb.lb, &config).unwrap();
    let client = &sb.client;
    // HTTP: the client speaks first, so a handshake's last ACK lost in the flood is recovered
    // by the request's retransmission (as for any client behind a flooded link).
    let request = || http_get(&client.ns, &format!("http://{VIP}:{HTTP_PORT}/"), &[]);
    wait_until(|| request().is_ok());
    let before = daemon.status().unwrap();

    // 50 times the flood rate of both CPUs together, and what 2 shared cores carry
    // beside the backends' kernels answering each SYN (as fast as one core sends, the
    // machine itself is the bottleneck: legitimate requests time out waiting for a CPU).
    let flood = sb
        .syn_flood((VIP, HTTP_PORT), 2_000_000, Duration::from_secs(5), 100_000)
        .unwrap();
    wait_until(|| {
        daemon
            .status()
            .is_ok_and(|s| s.counter("dsr_flood").unwrap_or(0) > 0)
    });
    let (ok, failed) = flood.meanwhile(request);
    let sent = flood.finish();
    let after = daemon.status().unwrap();
    let moved = |name: &str| after.counter(name).unwrap_or(0) - before.counter(name).unwrap_or(0);
    eprintln!(
        "flood of {sent} SYNs from spoofed sources: {ok} of {} requests succeeded; \
         ct_new {}, dsr_flood {}, ct_evicted {}, ct_miss_midstream {}",
        ok + failed,
        moved("ct_new"),
        moved("dsr_flood"),
        moved("ct_evicted"),
        moved("ct_miss_midstream"),
    );
    assert!(sent >= 100_000, "the flood sent only {sent} frames");
    assert!(
        ok + failed >= 10,
        "too few requests to judge: {ok} + {failed}"
    );
    assert!(
        ok * 100 >= (ok + failed) * 95,
        "{ok} of {} requests during the flood succeeded",
        ok + failed
    );
    // The flood reached lb and went on in flood mode...
    assert!(
        moved("dsr_flood") * 2 >= sent,
        "{} of {sent} flood SYNs in flood mode",
        moved("dsr_flood")
    );
    // ... taking at most each CPU's first second's worth of entries at its start (two CPUs,
    // a window on each side of a second's edge), besides the requests' own.
    let allowed = 4 * RATE + 2 * (ok + failed);
    assert!(
        moved("ct_new") <= allowed,
        "{} table entries made during the flood (at most {allowed})",
        moved("ct_new")
    );
    assert!(
        moved("ct_evicted") * 100 <= sent,
        "{} live entries evicted",
        moved("ct_evicted")
    );
    assert!(daemon.status().is_ok(), "the daemon stays up");
}
