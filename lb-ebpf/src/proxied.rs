//! An open proxied flow's common segment translated in the balancer itself: no SYN, and options
//! either none or Linux's lone timestamp (NOP, NOP, TS: every segment of a connection with
//! timestamps that carries no SACK blocks). Its words change in place, the checksum with them;
//! every other segment of a proxied flow goes to the SYN proxy's programs (synproxy.rs), whose
//! option walk and tail calls cost an established packet twice an unproxied one's (lb-bench).
//! The offsets come from the flow's slot of a small array (lb_common's `ProxyFast`), not from
//! the proxy's LRU hash map, whose lookup was most of what was left of the difference.
#![cfg_attr(not(target_arch = "bpf"), allow(dead_code))]

use aya_ebpf::programs::XdpContext;
use lb_common::{
    FlowAddr, NatEntryOf, PROTO_TCP, ProxyFast, counter, proxy_fast_ports, proxy_fast_slot, rescale,
};

use crate::{
    csum::{diff16, update},
    family::Family,
    parse::{Flow, TCP_ACK, TCP_SYN},
    ptr::{opaque, ptr_at_mut_checked},
    stats,
};

/// The first option word of Linux's lone timestamp: NOP, NOP, kind 8, length 10.
const NOP_NOP_TS: [u8; 4] = [1, 1, 8, 10];

/// Translates the client's segment of `flow` (whose hash is `hash`) towards the backend: the
/// acknowledgement plus the sequence offset, the TSval plus the client's timestamp offset (0
/// but after a TIME_WAIT, see synproxy.rs), the TSecr less the timestamp offset. `false`, with
/// nothing changed, when this segment is not one for here. Inlined for IPv4; out of line (a
/// BPF-to-BPF call) for IPv6, whose stack it took past BPF's 512 bytes inlined.
#[inline(always)]
pub fn to_backend<F: Family>(ctx: &XdpContext, flow: &Flow<F::A>, hash: u64) -> bool {
    if core::mem::size_of::<F::A>() == 4 {
        to_backend_here::<F>(ctx, flow, hash)
    } else {
        to_backend_call::<F>(ctx, flow, hash)
    }
}

#[inline(never)]
fn to_backend_call<F: Family>(ctx: &XdpContext, flow: &Flow<F::A>, hash: u64) -> bool {
    to_backend_here::<F>(ctx, flow, hash)
}

#[inline(always)]
fn to_backend_here<F: Family>(ctx: &XdpContext, flow: &Flow<F::A>, hash: u64) -> bool {
    let (ctx, flow) = (opaque(ctx), opaque(flow));
    if flow.tcp_flags & TCP_SYN != 0 {
        return false;
    }
    let Some(o) = open::<F>(hash, proxy_fast_ports(flow.sport, flow.dport)) else {
        return false;
    };
    let ack = flow.tcp_flags & TCP_ACK != 0;
    quick(ctx.data(), ctx.data_end(), flow.l4_off, |w| match w {
        Word::Ack if ack => w_add(o.seq_off),
        Word::TsVal => w_add(o.cts_off),
        Word::TsEcr => w_sub(o.ts_off),
        _ => Change::Keep,
    })
}

/// Translates the backend's segment of `flow` (the return path's entry `nat`) towards the
/// client: the sequence number less the sequence offset, the window in lb's scale, the TSval
/// plus the timestamp offset, the TSecr less the client's. `false`, with nothing changed, when
/// this segment is not one for here.
#[inline(never)]
pub fn to_client<F: Family>(ctx: &XdpContext, flow: &Flow<F::A>, nat: &NatEntryOf<F::A>) -> bool {
    let (ctx, flow, nat) = (opaque(ctx), opaque(flow), opaque(nat));
    // A segment the reply path would drop for its TTL goes to the proxy's program, which drops
    // it before writing anything.
    if flow.tcp_flags & TCP_SYN != 0 || flow.ttl <= 1 {
        return false;
    }
    let hash = F::A::flow_hash(
        nat.client_addr,
        nat.vip_addr,
        nat.client_port,
        nat.vip_port,
        PROTO_TCP,
    );
    let Some(o) = open::<F>(hash, proxy_fast_ports(nat.client_port, nat.vip_port)) else {
        return false;
    };
    quick(ctx.data(), ctx.data_end(), flow.l4_off, |w| match w {
        Word::Seq => w_sub(o.seq_off),
        Word::Window => Change::Window(o.wshift),
        Word::TsVal => w_add(o.ts_off),
        Word::TsEcr => w_sub(o.cts_off),
        _ => Change::Keep,
    })
}

/// The flow's offsets, if its backend has answered and its slot holds them: a reference to the
/// map value, not a copy (the balancer has no stack to spare for one).
#[inline(always)]
fn open<F: Family>(hash: u64, ports: u32) -> Option<&'static ProxyFast> {
    let f = F::proxy_fast().get(proxy_fast_slot(hash).0)?;
    f.holds(hash, ports).then_some(f)
}

/// The words of a segment the translation may change.
#[derive(Clone, Copy)]
enum Word {
    Seq,
    Ack,
    Window,
    TsVal,
    TsEcr,
}

/// What becomes of a word: kept, a number added (host order, wrapping), or the window shifted.
#[derive(Clone, Copy)]
enum Change {
    Keep,
    Add(u32),
    Window(i8),
}

#[inline(always)]
fn w_add(v: u32) -> Change {
    if v == 0 { Change::Keep } else { Change::Add(v) }
}

#[inline(always)]
fn w_sub(v: u32) -> Change {
    w_add(v.wrapping_neg())
}

/// Applies `change` to the segment at `l4_off` if its options are none or the lone timestamp:
/// the words changed in place, their checksum change folded in once; `false` (nothing written)
/// for any other layout. The header is read 16 bits at a time: it is 2-aligned in the frame
/// (see ptr.rs), and a 4-byte read of it would be split into bytes.
#[inline(always)]
fn quick(data: usize, data_end: usize, l4_off: usize, change: impl Fn(Word) -> Change) -> bool {
    let Some(h) = ptr_at_mut_checked::<[u16; 10]>(data, data_end, l4_off) else {
        return false;
    };
    // SAFETY: bounds-checked; the TCP header's halves in network order (sequence 2-3,
    // acknowledgement 4-5, offset and flags 6, window 7, checksum 8).
    let h = unsafe { &mut *h };
    let ts = match u16::from_be(h[6]) >> 12 {
        5 => None,
        8 => {
            let Some(o) = ptr_at_mut_checked::<[u16; 6]>(data, data_end, l4_off + 20) else {
                return false;
            };
            // SAFETY: bounds-checked; the option halves (TSval 2-3, TSecr 4-5).
            let o = unsafe { &mut *o };
            if o[0] != u16::from_ne_bytes([NOP_NOP_TS[0], NOP_NOP_TS[1]])
                || o[1] != u16::from_ne_bytes([NOP_NOP_TS[2], NOP_NOP_TS[3]])
            {
                return false;
            }
            Some(o)
        }
        _ => return false,
    };
    let mut diff = 0;
    // The word at halves `i`, `i + 1` of `w` changed as `change` says.
    let mut apply = |w: &mut [u16], i: usize, change: Change| {
        let new = match change {
            Change::Keep => return,
            Change::Add(v) => {
                let old = (u32::from(u16::from_be(w[i])) << 16) | u32::from(u16::from_be(w[i + 1]));
                old.wrapping_add(v)
            }
            Change::Window(shift) => {
                let old = u16::from_be(w[i + 1]);
                (u32::from(u16::from_be(w[i])) << 16) | u32::from(rescale(old, shift))
            }
        };
        // Both halves written and summed, changed or not (an unchanged half adds one's
        // complement zero): no branch per half.
        let (hi, lo) = (((new >> 16) as u16).to_be(), (new as u16).to_be());
        diff += diff16(w[i], hi) + diff16(w[i + 1], lo);
        w[i] = hi;
        w[i + 1] = lo;
    };
    apply(h, 2, change(Word::Seq));
    apply(h, 4, change(Word::Ack));
    apply(h, 6, change(Word::Window));
    if let Some(o) = ts {
        apply(o, 2, change(Word::TsVal));
        apply(o, 4, change(Word::TsEcr));
    }
    h[8] = update(h[8], diff);
    stats::count(counter::SYN_PROXY_TRANSLATED);
    true
}
