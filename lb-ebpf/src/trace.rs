//! The datapath trace (`lb trace`): a new flow's backend and SNAT port, a flow rescheduled or
//! re-created mid-stream, a packet dropped and its verdict, written through aya-log while an
//! operator watches (lb-common's trace.rs has the design).
//!
//! The balancer's side is small on purpose. Its trace points sit where a new flow was made and
//! where a program ends in a drop, never on an established flow's path, and each tests one
//! word, the gate, 0 unless a trace runs: a load of a known address and a branch. Behind it the
//! packet's description goes into this CPU's [`TraceCpu`] and the program tail-calls
//! `lb_trace`, which counts the verdict, returns its action and does everything else (reading a
//! dropped frame, the lookups that name its service and backend, the filters, the rate, the
//! record) in a program verified apart, with its own stack: nothing of it adds to the
//! balancer's frames or to the paths the verifier walks there.
//!
//! The record is one aya-log line of small integers (ids, a counter index) and two addresses,
//! which the daemon parses and names.
#![cfg_attr(not(target_arch = "bpf"), allow(dead_code))]

use aya_ebpf::{bindings::xdp_action, programs::XdpContext};
use aya_log_ebpf::{info, macro_support::AYA_LOGS};
use lb_common::{
    FlowAddr, FlowKeyOf, PROTO_TCP, PROTO_UDP, ServiceKeyOf, TRACE_NONE, TraceNote, addr6_octets,
    in_prefix, trace_kind,
};

use crate::{
    clock,
    family::{Family, V4, V6},
    maps::{TRACE, TRACE_CPU, TRACE_PROG, params},
    parse::{self, ETH_P_IP, ETH_P_IPV6, Flow, Parsed, TCP_ACK, TCP_SYN},
    ratelimit, stats,
    table::{ct_find, ct_live},
    verdict::Verdict,
};

/// The gate: non-zero while a trace runs. In a section of its own, which aya makes a map of its
/// own, so the daemon writes this word and nothing else (lb_common::TRACE_GATE_SECTION).
#[unsafe(link_section = ".data.lb_trace")]
static mut GATE: u32 = 0;

/// aya-log's ring buffer's size (aya-log-ebpf's `AYA_LOGS`).
const LOG_RING_BYTES: u64 = 1 << 17;
/// Room a record needs in it, at most: aya-log reserves a power of two ≥ the record (ours are
/// under 512 bytes) and the ring adds a header.
const RECORD_ROOM: u64 = 1024;
/// `bpf_ringbuf_query`'s BPF_RB_AVAIL_DATA: bytes written and not yet read.
const BPF_RB_AVAIL_DATA: u64 = 0;
const PROTO_ICMPV6: u8 = 58;

/// Whether a trace runs: the one test every trace point makes.
#[inline(always)]
pub fn on() -> bool {
    // SAFETY: a global word the daemon flips; read volatile, so it is neither cached nor
    // folded into its initial value.
    unsafe { core::ptr::read_volatile(&raw const GATE) != 0 }
}

/// A program's last word on a packet it drops: handed to `lb_trace` while a trace runs (it
/// counts the verdict then). Returns unless it was handed over; every other verdict costs a
/// comparison of values in registers.
#[inline(always)]
pub fn dropped(ctx: &XdpContext, v: Verdict) {
    if v.0 == xdp_action::XDP_DROP && on() {
        hand_off(ctx, v, trace_kind::DROPPED, None::<&Flow<u32>>);
    }
}

/// A flow lb just created, its packet sent with verdict `v`: handed to `lb_trace`. Called
/// behind [`on`]. The frame is rewritten by now, so the flow is described from `flow`.
#[inline(always)]
pub fn new_flow<A: FlowAddr>(ctx: &XdpContext, v: Verdict, flow: &Flow<A>) {
    let midstream = flow.proto == PROTO_TCP && flow.tcp_flags & (TCP_SYN | TCP_ACK) != TCP_SYN;
    let kind = if midstream {
        trace_kind::MIDSTREAM
    } else {
        trace_kind::NEW_FLOW
    };
    hand_off(ctx, v, kind, Some(flow));
}

/// A live flow (hash `hash`) leaving backend `prev`, which became unavailable: noted for its
/// new flow's record (or its drop's). Called behind [`on`].
#[inline(always)]
pub fn rescheduled(hash: u64, prev: u32) {
    if let Some(c) = TRACE_CPU.get_ptr_mut(0) {
        // SAFETY: this CPU's value; the packet runs to its end on this CPU.
        unsafe {
            (*c).note.prev_hash = hash;
            (*c).note.prev_backend = prev;
        }
    }
}

/// This SYN went to `backend` in flood mode, without a table entry: noted for its record.
/// Called behind [`on`].
#[inline(always)]
pub fn flooded(backend: u32) {
    if let Some(c) = TRACE_CPU.get_ptr_mut(0) {
        // SAFETY: this CPU's value; the packet runs to its end on this CPU.
        unsafe {
            (*c).note.new_kind = trace_kind::FLOOD;
            (*c).note.flood_backend = backend;
        }
    }
}

/// The new flow this packet makes was routed by its QUIC connection ID: noted for its record.
/// Called behind [`on`].
#[inline(always)]
pub fn quic_routed() {
    if let Some(c) = TRACE_CPU.get_ptr_mut(0) {
        // SAFETY: this CPU's value; the packet runs to its end on this CPU.
        unsafe { (*c).note.new_kind = trace_kind::QUIC_ROUTED };
    }
}

/// A decision of the SYN proxy (`kind`, a `PROXY_*` of [`trace_kind`]) about the connection
/// `client:cport → vip:vport`, noted for the record its stage writes when it ends
/// ([`decided`]): the frame is rewritten by then, turned back or towards the backend. Called
/// behind [`on`].
#[inline(always)]
pub fn proxy<A: FlowAddr>(kind: u8, client: A, vip: A, cport: u16, vport: u16) {
    if let Some(c) = TRACE_CPU.get_ptr_mut(0) {
        // SAFETY: as in `rescheduled`.
        let n = unsafe { &mut (*c).note };
        n.new_kind = kind;
        describe_as(n, client, vip, cport, vport, PROTO_TCP);
    }
}

/// The end of a SYN proxy stage (verdict `v`): the decision [`proxy`] noted for this packet,
/// if any, handed to `lb_trace`. A dropped packet's is left to [`dropped`], whose record says
/// why it was dropped.
#[inline(always)]
pub fn decided(ctx: &XdpContext, v: Verdict) {
    if v.0 == xdp_action::XDP_DROP || !on() {
        return;
    }
    let Some(c) = TRACE_CPU.get_ptr_mut(0) else {
        return;
    };
    // SAFETY: as in `rescheduled`.
    if unsafe { (*c).note.new_kind } != 0 {
        hand_off_as(ctx, v, trace_kind::NEW_FLOW, |_| {});
    }
}

/// Describes the packet in this CPU's note and tail-calls `lb_trace`. Returns only when the
/// slot is empty (no daemon reads the trace).
#[inline(always)]
fn hand_off<A: FlowAddr>(ctx: &XdpContext, v: Verdict, kind: u8, flow: Option<&Flow<A>>) {
    hand_off_as(ctx, v, kind, |n| match flow {
        Some(f) => describe_as(n, f.saddr, f.daddr, f.sport, f.dport, f.proto),
        None => n.described = 0,
    })
}

/// The note's flow, described by the program that writes it.
#[inline(always)]
fn describe_as<A: FlowAddr>(
    n: &mut TraceNote,
    client: A,
    vip: A,
    cport: u16,
    vport: u16,
    proto: u8,
) {
    n.client = client.to_addr6();
    n.vip = vip.to_addr6();
    n.client_port = cport;
    n.vip_port = vport;
    n.proto = proto;
    n.family = if core::mem::size_of::<A>() == 4 { 4 } else { 6 };
    n.described = 1;
}

/// [`hand_off`] with the note described by `describe`.
#[inline(always)]
fn hand_off_as(ctx: &XdpContext, v: Verdict, kind: u8, describe: impl FnOnce(&mut TraceNote)) {
    let Some(c) = TRACE_CPU.get_ptr_mut(0) else {
        return;
    };
    // SAFETY: as in `rescheduled`.
    let n = unsafe { &mut (*c).note };
    n.action = v.0;
    n.reason = v.1;
    // A new flow's other kind holds for its own record only.
    n.kind = if kind == trace_kind::NEW_FLOW && n.new_kind != 0 {
        n.new_kind
    } else {
        kind
    };
    n.new_kind = 0;
    describe(n);
    // SAFETY: the program array holds lb_trace, an XDP program of this object. (Its result
    // is a unit on the host, where this is only type-checked, and must be used on BPF.)
    #[allow(clippy::let_unit_value)]
    let _ = unsafe { TRACE_PROG.tail_call(ctx, 0) };
}

/// `lb_trace`: counts the verdict it was handed and returns its action; on the way, the
/// record, if the trace is still on, the packet passes its filters and the rate allows.
#[inline(always)]
pub fn run(ctx: &XdpContext) -> u32 {
    let Some(c) = TRACE_CPU.get_ptr_mut(0) else {
        // Not reached: a per-CPU array's entry 0 is always there.
        return xdp_action::XDP_ABORTED;
    };
    // SAFETY: as in `rescheduled`.
    let c = unsafe { &mut *c };
    let action = c.note.action;
    stats::count(c.note.reason);
    let Some(f) = TRACE.get(0) else {
        return action;
    };
    let now = clock::now();
    if now > f.until_ns {
        // Past its deadline (its daemon died or hung): closed here, at once for every CPU.
        // SAFETY: the gate word (see `on`).
        unsafe { core::ptr::write_volatile(&raw mut GATE, 0) };
        return action;
    }
    describe(ctx, &mut c.note, now);
    let n = &c.note;
    if f.service_id != TRACE_NONE && n.service_id != f.service_id {
        return action;
    }
    if f.client_prefix != 0 && !in_prefix(&n.client, &f.client, f.client_prefix) {
        return action;
    }
    // A bucket filled at a higher rate (an earlier trace's) holds that rate's burst at most.
    c.bucket.tokens = c.bucket.tokens.min(u64::from(f.rate));
    if !ratelimit::take(&mut c.bucket, f.rate, f.rate_scaled, now) {
        c.limited += 1;
        return action;
    }
    // aya-log drops a record silently when its ring is full: counted here instead.
    if AYA_LOGS.query(BPF_RB_AVAIL_DATA) + RECORD_ROOM > LOG_RING_BYTES {
        c.lost += 1;
        return action;
    }
    record(ctx, &c.note);
    action
}

/// Completes the note: the frame's addressing when the balancer did not give it, the service,
/// the flow's backend and SNAT port, a rescheduled flow's earlier backend.
#[inline(always)]
fn describe(ctx: &XdpContext, n: &mut TraceNote, now: u64) {
    if n.described == 0 {
        let (data, data_end) = (ctx.data(), ctx.data_end());
        n.family = 0;
        n.proto = 0;
        n.client = [0; 4];
        n.vip = [0; 4];
        n.client_port = 0;
        n.vip_port = 0;
        match parse::link(data, data_end, false) {
            Some((ETH_P_IP, l3_off)) => from_frame(n, parse::ipv4(data, data_end, l3_off), 4),
            Some((ETH_P_IPV6, l3_off)) => from_frame(n, parse::ipv6(data, data_end, l3_off), 6),
            _ => {}
        }
    }
    n.service_id = TRACE_NONE;
    n.backend_id = TRACE_NONE;
    n.snat_port = 0;
    // A note of a rescheduled flow holds for one packet, its own: taken off here either way.
    let prev = (
        core::mem::replace(&mut n.prev_hash, 0),
        core::mem::replace(&mut n.prev_backend, TRACE_NONE),
    );
    match n.family {
        4 => flow_state::<V4>(n, now, prev),
        6 => flow_state::<V6>(n, now, prev),
        _ => {}
    }
}

/// The addressing of a parsed frame of family `family`: a flow's, an ICMP message's, or the
/// destination alone.
#[inline(always)]
fn from_frame<A: FlowAddr>(n: &mut TraceNote, parsed: Parsed<A>, family: u8) {
    n.family = family;
    match parsed {
        Parsed::Flow(f) => {
            n.client = f.saddr.to_addr6();
            n.vip = f.daddr.to_addr6();
            n.client_port = f.sport;
            n.vip_port = f.dport;
            n.proto = f.proto;
        }
        Parsed::Icmp(i) => {
            n.client = i.saddr.to_addr6();
            n.vip = i.daddr.to_addr6();
            n.proto = if family == 4 {
                lb_common::PROTO_ICMP
            } else {
                PROTO_ICMPV6
            };
        }
        Parsed::OtherL4 { daddr } | Parsed::Odd { daddr, .. } => n.vip = daddr.to_addr6(),
        Parsed::Malformed { daddr } => {
            if let Some(d) = daddr {
                n.vip = d.to_addr6();
            }
        }
    }
}

/// The service of the note's VIP and port, its flow's backend and SNAT port while the
/// connection table holds it live, and the backend it had if `prev` (hash, backend) is its
/// reschedule's note.
#[inline(always)]
fn flow_state<F: Family>(n: &mut TraceNote, now: u64, prev: (u64, u32)) {
    if n.proto != PROTO_TCP && n.proto != PROTO_UDP {
        return;
    }
    let (client, vip) = (F::A::from_addr6(n.client), F::A::from_addr6(n.vip));
    let skey = ServiceKeyOf {
        addr: vip,
        port: n.vip_port,
        proto: n.proto,
        _pad: 0,
    };
    // SAFETY: read-only use of a plain-integer value.
    if let Some(s) = unsafe { F::services().get(&skey) } {
        n.service_id = s.id;
    }
    let k = FlowKeyOf::new(client, vip, n.client_port, n.vip_port, n.proto);
    let hash = k.hash();
    let p = params();
    if let Some(slot) = ct_find::<F>(&k, hash, p) {
        // SAFETY: a map value of plain integers.
        let e = unsafe { &(*slot).entry };
        if ct_live(e, now, p) {
            n.backend_id = e.backend_id;
            n.service_id = e.service_id;
            n.snat_port = u16::from_be(e.snat_port);
        }
    }
    // No entry holds a flood-mode SYN's backend: the balancer noted it.
    if n.kind == trace_kind::FLOOD {
        n.backend_id = n.flood_backend;
    }
    if prev.0 == hash {
        n.prev_backend = prev.1;
        if n.kind != trace_kind::DROPPED {
            n.kind = trace_kind::RESCHEDULED;
        }
    }
}

/// The record: `lbtrace1` and `key=value` fields the daemon parses (lb-userspace's trace.rs).
// Out of line: aya-log's record writing is long, and inlined twice (it is not) it would be
// walked twice.
#[inline(never)]
fn record(ctx: &XdpContext, n: &TraceNote) {
    let n = crate::ptr::opaque(n);
    info!(
        ctx,
        "lbtrace1 kind={} reason={} service={} backend={} prev={} snat={} proto={} client={:i} cport={} vip={:i} vport={}",
        n.kind,
        n.reason,
        n.service_id,
        n.backend_id,
        n.prev_backend,
        n.snat_port,
        n.proto,
        addr6_octets(n.client),
        u16::from_be(n.client_port),
        addr6_octets(n.vip),
        u16::from_be(n.vip_port)
    );
}
