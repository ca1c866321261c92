//! The side-by-side benchmarks behind `cargo xtask bench` (binary `peer_bench`): packet rate
//! through lb with a live-frames generator against an XDP bounce, end to end against direct
//! routing, nftables DNAT, HAProxy and nginx, health-check detection beside HAProxy's, Maglev
//! build time and disruption; the markdown report and its charts.
//!
//! Every process a benchmark starts runs inside its namespaces, is stopped by PID when its guard
//! drops (and gets SIGTERM if the benchmark dies first), and all traffic stays in the namespaces.

pub mod bpf;
pub mod chart;
pub mod cluster;
pub mod config_write;
pub mod cpu;
pub mod detect;
pub mod e2e;
pub mod health_cost;
pub mod katran;
pub mod maglev;
pub mod peers;
pub mod rate;

use std::{
    net::SocketAddr,
    os::unix::process::CommandExt as _,
    process::Command,
    sync::atomic::{AtomicBool, Ordering},
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};

use crate::netns::{Netns, Process};

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::SeqCst);
}

/// Ctrl-C and SIGTERM only set a flag that [`checkpoint`] turns into an error, so every guard
/// still gets to clean up.
pub fn catch_signals() {
    for sig in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: the handler only stores to an atomic.
        unsafe { libc::signal(sig, on_signal as *const () as libc::sighandler_t) };
    }
}

pub fn checkpoint() -> anyhow::Result<()> {
    if INTERRUPTED.load(Ordering::SeqCst) {
        bail!("interrupted");
    }
    Ok(())
}

/// Sleeps, waking early (with an error) when interrupted.
pub fn sleep(d: Duration) -> anyhow::Result<()> {
    let end = Instant::now() + d;
    while Instant::now() < end {
        checkpoint()?;
        std::thread::sleep((end - Instant::now()).min(Duration::from_millis(50)));
    }
    checkpoint()
}

/// Starts a long-running program (a server) in `ns` with its output in `log`; SIGTERM, then
/// SIGKILL, by PID when the guard drops. It also gets SIGTERM if this process dies first.
/// Call from the main thread: the kernel sends that signal when the spawning *thread* exits.
pub fn spawn_server(
    ns: &Netns,
    program: &str,
    args: &[&str],
    log: &std::path::Path,
) -> anyhow::Result<Process> {
    let mut cmd = ns.command(program);
    cmd.args(args)
        .stdout(std::fs::File::create(log)?)
        .stderr(std::fs::File::create(log.with_extension("err"))?);
    // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    ns.spawn(&mut cmd)
}

/// Waits until a TCP connection to `addr` from `ns` succeeds; on failure the error carries the
/// server's log (`log` and its `.err` companion, as [`spawn_server`] writes them).
pub fn wait_listening(
    ns: &Netns,
    addr: SocketAddr,
    what: &str,
    log: &std::path::Path,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        checkpoint()?;
        if ns
            .enter(|| std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200)))
            .is_ok()
        {
            return Ok(());
        }
        if Instant::now() > deadline {
            let read = |p: &std::path::Path| std::fs::read_to_string(p).unwrap_or_default();
            bail!(
                "{what} does not accept connections on {addr} after 10 s:\n{}{}",
                read(log),
                read(&log.with_extension("err"))
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Runs a command to completion with a time limit; (status success, stdout, stderr).
pub fn run_limited(cmd: &mut Command, limit: Duration) -> anyhow::Result<(bool, String, String)> {
    let mut child = cmd
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .with_context(|| format!("cannot start {cmd:?}"))?;
    let pid = child.id();
    // Read both pipes on threads so a chatty child cannot block on a full pipe.
    let mut out = child.stdout.take().context("stdout")?;
    let mut err = child.stderr.take().context("stderr")?;
    let out_t = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut out, &mut s); // partial output is still useful
        s
    });
    let err_t = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut err, &mut s); // partial output is still useful
        s
    });
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break Some(status);
        }
        if Instant::now() > deadline || INTERRUPTED.load(Ordering::SeqCst) {
            // SAFETY: signalling our own child by pid.
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            let _ = child.wait(); // reaped; the result is the error below
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let (out, err) = (
        out_t.join().unwrap_or_default(),
        err_t.join().unwrap_or_default(),
    );
    checkpoint()?;
    let Some(status) = status else {
        bail!("{cmd:?} did not finish within {limit:?}\n{out}{err}");
    };
    Ok((status.success(), out, err))
}

/// Median of the samples (mean of the middle two for an even count); NaN when empty.
pub fn median(samples: &[f64]) -> f64 {
    let mut s: Vec<f64> = samples.iter().copied().filter(|v| v.is_finite()).collect();
    if s.is_empty() {
        return f64::NAN;
    }
    s.sort_by(f64::total_cmp);
    let n = s.len();
    if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    }
}

pub fn min_max(samples: &[f64]) -> (f64, f64) {
    samples
        .iter()
        .copied()
        .filter(|v| v.is_finite())
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
            (lo.min(v), hi.max(v))
        })
}

/// (1-minute load average, runnable tasks) from /proc/loadavg: how busy the machine was.
pub fn load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// Busy and total jiffies of all CPUs (/proc/stat), to tell how loaded the machine was during a
/// phase.
pub fn cpu_jiffies() -> (u64, u64) {
    let text = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let Some(line) = text.lines().find(|l| l.starts_with("cpu ")) else {
        return (0, 0);
    };
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    let total: u64 = v.iter().take(8).sum();
    let idle = v.get(3).copied().unwrap_or(0) + v.get(4).copied().unwrap_or(0);
    (total - idle, total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        assert!(median(&[]).is_nan());
        assert_eq!(min_max(&[2.0, f64::NAN, 5.0, 1.0]), (1.0, 5.0));
    }
}
