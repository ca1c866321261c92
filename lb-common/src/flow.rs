//! A flow's identity: the key of both flow tables and the hash that places a flow on a ring slot,
//! a table set and its first SNAT port candidate.

pub const PROTO_ICMP: u8 = 1;
pub const PROTO_TCP: u8 = 6;
pub const PROTO_UDP: u8 = 17;

/// murmur3's 64-bit finalizer: cheap and well mixed.
#[inline(always)]
pub const fn fmix64(mut k: u64) -> u64 {
    k ^= k >> 33;
    k = k.wrapping_mul(0xff51_afd7_ed55_8ccd);
    k ^= k >> 33;
    k = k.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    k ^ (k >> 33)
}

/// The hash that places a flow on a ring slot and picks its first SNAT port candidate. Fixed (no
/// seed) so that two balancers with the same config pick the same backend for a flow: changing it
/// is a compatibility break. Arguments in network byte order, as in the packet.
#[inline(always)]
pub const fn flow_hash(saddr: u32, daddr: u32, sport: u16, dport: u16, proto: u8) -> u64 {
    let addrs = ((saddr as u64) << 32) | daddr as u64;
    let ports = ((sport as u64) << 24) | ((dport as u64) << 8) | proto as u64;
    fmix64(addrs ^ fmix64(ports))
}

/// An IPv6 address as the maps hold it: four 32-bit words, each in network byte order (the
/// packet's bytes, read 4 at a time), 4-aligned so a comparison is four word loads.
pub type Addr6 = [u32; 4];

/// The words of an IPv6 address given as its 16 octets.
#[inline(always)]
pub const fn addr6(octets: [u8; 16]) -> Addr6 {
    let o = octets;
    [
        u32::from_ne_bytes([o[0], o[1], o[2], o[3]]),
        u32::from_ne_bytes([o[4], o[5], o[6], o[7]]),
        u32::from_ne_bytes([o[8], o[9], o[10], o[11]]),
        u32::from_ne_bytes([o[12], o[13], o[14], o[15]]),
    ]
}

/// The octets of an IPv6 address held as [`Addr6`].
pub const fn addr6_octets(a: Addr6) -> [u8; 16] {
    let w = [
        a[0].to_ne_bytes(),
        a[1].to_ne_bytes(),
        a[2].to_ne_bytes(),
        a[3].to_ne_bytes(),
    ];
    [
        w[0][0], w[0][1], w[0][2], w[0][3], w[1][0], w[1][1], w[1][2], w[1][3], w[2][0], w[2][1],
        w[2][2], w[2][3], w[3][0], w[3][1], w[3][2], w[3][3],
    ]
}

/// An address of one family as the maps hold it: `u32` (IPv4) or [`Addr6`] (IPv6). Everything
/// keyed by addresses (flow keys, table slots, services, backends, the address table) is generic
/// over it, so each family has its own maps and the IPv4 entries keep their size.
pub trait FlowAddr: Copy + PartialEq + Eq + Default + core::fmt::Debug + 'static {
    /// The hash of a flow `src:sport → dst:dport` (see [`flow_hash`]).
    fn flow_hash(src: Self, dst: Self, sport: u16, dport: u16, proto: u8) -> u64;
    /// The address as a 64-bit value for the address table's and the SYN limit's hashes: all of
    /// an IPv4 address; an IPv6 address's first 64 bits (its /64, which one host commonly holds
    /// entirely: the per-source SYN limit then counts a host's whole prefix as one source).
    fn prefix64(self) -> u64;
    /// The address table's hash (see [`addr_set`]).
    fn table_hash(self) -> u64;
    /// As IPv6 words: an IPv4 address IPv4-mapped (the trace's records hold either family so).
    fn to_addr6(self) -> Addr6;
    /// The address of [`FlowAddr::to_addr6`]'s words (IPv4: the mapped address's last word).
    fn from_addr6(a: Addr6) -> Self;
}

impl FlowAddr for u32 {
    #[inline(always)]
    fn flow_hash(src: u32, dst: u32, sport: u16, dport: u16, proto: u8) -> u64 {
        flow_hash(src, dst, sport, dport, proto)
    }
    #[inline(always)]
    fn prefix64(self) -> u64 {
        self as u64
    }
    #[inline(always)]
    fn table_hash(self) -> u64 {
        self as u64
    }
    #[inline(always)]
    fn to_addr6(self) -> Addr6 {
        crate::mapped(self)
    }
    #[inline(always)]
    fn from_addr6(a: Addr6) -> u32 {
        a[3]
    }
}

/// Two words as one 64-bit value.
#[inline(always)]
const fn pair(a: u32, b: u32) -> u64 {
    ((a as u64) << 32) | b as u64
}

impl FlowAddr for Addr6 {
    /// Each 64-bit half of each address goes through the finalizer in turn: every address bit
    /// reaches every hash bit.
    #[inline(always)]
    fn flow_hash(src: Addr6, dst: Addr6, sport: u16, dport: u16, proto: u8) -> u64 {
        let ports = ((sport as u64) << 24) | ((dport as u64) << 8) | proto as u64;
        let mut h = fmix64(ports);
        h = fmix64(h ^ pair(src[0], src[1]));
        h = fmix64(h ^ pair(src[2], src[3]));
        h = fmix64(h ^ pair(dst[0], dst[1]));
        fmix64(h ^ pair(dst[2], dst[3]))
    }
    #[inline(always)]
    fn prefix64(self) -> u64 {
        pair(self[0], self[1])
    }
    /// Both halves folded into one, then one finalizer: the address table's lookup is on
    /// every IPv6 packet's path, and its sets need spread, not strength.
    #[inline(always)]
    fn table_hash(self) -> u64 {
        fmix64(pair(self[0], self[1]) ^ pair(self[2], self[3]).rotate_left(29))
    }
    #[inline(always)]
    fn to_addr6(self) -> Addr6 {
        self
    }
    #[inline(always)]
    fn from_addr6(a: Addr6) -> Addr6 {
        a
    }
}

/// A flow's addressing in one direction, for either family ([`FlowKey`], [`FlowKey6`]).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct FlowKeyOf<A> {
    pub src: A,
    pub dst: A,
    pub sport: u16,
    pub dport: u16,
    pub proto: u8,
    pub _pad: [u8; 3],
}

/// An IPv4 flow key.
pub type FlowKey = FlowKeyOf<u32>;
/// An IPv6 flow key.
pub type FlowKey6 = FlowKeyOf<Addr6>;

impl<A: FlowAddr> FlowKeyOf<A> {
    /// The key of a flow from `src:sport` to `dst:dport`, all in network byte order as in the
    /// packet; the padding zeroed, so equal flows have equal keys (the tables compare all bytes).
    #[inline(always)]
    pub const fn new(src: A, dst: A, sport: u16, dport: u16, proto: u8) -> Self {
        Self {
            src,
            dst,
            sport,
            dport,
            proto,
            _pad: [0; 3],
        }
    }

    /// The key's flow hash: its ring slot, its table set ([`ways`](crate::ways)) and its
    /// first SNAT port candidate. (The derived [`Hash`] is another thing, for std maps; as a
    /// method it is called `Hash::hash(&key, state)`, since this one takes the name.)
    #[inline(always)]
    pub fn hash(&self) -> u64 {
        A::flow_hash(self.src, self.dst, self.sport, self.dport, self.proto)
    }
}

// The layouts both sides rely on, checked wherever this crate builds (the BPF object too).
const _: () = {
    use core::mem::size_of;
    assert!(size_of::<FlowKey>() == 16);
    assert!(size_of::<FlowKey6>() == 40);
};

#[cfg(feature = "user")]
mod pod {
    // SAFETY: #[repr(C)] integers and byte arrays with explicit padding (the crate's layout
    // rules), valid for any bit pattern.
    unsafe impl aya::Pod for super::FlowKey {}
    unsafe impl aya::Pod for super::FlowKey6 {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_hashes_as_its_fields() {
        let k = FlowKey::new(
            0x0a00_0001,
            0x0a64_0001,
            40000u16.to_be(),
            80u16.to_be(),
            PROTO_TCP,
        );
        assert_eq!(k._pad, [0; 3]);
        assert_eq!(
            k.hash(),
            flow_hash(k.src, k.dst, k.sport, k.dport, PROTO_TCP)
        );
    }

    #[test]
    fn ipv6_addresses_round_trip_and_hash_every_word() {
        let o = [
            0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x10,
        ];
        assert_eq!(addr6_octets(addr6(o)), o);
        let a = addr6(o);
        let k = FlowKey6::new(a, a, 1, 2, PROTO_TCP);
        for w in 0..4 {
            let mut b = a;
            b[w] ^= 0x0100_0000;
            assert_ne!(
                FlowKey6::new(b, a, 1, 2, PROTO_TCP).hash(),
                k.hash(),
                "src word {w}"
            );
            assert_ne!(
                FlowKey6::new(a, b, 1, 2, PROTO_TCP).hash(),
                k.hash(),
                "dst word {w}"
            );
        }
    }
}
