//! Incremental Internet checksum updates (RFC 1624, eqn. 3: HC' = ~(~HC + ~m + m')).
//! Values are the raw header fields as read (any byte order, used consistently): the
//! one's-complement sum is byte-order independent.

#[inline(always)]
fn fold(mut sum: u32) -> u16 {
    sum = (sum & 0xffff) + (sum >> 16);
    sum = (sum & 0xffff) + (sum >> 16);
    sum as u16
}

/// `check` after one 16-bit field changed from `old` to `new`.
#[inline(always)]
pub fn replace16(check: u16, old: u16, new: u16) -> u16 {
    !fold(u32::from(!check) + u32::from(!old) + u32::from(new))
}

/// `check` after one 32-bit field changed from `old` to `new`.
#[inline(always)]
pub fn replace32(check: u16, old: u32, new: u32) -> u16 {
    let old = !old;
    !fold(u32::from(!check) + (old >> 16) + (old & 0xffff) + (new >> 16) + (new & 0xffff))
}
