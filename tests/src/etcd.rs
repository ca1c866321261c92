//! etcd for the several-hosts tests: Debian's etcd-server, a one-member cluster in a namespace
//! with its data in a temporary directory, stopped (and resumed, to test a store that goes
//! away) by the test; and a client of it to write revisions directly.

use std::{
    net::SocketAddr,
    process::Stdio,
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};

use crate::{
    daemon::TempDir,
    netns::{Netns, Process},
};

pub struct Etcd {
    ns: Netns,
    pub client_addr: SocketAddr,
    process: Option<Process>,
    dir: TempDir,
}

impl Etcd {
    /// Starts etcd in `ns`, serving clients on `client_addr` (peers on the next port); returns
    /// once it answers.
    pub fn start(ns: &Netns, client_addr: SocketAddr) -> anyhow::Result<Self> {
        let mut e = Self {
            ns: ns.clone(),
            client_addr,
            process: None,
            dir: TempDir::new()?,
        };
        e.spawn()?;
        Ok(e)
    }

    fn spawn(&mut self) -> anyhow::Result<()> {
        let client = format!("http://{}", self.client_addr);
        let peer = format!(
            "http://{}",
            SocketAddr::new(self.client_addr.ip(), self.client_addr.port() + 1)
        );
        let mut cmd = self.ns.command("etcd");
        cmd.args(["--name", "n1", "--data-dir"])
            .arg(self.dir.0.join("data"))
            .args([
                "--listen-client-urls",
                &client,
                "--advertise-client-urls",
                &client,
            ])
            .args([
                "--listen-peer-urls",
                &peer,
                "--initial-advertise-peer-urls",
                &peer,
            ])
            .args(["--initial-cluster", &format!("n1={peer}")])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(self.dir.0.join("etcd.log"))?);
        self.process = Some(self.ns.spawn(&mut cmd)?);
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if self.healthy() {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "etcd did not answer on {} in 20 s:\n{}",
                    self.client_addr,
                    std::fs::read_to_string(self.dir.0.join("etcd.log")).unwrap_or_default()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn healthy(&self) -> bool {
        let url = format!("http://{}/health", self.client_addr);
        self.ns
            .command("curl")
            .args(["-sf", "-m", "1", &url])
            .stdin(Stdio::null())
            .output()
            .is_ok_and(|o| {
                o.status.success() && String::from_utf8_lossy(&o.stdout).contains("true")
            })
    }

    /// Stops it (its data stays: [`Etcd::restart`] brings the same cluster back).
    pub fn stop(&mut self) {
        if let Some(mut p) = self.process.take() {
            p.terminate(Duration::from_secs(10));
        }
    }

    pub fn restart(&mut self) -> anyhow::Result<()> {
        self.stop();
        self.spawn()
    }

    /// Puts `value` at `key` from the etcd's namespace; the revision.
    pub fn put(&self, key: &str, value: &str) -> anyhow::Result<i64> {
        let endpoint = format!("http://{}", self.client_addr);
        let (key, value) = (key.to_owned(), value.to_owned());
        self.ns.block_on(|| async move {
            let mut client = etcd_client::Client::connect([endpoint], None)
                .await
                .context("connecting to etcd")?;
            let answer = client.put(key, value, None).await.context("put")?;
            answer
                .header()
                .map(|h| h.revision())
                .context("an answer without a revision")
        })
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        self.stop();
    }
}
