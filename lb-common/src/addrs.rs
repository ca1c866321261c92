//! The address tables: lb's addresses (VIPs and SNAT addresses), the first lookup of every IP
//! packet, one table per family.

use crate::{Addr6, FlowAddr};

/// Upper bound of distinct addresses (VIPs and SNAT addresses); userspace refuses more.
pub const MAX_ADDRS: u32 = 4096;
/// Sets of the address table ([`map_name::ADDRS`](crate::map_name::ADDRS)), a power of two: as
/// many as [`MAX_ADDRS`], so that a set of [`ADDR_WAYS`] slots overflows (more addresses hash to
/// it than it has slots) with p < 1e-2 even for 4096 addresses, and p < 1e-14 for 100.
pub const ADDR_SETS: u32 = 1 << ADDR_SET_BITS;
pub const ADDR_SET_BITS: u32 = 12;
/// Slots per set of the address table.
pub const ADDR_WAYS: usize = 8;

/// Flag bits of [`map_name::ADDRS`](crate::map_name::ADDRS) values.
pub mod addr_flags {
    /// Destination of at least one service.
    pub const VIP: u32 = 1;
    /// Source address lb gives forwarded flows; replies come back to it.
    pub const SNAT: u32 = 2;
    /// A VIP that answers ICMP echo requests (`answer_ping`).
    pub const PING: u32 = 4;
    /// A VIP with a QUIC service (`quic`): its UDP packets are read for the server ID in their
    /// connection ID (see [`crate::QuicServerKey`]); other VIPs' never are.
    pub const QUIC: u32 = 8;
}

/// One set of the address table: up to [`ADDR_WAYS`] addresses (network byte order) and their
/// [`addr_flags`]; a free slot is address 0 with flags 0 (0.0.0.0 and :: are never lb's).
///
/// Why not a hash map: its lookup is a helper call the verifier cannot inline, and it was the
/// largest cost left per packet. An array lookup is inlined; scanning the 8 addresses of one
/// 64-byte value costs a few instructions, hit or miss. An address stays in its slot while it
/// is configured, so userspace never moves one that packets are using.
///
/// One table per family ([`AddrSet`], [`AddrSet6`]), the same shape.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AddrSetOf<A> {
    pub addrs: [A; ADDR_WAYS],
    pub flags: [u32; ADDR_WAYS],
}

pub type AddrSet = AddrSetOf<u32>;
pub type AddrSet6 = AddrSetOf<Addr6>;

/// The set of the address table that may hold `addr` (network byte order): the top bits of a
/// multiplicative (Fibonacci) hash, one multiply, which every address bit reaches (an IPv6
/// address is folded to 64 bits first, see [`FlowAddr::table_hash`]).
#[inline(always)]
pub fn addr_set<A: FlowAddr>(addr: A) -> u32 {
    (addr.table_hash().wrapping_mul(0x9e37_79b9_7f4a_7c15) >> (64 - ADDR_SET_BITS)) as u32
}

// The layouts both sides rely on, checked wherever this crate builds (the BPF object too).
const _: () = {
    use core::mem::size_of;
    assert!(size_of::<AddrSet>() == 64);
    assert!(size_of::<AddrSet6>() == 160);
};

#[cfg(feature = "user")]
mod pod {
    // SAFETY: #[repr(C)] integers and byte arrays with explicit padding (the crate's layout
    // rules), valid for any bit pattern.
    unsafe impl aya::Pod for super::AddrSet {}
    unsafe impl aya::Pod for super::AddrSet6 {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addr_sets_are_in_range_and_spread_a_subnet() {
        let mut hits = [0u32; ADDR_SETS as usize];
        for i in 0..4096u32 {
            let a = u32::from_ne_bytes([10, 100, (i >> 8) as u8, i as u8]);
            hits[addr_set(a) as usize] += 1;
        }
        assert!(
            hits.iter().all(|&n| n as usize <= ADDR_WAYS),
            "{:?}",
            hits.iter().max()
        );
        assert_eq!(addr_set(u32::MAX) >> ADDR_SET_BITS, 0);
    }
}
