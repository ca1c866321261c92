//! The status page (`Accept: text/html`): a banner and a table per service, then the health
//! timelines and the last events. Pure: a function of the model and the event log.
//!
//! Complete without JavaScript (inline CSS; the timelines and the events rendered here too; a
//! `<noscript>` meta refresh reloads it). With JavaScript, the inline [`SCRIPT`] polls the same
//! URL's JSON every second and updates the page in place: states, reasons, counters, the
//! timelines and events (drawn as `history` draws them), and the traffic rates with their
//! sparklines, which only the browser computes (from successive counters, kept in the page's
//! memory).

use std::fmt::Write as _;

use crate::model::{BackendStatus, Event, ProbeCounters, ServiceStatus, Status};

/// Background of `healthy` and `mostly_healthy` rows (#c8f7c5). Exported so that the end-to-end
/// test can look for it in a screenshot.
pub const HEALTHY_COLOUR: [u8; 3] = [0xc8, 0xf7, 0xc5];
/// Background of `unhealthy` and `mostly_unhealthy` rows (#f7c5c5).
pub const UNHEALTHY_COLOUR: [u8; 3] = [0xf7, 0xc5, 0xc5];
/// `initializing`: waiting for a verdict.
pub const PENDING_COLOUR: [u8; 3] = [0xfa, 0xf0, 0xc0];
/// `disabled`, `drained`, `unused` and anything unknown.
pub const NEUTRAL_COLOUR: [u8; 3] = [0xe4, 0xe4, 0xe4];

/// How often the script polls the JSON, milliseconds.
pub const POLL_MS: u32 = 1000;
/// The health timelines' span, minutes.
pub const TIMELINE_MIN: u32 = 10;

/// Events in the "Last events" list.
const LAST_EVENTS: usize = 20;

/// The whole page; `events` is the event log (oldest first), `refresh_seconds` the reload period
/// without JavaScript.
pub fn page(status: &Status, events: &[Event], refresh_seconds: u32) -> String {
    let mut out = String::new();
    // Compact enough for 1280 px with the widest rows; narrower, a table scrolls inside its
    // `.wrap` with the backend column sticky. Borders are each cell's own (separate, no
    // spacing) so that the sticky cells keep theirs while the rest scrolls under them.
    let css = format!(
        "body {{ font-family: sans-serif; margin: 1em; }}\n\
         .wrap {{ overflow-x: auto; margin-bottom: 1.5em; }}\n\
         table {{ border-collapse: separate; border-spacing: 0; border-top: 1px solid #999; width: 100%; font-size: 90%; }}\n\
         .about {{ margin: 0.3em 0; overflow-wrap: anywhere; }}\n\
         th, td {{ border: 1px solid #999; border-width: 0 1px 1px 0; padding: 0.25em 0.4em; text-align: left; }}\n\
         th {{ background: #fff; font-weight: normal; }}\n\
         th:first-child, td:first-child {{ position: sticky; left: 0; border-left-width: 1px; }}\n\
         td.n {{ text-align: right; white-space: nowrap; }}\n\
         td.reason {{ min-width: 7em; }}\n\
         .sub {{ display: block; font-size: 85%; color: #444; white-space: nowrap; }}\n\
         tr.state-healthy td, tr.state-mostly_healthy td {{ background: {ok}; }}\n\
         tr.state-unhealthy td, tr.state-mostly_unhealthy td {{ background: {bad}; }}\n\
         tr.state-initializing td {{ background: {pending}; }}\n\
         tr.state-disabled td, tr.state-drained td, tr.state-unused td {{ background: {neutral}; }}\n\
         tr.ejected td {{ background: {bad}; }}\n\
         .kv {{ display: grid; grid-template-columns: repeat(var(--pairs), auto auto); gap: 0 0.4em; \
         justify-content: start; white-space: nowrap; }}\n\
         .kv .v {{ text-align: right; font-variant-numeric: tabular-nums; }}\n\
         .kv .k {{ color: #444; font-size: 90%; margin-right: 0.3em; }}\n\
         .probes .zero {{ color: #666; }}\n\
         .probes .v:not(.zero) {{ font-weight: bold; }}\n\
         .rates {{ grid-template-columns: auto auto auto; }}\n\
         .rates svg {{ grid-row: 1 / span 2; align-self: center; margin-right: 0.2em; }}\n\
         .pps {{ color: #1565c0; }}\n\
         .fps {{ color: #c25400; }}\n\
         .banner {{ padding: 0.4em 0.8em; color: #fff; font-weight: bold; margin-top: 1em; overflow-wrap: anywhere; }}\n\
         .svc-healthy {{ background: #1b7f3a; }}\n\
         .svc-degraded {{ background: #a86b00; }}\n\
         .svc-down {{ background: #b71c1c; }}\n\
         .svc-unchecked, .svc-empty {{ background: #666; }}\n\
         svg.spark {{ width: 80px; height: 22px; vertical-align: middle; background: rgba(255, 255, 255, 0.5); }}\n\
         svg.spark polyline {{ fill: none; stroke-width: 1.5; vector-effect: non-scaling-stroke; }}\n\
         .stale {{ color: #b71c1c; font-weight: bold; }}\n\
         .tl {{ display: flex; flex-wrap: wrap; align-items: center; margin: 0.2em 0; }}\n\
         .tl-label {{ flex: 0 1 18em; font-size: 90%; overflow-wrap: anywhere; }}\n\
         .bar {{ position: relative; flex: 1 1 12em; height: 1.1em; background: #f4f4f4; border: 1px solid #999; }}\n\
         .band {{ position: absolute; top: 0; bottom: 0; }}\n\
         .band-up {{ background: {ok}; }}\n\
         .band-down {{ background: {bad}; }}\n\
         .band-pending {{ background: {pending}; }}\n\
         .band-off {{ background: {neutral}; }}\n\
         #events {{ font-size: 90%; padding-left: 2em; overflow-wrap: anywhere; }}\n",
        ok = hex(HEALTHY_COLOUR),
        bad = hex(UNHEALTHY_COLOUR),
        pending = hex(PENDING_COLOUR),
        neutral = hex(NEUTRAL_COLOUR),
    );
    let _ = write!(
        out,
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n\
         <noscript><meta http-equiv=\"refresh\" content=\"{refresh_seconds}\"></noscript>\n\
         <title>lb status</title>\n<style>\n{css}</style>\n</head>\n\
         <body data-loaded-at=\"{time}\" data-updates=\"0\">\n\
         <h1>lb status</h1>\n<p>As of <span id=\"as-of\">{}</span>; \
         <span id=\"mode\">this page reloads every {refresh_seconds} s</span>. \
         <a href=\"/v1/healthcheck\">JSON</a> · <a href=\"/metrics\">metrics</a> · \
         <a href=\"/v1/events\">events</a></p>\n",
        utc(status.time),
        time = status.time,
    );
    // Route health injection: what the routers are told about this host.
    if let Some(a) = &status.announce {
        let _ = writeln!(
            out,
            "<p id=\"host\" data-host-state=\"{}\">Host: <span data-f=\"host\">{}</span></p>",
            escape(&a.state),
            escape(&host_words(a))
        );
    }
    if let Some(c) = &status.config {
        let _ = writeln!(
            out,
            "<p id=\"config\">Configuration: <span data-f=\"config\">{}</span></p>",
            escape(&config_words(c))
        );
    }
    out.push_str("<main id=\"services\">\n");
    for service in &status.services {
        section(&mut out, service);
    }
    // The timelines and the last events, from the event log; the script redraws both the same
    // way from what it reads of `/v1/events`.
    let (timelines, last) = history(status, events);
    let _ = write!(
        out,
        "</main>\n<section id=\"history\">\n\
         <h2>Health timelines (the last {TIMELINE_MIN} minutes at most)</h2>\n\
         <div id=\"timelines\">{timelines}</div>\n\
         <h2>Last events</h2>\n<ol id=\"events\" reversed>{last}</ol>\n\
         <noscript><p>Without JavaScript the rates and their sparklines stay empty: the browser \
         computes them from successive counters.</p></noscript>\n</section>\n\
         <script>\nconst POLL_MS = {POLL_MS};\nconst TIMELINE_S = {};\nconst LAST_EVENTS = {LAST_EVENTS};\n\
         {SCRIPT}</script>\n</body>\n</html>\n",
        TIMELINE_MIN * 60
    );
    out
}

/// A state's band on a timeline: up (takes flows), down, pending, off (drained, disabled,
/// other). The script's `band` says the same.
fn band(state: &str) -> &'static str {
    match state {
        "healthy" | "mostly_healthy" => "up",
        "unhealthy" | "mostly_unhealthy" | "ejected" => "down",
        "initializing" => "pending",
        _ => "off",
    }
}

/// The timelines' and the last events' HTML, as the script's `timelines` draws them: one bar per
/// backend over the last [`TIMELINE_MIN`] minutes (from the first event logged if that is later:
/// before it there is nothing to draw), made of the states its events moved it through and its
/// state now (ejected when a passive check holds it out); and the last [`LAST_EVENTS`] events,
/// newest first.
fn history(status: &Status, events: &[Event]) -> (String, String) {
    let now = status.time;
    let start =
        (now - f64::from(TIMELINE_MIN * 60)).max(events.first().map_or(now - 1.0, |e| e.time));
    let span = (now - start).max(1.0);
    let mut timelines = String::new();
    for s in &status.services {
        for b in &s.backends {
            let mine: Vec<&Event> = events
                .iter()
                .filter(|e| e.service == s.name && e.backend == b.address)
                .collect();
            let mut bands = Vec::new();
            let mut from = start;
            let mut state = mine.first().map_or(b.state.as_str(), |e| e.from.as_str());
            for e in &mine {
                if e.time > start {
                    bands.push((from, e.time, state));
                }
                from = start.max(e.time);
                state = &e.to;
            }
            let state_now = if b.ejected.is_some() {
                "ejected"
            } else {
                b.state.as_str()
            };
            bands.push((from, now, state_now));
            let key = escape(&format!("{} {}", s.name, b.address));
            let _ = write!(
                timelines,
                "<div class=\"tl\" data-backend=\"{key}\"><span class=\"tl-label\">{key}</span><div class=\"bar\">"
            );
            for (from, to, state) in bands.into_iter().filter(|(from, to, _)| to > from) {
                let _ = write!(
                    timelines,
                    "<span class=\"band band-{}\" data-state=\"{}\" style=\"left:{:.2}%;width:{:.2}%\" title=\"{}\"></span>",
                    band(state),
                    escape(state),
                    (from - start) * 100.0 / span,
                    (to - from) * 100.0 / span,
                    escape(&format!("{state} from {}", utc(from))),
                );
            }
            timelines.push_str("</div></div>");
        }
    }
    let mut last = String::new();
    for e in events.iter().rev().take(LAST_EVENTS) {
        let what = match &e.vip {
            Some(vip) => format!("VIP {vip}"),
            None => format!("{} {}", e.service, e.backend),
        };
        let why = e
            .reason
            .as_deref()
            .map_or_else(String::new, |r| format!(": {r}"));
        let _ = write!(
            last,
            "<li>{}</li>",
            escape(&format!(
                "{} {what} {} → {} ({}{why})",
                utc(e.time),
                e.from,
                e.to,
                e.source
            ))
        );
    }
    (timelines, last)
}

/// The configuration line's words (see [`crate::model::ConfigStatus::describe`]).
fn config_words(c: &crate::model::ConfigStatus) -> String {
    c.describe(utc)
}

/// The host line's words: "announcing — 1 of 2 VIPs announced (table 200)".
fn host_words(a: &crate::model::AnnounceStatus) -> String {
    format!(
        "{} — {} of {} VIPs announced (table {})",
        a.state,
        a.vips.iter().filter(|v| v.announced).count(),
        a.vips.len(),
        a.table
    )
}

/// The banner's words about the VIP's route (with `[lb.announce]` only).
fn vip_words(announced: bool) -> &'static str {
    if announced {
        "VIP announced"
    } else {
        "VIP withdrawn"
    }
}

/// The banner's words: the state, and the all-unhealthy policy when it is in force.
fn service_state(s: &ServiceStatus) -> String {
    match &s.policy_in_force {
        Some(p) => format!("{} (on_all_unhealthy = {p} in force)", s.state.as_str()),
        None => s.state.as_str().to_owned(),
    }
}

fn section(out: &mut String, s: &ServiceStatus) {
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
    let windows = match &s.discovery {
        Some(d) => format!("{windows} — {}", d.describe()),
        None => windows,
    };
    let state = s.state.as_str();
    let announce = match (s.announce.as_deref(), s.vip_announced) {
        (Some(setting), Some(announced)) => format!(
            " — <span data-f=\"announce\" data-announced=\"{announced}\" title=\"announce = {}\">{}</span>",
            escape(setting),
            vip_words(announced)
        ),
        _ => String::new(),
    };
    let _ = write!(
        out,
        "<section class=\"service\">\n\
         <div class=\"banner svc-{state}\" data-service-state=\"{state}\">{name} — \
         <span data-f=\"state\">{}</span> — <span data-f=\"avail\">{}/{} backends available</span>{announce}</div>\n\
         <p class=\"about\">{name} — {} {} {} — check {}, {} — \
         <span data-f=\"traffic\">{} packets, {} bytes, {} new flows</span></p>\n\
         <div class=\"wrap\"><table data-service=\"{name}\">\n<thead><tr><th>backend</th><th>state</th>\
         <th>admin</th><th>last failure</th><th>last probe</th>\
         <th title=\"consecutive probe results: successes, and failures by kind\">consecutive probes</th>\
         <th title=\"packets/s and new flows/s over the last 5 minutes, as this page saw them\">rates, 5 min</th>\
         <th title=\"packets, bytes and new flows since the start\">totals</th></tr></thead>\n<tbody>\n",
        escape(&service_state(s)),
        s.available_backends,
        s.backends.len(),
        escape(&s.vip),
        escape(&s.protocol),
        escape(&if s.syn_proxy == "off" {
            s.forwarding.clone()
        } else {
            format!(
                "{}, SYN proxy {}{}",
                s.forwarding,
                s.syn_proxy,
                match (s.syn_proxy.as_str(), s.syn_proxy_engaged) {
                    ("auto", true) => " (engaged)",
                    ("auto", false) => " (standing by)",
                    _ => "",
                }
            )
        }),
        escape(&if s.through_tunnel {
            format!("{} through the tunnel", s.check)
        } else {
            s.check.clone()
        }),
        escape(&windows),
        s.packets,
        s.bytes,
        s.new_flows,
        name = escape(&s.name),
    );
    for b in &s.backends {
        row(out, b);
    }
    out.push_str("</tbody>\n</table></div>\n</section>\n");
}

/// The state cell's words: the state, and a passive ejection with its time left.
fn state_words(b: &BackendStatus) -> String {
    let state = b.state.as_str().replace('_', " ");
    match &b.ejected {
        Some(why) => format!(
            "{state}, ejected ({why}, {:.0} s left)",
            b.ejected_for_s.unwrap_or(0.0)
        ),
        None => state,
    }
}

/// The consecutive probe counters: the field (the JSON's, and `data-f`), the label, its title,
/// and the counter. In the order of a two-column grid filled row by row: successes, TCP and TLS
/// on the left.
type Probe = (
    &'static str,
    &'static str,
    &'static str,
    fn(&ProbeCounters) -> u32,
);
const PROBES: [Probe; 6] = [
    ("success", "ok", "consecutive successes", |c| c.success),
    (
        "http_failure",
        "http",
        "consecutive HTTP failures (wrong status or answer)",
        |c| c.http_failure,
    ),
    (
        "tcp_failure",
        "tcp",
        "consecutive TCP failures (refused, reset, unreachable)",
        |c| c.tcp_failure,
    ),
    (
        "payload_failure",
        "payload",
        "consecutive replies to `send` not the expected ones",
        |c| c.payload_failure,
    ),
    (
        "tls_failure",
        "tls",
        "consecutive failed TLS handshakes",
        |c| c.tls_failure,
    ),
    ("timeout_failure", "timeout", "consecutive timeouts", |c| {
        c.timeout_failure
    }),
];

fn row(out: &mut String, b: &BackendStatus) {
    let state = b.state.as_str();
    // Ejected by passive checks: out whatever its probes say, so red too.
    let ejected_class = if b.ejected.is_some() { " ejected" } else { "" };
    let latency = b
        .last_probe_latency_ms
        .map_or_else(|| "–".to_owned(), |ms| format!("{ms:.1} ms"));
    let c = &b.counters;
    // Two columns of label and number, zeros dimmed so that failures stand out.
    let mut probes = String::new();
    for (f, label, title, counter) in PROBES {
        let n = counter(c);
        let zero = if n == 0 { " zero" } else { "" };
        let _ = write!(
            probes,
            "<span class=\"k\" title=\"{title}\">{label}</span><span class=\"v{zero}\" data-f=\"{f}\">{n}</span>"
        );
    }
    let _ = writeln!(
        out,
        "<tr class=\"state-{state}{ejected_class}\" data-state=\"{state}\" data-backend=\"{addr}\">\
         <td>{addr}<span class=\"sub\">weight <span data-f=\"weight\">{}</span></span></td>\
         <td><span data-f=\"state\">{}</span><span class=\"sub\">for <span data-f=\"since\">{}</span></span></td>\
         <td data-f=\"admin\">{}</td><td class=\"reason\" data-f=\"reason\">{}</td><td class=\"n\" data-f=\"latency\">{latency}</td>\
         <td><div class=\"kv probes\" style=\"--pairs: 2\">{probes}</div></td>\
         <td><div class=\"kv rates\"><svg class=\"spark\" viewBox=\"0 0 120 20\" preserveAspectRatio=\"none\">\
         <polyline stroke=\"#1565c0\" points=\"\"/><polyline stroke=\"#c25400\" points=\"\"/></svg>\
         <span class=\"v pps\" data-f=\"pps\">–</span><span class=\"k\">pkt/s</span>\
         <span class=\"v fps\" data-f=\"fps\">–</span><span class=\"k\">flows/s</span></div></td>\
         <td><div class=\"kv totals\" style=\"--pairs: 1\"><span class=\"v\" data-f=\"packets\">{}</span>\
         <span class=\"k\">pkt</span><span class=\"v\" data-f=\"bytes\">{}</span><span class=\"k\">B</span>\
         <span class=\"v\" data-f=\"new_flows\">{}</span><span class=\"k\">flows</span></div></td></tr>",
        b.weight,
        escape(&state_words(b)),
        duration(b.state_for_s),
        b.admin.as_str(),
        b.last_failure
            .as_deref()
            .map_or_else(|| "–".to_owned(), escape),
        b.packets,
        b.bytes,
        b.new_flows,
        addr = escape(&b.address),
    );
}

/// "42 s", "3 min 4 s", "2 h 5 min", "3 d 4 h" (the script's `duration` says the same).
fn duration(s: f64) -> String {
    let s = s.max(0.0) as u64;
    match s {
        0..60 => format!("{s} s"),
        60..3600 => format!("{} min {} s", s / 60, s % 60),
        3600..86_400 => format!("{} h {} min", s / 3600, s % 3600 / 60),
        _ => format!("{} d {} h", s / 86_400, s % 86_400 / 3600),
    }
}

/// The live updates, inline (no CDN, no build step). It rewrites text and classes only; when the
/// services or backends change (a reload), it fetches this page as HTML and swaps its `<main>`.
/// `POLL_MS`, `TIMELINE_S` and `LAST_EVENTS` are defined before it.
pub const SCRIPT: &str = r#"(() => {
  'use strict';
  const SPAN_S = 300; // sparkline history kept, seconds
  const hist = new Map(); // "service\nbackend" -> [{t, p, f}], oldest first
  const body = document.body;
  const url = location.pathname + location.search;
  const mode = document.getElementById('mode');
  const utc = (t) => new Date(t * 1000).toISOString().slice(0, 19).replace('T', ' ') + ' UTC';
  const duration = (s) => {
    s = Math.max(0, Math.floor(s));
    if (s < 60) return s + ' s';
    if (s < 3600) return Math.floor(s / 60) + ' min ' + (s % 60) + ' s';
    if (s < 86400) return Math.floor(s / 3600) + ' h ' + Math.floor(s % 3600 / 60) + ' min';
    return Math.floor(s / 86400) + ' d ' + Math.floor(s % 86400 / 3600) + ' h';
  };
  // Three significant digits at most: 0.5, 12, 345, 12.3 k, 1.23 M (a rate is an estimate).
  const rate = (x) => x < 10 ? x.toFixed(1) : x < 1000 ? Math.round(x).toString()
    : x < 1e6 ? (x / 1e3).toPrecision(3) + ' k' : (x / 1e6).toPrecision(3) + ' M';
  const set = (root, f, text) => {
    const el = root.querySelector('[data-f="' + f + '"]');
    if (el && el.textContent !== String(text)) el.textContent = text;
  };
  // Whether the DOM has exactly the JSON's services and backends, in order.
  const sameShape = (st) => {
    const tables = [...document.querySelectorAll('table[data-service]')];
    return tables.length === st.services.length && st.services.every((s, i) =>
      tables[i].dataset.service === s.name &&
      [...tables[i].querySelectorAll('tr[data-backend]')].map((r) => r.dataset.backend).join('\n') ===
        s.backends.map((b) => b.address).join('\n'));
  };
  // Successive counters -> rates; the history feeds the sparkline.
  const track = (key, t, b) => {
    const h = hist.get(key) || [];
    const last = h[h.length - 1];
    if (!last || t > last.t) h.push({ t, p: b.packets, f: b.new_flows });
    while (h.length > 2 && h[0].t < t - SPAN_S) h.shift();
    hist.set(key, h);
    const rates = [];
    for (let i = 1; i < h.length; i++) {
      const dt = h[i].t - h[i - 1].t;
      rates.push({ t: h[i].t, p: Math.max(0, h[i].p - h[i - 1].p) / dt, f: Math.max(0, h[i].f - h[i - 1].f) / dt });
    }
    return rates;
  };
  // Each line on its own scale (packets far outnumber new flows: on one scale the flows would
  // lie flat); the numbers beside say how much.
  const spark = (svg, rates, t) => {
    const lines = svg.querySelectorAll('polyline');
    ['p', 'f'].forEach((k, i) => {
      const max = Math.max(1, ...rates.map((r) => r[k]));
      lines[i].setAttribute('points', rates.map((r) =>
        (120 - (t - r.t) * 120 / SPAN_S).toFixed(1) + ',' + (19 - r[k] * 18 / max).toFixed(1)).join(' '));
    });
  };
  // The event log, as far as this page has read it: the timelines' and the list's source.
  const events = [];
  let lastSeq = 0;
  const readEvents = async () => {
    const reply = await fetch('/v1/events?after=' + lastSeq + '&limit=1024', { cache: 'no-store' });
    if (!reply.ok) throw new Error('events: HTTP ' + reply.status);
    for (const e of (await reply.json()).events) {
      events.push(e);
      lastSeq = Math.max(lastSeq, e.seq);
    }
    if (events.length > 2048) events.splice(0, events.length - 2048);
  };
  // A state's band colour: up (takes flows), down, pending, off (drained, disabled, other), as
  // the server's `band`.
  const band = (state) => /^(healthy|mostly_healthy)$/.test(state) ? 'up'
    : /^(unhealthy|mostly_unhealthy|ejected)$/.test(state) ? 'down'
    : state === 'initializing' ? 'pending' : 'off';
  // One bar per backend over the last TIMELINE_S: the states its events moved it through, and
  // its state now (ejected when a passive check holds it out). The same markup as the server's
  // `history`, which this replaces on every poll.
  const timelines = (st) => {
    const root = document.getElementById('timelines');
    // From TIMELINE_S ago, or from the first event this daemon logged if that is later (before
    // it there is nothing to draw).
    const start = Math.max(st.time - TIMELINE_S, events.length ? events[0].time : st.time - 1);
    const span = Math.max(1, st.time - start);
    const html = [];
    for (const s of st.services) {
      for (const b of s.backends) {
        const mine = events.filter((e) => e.service === s.name && e.backend === b.address);
        const bands = [];
        let from = start;
        let state = mine.length ? mine[0].from : b.state;
        for (const e of mine) {
          if (e.time > start) bands.push({ from, to: e.time, state });
          from = Math.max(start, e.time);
          state = e.to;
        }
        bands.push({ from, to: st.time, state: b.ejected ? 'ejected' : b.state });
        const spans = bands.filter((x) => x.to > x.from).map((x) =>
          '<span class="band band-' + band(x.state) + '" data-state="' + esc(x.state) + '" style="left:' +
          ((x.from - start) * 100 / span).toFixed(2) + '%;width:' +
          ((x.to - x.from) * 100 / span).toFixed(2) + '%" title="' + esc(x.state + ' from ' + utc(x.from)) + '"></span>');
        const key = s.name + ' ' + b.address;
        html.push('<div class="tl" data-backend="' + esc(key) + '"><span class="tl-label">' + esc(key) +
          '</span><div class="bar">' + spans.join('') + '</div></div>');
      }
    }
    root.innerHTML = html.join('');
    const list = document.getElementById('events');
    list.innerHTML = events.slice(-LAST_EVENTS).reverse().map((e) => '<li>' + esc(utc(e.time) + ' ' +
      (e.vip ? 'VIP ' + e.vip : e.service + ' ' + e.backend) + ' ' + e.from + ' → ' + e.to + ' (' + e.source +
      (e.reason ? ': ' + e.reason : '') + ')') + '</li>').join('');
  };
  const esc = (t) => String(t).replace(/[&<>"']/g, (c) => '&#' + c.charCodeAt(0) + ';');
  const apply = (st) => {
    document.getElementById('as-of').textContent = utc(st.time);
    const conf = document.getElementById('config');
    if (conf && st.config) {
      const c = st.config;
      const version = c.source === 'etcd' ? 'revision' : 'version';
      let words = c.path + ', ' + version + ' ' + c.version + ' (applied ' + utc(c.applied_at) + ')';
      if (c.error) words += '; ' + c.source + ' out of reach, running on what it has: ' + c.error;
      if (c.refused_version && c.refused_reason) words += '; ' + version + ' ' + c.refused_version + ' refused: ' + c.refused_reason;
      words += c.last_change ? '; last change ' + utc(c.last_change.time) + ' by ' + c.last_change.who +
        ': ' + c.last_change.summary : '; no change through the API since lb started';
      set(conf, 'config', words);
    }
    const host = document.getElementById('host');
    if (host && st.announce) {
      const a = st.announce;
      host.dataset.hostState = a.state;
      set(host, 'host', a.state + ' — ' + a.vips.filter((v) => v.announced).length + ' of ' + a.vips.length +
        ' VIPs announced (table ' + a.table + ')');
    }
    for (const s of st.services) {
      const table = [...document.querySelectorAll('table[data-service]')].find((x) => x.dataset.service === s.name);
      const section = table.closest('section');
      const banner = section.querySelector('.banner');
      banner.className = 'banner svc-' + s.state;
      banner.dataset.serviceState = s.state;
      set(banner, 'state', s.state + (s.policy_in_force ? ' (on_all_unhealthy = ' + s.policy_in_force + ' in force)' : ''));
      set(banner, 'avail', s.available_backends + '/' + s.backends.length + ' backends available');
      const vip = banner.querySelector('[data-f="announce"]');
      if (vip && s.vip_announced != null) {
        vip.dataset.announced = String(s.vip_announced);
        set(banner, 'announce', s.vip_announced ? 'VIP announced' : 'VIP withdrawn');
      }
      set(section, 'traffic', s.packets + ' packets, ' + s.bytes + ' bytes, ' + s.new_flows + ' new flows');
      for (const b of s.backends) {
        const tr = [...table.querySelectorAll('tr[data-backend]')].find((x) => x.dataset.backend === b.address);
        const cls = 'state-' + b.state + (b.ejected ? ' ejected' : '');
        if (tr.className !== cls) tr.className = cls;
        if (tr.dataset.state !== b.state) tr.dataset.state = b.state;
        set(tr, 'weight', b.weight);
        set(tr, 'state', b.state.replace(/_/g, ' ') +
          (b.ejected ? ', ejected (' + b.ejected + ', ' + Math.round(b.ejected_for_s || 0) + ' s left)' : ''));
        set(tr, 'admin', b.admin);
        set(tr, 'since', duration(b.state_for_s));
        set(tr, 'reason', b.last_failure || '–');
        set(tr, 'latency', b.last_probe_latency_ms == null ? '–' : b.last_probe_latency_ms.toFixed(1) + ' ms');
        for (const k of ['success', 'tcp_failure', 'tls_failure', 'http_failure', 'payload_failure', 'timeout_failure']) {
          const n = b.counters[k] || 0;
          set(tr, k, n);
          tr.querySelector('[data-f="' + k + '"]').classList.toggle('zero', n === 0);
        }
        for (const k of ['packets', 'bytes', 'new_flows']) set(tr, k, b[k]);
        const rates = track(s.name + '\n' + b.address, st.time, b);
        const now = rates[rates.length - 1];
        set(tr, 'pps', now ? rate(now.p) : '–');
        set(tr, 'fps', now ? rate(now.f) : '–');
        spark(tr.querySelector('svg.spark'), rates, st.time);
      }
    }
  };
  const poll = async () => {
    try {
      const reply = await fetch(url, { cache: 'no-store', headers: { Accept: 'application/json' } });
      if (!reply.ok) throw new Error('HTTP ' + reply.status);
      const st = await reply.json();
      if (!sameShape(st)) {
        // Services or backends changed: this page's new HTML, swapped in (no reload).
        const html = await (await fetch(url, { cache: 'no-store', headers: { Accept: 'text/html' } })).text();
        const fresh = new DOMParser().parseFromString(html, 'text/html').getElementById('services');
        document.getElementById('services').innerHTML = fresh.innerHTML;
        if (!sameShape(st)) throw new Error('the page and the JSON disagree');
      }
      apply(st);
      await readEvents();
      timelines(st);
      body.dataset.updates = Number(body.dataset.updates) + 1;
      mode.className = '';
      mode.textContent = 'live, updated every ' + POLL_MS / 1000 + ' s';
    } catch (e) {
      mode.className = 'stale';
      mode.textContent = 'stale: ' + e.message + ' (retrying)';
    }
    setTimeout(poll, POLL_MS);
  };
  poll();
})();
"#;

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
            discovered: false,
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
            state: Default::default(),
            policy_in_force: None,
            announce: None,
            announce_min_available: None,
            vip_announced: None,
            discovery: None,
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
            announce: None,
            config: None,
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
        let html = page(&status(vec![service(evil, vec![b])]), &[], 5);
        // The one script is ours; the evil one is text.
        assert_eq!(html.matches("<script").count(), 1, "{html}");
        assert!(!html.contains(evil), "{html}");
        assert!(html.contains("&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;"));
    }

    #[test]
    fn one_table_per_service() {
        let s = status(vec![
            service("web", vec![backend("10.0.0.2:80", "healthy")]),
            service("dns", vec![]),
            service("api", vec![backend("10.0.0.3:80", "unused")]),
        ]);
        let html = page(&s, &[], 5);
        assert_eq!(html.matches("<table").count(), 3);
        assert_eq!(html.matches("</table>").count(), 3);
        // What the service is, above its table (not a caption: on a phone the table scrolls,
        // this does not).
        for name in ["web", "dns", "api"] {
            assert!(
                html.contains(&format!("<p class=\"about\">{name} — ")),
                "{html}"
            );
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
        let html = page(&status(vec![per_kind]), &[], 5);
        assert!(
            html.contains("unhealthy after 1 refused/TLS, 3 timeouts, 3 HTTP failures"),
            "{html}"
        );
        assert!(html.contains("<title>lb status</title>"));
        assert!(html.contains("As of <span id=\"as-of\">2023-11-14 22:13:20 UTC</span>"));
    }

    #[test]
    fn rows_carry_state_class_and_words() {
        let mut quiet = backend("10.0.0.4:80", "mostly_unhealthy");
        quiet.last_probe_latency_ms = None;
        quiet.last_failure = Some("connection <refused>".to_owned());
        quiet.state_for_s = 125.7;
        quiet.counters.tcp_failure = 2;
        let mut out = backend("10.0.0.5:80", "healthy");
        out.ejected = Some("service: refused".to_owned());
        out.ejected_for_s = Some(4.2);
        let s = status(vec![service(
            "web",
            vec![backend("10.0.0.2:80", "healthy"), quiet, out],
        )]);
        let html = page(&s, &[], 5);
        assert!(html.contains(
            "<tr class=\"state-healthy\" data-state=\"healthy\" data-backend=\"10.0.0.2:80\">\
             <td>10.0.0.2:80<span class=\"sub\">weight <span data-f=\"weight\">1</span></span></td>\
             <td><span data-f=\"state\">healthy</span><span class=\"sub\">for <span data-f=\"since\">3 s</span></span></td>\
             <td data-f=\"admin\">enabled</td><td class=\"reason\" data-f=\"reason\">–</td>\
             <td class=\"n\" data-f=\"latency\">1.5 ms</td><td><div class=\"kv probes\" style=\"--pairs: 2\">\
             <span class=\"k\" title=\"consecutive successes\">ok</span><span class=\"v\" data-f=\"success\">4</span>"
        ), "{html}");
        assert!(html.contains(
            "<tr class=\"state-mostly_unhealthy\" data-state=\"mostly_unhealthy\" \
             data-backend=\"10.0.0.4:80\"><td>10.0.0.4:80<span class=\"sub\">weight <span data-f=\"weight\">1</span></span></td>\
             <td><span data-f=\"state\">mostly unhealthy</span><span class=\"sub\">for <span data-f=\"since\">2 min 5 s</span></span></td>\
             <td data-f=\"admin\">enabled</td><td class=\"reason\" data-f=\"reason\">connection &lt;refused&gt;</td>\
             <td class=\"n\" data-f=\"latency\">–</td>"
        ), "{html}");
        // Every consecutive counter, labelled, zeros dimmed.
        assert!(
            html.contains(
                "<span class=\"v\" data-f=\"tcp_failure\">2</span><span class=\"k\" \
             title=\"consecutive replies to `send` not the expected ones\">payload</span>\
             <span class=\"v zero\" data-f=\"payload_failure\">0</span>"
            ),
            "{html}"
        );
        for f in [
            "success",
            "tcp_failure",
            "tls_failure",
            "http_failure",
            "payload_failure",
            "timeout_failure",
        ] {
            assert_eq!(html.matches(&format!("data-f=\"{f}\"")).count(), 3, "{f}");
        }
        // Traffic totals, labelled.
        assert!(html.contains(
            "<div class=\"kv totals\" style=\"--pairs: 1\"><span class=\"v\" data-f=\"packets\">10</span>\
             <span class=\"k\">pkt</span><span class=\"v\" data-f=\"bytes\">1000</span><span class=\"k\">B</span>\
             <span class=\"v\" data-f=\"new_flows\">2</span><span class=\"k\">flows</span></div>"
        ), "{html}");
        assert!(html.contains(
            "<tr class=\"state-healthy ejected\" data-state=\"healthy\" data-backend=\"10.0.0.5:80\">"
        ));
        assert!(html.contains("healthy, ejected (service: refused, 4 s left)"));
        // Consecutive counters are labelled as such; rates wait for the script.
        assert!(html.contains(">consecutive probes</th>"));
        assert_eq!(
            html.matches("<span class=\"v pps\" data-f=\"pps\">–</span>")
                .count(),
            3
        );
        assert_eq!(html.matches("<svg class=\"spark\"").count(), 3);
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
    fn banner_per_service() {
        let mut down = service("web", vec![backend("10.0.0.2:80", "unhealthy")]);
        down.state = crate::model::ServiceState::Down;
        down.available_backends = 0;
        down.policy_in_force = Some("drop".to_owned());
        let html = page(&status(vec![down, service("dns", vec![])]), &[], 5);
        assert!(
            html.contains(
                "<div class=\"banner svc-down\" data-service-state=\"down\">web — \
             <span data-f=\"state\">down (on_all_unhealthy = drop in force)</span> — \
             <span data-f=\"avail\">0/1 backends available</span></div>"
            ),
            "{html}"
        );
        assert!(html.contains(
            "<div class=\"banner svc-empty\" data-service-state=\"empty\">dns — \
             <span data-f=\"state\">empty</span>"
        ));
        assert_eq!(html.matches("<section class=\"service\">").count(), 2);
    }

    #[test]
    fn the_banner_says_whether_the_vip_is_announced() {
        let mut web = service("web", vec![backend("10.0.0.2:80", "healthy")]);
        web.state = crate::model::ServiceState::Healthy;
        web.announce = Some("healthy".to_owned());
        web.vip_announced = Some(true);
        let mut api = service("api", vec![backend("10.0.0.3:80", "unhealthy")]);
        api.announce = Some("always".to_owned());
        api.vip_announced = Some(false);
        let mut s = status(vec![web, api]);
        s.announce = Some(crate::model::AnnounceStatus {
            state: "announcing".to_owned(),
            table: 200,
            protocol: 250,
            grace_s: 5.0,
            last_change: None,
            vips: vec![crate::model::VipStatus {
                vip: "10.1.0.1".to_owned(),
                announced: true,
                wanted: Some(true),
                reason: "web: 1 of 1 backend available (needs 1)".to_owned(),
                services: vec!["web".to_owned(), "api".to_owned()],
                since: None,
                error: None,
            }],
        });
        let html = page(&s, &[], 5);
        assert!(
            html.contains(
                "<span data-f=\"avail\">1/1 backends available</span> — <span data-f=\"announce\" \
             data-announced=\"true\" title=\"announce = healthy\">VIP announced</span></div>"
            ),
            "{html}"
        );
        assert!(html.contains(
            "<span data-f=\"announce\" data-announced=\"false\" title=\"announce = always\">VIP withdrawn</span>"
        ));
        assert!(html.contains(
            "<p id=\"host\" data-host-state=\"announcing\">Host: <span data-f=\"host\">announcing — \
             1 of 1 VIPs announced (table 200)</span></p>\n<main id=\"services\">"
        ), "{html}");
        // Without [lb.announce] neither is there.
        let plain = page(&status(vec![service("web", vec![])]), &[], 5);
        assert!(!plain.contains("<span data-f=\"announce\"") && !plain.contains("<p id=\"host\""));
    }

    #[test]
    fn refreshes_itself_without_script_and_in_place_with_it() {
        let html = page(&status(vec![]), &[], 7);
        assert!(html.starts_with("<!DOCTYPE html>"));
        assert!(html.contains("<noscript><meta http-equiv=\"refresh\" content=\"7\"></noscript>"));
        assert_eq!(html.matches("http-equiv=\"refresh\"").count(), 1);
        assert!(html.contains("<body data-loaded-at=\"1700000000.5\" data-updates=\"0\">"));
        assert!(html.contains("<meta name=\"viewport\""));
        // Inline, nothing fetched but the status itself and the event log.
        assert!(
            html.contains(
                "<script>\nconst POLL_MS = 1000;\nconst TIMELINE_S = 600;\nconst LAST_EVENTS = 20;\n(() => {"
            )
        );
        // No event logged: nothing in the list, a bar per backend all the same.
        assert!(
            html.contains("<div id=\"timelines\"></div>")
                && html.contains("<ol id=\"events\" reversed></ol>")
        );
        assert!(!html.contains("<script src"));
        assert!(!SCRIPT.contains("</script"));
        assert!(!SCRIPT.contains("http://") && !SCRIPT.contains("https://"));
        assert!(SCRIPT.contains("location.pathname + location.search"));
        for link in ["/v1/healthcheck", "/metrics", "/v1/events"] {
            assert!(html.contains(&format!("<a href=\"{link}\">")), "{link}");
        }
        assert!(html.trim_end().ends_with("</html>"));
    }

    fn event(time: f64, backend: &str, from: &str, to: &str, reason: Option<&str>) -> Event {
        Event {
            seq: 0,
            time,
            service: "web".to_owned(),
            backend: backend.to_owned(),
            from: from.to_owned(),
            to: to.to_owned(),
            source: "http".to_owned(),
            counters: ProbeCounters::default(),
            healthy_threshold: 3,
            unhealthy_threshold: 3,
            flag_write_us: None,
            reason: reason.map(str::to_owned),
            vip: None,
        }
    }

    /// The timelines and the events without JavaScript, as the script draws them.
    #[test]
    fn history_is_rendered_from_the_event_log() {
        let t = 1_700_000_000.5;
        let mut down = backend("10.0.0.3:80", "unhealthy");
        down.last_failure = Some("connection refused".to_owned());
        let mut ejected = backend("10.0.0.4:80", "healthy");
        ejected.ejected = Some("service: refused".to_owned());
        let s = status(vec![service(
            "web",
            vec![backend("10.0.0.2:80", "healthy"), down, ejected],
        )]);
        let mut events = vec![
            // Before the timeline's start (more than 10 min ago): only says where it began.
            event(t - 900.0, "10.0.0.3:80", "initializing", "healthy", None),
            event(
                t - 300.0,
                "10.0.0.3:80",
                "healthy",
                "unhealthy",
                Some("<refused>"),
            ),
        ];
        let mut vip = event(t - 60.0, "", "withdrawn", "announced", Some("web: 1 of 3"));
        vip.vip = Some("10.1.0.1".to_owned());
        vip.service = String::new();
        vip.source = "announce".to_owned();
        events.push(vip);
        let html = page(&s, &events, 5);
        // 10 minutes: healthy from the start for 5 minutes, then unhealthy up to now.
        assert!(html.contains(
            "<div class=\"tl\" data-backend=\"web 10.0.0.3:80\"><span class=\"tl-label\">web 10.0.0.3:80</span>\
             <div class=\"bar\"><span class=\"band band-up\" data-state=\"healthy\" style=\"left:0.00%;width:50.00%\" \
             title=\"healthy from 2023-11-14 22:03:20 UTC\"></span><span class=\"band band-down\" \
             data-state=\"unhealthy\" style=\"left:50.00%;width:50.00%\" \
             title=\"unhealthy from 2023-11-14 22:08:20 UTC\"></span></div></div>"
        ), "{html}");
        // Without events of its own, its state now all along; ejected is down.
        assert!(html.contains(
            "<div class=\"bar\"><span class=\"band band-up\" data-state=\"healthy\" style=\"left:0.00%;width:100.00%\""
        ));
        assert!(html.contains(
            "<span class=\"band band-down\" data-state=\"ejected\" style=\"left:0.00%;width:100.00%\""
        ));
        assert_eq!(
            html.matches("<div class=\"tl\" data-backend=\"web ")
                .count(),
            3
        );
        // Newest first, escaped.
        assert!(html.contains(
            "<ol id=\"events\" reversed><li>2023-11-14 22:12:20 UTC VIP 10.1.0.1 withdrawn → announced \
             (announce: web: 1 of 3)</li><li>2023-11-14 22:08:20 UTC web 10.0.0.3:80 healthy → unhealthy \
             (http: &lt;refused&gt;)</li><li>2023-11-14 21:58:20 UTC web 10.0.0.3:80 initializing → healthy \
             (http)</li></ol>"
        ), "{html}");
        // At most LAST_EVENTS, the last ones.
        let many: Vec<Event> = (0..30)
            .map(|i| {
                event(
                    t - 30.0 + f64::from(i),
                    "10.0.0.2:80",
                    "healthy",
                    &format!("s{i}"),
                    None,
                )
            })
            .collect();
        let html = page(&s, &many, 5);
        assert_eq!(html.matches("<li>2023-").count(), LAST_EVENTS);
        assert!(html.contains("healthy → s29 (http)</li>") && !html.contains("→ s9 "));
    }

    #[test]
    fn durations() {
        assert_eq!(duration(-1.0), "0 s");
        assert_eq!(duration(59.9), "59 s");
        assert_eq!(duration(60.0), "1 min 0 s");
        assert_eq!(duration(3.0 * 3600.0 + 61.0), "3 h 1 min");
        assert_eq!(duration(2.0 * 86_400.0 + 7200.0), "2 d 2 h");
    }

    #[test]
    fn utc_dates() {
        assert_eq!(utc(0.0), "1970-01-01 00:00:00 UTC");
        assert_eq!(utc(951_782_400.0), "2000-02-29 00:00:00 UTC");
        assert_eq!(utc(1_767_225_599.0), "2025-12-31 23:59:59 UTC");
    }
}
