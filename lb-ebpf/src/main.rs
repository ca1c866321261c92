//! The lb XDP program. This file only orchestrates: parse → look the service up → verdict.
//! Each concern lives in its own module.
#![cfg_attr(target_arch = "bpf", no_std)]
#![cfg_attr(target_arch = "bpf", no_main)]

mod maps;
mod parse;
mod ptr;
mod stats;

#[cfg(target_arch = "bpf")]
mod prog {
    use aya_ebpf::{bindings::xdp_action, macros::xdp, programs::XdpContext};
    use lb_common::{ServiceKey, counter};

    use crate::{
        maps::{SERVICES, VIP_ADDRS},
        parse::{self, Parsed},
        stats,
    };

    /// The balancer. Every packet ends in exactly one verdict counter.
    #[xdp]
    pub fn lb_xdp(ctx: XdpContext) -> u32 {
        let (action, reason) = classify(&ctx);
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
            Parsed::OtherL4 => return (xdp_action::XDP_PASS, counter::PASS_NOT_VIP),
            Parsed::Flow(flow) => flow,
        };
        let key = ServiceKey {
            addr: flow.daddr,
            port: flow.dport,
            proto: flow.proto,
            _pad: 0,
        };
        // SAFETY: the value is only read, and the map holds plain integers.
        let Some(service) = (unsafe { SERVICES.get(&key) }) else {
            return (xdp_action::XDP_PASS, counter::PASS_NOT_VIP);
        };
        stats::count_service(service.id, ctx.data_end() - ctx.data());
        // Forwarding is not built yet: VIP traffic goes to the kernel, counted.
        (xdp_action::XDP_PASS, counter::VIP_HIT)
    }

    /// Fragments and unparseable packets: dropped when addressed to a VIP address (lb owns that
    /// address but cannot balance the packet), passed otherwise (not ours to judge).
    #[inline(always)]
    fn odd_packet(daddr: Option<u32>, pass: u32, drop: u32) -> (u32, u32) {
        match daddr {
            Some(addr) if VIP_ADDRS.get_ptr(&addr).is_some() => (xdp_action::XDP_DROP, drop),
            _ => (xdp_action::XDP_PASS, pass),
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
