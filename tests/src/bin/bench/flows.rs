//! Many live flows: established packets of flows visited in random order over a table holding
//! a tenth of `live` and then `live` flows (the cache and TLB regime of a busy balancer, where
//! the one-flow rows keep everything in cache), and new flows into the table holding `live`.
//!
//! The flows are made by the program itself (a SYN, then an ACK: established), so the tables
//! hold exactly what the datapath writes. A flow is only made live when its connection table
//! set has room, so no live flow is evicted by another while filling (each visit then finds its
//! flow: checked with the mid-stream counter). Each row is sampled alternately with the empty
//! program, and its ratio is to those samples.

use std::{net::Ipv4Addr, time::Instant};

use anyhow::bail;
use lb_common::{FlowKey, PROTO_TCP, counter, ways};
use lb_tests::{
    fixture::{XDP_PASS, XDP_REDIRECT, run_once, verdict_name},
    packet::{Packet, TCP_ACK, TCP_PSH, TCP_SYN},
    rng::Rng,
    testnet::{BACKENDS, TestNet, ne},
};

const VIP: &str = "10.100.0.9";

/// One row: its samples and those of the empty program taken alternately with them.
pub struct Row {
    pub name: String,
    pub samples: Vec<u64>,
    pub empty: Vec<u64>,
}

/// The service: 64 backends (8 addresses with neighbours × 8 ports), so that `live` flows use
/// a fraction of the SNAT ports (a million flows: a quarter of 64 × 64,512).
fn services() -> String {
    let backends: Vec<String> = (0..BACKENDS)
        .flat_map(|a| {
            (0..8).map(move |p| format!("{{ address = \"10.0.2.{}:{}\" }}", a + 2, 8080 + p))
        })
        .collect();
    format!(
        "[[service]]\nname = \"many\"\nvip = \"{VIP}:80\"\nbackends = [{}]\n",
        backends.join(", ")
    )
}

/// Client `i` of the flows: one address each (10.128.0.0/9), so the per-source SYN buckets are
/// spread too.
fn client_addr(i: usize) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 128, 0, 0)) + i as u32)
}

fn client_port(i: usize) -> u16 {
    (1024 + i % 60000) as u16
}

fn client(i: usize) -> String {
    format!("{}:{}", client_addr(i), client_port(i))
}

fn frame(i: usize, flags: u8, payload: bool) -> Vec<u8> {
    let p = Packet::tcp(&client(i), &format!("{VIP}:80"), flags);
    if payload {
        p.payload(&[0x55; 64]).build()
    } else {
        p.build()
    }
}

/// Runs `frame` through the balancer, which must forward it.
fn forward(net: &TestNet, frame: &[u8], what: &str) -> anyhow::Result<u64> {
    let r = run_once(net.dp.program(), frame, net.vc)?;
    if r.verdict != XDP_REDIRECT {
        bail!("{what}: verdict {}", verdict_name(r.verdict));
    }
    Ok(r.duration_ns)
}

/// The flows made live so far (client indexes) and the occupancy of the connection table's sets.
struct Live {
    flows: Vec<usize>,
    sets: Vec<u8>,
    mask: u32,
    next: usize,
}

impl Live {
    /// Makes flows live (SYN, then ACK) until `count` are.
    fn fill(&mut self, net: &TestNet, count: usize) -> anyhow::Result<()> {
        let vip = ne(VIP);
        while self.flows.len() < count {
            let i = self.next;
            self.next += 1;
            let saddr = u32::from_ne_bytes(client_addr(i).octets());
            let key = FlowKey::new(saddr, vip, client_port(i).to_be(), 80u16.to_be(), PROTO_TCP);
            let set = (ways(key.hash(), self.mask).0 / 2) as usize;
            if self.sets[set] == 2 {
                continue;
            }
            self.sets[set] += 1;
            forward(net, &frame(i, TCP_SYN, false), "filling: SYN")?;
            forward(net, &frame(i, TCP_ACK, false), "filling: ACK")?;
            self.flows.push(i);
        }
        Ok(())
    }
}

/// Samples `n` of `frames(i)` through the balancer, alternately with the empty program.
fn sample(
    net: &TestNet,
    name: String,
    n: usize,
    mut frames: impl FnMut(usize) -> Vec<u8>,
) -> anyhow::Result<Row> {
    let idle = Packet::tcp("10.0.1.2:40000", "10.0.1.9:22", TCP_ACK).build();
    let mut row = Row {
        name,
        samples: Vec::with_capacity(n),
        empty: Vec::with_capacity(n),
    };
    for i in 0..n {
        let r = run_once(net.dp.pass_program(), &idle, net.vc)?;
        if r.verdict != XDP_PASS {
            bail!("empty program: verdict {}", verdict_name(r.verdict));
        }
        row.empty.push(r.duration_ns);
        let f = frames(i);
        row.samples.push(forward(net, &f, &row.name)?);
    }
    Ok(row)
}

/// Established packets over `live / 10` and `live` live flows in random order, then new flows
/// into the table holding `live`; `n` samples each; both programs attached (see
/// `TestNet::attach_idle`) or neither.
pub fn measure(live: usize, n: usize, attached: bool) -> anyhow::Result<Vec<Row>> {
    // Twice the slots of the flows: the table a deployment would size for them.
    let slots = (2 * live).next_power_of_two() as u32;
    let mut net = TestNet::new(
        &format!(
            "snat_ports = \"1024-65535\"\n\
             conntrack = {{ size = {slots}, ipv6_size = 1024 }}"
        ),
        &services(),
    )?;
    if attached {
        net.attach_idle()?;
    }
    let ns = net.ns.clone();
    ns.enter(|| {
        let mut live_flows = Live {
            flows: Vec::with_capacity(live),
            sets: vec![0; slots as usize / 2],
            mask: slots - 1,
            next: 0,
        };
        let midstream = |net: &TestNet| -> anyhow::Result<u64> {
            Ok(net.dp.stats()?.counter(counter::CT_MISS_MIDSTREAM))
        };
        let mut rows = Vec::new();
        let mut rng = Rng::new(20);
        for count in [live / 10, live] {
            let t = Instant::now();
            live_flows.fill(&net, count)?;
            eprintln!(
                "many flows: {count} live ({} slots), made in {:.1} s",
                slots,
                t.elapsed().as_secs_f64()
            );
            let mut order = live_flows.flows.clone();
            for k in (1..order.len()).rev() {
                order.swap(k, rng.below(k + 1));
            }
            let before = midstream(&net)?;
            rows.push(sample(
                &net,
                format!("established flow, {count} live flows visited in random order"),
                n,
                |i| frame(order[i % order.len()], TCP_ACK | TCP_PSH, true),
            )?);
            if midstream(&net)? != before {
                bail!(
                    "a live flow was missing from the table: the row would time re-created flows"
                );
            }
        }
        let first_new = live_flows.next;
        rows.push(sample(
            &net,
            format!("new flow (SYN), each a different flow, into a table holding {live} flows"),
            n,
            |i| frame(first_new + i, TCP_SYN, false),
        )?);
        Ok(rows)
    })
}
