//! Changing services and backends at runtime (SPEC §6): through the API and the CLI, written
//! into the config file (comments kept), applied while traffic flows, kept across a SIGHUP and
//! a restart; a file edited by hand, a stale version, a read-only file and a full disk refused
//! with nothing changed; a fuzz of bodies that never panics the daemon nor half-applies.

use std::{
    net::SocketAddr,
    path::PathBuf,
    time::{Duration, Instant},
};

use lb::{
    client::{self, Extra},
    model::{ChangeReply, ConfigReply},
};
use lb_tests::{
    daemon::Daemon,
    netns::Netns,
    require_root,
    rng::Rng,
    servers::connect,
    topology::{Arms, Sandbox, VIP},
    traffic::ConnectLoop,
};

const PORT: u16 = 8080;

fn vip() -> SocketAddr {
    SocketAddr::from((VIP, 80))
}

/// A hand-written config: comments, the first two backends of the sandbox, fast checks.
fn config(sb: &Sandbox) -> String {
    let b = |i: usize| format!("{}:{PORT}", sb.backends[i].addr);
    format!(
        "# lb on the test bed: every comment here must survive the API's changes\n\
         [lb]\n\
         interfaces = [{}]   # the balancer's legs\n\n\
         # The service under test.\n\
         [[service]]\n\
         name = \"web\"\n\
         vip = \"{}\"\n\
         backends = [\n    {{ address = \"{}\", weight = 1 }},  # first\n    {{ address = \"{}\", weight = 1 }},\n]\n\n\
         [service.check]\n\
         kind = \"tcp\"        # half-open\n\
         timeout = \"200ms\"\n\
         interval = \"300ms\"\n\
         healthy_threshold = 1\n",
        sb.interfaces_toml(),
        vip(),
        b(0),
        b(1)
    )
}

fn start() -> (Sandbox, Daemon) {
    require_root();
    let sb = Sandbox::build(Arms::Two, 3, PORT).unwrap();
    let daemon = Daemon::start(&sb.lb, &config(&sb)).unwrap();
    (sb, daemon)
}

fn code(out: &std::process::Output) -> i32 {
    out.status.code().unwrap_or(-1)
}

fn ok(out: &std::process::Output) -> String {
    assert_eq!(
        code(out),
        0,
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// One API request from the daemon's namespace: (status, body).
fn api(
    d: &Daemon,
    method: &str,
    path: &str,
    headers: &[(&'static str, &str)],
    body: Option<&[u8]>,
) -> (u16, String) {
    let addr: SocketAddr = d.api.parse().unwrap();
    let mut headers: Vec<(&'static str, String)> =
        headers.iter().map(|(k, v)| (*k, (*v).to_owned())).collect();
    // Not the CLI's: its changes are the API's in events.
    headers.push(("user-agent", "curl/8".to_owned()));
    let extra = Extra {
        headers,
        json: body.map(<[u8]>::to_vec),
    };
    let (method, path) = (method.to_owned(), path.to_owned());
    d.ns.block_on(|| async move { client::request_with(addr, &method, &path, None, &extra).await })
        .unwrap()
}

fn running(d: &Daemon) -> ConfigReply {
    let (status, body) = api(d, "GET", "/v1/config", &[], None);
    assert_eq!(status, 200, "{body}");
    serde_json::from_str(&body).unwrap()
}

/// Which backends greet `n` new connections, while nothing fails.
fn greeters(ns: &Netns, n: usize) -> std::collections::BTreeSet<String> {
    (0..n).map(|_| connect(ns, vip()).unwrap().1).collect()
}

#[test]
fn backends_added_and_removed_under_load_lose_no_connection() {
    let (sb, d) = start();
    let [b0, b1, b2] = [0, 1, 2].map(|i| format!("{}:{PORT}", sb.backends[i].addr));
    for b in [&b0, &b1] {
        d.wait_state("web", b, "healthy", Duration::from_secs(10));
    }
    let load = ConnectLoop::start(&sb.client.ns, vip());
    load.wait(20);
    // An established connection to the backend about to be removed drains, as a reload's do.
    let mut kept = None;
    for _ in 0..50 {
        let (stream, name) = connect(&sb.client.ns, vip()).unwrap();
        if name == "backend-0" {
            kept = Some(stream);
            break;
        }
    }
    let mut kept = kept.expect("a connection to backend-0");

    // Added through the CLI: it is in the file, with every comment where it was.
    let out = ok(&d.lb(&["backend", "add", "web", &b2, "--weight", "2"]));
    assert!(
        out.contains(&format!("+ web: backend {b2} weight 2")),
        "{out}"
    );
    let file = std::fs::read_to_string(&d.config).unwrap();
    let want = config(&sb).replace(
        &format!("    {{ address = \"{b1}\", weight = 1 }},\n"),
        &format!(
            "    {{ address = \"{b1}\", weight = 1 }},\n    {{ address = \"{b2}\", weight = 2 }},\n"
        ),
    );
    assert_eq!(file, want);
    d.wait_state("web", &b2, "healthy", Duration::from_secs(10));
    let deadline = Instant::now() + Duration::from_secs(10);
    while !greeters(&sb.client.ns, 30).contains("backend-2") {
        assert!(Instant::now() < deadline, "backend-2 takes no new flow");
    }
    load.wait(20);

    // Removed through the API: no new flow goes there, the established one goes on.
    let (status, body) = api(
        &d,
        "DELETE",
        &format!("/v1/services/web/backends/{b0}"),
        &[],
        None,
    );
    assert_eq!(status, 200, "{body}");
    load.wait(50);
    assert!(!greeters(&sb.client.ns, 60).contains("backend-0"));
    lb_tests::traffic::echo_once(&mut kept, b"still there");
    let (made, failures) = load.finish();
    assert!(
        failures.is_empty(),
        "{} of {made} failed: {failures:?}",
        failures.len()
    );
    assert!(made >= 90, "{made}");

    // Events say who changed what.
    let events = d.events().unwrap().events;
    assert!(
        events
            .iter()
            .any(|e| e.source == "config (cli)" && e.backend == b2 && e.from == "unused"),
        "{events:#?}"
    );
    assert!(
        events
            .iter()
            .any(|e| e.source == "config (api)" && e.backend == b0 && e.to == "unused"),
        "{events:#?}"
    );
    let status = d.status().unwrap();
    let c = status.config.unwrap();
    assert_eq!(c.writes.applied, 2);
    assert_eq!(c.last_change.unwrap().who, "api");
}

#[test]
fn changes_outlive_a_sighup_and_a_restart_and_show_everywhere() {
    let (sb, mut d) = start();
    let b2 = format!("{}:{PORT}", sb.backends[2].addr);
    // A new service, from a TOML file; a dry run first changes nothing.
    let body = d.config.with_file_name("echo.toml");
    std::fs::write(
        &body,
        format!(
            "vip = \"{}:81\"\nbackends = [{{ address = \"{b2}\" }}]\n[check]\nkind = \"none\"\n",
            VIP
        ),
    )
    .unwrap();
    let before = std::fs::read(&d.config).unwrap();
    let out = ok(&d.lb(&[
        "service",
        "add",
        "echo",
        "--file",
        body.to_str().unwrap(),
        "--dry-run",
    ]));
    assert!(
        out.starts_with("dry run, nothing applied") && out.contains("+ service echo"),
        "{out}"
    );
    assert_eq!(std::fs::read(&d.config).unwrap(), before);
    let out = ok(&d.lb(&["service", "add", "echo", "--file", body.to_str().unwrap()]));
    assert!(out.contains("+ service echo"), "{out}");
    // Added again: refused (it exists), exit 75.
    let again = d.lb(&["service", "add", "echo", "--vip", "10.100.0.1:82"]);
    assert_eq!(
        code(&again),
        lb::exit::CONFLICT,
        "{}",
        String::from_utf8_lossy(&again.stderr)
    );
    // `set` changes only what it names.
    ok(&d.lb(&[
        "service",
        "set",
        "echo",
        "--forwarding",
        "nat",
        "--backend",
        &format!("{b2}=3"),
    ]));
    let (_, name) = connect(&sb.client.ns, SocketAddr::from((VIP, 81))).unwrap();
    assert_eq!(name, "backend-2");

    let check = |d: &Daemon, when: &str| {
        let s = d.status().unwrap();
        let echo = s
            .service("echo")
            .unwrap_or_else(|| panic!("{when}: no service echo"));
        assert_eq!(echo.backends.len(), 1, "{when}");
        assert_eq!(echo.backends[0].weight, 3, "{when}");
        let shown = ok(&d.lb(&["config", "show"]));
        assert!(
            shown.contains("# The service under test.") && shown.contains("name = \"echo\""),
            "{when}: {shown}"
        );
    };
    check(&d, "after the change");
    // The page and the metrics show the version.
    let version = running(&d).version;
    let (_, page) = d.http(
        "GET",
        &format!("http://{}/v1/healthcheck", d.api),
        &["Accept: text/html"],
    );
    assert!(page.contains(&format!("version {version}")), "{page}");
    let (_, metrics) = d.http("GET", &format!("http://{}/metrics", d.api), &[]);
    assert!(
        metrics.contains(&format!("version=\"{version}\"")),
        "{metrics}"
    );
    assert!(
        metrics.contains("lb_config_writes_total{result=\"applied\"} 2"),
        "{metrics}"
    );

    d.process.signal(libc::SIGHUP);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !d.log_text().contains("source=\"reload\"") {
        assert!(
            Instant::now() < deadline,
            "no reload after SIGHUP:\n{}",
            d.log_text()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    check(&d, "after SIGHUP");
    assert_eq!(running(&d).version, version);

    // `lb config diff` against the file: nothing; against an edited copy: that edit.
    assert_eq!(
        ok(&d.lb(&["config", "diff", d.config.to_str().unwrap()])),
        "no change\n"
    );
    let copy = d.config.with_file_name("copy.toml");
    std::fs::write(
        &copy,
        std::fs::read_to_string(&d.config)
            .unwrap()
            .replace("weight = 3", "weight = 4"),
    )
    .unwrap();
    let out = ok(&d.lb(&["config", "diff", copy.to_str().unwrap()]));
    assert_eq!(out, format!("~ echo: backend {b2} weight 3 -> 4\n"));

    // A restart on the same file finds every change.
    let config_path = d.config.clone();
    d.stop(libc::SIGTERM);
    let text = std::fs::read_to_string(&config_path).unwrap();
    drop(d);
    let d = Daemon::start(&sb.lb, &text).unwrap();
    check(&d, "after a restart");
    let (_, name) = connect(&sb.client.ns, SocketAddr::from((VIP, 81))).unwrap();
    assert_eq!(name, "backend-2");
}

#[test]
fn a_hand_edit_a_stale_version_and_a_read_only_file_change_nothing() {
    let (sb, d) = start();
    let b2 = format!("{}:{PORT}", sb.backends[2].addr);
    let v1 = running(&d).version;
    let tag = format!("\"{v1}\"");
    let path = format!("/v1/services/web/backends/{b2}");
    // A change against v1 succeeds; another against v1 is refused (412), the CLI says 75.
    let (status, body) = api(&d, "PUT", &path, &[("if-match", &tag)], Some(b"{}"));
    assert_eq!(status, 200, "{body}");
    let reply: ChangeReply = serde_json::from_str(&body).unwrap();
    let (status, body) = api(&d, "DELETE", &path, &[("if-match", &tag)], None);
    assert_eq!(status, 412, "{body}");

    // A hand edit between two API calls: the next call is refused (409), the file keeps the
    // hand edit, the daemon its running version; after `lb reload` calls work again.
    let edited = std::fs::read_to_string(&d.config).unwrap() + "# edited by hand\n";
    std::fs::write(&d.config, &edited).unwrap();
    let (status, body) = api(&d, "DELETE", &path, &[], None);
    assert_eq!(status, 409, "{body}");
    assert!(body.contains("lb reload"), "{body}");
    assert_eq!(std::fs::read_to_string(&d.config).unwrap(), edited);
    assert_eq!(running(&d).version, reply.version);
    let out = d.lb(&["backend", "rm", "web", &b2]);
    assert_eq!(code(&out), lb::exit::CONFLICT);
    ok(&d.lb(&["reload"]));
    ok(&d.lb(&["backend", "rm", "web", &b2]));
    assert!(
        std::fs::read_to_string(&d.config)
            .unwrap()
            .ends_with("# edited by hand\n")
    );

    // A read-only file: the change fails, nothing is written or applied.
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&d.config, std::fs::Permissions::from_mode(0o444)).unwrap();
    let before = std::fs::read(&d.config).unwrap();
    let version = running(&d).version;
    let out = d.lb(&["backend", "add", "web", &b2]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(code(&out), lb::exit::FAILURE, "{err}");
    assert!(
        err.contains("read-only") && err.contains("nothing was applied"),
        "{err}"
    );
    assert_eq!(std::fs::read(&d.config).unwrap(), before);
    assert_eq!(running(&d).version, version);
    assert!(
        d.status()
            .unwrap()
            .service("web")
            .unwrap()
            .backend(&b2)
            .is_none()
    );
    let s = d.status().unwrap().config.unwrap();
    assert_eq!((s.writes.refused, s.writes.failed), (3, 1), "{s:?}");
}

/// A tmpfs mounted for the test (removed when dropped, also on failure).
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn new(bytes: usize) -> Self {
        let dir = std::env::temp_dir().join(format!("lbt-tmpfs-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let out = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={bytes}"), "tmpfs"])
            .arg(&dir)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        Self(dir)
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(&self.0).status();
        let _ = std::fs::remove_dir(&self.0);
    }
}

/// A backend this host has no route to is the request's fault: 400 with the reason, and
/// nothing changes (it answered 500, found by the fuzzer below).
#[test]
fn a_backend_without_a_route_is_refused_and_changes_nothing() {
    let (_sb, d) = start();
    let before = std::fs::read(&d.config).unwrap();
    let version = running(&d).version;
    // 198.18.0.0/15 (benchmarking) is routed nowhere in the test's namespaces.
    let path = format!("/v1/services/web/backends/198.18.0.1:{PORT}");
    let (status, body) = api(&d, "PUT", &path, &[], Some(b"{}"));
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("no route to backend 198.18.0.1"), "{body}");
    assert_eq!(std::fs::read(&d.config).unwrap(), before);
    assert_eq!(running(&d).version, version);
}

#[test]
fn a_full_disk_fails_the_change_and_keeps_the_file() {
    require_root();
    let sb = Sandbox::build(Arms::Two, 3, PORT).unwrap();
    let disk = Tmpfs::new(64 << 10);
    let path = disk.0.join("lb.toml");
    std::fs::write(&path, config(&sb)).unwrap();
    let d = Daemon::start_at(&sb.lb, &path).unwrap();
    // Filled up: not a byte left for the new file.
    let filler = disk.0.join("filler");
    let mut f = std::fs::File::create(&filler).unwrap();
    let chunk = vec![0u8; 4096];
    while std::io::Write::write_all(&mut f, &chunk).is_ok() {}
    let _ = std::io::Write::write_all(&mut f, &[0]);
    drop(f);
    let b2 = format!("{}:{PORT}", sb.backends[2].addr);
    let before = std::fs::read(&path).unwrap();
    let (status, body) = api(
        &d,
        "PUT",
        &format!("/v1/services/web/backends/{b2}"),
        &[],
        Some(b"{}"),
    );
    assert_eq!(status, 500, "{body}");
    assert!(body.contains("No space left on device"), "{body}");
    assert_eq!(std::fs::read(&path).unwrap(), before);
    assert!(
        d.status()
            .unwrap()
            .service("web")
            .unwrap()
            .backend(&b2)
            .is_none()
    );
    // Room again: the same change goes through.
    std::fs::remove_file(&filler).unwrap();
    let (status, body) = api(
        &d,
        "PUT",
        &format!("/v1/services/web/backends/{b2}"),
        &[],
        Some(b"{}"),
    );
    assert_eq!(status, 200, "{body}");
    let mut d = d;
    d.stop(libc::SIGTERM);
}

/// Bodies for the fuzz: random JSON, and valid ones with one thing changed.
fn fuzz_body(rng: &mut Rng, backends: &[String]) -> Vec<u8> {
    let valid = [
        format!("{{\"weight\": {}}}", rng.below(1200)),
        format!(
            "{{\"vip\": \"10.100.0.{}:{}\", \"backends\": [{{\"address\": \"{}\"}}], \"check\": {{\"kind\": \"none\"}}}}",
            rng.below(300),
            rng.below(70000),
            backends[rng.below(backends.len())]
        ),
        "{\"backends\": []}".to_owned(),
        "{\"vip\": null}".to_owned(),
        "{\"check\": {\"kind\": \"http\", \"timeout\": \"90s\"}}".to_owned(),
        "{\"protocol\": \"sctp\", \"vip\": \"10.100.0.1:80\", \"backends\": [{\"address\": \"10.0.2.10:8080\"}]}".to_owned(),
        "[1, 2, 3]".to_owned(),
        "{\"weight\": 1e400}".to_owned(),
        "{\"address\": \"1.2.3.4:5\"}".to_owned(),
    ];
    let mut body = valid[rng.below(valid.len())].clone().into_bytes();
    match rng.below(4) {
        0 => {}
        1 => {
            // One byte changed.
            let at = rng.below(body.len());
            body[at] = rng.below(256) as u8;
        }
        2 => body.truncate(rng.below(body.len())),
        _ => {
            // Random bytes.
            body = (0..rng.below(64)).map(|_| rng.below(256) as u8).collect();
        }
    }
    body
}

#[test]
fn fuzzed_bodies_never_panic_nor_half_apply() {
    let (sb, d) = start();
    let (mut rng, _) = Rng::from_env("config API fuzz");
    let backends: Vec<String> = sb
        .backends
        .iter()
        .map(|b| format!("{}:{PORT}", b.addr))
        .collect();
    let mut applied = 0;
    let n = 1200;
    for i in 0..n {
        let before = std::fs::read(&d.config).unwrap();
        let version = running(&d).version;
        let body = fuzz_body(&mut rng, &backends);
        let (method, path) = match rng.below(6) {
            0 => (
                "PUT",
                format!("/v1/services/web/backends/{}", backends[rng.below(3)]),
            ),
            1 => ("PUT", "/v1/services/web".to_owned()),
            2 => ("PUT", format!("/v1/services/s{}", rng.below(3))),
            3 => ("POST", "/v1/config/changes".to_owned()),
            4 => ("DELETE", format!("/v1/services/s{}", rng.below(3))),
            _ => {
                // Path segments from the body's bytes, encoded as a client would.
                let segment = percent_encoding::percent_encode(
                    &body[..body.len().min(12)],
                    percent_encoding::NON_ALPHANUMERIC,
                );
                ("PUT", format!("/v1/services/web/backends/{segment}"))
            }
        };
        let (status, reply) = api(&d, method, &path, &[], Some(&body));
        let after = std::fs::read(&d.config).unwrap();
        let now = running(&d);
        match status {
            200 => {
                let r: ChangeReply = serde_json::from_str(&reply).unwrap();
                assert_eq!(now.version, r.version, "request {i}");
                assert_eq!(lb::source::Version::of(&after).0, r.version, "request {i}");
                applied += usize::from(r.applied);
            }
            400 | 404 | 412 => {
                assert_eq!(
                    after, before,
                    "request {i}: {method} {path} {body:?} -> {status}"
                );
                assert_eq!(now.version, version, "request {i}");
            }
            other => panic!("request {i}: {method} {path} {body:?} -> {other}: {reply}"),
        }
        // Whatever it was, the running services are the file's.
        let file = lb::config::parse(std::str::from_utf8(&after).unwrap()).unwrap();
        let (code, status) = api(&d, "GET", "/v1/healthcheck", &[], None);
        assert_eq!(code, 200, "request {i}: {status}");
        let status: lb::model::Status = serde_json::from_str(&status).unwrap();
        let names: Vec<&str> = status.services.iter().map(|s| s.name.as_str()).collect();
        let want: Vec<&str> = file.services.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, want, "request {i}");
    }
    eprintln!("{n} fuzzed requests, {applied} applied");
    assert!(
        applied > 0,
        "no fuzzed change was valid: the fuzz tests only refusals"
    );
    assert!(!d.log_text().contains("panicked"), "{}", d.log_text());
}
