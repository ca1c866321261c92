//! Builds Ethernet frames (optional 802.1Q tag) carrying IPv4 (optional options, fragment bits)
//! or IPv6 (optional extension headers, a fragment header) with TCP, UDP or ICMP / ICMPv6 (echo,
//! and errors quoting another packet), checksums correct unless told otherwise; and checks
//! checksums of frames. The family is the addresses': `"10.0.0.1:80"` or `"[2001:db8::1]:80"`.

use std::net::{IpAddr, SocketAddr};

pub const TCP_FIN: u8 = 0x01;
pub const TCP_SYN: u8 = 0x02;
pub const TCP_RST: u8 = 0x04;
pub const TCP_PSH: u8 = 0x08;
pub const TCP_ACK: u8 = 0x10;

pub const CLIENT_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x01];
pub const LB_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x02];

#[derive(Clone, Debug)]
enum L4 {
    Tcp {
        flags: u8,
        seq: u32,
        ack: u32,
    },
    Udp {
        zero_checksum: bool,
    },
    /// Type, code and the header's last 4 bytes (identifier and sequence, or the next-hop MTU).
    Icmp {
        ty: u8,
        code: u8,
        rest: [u8; 4],
    },
    Other {
        proto: u8,
    },
}

pub const ICMP_ECHO_REPLY: u8 = 0;
pub const ICMP_DEST_UNREACH: u8 = 3;
pub const ICMP_ECHO_REQUEST: u8 = 8;
pub const ICMP_TIME_EXCEEDED: u8 = 11;
/// Destination unreachable codes.
pub const ICMP_PORT_UNREACH: u8 = 3;
pub const ICMP_FRAG_NEEDED: u8 = 4;

pub const ICMP6_DEST_UNREACH: u8 = 1;
pub const ICMP6_PACKET_TOO_BIG: u8 = 2;
pub const ICMP6_TIME_EXCEEDED: u8 = 3;
pub const ICMP6_ECHO_REQUEST: u8 = 128;
pub const ICMP6_ECHO_REPLY: u8 = 129;
pub const ICMP6_NEIGHBOR_SOLICIT: u8 = 135;
/// ICMPv6 destination unreachable codes.
pub const ICMP6_PORT_UNREACH: u8 = 4;

/// IPv6 extension header types.
pub const EXT_HOP_BY_HOP: u8 = 0;
pub const EXT_ROUTING: u8 = 43;
pub const EXT_FRAGMENT: u8 = 44;
pub const EXT_DEST_OPTS: u8 = 60;

/// A frame under construction. `build()` produces the bytes.
#[derive(Clone, Debug)]
pub struct Packet {
    src_mac: [u8; 6],
    dst_mac: [u8; 6],
    vlan: Option<u16>,
    ether_type: u16,
    src: SocketAddr,
    dst: SocketAddr,
    ttl: u8,
    /// IPv4's TOS, IPv6's traffic class.
    tos: u8,
    /// IPv4's identification.
    ip_id: u16,
    ip_options: Vec<u8>,
    frag: u16,
    /// IPv6 extension headers before the transport header: (type, whole header bytes without
    /// its first byte, the next header, which `build` fills in).
    ext: Vec<(u8, Vec<u8>)>,
    l4: L4,
    /// TCP's options (padded to a multiple of 4 with zeros) and window.
    tcp_options: Vec<u8>,
    window: u16,
    payload: Vec<u8>,
}

fn addr(s: &str) -> SocketAddr {
    s.parse().unwrap_or_else(|_| panic!("bad address {s}"))
}

impl Packet {
    fn new(src: &str, dst: &str, l4: L4) -> Self {
        Self {
            src_mac: CLIENT_MAC,
            dst_mac: LB_MAC,
            vlan: None,
            ether_type: if addr(src).is_ipv6() { 0x86dd } else { 0x0800 },
            src: addr(src),
            dst: addr(dst),
            ttl: 64,
            tos: 0,
            ip_id: 0x1234,
            ip_options: Vec::new(),
            frag: 0,
            ext: Vec::new(),
            l4,
            tcp_options: Vec::new(),
            window: 64240,
            payload: Vec::new(),
        }
    }

    /// A TCP segment, flags [`TCP_SYN`] etc.
    pub fn tcp(src: &str, dst: &str, flags: u8) -> Self {
        Self::new(
            src,
            dst,
            L4::Tcp {
                flags,
                seq: 1000,
                ack: 0,
            },
        )
    }

    pub fn udp(src: &str, dst: &str) -> Self {
        Self::new(
            src,
            dst,
            L4::Udp {
                zero_checksum: false,
            },
        )
    }

    /// An ICMP echo request (or reply) with `id` and `seq`; ports in the addresses are ignored.
    pub fn icmp_echo(src: &str, dst: &str, reply: bool, id: u16, seq: u16) -> Self {
        let (id, seq) = (id.to_be_bytes(), seq.to_be_bytes());
        let v6 = addr(src).is_ipv6();
        let ty = match (reply, v6) {
            (true, false) => ICMP_ECHO_REPLY,
            (false, false) => ICMP_ECHO_REQUEST,
            (true, true) => ICMP6_ECHO_REPLY,
            (false, true) => ICMP6_ECHO_REQUEST,
        };
        Self::new(
            src,
            dst,
            L4::Icmp {
                ty,
                code: 0,
                rest: [id[0], id[1], seq[0], seq[1]],
            },
        )
    }

    /// An ICMP error (`ty`, `code`; `mtu` for "fragmentation needed") quoting `quoted`, an IP
    /// datagram (see [`Packet::datagram`]), cut to its first `quote_len` bytes.
    pub fn icmp_error(
        src: &str,
        dst: &str,
        ty: u8,
        code: u8,
        mtu: u16,
        quoted: &[u8],
        quote_len: usize,
    ) -> Self {
        let mtu = mtu.to_be_bytes();
        let mut p = Self::new(
            src,
            dst,
            L4::Icmp {
                ty,
                code,
                rest: [0, 0, mtu[0], mtu[1]],
            },
        );
        p.payload = quoted[..quote_len.min(quoted.len())].to_vec();
        p
    }

    /// An ICMP / ICMPv6 message of any type, its last 4 header bytes `rest`.
    pub fn icmp_other(src: &str, dst: &str, ty: u8, code: u8, rest: [u8; 4]) -> Self {
        Self::new(src, dst, L4::Icmp { ty, code, rest })
    }

    /// IPv4 with another protocol (e.g. 1 = ICMP); ports in the addresses are ignored.
    pub fn ip_proto(src: &str, dst: &str, proto: u8) -> Self {
        Self::new(src, dst, L4::Other { proto })
    }

    pub fn macs(mut self, src: [u8; 6], dst: [u8; 6]) -> Self {
        (self.src_mac, self.dst_mac) = (src, dst);
        self
    }

    pub fn vlan(mut self, vid: u16) -> Self {
        self.vlan = Some(vid);
        self
    }

    /// Overrides the (inner) EtherType, e.g. 0x86dd for IPv6 or 0x0806 for ARP.
    pub fn ether_type(mut self, ether_type: u16) -> Self {
        self.ether_type = ether_type;
        self
    }

    pub fn ttl(mut self, ttl: u8) -> Self {
        self.ttl = ttl;
        self
    }

    /// IPv4's TOS or IPv6's traffic class.
    pub fn tos(mut self, tos: u8) -> Self {
        self.tos = tos;
        self
    }

    /// IPv4's identification (0x1234 unless set).
    pub fn ip_id(mut self, id: u16) -> Self {
        self.ip_id = id;
        self
    }

    /// IPv4's "don't fragment" flag.
    pub fn dont_fragment(mut self) -> Self {
        self.frag |= 0x4000;
        self
    }

    /// IPv4 options, padded with End-of-Options to a multiple of 4 bytes.
    pub fn ip_options(mut self, options: &[u8]) -> Self {
        self.ip_options = options.to_vec();
        while !self.ip_options.len().is_multiple_of(4) {
            self.ip_options.push(0);
        }
        self
    }

    /// More-fragments flag and fragment offset (in 8-byte units). Over IPv6, a fragment
    /// extension header (after any added before).
    pub fn fragment(mut self, more: bool, offset: u16) -> Self {
        if self.src.is_ipv6() {
            let word = (offset << 3) | u16::from(more);
            let w = word.to_be_bytes();
            self.ext
                .push((EXT_FRAGMENT, vec![0, w[0], w[1], 0, 0, 0x12, 0x34]));
            return self;
        }
        self.frag = (u16::from(more) << 13) | (offset & 0x1fff);
        self
    }

    /// An IPv6 extension header of type `kind` (hop-by-hop, routing, destination options) of
    /// `8 * (units + 1)` bytes, its options padding (PadN), after any added before.
    pub fn ext_header(mut self, kind: u8, units: u8) -> Self {
        let len = 8 * (usize::from(units) + 1);
        let mut body = vec![0u8; len - 1];
        body[0] = units;
        if kind == EXT_ROUTING {
            // Type 0 routing header with 0 segments left: skipped by hosts, by lb too.
            body[1] = 0;
            body[2] = 0;
        } else {
            // PadN over the rest.
            body[1] = 1;
            body[2] = (len - 4) as u8;
        }
        self.ext.push((kind, body));
        self
    }

    pub fn payload(mut self, payload: &[u8]) -> Self {
        self.payload = payload.to_vec();
        self
    }

    /// TCP options (padded with zeros to a multiple of 4 bytes).
    pub fn tcp_options(mut self, options: &[u8]) -> Self {
        self.tcp_options = options.to_vec();
        while !self.tcp_options.len().is_multiple_of(4) {
            self.tcp_options.push(0);
        }
        self
    }

    /// The TCP window field.
    pub fn window(mut self, window: u16) -> Self {
        self.window = window;
        self
    }

    pub fn seq(mut self, seq: u32, ack: u32) -> Self {
        if let L4::Tcp { flags, .. } = self.l4 {
            self.l4 = L4::Tcp { flags, seq, ack };
        }
        self
    }

    /// UDP with checksum 0 ("no checksum": allowed over IPv4, invalid over IPv6).
    pub fn udp_zero_checksum(mut self) -> Self {
        self.l4 = L4::Udp {
            zero_checksum: true,
        };
        self
    }

    /// The IP datagram of the frame (what an ICMP error quotes).
    pub fn datagram(&self) -> Vec<u8> {
        self.build()[self.l3_offset()..].to_vec()
    }

    /// Offset of the IP header in the frame.
    pub fn l3_offset(&self) -> usize {
        14 + if self.vlan.is_some() { 4 } else { 0 }
    }

    pub fn build(&self) -> Vec<u8> {
        let v6 = self.src.is_ipv6();
        let mut l4 = match self.l4 {
            L4::Tcp { flags, seq, ack } => {
                let mut h = vec![0u8; 20];
                h[0..2].copy_from_slice(&self.src.port().to_be_bytes());
                h[2..4].copy_from_slice(&self.dst.port().to_be_bytes());
                h[4..8].copy_from_slice(&seq.to_be_bytes());
                h[8..12].copy_from_slice(&ack.to_be_bytes());
                h[12] = (((20 + self.tcp_options.len()) / 4) << 4) as u8;
                h[13] = flags;
                h[14..16].copy_from_slice(&self.window.to_be_bytes());
                h.extend_from_slice(&self.tcp_options);
                h
            }
            L4::Udp { .. } => {
                let mut h = vec![0u8; 8];
                h[0..2].copy_from_slice(&self.src.port().to_be_bytes());
                h[2..4].copy_from_slice(&self.dst.port().to_be_bytes());
                h[4..6].copy_from_slice(&((8 + self.payload.len()) as u16).to_be_bytes());
                h
            }
            L4::Icmp { ty, code, rest } => vec![ty, code, 0, 0, rest[0], rest[1], rest[2], rest[3]],
            L4::Other { .. } => Vec::new(),
        };
        l4.extend_from_slice(&self.payload);
        let proto = match self.l4 {
            L4::Tcp { .. } => 6,
            L4::Udp { .. } => 17,
            L4::Icmp { .. } if v6 => 58,
            L4::Icmp { .. } => 1,
            L4::Other { proto } => proto,
        };
        let (src, dst) = (self.src.ip(), self.dst.ip());
        match self.l4 {
            // ICMPv4's checksum covers the message only; ICMPv6's a pseudo-header too.
            L4::Icmp { .. } if !v6 => {
                let c = checksum(&l4);
                l4[2..4].copy_from_slice(&c.to_be_bytes());
            }
            L4::Icmp { .. } => {
                let c = l4_checksum(src, dst, proto, &l4);
                l4[2..4].copy_from_slice(&c.to_be_bytes());
            }
            L4::Tcp { .. } => {
                let c = l4_checksum(src, dst, proto, &l4);
                l4[16..18].copy_from_slice(&c.to_be_bytes());
            }
            L4::Udp {
                zero_checksum: false,
            } => {
                let c = match l4_checksum(src, dst, proto, &l4) {
                    0 => 0xffff, // 0 means "none" in UDP; a computed 0 is sent as all ones
                    c => c,
                };
                l4[6..8].copy_from_slice(&c.to_be_bytes());
            }
            _ => {}
        }

        let ip = match (src, dst) {
            (IpAddr::V4(src), IpAddr::V4(dst)) => {
                let ihl = 20 + self.ip_options.len();
                let mut ip = vec![0u8; 20];
                ip[0] = 0x40 | (ihl / 4) as u8;
                ip[1] = self.tos;
                ip[2..4].copy_from_slice(&((ihl + l4.len()) as u16).to_be_bytes());
                ip[4..6].copy_from_slice(&self.ip_id.to_be_bytes());
                ip[6..8].copy_from_slice(&self.frag.to_be_bytes());
                ip[8] = self.ttl;
                ip[9] = proto;
                ip[12..16].copy_from_slice(&src.octets());
                ip[16..20].copy_from_slice(&dst.octets());
                ip.extend_from_slice(&self.ip_options);
                let c = checksum(&ip);
                ip[10..12].copy_from_slice(&c.to_be_bytes());
                ip
            }
            (IpAddr::V6(src), IpAddr::V6(dst)) => {
                // The extension headers, each naming the next.
                let mut ext = Vec::new();
                for (i, (_, body)) in self.ext.iter().enumerate() {
                    let next = self.ext.get(i + 1).map_or(proto, |e| e.0);
                    ext.push(next);
                    ext.extend_from_slice(body);
                }
                let first = self.ext.first().map_or(proto, |e| e.0);
                let mut ip = vec![0u8; 40];
                ip[0] = 0x60 | (self.tos >> 4);
                ip[1] = self.tos << 4;
                ip[4..6].copy_from_slice(&((ext.len() + l4.len()) as u16).to_be_bytes());
                ip[6] = first;
                ip[7] = self.ttl;
                ip[8..24].copy_from_slice(&src.octets());
                ip[24..40].copy_from_slice(&dst.octets());
                ip.extend_from_slice(&ext);
                ip
            }
            _ => panic!("source and destination of different families"),
        };

        let mut frame = Vec::with_capacity(18 + ip.len() + l4.len());
        frame.extend_from_slice(&self.dst_mac);
        frame.extend_from_slice(&self.src_mac);
        if let Some(vid) = self.vlan {
            frame.extend_from_slice(&0x8100u16.to_be_bytes());
            frame.extend_from_slice(&(vid & 0x0fff).to_be_bytes());
        }
        frame.extend_from_slice(&self.ether_type.to_be_bytes());
        frame.extend_from_slice(&ip);
        frame.extend_from_slice(&l4);
        frame
    }
}

/// How [`encapsulate`] wraps a frame (direct server return; see `lb_common::encap` for the
/// fields of the outer header).
#[derive(Clone, Debug)]
pub struct Encap {
    /// `None`: IP in IP; `Some(port)`: GUE to that UDP port.
    pub gue_port: Option<u16>,
    /// Outer source and destination (the family of the inner packet).
    pub src: IpAddr,
    pub dst: IpAddr,
    /// The flow's hash (`FlowKey::hash` of the client's direction): GUE's source port and the
    /// IPv6 flow label come from it.
    pub hash: u64,
    pub smac: [u8; 6],
    pub dmac: [u8; 6],
}

/// `frame` (Ethernet, an optional VLAN tag, IPv4 or IPv6) with an outer IP header (and a UDP
/// header for GUE) inserted after its link headers, and its MACs replaced, as lb's datapath
/// encapsulates a packet for direct server return. The inner datagram is unchanged.
pub fn encapsulate(frame: &[u8], e: &Encap) -> Vec<u8> {
    let l3 = l3_of(frame);
    let inner = &frame[l3..];
    let inner_len = match inner[0] >> 4 {
        4 => usize::from(u16::from_be_bytes([inner[2], inner[3]])),
        _ => 40 + usize::from(u16::from_be_bytes([inner[4], inner[5]])),
    };
    let inner = &inner[..inner_len];
    let mut body = Vec::new();
    let proto = match (e.gue_port, e.src) {
        (Some(port), _) => {
            let mut udp = vec![0u8; 8];
            udp[0..2].copy_from_slice(&lb_common::gue_source_port(e.hash).to_be_bytes());
            udp[2..4].copy_from_slice(&port.to_be_bytes());
            udp[4..6].copy_from_slice(&((8 + inner.len()) as u16).to_be_bytes());
            udp.extend_from_slice(inner);
            if e.src.is_ipv6() {
                let c = match l4_checksum(e.src, e.dst, 17, &udp) {
                    0 => 0xffff,
                    c => c,
                };
                udp[6..8].copy_from_slice(&c.to_be_bytes());
            }
            body = udp;
            17
        }
        (None, IpAddr::V4(_)) => lb_common::PROTO_IPIP,
        (None, IpAddr::V6(_)) => lb_common::PROTO_IPV6_IN_IP,
    };
    if body.is_empty() {
        body.extend_from_slice(inner);
    }
    let outer = match (e.src, e.dst) {
        (IpAddr::V4(src), IpAddr::V4(dst)) => {
            let mut ip = vec![0u8; 20];
            ip[0] = 0x45;
            ip[1] = inner[1];
            ip[2..4].copy_from_slice(&((20 + body.len()) as u16).to_be_bytes());
            ip[6] = 0x40; // DF
            ip[8] = lb_common::ENCAP_TTL;
            ip[9] = proto;
            ip[12..16].copy_from_slice(&src.octets());
            ip[16..20].copy_from_slice(&dst.octets());
            let c = checksum(&ip);
            ip[10..12].copy_from_slice(&c.to_be_bytes());
            ip
        }
        (IpAddr::V6(src), IpAddr::V6(dst)) => {
            let mut ip = vec![0u8; 40];
            let label = lb_common::encap_flow_label(e.hash);
            // Version 6, the inner traffic class, the flow label.
            ip[0] = 0x60 | (inner[0] & 0x0f);
            ip[1] = (inner[1] & 0xf0) | (label >> 16) as u8;
            ip[2..4].copy_from_slice(&(label as u16).to_be_bytes());
            ip[4..6].copy_from_slice(&(body.len() as u16).to_be_bytes());
            ip[6] = proto;
            ip[7] = lb_common::ENCAP_TTL;
            ip[8..24].copy_from_slice(&src.octets());
            ip[24..40].copy_from_slice(&dst.octets());
            ip
        }
        _ => panic!("outer source and destination of different families"),
    };
    let mut out = frame[..l3].to_vec();
    out[0..6].copy_from_slice(&e.dmac);
    out[6..12].copy_from_slice(&e.smac);
    out.extend_from_slice(&outer);
    out.extend_from_slice(&body);
    out
}

/// The frame inside an encapsulated `frame` ([`encapsulate`]'s inverse): the link headers
/// followed by the inner datagram; `None` if `frame` is not IP in IP or GUE to `gue_port`.
pub fn decapsulate(frame: &[u8], gue_port: u16) -> Option<Vec<u8>> {
    let l3 = l3_of(frame);
    let ip = frame.get(l3..)?;
    let (proto, hdr) = match ip.first()? >> 4 {
        4 => (*ip.get(9)?, usize::from(ip[0] & 0x0f) * 4),
        6 => (*ip.get(6)?, 40),
        _ => return None,
    };
    let inner_at = match proto {
        4 | 41 => l3 + hdr,
        17 if u16::from_be_bytes([*ip.get(hdr + 2)?, *ip.get(hdr + 3)?]) == gue_port => {
            l3 + hdr + 8
        }
        _ => return None,
    };
    let inner = frame.get(inner_at..)?;
    let mut out = frame[..l3].to_vec();
    let ether_type: u16 = if inner.first()? >> 4 == 6 {
        0x86dd
    } else {
        0x0800
    };
    out[l3 - 2..l3].copy_from_slice(&ether_type.to_be_bytes());
    out.extend_from_slice(inner);
    Some(out)
}

/// Internet checksum (RFC 1071) of `data`.
pub fn checksum(data: &[u8]) -> u16 {
    !fold(sum(0, data))
}

fn sum(mut acc: u32, data: &[u8]) -> u32 {
    for chunk in data.chunks(2) {
        let word = u16::from_be_bytes([chunk[0], *chunk.get(1).unwrap_or(&0)]);
        acc += u32::from(word);
    }
    acc
}

fn fold(mut acc: u32) -> u16 {
    while acc > 0xffff {
        acc = (acc & 0xffff) + (acc >> 16);
    }
    acc as u16
}

/// TCP/UDP (or ICMPv6) checksum over the pseudo-header and `segment` (whose checksum field
/// must be 0): IPv4's (RFC 793) or IPv6's (RFC 8200 §8.1), by the addresses' family.
pub fn l4_checksum(src: IpAddr, dst: IpAddr, proto: u8, segment: &[u8]) -> u16 {
    !fold(sum(
        sum(0, &pseudo_header(src, dst, proto, segment.len())),
        segment,
    ))
}

fn pseudo_header(src: IpAddr, dst: IpAddr, proto: u8, len: usize) -> Vec<u8> {
    let mut pseudo = Vec::with_capacity(40);
    match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            pseudo.extend_from_slice(&s.octets());
            pseudo.extend_from_slice(&d.octets());
            pseudo.extend_from_slice(&[0, proto]);
            pseudo.extend_from_slice(&(len as u16).to_be_bytes());
        }
        (IpAddr::V6(s), IpAddr::V6(d)) => {
            pseudo.extend_from_slice(&s.octets());
            pseudo.extend_from_slice(&d.octets());
            pseudo.extend_from_slice(&(len as u32).to_be_bytes());
            pseudo.extend_from_slice(&[0, 0, 0, proto]);
        }
        _ => panic!("source and destination of different families"),
    }
    pseudo
}

/// An IP datagram as the checkers see it.
struct Datagram<'a> {
    src: IpAddr,
    dst: IpAddr,
    /// The transport protocol (past IPv6 extension headers).
    proto: u8,
    /// The IPv4 header, for its checksum (None for IPv6, which has none).
    header: Option<&'a [u8]>,
    /// The transport segment, whole; None for a fragment or a cut datagram.
    segment: Option<&'a [u8]>,
}

/// Reads the datagram at the start of `ip` (IPv4 or IPv6 by its version nibble).
fn datagram(ip: &[u8]) -> Option<Datagram<'_>> {
    let version = ip.first()? >> 4;
    if version == 4 {
        let ihl = usize::from(ip[0] & 0x0f) * 4;
        if ihl < 20 || ip.len() < ihl {
            return None;
        }
        let tot = usize::from(u16::from_be_bytes([ip[2], ip[3]]));
        let whole =
            tot >= ihl && ip.len() >= tot && u16::from_be_bytes([ip[6], ip[7]]) & 0x3fff == 0;
        let src: [u8; 4] = ip[12..16].try_into().ok()?;
        let dst: [u8; 4] = ip[16..20].try_into().ok()?;
        return Some(Datagram {
            src: IpAddr::from(src),
            dst: IpAddr::from(dst),
            proto: ip[9],
            header: Some(&ip[..ihl]),
            segment: whole.then(|| &ip[ihl..tot]),
        });
    }
    if version != 6 || ip.len() < 40 {
        return None;
    }
    let end = 40 + usize::from(u16::from_be_bytes([ip[4], ip[5]]));
    let src: [u8; 16] = ip[8..24].try_into().ok()?;
    let dst: [u8; 16] = ip[24..40].try_into().ok()?;
    let (mut next, mut off, mut whole) = (ip[6], 40, ip.len() >= end);
    while matches!(
        next,
        EXT_HOP_BY_HOP | EXT_ROUTING | EXT_DEST_OPTS | EXT_FRAGMENT
    ) {
        let Some(h) = ip.get(off..off + 2) else {
            whole = false;
            break;
        };
        if next == EXT_FRAGMENT {
            whole = false;
            off += 8;
        } else {
            off += (usize::from(h[1]) + 1) * 8;
        }
        next = h[0];
    }
    Some(Datagram {
        src: IpAddr::from(src),
        dst: IpAddr::from(dst),
        proto: next,
        header: None,
        segment: (whole && off <= end).then(|| &ip[off..end]),
    })
}

/// Where a frame's IP header starts (past one optional VLAN tag).
fn l3_of(frame: &[u8]) -> usize {
    if frame.get(12..14) == Some(&[0x81, 0x00]) {
        18
    } else {
        14
    }
}

/// Whether `seg`'s checksum (TCP, UDP, ICMP or ICMPv6) is right, if it has one: None for
/// other protocols and cut segments; a UDP checksum of 0 is right over IPv4 (none) and wrong
/// over IPv6 (forbidden).
fn segment_ok(d: &Datagram, seg: &[u8]) -> Option<bool> {
    let v6 = d.src.is_ipv6();
    match d.proto {
        6 if seg.len() >= 18 => {}
        17 if seg.len() >= 8 => {
            if seg[6..8] == [0, 0] {
                return Some(!v6);
            }
        }
        1 if !v6 && seg.len() >= 8 => return Some(fold(sum(0, seg)) == 0xffff),
        58 if v6 && seg.len() >= 8 => {}
        _ => return None,
    }
    let pseudo = pseudo_header(d.src, d.dst, d.proto, seg.len());
    // Right when the sum over everything is all ones; for UDP a computed 0 is sent as 0xffff,
    // which sums the same.
    Some(fold(sum(sum(0, &pseudo), seg)) == 0xffff)
}

/// Whether an ICMP message of `d` is an error that quotes a packet.
fn is_error(d: &Datagram, ty: u8) -> bool {
    if d.src.is_ipv6() {
        matches!(
            ty,
            ICMP6_DEST_UNREACH | ICMP6_PACKET_TOO_BIG | ICMP6_TIME_EXCEEDED
        )
    } else {
        matches!(ty, ICMP_DEST_UNREACH | ICMP_TIME_EXCEEDED)
    }
}

/// Verifies the IPv4 header checksum and the TCP/UDP/ICMP checksums of a frame built like the
/// above (IPv4 or IPv6), and of the packet an ICMP error quotes, as far as the quote holds it.
pub fn verify_checksums(frame: &[u8]) -> Result<(), String> {
    let d = datagram(&frame[l3_of(frame)..]).ok_or("no IP datagram")?;
    verify_datagram(&d, false)
}

fn verify_datagram(d: &Datagram, quoted: bool) -> Result<(), String> {
    let what = if quoted { "quoted: " } else { "" };
    if let Some(h) = d.header
        && fold(sum(0, h)) != 0xffff
    {
        return Err(format!("{what}bad IPv4 header checksum"));
    }
    let Some(seg) = d.segment else {
        return Ok(());
    };
    if segment_ok(d, seg) == Some(false) {
        return Err(format!("{what}bad {} checksum", proto_name(d.proto)));
    }
    if matches!(d.proto, 1 | 58) && seg.len() >= 8 && is_error(d, seg[0]) && !quoted {
        // The quoted datagram: its IP header (IPv4) always, its segment when quoted whole.
        if let Some(q) = datagram(&seg[8..]) {
            verify_datagram(&q, true)?;
        }
    }
    Ok(())
}

fn proto_name(proto: u8) -> &'static str {
    match proto {
        6 => "TCP",
        17 => "UDP",
        1 => "ICMP",
        58 => "ICMPv6",
        _ => "L4",
    }
}

/// Which checksums of a frame are right, layer by layer (None: the layer is absent or cut, so
/// nothing to judge). What a rewriting datapath must preserve: a right checksum stays right, and
/// a wrong one stays wrong (never laundered into a right one).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Checksums {
    /// The IPv4 header's (IPv6 has none).
    pub ip: Option<bool>,
    /// TCP or UDP (a UDP checksum of 0 counts as right over IPv4: none; wrong over IPv6).
    pub l4: Option<bool>,
    /// ICMP or ICMPv6.
    pub icmp: Option<bool>,
    /// The IPv4 header an ICMP error quotes.
    pub quoted_ip: Option<bool>,
}

/// The [`Checksums`] of an Ethernet frame carrying IPv4 or IPv6 (one optional VLAN tag).
pub fn checksums(frame: &[u8]) -> Checksums {
    let mut out = Checksums::default();
    let l3 = l3_of(frame);
    if !matches!(frame.get(l3 - 2..l3), Some([0x08, 0x00] | [0x86, 0xdd])) {
        return out;
    }
    let Some(d) = frame.get(l3..).and_then(datagram) else {
        return out;
    };
    out.ip = d.header.map(|h| fold(sum(0, h)) == 0xffff);
    let Some(seg) = d.segment else {
        return out;
    };
    match d.proto {
        6 | 17 => out.l4 = segment_ok(&d, seg),
        1 | 58 => {
            out.icmp = segment_ok(&d, seg);
            if seg.len() >= 8 && is_error(&d, seg[0]) {
                out.quoted_ip =
                    datagram(&seg[8..]).and_then(|q| q.header.map(|h| fold(sum(0, h)) == 0xffff));
            }
        }
        _ => {}
    }
    out
}

/// `[a]:p` for an IPv6 address, `a:p` for an IPv4 one (what [`Packet::tcp`] and
/// [`Packet::udp`] take).
pub fn at(ip: &str, port: u16) -> String {
    if ip.contains(':') {
        format!("[{ip}]:{port}")
    } else {
        format!("{ip}:{port}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn built_frames_have_valid_checksums() {
        for p in [
            Packet::tcp("10.0.0.1:1000", "10.0.0.2:80", TCP_SYN).payload(b"hello"),
            Packet::udp("10.0.0.1:1000", "10.0.0.2:53").payload(b"odd"),
            Packet::tcp("10.0.0.1:1000", "10.0.0.2:80", TCP_ACK)
                .vlan(7)
                .ip_options(&[1, 1, 1]),
        ] {
            let f = p.build();
            verify_checksums(&f).unwrap();
        }
    }

    #[test]
    fn icmp_messages_have_valid_checksums() {
        let echo = Packet::icmp_echo("10.0.0.1:0", "10.0.0.2:0", false, 7, 1).payload(b"ping");
        verify_checksums(&echo.build()).unwrap();
        let quoted = Packet::tcp("10.0.0.2:80", "10.0.0.1:4000", TCP_ACK)
            .payload(&[7u8; 1400])
            .datagram();
        for len in [28, 48, quoted.len()] {
            let err = Packet::icmp_error(
                "10.0.9.1:0",
                "10.0.0.2:0",
                ICMP_DEST_UNREACH,
                ICMP_FRAG_NEEDED,
                1400,
                &quoted,
                len,
            );
            verify_checksums(&err.build()).unwrap();
        }
    }

    #[test]
    fn ipv6_frames_have_valid_checksums() {
        let syn = Packet::tcp("[2001:db8::1]:1000", "[2001:db8::10]:80", TCP_SYN).payload(b"hi");
        verify_checksums(&syn.build()).unwrap();
        let with_ext = syn
            .clone()
            .ext_header(EXT_HOP_BY_HOP, 0)
            .ext_header(EXT_DEST_OPTS, 1);
        let f = with_ext.build();
        assert_eq!(f[14 + 6], EXT_HOP_BY_HOP);
        assert_eq!(f[14 + 40], EXT_DEST_OPTS);
        assert_eq!(f[14 + 48], 6);
        verify_checksums(&f).unwrap();
        let udp = Packet::udp("[2001:db8::1]:1000", "[2001:db8::10]:53").payload(b"q");
        verify_checksums(&udp.build()).unwrap();
        assert!(verify_checksums(&udp.clone().udp_zero_checksum().build()).is_err());
        let echo = Packet::icmp_echo("[2001:db8::1]:0", "[2001:db8::10]:0", false, 7, 1);
        verify_checksums(&echo.build()).unwrap();
        let quoted = Packet::tcp("[2001:db8::10]:80", "[2001:db8::1]:1000", TCP_ACK)
            .payload(&[1; 100])
            .datagram();
        let ptb = Packet::icmp_error(
            "[2001:db8:9::1]:0",
            "[2001:db8::10]:0",
            ICMP6_PACKET_TOO_BIG,
            0,
            1280,
            &quoted,
            quoted.len(),
        );
        verify_checksums(&ptb.build()).unwrap();
        let mut bad = ptb.build();
        *bad.last_mut().unwrap() ^= 1;
        assert!(verify_checksums(&bad).is_err());
        assert_eq!(checksums(&bad).icmp, Some(false));
    }

    #[test]
    fn encapsulation_round_trips_with_valid_outer_checksums() {
        let hash = 0x0123_4567_89ab_cdef;
        let mac = [2, 0, 0, 0, 0, 9];
        for (inner, src, dst) in [
            (
                Packet::tcp("10.0.1.2:4000", "10.100.0.1:80", TCP_SYN).payload(b"x"),
                "10.0.2.1",
                "10.0.2.10",
            ),
            (
                Packet::udp("[2001:db8:1::2]:4000", "[2001:db8:100::1]:53").payload(b"q"),
                "2001:db8:2::1",
                "2001:db8:2::10",
            ),
        ] {
            let frame = inner.build();
            for gue_port in [None, Some(6080)] {
                let e = Encap {
                    gue_port,
                    src: src.parse().unwrap(),
                    dst: dst.parse().unwrap(),
                    hash,
                    smac: mac,
                    dmac: mac,
                };
                let out = encapsulate(&frame, &e);
                verify_checksums(&out).unwrap();
                let back = decapsulate(&out, 6080).unwrap();
                assert_eq!(back[12..], frame[12..]);
                verify_checksums(&back).unwrap();
            }
        }
    }

    #[test]
    fn a_flipped_byte_is_detected() {
        let mut f = Packet::tcp("10.0.0.1:1000", "10.0.0.2:80", TCP_SYN).build();
        *f.last_mut().unwrap() ^= 0xff;
        assert!(verify_checksums(&f).is_err());
    }

    #[test]
    fn known_header_checksum() {
        // RFC 1071 style example: a well-known IPv4 header.
        let hdr = [
            0x45, 0x00, 0x00, 0x73, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11, 0x00, 0x00, 0xc0, 0xa8,
            0x00, 0x01, 0xc0, 0xa8, 0x00, 0xc7,
        ];
        assert_eq!(checksum(&hdr), 0xb861);
    }
}
