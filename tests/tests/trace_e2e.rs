//! `lb trace` against a real `lb run` in the sandbox: the datapath's decisions as lines (a new
//! flow with its backend and SNAT port, a drop with its verdict, a flow rescheduled off a
//! disabled backend), its filters (a service, a client prefix) with two traces at once, and
//! the trace off again once `lb trace` ends, interrupted or on time.

use std::{
    io::{BufRead as _, Write as _},
    net::{SocketAddr, UdpSocket},
    process::{Child, Stdio},
    sync::mpsc::{Receiver, RecvTimeoutError},
    time::{Duration, Instant},
};

use lb::model::TraceState;
use lb_tests::{
    daemon::Daemon,
    lb_bin, require_root,
    servers::connect,
    topology::{Arms, Sandbox, VIP},
};

/// Fast checks so the backends are healthy within a second.
const CHECK: &str = "[service.check]\ntimeout = \"200ms\"\ninterval = \"300ms\"\nhealthy_threshold = 2\nunhealthy_threshold = 2\n";

fn start() -> (Sandbox, Daemon) {
    require_root();
    let sb = Sandbox::build(Arms::Two, 3, 8080).unwrap();
    let config = sb.config(80, &[], "").replacen(
        "\n[[service]]\nname = \"udp\"",
        &format!("\n{CHECK}\n[[service]]\nname = \"udp\""),
        1,
    );
    let daemon = Daemon::start(&sb.lb, &config).unwrap();
    for b in &sb.backends {
        daemon.wait_state(
            "tcp",
            &format!("{}:8080", b.addr),
            "healthy",
            Duration::from_secs(5),
        );
    }
    (sb, daemon)
}

/// A running `lb trace`, its lines read as they come. Interrupted (SIGINT, as Ctrl-C) and
/// reaped when dropped.
struct Tracer {
    child: Child,
    lines: Receiver<String>,
    seen: Vec<String>,
}

impl Tracer {
    fn start(daemon: &Daemon, args: &[&str]) -> Self {
        let mut child = daemon
            .ns
            .command(lb_bin())
            .arg("trace")
            .args(args)
            .args(["--api", "127.0.0.1:9090"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .stdin(Stdio::null())
            .spawn()
            .expect("starting lb trace");
        let out = child.stdout.take().expect("piped");
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(out).lines() {
                if tx.send(line.unwrap_or_default()).is_err() {
                    return;
                }
            }
        });
        let mut t = Self {
            child,
            lines,
            seen: Vec::new(),
        };
        t.wait(|l| l.contains(" tracing "), "its first line");
        t
    }

    /// The first line from now on that `want` accepts (every line is kept in `seen`).
    fn wait(&mut self, want: impl Fn(&str) -> bool, what: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    eprintln!("lb trace: {line}");
                    self.seen.push(line.clone());
                    if want(&line) {
                        return line;
                    }
                }
                Err(RecvTimeoutError::Timeout) => {
                    panic!("lb trace printed no {what} in 10 s: {:#?}", self.seen)
                }
                Err(RecvTimeoutError::Disconnected) => {
                    panic!("lb trace ended before {what}: {:#?}", self.seen)
                }
            }
        }
    }

    /// Ctrl-C, then its exit.
    fn interrupt(&mut self) {
        // SAFETY: a signal to our own child, by its pid.
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGINT) };
        let _ = self.child.wait();
    }
}

impl Drop for Tracer {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            self.interrupt();
        }
    }
}

fn trace_state(daemon: &Daemon) -> TraceState {
    let (status, body) = daemon.http("GET", "http://127.0.0.1:9090/v1/trace", &[]);
    assert_eq!(status, 200, "{body}");
    serde_json::from_str(&body).unwrap()
}

/// Waits until the datapath's gate is closed and no session is open.
fn wait_off(daemon: &Daemon) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let state = trace_state(daemon);
        if !state.on && state.sessions == 0 {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the trace is still on 5 s after lb trace ended: {state:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// One UDP datagram from the client to `to`, answered or not.
fn datagram(sb: &Sandbox, to: SocketAddr) -> Option<String> {
    let socket = sb.client.ns.enter(|| UdpSocket::bind("0.0.0.0:0")).unwrap();
    socket.connect(to).unwrap();
    socket
        .set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    socket.send(b"ping").unwrap();
    let mut buf = [0u8; 256];
    let n = socket.recv(&mut buf).ok()?;
    Some(String::from_utf8_lossy(&buf[..n]).into_owned())
}

fn backend_addr(sb: &Sandbox, name: &str) -> String {
    let b = sb.backends.iter().find(|b| b.name == name).unwrap();
    format!("{}:8080", b.addr)
}

#[test]
fn new_flows_drops_and_reschedules_are_traced_then_the_trace_is_off() {
    let (sb, daemon) = start();
    assert_eq!(
        trace_state(&daemon),
        TraceState {
            on: false,
            sessions: 0,
            limited: 0,
            lost: 0
        },
        "off until someone traces"
    );
    let mut t = Tracer::start(&daemon, &[]);
    assert!(trace_state(&daemon).on, "on while lb trace runs");

    // A new flow: its backend (the one that greeted) and SNAT port.
    let (mut conn, name) = connect(&sb.client.ns, SocketAddr::from((VIP, 80))).unwrap();
    let port = conn.local_addr().unwrap().port();
    let addr = backend_addr(&sb, &name);
    let client = format!("{}:{port}", sb.client.addr());
    let line = t.wait(|l| l.contains(&client), "the new flow");
    let head = format!("new flow {client} → {VIP}:80 tcp (tcp): backend {addr} (id ");
    assert!(line.contains(&head), "{line}");
    assert!(line.contains(", snat port "), "{line}");
    // The time of day first: HH:MM:SS.mmm.
    assert_eq!(line.as_bytes()[2], b':', "{line}");
    assert_eq!(line.as_bytes()[8], b'.', "{line}");

    // A drop: UDP to a port no service has.
    assert_eq!(datagram(&sb, SocketAddr::from((VIP, 81))), None);
    let line = t.wait(|l| l.contains("dropped"), "the drop");
    assert!(
        line.contains(&format!(" → {VIP}:81 udp: drop_no_service")),
        "{line}"
    );

    // A reschedule: the flow's backend disabled, its next packet moves.
    let out = daemon.lb(&["backend", "disable", "tcp", &addr]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let _ = conn.write_all(b"still there?\n");
    let line = t.wait(|l| l.contains("rescheduled"), "the reschedule");
    assert!(
        line.contains(&format!(
            "rescheduled {client} → {VIP}:80 tcp (tcp): backend {addr} (id "
        )),
        "{line}"
    );
    assert!(line.contains(") unavailable → backend "), "{line}");
    assert!(!line.ends_with(&format!("→ backend {addr}")), "{line}");
    let out = daemon.lb(&["backend", "enable", "tcp", &addr]);
    assert!(out.status.success());

    // Interrupted: the daemon ends the trace, the datapath's gate is closed.
    t.interrupt();
    wait_off(&daemon);
}

#[test]
fn filters_show_only_their_service_and_client_and_traces_end_on_time() {
    let (sb, daemon) = start();
    let mut udp = Tracer::start(
        &daemon,
        &[
            "--service",
            "udp",
            "--client",
            &format!("{}/24", sb.client.addr()),
        ],
    );
    let mut elsewhere = Tracer::start(&daemon, &["--client", "10.9.9.9"]);
    // Unknown services and malformed clients are refused.
    let out = daemon.lb(&["trace", "--service", "nope", "--for", "1s"]);
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    let out = daemon.lb(&["trace", "--client", "10.0.1.2/40", "--for", "1s"]);
    assert_eq!(out.status.code(), Some(64), "{out:?}");

    // A TCP flow first, then a UDP one: only the UDP one shows.
    let (_conn, _) = connect(&sb.client.ns, SocketAddr::from((VIP, 80))).unwrap();
    let answer = datagram(&sb, SocketAddr::from((VIP, 80)));
    let name = answer.as_deref().and_then(|a| a.split(':').next()).unwrap();
    let line = udp.wait(|l| l.contains("new flow"), "the UDP flow");
    assert!(
        line.contains(&format!(
            "udp (udp): backend {}:8080 (id ",
            sb.backends.iter().find(|b| b.name == name).unwrap().addr
        )),
        "{line}"
    );
    assert!(
        !udp.seen.iter().any(|l| l.contains("tcp (tcp)")),
        "the TCP flow is not this trace's: {:#?}",
        udp.seen
    );
    // The other trace's client sent nothing: it shows nothing but its first line.
    std::thread::sleep(Duration::from_millis(300));
    while let Ok(l) = elsewhere.lines.try_recv() {
        elsewhere.seen.push(l);
    }
    assert!(
        !elsewhere.seen.iter().any(|l| l.contains("new flow")),
        "{:#?}",
        elsewhere.seen
    );
    assert_eq!(trace_state(&daemon).sessions, 2);
    drop(udp);
    drop(elsewhere);
    wait_off(&daemon);

    // On time: `--for 1s` ends by itself, exit 0, and the trace is off.
    let started = Instant::now();
    let out = daemon.lb(&["trace", "--for", "1s"]);
    assert!(out.status.success(), "{out:?}");
    assert!(started.elapsed() >= Duration::from_secs(1));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("trace ended: its time is up"), "{text}");
    wait_off(&daemon);
}
