//! The backend's decapsulator (`lb decap`, the `lb-decap` object): its maps, parameters and
//! counters. It shares the formats of [`crate::encap`] with the balancer and nothing of the
//! balancer's state: its object holds only the maps below.

/// Names of the decapsulator's maps, as userspace looks them up and pins them.
pub mod decap_map_name {
    /// `Array<DecapParams>` of one entry: the GUE port and the flags, written by every
    /// `lb decap`, read by the program per packet (so a new value applies without reattaching).
    pub const PARAMS: &str = "LB_DECAP_PARAMS";
    /// `HashMap<u32, u32>`: the IPv4 addresses (network byte order) outer headers may be sent
    /// to (strict destination); the value is 1.
    pub const ADDRS: &str = "LB_DECAP_ADDRS";
    /// `HashMap<Addr6, u32>`: the same for IPv6 ([`crate::Addr6`], as the packet holds it).
    pub const ADDRS6: &str = "LB_DECAP_ADDRS6";
    /// `PerCpuArray<u64>` indexed by [`crate::decap_counter`].
    pub const STATS: &str = "LB_DECAP_STATS";
}

/// Every map of the decapsulator's object; all are pinned.
pub const DECAP_MAPS: [&str; 4] = [
    decap_map_name::PARAMS,
    decap_map_name::ADDRS,
    decap_map_name::ADDRS6,
    decap_map_name::STATS,
];

/// Name of the XDP program in the `lb-decap` object.
pub const DECAP_PROGRAM_NAME: &str = "lb_decap";

/// Entries of each address map: addresses of one family the outer destination may be.
pub const DECAP_MAX_ADDRS: u32 = 4096;

/// The decapsulator's parameters, the one entry of [`decap_map_name::PARAMS`]. All zero (the
/// map before userspace writes it) is strict destination with no address and GUE off: nothing
/// is decapsulated.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DecapParams {
    /// GUE's UDP destination port, network byte order; 0: GUE off.
    pub gue_port: u16,
    /// [`decap_flags`] bits.
    pub flags: u16,
    pub _pad: u32,
}

/// Flag bits of [`DecapParams::flags`].
pub mod decap_flags {
    /// Decapsulate whatever the outer destination is (`--any-destination`); without it only
    /// packets to an address of the maps are (strict destination).
    pub const ANY_DESTINATION: u16 = 1;
}

/// Indices into [`decap_map_name::STATS`]. Every packet the decapsulator sees increments
/// exactly one verdict counter (those below [`decap_counter::VERDICTS`]); the informational
/// counters after it are extra.
pub mod decap_counter {
    crate::counters::counters! {
        verdicts {
            /// IPv4 in IP (protocol 4, in an outer IPv4 or IPv6 header) to this host: the outer
            /// header stripped, the inner packet passed to the stack.
            DECAP_IPIP = "decap_ipip",
            /// IPv6 in IP (protocol 41, in an outer IPv6 or IPv4 header) to this host:
            /// stripped and passed.
            DECAP_IPV6_IN_IP = "decap_ipv6_in_ip",
            /// GUE variant 1 (UDP to the GUE port, an IPv4 or IPv6 packet right after the UDP
            /// header) to this host: outer IP and UDP headers stripped, passed.
            DECAP_GUE = "decap_gue",
            /// Not encapsulated: neither IP in IP nor UDP to the GUE port (ARP, TCP, other UDP,
            /// ICMP, IPv6 whose first next header is an extension header other than a
            /// fragment header, a later fragment of UDP, whose port is not in it). Passed
            /// untouched, after one parse and a compare.
            PASS_NOT_ENCAP = "pass_not_encap",
            /// UDP to the GUE port whose payload is not an IPv4 or IPv6 packet (GUE variant 0
            /// with its header, a control message, empty). Passed untouched.
            PASS_GUE_NOT_IP = "pass_gue_not_ip",
            /// Encapsulated, but the outer destination is not one of this host's addresses
            /// (strict destination): not ours to open. Passed untouched.
            PASS_NOT_LOCAL = "pass_not_local",
            /// An outer fragment to this host (IP in IP, or the first fragment of UDP to the
            /// GUE port): the decapsulator does not reassemble. Passed untouched: the kernel
            /// reassembles it and, without a tunnel device, discards it.
            PASS_FRAGMENT = "pass_fragment",
            /// IP in IP or UDP whose outer headers cannot be read as far as the decision
            /// needs (a frame shorter than its link or IP header, a wrong version or IHL, an
            /// IP length beyond the frame). Passed untouched: the kernel drops it itself.
            PASS_MALFORMED = "pass_malformed",
            /// Encapsulated, to this host, whole, and broken: the inner header truncated or of
            /// another version than the encapsulation says, the inner length beyond the outer
            /// payload, a GUE UDP length beyond the outer datagram, or a wrong outer IPv4 header
            /// checksum. Dropped.
            DROP_MALFORMED = "drop_malformed",
            /// Outer header marked CE (congestion experienced) around a packet that is not
            /// ECN-capable: RFC 6040 §4.2 says drop, as Linux's tunnels do. Dropped.
            DROP_ECN = "drop_ecn",
        }
        informational {
            /// Decapsulated packets whose outer CE mark was copied into their ECN-capable inner
            /// header (RFC 6040 §4.2).
            ECN_CE = "ecn_ce",
            /// Decapsulated frames with one 802.1Q tag (kept on the inner packet).
            VLAN = "vlan",
        }
    }
}

// The layouts both sides rely on, checked wherever this crate builds (the BPF object too).
const _: () = {
    use core::mem::size_of;
    assert!(size_of::<DecapParams>() == 8);
};

#[cfg(feature = "user")]
mod pod {
    // SAFETY: #[repr(C)] integers with explicit padding (the crate's layout rules), valid for
    // any bit pattern.
    unsafe impl aya::Pod for super::DecapParams {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counter_names_are_unique_and_verdicts_first() {
        let names = decap_counter::NAMES;
        for (i, a) in names.iter().enumerate() {
            assert!(!names[i + 1..].contains(a), "{a}");
        }
        assert_eq!(decap_counter::VERDICTS, 10);
        assert_eq!(decap_counter::COUNT as usize, names.len());
        assert_eq!(names[decap_counter::ECN_CE as usize], "ecn_ce");
    }

    #[test]
    fn every_map_has_a_short_enough_name() {
        // BPF object names are 15 bytes at most; a longer one would be cut by the kernel.
        for name in DECAP_MAPS {
            assert!(name.len() <= 15, "{name}");
        }
    }
}
