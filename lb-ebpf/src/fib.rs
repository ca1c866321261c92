//! Next hop towards a backend from the kernel's routing and neighbour tables (bpf_fib_lookup),
//! restricted to interfaces lb can transmit on.
#![cfg_attr(not(target_arch = "bpf"), allow(dead_code))]

use aya_ebpf::{
    bindings::{BPF_FIB_LKUP_RET_NO_NEIGH, BPF_FIB_LKUP_RET_SUCCESS, bpf_fib_lookup as FibParams},
    helpers::bpf_fib_lookup,
    programs::XdpContext,
};
use lb_common::{BackendInfo, NextHop, counter};

use crate::maps::{NEXTHOPS, TX_PORTS};

const AF_INET: u8 = 2;
/// Age after which a cached next hop is looked up again.
const REFRESH_NS: u64 = 1_000_000_000;

/// The next hop towards backend `id`: this CPU's cached one, looked up again when older than
/// a second. `Err(drop counter)` if there is none.
#[inline(always)]
pub fn to_backend(
    ctx: &XdpContext,
    id: u32,
    b: &BackendInfo,
    proto: u8,
    tot_len: u16,
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
    let mut nh = lookup(ctx, b.snat_addr, b.addr, proto, tot_len)?;
    nh.updated = now;
    *cached = nh;
    Ok(nh)
}

/// Route `src → dst` as the kernel would forward it; `Err(drop counter)` if it cannot be used.
#[inline(always)]
pub fn lookup(
    ctx: &XdpContext,
    src: u32,
    dst: u32,
    proto: u8,
    tot_len: u16,
) -> Result<NextHop, u32> {
    // SAFETY: all-zero is a valid bpf_fib_lookup (plain integers and unions of them).
    let mut p: FibParams = unsafe { core::mem::zeroed() };
    p.family = AF_INET;
    p.l4_protocol = proto;
    p.__bindgen_anon_1.tot_len = tot_len;
    p.ifindex = ctx.ingress_ifindex() as u32;
    p.__bindgen_anon_3.ipv4_src = src;
    p.__bindgen_anon_4.ipv4_dst = dst;
    // SAFETY: valid context and parameter pointers of the right size.
    let rc = unsafe {
        bpf_fib_lookup(
            ctx.ctx as *mut _,
            &mut p,
            core::mem::size_of::<FibParams>() as i32,
            0,
        )
    };
    match rc as u32 {
        BPF_FIB_LKUP_RET_SUCCESS => {}
        BPF_FIB_LKUP_RET_NO_NEIGH => return Err(counter::DROP_NO_NEIGH),
        _ => return Err(counter::DROP_NO_ROUTE),
    }
    if p.ifindex != ctx.ingress_ifindex() as u32 && TX_PORTS.get_ifindex(p.ifindex).is_none() {
        return Err(counter::DROP_NO_ROUTE);
    }
    // SAFETY: on success the kernel filled the MAC variant of the union.
    let macs = unsafe { p.__bindgen_anon_6.__bindgen_anon_2 };
    Ok(NextHop {
        updated: 0,
        ifindex: p.ifindex,
        smac: macs.smac,
        dmac: macs.dmac,
    })
}
