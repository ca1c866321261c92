//! The program's maps and its parameters. Names, key and value types come from lb-common;
//! userspace sizes the maps at load time and fills them.
#![cfg_attr(not(target_arch = "bpf"), allow(dead_code))]

use aya_ebpf::{
    bindings::BPF_F_MMAPABLE,
    macros::map,
    maps::{Array, DevMapHash, HashMap, LruHashMap, PerCpuArray, ProgramArray, RingBuf},
};
use lb_common::{
    ADDR_SETS, AddrSet, AddrSet6, BackendInfo, BackendInfo6, BackendInfoOf, CtSlot, CtSlot6,
    DEFAULT_CONNTRACK_SIZE, DEFAULT_CONNTRACK6_SIZE, DEFAULT_MAX_BACKENDS, DEFAULT_MAX_SERVICES,
    DEFAULT_RING_SIZE, FlowKey, FlowKey6, FlowKeyOf, MAX_TX_PORTS, NatEntryOf, NatSlot, NatSlot6,
    NextHop, PROBE_REPLIES_SIZE, PROG_SLOTS, Params, ProbeReply, ProbeReply6, QuicServerId,
    QuicServerKey, SIGNALS_RING_BYTES, SYN_BUCKETS, SYN_SKETCH_CELLS, ServiceHint, ServiceInfo,
    ServiceKey, ServiceKey6, SynCell, TUNNEL_SLOTS, TokenBucket, TraceCpu, TraceFilter,
    TrafficStats, TunnelProbe, TunnelProbe6, counter,
};

/// Datapath parameters; userspace overrides this read-only global when loading.
#[unsafe(no_mangle)]
static LB_PARAMS: Params = Params::DEFAULT;

/// The parameters, read in place (fields are loaded where used; copying the struct to the stack
/// would let LLVM index it with a variable offset, which the verifier refuses).
#[inline(always)]
pub fn params() -> &'static Params {
    let p: *const Params = &LB_PARAMS;
    // SAFETY: a valid pointer to a read-only global. Read through a volatile load of the pointer
    // so the compiler cannot fold the compile-time default into the code.
    unsafe { &*core::ptr::read_volatile(&p) }
}

/// IPv4 address → VIP / SNAT flags: the first lookup of every IPv4 packet. A set-associative
/// table in an array map (see [`lb_common::AddrSet`] and [`crate::family::lookup_addr`]).
#[map(name = "LB_ADDRS")]
pub static ADDRS: Array<AddrSet> = Array::with_max_entries(ADDR_SETS, 0);

/// The same for IPv6 addresses.
#[map(name = "LB_ADDRS6")]
pub static ADDRS6: Array<AddrSet6> = Array::with_max_entries(ADDR_SETS, 0);

/// (VIP, port, protocol) → service.
#[map(name = "LB_SERVICES")]
pub static SERVICES: HashMap<ServiceKey, ServiceInfo> =
    HashMap::with_max_entries(DEFAULT_MAX_SERVICES, 0);

/// (IPv6 VIP, port, protocol) → service.
#[map(name = "LB_SERVICES6")]
pub static SERVICES6: HashMap<ServiceKey6, ServiceInfo> =
    HashMap::with_max_entries(DEFAULT_MAX_SERVICES, 0);

/// Backend id → address, SNAT address, flags (health, drain).
#[map(name = "LB_BACKENDS")]
pub static BACKENDS: Array<BackendInfo> = Array::with_max_entries(DEFAULT_MAX_BACKENDS, 0);

/// The same for IPv6 backends (ids share one space with IPv4's).
#[map(name = "LB_BACKENDS6")]
pub static BACKENDS6: Array<BackendInfo6> = Array::with_max_entries(DEFAULT_MAX_BACKENDS, 0);

/// Maglev rings of all services, back to back: slot → backend id. Mappable: the daemon writes
/// the slots through a shared mapping of the array, without a system call per slot.
#[map(name = "LB_RINGS")]
pub static RINGS: Array<u32> =
    Array::with_max_entries(DEFAULT_MAX_SERVICES * DEFAULT_RING_SIZE, BPF_F_MMAPABLE);

/// Client → VIP flows: a 2-way set-associative table in plain array memory (see table.rs).
#[map(name = "LB_CONNTRACK")]
pub static CONNTRACK: Array<CtSlot> = Array::with_max_entries(DEFAULT_CONNTRACK_SIZE, 0);

/// Backend → SNAT address flows: the return path, and the SNAT port reservations.
#[map(name = "LB_NAT")]
pub static NAT: Array<NatSlot> = Array::with_max_entries(2 * DEFAULT_CONNTRACK_SIZE, 0);

/// The IPv6 connection table.
#[map(name = "LB_CONNTRACK6")]
pub static CONNTRACK6: Array<CtSlot6> = Array::with_max_entries(DEFAULT_CONNTRACK6_SIZE, 0);

/// The IPv6 NAT table.
#[map(name = "LB_NAT6")]
pub static NAT6: Array<NatSlot6> = Array::with_max_entries(2 * DEFAULT_CONNTRACK6_SIZE, 0);

/// Backend id → cached next hop, per CPU.
#[map(name = "LB_NEXTHOPS")]
pub static NEXTHOPS: PerCpuArray<NextHop> = PerCpuArray::with_max_entries(DEFAULT_MAX_BACKENDS, 0);

/// Interfaces lb is attached to: targets of XDP_REDIRECT.
#[map(name = "LB_TX_PORTS")]
pub static TX_PORTS: DevMapHash = DevMapHash::with_max_entries(MAX_TX_PORTS, 0);

/// Packets by verdict reason, per CPU (no atomics on the hot path).
#[map(name = "LB_STATS")]
pub static STATS: PerCpuArray<u64> = PerCpuArray::with_max_entries(counter::COUNT, 0);

#[map(name = "LB_SERVICE_STATS")]
pub static SERVICE_STATS: PerCpuArray<TrafficStats> =
    PerCpuArray::with_max_entries(DEFAULT_MAX_SERVICES, 0);

#[map(name = "LB_BACKEND_STATS")]
pub static BACKEND_STATS: PerCpuArray<TrafficStats> =
    PerCpuArray::with_max_entries(DEFAULT_MAX_BACKENDS, 0);

/// Passive health signals (`PassiveSignal` records) for the daemon; see passive.rs for why a ring
/// buffer.
#[map(name = "LB_SIGNALS")]
pub static SIGNALS: RingBuf = RingBuf::with_byte_size(SIGNALS_RING_BYTES, 0);

/// Each CPU's budget of ICMP replies (see icmp.rs).
#[map(name = "LB_ICMP_RATE")]
pub static ICMP_RATE: PerCpuArray<TokenBucket> = PerCpuArray::with_max_entries(1, 0);

/// Programs the balancer hands packets to (tail calls): the ICMP handler, verified apart.
#[map(name = "LB_PROGS")]
pub static PROGS: ProgramArray = ProgramArray::with_max_entries(PROG_SLOTS, 0);

/// The per-source SYN limit's buckets, per CPU (see flow.rs).
#[map(name = "LB_SYN_RATE")]
pub static SYN_RATE: PerCpuArray<TokenBucket> = PerCpuArray::with_max_entries(SYN_BUCKETS, 0);

/// The sketch of new connections per source consulted before `SYN_RATE`, per CPU (see
/// lb_common's `SynCell`).
#[map(name = "LB_SYN_SKETCH")]
pub static SYN_SKETCH: PerCpuArray<SynCell> = PerCpuArray::with_max_entries(SYN_SKETCH_CELLS, 0);

/// Each service's new TCP connections per CPU: direct server return's flood mode (flow.rs).
#[map(name = "LB_FLOOD")] // lb_common::map_name::FLOOD
pub static FLOOD: PerCpuArray<lb_common::FloodWindow> =
    PerCpuArray::with_max_entries(DEFAULT_MAX_SERVICES, 0);

/// What the SNAT port search's callbacks work on, and what they found (see snat.rs). In a
/// per-CPU map rather than on the caller's stack: the verifier adds a callback's stack to its
/// caller's, and the two with this on it went beyond the limit of 512 bytes. XDP runs to the end
/// on its CPU, so one value per CPU is the current packet's.
#[repr(C)]
pub struct SnatSearch<A> {
    pub backend: BackendInfoOf<A>,
    pub reply: NatEntryOf<A>,
    pub hash: u64,
    pub now: u64,
    pub proto: u8,
    pub _pad: u8,
    /// The port taken (network order); 0 while none is (candidates are 1024 or more).
    pub port: u16,
    /// Why the last candidate was refused: the drop counter if none is taken.
    pub why: u32,
    /// IPv6: the candidate's NAT key, and a key to look up its holder's flow with: here, not
    /// on the callbacks' stack, which adds to the program's (IPv4's fit there, and are faster).
    pub key: FlowKeyOf<A>,
    pub scratch: FlowKeyOf<A>,
}

#[map(name = "LB_SNAT_SEARCH")] // lb_common::map_name::SNAT_SEARCH
pub static SEARCH: PerCpuArray<SnatSearch<u32>> = PerCpuArray::with_max_entries(1, 0);

#[map(name = "LB_SNAT_SEARCH6")] // lb_common::map_name::SNAT_SEARCH6
pub static SEARCH6: PerCpuArray<SnatSearch<lb_common::Addr6>> = PerCpuArray::with_max_entries(1, 0);

/// One value per CPU that the IPv6 parser passes through to make the verifier forget what it
/// knew of it (see `parse::forget`).
#[map(name = "LB_PARSE_SCRATCH")] // lb_common::map_name::PARSE_SCRATCH
pub static PARSE_SCRATCH: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

/// The MTU a packet too big for its path is answered with, from the balancer to `lb_too_big`
/// (see toobig.rs), per CPU: XDP runs a packet to its end on one CPU.
#[map(name = "LB_TOO_BIG")] // lb_common::map_name::TOO_BIG
pub static TOO_BIG: PerCpuArray<u32> = PerCpuArray::with_max_entries(1, 0);

/// This CPU's last answer of the service map for a destination, by [`lb_common::service_hint`]
/// (see [`lb_common::ServiceHint`] and flow.rs).
#[map(name = "LB_SERVICE_HINT")] // lb_common::map_name::SERVICE_HINT
pub static SERVICE_HINT: PerCpuArray<ServiceHint> =
    PerCpuArray::with_max_entries(lb_common::SERVICE_HINTS, 0);

/// The service maps' generation (see [`lb_common::map_name::SERVICES_GEN`]).
#[map(name = "LB_SERVICES_GEN")] // lb_common::map_name::SERVICES_GEN
pub static SERVICES_GEN: Array<u32> = Array::with_max_entries(1, 0);

/// Service id → its QUIC layout word (0: not QUIC); see quic.rs.
#[map(name = "LB_QUIC_LAYOUTS")] // lb_common::map_name::QUIC_LAYOUTS
pub static QUIC_LAYOUTS: Array<u32> = Array::with_max_entries(DEFAULT_MAX_SERVICES, 0);

/// Backend id → its QUIC server ID, if it has one.
#[map(name = "LB_QUIC_IDS")] // lb_common::map_name::QUIC_IDS
pub static QUIC_IDS: Array<QuicServerId> = Array::with_max_entries(DEFAULT_MAX_BACKENDS, 0);

/// (service id, server ID) → backend id.
#[map(name = "LB_QUIC_SERVERS")] // lb_common::map_name::QUIC_SERVERS
pub static QUIC_SERVERS: HashMap<QuicServerKey, u32> =
    HashMap::with_max_entries(DEFAULT_MAX_BACKENDS, 0);

/// The key of a [`QUIC_SERVERS`] lookup, per CPU: built here rather than on the stack, which
/// the IPv6 program has no room for.
#[map(name = "LB_QUIC_KEY")] // lb_common::map_name::QUIC_KEY
pub static QUIC_KEY: PerCpuArray<QuicServerKey> = PerCpuArray::with_max_entries(1, 0);

/// Health probes through the tunnel: a probe mark's slot → backend, VIP, encapsulation (see
/// tunnel.rs). Written by the daemon, read by the TC egress program.
#[map(name = "LB_TUNNEL_PROBES")] // lb_common::map_name::TUNNEL_PROBES
pub static TUNNEL_PROBES: Array<TunnelProbe> = Array::with_max_entries(TUNNEL_SLOTS, 0);

#[map(name = "LB_TUNNEL_PROBES6")] // lb_common::map_name::TUNNEL_PROBES6
pub static TUNNEL_PROBES6: Array<TunnelProbe6> = Array::with_max_entries(TUNNEL_SLOTS, 0);

/// The replies through-tunnel probes await (VIP:port → lb's address:port) → their backend:
/// written by the TC program as a probe leaves, read by the XDP program when the backend
/// answers. LRU: nobody deletes an entry, a probe needs it for its own length only.
#[map(name = "LB_PROBE_REPLIES")] // lb_common::map_name::PROBE_REPLIES
pub static PROBE_REPLIES: LruHashMap<FlowKey, ProbeReply> =
    LruHashMap::with_max_entries(PROBE_REPLIES_SIZE, 0);

#[map(name = "LB_PROBE_REPLIES6")] // lb_common::map_name::PROBE_REPLIES6
pub static PROBE_REPLIES6: LruHashMap<FlowKey6, ProbeReply6> =
    LruHashMap::with_max_entries(PROBE_REPLIES_SIZE, 0);

/// The datapath trace's filters, rate and deadline (see trace.rs), written by the daemon.
#[map(name = "LB_TRACE")] // lb_common::map_name::TRACE
pub static TRACE: Array<TraceFilter> = Array::with_max_entries(1, 0);

/// The packet a trace point hands to `lb_trace`, and `lb_trace`'s budget and losses, per CPU.
#[map(name = "LB_TRACE_CPU")] // lb_common::map_name::TRACE_CPU
pub static TRACE_CPU: PerCpuArray<TraceCpu> = PerCpuArray::with_max_entries(1, 0);

/// `lb_trace`, the trace's writer (a tail call). Per run, apart from `PROGS` (see trace.rs).
#[map(name = "LB_TRACE_PROG")] // lb_common::map_name::TRACE_PROG
pub static TRACE_PROG: ProgramArray = ProgramArray::with_max_entries(1, 0);

/// The SYN cookie keys, current first (see lb_common's synproxy.rs). Per run: each daemon
/// writes its keys before attaching.
#[map(name = "LB_COOKIE_KEYS")] // lb_common::map_name::COOKIE_KEYS
pub static COOKIE_KEYS: Array<lb_common::CookieKey> =
    Array::with_max_entries(lb_common::COOKIE_KEYS, 0);

/// Proxied IPv4 flows' translations, by client → VIP key.
#[map(name = "LB_PROXY")] // lb_common::map_name::PROXY
pub static PROXY: LruHashMap<FlowKey, lb_common::ProxyFlow> =
    LruHashMap::with_max_entries(lb_common::DEFAULT_PROXY_FLOWS, 0);

/// The same for IPv6.
#[map(name = "LB_PROXY6")] // lb_common::map_name::PROXY6
pub static PROXY6: LruHashMap<FlowKey6, lb_common::ProxyFlow> =
    LruHashMap::with_max_entries(lb_common::DEFAULT_PROXY_FLOWS, 0);

/// The open proxied IPv4 flows' offsets, by flow hash, where the balancer reads them.
#[map(name = "LB_PROXY_FAST")] // lb_common::map_name::PROXY_FAST
pub static PROXY_FAST: Array<lb_common::ProxyFast> =
    Array::with_max_entries(lb_common::PROXY_FAST_SLOTS, 0);

/// The same for IPv6.
#[map(name = "LB_PROXY_FAST6")] // lb_common::map_name::PROXY_FAST6
pub static PROXY_FAST6: Array<lb_common::ProxyFast> =
    Array::with_max_entries(lb_common::PROXY_FAST_SLOTS, 0);

/// The SYN proxy's programs, one a family (tail calls). Per run, apart from `PROGS`.
#[map(name = "LB_PROXY_PROGS")] // lb_common::map_name::PROXY_PROGS
pub static PROXY_PROGS: ProgramArray = ProgramArray::with_max_entries(lb_common::PROXY_SLOTS, 0);

/// The SYN proxy's working copies of a segment's options (received, and as sent), which the
/// proxy program's stack cannot spare, and the walk over them in progress (a `bpf_loop`
/// callback's state). Holds nothing between packets: never pinned.
pub struct ProxyWork {
    pub old: lb_common::TcpOpts,
    pub new: lb_common::TcpOpts,
    pub walker: lb_common::Walker,
    /// A proxied flow's translation, built here before it is stored.
    pub flow: lb_common::ProxyFlow,
    /// The walk is over `new` (translating), not `old` (reading).
    pub on_new: bool,
}

#[map(name = "LB_PROXY_WORK")] // lb_common::map_name::PROXY_WORK
pub static PROXY_WORK: PerCpuArray<ProxyWork> = PerCpuArray::with_max_entries(1, 0);
