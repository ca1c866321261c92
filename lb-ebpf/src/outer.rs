//! The outer headers of direct server return, written in place (see lb-common's `encap` for
//! their fields): IPv4's and IPv6's, and GUE's UDP checksum over IPv6. Plain functions of the
//! packet and the values to write; encap.rs decides what to write and where.
#![cfg_attr(not(target_arch = "bpf"), allow(dead_code))]

use lb_common::{Addr6, ENCAP_TTL, PROTO_TCP, PROTO_UDP, encap_flow_label};
use network_types::{ip::Ipv4Hdr, ip::Ipv6Hdr};

use crate::{
    csum::fold,
    parse::PROTO_ICMPV6,
    ptr::{ptr_at_mut_checked, store_addr6},
};

/// IPv4's "don't fragment" flag, in the `frags` field's first byte.
const IP_DF: u8 = 0x40;

/// A 16-bit word of two bytes as the checksum sums read them (see [`crate::csum`]).
#[inline(always)]
fn word(a: u8, b: u8) -> u32 {
    u32::from(u16::from_ne_bytes([a, b]))
}

/// The outer IPv4 header at `ip_off` for the IPv4 packet at `inner_off`: `src → dst`,
/// protocol `proto`, TOS copied, DF set, TTL [`ENCAP_TTL`]. Returns the inner packet's length.
#[inline(always)]
pub fn outer_v4(
    data: usize,
    data_end: usize,
    (ip_off, inner_off): (usize, usize),
    (src, dst, addr_sum): (&u32, &u32, u32),
    proto: u8,
) -> Option<u16> {
    let (src, dst) = (*src, *dst);
    let inner = ptr_at_mut_checked::<Ipv4Hdr>(data, data_end, inner_off)?;
    // SAFETY: bounds-checked byte arrays.
    let (tos, inner_len) = unsafe { ((*inner).tos, u16::from_be_bytes((*inner).tot_len)) };
    let tot = (inner_len + (inner_off - ip_off) as u16).to_be_bytes();
    let ip = ptr_at_mut_checked::<Ipv4Hdr>(data, data_end, ip_off)?;
    // The header as its ten 16-bit words, written as such (it is 2-aligned, see
    // `ptr::load_addr6`): byte by byte it was most of the encapsulation's instructions.
    let w = [
        word(0x45, tos),
        word(tot[0], tot[1]),
        0,
        word(IP_DF, 0),
        word(ENCAP_TTL, proto),
        0,
        src & 0xffff,
        src >> 16,
        dst & 0xffff,
        dst >> 16,
    ];
    let check = !fold(w[0] + w[1] + w[3] + w[4] + addr_sum);
    // SAFETY: bounds-checked, 20 bytes, 2-aligned.
    unsafe {
        // Spelled out: a loop over the words compiles to one the verifier walks word by word.
        let h = ip as *mut u16;
        *h = w[0] as u16;
        *h.add(1) = w[1] as u16;
        *h.add(2) = 0;
        *h.add(3) = w[3] as u16;
        *h.add(4) = w[4] as u16;
        *h.add(5) = check;
        *h.add(6) = w[6] as u16;
        *h.add(7) = w[7] as u16;
        *h.add(8) = w[8] as u16;
        *h.add(9) = w[9] as u16;
    }
    Some(inner_len)
}

/// The outer IPv6 header at `ip_off` for the IPv6 packet at `inner_off`: `src → dst`, next
/// header `proto`, traffic class copied, flow label from `hash`, hop limit [`ENCAP_TTL`].
/// Returns the inner packet's length.
#[inline(always)]
pub fn outer_v6(
    data: usize,
    data_end: usize,
    ip_off: usize,
    inner_off: usize,
    addrs: (&Addr6, &Addr6),
    proto: u8,
    hash: u64,
) -> Option<u16> {
    let inner = ptr_at_mut_checked::<Ipv6Hdr>(data, data_end, inner_off)?;
    // SAFETY: bounds-checked byte arrays.
    let (vcf, inner_len) = unsafe {
        (
            (*inner).vcf,
            u16::from_be_bytes((*inner).payload_len) + Ipv6Hdr::LEN as u16,
        )
    };
    let label = encap_flow_label(hash);
    let ip = ptr_at_mut_checked::<Ipv6Hdr>(data, data_end, ip_off)?;
    let payload = inner_len + (inner_off - ip_off - Ipv6Hdr::LEN) as u16;
    let payload = payload.to_be_bytes();
    // SAFETY: bounds-checked; 2-aligned (see `store_addr6`), written 16 bits at a time.
    unsafe {
        let h = ip as *mut u16;
        *h = word(
            0x60 | (vcf[0] & 0x0f),
            (vcf[1] & 0xf0) | (label >> 16) as u8,
        ) as u16;
        *h.add(1) = word((label >> 8) as u8, label as u8) as u16;
        *h.add(2) = word(payload[0], payload[1]) as u16;
        *h.add(3) = word(proto, ENCAP_TTL) as u16;
        store_addr6((*ip).src_addr.as_mut_ptr(), addrs.0);
        store_addr6((*ip).dst_addr.as_mut_ptr(), addrs.1);
    }
    Some(inner_len)
}

/// The UDP checksum of GUE over IPv6 (RFC 8200 wants one), without reading the payload: the
/// inner packet's own transport checksum makes its sum known (RFC 7605 §4.2.1's "local
/// checksum offload", as Katran does): the transport segment sums to the negative of its
/// pseudo-header, whose addresses cancel against the inner header's own. What is left are the
/// inner header's first and second words and its next header and hop limit, less the
/// pseudo-header's protocol. `None` (checksum 0, which RFC 6935 allows tunnels) when the inner
/// packet's transport header does not follow its IPv6 header directly (extension headers).
#[inline(always)]
pub fn gue_checksum_v6(
    data: usize,
    data_end: usize,
    inner_off: usize,
    addr_sum: u32,
    sport: u16,
    dport: u16,
    udp_len: u16,
) -> Option<u16> {
    let inner = ptr_at_mut_checked::<Ipv6Hdr>(data, data_end, inner_off)?;
    // SAFETY: bounds-checked; read in place.
    let inner = unsafe { &*inner };
    let nh = inner.next_hdr;
    if nh != PROTO_TCP && nh != PROTO_UDP && nh != PROTO_ICMPV6 {
        return None;
    }
    // The pseudo-header: the addresses (summed with the next hop's lookup), the length and
    // protocol; the UDP header (its checksum 0).
    let mut sum = addr_sum + u32::from(udp_len) + word(0, PROTO_UDP);
    sum += u32::from(sport) + u32::from(dport) + u32::from(udp_len);
    // The inner packet: its header's first two words, next header and hop limit, and its
    // transport segment's sum, the negative of its pseudo-header (whose length is the inner
    // payload length, which the header's own payload length word cancels).
    sum += word(inner.vcf[0], inner.vcf[1]) + word(inner.vcf[2], inner.vcf[3]);
    sum += word(nh, inner.hop_limit) + u32::from(!(word(0, nh) as u16));
    Some(match !fold(sum) {
        0 => 0xffff,
        c => c,
    })
}
