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
/// stays) to backend `b` (an `ENCAP_*` flag set), from the MAC `smac` to `dmac`; `hash` is the
/// flow's hash (GUE's source port, IPv6's flow label). `Err(drop counter)` if it cannot be
/// done.
#[inline(always)]
pub fn push<F: Family>(
    ctx: &XdpContext,
    l3_off: usize,
    b: &BackendInfoOf<F::A>,
    macs: (&[u8; 6], &[u8; 6]),
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
    // SAFETY: bounds-checked byte arrays, apart (the outer header is 20 bytes or more); 18
    // bytes of the old frame (its link header and the first of its IP header) are read
    // whatever the link header's length.
    let (eth, old) = unsafe { (&mut *eth, &*old) };
    eth[0..6].copy_from_slice(macs.1);
    eth[6..12].copy_from_slice(macs.0);
    eth[12] = old[12];
    eth[13] = old[13];
    if l3_off == 18 {
        eth[14] = old[14];
        eth[15] = old[15];
        eth[16] = old[16];
        eth[17] = old[17];
    }
    let ip_off = l3_off;
    let inner_off = l3_off + overhead;
    let proto = if gue { PROTO_UDP } else { F::ENCAP_PROTO };
    let addrs = (&b.snat_addr, &b.addr);
    let Some(len) = F::write_outer(data, data_end, (ip_off, inner_off), addrs, proto, hash) else {
        return malformed;
    };
    if gue {
        let Some(udp) = ptr_at_mut_checked::<UdpHdr>(data, data_end, ip_off + F::HDR_LEN as usize)
        else {
            return malformed;
        };
        let sport = gue_source_port(hash).to_be();
        let dport = params().gue_port;
        let udp_len = (len + UDP_HDR_LEN as u16).to_be();
        // SAFETY: bounds-checked.
        unsafe {
            (*udp).src = sport.to_ne_bytes();
            (*udp).dst = dport.to_ne_bytes();
            (*udp).len = udp_len.to_ne_bytes();
            (*udp).check = [0, 0];
        }
        if let Some(check) =
            F::gue_checksum(data, data_end, (ip_off, inner_off), sport, dport, udp_len)
        {
            // SAFETY: bounds-checked above.
            unsafe { (*udp).check = check.to_ne_bytes() };
        }
    }
    Ok(())
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
    if let Err(reason) = push::<F>(ctx, pkt.l3_off, b, (&nh.smac, &nh.dmac), hash) {
        return (xdp_action::XDP_DROP, reason);
    }
    stats::count(counter::ICMP_ENCAPSULATED);
    send_out(ctx, nh.ifindex)
}

/// A 16-bit word of two bytes as the checksum sums read them (see [`crate::csum`]).
#[inline(always)]
fn word(a: u8, b: u8) -> u32 {
    u32::from(u16::from_ne_bytes([a, b]))
}

/// A 32-bit value (network order, as held) as two checksum words.
#[inline(always)]
fn words32(v: u32) -> u32 {
    (v & 0xffff) + (v >> 16)
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
    ip_off: usize,
    inner_off: usize,
    src: u32,
    dst: u32,
    proto: u8,
) -> Option<u16> {
    let inner = ptr_at_mut_checked::<Ipv4Hdr>(data, data_end, inner_off)?;
    // SAFETY: bounds-checked byte arrays.
    let (tos, inner_len) = unsafe { ((*inner).tos, u16::from_be_bytes((*inner).tot_len)) };
    let tot = (inner_len + (inner_off - ip_off) as u16).to_be_bytes();
    let ip = ptr_at_mut_checked::<Ipv4Hdr>(data, data_end, ip_off)?;
    let sum = word(0x45, tos)
        + word(tot[0], tot[1])
        + word(IP_DF, 0)
        + word(ENCAP_TTL, proto)
        + words32(src)
        + words32(dst);
    // SAFETY: bounds-checked byte arrays.
    unsafe {
        (*ip).vihl = 0x45;
        (*ip).tos = tos;
        (*ip).tot_len = tot;
        (*ip).id = [0, 0];
        (*ip).frags = [IP_DF, 0];
        (*ip).ttl = ENCAP_TTL;
        (*ip).proto = proto;
        (*ip).check = (!fold(sum)).to_ne_bytes();
        (*ip).src_addr = src.to_ne_bytes();
        (*ip).dst_addr = dst.to_ne_bytes();
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
    // SAFETY: bounds-checked; the addresses are 2-aligned (see `store_addr6`).
    unsafe {
        (*ip).vcf = [
            0x60 | (vcf[0] & 0x0f),
            (vcf[1] & 0xf0) | (label >> 16) as u8,
            (label >> 8) as u8,
            label as u8,
        ];
        (*ip).payload_len = payload.to_be_bytes();
        (*ip).next_hdr = proto;
        (*ip).hop_limit = ENCAP_TTL;
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
    ip_off: usize,
    inner_off: usize,
    sport: u16,
    dport: u16,
    udp_len: u16,
) -> Option<u16> {
    let outer = ptr_at_mut_checked::<Ipv6Hdr>(data, data_end, ip_off)?;
    let inner = ptr_at_mut_checked::<Ipv6Hdr>(data, data_end, inner_off)?;
    // SAFETY: bounds-checked; read in place.
    let (outer, inner) = unsafe { (&*outer, &*inner) };
    let nh = inner.next_hdr;
    if nh != PROTO_TCP && nh != PROTO_UDP && nh != PROTO_ICMPV6 {
        return None;
    }
    // SAFETY: the header is in bounds; its addresses are 2-aligned.
    let (src, dst) = unsafe {
        (
            crate::ptr::load_addr6(outer.src_addr.as_ptr()),
            crate::ptr::load_addr6(outer.dst_addr.as_ptr()),
        )
    };
    // Spelled out: an iterator over the words compiles to a pointer loop the verifier cannot
    // bound.
    let mut sum = words32(src[0]) + words32(src[1]) + words32(src[2]) + words32(src[3]);
    sum += words32(dst[0]) + words32(dst[1]) + words32(dst[2]) + words32(dst[3]);
    // The pseudo-header's length and protocol, the UDP header (its checksum 0).
    sum += u32::from(udp_len) + word(0, PROTO_UDP);
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
