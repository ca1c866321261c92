//! The backend's side of direct server return in a namespace: the real `lb decap` attached to a
//! backend's interfaces with a pin directory of its own ([`DecapGuard`], which always removes
//! it), and a VIP held on `lo` the way a DSR backend holds it ([`hold_vip`]). A backend for a
//! DSR test, in short:
//!
//! ```text
//! hold_vip(&backend_ns, vip)?;
//! let _servers = servers::start(&backend_ns, SocketAddr::new(vip, 80), "b1")?;
//! let decap = DecapGuard::start(&backend_ns, &[&backend_port.ifname], &[])?;
//! // ... traffic through lb with forwarding mode ipip or gue ...
//! assert!(decap.stats()?.counter("decap_ipip") > 0);
//! ```

use std::{
    net::IpAddr,
    path::{Path, PathBuf},
    process::{Output, Stdio},
    sync::{
        Once,
        atomic::{AtomicU32, Ordering},
    },
};

use anyhow::{Context as _, bail};
use lb::{dataplane, decap::DecapStatus};

use crate::{
    lb_bin,
    netns::{Netns, add_address},
};

const PREFIX: &str = "lb-decap-test-";
static NEXT: AtomicU32 = AtomicU32::new(0);
static SWEEP: Once = Once::new();

/// `lb decap` set up in a namespace, pinned in `/sys/fs/bpf/lb-decap-test-<pid>-<n>`. Dropping
/// it runs `lb decap --stop` and removes whatever is left of the pin directory, also when the
/// test failed. Pin directories of killed runs (whose pid is gone) are removed on first use.
pub struct DecapGuard {
    ns: Netns,
    pin: PathBuf,
    /// Whether `--pin-path` is given, or lb decap's default for the namespace is used.
    explicit: bool,
}

impl DecapGuard {
    /// Runs `lb decap --interface IF ... --pin-path <unique> EXTRA_ARGS` in `ns`; fails with
    /// its output when it fails (and then leaves nothing behind).
    pub fn start(ns: &Netns, interfaces: &[&str], extra_args: &[&str]) -> anyhow::Result<Self> {
        SWEEP.call_once(sweep_stale);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let guard = Self {
            ns: ns.clone(),
            pin: Path::new(dataplane::BPFFS).join(format!("{PREFIX}{}-{n}", std::process::id())),
            explicit: true,
        };
        guard.update(interfaces, extra_args)?;
        Ok(guard)
    }

    /// As [`DecapGuard::start`], without `--pin-path`: lb decap's own default for `ns`, which
    /// the guard computes too, to remove whatever `--stop` leaves there.
    pub fn start_default(ns: &Netns, interfaces: &[&str]) -> anyhow::Result<Self> {
        let netns = lb::netns::NetNs::of(&Path::new("/run/netns").join(ns.name()))?;
        let guard = Self {
            ns: ns.clone(),
            pin: lb::netns::pin_path_for(lb::decap::DEFAULT_PIN_PATH, &netns),
            explicit: false,
        };
        guard.update(interfaces, &[])?;
        Ok(guard)
    }

    /// Runs `lb decap` again on the same pin directory: new interfaces, addresses, parameters,
    /// applied in place. Returns what it printed.
    pub fn update(&self, interfaces: &[&str], extra_args: &[&str]) -> anyhow::Result<String> {
        let mut args = Vec::new();
        for iface in interfaces {
            args.extend(["--interface", iface]);
        }
        args.extend(extra_args);
        let out = self.lb(&args)?;
        if !out.status.success() {
            bail!(
                "lb decap {args:?} failed ({}): {}{}",
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// The pin directory.
    pub fn pin_path(&self) -> &Path {
        &self.pin
    }

    /// `lb decap --stats --json`: counters summed over CPUs, parameters, addresses, links.
    pub fn stats(&self) -> anyhow::Result<DecapStatus> {
        let out = self.lb(&["--stats", "--json"])?;
        if !out.status.success() {
            bail!("lb decap --stats: {}", String::from_utf8_lossy(&out.stderr));
        }
        serde_json::from_slice(&out.stdout).context("lb decap --stats --json")
    }

    /// `lb decap --stop` now (dropping the guard afterwards finds nothing to remove).
    pub fn stop(&self) -> anyhow::Result<String> {
        let out = self.lb(&["--stop"])?;
        if !out.status.success() {
            bail!("lb decap --stop: {}", String::from_utf8_lossy(&out.stderr));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// `lb decap ARGS --pin-path <ours>` in the namespace, whatever its exit status.
    pub fn lb(&self, args: &[&str]) -> anyhow::Result<Output> {
        let mut cmd = lb_decap_command(&self.ns);
        cmd.args(args);
        if self.explicit {
            cmd.arg("--pin-path").arg(&self.pin);
        }
        cmd.stdin(Stdio::null())
            .output()
            .with_context(|| format!("running {cmd:?}"))
    }
}

impl Drop for DecapGuard {
    fn drop(&mut self) {
        match self.lb(&["--stop"]) {
            Ok(out) if out.status.success() => {}
            Ok(out) => eprintln!(
                "warning: lb decap --stop: {}",
                String::from_utf8_lossy(&out.stderr)
            ),
            Err(e) => eprintln!("warning: {e:#}"),
        }
        // Whatever --stop could not remove (links are detached with their pins).
        if let Err(e) = dataplane::remove_pinned(&self.pin) {
            eprintln!("warning: {e:#}");
        }
    }
}

/// `lb decap` in `ns`'s network namespace and the host's mount namespace, where bpffs and the
/// pins are: `nsenter --net`, never `ip netns exec`, whose private mount namespace hides them.
pub fn lb_decap_command(ns: &Netns) -> std::process::Command {
    let mut cmd = std::process::Command::new("nsenter");
    cmd.arg(format!("--net=/run/netns/{}", ns.name()))
        .arg(lb_bin())
        .arg("decap");
    cmd
}

fn sweep_stale() {
    for (name, path) in crate::netns::stale_entries(Path::new(dataplane::BPFFS), PREFIX) {
        eprintln!("removing stale decap test pins {name}");
        if let Err(e) = dataplane::remove_pinned(&path) {
            eprintln!("warning: {e:#}");
        }
    }
}

/// Makes `ns` a DSR backend for `vip`: the VIP on `lo` (a /32 or /128), so that the packets
/// the decapsulator takes out are accepted and answered from the VIP; ARP kept from answering
/// for it (`arp_ignore=1`: only for addresses of the interface asked on; `arp_announce=2`: a
/// request's sender address is one of the outgoing interface's), which IPv6's neighbour
/// discovery does by itself for an address on `lo`; and reverse path filtering off, since the
/// decapsulated packets come in from clients whose routes may lie elsewhere.
pub fn hold_vip(ns: &Netns, vip: IpAddr) -> anyhow::Result<()> {
    let cidr = match vip {
        IpAddr::V4(_) => format!("{vip}/32"),
        IpAddr::V6(_) => format!("{vip}/128"),
    };
    add_address(ns, "lo", &cidr)?;
    ns.sysctl("net/ipv4/conf/all/arp_ignore", "1")?;
    ns.sysctl("net/ipv4/conf/all/arp_announce", "2")?;
    // The filter in force is the larger of `all`'s and the interface's: every one is set.
    let confs = ns
        .enter(|| -> std::io::Result<Vec<String>> {
            std::fs::read_dir("/proc/sys/net/ipv4/conf")?
                .map(|e| Ok(e?.file_name().to_string_lossy().into_owned()))
                .collect()
        })
        .with_context(|| format!("listing the IPv4 interfaces of {}", ns.name()))?;
    for conf in confs {
        ns.sysctl(&format!("net/ipv4/conf/{conf}/rp_filter"), "0")?;
    }
    Ok(())
}
