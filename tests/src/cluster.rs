//! Several lb hosts behind an ECMP router, in namespaces, for the scale-out tests and the
//! cluster demo. The router runs BIRD (BGP sessions to every host, `merge paths` so its kernel
//! gets one route with a next hop per announcing host, the kernel's L4 multipath hash); each lb
//! host runs BIRD too, exporting what lb puts in its announce table; the backends sit behind the
//! hosts on one bridge and reach the clients through the router (so with direct server return
//! they answer the clients without any lb host).
//!
//! ```text
//!  client 10.1.0.2 ── 10.1.0.1 [router, BIRD AS 65000] 10.2.i.1 ── 10.2.i.2 [lb host i, BIRD AS 65001]
//!                              10.3.0.1 ──┐                                   10.3.0.1i ──┐
//!                                         └──────────── bridge ───────────────────────────┴── backends 10.3.0.101, .102, ...
//! ```
//! The VIP range 10.100.0.0/24 reaches the router only through the hosts' announcements.

use std::{
    net::{IpAddr, Ipv4Addr},
    time::{Duration, Instant},
};

use anyhow::bail;

use crate::{
    bird::{self, Bird},
    netns::{Netns, PassProgram, Port, attach_pass_program, veth, veth_maybe_addressed},
    servers::{self, Servers},
};

/// The lb hosts' announce table (`[lb.announce] table`), which their BIRD learns (docs/bird.conf).
pub const ANNOUNCE_TABLE: u32 = 200;

/// One lb host: its namespace, its links (to the router, to the backends' bridge), its BIRD.
pub struct Host {
    pub ns: Netns,
    /// Its address towards the router (10.2.i.2), the BGP session's.
    pub uplink: Port,
    /// Its address on the backends' bridge (10.3.0.1i): full NAT's source towards backends,
    /// direct server return's outer source.
    pub downlink: Port,
    /// The router's end of its uplink.
    pub router_port: Port,
    pub bird: Option<Bird>,
    pub index: usize,
}

impl Host {
    pub fn uplink_addr(&self) -> Ipv4Addr {
        Ipv4Addr::new(10, 2, self.index as u8, 2)
    }

    pub fn downlink_addr(&self) -> Ipv4Addr {
        Ipv4Addr::new(10, 3, 0, 11 + self.index as u8)
    }

    /// `[lb] interfaces` of lb on this host, as TOML array items.
    pub fn interfaces_toml(&self) -> String {
        format!("\"{}\", \"{}\"", self.uplink.ifname, self.downlink.ifname)
    }
}

pub struct Backend {
    pub ns: Netns,
    pub addr: Ipv4Addr,
    pub ifname: String,
    pub name: String,
}

/// The test bed. Dropped in field order: servers, peers' programs, BIRDs (in the hosts and the
/// router), then the namespaces with their links.
pub struct Cluster {
    /// Per backend: its servers (on its own address and on the VIPs it holds).
    servers: Vec<Vec<Servers>>,
    _pass: Vec<PassProgram>,
    pub router_bird: Bird,
    pub hosts: Vec<Host>,
    pub backends: Vec<Backend>,
    pub client: Netns,
    pub router: Netns,
    pub switch: Netns,
    /// The service port backends serve on (their own address and the VIPs).
    pub port: u16,
    vips: Vec<IpAddr>,
}

impl Cluster {
    /// The router with a client, `hosts` lb hosts running BIRD (lb is started by the test), and
    /// `backends` backends serving TCP echo and UDP on `port`.
    pub fn build(hosts: usize, backends: usize, port: u16) -> anyhow::Result<Self> {
        let router = Netns::new("rt")?;
        let client = Netns::new("cl")?;
        let switch = Netns::new("sw")?;
        router.sysctl("net/ipv4/ip_forward", "1")?;
        // The L4 hash: flows of one client spread over the hosts by their ports.
        router.sysctl("net/ipv4/fib_multipath_hash_policy", "1")?;
        veth(&client, "10.1.0.2/24", &router, "10.1.0.1/24")?;
        client.ip(&["route", "add", "default", "via", "10.1.0.1"])?;
        switch.ip(&["link", "add", "br0", "type", "bridge"])?;
        switch.ip(&["link", "set", "br0", "up"])?;
        let (_, sw) = veth_maybe_addressed(&router, Some("10.3.0.1/24"), &switch, None)?;
        switch.ip(&["link", "set", &sw.ifname, "master", "br0"])?;
        let mut pass = Vec::new();
        let mut cluster_hosts = Vec::new();
        for i in 0..hosts {
            let (host, p) = Self::host(&router, &switch, i)?;
            pass.extend(p);
            cluster_hosts.push(host);
        }
        let mut list = Vec::new();
        let mut all_servers = Vec::new();
        for i in 0..backends {
            let ns = Netns::new(&format!("cb{i}"))?;
            let addr = Ipv4Addr::new(10, 3, 0, 101 + i as u8);
            let (port_b, sw) =
                veth_maybe_addressed(&ns, Some(&format!("{addr}/24")), &switch, None)?;
            switch.ip(&["link", "set", &sw.ifname, "master", "br0"])?;
            // Replies to clients through the router, never through an lb host.
            ns.ip(&["route", "add", "default", "via", "10.3.0.1"])?;
            let name = format!("backend-{i}");
            all_servers.push(vec![servers::start(
                &ns,
                std::net::SocketAddr::new(addr.into(), port),
                &name,
            )?]);
            list.push(Backend {
                ns,
                addr,
                ifname: port_b.ifname,
                name,
            });
        }
        let router_bird = Bird::start(&router, &router_config(hosts))?;
        let mut cluster = Self {
            servers: all_servers,
            _pass: pass,
            router_bird,
            hosts: cluster_hosts,
            backends: list,
            client,
            router,
            switch,
            port,
            vips: Vec::new(),
        };
        for i in 0..hosts {
            cluster.start_bird(i)?;
        }
        Ok(cluster)
    }

    /// Lb host `i`: its namespace and links, forwarding on, a default route via the router.
    fn host(router: &Netns, switch: &Netns, i: usize) -> anyhow::Result<(Host, Vec<PassProgram>)> {
        let ns = Netns::new(&format!("h{i}"))?;
        ns.sysctl("net/ipv4/ip_forward", "1")?;
        let (uplink, router_port) = veth(
            &ns,
            &format!("10.2.{i}.2/24"),
            router,
            &format!("10.2.{i}.1/24"),
        )?;
        let (downlink, sw) =
            veth_maybe_addressed(&ns, Some(&format!("10.3.0.{}/24", 11 + i)), switch, None)?;
        switch.ip(&["link", "set", &sw.ifname, "master", "br0"])?;
        ns.ip(&["route", "add", "default", "via", &format!("10.2.{i}.1")])?;
        // Native XDP on a veth delivers redirected / XDP_TX frames only to a peer with a program.
        let pass = vec![
            attach_pass_program(&router_port)?,
            attach_pass_program(&sw)?,
        ];
        Ok((
            Host {
                ns,
                uplink,
                downlink,
                router_port,
                bird: None,
                index: i,
            },
            pass,
        ))
    }

    /// (Re)starts host `i`'s BIRD.
    pub fn start_bird(&mut self, i: usize) -> anyhow::Result<()> {
        let host = &mut self.hosts[i];
        host.bird = None;
        let config = bird::host_config(&format!("10.2.{i}.2"), &format!("10.2.{i}.1"))?;
        host.bird = Some(Bird::start(&host.ns, &config)?);
        Ok(())
    }

    /// Every backend holds `vip` on `lo`, runs `lb decap` (kept by the caller) and serves on the
    /// VIP too: direct server return.
    pub fn serve_vip(&mut self, vip: IpAddr) -> anyhow::Result<Vec<crate::decap::DecapGuard>> {
        self.vips.push(vip);
        let mut guards = Vec::new();
        for (i, b) in self.backends.iter().enumerate() {
            crate::decap::hold_vip(&b.ns, vip)?;
            self.servers[i].push(servers::start(
                &b.ns,
                std::net::SocketAddr::new(vip, self.port),
                &b.name,
            )?);
            guards.push(crate::decap::DecapGuard::start(&b.ns, &[&b.ifname], &[])?);
        }
        Ok(guards)
    }

    /// Stops backend `i`'s servers (its ports refuse from now on).
    pub fn stop_backend(&mut self, i: usize) {
        self.servers[i].clear();
    }

    /// The next hops the router's kernel has for `vip` (its hosts' uplink addresses).
    pub fn nexthops(&self, vip: Ipv4Addr) -> anyhow::Result<Vec<Ipv4Addr>> {
        let out = self.router.ip(&["route", "show", &format!("{vip}/32")])?;
        Ok(out
            .split_whitespace()
            .collect::<Vec<_>>()
            .windows(2)
            .filter(|w| w[0] == "via")
            .filter_map(|w| w[1].parse().ok())
            .collect())
    }

    /// Waits until the router's route to `vip` has exactly the uplinks of `hosts`; the time it
    /// took.
    pub fn wait_nexthops(
        &self,
        vip: Ipv4Addr,
        hosts: &[usize],
        limit: Duration,
    ) -> anyhow::Result<Duration> {
        let mut want: Vec<Ipv4Addr> = hosts.iter().map(|&i| self.hosts[i].uplink_addr()).collect();
        want.sort();
        let start = Instant::now();
        loop {
            let mut got = self.nexthops(vip)?;
            got.sort();
            if got == want {
                return Ok(start.elapsed());
            }
            if start.elapsed() > limit {
                bail!(
                    "the router's next hops for {vip}: {got:?} after {limit:?}, want {want:?}\n{}",
                    self.router_bird
                        .birdc(&["show", "route", "all"])
                        .unwrap_or_default()
                );
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// Host `i` dies: its link to the router goes down (on the router's side, as a cut cable
    /// or a dead host looks to it).
    pub fn cut_host(&self, i: usize) -> anyhow::Result<()> {
        self.router
            .ip(&["link", "set", &self.hosts[i].router_port.ifname, "down"])?;
        Ok(())
    }

    /// Host `i`'s link comes back.
    pub fn restore_host(&self, i: usize) -> anyhow::Result<()> {
        self.router
            .ip(&["link", "set", &self.hosts[i].router_port.ifname, "up"])?;
        Ok(())
    }
}

/// The router's BIRD: a BGP session to each host (AS 65011, as docs/bird.conf has them) with
/// BFD and the same short timers, everything learned exported to the kernel with `merge paths`
/// (one multipath route per VIP, a next hop per announcing host).
fn router_config(hosts: usize) -> String {
    let mut c = "router id 10.1.0.1;\n\
         protocol device { }\n\
         protocol bfd { interface \"*\" { interval 100 ms; multiplier 3; }; }\n\
         protocol kernel { ipv4 { import none; export all; }; merge paths on; }\n\
         template bgp lbhost { local as 65000; hold time 3; keepalive time 1; \
         connect delay time 1; connect retry time 1; bfd on; \
         ipv4 { import all; export none; }; }\n"
        .to_owned();
    for i in 0..hosts {
        c.push_str(&format!(
            "protocol bgp host{i} from lbhost {{ neighbor 10.2.{i}.2 as 65011; }}\n"
        ));
    }
    c
}
