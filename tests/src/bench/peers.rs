//! The peers of the end-to-end benchmark, all run inside the benchmark's namespaces: nginx serving
//! a small file and an iperf3 server on the backend; HAProxy (tcp mode) and nginx (stream) as
//! balancers in lb's namespace; nftables DNAT there too; iperf3 and wrk as clients.

use std::{
    net::{Ipv4Addr, SocketAddr},
    path::{Path, PathBuf},
    time::Duration,
};

use anyhow::{Context as _, bail};

use crate::{
    bench::{run_limited, spawn_server, wait_listening},
    netns::{Netns, Process},
};

/// The backend's ports: iperf3 and HTTP (nginx).
pub const IPERF_PORT: u16 = 5201;
pub const HTTP_PORT: u16 = 8080;
/// Each balancer's VIP serves iperf3 on IPERF_PORT and HTTP on port 80.
pub const VIP_HTTP_PORT: u16 = 80;
/// The file wrk fetches; its size in bytes.
pub const FILE: &str = "/small.txt";
pub const FILE_SIZE: usize = 1024;

/// A directory for configs and logs, world-readable (nginx's workers run as `nobody`).
pub fn workdir(dir: &Path, name: &str) -> anyhow::Result<PathBuf> {
    use std::os::unix::fs::PermissionsExt as _;
    let d = dir.join(name);
    std::fs::create_dir_all(&d)?;
    std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755))?;
    Ok(d)
}

/// The main context of an nginx working in `dir`, with `workers` worker processes.
fn nginx_common(dir: &Path, workers: &str) -> String {
    format!(
        "daemon off;\nmaster_process on;\nworker_processes {workers};\npid {d}/nginx.pid;\n\
         error_log {d}/error.log warn;\nevents {{ worker_connections 16384; }}\n",
        d = dir.display()
    )
}

/// An `http` context's temporary paths, in `dir` (nginx's defaults need its prefix writable).
fn http_temp_paths(dir: &Path) -> String {
    let d = dir.display();
    format!(
        "client_body_temp_path {d}/body;\n  proxy_temp_path {d}/proxy;\n  \
         fastcgi_temp_path {d}/fastcgi;\n  uwsgi_temp_path {d}/uwsgi;\n  scgi_temp_path {d}/scgi;\n  "
    )
}

fn nginx(ns: &Netns, dir: &Path, conf: &str) -> anyhow::Result<Process> {
    let path = dir.join("nginx.conf");
    std::fs::write(&path, conf)?;
    let (p, c, e) = (
        dir.display().to_string(),
        path.display().to_string(),
        dir.join("error.log").display().to_string(),
    );
    // -t first: a config error is reported as such rather than as a port that never opens.
    let (ok, out, err) = run_limited(
        ns.command("nginx")
            .args(["-t", "-p", &p, "-c", &c, "-e", &e]),
        Duration::from_secs(10),
    )?;
    if !ok {
        bail!("nginx -t: {out}{err}");
    }
    spawn_server(
        ns,
        "nginx",
        &["-p", &p, "-c", &c, "-e", &e],
        &dir.join("stdout.log"),
    )
}

fn nginx_log(dir: &Path) -> PathBuf {
    dir.join("error.log")
}

/// nginx on the backend: `FILE` (FILE_SIZE bytes) over HTTP/1.1 with keep-alive.
pub fn backend_http(ns: &Netns, dir: &Path, addr: Ipv4Addr) -> anyhow::Result<Process> {
    let dir = workdir(dir, "backend-nginx")?;
    let www = workdir(&dir, "www")?;
    std::fs::write(
        www.join(FILE.trim_start_matches('/')),
        "x".repeat(FILE_SIZE - 1) + "\n",
    )?;
    let conf = format!(
        "{}http {{\n  access_log off;\n  default_type text/plain;\n  keepalive_requests 10000000;\n  \
         {}server {{\n    listen {addr}:{HTTP_PORT} backlog=4096;\n    root {};\n  }}\n}}\n",
        nginx_common(&dir, "auto"),
        http_temp_paths(&dir),
        www.display()
    );
    let p = nginx(ns, &dir, &conf)?;
    wait_listening(
        ns,
        SocketAddr::from((addr, HTTP_PORT)),
        "backend nginx",
        &nginx_log(&dir),
    )?;
    Ok(p)
}

/// `iperf3 -s` on the backend.
pub fn backend_iperf(ns: &Netns, dir: &Path, addr: Ipv4Addr) -> anyhow::Result<Process> {
    let dir = workdir(dir, "backend-iperf3")?;
    let a = addr.to_string();
    let port = IPERF_PORT.to_string();
    let log = dir.join("iperf3.log");
    let p = spawn_server(ns, "iperf3", &["-s", "-B", &a, "-p", &port], &log)?;
    wait_listening(ns, SocketAddr::from((addr, IPERF_PORT)), "iperf3 -s", &log)?;
    Ok(p)
}

/// nginx `stream` proxying `vip` (IPERF_PORT, VIP_HTTP_PORT) to the backend.
pub fn nginx_stream(
    ns: &Netns,
    dir: &Path,
    vip: Ipv4Addr,
    backend: Ipv4Addr,
) -> anyhow::Result<Process> {
    let dir = workdir(dir, "nginx-stream")?;
    let conf = format!(
        "load_module /usr/lib/nginx/modules/ngx_stream_module.so;\n{}stream {{\n  \
         server {{ listen {vip}:{IPERF_PORT} backlog=4096; proxy_pass {backend}:{IPERF_PORT}; }}\n  \
         server {{ listen {vip}:{VIP_HTTP_PORT} backlog=4096; proxy_pass {backend}:{HTTP_PORT}; }}\n}}\n",
        nginx_common(&dir, "auto")
    );
    let p = nginx(ns, &dir, &conf)?;
    wait_listening(
        ns,
        SocketAddr::from((vip, VIP_HTTP_PORT)),
        "nginx stream",
        &nginx_log(&dir),
    )?;
    Ok(p)
}

/// nginx answering the health checks of every address of `ns` (wildcard listeners): HTTP on
/// `http_port` (`GET /health` → 200, other paths 404; also the port tcp-connect checks open and
/// close) and UDP on `udp_port` (each datagram answered with `pong`, from the address it was
/// sent to). One worker: the benchmark measures the checker, not nginx.
pub fn health_targets(
    ns: &Netns,
    dir: &Path,
    http_port: u16,
    udp_port: u16,
) -> anyhow::Result<Process> {
    let dir = workdir(dir, "health-nginx")?;
    let conf = format!(
        "load_module /usr/lib/nginx/modules/ngx_stream_module.so;\n{}\
         http {{\n  access_log off;\n  {}\
         server {{\n    listen {http_port} backlog=4096;\n    location = /health {{ return 200 \"ok\\n\"; }}\n    \
         location / {{ return 404; }}\n  }}\n}}\n\
         stream {{\n  server {{ listen {udp_port} udp; return \"pong\"; }}\n}}\n",
        nginx_common(&dir, "1"),
        http_temp_paths(&dir)
    );
    let p = nginx(ns, &dir, &conf)?;
    wait_listening(
        ns,
        SocketAddr::from((Ipv4Addr::LOCALHOST, http_port)),
        "health nginx",
        &nginx_log(&dir),
    )?;
    Ok(p)
}

/// HAProxy in tcp mode: `listen` sections of (name, bind, server address, server options).
pub struct Haproxy {
    pub process: Process,
    pub socket: PathBuf,
}

pub fn haproxy(
    ns: &Netns,
    dir: &Path,
    name: &str,
    listens: &[(&str, SocketAddr, SocketAddr, &str)],
) -> anyhow::Result<Haproxy> {
    let dir = workdir(dir, name)?;
    let socket = dir.join("haproxy.sock");
    let mut conf = format!(
        "global\n  maxconn 8000\n  stats socket {} mode 600 level admin\n\n\
         defaults\n  mode tcp\n  timeout connect 5s\n  timeout client 60s\n  timeout server 60s\n",
        socket.display()
    );
    for (name, bind, server, options) in listens {
        conf += &format!("\nlisten {name}\n  bind {bind}\n  server b0 {server} {options}\n");
    }
    let path = dir.join("haproxy.cfg");
    std::fs::write(&path, conf)?;
    let cfg = path.display().to_string();
    let (ok, out, err) = run_limited(
        ns.command("haproxy").args(["-c", "-f", &cfg]),
        Duration::from_secs(10),
    )?;
    if !ok {
        bail!("haproxy -c: {out}{err}");
    }
    let log = dir.join("haproxy.log");
    let process = spawn_server(ns, "haproxy", &["-db", "-f", &cfg], &log)?;
    for (_, bind, _, _) in listens {
        wait_listening(ns, *bind, "haproxy", &log)?;
    }
    Ok(Haproxy { process, socket })
}

impl Haproxy {
    /// `show stat` on the stats socket: the `status` column of server `b0` of proxy `proxy`
    /// (`UP`, `DOWN`, `UP 1/3` while going down, `DOWN 1/2` while coming up, ...).
    pub fn server_status(&self, proxy: &str) -> anyhow::Result<String> {
        use std::io::{Read as _, Write as _};
        let mut s = std::os::unix::net::UnixStream::connect(&self.socket)
            .with_context(|| format!("connecting to {}", self.socket.display()))?;
        s.write_all(b"show stat\n")?;
        let mut text = String::new();
        s.read_to_string(&mut text)?;
        let header = text.lines().next().context("empty show stat")?;
        let col = header
            .trim_start_matches("# ")
            .split(',')
            .position(|c| c == "status")
            .context("no status column")?;
        text.lines()
            .map(|l| l.split(',').collect::<Vec<_>>())
            .find(|f| f.first() == Some(&proxy) && f.get(1) == Some(&"b0"))
            .and_then(|f| f.get(col).map(|s| (*s).to_owned()))
            .with_context(|| format!("no server {proxy}/b0 in show stat"))
    }
}

/// One iperf3 run: what the receiver got.
#[derive(Clone, Copy, Debug)]
pub struct Iperf {
    pub gbit_per_s: f64,
    pub bytes: f64,
}

/// `iperf3 -c` from `ns` for `seconds` with `streams` parallel streams.
pub fn iperf(ns: &Netns, to: SocketAddr, streams: u32, seconds: u64) -> anyhow::Result<Iperf> {
    let (ok, out, err) = run_limited(
        ns.command("iperf3").args([
            "-c",
            &to.ip().to_string(),
            "-p",
            &to.port().to_string(),
            "-t",
            &seconds.to_string(),
            "-P",
            &streams.to_string(),
            "-J",
        ]),
        Duration::from_secs(seconds + 20),
    )?;
    let json: serde_json::Value = serde_json::from_str(&out)
        .with_context(|| format!("iperf3 output is not JSON: {out}{err}"))?;
    if !ok || json.get("error").is_some() {
        bail!("iperf3 to {to}: {}{err}", json["error"]);
    }
    let received = &json["end"]["sum_received"];
    match (
        received["bits_per_second"].as_f64(),
        received["bytes"].as_f64(),
    ) {
        (Some(bits), Some(bytes)) => Ok(Iperf {
            gbit_per_s: bits / 1e9,
            bytes,
        }),
        _ => bail!("no end.sum_received in iperf3 output: {out}"),
    }
}

/// One wrk run.
#[derive(Clone, Debug, Default)]
pub struct Wrk {
    pub requests_per_s: f64,
    pub requests: u64,
    /// Socket errors (connect, read, write, timeout) and non-2xx/3xx responses.
    pub errors: u64,
}

/// wrk from `ns` against `http://to/FILE`: `close` adds `Connection: close` (a new connection per
/// request).
pub fn wrk(
    ns: &Netns,
    to: SocketAddr,
    close: bool,
    connections: u32,
    seconds: u64,
) -> anyhow::Result<Wrk> {
    let url = format!("http://{to}{FILE}");
    let (c, d) = (connections.to_string(), format!("{seconds}s"));
    let mut cmd = ns.command("wrk");
    cmd.args(["-t", "2", "-c", &c, "-d", &d, "--timeout", "5s"]);
    if close {
        cmd.args(["-H", "Connection: close"]);
    }
    cmd.arg(&url);
    let (ok, out, err) = run_limited(&mut cmd, Duration::from_secs(seconds + 20))?;
    if !ok {
        bail!("wrk {url}: {out}{err}");
    }
    parse_wrk(&out).with_context(|| format!("wrk output: {out}{err}"))
}

fn parse_wrk(out: &str) -> anyhow::Result<Wrk> {
    let mut w = Wrk::default();
    for line in out.lines().map(str::trim) {
        if let Some(v) = line.strip_prefix("Requests/sec:") {
            w.requests_per_s = v.trim().parse()?;
        } else if let Some(rest) = line.strip_prefix("Socket errors:") {
            w.errors += rest
                .split(',')
                .filter_map(|p| p.split_whitespace().last()?.parse::<u64>().ok())
                .sum::<u64>();
        } else if let Some(v) = line.strip_prefix("Non-2xx or 3xx responses:") {
            w.errors += v.trim().parse::<u64>()?;
        } else if line.contains(" requests in ") {
            w.requests = line
                .split_whitespace()
                .next()
                .and_then(|n| n.parse().ok())
                .unwrap_or(0);
        }
    }
    if w.requests_per_s == 0.0 {
        bail!("no Requests/sec line");
    }
    Ok(w)
}

/// Installed versions of the peers, for the report.
pub fn versions() -> Vec<(String, String)> {
    let first = |cmd: &str, args: &[&str]| -> String {
        std::process::Command::new(cmd)
            .args(args)
            .output()
            .map(|o| {
                let text = format!(
                    "{}{}",
                    String::from_utf8_lossy(&o.stdout),
                    String::from_utf8_lossy(&o.stderr)
                );
                text.lines().next().unwrap_or("").trim().to_owned()
            })
            .unwrap_or_else(|_| "not installed".into())
    };
    vec![
        ("HAProxy".into(), first("haproxy", &["-v"])),
        ("nginx".into(), first("nginx", &["-v"])),
        ("iperf3".into(), first("iperf3", &["-v"])),
        ("wrk".into(), first("wrk", &["-v"])),
        ("nft".into(), first("nft", &["--version"])),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wrk_output() {
        let out = "Running 5s test @ http://10.0.2.10:8080/small.txt\n  2 threads and 32 connections\n\
                   Thread Stats   Avg      Stdev     Max   +/- Stdev\n    Latency   1.00ms  0.50ms  10.00ms   90.00%\n\
                   123456 requests in 5.00s, 140.00MB read\n  Socket errors: connect 0, read 3, write 0, timeout 2\n\
                   Non-2xx or 3xx responses: 4\nRequests/sec:  24691.20\nTransfer/sec:     28.00MB\n";
        let w = parse_wrk(out).unwrap();
        assert_eq!(w.requests, 123456);
        assert_eq!(w.errors, 9);
        assert!((w.requests_per_s - 24691.2).abs() < 1e-6);
    }
}
