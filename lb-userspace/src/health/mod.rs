//! Health checks. Active: `window` is the pure per-target state machine (counters, thresholds,
//! states and failure windows of SPEC §2): it does no I/O and reads no clock, so the probe
//! scheduler that drives it, and the probes themselves, can change without touching it.
//! Passive: `passive` is the pure ejection rule for failures seen in real traffic (SPEC §3).

pub mod checker;
pub mod passive;
pub mod probe;
pub mod schedule;
mod wheel;
pub mod window;
