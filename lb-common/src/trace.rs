//! The datapath trace (`lb trace`): per-flow decisions (a new flow's backend and SNAT port, a
//! flow rescheduled or re-created mid-stream, a packet dropped and why) written through aya-log
//! while an operator watches, and nothing otherwise.
//!
//! How it stays free when off: the hot programs test one word, [`TRACE_GATE_SECTION`]'s, at their
//! trace points only (a new flow, a packet about to be dropped); it is 0 unless a trace runs.
//! When it is open, the packet's description goes into this CPU's [`TraceCpu`] and the program
//! tail-calls `lb_trace` ([`TRACE_PROGRAM_NAME`]), which applies the filters and the rate, writes
//! the record and returns the verdict: the logging is verified apart and takes no stack of the
//! balancer's. Everything here is per run (never pinned): a new daemon starts with the trace
//! off, and a daemon's death empties its program slot (a program array's entries go with its
//! last descriptor), so a trace left on by a killed daemon costs a failed tail call at most.
//!
//! The record carries small integers (ids, counter indices); the daemon names them.

use crate::{Addr6, TokenBucket};

/// The ELF section (a map of its own, per run) holding the trace's gate: one `u32`, non-zero
/// while a trace runs. A global rather than a map entry: the test is one load of a known
/// address, no lookup and no stack slot for a key.
pub const TRACE_GATE_SECTION: &str = ".data.lb_trace";

/// What a trace record says happened ([`TraceNote::kind`]).
pub mod trace_kind {
    /// A new flow: its backend chosen, its SNAT port taken (0 with direct server return).
    pub const NEW_FLOW: u8 = 1;
    /// A live flow moved off its backend, which became unavailable.
    pub const RESCHEDULED: u8 = 2;
    /// A TCP packet without SYN and without a live entry: the flow re-created mid-stream.
    pub const MIDSTREAM: u8 = 3;
    /// A packet dropped; [`super::TraceNote::reason`] is its verdict counter.
    pub const DROPPED: u8 = 4;
    /// A QUIC packet whose 4-tuple is new to its backend (a client's new address or port) sent
    /// to the backend its connection ID's server ID names.
    pub const QUIC_ROUTED: u8 = 5;
    /// A SYN of a direct-server-return service in flood mode: sent to its backend
    /// ([`super::TraceNote::flood_backend`]) without a connection table entry.
    pub const FLOOD: u8 = 6;
    /// The SYN proxy answered a SYN with its cookie's SYN+ACK (no state taken).
    pub const PROXY_COOKIE: u8 = 7;
    /// A client's ACK returned a valid cookie: the flow was created (its backend, its SNAT
    /// port) and lb sent the backend a SYN.
    pub const PROXY_CREATED: u8 = 8;
    /// lb sent the backend its SYN again (at the client's probe: the backend had not answered).
    pub const PROXY_SYN_AGAIN: u8 = 9;
    /// The backend's SYN+ACK: the client got its window, the flow is translated from now on.
    pub const PROXY_OPENED: u8 = 10;
    /// The backend refused lb's SYN (its RST went on to the client) or never answered (the
    /// client was reset).
    pub const PROXY_FAILED: u8 = 11;
    /// The backend answered lb's SYN from the TIME_WAIT of an earlier connection on the same
    /// 4-tuple: lb sent the SYN again past its timestamp, or reset the TIME_WAIT.
    pub const PROXY_STALE: u8 = 12;
}

/// [`TraceNote::service_id`] / [`TraceNote::backend_id`] when there is none.
pub const TRACE_NONE: u32 = u32::MAX;

/// The filters, rate and deadline of the trace (`LB_TRACE`, one entry), written by the daemon
/// before it opens the gate and read by `lb_trace` only.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TraceFilter {
    /// Only this service's packets; [`TRACE_NONE`]: every packet (those of no service too).
    pub service_id: u32,
    /// Records per second and CPU at most (a SYN flood under trace must not become a record
    /// flood); the rest are counted in [`TraceCpu::limited`].
    pub rate: u32,
    /// Records per 2^32 ns: `Params::per_2_32_ns(rate)`.
    pub rate_scaled: u32,
    /// Only clients in `client`/`client_prefix` (IPv4 as IPv4-mapped, prefix counted in the
    /// mapped address's 128 bits); prefix 0: any client.
    pub client_prefix: u32,
    pub client: Addr6,
    /// Monotonic coarse nanoseconds after which `lb_trace` closes the gate itself: a trace
    /// whose daemon died or hung ends on time all the same.
    pub until_ns: u64,
}

/// One traced packet as the balancer describes it to `lb_trace`, and what `lb_trace` keeps per
/// CPU (`LB_TRACE_CPU`): its rate budget and what it could not write.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TraceCpu {
    pub note: TraceNote,
    pub bucket: TokenBucket,
    /// Records beyond [`TraceFilter::rate`].
    pub limited: u64,
    /// Records that found the log ring buffer full (the daemon did not read it in time).
    pub lost: u64,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TraceNote {
    /// The client (IPv4 as IPv4-mapped) and the VIP it sent to.
    pub client: Addr6,
    pub vip: Addr6,
    /// The hash of the flow [`TraceNote::prev_backend`] was noted for (a rescheduled flow);
    /// 0 when none is: a note holds for the packet of that flow only.
    pub prev_hash: u64,
    /// XDP action and verdict counter the packet gets: `lb_trace` counts it and returns the
    /// action.
    pub action: u32,
    pub reason: u32,
    pub service_id: u32,
    pub backend_id: u32,
    /// The backend a rescheduled flow had (see [`TraceNote::prev_hash`]).
    pub prev_backend: u32,
    /// Host order; 0 with direct server return.
    pub snat_port: u16,
    /// Network order.
    pub client_port: u16,
    pub vip_port: u16,
    /// [`trace_kind`].
    pub kind: u8,
    pub proto: u8,
    /// Set by the balancer for a flow it describes itself (a new flow: the frame is rewritten
    /// by then); 0: `lb_trace` reads the frame (a dropped packet, unchanged).
    pub described: u8,
    /// 4 or 6; 0 for a frame `lb_trace` could not read.
    pub family: u8,
    /// The kind a new flow's record takes instead of [`trace_kind::NEW_FLOW`], set by the
    /// balancer for that packet ([`trace_kind::QUIC_ROUTED`], [`trace_kind::FLOOD`]), or the
    /// SYN proxy's decision about it (`PROXY_*`); 0: none. Taken off with the note's hand-off.
    pub new_kind: u8,
    pub _pad0: u8,
    /// A flood-mode SYN's backend, which no table entry holds (kind [`trace_kind::FLOOD`]).
    pub flood_backend: u32,
    pub _pad: [u8; 4],
}

/// The IPv4-mapped form (`::ffff:a.b.c.d`) of an IPv4 address held as the maps hold it.
#[inline(always)]
pub const fn mapped(v4: u32) -> Addr6 {
    [0, 0, u32::from_ne_bytes([0, 0, 0xff, 0xff]), v4]
}

/// Whether `addr` is in `net`/`prefix` (prefix 0-128 over the words' network-order bits).
#[inline(always)]
pub fn in_prefix(addr: &Addr6, net: &Addr6, prefix: u32) -> bool {
    let mut i = 0;
    while i < 4 {
        let bits = prefix.saturating_sub(32 * i as u32).min(32);
        if bits > 0 {
            // The words hold network-order bytes: compare in host order, high bits first.
            let mask = u32::MAX << (32 - bits);
            if (u32::from_be(addr[i]) ^ u32::from_be(net[i])) & mask != 0 {
                return false;
            }
        }
        i += 1;
    }
    true
}

// The layouts both sides rely on, checked wherever this crate builds (the BPF object too).
const _: () = {
    use core::mem::size_of;
    assert!(size_of::<TraceFilter>() == 40);
    assert!(size_of::<TraceNote>() == 80);
    assert!(size_of::<TraceCpu>() == 112);
};

#[cfg(feature = "user")]
mod pod {
    // SAFETY: #[repr(C)] integers and byte arrays with explicit padding (the crate's layout
    // rules), valid for any bit pattern.
    unsafe impl aya::Pod for super::TraceFilter {}
    unsafe impl aya::Pod for super::TraceCpu {}
    unsafe impl aya::Pod for super::TraceNote {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::addr6;

    #[test]
    fn prefixes_match_high_bits_first() {
        let v4 = |a: [u8; 4]| mapped(u32::from_ne_bytes(a));
        let net = v4([10, 0, 1, 0]);
        assert!(in_prefix(&v4([10, 0, 1, 200]), &net, 96 + 24));
        assert!(!in_prefix(&v4([10, 0, 2, 1]), &net, 96 + 24));
        assert!(in_prefix(&v4([10, 0, 2, 1]), &net, 96 + 16));
        assert!(in_prefix(&v4([10, 0, 1, 2]), &v4([10, 0, 1, 2]), 128));
        assert!(!in_prefix(&v4([10, 0, 1, 3]), &v4([10, 0, 1, 2]), 128));
        assert!(in_prefix(&v4([192, 168, 0, 1]), &net, 0), "prefix 0: any");
        let mut six = [0u8; 16];
        six[..4].copy_from_slice(&[0x20, 0x01, 0x0d, 0xb8]);
        let a = addr6(six);
        six[15] = 9;
        let b = addr6(six);
        assert!(in_prefix(&b, &a, 64));
        assert!(!in_prefix(&b, &a, 128));
        assert!(!in_prefix(&v4([10, 0, 1, 2]), &a, 32), "families apart");
    }
}
