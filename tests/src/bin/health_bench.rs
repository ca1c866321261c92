//! Health checking benchmark (root; builds its own namespaces).
//!
//! 1. Cost: probes per second and CPU for 1,000, 10,000 and 50,000 half-open TCP targets at a
//!    1 s interval. The targets are addresses of a namespace that owns a whole /16 (a local route),
//!    where one listener makes the kernel answer every SYN. The probes run in-process, driven
//!    either by the daemon's checker (`lb::health::checker::spawn`: its scheduler task starts
//!    the probes due in each 10 ms slot, the half-open ones as one batch, and feeds each result
//!    to the target's window), by one task handing each slot's targets to the prober in one
//!    batch as that scheduler does (the prober alone: what the scheduler and windows add), or
//!    by a single task that starts one probe future per target due in each 10 ms slot and polls
//!    them itself (the prober's `probe` futures without windows, verdicts, phase or jitter).
//!    Every case runs once per round, rounds interleaved, and the table shows medians. Each in
//!    two modes:
//!    - *in process*: plain veth, whose receive path runs in the sender's context, so the
//!      process CPU also holds the whole simulated network: the targets' kernel answering SYNs,
//!      our kernel receiving the SYN+ACK and sending the RST (how the cost was first measured);
//!    - *NAPI threads*: both veth ends receive through a NAPI kernel thread, so the process CPU
//!      is the checker's own (user space and its syscalls down to the veth), the checker-side
//!      thread is what a NIC's receive path costs the checker's host (SYN+ACK in, its copy into
//!      the prober's receive ring, RST out), and the target-side thread is the backends' work,
//!      not ours.
//!
//!    Then the other check kinds at 1,000 targets (tcp-connect, http, icmp, udp), the checker
//!    in NAPI-thread mode only (its own cost); their servers run outside this process: the
//!    kernel answers ICMP echo, nginx (one worker, in the targets' namespace) accepts the
//!    connections, answers `GET /health` and, with its stream module, the UDP datagrams. The
//!    checker's cost at 50,000 half-open targets is the goal of issue 20 (≤ 15% of one core,
//!    ≤ 3 µs per probe); the per-case figures also go, as JSON, beside the `--out` markdown
//!    (`health.json`), for peer_bench's goals table and chart.
//! 2. Detection: how long after a backend dies its half-open check declares it unhealthy, over
//!    trials where the server stops listening (answers RST) or its namespace drops all input
//!    (silent), against `timeout × unhealthy_threshold + interval × (unhealthy_threshold − 1)`
//!    plus one interval of phase. These trials drive a [`Window`] with [`SynProber::probe`]
//!    results themselves, pausing `Window::next_interval` after each probe as the checker does:
//!    they measure the probe and the state machine, independently of the checker's scheduler
//!    (whose jitter, up to 5 % of an interval, they leave out).

use std::{
    fmt::Write as _,
    net::{Ipv4Addr, SocketAddrV4, TcpListener},
    path::PathBuf,
    time::{Duration, Instant},
};

use anyhow::Context as _;
use clap::Parser;
use lb::health::{
    probe::tcp_syn::SynProber,
    window::{HealthState, Window, WindowSettings},
};
use lb_tests::{
    bench::{cpu, health_cost::GOAL, median, min_max},
    netns::{Netns, sh, veth},
};
use tokio::sync::{mpsc, watch};

#[derive(Parser)]
struct Args {
    /// Seconds measured per size and mode (after a warm-up of 3 s).
    #[arg(long, default_value_t = 10)]
    seconds: u64,
    /// Rounds of the cost part: every size, driver and mode in turn, each round (the table
    /// shows medians).
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Target counts of the cost part (half-open checks).
    #[arg(long, value_delimiter = ',', default_values_t = [1000, 10000, 50000])]
    targets: Vec<usize>,
    /// The other check kinds of the cost part, each at `--kind-targets` targets (checker, NAPI
    /// threads); their servers are nginx's (`cargo xtask bench` installs it). `tcp` alone:
    /// none of them.
    #[arg(long, value_delimiter = ',', default_values_t = [Kind::TcpConnect, Kind::Http, Kind::Icmp, Kind::Udp])]
    kinds: Vec<Kind>,
    /// Targets of each other check kind.
    #[arg(long, default_value_t = 1000)]
    kind_targets: usize,
    /// Receive-path modes of the cost part.
    #[arg(long, value_delimiter = ',', default_values_t = [Mode::InProcess, Mode::Threaded])]
    modes: Vec<Mode>,
    /// Who schedules the probes in the cost part.
    #[arg(long, value_delimiter = ',', default_values_t = [Driver::Checker, Driver::Prober, Driver::Single])]
    drivers: Vec<Driver>,
    /// Detection trials per kind of death (RST, silence).
    #[arg(long, default_value_t = 20)]
    trials: usize,
    /// Skip the cost part.
    #[arg(long)]
    no_cost: bool,
    /// Skip the detection part.
    #[arg(long)]
    no_detection: bool,
    /// Also write the report (markdown) to this file, e.g. target/bench/health.md.
    #[arg(long)]
    out: Option<PathBuf>,
}

/// Where the veth receive path runs in the cost part.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Mode {
    /// In the sending thread (plain veth).
    InProcess,
    /// In NAPI kernel threads.
    Threaded,
}

/// Who schedules the probes in the cost part.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Driver {
    /// The daemon's checker: its scheduler task, windows and verdicts.
    Checker,
    /// One task handing each 10 ms slot's targets to the prober in one batch and taking the
    /// results: the prober alone, what the checker's scheduler and windows add to it.
    Prober,
    /// One task starting the probes due in each 10 ms slot and polling them itself.
    Single,
}

/// The check kind a cost case runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Kind {
    /// Half-open (the cost part's main table).
    Tcp,
    TcpConnect,
    Http,
    Icmp,
    Udp,
}

impl std::fmt::Display for Kind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Tcp => "tcp",
            Self::TcpConnect => "tcp-connect",
            Self::Http => "http",
            Self::Icmp => "icmp",
            Self::Udp => "udp",
        })
    }
}

impl std::fmt::Display for Driver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Checker => "checker",
            Self::Prober => "prober",
            Self::Single => "single",
        })
    }
}

impl std::fmt::Display for Mode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::InProcess => "in-process",
            Self::Threaded => "threaded",
        })
    }
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    lb_tests::require_root();
    if let Some(out) = &args.out {
        // The cost part writes a fresh one; none from an earlier run may stay behind.
        let _ = std::fs::remove_file(out.with_extension("json"));
    }
    let mut report = String::new();
    if !args.no_cost {
        report += &cost(&args)?;
    }
    if !args.no_detection {
        if !report.is_empty() {
            report.push('\n');
        }
        report += &detection(&args)?;
    }
    print!("{report}");
    if let Some(out) = args.out {
        if let Some(dir) = out.parent() {
            std::fs::create_dir_all(dir)?;
        }
        std::fs::write(&out, &report).with_context(|| format!("writing {}", out.display()))?;
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Cost

/// CPU seconds (user + system) of this process, all threads, and its voluntary context
/// switches (each a thread going to sleep: what wakes it up later is a wake-up).
fn cpu_seconds() -> (f64, u64) {
    // SAFETY: getrusage fills the struct.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: valid pointer.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let t = |tv: libc::timeval| tv.tv_sec as f64 + tv.tv_usec as f64 / 1e6;
    (t(ru.ru_utime) + t(ru.ru_stime), ru.ru_nvcsw as u64)
}

/// CPU seconds of the kernel threads (`/proc/PID/stat` utime + stime).
fn thread_cpu_seconds(pids: &[u32]) -> f64 {
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    pids.iter()
        .filter_map(|pid| std::fs::read_to_string(format!("/proc/{pid}/stat")).ok())
        .filter_map(|stat| {
            // The fields after the command name, which ends with the last ')'.
            let rest = &stat[stat.rfind(')')? + 2..];
            let f: Vec<&str> = rest.split_whitespace().collect();
            // utime and stime are fields 14 and 15 of the whole line, 12 and 13 here.
            Some(f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?)
        })
        .sum::<f64>()
        / hz
}

/// The targets' ports: the kernel's listener (half-open checks), nginx's HTTP (http and
/// tcp-connect checks) and UDP (udp checks).
const SYN_PORT: u16 = 8080;
const HTTP_PORT: u16 = 8081;
const UDP_PORT: u16 = 5353;

fn config(targets: usize, kind: Kind) -> String {
    let backends: Vec<String> = (0..targets)
        .map(|i| format!("{{ address = \"{}\" }}", target(i)))
        .collect();
    let check = match kind {
        Kind::Tcp | Kind::Icmp => String::new(),
        Kind::TcpConnect | Kind::Http => format!("port = {HTTP_PORT}\n"),
        Kind::Udp => format!("port = {UDP_PORT}\nsend = \"ping\"\nexpect = \"pong\"\n"),
    } + if kind == Kind::Http {
        "path = \"/health\"\n"
    } else {
        ""
    };
    format!(
        "[lb]\ninterfaces = [\"unused0\"]\nmax_backends = {}\n\n[[service]]\nname = \"many\"\n\
         vip = \"10.100.0.1:80\"\nbackends = [{}]\n[service.check]\nkind = \"{kind}\"\ntimeout = \"500ms\"\n\
         interval = \"1s\"\n{check}",
        targets.max(4096),
        backends.join(", ")
    )
}

/// What one cost run measured.
struct CostRun {
    probes: u64,
    wall: f64,
    process: f64,
    /// Voluntary context switches of the process.
    switches: u64,
    /// CPU seconds of the checker-side and target-side NAPI threads (threaded mode only).
    napi: Option<(f64, f64)>,
    /// Checker: state changes to anything but healthy during the measurement, and targets not
    /// healthy at the end; single task: failed probes. Should be none.
    failures: u64,
}

/// One cost run: `targets` checked with `kind` by `driver`, in fresh namespaces; with
/// `threaded`, both veth ends receive in NAPI threads.
fn cost_run(
    targets: usize,
    seconds: u64,
    threaded: bool,
    driver: Driver,
    kind: Kind,
) -> anyhow::Result<CostRun> {
    let checker_ns = Netns::new("hb-checker")?;
    let targets_ns = Netns::new("hb-targets")?;
    let (ours, theirs) = veth(&checker_ns, "10.49.0.1/16", &targets_ns, "10.49.0.2/16")?;
    let napi = match threaded {
        true => Some((cpu::threaded_napi(&ours)?, cpu::threaded_napi(&theirs)?)),
        false => None,
    };
    // A veth has no queue of its own (noqueue): a burst larger than its peer's ring (256
    // frames in NAPI mode) is dropped. A NIC's queue discipline holds such bursts (a slot's
    // 500 SYNs at 50,000 targets); give both ends one, which a full ring pushes back into.
    for port in [&ours, &theirs] {
        sh(port.ns.command("tc").args([
            "qdisc",
            "replace",
            "dev",
            &port.ifname,
            "root",
            "pfifo",
            "limit",
            "10000",
        ]))?;
    }
    targets_ns.ip(&["route", "add", "local", "10.50.0.0/16", "dev", "lo"])?;
    checker_ns.ip(&["route", "add", "10.50.0.0/16", "via", "10.49.0.2"])?;
    // Kernel answers the SYNs; nobody ever accepts (half-open probes never complete).
    let _listener = targets_ns
        .enter(|| TcpListener::bind(("0.0.0.0", SYN_PORT)))
        .context("listener")?;
    // HTTP, connections and UDP are answered by nginx: another process, whose CPU the
    // process's figures leave out (the kernel answers ICMP echo).
    let (_nginx, _dir) = match kind {
        Kind::TcpConnect | Kind::Http | Kind::Udp => {
            let dir = lb_tests::daemon::TempDir::new()?;
            let nginx =
                lb_tests::bench::peers::health_targets(&targets_ns, &dir.0, HTTP_PORT, UDP_PORT)
                    .context("nginx for the checks (cargo xtask bench installs it)")?;
            (Some(nginx), Some(dir))
        }
        Kind::Tcp | Kind::Icmp => (None, None),
    };
    let napi_cpu = || {
        napi.as_ref()
            .map(|(a, b)| (thread_cpu_seconds(a), thread_cpu_seconds(b)))
    };
    checker_ns.enter(|| -> anyhow::Result<CostRun> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()?;
        rt.block_on(async {
            let (stop_tx, stop_rx) = watch::channel(false);
            let (measuring_tx, measuring) = watch::channel(false);
            let running = match driver {
                Driver::Checker => run_checker(targets, kind, stop_rx, measuring)?,
                Driver::Prober => run_prober(targets, stop_rx, measuring)?,
                Driver::Single => run_single(targets, stop_rx, measuring)?,
            };
            tokio::time::sleep(Duration::from_secs(3)).await;
            measuring_tx.send_replace(true);
            let (p0, c0, n0, t0) = (
                (running.probes)(),
                cpu_seconds(),
                napi_cpu(),
                Instant::now(),
            );
            tokio::time::sleep(Duration::from_secs(seconds)).await;
            let (p1, c1, n1) = ((running.probes)(), cpu_seconds(), napi_cpu());
            let wall = t0.elapsed().as_secs_f64();
            measuring_tx.send_replace(false);
            stop_tx.send_replace(true);
            let failures = tokio::time::timeout(Duration::from_secs(10), running.done)
                .await
                .context("the probes did not stop")??;
            Ok(CostRun {
                probes: p1 - p0,
                wall,
                process: c1.0 - c0.0,
                switches: c1.1 - c0.1,
                napi: n0.zip(n1).map(|(a, b)| (b.0 - a.0, b.1 - a.1)),
                failures,
            })
        })
    })
}

/// Probes running in the background: a probe counter, and their end (failures seen while
/// measuring).
struct Running {
    probes: Box<dyn Fn() -> u64>,
    done: tokio::task::JoinHandle<u64>,
}

/// Target `i` (up to 63,999): an address of 10.50.0.0/16, all owned by the targets' namespace.
fn target(i: usize) -> SocketAddrV4 {
    SocketAddrV4::new(
        Ipv4Addr::new(10, 50, (i / 250) as u8, 1 + (i % 250) as u8),
        SYN_PORT,
    )
}

/// The daemon's checker (`lb::health::checker::spawn`).
fn run_checker(
    targets: usize,
    kind: Kind,
    stop: watch::Receiver<bool>,
    measuring: watch::Receiver<bool>,
) -> anyhow::Result<Running> {
    let config = lb::config::parse(&config(targets, kind)).map_err(|e| anyhow::anyhow!("{e}"))?;
    let (tx, mut rx) = mpsc::unbounded_channel::<lb::health::checker::Verdict>();
    let checker = std::sync::Arc::new(std::sync::Mutex::new(Some(lb::health::checker::spawn(
        &config,
        &Default::default(),
        &Default::default(),
        tx,
        stop.clone(),
    )?)));
    let probes = {
        let checker = checker.clone();
        Box::new(move || {
            let checker = checker.lock().expect("checker");
            checker.as_ref().map_or(0, |c| c.probes())
        })
    };
    let done = tokio::spawn(async move {
        let mut not_healthy = 0;
        let join = async {
            let mut stop = stop;
            let _ = stop.wait_for(|s| *s).await;
            let taken = checker.lock().expect("checker").take();
            if let Some(c) = taken {
                c.join().await;
            }
        };
        // Every target's latest state: one never healthy (e.g. a server answering wrongly from
        // the start) changes state only during the warm-up.
        let mut states = std::collections::HashMap::new();
        // Ends when the checker, stopped, has dropped its senders.
        let count = async {
            while let Some(verdict) = rx.recv().await {
                if let Some(t) = verdict.transition {
                    states.insert(verdict.probe.target, t.to);
                    if *measuring.borrow() && t.to != HealthState::Healthy {
                        not_healthy += 1;
                    }
                }
            }
        };
        tokio::join!(join, count);
        let healthy = states
            .values()
            .filter(|&&s| s == HealthState::Healthy)
            .count();
        not_healthy + (targets - healthy) as u64
    });
    Ok(Running { probes, done })
}

/// The prober and single drivers' slot, interval and timeout: the checker's (its config).
const SLOT: Duration = Duration::from_millis(10);
const INTERVAL: Duration = Duration::from_secs(1);
const TIMEOUT: Duration = Duration::from_millis(500);

/// The targets due in `slot` of `slots`: those i with i × slots / targets == slot, an even
/// share per slot.
fn slot_targets(slot: usize, slots: usize, targets: usize) -> std::ops::Range<usize> {
    (slot * targets).div_ceil(slots)..((slot + 1) * targets).div_ceil(slots)
}

/// The prober alone: every 10 ms one task hands the slot's share of the targets (each once per
/// interval) to [`SynProber::start_many`] and takes the results from [`SynProber::finished`],
/// without the checker's scheduler, windows or verdicts.
fn run_prober(
    targets: usize,
    mut stop: watch::Receiver<bool>,
    measuring: watch::Receiver<bool>,
) -> anyhow::Result<Running> {
    use std::sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    };
    let prober = Arc::new(SynProber::new()?);
    let sent = Arc::new(AtomicU64::new(0));
    let probes = {
        let sent = sent.clone();
        Box::new(move || sent.load(Ordering::Relaxed))
    };
    let done = tokio::spawn(async move {
        let slots = (INTERVAL.as_nanos() / SLOT.as_nanos()) as usize;
        let mut ticker = tokio::time::interval(SLOT);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        let (mut slot, mut failures) = (0usize, 0u64);
        let (mut batch, mut results) = (Vec::new(), Vec::new());
        loop {
            tokio::select! {
                _ = stop.wait_for(|s| *s) => break,
                _ = ticker.tick() => {
                    // The token's high half is the target's place in the prober's table.
                    batch.clear();
                    batch.extend(slot_targets(slot, slots, targets).map(|i| {
                        ((i as u64) << 32, target(i).into(), TIMEOUT, None)
                    }));
                    prober.start_many(&batch);
                    sent.fetch_add(batch.len() as u64, Ordering::Relaxed);
                    slot = (slot + 1) % slots;
                }
                () = prober.finished(&mut results) => {
                    let measured = *measuring.borrow();
                    for (_, result) in results.drain(..) {
                        if measured && !matches!(result, lb::health::window::ProbeResult::Success { .. }) {
                            failures += 1;
                        }
                    }
                }
            }
        }
        failures
    });
    Ok(Running { probes, done })
}

/// The probes of every target from a single task: every [`SLOT`] it starts the targets whose
/// turn it is (each once per interval) and polls the probes in flight itself, so neither a
/// task nor a timer is spent per probe. What a scheduler could cost on top of the prober.
fn run_single(
    targets: usize,
    mut stop: watch::Receiver<bool>,
    measuring: watch::Receiver<bool>,
) -> anyhow::Result<Running> {
    use std::{future::Future, pin::Pin, sync::Arc, task::Poll};
    let prober = Arc::new(SynProber::new()?);
    let sent = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let probes = {
        let sent = sent.clone();
        Box::new(move || sent.load(std::sync::atomic::Ordering::Relaxed))
    };
    let done = tokio::spawn(async move {
        let slots = (INTERVAL.as_nanos() / SLOT.as_nanos()) as usize;
        let mut ticker = tokio::time::interval(SLOT);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        let mut slot = 0usize;
        let mut failures = 0u64;
        type Probe<'a> = Pin<Box<dyn Future<Output = lb::health::window::ProbeResult> + Send + 'a>>;
        let mut in_flight: Vec<Probe<'_>> = Vec::new();
        let prober = &*prober;
        std::future::poll_fn(|cx| {
            while ticker.poll_tick(cx).is_ready() {
                let due = slot_targets(slot, slots, targets);
                sent.fetch_add(due.len() as u64, std::sync::atomic::Ordering::Relaxed);
                for i in due {
                    in_flight.push(Box::pin(prober.probe(target(i).into(), TIMEOUT)));
                }
                slot = (slot + 1) % slots;
            }
            in_flight.retain_mut(|probe| match probe.as_mut().poll(cx) {
                Poll::Ready(result) => {
                    if *measuring.borrow()
                        && !matches!(result, lb::health::window::ProbeResult::Success { .. })
                    {
                        failures += 1;
                    }
                    false
                }
                Poll::Pending => true,
            });
            let stopped = std::pin::pin!(stop.wait_for(|s| *s));
            match stopped.poll(cx) {
                Poll::Ready(_) => Poll::Ready(()),
                Poll::Pending => Poll::Pending,
            }
        })
        .await;
        failures
    });
    Ok(Running { probes, done })
}

fn cost(args: &Args) -> anyhow::Result<String> {
    let mut out = String::from(
        "## Health checking cost\n\n\
         Half-open TCP probes (timeout 500 ms) to every target once a second, over a veth pair \
         to a namespace whose kernel answers every SYN; 2 tokio workers. CPU in % of one core. \
         Every row is the median of the rounds (all cases in turn, each round; *process* also \
         shows its range), since a shared machine drifts by ±15% between runs.\n\n\
         Drivers:\n\
         - *checker*: the daemon's checker (`lb::health::checker::spawn`): one scheduler task \
         starts the probes due in each 10 ms slot (half-open ones as one batch, without a \
         future each) and feeds each result to the target's window (its per-target phase and \
         jitter spread the probes evenly).\n\
         - *prober*: one task hands each 10 ms slot's targets to the prober in one batch \
         (`SynProber::start_many`, as the checker's scheduler does) and takes the results: the \
         prober alone, so *checker* − *prober* is what the scheduler and the windows cost \
         (NAPI threads only).\n\
         - *single*: one task starts a `SynProber::probe` future per target due in each 10 ms \
         slot and polls them itself: the prober's future API, without windows or verdicts (up \
         to 10,000 targets: it polls every probe in flight at each wake-up, and falls behind \
         beyond).\n\n\
         Modes (where the veth receive path runs):\n\
         - *in process*: in the sending thread, so *process* also holds the simulated network: \
         the targets' kernel answering the SYNs, ours receiving the SYN+ACK and sending the RST.\n\
         - *NAPI threads*: each veth end receives in a NAPI kernel thread. *process* is then the \
         checker's own cost (user space and its syscalls, including the veth transmit and the \
         wake-up of the targets' NAPI thread); *rx* is the checker host's receive path (SYN+ACK \
         in, its copy into the prober's receive ring, the kernel's RST out: what a NIC's softirq costs that host); \
         *targets* is the backends' side, not the checker's. *host* = process + rx.\n\n\
         *failures*: checker: state changes to anything but healthy while measuring, and targets not healthy at the end; prober, single: \
         failed probes while measuring (all should be 0; summed over the rounds). *sleeps/s*: voluntary context \
         switches of the process per second (a thread going to sleep, woken again later).\n\n\
         | targets | driver | mode | probes/s | process (min – max) | rx | host | targets | µs per probe (process) | sleeps/s | failures |\n\
         |---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    let mut cases = Vec::new();
    for &targets in &args.targets {
        // The single task polls every probe in flight at each wake-up: beyond 10,000 targets
        // it falls behind here (it is the prober's reference, not the daemon's way).
        let drivers = args
            .drivers
            .iter()
            .filter(|&&d| d != Driver::Single || targets <= SINGLE_MAX);
        for &driver in drivers {
            for &mode in &args.modes {
                // The prober is there to be set beside the checker's own cost, which only the
                // NAPI-thread mode shows apart from the simulated network.
                if driver == Driver::Prober && mode == Mode::InProcess {
                    continue;
                }
                cases.push((targets, driver, mode, Kind::Tcp));
            }
        }
    }
    // The other kinds: the checker's own cost only (see the kinds' section).
    for &kind in args.kinds.iter().filter(|&&k| k != Kind::Tcp) {
        cases.push((args.kind_targets, Driver::Checker, Mode::Threaded, kind));
    }
    let mut runs: Vec<Vec<CostRun>> = cases.iter().map(|_| Vec::new()).collect();
    for round in 1..=args.rounds.max(1) {
        for (c, &(targets, driver, mode, kind)) in cases.iter().enumerate() {
            let run = cost_run(targets, args.seconds, mode == Mode::Threaded, driver, kind)
                .with_context(|| format!("{targets} {kind} {driver} {mode}"))?;
            eprintln!(
                "round {round}: {targets} {kind} {driver} {mode}: {:.2}% process, {:.2} µs per probe",
                100.0 * run.process / run.wall,
                1e6 * run.process / run.probes.max(1) as f64,
            );
            runs[c].push(run);
        }
    }
    let pct = |cpu: f64, run: &CostRun| 100.0 * cpu / run.wall;
    let rx = |r: &CostRun| r.napi.map_or(0.0, |n| pct(n.0, r));
    let us = |r: &CostRun| 1e6 * r.process / r.probes.max(1) as f64;
    let mut kinds_table = String::new();
    let mut json_rows = Vec::new();
    // The checker's half-open medians (% of one core, µs per probe) by target count: the goals.
    let mut checker = std::collections::BTreeMap::new();
    for (&(targets, driver, mode, kind), runs) in cases.iter().zip(&runs) {
        let of = |f: &dyn Fn(&CostRun) -> f64| -> Vec<f64> { runs.iter().map(f).collect() };
        let process = of(&|r| pct(r.process, r));
        let (lo, hi) = min_max(&process);
        let threaded = mode == Mode::Threaded;
        let med = |f: &dyn Fn(&CostRun) -> f64| median(&of(f));
        let opt = |f: &dyn Fn(&CostRun) -> f64| {
            if threaded {
                format!("{:.1}", med(f))
            } else {
                "–".to_owned()
            }
        };
        let failures = runs.iter().map(|r| r.failures).sum::<u64>();
        if kind == Kind::Tcp {
            let line = format!(
                "| {targets} | {driver} | {} | {:.0} | {:.1} ({lo:.1} – {hi:.1}) | {} | {:.1} | {} | {:.2} | {:.0} | {failures} |",
                if threaded {
                    "NAPI threads"
                } else {
                    "in process"
                },
                med(&|r| r.probes as f64 / r.wall),
                median(&process),
                opt(&rx),
                med(&|r| pct(r.process, r) + rx(r)),
                opt(&|r| r.napi.map_or(0.0, |n| pct(n.1, r))),
                med(&us),
                med(&|r| r.switches as f64 / r.wall),
            );
            let _ = writeln!(out, "{line}");
        }
        if driver != Driver::Checker || !threaded {
            continue;
        }
        if kind == Kind::Tcp {
            checker.insert(targets, (median(&process), med(&us)));
        }
        // The checker's own cost, by kind: the kinds' table (half-open at their target count
        // too) and the machine-readable rows peer_bench reads.
        if kind != Kind::Tcp || targets == args.kind_targets {
            let (ulo, uhi) = min_max(&of(&us));
            let _ = writeln!(
                kinds_table,
                "| {kind} | {targets} | {:.0} | {:.2} ({ulo:.2} – {uhi:.2}) | {:.1} ({lo:.1} – {hi:.1}) | {:.1} | {failures} |",
                med(&|r| r.probes as f64 / r.wall),
                med(&us),
                median(&process),
                med(&rx),
            );
        }
        json_rows.push(serde_json::json!({
            "kind": kind.to_string(),
            "targets": targets,
            "percent_core": process,
            "us_per_probe": of(&us),
            "failures": failures,
        }));
    }
    out.push('\n');
    if let Some(&(cpu, _)) = checker.get(&10_000) {
        let _ = writeln!(
            out,
            "Goal (issue 4): at most 5% of one core for 10,000 targets probed every second \
             (checker, NAPI threads: the checker's own cost): {cpu:.1}%, **{}**.\n",
            if cpu <= 5.0 { "met" } else { "not met" }
        );
    }
    if let Some(&(cpu, us)) = checker.get(&GOAL.targets) {
        let _ = writeln!(
            out,
            "Goal (issue 20): at most {}% of one core and {} µs per probe for {} targets probed \
             every second (checker, NAPI threads): {cpu:.1}% and {us:.2} µs, **{}**.\n",
            GOAL.percent_core,
            GOAL.us_per_probe,
            GOAL.targets,
            if GOAL.met(cpu, us) { "met" } else { "not met" }
        );
    }
    if !kinds_table.is_empty() {
        let _ = write!(
            out,
            "## Cost per probe by check kind\n\n\
             The daemon's checker at {n} targets, every one checked once a second (timeout \
             500 ms), NAPI threads, the rounds as above. The servers run in the targets' \
             namespace, in other processes or the kernel, so *process* is the checker's own CPU: \
             *tcp*: half-open (the kernel answers the SYN; the table above); *tcp-connect*: a \
             full handshake with nginx (one worker), then close; *http*: `GET /health` over a \
             new connection to nginx (200, read up to the status line); *icmp*: echo (the \
             kernel answers); *udp*: `ping` to nginx's stream module, which answers `pong` \
             (`send`/`expect`: the reply decides). *rx* is the checker host's receive path \
             (its NAPI thread).\n\n\
             | kind | targets | probes/s | µs per probe (min – max) | process % (min – max) | rx % | failures |\n\
             |---|---:|---:|---:|---:|---:|---:|\n{kinds_table}",
            n = args.kind_targets,
        );
    }
    if let Some(path) = &args.out {
        // Beside the report, for peer_bench's goals table and chart.
        let json = serde_json::json!({
            "rounds": args.rounds.max(1),
            "seconds": args.seconds,
            "goal": { "targets": GOAL.targets, "percent_core": GOAL.percent_core, "us_per_probe": GOAL.us_per_probe },
            "checker_threaded": json_rows,
        });
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        std::fs::write(
            path.with_extension("json"),
            serde_json::to_string_pretty(&json)?,
        )?;
    }
    Ok(out)
}

/// Most targets the single-task driver runs (see `cost`).
const SINGLE_MAX: usize = 10_000;

// ---------------------------------------------------------------------------------------------
// Detection

/// How the backend dies in a trial.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Death {
    /// The server stops listening: the kernel answers RST.
    Rst,
    /// The namespace drops all its input: no answer at all.
    Silent,
}

const DETECTION: WindowSettings = WindowSettings {
    timeout: Duration::from_millis(200),
    interval: Duration::from_millis(300),
    unhealthy_interval: Duration::from_millis(300),
    healthy_threshold: 1,
    unhealthy_threshold: 2,
    tcp_failures: None,
    timeouts: None,
    http_failures: None,
};

/// Timer granularity allowed on top of the bound: tokio rounds each sleep up to the next
/// millisecond, and a detection holds up to four timed waits (two timeouts, two pauses).
const TIMER_SLACK: Duration = Duration::from_millis(5);

const BACKEND: SocketAddrV4 = SocketAddrV4::new(Ipv4Addr::new(10, 48, 0, 2), 8080);

/// One trial's measurements, from the kill.
struct Trial {
    /// Kill to the unhealthy verdict (from the start of the kill action).
    detected: Duration,
    /// How long the kill action itself took (nft reading and committing its rule; ~0 for
    /// closing the listener).
    kill_took: Duration,
}

/// A small random number (std's SipHash keys come from the OS RNG).
fn random_below(n: u64) -> u64 {
    use std::hash::{BuildHasher as _, RandomState};
    RandomState::new().hash_one(Instant::now()) % n.max(1)
}

fn detection(args: &Args) -> anyhow::Result<String> {
    let prober_ns = Netns::new("hb-prober")?;
    let backend_ns = Netns::new("hb-backend")?;
    veth(&prober_ns, "10.48.0.1/24", &backend_ns, "10.48.0.2/24")?;
    let s = DETECTION;
    let bound = s.failure_window();
    let with_phase = bound + s.interval;
    let mut out = format!(
        "## Detection time of a dead backend\n\n\
         Half-open TCP check with timeout {} ms, interval {} ms, unhealthy_threshold {} \
         (healthy_threshold {}): {} trials per kind of death. Each trial starts a fresh window on \
         a listening backend, waits for `healthy`, waits a random 0–{} ms more (so the death \
         falls at a random point of the probe cycle), then kills the backend and measures until \
         the `unhealthy` verdict. Kinds: *RST* (the listener closes; the kernel resets the \
         SYNs) and *silent* (the backend namespace drops all input with nft; the time counts \
         from the moment an nft process, started beforehand, is handed its rule: the rule is in \
         force at most *kill took* later). The probes come from `SynProber::probe` and feed \
         a `Window` directly, pausing `Window::next_interval` after each probe like the checker \
         (without its scheduling jitter).\n\n\
         Bound: timeout × unhealthy_threshold + interval × (unhealthy_threshold − 1) = {} ms \
         (from the first probe that finds the backend dead), plus one interval of phase = \
         **{} ms** from the death.\n\n\
         | death | trials | min ms | median ms | p90 ms | max ms | bound ms | within bound (+ kill time + {} ms timers) | kill took (max) ms |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|---:|\n",
        s.timeout.as_millis(),
        s.interval.as_millis(),
        s.unhealthy_threshold,
        s.healthy_threshold,
        args.trials,
        2 * s.interval.as_millis(),
        bound.as_millis(),
        with_phase.as_millis(),
        TIMER_SLACK.as_millis(),
    );
    for death in [Death::Rst, Death::Silent] {
        let mut trials = Vec::with_capacity(args.trials);
        for i in 0..args.trials {
            let trial = trial(&prober_ns, &backend_ns, death)
                .with_context(|| format!("{death:?} trial {i}"))?;
            trials.push(trial);
        }
        let mut ms: Vec<f64> = trials
            .iter()
            .map(|t| t.detected.as_secs_f64() * 1e3)
            .collect();
        ms.sort_by(f64::total_cmp);
        let q = |f: f64| ms[((ms.len() - 1) as f64 * f).round() as usize];
        // The rule of a silent kill may take effect up to `kill_took` after the count starts, and
        // each of the (up to four) sleeps and timeouts of a detection may end up to a
        // millisecond late (tokio's timer granularity).
        let within = trials
            .iter()
            .filter(|t| t.detected <= with_phase + t.kill_took + TIMER_SLACK)
            .count();
        let kill_took = trials.iter().map(|t| t.kill_took).max().unwrap_or_default();
        let _ = writeln!(
            out,
            "| {} | {} | {:.0} | {:.0} | {:.0} | {:.0} | {} | {within}/{} | {:.1} |",
            match death {
                Death::Rst => "RST",
                Death::Silent => "silent",
            },
            ms.len(),
            q(0.0),
            q(0.5),
            q(0.9),
            q(1.0),
            with_phase.as_millis(),
            ms.len(),
            kill_took.as_secs_f64() * 1e3,
        );
    }
    Ok(out)
}

/// One detection trial; leaves the backend alive again.
fn trial(prober_ns: &Netns, backend_ns: &Netns, death: Death) -> anyhow::Result<Trial> {
    let listener = backend_ns
        .enter(|| TcpListener::bind(BACKEND))
        .context("listener")?;
    let (killed_tx, killed_rx) = std::sync::mpsc::channel::<Instant>();
    let (healthy_tx, healthy_rx) = std::sync::mpsc::channel::<()>();
    let verdict = std::thread::scope(|scope| {
        let probing = scope.spawn(|| {
            prober_ns.block_on(|| async move {
                let prober = SynProber::new()?;
                let mut window = Window::new(DETECTION);
                let epoch = Instant::now();
                let mut healthy_tx = Some(healthy_tx);
                let give_up = Instant::now() + Duration::from_secs(10);
                loop {
                    let result = prober.probe(BACKEND.into(), DETECTION.timeout).await;
                    let now = Instant::now();
                    if let Some(t) = window.observe(result, now - epoch) {
                        if t.to == HealthState::Healthy
                            && let Some(tx) = healthy_tx.take()
                        {
                            let _ = tx.send(());
                        }
                        if t.to == HealthState::Unhealthy {
                            match killed_rx.try_recv() {
                                Ok(killed) => return Ok((epoch + t.at, killed)),
                                Err(_) => anyhow::bail!("unhealthy before the kill: {t:?}"),
                            }
                        }
                    }
                    anyhow::ensure!(now < give_up, "no verdict within 10 s ({result:?})");
                    tokio::time::sleep(window.next_interval()).await;
                }
            })
        });
        healthy_rx
            .recv_timeout(Duration::from_secs(5))
            .context("never healthy")?;
        // For silence: nft already started and waiting for its rules on stdin, so the rule is
        // in force within a few milliseconds of the kill (the same table and chain as
        // `Netns::drop_all_input`).
        let mut nft = match death {
            Death::Silent => Some(
                backend_ns
                    .command("nft")
                    .args(["-f", "-"])
                    .stdin(std::process::Stdio::piped())
                    .spawn()
                    .context("nft")?,
            ),
            Death::Rst => None,
        };
        let phase = Duration::from_millis(random_below(2 * DETECTION.interval.as_millis() as u64));
        std::thread::sleep(phase);
        let killed = Instant::now();
        match nft.as_mut() {
            None => drop(listener),
            Some(nft) => {
                use std::io::Write as _;
                let mut stdin = nft.stdin.take().context("nft stdin")?;
                stdin.write_all(
                    b"table inet lbt {\n chain in {\n type filter hook input priority 0; policy drop;\n }\n}\n",
                )?;
                drop(stdin);
                let status = nft.wait()?;
                anyhow::ensure!(status.success(), "nft: {status}");
            }
        }
        let kill_took = killed.elapsed();
        let _ = killed_tx.send(killed);
        let (verdict_at, killed) = probing
            .join()
            .map_err(|_| anyhow::anyhow!("probing thread panicked"))??;
        if death == Death::Silent {
            backend_ns.clear_input_chain()?;
        }
        anyhow::Ok(Trial {
            detected: verdict_at.saturating_duration_since(killed),
            kill_took,
        })
    });
    if verdict.is_err() && death == Death::Silent {
        let _ = backend_ns.clear_input_chain();
    }
    verdict
}
