//! The XDP program and its maps: load (sized from the config), attach, write, read counters.
//! Everything that touches the kernel's BPF objects lives here.

mod stats;

use std::{ffi::CString, io, net::Ipv4Addr};

use anyhow::{Context as _, anyhow, bail};
use aya::{
    Ebpf, EbpfLoader, Pod,
    maps::{Array, DevMapHash, HashMap as BpfHashMap, MapData},
    programs::{Xdp, XdpMode, xdp::XdpLinkId},
};
use lb_common::{
    BackendInfo, CtSlot, FlowKey, NatSlot, PARAMS_GLOBAL, PASS_PROGRAM_NAME, PROGRAM_NAME, Params,
    ServiceInfo, ServiceKey, flow_hash, map_name, ways,
};
use tracing::{info, warn};

use crate::{balancer::MapWriter, config};
pub use stats::{Stats, TrafficCounters};

/// The XDP object built by build.rs (empty when built with LB_EBPF_STUB=1).
pub fn object() -> &'static [u8] {
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/lb-xdp"))
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
    }
}

/// The loaded program and maps, and the interfaces it is attached to. Dropping it detaches the
/// program from every interface and frees the maps.
pub struct Dataplane {
    ebpf: Ebpf,
    attached: Vec<(String, XdpLinkId)>,
    ring_size: u32,
    params: Params,
    services: u32,
    backends: u32,
}

impl Dataplane {
    /// Loads the object with maps sized for `lb`, and verifies both programs; attaches nothing.
    pub fn load(lb: &config::Lb) -> anyhow::Result<Self> {
        let object = object();
        if object.is_empty() {
            bail!(
                "this lb was built with LB_EBPF_STUB=1 and has no XDP program: rebuild it with `cargo xtask build`"
            );
        }
        raise_memlock_limit();
        let params = params(lb);
        let ring_entries = lb.max_services * lb.ring_size;
        let mut ebpf = EbpfLoader::new()
            .override_global(PARAMS_GLOBAL, &params, true)
            .map_max_entries(map_name::SERVICES, lb.max_services)
            .map_max_entries(map_name::SERVICE_STATS, lb.max_services)
            .map_max_entries(map_name::RINGS, ring_entries)
            .map_max_entries(map_name::BACKENDS, lb.max_backends)
            .map_max_entries(map_name::BACKEND_STATS, lb.max_backends)
            .map_max_entries(map_name::NEXTHOPS, lb.max_backends)
            .map_max_entries(map_name::CONNTRACK, lb.conntrack.size)
            .map_max_entries(map_name::NAT, 2 * lb.conntrack.size)
            .load(object)
            .context("loading the XDP object")?;
        for name in [PROGRAM_NAME, PASS_PROGRAM_NAME] {
            let prog: &mut Xdp = ebpf
                .program_mut(name)
                .ok_or_else(|| anyhow!("program {name} missing from the XDP object"))?
                .try_into()?;
            prog.load()
                .with_context(|| format!("the kernel rejected XDP program {name}"))?;
        }
        Ok(Self {
            ebpf,
            attached: Vec::new(),
            ring_size: lb.ring_size,
            params,
            services: 0,
            backends: 0,
        })
    }

    pub fn program(&self) -> &Xdp {
        self.named_program(PROGRAM_NAME)
    }

    /// The program that only passes: benchmark baseline and veth peer program.
    pub fn pass_program(&self) -> &Xdp {
        self.named_program(PASS_PROGRAM_NAME)
    }

    fn named_program(&self, name: &str) -> &Xdp {
        self.ebpf
            .program(name)
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
        let ifname = CString::new(iface).context("interface name")?;
        // SAFETY: `ifname` is a valid NUL-terminated string.
        let index = unsafe { libc::if_nametoindex(ifname.as_ptr()) };
        if index == 0 {
            bail!("interface {iface:?} does not exist (in this network namespace)");
        }
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
    pub fn attach(&mut self, iface: &str, mode: config::XdpMode) -> anyhow::Result<XdpMode> {
        let index = self.add_redirect_target(iface)?;
        let prog: &mut Xdp = self
            .ebpf
            .program_mut(PROGRAM_NAME)
            .expect("verified in load()")
            .try_into()?;
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
        info!(%iface, mode = ?used, "XDP program attached");
        self.attached.push((iface.to_owned(), id));
        Ok(used)
    }

    /// Detaches from every interface (also done on drop).
    pub fn detach_all(&mut self) {
        let prog: &mut Xdp = self
            .ebpf
            .program_mut(PROGRAM_NAME)
            .expect("verified in load()")
            .try_into()
            .expect("verified in load()");
        for (iface, id) in self.attached.drain(..) {
            match prog.detach(id) {
                Ok(()) => info!(%iface, "XDP program detached"),
                Err(e) => warn!(%iface, error = %e, "detaching the XDP program failed"),
            }
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
        let nat_key = FlowKey {
            src: backend.addr,
            dst: backend.snat_addr,
            sport: backend.port,
            dport: slot.entry.snat_port,
            proto: client.proto,
            _pad: [0; 3],
        };
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

    fn array<V: Pod>(&mut self, name: &str) -> anyhow::Result<Array<&mut MapData, V>> {
        Ok(Array::try_from(
            self.ebpf
                .map_mut(name)
                .with_context(|| format!("map {name} missing"))?,
        )?)
    }
}

impl MapWriter for Dataplane {
    fn set_addr(&mut self, addr: Ipv4Addr, flags: u32) -> anyhow::Result<()> {
        let key = u32::from_ne_bytes(addr.octets());
        self.hash_map::<u32, u32>(map_name::ADDRS)?
            .insert(&key, &flags, 0)
            .with_context(|| format!("writing address {addr}"))
    }

    fn set_service(&mut self, key: ServiceKey, info: ServiceInfo) -> anyhow::Result<()> {
        self.hash_map::<ServiceKey, ServiceInfo>(map_name::SERVICES)?
            .insert(&key, &info, 0)
            .context("writing the service map")
    }

    fn set_backend(&mut self, id: u32, info: BackendInfo) -> anyhow::Result<()> {
        self.array::<BackendInfo>(map_name::BACKENDS)?
            .set(id, &info, 0)
            .with_context(|| format!("writing backend {id}"))
    }

    fn set_ring_slots(&mut self, service_id: u32, slots: &[(u32, u32)]) -> anyhow::Result<()> {
        let base = service_id * self.ring_size;
        let mut rings = self.array::<u32>(map_name::RINGS)?;
        for &(slot, id) in slots {
            rings
                .set(base + slot, &id, 0)
                .with_context(|| format!("writing ring slot {slot} of service {service_id}"))?;
        }
        Ok(())
    }

    fn remove_addr(&mut self, addr: Ipv4Addr) -> anyhow::Result<()> {
        let key = u32::from_ne_bytes(addr.octets());
        match self.hash_map::<u32, u32>(map_name::ADDRS)?.remove(&key) {
            Ok(()) | Err(aya::maps::MapError::KeyNotFound) => Ok(()),
            Err(e) => Err(anyhow::Error::new(e).context(format!("removing address {addr}"))),
        }
    }

    fn remove_service(&mut self, key: ServiceKey) -> anyhow::Result<()> {
        match self
            .hash_map::<ServiceKey, ServiceInfo>(map_name::SERVICES)?
            .remove(&key)
        {
            Ok(()) | Err(aya::maps::MapError::KeyNotFound) => Ok(()),
            Err(e) => Err(anyhow::Error::new(e).context("removing a service")),
        }
    }
}

/// The slot (index, content) holding `key` in a 2-way table, like the datapath's lookup.
fn find_slot<T: Pod>(
    table: &mut Array<&mut MapData, T>,
    key: &FlowKey,
    mask: u32,
    key_of: impl Fn(&T) -> FlowKey,
) -> anyhow::Result<Option<(u32, T)>> {
    let hash = flow_hash(key.src, key.dst, key.sport, key.dport, key.proto);
    let (a, b) = ways(hash, mask);
    for i in [a, b] {
        let slot = table.get(&i, 0).context("reading a table slot")?;
        if key_of(&slot) == *key {
            return Ok(Some((i, slot)));
        }
    }
    Ok(None)
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
