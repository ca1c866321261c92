//! Packet rate through lb (part 2): frames generated in the kernel with BPF_PROG_TEST_RUN in
//! live-frames mode, as if received on the balancer's client-side veth, each run through the
//! program under test for real, and counted where they come out.
//!
//! ```text
//!  [sink] sc ── vc [lb ns] vb ── sb [sink]      frames injected "on vc"
//!  bounce: vc ──XDP_TX──▶ sc          lb: vc ──XDP_REDIRECT──▶ vb ──▶ sb
//!  [sink] sa ── va [lb ns]                      frames injected "on va"
//!  lb, one-arm direct server return: va ──IP in IP, XDP_TX──▶ sa
//! ```
//! Both sink ends run the same program: write the original frame back over the page, then
//! XDP_DROP. So every case pays the same downstream cost (one veth transmit, one XDP run, a
//! drop), and the recycled pages hold the original frame again (live-frames mode does not
//! rewrite them, and lb rewrites addresses). The rate counted is frames that arrived at a sink
//! (veth `xdp_drops`) per second of the generating call's wall time.

use std::os::fd::{AsFd as _, AsRawFd as _};

use anyhow::{Context as _, bail};
use lb_common::counter;

use crate::{
    bench::{
        bpf::{self, Program},
        checkpoint, median,
    },
    fixture::{XDP_REDIRECT, XDP_TX, run_once, verdict_name},
    netns::{Netns, sh, veth},
    packet::{Packet, TCP_ACK, TCP_SYN},
};

pub struct Case {
    pub name: &'static str,
    /// Million frames per second that reached a sink, one per round.
    pub mpps: Vec<f64>,
    /// Frames that reached a sink / frames generated, over all rounds.
    pub delivered: f64,
}

pub struct Rate {
    pub cases: Vec<Case>,
    pub frames: u32,
    pub rounds: usize,
    pub frame_len: usize,
    /// lb's verdict counters over its runs: (name, count), those that moved.
    pub lb_counters: Vec<(String, u64)>,
    pub lb_frames: u64,
}

impl Rate {
    pub fn case(&self, name: &str) -> Option<&Case> {
        self.cases.iter().find(|c| c.name == name)
    }
}

pub const DROP: &str = "XDP_DROP in lb's place (generator ceiling)";
pub const BOUNCE: &str = "bounce: swap MACs, XDP_TX (baseline)";
pub const LB: &str = "lb, established TCP flow (XDP_REDIRECT)";
pub const LB_DSR: &str = "lb, one-arm direct server return (ipip), established flow (XDP_TX)";

/// Sum of the `xdp_drops` counters of a veth (`ethtool -S`).
fn xdp_drops(ns: &Netns, ifname: &str) -> anyhow::Result<u64> {
    let out = sh(ns.command("ethtool").args(["-S", ifname]))?;
    Ok(out
        .lines()
        .filter_map(|l| l.trim().split_once(':'))
        .filter(|(k, _)| k.ends_with("xdp_drops"))
        .filter_map(|(_, v)| v.trim().parse::<u64>().ok())
        .sum())
}

fn counters(dp: &lb::dataplane::Dataplane) -> anyhow::Result<Vec<u64>> {
    let s = dp.stats()?;
    Ok((0..counter::COUNT).map(|i| s.counter(i)).collect())
}

pub fn run(rounds: usize, frames: u32) -> anyhow::Result<Rate> {
    let lbns = Netns::new("rate-lb")?;
    let sink = Netns::new("rate-sink")?;
    lbns.sysctl("net/ipv4/ip_forward", "1")?;
    let (vc, sc) = veth(&lbns, "10.0.1.1/24", &sink, "10.0.1.2/24")?;
    let (vb, sb) = veth(&lbns, "10.0.2.1/24", &sink, "10.0.2.2/24")?;
    // One-arm direct server return: client and backend behind the same interface.
    let (va, sa) = veth(&lbns, "10.0.3.1/24", &sink, "10.0.3.2/24")?;
    let (sc_mac, sb_mac) = (sink.mac(&sc.ifname)?, sink.mac(&sb.ifname)?);
    let sa_mac = sink.mac(&sa.ifname)?;
    let fmt_mac = |m: [u8; 6]| {
        m.iter()
            .map(|b| format!("{b:02x}"))
            .collect::<Vec<_>>()
            .join(":")
    };
    for (ip, mac, dev) in [
        ("10.0.1.2", sc_mac, &vc.ifname),
        ("10.0.2.2", sb_mac, &vb.ifname),
        ("10.0.3.3", sa_mac, &va.ifname),
    ] {
        lbns.ip(&[
            "neigh",
            "replace",
            ip,
            "lladdr",
            &fmt_mac(mac),
            "dev",
            dev,
            "nud",
            "permanent",
        ])?;
    }
    let text = format!(
        "[lb]\ninterfaces = [\"{}\", \"{}\", \"{}\"]\n\n[[service]]\nname = \"rate\"\nvip = \"10.100.0.1:80\"\n\
         backends = [{{ address = \"10.0.2.2:8080\" }}]\n\n[[service]]\nname = \"dsr\"\n\
         vip = \"10.100.0.2:80\"\nforwarding = \"ipip\"\nbackends = [{{ address = \"10.0.3.3:80\" }}]\n",
        vc.ifname, vb.ifname, va.ifname
    );
    let config = lb::config::parse(&text).map_err(|e| anyhow::anyhow!("rate config: {e}"))?;
    let (dp, _balancer) = lbns.enter(|| -> anyhow::Result<_> {
        let (mut dp, b) = lb::daemon::prepare(&config)?;
        for iface in [&vc.ifname, &vb.ifname, &va.ifname] {
            dp.add_redirect_target(iface)?;
        }
        Ok((dp, b))
    })?;
    let vc_idx = lbns.ifindex(&vc.ifname)?;
    let vc_mac = lbns.mac(&vc.ifname)?;
    let (va_idx, va_mac) = (lbns.ifindex(&va.ifname)?, lbns.mac(&va.ifname)?);

    // An established flow: its SYN creates the connection (a plain test run has no side effects
    // but the maps), then the data frame that the generator repeats. 64 bytes on the wire
    // (without FCS): 14 + 20 + 20 + 10 bytes of payload.
    let syn = Packet::tcp("10.0.1.2:40000", "10.100.0.1:80", TCP_SYN)
        .macs(sc_mac, vc_mac)
        .build();
    let frame = Packet::tcp("10.0.1.2:40000", "10.100.0.1:80", TCP_ACK)
        .seq(1001, 1)
        .payload(&[0x55; 10])
        .macs(sc_mac, vc_mac)
        .build();
    let dsr_syn = Packet::tcp("10.0.3.2:40000", "10.100.0.2:80", TCP_SYN)
        .macs(sa_mac, va_mac)
        .build();
    let dsr_frame = Packet::tcp("10.0.3.2:40000", "10.100.0.2:80", TCP_ACK)
        .seq(1001, 1)
        .payload(&[0x55; 10])
        .macs(sa_mac, va_mac)
        .build();
    lbns.enter(|| -> anyhow::Result<()> {
        for (f, ingress, want) in [
            (&syn, vc_idx, XDP_REDIRECT),
            (&frame, vc_idx, XDP_REDIRECT),
            (&dsr_syn, va_idx, XDP_TX),
            (&dsr_frame, va_idx, XDP_TX),
        ] {
            let r = run_once(dp.program(), f, ingress)?;
            if r.verdict != want {
                bail!("lb: {} for a setup frame", verdict_name(r.verdict));
            }
        }
        Ok(())
    })?;

    let sink_prog = Program::load("bench_sink", &bpf::restore_and_drop(&frame))?;
    let dsr_sink = Program::load("bench_sink_dsr", &bpf::restore_and_drop(&dsr_frame))?;
    let _links = sink.enter(|| -> anyhow::Result<_> {
        Ok([
            bpf::attach(sink_prog.fd(), sink.ifindex(&sc.ifname)?)?,
            bpf::attach(sink_prog.fd(), sink.ifindex(&sb.ifname)?)?,
            bpf::attach(dsr_sink.fd(), sink.ifindex(&sa.ifname)?)?,
        ])
    })?;
    let drop = Program::load("bench_drop", &bpf::just(bpf::XDP_DROP))?;
    let bounce = Program::load("bench_bounce", &bpf::bounce())?;
    let lb_fd = dp
        .program()
        .fd()
        .context("lb program fd")?
        .as_fd()
        .as_raw_fd();
    // (name, program, the frame and where it is injected, where its frames come out: None =
    // nowhere, dropped in place)
    let programs = [
        (DROP, drop.fd(), (&frame, vc_idx), None),
        (BOUNCE, bounce.fd(), (&frame, vc_idx), Some(&sc.ifname)),
        (LB, lb_fd, (&frame, vc_idx), Some(&sb.ifname)),
        (LB_DSR, lb_fd, (&dsr_frame, va_idx), Some(&sa.ifname)),
    ];
    let mut cases: Vec<Case> = programs
        .iter()
        .map(|(name, _, _, _)| Case {
            name,
            mpps: Vec::new(),
            delivered: 0.0,
        })
        .collect();
    let mut generated = vec![0u64; programs.len()];
    let mut arrived = vec![0u64; programs.len()];
    let lb_before = counters(&dp)?;
    let mut lb_frames = 0u64;
    // A warm-up run of each (not counted), then the rounds: all cases in turn, each round.
    for round in 0..=rounds {
        for (c, (_, fd, (frame, ingress), out)) in programs.iter().enumerate() {
            checkpoint()?;
            let n = if round == 0 { frames / 10 } else { frames };
            let before = match out {
                Some(ifname) => xdp_drops(&sink, ifname)?,
                None => 0,
            };
            let took = lbns.enter(|| bpf::live_frames(*fd, frame, *ingress, n, 64))?;
            let got = match out {
                Some(ifname) => xdp_drops(&sink, ifname)? - before,
                None => u64::from(n),
            };
            if *fd == lb_fd {
                lb_frames += u64::from(n);
            }
            if round == 0 {
                continue;
            }
            generated[c] += u64::from(n);
            arrived[c] += got;
            cases[c].mpps.push(got as f64 / took.as_secs_f64() / 1e6);
        }
    }
    for (c, case) in cases.iter_mut().enumerate() {
        case.delivered = arrived[c] as f64 / generated[c].max(1) as f64;
    }
    let lb_after = counters(&dp)?;
    let lb_counters = (0..counter::COUNT as usize)
        .filter(|&i| lb_after[i] != lb_before[i] && i < counter::VERDICTS as usize)
        .map(|i| (counter::NAMES[i].to_owned(), lb_after[i] - lb_before[i]))
        .collect();
    Ok(Rate {
        cases,
        frames,
        rounds,
        frame_len: frame.len(),
        lb_counters,
        lb_frames,
    })
}

/// The markdown section body.
pub fn markdown(r: &Rate) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    let bounce = r.case(BOUNCE).map(|c| median(&c.mpps)).unwrap_or(f64::NAN);
    let _ = writeln!(
        s,
        "{} rounds × {} frames of {} bytes per case, cases interleaved; median Mpps that reached \
         the sink, and the ratio to the bounce.\n",
        r.rounds, r.frames, r.frame_len
    );
    let _ = writeln!(
        s,
        "| program run on each frame | Mpps (median) | min – max | delivered | / bounce |\n|---|---:|---:|---:|---:|"
    );
    for c in &r.cases {
        let m = median(&c.mpps);
        let (lo, hi) = super::min_max(&c.mpps);
        let _ = writeln!(
            s,
            "| {} | {m:.2} | {lo:.2} – {hi:.2} | {:.1}% | {:.2}× |",
            c.name,
            100.0 * c.delivered,
            m / bounce
        );
    }
    let counters: Vec<String> = r
        .lb_counters
        .iter()
        .map(|(n, v)| format!("`{n}` {v}"))
        .collect();
    let _ = writeln!(
        s,
        "\nlb's verdict counters over its {} generated frames (warm-up included): {}.",
        r.lb_frames,
        counters.join(", ")
    );
    s
}
