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
//! connection table lookup already loaded (a RST on the return path, a SYN on a half-open flow,
//! the backend's "no data back" timeout), and the ICMP check starts only for ICMP.
#![cfg_attr(not(target_arch = "bpf"), allow(dead_code))]

use lb_common::{
    BackendInfoOf, CtEntry, DATA_TICK_SHIFT, FlowKeyOf, NatEntryOf, PROTO_TCP, PassiveSignal,
    SYN_RETRANSMIT_MIN_NS, counter, ct_flags, ct_state, nat_flags, signal_kind,
};

use crate::{
    family::Family,
    maps::{SIGNALS, params},
    parse::Flow,
    ptr::opaque,
    stats,
    table::nat_find,
};

/// "Fragmentation needed and DF set": path MTU discovery, not a failure of the backend.
const ICMP_FRAG_NEEDED: u8 = 4;

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
// Out of line, as `no_data`: a retransmitted SYN or a "no data back" look is rare, and inlined
// their NAT lookups took stack frames the IPv6 program cannot spare. Pointer arguments opaque
// (see `ptr::opaque`).
#[inline(never)]
pub fn syn_again<F: Family>(
    e: &mut CtEntry,
    backend: &BackendInfoOf<F::A>,
    flow: &Flow<F::A>,
    now: u64,
) {
    let (backend, flow) = (opaque(backend), opaque(flow));
    // saturating: another CPU may have stored a slightly later time.
    if e.flags & ct_flags::SIGNALLED != 0 || now.saturating_sub(e.last_seen) < SYN_RETRANSMIT_MIN_NS
    {
        return;
    }
    e.flags |= ct_flags::SIGNALLED;
    if let Some(nat) = return_entry::<F>(e, backend, flow)
        && nat.last_seen != 0
    {
        return;
    }
    report(e.backend_id, e.service_id, signal_kind::CONNECT_TIMEOUT, 0);
}

/// The return-path entry of TCP flow `e` (client side `flow`) to `backend`, if it is still this
/// client's: what the backend's replies have shown.
#[inline(always)]
fn return_entry<F: Family>(
    e: &CtEntry,
    backend: &BackendInfoOf<F::A>,
    flow: &Flow<F::A>,
) -> Option<&'static NatEntryOf<F::A>> {
    let k = FlowKeyOf::new(
        backend.addr,
        backend.snat_addr,
        backend.port,
        e.snat_port,
        PROTO_TCP,
    );
    let slot = nat_find::<F>(&k, k.hash(), params())?;
    // SAFETY: a map value of plain integers.
    let nat = unsafe { &(*slot).entry };
    (nat.client_addr == flow.saddr && nat.client_port == flow.sport).then_some(nat)
}

/// An ICMP destination unreachable (code `code`) sent to lb's SNAT address about the live flow
/// `e` to the backend of `nat` (the caller matched them). Path MTU discovery ("fragmentation
/// needed") is not a failure. Once per TCP connection; for UDP every one (the sender's ICMP rate
/// limit bounds them).
#[inline(always)]
pub fn unreachable<A>(e: &mut CtEntry, nat: &NatEntryOf<A>, proto: u8, code: u8) {
    if code == ICMP_FRAG_NEEDED {
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

/// "No data back" (seed 000): a client packet of TCP flow `e` to `backend`, whose service has
/// the check on and whose check is not over. The first packet with data starts the clock; the
/// first client packet past `no_data_ticks` looks at the flow's NAT entry once: data came back
/// (the return path marked it) and the check is over, or none did and the backend failed this
/// connection (service scope). Before that a packet costs a comparison.
///
/// A client that sends data and then nothing at all is not seen (no packet to look from); a
/// protocol whose server answers later than the timeout, or never (uploads, log shipping), must
/// keep the check off or its timeout above its answer time.
#[inline(never)]
pub fn no_data<F: Family>(
    e: &mut CtEntry,
    backend: &BackendInfoOf<F::A>,
    flow: &Flow<F::A>,
    now: u64,
) {
    let (backend, flow) = (opaque(backend), opaque(flow));
    let tick = (now >> DATA_TICK_SHIFT) as u32;
    if e.flags & ct_flags::DATA_PENDING == 0 {
        if flow.payload_len != 0 {
            e.flags |= ct_flags::DATA_PENDING;
            e.data_at = tick;
        }
        return;
    }
    if tick.wrapping_sub(e.data_at) < u32::from(backend.no_data_ticks) {
        return;
    }
    e.flags = (e.flags & !ct_flags::DATA_PENDING) | ct_flags::DATA_DONE;
    let answered =
        return_entry::<F>(e, backend, flow).is_some_and(|n| n.flags & nat_flags::DATA_BACK != 0);
    if !answered {
        report(e.backend_id, e.service_id, signal_kind::NO_DATA, 0);
    }
}
