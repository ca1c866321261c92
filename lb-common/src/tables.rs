//! The connection table (client → VIP flows) and the NAT table (backend → SNAT address flows):
//! their slots, entries, states and flags, and the 2-way set-associative placement both share.

use crate::{Addr6, FlowKeyOf};

/// Values of [`CtEntry::state`].
pub mod ct_state {
    pub const UDP: u8 = 0;
    /// A client SYN was seen, the handshake is not complete.
    pub const TCP_SYN: u8 = 1;
    pub const TCP_ESTABLISHED: u8 = 2;
    /// FIN or RST seen in either direction.
    pub const TCP_CLOSING: u8 = 3;
}

/// Flag bits of [`CtEntry::flags`].
pub mod ct_flags {
    /// Copied from the service at creation: keep the flow on an unavailable backend.
    pub const KEEP: u8 = 1;
    /// A passive health signal about this TCP connection attempt was sent (or its SYN
    /// retransmission found the backend had answered): at most one signal per connection.
    pub const SIGNALLED: u8 = 2;
    /// The client sent a FIN.
    pub const FIN_CLIENT: u8 = 4;
    /// The backend sent a FIN.
    pub const FIN_BACKEND: u8 = 8;
    /// Either side sent a RST.
    pub const RESET: u8 = 16;
    /// The client sent data at [`crate::CtEntry::data_at`] and no data has been seen back yet
    /// ("no data back" check on).
    pub const DATA_PENDING: u8 = 32;
    /// The "no data back" check of this connection is over (data came back, or it was signalled).
    pub const DATA_DONE: u8 = 64;
    /// A flow of the SYN proxy: its sequence numbers and options are translated (its
    /// [`crate::ProxyFlow`] says how), so its packets go to the proxy program.
    pub const PROXIED: u8 = 128;

    /// Whether a flow with `flags` is closed both ways: a FIN from each side, or a RST.
    #[inline(always)]
    pub const fn closed(flags: u8) -> bool {
        flags & RESET != 0 || flags & (FIN_CLIENT | FIN_BACKEND) == FIN_CLIENT | FIN_BACKEND
    }
}

/// Connection table entry of a client → VIP flow.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CtEntry {
    pub backend_id: u32,
    pub service_id: u32,
    /// Last packet of the flow, coarse monotonic nanoseconds (refreshed at most once a second).
    pub last_seen: u64,
    /// Network byte order.
    pub snat_port: u16,
    pub state: u8,
    pub flags: u8,
    /// When the client's first data awaiting an answer was seen, in ticks of the coarse clock
    /// (`now >> DATA_TICK_SHIFT`, truncated): the "no data back" check.
    pub data_at: u32,
}

/// A connection table slot; empty while `key.proto == 0`. The entry is the same for both
/// families; only the key holds addresses.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CtSlotOf<A> {
    pub key: FlowKeyOf<A>,
    pub entry: CtEntry,
}

pub type CtSlot = CtSlotOf<u32>;
pub type CtSlot6 = CtSlotOf<Addr6>;

/// A NAT table slot; empty while `key.proto == 0`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NatSlotOf<A> {
    pub key: FlowKeyOf<A>,
    pub entry: NatEntryOf<A>,
}

pub type NatSlot = NatSlotOf<u32>;
pub type NatSlot6 = NatSlotOf<Addr6>;
pub type NatEntry = NatEntryOf<u32>;
pub type NatEntry6 = NatEntryOf<Addr6>;

/// The two slots a key with `hash` may occupy in a table of `mask + 1` slots (2-way
/// set-associative: an insert takes a free, dead or the older of the two; a lookup reads two
/// adjacent slots). Plain array memory makes a new flow one store instead of a hash-map insert.
#[inline(always)]
pub const fn ways(hash: u64, mask: u32) -> (u32, u32) {
    let first = (hash as u32) & mask & !1;
    (first, first | 1)
}

/// Return-path entry: how to turn a backend's reply back into the VIP's, and where to send it
/// (back to the MAC and interface the client's packets came from).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NatEntryOf<A> {
    pub client_addr: A,
    pub vip_addr: A,
    pub client_port: u16,
    pub vip_port: u16,
    pub ifindex: u32,
    pub backend_id: u32,
    pub client_mac: [u8; 6],
    pub lb_mac: [u8; 6],
    /// Last reply from the backend, coarse monotonic nanoseconds, refreshed at most once a
    /// second; 0 until the first. A flow that has had replies and left the connection table keeps
    /// its port until this is older than the TCP closing timeout, so a live flow evicted under
    /// pressure gets it back; a flow that never had one (half-open, flood) does not.
    pub last_seen: u64,
    /// [`nat_flags`] bits.
    pub flags: u8,
    pub _pad: [u8; 3],
    /// The checksum change (unfolded one's-complement sum, see the datapath's `csum`) of turning
    /// the backend's reply addressing (backend → SNAT address) into the client's (VIP →
    /// client): computed once with the entry, so a reply pays for its ports only.
    pub reply_csum: u32,
}

/// Flag bits of [`NatEntry::flags`].
pub mod nat_flags {
    /// The backend has sent data (a payload) on this flow: the "no data back" check passes.
    pub const DATA_BACK: u8 = 1;
    /// The backend sent something beyond its SYN+ACK (an ACK, data, a FIN; any UDP reply): the
    /// flow got going. Out of the connection table, a flow without it never did (a SYN flood's
    /// flows), and its NAT slot yields to a new flow.
    pub const ANSWERED: u8 = 2;
    /// The reply of a flow of the SYN proxy (see [`crate::ct_flags::PROXIED`]).
    pub const PROXIED: u8 = 4;
}

// The layouts both sides rely on, checked wherever this crate builds (the BPF object too).
const _: () = {
    use core::mem::size_of;
    assert!(size_of::<CtSlot>() == 40);
    assert!(size_of::<NatSlot>() == 64);
    assert!(size_of::<CtEntry>() == 24);
    assert!(size_of::<NatEntry>() == 48);
    assert!(size_of::<CtSlot6>() == 64);
    assert!(size_of::<NatSlot6>() == 112);
};

#[cfg(feature = "user")]
mod pod {
    // SAFETY: #[repr(C)] integers and byte arrays with explicit padding (the crate's layout
    // rules), valid for any bit pattern.
    unsafe impl aya::Pod for super::CtSlot {}
    unsafe impl aya::Pod for super::NatSlot {}
    unsafe impl aya::Pod for super::CtEntry {}
    unsafe impl aya::Pod for super::NatEntry {}
    unsafe impl aya::Pod for super::CtSlot6 {}
    unsafe impl aya::Pod for super::NatSlot6 {}
    unsafe impl aya::Pod for super::NatEntry6 {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ways_are_an_aligned_pair_within_the_table() {
        for h in [0u64, 1, 2, 3, 0xffff_ffff, 0xdead_beef_1234_5679] {
            let (a, b) = ways(h, 1023);
            assert_eq!(a % 2, 0);
            assert_eq!(b, a + 1);
            assert!(b <= 1023);
        }
    }
}
