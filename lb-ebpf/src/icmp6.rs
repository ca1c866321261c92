//! ICMPv6 for lb's IPv6 addresses, as icmp.rs does for IPv4: echo requests to a VIP answered
//! (rate-limited per CPU, the budget shared with IPv4's), errors about a balanced flow
//! (destination unreachable, packet too big, time exceeded) translated the way the flow is, and
//! neighbour discovery passed to the kernel untouched (a VIP's neighbour entry is the host's
//! business). Everything else to a VIP is dropped; to a SNAT address (the host's own), passed.
//!
//! ICMPv6's checksum covers a pseudo-header with the outer addresses (RFC 4443 §2.3), so a
//! translation adds their change to it besides the quoted packet's; IPv6 headers have no
//! checksum of their own. A quoted packet with extension headers before its transport header is
//! not matched to a flow (a sender quotes what it received, which lb sent without any).
#![cfg_attr(not(target_arch = "bpf"), allow(dead_code))]

use aya_ebpf::{bindings::xdp_action, macros::map, maps::PerCpuArray, programs::XdpContext};
use lb_common::{
    Addr6, FlowKey6, PROTO_TCP, PROTO_UDP, addr_flags, addr6, addr6_octets, backend_flags, counter,
    param_flags,
};
use network_types::{eth::EthHdr, ip::Ipv6Hdr};

use crate::{
    clock,
    csum::{diff_words, diff16, update},
    encap,
    family::{Family, V6, lookup_addr},
    fib,
    icmp::{field, take_token},
    maps::params,
    parse::{self, ETH_P_IPV6, PROTO_ICMPV6, Parsed},
    passive,
    ptr::{ptr_at, ptr_at_mut, ptr_at_mut_checked, read_at, read_at_checked},
    stats,
    table::{ct_find, ct_live, nat_find},
    verdict::{Verdict, send_out},
};

type Icmp = parse::Icmp<Addr6>;

/// A translation's working values: this CPU's, in a map rather than on the stack (IPv6
/// addresses are 16 bytes each; the quote, the rewrite and the key built on the stack went
/// beyond the 512 bytes BPF allows).
#[repr(C)]
struct Work {
    quote: Quote,
    rw: Translation,
    key: FlowKey6,
    /// The message's own addresses (source, destination) as they came.
    outer: [u32; 8],
}

/// The packet an ICMPv6 error quotes: its IPv6 header's addresses and its ports (network byte
/// order), and where its parts are.
#[repr(C)]
struct Quote {
    proto: u8,
    sport: u16,
    dport: u16,
    /// Source, then destination: one array, so their checksum change is one helper call.
    addrs: [u32; 8],
}

impl Quote {
    fn src(&self) -> Addr6 {
        [self.addrs[0], self.addrs[1], self.addrs[2], self.addrs[3]]
    }
    fn dst(&self) -> Addr6 {
        [self.addrs[4], self.addrs[5], self.addrs[6], self.addrs[7]]
    }
}

/// How an ICMPv6 error about a flow is rewritten: the outer addresses, the quoted packet's
/// addresses (source then destination, each pair one array) and ports, the MACs.
#[repr(C)]
struct Translation {
    outer: [u32; 8],
    addrs: [u32; 8],
    sport: u16,
    dport: u16,
    smac: [u8; 6],
    dmac: [u8; 6],
}

/// Two addresses as one array (source, destination).
#[inline(always)]
fn pair(a: &Addr6, b: &Addr6) -> [u32; 8] {
    [a[0], a[1], a[2], a[3], b[0], b[1], b[2], b[3]]
}

#[map(name = "LB_ICMP6_WORK")] // lb_common::map_name::ICMP6_WORK
static WORK: PerCpuArray<Work> = PerCpuArray::with_max_entries(1, 0);

/// This CPU's working values.
#[inline(always)]
fn work() -> Option<&'static mut Work> {
    // SAFETY: this CPU's slot, used by this packet only (XDP runs to its end on one CPU).
    WORK.get_ptr_mut(0).map(|w| unsafe { &mut *w })
}

const DEST_UNREACH: u8 = 1;
const PACKET_TOO_BIG: u8 = 2;
const TIME_EXCEEDED: u8 = 3;
const ECHO_REQUEST: u8 = 128;
const ECHO_REPLY: u8 = 129;
/// Router solicitation .. redirect: neighbour discovery (RFC 4861).
const ND_FIRST: u8 = 133;
const ND_LAST: u8 = 137;
/// Type, code, checksum and 4 bytes (identifier/sequence, unused, or the MTU).
const ICMP_HDR_LEN: usize = 8;
/// The hop limit of lb's echo replies (Linux's default).
const REPLY_HOP_LIMIT: u8 = 64;

/// An ICMPv6 message for one of lb's IPv6 addresses: the handler program's whole work (see
/// `lb_icmp6` in main.rs).
#[inline(always)]
pub fn handle(ctx: &XdpContext) -> Verdict {
    let (data, data_end) = (ctx.data(), ctx.data_end());
    let pkt = match parse::link(data, data_end, false) {
        Some((ETH_P_IPV6, l3_off)) => parse::ipv6(data, data_end, l3_off),
        _ => return (xdp_action::XDP_PASS, counter::PASS_NOT_VIP),
    };
    let Parsed::Icmp(pkt) = pkt else {
        // Not reached: the balancer hands over ICMPv6 only.
        return (xdp_action::XDP_PASS, counter::PASS_NOT_VIP);
    };
    let flags = lookup_addr::<V6>(pkt.daddr);
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

/// Where the quoted packet's IPv6 header and its transport header are.
#[inline(always)]
fn quoted_offsets(pkt: &Icmp) -> (usize, usize) {
    let ip = pkt.l4_off + ICMP_HDR_LEN;
    (ip, ip + Ipv6Hdr::LEN)
}

/// Reads a quote of a TCP or UDP packet without extension headers, within the datagram, into
/// `q`; false if there is none.
#[inline(always)]
fn quote(data: usize, data_end: usize, pkt: &Icmp, q: &mut Quote) -> bool {
    let (ip_off, l4_off) = quoted_offsets(pkt);
    let Some(ip) = ptr_at::<Ipv6Hdr>(data, data_end, ip_off) else {
        return false;
    };
    // SAFETY: bounds-checked; read in place.
    let ip = unsafe { &*ip };
    if ip.vcf[0] >> 4 != 6 || (ip.next_hdr != PROTO_TCP && ip.next_hdr != PROTO_UDP) {
        return false;
    }
    if l4_off + 8 > pkt.end.min(data_end - data) {
        return false;
    }
    let Some(ports) = read_at_checked::<[u8; 4]>(data, data_end, l4_off) else {
        return false;
    };
    q.proto = ip.next_hdr;
    q.addrs = pair(&addr6(ip.src_addr), &addr6(ip.dst_addr));
    q.sport = u16::from_ne_bytes([ports[0], ports[1]]);
    q.dport = u16::from_ne_bytes([ports[2], ports[3]]);
    true
}

/// ICMPv6 to a VIP address (its [`addr_flags`] `flags`).
#[inline(always)]
fn to_vip(ctx: &XdpContext, pkt: &Icmp, flags: u32) -> Verdict {
    let (data, data_end) = (ctx.data(), ctx.data_end());
    let Some(head) = read_at::<[u8; 2]>(data, data_end, pkt.l4_off) else {
        return (xdp_action::XDP_DROP, counter::DROP_MALFORMED);
    };
    if pkt.l4_off + ICMP_HDR_LEN > pkt.end {
        return (xdp_action::XDP_DROP, counter::DROP_MALFORMED);
    }
    match head[0] {
        ECHO_REQUEST if head[1] == 0 && flags & addr_flags::PING != 0 => echo(ctx, pkt),
        DEST_UNREACH | PACKET_TOO_BIG | TIME_EXCEEDED
            if params().flags & param_flags::TRANSLATE_ICMP != 0 =>
        {
            from_client(ctx, pkt)
        }
        ND_FIRST..=ND_LAST => (xdp_action::XDP_PASS, counter::PASS_NOT_VIP),
        _ => (xdp_action::XDP_DROP, counter::DROP_ICMP),
    }
}

/// Answers an echo request in place: addresses and MACs swapped, type 129, rate-limited.
#[inline(always)]
fn echo(ctx: &XdpContext, pkt: &Icmp) -> Verdict {
    if !take_token(clock::now()) {
        return (xdp_action::XDP_DROP, counter::DROP_ICMP_RATE);
    }
    let (data, data_end) = (ctx.data(), ctx.data_end());
    let (Some(eth), Some(ip), Some(icmp)) = (
        ptr_at_mut_checked::<EthHdr>(data, data_end, 0),
        ptr_at_mut_checked::<Ipv6Hdr>(data, data_end, pkt.l3_off),
        ptr_at_mut::<[u8; 4]>(data, data_end, pkt.l4_off),
    ) else {
        return (xdp_action::XDP_DROP, counter::DROP_MALFORMED);
    };
    // SAFETY: bounds-checked pointers to byte-array headers.
    unsafe {
        core::mem::swap(&mut (*eth).src_addr, &mut (*eth).dst_addr);
        (*ip).hop_limit = REPLY_HOP_LIMIT;
        // Swapped addresses leave the pseudo-header's sum as it is; the type changes it.
        (*ip).src_addr = addr6_octets(pkt.daddr);
        (*ip).dst_addr = addr6_octets(pkt.saddr);
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

/// An error from the client side about VIP:port → client:port: to the flow's backend.
#[inline(always)]
fn from_client(ctx: &XdpContext, pkt: &Icmp) -> Verdict {
    let no_flow = (xdp_action::XDP_DROP, counter::DROP_ICMP_NO_FLOW);
    let (data, data_end) = (ctx.data(), ctx.data_end());
    let Some(w) = work() else { return no_flow };
    if !quote(data, data_end, pkt, &mut w.quote) || w.quote.src() != pkt.daddr {
        return no_flow;
    }
    let q = &w.quote;
    let p = params();
    let now = clock::now();
    w.key = FlowKey6::new(q.dst(), q.src(), q.dport, q.sport, q.proto);
    let Some(slot) = ct_find::<V6>(&w.key, w.key.hash(), p) else {
        return no_flow;
    };
    // SAFETY: a map value of plain integers.
    let e = unsafe { &(*slot).entry };
    if !ct_live(e, now, p) {
        return no_flow;
    }
    let Some(backend) = V6::backends().get(e.backend_id) else {
        return no_flow;
    };
    if pkt.ttl <= 1 {
        return (xdp_action::XDP_DROP, counter::DROP_TTL);
    }
    let nh = match fib::to_backend::<V6>(ctx, e.backend_id, backend, PROTO_ICMPV6, now) {
        Ok(nh) => nh,
        Err(reason) => return (xdp_action::XDP_DROP, reason),
    };
    if backend.flags & backend_flags::ENCAP != 0 {
        return encap::error_to_backend::<V6>(ctx, pkt, backend, &nh, w.key.hash());
    }
    w.rw = Translation {
        outer: pair(&backend.snat_addr, &backend.addr),
        addrs: pair(&backend.addr, &backend.snat_addr),
        sport: backend.port,
        dport: e.snat_port,
        smac: nh.smac,
        dmac: nh.dmac,
    };
    w.outer = pair(&pkt.saddr, &pkt.daddr);
    if translate(data, data_end, pkt, w).is_none() {
        return (xdp_action::XDP_DROP, counter::DROP_MALFORMED);
    }
    stats::count(counter::ICMP_TRANSLATED_IN);
    send_out(ctx, nh.ifindex)
}

/// The ICMPv4 code of an ICMPv6 destination unreachable code, for the passive checks (which
/// name ICMPv4 codes): no route → net (0), address → host (1), port → port (3), the policy
/// codes (administratively prohibited, failed policy, reject route) → 13, others → host.
#[inline(always)]
fn v4_code(code: u8) -> u8 {
    match code {
        0 => 0,
        4 => 3,
        1 | 5 | 6 => 13,
        _ => 1,
    }
}

/// ICMPv6 to a SNAT address. An error about a flow to a backend (quoting SNAT:port →
/// backend:port) goes to the flow's client; `None` for anything else (the host's own: neighbour
/// discovery, its pings, errors about its own connections and probes): passed.
#[inline(always)]
fn to_snat(ctx: &XdpContext, pkt: &Icmp) -> Option<Verdict> {
    let (data, data_end) = (ctx.data(), ctx.data_end());
    let head = read_at::<[u8; 2]>(data, data_end, pkt.l4_off)?;
    if !matches!(head[0], DEST_UNREACH | PACKET_TOO_BIG | TIME_EXCEEDED) {
        return None;
    }
    let w = work()?;
    if !quote(data, data_end, pkt, &mut w.quote) || w.quote.src() != pkt.daddr {
        return None;
    }
    let q = &w.quote;
    let p = params();
    w.key = FlowKey6::new(q.dst(), q.src(), q.dport, q.sport, q.proto);
    let slot = nat_find::<V6>(&w.key, w.key.hash(), p)?;
    // SAFETY: a map value of plain integers.
    let nat = unsafe { &(*slot).entry };
    let now = clock::now();
    if head[0] == DEST_UNREACH {
        w.key = FlowKey6::new(
            nat.client_addr,
            nat.vip_addr,
            nat.client_port,
            nat.vip_port,
            w.quote.proto,
        );
        if let Some(slot) = ct_find::<V6>(&w.key, w.key.hash(), p) {
            // SAFETY: a map value of plain integers.
            let e = unsafe { &mut (*slot).entry };
            if e.backend_id == nat.backend_id && e.snat_port == w.quote.sport && ct_live(e, now, p)
            {
                passive::unreachable(e, nat, w.quote.proto, v4_code(head[1]));
            }
        }
    }
    if p.flags & param_flags::TRANSLATE_ICMP == 0 {
        return None;
    }
    if pkt.ttl <= 1 {
        return Some((xdp_action::XDP_DROP, counter::DROP_TTL));
    }
    w.rw = Translation {
        outer: pair(&nat.vip_addr, &nat.client_addr),
        addrs: pair(&nat.client_addr, &nat.vip_addr),
        sport: nat.client_port,
        dport: nat.vip_port,
        smac: nat.lb_mac,
        dmac: nat.client_mac,
    };
    w.outer = pair(&pkt.saddr, &pkt.daddr);
    if translate(data, data_end, pkt, w).is_none() {
        return Some((xdp_action::XDP_DROP, counter::DROP_MALFORMED));
    }
    stats::count(counter::ICMP_TRANSLATED_OUT);
    Some(send_out(ctx, nat.ifindex))
}

#[inline(always)]
fn translate(data: usize, data_end: usize, pkt: &Icmp, w: &Work) -> Option<()> {
    let (q, rw) = (&w.quote, &w.rw);
    let eth = ptr_at_mut_checked::<EthHdr>(data, data_end, 0)?;
    let ip = ptr_at_mut_checked::<Ipv6Hdr>(data, data_end, pkt.l3_off)?;
    // The quote's offsets from the message's, not from the map (the verifier bounds packet
    // offsets it tracked, never values loaded from a map).
    let (q_ip, q_l4) = quoted_offsets(pkt);
    let qip = ptr_at_mut_checked::<Ipv6Hdr>(data, data_end, q_ip)?;
    let ports = ptr_at_mut_checked::<[u8; 4]>(data, data_end, q_l4)?;
    let icmp_check = field(data, data_end, pkt.end, pkt.l4_off + 2)?;
    // The quoted transport checksum, when the quote holds it.
    let l4_check = match q.proto {
        PROTO_TCP => field(data, data_end, pkt.end, q_l4 + 16),
        _ => field(data, data_end, pkt.end, q_l4 + 6),
    };
    // SAFETY: every pointer is bounds-checked; the headers are byte arrays.
    unsafe {
        let addrs = diff_words(&q.addrs, &rw.addrs);
        let dst = [rw.addrs[4], rw.addrs[5], rw.addrs[6], rw.addrs[7]];
        let ports_diff = diff16(q.sport, rw.sport) + diff16(q.dport, rw.dport);
        (*qip).src_addr = addr6_octets([rw.addrs[0], rw.addrs[1], rw.addrs[2], rw.addrs[3]]);
        (*qip).dst_addr = addr6_octets(dst);
        let (sport, dport) = (rw.sport.to_ne_bytes(), rw.dport.to_ne_bytes());
        *ports = [sport[0], sport[1], dport[0], dport[1]];
        // Everything changed that the ICMPv6 checksum covers: its pseudo-header's (outer)
        // addresses and the quoted packet's fields.
        let mut sum = addrs + ports_diff + diff_words(&w.outer, &rw.outer);
        if let Some(c) = l4_check {
            let old = u16::from_ne_bytes(*c);
            if !(q.proto == PROTO_UDP && old == 0) {
                let mut new = update(old, addrs + ports_diff);
                if q.proto == PROTO_UDP && new == 0 {
                    new = 0xffff; // 0 would mean "no checksum"
                }
                *c = new.to_ne_bytes();
                sum += diff16(old, new);
            }
        }
        *icmp_check = update(u16::from_ne_bytes(*icmp_check), sum).to_ne_bytes();
        (*ip).hop_limit -= 1;
        (*ip).src_addr = addr6_octets([rw.outer[0], rw.outer[1], rw.outer[2], rw.outer[3]]);
        (*ip).dst_addr = addr6_octets([rw.outer[4], rw.outer[5], rw.outer[6], rw.outer[7]]);
        (*eth).src_addr = rw.smac;
        (*eth).dst_addr = rw.dmac;
    }
    Some(())
}
