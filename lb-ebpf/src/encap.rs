//! Direct server return: the client's packet, unchanged, inside an outer IP header (`ipip`) or
//! outer IP and UDP headers (`gue`) to its backend, which strips them and answers the client
//! itself. The formats are lb-common's `encap` module's; the outer header is written (by
//! outer.rs, through the family) after `bpf_xdp_adjust_head` made room for it in front of the
//! packet.
#![cfg_attr(not(target_arch = "bpf"), allow(dead_code))]

use aya_ebpf::{bindings::xdp_action, helpers::bpf_xdp_adjust_head, programs::XdpContext};
use lb_common::{
    BackendInfoOf, NextHop, PROTO_UDP, UDP_HDR_LEN, backend_flags, counter, gue_source_port,
};
use network_types::udp::UdpHdr;

use crate::{
    family::Family,
    maps::params,
    parse::Icmp,
    ptr::{opaque, ptr_at_mut_checked},
    stats,
    verdict::{Verdict, send_out},
};

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
