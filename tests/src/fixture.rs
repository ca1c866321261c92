//! A table of (description, input frame, expected verdict, expected output, expected counter) run
//! through BPF_PROG_TEST_RUN. Every row runs; all mismatches are reported together, each with
//! both frames in hex and the differing bytes marked.

use std::fmt::Write as _;

use aya::programs::{TestRun as _, TestRunOptions, Xdp};
use lb::dataplane::Dataplane;
use lb_common::counter;

pub const XDP_ABORTED: u32 = 0;
pub const XDP_DROP: u32 = 1;
pub const XDP_PASS: u32 = 2;
pub const XDP_TX: u32 = 3;
pub const XDP_REDIRECT: u32 = 4;

pub fn verdict_name(v: u32) -> &'static str {
    [
        "XDP_ABORTED",
        "XDP_DROP",
        "XDP_PASS",
        "XDP_TX",
        "XDP_REDIRECT",
    ]
    .get(v as usize)
    .copied()
    .unwrap_or("unknown")
}

pub struct Fixture {
    pub desc: String,
    pub input: Vec<u8>,
    pub verdict: u32,
    /// None: the frame must come out unchanged.
    pub output: Option<Vec<u8>>,
    /// Skip the output comparison (for rows about counters and verdicts only).
    pub any_output: bool,
    /// The verdict counter (`lb_common::counter`, or the table's [`Counters`]) that must count
    /// this frame.
    pub counter: u32,
    /// Informational counters that must count it too; no other informational counter may move.
    pub also: Vec<u32>,
    /// Interface index the frame arrives on (0: loopback), in the namespace of the calling thread.
    pub ingress: u32,
}

impl Fixture {
    pub fn new(desc: impl Into<String>, input: Vec<u8>, verdict: u32, counter: u32) -> Self {
        Self {
            desc: desc.into(),
            input,
            verdict,
            output: None,
            any_output: false,
            counter,
            also: Vec::new(),
            ingress: 0,
        }
    }

    pub fn ingress(mut self, ifindex: u32) -> Self {
        self.ingress = ifindex;
        self
    }

    pub fn output(mut self, output: Vec<u8>) -> Self {
        self.output = Some(output);
        self
    }

    pub fn any_output(mut self) -> Self {
        self.any_output = true;
        self
    }

    pub fn also(mut self, counter: u32) -> Self {
        self.also.push(counter);
        self
    }
}

/// Output of one run.
pub struct RunResult {
    pub verdict: u32,
    pub output: Vec<u8>,
    pub duration_ns: u64,
}

/// Runs `prog` once on `input`, arriving on interface `ingress` (0: the default, loopback) of the
/// calling thread's network namespace, where its route lookups happen too.
pub fn run_once(prog: &Xdp, input: &[u8], ingress: u32) -> anyhow::Result<RunResult> {
    let mut out = vec![0u8; input.len() + 256];
    // struct xdp_md: data, data_end, data_meta, ingress_ifindex, rx_queue_index, egress_ifindex.
    let md: [u32; 6] = [0, input.len() as u32, 0, ingress, 0, 0];
    let md_bytes: Vec<u8> = md.iter().flat_map(|v| v.to_ne_bytes()).collect();
    let r = prog.test_run(TestRunOptions {
        data_in: Some(input),
        data_out: Some(&mut out),
        ctx_in: (ingress != 0).then_some(&md_bytes[..]),
        repeat: 1,
        ..Default::default()
    })?;
    out.truncate(r.data_size_out as usize);
    Ok(RunResult {
        verdict: r.return_value,
        output: out,
        duration_ns: r.duration.as_nanos() as u64,
    })
}

/// A program's counters as a table checks them: their names, how many of them (the first) are
/// verdicts, and how to read them (summed over CPUs, indexed like the names).
pub struct Counters<'a> {
    pub names: &'a [&'a str],
    pub verdicts: u32,
    pub read: &'a dyn Fn() -> anyhow::Result<Vec<u64>>,
}

/// Keeps the calling thread on CPU 0, for rows that depend on one CPU's state (a per-CPU rate's
/// budget): BPF_PROG_TEST_RUN runs the program on the caller's CPU.
pub fn on_cpu0() {
    // SAFETY: a zeroed cpu_set_t with one CPU set, for this thread only.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(0, &mut set);
        assert_eq!(
            libc::sched_setaffinity(0, std::mem::size_of_val(&set), &set),
            0,
            "pinning the thread to CPU 0"
        );
    }
}

/// Runs every fixture against the balancer program of `dp`; panics listing every mismatch.
pub fn run_fixtures(dp: &Dataplane, fixtures: &[Fixture]) {
    let read = || Ok(dp.stats()?.counters);
    let counters = Counters {
        names: &counter::NAMES,
        verdicts: counter::VERDICTS,
        read: &read,
    };
    run_table(dp.program(), &counters, fixtures);
}

/// Runs every fixture against `prog`, whose counters are `counters` (the balancer's, or
/// another program's list of the same shape: `lb_common::decap_counter`); panics listing
/// every mismatch.
pub fn run_table(prog: &Xdp, counters: &Counters<'_>, fixtures: &[Fixture]) {
    let mut failures = String::new();
    for f in fixtures {
        if let Err(report) = check(prog, counters, f) {
            let _ = writeln!(failures, "\n--- {} ---\n{report}", f.desc);
        }
    }
    assert!(failures.is_empty(), "fixture mismatches:{failures}");
}

fn check(prog: &Xdp, counters: &Counters<'_>, f: &Fixture) -> Result<(), String> {
    let names = counters.names;
    let before = (counters.read)().map_err(|e| format!("{e:#}"))?;
    let r = run_once(prog, &f.input, f.ingress).map_err(|e| format!("test run failed: {e:#}"))?;
    let after = (counters.read)().map_err(|e| format!("{e:#}"))?;
    let mut report = String::new();
    if r.verdict != f.verdict {
        let _ = writeln!(
            report,
            "verdict {} (want {})",
            verdict_name(r.verdict),
            verdict_name(f.verdict)
        );
    }
    let want = f.output.as_deref().unwrap_or(&f.input);
    if !f.any_output && r.output != want {
        let _ = writeln!(report, "output differs:\n{}", hex_diff(want, &r.output));
    }
    let delta = |i: usize| after[i] - before[i];
    let verdicts: u64 = (0..counters.verdicts as usize).map(delta).sum();
    if verdicts != 1 || delta(f.counter as usize) != 1 {
        let moved: Vec<String> = (0..names.len())
            .filter(|&i| delta(i) != 0)
            .map(|i| format!("{}+{}", names[i], delta(i)))
            .collect();
        let _ = writeln!(
            report,
            "counters moved: [{}], want exactly {}+1",
            moved.join(", "),
            names[f.counter as usize]
        );
    }
    // Informational counters: exactly those listed move, by one each.
    for (i, name) in names.iter().enumerate().skip(counters.verdicts as usize) {
        let want = f.also.iter().filter(|&&a| a as usize == i).count() as u64;
        if delta(i) != want {
            let _ = writeln!(report, "counter {name} moved by {}, want {want}", delta(i));
        }
    }
    if report.is_empty() {
        Ok(())
    } else {
        Err(report)
    }
}

/// Both frames, 16 bytes a line, differing bytes in brackets.
pub fn hex_diff(want: &[u8], got: &[u8]) -> String {
    let row = |s: &mut String, label: &str, this: &[u8], other: &[u8], start: usize| {
        let _ = write!(s, "{label} ");
        for i in start..start + 16 {
            match this.get(i) {
                Some(b) if this.get(i) != other.get(i) => {
                    let _ = write!(s, "[{b:02x}]");
                }
                Some(b) => {
                    let _ = write!(s, " {b:02x} ");
                }
                None => s.push_str("    "),
            }
        }
        s.push('\n');
    };
    let mut s = String::new();
    for start in (0..want.len().max(got.len())).step_by(16) {
        let _ = write!(s, "{start:04x}  ");
        row(&mut s, "want", want, got, start);
        row(&mut s, "      got ", got, want, start);
    }
    s
}

/// Checks that the expected output frames of `fixtures` have right checksums (a mistake in a
/// fixture, not in lb), but where a fixture's description says "checksum 0".
pub fn check_expected(fixtures: &[Fixture]) {
    for f in fixtures.iter().filter(|f| !f.desc.contains("checksum 0")) {
        if let Some(out) = &f.output {
            crate::packet::verify_checksums(out)
                .unwrap_or_else(|err| panic!("{}: expected frame: {err}", f.desc));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_diff_marks_differing_and_missing_bytes() {
        let d = hex_diff(&[1, 2, 3], &[1, 9]);
        let lines: Vec<&str> = d.lines().collect();
        assert_eq!(lines.len(), 2, "{d}");
        assert!(lines[0].starts_with("0000  want  01 [02][03]"), "{d}");
        assert!(lines[1].starts_with("      got   01 [09]    "), "{d}");
    }
}

/// The datapath trace's records as aya-log hands them over, read back by the daemon's parser
/// (a logger for `Dataplane::take_trace`).
#[derive(Clone, Default)]
pub struct Collect(std::sync::Arc<std::sync::Mutex<Vec<String>>>);

impl log::Log for Collect {
    fn enabled(&self, _: &log::Metadata<'_>) -> bool {
        true
    }
    fn log(&self, record: &log::Record<'_>) {
        self.0.lock().unwrap().push(record.args().to_string());
    }
    fn flush(&self) {}
}

impl Collect {
    /// The records collected since the last call, parsed as the daemon parses them.
    pub fn take(&self) -> Vec<lb::trace::Record> {
        let lines = std::mem::take(&mut *self.0.lock().unwrap());
        lines
            .iter()
            .map(|l| lb::trace::Record::parse(l).unwrap_or_else(|| panic!("not a record: {l}")))
            .collect()
    }
}

/// A trace of every packet, at 1000 records a second, without a deadline.
pub fn everything() -> lb_common::TraceFilter {
    lb_common::TraceFilter {
        service_id: lb_common::TRACE_NONE,
        rate: 1000,
        rate_scaled: lb_common::Params::per_2_32_ns(1000),
        client_prefix: 0,
        client: [0; 4],
        until_ns: u64::MAX,
    }
}
