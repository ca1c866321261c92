//! The SYN proxy's shared core (see the datapath's synproxy.rs): the cookie, the TCP options it
//! reads and writes, the state a proxied flow keeps. Pure functions over integers and byte
//! arrays, so the BPF program and the host tests run the same code.
//!
//! A cookie is lb's initial sequence number for a client's SYN: 5 bits of a coarse wall-clock
//! counter (TAI, the same on every host whose clock is synchronised, so an ACK validates on
//! another lb host than its SYN's), 2 bits of an MSS index, and 25 bits of SipHash-2-4 of the
//! flow, the client's sequence number and both, keyed by a secret the daemon writes (several
//! hosts share it through `syn_cookie_key_file`). Window scale and SACK-permitted travel in the
//! low 6 bits of lb's timestamp, which the client echoes (netfilter's scheme).

/// A SipHash key (128 bits): [`COOKIE_KEYS`] slots of the key map, the current one first.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CookieKey {
    pub k0: u64,
    pub k1: u64,
}

/// Slots of the cookie key map: the current key, and the one before it (still valid for the
/// cookies it made before a rotation).
pub const COOKIE_KEYS: u32 = 2;

/// The MSS values a cookie can carry, by its 2-bit index: the client's MSS is rounded down to
/// one of them (the kernel's syncookies use a similar table).
pub const COOKIE_MSS: [u16; 4] = [536, 1220, 1440, 1460];

/// The cookie's clock: TAI nanoseconds >> this (about 68.7 s a tick).
pub const COOKIE_TICK_SHIFT: u32 = 36;
/// A cookie's age at most, in ticks (2 to 3 ticks: 2.3 to 3.4 minutes, the kernel's is 2 to 3).
pub const COOKIE_MAX_AGE: u32 = 2;
const MAC_BITS: u32 = 25;
const MAC_MASK: u32 = (1 << MAC_BITS) - 1;

/// Window scale lb announces to a proxied client (Linux's for its default buffers); the
/// backend's own is translated to it.
pub const PROXY_WSCALE: u8 = 7;
/// "No window scale" in a decoded timestamp.
pub const NO_WSCALE: u8 = 0xf;
const TS_WSCALE_MASK: u32 = 0xf;
const TS_SACK: u32 = 0x10;
/// The timestamp bits that carry options.
const TS_OPTS_MASK: u32 = 0x3f;

/// TCP option kinds.
pub const OPT_EOL: u8 = 0;
pub const OPT_NOP: u8 = 1;
pub const OPT_MSS: u8 = 2;
pub const OPT_WSCALE: u8 = 3;
pub const OPT_SACK_PERM: u8 = 4;
pub const OPT_SACK: u8 = 5;
pub const OPT_TS: u8 = 8;
/// TCP options are 40 bytes at most.
pub const MAX_OPTS: usize = 40;

/// States of a proxied flow ([`ProxyFlow::state`]).
pub mod proxy_state {
    /// The client's ACK validated; lb sent the backend its SYN and awaits the SYN+ACK.
    pub const PENDING: u8 = 1;
    /// The backend answered: the offsets are known, both directions are translated.
    pub const OPEN: u8 = 2;
}

/// [`ProxyFlow::opts`] bits: what the client's SYN offered (from the cookie and its timestamp).
pub mod proxy_opts {
    pub const TS: u8 = 1;
    pub const SACK: u8 = 2;
    /// lb's SYN again carried a timestamp past a TIME_WAIT's ([`super::ProxyFlow::cts_off`]):
    /// done once a flow.
    pub const TS_MOVED: u8 = 4;
}

/// A proxied flow's translation, keyed by its client → VIP key. Sequence numbers in host order.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProxyFlow {
    /// lb's initial sequence number towards the client (the cookie).
    pub cookie: u32,
    /// The client's initial sequence number.
    pub client_isn: u32,
    /// The backend's initial sequence number less the cookie (wrapping): added to the
    /// acknowledgements and SACK blocks the client sends, taken from the backend's sequence
    /// numbers. Known once [`proxy_state::OPEN`].
    pub seq_off: u32,
    /// lb's timestamp to the client less the backend's (wrapping): added to the backend's
    /// TSval, taken from the client's TSecr.
    pub ts_off: u32,
    /// Added to the client's TSval towards the backend, taken from the backend's TSecr
    /// (wrapping). 0 unless the backend's TIME_WAIT of an earlier connection on the same
    /// 4-tuple refused lb's SYN for an older timestamp: lb's SYN again then carries one just
    /// past that connection's, which the TIME_WAIT accepts (see the datapath's `stale`).
    pub cts_off: u32,
    /// lb's TSval in its SYN+ACK (the client echoed it) and the client's TSval in its ACK: the
    /// SYN to the backend carries the latter, the offset is computed from the former.
    pub lb_tsval: u32,
    pub client_tsval: u32,
    pub _pad0: u32,
    /// When lb sent the backend its (first) SYN, coarse monotonic nanoseconds.
    pub syn_at: u64,
    /// The client's MSS (from the cookie), host order.
    pub mss: u16,
    pub state: u8,
    /// [`proxy_opts`] bits.
    pub opts: u8,
    /// The client's window scale, [`NO_WSCALE`] for none.
    pub client_wscale: u8,
    /// The backend's window scale less [`PROXY_WSCALE`] (its windows are shifted by it towards
    /// the client); 0 without window scaling.
    pub wshift: i8,
    pub _pad: [u8; 2],
}

/// Slots of each family's [`ProxyFast`] array: a direct-mapped cache of the open proxied flows'
/// offsets, by flow hash. Flows that share a slot take turns in it; the one not in it has its
/// segments translated by the proxy's programs, which put it back.
pub const PROXY_FAST_SLOTS: u32 = 1 << 16;

/// An open proxied flow's offsets, where the balancer translates its common segments itself (a
/// copy of its [`ProxyFlow`]'s, written by the proxy's programs): an array slot read by index
/// costs a fraction of the LRU hash map's lookup, which made a proxied packet 1.7× an
/// unproxied one. Per run: a new daemon's programs fill it again from [`ProxyFlow`]s.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProxyFast {
    pub seq_off: u32,
    pub ts_off: u32,
    pub cts_off: u32,
    /// The flow hash's high 32 bits and the key's ports ([`proxy_fast_ports`]): with the slot
    /// (the hash's low bits) they tell this flow's entry from another's; mistaking one needs two
    /// live proxied flows whose hashes agree on 48 bits and whose ports agree.
    pub tag: u32,
    pub ports: u32,
    pub wshift: i8,
    /// Non-zero: the fields above hold an open flow's offsets.
    pub open: u8,
    pub _pad: [u8; 2],
}

/// The slot and tag of the flow with `hash` in a [`ProxyFast`] array.
#[inline(always)]
pub const fn proxy_fast_slot(hash: u64) -> (u32, u32) {
    (hash as u32 & (PROXY_FAST_SLOTS - 1), (hash >> 32) as u32)
}

/// A key's ports (network order, as in the key) as [`ProxyFast::ports`] holds them.
#[inline(always)]
pub const fn proxy_fast_ports(sport: u16, dport: u16) -> u32 {
    ((sport as u32) << 16) | dport as u32
}

impl ProxyFast {
    /// Whether this is the open entry of the flow with `hash` and `ports`.
    #[inline(always)]
    pub const fn holds(&self, hash: u64, ports: u32) -> bool {
        self.open != 0 && self.tag == proxy_fast_slot(hash).1 && self.ports == ports
    }
}

// The layouts both sides rely on, checked wherever this crate builds (the BPF object too).
const _: () = {
    assert!(core::mem::size_of::<CookieKey>() == 16);
    assert!(core::mem::size_of::<ProxyFlow>() == 48);
    assert!(core::mem::size_of::<ProxyFast>() == 24);
    assert!(PROXY_FAST_SLOTS.is_power_of_two());
};

#[cfg(feature = "user")]
mod pod {
    // SAFETY: #[repr(C)] integers and byte arrays with explicit padding (the crate's layout
    // rules), valid for any bit pattern.
    unsafe impl aya::Pod for super::CookieKey {}
    unsafe impl aya::Pod for super::ProxyFlow {}
    unsafe impl aya::Pod for super::ProxyFast {}
}

#[inline(always)]
fn sip_round(v: &mut [u64; 4]) {
    v[0] = v[0].wrapping_add(v[1]);
    v[1] = v[1].rotate_left(13) ^ v[0];
    v[0] = v[0].rotate_left(32);
    v[2] = v[2].wrapping_add(v[3]);
    v[3] = v[3].rotate_left(16) ^ v[2];
    v[0] = v[0].wrapping_add(v[3]);
    v[3] = v[3].rotate_left(21) ^ v[0];
    v[2] = v[2].wrapping_add(v[1]);
    v[1] = v[1].rotate_left(17) ^ v[2];
    v[2] = v[2].rotate_left(32);
}

/// SipHash-2-4 of `N` 64-bit words (a message of `8 * N` bytes) under `key`.
#[inline(always)]
pub fn siphash<const N: usize>(key: &CookieKey, words: &[u64; N]) -> u64 {
    let mut v = [
        key.k0 ^ 0x736f_6d65_7073_6575,
        key.k1 ^ 0x646f_7261_6e64_6f6d,
        key.k0 ^ 0x6c79_6765_6e65_7261,
        key.k1 ^ 0x7465_6462_7974_6573,
    ];
    let mut i = 0;
    while i < N + 1 {
        // The last block holds only the length byte (the message is a multiple of 8 bytes).
        let m = if i < N {
            words[i]
        } else {
            ((8 * N) as u64) << 56
        };
        v[3] ^= m;
        sip_round(&mut v);
        sip_round(&mut v);
        v[0] ^= m;
        i += 1;
    }
    v[2] ^= 0xff;
    sip_round(&mut v);
    sip_round(&mut v);
    sip_round(&mut v);
    sip_round(&mut v);
    v[0] ^ v[1] ^ v[2] ^ v[3]
}

/// The cookie's MAC: `flow` (the addresses and ports as the caller folds them into words), the
/// client's sequence number, the full tick and the MSS index.
#[inline(always)]
fn mac<const N: usize>(key: &CookieKey, flow: &[u64; N], isn: u32, tick: u32, mss: u32) -> u32 {
    let mut words = [0u64; 6];
    let mut i = 0;
    while i < N && i < 5 {
        words[i] = flow[i];
        i += 1;
    }
    words[5] = ((isn as u64) << 32) | ((tick as u64) << 2) | mss as u64;
    siphash(key, &words) as u32 & MAC_MASK
}

/// The flow's words for the cookie: source, destination (addresses as the maps hold them),
/// ports. IPv4 uses the first two.
#[inline(always)]
pub fn cookie_words(src: [u32; 4], dst: [u32; 4], sport: u16, dport: u16) -> [u64; 5] {
    let pair = |a: u32, b: u32| ((a as u64) << 32) | b as u64;
    [
        pair(src[0], dst[0]),
        pair(((sport as u32) << 16) | dport as u32, src[1]),
        pair(src[2], src[3]),
        pair(dst[1], dst[2]),
        dst[3] as u64,
    ]
}

/// The index of the largest [`COOKIE_MSS`] value at most `mss` (0 below the smallest).
#[inline(always)]
pub fn mss_index(mss: u16) -> u32 {
    let mut idx = 0;
    let mut i = 1;
    while i < COOKIE_MSS.len() {
        if mss >= COOKIE_MSS[i] {
            idx = i as u32;
        }
        i += 1;
    }
    idx
}

/// The cookie for a SYN with sequence number `isn` of `flow` at `tick`, carrying MSS index
/// `mss_idx`.
#[inline(always)]
pub fn make_cookie<const N: usize>(
    key: &CookieKey,
    flow: &[u64; N],
    isn: u32,
    tick: u32,
    mss_idx: u32,
) -> u32 {
    ((tick & 0x1f) << 27) | ((mss_idx & 3) << MAC_BITS) | mac(key, flow, isn, tick, mss_idx & 3)
}

/// The MSS index of `cookie` if it is `key`'s for a SYN with sequence number `isn` of `flow`,
/// made at most [`COOKIE_MAX_AGE`] ticks before `tick`.
#[inline(always)]
pub fn check_cookie<const N: usize>(
    key: &CookieKey,
    flow: &[u64; N],
    isn: u32,
    cookie: u32,
    tick: u32,
) -> Option<u32> {
    let age = tick.wrapping_sub(cookie >> 27) & 0x1f;
    if age > COOKIE_MAX_AGE {
        return None;
    }
    let mss_idx = (cookie >> MAC_BITS) & 3;
    (mac(key, flow, isn, tick.wrapping_sub(age), mss_idx) == cookie & MAC_MASK).then_some(mss_idx)
}

/// lb's TSval in a SYN+ACK: a millisecond clock with the client's window scale (or
/// [`NO_WSCALE`]) and SACK-permitted in its low 6 bits, which the client's ACK echoes.
#[inline(always)]
pub fn ts_encode(now_ms: u32, wscale: u8, sack: bool) -> u32 {
    (now_ms & !TS_OPTS_MASK) | (wscale as u32 & TS_WSCALE_MASK) | if sack { TS_SACK } else { 0 }
}

/// The options [`ts_encode`] put in `tsecr`: (window scale or [`NO_WSCALE`], SACK-permitted).
#[inline(always)]
pub fn ts_decode(tsecr: u32) -> (u8, bool) {
    ((tsecr & TS_WSCALE_MASK) as u8, tsecr & TS_SACK != 0)
}

/// A window of the backend's (its scale less lb's is `shift`) in lb's scale, clamped.
#[inline(always)]
pub fn rescale(window: u16, shift: i8) -> u16 {
    let w = window as u32;
    let w = if shift >= 0 {
        w << (shift as u32 & 15)
    } else {
        w >> ((-shift) as u32 & 15)
    };
    if w > 0xffff { 0xffff } else { w as u16 }
}

/// TCP options copied off the packet: `len` bytes of `bytes`.
#[derive(Clone, Copy)]
pub struct TcpOpts {
    pub bytes: [u8; MAX_OPTS],
    pub len: usize,
}

/// What a SYN's or a SYN+ACK's options offer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SynOpts {
    /// 0: none given.
    pub mss: u16,
    /// [`NO_WSCALE`]: none.
    pub wscale: u8,
    pub sack: bool,
    /// (TSval, TSecr), host order.
    pub ts: Option<(u32, u32)>,
}

/// `at` through a volatile round trip: the bounds checks below stay in the code even where the
/// compiler proves them from earlier ones, which the BPF verifier does not follow.
#[inline(always)]
fn checked_index(at: usize) -> usize {
    // SAFETY: a read of a local variable.
    unsafe { core::ptr::read_volatile(&at) }
}

#[inline(always)]
fn be32(b: &[u8; MAX_OPTS], at: usize) -> u32 {
    let at = checked_index(at);
    if at > MAX_OPTS - 4 {
        return 0;
    }
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

#[inline(always)]
fn put32(b: &mut [u8; MAX_OPTS], at: usize, v: u32) {
    let at = checked_index(at);
    if at > MAX_OPTS - 4 {
        return;
    }
    let v = v.to_be_bytes();
    b[at] = v[0];
    b[at + 1] = v[1];
    b[at + 2] = v[2];
    b[at + 3] = v[3];
}

/// What a walk over options does besides reading them (see [`TcpOpts::step`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WalkMode {
    Read,
    /// A client's segment to the backend: SACK blocks plus `seq_off`, the TSval plus
    /// `cts_off`, the TSecr less `ts_off`.
    ToBackend,
    /// A backend's segment to the client: the TSval plus `ts_off`, the TSecr less `cts_off`.
    ToClient,
}

/// A walk over a segment's options in progress.
#[derive(Clone, Copy, Debug)]
pub struct Walker {
    /// The next option's first byte.
    pub at: usize,
    pub mode: WalkMode,
    pub seq_off: u32,
    pub ts_off: u32,
    pub cts_off: u32,
    /// What was read so far.
    pub syn: SynOpts,
    /// The options are malformed.
    pub bad: bool,
}

impl Walker {
    #[inline(always)]
    pub fn new(mode: WalkMode) -> Walker {
        Walker {
            at: 0,
            mode,
            seq_off: 0,
            ts_off: 0,
            cts_off: 0,
            syn: SynOpts {
                wscale: NO_WSCALE,
                ..SynOpts::default()
            },
            bad: false,
        }
    }
}

impl TcpOpts {
    pub const EMPTY: TcpOpts = TcpOpts {
        bytes: [0; MAX_OPTS],
        len: 0,
    };

    /// The options of a SYN or SYN+ACK; `None` if malformed (a length running past the end, or
    /// below 2).
    #[inline(always)]
    pub fn syn(&self) -> Option<SynOpts> {
        let mut copy = *self;
        copy.walk(Walker::new(WalkMode::Read))
    }

    /// The timestamp option's (TSval, TSecr), if any; `None` if the options are malformed.
    #[inline(always)]
    pub fn timestamps(&self) -> Option<Option<(u32, u32)>> {
        self.syn().map(|o| o.ts)
    }

    /// Translates the options of a client's segment to the backend (`to_backend`: SACK blocks
    /// plus `seq_off`, the TSval plus `cts_off`, the TSecr less `ts_off`) or of a backend's to
    /// the client (the TSval plus `ts_off`, the TSecr less `cts_off`). `false` if malformed:
    /// what was translated before the fault stays so, and the caller drops the segment.
    #[inline(always)]
    pub fn translate(&mut self, to_backend: bool, seq_off: u32, ts_off: u32, cts_off: u32) -> bool {
        let mode = if to_backend {
            WalkMode::ToBackend
        } else {
            WalkMode::ToClient
        };
        let mut w = Walker::new(mode);
        w.seq_off = seq_off;
        w.ts_off = ts_off;
        w.cts_off = cts_off;
        self.walk(w).is_some()
    }

    /// A whole walk (see [`TcpOpts::step`]); what it read, `None` if malformed.
    #[inline(always)]
    pub fn walk(&mut self, mut w: Walker) -> Option<SynOpts> {
        // Each option takes a byte at least: MAX_OPTS steps end any walk.
        for _ in 0..MAX_OPTS {
            if !self.step(&mut w) {
                break;
            }
        }
        (!w.bad).then_some(w.syn)
    }

    /// One step of a walk over the options: the option at `w.at` is read into `w.syn` and, as
    /// `w.mode` says, translated; `w.at` moves past it. `false` when the walk is over (the end,
    /// or malformed options: `w.bad`). One step at a time, so that the datapath runs it as a
    /// `bpf_loop` callback, which the verifier walks once.
    #[inline(always)]
    pub fn step(&mut self, w: &mut Walker) -> bool {
        let at = w.at;
        if at >= self.len || at >= MAX_OPTS {
            return false;
        }
        let kind = self.bytes[at];
        if kind == OPT_EOL {
            return false;
        }
        if kind == OPT_NOP {
            w.at = at + 1;
            return true;
        }
        if at + 1 >= self.len || at + 1 >= MAX_OPTS {
            w.bad = true;
            return false;
        }
        let len = self.bytes[at + 1] as usize;
        if len < 2 || at + len > self.len || at + len > MAX_OPTS {
            w.bad = true;
            return false;
        }
        w.at = at + len;
        let b = &mut self.bytes;
        match (kind, len) {
            (OPT_MSS, 4) if at + 3 < MAX_OPTS => {
                w.syn.mss = u16::from_be_bytes([b[at + 2], b[at + 3]])
            }
            (OPT_WSCALE, 3) if at + 2 < MAX_OPTS => w.syn.wscale = b[at + 2].min(14),
            (OPT_SACK_PERM, 2) => w.syn.sack = true,
            (OPT_TS, 10) => {
                w.syn.ts = Some((be32(b, at + 2), be32(b, at + 6)));
                match w.mode {
                    WalkMode::ToBackend => {
                        put32(b, at + 2, be32(b, at + 2).wrapping_add(w.cts_off));
                        put32(b, at + 6, be32(b, at + 6).wrapping_sub(w.ts_off));
                    }
                    WalkMode::ToClient => {
                        put32(b, at + 2, be32(b, at + 2).wrapping_add(w.ts_off));
                        put32(b, at + 6, be32(b, at + 6).wrapping_sub(w.cts_off));
                    }
                    WalkMode::Read => {}
                }
            }
            (OPT_SACK, _)
                if w.mode == WalkMode::ToBackend && len >= 10 && (len - 2).is_multiple_of(8) =>
            {
                // Four blocks at most fit.
                for i in 0..8 {
                    let e = at + 2 + 4 * i;
                    if e + 4 > at + len {
                        break;
                    }
                    put32(b, e, be32(b, e).wrapping_add(w.seq_off));
                }
            }
            _ => {}
        }
        true
    }

    /// These options made lb's SYN+ACK to a client that offered `syn`: lb's MSS `mss`; with
    /// timestamps, SACK-permitted and window scale as offered (`tsval` is lb's, encoding them),
    /// without, nothing more (the cookie cannot remember them).
    #[inline(always)]
    pub fn set_synack(&mut self, mss: u16, syn: &SynOpts, tsval: u32) {
        self.len = 0;
        self.push_mss(mss);
        if let Some((client_ts, _)) = syn.ts {
            self.push_ts(syn.sack, tsval, client_ts);
            if syn.wscale != NO_WSCALE {
                self.push_wscale(PROXY_WSCALE);
            }
        }
    }

    /// These options made the SYN lb sends the backend for a client: its MSS, and with
    /// timestamps (`tsval` the client's) its SACK-permitted and window scale.
    #[inline(always)]
    pub fn set_backend_syn(&mut self, mss: u16, ts: Option<u32>, sack: bool, wscale: u8) {
        self.len = 0;
        self.push_mss(mss);
        if let Some(tsval) = ts {
            self.push_ts(sack, tsval, 0);
            if wscale != NO_WSCALE {
                self.push_wscale(wscale);
            }
        }
    }

    /// These options a timestamp alone (NOP, NOP, TS), or none.
    #[inline(always)]
    pub fn set_timestamp(&mut self, ts: Option<(u32, u32)>) {
        self.len = 0;
        if let Some((tsval, tsecr)) = ts {
            self.push_ts(false, tsval, tsecr);
        }
    }

    #[inline(always)]
    fn push(&mut self, b: u8) {
        if self.len < MAX_OPTS {
            self.bytes[self.len] = b;
            self.len += 1;
        }
    }

    #[inline(always)]
    fn push_mss(&mut self, mss: u16) {
        let m = mss.to_be_bytes();
        for b in [OPT_MSS, 4, m[0], m[1]] {
            self.push(b);
        }
    }

    /// SACK-permitted (or two NOPs) and a timestamp: 12 bytes.
    #[inline(always)]
    fn push_ts(&mut self, sack: bool, tsval: u32, tsecr: u32) {
        if sack {
            self.push(OPT_SACK_PERM);
            self.push(2);
        } else {
            self.push(OPT_NOP);
            self.push(OPT_NOP);
        }
        self.push(OPT_TS);
        self.push(10);
        for b in tsval.to_be_bytes().into_iter().chain(tsecr.to_be_bytes()) {
            self.push(b);
        }
    }

    #[inline(always)]
    fn push_wscale(&mut self, ws: u8) {
        for b in [OPT_NOP, OPT_WSCALE, 3, ws] {
            self.push(b);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: CookieKey = CookieKey {
        k0: 0x0706_0504_0302_0100,
        k1: 0x0f0e_0d0c_0b0a_0908,
    };

    #[test]
    fn siphash_matches_the_reference_vectors() {
        // SipHash-2-4 of the messages 00..07 and 00..0f under the key 00..0f, as the reference
        // implementation's vectors and Rust's own (deprecated) `SipHasher` give them.
        assert_eq!(
            siphash(&KEY, &[u64::from_le_bytes([0, 1, 2, 3, 4, 5, 6, 7])]).to_le_bytes(),
            [0x62, 0x24, 0x93, 0x9a, 0x79, 0xf5, 0xf5, 0x93]
        );
        assert_eq!(
            siphash(
                &KEY,
                &[
                    u64::from_le_bytes([0, 1, 2, 3, 4, 5, 6, 7]),
                    u64::from_le_bytes([8, 9, 10, 11, 12, 13, 14, 15])
                ]
            )
            .to_le_bytes(),
            [0xdb, 0x9b, 0xc2, 0x57, 0x7f, 0xcc, 0x2a, 0x3f]
        );
    }

    fn words() -> [u64; 5] {
        cookie_words([0x0a00_0001, 0, 0, 0], [0x0a00_0002, 0, 0, 0], 40000, 80)
    }

    #[test]
    fn a_cookie_validates_for_its_flow_and_age_only() {
        let tick = 1000;
        let c = make_cookie(&KEY, &words(), 12345, tick, mss_index(1460));
        for later in 0..=COOKIE_MAX_AGE {
            assert_eq!(
                check_cookie(&KEY, &words(), 12345, c, tick + later),
                Some(3)
            );
        }
        assert_eq!(
            check_cookie(&KEY, &words(), 12345, c, tick + 3),
            None,
            "too old"
        );
        assert_eq!(
            check_cookie(&KEY, &words(), 12345, c, tick - 1),
            None,
            "from the future"
        );
        assert_eq!(
            check_cookie(&KEY, &words(), 12346, c, tick),
            None,
            "another SYN"
        );
        let other = cookie_words([0x0a00_0001, 0, 0, 0], [0x0a00_0002, 0, 0, 0], 40001, 80);
        assert_eq!(
            check_cookie(&KEY, &other, 12345, c, tick),
            None,
            "another port"
        );
        let key2 = CookieKey { k0: 1, k1: 2 };
        assert_eq!(
            check_cookie(&key2, &words(), 12345, c, tick),
            None,
            "another key"
        );
        // The MSS index is covered by the MAC: changing it breaks the cookie.
        assert_eq!(
            check_cookie(&KEY, &words(), 12345, c ^ (1 << 25), tick),
            None
        );
        // Across the 5-bit counter's wrap.
        let c = make_cookie(&KEY, &words(), 1, 31, 0);
        assert_eq!(check_cookie(&KEY, &words(), 1, c, 33), Some(0));
    }

    #[test]
    fn cookies_of_ipv6_flows_use_every_address_word() {
        let a = cookie_words([1, 2, 3, 4], [5, 6, 7, 8], 1, 2);
        for i in 0..4 {
            let mut src = [1, 2, 3, 4];
            src[i] ^= 1;
            let mut dst = [5, 6, 7, 8];
            dst[i] ^= 1;
            assert_ne!(cookie_words(src, [5, 6, 7, 8], 1, 2), a);
            assert_ne!(cookie_words([1, 2, 3, 4], dst, 1, 2), a);
        }
    }

    #[test]
    fn mss_rounds_down_to_the_table() {
        assert_eq!(mss_index(100), 0);
        assert_eq!(mss_index(1219), 0);
        assert_eq!(mss_index(1220), 1);
        assert_eq!(mss_index(1460), 3);
        assert_eq!(mss_index(9000), 3);
    }

    #[test]
    fn the_timestamp_carries_window_scale_and_sack() {
        let ts = ts_encode(0x1234_5678, 9, true);
        assert_eq!(ts & !0x3f, 0x1234_5640);
        assert_eq!(ts_decode(ts), (9, true));
        assert_eq!(
            ts_decode(ts_encode(7, NO_WSCALE, false)),
            (NO_WSCALE, false)
        );
    }

    #[test]
    fn windows_are_rescaled_and_clamped() {
        assert_eq!(rescale(1000, 0), 1000);
        assert_eq!(rescale(1000, 2), 4000);
        assert_eq!(rescale(1000, -2), 250);
        assert_eq!(rescale(0x8000, 1), 0xffff);
    }

    fn opts(b: &[u8]) -> TcpOpts {
        let mut o = TcpOpts::EMPTY;
        o.bytes[..b.len()].copy_from_slice(b);
        o.len = b.len();
        o
    }

    // Linux's SYN: MSS 1460, SACK-permitted, timestamps, NOP, window scale 7.
    const LINUX_SYN: [u8; 20] = [
        2, 4, 5, 180, 4, 2, 8, 10, 0, 0, 0, 7, 0, 0, 0, 0, 1, 3, 3, 7,
    ];

    #[test]
    fn syn_options_are_read() {
        assert_eq!(
            opts(&LINUX_SYN).syn(),
            Some(SynOpts {
                mss: 1460,
                wscale: 7,
                sack: true,
                ts: Some((7, 0)),
            })
        );
        assert_eq!(
            opts(&[2, 4, 5, 180]).syn(),
            Some(SynOpts {
                mss: 1460,
                wscale: NO_WSCALE,
                sack: false,
                ts: None
            })
        );
        assert_eq!(opts(&[2, 4, 5]).syn(), None, "cut short");
        assert_eq!(opts(&[2, 1, 5, 180]).syn(), None, "length below 2");
        assert_eq!(opts(&[2, 40, 5, 180]).syn(), None, "length past the end");
        assert_eq!(
            opts(&[1, 1, 0, 9, 9]).syn().map(|o| o.mss),
            Some(0),
            "EOL ends"
        );
        assert_eq!(
            opts(&[3, 3, 30]).syn().map(|o| o.wscale),
            Some(14),
            "clamped"
        );
    }

    #[test]
    fn lbs_synack_and_backend_syn_carry_what_was_offered() {
        let syn = opts(&LINUX_SYN).syn().unwrap();
        let mut o = TcpOpts::EMPTY;
        o.set_synack(1460, &syn, 0xaabb_cc00);
        assert_eq!(
            &o.bytes[..o.len],
            &[
                2,
                4,
                5,
                180,
                4,
                2,
                8,
                10,
                0xaa,
                0xbb,
                0xcc,
                0,
                0,
                0,
                0,
                7,
                1,
                3,
                3,
                PROXY_WSCALE
            ]
        );
        // Without timestamps the cookie carries the MSS only.
        let bare = SynOpts { ts: None, ..syn };
        o.set_synack(1460, &bare, 1);
        assert_eq!(&o.bytes[..o.len], &[2, 4, 5, 180]);
        o.set_backend_syn(1440, Some(99), false, NO_WSCALE);
        assert_eq!(
            &o.bytes[..o.len],
            &[2, 4, 5, 160, 1, 1, 8, 10, 0, 0, 0, 99, 0, 0, 0, 0]
        );
        o.set_timestamp(Some((1, 2)));
        assert_eq!(&o.bytes[..o.len], &[1, 1, 8, 10, 0, 0, 0, 1, 0, 0, 0, 2]);
        o.set_timestamp(None);
        assert_eq!(o.len, 0);
    }

    #[test]
    fn segments_are_translated_both_ways() {
        // NOP NOP TS(val 5, ecr 1000), NOP NOP SACK [100, 200) [300, 400).
        let mut o = opts(&[
            1, 1, 8, 10, 0, 0, 0, 5, 0, 0, 3, 232, 1, 1, 5, 18, 0, 0, 0, 100, 0, 0, 0, 200, 0, 0,
            1, 44, 0, 0, 1, 144,
        ]);
        assert!(o.translate(true, 10, 1, 0));
        assert_eq!(o.timestamps(), Some(Some((5, 999))));
        assert_eq!(be32(&o.bytes, 16), 110);
        assert_eq!(be32(&o.bytes, 20), 210);
        assert_eq!(be32(&o.bytes, 24), 310);
        assert_eq!(be32(&o.bytes, 28), 410);
        assert!(o.translate(false, 7, u32::MAX, 0));
        assert_eq!(o.timestamps(), Some(Some((4, 999))));
        // The client's own clock moved past a TIME_WAIT's (cts_off): its TSval towards the
        // backend, the backend's TSecr back.
        assert!(o.translate(true, 0, 0, 3));
        assert_eq!(o.timestamps(), Some(Some((7, 999))));
        assert!(o.translate(false, 0, 0, 3));
        assert_eq!(o.timestamps(), Some(Some((7, 996))));
        let mut bad = opts(&[8, 10, 0, 0]);
        assert!(!bad.translate(true, 1, 1, 0));
    }
}
