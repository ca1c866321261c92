//! A packet too big for the path to its backend (the path's MTU, less the outer header of
//! direct server return) is answered, as a router answers it, with ICMP "fragmentation needed"
//! (IPv4 with DF) or ICMPv6 "packet too big" naming the MTU that fits, so the client's path
//! MTU discovery lowers its packets; without the answer a path with a smaller MTU (or the
//! encapsulation's overhead) would be a black hole. lb cannot fragment: IPv4 without DF is
//! dropped (counted), as are answers beyond the ICMP budget (`icmp_reply_rate`, shared with
//! echo replies).
//!
//! The answer is built in place: room made in front of the packet for an IP and an ICMP
//! header, the packet cut to what the message quotes (a 576-byte IPv4 message, RFC 1812
//! §4.3.2.3; a 1280-byte IPv6 one, RFC 4443 §3.2), sent back out of the interface it came in
//! on from the VIP it was sent to. A program of its own (`lb_too_big`, tail-called with the
//! MTU in `LB_TOO_BIG`): a rare path, verified apart from the balancer.
#![cfg_attr(not(target_arch = "bpf"), allow(dead_code))]

use aya_ebpf::{
    bindings::xdp_action,
    helpers::{bpf_csum_diff, bpf_xdp_adjust_head, bpf_xdp_adjust_tail},
    programs::XdpContext,
};
use lb_common::{Addr6, PROTO_ICMP, counter};
use network_types::{
    eth::EthHdr,
    ip::{Ipv4Hdr, Ipv6Hdr},
};

use crate::{
    clock,
    icmp::take_token,
    maps::TOO_BIG,
    parse::{self, ETH_P_IP, ETH_P_IPV6, PROTO_ICMPV6},
    ptr::{load_addr6, ptr_at_mut_checked, store_addr6},
    verdict::Verdict,
};

/// Bytes of the packet an answer quotes: what fills a 576-byte IPv4 message, a 1280-byte
/// IPv6 one.
const QUOTE_V4: usize = 576 - 20 - 8;
const QUOTE_V6: usize = 1280 - 40 - 8;
/// The smallest MTU an IPv6 link has; a path's smaller one is not named (RFC 8201 §4).
const IPV6_MIN_MTU: u32 = 1280;
const ICMP_DEST_UNREACH: u8 = 3;
const ICMP_FRAG_NEEDED: u8 = 4;
const ICMP6_PACKET_TOO_BIG: u8 = 2;
/// IPv4's "don't fragment" flag, in the `frags` field's first byte.
const IP_DF: u8 = 0x40;
/// TOS of ICMP errors (Linux's: precedence "internetwork control").
const ICMP_TOS: u8 = 0xc0;
/// TTL / hop limit of the answers (Linux's default).
const TTL: u8 = 64;

/// The answer to the packet in `ctx`, too big for the MTU the balancer left in `LB_TOO_BIG`.
#[inline(always)]
pub fn handle(ctx: &XdpContext) -> Verdict {
    let drop = (xdp_action::XDP_DROP, counter::DROP_TOO_BIG);
    let Some(mtu) = TOO_BIG.get(0).copied() else {
        return drop;
    };
    let answered = match parse::link(ctx.data(), ctx.data_end(), false) {
        Some((ETH_P_IP, l3_off)) => v4(ctx, l3_off, mtu),
        Some((ETH_P_IPV6, l3_off)) => v6(ctx, l3_off, mtu.max(IPV6_MIN_MTU)),
        _ => None,
    };
    match answered {
        Some(()) => (xdp_action::XDP_TX, counter::ICMP_TOO_BIG),
        None => drop,
    }
}

/// Makes room for `grow` bytes of headers after the link header at `l3_off` (the link header
/// moves to the new front, its MACs swapped: the answer goes back where the packet came from),
/// and cuts the frame to `l3_off + len`.
#[inline(always)]
fn reshape(ctx: &XdpContext, l3_off: usize, grow: usize, len: usize) -> Option<()> {
    // SAFETY: a valid XDP context; every packet pointer is taken again below.
    if unsafe { bpf_xdp_adjust_head(ctx.ctx, -(grow as i32)) } != 0 {
        return None;
    }
    let (data, data_end) = (ctx.data(), ctx.data_end());
    let eth = ptr_at_mut_checked::<[u8; 18]>(data, data_end, 0)?;
    let old = ptr_at_mut_checked::<[u8; 18]>(data, data_end, grow)?;
    // SAFETY: bounds-checked byte arrays, apart (`grow` is 28 or more); 18 bytes of the old
    // frame are in it whatever its link header's length (the packet is longer than its quote).
    let (eth, old) = unsafe { (&mut *eth, &*old) };
    eth[0..6].copy_from_slice(&old[6..12]);
    eth[6..12].copy_from_slice(&old[0..6]);
    eth[12] = old[12];
    eth[13] = old[13];
    if l3_off == EthHdr::LEN + 4 {
        eth[14] = old[14];
        eth[15] = old[15];
        eth[16] = old[16];
        eth[17] = old[17];
    }
    let cut = (data_end - data) as i32 - (l3_off + len) as i32;
    // SAFETY: as above.
    (unsafe { bpf_xdp_adjust_tail(ctx.ctx, -cut) } == 0).then_some(())
}

/// The one's-complement sum (unfolded, as `bpf_csum_diff` returns it) of the `N` bytes at
/// `off`, added to `seed`. `N` must be a multiple of 4, at most 512.
#[inline(always)]
fn sum<const N: usize>(ctx: &XdpContext, off: usize, seed: u32) -> Option<u32> {
    let p = ptr_at_mut_checked::<[u8; N]>(ctx.data(), ctx.data_end(), off)?;
    // SAFETY: the helper reads `N` bytes at a bounds-checked packet pointer.
    let s = unsafe { bpf_csum_diff(core::ptr::null_mut(), 0, p as *mut u32, N as u32, seed) };
    (s >= 0).then_some(s as u32)
}

#[inline(always)]
fn fold(mut sum: u64) -> u16 {
    sum = (sum & 0xffff) + (sum >> 16);
    sum = (sum & 0xffff) + (sum >> 16);
    sum = (sum & 0xffff) + (sum >> 16);
    sum as u16
}

/// ICMP fragmentation needed for the IPv4 packet at `l3_off`.
#[inline(always)]
fn v4(ctx: &XdpContext, l3_off: usize, mtu: u32) -> Option<()> {
    let (data, data_end) = (ctx.data(), ctx.data_end());
    let ip = ptr_at_mut_checked::<Ipv4Hdr>(data, data_end, l3_off)?;
    // SAFETY: bounds-checked byte arrays.
    let (df, src, dst) = unsafe { ((*ip).frags[0] & IP_DF != 0, (*ip).src_addr, (*ip).dst_addr) };
    if !df || data_end - data < l3_off + QUOTE_V4 || !take_token(clock::now()) {
        return None;
    }
    const HDRS: usize = Ipv4Hdr::LEN + 8;
    reshape(ctx, l3_off, HDRS, HDRS + QUOTE_V4)?;
    let (data, data_end) = (ctx.data(), ctx.data_end());
    let ip = ptr_at_mut_checked::<Ipv4Hdr>(data, data_end, l3_off)?;
    let icmp = ptr_at_mut_checked::<[u8; 8]>(data, data_end, l3_off + Ipv4Hdr::LEN)?;
    let mtu = (mtu.min(u32::from(u16::MAX)) as u16).to_be_bytes();
    // SAFETY: bounds-checked byte arrays.
    unsafe {
        (*ip).vihl = 0x45;
        (*ip).tos = ICMP_TOS;
        (*ip).tot_len = ((HDRS + QUOTE_V4) as u16).to_be_bytes();
        (*ip).id = [0, 0];
        (*ip).frags = [0, 0];
        (*ip).ttl = TTL;
        (*ip).proto = PROTO_ICMP;
        (*ip).check = [0, 0];
        (*ip).src_addr = dst;
        (*ip).dst_addr = src;
        *icmp = [
            ICMP_DEST_UNREACH,
            ICMP_FRAG_NEEDED,
            0,
            0,
            0,
            0,
            mtu[0],
            mtu[1],
        ];
    }
    let ip_sum = sum::<{ Ipv4Hdr::LEN }>(ctx, l3_off, 0)?;
    // The message: its header and the quote, in two pieces (the helper sums 512 bytes at most).
    let at = l3_off + Ipv4Hdr::LEN;
    let icmp_sum = sum::<280>(ctx, at, 0)?;
    let icmp_sum = sum::<{ 8 + QUOTE_V4 - 280 }>(ctx, at + 280, icmp_sum)?;
    let (data, data_end) = (ctx.data(), ctx.data_end());
    let ip = ptr_at_mut_checked::<Ipv4Hdr>(data, data_end, l3_off)?;
    let icmp = ptr_at_mut_checked::<[u8; 8]>(data, data_end, at)?;
    // SAFETY: bounds-checked byte arrays.
    unsafe {
        (*ip).check = (!fold(u64::from(ip_sum))).to_ne_bytes();
        let c = (!fold(u64::from(icmp_sum))).to_ne_bytes();
        (*icmp)[2] = c[0];
        (*icmp)[3] = c[1];
    }
    Some(())
}

/// ICMPv6 packet too big for the IPv6 packet at `l3_off`.
#[inline(always)]
fn v6(ctx: &XdpContext, l3_off: usize, mtu: u32) -> Option<()> {
    let (data, data_end) = (ctx.data(), ctx.data_end());
    let ip = ptr_at_mut_checked::<Ipv6Hdr>(data, data_end, l3_off)?;
    // SAFETY: the header is in bounds; its addresses are 2-aligned.
    let (src, dst): (Addr6, Addr6) = unsafe {
        (
            load_addr6((*ip).src_addr.as_ptr()),
            load_addr6((*ip).dst_addr.as_ptr()),
        )
    };
    if data_end - data < l3_off + QUOTE_V6 || !take_token(clock::now()) {
        return None;
    }
    const HDRS: usize = Ipv6Hdr::LEN + 8;
    const PAYLOAD: usize = 8 + QUOTE_V6;
    reshape(ctx, l3_off, HDRS, HDRS + QUOTE_V6)?;
    let (data, data_end) = (ctx.data(), ctx.data_end());
    let ip = ptr_at_mut_checked::<Ipv6Hdr>(data, data_end, l3_off)?;
    let at = l3_off + Ipv6Hdr::LEN;
    let icmp = ptr_at_mut_checked::<[u8; 8]>(data, data_end, at)?;
    let m = mtu.to_be_bytes();
    // SAFETY: bounds-checked; the addresses are 2-aligned.
    unsafe {
        (*ip).vcf = [0x60, 0, 0, 0];
        (*ip).payload_len = (PAYLOAD as u16).to_be_bytes();
        (*ip).next_hdr = PROTO_ICMPV6;
        (*ip).hop_limit = TTL;
        store_addr6((*ip).src_addr.as_mut_ptr(), &dst);
        store_addr6((*ip).dst_addr.as_mut_ptr(), &src);
        *icmp = [ICMP6_PACKET_TOO_BIG, 0, 0, 0, m[0], m[1], m[2], m[3]];
    }
    // The pseudo-header (both addresses, the length, the next header) and the message, in
    // pieces of at most 512 bytes.
    let mut s = sum::<32>(ctx, l3_off + 8, 0)?;
    s = sum::<512>(ctx, at, s)?;
    s = sum::<512>(ctx, at + 512, s)?;
    s = sum::<{ PAYLOAD - 1024 }>(ctx, at + 1024, s)?;
    let total = u64::from(s)
        + u64::from(u16::from_ne_bytes((PAYLOAD as u16).to_be_bytes()))
        + u64::from(u16::from_ne_bytes([0, PROTO_ICMPV6]));
    let (data, data_end) = (ctx.data(), ctx.data_end());
    let icmp = ptr_at_mut_checked::<[u8; 8]>(data, data_end, at)?;
    // SAFETY: bounds-checked.
    unsafe {
        let c = (!fold(total)).to_ne_bytes();
        (*icmp)[2] = c[0];
        (*icmp)[3] = c[1];
    }
    Some(())
}
