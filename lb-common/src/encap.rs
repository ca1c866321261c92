//! Direct server return: the encapsulations the balancer puts a client's packet in, and the
//! decapsulator (`lb decap`, on the backends) takes it out of. The packet itself travels
//! unchanged inside; only an outer header is added:
//!
//! - `ipip`: an outer IP header of the inner packet's family (IPv4-in-IPv4, protocol 4;
//!   IPv6-in-IPv6, next header 41), what Linux's `ipip` / `ip6tnl` devices take;
//! - `gue`: outer IP + UDP to [`DEFAULT_GUE_PORT`] (configurable), the inner packet right after
//!   the UDP header: GUE variant 1 (draft-ietf-intarea-gue §4: an IPv4 or IPv6 header's first
//!   nibble, 0100 or 0110, reads as version 1, "direct IP encapsulation"), which Linux's
//!   `ip fou add port P gue` and `ip fou add port P ipproto 4|41` both take.
//!
//! The outer header's fields, the same on both sides (lb's datapath writes them, the test kit
//! builds them, the decapsulator reads them):
//! - IPv4: TOS copied from the inner packet (DSCP and ECN, RFC 6040's normal mode), ID 0, DF
//!   set (lb cannot fragment; it sends "fragmentation needed" to the client instead), TTL
//!   [`ENCAP_TTL`], checksum computed; the UDP checksum of GUE over IPv4 is 0 (none).
//! - IPv6: traffic class copied, flow label [`encap_flow_label`] of the flow's hash, hop limit
//!   [`ENCAP_TTL`]; the UDP checksum of GUE over IPv6 is computed (RFC 8200 wants one).
//! - GUE's UDP source port is [`gue_source_port`] of the flow's hash: the backends' NICs hash
//!   it to spread flows over their receive queues, as a flow label lets IPv6 routers do.
//! - The outer source is lb's address towards the backend (the service's `snat_address`, or
//!   the address of lb's egress interface), the outer destination the backend's address.

/// IP protocol number of IPv4 in IP (the outer header of `ipip` for IPv4 services).
pub const PROTO_IPIP: u8 = 4;
/// IP protocol number of IPv6 in IP (the outer header of `ipip` for IPv6 services).
pub const PROTO_IPV6_IN_IP: u8 = 41;
/// Default UDP destination port of `gue` (Katran's, too).
pub const DEFAULT_GUE_PORT: u16 = 6080;
/// TTL / hop limit of outer headers.
pub const ENCAP_TTL: u8 = 64;

pub const IPV4_HDR_LEN: u32 = 20;
pub const IPV6_HDR_LEN: u32 = 40;
pub const UDP_HDR_LEN: u32 = 8;

/// The bytes encapsulation adds to a packet of the family whose IP header is `ip_hdr_len` long
/// ([`IPV4_HDR_LEN`] or [`IPV6_HDR_LEN`]), `gue` or not.
#[inline(always)]
pub const fn encap_overhead(ip_hdr_len: u32, gue: bool) -> u32 {
    if gue {
        ip_hdr_len + UDP_HDR_LEN
    } else {
        ip_hdr_len
    }
}

/// The UDP source port of a GUE packet of the flow with `hash` (host order): in the dynamic
/// range 49152-65535 (RFC 8086 §3.2), from hash bits the ring slot does not use.
#[inline(always)]
pub const fn gue_source_port(hash: u64) -> u16 {
    0xc000 | ((hash >> 40) as u16 & 0x3fff)
}

/// The outer IPv6 flow label of the flow with `hash` (20 bits, host order).
#[inline(always)]
pub const fn encap_flow_label(hash: u64) -> u32 {
    (hash >> 44) as u32 & 0xf_ffff
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gue_source_ports_are_dynamic_and_spread() {
        let mut seen = [false; 16];
        for i in 0..10_000u64 {
            let h = crate::fmix64(i);
            let p = gue_source_port(h);
            assert!(p >= 49152);
            seen[(p & 0xf) as usize] = true;
            assert!(encap_flow_label(h) <= 0xf_ffff);
        }
        assert!(seen.iter().all(|s| *s));
    }
}
