//! Packet rate through lb (part 2): frames generated in the kernel with BPF_PROG_TEST_RUN in
//! live-frames mode, as if received on one of the balancer's veths, each run through the
//! program under test for real, and counted where they come out.
//!
//! ```text
//!  [sink] sc ── vc [lb ns] vb ── sb [sink]      frames injected "on vc"
//!  bounce: vc ──XDP_TX──▶ sc          lb two-arm: vc ──XDP_REDIRECT──▶ vb ──▶ sb
//!  [sink] so ── vo [lb ns]                      lb one-arm full NAT: vo ──XDP_TX──▶ so
//!  [sink] sa ── va [lb ns]                      lb one-arm DSR: va ──IP in IP, XDP_TX──▶ sa
//!  [sink] sp ── vp [lb ns]                      lb SYN proxy: vp ──SYN+ACK, XDP_TX──▶ sp
//! ```
//! The SYN proxy's case sends SYNs of 10,000 flows to a proxied service, each answered with a
//! cookie's SYN+ACK straight back: the rate of SYN+ACKs one core answers a flood with. Its
//! SYNs carry 4 bytes of data (which the proxy checks and drops), where the cycle writes its
//! flow's number: 58-byte frames, the size of the SYN+ACK the sink writes the next one over.
//! One-arm: the client and the backend are behind the same interface, so lb's route lookup
//! gives the ingress interface and lb sends with XDP_TX, as the bounce does; two-arm: the
//! backend is behind another interface, reached with XDP_REDIRECT through lb's devmap. (Live-frames
//! mode, outside a driver, sends an XDP_TX frame as a redirect to the ingress device found by its
//! index: the bounce and lb one-arm pay that alike.)
//!
//! **Many flows.** Live-frames mode copies its input frame into a page once, when its page pool
//! allocates the page, and then recycles the page without rewriting it: the program under test
//! sees whatever the page last held. Every sink end runs the same program: write the frame of
//! the *next* flow of a cycle over the page (a template with source port + i and its first
//! payload word − i, so the TCP checksum stays valid), move a cursor (a one-slot BPF array) on,
//! XDP_DROP. The recycled page then carries that flow into the program under test: the frames
//! go round the cycle's flows, one after the other, as frames of many flows from a NIC would.
//! Cycles of 1 and of 10,000 flows run the same instructions (only the cursor's wrap value
//! differs), and every case, the bounce included, passes through such a sink: every case pays the
//! same downstream cost (one veth transmit, the sink's XDP run, a drop). The 10,000 flows are
//! established in lb's connection table first (a SYN and an ACK each through a plain test run),
//! and a census run (untimed: the sink counts the frames by TCP source port, lb's SNAT port)
//! checks that lb saw every flow of the cycle. The rate counted is frames that arrived at a sink
//! (veth `xdp_drops`) per second of the generating call's wall time.

use std::os::fd::{AsFd as _, AsRawFd as _};

use anyhow::{Context as _, bail};
use lb_common::counter;

use crate::{
    bench::{
        bpf::{self, Cursor, Program},
        checkpoint, median,
    },
    fixture::{XDP_REDIRECT, XDP_TX, run_once, verdict_name},
    netns::{Netns, sh, veth},
    packet::{Packet, TCP_ACK, TCP_SYN},
};

/// The flows of the many-flow cases.
pub const FLOWS: u32 = 10_000;

pub struct Case {
    pub name: &'static str,
    /// Flows the frames cycle through.
    pub flows: u32,
    /// Million frames per second that reached a sink, one per round.
    pub mpps: Vec<f64>,
    /// Frames that reached a sink / frames generated, over all rounds.
    pub delivered: f64,
    /// Many-flow cases: the census run's (frames, distinct SNAT ports, least and most frames of
    /// one port).
    pub census: Option<(u32, usize, u32, u32)>,
}

pub struct Rate {
    pub cases: Vec<Case>,
    pub frames: u32,
    pub rounds: usize,
    pub frame_len: usize,
    /// lb's counters over its runs: (name, count), those that moved.
    pub lb_counters: Vec<(String, u64)>,
    pub lb_frames: u64,
}

impl Rate {
    pub fn case(&self, name: &str) -> Option<&Case> {
        self.cases.iter().find(|c| c.name == name)
    }

    pub fn median(&self, name: &str) -> Option<f64> {
        self.case(name).map(|c| median(&c.mpps))
    }
}

pub const DROP: &str = "XDP_DROP in lb's place (generator ceiling)";
pub const BOUNCE: &str = "bounce: swap MACs, XDP_TX (baseline)";
// No commas: `peer_bench --rate-only` takes a comma-separated list of parts of these.
pub const ONE_ARM: &str = "lb one-arm full NAT (XDP_TX): 1 flow";
pub const ONE_ARM_MANY: &str = "lb one-arm full NAT (XDP_TX): 10 000 flows";
pub const TWO_ARM: &str = "lb two-arm full NAT (XDP_REDIRECT): 1 flow";
pub const TWO_ARM_MANY: &str = "lb two-arm full NAT (XDP_REDIRECT): 10 000 flows";
pub const LB_DSR: &str = "lb one-arm direct server return (ipip; XDP_TX): 1 flow";
pub const PROXY_SYN: &str = "lb SYN proxy: SYNs answered with a cookie (XDP_TX): 10 000 flows";

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

/// The data frame of a flow from `client` (source port 40000) to `vip`: 64 bytes on the wire
/// (without FCS): 14 + 20 + 20 + 10 bytes of payload, the cycle's template.
fn data_frame(client: &str, vip: &str, macs: ([u8; 6], [u8; 6])) -> Vec<u8> {
    Packet::tcp(&format!("{client}:40000"), vip, TCP_ACK)
        .seq(1001, 1)
        .payload(&[0x55; 10])
        .macs(macs.0, macs.1)
        .build()
}

/// Establishes flows 0..`flows` of the cycle over `data_frame(client, vip, macs)` in lb's
/// connection table: each one's SYN (it creates the connection; a plain test run has no side
/// effects but the maps), then its data frame (the flow is established). Each must get `want`.
fn establish(
    dp: &lb::dataplane::Dataplane,
    (client, vip, macs): (&str, &str, ([u8; 6], [u8; 6])),
    flows: u32,
    ingress: u32,
    want: u32,
) -> anyhow::Result<()> {
    let template = data_frame(client, vip, macs);
    for i in 0..flows {
        let syn = Packet::tcp(&format!("{client}:{}", 40000 + i), vip, TCP_SYN)
            .macs(macs.0, macs.1)
            .build();
        for f in [&syn, &bpf::flow_frame(&template, i as u16)] {
            let r = run_once(dp.program(), f, ingress)?;
            if r.verdict != want {
                bail!(
                    "lb: {} for a setup frame of flow {i}",
                    verdict_name(r.verdict)
                );
            }
        }
    }
    Ok(())
}

/// Runs the cases (those whose name contains one of `only`, all if it is empty: a profile of
/// one case) for `rounds` rounds of `frames` frames.
pub fn run(rounds: usize, frames: u32, only: &[String]) -> anyhow::Result<Rate> {
    let lbns = Netns::new("rt-lb")?;
    let sink = Netns::new("rt-sink")?;
    lbns.sysctl("net/ipv4/ip_forward", "1")?;
    let (vc, sc) = veth(&lbns, "10.0.1.1/24", &sink, "10.0.1.2/24")?;
    let (vb, sb) = veth(&lbns, "10.0.2.1/24", &sink, "10.0.2.2/24")?;
    // One-arm: client and backend behind the same interface (DSR; full NAT).
    let (va, sa) = veth(&lbns, "10.0.3.1/24", &sink, "10.0.3.2/24")?;
    let (vo, so) = veth(&lbns, "10.0.4.1/24", &sink, "10.0.4.2/24")?;
    // The SYN proxy's clients, answered back out of the same interface.
    let (vp, sp) = veth(&lbns, "10.0.5.1/24", &sink, "10.0.5.2/24")?;
    let mac = |ns: &Netns, ifname: &str| ns.mac(ifname);
    let (sc_mac, sb_mac) = (mac(&sink, &sc.ifname)?, mac(&sink, &sb.ifname)?);
    let (sa_mac, so_mac) = (mac(&sink, &sa.ifname)?, mac(&sink, &so.ifname)?);
    let sp_mac = mac(&sink, &sp.ifname)?;
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
        ("10.0.4.3", so_mac, &vo.ifname),
        ("10.0.5.2", sp_mac, &vp.ifname),
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
    // No SYN rate limit: the setup opens 10,000 connections from one address at once.
    let text = format!(
        "[lb]\ninterfaces = [\"{}\", \"{}\", \"{}\", \"{}\", \"{}\"]\nsyn_rate_per_source = 0\n\n\
         [[service]]\nname = \"rate\"\nvip = \"10.100.0.1:80\"\n\
         backends = [{{ address = \"10.0.2.2:8080\" }}]\n\n[[service]]\nname = \"dsr\"\n\
         vip = \"10.100.0.2:80\"\nforwarding = \"ipip\"\nbackends = [{{ address = \"10.0.3.3:80\" }}]\n\n\
         [[service]]\nname = \"onearm\"\nvip = \"10.100.0.3:80\"\n\
         backends = [{{ address = \"10.0.4.3:8080\" }}]\n\n\
         [[service]]\nname = \"proxied\"\nvip = \"10.100.0.4:80\"\nsyn_proxy = \"on\"\n\
         backends = [{{ address = \"10.0.2.2:8080\" }}]\n",
        vc.ifname, vb.ifname, va.ifname, vo.ifname, vp.ifname
    );
    let config = lb::config::parse(&text).map_err(|e| anyhow::anyhow!("rate config: {e}"))?;
    let (dp, _balancer) = lbns.enter(|| -> anyhow::Result<_> {
        let (mut dp, b) = lb::daemon::prepare(&config)?;
        for iface in [&vc.ifname, &vb.ifname, &va.ifname, &vo.ifname, &vp.ifname] {
            dp.add_redirect_target(iface)?;
        }
        Ok((dp, b))
    })?;
    let (vc_idx, vc_mac) = (lbns.ifindex(&vc.ifname)?, lbns.mac(&vc.ifname)?);
    let (va_idx, va_mac) = (lbns.ifindex(&va.ifname)?, lbns.mac(&va.ifname)?);
    let (vo_idx, vo_mac) = (lbns.ifindex(&vo.ifname)?, lbns.mac(&vo.ifname)?);
    let (vp_idx, vp_mac) = (lbns.ifindex(&vp.ifname)?, lbns.mac(&vp.ifname)?);

    let two_arm = ("10.0.1.2", "10.100.0.1:80", (sc_mac, vc_mac));
    let dsr = ("10.0.3.2", "10.100.0.2:80", (sa_mac, va_mac));
    let one_arm = ("10.0.4.2", "10.100.0.3:80", (so_mac, vo_mac));
    let [two_frame, dsr_frame, one_frame] =
        [two_arm, dsr, one_arm].map(|(c, v, m)| data_frame(c, v, m));
    // A SYN of 58 bytes, the size of lb's SYN+ACK to it (the sink writes the next SYN over
    // the SYN+ACK, which must hold it): 4 bytes of data carry the cycle's number.
    let syn_frame = Packet::tcp("10.0.5.2:40000", "10.100.0.4:80", TCP_SYN)
        .seq(1000, 0)
        .payload(&[0x55; 4])
        .macs(sp_mac, vp_mac)
        .build();
    if bpf::max_flows(&two_frame) < FLOWS {
        bail!("the template cannot cycle through {FLOWS} flows");
    }
    lbns.enter(|| -> anyhow::Result<()> {
        establish(&dp, two_arm, FLOWS, vc_idx, XDP_REDIRECT)?;
        establish(&dp, one_arm, FLOWS, vo_idx, XDP_TX)?;
        establish(&dp, dsr, 1, va_idx, XDP_TX)
    })?;

    let cursor = Cursor::new()?;
    let sink_for = |name: &str, template: &[u8]| {
        Program::load(name, &bpf::next_flow_and_drop(template, &cursor))
    };
    let two_sink = sink_for("bench_sink", &two_frame)?;
    let dsr_sink = sink_for("bench_sink_dsr", &dsr_frame)?;
    let one_sink = sink_for("bench_sink_one", &one_frame)?;
    let syn_sink = sink_for("bench_sink_syn", &syn_frame)?;
    let _links = sink.enter(|| -> anyhow::Result<_> {
        Ok([
            bpf::attach(two_sink.fd(), sink.ifindex(&sc.ifname)?)?,
            bpf::attach(two_sink.fd(), sink.ifindex(&sb.ifname)?)?,
            bpf::attach(dsr_sink.fd(), sink.ifindex(&sa.ifname)?)?,
            bpf::attach(one_sink.fd(), sink.ifindex(&so.ifname)?)?,
            bpf::attach(syn_sink.fd(), sink.ifindex(&sp.ifname)?)?,
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
    // (name, program, flows, the frame and where it is injected, where its frames come out:
    // None = nowhere, dropped in place)
    let programs = [
        (DROP, drop.fd(), 1, (&two_frame, vc_idx), None),
        (
            BOUNCE,
            bounce.fd(),
            1,
            (&two_frame, vc_idx),
            Some(&sc.ifname),
        ),
        (ONE_ARM, lb_fd, 1, (&one_frame, vo_idx), Some(&so.ifname)),
        (
            ONE_ARM_MANY,
            lb_fd,
            FLOWS,
            (&one_frame, vo_idx),
            Some(&so.ifname),
        ),
        (TWO_ARM, lb_fd, 1, (&two_frame, vc_idx), Some(&sb.ifname)),
        (
            TWO_ARM_MANY,
            lb_fd,
            FLOWS,
            (&two_frame, vc_idx),
            Some(&sb.ifname),
        ),
        (LB_DSR, lb_fd, 1, (&dsr_frame, va_idx), Some(&sa.ifname)),
        (
            PROXY_SYN,
            lb_fd,
            FLOWS,
            (&syn_frame, vp_idx),
            Some(&sp.ifname),
        ),
    ];
    let programs: Vec<_> = programs
        .into_iter()
        .filter(|p| only.is_empty() || only.iter().any(|o| p.0.contains(o.as_str())))
        .collect();
    let mut cases: Vec<Case> = programs
        .iter()
        .map(|&(name, _, flows, _, _)| Case {
            name,
            flows,
            mpps: Vec::new(),
            delivered: 0.0,
            census: None,
        })
        .collect();
    let mut generated = vec![0u64; programs.len()];
    let mut arrived = vec![0u64; programs.len()];
    let lb_before = counters(&dp)?;
    let mut lb_frames = 0u64;
    // A warm-up run of each (not counted), then the rounds: all cases in turn, each round.
    for round in 0..=rounds {
        for (c, &(_, fd, flows, (frame, ingress), out)) in programs.iter().enumerate() {
            checkpoint()?;
            let n = if round == 0 { frames / 10 } else { frames };
            let before = match out {
                Some(ifname) => xdp_drops(&sink, ifname)?,
                None => 0,
            };
            cursor.start(flows, false)?;
            let took = lbns.enter(|| bpf::live_frames(fd, frame, ingress, n, 64))?;
            let got = match out {
                Some(ifname) => xdp_drops(&sink, ifname)? - before,
                None => u64::from(n),
            };
            if fd == lb_fd {
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
    // The census, untimed: twice round each many-flow cycle, frames counted by SNAT port.
    for (c, &(name, fd, flows, (frame, ingress), _)) in programs.iter().enumerate() {
        // (The proxy's SYN+ACKs all come from the VIP's port: its count is `syn_proxy_synack`.)
        if flows == 1 || name == PROXY_SYN {
            continue;
        }
        let n = 2 * flows;
        cursor.start(flows, true)?;
        lbns.enter(|| bpf::live_frames(fd, frame, ingress, n, 64))?;
        let seen = cursor.census()?;
        let counts = seen.iter().map(|&(_, k)| k);
        cases[c].census = Some((
            n,
            seen.len(),
            counts.clone().min().unwrap_or(0),
            counts.max().unwrap_or(0),
        ));
    }
    let lb_counters = (0..counter::COUNT as usize)
        .filter(|&i| lb_after[i] != lb_before[i])
        .map(|i| (counter::NAMES[i].to_owned(), lb_after[i] - lb_before[i]))
        .collect();
    Ok(Rate {
        cases,
        frames,
        rounds,
        frame_len: two_frame.len(),
        lb_counters,
        lb_frames,
    })
}

/// The markdown section body.
pub fn markdown(r: &Rate) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    let bounce = r.median(BOUNCE).unwrap_or(f64::NAN);
    let _ = writeln!(
        s,
        "{} rounds × {} frames of {} bytes per case, cases interleaved; median Mpps that reached \
         the sink, the ratio to the bounce, and the time per frame beyond the bounce's.\n",
        r.rounds, r.frames, r.frame_len
    );
    let _ = writeln!(
        s,
        "| program run on each frame | Mpps (median) | min – max | delivered | / bounce | ns / frame over the bounce |\n\
         |---|---:|---:|---:|---:|---:|"
    );
    for c in &r.cases {
        let m = median(&c.mpps);
        let (lo, hi) = super::min_max(&c.mpps);
        let extra = if c.name == DROP || c.name == BOUNCE {
            String::new()
        } else {
            format!("{:.1}", 1e3 / m - 1e3 / bounce)
        };
        let _ = writeln!(
            s,
            "| {} | {m:.2} | {lo:.2} – {hi:.2} | {:.1}% | {:.2}× | {extra} |",
            c.name,
            100.0 * c.delivered,
            m / bounce
        );
    }
    for c in &r.cases {
        if let Some((n, seen, lo, hi)) = c.census {
            let _ = writeln!(
                s,
                "\nCensus of \"{}\" (an untimed run of {n} frames, twice round the cycle): \
                 {seen} distinct SNAT ports of {} flows came out, {lo} – {hi} frames each.",
                c.name, c.flows
            );
        }
    }
    let counters: Vec<String> = r
        .lb_counters
        .iter()
        .map(|(n, v)| format!("`{n}` {v}"))
        .collect();
    let _ = writeln!(
        s,
        "\nlb's counters over its {} generated frames (warm-up included), those that moved: {}. \
         Flows are established before the runs: a `ct_new` here is a flow re-created after \
         another took its place (`ct_evicted`: lb's connection table is 2-way set-associative, \
         and where three of the 20,001 flows share a set, each pass of the cycle evicts one).",
        r.lb_frames,
        counters.join(", ")
    );
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The sink's flow i is the frame of source port 40000 + i whose payload starts with
    /// 0x5555 − i, checksums included (built independently here).
    #[test]
    fn cycle_frames_are_valid_frames_of_their_flows() {
        let macs = ([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2]);
        let t = data_frame("10.0.1.2", "10.100.0.1:80", macs);
        for i in [1u16, 77, 9_999] {
            let mut payload = [0x55; 10];
            payload[..2].copy_from_slice(&(0x5555 - i).to_be_bytes());
            let want = Packet::tcp(&format!("10.0.1.2:{}", 40000 + i), "10.100.0.1:80", TCP_ACK)
                .seq(1001, 1)
                .payload(&payload)
                .macs(macs.0, macs.1)
                .build();
            assert_eq!(bpf::flow_frame(&t, i), want, "flow {i}");
        }
    }
}
