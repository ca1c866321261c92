//! Configuration changes (part 7): one backend added to one service of 500 (and removed again)
//! through the API, against a reload of the same change made by hand in the file, interleaved
//! in one run. The API's change is timed at the client (the whole write path: edit, validate as
//! check-config does, write and sync the file, apply) and by the daemon's own breakdown; the
//! reload at the client (`POST /v1/reload`, as `lb reload` sends it).

use std::{
    fmt::Write as _,
    net::SocketAddr,
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};
use lb::{
    client::{self, Extra},
    model::ChangeReply,
};

use crate::{
    bench::{checkpoint, median},
    daemon::Daemon,
    netns::{Netns, veth},
};

/// Services and backends per service of the configuration changed.
pub const SERVICES: usize = 500;
const BACKENDS: usize = 4;

#[derive(Default)]
pub struct ConfigWrite {
    /// Client-side time of a change through the API, ms.
    pub api_ms: Vec<f64>,
    /// The daemon's breakdown of those: validate, write (synced), apply.
    pub validate_ms: Vec<f64>,
    pub write_ms: Vec<f64>,
    pub apply_ms: Vec<f64>,
    /// Client-side time of a reload of the same change made by hand, ms.
    pub reload_ms: Vec<f64>,
}

/// The configuration: `SERVICES` services of `BACKENDS` backends each (all distinct), no
/// checks (their probes are not what is measured).
fn config(iface: &str) -> String {
    let mut text = format!(
        "[lb]\ninterfaces = [\"{iface}\"]\nmax_services = {}\nmax_backends = 8192\n\n",
        SERVICES + 10
    );
    for i in 0..SERVICES {
        let backends: Vec<String> = (0..BACKENDS)
            .map(|j| {
                let n = i * BACKENDS + j;
                format!("{{ address = \"10.1.{}.{}:8080\" }}", n / 250, n % 250 + 1)
            })
            .collect();
        let _ = write!(
            text,
            "[[service]]\nname = \"s{i}\"\nvip = \"10.100.{}.{}:80\"\nbackends = [{}]\n\
             [service.check]\nkind = \"none\"\n\n",
            i / 250,
            i % 250 + 1,
            backends.join(", ")
        );
    }
    text
}

fn request(
    d: &Daemon,
    method: &str,
    path: &str,
    body: Option<&[u8]>,
) -> anyhow::Result<(u16, String, f64)> {
    let addr: SocketAddr = d.api.parse()?;
    let extra = Extra {
        headers: Vec::new(),
        json: body.map(<[u8]>::to_vec),
    };
    let (method, path) = (method.to_owned(), path.to_owned());
    d.ns.block_on(|| async move {
        let start = Instant::now();
        let (status, body) = client::request_with(addr, &method, &path, None, &extra).await?;
        Ok((status, body, start.elapsed().as_secs_f64() * 1000.0))
    })
}

/// The file with backend `address` added to (or removed from) service `service` by hand.
fn hand_edit(d: &Daemon, service: &str, address: &str, add: bool) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(&d.config)?;
    let at = text
        .find(&format!("name = \"{service}\"\n"))
        .context("the service in the file")?;
    let list = at + text[at..].find("backends = [").context("its backends")? + "backends = [".len();
    let entry = format!("{{ address = \"{address}\" }}, ");
    let new = if add {
        format!("{}{entry}{}", &text[..list], &text[list..])
    } else {
        text.replacen(&entry, "", 1)
    };
    std::fs::write(&d.config, new)?;
    Ok(())
}

pub fn run(rounds: usize) -> anyhow::Result<ConfigWrite> {
    let ns = Netns::new("cfgw")?;
    let peer = Netns::new("cfgwpeer")?;
    let (port, _) = veth(&ns, "10.0.0.1/8", &peer, "10.255.255.254/8")?;
    ns.sysctl("net/ipv4/ip_forward", "1")?;
    let d = Daemon::start(&ns, &config(&port.ifname))?;
    let mut out = ConfigWrite::default();
    for round in 0..rounds {
        checkpoint()?;
        let address = format!("10.1.200.{}:8080", round % 250 + 1);
        // Through the API: added, then removed.
        for method in ["PUT", "DELETE"] {
            let path = format!("/v1/services/s250/backends/{address}");
            let body = (method == "PUT").then_some(&b"{}"[..]);
            let (status, text, ms) = request(&d, method, &path, body)?;
            if status != 200 {
                bail!("{method} {path}: {status} {text}");
            }
            let reply: ChangeReply = serde_json::from_str(&text)?;
            out.api_ms.push(ms);
            out.validate_ms.push(reply.timing.validate_ms);
            out.write_ms.push(reply.timing.write_ms);
            out.apply_ms.push(reply.timing.apply_ms);
        }
        // The same by hand, then a reload.
        for add in [true, false] {
            hand_edit(&d, "s251", &address, add)?;
            let (status, text, ms) = request(&d, "POST", "/v1/reload", None)?;
            if status != 200 {
                bail!("reload: {status} {text}");
            }
            out.reload_ms.push(ms);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(out)
}

/// Its 99th percentile (the largest of fewer than 100 samples).
fn p99(samples: &[f64]) -> f64 {
    let mut s = samples.to_vec();
    s.sort_by(f64::total_cmp);
    let i = ((s.len() as f64) * 0.99).ceil() as usize;
    s.get(i.saturating_sub(1)).copied().unwrap_or(f64::NAN)
}

pub fn markdown(c: &ConfigWrite) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "One backend added to one service of {SERVICES} ({BACKENDS} backends each, {} in all), \
         then removed: through the API (`PUT` / `DELETE /v1/services/NAME/backends/ADDR`), and \
         the same change made by hand in the file followed by a reload (`POST /v1/reload`, as \
         `lb reload` sends it), interleaved; {} changes each. Client-side times, release build.\n",
        SERVICES * BACKENDS,
        c.api_ms.len()
    );
    let _ = writeln!(s, "| | median ms | p99 ms |\n|---|---:|---:|");
    for (name, v) in [
        ("change through the API (whole write path)", &c.api_ms),
        (
            "— of which: edit and validate (the whole file)",
            &c.validate_ms,
        ),
        (
            "— of which: write the file (synced, with a backup)",
            &c.write_ms,
        ),
        ("— of which: apply to the running state", &c.apply_ms),
        ("reload of the same change made by hand", &c.reload_ms),
    ] {
        let _ = writeln!(s, "| {name} | {:.1} | {:.1} |", median(v), p99(v));
    }
    let _ = writeln!(
        s,
        "\nBoth rebuild only the ring of the service changed (the others' rings are kept as \
         written: their inputs did not change) and resolve only the new backend's neighbour; \
         both validate the whole file, as `lb check-config` would.\n"
    );
    s
}
