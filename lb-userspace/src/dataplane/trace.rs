//! The datapath trace's side of the loaded object (design: lb-common's trace.rs): `lb_trace`
//! in its program array, and, taken out of the object for the daemon's trace, the gate, the
//! filter, the per-CPU losses and aya-log's ring of records.

use anyhow::{Context as _, anyhow};
use aya::{
    Ebpf,
    maps::{Array, MapData, PerCpuArray, ProgramArray},
};
use aya_log::EbpfLogger;
use lb_common::{TRACE_GATE_SECTION, TRACE_PROGRAM_NAME, TraceCpu, TraceFilter, map_name};

use super::Dataplane;

/// Puts `lb_trace` in its slot (loaded already, as the other programs).
pub(super) fn install(ebpf: &mut Ebpf) -> anyhow::Result<()> {
    let fd = ebpf
        .program(TRACE_PROGRAM_NAME)
        .with_context(|| format!("program {TRACE_PROGRAM_NAME} missing"))?
        .fd()
        .with_context(|| format!("program {TRACE_PROGRAM_NAME} not loaded"))?
        .try_clone()?;
    let mut progs = ProgramArray::try_from(
        ebpf.map_mut(map_name::TRACE_PROG)
            .with_context(|| format!("map {} missing", map_name::TRACE_PROG))?,
    )?;
    progs
        .set(0, &fd, 0)
        .with_context(|| format!("installing program {TRACE_PROGRAM_NAME}"))
}

/// The trace's switches: its gate (one word the balancer tests at its trace points) and the
/// filter `lb_trace` applies.
pub struct TraceMaps {
    gate: Array<MapData, u32>,
    filter: Array<MapData, TraceFilter>,
    cpu: PerCpuArray<MapData, TraceCpu>,
}

impl TraceMaps {
    /// Writes `filter`, then opens the gate: the datapath traces from the next packet on.
    pub fn start(&mut self, filter: &TraceFilter) -> anyhow::Result<()> {
        self.filter
            .set(0, filter, 0)
            .context("writing the trace's filter")?;
        self.gate.set(0, &1, 0).context("opening the trace's gate")
    }

    /// Closes the gate: the trace points cost their one test again.
    pub fn stop(&mut self) -> anyhow::Result<()> {
        self.gate.set(0, &0, 0).context("closing the trace's gate")
    }

    /// Whether the gate is open (`lb_trace` closes it itself past the filter's deadline).
    pub fn is_on(&self) -> anyhow::Result<bool> {
        Ok(self.gate.get(&0, 0).context("reading the trace's gate")? != 0)
    }

    /// Records suppressed by the rate limit and lost to a full ring, summed over CPUs.
    pub fn losses(&self) -> anyhow::Result<(u64, u64)> {
        let per_cpu = self
            .cpu
            .get(&0, 0)
            .context("reading the trace's counters")?;
        Ok(per_cpu
            .iter()
            .fold((0, 0), |(l, x), c| (l + c.limited, x + c.lost)))
    }
}

impl Dataplane {
    /// Moves the trace's maps and aya-log's ring out of the datapath (once), the records going
    /// to `sink` as its reader flushes them ([`EbpfLogger::flush`], when its descriptor turns
    /// readable).
    pub fn take_trace<L: log::Log>(
        &mut self,
        sink: L,
    ) -> anyhow::Result<(TraceMaps, EbpfLogger<L>)> {
        let mut take = |name: &str| {
            self.ebpf
                .take_map(name)
                .with_context(|| format!("map {name} missing (taken already?)"))
        };
        let maps = TraceMaps {
            gate: Array::try_from(take(TRACE_GATE_SECTION)?)
                .context("the trace's gate (a global of the XDP object)")?,
            filter: Array::try_from(take(map_name::TRACE)?)?,
            cpu: PerCpuArray::try_from(take(map_name::TRACE_CPU)?)?,
        };
        let logger = EbpfLogger::init_with_logger(&mut self.ebpf, sink)
            .map_err(|e| anyhow!("opening aya-log's ring of the XDP object: {e}"))?;
        Ok((maps, logger))
    }
}
