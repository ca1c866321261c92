//! The lb XDP program. This file only orchestrates: parse (IPv4 or IPv6) → look the address up →
//! a flow (forward or return) or ICMP for it → verdict. The flow logic is written once over the
//! address family (family.rs).
//! Each concern lives in its own module.
#![cfg_attr(target_arch = "bpf", no_std)]
#![cfg_attr(target_arch = "bpf", no_main)]

mod clock;
mod csum;
mod encap;
mod family;
mod fib;
mod flow;
mod icmp;
mod icmp6;
mod maps;
mod nat;
mod outer;
mod parse;
mod passive;
mod proxied;
use lb_ebpf::ptr;
mod quic; // shared with the decapsulator: lb-ebpf's library
mod ratelimit;
mod snat;
mod stats;
mod synproxy;
mod table;
mod toobig;
mod trace;
mod tunnel;
mod verdict;

#[cfg(target_arch = "bpf")]
mod prog {
    use aya_ebpf::{
        bindings::xdp_action,
        macros::{classifier, xdp},
        programs::{TcContext, XdpContext},
    };
    use lb_common::{ICMP_PROG, ICMP6_PROG, PROBE_REPLY_PROG, XDP6_PROG, addr_flags, counter};

    use crate::{
        family::{Family, V4, V6, lookup_addr},
        flow, icmp, icmp6,
        maps::PROGS,
        parse::{self, ETH_P_IP, ETH_P_IPV6, Parsed},
        stats, synproxy, toobig, trace, tunnel,
    };

    /// The balancer. Every packet ends in exactly one verdict counter.
    // Inlined into the entry point the macro wraps it in: saves a call and return per packet.
    #[xdp]
    #[inline(always)]
    pub fn lb_xdp(ctx: XdpContext) -> u32 {
        let (data, data_end) = (ctx.data(), ctx.data_end());
        let (action, reason) = match parse::link(data, data_end, true) {
            None => (xdp_action::XDP_PASS, counter::PASS_MALFORMED),
            Some((ETH_P_IP, l3_off)) => {
                classify::<V4>(&ctx, parse::ipv4(data, data_end, l3_off), ICMP_PROG)
            }
            Some((ETH_P_IPV6, _)) => {
                // IPv6 is a program of its own: inlined here, its stack and the IPv4 path's
                // went beyond the 512 bytes BPF allows, and apart each is verified on its own.
                // It counts its verdict. The tail call returns only when the slot is empty,
                // for a moment while lb loads.
                // SAFETY: the program array holds XDP programs of this object.
                let _ = unsafe { PROGS.tail_call(&ctx, XDP6_PROG) };
                (xdp_action::XDP_PASS, counter::PASS_NOT_IP)
            }
            Some(_) => (xdp_action::XDP_PASS, counter::PASS_NOT_IP),
        };
        trace::dropped(&ctx, (action, reason));
        stats::count(reason);
        action
    }

    /// The balancer's IPv6 half, tail-called by `lb_xdp` for every IPv6 frame.
    #[xdp]
    pub fn lb_xdp6(ctx: XdpContext) -> u32 {
        let (data, data_end) = (ctx.data(), ctx.data_end());
        let (action, reason) = match parse::link(data, data_end, false) {
            Some((ETH_P_IPV6, l3_off)) => {
                classify::<V6>(&ctx, parse::ipv6(data, data_end, l3_off), ICMP6_PROG)
            }
            // Not reached: the balancer hands over IPv6 only.
            _ => (xdp_action::XDP_PASS, counter::PASS_NOT_IP),
        };
        trace::dropped(&ctx, (action, reason));
        stats::count(reason);
        action
    }

    /// The SYN proxy of IPv4 services, tail-called by the balancer (see synproxy.rs): its
    /// first stage, and the two it hands over to.
    #[xdp]
    pub fn lb_synproxy(ctx: XdpContext) -> u32 {
        proxy_stage::<V4>(&ctx, synproxy::handle::<V4>)
    }

    #[xdp]
    pub fn lb_proxy_open(ctx: XdpContext) -> u32 {
        handed_stage::<V4>(&ctx, synproxy::handle_open::<V4>)
    }

    #[xdp]
    pub fn lb_proxy_xlate(ctx: XdpContext) -> u32 {
        handed_stage::<V4>(&ctx, synproxy::handle_translate::<V4>)
    }

    #[xdp]
    pub fn lb_proxy_syn(ctx: XdpContext) -> u32 {
        handed_stage::<V4>(&ctx, synproxy::handle_syn::<V4>)
    }

    /// The same for IPv6 services, tail-called by the balancer's IPv6 half.
    #[xdp]
    pub fn lb_synproxy6(ctx: XdpContext) -> u32 {
        proxy_stage::<V6>(&ctx, synproxy::handle::<V6>)
    }

    #[xdp]
    pub fn lb_proxy_open6(ctx: XdpContext) -> u32 {
        handed_stage::<V6>(&ctx, synproxy::handle_open::<V6>)
    }

    #[xdp]
    pub fn lb_proxy_xlate6(ctx: XdpContext) -> u32 {
        handed_stage::<V6>(&ctx, synproxy::handle_translate::<V6>)
    }

    #[xdp]
    pub fn lb_proxy_syn6(ctx: XdpContext) -> u32 {
        handed_stage::<V6>(&ctx, synproxy::handle_syn::<V6>)
    }

    /// A later stage of the SYN proxy, on the flow the first stage handed over; `stage`'s
    /// verdict counted.
    #[inline(always)]
    fn handed_stage<F: Family>(
        ctx: &XdpContext,
        stage: impl FnOnce(&XdpContext, &parse::Flow<F::A>) -> (u32, u32),
    ) -> u32 {
        let (action, reason) = match synproxy::handed_over::<F>(ctx) {
            Some(flow) => stage(ctx, &flow),
            None => (xdp_action::XDP_DROP, counter::DROP_MALFORMED),
        };
        trace::decided(ctx, (action, reason));
        trace::dropped(ctx, (action, reason));
        stats::count(reason);
        action
    }

    /// The SYN proxy's first stage: the packet parsed again (a tail call keeps nothing),
    /// `stage`'s verdict counted.
    #[inline(always)]
    fn proxy_stage<F: Family>(
        ctx: &XdpContext,
        stage: impl FnOnce(&XdpContext, &parse::Flow<F::A>) -> (u32, u32),
    ) -> u32 {
        let (data, data_end) = (ctx.data(), ctx.data_end());
        let (action, reason) = match F::parse(data, data_end) {
            Some(Parsed::Flow(flow)) => stage(ctx, &flow),
            _ => (xdp_action::XDP_DROP, counter::DROP_MALFORMED),
        };
        trace::decided(ctx, (action, reason));
        trace::dropped(ctx, (action, reason));
        stats::count(reason);
        action
    }

    /// ICMP for lb's addresses, tail-called by the balancer: echo replies of VIPs, errors about
    /// flows translated (see icmp.rs).
    #[xdp]
    pub fn lb_icmp(ctx: XdpContext) -> u32 {
        let (action, reason) = icmp::handle(&ctx);
        trace::dropped(&ctx, (action, reason));
        stats::count(reason);
        action
    }

    /// ICMPv6 for lb's IPv6 addresses, tail-called by the balancer (see icmp6.rs).
    #[xdp]
    pub fn lb_icmp6(ctx: XdpContext) -> u32 {
        let (action, reason) = icmp6::handle(&ctx);
        trace::dropped(&ctx, (action, reason));
        stats::count(reason);
        action
    }

    /// The answer to a packet too big for the path to its backend, tail-called by the balancer
    /// (see toobig.rs).
    #[xdp]
    pub fn lb_too_big(ctx: XdpContext) -> u32 {
        let (action, reason) = toobig::handle(&ctx);
        trace::dropped(&ctx, (action, reason));
        stats::count(reason);
        action
    }

    /// Replies to health probes through the tunnel, tail-called by the balancer for a packet
    /// from a VIP to one of lb's addresses that is no flow's reply (see tunnel.rs).
    #[xdp]
    pub fn lb_probe_reply(ctx: XdpContext) -> u32 {
        let (action, reason) = tunnel::reply(&ctx);
        stats::count(reason);
        action
    }

    /// TC egress of lb's interfaces: health probes through the tunnel leave encapsulated (see
    /// tunnel.rs); every other packet passes at once. Frames the balancer sends (XDP_TX,
    /// redirects) never come this way.
    #[classifier]
    pub fn lb_probe_encap(ctx: TcContext) -> i32 {
        tunnel::egress(&ctx)
    }

    /// The datapath trace's writer, tail-called behind the trace's gate by the programs above
    /// for a new flow or a drop: counts the verdict handed over and returns its action (see
    /// trace.rs).
    #[xdp]
    pub fn lb_trace(ctx: XdpContext) -> u32 {
        trace::run(&ctx)
    }

    /// Does nothing: the benchmark baseline and the peer program native veth XDP needs.
    #[xdp]
    pub fn lb_pass(_ctx: XdpContext) -> u32 {
        xdp_action::XDP_PASS
    }

    /// A parsed IP packet of family `F` to its verdict; ICMP for lb's addresses goes to the
    /// family's handler program `icmp_prog`.
    #[inline(always)]
    fn classify<F: Family>(ctx: &XdpContext, parsed: Parsed<F::A>, icmp_prog: u32) -> (u32, u32) {
        let flow = match parsed {
            Parsed::Malformed { daddr } => {
                return odd_packet::<F>(daddr, counter::PASS_MALFORMED, counter::DROP_MALFORMED);
            }
            Parsed::Odd { daddr, pass, drop } => return odd_packet::<F>(Some(daddr), pass, drop),
            Parsed::Icmp(pkt) => {
                let flags = lookup_addr::<F>(pkt.daddr);
                if flags & (addr_flags::SNAT | addr_flags::VIP) == 0 {
                    return (xdp_action::XDP_PASS, counter::PASS_NOT_VIP);
                }
                // ICMP for lb's addresses: the handler program (it counts the verdict). A
                // tail call returns only when the slot is empty, for a moment while lb loads.
                // SAFETY: the program array holds XDP programs of this object.
                let _ = unsafe { PROGS.tail_call(ctx, icmp_prog) };
                return if flags & addr_flags::VIP != 0 {
                    (xdp_action::XDP_DROP, counter::DROP_ICMP)
                } else {
                    (xdp_action::XDP_PASS, counter::PASS_NOT_VIP)
                };
            }
            Parsed::OtherL4 { daddr } => {
                // A VIP has no service of another protocol: dropped, never passed (a loop).
                return if lookup_addr::<F>(daddr) & addr_flags::VIP != 0 {
                    (xdp_action::XDP_DROP, counter::DROP_NO_SERVICE)
                } else {
                    (xdp_action::XDP_PASS, counter::PASS_NOT_VIP)
                };
            }
            Parsed::Flow(flow) => flow,
        };
        // One address lookup decides whether the packet is lb's at all.
        let flags = lookup_addr::<F>(flow.daddr);
        if flags == 0 {
            return (xdp_action::XDP_PASS, counter::PASS_NOT_VIP);
        }
        if flags & addr_flags::SNAT != 0 {
            if let Some(v) = flow::reply::<F, false>(ctx, &flow) {
                return v;
            }
            // No flow's reply. From a VIP: perhaps a reply to a health probe through the
            // tunnel, which a program of its own handles (see tunnel.rs): no balanced packet
            // goes that way, and code kept out of this function cannot change theirs (inlined
            // here, or called with the parsed flow, it cost encapsulated flows 4-9%, lb-bench).
            if lookup_addr::<F>(flow.saddr) & addr_flags::VIP != 0 {
                // SAFETY: the program array holds XDP programs of this object. A tail call
                // returns only when the slot is empty, for a moment while lb loads.
                let _ = unsafe { PROGS.tail_call(ctx, PROBE_REPLY_PROG) };
            }
        }
        if flags & addr_flags::VIP != 0 {
            return flow::forward::<F>(ctx, &flow, flags & addr_flags::QUIC != 0);
        }
        (xdp_action::XDP_PASS, counter::PASS_NOT_VIP)
    }

    /// Fragments and unparseable packets: dropped when addressed to a VIP (lb owns that address
    /// but cannot balance the packet), passed otherwise, also to SNAT addresses, which are the
    /// host's own (not ours to judge).
    #[inline(always)]
    fn odd_packet<F: Family>(daddr: Option<F::A>, pass: u32, drop: u32) -> (u32, u32) {
        let vip = daddr.is_some_and(|a| lookup_addr::<F>(a) & addr_flags::VIP != 0);
        if vip {
            (xdp_action::XDP_DROP, drop)
        } else {
            (xdp_action::XDP_PASS, pass)
        }
    }

    #[cfg(not(test))]
    #[panic_handler]
    fn panic(_info: &core::panic::PanicInfo) -> ! {
        loop {}
    }

    #[unsafe(link_section = "license")]
    #[unsafe(no_mangle)]
    static LICENSE: [u8; 4] = *b"GPL\0";
}

/// Host builds (`cargo clippy --workspace`) only type-check the modules.
#[cfg(not(target_arch = "bpf"))]
fn main() {}
