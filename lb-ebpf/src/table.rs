//! The connection and NAT tables: 2-way set-associative hash tables in array maps. A key lives in
//! one of two adjacent slots chosen by its hash ([`lb_common::ways`]); a lookup reads both, an
//! insert is a plain store (no allocation, no lock), which keeps new flows cheap.
//!
//! Concurrency: a flow's packets arrive on one CPU (RSS), so a slot is written by one CPU at a
//! time in practice. Two CPUs writing the same slot at the same instant for different flows can
//! leave it torn; the cost is one lost entry, which the flow re-creates (same backend through
//! the ring, same SNAT port through its hash) like an eviction.
#![cfg_attr(not(target_arch = "bpf"), allow(dead_code))]

use aya_ebpf::maps::Array;
use lb_common::{
    CtEntry, CtSlotOf, FlowAddr, FlowKeyOf, NatEntryOf, NatSlotOf, Params, counter, ct_flags,
    ct_state, nat_flags, ways,
};

use crate::{family::Family, stats};

/// Whether a connection table entry is still in use.
#[inline(always)]
pub fn ct_live(e: &CtEntry, now: u64, p: &Params) -> bool {
    now.saturating_sub(e.last_seen) <= p.timeout(e.state)
}

/// A table slot: a key and its entry.
pub trait Slot<A> {
    fn key(&self) -> &FlowKeyOf<A>;
}

impl<A> Slot<A> for CtSlotOf<A> {
    fn key(&self) -> &FlowKeyOf<A> {
        &self.key
    }
}

impl<A> Slot<A> for NatSlotOf<A> {
    fn key(&self) -> &FlowKeyOf<A> {
        &self.key
    }
}

/// The slot of `table` (of `mask + 1` slots) holding `key`.
#[inline(always)]
fn find<A: FlowAddr, T: Slot<A>>(
    table: &Array<T>,
    key: &FlowKeyOf<A>,
    hash: u64,
    mask: u32,
) -> Option<*mut T> {
    let (a, b) = ways(hash, mask);
    for i in [a, b] {
        let slot = table.get_ptr_mut(i)?;
        // SAFETY: an array map value of plain integers.
        if unsafe { (*slot).key() == key } {
            return Some(slot);
        }
    }
    None
}

/// The connection table slot holding `key`.
#[inline(always)]
pub fn ct_find<F: Family>(
    key: &FlowKeyOf<F::A>,
    hash: u64,
    p: &Params,
) -> Option<*mut CtSlotOf<F::A>> {
    find(F::conntrack(), key, hash, F::table_mask(p))
}

/// Stores `entry` for `key`: in its own slot, else a free or dead one, else over a live one
/// (counted): a closed flow before a half-open one, a half-open one before an established one
/// (a SYN flood, whose flows the attacker's own kernel resets, pushes out its own flows first,
/// then handshakes in progress, never established flows), else the older.
#[inline(always)]
pub fn ct_store<F: Family>(
    key: &FlowKeyOf<F::A>,
    hash: u64,
    entry: &CtEntry,
    now: u64,
    p: &Params,
) {
    let (a, b) = ways(hash, F::table_mask(p));
    let table = F::conntrack();
    let (Some(sa), Some(sb)) = (table.get_ptr_mut(a), table.get_ptr_mut(b)) else {
        return;
    };
    // SAFETY: array map values of plain integers.
    let (ea, eb) = unsafe { (&*sa, &*sb) };
    let target = if ea.key == *key || ea.key.proto == 0 || !ct_live(&ea.entry, now, p) {
        sa
    } else if eb.key == *key || eb.key.proto == 0 || !ct_live(&eb.entry, now, p) {
        sb
    } else {
        stats::count(counter::CT_EVICTED);
        let rank = |e: &CtEntry| {
            if ct_flags::closed(e.flags) {
                2
            } else if e.state == ct_state::TCP_SYN {
                1
            } else {
                0
            }
        };
        let (ra, rb) = (rank(&ea.entry), rank(&eb.entry));
        if ra > rb || ra == rb && ea.entry.last_seen <= eb.entry.last_seen {
            sa
        } else {
            sb
        }
    };
    // SAFETY: as above. Field by field: a whole slot built first would be a copy on the stack.
    unsafe {
        (*target).key = *key;
        (*target).entry = *entry;
    }
}

/// The NAT table slot holding `key`.
#[inline(always)]
pub fn nat_find<F: Family>(
    key: &FlowKeyOf<F::A>,
    hash: u64,
    p: &Params,
) -> Option<*mut NatSlotOf<F::A>> {
    find(F::nat(), key, hash, F::nat_mask(p))
}

/// What claiming a SNAT port's NAT slot found.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Claim {
    Claimed,
    /// The port is held by another client's live flow.
    Taken,
    /// Both slots of the port's set hold flows that may not give way.
    Full,
}

/// Claims `key` (a SNAT port towards a backend) for `entry`. Refused while a live flow other than
/// this client's holds the key. When both slots of its set hold other live flows, a flow that
/// never got established or is closed gives way (counted): a flood of half-open flows cannot
/// keep new flows out; established flows are never given up.
#[inline(always)]
///
/// `scratch` is where the flows of the port's set are looked up from (a key in the caller's
/// per-CPU search state: a bpf_loop callback's stack adds to its caller's).
pub fn nat_claim<F: Family>(
    key: &FlowKeyOf<F::A>,
    hash: u64,
    entry: &NatEntryOf<F::A>,
    now: u64,
    p: &Params,
    scratch: &mut FlowKeyOf<F::A>,
) -> Claim {
    let (a, b) = ways(hash, F::nat_mask(p));
    let table = F::nat();
    let (Some(sa), Some(sb)) = (table.get_ptr_mut(a), table.get_ptr_mut(b)) else {
        return Claim::Full;
    };
    // SAFETY: array map values of plain integers.
    let (na, nb) = unsafe { (&*sa, &*sb) };
    let target = if na.key == *key {
        if !(same_client(&na.entry, entry) || abandoned::<F>(na, now, p, scratch)) {
            return Claim::Taken;
        }
        sa
    } else if nb.key == *key {
        if !(same_client(&nb.entry, entry) || abandoned::<F>(nb, now, p, scratch)) {
            return Claim::Taken;
        }
        sb
    } else if na.key.proto == 0 || abandoned::<F>(na, now, p, scratch) {
        sa
    } else if nb.key.proto == 0 || abandoned::<F>(nb, now, p, scratch) {
        sb
    } else {
        // The slow path of a full set: which of the two may give way (a lookup each).
        let ((ra, ca), (rb, cb)) = (
            yields::<F>(na, now, p, scratch),
            yields::<F>(nb, now, p, scratch),
        );
        if ra == 0 && rb == 0 {
            return Claim::Full;
        }
        stats::count(counter::NAT_EVICTED);
        let (target, handshake) = if ra > rb || ra == rb && na.entry.last_seen <= nb.entry.last_seen
        {
            (sa, ca)
        } else {
            (sb, cb)
        };
        // A handshake that loses its return entry loses its connection entry too: kept, its
        // packets would go on out through the port while the replies found no entry (the
        // kernel answered them with a RST). Its next packet makes the flow again, port and all.
        if let Some(ct) = handshake {
            // SAFETY: an array map value of plain integers; proto 0 marks a free slot.
            unsafe { (*ct).key.proto = 0 };
        }
        target
    };
    // SAFETY: as above; field by field (see ct_store).
    unsafe {
        (*target).key = *key;
        (*target).entry = *entry;
    }
    Claim::Claimed
}

/// The live connection table entry of the flow holding NAT slot `slot`, if it still is that
/// flow's.
#[inline(always)]
fn holder<F: Family>(
    slot: &NatSlotOf<F::A>,
    now: u64,
    p: &Params,
    client: &mut FlowKeyOf<F::A>,
) -> Option<*mut CtSlotOf<F::A>> {
    let t = &slot.entry;
    // Written field by field into the caller's scratch key (see `nat_claim`).
    client.src = t.client_addr;
    client.dst = t.vip_addr;
    client.sport = t.client_port;
    client.dport = t.vip_port;
    client.proto = slot.key.proto;
    client._pad = [0; 3];
    let found = ct_find::<F>(client, client.hash(), p)?;
    // SAFETY: an array map value of plain integers.
    let e = unsafe { &(*found).entry };
    (e.backend_id == t.backend_id && e.snat_port == slot.key.dport && ct_live(e, now, p))
        .then_some(found)
}

/// How readily the live flow holding `slot` gives way to a new one, 0 (never: established,
/// or answered) to 3: closed both ways (3); out of the connection table and never answered beyond
/// a SYN+ACK, a SYN flood's leftover (2); a handshake in progress (1), with its connection table
/// slot. A SYN flood's flows, which the attacker's kernel resets, go before the handshakes of
/// real clients.
#[inline(always)]
fn yields<F: Family>(
    slot: &NatSlotOf<F::A>,
    now: u64,
    p: &Params,
    scratch: &mut FlowKeyOf<F::A>,
) -> (u32, Option<*mut CtSlotOf<F::A>>) {
    match holder::<F>(slot, now, p, scratch) {
        Some(ct) => {
            // SAFETY: an array map value of plain integers.
            let e = unsafe { &(*ct).entry };
            if ct_flags::closed(e.flags) {
                (3, None)
            } else if e.state == ct_state::TCP_SYN {
                (1, Some(ct))
            } else {
                (0, None)
            }
        }
        None if slot.entry.flags & nat_flags::ANSWERED == 0 => (2, None),
        None => (0, None),
    }
}

/// Whether two NAT entries belong to the same client flow.
#[inline(always)]
pub fn same_client<A: FlowAddr>(a: &NatEntryOf<A>, b: &NatEntryOf<A>) -> bool {
    a.client_addr == b.client_addr
        && a.client_port == b.client_port
        && a.vip_addr == b.vip_addr
        && a.vip_port == b.vip_port
}

/// Whether the flow holding a NAT slot is gone: closed both ways (FIN each way, or RST) for
/// `closed_hold_ns`; or no live connection table entry uses it, and, if it ever had a reply,
/// none for the TCP closing timeout (a live flow evicted from the connection table must find its
/// port again when its next packet re-creates it).
#[inline(always)]
fn abandoned<F: Family>(
    slot: &NatSlotOf<F::A>,
    now: u64,
    p: &Params,
    scratch: &mut FlowKeyOf<F::A>,
) -> bool {
    let t = &slot.entry;
    // A reply within the closed hold keeps the port either way (the hold is at most the closing
    // timeout): no connection table lookup for ports in use.
    if t.last_seen != 0 && now.saturating_sub(t.last_seen) <= p.closed_hold_ns {
        return false;
    }
    // The connection table entry of the flow holding the port, if it still is this flow's.
    // SAFETY: an array map value of plain integers.
    let held = holder::<F>(slot, now, p, scratch).map(|s| unsafe { &(*s).entry });
    if let Some(e) = held
        && ct_flags::closed(e.flags)
    {
        // Closed both ways: free once its last FIN or RST (and reply) is `closed_hold_ns` old.
        return now.saturating_sub(e.last_seen.max(t.last_seen)) > p.closed_hold_ns;
    }
    if t.last_seen != 0 && now.saturating_sub(t.last_seen) <= p.timeout(ct_state::TCP_CLOSING) {
        return false;
    }
    held.is_none()
}
