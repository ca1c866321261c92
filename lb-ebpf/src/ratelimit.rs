//! Token buckets, one per CPU and key: the echo replies of VIPs, and the per-source SYN limit.
#![cfg_attr(not(target_arch = "bpf"), allow(dead_code))]

use lb_common::TokenBucket;

/// Takes one token of `bucket`, which earns `rate` a second and holds as many (a burst of one
/// second's worth). False when it is empty.
#[inline(always)]
pub fn take(bucket: &mut TokenBucket, rate: u32, now: u64) -> bool {
    let rate = u64::from(rate);
    // At most two seconds count (a full bucket is one second's worth): with the rate at most a
    // million (the config's bound), the product fits 64 bits, and no 128-bit multiply (which BPF
    // has not) is needed.
    let elapsed = now.saturating_sub(bucket.at).min(2_000_000_000);
    let earned = elapsed * rate / 1_000_000_000;
    if earned > 0 {
        bucket.tokens = bucket.tokens.saturating_add(earned).min(rate);
        bucket.at = now;
    }
    if bucket.tokens == 0 {
        return false;
    }
    bucket.tokens -= 1;
    true
}
