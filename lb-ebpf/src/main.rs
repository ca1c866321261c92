//! The lb XDP program. This file only orchestrates: parse → look the address up → a flow (forward
//! or return) or ICMP for it → verdict.
//! Each concern lives in its own module.
#![cfg_attr(target_arch = "bpf", no_std)]
#![cfg_attr(target_arch = "bpf", no_main)]

mod clock;
mod csum;
mod fib;
mod flow;
mod icmp;
mod maps;
mod nat;
mod parse;
mod passive;
mod ptr;
mod ratelimit;
mod snat;
mod stats;
mod table;

#[cfg(target_arch = "bpf")]
mod prog {
    use aya_ebpf::{bindings::xdp_action, macros::xdp, programs::XdpContext};
    use lb_common::{ICMP_PROG, addr_flags, counter};

    use crate::{
        flow, icmp,
        maps::{PROGS, lookup_addr},
        parse::{self, Parsed},
        stats,
    };

    /// The balancer. Every packet ends in exactly one verdict counter.
    // Inlined into the entry point the macro wraps it in: saves a call and return per packet.
    #[xdp]
    #[inline(always)]
    pub fn lb_xdp(ctx: XdpContext) -> u32 {
        let (action, reason) = classify(&ctx);
        stats::count(reason);
        action
    }

    /// ICMP for lb's addresses, tail-called by the balancer: echo replies of VIPs, errors about
    /// flows translated (see icmp.rs).
    #[xdp]
    pub fn lb_icmp(ctx: XdpContext) -> u32 {
        let (action, reason) = icmp::handle(&ctx);
        stats::count(reason);
        action
    }

    /// Does nothing: the benchmark baseline and the peer program native veth XDP needs.
    #[xdp]
    pub fn lb_pass(_ctx: XdpContext) -> u32 {
        xdp_action::XDP_PASS
    }

    #[inline(always)]
    fn classify(ctx: &XdpContext) -> (u32, u32) {
        let flow = match parse::parse(ctx.data(), ctx.data_end()) {
            Parsed::NotIpv4 => return (xdp_action::XDP_PASS, counter::PASS_NOT_IPV4),
            Parsed::Malformed { daddr } => {
                return odd_packet(daddr, counter::PASS_MALFORMED, counter::DROP_MALFORMED);
            }
            Parsed::Fragment { daddr } => {
                return odd_packet(Some(daddr), counter::PASS_FRAGMENT, counter::DROP_FRAGMENT);
            }
            Parsed::Icmp(pkt) => {
                let flags = lookup_addr(pkt.daddr);
                if flags & (addr_flags::SNAT | addr_flags::VIP) == 0 {
                    return (xdp_action::XDP_PASS, counter::PASS_NOT_VIP);
                }
                // ICMP for lb's addresses: the handler program (it counts the verdict). A
                // tail call returns only when the slot is empty, for a moment while lb loads.
                // SAFETY: the program array holds XDP programs of this object.
                let _ = unsafe { PROGS.tail_call(ctx, ICMP_PROG) };
                return if flags & addr_flags::VIP != 0 {
                    (xdp_action::XDP_DROP, counter::DROP_ICMP)
                } else {
                    (xdp_action::XDP_PASS, counter::PASS_NOT_VIP)
                };
            }
            Parsed::OtherL4 { daddr } => {
                // A VIP has no service of another protocol: dropped, never passed (a loop).
                return if lookup_addr(daddr) & addr_flags::VIP != 0 {
                    (xdp_action::XDP_DROP, counter::DROP_NO_SERVICE)
                } else {
                    (xdp_action::XDP_PASS, counter::PASS_NOT_VIP)
                };
            }
            Parsed::Flow(flow) => flow,
        };
        // One address lookup decides whether the packet is lb's at all.
        let flags = lookup_addr(flow.daddr);
        if flags == 0 {
            return (xdp_action::XDP_PASS, counter::PASS_NOT_VIP);
        }
        if flags & addr_flags::SNAT != 0 {
            if let Some(v) = flow::reply(ctx, &flow) {
                return v;
            }
        }
        if flags & addr_flags::VIP != 0 {
            return flow::forward(ctx, &flow);
        }
        (xdp_action::XDP_PASS, counter::PASS_NOT_VIP)
    }

    /// Fragments and unparseable packets: dropped when addressed to a VIP (lb owns that address
    /// but cannot balance the packet), passed otherwise, also to SNAT addresses, which are the
    /// host's own (not ours to judge).
    #[inline(always)]
    fn odd_packet(daddr: Option<u32>, pass: u32, drop: u32) -> (u32, u32) {
        let vip = daddr.is_some_and(|a| lookup_addr(a) & addr_flags::VIP != 0);
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
