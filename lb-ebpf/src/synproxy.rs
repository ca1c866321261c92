//! The SYN proxy of full-NAT TCP services (`syn_proxy = "on"`): lb answers a client's SYN
//! itself, from XDP, with a SYN+ACK whose sequence number is a cookie (lb_common's synproxy.rs),
//! and takes no state. Only the client's ACK that returns a valid cookie creates the flow: lb
//! then sends the backend a SYN with the client's options. A spoofed flood never answers, so it
//! never reaches the tables or the backends.
//!
//! The client is given a zero window until the backend answered, so it holds its data (nothing
//! is lost, nothing is held here). The backend's SYN+ACK gives the sequence and timestamp
//! offsets; it becomes the client's window update, one already acknowledged byte at lb's initial
//! sequence number (as a keepalive), which the client acknowledges at once: that ACK completes
//! the backend's handshake. XDP sends one frame for each it receives, and this needs no second.
//! From then on both directions are translated: sequence and acknowledgement numbers, SACK
//! blocks, timestamps, the backend's window to lb's scale.
//!
//! A program of its own per family (`lb_synproxy`, `lb_synproxy6`), tail-called by the
//! balancer for a proxied service's packet without a flow and for every packet of a proxied
//! flow: verified apart, and nothing of it on other flows' path.
#![cfg_attr(not(target_arch = "bpf"), allow(dead_code))]

use core::ffi::c_void;

use aya_ebpf::{
    bindings::xdp_action,
    helpers::{bpf_csum_diff, bpf_ktime_get_tai_ns, bpf_loop, bpf_xdp_adjust_tail},
    macros::map,
    maps::PerCpuArray,
    programs::XdpContext,
};
use lb_common::{
    BackendInfoOf, COOKIE_MSS, COOKIE_TICK_SHIFT, CookieKey, CtEntry, FlowAddr, FlowKeyOf,
    MAX_OPTS, NO_WSCALE, NextHop, PROTO_TCP, PROXY_OPEN, PROXY_SYN, PROXY_TRANSLATE, PROXY_WSCALE,
    ProxyFlow, SynOpts, TcpOpts, WalkMode, Walker, addr_flags, backend_flags, check_cookie,
    cookie_words, counter, ct_flags, ct_state, make_cookie, mss_index, nat_flags, proxy_fast_ports,
    proxy_fast_slot, proxy_opts, proxy_state, rescale, service_flags, trace_kind, ts_decode,
    ts_encode,
};
use network_types::eth::EthHdr;

use crate::{
    clock,
    csum::{diff32, fold, update},
    family::{Family, lookup_addr},
    fib, flow,
    maps::{COOKIE_KEYS, NEXTHOPS, PROXY_WORK, ProxyWork, params},
    parse::{Flow, MAX_L4_OFF, TCP_ACK, TCP_FIN, TCP_RST, TCP_SYN},
    ptr::{opaque, ptr_at_mut_checked, read_at_checked},
    stats,
    table::{ct_find, ct_live, ct_store},
    trace,
    verdict::{Verdict, send_out},
};

/// The fixed TCP header, as bytes: ports 0, sequence 4, acknowledgement 8, data offset 12,
/// flags 13, window 14, checksum 16, urgent pointer 18.
const HDR: usize = 20;
type Hdr = [u8; HDR];
/// How long lb sends the backend its SYN again (at the client's zero-window probes) before the
/// connection is given up and the client reset: a backend on the same network answers in
/// milliseconds or is down.
const PENDING_TIMEOUT_NS: u64 = 3_000_000_000;
/// MSS assumed for a SYN without the option (RFC 9293).
const DEFAULT_MSS: u16 = 536;

const DROP: u32 = xdp_action::XDP_DROP;

#[inline(always)]
fn stage<F: Family>(ctx: &XdpContext, stage: u32) -> Verdict {
    crate::verdict::to_proxy::<F>(ctx, stage)
}

/// The proxy's first stage, for a parsed TCP packet the balancer handed over: a SYN is answered
/// here, a backend's segment translated here; a client's segment of a proxied flow goes on to
/// the translating stage, an ACK without a flow to the opening stage. Three programs, each with
/// the stack BPF allows one (512 bytes): the work of all three took more in one.
#[inline(always)]
pub fn handle<F: Family>(ctx: &XdpContext, flow: &Flow<F::A>) -> Verdict {
    if flow.proto != PROTO_TCP {
        return (DROP, counter::DROP_SYN_PROXY_INVALID);
    }
    let flags = lookup_addr::<F>(flow.daddr);
    // The segments answered with one of lb's own are checked first (at one call site: each
    // costs the verifier a walk of its own). A backend's SYN+ACK becomes the client's window
    // update and one without data may be a TIME_WAIT's ACK (its data segments are translated);
    // a client's SYN is answered with the cookie's SYN+ACK.
    let answered = if flags & addr_flags::SNAT != 0 {
        flow.tcp_flags & TCP_SYN != 0 || flow.payload_len == 0
    } else {
        flags & addr_flags::VIP != 0 && is_new_syn(flow.tcp_flags)
    };
    if answered && !segment_ok::<F>(ctx, flow) {
        return (DROP, counter::DROP_SYN_PROXY_CHECKSUM);
    }
    // Either way, before anything is written: a backend's SYN+ACK becomes the window update
    // before its reply's bookkeeping, which would drop it then.
    if flow.ttl <= 1 {
        return (DROP, counter::DROP_TTL);
    }
    if flags & addr_flags::SNAT != 0 {
        let v = from_backend::<F>(ctx, flow);
        if v != NONE {
            let v = unpack(v);
            after_reply::<F>(flow, v.1);
            return v;
        }
    }
    if flags & addr_flags::VIP == 0 {
        return (xdp_action::XDP_PASS, counter::PASS_NOT_VIP);
    }
    let p = params();
    let now = clock::now();
    if is_new_syn(flow.tcp_flags) {
        if trace::on() {
            noted::<F>(trace_kind::PROXY_COOKIE, flow);
        }
        return unpack(answer_syn::<F>(ctx, flow, now));
    }
    let k = FlowKeyOf::new(flow.saddr, flow.daddr, flow.sport, flow.dport, flow.proto);
    if let Some(slot) = ct_find::<F>(&k, k.hash(), p) {
        // SAFETY: a map value of plain integers.
        let e = unsafe { &(*slot).entry };
        // A closing flow's 4-tuple used again at once (a client cycling through its ports):
        // the cookie's ACK of the new connection opens it, not translated as the old one's.
        if e.flags & ct_flags::PROXIED != 0
            && ct_live(e, now, p)
            && !(e.state == ct_state::TCP_CLOSING && cookie_ack(ctx, flow))
        {
            return stash_and::<F>(ctx, flow, PROXY_TRANSLATE);
        }
    }
    if flow.tcp_flags & (TCP_SYN | TCP_RST | TCP_ACK) != TCP_ACK {
        return (DROP, counter::DROP_SYN_PROXY_INVALID);
    }
    stash_and::<F>(ctx, flow, PROXY_OPEN)
}

// The parsed flow handed from the first stage to the next (a tail call keeps nothing): the
// next reads it instead of parsing the frame again, whose stack it could not spare (IPv6).
#[map(name = "LB_PROXY_FLOW")] // lb_common::map_name::PROXY_FLOW
static PROXY_FLOW: PerCpuArray<Flow<u32>> = PerCpuArray::with_max_entries(1, 0);
#[map(name = "LB_PROXY_FLOW6")] // lb_common::map_name::PROXY_FLOW6
static PROXY_FLOW6: PerCpuArray<Flow<lb_common::Addr6>> = PerCpuArray::with_max_entries(1, 0);

/// This CPU's handed-over flow of family `F` (a map per family; picked by the address size).
#[inline(always)]
fn stash<F: Family>() -> Option<*mut Flow<F::A>> {
    if core::mem::size_of::<F::A>() == core::mem::size_of::<u32>() {
        PROXY_FLOW.get_ptr_mut(0).map(|p| p.cast())
    } else {
        PROXY_FLOW6.get_ptr_mut(0).map(|p| p.cast())
    }
}

/// Hands `flow` over to stage `next`.
#[inline(always)]
fn stash_and<F: Family>(ctx: &XdpContext, flow: &Flow<F::A>, next: u32) -> Verdict {
    let Some(p) = stash::<F>() else {
        return (DROP, counter::DROP_MALFORMED);
    };
    // SAFETY: this CPU's slot, read by the next stage on this CPU, for this packet.
    unsafe {
        (*p).saddr = flow.saddr;
        (*p).daddr = flow.daddr;
        (*p).sport = flow.sport;
        (*p).dport = flow.dport;
        (*p).proto = flow.proto;
        (*p).tcp_flags = flow.tcp_flags;
        (*p).ttl = flow.ttl;
        (*p).l3_off = flow.l3_off;
        (*p).l4_off = flow.l4_off;
        (*p).payload_len = flow.payload_len;
    }
    stage::<F>(ctx, next)
}

/// The flow the first stage handed over, its offsets bounded again for the verifier (a map
/// value is any number to it); `None` if out of bounds (not reached).
#[inline(always)]
pub fn handed_over<F: Family>(ctx: &XdpContext) -> Option<Flow<F::A>> {
    // SAFETY: this CPU's slot, written by the first stage for this packet.
    let f = unsafe { &*stash::<F>()? };
    let len = ctx.data_end() - ctx.data();
    let (l3_off, l4_off) = (f.l3_off, f.l4_off);
    if l3_off > 18 || l4_off > MAX_L4_OFF || l4_off >= len {
        return None;
    }
    Some(Flow {
        saddr: f.saddr,
        daddr: f.daddr,
        sport: f.sport,
        dport: f.dport,
        proto: f.proto,
        tcp_flags: f.tcp_flags,
        ttl: f.ttl,
        l3_off,
        l4_off,
        payload_len: f.payload_len,
    })
}

/// The opening stage: an ACK without a flow, whose cookie is checked.
#[inline(always)]
pub fn handle_open<F: Family>(ctx: &XdpContext, flow: &Flow<F::A>) -> Verdict {
    let k = FlowKeyOf::new(flow.saddr, flow.daddr, flow.sport, flow.dport, flow.proto);
    let Some(w) = work() else {
        return (DROP, counter::DROP_MALFORMED);
    };
    let Some(h) = read_segment(ctx, flow.l4_off, &mut w.old) else {
        return (DROP, counter::DROP_MALFORMED);
    };
    create::<F>(ctx, flow, k.hash(), clock::now(), &h)
}

/// The last stage: the client's segment becomes its backend's SYN (the flow's entries were
/// made by the opening stage, or by a pending flow's client's probe in the translating one).
#[inline(always)]
pub fn handle_syn<F: Family>(ctx: &XdpContext, flow: &Flow<F::A>) -> Verdict {
    let p = params();
    let k = FlowKeyOf::new(flow.saddr, flow.daddr, flow.sport, flow.dport, flow.proto);
    let (Some(slot), Some(pf)) = (ct_find::<F>(&k, k.hash(), p), F::proxies().get_ptr(&k)) else {
        return (DROP, counter::DROP_SYN_PROXY_INVALID);
    };
    // SAFETY: map values of plain integers.
    let (e, pf) = unsafe { (&(*slot).entry, &*pf) };
    let Some(h) = read_at_checked::<Hdr>(ctx.data(), ctx.data_end(), flow.l4_off) else {
        return (DROP, counter::DROP_MALFORMED);
    };
    match syn_target::<F>(ctx, e.backend_id, e.snat_port, clock::now()) {
        Ok(t) => unpack(send_syn::<F>(ctx, flow, Some(pf), &t, &h)),
        Err(reason) => (DROP, reason),
    }
}

/// The translating stage: a client's segment of a live proxied flow.
#[inline(always)]
pub fn handle_translate<F: Family>(ctx: &XdpContext, flow: &Flow<F::A>) -> Verdict {
    let p = params();
    let k = FlowKeyOf::new(flow.saddr, flow.daddr, flow.sport, flow.dport, flow.proto);
    let hash = k.hash();
    let Some(slot) = ct_find::<F>(&k, hash, p) else {
        return (DROP, counter::DROP_SYN_PROXY_INVALID);
    };
    // SAFETY: a map value of plain integers.
    let e = unsafe { &mut (*slot).entry };
    let Some(w) = work() else {
        return (DROP, counter::DROP_MALFORMED);
    };
    let Some(h) = read_segment(ctx, flow.l4_off, &mut w.old) else {
        return (DROP, counter::DROP_MALFORMED);
    };
    translate_client::<F>(ctx, flow, e, hash, &h)
}

// The proxy's parts are functions of their own (BPF-to-BPF calls), so that no stack frame
// holds them all (BPF allows 512 bytes along a chain of calls). A call returns one register:
// the verdict packed into a u64 (`pack`), and its pointer arguments are made opaque (see
// `ptr::opaque`), at most five.

/// "No verdict" (not a proxied flow's reply).
const NONE: u64 = u64::MAX;

#[inline(always)]
fn pack(v: Verdict) -> u64 {
    (u64::from(v.0) << 32) | u64::from(v.1)
}

#[inline(always)]
fn unpack(v: u64) -> Verdict {
    ((v >> 32) as u32, v as u32)
}

#[inline(always)]
fn be32(h: &Hdr, at: usize) -> u32 {
    u32::from_be_bytes([h[at], h[at + 1], h[at + 2], h[at + 3]])
}

#[inline(always)]
fn put32(h: &mut Hdr, at: usize, v: u32) {
    let b = v.to_be_bytes();
    h[at] = b[0];
    h[at + 1] = b[1];
    h[at + 2] = b[2];
    h[at + 3] = b[3];
}

#[inline(always)]
fn tick() -> u32 {
    // SAFETY: a helper without arguments.
    (unsafe { bpf_ktime_get_tai_ns() } >> COOKIE_TICK_SHIFT) as u32
}

#[inline(always)]
fn is_new_syn(flags: u8) -> bool {
    flags & (TCP_SYN | TCP_ACK) == TCP_SYN
}

/// This CPU's working copies of options.
#[inline(always)]
fn work() -> Option<&'static mut ProxyWork> {
    // SAFETY: this CPU's slot, used by this packet only.
    PROXY_WORK.get_ptr_mut(0).map(|w| unsafe { &mut *w })
}

/// Walks the options (`w.old` reading, or `w.new` translating: `on_new`) with `walker`, in a
/// `bpf_loop` (a walk unrolled for each of its callers took the program past the verifier's
/// limit); what it read, `None` if malformed.
#[inline(always)]
fn walk(w: &mut ProxyWork, walker: Walker, on_new: bool) -> Option<SynOpts> {
    w.walker = walker;
    w.on_new = on_new;
    // SAFETY: a callback of this program; it finds its state in this CPU's PROXY_WORK.
    unsafe {
        bpf_loop(
            MAX_OPTS as u32,
            opt_step as *mut c_void,
            core::ptr::null_mut(),
            0,
        )
    };
    // Read back through volatile loads: `w` is a `&mut`, which LLVM takes for memory nothing
    // else changes, and the callback's changes reach it through another pointer (`work()`);
    // plain loads were answered with the values stored above (a walk that read no timestamp).
    // SAFETY: reads of fields of a valid map value.
    let (bad, syn) = unsafe {
        (
            core::ptr::read_volatile(&w.walker.bad),
            core::ptr::read_volatile(&w.walker.syn),
        )
    };
    (!bad).then_some(syn)
}

/// One step of the walk in this CPU's `PROXY_WORK`: 1 (stop) when it is over.
extern "C" fn opt_step(_: u32, _: *mut c_void) -> i64 {
    let Some(w) = work() else { return 1 };
    let opts = if w.on_new { &mut w.new } else { &mut w.old };
    if opts.step(&mut w.walker) { 0 } else { 1 }
}

/// A walk that translates `w.new` (a copy of `w.old`) as `mode` says; `false` if malformed.
#[inline(always)]
fn translate(w: &mut ProxyWork, mode: WalkMode, pf: &ProxyFlow) -> bool {
    w.new = w.old;
    let mut walker = Walker::new(mode);
    walker.seq_off = pf.seq_off;
    walker.ts_off = pf.ts_off;
    walker.cts_off = pf.cts_off;
    walk(w, walker, true).is_some()
}

/// The TCP header at `l4_off`; its options into `o`.
#[inline(always)]
fn read_segment(ctx: &XdpContext, l4_off: usize, o: &mut TcpOpts) -> Option<Hdr> {
    let (data, data_end) = (ctx.data(), ctx.data_end());
    let h = read_at_checked::<Hdr>(data, data_end, l4_off)?;
    let len = ((h[12] >> 4) as usize * 4).checked_sub(HDR)?;
    o.len = len.min(MAX_OPTS);
    for i in 0..MAX_OPTS / 4 {
        if i * 4 >= o.len {
            break;
        }
        let w = read_at_checked::<[u8; 4]>(data, data_end, l4_off + HDR + i * 4)?;
        o.bytes[i * 4] = w[0];
        o.bytes[i * 4 + 1] = w[1];
        o.bytes[i * 4 + 2] = w[2];
        o.bytes[i * 4 + 3] = w[3];
    }
    Some(h)
}

/// Writes the changes from `old` to `new` (headers; options from `w.old` to `w.new`, of the
/// same length) into the segment at `l4_off`, with its checksum updated.
#[inline(always)]
fn patch(ctx: &XdpContext, l4_off: usize, old: &Hdr, new: &Hdr, w: &ProxyWork) -> Option<()> {
    let (old, new) = ((old, &w.old), (new, &w.new));
    let (data, data_end) = (ctx.data(), ctx.data_end());
    let word = |b: &[u8], i: usize| u32::from_ne_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
    let mut diff = 0;
    // Words 0-3: ports, sequence, acknowledgement, offset/flags/window (the checksum's word is
    // never changed here).
    for i in 0..4 {
        let (a, b) = (word(old.0, i * 4), word(new.0, i * 4));
        if a != b {
            diff += diff32(a, b);
            let p = ptr_at_mut_checked::<[u8; 4]>(data, data_end, l4_off + i * 4)?;
            // SAFETY: bounds-checked.
            unsafe { *p = b.to_ne_bytes() };
        }
    }
    for i in 0..MAX_OPTS / 4 {
        if i * 4 >= old.1.len {
            break;
        }
        let (a, b) = (word(&old.1.bytes, i * 4), word(&new.1.bytes, i * 4));
        if a != b {
            diff += diff32(a, b);
            let p = ptr_at_mut_checked::<[u8; 4]>(data, data_end, l4_off + HDR + i * 4)?;
            // SAFETY: bounds-checked.
            unsafe { *p = b.to_ne_bytes() };
        }
    }
    let p = ptr_at_mut_checked::<Hdr>(data, data_end, l4_off)?;
    // SAFETY: bounds-checked.
    unsafe {
        let h = &mut *p;
        let check = update(u16::from_ne_bytes([h[16], h[17]]), diff).to_ne_bytes();
        h[16] = check[0];
        h[17] = check[1];
    }
    Some(())
}

/// A segment lb writes over the one it received (its ports and addressing given).
struct Out {
    seq: u32,
    ack: u32,
    flags: u8,
    window: u16,
    /// Bytes of payload (zeros): 0 or 1.
    payload: usize,
}

/// Replaces the TCP segment of `flow` with `out` and options `opts`, from `src:sport` to
/// `dst:dport` (the IP header's addresses already), resizing the frame and the IP length, with
/// a checksum computed anew.
#[inline(always)]
fn emit<F: Family>(
    ctx: &XdpContext,
    flow: &Flow<F::A>,
    addrs: (&F::A, &F::A),
    ports: (u16, u16),
    out: &Out,
    opts: &TcpOpts,
) -> Option<()> {
    let opt_len = (opts.len + 3) & !3;
    if opt_len > MAX_OPTS {
        return None;
    }
    let seg_len = HDR + opt_len + out.payload;
    let ip_len = flow.l4_off - flow.l3_off + seg_len;
    let delta = (flow.l4_off + seg_len) as i32 - (ctx.data_end() - ctx.data()) as i32;
    // SAFETY: a valid XDP context; every packet pointer is taken again below.
    if delta != 0 && unsafe { bpf_xdp_adjust_tail(ctx.ctx, delta) } != 0 {
        return None;
    }
    let (data, data_end) = (ctx.data(), ctx.data_end());
    F::set_ip_len(data, data_end, flow.l3_off, ip_len)?;
    let mut h: Hdr = [0; HDR];
    h[0..2].copy_from_slice(&ports.0.to_ne_bytes());
    h[2..4].copy_from_slice(&ports.1.to_ne_bytes());
    put32(&mut h, 4, out.seq);
    put32(&mut h, 8, out.ack);
    h[12] = (((HDR + opt_len) / 4) << 4) as u8;
    h[13] = out.flags;
    h[14..16].copy_from_slice(&out.window.to_be_bytes());
    let mut sum = F::addr_sum(addrs.0, addrs.1)
        + u32::from(u16::from_ne_bytes([0, PROTO_TCP]))
        + u32::from(u16::from_ne_bytes((seg_len as u16).to_be_bytes()));
    for i in 0..HDR / 2 {
        sum += u32::from(u16::from_ne_bytes([h[2 * i], h[2 * i + 1]]));
    }
    // Padding past the options is zeros (end of options); the payload byte is a zero too.
    for i in 0..MAX_OPTS / 2 {
        if 2 * i < opts.len {
            let hi = opts.bytes[2 * i];
            let lo = if 2 * i + 1 < opts.len {
                opts.bytes[2 * i + 1]
            } else {
                0
            };
            sum += u32::from(u16::from_ne_bytes([hi, lo]));
        }
    }
    h[16..18].copy_from_slice(&(!fold(sum)).to_ne_bytes());
    let p = ptr_at_mut_checked::<Hdr>(data, data_end, flow.l4_off)?;
    // SAFETY: bounds-checked.
    unsafe { *p = h };
    for i in 0..MAX_OPTS / 4 {
        if i * 4 >= opt_len {
            break;
        }
        let at = i * 4;
        let byte = |j: usize| {
            if at + j < opts.len && at + j < MAX_OPTS {
                opts.bytes[at + j]
            } else {
                0
            }
        };
        let p = ptr_at_mut_checked::<[u8; 4]>(data, data_end, flow.l4_off + HDR + at)?;
        // SAFETY: bounds-checked.
        unsafe { *p = [byte(0), byte(1), byte(2), byte(3)] };
    }
    if out.payload != 0 {
        let p = ptr_at_mut_checked::<u8>(data, data_end, flow.l4_off + HDR + opt_len)?;
        // SAFETY: bounds-checked.
        unsafe { *p = 0 };
    }
    Some(())
}

/// Whether the TCP segment of `flow` (header, options, payload, with the pseudo-header) has a
/// right checksum. For the segments the proxy answers with one of its own or rebuilds: those get
/// checksums computed anew, which must not make a damaged segment a right one (a translated
/// segment's checksum is updated incrementally: a wrong one stays wrong). Up to 1,596 bytes: a
/// longer one is refused too (a handshake's segments are short).
#[inline(never)]
fn segment_ok<F: Family>(ctx: &XdpContext, flow: &Flow<F::A>) -> bool {
    const BLOCK: usize = 64;
    let (ctx, flow) = (opaque(ctx), opaque(flow));
    let (data, data_end) = (ctx.data(), ctx.data_end());
    let Some(h) = read_at_checked::<[u8; 14]>(data, data_end, flow.l4_off) else {
        return false;
    };
    let len = usize::from(h[12] >> 4) * 4 + usize::from(flow.payload_len);
    let mut sum = u64::from(F::addr_sum(&flow.saddr, &flow.daddr))
        + u64::from(u16::from_ne_bytes([0, PROTO_TCP]))
        + u64::from(u16::from_ne_bytes((len as u16).to_be_bytes()));
    let (mut at, end) = (flow.l4_off, flow.l4_off + len);
    // 64-byte blocks summed by the kernel, then 4-byte words, then what is left.
    for _ in 0..24 {
        if at + BLOCK > end {
            break;
        }
        let Some(p) = ptr_at_mut_checked::<[u32; BLOCK / 4]>(data, data_end, at) else {
            return false;
        };
        // SAFETY: a bounds-checked block of the packet, read only; no `from` words.
        let s = unsafe { bpf_csum_diff(core::ptr::null_mut(), 0, p.cast(), BLOCK as u32, 0) };
        sum += u64::from(s as u32);
        at += BLOCK;
    }
    for _ in 0..BLOCK / 4 {
        if at + 4 > end {
            break;
        }
        let Some(w) = read_at_checked::<[u8; 4]>(data, data_end, at) else {
            return false;
        };
        sum += u64::from(u16::from_ne_bytes([w[0], w[1]]))
            + u64::from(u16::from_ne_bytes([w[2], w[3]]));
        at += 4;
    }
    if at + 2 <= end {
        let Some(w) = read_at_checked::<[u8; 2]>(data, data_end, at) else {
            return false;
        };
        sum += u64::from(u16::from_ne_bytes(w));
        at += 2;
    }
    if at < end {
        let Some(b) = read_at_checked::<u8>(data, data_end, at) else {
            return false;
        };
        sum += u64::from(u16::from_ne_bytes([b, 0]));
        at += 1;
    }
    // Folded in 64 bits: every carry kept.
    let mut sum = (sum & 0xffff_ffff) + (sum >> 32);
    for _ in 0..3 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    at == end && sum == 0xffff
}

/// Turns the frame back to where it came from: MACs and IP addresses swapped (TTL lowered).
#[inline(always)]
fn turn_back<F: Family>(ctx: &XdpContext, flow: &Flow<F::A>) -> Option<()> {
    let (data, data_end) = (ctx.data(), ctx.data_end());
    let eth = ptr_at_mut_checked::<EthHdr>(data, data_end, 0)?;
    // SAFETY: bounds-checked byte arrays.
    unsafe {
        core::mem::swap(&mut (*eth).src_addr, &mut (*eth).dst_addr);
    }
    // Swapped addresses leave the checksums' sums as they were.
    F::rewrite_ip(data, data_end, flow.l3_off, (&flow.daddr, &flow.saddr), 0)
}

/// Answers the sender of `flow` with `out` and options `opts` in place of its segment
/// (XDP_TX), counted as `reason`.
#[inline(always)]
fn answer<F: Family>(
    ctx: &XdpContext,
    flow: &Flow<F::A>,
    out: &Out,
    opts: &TcpOpts,
    reason: u32,
) -> Verdict {
    let sent = turn_back::<F>(ctx, flow).and_then(|()| {
        emit::<F>(
            ctx,
            flow,
            (&flow.daddr, &flow.saddr),
            (flow.dport, flow.sport),
            out,
            opts,
        )
    });
    match sent {
        Some(()) => (xdp_action::XDP_TX, reason),
        None => (DROP, counter::DROP_MALFORMED),
    }
}

/// The cookie's words of `flow` (client → VIP).
#[inline(always)]
fn words<A: FlowAddr>(flow: &Flow<A>) -> [u64; 5] {
    cookie_words(
        flow.saddr.to_addr6(),
        flow.daddr.to_addr6(),
        flow.sport,
        flow.dport,
    )
}

#[inline(always)]
fn key(slot: u32) -> Option<&'static CookieKey> {
    COOKIE_KEYS.get(slot).filter(|k| k.k0 | k.k1 != 0)
}

/// A SYN: answered with the cookie.
#[inline(never)]
fn answer_syn<F: Family>(ctx: &XdpContext, flow: &Flow<F::A>, now: u64) -> u64 {
    let (ctx, flow) = (opaque(ctx), opaque(flow));
    // A new connection of the service (what `syn_proxy = "auto"` measures).
    if let Some(svc) = flow::service::<F>(flow) {
        stats::count_attempt(svc.id);
    }
    let Some(w) = work() else {
        return pack((DROP, counter::DROP_MALFORMED));
    };
    let Some(h) = read_segment(ctx, flow.l4_off, &mut w.old) else {
        return pack((DROP, counter::DROP_MALFORMED));
    };
    pack(synack::<F>(ctx, flow, &h, w, now))
}

#[inline(always)]
fn synack<F: Family>(
    ctx: &XdpContext,
    flow: &Flow<F::A>,
    h: &Hdr,
    w: &mut ProxyWork,
    now: u64,
) -> Verdict {
    let Some(syn) = walk(w, Walker::new(WalkMode::Read), false) else {
        return (DROP, counter::DROP_SYN_PROXY_OPTIONS);
    };
    let Some(key) = key(0) else {
        return (DROP, counter::DROP_SYN_PROXY_INVALID);
    };
    let isn = be32(h, 4);
    let mss = if syn.mss == 0 { DEFAULT_MSS } else { syn.mss };
    let cookie = make_cookie(key, &words(flow), isn, tick(), mss_index(mss));
    let tsval = ts_encode((now / 1_000_000) as u32, syn.wscale, syn.sack);
    w.new.set_synack(F::PROXY_MSS, &syn, tsval);
    let out = Out {
        seq: cookie,
        ack: isn.wrapping_add(1),
        flags: TCP_SYN | TCP_ACK,
        window: 0,
        payload: 0,
    };
    answer::<F>(ctx, flow, &out, &w.new, counter::SYN_PROXY_SYNACK)
}

/// The MSS index of the cookie `cookie` if it is valid for a SYN with sequence number `isn` of
/// `flow` under either key, else [`NONE`]. Apart: the hash's state is stack the opening stage
/// cannot spare along its calls.
#[inline(never)]
fn cookie_check<A: FlowAddr>(flow: &Flow<A>, isn: u32, cookie: u32) -> u64 {
    let flow = opaque(flow);
    let (t, fw) = (tick(), words(flow));
    key(0)
        .and_then(|k| check_cookie(k, &fw, isn, cookie, t))
        .or_else(|| key(1).and_then(|k| check_cookie(k, &fw, isn, cookie, t)))
        .map_or(NONE, u64::from)
}

/// Whether the client's segment `flow` is a pure ACK (no SYN, FIN or RST) whose
/// acknowledgement validates as a cookie: a new connection's, whatever the table holds.
#[inline(always)]
fn cookie_ack<A: FlowAddr>(ctx: &XdpContext, flow: &Flow<A>) -> bool {
    if flow.tcp_flags & (TCP_SYN | TCP_FIN | TCP_RST | TCP_ACK) != TCP_ACK {
        return false;
    }
    read_at_checked::<Hdr>(ctx.data(), ctx.data_end(), flow.l4_off).is_some_and(|h| {
        let (isn, cookie) = (be32(&h, 4).wrapping_sub(1), be32(&h, 8).wrapping_sub(1));
        cookie_check(flow, isn, cookie) != NONE
    })
}

/// An ACK without a flow (its options in this CPU's `work().old`): with a valid cookie, the
/// flow is created and the backend gets its SYN.
#[inline(always)]
fn create<F: Family>(ctx: &XdpContext, flow: &Flow<F::A>, hash: u64, now: u64, h: &Hdr) -> Verdict {
    let invalid = (DROP, counter::DROP_SYN_PROXY_INVALID);
    if !segment_ok::<F>(ctx, flow) {
        return (DROP, counter::DROP_SYN_PROXY_CHECKSUM);
    }
    let Some(w) = work() else {
        return invalid;
    };
    let k = FlowKeyOf::new(flow.saddr, flow.daddr, flow.sport, flow.dport, flow.proto);
    let cookie = be32(h, 8).wrapping_sub(1);
    let isn = be32(h, 4).wrapping_sub(1);
    let mss_idx = cookie_check(flow, isn, cookie);
    if mss_idx == NONE {
        return invalid;
    }
    let Some(ts) = walk(w, Walker::new(WalkMode::Read), false).map(|o| o.ts) else {
        return (DROP, counter::DROP_SYN_PROXY_OPTIONS);
    };
    let (wscale, sack) = match ts {
        Some((_, ecr)) => ts_decode(ecr),
        None => (NO_WSCALE, false),
    };
    let Some(svc) = flow::service::<F>(flow) else {
        return (DROP, counter::DROP_NO_SERVICE);
    };
    if svc.flags & service_flags::DROP != 0 {
        return (DROP, counter::DROP_NO_BACKEND);
    }
    let p = params();
    let Some((backend_id, backend)) = flow::select::<F>(svc.id, svc.flags, hash, p.ring_size)
    else {
        return (DROP, counter::DROP_NO_BACKEND);
    };
    // Direct server return cannot be proxied (its replies bypass lb): configuration refuses it.
    if backend.flags & backend_flags::ENCAP != 0 {
        return (DROP, counter::DROP_NO_BACKEND);
    }
    let snat_port = match flow::nat_port::<F>(
        ctx,
        flow,
        backend,
        backend_id,
        hash,
        false,
        now,
        nat_flags::PROXIED,
    ) {
        Ok(port) => port,
        Err(reason) => return (DROP, reason),
    };
    let mut opts_bits = 0;
    if ts.is_some() {
        opts_bits |= proxy_opts::TS;
    }
    if sack {
        opts_bits |= proxy_opts::SACK;
    }
    let (client_tsval, lb_tsval) = ts.unwrap_or((0, 0));
    w.flow = ProxyFlow {
        cookie,
        client_isn: isn,
        seq_off: 0,
        ts_off: 0,
        cts_off: 0,
        lb_tsval,
        client_tsval,
        _pad0: 0,
        syn_at: now,
        mss: COOKIE_MSS[(mss_idx & 3) as usize],
        state: proxy_state::PENDING,
        opts: opts_bits,
        client_wscale: wscale,
        wshift: 0,
        _pad: [0; 2],
    };
    if F::proxies().insert(&k, &w.flow, 0).is_err() {
        return (DROP, counter::DROP_NAT_FULL);
    }
    // An earlier connection's offsets on this 4-tuple would translate this one's segments.
    forget::<F>(hash, proxy_fast_ports(flow.sport, flow.dport));
    let entry = CtEntry {
        backend_id,
        service_id: svc.id,
        last_seen: now,
        snat_port,
        state: ct_state::TCP_SYN,
        flags: ct_flags::PROXIED
            | if svc.flags & service_flags::KEEP_FLOWS != 0 {
                ct_flags::KEEP
            } else {
                0
            },
        data_at: 0,
    };
    ct_store::<F>(&k, hash, &entry, now, p);
    stats::count(counter::CT_NEW);
    stats::count(counter::SYN_PROXY_ACK_VALID);
    stats::count_opened(svc.id, backend_id, ctx.data_end() - ctx.data());
    if trace::on() {
        noted::<F>(trace_kind::PROXY_CREATED, flow);
    }
    stage::<F>(ctx, PROXY_SYN)
}

/// Where the backend's SYN goes: its backend, the route there, the flow's SNAT port.
struct SynTarget<'a, A> {
    backend: &'a BackendInfoOf<A>,
    /// This CPU's cached next hop (a reference: a copy is stack the opening stage has not).
    nh: &'a NextHop,
    snat_port: u16,
}

/// The backend `backend_id`'s SYN target from SNAT port `snat_port` (its route looked up here,
/// in the caller's frame: the SYN's writing, a function of its own, then calls nothing that
/// needs stack).
#[inline(always)]
fn syn_target<F: Family>(
    ctx: &XdpContext,
    backend_id: u32,
    snat_port: u16,
    now: u64,
) -> Result<SynTarget<'static, F::A>, u32> {
    let backend = F::backends()
        .get(backend_id)
        .ok_or(counter::DROP_NO_BACKEND)?;
    fib::to_backend::<F>(ctx, backend_id, backend, PROTO_TCP, now)?;
    // The entry the lookup above left fresh.
    let nh = NEXTHOPS.get(backend_id).ok_or(counter::DROP_NO_ROUTE)?;
    Ok(SynTarget {
        backend,
        nh,
        snat_port,
    })
}

/// Rewrites the client's segment (`h`) into the SYN lb sends the backend for the proxied flow
/// `pf` (`None`: the one built in this CPU's `work().flow`), and sends it to `t`.
#[inline(never)]
fn send_syn<F: Family>(
    ctx: &XdpContext,
    flow: &Flow<F::A>,
    pf: Option<&ProxyFlow>,
    t: &SynTarget<'_, F::A>,
    h: &Hdr,
) -> u64 {
    let (ctx, flow, t, h) = (opaque(ctx), opaque(flow), opaque(t), opaque(h));
    let Some(w) = work() else {
        return pack((DROP, counter::DROP_MALFORMED));
    };
    let (opts, pf) = (&mut w.new, pf.map(opaque).unwrap_or(&w.flow));
    // The client's window, unscaled as a SYN's is.
    let window = u16::from_be_bytes([h[14], h[15]]);
    let window = if pf.client_wscale != NO_WSCALE {
        rescale(window, pf.client_wscale as i8)
    } else {
        window
    };
    let ts = (pf.opts & proxy_opts::TS != 0).then_some(pf.client_tsval.wrapping_add(pf.cts_off));
    opts.set_backend_syn(
        pf.mss,
        ts,
        pf.opts & proxy_opts::SACK != 0,
        pf.client_wscale,
    );
    let out = Out {
        seq: pf.client_isn,
        ack: 0,
        flags: TCP_SYN,
        window,
        payload: 0,
    };
    // Addressed to the backend first, so the segment's checksum is computed once, with its
    // final addresses (no incremental rewrite after it: stack this function cannot spare).
    let b = t.backend;
    let sent = to_backend_addrs::<F>(ctx, flow, b, t.nh).and_then(|()| {
        emit::<F>(
            ctx,
            flow,
            (&b.snat_addr, &b.addr),
            (t.snat_port, b.port),
            &out,
            opts,
        )
    });
    match sent {
        Some(()) => pack(send_out(ctx, t.nh.ifindex)),
        None => pack((DROP, counter::DROP_MALFORMED)),
    }
}

/// The frame's MACs and IP addresses to backend `b` through `nh` (TTL lowered).
#[inline(always)]
fn to_backend_addrs<F: Family>(
    ctx: &XdpContext,
    flow: &Flow<F::A>,
    b: &BackendInfoOf<F::A>,
    nh: &NextHop,
) -> Option<()> {
    let (data, data_end) = (ctx.data(), ctx.data_end());
    let eth = ptr_at_mut_checked::<EthHdr>(data, data_end, 0)?;
    // SAFETY: bounds-checked byte arrays.
    unsafe {
        (*eth).src_addr = nh.smac;
        (*eth).dst_addr = nh.dmac;
    }
    let addrs = F::addr_diff(&flow.saddr, &b.snat_addr) + F::addr_diff(&flow.daddr, &b.addr);
    F::rewrite_ip(data, data_end, flow.l3_off, (&b.snat_addr, &b.addr), addrs)
}

/// A client's segment of a live proxied flow (its options in this CPU's `work().old`).
#[inline(always)]
fn translate_client<F: Family>(
    ctx: &XdpContext,
    flow: &Flow<F::A>,
    e: &mut CtEntry,
    hash: u64,
    h: &Hdr,
) -> Verdict {
    let now = clock::now();
    let k = FlowKeyOf::new(flow.saddr, flow.daddr, flow.sport, flow.dport, flow.proto);
    let (Some(pf), Some(w)) = (F::proxies().get_ptr_mut(&k), work()) else {
        return (DROP, counter::DROP_SYN_PROXY_INVALID);
    };
    // SAFETY: a map value of plain integers.
    let pf = unsafe { &mut *pf };
    if pf.state != proxy_state::OPEN {
        return pending::<F>(ctx, flow, pf, e, h, w);
    }
    if !translate(w, WalkMode::ToBackend, pf) {
        return (DROP, counter::DROP_SYN_PROXY_OPTIONS);
    }
    remember::<F>(pf, hash, proxy_fast_ports(flow.sport, flow.dport));
    let mut new_h = *h;
    if h[13] & TCP_ACK != 0 {
        put32(&mut new_h, 8, be32(h, 8).wrapping_add(pf.seq_off));
    }
    if patch(ctx, flow.l4_off, h, &new_h, w).is_none() {
        return (DROP, counter::DROP_MALFORMED);
    }
    stats::count(counter::SYN_PROXY_TRANSLATED);
    // A proxied flow cannot move to another backend (its handshake was that backend's).
    flow::established::<F>(ctx, flow, e, hash, now).unwrap_or((DROP, counter::DROP_NO_BACKEND))
}

/// A client's segment while its backend has not answered: a pure ACK (its zero-window probe)
/// sends the backend the SYN again; after [`PENDING_TIMEOUT_NS`] the client is reset.
#[inline(always)]
fn pending<F: Family>(
    ctx: &XdpContext,
    flow: &Flow<F::A>,
    pf: &ProxyFlow,
    e: &mut CtEntry,
    h: &Hdr,
    w: &mut ProxyWork,
) -> Verdict {
    let now = clock::now();
    if h[13] & (TCP_RST | TCP_FIN) != 0 {
        flow::closing(e, h[13], ct_flags::FIN_CLIENT, now);
        return (DROP, counter::DROP_SYN_PROXY_PENDING);
    }
    // Answered below with a RST or a SYN of lb's own: checked.
    if !segment_ok::<F>(ctx, flow) {
        return (DROP, counter::DROP_SYN_PROXY_CHECKSUM);
    }
    if now.saturating_sub(pf.syn_at) > PENDING_TIMEOUT_NS {
        flow::closing(e, TCP_RST, 0, now);
        stats::count(counter::SYN_PROXY_FAILED);
        let out = Out {
            seq: pf.cookie.wrapping_add(1),
            ack: pf.client_isn.wrapping_add(1),
            flags: TCP_RST | TCP_ACK,
            window: 0,
            payload: 0,
        };
        w.new.set_timestamp(None);
        if trace::on() {
            noted::<F>(trace_kind::PROXY_FAILED, flow);
        }
        return answer::<F>(ctx, flow, &out, &w.new, counter::SYN_PROXY_RESET);
    }
    if flow.payload_len != 0 {
        return (DROP, counter::DROP_SYN_PROXY_PENDING);
    }
    stats::count(counter::SYN_PROXY_SYN_AGAIN);
    if trace::on() {
        noted::<F>(trace_kind::PROXY_SYN_AGAIN, flow);
    }
    stage::<F>(ctx, PROXY_SYN)
}

/// The backend's answer to lb's SYN is an ACK (`ack` its acknowledgement, its options in
/// `w.old`) of an earlier connection on the same 4-tuple: its TIME_WAIT refused the SYN, whose
/// sequence number and timestamp are the client's, unrelated to the earlier connection's when
/// the SNAT port was another client's (SNAT ports come round within seconds, TIME_WAIT lasts a
/// minute; Linux clients start each connection's timestamps at a random offset). A client's
/// own kernel would reset it and send its SYN again; lb has one packet to send, and cannot wait
/// for the client (its zero-window probe comes 200 ms later). So, once a flow, the SYN goes
/// again at once with a timestamp just past the one the ACK echoes, which the TIME_WAIT
/// accepts (RFC 6191), the client's timestamps moved by as much for the flow's life
/// (`cts_off`). Without timestamps, or a second time: a RST at the acknowledged sequence
/// number (RFC 793), which ends the TIME_WAIT, and the client's next probe sends the SYN.
#[inline(always)]
fn stale<F: Family>(
    ctx: &XdpContext,
    flow: &Flow<F::A>,
    pf: &mut ProxyFlow,
    ack: u32,
    w: &mut ProxyWork,
) -> Verdict {
    let echoed = walk(w, Walker::new(WalkMode::Read), false).and_then(|o| o.ts);
    let out = match echoed {
        Some((_, ecr)) if pf.opts & (proxy_opts::TS | proxy_opts::TS_MOVED) == proxy_opts::TS => {
            pf.cts_off = ecr.wrapping_add(1).wrapping_sub(pf.client_tsval);
            pf.opts |= proxy_opts::TS_MOVED;
            w.new.set_backend_syn(
                pf.mss,
                Some(ecr.wrapping_add(1)),
                pf.opts & proxy_opts::SACK != 0,
                pf.client_wscale,
            );
            Out {
                seq: pf.client_isn,
                ack: 0,
                flags: TCP_SYN,
                window: u16::MAX,
                payload: 0,
            }
        }
        _ => {
            w.new.set_timestamp(None);
            Out {
                seq: ack,
                ack: 0,
                flags: TCP_RST,
                window: 0,
                payload: 0,
            }
        }
    };
    answer::<F>(ctx, flow, &out, &w.new, counter::SYN_PROXY_STALE)
}

/// Backend → SNAT address: [`NONE`] when no proxied flow's.
#[inline(never)]
fn from_backend<F: Family>(ctx: &XdpContext, flow: &Flow<F::A>) -> u64 {
    let (ctx, flow) = (opaque(ctx), opaque(flow));
    reply_segment::<F>(ctx, flow).map_or(NONE, pack)
}

#[inline(always)]
fn reply_segment<F: Family>(ctx: &XdpContext, flow: &Flow<F::A>) -> Option<Verdict> {
    let Some(pf) = reply_flow::<F>(flow)?.1 else {
        return Some((DROP, counter::DROP_SYN_PROXY_INVALID));
    };
    // SAFETY: a map value of plain integers.
    let pf = unsafe { &mut *pf };
    let Some(w) = work() else {
        return Some((DROP, counter::DROP_MALFORMED));
    };
    let Some(h) = read_segment(ctx, flow.l4_off, &mut w.old) else {
        return Some((DROP, counter::DROP_MALFORMED));
    };
    Some(backend_segment::<F>(ctx, flow, pf, &h, w))
}

/// The proxied flow a backend's segment `flow` belongs to: its client → VIP key (from the
/// return path's entry) and its translation, if the proxy's map holds it. `None`: no return
/// path entry.
#[inline(always)]
fn reply_flow<F: Family>(flow: &Flow<F::A>) -> Option<(FlowKeyOf<F::A>, Option<*mut ProxyFlow>)> {
    let k = FlowKeyOf::new(flow.saddr, flow.daddr, flow.sport, flow.dport, flow.proto);
    let slot = crate::table::nat_find::<F>(&k, k.hash(), params())?;
    // SAFETY: a map value of plain integers.
    let nat = unsafe { &(*slot).entry };
    let fwd = FlowKeyOf::new(
        nat.client_addr,
        nat.vip_addr,
        nat.client_port,
        nat.vip_port,
        PROTO_TCP,
    );
    let pf = F::proxies().get_ptr_mut(&fwd);
    Some((fwd, pf))
}

/// After [`from_backend`] handled a backend's segment of a proxied flow (`flow`, its verdict's
/// counter `reason`): the flow's offsets put back where the balancer reads them ([`remember`]:
/// the flow opened, or its slot was another's), and the proxy's decision noted for the trace.
/// Out of line, its tables looked up again: in `from_backend`, the key or the hash kept across
/// the segment's handling took the IPv6 program's stack past BPF's 512 bytes.
#[inline(never)]
fn after_reply<F: Family>(flow: &Flow<F::A>, reason: u32) {
    let Some((fwd, Some(pf))) = reply_flow::<F>(opaque(flow)) else {
        return;
    };
    // SAFETY: a map value of plain integers, read only.
    let pf = unsafe { &*pf };
    let open = pf.state == proxy_state::OPEN;
    if open {
        remember::<F>(pf, fwd.hash(), proxy_fast_ports(fwd.sport, fwd.dport));
    }
    if trace::on() {
        let kind = if reason == counter::SYN_PROXY_STALE {
            trace_kind::PROXY_STALE
        } else if flow.tcp_flags & TCP_SYN != 0 && open {
            trace_kind::PROXY_OPENED
        } else if flow.tcp_flags & TCP_RST != 0 && !open {
            trace_kind::PROXY_FAILED
        } else {
            return;
        };
        trace::proxy(kind, fwd.src, fwd.dst, fwd.sport, fwd.dport);
    }
}

/// Notes the proxy's decision `kind` about the client's segment `flow` for the trace (behind
/// [`trace::on`]).
#[inline(always)]
fn noted<F: Family>(kind: u8, flow: &Flow<F::A>) {
    trace::proxy(kind, flow.saddr, flow.daddr, flow.sport, flow.dport);
}

/// Puts open flow `pf`'s offsets (the flow's hash `hash`, key ports `ports`) where the
/// balancer translates its common segments itself (proxied.rs): when it opens, and again from
/// any segment that came here (the slot was another flow's, or a new daemon's is empty).
#[inline(always)]
fn remember<F: Family>(pf: &ProxyFlow, hash: u64, ports: u32) {
    if let Some(f) = F::proxy_fast().get_ptr_mut(proxy_fast_slot(hash).0) {
        // SAFETY: an array map value of plain integers. Field by field: a whole value built
        // first would be a copy on the stack.
        unsafe {
            (*f).open = 0;
            (*f).seq_off = pf.seq_off;
            (*f).ts_off = pf.ts_off;
            (*f).cts_off = pf.cts_off;
            (*f).wshift = pf.wshift;
            (*f).tag = proxy_fast_slot(hash).1;
            (*f).ports = ports;
            (*f).open = 1;
        }
    }
}

/// Takes the offsets of the flow with `hash` and `ports` out of the balancer's reach.
#[inline(always)]
fn forget<F: Family>(hash: u64, ports: u32) {
    if let Some(f) = F::proxy_fast().get_ptr_mut(proxy_fast_slot(hash).0) {
        // SAFETY: an array map value of plain integers.
        unsafe {
            if (*f).holds(hash, ports) {
                (*f).open = 0;
            }
        }
    }
}

#[inline(always)]
fn backend_segment<F: Family>(
    ctx: &XdpContext,
    flow: &Flow<F::A>,
    pf: &mut ProxyFlow,
    h: &Hdr,
    w: &mut ProxyWork,
) -> Verdict {
    let invalid = (DROP, counter::DROP_SYN_PROXY_INVALID);
    let (flags, seq, ack) = (h[13], be32(h, 4), be32(h, 8));
    let window = u16::from_be_bytes([h[14], h[15]]);
    if flags & (TCP_SYN | TCP_ACK) == TCP_SYN | TCP_ACK {
        if ack != pf.client_isn.wrapping_add(1) {
            return invalid;
        }
        let Some(syn) = walk(w, Walker::new(WalkMode::Read), false) else {
            return (DROP, counter::DROP_SYN_PROXY_OPTIONS);
        };
        if pf.state != proxy_state::OPEN {
            pf.seq_off = seq.wrapping_sub(pf.cookie);
            pf.ts_off = match syn.ts {
                Some((val, _)) => pf.lb_tsval.wrapping_sub(val),
                None => 0,
            };
            pf.wshift = if pf.client_wscale == NO_WSCALE {
                0
            } else if syn.wscale == NO_WSCALE {
                -(PROXY_WSCALE as i8)
            } else {
                syn.wscale as i8 - PROXY_WSCALE as i8
            };
            pf.state = proxy_state::OPEN;
            stats::count(counter::SYN_PROXY_OPENED);
        }
        // The client's window update: a byte it already has, at lb's initial sequence number,
        // which it acknowledges at once (completing the backend's handshake). A SYN's window
        // is unscaled; this one is in lb's scale.
        let window = if pf.client_wscale == NO_WSCALE {
            window
        } else {
            rescale(window, -(PROXY_WSCALE as i8))
        };
        w.new.set_timestamp(
            syn.ts
                .map(|(val, ecr)| (val.wrapping_add(pf.ts_off), ecr.wrapping_sub(pf.cts_off))),
        );
        let out = Out {
            seq: pf.cookie,
            ack,
            flags: TCP_ACK,
            window,
            payload: 1,
        };
        if emit::<F>(
            ctx,
            flow,
            (&flow.saddr, &flow.daddr),
            (flow.sport, flow.dport),
            &out,
            &w.new,
        )
        .is_none()
        {
            return (DROP, counter::DROP_MALFORMED);
        }
        // The reply's bookkeeping sees the backend's SYN+ACK as it was parsed (`flow`); its
        // addressing is what the window update has too.
        return flow::reply::<F, true>(ctx, flow).unwrap_or(invalid);
    }
    let mut new_h = *h;
    if pf.state != proxy_state::OPEN {
        w.new = w.old;
        // (Without data: its checksum was checked; a TIME_WAIT's ACK carries none.)
        if flags & (TCP_SYN | TCP_ACK | TCP_RST) == TCP_ACK && flow.payload_len == 0 {
            return stale::<F>(ctx, flow, pf, ack, w);
        }
        // The backend refused lb's SYN: its RST goes on to the client, in lb's numbers.
        if flags & TCP_RST == 0 {
            return invalid;
        }
        put32(&mut new_h, 4, pf.cookie.wrapping_add(1));
        stats::count(counter::SYN_PROXY_FAILED);
    } else {
        if !translate(w, WalkMode::ToClient, pf) {
            return (DROP, counter::DROP_SYN_PROXY_OPTIONS);
        }
        put32(&mut new_h, 4, seq.wrapping_sub(pf.seq_off));
        new_h[14..16].copy_from_slice(&rescale(window, pf.wshift).to_be_bytes());
        stats::count(counter::SYN_PROXY_TRANSLATED);
    }
    if patch(ctx, flow.l4_off, h, &new_h, w).is_none() {
        return (DROP, counter::DROP_MALFORMED);
    }
    flow::reply::<F, true>(ctx, flow).unwrap_or(invalid)
}
