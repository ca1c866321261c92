//! Passive health signals: failures of backends seen in the traffic lb forwards (SPEC §3), sent to
//! the daemon as [`PassiveSignal`] records through the `LB_SIGNALS` ring buffer.
//!
//! Why a ring buffer and not per-CPU counters: the daemon must know *which* backend failed and in
//! *which* service (it keeps failure windows per host and per service), and when. Counters per
//! (backend, kind) would be a max_backends × kinds array the daemon scans and diffs on every tick
//! only to recover those few events. Signals are rare (a healthy backend produces none), their
//! order does not matter (the rule counts failures in a window), and a record is only written on a
//! failure path, so one shared, bounded buffer fits: the daemon drains whatever came since its last
//! look. When the buffer is full the signal is counted in `signal_lost`, never dropped silently;
//! every one written is counted in `signal_sent`.
//!
//! Nothing here runs on the healthy path: each check sits behind a test of flags or fields the
//! connection table lookup already loaded (a RST on the return path, a SYN on a half-open flow),
//! and the ICMP check starts only for ICMP.
#![cfg_attr(not(target_arch = "bpf"), allow(dead_code))]

use aya_ebpf::programs::XdpContext;
use lb_common::{
    BackendInfo, CtEntry, PROTO_TCP, PROTO_UDP, PassiveSignal, SYN_RETRANSMIT_MIN_NS, addr_flags,
    counter, ct_flags, ct_state, signal_kind,
};
use network_types::ip::Ipv4Hdr;

use crate::{
    clock,
    flow::{hash_of, key},
    maps::{SIGNALS, lookup_addr, params},
    parse::Flow,
    ptr::read_at,
    stats,
    table::{ct_find, ct_live, nat_find},
};

const ICMP_DEST_UNREACH: u8 = 3;
/// "Fragmentation needed and DF set": path MTU discovery, not a failure of the backend.
const ICMP_FRAG_NEEDED: u8 = 4;
/// ICMP header before the quoted datagram: type, code, checksum, 4 unused bytes.
const ICMP_HDR_LEN: usize = 8;

/// Sends one signal, or counts it lost when the ring buffer is full.
#[inline(always)]
pub fn report(backend_id: u32, service_id: u32, kind: u32, detail: u32) {
    match SIGNALS.reserve::<PassiveSignal>(0) {
        Some(mut entry) => {
            entry.write(PassiveSignal {
                backend_id,
                service_id,
                kind,
                detail,
            });
            entry.submit(0);
            stats::count(counter::SIGNAL_SENT);
        }
        None => stats::count(counter::SIGNAL_LOST),
    }
}

/// A RST from backend `backend_id` (to SNAT port `snat_port`, network order) on the return path,
/// for the client flow `e`; `answered`: the backend had sent something on this flow before.
/// A refusal when nothing came back before and the client has only sent its SYN.
#[inline(always)]
pub fn backend_reset(e: &mut CtEntry, backend_id: u32, snat_port: u16, answered: bool) {
    if answered
        || e.state != ct_state::TCP_SYN
        || e.flags & ct_flags::SIGNALLED != 0
        || e.backend_id != backend_id
        || e.snat_port != snat_port
    {
        return;
    }
    e.flags |= ct_flags::SIGNALLED;
    report(backend_id, e.service_id, signal_kind::REFUSED, 0);
}

/// A client SYN (without ACK) on the half-open flow `e` to `backend`, before `e.last_seen` is
/// refreshed. A retransmission, if it comes [`SYN_RETRANSMIT_MIN_NS`] after the flow's first
/// packet: a connect timeout unless the backend's NAT entry shows it answered (the SYN+ACK was
/// then lost on the client's side, not the backend's fault). Looked at once per flow.
#[inline(always)]
pub fn syn_again(e: &mut CtEntry, backend: &BackendInfo, flow: &Flow, now: u64) {
    // saturating: another CPU may have stored a slightly later time.
    if e.flags & ct_flags::SIGNALLED != 0 || now.saturating_sub(e.last_seen) < SYN_RETRANSMIT_MIN_NS
    {
        return;
    }
    e.flags |= ct_flags::SIGNALLED;
    let k = key(
        backend.addr,
        backend.snat_addr,
        backend.port,
        e.snat_port,
        PROTO_TCP,
    );
    if let Some(slot) = nat_find(&k, hash_of(&k), params()) {
        // SAFETY: a map value of plain integers.
        let nat = unsafe { &(*slot).entry };
        if nat.last_seen != 0 && nat.client_addr == flow.saddr && nat.client_port == flow.sport {
            return;
        }
    }
    report(e.backend_id, e.service_id, signal_kind::CONNECT_TIMEOUT, 0);
}

/// An ICMP message to `daddr`, its header at `l4_off`. A destination unreachable sent to a SNAT
/// address about a live flow to a backend (the quoted datagram: SNAT address:port → backend
/// address:port) is reported. The caller passes the packet on to the kernel either way.
#[inline(always)]
pub fn icmp(ctx: &XdpContext, daddr: u32, l4_off: usize) {
    let (data, data_end) = (ctx.data(), ctx.data_end());
    let Some(icmp) = read_at::<[u8; 2]>(data, data_end, l4_off) else {
        return;
    };
    let (kind, code) = (icmp[0], icmp[1]);
    if kind != ICMP_DEST_UNREACH || code == ICMP_FRAG_NEEDED {
        return;
    }
    if lookup_addr(daddr) & addr_flags::SNAT == 0 {
        return;
    }
    let inner_off = l4_off + ICMP_HDR_LEN;
    let Some(ip) = read_at::<Ipv4Hdr>(data, data_end, inner_off) else {
        return;
    };
    let ihl = ((ip.vihl & 0x0f) as usize) * 4;
    if ip.vihl >> 4 != 4
        || ihl < Ipv4Hdr::LEN
        || (ip.proto != PROTO_TCP && ip.proto != PROTO_UDP)
        || u32::from_ne_bytes(ip.src_addr) != daddr
    {
        return;
    }
    // The first 4 bytes of the quoted TCP/UDP header: source (SNAT) port, destination port.
    let Some(ports) = read_at::<[u8; 4]>(data, data_end, inner_off + ihl) else {
        return;
    };
    let snat_port = u16::from_ne_bytes([ports[0], ports[1]]);
    let backend_port = u16::from_ne_bytes([ports[2], ports[3]]);
    let proto = ip.proto;
    let p = params();
    // The return-path key of the quoted flow: backend → SNAT address.
    let k = key(
        u32::from_ne_bytes(ip.dst_addr),
        daddr,
        backend_port,
        snat_port,
        proto,
    );
    let Some(slot) = nat_find(&k, hash_of(&k), p) else {
        return;
    };
    // SAFETY: a map value of plain integers.
    let nat = unsafe { (*slot).entry };
    let fwd = key(
        nat.client_addr,
        nat.vip_addr,
        nat.client_port,
        nat.vip_port,
        proto,
    );
    let Some(slot) = ct_find(&fwd, hash_of(&fwd), p) else {
        return;
    };
    // SAFETY: a map value of plain integers.
    let e = unsafe { &mut (*slot).entry };
    let now = clock::now();
    if e.backend_id != nat.backend_id || e.snat_port != snat_port || !ct_live(e, now, p) {
        return;
    }
    if proto == PROTO_TCP {
        if e.flags & ct_flags::SIGNALLED != 0 {
            return;
        }
        e.flags |= ct_flags::SIGNALLED;
    }
    report(
        nat.backend_id,
        e.service_id,
        signal_kind::UNREACHABLE,
        u32::from(code),
    );
}
