//! The datapath's parameters (a global userspace sets at load time) and what the datapath derives
//! from them: SNAT port candidates, the token buckets of its rate limits.

use crate::{DEFAULT_CONNTRACK_SIZE, DEFAULT_CONNTRACK6_SIZE, DEFAULT_RING_SIZE, FlowAddr, fmix64};

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
    /// Idle timeouts in nanoseconds, indexed by [`ct_state`](crate::ct_state) (an array, so the
    /// datapath indexes it with a masked state instead of a branch table).
    pub timeout_ns: [u64; 4],
    /// How long a TCP flow closed both ways ([`ct_flags::closed`](crate::ct_flags::closed)) keeps
    /// its SNAT port from other flows, nanoseconds: late segments of the old connection (a
    /// retransmitted FIN, the last ACK) still find it, and then a new flow may take the port, long
    /// before the closing timeout.
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
    /// The IPv6 connection table's size - 1 and its NAT table's (twice as large), as above.
    pub table6_mask: u32,
    pub nat6_mask: u32,
    /// UDP destination port of GUE encapsulation (`gue_port`), network byte order.
    pub gue_port: u16,
    pub _pad: u16,
    /// New TCP connections a second one direct-server-return service takes into the connection
    /// table on one CPU before flood mode (see [`flood_step`]); 0: never.
    pub dsr_flood_rate: u32,
    pub _pad2: u32,
}

/// One CPU's count of one service's new TCP connections (SYNs without a flow), a window a
/// second long, and whether the service is in flood mode on this CPU (see [`flood_step`]).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FloodWindow {
    /// Start of the current window, coarse monotonic nanoseconds.
    pub start: u64,
    pub count: u32,
    /// 1: the window before this one counted more than the rate.
    pub engaged: u32,
}

/// Counts a SYN of a new connection in `w` at `now` and says whether it is in flood mode: the
/// current window has counted more than `rate`, or the previous one did. So a flood gets `rate`
/// entries at its start and none after while it lasts, however long (a steady allowance a second
/// would still fill any table in the SYN timeout), and a service leaves flood mode a second
/// after its rate fell back.
#[inline(always)]
pub fn flood_step(w: &mut FloodWindow, rate: u32, now: u64) -> bool {
    if now.saturating_sub(w.start) >= 1_000_000_000 {
        // The window just ended decides the next one; a gap of several seconds counted none.
        let last_full = now.saturating_sub(w.start) < 2_000_000_000;
        w.engaged = (last_full && w.count > rate) as u32;
        w.start = now;
        w.count = 0;
    }
    w.count = w.count.saturating_add(1);
    w.engaged != 0 || w.count > rate
}

/// Token buckets of the per-source SYN limit, per CPU (a power of two): a source shares its
/// bucket with another one with p = 1/16384.
pub const SYN_BUCKETS: u32 = 1 << 14;

/// The SYN-limit bucket of source address `addr` (network byte order); an IPv6 source by its
/// /64 (see [`FlowAddr::prefix64`]).
#[inline(always)]
pub fn syn_bucket<A: FlowAddr>(addr: A) -> u32 {
    syn_slots(addr).1
}

/// Cells of the per-CPU SYN sketch (a power of two): 8 KiB per CPU, which the caches mostly keep
/// while a SYN's connection and NAT table lines miss them; they do not keep the buckets' 256 KiB.
pub const SYN_SKETCH_CELLS: u32 = 1 << 10;

/// The sketch cell (see [`SynCell`]) and the bucket of source address `addr`, from one mix:
/// the cell from its other bits, so two sources sharing a cell rarely share a bucket too.
#[inline(always)]
pub fn syn_slots<A: FlowAddr>(addr: A) -> (u32, u32) {
    let mix = fmix64(addr.prefix64());
    (
        ((mix >> 32) as u32) & (SYN_SKETCH_CELLS - 1),
        (mix as u32) & (SYN_BUCKETS - 1),
    )
}

/// A sketch cell's epoch is the coarse clock's nanoseconds shifted right by this: about a second.
pub const SYN_EPOCH_SHIFT: u32 = 30;

/// One cell of the per-CPU SYN sketch, consulted before the per-source buckets: the new
/// connections the sources hashing to it opened in `epoch` (see [`SYN_EPOCH_SHIFT`]).
/// While the count is within [`syn_quiet`] and the cell was not loud (beyond it) the epoch
/// before, its SYNs pass without their bucket, a cold line for most new sources. The rest are
/// the buckets'. So a burst may pass up to twice the quiet share more than the buckets alone
/// would (once in each of two epochs it straddles) and a steady flood, loud every epoch, is held
/// to the rate; a source is never billed for another's SYNs.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SynCell {
    pub epoch: u32,
    pub count: u16,
    /// 1: the count went beyond the quiet share in the epoch before `epoch`.
    pub loud: u16,
}

impl SynCell {
    /// Counts a SYN at `now` (coarse ns) against the quiet share `share` ([`syn_quiet`]); true
    /// when it passes unbilled, false when its bucket decides.
    #[inline(always)]
    pub fn quiet(&mut self, now: u64, share: u16) -> bool {
        let epoch = (now >> SYN_EPOCH_SHIFT) as u32;
        if self.epoch != epoch {
            // Loud only after a loud epoch just before: a source that floods on is billed in
            // full, one that went beyond a while ago is quiet again.
            let loud = self.count > share && self.epoch.wrapping_add(1) == epoch;
            *self = SynCell {
                epoch,
                count: 0,
                loud: loud as u16,
            };
        }
        self.count = self.count.saturating_add(1);
        self.loud == 0 && self.count <= share
    }
}

/// SYNs a sketch cell lets through unbilled per epoch under the limit `rate`: an eighth (0 below
/// 8 a second: every SYN is its bucket's), within the count's range.
#[inline(always)]
pub fn syn_quiet(rate: u32) -> u16 {
    (rate >> 3).min(u32::from(u16::MAX - 1)) as u16
}

/// Slots of the per-CPU service hint (see [`service_hint`]): a few VIP ports' worth, small
/// enough to stay in the caches.
pub const SERVICE_HINTS: u32 = 256;

/// The service-hint slot of destination `addr:port` (`proto`): where a CPU keeps the service
/// of its last new flow there, the datapath's guess for reading a SYN's ring line early.
#[inline(always)]
pub fn service_hint<A: FlowAddr>(addr: A, port: u16, proto: u8) -> u32 {
    // One multiply (Fibonacci hashing, the product's top byte): a SYN computes it twice.
    let k = addr.table_hash() ^ ((port as u64) << 40) ^ ((proto as u64) << 56);
    (k.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 56) as u32 & (SERVICE_HINTS - 1)
}

/// A CPU's memory of a destination's service, slot [`service_hint`] of its per-CPU array
/// ([`map_name::SERVICE_HINT`](crate::map_name::SERVICE_HINT)): what the service map answered
/// for `addr:port` (`proto`), and the service generation
/// ([`map_name::SERVICES_GEN`](crate::map_name::SERVICES_GEN)) it answered under. While that
/// generation is current the answer stands, and a new flow to the destination does not look the
/// service map up (a hash map: a call, a hash, a walk); any change of the service map moves the
/// generation on. A SYN also reads `info.id` before its connection table lookup, as a guess of
/// its ring (valid or not: a wrong guess costs a line read).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ServiceHint {
    /// The destination as IPv6 words (an IPv4 address IPv4-mapped, [`FlowAddr::to_addr6`]).
    pub addr: crate::Addr6,
    pub port: u16,
    pub proto: u8,
    pub _pad: u8,
    pub generation: u32,
    pub info: crate::ServiceInfo,
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
        table6_mask: DEFAULT_CONNTRACK6_SIZE - 1,
        nat6_mask: 2 * DEFAULT_CONNTRACK6_SIZE - 1,
        gue_port: crate::DEFAULT_GUE_PORT.to_be(),
        _pad: 0,
        dsr_flood_rate: 50_000,
        _pad2: 0,
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

/// Candidate SNAT ports tried for a new flow before giving up (counted). The NAT table is at
/// most half full of live flows, so all 16 sets are full with p < 2.5e-10.
pub const SNAT_PORT_TRIES: u32 = 16;

/// The `try`-th SNAT port candidate (host order) for a flow with `hash`: the first from the hash
/// itself (a flow made again, or on another lb host, asks for the same port first), each further
/// one drawn anew from it. Not the next ports: a new flow meeting held ports took the first free
/// one after them, which piled the held ports into runs, and a run of 16 refused new flows far
/// more often than independent candidates are all held (u^16; see the test below).
#[inline(always)]
pub const fn snat_port_candidate(hash: u64, try_: u32, p: &Params) -> u16 {
    // checked_rem: a zero count must not become a division trap (the verifier rejects those).
    let count = p.snat_port_count as u32;
    let draw = if try_ == 0 {
        hash
    } else {
        fmix64(hash ^ try_ as u64)
    };
    let offset = match ((draw >> 32) as u32).checked_rem(count) {
        Some(o) => o,
        None => 0,
    };
    (p.snat_port_min as u32 + offset) as u16
}

/// A token bucket (one per CPU): `tokens` left at `at` (coarse ns), refilled at the rate.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TokenBucket {
    pub at: u64,
    pub tokens: u64,
}

// The layouts both sides rely on, checked wherever this crate builds (the BPF object too).
const _: () = {
    use core::mem::size_of;
    assert!(size_of::<Params>() == 96);
    assert!(size_of::<FloodWindow>() == 16);
    assert!(size_of::<TokenBucket>() == 16);
    assert!(size_of::<SynCell>() == 8);
};

#[cfg(feature = "user")]
mod pod {
    // SAFETY: #[repr(C)] integers and byte arrays with explicit padding (the crate's layout
    // rules), valid for any bit pattern.
    unsafe impl aya::Pod for super::Params {}
    unsafe impl aya::Pod for super::TokenBucket {}
    unsafe impl aya::Pod for super::FloodWindow {}
    unsafe impl aya::Pod for super::SynCell {}
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

    /// A sketch cell passes its quiet share of an epoch unbilled and leaves the rest to the
    /// buckets; an epoch beyond it makes the next one loud (every SYN billed), so a steady flood
    /// is billed in full from its second epoch; a quiet epoch, or a gap, makes it quiet again.
    #[test]
    fn a_sketch_cell_is_quiet_within_its_share_and_loud_after_a_loud_epoch() {
        let q = syn_quiet(10_000);
        assert_eq!(q, 1250);
        let mut c = SynCell::default();
        let passed = |c: &mut SynCell, epoch: u64, n| {
            (0..n)
                .filter(|_| c.quiet(epoch << SYN_EPOCH_SHIFT, q))
                .count()
        };
        assert_eq!(passed(&mut c, 7, 2000), 1250, "the first epoch: its share");
        for epoch in 8..12 {
            assert_eq!(passed(&mut c, epoch, 2000), 0, "a flood billed in full");
        }
        assert_eq!(
            passed(&mut c, 12, 3),
            0,
            "loud after the flood's last epoch"
        );
        assert_eq!(passed(&mut c, 13, 5), 5, "quiet after a quiet epoch");
        assert_eq!(passed(&mut c, 14, 1251), 1250);
        assert_eq!(passed(&mut c, 16, 1), 1, "a loud epoch, then a gap: quiet");
        // The count saturates: a share near the top of its range stays exact.
        let top = syn_quiet(u32::MAX);
        let mut c = SynCell::default();
        assert_eq!(
            (0..70_000)
                .filter(|_| c.quiet(1 << SYN_EPOCH_SHIFT, top))
                .count(),
            usize::from(top)
        );
        assert_eq!(
            syn_quiet(7),
            0,
            "below 8 a second every SYN is its bucket's"
        );
    }

    /// A service under a flood is in flood mode from its rate's next SYN until a second after
    /// the flood: its first window, every full window after, then one more.
    #[test]
    fn flood_mode_engages_beyond_the_rate_and_leaves_a_second_after() {
        const S: u64 = 1_000_000_000;
        let mut w = FloodWindow::default();
        let t0 = 10 * S;
        let flooded: u32 = (0..10).map(|i| flood_step(&mut w, 3, t0 + i) as u32).sum();
        assert_eq!(flooded, 7, "beyond 3 in the first window");
        // The next window: flood mode from its first SYN (the last window went beyond).
        assert!(flood_step(&mut w, 3, t0 + S));
        for i in 1..5 {
            assert!(flood_step(&mut w, 3, t0 + S + i));
        }
        // A quiet window (2 SYNs) after a flooded one is still in flood mode...
        assert!(flood_step(&mut w, 3, t0 + 2 * S));
        assert!(flood_step(&mut w, 3, t0 + 2 * S + 1));
        // ... and the window after it is not.
        assert!(!flood_step(&mut w, 3, t0 + 3 * S));
        // A flood, then a pause of several seconds: the old count does not carry.
        for i in 0..10 {
            flood_step(&mut w, 3, t0 + 4 * S + i);
        }
        assert!(!flood_step(&mut w, 3, t0 + 9 * S));
        // Rate 0 is never called by the datapath (off); u32::MAX never floods.
        let mut w = FloodWindow::default();
        assert!((0..1000).all(|i| !flood_step(&mut w, u32::MAX, t0 + i)));
    }

    /// A new flow's SNAT candidates after the first are drawn independently: with half of the
    /// ports held, all 16 are held about u^16 of the time (1 in 65,000). Consecutive candidates
    /// piled the held ports into runs (linear probing): 1 new flow in 180 met 16 held in a row.
    #[test]
    fn snat_candidates_do_not_pile_held_ports_into_runs() {
        const COUNT: usize = Params::DEFAULT.snat_port_count as usize;
        let p = Params::DEFAULT;
        let mut held = [false; COUNT];
        let mut seed = 1u64;
        let mut flow_hash = || {
            seed += 1;
            fmix64(seed)
        };
        let port = |h: u64, i: u32| (snat_port_candidate(h, i, &p) - p.snat_port_min) as usize;
        // Half the ports taken as new flows take them: each its first free candidate.
        let mut taken = 0;
        while taken < COUNT / 2 {
            let h = flow_hash();
            if let Some(i) = (0..SNAT_PORT_TRIES).find(|&i| !held[port(h, i)]) {
                held[port(h, i)] = true;
                taken += 1;
            }
        }
        let trials = 100_000;
        let refused = (0..trials)
            .filter(|_| {
                let h = flow_hash();
                (0..SNAT_PORT_TRIES).all(|i| held[port(h, i)])
            })
            .count();
        // About 1.5 expected.
        assert!(
            refused <= 10,
            "{refused} of {trials} new flows found every candidate held at half the ports"
        );
        // The first candidate stays the flow's hash's: a flow made again, or on another lb
        // host, finds the same port first.
        let h = flow_hash();
        assert_eq!(port(h, 0), ((h >> 32) % COUNT as u64) as usize);
    }

    /// The ports of one VIP, and IPv6 VIPs of one /64, spread over the hint's slots: a
    /// destination's hint is not its neighbour's.
    #[test]
    fn service_hints_spread_ports_and_ipv6_vips() {
        let slots = |it: &mut dyn Iterator<Item = u32>| {
            let mut seen = [false; SERVICE_HINTS as usize];
            it.for_each(|s| seen[s as usize] = true);
            seen.iter().filter(|&&s| s).count()
        };
        let vip = u32::from_ne_bytes([10, 100, 0, 1]);
        let ports = slots(&mut (0..64u16).map(|p| service_hint(vip, (80 + p).to_be(), 6)));
        let mut ipv6 = (0..64u32).map(|i| {
            let a: crate::Addr6 = [0x2001_0db8u32.to_be(), 0, 0, (i + 1).to_be()];
            service_hint(a, 443u16.to_be(), 17)
        });
        let vips6 = slots(&mut ipv6);
        // 64 balls in 256 bins: about 57 distinct expected; far fewer means a weak mix.
        assert!(
            ports >= 48 && vips6 >= 48,
            "ports {ports}, IPv6 VIPs {vips6}"
        );
        assert_ne!(
            service_hint(vip, 80u16.to_be(), 6),
            service_hint(vip, 80u16.to_be(), 17)
        );
    }
}
