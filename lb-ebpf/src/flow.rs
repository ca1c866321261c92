//! The two directions of a balanced flow. Forward (client → VIP): connection table, or Maglev
//! selection + SNAT port reservation for a new flow, then full NAT to the backend, or, with
//! direct server return, the packet unchanged inside an outer header (encap.rs; no port, no
//! return path: the backend answers the client itself). Return (backend → SNAT address): the
//! NAT entry turns the reply back into the VIP's.
#![cfg_attr(not(target_arch = "bpf"), allow(dead_code))]

use aya_ebpf::{bindings::xdp_action, programs::XdpContext};
use lb_common::{
    BackendInfoOf, CtEntry, FlowAddr, FlowKeyOf, NO_BACKEND, NatEntryOf, NextHop, PROTO_TCP,
    PROTO_UDP, PROXY_ENTRY, Params, SELECT_TRIES, ServiceInfo, ServiceKeyOf, TOO_BIG_PROG,
    backend_flags, counter, ct_flags, ct_state, fmix64, nat_flags, service_flags, service_hint,
    syn_quiet, syn_slots,
};
use network_types::eth::EthHdr;

use crate::{
    clock, encap,
    family::Family,
    fib,
    maps::{
        FLOOD, PROGS, RINGS, SERVICE_HINT, SERVICES_GEN, SYN_RATE, SYN_SKETCH, TOO_BIG, params,
    },
    nat::{self, Rewrite},
    parse::{Flow, TCP_ACK, TCP_FIN, TCP_RST, TCP_SYN},
    passive, proxied,
    ptr::ptr_at,
    quic, ratelimit, snat, stats,
    table::{ct_find, ct_live, ct_store, nat_find},
    trace,
    verdict::{Verdict, send_out, to_proxy},
};

/// How often an active flow refreshes its timestamp.
const REFRESH_NS: u64 = 1_000_000_000;

#[inline(always)]
fn is_new_syn(flags: u8) -> bool {
    flags & (TCP_SYN | TCP_ACK) == TCP_SYN
}

/// Client → VIP (the destination is a VIP address; a port that is no service is passed).
/// `quic_vip`: the VIP has a QUIC service, whose packets may name their backend (quic.rs).
#[inline(always)]
pub fn forward<F: Family>(ctx: &XdpContext, flow: &Flow<F::A>, quic_vip: bool) -> Verdict {
    if flow.ttl <= 1 {
        return (xdp_action::XDP_DROP, counter::DROP_TTL);
    }
    let p = params();
    let now = clock::now();
    let k = FlowKeyOf::new(flow.saddr, flow.daddr, flow.sport, flow.dport, flow.proto);
    let hash = k.hash();
    // A SYN is nearly always a new flow, whose reads miss the caches in tables far larger than
    // them: the line of its Maglev pick is requested before the connection table is read, so
    // its miss overlaps the table's instead of following it (the SYN sketch is small enough
    // to be cached mostly: reading it early measured no gain).
    if flow.proto == PROTO_TCP && is_new_syn(flow.tcp_flags) {
        warm::<F>(flow, hash, p);
    }
    let quic = quic_vip && flow.proto == PROTO_UDP;
    if let Some(slot) = ct_find::<F>(&k, hash, p) {
        // SAFETY: a map value; other CPUs may write it too, all fields are plain integers.
        let e = unsafe { &mut (*slot).entry };
        // A flow of the SYN proxy: its common segment translated here, any other by the
        // proxy's programs (a closing flow's all: a new connection on its 4-tuple is told from
        // them there); one test of a value loaded anyway for the rest. It cannot move to
        // another backend (its handshake was that backend's).
        if e.flags & ct_flags::PROXIED != 0
            && !(ct_live(e, now, p)
                && e.state != ct_state::TCP_CLOSING
                && proxied::to_backend::<F>(ctx, flow, hash))
        {
            return to_proxy::<F>(ctx, PROXY_ENTRY);
        }
        // A SYN on a closing flow is the client reusing its port: a new connection.
        let reused = e.state == ct_state::TCP_CLOSING && is_new_syn(flow.tcp_flags);
        // A QUIC packet naming another backend than its live flow's: the connection it belongs
        // to lives there (this 4-tuple was another's), the flow moves. Read last, for live
        // flows only: a dead entry makes a new flow, which reads the connection ID itself.
        // One call of `established` for both kinds: each inlined copy costs the IPv6 program
        // stack it cannot spare. The flag is read anew each time, not kept: a value known on one
        // path let LLVM give that path its own copy.
        if e.flags & ct_flags::PROXIED != 0
            || ct_live(e, now, p)
                && !reused
                && !(quic && quic::names_other::<F>(ctx, flow, e.service_id, e.backend_id))
        {
            if let Some(v) = established::<F>(ctx, flow, e, hash, now) {
                return v;
            }
            if e.flags & ct_flags::PROXIED != 0 {
                return (xdp_action::XDP_DROP, counter::DROP_NO_BACKEND);
            }
            stats::count(counter::CT_RESCHEDULED);
            if trace::on() {
                trace::rescheduled(hash, e.backend_id);
            }
        }
    }
    new_flow::<F>(ctx, flow, &k, hash, now, p, quic)
}

/// Reads what a new flow of `flow` will likely read (its Maglev slot in the ring of the service
/// of this CPU's last new flow to the same destination) and drops the values:
/// only the cache lines are wanted, and a wrong guess costs one line read. The hint is kept per
/// destination, not per CPU alone: new flows to several services interleave, and the last one's
/// service was the wrong ring for most SYNs (lb-bench: cold new flow 1.26× Katran's → 1.07×).
/// Nothing is kept, so the verifier's states after the call are the same whether it ran or not
/// (a value carried on to `new_flow` doubled the paths it walks and took the IPv6 program past
/// its limit); the service is not looked up here, which a flow whose tables are in the caches
/// would pay for twice.
#[inline(always)]
fn warm<F: Family>(flow: &Flow<F::A>, hash: u64, p: &Params) {
    if let Some(hint) = SERVICE_HINT.get(service_hint(flow.daddr, flow.dport, flow.proto))
        && let Some(base) = hint.info.id.checked_mul(p.ring_size)
        && let Some(slot) = (hash as u32).checked_rem(p.ring_size)
        && let Some(id) = RINGS.get_ptr(base + slot)
    {
        // SAFETY: an array map value; read, not kept.
        unsafe { core::ptr::read_volatile(id) };
    }
}

/// The service of a new flow's destination: this CPU's last answer for it while the service maps
/// have not changed since (see [`lb_common::ServiceHint`]), else the service map's, remembered.
/// The hash map's lookup was a tenth of a SYN's time when its lines are cached (lb-bench: a
/// second lookup added 0.36× an empty program's time to the same flow created anew).
#[inline(always)]
fn known_service<F: Family>(flow: &Flow<F::A>) -> Option<ServiceInfo> {
    // The generation is read before the map: an answer read after a change and remembered under
    // the generation before it is voided by the change's own step.
    // SAFETY: an array map value, a plain integer another CPU's writer may change; read once.
    let generation = SERVICES_GEN
        .get_ptr(0)
        .map_or(0, |g| unsafe { core::ptr::read_volatile(g) });
    let addr = flow.daddr.to_addr6();
    let hint = SERVICE_HINT.get_ptr_mut(service_hint(flow.daddr, flow.dport, flow.proto));
    if let Some(h) = hint {
        // SAFETY: this CPU's slot of a per-CPU array of plain integers.
        let h = unsafe { &*h };
        if h.generation == generation
            && h.port == flow.dport
            && h.proto == flow.proto
            && h.addr == addr
        {
            return Some(h.info);
        }
    }
    let info = service::<F>(flow)?;
    if let Some(h) = hint {
        // SAFETY: as above; this packet's CPU is the slot's only writer.
        let h = unsafe { &mut *h };
        h.addr = addr;
        h.port = flow.dport;
        h.proto = flow.proto;
        h.generation = generation;
        h.info = info;
    }
    Some(info)
}

/// The service of the flow's destination, from the service map.
#[inline(always)]
pub fn service<F: Family>(flow: &Flow<F::A>) -> Option<ServiceInfo> {
    let skey = ServiceKeyOf {
        addr: flow.daddr,
        port: flow.dport,
        proto: flow.proto,
        _pad: 0,
    };
    // SAFETY: read-only use of a plain-integer value.
    unsafe { F::services().get(&skey) }.copied()
}

/// A FIN or RST (`tcp_flags`) on a flow, from the side whose FIN flag is `fin`: the flow is
/// closing, and closed both ways after a FIN from each side or a RST. Dated exactly (last_seen is
/// otherwise refreshed once a second): a closed flow's SNAT port is held for
/// `closed_hold_ns` from its last FIN or RST.
#[inline(always)]
pub fn closing(e: &mut CtEntry, tcp_flags: u8, fin: u8, now: u64) {
    e.state = ct_state::TCP_CLOSING;
    e.flags |= if tcp_flags & TCP_RST != 0 {
        ct_flags::RESET
    } else {
        fin
    };
    e.last_seen = now;
}

/// A packet of a live flow. `None`: its backend became unavailable and the flow must move.
#[inline(always)]
pub fn established<F: Family>(
    ctx: &XdpContext,
    flow: &Flow<F::A>,
    e: &mut CtEntry,
    hash: u64,
    now: u64,
) -> Option<Verdict> {
    // A reference, not a copy: an IPv6 backend is 40 bytes of stack the program cannot spare.
    let backend = F::backends().get(e.backend_id)?;
    if backend.flags & backend_flags::UP == 0 && e.flags & ct_flags::KEEP == 0 {
        return None;
    }
    if flow.proto == PROTO_TCP {
        // "No data back" (off unless the service sets it): one test of a value already loaded.
        if backend.no_data_ticks != 0 && e.flags & ct_flags::DATA_DONE == 0 {
            passive::no_data::<F>(e, backend, flow, now);
        }
        if flow.tcp_flags & (TCP_FIN | TCP_RST) != 0 {
            closing(e, flow.tcp_flags, ct_flags::FIN_CLIENT, now);
        } else if e.state == ct_state::TCP_SYN {
            if flow.tcp_flags & (TCP_SYN | TCP_ACK) == TCP_ACK {
                e.state = ct_state::TCP_ESTABLISHED;
                stats::count_handshake(e.service_id, e.backend_id);
            } else if is_new_syn(flow.tcp_flags) {
                // Before last_seen is refreshed below: it still dates the first SYN.
                passive::syn_again::<F>(e, backend, flow, now);
            }
        }
    }
    if now.saturating_sub(e.last_seen) > REFRESH_NS {
        e.last_seen = now;
    }
    let nh = match fib::to_backend::<F>(ctx, e.backend_id, backend, flow.proto, now) {
        Ok(nh) => nh,
        Err(reason) => return Some((xdp_action::XDP_DROP, reason)),
    };
    if let Some(v) = too_big::<F>(ctx, flow, backend, &nh) {
        return Some(v);
    }
    stats::count_traffic(
        e.service_id,
        e.backend_id,
        ctx.data_end() - ctx.data(),
        false,
    );
    Some(deliver::<F>(ctx, flow, backend, &nh, e.snat_port, hash))
}

/// `Some(verdict)` when the packet of `flow` does not fit the path to backend `b` (the path's
/// MTU less the outer header of direct server return): the answer program says so to the
/// client (see toobig.rs).
#[inline(always)]
fn too_big<F: Family>(
    ctx: &XdpContext,
    flow: &Flow<F::A>,
    b: &BackendInfoOf<F::A>,
    nh: &NextHop,
) -> Option<Verdict> {
    let len = (ctx.data_end() - ctx.data() - flow.l3_off) as u32;
    let overhead = encap::overhead::<F>(b.flags);
    if len + overhead <= nh.mtu {
        return None;
    }
    if let Some(slot) = TOO_BIG.get_ptr_mut(0) {
        // SAFETY: this CPU's slot, read by the program called next on this CPU.
        unsafe { *slot = nh.mtu.saturating_sub(overhead) };
    }
    // SAFETY: the program array holds XDP programs of this object. A tail call returns only
    // when the slot is empty, for a moment while lb loads. (Its result is a unit on the host,
    // where this is only type-checked, and must be used on BPF.)
    #[allow(clippy::let_unit_value)]
    let _ = unsafe { PROGS.tail_call(ctx, TOO_BIG_PROG) };
    Some((xdp_action::XDP_DROP, counter::DROP_TOO_BIG))
}

/// Sends the packet of `flow` to backend `b` through `nh`: with full NAT from SNAT port
/// `snat_port`, or encapsulated (direct server return; `hash` is the flow's).
#[inline(always)]
fn deliver<F: Family>(
    ctx: &XdpContext,
    flow: &Flow<F::A>,
    b: &BackendInfoOf<F::A>,
    nh: &NextHop,
    snat_port: u16,
    hash: u64,
) -> Verdict {
    if b.flags & backend_flags::ENCAP != 0 {
        return match encap::push::<F>(ctx, flow.l3_off, b, nh, hash) {
            Ok(()) => send_out(ctx, nh.ifindex),
            Err(reason) => (xdp_action::XDP_DROP, reason),
        };
    }
    let rw = Rewrite {
        src: &b.snat_addr,
        dst: &b.addr,
        addr_csum: None,
        sport: snat_port,
        dport: b.port,
        smac: &nh.smac,
        dmac: &nh.dmac,
    };
    transmit::<F>(ctx, flow, &rw, nh.ifindex)
}

#[inline(always)]
fn new_flow<F: Family>(
    ctx: &XdpContext,
    flow: &Flow<F::A>,
    k: &FlowKeyOf<F::A>,
    hash: u64,
    now: u64,
    p: &Params,
    quic: bool,
) -> Verdict {
    // A VIP's port or protocol that no service has: dropped, never passed (the kernel has no
    // such address and would route it back out, a loop).
    let Some(svc) = known_service::<F>(flow) else {
        return (xdp_action::XDP_DROP, counter::DROP_NO_SERVICE);
    };
    if svc.flags & service_flags::DROP != 0 {
        return (xdp_action::XDP_DROP, counter::DROP_NO_BACKEND);
    }
    // One source flooding SYNs must not churn the tables every other client needs: its new
    // connections beyond its rate are dropped here, before they take any state.
    if flow.proto == PROTO_TCP && is_new_syn(flow.tcp_flags) && !syn_allowed(flow.saddr, now, p) {
        return (xdp_action::XDP_DROP, counter::DROP_SYN_RATE);
    }
    // The SYN proxy answers a proxied service's new connections before any state is taken.
    if svc.flags & service_flags::SYN_PROXY != 0 && flow.proto == PROTO_TCP {
        return to_proxy::<F>(ctx, PROXY_ENTRY);
    }
    // A QUIC packet naming its backend goes there; any other by the ring.
    let named = if quic {
        quic::pick::<F>(ctx, flow, &svc)
    } else {
        None
    };
    let Some((backend_id, backend)) =
        named.or_else(|| select::<F>(svc.id, svc.flags, hash, p.ring_size))
    else {
        return (xdp_action::XDP_DROP, counter::DROP_NO_BACKEND);
    };
    let nh = match fib::to_backend::<F>(ctx, backend_id, backend, flow.proto, now) {
        Ok(nh) => nh,
        Err(reason) => return (xdp_action::XDP_DROP, reason),
    };
    if let Some(v) = too_big::<F>(ctx, flow, backend, &nh) {
        return v;
    }
    let midstream = flow.proto == PROTO_TCP && !is_new_syn(flow.tcp_flags);
    let dsr = backend.flags & backend_flags::ENCAP != 0;
    // Direct server return has no return path: no SNAT port to take.
    let snat_port = if dsr {
        0
    } else {
        match nat_port::<F>(ctx, flow, backend, backend_id, hash, midstream, now, 0) {
            Ok(port) => port,
            Err(reason) => return (xdp_action::XDP_DROP, reason),
        }
    };
    let state = if flow.proto != PROTO_TCP {
        ct_state::UDP
    } else if midstream {
        stats::count(counter::CT_MISS_MIDSTREAM);
        ct_state::TCP_ESTABLISHED
    } else {
        ct_state::TCP_SYN
    };
    let entry = CtEntry {
        backend_id,
        service_id: svc.id,
        last_seen: now,
        snat_port,
        state,
        flags: if svc.flags & service_flags::KEEP_FLOWS != 0 {
            ct_flags::KEEP
        } else {
            0
        },
        data_at: 0,
    };
    // Flood mode of direct server return: beyond the service's rate of new connections on this
    // CPU, a SYN goes by the ring without an entry, so a flood of spoofed SYNs (which never
    // answer) cannot fill or churn the table. A real client's flow gets its entry with its next
    // packet (a midstream miss: the same backend from the ring). Full NAT cannot do this: the
    // reply needs the flow's NAT entry.
    if dsr && flow.proto == PROTO_TCP && !midstream && flooded(svc.id, now, p) {
        stats::count(counter::DSR_FLOOD);
        if trace::on() {
            trace::flooded(backend_id);
        }
    } else {
        ct_store::<F>(k, hash, &entry, now, p);
        stats::count(counter::CT_NEW);
    }
    stats::count_traffic(svc.id, backend_id, ctx.data_end() - ctx.data(), true);
    if midstream {
        stats::count_handshake(svc.id, backend_id);
    }
    let v = deliver::<F>(ctx, flow, backend, &nh, snat_port, hash);
    // The trace names the backend and port from the connection table: only the flow's
    // addressing (in `flow`, still live in the caller) is kept for it past the delivery.
    if trace::on() {
        trace::new_flow(ctx, v, flow);
    }
    v
}

/// Reserves the SNAT port of a new full-NAT flow to `backend` and writes its return entry, with
/// [`nat_flags`] `flags`.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub fn nat_port<F: Family>(
    ctx: &XdpContext,
    flow: &Flow<F::A>,
    backend: &BackendInfoOf<F::A>,
    backend_id: u32,
    hash: u64,
    midstream: bool,
    now: u64,
    flags: u8,
) -> Result<u16, u32> {
    let Some(eth) = ptr_at::<EthHdr>(ctx.data(), ctx.data_end(), 0) else {
        return Err(counter::DROP_MALFORMED);
    };
    // SAFETY: bounds-checked; read in place, not copied to the stack.
    let eth = unsafe { &*eth };
    // The return entry is written where the port search keeps it (built here it would cost
    // stack the search's callbacks need).
    let reply = |r: &mut NatEntryOf<F::A>| {
        r.client_addr = flow.saddr;
        r.vip_addr = flow.daddr;
        r.client_port = flow.sport;
        r.vip_port = flow.dport;
        r.ifindex = ctx.ingress_ifindex() as u32;
        r.backend_id = backend_id;
        r.client_mac = eth.src_addr;
        r.lb_mac = eth.dst_addr;
        r.last_seen = 0;
        r.flags = flags;
        r._pad = [0; 3];
    };
    snat::reserve::<F>(backend, flow.proto, hash, reply, midstream, now)
}

/// Whether service `id` is in flood mode on this CPU, counting this SYN (see
/// [`lb_common::flood_step`]); never with the rate 0.
#[inline(always)]
fn flooded(id: u32, now: u64, p: &Params) -> bool {
    if p.dsr_flood_rate == 0 {
        return false;
    }
    match FLOOD.get_ptr_mut(id) {
        // SAFETY: this CPU's slot of a per-CPU array of plain integers.
        Some(w) => lb_common::flood_step(unsafe { &mut *w }, p.dsr_flood_rate, now),
        None => false,
    }
}

/// Whether a SYN of a new connection from `saddr` is within its source's rate (this CPU's bucket
/// of it); always, with the limit off. The sketch answers first for sources whose cell is
/// quiet, without reading the bucket: a cold line for most new sources (lb-bench: up to 0.2×
/// Katran's cold SYN, docs/performance.md). See [`lb_common::SynCell`].
#[inline(always)]
fn syn_allowed<A: lb_common::FlowAddr>(saddr: A, now: u64, p: &Params) -> bool {
    let rate = p.syn_rate_per_source;
    if rate == 0 {
        return true;
    }
    let (cell, bucket) = syn_slots(saddr);
    if let Some(c) = SYN_SKETCH.get_ptr_mut(cell) {
        // SAFETY: this CPU's slot of a per-CPU array of plain integers.
        if unsafe { (*c).quiet(now, syn_quiet(rate)) } {
            return true;
        }
    }
    match SYN_RATE.get_ptr_mut(bucket) {
        // SAFETY: as above.
        Some(b) => ratelimit::take(unsafe { &mut *b }, rate, p.syn_rate_scaled, now),
        None => true,
    }
}

/// The backend for a new flow: the ring's slot for `hash`. If that backend cannot take new flows
/// (its flag is written before the ring is rebuilt, so a verdict acts at once), further slots;
/// none found: no backend (dropped, the client retries). Under `USE_UNAVAILABLE` the ring's
/// pick is taken as it is.
#[inline(always)]
pub fn select<F: Family>(
    service_id: u32,
    service_flags: u32,
    hash: u64,
    ring_size: u32,
) -> Option<(u32, &'static BackendInfoOf<F::A>)> {
    let base = service_id.checked_mul(ring_size)?;
    let mut h = hash;
    for _ in 0..SELECT_TRIES {
        let id = *RINGS.get(base + (h as u32).checked_rem(ring_size)?)?;
        if id == NO_BACKEND {
            return None;
        }
        let b = F::backends().get(id)?;
        if service_flags & service_flags::USE_UNAVAILABLE != 0
            || b.flags & (backend_flags::UP | backend_flags::DRAINED) == backend_flags::UP
        {
            return Some((id, b));
        }
        h = fmix64(h);
    }
    None
}

/// Backend → SNAT address. `None`: no such flow (the host's own traffic; passed by the caller).
/// `IN_PROXY`: called by the SYN proxy's program, with the segment translated; the balancer
/// hands a proxied flow's reply over to it.
#[inline(always)]
pub fn reply<F: Family, const IN_PROXY: bool>(
    ctx: &XdpContext,
    flow: &Flow<F::A>,
) -> Option<Verdict> {
    let k = FlowKeyOf::new(flow.saddr, flow.daddr, flow.sport, flow.dport, flow.proto);
    let p = params();
    let slot = nat_find::<F>(&k, k.hash(), p)?;
    // SAFETY: a map value of plain integers.
    let held = unsafe { &mut (*slot).entry };
    if !IN_PROXY
        && held.flags & nat_flags::PROXIED != 0
        && !proxied::to_client::<F>(ctx, flow, held)
    {
        return Some(to_proxy::<F>(ctx, PROXY_ENTRY));
    }
    let now = clock::now();
    // Whether the backend had sent anything on this flow before this packet.
    let answered = held.last_seen != 0;
    if now.saturating_sub(held.last_seen) > REFRESH_NS {
        held.last_seen = now;
    }
    // What this reply tells of the flow: it got going (more than a SYN+ACK), it carries data.
    // Each bit is written once per flow.
    let mut seen = 0;
    if flow.proto != PROTO_TCP || flow.tcp_flags & (TCP_SYN | TCP_ACK) != TCP_SYN | TCP_ACK {
        seen |= nat_flags::ANSWERED;
    }
    if flow.payload_len != 0 {
        seen |= nat_flags::DATA_BACK;
    }
    if held.flags & seen != seen {
        held.flags |= seen;
    }
    // A copy: read in place the return path cost IPv4 ~35 ns more (lb-bench; the IPv6 program
    // has the stack for it). The proxy's program has not: it reads in place.
    let copy;
    let nat = if IN_PROXY {
        &*held
    } else {
        copy = *held;
        &copy
    };
    if flow.ttl <= 1 {
        return Some((xdp_action::XDP_DROP, counter::DROP_TTL));
    }
    if flow.tcp_flags & (TCP_FIN | TCP_RST) != 0 {
        let fwd = FlowKeyOf::new(
            nat.client_addr,
            nat.vip_addr,
            nat.client_port,
            nat.vip_port,
            flow.proto,
        );
        if let Some(slot) = ct_find::<F>(&fwd, fwd.hash(), p) {
            // SAFETY: a map value of plain integers.
            let e = unsafe { &mut (*slot).entry };
            if flow.tcp_flags & TCP_RST != 0 {
                passive::backend_reset(e, nat.backend_id, flow.dport, answered);
            }
            closing(e, flow.tcp_flags, ct_flags::FIN_BACKEND, now);
        }
    }
    stats::count(counter::REPLY);
    let rw = Rewrite {
        src: &nat.vip_addr,
        dst: &nat.client_addr,
        addr_csum: Some(nat.reply_csum),
        sport: nat.vip_port,
        dport: nat.client_port,
        smac: &nat.lb_mac,
        dmac: &nat.client_mac,
    };
    Some(transmit::<F>(ctx, flow, &rw, nat.ifindex))
}

/// Rewrites the frame and sends it out of `ifindex`.
#[inline(always)]
pub fn transmit<F: Family>(
    ctx: &XdpContext,
    flow: &Flow<F::A>,
    rw: &Rewrite<'_, F::A>,
    ifindex: u32,
) -> Verdict {
    if nat::apply::<F>(ctx.data(), ctx.data_end(), flow, rw).is_none() {
        return (xdp_action::XDP_DROP, counter::DROP_MALFORMED);
    }
    send_out(ctx, ifindex)
}
