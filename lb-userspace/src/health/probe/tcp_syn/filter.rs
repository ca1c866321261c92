//! The classic BPF programs that keep the host's ordinary TCP traffic away from the prober:
//! one for the IPv4 replies' packet socket (see [`super::ring`]), which sees packets from their
//! IP header, and one for the IPv6 raw socket, which sees them from their TCP header.

use std::{io, os::fd::BorrowedFd};

use super::wire::{ACK, RST, SYN};
use crate::health::probe::sys::setsockopt;

/// Bytes of a packet the IPv4 filter keeps: an IP header with options (60 bytes) and a TCP
/// header (20) are all a reply needs; the ring's frames hold this much.
pub(super) const REPLY_BYTES: u32 = 128;

/// The classic BPF program on the IPv4 replies' packet socket: it passes unfragmented IPv4 TCP
/// segments with RST set, or with both SYN and ACK set, and drops everything else in the
/// kernel. A packet socket of type `SOCK_DGRAM` hands the filter every IPv4 packet the host
/// receives from its IP header (before the IP layer has checked or reassembled it, hence the
/// fragment test: a later fragment holds no TCP header); the TCP header starts `4 × IHL` bytes
/// in. A load past the end of a short packet ends the program with "drop".
///
/// ```text
///  0  ldb  [0]                 A = version/IHL byte
///  1  rsh  #4                  A = version
///  2  jeq  #4, 0, 10           not IPv4 -> 13
///  3  ldb  [9]                 A = protocol
///  4  jeq  #6, 0, 8            not TCP -> 13
///  5  ldh  [6]                 A = flags/fragment offset
///  6  jset #0x3fff, 6, 0       more fragments or an offset -> 13
///  7  ldxb 4*([0]&0xf)         X = IP header length
///  8  ldb  [x+13]              A = TCP flags
///  9  jset #0x04, 2, 0         RST -> 12
/// 10  and  #0x12               A = SYN and ACK bits
/// 11  jeq  #0x12, 0, 1         both -> 12, else -> 13
/// 12  ret  #128                accept, its first REPLY_BYTES bytes
/// 13  ret  #0                  drop
/// ```
fn reply_filter() -> [libc::sock_filter; 14] {
    use libc::{
        BPF_ABS, BPF_ALU, BPF_AND, BPF_B, BPF_H, BPF_IND, BPF_JEQ, BPF_JMP, BPF_JSET, BPF_K,
        BPF_LD, BPF_LDX, BPF_MSH, BPF_RET, BPF_RSH,
    };
    let op = |code: u32, k: u32| libc::sock_filter {
        code: code as u16,
        jt: 0,
        jf: 0,
        k,
    };
    let jump = |code: u32, k: u32, jt: u8, jf: u8| libc::sock_filter {
        code: code as u16,
        jt,
        jf,
        k,
    };
    let tcp = libc::IPPROTO_TCP as u32;
    let syn_ack = u32::from(SYN | ACK);
    [
        op(BPF_LD | BPF_B | BPF_ABS, 0),
        op(BPF_ALU | BPF_RSH | BPF_K, 4),
        jump(BPF_JMP | BPF_JEQ | BPF_K, 4, 0, 10),
        op(BPF_LD | BPF_B | BPF_ABS, 9),
        jump(BPF_JMP | BPF_JEQ | BPF_K, tcp, 0, 8),
        op(BPF_LD | BPF_H | BPF_ABS, 6),
        jump(BPF_JMP | BPF_JSET | BPF_K, 0x3fff, 6, 0),
        op(BPF_LDX | BPF_B | BPF_MSH, 0),
        op(BPF_LD | BPF_B | BPF_IND, 13),
        jump(BPF_JMP | BPF_JSET | BPF_K, u32::from(RST), 2, 0),
        op(BPF_ALU | BPF_AND | BPF_K, syn_ack),
        jump(BPF_JMP | BPF_JEQ | BPF_K, syn_ack, 0, 1),
        op(BPF_RET | BPF_K, REPLY_BYTES),
        op(BPF_RET | BPF_K, 0),
    ]
}

/// The classic BPF program on the IPv6 raw socket: the same test as [`reply_filter`]'s, at
/// offset 13 of the data. An AF_INET6 raw socket is handed (and its filter sees) the packet from
/// the transport header on: the kernel has pulled the IPv6 header and any extension headers
/// before delivering it, so there is no header length to skip, and the addresses come with
/// `recvmsg` instead.
///
/// ```text
///  0  ldb  [13]                A = TCP flags
///  1  jset #0x04, 2, 0         RST -> 4
///  2  and  #0x12               A = SYN and ACK bits
///  3  jeq  #0x12, 0, 1         both -> 4, else -> 5
///  4  ret  #0xffffffff         accept, whole segment
///  5  ret  #0                  drop
/// ```
fn reply_filter6() -> [libc::sock_filter; 6] {
    use libc::{
        BPF_ABS, BPF_ALU, BPF_AND, BPF_B, BPF_JEQ, BPF_JMP, BPF_JSET, BPF_K, BPF_LD, BPF_RET,
    };
    let op = |code: u32, k: u32| libc::sock_filter {
        code: code as u16,
        jt: 0,
        jf: 0,
        k,
    };
    let jump = |code: u32, k: u32, jt: u8, jf: u8| libc::sock_filter {
        code: code as u16,
        jt,
        jf,
        k,
    };
    let syn_ack = u32::from(SYN | ACK);
    [
        op(BPF_LD | BPF_B | BPF_ABS, 13),
        jump(BPF_JMP | BPF_JSET | BPF_K, u32::from(RST), 2, 0),
        op(BPF_ALU | BPF_AND | BPF_K, syn_ack),
        jump(BPF_JMP | BPF_JEQ | BPF_K, syn_ack, 0, 1),
        op(BPF_RET | BPF_K, u32::MAX),
        op(BPF_RET | BPF_K, 0),
    ]
}

/// Attaches [`reply_filter`] to `fd`, the IPv4 replies' packet socket (SO_ATTACH_FILTER; the
/// kernel copies the program).
pub(super) fn attach_filter(fd: BorrowedFd<'_>) -> io::Result<()> {
    attach(fd, &mut reply_filter())
}

/// Attaches [`reply_filter6`] to `fd`, an IPv6 raw socket.
pub(super) fn attach_filter6(fd: BorrowedFd<'_>) -> io::Result<()> {
    attach(fd, &mut reply_filter6())
}

fn attach(fd: BorrowedFd<'_>, program: &mut [libc::sock_filter]) -> io::Result<()> {
    let fprog = libc::sock_fprog {
        len: program.len() as u16,
        filter: program.as_mut_ptr(),
    };
    setsockopt(fd, libc::SOL_SOCKET, libc::SO_ATTACH_FILTER, &fprog)
}

#[cfg(test)]
mod tests {
    use std::os::{fd::AsFd as _, unix::net::UnixDatagram};

    use super::super::wire::sample::{reply, reply6};
    use super::*;

    /// A datagram socket pair whose receiving end has `attach` on it, and a test of whether a
    /// datagram passes it. An AF_UNIX datagram socket applies its socket filter to each
    /// datagram it receives, and the datagram's bytes start where a raw socket's packet does: so
    /// the filter runs in the kernel, without privileges.
    fn filtered(attach: fn(BorrowedFd<'_>) -> io::Result<()>) -> impl Fn(&[u8]) -> bool {
        let (tx, rx) = UnixDatagram::pair().unwrap();
        rx.set_nonblocking(true).unwrap();
        attach(rx.as_fd()).unwrap();
        move |packet: &[u8]| {
            tx.send(packet).unwrap();
            let mut buf = [0u8; 128];
            match rx.recv(&mut buf) {
                Ok(n) => {
                    assert_eq!(n, packet.len(), "accepted whole");
                    true
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => false,
                Err(e) => panic!("{e}"),
            }
        }
    }

    const FIN: u8 = 0x01;
    const PSH: u8 = 0x08;

    #[test]
    fn filter_passes_only_syn_ack_and_rst() {
        let passes = filtered(attach_filter);
        for options in [0, 4, 40] {
            assert!(
                passes(&reply(SYN | ACK, 1, options)),
                "SYN+ACK, {options} option bytes"
            );
            assert!(passes(&reply(RST | ACK, 1, options)), "RST+ACK");
            assert!(passes(&reply(RST, 1, options)), "RST");
            assert!(!passes(&reply(SYN, 1, options)), "SYN");
            assert!(!passes(&reply(ACK, 1, options)), "ACK");
            assert!(!passes(&reply(PSH | ACK, 1, options)), "PSH+ACK");
            assert!(!passes(&reply(FIN | ACK, 1, options)), "FIN+ACK");
        }
        // The flags are read behind the IP options, not at a fixed offset: with 4 option bytes,
        // offset 33 (where flags sit without options) holds SYN+ACK but the real flags are ACK.
        let mut shifted = reply(ACK, 1, 4);
        shifted[33] = SYN | ACK;
        assert!(!passes(&shifted));
        let mut udp = reply(SYN | ACK, 1, 0);
        udp[9] = 17;
        assert!(!passes(&udp), "not TCP");
        let mut v6 = reply(SYN | ACK, 1, 0);
        v6[0] = 0x65;
        assert!(!passes(&v6), "not IPv4");
        // Fragments: the first (more fragments set) and a later one (an offset).
        for fragment in [[0x20, 0x00], [0x00, 0x01], [0x40 | 0x1f, 0xff]] {
            let mut f = reply(SYN | ACK, 1, 0);
            f[6..8].copy_from_slice(&fragment);
            assert!(!passes(&f), "fragment {fragment:x?}");
        }
        let mut df = reply(SYN | ACK, 1, 0);
        df[6..8].copy_from_slice(&[0x40, 0x00]);
        assert!(passes(&df), "DF alone is no fragment");
        let full = reply(SYN | ACK, 1, 0);
        assert!(!passes(&full[..33]), "too short to hold the flags");
        assert!(passes(&full[..34]), "just long enough");
    }

    /// The IPv6 socket's filter reads the flags at the start of the data, where an IPv6 raw
    /// socket's segment starts.
    #[test]
    fn filter6_passes_only_syn_ack_and_rst() {
        let passes = filtered(attach_filter6);
        assert!(passes(&reply6(SYN | ACK, 1)), "SYN+ACK");
        assert!(passes(&reply6(RST | ACK, 1)), "RST+ACK");
        assert!(passes(&reply6(RST, 1)), "RST");
        for flags in [SYN, ACK, PSH | ACK, FIN | ACK] {
            assert!(!passes(&reply6(flags, 1)), "flags {flags:#x}");
        }
        // The flags at offset 13 only: an ACK with SYN+ACK where the IPv4 filter would look
        // (behind a 20-byte IP header) is an ACK.
        let mut ack = reply6(ACK, 1);
        ack.resize(40, 0);
        ack[33] = SYN | ACK;
        assert!(!passes(&ack));
        let full = reply6(SYN | ACK, 1);
        assert!(!passes(&full[..13]), "too short to hold the flags");
        assert!(passes(&full[..14]), "just long enough");
    }
}
