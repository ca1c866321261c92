//! ICMP for lb's addresses. A VIP behaves like a host's address: echo requests are answered
//! (rate-limited per CPU), nothing else is passed to the kernel, which does not hold the address
//! and would route it back out. ICMP errors about a balanced flow are translated the way the flow
//! itself is, so path MTU discovery and unreachables work through the full NAT:
//!
//! - from the client side (to the VIP, quoting VIP:port → client:port): to the flow's backend,
//!   from its SNAT address, quoting what the backend sent (backend:port → SNAT:port); with
//!   direct server return, where the backend holds the VIP and sent what is quoted itself, the
//!   message is encapsulated to it unchanged;
//! - from the backend side (to a SNAT address, quoting SNAT:port → backend:port): to the client,
//!   from the VIP, quoting VIP:port → client:port. It also feeds the passive checks
//!   ([`crate::passive::unreachable`]).
//!
//! Every changed 16-bit word is summed once and applied to each checksum that covers it: the
//! quoted IP header's, the quoted TCP/UDP header's (when the quote holds it), the ICMP
//! message's, and the outer IP header's.
#![cfg_attr(not(target_arch = "bpf"), allow(dead_code))]

use aya_ebpf::{bindings::xdp_action, programs::XdpContext};
use lb_common::{
    FlowKey, PROTO_ICMP, PROTO_TCP, PROTO_UDP, addr_flags, backend_flags, counter, param_flags,
};
use network_types::{eth::EthHdr, ip::Ipv4Hdr};

use crate::{
    clock,
    csum::{diff16, diff32, update},
    encap,
    family::{V4, lookup_addr},
    fib,
    maps::{BACKENDS, ICMP_RATE, params},
    parse::{self, ETH_P_IP, Parsed},
    passive,
    ptr::{ptr_at_mut, ptr_at_mut_checked, read_at},
    ratelimit, stats,
    table::{ct_find, ct_live, nat_find},
    verdict::{Verdict, send_out},
};

type Icmp = parse::Icmp<u32>;

const ECHO_REPLY: u8 = 0;
const DEST_UNREACH: u8 = 3;
const ECHO_REQUEST: u8 = 8;
const TIME_EXCEEDED: u8 = 11;
/// Type, code, checksum and 4 bytes (identifier/sequence, unused, or the next-hop MTU).
const ICMP_HDR_LEN: usize = 8;
/// The TTL of lb's echo replies (Linux's default).
const REPLY_TTL: u8 = 64;
/// Fragment offset bits of the IPv4 `frags` field.
const IP_OFFSET_MASK: u16 = 0x1fff;

/// The packet an ICMP error quotes: its IPv4 header and the first 8 bytes of its TCP or UDP
/// header (all an error must carry), network byte order.
struct Quote {
    /// Where its IPv4 header and its TCP/UDP header start.
    ip_off: usize,
    l4_off: usize,
    proto: u8,
    src: u32,
    dst: u32,
    sport: u16,
    dport: u16,
}

/// A readable quote of a TCP or UDP packet (first fragment or whole), within the datagram.
#[inline(always)]
fn quote(data: usize, data_end: usize, pkt: &Icmp) -> Option<Quote> {
    let ip_off = pkt.l4_off + ICMP_HDR_LEN;
    let ip = read_at::<Ipv4Hdr>(data, data_end, ip_off)?;
    let ihl = ((ip.vihl & 0x0f) as usize) * 4;
    if ip.vihl >> 4 != 4
        || ihl < Ipv4Hdr::LEN
        || (ip.proto != PROTO_TCP && ip.proto != PROTO_UDP)
        || u16::from_be_bytes(ip.frags) & IP_OFFSET_MASK != 0
    {
        return None;
    }
    let l4_off = ip_off + ihl;
    if l4_off + 8 > pkt.end.min(data_end - data) {
        return None;
    }
    let ports = read_at::<[u8; 4]>(data, data_end, l4_off)?;
    Some(Quote {
        ip_off,
        l4_off,
        proto: ip.proto,
        src: u32::from_ne_bytes(ip.src_addr),
        dst: u32::from_ne_bytes(ip.dst_addr),
        sport: u16::from_ne_bytes([ports[0], ports[1]]),
        dport: u16::from_ne_bytes([ports[2], ports[3]]),
    })
}

/// An ICMP message for one of lb's addresses: the handler program's whole work (see
/// `lb_icmp` in main.rs). The frame is parsed again: ICMP is rare, and a program of its own is
/// verified apart, so its paths do not multiply the forwarding program's.
#[inline(always)]
pub fn handle(ctx: &XdpContext) -> Verdict {
    let (data, data_end) = (ctx.data(), ctx.data_end());
    let pkt = match parse::link(data, data_end, false) {
        Some((ETH_P_IP, l3_off)) => parse::ipv4(data, data_end, l3_off),
        _ => return (xdp_action::XDP_PASS, counter::PASS_NOT_VIP),
    };
    let Parsed::Icmp(pkt) = pkt else {
        // Not reached: the balancer hands over ICMP only.
        return (xdp_action::XDP_PASS, counter::PASS_NOT_VIP);
    };
    let flags = lookup_addr::<V4>(pkt.daddr);
    if flags & addr_flags::SNAT != 0
        && let Some(v) = to_snat(ctx, &pkt)
    {
        return v;
    }
    if flags & addr_flags::VIP != 0 {
        return to_vip(ctx, &pkt, flags);
    }
    (xdp_action::XDP_PASS, counter::PASS_NOT_VIP)
}

/// ICMP to a VIP address (its [`addr_flags`] `flags`).
#[inline(always)]
pub fn to_vip(ctx: &XdpContext, pkt: &Icmp, flags: u32) -> Verdict {
    let (data, data_end) = (ctx.data(), ctx.data_end());
    let Some(head) = read_at::<[u8; 2]>(data, data_end, pkt.l4_off) else {
        return (xdp_action::XDP_DROP, counter::DROP_MALFORMED);
    };
    if pkt.l4_off + ICMP_HDR_LEN > pkt.end {
        return (xdp_action::XDP_DROP, counter::DROP_MALFORMED);
    }
    match head[0] {
        ECHO_REQUEST if head[1] == 0 && flags & addr_flags::PING != 0 => echo(ctx, pkt),
        DEST_UNREACH | TIME_EXCEEDED if params().flags & param_flags::TRANSLATE_ICMP != 0 => {
            from_client(ctx, pkt)
        }
        _ => (xdp_action::XDP_DROP, counter::DROP_ICMP),
    }
}

/// Answers an echo request in place: addresses and MACs swapped, type 0, rate-limited.
#[inline(always)]
fn echo(ctx: &XdpContext, pkt: &Icmp) -> Verdict {
    if !take_token(clock::now()) {
        return (xdp_action::XDP_DROP, counter::DROP_ICMP_RATE);
    }
    let (data, data_end) = (ctx.data(), ctx.data_end());
    let (Some(eth), Some(ip), Some(icmp)) = (
        ptr_at_mut_checked::<EthHdr>(data, data_end, 0),
        ptr_at_mut_checked::<Ipv4Hdr>(data, data_end, pkt.l3_off),
        ptr_at_mut::<[u8; 4]>(data, data_end, pkt.l4_off),
    ) else {
        return (xdp_action::XDP_DROP, counter::DROP_MALFORMED);
    };
    // SAFETY: bounds-checked pointers to byte-array headers.
    unsafe {
        core::mem::swap(&mut (*eth).src_addr, &mut (*eth).dst_addr);
        // Swapping the addresses leaves the header's sum as it is; the TTL changes it.
        let old_ttl = u16::from_ne_bytes([(*ip).ttl, (*ip).proto]);
        (*ip).ttl = REPLY_TTL;
        let new_ttl = u16::from_ne_bytes([(*ip).ttl, (*ip).proto]);
        (*ip).check =
            update(u16::from_ne_bytes((*ip).check), diff16(old_ttl, new_ttl)).to_ne_bytes();
        (*ip).src_addr = pkt.daddr.to_ne_bytes();
        (*ip).dst_addr = pkt.saddr.to_ne_bytes();
        let old_type = u16::from_ne_bytes([(*icmp)[0], (*icmp)[1]]);
        (*icmp)[0] = ECHO_REPLY;
        let new_type = u16::from_ne_bytes([(*icmp)[0], (*icmp)[1]]);
        let check = u16::from_ne_bytes([(*icmp)[2], (*icmp)[3]]);
        let check = update(check, diff16(old_type, new_type)).to_ne_bytes();
        (*icmp)[2] = check[0];
        (*icmp)[3] = check[1];
    }
    (xdp_action::XDP_TX, counter::ICMP_ECHO_REPLY)
}

/// One token of this CPU's reply budget: `icmp_reply_rate` a second, as many in a burst.
#[inline(always)]
pub fn take_token(now: u64) -> bool {
    let p = params();
    match ICMP_RATE.get_ptr_mut(0) {
        // SAFETY: this CPU's slot of a per-CPU array of plain integers.
        Some(b) => ratelimit::take(
            unsafe { &mut *b },
            p.icmp_reply_rate,
            p.icmp_reply_scaled,
            now,
        ),
        None => false,
    }
}

/// An error from the client side about VIP:port → client:port: to the flow's backend.
#[inline(always)]
fn from_client(ctx: &XdpContext, pkt: &Icmp) -> Verdict {
    let no_flow = (xdp_action::XDP_DROP, counter::DROP_ICMP_NO_FLOW);
    let (data, data_end) = (ctx.data(), ctx.data_end());
    let Some(q) = quote(data, data_end, pkt).filter(|q| q.src == pkt.daddr) else {
        return no_flow;
    };
    let p = params();
    let now = clock::now();
    // The flow in the client's direction.
    let k = FlowKey::new(q.dst, q.src, q.dport, q.sport, q.proto);
    let Some(slot) = ct_find::<V4>(&k, k.hash(), p) else {
        return no_flow;
    };
    // SAFETY: a map value of plain integers.
    let e = unsafe { (*slot).entry };
    if !ct_live(&e, now, p) {
        return no_flow;
    }
    let Some(backend) = BACKENDS.get(e.backend_id).copied() else {
        return no_flow;
    };
    if pkt.ttl <= 1 {
        return (xdp_action::XDP_DROP, counter::DROP_TTL);
    }
    let nh = match fib::to_backend::<V4>(ctx, e.backend_id, &backend, PROTO_ICMP, now) {
        Ok(nh) => nh,
        Err(reason) => return (xdp_action::XDP_DROP, reason),
    };
    if backend.flags & backend_flags::ENCAP != 0 {
        return encap::error_to_backend::<V4>(ctx, pkt, &backend, &nh, k.hash());
    }
    let rw = Translation {
        outer_src: backend.snat_addr,
        outer_dst: backend.addr,
        src: backend.addr,
        dst: backend.snat_addr,
        sport: backend.port,
        dport: e.snat_port,
        smac: nh.smac,
        dmac: nh.dmac,
    };
    if translate(data, data_end, pkt, &q, &rw).is_none() {
        return (xdp_action::XDP_DROP, counter::DROP_MALFORMED);
    }
    stats::count(counter::ICMP_TRANSLATED_IN);
    send_out(ctx, nh.ifindex)
}

/// ICMP to a SNAT address. An error about a flow to a backend (quoting SNAT:port →
/// backend:port) goes to the flow's client; `None` for anything else, which is the host's own
/// (its pings, errors about its own connections and probes): passed.
#[inline(always)]
pub fn to_snat(ctx: &XdpContext, pkt: &Icmp) -> Option<Verdict> {
    let (data, data_end) = (ctx.data(), ctx.data_end());
    let head = read_at::<[u8; 2]>(data, data_end, pkt.l4_off)?;
    if head[0] != DEST_UNREACH && head[0] != TIME_EXCEEDED {
        return None;
    }
    let q = quote(data, data_end, pkt).filter(|q| q.src == pkt.daddr)?;
    let p = params();
    // The flow's return path: backend → SNAT address.
    let k = FlowKey::new(q.dst, q.src, q.dport, q.sport, q.proto);
    let slot = nat_find::<V4>(&k, k.hash(), p)?;
    // SAFETY: a map value of plain integers.
    let nat = unsafe { (*slot).entry };
    let now = clock::now();
    if head[0] == DEST_UNREACH {
        let fwd = FlowKey::new(
            nat.client_addr,
            nat.vip_addr,
            nat.client_port,
            nat.vip_port,
            q.proto,
        );
        if let Some(slot) = ct_find::<V4>(&fwd, fwd.hash(), p) {
            // SAFETY: a map value of plain integers.
            let e = unsafe { &mut (*slot).entry };
            if e.backend_id == nat.backend_id && e.snat_port == q.sport && ct_live(e, now, p) {
                passive::unreachable(e, &nat, q.proto, head[1]);
            }
        }
    }
    if p.flags & param_flags::TRANSLATE_ICMP == 0 {
        return None;
    }
    if pkt.ttl <= 1 {
        return Some((xdp_action::XDP_DROP, counter::DROP_TTL));
    }
    let rw = Translation {
        outer_src: nat.vip_addr,
        outer_dst: nat.client_addr,
        src: nat.client_addr,
        dst: nat.vip_addr,
        sport: nat.client_port,
        dport: nat.vip_port,
        smac: nat.lb_mac,
        dmac: nat.client_mac,
    };
    if translate(data, data_end, pkt, &q, &rw).is_none() {
        return Some((xdp_action::XDP_DROP, counter::DROP_MALFORMED));
    }
    stats::count(counter::ICMP_TRANSLATED_OUT);
    Some(send_out(ctx, nat.ifindex))
}

/// How an ICMP error about a flow is rewritten: the outer addresses, the quoted packet's
/// addresses and ports, the MACs (network byte order).
struct Translation {
    outer_src: u32,
    outer_dst: u32,
    src: u32,
    dst: u32,
    sport: u16,
    dport: u16,
    smac: [u8; 6],
    dmac: [u8; 6],
}

/// A 16-bit field at `off`, if the datagram (to `end`) and the frame hold it.
#[inline(always)]
pub fn field(data: usize, data_end: usize, end: usize, off: usize) -> Option<*mut [u8; 2]> {
    if off + 2 > end {
        return None;
    }
    ptr_at_mut_checked::<[u8; 2]>(data, data_end, off)
}

#[inline(always)]
fn translate(data: usize, data_end: usize, pkt: &Icmp, q: &Quote, rw: &Translation) -> Option<()> {
    let eth = ptr_at_mut_checked::<EthHdr>(data, data_end, 0)?;
    let ip = ptr_at_mut_checked::<Ipv4Hdr>(data, data_end, pkt.l3_off)?;
    let qip = ptr_at_mut_checked::<Ipv4Hdr>(data, data_end, q.ip_off)?;
    let ports = ptr_at_mut_checked::<[u8; 4]>(data, data_end, q.l4_off)?;
    let icmp_check = field(data, data_end, pkt.end, pkt.l4_off + 2)?;
    // The quoted transport checksum, when the quote holds it (TCP's lies past the first 8
    // bytes); a UDP checksum of 0 means none.
    let l4_check = match q.proto {
        PROTO_TCP => field(data, data_end, pkt.end, q.l4_off + 16),
        _ => field(data, data_end, pkt.end, q.l4_off + 6),
    };
    // SAFETY: every pointer is bounds-checked; the headers are byte arrays.
    unsafe {
        // The quoted addresses: in its IP header and its transport pseudo-header.
        let addrs = diff32(q.src, rw.src) + diff32(q.dst, rw.dst);
        let ports_diff = diff16(q.sport, rw.sport) + diff16(q.dport, rw.dport);
        let old_qcheck = u16::from_ne_bytes((*qip).check);
        let new_qcheck = update(old_qcheck, addrs);
        (*qip).check = new_qcheck.to_ne_bytes();
        (*qip).src_addr = rw.src.to_ne_bytes();
        (*qip).dst_addr = rw.dst.to_ne_bytes();
        let (sport, dport) = (rw.sport.to_ne_bytes(), rw.dport.to_ne_bytes());
        *ports = [sport[0], sport[1], dport[0], dport[1]];
        // Everything changed inside the ICMP message, for its checksum.
        let mut inner = addrs + ports_diff + diff16(old_qcheck, new_qcheck);
        if let Some(c) = l4_check {
            let old = u16::from_ne_bytes(*c);
            if !(q.proto == PROTO_UDP && old == 0) {
                let mut new = update(old, addrs + ports_diff);
                if q.proto == PROTO_UDP && new == 0 {
                    new = 0xffff; // 0 would mean "no checksum"
                }
                *c = new.to_ne_bytes();
                inner += diff16(old, new);
            }
        }
        *icmp_check = update(u16::from_ne_bytes(*icmp_check), inner).to_ne_bytes();
        // The outer header: addresses and TTL.
        let old_ttl = u16::from_ne_bytes([(*ip).ttl, (*ip).proto]);
        (*ip).ttl -= 1;
        let new_ttl = u16::from_ne_bytes([(*ip).ttl, (*ip).proto]);
        let outer = diff32(pkt.saddr, rw.outer_src)
            + diff32(pkt.daddr, rw.outer_dst)
            + diff16(old_ttl, new_ttl);
        (*ip).check = update(u16::from_ne_bytes((*ip).check), outer).to_ne_bytes();
        (*ip).src_addr = rw.outer_src.to_ne_bytes();
        (*ip).dst_addr = rw.outer_dst.to_ne_bytes();
        (*eth).src_addr = rw.smac;
        (*eth).dst_addr = rw.dmac;
    }
    Some(())
}
