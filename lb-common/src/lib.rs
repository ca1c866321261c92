//! The one definition of everything the XDP program and userspace share: map names and sizes,
//! map key/value layouts, flag bits and counter indices. Nothing here is re-declared elsewhere.
//!
//! Layout rules for map types: `#[repr(C)]`, explicit padding fields, only integers and byte
//! arrays (no `bool`, enum or `Option`), so the bytes the kernel stores are fully defined on both
//! sides. Addresses and ports are kept in network byte order, as in the packet.
#![no_std]

pub const PROTO_ICMP: u8 = 1;
pub const PROTO_TCP: u8 = 6;
pub const PROTO_UDP: u8 = 17;

/// Names of the maps declared in lb-ebpf, as userspace looks them up.
pub mod map_name {
    /// `Array<AddrSet>` of [`crate::ADDR_SETS`] sets: IPv4 address → [`crate::addr_flags`], an
    /// [`crate::ADDR_WAYS`]-way set-associative table (see [`crate::AddrSet`]). The first lookup
    /// of every IPv4 packet: a miss means "not lb's traffic", passed after one lookup.
    pub const ADDRS: &str = "LB_ADDRS";
    /// `HashMap<ServiceKey, ServiceInfo>`: the virtual services.
    pub const SERVICES: &str = "LB_SERVICES";
    /// `Array<BackendInfo>` indexed by backend id.
    pub const BACKENDS: &str = "LB_BACKENDS";
    /// `Array<u32>` of backend ids: service `s`'s Maglev ring is `[s * ring_size, (s+1) * ring_size)`.
    pub const RINGS: &str = "LB_RINGS";
    /// `Array<CtSlot>`: client → VIP flows, a 2-way set-associative table (see [`crate::ways`]).
    pub const CONNTRACK: &str = "LB_CONNTRACK";
    /// `Array<NatSlot>`: backend → SNAT address flows (the return path), which also reserves
    /// each SNAT port; same layout.
    pub const NAT: &str = "LB_NAT";
    /// `DevMapHash`: ifindex → ifindex of every interface lb is attached to (redirect targets).
    pub const TX_PORTS: &str = "LB_TX_PORTS";
    /// `PerCpuArray<u64>` indexed by [`crate::counter`].
    pub const STATS: &str = "LB_STATS";
    /// `PerCpuArray<TrafficStats>` indexed by service id.
    pub const SERVICE_STATS: &str = "LB_SERVICE_STATS";
    /// `PerCpuArray<TrafficStats>` indexed by backend id.
    pub const BACKEND_STATS: &str = "LB_BACKEND_STATS";
    /// `PerCpuArray<NextHop>` indexed by backend id.
    pub const NEXTHOPS: &str = "LB_NEXTHOPS";
    /// `RingBuf` of [`crate::PassiveSignal`] records, [`crate::SIGNALS_RING_BYTES`] bytes: the
    /// datapath's passive health signals, drained by the daemon.
    pub const SIGNALS: &str = "LB_SIGNALS";
    /// `PerCpuArray<TokenBucket>` of one entry: each CPU's budget of ICMP replies.
    pub const ICMP_RATE: &str = "LB_ICMP_RATE";
    /// `ProgramArray` of the programs the balancer tail-calls: [`crate::ICMP_PROG`].
    pub const PROGS: &str = "LB_PROGS";
    /// `PerCpuArray<TokenBucket>` of [`crate::SYN_BUCKETS`]: the per-source SYN limit.
    pub const SYN_RATE: &str = "LB_SYN_RATE";
    /// `PerCpuArray` of one entry: the SNAT port search's working state for the packet on that
    /// CPU. Holds nothing between packets: never pinned, each load has its own.
    pub const SNAT_SEARCH: &str = "LB_SNAT_SEARCH";
}

/// Slots of [`map_name::PROGS`].
pub const ICMP_PROG: u32 = 0;
pub const PROG_SLOTS: u32 = 1;

/// Name of the global [`Params`] in the object, set by userspace at load time.
pub const PARAMS_GLOBAL: &str = "LB_PARAMS";

/// Name of the XDP program in the object file.
pub const PROGRAM_NAME: &str = "lb_xdp";
/// The balancer's handler of ICMP for lb's addresses, reached by a tail call
/// ([`map_name::PROGS`] slot [`ICMP_PROG`]).
pub const ICMP_PROGRAM_NAME: &str = "lb_icmp";
/// A program that only returns XDP_PASS: the baseline for benchmarks, and the peer program that
/// native XDP on veth needs to receive XDP_TX / redirected frames.
pub const PASS_PROGRAM_NAME: &str = "lb_pass";

/// Compile-time defaults of the maps' sizes; userspace sets the real sizes at load time.
pub const DEFAULT_MAX_SERVICES: u32 = 64;
pub const DEFAULT_MAX_BACKENDS: u32 = 4096;
pub const DEFAULT_RING_SIZE: u32 = 65537;
pub const DEFAULT_CONNTRACK_SIZE: u32 = 1 << 20;
/// Upper bound of distinct addresses (VIPs and SNAT addresses); userspace refuses more.
pub const MAX_ADDRS: u32 = 4096;
/// Sets of the address table ([`map_name::ADDRS`]), a power of two: as many as [`MAX_ADDRS`], so
/// that a set of [`ADDR_WAYS`] slots overflows (more addresses hash to it than it has slots) with
/// p < 1e-2 even for 4096 addresses, and p < 1e-14 for 100.
pub const ADDR_SETS: u32 = 1 << ADDR_SET_BITS;
pub const ADDR_SET_BITS: u32 = 12;
/// Slots per set of the address table.
pub const ADDR_WAYS: usize = 8;
/// Upper bound of interfaces lb attaches to.
pub const MAX_TX_PORTS: u32 = 64;
/// Ring slot value meaning "no backend".
pub const NO_BACKEND: u32 = u32::MAX;
/// Candidate SNAT ports tried for a new flow before giving up (counted). The NAT table is at
/// most half full of live flows, so all 16 sets are full with p < 2.5e-10.
pub const SNAT_PORT_TRIES: u32 = 16;
/// Ring slots tried for a new flow whose slot's backend cannot take it (its flag was written
/// before the ring is rebuilt). With one of three backends out, all 16 miss with p = 2e-8.
pub const SELECT_TRIES: u32 = 16;

/// Size of the [`map_name::SIGNALS`] ring buffer (a power-of-two multiple of the page size). A
/// record takes 24 bytes in it (8 of header), so it holds 2730 signals between two drains; more
/// are counted in [`counter::SIGNAL_LOST`].
pub const SIGNALS_RING_BYTES: u32 = 64 * 1024;

/// A client SYN seen again this long (or longer) after the flow's first packet, with no SYN+ACK
/// from the backend yet, is a connect timeout ([`signal_kind::CONNECT_TIMEOUT`]). Shorter gaps are
/// duplicates, not retransmissions (TCP's minimum RTO is 200 ms, a SYN's first RTO 1 s), and
/// must not let a client fake a backend's failure by sending its SYN twice at once.
pub const SYN_RETRANSMIT_MIN_NS: u64 = 200_000_000;

/// Flag bits of [`map_name::ADDRS`] values.
pub mod addr_flags {
    /// Destination of at least one service.
    pub const VIP: u32 = 1;
    /// Source address lb gives forwarded flows; replies come back to it.
    pub const SNAT: u32 = 2;
    /// A VIP that answers ICMP echo requests (`answer_ping`).
    pub const PING: u32 = 4;
}

/// One set of the address table: up to [`ADDR_WAYS`] addresses (network byte order) and their
/// [`addr_flags`]; a free slot is address 0 with flags 0 (0.0.0.0 is never one of lb's).
///
/// Why not a hash map: its lookup is a helper call the verifier cannot inline, and it was the
/// largest cost left per packet. An array lookup is inlined; scanning the 8 addresses of one
/// 64-byte value costs a few instructions, hit or miss. An address stays in its slot while it
/// is configured, so userspace never moves one that packets are using.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AddrSet {
    pub addrs: [u32; ADDR_WAYS],
    pub flags: [u32; ADDR_WAYS],
}

/// The set of the address table that may hold `addr` (network byte order): the top bits of a
/// multiplicative (Fibonacci) hash, one multiply, which every address bit reaches.
#[inline(always)]
pub const fn addr_set(addr: u32) -> u32 {
    ((addr as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> (64 - ADDR_SET_BITS)) as u32
}

/// Datapath parameters, a read-only global set by userspace when loading the program.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Params {
    /// Slots per Maglev ring (a prime).
    pub ring_size: u32,
    /// Connection table size - 1 (sizes are powers of two).
    pub table_mask: u32,
    /// SNAT source ports are `snat_port_min .. snat_port_min + snat_port_count` (host order).
    pub snat_port_min: u16,
    pub snat_port_count: u16,
    /// NAT table size - 1: twice the connection table, so the ports of flows the connection
    /// table evicted under pressure are always there to reclaim.
    pub nat_mask: u32,
    /// Idle timeouts in nanoseconds, indexed by [`ct_state`] (an array, so the datapath indexes
    /// it with a masked state instead of a branch table).
    pub timeout_ns: [u64; 4],
    /// How long a TCP flow closed both ways ([`ct_flags::CLOSED`]) keeps its SNAT port from other
    /// flows, nanoseconds: late segments of the old connection (a retransmitted FIN, the last
    /// ACK) still find it, and then a new flow may take the port, long before the closing timeout.
    pub closed_hold_ns: u64,
    /// [`param_flags`] bits.
    pub flags: u32,
    /// ICMP echo replies a CPU sends per second at most (and its burst), so a flood of pings to
    /// a VIP cannot turn lb into a reflector.
    pub icmp_reply_rate: u32,
    /// New TCP connections (SYNs without a flow) a CPU takes per second from one source address
    /// at most (its burst too; sources share [`SYN_BUCKETS`] buckets by hash); 0: no limit.
    pub syn_rate_per_source: u32,
    /// The two rates in tokens per 2^32 ns ([`Params::per_2_32_ns`]): a token bucket refills by a
    /// multiply and a shift, no division on the packet path.
    pub icmp_reply_scaled: u32,
    pub syn_rate_scaled: u32,
    pub _pad: u32,
}

/// Token buckets of the per-source SYN limit, per CPU (a power of two): a source shares its
/// bucket with another one with p = 1/16384.
pub const SYN_BUCKETS: u32 = 1 << 14;

/// The SYN-limit bucket of source address `addr` (network byte order).
#[inline(always)]
pub const fn syn_bucket(addr: u32) -> u32 {
    (fmix64(addr as u64) as u32) & (SYN_BUCKETS - 1)
}

/// Flag bits of [`Params::flags`].
pub mod param_flags {
    /// Translate ICMP errors about balanced flows (`translate_icmp`); off: drop them.
    pub const TRANSLATE_ICMP: u32 = 1;
}

impl Params {
    pub const DEFAULT: Self = Self {
        ring_size: DEFAULT_RING_SIZE,
        table_mask: DEFAULT_CONNTRACK_SIZE - 1,
        // Below Linux's ip_local_port_range (32768-60999), so never one of the host's own.
        snat_port_min: 1024,
        snat_port_count: 31744,
        nat_mask: 2 * DEFAULT_CONNTRACK_SIZE - 1,
        // UDP 60 s, TCP SYN 30 s, established 15 min, closing 10 s (IPVS-like).
        timeout_ns: [
            60_000_000_000,
            30_000_000_000,
            900_000_000_000,
            10_000_000_000,
        ],
        closed_hold_ns: 1_000_000_000,
        flags: param_flags::TRANSLATE_ICMP,
        icmp_reply_rate: 1000,
        syn_rate_per_source: 10_000,
        icmp_reply_scaled: Self::per_2_32_ns(1000),
        syn_rate_scaled: Self::per_2_32_ns(10_000),
        _pad: 0,
    };

    /// A rate per second as tokens per 2^32 ns (rounded up, so no rate becomes none; at most
    /// 1e6/s, the config's bound, which fits 32 bits).
    pub const fn per_2_32_ns(per_second: u32) -> u32 {
        ((per_second as u64) << 32).div_ceil(1_000_000_000) as u32
    }

    /// Idle timeout of a flow in `state`.
    #[inline(always)]
    pub const fn timeout(&self, state: u8) -> u64 {
        self.timeout_ns[(state & 3) as usize]
    }
}

/// murmur3's 64-bit finalizer: cheap and well mixed.
#[inline(always)]
pub const fn fmix64(mut k: u64) -> u64 {
    k ^= k >> 33;
    k = k.wrapping_mul(0xff51_afd7_ed55_8ccd);
    k ^= k >> 33;
    k = k.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    k ^ (k >> 33)
}

/// The hash that places a flow on a ring slot and picks its first SNAT port candidate. Fixed (no
/// seed) so that two balancers with the same config pick the same backend for a flow: changing it
/// is a compatibility break. Arguments in network byte order, as in the packet.
#[inline(always)]
pub const fn flow_hash(saddr: u32, daddr: u32, sport: u16, dport: u16, proto: u8) -> u64 {
    let addrs = ((saddr as u64) << 32) | daddr as u64;
    let ports = ((sport as u64) << 24) | ((dport as u64) << 8) | proto as u64;
    fmix64(addrs ^ fmix64(ports))
}

/// The `try`-th SNAT port candidate (host order) for a flow with `hash`.
#[inline(always)]
pub const fn snat_port_candidate(hash: u64, try_: u32, p: &Params) -> u16 {
    // checked_rem: a zero count must not become a division trap (the verifier rejects those).
    let count = p.snat_port_count as u32;
    let offset = match (((hash >> 32) as u32).wrapping_add(try_)).checked_rem(count) {
        Some(o) => o,
        None => 0,
    };
    (p.snat_port_min as u32 + offset) as u16
}

/// Key of the service map.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ServiceKey {
    pub addr: u32,
    pub port: u16,
    pub proto: u8,
    pub _pad: u8,
}

impl ServiceKey {
    /// `addr` as octets (a.b.c.d), `port` in host byte order.
    pub const fn new(addr: [u8; 4], port: u16, proto: u8) -> Self {
        Self {
            addr: u32::from_ne_bytes(addr),
            port: port.to_be(),
            proto,
            _pad: 0,
        }
    }
}

/// Flag bits of [`ServiceInfo::flags`].
pub mod service_flags {
    /// Existing flows stay on a backend that became unavailable (`existing_flows = "keep"`).
    pub const KEEP_FLOWS: u32 = 1;
    /// No backend may take new flows and the policy says drop.
    pub const DROP: u32 = 2;
    /// No backend may take new flows and the policy says use them anyway (`use-all`, `first`):
    /// the ring holds unavailable backends on purpose, take its pick as it is.
    pub const USE_UNAVAILABLE: u32 = 4;
}

/// Value of the service map.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ServiceInfo {
    /// Index into the ring and per-service maps, `< max_services`.
    pub id: u32,
    pub flags: u32,
}

/// Flag bits of [`BackendInfo::flags`].
pub mod backend_flags {
    /// Health says available: takes new flows (unless drained) and keeps its flows.
    pub const UP: u32 = 1;
    /// Weight 0 / drained: no new flows, existing flows continue.
    pub const DRAINED: u32 = 2;
}

/// A backend of one service (a host:port used by two services is two backends).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BackendInfo {
    pub addr: u32,
    /// Source address of forwarded flows (its replies come back here).
    pub snat_addr: u32,
    pub port: u16,
    /// "No data back" passive check of its service: a TCP connection whose client sent data and
    /// got none back for this long is a failure; in units of [`DATA_TICK_SHIFT`] (2^20 ns,
    /// about a millisecond); 0: off.
    pub no_data_ticks: u16,
    pub flags: u32,
}

/// The coarse clock's nanoseconds shifted right by this give the "no data back" clock's ticks
/// (about 1.05 ms): a 32-bit tick counter in the connection entry, ages by wrapping subtraction.
pub const DATA_TICK_SHIFT: u32 = 20;

/// A flow's addressing in one direction.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct FlowKey {
    pub src: u32,
    pub dst: u32,
    pub sport: u16,
    pub dport: u16,
    pub proto: u8,
    pub _pad: [u8; 3],
}

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

/// The next hop towards a backend, cached per CPU so packets need no route lookup: refreshed
/// from the kernel's tables (bpf_fib_lookup) when older than a second.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NextHop {
    /// When it was looked up, coarse monotonic nanoseconds; 0 = never.
    pub updated: u64,
    pub ifindex: u32,
    pub smac: [u8; 6],
    pub dmac: [u8; 6],
}

/// A connection table slot; empty while `key.proto == 0`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CtSlot {
    pub key: FlowKey,
    pub entry: CtEntry,
}

/// A NAT table slot; empty while `key.proto == 0`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NatSlot {
    pub key: FlowKey,
    pub entry: NatEntry,
}

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
pub struct NatEntry {
    pub client_addr: u32,
    pub vip_addr: u32,
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
    pub _pad: [u8; 7],
}

/// Flag bits of [`NatEntry::flags`].
pub mod nat_flags {
    /// The backend has sent data (a payload) on this flow: the "no data back" check passes.
    pub const DATA_BACK: u8 = 1;
    /// The backend sent something beyond its SYN+ACK (an ACK, data, a FIN; any UDP reply): the
    /// flow got going. Out of the connection table, a flow without it never did (a SYN flood's
    /// flows), and its NAT slot yields to a new flow.
    pub const ANSWERED: u8 = 2;
}

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

/// One passive health signal: a record of the [`map_name::SIGNALS`] ring buffer.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PassiveSignal {
    /// The backend that failed (index into [`map_name::BACKENDS`]).
    pub backend_id: u32,
    /// The service of the flow that saw it.
    pub service_id: u32,
    /// A [`signal_kind`] value.
    pub kind: u32,
    /// Kind-specific: the ICMP code for [`signal_kind::UNREACHABLE`], else 0.
    pub detail: u32,
}

/// A token bucket (one per CPU): `tokens` left at `at` (coarse ns), refilled at the rate.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TokenBucket {
    pub at: u64,
    pub tokens: u64,
}

/// Per-service or per-backend traffic (client → backend direction), one slot per CPU.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TrafficStats {
    pub packets: u64,
    pub bytes: u64,
    pub new_flows: u64,
}

/// Indices into the `STATS` per-CPU array. Every packet increments exactly one verdict counter
/// (those below [`counter::VERDICTS`]); the informational counters after it are extra. Indices
/// and names come from one list ([`counters!`]), so they cannot drift apart.
pub mod counter {
    /// Declares each counter's index (in list order), [`NAMES`], [`VERDICTS`] and [`COUNT`].
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
            /// Size of the `STATS` array.
            pub const COUNT: u32 = Index::Count as u32;
            /// Stable names, indexed like the constants (status output and metrics).
            pub const NAMES: [&str; COUNT as usize] = [$($vn,)* $($in,)*];
        };
    }

    counters! {
        verdicts {
            /// Not IPv4 (ARP, IPv6, a second VLAN tag, ...): passed.
            PASS_NOT_IPV4 = "pass_not_ipv4",
            /// IPv4 that is not lb's: no VIP, no return flow, no ICMP about one. Passed.
            PASS_NOT_VIP = "pass_not_vip",
            /// Could not be parsed and not for an lb address: passed (the kernel drops it itself).
            PASS_MALFORMED = "pass_malformed",
            /// Could not be parsed and addressed to an lb address: dropped.
            DROP_MALFORMED = "drop_malformed",
            /// An IPv4 fragment not for an lb address: passed.
            PASS_FRAGMENT = "pass_fragment",
            /// An IPv4 fragment for an lb address: dropped (fragments carry no ports to balance on).
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
        }
        informational {
            /// IPv4 header with options (IHL > 5); parsed past them.
            IP_OPTIONS = "ip_options",
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
        }
    }
}

// The layouts both sides rely on, checked wherever this crate builds (the BPF object too).
const _: () = {
    use core::mem::size_of;
    assert!(size_of::<Params>() == 80);
    assert!(size_of::<AddrSet>() == 64);
    assert!(size_of::<CtSlot>() == 40);
    assert!(size_of::<NatSlot>() == 64);
    assert!(size_of::<ServiceKey>() == 8);
    assert!(size_of::<ServiceInfo>() == 8);
    assert!(size_of::<BackendInfo>() == 16);
    assert!(size_of::<FlowKey>() == 16);
    assert!(size_of::<CtEntry>() == 24);
    assert!(size_of::<NextHop>() == 24);
    assert!(size_of::<NatEntry>() == 48);
    assert!(size_of::<TrafficStats>() == 24);
    assert!(size_of::<PassiveSignal>() == 16);
    assert!(size_of::<TokenBucket>() == 16);
};

#[cfg(feature = "user")]
mod pod {
    // SAFETY: all are #[repr(C)] integers and byte arrays with explicit padding, valid for any
    // bit pattern.
    unsafe impl aya::Pod for super::Params {}
    unsafe impl aya::Pod for super::AddrSet {}
    unsafe impl aya::Pod for super::ServiceKey {}
    unsafe impl aya::Pod for super::ServiceInfo {}
    unsafe impl aya::Pod for super::BackendInfo {}
    unsafe impl aya::Pod for super::FlowKey {}
    unsafe impl aya::Pod for super::CtEntry {}
    unsafe impl aya::Pod for super::NextHop {}
    unsafe impl aya::Pod for super::NatEntry {}
    unsafe impl aya::Pod for super::CtSlot {}
    unsafe impl aya::Pod for super::NatSlot {}
    unsafe impl aya::Pod for super::TrafficStats {}
    unsafe impl aya::Pod for super::PassiveSignal {}
    unsafe impl aya::Pod for super::TokenBucket {}
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A bucket refilled for a second earns its rate (rounded up: never less), for every rate
    /// the config allows, with the datapath's multiply and shift.
    #[test]
    fn scaled_rates_earn_their_rate_a_second() {
        for rate in (1..=1_000_000u32)
            .step_by(997)
            .chain([1_000_000, 10_000, 1000, 1])
        {
            let earned = (1_000_000_000u64 * u64::from(Params::per_2_32_ns(rate))) >> 32;
            assert!(
                earned >= u64::from(rate) && earned <= u64::from(rate) + 1,
                "{rate}/s earned {earned}"
            );
            let two_seconds = (2_000_000_000u64).checked_mul(u64::from(Params::per_2_32_ns(rate)));
            assert!(two_seconds.is_some(), "{rate}/s overflows");
        }
        assert_eq!(Params::per_2_32_ns(0), 0);
    }

    #[test]
    fn service_key_is_in_network_order() {
        let k = ServiceKey::new([10, 0, 0, 1], 80, PROTO_TCP);
        assert_eq!(k.addr.to_ne_bytes(), [10, 0, 0, 1]);
        assert_eq!(k.port.to_ne_bytes(), [0, 80]);
    }

    #[test]
    fn ways_are_an_aligned_pair_within_the_table() {
        for h in [0u64, 1, 2, 3, 0xffff_ffff, 0xdead_beef_1234_5679] {
            let (a, b) = ways(h, 1023);
            assert_eq!(a % 2, 0);
            assert_eq!(b, a + 1);
            assert!(b <= 1023);
        }
    }

    #[test]
    fn addr_sets_are_in_range_and_spread_a_subnet() {
        let mut hits = [0u32; ADDR_SETS as usize];
        for i in 0..4096u32 {
            let a = u32::from_ne_bytes([10, 100, (i >> 8) as u8, i as u8]);
            hits[addr_set(a) as usize] += 1;
        }
        assert!(
            hits.iter().all(|&n| n as usize <= ADDR_WAYS),
            "{:?}",
            hits.iter().max()
        );
        assert_eq!(addr_set(u32::MAX) >> ADDR_SET_BITS, 0);
    }

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

    #[test]
    fn counter_names_are_unique() {
        for (i, a) in counter::NAMES.iter().enumerate() {
            assert!(!counter::NAMES[i + 1..].contains(a), "{a}");
        }
    }
}
