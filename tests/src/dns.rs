//! A DNS server for discovery tests: Debian's dnsmasq in a namespace, authoritative for `test`
//! (NXDOMAIN for names it does not know), its A/AAAA records from a hosts file rewritten and
//! re-read on SIGHUP, its SRV records from its command line (restarted to change them). It can
//! be frozen (SIGSTOP: queries time out) and thawed. And [`ServFail`], a server answering every
//! query with SERVFAIL. Both stop when dropped.

use std::{
    net::{SocketAddr, UdpSocket},
    path::PathBuf,
    process::Stdio,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use anyhow::Context as _;

use crate::{
    daemon::TempDir,
    netns::{Netns, Process},
};

pub struct Dnsmasq {
    ns: Netns,
    listen: SocketAddr,
    hosts: PathBuf,
    srv: Vec<String>,
    process: Option<Process>,
    _dir: TempDir,
}

impl Dnsmasq {
    /// Starts dnsmasq in `ns` on `listen` (UDP and TCP) with `hosts` (lines "IP NAME") and
    /// `srv` (`--srv-host` values: "_svc._tcp.NAME,TARGET,PORT,PRIORITY,WEIGHT"); TTL 1 s.
    pub fn start(
        ns: &Netns,
        listen: SocketAddr,
        hosts: &str,
        srv: &[&str],
    ) -> anyhow::Result<Self> {
        let dir = TempDir::new()?;
        let hosts_path = dir.0.join("hosts");
        std::fs::write(&hosts_path, hosts)?;
        let mut d = Self {
            ns: ns.clone(),
            listen,
            hosts: hosts_path,
            srv: srv.iter().map(|s| (*s).to_owned()).collect(),
            process: None,
            _dir: dir,
        };
        d.spawn()?;
        Ok(d)
    }

    fn spawn(&mut self) -> anyhow::Result<()> {
        let mut cmd = self.ns.command("dnsmasq");
        cmd.args([
            "--keep-in-foreground",
            "--conf-file=/dev/null",
            "--no-resolv",
            "--no-hosts",
            "--user=root",
            "--bind-interfaces",
            "--pid-file=",
            "--local=/test/",
            "--local-ttl=1",
        ])
        .arg(format!("--addn-hosts={}", self.hosts.display()))
        .arg(format!("--listen-address={}", self.listen.ip()))
        .arg(format!("--port={}", self.listen.port()));
        for srv in &self.srv {
            cmd.arg(format!("--srv-host={srv}"));
        }
        cmd.stdout(Stdio::null()).stderr(Stdio::null());
        self.process = Some(self.ns.spawn(&mut cmd)?);
        self.wait_answering()
    }

    /// Waits until it answers (a query for its own zone's apex).
    fn wait_answering(&self) -> anyhow::Result<()> {
        let listen = self.listen;
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let answered = self.ns.enter(|| -> std::io::Result<bool> {
                let s = UdpSocket::bind("127.0.0.1:0")?;
                s.set_read_timeout(Some(Duration::from_millis(200)))?;
                s.send_to(&query(b"\x04test\x00"), listen)?;
                let mut buf = [0u8; 512];
                Ok(s.recv_from(&mut buf).is_ok())
            });
            if answered.unwrap_or(false) {
                return Ok(());
            }
            anyhow::ensure!(
                std::time::Instant::now() < deadline,
                "dnsmasq does not answer on {listen}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// New A/AAAA records: the hosts file rewritten, dnsmasq told to read it again.
    pub fn set_hosts(&self, hosts: &str) -> anyhow::Result<()> {
        std::fs::write(&self.hosts, hosts)?;
        self.signal(libc::SIGHUP);
        Ok(())
    }

    /// New SRV records: dnsmasq restarted with them.
    pub fn set_srv(&mut self, srv: &[&str]) -> anyhow::Result<()> {
        if let Some(mut p) = self.process.take() {
            p.terminate(Duration::from_secs(5));
        }
        self.srv = srv.iter().map(|s| (*s).to_owned()).collect();
        self.spawn()
    }

    /// SIGSTOP: it keeps its port and answers nothing (queries time out) until [`Dnsmasq::thaw`].
    pub fn freeze(&self) {
        self.signal(libc::SIGSTOP);
    }

    pub fn thaw(&self) {
        self.signal(libc::SIGCONT);
    }

    /// Stops it for good (its port then refuses).
    pub fn stop(&mut self) {
        if let Some(mut p) = self.process.take() {
            p.stop_with(libc::SIGCONT, Duration::from_millis(10));
            p.terminate(Duration::from_secs(5));
        }
    }

    fn signal(&self, signal: libc::c_int) {
        if let Some(p) = &self.process {
            p.signal(signal);
        }
    }
}

impl Drop for Dnsmasq {
    fn drop(&mut self) {
        self.thaw();
        self.stop();
    }
}

/// A DNS query (ID 0x1234, recursion desired) for the wire-format name `qname`, type A.
fn query(qname: &[u8]) -> Vec<u8> {
    let mut q = vec![0x12, 0x34, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0];
    q.extend_from_slice(qname);
    q.extend_from_slice(&[0, 1, 0, 1]);
    q
}

/// A server answering every query on `listen` (UDP) with SERVFAIL, until dropped.
pub struct ServFail {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl ServFail {
    pub fn start(ns: &Netns, listen: SocketAddr) -> anyhow::Result<Self> {
        let socket = ns
            .enter(|| UdpSocket::bind(listen))
            .with_context(|| format!("binding {listen}"))?;
        socket.set_read_timeout(Some(Duration::from_millis(100)))?;
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut buf = [0u8; 1500];
            while !s.load(Ordering::Relaxed) {
                let Ok((n, from)) = socket.recv_from(&mut buf) else {
                    continue;
                };
                if n < 12 {
                    continue;
                }
                // The query back as a response (QR), its opcode and RD kept, RCODE 2.
                let mut reply = buf[..n].to_vec();
                reply[2] = 0x80 | (buf[2] & 0x79);
                reply[3] = 0x80 | 2;
                let _ = socket.send_to(&reply, from);
            }
        });
        Ok(Self {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for ServFail {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
