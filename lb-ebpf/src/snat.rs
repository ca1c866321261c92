//! SNAT port reservation: a new flow takes the first free of [`SNAT_PORT_TRIES`] candidate ports
//! towards its backend (the first from the flow's hash, so a flow re-created after eviction
//! usually gets its old port back). No two live flows may share (SNAT address, port, backend
//! address, port, protocol).
//!
//! The candidates are tried in `bpf_loop` (kernel 5.17+) rather than an unrolled loop: the
//! verifier walks a loop's body once per iteration, and sixteen copies of a NAT claim with its
//! eviction slow path were most of the instructions it processes for the whole program (85%,
//! measured: 954,969 of its limit of 1,000,000; 130,395 with two tries). A callback is verified
//! once: about 100,000 for the whole program now. It costs a new flow ~6% (`lb-bench`: 3.30× →
//! 3.50× an empty program's time for a SYN, median of 8 runs); trying the first candidate
//! outside the loop gained nothing measurable for 50,000 more verified instructions.
#![cfg_attr(not(target_arch = "bpf"), allow(dead_code))]

use core::ffi::c_void;

use aya_ebpf::helpers::bpf_loop;
use lb_common::{BackendInfoOf, NatEntryOf, SNAT_PORT_TRIES, counter, snat_port_candidate};

use crate::{
    family::Family,
    maps::{SnatSearch, params},
    stats,
    table::{Claim, nat_claim, nat_find, same_client},
};

/// Reserves a SNAT source port (network order) for a new flow to `backend`, whose return entry
/// `reply` writes; `recreated` for a TCP flow seen mid-stream (its connection entry was lost), which
/// keeps the port its NAT entry still holds. `Err(drop counter)`: what ran out, the ports
/// ([`counter::DROP_NO_SNAT_PORT`]: the last candidate is a live flow's) or the NAT table
/// ([`counter::DROP_NAT_FULL`]: its set was full of flows that may not give way).
#[inline(always)]
pub fn reserve<F: Family>(
    backend: &BackendInfoOf<F::A>,
    proto: u8,
    hash: u64,
    reply: impl FnOnce(&mut NatEntryOf<F::A>),
    recreated: bool,
    now: u64,
) -> Result<u16, u32> {
    if params().snat_port_count == 0 {
        return Err(counter::DROP_NO_SNAT_PORT);
    }
    let Some(s) = F::search().get_ptr_mut(0) else {
        return Err(counter::DROP_NO_SNAT_PORT);
    };
    // SAFETY: this CPU's value, used by this packet only (see SnatSearch).
    let s = unsafe { &mut *s };
    // Field by field, in place: a whole value built first would be a copy on the stack.
    s.backend = *backend;
    reply(&mut s.reply);
    reply_csum::<F>(s);
    s.hash = hash;
    s.now = now;
    s.proto = proto;
    s.port = 0;
    s.why = counter::DROP_NO_SNAT_PORT;
    let none = core::ptr::null_mut();
    if recreated {
        // SAFETY: a callback of this program; it finds its state in SEARCH.
        unsafe { bpf_loop(SNAT_PORT_TRIES, own_port::<F> as *mut c_void, none, 0) };
        if s.port != 0 {
            return Ok(s.port);
        }
    }
    // SAFETY: as above.
    unsafe { bpf_loop(SNAT_PORT_TRIES, claim_port::<F> as *mut c_void, none, 0) };
    if s.port != 0 { Ok(s.port) } else { Err(s.why) }
}

/// Fills the return entry's [`NatEntryOf::reply_csum`]: how the reply's addresses (backend →
/// SNAT address) change into the client's (VIP → client).
// Not inlined: an IPv6 entry's sum keeps more values live than the registers hold, and their
// spills in the caller's frame went beyond the stack BPF allows with the search's callback.
#[inline(never)]
fn reply_csum<F: Family>(s: &mut SnatSearch<F::A>) {
    let (b, r) = (&s.backend, &s.reply);
    let sum = F::addr_diff(&b.addr, &r.vip_addr) + F::addr_diff(&b.snat_addr, &r.client_addr);
    s.reply.reply_csum = sum;
}

/// This CPU's search (see SnatSearch), for a callback.
#[inline(always)]
fn search<F: Family>() -> Option<&'static mut SnatSearch<F::A>> {
    // SAFETY: as in `reserve`, whose packet the callback is working on.
    F::search().get_ptr_mut(0).map(|s| unsafe { &mut *s })
}

/// Candidate `i` of a re-created flow: its NAT entry, if it holds this port still. Returns 1
/// (stop) when found.
extern "C" fn own_port<F: Family>(i: u32, _: *mut c_void) -> i64 {
    let Some(s) = search::<F>() else { return 1 };
    let p = params();
    let port = snat_port_candidate(s.hash, i, p).to_be();
    candidate_key(s, port);
    let Some(slot) = nat_find::<F>(&s.key, s.key.hash(), p) else {
        return 0;
    };
    // SAFETY: a map value of plain integers.
    let held = unsafe { &mut (*slot).entry };
    if !same_client(held, &s.reply) {
        return 0;
    }
    // Keep when it last had a reply, and what it had: they still protect the port and tell
    // what the flow is.
    let (last_seen, flags) = (held.last_seen, held.flags);
    *held = s.reply;
    held.last_seen = last_seen;
    held.flags = flags;
    s.port = port;
    1
}

/// Writes the NAT key of candidate `port` (backend → SNAT address:port) into `s.key`, field by
/// field (a key built on a callback's stack adds to its caller's).
#[inline(always)]
fn candidate_key<A: lb_common::FlowAddr>(s: &mut SnatSearch<A>, port: u16) {
    s.key.src = s.backend.addr;
    s.key.dst = s.backend.snat_addr;
    s.key.sport = s.backend.port;
    s.key.dport = port;
    s.key.proto = s.proto;
    s.key._pad = [0; 3];
}

/// Candidate `i` of a new flow: claimed, or the reason it was not. Returns 1 (stop) when
/// claimed.
extern "C" fn claim_port<F: Family>(i: u32, _: *mut c_void) -> i64 {
    let Some(s) = search::<F>() else { return 1 };
    let p = params();
    let port = snat_port_candidate(s.hash, i, p).to_be();
    // IPv4's keys fit the stack (cheaper than the map); IPv6's do not (see SnatSearch).
    let claim = if core::mem::size_of::<F::A>() == 4 {
        let b = &s.backend;
        let k = lb_common::FlowKeyOf::new(b.addr, b.snat_addr, b.port, port, s.proto);
        let mut scratch = k;
        nat_claim::<F>(&k, k.hash(), &s.reply, s.now, p, &mut scratch)
    } else {
        candidate_key(s, port);
        nat_claim::<F>(&s.key, s.key.hash(), &s.reply, s.now, p, &mut s.scratch)
    };
    match claim {
        Claim::Claimed => {
            s.port = port;
            return 1;
        }
        Claim::Full => s.why = counter::DROP_NAT_FULL,
        Claim::Taken => s.why = counter::DROP_NO_SNAT_PORT,
    }
    stats::count(counter::SNAT_PORT_RETRY);
    0
}
