//! `GET /metrics`: Prometheus text exposition format. Pure: a function of the model.
//!
//! Format 0.0.4 as `promtool check metrics` wants it: HELP and TYPE before each family's samples,
//! base units in names, `_total` on counters only, one line per series. A family with no samples
//! is left out altogether.

use std::fmt::Write as _;

use crate::model::{BackendStatus, HealthState, ServiceState, ServiceStatus, Status};

pub fn render(status: &Status) -> String {
    let mut out = String::new();

    let per_service = |value: fn(&ServiceStatus) -> Option<String>| -> Vec<String> {
        status
            .services
            .iter()
            .filter_map(|s| Some(format!("{} {}", labels(&[("service", &s.name)]), value(s)?)))
            .collect()
    };
    family(
        &mut out,
        "lb_service_packets_total",
        "counter",
        "Packets of the service's flows handled by the datapath.",
        per_service(|s| Some(s.packets.to_string())),
    );
    family(
        &mut out,
        "lb_service_bytes_total",
        "counter",
        "Bytes of the service's flows handled by the datapath.",
        per_service(|s| Some(s.bytes.to_string())),
    );
    family(
        &mut out,
        "lb_service_new_flows_total",
        "counter",
        "Flows of the service the datapath assigned to a backend.",
        per_service(|s| Some(s.new_flows.to_string())),
    );
    family(
        &mut out,
        "lb_service_available_backends",
        "gauge",
        "Backends of the service taking new flows now.",
        per_service(|s| Some(s.available_backends.to_string())),
    );
    let service_states = status
        .services
        .iter()
        .flat_map(|s| {
            // One series per state, as for backends.
            ServiceState::ALL.iter().map(move |st| {
                let l = [("service", s.name.as_str()), ("state", st.as_str())];
                format!("{} {}", labels(&l), u8::from(s.state == *st))
            })
        })
        .collect();
    family(
        &mut out,
        "lb_service_state",
        "gauge",
        "State of the service (healthy, degraded, down, unchecked, empty): 1 for the current one.",
        service_states,
    );
    let dns: Vec<(&str, &crate::model::DiscoveryStatus)> = status
        .services
        .iter()
        .filter_map(|s| Some((s.name.as_str(), s.discovery.as_ref()?)))
        .collect();
    if !dns.is_empty() {
        family(
            &mut out,
            "lb_dns_resolutions_total",
            "counter",
            "Resolutions of a service's DNS name (backends_from), by result: ok, empty (no \
             address), failed (timeout, SERVFAIL, ...).",
            dns.iter()
                .flat_map(|(s, d)| {
                    [
                        ("ok", d.resolutions_ok),
                        ("empty", d.resolutions_empty),
                        ("failed", d.resolutions_failed),
                    ]
                    .map(|(r, n)| format!("{} {n}", labels(&[("service", s), ("result", r)])))
                })
                .collect(),
        );
        family(
            &mut out,
            "lb_dns_addresses",
            "gauge",
            "Addresses in use from a service's DNS name.",
            dns.iter()
                .map(|(s, d)| format!("{} {}", labels(&[("service", s)]), d.addresses.len()))
                .collect(),
        );
        family(
            &mut out,
            "lb_dns_stale",
            "gauge",
            "1 while a service's DNS addresses are the last good answer's, kept because the \
             last attempt failed or came back empty.",
            dns.iter()
                .map(|(s, d)| format!("{} {}", labels(&[("service", s)]), u8::from(d.stale)))
                .collect(),
        );
    }
    let forwarding = status
        .services
        .iter()
        .map(|s| {
            let l = [
                ("service", s.name.as_str()),
                ("mode", s.forwarding.as_str()),
            ];
            format!("{} 1", labels(&l))
        })
        .collect();
    family(
        &mut out,
        "lb_service_forwarding",
        "gauge",
        "How the service's packets reach its backends (mode: nat, ipip, gue); always 1.",
        forwarding,
    );
    let syn_proxy = status
        .services
        .iter()
        .filter(|s| s.syn_proxy != "off")
        .map(|s| {
            let l = [("service", s.name.as_str()), ("mode", s.syn_proxy.as_str())];
            format!("{} {}", labels(&l), u8::from(s.syn_proxy_engaged))
        })
        .collect();
    family(
        &mut out,
        "lb_service_syn_proxy_engaged",
        "gauge",
        "Whether the SYN proxy answers the service's new connections now (mode: on, auto); services with syn_proxy off are not listed.",
        syn_proxy,
    );
    family(
        &mut out,
        "lb_service_failure_window_seconds",
        "gauge",
        "Longest time a dead backend keeps receiving new flows (checks on only).",
        per_service(|s| s.failure_window_s.map(float)),
    );
    family(
        &mut out,
        "lb_service_success_window_seconds",
        "gauge",
        "Longest time a recovered backend waits for new flows (checks on only).",
        per_service(|s| s.success_window_s.map(float)),
    );

    // Route health injection: the host's state and each VIP's route.
    if let Some(a) = &status.announce {
        family(
            &mut out,
            "lb_host_announce_state",
            "gauge",
            "The host's route health injection state (announcing, drained, stopping): 1 for the current one.",
            ["announcing", "drained", "stopping"]
                .iter()
                .map(|st| format!("{} {}", labels(&[("state", st)]), u8::from(a.state == *st)))
                .collect(),
        );
        family(
            &mut out,
            "lb_vip_announced",
            "gauge",
            "Whether the VIP's route is in lb's announce table (BIRD announces it): 1 or 0.",
            a.vips
                .iter()
                .map(|v| format!("{} {}", labels(&[("vip", &v.vip)]), u8::from(v.announced)))
                .collect(),
        );
        family(
            &mut out,
            "lb_vip_announce_last_change_timestamp_seconds",
            "gauge",
            "Unix time of the VIP's last announce or withdraw by this daemon.",
            a.vips
                .iter()
                .filter_map(|v| {
                    Some(format!(
                        "{} {}",
                        labels(&[("vip", &v.vip)]),
                        float(v.since?)
                    ))
                })
                .collect(),
        );
    }

    // (service and backend labels, backend) in order.
    let backends: Vec<(Vec<(&str, &str)>, &BackendStatus)> = status
        .services
        .iter()
        .flat_map(|s| {
            s.backends.iter().map(|b| {
                (
                    vec![
                        ("service", s.name.as_str()),
                        ("backend", b.address.as_str()),
                    ],
                    b,
                )
            })
        })
        .collect();
    let per_backend = |value: fn(&BackendStatus) -> Option<String>| -> Vec<String> {
        backends
            .iter()
            .filter_map(|(l, b)| Some(format!("{} {}", labels(l), value(b)?)))
            .collect()
    };

    let states = backends
        .iter()
        .flat_map(|(l, b)| {
            // One series per state, so a dashboard selecting on the label always finds a sample.
            HealthState::ALL.iter().map(move |s| {
                let mut l = l.clone();
                l.push(("state", s.as_str()));
                format!("{} {}", labels(&l), u8::from(b.state == *s))
            })
        })
        .collect();
    family(
        &mut out,
        "lb_backend_state",
        "gauge",
        "Health state of the backend: 1 for the current state, 0 for the others.",
        states,
    );
    family(
        &mut out,
        "lb_backend_available",
        "gauge",
        "Whether the backend takes new flows now (health, admin state and weight together).",
        per_backend(|b| Some(u8::from(b.available).to_string())),
    );
    family(
        &mut out,
        "lb_backend_ejected",
        "gauge",
        "Whether passive checks (real traffic) have ejected the backend, at either scope.",
        per_backend(|b| Some(u8::from(b.ejected.is_some()).to_string())),
    );
    family(
        &mut out,
        "lb_backend_weight",
        "gauge",
        "Configured weight of the backend.",
        per_backend(|b| Some(b.weight.to_string())),
    );
    family(
        &mut out,
        "lb_backend_check_success",
        "gauge",
        "Consecutive successful probes of the backend.",
        per_backend(|b| Some(b.counters.success.to_string())),
    );
    family(
        &mut out,
        "lb_backend_check_tcp_failure",
        "gauge",
        "Consecutive probes of the backend that failed at the TCP level.",
        per_backend(|b| Some(b.counters.tcp_failure.to_string())),
    );
    family(
        &mut out,
        "lb_backend_check_tls_failure",
        "gauge",
        "Consecutive probes of the backend whose TLS handshake failed (https).",
        per_backend(|b| Some(b.counters.tls_failure.to_string())),
    );
    family(
        &mut out,
        "lb_backend_check_http_failure",
        "gauge",
        "Consecutive probes of the backend that failed at the HTTP level.",
        per_backend(|b| Some(b.counters.http_failure.to_string())),
    );
    family(
        &mut out,
        "lb_backend_check_payload_failure",
        "gauge",
        "Consecutive probes of the backend whose reply to `send` was not the expected one (tcp-connect, udp).",
        per_backend(|b| Some(b.counters.payload_failure.to_string())),
    );
    family(
        &mut out,
        "lb_backend_check_timeout_failure",
        "gauge",
        "Consecutive probes of the backend that timed out.",
        per_backend(|b| Some(b.counters.timeout_failure.to_string())),
    );
    family(
        &mut out,
        "lb_backend_last_probe_latency_seconds",
        "gauge",
        "Latency of the backend's last probe, when it succeeded.",
        per_backend(|b| b.last_probe_latency_ms.map(|ms| float(ms / 1000.0))),
    );
    family(
        &mut out,
        "lb_backend_packets_total",
        "counter",
        "Packets of the backend's flows handled by the datapath.",
        per_backend(|b| Some(b.packets.to_string())),
    );
    family(
        &mut out,
        "lb_backend_bytes_total",
        "counter",
        "Bytes of the backend's flows handled by the datapath.",
        per_backend(|b| Some(b.bytes.to_string())),
    );
    family(
        &mut out,
        "lb_backend_new_flows_total",
        "counter",
        "Flows the datapath assigned to the backend.",
        per_backend(|b| Some(b.new_flows.to_string())),
    );

    // Every packet gets exactly one verdict; the informational counters (new flows,
    // evictions, ...) count events beside them, so they are a family of their own.
    let informational = &lb_common::counter::NAMES[lb_common::counter::VERDICTS as usize..];
    let (events, verdicts): (Vec<_>, Vec<_>) = status
        .counters
        .iter()
        .partition(|c| informational.contains(&c.name.as_str()));
    family(
        &mut out,
        "lb_datapath_packets_total",
        "counter",
        "Packets by datapath verdict: each packet has one (docs/metrics.md).",
        verdicts
            .iter()
            .map(|c| format!("{} {}", labels(&[("verdict", &c.name)]), c.value))
            .collect(),
    );
    family(
        &mut out,
        "lb_datapath_events_total",
        "counter",
        "Informational datapath counters: flows created, entries evicted, ... (docs/metrics.md).",
        events
            .iter()
            .map(|c| format!("{} {}", labels(&[("event", &c.name)]), c.value))
            .collect(),
    );

    let mut latency = Vec::new();
    for h in &status.probe_latency {
        let kind = ("kind", h.kind.as_str());
        // A non-finite bound would repeat the +Inf bucket written below.
        for (bound, count) in h.bounds_s.iter().zip(&h.counts) {
            if bound.is_finite() {
                let le = float(*bound);
                latency.push(format!("_bucket{} {count}", labels(&[kind, ("le", &le)])));
            }
        }
        latency.push(format!(
            "_bucket{} {}",
            labels(&[kind, ("le", "+Inf")]),
            h.count
        ));
        latency.push(format!("_sum{} {}", labels(&[kind]), float(h.sum_s)));
        latency.push(format!("_count{} {}", labels(&[kind]), h.count));
    }
    family(
        &mut out,
        "lb_probe_latency_seconds",
        "histogram",
        "Latency of successful health probes, by check kind.",
        latency,
    );

    if let Some(syns) = status.half_open_syns {
        family(
            &mut out,
            "lb_probe_syns_total",
            "counter",
            "SYNs of half-open tcp checks sent, by path: link (the packet socket, to targets that \
             answered) or kernel (the IP output path).",
            vec![
                format!("{} {}", labels(&[("path", "link")]), syns.link),
                format!("{} {}", labels(&[("path", "kernel")]), syns.kernel),
            ],
        );
    }

    if let Some(c) = &status.config {
        family(
            &mut out,
            "lb_config_info",
            "gauge",
            "The configuration running: its source, file and version (1).",
            vec![format!(
                "{} 1",
                labels(&[
                    ("source", &c.source),
                    ("path", &c.path),
                    ("version", &c.version)
                ])
            )],
        );
        family(
            &mut out,
            "lb_config_applied_timestamp_seconds",
            "gauge",
            "Unix time the configuration running was applied (start, reload or change).",
            vec![format!(" {}", c.applied_at)],
        );
        family(
            &mut out,
            "lb_config_writes_total",
            "counter",
            "Changes of the configuration through the API, by result: applied (written and \
             applied), refused (invalid, unknown, another version: nothing changed) or failed \
             (could not be written or applied: nothing changed).",
            vec![
                format!("{} {}", labels(&[("result", "applied")]), c.writes.applied),
                format!("{} {}", labels(&[("result", "refused")]), c.writes.refused),
                format!("{} {}", labels(&[("result", "failed")]), c.writes.failed),
            ],
        );
    }

    let r = &status.resources;
    family(
        &mut out,
        "lb_open_files_limit",
        "gauge",
        "The daemon's open-file limit (RLIMIT_NOFILE) in force.",
        vec![format!(" {}", r.fd_limit)],
    );
    family(
        &mut out,
        "lb_api_connections",
        "gauge",
        "Control API connections open now.",
        vec![format!(" {}", r.api_connections)],
    );
    family(
        &mut out,
        "lb_api_connections_max",
        "gauge",
        "Control API connections served at once at most.",
        vec![format!(" {}", r.api_connections_max)],
    );
    family(
        &mut out,
        "lb_api_connections_closed_total",
        "counter",
        "Control API connections closed by the cap: evicted (idle, for a new one) or refused \
         (new, with every open one busy).",
        vec![
            format!("{} {}", labels(&[("why", "evicted")]), r.api_evicted_total),
            format!("{} {}", labels(&[("why", "refused")]), r.api_refused_total),
        ],
    );
    family(
        &mut out,
        "lb_local_failures_total",
        "counter",
        "Failures of this host for lack of descriptors, buffers or ports: API accepts, and \
         probes (no verdict against the backend).",
        vec![
            format!(
                "{} {}",
                labels(&[("place", "api_accept")]),
                r.accept_errors_total
            ),
            format!(
                "{} {}",
                labels(&[("place", "probe")]),
                r.probe_local_failures_total
            ),
        ],
    );
    family(
        &mut out,
        "lb_events_total",
        "counter",
        "Health events (state changes and operator actions) so far.",
        vec![format!(" {}", status.events_total)],
    );
    out
}

/// HELP, TYPE and the samples; each sample is what follows the family name (suffix, labels and
/// value).
fn family(out: &mut String, name: &str, kind: &str, help: &str, samples: Vec<String>) {
    if samples.is_empty() {
        return;
    }
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
    for s in samples {
        let _ = writeln!(out, "{name}{s}");
    }
}

/// `{a="x",b="y"}` with the values escaped as the format requires.
fn labels(pairs: &[(&str, &str)]) -> String {
    let inner: Vec<String> = pairs
        .iter()
        .map(|(k, v)| format!("{k}=\"{}\"", escape(v)))
        .collect();
    format!("{{{}}}", inner.join(","))
}

fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// Rust prints `inf` and `NaN`; the format spells them `+Inf`, `-Inf`, `NaN`.
fn float(v: f64) -> String {
    if v.is_nan() {
        "NaN".to_owned()
    } else if v.is_infinite() {
        if v > 0.0 { "+Inf" } else { "-Inf" }.to_owned()
    } else {
        v.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{LatencyHistogram, NamedCounter, ProbeCounters, SynPaths};

    fn small() -> Status {
        Status {
            time: 1_700_000_000.0,
            services: vec![ServiceStatus {
                name: "web".to_owned(),
                vip: "10.1.0.1:80".to_owned(),
                protocol: "tcp".to_owned(),
                forwarding: "nat".to_owned(),
                syn_proxy: "off".to_owned(),
                syn_proxy_engaged: false,
                syn_proxy_rate: None,
                syn_proxy_half_open: None,
                passive_signals: Vec::new(),
                check: "http".to_owned(),
                through_tunnel: false,
                failure_window_s: Some(7.0),
                success_window_s: Some(0.35),
                healthy_threshold: 3,
                unhealthy_threshold: 3,
                failure_thresholds: None,
                packets: 20,
                bytes: 2000,
                new_flows: 4,
                available_backends: 1,
                state: crate::model::ServiceState::Healthy,
                policy_in_force: None,
                announce: None,
                announce_min_available: None,
                vip_announced: None,
                discovery: None,
                backends: vec![BackendStatus {
                    address: "10.0.0.2:80".to_owned(),
                    ip: "10.0.0.2".to_owned(),
                    port: 80,
                    weight: 2,
                    state: HealthState::MostlyHealthy,
                    admin: crate::model::Admin::Enabled,
                    available: true,
                    ejected: None,
                    ejected_for_s: None,
                    state_for_s: 1.0,
                    counters: ProbeCounters {
                        success: 0,
                        tcp_failure: 1,
                        tls_failure: 0,
                        http_failure: 0,
                        payload_failure: 0,
                        timeout_failure: 0,
                    },
                    last_probe_latency_ms: Some(2.5),
                    last_failure: None,
                    discovered: false,
                    packets: 10,
                    bytes: 1000,
                    new_flows: 3,
                }],
            }],
            counters: vec![
                NamedCounter {
                    name: "xdp_tx".to_owned(),
                    value: 17,
                },
                NamedCounter {
                    name: "ct_new".to_owned(),
                    value: 3,
                },
            ],
            probe_latency: vec![LatencyHistogram {
                kind: "http".to_owned(),
                bounds_s: vec![0.001, 0.01],
                counts: vec![1, 3],
                count: 4,
                sum_s: 0.5,
            }],
            half_open_syns: Some(SynPaths {
                link: 90,
                kernel: 10,
            }),
            events_total: 5,
            resources: Default::default(),
            announce: None,
            config: None,
        }
    }

    #[test]
    fn exact_output() {
        let expected = r#"# HELP lb_service_packets_total Packets of the service's flows handled by the datapath.
# TYPE lb_service_packets_total counter
lb_service_packets_total{service="web"} 20
# HELP lb_service_bytes_total Bytes of the service's flows handled by the datapath.
# TYPE lb_service_bytes_total counter
lb_service_bytes_total{service="web"} 2000
# HELP lb_service_new_flows_total Flows of the service the datapath assigned to a backend.
# TYPE lb_service_new_flows_total counter
lb_service_new_flows_total{service="web"} 4
# HELP lb_service_available_backends Backends of the service taking new flows now.
# TYPE lb_service_available_backends gauge
lb_service_available_backends{service="web"} 1
# HELP lb_service_state State of the service (healthy, degraded, down, unchecked, empty): 1 for the current one.
# TYPE lb_service_state gauge
lb_service_state{service="web",state="healthy"} 1
lb_service_state{service="web",state="degraded"} 0
lb_service_state{service="web",state="down"} 0
lb_service_state{service="web",state="unchecked"} 0
lb_service_state{service="web",state="empty"} 0
# HELP lb_service_forwarding How the service's packets reach its backends (mode: nat, ipip, gue); always 1.
# TYPE lb_service_forwarding gauge
lb_service_forwarding{service="web",mode="nat"} 1
# HELP lb_service_failure_window_seconds Longest time a dead backend keeps receiving new flows (checks on only).
# TYPE lb_service_failure_window_seconds gauge
lb_service_failure_window_seconds{service="web"} 7
# HELP lb_service_success_window_seconds Longest time a recovered backend waits for new flows (checks on only).
# TYPE lb_service_success_window_seconds gauge
lb_service_success_window_seconds{service="web"} 0.35
# HELP lb_backend_state Health state of the backend: 1 for the current state, 0 for the others.
# TYPE lb_backend_state gauge
lb_backend_state{service="web",backend="10.0.0.2:80",state="initializing"} 0
lb_backend_state{service="web",backend="10.0.0.2:80",state="healthy"} 0
lb_backend_state{service="web",backend="10.0.0.2:80",state="mostly_healthy"} 1
lb_backend_state{service="web",backend="10.0.0.2:80",state="mostly_unhealthy"} 0
lb_backend_state{service="web",backend="10.0.0.2:80",state="unhealthy"} 0
lb_backend_state{service="web",backend="10.0.0.2:80",state="disabled"} 0
lb_backend_state{service="web",backend="10.0.0.2:80",state="drained"} 0
lb_backend_state{service="web",backend="10.0.0.2:80",state="unused"} 0
# HELP lb_backend_available Whether the backend takes new flows now (health, admin state and weight together).
# TYPE lb_backend_available gauge
lb_backend_available{service="web",backend="10.0.0.2:80"} 1
# HELP lb_backend_ejected Whether passive checks (real traffic) have ejected the backend, at either scope.
# TYPE lb_backend_ejected gauge
lb_backend_ejected{service="web",backend="10.0.0.2:80"} 0
# HELP lb_backend_weight Configured weight of the backend.
# TYPE lb_backend_weight gauge
lb_backend_weight{service="web",backend="10.0.0.2:80"} 2
# HELP lb_backend_check_success Consecutive successful probes of the backend.
# TYPE lb_backend_check_success gauge
lb_backend_check_success{service="web",backend="10.0.0.2:80"} 0
# HELP lb_backend_check_tcp_failure Consecutive probes of the backend that failed at the TCP level.
# TYPE lb_backend_check_tcp_failure gauge
lb_backend_check_tcp_failure{service="web",backend="10.0.0.2:80"} 1
# HELP lb_backend_check_tls_failure Consecutive probes of the backend whose TLS handshake failed (https).
# TYPE lb_backend_check_tls_failure gauge
lb_backend_check_tls_failure{service="web",backend="10.0.0.2:80"} 0
# HELP lb_backend_check_http_failure Consecutive probes of the backend that failed at the HTTP level.
# TYPE lb_backend_check_http_failure gauge
lb_backend_check_http_failure{service="web",backend="10.0.0.2:80"} 0
# HELP lb_backend_check_payload_failure Consecutive probes of the backend whose reply to `send` was not the expected one (tcp-connect, udp).
# TYPE lb_backend_check_payload_failure gauge
lb_backend_check_payload_failure{service="web",backend="10.0.0.2:80"} 0
# HELP lb_backend_check_timeout_failure Consecutive probes of the backend that timed out.
# TYPE lb_backend_check_timeout_failure gauge
lb_backend_check_timeout_failure{service="web",backend="10.0.0.2:80"} 0
# HELP lb_backend_last_probe_latency_seconds Latency of the backend's last probe, when it succeeded.
# TYPE lb_backend_last_probe_latency_seconds gauge
lb_backend_last_probe_latency_seconds{service="web",backend="10.0.0.2:80"} 0.0025
# HELP lb_backend_packets_total Packets of the backend's flows handled by the datapath.
# TYPE lb_backend_packets_total counter
lb_backend_packets_total{service="web",backend="10.0.0.2:80"} 10
# HELP lb_backend_bytes_total Bytes of the backend's flows handled by the datapath.
# TYPE lb_backend_bytes_total counter
lb_backend_bytes_total{service="web",backend="10.0.0.2:80"} 1000
# HELP lb_backend_new_flows_total Flows the datapath assigned to the backend.
# TYPE lb_backend_new_flows_total counter
lb_backend_new_flows_total{service="web",backend="10.0.0.2:80"} 3
# HELP lb_datapath_packets_total Packets by datapath verdict: each packet has one (docs/metrics.md).
# TYPE lb_datapath_packets_total counter
lb_datapath_packets_total{verdict="xdp_tx"} 17
# HELP lb_datapath_events_total Informational datapath counters: flows created, entries evicted, ... (docs/metrics.md).
# TYPE lb_datapath_events_total counter
lb_datapath_events_total{event="ct_new"} 3
# HELP lb_probe_latency_seconds Latency of successful health probes, by check kind.
# TYPE lb_probe_latency_seconds histogram
lb_probe_latency_seconds_bucket{kind="http",le="0.001"} 1
lb_probe_latency_seconds_bucket{kind="http",le="0.01"} 3
lb_probe_latency_seconds_bucket{kind="http",le="+Inf"} 4
lb_probe_latency_seconds_sum{kind="http"} 0.5
lb_probe_latency_seconds_count{kind="http"} 4
# HELP lb_probe_syns_total SYNs of half-open tcp checks sent, by path: link (the packet socket, to targets that answered) or kernel (the IP output path).
# TYPE lb_probe_syns_total counter
lb_probe_syns_total{path="link"} 90
lb_probe_syns_total{path="kernel"} 10
# HELP lb_open_files_limit The daemon's open-file limit (RLIMIT_NOFILE) in force.
# TYPE lb_open_files_limit gauge
lb_open_files_limit 0
# HELP lb_api_connections Control API connections open now.
# TYPE lb_api_connections gauge
lb_api_connections 0
# HELP lb_api_connections_max Control API connections served at once at most.
# TYPE lb_api_connections_max gauge
lb_api_connections_max 0
# HELP lb_api_connections_closed_total Control API connections closed by the cap: evicted (idle, for a new one) or refused (new, with every open one busy).
# TYPE lb_api_connections_closed_total counter
lb_api_connections_closed_total{why="evicted"} 0
lb_api_connections_closed_total{why="refused"} 0
# HELP lb_local_failures_total Failures of this host for lack of descriptors, buffers or ports: API accepts, and probes (no verdict against the backend).
# TYPE lb_local_failures_total counter
lb_local_failures_total{place="api_accept"} 0
lb_local_failures_total{place="probe"} 0
# HELP lb_events_total Health events (state changes and operator actions) so far.
# TYPE lb_events_total counter
lb_events_total 5
"#;
        let got = render(&small());
        for (i, (g, e)) in got.lines().zip(expected.lines()).enumerate() {
            assert_eq!(g, e, "line {}", i + 1);
        }
        assert_eq!(got, expected);
    }

    /// `small` with every optional family present: the source of docs/metrics.md.
    fn everything() -> Status {
        let mut s = small();
        s.services[0].syn_proxy = "auto".to_owned();
        s.services[0].syn_proxy_engaged = true;
        s.services[0].discovery = Some(crate::model::DiscoveryStatus {
            name: "web.example.internal".to_owned(),
            record: "A".to_owned(),
            resolvers: Vec::new(),
            addresses: vec!["10.0.0.2:80".to_owned()],
            resolved_at: Some(1_700_000_000.0),
            attempted_at: Some(1_700_000_000.0),
            ttl_s: Some(30.0),
            stale: false,
            error: None,
            rejected: Vec::new(),
            resolutions_ok: 1,
            resolutions_empty: 0,
            resolutions_failed: 0,
        });
        s.announce = Some(crate::model::AnnounceStatus {
            state: "announcing".to_owned(),
            table: 200,
            protocol: 250,
            grace_s: 5.0,
            last_change: Some(1_700_000_001.5),
            vips: vec![crate::model::VipStatus {
                vip: "10.1.0.1".to_owned(),
                announced: true,
                wanted: Some(true),
                reason: "healthy".to_owned(),
                services: vec!["web".to_owned()],
                since: Some(1_700_000_001.5),
                error: None,
            }],
        });
        s.config = Some(crate::model::ConfigStatus {
            source: "file".to_owned(),
            path: "/etc/lb/lb.toml".to_owned(),
            error: None,
            refused_version: None,
            refused_reason: None,
            refused_total: 0,
            version: "abc".to_owned(),
            applied_at: 1_700_000_000.0,
            last_change: None,
            writes: Default::default(),
        });
        s
    }

    /// docs/metrics.md: the families as `render` writes them (name, type, labels, help) and
    /// the datapath's counters from their one list.
    #[test]
    fn generated_doc_metrics() {
        let text = render(&everything());
        // Every family the renderer declares is in `everything`'s render, so in the docs.
        let code = include_str!("metrics.rs")
            .split("#[cfg(test)]")
            .next()
            .unwrap();
        for (at, _) in code.match_indices("\"lb_") {
            let name = &code[at + 1..][..code[at + 1..].find('"').unwrap()];
            assert!(
                text.contains(&format!("# HELP {name} ")),
                "{name} is missing from everything()'s render: give it a sample"
            );
        }
        let mut out = String::from(
            "# Metrics and counters\n\n\
             <!-- Generated by `cargo xtask docs` from lb-userspace/src/api/metrics.rs and \
             lb-common's counter lists; do not edit. -->\n\n\
             `GET /metrics` on the control API serves these in Prometheus' text format; `lb \
             stats` and `GET /v1/healthcheck` show the datapath's counters by name. A family \
             without samples (no DNS discovery, no `[lb.announce]`) is left out.\n\n\
             ## Prometheus metrics\n\n\
             | metric | type | labels | meaning |\n|---|---|---|---|\n",
        );
        let mut lines = text.lines().peekable();
        while let Some(line) = lines.next() {
            let Some(help) = line.strip_prefix("# HELP ") else {
                continue;
            };
            let (name, help) = help.split_once(' ').unwrap();
            let kind = lines.next().unwrap().rsplit(' ').next().unwrap();
            let sample = lines.peek().copied().unwrap_or_default();
            let labels: Vec<String> = sample
                .split_once('{')
                .map(|(_, l)| l.split_once('}').unwrap().0)
                .into_iter()
                .flat_map(|l| l.split("\","))
                .filter_map(|pair| Some(format!("`{}`", pair.split_once('=')?.0)))
                .collect();
            out.push_str(&format!(
                "| `{name}` | {kind} | {} | {} |\n",
                labels.join(", "),
                help.replace('|', "\\|")
            ));
        }
        let counters = |out: &mut String, title: &str, names: &[&str], docs: &[&str], to: usize| {
            out.push_str(&format!("\n{title}\n\n| name | meaning |\n|---|---|\n"));
            for (name, doc) in names.iter().zip(docs).take(to) {
                assert!(!doc.trim().is_empty(), "counter {name} has no doc comment");
                out.push_str(&format!(
                    "| `{name}` | {} |\n",
                    doc.trim().replace('|', "\\|")
                ));
            }
        };
        use lb_common::{counter as c, decap_counter as d};
        let (verdicts, decap_verdicts) = (c::VERDICTS as usize, d::VERDICTS as usize);
        counters(
            &mut out,
            "## Datapath verdicts: `lb_datapath_packets_total{verdict}`\n\n\
             Every packet the balancer's XDP program sees counts under exactly one verdict.",
            &c::NAMES[..verdicts],
            &c::DOCS[..verdicts],
            verdicts,
        );
        counters(
            &mut out,
            "## Datapath events: `lb_datapath_events_total{event}`\n\n\
             Informational: counted besides a packet's verdict.",
            &c::NAMES[verdicts..],
            &c::DOCS[verdicts..],
            usize::MAX,
        );
        counters(
            &mut out,
            "## `lb decap`'s verdicts\n\n\
             The backends' decapsulator (`lb decap`) counts every packet under exactly one.",
            &d::NAMES[..decap_verdicts],
            &d::DOCS[..decap_verdicts],
            decap_verdicts,
        );
        counters(
            &mut out,
            "## `lb decap`'s events\n\nInformational: counted besides a packet's verdict.",
            &d::NAMES[decap_verdicts..],
            &d::DOCS[decap_verdicts..],
            usize::MAX,
        );
        crate::generated::check_or_write("docs/metrics.md", &out);
    }

    #[test]
    fn announce_families() {
        let mut s = small();
        s.announce = Some(crate::model::AnnounceStatus {
            state: "drained".to_owned(),
            table: 200,
            protocol: 250,
            grace_s: 5.0,
            last_change: Some(1_700_000_001.5),
            vips: vec![
                crate::model::VipStatus {
                    vip: "10.1.0.1".to_owned(),
                    announced: false,
                    wanted: Some(false),
                    reason: "drain-host".to_owned(),
                    services: vec!["web".to_owned()],
                    since: Some(1_700_000_001.5),
                    error: None,
                },
                crate::model::VipStatus {
                    vip: "2001:db8::1".to_owned(),
                    announced: true,
                    wanted: Some(false),
                    reason: "drain-host".to_owned(),
                    services: vec!["web6".to_owned()],
                    since: None,
                    error: Some("removing the route: EPERM".to_owned()),
                },
            ],
        });
        let text = render(&s);
        for line in [
            "# TYPE lb_host_announce_state gauge",
            "lb_host_announce_state{state=\"announcing\"} 0",
            "lb_host_announce_state{state=\"drained\"} 1",
            "lb_host_announce_state{state=\"stopping\"} 0",
            "# TYPE lb_vip_announced gauge",
            "lb_vip_announced{vip=\"10.1.0.1\"} 0",
            "lb_vip_announced{vip=\"2001:db8::1\"} 1",
            "lb_vip_announce_last_change_timestamp_seconds{vip=\"10.1.0.1\"} 1700000001.5",
        ] {
            assert!(text.lines().any(|l| l == line), "{line}\n{text}");
        }
        assert!(!text.contains("last_change_timestamp_seconds{vip=\"2001:db8::1\"}"));
        // Without [lb.announce] none of them.
        assert!(!render(&small()).contains("announce"));
    }

    #[test]
    fn escapes_label_values() {
        assert_eq!(escape("a\\b\"c\nd"), "a\\\\b\\\"c\\nd");
        let mut s = small();
        s.services[0].name = "we\"b\\\n".to_owned();
        let text = render(&s);
        assert!(
            text.contains("lb_service_packets_total{service=\"we\\\"b\\\\\\n\"} 20\n"),
            "{text}"
        );
        // Each sample stays on one line.
        assert!(
            text.lines()
                .all(|l| l.starts_with('#') || l.starts_with("lb_"))
        );
    }

    #[test]
    fn optional_families_and_no_duplicates() {
        let mut s = small();
        s.services[0].failure_window_s = None;
        s.services[0].success_window_s = None;
        s.services[0].backends[0].last_probe_latency_ms = None;
        s.probe_latency.clear();
        s.probe_latency.push(LatencyHistogram {
            kind: "tcp".to_owned(),
            bounds_s: vec![0.1, f64::INFINITY],
            counts: vec![1, 2],
            count: 2,
            sum_s: 0.15,
        });
        let mut second = s.services[0].clone();
        second.name = "dns".to_owned();
        s.services.push(second);
        let text = render(&s);
        assert!(!text.contains("window_seconds"));
        assert!(!text.contains("last_probe_latency"));
        let series: Vec<&str> = text
            .lines()
            .filter(|l| !l.starts_with('#'))
            .map(|l| l.rsplit_once(' ').expect("value").0)
            .collect();
        let mut unique = series.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(series.len(), unique.len(), "{text}");
        assert_eq!(text.matches("le=\"+Inf\"").count(), 1);
        assert_eq!(float(f64::NEG_INFINITY), "-Inf");
        assert_eq!(float(f64::NAN), "NaN");
    }
}
