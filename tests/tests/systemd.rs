//! lb as operators install and run it (issue 21): the Debian package and what it holds, its
//! unit accepted by systemd-analyze, the packaged lb running with no more than the unit's
//! capabilities, and systemd's notification protocol: READY=1 once the API answers, watchdog
//! pings at half of WATCHDOG_USEC, none once the verdict loop stalls, STOPPING=1 on SIGTERM.

use std::{
    os::unix::net::UnixDatagram,
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use lb_tests::{
    daemon::{Daemon, Launch, PinGuard, TempDir},
    lb_bin, require_root,
    topology::{Arms, Sandbox},
};

/// A fast half-open check on the sandbox's TCP service (raw sockets: CAP_NET_RAW).
fn config(sb: &Sandbox, lb_extra: &str) -> String {
    let check = "[service.check]\nkind = \"tcp\"\ntimeout = \"200ms\"\ninterval = \"300ms\"\nhealthy_threshold = 2\nunhealthy_threshold = 2\n";
    sb.config(80, &[], "")
        .replacen(
            "\n[[service]]\nname = \"udp\"",
            &format!("\n{check}\n[[service]]\nname = \"udp\""),
            1,
        )
        .replacen("[lb]\n", &format!("[lb]\n{lb_extra}"), 1)
}

/// Waits until every backend of the TCP service is healthy (probed and answering).
fn all_healthy(daemon: &Daemon, sb: &Sandbox) {
    for b in &sb.backends {
        let backend = format!("{}:8080", b.addr);
        daemon.wait_state("tcp", &backend, "healthy", Duration::from_secs(10));
    }
}

/// The xtask binary running these tests (`cargo xtask test` says where), or the one built
/// beside lb.
fn xtask() -> PathBuf {
    std::env::var_os("LB_XTASK")
        .map(PathBuf::from)
        .unwrap_or_else(|| lb_bin().with_file_name("xtask"))
}

fn ok(cmd: &mut Command) -> String {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?}: {}\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The capability names of the unit's `CapabilityBoundingSet=`.
fn unit_capabilities(unit: &str) -> Vec<String> {
    unit.lines()
        .find_map(|l| l.strip_prefix("CapabilityBoundingSet="))
        .expect("the unit bounds its capabilities")
        .split_whitespace()
        .map(str::to_owned)
        .collect()
}

/// Capability numbers (linux/capability.h) of the names the unit may use.
fn capability_bit(name: &str) -> u32 {
    match name {
        "CAP_NET_ADMIN" => 12,
        "CAP_NET_RAW" => 13,
        "CAP_SYS_RESOURCE" => 24,
        "CAP_PERFMON" => 38,
        "CAP_BPF" => 39,
        other => panic!("unexpected capability {other}"),
    }
}

#[test]
fn the_package_holds_what_it_must_and_runs_with_only_the_units_capabilities() {
    require_root();
    let dir = TempDir::new().unwrap();
    let out = dir.0.join("out");
    ok(Command::new(xtask())
        .args(["dist", "--binary"])
        .arg(lb_bin())
        .arg("--out-dir")
        .arg(&out));
    let deb = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "deb"))
        .expect("a .deb");

    let contents = ok(Command::new("dpkg-deb").arg("--contents").arg(&deb));
    for path in [
        "./usr/bin/lb",
        "./usr/lib/systemd/system/lb.service",
        "./etc/lb/lb.toml",
        "./usr/share/bash-completion/completions/lb",
        "./usr/share/zsh/vendor-completions/_lb",
        "./usr/share/fish/vendor_completions.d/lb.fish",
        "./usr/share/man/man1/lb.1.gz",
        "./usr/share/man/man1/lb-run.1.gz",
        "./usr/share/doc/lb/copyright",
        "./usr/share/doc/lb/docs/configuration.md",
        "./usr/share/doc/lb/docs/config.schema.json",
    ] {
        assert!(
            contents.lines().any(|l| l.ends_with(path)),
            "{path} missing:\n{contents}"
        );
    }
    let fields = ok(Command::new("dpkg-deb")
        .arg("--field")
        .arg(&deb)
        .args(["Package", "Depends", "Suggests"]));
    assert!(
        fields.contains("Package: lb")
            && fields.contains("iproute2")
            && fields.contains("Suggests: bird2"),
        "{fields}"
    );
    let conffiles = ok(Command::new("dpkg-deb")
        .arg("--info")
        .arg(&deb)
        .arg("conffiles"));
    assert_eq!(conffiles.trim(), "/etc/lb/lb.toml");

    // Installed into a throw-away root.
    let root = dir.0.join("root");
    ok(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&root));
    let lb = root.join("usr/bin/lb");
    let checked = ok(Command::new(&lb)
        .arg("check-config")
        .arg(root.join("etc/lb/lb.toml")));
    assert!(checked.contains(": ok"), "{checked}");
    let page = ok(Command::new("gzip")
        .arg("-dc")
        .arg(root.join("usr/share/man/man1/lb.1.gz")));
    assert!(page.contains(".TH lb 1"), "{page}");
    let completion = root.join("usr/share/bash-completion/completions/lb");
    let complete = ok(Command::new("bash")
        .arg("-c")
        .arg(format!("source {} && complete -p lb", completion.display())));
    assert!(complete.contains(" lb"), "{complete}");

    let unit = std::fs::read_to_string(root.join("usr/lib/systemd/system/lb.service")).unwrap();
    for line in [
        "Type=notify",
        "ExecStart=/usr/bin/lb run --config /etc/lb/lb.toml",
        "ExecReload=/usr/bin/lb reload",
        "Restart=always",
        "WatchdogSec=",
        "LimitNOFILE=",
    ] {
        assert!(unit.lines().any(|l| l.starts_with(line)), "{line}:\n{unit}");
    }
    // systemd's own check, on the unit with its paths into the throw-away root (its man pages
    // are not installed on this host). It exits 0 on warnings too: none may be printed.
    if Command::new("systemd-analyze")
        .arg("--version")
        .output()
        .is_ok()
    {
        let rooted = dir.0.join("lb.service");
        std::fs::write(
            &rooted,
            unit.replace("/usr/bin/lb", &lb.display().to_string()),
        )
        .unwrap();
        let out = Command::new("systemd-analyze")
            .args(["verify", "--man=no"])
            .arg(&rooted)
            .output()
            .unwrap();
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success() && said.trim().is_empty(), "{said}");
    } else {
        eprintln!("systemd-analyze is not installed: the unit is not verified");
    }

    // The packaged binary, with no capability beyond the unit's bounding set, loads, pins and
    // attaches the datapath and runs half-open probes.
    let caps = unit_capabilities(&unit);
    let bounding = format!(
        "-all,{}",
        caps.iter()
            .map(|c| format!("+{}", c.trim_start_matches("CAP_").to_lowercase()))
            .collect::<Vec<_>>()
            .join(",")
    );
    let sb = Sandbox::build(Arms::Two, 2, 8080).unwrap();
    let pin = PinGuard::unique();
    let config = config(&sb, &format!("pin_path = \"{}\"\n", pin.0));
    let daemon = Daemon::start_with(
        &sb.lb,
        &config,
        &Launch {
            wrapper: &["setpriv", "--bounding-set", &bounding, "--inh-caps", "-all"],
            pinned: true,
            binary: Some(&lb),
            ..Launch::default()
        },
    )
    .unwrap();
    let status = std::fs::read_to_string(format!("/proc/{}/status", daemon.process.pid())).unwrap();
    let bounded = status
        .lines()
        .find_map(|l| l.strip_prefix("CapBnd:"))
        .map(|hex| u64::from_str_radix(hex.trim(), 16).unwrap())
        .unwrap();
    let expected = caps.iter().fold(0u64, |m, c| m | 1 << capability_bit(c));
    assert_eq!(bounded, expected, "lb ran with other capabilities");
    all_healthy(&daemon, &sb);
    assert!(Path::new(&pin.0).exists(), "the datapath was pinned");
}

/// Datagrams on a socket standing in for systemd's `$NOTIFY_SOCKET`.
struct Notifications {
    socket: UnixDatagram,
    path: PathBuf,
    _dir: TempDir,
}

impl Notifications {
    fn new() -> Self {
        let dir = TempDir::new().unwrap();
        let path = dir.0.join("notify");
        let socket = UnixDatagram::bind(&path).unwrap();
        Self {
            socket,
            path,
            _dir: dir,
        }
    }

    /// The next datagram within `within`, with when it came.
    fn next(&self, within: Duration) -> Option<(Instant, String)> {
        self.socket.set_read_timeout(Some(within)).unwrap();
        let mut buf = [0u8; 4096];
        let n = self.socket.recv(&mut buf).ok()?;
        Some((
            Instant::now(),
            String::from_utf8_lossy(&buf[..n]).into_owned(),
        ))
    }

    /// Waits up to `within` for a datagram holding `line`.
    fn wait_for(&self, line: &str, within: Duration) -> String {
        let deadline = Instant::now() + within;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.next(left.max(Duration::from_millis(1))) {
                Some((_, text)) if text.lines().any(|l| l == line) => return text,
                Some(_) => {}
                None => panic!("no {line} within {within:?}"),
            }
        }
    }

    /// When each WATCHDOG=1 came during `period`.
    fn pings(&self, period: Duration) -> Vec<Instant> {
        let end = Instant::now() + period;
        let mut at = Vec::new();
        while let Some(left) = end.checked_duration_since(Instant::now()) {
            match self.next(left.max(Duration::from_millis(1))) {
                Some((when, text)) if text.lines().any(|l| l == "WATCHDOG=1") => at.push(when),
                _ => {}
            }
        }
        at
    }
}

#[test]
fn ready_comes_once_the_api_answers_then_the_watchdog_pings_within_its_interval() {
    require_root();
    let sb = Sandbox::build(Arms::Two, 2, 8080).unwrap();
    let notes = Notifications::new();
    let socket = notes.path.display().to_string();
    // READY=1 is read while lb starts: the API must answer at that moment.
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let lb_ns = sb.lb.clone();
    std::thread::scope(|s| {
        s.spawn(|| {
            let text = notes.wait_for("READY=1", Duration::from_secs(30));
            let answered = lb_ns
                .command(lb_bin())
                .args(["stats", "--json"])
                .output()
                .unwrap();
            ready_tx.send((text, answered)).unwrap();
        });
        let mut daemon = Daemon::start_with(
            &sb.lb,
            &config(&sb, ""),
            &Launch {
                env: &[("NOTIFY_SOCKET", &socket), ("WATCHDOG_USEC", "2000000")],
                ..Launch::default()
            },
        )
        .unwrap();
        let (ready, answered) = ready_rx.recv_timeout(Duration::from_secs(30)).unwrap();
        assert!(
            answered.status.success(),
            "READY=1 before the API answered: {}",
            String::from_utf8_lossy(&answered.stderr)
        );
        assert!(
            ready.contains("STATUS=2 services") && ready.contains("backends available"),
            "{ready}"
        );

        // WATCHDOG_USEC of 2 s: a ping every second (half of it).
        let pings = notes.pings(Duration::from_secs(5));
        assert!(pings.len() >= 4, "{} pings in 5 s", pings.len());
        let widest = pings
            .windows(2)
            .map(|w| w[1] - w[0])
            .max()
            .unwrap_or_default();
        // Past WATCHDOG_USEC systemd would restart lb.
        assert!(widest < Duration::from_secs(2), "a gap of {widest:?}");
        all_healthy(&daemon, &sb);
        assert_eq!(daemon.stop(libc::SIGTERM), Some(0), "{}", daemon.log_text());
        notes.wait_for("STOPPING=1", Duration::from_secs(5));
    });
}

#[test]
fn a_stalled_verdict_loop_stops_the_watchdog_pings() {
    require_root();
    let sb = Sandbox::build(Arms::Two, 1, 8080).unwrap();
    let notes = Notifications::new();
    let socket = notes.path.display().to_string();
    let daemon = Daemon::start_with(
        &sb.lb,
        &config(&sb, ""),
        &Launch {
            env: &[
                ("NOTIFY_SOCKET", &socket),
                ("WATCHDOG_USEC", "1000000"),
                ("LB_TEST_STALL_WRITER_AFTER_MS", "3000"),
            ],
            ..Launch::default()
        },
    )
    .unwrap();
    notes.wait_for("READY=1", Duration::from_secs(30));
    notes.wait_for("WATCHDOG=1", Duration::from_secs(5));
    // The writer says when it stalls; the pings sent before are drained, then none may come.
    let deadline = Instant::now() + Duration::from_secs(30);
    while !daemon.log_text().contains("stalls for good") {
        assert!(
            Instant::now() < deadline,
            "no stall:\n{}",
            daemon.log_text()
        );
        let _ = notes.next(Duration::from_millis(100));
    }
    while notes.next(Duration::from_millis(1)).is_some() {}
    let after = notes.pings(Duration::from_secs(3));
    assert!(
        after.is_empty(),
        "{} pings after the writer stalled\n{}",
        after.len(),
        daemon.log_text()
    );
}
