//! Per-CPU counters: plain adds, no atomics, since each CPU owns its slot.
#![cfg_attr(not(target_arch = "bpf"), allow(dead_code))]

use lb_common::TrafficStats;

use crate::maps::{BACKEND_STATS, SERVICE_STATS, STATS};

#[inline(always)]
pub fn count(index: u32) {
    if let Some(c) = STATS.get_ptr_mut(index) {
        // SAFETY: per-CPU slot, only this CPU writes it while the program runs.
        unsafe { *c += 1 };
    }
}

/// One forwarded packet of a flow of `service` to `backend`; `new_flow` when it created the flow.
#[inline(always)]
pub fn count_traffic(service: u32, backend: u32, bytes: usize, new_flow: bool) {
    // Two separate checks on purpose: combined null checks make LLVM OR the pointers, which
    // the verifier refuses.
    if let Some(s) = SERVICE_STATS.get_ptr_mut(service) {
        add(s, bytes, new_flow);
    }
    if let Some(b) = BACKEND_STATS.get_ptr_mut(backend) {
        add(b, bytes, new_flow);
    }
}

/// A SYN the SYN proxy answered for `service`: a new connection of it (its `new_flows`),
/// which `syn_proxy = "auto"` measures; the flow, if the client completes the handshake, is
/// not counted again.
#[inline(always)]
pub fn count_attempt(service: u32) {
    if let Some(s) = SERVICE_STATS.get_ptr_mut(service) {
        // SAFETY: a per-CPU map value, only this CPU writes it while the program runs.
        unsafe { (*s).new_flows += 1 };
    }
}

/// The first packet of a new flow of `service` to `backend` whose service counted it as a
/// connection already ([`count_attempt`]).
#[inline(always)]
pub fn count_opened(service: u32, backend: u32, bytes: usize) {
    if let Some(s) = SERVICE_STATS.get_ptr_mut(service) {
        add(s, bytes, false);
    }
    if let Some(b) = BACKEND_STATS.get_ptr_mut(backend) {
        add(b, bytes, true);
    }
}

/// A TCP flow of `service` to `backend` past its handshake, or met mid-stream: not half-open
/// (see `TrafficStats::handshakes`). Once a flow.
#[inline(always)]
pub fn count_handshake(service: u32, backend: u32) {
    if let Some(s) = SERVICE_STATS.get_ptr_mut(service) {
        // SAFETY: a per-CPU map value, only this CPU writes it while the program runs.
        unsafe { (*s).handshakes += 1 };
    }
    if let Some(b) = BACKEND_STATS.get_ptr_mut(backend) {
        // SAFETY: as above.
        unsafe { (*b).handshakes += 1 };
    }
}

#[inline(always)]
fn add(t: *mut TrafficStats, bytes: usize, new_flow: bool) {
    // SAFETY: a per-CPU map value, only this CPU writes it while the program runs.
    unsafe {
        (*t).packets += 1;
        (*t).bytes += bytes as u64;
        (*t).new_flows += u64::from(new_flow);
    }
}
