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

/// A flow's addressing in one direction.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct FlowKey {
    pub src: u32,
    pub dst: u32,
    pub sport: u16,
    pub dport: u16,
    pub proto: u8,
    pub _pad: [u8; 3],
}

impl FlowKey {
    /// The key of a flow from `src:sport` to `dst:dport`, all in network byte order as in the
    /// packet; the padding zeroed, so equal flows have equal keys (the tables compare all bytes).
    #[inline(always)]
    pub const fn new(src: u32, dst: u32, sport: u16, dport: u16, proto: u8) -> Self {
        Self {
            src,
            dst,
            sport,
            dport,
            proto,
            _pad: [0; 3],
        }
    }

    /// The key's [`flow_hash`]: its ring slot, its table set ([`ways`](crate::ways)) and its
    /// first SNAT port candidate. (The derived [`Hash`] is another thing, for std maps; as a
    /// method it is called `Hash::hash(&key, state)`, since this one takes the name.)
    #[inline(always)]
    pub const fn hash(&self) -> u64 {
        flow_hash(self.src, self.dst, self.sport, self.dport, self.proto)
    }
}

// The layouts both sides rely on, checked wherever this crate builds (the BPF object too).
const _: () = {
    use core::mem::size_of;
    assert!(size_of::<FlowKey>() == 16);
};

#[cfg(feature = "user")]
mod pod {
    // SAFETY: #[repr(C)] integers and byte arrays with explicit padding (the crate's layout
    // rules), valid for any bit pattern.
    unsafe impl aya::Pod for super::FlowKey {}
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
}
