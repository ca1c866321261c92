//! End to end (part 3): one two-arm sandbox, one backend running nginx (a small file) and an
//! iperf3 server; the client reaches it directly (routed by the balancer namespace's kernel) or
//! through a VIP of lb, nftables DNAT, HAProxy or nginx stream, all in the balancer namespace.
//! Rounds of (direct, lb, nft, haproxy, nginx), each running every test, so slow drift of the
//! machine hits all alike; medians over rounds. Then CPU rounds of [`CPU_TESTS`] measure the
//! balancer's own CPU (see [`crate::bench::cpu`]): its interfaces' threaded NAPI polls and its
//! processes; threaded NAPI changes the throughput, so those rounds are apart.
//!
//! ```text
//!  client 10.0.1.2 ── 10.0.1.1 [lb ns] 10.0.2.1 ── bridge ── backend 10.0.2.10
//!                      VIPs: lb 10.100.0.1 (XDP), nft 10.100.0.2 (DNAT+SNAT),
//!                            HAProxy 10.100.0.3, nginx 10.100.0.4 (local addresses)
//! ```
//! One backend: iperf3 needs its control and data connections on the same server, and "direct"
//! can only name one; every path then ends at the same server.

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt::Write as _,
    net::{Ipv4Addr, SocketAddr},
    time::Duration,
};

use anyhow::Context as _;

use crate::{
    bench::{
        checkpoint,
        cpu::{Meter, Spent, Threaded, XdpStats},
        median, min_max,
        peers::{self, HTTP_PORT, IPERF_PORT, VIP_HTTP_PORT},
        sleep,
    },
    daemon::{Daemon, TempDir},
    inproc::wait_for_neighbours,
    netns::{Netns, Process},
    topology::{Arms, Sandbox},
};

/// The port the sandbox's own servers (echo) use; health detection checks it.
pub const SERVICE_PORT: u16 = 7000;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Target {
    Direct,
    Lb,
    /// lb with its SYN proxy on for both services (issue 39: ≥ 0.9× lb's throughput).
    LbProxy,
    Nft,
    Haproxy,
    Nginx,
}

impl Target {
    pub const ALL: [Target; 6] = [
        Target::Direct,
        Target::Lb,
        Target::LbProxy,
        Target::Nft,
        Target::Haproxy,
        Target::Nginx,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Target::Direct => "direct",
            Target::Lb => "lb",
            Target::LbProxy => "lb, SYN proxy",
            Target::Nft => "nft DNAT",
            Target::Haproxy => "HAProxy",
            Target::Nginx => "nginx stream",
        }
    }

    pub fn vip(self) -> Option<Ipv4Addr> {
        match self {
            Target::Direct => None,
            // The same VIP and service as lb's, the proxy on: one daemon runs at a time.
            Target::Lb | Target::LbProxy => Some(Ipv4Addr::new(10, 100, 0, 1)),
            Target::Nft => Some(Ipv4Addr::new(10, 100, 0, 2)),
            Target::Haproxy => Some(Ipv4Addr::new(10, 100, 0, 3)),
            Target::Nginx => Some(Ipv4Addr::new(10, 100, 0, 4)),
        }
    }

    /// The balancer's processes on this path (by command name), whose CPU counts as its own.
    pub fn processes(self) -> &'static [&'static str] {
        match self {
            Target::Direct | Target::Nft => &[],
            Target::Lb | Target::LbProxy => &["lb"],
            Target::Haproxy => &["haproxy"],
            Target::Nginx => &["nginx"],
        }
    }

    /// The tests this path runs.
    pub fn tests(self) -> &'static [Test] {
        &Test::ALL
    }

    /// Paths that run `test`, in round order.
    pub fn running(test: Test) -> Vec<Target> {
        Target::ALL
            .into_iter()
            .filter(|t| t.tests().contains(&test))
            .collect()
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Test {
    Tcp1,
    Tcp4,
    KeepAlive,
    Close,
}

impl Test {
    pub const ALL: [Test; 4] = [Test::Tcp1, Test::Tcp4, Test::KeepAlive, Test::Close];

    pub fn name(self) -> &'static str {
        match self {
            Test::Tcp1 => "iperf3, 1 stream",
            Test::Tcp4 => "iperf3, 4 streams",
            Test::KeepAlive => "wrk, keep-alive",
            Test::Close => "wrk, Connection: close",
        }
    }

    pub fn unit(self) -> &'static str {
        match self {
            Test::Tcp1 | Test::Tcp4 => "Gbit/s",
            Test::KeepAlive | Test::Close => "requests/s",
        }
    }

    /// The unit of work the balancer's CPU is divided by.
    pub fn work_unit(self) -> &'static str {
        match self {
            Test::Tcp1 | Test::Tcp4 => "Gbit",
            Test::KeepAlive => "1,000 requests",
            Test::Close => "1,000 connections",
        }
    }
}

/// The tests of the CPU rounds: per Gbit and per 1,000 connections.
pub const CPU_TESTS: [Test; 3] = [Test::Tcp1, Test::Tcp4, Test::Close];

/// The balancer's CPU during one test and the work moved.
#[derive(Clone, Copy, Debug)]
pub struct CpuSample {
    pub spent: Spent,
    /// Seconds in lb's XDP program (kernel BPF statistics; lb's turns only).
    pub xdp: Option<f64>,
    /// Gbit received, or thousands of requests (one connection each with `Connection: close`).
    pub work: f64,
}

impl CpuSample {
    /// Milliseconds of CPU per unit of work ([`Test::work_unit`]).
    pub fn ms_per_unit(&self) -> f64 {
        1e3 * self.spent.total() / self.work
    }
}

/// The sandbox with its backend's servers and the proxies, shared by the end-to-end and the
/// health-detection benchmarks. Dropped in field order: processes first, then the namespaces.
pub struct Bed {
    _procs: Vec<Process>,
    pub sb: Sandbox,
    pub dir: TempDir,
}

impl Bed {
    pub fn backend(&self) -> Ipv4Addr {
        self.sb.backends[0].addr
    }

    /// Builds the sandbox and starts nginx and iperf3 on the backend, and HAProxy and nginx stream
    /// on their VIPs. Call from the main thread (see [`crate::bench::spawn_server`]).
    pub fn build() -> anyhow::Result<Self> {
        let dir = TempDir::new()?;
        let sb = Sandbox::build(Arms::Two, 1, SERVICE_PORT)?;
        let backend = sb.backends[0].addr;
        let mut procs = vec![
            peers::backend_http(&sb.backends[0].ns, &dir.0, backend)?,
            peers::backend_iperf(&sb.backends[0].ns, &dir.0, backend)?,
        ];
        for t in [Target::Haproxy, Target::Nginx] {
            let vip = t.vip().expect("a VIP");
            sb.lb
                .ip(&["addr", "add", &format!("{vip}/32"), "dev", "lo"])?;
        }
        let hvip = Target::Haproxy.vip().expect("a VIP");
        let h = peers::haproxy(
            &sb.lb,
            &dir.0,
            "haproxy",
            &[
                (
                    "iperf",
                    SocketAddr::from((hvip, IPERF_PORT)),
                    SocketAddr::from((backend, IPERF_PORT)),
                    "",
                ),
                (
                    "http",
                    SocketAddr::from((hvip, VIP_HTTP_PORT)),
                    SocketAddr::from((backend, HTTP_PORT)),
                    "",
                ),
            ],
        )?;
        procs.push(h.process);
        procs.push(peers::nginx_stream(
            &sb.lb,
            &dir.0,
            Target::Nginx.vip().expect("a VIP"),
            backend,
        )?);
        Ok(Self {
            _procs: procs,
            sb,
            dir,
        })
    }
}

/// lb's config for the end-to-end runs: the iperf3 and HTTP services on its VIP; `lb_extra`
/// lines in `[lb]`, `service_extra` in each service.
fn lb_config(bed: &Bed, lb_extra: &str, service_extra: &str) -> String {
    let vip = Target::Lb.vip().expect("a VIP");
    let b = bed.backend();
    format!(
        "[lb]\ninterfaces = [{}]\nxdp_mode = \"native\"\n{lb_extra}\n\n\
         [[service]]\nname = \"iperf\"\nvip = \"{vip}:{IPERF_PORT}\"\n{service_extra}\nbackends = [{{ address = \"{b}:{IPERF_PORT}\" }}]\n\n\
         [[service]]\nname = \"http\"\nvip = \"{vip}:{VIP_HTTP_PORT}\"\n{service_extra}\nbackends = [{{ address = \"{b}:{HTTP_PORT}\" }}]\n",
        bed.sb.interfaces_toml()
    )
}

/// nftables full NAT for the nft VIP (DNAT to the backend, SNAT to the balancer's address as lb
/// does); the table is deleted when dropped, so its conntrack hooks are there only for its turn.
struct NftNat {
    ns: Netns,
}

impl NftNat {
    fn add(ns: &Netns, vip: Ipv4Addr, backend: Ipv4Addr) -> anyhow::Result<Self> {
        let guard = Self { ns: ns.clone() };
        ns.nft(&["add", "table", "ip", "lbbench"])?;
        ns.nft(&[
            "add",
            "chain",
            "ip",
            "lbbench",
            "pre",
            "{ type nat hook prerouting priority dstnat; }",
        ])?;
        ns.nft(&[
            "add",
            "chain",
            "ip",
            "lbbench",
            "post",
            "{ type nat hook postrouting priority srcnat; }",
        ])?;
        for (vport, bport) in [(IPERF_PORT, IPERF_PORT), (VIP_HTTP_PORT, HTTP_PORT)] {
            ns.nft(&[
                "add",
                "rule",
                "ip",
                "lbbench",
                "pre",
                &format!("ip daddr {vip} tcp dport {vport} dnat to {backend}:{bport}"),
            ])?;
        }
        ns.nft(&[
            "add",
            "rule",
            "ip",
            "lbbench",
            "post",
            &format!("ip daddr {backend} ct status dnat snat to 10.0.2.1"),
        ])?;
        Ok(guard)
    }
}

impl Drop for NftNat {
    fn drop(&mut self) {
        if let Err(e) = self.ns.nft(&["delete", "table", "ip", "lbbench"]) {
            eprintln!("warning: removing the nft table: {e:#}");
        }
    }
}

pub struct E2e {
    pub rounds: usize,
    /// Rounds of the CPU measurement (threaded NAPI), after the throughput rounds.
    pub cpu_rounds: usize,
    pub seconds: u64,
    pub connections: u32,
    pub samples: BTreeMap<(Target, Test), Vec<f64>>,
    /// wrk socket errors and non-2xx responses, summed over rounds.
    pub errors: BTreeMap<(Target, Test), u64>,
    /// Tests that failed, with why (their samples are missing).
    pub failures: Vec<String>,
    /// lb's datapath counters summed over its turns (those that moved).
    pub lb_counters: BTreeMap<String, u64>,
    /// The balancer's CPU per test and round.
    pub cpu: BTreeMap<(Target, Test), Vec<CpuSample>>,
}

impl E2e {
    pub fn median(&self, t: Target, test: Test) -> f64 {
        self.samples.get(&(t, test)).map_or(f64::NAN, |s| median(s))
    }

    /// Per round: the balancer's CPU in ms per unit of work.
    pub fn cpu_per_unit(&self, t: Target, test: Test) -> Vec<f64> {
        self.cpu
            .get(&(t, test))
            .map(|v| v.iter().map(CpuSample::ms_per_unit).collect())
            .unwrap_or_default()
    }

    /// Per lb round: ms per unit of work in lb's XDP program alone (BPF statistics).
    pub fn xdp_per_unit(&self, test: Test) -> Vec<f64> {
        self.cpu
            .get(&(Target::Lb, test))
            .map(|v| {
                v.iter()
                    .filter_map(|c| Some(1e3 * c.xdp? / c.work))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Median over rounds of the balancer's CPU in ms per unit of work.
    pub fn cpu_median(&self, t: Target, test: Test) -> f64 {
        median(&self.cpu_per_unit(t, test))
    }
}

fn counters(d: &Daemon) -> anyhow::Result<BTreeMap<String, u64>> {
    Ok(d.stats()?
        .counters
        .into_iter()
        .map(|c| (c.name, c.value))
        .collect())
}

pub fn run(
    bed: &Bed,
    rounds: usize,
    cpu_rounds: usize,
    seconds: u64,
    connections: u32,
) -> anyhow::Result<E2e> {
    let mut r = E2e {
        rounds,
        cpu_rounds,
        seconds,
        connections,
        samples: BTreeMap::new(),
        errors: BTreeMap::new(),
        failures: Vec::new(),
        lb_counters: BTreeMap::new(),
        cpu: BTreeMap::new(),
    };
    // Warm-up (not recorded): caches, neighbour entries, the servers' first accepts.
    peers::wrk(
        &bed.sb.client.ns,
        SocketAddr::from((bed.backend(), HTTP_PORT)),
        false,
        connections,
        1,
    )
    .context("warm-up wrk, direct")?;
    for round in 1..=rounds {
        for target in Target::ALL {
            eprintln!("  round {round}/{rounds}: {}", target.name());
            r.turn(bed, target, round, target.tests(), false)?;
        }
    }
    if cpu_rounds > 0 {
        let _threaded = Threaded::on(&bed.sb)?;
        for round in 1..=cpu_rounds {
            for target in Target::ALL {
                eprintln!("  CPU round {round}/{cpu_rounds}: {}", target.name());
                r.turn(bed, target, round, &CPU_TESTS, true)?;
            }
        }
    }
    Ok(r)
}

impl E2e {
    /// One path's turn: its balancer set up, `tests` run, torn down. With `cpu`, the tests
    /// record the balancer's CPU (not the throughput).
    fn turn(
        &mut self,
        bed: &Bed,
        target: Target,
        round: usize,
        tests: &[Test],
        cpu: bool,
    ) -> anyhow::Result<()> {
        checkpoint()?;
        let backend = bed.backend();
        let client = &bed.sb.client.ns;
        let (iperf_to, http_to) = match target.vip() {
            None => (
                SocketAddr::from((backend, IPERF_PORT)),
                SocketAddr::from((backend, HTTP_PORT)),
            ),
            Some(vip) => (
                SocketAddr::from((vip, IPERF_PORT)),
                SocketAddr::from((vip, VIP_HTTP_PORT)),
            ),
        };
        let mut daemon = None;
        let mut xdp = None;
        let mut _nft = None;
        match target {
            Target::Lb | Target::LbProxy => {
                // Off, not the default `auto`: this row is lb without the proxy, whatever the
                // connection rate (wrk's reaches `syn_proxy_engage_rate`).
                let proxy = if target == Target::LbProxy {
                    "syn_proxy = \"on\""
                } else {
                    "syn_proxy = \"off\""
                };
                let d = Daemon::start(&bed.sb.lb, &lb_config(bed, "", proxy))?;
                wait_for_neighbours(&bed.sb, &BTreeSet::from([backend.into()]))?;
                daemon = Some((counters(&d)?, d));
                if cpu {
                    xdp = Some(XdpStats::start(&bed.sb)?);
                }
            }
            Target::Nft => {
                _nft = Some(NftNat::add(
                    &bed.sb.lb,
                    target.vip().expect("a VIP"),
                    backend,
                )?);
            }
            _ => {}
        }
        let meter = Meter::new(&bed.sb, target.processes())?;
        for &test in tests {
            checkpoint()?;
            // Let the previous test's connections finish closing.
            sleep(Duration::from_millis(300))?;
            let before = cpu.then(|| meter.read());
            let xdp_before = xdp.as_ref().map(XdpStats::run_time_ns);
            // (result, errors, work: Gbit or thousands of requests)
            let result = match test {
                Test::Tcp1 | Test::Tcp4 => {
                    let streams = if test == Test::Tcp1 { 1 } else { 4 };
                    peers::iperf(client, iperf_to, streams, self.seconds)
                        .map(|i| (i.gbit_per_s, 0, i.bytes * 8.0 / 1e9))
                }
                Test::KeepAlive | Test::Close => peers::wrk(
                    client,
                    http_to,
                    test == Test::Close,
                    self.connections,
                    self.seconds,
                )
                .map(|w| (w.requests_per_s, w.errors, w.requests as f64 / 1e3)),
            };
            let spent = before.map(|b| meter.read().since(&b));
            let xdp_spent = xdp
                .as_ref()
                .zip(xdp_before)
                .map(|(x, b)| x.run_time_ns().saturating_sub(b) as f64 / 1e9);
            checkpoint()?;
            match (result, spent) {
                (Ok((_, _, work)), Some(spent)) => {
                    if work > 0.0 {
                        self.cpu.entry((target, test)).or_default().push(CpuSample {
                            spent,
                            xdp: xdp_spent,
                            work,
                        });
                    }
                }
                (Ok((v, errors, _)), None) => {
                    self.samples.entry((target, test)).or_default().push(v);
                    *self.errors.entry((target, test)).or_default() += errors;
                }
                (Err(e), _) => self.failures.push(format!(
                    "{}round {round}, {}, {}: {e:#}",
                    if cpu { "CPU " } else { "" },
                    target.name(),
                    test.name()
                )),
            }
        }
        drop(xdp); // statistics off before lb goes
        if let Some((before, d)) = daemon {
            let after = counters(&d)?;
            for (name, v) in after {
                let delta = v - before.get(&name).copied().unwrap_or(0);
                if delta > 0 {
                    *self.lb_counters.entry(name).or_default() += delta;
                }
            }
            drop(d); // SIGTERM: lb detaches (--no-pin) before the next target's turn
        }
        Ok(())
    }
}

fn ratio(a: f64, b: f64) -> String {
    if a.is_finite() && b.is_finite() && b > 0.0 {
        format!("{:.2}×", a / b)
    } else {
        "–".into()
    }
}

fn value(v: f64, unit: &str) -> String {
    if !v.is_finite() {
        "failed".into()
    } else if unit == "Gbit/s" {
        format!("{v:.2}")
    } else {
        format!("{v:.0}")
    }
}

/// The markdown tables: per test, each target's median, range, ratios to direct and HAProxy.
pub fn markdown(r: &E2e) -> String {
    let mut s = String::new();
    for test in Test::ALL {
        let unit = test.unit();
        let direct = r.median(Target::Direct, test);
        let haproxy = r.median(Target::Haproxy, test);
        let _ = writeln!(
            s,
            "**{}** ({unit}, median of {} rounds)\n\n| path | median | min – max | / direct | / HAProxy |{}\n|---|---:|---:|---:|---:|{}",
            test.name(),
            r.rounds,
            if unit == "Gbit/s" { "" } else { " errors |" },
            if unit == "Gbit/s" { "" } else { "---:|" },
        );
        for t in Target::running(test) {
            let samples = r.samples.get(&(t, test)).cloned().unwrap_or_default();
            let m = median(&samples);
            let (lo, hi) = min_max(&samples);
            let errors = if unit == "Gbit/s" {
                String::new()
            } else {
                format!(" {} |", r.errors.get(&(t, test)).copied().unwrap_or(0))
            };
            let _ = writeln!(
                s,
                "| {} | {} | {} – {} | {} | {} |{errors}",
                t.name(),
                value(m, unit),
                value(lo, unit),
                value(hi, unit),
                ratio(m, direct),
                ratio(m, haproxy)
            );
        }
        s.push('\n');
    }
    if !r.lb_counters.is_empty() {
        let c: Vec<String> = r
            .lb_counters
            .iter()
            .map(|(n, v)| format!("`{n}` {v}"))
            .collect();
        let _ = writeln!(
            s,
            "lb's datapath counters over its turns (packets, both directions): {}.\n",
            c.join(", ")
        );
    }
    if !r.failures.is_empty() {
        let _ = writeln!(s, "Failed runs (no sample):\n");
        for f in &r.failures {
            let _ = writeln!(s, "- {}", f.replace('\n', " "));
        }
        s.push('\n');
    }
    s
}

/// A table cell: the median of `v` as `show` writes it, or "–" when there are no samples.
fn median_cell(v: &[f64], show: impl Fn(f64) -> String) -> String {
    if v.is_empty() {
        "–".to_owned()
    } else {
        show(median(v))
    }
}

/// The balancer's CPU per unit of work: per path and test the median over rounds with its range,
/// then the kernel's share (NAPI threads) of it.
pub fn cpu_markdown(r: &E2e) -> String {
    let mut s = String::new();
    let header: Vec<String> = CPU_TESTS
        .iter()
        .map(|t| format!("{} (ms / {})", t.name(), t.work_unit()))
        .collect();
    let _ = writeln!(
        s,
        "**The balancer's CPU** per unit of work (median of {} rounds, min – max)\n\n| path | {} |\n|---|{}",
        r.cpu_rounds,
        header.join(" | "),
        "---:|".repeat(CPU_TESTS.len())
    );
    let mut share = String::new();
    let _ = writeln!(
        share,
        "Of that, the kernel's part (the NAPI threads of the balancer's interfaces; the rest is \
         the balancer's processes), median over rounds:\n\n| path | {} |\n|---|{}",
        CPU_TESTS.map(Test::name).join(" | "),
        "---:|".repeat(CPU_TESTS.len())
    );
    for t in Target::ALL {
        let mut cells = Vec::new();
        let mut shares = Vec::new();
        for test in CPU_TESTS {
            let v = r.cpu_per_unit(t, test);
            let (lo, hi) = min_max(&v);
            cells.push(median_cell(&v, |m| format!("{m:.2} ({lo:.2} – {hi:.2})")));
            let k: Vec<f64> = r
                .cpu
                .get(&(t, test))
                .map(|v| v.iter().map(|c| c.spent.napi / c.spent.total()).collect())
                .unwrap_or_default();
            shares.push(median_cell(&k, |m| format!("{:.0}%", 100.0 * m)));
        }
        let _ = writeln!(s, "| {} | {} |", t.name(), cells.join(" | "));
        let _ = writeln!(share, "| {} | {} |", t.name(), shares.join(" | "));
    }
    let xdp: Vec<String> = CPU_TESTS
        .iter()
        .map(|&test| median_cell(&r.xdp_per_unit(test), |m| format!("{m:.2}")))
        .collect();
    s.push('\n');
    s += &share;
    let _ = writeln!(
        s,
        "\nlb's XDP program alone, by the kernel's BPF statistics (`run_time_ns` with \
         BPF_ENABLE_STATS on during lb's turns; no veth receive or redirect around it, so a \
         lower bound of lb's figure), median ms per unit in the same order: {}.\n",
        xdp.join(" / ")
    );
    s
}
