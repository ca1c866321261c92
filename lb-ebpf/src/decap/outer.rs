//! The outer IP header: IP in IP or GUE to this host, whole, or the verdict of a packet that is
//! not one. The order of the checks is the cost order: the protocol first (all that traffic
//! which is not encapsulated pays), then for UDP the port, then the rest.

use core::ops::ControlFlow::{self, Break, Continue};

use lb_common::{
    DecapParams, PROTO_IPIP, PROTO_IPV6_IN_IP, UDP_HDR_LEN, decap_counter::*, decap_flags,
};
use network_types::{
    ip::{Ipv4Hdr, Ipv6Hdr},
    udp::UdpHdr,
};

use super::{Host, Verdict, drop, pass};
use crate::ptr::{load_addr6, ptr_at, read_at};

const PROTO_UDP: u8 = 17;
const EXT_FRAGMENT: u8 = 44;
/// The IPv4 `frags` field's more-fragments flag and fragment offset, and the offset alone.
const IP_MF_OFFSET: u16 = 0x3fff;
const IP_OFFSET: u16 = 0x1fff;
/// The IPv6 fragment header's offset (bits 15-3) and M flag (bit 0), and the offset alone.
const IP6_OFFSET_M: u16 = 0xfff9;
const IP6_OFFSET: u16 = 0xfff8;
/// Longest IPv4 header, in 16-bit words.
const MAX_IHL_WORDS: usize = 30;

/// An encapsulated packet to this host, whole: where its parts are.
pub struct Found {
    /// Where the inner packet starts: past the outer IP header (and GUE's UDP header).
    pub inner: usize,
    /// Where what encloses the inner packet ends: the outer datagram (IP in IP) or the UDP
    /// datagram (GUE). Ethernet padding may follow.
    pub end: usize,
    /// The inner IP version the encapsulation announces: 4 or 6.
    pub version: u8,
    /// The outer header's ECN bits.
    pub ecn: u8,
    /// The verdict counter of its decapsulation.
    pub counter: u32,
}

/// What an outer datagram carries, by its transport protocol (before its destination is
/// checked).
struct Carried {
    inner: usize,
    version: u8,
    counter: u32,
    /// GUE: the UDP length; IP in IP: 0.
    udp_len: usize,
}

/// Whether IP protocol `proto` may carry an encapsulated packet: the one compare that other
/// traffic pays.
#[inline(always)]
fn candidate(proto: u8) -> bool {
    proto == PROTO_IPIP || proto == PROTO_IPV6_IN_IP || proto == PROTO_UDP
}

/// An outer IPv4 header at `l3`.
#[inline(always)]
pub fn ipv4<H: Host>(
    data: usize,
    data_end: usize,
    l3: usize,
    host: &H,
) -> ControlFlow<Verdict, Found> {
    let Some(ip) = ptr_at::<Ipv4Hdr>(data, data_end, l3) else {
        return Break(pass(PASS_MALFORMED));
    };
    // SAFETY: bounds-checked; read in place, field by field.
    let ip = unsafe { &*ip };
    if !candidate(ip.proto) {
        return Break(pass(PASS_NOT_ENCAP));
    }
    let ihl = ((ip.vihl & 0x0f) as usize) * 4;
    let tot_len = u16::from_be_bytes(ip.tot_len) as usize;
    // Ethernet padding may follow the datagram; a datagram longer than the frame was cut.
    if ip.vihl >> 4 != 4 || ihl < Ipv4Hdr::LEN || tot_len < ihl || l3 + tot_len > data_end - data {
        return Break(pass(PASS_MALFORMED));
    }
    let frags = u16::from_be_bytes(ip.frags);
    let params = host.params();
    let end = l3 + tot_len;
    let first = frags & IP_OFFSET == 0;
    let carried = carried(data, data_end, ip.proto, l3 + ihl, end, first, &params)?;
    if !local(&params, || host.is_local4(u32::from_ne_bytes(ip.dst_addr))) {
        return Break(pass(PASS_NOT_LOCAL));
    }
    if frags & IP_MF_OFFSET != 0 {
        return Break(pass(PASS_FRAGMENT));
    }
    // What ip_rcv checks before the stack takes a datagram in; past this point nobody would.
    if !header_checksum_ok(data, data_end, l3, ihl) {
        return Break(drop(DROP_MALFORMED));
    }
    found(carried, l3 + ihl, end, ip.tos & 3)
}

/// An outer IPv6 header at `l3`. A fragment header right after it is read (its fragments are
/// counted, an atomic fragment is decapsulated); other extension headers are not looked into.
#[inline(always)]
pub fn ipv6<H: Host>(
    data: usize,
    data_end: usize,
    l3: usize,
    host: &H,
) -> ControlFlow<Verdict, Found> {
    let Some(ip) = ptr_at::<Ipv6Hdr>(data, data_end, l3) else {
        return Break(pass(PASS_MALFORMED));
    };
    // SAFETY: bounds-checked; read in place, field by field.
    let ip = unsafe { &*ip };
    let mut proto = ip.next_hdr;
    let mut l4 = l3 + Ipv6Hdr::LEN;
    let mut frag = 0;
    if proto == EXT_FRAGMENT {
        // Next header, reserved, offset and flags, identification.
        let Some(fh) = read_at::<[u8; 4]>(data, data_end, l4) else {
            return Break(pass(PASS_MALFORMED));
        };
        proto = fh[0];
        frag = u16::from_be_bytes([fh[2], fh[3]]);
        l4 += 8;
    }
    if !candidate(proto) {
        return Break(pass(PASS_NOT_ENCAP));
    }
    let payload = u16::from_be_bytes(ip.payload_len) as usize;
    let end = l3 + Ipv6Hdr::LEN + payload;
    // A payload of 0 is a jumbogram's, which has no place on these links.
    if ip.vcf[0] >> 4 != 6 || payload == 0 || end > data_end - data || l4 > end {
        return Break(pass(PASS_MALFORMED));
    }
    let params = host.params();
    let first = frag & IP6_OFFSET == 0;
    let carried = carried(data, data_end, proto, l4, end, first, &params)?;
    let local = local(&params, || {
        // SAFETY: the header is in bounds; its addresses are 2-aligned (see `load_addr6`).
        host.is_local6(&unsafe { load_addr6(ip.dst_addr.as_ptr()) })
    });
    if !local {
        return Break(pass(PASS_NOT_LOCAL));
    }
    if frag & IP6_OFFSET_M != 0 {
        return Break(pass(PASS_FRAGMENT));
    }
    found(carried, l4, end, (ip.vcf[1] >> 4) & 3)
}

/// What protocol `proto` at `l4` carries, up to `end`: IP in IP, or UDP to the GUE port whose
/// payload begins like an IPv4 or IPv6 header (GUE variant 1). `first`: the datagram is whole or
/// a first fragment (later fragments have no UDP header).
#[inline(always)]
fn carried(
    data: usize,
    data_end: usize,
    proto: u8,
    l4: usize,
    end: usize,
    first: bool,
    params: &DecapParams,
) -> ControlFlow<Verdict, Carried> {
    let ipip = |version, counter| {
        Continue(Carried {
            inner: l4,
            version,
            counter,
            udp_len: 0,
        })
    };
    if proto == PROTO_IPIP {
        return ipip(4, DECAP_IPIP);
    }
    if proto == PROTO_IPV6_IN_IP {
        return ipip(6, DECAP_IPV6_IN_IP);
    }
    if !first {
        return Break(pass(PASS_NOT_ENCAP));
    }
    let inner = l4 + UDP_HDR_LEN as usize;
    let Some(udp) = ptr_at::<UdpHdr>(data, data_end, l4).filter(|_| inner <= end) else {
        return Break(pass(PASS_MALFORMED));
    };
    // SAFETY: bounds-checked.
    let udp = unsafe { &*udp };
    if params.gue_port == 0 || u16::from_ne_bytes(udp.dst) != params.gue_port {
        return Break(pass(PASS_NOT_ENCAP));
    }
    // The first nibble of GUE's payload: 0100 and 0110 are variant 1 (an IPv4 or IPv6 header);
    // anything else (variant 0's header, nothing) is not ours to open. Read with the UDP header:
    // the verifier learns nothing from the bounds check of a lone byte at a variable offset
    // (LLVM turns `p + 1 > end` into `p >= end`).
    let version = match read_at::<[u8; 9]>(data, data_end, l4) {
        Some(b) if inner < end => b[8] >> 4,
        _ => 0,
    };
    if version != 4 && version != 6 {
        return Break(pass(PASS_GUE_NOT_IP));
    }
    Continue(Carried {
        inner,
        version,
        counter: DECAP_GUE,
        udp_len: u16::from_be_bytes(udp.len) as usize,
    })
}

/// Whether the outer destination is one of ours: any is, when strict destination is off.
#[inline(always)]
fn local(params: &DecapParams, lookup: impl FnOnce() -> bool) -> bool {
    params.flags & decap_flags::ANY_DESTINATION != 0 || lookup()
}

/// The encapsulated packet `c` of a whole outer datagram whose transport header is at `l4` and
/// which ends at `end`; GUE's UDP length must fit in it.
#[inline(always)]
fn found(c: Carried, l4: usize, end: usize, ecn: u8) -> ControlFlow<Verdict, Found> {
    let end = if c.udp_len == 0 {
        end
    } else if c.udp_len < UDP_HDR_LEN as usize || l4 + c.udp_len > end {
        return Break(drop(DROP_MALFORMED));
    } else {
        l4 + c.udp_len
    };
    Continue(Found {
        inner: c.inner,
        end,
        version: c.version,
        ecn,
        counter: c.counter,
    })
}

/// Whether the IPv4 header of `ihl` bytes at `l3` sums to all ones (RFC 1071).
#[inline(always)]
fn header_checksum_ok(data: usize, data_end: usize, l3: usize, ihl: usize) -> bool {
    let mut sum = 0u32;
    for i in 0..MAX_IHL_WORDS {
        if 2 * i >= ihl {
            break;
        }
        let Some(word) = read_at::<[u8; 2]>(data, data_end, l3 + 2 * i) else {
            return false;
        };
        sum += u32::from(u16::from_ne_bytes(word));
    }
    sum = (sum & 0xffff) + (sum >> 16);
    sum = (sum & 0xffff) + (sum >> 16);
    sum == 0xffff
}
