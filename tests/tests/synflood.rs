//! A SYN flood must not lock legitimate clients out (issue 13). With `conntrack = { size = 4096 }`
//! hping3 floods the VIP from one attacker address (its own, nothing spoofed, inside the test's
//! namespaces, 10 s at most) while another client makes sequential HTTP requests through lb:
//! nearly all of them must succeed, an established connection must survive, and the counters
//! must say what the flood did.
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
         [[service]]\nname = \"web\"\nvip = \"{VIP}:80\"\nbackends = [{}]\n\
         [service.check]\nkind = \"none\"\n\n\
         [[service]]\nname = \"echo\"\nvip = \"{VIP}:7\"\nbackends = [{}]\n\
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
        let out = client
            .ns
            .command("curl")
            .args([
                "-s",
                "-o",
                "/dev/null",
                "-w",
                "%{http_code}",
                "--max-time",
                "3",
                "--interface",
                LEGIT,
                &format!("http://{VIP}/"),
            ])
            .stdin(Stdio::null())
            .output()
            .unwrap();
        if out.status.success() && out.stdout == b"200" {
            ok += 1;
            slowest = slowest.max(t.elapsed());
        } else {
            eprintln!(
                "request failed after {:?}: curl {:?}",
                t.elapsed(),
                out.status.code()
            );
            failed += 1;
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
