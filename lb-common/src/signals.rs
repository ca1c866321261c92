//! Passive health signals: the records the datapath sends the daemon about failing backends, and
//! the thresholds and clock of the checks that send them.

/// A client SYN seen again this long (or longer) after the flow's first packet, with no SYN+ACK
/// from the backend yet, is a connect timeout ([`signal_kind::CONNECT_TIMEOUT`]). Shorter gaps are
/// duplicates, not retransmissions (TCP's minimum RTO is 200 ms, a SYN's first RTO 1 s), and
/// must not let a client fake a backend's failure by sending its SYN twice at once.
pub const SYN_RETRANSMIT_MIN_NS: u64 = 200_000_000;

/// The coarse clock's nanoseconds shifted right by this give the "no data back" clock's ticks
/// (about 1.05 ms): a 32-bit tick counter in the connection entry, ages by wrapping subtraction.
pub const DATA_TICK_SHIFT: u32 = 20;

/// Values of [`PassiveSignal::kind`]: failures of a backend seen in real traffic (SPEC §3).
/// Successes are not reported.
pub mod signal_kind {
    /// The backend answered a client's SYN with RST (nothing else came back from it first).
    pub const REFUSED: u32 = 1;
    /// The client retransmitted its SYN ([`crate::SYN_RETRANSMIT_MIN_NS`] or more after the
    /// first) and the backend had not answered. Once per connection.
    pub const CONNECT_TIMEOUT: u32 = 2;
    /// An ICMP destination unreachable (any code but "fragmentation needed") came to lb's SNAT
    /// address about a live flow to the backend; [`crate::PassiveSignal::detail`] is the ICMP
    /// code (1 host, 3 port unreachable, ...). Once per TCP connection; for UDP every one (the
    /// sender's ICMP rate limit bounds them).
    pub const UNREACHABLE: u32 = 3;
    /// A TCP connection whose client sent data got none back within the service's
    /// `no_data_timeout` (seen on the client's next packet after it). Service scope only.
    pub const NO_DATA: u32 = 4;

    /// A stable name for `kind` (events, logs, metrics labels).
    pub const fn name(kind: u32) -> &'static str {
        match kind {
            REFUSED => "refused",
            CONNECT_TIMEOUT => "connect_timeout",
            UNREACHABLE => "unreachable",
            NO_DATA => "no_data",
            _ => "unknown",
        }
    }
}

/// One passive health signal: a record of the [`map_name::SIGNALS`](crate::map_name::SIGNALS) ring
/// buffer.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PassiveSignal {
    /// The backend that failed (index into [`map_name::BACKENDS`](crate::map_name::BACKENDS)).
    pub backend_id: u32,
    /// The service of the flow that saw it.
    pub service_id: u32,
    /// A [`signal_kind`] value.
    pub kind: u32,
    /// Kind-specific: the ICMP code for [`signal_kind::UNREACHABLE`], else 0.
    pub detail: u32,
}

// The layouts both sides rely on, checked wherever this crate builds (the BPF object too).
const _: () = {
    use core::mem::size_of;
    assert!(size_of::<PassiveSignal>() == 16);
};

#[cfg(feature = "user")]
mod pod {
    // SAFETY: #[repr(C)] integers and byte arrays with explicit padding (the crate's layout
    // rules), valid for any bit pattern.
    unsafe impl aya::Pod for super::PassiveSignal {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signal_kinds_have_distinct_names() {
        use signal_kind::*;
        let names = [REFUSED, CONNECT_TIMEOUT, UNREACHABLE, NO_DATA].map(name);
        assert!(!names.contains(&"unknown"));
        assert_eq!(name(0), "unknown");
        for (i, a) in names.iter().enumerate() {
            assert!(!names[i + 1..].contains(a), "{a}");
        }
    }
}
