//! A fixed little network for BPF_PROG_TEST_RUN: the program runs in a namespace whose routes
//! and permanent neighbours make every route lookup deterministic. Shared by the fixture tests
//! and the benchmark.
//!
//! ```text
//!  client 10.0.1.2 ─ vc 10.0.1.1 [lb] vb 10.0.2.1 ─ backends 10.0.2.2, 10.0.2.3, ...
//!  one-arm backend 10.0.1.20 on the client side
//! ```
//!
//! Dual-stack: the same links carry 2001:db8:1::/64 (client 2001:db8:1::2, vc 2001:db8:1::1,
//! one-arm backend 2001:db8:1::20) and 2001:db8:2::/64 (vb 2001:db8:2::1, backends
//! 2001:db8:2::2, ...), with the same MACs.

use std::net::{IpAddr, Ipv4Addr};

use lb::{
    balancer::Balancer,
    config,
    dataplane::{self, Dataplane},
};
use lb_common::{FlowKey, FlowKey6, Params, addr6, snat_port_candidate};

use crate::{
    fixture::{Fixture, run_fixtures},
    netns::{Netns, veth},
};

pub const BACKEND_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0xb2];
pub const ONE_ARM_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x20];
/// Backends 10.0.2.2 ..= 10.0.2.(1 + BACKENDS) have permanent neighbour entries.
pub const BACKENDS: u8 = 8;

/// The MAC of backend `i` (10.0.2.(i + 2), 2001:db8:2::(i + 2)): [`BACKEND_MAC`] for the first,
/// 02:00:00:00:01:<i> for the others.
pub fn backend_mac(i: u8) -> [u8; 6] {
    if i == 0 {
        BACKEND_MAC
    } else {
        [2, 0, 0, 0, 1, i]
    }
}

pub struct TestNet {
    pub ns: Netns,
    _peer: Netns,
    pub dp: Dataplane,
    pub balancer: Balancer,
    pub params: Params,
    /// Client-side and backend-side interface indexes and MACs of the balancer.
    pub vc: u32,
    pub vb: u32,
    pub vc_mac: [u8; 6],
    pub vb_mac: [u8; 6],
    /// Their names.
    pub vc_name: String,
    pub vb_name: String,
}

impl TestNet {
    /// Loads the datapath with `[lb]` extra lines `lb_extra` and the given services (TOML), with
    /// `interfaces` filled in.
    pub fn new(lb_extra: &str, services: &str) -> anyhow::Result<Self> {
        let ns = Netns::new("fx")?;
        let peer = Netns::new("fxpeer")?;
        let (vc, pc) = veth(&ns, "10.0.1.1/24", &peer, "10.0.1.254/24")?;
        let (vb, pb) = veth(&ns, "10.0.2.1/24", &peer, "10.0.2.254/24")?;
        vc.add_address("2001:db8:1::1/64")?;
        vb.add_address("2001:db8:2::1/64")?;
        pc.add_address("2001:db8:1::fe/64")?;
        pb.add_address("2001:db8:2::fe/64")?;
        let mut neighbours = vec![
            (
                "10.0.1.2".to_owned(),
                "02:00:00:00:00:01".to_owned(),
                &vc.ifname,
            ),
            (
                "10.0.1.20".to_owned(),
                "02:00:00:00:00:20".to_owned(),
                &vc.ifname,
            ),
            (
                "2001:db8:1::2".to_owned(),
                "02:00:00:00:00:01".to_owned(),
                &vc.ifname,
            ),
            (
                "2001:db8:1::20".to_owned(),
                "02:00:00:00:00:20".to_owned(),
                &vc.ifname,
            ),
        ];
        for i in 0..BACKENDS {
            let m = backend_mac(i);
            let mac = format!(
                "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
                m[0], m[1], m[2], m[3], m[4], m[5]
            );
            neighbours.push((format!("10.0.2.{}", i + 2), mac.clone(), &vb.ifname));
            neighbours.push((format!("2001:db8:2::{:x}", i + 2), mac, &vb.ifname));
        }
        for (ip, mac, dev) in &neighbours {
            ns.ip(&[
                "neigh",
                "replace",
                ip,
                "lladdr",
                mac,
                "dev",
                dev,
                "nud",
                "permanent",
            ])?;
        }
        ns.sysctl("net/ipv4/ip_forward", "1")?;
        ns.sysctl("net/ipv6/conf/all/forwarding", "1")?;
        let text = format!(
            "[lb]\ninterfaces = [\"{}\", \"{}\"]\n{lb_extra}\n{services}",
            vc.ifname, vb.ifname
        );
        let config = config::parse(&text).map_err(|e| anyhow::anyhow!("test config: {e}"))?;
        let (dp, balancer) = ns.enter(|| -> anyhow::Result<_> {
            let (mut dp, b) = lb::daemon::prepare(&config)?;
            // Redirect targets only, not attached: frames come from BPF_PROG_TEST_RUN alone
            // (an attached program would also count the peers' IPv6 neighbour discovery).
            for iface in &config.lb.interfaces {
                dp.add_redirect_target(iface)?;
            }
            Ok((dp, b))
        })?;
        Ok(Self {
            params: dataplane::params(&config.lb),
            vc: ns.ifindex(&vc.ifname)?,
            vb: ns.ifindex(&vb.ifname)?,
            vc_mac: ns.mac(&vc.ifname)?,
            vb_mac: ns.mac(&vb.ifname)?,
            vc_name: vc.ifname.clone(),
            vb_name: vb.ifname.clone(),
            ns,
            _peer: peer,
            dp,
            balancer,
        })
    }

    /// Attaches the balancer and the pass program (native XDP) to the two ends of a veth pair of
    /// their own in the namespace, so that a benchmark runs both as the kernel runs attached
    /// programs (through its XDP dispatcher, a direct call; unattached, an indirect call, which
    /// retpoline-style mitigations slow). The pair carries no traffic: no addresses, IPv6 off
    /// (no neighbour discovery). Both are detached with the namespace.
    pub fn attach_idle(&mut self) -> anyhow::Result<()> {
        let off = "net/ipv6/conf/default/disable_ipv6";
        self.ns.sysctl(off, "1")?;
        let pair = crate::netns::veth_maybe_addressed(&self.ns, None, &self.ns, None);
        self.ns.sysctl(off, "0")?;
        let (a, b) = pair?;
        let dp = &mut self.dp;
        self.ns.enter(|| -> anyhow::Result<()> {
            dp.attach(&a.ifname, config::XdpMode::Native)?;
            dp.attach_pass_program(&b.ifname)
        })
    }

    /// Runs fixtures inside the namespace (route lookups happen there).
    pub fn run(&self, fixtures: &[Fixture]) {
        self.ns.enter(|| run_fixtures(&self.dp, fixtures));
    }

    /// A TCP segment `backend` → `snat` (ADDR:PORT each) with `flags`, arriving on the backend
    /// side: the reply of a flow, forwarded to its client (any output) and counted as a reply.
    pub fn from_backend(&self, desc: &str, backend: &str, snat: &str, flags: u8) -> Fixture {
        use crate::{fixture::XDP_REDIRECT, packet::Packet};
        Fixture::new(
            desc,
            Packet::tcp(backend, snat, flags)
                .macs(BACKEND_MAC, self.vb_mac)
                .build(),
            XDP_REDIRECT,
            lb_common::counter::FWD_REDIRECT,
        )
        .ingress(self.vb)
        .any_output()
        .also(lb_common::counter::REPLY)
    }

    /// The SNAT port the datapath tries first for a client flow.
    pub fn snat_port(&self, client: &str, cport: u16, vip: &str, vport: u16, proto: u8) -> u16 {
        snat_port_candidate(flow_hash(client, cport, vip, vport, proto), 0, &self.params)
    }
}

/// The datapath's hash of the flow `client:cport → vip:vport` (either family).
pub fn flow_hash(client: &str, cport: u16, vip: &str, vport: u16, proto: u8) -> u64 {
    let (c, v) = (cport.to_be(), vport.to_be());
    match (client.parse::<IpAddr>(), vip.parse::<IpAddr>()) {
        (Ok(IpAddr::V6(a)), Ok(IpAddr::V6(b))) => {
            FlowKey6::new(addr6(a.octets()), addr6(b.octets()), c, v, proto).hash()
        }
        _ => FlowKey::new(ne(client), ne(vip), c, v, proto).hash(),
    }
}

/// An IPv4 address as the datapath stores it (network byte order in a u32).
pub fn ne(ip: &str) -> u32 {
    u32::from_ne_bytes(ip.parse::<Ipv4Addr>().expect("IPv4 address").octets())
}
