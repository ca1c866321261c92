//! The object's names, as userspace looks them up (maps, programs, the parameters' global), and
//! the maps' sizes.

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
    /// `PerCpuArray<SynCell>` of [`crate::SYN_SKETCH_CELLS`]: the sketch consulted before the
    /// per-source SYN buckets.
    pub const SYN_SKETCH: &str = "LB_SYN_SKETCH";
    /// `PerCpuArray<FloodWindow>` of `max_services`: each service's new TCP connections on each
    /// CPU, for the flood mode of direct server return.
    pub const FLOOD: &str = "LB_FLOOD";
    /// `PerCpuArray` of one entry: the SNAT port search's working state for the packet on that
    /// CPU. Holds nothing between packets: never pinned, each load has its own.
    pub const SNAT_SEARCH: &str = "LB_SNAT_SEARCH";

    // IPv6: the same maps for the other family (same layouts over [`crate::Addr6`]).
    /// `Array<AddrSet6>` of [`crate::ADDR_SETS`] sets: IPv6 address → [`crate::addr_flags`].
    pub const ADDRS6: &str = "LB_ADDRS6";
    /// `HashMap<ServiceKey6, ServiceInfo>`: the IPv6 services (their ids share one space, and
    /// the rings and per-service counters, with the IPv4 services).
    pub const SERVICES6: &str = "LB_SERVICES6";
    /// `Array<BackendInfo6>` indexed by backend id (ids share one space with IPv4 backends).
    pub const BACKENDS6: &str = "LB_BACKENDS6";
    /// `Array<CtSlot6>`: client → VIP flows of IPv6 services.
    pub const CONNTRACK6: &str = "LB_CONNTRACK6";
    /// `Array<NatSlot6>`: their return path and SNAT port reservations.
    pub const NAT6: &str = "LB_NAT6";
    /// The SNAT port search's working state for IPv6 flows (see [`SNAT_SEARCH`]).
    pub const SNAT_SEARCH6: &str = "LB_SNAT_SEARCH6";
    /// `PerCpuArray` of one entry: an ICMPv6 translation's working values. Never pinned.
    pub const ICMP6_WORK: &str = "LB_ICMP6_WORK";
    /// `PerCpuArray<u64>` of one entry: a value the IPv6 parser makes the verifier forget.
    /// Never pinned.
    pub const PARSE_SCRATCH: &str = "LB_PARSE_SCRATCH";
    /// `PerCpuArray<u32>` of one entry: the MTU a packet too big for its path is answered with,
    /// handed to the program that answers ([`crate::TOO_BIG_PROG`]). Never pinned.
    pub const TOO_BIG: &str = "LB_TOO_BIG";
    /// `PerCpuArray<ServiceHint>` of [`SERVICE_HINTS`](crate::SERVICE_HINTS) entries: each CPU's
    /// last answer of the service map for a destination (see [`ServiceHint`](crate::ServiceHint)),
    /// valid while [`SERVICES_GEN`] has not moved. Never pinned: a new load starts without.
    pub const SERVICE_HINT: &str = "LB_SERVICE_HINT";
    /// `Array<u32>` of one entry: the service maps' generation, moved on by every change of
    /// [`SERVICES`] or [`SERVICES6`] (after it), which voids the datapath's remembered answers.
    /// Pinned: a new daemon's changes void the answers of the programs it replaces too.
    pub const SERVICES_GEN: &str = "LB_SERVICES_GEN";
    /// `PerCpuArray<QuicServerKey>` of one entry: the key of a QUIC server lookup, built off
    /// the stack. Never pinned.
    pub const QUIC_KEY: &str = "LB_QUIC_KEY";

    // Health probes through the tunnel (see [`crate::TUNNEL_MARK`]).
    /// `Array<TunnelProbe>` of [`crate::TUNNEL_SLOTS`]: a probe mark's slot → the IPv4 backend
    /// it leaves for, the VIP it goes to there, the encapsulation. Written by the daemon.
    pub const TUNNEL_PROBES: &str = "LB_TUNNEL_PROBES";
    /// `Array<TunnelProbe6>`: the same for IPv6 probes (the slots are one space).
    pub const TUNNEL_PROBES6: &str = "LB_TUNNEL_PROBES6";
    /// `LruHashMap<FlowKey, ProbeReply>` of [`crate::PROBE_REPLIES_SIZE`]: the replies the
    /// probes await (VIP:port → lb's address:port) → the backend they come from. Written by
    /// the TC program for each probe packet, read by the XDP program.
    pub const PROBE_REPLIES: &str = "LB_PROBE_REPLIES";
    /// `LruHashMap<FlowKey6, ProbeReply6>`: the same for IPv6.
    pub const PROBE_REPLIES6: &str = "LB_PROBE_REPLIES6";

    // The datapath trace (see [`crate::TraceFilter`]), per run: never pinned.
    /// `Array<TraceFilter>` of one entry: the trace's filters, rate and deadline.
    pub const TRACE: &str = "LB_TRACE";
    /// `PerCpuArray<TraceCpu>` of one entry: the packet handed to `lb_trace`, its rate budget
    /// and its losses.
    pub const TRACE_CPU: &str = "LB_TRACE_CPU";
    /// `ProgramArray` of one slot: `lb_trace`. Apart from [`PROGS`] (pinned, its size part of
    /// the pinned layout): this one is per run, and empties when its daemon dies.
    pub const TRACE_PROG: &str = "LB_TRACE_PROG";
    // QUIC routing by server ID (see [`crate::QuicServerKey`]). Written in full by the daemon
    // at every load, before its programs are attached: never pinned.
    /// `Array<u32>` indexed by service id: its layout word ([`crate::quic_layout_word`]); 0:
    /// not a QUIC service.
    pub const QUIC_LAYOUTS: &str = "LB_QUIC_LAYOUTS";
    /// `Array<QuicServerId>` indexed by backend id: the backend's server ID, if it has one.
    pub const QUIC_IDS: &str = "LB_QUIC_IDS";
    /// `HashMap<QuicServerKey, u32>`: (service id, server ID) → backend id; one entry per
    /// backend at most (sized by `max_backends`).
    pub const QUIC_SERVERS: &str = "LB_QUIC_SERVERS";
    // The SYN proxy (see lb_common's synproxy.rs).
    /// `Array<CookieKey>` of [`crate::COOKIE_KEYS`]: the cookie keys, current first. Written by
    /// each daemon at its start (from `syn_cookie_key_file`, or a random key), so per run.
    pub const COOKIE_KEYS: &str = "LB_COOKIE_KEYS";
    /// `LruHashMap<FlowKey, ProxyFlow>`: the proxied IPv4 flows' translations, by client → VIP
    /// key (`syn_proxy_flows` entries). Pinned: proxied flows outlive a restart.
    pub const PROXY: &str = "LB_PROXY";
    /// `LruHashMap<FlowKey6, ProxyFlow>`: the same for IPv6.
    pub const PROXY6: &str = "LB_PROXY6";
    /// `Array<ProxyFast>` of [`crate::PROXY_FAST_SLOTS`]: the open proxied IPv4 flows' offsets
    /// where the balancer reads them, by flow hash. Per run: the proxy's programs fill it again.
    pub const PROXY_FAST: &str = "LB_PROXY_FAST";
    pub const PROXY_FAST6: &str = "LB_PROXY_FAST6";
    /// `ProgramArray` of [`crate::PROXY_SLOTS`]: the SYN proxy's programs, one a family. Per
    /// run, apart from [`PROGS`] (whose size is part of the pinned layout).
    pub const PROXY_PROGS: &str = "LB_PROXY_PROGS";
    /// `PerCpuArray` of one entry: the SYN proxy's working copies of a segment's options.
    /// Never pinned.
    pub const PROXY_WORK: &str = "LB_PROXY_WORK";
    /// `PerCpuArray` of one entry each: the parsed flow the proxy's first stage hands to the
    /// next. Never pinned.
    pub const PROXY_FLOW: &str = "LB_PROXY_FLOW";
    pub const PROXY_FLOW6: &str = "LB_PROXY_FLOW6";
    /// aya-log's `RingBuf` of log records (the trace's records), named by aya-log.
    pub const AYA_LOGS: &str = "AYA_LOGS";
}

/// Slots of [`map_name::PROGS`].
pub const ICMP_PROG: u32 = 0;
pub const ICMP6_PROG: u32 = 1;
pub const XDP6_PROG: u32 = 2;
/// Answers a packet too big for its path with ICMP fragmentation needed / packet too big.
pub const TOO_BIG_PROG: u32 = 3;
/// Turns a reply to a health probe through the tunnel back into its backend's (see
/// [`crate::TUNNEL_MARK`]).
pub const PROBE_REPLY_PROG: u32 = 4;
pub const PROG_SLOTS: u32 = 5;
/// Slots of [`map_name::PROXY_PROGS`]: a family's first program ([`PROXY_PROG`],
/// [`PROXY6_PROG`]) plus its stage ([`PROXY_ENTRY`], [`PROXY_OPEN`], [`PROXY_TRANSLATE`]).
pub const PROXY_PROG: u32 = 0;
pub const PROXY6_PROG: u32 = 1;
/// The proxy's stages: the first (SYNs answered, backends' segments translated), the opening
/// of a flow (an ACK whose cookie is checked), the client's segments translated, the SYN sent
/// to the backend.
pub const PROXY_ENTRY: u32 = 0;
pub const PROXY_OPEN: u32 = 2;
pub const PROXY_TRANSLATE: u32 = 4;
pub const PROXY_SYN: u32 = 6;
pub const PROXY_SLOTS: u32 = 8;
/// The SYN proxy's programs, by slot of [`map_name::PROXY_PROGS`].
pub const PROXY_PROGRAMS: [(u32, &str); 8] = [
    (PROXY_PROG + PROXY_ENTRY, "lb_synproxy"),
    (PROXY6_PROG + PROXY_ENTRY, "lb_synproxy6"),
    (PROXY_PROG + PROXY_OPEN, "lb_proxy_open"),
    (PROXY6_PROG + PROXY_OPEN, "lb_proxy_open6"),
    (PROXY_PROG + PROXY_TRANSLATE, "lb_proxy_xlate"),
    (PROXY6_PROG + PROXY_TRANSLATE, "lb_proxy_xlate6"),
    (PROXY_PROG + PROXY_SYN, "lb_proxy_syn"),
    (PROXY6_PROG + PROXY_SYN, "lb_proxy_syn6"),
];
/// Default of `syn_proxy_flows`: the proxied flows each family's translation map holds.
pub const DEFAULT_PROXY_FLOWS: u32 = 1 << 16;

/// Name of the global [`Params`](crate::Params) in the object, set by userspace at load time.
pub const PARAMS_GLOBAL: &str = "LB_PARAMS";

/// Name of the XDP program in the object file.
pub const PROGRAM_NAME: &str = "lb_xdp";
/// The balancer's handler of ICMP for lb's addresses, reached by a tail call
/// ([`map_name::PROGS`] slot [`ICMP_PROG`]).
pub const ICMP_PROGRAM_NAME: &str = "lb_icmp";
/// The balancer's IPv6 half, reached by a tail call for every IPv6 frame ([`map_name::PROGS`]
/// slot [`XDP6_PROG`]).
pub const XDP6_PROGRAM_NAME: &str = "lb_xdp6";
/// The balancer's handler of ICMPv6 for lb's IPv6 addresses ([`map_name::PROGS`] slot
/// [`ICMP6_PROG`]).
pub const ICMP6_PROGRAM_NAME: &str = "lb_icmp6";
/// The answer to a packet too big for its path ([`map_name::PROGS`] slot [`TOO_BIG_PROG`]).
pub const TOO_BIG_PROGRAM_NAME: &str = "lb_too_big";
/// Replies to health probes through the tunnel ([`map_name::PROGS`] slot [`PROBE_REPLY_PROG`]).
pub const PROBE_REPLY_PROGRAM_NAME: &str = "lb_probe_reply";
/// The datapath trace's writer ([`map_name::TRACE_PROG`] slot 0; see [`crate::TraceFilter`]).
pub const TRACE_PROGRAM_NAME: &str = "lb_trace";
/// The TC egress program that encapsulates health probes through the tunnel (see
/// [`crate::TUNNEL_MARK`]), attached with TCX to each of lb's interfaces.
pub const PROBE_ENCAP_PROGRAM_NAME: &str = "lb_probe_encap";
/// A program that only returns XDP_PASS: the baseline for benchmarks, and the peer program that
/// native XDP on veth needs to receive XDP_TX / redirected frames.
pub const PASS_PROGRAM_NAME: &str = "lb_pass";

/// Compile-time defaults of the maps' sizes; userspace sets the real sizes at load time.
pub const DEFAULT_MAX_SERVICES: u32 = 64;
pub const DEFAULT_MAX_BACKENDS: u32 = 4096;
pub const DEFAULT_RING_SIZE: u32 = 65537;
pub const DEFAULT_CONNTRACK_SIZE: u32 = 1 << 20;
/// The IPv6 connection table's default: a quarter of the IPv4 one (its slots are 64 bytes and
/// its NAT slots 112, against 40 and 64).
pub const DEFAULT_CONNTRACK6_SIZE: u32 = 1 << 18;
/// Upper bound of interfaces lb attaches to.
pub const MAX_TX_PORTS: u32 = 64;

/// Size of the [`map_name::SIGNALS`] ring buffer (a power-of-two multiple of the page size). A
/// record takes 24 bytes in it (8 of header), so it holds 2730 signals between two drains; more
/// are counted in [`counter::SIGNAL_LOST`](crate::counter::SIGNAL_LOST).
pub const SIGNALS_RING_BYTES: u32 = 64 * 1024;
