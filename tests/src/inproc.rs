//! The datapath run in-process on a [`Sandbox`]: the test holds the [`Balancer`], so it can flip
//! health flags, drain and watch counters directly (what the daemon's health checker will do).

use std::{
    collections::BTreeSet,
    net::IpAddr,
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};
use lb::{
    balancer::Balancer,
    config::{self, Config},
    dataplane::{Dataplane, Stats},
};

use crate::topology::Sandbox;

pub struct InProcess {
    pub dp: Dataplane,
    pub balancer: Balancer,
    pub config: Config,
}

impl InProcess {
    /// Loads the datapath in the sandbox's balancer namespace with `config_text` and attaches it.
    pub fn start(sb: &Sandbox, config_text: &str) -> anyhow::Result<Self> {
        let config = config::parse(config_text).map_err(|e| anyhow::anyhow!("{e}"))?;
        // The backends the config uses, of either family.
        let backends: BTreeSet<IpAddr> = config
            .services
            .iter()
            .flat_map(|s| s.backends.iter().map(|b| b.address.ip()))
            .collect();
        let (dp, balancer) = sb.lb.enter(|| -> anyhow::Result<_> {
            let (mut dp, balancer) = lb::daemon::prepare(&config)?;
            lb::daemon::resolve_neighbours(&backends);
            for iface in &config.lb.interfaces {
                dp.attach(iface, config.lb.xdp_mode)?;
            }
            Ok((dp, balancer))
        })?;
        wait_for_neighbours(sb, &backends)?;
        Ok(Self {
            dp,
            balancer,
            config,
        })
    }

    pub fn stats(&self) -> Stats {
        self.dp.stats().expect("stats")
    }

    /// Health flag of backend `b` of service `s` (both services share the backend list).
    pub fn set_up(&mut self, s: usize, b: usize, up: bool) {
        self.balancer
            .set_up(s, b, up, &mut self.dp)
            .expect("set_up");
    }

    pub fn set_drained(&mut self, s: usize, b: usize, drained: bool) {
        self.balancer
            .set_drained(s, b, drained, &mut self.dp)
            .expect("set_drained");
    }
}

/// Waits until the balancer's kernel knows every backend's MAC (the datapath only reads it).
pub fn wait_for_neighbours(sb: &Sandbox, addrs: &BTreeSet<IpAddr>) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let table = sb.lb.ip(&["neigh", "show"])?;
        let resolved = |a: &IpAddr| {
            table.lines().any(|l| {
                l.starts_with(&format!("{a} ")) && l.contains("lladdr") && !l.contains("FAILED")
            })
        };
        if addrs.iter().all(resolved) {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("backend neighbours not resolved:\n{table}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Raises this process's open-file limit to `want`, or as far as the hard limit allows (raising
/// that needs CAP_SYS_RESOURCE, which a container may not grant). Returns the limit in force.
pub fn raise_fd_limit(want: u64) -> anyhow::Result<u64> {
    let mut rl = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: valid pointer.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl) } != 0 {
        return Err(std::io::Error::last_os_error()).context("getrlimit");
    }
    for (cur, max) in [
        (want, rl.rlim_max.max(want)),
        (want.min(rl.rlim_max), rl.rlim_max),
    ] {
        let new = libc::rlimit {
            rlim_cur: cur.max(rl.rlim_cur),
            rlim_max: max,
        };
        // SAFETY: valid pointer.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &new) } == 0 {
            return Ok(new.rlim_cur);
        }
    }
    Err(std::io::Error::last_os_error()).context("setrlimit")
}
