//! Ready-made sandboxes for end-to-end tests, the demo and the benchmarks: a client, a balancer
//! namespace and N backends running [`crate::servers`], wired one-arm (one L2 segment) or
//! two-arm (client side and backend side).
//!
//! ```text
//! two-arm:  client 10.0.1.2 ── 10.0.1.1 [lb] 10.0.2.1 ── bridge ── backends 10.0.2.10, .11, ...
//! one-arm:  client 10.0.0.2 ── bridge ── 10.0.0.1 [lb];  backends 10.0.0.10, .11, ... on the bridge
//! ```
//! The VIP range 10.100.0.0/24 is routed to the balancer by the client.
//!
//! Dual-stack: the same links carry IPv6 — two-arm 2001:db8:1::/64 (client ::2, lb ::1) and
//! 2001:db8:2::/64 (lb ::1, backends ::10, ::11, ...); one-arm 2001:db8::/64 (client ::2, lb ::1,
//! backends ::10, ...) — with the VIP range 2001:db8:100::/64, and every server listens on both
//! families.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use crate::{
    netns::{Netns, PassProgram, Port, attach_pass_program, veth, veth_maybe_addressed},
    servers::{self, Servers},
};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arms {
    One,
    Two,
}

pub struct BackendHost {
    pub ns: Netns,
    pub addr: Ipv4Addr,
    pub addr6: Ipv6Addr,
    pub name: String,
    /// Its interface (on the backends' bridge).
    pub ifname: String,
}

pub struct Sandbox {
    pub arms: Arms,
    pub client: Port,
    /// The balancer's interfaces (lb attaches to all of them).
    pub lb_ports: Vec<Port>,
    /// The far ends of the balancer's links: the client's end (two-arm) and the bridge port
    /// facing the balancer.
    pub lb_peers: Vec<Port>,
    pub lb: Netns,
    pub backends: Vec<BackendHost>,
    /// The port every backend serves TCP and UDP on.
    pub service_port: u16,
    // Dropped in this order: servers, peer programs, then namespaces (with their links).
    /// Per backend: its echo/UDP, HTTP and HTTPS servers (empty while stopped).
    servers: Vec<Vec<Servers>>,
    /// VIPs the backends hold for direct server return ([`Sandbox::serve_vip`]), each with the
    /// port its HTTP server takes there, if any.
    vips: Vec<(IpAddr, Option<u16>)>,
    /// The client's second leg for direct server return ([`Sandbox::direct_return`]).
    return_leg: Option<Port>,
    _pass: Vec<PassProgram>,
    _switch: Netns,
}

/// Direct server return: the echo/UDP servers (and HTTP, where given) on the VIPs the backend
/// holds.
fn start_vip_servers(
    b: &BackendHost,
    port: u16,
    vips: &[(IpAddr, Option<u16>)],
) -> anyhow::Result<Vec<Servers>> {
    let mut out = Vec::new();
    for &(vip, http) in vips {
        out.push(servers::start(&b.ns, SocketAddr::new(vip, port), &b.name)?);
        if let Some(http) = http {
            out.push(servers::start_http(
                &b.ns,
                SocketAddr::new(vip, http),
                &b.name,
            )?);
        }
    }
    Ok(out)
}

fn start_servers(
    b: &BackendHost,
    port: u16,
    vips: &[(IpAddr, Option<u16>)],
) -> anyhow::Result<Vec<Servers>> {
    let mut out = start_vip_servers(b, port, vips)?;
    for ip in [b.addr.into(), b.addr6.into()] {
        let at = |port| SocketAddr::new(ip, port);
        out.push(servers::start(&b.ns, at(port), &b.name)?);
        out.push(servers::start_http(&b.ns, at(HTTP_PORT), &b.name)?);
        out.push(servers::start_https(&b.ns, at(HTTPS_PORT), &b.name)?);
    }
    Ok(out)
}

pub const VIP: Ipv4Addr = Ipv4Addr::new(10, 100, 0, 1);
/// The IPv6 VIP, in 2001:db8:100::/64, routed to the balancer by the client.
pub const VIP6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0x100, 0, 0, 0, 0, 1);
/// Every backend also serves HTTP here (see [`servers::start_http`]).
pub const HTTP_PORT: u16 = 8000;
/// And HTTPS here, with a self-signed certificate (see [`servers::start_https`]).
pub const HTTPS_PORT: u16 = 8443;

impl Sandbox {
    pub fn build(arms: Arms, backends: usize, service_port: u16) -> anyhow::Result<Self> {
        let client_ns = Netns::new("client")?;
        let lb = Netns::new("lb")?;
        let switch = Netns::new("switch")?;
        switch.ip(&["link", "add", "br0", "type", "bridge"])?;
        switch.ip(&["link", "set", "br0", "up"])?;
        lb.sysctl("net/ipv4/ip_forward", "1")?;
        lb.sysctl("net/ipv6/conf/all/forwarding", "1")?;
        let mut pass = Vec::new();
        let bridge_port = |ns: &Netns, cidr: &str| -> anyhow::Result<(Port, Port)> {
            let (host, sw) = veth_maybe_addressed(ns, Some(cidr), &switch, None)?;
            switch.ip(&["link", "set", &sw.ifname, "master", "br0"])?;
            Ok((host, sw))
        };
        let (client, lb_ports, lb_peers, subnet, subnet6) = match arms {
            Arms::Two => {
                let (client, lb_client_side) = veth(&client_ns, "10.0.1.2/24", &lb, "10.0.1.1/24")?;
                client.add_address("2001:db8:1::2/64")?;
                lb_client_side.add_address("2001:db8:1::1/64")?;
                let (lb_backend_side, sw) = bridge_port(&lb, "10.0.2.1/24")?;
                lb_backend_side.add_address("2001:db8:2::1/64")?;
                // Native XDP on veth delivers XDP_TX / redirected frames only to a peer with a
                // program: the client's end and the bridge port facing lb.
                pass.push(attach_pass_program(&client)?);
                pass.push(attach_pass_program(&sw)?);
                let peers = vec![client.clone(), sw];
                client_ns.ip(&["route", "add", "10.0.2.0/24", "via", "10.0.1.1"])?;
                client_ns.ip(&["route", "add", "10.100.0.0/24", "via", "10.0.1.1"])?;
                client_ns.ip(&["route", "add", "2001:db8:2::/64", "via", "2001:db8:1::1"])?;
                client_ns.ip(&["route", "add", "2001:db8:100::/64", "via", "2001:db8:1::1"])?;
                let sides = vec![lb_client_side, lb_backend_side];
                (client, sides, peers, [10, 0, 2], [0x2001, 0xdb8, 2])
            }
            Arms::One => {
                let (client, _) = bridge_port(&client_ns, "10.0.0.2/24")?;
                client.add_address("2001:db8::2/64")?;
                let (lb_port, sw) = bridge_port(&lb, "10.0.0.1/24")?;
                lb_port.add_address("2001:db8::1/64")?;
                pass.push(attach_pass_program(&sw)?);
                client_ns.ip(&["route", "add", "10.100.0.0/24", "via", "10.0.0.1"])?;
                client_ns.ip(&["route", "add", "2001:db8:100::/64", "via", "2001:db8::1"])?;
                (
                    client,
                    vec![lb_port],
                    vec![sw],
                    [10, 0, 0],
                    [0x2001, 0xdb8, 0],
                )
            }
        };
        let mut hosts = Vec::new();
        let mut servers = Vec::new();
        for i in 0..backends {
            let ns = Netns::new(&format!("b{i}"))?;
            let addr = Ipv4Addr::new(subnet[0], subnet[1], subnet[2], 10 + i as u8);
            let [a, b, c] = subnet6;
            let addr6 = Ipv6Addr::new(a, b, c, 0, 0, 0, 0, 0x10 + i as u16);
            let (port, _) = bridge_port(&ns, &format!("{addr}/24"))?;
            port.add_address(&format!("{addr6}/64"))?;
            if arms == Arms::Two {
                ns.ip(&["route", "add", "default", "via", "10.0.2.1"])?;
                ns.ip(&["-6", "route", "add", "default", "via", "2001:db8:2::1"])?;
            }
            let name = format!("backend-{i}");
            let host = BackendHost {
                ns,
                addr,
                addr6,
                name,
                ifname: port.ifname.clone(),
            };
            servers.push(start_servers(&host, service_port, &[])?);
            hosts.push(host);
        }
        Ok(Self {
            arms,
            client,
            lb_ports,
            lb_peers,
            lb,
            backends: hosts,
            service_port,
            servers,
            vips: Vec::new(),
            return_leg: None,
            _pass: pass,
            _switch: switch,
        })
    }

    /// Direct server return: every backend holds `vip` on `lo` (see [`crate::decap::hold_vip`])
    /// and serves on it what it serves on its own address (TCP echo and UDP on the service
    /// port), plus HTTP on `http_port` if given; stopping and starting a backend includes them.
    pub fn serve_vip(&mut self, vip: IpAddr, http_port: Option<u16>) -> anyhow::Result<()> {
        self.vips.push((vip, http_port));
        for (i, b) in self.backends.iter().enumerate() {
            crate::decap::hold_vip(&b.ns, vip)?;
            let started = start_vip_servers(b, self.service_port, &[(vip, http_port)])?;
            self.servers[i].extend(started);
        }
        Ok(())
    }

    /// Two-arm direct server return: the backends' replies go to the client without lb, over a
    /// second leg of the client on the backends' bridge (10.0.2.200, 2001:db8:2::200), which
    /// the backends route the client's networks through.
    pub fn direct_return(&mut self) -> anyhow::Result<()> {
        if self.arms != Arms::Two {
            anyhow::bail!("one-arm backends reach the client directly already");
        }
        let switch = &self._switch;
        let (leg, sw) = veth_maybe_addressed(&self.client.ns, Some("10.0.2.200/24"), switch, None)?;
        leg.add_address("2001:db8:2::200/64")?;
        switch.ip(&["link", "set", &sw.ifname, "master", "br0"])?;
        // Replies from the VIP arrive on this leg while the VIP is routed the other way.
        for key in ["all", "default", leg.ifname.as_str()] {
            self.client
                .ns
                .sysctl(&format!("net/ipv4/conf/{key}/rp_filter"), "0")?;
        }
        for b in &self.backends {
            b.ns.ip(&["route", "add", "10.0.1.0/24", "via", "10.0.2.200"])?;
            b.ns.ip(&[
                "-6",
                "route",
                "add",
                "2001:db8:1::/64",
                "via",
                "2001:db8:2::200",
            ])?;
        }
        self.return_leg = Some(leg);
        Ok(())
    }

    /// Stops backend `i`'s servers: its ports answer with RST from now on.
    pub fn stop_backend(&mut self, i: usize) {
        self.servers[i].clear();
    }

    /// Starts backend `i`'s servers again.
    pub fn start_backend(&mut self, i: usize) -> anyhow::Result<()> {
        self.servers[i] = start_servers(&self.backends[i], self.service_port, &self.vips)?;
        Ok(())
    }

    /// The balancer's interface names as the items of a TOML array (`"a", "b"`), for
    /// `[lb] interfaces = [...]`.
    pub fn interfaces_toml(&self) -> String {
        let quoted: Vec<String> = self
            .lb_interfaces()
            .iter()
            .map(|i| format!("\"{i}\""))
            .collect();
        quoted.join(", ")
    }

    /// The balancer's interface names, for `[lb] interfaces`.
    pub fn lb_interfaces(&self) -> Vec<String> {
        self.lb_ports.iter().map(|p| p.ifname.clone()).collect()
    }

    /// A config with one TCP and one UDP service on the VIP over all backends, plus `extra`
    /// lines in each service (e.g. weights are set per backend with `weights`).
    pub fn config(&self, vip_port: u16, weights: &[u32], extra: &str) -> String {
        let backends = self.backends_toml(false, weights);
        format!(
            "[lb]\ninterfaces = [{}]\nxdp_mode = \"native\"\n\n{}",
            self.interfaces_toml(),
            self.services_toml(false, vip_port, &backends, extra)
        )
    }

    /// Like [`Sandbox::config`] for IPv6: the TCP and UDP services on [`VIP6`], over the
    /// backends' IPv6 addresses; `dual` adds the IPv4 pair too (services "tcp", "udp"; the IPv6
    /// ones are "tcp6", "udp6").
    pub fn config6(&self, vip_port: u16, weights: &[u32], extra: &str, dual: bool) -> String {
        let mut text = format!(
            "[lb]\ninterfaces = [{}]\nxdp_mode = \"native\"\n\n{}",
            self.interfaces_toml(),
            self.services_toml(true, vip_port, &self.backends_toml(true, weights), extra)
        );
        if dual {
            let v4 = self.backends_toml(false, weights);
            text.push('\n');
            text.push_str(&self.services_toml(false, vip_port, &v4, extra));
        }
        text
    }

    /// The backends as TOML inline tables, of one family.
    pub fn backends_toml(&self, v6: bool, weights: &[u32]) -> String {
        let backends: Vec<String> = self
            .backends
            .iter()
            .enumerate()
            .map(|(i, b)| {
                let w = weights.get(i).copied().unwrap_or(1);
                let ip: std::net::IpAddr = if v6 { b.addr6.into() } else { b.addr.into() };
                let at = SocketAddr::new(ip, self.service_port);
                format!("{{ address = \"{at}\", weight = {w} }}")
            })
            .collect();
        backends.join(", ")
    }

    /// A TCP and a UDP service on the VIP of one family over `backends` (as
    /// [`Sandbox::backends_toml`] gives them), `extra` lines in each.
    pub fn services_toml(&self, v6: bool, vip_port: u16, backends: &str, extra: &str) -> String {
        let (vip, suffix): (std::net::IpAddr, &str) = if v6 {
            (VIP6.into(), "6")
        } else {
            (VIP.into(), "")
        };
        let vip = SocketAddr::new(vip, vip_port);
        format!(
            "[[service]]\nname = \"tcp{suffix}\"\nvip = \"{vip}\"\nprotocol = \"tcp\"\n{extra}\nbackends = [{backends}]\n\n\
             [[service]]\nname = \"udp{suffix}\"\nvip = \"{vip}\"\nprotocol = \"udp\"\n{extra}\nbackends = [{backends}]\n"
        )
    }
}
