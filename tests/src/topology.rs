//! Ready-made sandboxes for end-to-end tests, the demo and the benchmarks: a client, a balancer
//! namespace and N backends running [`crate::servers`], wired one-arm (one L2 segment) or
//! two-arm (client side and backend side).
//!
//! ```text
//! two-arm:  client 10.0.1.2 ── 10.0.1.1 [lb] 10.0.2.1 ── bridge ── backends 10.0.2.10, .11, ...
//! one-arm:  client 10.0.0.2 ── bridge ── 10.0.0.1 [lb];  backends 10.0.0.10, .11, ... on the bridge
//! ```
//! The VIP range 10.100.0.0/24 is routed to the balancer by the client.

use std::net::{Ipv4Addr, SocketAddr};

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
    pub name: String,
}

pub struct Sandbox {
    pub arms: Arms,
    pub client: Port,
    /// The balancer's interfaces (lb attaches to all of them).
    pub lb_ports: Vec<Port>,
    pub lb: Netns,
    pub backends: Vec<BackendHost>,
    /// The port every backend serves TCP and UDP on.
    pub service_port: u16,
    // Dropped in this order: servers, peer programs, then namespaces (with their links).
    /// Per backend: its echo/UDP, HTTP and HTTPS servers (empty while stopped).
    servers: Vec<Vec<Servers>>,
    _pass: Vec<PassProgram>,
    _switch: Netns,
}

fn start_servers(
    ns: &Netns,
    addr: Ipv4Addr,
    port: u16,
    name: &str,
) -> anyhow::Result<Vec<Servers>> {
    Ok(vec![
        servers::start(ns, SocketAddr::from((addr, port)), name)?,
        servers::start_http(ns, SocketAddr::from((addr, HTTP_PORT)), name)?,
        servers::start_https(ns, SocketAddr::from((addr, HTTPS_PORT)), name)?,
    ])
}

pub const VIP: Ipv4Addr = Ipv4Addr::new(10, 100, 0, 1);
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
        let mut pass = Vec::new();
        let bridge_port = |ns: &Netns, cidr: &str| -> anyhow::Result<(Port, Port)> {
            let (host, sw) = veth_maybe_addressed(ns, Some(cidr), &switch, None)?;
            switch.ip(&["link", "set", &sw.ifname, "master", "br0"])?;
            Ok((host, sw))
        };
        let (client, lb_ports, subnet) = match arms {
            Arms::Two => {
                let (client, lb_client_side) = veth(&client_ns, "10.0.1.2/24", &lb, "10.0.1.1/24")?;
                let (lb_backend_side, sw) = bridge_port(&lb, "10.0.2.1/24")?;
                // Native XDP on veth delivers XDP_TX / redirected frames only to a peer with a
                // program: the client's end and the bridge port facing lb.
                pass.push(attach_pass_program(&client)?);
                pass.push(attach_pass_program(&sw)?);
                client_ns.ip(&["route", "add", "10.0.2.0/24", "via", "10.0.1.1"])?;
                client_ns.ip(&["route", "add", "10.100.0.0/24", "via", "10.0.1.1"])?;
                (client, vec![lb_client_side, lb_backend_side], [10, 0, 2])
            }
            Arms::One => {
                let (client, _) = bridge_port(&client_ns, "10.0.0.2/24")?;
                let (lb_port, sw) = bridge_port(&lb, "10.0.0.1/24")?;
                pass.push(attach_pass_program(&sw)?);
                client_ns.ip(&["route", "add", "10.100.0.0/24", "via", "10.0.0.1"])?;
                (client, vec![lb_port], [10, 0, 0])
            }
        };
        let mut hosts = Vec::new();
        let mut servers = Vec::new();
        for i in 0..backends {
            let ns = Netns::new(&format!("b{i}"))?;
            let addr = Ipv4Addr::new(subnet[0], subnet[1], subnet[2], 10 + i as u8);
            bridge_port(&ns, &format!("{addr}/24"))?;
            if arms == Arms::Two {
                ns.ip(&["route", "add", "default", "via", "10.0.2.1"])?;
            }
            let name = format!("backend-{i}");
            servers.push(start_servers(&ns, addr, service_port, &name)?);
            hosts.push(BackendHost { ns, addr, name });
        }
        Ok(Self {
            arms,
            client,
            lb_ports,
            lb,
            backends: hosts,
            service_port,
            servers,
            _pass: pass,
            _switch: switch,
        })
    }

    /// Stops backend `i`'s servers: its ports answer with RST from now on.
    pub fn stop_backend(&mut self, i: usize) {
        self.servers[i].clear();
    }

    /// Starts backend `i`'s servers again.
    pub fn start_backend(&mut self, i: usize) -> anyhow::Result<()> {
        let b = &self.backends[i];
        self.servers[i] = start_servers(&b.ns, b.addr, self.service_port, &b.name)?;
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
        let backends: Vec<String> = self
            .backends
            .iter()
            .enumerate()
            .map(|(i, b)| {
                let w = weights.get(i).copied().unwrap_or(1);
                format!(
                    "{{ address = \"{}:{}\", weight = {w} }}",
                    b.addr, self.service_port
                )
            })
            .collect();
        format!(
            "[lb]\ninterfaces = [{}]\nxdp_mode = \"native\"\n\n\
             [[service]]\nname = \"tcp\"\nvip = \"{VIP}:{vip_port}\"\nprotocol = \"tcp\"\n{extra}\nbackends = [{}]\n\n\
             [[service]]\nname = \"udp\"\nvip = \"{VIP}:{vip_port}\"\nprotocol = \"udp\"\n{extra}\nbackends = [{}]\n",
            self.interfaces_toml(),
            backends.join(", "),
            backends.join(", ")
        )
    }
}
