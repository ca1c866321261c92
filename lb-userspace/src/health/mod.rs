//! Health checks. Active: `window` is the pure per-target state machine (counters, thresholds,
//! states and failure windows of SPEC §2): it does no I/O and reads no clock, so the probe
//! scheduler that drives it, and the probes themselves, can change without touching it.
//! Passive: `passive` is the pure ejection rule for failures seen in real traffic (SPEC §3).

pub mod checker;
pub mod outcome;
pub mod passive;
pub mod probe;
mod probers;
pub mod schedule;
pub mod target;
mod wheel;
pub mod window;

/// A 64-bit key of a probe target for spreading hashes (phases, places in a port pool): for an
/// IPv4 target its address and port side by side, as it always was; for an IPv6 one the
/// address's two halves folded together, then the port.
pub(crate) fn address_key(target: std::net::SocketAddr) -> u64 {
    let port = u64::from(target.port());
    match target.ip() {
        std::net::IpAddr::V4(ip) => u64::from(u32::from(ip)) << 16 | port,
        std::net::IpAddr::V6(ip) => {
            let bits = u128::from(ip);
            (lb_common::fmix64((bits >> 64) as u64) ^ bits as u64).rotate_left(16) ^ port
        }
    }
}

/// Asks the CPU to load the first `lines` cache lines of `item` ahead of its use: a batch's
/// targets lie scattered in memory, and asking for all of them first lets their cache misses
/// overlap. A hint that changes nothing else (a no-op off x86-64).
#[inline(always)]
pub(crate) fn prefetch<T>(item: &T, lines: usize) {
    let at = (item as *const T).cast::<i8>();
    for line in 0..lines {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: a prefetch never faults (not even past the end of an allocation) and has no
        // effect the program can observe.
        unsafe {
            use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
            _mm_prefetch::<_MM_HINT_T0>(at.wrapping_add(64 * line));
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = at.wrapping_add(64 * line);
    }
}
