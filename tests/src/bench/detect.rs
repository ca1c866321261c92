//! Health-check detection time (part 4): how long after a backend dies each balancer stops
//! considering it available. lb (`kind = "tcp"`, interval 1 s, timeout 1 s, unhealthy_threshold 3,
//! healthy_threshold 2) and HAProxy (`check inter 1s fall 3 rise 2`) check the same backend port
//! at the same time; each trial stops the backend's server (its port then answers RST, so every
//! probe fails at once) and polls both until they report it down: lb's `lb status` state
//! `unhealthy`, HAProxy's `show stat` status `DOWN` on its stats socket.
//!
//! Both rules give the same window: the first failed check comes a uniformly random phase
//! within one interval after the kill, then two more at the interval, so detection takes
//! between 2 and 3 s (lb adds up to 5% of random jitter to each interval).

use std::{
    fmt::Write as _,
    net::SocketAddr,
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};

use crate::{
    bench::{checkpoint, e2e::Bed, e2e::SERVICE_PORT, e2e::Target, median, min_max, peers, sleep},
    daemon::Daemon,
};

pub struct Detection {
    pub trials: usize,
    /// Seconds from the kill to "down", per trial.
    pub lb: Vec<f64>,
    pub haproxy: Vec<f64>,
    /// Mean time one poll of each took (the measurement's resolution), seconds.
    pub lb_poll_s: f64,
    pub haproxy_poll_s: f64,
    pub failures: Vec<String>,
}

const INTERVAL_S: f64 = 1.0;
const FALL: u32 = 3;

/// A small pseudo-random delay source (no dependency for one number per trial).
fn jitter_ms(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state % 1000
}

pub fn run(bed: &mut Bed, trials: usize) -> anyhow::Result<Detection> {
    let backend = SocketAddr::from((bed.backend(), SERVICE_PORT));
    let hvip = SocketAddr::from((Target::Haproxy.vip().expect("a VIP"), SERVICE_PORT));
    let haproxy = peers::haproxy(
        &bed.sb.lb,
        &bed.dir.0,
        "haproxy-check",
        &[("hc", hvip, backend, "check inter 1s fall 3 rise 2")],
    )?;
    let config = format!(
        "[lb]\ninterfaces = [{}]\nxdp_mode = \"native\"\n\n[[service]]\nname = \"hc\"\n\
         vip = \"{}:{SERVICE_PORT}\"\nbackends = [{{ address = \"{backend}\" }}]\n\
         [service.check]\nkind = \"tcp\"\ninterval = \"1s\"\ntimeout = \"1s\"\n\
         unhealthy_threshold = {FALL}\nhealthy_threshold = 2\n",
        bed.sb.interfaces_toml(),
        Target::Lb.vip().expect("a VIP")
    );
    let daemon = Daemon::start(&bed.sb.lb, &config)?;
    let key = backend.to_string();
    let lb_state = |d: &Daemon| -> anyhow::Result<String> {
        let s = d.status()?;
        Ok(s.service("hc")
            .and_then(|s| s.backend(&key))
            .map(|b| b.state.to_string())
            .unwrap_or_default())
    };
    let mut r = Detection {
        trials,
        lb: Vec::new(),
        haproxy: Vec::new(),
        lb_poll_s: 0.0,
        haproxy_poll_s: 0.0,
        failures: Vec::new(),
    };
    let (mut lb_polls, mut lb_poll_t, mut h_polls, mut h_poll_t) = (0u32, 0.0, 0u32, 0.0);
    let mut seed = u64::from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.subsec_nanos())
            | 1,
    );
    for trial in 1..=trials {
        checkpoint()?;
        // Both must see the backend up (lb: healthy; HAProxy: UP, not "UP 1/3").
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            checkpoint()?;
            let (l, h) = (lb_state(&daemon)?, haproxy.server_status("hc")?);
            if l == "healthy" && h == "UP" {
                break;
            }
            if Instant::now() > deadline {
                bail!("trial {trial}: backend not up after 20 s (lb {l}, HAProxy {h})");
            }
            sleep(Duration::from_millis(50))?;
        }
        // A random phase against both checkers' schedules.
        sleep(Duration::from_millis(jitter_ms(&mut seed)))?;
        let killed = Instant::now();
        bed.sb.stop_backend(0);
        let (mut lb_at, mut h_at) = (None, None);
        while lb_at.is_none() || h_at.is_none() {
            checkpoint()?;
            if killed.elapsed() > Duration::from_secs(10) {
                r.failures.push(format!(
                    "trial {trial}: not down after 10 s (lb {lb_at:?}, HAProxy {h_at:?})"
                ));
                break;
            }
            if lb_at.is_none() {
                let t = Instant::now();
                let down = lb_state(&daemon)? == "unhealthy";
                lb_poll_t += t.elapsed().as_secs_f64();
                lb_polls += 1;
                if down {
                    lb_at = Some(killed.elapsed().as_secs_f64());
                }
            }
            if h_at.is_none() {
                let t = Instant::now();
                let down = haproxy.server_status("hc")?.starts_with("DOWN");
                h_poll_t += t.elapsed().as_secs_f64();
                h_polls += 1;
                if down {
                    h_at = Some(killed.elapsed().as_secs_f64());
                }
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        eprintln!("  trial {trial}/{trials}: lb {lb_at:.3?} s, HAProxy {h_at:.3?} s");
        r.lb.extend(lb_at);
        r.haproxy.extend(h_at);
        bed.sb
            .start_backend(0)
            .context("restarting the backend's server")?;
    }
    r.lb_poll_s = lb_poll_t / f64::from(lb_polls.max(1));
    r.haproxy_poll_s = h_poll_t / f64::from(h_polls.max(1));
    Ok(r)
}

/// The formula's window for a killed backend (RST: failures at once): [lo, hi) seconds.
pub fn window() -> (f64, f64) {
    (
        f64::from(FALL - 1) * INTERVAL_S,
        f64::from(FALL) * INTERVAL_S,
    )
}

pub fn markdown(r: &Detection) -> String {
    let mut s = String::new();
    let (lo, hi) = window();
    let _ = writeln!(
        s,
        "{} trials; seconds from stopping the backend's server to the balancer reporting it down.\n\n\
         | balancer | check | median | min – max | formula | poll resolution |\n|---|---|---:|---:|---:|---:|",
        r.trials
    );
    for (name, check, v, poll, formula) in [
        (
            "lb",
            "`kind = \"tcp\"` (half-open), interval 1 s, timeout 1 s, unhealthy_threshold 3",
            &r.lb,
            r.lb_poll_s,
            format!("{lo:.1} – {:.2} (+5% jitter)", hi * 1.05),
        ),
        (
            "HAProxy",
            "`check inter 1s fall 3 rise 2` (TCP connect)",
            &r.haproxy,
            r.haproxy_poll_s,
            format!("{lo:.1} – {hi:.1}"),
        ),
    ] {
        let (a, b) = min_max(v);
        let _ = writeln!(
            s,
            "| {name} | {check} | {:.2} | {a:.2} – {b:.2} | {formula} | {:.0} ms |",
            median(v),
            poll * 1e3
        );
    }
    let all: Vec<String> =
        r.lb.iter()
            .zip(&r.haproxy)
            .map(|(l, h)| format!("{l:.2}/{h:.2}"))
            .collect();
    let _ = writeln!(s, "\nPer trial (lb/HAProxy, s): {}.", all.join(", "));
    for f in &r.failures {
        let _ = writeln!(s, "\n- {f}");
    }
    s
}
