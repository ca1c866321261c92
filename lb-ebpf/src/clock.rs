//! The coarse monotonic clock, read from the kernel once per tick instead of once per packet:
//! the `bpf_ktime_get_coarse_ns` helper is three kernel calls and returns (about a tenth of an
//! established packet's program time, measured), while `bpf_jiffies64` is inlined by the
//! verifier into one load, and the coarse clock only moves on a tick, when jiffies do.
//!
//! One reading shared by all CPUs (rewritten about once per tick). A CPU may cache the previous
//! tick's time if it reads in the instant between the jiffies update and the clock's, and two
//! CPUs refreshing at once may leave either reading: `now` can be up to a tick or two behind,
//! or behind a time another CPU stored. Timeouts are seconds, and ages are computed with
//! `saturating_sub` so a time "from the future" counts as fresh.
#![cfg_attr(not(target_arch = "bpf"), allow(dead_code))]

use aya_ebpf::helpers::{bpf_jiffies64, bpf_ktime_get_coarse_ns};

#[repr(C)]
struct Reading {
    jiffies: u64,
    ns: u64,
}

static mut LAST: Reading = Reading { jiffies: 0, ns: 0 };

/// Coarse monotonic nanoseconds, as `bpf_ktime_get_coarse_ns`.
#[inline(always)]
pub fn now() -> u64 {
    let last = &raw mut LAST;
    // SAFETY: helper without arguments; inlined into a load of `jiffies_64`.
    let jiffies = unsafe { bpf_jiffies64() };
    // SAFETY: a global of plain integers. Volatile: read and written in this order (the time
    // before its tick), never cached or folded by the compiler.
    unsafe {
        if core::ptr::read_volatile(&raw const (*last).jiffies) == jiffies {
            return core::ptr::read_volatile(&raw const (*last).ns);
        }
        let ns = bpf_ktime_get_coarse_ns();
        core::ptr::write_volatile(&raw mut (*last).ns, ns);
        core::ptr::write_volatile(&raw mut (*last).jiffies, jiffies);
        ns
    }
}
