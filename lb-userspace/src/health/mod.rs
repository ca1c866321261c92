//! Active health checks. `window` is the pure per-target state machine (counters, thresholds,
//! states and failure windows of SPEC §2): it does no I/O and reads no clock, so the probe
//! scheduler that drives it, and the probes themselves, can change without touching it.

pub mod checker;
pub mod probe;
pub mod window;
