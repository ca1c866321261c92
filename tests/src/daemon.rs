//! `lb run` inside a namespace, with its config and log in a temporary directory, stopped (and
//! the directory removed) when dropped.

use std::{
    path::PathBuf,
    process::Stdio,
    sync::atomic::{AtomicU32, Ordering},
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};
use lb::api::StatsReply;

use crate::{
    lb_bin,
    netns::{Netns, Process},
};

/// A directory removed on drop.
pub struct TempDir(pub PathBuf);

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
    pub process: Process,
    pub config: PathBuf,
    pub log: PathBuf,
    _dir: TempDir,
}

impl Daemon {
    /// Writes `config` and starts `lb run` on it in `ns`; returns once its API answers.
    pub fn start(ns: &Netns, config: &str) -> anyhow::Result<Self> {
        let dir = TempDir::new()?;
        let config_path = dir.0.join("lb.toml");
        std::fs::write(&config_path, config)?;
        let log = dir.0.join("lb.log");
        let process = ns.spawn(
            ns.command(lb_bin())
                .args(["run", "--config"])
                .arg(&config_path)
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(&log)?),
        )?;
        let mut daemon = Self {
            ns: ns.clone(),
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
    pub fn stats(&self) -> anyhow::Result<StatsReply> {
        let out = self
            .ns
            .command(lb_bin())
            .args(["stats", "--json"])
            .stdin(Stdio::null())
            .output()?;
        if !out.status.success() {
            bail!("lb stats: {}", String::from_utf8_lossy(&out.stderr));
        }
        Ok(serde_json::from_slice(&out.stdout)?)
    }

    /// `signal` (SIGTERM, SIGINT), wait; the exit code (None if it had to be killed).
    pub fn stop(&mut self, signal: libc::c_int) -> Option<i32> {
        self.process.stop_with(signal, Duration::from_secs(10))
    }
}
