//! Network namespaces, veth pairs and processes inside them, each removed when its guard drops,
//! also when a test panics. Names are unique per process (`lbt-<pid>-<n>-<role>`), and namespaces
//! left by a killed run (whose pid is gone) are swept on first use.

use std::{
    fs::File,
    os::fd::AsRawFd as _,
    path::Path,
    process::{Child, Command, Output, Stdio},
    sync::{
        Arc, Once,
        atomic::{AtomicU32, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};

static NEXT: AtomicU32 = AtomicU32::new(0);
static SWEEP: Once = Once::new();
const PREFIX: &str = "lbt-";

fn next_id() -> u32 {
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// Runs a command, failing with its output when it fails.
/// Field `field` of the `prefix` lines (names, then values) of /proc/net/snmp or netstat text.
pub fn stat_field(text: &str, prefix: &str, field: &str) -> Option<u64> {
    let mut lines = text.lines().filter(|l| l.starts_with(prefix));
    let (names, values) = (lines.next()?, lines.next()?);
    names
        .split_whitespace()
        .zip(values.split_whitespace())
        .find(|(n, _)| *n == field)
        .and_then(|(_, v)| v.parse().ok())
}

pub fn sh(cmd: &mut Command) -> anyhow::Result<String> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("cannot start {cmd:?}"))?;
    if !out.status.success() {
        bail!(
            "{cmd:?} failed ({}): {}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The entries of `dir` named `<prefix><pid>-...` whose process no longer exists: what a killed
/// test run left behind (name, path).
pub fn stale_entries(dir: &Path, prefix: &str) -> Vec<(String, std::path::PathBuf)> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let pid = name.strip_prefix(prefix)?.split('-').next()?.to_owned();
            (!Path::new("/proc").join(pid).exists()).then(|| (name, e.path()))
        })
        .collect()
}

/// Deletes `lbt-<pid>-*` namespaces whose process no longer exists.
fn sweep_stale() {
    for (name, _) in stale_entries(Path::new("/run/netns"), PREFIX) {
        eprintln!("removing stale test namespace {name}");
        let _ = sh(Command::new("ip").args(["netns", "del", &name])); // best effort
    }
}

struct Inner {
    name: String,
}

impl Drop for Inner {
    fn drop(&mut self) {
        // Deleting the namespace removes its interfaces and with them any attached XDP program.
        if let Err(e) = sh(Command::new("ip").args(["netns", "del", &self.name])) {
            eprintln!("warning: {e:#}");
        }
    }
}

/// A network namespace; deleted when the last clone drops.
#[derive(Clone)]
pub struct Netns(Arc<Inner>);

impl Netns {
    /// A new namespace with loopback up.
    pub fn new(role: &str) -> anyhow::Result<Self> {
        SWEEP.call_once(sweep_stale);
        let name = format!("{PREFIX}{}-{}-{role}", std::process::id(), next_id());
        sh(Command::new("ip").args(["netns", "add", &name]))?;
        let ns = Self(Arc::new(Inner { name }));
        ns.ip(&["link", "set", "lo", "up"])?;
        // No duplicate address detection: an IPv6 address (link-local ones too) would be
        // tentative, unusable, for a second or more after it is added; these links are private.
        for conf in ["all", "default"] {
            ns.sysctl(&format!("net/ipv6/conf/{conf}/accept_dad"), "0")?;
        }
        Ok(ns)
    }

    pub fn name(&self) -> &str {
        &self.0.name
    }

    /// `ip -n <ns> ARGS`.
    pub fn ip(&self, args: &[&str]) -> anyhow::Result<String> {
        sh(Command::new("ip").arg("-n").arg(self.name()).args(args))
    }

    /// A command that runs inside the namespace.
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", self.name()]).arg(program);
        cmd
    }

    /// Runs a command inside the namespace and returns its output (whatever its status).
    pub fn exec(&self, args: &[&str]) -> anyhow::Result<Output> {
        let mut cmd = self.command(args[0]);
        cmd.args(&args[1..]).stdin(Stdio::null());
        cmd.output()
            .with_context(|| format!("cannot start {args:?}"))
    }

    /// Starts a process inside the namespace; it is stopped when the guard drops.
    pub fn spawn(&self, cmd: &mut Command) -> anyhow::Result<Process> {
        let child = cmd
            .stdin(Stdio::null())
            .spawn()
            .with_context(|| format!("cannot start {cmd:?}"))?;
        Ok(Process {
            child,
            _ns: self.clone(),
        })
    }

    /// Runs `f` on a thread that has entered the namespace: sockets it creates live there (and
    /// stay there after it returns).
    pub fn enter<T: Send>(&self, f: impl FnOnce() -> T + Send) -> T {
        let path = format!("/run/netns/{}", self.name());
        std::thread::scope(|s| {
            s.spawn(|| {
                let file = File::open(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
                // SAFETY: valid fd; affects only this thread.
                if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                    panic!("setns {path}: {}", std::io::Error::last_os_error());
                }
                f()
            })
            .join()
            .unwrap_or_else(|p| std::panic::resume_unwind(p))
        })
    }

    /// Runs the future `f` makes on a current-thread tokio runtime whose thread has entered the
    /// namespace (sockets created in it live there).
    pub fn block_on<T: Send, Fut: std::future::Future<Output = T>>(
        &self,
        f: impl FnOnce() -> Fut + Send,
    ) -> T {
        self.enter(|| {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("tokio runtime")
                .block_on(f())
        })
    }

    /// Writes a sysctl of this namespace, e.g. `("net/ipv4/ip_forward", "1")`.
    pub fn sysctl(&self, key: &str, value: &str) -> anyhow::Result<()> {
        let path = format!("/proc/sys/{key}");
        // /proc/sys/net follows the network namespace of the thread that opens it.
        self.enter(|| std::fs::write(&path, value))
            .with_context(|| format!("writing {path} in {}", self.name()))
    }

    /// Counter `field` of this namespace's /proc/net/netstat, on its `prefix` lines (`TcpExt:`,
    /// `IpExt:`).
    pub fn netstat(&self, prefix: &str, field: &str) -> anyhow::Result<u64> {
        // /proc/thread-self/net follows the network namespace of the thread that reads it.
        let text = self
            .enter(|| std::fs::read_to_string("/proc/thread-self/net/netstat"))
            .with_context(|| format!("reading netstat in {}", self.name()))?;
        stat_field(&text, prefix, field)
            .with_context(|| format!("no {prefix} {field} in {}'s netstat", self.name()))
    }

    /// `nft ARGS` inside the namespace (rules die with it).
    pub fn nft(&self, args: &[&str]) -> anyhow::Result<()> {
        sh(self.command("nft").args(args))?;
        Ok(())
    }

    /// Creates table `inet lbt` with an input chain `in` of `policy` (`drop`, `accept`); more
    /// rules can be added to that chain with [`Netns::nft`].
    pub fn input_chain(&self, policy: &str) -> anyhow::Result<()> {
        self.nft(&["add", "table", "inet", "lbt"])?;
        let chain = format!("{{ type filter hook input priority 0; policy {policy}; }}");
        self.nft(&["add", "chain", "inet", "lbt", "in", &chain])
    }

    /// Creates table `inet lbt` (if need be) with an output chain `out` of `policy`; more rules
    /// can be added to that chain with [`Netns::nft`].
    pub fn output_chain(&self, policy: &str) -> anyhow::Result<()> {
        self.nft(&["add", "table", "inet", "lbt"])?;
        let chain = format!("{{ type filter hook output priority 0; policy {policy}; }}");
        self.nft(&["add", "chain", "inet", "lbt", "out", &chain])
    }

    /// Makes the namespace silently drop everything it receives (a host that stopped answering).
    pub fn drop_all_input(&self) -> anyhow::Result<()> {
        self.input_chain("drop")
    }

    /// Removes what [`Netns::input_chain`] set up.
    pub fn clear_input_chain(&self) -> anyhow::Result<()> {
        self.nft(&["delete", "table", "inet", "lbt"])
    }

    /// Index of an interface of this namespace (only meaningful inside it).
    pub fn ifindex(&self, ifname: &str) -> anyhow::Result<u32> {
        let out = self.ip(&["-o", "link", "show", "dev", ifname])?;
        out.split(':')
            .next()
            .and_then(|n| n.trim().parse().ok())
            .with_context(|| format!("no index in {out:?}"))
    }

    /// MAC address of an interface of this namespace.
    pub fn mac(&self, ifname: &str) -> anyhow::Result<[u8; 6]> {
        let out = self.ip(&["-o", "link", "show", "dev", ifname])?;
        let text = out
            .split("link/ether ")
            .nth(1)
            .and_then(|r| r.split_whitespace().next())
            .with_context(|| format!("no MAC in {out:?}"))?;
        let mut mac = [0u8; 6];
        for (i, part) in text.split(':').enumerate().take(6) {
            mac[i] = u8::from_str_radix(part, 16)?;
        }
        Ok(mac)
    }

    /// Whether an XDP program is attached to `ifname`.
    pub fn xdp_attached(&self, ifname: &str) -> anyhow::Result<bool> {
        Ok(self
            .ip(&["-d", "link", "show", "dev", ifname])?
            .contains("prog/xdp"))
    }
}

/// One end of a veth pair.
#[derive(Clone)]
pub struct Port {
    pub ns: Netns,
    pub ifname: String,
    /// Address with prefix, e.g. `10.0.1.2/24`.
    pub cidr: String,
}

impl Port {
    /// The address without prefix.
    pub fn addr(&self) -> &str {
        self.cidr.split('/').next().expect("cidr")
    }
}

/// A veth pair between two namespaces, created in one step (never visible in the root
/// namespace), addressed, up, with TX checksum offload off (forwarded TCP stalls on partial
/// checksums otherwise).
pub fn veth(a: &Netns, a_cidr: &str, b: &Netns, b_cidr: &str) -> anyhow::Result<(Port, Port)> {
    veth_maybe_addressed(a, Some(a_cidr), b, Some(b_cidr))
}

/// Waits until `ifname` is operationally up. The kernel turns a link's carrier on and gives it
/// its queueing discipline from a work queue after `ip link set up` returns; until then what is
/// sent through it is dropped, and on a busy machine the first ARP or neighbour solicitation of
/// a test can be lost that way (a second is then gone waiting for the retry).
fn wait_operational(ns: &Netns, ifname: &str) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let link = ns.ip(&["-o", "link", "show", "dev", ifname])?;
        if link.contains(" state UP ") && !link.contains("qdisc noop") {
            return Ok(());
        }
        if Instant::now() >= deadline {
            bail!("{ifname} in {} is not up after 10 s: {link}", ns.name());
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Like [`veth`], with either end left without an address (e.g. a bridge port).
pub fn veth_maybe_addressed(
    a: &Netns,
    a_cidr: Option<&str>,
    b: &Netns,
    b_cidr: Option<&str>,
) -> anyhow::Result<(Port, Port)> {
    let id = next_id();
    let pid = std::process::id();
    let (an, bn) = (format!("v{pid}x{id}a"), format!("v{pid}x{id}b"));
    sh(Command::new("ip").args([
        "link",
        "add",
        &an,
        "netns",
        a.name(),
        "type",
        "veth",
        "peer",
        "name",
        &bn,
        "netns",
        b.name(),
    ]))?;
    for (ns, ifname, cidr) in [(a, &an, a_cidr), (b, &bn, b_cidr)] {
        if let Some(cidr) = cidr {
            add_address(ns, ifname, cidr)?;
        }
        ns.ip(&["link", "set", ifname, "up"])?;
        sh(ns.command("ethtool").args(["-K", ifname, "tx", "off"]))?;
    }
    for (ns, ifname) in [(a, &an), (b, &bn)] {
        wait_operational(ns, ifname)?;
    }
    let port = |ns: &Netns, ifname: String, cidr: Option<&str>| Port {
        ns: ns.clone(),
        ifname,
        cidr: cidr.unwrap_or_default().into(),
    };
    Ok((port(a, an, a_cidr), port(b, bn, b_cidr)))
}

/// Adds `cidr` (IPv4 or IPv6) to `ifname` in `ns`; an IPv6 address usable at once (`nodad`).
pub fn add_address(ns: &Netns, ifname: &str, cidr: &str) -> anyhow::Result<()> {
    if cidr.contains(':') {
        ns.ip(&["addr", "add", cidr, "dev", ifname, "nodad"])?;
    } else {
        ns.ip(&["addr", "add", cidr, "dev", ifname])?;
    }
    Ok(())
}

impl Port {
    /// Adds a second address (e.g. the other family's) to this end.
    pub fn add_address(&self, cidr: &str) -> anyhow::Result<()> {
        add_address(&self.ns, &self.ifname, cidr)
    }
}

/// Turns GRO on or off for a veth end. With it on, frames redirected into the veth by native
/// XDP are received without a program on the peer, and the end has a NAPI instance (which
/// threaded NAPI needs).
pub fn set_gro(port: &Port, on: bool) -> anyhow::Result<()> {
    let on = if on { "on" } else { "off" };
    sh(port
        .ns
        .command("ethtool")
        .args(["-K", &port.ifname, "gro", on]))
    .with_context(|| format!("GRO {on} on {}", port.ifname))?;
    Ok(())
}

/// An XDP_PASS program attached to a veth end: native XDP_TX towards a veth is only received when
/// the peer has a program. Detached when dropped (or with the namespace).
pub struct PassProgram {
    _ebpf: aya::Ebpf,
}

pub fn attach_pass_program(port: &Port) -> anyhow::Result<PassProgram> {
    let mut ebpf = aya::Ebpf::load(lb::dataplane::object())?;
    {
        let prog: &mut aya::programs::Xdp = ebpf
            .program_mut(lb_common::PASS_PROGRAM_NAME)
            .context("pass program missing")?
            .try_into()?;
        prog.load()?;
        // Interface indexes are per namespace: attach from inside it, never by an index that
        // the root namespace could resolve to one of the host's own interfaces.
        let ifname = std::ffi::CString::new(port.ifname.as_str())?;
        port.ns
            .enter(|| prog.attach(ifname.as_c_str(), aya::programs::XdpMode::Driver))?;
    }
    Ok(PassProgram { _ebpf: ebpf })
}

/// A process started in a namespace: SIGTERM on drop, SIGKILL if it has not ended 5 s later.
pub struct Process {
    child: Child,
    _ns: Netns,
}

impl Process {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Whether it is still running.
    pub fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Sends `signal` (e.g. SIGHUP) and returns at once.
    pub fn signal(&self, signal: libc::c_int) {
        // SAFETY: signalling our own child by pid.
        unsafe { libc::kill(self.child.id() as i32, signal) };
    }

    /// Sends SIGTERM and waits up to `timeout` for it to end; its exit code, or None if it had to
    /// be killed.
    pub fn terminate(&mut self, timeout: Duration) -> Option<i32> {
        self.stop_with(libc::SIGTERM, timeout)
    }

    /// Like [`Process::terminate`] with another signal (e.g. SIGINT).
    pub fn stop_with(&mut self, signal: libc::c_int, timeout: Duration) -> Option<i32> {
        if let Ok(Some(status)) = self.child.try_wait() {
            return status.code();
        }
        // SAFETY: signalling our own child by pid.
        unsafe { libc::kill(self.child.id() as i32, signal) };
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return status.code();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill(); // still running: force it
        let _ = self.child.wait();
        None
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.terminate(Duration::from_secs(5));
    }
}
