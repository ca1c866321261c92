//! Next hop towards a backend from the kernel's routing and neighbour tables (bpf_fib_lookup,
//! AF_INET or AF_INET6 by the backend's family), restricted to interfaces lb can transmit on.
#![cfg_attr(not(target_arch = "bpf"), allow(dead_code))]

use aya_ebpf::{
    bindings::{
        BPF_FIB_LKUP_RET_FRAG_NEEDED, BPF_FIB_LKUP_RET_NO_NEIGH, BPF_FIB_LKUP_RET_SUCCESS,
        bpf_fib_lookup as FibParams,
    },
    helpers::bpf_fib_lookup,
    programs::XdpContext,
};
use lb_common::{BackendInfoOf, NextHop, counter};

use crate::{
    family::Family,
    maps::{NEXTHOPS, TX_PORTS},
    ptr::opaque,
};

/// Age after which a cached next hop is looked up again.
const REFRESH_NS: u64 = 1_000_000_000;

/// The next hop towards backend `id`: this CPU's cached one, looked up again when older than
/// a second. `Err(drop counter)` if there is none.
#[inline(always)]
pub fn to_backend<F: Family>(
    ctx: &XdpContext,
    id: u32,
    b: &BackendInfoOf<F::A>,
    proto: u8,
    now: u64,
) -> Result<NextHop, u32> {
    let Some(cached) = NEXTHOPS.get_ptr_mut(id) else {
        return Err(counter::DROP_NO_ROUTE);
    };
    // SAFETY: this CPU's slot of a per-CPU array of plain integers.
    let cached = unsafe { &mut *cached };
    if cached.updated != 0 && now.saturating_sub(cached.updated) <= REFRESH_NS {
        return Ok(*cached);
    }
    match lookup::<F>(ctx, b, proto, cached) {
        0 => {
            cached.updated = now;
            Ok(*cached)
        }
        reason => Err(reason),
    }
}

/// Routes `b.snat_addr → b.addr` as the kernel would forward it into `out` (its `updated` left
/// as it is): the interface, the MACs and the path's MTU; 0, or the drop counter if it cannot
/// be used.
// Not inlined: a lookup runs once a second per backend and CPU, and its 64-byte parameters
// then take no room in the caller's stack frame (the IPv6 program has little to spare).
// A BPF-to-BPF call passes at most five arguments, and the pointers are opaque (see
// `ptr::opaque`).
#[inline(never)]
fn lookup<F: Family>(
    ctx: &XdpContext,
    b: &BackendInfoOf<F::A>,
    proto: u8,
    out: &mut NextHop,
) -> u32 {
    let (ctx, b) = (opaque(ctx), opaque(b));
    // SAFETY: all-zero is a valid bpf_fib_lookup (plain integers and unions of them).
    let mut p: FibParams = unsafe { core::mem::zeroed() };
    // The MTU first: a length no path takes makes the kernel answer "fragmentation needed"
    // with the MTU it forwards with (the interface's; a route's own when locked, or a learned
    // path MTU), before it looks at neighbours; the lookup after it, of length 0, fills in the
    // MACs.
    F::fib_addrs(&mut p, b.snat_addr, b.addr);
    p.l4_protocol = proto;
    p.__bindgen_anon_1.tot_len = u16::MAX;
    p.ifindex = ctx.ingress_ifindex() as u32;
    let mtu = match fib(ctx, &mut p) {
        // SAFETY: on "fragmentation needed" the kernel wrote the MTU into the union.
        BPF_FIB_LKUP_RET_FRAG_NEEDED => u32::from(unsafe { p.__bindgen_anon_1.mtu_result }),
        BPF_FIB_LKUP_RET_SUCCESS | BPF_FIB_LKUP_RET_NO_NEIGH => u32::from(u16::MAX),
        _ => return counter::DROP_NO_ROUTE,
    };
    F::fib_addrs(&mut p, b.snat_addr, b.addr);
    p.__bindgen_anon_1.tot_len = 0;
    p.ifindex = ctx.ingress_ifindex() as u32;
    match fib(ctx, &mut p) {
        BPF_FIB_LKUP_RET_SUCCESS => {}
        BPF_FIB_LKUP_RET_NO_NEIGH => return counter::DROP_NO_NEIGH,
        _ => return counter::DROP_NO_ROUTE,
    }
    if p.ifindex != ctx.ingress_ifindex() as u32 && TX_PORTS.get_ifindex(p.ifindex).is_none() {
        return counter::DROP_NO_ROUTE;
    }
    // SAFETY: on success the kernel filled the MAC variant of the union.
    let macs = unsafe { p.__bindgen_anon_6.__bindgen_anon_2 };
    out.ifindex = p.ifindex;
    out.mtu = mtu;
    out.addr_sum = F::addr_sum(&b.snat_addr, &b.addr);
    out.smac = macs.smac;
    out.dmac = macs.dmac;
    0
}

/// One route lookup with `p`: the kernel's return code.
#[inline(always)]
fn fib(ctx: &XdpContext, p: &mut FibParams) -> u32 {
    // SAFETY: valid context and parameter pointers of the right size.
    let rc = unsafe {
        bpf_fib_lookup(
            ctx.ctx as *mut _,
            p,
            core::mem::size_of::<FibParams>() as i32,
            0,
        )
    };
    rc as u32
}
