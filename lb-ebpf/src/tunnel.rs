//! Health probes through the tunnel (`check.through_tunnel`, see lb-common's `tunnel` module):
//! both ends of lb's part.
//!
//! - Out (TC egress, [`encapsulate`]): a packet whose mark is in the probes' range goes to its
//!   slot's VIP on the backend it was addressed to, inside the outer header the XDP program
//!   writes for the service's traffic (encap.rs's own functions: outer source = the probe's
//!   source, which is lb's address towards the backend as for traffic; GUE's source port and
//!   IPv6's flow label from the hash of the flow as the backend sees it). The reply's key is
//!   recorded first. A marked packet that cannot be encapsulated is dropped, never sent as it
//!   is: to the backend's own address it could be answered by a backend whose tunnel is broken,
//!   which is exactly what the probe is there to find.
//! - Back (XDP, [`reply`]): the backend answers from the VIP to lb's address, not encapsulated.
//!   Only a packet to one of lb's addresses that is no flow's reply and comes from a VIP gets
//!   here, in a program of its own the balancer tail-calls (`lb_probe_reply`); if the TC
//!   program recorded its connection, its source becomes the backend's address again
//!   (checksums updated) and the kernel hands it to the probe's socket.
#![cfg_attr(not(target_arch = "bpf"), allow(dead_code))]

use aya_ebpf::{
    EbpfContext as _,
    bindings::{
        __sk_buff, BPF_F_ADJ_ROOM_ENCAP_L3_IPV4, BPF_F_ADJ_ROOM_ENCAP_L3_IPV6,
        BPF_F_ADJ_ROOM_ENCAP_L4_UDP, BPF_F_MARK_MANGLED_0, BPF_F_PSEUDO_HDR,
        bpf_adj_room_mode::BPF_ADJ_ROOM_MAC, xdp_action,
    },
    helpers::bpf_csum_diff,
    maps::{Array, LruHashMap},
    programs::{TcContext, XdpContext},
};
use lb_common::{
    Addr6, FlowKeyOf, PROTO_TCP, PROTO_UDP, ProbeReplyOf, TunnelProbeOf, addr_flags, backend_flags,
    counter, encap_overhead, tunnel_slot,
};
use network_types::{ip::Ipv4Hdr, ip::Ipv6Hdr, tcp::TcpHdr, udp::UdpHdr};

use crate::{
    csum::update,
    encap,
    family::{Family, V4, V6, lookup_addr},
    maps::{PROBE_REPLIES, PROBE_REPLIES6, TUNNEL_PROBES, TUNNEL_PROBES6},
    parse::{self, ETH_P_IP, ETH_P_IPV6, Flow, Parsed},
    ptr::{ptr_at_mut, ptr_at_mut_checked, store_addr6},
    stats,
    verdict::Verdict,
};

/// TC verdicts (linux/pkt_cls.h's TC_ACT_OK, TC_ACT_SHOT; the bindings' type differs between
/// the host and the BPF target).
const TC_ACT_OK: i32 = 0;
const TC_ACT_SHOT: i32 = 2;

/// What a family adds for probes through the tunnel: its maps, its outer header's flag for
/// `bpf_skb_adjust_room`, and the two address rewrites.
pub trait Probed: Family {
    fn tunnel_probes() -> &'static Array<TunnelProbeOf<Self::A>>;
    fn probe_replies() -> &'static LruHashMap<FlowKeyOf<Self::A>, ProbeReplyOf<Self::A>>;
    /// `BPF_F_ADJ_ROOM_ENCAP_L3_*` of this family's outer header.
    const ADJ_ROOM_L3: u64;
    /// Rewrites the destination of the skb's IP header at `l3_off` from `old` to `new`, with
    /// the kernel's checksum helpers (a probe's TCP checksum may still be partial: only
    /// `bpf_l4_csum_replace` knows how to update one), the transport checksum at `csum_off`
    /// too (`udp`: a UDP one, 0 staying 0).
    fn set_destination(
        ctx: &TcContext,
        l3_off: usize,
        csum_off: usize,
        udp: bool,
        old: &Self::A,
        new: &Self::A,
    ) -> Option<()>;
    /// Writes `new` as the source of the IP header at `l3_off`, `diff` being the addresses'
    /// checksum change (IPv4's header checksum covers it). The TTL stays: the packet is for
    /// this host.
    fn set_source(
        data: usize,
        data_end: usize,
        l3_off: usize,
        new: &Self::A,
        diff: u32,
    ) -> Option<()>;
}

impl Probed for V4 {
    const ADJ_ROOM_L3: u64 = BPF_F_ADJ_ROOM_ENCAP_L3_IPV4 as u64;
    #[inline(always)]
    fn tunnel_probes() -> &'static Array<TunnelProbeOf<u32>> {
        &TUNNEL_PROBES
    }
    #[inline(always)]
    fn probe_replies() -> &'static LruHashMap<FlowKeyOf<u32>, ProbeReplyOf<u32>> {
        &PROBE_REPLIES
    }
    #[inline(always)]
    fn set_destination(
        ctx: &TcContext,
        l3_off: usize,
        csum_off: usize,
        udp: bool,
        old: &u32,
        new: &u32,
    ) -> Option<()> {
        let (old, new) = (u64::from(*old), u64::from(*new));
        // IPv4's header checksum is at 10, its destination at 16.
        ctx.l3_csum_replace(l3_off + 10, old, new, 4).ok()?;
        ctx.l4_csum_replace(csum_off, old, new, l4_flags(udp) | 4)
            .ok()?;
        ctx.store(l3_off + 16, &(new as u32), 0).ok()
    }
    #[inline(always)]
    fn set_source(data: usize, data_end: usize, l3_off: usize, new: &u32, diff: u32) -> Option<()> {
        let ip = ptr_at_mut::<Ipv4Hdr>(data, data_end, l3_off)?;
        // SAFETY: bounds-checked; network-types headers are byte arrays.
        unsafe {
            let check = update(u16::from_ne_bytes((*ip).check), diff);
            (*ip).check = check.to_ne_bytes();
            (*ip).src_addr = new.to_ne_bytes();
        }
        Some(())
    }
}

impl Probed for V6 {
    const ADJ_ROOM_L3: u64 = BPF_F_ADJ_ROOM_ENCAP_L3_IPV6 as u64;
    #[inline(always)]
    fn tunnel_probes() -> &'static Array<TunnelProbeOf<Addr6>> {
        &TUNNEL_PROBES6
    }
    #[inline(always)]
    fn probe_replies() -> &'static LruHashMap<FlowKeyOf<Addr6>, ProbeReplyOf<Addr6>> {
        &PROBE_REPLIES6
    }
    /// No header checksum; the transport checksum through the addresses' difference (the
    /// helper takes 2 or 4 bytes, or a difference summed by `bpf_csum_diff`).
    #[inline(always)]
    fn set_destination(
        ctx: &TcContext,
        l3_off: usize,
        csum_off: usize,
        udp: bool,
        old: &Addr6,
        new: &Addr6,
    ) -> Option<()> {
        // SAFETY: the helper reads 16 bytes of each address.
        let diff = unsafe {
            bpf_csum_diff(
                old.as_ptr() as *mut u32,
                16,
                new.as_ptr() as *mut u32,
                16,
                0,
            )
        };
        if diff < 0 {
            return None;
        }
        ctx.l4_csum_replace(csum_off, 0, diff as u64, l4_flags(udp))
            .ok()?;
        // The destination is at 24 in an IPv6 header.
        ctx.store(l3_off + 24, new, 0).ok()
    }
    #[inline(always)]
    fn set_source(
        data: usize,
        data_end: usize,
        l3_off: usize,
        new: &Addr6,
        _diff: u32,
    ) -> Option<()> {
        let ip = ptr_at_mut::<Ipv6Hdr>(data, data_end, l3_off)?;
        // SAFETY: bounds-checked; the address is 2-aligned (see `store_addr6`).
        unsafe { store_addr6((*ip).src_addr.as_mut_ptr(), new) };
        Some(())
    }
}

/// `bpf_l4_csum_replace`'s flags for a change of an address (in the pseudo-header); a UDP
/// checksum of 0 ("none", IPv4 only) stays 0.
#[inline(always)]
fn l4_flags(udp: bool) -> u64 {
    let mut flags = BPF_F_PSEUDO_HDR as u64;
    if udp {
        flags |= BPF_F_MARK_MANGLED_0 as u64;
    }
    flags
}

/// The TC egress program's work: `TC_ACT_OK` at once for a packet without a probe's mark
/// (the host's traffic pays a load and a compare); a probe's packet encapsulated, or dropped.
#[inline(always)]
pub fn egress(ctx: &TcContext) -> i32 {
    // SAFETY: the context of a TC program is its __sk_buff.
    let mark = unsafe { (*(ctx.as_ptr() as *const __sk_buff)).mark };
    let Some(slot) = tunnel_slot(mark) else {
        return TC_ACT_OK;
    };
    let reason = match encapsulate(ctx, slot) {
        Some(()) => counter::PROBE_ENCAPSULATED,
        None => counter::PROBE_DROPPED,
    };
    stats::count(reason);
    if reason == counter::PROBE_ENCAPSULATED {
        TC_ACT_OK
    } else {
        TC_ACT_SHOT
    }
}

/// A marked packet of tunnel slot `slot` encapsulated; `None` if it cannot be.
#[inline(always)]
fn encapsulate(ctx: &TcContext, slot: u32) -> Option<()> {
    // A probe's packets are small: make all of one linear, for direct packet access reads the
    // linear part only (a TCP socket's data is in pages; 0 would pull the linear part alone),
    // and parsing checks the headers' lengths against the whole datagram.
    ctx.pull_data(ctx.len()).ok()?;
    let (data, data_end) = (ctx.data(), ctx.data_end());
    match parse::link(data, data_end, false)? {
        (ETH_P_IP, l3_off) => match parse::ipv4(data, data_end, l3_off) {
            Parsed::Flow(flow) => to_vip::<V4>(ctx, &flow, slot),
            _ => None,
        },
        (ETH_P_IPV6, l3_off) => match parse::ipv6(data, data_end, l3_off) {
            Parsed::Flow(flow) => to_vip::<V6>(ctx, &flow, slot),
            _ => None,
        },
        _ => None,
    }
}

/// The probe packet of `flow` to the VIP of `slot` on its backend, encapsulated.
#[inline(always)]
fn to_vip<F: Probed>(ctx: &TcContext, flow: &Flow<F::A>, slot: u32) -> Option<()> {
    let t = F::tunnel_probes().get(slot)?;
    let (backend, vip, flags) = (t.backend, t.vip, t.flags);
    // A free slot, or a packet for another host than the slot's backend (a mark reused by
    // something else): not ours to send anywhere.
    if flags & backend_flags::ENCAP == 0 || flow.daddr != backend {
        return None;
    }
    let (saddr, sport, dport, proto) = (flow.saddr, flow.sport, flow.dport, flow.proto);
    // The backend answers from the VIP to this source: the XDP program will look for it.
    let reply = FlowKeyOf::new(vip, saddr, dport, sport, proto);
    F::probe_replies()
        .insert(&reply, &ProbeReplyOf { backend }, 0)
        .ok()?;
    let csum_off = match proto {
        PROTO_TCP => flow.l4_off + core::mem::offset_of!(TcpHdr, check),
        PROTO_UDP => flow.l4_off + core::mem::offset_of!(UdpHdr, check),
        _ => return None,
    };
    let l3_off = flow.l3_off;
    F::set_destination(ctx, l3_off, csum_off, proto == PROTO_UDP, &backend, &vip)?;
    // The flow as the backend sees it (client → VIP), hashed as the XDP program hashes the
    // service's flows: the same spread of GUE source ports and flow labels.
    let hash = FlowKeyOf::new(saddr, vip, sport, dport, proto).hash();
    let gue = flags & backend_flags::ENCAP_GUE != 0;
    let overhead = encap_overhead(F::HDR_LEN, gue);
    let mut room = F::ADJ_ROOM_L3;
    if gue {
        room |= BPF_F_ADJ_ROOM_ENCAP_L4_UDP as u64;
    }
    // Room right after the link header (which stays: the route to the backend made it); the
    // kernel marks the skb encapsulated, so a partial inner checksum is finished in the right
    // place.
    ctx.adjust_room(overhead as i32, BPF_ADJ_ROOM_MAC, room)
        .ok()?;
    let (data, data_end) = (ctx.data(), ctx.data_end());
    let offs = (l3_off, l3_off + overhead as usize);
    let outer_proto = if gue { PROTO_UDP } else { F::ENCAP_PROTO };
    let addr_sum = F::addr_sum(&saddr, &backend);
    let len = F::write_outer(
        data,
        data_end,
        offs,
        (&saddr, &backend, addr_sum),
        outer_proto,
        hash,
    )?;
    if gue {
        encap::gue_header::<F>(data, data_end, offs, len, addr_sum, hash)?;
    }
    Some(())
}

/// The program the balancer hands a packet from a VIP to one of lb's addresses that is no
/// flow's reply: if the TC program recorded its connection, it is a through-tunnel probe's
/// reply, whose source becomes its backend again before the kernel takes it
/// (`pass_probe_reply`); otherwise it is passed as the balancer would (`pass_not_vip`).
#[inline(always)]
pub fn reply(ctx: &XdpContext) -> Verdict {
    let (data, data_end) = (ctx.data(), ctx.data_end());
    match parse::link(data, data_end, false) {
        Some((ETH_P_IP, l3_off)) => {
            if let Parsed::Flow(flow) = parse::ipv4(data, data_end, l3_off) {
                return reply_of::<V4>(ctx, &flow);
            }
        }
        Some((ETH_P_IPV6, l3_off)) => {
            if let Parsed::Flow(flow) = parse::ipv6(data, data_end, l3_off) {
                return reply_of::<V6>(ctx, &flow);
            }
        }
        _ => {}
    }
    // Not reached: the balancer hands over TCP and UDP packets it parsed.
    (xdp_action::XDP_PASS, counter::PASS_NOT_VIP)
}

#[inline(always)]
fn reply_of<F: Probed>(ctx: &XdpContext, flow: &Flow<F::A>) -> Verdict {
    let not_one = (xdp_action::XDP_PASS, counter::PASS_NOT_VIP);
    if lookup_addr::<F>(flow.saddr) & addr_flags::VIP == 0 {
        return not_one;
    }
    let k = FlowKeyOf::new(flow.saddr, flow.daddr, flow.sport, flow.dport, flow.proto);
    // SAFETY: read-only use of a plain-integer value.
    let Some(backend) = (unsafe { F::probe_replies().get(&k) }).map(|r| r.backend) else {
        return not_one;
    };
    let (data, data_end) = (ctx.data(), ctx.data_end());
    let malformed = (xdp_action::XDP_DROP, counter::DROP_MALFORMED);
    let diff = F::addr_diff(&flow.saddr, &backend);
    if F::set_source(data, data_end, flow.l3_off, &backend, diff).is_none() {
        return malformed;
    }
    // The pseudo-header's source changed (by `diff`); the ports did not.
    let check_at = match flow.proto {
        PROTO_TCP => core::mem::offset_of!(TcpHdr, check),
        _ => core::mem::offset_of!(UdpHdr, check),
    };
    let Some(check) = ptr_at_mut_checked::<[u8; 2]>(data, data_end, flow.l4_off + check_at) else {
        return malformed;
    };
    // SAFETY: bounds-checked.
    unsafe {
        let old = u16::from_ne_bytes(*check);
        // A UDP checksum of 0 (none, IPv4) stays 0.
        if flow.proto == PROTO_TCP || old != 0 {
            let new = match update(old, diff) {
                0 if flow.proto == PROTO_UDP => 0xffff,
                c => c,
            };
            *check = new.to_ne_bytes();
        }
    }
    (xdp_action::XDP_PASS, counter::PASS_PROBE_REPLY)
}
