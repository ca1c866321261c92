//! The status page (`Accept: text/html`): one table per service. Pure: a function of the model.
//!
//! Self-contained (inline CSS, no script) and reloading itself with `<meta http-equiv=refresh>`,
//! so a browser left open on it keeps showing the current state.

use std::fmt::Write as _;

use crate::model::{BackendStatus, ServiceStatus, Status};

/// Background of `healthy` and `mostly_healthy` rows (#c8f7c5). Exported so that the end-to-end
/// test can look for it in a screenshot.
pub const HEALTHY_COLOUR: [u8; 3] = [0xc8, 0xf7, 0xc5];
/// Background of `unhealthy` and `mostly_unhealthy` rows (#f7c5c5).
pub const UNHEALTHY_COLOUR: [u8; 3] = [0xf7, 0xc5, 0xc5];
/// `initializing`: waiting for a verdict.
const PENDING_COLOUR: [u8; 3] = [0xfa, 0xf0, 0xc0];
/// `disabled`, `unused` and anything unknown.
const NEUTRAL_COLOUR: [u8; 3] = [0xe4, 0xe4, 0xe4];

/// The whole page; `refresh_seconds` is the reload period.
pub fn page(status: &Status, refresh_seconds: u32) -> String {
    let mut out = String::new();
    let css = format!(
        "body {{ font-family: sans-serif; margin: 1em; }}\n\
         table {{ border-collapse: collapse; width: 100%; margin-bottom: 1.5em; }}\n\
         caption {{ text-align: left; font-weight: bold; padding: 0.3em 0; }}\n\
         th, td {{ border: 1px solid #999; padding: 0.3em 0.6em; text-align: left; }}\n\
         th {{ background: #fff; }}\n\
         td.n {{ text-align: right; }}\n\
         tr.state-healthy td, tr.state-mostly_healthy td {{ background: {ok}; }}\n\
         tr.state-unhealthy td, tr.state-mostly_unhealthy td {{ background: {bad}; }}\n\
         tr.state-initializing td {{ background: {pending}; }}\n\
         tr.state-disabled td, tr.state-drained td, tr.state-unused td {{ background: {neutral}; }}\n\
         tr.ejected td {{ background: {bad}; }}\n",
        ok = hex(HEALTHY_COLOUR),
        bad = hex(UNHEALTHY_COLOUR),
        pending = hex(PENDING_COLOUR),
        neutral = hex(NEUTRAL_COLOUR),
    );
    let _ = write!(
        out,
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <meta http-equiv=\"refresh\" content=\"{refresh_seconds}\">\n\
         <title>lb status</title>\n<style>\n{css}</style>\n</head>\n<body>\n\
         <h1>lb status</h1>\n<p>As of {}; this page reloads every {refresh_seconds} s.</p>\n",
        utc(status.time)
    );
    for service in &status.services {
        table(&mut out, service);
    }
    out.push_str("</body>\n</html>\n");
    out
}

fn table(out: &mut String, s: &ServiceStatus) {
    let windows = match (s.failure_window_s, s.success_window_s) {
        (Some(f), Some(ok)) => format!(
            "failure window {} s, success window {} s",
            secs(f),
            secs(ok)
        ),
        (Some(f), None) => format!("failure window {} s", secs(f)),
        (None, Some(ok)) => format!("success window {} s", secs(ok)),
        (None, None) => "no windows (checks off)".to_owned(),
    };
    let per_kind = s
        .failure_thresholds
        .and_then(|t| t.differ_from(s.unhealthy_threshold));
    let windows = match per_kind {
        Some(per_kind) => format!("{windows}, unhealthy after {per_kind} failures"),
        None => windows,
    };
    let state = match &s.policy_in_force {
        Some(p) => format!("{} (on_all_unhealthy = {p} in force)", s.state.as_str()),
        None => s.state.as_str().to_owned(),
    };
    let caption = format!(
        "{} — {} {} — {state} — check {}, {} — {}/{} backends available — \
         {} packets, {} bytes, {} new flows",
        s.name,
        s.vip,
        s.protocol,
        s.check,
        windows,
        s.available_backends,
        s.backends.len(),
        s.packets,
        s.bytes,
        s.new_flows
    );
    let _ = write!(
        out,
        "<table data-service=\"{}\">\n<caption>{}</caption>\n<thead><tr>\
         <th>backend</th><th>weight</th><th>state</th><th>admin</th>\
         <th>success</th><th>tcp failure</th><th>tls failure</th><th>http failure</th>\
         <th>payload failure</th><th>timeout failure</th><th>last failure</th>\
         <th>last probe</th><th>packets</th><th>bytes</th><th>new flows</th>\
         </tr></thead>\n<tbody>\n",
        escape(&s.name),
        escape(&caption)
    );
    for b in &s.backends {
        row(out, b);
    }
    out.push_str("</tbody>\n</table>\n");
}

fn row(out: &mut String, b: &BackendStatus) {
    let state = b.state.as_str();
    // Ejected by passive checks: out whatever its probes say, so red too.
    let (ejected_class, ejected_words) = match &b.ejected {
        Some(why) => (
            " ejected",
            format!(
                ", ejected ({}, {:.0} s left)",
                escape(why),
                b.ejected_for_s.unwrap_or(0.0)
            ),
        ),
        None => ("", String::new()),
    };
    let latency = b
        .last_probe_latency_ms
        .map_or_else(|| "–".to_owned(), |ms| format!("{ms:.1} ms"));
    let c = &b.counters;
    let _ = writeln!(
        out,
        "<tr class=\"state-{state}{ejected_class}\" data-state=\"{state}\" data-backend=\"{addr}\">\
         <td>{addr}</td><td class=\"n\">{}</td><td>{}{ejected_words}</td><td>{}</td>\
         <td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td>\
         <td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"reason\">{}</td><td class=\"n\">{latency}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td></tr>",
        b.weight,
        b.state.as_str().replace('_', " "),
        b.admin.as_str(),
        c.success,
        c.tcp_failure,
        c.tls_failure,
        c.http_failure,
        c.payload_failure,
        c.timeout_failure,
        b.last_failure
            .as_deref()
            .map_or_else(|| "–".to_owned(), escape),
        b.packets,
        b.bytes,
        b.new_flows,
        addr = escape(&b.address),
    );
}

/// Text and attribute values alike: the five characters that can end either.
fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for ch in s.chars() {
        match ch {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

fn hex([r, g, b]: [u8; 3]) -> String {
    format!("#{r:02x}{g:02x}{b:02x}")
}

/// Seconds with at most three decimals, trailing zeros dropped (windows may be sub-second).
fn secs(s: f64) -> String {
    let t = format!("{s:.3}");
    t.trim_end_matches('0').trim_end_matches('.').to_owned()
}

/// Unix time as `YYYY-MM-DD HH:MM:SS UTC` (days to civil date: H. Hinnant's algorithm).
fn utc(time: f64) -> String {
    let t = time.max(0.0) as i64;
    let (days, rem) = (t.div_euclid(86_400), t.rem_euclid(86_400));
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02} UTC",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Admin, HealthState, ProbeCounters};

    fn backend(address: &str, state: &str) -> BackendStatus {
        BackendStatus {
            address: address.to_owned(),
            ip: address.split(':').next().unwrap_or_default().to_owned(),
            port: 80,
            weight: 1,
            state: HealthState::from_name(state).expect("a state name"),
            admin: Admin::Enabled,
            available: state.contains("healthy") && !state.contains("unhealthy"),
            ejected: None,
            ejected_for_s: None,
            state_for_s: 3.0,
            counters: ProbeCounters {
                success: 4,
                tcp_failure: 0,
                tls_failure: 0,
                http_failure: 0,
                payload_failure: 0,
                timeout_failure: 0,
            },
            last_probe_latency_ms: Some(1.5),
            last_failure: None,
            packets: 10,
            bytes: 1000,
            new_flows: 2,
        }
    }

    fn service(name: &str, backends: Vec<BackendStatus>) -> ServiceStatus {
        ServiceStatus {
            name: name.to_owned(),
            vip: "10.1.0.1:80".to_owned(),
            protocol: "tcp".to_owned(),
            check: "http".to_owned(),
            failure_window_s: Some(7.0),
            success_window_s: Some(0.35),
            healthy_threshold: 3,
            unhealthy_threshold: 3,
            failure_thresholds: None,
            packets: 20,
            bytes: 2000,
            new_flows: 4,
            available_backends: 1,
            state: Default::default(),
            policy_in_force: None,
            backends,
        }
    }

    fn status(services: Vec<ServiceStatus>) -> Status {
        Status {
            time: 1_700_000_000.5,
            services,
            counters: vec![],
            probe_latency: vec![],
            half_open_syns: None,
            events_total: 0,
            resources: Default::default(),
        }
    }

    #[test]
    fn escapes_everything_from_config() {
        assert_eq!(
            escape(r#"<a href="x">'&'</a>"#),
            "&lt;a href=&quot;x&quot;&gt;&#39;&amp;&#39;&lt;/a&gt;"
        );
        let evil = "<script>alert(\"x\")</script>";
        let mut b = backend("10.0.0.2:80", "healthy");
        b.address = evil.to_owned();
        let html = page(&status(vec![service(evil, vec![b])]), 5);
        assert!(!html.contains("<script"), "{html}");
        assert!(html.contains("&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;"));
    }

    #[test]
    fn one_table_per_service() {
        let s = status(vec![
            service("web", vec![backend("10.0.0.2:80", "healthy")]),
            service("dns", vec![]),
            service("api", vec![backend("10.0.0.3:80", "unused")]),
        ]);
        let html = page(&s, 5);
        assert_eq!(html.matches("<table").count(), 3);
        assert_eq!(html.matches("</table>").count(), 3);
        for name in ["web", "dns", "api"] {
            assert!(html.contains(&format!("<caption>{name} — ")), "{html}");
        }
        assert!(html.contains("failure window 7 s, success window 0.35 s — "));
        assert!(html.contains("1/1 backends available"));
        // Per-kind thresholds are named when they are not all unhealthy_threshold.
        let mut per_kind = service("web", vec![]);
        per_kind.failure_thresholds = Some(crate::model::FailureThresholds {
            tcp_failures: 1,
            timeouts: 3,
            http_failures: 3,
        });
        let html = page(&status(vec![per_kind]), 5);
        assert!(
            html.contains("unhealthy after 1 refused/TLS, 3 timeouts, 3 HTTP failures"),
            "{html}"
        );
        assert!(html.contains("<title>lb status</title>"));
        assert!(html.contains("As of 2023-11-14 22:13:20 UTC"));
    }

    #[test]
    fn rows_carry_state_class_and_words() {
        let mut quiet = backend("10.0.0.4:80", "mostly_unhealthy");
        quiet.last_probe_latency_ms = None;
        let s = status(vec![service(
            "web",
            vec![backend("10.0.0.2:80", "healthy"), quiet],
        )]);
        let html = page(&s, 5);
        assert!(html.contains(
            "<tr class=\"state-healthy\" data-state=\"healthy\" data-backend=\"10.0.0.2:80\">\
             <td>10.0.0.2:80</td><td class=\"n\">1</td><td>healthy</td><td>enabled</td>"
        ));
        assert!(html.contains(
            "<tr class=\"state-mostly_unhealthy\" data-state=\"mostly_unhealthy\" \
             data-backend=\"10.0.0.4:80\"><td>10.0.0.4:80</td><td class=\"n\">1</td>\
             <td>mostly unhealthy</td>"
        ));
        assert!(html.contains("<td class=\"n\">1.5 ms</td>"));
        assert!(html.contains("<td class=\"n\">–</td>"));
        // The colours the end-to-end test looks for are the ones in the CSS.
        assert!(
            html.contains(
                "tr.state-healthy td, tr.state-mostly_healthy td { background: #c8f7c5; }"
            )
        );
        assert!(html.contains(
            "tr.state-unhealthy td, tr.state-mostly_unhealthy td { background: #f7c5c5; }"
        ));
    }

    #[test]
    fn refreshes_itself() {
        let html = page(&status(vec![]), 7);
        assert!(html.starts_with("<!DOCTYPE html>"));
        assert!(html.contains("<meta http-equiv=\"refresh\" content=\"7\">"));
        assert!(html.trim_end().ends_with("</html>"));
    }

    #[test]
    fn utc_dates() {
        assert_eq!(utc(0.0), "1970-01-01 00:00:00 UTC");
        assert_eq!(utc(951_782_400.0), "2000-02-29 00:00:00 UTC");
        assert_eq!(utc(1_767_225_599.0), "2025-12-31 23:59:59 UTC");
    }
}
