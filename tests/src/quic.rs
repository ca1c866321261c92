//! Real QUIC for the QUIC-aware balancing tests: aioquic's server and client (`tests/quic/*.py`),
//! run by the Python of the venv `cargo xtask setup` makes (`.tools/venv`, aioquic pinned). The
//! server embeds its server ID in every connection ID it issues (the QUIC-LB draft's plaintext
//! layout, [`CidLayout`]); the client downloads from it (through lb) on one stream and can move
//! to another source port or address on the way ([`Migration`]), reporting what it did as one
//! JSON line ([`Transfer`]).

use std::{
    io::{BufRead as _, BufReader},
    net::{IpAddr, SocketAddr},
    path::{Path, PathBuf},
    sync::mpsc,
    thread::JoinHandle,
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};

use crate::{
    daemon::TempDir,
    netns::{Netns, Process},
};

/// Length of the connection IDs the server issues (its `--cid-length` default).
pub const CID_LENGTH: usize = 8;

/// How long a server may take to print "ready" (Python's start, aioquic's import and a key
/// pair on a busy 2-CPU machine).
const READY_WITHIN: Duration = Duration::from_secs(30);

/// How much longer than its own `--timeout` a client may run before it is killed (its start,
/// its JSON line).
const CLIENT_GRACE: Duration = Duration::from_secs(20);

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the tests crate is in the workspace")
}

/// The Python of `.tools/venv` (with aioquic), which `cargo xtask setup` makes.
pub fn python() -> anyhow::Result<PathBuf> {
    let python = repo().join(".tools/venv/bin/python");
    if !python.exists() {
        bail!(
            "{} is missing: run `cargo xtask setup` (it makes the venv with aioquic the QUIC \
             tests run)",
            python.display()
        );
    }
    Ok(python)
}

fn script(name: &str) -> PathBuf {
    repo().join("tests/quic").join(name)
}

/// Where the server ID goes in a connection ID (QUIC-LB plaintext): byte 0 holds the config ID
/// in its 3 high bits, bytes `[cid_offset, cid_offset + server_id_bytes)` the server ID
/// big-endian; the rest is random. The IDs are [`CID_LENGTH`] bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CidLayout {
    pub server_id_bytes: u8,
    pub cid_offset: u8,
    pub config_id: u8,
}

impl CidLayout {
    /// A connection ID of this layout naming `server_id` (which must fit), the bytes around it
    /// a fixed filler: what a server of this layout issues, for packets built by hand.
    pub fn cid(&self, server_id: u64) -> [u8; CID_LENGTH] {
        let mut cid = [
            (self.config_id << 5) | 0x0b,
            0x11,
            0x22,
            0x33,
            0x44,
            0x55,
            0x66,
            0x77,
        ];
        let (start, n) = (
            usize::from(self.cid_offset),
            usize::from(self.server_id_bytes),
        );
        cid[start..start + n].copy_from_slice(&server_id.to_be_bytes()[8 - n..]);
        cid
    }

    /// The server ID in `cid`; None if `cid` is too short to hold it.
    pub fn server_id(&self, cid: &[u8]) -> Option<u64> {
        let start = usize::from(self.cid_offset);
        let bytes = cid.get(start..start + usize::from(self.server_id_bytes))?;
        Some(bytes.iter().fold(0u64, |id, b| (id << 8) | u64::from(*b)))
    }

    /// The config ID in `cid` (the first byte's 3 high bits); None for an empty one.
    pub fn config_id_of(cid: &[u8]) -> Option<u8> {
        cid.first().map(|b| b >> 5)
    }

    /// Whether `cid` is one a server of this layout with `server_id` issued: the length, the
    /// config ID and the server ID; the error says what differs.
    pub fn check(&self, cid: &[u8], server_id: u64) -> anyhow::Result<()> {
        let hex = hex(cid);
        if cid.len() != CID_LENGTH {
            bail!("CID {hex} is {} bytes, not {CID_LENGTH}", cid.len());
        }
        if Self::config_id_of(cid) != Some(self.config_id) {
            bail!(
                "CID {hex} has config ID {:?}, not {}",
                Self::config_id_of(cid),
                self.config_id
            );
        }
        if self.server_id(cid) != Some(server_id) {
            bail!(
                "CID {hex} holds server ID {:?}, not {server_id}",
                self.server_id(cid)
            );
        }
        Ok(())
    }
}

/// A QUIC short-header packet's UDP payload to `dcid`: its first byte, the connection ID, a
/// packet number and 25 protected bytes (as long as a QUIC packet at least is).
pub fn short_header(dcid: [u8; CID_LENGTH]) -> Vec<u8> {
    let mut p = vec![0x43];
    p.extend_from_slice(&dcid);
    p.resize(1 + CID_LENGTH + 26, 0xa5);
    p
}

/// A QUIC Initial's UDP payload (a long header; its connection IDs are the client's choice).
pub fn initial() -> Vec<u8> {
    let mut p = vec![0xc3, 0, 0, 0, 1, 8];
    p.extend_from_slice(&[0xd1; 8]);
    p.push(8);
    p.extend_from_slice(&[0x5c; 8]);
    p.resize(p.len() + 40, 0);
    p
}

/// Lowercase hex, as the client reports CIDs.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> anyhow::Result<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        bail!("odd-length hex {text:?}");
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).with_context(|| format!("hex {text:?}")))
        .collect()
}

/// `tests/quic/quic_server.py` in a namespace: answers `GET <n>` on each stream with its name and
/// n bytes of a pattern, issuing connection IDs of its layout. Stopped (SIGTERM, then SIGKILL)
/// and reaped when dropped.
pub struct QuicServer {
    pub listen: SocketAddr,
    pub name: String,
    pub server_id: u64,
    process: Option<Process>,
    stdout: Option<JoinHandle<()>>,
    dir: TempDir,
}

impl QuicServer {
    /// Starts the server on `listen` in `ns` and returns once it listens.
    pub fn start(
        ns: &Netns,
        listen: SocketAddr,
        name: &str,
        server_id: u64,
        layout: CidLayout,
    ) -> anyhow::Result<Self> {
        let python = python()?;
        let dir = TempDir::new()?;
        let log = dir.0.join("server.log");
        let (ready_rx, stdout_w) = std::io::pipe().context("pipe")?;
        let process = {
            // The command holds the pipe's writing end: dropped with it once the child has its
            // copy, so that the reader sees the end when the server ends.
            let mut cmd = ns.command(&python);
            cmd.arg(script("quic_server.py"))
                .arg("--listen")
                .arg(listen.to_string())
                .args(["--name", name])
                .arg("--server-id")
                .arg(server_id.to_string())
                .arg("--server-id-bytes")
                .arg(layout.server_id_bytes.to_string())
                .arg("--cid-offset")
                .arg(layout.cid_offset.to_string())
                .arg("--config-id")
                .arg(layout.config_id.to_string())
                .arg("--cid-length")
                .arg(CID_LENGTH.to_string())
                .stdout(stdout_w)
                .stderr(std::fs::File::create(&log)?);
            ns.spawn(&mut cmd)?
        };
        let (tx, rx) = mpsc::channel();
        let stdout = std::thread::spawn(move || {
            // The first line is the signal; the rest (nothing, normally) is drained until EOF.
            for line in BufReader::new(ready_rx).lines() {
                let Ok(line) = line else { break };
                let _ = tx.send(line); // nobody listens after the first
            }
        });
        let mut server = Self {
            listen,
            name: name.to_owned(),
            server_id,
            process: Some(process),
            stdout: Some(stdout),
            dir,
        };
        match rx.recv_timeout(READY_WITHIN) {
            Ok(line) if line.trim() == "ready" => Ok(server),
            Ok(line) => bail!(
                "QUIC server {name} on {listen} printed {line:?} instead of \"ready\":\n{}",
                server.log()
            ),
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                let code = server.stop();
                bail!(
                    "QUIC server {name} on {listen} ended before it was ready (exit {code:?}):\n{}",
                    server.log()
                )
            }
            Err(mpsc::RecvTimeoutError::Timeout) => bail!(
                "QUIC server {name} on {listen} not ready in {READY_WITHIN:?}:\n{}",
                server.log()
            ),
        }
    }

    /// What the server wrote to stderr so far: the network path changes (migrations) it saw,
    /// one per line, e.g. `NAME: [odcid] Network path ('10.201.0.3', 40000) promoted`, and
    /// `Peer switching to CID ...`; errors.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.0.join("server.log")).unwrap_or_default()
    }

    /// Whether it still runs.
    pub fn running(&mut self) -> bool {
        self.process.as_mut().is_some_and(Process::running)
    }

    /// Stops it (SIGTERM, SIGKILL after 5 s) and reaps it; its exit code (0 after SIGTERM),
    /// None if it had to be killed or was stopped before.
    pub fn stop(&mut self) -> Option<i32> {
        let code = self
            .process
            .take()
            .and_then(|mut p| p.terminate(Duration::from_secs(5)));
        if let Some(t) = self.stdout.take() {
            let _ = t.join(); // ends at EOF, which the server's end brings
        }
        code
    }
}

impl Drop for QuicServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// How a download moves on the way (the client's options). Fractions are of the payload bytes
/// received when the move happens, 0.0..=1.0.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Migration {
    /// A new UDP socket on the same local address (a new source port; a NAT rebinding).
    pub rebind_port_at: Option<f64>,
    /// A new UDP socket on this other local address.
    pub new_address: Option<(IpAddr, f64)>,
    /// At each move, also switch to another connection ID the server issued.
    pub change_cid: bool,
    /// How long without progress ends the transfer (None: the client's default, 5 s at most).
    pub stall: Option<Duration>,
}

impl Migration {
    /// No move.
    pub fn none() -> Self {
        Self::default()
    }

    pub fn rebind_port(at: f64) -> Self {
        Self {
            rebind_port_at: Some(at),
            ..Self::default()
        }
    }

    pub fn new_address(address: IpAddr, at: f64) -> Self {
        Self {
            new_address: Some((address, at)),
            ..Self::default()
        }
    }

    /// The same, changing the connection ID at each move too.
    pub fn with_change_cid(self) -> Self {
        Self {
            change_cid: true,
            ..self
        }
    }
}

/// What the client reported.
#[derive(Clone, Debug)]
pub struct Transfer {
    /// Exactly the bytes asked for, the pattern verified, the stream ended.
    pub completed: bool,
    /// Payload bytes received (and verified).
    pub bytes: u64,
    /// The first line of the answer: the server's name.
    pub server: Option<String>,
    /// Moves done.
    pub migrations: u32,
    pub error: Option<String>,
    pub elapsed: Duration,
    /// The destination CIDs of the packets the client sent, in the order first used (its own
    /// initial random one left out): the CIDs the server issued that it used.
    pub dcids: Vec<Vec<u8>>,
    /// Every CID the server issued to the client (the first and the NEW_CONNECTION_ID ones).
    pub issued_cids: Vec<Vec<u8>>,
    /// The local addresses the client sent from, in order.
    pub paths: Vec<SocketAddr>,
    /// The client's exit code (0 exactly when `completed`).
    pub exit_code: Option<i32>,
    /// The client's stderr (its moves, errors).
    pub log: String,
}

impl Transfer {
    fn parse(line: &str) -> anyhow::Result<Self> {
        let v: serde_json::Value = serde_json::from_str(line).context("the client's JSON line")?;
        let cids = |key: &str| -> anyhow::Result<Vec<Vec<u8>>> {
            v[key]
                .as_array()
                .with_context(|| format!("no {key}"))?
                .iter()
                .map(|c| unhex(c.as_str().context("a CID that is not a string")?))
                .collect()
        };
        Ok(Self {
            completed: v["completed"].as_bool().context("no completed")?,
            bytes: v["bytes"].as_u64().context("no bytes")?,
            server: v["server"].as_str().map(str::to_owned),
            migrations: v["migrations"]
                .as_u64()
                .context("no migrations")?
                .try_into()?,
            error: v["error"].as_str().map(str::to_owned),
            elapsed: Duration::from_millis(v["elapsed_ms"].as_u64().context("no elapsed_ms")?),
            dcids: cids("dcids")?,
            issued_cids: cids("issued_cids")?,
            paths: v["paths"]
                .as_array()
                .context("no paths")?
                .iter()
                .map(|p| {
                    p.as_str()
                        .context("a path that is not a string")?
                        .parse()
                        .context("a path")
                })
                .collect::<anyhow::Result<_>>()?,
            exit_code: None,
            log: String::new(),
        })
    }
}

/// Downloads `bytes` from the QUIC server at `target` with `tests/quic/quic_client.py` in `ns`
/// (from `bind` if given), moving as `plan` says. The client ends by itself within `timeout`
/// (earlier when the transfer stalls for a few seconds); a transfer that did not complete is
/// still `Ok` (see [`Transfer::completed`] and [`Transfer::error`]); an error means the client
/// could not run or report.
pub fn download(
    ns: &Netns,
    target: SocketAddr,
    bytes: u64,
    bind: Option<IpAddr>,
    plan: &Migration,
    timeout: Duration,
) -> anyhow::Result<Transfer> {
    let python = python()?;
    let dir = TempDir::new()?;
    let (out, err) = (dir.0.join("client.json"), dir.0.join("client.log"));
    let mut cmd = ns.command(&python);
    cmd.arg(script("quic_client.py"))
        .arg("--connect")
        .arg(target.to_string())
        .arg("--bytes")
        .arg(bytes.to_string())
        .arg("--timeout")
        .arg(timeout.as_secs_f64().to_string());
    if let Some(bind) = bind {
        cmd.arg("--bind").arg(bind.to_string());
    }
    if let Some(at) = plan.rebind_port_at {
        cmd.arg("--rebind-port-at").arg(at.to_string());
    }
    if let Some((address, at)) = plan.new_address {
        cmd.arg("--new-address").arg(address.to_string());
        cmd.arg("--new-address-at").arg(at.to_string());
    }
    if plan.change_cid {
        cmd.arg("--change-cid");
    }
    if let Some(stall) = plan.stall {
        cmd.arg("--stall").arg(stall.as_secs_f64().to_string());
    }
    cmd.stdout(std::fs::File::create(&out)?)
        .stderr(std::fs::File::create(&err)?);
    let mut process = ns.spawn(&mut cmd)?;
    let limit = timeout + CLIENT_GRACE;
    let deadline = Instant::now() + limit;
    while process.running() {
        if Instant::now() >= deadline {
            process.terminate(Duration::from_secs(2));
            bail!(
                "the QUIC client to {target} ran past {limit:?}:\n{}",
                std::fs::read_to_string(&err).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(10)); // polls its end, as Process does
    }
    let exit_code = process.terminate(Duration::ZERO); // ended: its code, at once
    let log = std::fs::read_to_string(&err).unwrap_or_default();
    let stdout = std::fs::read_to_string(&out).unwrap_or_default();
    let line = stdout.lines().last().unwrap_or_default();
    let mut transfer = Transfer::parse(line).with_context(|| {
        format!("QUIC client to {target} (exit {exit_code:?}) printed {stdout:?}:\n{log}")
    })?;
    transfer.exit_code = exit_code;
    transfer.log = log;
    Ok(transfer)
}
