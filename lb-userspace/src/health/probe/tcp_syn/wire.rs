//! The TCP segments of a half-open probe: the SYN it sends, and what a reply says about it, over
//! IPv4 or IPv6.

use std::{
    hash::{BuildHasher as _, RandomState},
    net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6},
    sync::atomic::{AtomicU64, Ordering},
};

use crate::health::probe::sys::{fold, ones_sum};

pub(super) const SYN: u8 = 0x02;
pub(super) const RST: u8 = 0x04;
pub(super) const ACK: u8 = 0x10;

/// The SYN's receive window and MSS option: what a Linux client announces on Ethernet.
const WINDOW: u16 = 64240;
const MSS: u16 = 1460;
/// TCP header (20 bytes) plus the MSS option (4 bytes).
pub(super) const SYN_LEN: usize = 24;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Verdict {
    /// SYN+ACK: something listens.
    Accepted,
    /// RST: nothing listens (or a firewall resets).
    Refused,
}

/// The TCP fields of a received segment that matter for matching.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Segment {
    pub(super) source: SocketAddr,
    pub(super) destination: SocketAddr,
    ack: u32,
    flags: u8,
}

impl Segment {
    /// Parses an IPv4 packet as raw sockets deliver it (IP header first); None unless it holds
    /// a whole TCP header.
    pub(super) fn parse(packet: &[u8]) -> Option<Self> {
        let ihl = usize::from(*packet.first()? & 0x0f) * 4;
        if packet[0] >> 4 != 4 || ihl < 20 || packet.get(9) != Some(&(libc::IPPROTO_TCP as u8)) {
            return None;
        }
        let tcp = packet.get(ihl..ihl + 20)?;
        let ip =
            |at: usize| Ipv4Addr::new(packet[at], packet[at + 1], packet[at + 2], packet[at + 3]);
        let port = |at: usize| u16::from_be_bytes([tcp[at], tcp[at + 1]]);
        Some(Self {
            source: SocketAddr::V4(SocketAddrV4::new(ip(12), port(0))),
            destination: SocketAddr::V4(SocketAddrV4::new(ip(16), port(2))),
            ack: u32::from_be_bytes([tcp[8], tcp[9], tcp[10], tcp[11]]),
            flags: tcp[13],
        })
    }

    /// Parses a TCP segment as IPv6 raw sockets deliver it: from its TCP header on (no IPv6
    /// header), its addresses told apart (the sender's from `recvmsg`, ours from
    /// `IPV6_PKTINFO`). None unless it holds a whole TCP header.
    pub(super) fn parse6(tcp: &[u8], source: Ipv6Addr, destination: Ipv6Addr) -> Option<Self> {
        let tcp = tcp.get(..20)?;
        let port = |at: usize| u16::from_be_bytes([tcp[at], tcp[at + 1]]);
        Some(Self {
            source: SocketAddr::V6(SocketAddrV6::new(source, port(0), 0, 0)),
            destination: SocketAddr::V6(SocketAddrV6::new(destination, port(2), 0, 0)),
            ack: u32::from_be_bytes([tcp[8], tcp[9], tcp[10], tcp[11]]),
            flags: tcp[13],
        })
    }

    /// What this segment says about a SYN sent with `seq`; None if it is not an answer to it.
    /// Like a connecting socket in SYN-SENT (RFC 793, and Linux), it only takes segments that
    /// acknowledge the SYN: a RST without ACK is ignored, so a blind reset cannot fail a probe.
    pub(super) fn verdict(&self, seq: u32) -> Option<Verdict> {
        if self.flags & ACK == 0 || self.ack != seq.wrapping_add(1) {
            return None;
        }
        if self.flags & RST != 0 {
            Some(Verdict::Refused)
        } else if self.flags & SYN != 0 {
            Some(Verdict::Accepted)
        } else {
            None
        }
    }
}

/// The SYN from `local` to `remote` (the kernel adds only the IP header). Over IPv4 its checksum
/// is computed here; over IPv6 it stays zero for the kernel to fill in (the raw socket has
/// `IPV6_CHECKSUM` set, see `socket::open_raw_socket6`).
pub(super) fn syn_segment(local: SocketAddr, remote: SocketAddr, seq: u32) -> [u8; SYN_LEN] {
    let mut s = [0u8; SYN_LEN];
    s[0..2].copy_from_slice(&local.port().to_be_bytes());
    s[2..4].copy_from_slice(&remote.port().to_be_bytes());
    s[4..8].copy_from_slice(&seq.to_be_bytes());
    // ack (8..12) stays 0
    s[12] = ((SYN_LEN / 4) as u8) << 4; // data offset in 32-bit words
    s[13] = SYN;
    s[14..16].copy_from_slice(&WINDOW.to_be_bytes());
    // checksum (16..18) computed below, urgent pointer (18..20) stays 0
    s[20] = 2; // option kind: MSS
    s[21] = 4; // option length
    s[22..24].copy_from_slice(&MSS.to_be_bytes());
    if let (SocketAddr::V4(local), SocketAddr::V4(remote)) = (local, remote) {
        let checksum = tcp_checksum(*local.ip(), *remote.ip(), &s);
        s[16..18].copy_from_slice(&checksum.to_be_bytes());
    }
    s
}

/// A reset's length: a bare TCP header.
pub(super) const RST_LEN: usize = 20;

/// The reset from `local` to `remote` of the half-open connection whose SYN+ACK acknowledged
/// `seq` (our SYN's sequence + 1: the one number the backend's SYN-RECEIVED state accepts a
/// reset at), as Linux resets an unknown connection's SYN+ACK; in a buffer the size of a SYN,
/// its first [`RST_LEN`] bytes. Its checksum as [`syn_segment`]'s.
pub(super) fn rst_segment(local: SocketAddr, remote: SocketAddr, seq: u32) -> [u8; SYN_LEN] {
    let mut s = [0u8; SYN_LEN];
    s[0..2].copy_from_slice(&local.port().to_be_bytes());
    s[2..4].copy_from_slice(&remote.port().to_be_bytes());
    s[4..8].copy_from_slice(&seq.to_be_bytes());
    s[12] = ((RST_LEN / 4) as u8) << 4;
    s[13] = RST;
    if let (SocketAddr::V4(local), SocketAddr::V4(remote)) = (local, remote) {
        let checksum = tcp_checksum(*local.ip(), *remote.ip(), &s[..RST_LEN]);
        s[16..18].copy_from_slice(&checksum.to_be_bytes());
    }
    s
}

/// The TCP checksum of `segment` (its checksum field zero) with the IPv4 pseudo-header.
fn tcp_checksum(source: Ipv4Addr, destination: Ipv4Addr, segment: &[u8]) -> u16 {
    let mut pseudo = [0u8; 12];
    pseudo[0..4].copy_from_slice(&source.octets());
    pseudo[4..8].copy_from_slice(&destination.octets());
    pseudo[9] = libc::IPPROTO_TCP as u8;
    pseudo[10..12].copy_from_slice(&(segment.len() as u16).to_be_bytes());
    !fold(ones_sum(&pseudo) + ones_sum(segment))
}

/// A fresh initial sequence number: SipHash under a key std seeds from the OS RNG, over a
/// counter. Unpredictable enough that an off-path host cannot forge an answer, without pulling
/// in a random-number crate.
pub(super) fn initial_sequence() -> u32 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    RandomState::new().hash_one(COUNTER.fetch_add(1, Ordering::Relaxed)) as u32
}

/// Packets for the tests of the prober's modules.
#[cfg(test)]
pub(super) mod sample {
    use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};

    pub(crate) const LOCAL4: SocketAddrV4 = SocketAddrV4::new(Ipv4Addr::new(10, 0, 9, 1), 40000);
    pub(crate) const REMOTE4: SocketAddrV4 = SocketAddrV4::new(Ipv4Addr::new(10, 0, 9, 2), 80);
    pub(crate) const LOCAL: SocketAddr = SocketAddr::V4(LOCAL4);
    pub(crate) const REMOTE: SocketAddr = SocketAddr::V4(REMOTE4);
    pub(crate) const LOCAL6: SocketAddrV6 =
        SocketAddrV6::new(Ipv6Addr::new(0x2001, 0xdb8, 9, 0, 0, 0, 0, 1), 40000, 0, 0);
    pub(crate) const REMOTE6: SocketAddrV6 =
        SocketAddrV6::new(Ipv6Addr::new(0x2001, 0xdb8, 9, 0, 0, 0, 0, 2), 80, 0, 0);

    /// A 20-byte TCP header from REMOTE6 to LOCAL6, as an IPv6 raw socket delivers it.
    pub(crate) fn reply6(flags: u8, ack: u32) -> Vec<u8> {
        let mut t = vec![0u8; 20];
        t[0..2].copy_from_slice(&REMOTE6.port().to_be_bytes());
        t[2..4].copy_from_slice(&LOCAL6.port().to_be_bytes());
        t[8..12].copy_from_slice(&ack.to_be_bytes());
        t[12] = 5 << 4;
        t[13] = flags;
        t
    }

    /// An IPv4 packet from REMOTE to LOCAL holding a 20-byte TCP header, with `options` bytes of
    /// IP options (a multiple of 4).
    pub(crate) fn reply(flags: u8, ack: u32, options: usize) -> Vec<u8> {
        let ihl = 20 + options;
        let mut p = vec![0u8; ihl + 20];
        p[0] = 0x40 | (ihl / 4) as u8;
        p[2..4].copy_from_slice(&((ihl + 20) as u16).to_be_bytes());
        p[8] = 64;
        p[9] = 6;
        p[12..16].copy_from_slice(&REMOTE4.ip().octets());
        p[16..20].copy_from_slice(&LOCAL4.ip().octets());
        let t = &mut p[ihl..];
        t[0..2].copy_from_slice(&REMOTE.port().to_be_bytes());
        t[2..4].copy_from_slice(&LOCAL.port().to_be_bytes());
        t[8..12].copy_from_slice(&ack.to_be_bytes());
        t[12] = 5 << 4;
        t[13] = flags;
        p
    }
}

#[cfg(test)]
mod tests {
    use super::sample::{LOCAL, LOCAL4, LOCAL6, REMOTE, REMOTE4, REMOTE6, reply, reply6};
    use super::*;

    #[test]
    fn checksum_matches_rfc1071_example() {
        // RFC 1071 §3: the words 0001 f203 f4f5 f6f7 sum to ddf2.
        assert_eq!(
            fold(ones_sum(&[0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7])),
            0xddf2
        );
        // An odd trailing byte is padded with a zero byte.
        assert_eq!(ones_sum(&[0x12, 0x34, 0x56]), 0x1234 + 0x5600);
    }

    #[test]
    fn syn_segment_layout_and_checksum() {
        let s = syn_segment(LOCAL, REMOTE, 0xdead_beef);
        assert_eq!(u16::from_be_bytes([s[0], s[1]]), 40000);
        assert_eq!(u16::from_be_bytes([s[2], s[3]]), 80);
        assert_eq!(u32::from_be_bytes([s[4], s[5], s[6], s[7]]), 0xdead_beef);
        assert_eq!(&s[8..12], &[0; 4]);
        assert_eq!(s[12] >> 4, 6, "data offset: 24 bytes");
        assert_eq!(s[13], SYN);
        assert_eq!(u16::from_be_bytes([s[14], s[15]]), 64240);
        assert_eq!(&s[20..24], &[2, 4, 0x05, 0xb4], "MSS 1460");
        // A receiver sums pseudo-header and segment, checksum included, and must get 0xffff.
        let mut pseudo = [0u8; 12];
        pseudo[0..4].copy_from_slice(&LOCAL4.ip().octets());
        pseudo[4..8].copy_from_slice(&REMOTE4.ip().octets());
        pseudo[9] = 6;
        pseudo[11] = SYN_LEN as u8;
        assert_eq!(fold(ones_sum(&pseudo) + ones_sum(&s)), 0xffff);
        // The pseudo-header counts: another source address gives another checksum.
        let other = syn_segment(
            SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::new(10, 0, 9, 3), 40000)),
            REMOTE,
            0xdead_beef,
        );
        assert_ne!(s[16..18], other[16..18]);
    }

    #[test]
    fn rst_segment_layout_and_checksum() {
        let s = rst_segment(LOCAL, REMOTE, 0xdead_bef0);
        assert_eq!(u16::from_be_bytes([s[0], s[1]]), 40000);
        assert_eq!(u16::from_be_bytes([s[2], s[3]]), 80);
        assert_eq!(u32::from_be_bytes([s[4], s[5], s[6], s[7]]), 0xdead_bef0);
        assert_eq!(&s[8..12], &[0; 4], "no ACK");
        assert_eq!(s[12] >> 4, 5, "data offset: 20 bytes");
        assert_eq!(s[13], RST);
        assert_eq!(&s[14..16], &[0, 0], "window 0");
        let mut pseudo = [0u8; 12];
        pseudo[0..4].copy_from_slice(&LOCAL4.ip().octets());
        pseudo[4..8].copy_from_slice(&REMOTE4.ip().octets());
        pseudo[9] = 6;
        pseudo[11] = RST_LEN as u8;
        assert_eq!(fold(ones_sum(&pseudo) + ones_sum(&s[..RST_LEN])), 0xffff);
        let v6 = rst_segment(SocketAddr::V6(LOCAL6), SocketAddr::V6(REMOTE6), 0xdead_bef0);
        assert_eq!(&v6[16..18], &[0, 0], "the kernel's, over IPv6");
    }

    #[test]
    fn ipv6_syn_leaves_the_checksum_to_the_kernel() {
        let (local, remote) = (SocketAddr::V6(LOCAL6), SocketAddr::V6(REMOTE6));
        let s = syn_segment(local, remote, 0xdead_beef);
        let v4 = syn_segment(LOCAL, REMOTE, 0xdead_beef);
        assert_eq!(&s[16..18], &[0, 0]);
        // Otherwise the same segment.
        assert_eq!(s[..16], v4[..16]);
        assert_eq!(s[18..], v4[18..]);
    }

    #[test]
    fn parse6_reads_ports_and_flags_from_the_tcp_header() {
        let (src, dst) = (*REMOTE6.ip(), *LOCAL6.ip());
        assert_eq!(
            Segment::parse6(&reply6(SYN | ACK, 7), src, dst),
            Some(Segment {
                source: SocketAddr::V6(REMOTE6),
                destination: SocketAddr::V6(LOCAL6),
                ack: 7,
                flags: SYN | ACK
            })
        );
        let full = reply6(RST | ACK, 7);
        assert_eq!(Segment::parse6(&full[..19], src, dst), None, "truncated");
        let seq = 6;
        let seg = Segment::parse6(&full, src, dst).unwrap();
        assert_eq!(seg.verdict(seq), Some(Verdict::Refused));
    }

    #[test]
    fn parse_reads_addresses_ports_and_flags_past_ip_options() {
        for options in [0, 4, 40] {
            let seg = Segment::parse(&reply(SYN | ACK, 7, options)).unwrap();
            assert_eq!(
                seg,
                Segment {
                    source: REMOTE,
                    destination: LOCAL,
                    ack: 7,
                    flags: SYN | ACK
                }
            );
        }
        let full = reply(SYN | ACK, 7, 0);
        assert_eq!(Segment::parse(&full[..39]), None, "truncated TCP header");
        let mut udp = full.clone();
        udp[9] = 17;
        assert_eq!(Segment::parse(&udp), None);
        assert_eq!(Segment::parse(&[]), None);
    }

    #[test]
    fn verdict_needs_the_ack_of_our_syn() {
        let seg = |flags, ack| Segment::parse(&reply(flags, ack, 0)).unwrap();
        let seq = u32::MAX; // the ack wraps to 0
        assert_eq!(seg(SYN | ACK, 0).verdict(seq), Some(Verdict::Accepted));
        assert_eq!(seg(RST | ACK, 0).verdict(seq), Some(Verdict::Refused));
        assert_eq!(seg(SYN | ACK, 1).verdict(seq), None, "wrong ack");
        assert_eq!(seg(RST | ACK, 5).verdict(seq), None, "wrong ack");
        assert_eq!(seg(RST, 0).verdict(seq), None, "RST without ACK");
        assert_eq!(seg(ACK, 0).verdict(seq), None, "plain ACK");
        assert_eq!(seg(SYN, 0).verdict(seq), None, "SYN without ACK");
    }
}
