//! What the control API reports (its wire model), as plain data: the JSON replies, and the input of the HTML page
//! and the Prometheus renderer. Built by the daemon from its state; the renderers are pure
//! functions of it.

use serde::{Deserialize, Serialize};

/// `GET /v1/healthcheck`: every service. `GET /v1/healthcheck/{service}` has one entry.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Status {
    /// Unix time of this snapshot, seconds.
    pub time: f64,
    pub services: Vec<ServiceStatus>,
    /// Datapath verdict and informational counters, by name (docs/metrics.md).
    pub counters: Vec<NamedCounter>,
    /// Probe latency histograms, one per check kind in use.
    pub probe_latency: Vec<LatencyHistogram>,
    /// Half-open SYNs sent so far, by path; None while no half-open check runs.
    #[serde(default)]
    pub half_open_syns: Option<SynPaths>,
    /// Events so far (the log keeps the most recent ones) and events dropped from the log.
    pub events_total: u64,
    /// The daemon's own resources: open-file limit, API connections, local shortages.
    #[serde(default)]
    pub resources: ResourceStatus,
    /// Route health injection (`[lb.announce]`): the host's state and every VIP's route; None
    /// when lb announces nothing.
    #[serde(default)]
    pub announce: Option<AnnounceStatus>,
    /// Where the configuration comes from, its version and its last change.
    #[serde(default)]
    pub config: Option<ConfigStatus>,
}

/// The configuration: where it is kept, the version running, changes through the API.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ConfigStatus {
    /// "file" or "etcd".
    pub source: String,
    /// The file, or `etcd://HOST:PORT,.../KEY`.
    pub path: String,
    /// Why the store cannot be reached now (etcd down: lb runs on the version it has).
    #[serde(default)]
    pub error: Option<String>,
    /// The last version found in the store and refused (invalid: every host refuses it), and
    /// why; how many were refused so far.
    #[serde(default)]
    pub refused_version: Option<String>,
    #[serde(default)]
    pub refused_reason: Option<String>,
    #[serde(default)]
    pub refused_total: u64,
    /// The version running (a digest of the file as applied).
    pub version: String,
    /// Unix time that version was applied (started, reloaded or changed).
    pub applied_at: f64,
    /// The last change made through the API (None: none since lb started).
    pub last_change: Option<LastChange>,
    pub writes: ConfigWrites,
}

impl ConfigStatus {
    /// One line: "etcd://10.1.0.1:2379/lb/config, revision 42 (applied 2026-...)", with the
    /// store's error and the last refused version when there are.
    pub fn describe(&self, time: impl Fn(f64) -> String) -> String {
        let version = if self.source == "etcd" {
            "revision"
        } else {
            "version"
        };
        let mut words = format!(
            "{}, {version} {} (applied {})",
            self.path,
            self.version,
            time(self.applied_at)
        );
        if let Some(e) = &self.error {
            words += &format!(
                "; {} out of reach, running on what it has: {e}",
                self.source
            );
        }
        if let (Some(v), Some(why)) = (&self.refused_version, &self.refused_reason) {
            words += &format!("; {version} {v} refused: {why}");
        }
        match &self.last_change {
            Some(l) => {
                words += &format!("; last change {} by {}: {}", time(l.time), l.who, l.summary)
            }
            None => words += "; no change through the API since lb started",
        }
        words
    }
}

/// A change made through the API.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct LastChange {
    /// Unix time.
    pub time: f64,
    /// Who made it: "cli", "api", with "token" when one authorized it.
    pub who: String,
    /// The version it made.
    pub version: String,
    /// Its first line of changes, and how many more.
    pub summary: String,
}

/// Changes through the API since lb started, by outcome (dry runs that pass not counted).
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct ConfigWrites {
    pub applied: u64,
    /// Refused as invalid, unknown, or against another version: nothing changed.
    pub refused: u64,
    /// Failed to write or apply (read-only file, disk full): nothing changed.
    pub failed: u64,
}

/// The answer to a change of the configuration (or its dry run).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ChangeReply {
    pub dry_run: bool,
    /// Written and applied (false for a dry run, and for a change that changed nothing).
    pub applied: bool,
    /// The version the change was made to.
    pub previous_version: String,
    /// The version after it (a dry run: the version it would make).
    pub version: String,
    /// What it changes.
    pub diff: crate::config::Diff,
    /// Where its time went, in the daemon.
    #[serde(default)]
    pub timing: ChangeTiming,
    /// Where it was written: the config file, or `etcd://.../KEY`.
    #[serde(default)]
    pub written_to: String,
}

/// The daemon's time on a change, milliseconds: editing and validating it as check-config
/// does (the whole file), writing the file (synced), applying it to the running state.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq)]
pub struct ChangeTiming {
    pub validate_ms: f64,
    pub write_ms: f64,
    pub apply_ms: f64,
}

/// `GET /v1/config`: the configuration running, in the TOML's shape, and its version.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ConfigReply {
    pub version: String,
    pub path: String,
    pub config: serde_json::Value,
}

/// Route health injection as a whole (docs/operating.md, "Running several lb hosts").
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct AnnounceStatus {
    /// "announcing" (each VIP as its services want), "drained" (`lb drain-host`: every VIP
    /// withdrawn, forwarding goes on) or "stopping" (`lb stop`: withdrawn, forwarding for the
    /// grace period).
    pub state: String,
    /// The kernel routing table lb keeps the announced VIPs in, and lb's route protocol there.
    pub table: u32,
    pub protocol: u8,
    /// How long `lb stop` keeps forwarding after withdrawing.
    pub grace_s: f64,
    /// Unix time of the last announce or withdraw (None: none yet by this daemon).
    pub last_change: Option<f64>,
    pub vips: Vec<VipStatus>,
}

/// One VIP's route.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct VipStatus {
    /// The address, without a port.
    pub vip: String,
    /// Its route is in the table (BIRD announces it).
    pub announced: bool,
    /// Whether it should be (None: no service has it any more; its route is being removed).
    pub wanted: Option<bool>,
    /// Why: "web: 2 of 3 backends available (needs 1)", "drain-host", ...
    pub reason: String,
    /// The services on it.
    pub services: Vec<String>,
    /// Unix time of its last announce or withdraw by this daemon (None: kept as it was).
    pub since: Option<f64>,
    /// The last failed write of its route, until one succeeds.
    #[serde(default)]
    pub error: Option<String>,
}

/// What the daemon itself has and ran short of (docs/api.md: limits).
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct ResourceStatus {
    /// The open-file limit in force.
    pub fd_limit: u64,
    /// Control API connections open now, and the most served at once.
    pub api_connections: u64,
    pub api_connections_max: u64,
    /// Idle API connections closed to admit new ones.
    pub api_evicted_total: u64,
    /// New API connections closed at once (the cap reached, none idle).
    pub api_refused_total: u64,
    /// Failed accepts of the API (out of descriptors or buffers).
    pub accept_errors_total: u64,
    /// Probes that failed on this host (out of descriptors, buffers, ports): no verdict.
    pub probe_local_failures_total: u64,
}

/// Where the half-open probes' SYNs left: the link-layer path (to a target that answered
/// before) or the kernel's IP output path (docs/health-checking.md, `tcp` checks).
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub struct SynPaths {
    pub link: u64,
    pub kernel: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct NamedCounter {
    pub name: String,
    pub value: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ServiceStatus {
    pub name: String,
    /// "IP:PORT".
    pub vip: String,
    /// "tcp" or "udp".
    pub protocol: String,
    /// How packets reach the backends: "nat" (full NAT), "ipip" or "gue" (direct server
    /// return).
    #[serde(default = "nat")]
    pub forwarding: String,
    /// Its `syn_proxy` setting: "off", "on" or "auto".
    #[serde(default = "off")]
    pub syn_proxy: String,
    /// Whether the SYN proxy answers its new connections now (always with "on"; with "auto"
    /// while engaged).
    #[serde(default)]
    pub syn_proxy_engaged: bool,
    /// With "auto": its new connections a second as last measured (once a second).
    #[serde(default)]
    pub syn_proxy_rate: Option<f64>,
    /// With "auto": its half-open connections as last measured (SYNs of the last SYN timeout
    /// whose handshake did not complete).
    #[serde(default)]
    pub syn_proxy_half_open: Option<u64>,
    /// The failures lb's passive checks can see in this service's traffic ("refused",
    /// "connect_timeout", "unreachable", "no_data"): fewer with direct server return, whose
    /// replies bypass lb. Empty while the service's passive checks are off.
    #[serde(default)]
    pub passive_signals: Vec<String>,
    /// Check kind ("tcp", "http", ..., "none").
    pub check: String,
    /// The check's probes go to the VIP on each backend through the service's tunnel
    /// (`check.through_tunnel`), not to the backend's own address.
    #[serde(default)]
    pub through_tunnel: bool,
    /// SPEC §2 windows in seconds; None when checks are off.
    pub failure_window_s: Option<f64>,
    pub success_window_s: Option<f64>,
    pub healthy_threshold: u32,
    pub unhealthy_threshold: u32,
    /// Consecutive failures of each kind that make a backend unhealthy (seed 002's per-kind
    /// thresholds; each is `unhealthy_threshold` unless the check sets it). None from a daemon
    /// that does not report them.
    #[serde(default)]
    pub failure_thresholds: Option<FailureThresholds>,
    /// Datapath traffic of the service.
    pub packets: u64,
    pub bytes: u64,
    pub new_flows: u64,
    /// Backends taking new flows now.
    pub available_backends: u32,
    /// The service as a whole (seed 004).
    #[serde(default)]
    pub state: ServiceState,
    /// What new flows get while the service is `down`: its `on_all_unhealthy` policy
    /// ("use-all", "first", "drop"); None otherwise.
    #[serde(default)]
    pub policy_in_force: Option<String>,
    /// Its `announce` setting ("healthy", "always", "never"); None when lb announces nothing
    /// (no `[lb.announce]`).
    #[serde(default)]
    pub announce: Option<String>,
    /// `announce = "healthy"`: the backends that must be available for its VIP to be announced.
    #[serde(default)]
    pub announce_min_available: Option<u32>,
    /// Whether its VIP's route is announced now (by this service or another on the VIP);
    /// None when lb announces nothing.
    #[serde(default)]
    pub vip_announced: Option<bool>,
    /// Backends from DNS (`backends_from`): the name, its last answer and errors.
    #[serde(default)]
    pub discovery: Option<DiscoveryStatus>,
    pub backends: Vec<BackendStatus>,
}

impl DiscoveryStatus {
    /// One line: "backends from DNS web.test (A via 10.0.0.53:53): 3 addresses, TTL 30 s;
    /// stale: resolving web.test: request timed out".
    pub fn describe(&self) -> String {
        let via = if self.resolvers.is_empty() {
            String::new()
        } else {
            format!(" via {}", self.resolvers.join(", "))
        };
        let mut words = format!(
            "backends from DNS {} ({}{via}): {} addresses",
            self.name,
            self.record,
            self.addresses.len()
        );
        if let Some(ttl) = self.ttl_s {
            words += &format!(", TTL {ttl} s");
        }
        if self.resolved_at.is_none() {
            words += ", no answer yet";
        }
        if let Some(e) = &self.error {
            words += &format!("; stale: {e}");
        }
        if !self.rejected.is_empty() {
            words += &format!("; left out: {}", self.rejected.join("; "));
        }
        words
    }
}

/// A service's DNS name and what it resolved to.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct DiscoveryStatus {
    pub name: String,
    /// "A", "AAAA" or "SRV".
    pub record: String,
    /// The servers asked (empty: /etc/resolv.conf's).
    pub resolvers: Vec<String>,
    /// The addresses in use, from the last good answer.
    pub addresses: Vec<String>,
    /// Unix time of the last good answer (None: none yet), and of the last attempt.
    pub resolved_at: Option<f64>,
    pub attempted_at: Option<f64>,
    /// The last answer's TTL, seconds.
    pub ttl_s: Option<f64>,
    /// The addresses are the last good answer's, kept because the last attempt failed or
    /// came back empty (`error` says which).
    pub stale: bool,
    pub error: Option<String>,
    /// Addresses of the last answer left out, with why ("10.100.0.1:80: the VIP of ...").
    pub rejected: Vec<String>,
    /// Resolutions so far: good, empty, failed.
    pub resolutions_ok: u64,
    pub resolutions_empty: u64,
    pub resolutions_failed: u64,
}

fn nat() -> String {
    "nat".to_owned()
}

fn off() -> String {
    "off".to_owned()
}

/// A service's state (seed 004), from its backends.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ServiceState {
    /// Every backend in use (not drained, disabled or weight 0 by the operator) takes new flows.
    Healthy,
    /// Some backends in use do not.
    Degraded,
    /// None takes new flows: the all-unhealthy policy decides.
    Down,
    /// Checks are off (`kind = "none"`).
    Unchecked,
    /// No backends.
    #[default]
    Empty,
}

impl ServiceState {
    pub const ALL: [Self; 5] = [
        Self::Healthy,
        Self::Degraded,
        Self::Down,
        Self::Unchecked,
        Self::Empty,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Healthy => "healthy",
            Self::Degraded => "degraded",
            Self::Down => "down",
            Self::Unchecked => "unchecked",
            Self::Empty => "empty",
        }
    }

    /// From the backends as shown: `available`, and whether the operator took each out
    /// (admin not enabled, or weight 0), which does not degrade the service.
    pub fn of(checked: bool, backends: &[BackendStatus]) -> Self {
        let in_use = || {
            backends
                .iter()
                .filter(|b| b.admin == Admin::Enabled && b.weight > 0)
        };
        if backends.is_empty() {
            Self::Empty
        } else if !backends.iter().any(|b| b.available) {
            Self::Down
        } else if !checked {
            Self::Unchecked
        } else if in_use().all(|b| b.available) {
            Self::Healthy
        } else {
            Self::Degraded
        }
    }
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub struct FailureThresholds {
    /// Refused, reset, unreachable and TLS failures.
    pub tcp_failures: u32,
    pub timeouts: u32,
    /// Wrong status or answer.
    pub http_failures: u32,
}

impl From<&crate::config::WindowSettings> for FailureThresholds {
    fn from(w: &crate::config::WindowSettings) -> Self {
        use crate::config::FailureKind::*;
        Self {
            tcp_failures: w.threshold(Tcp),
            timeouts: w.threshold(Timeout),
            http_failures: w.threshold(Http),
        }
    }
}

impl FailureThresholds {
    /// "2 refused/TLS, 3 timeouts, 5 HTTP": for check-config, the page and `lb status`, when
    /// they are not all `unhealthy_threshold`.
    pub fn differ_from(&self, unhealthy_threshold: u32) -> Option<String> {
        let all = [self.tcp_failures, self.timeouts, self.http_failures];
        (!all.iter().all(|&n| n == unhealthy_threshold)).then(|| {
            format!(
                "{} refused/TLS, {} timeouts, {} HTTP",
                self.tcp_failures, self.timeouts, self.http_failures
            )
        })
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct BackendStatus {
    /// "IP:PORT".
    pub address: String,
    pub ip: String,
    pub port: u16,
    pub weight: u32,
    /// Health state (admin and weight folded in).
    pub state: HealthState,
    /// Operator setting.
    pub admin: Admin,
    /// Whether new flows may go to it now (health, passive ejection, admin and weight together).
    pub available: bool,
    /// Ejected by passive checks: scope and signal ("service: refused", "host: connect_timeout").
    #[serde(default)]
    pub ejected: Option<String>,
    /// Seconds until the ejection ends by itself.
    #[serde(default)]
    pub ejected_for_s: Option<f64>,
    /// Seconds in the current state.
    pub state_for_s: f64,
    pub counters: ProbeCounters,
    /// Latency of the last probe when it succeeded, milliseconds.
    pub last_probe_latency_ms: Option<f64>,
    /// Why the last failed probe failed ("connection refused", "timeout after 2s", "HTTP 503",
    /// "TLS: certificate not trusted (...)"); None before any failure.
    #[serde(default)]
    pub last_failure: Option<String>,
    /// It came from DNS (`backends_from`).
    #[serde(default)]
    pub discovered: bool,
    pub packets: u64,
    pub bytes: u64,
    pub new_flows: u64,
}

/// Health state of one target.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HealthState {
    /// Checks are on but no verdict yet.
    Initializing,
    Healthy,
    /// Healthy, but failures seen below `unhealthy_threshold`.
    MostlyHealthy,
    /// Unhealthy, but successes seen below `healthy_threshold`.
    MostlyUnhealthy,
    Unhealthy,
    /// Checks are off for this target.
    Disabled,
    /// Drained (by the operator, or weight 0 in the config): no new flows, established flows
    /// continue.
    Drained,
    /// Not referenced by any service (removed by a reload while its flows finish).
    Unused,
}

impl HealthState {
    pub const ALL: [Self; 8] = [
        Self::Initializing,
        Self::Healthy,
        Self::MostlyHealthy,
        Self::MostlyUnhealthy,
        Self::Unhealthy,
        Self::Disabled,
        Self::Drained,
        Self::Unused,
    ];

    /// Whether the target may receive new flows. `Initializing` counts as available so that a
    /// daemon restart or a config reload does not cut traffic while the first verdicts are
    /// pending (a dead target then goes within one failure window, as from `healthy`).
    /// `Disabled` is available as SPEC says for unchecked backends; `Drained` and `Unused` get
    /// no new flows.
    pub fn is_available(self) -> bool {
        matches!(
            self,
            Self::Initializing | Self::Healthy | Self::MostlyHealthy | Self::Disabled
        )
    }

    /// The state named `name` (its wire name).
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.as_str() == name)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Initializing => "initializing",
            Self::Healthy => "healthy",
            Self::MostlyHealthy => "mostly_healthy",
            Self::MostlyUnhealthy => "mostly_unhealthy",
            Self::Unhealthy => "unhealthy",
            Self::Disabled => "disabled",
            Self::Drained => "drained",
            Self::Unused => "unused",
        }
    }
}

/// An operator's setting for a backend (`lb backend drain|enable|disable`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Admin {
    /// Takes new flows when healthy.
    #[default]
    Enabled,
    /// No new flows; established flows continue.
    Drained,
    /// Out: no new flows, and established flows are treated as for a dead backend
    /// (rescheduled or kept, per the service's `existing_flows`).
    Disabled,
}

impl Admin {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Enabled => "enabled",
            Self::Drained => "drained",
            Self::Disabled => "disabled",
        }
    }
}

/// The wire names, for text and comparisons (`state == "healthy"`).
macro_rules! wire_name {
    ($t:ty) => {
        impl std::fmt::Display for $t {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
        impl PartialEq<str> for $t {
            fn eq(&self, other: &str) -> bool {
                self.as_str() == other
            }
        }
        impl PartialEq<&str> for $t {
            fn eq(&self, other: &&str) -> bool {
                self.as_str() == *other
            }
        }
    };
}
wire_name!(HealthState);
wire_name!(Admin);

/// SPEC §2 counters (seed 002): consecutive results.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct ProbeCounters {
    pub success: u32,
    pub tcp_failure: u32,
    /// Failed TLS handshakes (https), apart from TCP failures.
    #[serde(default)]
    pub tls_failure: u32,
    pub http_failure: u32,
    /// Replies to `send` that were not the expected ones (tcp-connect, udp).
    #[serde(default)]
    pub payload_failure: u32,
    pub timeout_failure: u32,
}

/// A cumulative latency histogram of successful probes (Prometheus semantics: `counts[i]` is the
/// number of observations ≤ `bounds_s[i]`; `count` includes those above the last bound).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct LatencyHistogram {
    /// Check kind.
    pub kind: String,
    pub bounds_s: Vec<f64>,
    pub counts: Vec<u64>,
    pub count: u64,
    pub sum_s: f64,
}

impl Status {
    pub fn counter(&self, name: &str) -> Option<u64> {
        self.counters
            .iter()
            .find(|c| c.name == name)
            .map(|c| c.value)
    }

    pub fn service(&self, name: &str) -> Option<&ServiceStatus> {
        self.services.iter().find(|s| s.name == name)
    }
}

impl ServiceStatus {
    pub fn backend(&self, address: &str) -> Option<&BackendStatus> {
        self.backends.iter().find(|b| b.address == address)
    }
}

/// One health event (SPEC §4): a state change of a backend, or an operator action.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Event {
    /// Increasing from 1; `GET /v1/events?after=N` returns the events after N.
    pub seq: u64,
    /// Unix time, seconds.
    pub time: f64,
    pub service: String,
    pub backend: String,
    pub from: String,
    pub to: String,
    /// What caused it: the probe kind ("tcp", "http", ...), "admin", or "reload".
    pub source: String,
    pub counters: ProbeCounters,
    pub healthy_threshold: u32,
    pub unhealthy_threshold: u32,
    /// Microseconds from the verdict to the datapath flag written, when the flag changed.
    pub flag_write_us: Option<u64>,
    /// Why, in a few words: the last probe failure of a move to a worse state ("connection
    /// refused", "TLS: ..."), what a rejected reload found, why a VIP was announced or withdrawn.
    #[serde(default)]
    pub reason: Option<String>,
    /// The VIP of an announce or withdraw (from "withdrawn" to "announced" or back); no service
    /// or backend then.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vip: Option<String>,
}

impl Event {
    /// An event of the daemon itself (a rejected reload, a local shortage): no backend, no
    /// state change; `seq` and `time` are the log's to set.
    pub fn daemon(source: String, reason: String) -> Self {
        Self {
            seq: 0,
            time: 0.0,
            service: String::new(),
            backend: String::new(),
            from: String::new(),
            to: String::new(),
            source,
            counters: ProbeCounters::default(),
            healthy_threshold: 0,
            unhealthy_threshold: 0,
            flag_write_us: None,
            reason: Some(reason),
            vip: None,
        }
    }

    /// A VIP announced (`announced`) or withdrawn, and why.
    pub fn vip(vip: std::net::IpAddr, announced: bool, reason: String) -> Self {
        let (from, to) = if announced {
            (VIP_WITHDRAWN, VIP_ANNOUNCED)
        } else {
            (VIP_ANNOUNCED, VIP_WITHDRAWN)
        };
        Self {
            from: from.to_owned(),
            to: to.to_owned(),
            vip: Some(vip.to_string()),
            ..Self::daemon("announce".to_owned(), reason)
        }
    }
}

/// A VIP event's states.
pub const VIP_ANNOUNCED: &str = "announced";
pub const VIP_WITHDRAWN: &str = "withdrawn";

/// `POST /v1/services/{service}/backends/{backend}/{drain|enable|disable}`: the backend after it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct AdminReply {
    pub service: String,
    pub backend: String,
    pub admin: Admin,
    pub state: HealthState,
}

/// `POST /v1/reload`: what the new config changed. Backends as "SERVICE IP:PORT".
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct ReloadReply {
    pub services_added: Vec<String>,
    pub services_removed: Vec<String>,
    pub services_changed: Vec<String>,
    pub backends_added: Vec<String>,
    pub backends_removed: Vec<String>,
    /// Probes started (new targets, or checks that changed: they start over at
    /// `initializing`) and stopped; the others keep their state.
    #[serde(default)]
    pub probes_started: usize,
    #[serde(default)]
    pub probes_stopped: usize,
}

/// `POST /v1/stop` (202).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct StopReply {
    pub stopping: bool,
    /// With `[lb.announce]`: every VIP is withdrawn first and lb keeps forwarding this long
    /// before it stops; None: it stops at once.
    #[serde(default)]
    pub grace_s: Option<f64>,
}

/// `POST /v1/host/drain` and `/v1/host/undrain`: the host's announcing state after it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct HostReply {
    /// "announcing", "drained" or "stopping"; None without `[lb.announce]` (lb announces
    /// nothing, so there is nothing to withdraw or announce).
    pub state: Option<String>,
    /// The VIPs announced now.
    pub announced: Vec<String>,
    /// What happened, in a sentence.
    pub message: String,
}

/// Every answer that is not a success (4xx/5xx): what went wrong; `problems`, each with its
/// place, for a rejected config.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ErrorReply {
    pub error: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub problems: Vec<String>,
}

/// `GET /v1/events`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Events {
    pub events: Vec<Event>,
    /// Events that fell out of the bounded log before this reply.
    pub dropped: u64,
}

/// One line of `POST /v1/trace`'s stream (docs/operating.md, "Troubleshooting the datapath"): a decision
/// of the datapath about one packet, named, or a notice of the trace itself.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct TraceLine {
    /// Unix time the daemon read it, seconds.
    pub time: f64,
    /// "new_flow", "rescheduled", "midstream" (re-created mid-stream), "quic_routed" (a QUIC
    /// connection's new 4-tuple sent to the backend its connection ID names), "flood" (a
    /// direct-server-return SYN in flood mode), the SYN proxy's decisions ("proxy_cookie",
    /// "proxy_created", "proxy_syn_again", "proxy_opened", "proxy_failed", "proxy_stale"),
    /// "dropped", or "notice" (the trace's own: started, records not shown, ended).
    pub kind: String,
    /// The whole line as `lb trace` prints it after the time.
    pub text: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service: Option<String>,
    /// Client and VIP as ADDR:PORT (ADDR alone for ICMP; None when the packet had none lb
    /// could read).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vip: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend_id: Option<u32>,
    /// A rescheduled flow's backend before.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous_backend: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snat_port: Option<u16>,
    /// The packet's verdict counter (`fwd_redirect`, `drop_no_service`, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verdict: Option<String>,
}

/// `GET /v1/trace`: whether the datapath traces now, for whom, and what it could not show.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct TraceState {
    /// The datapath's gate is open.
    pub on: bool,
    /// `POST /v1/trace` streams open now.
    pub sessions: usize,
    /// Records beyond the rate limit, and lost to a full ring, since lb started.
    pub limited: u64,
    pub lost: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn backend(available: bool, admin: Admin, weight: u32) -> BackendStatus {
        BackendStatus {
            address: "10.0.0.2:80".into(),
            ip: "10.0.0.2".into(),
            port: 80,
            weight,
            state: if available {
                HealthState::Healthy
            } else {
                HealthState::Unhealthy
            },
            admin,
            available,
            ejected: None,
            ejected_for_s: None,
            state_for_s: 0.0,
            counters: ProbeCounters::default(),
            last_probe_latency_ms: None,
            last_failure: None,
            discovered: false,
            packets: 0,
            bytes: 0,
            new_flows: 0,
        }
    }

    /// Seed 004's service states; what the operator took out does not degrade a service.
    #[test]
    fn service_states() {
        use ServiceState::*;
        let up = backend(true, Admin::Enabled, 1);
        let dead = backend(false, Admin::Enabled, 1);
        let drained = backend(false, Admin::Drained, 1);
        let zero = backend(false, Admin::Enabled, 0);
        assert_eq!(ServiceState::of(true, &[]), Empty);
        assert_eq!(ServiceState::of(false, &[]), Empty);
        assert_eq!(ServiceState::of(true, &[up.clone(), up.clone()]), Healthy);
        assert_eq!(
            ServiceState::of(true, &[up.clone(), dead.clone()]),
            Degraded
        );
        assert_eq!(ServiceState::of(true, &[dead.clone(), dead.clone()]), Down);
        assert_eq!(
            ServiceState::of(true, &[up.clone(), drained.clone(), zero]),
            Healthy
        );
        assert_eq!(ServiceState::of(true, std::slice::from_ref(&drained)), Down);
        assert_eq!(
            ServiceState::of(false, std::slice::from_ref(&up)),
            Unchecked
        );
        assert_eq!(ServiceState::of(false, &[drained]), Down);
    }
}
