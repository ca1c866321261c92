//! Scale-out (part 6): three lb hosts behind a BIRD router with ECMP (the test bed of
//! [`crate::cluster`]). Per round: every backend of a service stopped, the time from the last
//! host's last verdict to the VIP gone from the router's table (route health injection end to
//! end); one host's link cut while streams run, the time until the router's route left it, the
//! new connections that failed meanwhile (one tried every 20 ms) and the streams that broke; the
//! link back, the time until the router has the host again.

use std::{
    fmt::Write as _,
    net::{Ipv4Addr, SocketAddr},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use anyhow::Context as _;

use crate::{
    bench::{checkpoint, median, min_max},
    cluster::Cluster,
    daemon::Daemon,
    routewatch::RouteWatch,
    traffic::{PacedStream, paced_streams},
};

const PORT: u16 = 8080;
const VIP: Ipv4Addr = Ipv4Addr::new(10, 100, 0, 1);
const VIP2: Ipv4Addr = Ipv4Addr::new(10, 100, 0, 3);
const STREAMS: usize = 30;

#[derive(Default)]
pub struct Cluster6 {
    /// Last verdict → VIP gone at the router, ms.
    pub withdraw_ms: Vec<f64>,
    /// Link cut → the router's route without the host, ms.
    pub converge_ms: Vec<f64>,
    /// New connections that failed around a host's death, per round.
    pub failed_connections: Vec<usize>,
    /// DSR streams broken by a host's death, per round (of [`STREAMS`]).
    pub broken_streams: Vec<usize>,
    /// Link back → the router has the host again, ms.
    pub rejoin_ms: Vec<f64>,
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

pub fn run(rounds: usize) -> anyhow::Result<Cluster6> {
    let mut c = Cluster::build(3, 3, PORT)?;
    let _decaps = c.serve_vip(VIP.into())?;
    let b = c.backends_toml();
    let check = "[service.check]\nkind = \"tcp\"\ntimeout = \"200ms\"\ninterval = \"300ms\"\n\
                 unhealthy_threshold = 2\nhealthy_threshold = 2\n";
    let services = format!(
        "[[service]]\nname = \"web\"\nvip = \"{VIP}:{PORT}\"\nforwarding = \"gue\"\nbackends = [{b}]\n{check}\n\
         [[service]]\nname = \"api\"\nvip = \"{VIP2}:{PORT}\"\nbackends = [{b}]\n{check}"
    );
    let lbs = (0..3)
        .map(|i| Daemon::start(&c.hosts[i].ns, &c.lb_config(i, "1s", &services)))
        .collect::<anyhow::Result<Vec<_>>>()?;
    for vip in [VIP, VIP2] {
        c.wait_nexthops(vip, &[0, 1, 2], Duration::from_secs(30))?;
    }
    let watch = RouteWatch::start(&c.router, 254, 12)?;
    let mut out = Cluster6::default();
    for round in 0..rounds {
        checkpoint()?;
        // Withdrawal: every backend of both services gone.
        for i in 0..c.backends.len() {
            c.stop_backend(i);
        }
        let gone = watch
            .wait(VIP2.into(), false, Duration::from_secs(20))
            .context("VIP not withdrawn")?;
        let mut last = 0.0f64;
        for lb in &lbs {
            for k in &c.backends {
                let at = format!("{}:{PORT}", k.addr);
                if let Some(t) = lb.moved_at("api", &at, "unhealthy") {
                    last = last.max(t);
                }
            }
        }
        out.withdraw_ms.push((gone - last) * 1e3);
        for i in 0..c.backends.len() {
            c.start_backend(i)?;
        }
        // Every host must see every backend healthy again before the streams start: a flow
        // opened while the hosts' verdicts differ may be on another backend than the one a
        // second host's Maglev gives it, and would break if it moved there (docs/operating.md, "Agreement
        // between hosts").
        for lb in &lbs {
            for k in &c.backends {
                let at = format!("{}:{PORT}", k.addr);
                lb.wait_state("web", &at, "healthy", Duration::from_secs(30));
            }
        }
        c.wait_nexthops(VIP, &[0, 1, 2], Duration::from_secs(30))?;
        c.wait_nexthops(VIP2, &[0, 1, 2], Duration::from_secs(30))?;

        // A host dies (its link cut) while streams run and a prober opens connections.
        let host = round % 3;
        let streams = paced_streams(&c.client, SocketAddr::from((VIP, PORT)), STREAMS)?;
        std::thread::sleep(Duration::from_millis(500));
        let on = Arc::new(AtomicBool::new(true));
        let prober = {
            let (client, on) = (c.client.clone(), on.clone());
            std::thread::spawn(move || {
                let mut failed = 0;
                while on.load(Ordering::Relaxed) {
                    let ok = client.enter(|| {
                        std::net::TcpStream::connect_timeout(
                            &SocketAddr::from((VIP, PORT)),
                            Duration::from_secs(1),
                        )
                        .is_ok()
                    });
                    failed += usize::from(!ok);
                    std::thread::sleep(Duration::from_millis(20));
                }
                failed
            })
        };
        std::thread::sleep(Duration::from_millis(300));
        let others: Vec<usize> = (0..3).filter(|&i| i != host).collect();
        let cut = unix_now();
        c.cut_host(host)?;
        c.wait_nexthops(VIP, &others, Duration::from_secs(10))?;
        out.converge_ms.push((unix_now() - cut) * 1e3);
        std::thread::sleep(Duration::from_millis(1500));
        on.store(false, Ordering::Relaxed);
        out.failed_connections
            .push(prober.join().unwrap_or(usize::MAX));
        out.broken_streams.push(
            streams
                .into_iter()
                .map(PacedStream::finish)
                .filter(Result::is_err)
                .count(),
        );
        let back = Instant::now();
        c.restore_host(host)?;
        c.wait_nexthops(VIP, &[0, 1, 2], Duration::from_secs(30))?;
        out.rejoin_ms.push(back.elapsed().as_secs_f64() * 1e3);
    }
    Ok(out)
}

/// The markdown section body.
pub fn markdown(r: &Cluster6, rounds: usize) -> String {
    let mut s = String::new();
    let row = |s: &mut String, what: &str, v: &[f64], unit: &str| {
        let (lo, hi) = min_max(v);
        let _ = writeln!(
            s,
            "| {what} | {:.1} {unit} | {lo:.1} – {hi:.1} |",
            median(v)
        );
    };
    let _ = writeln!(
        s,
        "{rounds} rounds; three lb hosts (BIRD on docs/bird.conf, BFD, hold time 3 s) behind a \
         BIRD router (`merge paths`, L4 multipath hash), a DSR and a full-NAT service over three \
         backends behind `lb decap`; checks every 300 ms, timeout 200 ms, threshold 2.\n"
    );
    let _ = writeln!(s, "| measured | median | min – max |\n|---|---:|---:|");
    row(
        &mut s,
        "every backend down: last host's last verdict → VIP gone from the router's table",
        &r.withdraw_ms,
        "ms",
    );
    row(
        &mut s,
        "a host's link cut → the router's route without it",
        &r.converge_ms,
        "ms",
    );
    row(
        &mut s,
        "the link back → the router's route with it again (BGP reconnects)",
        &r.rejoin_ms,
        "ms",
    );
    let _ = writeln!(
        s,
        "\nAround each host's death: new connections that failed (one tried every 20 ms, 1 s \
         timeout each, from 0.3 s before the cut to 1.5 s after the route changed): {:?}; of \
         {STREAMS} direct-server-return streams (a 1 KiB echo every 50 ms each) broken: {:?}.",
        r.failed_connections, r.broken_streams
    );
    s
}
