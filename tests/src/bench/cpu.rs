//! The balancer's own CPU in the end-to-end runs. Client, balancer and backend share the
//! machine's CPUs, and a veth's receive work (its NAPI poll) normally runs as a softirq on top of
//! whatever task is on the CPU (this kernel has no IRQ time accounting, so the task is charged),
//! which makes neither /proc/stat nor a process's time say whose work it was. Threaded NAPI moves
//! each veth's poll into a kernel thread of its own (`napi/<ifname>-<id>`) that the scheduler
//! accounts exactly, whatever else runs. The balancer's part of the path is then:
//!
//! - the NAPI threads of the balancer's two interfaces: lb's XDP program and its redirect into
//!   the other interface; the kernel's GRO, forwarding, conntrack and NAT for direct routing and
//!   nft; the proxies' TCP receive work up to their sockets (and the ACKs it sends);
//! - the tasks of the balancer's own processes in its namespace (lb, HAProxy, nginx): their system
//!   calls, copies and the sends of the proxies' second connections.
//!
//! The far ends of the balancer's links are threaded too, so the next hop's receive work, which a
//! transmit from the balancer wakes, runs in their threads rather than in the balancer's.

use std::{
    collections::BTreeMap,
    os::unix::fs::MetadataExt as _,
    path::{Path, PathBuf},
};

use anyhow::{Context as _, bail};

use crate::{
    netns::{Port, set_gro, sh},
    topology::Sandbox,
};

/// Threaded NAPI on the balancer's links while it lives, after GRO on for the balancer's
/// interfaces (a veth has a NAPI poll only with GRO or an XDP program, and the paths without XDP
/// need one to be threaded); both back off when dropped. Only for the CPU rounds: it changes the
/// throughput (a wake-up of a thread per poll instead of a softirq run in place).
pub struct Threaded<'a> {
    sb: &'a Sandbox,
}

impl<'a> Threaded<'a> {
    /// Fails unless every one of the balancer's interfaces then has its NAPI thread.
    pub fn on(sb: &'a Sandbox) -> anyhow::Result<Self> {
        let guard = Self { sb };
        guard.set(true)?;
        for i in sb.lb_interfaces() {
            napi_threads(&i)?;
        }
        Ok(guard)
    }

    fn set(&self, on: bool) -> anyhow::Result<()> {
        // GRO first on, last off: a veth end has a NAPI instance to thread only with it.
        if on {
            for p in &self.sb.lb_ports {
                set_gro(p, true)?;
            }
        }
        for p in self.sb.lb_ports.iter().chain(&self.sb.lb_peers) {
            threaded(p, on)?;
        }
        if !on {
            for p in &self.sb.lb_ports {
                set_gro(p, false)?;
            }
        }
        Ok(())
    }
}

impl Drop for Threaded<'_> {
    fn drop(&mut self) {
        if let Err(e) = self.set(false) {
            eprintln!("warning: turning threaded NAPI off: {e:#}");
        }
    }
}

/// Whether kernel thread `thread` (its `comm`) is a NAPI thread of `ifname`: named
/// `napi/IFNAME-ID`, cut to 15 characters by the kernel.
fn napi_of(thread: &str, ifname: &str) -> bool {
    let want: String = format!("napi/{ifname}-").chars().take(15).collect();
    thread.starts_with(&want)
}

fn threaded(port: &Port, on: bool) -> anyhow::Result<()> {
    let file = format!("/sys/class/net/{}/threaded", port.ifname);
    let value = u8::from(on);
    // `ip netns exec` mounts the namespace's own /sys.
    sh(port
        .ns
        .command("sh")
        .args(["-c", &format!("echo {value} > {file}")]))
    .with_context(|| format!("threaded NAPI {value} on {}", port.ifname))?;
    Ok(())
}

/// Turns on GRO (which gives a veth end a NAPI instance) and threaded NAPI for `port`; returns
/// its NAPI threads' ids. (Left on: the port's namespace goes with the run.)
pub fn threaded_napi(port: &Port) -> anyhow::Result<Vec<u32>> {
    set_gro(port, true)?;
    threaded(port, true)?;
    napi_threads(&port.ifname)
}

/// The ids of `ifname`'s NAPI threads; an error when it has none (threaded NAPI is off).
fn napi_threads(ifname: &str) -> anyhow::Result<Vec<u32>> {
    let threads: Vec<u32> = pids()
        .filter(|(_, dir)| comm(dir).is_some_and(|c| napi_of(&c, ifname)))
        .map(|(pid, _)| pid)
        .collect();
    if threads.is_empty() {
        bail!("no NAPI thread for {ifname}");
    }
    Ok(threads)
}

/// Reads the CPU time of the balancer's NAPI threads and of its processes with given names.
pub struct Meter {
    ifnames: Vec<String>,
    /// The balancer namespace's inode (what /proc/PID/ns/net points to).
    netns: u64,
    comms: Vec<String>,
}

/// CPU time spent between two [`Meter::read`]s, in seconds.
#[derive(Clone, Copy, Debug, Default)]
pub struct Spent {
    /// In the balancer's NAPI threads (kernel).
    pub napi: f64,
    /// In the balancer's processes.
    pub process: f64,
}

impl Spent {
    pub fn total(self) -> f64 {
        self.napi + self.process
    }
}

/// Per task (kernel thread or process thread): id, whether NAPI, CPU nanoseconds.
#[derive(Clone, Debug, Default)]
pub struct Reading(BTreeMap<u32, (bool, u64)>);

impl Reading {
    /// Time spent since `before`; tasks that started in between count from zero.
    pub fn since(&self, before: &Reading) -> Spent {
        let mut s = Spent::default();
        for (tid, &(napi, ns)) in &self.0 {
            let d = ns.saturating_sub(before.0.get(tid).map_or(0, |v| v.1)) as f64 / 1e9;
            if napi {
                s.napi += d;
            } else {
                s.process += d;
            }
        }
        s
    }
}

impl Meter {
    /// The balancer namespace's NAPI threads and its processes named one of `comms`.
    pub fn new(sb: &Sandbox, comms: &[&str]) -> anyhow::Result<Self> {
        let path = format!("/run/netns/{}", sb.lb.name());
        Ok(Self {
            ifnames: sb.lb_interfaces(),
            netns: std::fs::metadata(&path)
                .with_context(|| format!("stat {path}"))?
                .ino(),
            comms: comms.iter().map(|c| (*c).to_owned()).collect(),
        })
    }

    pub fn read(&self) -> Reading {
        let mut r = BTreeMap::new();
        for (pid, dir) in pids() {
            let Some(comm) = comm(&dir) else { continue };
            if self.ifnames.iter().any(|i| napi_of(&comm, i)) {
                if let Some(ns) = runtime(&dir) {
                    r.insert(pid, (true, ns));
                }
            } else if self.comms.contains(&comm)
                && std::fs::metadata(dir.join("ns/net")).is_ok_and(|m| m.ino() == self.netns)
            {
                // Every thread of the process (HAProxy runs one per CPU).
                let Ok(tasks) = std::fs::read_dir(dir.join("task")) else {
                    continue;
                };
                for t in tasks.filter_map(Result::ok) {
                    let tid = t.file_name().to_string_lossy().parse::<u32>().ok();
                    if let (Some(tid), Some(ns)) = (tid, runtime(&t.path())) {
                        r.insert(tid, (false, ns));
                    }
                }
            }
        }
        Reading(r)
    }
}

/// The kernel's run time of the XDP programs on the balancer's interfaces (BPF_ENABLE_STATS:
/// the program alone, without the veth's receive and redirect around it, so a lower bound of the
/// balancer's CPU). Statistics stay on, for every BPF program on the machine (two clock reads per
/// run), only while this lives.
pub struct XdpStats {
    _enabled: std::os::fd::OwnedFd,
    ids: Vec<u32>,
}

impl XdpStats {
    pub fn start(sb: &Sandbox) -> anyhow::Result<Self> {
        let mut ids = Vec::new();
        for i in sb.lb_interfaces() {
            let out = sb.lb.ip(&["-d", "link", "show", "dev", &i])?;
            let id = out
                .split("prog/xdp id ")
                .nth(1)
                .and_then(|r| r.split_whitespace().next()?.parse::<u32>().ok())
                .with_context(|| format!("no XDP program on {i}: {out}"))?;
            if !ids.contains(&id) {
                ids.push(id);
            }
        }
        let enabled =
            aya::sys::enable_stats(aya::sys::Stats::RunTime).context("BPF_ENABLE_STATS")?;
        Ok(Self {
            _enabled: enabled,
            ids,
        })
    }

    /// Nanoseconds the programs have run while statistics were on.
    pub fn run_time_ns(&self) -> u64 {
        aya::programs::loaded_programs()
            .filter_map(Result::ok)
            .filter(|p| self.ids.contains(&p.id()))
            .map(|p| p.run_time().as_nanos() as u64)
            .sum()
    }
}

fn pids() -> impl Iterator<Item = (u32, PathBuf)> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .filter_map(|e| {
            let pid = e.file_name().to_string_lossy().parse::<u32>().ok()?;
            Some((pid, e.path()))
        })
}

fn comm(dir: &Path) -> Option<String> {
    std::fs::read_to_string(dir.join("comm"))
        .ok()
        .map(|s| s.trim_end().to_owned())
}

/// The task's CPU time in nanoseconds: the first field of `schedstat` (the scheduler's own
/// sum of run time, not tick samples).
fn runtime(dir: &Path) -> Option<u64> {
    std::fs::read_to_string(dir.join("schedstat"))
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn napi_thread_names() {
        assert!(napi_of("napi/v12x3a-258", "v12x3a"));
        assert!(!napi_of("napi/v12x3ab-258", "v12x3a"));
        assert!(!napi_of("napi/v12x31a-258", "v12x3"));
        assert!(!napi_of("kworker/v12x3a-258", "v12x3a"));
        // Cut to 15 characters: the id, or more, is gone.
        assert!(napi_of("napi/v123456x25", "v123456x25b"));
        assert!(!napi_of("napi/v123456x26", "v123456x25b"));
    }

    #[test]
    fn spent_counts_new_tasks_from_zero() {
        let before = Reading(BTreeMap::from([(1, (true, 100)), (2, (false, 50))]));
        let after = Reading(BTreeMap::from([
            (1, (true, 1_000_000_100)),
            (2, (false, 500_000_050)),
            (3, (false, 250_000_000)),
        ]));
        let s = after.since(&before);
        assert!((s.napi - 1.0).abs() < 1e-9);
        assert!((s.process - 0.75).abs() < 1e-9);
    }
}
