//! The XDP program and its maps: load (sized from the config), pin, attach, write, read
//! counters. Everything that touches the kernel's BPF objects lives here.

pub mod cookie;
pub mod owner;
pub mod pin;
mod rings;
mod signals;
mod stats;
mod tc;
mod trace;

use std::{
    ffi::CString,
    io,
    os::fd::AsFd as _,
    path::{Path, PathBuf},
};

use anyhow::{Context as _, anyhow, bail};
use aya::{
    Ebpf, EbpfError, EbpfLoader, Pod,
    maps::{
        Array, DevMapHash, HashMap as BpfHashMap, MapData, MapError, PerCpuArray, PerCpuValues,
        ProgramArray,
    },
    programs::{
        ProgramError, SchedClassifier, Xdp, XdpMode,
        links::{FdLink, PinnedLink},
        xdp::{XdpLink, XdpLinkId},
    },
    sys::SyscallError,
};
use lb_common::{
    ADDR_SETS, AddrSet, AddrSet6, BackendInfo, BackendInfo6, CookieKey, CtSlot, FlowKey, FlowKey6,
    ICMP_PROG, ICMP_PROGRAM_NAME, ICMP6_PROG, ICMP6_PROGRAM_NAME, NatSlot, PARAMS_GLOBAL,
    PASS_PROGRAM_NAME, PROBE_ENCAP_PROGRAM_NAME, PROBE_REPLY_PROG, PROBE_REPLY_PROGRAM_NAME,
    PROGRAM_NAME, PROXY_PROGRAMS, Params, ProbeReply, ProbeReply6, QuicServerId, QuicServerKey,
    ServiceInfo, ServiceKey, ServiceKey6, TOO_BIG_PROG, TOO_BIG_PROGRAM_NAME, TRACE_PROGRAM_NAME,
    TokenBucket, TunnelProbe, TunnelProbe6, XDP6_PROG, XDP6_PROGRAM_NAME, map_name, ways,
};
use tracing::{info, warn};

use crate::{
    addr_table::{AddrTable, AddrTable6},
    balancer::MapWriter,
    config,
    entries::{AnyBackend, AnyServiceKey, AnyTunnel},
};
pub use pin::{BPFFS, patiently, remove_pinned};
use rings::Rings;
pub use signals::{MAX_PER_TAKE as MAX_SIGNALS_PER_TAKE, SignalRing};
pub use stats::{Stats, TrafficCounters};
pub use trace::TraceMaps;

/// The XDP object built by build.rs (empty when built with LB_EBPF_STUB=1).
pub fn object() -> &'static [u8] {
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/lb-xdp"))
}

/// The clock of `bpf_ktime_get_coarse_ns`, in nanoseconds: the datapath's time (its deadlines,
/// the SYN sketch's epochs).
pub fn monotonic_coarse_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid pointer to a timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Datapath parameters and map sizes from the config.
pub fn params(lb: &config::Lb) -> Params {
    let ns = |d: std::time::Duration| d.as_nanos() as u64;
    Params {
        ring_size: lb.ring_size,
        table_mask: lb.conntrack.size - 1,
        nat_mask: 2 * lb.conntrack.size - 1,
        snat_port_min: *lb.snat_ports.start(),
        snat_port_count: lb.snat_ports.end() - lb.snat_ports.start() + 1,
        timeout_ns: [
            ns(lb.conntrack.udp_timeout),
            ns(lb.conntrack.tcp_syn_timeout),
            ns(lb.conntrack.tcp_established_timeout),
            ns(lb.conntrack.tcp_closing_timeout),
        ],
        closed_hold_ns: ns(lb.conntrack.tcp_closed_timeout),
        flags: if lb.translate_icmp {
            lb_common::param_flags::TRANSLATE_ICMP
        } else {
            0
        },
        icmp_reply_rate: lb.icmp_reply_rate,
        syn_rate_per_source: lb.syn_rate_per_source,
        icmp_reply_scaled: Params::per_2_32_ns(lb.icmp_reply_rate),
        syn_rate_scaled: Params::per_2_32_ns(lb.syn_rate_per_source),
        table6_mask: lb.conntrack.ipv6_size - 1,
        nat6_mask: 2 * lb.conntrack.ipv6_size - 1,
        gue_port: lb.gue_port.to_be(),
        _pad: 0,
        dsr_flood_rate: lb.dsr_flood_rate,
        _pad2: 0,
    }
}

/// The loaded program and maps, and the interfaces it is attached to.
///
/// Without a pin directory, dropping it detaches the program from every interface and frees the
/// maps. With one, the maps and links are pinned: dropping it (or the process dying) only closes
/// its file descriptors, like [`Dataplane::release`]; the program keeps forwarding with the
/// pinned maps until a new `Dataplane` adopts them or [`Dataplane::detach_all`] /
/// [`remove_pinned`] removes them.
pub struct Dataplane {
    ebpf: Ebpf,
    attached: Vec<Attached>,
    /// The health probes' TC egress program, per interface.
    egress: Vec<tc::Egress>,
    /// Why it could not be attached to an interface, if it could not: probes through the
    /// tunnel are then refused.
    egress_error: Option<String>,
    /// The bpffs directory holding the pins, if pinned, and our lock on it.
    pin: Option<(PathBuf, pin::DirLock)>,
    adopted: bool,
    /// The current SYN cookie key (LB_COOKIE_KEYS' first slot).
    cookie_key: CookieKey,
    /// LB_RINGS: ring slots are written through mappings of it.
    rings: Rings,
    ring_size: u32,
    params: Params,
    services: u32,
    backends: u32,
}

struct Attached {
    iface: String,
    link: Link,
}

enum Link {
    /// Owned by the program: detached when it is dropped.
    Owned(XdpLinkId),
    /// Pinned at `path`: stays attached until the pin is removed.
    Pinned { link: FdLink, path: PathBuf },
}

impl Dataplane {
    /// Loads the object with maps sized for `lb`, and verifies both programs; attaches nothing.
    ///
    /// With `pin`, every map is pinned in that bpffs directory (bpffs is mounted at /sys/fs/bpf
    /// first if it is not): maps already pinned there by a previous run are reused with their
    /// content (see [`Dataplane::adopted`]), the others are created and pinned.
    pub fn load(lb: &config::Lb, pin: Option<&Path>) -> anyhow::Result<Self> {
        let object = object();
        if object.is_empty() {
            bail!(
                "this lb was built with LB_EBPF_STUB=1 and has no XDP program: rebuild it with `cargo xtask build`"
            );
        }
        raise_memlock_limit();
        let params = params(lb);
        let ring_entries = lb.max_services * lb.ring_size;
        let mut loader = EbpfLoader::new();
        loader
            .override_global(PARAMS_GLOBAL, &params, true)
            .map_max_entries(map_name::SERVICES, lb.max_services)
            .map_max_entries(map_name::SERVICE_STATS, lb.max_services)
            .map_max_entries(map_name::FLOOD, lb.max_services)
            .map_max_entries(map_name::RINGS, ring_entries)
            .map_max_entries(map_name::BACKENDS, lb.max_backends)
            .map_max_entries(map_name::BACKEND_STATS, lb.max_backends)
            .map_max_entries(map_name::NEXTHOPS, lb.max_backends)
            .map_max_entries(map_name::CONNTRACK, lb.conntrack.size)
            .map_max_entries(map_name::NAT, 2 * lb.conntrack.size)
            .map_max_entries(map_name::SERVICES6, lb.max_services)
            .map_max_entries(map_name::BACKENDS6, lb.max_backends)
            .map_max_entries(map_name::CONNTRACK6, lb.conntrack.ipv6_size)
            .map_max_entries(map_name::NAT6, 2 * lb.conntrack.ipv6_size)
            .map_max_entries(map_name::QUIC_LAYOUTS, lb.max_services)
            .map_max_entries(map_name::QUIC_IDS, lb.max_backends)
            .map_max_entries(map_name::QUIC_SERVERS, lb.max_backends)
            .map_max_entries(map_name::PROXY, lb.syn_proxy_flows)
            .map_max_entries(map_name::PROXY6, lb.syn_proxy_flows);
        let mut adopted = false;
        let mut fresh = false;
        let mut lock = None;
        if let Some(dir) = pin {
            pin::prepare_dir(dir)?;
            // Another namespace's datapath is neither adopted nor touched (its lock, when its
            // daemon runs, would only say "in use").
            let ours = crate::netns::default_pin_path(config::DEFAULT_PIN_PATH);
            let refuse_foreign = || owner::refuse_foreign(dir, "lb run", &ours);
            lock = Some(pin::lock(dir).map_err(|e| refuse_foreign().err().unwrap_or(e))?);
            refuse_foreign()?;
            fresh = std::fs::read_dir(dir)
                .with_context(|| format!("reading {}", dir.display()))?
                .next()
                .is_none();
            migrate_rings(dir)?;
            let found = pin::pinned_maps(dir);
            adopted = !found.is_empty();
            if adopted && found.len() < pin::MAPS.len() {
                warn!(dir = %dir.display(), found = ?found, "only some maps were pinned: creating the others");
            }
            for name in pin::MAPS {
                loader.map_pin_path(name, dir.join(name));
            }
        }
        let loaded = loader
            .load(object)
            .map_err(|e| load_error(e, pin))
            .and_then(verify);
        let mut ebpf = match (loaded, pin) {
            (Ok(ebpf), _) => ebpf,
            (Err(e), Some(dir)) if fresh => {
                // Do not leave half a datapath pinned by a load that failed.
                if let Err(e) = pin::remove_locked(dir) {
                    warn!(dir = %dir.display(), error = %format!("{e:#}"), "removing the pins of a failed load");
                }
                return Err(e);
            }
            (Err(e), _) => return Err(e),
        };
        if let Some(dir) = pin {
            info!(dir = %dir.display(), adopted, "datapath maps pinned");
        }
        let mut dp_keys = ebpf
            .map_mut(map_name::COOKIE_KEYS)
            .context("map LB_COOKIE_KEYS missing")
            .and_then(|m| Ok(Array::<_, CookieKey>::try_from(m)?))?;
        let cookie_key = cookie::key(lb.syn_cookie_key_file.as_deref())?;
        dp_keys
            .set(0, &cookie_key, 0)
            .context("writing the SYN cookie key")?;
        let rings = match ebpf.map(map_name::RINGS) {
            Some(aya::maps::Map::Array(map)) => Rings::new(map.fd().as_fd(), ring_entries)
                .context("mapping the ring array LB_RINGS into memory")?,
            _ => bail!("map LB_RINGS missing or not an array"),
        };
        Ok(Self {
            ebpf,
            rings,
            attached: Vec::new(),
            egress: Vec::new(),
            egress_error: None,
            pin: pin.map(Path::to_owned).zip(lock),
            adopted,
            cookie_key,
            ring_size: lb.ring_size,
            params,
            services: 0,
            backends: 0,
        })
    }

    /// Sets the SYN cookie keys: `current`, and `previous` (still valid for its cookies; None:
    /// none). The previous first: the key `current` replaces is valid at every instant when it
    /// is `previous`.
    pub fn set_cookie_keys(
        &mut self,
        current: CookieKey,
        previous: Option<CookieKey>,
    ) -> anyhow::Result<()> {
        let mut keys = self.array::<CookieKey>(map_name::COOKIE_KEYS)?;
        keys.set(1, &previous.unwrap_or_default(), 0)?;
        keys.set(0, &current, 0)?;
        self.cookie_key = current;
        Ok(())
    }

    /// Makes `key` the SYN cookie key unless it is already: the key before it stays valid for
    /// the cookies it made (two keys live across a rotation). Whether it changed.
    pub fn rotate_cookie_key(&mut self, key: CookieKey) -> anyhow::Result<bool> {
        if key == self.cookie_key {
            return Ok(false);
        }
        self.set_cookie_keys(key, Some(self.cookie_key))
            .context("writing the SYN cookie keys")?;
        Ok(true)
    }

    /// Whether the maps came from a previous run's pins (their content is that run's: connection
    /// table, backend flags, rings, counters). Decided by whether the pin directory held pinned
    /// maps before loading.
    pub fn adopted(&self) -> bool {
        self.adopted
    }

    /// The bpffs directory of the pins, if pinned.
    pub fn pin_dir(&self) -> Option<&Path> {
        self.pin.as_ref().map(|(dir, _)| dir.as_path())
    }

    pub fn program(&self) -> &Xdp {
        self.named_program(PROGRAM_NAME)
    }

    /// Instructions the verifier processed for the balancer and its ICMP program (its limit is
    /// 1,000,000 per program): how far the datapath is from what the kernel accepts.
    pub fn verified_instructions(&self) -> Vec<(&'static str, Option<u32>)> {
        [
            PROGRAM_NAME,
            XDP6_PROGRAM_NAME,
            ICMP_PROGRAM_NAME,
            ICMP6_PROGRAM_NAME,
            TOO_BIG_PROGRAM_NAME,
            PROBE_REPLY_PROGRAM_NAME,
            TRACE_PROGRAM_NAME,
        ]
        .into_iter()
        .chain(PROXY_PROGRAMS.map(|(_, name)| name))
        .map(|name| {
            let count = self
                .named_program(name)
                .info()
                .ok()
                .and_then(|i| i.verified_instruction_count());
            (name, count)
        })
        .collect()
    }

    /// The health probes' TC egress program (see [`Dataplane::attach`]).
    pub fn egress_program(&self) -> &SchedClassifier {
        self.ebpf
            .program(PROBE_ENCAP_PROGRAM_NAME)
            .and_then(|p| p.try_into().ok())
            .expect("verified in load()")
    }

    /// The backend the reply `key` (VIP:port → lb's address:port) of an IPv4 probe through the
    /// tunnel comes from, as the TC program recorded it.
    pub fn probe_reply(&mut self, key: &FlowKey) -> anyhow::Result<Option<ProbeReply>> {
        self.hash_map::<FlowKey, ProbeReply>(map_name::PROBE_REPLIES)
            .and_then(|m| lookup(&m, key))
    }

    /// The same for IPv6.
    pub fn probe_reply6(&mut self, key: &FlowKey6) -> anyhow::Result<Option<ProbeReply6>> {
        self.hash_map::<FlowKey6, ProbeReply6>(map_name::PROBE_REPLIES6)
            .and_then(|m| lookup(&m, key))
    }

    /// The program that only passes: benchmark baseline and veth peer program.
    pub fn pass_program(&self) -> &Xdp {
        self.named_program(PASS_PROGRAM_NAME)
    }

    /// Attaches the pass program (native mode) to `iface`: a benchmark measures it in the same
    /// attach state as the balancer (the kernel calls an attached XDP program through its
    /// dispatcher, directly; a program attached nowhere through an indirect call). Detached when
    /// this `Dataplane` drops.
    pub fn attach_pass_program(&mut self, iface: &str) -> anyhow::Result<()> {
        let index = ifindex(iface)?;
        let prog: &mut Xdp = self
            .ebpf
            .program_mut(PASS_PROGRAM_NAME)
            .and_then(|p| p.try_into().ok())
            .expect("verified in load()");
        attach_mode(prog, iface, index, XdpMode::Driver)?;
        Ok(())
    }

    fn named_program(&self, name: &str) -> &Xdp {
        self.ebpf
            .program(name)
            .and_then(|p| p.try_into().ok())
            .expect("verified in load()")
    }

    fn program_mut(&mut self) -> &mut Xdp {
        self.ebpf
            .program_mut(PROGRAM_NAME)
            .and_then(|p| p.try_into().ok())
            .expect("verified in load()")
    }

    /// How many services and backends the counters should report.
    pub fn set_counts(&mut self, services: u32, backends: u32) {
        self.services = services;
        self.backends = backends;
    }

    /// Makes `iface` a target of XDP_REDIRECT (attach does this too); returns its index.
    pub fn add_redirect_target(&mut self, iface: &str) -> anyhow::Result<u32> {
        let index = ifindex(iface)?;
        check_forwarding(iface)?;
        let mut ports: DevMapHash<&mut MapData> = DevMapHash::try_from(
            self.ebpf
                .map_mut(map_name::TX_PORTS)
                .context("devmap missing")?,
        )?;
        ports
            .insert(index, index, None, 0)
            .with_context(|| format!("adding {iface} to the redirect map"))?;
        Ok(index)
    }

    /// Attaches the balancer to `iface` and makes it a redirect target; returns the mode used.
    ///
    /// When pinned and `iface` already has a pinned link (a previous run's), the program on that
    /// link is replaced atomically: no packet goes unprocessed, and the link keeps its mode
    /// (changing the mode needs `lb stop` first). Otherwise the program is attached and, when
    /// pinned, its link is pinned.
    ///
    /// Then attaches the health probes' TC egress program there (TCX; pinned and adopted the
    /// same way). Where that fails (a kernel before 6.6) lb still balances: it warns, and
    /// refuses checks through the tunnel ([`Dataplane::check_tunnel`]).
    pub fn attach(&mut self, iface: &str, mode: config::XdpMode) -> anyhow::Result<XdpMode> {
        let used = self.attach_xdp(iface, mode)?;
        if let Err(e) = self.attach_egress(iface) {
            let e = format!("{e:#}");
            warn!(%iface, error = %e, "health checks through the tunnel are unavailable");
            self.egress_error.get_or_insert(e);
        }
        Ok(used)
    }

    /// Whether health probes of `config` through the tunnel can run: they need the TC egress
    /// program on every interface.
    pub fn check_tunnel(&self, config: &config::Config) -> anyhow::Result<()> {
        let through = config.services.iter().find(|s| s.check.through_tunnel);
        match (through, &self.egress_error) {
            (Some(s), Some(e)) => bail!(
                "service {}: check.through_tunnel needs lb's TC egress program, which could not                  be attached: {e}",
                s.name
            ),
            _ => Ok(()),
        }
    }

    fn attach_xdp(&mut self, iface: &str, mode: config::XdpMode) -> anyhow::Result<XdpMode> {
        let index = self.add_redirect_target(iface)?;
        if let Some(dir) = self.pin_dir() {
            let path = pin::link_path(dir, iface);
            if path.exists()
                && let Some(used) = self.replace_pinned(iface, index, &path, mode)?
            {
                return Ok(used);
            }
        }
        let prog = self.program_mut();
        let (id, used) = match mode {
            config::XdpMode::Skb => (attach_mode(prog, iface, index, XdpMode::Skb)?, XdpMode::Skb),
            config::XdpMode::Native => {
                let id = attach_mode(prog, iface, index, XdpMode::Driver).map_err(|e| {
                    anyhow!(
                        "{e:#}\nhint: the driver of {iface} may not support native XDP; \
                         set xdp_mode = \"skb\" (or \"auto\") in [lb]"
                    )
                })?;
                (id, XdpMode::Driver)
            }
            config::XdpMode::Auto => match attach_mode(prog, iface, index, XdpMode::Driver) {
                Ok(id) => (id, XdpMode::Driver),
                Err(e) => {
                    warn!(%iface, error = %format!("{e:#}"), "native XDP attach failed, using skb mode");
                    (attach_mode(prog, iface, index, XdpMode::Skb)?, XdpMode::Skb)
                }
            },
        };
        let link = match self.pin_dir() {
            None => Link::Owned(id),
            Some(dir) => {
                let path = pin::link_path(dir, iface);
                let link =
                    FdLink::try_from(self.program_mut().take_link(id)?).with_context(|| {
                        format!(
                            "XDP on {iface} was attached through netlink, not as a bpf_link \
                         (Linux < 5.9?), and cannot be pinned"
                        )
                    })?;
                // On error the link is dropped, which detaches it.
                let pinned = link.pin(&path).with_context(|| {
                    format!("pinning the XDP link of {iface} at {}", path.display())
                })?;
                Link::Pinned {
                    link: pinned.into(),
                    path,
                }
            }
        };
        info!(%iface, mode = ?used, pinned = self.pin.is_some(), "XDP program attached");
        self.attached.push(Attached {
            iface: iface.to_owned(),
            link,
        });
        Ok(used)
    }

    /// Puts this program on the pinned link at `path` in place of a previous run's. Returns the
    /// link's mode, or None when the link is defunct (its interface was removed since) and was
    /// unpinned, so that the caller attaches anew.
    fn replace_pinned(
        &mut self,
        iface: &str,
        index: u32,
        path: &Path,
        mode: config::XdpMode,
    ) -> anyhow::Result<Option<XdpMode>> {
        let link = PinnedLink::from_pin(path)
            .with_context(|| format!("opening the pinned XDP link {}", path.display()))?;
        let link = XdpLink::try_from(FdLink::from(link))
            .with_context(|| format!("{} is not an XDP link", path.display()))?;
        let id = match self.program_mut().attach_to_link(link) {
            Ok(id) => id,
            Err(ProgramError::SyscallError(SyscallError { io_error, .. }))
                if io_error.raw_os_error() == Some(libc::ENOLINK) =>
            {
                warn!(%iface, path = %path.display(), "the pinned XDP link is defunct (interface recreated?): attaching anew");
                pin::unpin(path, true)?;
                return Ok(None);
            }
            Err(e) => {
                return Err(anyhow::Error::new(e).context(format!(
                    "replacing the program on the pinned XDP link of {iface} ({})",
                    path.display()
                )));
            }
        };
        let link = FdLink::try_from(self.program_mut().take_link(id)?)?;
        let used = match pin::attached_xdp_mode(index) {
            Ok(Some(used)) => used,
            Ok(None) => bail!("XDP link of {iface} replaced, but no XDP program is attached to it"),
            Err(e) => {
                warn!(%iface, error = %e, "could not read the XDP mode of the adopted link");
                XdpMode::Default
            }
        };
        let wanted = match mode {
            config::XdpMode::Native => Some(XdpMode::Driver),
            config::XdpMode::Skb => Some(XdpMode::Skb),
            config::XdpMode::Auto => None,
        };
        if wanted.is_some_and(|w| w != used && used != XdpMode::Default) {
            warn!(%iface, mode = ?used, wanted = ?mode, "the adopted XDP link keeps its mode; run `lb stop` then `lb run` to change it");
        }
        info!(%iface, mode = ?used, path = %path.display(), "XDP program replaced on the pinned link");
        self.attached.push(Attached {
            iface: iface.to_owned(),
            link: Link::Pinned {
                link,
                path: path.to_owned(),
            },
        });
        Ok(Some(used))
    }

    /// Detaches the program from the pinned links of interfaces this `Dataplane` has not
    /// attached to (e.g. an interface dropped from the config since the previous run), and
    /// unpins them. Call it after attaching every interface. Returns those interfaces.
    pub fn detach_unused_links(&mut self) -> anyhow::Result<Vec<String>> {
        let Some(dir) = self.pin_dir() else {
            return Ok(Vec::new());
        };
        let mut detached = Vec::new();
        for iface in pin::pinned_links(dir)? {
            if !self.attached.iter().any(|a| a.iface == iface) {
                pin::unpin(&pin::link_path(dir, &iface), true)?;
                info!(%iface, "XDP program detached (interface no longer configured)");
                detached.push(iface);
            }
        }
        for iface in pin::pinned_tc_links(dir)? {
            if !self.egress.iter().any(|a| a.iface == iface) {
                pin::unpin(&pin::tc_link_path(dir, &iface), true)?;
                info!(%iface, "TC egress program detached (interface no longer configured)");
            }
        }
        Ok(detached)
    }

    /// Detaches from every interface; when pinned, also removes every pin (links and maps) and
    /// the pin directory, after which this `Dataplane` is no longer pinned.
    pub fn detach_all(&mut self) {
        self.detach_egress();
        for Attached { iface, link } in std::mem::take(&mut self.attached) {
            let detached = match link {
                Link::Owned(id) => self.program_mut().detach(id).map_err(anyhow::Error::new),
                Link::Pinned { link, path } => {
                    // Unpin first: closing our fd then drops the last reference and detaches.
                    let unpinned = std::fs::remove_file(&path)
                        .with_context(|| format!("removing {}", path.display()));
                    drop(link);
                    unpinned
                }
            };
            match detached {
                Ok(()) => info!(%iface, "XDP program detached"),
                Err(e) => {
                    warn!(%iface, error = %format!("{e:#}"), "detaching the XDP program failed")
                }
            }
        }
        if let Some((dir, _lock)) = self.pin.take() {
            match pin::remove_locked(&dir) {
                Ok(_) => info!(dir = %dir.display(), "pinned datapath removed"),
                Err(e) => {
                    warn!(dir = %dir.display(), error = %format!("{e:#}"), "removing the pinned datapath failed")
                }
            }
        }
    }

    /// Lets go of the datapath. When pinned, everything stays pinned and attached (the program
    /// keeps forwarding with the pinned maps, for the next `lb run` to adopt) and only our file
    /// descriptors are closed; otherwise this is [`Dataplane::detach_all`]. Dropping a
    /// `Dataplane` does the same.
    pub fn release(mut self) {
        match self.pin_dir() {
            Some(dir) => info!(
                dir = %dir.display(),
                interfaces = ?self.attached.iter().map(|a| &a.iface).collect::<Vec<_>>(),
                "leaving the datapath pinned and attached"
            ),
            None => self.detach_all(),
        }
    }

    /// The IPv4 backend entry `id` as the datapath sees it.
    pub fn backend_info(&mut self, id: u32) -> anyhow::Result<BackendInfo> {
        self.array::<BackendInfo>(map_name::BACKENDS)?
            .get(&id, 0)
            .with_context(|| format!("reading backend {id}"))
    }

    /// The flags of backend `id` (of the IPv6 map if `v6`) as the datapath has them (e.g. an
    /// adopted datapath's).
    pub fn backend_flags(&mut self, id: u32, v6: bool) -> anyhow::Result<u32> {
        let flags = if v6 {
            self.array::<BackendInfo6>(map_name::BACKENDS6)?
                .get(&id, 0)
                .map(|b| b.flags)
        } else {
            return Ok(self.backend_info(id)?.flags);
        };
        flags.with_context(|| format!("reading backend {id}"))
    }

    /// The address table as the map holds it (e.g. an adopted datapath's).
    pub fn addr_table(&mut self) -> anyhow::Result<AddrTable> {
        let table = self.array::<AddrSet>(map_name::ADDRS)?;
        let sets = (0..ADDR_SETS)
            .map(|i| Ok((i, table.get(&i, 0)?)))
            .collect::<Result<Vec<_>, MapError>>()
            .context("reading the address table")?;
        Ok(AddrTable::from_sets(sets))
    }

    /// The IPv6 address table as the map holds it.
    pub fn addr_table6(&mut self) -> anyhow::Result<AddrTable6> {
        let table = self.array::<AddrSet6>(map_name::ADDRS6)?;
        let sets = (0..ADDR_SETS)
            .map(|i| Ok((i, table.get(&i, 0)?)))
            .collect::<Result<Vec<_>, MapError>>()
            .context("reading the IPv6 address table")?;
        Ok(AddrTable6::from_sets(sets))
    }

    /// The service entry of `key`, None when there is none.
    pub fn service_info(&mut self, key: &ServiceKey) -> anyhow::Result<Option<ServiceInfo>> {
        match self
            .hash_map::<ServiceKey, ServiceInfo>(map_name::SERVICES)?
            .get(key, 0)
        {
            Ok(info) => Ok(Some(info)),
            Err(aya::maps::MapError::KeyNotFound) => Ok(None),
            Err(e) => Err(anyhow::Error::new(e).context("reading the service map")),
        }
    }

    /// Removes a client flow (client → VIP key) and the return-path entry holding its SNAT port.
    /// Returns whether the flow was there. Its next packet creates it again.
    pub fn forget_flow(&mut self, client: &FlowKey) -> anyhow::Result<bool> {
        let (mask, nat_mask) = (self.params.table_mask, self.params.nat_mask);
        let Some((ct_index, slot)) =
            find_slot::<CtSlot>(&mut self.array(map_name::CONNTRACK)?, client, mask, |s| {
                s.key
            })?
        else {
            return Ok(false);
        };
        self.array::<CtSlot>(map_name::CONNTRACK)?
            .set(ct_index, &CtSlot::default(), 0)
            .context("clearing the connection table slot")?;
        let backend = self
            .array::<BackendInfo>(map_name::BACKENDS)?
            .get(&slot.entry.backend_id, 0)
            .context("reading the flow's backend")?;
        let nat_key = FlowKey::new(
            backend.addr,
            backend.snat_addr,
            backend.port,
            slot.entry.snat_port,
            client.proto,
        );
        if let Some((nat_index, _)) =
            find_slot::<NatSlot>(&mut self.array(map_name::NAT)?, &nat_key, nat_mask, |s| {
                s.key
            })?
        {
            self.array::<NatSlot>(map_name::NAT)?
                .set(nat_index, &NatSlot::default(), 0)
                .context("clearing the NAT slot")?;
        }
        Ok(true)
    }

    /// Fills, on every CPU, the SYN bucket of source `source` (network byte order) back to its
    /// burst: its next SYN is allowed as if the source had sent none for a while. With
    /// [`Self::forget_flow`], lets one flow be created anew over and over under the per-source
    /// limit (lb-bench).
    pub fn refill_syn_bucket(&mut self, source: u32) -> anyhow::Result<()> {
        let cpus = aya::util::nr_cpus().map_err(|(_, e)| e)?;
        let mut buckets: PerCpuArray<&mut MapData, TokenBucket> = PerCpuArray::try_from(
            self.ebpf
                .map_mut(map_name::SYN_RATE)
                .with_context(|| format!("map {} missing", map_name::SYN_RATE))?,
        )?;
        // A bucket last filled at time 0 refills to its burst on its next SYN (see ratelimit.rs).
        let empty = PerCpuValues::try_from(vec![TokenBucket::default(); cpus.get() as usize])?;
        buckets
            .set(lb_common::syn_bucket(source), empty, 0)
            .context("refilling the SYN bucket")
    }

    /// Counters summed over CPUs.
    pub fn stats(&self) -> anyhow::Result<Stats> {
        stats::read(&self.ebpf, self.services, self.backends)
    }

    fn hash_map<K: Pod, V: Pod>(
        &mut self,
        name: &str,
    ) -> anyhow::Result<BpfHashMap<&mut MapData, K, V>> {
        Ok(BpfHashMap::try_from(
            self.ebpf
                .map_mut(name)
                .with_context(|| format!("map {name} missing"))?,
        )?)
    }

    /// Moves the service maps' generation on, after a change of them: the datapath's remembered
    /// answers of the service map are void (see [`lb_common::ServiceHint`]).
    fn services_changed(&mut self) -> anyhow::Result<()> {
        // Read, not counted here: an adopted map goes on from the previous daemon's count.
        let mut generation = self.array::<u32>(map_name::SERVICES_GEN)?;
        let next = generation
            .get(&0, 0)
            .context("reading the service generation")?
            .wrapping_add(1);
        generation
            .set(0, &next, 0)
            .context("writing the service generation")
    }

    fn array<V: Pod>(&mut self, name: &str) -> anyhow::Result<Array<&mut MapData, V>> {
        Ok(Array::try_from(
            self.ebpf
                .map_mut(name)
                .with_context(|| format!("map {name} missing"))?,
        )?)
    }
}

impl MapWriter for Dataplane {
    fn set_addr_set(&mut self, index: u32, set: &AddrSet) -> anyhow::Result<()> {
        self.array::<AddrSet>(map_name::ADDRS)?
            .set(index, set, 0)
            .with_context(|| format!("writing set {index} of the address table"))
    }

    fn set_addr_set6(&mut self, index: u32, set: &AddrSet6) -> anyhow::Result<()> {
        self.array::<AddrSet6>(map_name::ADDRS6)?
            .set(index, set, 0)
            .with_context(|| format!("writing set {index} of the IPv6 address table"))
    }

    fn set_service(&mut self, key: AnyServiceKey, info: ServiceInfo) -> anyhow::Result<()> {
        match key {
            AnyServiceKey::V4(key) => self
                .hash_map::<ServiceKey, ServiceInfo>(map_name::SERVICES)?
                .insert(&key, &info, 0),
            AnyServiceKey::V6(key) => self
                .hash_map::<ServiceKey6, ServiceInfo>(map_name::SERVICES6)?
                .insert(&key, &info, 0),
        }
        .context("writing the service map")?;
        self.services_changed()
    }

    fn set_backend(&mut self, id: u32, info: AnyBackend) -> anyhow::Result<()> {
        match info {
            AnyBackend::V4(info) => self
                .array::<BackendInfo>(map_name::BACKENDS)?
                .set(id, &info, 0),
            AnyBackend::V6(info) => self
                .array::<BackendInfo6>(map_name::BACKENDS6)?
                .set(id, &info, 0),
        }
        .with_context(|| format!("writing backend {id}"))
    }

    fn set_ring_slots(&mut self, service_id: u32, slots: &[(u32, u32)]) -> anyhow::Result<()> {
        service_id
            .checked_mul(self.ring_size)
            .context("beyond the ring array")
            .and_then(|first| self.rings.write(first, slots))
            .with_context(|| format!("writing the ring of service {service_id}"))
    }

    fn set_tunnel(&mut self, slot: u32, entry: AnyTunnel) -> anyhow::Result<()> {
        match entry {
            AnyTunnel::V4(t) => self
                .array::<TunnelProbe>(map_name::TUNNEL_PROBES)?
                .set(slot, &t, 0),
            AnyTunnel::V6(t) => self
                .array::<TunnelProbe6>(map_name::TUNNEL_PROBES6)?
                .set(slot, &t, 0),
        }
        .with_context(|| format!("writing slot {slot} of the tunnel table"))
    }

    fn remove_service(&mut self, key: AnyServiceKey) -> anyhow::Result<()> {
        let removed = match key {
            AnyServiceKey::V4(key) => self
                .hash_map::<ServiceKey, ServiceInfo>(map_name::SERVICES)?
                .remove(&key),
            AnyServiceKey::V6(key) => self
                .hash_map::<ServiceKey6, ServiceInfo>(map_name::SERVICES6)?
                .remove(&key),
        };
        match removed {
            Ok(()) | Err(aya::maps::MapError::KeyNotFound) => self.services_changed(),
            Err(e) => Err(anyhow::Error::new(e).context("removing a service")),
        }
    }

    fn set_quic_layout(&mut self, service_id: u32, word: u32) -> anyhow::Result<()> {
        self.array::<u32>(map_name::QUIC_LAYOUTS)?
            .set(service_id, &word, 0)
            .with_context(|| format!("writing the QUIC layout of service {service_id}"))
    }

    fn set_quic_id(&mut self, backend_id: u32, server_id: Option<u64>) -> anyhow::Result<()> {
        let value = QuicServerId {
            server_id: server_id.unwrap_or(0),
            set: u32::from(server_id.is_some()),
            _pad: 0,
        };
        self.array::<QuicServerId>(map_name::QUIC_IDS)?
            .set(backend_id, &value, 0)
            .with_context(|| format!("writing the QUIC server ID of backend {backend_id}"))
    }

    fn set_quic_server(
        &mut self,
        key: QuicServerKey,
        backend_id: Option<u32>,
    ) -> anyhow::Result<()> {
        let mut map = self.hash_map::<QuicServerKey, u32>(map_name::QUIC_SERVERS)?;
        match backend_id {
            Some(id) => map.insert(&key, &id, 0),
            None => match map.remove(&key) {
                Err(aya::maps::MapError::KeyNotFound) => Ok(()),
                r => r,
            },
        }
        .with_context(|| {
            format!(
                "writing QUIC server ID {} of service {}",
                key.server_id, key.service_id
            )
        })
    }
}

/// Checks that every map of the object is pinned when pinning (a map missing from
/// [`pin::MAPS`] would silently start empty after a restart), and loads both programs into the
/// kernel (the verifier runs here).
fn verify(mut ebpf: Ebpf) -> anyhow::Result<Ebpf> {
    let unlisted: Vec<&str> = ebpf
        .maps()
        .map(|(name, _)| name)
        .filter(|name| {
            !name.starts_with('.')
                && !pin::MAPS.contains(name)
                && !pin::SCRATCH.contains(name)
                && !pin::PER_RUN.contains(name)
        })
        .collect();
    if !unlisted.is_empty() {
        bail!("maps {unlisted:?} of the XDP object are missing from dataplane::pin::MAPS");
    }
    for name in [
        PROGRAM_NAME,
        XDP6_PROGRAM_NAME,
        ICMP_PROGRAM_NAME,
        ICMP6_PROGRAM_NAME,
        TOO_BIG_PROGRAM_NAME,
        PROBE_REPLY_PROGRAM_NAME,
        TRACE_PROGRAM_NAME,
        PASS_PROGRAM_NAME,
    ]
    .into_iter()
    .chain(PROXY_PROGRAMS.map(|(_, name)| name))
    {
        let prog: &mut Xdp = ebpf
            .program_mut(name)
            .ok_or_else(|| anyhow!("program {name} missing from the XDP object"))?
            .try_into()?;
        prog.load()
            .with_context(|| format!("the kernel rejected XDP program {name}"))?;
    }
    let egress: &mut SchedClassifier = ebpf
        .program_mut(PROBE_ENCAP_PROGRAM_NAME)
        .ok_or_else(|| anyhow!("program {PROBE_ENCAP_PROGRAM_NAME} missing from the object"))?
        .try_into()?;
    egress
        .load()
        .with_context(|| format!("the kernel rejected TC program {PROBE_ENCAP_PROGRAM_NAME}"))?;
    // The balancer hands IPv6, ICMP for its addresses and packets too big for their path to
    // these programs (tail calls). Set before the balancer is attached; on adoption they
    // replace the old ones at once, in place.
    for (slot, name) in [
        (XDP6_PROG, XDP6_PROGRAM_NAME),
        (ICMP_PROG, ICMP_PROGRAM_NAME),
        (ICMP6_PROG, ICMP6_PROGRAM_NAME),
        (TOO_BIG_PROG, TOO_BIG_PROGRAM_NAME),
        (PROBE_REPLY_PROG, PROBE_REPLY_PROGRAM_NAME),
    ] {
        let fd = ebpf
            .program(name)
            .with_context(|| format!("program {name} missing"))?
            .fd()
            .with_context(|| format!("program {name} not loaded"))?
            .try_clone()?;
        let mut progs = ProgramArray::try_from(
            ebpf.map_mut(map_name::PROGS)
                .context("program array missing")?,
        )?;
        progs
            .set(slot, &fd, 0)
            .with_context(|| format!("installing program {name}"))?;
    }
    for (slot, name) in PROXY_PROGRAMS {
        let fd = ebpf
            .program(name)
            .with_context(|| format!("program {name} missing"))?
            .fd()
            .with_context(|| format!("program {name} not loaded"))?
            .try_clone()?;
        let mut progs = ProgramArray::try_from(
            ebpf.map_mut(map_name::PROXY_PROGS)
                .context("the SYN proxy's program array missing")?,
        )?;
        progs
            .set(slot, &fd, 0)
            .with_context(|| format!("installing program {name}"))?;
    }
    trace::install(&mut ebpf)?;
    Ok(ebpf)
}

/// An lb before the mapped rings pinned LB_RINGS without the flag that lets it be mapped. The
/// rings hold nothing but what the daemon writes in full at every start, before it attaches
/// its program: such a pin is removed, so that the load makes a mappable array. The program
/// still attached keeps the old array until the new program takes its place.
fn migrate_rings(dir: &Path) -> anyhow::Result<()> {
    let path = dir.join(map_name::RINGS);
    if rings::pinned_without_mapping(&path) {
        std::fs::remove_file(&path).with_context(|| {
            format!("removing the pin of the old ring array {}", path.display())
        })?;
        info!(pin = %path.display(), "the pinned rings predate mapped rings: a new array takes their place, written in full before the program changes");
    }
    Ok(())
}

/// A load error; a pinned map that does not fit this config names the setting and the way out.
fn load_error(e: EbpfError, pin: Option<&Path>) -> anyhow::Error {
    let (
        EbpfError::MapError(MapError::IncompatiblePinnedMap {
            name,
            property,
            expected,
            actual,
        }),
        Some(dir),
    ) = (&e, pin)
    else {
        return anyhow::Error::new(e).context("loading the XDP object");
    };
    let what = if *property == "max_entries" {
        format!(
            "map {name} has {actual} entries where this config needs {expected} ({})",
            setting_of(name)
        )
    } else {
        format!(
            "map {name} has {property} {actual} where this lb needs {expected} (made by another version of lb?)"
        )
    };
    let msg = format!(
        "the datapath pinned in {} was made with other settings: {what}. \
         Run `lb stop` to remove the pinned state (this stops forwarding and forgets open \
         connections), or start with the settings it was made with",
        dir.display()
    );
    anyhow::Error::new(e).context(msg)
}

/// The config setting that sizes map `name`.
fn setting_of(name: &str) -> &'static str {
    match name {
        map_name::CONNTRACK | map_name::NAT => "[lb] conntrack.size",
        map_name::CONNTRACK6 | map_name::NAT6 => "[lb] conntrack.ipv6_size",
        map_name::SERVICES | map_name::SERVICES6 | map_name::SERVICE_STATS | map_name::FLOOD => {
            "[lb] max_services"
        }
        map_name::RINGS => "[lb] max_services × ring_size",
        map_name::PROXY | map_name::PROXY6 => "[lb] syn_proxy_flows",
        map_name::BACKENDS | map_name::BACKENDS6 | map_name::BACKEND_STATS | map_name::NEXTHOPS => {
            "[lb] max_backends"
        }
        _ => "a size fixed when lb was built",
    }
}

/// The value of `key` in a hash map (LRU or not), None when it has none.
fn lookup<K: Pod, V: Pod>(
    map: &BpfHashMap<&mut MapData, K, V>,
    key: &K,
) -> anyhow::Result<Option<V>> {
    match map.get(key, 0) {
        Ok(v) => Ok(Some(v)),
        Err(MapError::KeyNotFound) => Ok(None),
        Err(e) => Err(anyhow::Error::new(e).context("reading a hash map")),
    }
}

/// The slot (index, content) holding `key` in a 2-way table, like the datapath's lookup.
fn find_slot<T: Pod>(
    table: &mut Array<&mut MapData, T>,
    key: &FlowKey,
    mask: u32,
    key_of: impl Fn(&T) -> FlowKey,
) -> anyhow::Result<Option<(u32, T)>> {
    let (a, b) = ways(key.hash(), mask);
    for i in [a, b] {
        let slot = table.get(&i, 0).context("reading a table slot")?;
        if key_of(&slot) == *key {
            return Ok(Some((i, slot)));
        }
    }
    Ok(None)
}

/// bpf_fib_lookup refuses to route IPv6 when IPv6 forwarding is off on the ingress interface:
/// a config with IPv6 services needs it on each of lb's interfaces.
pub fn check_ipv6_forwarding(config: &config::Config) -> anyhow::Result<()> {
    if !config.services.iter().any(|s| s.vip.is_ipv6()) {
        return Ok(());
    }
    for iface in &config.lb.interfaces {
        let path = format!("/proc/sys/net/ipv6/conf/{iface}/forwarding");
        let value = std::fs::read_to_string(&path).with_context(|| {
            format!("reading {path} (IPv6 services need IPv6 on {iface}; is it disabled?)")
        })?;
        if value.trim() != "1" {
            bail!(
                "IPv6 forwarding is off on {iface} and the config has IPv6 services; lb routes \
                 through the kernel's tables (bpf_fib_lookup) and needs it: \
                 sysctl -w net.ipv6.conf.{iface}.forwarding=1"
            );
        }
    }
    Ok(())
}

/// bpf_fib_lookup refuses to route when IPv4 forwarding is off on the ingress interface.
fn check_forwarding(iface: &str) -> anyhow::Result<()> {
    let path = format!("/proc/sys/net/ipv4/conf/{iface}/forwarding");
    let value = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
    if value.trim() != "1" {
        bail!(
            "IPv4 forwarding is off on {iface}; lb routes through the kernel's tables \
             (bpf_fib_lookup) and needs it: sysctl -w net.ipv4.conf.{iface}.forwarding=1"
        );
    }
    Ok(())
}

/// `iface`'s index in this network namespace.
fn ifindex(iface: &str) -> anyhow::Result<u32> {
    let ifname = CString::new(iface).context("interface name")?;
    // SAFETY: `ifname` is a valid NUL-terminated string.
    let index = unsafe { libc::if_nametoindex(ifname.as_ptr()) };
    if index == 0 {
        bail!("interface {iface:?} does not exist (in this network namespace)");
    }
    Ok(index)
}

fn attach_mode(
    prog: &mut Xdp,
    iface: &str,
    index: u32,
    mode: XdpMode,
) -> anyhow::Result<XdpLinkId> {
    prog.attach(index, mode).map_err(|e| {
        let busy = std::error::Error::source(&e)
            .and_then(|s| s.downcast_ref::<io::Error>())
            .is_some_and(|io| io.raw_os_error() == Some(libc::EBUSY));
        let err = anyhow::Error::new(e).context(format!("attaching XDP ({mode:?} mode) to {iface}"));
        if busy {
            err.context(format!(
                "another XDP program is already attached to {iface} (see `ip link show dev {iface}`)"
            ))
        } else {
            err
        }
    })
}

/// Kernels before 5.11 charge BPF maps to RLIMIT_MEMLOCK; lift it so large maps load there too.
fn raise_memlock_limit() {
    let rlim = libc::rlimit {
        rlim_cur: libc::RLIM_INFINITY,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: plain syscall with a valid pointer.
    if unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &rlim) } != 0 {
        // Harmless on kernels that account BPF memory to the cgroup (5.11+); a later map
        // creation failure says so if it matters.
        tracing::debug!(error = %io::Error::last_os_error(), "could not raise RLIMIT_MEMLOCK");
    }
}
