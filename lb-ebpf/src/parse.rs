//! Ethernet → (one 802.1Q tag) → IPv4 (IHL honoured) → TCP/UDP ports. Classifies every frame;
//! never fails. Multi-byte fields are kept in network byte order, as the maps store them.
#![cfg_attr(not(target_arch = "bpf"), allow(dead_code))]

use lb_common::{PROTO_ICMP, PROTO_TCP, PROTO_UDP, counter};
use network_types::{eth::EthHdr, ip::Ipv4Hdr, tcp::TcpHdr, udp::UdpHdr, vlan::VlanHdr};

use crate::{ptr::read_at, stats};

const ETH_P_IP: u16 = 0x0800;
const ETH_P_8021Q: u16 = 0x8100;
/// More-fragments flag and fragment offset bits of the IPv4 `frags` field.
const IP_MF_OFFSET_MASK: u16 = 0x3fff;

pub const TCP_FIN: u8 = 0x01;
pub const TCP_SYN: u8 = 0x02;
pub const TCP_RST: u8 = 0x04;
pub const TCP_ACK: u8 = 0x10;

/// A TCP or UDP packet's addressing (network byte order) and where its headers are.
pub struct Flow {
    pub saddr: u32,
    pub daddr: u32,
    pub sport: u16,
    pub dport: u16,
    pub proto: u8,
    /// TCP flags (FIN, SYN, RST, ACK bits); 0 for UDP.
    pub tcp_flags: u8,
    pub ttl: u8,
    pub l3_off: usize,
    pub l4_off: usize,
    /// Bytes after the TCP/UDP header (its options included for TCP).
    pub payload_len: u16,
}

/// An ICMP message (not a fragment): its IPv4 header's addressing and where its parts are.
pub struct Icmp {
    pub saddr: u32,
    pub daddr: u32,
    pub ttl: u8,
    pub l3_off: usize,
    /// The ICMP header, unchecked.
    pub l4_off: usize,
    /// End of the IP datagram (Ethernet padding may follow).
    pub end: usize,
}

pub enum Parsed {
    /// Not IPv4 (ARP, IPv6, stacked VLAN tags, ...).
    NotIpv4,
    /// Truncated or inconsistent headers; `daddr` when the IPv4 header could be read.
    Malformed {
        daddr: Option<u32>,
    },
    /// An IPv4 fragment (first or later).
    Fragment {
        daddr: u32,
    },
    /// ICMP (not a fragment).
    Icmp(Icmp),
    /// IPv4 that is neither TCP, UDP nor ICMP.
    OtherL4 {
        daddr: u32,
    },
    Flow(Flow),
}

#[inline(always)]
pub fn parse(data: usize, data_end: usize) -> Parsed {
    let Some(eth) = read_at::<EthHdr>(data, data_end, 0) else {
        return Parsed::Malformed { daddr: None };
    };
    let mut ether_type = u16::from_be(eth.ether_type);
    let mut l3_off = EthHdr::LEN;
    if ether_type == ETH_P_8021Q {
        let Some(vlan) = read_at::<VlanHdr>(data, data_end, l3_off) else {
            return Parsed::Malformed { daddr: None };
        };
        stats::count(counter::VLAN);
        ether_type = u16::from_be(vlan.ether_type);
        l3_off += VlanHdr::LEN;
    }
    if ether_type != ETH_P_IP {
        return Parsed::NotIpv4;
    }

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
        return Parsed::Fragment { daddr };
    }

    let l4_off = l3_off + ihl;
    let l4_len = tot_len - ihl;
    let (sport, dport, tcp_flags, payload_len) = match ip.proto {
        PROTO_TCP => {
            let Some(tcp) = read_at::<TcpHdr>(data, data_end, l4_off) else {
                return malformed;
            };
            let doff = (tcp.doff() as usize) * 4;
            if doff < TcpHdr::LEN || doff > l4_len {
                return malformed;
            }
            // Byte 13 of the header holds the flags (CWR ECE URG ACK PSH RST SYN FIN).
            // SAFETY: TcpHdr is 20 bytes of plain data.
            let raw: [u8; TcpHdr::LEN] = unsafe { core::mem::transmute(tcp) };
            let flags = raw[13] & (TCP_FIN | TCP_SYN | TCP_RST | TCP_ACK);
            (
                u16::from_ne_bytes(tcp.source),
                u16::from_ne_bytes(tcp.dest),
                flags,
                (l4_len - doff) as u16,
            )
        }
        PROTO_UDP => {
            let Some(udp) = read_at::<UdpHdr>(data, data_end, l4_off) else {
                return malformed;
            };
            let len = u16::from_be_bytes(udp.len) as usize;
            if len < UdpHdr::LEN || len > l4_len {
                return malformed;
            }
            (
                u16::from_ne_bytes(udp.src),
                u16::from_ne_bytes(udp.dst),
                0,
                (len - UdpHdr::LEN) as u16,
            )
        }
        PROTO_ICMP => {
            return Parsed::Icmp(Icmp {
                saddr: u32::from_ne_bytes(ip.src_addr),
                daddr,
                ttl: ip.ttl,
                l3_off,
                l4_off,
                end: l3_off + tot_len,
            });
        }
        _ => return Parsed::OtherL4 { daddr },
    };
    Parsed::Flow(Flow {
        saddr: u32::from_ne_bytes(ip.src_addr),
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
