//! Token buckets, one per CPU and key: the echo replies of VIPs, and the per-source SYN limit.
#![cfg_attr(not(target_arch = "bpf"), allow(dead_code))]

use lb_common::TokenBucket;

/// Takes one token of `bucket`, which holds `cap` (a burst of one second's worth) and earns
/// `scaled` tokens per 2^32 ns (see `Params::per_2_32_ns`). False when it is empty. A multiply
/// and a shift: no division on the packet path.
#[inline(always)]
pub fn take(bucket: &mut TokenBucket, cap: u32, scaled: u32, now: u64) -> bool {
    // At most two seconds count (a full bucket is one second's worth): the product then fits 64
    // bits (2e9 × 4.3e6 for the highest rate), no 128-bit multiply, which BPF has not.
    let elapsed = now.saturating_sub(bucket.at).min(2_000_000_000);
    let earned = (elapsed * u64::from(scaled)) >> 32;
    if earned > 0 {
        bucket.tokens = bucket.tokens.saturating_add(earned).min(u64::from(cap));
        bucket.at = now;
    }
    if bucket.tokens == 0 {
        return false;
    }
    bucket.tokens -= 1;
    true
}
