//! Incremental Internet checksum updates (RFC 1624, eqn. 3: HC' = ~(~HC + ~m + m')).
//! Values are the raw header fields as read (any byte order, used consistently): the
//! one's-complement sum is byte-order independent.
//!
//! A change is first summed with [`diff16`]/[`diff32`] (unfolded, so several changes add up and
//! the IPv4 and TCP/UDP checksums share the address change), then applied once with [`update`].

#[inline(always)]
fn fold(mut sum: u32) -> u16 {
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
