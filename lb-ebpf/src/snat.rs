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

use aya_ebpf::{helpers::bpf_loop, macros::map, maps::PerCpuArray};
use lb_common::{BackendInfo, FlowKey, NatEntry, SNAT_PORT_TRIES, counter, snat_port_candidate};

use crate::{
    maps::params,
    stats,
    table::{Claim, nat_claim, nat_find, same_client},
};

/// What the candidates' callbacks work on, and what they found. In a per-CPU map rather than
/// on the caller's stack: the verifier adds a callback's stack to its caller's, and the two with
/// this on it went beyond the limit of 512 bytes. XDP runs to the end on its CPU, so one value
/// per CPU is the current packet's.
#[map(name = "LB_SNAT_SEARCH")] // lb_common::map_name::SNAT_SEARCH
static SEARCH: PerCpuArray<Search> = PerCpuArray::with_max_entries(1, 0);

#[repr(C)]
struct Search {
    backend: BackendInfo,
    reply: NatEntry,
    hash: u64,
    now: u64,
    proto: u8,
    _pad: u8,
    /// The port taken (network order); 0 while none is (candidates are 1024 or more).
    port: u16,
    /// Why the last candidate was refused: the drop counter if none is taken.
    why: u32,
}

/// Reserves a SNAT source port (network order) for a new flow to `backend`, whose return entry
/// is `reply`; `recreated` for a TCP flow seen mid-stream (its connection entry was lost), which
/// keeps the port its NAT entry still holds. `Err(drop counter)`: what ran out, the ports
/// ([`counter::DROP_NO_SNAT_PORT`]: the last candidate is a live flow's) or the NAT table
/// ([`counter::DROP_NAT_FULL`]: its set was full of flows that may not give way).
#[inline(always)]
pub fn reserve(
    backend: &BackendInfo,
    proto: u8,
    hash: u64,
    reply: NatEntry,
    recreated: bool,
    now: u64,
) -> Result<u16, u32> {
    if params().snat_port_count == 0 {
        return Err(counter::DROP_NO_SNAT_PORT);
    }
    let Some(s) = SEARCH.get_ptr_mut(0) else {
        return Err(counter::DROP_NO_SNAT_PORT);
    };
    // SAFETY: this CPU's value, used by this packet only (see SEARCH).
    let s = unsafe { &mut *s };
    *s = Search {
        backend: *backend,
        reply,
        hash,
        now,
        proto,
        _pad: 0,
        port: 0,
        why: counter::DROP_NO_SNAT_PORT,
    };
    let none = core::ptr::null_mut();
    if recreated {
        // SAFETY: a callback of this program; it finds its state in SEARCH.
        unsafe { bpf_loop(SNAT_PORT_TRIES, own_port as *mut c_void, none, 0) };
        if s.port != 0 {
            return Ok(s.port);
        }
    }
    // SAFETY: as above.
    unsafe { bpf_loop(SNAT_PORT_TRIES, claim_port as *mut c_void, none, 0) };
    if s.port != 0 { Ok(s.port) } else { Err(s.why) }
}

/// This CPU's search (see SEARCH), for a callback.
#[inline(always)]
fn search() -> Option<&'static mut Search> {
    // SAFETY: as in `reserve`, whose packet the callback is working on.
    SEARCH.get_ptr_mut(0).map(|s| unsafe { &mut *s })
}

/// Candidate `i` of a re-created flow: its NAT entry, if it holds this port still. Returns 1
/// (stop) when found.
extern "C" fn own_port(i: u32, _: *mut c_void) -> i64 {
    let Some(s) = search() else { return 1 };
    let p = params();
    let port = snat_port_candidate(s.hash, i, p).to_be();
    let b = &s.backend;
    let k = FlowKey::new(b.addr, b.snat_addr, b.port, port, s.proto);
    let Some(slot) = nat_find(&k, k.hash(), p) else {
        return 0;
    };
    // SAFETY: a map value of plain integers.
    let held = unsafe { &mut (*slot).entry };
    if !same_client(held, &s.reply) {
        return 0;
    }
    // Keep when it last had a reply, and what it had: they still protect the port and tell
    // what the flow is.
    *held = NatEntry {
        last_seen: held.last_seen,
        flags: held.flags,
        ..s.reply
    };
    s.port = port;
    1
}

/// Candidate `i` of a new flow: claimed, or the reason it was not. Returns 1 (stop) when
/// claimed.
extern "C" fn claim_port(i: u32, _: *mut c_void) -> i64 {
    let Some(s) = search() else { return 1 };
    let p = params();
    let port = snat_port_candidate(s.hash, i, p).to_be();
    let b = &s.backend;
    let k = FlowKey::new(b.addr, b.snat_addr, b.port, port, s.proto);
    match nat_claim(&k, k.hash(), &s.reply, s.now, p) {
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
