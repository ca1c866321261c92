//! Per-CPU counters: plain adds, no atomics, since each CPU owns its slot.
#![cfg_attr(not(target_arch = "bpf"), allow(dead_code))]

use crate::maps::{SERVICE_STATS, STATS};

#[inline(always)]
pub fn count(index: u32) {
    if let Some(c) = STATS.get_ptr_mut(index) {
        // SAFETY: per-CPU slot, only this CPU writes it while the program runs.
        unsafe { *c += 1 };
    }
}

#[inline(always)]
pub fn count_service(id: u32, bytes: usize) {
    if let Some(s) = SERVICE_STATS.get_ptr_mut(id) {
        // SAFETY: as above.
        unsafe {
            (*s).packets += 1;
            (*s).bytes += bytes as u64;
        }
    }
}
