//! The command line. Client subcommands talk to the daemon's control API.

pub mod changes;
pub use changes::{BackendCommand, ConfigCommand, ServiceCommand};

use std::{
    net::{IpAddr, SocketAddr},
    path::PathBuf,
};

use anyhow::bail;
use clap::{Args, Parser, Subcommand, ValueEnum};
use lb_common::counter;

use crate::{
    client, config, decap, exit,
    model::{
        AdminReply, ErrorReply, Event, Events, HostReply, ReloadReply, Status, StopReply, TraceLine,
    },
};

#[derive(Debug, Parser)]
#[command(name = "lb", version, about = "XDP L4 load balancer")]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

/// How client commands reach the daemon.
#[derive(Debug, Clone, Args)]
pub struct ApiArgs {
    /// Control API address of the daemon.
    #[arg(long, default_value = config::DEFAULT_API, global = true)]
    pub api: SocketAddr,
    /// Bearer token of the admin endpoints (needed when the daemon listens beyond loopback).
    #[arg(long, env = "LB_API_TOKEN", hide_env_values = true, global = true)]
    pub token: Option<String>,
    /// Print the daemon's JSON reply instead of a table.
    #[arg(long, global = true)]
    pub json: bool,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the balancer: attach the XDP program, run the checks and serve the control API.
    /// SIGHUP reloads the config. SIGINT/SIGTERM exit leaving the pinned datapath forwarding
    /// (the next `lb run` adopts it); `lb stop` removes everything.
    Run {
        /// The config file (TOML; docs/configuration.md).
        #[arg(long, short)]
        config: PathBuf,
        /// Do not pin the datapath: it is removed when the daemon exits.
        #[arg(long)]
        no_pin: bool,
        #[command(flatten)]
        source: SourceArgs,
    },
    /// Validate a config file; prints every problem with its path and exits 64 if there are any.
    CheckConfig {
        /// The config file to check.
        file: PathBuf,
    },
    /// Health and traffic of every service (or one): state, counters, windows.
    Status {
        /// Only this service (by name).
        service: Option<String>,
        #[command(flatten)]
        api: ApiArgs,
    },
    /// Health events: the recent ones, or (--follow) as they happen.
    Events {
        /// Keep printing events as they happen.
        #[arg(long, short)]
        follow: bool,
        /// Only events after this sequence number.
        #[arg(long, default_value_t = 0)]
        after: u64,
        #[command(flatten)]
        api: ApiArgs,
    },
    /// Trace the datapath's decisions as they happen (new flows with their backend and SNAT
    /// port, flows rescheduled or re-created mid-stream, packets dropped and why) until Ctrl-C,
    /// or for --for. The datapath traces only while this runs (at most 10 minutes), and pays
    /// nothing otherwise. Needs the admin token where admin endpoints do.
    Trace {
        /// Only this service's packets (by name).
        #[arg(long)]
        service: Option<String>,
        /// Only this client's packets: an address, or ADDR/PREFIX.
        #[arg(long, value_name = "ADDR")]
        client: Option<String>,
        /// Stop after this long (e.g. 30s, 5m; at most 10m, the default).
        #[arg(long = "for", value_name = "DURATION", value_parser = trace_duration)]
        duration: Option<std::time::Duration>,
        #[command(flatten)]
        api: ApiArgs,
    },
    /// Add, change or remove a backend of a service (written into the config file), or drain,
    /// enable or disable it (the daemon's runtime setting).
    #[command(subcommand)]
    Backend(BackendCommand),
    /// Add, change or remove a service (written into the config file, then applied).
    #[command(subcommand)]
    Service(ServiceCommand),
    /// The configuration running: show it, or what a reload of a file would change.
    #[command(subcommand)]
    Config(ConfigCommand),
    /// Withdraw every VIP this host announces (route health injection) and keep forwarding:
    /// the routers move the traffic to the other lb hosts (maintenance). Kept across restarts
    /// of the pinned datapath until `lb undrain-host`.
    DrainHost {
        #[command(flatten)]
        api: ApiArgs,
    },
    /// Announce the VIPs again, each as its services want (after `lb drain-host`).
    UndrainHost {
        #[command(flatten)]
        api: ApiArgs,
    },
    /// Make the daemon read its config file again and apply it without losing flows.
    Reload {
        #[command(flatten)]
        api: ApiArgs,
    },
    /// Stop the daemon and remove the datapath (pinned or not); with [lb.announce], every VIP
    /// is withdrawn first and lb keeps forwarding for the grace period. When no daemon
    /// answers, remove a pinned datapath left behind at --pin-path (and the routes it
    /// announced).
    Stop {
        /// The pinned datapath's bpffs directory (the config's `pin_path`), for when no daemon
        /// answers [default: /sys/fs/bpf/lb in the host's network namespace,
        /// /sys/fs/bpf/lb-netns-INODE in any other]
        #[arg(long, value_name = "DIR")]
        pin_path: Option<PathBuf>,
        #[command(flatten)]
        api: ApiArgs,
    },
    /// Datapath counters of the running daemon.
    Stats {
        #[command(flatten)]
        api: ApiArgs,
    },
    /// Set up the backend's side of direct server return on a host without tunnel devices: an
    /// XDP program that takes IP-in-IP and GUE packets sent to this host out of their outer
    /// header and passes the inner packet to the stack (for a VIP on `lo`); everything else
    /// passes untouched. Exits once attached: what it sets up stays (pinned) until
    /// `lb decap --stop`. Run again, it updates addresses and parameters in place.
    Decap(DecapArgs),
    /// Print the completion script of a shell (e.g. `lb completions bash >
    /// /usr/share/bash-completion/completions/lb`).
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
    /// Print the man page (roff), or write lb.1 and a page per subcommand into a directory.
    Man {
        /// Write the pages into this directory instead of printing lb(1).
        #[arg(long)]
        out_dir: Option<PathBuf>,
    },
}

/// Where `lb run` finds its services: the config file (the default), or etcd.
#[derive(Debug, Clone, Args)]
pub struct SourceArgs {
    /// The services from etcd, shared by several hosts: etcd://HOST:PORT[,HOST:PORT...]/PREFIX
    /// (the TOML document of the services is the key PREFIX/config; --config then holds this
    /// host's [lb] only). Every host applies each new revision; changes through the API are
    /// written there.
    #[arg(long, value_name = "URL")]
    pub config_source: Option<String>,
    /// etcd over TLS: the CA (PEM) that signed its servers' certificates.
    #[arg(long, value_name = "FILE", requires = "config_source")]
    pub etcd_ca: Option<PathBuf>,
    /// The client certificate (PEM) for etcd servers that ask for one.
    #[arg(long, value_name = "FILE", requires_all = ["etcd_ca", "etcd_key"])]
    pub etcd_cert: Option<PathBuf>,
    /// The client certificate's key (PEM).
    #[arg(long, value_name = "FILE", requires = "etcd_cert")]
    pub etcd_key: Option<PathBuf>,
    /// etcd's user (the password from LB_ETCD_PASSWORD).
    #[arg(long, value_name = "NAME", requires = "config_source")]
    pub etcd_user: Option<String>,
}

/// `lb decap`'s arguments: a set-up (`--interface ...`), `--stop` or `--stats`.
#[derive(Debug, Clone, Args)]
pub struct DecapArgs {
    /// An interface to attach to; repeat it for several. Interfaces a previous `lb decap` of
    /// this --pin-path was attached to and that are not listed again are detached.
    #[arg(
        long = "interface",
        short,
        value_name = "IF",
        required_unless_present_any = ["stop", "stats"]
    )]
    pub interfaces: Vec<String>,
    /// GUE's UDP destination port: outer IP and UDP to this port, the inner packet right after
    /// the UDP header (GUE variant 1).
    #[arg(
        long,
        value_name = "PORT",
        default_value_t = lb_common::DEFAULT_GUE_PORT,
        value_parser = clap::value_parser!(u16).range(1..)
    )]
    pub gue_port: u16,
    /// Strict destination with these outer destinations (repeat for several) instead of every
    /// address of this host (all interfaces of the network namespace, read when lb decap runs;
    /// run it again after adding one).
    #[arg(
        long = "address",
        value_name = "ADDR",
        conflicts_with = "any_destination"
    )]
    pub addresses: Vec<IpAddr>,
    /// Decapsulate packets whatever their outer destination (strict destination off).
    #[arg(long)]
    pub any_destination: bool,
    /// XDP attach mode: native (the driver's), skb (generic), or auto (native where the driver
    /// has it, skb otherwise). A pinned link keeps the mode it was attached in.
    #[arg(long, value_name = "MODE", default_value = "auto", value_parser = xdp_mode)]
    pub xdp_mode: config::XdpMode,
    /// The bpffs directory where the links and maps are pinned (mounting bpffs at /sys/fs/bpf
    /// if it is not) [default: /sys/fs/bpf/lb-decap in the host's network namespace,
    /// /sys/fs/bpf/lb-decap-netns-INODE in any other, so each namespace has its own]
    #[arg(long, value_name = "DIR")]
    pub pin_path: Option<PathBuf>,
    /// Detach from every interface and remove everything pinned at --pin-path.
    #[arg(
        long,
        conflicts_with_all = ["interfaces", "addresses", "any_destination", "stats"]
    )]
    pub stop: bool,
    /// Print the counters (summed over CPUs), the parameters, the addresses and where it is
    /// attached.
    #[arg(long, conflicts_with_all = ["interfaces", "addresses", "any_destination"])]
    pub stats: bool,
    /// With --stats: print JSON.
    #[arg(long, requires = "stats")]
    pub json: bool,
}

fn trace_duration(s: &str) -> Result<std::time::Duration, String> {
    let max = crate::trace::MAX_DURATION;
    config::parse_duration(s)
        .filter(|d| *d >= std::time::Duration::from_secs(1) && *d <= max)
        .ok_or_else(|| {
            format!(
                "a duration from 1s to {} (e.g. 30s, 5m)",
                config::show_duration(max)
            )
        })
}

fn xdp_mode(s: &str) -> Result<config::XdpMode, String> {
    match s {
        "auto" => Ok(config::XdpMode::Auto),
        "native" => Ok(config::XdpMode::Native),
        "skb" => Ok(config::XdpMode::Skb),
        _ => Err("one of auto, native, skb".to_owned()),
    }
}

/// `lb decap ...`.
pub fn decap(args: DecapArgs) -> anyhow::Result<()> {
    let pin_path = args
        .pin_path
        .unwrap_or_else(|| crate::netns::default_pin_path(decap::DEFAULT_PIN_PATH));
    if args.stop {
        return decap::stop(&pin_path);
    }
    if args.stats {
        return decap::stats(&pin_path, args.json);
    }
    let destinations = if args.any_destination {
        decap::Destinations::Any
    } else if args.addresses.is_empty() {
        decap::Destinations::Host
    } else {
        decap::Destinations::Listed(args.addresses)
    };
    decap::setup(&decap::Setup {
        interfaces: args.interfaces,
        gue_port: args.gue_port,
        destinations,
        xdp_mode: args.xdp_mode,
        pin_path,
    })
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum BackendAction {
    /// No new flows; established flows continue.
    Drain,
    /// Back to normal (health decides).
    Enable,
    /// Out: no new flows, established flows handled as for a dead backend.
    Disable,
}

/// An answer of the daemon other than success; its exit code tells scripts which.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct Refused {
    pub message: String,
    pub code: i32,
}

fn refused(status: u16, body: &str) -> anyhow::Error {
    let (message, problems) = match serde_json::from_str::<ErrorReply>(body) {
        Ok(r) => (r.error, r.problems),
        Err(_) => (body.trim().to_owned(), Vec::new()),
    };
    let code = match status {
        400 => exit::CONFIG,
        401 | 403 => exit::NOPERM,
        404 => exit::NOT_FOUND,
        409 | 412 => exit::CONFLICT,
        _ => exit::FAILURE,
    };
    let message = if problems.len() > 1 {
        format!("{}:\n  {}", status_text(status), problems.join("\n  "))
    } else {
        format!("{}: {message}", status_text(status))
    };
    Refused { message, code }.into()
}

fn status_text(status: u16) -> String {
    match status {
        400 => "rejected".into(),
        401 => "not authorized".into(),
        404 => "not found".into(),
        409 => "conflict".into(),
        412 => "precondition failed".into(),
        s => format!("control API answered {s}"),
    }
}

async fn get_json<T: serde::de::DeserializeOwned>(
    api: &ApiArgs,
    path: &str,
) -> anyhow::Result<(T, String)> {
    let (status, body) = client::request(api.api, "GET", path, api.token.as_deref()).await?;
    if status != 200 {
        return Err(refused(status, &body));
    }
    Ok((serde_json::from_str(&body)?, body))
}

async fn post(api: &ApiArgs, path: &str) -> anyhow::Result<String> {
    let (status, body) = client::request(api.api, "POST", path, api.token.as_deref()).await?;
    if !(200..300).contains(&status) {
        return Err(refused(status, &body));
    }
    Ok(body)
}

/// `lb status [SERVICE]`.
pub async fn status(api: ApiArgs, service: Option<String>) -> anyhow::Result<()> {
    let path = match &service {
        Some(s) => format!("/v1/healthcheck/{}", encode(s)),
        None => "/v1/healthcheck".to_owned(),
    };
    let (status, body): (Status, String) = get_json(&api, &path).await?;
    if api.json {
        println!("{body}");
        return Ok(());
    }
    if let Some(c) = &status.config {
        println!(
            "config: {}",
            c.describe(|t| format!("{:.0} s ago", status.time - t))
        );
    }
    if let Some(a) = &status.announce {
        let announced = a.vips.iter().filter(|v| v.announced).count();
        let note = match a.state.as_str() {
            "drained" => " (lb drain-host: `lb undrain-host` announces again)",
            "stopping" => " (lb stop: forwarding for the grace period)",
            _ => "",
        };
        println!(
            "host: {}{note}, {announced} of {} VIPs announced in table {} (proto {})",
            a.state,
            a.vips.len(),
            a.table,
            a.protocol
        );
        for v in &a.vips {
            println!(
                "  {:<22} {:<9}  {}{}",
                v.vip,
                if v.announced {
                    "announced"
                } else {
                    "withdrawn"
                },
                v.reason,
                v.error
                    .as_deref()
                    .map(|e| format!(" (failing: {e})"))
                    .unwrap_or_default()
            );
        }
        println!();
    }
    for s in &status.services {
        // The forwarding mode only when it is not the default full NAT.
        let dsr = if s.forwarding == "nat" {
            String::new()
        } else {
            format!(" {}", s.forwarding)
        };
        let tunnel = if s.through_tunnel {
            " through the tunnel"
        } else {
            ""
        };
        println!(
            "{}  {} {}{dsr}  {}  check {}{tunnel}  {}/{} backends available{}",
            s.name,
            s.vip,
            s.protocol,
            s.state.as_str(),
            s.check,
            s.available_backends,
            s.backends.len(),
            s.policy_in_force
                .as_deref()
                .map(|p| format!(" (on_all_unhealthy = {p} in force)"))
                .unwrap_or_default()
        );
        if let (Some(fail), Some(ok)) = (s.failure_window_s, s.success_window_s) {
            println!(
                "  failure window {fail}s, success window at most {ok}s (thresholds: {} down, {} up)",
                s.unhealthy_threshold, s.healthy_threshold
            );
            if let Some(per_kind) = s
                .failure_thresholds
                .and_then(|t| t.differ_from(s.unhealthy_threshold))
            {
                println!("  unhealthy after {per_kind} failures in a row");
            }
        }
        if s.syn_proxy != "off" {
            let rate = s
                .syn_proxy_rate
                .map(|r| format!(", {r:.0} new connections/s"))
                .unwrap_or_default();
            let half_open = s
                .syn_proxy_half_open
                .map(|n| format!(", {n} half-open"))
                .unwrap_or_default();
            let engaged = if s.syn_proxy_engaged {
                "engaged"
            } else {
                "standing by"
            };
            println!("  SYN proxy {}: {engaged}{rate}{half_open}", s.syn_proxy);
        }
        if !s.passive_signals.is_empty() {
            println!("  passive checks see: {}", s.passive_signals.join(", "));
        }
        if let Some(d) = &s.discovery {
            println!("  {}", d.describe());
        }
        if let Some(setting) = &s.announce {
            let min = s
                .announce_min_available
                .map(|n| format!(" (at least {n} available)"))
                .unwrap_or_default();
            let vip = match s.vip_announced {
                Some(true) => "announced",
                _ => "withdrawn",
            };
            println!("  announce {setting}{min}: VIP {vip}");
        }
        println!(
            "  traffic: {} new flows, {} packets, {} bytes",
            s.new_flows, s.packets, s.bytes
        );
        println!(
            "  {:<22} {:>3} {:<17} {:<9} {:>8} {:>4} {:>4} {:>4} {:>4} {:>7} {:>9} {:>10} {:>12}  last failure",
            "backend",
            "w",
            "state",
            "admin",
            "for",
            "ok",
            "tcp",
            "tls",
            "http",
            "payload",
            "timeout",
            "latency",
            "new flows"
        );
        for b in &s.backends {
            println!(
                "  {:<22} {:>3} {:<17} {:<9} {:>7.0}s {:>4} {:>4} {:>4} {:>4} {:>7} {:>9} {:>10} {:>12}  {}",
                b.address,
                b.weight,
                b.state,
                b.admin,
                b.state_for_s,
                b.counters.success,
                b.counters.tcp_failure,
                b.counters.tls_failure,
                b.counters.http_failure,
                b.counters.payload_failure,
                b.counters.timeout_failure,
                b.last_probe_latency_ms
                    .map_or("-".to_owned(), |ms| format!("{ms:.2}ms")),
                b.new_flows,
                b.last_failure.as_deref().unwrap_or("-")
            );
        }
        println!();
    }
    Ok(())
}

/// `lb events [--follow]`.
pub async fn events(api: ApiArgs, follow: bool, after: u64) -> anyhow::Result<()> {
    if !follow {
        let (events, body): (Events, String) =
            get_json(&api, &format!("/v1/events?after={after}")).await?;
        if api.json {
            println!("{body}");
        } else {
            for e in &events.events {
                println!("{}", show_event(e));
            }
        }
        return Ok(());
    }
    let json = api.json;
    let path = format!("/v1/events?follow=true&after={after}");
    let ended = client::stream_lines(api.api, &path, api.token.as_deref(), |line| {
        if json {
            println!("{line}");
        } else {
            println!("{}", show_event(&serde_json::from_str(line)?));
        }
        Ok(())
    })
    .await?;
    match ended {
        Some((status, body)) => Err(refused(status, &body)),
        None => bail!("the daemon ended the event stream (it is stopping)"),
    }
}

/// `lb trace [--service S] [--client ADDR] [--for DURATION]`: prints each line as the daemon
/// sends it, until its time is up or the process is interrupted (which closes the connection:
/// the daemon then ends the trace).
pub async fn trace(
    api: ApiArgs,
    service: Option<String>,
    client: Option<String>,
    duration: Option<std::time::Duration>,
) -> anyhow::Result<()> {
    let mut query = Vec::new();
    if let Some(s) = &service {
        query.push(format!("service={}", encode(s)));
    }
    if let Some(c) = &client {
        query.push(format!("client={}", encode(c)));
    }
    if let Some(d) = duration {
        query.push(format!("seconds={}", d.as_secs().max(1)));
    }
    let path = if query.is_empty() {
        "/v1/trace".to_owned()
    } else {
        format!("/v1/trace?{}", query.join("&"))
    };
    let json = api.json;
    let mut ended = false;
    let answer = client::post_stream_lines(api.api, &path, api.token.as_deref(), |line| {
        let l: TraceLine = serde_json::from_str(line)?;
        ended |= l.kind == "notice" && l.text.starts_with("trace ended");
        if json {
            println!("{line}");
        } else {
            println!("{}", show_trace_line(&l));
        }
        Ok(())
    })
    .await?;
    match answer {
        Some((status, body)) => Err(refused(status, &body)),
        None if ended => Ok(()),
        None => bail!("the daemon ended the trace (it is stopping)"),
    }
}

/// `12:00:01.234 new flow ...`: the time of day (UTC), then the line.
fn show_trace_line(l: &TraceLine) -> String {
    let time = show_time(l.time);
    let of_day = time
        .split(' ')
        .nth(1)
        .unwrap_or(&time)
        .trim_end_matches('Z');
    format!("{of_day} {}", l.text)
}

fn show_event(e: &Event) -> String {
    let reason = e
        .reason
        .as_deref()
        .map_or(String::new(), |r| format!(": {r}"));
    if let Some(vip) = &e.vip {
        return format!(
            "#{} {} VIP {vip} {} -> {}{reason}",
            e.seq,
            show_time(e.time),
            e.from,
            e.to
        );
    }
    if e.service.is_empty() {
        // Not about a backend: a rejected reload, a local shortage.
        return format!("#{} {} {}{reason}", e.seq, show_time(e.time), e.source);
    }
    let flag = e
        .flag_write_us
        .map_or(String::new(), |us| format!(" flag written in {us}µs"));
    let c = &e.counters;
    format!(
        "#{} {} {} {} {} -> {} ({}{reason}; ok {} tcp {} tls {} http {} payload {} timeout {}; thresholds {}/{}){flag}",
        e.seq,
        show_time(e.time),
        e.service,
        e.backend,
        e.from,
        e.to,
        e.source,
        c.success,
        c.tcp_failure,
        c.tls_failure,
        c.http_failure,
        c.payload_failure,
        c.timeout_failure,
        e.unhealthy_threshold,
        e.healthy_threshold,
    )
}

/// Unix seconds as `2026-12-01 18:11:42.123Z` (UTC).
fn show_time(t: f64) -> String {
    let secs = t.max(0.0) as i64;
    let millis = ((t - secs as f64) * 1000.0).clamp(0.0, 999.0) as u32;
    let (days, rest) = (secs.div_euclid(86400), secs.rem_euclid(86400));
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}.{millis:03}Z",
        rest / 3600,
        rest / 60 % 60,
        rest % 60
    )
}

/// Days since 1970-01-01 → (year, month, day) of the proleptic Gregorian calendar (H. Hinnant's
/// `civil_from_days`).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

/// `lb backend drain|enable|disable SERVICE ADDRESS`.
pub async fn backend(
    api: ApiArgs,
    action: BackendAction,
    service: String,
    address: SocketAddr,
) -> anyhow::Result<()> {
    let action = match action {
        BackendAction::Drain => "drain",
        BackendAction::Enable => "enable",
        BackendAction::Disable => "disable",
    };
    let body = post(
        &api,
        &format!(
            "/v1/services/{}/backends/{}/{action}",
            encode(&service),
            encode(&address.to_string())
        ),
    )
    .await?;
    if api.json {
        println!("{body}");
    } else {
        let r: AdminReply = serde_json::from_str(&body)?;
        println!("{service} {address}: admin {}, state {}", r.admin, r.state);
    }
    Ok(())
}

/// `lb reload`.
pub async fn reload(api: ApiArgs) -> anyhow::Result<()> {
    let body = post(&api, "/v1/reload").await?;
    if api.json {
        println!("{body}");
        return Ok(());
    }
    let r: ReloadReply = serde_json::from_str(&body)?;
    println!("reloaded");
    for (list, label) in [
        (&r.services_added, "services added"),
        (&r.services_removed, "services removed"),
        (&r.services_changed, "services changed"),
        (&r.backends_added, "backends added"),
        (&r.backends_removed, "backends removed"),
    ] {
        if !list.is_empty() {
            println!("  {label}: {}", list.join(", "));
        }
    }
    if r.probes_started + r.probes_stopped > 0 {
        println!(
            "  probes: {} started (new or changed checks start at initializing), {} stopped",
            r.probes_started, r.probes_stopped
        );
    }
    Ok(())
}

/// `lb drain-host` (`drain`) and `lb undrain-host`.
pub async fn host(api: ApiArgs, drain: bool) -> anyhow::Result<()> {
    let action = if drain { "drain" } else { "undrain" };
    let body = post(&api, &format!("/v1/host/{action}")).await?;
    if api.json {
        println!("{body}");
    } else {
        let r: HostReply = serde_json::from_str(&body)?;
        println!("{}", r.message);
        if !r.announced.is_empty() {
            println!("  announced: {}", r.announced.join(", "));
        }
    }
    Ok(())
}

/// `lb stop`.
pub async fn stop(api: ApiArgs, pin_path: Option<PathBuf>) -> anyhow::Result<()> {
    let pin_path =
        pin_path.unwrap_or_else(|| crate::netns::default_pin_path(config::DEFAULT_PIN_PATH));
    match post(&api, "/v1/stop").await {
        Ok(body) => {
            let grace = serde_json::from_str::<StopReply>(&body)
                .ok()
                .and_then(|r| r.grace_s);
            match grace {
                Some(g) => println!(
                    "lb is withdrawing its VIPs, forwards for {g}s more (the grace period), then stops and removes its datapath"
                ),
                None => println!("lb is stopping and removing its datapath"),
            }
            Ok(())
        }
        Err(e) if e.is::<client::Unreachable>() => {
            crate::dataplane::owner::refuse_foreign(
                &pin_path,
                "lb stop",
                &crate::netns::default_pin_path(config::DEFAULT_PIN_PATH),
            )?;
            // The routes first: they lead to the datapath about to go.
            match crate::daemon::withdraw_left_over(&crate::daemon::host_file(&pin_path)) {
                Ok(vips) if !vips.is_empty() => println!(
                    "withdrew the VIPs the stopped daemon announced: {}",
                    vips.iter()
                        .map(ToString::to_string)
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
                Ok(_) => {}
                Err(e) => eprintln!("warning: {e:#}"),
            }
            let removed = crate::dataplane::remove_pinned(&pin_path)?;
            let ids = crate::daemon::ids_file(&pin_path);
            // The ids and the lock beside them (they may not exist).
            let _ = std::fs::remove_file(ids.with_extension("lock"));
            let _ = std::fs::remove_file(&ids);
            if removed.is_empty() {
                println!(
                    "no daemon at {} and nothing pinned at {}",
                    api.api,
                    pin_path.display()
                );
            } else {
                println!(
                    "no daemon at {}; removed the pinned datapath at {} ({} objects)",
                    api.api,
                    pin_path.display(),
                    removed.len()
                );
            }
            Ok(())
        }
        Err(e) => Err(e),
    }
}

/// `lb stats`.
pub async fn stats(api: ApiArgs) -> anyhow::Result<()> {
    let (reply, body): (Status, String) = get_json(&api, "/v1/healthcheck").await?;
    if api.json {
        println!("{body}");
        return Ok(());
    }
    println!("{:<20} {:>14}", "counter", "packets");
    for c in &reply.counters {
        let informational = counter::NAMES[counter::VERDICTS as usize..].contains(&c.name.as_str());
        let note = if informational {
            "  (informational)"
        } else {
            ""
        };
        println!("{:<20} {:>14}{note}", c.name, c.value);
    }
    println!();
    for s in &reply.services {
        println!(
            "{:<24} {:<22} {:<5} {:>10} {:>12} {:>14}",
            "service", "vip", "proto", "new flows", "packets", "bytes"
        );
        println!(
            "{:<24} {:<22} {:<5} {:>10} {:>12} {:>14}",
            s.name, s.vip, s.protocol, s.new_flows, s.packets, s.bytes
        );
        println!(
            "  {:<22} {:<17} {:>4} {:>10} {:>12} {:>14}",
            "backend", "state", "w", "new flows", "packets", "bytes"
        );
        for b in &s.backends {
            println!(
                "  {:<22} {:<17} {:>4} {:>10} {:>12} {:>14}",
                b.address,
                b.state.as_str(),
                b.weight,
                b.new_flows,
                b.packets,
                b.bytes
            );
        }
        println!();
    }
    Ok(())
}

/// What a path segment keeps as is: RFC 3986's unreserved characters, and ':' (addresses).
const SEGMENT: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b'~')
    .remove(b':');

/// Percent-encodes a path segment (service names may hold anything but '/').
fn encode(segment: &str) -> String {
    percent_encoding::utf8_percent_encode(segment, SEGMENT).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_segments_are_percent_encoded() {
        assert_eq!(encode("web-1_a.b~c"), "web-1_a.b~c");
        assert_eq!(encode("10.0.0.2:80"), "10.0.0.2:80");
        assert_eq!(encode("a/b c?d#e%"), "a%2Fb%20c%3Fd%23e%25");
        assert_eq!(encode("café"), "caf%C3%A9");
    }

    #[test]
    fn trace_lines_start_with_the_time_of_day() {
        let mut l = crate::trace::record::notice("trace ended: its time is up".to_owned(), 0.0);
        l.time = 1_764_700_801.234_5;
        assert_eq!(
            show_trace_line(&l),
            "18:40:01.234 trace ended: its time is up"
        );
    }

    #[test]
    fn event_times_have_dates() {
        assert_eq!(show_time(0.0), "1970-01-01 00:00:00.000Z");
        assert_eq!(show_time(1_796_148_702.5), "2026-12-01 18:11:42.500Z");
        assert_eq!(show_time(951_782_400.0), "2000-02-29 00:00:00.000Z");
    }

    /// Issue 19: every argument says what it is.
    #[test]
    fn every_argument_has_help() {
        use clap::CommandFactory as _;
        let cli = Cli::command();
        for sub in cli.get_subcommands() {
            assert!(sub.get_about().is_some(), "{}", sub.get_name());
            for arg in sub.get_arguments() {
                let id = arg.get_id().as_str();
                if id == "help" || id == "version" {
                    continue;
                }
                assert!(
                    arg.get_help().is_some(),
                    "lb {} {id}: no help",
                    sub.get_name()
                );
            }
        }
    }

    /// A malformed backend address is a usage error (exit 2), caught before any request.
    #[test]
    fn a_malformed_backend_address_is_a_usage_error() {
        use clap::Parser as _;
        let e = Cli::try_parse_from(["lb", "backend", "drain", "web", "10.0.0.1"]).unwrap_err();
        assert_eq!(e.exit_code(), 2, "{e}");
        assert!(e.to_string().contains("invalid socket address"), "{e}");
        assert!(Cli::try_parse_from(["lb", "backend", "drain", "web", "10.0.0.1:80"]).is_ok());
    }

    /// The unreachable-daemon message names its cause once.
    #[test]
    fn an_unreachable_daemon_is_said_once() {
        let e = anyhow::Error::new(client::Unreachable {
            addr: "127.0.0.1:9090".parse().unwrap(),
            error: std::io::ErrorKind::ConnectionRefused.into(),
        });
        let text = format!("{e:#}");
        assert_eq!(text.matches("refused").count(), 1, "{text}");
    }
}
