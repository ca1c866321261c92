//! Rewrites a frame in place: MACs, IPv4 addresses and TTL, TCP/UDP ports, with incremental
//! checksum updates (a UDP checksum of 0, "none", stays 0).
#![cfg_attr(not(target_arch = "bpf"), allow(dead_code))]

use lb_common::{PROTO_TCP, PROTO_UDP};
use network_types::{eth::EthHdr, ip::Ipv4Hdr, tcp::TcpHdr, udp::UdpHdr};

use crate::{
    csum::{diff16, diff32, update},
    parse::Flow,
    ptr::ptr_at_mut,
};

/// The new addressing of a frame, network byte order.
pub struct Rewrite {
    pub src: u32,
    pub dst: u32,
    pub sport: u16,
    pub dport: u16,
    pub smac: [u8; 6],
    pub dmac: [u8; 6],
}

/// Applies `rw` to the frame `flow` was parsed from, and decrements the TTL (callers drop TTL <= 1
/// first). `None` only if the headers moved out of bounds, which parsing already excluded.
#[inline(always)]
pub fn apply(data: usize, data_end: usize, flow: &Flow, rw: &Rewrite) -> Option<()> {
    let eth = ptr_at_mut::<EthHdr>(data, data_end, 0)?;
    let ip = ptr_at_mut::<Ipv4Hdr>(data, data_end, flow.l3_off)?;
    // The address change, in both the IPv4 header and the TCP/UDP pseudo-header.
    let addrs = diff32(flow.saddr, rw.src) + diff32(flow.daddr, rw.dst);
    // SAFETY: both pointers are bounds-checked; network-types headers are byte arrays.
    unsafe {
        (*eth).dst_addr = rw.dmac;
        (*eth).src_addr = rw.smac;
        let old_ttl_word = u16::from_ne_bytes([(*ip).ttl, (*ip).proto]);
        (*ip).ttl -= 1;
        let new_ttl_word = u16::from_ne_bytes([(*ip).ttl, (*ip).proto]);
        let check = u16::from_ne_bytes((*ip).check);
        let check = update(check, addrs + diff16(old_ttl_word, new_ttl_word));
        (*ip).check = check.to_ne_bytes();
        (*ip).src_addr = rw.src.to_ne_bytes();
        (*ip).dst_addr = rw.dst.to_ne_bytes();
    }
    match flow.proto {
        PROTO_TCP => {
            let tcp = ptr_at_mut::<TcpHdr>(data, data_end, flow.l4_off)?;
            // SAFETY: bounds-checked.
            unsafe {
                let check = l4_check(u16::from_ne_bytes((*tcp).check), addrs, flow, rw);
                (*tcp).check = check.to_ne_bytes();
                (*tcp).source = rw.sport.to_ne_bytes();
                (*tcp).dest = rw.dport.to_ne_bytes();
            }
        }
        PROTO_UDP => {
            let udp = ptr_at_mut::<UdpHdr>(data, data_end, flow.l4_off)?;
            // SAFETY: bounds-checked.
            unsafe {
                let check = u16::from_ne_bytes((*udp).check);
                if check != 0 {
                    let check = match l4_check(check, addrs, flow, rw) {
                        0 => 0xffff, // 0 would mean "no checksum"
                        c => c,
                    };
                    (*udp).check = check.to_ne_bytes();
                }
                (*udp).src = rw.sport.to_ne_bytes();
                (*udp).dst = rw.dport.to_ne_bytes();
            }
        }
        _ => {}
    }
    Some(())
}

/// The L4 checksum covers the pseudo-header's addresses (`addrs`, their change) and the ports.
#[inline(always)]
fn l4_check(check: u16, addrs: u32, flow: &Flow, rw: &Rewrite) -> u16 {
    update(
        check,
        addrs + diff16(flow.sport, rw.sport) + diff16(flow.dport, rw.dport),
    )
}
