//! Ethernet → (one 802.1Q tag) → IPv4 (IHL honoured) or IPv6 (extension headers skipped, up to
//! [`MAX_EXT_HEADERS`]) → TCP/UDP ports. Classifies every frame; never fails. Multi-byte fields
//! are kept in network byte order, as the maps store them.
#![cfg_attr(not(target_arch = "bpf"), allow(dead_code))]

use lb_common::{Addr6, PROTO_ICMP, PROTO_TCP, PROTO_UDP, counter};
use network_types::{
    eth::EthHdr,
    ip::{Ipv4Hdr, Ipv6Hdr},
    tcp::TcpHdr,
    udp::UdpHdr,
    vlan::VlanHdr,
};

use crate::{
    maps::PARSE_SCRATCH,
    ptr::{load_addr6, ptr_at, read_at},
    stats,
};

pub const ETH_P_IP: u16 = 0x0800;
pub const ETH_P_IPV6: u16 = 0x86dd;
const ETH_P_8021Q: u16 = 0x8100;
/// More-fragments flag and fragment offset bits of the IPv4 `frags` field.
const IP_MF_OFFSET_MASK: u16 = 0x3fff;
pub const PROTO_ICMPV6: u8 = 58;
/// IPv6 extension headers lb skips to reach the transport header: hop-by-hop options, routing,
/// destination options (all "next header, length in 8-byte units - 1" first).
const EXT_HOP_BY_HOP: u8 = 0;
const EXT_ROUTING: u8 = 43;
const EXT_FRAGMENT: u8 = 44;
const EXT_DEST_OPTS: u8 = 60;
/// Extension headers read before the transport header at most; a packet with more gets a
/// counted verdict (`pass_ext_headers` / `drop_ext_headers`). Real traffic has zero or one.
pub const MAX_EXT_HEADERS: usize = 4;
/// Where the transport header of an IPv6 packet can be at most: past a VLAN tag, the IPv6
/// header and 4 extension headers of the largest size (2048 bytes each).
pub const MAX_L4_OFF: usize = 18 + 40 + MAX_EXT_HEADERS * 2048;

/// `value` written to this CPU's slot of a map and read back: the same number, of which the
/// verifier knows nothing (it does not track map contents), so ways through the code that
/// computed it differently meet again as one.
#[inline(always)]
fn forget(value: usize) -> Option<usize> {
    let slot = PARSE_SCRATCH.get_ptr_mut(0)?;
    // SAFETY: this CPU's slot of a per-CPU array of one u64, used by this packet only.
    unsafe {
        core::ptr::write_volatile(slot, value as u64);
        Some(core::ptr::read_volatile(slot) as usize)
    }
}

pub const TCP_FIN: u8 = 0x01;
pub const TCP_SYN: u8 = 0x02;
pub const TCP_RST: u8 = 0x04;
pub const TCP_ACK: u8 = 0x10;

/// A TCP or UDP packet's addressing (network byte order) and where its headers are; `A` is the
/// family's address (`u32`, [`Addr6`]).
pub struct Flow<A> {
    pub saddr: A,
    pub daddr: A,
    pub sport: u16,
    pub dport: u16,
    pub proto: u8,
    /// TCP flags (FIN, SYN, RST, ACK bits); 0 for UDP.
    pub tcp_flags: u8,
    /// TTL or hop limit.
    pub ttl: u8,
    pub l3_off: usize,
    pub l4_off: usize,
    /// Bytes after the TCP/UDP header (its options included for TCP).
    pub payload_len: u16,
}

/// An ICMP or ICMPv6 message (not a fragment): its IP header's addressing and where its parts
/// are.
pub struct Icmp<A> {
    pub saddr: A,
    pub daddr: A,
    pub ttl: u8,
    pub l3_off: usize,
    /// The ICMP header, unchecked.
    pub l4_off: usize,
    /// End of the IP datagram (Ethernet padding may follow).
    pub end: usize,
}

pub enum Parsed<A> {
    /// Truncated or inconsistent headers; `daddr` when the IP header could be read.
    Malformed {
        daddr: Option<A>,
    },
    /// A packet lb cannot balance for a reason of its own, with the verdict counters for it:
    /// `pass` when not for an lb address, `drop` when it is (fragments; IPv6 with too many
    /// extension headers, or UDP without a checksum).
    Odd {
        daddr: A,
        pass: u32,
        drop: u32,
    },
    /// ICMP / ICMPv6 (not a fragment).
    Icmp(Icmp<A>),
    /// Neither TCP, UDP nor ICMP.
    OtherL4 {
        daddr: A,
    },
    Flow(Flow<A>),
}

/// The frame's EtherType past one optional 802.1Q tag, and where its IP header starts; `None`
/// for a frame too short for its link headers. `count`: count a tag ([`counter::VLAN`]); the
/// balancer does, the programs it hands a frame to read the link headers again and do not.
#[inline(always)]
pub fn link(data: usize, data_end: usize, count: bool) -> Option<(u16, usize)> {
    let eth = read_at::<EthHdr>(data, data_end, 0)?;
    let ether_type = u16::from_be(eth.ether_type);
    if ether_type != ETH_P_8021Q {
        return Some((ether_type, EthHdr::LEN));
    }
    let vlan = read_at::<VlanHdr>(data, data_end, EthHdr::LEN)?;
    if count {
        stats::count(counter::VLAN);
    }
    Some((u16::from_be(vlan.ether_type), EthHdr::LEN + VlanHdr::LEN))
}

/// The ports of a TCP or UDP header at `l4_off` with `l4_len` bytes to the datagram's end:
/// (sport, dport, TCP flags, payload length, UDP checksum). `None` if truncated or inconsistent.
#[inline(always)]
fn ports(
    data: usize,
    data_end: usize,
    proto: u8,
    l4_off: usize,
    l4_len: usize,
) -> Option<(u16, u16, u8, u16, u16)> {
    if proto == PROTO_TCP {
        let tcp = read_at::<TcpHdr>(data, data_end, l4_off)?;
        let doff = (tcp.doff() as usize) * 4;
        if doff < TcpHdr::LEN || doff > l4_len {
            return None;
        }
        // Byte 13 of the header holds the flags (CWR ECE URG ACK PSH RST SYN FIN).
        // SAFETY: TcpHdr is 20 bytes of plain data.
        let raw: [u8; TcpHdr::LEN] = unsafe { core::mem::transmute(tcp) };
        let flags = raw[13] & (TCP_FIN | TCP_SYN | TCP_RST | TCP_ACK);
        return Some((
            u16::from_ne_bytes(tcp.source),
            u16::from_ne_bytes(tcp.dest),
            flags,
            (l4_len - doff) as u16,
            0,
        ));
    }
    let udp = read_at::<UdpHdr>(data, data_end, l4_off)?;
    let len = u16::from_be_bytes(udp.len) as usize;
    if len < UdpHdr::LEN || len > l4_len {
        return None;
    }
    Some((
        u16::from_ne_bytes(udp.src),
        u16::from_ne_bytes(udp.dst),
        0,
        (len - UdpHdr::LEN) as u16,
        u16::from_ne_bytes(udp.check),
    ))
}

/// An IPv4 datagram whose header starts at `l3_off`.
#[inline(always)]
pub fn ipv4(data: usize, data_end: usize, l3_off: usize) -> Parsed<u32> {
    let Some(ip) = read_at::<Ipv4Hdr>(data, data_end, l3_off) else {
        return Parsed::Malformed { daddr: None };
    };
    let daddr = u32::from_ne_bytes(ip.dst_addr);
    let malformed = Parsed::Malformed { daddr: Some(daddr) };
    let ihl = ((ip.vihl & 0x0f) as usize) * 4;
    let tot_len = u16::from_be_bytes(ip.tot_len) as usize;
    // Ethernet padding may follow the datagram (tot_len shorter than the frame); the opposite
    // means the datagram was cut.
    if ip.vihl >> 4 != 4
        || ihl < Ipv4Hdr::LEN
        || tot_len < ihl
        || l3_off + tot_len > data_end - data
    {
        return malformed;
    }
    if ihl > Ipv4Hdr::LEN {
        stats::count(counter::IP_OPTIONS);
    }
    if u16::from_be_bytes(ip.frags) & IP_MF_OFFSET_MASK != 0 {
        return Parsed::Odd {
            daddr,
            pass: counter::PASS_FRAGMENT,
            drop: counter::DROP_FRAGMENT,
        };
    }
    let saddr = u32::from_ne_bytes(ip.src_addr);
    let l4_off = l3_off + ihl;
    match ip.proto {
        PROTO_TCP | PROTO_UDP => {}
        PROTO_ICMP => {
            return Parsed::Icmp(Icmp {
                saddr,
                daddr,
                ttl: ip.ttl,
                l3_off,
                l4_off,
                end: l3_off + tot_len,
            });
        }
        _ => return Parsed::OtherL4 { daddr },
    }
    let Some((sport, dport, tcp_flags, payload_len, _)) =
        ports(data, data_end, ip.proto, l4_off, tot_len - ihl)
    else {
        return malformed;
    };
    Parsed::Flow(Flow {
        saddr,
        daddr,
        sport,
        dport,
        proto: ip.proto,
        tcp_flags,
        ttl: ip.ttl,
        l3_off,
        l4_off,
        payload_len,
    })
}

/// An IPv6 packet whose header starts at `l3_off`.
#[inline(always)]
pub fn ipv6(data: usize, data_end: usize, l3_off: usize) -> Parsed<Addr6> {
    let Some(ip) = ptr_at::<Ipv6Hdr>(data, data_end, l3_off) else {
        return Parsed::Malformed { daddr: None };
    };
    // SAFETY: bounds-checked; read in place (a copy would be 40 bytes of stack).
    let ip = unsafe { &*ip };
    // SAFETY: the header is in bounds; its addresses are 2-aligned (see `load_addr6`).
    let daddr = unsafe { load_addr6(ip.dst_addr.as_ptr()) };
    let malformed = Parsed::Malformed { daddr: Some(daddr) };
    let payload = u16::from_be_bytes(ip.payload_len) as usize;
    // Padding may follow the packet; a payload longer than the frame means it was cut. A
    // payload length of 0 (a jumbogram's) has no place on these links either.
    if ip.vcf[0] >> 4 != 6 || payload == 0 || l3_off + Ipv6Hdr::LEN + payload > data_end - data {
        return malformed;
    }
    let end = l3_off + Ipv6Hdr::LEN + payload;
    let mut next = ip.next_hdr;
    let mut l4_off = l3_off + Ipv6Hdr::LEN;
    for _ in 0..MAX_EXT_HEADERS {
        match next {
            EXT_HOP_BY_HOP | EXT_ROUTING | EXT_DEST_OPTS => {
                let Some(ext) = read_at::<[u8; 2]>(data, data_end, l4_off) else {
                    return malformed;
                };
                next = ext[0];
                l4_off += (ext[1] as usize + 1) * 8;
            }
            EXT_FRAGMENT => {
                return Parsed::Odd {
                    daddr,
                    pass: counter::PASS_FRAGMENT,
                    drop: counter::DROP_FRAGMENT,
                };
            }
            _ => break,
        }
    }
    if matches!(
        next,
        EXT_HOP_BY_HOP | EXT_ROUTING | EXT_DEST_OPTS | EXT_FRAGMENT
    ) {
        return Parsed::Odd {
            daddr,
            pass: counter::PASS_EXT_HEADERS,
            drop: counter::DROP_EXT_HEADERS,
        };
    }
    // Each way through the loop leaves another offset, and the verifier would check everything
    // below once per way (4 extension headers: 540,000 instructions verified instead of 100,000).
    // Through a map the offset is one unknown value, bounded by the check that follows, for all.
    let Some(l4_off) = forget(l4_off) else {
        return malformed;
    };
    if l4_off > MAX_L4_OFF || l4_off > end {
        return malformed;
    }
    if l4_off != l3_off + Ipv6Hdr::LEN {
        stats::count(counter::IPV6_EXT_HEADERS);
    }
    // SAFETY: as for `daddr`.
    let saddr = unsafe { load_addr6(ip.src_addr.as_ptr()) };
    match next {
        PROTO_TCP | PROTO_UDP => {}
        PROTO_ICMPV6 => {
            return Parsed::Icmp(Icmp {
                saddr,
                daddr,
                ttl: ip.hop_limit,
                l3_off,
                l4_off,
                end,
            });
        }
        _ => return Parsed::OtherL4 { daddr },
    }
    let Some((sport, dport, tcp_flags, payload_len, udp_check)) =
        ports(data, data_end, next, l4_off, end - l4_off)
    else {
        return malformed;
    };
    if next == PROTO_UDP && udp_check == 0 {
        // RFC 8200 §8.1: an IPv6 receiver drops UDP without a checksum; lb does not forward it.
        return Parsed::Odd {
            daddr,
            pass: counter::PASS_MALFORMED,
            drop: counter::DROP_UDP_NO_CHECKSUM,
        };
    }
    Parsed::Flow(Flow {
        saddr,
        daddr,
        sport,
        dport,
        proto: next,
        tcp_flags,
        ttl: ip.hop_limit,
        l3_off,
        l4_off,
        payload_len,
    })
}
