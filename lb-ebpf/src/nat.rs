//! Rewrites a frame in place: MACs, IP addresses and TTL / hop limit, TCP/UDP ports, with
//! incremental checksum updates (an IPv4 UDP checksum of 0, "none", stays 0; IPv6 never has one:
//! parsing refused it).
#![cfg_attr(not(target_arch = "bpf"), allow(dead_code))]

use lb_common::{PROTO_TCP, PROTO_UDP};
use network_types::{eth::EthHdr, tcp::TcpHdr, udp::UdpHdr};

use crate::{
    csum::{diff16, update},
    family::Family,
    parse::Flow,
    ptr::ptr_at_mut,
};

/// The new addressing of a frame, network byte order. References (into map values mostly), not
/// copies: two IPv6 addresses copied are 32 bytes of a stack the IPv6 program has little of.
pub struct Rewrite<'a, A> {
    pub src: &'a A,
    pub dst: &'a A,
    /// The addresses' checksum change, when known beforehand (a reply's, kept in its NAT
    /// entry); `None`: computed here.
    pub addr_csum: Option<u32>,
    pub sport: u16,
    pub dport: u16,
    pub smac: &'a [u8; 6],
    pub dmac: &'a [u8; 6],
}

/// Applies `rw` to the frame `flow` was parsed from, and decrements the TTL / hop limit
/// (callers drop TTL <= 1 first). `None` only if the headers moved out of bounds, which parsing
/// already excluded.
#[inline(always)]
pub fn apply<F: Family>(
    data: usize,
    data_end: usize,
    flow: &Flow<F::A>,
    rw: &Rewrite<'_, F::A>,
) -> Option<()> {
    let eth = ptr_at_mut::<EthHdr>(data, data_end, 0)?;
    // SAFETY: bounds-checked; network-types headers are byte arrays.
    unsafe {
        (*eth).dst_addr = *rw.dmac;
        (*eth).src_addr = *rw.smac;
    }
    // The address change, in both the IP header and the TCP/UDP pseudo-header.
    let addrs = rw
        .addr_csum
        .unwrap_or_else(|| F::addr_diff(&flow.saddr, rw.src) + F::addr_diff(&flow.daddr, rw.dst));
    F::rewrite_ip(data, data_end, flow.l3_off, (rw.src, rw.dst), addrs)?;
    let l4 = addrs + diff16(flow.sport, rw.sport) + diff16(flow.dport, rw.dport);
    match flow.proto {
        PROTO_TCP => {
            let tcp = ptr_at_mut::<TcpHdr>(data, data_end, flow.l4_off)?;
            // SAFETY: bounds-checked.
            unsafe {
                let check = update(u16::from_ne_bytes((*tcp).check), l4);
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
                    let check = match update(check, l4) {
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
