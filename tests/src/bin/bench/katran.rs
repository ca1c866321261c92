//! `--katran DIR`: Katran's balancer timed in lb-bench's loop beside lb, in three cases (an
//! established flow, the same SYN created anew, a new flow each time into cold tables), and the
//! side-by-side table with the goals of issue 42 (lb ≤ 0.75× Katran on the first two, ≤ 0.9× on
//! the cold new flow), judged from the medians.

use std::{
    fmt::Write as _,
    net::Ipv4Addr,
    path::{Path, PathBuf},
};

use anyhow::{Context as _, bail};
use lb_tests::{
    bench::katran::{self, FlowKey, Katran},
    fixture::{XDP_TX, run_once, verdict_name},
    netns::veth_maybe_addressed,
    packet::{Packet, TCP_SYN},
    testnet::TestNet,
};

use super::{Case, Forget, Prog, stats};

/// lb-bench's IPv4 service (`web`), which Katran gets too: its VIP and its four backends'
/// addresses (Katran's reals have no port).
const VIP: Ipv4Addr = Ipv4Addr::new(10, 100, 0, 1);
const PORT: u16 = 80;
const REALS: [Ipv4Addr; 4] = [
    Ipv4Addr::new(10, 0, 2, 2),
    Ipv4Addr::new(10, 0, 2, 3),
    Ipv4Addr::new(10, 0, 2, 4),
    Ipv4Addr::new(10, 0, 2, 5),
];
/// The clients of lb's established and re-created flows (lb-bench's `measure`).
const ESTABLISHED: (Ipv4Addr, u16) = (Ipv4Addr::new(10, 0, 1, 2), 40000);
const RECREATED: (Ipv4Addr, u16) = (Ipv4Addr::new(10, 0, 1, 3), 40000);

/// Katran's cases, in this order after lb's, each with lb's case it is compared with (its
/// index in lb-bench's cases) and the goal for lb's median over Katran's.
const CASES: [(&str, usize, f64); 3] = [
    ("vs Katran: established flow", 4, 0.75),
    (
        "vs Katran: new flow (SYN), the same flow created anew each time",
        3,
        0.75,
    ),
    (
        "vs Katran: new flow (SYN), each a different flow: cold table memory",
        2,
        0.9,
    ),
];

/// Katran's cold new-flow case in `CASES`.
const COLD: usize = 2;

/// The same cold case like for like: lb's new flow to a direct-server-return backend through
/// IP in IP, Katran's one forwarding mode (no NAT table, no SNAT port), against Katran's cold
/// case ([`COLD`], with its goal). lb's row by its name: it is not measured with `--ipv4-only`.
const LIKE_FOR_LIKE: (&str, &str) = (
    "vs Katran, like for like (IP in IP, no NAT): new flow (SYN), each a different flow: cold \
     table memory",
    "DSR ipip: new flow (SYN), each a different flow",
);

/// Katran built, loaded and attached, and what the report says about it.
pub struct Started {
    pub katran: Katran,
    source: PathBuf,
    commit: Option<String>,
    object: PathBuf,
    lru_size: u32,
}

/// Builds Katran from `dir` into `target/bench/katran/` and attaches it (native XDP) to an idle
/// veth of its own in `net`'s namespace, as lb's program is (`TestNet::attach_idle`); its
/// connection tables get `lru_size` entries per CPU (lb's one-flow table has as many).
pub fn start(net: &TestNet, dir: &Path, lru_size: u32) -> anyhow::Result<Started> {
    let source =
        std::fs::canonicalize(dir).with_context(|| format!("--katran {}", dir.display()))?;
    let object = katran::build(&source, &target_dir()?.join("bench").join("katran"))?;
    // No addresses, IPv6 off: the pair carries nothing (see TestNet::attach_idle).
    let off = "net/ipv6/conf/default/disable_ipv6";
    net.ns.sysctl(off, "1")?;
    let pair = veth_maybe_addressed(&net.ns, None, &net.ns, None);
    net.ns.sysctl(off, "0")?;
    let (a, _b) = pair?;
    let katran = Katran::load(&object, VIP, PORT, &REALS, lru_size, &net.ns, &a.ifname)?;
    let commit = std::process::Command::new("git")
        .arg("-C")
        .arg(&source)
        .args(["rev-parse", "--short", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned());
    Ok(Started {
        katran,
        source,
        commit,
        object,
        lru_size,
    })
}

/// The build's target directory: where this binary is (`target/<profile>/lb-bench`).
fn target_dir() -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe().context("finding lb-bench's path")?;
    exe.parent()
        .and_then(Path::parent)
        .map(Path::to_path_buf)
        .context("lb-bench is not in a target directory")
}

/// lb's frames that Katran's cases send too.
pub struct Frames<'a> {
    /// A data packet of the established flow (lb-bench's, from `ESTABLISHED`).
    pub established: &'a [u8],
    /// The SYN of the flow created anew (from `RECREATED`).
    pub recreated: &'a [u8],
    /// One SYN of a new flow per sample.
    pub new_flows: Vec<Vec<u8>>,
}

/// Katran's cases: the established flow made by its own SYN first (and copied into every
/// CPU's table, so that the thread finds it wherever it runs); the re-created SYN's flow
/// removed from the tables before each sample, as lb's is from lb's.
pub fn cases(k: &mut Started, ingress: u32, frames: &Frames) -> anyhow::Result<Vec<Case>> {
    let (client, port) = ESTABLISHED;
    let syn = Packet::tcp(
        &format!("{client}:{port}"),
        &format!("{VIP}:{PORT}"),
        TCP_SYN,
    )
    .build();
    let k = &mut k.katran;
    for (what, frame) in [("setup SYN", &syn[..]), ("data packet", frames.established)] {
        let r = run_once(k.program(), frame, ingress)?;
        if r.verdict != XDP_TX {
            bail!(
                "Katran: {what} to {VIP}:{PORT}: {}",
                verdict_name(r.verdict)
            );
        }
        // Katran encapsulates IP in IP to a real: the outer destination is one of them.
        let outer = Ipv4Addr::new(r.output[30], r.output[31], r.output[32], r.output[33]);
        if r.output[23] != 4 || !REALS.contains(&outer) {
            bail!("Katran: {what}: not IP in IP to a real (outer destination {outer})");
        }
        if what == "setup SYN" {
            k.spread(&FlowKey::tcp(client, port, VIP, PORT))?;
        }
    }
    let (rc, rp) = RECREATED;
    let case = |i: usize, frames: Vec<Vec<u8>>| {
        Case::new(CASES[i].0, frames, ingress, XDP_TX).prog(Prog::Katran)
    };
    Ok(vec![
        case(0, vec![frames.established.to_vec()]),
        case(1, vec![frames.recreated.to_vec()])
            .forget(Forget::Katran(FlowKey::tcp(rc, rp, VIP, PORT))),
        case(COLD, frames.new_flows.clone()),
    ])
}

/// The side-by-side table: Katran's cases (from `first` in `cases`) beside lb's, each a ratio
/// to the empty program (case 0) sampled in the same loop, and the goals from the medians.
pub fn report(k: &Started, cases: &mut [Case], first: usize, n: usize) -> anyhow::Result<String> {
    let (base_mean, base_median) = stats(&mut cases[0].samples);
    // Katran skips its LRU update above 125,000 new flows a second (its flood guard): then its
    // cold case times less work than lb's. Every new flow should be in a table; said loudly if
    // not, rather than losing the run's other tables.
    let held = k.katran.flows()?;
    let mut out = String::new();
    if held < n {
        let warning = format!(
            "**Warning:** Katran's connection tables hold {held} flows after {n} new ones: its \
             flood guard or evictions skipped inserts, so its new-flow rows below time less work \
             than lb's."
        );
        eprintln!("{warning}");
        let _ = writeln!(out, "\n{warning}");
    }
    let _ = writeln!(
        out,
        "\n**Beside Katran.** Katran's `{}` from `{}`{}, built with Katran's own flags (`{}`; \
         object `{}`) and configured as its tester provisions a VIP (`KatranTestProvision.cpp`, \
         `KatranLb`): one TCP VIP {VIP}:{PORT}, no flags, 4 reals {}–{} (weight 1), its \
         Maglev ring of 65,537 slots filled for them (Katran's algorithm; which slot holds \
         which real differs, Katran hashing its folly address), the default MAC `00:00:de:ad:be:af` in \
         `ctl_array[0]`; a connection table (LRU hash) of {} entries for each CPU in \
         `lru_mapping`, as `KatranLb` makes for forwarding cores (the tester names none and \
         would use the 1,000-entry fallback LRU). Attached (native XDP) to an idle veth of its \
         own and sampled in the same loop as lb's cases above: {n} samples per case, ratios to \
         the empty program (mean {base_mean:.1} ns, median {base_median:.0} ns). After the run \
         Katran's tables held {held} flows ({n} new ones made). Goals (issue 42): lb's \
         median ≤ 0.75× Katran's for the established flow and the re-created SYN, ≤ 0.9× for \
         a new flow into cold tables, lb's per-source SYN limit on at its default (each new \
         flow's SYN from a source of its own, as many clients' are). Katran forwards only by \
         encapsulation (its backends answer the clients directly): lb's full-NAT new flow also \
         claims a NAT slot and a SNAT port, a second table Katran has no part of, so the last \
         row compares lb doing what Katran does (a direct-server-return service, IP in IP) \
         with Katran's same cold case.\n",
        katran::SOURCE,
        k.source.display(),
        k.commit
            .as_ref()
            .map_or(String::new(), |c| format!(" (commit {c})")),
        katran::build_flags(),
        k.object.display(),
        REALS[0],
        REALS[3],
        k.lru_size,
    );
    let _ = writeln!(
        out,
        "| case | Katran mean / empty | Katran median / empty | lb mean / empty | \
         lb median / empty | Katran median ns | lb median ns | lb / Katran (median) | goal |"
    );
    let _ = writeln!(out, "|---|---:|---:|---:|---:|---:|---:|---:|---|");
    let like = cases[..first]
        .iter()
        .position(|c| c.name == LIKE_FOR_LIKE.1)
        .map(|lb| (LIKE_FOR_LIKE.0, COLD, lb, CASES[COLD].2));
    let rows = CASES
        .iter()
        .enumerate()
        .map(|(i, &(name, lb, goal))| (name, i, lb, goal))
        .chain(like);
    for (name, i, lb, goal) in rows {
        let (k_mean, k_median) = stats(&mut cases[first + i].samples);
        let (l_mean, l_median) = stats(&mut cases[lb].samples);
        let ratio = l_median / k_median;
        let _ = writeln!(
            out,
            "| {name} | {:.2}× | {:.2}× | {:.2}× | {:.2}× | {k_median:.0} | {l_median:.0} | \
             {ratio:.2}× | ≤ {goal}×: {} |",
            k_mean / base_mean,
            k_median / base_median,
            l_mean / base_mean,
            l_median / base_median,
            if ratio <= goal { "met" } else { "**not met**" }
        );
    }
    Ok(out)
}
