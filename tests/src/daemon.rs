//! `lb run` inside a namespace, with its config and log in a temporary directory, stopped (and
//! the directory removed) when dropped.

use std::{
    path::{Path, PathBuf},
    process::Stdio,
    sync::atomic::{AtomicU32, Ordering},
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};
use lb::model::Status;

use crate::{
    lb_bin,
    netns::{Netns, Process},
};

/// A directory removed on drop.
pub struct TempDir(pub PathBuf);

/// Removes a test's pin directory (and detaches its links) even when the test fails.
pub struct PinGuard(pub String);

impl PinGuard {
    /// A pin directory of its own for this test: `/sys/fs/bpf/lb-test-PID-N`.
    pub fn unique() -> Self {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        Self(format!(
            "/sys/fs/bpf/lb-test-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ))
    }
}

impl Drop for PinGuard {
    fn drop(&mut self) {
        let pin = Path::new(&self.0);
        let _ = lb::dataplane::remove_pinned(pin);
        let _ = std::fs::remove_file(lb::daemon::ids_file(pin));
        let _ = std::fs::remove_file(lb::daemon::ids_file(pin).with_extension("lock"));
        let _ = std::fs::remove_file(lb::daemon::host_file(pin));
    }
}

/// How [`Daemon::start_with`] runs lb.
#[derive(Default)]
pub struct Launch<'a> {
    /// A command that execs the rest (`prlimit ...`, `setpriv ...`): lb keeps its pid.
    pub wrapper: &'a [&'a str],
    /// Pin the datapath (the config names its `pin_path`).
    pub pinned: bool,
    /// Extra environment (e.g. `NOTIFY_SOCKET`).
    pub env: &'a [(&'a str, &'a str)],
    /// Another lb binary than [`lb_bin`] (e.g. the packaged one).
    pub binary: Option<&'a Path>,
    /// Extra arguments of `lb run` (e.g. `--config-source ...`).
    pub args: &'a [&'a str],
}

impl TempDir {
    pub fn new() -> anyhow::Result<Self> {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let p = std::env::temp_dir().join(format!("lbt-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&p).with_context(|| format!("creating {}", p.display()))?;
        Ok(Self(p))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0); // best effort: a temporary directory
    }
}

pub struct Daemon {
    pub ns: Netns,
    /// Its control API address (from the config).
    pub api: String,
    pub process: Process,
    pub config: PathBuf,
    pub log: PathBuf,
    _dir: TempDir,
}

impl Daemon {
    /// Writes `config` and starts `lb run --no-pin` on it in `ns`; returns once its API answers.
    pub fn start(ns: &Netns, config: &str) -> anyhow::Result<Self> {
        Self::start_under(ns, config, &[])
    }

    /// As [`Daemon::start`], with lb run by `wrapper` (a command that execs the rest, e.g.
    /// `["prlimit", "--nofile=1024:1024"]`: lb keeps its pid).
    pub fn start_under(ns: &Netns, config: &str, wrapper: &[&str]) -> anyhow::Result<Self> {
        Self::start_with(
            ns,
            config,
            &Launch {
                wrapper,
                ..Launch::default()
            },
        )
    }

    /// Starts `lb run` with pinning on `config` (which names its `pin_path`).
    pub fn start_pinned(ns: &Netns, config: &str) -> anyhow::Result<Self> {
        Self::start_with(
            ns,
            config,
            &Launch {
                pinned: true,
                ..Launch::default()
            },
        )
    }

    /// Starts `lb run --no-pin` in `ns` on the config file at `path` as it is (not copied:
    /// the daemon writes its changes there).
    pub fn start_at(ns: &Netns, path: &Path) -> anyhow::Result<Self> {
        let dir = TempDir::new()?;
        let mut cmd = std::process::Command::new("nsenter");
        cmd.arg(format!("--net=/run/netns/{}", ns.name()))
            .arg(lb_bin())
            .args(["run", "--no-pin", "--config"])
            .arg(path);
        Self::launch(ns, cmd, dir, path.to_owned())
    }

    /// Writes `config` and starts lb on it in `ns` as `how` says; returns once its API answers.
    /// Runs under `nsenter --net` rather than `ip netns exec`, whose private mount namespace
    /// would hide the host's bpffs (MACHINE.md).
    pub fn start_with(ns: &Netns, config: &str, how: &Launch<'_>) -> anyhow::Result<Self> {
        let dir = TempDir::new()?;
        let config_path = dir.0.join("lb.toml");
        std::fs::write(&config_path, config)?;
        Self::start_with_path(ns, dir, config_path, how)
    }

    /// [`Daemon::start_with`] on the config file at `path` as it is (and what lies beside it:
    /// a backup, etcd's cache), the log in `dir`.
    pub fn start_with_path(
        ns: &Netns,
        dir: TempDir,
        config_path: PathBuf,
        how: &Launch<'_>,
    ) -> anyhow::Result<Self> {
        let mut cmd = std::process::Command::new("nsenter");
        cmd.arg(format!("--net=/run/netns/{}", ns.name()))
            .args(how.wrapper)
            .arg(how.binary.map_or_else(lb_bin, Path::to_path_buf))
            .arg("run");
        if !how.pinned {
            cmd.arg("--no-pin");
        }
        cmd.arg("--config").arg(&config_path).args(how.args);
        cmd.envs(how.env.iter().copied());
        Self::launch(ns, cmd, dir, config_path)
    }

    fn launch(
        ns: &Netns,
        mut cmd: std::process::Command,
        dir: TempDir,
        config_path: PathBuf,
    ) -> anyhow::Result<Self> {
        let log = dir.0.join("lb.log");
        let process = ns.spawn(
            cmd.stdout(Stdio::null())
                .stderr(std::fs::File::create(&log)?),
        )?;
        let api = std::fs::read_to_string(&config_path)
            .ok()
            .and_then(|text| lb::config::parse(&text).ok())
            .map_or_else(
                || lb::config::DEFAULT_API.to_owned(),
                |c| c.lb.api.to_string(),
            );
        let mut daemon = Self {
            ns: ns.clone(),
            api,
            process,
            config: config_path,
            log,
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(15);
        while daemon.stats().is_err() {
            if !daemon.process.running() {
                bail!("lb exited early:\n{}", daemon.log_text());
            }
            if Instant::now() > deadline {
                bail!("lb's API did not come up in 15 s:\n{}", daemon.log_text());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(daemon)
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// `lb stats --json`, run in the daemon's namespace (its API listens on that loopback).
    pub fn stats(&self) -> anyhow::Result<Status> {
        let out = self.lb(&["stats", "--json"]);
        if !out.status.success() {
            bail!("lb stats: {}", String::from_utf8_lossy(&out.stderr));
        }
        Ok(serde_json::from_slice(&out.stdout)?)
    }

    /// Runs `lb ARGS` (a client command) in the daemon's namespace, with `--api` set to the
    /// daemon's unless ARGS name one.
    pub fn lb(&self, args: &[&str]) -> std::process::Output {
        let mut cmd = self.ns.command(lb_bin());
        cmd.args(args);
        if !args.contains(&"--api") {
            cmd.args(["--api", &self.api]);
        }
        cmd.stdin(Stdio::null()).output().expect("running lb")
    }

    /// `lb status --json`.
    pub fn status(&self) -> anyhow::Result<lb::model::Status> {
        let out = self.lb(&["status", "--json"]);
        if !out.status.success() {
            bail!("lb status: {}", String::from_utf8_lossy(&out.stderr));
        }
        Ok(serde_json::from_slice(&out.stdout)?)
    }

    /// A request to the API with curl in the daemon's namespace: (status, body).
    pub fn http(&self, method: &str, url: &str, headers: &[&str]) -> (u16, String) {
        http(&self.ns, method, url, headers)
    }

    /// Waits until `backend` (IP:PORT) of `service` shows `state`; how long that took.
    pub fn wait_state(
        &self,
        service: &str,
        backend: &str,
        state: &str,
        limit: Duration,
    ) -> Duration {
        let start = Instant::now();
        loop {
            let now = self
                .status()
                .ok()
                .and_then(|s| Some(s.service(service)?.backend(backend)?.state));
            if now.is_some_and(|now| now == state) {
                return start.elapsed();
            }
            assert!(
                start.elapsed() < limit,
                "{service} {backend}: still {now:?} after {limit:?}, want {state}\n{}",
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The daemon's event log (`lb events --json`).
    pub fn events(&self) -> anyhow::Result<lb::model::Events> {
        let out = self.lb(&["events", "--json"]);
        if !out.status.success() {
            bail!("lb events: {}", String::from_utf8_lossy(&out.stderr));
        }
        Ok(serde_json::from_slice(&out.stdout)?)
    }

    /// When `backend` of `service` last moved to `state`, by the daemon's own clock (Unix
    /// seconds, stamped as the verdict was written): detection times measured from the event,
    /// not from when a test's poll happened to see it.
    pub fn moved_at(&self, service: &str, backend: &str, state: &str) -> Option<f64> {
        let events = self.events().ok()?;
        events
            .events
            .iter()
            .rev()
            .find(|e| e.service == service && e.backend == backend && e.to == state)
            .map(|e| e.time)
    }

    /// [`Daemon::moved_at`], waited for up to `limit`: the status shows a new state as soon as
    /// the window decides, and the event follows once the verdict is written to the maps (the
    /// flags, then the rings), which a loaded machine or a debug build can stretch.
    pub fn wait_moved_at(&self, service: &str, backend: &str, state: &str, limit: Duration) -> f64 {
        let start = Instant::now();
        loop {
            if let Some(at) = self.moved_at(service, backend, state) {
                return at;
            }
            assert!(
                start.elapsed() < limit,
                "no event of {service} {backend} -> {state} after {limit:?}\n{}",
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Checks `holds` on the status for all of `period` (a state that must not change: each
    /// poll is checked, so a violation fails at once, with what was seen).
    pub fn holds_for(
        &self,
        period: Duration,
        what: &str,
        holds: impl Fn(&lb::model::Status) -> bool,
    ) {
        let end = Instant::now() + period;
        loop {
            let status = self.status().expect("status");
            assert!(holds(&status), "{what}: {status:#?}\n{}", self.log_text());
            if Instant::now() >= end {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// `signal` (SIGTERM, SIGINT), wait; the exit code (None if it had to be killed).
    pub fn stop(&mut self, signal: libc::c_int) -> Option<i32> {
        self.process.stop_with(signal, Duration::from_secs(10))
    }
}

/// A request with curl from inside `ns`: (status, body).
pub fn http(ns: &Netns, method: &str, url: &str, headers: &[&str]) -> (u16, String) {
    let mut cmd = ns.command("curl");
    cmd.args(["-s", "-m", "10", "-X", method, "-w", "\n%{http_code}"]);
    for h in headers {
        cmd.args(["-H", h]);
    }
    let out = cmd.arg(url).stdin(Stdio::null()).output().expect("curl");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", &text));
    (code.trim().parse().unwrap_or(0), body.to_owned())
}
