//! Builds Ethernet frames (optional 802.1Q tag) carrying IPv4 (optional options, fragment bits)
//! with TCP, UDP or ICMP (echo, and errors quoting another packet), checksums correct unless told
//! otherwise; and checks checksums of frames.

use std::net::{Ipv4Addr, SocketAddrV4};

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

/// A frame under construction. `build()` produces the bytes.
#[derive(Clone, Debug)]
pub struct Packet {
    src_mac: [u8; 6],
    dst_mac: [u8; 6],
    vlan: Option<u16>,
    ether_type: u16,
    src: SocketAddrV4,
    dst: SocketAddrV4,
    ttl: u8,
    ip_options: Vec<u8>,
    frag: u16,
    l4: L4,
    payload: Vec<u8>,
}

fn addr(s: &str) -> SocketAddrV4 {
    s.parse().unwrap_or_else(|_| panic!("bad address {s}"))
}

impl Packet {
    fn new(src: &str, dst: &str, l4: L4) -> Self {
        Self {
            src_mac: CLIENT_MAC,
            dst_mac: LB_MAC,
            vlan: None,
            ether_type: 0x0800,
            src: addr(src),
            dst: addr(dst),
            ttl: 64,
            ip_options: Vec::new(),
            frag: 0,
            l4,
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
        let ty = if reply {
            ICMP_ECHO_REPLY
        } else {
            ICMP_ECHO_REQUEST
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

    /// IPv4 options, padded with End-of-Options to a multiple of 4 bytes.
    pub fn ip_options(mut self, options: &[u8]) -> Self {
        self.ip_options = options.to_vec();
        while !self.ip_options.len().is_multiple_of(4) {
            self.ip_options.push(0);
        }
        self
    }

    /// More-fragments flag and fragment offset (in 8-byte units).
    pub fn fragment(mut self, more: bool, offset: u16) -> Self {
        self.frag = (u16::from(more) << 13) | (offset & 0x1fff);
        self
    }

    pub fn payload(mut self, payload: &[u8]) -> Self {
        self.payload = payload.to_vec();
        self
    }

    pub fn seq(mut self, seq: u32, ack: u32) -> Self {
        if let L4::Tcp { flags, .. } = self.l4 {
            self.l4 = L4::Tcp { flags, seq, ack };
        }
        self
    }

    /// UDP with checksum 0 ("no checksum", allowed over IPv4).
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

    /// Offset of the IPv4 header in the frame.
    pub fn l3_offset(&self) -> usize {
        14 + if self.vlan.is_some() { 4 } else { 0 }
    }

    pub fn build(&self) -> Vec<u8> {
        let mut l4 = match self.l4 {
            L4::Tcp { flags, seq, ack } => {
                let mut h = vec![0u8; 20];
                h[0..2].copy_from_slice(&self.src.port().to_be_bytes());
                h[2..4].copy_from_slice(&self.dst.port().to_be_bytes());
                h[4..8].copy_from_slice(&seq.to_be_bytes());
                h[8..12].copy_from_slice(&ack.to_be_bytes());
                h[12] = 5 << 4;
                h[13] = flags;
                h[14..16].copy_from_slice(&64240u16.to_be_bytes());
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
            L4::Icmp { .. } => 1,
            L4::Other { proto } => proto,
        };
        if let L4::Icmp { .. } = self.l4 {
            let c = checksum(&l4);
            l4[2..4].copy_from_slice(&c.to_be_bytes());
        }
        let (src, dst) = (*self.src.ip(), *self.dst.ip());
        match self.l4 {
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

        let ihl = 20 + self.ip_options.len();
        let mut ip = vec![0u8; 20];
        ip[0] = 0x40 | (ihl / 4) as u8;
        ip[2..4].copy_from_slice(&((ihl + l4.len()) as u16).to_be_bytes());
        ip[4..6].copy_from_slice(&0x1234u16.to_be_bytes());
        ip[6..8].copy_from_slice(&self.frag.to_be_bytes());
        ip[8] = self.ttl;
        ip[9] = proto;
        ip[12..16].copy_from_slice(&src.octets());
        ip[16..20].copy_from_slice(&dst.octets());
        ip.extend_from_slice(&self.ip_options);
        let c = checksum(&ip);
        ip[10..12].copy_from_slice(&c.to_be_bytes());

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

/// TCP/UDP checksum over the pseudo-header and `segment` (whose checksum field must be 0).
pub fn l4_checksum(src: Ipv4Addr, dst: Ipv4Addr, proto: u8, segment: &[u8]) -> u16 {
    let mut pseudo = Vec::with_capacity(12);
    pseudo.extend_from_slice(&src.octets());
    pseudo.extend_from_slice(&dst.octets());
    pseudo.extend_from_slice(&[0, proto]);
    pseudo.extend_from_slice(&(segment.len() as u16).to_be_bytes());
    !fold(sum(sum(0, &pseudo), segment))
}

/// Verifies the IPv4 header checksum and the TCP/UDP checksum of a frame built like the above.
pub fn verify_checksums(frame: &[u8]) -> Result<(), String> {
    let mut l3 = 14;
    if frame.get(12..14) == Some(&[0x81, 0x00]) {
        l3 += 4;
    }
    let ihl = usize::from(frame[l3] & 0x0f) * 4;
    let ip = &frame[l3..l3 + ihl];
    if fold(sum(0, ip)) != 0xffff {
        return Err("bad IPv4 header checksum".into());
    }
    let tot = usize::from(u16::from_be_bytes([ip[2], ip[3]]));
    let seg = &frame[l3 + ihl..l3 + tot];
    let src = Ipv4Addr::new(ip[12], ip[13], ip[14], ip[15]);
    let dst = Ipv4Addr::new(ip[16], ip[17], ip[18], ip[19]);
    let check_at = match ip[9] {
        6 => 16,
        17 if seg[6..8] == [0, 0] => return Ok(()),
        17 => 6,
        1 => return verify_icmp(seg),
        _ => return Ok(()),
    };
    let mut copy = seg.to_vec();
    let stored = u16::from_be_bytes([copy[check_at], copy[check_at + 1]]);
    copy[check_at..check_at + 2].copy_from_slice(&[0, 0]);
    let want = l4_checksum(src, dst, ip[9], &copy);
    let want = if ip[9] == 17 && want == 0 {
        0xffff
    } else {
        want
    };
    if stored != want {
        return Err(format!("bad L4 checksum {stored:#06x}, want {want:#06x}"));
    }
    Ok(())
}

/// Which checksums of a frame are right, layer by layer (None: the layer is absent or cut, so
/// nothing to judge). What a rewriting datapath must preserve: a right checksum stays right, and
/// a wrong one stays wrong (never laundered into a right one).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Checksums {
    pub ip: Option<bool>,
    /// TCP or UDP (a UDP checksum of 0 counts as right: none).
    pub l4: Option<bool>,
    pub icmp: Option<bool>,
    /// The IPv4 header an ICMP error quotes.
    pub quoted_ip: Option<bool>,
}

/// The [`Checksums`] of an Ethernet frame carrying IPv4 (one optional VLAN tag).
pub fn checksums(frame: &[u8]) -> Checksums {
    let mut out = Checksums::default();
    let mut l3 = 14;
    if frame.get(12..14) == Some(&[0x81, 0x00]) {
        l3 += 4;
    }
    if frame.get(l3 - 2..l3) != Some(&[0x08, 0x00]) {
        return out;
    }
    let Some(&vihl) = frame.get(l3) else {
        return out;
    };
    let ihl = usize::from(vihl & 0x0f) * 4;
    if vihl >> 4 != 4 || ihl < 20 || frame.len() < l3 + ihl {
        return out;
    }
    let ip = &frame[l3..l3 + ihl];
    out.ip = Some(fold(sum(0, ip)) == 0xffff);
    let tot = usize::from(u16::from_be_bytes([ip[2], ip[3]]));
    if tot < ihl || frame.len() < l3 + tot || u16::from_be_bytes([ip[6], ip[7]]) & 0x3fff != 0 {
        return out;
    }
    let seg = &frame[l3 + ihl..l3 + tot];
    let src = Ipv4Addr::new(ip[12], ip[13], ip[14], ip[15]);
    let dst = Ipv4Addr::new(ip[16], ip[17], ip[18], ip[19]);
    match ip[9] {
        6 | 17 => {
            let at = if ip[9] == 6 { 16 } else { 6 };
            if seg.len() < at + 2 {
                return out;
            }
            if ip[9] == 17 && seg[6..8] == [0, 0] {
                out.l4 = Some(true);
                return out;
            }
            let mut pseudo = Vec::with_capacity(12 + seg.len());
            pseudo.extend_from_slice(&src.octets());
            pseudo.extend_from_slice(&dst.octets());
            pseudo.extend_from_slice(&[0, ip[9]]);
            pseudo.extend_from_slice(&(seg.len() as u16).to_be_bytes());
            let all = fold(sum(sum(0, &pseudo), seg));
            // Right when the sum over everything is all ones; for UDP a computed 0 is sent as
            // 0xffff, which sums the same.
            out.l4 = Some(all == 0xffff);
        }
        1 => {
            if seg.len() < 8 {
                return out;
            }
            out.icmp = Some(fold(sum(0, seg)) == 0xffff);
            if matches!(seg[0], ICMP_DEST_UNREACH | ICMP_TIME_EXCEEDED) {
                let q = &seg[8..];
                if let Some(&qv) = q.first() {
                    let qihl = usize::from(qv & 0x0f) * 4;
                    if qv >> 4 == 4 && qihl >= 20 && q.len() >= qihl {
                        out.quoted_ip = Some(fold(sum(0, &q[..qihl])) == 0xffff);
                    }
                }
            }
        }
        _ => {}
    }
    out
}

/// An ICMP message's checksum, and for an error, the checksum of the quoted IPv4 header and, when
/// the quote holds the whole quoted datagram, of its TCP/UDP segment too.
fn verify_icmp(msg: &[u8]) -> Result<(), String> {
    if msg.len() < 8 {
        return Err("ICMP message shorter than its header".into());
    }
    if fold(sum(0, msg)) != 0xffff {
        return Err("bad ICMP checksum".into());
    }
    if !matches!(msg[0], ICMP_DEST_UNREACH | ICMP_TIME_EXCEEDED) {
        return Ok(());
    }
    let quoted = &msg[8..];
    let Some(&vihl) = quoted.first() else {
        return Ok(());
    };
    let ihl = usize::from(vihl & 0x0f) * 4;
    if quoted.len() < ihl || ihl < 20 {
        return Ok(()); // nothing lb could have rewritten
    }
    if fold(sum(0, &quoted[..ihl])) != 0xffff {
        return Err("bad checksum of the quoted IPv4 header".into());
    }
    let tot = usize::from(u16::from_be_bytes([quoted[2], quoted[3]]));
    if quoted.len() >= tot && tot > ihl {
        // The whole datagram is quoted: its segment must check too.
        let mut frame = vec![0u8; 14];
        frame[12..14].copy_from_slice(&[0x08, 0x00]);
        frame.extend_from_slice(&quoted[..tot]);
        return verify_checksums(&frame).map_err(|e| format!("quoted: {e}"));
    }
    Ok(())
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
