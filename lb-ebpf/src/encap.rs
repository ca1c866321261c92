//! Direct server return: the client's packet, unchanged, inside an outer IP header (`ipip`) or
//! outer IP and UDP headers (`gue`) to its backend, which strips them and answers the client
//! itself. The formats are lb-common's `encap` module's; only the outer header is written
//! here, after `bpf_xdp_adjust_head` made room for it in front of the packet.
#![cfg_attr(not(target_arch = "bpf"), allow(dead_code))]

use aya_ebpf::{bindings::xdp_action, helpers::bpf_xdp_adjust_head, programs::XdpContext};
use lb_common::{
    Addr6, BackendInfoOf, ENCAP_TTL, NextHop, PROTO_TCP, PROTO_UDP, UDP_HDR_LEN, backend_flags,
    counter, encap_flow_label, gue_source_port,
};
use network_types::{ip::Ipv4Hdr, ip::Ipv6Hdr, udp::UdpHdr};

use crate::{
    family::Family,
    flow::{Verdict, send_out},
    maps::params,
    parse::{Icmp, PROTO_ICMPV6},
    ptr::{opaque, ptr_at_mut_checked, store_addr6},
    stats,
};

/// IPv4's "don't fragment" flag, in the `frags` field's first byte.
const IP_DF: u8 = 0x40;

/// The bytes encapsulation adds for a backend of family `F` with `flags`; 0 without DSR.
#[inline(always)]
pub fn overhead<F: Family>(flags: u32) -> u32 {
    if flags & backend_flags::ENCAP == 0 {
        0
    } else {
        lb_common::encap_overhead(F::HDR_LEN, flags & backend_flags::ENCAP_GUE != 0)
    }
}

/// Encapsulates the packet whose IP header is at `l3_off` (after one optional VLAN tag, which
/// stays) to backend `b` (an `ENCAP_*` flag set) through next hop `nh`; `hash` is the flow's
/// hash (GUE's source port, IPv6's flow label). `Err(drop counter)` if it cannot be done.
#[inline(always)]
pub fn push<F: Family>(
    ctx: &XdpContext,
    l3_off: usize,
    b: &BackendInfoOf<F::A>,
    nh: &NextHop,
    hash: u64,
) -> Result<(), u32> {
    let gue = b.flags & backend_flags::ENCAP_GUE != 0;
    let overhead = overhead::<F>(b.flags) as usize;
    // SAFETY: a valid XDP context; every packet pointer is taken again below.
    if unsafe { bpf_xdp_adjust_head(ctx.ctx, -(overhead as i32)) } != 0 {
        return Err(counter::DROP_NO_HEADROOM);
    }
    let (data, data_end) = (ctx.data(), ctx.data_end());
    let malformed = Err(counter::DROP_MALFORMED);
    // The link header moves to the new front: the EtherType (or the VLAN tag and EtherType)
    // copied, the MACs written anew (the outer header is of the inner packet's family).
    let Some(eth) = ptr_at_mut_checked::<[u8; 18]>(data, data_end, 0) else {
        return malformed;
    };
    let Some(old) = ptr_at_mut_checked::<[u8; 18]>(data, data_end, overhead) else {
        return malformed;
    };
    // 16 bits at a time: frames start 2-aligned (see `ptr::load_addr6`), and so do the MACs
    // of a `NextHop`.
    // SAFETY: bounds-checked, apart (the outer header is 20 bytes or more); 18 bytes of the
    // old frame (its link header and the first of its IP header) are read whatever the link
    // header's length.
    unsafe {
        let (eth, old) = (eth as *mut u16, old as *const u16);
        store_mac(eth, &nh.dmac);
        store_mac(eth.add(3), &nh.smac);
        *eth.add(6) = *old.add(6);
        if l3_off == 18 {
            *eth.add(7) = *old.add(7);
            *eth.add(8) = *old.add(8);
        }
    }
    let ip_off = l3_off;
    let inner_off = l3_off + overhead;
    let proto = if gue { PROTO_UDP } else { F::ENCAP_PROTO };
    let addrs = (&b.snat_addr, &b.addr, nh.addr_sum);
    let Some(len) = F::write_outer(data, data_end, (ip_off, inner_off), addrs, proto, hash) else {
        return malformed;
    };
    if gue && gue_header::<F>(data, data_end, (ip_off, inner_off), len, nh.addr_sum, hash).is_none()
    {
        return malformed;
    }
    Ok(())
}

/// The UDP header of GUE after the outer IP header at `offs.0`, for the inner packet at
/// `offs.1` of `len` bytes; `addr_sum` is the outer addresses' sum, `hash` the flow's. `None`
/// if out of bounds. (Health probes through the tunnel write theirs with it too.)
#[inline(always)]
pub fn gue_header<F: Family>(
    data: usize,
    data_end: usize,
    (ip_off, inner_off): (usize, usize),
    len: u16,
    addr_sum: u32,
    hash: u64,
) -> Option<()> {
    let udp = ptr_at_mut_checked::<UdpHdr>(data, data_end, ip_off + F::HDR_LEN as usize)?;
    let sport = gue_source_port(hash).to_be();
    let dport = params().gue_port;
    let udp_len = (len + UDP_HDR_LEN as u16).to_be();
    let check = F::gue_checksum(data, data_end, inner_off, addr_sum, sport, dport, udp_len);
    // SAFETY: bounds-checked, 2-aligned (see `store_mac`).
    unsafe {
        let h = udp as *mut u16;
        *h = sport;
        *h.add(1) = dport;
        *h.add(2) = udp_len;
        *h.add(3) = check.unwrap_or(0);
    }
    Some(())
}

/// An ICMP error about a direct-server-return flow, from the client side (a router on the path
/// of the backend's replies, which come from the VIP, wrote to the VIP): encapsulated to the
/// flow's backend `b` through `nh` unchanged, for the backend's own path MTU discovery and
/// errors; `hash` is the flow's. Too big for the path (not seen: errors are short): dropped.
// Out of line: inlined, its stack and the ICMPv6 handler's went beyond the 512 bytes BPF
// allows. Pointer arguments opaque (see `ptr::opaque`).
#[inline(never)]
pub fn error_to_backend<F: Family>(
    ctx: &XdpContext,
    pkt: &Icmp<F::A>,
    b: &BackendInfoOf<F::A>,
    nh: &NextHop,
    hash: u64,
) -> Verdict {
    let (ctx, pkt, b, nh) = (opaque(ctx), opaque(pkt), opaque(b), opaque(nh));
    if (pkt.end - pkt.l3_off) as u32 + overhead::<F>(b.flags) > nh.mtu {
        return (xdp_action::XDP_DROP, counter::DROP_TOO_BIG);
    }
    if let Err(reason) = push::<F>(ctx, pkt.l3_off, b, nh, hash) {
        return (xdp_action::XDP_DROP, reason);
    }
    stats::count(counter::ICMP_ENCAPSULATED);
    send_out(ctx, nh.ifindex)
}

/// Writes a MAC at `p` 16 bits at a time.
///
/// # Safety
/// `p` must point to 6 writable bytes, 2-aligned; `mac` must be 2-aligned (a `NextHop`'s are).
#[inline(always)]
unsafe fn store_mac(p: *mut u16, mac: &[u8; 6]) {
    let m = mac.as_ptr() as *const u16;
    // SAFETY: the caller's promise.
    unsafe {
        *p = *m;
        *p.add(1) = *m.add(1);
        *p.add(2) = *m.add(2);
    }
}

/// A 16-bit word of two bytes as the checksum sums read them (see [`crate::csum`]).
#[inline(always)]
fn word(a: u8, b: u8) -> u32 {
    u32::from(u16::from_ne_bytes([a, b]))
}

#[inline(always)]
fn fold(mut sum: u32) -> u16 {
    sum = (sum & 0xffff) + (sum >> 16);
    sum = (sum & 0xffff) + (sum >> 16);
    sum as u16
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
