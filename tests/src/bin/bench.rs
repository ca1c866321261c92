//! `cargo xtask bench`: datapath cost per packet through BPF_PROG_TEST_RUN, as ns/packet and as
//! a ratio to an empty XDP program measured in the same run; each IPv6 case also as a ratio to
//! its IPv4 counterpart (the goal: 1.2× at most), each direct-server-return case as a ratio to
//! the full-NAT case of its family (the goal: 1× at most). Each sample is one run with
//! repeat = 1 (the kernel does not restore the frame between repeats, so repeat > 1 would time a
//! rewriting program on its own output); cases are interleaved so drift hits all alike.

#[path = "bench/flows.rs"]
mod flows;
#[path = "bench/katran.rs"]
mod katran;

use std::{fmt::Write as _, path::PathBuf};

use anyhow::{Context as _, bail};
use aya::programs::Xdp;
use clap::Parser;
use lb_common::FlowKey;
use lb_tests::{
    fixture::{XDP_PASS, XDP_REDIRECT, XDP_TX, run_once, verdict_name},
    packet::{Packet, TCP_ACK, TCP_PSH, TCP_SYN},
    testnet::{BACKEND_MAC, TestNet, ne},
};

#[derive(Parser)]
struct Args {
    /// Samples per case.
    #[arg(long, default_value_t = 20000)]
    iterations: usize,
    /// Also write the table (markdown) to this file.
    #[arg(long)]
    out: Option<PathBuf>,
    /// The IPv4 cases only (the set of cases before IPv6, to compare with an older build's run).
    #[arg(long)]
    ipv4_only: bool,
    /// The datapath trace on while measuring (as `lb trace` runs it: every packet, the
    /// daemon's rate, its records read as they come), to see what tracing costs. Off, the
    /// build with the trace is measured as it runs normally.
    #[arg(long)]
    trace: bool,
    /// Live flows of the many-flows rows (established over a tenth of them and over all, new
    /// flows into a table holding them); 0 leaves the rows out.
    #[arg(long, default_value_t = 1_000_000)]
    live_flows: usize,
    /// Both programs attached nowhere (as lb-bench measured before: an indirect call each), to
    /// compare with an older run's table.
    #[arg(long)]
    detached: bool,
    /// A Katran source checkout: its XDP balancer built from it (into target/bench/katran/),
    /// configured as Katran's tester does and timed in the same loop as lb, side by side
    /// (established flow, the same SYN created anew, a new flow into cold tables).
    #[arg(long, value_name = "DIR")]
    katran: Option<PathBuf>,
    /// Only the cases whose name holds this text (and the empty program), sampled `--passes`
    /// times over: a loop to profile (`perf record -a` around it), not a table to publish.
    #[arg(long, value_name = "TEXT")]
    only: Option<String>,
    /// Rounds of `--iterations` samples per case (with `--only`).
    #[arg(long, default_value_t = 1, requires = "only")]
    passes: usize,
}

/// Connection-table entries of the one-flow rows, lb's and (per CPU) Katran's.
const CONNTRACK: u32 = 262_144;

const SERVICES: &str = r#"
[[service]]
name = "proxied"
vip = "10.100.0.6:80"
syn_proxy = "on"
backends = [{ address = "10.0.2.2:8080" }, { address = "10.0.2.3:8080" }, { address = "10.0.2.4:8080" }, { address = "10.0.2.5:8080" }]

[[service]]
name = "web"
vip = "10.100.0.1:80"
backends = [{ address = "10.0.2.2:8080" }, { address = "10.0.2.3:8080" }, { address = "10.0.2.4:8080" }, { address = "10.0.2.5:8080" }]

[[service]]
name = "web6"
vip = "[2001:db8:100::1]:80"
backends = [{ address = "[2001:db8:2::2]:8080" }, { address = "[2001:db8:2::3]:8080" }, { address = "[2001:db8:2::4]:8080" }, { address = "[2001:db8:2::5]:8080" }]

[[service]]
name = "ipip"
vip = "10.100.0.2:80"
forwarding = "ipip"
backends = [{ address = "10.0.2.2:80" }, { address = "10.0.2.3:80" }, { address = "10.0.2.4:80" }, { address = "10.0.2.5:80" }]

[[service]]
name = "gue"
vip = "10.100.0.3:80"
forwarding = "gue"
backends = [{ address = "10.0.2.2:80" }, { address = "10.0.2.3:80" }, { address = "10.0.2.4:80" }, { address = "10.0.2.5:80" }]

[[service]]
name = "ipip6"
vip = "[2001:db8:100::2]:80"
forwarding = "ipip"
backends = [{ address = "[2001:db8:2::2]:80" }, { address = "[2001:db8:2::3]:80" }, { address = "[2001:db8:2::4]:80" }, { address = "[2001:db8:2::5]:80" }]

[[service]]
name = "gue6"
vip = "[2001:db8:100::3]:80"
forwarding = "gue"
backends = [{ address = "[2001:db8:2::2]:80" }, { address = "[2001:db8:2::3]:80" }, { address = "[2001:db8:2::4]:80" }, { address = "[2001:db8:2::5]:80" }]

[[service]]
name = "udp"
vip = "10.100.0.4:443"
protocol = "udp"
backends = [{ address = "10.0.2.2:443" }, { address = "10.0.2.3:443" }, { address = "10.0.2.4:443" }, { address = "10.0.2.5:443" }]

[[service]]
name = "quic"
vip = "10.100.0.5:443"
protocol = "udp"
quic = { server_id_bytes = 2 }
backends = [{ address = "10.0.2.2:443", server_id = 1 }, { address = "10.0.2.3:443", server_id = 2 }, { address = "10.0.2.4:443", server_id = 3 }, { address = "10.0.2.5:443", server_id = 4 }]
"#;

/// The program a case runs.
#[derive(Clone, Copy, PartialEq)]
enum Prog {
    Empty,
    Lb,
    Katran,
}

/// A flow removed from a program's connection table before each sample.
enum Forget {
    Lb(FlowKey),
    Katran(lb_tests::bench::katran::FlowKey),
}

struct Case {
    name: &'static str,
    prog: Prog,
    /// Frames cycled through (new flows need a fresh one each time).
    frames: Vec<Vec<u8>>,
    ingress: u32,
    verdict: u32,
    /// Forget this flow before each sample (untimed), so the frame creates it anew.
    forget: Option<Forget>,
    /// The IPv4 case this IPv6 one is compared with (its index).
    ipv4: Option<usize>,
    /// The full-NAT case this direct-server-return one is compared with (its index).
    nat: Option<usize>,
    /// The plain UDP case this QUIC one is compared with (its index).
    udp: Option<usize>,
    samples: Vec<u64>,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    lb_tests::require_root();
    if args.iterations == 0 || args.iterations > 60000 {
        bail!("--iterations must be 1..=60000 (one new flow per sample)");
    }
    let net = TestNet::new(
        // The per-source SYN limit at its default: each new-flow case's SYNs come from a source
        // of their own (see `source`), as a busy balancer's do, and pay for its bucket; the one
        // flow created anew has its bucket refilled with its forgetting. Flood mode at its
        // highest rate: the direct-server-return new-flow rows time their table inserts and
        // still pay for the count.
        &format!(
            "snat_ports = \"1024-65535\"\ndsr_flood_rate = 10000000\n\
             conntrack = {{ size = {CONNTRACK}, ipv6_size = {CONNTRACK} }}"
        ),
        SERVICES,
    )?;
    let mut net = net;
    // Both programs attached, as the kernel runs them (see TestNet::attach_idle).
    if !args.detached {
        net.attach_idle()?;
    }
    // Held while measuring: the trace's switches and its reader.
    let _trace = if args.trace {
        Some(trace_on(&mut net)?)
    } else {
        None
    };
    let mut katran = match &args.katran {
        Some(dir) => Some(katran::start(&net, dir, CONNTRACK)?),
        None => None,
    };
    let (table, beside_katran) = {
        let ns = net.ns.clone();
        ns.enter(|| {
            measure(
                &mut net,
                katran.as_mut(),
                args.iterations,
                args.ipv4_only,
                !args.detached,
                (args.only.as_deref(), args.passes),
            )
        })?
    };
    let mut table = table;
    if args.live_flows > 0 {
        if args.live_flows < 1000 {
            bail!("--live-flows must be 0 or at least 1000");
        }
        let rows = flows::measure(args.live_flows, args.iterations, !args.detached)?;
        table.push_str(&many_flow_rows(rows));
        let _ = writeln!(
            table,
            "\nMany flows (the last rows): flows made by the program (SYN, then ACK) in a table \
             of twice their number of slots, visited in a shuffled order, each sample another \
             flow; each row sampled alternately with the empty program, its ratios to those \
             samples."
        );
    }
    if let Some(section) = beside_katran {
        table.push_str(&section);
    }
    print!("{table}");
    let verified: Vec<String> = net
        .dp
        .verified_instructions()
        .into_iter()
        .map(|(name, n)| format!("{name} {}", n.map_or("?".into(), |n| n.to_string())))
        .collect();
    println!(
        "\nVerifier: instructions processed {} (the kernel's limit: 1,000,000 per program)",
        verified.join(", ")
    );
    if let Some(out) = args.out {
        std::fs::write(&out, &table).with_context(|| format!("writing {}", out.display()))?;
    }
    Ok(())
}

/// Switches the datapath trace on for every packet, with the daemon's rate, and reads its
/// records in a thread of its own (as the daemon does; they are dropped here) until the
/// returned guard goes.
fn trace_on(net: &mut TestNet) -> anyhow::Result<TraceOn> {
    struct Discard;
    impl log::Log for Discard {
        fn enabled(&self, _: &log::Metadata<'_>) -> bool {
            true
        }
        fn log(&self, _: &log::Record<'_>) {}
        fn flush(&self) {}
    }
    let (mut maps, mut logger) = net.dp.take_trace(Discard)?;
    maps.start(&lb_common::TraceFilter {
        service_id: lb_common::TRACE_NONE,
        rate: lb::trace::RATE,
        rate_scaled: lb_common::Params::per_2_32_ns(lb::trace::RATE),
        client_prefix: 0,
        client: [0; 4],
        until_ns: u64::MAX,
    })?;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reading = stop.clone();
    let reader = std::thread::spawn(move || {
        while !reading.load(std::sync::atomic::Ordering::Relaxed) {
            logger.flush();
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    });
    Ok(TraceOn {
        maps,
        stop,
        reader: Some(reader),
    })
}

struct TraceOn {
    maps: lb::dataplane::TraceMaps,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    reader: Option<std::thread::JoinHandle<()>>,
}

impl Drop for TraceOn {
    fn drop(&mut self) {
        if let Ok((limited, lost)) = self.maps.losses() {
            println!("trace: {limited} records beyond the rate, {lost} lost to a full ring");
        }
        let _ = self.maps.stop();
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(r) = self.reader.take() {
            let _ = r.join();
        }
    }
}

/// An established flow from `client` to `vip` (ADDR:PORT each, one family): its data packet
/// and the backend's reply to it.
fn established(net: &TestNet, client: &str, vip: &str) -> anyhow::Result<(Vec<u8>, Vec<u8>)> {
    let syn = Packet::tcp(client, vip, TCP_SYN).build();
    let out = run_once(net.dp.program(), &syn, net.vc)?;
    if out.verdict != XDP_REDIRECT {
        bail!("setup SYN to {vip}: {}", verdict_name(out.verdict));
    }
    let o = &out.output;
    let (backend, snat) = if vip.starts_with('[') {
        let ip = |at: usize| {
            let b: [u8; 16] = o[at..at + 16].try_into().expect("16 bytes");
            std::net::Ipv6Addr::from(b)
        };
        let port = |at: usize| u16::from_be_bytes([o[at], o[at + 1]]);
        (
            format!("[{}]:8080", ip(38)),
            format!("[{}]:{}", ip(22), port(54)),
        )
    } else {
        let snat_port = u16::from_be_bytes([o[34], o[35]]);
        (
            format!("{}.{}.{}.{}:8080", o[30], o[31], o[32], o[33]),
            format!("10.0.2.1:{snat_port}"),
        )
    };
    let data = Packet::tcp(client, vip, TCP_ACK | TCP_PSH)
        .payload(&[0x55; 64])
        .build();
    let reply = Packet::tcp(&backend, &snat, TCP_ACK | TCP_PSH)
        .payload(&[0x66; 64])
        .macs(BACKEND_MAC, net.vb_mac)
        .build();
    Ok((data, reply))
}

/// Samples every case round-robin; returns lb's table and, with Katran, the side-by-side one.
fn measure(
    net: &mut TestNet,
    mut katran: Option<&mut katran::Started>,
    n: usize,
    ipv4_only: bool,
    attached: bool,
    (only, passes): (Option<&str>, usize),
) -> anyhow::Result<(String, Option<String>)> {
    let (data, reply) = established(net, "10.0.1.2:40000", "10.100.0.1:80")?;
    let (data6, reply6) = established(net, "[2001:db8:1::2]:40000", "[2001:db8:100::1]:80")?;
    let new_flows: Vec<Vec<u8>> = (0..n)
        .map(|i| Packet::tcp(&source(0, i), "10.100.0.1:80", TCP_SYN).build())
        .collect();
    let new_flows6 = (0..n)
        .map(|i| Packet::tcp(&source6(0, i), "[2001:db8:100::1]:80", TCP_SYN).build())
        .collect();
    let other = Packet::tcp("10.0.1.2:40000", "10.0.1.9:22", TCP_ACK)
        .payload(&[0x77; 64])
        .build();
    let other6 = Packet::tcp("[2001:db8:1::2]:40000", "[2001:db8:1::9]:22", TCP_ACK)
        .payload(&[0x77; 64])
        .build();
    let recreated = Packet::tcp("10.0.1.3:40000", "10.100.0.1:80", TCP_SYN).build();
    let recreated_key = FlowKey::new(
        ne("10.0.1.3"),
        ne("10.100.0.1"),
        40000u16.to_be(),
        80u16.to_be(),
        lb_common::PROTO_TCP,
    );
    let mut cases = vec![
        Case::new(
            "empty XDP program (baseline)",
            vec![data.clone()],
            net.vc,
            XDP_PASS,
        )
        .prog(Prog::Empty),
        Case::new("not for a VIP: pass", vec![other], net.vc, XDP_PASS),
        Case::new(
            "new flow (SYN), each a different flow: cold table memory",
            new_flows.clone(),
            net.vc,
            XDP_REDIRECT,
        ),
        Case::new(
            "new flow (SYN), the same flow created anew each time",
            vec![recreated.clone()],
            net.vc,
            XDP_REDIRECT,
        )
        .forget(Forget::Lb(recreated_key)),
        Case::new("established flow", vec![data.clone()], net.vc, XDP_REDIRECT),
        Case::new(
            "return path (backend → client)",
            vec![reply],
            net.vb,
            XDP_REDIRECT,
        ),
        Case::new("IPv6: not for a VIP: pass", vec![other6], net.vc, XDP_PASS).ipv4(1),
        Case::new(
            "IPv6: new flow (SYN), each a different flow: cold table memory",
            new_flows6,
            net.vc,
            XDP_REDIRECT,
        )
        .ipv4(2),
        Case::new("IPv6: established flow", vec![data6], net.vc, XDP_REDIRECT).ipv4(4),
        Case::new(
            "IPv6: return path (backend → client)",
            vec![reply6],
            net.vb,
            XDP_REDIRECT,
        )
        .ipv4(5),
    ];
    if ipv4_only {
        cases.truncate(6);
    } else {
        cases.extend(dsr_cases(net, n)?);
        cases.extend(proxy_cases(net, n)?);
    }
    let first_quic = cases.len();
    cases.extend(quic_cases(net, n, first_quic)?);
    // Katran's cases last: the indexes above stay those the comparisons name.
    let first_katran = cases.len();
    if let Some(k) = katran.as_deref_mut() {
        cases.extend(katran::cases(
            k,
            net.vc,
            &katran::Frames {
                established: &data,
                recreated: &recreated,
                new_flows,
            },
        )?);
    }
    // Warm up, then sample the cases round-robin.
    for _ in 0..200 {
        run(net, katran.as_deref_mut(), &cases[0], 0)?;
    }
    if let Some(only) = only {
        // A case that creates flows makes them again from the second pass on (anew, not
        // into cold tables): a profile of its cold misses needs one pass.
        cases.retain(|c| c.prog == Prog::Empty || c.name.contains(only));
        for c in &mut cases {
            // The cases compared with may be gone.
            (c.ipv4, c.nat, c.udp) = (None, None, None);
        }
        if cases.len() == 1 {
            bail!("--only {only}: no case's name holds it");
        }
        for i in 0..n * passes {
            for case in cases.iter_mut() {
                let ns = run(net, katran.as_deref_mut(), case, i % n)?;
                case.samples.push(ns);
            }
        }
        return Ok((report(&mut cases, n * passes, attached), None));
    }
    for i in 0..n {
        for case in cases.iter_mut() {
            let ns = run(net, katran.as_deref_mut(), case, i)?;
            case.samples.push(ns);
        }
    }
    let beside = match katran {
        Some(k) => Some(katran::report(k, &mut cases, first_katran, n)?),
        None => None,
    };
    Ok((report(&mut cases[..first_katran], n, attached), beside))
}

/// Client `i` of new-flow case `case`: an address of its own (10.(64 + case).0.0/16, `i` <
/// 60,000), so that each SYN meets the per-source limit in a bucket of its own, as many clients'
/// SYNs do.
fn source(case: usize, i: usize) -> String {
    let base = u32::from(std::net::Ipv4Addr::new(10, 64 + case as u8, 0, 0));
    let addr = std::net::Ipv4Addr::from(base + i as u32);
    format!("{addr}:{}", 1024 + i % 50000)
}

/// The same for IPv6, whose sources the limit buckets by /64: a /64 of its own
/// (2001:db8:(0x4000 + case):i::/64).
fn source6(case: usize, i: usize) -> String {
    format!(
        "[2001:db8:{:x}:{:x}::2]:{}",
        0x4000 + case,
        i,
        1024 + i % 50000
    )
}

/// Direct server return: a new flow (each a different one) and an established flow per mode
/// and family, each compared with full NAT's case of its family (IPv4's at 2 and 4, IPv6's at
/// 7 and 8).
fn dsr_cases(net: &TestNet, n: usize) -> anyhow::Result<Vec<Case>> {
    let mut out = Vec::new();
    for (k, (name_new, name_est, vip, client, v6)) in [
        (
            "DSR ipip: new flow (SYN), each a different flow",
            "DSR ipip: established flow",
            "10.100.0.2:80",
            "10.0.1.2:40001",
            false,
        ),
        (
            "DSR gue: new flow (SYN), each a different flow",
            "DSR gue: established flow",
            "10.100.0.3:80",
            "10.0.1.2:40002",
            false,
        ),
        (
            "IPv6 DSR ipip: new flow (SYN), each a different flow",
            "IPv6 DSR ipip: established flow",
            "[2001:db8:100::2]:80",
            "[2001:db8:1::2]:40001",
            true,
        ),
        (
            "IPv6 DSR gue: new flow (SYN), each a different flow",
            "IPv6 DSR gue: established flow",
            "[2001:db8:100::3]:80",
            "[2001:db8:1::2]:40002",
            true,
        ),
    ]
    .into_iter()
    .enumerate()
    {
        let syn = Packet::tcp(client, vip, TCP_SYN).build();
        let r = run_once(net.dp.program(), &syn, net.vc)?;
        if r.verdict != XDP_REDIRECT {
            bail!("setup SYN to {vip}: {}", verdict_name(r.verdict));
        }
        let data = Packet::tcp(client, vip, TCP_ACK | TCP_PSH)
            .payload(&[0x55; 64])
            .build();
        let flows = (0..n)
            .map(|i| {
                let c = if v6 {
                    source6(1 + k, i)
                } else {
                    source(1 + k, i)
                };
                Packet::tcp(&c, vip, TCP_SYN).build()
            })
            .collect();
        let (new_nat, est_nat) = if v6 { (7, 8) } else { (2, 4) };
        out.push(Case::new(name_new, flows, net.vc, XDP_REDIRECT).nat(new_nat));
        out.push(Case::new(name_est, vec![data], net.vc, XDP_REDIRECT).nat(est_nat));
    }
    Ok(out)
}

/// The SYN proxy (issue 39): a SYN answered with a cookie and the cookie's ACK (each a
/// different flow; compared with full NAT's new flow, case 2), and a proxied flow's client
/// segment with a timestamp, translated (compared with full NAT's established flow, case 4).
fn proxy_cases(net: &TestNet, n: usize) -> anyhow::Result<Vec<Case>> {
    const VIP: &str = "10.100.0.6:80";
    let client = |i: usize| source(5, i);
    // Linux's SYN options (MSS, SACK-permitted, timestamps, window scale).
    let syn_opts = [
        2, 4, 5, 180, 4, 2, 8, 10, 0, 0, 0, 7, 0, 0, 0, 0, 1, 3, 3, 7,
    ];
    let syn = |c: &str| {
        Packet::tcp(c, VIP, TCP_SYN)
            .seq(1000, 0)
            .tcp_options(&syn_opts)
            .build()
    };
    // The SYN+ACK's cookie and timestamp (TCP at 34, its TSval at 34 + 20 + 8).
    let answer = |frame: &[u8]| -> anyhow::Result<(u32, u32)> {
        let r = run_once(net.dp.program(), frame, net.vc)?;
        if r.verdict != XDP_TX {
            bail!("setup SYN to the proxied VIP: {}", verdict_name(r.verdict));
        }
        let word = |at: usize| u32::from_be_bytes(r.output[at..at + 4].try_into().unwrap());
        Ok((word(38), word(62)))
    };
    let ack = |c: &str, cookie: u32, tsecr: u32, flags: u8, payload: &[u8]| {
        let mut ts = vec![1, 1, 8, 10, 0, 0, 0, 8];
        ts.extend(tsecr.to_be_bytes());
        Packet::tcp(c, VIP, flags)
            .seq(1001, cookie.wrapping_add(1))
            .window(502)
            .tcp_options(&ts)
            .payload(payload)
            .build()
    };
    let syns: Vec<Vec<u8>> = (0..n).map(|i| syn(&client(i))).collect();
    let mut acks = Vec::with_capacity(n);
    for (i, s) in syns.iter().enumerate() {
        let (cookie, tsval) = answer(s)?;
        acks.push(ack(&client(i), cookie, tsval, TCP_ACK, &[]));
    }
    // One connection opened to the end: the backend's SYN+ACK answered too.
    let c = "10.0.1.199:40000";
    let (cookie, tsval) = answer(&syn(c))?;
    let r = run_once(
        net.dp.program(),
        &ack(c, cookie, tsval, TCP_ACK, &[]),
        net.vc,
    )?;
    if r.verdict != XDP_REDIRECT {
        bail!("setup ACK to the proxied VIP: {}", verdict_name(r.verdict));
    }
    // lb's SYN to the backend, from its SNAT address and port: the backend answers it.
    let out = &r.output;
    let backend = std::net::Ipv4Addr::new(out[30], out[31], out[32], out[33]);
    let snat_port = u16::from_be_bytes([out[34], out[35]]);
    let synack = Packet::tcp(
        &format!("{backend}:8080"),
        &format!("10.0.2.1:{snat_port}"),
        TCP_SYN | TCP_ACK,
    )
    .macs(BACKEND_MAC, net.vb_mac)
    .seq(5000, 1001)
    .window(65160)
    .tcp_options(&[
        2, 4, 5, 180, 4, 2, 8, 10, 0, 1, 0, 0, 0, 0, 0, 8, 1, 3, 3, 7,
    ])
    .build();
    let r = run_once(net.dp.program(), &synack, net.vb)?;
    if r.verdict != XDP_REDIRECT {
        bail!("setup backend SYN+ACK: {}", verdict_name(r.verdict));
    }
    let data = ack(c, cookie, tsval, TCP_ACK | TCP_PSH, &[0x55; 64]);
    Ok(vec![
        Case::new(
            "SYN proxy: a SYN answered with a cookie (XDP_TX), each a different flow",
            syns,
            net.vc,
            XDP_TX,
        )
        .nat(2),
        Case::new(
            "SYN proxy: the cookie's ACK (flow created, SYN to the backend), each a different flow",
            acks,
            net.vc,
            XDP_REDIRECT,
        )
        .nat(2),
        Case::new(
            "SYN proxy: established flow, translated (with a timestamp)",
            vec![data],
            net.vc,
            XDP_REDIRECT,
        )
        .nat(4),
    ])
}

/// QUIC: a short header on an established flow (its backend's own server ID checked) and a
/// QUIC connection's new path (a new client port each time, the connection table learning
/// it), each compared with plain UDP's case of the same kind; `first` is the first's index.
fn quic_cases(net: &TestNet, n: usize, first: usize) -> anyhow::Result<Vec<Case>> {
    // A short header naming server 3 (config rotation 0, server ID at bytes 1-2): 64 bytes of
    // payload, as the plain UDP packet's.
    let layout = lb_tests::quic::CidLayout {
        server_id_bytes: 2,
        cid_offset: 1,
        config_id: 0,
    };
    let mut short = lb_tests::quic::short_header(layout.cid(3));
    short.resize(64, 0xa5);
    let plain = Packet::udp("10.0.1.2:40010", "10.100.0.4:443")
        .payload(&[0x55; 64])
        .build();
    let quic = Packet::udp("10.0.1.2:40010", "10.100.0.5:443")
        .payload(&short)
        .build();
    for (frame, what) in [(&plain, "UDP"), (&quic, "QUIC")] {
        let r = run_once(net.dp.program(), frame, net.vc)?;
        if r.verdict != XDP_REDIRECT {
            bail!("setup {what} flow: {}", verdict_name(r.verdict));
        }
    }
    let new_paths = |vip: &str, payload: &[u8]| -> Vec<Vec<u8>> {
        (0..n)
            .map(|i| {
                let c = format!("10.0.1.{}:{}", 150 + (i / 50000) as u8, 1024 + (i % 50000));
                Packet::udp(&c, vip).payload(payload).build()
            })
            .collect()
    };
    Ok(vec![
        Case::new("UDP: established flow", vec![plain], net.vc, XDP_REDIRECT),
        Case::new(
            "UDP: new flow, each a different one",
            new_paths("10.100.0.4:443", &[0x55; 64]),
            net.vc,
            XDP_REDIRECT,
        ),
        Case::new(
            "QUIC short header: established flow",
            vec![quic],
            net.vc,
            XDP_REDIRECT,
        )
        .udp(first),
        Case::new(
            "QUIC short header: a new path (client port) each time, routed by server ID",
            new_paths("10.100.0.5:443", &short),
            net.vc,
            XDP_REDIRECT,
        )
        .udp(first + 1),
    ])
}

impl Case {
    fn new(name: &'static str, frames: Vec<Vec<u8>>, ingress: u32, verdict: u32) -> Self {
        Self {
            name,
            prog: Prog::Lb,
            frames,
            ingress,
            verdict,
            forget: None,
            ipv4: None,
            nat: None,
            udp: None,
            samples: Vec::new(),
        }
    }

    fn ipv4(mut self, case: usize) -> Self {
        self.ipv4 = Some(case);
        self
    }

    fn nat(mut self, case: usize) -> Self {
        self.nat = Some(case);
        self
    }

    fn udp(mut self, case: usize) -> Self {
        self.udp = Some(case);
        self
    }

    fn forget(mut self, flow: Forget) -> Self {
        self.forget = Some(flow);
        self
    }

    fn prog(mut self, prog: Prog) -> Self {
        self.prog = prog;
        self
    }
}

/// One sample of `case`.
fn run(
    net: &mut TestNet,
    mut katran: Option<&mut katran::Started>,
    case: &Case,
    i: usize,
) -> anyhow::Result<u64> {
    match (&case.forget, katran.as_deref_mut()) {
        (Some(Forget::Lb(key)), _) => {
            net.dp.forget_flow(key)?;
            net.dp.refill_syn_bucket(key.src)?;
        }
        (Some(Forget::Katran(key)), Some(k)) => k.katran.forget(key)?,
        _ => {}
    }
    let prog: &Xdp = match (case.prog, katran.as_deref()) {
        (Prog::Empty, _) => net.dp.pass_program(),
        (Prog::Lb, _) => net.dp.program(),
        (Prog::Katran, Some(k)) => k.katran.program(),
        (Prog::Katran, None) => bail!("{}: a Katran case without Katran", case.name),
    };
    let frame = &case.frames[i % case.frames.len()];
    let r = run_once(prog, frame, case.ingress)?;
    if r.verdict != case.verdict {
        bail!(
            "{}: sample {i}: verdict {}, want {}",
            case.name,
            verdict_name(r.verdict),
            verdict_name(case.verdict)
        );
    }
    Ok(r.duration_ns)
}

/// The many-flows rows, under the table's columns: each to the empty program sampled with it.
fn many_flow_rows(rows: Vec<flows::Row>) -> String {
    let mut out = String::new();
    for mut r in rows {
        let (mean, median) = stats(&mut r.samples);
        let (base_mean, base_median) = stats(&mut r.empty);
        let _ = writeln!(
            out,
            "| {} | {mean:.1} | {median:.0} | {:.2}× | {:.2}× |  |  |  |",
            r.name,
            mean / base_mean,
            median / base_median
        );
    }
    out
}

/// Mean and median of samples.
fn stats(s: &mut [u64]) -> (f64, f64) {
    s.sort_unstable();
    let mean = s.iter().sum::<u64>() as f64 / s.len() as f64;
    (mean, s[s.len() / 2] as f64)
}

fn report(cases: &mut [Case], n: usize, attached: bool) -> String {
    let (base_mean, base_median) = stats(&mut cases[0].samples);
    let mut out = String::new();
    let _ = writeln!(
        out,
        "Datapath cost per packet, BPF_PROG_TEST_RUN, repeat = 1, {n} interleaved samples per case; \
         the balancer and the empty program both {}\n",
        if attached {
            "attached (native XDP, each to an idle veth of its own), so both are called as the \
             kernel calls attached programs"
        } else {
            "attached nowhere (--detached: each called through an indirect call)"
        }
    );
    let _ = writeln!(
        out,
        "| case | mean ns | median ns | mean / empty | median / empty | median / IPv4's | median / full NAT's | median / plain UDP's |"
    );
    let _ = writeln!(out, "|---|---:|---:|---:|---:|---:|---:|---:|");
    let medians: Vec<f64> = cases.iter_mut().map(|c| stats(&mut c.samples).1).collect();
    for case in cases.iter_mut() {
        let (mean, median) = stats(&mut case.samples);
        let versus = |of: Option<usize>| {
            of.map_or(String::new(), |i| format!("{:.2}×", median / medians[i]))
        };
        let (v4, nat, udp) = (versus(case.ipv4), versus(case.nat), versus(case.udp));
        let _ = writeln!(
            out,
            "| {} | {mean:.1} | {median:.0} | {:.2}× | {:.2}× | {v4} | {nat} | {udp} |",
            case.name,
            mean / base_mean,
            median / base_median
        );
    }
    out
}
