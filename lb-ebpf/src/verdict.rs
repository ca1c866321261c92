//! A packet's verdict (the XDP action and the counter that counts it) and the way a rewritten
//! frame leaves: shared by the balancer's directions, the encapsulation and the ICMP handlers.
#![cfg_attr(not(target_arch = "bpf"), allow(dead_code))]

use aya_ebpf::{bindings::xdp_action, programs::XdpContext};
use lb_common::counter;

use crate::maps::TX_PORTS;

/// (XDP action, verdict counter).
pub type Verdict = (u32, u32);

/// Sends the (rewritten) frame out of `ifindex`: XDP_TX when that is where it came in,
/// XDP_REDIRECT through the devmap otherwise.
#[inline(always)]
pub fn send_out(ctx: &XdpContext, ifindex: u32) -> Verdict {
    if ifindex == ctx.ingress_ifindex() as u32 {
        return (xdp_action::XDP_TX, counter::FWD_TX);
    }
    match TX_PORTS.redirect(ifindex, 0) {
        Ok(action) => (action, counter::FWD_REDIRECT),
        Err(_) => (xdp_action::XDP_DROP, counter::DROP_NO_ROUTE),
    }
}
