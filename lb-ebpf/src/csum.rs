//! Incremental Internet checksum updates (RFC 1624, eqn. 3: HC' = ~(~HC + ~m + m')).
//! Values are the raw header fields as read (any byte order, used consistently): the
//! one's-complement sum is byte-order independent.
//!
//! A change is first summed with [`diff16`]/[`diff32`] (unfolded, so several changes add up and
//! the IPv4 and TCP/UDP checksums share the address change), then applied once with [`update`].

/// `sum` folded to 16 bits (end-around carries).
#[inline(always)]
pub fn fold(mut sum: u32) -> u16 {
    sum = (sum & 0xffff) + (sum >> 16);
    sum = (sum & 0xffff) + (sum >> 16);
    sum as u16
}

/// The change of one 16-bit field from `old` to `new` (~m + m').
#[inline(always)]
pub fn diff16(old: u16, new: u16) -> u32 {
    u32::from(!old) + u32::from(new)
}

/// The change of one 32-bit field from `old` to `new`, as two 16-bit fields.
#[inline(always)]
pub fn diff32(old: u32, new: u32) -> u32 {
    let old = !old;
    (old >> 16) + (old & 0xffff) + (new >> 16) + (new & 0xffff)
}

/// `check` after the changes summed in `diff`.
#[inline(always)]
pub fn update(check: u16, diff: u32) -> u16 {
    !fold(u32::from(!check) + diff)
}

/// The change of `N` 32-bit words from `old` to `new`, summed by the kernel (bpf_csum_diff)
/// and folded to 16 bits: for IPv6 address pairs, whose sum spelled out word by word keeps more
/// values live than the registers hold (their spills went beyond the stack BPF allows).
#[inline(always)]
pub fn diff_words<const N: usize>(old: &[u32; N], new: &[u32; N]) -> u32 {
    let size = (N * 4) as u32;
    // SAFETY: the helper only reads `size` bytes of each array.
    let sum = unsafe {
        aya_ebpf::helpers::bpf_csum_diff(
            old.as_ptr() as *mut u32,
            size,
            new.as_ptr() as *mut u32,
            size,
            0,
        )
    };
    u32::from(fold(sum as u32))
}
