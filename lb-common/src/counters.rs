//! Counters: the global verdict and informational counters, and per-service and per-backend
//! traffic.

/// Per-service or per-backend traffic (client → backend direction), one slot per CPU.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TrafficStats {
    pub packets: u64,
    pub bytes: u64,
    pub new_flows: u64,
    /// TCP flows past their handshake: the client's ACK after its SYN (a proxied flow's after
    /// its cookie), or a flow met mid-stream. `new_flows` less these, over the SYN timeout,
    /// are the half-open connections `syn_proxy = "auto"` measures.
    pub handshakes: u64,
}

/// Declares, in the module it is invoked in, each counter's index (in list order), `NAMES`,
/// `DOCS`, `VERDICTS` and `COUNT`: the balancer's [`counter`] and the decapsulator's
/// [`decap_counter`](crate::decap_counter) are both written with it.
macro_rules! counters {
    (
        verdicts { $($(#[doc = $vd:literal])* $v:ident = $vn:literal,)* }
        informational { $($(#[doc = $id:literal])* $i:ident = $in:literal,)* }
    ) => {
        #[allow(non_camel_case_types, clippy::upper_case_acronyms, dead_code)]
        #[repr(u32)]
        enum Index { $($v,)* $($i,)* Count }
        $( $(#[doc = $vd])* pub const $v: u32 = Index::$v as u32; )*
        $( $(#[doc = $id])* pub const $i: u32 = Index::$i as u32; )*
        /// Number of verdict counters: indices below are verdicts.
        pub const VERDICTS: u32 = [$($vn),*].len() as u32;
        /// Size of the per-CPU array of these counters.
        pub const COUNT: u32 = Index::Count as u32;
        /// Stable names, indexed like the constants (status output and metrics).
        pub const NAMES: [&str; COUNT as usize] = [$($vn,)* $($in,)*];
        /// Each counter's doc comment, indexed like `NAMES` (the generated docs/metrics.md).
        pub const DOCS: [&str; COUNT as usize] =
            [$(concat!($($vd),*),)* $(concat!($($id),*),)*];
    };
}
pub(crate) use counters;

/// Indices into the `STATS` per-CPU array. Every packet increments exactly one verdict counter
/// (those below [`counter::VERDICTS`]); the informational counters after it are extra. Indices
/// and names come from one list (the `counters!` macro), so they cannot drift apart.
pub mod counter {
    counters! {
        verdicts {
            /// Neither IPv4 nor IPv6 (ARP, a second VLAN tag, ...): passed.
            PASS_NOT_IP = "pass_not_ip",
            /// IPv4 or IPv6 that is not lb's: no VIP, no return flow, no ICMP about one; IPv6
            /// neighbour discovery and other ICMPv6 not about a flow. Passed.
            PASS_NOT_VIP = "pass_not_vip",
            /// Could not be parsed and not for an lb address: passed (the kernel drops it itself).
            PASS_MALFORMED = "pass_malformed",
            /// Could not be parsed and addressed to an lb address: dropped.
            DROP_MALFORMED = "drop_malformed",
            /// An IPv4 fragment, or an IPv6 packet with a fragment header, not for an lb address:
            /// passed.
            PASS_FRAGMENT = "pass_fragment",
            /// An IPv4 or IPv6 fragment for an lb address: dropped (fragments carry no ports to
            /// balance on).
            DROP_FRAGMENT = "drop_fragment",
            /// Forwarded (either direction, ICMP errors about flows too) out of the interface it
            /// came in on.
            FWD_TX = "fwd_tx",
            /// Forwarded out of another interface lb is attached to.
            FWD_REDIRECT = "fwd_redirect",
            /// TTL 0 or 1: dropped.
            DROP_TTL = "drop_ttl",
            /// A new flow found no backend (policy `drop`, or an empty ring): dropped.
            DROP_NO_BACKEND = "drop_no_backend",
            /// No route to the backend, or its egress interface is not one of lb's: dropped.
            DROP_NO_ROUTE = "drop_no_route",
            /// The backend's next hop has no resolved MAC yet (lb keeps backends' neighbours
            /// resolved, so this is transient): dropped, the client retransmits.
            DROP_NO_NEIGH = "drop_no_neigh",
            /// Every SNAT port candidate is held by a live flow towards that backend: dropped.
            DROP_NO_SNAT_PORT = "drop_no_snat_port",
            /// No NAT table slot: the sets of every candidate port are full of established flows
            /// (the table is too small for the flows alive): dropped.
            DROP_NAT_FULL = "drop_nat_full",
            /// A SYN of a new connection beyond its source's rate (`syn_rate_per_source`):
            /// dropped, so one flooding address cannot churn the tables others need.
            DROP_SYN_RATE = "drop_syn_rate",
            /// To a VIP address, on a port or protocol no service has: dropped (never passed: the
            /// VIP is routed to lb, so the kernel would route it back out).
            DROP_NO_SERVICE = "drop_no_service",
            /// An ICMP echo request to a VIP, answered (XDP_TX).
            ICMP_ECHO_REPLY = "icmp_echo_reply",
            /// An ICMP echo request to a VIP beyond the reply rate: dropped.
            DROP_ICMP_RATE = "drop_icmp_rate",
            /// An ICMP error to a VIP whose quoted packet is no live flow's, or cannot be read:
            /// dropped.
            DROP_ICMP_NO_FLOW = "drop_icmp_no_flow",
            /// Any other ICMP to a VIP (echo with `answer_ping` off, replies, other types, errors
            /// with translation off): dropped.
            DROP_ICMP = "drop_icmp",
            /// IPv6 with more extension headers before its TCP/UDP header than lb reads (4), not
            /// for an lb address: passed.
            PASS_EXT_HEADERS = "pass_ext_headers",
            /// The same, for an lb address: dropped.
            DROP_EXT_HEADERS = "drop_ext_headers",
            /// UDP over IPv6 with a checksum of 0, which RFC 8200 forbids, to an lb address:
            /// dropped (not for one: counted as `pass_malformed`).
            DROP_UDP_NO_CHECKSUM = "drop_udp_no_checksum",
            /// Too big for the path to its backend (its MTU, less the encapsulation's overhead
            /// with direct server return): answered with ICMP fragmentation needed / ICMPv6
            /// packet too big naming the MTU that fits, sent back to the client (XDP_TX).
            ICMP_TOO_BIG = "icmp_too_big",
            /// Too big for the path to its backend and not answered: IPv4 without DF (lb does
            /// not fragment), beyond the ICMP rate (`icmp_reply_rate`), or too short to quote.
            /// Dropped.
            DROP_TOO_BIG = "drop_too_big",
            /// No room in front of the frame for the outer header of direct server return
            /// (drivers give XDP 256 bytes; not seen in practice): dropped.
            DROP_NO_HEADROOM = "drop_no_headroom",
            /// A reply to a health probe through the tunnel (from a VIP, to lb's address, a
            /// connection the TC program recorded): its source turned back from the VIP into the
            /// backend's address, passed to the kernel for the probe's socket.
            PASS_PROBE_REPLY = "pass_probe_reply",
            /// A SYN to a service with the SYN proxy on, answered by lb with a SYN+ACK whose
            /// sequence number is a cookie (XDP_TX). No state is taken.
            SYN_PROXY_SYNACK = "syn_proxy_synack",
            /// A TCP segment to a proxied service that is no flow's and whose acknowledgement is
            /// no valid cookie (a spoofed or stale ACK, an expired cookie, a RST): dropped.
            DROP_SYN_PROXY_INVALID = "drop_syn_proxy_invalid",
            /// A segment of a proxied flow with malformed TCP options: dropped.
            DROP_SYN_PROXY_OPTIONS = "drop_syn_proxy_options",
            /// A client's segment with data before its backend answered lb's SYN (the client
            /// was given a zero window, so only a misbehaving one sends it): dropped.
            DROP_SYN_PROXY_PENDING = "drop_syn_proxy_pending",
            /// The backend never answered lb's SYN for a proxied connection (within 3 s of the
            /// first): the client's next segment is answered with a RST (XDP_TX).
            SYN_PROXY_RESET = "syn_proxy_reset",
            /// The backend answered lb's SYN for a proxied connection with an earlier
            /// connection's ACK (it still holds that connection's 4-tuple in TIME_WAIT, and
            /// refused the SYN for its timestamp): lb sends the SYN again at once with a
            /// timestamp past that connection's (XDP_TX); without timestamps, or a second
            /// time, it resets the earlier connection, and the client's next probe sends the
            /// SYN again.
            SYN_PROXY_STALE = "syn_proxy_stale",
            /// A segment the SYN proxy would answer with one of its own or rebuild (a SYN, a
            /// client's ACK without a flow, a backend's SYN+ACK or segment without data) whose
            /// TCP checksum is wrong: dropped, as the receiving stack would (its sender sends it
            /// again). The proxy's own segments get checksums computed anew, which must not
            /// make a damaged segment a right one.
            DROP_SYN_PROXY_CHECKSUM = "drop_syn_proxy_checksum",
        }
        informational {
            /// IPv4 header with options (IHL > 5); parsed past them.
            IP_OPTIONS = "ip_options",
            /// IPv6 packet with extension headers (hop-by-hop, routing, destination options)
            /// before its transport header; parsed past them.
            IPV6_EXT_HEADERS = "ipv6_ext_headers",
            /// Frame with one 802.1Q tag; parsed past it.
            VLAN = "vlan",
            /// Connection table entries created.
            CT_NEW = "ct_new",
            /// TCP packets without SYN and without a live entry (evicted from a full table,
            /// expired, or lb restarted): the flow is re-created on the same backend and SNAT port
            /// while the ring and ports allow.
            CT_MISS_MIDSTREAM = "ct_miss_midstream",
            /// Flows moved off a backend that became unavailable.
            CT_RESCHEDULED = "ct_rescheduled",
            /// SNAT port candidates found taken.
            SNAT_PORT_RETRY = "snat_port_retry",
            /// Return-path packets (backend → client).
            REPLY = "reply",
            /// Live flows overwritten in a full connection table (both ways of their set were
            /// taken). Their next packet re-creates them (see `CT_MISS_MIDSTREAM`).
            CT_EVICTED = "ct_evicted",
            /// Passive health signals written to the `SIGNALS` ring buffer.
            SIGNAL_SENT = "signal_sent",
            /// Passive health signals lost because the ring buffer was full (the daemon did not
            /// drain it in time). Never silent: a lost signal is counted here.
            SIGNAL_LOST = "signal_lost",
            /// ICMP errors about a flow from the client side (to a VIP), translated and sent to the
            /// flow's backend.
            ICMP_TRANSLATED_IN = "icmp_translated_in",
            /// ICMP errors about a flow from the backend side (to a SNAT address), translated and
            /// sent to the flow's client.
            ICMP_TRANSLATED_OUT = "icmp_translated_out",
            /// NAT table entries of half-open or closed flows given up for a new flow in a full
            /// set (a SYN flood's flows make room for new ones).
            NAT_EVICTED = "nat_evicted",
            /// ICMP errors about a direct-server-return flow (sent to its VIP by a router on
            /// the path of the backend's replies), encapsulated to the flow's backend.
            ICMP_ENCAPSULATED = "icmp_encapsulated",
            /// Health probe packets encapsulated through the tunnel by the TC egress program
            /// (not XDP verdicts: the host's own packets on their way out).
            PROBE_ENCAPSULATED = "probe_encapsulated",
            /// Health probe packets the TC egress program dropped rather than send them
            /// unencapsulated: their mark's slot is free, they go elsewhere than its backend,
            /// cannot be parsed, or the outer header found no room.
            PROBE_DROPPED = "probe_dropped",
            /// QUIC short-header packets sent to the backend whose server ID their destination
            /// connection ID carries (services with `quic`).
            QUIC_ROUTED = "quic_routed",
            /// Of those, packets whose 4-tuple the connection table did not have on that
            /// backend (a client's new address or port, a NAT rebinding): the table learned it.
            QUIC_LEARNED = "quic_learned",
            /// QUIC short-header packets whose server ID no backend of the service has: sent by
            /// the connection table and Maglev.
            QUIC_UNKNOWN_SERVER_ID = "quic_unknown_server_id",
            /// QUIC short-header packets not routed by their connection ID although they could
            /// be: too short to hold the server ID, another config rotation (or 0b111,
            /// unroutable), or the backend named is not available. Sent by the connection table
            /// and Maglev.
            QUIC_FALLBACK = "quic_fallback",
            /// SYNs of new connections to a direct-server-return service in flood mode (beyond
            /// `dsr_flood_rate` on their CPU): forwarded by Maglev without a connection table
            /// entry, so a flood of spoofed SYNs cannot fill or churn the table. A real client's
            /// flow gets its entry with its next packet (counted as `ct_miss_midstream`).
            DSR_FLOOD = "dsr_flood",
            /// Client ACKs whose cookie validated: the flow was created and lb sent its backend
            /// a SYN with the client's options.
            SYN_PROXY_ACK_VALID = "syn_proxy_ack_valid",
            /// SYNs lb sent a backend again for a proxied connection it had not answered yet
            /// (prompted by the client's zero-window probes).
            SYN_PROXY_SYN_AGAIN = "syn_proxy_syn_again",
            /// Backend handshakes of proxied connections completed: the backend's SYN+ACK gave
            /// the offsets, and the client got its window.
            SYN_PROXY_OPENED = "syn_proxy_opened",
            /// Backend handshakes of proxied connections that failed: the backend refused
            /// (its RST went on to the client) or never answered (see `syn_proxy_reset`).
            SYN_PROXY_FAILED = "syn_proxy_failed",
            /// Packets of proxied flows translated (sequence numbers, SACK blocks, timestamps),
            /// both directions.
            SYN_PROXY_TRANSLATED = "syn_proxy_translated",
        }
    }
}

// The layouts both sides rely on, checked wherever this crate builds (the BPF object too).
const _: () = {
    use core::mem::size_of;
    assert!(size_of::<TrafficStats>() == 32);
};

#[cfg(feature = "user")]
mod pod {
    // SAFETY: #[repr(C)] integers and byte arrays with explicit padding (the crate's layout
    // rules), valid for any bit pattern.
    unsafe impl aya::Pod for super::TrafficStats {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counter_names_are_unique() {
        for (i, a) in counter::NAMES.iter().enumerate() {
            assert!(!counter::NAMES[i + 1..].contains(a), "{a}");
        }
    }
}
