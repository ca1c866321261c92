//! `cargo xtask bench` (health part): probes per second and checker CPU for 1,000 and 10,000
//! half-open TCP targets at a 1 s interval. The targets are addresses of a namespace that owns a
//! whole /16 (a local route), where one listener makes the kernel answer every SYN; the checker
//! runs in-process, so the process CPU time is the checker's.

use std::{fmt::Write as _, net::TcpListener, path::PathBuf, time::Duration};

use anyhow::Context as _;
use clap::Parser;
use lb_tests::netns::{Netns, veth};
use tokio::sync::{mpsc, watch};

#[derive(Parser)]
struct Args {
    /// Seconds measured per size (after a warm-up of 3 s).
    #[arg(long, default_value_t = 10)]
    seconds: u64,
    /// Also write the table (markdown) to this file.
    #[arg(long)]
    out: Option<PathBuf>,
}

fn cpu_seconds() -> f64 {
    // SAFETY: getrusage fills the struct.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: valid pointer.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let t = |tv: libc::timeval| tv.tv_sec as f64 + tv.tv_usec as f64 / 1e6;
    t(ru.ru_utime) + t(ru.ru_stime)
}

fn config(targets: usize) -> String {
    let backends: Vec<String> = (0..targets)
        .map(|i| format!("{{ address = \"10.50.{}.{}:8080\" }}", i / 250, 1 + i % 250))
        .collect();
    format!(
        "[lb]\ninterfaces = [\"unused0\"]\nmax_backends = 16384\n\n[[service]]\nname = \"many\"\n\
         vip = \"10.100.0.1:80\"\nbackends = [{}]\n[service.check]\nkind = \"tcp\"\ntimeout = \"500ms\"\n\
         interval = \"1s\"\n",
        backends.join(", ")
    )
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    lb_tests::require_root();
    let checker_ns = Netns::new("hb-checker")?;
    let targets_ns = Netns::new("hb-targets")?;
    veth(&checker_ns, "10.49.0.1/16", &targets_ns, "10.49.0.2/16")?;
    targets_ns.ip(&["route", "add", "local", "10.50.0.0/16", "dev", "lo"])?;
    checker_ns.ip(&["route", "add", "10.50.0.0/16", "via", "10.49.0.2"])?;
    // Kernel answers the SYNs; nobody ever accepts (half-open probes never complete).
    let _listener = targets_ns
        .enter(|| TcpListener::bind("0.0.0.0:8080"))
        .context("listener")?;

    let mut table = String::from(
        "Health checking cost: half-open TCP probes at a 1 s interval, in-process checker\n\n\
         | targets | probes/s | CPU (% of one core) | CPU µs per probe |\n|---:|---:|---:|---:|\n",
    );
    for targets in [1000usize, 10000] {
        let config = lb::config::parse(&config(targets)).map_err(|e| anyhow::anyhow!("{e}"))?;
        let (probes, cpu, wall) = checker_ns.enter(|| -> anyhow::Result<(u64, f64, f64)> {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()?;
            rt.block_on(async {
                let (tx, mut rx) = mpsc::unbounded_channel();
                let (stop_tx, stop_rx) = watch::channel(false);
                let checker = lb::health::checker::spawn(&config, tx, stop_rx)?;
                let drain = tokio::spawn(async move { while rx.recv().await.is_some() {} });
                tokio::time::sleep(Duration::from_secs(3)).await;
                let (p0, c0, t0) = (checker.probes(), cpu_seconds(), std::time::Instant::now());
                tokio::time::sleep(Duration::from_secs(args.seconds)).await;
                let (p1, c1, wall) = (checker.probes(), cpu_seconds(), t0.elapsed().as_secs_f64());
                stop_tx.send_replace(true);
                checker.join().await;
                drain.abort();
                Ok((p1 - p0, c1 - c0, wall))
            })
        })?;
        let rate = probes as f64 / wall;
        let _ = writeln!(
            table,
            "| {targets} | {rate:.0} | {:.1} | {:.1} |",
            100.0 * cpu / wall,
            1e6 * cpu / probes.max(1) as f64
        );
    }
    print!("{table}");
    if let Some(out) = args.out {
        std::fs::write(&out, &table).with_context(|| format!("writing {}", out.display()))?;
    }
    Ok(())
}
